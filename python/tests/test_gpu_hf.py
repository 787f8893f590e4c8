"""The GPU suite of stof.hf: tiny transformers models built from configs
(random weights, nothing fetched), run in float16 with the "stof" attention
and with stof.hf.optimize, against the same weights in float32 under HF's
sdpa on every real token (relative L2 5e-3, as the C suites). Covers
padding masks (seq_lens), sliding-window configs, a 4-D mask, the user's
spec, optimize on BERT and ViT under no_grad and inference_mode, the
refusal of training mode, grouped KV heads and Gemma-2's softcap run by
stof, generate() through stof.decode (DynamicCache, StaticCache, a sliding
window; the same greedy tokens as sdpa, each step's logits close), the fall
back to sdpa (left padding), sentence-transformers, and accelerate across two GPUs. Where
torch, a GPU, transformers, sentence-transformers or a second GPU is
missing, the test says so and is skipped.

    STOF_LIB=build/libstof.so python3 -m unittest discover -s python/tests -p test_gpu_hf.py -v
"""
import copy
import os
import random
import tempfile
import unittest
import warnings

from _util import stof, torch_cuda

torch = torch_cuda()
SEED = int(os.environ.get("STOF_SEED", random.randrange(1 << 30)))
TOL = 5e-3
try:
    import transformers
    import stof.hf
    from stof.hf import _backend, _masks
    HF = None
except ImportError as e:
    HF = str(e)


def setUpModule():
    why = None
    if torch is None:
        why = "torch with a CUDA device is not here"
    elif HF is not None:
        why = "transformers is not installed (%s)" % HF
    if why:
        print("\ntest_gpu_hf: the stof.hf GPU suite was NOT run: %s" % why)
        raise unittest.SkipTest(why)
    print("\ntest_gpu_hf: seed %d (set STOF_SEED to replay); %s; torch %s; transformers %s"
          % (SEED, torch.cuda.get_device_name(), torch.__version__, transformers.__version__))


# A small decoder model's config: GQA 4 on 2, head_dim 64, two layers.
SMALL_DECODER = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                     num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000)


def bert(layers=2, hidden=256, heads=4, cls=None):
    cfg = transformers.BertConfig(hidden_size=hidden, num_attention_heads=heads,
                                  num_hidden_layers=layers, intermediate_size=4 * hidden,
                                  max_position_embeddings=2048)
    torch.manual_seed(SEED)
    return (cls or transformers.BertModel)(cfg).eval()


def pair(model):
    """(the model in float16 on cuda:0, a float32 copy under sdpa)."""
    ref = copy.deepcopy(model).float().cuda()
    ref.set_attn_implementation("sdpa")
    return model.half().cuda(), ref


def rel_l2(got, want):
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm()).item()


def real_rows(t, am):
    """The rows of real tokens, flattened: [sum of lengths, hidden]."""
    return t[am.bool().to(t.device)]


class Quiet:
    """Records stof.hf's warnings; .said lists them."""

    def __enter__(self):
        _backend._said.clear()
        self.cm = warnings.catch_warnings(record=True)
        self.w = self.cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.cm.__exit__(*exc)
        self.said = [str(x.message) for x in self.w if "stof.hf" in str(x.message)]
        return False


class Backend(unittest.TestCase):
    def check(self, got, want, name, am=None):
        if am is not None:
            got, want = real_rows(got, am), real_rows(want, am)
        err = rel_l2(got, want)
        print("stof.hf %-52s rel L2 %.2e" % (name, err))
        self.assertLessEqual(err, TOL, name)

    def test_compiled_model_still_runs_stof(self):
        """torch.compile(model) under the "stof" attention: the compiled
        forward launches stof's attention kernels (seen by the profiler),
        not sdpa by a fallback or by a trace that left stof out."""
        model, ref = pair(bert(layers=2))
        model.set_attn_implementation("stof")
        ids = torch.randint(0, 1000, (2, 256), device="cuda")
        compiled = torch.compile(model)
        with torch.no_grad(), Quiet() as q:
            compiled(input_ids=ids)                     # traces and compiles
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                got = compiled(input_ids=ids).last_hidden_state
                torch.cuda.synchronize()
            want = ref(input_ids=ids).last_hidden_state
        names = sorted({e.key for e in prof.key_averages()})
        ours = [n for n in names if n.startswith("stof_attn")]
        print("stof.hf torch.compile(BertModel): kernels %s; said %s" % (ours, q.said))
        self.assertEqual(q.said, [])
        self.assertTrue(ours, names[:30])
        self.check(got, want, "BERT-shaped, torch.compile(model)")

    def test_packed_sequences_as_varlen(self):
        """position_ids restarting with no attention_mask (packed documents,
        as HF detects them): stof's varlen form, causal within each; the
        logits as fp32 sdpa's within the fp16 tolerance, nothing said."""
        cfg = transformers.LlamaConfig(**SMALL_DECODER)
        torch.manual_seed(SEED)
        model, ref = pair(transformers.LlamaForCausalLM(cfg).eval())
        model.set_attn_implementation("stof")
        lens = [100, 37, 250, 13]
        pos = torch.cat([torch.arange(n) for n in lens])[None].cuda()
        ids = torch.randint(0, 1000, (1, sum(lens)), device="cuda")
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            want = ref(input_ids=ids, position_ids=pos, use_cache=False).logits
        self.assertEqual(q.said, [])
        self.check(got, want, "Llama-shaped, 4 packed sequences (varlen)")

    def test_padding_as_seq_lens(self):
        model, ref = pair(bert())
        model.set_attn_implementation("stof")
        ids = torch.randint(0, 1000, (3, 333), device="cuda")
        am = torch.ones(3, 333, dtype=torch.long, device="cuda")
        am[1, 200:] = 0
        am[2, 17:] = 0
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids, attention_mask=am).last_hidden_state
            want = ref(input_ids=ids, attention_mask=am).last_hidden_state
        self.assertEqual(q.said, [])            # stof ran every call
        self.check(got, want, "BERT, padding as seq_lens", am)
        left = am.flip(1)
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids, attention_mask=left).last_hidden_state
            want = ref(input_ids=ids, attention_mask=left).last_hidden_state
        self.assertTrue(any("left padding" in s for s in q.said), q.said)
        self.check(got, want, "BERT, left padding (sdpa, said once)", left)

    def test_sliding_window_config(self):
        cfg = transformers.MistralConfig(hidden_size=256, intermediate_size=512,
                                         num_attention_heads=4, num_key_value_heads=4,
                                         num_hidden_layers=2, sliding_window=64, vocab_size=1000)
        torch.manual_seed(SEED)
        model, ref = pair(transformers.MistralModel(cfg).eval())
        model.set_attn_implementation("stof")
        ids = torch.randint(0, 1000, (2, 300), device="cuda")
        am = torch.ones(2, 300, dtype=torch.long, device="cuda")
        am[1, 250:] = 0
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids, attention_mask=am).last_hidden_state
            want = ref(input_ids=ids, attention_mask=am).last_hidden_state
        self.assertEqual(q.said, [])
        self.assertTrue(any("causal_window:64" in str(k) for k, _ in stof.plans()))
        self.check(got, want, "Mistral-shaped, sliding_window 64, padding", am)

    def test_4d_mask_and_own_spec(self):
        model, ref = pair(bert())
        model.set_attn_implementation("stof")
        n = 512
        spec = "window:64+global:16"
        allowed = stof.Mask(spec, n).to_dense("torch", "cuda")[None, None]
        ids = torch.randint(0, 1000, (2, n), device="cuda")
        with torch.no_grad(), Quiet() as q:
            want = ref(input_ids=ids, attention_mask=allowed).last_hidden_state
            got = model(input_ids=ids, attention_mask=allowed).last_hidden_state
            made = len(_masks._by_content)
            again = model(input_ids=ids, attention_mask=allowed.clone()).last_hidden_state
            self.assertEqual(len(_masks._by_content), made)      # the same Mask, kept
            with stof.hf.mask(spec):
                own = model(input_ids=ids).last_hidden_state
        self.assertEqual(q.said, [])
        self.check(got, want, "BERT, a 4-D boolean mask")
        self.check(again, want, "BERT, the same 4-D mask again")
        self.check(own, want, "BERT, stof.hf.mask(%r)" % spec)

    def test_gqa_runs(self):
        cfg = transformers.LlamaConfig(**SMALL_DECODER)
        torch.manual_seed(SEED)
        model, ref = pair(transformers.LlamaForCausalLM(cfg).eval())
        model.set_attn_implementation("stof")
        ids = torch.randint(0, 1000, (1, 100), device="cuda")
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids).logits
            want = ref(input_ids=ids).logits
        self.assertEqual(q.said, [])                  # k and v's 2 heads go to stof as they are
        self.check(got, want, "Llama-shaped GQA (4 on 2 KV heads)")

    def generate_pair(self, model, ids, n, name, attention_mask=None, **kw):
        """generate() greedy under "stof" and "sdpa" on the same float16
        model: the same tokens, each step's logits close; returns what
        stof.hf said."""
        with torch.no_grad(), Quiet() as q:
            outs = []
            for impl in ("sdpa", "stof"):
                model.set_attn_implementation(impl)
                outs.append(model.generate(ids, attention_mask=attention_mask, max_new_tokens=n,
                                           min_new_tokens=n, do_sample=False, pad_token_id=0,
                                           return_dict_in_generate=True, output_logits=True,
                                           **kw))
        want, got = outs
        same = (got.sequences == want.sequences).all(0).sum().item() - ids.shape[1]
        print("stof.hf generate() %s: %d of %d new tokens as sdpa's" % (name, same, n))
        self.assertTrue(torch.equal(got.sequences, want.sequences), name)
        for i, (a, b) in enumerate(zip(got.logits, want.logits)):
            self.check(a, b, "%s, step %d's logits" % (name, i))
        return q.said

    def test_generate_decodes_through_stof(self):
        """generate()'s steps through stof.decode: a DynamicCache, a
        StaticCache (seqused_k), 16 new tokens, GQA; one decode plan."""
        cfg = transformers.LlamaConfig(**SMALL_DECODER)
        torch.manual_seed(SEED)
        model = transformers.LlamaForCausalLM(cfg).eval().half().cuda()
        # Token 0 is the pad_token_id: generate() with no attention_mask
        # takes a 0 in the prompt for padding (left padding: sdpa's calls).
        ids = torch.randint(1, 1000, (2, 100), device="cuda")
        n0 = len(stof.decode_plans())
        said = self.generate_pair(model, ids, 16, "Llama-shaped, DynamicCache")
        self.assertEqual(said, [])
        self.assertEqual(len(stof.decode_plans()), n0 + 1)      # every step, one plan
        said = self.generate_pair(model, ids, 16, "Llama-shaped, StaticCache",
                                  cache_implementation="static", disable_compile=True)
        self.assertEqual([s for s in said if "decoding" in s or "step" in s], [])
        am = torch.ones_like(ids)
        am[1, :30] = 0                                          # left padding: sdpa, said once
        said = self.generate_pair(model, ids, 8, "Llama-shaped, left padding",
                                  attention_mask=am)
        self.assertTrue(any("left padding" in s for s in said), said)

    def test_generate_sliding_window(self):
        cfg = transformers.MistralConfig(hidden_size=256, intermediate_size=512,
                                         num_attention_heads=4, num_key_value_heads=1,
                                         num_hidden_layers=2, sliding_window=64, vocab_size=1000)
        torch.manual_seed(SEED)
        model = transformers.MistralForCausalLM(cfg).eval().half().cuda()
        ids = torch.randint(1, 1000, (1, 57), device="cuda")    # no pad token (0); the window
                                                                # fills mid-generation
        said = self.generate_pair(model, ids, 16, "Mistral-shaped, sliding_window 64, MQA")
        self.assertEqual(said, [])
        self.assertTrue(any(k[9] == 64 for k, _ in stof.decode_plans()))    # the window

    def test_gemma2_softcap(self):
        """Gemma-2's logit softcap (50) and its sliding-window layers, on
        grouped KV heads, against the eager attention in float32 (sdpa has
        no softcap)."""
        cfg = transformers.Gemma2Config(hidden_size=256, intermediate_size=512,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=64, num_hidden_layers=2, vocab_size=1000,
                                        sliding_window=64, attn_logit_softcapping=50.0,
                                        query_pre_attn_scalar=64)
        torch.manual_seed(SEED)
        model = transformers.Gemma2ForCausalLM(cfg).eval()
        ref = copy.deepcopy(model).float().cuda()
        ref.set_attn_implementation("eager")
        model = model.half().cuda()
        model.set_attn_implementation("stof")
        ids = torch.randint(0, 1000, (1, 150), device="cuda")
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids).logits
            want = ref(input_ids=ids).logits
        self.assertEqual(q.said, [])
        self.check(got, want, "Gemma-2-shaped softcap 50, window 64, GQA")


class Optimize(unittest.TestCase):
    def test_decoders(self):
        """Llama (GQA), Mistral (sliding window 64) and Qwen2 (q/k/v biases)
        swapped for stof.DecoderLayer: a use_cache=False forward runs them,
        logits within the fp16 tolerance of the fp32 model; a forward with a
        cache keeps HF's layers (and the "stof" attention), said once."""
        for name, cfg in (("Llama", transformers.LlamaConfig(**SMALL_DECODER)),
                          ("Mistral", transformers.MistralConfig(sliding_window=64,
                                                                 **SMALL_DECODER)),
                          ("Qwen2", transformers.Qwen2Config(**SMALL_DECODER))):
            torch.manual_seed(SEED)
            arch = {"Llama": transformers.LlamaForCausalLM,
                    "Mistral": transformers.MistralForCausalLM,
                    "Qwen2": transformers.Qwen2ForCausalLM}[name]
            model, ref = pair(arch(cfg).eval())
            stof.hf.optimize(model)
            self.assertEqual(model.stof_swapped, ["model.layers.0", "model.layers.1"], name)
            ids = torch.randint(0, 1000, (2, 333), device="cuda")
            with torch.no_grad(), Quiet() as q:
                got = model(input_ids=ids, use_cache=False).logits
                want = ref(input_ids=ids, use_cache=False).logits
            self.assertEqual(q.said, [], name)
            err = rel_l2(got, want)
            print("stof.hf optimize %-8s use_cache=False rel L2 %.2e" % (name, err))
            self.assertLessEqual(err, TOL, name)
            with torch.no_grad(), Quiet() as q:
                got = model(input_ids=ids).logits
            self.assertTrue(any("KV cache to fill" in s for s in q.said), q.said)
            self.assertLessEqual(rel_l2(got, want), TOL, name)

    def test_bert(self):
        model, ref = pair(bert(layers=3))
        stof.hf.optimize(model)
        self.assertEqual(model.stof_swapped, ["encoder.layer.%d" % i for i in range(3)])
        self.assertEqual(model.stof_kept, [])
        ids = torch.randint(0, 1000, (4, 384), device="cuda")
        am = torch.ones(4, 384, dtype=torch.long, device="cuda")
        am[2, 300:] = 0
        for grad in (torch.no_grad, torch.inference_mode):
            with grad(), Quiet() as q:
                got = model(input_ids=ids, attention_mask=am).last_hidden_state
                want = ref(input_ids=ids, attention_mask=am).last_hidden_state
            self.assertEqual(q.said, [])
            err = rel_l2(real_rows(got, am), real_rows(want, am))
            print("stof.hf optimize BERT under %-20s rel L2 %.2e" % (grad.__name__, err))
            self.assertLessEqual(err, TOL)
        with torch.no_grad():
            hs = model(input_ids=ids, attention_mask=am, output_hidden_states=True).hidden_states
        self.assertEqual(len(hs), 4)            # the layers' hooks still see them
        spec = "window:128+global:32"
        stof.hf.optimize(model, mask=spec)       # again: the layers made afresh
        self.assertEqual(len(model.stof_swapped), 3)
        allowed = stof.Mask(spec, 384).to_dense("torch", "cuda")[None, None]
        with torch.no_grad():
            got = model(input_ids=ids).last_hidden_state
            want = ref(input_ids=ids, attention_mask=allowed).last_hidden_state
        err = rel_l2(got, want)
        print("stof.hf optimize BERT mask=%-22r rel L2 %.2e" % (spec, err))
        self.assertLessEqual(err, TOL)
        stof.hf.mask(None, model=model)

    def test_vit(self):
        cfg = transformers.ViTConfig(hidden_size=256, num_attention_heads=4, num_hidden_layers=2,
                                     intermediate_size=1024, image_size=224, patch_size=16)
        torch.manual_seed(SEED)
        model, ref = pair(transformers.ViTModel(cfg).eval())
        stof.hf.optimize(model)
        self.assertEqual(model.stof_swapped, ["layers.0", "layers.1"])
        px = torch.randn(2, 3, 224, 224, device="cuda")
        with torch.inference_mode(), Quiet() as q:
            got = model(pixel_values=px.half()).last_hidden_state
            want = ref(pixel_values=px).last_hidden_state
            with stof.hf.mask("window:32+global:1"):
                local = model(pixel_values=px.half()).last_hidden_state
        self.assertEqual(q.said, [])
        err = rel_l2(got, want)
        print("stof.hf optimize ViT 224 (197 tokens)                   rel L2 %.2e" % err)
        self.assertLessEqual(err, TOL)
        self.assertGreater(rel_l2(local, want), TOL)     # the window did change the result

    def test_training_mode_refused(self):
        model = bert(layers=1).half().cuda().train()
        with self.assertRaises(stof.UnsupportedError) as cm:
            stof.hf.optimize(model)
        self.assertIn("training mode", str(cm.exception))

    def test_sentence_transformers(self):
        try:
            import sentence_transformers as st
        except ImportError:
            self.skipTest("sentence_transformers is not installed")
        with tempfile.TemporaryDirectory() as d:
            words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["w%d" % i for i in range(200)]
            with open(os.path.join(d, "vocab.txt"), "w") as f:
                f.write("\n".join(words) + "\n")
            transformers.BertTokenizerFast(os.path.join(d, "vocab.txt")).save_pretrained(d)
            bert(layers=2).save_pretrained(d)
            # A folder of a plain BertModel: sentence-transformers adds mean pooling.
            model = st.SentenceTransformer(d, device="cuda", model_kwargs={"dtype": torch.float16})
            model.eval()
            rng = random.Random(SEED)
            texts = [" ".join("w%d" % rng.randrange(200) for _ in range(rng.randrange(5, 120)))
                     for _ in range(16)]
            want = model.encode(texts, convert_to_tensor=True, batch_size=8)
            stof.hf.optimize(model)
            self.assertEqual(len(model.stof_swapped), 2)
            got = model.encode(texts, convert_to_tensor=True, batch_size=8)
        err = rel_l2(got, want)
        print("stof.hf optimize SentenceTransformer (BERT) embeddings rel L2 %.2e" % err)
        self.assertLessEqual(err, TOL)

    def test_accelerate_two_gpus(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("one GPU here: accelerate across two GPUs needs two")
        try:
            from accelerate import dispatch_model
        except ImportError:
            self.skipTest("accelerate is not installed")
        model, ref = pair(bert(layers=4))
        model = model.cpu()
        dmap = {"embeddings": 0, "encoder.layer.0": 0, "encoder.layer.1": 0,
                "encoder.layer.2": 1, "encoder.layer.3": 1, "pooler": 1}
        model = dispatch_model(model, device_map=dmap)
        stof.hf.optimize(model)
        self.assertEqual(len(model.stof_swapped), 4)
        self.assertEqual({str(model.encoder.layer[i].stof_layer.device) for i in (0, 3)},
                         {"cuda:0", "cuda:1"})
        ids = torch.randint(0, 1000, (2, 256), device="cuda:0")
        am = torch.ones(2, 256, dtype=torch.long, device="cuda:0")
        am[1, 100:] = 0
        with torch.no_grad(), Quiet() as q:
            got = model(input_ids=ids, attention_mask=am).last_hidden_state
            want = ref(input_ids=ids, attention_mask=am).last_hidden_state
        self.assertEqual(q.said, [])
        err = rel_l2(real_rows(got.to("cuda:0"), am), real_rows(want, am))
        print("stof.hf optimize BERT over two GPUs (accelerate)         rel L2 %.2e" % err)
        self.assertLessEqual(err, TOL)


if __name__ == "__main__":
    unittest.main()
