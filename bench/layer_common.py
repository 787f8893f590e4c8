"""layer_common: what the layer benchmarks share (bench/peers_layer.py's
encoder cases, bench/peers_decoder.py's decoder ones): layers.json's cases,
the clock sampler, the timing and the output check, and the log."""
import datetime
import re
import subprocess
import sys
import threading
import time

import torch

MISMATCH = 2e-2     # a contender's output further from the reference (rel L2) is wrong


class Clocks:
    """The SM clock, board power and throttle reasons every 50 ms (nvidia-smi), so that a report can say
    what clock each side's timed runs saw: a layer that draws the board's power limit runs at a lower clock
    when timed for longer (the SW power cap, reason bit 0x4)."""
    CAP = 0x4

    def __init__(self):
        self.samples, self.windows = [], {"stof": [], "peers": []}
        # power.draw is a 1 s average on recent drivers: the instant reading where there is one
        power = "power.draw"
        try:
            probe = subprocess.run(["nvidia-smi", "--query-gpu=power.draw.instant", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=30)
            if probe.returncode == 0 and re.match(r"^\s*[0-9.]+\s*$", probe.stdout.splitlines()[0] if probe.stdout else ""):
                power = "power.draw.instant"
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.power = power
        try:
            self.p = subprocess.Popen(["nvidia-smi",
                                       "--query-gpu=timestamp,clocks.sm,%s,clocks_throttle_reasons.active" % power,
                                       "--format=csv,noheader,nounits", "-lms", "50"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.p = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        # The sample's own time: lines through a pipe can arrive in late bursts.
        for line in self.p.stdout:
            f = [x.strip() for x in line.split(",")]
            try:
                when = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((when, float(f[1]), float(f[2]), int(f[3], 16)))
            except (ValueError, IndexError):
                pass

    def window(self, side, t0, t1):
        self.windows[side].append((t0, t1))

    def stop(self):
        if self.p:
            self.p.terminate()
            self.p.wait()

    def summary(self, side):
        """One line on the samples inside side's windows (the timed runs: bench_layer says when its were) that
        found the GPU busy (over 200 W); readings can lag a window of 0.1 s, so there may be none."""
        got = [s for s in self.samples if s[2] > 200 and any(a <= s[0] <= b for a, b in self.windows[side])]
        if not got:
            return "%s: no busy samples" % side if self.p else "%s: nvidia-smi not found" % side
        clk = sorted(s[1] for s in got)
        watts = sorted(s[2] for s in got)
        cap = sum(1 for s in got if s[3] & self.CAP)
        when = {"stof": "stof's timed runs", "peers": "the peers' timed runs"}[side]
        return "%s: SM clock median %.0f MHz (min %.0f), %s median %.0f W, power cap in %.0f%% of %d samples" % (
            when, clk[len(clk) // 2], clk[0], self.power, watts[len(watts) // 2], 100.0 * cap / len(got), len(got))


CLOCKS = None
SETTLE = 1.0


def log(msg):
    sys.stderr.write("peers_layer: %s\n" % msg)
    sys.stderr.flush()


def bench(fn, xs, side="peers"):
    """Median ms of fn(x) over 21 batches of about 5 ms, x rotating through xs, after SETTLE s of
    rest; side names whose timed runs these were, for Clocks."""
    torch.cuda.synchronize()
    time.sleep(SETTLE)
    t0 = time.time()
    for x in xs:
        fn(x)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def batch(n):
        e0.record()
        for i in range(n):
            fn(xs[i % len(xs)])
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / n

    n = max(1, min(500, int(5.0 / max(batch(3), 1e-3))))
    ms = sorted(batch(n) for _ in range(21))[10]
    if CLOCKS:
        CLOCKS.window(side, t0, time.time())
    return ms


def rel_l2(out, ref):
    out = out.float()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def cases_of(workload, models, seqs, masks, kind="encoder", extra_masks=()):
    """The cases of workload's models of kind ("encoder" or "decoder"), filtered; extra_masks are
    added to each case's own (the decoder's packed documents, which layers.json cannot name)."""
    out = []
    for k in workload["cases"]:
        m = workload["models"][k["model"]]
        if m.get("kind", "encoder") != kind:
            continue
        if models and k["model"] not in models:
            continue
        for l in k["seq"]:
            if seqs and l not in seqs:
                continue
            for spec in k["masks"] + [x for x in extra_masks if x not in k["masks"]]:
                if masks and spec not in masks:
                    continue
                h = m["hidden"]
                # a decoder model has two batches at one length: its names carry the batch
                name = ("%s/l=%d/%s" % (k["model"], l, spec) if kind == "encoder"
                        else "%s/b=%d/l=%d/%s" % (k["model"], k["batch"], l, spec))
                c = dict(name=name, model=k["model"], spec=spec, b=k["batch"], l=l, hidden=h,
                         heads=m["heads"])
                if kind == "encoder":
                    c.update(ffn_hidden=int(round(m["ffn"] * h)), activation=m["activation"],
                             norm=m["norm"])
                else:
                    c.update(kv_heads=m["kv_heads"], head_dim=m["head_dim"],
                             ffn_hidden=m["ffn_hidden"])
                c["dtype"] = k["dtype"]
                out.append(c)
    return out
