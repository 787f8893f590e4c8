"""bench/'s Python drivers without a GPU: the decoder cases peers_layer.py
--kind decoder lists from layers.json (and the packed documents it adds),
the documents' lengths and allowed entries, the fp32 check of
bench/peers_decoder.py on a tiny Hugging Face layer (a bf16 layer passes it,
one under the wrong mask does not), bench/e2e.py's bfloat16 cast and
decoder tolerance, and both scripts' --help, bad arguments and their
message where no CUDA device is. Skipped, saying so, where torch,
transformers or triton is missing.
"""
import json
import os
import subprocess
import sys
import unittest

from _util import REPO

BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, BENCH)
try:
    import torch
    import transformers  # noqa: F401
    import peers_decoder as D
    import peers_layer as P
    WHY = None
except ImportError as e:
    WHY = "torch, transformers or triton is not installed (%s)" % e

needs = unittest.skipIf(WHY is not None, WHY or "")


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(BENCH, script)] + list(args), cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@needs
class Cases(unittest.TestCase):
    def setUp(self):
        with open(os.path.join(BENCH, "workloads", "layers.json")) as f:
            self.workload = json.load(f)

    def test_decoder_cases_and_documents(self):
        cases = P.cases_of(self.workload, None, None, None, kind="decoder",
                           extra_masks=(D.DOCUMENTS,))
        want = 0
        for k in self.workload["cases"]:
            if self.workload["models"][k["model"]].get("kind") == "decoder":
                want += len(k["seq"]) * (len(k["masks"]) + 1)
        self.assertEqual(len(cases), want)
        names = [c["name"] for c in cases]
        self.assertEqual(len(set(names)), len(names), "two cases share a name")
        self.assertIn("llama3-8b/b=4/l=4096/documents", names)
        c = next(c for c in cases if c["name"] == "llama3.2-1b/b=1/l=16384/causal_window:4096")
        self.assertEqual((c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn_hidden"],
                          c["dtype"]), (2048, 32, 8, 64, 8192, "bf16"))
        only = P.cases_of(self.workload, ["llama3-8b"], [16384], ["causal"], kind="decoder",
                          extra_masks=(D.DOCUMENTS,))
        self.assertEqual([c["name"] for c in only], ["llama3-8b/b=1/l=16384/causal"])

    def test_encoder_cases_keep_their_form(self):
        cases = P.cases_of(self.workload, ["bert-base"], [512], ["window:256"])
        self.assertEqual(cases, [dict(name="bert-base/l=512/window:256", model="bert-base",
                                      spec="window:256", b=8, l=512, hidden=768, heads=12,
                                      ffn_hidden=3072, activation="gelu", norm="post_ln",
                                      dtype="fp16")])

    def test_documents(self):
        for l in (300, 4096, 16384):
            lengths = D.doc_lengths(l)
            self.assertEqual(sum(lengths), l)
            self.assertGreater(len(lengths), 2)
            self.assertTrue(all(n > 0 for n in lengths))
            self.assertEqual(lengths, D.doc_lengths(l), "drawn afresh each time")
        for lengths, window in (([10], 0), ([10], 3), ([7, 1, 5], 4), ([6], 6)):
            brute = sum(1 for n in lengths for q in range(n) for k in range(n)
                        if k <= q and (not window or q - k < window))
            self.assertEqual(D.allowed_entries(lengths, window), brute)


@needs
class Check(unittest.TestCase):
    def setUp(self):
        # As the bench runs; put back after, for the other files' tests in this process.
        self._grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)

    def tearDown(self):
        torch.set_grad_enabled(self._grad)

    def test_the_check_passes_bf16_and_catches_a_wrong_mask(self):
        c = dict(model="llama3.2-1b", spec="documents", b=2, l=160, hidden=128, heads=4,
                 kv_heads=2, head_dim=32, ffn_hidden=256, dtype="bf16")
        layer32, rotary = D.hf_layer(c, "cpu")
        pos, cu, lengths = D.positions(c, "cpu")
        self.assertEqual(cu.tolist()[-1], 2 * 160)
        self.assertEqual(len(cu), 2 * len(lengths) + 1)
        x = torch.randn(2, 160, 128).bfloat16()
        x32 = x.float()
        cos, sin = rotary(x32, pos)
        ref = D.call_layer(layer32, None, {})(x32, D.hf_mask(layer32, "sdpa", x32, pos, False),
                                              cos, sin, pos)
        layer = layer32.to(torch.bfloat16)
        cos, sin = rotary(x, pos)
        inputs = {"sdpa": (D.hf_mask(layer, "sdpa", x, pos), cos, sin, pos)}
        res = {"err": {}, "err_update": {}, "wrong": []}
        self.assertTrue(D.checked(res, "eager-sdpa", D.peer_fn(layer, "eager-sdpa", inputs)(x),
                                  ref, x))
        plain = D.call_layer(layer, None, {})(x, None, cos, sin, pos)   # causal over it all
        self.assertFalse(D.checked(res, "no-documents", plain, ref, x))
        self.assertEqual(res["wrong"], ["no-documents"])


@needs
class EndToEnd(unittest.TestCase):
    """bench/e2e.py's pieces that need no GPU."""

    @classmethod
    def setUpClass(cls):
        import e2e
        cls.E = e2e

    def test_to_dtype_keeps_rotary_in_float32(self):
        # A model cast whole to bfloat16 turns its inv_freq to bfloat16 too, which moves far
        # positions' angles; a loaded bf16 model keeps it in float32, and so must the bench.
        cfg = transformers.MistralConfig(hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, vocab_size=50)
        m = transformers.MistralForCausalLM(cfg)
        want = m.model.rotary_emb.inv_freq.clone()
        self.E.to_dtype(m, torch.bfloat16)
        self.assertEqual(m.model.layers[0].self_attn.q_proj.weight.dtype, torch.bfloat16)
        self.assertEqual(m.model.rotary_emb.inv_freq.dtype, torch.float32)
        self.assertTrue(torch.equal(m.model.rotary_emb.inv_freq, want))

    def test_decoder_tolerance_follows_hf_own_error(self):
        ms = {"sdpa": 245.0, "flex": 137.9, "c-sdpa": 219.8, "c-flex": 132.7,
              "stof-attn": 131.6, "stof-opt": 110.0}
        err = {"sdpa": 3.9e-2, "flex": 3.9e-2, "c-sdpa": 3.4e-2, "c-flex": 3.4e-2,
               "stof-attn": 3.9e-2, "stof-opt": 3.4e-2}
        row = {"model": "mistral-7b", "size": 16384, "L": 16384, "mask": "window", "layers": 8,
               "ms": ms, "err": err, "first_ms": {}, "fail": {}}
        text = self.E.decoder_report([row], [], list(ms), "cpu")
        self.assertIn("lands at 3.4e-02 of fp32, over 2e-02", text)
        self.assertIn("sliding window: 1.21x (need 1.20x each) PASS", text)
        self.assertIn("outputs within 2e-02 of fp32: 0 of 6", text)
        self.assertIn("outputs within 1.25x HF's own bfloat16 error of fp32: 6 of 6", text)
        # Past 1.25x HF's own error, stof's output is a mismatch and fails the gate.
        row = dict(row, err=dict(err, **{"stof-opt": 5e-2}))
        text = self.E.decoder_report([row], [], list(ms), "cpu")
        self.assertIn("sliding window: fail/mismatch (need 1.20x each) FAIL", text)
        self.assertIn("error of fp32: 5 of 6", text)
        # Within 2e-2, the tolerance stays 2e-2.
        row = dict(row, err={c: 1e-2 for c in ms})
        text = self.E.decoder_report([row], [], list(ms), "cpu")
        self.assertNotIn("tolerance:", text)
        self.assertIn("outputs within 2e-02 of fp32: 6 of 6", text)


@needs
class CommandLine(unittest.TestCase):
    def test_help(self):
        for script, flag in (("peers_layer.py", "--kind"), ("e2e.py", "--gen-batches")):
            r = run(script, "--help")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(flag, r.stdout)

    def test_bad_arguments(self):
        r = run("peers_layer.py", "--kind", "decoder", "--peers", "c-flex,cg-flex")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown peers cg-flex", r.stderr)
        r = run("e2e.py", "--models", "gpt2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown model 'gpt2'", r.stderr)
        r = run("e2e.py", "--masks", "longformer,diagonal")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown mask 'diagonal'", r.stderr)
        r = run("e2e.py", "--rounds", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--rounds", r.stderr)

    def test_list_rows(self):
        r = run("e2e.py", "--list-rows", "--models", "bert-base,mistral-7b", "--masks",
                "bigbird,window", "--lengths", "16384", "--gen-batches", "8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), [
            "bert-base/512/bigbird|--models bert-base --sizes 512 --masks bigbird",
            "bert-base/2048/bigbird|--models bert-base --sizes 2048 --masks bigbird",
            "mistral-7b/16384/window|--models mistral-7b --lengths 16384 --masks window "
            "--gen-batches=",
            "mistral-7b/generate/b8|--models mistral-7b --lengths= --gen-batches 8"])

    @unittest.skipIf(WHY is None and torch.cuda.is_available(), "a CUDA device is here")
    def test_no_device_is_a_message(self):
        for script, args in (("peers_layer.py", ["--kind", "decoder"]),
                             ("peers_layer.py", []), ("e2e.py", ["--models", "mistral-7b"])):
            r = run(script, *args)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("no CUDA device", r.stderr)
            self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()


class Rounds(unittest.TestCase):
    """bench/rounds.py (--rounds): the contenders near the fastest are timed
    again in rotated, alternately reversed orders, each keeping its median;
    the slow ones keep their one figure; a failing round is noted. No torch:
    runs everywhere."""

    def test_interleave(self):
        sys.path.insert(0, BENCH)
        from rounds import interleave
        calls = []
        figures = {"a": iter([1.0, 3.0]), "b": iter([2.2, 2.4]), "c": iter([9.0])}

        def bench(fn):
            who = fn()
            calls.append(who)
            if who == "c" and calls.count("c") == 2:
                raise RuntimeError("gone")
            return next(figures[who])
        times = {"a": 2.0, "b": 2.0, "c": 2.9, "slow": 3.5}
        how = {"a": "graph", "slow": "do_bench"}
        timed = [(w, (lambda w=w: w)) for w in ("a", "b", "c", "slow")]
        figs = interleave(times, timed, how, 3, bench)
        # slow (3.5 > 1.5 x 2.0) is not timed again; round 1 runs the order
        # rotated by one and reversed (a, c, b), round 2 rotated by two (c, a, b).
        self.assertEqual(calls, ["a", "c", "b", "c", "a", "b"])
        self.assertEqual(figs, {"a": [2.0, 1.0, 3.0], "b": [2.0, 2.2, 2.4], "c": [2.9, 9.0]})
        self.assertEqual(times, {"a": 2.0, "b": 2.2, "c": 9.0, "slow": 3.5})
        self.assertEqual(how["a"], "graph; median of 2.0000 / 1.0000 / 3.0000")
        self.assertEqual(how["c"], "round 2 failed: RuntimeError('gone'); median of 2.9000 / 9.0000")
        self.assertEqual(how["slow"], "do_bench")
        self.assertEqual(interleave(times, timed, how, 1, bench), {})
        self.assertEqual(interleave({}, [], {}, 3, bench), {})


class PlanLine(unittest.TestCase):
    """peers_llm.py's plan line names the plan a case's call made (by the
    plans' keys before and after it), decode plans included, not whichever
    plan the process listed last."""

    def test_the_new_plan(self):
        import stof
        sys.path.insert(0, BENCH)
        import peers_llm as PL
        saved = stof.plans, stof.decode_plans
        attn, dec = [(("a", 1), "plan a")], []
        stof.plans, stof.decode_plans = (lambda: list(attn)), (lambda: list(dec))
        try:
            had = {k for k, _ in PL.all_plans()}
            self.assertEqual(PL.new_plan(had), "(a plan this process made before)")
            dec.append(((1, 2), "decode plan"))
            attn.append((("b", 2), "plan b"))      # listed last, but not the call's
            self.assertIn(PL.new_plan(had), ("decode plan", "plan b"))
            had = {k for k, _ in PL.all_plans()}
            attn.insert(0, (("c", 3), "plan c"))   # listed first, and the call's
            self.assertEqual(PL.new_plan(had), "plan c")
        finally:
            stof.plans, stof.decode_plans = saved
