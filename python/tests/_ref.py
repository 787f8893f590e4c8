"""Torch references the suites compare stof with (imported only where torch
is): masked attention through torch's SDPA with a boolean mask, and the
encoder and decoder layers written from stof.h's formulas over stof's
weight names, so that checking them against a Hugging Face or torch layer
checks the mapping; Hugging Face decoder layers and their forward."""
import math

import torch
import torch.nn.functional as F


def rel_l2(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def tol(dtype):
    return 1.5e-2 if dtype == torch.bfloat16 else 5e-3


def bool_mask(mask, seq_lens=None, batch=1, device="cpu"):
    """[batch or 1, 1, Lq, Lk]: the mask's cells, and keys before seq_lens[b]."""
    m = mask.to_dense("torch", device=device)[None, None]
    if seq_lens is None:
        return m
    lens = torch.as_tensor(seq_lens, device=device).view(-1, 1, 1, 1)
    keys = torch.arange(mask.lk, device=device).view(1, 1, 1, -1)
    return m & (keys < lens)


def attention(q, k, v, allowed, scale=None):
    """Attention in float64 in BHLD with a boolean mask (None: every pair);
    rows with no allowed key give 0, as stof's do."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * (scale if scale else q.shape[-1] ** -0.5)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0) @ v


def layer(x, w, heads, activation, norm, eps, allowed=None):
    """stof.h's encoder layer in float32 from weights by stof's names."""
    w = {n: t.float() for n, t in w.items()}
    x = x.float()
    b, s, h = x.shape
    d = h // heads
    act = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
           "relu": F.relu}[activation]

    def ln(t, g, bias):
        return F.layer_norm(t, (h,), w[g], w[bias], eps)

    def attn(a):
        qkv = F.linear(a, w["qkv_w"], w["qkv_b"]).view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=allowed)
        o = torch.nan_to_num(o, nan=0.0).transpose(1, 2).reshape(b, s, h)
        return F.linear(o, w["o_w"], w["o_b"])

    def ffn(a):
        return F.linear(act(F.linear(a, w["ff1_w"], w["ff1_b"])), w["ff2_w"], w["ff2_b"])

    if norm == "post_ln":
        hid = ln(x + attn(x), "ln1_g", "ln1_b")
        return ln(hid + ffn(hid), "ln2_g", "ln2_b")
    hid = x + attn(ln(x, "ln1_g", "ln1_b"))
    return hid + ffn(ln(hid, "ln2_g", "ln2_b"))


def bert_layer(hidden=768, heads=12, ffn=3072, act="gelu", seed=0):
    """A Hugging Face BertLayer with random weights (LayerNorms too), eval mode."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer
    cfg = BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn,
                     hidden_act=act, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(seed)
    m = BertLayer(cfg).eval()
    with torch.no_grad():
        for ln in (m.attention.output.LayerNorm, m.output.LayerNorm):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.2, 0.2)
    return m


def run_bert(module, x, allowed=None):
    """The module's own forward, with an additive [B or 1, 1, S, S] mask."""
    add = None
    if allowed is not None:
        add = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        add.masked_fill_(~allowed, torch.finfo(x.dtype).min)
    out = module(x, attention_mask=add)
    return out[0] if isinstance(out, tuple) else out


def rope_inv_freq(head_dim, theta, scaling=None):
    """RoPE's inverse frequencies in float64, with Llama-3's scaling (Hugging
    Face's llama3 rope_scaling dict) where it is given."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def decoder(x, w, heads, kv_heads, eps, rope_theta, rope_scaling=None, window=0, positions=None):
    """stof.h's decoder layer in float64 from weights by stof's names: x
    [b, s, hidden]; positions None (0 .. s-1), an int offset or [b, s]."""
    w = {n: t.double() for n, t in w.items()}
    x = x.double()
    b, s, h = x.shape
    d = w["q_proj"].shape[0] // heads
    if positions is None or isinstance(positions, int):
        pos = torch.arange(s, dtype=torch.float64, device=x.device) + (positions or 0)
        pos = pos.expand(b, s)
    else:
        pos = positions.double().reshape(-1, s).expand(b, s)
    freqs = pos[..., None] * rope_inv_freq(d, rope_theta, rope_scaling).to(x.device)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]          # [b, 1, s, d]
    cos, sin = emb.cos(), emb.sin()

    def rms(t, g):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w[g]

    def rope(t):
        half = t.shape[-1] // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

    def proj(a, name, heads_):
        y = F.linear(a, w[name + "_proj"], w.get(name + "_bias"))
        return y.view(b, s, heads_, d).transpose(1, 2)

    a = rms(x, "input_layernorm")
    q, k, v = proj(a, "q", heads), proj(a, "k", kv_heads), proj(a, "v", kv_heads)
    q, k = rope(q), rope(k)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    i = torch.arange(s, device=x.device)
    allowed = i[None, :] <= i[:, None]
    if window:
        allowed &= i[:, None] - i[None, :] < window
    o = attention(q, k, v, allowed).transpose(1, 2).reshape(b, s, h)
    hid = x + F.linear(o, w["o_proj"])
    a = rms(hid, "post_attention_layernorm")
    return hid + F.linear(F.silu(F.linear(a, w["gate_proj"])) * F.linear(a, w["up_proj"]),
                          w["down_proj"])


def hf_decoder_layer(kind, hidden, heads, kv_heads, ffn, *, rope_theta=10000.0, rope_scaling=None,
                     window=None, eps=1e-6, seed=0):
    """A Hugging Face LlamaDecoderLayer, MistralDecoderLayer or
    Qwen2DecoderLayer (layer 0 of its config) with random weights, the
    RMSNorms' and Qwen2's biases too, eval mode, eager attention."""
    import importlib
    mod = importlib.import_module("transformers.models.%s.modeling_%s" % (kind, kind))
    cfg_cls = getattr(importlib.import_module("transformers"),
                      {"llama": "LlamaConfig", "mistral": "MistralConfig",
                       "qwen2": "Qwen2Config"}[kind])
    kw = dict(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
              intermediate_size=ffn, rms_norm_eps=eps, rope_theta=rope_theta,
              num_hidden_layers=1, hidden_act="silu", attention_dropout=0.0)
    if rope_scaling:
        kw["rope_scaling"] = dict(rope_scaling, rope_type="llama3")
    if kind == "mistral":
        kw["sliding_window"] = window
    if kind == "qwen2":
        kw.update(use_sliding_window=bool(window), sliding_window=window, max_window_layers=0)
    cfg = cfg_cls(**kw)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(seed)
    name = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[kind]
    m = getattr(mod, name + "DecoderLayer")(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for n in (m.input_layernorm, m.post_attention_layernorm):
            n.weight.uniform_(0.5, 1.5)
        for lin in (m.self_attn.q_proj, m.self_attn.k_proj, m.self_attn.v_proj):
            if lin.bias is not None:
                lin.bias.uniform_(-0.5, 0.5)
    # A plain attribute, not a submodule: .to(dtype) must leave its
    # inv_freq in float32, as the model keeps it.
    object.__setattr__(m, "_stof_rotary", getattr(mod, name + "RotaryEmbedding")(config=cfg))
    return m


def run_hf_decoder(m, x, positions=None, window=0):
    """The layer's own forward on x [b, s, hidden]: cos and sin from its
    model's rotary embedding at the positions (None: 0 .. s-1, an int
    offset, or [b, s]), an additive causal (window: sliding) mask."""
    b, s, _ = x.shape
    if positions is None or isinstance(positions, int):
        pos = (torch.arange(s, device=x.device) + (positions or 0)).expand(b, s)
    else:
        pos = positions.long().reshape(-1, s).expand(b, s)
    rot = m._stof_rotary.to(x.device)
    cos, sin = rot(x, pos)
    i = torch.arange(s, device=x.device)
    allowed = i[None, :] <= i[:, None]
    if window:
        allowed &= i[:, None] - i[None, :] < window
    add = torch.zeros(1, 1, s, s, dtype=x.dtype, device=x.device)
    add.masked_fill_(~allowed, torch.finfo(x.dtype).min)
    out = m(x, attention_mask=add, position_ids=pos, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out
