#!/usr/bin/env python3
"""The attention benchmark, both sides in one command.

Runs build/bench_mha (stof) on every case of a workload file, then times the
PyTorch peers on identical inputs (the same generator, bench_mha's set 0) and
masks: FlexAttention (torch.compile'd, block mask built once), SDPA with an
additive mask, and SDPA's flash path where the mask is dense or causal.
Prints one table with ratios to the best peer and the geometric mean over the
sparse masks, and writes it under bench/results/ (and $OUT when set).

    python3 bench/peers_mha.py [--workload FILE] [--suite NAME] [--seq N]...
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
import triton.testing

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
    """src/mask.h's generator for random:R:B:SEED (Floyd's sampling)."""
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


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def peers(case, dev):
    b, h, l, d = case["b"], case["h"], case["l"], case["d"]
    dt = torch.float16 if case["dtype"] == "fp16" else torch.bfloat16
    n = b * h * l * d
    q, k, v = (random_tensor(n, s, dt).view(b, h, l, d).to(dev) for s in (1, 2, 3))
    f = spec_fn(case["spec"], l, l, dev)
    res = {}
    # A fresh compile per case: one mask_mod per case would otherwise pile up
    # recompiles until dynamo falls back to the unfused, eager path.
    torch._dynamo.reset()

    def mask_mod(bi, hi, qi, ki):
        return f(qi, ki)
    block_mask = create_block_mask(mask_mod, None, None, l, l, device=dev)
    flex = torch.compile(flex_attention)
    out = flex(q, k, v, block_mask=block_mask)
    res["flex_mean_abs"] = out.float().abs().mean().item()
    res["flex"] = bench(lambda: flex(q, k, v, block_mask=block_mask))
    del out

    idx = torch.arange(l, device=dev)
    allowed = f(idx[:, None], idx[None, :])
    bias = torch.zeros(l, l, dtype=dt, device=dev).masked_fill(~allowed, float("-inf"))
    try:
        res["sdpa_mask"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    except torch.OutOfMemoryError:
        res["sdpa_mask"] = None
    del bias, allowed
    if case["spec"] in ("dense", "causal"):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            causal = case["spec"] == "causal"
            res["sdpa_flash"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    torch.cuda.empty_cache()
    return res


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


def cases_of(workload, suites, seqs):
    out = []
    for s in workload["suites"]:
        if suites and s["name"] not in suites:
            continue
        for l in s["seq"]:
            if seqs and l not in seqs:
                continue
            for mname, spec in s["masks"].items():
                out.append(dict(name="%s/%s/%d" % (s["name"], mname, l), mask=mname, spec=spec,
                                b=s["batch"], h=s["heads"], l=l, d=s["head_dim"], dtype=s["dtype"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="bench/workloads/attention.json")
    ap.add_argument("--suite", action="append")
    ap.add_argument("--seq", action="append", type=int)
    ap.add_argument("--stof", default="build/bench_mha")
    ap.add_argument("--cache", default=os.environ.get("STOF_CACHE", "build/bench-cache.db"))
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    dev = "cuda"
    gpu = torch.cuda.get_device_name(0)
    cases = cases_of(json.load(open(args.workload)), args.suite, args.seq)
    lines = "".join("%s %d %d %d %d %s %s\n" % (c["name"], c["b"], c["h"], c["l"], c["d"], c["dtype"], c["spec"])
                    for c in cases)
    print("stof side: %d cases ..." % len(cases), flush=True)
    p = subprocess.run([args.stof, "--cache", args.cache], input=lines, capture_output=True, text=True)
    sys.stderr.write(p.stderr)
    stof = {}
    for line in p.stdout.splitlines():
        r = json.loads(line)
        stof[r["name"]] = r
        if "error" in r:
            print("stof %s: %s" % (r["name"], r["error"]), flush=True)
    rows = []
    for c in cases:
        s = stof.get(c["name"], {})
        print("peers: %s" % c["name"], flush=True)
        try:
            pr = peers(c, dev)
        except Exception as e:  # a peer that cannot run is reported, not fatal
            pr = {"error": repr(e)[:200]}
        rows.append((c, s, pr))

    out = []
    hdr = "%-28s %-34s %9s %7s %9s %9s %9s %7s %6s" % (
        "case", "stof kernel", "stof ms", "TF/s", "flex ms", "sdpa-m ms", "flash ms", "ratio", "check")
    out.append("# stof vs PyTorch peers, attention, %s, %s" % (gpu, datetime.datetime.now().strftime("%Y-%m-%d %H:%M")))
    out.append("# ratio = best peer ms / stof ms (>1: stof faster); TF/s = 4*B*H*D*allowed entries / time")
    out.append(hdr)
    geo = {}
    worst = None
    for c, s, pr in rows:
        if "ms" not in s:
            out.append("%-28s stof failed: %s" % (c["name"], s.get("error", "no result")))
            continue
        times = [pr.get(k) for k in ("flex", "sdpa_mask", "sdpa_flash") if pr.get(k)]
        best = min(times) if times else float("nan")
        ratio = best / s["ms"] if times else float("nan")
        ok = "-"
        if "flex_mean_abs" in pr:
            rel = abs(pr["flex_mean_abs"] - s["mean_abs"]) / max(1e-12, pr["flex_mean_abs"])
            ok = "ok" if rel < 1e-2 and not s["nan"] else "DIFF"
        kv = dict(f.split("=", 1) for f in s["kernel"].split(" ") if "=" in f)
        if kv.get("engine") == "wgmma":
            kdesc = "%s wgmma m%s n%s s%s" % (kv.get("kernel"), kv.get("block_m"), kv.get("block_n"),
                                            kv.get("stages"))
        else:
            kdesc = "%s m%s n%s x%s q:%s" % (kv.get("kernel"), kv.get("block_m"), kv.get("block_n"),
                                            kv.get("m_tiles"), kv.get("q_in"))
        fmt = lambda x: "%9.4f" % x if x else "%9s" % "-"
        out.append("%-28s %-34s %9.4f %7.1f %s %s %s %7.2f %6s" % (
            c["name"], kdesc, s["ms"], s["tflops"], fmt(pr.get("flex")), fmt(pr.get("sdpa_mask")),
            fmt(pr.get("sdpa_flash")), ratio, ok))
        if "error" in pr:
            out.append("    peers error: " + pr["error"])
        if not math.isnan(ratio):
            worst = ratio if worst is None else min(worst, ratio)
            key = (c["name"].split("/")[0], c["l"])
            if c["mask"] in SPARSE:
                geo.setdefault(key, []).append(ratio)
    out.append("")
    allr = []
    for key, rs in sorted(geo.items()):
        g = math.exp(sum(math.log(r) for r in rs) / len(rs))
        allr += rs
        out.append("geomean over sparse masks %s seq %d: %.2fx (%d cases)" % (key[0], key[1], g, len(rs)))
    if allr:
        out.append("geomean over all sparse cases: %.2fx; worst case ratio %.2fx" % (
            math.exp(sum(math.log(r) for r in allr) / len(allr)), worst))
    plans = [s for _, s, _ in rows if "plan_first_ms" in s]
    if plans:
        out.append("first plans: %d NVRTC compiles and %d timing runs over %d cases (0 and 0: all from the cache)" % (
            sum(p["plan_first_compiles"] for p in plans), sum(p["plan_first_timings"] for p in plans), len(plans)))
        out.append("planning: first plan median %.0f ms (max %.0f), cached plan median %.1f ms; "
                   "cached plans did %d NVRTC compiles and %d timing runs in total" % (
                       sorted(p["plan_first_ms"] for p in plans)[len(plans) // 2],
                       max(p["plan_first_ms"] for p in plans),
                       sorted(p["plan_cached_ms"] for p in plans)[len(plans) // 2],
                       sum(p["plan_cached_compiles"] for p in plans),
                       sum(p["plan_cached_timings"] for p in plans)))
    text = "\n".join(out) + "\n"
    print(text)
    save_results("mha", gpu, args.tag, text, rows)


if __name__ == "__main__":
    main()
