#!/usr/bin/env python3
"""The encoder-layer benchmark, both sides in one command (--kind decoder: the
decoder layers instead, bench/peers_decoder.py; --kind all: both).

For each case of bench/workloads/layers.json, runs it through build/bench_layer
(stof; one process takes the cases one at a time) and then times PyTorch peers
of the same layer (src/stof.h's POST_LN and PRE_LN orders) on identical weights
and inputs:
  eager    eager, attention written out (matmul, additive mask, softmax, matmul)
  sdpa     eager, F.scaled_dot_product_attention with an additive float mask
  c-sdpa   torch.compile, SDPA with the same mask
  c-cudnn  torch.compile, SDPA with the same mask, its cuDNN backend forced
  c-flex   torch.compile, FlexAttention (block mask built once per case)
  c-flex-fa4   the same with kernel_options BACKEND="FLASH": FlashAttention-4's
           block-sparse kernels (../shared/peers/FA4.md says how to install it)
  cg-flex, cg-flex-fa4   torch.compile(mode="reduce-overhead"): CUDA graphs
  ma-flex, ma-flex-fa4   torch.compile(mode="max-autotune"): Inductor tunes its
           GEMMs and fusions by timing, and replays CUDA graphs
The best peer of a case is the fastest of those that ran (a peer that cannot
run, e.g. FA4 not installed or cuDNN refusing the mask, is a "fail" cell and
a summary line).
Both sides are timed the same way: the GPU rests --settle seconds (default 1),
then CUDA events around batches of runs of about 5 ms (host launch costs
included, as an application pays them), inputs rotated between as many sets
as bench_layer chose (2 to 4, so that the L2 does not hold them), the median
of 21 batches (bench_layer in C, bench() here). The rest puts every timing at
the same start: a layer at the board's power limit slows within tens of ms
and more the longer the GPU has been busy, so cases timed back to back would
each start hotter than the last. stof's output
for input set 0 is checked against an fp32 eager layer (relative L2; above
2e-2 is a mismatch), and so is every peer's. Prints one table with the ratio
best peer / stof, stof's plan per case, and "summary:" lines; writes it under
bench/results/ (and $OUT when set). Meanwhile nvidia-smi samples the SM clock, the
board's power and its throttle reasons every 50 ms; two summary lines say what each
side's timed runs saw (a layer drawing the power limit runs at a lower clock the
longer it is timed). Exits 1 when stof failed or mismatched
on any case (peers that fail are only reported).

Inputs (bench/bench_layer.c's head comment says the same): tensor T drawn
with seed S holds offset + scale * u_i, u_i being bench_mha's number i for S
(peers_mha.random_tensor, uniform in [-1, 1)), computed in float32 and then
rounded to the dtype. x: S=1, scale 1; qkv_w, o_w, ff1_w, ff2_w: S=11, 13, 17,
19, scale 1/sqrt(in_features); qkv_b, o_b, ff1_b, ff2_b: S=12, 14, 18, 20,
scale 0.1; ln1_g, ln2_g: S=15, 21, offset 1, scale 0.1; ln1_b, ln2_b: S=16,
22, scale 0.1. Weights are nn.Linear's [out_features, in_features].

    python3 bench/peers_layer.py [--kind encoder|decoder|all] [--model M] [--seq N] [--mask SPEC]
        [--peers eager,c-flex]
"""
import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import layer_common as C
from layer_common import MISMATCH, Clocks, bench, cases_of, log, rel_l2
from peers_mha import random_tensor, save_results, spec_fn

PEERS = ["eager", "sdpa", "c-sdpa", "c-cudnn", "c-flex", "c-flex-fa4", "cg-flex", "cg-flex-fa4", "ma-flex",
         "ma-flex-fa4"]
# Issue 20's gate 1: the geomean over layers.json's masks at that length.
GATES = [("bert-base", 8, 2048, 1.5), ("bert-base", 8, 512, 1.8)]
EPS = 1e-5
ACTS = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}
# (name, seed, offset, scale: None means 1/sqrt(in_features)), in the argument order of layer().
TENSORS = [("qkv_w", 11, 0, None), ("qkv_b", 12, 0, 0.1), ("o_w", 13, 0, None), ("o_b", 14, 0, 0.1),
           ("ln1_g", 15, 1, 0.1), ("ln1_b", 16, 0, 0.1), ("ff1_w", 17, 0, None), ("ff1_b", 18, 0, 0.1),
           ("ff2_w", 19, 0, None), ("ff2_b", 20, 0, 0.1), ("ln2_g", 21, 1, 0.1), ("ln2_b", 22, 0, 0.1)]


def draw(shape, seed, dt, offset=0.0, scale=1.0):
    """offset + scale * u_i in float32, then rounded to dt (as bench_layer's fill())."""
    u = random_tensor(math.prod(shape), seed, torch.float32).numpy()
    v = u * np.float32(scale) + np.float32(offset)
    return torch.from_numpy(v).to(dt).view(shape)


def weights(c, dt, dev):
    h, f = c["hidden"], c["ffn_hidden"]
    shapes = {"qkv_w": (3 * h, h), "qkv_b": (3 * h,), "o_w": (h, h), "ff1_w": (f, h), "ff1_b": (f,),
              "ff2_w": (h, f)}
    out = []
    for name, seed, offset, scale in TENSORS:
        shape = shapes.get(name, (h,))
        out.append(draw(shape, seed, dt, offset, scale or 1 / math.sqrt(shape[1])).to(dev))
    return out


def attend_explicit(q, k, v, bias):
    s = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5 + bias
    return torch.matmul(torch.softmax(s, dim=-1), v)


def attend_sdpa(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def attend_cudnn(q, k, v, bias):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def attend_flex(q, k, v, block_mask):
    return flex_attention(q, k, v, block_mask=block_mask)


def attend_flex_fa4(q, k, v, block_mask):
    return flex_attention(q, k, v, block_mask=block_mask, kernel_options={"BACKEND": "FLASH"})


def make_layer(c, attend):
    """src/stof.h's layer; attend(q, k, v, mask) on [B, H, L, D]."""
    heads, act = c["heads"], ACTS[c["activation"]]
    post = c["norm"] == "post_ln"

    def layer(x, mask, qkv_w, qkv_b, o_w, o_b, ln1_g, ln1_b, ff1_w, ff1_b, ff2_w, ff2_b, ln2_g, ln2_b):
        b, l, e = x.shape

        def attn(a):
            qkv = F.linear(a, qkv_w, qkv_b).view(b, l, 3, heads, e // heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            return attend(q, k, v, mask).transpose(1, 2).reshape(b, l, e)

        def ffn(t):
            return F.linear(act(F.linear(t, ff1_w, ff1_b)), ff2_w, ff2_b)

        def ln(t, g, beta):
            return F.layer_norm(t, (e,), g, beta, EPS)
        if post:
            h = ln(x + F.linear(attn(x), o_w, o_b), ln1_g, ln1_b)
            return ln(h + ffn(h), ln2_g, ln2_b)
        h = x + F.linear(attn(ln(x, ln1_g, ln1_b)), o_w, o_b)
        return h + ffn(ln(h, ln2_g, ln2_b))
    return layer


ATTEND = {"eager": attend_explicit, "sdpa": attend_sdpa, "c-sdpa": attend_sdpa, "c-cudnn": attend_cudnn,
          "c-flex": attend_flex, "c-flex-fa4": attend_flex_fa4, "cg-flex": attend_flex,
          "cg-flex-fa4": attend_flex_fa4, "ma-flex": attend_flex, "ma-flex-fa4": attend_flex_fa4}
MODES = {"c-": None, "cg-": "reduce-overhead", "ma-": "max-autotune"}  # by the name's prefix
COMPILED = {}


def peer_fn(c, peer):
    """One function per (model config, peer) and case (peers() starts each case afresh)."""
    prefix = peer.split("-")[0] + "-"
    if prefix not in MODES:
        return make_layer(c, ATTEND[peer])
    key = (c["hidden"], c["heads"], c["ffn_hidden"], c["activation"], c["norm"], peer)
    if key not in COMPILED:
        COMPILED[key] = torch.compile(make_layer(c, ATTEND[peer]), dynamic=False, mode=MODES[prefix])
    return COMPILED[key]


def peers(c, wanted, stof_out, sets, dev):
    dt = torch.float16 if c["dtype"] == "fp16" else torch.bfloat16
    b, l = c["b"], c["l"]
    w = weights(c, dt, dev)
    x = draw((b, l, c["hidden"]), 1, dt).to(dev)
    # bench_layer's input sets: as many as it rotated (enough that the L2 cannot hold them), 2 at least
    xs = [x] + [draw((b, l, c["hidden"]), 1 + 1000 * i, dt).to(dev) for i in range(1, max(2, sets))]
    f = spec_fn(c["spec"], l, l, dev)
    idx = torch.arange(l, device=dev)
    allowed = f(idx[:, None], idx[None, :])
    bias = torch.zeros(l, l, dtype=dt, device=dev).masked_fill(~allowed, float("-inf"))
    del allowed
    block_mask = create_block_mask(lambda bi, hi, qi, ki: f(qi, ki), None, None, l, l, device=dev)
    res = {"ms": {}, "err": {}, "fail": {}}
    # Each case compiles afresh: a CUDA-graph layer (cg-, ma-) recompiled in one process for a second shape
    # failed with an AssertionError (torch 2.11).
    torch._dynamo.reset()
    COMPILED.clear()
    with torch.no_grad():
        try:
            ref = make_layer(c, attend_explicit)(x.float(), bias.float(), *(t.float() for t in w))
        except torch.OutOfMemoryError:
            ref = None  # no check, but still the timings
            log("  the fp32 reference layer ran out of memory: no output check")
            torch.cuda.empty_cache()
        if stof_out is not None and ref is not None:
            res["stof_err"] = rel_l2(stof_out.to(dev).view(ref.shape), ref)
        for p in wanted:
            t0 = time.time()
            try:
                fn = peer_fn(c, p)
                mask = block_mask if "flex" in p else bias
                if p.startswith(("cg-", "ma-")):
                    for t in w:  # weights stay put: CUDA graphs need not copy them per call
                        torch._dynamo.mark_static_address(t)
                out = fn(x, mask, *w)  # compiles, where it does
                if ref is not None:
                    res["err"][p] = rel_l2(out, ref)
                del out
                res["ms"][p] = bench(lambda xi: fn(xi, mask, *w), xs)
            except Exception as e:  # a peer that cannot run (OOM, compile error) is a cell, not a crash
                res["fail"][p] = ("OOM" if isinstance(e, torch.OutOfMemoryError) else repr(e))[:300]
                # A failed CUDA-graph compile left the next ones failing too (AssertionError): start them afresh.
                torch._dynamo.reset()
                COMPILED.clear()
            got = "%.4f ms" % res["ms"][p] if p in res["ms"] else "fail: " + res["fail"][p][:120]
            log("  %-8s %s (%.0f s, compiling included)" % (p, got, time.time() - t0))
            torch.cuda.empty_cache()
    del ref, bias, block_mask, w, x, xs
    torch.cuda.empty_cache()
    return res


class Stof:
    """bench_layer, one case at a time: the GPU rests C.SETTLE seconds before each, as before each peer."""

    def __init__(self, args, out_dir):
        self.p = subprocess.Popen([args.stof, "--cache", args.cache, "--out-dir", out_dir], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def run(self, c):
        """bench_layer's JSON line for case c ({} when it printed none), progress echoed."""
        time.sleep(C.SETTLE)
        try:
            self.p.stdin.write("%s %d %d %d %d %d %s %s %s %s\n" % (
                c["name"], c["b"], c["l"], c["hidden"], c["heads"], c["ffn_hidden"], c["activation"], c["norm"],
                c["dtype"], c["spec"]))
            self.p.stdin.flush()
        except OSError:  # bench_layer is gone; its status is reported at close
            return {}
        for line in self.p.stdout:
            try:
                r = json.loads(line)
            except ValueError:  # a line cut short by a crash
                log("bench_layer printed: %s" % line.rstrip()[:200])
                continue
            if "timed_from" in r:
                C.CLOCKS.window("stof", r["timed_from"], r["timed_to"])
            log("stof %s: %s" % (r["name"], r["error"] if "error" in r else "%.4f ms" % r["ms"]))
            return r
        return {}

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        if self.p.wait() != 0:
            log("bench_layer exited with status %d" % self.p.returncode)


def load_out(s, dt):
    """stof's output for input set 0 (raw 16-bit values), the file then removed."""
    if not s.get("out"):
        return None
    raw = np.fromfile(s["out"], dtype=np.int16)
    os.remove(s["out"])
    return torch.from_numpy(raw).view(dt)


def describe_split(text):
    """(group, ms) for describe lines that begin with a name and carry an 'N ms' figure."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([A-Za-z][\w+./-]*).*?(\d+(?:\.\d+)?)\s*ms\b", line)
        if m:
            out.append((m.group(1), float(m.group(2))))
    return out if len(out) >= 2 else []


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def report(rows, wanted, gpu):
    out = ["# stof vs PyTorch peers, encoder layer, %s, %s" % (gpu, datetime.datetime.now().strftime("%Y-%m-%d %H:%M")),
           "# ms: median per layer; ratio = best peer ms / stof ms (>1: stof faster); TF/s = (GEMM + allowed-entry "
           "attention FLOPs) / stof time; err: stof's rel L2 to an fp32 eager layer",
           "%-50s %9s %6s " % ("case", "stof ms", "TF/s") + " ".join("%8s" % p for p in wanted) +
           " %6s %8s %5s" % ("ratio", "err", "check")]
    ratios, worst, checks, fails = {}, None, [0, 0], {}
    for c, s, pr in rows:
        times = [pr["ms"][p] for p in wanted if p in pr.get("ms", {})]
        ratio = min(times) / s["ms"] if times and "ms" in s else None
        cells = []
        for p in wanted:
            if p in pr.get("ms", {}):
                cells.append("%8.3f" % pr["ms"][p])
            else:
                cells.append("%8s" % ("fail" if p in pr.get("fail", {}) else "-"))
                if p in pr.get("fail", {}):
                    fails.setdefault(p, []).append(c["name"])
        err = pr.get("stof_err") if "ms" in s else None
        ok = "-" if err is None else "ok" if err <= MISMATCH and not s["nonfinite"] else "MISMATCH"
        if err is not None:
            checks[ok != "ok"] += 1
        out.append("%-50s %s %s %6s %8s %5s" % (
            c["name"], "%9.4f %6.1f" % (s["ms"], s["tflops"]) if "ms" in s else "%9s %6s" % ("fail", "-"),
            " ".join(cells), "%.2f" % ratio if ratio else "-", "%.1e" % err if err is not None else "-", ok))
        if "error" in pr:
            out.append("    peers error: " + pr["error"])
        if "ms" not in s:
            out.append("    stof failed: " + s.get("error", "no result"))
            continue
        out.append("    plan: first %.0f ms (%d NVRTC compiles, %d timing runs), cached %.1f ms (%d, %d); "
                   "workspace %.0f MiB" % (s["plan_first_ms"], s["plan_first_compiles"], s["plan_first_timings"],
                                           s["plan_cached_ms"], s["plan_cached_compiles"],
                                           s["plan_cached_timings"], s["workspace_bytes"] / 2 ** 20))
        for line in s["describe"].splitlines():
            out.append("    | " + line)
        split = describe_split(s["describe"])
        if split:
            total = sum(ms for _, ms in split)
            out.append("    split: " + ", ".join("%s %.3f ms (%.0f%%)" % (g, ms, 100 * ms / total) for g, ms in split))
        bad = ["%s %.1e" % (p, e) for p, e in pr.get("err", {}).items() if e > MISMATCH]
        if bad:
            out.append("    peers off the fp32 layer too (the Python layer, not stof, may be wrong): " + ", ".join(bad))
        if ratio:
            worst = (ratio, c["name"]) if worst is None or ratio < worst[0] else worst
            ratios.setdefault((c["model"], c["b"], c["l"]), []).append(ratio)
    out.append("")
    for (model, b, l), rs in sorted(ratios.items()):
        out.append("summary: geomean ratio %s b%d seq %d: %.2fx over %d mask%s" % (
            model, b, l, geomean(rs), len(rs), "" if len(rs) == 1 else "s"))
    if worst:
        out.append("summary: worst ratio %.2fx (%s)" % worst)
    for model, b, l, gate in GATES:
        rs = ratios.get((model, b, l))
        verdict = "n/a" if not rs else "%.3fx, %s" % (geomean(rs), "met" if geomean(rs) >= gate else "not met")
        out.append("summary: %s b%d seq %d: %s (gate %.1fx)" % (model, b, l, verdict, gate))
    if C.CLOCKS:
        for side in ("stof", "peers"):
            out.append("summary: clocks: " + C.CLOCKS.summary(side))
    out.append("summary: check: %d ok, %d mismatches (stof's rel L2 to the fp32 layer > %g)" % (
        checks[0], checks[1], MISMATCH))
    plans = [s for _, s, _ in rows if "plan_first_ms" in s]
    if plans:
        med = lambda k: sorted(p[k] for p in plans)[len(plans) // 2]  # noqa: E731
        out.append("summary: planning: first plan median %.0f ms (max %.0f; %d NVRTC compiles, %d timing runs in "
                   "all), cached plan median %.1f ms (%d compiles, %d timing runs in all)" % (
                       med("plan_first_ms"), max(p["plan_first_ms"] for p in plans),
                       sum(p["plan_first_compiles"] for p in plans), sum(p["plan_first_timings"] for p in plans),
                       med("plan_cached_ms"), sum(p["plan_cached_compiles"] for p in plans),
                       sum(p["plan_cached_timings"] for p in plans)))
    for p, names in fails.items():
        out.append("summary: peer %s failed on %d case%s (first: %s)" % (p, len(names), "" if len(names) == 1 else "s",
                                                                         names[0]))
    return "\n".join(out) + "\n"


def main():
    import peers_decoder
    ap = argparse.ArgumentParser(description="stof's encoder and decoder layers vs PyTorch peers")
    ap.add_argument("--kind", choices=("encoder", "decoder", "all"), default="encoder",
                    help="which of layers.json's cases: the encoder layers (default; through "
                         "build/bench_layer), the decoder layers (stof.DecoderLayer on Hugging "
                         "Face's layers, bench/peers_decoder.py) or both")
    ap.add_argument("--workload", default="bench/workloads/layers.json")
    ap.add_argument("--model", action="append", help="only this model (repeatable)")
    ap.add_argument("--seq", action="append", type=int, help="only this sequence length (repeatable)")
    ap.add_argument("--mask", action="append", help="only this mask spec, as written in the workload (repeatable)")
    ap.add_argument("--peers", help="comma-separated subset of the encoder's %s; the decoder's %s "
                    "(default: all)" % (",".join(PEERS), ",".join(peers_decoder.PEERS)))
    ap.add_argument("--stof", default="build/bench_layer")
    ap.add_argument("--cache", default=os.environ.get("STOF_CACHE", "build/bench-cache.db"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds the GPU rests before each side's timing of a case (default 1)")
    args = ap.parse_args()
    kinds = ("encoder", "decoder") if args.kind == "all" else (args.kind,)
    known = {"encoder": PEERS, "decoder": peers_decoder.PEERS}
    asked = [p for p in (args.peers or "").split(",") if p]
    unknown = [p for p in asked if not any(p in known[k] for k in kinds)]
    if unknown:
        ap.error("unknown peers %s (known: %s)" % (",".join(unknown), ",".join(
            dict.fromkeys(p for k in kinds for p in known[k]))))
    if not torch.cuda.is_available():
        sys.exit("peers_layer: no CUDA device (torch %s sees none): the layers and their peers "
                 "run on a GPU" % torch.__version__)
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
    rc = 0
    for kind in kinds:
        wanted = [p for p in asked if p in known[kind]] if asked else list(known[kind])
        if not wanted:
            continue
        rc |= (encoders if kind == "encoder" else peers_decoder.run)(args, ap, wanted)
    return rc


def encoders(args, ap, wanted):
    """The encoder cases: bench_layer's stof, then the peers, case by case."""
    dev = "cuda"
    gpu = torch.cuda.get_device_name(0)
    cases = cases_of(json.load(open(args.workload)), args.model, args.seq, args.mask)
    if not cases:
        if args.kind == "all":
            log("no encoder case matches the filters")
            return 0
        ap.error("no case matches the filters")
    out_dir = tempfile.mkdtemp(prefix="stof-layer-")
    C.CLOCKS, C.SETTLE = Clocks(), args.settle
    stof = Stof(args, out_dir)
    rows = []
    for i, c in enumerate(cases):
        log("[%d/%d] %s" % (i + 1, len(cases), c["name"]))
        s = stof.run(c)
        dt = torch.float16 if c["dtype"] == "fp16" else torch.bfloat16
        try:
            pr = peers(c, wanted, load_out(s, dt), s.get("sets", 2), dev)
        except Exception as e:  # e.g. the fp32 reference itself out of memory
            pr = {"error": repr(e)[:300]}
            torch.cuda.empty_cache()
        rows.append((c, s, pr))
    stof.close()
    for name in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, name))
    os.rmdir(out_dir)

    C.CLOCKS.stop()
    text = report(rows, wanted, gpu)
    print(text)
    save_results("layer", gpu, args.tag, text, rows)
    broken = [c["name"] for c, s, pr in rows
              if "ms" not in s or s["nonfinite"] or pr.get("stof_err", 0) > MISMATCH]
    if broken:
        log("stof failed or mismatched on %d case(s): %s" % (len(broken), ", ".join(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
