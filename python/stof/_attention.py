"""_attention: stof.attention on torch tensors and on any CUDA array.

It owns the mapping of arrays onto stof_mha_desc (shapes, dtypes, layouts
read from strides, packed QKV recognised from pointers), the checks that
must pass before anything is launched, and the process's plans: one per
(device, shapes, strides, dtypes, layout, mask, scale, softcap, alibi, bias: the
modifiers' tensors by address, as the plan reads them), so a repeated call
is a dict lookup, an output allocation and one launch call (through
_native where it was built, else ctypes).
"""
import sys
import threading
from ctypes import byref, c_void_p

from . import _arrays
from . import _decode
from . import _lib as L
from . import _mask
from . import _varlen

LAYOUTS = ("bhld", "blhd")

_plans = {}
_plans_lock = threading.Lock()


class _Entry(L.PlanHandle):
    """A plan and what a call needs besides it, worked out once."""

    __slots__ = ("ctx", "plan", "call", "run", "lock", "mask", "packed", "k_off", "v_off",
                 "out_shape", "out_stride", "out_swapped", "like_q", "batch", "device", "tdevice",
                 "desc", "mods", "_free")

    DESCRIBE = "mha_plan_describe"


# ---- layouts --------------------------------------------------------------------------


def _canon(shape, stride, layout):
    """A 4-D array's sizes and strides in (B, H, L, D) order."""
    if len(shape) != 4:
        return None
    if layout == "bhld":
        return tuple(shape), tuple(stride)
    b, l, h, d = shape
    sb, sl, sh, sd = stride
    return (b, h, l, d), (sb, sh, sl, sd)


def _fits(shape, stride, want):
    # A dimension of size 1 may have any stride (torch leaves them as they fall).
    return all(n == 1 or s == w for n, s, w in zip(shape, stride, want))


def _bhld_strides(b, h, l, d):
    return (h * l * d, l * d, d, 1)


def _blhd_strides(b, h, l, d, width=1):
    # (B, H, L, D) order; width 3 for the rows of a [B, L, 3, H, D] QKV projection.
    return (l * width * h * d, d, width * h * d, 1)


def out_layout(q_shape, q_stride, layout):
    """The output's sizes and strides, in the caller's layout: [B, H, Lq, D]
    or [B, Lq, H, D] like q, stored as q is (BLHD for packed QKV). The fake
    (meta) implementation of the torch op uses this too, so the two agree."""
    (b, h, l, d), st = _canon(q_shape, q_stride, layout)
    if _fits((b, h, l, d), st, _bhld_strides(b, h, l, d)):
        s = _bhld_strides(b, h, l, d)
    else:
        s = _blhd_strides(b, h, l, d)
    if layout == "bhld":
        return (b, h, l, d), s
    return (b, l, h, d), (s[0], s[2], s[1], s[3])


def _physical(qa, ka, va, layout, ptrs, itemsize):
    """(stof_layout, packed) for arrays given as (shape, stride) in the
    caller's layout, or raises saying what the kernel cannot read."""
    c = [_canon(s, st, layout) for s, st in (qa, ka, va)]
    for name, x, (s, _) in zip("qkv", c, (qa, ka, va)):
        if x is None:
            raise L.InvalidArgumentError("%s must be 4-D (%s), got shape %s"
                                         % (name, layout.upper(), list(s)))
    (b, h, lq, d), (_, hk, lk, _) = c[0][0], c[1][0]
    want_q, want_kv = (b, h, lq, d), (b, hk, lk, d)
    for name, (shape, _), want in zip("kv", c[1:], (want_kv, want_kv)):
        if shape[0] != b or shape[3] != d:
            raise L.InvalidArgumentError(
                "%s's batch and head_dim must match q's %s (in %s), got %s"
                % (name, [b, d], layout.upper(), [shape[0], shape[3]]))
    # Grouped KV heads (GQA, MQA; SDPA's enable_gqa): k and v with fewer
    # heads, a divisor of q's.
    if c[2][0][1] != hk or hk < 1 or h % hk:
        raise L.InvalidArgumentError(
            "k and v must have the same number of heads, one that divides q's %d (grouped KV "
            "heads), got %d and %d" % (h, hk, c[2][0][1]))
    if c[2][0][2] != lk:
        raise L.InvalidArgumentError("k and v must have the same length, got %d and %d"
                                     % (lk, c[2][0][2]))
    sizes = (want_q, want_kv, want_kv)
    if all(_fits(s, st, _bhld_strides(*s)) for s, (_, st) in zip(sizes, c)):
        return L.LAYOUT_BHLD, False
    if all(_fits(s, st, _blhd_strides(*s)) for s, (_, st) in zip(sizes, c)):
        return L.LAYOUT_BLHD, False
    if lq == lk and hk == h and all(_fits(s, st, _blhd_strides(*s, width=3))
                                    for s, (_, st) in zip(sizes, c)):
        row = h * d * itemsize
        if ptrs[1] - ptrs[0] == row and ptrs[2] - ptrs[0] == 2 * row:
            return L.LAYOUT_BLHD, True
        raise L.InvalidArgumentError(
            "q, k and v have the strides of one packed QKV tensor [batch, seq, 3, heads, "
            "head_dim] but are not its q, k and v slices (k and v must start %d and %d bytes "
            "after q)" % (row, 2 * row))
    raise L.InvalidArgumentError(
        "q, k and v must each be contiguous in one of BHLD or BLHD memory order (or be the q, k "
        "and v slices of one [batch, seq, 3, heads, head_dim] QKV tensor); got strides %s, %s, "
        "%s for shapes %s, %s, %s in layout %r" % (qa[1], ka[1], va[1], list(qa[0]),
                                                  list(ka[0]), list(va[0]), layout))


# ---- plans -------------------------------------------------------------------------------


def _dtype_name(code):
    return {L.F16: "float16", L.BF16: "bfloat16"}.get(code, str(code))


def _supported(b, h, lq, lk, d):
    """stof.h's limits, held before a mask is made for the call (what the
    library would refuse as STOF_ERR_UNSUPPORTED)."""
    if d not in L.MHA_HEAD_DIMS:
        raise L.UnsupportedError("head_dim %d is not supported (%s)"
                                 % (d, ", ".join(map(str, L.MHA_HEAD_DIMS))))
    for name, n in (("q", lq), ("k", lk)):
        if n > L.MAX_SEQ:
            raise L.UnsupportedError("%s's sequence length %d is above STOF_MAX_SEQ = %d"
                                     % (name, n, L.MAX_SEQ))
    if b * h > L.MAX_BATCH_HEADS:
        raise L.UnsupportedError("batch %d x heads %d is above STOF_MAX_BATCH_HEADS = %d"
                                 % (b, h, L.MAX_BATCH_HEADS))


def _mod_array(x, name, shape, device):
    """A modifier's table (ALiBi's slopes, the bias's): a contiguous float32
    array of `shape` (None for a dimension taken as it is) on the device;
    returns its shape and address."""
    t = _Tensor
    if t is not None and isinstance(x, t):
        got = (tuple(x.shape), _TORCH_DTYPES.get(x.dtype, str(x.dtype)), x.get_device(),
               x.is_contiguous())
        ok = str(x.dtype) == "torch.float32"
        ptr = x.data_ptr()
    else:
        d = getattr(x, "__cuda_array_interface__", None)
        if d is None:
            raise L.InvalidArgumentError("%s must be a float32 torch tensor or CUDA array, got %s"
                                         % (name, type(x).__name__))
        sh = tuple(d["shape"])
        st = d.get("strides")
        contiguous = st is None or _fits(sh, st, tuple(4 * s for s in _row_major(sh)))
        dev = getattr(getattr(x, "device", None), "id", None)
        got = (sh, d["typestr"], device if dev is None else dev, contiguous)
        ok = d["typestr"][1:] == "f4"
        ptr = d["data"][0]
    sh, _, dev, contiguous = got
    if (not ok or len(sh) != len(shape) or any(w is not None and n != w for n, w in zip(sh, shape))
            or not contiguous or dev != device):
        want = ", ".join("B" if w is None else str(w) for w in shape)
        raise L.InvalidArgumentError("%s must be a contiguous float32 [%s] array on q's device "
                                     "(cuda:%d), got shape %s" % (name, want, device, list(sh)))
    return sh, ptr


def _row_major(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def _mods(alibi, bias, heads, device):
    """(alibi, slopes address or None, buckets, table address or None) for
    stof_mha_desc, from stof.attention's alibi= and bias=."""
    slopes = table = None
    buckets = 0
    if alibi is True:
        on = 1
    elif alibi is None or alibi is False:
        on = 0
    else:
        on = 1
        slopes = _mod_array(alibi, "alibi's slopes", (heads,), device)[1]
    if bias is not None:
        sh, table = _mod_array(bias, "bias", (heads, None), device)
        buckets = sh[1]
        if not 1 <= buckets <= L.MAX_BIAS_BUCKETS:
            raise L.InvalidArgumentError("bias must have 1 to %d buckets (STOF_MAX_BIAS_BUCKETS), "
                                         "got %d" % (L.MAX_BIAS_BUCKETS, buckets))
    return on, slopes, buckets, table


def _mod_key(x):
    """What a modifier adds to a plan's key: the table's address, as the plan
    reads it (None and True as they are)."""
    if x is None or x is True or x is False:
        return x
    t = _Tensor
    if t is not None and isinstance(x, t):
        return ("t", x.data_ptr(), tuple(x.shape), x.dtype)
    d = getattr(x, "__cuda_array_interface__", None)
    return ("a", d["data"][0], tuple(d["shape"]), d["typestr"]) if d else ("?", id(x))


def _entry(key, arrays, ptrs, itemsize, layout, mask, scale, tune, softcap=None, alibi=None,
           bias=None):
    """Checks everything about a call that does not change between calls with
    the same key, then makes (or finds) its plan."""
    e = _plans.get(key)
    if e is not None:
        return e
    if layout not in LAYOUTS:
        raise L.InvalidArgumentError("layout must be 'bhld' or 'blhd', got %r" % (layout,))
    names = "qkv"
    dev = arrays[0][3]
    for name, (_, _, dtype, device) in zip(names, arrays):
        if device is None or device < 0:
            raise L.InvalidArgumentError("%s is not on a CUDA device: stof runs on the GPU" % name)
        if device != dev:
            raise L.InvalidArgumentError("q, k and v must be on one device, got %s"
                                         % [a[3] for a in arrays])
        if dtype not in (L.F16, L.BF16):
            raise L.UnsupportedError("%s's dtype must be float16 or bfloat16, got %s"
                                     % (name, dtype))
    if len({a[2] for a in arrays}) != 1:
        raise L.InvalidArgumentError("q, k and v must have one dtype, got %s"
                                     % [_dtype_name(a[2]) for a in arrays])
    lay, packed = _physical(arrays[0][:2], arrays[1][:2], arrays[2][:2], layout, ptrs, itemsize)
    (b, h, lq, d), _ = _canon(arrays[0][0], arrays[0][1], layout)
    hk, lk = _canon(arrays[1][0], arrays[1][1], layout)[0][1:3]
    _supported(b, h, lq, lk, d)
    if isinstance(mask, str):
        m = _mask.for_spec(mask, lq, lk)
    elif isinstance(mask, _mask.Mask):
        m = mask
    else:
        raise L.InvalidArgumentError("mask must be a spec str or a stof.Mask, got %s"
                                     % type(mask).__name__)
    if m.shape != (lq, lk):
        raise L.InvalidArgumentError("the mask is %d x %d but q and k make it %d x %d"
                                     % (m.lq, m.lk, lq, lk))
    if tune not in L.TUNE:
        raise L.InvalidArgumentError("tune must be None, 'off', 'fast' or 'full', got %r" % (tune,))
    cap = float(softcap or 0.0)
    if not cap >= 0.0 or cap == float("inf"):
        raise L.InvalidArgumentError("softcap must be None, 0 or a finite number > 0, got %r"
                                     % (softcap,))
    on, slopes, buckets, table = _mods(alibi, bias, h, dev)
    desc = L.MhaDesc(batch=b, heads=h, seq_q=lq, seq_k=lk, head_dim=d, dtype=arrays[0][2],
                     layout=lay, qkv_packed=int(packed), scale=float(scale or 0.0),
                     tune=L.TUNE[tune], kv_heads=hk if hk != h else 0, softcap=cap,
                     alibi=on, alibi_slopes=slopes, bias_buckets=buckets, bias_table=table)
    ctx = L.Context.for_device(dev)
    with _plans_lock:
        e = _plans.get(key)
        if e is not None:
            return e
        handle = c_void_p()
        with ctx.lock:
            ctx.check(ctx._lib.mha_plan_create(ctx.handle, byref(desc), m._handle, byref(handle)))
        e = _Entry()
        e.ctx, e.plan, e.lock, e.mask, e.desc = ctx, handle.value, ctx.lock, m, desc
        # The plan reads the modifiers' tables at every run: they live as long as it.
        e.mods = (alibi, bias)
        e.call, e.run = ctx._lib.launcher("mha_run")
        e._free = ctx._lib.mha_plan_free
        e.packed = packed
        e.k_off, e.v_off = h * d * itemsize, 2 * h * d * itemsize
        e.out_shape, e.out_stride = out_layout(arrays[0][0], arrays[0][1], layout)
        e.out_swapped = e.out_stride[1] < e.out_stride[2]   # dims 1 and 2 stored the other way
        # Then torch.empty_like(q) makes the output (a fifth less host time
        # than empty_strided).
        e.like_q = e.out_shape == tuple(arrays[0][0]) and e.out_stride == tuple(arrays[0][1])
        e.tdevice = None
        e.batch, e.device = b, dev
        _plans[key] = e
    return e


def _strides_match(shape, a, b):
    return len(a) == len(b) and _fits(shape, a, b)


def _check_packed(e, qp, kp, vp):
    if kp - qp != e.k_off or vp - qp != e.v_off:
        raise L.InvalidArgumentError(
            "q, k and v have the strides of one packed QKV tensor but are not its q, k and v "
            "slices (k and v must start %d and %d bytes after q)" % (e.k_off, e.v_off))


def plans():
    """The plans this process holds, varlen ones too (decode ones:
    stof.decode_plans): [(key, describe line)]."""
    return [(k, e.describe()) for k, e in list(_plans.items())] + _varlen.plans()


def clear_plans():
    """Frees every plan, varlen and decode ones too (for tests and for
    memory; the next calls plan again, from the cache)."""
    with _plans_lock:
        _plans.clear()
    _varlen.clear_plans()
    _decode.clear_plans()


# ---- torch ----------------------------------------------------------------------------------

_torch = None          # the module, once a tensor has been seen (_arrays's)
_Tensor = None
_TORCH_DTYPES = _arrays._TORCH_DTYPES
_raw_stream = None
_is_compiling = None
_empty_like = None


def _register_ops():
    from . import _torch as op
    op.register(attention_torch, out_layout, _varlen.attention)


_arrays.on_setup(_register_ops)


def _setup_torch():
    global _torch, _Tensor, _raw_stream, _is_compiling, _empty_like
    _arrays._setup_torch()
    _raw_stream, _is_compiling, _empty_like = (_arrays._raw_stream, _arrays._is_compiling,
                                               _arrays._empty_like)
    _Tensor, _torch = _arrays._Tensor, _arrays._torch


def attention_torch(q, k, v, mask, seq_lens, scale, layout, tune=None, out=None, softcap=None,
                    alibi=None, bias=None):
    """The eager path for torch tensors: what the custom op runs, too."""
    try:
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype,
               v.dtype, q.get_device(), k.get_device(), v.get_device(), layout, mask, scale,
               tune, softcap)
        if alibi is not None or bias is not None:
            key += (_mod_key(alibi), _mod_key(bias))
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    except (AttributeError, TypeError):
        raise L.InvalidArgumentError("q, k and v must all be torch tensors, got %s"
                                     % [type(x).__name__ for x in (q, k, v)]) from None
    e = _plans.get(key)
    if e is None:
        td = _TORCH_DTYPES
        arrays = [(t.shape, t.stride(), td.get(t.dtype, t.dtype), t.get_device())
                  for t in (q, k, v)]
        e = _entry(key, arrays, (qp, kp, vp), q.element_size(), layout, mask, scale, tune,
                   softcap, alibi, bias)
        e.tdevice = q.device
    if e.packed:
        _check_packed(e, qp, kp, vp)
    if out is None:
        out = (_empty_like(q) if e.like_q else
               _torch.empty_strided(e.out_shape, e.out_stride, dtype=q.dtype, device=e.tdevice))
    else:
        _check_out_torch(e, q, out)
    sp = None
    if seq_lens is not None:
        sp = _seq_lens_torch(e, seq_lens, q)
    with e.lock:
        st = e.call(e.run, e.plan, qp, kp, vp, out.data_ptr(), sp, _raw_stream(e.device))
        if st:
            raise e.ctx.fail(st)
    return out


def _check_out_torch(e, q, out):
    if (not isinstance(out, _Tensor) or tuple(out.shape) != e.out_shape
            or not _strides_match(e.out_shape, out.stride(), e.out_stride) or out.dtype != q.dtype
            or out.get_device() != e.device):
        raise L.InvalidArgumentError(
            "out must be a %s tensor on cuda:%d of shape %s and strides %s"
            % (q.dtype, e.device, list(e.out_shape), list(e.out_stride)))


def _seq_lens_torch(e, seq_lens, q):
    t = _torch
    if not isinstance(seq_lens, _Tensor):
        # A host list costs a copy to the device on every call.
        seq_lens = t.tensor(list(seq_lens), dtype=t.int32, device=q.device)
    elif seq_lens.device != q.device or seq_lens.dtype != t.int32:
        if seq_lens.is_cuda or seq_lens.dtype not in (t.int32, t.int64):
            raise L.InvalidArgumentError(
                "seq_lens must be an int32 tensor on q's device (%s), got %s on %s"
                % (q.device, seq_lens.dtype, seq_lens.device))
        seq_lens = seq_lens.to(device=q.device, dtype=t.int32)
    if seq_lens.shape != (e.batch,) or not seq_lens.is_contiguous():
        raise L.InvalidArgumentError("seq_lens must be a contiguous [batch] = [%d] tensor, got %s"
                                     % (e.batch, list(seq_lens.shape)))
    return seq_lens.data_ptr()


# ---- any CUDA array: __cuda_array_interface__ or DLPack ---------------------------------


_cai = _arrays._cai

_stream_handle = _arrays._stream_handle

def attention_array(q, k, v, mask, seq_lens, scale, layout, tune, out, stream, device,
                    softcap=None, alibi=None, bias=None):
    if not hasattr(q, "__cuda_array_interface__") and hasattr(q, "__dlpack__"):
        return _via_dlpack(q, k, v, mask, seq_lens, scale, layout, tune, out, stream, device,
                           softcap, alibi, bias)
    (qa, qp, size, qstream), (ka, kp, _, _), (va, vp, _, _) = (
        _cai(x, n, device) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    key = ("cai", qa[:2], ka[:2], va[:2], qa[2], ka[2], va[2], qa[3], ka[3], va[3], layout,
           mask, scale, tune, softcap, _mod_key(alibi), _mod_key(bias))
    e = _entry(key, [qa, ka, va], (qp, kp, vp), size, layout, mask, scale, tune, softcap, alibi,
               bias)
    if e.packed:
        _check_packed(e, qp, kp, vp)
    cupy = type(q).__module__.split(".")[0] == "cupy" and sys.modules.get("cupy")
    if stream is None:
        stream = cupy.cuda.get_current_stream().ptr if cupy else qstream
    stream = _stream_handle(stream) or None
    if out is None:
        if not cupy:
            raise L.InvalidArgumentError(
                "for a %s input pass out= (a CUDA array of shape %s and element strides %s): "
                "stof allocates outputs only for torch and CuPy" % (type(q).__name__,
                                                                  list(e.out_shape),
                                                                  list(e.out_stride)))
        with cupy.cuda.Device(e.device):
            b, x, y, d = e.out_shape
            if e.out_swapped:
                out = cupy.empty((b, y, x, d), dtype=q.dtype).transpose(0, 2, 1, 3)
            else:
                out = cupy.empty(e.out_shape, dtype=q.dtype)
    oa, op, _, _ = _cai(out, "out", device)
    if (oa[0] != e.out_shape or not _strides_match(e.out_shape, oa[1], e.out_stride)
            or oa[2] != qa[2] or oa[3] != e.device):
        raise L.InvalidArgumentError("out must have shape %s, element strides %s, q's dtype "
                                     "and device" % (list(e.out_shape), list(e.out_stride)))
    sp = None
    if seq_lens is not None:
        sa, sp, ssize, _ = _cai(seq_lens, "seq_lens", device)
        if sa[0] != (e.batch,) or sa[2] != "<i4" or sa[1] != (1,) or sa[3] != e.device:
            raise L.InvalidArgumentError("seq_lens must be a contiguous int32 [batch] = [%d] "
                                         "array on q's device" % e.batch)
    with e.lock:
        st = e.call(e.run, e.plan, qp, kp, vp, op, sp, stream)
        if st:
            raise e.ctx.fail(st)
    return out


def _via_dlpack(q, k, v, mask, seq_lens, scale, layout, tune, out, stream, device, softcap,
                alibi=None, bias=None):
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        conv = cupy.from_dlpack
    else:
        try:
            import torch
        except ImportError:
            raise L.InvalidArgumentError("a DLPack array needs torch or CuPy to be read") from None
        conv = torch.from_dlpack
    mods = [x if x is None or x is True or x is False else conv(x) for x in (alibi, bias)]
    args = [None if x is None else conv(x) for x in (q, k, v, seq_lens, out)]
    return attention(args[0], args[1], args[2], mask, args[3], scale, layout, tune=tune,
                     out=args[4], stream=stream, device=device, softcap=softcap, alibi=mods[0],
                     bias=mods[1])


# ---- the entry point --------------------------------------------------------------------------


def attention(q, k, v, mask="dense", seq_lens=None, scale=None, layout="bhld", *, tune=None,
              out=None, stream=None, device=None, softcap=None, alibi=None, bias=None,
              seqused_k=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None):
    """Masked multi-head attention: softmax(cap(q kᵀ · scale) + mods + mask) v.

    q: [B, H, Lq, D] ("bhld") or [B, Lq, H, D] ("blhd"); k and v likewise
    with Lk, and with Hk heads where Hk divides H (grouped KV heads, GQA or
    MQA, as SDPA's enable_gqa: query head h reads KV head h // (H // Hk)).
    Where Lk > Lq the queries are the last Lq positions (a KV prefix):
    causal, causal_window and window align bottom-right. softcap: None or 0,
    or the logit softcap c > 0 (Gemma-2): cap(s) = c tanh(s / c).
    mods, added after the cap: alibi=True (the standard slopes of H heads) or
    a float32 [H] array of slopes, adding slope[h] (k - p); bias= a float32
    [H, B] array (B <= 4096), adding bias[h, bucket(p - k)], bucket(x) =
    clamp(x, -(B // 2), B - 1 - B // 2) + B // 2; p = i + Lk - Lq is query
    i's position, k a key's. Both are read at each call from the arrays'
    addresses, which are part of the plan: pass the same arrays (a model's
    parameters) call after call, as a new one plans again (from the cache).
    fp16 or bf16, on one CUDA device; each contiguous in BHLD or
    BLHD memory order whatever the layout named (a transposed view is read in
    place), or the q, k, v slices of one [B, L, 3, H, D] QKV projection
    (read packed, with no copy). D: 32, 64, 80, 96 or 128.
    mask: a spec ("window:256+global:64", grammar in stof.h) or a stof.Mask
    of Lq x Lk. seq_lens: None, or [B] int32 valid lengths on q's device (a
    list or a host tensor is copied there on each call). scale: None means
    1/sqrt(D). tune: None ($STOF_TUNE), "off", "fast" or "full", for the
    first call of a shape.

    Returns a new array like q (its layout, its memory order; BLHD for
    packed QKV), computed on the caller's current stream: torch's for
    tensors, CuPy's for CuPy arrays, else `stream` (a CUstream or an object
    with .ptr/.cuda_stream), else the array's own __cuda_array_interface__
    stream. out= writes into a given array instead. The first call of a
    shape plans (a cache hit, or a search); later ones only launch.

    seqused_k= (an int32 CUDA tensor [B] of cache lengths, the new rows
    included) makes it a decoding step against a KV cache: stof.decode, with
    mask "causal" or "causal_window:W" (torch tensors; no seq_lens, alibi or
    bias), one plan for every length.

    cu_seqlens_q= and cu_seqlens_k= (int32 CUDA arrays [n + 1], with
    max_seqlen_q= and max_seqlen_k=, the longest sequence's rows) make it a
    packed variable-length batch, as FlashAttention's varlen call: q
    [total_q, H, D], k and v [total_k, Hk, D], contiguous, sequence b's rows
    cu[b] .. cu[b+1] - 1; the mask applies inside each sequence, its queries
    the last of its keys (causal aligns bottom-right). Returns a new array
    like q. One plan serves every composition whose longest sequence fits the
    plan's bucket (the power of two at or above max(max_seqlen, 1024)) and
    whose count fits its batch bucket: no plan, no compile, no host read of
    cu_seqlens per call. Boundaries are read on the device and clamped (a
    sequence longer than max_seqlen keeps its first rows up to the bucket).
    No seq_lens, alibi or bias (positions would be the plan's, not each
    sequence's).
    """
    if mask is None:
        mask = "dense"
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise L.InvalidArgumentError("a varlen call takes both cu_seqlens_q and cu_seqlens_k")
        if seq_lens is not None or seqused_k is not None:
            raise L.InvalidArgumentError("a varlen call (cu_seqlens) takes no seq_lens or "
                                         "seqused_k: cu_seqlens gives each sequence's rows")
        if alibi not in (None, False) or bias is not None:
            raise L.UnsupportedError("a varlen call (cu_seqlens) does not take alibi or bias yet "
                                     "(their positions would be the plan's, not each sequence's)")
        return _varlen.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, mask, scale, tune, out, stream, device, softcap)
    if seqused_k is not None:
        if seq_lens is not None or alibi is not None or bias is not None:
            raise L.InvalidArgumentError("a decoding step (seqused_k=) takes no seq_lens, alibi "
                                         "or bias")
        return _decode.decode(q, k, v, seqused_k, window=_decode.window_of(mask),
                              softcap=softcap, scale=scale, layout=layout, out=out)
    tt = _Tensor
    if tt is None and "torch" in sys.modules:
        _setup_torch()
        tt = _Tensor
    if tt is not None and isinstance(q, tt):
        if _is_compiling():
            from . import _torch as op
            return op.call(q, k, v, mask, seq_lens, scale, layout, softcap, alibi, bias)
        if stream is not None:
            if not isinstance(stream, _torch.cuda.Stream):
                stream = _torch.cuda.ExternalStream(_stream_handle(stream), device=q.device)
            with _torch.cuda.stream(stream):
                return attention_torch(q, k, v, mask, seq_lens, scale, layout, tune, out,
                                       softcap, alibi, bias)
        return attention_torch(q, k, v, mask, seq_lens, scale, layout, tune, out, softcap,
                               alibi, bias)
    return attention_array(q, k, v, mask, seq_lens, scale, layout, tune, out, stream, device,
                           softcap, alibi, bias)


# Last, so that what the op is handed is defined.
if "torch" in sys.modules:
    _setup_torch()
