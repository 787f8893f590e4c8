"""stof.hf._optimize: stof.hf.optimize, whole layers run by stof.

BERT, RoBERTa, XLM-R and ELECTRA layers (post-LN) and ViT layers (pre-LN)
run as stof.EncoderLayer made from their weights; Llama, Mistral and Qwen2
decoder layers as stof.DecoderLayer, for forwards with no KV cache to fill
(a stof decoder layer keeps no K and V: generate() runs HF's layer code,
with the "stof" attention). Each keeps its module: its weights, state_dict,
output_hidden_states hooks and accelerate's device placement stay as they
were; only its forward changes. Every other layer keeps HF's code with the
"stof" attention.
"""
import logging

import torch

from .. import _lib as L
from .._decoder import DecoderLayer
from .._layer import EncoderLayer, _activation_of
from . import _backend, _masks

logger = logging.getLogger("stof.hf")

# Layer classes by name, and how to read their weights.
ENCODER_LAYERS = {"BertLayer": "bert", "RobertaLayer": "bert", "XLMRobertaLayer": "bert",
                  "ElectraLayer": "bert", "ViTLayer": "vit"}
DECODER_LAYERS = {"LlamaDecoderLayer": "decoder", "MistralDecoderLayer": "decoder",
                  "Qwen2DecoderLayer": "decoder"}


def vit_weights(layer):
    """(weights by stof.h's names, heads, the other settings) of a ViTLayer
    (transformers 5: attention.q_proj/k_proj/v_proj/o_proj, layernorm_before,
    layernorm_after, mlp.fc1/fc2); pre-LN. A projection without a bias
    (qkv_bias=False) gets zeros."""
    a = getattr(layer, "attention", None)
    if a is None or not hasattr(a, "q_proj") or not hasattr(layer, "mlp"):
        raise L.UnsupportedError("a ViTLayer without attention.q_proj and mlp (transformers < 5?)")

    def bias(m):
        return m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
    lin = (a.q_proj, a.k_proj, a.v_proj)
    n1, n2 = layer.layernorm_before, layer.layernorm_after
    if n1.eps != n2.eps:
        raise L.UnsupportedError("the two LayerNorms have different eps")
    w = {"qkv_w": torch.cat([m.weight for m in lin]), "qkv_b": torch.cat([bias(m) for m in lin]),
         "o_w": a.o_proj.weight, "o_b": bias(a.o_proj), "ln1_g": n1.weight, "ln1_b": n1.bias,
         "ff1_w": layer.mlp.fc1.weight, "ff1_b": layer.mlp.fc1.bias,
         "ff2_w": layer.mlp.fc2.weight, "ff2_b": layer.mlp.fc2.bias,
         "ln2_g": n2.weight, "ln2_b": n2.bias}
    return w, a.num_attention_heads, {"activation": _activation_of(layer.mlp.activation_fn),
                                      "eps": n1.eps, "norm": "pre_ln"}


def _config_of(layer):
    for m in layer.modules():
        c = getattr(m, "config", None)
        if c is not None:
            return c
    return None


def _stof_layer(layer, kind, tune):
    p = next(layer.parameters())
    if p.device.type != "cuda":
        raise L.UnsupportedError("its weights are on %s; stof runs on CUDA devices" % p.device)
    if p.dtype not in (torch.float16, torch.bfloat16):
        raise L.UnsupportedError("%s weights: stof runs float16 and bfloat16 (model.half())"
                                 % str(p.dtype)[6:])
    if kind == "decoder":
        return DecoderLayer.from_hf(layer, dtype=p.dtype, device=p.device, tune=tune)
    if kind == "vit":
        w, heads, found = vit_weights(layer)
        return EncoderLayer(w, heads, dtype=p.dtype, device=p.device, tune=tune, **found)
    if getattr(layer, "is_decoder", False) or hasattr(layer, "crossattention"):
        raise L.UnsupportedError("a decoder layer (causal, cross-attention)")
    return EncoderLayer.from_bert(layer, dtype=p.dtype, device=p.device, tune=tune)


def _hf_forward(layer):
    """(accelerate's hook wraps the forward, HF's forward): the one kept
    from an earlier swap where optimize ran before."""
    hooked = hasattr(layer, "_hf_hook") and hasattr(layer, "_old_forward")
    hf_forward = getattr(layer, "stof_hf_forward", None)
    if hf_forward is None:
        hf_forward = layer._old_forward if hooked else layer.forward
    return hooked, hf_forward


def _install(layer, forward, stof_layer, hooked, hf_forward):
    if hooked:
        layer._old_forward = forward
    else:
        layer.forward = forward
    layer.stof_layer, layer.stof_hf_forward = stof_layer, hf_forward


def _why_not(layer, stof_layer, x, args, kwargs):
    """Why a swapped layer cannot take this call, or None."""
    if layer.training:
        return "a swapped layer in training mode (stof has no backward)"
    if any(a is not None for a in args) or kwargs.get("encoder_hidden_states") is not None:
        return "cross-attention inputs"
    if kwargs.get("output_attentions"):
        return "output_attentions (a stof layer keeps no attention weights)"
    if torch.is_grad_enabled() and x.requires_grad:
        return "gradients wanted (run under torch.no_grad() or torch.inference_mode())"
    if x.dtype != stof_layer.dtype or x.device != stof_layer.device or x.dim() != 3:
        return "hidden states in %s on %s, not the layer's" % (x.dtype, x.device)
    return None


def _swap(layer, stof_layer):
    """The layer's forward runs stof_layer; HF's code runs the calls stof
    cannot (saying why once)."""
    hooked, hf_forward = _hf_forward(layer)
    config = _config_of(layer)

    def forward(hidden_states, attention_mask=None, *args, **kwargs):
        x = hidden_states
        why = _why_not(layer, stof_layer, x, args, kwargs)
        spec = lens = None
        if why is None:
            spec, lens, why = _backend.mask_for(layer, attention_mask, x.shape[1], x.shape[1], {},
                                                config)
            if why is None and spec is None:
                why = "a mask stof has no form for"
            elif why is None and getattr(attention_mask, "packed", None) is not None:
                why = PACKED % "an encoder"
        if why is not None:
            _backend.say_once(why, "HF's layer code")
            return hf_forward(hidden_states, attention_mask, *args, **kwargs)
        if isinstance(attention_mask, _backend.ModelMask):
            lens = attention_mask.lens_on(x.device)
        return stof_layer(x if x.is_contiguous() else x.contiguous(), seq_lens=lens, mask=spec)

    _install(layer, forward, stof_layer, hooked, hf_forward)


PACKED = "packed sequences (a stof %s layer takes no cu_seqlens yet)"
NO_CACHE = ("a KV cache to fill (a stof decoder layer keeps no K and V: pass use_cache=False "
            "for a forward without one; generate() runs HF's layer with the \"stof\" attention)")


def _swap_decoder(layer, stof_layer):
    """A decoder layer's forward runs stof_layer (a stof.DecoderLayer) for a
    whole causal forward, or one under the layer's own sliding window, with
    no padding and no KV cache to fill; HF's code runs the rest, saying why
    once. The rotary tables HF hands over are not read: the stof layer
    rotates by the positions (position_ids) with its config's RoPE."""
    hooked, hf_forward = _hf_forward(layer)
    config = _config_of(layer)
    want = "causal_window:%d" % stof_layer.window if stof_layer.window else "causal"

    def forward(hidden_states, attention_mask=None, *args, **kwargs):
        x = hidden_states
        why = _why_not(layer, stof_layer, x, args, kwargs)
        if why is None and kwargs.get("past_key_values") is not None:
            why = NO_CACHE
        if why is None:
            n = x.shape[1]
            spec, lens, why = _backend.mask_for(layer.self_attn, attention_mask, n, n, {}, config)
            if why is None and lens is not None:
                why = "padding (a stof decoder layer takes sequences of one length)"
            elif why is None and getattr(attention_mask, "packed", None) is not None:
                why = PACKED % "decoder"
            elif why is None and spec != want:
                why = "the mask %s (this stof decoder layer runs %s)" % (
                    getattr(spec, "spec", spec), want)
        if why is not None:
            _backend.say_once(why, "HF's layer code")
            return hf_forward(hidden_states, attention_mask, *args, **kwargs)
        return stof_layer(x if x.is_contiguous() else x.contiguous(),
                          positions=kwargs.get("position_ids"))

    _install(layer, forward, stof_layer, hooked, hf_forward)


def _models_of(model):
    from transformers import PreTrainedModel
    return [m for m in model.modules() if isinstance(m, PreTrainedModel)]


def optimize(model, mask=None, *, tune=None):
    """Runs a transformers model (or a module holding some, such as a
    SentenceTransformer) with stof, for inference: the "stof" attention
    everywhere, and BERT, RoBERTa, XLM-R, ELECTRA and ViT layers swapped
    whole for stof.EncoderLayer, Llama, Mistral and Qwen2 decoder layers for
    stof.DecoderLayer (float16 or bfloat16 weights on a CUDA device; a layer
    that cannot be swapped keeps HF's code and says why in
    model.stof_kept). A swapped decoder layer runs forwards with no KV
    cache to fill (use_cache=False); generate() keeps HF's layer code. mask: a spec or stof.Mask for this model in place of
    its own pattern (as stof.hf.mask(mask, model=model)); padding still
    applies. tune: as for stof.EncoderLayer.

    Refuses a model in training mode (stof has no backward). Call it under
    torch.no_grad() or torch.inference_mode(). The layers read the weights
    once, here: call optimize again after changing them.

    Returns the model, with model.stof_swapped (the names of the layers
    swapped) and model.stof_kept ([(name, why)]), and logs one line."""
    training = [n for n, m in model.named_modules() if m.training]
    if training:
        raise L.UnsupportedError(
            "stof.hf.optimize: the model is in training mode (%s%s); stof has no backward and "
            "runs inference only: call model.eval() first"
            % (training[0] or type(model).__name__, " and %d more" % (len(training) - 1)
               if len(training) > 1 else ""))
    models = _models_of(model)
    if not models:
        raise L.InvalidArgumentError("stof.hf.optimize: %s holds no transformers model"
                                     % type(model).__name__)
    for m in models:
        if m.config._attn_implementation != "stof":
            m.set_attn_implementation("stof")
    if mask is not None:
        _masks.mask(mask, model=model)
    swapped, kept = [], []
    for name, m in model.named_modules():
        kind = ENCODER_LAYERS.get(type(m).__name__) or DECODER_LAYERS.get(type(m).__name__)
        if kind is None:
            continue
        try:
            (_swap_decoder if kind == "decoder" else _swap)(m, _stof_layer(m, kind, tune))
            swapped.append(name)
        except L.Error as e:
            kept.append((name, str(e)))
    model.stof_swapped, model.stof_kept = swapped, kept
    logger.info("stof.hf.optimize: %d layers swapped for stof's, %d kept%s; the "
                "\"stof\" attention elsewhere", len(swapped), len(kept),
                " (%s: %s)" % kept[0] if kept else "")
    return model
