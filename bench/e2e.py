#!/usr/bin/env python3
"""The end-to-end benchmark of issue 56: whole transformers models, forward to
forward, every contender in one process on the same inputs. Models come from
configs with random weights; nothing is fetched.

Encoder models and masks (float16, batch 8; the default --models):
  bert-base  12 layers, hidden 768, 12 heads; L 512 and 2048;
             longformer window:256+global:64, bigbird window:192+global:64+random:3:64:1
  vit-base   12 layers, patch 16; image 224 (197 tokens) and 384 (577 tokens);
             local windows window:64+global:1 and window:128+global:1 (the CLS token global)
Decoder models (bfloat16, shaped as their namesakes; --models llama3.2-1b,mistral-7b):
  llama3.2-1b  LlamaForCausalLM, 16 layers, hidden 2048, 32/8 heads of 64, FFN 8192,
               vocab 128256, Llama-3 RoPE scaling; causal
  mistral-7b   MistralForCausalLM, 32 layers, hidden 4096, 32/8 heads of 128, FFN 14336,
               vocab 32000; its config's sliding window 4096 ("window")
  each also under packed documents ("documents": position_ids restarting at each
  document, lengths as bench/peers_decoder.py draws them; Mistral keeps its window).
  Prefill rows: batch 1 at L 8192 and 16384 (--lengths), the whole forward with
  use_cache=False, logits checked. --layers N builds them N layers deep (the output
  says how deep). Generate rows: generate() of --new-tokens (256) greedy tokens after
  a 4096-token prompt at batch 1 and 8 (--gen-batches), sdpa and the "stof"
  attention: ms per new token = (time for N - time for 1) / (N - 1), medians of
  --gen-reps; how many leading tokens stof's run shares with sdpa's.
Contenders:
  sdpa         HF's sdpa; encoders: the mask given as a 4-D boolean attention_mask
  flex         HF's flex_attention; encoders: the mask given as a BlockMask (made once
               per case); decoders: the model's own mask (a BlockMask it makes)
  c-sdpa, c-flex  torch.compile(model) over each
  stof-attn    attn_implementation="stof" (encoders: under stof.hf.mask(spec, model=...))
  c-stof-attn  torch.compile(model) over it
  stof-opt     stof.hf.optimize(model[, mask=spec]): whole layers as stof.EncoderLayer
               where it swaps them (not compiled: its layers are calls torch.compile
               cannot look into); decoder layers as far as optimize swaps them (the
               planning line counts them), the "stof" attention elsewhere
Timing: triton's do_bench on the whole forward under torch.inference_mode()
(L2 flushed between repeats, median), as bench/peers_mha.py's bench() takes
its first figure; its CUDA-graph figure is left out, since a forward whose
mask code reads values back cannot be captured, and every contender gets
the same host-inclusive time. Encoder rows then time the contenders within
1.5x of the fastest in --rounds (3) interleaved rounds, each keeping its
median, in two groups: HF's eager sdpa and flex with stof-attn, and the
rest (bench/rounds.py: a contender timed right after a compile or a plan
finds the card rested); decoder rows, whose contenders share one model, are
timed once each. Check: each contender's output
(last_hidden_state, or a decoder's logits) against the same weights in
float32 under sdpa with the same mask as a dense 4-D mask (relative L2;
over 5e-3 for float16, 2e-2 for bfloat16 is a MISMATCH, marked *; where
none of HF's own bfloat16 contenders is within 2e-2, as at L 16384 with
random weights, a decoder row's bound is 1.25x HF's best error, and a
"tolerance:" line says so). The model is cast with its rotary inv_freq
kept in float32, as from_pretrained(dtype=bfloat16) leaves it. The
first call of each stof contender (its plans: cache hits or searches) is
timed and printed per model. Prints a table, the issue's gates as "summary:"
lines, and writes both under bench/results/ (and $OUT). --quick: one size
and one mask per model (BERT L 512 longformer, ViT 224, decoders L 8192
under their own mask, 4 layers deep unless --layers, generate at batch 1),
fewer repeats.

    PYTHONPATH=python STOF_LIB=build/libstof.so python3 bench/e2e.py [--quick]
        [--models bert-base,vit-base,llama3.2-1b,mistral-7b] [--contenders sdpa,stof-attn,...]
        [--lengths 8192,16384] [--layers N] [--new-tokens 256] [--gen-batches 1,8]
        [--sizes 512,224] [--masks longformer,local,window] [--rounds 3] [--list-rows]

--list-rows prints the chosen rows, each with the arguments that run it alone
(tools/gpu-hf.sh e2e-rows runs them a process each, under a lent machine's
time budget).
"""
import argparse
import copy
import math
import os
import sys
import time
import traceback

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask

from peers_decoder import LLAMA3_ROPE, doc_lengths
from peers_mha import geomean, rel_l2, save_results, spec_fn
from rounds import interleave

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import stof  # noqa: E402
import stof.hf  # noqa: E402
import transformers  # noqa: E402

CONTENDERS = ["sdpa", "flex", "c-sdpa", "c-flex", "stof-attn", "c-stof-attn", "stof-opt"]
PEERS = ["sdpa", "flex", "c-sdpa", "c-flex"]
EAGER = ["sdpa", "flex", "stof-attn"]
MISMATCH = 5e-3
BATCH = 8
# (model, sizes, {mask name: spec for a size}); bert sizes are lengths, vit sizes image sides.
CASES = [("bert-base", [512, 2048], {"longformer": lambda n: "window:256+global:64",
                                     "bigbird": lambda n: "window:192+global:64+random:3:64:1"}),
         ("vit-base", [224, 384],
          {"local": lambda n: "window:%d+global:1" % (64 if n == 224 else 128)})]


def log(msg):
    sys.stderr.write("e2e: %s\n" % msg)
    sys.stderr.flush()


def build(name, size):
    """(model in float32 on the GPU, inputs, sequence length)."""
    torch.manual_seed(0)
    if name == "bert-base":
        cfg = transformers.BertConfig(max_position_embeddings=max(512, size))
        model = transformers.BertModel(cfg, add_pooling_layer=False)
        inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (BATCH, size), device="cuda")}
        n = size
    else:
        cfg = transformers.ViTConfig(image_size=size)
        model = transformers.ViTModel(cfg, add_pooling_layer=False)
        inputs = {"pixel_values": torch.randn(BATCH, 3, size, size, device="cuda")}
        n = (size // cfg.patch_size) ** 2 + 1
    return model.eval().cuda(), inputs, n


def half(inputs):
    return {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}


def make(contender, base, spec, n):
    """(forward(inputs) -> last_hidden_state, model) for a contender, on a
    float16 copy of base."""
    model = copy.deepcopy(base).half()
    kind = contender.replace("c-", "", 1)
    extra = {}
    if kind == "sdpa":
        model.set_attn_implementation("sdpa")
        extra["attention_mask"] = stof.Mask(spec, n).to_dense("torch", "cuda")[None, None]
    elif kind == "flex":
        model.set_attn_implementation("flex_attention")
        f = spec_fn(spec, n, n, "cuda")
        extra["attention_mask"] = create_block_mask(lambda b, h, q, k: f(q, k), None, None, n, n,
                                                    device="cuda")
    elif kind == "stof-attn":
        model.set_attn_implementation("stof")
        stof.hf.mask(spec, model=model)
    elif kind == "stof-opt":
        stof.hf.optimize(model, mask=spec)
    call = model
    if contender.startswith("c-"):
        torch._dynamo.reset()
        call = torch.compile(model, dynamic=False)

    def forward(inputs):
        return call(**inputs, **extra).last_hidden_state
    return forward, model


def bench_ms(fn, rep):
    return triton.testing.do_bench(fn, warmup=rep // 4, rep=rep, return_mode="median")


def measure(row, c, setup, inputs, want, rep, what, compare=rel_l2, keep=None):
    """Times contender c into row: setup() gives (forward(inputs) -> output, model); its first
    call (plans, compiles) is timed apart, its output compared with want, then do_bench's
    median. A contender that cannot run is a "fail" cell. keep: a list to which (c, the
    timed call) is added, for the rounds that follow (the model stays alive with it)."""
    try:
        fwd, model = setup()
        with torch.inference_mode():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fwd(inputs)
            torch.cuda.synchronize()
            row["first_ms"][c] = (time.perf_counter() - t0) * 1e3
            row["err"][c] = compare(out, want)
            out = None
            row["ms"][c] = bench_ms(lambda: fwd(inputs), rep)
        if c == "stof-opt":
            row["swapped"] = len(model.stof_swapped)
        if keep is not None:
            keep.append((c, lambda f=fwd: f(inputs)))
        fwd = model = None   # without keep, the copy and its compiled code go before the next
    except Exception as e:  # a contender that cannot run is a "fail" cell
        row["fail"][c] = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:120])
        log("%s %s failed:\n%s" % (what, c, traceback.format_exc()))
    torch.cuda.empty_cache()


def print_planning(row, what):
    for c in ("stof-attn", "stof-opt"):
        if c in row["first_ms"]:
            print("planning: %s: %s first call %.0f ms%s" % (
                what, c, row["first_ms"][c],
                " (%d layers swapped)" % row["swapped"] if c == "stof-opt" else ""))


def run_case(name, size, mask, spec, contenders, rep, rounds):
    base, inputs, n = build(name, size)
    with torch.inference_mode():
        allowed = stof.Mask(spec, n).to_dense("torch", "cuda")[None, None]
        want = base(**inputs, attention_mask=allowed).last_hidden_state.float()
    inputs = half(inputs)
    row = {"model": name, "size": size, "L": n, "mask": mask, "spec": spec, "ms": {}, "err": {},
           "first_ms": {}, "fail": {}, "how": {}}
    what = "%s %d %s" % (name, size, mask)
    kept = []
    for c in contenders:
        measure(row, c, lambda: make(c, base, spec, n), inputs, want, rep, what, keep=kept)
    # Interleaved rounds (bench/rounds.py): whoever is timed right after a compile or a
    # plan finds the card rested; each near contender keeps the median of its rounds. HF's
    # eager attentions and the "stof" one (the backend gate's three) are one group, the
    # compiled models and optimize another.
    with torch.inference_mode():
        for eager in (True, False):
            interleave(row["ms"], [(c, f) for c, f in kept if (c in EAGER) == eager],
                       row["how"], rounds, lambda f: bench_ms(f, rep), torch.cuda.synchronize)
    kept = None
    torch.cuda.empty_cache()
    print_planning(row, what)
    return row


# Decoder models, shaped as their namesakes (random weights): config class, config, the
# prefill rows' masks (the model's own pattern, and packed documents).
DECODERS = {
    "llama3.2-1b": ("LlamaForCausalLM", "LlamaConfig", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, rms_norm_eps=1e-5,
        rope_parameters=LLAMA3_ROPE, max_position_embeddings=131072, tie_word_embeddings=True),
        ["causal", "documents"]),
    "mistral-7b": ("MistralForCausalLM", "MistralConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=32000, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=4096,
        max_position_embeddings=32768), ["window", "documents"])}
DECODER_LENGTHS = [8192, 16384]
DECODER_MISMATCH = 2e-2   # bf16
PROMPT = 4096
DEV = "cuda"   # the decoder rows' device (a CPU smoke test of the code sets "cpu")
MODELS = [name for name, _, _ in CASES] + list(DECODERS)


def build_decoder(name, layers, dtype=torch.float32):
    """(model on the GPU in dtype, its config), random weights (seed 0), layers deep (None:
    the model's own depth)."""
    cls, cfg_cls, kw, _ = DECODERS[name]
    kw = dict(kw, attn_implementation="sdpa")
    if layers:
        kw["num_hidden_layers"] = layers
    cfg = getattr(transformers, cfg_cls)(**kw)
    torch.manual_seed(0)
    with torch.device(DEV):
        model = getattr(transformers, cls)(cfg)
    return to_dtype(model, dtype).eval(), cfg


def to_dtype(model, dtype):
    """model.to(dtype) with the rotary inv_freq buffers kept in float32, as a model loaded
    with from_pretrained(dtype=...) keeps them: cast to bfloat16 they would move the angles
    of positions in the thousands by radians (an 8-layer Mistral's bf16 logits at L 16384
    then land at rel L2 1.1 of fp32's)."""
    keep = [(m, n, b.clone()) for m in model.modules()
            for n, b in m.named_buffers(recurse=False) if n.endswith("inv_freq")]
    model.to(dtype)
    for m, n, b in keep:
        setattr(m, n, b)
    return model


def doc_positions(n):
    """position_ids [1, n] restarting at each packed document (peers_decoder's lengths), and
    each token's document."""
    lengths = doc_lengths(n)
    pos = torch.cat([torch.arange(k) for k in lengths])
    doc = torch.cat([torch.full((k,), i) for i, k in enumerate(lengths)])
    return pos[None].to(DEV), doc.to(DEV)


def decoder_mask(n, window, doc):
    """The 4-D boolean mask [1, 1, n, n] of the fp32 reference: causal, within window, within
    a document."""
    i = torch.arange(n, device=DEV)
    allowed = i[None, :] <= i[:, None]
    if window:
        allowed &= i[:, None] - i[None, :] < window
    if doc is not None:
        allowed &= doc[:, None] == doc[None, :]
    return allowed[None, None]


def rel_l2_rows(out, want, rows=2048):
    """rel_l2 over the last dimension's rows in chunks: a model's float32 logits at L 16384 are
    GBs, and one float copy of the difference would be as many again."""
    a, b = out.reshape(-1, out.shape[-1]), want.reshape(-1, want.shape[-1])
    num = den = 0.0
    for r in range(0, a.shape[0], rows):
        x, y = a[r:r + rows].float(), b[r:r + rows].float()
        num += (x - y).square().sum().item()
        den += y.square().sum().item()
    return math.sqrt(num / max(den, 1e-30))


def make_decoder(contender, model):
    """(forward(inputs) -> logits, model) for a contender on the bf16 model itself (stof-opt,
    which swaps layers for good, runs last)."""
    kind = contender.replace("c-", "", 1)
    if kind == "stof-opt":
        stof.hf.optimize(model)
    else:
        model.set_attn_implementation({"sdpa": "sdpa", "flex": "flex_attention",
                                       "stof-attn": "stof"}[kind])
    call = model
    torch._dynamo.reset()
    if contender.startswith("c-"):
        call = torch.compile(model, dynamic=False)

    def forward(inputs):
        return call(**inputs, use_cache=False).logits
    return forward, model


def run_decoder_case(name, n, mask, contenders, rep, layers):
    model, cfg = build_decoder(name, layers)
    pos, doc = doc_positions(n) if mask == "documents" else (
        torch.arange(n, device=DEV)[None], None)
    ids = torch.randint(0, cfg.vocab_size, (1, n), device=DEV)
    inputs = {"input_ids": ids, "position_ids": pos}
    with torch.inference_mode(), sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        # the config's sliding window holds under packed documents too
        want = model(**inputs, attention_mask=decoder_mask(n, getattr(cfg, "sliding_window", 0),
                                                           doc), use_cache=False).logits.float()
    to_dtype(model, torch.bfloat16)
    torch.cuda.empty_cache()
    row = {"model": name, "size": n, "L": n, "mask": mask, "layers": cfg.num_hidden_layers,
           "ms": {}, "err": {}, "first_ms": {}, "fail": {}}
    what = "%s %d %s" % (name, n, mask)
    for c in sorted(contenders, key=lambda c: c == "stof-opt"):
        measure(row, c, lambda: make_decoder(c, model), inputs, want, rep, what, rel_l2_rows)
    print_planning(row, what)
    model = want = None
    torch.cuda.empty_cache()
    return row


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, out


def run_generate(name, batch, new, reps, layers):
    """generate() of new tokens after a PROMPT-token prompt, greedy, under sdpa and under the
    "stof" attention: ms per new token = (time for new - time for 1) / (new - 1), medians of
    reps, the two contenders' reps interleaved (sdpa, stof, then stof, sdpa, ...); the first
    call of each (stof's plans) timed apart; stof's tokens against sdpa's."""
    model, cfg = build_decoder(name, layers, torch.bfloat16)
    prompt = torch.randint(0, cfg.vocab_size, (batch, PROMPT), device=DEV)
    ones = torch.ones_like(prompt)
    row = {"model": name, "batch": batch, "new": new, "layers": cfg.num_hidden_layers,
           "per_token": {}, "prefill": {}, "first_ms": {}, "fail": {}, "tokens": {}}

    def gen(k):
        return model.generate(input_ids=prompt, attention_mask=ones, max_new_tokens=k,
                              min_new_tokens=k, do_sample=False, pad_token_id=0)
    ones_ms, many_ms = {}, {}

    def run(c, what):
        try:
            model.set_attn_implementation(c)
            with torch.inference_mode():
                what()
        except Exception as e:  # a contender that cannot run is a "fail" cell
            row["fail"][c] = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:120])
            log("generate %s b%d %s failed:\n%s" % (name, batch, c, traceback.format_exc()))
        torch.cuda.empty_cache()

    def rep(c):
        ones_ms.setdefault(c, []).append(timed(lambda: gen(1))[0])
        t, out = timed(lambda: gen(new))
        many_ms.setdefault(c, []).append(t)
        row["tokens"][c] = out[:, PROMPT:]
    cs = ["sdpa", "stof"]
    for c in cs:     # the first call apart (stof's plans), then the reps interleaved
        run(c, lambda: row["first_ms"].__setitem__(c, timed(lambda: gen(2))[0]))
    for r in range(reps):
        for c in cs if r % 2 == 0 else cs[::-1]:
            if c not in row["fail"]:
                run(c, lambda: rep(c))
    for c in cs:
        if c not in row["fail"]:
            one, many = (sorted(ts)[len(ts) // 2] for ts in (ones_ms[c], many_ms[c]))
            row["prefill"][c] = one
            row["per_token"][c] = (many - one) / max(1, new - 1)
    if len(row["tokens"]) == 2:   # how many leading tokens stof's greedy run shares with sdpa's
        same = (row["tokens"]["sdpa"] == row["tokens"]["stof"]).int().cumprod(1).sum(1)
        row["same"] = same.float().mean().item()
    row.pop("tokens")
    if "stof" in row["first_ms"]:
        print("planning: generate %s b%d: stof first call (2 new tokens) %.0f ms, sdpa %.0f ms"
              % (name, batch, row["first_ms"]["stof"], row["first_ms"].get("sdpa", float("nan"))))
    model = None
    torch.cuda.empty_cache()
    return row


def best_peer(row, names, tol=MISMATCH):
    got = [(row["ms"][p], p) for p in names if p in row["ms"] and row["err"][p] <= tol]
    return min(got) if got else (None, None)


def row_cells(r, contenders, tol):
    """A row's contender cells and ratio columns; sets r["opt_x"] (optimize / best peer) and
    r["attn_x"] (the attention backend / HF's best attention)."""
    cells = []
    for c in contenders:
        if c in r["fail"]:
            cells.append(" %11s" % "fail")
        elif c in r["ms"]:
            cells.append(" %10.2f%s" % (r["ms"][c], "*" if r["err"][c] > tol else " "))
        else:
            cells.append(" %11s" % "-")
    best, _ = best_peer(r, PEERS, tol)
    hf, _ = best_peer(r, ["sdpa", "flex"], tol)
    opt = r["ms"].get("stof-opt") if r["err"].get("stof-opt", 1) <= tol else None
    att = r["ms"].get("stof-attn") if r["err"].get("stof-attn", 1) <= tol else None
    r["opt_x"] = best / opt if best and opt else None
    r["attn_x"] = hf / att if hf and att else None
    return "".join(cells) + " %9s %9s" % ("%.2fx" % r["opt_x"] if r["opt_x"] else "-",
                                          "%.2fx" % r["attn_x"] if r["attn_x"] else "-")


def row_notes(rows, contenders):
    lines = ["errors (rel L2 to fp32): " + "; ".join(
        "%s %d %s: %s" % (r["model"], r["size"], r["mask"], " ".join(
            "%s %.1e" % (c, r["err"][c]) for c in contenders if c in r["err"])) for r in rows)]
    for r in rows:
        for c, why in r["fail"].items():
            lines.append("fail: %s %d %s %s: %s" % (r["model"], r["size"], r["mask"], c, why))
    for r in rows:
        if r.get("how"):
            lines.append("rounds: %s %d %s: %s" % (r["model"], r["size"], r["mask"], ", ".join(
                "%s %s" % (c, r["how"][c]) for c in contenders if c in r["how"])))
    return lines


def gate(what, xs, need):
    # None: stof failed or mismatched on that row, which fails the gate.
    if not xs:
        return "summary: %s: not measured" % what
    ok = all(x is not None and x >= need for x in xs)
    return "summary: %s: %s (need %.2fx each) %s" % (
        what, " ".join("%.2fx" % x if x else "fail/mismatch" for x in xs), need,
        "PASS" if ok else "FAIL")


def within(rows, tol):
    """tol None: each row's own r["tol"] (a decoder row's, raised to HF's own error)."""
    cells = [(r, c) for r in rows for c in r["err"]]
    bad = ["%s %d %s %s" % (r["model"], r["size"], r["mask"], c) for r, c in cells
           if r["err"][c] > (r["tol"] if tol is None else tol)]
    return "summary: outputs within %s of fp32: %d of %d%s" % (
        "1.25x HF's own bfloat16 error" if tol is None else "%.0e" % tol,
        len(cells) - len(bad), len(cells), " (over: %s)" % ", ".join(bad) if bad else "")


def decoder_tol(r):
    """A decoder row's tolerance: DECODER_MISMATCH, or 1.25x HF's own bfloat16 error where
    none of HF's contenders is within it (a deep random-weight model at L 16384 drifts from
    float32 in any bfloat16 implementation)."""
    hf = [r["err"][p] for p in PEERS if p in r["err"]]
    return max(DECODER_MISMATCH, 1.25 * min(hf)) if hf else DECODER_MISMATCH


def report(rows, contenders, gpu):
    lines = ["bench/e2e.py on %s, torch %s, transformers %s, fp16, batch %d; ms per forward "
             "(median; rel L2 to fp32 over %.0e marked *)"
             % (gpu, torch.__version__, transformers.__version__, BATCH, MISMATCH)]
    head = "%-10s %5s %5s %-10s" % ("model", "size", "L", "mask") + "".join(
        " %11s" % c for c in contenders) + " %9s %9s" % ("opt/best", "attn/HF")
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append("%-10s %5d %5d %-10s" % (r["model"], r["size"], r["L"], r["mask"])
                     + row_cells(r, contenders, MISMATCH))
    lines.append("")
    lines += row_notes(rows, contenders)
    lines.append("")
    bert = [r for r in rows if r["model"] == "bert-base"]
    lines.append(gate("optimize vs best peer, BERT L 2048 sparse",
                      [r["opt_x"] for r in bert if r["L"] == 2048], 1.5))
    lines.append(gate("optimize vs best peer, BERT L 512 sparse",
                      [r["opt_x"] for r in bert if r["L"] == 512], 2.0))
    lines.append(gate("stof attention backend vs HF's best attention (sdpa, flex), every row "
                      "(all sparse)",
                      [r["attn_x"] for r in rows], 1.05))
    lines.append(within(rows, MISMATCH))
    lines.append("summary: geomean optimize / best peer %.2fx, attention backend / HF best "
                 "%.2fx" % (
        geomean([r["opt_x"] for r in rows if r["opt_x"]]),
        geomean([r["attn_x"] for r in rows if r["attn_x"]])))
    return "\n".join(lines) + "\n"


def decoder_report(rows, gens, contenders, gpu):
    depth = {r["model"]: r["layers"] for r in rows + gens}
    lines = ["bench/e2e.py decoder rows on %s, torch %s, transformers %s, bf16; %s" % (
        gpu, torch.__version__, transformers.__version__, ", ".join(
            "%s-shaped %d of its %d layers" % (m, d, DECODERS[m][2]["num_hidden_layers"])
            for m, d in depth.items()))]
    if rows:
        lines.append("prefill, batch 1, the whole forward with use_cache=False, ms (median; rel L2 "
                     "of the logits to fp32 over %.0e marked *)" % DECODER_MISMATCH)
        head = "%-12s %5s %-10s" % ("model", "L", "mask") + "".join(
            " %11s" % c for c in contenders) + " %9s %9s" % ("opt/best", "attn/HF")
        lines += [head, "-" * len(head)]
        for r in rows:
            r["tol"] = decoder_tol(r)
            lines.append("%-12s %5d %-10s" % (r["model"], r["L"], r["mask"])
                         + row_cells(r, contenders, r["tol"]))
        lines.append("")
        lines += row_notes(rows, contenders)
        lines += ["tolerance: %s %d %s: HF's own bfloat16 (best of %s) lands at %.1e of fp32, "
                  "over %.0e: a contender counts as matching within %.1e (1.25x that)" % (
                      r["model"], r["L"], r["mask"], "/".join(PEERS), min(
                          r["err"][p] for p in PEERS if p in r["err"]), DECODER_MISMATCH,
                      r["tol"]) for r in rows if r["tol"] > DECODER_MISMATCH]
    if gens:
        lines += ["", "generate(): greedy, after a %d-token prompt; ms per new token = (time for N "
                  "- time for 1) / (N - 1); prefill = the time for 1" % PROMPT]
        head = "%-12s %5s %5s %12s %12s %9s %12s %12s %10s" % (
            "model", "batch", "N", "sdpa/token", "stof/token", "sdpa/stof", "sdpa prefill",
            "stof prefill", "same toks")
        lines += [head, "-" * len(head)]
        for g in gens:
            pt, pf = g["per_token"], g["prefill"]
            g["gen_x"] = pt["sdpa"] / pt["stof"] if "sdpa" in pt and "stof" in pt else None
            lines.append("%-12s %5d %5d %12s %12s %9s %12s %12s %10s" % (
                g["model"], g["batch"], g["new"],
                *("%.3f" % pt[c] if c in pt else "fail" for c in ("sdpa", "stof")),
                "%.2fx" % g["gen_x"] if g["gen_x"] else "-",
                *("%.1f" % pf[c] if c in pf else "fail" for c in ("sdpa", "stof")),
                "%.1f" % g["same"] if "same" in g else "-"))
            for c, why in g["fail"].items():
                lines.append("fail: generate %s b%d %s: %s" % (g["model"], g["batch"], c, why))
    lines.append("")
    lines.append(gate("optimize vs best peer, mistral-7b-shaped L 16384 sliding window",
                      [r["opt_x"] for r in rows if r["model"] == "mistral-7b"
                       and r["L"] == 16384 and r["mask"] == "window"], 1.2))
    lines.append(gate("stof attention backend vs HF's best attention (sdpa, flex), every decoder "
                      "row", [r["attn_x"] for r in rows], 1.0))
    if rows:
        lines.append(within(rows, DECODER_MISMATCH))
        if any(r["tol"] > DECODER_MISMATCH for r in rows):
            lines.append(within(rows, None))
    if gens:
        lines.append("summary: generate, stof attention per token vs sdpa: %s" % " ".join(
            "%s b%d %s" % (g["model"], g["batch"], "%.2fx" % g["gen_x"] if g["gen_x"] else "fail")
            for g in gens))
    return "\n".join(lines) + "\n"


def row_lines(models, sizes, masks, lengths, batches):
    """"NAME|ARGS" for each row, ARGS running it alone: encoder rows (model, size, mask),
    decoder prefill rows (model, length, mask) and generate rows (model, batch)."""
    for name, own_sizes, own_masks in CASES:
        for size in (n for n in own_sizes if name in models and (not sizes or n in sizes)):
            for mask in (m for m in own_masks if not masks or m in masks):
                yield "%s/%d/%s|--models %s --sizes %d --masks %s" % (name, size, mask, name,
                                                                     size, mask)
    for name in (m for m in DECODERS if m in models):
        for n in lengths:
            for mask in (m for m in DECODERS[name][3] if not masks or m in masks):
                yield "%s/%d/%s|--models %s --lengths %d --masks %s --gen-batches=" % (
                    name, n, mask, name, n, mask)
        for b in batches:
            yield "%s/generate/b%d|--models %s --lengths= --gen-batches %d" % (name, b, name, b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="one size and one mask per model, fewer repeats; decoders 4 layers deep, "
                         "generate at batch 1 only")
    ap.add_argument("--models", default="bert-base,vit-base",
                    help="comma-separated, of %s (default: the encoders)" % ", ".join(MODELS))
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--lengths", default=",".join(map(str, DECODER_LENGTHS)),
                    help="decoder prefill lengths (default %(default)s)")
    ap.add_argument("--sizes", default="",
                    help="encoder sizes to run, of BERT's lengths and ViT's image sides "
                         "(default: all)")
    ap.add_argument("--masks", default="",
                    help="mask names to run, e.g. longformer,local,window (default: all)")
    ap.add_argument("--list-rows", action="store_true",
                    help="print each row of the chosen models (name, then the arguments that "
                         "run it alone) and exit; tools/gpu-hf.sh e2e-rows runs them a process "
                         "each")
    ap.add_argument("--rounds", type=int, default=3,
                    help="encoder rows: the contenders within 1.5x of the fastest are timed this "
                         "many times in interleaved rounds, each keeping its median (default "
                         "%(default)s; 1: once each, in turn)")
    ap.add_argument("--layers", type=int,
                    help="decoder models this many layers deep (default: their own depth)")
    ap.add_argument("--new-tokens", type=int, default=256,
                    help="generate()'s new tokens (default %(default)s)")
    ap.add_argument("--gen-batches", default="1,8",
                    help="generate()'s batches (default %(default)s; empty: no generate rows)")
    ap.add_argument("--gen-reps", type=int, default=3,
                    help="timed generate() calls of each length (default %(default)s)")
    a = ap.parse_args()
    contenders = [c for c in a.contenders.split(",") if c]
    for c in contenders:
        if c not in CONTENDERS:
            ap.error("unknown contender %r (of %s)" % (c, ", ".join(CONTENDERS)))
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error("unknown model %r (of %s)" % (m, ", ".join(MODELS)))
    try:
        lengths = [int(x) for x in a.lengths.split(",") if x]
        batches = [int(x) for x in a.gen_batches.split(",") if x]
        sizes = [int(x) for x in a.sizes.split(",") if x]
    except ValueError:
        ap.error("--lengths, --gen-batches and --sizes take comma-separated whole numbers")
    masks = [m for m in a.masks.split(",") if m]
    known = {m for _, _, ms in CASES for m in ms} | {m for d in DECODERS.values() for m in d[3]}
    for m in masks:
        if m not in known:
            ap.error("unknown mask %r (of %s)" % (m, ", ".join(sorted(known))))
    if a.new_tokens < 2 or a.gen_reps < 1 or a.rounds < 1 or (
            a.layers is not None and a.layers < 1):
        ap.error("--new-tokens takes 2 or more, --gen-reps, --rounds and --layers 1 or more")
    if a.list_rows:
        for line in row_lines(models, sizes, masks, lengths, batches):
            print(line)
        return 0
    if not torch.cuda.is_available():
        sys.exit("e2e: no CUDA device (torch %s sees none): the models run on a GPU"
                 % torch.__version__)
    rep = 40 if a.quick else 200
    gpu = torch.cuda.get_device_name()
    log("%s; stof %s at %s; cache %s" % (gpu, stof.version(), stof.library_path(),
                                         os.environ.get("STOF_CACHE", "(default)")))
    rows = []
    for name, own_sizes, own_masks in CASES:
        if name not in models:
            continue
        for size in own_sizes[:1] if a.quick else own_sizes:
            if sizes and size not in sizes:
                continue
            for mask, spec_of in list(own_masks.items())[:1] if a.quick else own_masks.items():
                if masks and mask not in masks:
                    continue
                log("%s %d %s" % (name, size, mask))
                rows.append(run_case(name, size, mask, spec_of(size), contenders, rep,
                                     a.rounds))
    drows, gens = [], []
    layers = a.layers or (4 if a.quick else None)
    for name in (m for m in DECODERS if m in models):
        for n in lengths[:1] if a.quick else lengths:
            for mask in DECODERS[name][3][:1] if a.quick else DECODERS[name][3]:
                if masks and mask not in masks:
                    continue
                log("%s %d %s" % (name, n, mask))
                drows.append(run_decoder_case(name, n, mask, contenders, rep, layers))
        for b in batches[:1] if a.quick else batches:
            log("generate %s b%d" % (name, b))
            gens.append(run_generate(name, b, a.new_tokens, a.gen_reps, layers))
    text = report(rows, contenders, gpu) if rows else ""
    if drows or gens:
        text += ("\n" if text else "") + decoder_report(drows, gens, contenders, gpu)
    print(text, end="")
    def cells(r, names):
        return {c: {"ms": r["ms"].get(c), "rel_l2": r["err"].get(c), "fail": r["fail"].get(c)}
                for c in names if c in contenders}
    saved = [("%s %d %s %s" % (r["model"], r["size"], r["mask"], r.get("spec", "")),
              cells(r, [c for c in CONTENDERS if "stof" in c]), cells(r, PEERS))
             for r in rows + drows]
    saved += [("generate %s b%d n%d" % (g["model"], g["batch"], g["new"]),
               {"stof": {"ms_per_token": g["per_token"].get("stof"),
                         "fail": g["fail"].get("stof")}},
               {"sdpa": {"ms_per_token": g["per_token"].get("sdpa"),
                         "fail": g["fail"].get("sdpa")}}) for g in gens]
    save_results("e2e", gpu, "-quick" if a.quick else "", text, saved)
    failed = any(r["fail"].get(c) for r in rows + drows for c in ("stof-attn", "stof-opt"))
    return 1 if failed or any("stof" in g["fail"] for g in gens) else 0


if __name__ == "__main__":
    sys.exit(main())
