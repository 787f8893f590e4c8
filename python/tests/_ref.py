"""Torch references the suites compare stof with (imported only where torch
is): masked attention through torch's SDPA with a boolean mask, and an
encoder layer written from stof.h's formulas over stof's weight names, so
that checking it against a Hugging Face or torch layer checks the mapping."""
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
