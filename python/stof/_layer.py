"""_layer: stof.EncoderLayer, a whole encoder layer over the layer API.

It owns the mapping of a torch module's weights onto stof_layer_weights (a
Hugging Face BertLayer, torch.nn.TransformerEncoderLayer, or a dict by
stof.h's names), the device copies of them the plans point at, and one plan
and workspace per (batch, seq, mask). Torch tensors only: the layer's
weights live in torch's memory.
"""
from ctypes import byref, c_size_t, c_void_p, create_string_buffer

from . import _arrays
from . import _lib as L
from . import _mask

ACTIVATIONS = {"gelu": 0, "gelu_tanh": 1, "relu": 2}
NORMS = {"post_ln": 0, "pre_ln": 1}


class _Plan(L.PlanHandle):
    __slots__ = ("ctx", "plan", "call", "run", "workspace", "mask", "batch", "seq", "_free")

    DESCRIBE = "layer_plan_describe"


class EncoderLayer:
    """One Transformer encoder layer run by stof: y = layer(x) for x of
    [batch, seq, hidden] on the weights' device, in their dtype.

    weights: a dict of torch tensors under stof.h's names (qkv_w [3*hidden,
    hidden], q rows then k then v, each head-major; qkv_b, o_w, o_b, ln1_g,
    ln1_b, ff1_w, ff1_b, ff2_w, ff2_b, ln2_g, ln2_b), in torch.nn.Linear's
    [out, in] layout. They are copied to dtype and device once, here.
    mask: the attention mask for every call, a spec (parsed per seq) or a
    stof.Mask; a call may name another."""

    def __init__(self, weights, heads, *, activation="gelu", norm="post_ln", eps=1e-5,
                 mask="dense", dtype=None, device=None, tune=None):
        import torch
        self._torch = torch
        missing = [n for n in L.LAYER_WEIGHT_NAMES if n not in weights]
        if missing:
            raise L.InvalidArgumentError("weights lack %s" % ", ".join(missing))
        if activation not in ACTIVATIONS:
            raise L.InvalidArgumentError("activation must be one of %s, got %r"
                                         % (sorted(ACTIVATIONS), activation))
        if norm not in NORMS:
            raise L.InvalidArgumentError("norm must be 'post_ln' or 'pre_ln', got %r" % (norm,))
        if tune not in L.TUNE:
            raise L.InvalidArgumentError("tune must be None, 'off', 'fast' or 'full'")
        self.weights, dtype, device = _arrays.place_weights(
            weights, L.LAYER_WEIGHT_NAMES, dtype, device, torch.float16)
        w = self.weights
        hidden = w["qkv_w"].shape[1]
        ffn = w["ff1_w"].shape[0]
        want = {"qkv_w": (3 * hidden, hidden), "qkv_b": (3 * hidden,), "o_w": (hidden, hidden),
                "o_b": (hidden,), "ln1_g": (hidden,), "ln1_b": (hidden,),
                "ff1_w": (ffn, hidden), "ff1_b": (ffn,), "ff2_w": (hidden, ffn),
                "ff2_b": (hidden,), "ln2_g": (hidden,), "ln2_b": (hidden,)}
        for n, shape in want.items():
            if tuple(w[n].shape) != shape:
                raise L.InvalidArgumentError("weights[%r] must be %s for hidden %d and FFN %d, "
                                             "got %s" % (n, list(shape), hidden, ffn,
                                                         list(w[n].shape)))
        if hidden % heads:
            raise L.InvalidArgumentError("hidden %d is not a multiple of heads %d"
                                         % (hidden, heads))
        self.hidden, self.heads, self.ffn_hidden = hidden, heads, ffn
        self.activation, self.norm, self.eps = activation, norm, float(eps)
        self.dtype, self.device, self.mask, self.tune = dtype, device, mask, tune
        self._w = L.LayerWeights(**{n: t.data_ptr() for n, t in w.items()})
        self._plans = {}

    # ---- from torch modules ---------------------------------------------------------------

    @classmethod
    def from_torch(cls, module, **kw):
        """From a Hugging Face BertLayer (or a layer shaped like it: RoBERTa,
        ELECTRA) or a torch.nn.TransformerEncoderLayer; kw as for the
        constructor (mask, dtype, device, tune, activation to override)."""
        if hasattr(module, "attention") and hasattr(module, "intermediate"):
            return cls.from_bert(module, **kw)
        if hasattr(module, "self_attn") and hasattr(module, "linear1"):
            return cls.from_transformer_encoder_layer(module, **kw)
        raise L.UnsupportedError("no mapping for %s: pass the weights by name"
                                 % type(module).__name__)

    @classmethod
    def from_bert(cls, layer, **kw):
        """Hugging Face's BertLayer: attention.self.query/key/value,
        attention.output.dense and LayerNorm, intermediate.dense,
        output.dense and LayerNorm; post-LN."""
        w, heads, found = bert_weights(layer)
        return cls(w, heads, **dict(found, **kw))

    @classmethod
    def from_transformer_encoder_layer(cls, layer, **kw):
        """torch.nn.TransformerEncoderLayer (x as [batch, seq, hidden] whatever
        its batch_first says): post-LN, or pre-LN with norm_first."""
        w, heads, found = transformer_encoder_layer_weights(layer)
        return cls(w, heads, **dict(found, **kw))

    # ---- running --------------------------------------------------------------------------

    def _plan(self, batch, seq, mask):
        key = (batch, seq, mask)
        p = self._plans.get(key)
        if p is not None:
            return p
        m = _mask.for_spec(mask, seq, seq) if isinstance(mask, str) else mask
        if not isinstance(m, _mask.Mask):
            raise L.InvalidArgumentError("mask must be a spec str or a stof.Mask")
        if m.shape != (seq, seq):
            raise L.InvalidArgumentError("the mask is %d x %d but the sequence is %d"
                                         % (m.lq, m.lk, seq))
        desc = L.LayerDesc(batch=batch, seq=seq, hidden=self.hidden, heads=self.heads,
                           ffn_hidden=self.ffn_hidden, activation=ACTIVATIONS[self.activation],
                           norm=NORMS[self.norm],
                           dtype=L.F16 if self.dtype == self._torch.float16 else L.BF16,
                           eps=self.eps, tune=L.TUNE[self.tune])
        ctx = L.Context.for_device(self.device.index)
        h, size = c_void_p(), c_size_t()
        with ctx.lock:
            ctx.check(ctx._lib.layer_plan_create(ctx.handle, byref(desc), m._handle,
                                                 byref(self._w), byref(h)))
        p = _Plan()
        p.ctx, p.plan, p.mask, p.batch, p.seq = ctx, h.value, m, batch, seq
        p._free = ctx._lib.layer_plan_free
        p.call, p.run = ctx._lib.launcher("layer_run")
        with ctx.lock:
            ctx.check(ctx._lib.layer_workspace_size(p.plan, byref(size)))
        # Kept with the plan, so its address (one of what a CUDA Graph of the
        # plan is keyed by) stays put from call to call.
        p.workspace = self._torch.empty(size.value, dtype=self._torch.uint8, device=self.device)
        self._plans[key] = p
        return p

    def __call__(self, x, seq_lens=None, mask=None, out=None):
        """out = layer(x), x [batch, seq, hidden] contiguous, on the caller's
        current stream. seq_lens: None or [batch] int32 valid lengths (padded
        rows come out finite but meaningless). out: a tensor like x to write
        into, not x itself."""
        torch = self._torch
        if not isinstance(x, torch.Tensor):
            raise L.InvalidArgumentError("x must be a torch tensor")
        if x.dim() != 3 or x.shape[2] != self.hidden:
            raise L.InvalidArgumentError("x must be [batch, seq, %d], got %s"
                                         % (self.hidden, list(x.shape)))
        if x.dtype != self.dtype or x.device != self.device:
            raise L.InvalidArgumentError("x must be %s on %s like the weights, got %s on %s"
                                         % (self.dtype, self.device, x.dtype, x.device))
        if not x.is_contiguous():
            raise L.InvalidArgumentError("x must be contiguous")
        b, s, _ = x.shape
        p = self._plan(b, s, self.mask if mask is None else mask)
        if out is None:
            out = torch.empty_like(x)
        elif (not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype
              or out.device != x.device or not out.is_contiguous()
              or out.data_ptr() == x.data_ptr()):
            raise L.InvalidArgumentError("out must be a contiguous tensor like x, not x itself")
        sp = None
        if seq_lens is not None:
            if not isinstance(seq_lens, torch.Tensor):
                seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=x.device)
            if (seq_lens.dtype != torch.int32 or seq_lens.device != x.device
                    or tuple(seq_lens.shape) != (b,) or not seq_lens.is_contiguous()):
                raise L.InvalidArgumentError("seq_lens must be a contiguous int32 [%d] tensor "
                                             "on %s" % (b, x.device))
            sp = seq_lens.data_ptr()
        stream = torch.cuda.current_stream(self.device).cuda_stream
        ctx = p.ctx
        with ctx.lock:
            ctx.check(p.call(p.run, p.plan, x.data_ptr(), out.data_ptr(), sp,
                             p.workspace.data_ptr(), stream))
        return out

    def describe(self, batch, seq, mask=None):
        """stof_layer_plan_describe for this shape (planning it if need be)."""
        p = self._plan(batch, seq, self.mask if mask is None else mask)
        buf = create_string_buffer(4096)
        with p.ctx.lock:
            p.ctx.check(p.ctx._lib.layer_plan_describe(p.plan, buf, 4096))
        return buf.value.decode()

    def __repr__(self):
        return ("EncoderLayer(hidden=%d, heads=%d, ffn=%d, %s, %s, %s, mask=%r)"
                % (self.hidden, self.heads, self.ffn_hidden, self.activation, self.norm,
                   self.dtype, self.mask))


def _activation_of(fn):
    """stof's name for a torch or Hugging Face activation (module or function)."""
    import torch.nn.functional as F
    if fn is F.relu:
        return "relu"
    if fn is F.gelu:
        return "gelu"
    name = type(fn).__name__ if not callable(fn) or hasattr(fn, "forward") else fn.__name__
    approx = getattr(fn, "approximate", None)
    if approx == "tanh" or name in ("NewGELUActivation", "PytorchGELUTanh", "GELUTanh",
                                    "gelu_new", "gelu_pytorch_tanh"):
        return "gelu_tanh"
    if name in ("GELU", "GELUActivation", "gelu"):
        # HF's GELUActivation holds torch's exact (erf) gelu.
        inner = getattr(fn, "act", None)
        if inner is not None and inner is not F.gelu and getattr(inner, "__name__", "") != "gelu":
            raise L.UnsupportedError("activation %s wraps %r" % (name, inner))
        return "gelu"
    if name in ("ReLU", "relu"):
        return "relu"
    raise L.UnsupportedError("activation %s has no stof equivalent (gelu, gelu_tanh, relu); "
                             "pass activation=" % name)


def bert_weights(layer):
    """(weights by stof.h's names, heads, the other settings) of a BertLayer."""
    import torch
    if getattr(layer, "is_decoder", False) or hasattr(layer, "crossattention"):
        raise L.UnsupportedError("a decoder layer (cross-attention) is not an encoder layer")
    sa, ao = layer.attention.self, layer.attention.output
    lin = (sa.query, sa.key, sa.value)
    w = {"qkv_w": torch.cat([m.weight for m in lin]), "qkv_b": torch.cat([m.bias for m in lin]),
         "o_w": ao.dense.weight, "o_b": ao.dense.bias,
         "ln1_g": ao.LayerNorm.weight, "ln1_b": ao.LayerNorm.bias,
         "ff1_w": layer.intermediate.dense.weight, "ff1_b": layer.intermediate.dense.bias,
         "ff2_w": layer.output.dense.weight, "ff2_b": layer.output.dense.bias,
         "ln2_g": layer.output.LayerNorm.weight, "ln2_b": layer.output.LayerNorm.bias}
    if layer.output.LayerNorm.eps != ao.LayerNorm.eps:
        raise L.UnsupportedError("the two LayerNorms have different eps")
    heads = getattr(sa, "num_attention_heads", None) or sa.config.num_attention_heads
    return w, heads, {"activation": _activation_of(layer.intermediate.intermediate_act_fn),
                      "eps": ao.LayerNorm.eps, "norm": "post_ln"}


def transformer_encoder_layer_weights(layer):
    """The same for torch.nn.TransformerEncoderLayer."""
    at = layer.self_attn
    if at.in_proj_weight is None:
        raise L.UnsupportedError("self_attn with separate q, k, v weights (kdim/vdim) "
                                 "is not supported")
    w = {"qkv_w": at.in_proj_weight, "qkv_b": at.in_proj_bias,
         "o_w": at.out_proj.weight, "o_b": at.out_proj.bias,
         "ln1_g": layer.norm1.weight, "ln1_b": layer.norm1.bias,
         "ff1_w": layer.linear1.weight, "ff1_b": layer.linear1.bias,
         "ff2_w": layer.linear2.weight, "ff2_b": layer.linear2.bias,
         "ln2_g": layer.norm2.weight, "ln2_b": layer.norm2.bias}
    if any(v is None for v in w.values()):
        raise L.UnsupportedError("a layer without biases is not supported")
    if layer.norm1.eps != layer.norm2.eps:
        raise L.UnsupportedError("the two LayerNorms have different eps")
    return w, at.num_heads, {"activation": _activation_of(layer.activation),
                             "eps": layer.norm1.eps,
                             "norm": "pre_ln" if layer.norm_first else "post_ln"}
