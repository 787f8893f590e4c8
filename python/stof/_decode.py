"""_decode: stof.decode, one generation step of attention against a KV cache.

It maps torch tensors onto stof_decode_desc and keeps the process's decode
plans: one per (device, dtype, layout, heads, kv_heads, head_dim, new rows,
scale, softcap, window, a batch bucket and a capacity bucket), so the steps
of a generation loop, each with a cache one key longer, share one plan and
cost one launch each: the lengths are read on the device, never here.
"""
import threading
from ctypes import byref, c_void_p

from . import _arrays as A
from . import _lib as L

_plans = {}
_lock = threading.Lock()
MAX_NEW_ROWS = 16


def _bucket(n, least):
    """The power of two at or above max(n, least): what a plan is made for,
    so that growing batches and caches reuse it."""
    b = least
    while b < n:
        b *= 2
    return b


class _Plan(L.PlanHandle):
    __slots__ = ("ctx", "plan", "run", "desc", "_free")

    DESCRIBE = "decode_plan_describe"


def _dtype(t):
    import torch
    return {torch.float16: L.F16, torch.bfloat16: L.BF16}.get(t.dtype)


def _check(q, k, v, layout):
    """(batch, heads, new rows, head_dim, kv_heads, capacity, stof layout) for
    q, k, v given in `layout`, or raises saying what is wrong."""
    if layout not in ("bhld", "blhd"):
        raise L.InvalidArgumentError("layout must be 'bhld' or 'blhd', got %r" % (layout,))
    for name, t in zip("qkv", (q, k, v)):
        if t.dim() != 4:
            raise L.InvalidArgumentError("%s must be 4-D (%s), got shape %s"
                                         % (name, layout.upper(), list(t.shape)))
        if not t.is_cuda:
            raise L.InvalidArgumentError("%s is not on a CUDA device: stof runs on the GPU" % name)
        if _dtype(t) is None:
            raise L.UnsupportedError("%s's dtype must be float16 or bfloat16, got %s"
                                     % (name, t.dtype))
    if not (q.dtype == k.dtype == v.dtype):
        raise L.InvalidArgumentError("q, k and v must have one dtype, got %s"
                                     % [str(t.dtype) for t in (q, k, v)])
    if not (q.device == k.device == v.device):
        raise L.InvalidArgumentError("q, k and v must be on one device")
    if layout == "bhld":
        b, h, sq, d = q.shape
        bk, hk, cap, dk = k.shape
    else:
        b, sq, h, d = q.shape
        bk, cap, hk, dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise L.InvalidArgumentError("k and v must have one shape, got %s and %s"
                                     % (list(k.shape), list(v.shape)))
    if bk != b or dk != d:
        raise L.InvalidArgumentError("k's batch and head_dim must match q's %s, got %s"
                                     % ([b, d], [bk, dk]))
    if hk < 1 or h % hk:
        raise L.InvalidArgumentError("k and v's heads (%d) must divide q's (%d)" % (hk, h))
    if not 1 <= sq <= MAX_NEW_ROWS:
        raise L.InvalidArgumentError("q must hold 1 to %d new rows per sequence, got %d"
                                     % (MAX_NEW_ROWS, sq))
    if cap < sq:
        raise L.InvalidArgumentError("the cache (%d keys) is shorter than the new rows (%d)"
                                     % (cap, sq))
    if d not in L.MHA_HEAD_DIMS:
        raise L.UnsupportedError("head_dim %d is not supported (%s)"
                                 % (d, ", ".join(map(str, L.MHA_HEAD_DIMS))))
    return b, h, sq, d, hk, cap, L.LAYOUT_BHLD if layout == "bhld" else L.LAYOUT_BLHD


def _plan(key, ctx, desc):
    p = _plans.get(key)
    if p is not None:
        return p
    with _lock:
        p = _plans.get(key)
        if p is not None:
            return p
        lib = ctx._lib
        h = c_void_p()
        with ctx.lock:
            ctx.check(lib.need("decode_plan_create")(ctx.handle, byref(desc), byref(h)))
        p = _Plan()
        p.ctx, p.plan, p.desc = ctx, h.value, desc
        p.run, p._free = lib.decode_run, lib.decode_plan_free
        _plans[key] = p
        return p


class _Call:
    """What a call's tensors' shapes, strides, dtypes and devices decide,
    found once and kept (_calls): the plan, the launch, the batch and the
    capacity, so that a step's host time is the launch's."""
    __slots__ = ("plan", "call", "fn", "batch", "cap", "dev")


_calls = {}
MAX_CALLS = 4096      # distinct call forms kept; past it the memo starts again


def _prepare(q, k, v, seqused_k, window, softcap, scale, layout):
    """Every check of a decoding call (raising on what is wrong) and its plan."""
    import torch
    b, h, sq, d, hk, cap, lay = _check(q, k, v, layout)
    for name, t in zip("qkv", (q, k, v)):
        if not t.is_contiguous():
            raise L.InvalidArgumentError("%s must be contiguous in %s order" % (name,
                                                                             layout.upper()))
    if window < 0:
        raise L.InvalidArgumentError("window must be >= 0, got %r" % (window,))
    cap_ = 0.0 if softcap is None else float(softcap)
    sc = 0.0 if scale is None else float(scale)
    dev = q.get_device()
    if seqused_k is not None:
        if (not isinstance(seqused_k, torch.Tensor) or seqused_k.dtype != torch.int32
                or tuple(seqused_k.shape) != (b,) or seqused_k.get_device() != dev
                or not seqused_k.is_contiguous()):
            raise L.InvalidArgumentError("seqused_k must be a contiguous int32 tensor [%d] on "
                                         "q's device, got %s %s"
                                         % (b, getattr(seqused_k, "dtype", type(seqused_k)),
                                            list(getattr(seqused_k, "shape", []))))
    bb, cb = _bucket(b, 1), _bucket(cap, 4096)
    key = (dev, _dtype(q), lay, h, hk, d, sq, sc, cap_, int(window), bb, cb)
    p = _plans.get(key)
    if p is None:
        desc = L.DecodeDesc(batch=bb, heads=h, kv_heads=hk, head_dim=d, seq_q=sq, max_seq_k=cb,
                            dtype=_dtype(q), layout=lay, scale=sc, softcap=cap_,
                            window=int(window))
        p = _plan(key, L.Context.for_device(dev), desc)
    c = _Call()
    c.plan, c.batch, c.cap, c.dev = p, b, cap, dev
    c.call, c.fn = p.ctx._lib.launcher("decode_run", "decode_run")
    return c


def decode(q, k, v, seqused_k=None, *, window=0, softcap=None, scale=None, layout="bhld",
           out=None):
    """Attention of a step's new rows against a KV cache (torch CUDA tensors).

    q: [B, H, S, D] (layout "bhld") or [B, S, H, D] ("blhd"), the S = 1 .. 16
    new rows of each sequence; k, v: [B, KVH, C, D] or [B, C, KVH, D], the
    cache with capacity C, holding KVH heads (KVH divides H: grouped KV
    heads). seqused_k: None (every sequence's cache is C keys long) or an
    int32 CUDA tensor [B] of lengths, the new rows included: new row i of
    sequence b stands at position seqused_k[b] - S + i and sees the keys up
    to it (window W > 0: only the last W of them). Lengths are read on the
    device and clamped to [0, C]. softcap: the logit softcap. Returns a new
    tensor like q (or writes out). q must be contiguous in its layout; k and
    v contiguous in theirs, so that a cache with room to grow is taken as it
    is (pass its full capacity with seqused_k).

    The checks run once per form of call (shapes, strides, dtypes, devices
    and options): a loop's later steps only launch."""
    try:
        key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
               v.shape, v.stride(), v.dtype, v.device, window, softcap, scale, layout,
               None if seqused_k is None else (seqused_k.shape, seqused_k.stride(),
                                               seqused_k.dtype, seqused_k.device))
        c = _calls.get(key)
    except (AttributeError, TypeError):
        key, c = None, None
    if c is None:
        for name, t in zip("qkv", (q, k, v)):
            if not hasattr(t, "data_ptr") or not hasattr(t, "dim"):
                raise L.InvalidArgumentError("%s must be a torch tensor, got %s"
                                             % (name, type(t).__name__))
        c = _prepare(q, k, v, seqused_k, window, softcap, scale, layout)
        if key is not None:
            if len(_calls) >= MAX_CALLS:
                _calls.clear()
            _calls[key] = c
    if A._Tensor is None:
        A._setup_torch()
    if out is None:
        out = A._empty_like(q)
    elif (not isinstance(out, A._Tensor) or out.shape != q.shape or out.dtype != q.dtype
          or out.get_device() != c.dev or not out.is_contiguous()):
        raise L.InvalidArgumentError("out must be a contiguous tensor like q, on q's device")
    p = c.plan
    lens = None if seqused_k is None else seqused_k.data_ptr()
    with p.ctx.lock:
        st = c.call(c.fn, p.plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lens,
                    c.batch, c.cap, A._raw_stream(c.dev))
        if st:
            raise p.ctx.fail(st)
    return out


_windows = {}


def window_of(mask):
    """decode's window for a mask spec of stof.attention: "causal" 0,
    "causal_window:W" W; anything else cannot be a decoding step's."""
    if isinstance(mask, str):
        w = _windows.get(mask)
        if w is None:
            w = _window_of(mask)
            if len(_windows) < 256:
                _windows[mask] = w
        return w
    return _window_of(mask)


def _window_of(mask):
    spec = mask if isinstance(mask, str) else getattr(mask, "spec", None)
    spec = (spec or "").replace(" ", "")
    if spec == "causal":
        return 0
    if spec.startswith("causal_window:") and spec[14:].isdigit() and int(spec[14:]) > 0:
        return int(spec[14:])
    raise L.InvalidArgumentError("a decoding step's mask is causal or causal_window:W, got %r"
                                 % (mask,))


def clear_plans():
    """Forgets the decode plans and the call forms (the plans are freed
    when nothing holds them)."""
    with _lock:
        _plans.clear()
        _calls.clear()


def decode_plans():
    """The process's decode plans: [(key, describe line)]."""
    return [(k, p.describe()) for k, p in list(_plans.items())]
