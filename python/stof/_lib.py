"""_lib: the one place that talks to libstof.so.

It owns finding the library, the ctypes mirrors of stof.h's structs and
prototypes, the exception classes (one per stof_status), and the contexts:
one per device, each with the lock that makes it safe from several threads
(a C context serves one thread at a time).
"""
import atexit
import ctypes
import importlib.machinery
import importlib.util
import os
import threading
from ctypes import (POINTER, Structure, byref, c_char_p, c_double, c_float, c_int,
                    c_longlong, c_size_t, c_ubyte, c_void_p)

# At exit the driver may already be torn down: handles are then left to the
# process's end instead of freed.
exiting = []
atexit.register(exiting.append, True)

# ---- errors ---------------------------------------------------------------------


class Error(Exception):
    """A stof failure. status is the stof_status name ("STOF_ERR_INVALID_ARG")
    or None for failures found before the library was reached; the message is
    stof_last_error's sentence, or Python's own for such checks."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(Error, ValueError):
    status = "STOF_ERR_INVALID_ARG"


class UnsupportedError(Error):
    status = "STOF_ERR_UNSUPPORTED"


class NoDeviceError(Error):
    status = "STOF_ERR_NO_DEVICE"


class CudaError(Error):
    status = "STOF_ERR_CUDA"


class CompileError(Error):
    status = "STOF_ERR_COMPILE"


class CacheError(Error):
    status = "STOF_ERR_CACHE"


class OutOfMemoryError(Error, MemoryError):
    status = "STOF_ERR_NO_MEMORY"


class InternalError(Error):
    status = "STOF_ERR_INTERNAL"


class LibraryNotFoundError(Error, ImportError):
    """libstof.so could not be found or loaded; the message lists where we looked."""


class ToolError(Error):
    """stof-warm or stof-dump failed; .output holds what it printed."""

    def __init__(self, message, returncode=None, output=""):
        super().__init__(message)
        self.returncode = returncode
        self.output = output


# Indexed by stof_status; keep in the order of stof.h's enum.
_BY_STATUS = [None, InvalidArgumentError, UnsupportedError, NoDeviceError, CudaError,
              CompileError, CacheError, OutOfMemoryError, InternalError]

# stof.h's limits (test_lib holds them to the header): the longest mask side
# and attention sequence, attention's batch x heads and head sizes.
MAX_SEQ = 65535 * 64                  # STOF_MAX_SEQ
MAX_BATCH_HEADS = 65535               # STOF_MAX_BATCH_HEADS
MHA_HEAD_DIMS = (32, 64, 80, 96, 128)  # STOF_MHA_HEAD_DIMS
MAX_BIAS_BUCKETS = 4096               # STOF_MAX_BIAS_BUCKETS

F16, BF16 = 2, 3                      # stof_dtype
LAYOUT_BHLD, LAYOUT_BLHD = 1, 2       # stof_layout
PICTURE_SVG, PICTURE_PNG = 1, 2       # stof_picture
TUNE = {None: 0, "off": 1, "fast": 2, "full": 3}


def error_for(status, message):
    cls = _BY_STATUS[status] if 0 < status < len(_BY_STATUS) else Error
    return cls(message or cls.status or "stof_status %d" % status)


# ---- the structs of stof.h --------------------------------------------------------


class Options(Structure):
    _fields_ = [("device", c_int), ("cache_path", c_char_p), ("no_cache", c_int),
                ("arch", c_char_p), ("cache_max_bytes", c_longlong),
                ("remote_cache", c_char_p), ("remote_key", c_char_p),
                ("remote_key_file", c_char_p), ("remote_timeout_ms", c_int),
                ("cache_shared", c_int)]


class Stats(Structure):
    _fields_ = [("nvrtc_compiles", c_longlong), ("nvrtc_ms", c_double),
                ("cache_hits", c_longlong), ("cache_misses", c_longlong),
                ("cache_rejects", c_longlong), ("module_loads", c_longlong),
                ("timing_runs", c_longlong), ("graph_captures", c_longlong),
                ("remote_hits", c_longlong), ("remote_misses", c_longlong),
                ("remote_rejects", c_longlong), ("remote_writes", c_longlong),
                ("remote_errors", c_longlong), ("cache_write_failures", c_longlong)]


class MaskInfo(Structure):
    _fields_ = [("lq", c_int), ("lk", c_int), ("entries", c_longlong), ("density", c_double),
                ("row_min", c_int), ("row_max", c_int), ("row_mean", c_double),
                ("empty_rows", c_int), ("runs_mean", c_double), ("runs_max", c_int),
                ("block_q", c_int), ("block_k", c_int), ("n_qblocks", c_int),
                ("n_kblocks", c_int), ("blocks_touched", c_longlong),
                ("blocks_full", c_longlong), ("blocks_partial", c_longlong),
                ("partial_fill_mean", c_double), ("kblocks_mean", c_double),
                ("kblocks_max", c_int), ("block_density", c_double),
                ("block_efficiency", c_double), ("partial_entries", c_longlong),
                ("distinct_bitmaps", c_longlong)]


class MhaDesc(Structure):
    _fields_ = [("batch", c_int), ("heads", c_int), ("seq_q", c_int), ("seq_k", c_int),
                ("head_dim", c_int), ("dtype", c_int), ("layout", c_int),
                ("qkv_packed", c_int), ("scale", c_float), ("tune", c_int),
                ("max_candidates", c_int), ("max_seconds", c_double),
                ("kv_heads", c_int), ("softcap", c_float),
                ("alibi", c_int), ("alibi_slopes", c_void_p),
                ("bias_buckets", c_int), ("bias_table", c_void_p),
                ("varlen", c_int)]


class DecodeDesc(Structure):
    _fields_ = [("batch", c_int), ("heads", c_int), ("kv_heads", c_int), ("head_dim", c_int),
                ("seq_q", c_int), ("max_seq_k", c_int), ("dtype", c_int), ("layout", c_int),
                ("scale", c_float), ("softcap", c_float), ("window", c_int)]


class LayerDesc(Structure):
    _fields_ = [("batch", c_int), ("seq", c_int), ("hidden", c_int), ("heads", c_int),
                ("ffn_hidden", c_int), ("activation", c_int), ("norm", c_int),
                ("dtype", c_int), ("eps", c_float), ("tune", c_int),
                ("max_candidates", c_int), ("max_seconds", c_double)]


LAYER_WEIGHT_NAMES = ("qkv_w", "qkv_b", "o_w", "o_b", "ln1_g", "ln1_b",
                      "ff1_w", "ff1_b", "ff2_w", "ff2_b", "ln2_g", "ln2_b")


class LayerWeights(Structure):
    _fields_ = [(n, c_void_p) for n in LAYER_WEIGHT_NAMES]


class DecoderDesc(Structure):
    _fields_ = [("batch", c_int), ("seq", c_int), ("hidden", c_int), ("heads", c_int),
                ("kv_heads", c_int), ("head_dim", c_int), ("ffn_hidden", c_int),
                ("dtype", c_int), ("eps", c_float), ("rope_theta", c_float),
                ("rope_factor", c_float), ("rope_low_freq_factor", c_float),
                ("rope_high_freq_factor", c_float), ("rope_original_max_positions", c_int),
                ("window", c_int), ("qkv_bias", c_int), ("tune", c_int),
                ("max_candidates", c_int), ("max_seconds", c_double)]


# In stof_decoder_weights' order; the biases only with desc.qkv_bias.
DECODER_WEIGHT_NAMES = ("q_proj", "k_proj", "v_proj", "q_bias", "k_bias", "v_bias", "o_proj",
                        "gate_proj", "up_proj", "down_proj", "input_layernorm",
                        "post_attention_layernorm")
DECODER_BIAS_NAMES = ("q_bias", "k_bias", "v_bias")


class DecoderWeights(Structure):
    _fields_ = [(n, c_void_p) for n in DECODER_WEIGHT_NAMES]


# For the test that holds these mirrors against stof.h.
STRUCTS = {"stof_options": Options, "stof_stats": Stats, "stof_mask_info": MaskInfo,
           "stof_mha_desc": MhaDesc, "stof_decode_desc": DecodeDesc,
           "stof_layer_desc": LayerDesc, "stof_layer_weights": LayerWeights,
           "stof_decoder_desc": DecoderDesc, "stof_decoder_weights": DecoderWeights}

# name: (restype, argtypes)
_PROTOS = {
    "stof_version": (c_char_p, []),
    "stof_status_str": (c_char_p, [c_int]),
    "stof_open": (c_int, [POINTER(c_void_p), POINTER(Options)]),
    "stof_close": (None, [c_void_p]),
    "stof_last_error": (c_char_p, [c_void_p]),
    "stof_get_stats": (c_int, [c_void_p, POINTER(Stats)]),
    "stof_device_info": (c_int, [c_void_p, POINTER(c_int), c_char_p, c_size_t, c_char_p,
                                 c_size_t]),
    "stof_cache_path": (c_char_p, [c_void_p]),
    "stof_mask_parse": (c_int, [c_void_p, c_char_p, c_int, c_int, POINTER(c_void_p)]),
    "stof_mask_from_dense": (c_int, [c_void_p, c_void_p, c_int, c_int, POINTER(c_void_p)]),
    "stof_mask_free": (None, [c_void_p]),
    "stof_mask_spec": (c_char_p, [c_void_p]),
    "stof_mask_dims": (None, [c_void_p, POINTER(c_int), POINTER(c_int)]),
    "stof_mask_hash": (c_int, [c_void_p, c_char_p]),
    "stof_mask_stats": (c_int, [c_void_p, c_void_p, c_int, c_int, POINTER(MaskInfo)]),
    "stof_mha_plan_create": (c_int, [c_void_p, POINTER(MhaDesc), c_void_p, POINTER(c_void_p)]),
    "stof_mha_run": (c_int, [c_void_p] * 7),
    "stof_mha_plan_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "stof_mha_plan_free": (None, [c_void_p]),
    "stof_mha_prepare": (c_int, [c_void_p, POINTER(MhaDesc), c_void_p]),
    "stof_layer_plan_create": (c_int, [c_void_p, POINTER(LayerDesc), c_void_p,
                                       POINTER(LayerWeights), POINTER(c_void_p)]),
    "stof_layer_workspace_size": (c_int, [c_void_p, POINTER(c_size_t)]),
    "stof_layer_run": (c_int, [c_void_p] * 6),
    "stof_layer_plan_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "stof_layer_plan_free": (None, [c_void_p]),
    "stof_layer_tune": (c_int, [c_void_p, POINTER(LayerDesc), c_void_p]),
    "stof_layer_prepare": (c_int, [c_void_p, POINTER(LayerDesc), c_void_p]),
}

# Newer calls: a library built before them still serves everything else.
_OPTIONAL = {
    "stof_mask_to_dense": (c_int, [c_void_p, c_void_p, POINTER(c_ubyte)]),
    "stof_mask_block_map": (c_int, [c_void_p, c_void_p, c_int, c_int, POINTER(c_ubyte)]),
    "stof_mask_picture": (c_int, [c_void_p, c_void_p, c_int, c_int, c_int, POINTER(c_void_p),
                                  POINTER(c_size_t)]),
    "stof_mask_picture_free": (None, [c_void_p]),
    "stof_mha_head_dim_supported": (c_int, [c_int]),
    "stof_mha_run_varlen": (c_int, [c_void_p] * 7 + [c_int, c_longlong, c_longlong, c_void_p]),
    "stof_decode_plan_create": (c_int, [c_void_p, POINTER(DecodeDesc), POINTER(c_void_p)]),
    "stof_decode_run": (c_int, [c_void_p] * 6 + [c_int, c_int, c_void_p]),
    "stof_decode_plan_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "stof_decode_plan_free": (None, [c_void_p]),
    "stof_decode_prepare": (c_int, [c_void_p, POINTER(DecodeDesc)]),
    "stof_decoder_plan_create": (c_int, [c_void_p, POINTER(DecoderDesc), POINTER(DecoderWeights),
                                         POINTER(c_void_p)]),
    "stof_decoder_workspace_size": (c_int, [c_void_p, POINTER(c_size_t)]),
    "stof_decoder_run": (c_int, [c_void_p] * 4 + [c_int, c_void_p, c_void_p]),
    "stof_decoder_plan_describe": (c_int, [c_void_p, c_char_p, c_size_t]),
    "stof_decoder_plan_free": (None, [c_void_p]),
    "stof_decoder_tune": (c_int, [c_void_p, POINTER(DecoderDesc)]),
    "stof_decoder_prepare": (c_int, [c_void_p, POINTER(DecoderDesc)]),
}

# ---- finding the library ------------------------------------------------------------

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_BUILD = os.path.join(os.path.dirname(os.path.dirname(_PKG_DIR)), "build")


def candidates():
    """Where libstof.so is looked for: $STOF_LIB alone when it is set (the
    file, or a folder holding it); else the package's own folder (where `pip
    install` copies it), the checkout's build/ (running from the source
    tree), then the system's loader path (`make install`)."""
    env = os.environ.get("STOF_LIB")
    if env:
        return [os.path.join(env, "libstof.so") if os.path.isdir(env) else env]
    return [os.path.join(_PKG_DIR, "libstof.so"), os.path.join(_REPO_BUILD, "libstof.so"),
            "libstof.so.0"]


NATIVE = "_native.abi3.so"


def _load_native(folder):
    """stof._native (python/stof/_native.c) from beside the package or
    libstof.so (make builds build/_native.abi3.so; the wheel carries it), or
    None where it was not built (no Python headers): ctypes then launches."""
    for d in (_PKG_DIR, folder) if folder else (_PKG_DIR,):
        path = os.path.join(d, NATIVE)
        if not os.path.isfile(path):
            continue
        try:
            loader = importlib.machinery.ExtensionFileLoader("stof._native", path)
            spec = importlib.util.spec_from_file_location("stof._native", path, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            return mod
        except ImportError:
            continue
    return None


class _Lib:
    def __init__(self, cdll, path):
        self.cdll = cdll
        self.path = path
        self.native = _load_native(os.path.dirname(path) if os.sep in path else None)
        for name, (res, args) in _PROTOS.items():
            f = getattr(cdll, name)
            f.restype, f.argtypes = res, args
            setattr(self, name[5:], f)
        for name, (res, args) in _OPTIONAL.items():
            f = getattr(cdll, name, None)
            if f is not None:
                f.restype, f.argtypes = res, args
            setattr(self, name[5:], f)

    def launcher(self, name, form="call"):
        """(call, fn) with call(fn, *args) running stof_<name>, a launch
        (mha_run, layer_run, decode_run, mha_run_varlen) whose host time
        counts: through _native's function `form` when it was built ("call":
        pointers only; "decode_run" and "varlen_run": those calls' ints; its
        argument handling took 0.2 us where ctypes' took 0.6, on an H200's
        host), else ctypes."""
        f = self.need(name)
        native = getattr(self.native, form, None) if self.native is not None else None
        if native is not None:
            return native, ctypes.cast(f, c_void_p).value
        return _ctypes_call, f

    def need(self, name):
        f = getattr(self, name)
        if f is None:
            raise UnsupportedError("%s lacks stof_%s: rebuild it (make)" % (self.path, name))
        return f


def _ctypes_call(fn, *args):
    return fn(*args)


_lib = None
_lib_lock = threading.Lock()


def lib():
    """The loaded library; raises LibraryNotFoundError saying where it looked."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            tried = []
            for path in candidates():
                if os.sep in path and not os.path.exists(path):
                    tried.append(path + " (absent)")
                    continue
                try:
                    cdll = ctypes.CDLL(path)
                except OSError as e:
                    tried.append("%s (%s)" % (path, e))
                    continue
                _lib = _Lib(cdll, path)
                break
            if _lib is None:
                raise LibraryNotFoundError(
                    "libstof.so not found; build it with `make` in the stof checkout, or set "
                    "STOF_LIB to its path. Tried: " + "; ".join(tried))
    return _lib


def library_path():
    return lib().path


def version():
    return lib().version().decode()


# ---- contexts -----------------------------------------------------------------------


class PlanHandle:
    """What the Python side keeps of a C plan (ctx, plan, _free, and the
    subclass's own slots): freed with the object (not while the interpreter
    exits), described by the stof_*_plan_describe named in DESCRIBE."""

    __slots__ = ()
    DESCRIBE = None

    def __del__(self):
        p, self.plan = getattr(self, "plan", None), None
        if p and not exiting:
            self._free(p)

    def describe(self):
        buf = ctypes.create_string_buffer(1024)
        with self.ctx.lock:
            self.ctx.check(getattr(self.ctx._lib, self.DESCRIBE)(self.plan, buf, 1024))
        return buf.value.decode()


class Context:
    """A stof_ctx: one device, one cache, one error buffer. Every call into it
    holds self.lock, since a C context serves one thread at a time. The
    process keeps one per device (Context.for_device); open others for a
    different cache or a compile-only arch."""

    def __init__(self, device=0, cache=None, no_cache=False, arch=None, cache_max_bytes=0):
        L = lib()
        self._lib = L
        self.lock = threading.RLock()
        self.device = device
        opts = Options(device=device, cache_path=os.fsencode(cache) if cache else None,
                       no_cache=1 if no_cache else 0, arch=arch.encode() if arch else None,
                       cache_max_bytes=cache_max_bytes)
        h = c_void_p()
        st = L.open(byref(h), byref(opts))
        if st:
            raise error_for(st, (L.last_error(None) or b"").decode(errors="replace"))
        self.handle = h.value
        self._close = L.close

    def __del__(self):
        h, self.handle = getattr(self, "handle", None), None
        if h and not exiting:
            self._close(h)

    def fail(self, status):
        """The exception for a failed call on this context (call it under self.lock)."""
        return error_for(status, self._lib.last_error(self.handle).decode(errors="replace"))

    def check(self, status):
        if status:
            raise self.fail(status)

    def stats(self):
        """stof_get_stats: what this context compiled, found in the cache, loaded, timed."""
        s = Stats()
        with self.lock:
            self.check(self._lib.get_stats(self.handle, byref(s)))
        return {n: getattr(s, n) for n, _ in Stats._fields_}

    def device_info(self):
        """(has_device, arch, device name), from stof_device_info; where there
        is no GPU, the name is the sentence saying why."""
        has = c_int()
        arch, name = ctypes.create_string_buffer(64), ctypes.create_string_buffer(512)
        with self.lock:
            self.check(self._lib.device_info(self.handle, byref(has), arch, 64, name, 512))
        return bool(has.value), arch.value.decode(), name.value.decode()

    @property
    def cache_path(self):
        """The cache file in use, or "" when uncached."""
        with self.lock:
            return self._lib.cache_path(self.handle).decode()

    _by_device = {}
    _by_device_lock = threading.Lock()

    @classmethod
    def for_device(cls, device=0):
        """The process's context for a device: default options (the cache from
        $STOF_CACHE or the default path), opened on first use and kept."""
        ctx = cls._by_device.get(device)
        if ctx is None:
            with cls._by_device_lock:
                ctx = cls._by_device.get(device)
                if ctx is None:
                    ctx = cls._by_device[device] = cls(device)
        return ctx

