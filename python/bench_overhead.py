"""bench_overhead: the host time one stof.attention call costs on a cached plan.

Times 10,000 calls one by one (time.perf_counter_ns around each; the GPU is
synchronised every 100 calls, outside the timed part, so the launch queue
never fills and no call waits for the GPU), and prints the median and the
90th percentile for: stof.attention on torch tensors, the same with its
launch made through ctypes instead of the _native module (when that was
built), the launch call alone both ways (stof_mha_run: cuLaunchKernel and
the checks around it), the output's allocation alone, stof.attention into a
given out=, and torch's own SDPA on the same tensors for scale.
The gate (issue 21) is stof.attention's median, which includes the launch.

--varlen N times the packed form instead (issue 54): q, k and v as
[L, H, D] holding N sequences, a new composition (cu_seqlens) every call
from a pool of 16 made ahead, one plan for all. --decode times a decoding
step (issue 57): one new row for each of B sequences against a cache of L
keys, on 4x fewer KV heads where H allows, a new length (seqused_k) every
call. Their gates: 15 us, with no plan and no compile during the calls;
the launch alone (the C call through the form the first call kept) is
timed after, so that what Python adds is the difference.

    PYTHONPATH=python STOF_LIB=build/libstof.so python3 python/bench_overhead.py
    ... python3 python/bench_overhead.py --varlen 8 --shape 1,32,16384,128 --dtype bf16
    ... python3 python/bench_overhead.py --decode --shape 8,32,16384,128 --dtype bf16
"""
import argparse
import statistics
import sys
import time


def timed(fn, n, sync):
    ts = []
    for i in range(n):
        if i % 100 == 0:
            sync()
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    sync()
    ts.sort()
    return statistics.median(ts) / 1e3, ts[int(len(ts) * 0.9)] / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--shape", default="1,12,512,64", help="B,H,L,D (default 1,12,512,64)")
    ap.add_argument("--mask", default="window:256+global:64")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--varlen", type=int, default=0, metavar="N",
                    help="the packed form: N sequences of random lengths summing to L (B 1), "
                         "causal within each (or --mask), a new composition every call")
    ap.add_argument("--decode", action="store_true",
                    help="a decoding step: one new row a sequence against L keys, a new "
                         "length every call")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_overhead: torch is not installed; nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("bench_overhead: no CUDA device; nothing to measure")
        return 0
    import stof
    from stof import _attention, _lib

    b, h, l, d = (int(x) for x in args.shape.split(","))
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    if args.varlen or args.decode:
        return per_call(args, torch, stof, b, h, l, d, dt)
    q, k, v = (torch.randn(b, h, l, d, device="cuda", dtype=dt) for _ in range(3))
    out = stof.attention(q, k, v, mask=args.mask)      # plans (cache hit or search)
    e = next(iter(_attention._plans.values()))
    stream = torch.cuda.current_stream().cuda_stream
    sync = torch.cuda.synchronize

    native = e.call is not _lib._ctypes_call
    ctypes_run = e.ctx._lib.mha_run

    def launch():
        e.call(e.run, e.plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None,
               stream)

    def launch_ctypes():
        ctypes_run(e.plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None, stream)

    def through_ctypes():
        # The same call with the entry's launch swapped for ctypes' for a moment.
        call, run = e.call, e.run
        e.call, e.run = _lib._ctypes_call, ctypes_run
        try:
            stof.attention(q, k, v, mask=args.mask)
        finally:
            e.call, e.run = call, run

    dense = torch.ones(l, l, dtype=torch.bool, device="cuda")
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def alloc():
        if e.like_q:
            torch.empty_like(q)
        else:
            torch.empty_strided(e.out_shape, e.out_stride, dtype=q.dtype, device=q.device)

    rows = [("stof.attention", lambda: stof.attention(q, k, v, mask=args.mask)),
            ("stof.attention, out=", lambda: stof.attention(q, k, v, mask=args.mask, out=out)),
            ("stof_mha_run via %s" % ("_native" if native else "ctypes"), launch),
            ("output allocation", alloc),
            ("torch SDPA, bool mask", lambda: sdpa(q, k, v, attn_mask=dense))]
    if native:
        rows[2:2] = [("stof.attention, ctypes launch", through_ctypes),
                     ("stof_mha_run via ctypes", launch_ctypes)]
    print("device: %s; torch %s; stof %s (%s)" % (torch.cuda.get_device_name(), torch.__version__,
                                                 stof.version(), stof.library_path()))
    print("shape B,H,L,D = %s, %s, mask %s; %d calls each" % (args.shape, args.dtype, args.mask,
                                                              args.calls))
    print("plan: %s" % e.describe())
    print("launch through %s; output by %s" % ("the _native module" if native else "ctypes",
                                              "torch.empty_like" if e.like_q else
                                              "torch.empty_strided"))
    print("%-28s %12s %12s" % ("call", "median us", "p90 us"))
    for name, fn in rows:
        for _ in range(200):
            fn()
        med, p90 = timed(fn, args.calls, sync)
        print("%-28s %12.2f %12.2f" % (name, med, p90))
    med, _ = timed(rows[0][1], args.calls, sync)
    print("gate: stof.attention median %.2f us per call (limit 10 us): %s"
          % (med, "met" if med <= 10 else "NOT met"))
    return 0


def per_call(args, torch, stof, b, h, l, d, dt):
    """--varlen and --decode: stof.attention with a new composition or a new
    cache length every call; plans and compiles counted around the calls."""
    import random
    rng = random.Random(54)
    if args.varlen:
        if b != 1 or not 1 <= args.varlen <= l:
            print("bench_overhead: --varlen takes B 1 and 1 .. L sequences")
            return 2
        q, k, v = (torch.randn(l, h, d, device="cuda", dtype=dt) for _ in range(3))
        mask = args.mask if args.mask != "window:256+global:64" else "causal"
        pool = []
        for _ in range(16):
            cuts = sorted(rng.sample(range(1, l), args.varlen - 1))
            pool.append(torch.tensor([0] + cuts + [l], dtype=torch.int32, device="cuda"))

        def call(i):
            cu = pool[i % 16]
            stof.attention(q, k, v, mask=mask, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=l,
                           max_seqlen_k=l)
        what = "stof.attention, varlen, %d sequences, %s" % (args.varlen, mask)
    else:
        kvh = h // 4 if h % 4 == 0 else h
        q = torch.randn(b, h, 1, d, device="cuda", dtype=dt)
        k, v = (torch.randn(b, kvh, l, d, device="cuda", dtype=dt) for _ in range(2))
        pool = [torch.full((b,), l - 16 + i, dtype=torch.int32, device="cuda")
                for i in range(16)]

        def call(i):
            stof.attention(q, k, v, mask="causal", seqused_k=pool[i % 16])
        what = "stof.attention, decode, %d on %d heads" % (h, kvh)
    call(0)                                         # the plan
    torch.cuda.synchronize()
    def counts():
        c = dict(stof.stats())
        c["plans"] = len(stof.plans()) + len(stof.decode_plans())
        return c
    before = counts()
    n = [0]

    def step():
        call(n[0])
        n[0] += 1
    for _ in range(200):
        step()
    med, p90 = timed(step, args.calls, torch.cuda.synchronize)
    after = counts()
    # The launch alone (the C call through the kept form: its checks, the
    # split choice, cuLaunchKernel), so that the Python part is med - this.
    from stof import _decode, _varlen
    forms = _varlen._calls if args.varlen else _decode._calls
    c = next(iter(forms.values()), None)
    if c is not None:
        out = torch.empty_like(q)
        stream = torch.cuda.current_stream().cuda_stream
        if args.varlen:
            rest = (pool[0].data_ptr(), pool[0].data_ptr(), c.n, c.tq, c.tk)
        else:
            rest = (pool[0].data_ptr(), c.batch, c.cap)
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())

        def launch():
            c.call(c.fn, c.plan.plan, *ptrs, *rest, stream)
        for _ in range(200):
            launch()
        lmed, lp90 = timed(launch, args.calls, torch.cuda.synchronize)
    print("device: %s; torch %s; stof %s" % (torch.cuda.get_device_name(), torch.__version__,
                                            stof.version()))
    print("shape B,H,L,D = %s, %s; %d calls" % (args.shape, args.dtype, args.calls))
    print("%-44s %12s %12s" % ("call", "median us", "p90 us"))
    print("%-44s %12.2f %12.2f" % (what, med, p90))
    if c is not None:
        print("%-44s %12.2f %12.2f" % ("the launch alone (%s)" % getattr(c.call, "__name__", "?"),
                                       lmed, lp90))
    keys = ("plans", "nvrtc_compiles", "module_loads", "timing_runs")
    print("during the calls: " + ", ".join("%s +%d" % (x, after[x] - before[x]) for x in keys))
    print("gate: median %.2f us per call (limit 15 us): %s" % (med, "met" if med <= 15 else
                                                              "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
