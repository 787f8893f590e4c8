"""stof.hf without a GPU: the import's message where transformers is absent,
the mapping of transformers' masks onto stof's (mask functions, padding,
4-D masks, the user's spec), and whole models on the CPU through the
"stof" attention with stof's kernel stood in for by a float32 reference
that takes the same arguments (spec or Mask, seq_lens, the views as given),
and stof.decode likewise for generate()'s decoding steps (seqused_k, the
window, the cache as HF hands it): their outputs must match HF's sdpa on
every real token and generate the same tokens. The calls stof cannot run
(a step with left padding) fall back to HF's sdpa for real.
Skipped, saying so, where torch or transformers is missing.
"""
import os
import subprocess
import sys
import unittest
import warnings

from _util import REPO, stof

try:
    import torch
    import torch.nn.functional as F
    import transformers  # noqa: F401
    import stof.hf
    from stof.hf import _backend, _masks
    from transformers import masking_utils as mu
    WHY = None
except ImportError as e:
    WHY = "torch or transformers is not installed (%s)" % e

needs_hf = unittest.skipIf(WHY is not None, WHY or "")


class Import(unittest.TestCase):
    def test_without_transformers_says_what_it_needs(self):
        code = ("import sys\n"
                "class Block:\n"
                "    def find_spec(self, name, path=None, target=None):\n"
                "        if name.split('.')[0] == 'transformers':\n"
                "            raise ImportError('no module named ' + name)\n"
                "sys.meta_path.insert(0, Block())\n"
                "import stof\n"
                "print('stof', stof.__version__)\n"
                "try:\n"
                "    import stof.hf\n"
                "except ImportError as e:\n"
                "    print('ImportError:', e)\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("stof 0.", r.stdout)
        self.assertIn("ImportError: stof.hf needs torch and transformers", r.stdout)


@needs_hf
class MaskMapping(unittest.TestCase):
    def test_mask_functions(self):
        f = _masks.spec_of_mask_function
        self.assertEqual(f(mu.causal_mask_function), "causal")
        self.assertEqual(f(mu.bidirectional_mask_function), "dense")
        self.assertEqual(f(mu.sliding_window_causal_mask_function(7)), "causal_window:7")
        self.assertEqual(f(mu.sliding_window_bidirectional_mask_function(5)), "window:10")
        packed = mu.packed_sequence_mask_function(torch.zeros(1, 4, dtype=torch.long))
        self.assertIsNone(f(mu.and_masks(mu.causal_mask_function, packed)))
        self.assertIsNone(f(mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))))
        self.assertIsNone(f(mu.or_masks(mu.causal_mask_function, mu.bidirectional_mask_function)))
        self.assertIsNone(f(lambda b, h, q, k: q >= k))

    def test_specs_match_transformers_matrices(self):
        # Each spec allows exactly what the mask function does.
        n = 23
        for fn in (mu.causal_mask_function, mu.bidirectional_mask_function,
                   mu.sliding_window_causal_mask_function(5),
                   mu.sliding_window_bidirectional_mask_function(3)):
            spec = _masks.spec_of_mask_function(fn)
            want = mu.sdpa_mask(batch_size=1, q_length=n, kv_length=n, mask_function=fn,
                                allow_is_causal_skip=False)[0, 0]
            got = stof.Mask(spec, n).to_dense("torch")
            self.assertTrue(torch.equal(got, want.cpu()), spec)

    def test_spec_of_module(self):
        class M:
            is_causal = True
        self.assertEqual(_masks.spec_of_module(M(), {}), "causal")
        self.assertEqual(_masks.spec_of_module(M(), {"sliding_window": 64}), "causal_window:64")
        self.assertEqual(_masks.spec_of_module(M(), {"is_causal": False}), "dense")
        self.assertEqual(_masks.spec_of_module(object(), {"sliding_window": 8}), "window:16")

    def test_padding(self):
        pad = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
        lens, why = _masks.lengths_of_padding(pad)
        self.assertIsNone(why)
        self.assertEqual(lens.dtype, torch.int32)
        self.assertEqual(lens.tolist(), [4, 2, 1])
        full = torch.ones(2, 5, dtype=torch.bool)
        self.assertEqual(_masks.lengths_of_padding(full), (None, None))
        self.assertEqual(_masks.lengths_of_padding(None), (None, None))
        left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
        lens, why = _masks.lengths_of_padding(left)
        self.assertIsNone(lens)
        self.assertIn("left padding", why)

    def test_4d_masks_made_once_per_content(self):
        n = 40
        allowed = stof.Mask("window:8+global:2", n).to_dense("torch")
        a = allowed[None, None].expand(3, 1, n, n)
        m, why = _masks.mask_of_4d(a)
        self.assertIsNone(why)
        self.assertTrue(torch.equal(m.to_dense("torch"), allowed))
        self.assertIs(_masks.mask_of_4d(a)[0], m)                    # the same tensor
        self.assertIs(_masks.mask_of_4d(allowed[None, None].clone())[0], m)   # the same content
        add = torch.zeros(1, 1, n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
        self.assertIs(_masks.mask_of_4d(add)[0], m)                  # additive
        self.assertIs(_masks.mask_of_4d(add.masked_fill(~allowed, float("-inf")))[0], m)
        varied = a.clone()
        varied[1, 0, 20, n - 1] = True
        m2, why = _masks.mask_of_4d(varied)
        self.assertIsNone(m2)
        self.assertIn("differs between batch entries", why)
        m3, why = _masks.mask_of_4d(add + 0.5)
        self.assertIsNone(m3)
        self.assertIn("bias", why)

    def test_user_spec(self):
        cfg = transformers.BertConfig()
        other = transformers.BertConfig()

        class Holder(torch.nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config
        model = Holder(cfg)
        self.assertIsNone(_masks.user_spec(cfg))
        with stof.hf.mask("window:64", model=model):
            self.assertEqual(_masks.user_spec(cfg), "window:64")
            self.assertIsNone(_masks.user_spec(other))
            with stof.hf.mask("causal"):
                self.assertEqual(_masks.user_spec(cfg), "causal")     # the process's wins
                self.assertEqual(_masks.user_spec(other), "causal")
            self.assertEqual(_masks.user_spec(cfg), "window:64")
        self.assertIsNone(_masks.user_spec(cfg))
        stof.hf.mask("dense")                                         # a plain setter
        try:
            self.assertEqual(_masks.user_spec(other), "dense")
        finally:
            stof.hf.mask(None)
        self.assertIsNone(_masks.user_spec(other))
        with self.assertRaises(stof.InvalidArgumentError):
            stof.hf.mask(3)


class _FakeKernel:
    """stof.attention's arguments, answered in float32 on the CPU."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, mask, seq_lens=None, scale=None, layout="bhld", softcap=None):
        self.calls.append({"mask": mask, "lens": None if seq_lens is None else seq_lens.tolist(),
                           "views": (q.is_contiguous(), k.is_contiguous(), v.is_contiguous()),
                           "kv_heads": k.shape[1], "softcap": softcap})
        b, h, lq, d = q.shape
        lk = k.shape[2]
        k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))  # grouped KV heads
        m = mask if isinstance(mask, stof.Mask) else stof.Mask(mask, lq, lk)
        allowed = m.to_dense("torch")[None, None].repeat(b, 1, 1, 1)
        if seq_lens is not None:
            for i, n in enumerate(seq_lens.tolist()):
                allowed[i, :, :, n:] = False
                allowed[i, :, n:, :] = True      # padded rows: anything finite, zeroed below
        s = q.float() @ k.float().transpose(-1, -2) * (scale or d ** -0.5)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.float()
        if seq_lens is not None:
            for i, n in enumerate(seq_lens.tolist()):
                out[i, :, n:] = 0
        return out.to(q.dtype)


class _FakeDecode:
    """stof.decode's arguments, answered in float32 on the CPU; it refuses
    what the real one would (rows, memory order, seqused_k's form)."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, seqused_k=None, *, window=0, softcap=None, scale=None,
                 layout="bhld", out=None):
        for name, t in zip("qkv", (q, k, v)):
            if not t.is_contiguous():
                raise AssertionError("%s is not contiguous in %s" % (name, layout))
        if layout == "blhd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        b, h, sq, d = q.shape
        cap = k.shape[2]
        if seqused_k is not None and (seqused_k.dtype != torch.int32
                                      or tuple(seqused_k.shape) != (b,)):
            raise AssertionError("seqused_k must be int32 [%d]" % b)
        lens = [cap] * b if seqused_k is None else seqused_k.tolist()
        self.calls.append({"rows": sq, "window": window, "cap": cap, "layout": layout,
                           "lens": None if seqused_k is None else lens, "kv_heads": k.shape[1],
                           "softcap": softcap})
        if not 1 <= sq <= 16:
            raise AssertionError("%d new rows" % sq)
        k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))
        out = torch.zeros(b, h, sq, d)
        for i, n in enumerate(lens):
            s = q[i].float() @ k[i, :, :n].float().transpose(-1, -2) * (scale or d ** -0.5)
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            pos = torch.arange(n - sq, n)[:, None]
            key = torch.arange(n)[None, :]
            ok = (key <= pos) & ((key > pos - window) if window else True)
            p = torch.softmax(s.masked_fill(~ok, float("-inf")), -1).nan_to_num(0.0)
            out[i] = p @ v[i, :, :n].float()
        out = out.to(q.dtype)
        return out.transpose(1, 2).contiguous() if layout == "blhd" else out


@needs_hf
class Models(unittest.TestCase):
    """Tiny models on the CPU, "stof" against "sdpa" on the same weights."""

    def setUp(self):
        self.kernel, self.decode = _FakeKernel(), _FakeDecode()
        self.saved = _backend.stof_attention, _backend._why_not, _backend.stof_decode
        real = self.saved[1]

        def why_not(*a):
            why = real(*a)
            return None if why and why.startswith(("tensors on", "float32")) else why
        _backend.stof_attention, _backend._why_not = self.kernel, why_not
        _backend.stof_decode = self.decode
        torch.manual_seed(1234)

    def tearDown(self):
        _backend.stof_attention, _backend._why_not, _backend.stof_decode = self.saved

    def run_both(self, model, **inputs):
        model.eval()
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            want = model(**inputs)
            model.set_attn_implementation("stof")
            got = model(**inputs)
        return got, want

    def close(self, got, want, rows=None):
        if rows is not None:
            got, want = got[rows], want[rows]
        err = ((got - want).norm() / want.norm()).item()
        self.assertLess(err, 1e-5)

    def test_bert_padding_as_seq_lens(self):
        cfg = transformers.BertConfig(hidden_size=128, num_attention_heads=2, num_hidden_layers=2,
                                      intermediate_size=256)
        model = transformers.BertModel(cfg)
        ids = torch.randint(0, 1000, (3, 37))
        am = torch.ones(3, 37, dtype=torch.long)
        am[1, 20:] = 0
        am[2, 3:] = 0
        got, want = self.run_both(model, input_ids=ids, attention_mask=am)
        self.assertEqual([c["mask"] for c in self.kernel.calls], ["dense", "dense"])
        self.assertEqual(self.kernel.calls[0]["lens"], [37, 20, 3])
        self.assertEqual(self.kernel.calls[0]["views"], (False, False, False))  # BLHD views
        for i, n in enumerate([37, 20, 3]):
            self.close(got.last_hidden_state[i, :n], want.last_hidden_state[i, :n])

    def test_bert_own_spec_and_4d_mask(self):
        cfg = transformers.BertConfig(hidden_size=128, num_attention_heads=2, num_hidden_layers=2,
                                      intermediate_size=256)
        model = transformers.BertModel(cfg).eval()
        n = 50
        ids = torch.randint(0, 1000, (2, n))
        allowed = stof.Mask("window:16+global:4", n).to_dense("torch")[None, None]
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            want = model(input_ids=ids, attention_mask=allowed).last_hidden_state
            model.set_attn_implementation("stof")
            with stof.hf.mask("window:16+global:4"):
                spec = model(input_ids=ids).last_hidden_state
            four = model(input_ids=ids, attention_mask=allowed.clone()).last_hidden_state
        self.assertEqual(self.kernel.calls[0]["mask"], "window:16+global:4")
        self.assertIsInstance(self.kernel.calls[-1]["mask"], stof.Mask)
        self.close(spec, want)
        self.close(four, want)

    def test_sliding_window(self):
        cfg = transformers.MistralConfig(hidden_size=128, intermediate_size=256,
                                         num_attention_heads=2, num_key_value_heads=2,
                                         num_hidden_layers=2, sliding_window=8, vocab_size=500)
        model = transformers.MistralModel(cfg)
        ids = torch.randint(0, 500, (2, 30))
        got, want = self.run_both(model, input_ids=ids)
        self.assertEqual(self.kernel.calls[0]["mask"], "causal_window:8")
        self.close(got.last_hidden_state, want.last_hidden_state)

    def test_gpt2_packed_qkv_views(self):
        cfg = transformers.GPT2Config(n_embd=128, n_head=2, n_layer=2, vocab_size=500)
        model = transformers.GPT2Model(cfg)
        ids = torch.randint(0, 500, (2, 30))
        # Without a cache: a DynamicCache hands back k and v copied, contiguous.
        got, want = self.run_both(model, input_ids=ids, use_cache=False)
        self.assertEqual(self.kernel.calls[0]["mask"], "causal")
        self.assertEqual(self.kernel.calls[0]["views"], (False, False, False))
        self.close(got.last_hidden_state, want.last_hidden_state)

    def test_memory_orders(self):
        x = torch.randn(2, 7, 3, 4, 16)            # [B, L, 3, H, D]: one packed QKV projection
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
        self.assertTrue(all(a is b for a, b in zip(_backend._same_order(q, k, v), (q, k, v))))
        q = torch.randn(2, 4, 7, 16)                 # contiguous, as RoPE leaves q and k
        v = torch.randn(2, 7, 4, 16).transpose(1, 2)  # a view
        q2, k2, v2 = _backend._same_order(q, q, v)
        self.assertIs(q2, q)
        self.assertTrue(v2.is_contiguous() and torch.equal(v2, v))
        q2, k2, v2 = _backend._same_order(v, v, q)
        self.assertIs(q2, v)
        self.assertTrue(v2.transpose(1, 2).is_contiguous() and torch.equal(v2, q))

    def test_order_reads_strides_as_is_contiguous(self):
        """_order reads the strides where a transposed view would say the
        same: size-1 dimensions (any stride), views of one packed
        projection, slices; GQA's k and v (fewer heads) each in their own."""
        def want(t):
            return ("bhld" if t.is_contiguous() else
                    "blhd" if t.transpose(1, 2).is_contiguous() else None)
        cases = []
        for b, h, n, d in ((2, 4, 7, 16), (1, 4, 7, 16), (2, 1, 7, 16), (2, 4, 1, 16),
                           (1, 1, 1, 16), (2, 4, 7, 1)):
            cases += [torch.randn(b, h, n, d), torch.randn(b, n, h, d).transpose(1, 2),
                      torch.randn(b, n, 3, h, d).unbind(2)[1].transpose(1, 2),
                      torch.randn(b, h, n + 2, d)[:, :, 1:n + 1],
                      torch.randn(b, n, h, 2 * d)[..., :d].transpose(1, 2),
                      torch.randn(b, h, d, n).transpose(2, 3)]
        for t in cases:
            self.assertEqual(_backend._order(t), want(t), (tuple(t.shape), t.stride()))
        q = torch.randn(2, 7, 4, 16).transpose(1, 2)
        k, v = (torch.randn(2, 7, 2, 16).transpose(1, 2) for _ in range(2))
        self.assertTrue(all(a is b for a, b in zip(_backend._same_order(q, k, v), (q, k, v))))
        k = torch.randn(2, 2, 7, 16)
        q2, k2, v2 = _backend._same_order(q, k, v)
        self.assertTrue(q2 is q and v2 is v and torch.equal(k2, k))
        self.assertEqual(_backend._order(k2), "blhd")

    def test_gqa_runs_and_decoding_goes_to_decode(self):
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256,
                                       num_attention_heads=2, num_key_value_heads=1,
                                       num_hidden_layers=2, vocab_size=500)
        model = transformers.LlamaForCausalLM(cfg)
        ids = torch.randint(0, 500, (1, 12))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _backend._said.clear()
            got, want = self.run_both(model, input_ids=ids)
        self.assertEqual([str(x.message) for x in w if "stof.hf" in str(x.message)], [])
        self.assertEqual([c["kv_heads"] for c in self.kernel.calls], [1, 1])  # MQA, as it is
        self.close(got.logits, want.logits)
        self.kernel.calls.clear()
        cfg.num_key_value_heads = 2
        model = transformers.LlamaForCausalLM(cfg).eval()
        got, want, said = self.generate_both(model, ids, 6)
        self.assertEqual(said, [])
        self.assertEqual(self.kernel.calls[0]["mask"], "causal")      # the prefill
        # Each later step (5 of them, 2 layers): one new row against the whole
        # DynamicCache, 13 .. 17 keys, through one decode call a layer.
        self.assertEqual([(c["rows"], c["cap"], c["lens"], c["window"])
                          for c in self.decode.calls],
                         [(1, n, None, 0) for n in range(13, 18) for _ in range(2)])

    def generate_both(self, model, ids, n, attention_mask=None, sdpa="sdpa", **kw):
        """(stof's generate() output, sdpa's, what stof.hf said): the same
        tokens, and each step's logits close."""
        with torch.no_grad(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _backend._said.clear()
            outs = []
            for impl in (sdpa, "stof"):
                model.set_attn_implementation(impl)
                outs.append(model.generate(ids, attention_mask=attention_mask, max_new_tokens=n,
                                           min_new_tokens=n, do_sample=False,
                                           return_dict_in_generate=True, output_logits=True,
                                           pad_token_id=0, **kw))
        want, got = outs
        self.assertTrue(torch.equal(got.sequences, want.sequences))
        self.assertEqual(len(got.logits), n)
        for a, b in zip(got.logits, want.logits):
            self.close(a, b)
        return got, want, [str(x.message) for x in w if "stof.hf" in str(x.message)]

    def test_decoding_steps_of_many_rows(self):
        """A step of 3 new rows against a DynamicCache (speculative decoding's
        verify step): one decode call a layer, logits as sdpa's."""
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       num_hidden_layers=2, vocab_size=500)
        model = transformers.LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 500, (2, 20))
        outs = []
        with torch.no_grad():
            for impl in ("sdpa", "stof"):
                model.set_attn_implementation(impl)
                cache = transformers.DynamicCache(config=cfg)
                model(input_ids=ids[:, :17], past_key_values=cache, use_cache=True)
                outs.append(model(input_ids=ids[:, 17:], past_key_values=cache,
                                  use_cache=True).logits)
        self.close(outs[1], outs[0])
        self.assertEqual([(c["rows"], c["cap"], c["lens"]) for c in self.decode.calls],
                         [(3, 20, None)] * 2)

    def test_static_cache_takes_seqused_k(self):
        """A StaticCache hands its whole capacity: the hook gives the used
        length as seqused_k, from the cache's offset on the device."""
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       num_hidden_layers=2, vocab_size=500)
        model = transformers.LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 500, (2, 9))
        got, want, said = self.generate_both(model, ids, 5, cache_implementation="static")
        self.assertEqual(said, [])
        steps = [(c["rows"], c["lens"]) for c in self.decode.calls]
        # The prefill too (9 rows, within stof.decode's 16): used 9, then 10 .. 13.
        self.assertEqual(steps, [(r, [n, n]) for r, n in [(9, 9)] + [(1, n) for n in range(10, 14)]
                                 for _ in range(2)])
        # Every step sees the whole capacity: 9 + 5 - 1 (the last token needs no forward).
        self.assertEqual({c["cap"] for c in self.decode.calls}, {13})

    def test_sliding_window_steps(self):
        cfg = transformers.MistralConfig(hidden_size=128, intermediate_size=256,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         num_hidden_layers=2, sliding_window=8, vocab_size=500)
        model = transformers.MistralForCausalLM(cfg).eval()
        ids = torch.randint(0, 500, (1, 12))
        got, want, said = self.generate_both(model, ids, 10)
        self.assertEqual(said, [])
        self.assertEqual(self.kernel.calls[0]["mask"], "causal_window:8")
        self.assertEqual({c["window"] for c in self.decode.calls}, {8})
        self.assertEqual(len(self.decode.calls), 2 * 9)

    def test_left_padding_falls_back_saying_so(self):
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       num_hidden_layers=2, vocab_size=500)
        model = transformers.LlamaForCausalLM(cfg).eval()
        ids = torch.randint(1, 500, (2, 10))
        am = torch.ones(2, 10, dtype=torch.long)
        am[1, :4] = 0
        ids[1, :4] = 0
        got, want, said = self.generate_both(model, ids, 4, attention_mask=am)
        self.assertEqual(self.decode.calls, [])
        self.assertTrue(any("left padding" in x for x in said), said)
        self.assertEqual(len(said), len(set(said)))                 # once per reason

    def test_mask_hook_packed_sequences(self):
        """Packed sequences (transformers' packed_sequence_mask_function in the
        mask function): the spec of the rest, and cu_seqlens over the
        batch's rows flattened, with the longest sequence."""
        hook = _backend.mask_hook
        ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])
        fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids))
        mm = hook(1, 9, 9, mask_function=fn)
        self.assertEqual((mm.why, mm.spec, mm.packed[0].tolist(), mm.packed[1]),
                         (None, "causal", [0, 3, 5, 9], 4))
        self.assertEqual(mm.packed[0].dtype, torch.int32)
        two = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]])
        w = mu.sliding_window_causal_mask_function(3)
        fn = mu.and_masks(w, mu.packed_sequence_mask_function(two))
        mm = hook(2, 4, 4, mask_function=fn)
        self.assertEqual((mm.why, mm.spec, mm.packed[0].tolist(), mm.packed[1]),
                         (None, "causal_window:3", [0, 2, 4, 7, 8], 3))
        self.assertIsNone(hook(2, 4, 4, mask_function=mu.causal_mask_function).packed)

    def test_mask_hook_steps(self):
        hook = _backend.mask_hook
        ones = torch.ones(2, 13, dtype=torch.bool)
        mm = hook(2, 1, 13, q_offset=12, kv_offset=0, mask_function=mu.causal_mask_function,
                  attention_mask=ones)
        self.assertEqual((mm.why, mm.spec, mm.step, mm.lens), (None, "causal", 0, None))
        w = mu.sliding_window_causal_mask_function(4)
        mm = hook(2, 2, 5, q_offset=20, kv_offset=17, mask_function=w,
                  attention_mask=torch.ones(2, 22, dtype=torch.bool))
        self.assertEqual((mm.why, mm.spec, mm.step, mm.lens), (None, "causal_window:4", 4, None))
        # A StaticCache: its offset a tensor, its keys its capacity.
        mm = hook(2, 1, 32, q_offset=torch.tensor(12), kv_offset=0,
                  mask_function=mu.causal_mask_function, attention_mask=ones)
        self.assertEqual((mm.why, mm.step, mm.lens.dtype, mm.lens.tolist()),
                         (None, 0, torch.int32, [13, 13]))
        left = ones.clone()
        left[1, :3] = False
        mm = hook(2, 1, 13, q_offset=12, kv_offset=0, mask_function=mu.causal_mask_function,
                  attention_mask=left)
        self.assertIsNone(mm.step)
        self.assertIn("left padding", mm.why)
        # Past the left padding, a sliding window's step runs again.
        mm = hook(2, 1, 5, q_offset=12, kv_offset=8, mask_function=w, attention_mask=left)
        self.assertEqual((mm.why, mm.step), (None, 4))
        # More rows than a step: a prefill over the keys in use (a StaticCache's
        # first forward, a chunk of a chunked prefill), the offset read once.
        mm = hook(2, 17, 40, q_offset=torch.tensor(13), kv_offset=0,
                  mask_function=mu.causal_mask_function)
        self.assertEqual((mm.why, mm.spec, mm.step, mm.keys), (None, "causal", None, 30))
        mm = hook(2, 17, 40, q_offset=13, kv_offset=0, mask_function=mu.causal_mask_function,
                  attention_mask=left)
        self.assertIn("17 rows against a KV cache with padding", mm.why)
        mm = hook(2, 17, 20, q_offset=13, kv_offset=10, mask_function=w)
        self.assertIn("past its first keys", mm.why)
        chunked = mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))
        mm = hook(2, 1, 13, q_offset=12, kv_offset=0, mask_function=chunked)
        self.assertIn("cannot express", mm.why)
        with stof.hf.mask("causal"):
            mm = hook(2, 1, 13, q_offset=12, kv_offset=0, mask_function=mu.causal_mask_function)
        self.assertIn("stof.hf.mask spec", mm.why)

    def test_gemma2_softcap_passes_through(self):
        cfg = transformers.Gemma2Config(hidden_size=128, intermediate_size=256,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                        num_hidden_layers=2, vocab_size=500, sliding_window=8,
                                        attn_logit_softcapping=50.0, query_pre_attn_scalar=32)
        model = transformers.Gemma2ForCausalLM(cfg).eval()
        ids = torch.randint(0, 500, (1, 20))
        with torch.no_grad(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _backend._said.clear()
            model.set_attn_implementation("eager")     # sdpa has no softcap
            want = model(input_ids=ids)
            model.set_attn_implementation("stof")
            got = model(input_ids=ids)
        self.assertEqual([str(x.message) for x in w if "stof.hf" in str(x.message)], [])
        self.assertEqual([(c["kv_heads"], c["softcap"]) for c in self.kernel.calls],
                         [(2, 50.0)] * 2)
        self.close(got.logits, want.logits)

    def test_gemma2_steps_take_softcap_and_windows(self):
        """Gemma-2's hybrid cache: sliding layers step with their window, full
        ones causal, both with the softcap; tokens and logits as eager's."""
        cfg = transformers.Gemma2Config(hidden_size=128, intermediate_size=256,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                        num_hidden_layers=2, vocab_size=500, sliding_window=8,
                                        attn_logit_softcapping=50.0, query_pre_attn_scalar=32)
        model = transformers.Gemma2ForCausalLM(cfg).eval()
        ids = torch.randint(0, 500, (1, 11))
        got, want, said = self.generate_both(model, ids, 8, sdpa="eager")
        self.assertEqual(said, [])
        self.assertEqual(sorted({(c["window"], c["softcap"]) for c in self.decode.calls}),
                         [(0, 50.0), (8, 50.0)])

    def test_optimize_refuses_training_mode(self):
        cfg = transformers.BertConfig(hidden_size=64, num_attention_heads=1, num_hidden_layers=1,
                                      intermediate_size=128)
        model = transformers.BertModel(cfg).train()
        with self.assertRaises(stof.UnsupportedError) as e:
            stof.hf.optimize(model)
        self.assertIn("training mode", str(e.exception))
        self.assertIn("model.eval()", str(e.exception))

    def test_optimize_keeps_cpu_layers_saying_why(self):
        cfg = transformers.BertConfig(hidden_size=64, num_attention_heads=1, num_hidden_layers=2,
                                      intermediate_size=128)
        model = stof.hf.optimize(transformers.BertModel(cfg).eval())
        self.assertEqual(model.stof_swapped, [])
        self.assertEqual([n for n, _ in model.stof_kept], ["encoder.layer.0", "encoder.layer.1"])
        self.assertIn("CUDA", model.stof_kept[0][1])
        self.assertEqual(model.config._attn_implementation, "stof")


class _FakeLayer:
    """A stof.EncoderLayer's call, answered by the HF layer's own code with
    the mask the call names."""

    def __init__(self, layer):
        p = next(layer.parameters())
        self.dtype, self.device, self.calls = p.dtype, p.device, []
        self.hf = lambda x, m: type(layer).forward(layer, x, m)

    def __call__(self, x, seq_lens=None, mask=None):
        self.calls.append((mask, None if seq_lens is None else seq_lens.tolist()))
        n = x.shape[1]
        m = mask if isinstance(mask, stof.Mask) else stof.Mask(mask, n)
        allowed = m.to_dense("torch")[None, None].repeat(x.shape[0], 1, 1, 1)
        if seq_lens is not None:
            for i, k in enumerate(seq_lens.tolist()):
                allowed[i, :, :, k:] = False
        with warnings.catch_warnings():     # its attention falls back to sdpa: on the CPU
            warnings.simplefilter("ignore")
            return self.hf(x, allowed)


class _FakeDecoderLayer:
    """A stof.DecoderLayer's call, answered by the HF layer's own code under
    a causal mask, rotating by the positions it was given."""

    def __init__(self, layer, rotary):
        p = next(layer.parameters())
        self.dtype, self.device, self.window, self.calls = p.dtype, p.device, 0, []
        self.layer, self.rotary = layer, rotary

    def __call__(self, x, positions=None):
        n = x.shape[1]
        pos = torch.arange(n)[None] if positions is None else positions
        self.calls.append(pos[0].tolist())
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        with warnings.catch_warnings():     # its attention falls back to sdpa: on the CPU
            warnings.simplefilter("ignore")
            return type(self.layer).forward(self.layer, x, attention_mask=causal,
                                            position_ids=pos,
                                            position_embeddings=self.rotary(x, pos))


@needs_hf
class Swap(unittest.TestCase):
    def test_decoder_swap_runs_a_forward_with_no_cache(self):
        """optimize's decoder swap on the CPU, stof.DecoderLayer stood in
        for: a use_cache=False forward runs it with the positions and the
        same logits; one with a cache to fill, or with padding, runs HF's
        layer code and says why once."""
        from stof.hf import _optimize
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       num_hidden_layers=2, vocab_size=500)
        torch.manual_seed(7)
        model = transformers.LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 500, (2, 24))
        with torch.no_grad():
            want = model(input_ids=ids, use_cache=False).logits
        model.set_attn_implementation("stof")
        fakes = [_FakeDecoderLayer(layer, model.model.rotary_emb) for layer in model.model.layers]
        for layer, fake in zip(model.model.layers, fakes):
            _optimize._swap_decoder(layer, fake)
        with torch.no_grad(), stof.hf.mask(None):
            got = model(input_ids=ids, use_cache=False).logits
        self.assertEqual([f.calls for f in fakes], [[list(range(24))]] * 2)
        self.assertLess(((got - want).norm() / want.norm()).item(), 1e-5)
        am = torch.ones_like(ids)
        am[1, 20:] = 0
        for kw, said in ((dict(), "KV cache to fill"),
                         (dict(attention_mask=am, use_cache=False), "padding")):
            with warnings.catch_warnings(record=True) as w, torch.no_grad():
                warnings.simplefilter("always")
                _backend._said.clear()
                model(input_ids=ids, **kw)
            self.assertEqual([len(f.calls) for f in fakes], [1, 1])
            self.assertTrue(any(said in str(x.message) for x in w), [str(x.message) for x in w])


    def test_swapped_forward_takes_the_model_mask(self):
        """optimize's swap on the CPU, stof.EncoderLayer stood in for: the
        layer gets the spec and seq_lens, HF's hooks still see its output,
        and a call it cannot take (gradients wanted) runs HF's code."""
        from stof.hf import _optimize
        cfg = transformers.BertConfig(hidden_size=128, num_attention_heads=2, num_hidden_layers=2,
                                      intermediate_size=256)
        torch.manual_seed(7)
        model = transformers.BertModel(cfg).eval()
        ids = torch.randint(0, 1000, (2, 40))
        am = torch.ones(2, 40, dtype=torch.long)
        am[1, 25:] = 0
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=am).last_hidden_state
        model.set_attn_implementation("stof")
        fakes = [_FakeLayer(layer) for layer in model.encoder.layer]
        for layer, fake in zip(model.encoder.layer, fakes):
            _optimize._swap(layer, fake)
        with torch.no_grad(), stof.hf.mask(None):
            out = model(input_ids=ids, attention_mask=am, output_hidden_states=True)
        self.assertEqual([f.calls for f in fakes], [[("dense", [40, 25])]] * 2)
        self.assertEqual(len(out.hidden_states), 3)
        for i, n in enumerate([40, 25]):
            got, ref = out.last_hidden_state[i, :n], want[i, :n]
            self.assertLess(((got - ref).norm() / ref.norm()).item(), 1e-5)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _backend._said.clear()
            model(input_ids=ids)
        self.assertEqual(len(fakes[0].calls), 1)
        self.assertTrue(any("gradients wanted" in str(x.message) for x in w))
        again = [_FakeLayer(layer) for layer in model.encoder.layer]
        for layer, fake in zip(model.encoder.layer, again):     # as optimize called twice
            _optimize._swap(layer, fake)
        with torch.no_grad():
            model(input_ids=ids)
        self.assertEqual([len(f.calls) for f in fakes + again], [1, 1, 1, 1])


@needs_hf
class LayerWeights(unittest.TestCase):
    def test_vit_weights_compute_the_layer(self):
        """vit_weights' dict, run as src/stof.h's PRE_LN layer in float32,
        gives what ViTLayer does."""
        from stof.hf._optimize import vit_weights
        for qkv_bias in (True, False):
            cfg = transformers.ViTConfig(hidden_size=64, num_attention_heads=2,
                                         intermediate_size=128, qkv_bias=qkv_bias)
            layer = transformers.ViTModel(cfg).layers[0].eval()
            w, heads, found = vit_weights(layer)
            self.assertEqual((heads, found["norm"], found["activation"]), (2, "pre_ln", "gelu"))
            x = torch.randn(2, 9, 64)
            with torch.no_grad():
                want = layer(x)
                e = 64

                def ln(t, g, b):
                    return F.layer_norm(t, (e,), g, b, found["eps"])
                a = ln(x, w["ln1_g"], w["ln1_b"])
                q, k, v = F.linear(a, w["qkv_w"], w["qkv_b"]).view(2, 9, 3, heads, e // heads) \
                    .permute(2, 0, 3, 1, 4).unbind(0)
                o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 9, e)
                h = x + F.linear(o, w["o_w"], w["o_b"])
                f = F.linear(F.gelu(F.linear(ln(h, w["ln2_g"], w["ln2_b"]), w["ff1_w"],
                                             w["ff1_b"])), w["ff2_w"], w["ff2_b"])
                got = h + f
            self.assertLess(((got - want).norm() / want.norm()).item(), 1e-5)


if __name__ == "__main__":
    unittest.main()
