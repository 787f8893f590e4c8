"""_varlen: stof.attention on packed variable-length batches (cu_seqlens).

It owns the varlen form of stof.attention, FlashAttention's convention: q
[total_q, heads, D], k and v [total_k, kv_heads, D], the rows of every
sequence back to back, with int32 cu_seqlens_q and cu_seqlens_k [n + 1] on
the device and the longest lengths given. Its plans are keyed on buckets
(the power of two at or above the longest length, at least 1024, and at or
above the number of sequences), never on a composition: a new cu_seqlens
costs no plan and no compile, and nothing reads it on the host. The run
goes to stof_mha_run_varlen through _native's varlen_run (or ctypes).
"""
import sys
import threading
from ctypes import byref, c_void_p

from . import _arrays as A
from . import _lib as L
from . import _mask

_plans = {}
_lock = threading.Lock()
# Plans are made for at least LEAST_BATCH sequences, so that compositions of
# a few sequences, whatever their count, share one, as far as the plan's
# search (which times equal sequences of the plan's lengths) stays within
# BATCH_ROWS rows.
LEAST_BATCH = 16
BATCH_ROWS = 1 << 16
LEAST_SEQ = 1024


def bucket(n, least):
    """The power of two at or above max(n, least)."""
    b = least
    while b < n:
        b *= 2
    return b


class _Plan(L.PlanHandle):
    __slots__ = ("ctx", "plan", "run", "desc", "mask", "_free")

    DESCRIBE = "mha_plan_describe"


def plans():
    """The process's varlen plans: [(key, describe line)]."""
    return [(k, p.describe()) for k, p in list(_plans.items())]


def clear_plans():
    with _lock:
        _plans.clear()
        _calls.clear()


# ---- what an array is: torch tensors and __cuda_array_interface__ --------------------


def _view(x, name, device):
    """(shape, element strides, dtype, device, address) of a torch tensor or
    a CUDA array; dtype a stof_dtype code for fp16/bf16, else a name."""
    t = A._Tensor
    if t is None and "torch" in sys.modules:
        A._setup_torch()
        t = A._Tensor
    if t is not None and isinstance(x, t):
        dtype = A._TORCH_DTYPES.get(x.dtype, str(x.dtype).replace("torch.", ""))
        if dtype == "int32":
            dtype = "<i4"
        return tuple(x.shape), tuple(x.stride()), dtype, x.get_device(), x.data_ptr()
    (shape, strides, dtype, dev), ptr, _, _ = A._cai(x, name, device)
    return shape, strides, dtype, dev, ptr


def _contiguous(shape, strides):
    want, acc = [], 1
    for n in reversed(shape):
        want.append(acc)
        acc *= n
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, reversed(want)))


def _length(x, name):
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            x = int(x)          # a 0-d tensor, a numpy integer
        except (TypeError, ValueError):
            raise L.InvalidArgumentError("%s must be an int (the longest sequence), got %r"
                                         % (name, x)) from None
    if x < 0:
        raise L.InvalidArgumentError("%s must be >= 0, got %d" % (name, x))
    if x > L.MAX_SEQ:
        raise L.UnsupportedError("%s %d is above STOF_MAX_SEQ = %d" % (name, x, L.MAX_SEQ))
    return x


def check(q, k, v, cu_q, cu_k, max_q, max_k, device=None):
    """Everything about a varlen call that can be checked before a launch:
    returns (views of q, k, v, cu_q, cu_k, batch, heads, kv_heads, head_dim,
    max_q, max_k), or raises naming the argument."""
    qv, kv, vv = (_view(x, n, device) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    for name, (shape, _, _, _, _) in zip("qkv", (qv, kv, vv)):
        if len(shape) != 3:
            raise L.InvalidArgumentError(
                "with cu_seqlens, %s must be 3-D [total_%s, heads, head_dim] (the rows of every "
                "sequence back to back), got shape %s" % (name, "q" if name == "q" else "k",
                                                           list(shape)))
    dev = qv[3]
    for name, x in zip("qkv", (qv, kv, vv)):
        if x[3] is None or x[3] < 0:
            raise L.InvalidArgumentError("%s is not on a CUDA device: stof runs on the GPU" % name)
        if x[3] != dev:
            raise L.InvalidArgumentError("q, k and v must be on one device, got %s"
                                         % [a[3] for a in (qv, kv, vv)])
        if x[2] not in (L.F16, L.BF16):
            raise L.UnsupportedError("%s's dtype must be float16 or bfloat16, got %s"
                                     % (name, x[2]))
    if not qv[2] == kv[2] == vv[2]:
        raise L.InvalidArgumentError("q, k and v must have one dtype")
    (_, h, d), (_, hk, dk) = qv[0], kv[0]
    if vv[0] != kv[0]:
        raise L.InvalidArgumentError("k and v must have one shape, got %s and %s"
                                     % (list(kv[0]), list(vv[0])))
    if dk != d:
        raise L.InvalidArgumentError("k's head_dim %d must match q's %d" % (dk, d))
    if hk < 1 or h % hk:
        raise L.InvalidArgumentError(
            "k and v's heads (%d) must divide q's (%d) (grouped KV heads)" % (hk, h))
    if d not in L.MHA_HEAD_DIMS:
        raise L.UnsupportedError("head_dim %d is not supported (%s)"
                                 % (d, ", ".join(map(str, L.MHA_HEAD_DIMS))))
    for name, x in zip("qkv", (qv, kv, vv)):
        if not _contiguous(x[0], x[1]):
            raise L.InvalidArgumentError(
                "%s must be contiguous (rows back to back, [total, heads, head_dim]), got "
                "strides %s for shape %s" % (name, list(x[1]), list(x[0])))
    cq, ck = (_view(x, n, dev) for x, n in ((cu_q, "cu_seqlens_q"), (cu_k, "cu_seqlens_k")))
    for name, x in (("cu_seqlens_q", cq), ("cu_seqlens_k", ck)):
        if (len(x[0]) != 1 or x[0][0] < 2 or x[2] != "<i4" or x[3] != dev
                or not _contiguous(x[0], x[1])):
            raise L.InvalidArgumentError(
                "%s must be a contiguous int32 [n + 1] array (n >= 1 sequences) on q's device "
                "(cuda:%d), got shape %s, dtype %s on device %s"
                % (name, dev, list(x[0]), x[2], x[3]))
    if cq[0] != ck[0]:
        raise L.InvalidArgumentError("cu_seqlens_q and cu_seqlens_k must have one length (n + 1),"
                                     " got %d and %d" % (cq[0][0], ck[0][0]))
    n = cq[0][0] - 1
    if n * h > L.MAX_BATCH_HEADS:
        raise L.UnsupportedError("%d sequences x heads %d is above STOF_MAX_BATCH_HEADS = %d"
                                 % (n, h, L.MAX_BATCH_HEADS))
    if max_q is None or max_k is None:
        raise L.InvalidArgumentError("with cu_seqlens, give max_seqlen_q and max_seqlen_k (the "
                                     "longest sequence's rows): the plan is made for them")
    max_q, max_k = _length(max_q, "max_seqlen_q"), _length(max_k, "max_seqlen_k")
    return qv, kv, vv, cq, ck, n, h, hk, d, max_q, max_k


def plan_shape(n, heads, max_q, max_k, mask):
    """(seq_q, seq_k, batch) of the plan that serves n sequences of at most
    max_q x max_k rows: buckets for a spec, so that other compositions and
    lengths find the same plan; a stof.Mask's own size (it must cover them)."""
    if isinstance(mask, str):
        sq = min(bucket(max_q, LEAST_SEQ), L.MAX_SEQ)
        sk = min(bucket(max_k, LEAST_SEQ), L.MAX_SEQ)
    elif isinstance(mask, _mask.Mask):
        sq, sk = mask.shape
        if max_q > sq or max_k > sk:
            raise L.InvalidArgumentError(
                "the mask is %d x %d but max_seqlen_q x max_seqlen_k is %d x %d: a varlen mask "
                "must cover the longest sequence" % (sq, sk, max_q, max_k))
    else:
        raise L.InvalidArgumentError("mask must be a spec str or a stof.Mask, got %s"
                                     % type(mask).__name__)
    least = max(1, min(LEAST_BATCH, BATCH_ROWS // max(sq, sk)))
    return sq, sk, min(max(bucket(n, 1), least), max(n, L.MAX_BATCH_HEADS // heads))


def _plan(qv, n, h, hk, d, max_q, max_k, mask, scale, tune, softcap):
    """The plan for a call's buckets: found, or made (a cache hit or a search)."""
    sq, sk, nb = plan_shape(n, h, max_q, max_k, mask)
    mkey = mask if isinstance(mask, str) else ("mask", mask.hash, sq, sk)
    if tune not in L.TUNE:
        raise L.InvalidArgumentError("tune must be None, 'off', 'fast' or 'full', got %r" % (tune,))
    cap = float(softcap or 0.0)
    if not cap >= 0.0 or cap == float("inf"):
        raise L.InvalidArgumentError("softcap must be None, 0 or a finite number > 0, got %r"
                                     % (softcap,))
    dev, dtype = qv[3], qv[2]
    key = (dev, dtype, h, hk, d, sq, sk, nb, mkey, scale, tune, cap)
    p = _plans.get(key)
    if p is not None:
        return p
    # A plan made for more sequences runs fewer (the run names its batch):
    # a batch bucket below one already made takes that one.
    for nb2, p in list(_plans.items()):
        if (len(nb2) == len(key) and nb2[:7] == key[:7] and nb2[8:] == key[8:]
                and nb2[7] > nb):
            return p
    m = _mask.for_spec(mask, sq, sk) if isinstance(mask, str) else mask
    desc = L.MhaDesc(batch=nb, heads=h, seq_q=sq, seq_k=sk, head_dim=d, dtype=dtype,
                     layout=L.LAYOUT_BLHD, scale=float(scale or 0.0), tune=L.TUNE[tune],
                     kv_heads=hk if hk != h else 0, softcap=cap, varlen=1)
    ctx = L.Context.for_device(dev)
    with _lock:
        p = _plans.get(key)
        if p is not None:
            return p
        run = ctx._lib.need("mha_run_varlen")
        handle = c_void_p()
        with ctx.lock:
            ctx.check(ctx._lib.mha_plan_create(ctx.handle, byref(desc), m._handle, byref(handle)))
        p = _Plan()
        p.ctx, p.plan, p.run, p.desc, p.mask = ctx, handle.value, run, desc, m
        p._free = ctx._lib.mha_plan_free
        _plans[key] = p
    return p


class _Call:
    """What a torch call's arguments' shapes, strides, dtypes and devices
    (and its options) decide, found once and kept (_calls): the plan, the
    launch, the sequence count and the row totals."""
    __slots__ = ("plan", "call", "fn", "n", "tq", "tk", "dev", "shape")


_calls = {}
MAX_CALLS = 4096      # distinct call forms kept; past it the memo starts again


def _meta(t):
    return t.shape, t.stride(), t.dtype, t.device


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask="dense",
              scale=None, tune=None, out=None, stream=None, device=None, softcap=None):
    """The varlen form of stof.attention (its docstring says what it takes).
    For torch tensors the checks run once per form of call (shapes, strides,
    dtypes, devices, the longest lengths and the options): later calls, a
    new composition each, only launch."""
    if A._Tensor is None and "torch" in sys.modules:
        A._setup_torch()
    is_torch = A._Tensor is not None and isinstance(q, A._Tensor)
    if is_torch and A._is_compiling():
        from . import _torch as op
        return op.call_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              mask, scale, softcap)
    key = c = None
    if (is_torch and type(max_seqlen_q) is int and type(max_seqlen_k) is int
            and (isinstance(mask, (str, _mask.Mask)))):
        try:
            key = (_meta(q), _meta(k), _meta(v), _meta(cu_seqlens_q), _meta(cu_seqlens_k),
                   max_seqlen_q, max_seqlen_k, mask, scale, tune, softcap, device)
            c = _calls.get(key)
        except (AttributeError, TypeError):
            key = None
    views = None
    if c is None:
        qv, kv, vv, cq, ck, n, h, hk, d, max_q, max_k = check(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, device)
        views = qv, kv, vv, cq, ck
        c = _Call()
        c.plan = _plan(qv, n, h, hk, d, max_q, max_k, mask, scale, tune, softcap)
        c.n, c.tq, c.tk, c.dev, c.shape = n, qv[0][0], kv[0][0], qv[3], qv[0]
        c.call, c.fn = c.plan.ctx._lib.launcher("mha_run_varlen", "varlen_run")
        if key is not None:
            if len(_calls) >= MAX_CALLS:
                _calls.clear()
            _calls[key] = c
    dev = c.dev
    cupy = not is_torch and type(q).__module__.split(".")[0] == "cupy" and sys.modules.get("cupy")
    if out is None:
        if is_torch:
            out = A._empty_like(q)
        elif cupy:
            with cupy.cuda.Device(dev):
                out = cupy.empty(c.shape, dtype=q.dtype)
        else:
            raise L.InvalidArgumentError(
                "for a %s input pass out= (a contiguous CUDA array of shape %s): stof allocates "
                "outputs only for torch and CuPy" % (type(q).__name__, list(c.shape)))
        op = out.data_ptr() if is_torch else _view(out, "out", dev)[4]
    else:
        ov = _view(out, "out", dev)
        if ov[0] != c.shape or ov[2] != _view(q, "q", dev)[2] or ov[3] != dev or not _contiguous(
                ov[0], ov[1]):
            raise L.InvalidArgumentError("out must be a contiguous array of q's shape %s, dtype "
                                         "and device" % list(c.shape))
        op = ov[4]
    if is_torch:
        if stream is not None:
            stream = A._stream_handle(stream)
        else:
            stream = A._raw_stream(dev)
    elif stream is None:
        stream = cupy.cuda.get_current_stream().ptr if cupy else None
    else:
        stream = A._stream_handle(stream)
    if views is None:      # a torch call of a known form
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), op, cu_seqlens_q.data_ptr(),
                cu_seqlens_k.data_ptr())
    else:
        qv, kv, vv, cq, ck = views
        ptrs = (qv[4], kv[4], vv[4], op, cq[4], ck[4])
    p = c.plan
    with p.ctx.lock:
        st = c.call(c.fn, p.plan, *ptrs, c.n, c.tq, c.tk, stream or None)
        if st:
            raise p.ctx.fail(st)
    return out
