"""stof.hf._backend: the "stof" attention implementation of transformers.

Two functions registered with transformers: attention(), through
AttentionInterface, runs a model's attention with stof.attention on the
[B, H, L, D] views the model hands over (read in place, strides and all);
mask_hook(), through AttentionMaskInterface, stands where the model would
build its dense 4-D mask, and hands the attention a ModelMask instead: the
pattern as a spec, padding as seq_lens, worked out once per forward.

A decoding step (generate()'s, 1 to 16 new rows against the KV cache)
goes to stof.decode: the hook sees the cache's offsets and its padding, and
hands over the step's window and, for a cache longer than what it holds (a
StaticCache), the used lengths as seqused_k, so every step of a generation
shares one plan.

Grouped KV heads (GQA, MQA) and the logit softcap (Gemma-2) go to stof as
they are. A call stof cannot run yet (a step with left padding, float32, a
mask that differs across the batch, a backward needed) runs HF's sdpa on the
same mask instead, and says so once per reason.
"""
import functools
import warnings

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .. import _lib as L
from .._attention import attention as stof_attention
from .._decode import MAX_NEW_ROWS, decode as stof_decode
from . import _masks

try:
    from transformers.masking_utils import sdpa_mask
except ImportError:        # transformers before its mask interface (4.53)
    sdpa_mask = None

HEAD_DIMS = (32, 64, 80, 96, 128)
# Call arguments that change the scores in ways stof's kernels do not (yet).
UNSUPPORTED = {"s_aux": "attention sinks", "sinks": "attention sinks",
               "position_bias": "a position bias"}

DECODING = ("decoding (queries against a longer KV cache) with no mask from stof's mask hook: "
            "where the cache's tokens end is not known")
STEP_SPEC = "decoding under a stof.hf.mask spec (a spec does not apply to a KV cache's steps)"
STEP_ROWS = "a step of %d new rows against a KV cache (stof.decode takes 1 to %d)"
CHUNK = ("a prefill of %d rows against a KV cache %s (stof runs one whose keys start at the "
         "cache's first, unpadded)")
STEP_MASK = ("a decoding step under a mask stof.decode cannot express (%s; it takes causal and "
             "causal_window:W)")

_said = set()


def say_once(why, instead="HF's sdpa"):
    """warnings.warn, once per reason for the process."""
    if (why, instead) not in _said:
        _said.add((why, instead))
        warnings.warn("stof.hf: %s; %s runs those calls instead" % (why, instead), stacklevel=3)


class ModelMask:
    """What the mask hook hands the attention: spec (a spec str or
    stof.Mask, or None where stof cannot run this mask, why saying so),
    lens (int32 [B] valid lengths, or None) and what HF's own sdpa mask
    would be made from, for a fallback. Accelerate moves it between
    devices through to(); lens follows the query's device in any case."""

    __slots__ = ("spec", "lens", "why", "lq", "lk", "user", "pad", "args", "step", "keys",
                 "packed", "_dense", "_lens_on")
    # It stands for a 4-D mask: generate() with a StaticCache makes the mask
    # ahead of the forward (through this hook) and hands it to the model,
    # whose mask code asks its ndim before the hook gets it back.
    ndim = 4

    def __init__(self, lq, lk, args):
        self.spec, self.lens, self.why, self.user, self.pad = None, None, None, None, None
        self.step = None        # a decoding step: stof.decode's window (lens: seqused_k)
        self.keys = None        # a prefill against a cache: the keys in use, the first ones
        self.packed = None      # packed sequences: (cu_seqlens over B * L tokens, longest)
        self.lq, self.lk, self.args = lq, lk, args
        self._dense, self._lens_on = {}, {}

    def to(self, device, *a, **k):
        return self     # lens_on() moves what is needed, once per device

    def lens_on(self, device):
        if self.lens is None or self.lens.device == device:
            return self.lens
        t = self._lens_on.get(device)
        if t is None:
            t = self._lens_on[device] = self.lens.to(device)
        return t

    def sdpa_mask(self, device):
        """The mask HF's sdpa would get (a user's spec in place of the
        model's pattern, where one was set), made once per device."""
        if device in self._dense:
            return self._dense[device]
        pad = None if self.pad is None else self.pad.to(device)
        if self.user is not None:
            m = _masks.dense_of_spec(self.user, self.lq, self.lk, device)[None, None]
            if pad is not None:
                m = m & pad[:, None, None, :]
        else:
            args = dict(self.args, device=device)
            if args.get("attention_mask") is not None:
                args["attention_mask"] = args["attention_mask"].to(device)
            m = sdpa_mask(**args)
        self._dense[device] = m
        return m

    def __repr__(self):
        return "stof.hf.ModelMask(%r, lens=%s, why=%r)" % (
            self.spec, None if self.lens is None else self.lens.tolist(), self.why)


def mask_hook(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
              attention_mask=None, **kwargs):
    """transformers' mask interface for "stof": a ModelMask, not a dense mask."""
    if isinstance(attention_mask, ModelMask):
        return attention_mask       # made ahead by generate(), for this very forward
    args = dict(kwargs, batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                attention_mask=attention_mask)
    for name in ("config", "dtype"):
        args.pop(name, None)
    if mask_function is None:
        args.pop("mask_function")
    mm = ModelMask(q_length, kv_length, args)
    if not (isinstance(q_offset, int) and isinstance(kv_offset, int)
            and q_offset == 0 and kv_offset == 0 and q_length == kv_length):
        return _step(mm, batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                     attention_mask, kwargs)
    pad = attention_mask
    if pad is not None:
        if pad.shape[-1] < kv_length:
            pad = torch.nn.functional.pad(pad, (0, kv_length - pad.shape[-1]))
        pad = pad[:, :kv_length]
    mm.lens, mm.why = _masks.lengths_of_padding(pad)
    mm.pad = pad
    mm.user = _masks.user_spec(kwargs.get("config"))
    if mm.why is not None:
        return mm
    if mm.user is not None:
        mm.spec = mm.user
        return mm
    mm.spec = _masks.spec_of_mask_function(mask_function) if mask_function is not None else None
    packed = _masks.packed_form(mask_function) if mm.spec is None and mask_function else None
    if packed is not None:
        # Packed sequences (position_ids restarting): varlen, the spec within each.
        mm.spec, mm.packed = packed[0], packed[1:]
    if mm.spec is None and sdpa_mask is not None:
        # A pattern stof has no spec for (packed sequences, chunks, overlays):
        # HF's own matrix without the padding, made a stof.Mask where it is
        # one for the whole batch.
        dense = sdpa_mask(**dict(args, attention_mask=None, allow_is_causal_skip=False,
                                 allow_is_bidirectional_skip=False))
        mm.spec, mm.why = _masks.mask_of_4d(dense)
    return mm


def _step(mm, batch, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
          kwargs):
    """The ModelMask of a decoding step: q_length new rows at positions
    q_offset.., against kv_length keys from position kv_offset (a sliding
    cache's window starts past 0; a StaticCache's q_offset is a device
    tensor and its keys its whole capacity)."""
    if _masks.user_spec(kwargs.get("config")) is not None:
        mm.why = STEP_SPEC
        return mm
    spec = _masks.spec_of_mask_function(mask_function) if mask_function is not None else None
    if not 1 <= q_length <= MAX_NEW_ROWS:
        return _chunk(mm, q_length, kv_length, q_offset, kv_offset, spec, attention_mask)
    if spec == "causal":
        window = 0
    elif spec is not None and spec.startswith("causal_window:"):
        window = int(spec[14:])
    else:
        mm.why = STEP_MASK % (spec or "a mask stof has no spec for")
        return mm
    if not isinstance(kv_offset, int):
        mm.why = DECODING
        return mm
    pad = attention_mask
    if pad is not None:
        if pad.shape[-1] < kv_offset + kv_length:
            pad = torch.nn.functional.pad(pad, (0, kv_offset + kv_length - pad.shape[-1]))
        pad = pad[:, kv_offset:kv_offset + kv_length]
    device = kwargs.get("device")
    if device is None:
        device = pad.device if pad is not None else getattr(q_offset, "device", None)
    # The keys in use, the new rows last: the step's positions from the window's start.
    used = q_offset + q_length - kv_offset
    mm.lens, mm.why = _masks.lengths_of_step(pad, used, kv_length, batch, device)
    if mm.why is None:
        mm.spec, mm.step = spec, window
    return mm


def _chunk(mm, q_length, kv_length, q_offset, kv_offset, spec, attention_mask):
    """The ModelMask of more new rows than a decoding step takes, against a
    cache: a StaticCache's prefill (its keys the whole capacity), or a
    chunk of a chunked prefill. stof.attention runs it over the keys in use,
    the new rows last (causal aligns them bottom-right). The offsets are
    read on the host: one synchronisation a forward, not a step's."""
    q0, k0 = int(q_offset), int(kv_offset)
    used = q0 + q_length - k0
    if spec != "causal" and not (spec or "").startswith("causal_window:"):
        mm.why = STEP_MASK % (spec or "a mask stof has no spec for")
    elif k0 != 0 or used > kv_length:
        mm.why = CHUNK % (q_length, "past its first keys (a sliding cache)")
    elif attention_mask is not None and (attention_mask.dim() != 2
                                        or not bool(attention_mask[:, :used].all())):
        mm.why = CHUNK % (q_length, "with padding")
    else:
        mm.spec, mm.keys = spec, used
    return mm


def _run_step(module, q, k, v, mm, scaling, kwargs):
    """A decoding step through stof.decode: (out [B, S, H, D], None), or None
    where the tensors are not those the hook's mask was made for."""
    if q.shape[2] != mm.lq or k.shape[2] != mm.lk:
        return None
    orders = [_order(t) for t in (q, k, v)]
    if orders[1] == orders[2] == "blhd" and orders[0] != "bhld":
        layout = "blhd"
    else:
        layout = "bhld"
    if layout == "bhld":
        q, k, v = (t if o == "bhld" else t.contiguous() for t, o in zip((q, k, v), orders))
    elif orders[0] != "blhd":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    lens = mm.lens_on(q.device)
    if layout == "blhd":
        out = stof_decode(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), lens,
                          window=mm.step, softcap=kwargs.get("softcap"), scale=scaling,
                          layout="blhd")
        return out, None
    out = stof_decode(q, k, v, lens, window=mm.step, softcap=kwargs.get("softcap"),
                      scale=scaling, layout="bhld")
    return out.transpose(1, 2), None


@functools.lru_cache(maxsize=16)
def _dense4d(spec, lq, lk, device):
    return _masks.dense_of_spec(spec, lq, lk, device)[None, None]


def _why_not(module, q, k, v, dropout, kwargs):
    """Why stof cannot run this call, or None. (Called on every layer's
    call: each shape is read once, the cheap tests first.)"""
    if kwargs and not UNSUPPORTED.keys().isdisjoint(kwargs):
        for name, what in UNSUPPORTED.items():
            if kwargs.get(name) is not None:
                return what
    qs, ks, vs = q.shape, k.shape, v.shape
    if ks[1] < 1 or qs[1] % ks[1] or vs[1] != ks[1]:
        return "%d query heads on %d KV heads (not a divisor)" % (qs[1], ks[1])
    cap = kwargs.get("softcap")
    if cap is not None and not (isinstance(cap, (int, float)) and cap >= 0):
        return "softcap %r (stof takes a number >= 0)" % (cap,)
    if qs[-1] not in HEAD_DIMS or vs[-1] != qs[-1]:
        return "head_dim %d: stof takes %s" % (qs[-1], ", ".join(map(str, HEAD_DIMS)))
    if dropout and getattr(module, "training", False):
        return "attention dropout in training mode"
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        return ("gradients wanted (stof has no backward; run under torch.no_grad() or "
                "torch.inference_mode())")
    if not q.is_cuda:
        return "tensors on %s: stof runs on CUDA devices" % q.device.type
    if q.dtype not in (torch.float16, torch.bfloat16):
        return "%s tensors: stof runs float16 and bfloat16" % str(q.dtype)[6:]
    return None


def mask_for(module, attention_mask, lq, lk, kwargs, config=None):
    """(spec or Mask, lens, why) for a call: from the hook's ModelMask, a
    4-D tensor, or the module's own pattern where no mask came."""
    if isinstance(attention_mask, ModelMask):
        return attention_mask.spec, attention_mask.lens, attention_mask.why
    user = _masks.user_spec(config if config is not None else getattr(module, "config", None))
    if user is not None:
        return user, None, None
    if attention_mask is None:
        if lq != lk and _is_causal(module, kwargs):
            return None, None, DECODING
        return _masks.spec_of_module(module, kwargs), None, None
    if attention_mask.dim() == 2:
        return None, None, "a 2-D mask the mask interface did not see (transformers < 4.53?)"
    m, why = _masks.mask_of_4d(attention_mask)
    return m, None, why


def _is_causal(module, kwargs):
    c = kwargs.get("is_causal")
    return getattr(module, "is_causal", False) if c is None else c


def _fallback(why, module, q, k, v, attention_mask, dropout, scaling, kwargs):
    say_once(why)
    if isinstance(attention_mask, ModelMask):
        attention_mask = attention_mask.sdpa_mask(q.device)
    else:
        user = _masks.user_spec(getattr(module, "config", None))
        if user is not None:
            attention_mask = _dense4d(user, q.shape[2], k.shape[2], q.device)
    return sdpa_attention_forward(module, q, k, v, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)


def _order(t):
    """t's memory order: "bhld" (contiguous), "blhd" (dims 1 and 2 stored
    the other way round, densely), else None. From the strides, as
    is_contiguous reads them (a dimension of size 1 takes any stride): a
    transposed view to test would cost more than the rest of the call."""
    if t.is_contiguous():
        return "bhld"
    (b, h, n, d), (sb, sh, sn, sd) = t.shape, t.stride()
    want = 1
    for size, stride in ((d, sd), (h, sh), (n, sn), (b, sb)):
        if size != 1 and stride != want:
            return None
        want *= size
    return "blhd"


def _same_order(q, k, v):
    """q, k, v as stof can read them, copying only what must be: those not
    in q's memory order where they differ (RoPE'd q and k come contiguous
    while v stays a view). Three views of one packed QKV projection
    (GPT-2's) go as they are."""
    qs = q.stride()
    if qs == k.stride() == v.stride() and q.shape == k.shape == v.shape:
        return q, k, v  # one memory order (the usual case: one projection's views)
    orders = (_order(q), _order(k), _order(v))
    if orders[0] == orders[1] == orders[2]:
        return q, k, v
    want = orders[0] or "bhld"

    def to(t, o):
        if o == want:
            return t
        if want == "bhld":
            return t.contiguous()
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return tuple(to(t, o) for t, o in zip((q, k, v), orders))


def _run(q, k, v, spec, lens, scaling, softcap=None):
    try:
        return stof_attention(q, k, v, mask=spec, seq_lens=lens, scale=scaling, layout="bhld",
                              softcap=softcap)
    except L.InvalidArgumentError as e:
        if "memory order" not in str(e) and "packed QKV" not in str(e):
            raise
    # Strides stof cannot read (views of some other projection): a copy.
    q, k, v = (t.contiguous() for t in (q, k, v))
    return stof_attention(q, k, v, mask=spec, seq_lens=lens, scale=scaling, layout="bhld",
                          softcap=softcap)


def _run_packed(q, k, v, spec, packed, scaling, softcap):
    """Packed sequences through stof's varlen form: [B, H, L, D] views as
    [B * L, H, D] tokens (BLHD in memory, as the model hands them over;
    copied where not), cu_seqlens from the hook. Returns [B, L, H, D]."""
    b, h, n, d = q.shape

    def tokens(t):
        t = t.transpose(1, 2)
        return (t if t.is_contiguous() else t.contiguous()).reshape(b * n, t.shape[2], d)
    cu, longest = packed
    out = stof_attention(tokens(q), tokens(k), tokens(v), mask=spec, cu_seqlens_q=cu,
                         cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
                         scale=scaling, softcap=softcap)
    return out.reshape(b, n, h, d)


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface for "stof": (attn_output
    [B, L, H, D], None)."""
    why = _why_not(module, query, key, value, dropout, kwargs)
    spec = lens = None
    if why is None and isinstance(attention_mask, ModelMask) and attention_mask.step is not None:
        try:
            got = _run_step(module, query, key, value, attention_mask, scaling, kwargs)
        except L.UnsupportedError as e:
            return _fallback("stof cannot run it (%s)" % e, module, query, key, value,
                             attention_mask, dropout, scaling, kwargs)
        if got is not None:
            return got
        why = "a decoding step whose keys are not the cache its mask was made for"
    if why is None:
        spec, lens, why = mask_for(module, attention_mask, query.shape[2], key.shape[2], kwargs)
    if why is None and spec is None:
        why = "a mask stof has no form for"
    if why is not None:
        return _fallback(why, module, query, key, value, attention_mask, dropout, scaling, kwargs)
    if isinstance(attention_mask, ModelMask) and attention_mask.packed is not None:
        if attention_mask.packed[0].device != query.device:
            attention_mask.packed = (attention_mask.packed[0].to(query.device),
                                     attention_mask.packed[1])
        try:
            return _run_packed(query, key, value, spec, attention_mask.packed, scaling,
                               kwargs.get("softcap")), None
        except L.UnsupportedError as e:
            return _fallback("stof cannot run it (%s)" % e, module, query, key, value,
                             attention_mask, dropout, scaling, kwargs)
    if isinstance(attention_mask, ModelMask):
        lens = attention_mask.lens_on(query.device)
        if attention_mask.keys is not None:     # a prefill against a longer cache
            key = key[:, :, :attention_mask.keys]
            value = value[:, :, :attention_mask.keys]
    try:
        out = _run(*_same_order(query, key, value), spec, lens, scaling, kwargs.get("softcap"))
    except L.UnsupportedError as e:
        return _fallback("stof cannot run it (%s)" % e, module, query, key, value,
                         attention_mask, dropout, scaling, kwargs)
    return out.transpose(1, 2), None
