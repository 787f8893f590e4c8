"""What the Python suites share: the package on the path, a private cache
and the model's first choice (STOF_TUNE=off) unless the caller set them, the
fake CUDA arrays the CPU tests check arguments with, and whether torch with
a GPU is here."""
import atexit
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

if "STOF_CACHE" not in os.environ:
    _tmp = tempfile.mkdtemp(prefix="stof-pytest-")
    atexit.register(shutil.rmtree, _tmp, True)
    os.environ["STOF_CACHE"] = os.path.join(_tmp, "cache.db")
os.environ.setdefault("STOF_TUNE", "off")

import stof  # noqa: E402


class FakeCuda:
    """Looks like a CUDA array (__cuda_array_interface__ v3) at a made-up
    address: enough for every check stof makes before a launch."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=0x7f0000000000):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "strides": strides,
                                         "version": 3}


def contiguous_strides(shape, itemsize=2):
    st, acc = [], itemsize
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def has_gpu():
    try:
        has, _, _ = stof.Context.for_device(0).device_info()
    except stof.Error:
        return False
    return has


def torch_cuda():
    """torch, when it is installed and sees a GPU; else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from stof import _attention
    if _attention._Tensor is None:
        _attention._setup_torch()   # as `import torch` before `import stof` would
    return torch
