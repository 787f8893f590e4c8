"""stof.attention's checks, all made before anything is launched: shapes,
dtypes, devices, memory orders, masks, packed QKV, on fake CUDA arrays (and on
torch tensors where torch is installed); a call that passes them reaches the
library, which on a machine with no GPU says so."""
import unittest

from _util import FakeCuda, contiguous_strides, has_gpu, stof


def arr(shape, typestr="<f2", strides=None, ptr=0x7f0000000000):
    return FakeCuda(shape, typestr, strides, ptr)


class AttentionChecks(unittest.TestCase):
    def setUp(self):
        stof.clear_plans()

    def tearDown(self):
        self.assertEqual(stof.plans(), [])   # nothing planned on a failed call
        stof.clear_plans()

    def fails(self, cls, text, *args, **kw):
        with self.assertRaises(cls) as cm:
            stof.attention(*args, **kw)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def test_shapes(self):
        q = arr((2, 4, 128, 64))
        self.fails(stof.InvalidArgumentError, "4-D", arr((4, 128, 64)), q, q)
        self.fails(stof.InvalidArgumentError, "must match q's", q, arr((3, 4, 128, 64)), q)
        self.fails(stof.InvalidArgumentError, "must match q's", q, arr((2, 4, 128, 32)), q)
        self.fails(stof.InvalidArgumentError, "same length", q, q, arr((2, 4, 96, 64)))
        # grouped KV heads: k and v with one number of heads that divides q's
        kv3, kv2 = arr((2, 3, 128, 64)), arr((2, 2, 128, 64))
        self.fails(stof.InvalidArgumentError, "divides q's 4 (grouped KV heads), got 3 and 3",
                   q, kv3, kv3)
        self.fails(stof.InvalidArgumentError, "divides q's 4 (grouped KV heads), got 2 and 4",
                   q, kv2, q)
        self.fails(stof.InvalidArgumentError, "divides q's 4", q, arr((2, 8, 128, 64)),
                   arr((2, 8, 128, 64)))
        self.fails(stof.InvalidArgumentError, "layout", q, q, q, layout="bhdl")

    def test_dtypes(self):
        q = arr((2, 4, 128, 64))
        f32 = arr((2, 4, 128, 64), "<f4")
        self.fails(stof.UnsupportedError, "float16 or bfloat16", f32, f32, f32)
        self.fails(stof.UnsupportedError, "float16 or bfloat16", q, q, f32)

    def test_strides(self):
        shape = (2, 4, 128, 64)
        every_other = tuple(2 * s for s in contiguous_strides(shape))
        q = arr(shape, strides=every_other)
        self.fails(stof.InvalidArgumentError, "contiguous in one of BHLD or BLHD", q, q, q)
        self.fails(stof.InvalidArgumentError, "not whole elements",
                   arr(shape, strides=(1, 1, 1, 1)), q, q)

    def test_masks(self):
        q = arr((2, 4, 128, 64))
        self.fails(stof.InvalidArgumentError, "at column", q, q, q, mask="window:3")
        self.fails(stof.InvalidArgumentError, "100 x 100", q, q, q, mask=stof.Mask("causal", 100))
        self.fails(stof.InvalidArgumentError, "spec str or a stof.Mask", q, q, q, mask=3)

    def test_softcap(self):
        q = arr((2, 4, 128, 64))
        for bad in (-1.0, float("nan"), float("inf")):
            self.fails(stof.InvalidArgumentError, "softcap must be", q, q, q, softcap=bad)

    def test_alibi_and_bias(self):
        q = arr((2, 4, 128, 64))
        slopes, table = arr((4,), "<f4"), arr((4, 32), "<f4")
        self.fails(stof.InvalidArgumentError, "alibi's slopes must be a contiguous float32 [4]",
                   q, q, q, alibi=arr((3,), "<f4"))
        self.fails(stof.InvalidArgumentError, "alibi's slopes must be", q, q, q,
                   alibi=arr((4,), "<f2"))
        self.fails(stof.InvalidArgumentError, "float32 torch tensor or CUDA array", q, q, q,
                   alibi=[0.5] * 4)
        self.fails(stof.InvalidArgumentError, "bias must be a contiguous float32 [4, B]", q, q, q,
                   bias=arr((4,), "<f4"))
        self.fails(stof.InvalidArgumentError, "bias must be", q, q, q,
                   bias=arr((4, 32), "<f4", strides=(4, 16)))
        self.fails(stof.InvalidArgumentError, "1 to 4096 buckets", q, q, q,
                   bias=arr((4, 4097), "<f4"))
        if not has_gpu():
            # Well-formed: the library is reached, and says there is no GPU.
            self.fails(stof.NoDeviceError, "no GPU", q, q, q, alibi=True)
            self.fails(stof.NoDeviceError, "no GPU", q, q, q, alibi=slopes, bias=table,
                       softcap=30.0, mask="causal")

    def test_not_arrays(self):
        self.fails(stof.InvalidArgumentError, "CUDA array", [1, 2], [1, 2], [1, 2])

    def test_limits(self):
        # stof.h's limits, held before a mask is made for the call.
        q = arr((2, 4, 128, 48))
        e = self.fails(stof.UnsupportedError, "head_dim 48 is not supported (32, 64, 80, 96, "
                       "128)", q, q, q)
        self.assertEqual(e.status, "STOF_ERR_UNSUPPORTED")
        far = arr((1, 1, 4194241, 64))
        near = arr((1, 1, 64, 64))
        self.fails(stof.UnsupportedError, "q's sequence length 4194241 is above STOF_MAX_SEQ",
                   far, near, near, mask="window:256")
        self.fails(stof.UnsupportedError, "k's sequence length 4194241", near, far, far)
        wide = arr((256, 256, 64, 64))
        self.fails(stof.UnsupportedError, "batch 256 x heads 256 is above STOF_MAX_BATCH_HEADS",
                   wide, wide, wide)

    def test_library_checks_reach_c(self):
        q = arr((2, 4, 128, 64))
        e = self.fails(stof.InvalidArgumentError, "desc.scale must be finite and >= 0", q, q, q,
                       scale=-1.0)
        self.assertEqual(e.status, "STOF_ERR_INVALID_ARG")
        # stof_last_error's sentence, with its source location only under STOF_DEBUG.
        self.assertNotIn("src/attn/mha.c", str(e))

    @unittest.skipIf(has_gpu(), "a GPU is here: the call would run")
    def test_valid_calls_meet_no_device(self):
        b, l, h, d = 2, 128, 4, 64
        q = arr((b, h, l, d))
        self.fails(stof.NoDeviceError, "no GPU", q, q, q, mask="window:32+global:8")
        # BLHD memory read through a BHLD view, and the layout named BLHD.
        blhd = contiguous_strides((b, l, h, d))
        t = arr((b, h, l, d), strides=(blhd[0], blhd[2], blhd[1], blhd[3]))
        self.fails(stof.NoDeviceError, "no GPU", t, t, t)
        u = arr((b, l, h, d))
        self.fails(stof.NoDeviceError, "no GPU", u, u, u, layout="blhd")
        # Grouped KV heads (4 on 2, MQA on 1), a KV prefix, the softcap.
        for hk in (2, 1):
            kv = arr((b, hk, 3 * l, d))
            self.fails(stof.NoDeviceError, "no GPU", q, kv, kv, mask="causal_window:64",
                       softcap=30.0)
        # The q, k, v slices of one [b, l, 3, h, d] projection: read packed.
        st = contiguous_strides((b, l, 3, h, d))
        base, row = 0x7f0000000000, h * d * 2
        qkv = [arr((b, l, h, d), strides=(st[0], st[1], st[3], st[4]), ptr=base + i * row)
               for i in range(3)]
        self.fails(stof.NoDeviceError, "no GPU", *qkv, layout="blhd")
        qkv[2] = arr((b, l, h, d), strides=(st[0], st[1], st[3], st[4]), ptr=base + 5 * row)
        self.fails(stof.InvalidArgumentError, "packed QKV", *qkv, layout="blhd")

    def test_out_layout(self):
        from stof._attention import out_layout
        self.assertEqual(out_layout((2, 4, 8, 64), (2048, 512, 64, 1), "bhld"),
                         ((2, 4, 8, 64), (2048, 512, 64, 1)))
        # q a BHLD view of BLHD memory: out likewise.
        self.assertEqual(out_layout((2, 4, 8, 64), (2048, 64, 256, 1), "bhld"),
                         ((2, 4, 8, 64), (2048, 64, 256, 1)))
        # q the slice of a packed [2, 8, 3, 4, 64] projection: out is plain BLHD.
        self.assertEqual(out_layout((2, 8, 4, 64), (6144, 768, 64, 1), "blhd"),
                         ((2, 8, 4, 64), (2048, 256, 64, 1)))


class VarlenChecks(unittest.TestCase):
    """The varlen form (cu_seqlens): every argument checked before a plan."""

    def setUp(self):
        stof.clear_plans()

    def tearDown(self):
        self.assertEqual(stof.plans(), [])
        stof.clear_plans()

    def fails(self, cls, text, *args, **kw):
        with self.assertRaises(cls) as cm:
            stof.attention(*args, **kw)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def call(self, cls, text, q=None, k=None, v=None, cu_q=None, cu_k=None, **kw):
        q = q or arr((1000, 8, 64))
        k = k or arr((1500, 2, 64))
        v = v or k
        cu = arr((4,), "<i4")
        args = dict(cu_seqlens_q=cu_q or cu, cu_seqlens_k=cu_k or cu, max_seqlen_q=700,
                    max_seqlen_k=900, mask="causal")
        args.update(kw)
        return self.fails(cls, text, q, k, v, **args)

    def test_shapes(self):
        inv = stof.InvalidArgumentError
        self.call(inv, "q must be 3-D [total_q, heads, head_dim]", q=arr((1, 1000, 8, 64)))
        self.call(inv, "k must be 3-D [total_k", k=arr((1, 1500, 2, 64)))
        self.call(inv, "k and v must have one shape", v=arr((1500, 2, 32)))
        self.call(inv, "k's head_dim 32 must match q's 64", k=arr((1500, 2, 32)))
        self.call(inv, "must divide q's (8) (grouped KV heads)", k=arr((1500, 3, 64)))
        self.call(stof.UnsupportedError, "head_dim 48 is not supported", q=arr((10, 8, 48)),
                  k=arr((10, 2, 48)))
        self.call(stof.UnsupportedError, "float16 or bfloat16", q=arr((10, 8, 64), "<f4"))
        st = contiguous_strides((1000, 8, 64))
        self.call(inv, "q must be contiguous (rows back to back",
                  q=arr((1000, 8, 64), strides=(2 * st[0], st[1], st[2])))

    def test_cu_seqlens(self):
        inv = stof.InvalidArgumentError
        self.call(inv, "cu_seqlens_q must be a contiguous int32 [n + 1]",
                  cu_q=arr((4,), "<i8"))
        self.call(inv, "cu_seqlens_k must be a contiguous int32 [n + 1]",
                  cu_k=arr((1,), "<i4"))
        self.call(inv, "cu_seqlens_q must be", cu_q=arr((4, 1), "<i4"))
        self.call(inv, "must have one length (n + 1), got 4 and 5", cu_k=arr((5,), "<i4"))
        self.call(inv, "takes both cu_seqlens_q and cu_seqlens_k", cu_seqlens_k=None)
        self.call(inv, "give max_seqlen_q and max_seqlen_k", max_seqlen_k=None)
        self.call(inv, "max_seqlen_q must be >= 0", max_seqlen_q=-1)
        self.call(inv, "max_seqlen_k must be an int", max_seqlen_k="long")
        self.call(stof.UnsupportedError, "max_seqlen_k 4194241 is above STOF_MAX_SEQ",
                  max_seqlen_k=4194241)
        self.call(stof.UnsupportedError, "sequences x heads 8 is above STOF_MAX_BATCH_HEADS",
                  cu_q=arr((9000,), "<i4"), cu_k=arr((9000,), "<i4"))

    def test_refusals(self):
        inv = stof.InvalidArgumentError
        self.call(inv, "takes no seq_lens or seqused_k", seq_lens=arr((3,), "<i4"))
        self.call(inv, "takes no seq_lens or seqused_k", seqused_k=arr((3,), "<i4"))
        self.call(stof.UnsupportedError, "does not take alibi or bias", alibi=True)
        self.call(stof.UnsupportedError, "does not take alibi or bias",
                  bias=arr((8, 32), "<f4"))
        self.call(inv, "spec str or a stof.Mask", mask=3)
        self.call(inv, "a varlen mask must cover the longest sequence",
                  mask=stof.Mask("causal", 512))
        self.call(inv, "softcap must be", softcap=-2.0)
        self.call(inv, "tune must be", tune="slow")

    def test_plans_are_made_for_buckets(self):
        from stof._varlen import plan_shape
        # Any composition whose longest sequence and count fit the buckets
        # finds the same plan: a power of two at or above max(max_seqlen, 1024),
        # and at least 16 sequences where that stays within 65536 rows.
        self.assertEqual(plan_shape(3, 8, 700, 900, "causal"), (1024, 1024, 16))
        self.assertEqual(plan_shape(4, 8, 1, 1024, "causal"), (1024, 1024, 16))
        self.assertEqual(plan_shape(17, 8, 1, 1024, "causal"), (1024, 1024, 32))
        self.assertEqual(plan_shape(3, 8, 100, 16384, "causal"), (1024, 16384, 4))
        self.assertEqual(plan_shape(5, 8, 1025, 30720, "causal"), (2048, 32768, 8))
        self.assertEqual(plan_shape(1, 32, 4194240, 4194240, "causal"),
                         (4194240, 4194240, 1))          # capped at STOF_MAX_SEQ
        self.assertEqual(plan_shape(1000, 64, 10, 10, "dense"), (1024, 1024, 1023))
        m = stof.Mask("causal", 3000)
        self.assertEqual(plan_shape(3, 8, 2999, 3000, m), (3000, 3000, 16))

    @unittest.skipIf(has_gpu(), "a GPU is here: the call would run")
    def test_valid_calls_meet_no_device(self):
        self.call(stof.NoDeviceError, "no GPU")
        self.call(stof.NoDeviceError, "no GPU", mask="causal_window:256", softcap=30.0)
        # MQA, and the plan of a Mask of its own size
        self.call(stof.NoDeviceError, "no GPU", k=arr((1500, 1, 64)),
                  mask=stof.Mask("window:64", 1000))
        self.call(stof.NoDeviceError, "no GPU", q=arr((1000, 8, 64), "<f2"),
                  out=arr((1000, 8, 64)))


class TorchOnCpu(unittest.TestCase):
    """What torch without a GPU can check: tensors off the GPU are refused,
    and the custom op's fake implementation and torch.compile's tracing."""

    @classmethod
    def setUpClass(cls):
        try:
            import torch
        except ImportError:
            raise unittest.SkipTest("torch is not installed")
        cls.torch = torch

    def test_cpu_tensors_refused(self):
        torch = self.torch
        q = torch.zeros(2, 4, 128, 64, dtype=torch.float16)
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            stof.attention(q, q, q)
        self.assertIn("not on a CUDA device", str(cm.exception))
        with self.assertRaises(stof.InvalidArgumentError):
            stof.attention(q, q, [1])

    def test_fake_op_and_compile(self):
        torch = self.torch
        if not hasattr(torch.library, "custom_op"):
            self.skipTest("torch %s has no torch.library.custom_op" % torch.__version__)
        qkv = torch.empty(2, 96, 3, 4, 64, dtype=torch.bfloat16, device="meta")
        q, k, v = qkv.unbind(2)
        o = torch.ops.stof.attention(q, k, v, "causal", None, 0.0, "blhd")
        self.assertEqual((tuple(o.shape), o.stride(), o.dtype),
                         ((2, 96, 4, 64), (96 * 256, 256, 64, 1), torch.bfloat16))
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def f(q, k, v):
            return stof.attention(q, k, v, mask="window:16+global:4").float() * 2

        qm = torch.empty(2, 4, 96, 64, dtype=torch.float16, device="meta")
        out = torch.compile(f, backend=backend, fullgraph=True)(qm, qm, qm)
        self.assertEqual(tuple(out.shape), (2, 4, 96, 64))
        self.assertEqual(len(graphs), 1)
        self.assertIn("stof.attention", str(graphs[0].graph))


    def test_varlen_cpu_tensors_refused(self):
        torch = self.torch
        q = torch.zeros(300, 8, 64, dtype=torch.float16)
        cu = torch.tensor([0, 100, 300], dtype=torch.int32)
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            stof.attention(q, q[:, :2], q[:, :2], cu_seqlens_q=cu, cu_seqlens_k=cu,
                           max_seqlen_q=200, max_seqlen_k=200)
        self.assertIn("q is not on a CUDA device", str(cm.exception))

    def test_refusals_are_not_kept(self):
        # decode and varlen keep what a form of call decided only once its
        # checks pass: a refused form is refused again, every call.
        torch = self.torch
        from stof import _decode, _varlen
        q = torch.zeros(300, 8, 64, dtype=torch.float16)
        cu = torch.tensor([0, 100, 300], dtype=torch.int32)
        qd = torch.zeros(2, 8, 1, 64, dtype=torch.float16)
        kd = torch.zeros(2, 2, 100, 64, dtype=torch.float16)
        lens = torch.tensor([100, 50], dtype=torch.int32)
        for _ in range(2):
            with self.assertRaises(stof.InvalidArgumentError):
                stof.attention(q, q[:, :2], q[:, :2], cu_seqlens_q=cu, cu_seqlens_k=cu,
                               max_seqlen_q=200, max_seqlen_k=200)
            with self.assertRaises(stof.InvalidArgumentError) as cm:
                stof.attention(qd, kd, kd, mask="causal", seqused_k=lens)
            self.assertIn("not on a CUDA device", str(cm.exception))
            with self.assertRaises(stof.InvalidArgumentError):
                stof.decode(qd, kd, kd, lens, layout="bshd")
        self.assertEqual((len(_varlen._calls), len(_decode._calls)), (0, 0))

    def test_varlen_fake_op_and_compile(self):
        torch = self.torch
        if not hasattr(torch.library, "custom_op"):
            self.skipTest("torch %s has no torch.library.custom_op" % torch.__version__)
        q = torch.empty(300, 8, 64, dtype=torch.bfloat16, device="meta")
        kv = torch.empty(500, 2, 64, dtype=torch.bfloat16, device="meta")
        cu = torch.empty(4, dtype=torch.int32, device="meta")
        o = torch.ops.stof.attention_varlen(q, kv, kv, cu, cu, 200, 300, "causal", 0.0, 0.0)
        self.assertEqual((tuple(o.shape), o.stride(), o.dtype),
                         ((300, 8, 64), (512, 64, 1), torch.bfloat16))
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def f(q, k, v, cu_q, cu_k):
            return stof.attention(q, k, v, mask="causal_window:64", cu_seqlens_q=cu_q,
                                  cu_seqlens_k=cu_k, max_seqlen_q=200, max_seqlen_k=300,
                                  softcap=30.0).float() * 2

        out = torch.compile(f, backend=backend, fullgraph=True)(q, kv, kv, cu, cu)
        self.assertEqual(tuple(out.shape), (300, 8, 64))
        self.assertEqual(len(graphs), 1)
        self.assertIn("stof.attention_varlen", str(graphs[0].graph))


if __name__ == "__main__":
    unittest.main()
