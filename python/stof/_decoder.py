"""_decoder: stof.DecoderLayer, the Llama/Mistral/Qwen2 block over the decoder API.

It owns the mapping of a Hugging Face LlamaDecoderLayer, MistralDecoderLayer
or Qwen2DecoderLayer (its config's sizes, RMSNorm epsilon, RoPE settings,
sliding window and q/k/v biases) onto stof_decoder_desc and
stof_decoder_weights, the fp16/bf16 device copies of the weights the plans
point at, and one plan, workspace and positions buffer per (batch, seq).
The settings are read and checked without torch; the weights are torch
tensors.
"""
import math
from ctypes import byref, c_size_t, c_void_p, create_string_buffer

from . import _arrays
from . import _lib as L

# The Hugging Face layers from_hf maps: one block, the same names.
HF_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
# Hugging Face's llama3 rope_scaling members, as stof_decoder_desc's fields.
LLAMA3_SCALING = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
                  "high_freq_factor": "rope_high_freq_factor",
                  "original_max_position_embeddings": "rope_original_max_positions"}


class _Plan(L.PlanHandle):
    __slots__ = ("ctx", "plan", "workspace", "positions", "batch", "seq", "_free")

    DESCRIBE = "decoder_plan_describe"


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise L.InvalidArgumentError("%s must be a positive int, got %r" % (name, v))
    return v


def _finite(name, v, least, strict):
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = float("nan")
    if not math.isfinite(f) or f < least or (strict and f == least):
        raise L.InvalidArgumentError("%s must be a finite number %s %g, got %r"
                                     % (name, ">" if strict else ">=", least, v))
    return f


def rope_fields(rope_theta, rope_scaling):
    """stof_decoder_desc's RoPE fields from a theta and None or Hugging
    Face's llama3 rope_scaling dict (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings; "rope_type" or
    "type" "llama3" if named)."""
    f = {"rope_theta": _finite("rope_theta", rope_theta, 0.0, True)}
    if rope_scaling is None:
        return f
    if not isinstance(rope_scaling, dict):
        raise L.InvalidArgumentError("rope_scaling must be None or a dict of Llama-3's "
                                     "frequency scaling, got %r" % (rope_scaling,))
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "llama3"))
    if kind != "llama3":
        raise L.UnsupportedError("RoPE scaling %r is not supported (default and llama3 are)"
                                 % (kind,))
    missing = [k for k in LLAMA3_SCALING if rope_scaling.get(k) is None]
    if missing:
        raise L.InvalidArgumentError("rope_scaling lacks %s" % ", ".join(missing))
    f["rope_factor"] = _finite("rope_scaling['factor']", rope_scaling["factor"], 1.0, False)
    low = _finite("rope_scaling['low_freq_factor']", rope_scaling["low_freq_factor"], 0.0, True)
    high = _finite("rope_scaling['high_freq_factor']", rope_scaling["high_freq_factor"], low,
                   True)
    f["rope_low_freq_factor"], f["rope_high_freq_factor"] = low, high
    orig = rope_scaling["original_max_position_embeddings"]
    if isinstance(orig, float) and orig.is_integer():
        orig = int(orig)
    f["rope_original_max_positions"] = _positive_int(
        "rope_scaling['original_max_position_embeddings']", orig)
    return f


class DecoderLayer:
    """One pre-norm decoder block (Llama, Mistral, Qwen2) run by stof:
    out = layer(hidden_states) for hidden_states [batch, seq, hidden] on the
    weights' device, in the layer's dtype, causal (or causal_window:window).

    weights: a dict of torch tensors under stof_decoder_weights' names, in
    Hugging Face's [out, in] layouts: q_proj [heads * head_dim, hidden],
    k_proj and v_proj [kv_heads * head_dim, hidden], o_proj, gate_proj and
    up_proj [ffn, hidden], down_proj [hidden, ffn], input_layernorm and
    post_attention_layernorm [hidden]; with q_bias, k_bias and v_bias
    (Qwen2) when all three are there. They are copied to dtype and device
    once, here (the C plans keep their own stacked copies of the
    projections as well). dtype: torch.float16 or torch.bfloat16; None
    keeps the weights' where it is one of those, else bfloat16.
    rope_scaling: None or Hugging Face's llama3 rope_scaling dict.
    window: 0 (causal) or Mistral's sliding window W (causal_window:W, a
    query sees itself and the W - 1 keys before it)."""

    def __init__(self, weights, heads, kv_heads=None, *, eps=1e-6, rope_theta=10000.0,
                 rope_scaling=None, window=0, dtype=None, device=None, tune=None):
        # The settings first: they need no torch.
        heads = _positive_int("heads", heads)
        kv_heads = heads if kv_heads is None else _positive_int("kv_heads", kv_heads)
        if heads % kv_heads:
            raise L.InvalidArgumentError("kv_heads %d must divide heads %d" % (kv_heads, heads))
        eps = _finite("eps", eps, 0.0, False)
        rope = rope_fields(rope_theta, rope_scaling)
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise L.InvalidArgumentError("window must be an int >= 0 (0: causal), got %r"
                                         % (window,))
        if tune not in L.TUNE:
            raise L.InvalidArgumentError("tune must be None, 'off', 'fast' or 'full'")
        if not isinstance(weights, dict):
            raise L.InvalidArgumentError("weights must be a dict of tensors by "
                                         "stof_decoder_weights' names")
        biases = [n for n in L.DECODER_BIAS_NAMES if weights.get(n) is not None]
        if biases and len(biases) != 3:
            raise L.InvalidArgumentError("q_bias, k_bias and v_bias come together; got only %s"
                                         % ", ".join(biases))
        names = [n for n in L.DECODER_WEIGHT_NAMES
                 if n not in L.DECODER_BIAS_NAMES or biases]
        missing = [n for n in names if weights.get(n) is None]
        if missing:
            raise L.InvalidArgumentError("weights lack %s" % ", ".join(missing))

        import torch
        self._torch = torch
        self.weights, dtype, device = _arrays.place_weights(
            weights, list(names), dtype, device, torch.bfloat16)
        w = self.weights
        hidden = w["input_layernorm"].shape[0] if w["input_layernorm"].dim() == 1 else -1
        if w["q_proj"].dim() != 2 or w["q_proj"].shape[0] % heads:
            raise L.InvalidArgumentError("weights['q_proj'] must be [heads * head_dim, hidden] "
                                         "for heads %d, got %s" % (heads, list(w["q_proj"].shape)))
        head_dim = w["q_proj"].shape[0] // heads
        if heads * head_dim != hidden:
            raise L.InvalidArgumentError("hidden %d must be heads %d x head_dim %d (q_proj is %s)"
                                         % (hidden, heads, head_dim, list(w["q_proj"].shape)))
        ffn = w["gate_proj"].shape[0]
        kv = kv_heads * head_dim
        want = {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
                "q_bias": (hidden,), "k_bias": (kv,), "v_bias": (kv,),
                "o_proj": (hidden, hidden), "gate_proj": (ffn, hidden), "up_proj": (ffn, hidden),
                "down_proj": (hidden, ffn), "input_layernorm": (hidden,),
                "post_attention_layernorm": (hidden,)}
        for n in names:
            if tuple(w[n].shape) != want[n]:
                raise L.InvalidArgumentError(
                    "weights[%r] must be %s for hidden %d, %d KV heads of %d and FFN %d, got %s"
                    % (n, list(want[n]), hidden, kv_heads, head_dim, ffn, list(w[n].shape)))
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.ffn_hidden, self.eps, self.window, self.qkv_bias = ffn, eps, window, bool(biases)
        self.rope_theta, self.rope_scaling = rope["rope_theta"], rope_scaling
        self.dtype, self.device, self.tune = dtype, device, tune
        self._rope = rope
        self._w = L.DecoderWeights(**{n: t.data_ptr() for n, t in w.items()})
        self._plans = {}

    # ---- from Hugging Face ----------------------------------------------------------------

    @classmethod
    def from_hf(cls, layer, dtype=None, **kw):
        """From a Hugging Face LlamaDecoderLayer, MistralDecoderLayer or
        Qwen2DecoderLayer: its weights and its config's sizes, rms_norm_eps,
        RoPE (rope_theta or rope_parameters, Llama-3 scaling), sliding window
        where the layer uses one, and Qwen2's q/k/v biases. kw as for the
        constructor (device, tune, or a setting to override)."""
        found = hf_settings(layer)
        heads = found.pop("heads")
        return cls(hf_weights(layer), heads, **dict(found, dtype=dtype, **kw))

    # ---- running --------------------------------------------------------------------------

    def _desc(self, batch, seq):
        torch = self._torch
        return L.DecoderDesc(batch=batch, seq=seq, hidden=self.hidden, heads=self.heads,
                             kv_heads=self.kv_heads, head_dim=self.head_dim,
                             ffn_hidden=self.ffn_hidden,
                             dtype=L.F16 if self.dtype == torch.float16 else L.BF16,
                             eps=self.eps, window=self.window, qkv_bias=int(self.qkv_bias),
                             tune=L.TUNE[self.tune], **self._rope)

    def _plan(self, batch, seq):
        key = (batch, seq)
        p = self._plans.get(key)
        if p is not None:
            return p
        desc = self._desc(batch, seq)
        ctx = L.Context.for_device(self.device.index)
        lib = ctx._lib
        h, size = c_void_p(), c_size_t()
        with ctx.lock:
            ctx.check(lib.need("decoder_plan_create")(ctx.handle, byref(desc), byref(self._w),
                                                      byref(h)))
        p = _Plan()
        p.ctx, p.plan, p.batch, p.seq = ctx, h.value, batch, seq
        p._free = lib.decoder_plan_free
        with ctx.lock:
            ctx.check(lib.decoder_workspace_size(p.plan, byref(size)))
        # Kept with the plan, so their addresses (what a CUDA Graph of the
        # plan is keyed by) stay put from call to call.
        p.workspace = self._torch.empty(size.value, dtype=self._torch.uint8, device=self.device)
        p.positions = None
        self._plans[key] = p
        return p

    def _positions(self, p, positions, b, s):
        """(device pointer or None, offset) for stof_decoder_run."""
        torch = self._torch
        if positions is None:
            return None, 0
        if isinstance(positions, int) and not isinstance(positions, bool):
            if not 0 <= positions < 2 ** 31 - s:
                raise L.InvalidArgumentError("positions, an offset, must be >= 0 and leave "
                                             "offset + seq below 2^31, got %d" % positions)
            return None, positions
        if not isinstance(positions, torch.Tensor):
            raise L.InvalidArgumentError("positions must be None, an int offset or an integer "
                                         "tensor, got %s" % type(positions).__name__)
        if positions.dtype not in (torch.int32, torch.int64) or positions.device != self.device:
            raise L.InvalidArgumentError("positions must be an int32 or int64 tensor on %s, got "
                                         "%s on %s" % (self.device, positions.dtype,
                                                       positions.device))
        shape = tuple(positions.shape)
        if shape not in ((b, s), (1, s), (s,), (b * s,)):
            raise L.InvalidArgumentError("positions must be [%d, %d], [1, %d], [%d] or [%d] "
                                         "(one per row), got %s" % (b, s, s, s, b * s,
                                                                    list(shape)))
        if p.positions is None:
            p.positions = torch.empty(b, s, dtype=torch.int32, device=self.device)
        # Into the plan's own buffer: one address for its graphs, int32 as
        # stof.h takes them, on the current stream like the launch.
        p.positions.copy_(positions.reshape(-1, s).expand(b, s))
        return p.positions.data_ptr(), 0

    def __call__(self, hidden_states, positions=None, cu_seqlens=None, out=None):
        """out = layer(hidden_states), [batch, seq, hidden] contiguous, on the
        caller's current stream. positions: None (token t of each sequence
        at position t), an int offset (at offset + t), or an integer tensor
        of positions per row ([batch, seq], [1, seq] or [seq] for every
        sequence alike, or [batch * seq]). cu_seqlens: packed sequences,
        which the C layer does not take yet: refused. out: a tensor like
        hidden_states to write into, not hidden_states itself."""
        torch = self._torch
        x = hidden_states
        if cu_seqlens is not None:
            raise L.UnsupportedError(
                "cu_seqlens (packed variable-length sequences) is not supported: "
                "stof_decoder_run takes [batch, seq] with every sequence seq long; pad them "
                "to one length, or run them one by one")
        if not isinstance(x, torch.Tensor):
            raise L.InvalidArgumentError("hidden_states must be a torch tensor")
        if x.dim() != 3 or x.shape[2] != self.hidden:
            raise L.InvalidArgumentError("hidden_states must be [batch, seq, %d], got %s"
                                         % (self.hidden, list(x.shape)))
        if x.dtype != self.dtype or x.device != self.device:
            raise L.InvalidArgumentError("hidden_states must be %s on %s like the weights, got "
                                         "%s on %s" % (self.dtype, self.device, x.dtype,
                                                       x.device))
        if not x.is_contiguous():
            raise L.InvalidArgumentError("hidden_states must be contiguous")
        if out is not None and (not isinstance(out, torch.Tensor) or out.shape != x.shape
                                or out.dtype != x.dtype or out.device != x.device
                                or not out.is_contiguous() or out.data_ptr() == x.data_ptr()):
            raise L.InvalidArgumentError("out must be a contiguous tensor like hidden_states, "
                                         "not hidden_states itself")
        b, s, _ = x.shape
        p = self._plan(b, s)
        pos, offset = self._positions(p, positions, b, s)
        if out is None:
            out = torch.empty_like(x)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        ctx = p.ctx
        with ctx.lock:
            ctx.check(ctx._lib.decoder_run(p.plan, x.data_ptr(), out.data_ptr(), pos, offset,
                                           p.workspace.data_ptr(), stream))
        return out

    def describe(self, batch, seq):
        """stof_decoder_plan_describe for this shape (planning it if need be)."""
        p = self._plan(batch, seq)
        buf = create_string_buffer(8192)
        with p.ctx.lock:
            p.ctx.check(p.ctx._lib.decoder_plan_describe(p.plan, buf, 8192))
        return buf.value.decode()

    def __repr__(self):
        return ("DecoderLayer(hidden=%d, heads=%d, kv_heads=%d, head_dim=%d, ffn=%d, %s, "
                "rope_theta=%g%s%s%s)"
                % (self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn_hidden,
                   self.dtype, self.rope_theta, ", llama3 scaling" if self.rope_scaling else "",
                   ", window=%d" % self.window if self.window else "",
                   ", qkv_bias" if self.qkv_bias else ""))


# ---- Hugging Face's layers --------------------------------------------------------------


def _rope_of(config, layer_type):
    """(theta, None or the llama3 scaling dict) from a config's
    rope_parameters (transformers 5; per layer type where it is split so)
    or its rope_theta and rope_scaling (before)."""
    rp = getattr(config, "rope_parameters", None)
    if rp is not None:
        rp = dict(rp)
        if "rope_type" not in rp and "type" not in rp and layer_type in rp:
            rp = dict(rp[layer_type])
        theta = rp.get("rope_theta", getattr(config, "rope_theta", None))
    else:
        rp = dict(getattr(config, "rope_scaling", None) or {})
        theta = getattr(config, "rope_theta", None)
    if theta is None:
        raise L.InvalidArgumentError("the config names no rope_theta")
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise L.UnsupportedError("RoPE type %r is not supported (default and llama3 are)"
                                 % (kind,))
    return theta, {k: rp.get(k) for k in LLAMA3_SCALING}


def _window_of(attn, config, layer_idx):
    """The layer's sliding window, 0 for none: the attention's own
    sliding_window where it keeps one (Qwen2 now), else the config's layer
    types, else Qwen2's use_sliding_window and max_window_layers (before
    layer types), else the config's sliding_window (Mistral)."""
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window or 0
    types = getattr(config, "layer_types", None)
    if types is not None and layer_idx is not None:
        return (getattr(config, "sliding_window", None) or 0
                if types[layer_idx] == "sliding_attention" else 0)
    if hasattr(config, "use_sliding_window"):
        if not config.use_sliding_window:
            return 0
        first = getattr(config, "max_window_layers", 0) or 0
        if layer_idx is not None and layer_idx < first:
            return 0
    return getattr(config, "sliding_window", None) or 0


def _bias(linear):
    return getattr(linear, "bias", None)


def hf_settings(layer):
    """The constructor's settings of a Hugging Face decoder layer (heads,
    kv_heads, eps, rope_theta, rope_scaling, window), checked for what stof
    does not run: another layer kind, another activation or RoPE type,
    partial rotary, a scaling other than head_dim^-0.5, biases beyond
    Qwen2's q/k/v. Reads attributes only (no torch)."""
    name = type(layer).__name__
    if name not in HF_LAYERS:
        raise L.UnsupportedError("no decoder mapping for %s (from_hf maps %s)"
                                 % (name, ", ".join(HF_LAYERS)))
    attn, mlp = layer.self_attn, layer.mlp
    config = getattr(attn, "config", None) or getattr(mlp, "config", None)
    if config is None:
        raise L.UnsupportedError("%s keeps no config (self_attn.config)" % name)
    layer_idx = getattr(attn, "layer_idx", None)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = (getattr(attn, "head_dim", None) or getattr(config, "head_dim", None)
                or config.hidden_size // heads)
    if heads * head_dim != config.hidden_size:
        raise L.UnsupportedError("hidden_size %d is not num_attention_heads %d x head_dim %d"
                                 % (config.hidden_size, heads, head_dim))
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise L.UnsupportedError("hidden_act %r: the MLP runs SwiGLU (silu) only" % (act,))
    if (getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise L.UnsupportedError("partial_rotary_factor %r: RoPE rotates whole heads"
                                 % config.partial_rotary_factor)
    scaling = getattr(attn, "scaling", None)
    if scaling is not None and abs(scaling * math.sqrt(head_dim) - 1.0) > 1e-6:
        raise L.UnsupportedError("attention scaling %r is not head_dim^-0.5" % scaling)
    for sub, names in ((attn, ("o_proj",)), (mlp, ("gate_proj", "up_proj", "down_proj"))):
        for n in names:
            if _bias(getattr(sub, n)) is not None:
                raise L.UnsupportedError("%s has a bias: only q/k/v_proj may (Qwen2)" % n)
    has = [_bias(getattr(attn, n)) is not None for n in ("q_proj", "k_proj", "v_proj")]
    if any(has) and not all(has):
        raise L.UnsupportedError("q/k/v_proj biases come together or not at all")
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    eps = [getattr(n, "variance_epsilon", getattr(n, "eps", None)) for n in norms]
    if eps[0] is None or eps[0] != eps[1]:
        raise L.UnsupportedError("the two RMSNorms' eps differ or are unknown (%r, %r)"
                                 % tuple(eps))
    layer_type = getattr(layer, "attention_type", None)
    if layer_type is None and layer_idx is not None:
        types = getattr(config, "layer_types", None)
        layer_type = types[layer_idx] if types is not None else None
    theta, scaling_dict = _rope_of(config, layer_type or "full_attention")
    return {"heads": heads, "kv_heads": kv_heads, "eps": eps[0], "rope_theta": theta,
            "rope_scaling": scaling_dict, "window": int(_window_of(attn, config, layer_idx))}


def hf_weights(layer):
    """The layer's tensors by stof_decoder_weights' names (the biases
    where q_proj has one)."""
    attn, mlp = layer.self_attn, layer.mlp
    w = {n: getattr(attn, n).weight for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    w.update({n: getattr(mlp, n).weight for n in ("gate_proj", "up_proj", "down_proj")})
    w["input_layernorm"] = layer.input_layernorm.weight
    w["post_attention_layernorm"] = layer.post_attention_layernorm.weight
    if _bias(attn.q_proj) is not None:
        w.update(q_bias=attn.q_proj.bias, k_bias=attn.k_proj.bias, v_bias=attn.v_proj.bias)
    return w
