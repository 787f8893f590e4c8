"""_mask: stof.Mask, a stof_mask held from Python.

A Mask is built from a spec (the grammar of stof.h) or from a dense boolean
matrix, and answers what the C library knows about it: its canonical hash,
its statistics for a tiling, the dense matrix, the block map, and the block
picture (SVG or PNG, drawn by the library). Masks given to stof.attention as
spec strings are parsed once per (spec, lq, lk) and kept.
"""
import ctypes
import threading
import weakref
from ctypes import byref, c_int, c_size_t, c_ubyte, c_void_p

from . import _lib as L


def _host_context():
    # Mask calls use a context only for its error buffer; device 0's serves.
    return L.Context.for_device(0)


class Mask:
    """Which (query, key) pairs attention may use, over lq query rows and lk
    key columns. Mask("window:256+global:64", 2048) is 2048 x 2048;
    Mask.from_dense(matrix) takes lq x lk booleans."""

    __slots__ = ("_handle", "_ctx", "lq", "lk", "spec", "_hash", "_free", "__weakref__")

    def __init__(self, spec, lq, lk=None):
        if lk is None:
            lk = lq
        if not isinstance(spec, str):
            raise L.InvalidArgumentError("Mask spec must be a str, got %s" % type(spec).__name__)
        lq, lk = _side(lq, "lq"), _side(lk, "lk")
        ctx = _host_context()
        h = c_void_p()
        with ctx.lock:
            ctx.check(ctx._lib.mask_parse(ctx.handle, spec.encode(), lq, lk, byref(h)))
        self._adopt(ctx, h.value)

    def _adopt(self, ctx, handle):
        self._ctx, self._handle, self._hash = ctx, handle, None
        self._free = ctx._lib.mask_free
        lq, lk = c_int(), c_int()
        ctx._lib.mask_dims(handle, byref(lq), byref(lk))
        self.lq, self.lk = lq.value, lk.value
        self.spec = ctx._lib.mask_spec(handle).decode()
        # Worked out and registered now, not on first use: torch.compile
        # traces op_key, which can neither call ctypes nor leave a side effect.
        _registered.setdefault(op_key(self), self)

    def __del__(self):
        h, self._handle = getattr(self, "_handle", None), None
        if h:
            self._free(h)

    @classmethod
    def from_dense(cls, allowed):
        """allowed: an lq x lk boolean (or 0/1) matrix: a torch tensor (any
        device), a numpy array, anything with the buffer protocol and a 2-D
        shape, or nested lists."""
        data, lq, lk = _dense_bytes(allowed)
        _side(lq, "lq")
        _side(lk, "lk")
        ctx = _host_context()
        buf = (c_ubyte * len(data)).from_buffer_copy(data)
        h = c_void_p()
        with ctx.lock:
            ctx.check(ctx._lib.mask_from_dense(ctx.handle, buf, lq, lk, byref(h)))
        m = cls.__new__(cls)
        m._adopt(ctx, h.value)
        return m

    # ---- what the library says about it -------------------------------------------

    @property
    def shape(self):
        return (self.lq, self.lk)

    @property
    def hash(self):
        """The canonical SHA-256: masks allowing the same entries hash alike."""
        if self._hash is None:
            buf = ctypes.create_string_buffer(65)
            st = self._ctx._lib.mask_hash(self._handle, buf)
            if st:
                raise L.error_for(st, "stof_mask_hash failed")
            self._hash = buf.value.decode()
        return self._hash

    def stats(self, block_q=64, block_k=64):
        """stof_mask_stats for blocks of block_q rows by block_k keys: a dict
        of stof_mask_info's fields (entries, density, blocks_full, ...)."""
        info = L.MaskInfo()
        ctx = self._ctx
        with ctx.lock:
            ctx.check(ctx._lib.mask_stats(ctx.handle, self._handle, block_q, block_k, byref(info)))
        return {n: getattr(info, n) for n, _ in L.MaskInfo._fields_}

    @property
    def density(self):
        return self.stats()["density"]

    @property
    def entries(self):
        return self.stats()["entries"]

    def to_dense(self, kind=None, device=None):
        """Every cell, 1 allowed: a numpy bool array (kind "numpy", the default
        where numpy is installed), a torch bool tensor ("torch", on device),
        nested lists of bools ("list", the default without numpy) or lq*lk
        bytes ("bytes")."""
        buf = (c_ubyte * (self.lq * self.lk))()
        ctx = self._ctx
        with ctx.lock:
            ctx.check(ctx._lib.need("mask_to_dense")(ctx.handle, self._handle, buf))
        return _shaped(bytes(buf), self.lq, self.lk, kind, device)

    def block_map(self, block_q=64, block_k=64, kind="list"):
        """stof_mask_block_map: per (query block, key block) 0 empty, 1 partial,
        2 full; nested lists of ints, or as to_dense's kind says."""
        nqb, nkb = -(-self.lq // block_q), -(-self.lk // block_k)
        buf = (c_ubyte * max(1, nqb * nkb))()
        ctx = self._ctx
        with ctx.lock:
            ctx.check(ctx._lib.need("mask_block_map")(ctx.handle, self._handle, block_q,
                                                      block_k, buf))
        return _shaped(bytes(buf)[:nqb * nkb], nqb, nkb, kind, None, as_bool=False)

    def picture(self, block_q=64, block_k=64, format="svg"):
        """The block map drawn by the library (stof_mask_picture): SVG text
        (str) with a caption, or PNG bytes."""
        fmt = {"svg": L.PICTURE_SVG, "png": L.PICTURE_PNG}.get(format)
        if fmt is None:
            raise L.InvalidArgumentError("format must be 'svg' or 'png', got %r" % (format,))
        p, n = c_void_p(), c_size_t()
        ctx = self._ctx
        with ctx.lock:
            ctx.check(ctx._lib.need("mask_picture")(ctx.handle, self._handle, block_q, block_k,
                                                    fmt, byref(p), byref(n)))
        try:
            data = ctypes.string_at(p.value, n.value)
        finally:
            ctx._lib.need("mask_picture_free")(p)
        return data.decode() if fmt == L.PICTURE_SVG else data

    def save(self, path, block_q=64, block_k=64):
        """Writes the picture to path: PNG for a .png name, else SVG."""
        fmt = "png" if str(path).lower().endswith(".png") else "svg"
        data = self.picture(block_q, block_k, fmt)
        with open(path, "wb") as f:
            f.write(data.encode() if fmt == "svg" else data)

    def _repr_svg_(self):
        # Notebooks show this inline: 64 x 64 blocks, 128 x 128 past 16384.
        b = 64 if max(self.lq, self.lk) <= 16384 else 128
        return self.picture(b, b, "svg")

    def __eq__(self, other):
        return isinstance(other, Mask) and self.shape == other.shape and self.hash == other.hash

    def __hash__(self):
        return hash(self.hash)

    def __repr__(self):
        return "Mask(%r, %d, %d)" % (self.spec, self.lq, self.lk)


def _shaped(data, rows, cols, kind, device, as_bool=True):
    if kind is None:
        try:
            import numpy  # noqa: F401
            kind = "numpy"
        except ImportError:
            kind = "list"
    if kind == "bytes":
        return data
    if kind == "list":
        conv = bool if as_bool else int
        return [[conv(x) for x in data[r * cols:(r + 1) * cols]] for r in range(rows)]
    if kind == "numpy":
        import numpy as np
        a = np.frombuffer(data, dtype=np.uint8).reshape(rows, cols)
        return a.astype(bool) if as_bool else a.copy()
    if kind == "torch":
        import torch
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(rows, cols)
        t = t.bool() if as_bool else t
        return t.to(device) if device is not None else t
    raise L.InvalidArgumentError("kind must be 'numpy', 'torch', 'list' or 'bytes', got %r"
                                 % (kind,))


def _int(v, name):
    if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
        raise L.InvalidArgumentError("%s must be an int, got %r" % (name, v))
    v = int(v)
    if not -2**31 <= v < 2**31:
        raise L.InvalidArgumentError("%s = %d does not fit an int" % (name, v))
    return v


def _side(v, name):
    """A mask's lq or lk, refused past stof.h's STOF_MAX_SEQ before anything
    is built (sizes below 1 are the library's to refuse)."""
    v = _int(v, name)
    if v > L.MAX_SEQ:
        raise L.InvalidArgumentError(
            "mask sizes go up to STOF_MAX_SEQ = %d (the longest sequence attention takes), "
            "got %s = %d" % (L.MAX_SEQ, name, v))
    return v


def _dense_bytes(a):
    """(lq*lk bytes of 0/1, lq, lk) from a torch tensor, a numpy array, a 2-D
    buffer or nested lists, with no dependency on torch or numpy."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        if a.dim() != 2:
            raise L.InvalidArgumentError("a dense mask must be 2-D, got shape %s" % list(a.shape))
        t = (a != 0).to(device="cpu").contiguous()
        lq, lk = t.shape
        import torch
        t = t.to(torch.uint8)
        return ctypes.string_at(t.data_ptr(), lq * lk), lq, lk
    if hasattr(a, "__array_interface__") or hasattr(a, "__array__") and mod == "numpy":
        import numpy as np
        arr = np.asarray(a)
        if arr.ndim != 2:
            raise L.InvalidArgumentError("a dense mask must be 2-D, got shape %s" % list(arr.shape))
        return np.ascontiguousarray(arr != 0, dtype=np.uint8).tobytes(), arr.shape[0], arr.shape[1]
    try:
        mv = memoryview(a)
    except TypeError:
        mv = None
    if mv is not None and mv.ndim == 2:
        lq, lk = mv.shape
        rows = mv.tolist()
    else:
        rows = [list(r) for r in a]
        lq = len(rows)
        lk = len(rows[0]) if lq else 0
        if any(len(r) != lk for r in rows):
            raise L.InvalidArgumentError("a dense mask's rows must all have the same length")
    return bytes(1 if x else 0 for r in rows for x in r), lq, lk


# ---- masks as attention sees them ----------------------------------------------------

_spec_masks = {}
_spec_lock = threading.Lock()


def for_spec(spec, lq, lk):
    """The Mask of a spec for lq x lk, parsed once and kept."""
    key = (spec, lq, lk)
    m = _spec_masks.get(key)
    if m is None:
        m = Mask(spec, lq, lk)
        with _spec_lock:
            m = _spec_masks.setdefault(key, m)
    return m


# Masks handed to the torch custom op travel as strings: a spec, or "@" and
# the mask's hash for one registered here (a dense mask has no spec). Every
# Mask registers itself when it is made, for as long as it lives.
_registered = weakref.WeakValueDictionary()


def op_key(mask):
    if isinstance(mask, str):
        return mask
    return "@%s:%dx%d" % (mask.hash, mask.lq, mask.lk)


def from_op_key(key):
    if key.startswith("@"):
        m = _registered.get(key)
        if m is None:
            raise L.InvalidArgumentError("mask %s is not registered in this process (no Mask "
                                         "of that hash is alive)" % key)
        return m
    return key
