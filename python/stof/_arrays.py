"""_arrays: what stof's Python calls need to know of the arrays they are
handed, below the modules that plan (_attention, _varlen): torch, once a
tensor has been seen (imported then, never before: stof imports without
it), and any CUDA array's __cuda_array_interface__ and stream.
"""
from . import _lib as L

_torch = None          # the module, once _setup_torch has run
_Tensor = None
_TORCH_DTYPES = {}
_raw_stream = None
_is_compiling = None
_empty_like = None
_hooks = []


def on_setup(fn):
    """fn() runs once torch is set up (the custom ops' registration)."""
    _hooks.append(fn)


def _setup_torch():
    global _torch, _Tensor, _raw_stream, _is_compiling, _empty_like
    if _Tensor is not None:
        return
    import torch
    _empty_like = torch.empty_like
    _TORCH_DTYPES.update({torch.float16: L.F16, torch.bfloat16: L.BF16})
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _raw_stream = raw if raw is not None else (
        lambda dev: torch.cuda.current_stream(dev).cuda_stream)
    comp = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    _is_compiling = comp if comp is not None else (lambda: False)
    for fn in _hooks:
        fn()
    _Tensor = torch.Tensor
    _torch = torch

def _cai(a, name, device):
    d = getattr(a, "__cuda_array_interface__", None)
    if d is None:
        raise L.InvalidArgumentError(
            "%s must be a torch tensor or a CUDA array (__cuda_array_interface__ or DLPack), "
            "got %s" % (name, type(a).__name__))
    shape = tuple(d["shape"])
    ts = d["typestr"]
    size = int(ts[2:]) if ts[2:].isdigit() else 0
    if ts[1:] == "f2":
        dtype = L.F16
    elif size == 2 and str(getattr(a, "dtype", "")) == "bfloat16":
        dtype = L.BF16
    else:
        dtype = ts
    strides = d.get("strides")
    if strides is None:
        st, acc = [], 1
        for n in reversed(shape):
            st.append(acc)
            acc *= n
        strides = tuple(reversed(st))
    else:
        if size == 0 or any(s % size for s in strides):
            raise L.InvalidArgumentError("%s's strides %s are not whole elements"
                                         % (name, strides))
        strides = tuple(s // size for s in strides)
    dev = getattr(getattr(a, "device", None), "id", None)   # CuPy
    if dev is None:
        dev = 0 if device is None else device
    return (shape, strides, dtype, dev), d["data"][0], size, d.get("stream")


def _stream_handle(stream):
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream", "handle", "value"):
        h = getattr(stream, attr, None)
        if h is not None:
            return int(h)
    raise L.InvalidArgumentError("stream must be an int (a CUstream) or have .ptr, .cuda_stream "
                                 "or .handle, got %s" % type(stream).__name__)



def place_weights(weights, names, dtype, device, default_dtype):
    """A layer's own copies of weights[n] for n in names: contiguous, on
    `device` (else the first weight's; a bare "cuda" gets the current
    index), in `dtype` (else the first weight's where it is float16 or
    bfloat16, else default_dtype). Returns (copies, dtype, device)."""
    import torch
    first = weights[names[0]]
    if dtype is None:
        dtype = (first.dtype if first.dtype in (torch.float16, torch.bfloat16)
                 else default_dtype)
    if dtype not in (torch.float16, torch.bfloat16):
        raise L.UnsupportedError("dtype must be torch.float16 or torch.bfloat16, got %s" % dtype)
    device = torch.device(device) if device is not None else first.device
    if device.type != "cuda":
        raise L.InvalidArgumentError("the layer runs on a CUDA device, got %s (pass device=)"
                                     % device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    copies = {n: weights[n].detach().to(device=device, dtype=dtype).contiguous() for n in names}
    return copies, dtype, device
