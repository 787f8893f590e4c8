"""stof.EncoderLayer without a GPU: the weight mappings from torch's
TransformerEncoderLayer and Hugging Face's BertLayer, checked by running
stof.h's layer (the suites' torch reference) on the mapped weights against
the module's own forward on the CPU; activations; refusals."""
import unittest

from _util import stof

try:
    import torch
    import _ref
except ImportError:
    torch = None


@unittest.skipIf(torch is None, "torch is not installed")
class LayerMapping(unittest.TestCase):
    def check(self, module, w, heads, found, allowed=None, run=None):
        torch.manual_seed(1)
        x = torch.randn(2, 24, module_hidden(w))
        with torch.no_grad():
            want = run(module, x, allowed)
            got = _ref.layer(x, w, heads, found["activation"], found["norm"], found["eps"],
                             allowed)
        self.assertLess(_ref.rel_l2(got, want), 1e-5)

    def test_transformer_encoder_layer(self):
        from stof._layer import transformer_encoder_layer_weights
        for norm_first, act in ((False, "relu"), (True, "gelu")):
            m = torch.nn.TransformerEncoderLayer(64, 4, 96, dropout=0.0, activation=act,
                                                 batch_first=True, norm_first=norm_first).eval()
            w, heads, found = transformer_encoder_layer_weights(m)
            self.assertEqual((heads, found["activation"], found["norm"]),
                             (4, act, "pre_ln" if norm_first else "post_ln"))
            allowed = stof.Mask("window:8+global:2", 24).to_dense("torch")

            def run(mod, x, allowed):
                return mod(x, src_mask=None if allowed is None else ~allowed)
            self.check(m, w, heads, found, None, run)
            self.check(m, w, heads, found, allowed, run)

    def test_bert_layer(self):
        try:
            import transformers  # noqa: F401
        except ImportError:
            self.skipTest("transformers is not installed")
        from stof._layer import bert_weights
        for act, want in (("gelu", "gelu"), ("gelu_new", "gelu_tanh"), ("relu", "relu")):
            m = _ref.bert_layer(64, 4, 128, act)
            w, heads, found = bert_weights(m)
            self.assertEqual((heads, found["activation"], found["norm"], found["eps"]),
                             (4, want, "post_ln", 1e-12))
            self.assertTrue(torch.equal(w["qkv_w"][64:128], m.attention.self.key.weight))
            allowed = stof.Mask("causal", 24).to_dense("torch")[None, None]
            self.check(m, w, heads, found, None, _ref.run_bert)
            self.check(m, w, heads, found, allowed, _ref.run_bert)

    def test_activations(self):
        from stof._layer import _activation_of
        F = torch.nn.functional
        self.assertEqual(_activation_of(F.relu), "relu")
        self.assertEqual(_activation_of(F.gelu), "gelu")
        self.assertEqual(_activation_of(torch.nn.GELU()), "gelu")
        self.assertEqual(_activation_of(torch.nn.GELU(approximate="tanh")), "gelu_tanh")
        self.assertEqual(_activation_of(torch.nn.ReLU()), "relu")
        with self.assertRaises(stof.UnsupportedError):
            _activation_of(torch.nn.SiLU())

    def test_refusals(self):
        m = torch.nn.TransformerEncoderLayer(64, 4, 96, batch_first=True)
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            stof.EncoderLayer.from_torch(m)       # its weights are on the CPU
        self.assertIn("CUDA device", str(cm.exception))
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            stof.EncoderLayer({"qkv_w": torch.zeros(3, 1)}, 1)
        self.assertIn("lack", str(cm.exception))
        with self.assertRaises(stof.UnsupportedError):
            stof.EncoderLayer.from_torch(torch.nn.Linear(2, 2))


def module_hidden(w):
    return w["qkv_w"].shape[1]


if __name__ == "__main__":
    unittest.main()
