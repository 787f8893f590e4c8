"""stof.DecoderLayer without a GPU: the settings' checks (no torch needed),
the reading of Hugging Face decoder layers' configs (Llama-3 scaling,
rope_parameters, Mistral's and Qwen2's sliding windows, Qwen2's biases) on
stand-in modules, what from_hf refuses, the C layer's desc checks through
the ctypes mirror, and, where torch and transformers are, the weight
mapping: stof.h's decoder layer (the suites' float64 reference) on the
mapped weights against the Hugging Face layer's own forward on the CPU."""
import unittest
from ctypes import byref
from types import SimpleNamespace as NS

from _util import stof
from stof import _decoder
from stof import _lib as L

try:
    import torch
    import transformers  # noqa: F401
    import _ref
    WHY = None
except ImportError as e:
    WHY = "torch or transformers is not installed (%s)" % e

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def weights(**drop):
    """Placeholders under every name: the settings are checked before any
    weight is looked at closer than its presence."""
    w = {n: object() for n in L.DECODER_WEIGHT_NAMES if n not in L.DECODER_BIAS_NAMES}
    for n in drop:
        w.pop(n, None)
    return w


def hf_layer(cls="LlamaDecoderLayer", bias=False, o_bias=False, eps=(1e-5, 1e-5), attn=None,
             **config):
    """A stand-in Hugging Face decoder layer: the attributes hf_settings reads."""
    cfg = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, rms_norm_eps=eps[0], rope_theta=500000.0,
               hidden_act="silu")
    cfg.update(config)
    c = NS(**{k: v for k, v in cfg.items() if v is not None})

    def lin(b):
        return NS(weight=object(), bias=object() if b else None)
    a = NS(config=c, layer_idx=0, head_dim=c.hidden_size // c.num_attention_heads,
           scaling=(c.hidden_size // c.num_attention_heads) ** -0.5,
           q_proj=lin(bias), k_proj=lin(bias), v_proj=lin(bias), o_proj=lin(o_bias))
    for k, v in (attn or {}).items():
        setattr(a, k, v)
    mlp = NS(gate_proj=lin(False), up_proj=lin(False), down_proj=lin(False))
    layer = type(cls, (), {})()
    layer.self_attn, layer.mlp = a, mlp
    layer.input_layernorm = NS(weight=object(), variance_epsilon=eps[0])
    layer.post_attention_layernorm = NS(weight=object(), variance_epsilon=eps[1])
    return layer


class Settings(unittest.TestCase):
    def refused(self, exc, text, *args, **kw):
        with self.assertRaises(exc) as cm:
            stof.DecoderLayer(*args, **kw)
        self.assertIn(text, str(cm.exception))

    def test_refusals_before_torch(self):
        I, U = stof.InvalidArgumentError, stof.UnsupportedError
        self.refused(I, "heads", weights(), 0)
        self.refused(I, "kv_heads 3 must divide heads 32", weights(), 32, 3)
        self.refused(I, "kv_heads", weights(), 32, True)
        self.refused(I, "eps", weights(), 32, eps=-1e-6)
        self.refused(I, "eps", weights(), 32, eps=float("nan"))
        self.refused(I, "rope_theta", weights(), 32, rope_theta=0)
        self.refused(I, "rope_theta", weights(), 32, rope_theta=float("inf"))
        self.refused(I, "rope_scaling must be None or a dict", weights(), 32, rope_scaling=8.0)
        self.refused(U, "'yarn'", weights(), 32, rope_scaling={"rope_type": "yarn"})
        self.refused(I, "lacks original_max_position_embeddings", weights(), 32,
                     rope_scaling=dict(LLAMA3, original_max_position_embeddings=None))
        self.refused(I, "rope_scaling['factor']", weights(), 32,
                     rope_scaling=dict(LLAMA3, factor=0.5))
        self.refused(I, "rope_scaling['high_freq_factor']", weights(), 32,
                     rope_scaling=dict(LLAMA3, high_freq_factor=1.0))
        self.refused(I, "rope_scaling['low_freq_factor']", weights(), 32,
                     rope_scaling=dict(LLAMA3, low_freq_factor=0))
        self.refused(I, "original_max_position_embeddings", weights(), 32,
                     rope_scaling=dict(LLAMA3, original_max_position_embeddings=0))
        self.refused(I, "window", weights(), 32, window=-1)
        self.refused(I, "window", weights(), 32, window=4096.0)
        self.refused(I, "tune", weights(), 32, tune="slow")
        self.refused(I, "weights must be a dict", [], 32)
        self.refused(I, "weights lack gate_proj, input_layernorm", weights(gate_proj=1,
                                                                          input_layernorm=1), 32)
        self.refused(I, "got only q_bias, k_bias", dict(weights(), q_bias=1, k_bias=2), 32)

    def test_rope_fields(self):
        self.assertEqual(_decoder.rope_fields(10000, None), {"rope_theta": 10000.0})
        f = _decoder.rope_fields(500000.0, dict(LLAMA3, rope_type="llama3",
                                                original_max_position_embeddings=8192.0))
        self.assertEqual(f, {"rope_theta": 500000.0, "rope_factor": 8.0,
                             "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                             "rope_original_max_positions": 8192})
        # Every field it fills is one of the desc's.
        desc_fields = {n for n, _ in L.DecoderDesc._fields_}
        self.assertLessEqual(set(f), desc_fields)


class HfSettings(unittest.TestCase):
    def test_llama3(self):
        s = _decoder.hf_settings(hf_layer(rope_scaling=dict(LLAMA3, rope_type="llama3")))
        self.assertEqual(s, {"heads": 32, "kv_heads": 8, "eps": 1e-5, "rope_theta": 500000.0,
                             "rope_scaling": LLAMA3, "window": 0})
        # A plain Llama-2 layer: no scaling, kv_heads from heads where unset.
        s = _decoder.hf_settings(hf_layer(num_key_value_heads=None, rope_theta=10000.0))
        self.assertEqual((s["kv_heads"], s["rope_theta"], s["rope_scaling"]), (32, 10000.0, None))

    def test_rope_parameters(self):
        # transformers 5 keeps theta and the scaling together, maybe per layer type.
        rp = dict(LLAMA3, rope_type="llama3", rope_theta=500000.0)
        s = _decoder.hf_settings(hf_layer(rope_theta=None, rope_parameters=rp))
        self.assertEqual((s["rope_theta"], s["rope_scaling"]), (500000.0, LLAMA3))
        s = _decoder.hf_settings(hf_layer(
            rope_theta=None, layer_types=["full_attention"],
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}}))
        self.assertEqual((s["rope_theta"], s["rope_scaling"]), (1e6, None))

    def test_windows(self):
        m = _decoder.hf_settings(hf_layer("MistralDecoderLayer", sliding_window=4096))
        self.assertEqual(m["window"], 4096)
        self.assertEqual(_decoder.hf_settings(hf_layer("MistralDecoderLayer"))["window"], 0)
        # Qwen2 before layer types: off unless use_sliding_window, and only
        # from max_window_layers on.
        q = dict(sliding_window=32768, max_window_layers=28)
        self.assertEqual(_decoder.hf_settings(hf_layer("Qwen2DecoderLayer",
                                                       use_sliding_window=False, **q))["window"], 0)
        self.assertEqual(_decoder.hf_settings(hf_layer("Qwen2DecoderLayer",
                                                       use_sliding_window=True, **q))["window"], 0)
        q["max_window_layers"] = 0
        self.assertEqual(_decoder.hf_settings(hf_layer("Qwen2DecoderLayer",
                                                       use_sliding_window=True, **q))["window"],
                         32768)
        # Layer types, and the attention's own sliding_window (Qwen2 now).
        self.assertEqual(_decoder.hf_settings(hf_layer(
            "Qwen2DecoderLayer", layer_types=["sliding_attention"], sliding_window=512,
            use_sliding_window=True))["window"], 512)
        self.assertEqual(_decoder.hf_settings(hf_layer(
            "Qwen2DecoderLayer", sliding_window=512, attn={"sliding_window": None}))["window"], 0)
        self.assertEqual(_decoder.hf_settings(hf_layer(
            "Qwen2DecoderLayer", attn={"sliding_window": 256}))["window"], 256)

    def test_qwen2_biases(self):
        layer = hf_layer("Qwen2DecoderLayer", bias=True, hidden_size=3584,
                         num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6)
        s = _decoder.hf_settings(layer)
        self.assertEqual((s["heads"], s["kv_heads"], s["rope_theta"]), (28, 4, 1e6))
        w = _decoder.hf_weights(layer)
        self.assertEqual(set(w), set(L.DECODER_WEIGHT_NAMES))
        self.assertIs(w["k_bias"], layer.self_attn.k_proj.bias)
        self.assertIs(w["post_attention_layernorm"], layer.post_attention_layernorm.weight)
        self.assertNotIn("q_bias", _decoder.hf_weights(hf_layer()))

    def test_refusals(self):
        U = stof.UnsupportedError
        cases = [(hf_layer("GemmaDecoderLayer"), "no decoder mapping for GemmaDecoderLayer"),
                 (hf_layer(hidden_act="gelu"), "hidden_act 'gelu'"),
                 (hf_layer(partial_rotary_factor=0.5), "partial_rotary_factor"),
                 (hf_layer(o_bias=True), "o_proj has a bias"),
                 (hf_layer(eps=(1e-5, 1e-6)), "eps differ"),
                 (hf_layer(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
                 (hf_layer(rope_scaling={"type": "linear", "factor": 2.0}), "'linear'"),
                 (hf_layer(attn={"scaling": 0.125 * 0.5}), "scaling"),
                 (hf_layer(attn={"head_dim": 96}), "head_dim 96")]
        for layer, text in cases:
            with self.assertRaises(U, msg=text) as cm:
                _decoder.hf_settings(layer)
            self.assertIn(text, str(cm.exception))
        layer = hf_layer(bias=True)
        layer.self_attn.v_proj.bias = None
        with self.assertRaises(U):
            _decoder.hf_settings(layer)


class CDesc(unittest.TestCase):
    """The mirror reaches the C layer's checks, which name the field."""

    def test_desc_checks(self):
        lib = L.lib()
        if lib.decoder_prepare is None:
            self.skipTest("%s predates the decoder layer" % lib.path)
        ctx = stof.Context(no_cache=True, arch="sm_90a")
        good = dict(batch=1, seq=333, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                    ffn_hidden=8192, dtype=L.BF16, eps=1e-5, rope_theta=500000.0,
                    rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                    rope_original_max_positions=8192, window=0)
        bad = [(dict(kv_heads=7), stof.InvalidArgumentError, "desc.kv_heads 7"),
               (dict(hidden=2000), stof.InvalidArgumentError, "desc.hidden 2000"),
               (dict(head_dim=48, hidden=32 * 48), stof.UnsupportedError, "desc.head_dim 48"),
               (dict(rope_theta=0.0), stof.InvalidArgumentError, "desc.rope_theta"),
               (dict(rope_factor=0.5), stof.InvalidArgumentError, "desc.rope_factor"),
               (dict(rope_high_freq_factor=1.0), stof.InvalidArgumentError,
                "desc.rope_high_freq_factor"),
               (dict(window=-1), stof.InvalidArgumentError, "window -1"),
               (dict(dtype=L.F16 - 1), stof.UnsupportedError, "desc.dtype"),
               (dict(eps=-1.0), stof.InvalidArgumentError, "desc.eps")]
        for change, exc, text in bad:
            d = L.DecoderDesc(**dict(good, **change))
            with ctx.lock:
                st = lib.decoder_prepare(ctx.handle, byref(d))
            self.assertNotEqual(st, 0, change)
            e = ctx.fail(st)
            self.assertIsInstance(e, exc, (change, str(e)))
            self.assertIn(text, str(e), change)

    def test_run_refuses_a_null_plan(self):
        lib = L.lib()
        if lib.decoder_run is None:
            self.skipTest("%s predates the decoder layer" % lib.path)
        self.assertEqual(lib.decoder_run(None, 16, 32, None, 0, 256, None), 1)


@unittest.skipIf(WHY is not None, WHY or "")
class Mapping(unittest.TestCase):
    """hf_settings and hf_weights on real Hugging Face layers: stof.h's
    layer (float64, from the mapped weights and settings) against the
    layer's own float32 forward on the CPU."""

    def check(self, kind, positions=None, rope_scaling=None, window=None, **kw):
        m = _ref.hf_decoder_layer(kind, 64, 4, 2, 96, rope_scaling=rope_scaling, window=window,
                                  **kw)
        s = _decoder.hf_settings(m)
        self.assertEqual((s["heads"], s["kv_heads"], s["window"]), (4, 2, window or 0))
        self.assertEqual(s["rope_scaling"], rope_scaling)
        w = _decoder.hf_weights(m)
        torch.manual_seed(2)
        x = torch.randn(2, 37, 64)
        with torch.no_grad():
            want = _ref.run_hf_decoder(m, x, positions, s["window"])
            got = _ref.decoder(x, w, s["heads"], s["kv_heads"], s["eps"], s["rope_theta"],
                               s["rope_scaling"], s["window"], positions)
        err = _ref.rel_l2(got, want)
        # HF's angles are float32 (position x inv_freq): 1e-4 rad at
        # position 2000. A wrong mapping is off by far more.
        self.assertLess(err, 1e-3, "%s positions %s: rel L2 %.2e" % (kind, positions, err))

    def test_llama(self):
        self.check("llama", rope_theta=500000.0)
        self.check("llama", positions=1000, rope_theta=500000.0, rope_scaling=dict(LLAMA3))

    def test_mistral_window(self):
        self.check("mistral", positions=5, window=8, rope_theta=1e6)

    def test_qwen2_biases_and_positions(self):
        pos = torch.randint(0, 2000, (2, 37), dtype=torch.int32)
        self.check("qwen2", positions=pos, rope_theta=1e6)

    def test_cpu_weights_refused(self):
        m = _ref.hf_decoder_layer("llama", 64, 4, 2, 96)
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            stof.DecoderLayer.from_hf(m)          # its weights are on the CPU
        self.assertIn("CUDA device", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
