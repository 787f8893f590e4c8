#!/usr/bin/env python3
"""The attention benchmark: stof and every peer a user could call instead, in
one process, on the same tensors.

For each case of a workload file it times (the lower of triton's do_bench,
L2 flushed between repeats, median, and the GPU's own time in a CUDA graph
of flushes and calls: bench()) stof.attention (the Python package over
libstof.so, planned once first: a cache hit or a search) and the peers:
SDPA with each backend forced (FLASH_ATTENTION, CUDNN_ATTENTION,
EFFICIENT_ATTENTION; is_causal for causal, a boolean mask otherwise where
the backend takes one), SDPA with a boolean mask as dispatched,
FlexAttention compiled (Triton, and kernel_options BACKEND="FLASH", which
runs FlashAttention-4's kernels) and FlashAttention-4's flash_attn_func for
dense, causal and plain windows when it is importable (the script says when
it is not). Every output is checked against stof's, and stof's first head
against a float32 reference. The best peer of a case is the fastest that
ran and agreed. Prints a table, the gates of issue 19 as "summary:" lines,
and writes both under bench/results/ (and $OUT) named by device and time.

    PYTHONPATH=python STOF_LIB=build/libstof.so python3 bench/peers_mha.py \
        [--workload FILE] [--suite NAME]... [--seq N]... [--peers a,b,...] [--rounds R]
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import stof  # noqa: E402
from rounds import interleave  # noqa: E402

SETTLE = 0.0  # seconds the GPU rests before each contender is timed (--settle)
ROUNDS = 1  # times each contender near the fastest is timed, interleaved (--rounds)
SPARSE = {"window", "longformer", "bigbird", "strided", "dilated"}
PEAK = 790.0  # dense bf16/fp16 tensor-core TFLOP/s of an H100, for the fraction column
ALL_PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-eff", "sdpa-mask", "flex", "flex-fa4", "fa4")

GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
SPARSE = {"window", "longformer", "bigbird", "strided", "dilated"}


def random_tensor(n, seed, dtype):
    """bench_mha's numbers: splitmix64 at seed + (i+1)*GOLDEN, top 24 bits."""
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed) + i * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    x = (z >> np.uint64(40)).astype(np.float64) * 2.0 ** -24 * 2.0 - 1.0
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


def splitmix(state):
    state = (state + GOLDEN) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def random_blocks(seed, qblock, nkb, r):
    """src/attn/mask.h's generator for random:R:B:SEED (Floyd's sampling)."""
    state = (seed ^ (((qblock + 1) * GOLDEN) & M64)) & M64
    chosen = set()
    for j in range(nkb - r, nkb):
        m = j + 1
        limit = (1 << 64) - ((1 << 64) % m)
        while True:
            state, z = splitmix(state)
            if z < limit:
                break
        t = z % m
        chosen.add(j if t in chosen else t)
    return chosen


def term_fn(term, lq, lk, dev):
    """One spec term as f(q, k) on index tensors."""
    name, _, rest = term.partition(":")
    a = [int(x) for x in rest.replace(",", ":").split(":")] if rest else []
    if name == "dense":
        return lambda q, k: q >= 0
    if name == "causal":
        return lambda q, k: k <= q + (lk - lq)
    if name == "window":
        return lambda q, k: (q - k).abs() <= a[0] // 2
    if name == "causal_window":
        return lambda q, k: (q - k >= 0) & (q - k < a[0])
    if name == "dilated":
        return lambda q, k: ((q - k).abs() <= (a[0] // 2) * a[1]) & ((q - k) % a[1] == 0)
    if name == "global":
        return lambda q, k: (q < a[0]) | (k < a[0])
    if name == "strided":
        return lambda q, k: k % a[0] == a[0] - 1
    if name == "random":
        r, b, seed = a
        nqb, nkb = (lq + b - 1) // b, (lk + b - 1) // b
        table = torch.zeros(nqb, nkb, dtype=torch.bool)
        for i in range(nqb):
            for j in random_blocks(seed, i, nkb, r):
                table[i, j] = True
        table = table.to(dev)
        return lambda q, k: table[q // b, k // b]
    if name == "docs":
        ids = torch.repeat_interleave(torch.arange(len(a)), torch.tensor(a)).to(dev)
        return lambda q, k: ids[q] == ids[k]
    raise ValueError("unknown mask term " + term)


def spec_fn(spec, lq, lk, dev):
    """Union ('+') of intersections ('&') of terms."""
    groups = [[term_fn(t, lq, lk, dev) for t in part.split("&")] for part in spec.split("+")]

    def f(q, k):
        out = None
        for g in groups:
            x = g[0](q, k)
            for t in g[1:]:
                x = x & t(q, k)
            out = x if out is None else out | x
        return out
    return f


_FLUSH = None


def graph_ms(fn, reps=40, replays=7):
    """The GPU's milliseconds for one call of fn with the L2 flushed before it,
    without the host's launch overhead: a CUDA graph of reps (flush, fn) pairs
    less a graph of reps flushes, medians of replays. Raises where fn cannot be
    captured."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # do_bench's flush
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (compiles, allocator)
        for _ in range(2):
            _FLUSH.zero_()
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    both, flush = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(both):
        for _ in range(reps):
            _FLUSH.zero_()
            fn()
    with torch.cuda.graph(flush):
        for _ in range(reps):
            _FLUSH.zero_()

    def replay(g):
        g.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(replays):
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        return sorted(ts)[replays // 2]
    t = (replay(both) - replay(flush)) / reps
    del both, flush
    return t


def bench(fn, how=None):
    """Milliseconds of one call: the lower of triton's do_bench (median, L2
    flushed between calls; at small sizes it can time the host's launches:
    for Python-side launchers such as FA4's and FlexAttention's, 1.5-2x their
    time in other runs and up to 9x their GPU time, bench/results 2026-11-26)
    and graph_ms (the GPU's time alone) where fn can be captured. Every contender, stof included, gets the same. how, a dict,
    receives which one gave the figure."""
    if SETTLE > 0:  # every contender starts from a rested GPU (--settle)
        torch.cuda.synchronize()
        time.sleep(SETTLE)
    t = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    src = "do_bench"
    try:
        g = graph_ms(fn)
        if 0 < g < t:
            t, src = g, "graph"
    except Exception:  # not capturable: do_bench's figure stands
        torch.cuda.synchronize()
    if how is not None:
        how["how"] = src
    return t


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def fa4_func():
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func, None
    except Exception as e:  # not installed here, or its DSL failed to load
        return None, repr(e)[:160]


def window_of(spec):
    """FA4's (left, right) for a plain window:W spec, else None."""
    name, _, rest = spec.partition(":")
    if name == "window" and rest.isdigit():
        return (int(rest) // 2, int(rest) // 2)
    return None


def run_case(case, dev, want, fa4):
    b, h, l, d = case["b"], case["h"], case["l"], case["d"]
    dt = torch.float16 if case["dtype"] == "fp16" else torch.bfloat16
    spec = case["spec"]
    gen = torch.Generator(device=dev).manual_seed(1234)
    q, k, v = (torch.randn(b, h, l, d, device=dev, dtype=dt, generator=gen) for _ in range(3))
    tol = 2e-2 if dt == torch.bfloat16 else 1e-2
    res = {"times": {}, "errors": {}, "check": {}, "how": {}}

    # stof: plan (cache hit or search), then time the run.
    out = torch.empty_like(q)
    t0 = datetime.datetime.now()
    stof.attention(q, k, v, mask=spec, out=out)
    torch.cuda.synchronize()
    res["plan_s"] = (datetime.datetime.now() - t0).total_seconds()
    res["kernel"] = stof.plans()[-1][1] if stof.plans() else ""
    how = {}
    run_stof = lambda: stof.attention(q, k, v, mask=spec, out=out)  # noqa: E731
    res["times"]["stof"] = bench(run_stof, how)
    res["how"]["stof"] = how["how"]
    timed = [("stof", run_stof)]  # every contender that agreed: --rounds
    ref_out = out.clone()
    f = spec_fn(spec, l, l, dev)
    idx = torch.arange(l, device=dev)
    allowed = f(idx[:, None], idx[None, :]).expand(l, l).contiguous()  # dense: [l, 1] broadcast
    # stof's first head against float32.
    r = F.scaled_dot_product_attention(q[:1, :1].float(), k[:1, :1].float(), v[:1, :1].float(),
                                       attn_mask=allowed)
    rows = allowed.any(1)
    r[..., ~rows, :] = 0
    res["stof_err"] = rel_l2(ref_out[:1, :1], r)

    def peer(name, fn):
        if name not in want:
            return
        try:
            o = fn()
            torch.cuda.synchronize()
            o = o[..., :d] if o.shape[-1] != d else o
            o = torch.where(rows[None, None, :, None], o, torch.zeros_like(o))
            err = rel_l2(o, ref_out)
            res["check"][name] = err
            if not err <= tol:
                res["errors"][name] = "disagrees with stof: rel L2 %.3g" % err
                return
            how = {}
            res["times"][name] = bench(fn, how)
            res["how"][name] = how["how"]
            timed.append((name, fn))
        except Exception as e:  # a peer that cannot run this case is reported, not fatal
            res["errors"][name] = repr(e)[:160]
        torch.cuda.empty_cache()

    causal = spec == "causal"
    plain = spec in ("dense", "causal")
    for name, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("sdpa-eff", SDPBackend.EFFICIENT_ATTENTION)):
        def call(be=be):
            with sdpa_kernel(be):
                if plain:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        peer(name, call)
    if not plain:
        peer("sdpa-mask", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))

    # FlexAttention: a fresh compile per case (one mask_mod per case would
    # otherwise pile up recompiles until dynamo falls back to eager).
    if "flex" in want or "flex-fa4" in want:
        torch._dynamo.reset()

        def mask_mod(bi, hi, qi, ki):
            return f(qi, ki)
        try:
            bm = create_block_mask(mask_mod, None, None, l, l, device=dev)
            flex = torch.compile(flex_attention)
            peer("flex", lambda: flex(q, k, v, block_mask=bm))
            peer("flex-fa4", lambda: flex(q, k, v, block_mask=bm, kernel_options={"BACKEND": "FLASH"}))
        except Exception as e:
            res["errors"]["flex"] = repr(e)[:160]
    if "fa4" in want and (plain or window_of(spec)):
        if fa4 is None:
            res["errors"]["fa4"] = "FlashAttention-4 is not importable here"
        else:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            kw = {"causal": True} if causal else {"window_size": window_of(spec)} if not plain else {}

            def call_fa4():
                o = fa4(qt, kt, vt, **kw)
                o = o[0] if isinstance(o, tuple) else o
                return o.transpose(1, 2)
            peer("fa4", call_fa4)
    interleave(res["times"], timed, res["how"], ROUNDS, bench, torch.cuda.synchronize)
    del timed, q, k, v, out, ref_out, allowed
    torch.cuda.empty_cache()
    return res


def cases_of(workload, suites, seqs):
    out = []
    for s in workload["suites"]:
        if suites and s["name"] not in suites:
            continue
        for l in s["seq"]:
            if seqs and l not in seqs:
                continue
            for mname, spec in s["masks"].items():
                out.append(dict(name="%s/%s/%d" % (s["name"], mname, l), suite=s["name"], mask=mname,
                                spec=spec, b=s["batch"], h=s["heads"], l=l, d=s["head_dim"],
                                dtype=s["dtype"]))
    return out


def entries(case):
    """Allowed (query, key) pairs of a case's mask, from stof's own statistics."""
    m = stof.Mask(case["spec"], case["l"], case["l"])
    return m.stats()["entries"]


def save_results(kind, gpu, tag, text, rows):
    """The table and its rows under bench/results/ (and $OUT), named by device and time."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    devname = gpu.replace(" ", "-")
    for d in ["bench/results", os.environ.get("OUT", "")]:
        if d:
            os.makedirs(d, exist_ok=True)
            base = os.path.join(d, "%s-%s-%s%s" % (kind, devname, stamp, tag))
            open(base + ".txt", "w").write(text)
            json.dump([{"case": c, "stof": s, "peers": pr} for c, s, pr in rows], open(base + ".json", "w"), indent=1)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="bench/workloads/attention.json")
    ap.add_argument("--suite", action="append")
    ap.add_argument("--seq", action="append", type=int)
    ap.add_argument("--peers", default=",".join(ALL_PEERS))
    ap.add_argument("--tag", default="")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds the GPU rests before each contender (stof and every peer) is timed")
    ap.add_argument("--rounds", type=int, default=3,
                    help="time the contenders within 1.5x of the fastest this many times in all, "
                         "interleaved, and keep each one's median (bench/rounds.py; 1: one pass, in turn)")
    args = ap.parse_args()
    global SETTLE, ROUNDS
    SETTLE, ROUNDS = args.settle, args.rounds
    want = set(args.peers.split(","))
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    dev = "cuda"
    gpu = torch.cuda.get_device_name(0)
    fa4, why = fa4_func()
    print("FlashAttention-4: %s" % ("importable" if fa4 else "NOT importable (%s): its cases are left out" % why),
          flush=True)
    cases = cases_of(json.load(open(args.workload)), args.suite, args.seq)
    rows = []
    for c in cases:
        print("case %s" % c["name"], flush=True)
        try:
            r = run_case(c, dev, want, fa4)
        except Exception as e:
            r = {"times": {}, "errors": {"stof": repr(e)[:200]}, "check": {}}
        r["entries"] = entries(c)
        rows.append((c, r))
        print("  " + " ".join("%s %.4f" % kv for kv in sorted(r["times"].items(), key=lambda kv: kv[1])) +
              "".join("; %s: %s" % kv for kv in sorted(r["errors"].items())), flush=True)

    out = ["# stof vs every peer, attention, one process, %s, %s" % (gpu, datetime.datetime.now().strftime("%Y-%m-%d %H:%M")),
           "# ratio = best peer ms / stof ms (>1: stof faster); TF/s = 4*B*H*D*allowed entries / time; "
           "%%peak of %.0f TF/s" % PEAK,
           "# times: the lower of do_bench's and a CUDA graph's (the GPU alone; marked *), see bench()" +
           ("; with --rounds %d the median of %d interleaved figures (bench/rounds.py; each in the .json's "
            "how)" % (ROUNDS, ROUNDS) if ROUNDS > 1 else ""),
           "%-26s %8s %7s %5s %-12s %8s %6s  %s" % ("case", "stof ms", "TF/s", "%pk", "best peer", "peer ms", "ratio",
                                                  "kernel")]
    summary = []
    ratio = {}
    for c, r in rows:
        t = r["times"]
        if "stof" not in t:
            out.append("%-26s stof failed: %s" % (c["name"], r["errors"].get("stof")))
            continue
        tf = 4.0 * c["b"] * c["h"] * c["d"] * r["entries"] / (t["stof"] * 1e-3) / 1e12
        peers_t = {k: x for k, x in t.items() if k != "stof"}
        best = min(peers_t, key=peers_t.get) if peers_t else None
        rt = peers_t[best] / t["stof"] if best else float("nan")
        ratio[c["name"]] = (c, rt, tf, best)
        kv = dict(f.split("=", 1) for f in r.get("kernel", "").split() if "=" in f)
        star = lambda k: "*" if r.get("how", {}).get(k, "").startswith("graph") else ""  # noqa: E731
        out.append("%-26s %7.4f%1s %7.1f %5.1f %-12s %7s%1s %6.2f  %s %s %sx%s s%s" % (
            c["name"], t["stof"], star("stof"), tf, 100 * tf / PEAK, best or "-",
            "%.4f" % peers_t[best] if best else "-", star(best) if best else "", rt,
            kv.get("kernel", ""), kv.get("engine", ""), kv.get("block_m", ""), kv.get("block_n", ""),
            kv.get("stages", "")))
        out.append("    peers: " + " ".join("%s %.4f%s" % (k, x, star(k)) for k, x in sorted(peers_t.items(), key=lambda kx: kx[1]))
                   + ("; stof vs fp32 %.1e" % r["stof_err"]))
        for k, e in sorted(r["errors"].items()):
            out.append("    %s: %s" % (k, e))

    # Issue 19's gates, as far as this run's cases reach.
    dc = [(n, x[1]) for n, x in ratio.items() if x[0]["mask"] in ("dense", "causal") and
          ((x[0]["suite"] == "bert-heads" and x[0]["l"] >= 1024) or x[0]["suite"] == "long-heads")]
    if dc:
        worst = min(dc, key=lambda a: a[1])
        summary.append("summary: gate 1 dense/causal: worst %.3fx (%s), %s (gate 1.0x)" % (
            worst[1], worst[0], "met" if worst[1] >= 1.0 else "not met"))
    w256 = [(n, x[2]) for n, x in ratio.items() if x[0]["spec"] == "window:256" and x[0]["d"] == 64 and x[0]["l"] >= 2048]
    if w256:
        worst = min(w256, key=lambda a: a[1])
        summary.append("summary: gate 2 window:256 hd64: lowest %.1f TF/s (%s), %s (gate 300)" % (
            worst[1], worst[0], "met" if worst[1] >= 300 else "not met"))
    w1k = [(n, rows_r["times"]["fa4"] / rows_r["times"]["stof"]) for c, rows_r in rows
           for n in [c["name"]] if c["spec"] == "window:1024" and c["d"] == 128 and "fa4" in rows_r["times"]]
    if w1k:
        worst = min(w1k, key=lambda a: a[1])
        summary.append("summary: gate 2 window:1024 hd128 vs FA4: worst %.3fx (%s), %s (gate 1.0x)" % (
            worst[1], worst[0], "met" if worst[1] >= 1.0 else "not met"))
    sp = [x[1] for n, x in ratio.items() if x[0]["suite"] == "bert-heads" and x[0]["mask"] in SPARSE and
          x[0]["l"] in (1024, 2048, 4096)]
    if sp:
        g = geomean(sp)
        summary.append("summary: gate 3 sparse geomean bert-heads L1024-4096: %.3fx over %d cases, %s (gate 2.5x)" % (
            g, len(sp), "met" if g >= 2.5 else "not met"))
    allr = [(n, x[1]) for n, x in ratio.items()]
    if allr:
        worst = min(allr, key=lambda a: a[1])
        summary.append("summary: gate 3 worst case: %.3fx (%s), %s (gate 0.95x)" % (
            worst[1], worst[0], "met" if worst[1] >= 0.95 else "not met"))
    hd = [(n, x[1]) for n, x in ratio.items() if x[0]["d"] in (80, 96) and x[0]["mask"] in ("dense", "causal")]
    if hd:
        worst = min(hd, key=lambda a: a[1])
        summary.append("summary: gate 4 hd80/96 dense/causal: worst %.3fx (%s), %s (gate 1.0x)" % (
            worst[1], worst[0], "met" if worst[1] >= 1.0 else "not met"))
    plans = [r["plan_s"] for _, r in rows if "plan_s" in r]
    if plans:
        summary.append("summary: first calls (plan in this process): median %.2f s, max %.2f s" % (
            sorted(plans)[len(plans) // 2], max(plans)))
    text = "\n".join(out + [""] + summary) + "\n"
    print(text)
    save_results("mha", gpu, args.tag, text, [(c, {"times": r["times"], "errors": r["errors"], "check": r["check"],
                                                  "how": r.get("how", {}), "kernel": r.get("kernel"),
                                                  "plan_s": r.get("plan_s"),
                                                  "entries": r["entries"]}, {}) for c, r in rows])


if __name__ == "__main__":
    main()
