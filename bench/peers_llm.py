#!/usr/bin/env python3
"""The decoder-model attention benchmark (issues 54 and 57): stof and every
peer on bench/workloads/llm.json's prefill and decode cases, in one process,
on the same tensors.

Contenders, each where it can express the case (else "n/a (why)"):
- stof through the Python package (stof.attention: GQA k/v with fewer heads,
  softcap=, a KV prefix; packed documents as a docs spec until the varlen
  form lands; ALiBi and decode "n/a" until they land, unless stof.attention
  takes alibi= or seqused_k=);
- SDPA with each backend forced (cuDNN, flash, efficient), enable_gqa=True,
  or K/V repeated (untimed) where a backend refuses it; is_causal where it
  means the case, else a boolean mask (an additive float one for ALiBi);
  and SDPA as dispatched with a boolean mask where the mask fits memory;
- FlexAttention compiled (Triton, and kernel_options BACKEND="FLASH"):
  enable_gqa, a score_mod for softcap and ALiBi, a BlockMask from the mask
  (document ids for packed documents);
- FlashAttention-4 (flash_attn.cute): flash_attn_func (GQA, causal,
  window_size, softcap; ALiBi as a CuTe score_mod; decode with the split
  heuristic) and flash_attn_varlen_func (cu_seqlens for packed documents and
  chunked prefill, seqused_k for decode).
Every output is checked against a float32 reference (chunked over KV heads
and query rows); one that disagrees is reported and not timed. Times are
bench/peers_mha.py's bench(): the lower of do_bench (L2 flushed, median) and
a CUDA graph of flush + call pairs. Per case: each contender's ms, the best
peer, stof/best (best peer ms / stof ms: above 1, stof is faster), TF/s over
allowed entries (decode: GB/s over the K/V bytes read) and the share of the
peak. Writes a markdown table under bench/results/ (and $OUT) named by device.

    PYTHONPATH=python STOF_LIB=build/libstof.so python3 bench/peers_llm.py \
        [--workload FILE] [--case SUBSTR]... [--peers a,b,...] [--kind prefill|decode] \
        [--rounds R]
    python3 bench/peers_llm.py --dry-run      # the cases, on any machine (no torch)
"""
import argparse
import datetime
import inspect
import itertools
import json
import math
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
PEAK_TF = 790.0           # dense bf16 tensor-core TF/s of an H100 (peers_mha's figure)
PEAK_GBS = {"H200": 4800.0, "H100": 3350.0}   # HBM bandwidth, GB/s, by device name
ALL_PEERS = ("sdpa-cudnn", "sdpa-flash", "sdpa-eff", "sdpa-mask", "flex", "flex-fa4", "fa4",
             "fa4-varlen")
# With randn inputs the scaled logits are about N(0, 1), where a cap of 50 changes
# nothing a check could see: softcap cases scale q by this, so the cap bites
# (logits reach 30 and more) and a contender that ignores it fails the check.
SOFTCAP_Q_GAIN = 8.0
MASK_BYTES = 1 << 30      # the largest boolean mask SDPA is handed
REF_ELEMS = 1 << 28       # float32 scores the reference holds at once (1 GiB)


# ---- the workload: read on any machine ----------------------------------------------------


def _term(spec):
    """(name, W) of the spec's attention term: causal, dense or causal_window:W,
    which a docs:L1,L2,... term may follow ('&': within each document)."""
    base, _, rest = spec.partition("&")
    name, _, arg = base.partition(":")
    if rest and not (rest.startswith("docs:") and _docs(spec)):
        raise ValueError("mask %r: only a docs:L1,L2,... term may follow '&'" % spec)
    if name in ("causal", "dense") and not arg:
        return name, 0
    if name == "causal_window" and arg.isdigit() and int(arg) > 0:
        return name, int(arg)
    raise ValueError("mask %r: llm.json's cases take causal, dense or causal_window:W" % spec)


def _docs(spec):
    """The document lengths of a spec's docs term, else None."""
    _, _, rest = spec.partition("&docs:")
    lens = rest.split(",") if rest else []
    return [int(x) for x in lens] if lens and all(x.isdigit() for x in lens) else None


def _case(kind, s, m, spec, b, lq, lk):
    _term(spec)
    if kind == "decode":
        name = "%s/%s/b=%d,cache=%d" % (s["name"], m, b, lk)
    else:
        name = "%s/%s/%s" % (s["name"], m, "l=%d" % lq if lq == lk else "lq=%d,lk=%d" % (lq, lk))
    c = dict(kind=kind, name=name, mask=m, spec=spec, b=b, h=s["heads"],
             hk=s.get("kv_heads", s["heads"]), d=s["head_dim"], dtype=s["dtype"], lq=lq, lk=lk,
             softcap=s.get("softcap", 0), alibi=bool(s.get("alibi")), docs=_docs(spec))
    if c["h"] % c["hk"] or lk < lq or (c["docs"] and (sum(c["docs"]) != lq or lk != lq)):
        raise ValueError("%s: heads not a multiple of kv_heads, seq_k below seq, or documents "
                         "not summing to seq" % name)
    return c


def load(path):
    """llm.json's cases, each a dict: kind (prefill, decode), name (as stof-warm
    names it), b, h, hk, d, dtype, lq, lk, mask (its name), spec, softcap,
    alibi, docs (lengths, or None). Prefill: "suites" (stof-warm's attention
    suites, with alibi); decode: "decode" (stof-warm's decode suites); and
    the same under "pending", cases for the benchmark alone."""
    doc = json.load(open(path))
    pending = doc.get("pending", {})
    common = {"name", "heads", "kv_heads", "head_dim", "dtype", "masks", "about", "batch"}
    cases = []
    for s in doc.get("suites", []) + pending.get("suites", []):
        extra = set(s) - common - {"seq", "seq_k", "softcap", "alibi"}
        if extra:
            raise ValueError("%s: %s: unknown members %s" % (path, s["name"], sorted(extra)))
        for l in ([s["seq"]] if isinstance(s["seq"], int) else s["seq"]):
            for m, spec in s["masks"].items():
                cases.append(_case("prefill", s, m, spec, s["batch"], l, s.get("seq_k", l)))
    for s in doc.get("decode", []) + pending.get("decode", []):
        extra = set(s) - common - {"cache", "new", "softcap"}
        if extra:
            raise ValueError("%s: %s: unknown members %s" % (path, s["name"], sorted(extra)))
        for b in s["batch"]:
            for lk in s["cache"]:
                for m, spec in s["masks"].items():
                    cases.append(_case("decode", s, m, spec, b, s["new"], lk))
    return cases


def row_keys(spec, lq, lk):
    """Allowed keys of each query row (the rows being the last lq of lk)."""
    name, w = _term(spec)
    off = lk - lq
    if name == "dense":
        return [lk] * lq
    return [min(i + off + 1, w) if w else i + off + 1 for i in range(lq)]


def entries(c):
    """Allowed (query, key) pairs of one sequence of a case."""
    if c["docs"]:
        return sum(sum(row_keys(c["spec"], n, n)) for n in c["docs"])
    return sum(row_keys(c["spec"], c["lq"], c["lk"]))


def kv_bytes(c):
    """Bytes of K and V a decode step must read: the keys any new row sees."""
    first = c["lk"] - c["lq"]                       # the first new row's position
    name, w = _term(c["spec"])
    lo = max(0, first - w + 1) if w else 0
    return 2 * c["b"] * c["hk"] * (c["lk"] - lo) * c["d"] * 2


def stof_spec(c):
    """What stof runs: packed documents as a docs spec until the varlen form lands."""
    return c["spec"]


def dry_run(cases):
    for c in cases:
        if c["kind"] == "prefill":
            work = "%.3f TFLOP" % (4.0 * c["b"] * c["h"] * c["d"] * entries(c) / 1e12)
        else:
            work = "%.1f MB of K/V" % (kv_bytes(c) / 1e6)
        extra = (" softcap=%g" % c["softcap"] if c["softcap"] else "") + (
            " alibi" if c["alibi"] else "")
        print("%-44s b=%d h=%d/%d d=%d %s lq=%d lk=%d %s%s; %s" % (
            c["name"], c["b"], c["h"], c["hk"], c["d"], c["dtype"], c["lq"], c["lk"],
            c["spec"], extra, work))
    print("%d cases (%d prefill, %d decode)" % (len(cases), sum(c["kind"] == "prefill"
                                                                for c in cases),
                                               sum(c["kind"] == "decode" for c in cases)))


# ---- on the GPU ----------------------------------------------------------------------------


class NA(Exception):
    """A contender that cannot express the case: reported as n/a (why)."""


def short(e):
    s = str(e) if isinstance(e, NA) else "%s: %s" % (type(e).__name__, e)
    return " ".join(s.split())[:160]


def gpu_main(args, cases):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    sys.path.insert(0, HERE)
    import peers_mha as pm  # its bench(), rel_l2() and save paths; puts python/ on the path
    from rounds import interleave
    import stof

    torch.backends.cuda.matmul.allow_tf32 = False   # the reference is float32 throughout
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    pm.SETTLE = args.settle
    want = set(args.peers.split(","))
    dev = "cuda"
    gpu = torch.cuda.get_device_name(0)
    peak_gbs = next((v for k, v in PEAK_GBS.items() if k in gpu), PEAK_GBS["H100"])
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        fa4_why = None
    except Exception as e:  # not installed, or its DSL failed to load
        flash_attn_func = flash_attn_varlen_func = None
        fa4_why = short(e)
    print("FlashAttention-4: %s" % ("importable" if not fa4_why else "NOT importable (%s)"
                                    % fa4_why), flush=True)
    stof_params = inspect.signature(stof.attention).parameters

    def alibi_slopes(h):
        return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device=dev)

    def allowed(c, rows=None):
        """Boolean [rows, lk] of the mask; rows: a range of query rows (all by default)."""
        name, w = _term(c["spec"])
        r = torch.arange(c["lq"], device=dev) if rows is None else rows
        qp = (r + c["lk"] - c["lq"])[:, None]
        kp = torch.arange(c["lk"], device=dev)[None, :]
        ok = torch.ones_like(qp - kp, dtype=torch.bool) if name == "dense" else kp <= qp
        if w:
            ok = ok & (qp - kp < w)
        if c["docs"]:
            ids = doc_ids(c)
            ok = ok & (ids[qp] == ids[kp])
        return ok

    def doc_ids(c):
        return torch.repeat_interleave(torch.arange(len(c["docs"]), device=dev),
                                       torch.tensor(c["docs"], device=dev))

    def reference(c, q, k, v):
        """float32 [B, H, lq, D]: one KV head's query group and a slice of rows at a time."""
        b, h, hk, lq, lk, d = c["b"], c["h"], c["hk"], c["lq"], c["lk"], c["d"]
        g = h // hk
        out = torch.empty(b, h, lq, d, device=dev, dtype=torch.float32)
        step = max(1, min(lq, REF_ELEMS // (g * lk)))
        slopes = alibi_slopes(h) if c["alibi"] else None
        scale = 1.0 / math.sqrt(d)
        for r0 in range(0, lq, step):
            rows = torch.arange(r0, min(lq, r0 + step), device=dev)
            ok = allowed(c, rows)
            dist = None
            if slopes is not None:
                dist = (torch.arange(lk, device=dev)[None, :] - (rows + lk - lq)[:, None]).float()
            for bi in range(b):
                for j in range(hk):
                    qf = q[bi, j * g:(j + 1) * g, r0:r0 + len(rows)].float()
                    s = torch.matmul(qf, k[bi, j].float().t()) * scale       # [g, rows, lk]
                    if c["softcap"]:
                        s = c["softcap"] * torch.tanh(s / c["softcap"])
                    if slopes is not None:
                        s = s + slopes[j * g:(j + 1) * g, None, None] * dist
                    s = s.masked_fill(~ok, float("-inf")).softmax(-1).nan_to_num(0.0)
                    out[bi, j * g:(j + 1) * g, r0:r0 + len(rows)] = torch.matmul(
                        s, v[bi, j].float())
                    del s, qf
        return out

    def run_case(c):
        b, h, hk, lq, lk, d = c["b"], c["h"], c["hk"], c["lq"], c["lk"], c["d"]
        dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
        tol = 2e-2 if dt == torch.bfloat16 else 1e-2
        gen = torch.Generator(device=dev).manual_seed(5457)
        q = torch.randn(b, h, lq, d, device=dev, dtype=dt, generator=gen)
        if c["softcap"]:
            q = q * SOFTCAP_Q_GAIN
        k, v = (torch.randn(b, hk, lk, d, device=dev, dtype=dt, generator=gen) for _ in range(2))
        ref = reference(c, q, k, v)
        res = {"times": {}, "na": {}, "check": {}, "how": {}}
        timed = []   # (who, fn) of every contender that passed its check: --rounds
        cap, name, w = c["softcap"], *_term(c["spec"])
        gqa = hk != h

        def contender(who, fn, to_bhld=lambda o: o, note=None):
            if who != "stof" and who not in want:
                return
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        o = fn()
                        torch.cuda.synchronize()
                    except Exception as e:  # the warnings say why a forced backend refused
                        why = [str(x.message) for x in caught if "ackend" in str(x.message)
                               or "not" in str(x.message)]
                        raise NA(short(e) + ("; " + why[0] if why else ""))
                o = to_bhld(o[0] if isinstance(o, tuple) else o)
                err = pm.rel_l2(o, ref)
                res["check"][who] = err
                del o
                if not err <= tol:
                    res["na"][who] = "WRONG: rel L2 %.3g vs fp32 (tolerance %g), not timed" % (
                        err, tol)
                    return
                how = {}
                res["times"][who] = pm.bench(fn, how)
                res["how"][who] = how["how"] + (", " + note if note else "")
                timed.append((who, fn))
            except Exception as e:  # one contender failing (OOM, unsupported) stops no other
                res["na"][who] = "n/a (%s)" % short(e)
            finally:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

        def na(who, why):
            if who == "stof" or who in want:
                res["na"][who] = "n/a (%s)" % why

        # ---- stof
        out = torch.empty_like(q)
        kw = {"mask": stof_spec(c), "out": out}
        if cap:
            kw["softcap"] = cap
        if c["alibi"] and "alibi" not in stof_params:
            na("stof", "no ALiBi in stof yet (issue 54)")
        elif c["kind"] == "decode" and "seqused_k" not in stof_params and not args.stof_prefill:
            na("stof", "no decode mode in stof yet (issue 57); --stof-prefill times the "
                       "prefill path, a plan per cache length")
        else:
            if c["alibi"]:
                kw["alibi"] = True
            if c["kind"] == "decode" and "seqused_k" in stof_params:
                kw["seqused_k"] = torch.full((b,), lk, dtype=torch.int32, device=dev)
            t0 = datetime.datetime.now()
            try:
                had = {key for key, _ in all_plans()}
                stof.attention(q, k, v, **kw)
                torch.cuda.synchronize()
                res["plan_s"] = (datetime.datetime.now() - t0).total_seconds()
                res["kernel"] = new_plan(had)
            except Exception as e:
                na("stof", short(e))
            if "stof" not in res["na"] and c["docs"] and "cu_seqlens_q" in stof_params:
                # The run-time form: one varlen plan for any composition, the
                # documents' boundaries as cu_seqlens (the packing copies untimed).
                lens = c["docs"]
                cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32,
                                  device=dev)
                qv, kv_, vv = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
                vkw = dict(mask="causal", cu_seqlens_q=cu, cu_seqlens_k=cu,
                           max_seqlen_q=max(lens), max_seqlen_k=max(lens))
                had = {key for key, _ in all_plans()}
                contender("stof", lambda: stof.attention(qv, kv_, vv, **vkw),
                          to_bhld=lambda o: o.transpose(0, 1)[None], note="varlen")
                res["kernel"] = new_plan(had)   # the varlen plan timed, not the docs spec's
            elif "stof" not in res["na"]:
                contender("stof", lambda: stof.attention(q, k, v, **kw),
                          note="docs spec" if c["docs"] else None)

        # ---- SDPA
        trivial = bool(name == "dense" or (name == "causal" and lq == 1)
                       or (w and lq == 1 and w >= lk))
        fits = lq * lk <= MASK_BYTES
        mask = bias = None
        if not trivial and fits:
            mask = allowed(c)[None, None]
            if c["alibi"]:  # the float mask SDPA adds: ALiBi, and -inf off the mask
                dist = (torch.arange(lk, device=dev)[None, :]
                        - torch.arange(lq, device=dev)[:, None] - (lk - lq)).float()
                bias = (alibi_slopes(h)[:, None, None] * dist).masked_fill(
                    ~mask[0], float("-inf")).to(dt)[None]   # rounded once, as HF's BLOOM does
                del dist
        plain_causal = name == "causal" and lq == lk and not c["docs"]
        am = bias if bias is not None else mask

        def sdpa_args():
            if cap:
                raise NA("SDPA has no softcap")
            if plain_causal and not c["alibi"]:
                return {"is_causal": True}
            if trivial and not c["alibi"]:
                return {}
            if am is None:
                raise NA("a %d x %d mask does not fit" % (lq, lk))
            return {"attn_mask": am}

        def sdpa(who, be):
            if who not in want:
                return
            try:
                kw_s = sdpa_args()
            except NA as e:
                return na(who, str(e))

            def run(kk, vv, gqa_flag):
                with (sdpa_kernel(be) if be is not None else _nullctx()):
                    if gqa_flag:
                        return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True, **kw_s)
                    return F.scaled_dot_product_attention(q, kk, vv, **kw_s)
            call, note = (lambda: run(k, v, gqa)), None
            if gqa:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        run(k, v, True)
                    torch.cuda.synchronize()
                except Exception:  # this backend refuses enable_gqa: K/V repeated, untimed
                    kr, vr = (x.repeat_interleave(h // hk, dim=1) for x in (k, v))
                    call, note = (lambda: run(kr, vr, False)), "K/V repeated"
            contender(who, call, note=note)
            torch.cuda.empty_cache()

        sdpa("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)
        sdpa("sdpa-flash", SDPBackend.FLASH_ATTENTION)
        sdpa("sdpa-eff", SDPBackend.EFFICIENT_ATTENTION)
        if "sdpa-mask" in want:
            if cap:
                na("sdpa-mask", "SDPA has no softcap")
            elif am is None:
                na("sdpa-mask", "no mask needed" if trivial else
                   "a %d x %d mask does not fit" % (lq, lk))
            else:
                kr, vr = k, v
                if gqa:  # as dispatched, with the group's K/V repeated (untimed)
                    kr, vr = (x.repeat_interleave(h // hk, dim=1) for x in (k, v))
                contender("sdpa-mask", lambda kr=kr, vr=vr, am=am: F.scaled_dot_product_attention(
                    q, kr, vr, attn_mask=am), note="K/V repeated" if gqa else None)
                kr = vr = None
        mask = bias = am = None
        torch.cuda.empty_cache()

        # ---- FlexAttention: a fresh compile per case (dynamo would pile up recompiles)
        if "flex" in want or "flex-fa4" in want:
            torch._dynamo.reset()
            off = lk - lq
            ids = doc_ids(c) if c["docs"] else None
            slopes = alibi_slopes(h) if c["alibi"] else None

            def mask_mod(bi, hi, qi, ki):
                qp = qi + off
                ok = (ki <= qp) if name != "dense" else (ki >= 0)
                if w:
                    ok = ok & (qp - ki < w)
                if ids is not None:
                    ok = ok & (ids[qp] == ids[ki])
                return ok

            def score_mod(s, bi, hi, qi, ki):
                if cap:
                    s = cap * torch.tanh(s / cap)
                if slopes is not None:
                    s = s + slopes[hi] * (ki - qi - off)
                return s
            sm = score_mod if (cap or slopes is not None) else None
            try:
                bm = create_block_mask(mask_mod, None, None, lq, lk, device=dev)
                flex = torch.compile(flex_attention)
                contender("flex", lambda: flex(q, k, v, score_mod=sm, block_mask=bm,
                                               enable_gqa=gqa))
                contender("flex-fa4", lambda: flex(q, k, v, score_mod=sm, block_mask=bm,
                                                   enable_gqa=gqa,
                                                   kernel_options={"BACKEND": "FLASH"}))
            except Exception as e:
                na("flex", short(e))
                na("flex-fa4", short(e))

        # ---- FlashAttention-4 (BLHD; the transposes are not timed)
        if "fa4" in want or "fa4-varlen" in want:
            if fa4_why:
                na("fa4", "not importable: " + fa4_why)
                na("fa4-varlen", "not importable: " + fa4_why)
            else:
                fa4_cases(c, q, k, v, contender, na)
        interleave(res["times"], timed, res["how"], args.rounds, pm.bench,
                   torch.cuda.synchronize)
        timed.clear()
        q = k = v = ref = out = None  # the closures above hold them no longer
        torch.cuda.empty_cache()
        return res

    def fa4_cases(c, q, k, v, contender, na):
        b, h, lq, lk = c["b"], c["h"], c["lq"], c["lk"]
        name, w = _term(c["spec"])
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        kw = {}
        if name != "dense":
            kw["causal"] = True
        if w:
            kw["window_size"] = (w - 1, 0)
        if c["softcap"]:
            kw["softcap"] = float(c["softcap"])
        if c["kind"] == "decode":
            kw["num_splits"] = 0          # FA4's split heuristic, as a decode step would use
        if c["alibi"]:
            try:
                kw["score_mod"] = fa4_alibi(h)
            except Exception as e:
                na("fa4", "no ALiBi score_mod: " + short(e))
                na("fa4-varlen", "no ALiBi score_mod: " + short(e))
                return
        bl = lambda o: o.transpose(1, 2)  # noqa: E731  (B, L, H, D) -> (B, H, L, D)
        if c["docs"]:
            na("fa4", "packed documents take the varlen entry")
        else:
            contender("fa4", lambda: flash_attn_func(qt, kt, vt, **kw), bl)
        if c["docs"] or (c["kind"] == "prefill" and lq != lk):
            lens_q = c["docs"] or [lq]
            lens_k = c["docs"] or [lk]
            cu_q, cu_k = (torch.tensor([0] + list(_cumsum(x)), dtype=torch.int32, device=dev)
                          for x in (lens_q, lens_k))
            q3, k3, v3 = (x.reshape(-1, x.shape[2], x.shape[3]) for x in (qt, kt, vt))
            contender("fa4-varlen", lambda: flash_attn_varlen_func(
                q3, k3, v3, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                max_seqlen_k=max(lens_k), **kw),
                lambda o: o.reshape(b, lq, h, -1).transpose(1, 2))
        elif c["kind"] == "decode":
            used = torch.full((b,), lk, dtype=torch.int32, device=dev)
            contender("fa4-varlen", lambda: flash_attn_varlen_func(qt, kt, vt, seqused_k=used,
                                                                   **kw), bl)
        else:
            na("fa4-varlen", "one sequence: the dense entry covers it")
        # (qt, kt and vt stay: the closures run again in the case's --rounds;
        # they go with its timed list.)

    def fa4_alibi(h):
        import cutlass
        import cutlass.cute as cute
        step = -8.0 / h

        @cute.jit
        def alibi(score, b_idx, h_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
            slope = cute.math.exp2((h_idx + 1).to(cutlass.Float32) * step)
            return score + slope * (kv_idx - q_idx).to(cutlass.Float32)
        return alibi

    rows = []
    for c in cases:
        print("case %s" % c["name"], flush=True)
        try:
            r = run_case(c)
        except Exception as e:  # the case's inputs or reference failed (OOM): the rest go on
            r = {"times": {}, "na": {"case": "n/a (%s)" % short(e)}, "check": {}, "how": {}}
        rows.append((c, r))
        for who in ("stof",) + ALL_PEERS:
            if who in r["times"]:
                print("  %-10s %9.4f ms  (rel L2 %.1e; %s)" % (who, r["times"][who],
                                                             r["check"][who], r["how"][who]))
            elif who in r["na"]:
                print("  %-10s %s" % (who, r["na"][who]))
        print("  " + summary_line(c, r, peak_gbs), flush=True)
        torch.cuda.empty_cache()
    report(args, gpu, rows, peak_gbs)


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def figures(c, r, peak_gbs):
    """(best peer, its ms, stof ms, stof/best, rate, rate unit, % of peak) of a case."""
    t = r["times"]
    peers = {k: x for k, x in t.items() if k != "stof"}
    best = min(peers, key=peers.get) if peers else None
    st = t.get("stof")
    ratio = peers[best] / st if best and st else None
    ms = st if st else (peers[best] if best else None)
    if ms is None:
        return best, None, st, ratio, None, "", None
    if c["kind"] == "decode":
        rate = kv_bytes(c) / (ms * 1e-3) / 1e9
        return best, peers.get(best), st, ratio, rate, "GB/s", 100 * rate / peak_gbs
    rate = 4.0 * c["b"] * c["h"] * c["d"] * entries(c) / (ms * 1e-3) / 1e12
    return best, peers.get(best), st, ratio, rate, "TF/s", 100 * rate / PEAK_TF


def all_plans():
    """[(key, describe line)] of the process's attention and decode plans."""
    import stof
    return stof.plans() + [(("decode",) + tuple(key), d) for key, d in stof.decode_plans()]


def new_plan(had):
    """The describe line of the plan stof.plans() holds beyond the keys in
    `had` (the one a call just made), else where it came from."""
    import stof
    made = [d for key, d in all_plans() if key not in had]
    return made[-1] if made else "(a plan this process made before)"


def summary_line(c, r, peak_gbs):
    best, bms, st, ratio, rate, unit, pct = figures(c, r, peak_gbs)
    who = "stof" if st else best
    return "best peer %s%s; stof %s; stof/best %s; %s" % (
        best or "-", " %.4f ms" % bms if bms else "", "%.4f ms" % st if st else "n/a",
        "%.2fx" % ratio if ratio else "-",
        "%s %.1f %s, %.0f%% of peak" % (who, rate, unit, pct) if rate else "no time")


def gates(rows, peak_gbs):
    """Issues 54's and 57's gates, as far as this run's cases reach."""
    out = []
    fig = {c["name"]: (c, figures(c, r, peak_gbs)) for c, r in rows}

    def gate(title, sel, need):
        got = [(n, f[3]) for n, (c, f) in fig.items() if sel(c)]
        if not got:
            return
        missing = [n for n, x in got if x is None]
        have = [(n, x) for n, x in got if x is not None]
        if have:
            n, x = min(have, key=lambda a: a[1])
            out.append("summary: %s: worst %.3fx (%s), %s (gate %.1fx)%s" % (
                title, x, n, "met" if x >= need and not missing else "not met", need,
                "; %d cases without a ratio" % len(missing) if missing else ""))
        else:
            out.append("summary: %s: no case has both stof and a peer" % title)
    pre = lambda c: c["kind"] == "prefill"  # noqa: E731
    gate("causal GQA hd128", lambda c: pre(c) and c["spec"] == "causal" and c["d"] == 128
         and c["hk"] < c["h"] and not c["softcap"] and not c["docs"], 1.0)
    slow = [(n, f[4]) for n, (c, f) in fig.items() if pre(c) and c["spec"] == "causal"
            and c["d"] == 128 and c["hk"] < c["h"] and c["lq"] >= 16384 and f[2]]
    if slow:
        n, x = min(slow, key=lambda a: a[1])
        out.append("summary: causal GQA hd128 L >= 16384: lowest %.1f TF/s (%s), %s (gate 690)"
                   % (x, n, "met" if x >= 690 else "not met"))
    gate("windows and packed documents", lambda c: pre(c) and not c["softcap"] and
         not c["alibi"] and (c["spec"].startswith("causal_window") or c["docs"]), 1.1)
    gate("softcap and ALiBi", lambda c: pre(c) and (c["softcap"] or c["alibi"]), 1.1)
    gate("decode", lambda c: c["kind"] == "decode", 1.0)
    # A window reads only the window: cache 32768 under causal_window:4096 within
    # 1.3x of a cache-4096 step at the same batch.
    t = {(c["kind"], c["spec"], c["b"], c["lq"], c["lk"]): r["times"].get("stof")
         for c, r in rows}
    for (kind, spec, b, lq, lk), st in sorted(t.items(), key=str):
        base = t.get(("decode", "causal", b, lq, 4096))
        if kind == "decode" and spec.startswith("causal_window") and lk == 32768 and st and base:
            out.append("summary: decode %s b=%d cache 32768 / causal cache 4096: %.2fx, %s "
                       "(gate 1.3x)" % (spec, b, st / base, "met" if st / base <= 1.3
                                        else "not met"))
    return out


def report(args, gpu, rows, peak_gbs):
    stamp = datetime.datetime.now()
    lines = ["# stof vs every peer, decoder-model attention (llm.json), %s, %s"
             % (gpu, stamp.strftime("%Y-%m-%d %H:%M")), "",
             "One process. stof/best = best peer ms / stof ms (above 1: stof faster). Rate: "
             "prefill TF/s = 4 B H D allowed entries / time, %% of %.0f TF/s; decode GB/s = K/V "
             "bytes read / time, %% of %.0f GB/s. Rates are stof's, else the best peer's "
             "(in brackets). Times: peers_mha.bench(), the lower of do_bench and a CUDA graph "
             "(the GPU alone). Every output checked against float32." % (PEAK_TF, peak_gbs)
             + (" With --rounds %d: the contenders within 1.5x of the fastest timed %d times, "
                "interleaved in rotated orders, each one's median kept (the figures listed "
                "below)." % (args.rounds, args.rounds) if args.rounds > 1 else ""), "",
             "| case | stof ms | best peer | peer ms | stof/best | rate | % peak |",
             "|---|---|---|---|---|---|---|"]
    for c, r in rows:
        best, bms, st, ratio, rate, unit, pct = figures(c, r, peak_gbs)
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], "%.4f" % st if st else "n/a", best or "-", "%.4f" % bms if bms else "-",
            "%.2fx" % ratio if ratio else "-",
            ("%.1f %s" if st else "(%.1f %s)") % (rate, unit) if rate else "-",
            "%.0f%%" % pct if pct else "-"))
    lines += ["", "## Every contender", ""]
    for c, r in rows:
        lines.append("- %s: " % c["name"] + "; ".join(
            ["%s %.4f (%.1e, %s)" % (k, x, r["check"][k], r["how"][k])
             for k, x in sorted(r["times"].items(), key=lambda kx: kx[1])]
            + ["%s %s" % kv for kv in sorted(r["na"].items())]))
        if r.get("kernel"):
            lines.append("  stof plan %.2f s: %s" % (r.get("plan_s", 0), r["kernel"]))
    lines += [""] + gates(rows, peak_gbs)
    text = "\n".join(lines) + "\n"
    print(text)
    name = "llm-%s-%s%s.md" % (gpu.replace(" ", "-"), stamp.strftime("%Y%m%d-%H%M%S"), args.tag)
    for d in ("bench/results", os.environ.get("OUT", "")):
        if d:
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, name), "w").write(text)
            json.dump([{"case": c, **r} for c, r in rows],
                      open(os.path.join(d, name[:-3] + ".json"), "w"), indent=1, default=str)
    print("written: bench/results/%s" % name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default=os.path.join(HERE, "workloads", "llm.json"))
    ap.add_argument("--case", action="append", help="only cases whose name holds this")
    ap.add_argument("--kind", choices=("prefill", "decode"))
    ap.add_argument("--peers", default=",".join(ALL_PEERS))
    ap.add_argument("--tag", default="")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds the GPU rests before each contender is timed")
    ap.add_argument("--rounds", type=int, default=3,
                    help="time the contenders within 1.5x of the fastest this many times "
                         "in all, interleaved, and keep each one's median (bench/rounds.py; 1: one pass, in turn)")
    ap.add_argument("--stof-prefill", action="store_true",
                    help="decode cases: time stof's prefill path (a plan per cache length)")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and stop")
    args = ap.parse_args()
    cases = [c for c in load(args.workload) if (not args.kind or c["kind"] == args.kind)
             and (not args.case or any(s in c["name"] for s in args.case))]
    unknown = set(args.peers.split(",")) - set(ALL_PEERS)
    if unknown:
        ap.error("unknown peers %s (known: %s)" % (sorted(unknown), ",".join(ALL_PEERS)))
    if args.dry_run:
        return dry_run(cases)
    gpu_main(args, cases)


if __name__ == "__main__":
    main()
