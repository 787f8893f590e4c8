"""stof.Mask: specs and dense matrices, the canonical hash, statistics, the
dense matrix and the block map back, and the pictures the library draws."""
import os
import struct
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

from _util import stof


def tril(lq, lk):
    return [[k <= q + (lk - lq) for k in range(lk)] for q in range(lq)]


class Masks(unittest.TestCase):
    def test_spec_and_dense_agree(self):
        m = stof.Mask(" causal ", 40, 50)
        self.assertEqual((m.spec, m.shape, m.lq, m.lk), ("causal", (40, 50), 40, 50))
        d = stof.Mask.from_dense(tril(40, 50))
        self.assertEqual(d.spec, "dense-matrix")
        self.assertEqual(m.hash, d.hash)
        self.assertEqual(m, d)
        self.assertNotEqual(m, stof.Mask("dense", 40, 50))
        self.assertEqual(len(m.hash), 64)
        self.assertEqual(m.to_dense("list"), tril(40, 50))
        self.assertEqual(repr(stof.Mask("window:4", 8)), "Mask('window:4', 8, 8)")

    def test_statistics(self):
        m = stof.Mask("window:8+global:2", 100)
        dense = m.to_dense("list")
        entries = sum(map(sum, dense))
        s = m.stats(16, 32)
        self.assertEqual(s["entries"], entries)
        self.assertAlmostEqual(s["density"], entries / 100 / 100)
        self.assertEqual(m.entries, entries)
        self.assertEqual((s["block_q"], s["block_k"], s["n_qblocks"], s["n_kblocks"]),
                         (16, 32, 7, 4))
        self.assertEqual(s["row_max"], 100)      # the global rows
        self.assertEqual(s["empty_rows"], 0)

    def test_block_map(self):
        self.assertEqual(stof.Mask("causal", 128).block_map(), [[1, 0], [2, 1]])
        m = stof.Mask("window:32+global:16+random:1:16:7", 333, 1000)
        bm = m.block_map(32, 16)
        self.assertEqual((len(bm), len(bm[0])), (11, 63))
        s = m.stats(32, 16)
        flat = [x for r in bm for x in r]
        self.assertEqual(flat.count(2), s["blocks_full"])
        self.assertEqual(flat.count(1), s["blocks_partial"])
        self.assertEqual(m.block_map(32, 16, kind="bytes"), bytes(flat))

    def test_from_dense_inputs(self):
        rows = [[1, 0, 1], [0, 0, 1]]
        m = stof.Mask.from_dense(rows)
        self.assertEqual(m.shape, (2, 3))
        self.assertEqual(m.to_dense("list"), [[True, False, True], [False, False, True]])
        buf = memoryview(bytes([1, 0, 1, 0, 0, 1])).cast("B", (2, 3))
        self.assertEqual(stof.Mask.from_dense(buf), m)
        with self.assertRaises(stof.InvalidArgumentError):
            stof.Mask.from_dense([[1, 0], [1]])
        with self.assertRaises(stof.InvalidArgumentError):
            stof.Mask.from_dense([])

    def test_numpy_and_torch(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed")
        m = stof.Mask("dilated:4:3", 30, 30)
        a = m.to_dense()
        self.assertEqual((a.dtype, a.shape), (np.dtype(bool), (30, 30)))
        self.assertEqual(stof.Mask.from_dense(a), m)
        self.assertEqual(stof.Mask.from_dense(a.astype(np.float32)), m)
        with self.assertRaises(stof.InvalidArgumentError):
            stof.Mask.from_dense(np.zeros(5, dtype=bool))
        try:
            import torch
        except ImportError:
            return
        t = m.to_dense("torch")
        self.assertEqual((t.dtype, tuple(t.shape)), (torch.bool, (30, 30)))
        self.assertEqual(stof.Mask.from_dense(t), m)
        self.assertEqual(stof.Mask.from_dense(t.T.contiguous().T), m)

    def test_errors(self):
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            stof.Mask("window:8+glob:2", 64)
        self.assertIn("column", str(cm.exception))
        self.assertEqual(cm.exception.status, "STOF_ERR_INVALID_ARG")
        with self.assertRaises(stof.InvalidArgumentError):
            stof.Mask("causal", 0)
        with self.assertRaises(TypeError):   # lq is required (Mask(spec, lq, lk=None))
            stof.Mask("causal")
        m = stof.Mask("causal", 64)
        with self.assertRaises(stof.InvalidArgumentError) as cm:
            m.stats(0, 0)
        self.assertIn("16..256", str(cm.exception))
        with self.assertRaises(stof.InvalidArgumentError):
            m.block_map(8, 64)
        with self.assertRaises(stof.InvalidArgumentError):
            m.picture(format="gif")
        with self.assertRaises(stof.InvalidArgumentError):
            m.to_dense("jax")

    def test_too_long_refused_at_once(self):
        # Past STOF_MAX_SEQ a mask is refused before anything is built
        # (Mask('window:256', 10**9) once ran for minutes).
        from stof import _lib
        t0 = time.monotonic()
        for lq, lk, name in ((10**9, None, "lq = 1000000000"),
                             (_lib.MAX_SEQ + 1, 64, "lq = 4194241"),
                             (64, _lib.MAX_SEQ + 1, "lk = 4194241")):
            with self.assertRaises(stof.InvalidArgumentError) as cm:
                stof.Mask("window:256", lq, lk)
            self.assertIn(name, str(cm.exception))
            self.assertIn("STOF_MAX_SEQ = 4194240", str(cm.exception))
        self.assertLess(time.monotonic() - t0, 1.0)
        # The library refuses the same on its own, as fast.
        from stof import _mask
        ctx = _mask._host_context()
        h = _lib.c_void_p()
        t0 = time.monotonic()
        with ctx.lock:
            st = ctx._lib.mask_parse(ctx.handle, b"window:256", 10**9, 10**9, _lib.byref(h))
            said = ctx._lib.last_error(ctx.handle).decode()
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(_lib.error_for(st, said).status, "STOF_ERR_INVALID_ARG")
        self.assertIsNone(h.value)
        self.assertIn("lq = 1000000000", said)

    def test_op_keys(self):
        from stof import _mask
        m = stof.Mask.from_dense(tril(20, 20))
        key = _mask.op_key(m)
        self.assertTrue(key.startswith("@" + m.hash))
        self.assertIs(_mask.from_op_key(key), m)
        self.assertEqual(_mask.op_key("causal"), "causal")
        with self.assertRaises(stof.InvalidArgumentError):
            _mask.from_op_key("@0000:1x1")


class Pictures(unittest.TestCase):
    def test_svg(self):
        m = stof.Mask("causal&docs:64,64", 128)
        svg = m.picture(64, 64)
        root = ET.fromstring(svg)   # well-formed, the '&' escaped
        self.assertTrue(root.tag.endswith("svg"))
        self.assertIn("causal&amp;docs:64,64", svg)
        self.assertIn(">partial 2<", svg)
        self.assertIn(">empty 2<", svg)
        self.assertEqual(m._repr_svg_(), svg)

    def test_png_and_save(self):
        m = stof.Mask("window:64+global:20", 1000, 333)
        png = m.picture(32, 16, "png")
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        w, h = struct.unpack(">II", png[16:24])
        self.assertEqual((w, h), (21 * 16, 32 * 16))
        with tempfile.TemporaryDirectory() as d:
            for name in ("m.svg", "m.png"):
                path = os.path.join(d, name)
                m.save(path, 32, 16)
                with open(path, "rb") as f:
                    data = f.read()
                self.assertEqual(data, png if name.endswith("png")
                                 else m.picture(32, 16).encode())


if __name__ == "__main__":
    unittest.main()
