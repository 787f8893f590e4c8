"""The decoder-layer benchmark of issue 55, both sides in one process: run it as
bench/peers_layer.py --kind decoder (it shares that file's timing, clocks and
result files; --model, --seq, --mask, --peers, --settle and --tag as there).

Cases: layers.json's decoder models (llama3.2-1b, llama3-8b; bf16, B 1 at
L 4096 and 16384, B 4 at L 4096) under its masks, causal and
causal_window:4096, and under packed documents ("documents", which
layers.json cannot list: stof-warm reads a decoder's masks as causal or
causal_window:W). Documents: each row holds the same documents, lengths drawn
in [L/16, L/4] (numpy's default_rng seeded with L), the last cut to fit.

The layer: transformers' LlamaDecoderLayer from a LlamaConfig of the model's
sizes (RMSNorm eps 1e-5, RoPE theta 500000 and, for llama3.2-1b, Llama-3's
frequency scaling as that model has it); for causal_window:W a
MistralDecoderLayer of the same sizes with sliding_window W. Weights are
random (seed 0): projections normal with std 1/sqrt(in_features), q_proj and
k_proj twice the variance (scores of std about 2, so that attention is not
an average over everything and a wrong mask shows), RMSNorm weights
1 + 0.1 x normal; inputs standard normal. Contenders, on that one layer:
  stof          stof.DecoderLayer.from_hf(layer), positions 0..L-1; packed
                documents go as positions and cu_seqlens (n/a where stof
                refuses them)
  eager-sdpa    HF's layer, eager, attn_implementation "sdpa" as dispatched
  eager-flex    eager, "flex_attention" (HF compiles the flex kernel itself)
  c-sdpa        torch.compile(default mode) over the layer, sdpa as dispatched
  c-cudnn       the same, SDPA's cuDNN backend forced (sdpa_kernel inside the
                compiled function, so that tracing sees it)
  c-flash       the same, SDPA's flash backend forced
  c-flex        torch.compile, flex_attention (Triton)
  c-flex-fa4    the same with kernel_options BACKEND="FLASH" (FlashAttention-4
                through FlexAttention, where it loads)
  ma-sdpa, ma-cudnn, ma-flash, ma-flex, ma-flex-fa4   mode="max-autotune" (its
                CUDA graphs; masks, rotary tables and positions marked static)
Masks and rotary embeddings come from transformers' own functions
(create_causal_mask, create_sliding_window_causal_mask, the rotary module)
for each attention implementation, made once per case outside the timing,
as a model makes them once a forward for all its layers: under sdpa None for
causal (SDPA's is_causal) and a boolean 4-D mask for windows and documents,
under flex a BlockMask. Packed documents reach HF
as position_ids restarting at each document, from which it builds the
document mask. A peer whose backend refuses the case (flash with a mask) is
n/a with the reason.

Check: each contender's output for input set 0 against the same layer in
float32 (HF's sdpa with the mask materialized, on SDPA's memory-efficient
backend): relative L2 of the output, and of the layer's update (out - x)
for information. An output over 2e-2 is WRONG and not timed. Timing:
peers_layer's bench() for every contender, stof included (the GPU rests
--settle s, then the median of 21 batches of about 5 ms, inputs rotated
among as many sets as keep the L2 from holding them). Prints the table, each
peer's three busiest kernels (what each backend really ran), stof's plan,
first-call time and TF/s, a summary line per case, stof / best compiled
peer against issue 55's 1.2x gate; writes it under bench/results/
(layer-decoder-*) and $OUT.
"""
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import layer_common as C
from peers_mha import save_results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

DOCUMENTS = "documents"
PEERS = ["eager-sdpa", "eager-flex", "c-sdpa", "c-cudnn", "c-flash", "c-flex", "c-flex-fa4",
         "ma-sdpa", "ma-cudnn", "ma-flash", "ma-flex", "ma-flex-fa4"]
MODES = {"eager": "eager", "c": None, "ma": "max-autotune"}   # by the name's prefix
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
GATE = 1.2
L2_BYTES = 50 << 20     # an H100's L2; input sets rotate over twice that
EPS = 1e-5
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
ROPE = {"llama3.2-1b": LLAMA3_ROPE}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 500000.0}


def window_of(spec):
    """0 for causal and documents, W for causal_window:W."""
    return int(spec.split(":", 1)[1]) if spec.startswith("causal_window:") else 0


def doc_lengths(l):
    rng = np.random.default_rng(l)
    out = []
    while sum(out) < l:
        out.append(int(rng.integers(max(1, l // 16), max(2, l // 4) + 1)))
    out[-1] -= sum(out) - l
    return [n for n in out if n > 0]


def allowed_entries(lengths, window):
    """Score entries a causal (window: causal_window) mask allows over documents of lengths."""
    total = 0
    for n in lengths:
        w = min(window or n, n)
        total += w * (w + 1) // 2 + (n - w) * w
    return total


def flops(c, lengths):
    h, kv = c["hidden"], c["kv_heads"] * c["head_dim"]
    gemm = 2 * c["b"] * c["l"] * (h * (2 * h + 2 * kv) + 3 * h * c["ffn_hidden"])
    return gemm + 4 * c["b"] * c["heads"] * c["head_dim"] * allowed_entries(
        lengths, window_of(c["spec"]))


def hf_layer(c, dev):
    """(the float32 Hugging Face layer, its rotary module) for case c, random weights (seed 0)."""
    import transformers
    from transformers.models.llama import modeling_llama as llama
    from transformers.models.mistral import modeling_mistral as mistral
    kw = dict(hidden_size=c["hidden"], num_attention_heads=c["heads"],
              num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"],
              intermediate_size=c["ffn_hidden"], rms_norm_eps=EPS, num_hidden_layers=1,
              rope_parameters=dict(ROPE.get(c["model"], DEFAULT_ROPE)),
              max_position_embeddings=max(131072, c["l"]), attn_implementation="sdpa")
    window = window_of(c["spec"])
    if window:
        cfg = transformers.MistralConfig(sliding_window=window, **kw)
        cls, rot = mistral.MistralDecoderLayer, mistral.MistralRotaryEmbedding
    else:
        cfg = transformers.LlamaConfig(**kw)
        cls, rot = llama.LlamaDecoderLayer, llama.LlamaRotaryEmbedding
    torch.manual_seed(0)
    with torch.device(dev):
        layer, rotary = cls(cfg, 0).eval(), rot(cfg)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dim() == 2:
                gain = math.sqrt(2.0) if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                p.normal_(0.0, gain / math.sqrt(p.shape[1]))
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return layer, rotary


def positions(c, dev):
    """(position_ids [B, L], cu_seqlens over the B x L tokens or None, document lengths)."""
    b, l = c["b"], c["l"]
    if c["spec"] != DOCUMENTS:
        return torch.arange(l, device=dev)[None].expand(b, l).contiguous(), None, [l]
    lengths = doc_lengths(l)
    pos = torch.cat([torch.arange(n) for n in lengths]).to(dev)[None].expand(b, l).contiguous()
    starts = np.cumsum([0] + lengths)
    cu = np.concatenate([starts[:-1] + r * l for r in range(b)] + [[b * l]])
    return pos, torch.tensor(cu, dtype=torch.int32, device=dev), lengths


def hf_mask(layer, impl, x, pos, skip=True):
    """The mask transformers makes for the layer's config under impl (skip=False: materialized)."""
    from transformers import masking_utils as mu
    cfg = layer.self_attn.config
    cfg._attn_implementation = impl
    make = (mu.create_sliding_window_causal_mask if getattr(cfg, "sliding_window", None)
            else mu.create_causal_mask)
    return make(config=cfg, inputs_embeds=x, attention_mask=None, past_key_values=None,
                position_ids=pos, allow_is_causal_skip=skip)


def call_layer(layer, backend, extra):
    """f(x, mask, cos, sin, pos) -> the layer's output, SDPA's backend forced where one is named."""
    def f(x, mask, cos, sin, pos):
        if backend is None:
            out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin),
                        **extra)
        else:
            with sdpa_kernel(backend):
                out = layer(x, attention_mask=mask, position_ids=pos,
                            position_embeddings=(cos, sin), **extra)
        return out[0] if isinstance(out, tuple) else out
    return f


def peer_fn(layer, peer, inputs):
    """fn(x) for peer; inputs: {impl: (mask, cos, sin, pos)}."""
    prefix, attn = peer.split("-", 1)
    impl = "flex_attention" if attn.startswith("flex") else "sdpa"
    extra = {"kernel_options": {"BACKEND": "FLASH"}} if attn == "flex-fa4" else {}
    layer.self_attn.config._attn_implementation = impl
    f = call_layer(layer, BACKENDS.get(attn), extra)
    mask, cos, sin, pos = inputs[impl]
    if MODES[prefix] == "max-autotune":
        # they stay put: its CUDA graphs need not copy them per call (a window's mask is L x L)
        for t in (mask, cos, sin, pos):
            if isinstance(t, torch.Tensor):
                torch._dynamo.mark_static_address(t)
    if MODES[prefix] != "eager":
        f = torch.compile(f, dynamic=False, mode=MODES[prefix])
    return lambda x: f(x, mask, cos, sin, pos)


def busiest_kernels(fn, x, n=3):
    """The n kernels of one call of fn(x) with the most GPU time, as 'name share%' (a profile)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(x)
            torch.cuda.synchronize()
        got = [(e.device_time_total, e.key) for e in prof.key_averages()
               if e.device_type == DeviceType.CUDA and e.device_time_total > 0]
    except Exception as e:  # a profile is for information only
        return "no profile (%s)" % type(e).__name__
    total = sum(t for t, _ in got)
    if not total:
        return "no kernels seen (a CUDA graph's replay?)"
    return ", ".join("%s %.0f%%" % (k[:60], 100.0 * t / total) for t, k in sorted(got)[::-1][:n])


def why(e):
    """A failure in one line: the innermost cause (a compile error wraps the backend's refusal)."""
    while e.__cause__ is not None:
        e = e.__cause__
    if isinstance(e, torch.OutOfMemoryError):
        return "OOM"
    lines = [x.strip() for x in str(e).splitlines() if x.strip()] or [""]
    # dynamo's first line is generic; its explanation ends with what the op raised
    said = next((x.rsplit(": got ", 1)[1] for x in lines
                 if x.startswith("Explanation:") and ": got " in x), lines[0])
    return ("%s: %s" % (type(e).__name__, said))[:240]


def checked(res, name, out, ref, x):
    """Records name's errors; True where its output may be timed (correct, or no reference)."""
    if ref is None:
        return True
    res["err"][name] = C.rel_l2(out, ref)
    res["err_update"][name] = C.rel_l2(out.float() - x.float(), ref - x.float())
    if res["err"][name] > C.MISMATCH or not torch.isfinite(out).all():
        res["wrong"].append(name)
        return False
    return True


def stof_side(c, layer, xs, ref, pos, cu, res):
    import stof
    x = xs[0]
    try:
        dl = stof.DecoderLayer.from_hf(layer)
        kw = {} if cu is None else {"positions": pos, "cu_seqlens": cu}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = dl(x, **kw)
        torch.cuda.synchronize()
        res["stof_first_ms"] = (time.perf_counter() - t0) * 1e3
        res["stof_describe"] = dl.describe(c["b"], c["l"])
        if checked(res, "stof", out, ref, x):
            del out
            res["ms"]["stof"] = C.bench(lambda xi: dl(xi, **kw), xs, side="stof")
    except Exception as e:  # stof refusing the case (packed documents) is n/a, not a crash
        res["na"]["stof"] = why(e)
        res["stof_unsupported"] = isinstance(e, stof.UnsupportedError)
    dl = out = None
    torch.cuda.empty_cache()


def run_case(c, wanted, dev):
    dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
    b, l, h = c["b"], c["l"], c["hidden"]
    res = {"ms": {}, "err": {}, "err_update": {}, "na": {}, "wrong": [], "kernels": {}}
    layer32, rotary = hf_layer(c, dev)
    pos, cu, lengths = positions(c, dev)
    res["documents"] = lengths if cu is not None else None
    res["flops"] = flops(c, lengths)
    g = torch.Generator(device=dev).manual_seed(1)
    sets = max(2, min(4, math.ceil(2 * L2_BYTES / (b * l * h * 2))))
    xs = [torch.randn(b, l, h, device=dev, generator=g).to(dt) for _ in range(sets)]
    torch._dynamo.reset()
    with torch.no_grad():
        try:
            x32 = xs[0].float()
            cos, sin = rotary(x32, pos)
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                ref = call_layer(layer32, None, {})(x32, hf_mask(layer32, "sdpa", x32, pos, False),
                                                    cos, sin, pos)
        except torch.OutOfMemoryError:
            ref = None
            C.log("  the fp32 reference layer ran out of memory: no output check")
        x32 = cos = sin = None
        layer = copy.deepcopy(layer32).to(dt)
        del layer32
        torch.cuda.empty_cache()
        stof_side(c, layer, xs, ref, pos, cu, res)
        C.log("  stof        %s" % ("%.4f ms" % res["ms"]["stof"] if "stof" in res["ms"] else
                                    "WRONG (rel L2 %.1e)" % res["err"]["stof"]
                                    if "stof" in res["wrong"] else "n/a: " + res["na"]["stof"]))
        inputs = {}
        for impl in ("sdpa", "flex_attention"):
            cos, sin = rotary(xs[0], pos)
            inputs[impl] = (hf_mask(layer, impl, xs[0], pos), cos, sin, pos)
        for p in wanted:
            t0 = time.time()
            try:
                fn = peer_fn(layer, p, inputs)
                out = fn(xs[0])   # compiles, where it does
                if checked(res, p, out, ref, xs[0]):
                    del out
                    res["ms"][p] = C.bench(fn, xs)
                    res["kernels"][p] = busiest_kernels(fn, xs[0])
            except Exception as e:  # a peer that cannot run is n/a, never the end of the others
                res["na"][p] = why(e)
            fn = out = None
            got = ("%.4f ms" % res["ms"][p] if p in res["ms"] else
                   "WRONG (rel L2 %.1e)" % res["err"][p] if p in res["wrong"] else
                   "n/a: " + res["na"][p])
            C.log("  %-11s %s (%.0f s, compiling included)" % (p, got, time.time() - t0))
            torch._dynamo.reset()   # compiled graphs and CUDA-graph pools go before the next
            torch.cuda.empty_cache()
    del layer, ref, inputs, xs
    torch.cuda.empty_cache()
    return res


def best_compiled(res, wanted):
    got = [(res["ms"][p], p) for p in wanted if p in res["ms"] and not p.startswith("eager")]
    return min(got) if got else (None, None)


def cell(res, name):
    if name in res["ms"]:
        return "%10.3f" % res["ms"][name]
    return "%10s" % ("WRONG" if name in res["wrong"] else "n/a" if name in res["na"] else "-")


def report(rows, wanted, gpu):
    out = ["# stof vs PyTorch peers, decoder layer (Hugging Face's), %s, torch %s, %s"
           % (gpu, torch.__version__, time.strftime("%Y-%m-%d %H:%M")),
           "# ms: median per layer; best: the fastest compiled peer (c-, ma-) with a correct "
           "output; ratio = best / stof (>1: stof faster); TF/s: (GEMM + allowed-entry attention "
           "FLOPs) / stof's time; err: stof's rel L2 to the fp32 layer; WRONG: over %g, not timed"
           % C.MISMATCH,
           "%-38s %10s %6s " % ("case", "stof", "TF/s") + " ".join("%10s" % p for p in wanted)
           + " %6s %8s" % ("ratio", "err")]
    summary, met, checks = [], [0, 0], [0, 0]
    for c, res in rows:
        best, name = best_compiled(res, wanted)
        stof_ms = res["ms"].get("stof")
        ratio = best / stof_ms if best and stof_ms else None
        tf = "%6.0f" % (res["flops"] / stof_ms / 1e9) if stof_ms else "%6s" % "-"
        err = res["err"].get("stof")
        out.append("%-38s %s %s " % (c["name"], cell(res, "stof"), tf)
                   + " ".join(cell(res, p) for p in wanted)
                   + " %6s %8s" % ("%.2f" % ratio if ratio else "-",
                                   "%.1e" % err if err is not None else "-"))
        if "error" in res:
            out.append("    case error: " + res["error"])
            continue
        if res.get("documents"):
            out.append("    documents per row: %s" % " ".join(map(str, res["documents"])))
        if "stof_first_ms" in res:
            out.append("    stof: first call %.0f ms (its plan: a cache hit or a search)"
                       % res["stof_first_ms"])
        for line in res.get("stof_describe", "").splitlines():
            out.append("    | " + line)
        errs = ["%s %.1e (update %.1e)" % (p, res["err"][p], res["err_update"][p])
                for p in ["stof"] + wanted if p in res["err"]]
        out.append("    rel L2 to fp32: " + (", ".join(errs) if errs else "no reference"))
        for p, reason in res["na"].items():
            out.append("    n/a %s: %s" % (p, reason))
        for p, k in res["kernels"].items():
            out.append("    kernels %s: %s" % (p, k))
        eager = [(res["ms"][p], p) for p in wanted if p.startswith("eager") and p in res["ms"]]
        faster = min(eager) if eager and best and min(eager)[0] < best else None
        if ratio:
            met[ratio < GATE] += 1
            summary.append("summary: %s: stof %.3f ms / best compiled peer %.3f ms (%s) = %.2fx, "
                           "gate %.1fx %s%s" % (c["name"], stof_ms, best, name, ratio, GATE,
                                                "met" if ratio >= GATE else "not met",
                                                "; %s faster still: %.3f ms" % faster[::-1]
                                                if faster else ""))
        else:
            summary.append("summary: %s: n/a (%s)" % (c["name"], "stof: " + res["na"]["stof"]
                                                      if "stof" in res["na"] else
                                                      "stof WRONG" if "stof" in res["wrong"]
                                                      else "no compiled peer ran"))
        if err is not None:
            checks["stof" in res["wrong"]] += 1
    out.append("")
    out += summary
    out.append("summary: gate %.1fx over the best compiled peer: met in %d of %d cases timed"
               % (GATE, met[0], met[0] + met[1]))
    if C.CLOCKS:
        for side in ("stof", "peers"):
            out.append("summary: clocks: " + C.CLOCKS.summary(side))
    out.append("summary: check: stof %d ok, %d WRONG (rel L2 to the fp32 layer > %g)"
               % (checks[0], checks[1], C.MISMATCH))
    wrong = sorted({p for _, res in rows for p in res.get("wrong", []) if p != "stof"})
    if wrong:
        out.append("summary: peers WRONG somewhere: %s" % ", ".join(wrong))
    return "\n".join(out) + "\n"


def run(args, ap, wanted):
    """peers_layer.py --kind decoder: every decoder case, stof then the peers; 1 when stof failed
    (other than refusing a case) or was WRONG anywhere."""
    dev = "cuda"
    gpu = torch.cuda.get_device_name(0)
    cases = C.cases_of(json.load(open(args.workload)), args.model, args.seq, args.mask,
                       kind="decoder", extra_masks=(DOCUMENTS,))
    if not cases:
        if args.kind == "all":
            C.log("no decoder case matches the filters")
            return 0
        ap.error("no decoder case matches the filters")
    C.CLOCKS, C.SETTLE = C.Clocks(), args.settle
    rows = []
    for i, c in enumerate(cases):
        C.log("[%d/%d] %s" % (i + 1, len(cases), c["name"]))
        try:
            res = run_case(c, wanted, dev)
        except Exception as e:  # the case's set-up itself (its layer, its masks) failed
            res = {"ms": {}, "err": {}, "na": {"stof": why(e)}, "wrong": [], "kernels": {},
                   "error": why(e)}
            torch.cuda.empty_cache()
        rows.append((c, res))
    C.CLOCKS.stop()
    text = report(rows, wanted, gpu)
    print(text)
    save_results("layer-decoder", gpu, args.tag, text, [(c, {}, res) for c, res in rows])
    broken = [c["name"] for c, res in rows if "stof" in res["wrong"] or
              ("stof" in res["na"] and not res.get("stof_unsupported"))]
    if broken:
        C.log("stof failed or was WRONG on %d case(s): %s" % (len(broken), ", ".join(broken)))
    return 1 if broken else 0
