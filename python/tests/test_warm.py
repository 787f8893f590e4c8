"""stof.warm and the cache's statistics: a compile-only warm for sm_90a (no
GPU needed) fills a fresh cache, a second one finds it all there, the
cache's statistics, listing and check say so, and bad input is refused with
the tool's own words."""
import os
import tempfile
import unittest

from _util import stof

CASE = "b=1,h=2,l=256,d=64,fp16,window:64+global:16"


class Warm(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.cache = os.path.join(self.dir.name, "cache.db")

    def tearDown(self):
        self.dir.cleanup()

    def test_compile_only_then_hits(self):
        r = stof.warm(mha=[CASE], arch="sm_90a", compile_only=True, cache=self.cache)
        self.assertTrue(r.ok, r.output)
        self.assertEqual(r.counts["cases"], 1)
        self.assertEqual(r.counts["compiled"], 1, r.output)
        self.assertEqual(r.counts["failed"], 0)
        s = stof.cache_stats(cache=self.cache)
        self.assertEqual(s["cache"], self.cache)
        self.assertGreater(s["kernels"], 0)
        self.assertEqual([(g["op"], g["arch"]) for g in s["groups"]], [("mha", "sm_90a")])
        kernels = stof.cache_list(cache=self.cache)
        self.assertEqual(len(kernels), s["kernels"])
        self.assertTrue(all(k["arch"] == "sm_90a" for k in kernels))
        self.assertEqual(stof.cache_list(op="layernorm", cache=self.cache), [])
        self.assertTrue(stof.cache_check(cache=self.cache)["ok"])
        self.assertEqual(stof.cache_tuning(cache=self.cache), [])   # compile-only: no timings

        again = stof.warm(mha=CASE, arch="sm_90a", compile_only=True, cache=self.cache)
        self.assertEqual((again.counts["hits"], again.counts["compiled"]), (1, 0), again.output)
        self.assertEqual(stof.cache_stats(cache=self.cache)["kernels"], s["kernels"])

    def test_decode_steps(self):
        """decode=: a decoding step's two kernels, once for every length and window."""
        r = stof.warm(decode=["b=8,h=4,kv=2,d=64,cache=300,bf16,causal",
                              "b=1,h=4,kv=2,d=64,cache=4096,bf16,causal_window:64"],
                      arch="sm_90a", compile_only=True, cache=self.cache)
        self.assertTrue(r.ok, r.output)
        self.assertEqual((r.counts["cases"], r.counts["compiled"], r.counts["hits"]), (2, 1, 1),
                         r.output)
        self.assertEqual(len(stof.cache_list(op="decode", cache=self.cache)), 2)
        with self.assertRaises(stof.ToolError) as cm:
            stof.warm(decode="b=1,h=4,d=64,cache=3,new=4", arch="sm_90a", compile_only=True,
                      cache=self.cache)
        self.assertIn("cache=3 must be new (4)", str(cm.exception))

    def test_bad_input(self):
        with self.assertRaises(stof.ToolError) as cm:
            stof.warm(mha="b=1,h=2", arch="sm_90a", compile_only=True, cache=self.cache)
        self.assertEqual(cm.exception.returncode, 2)
        self.assertIn("missing d=", str(cm.exception))
        with self.assertRaises(stof.ToolError) as cm:
            stof.warm(decoder=["b=1,s=64,hidden=512,h=8,kv=3,ffn=1376"], arch="sm_90a",
                      compile_only=True, cache=self.cache)
        self.assertIn("--decoder", str(cm.exception))
        self.assertIn("kv=3 does not divide h=8", str(cm.exception))
        r = stof.warm(mha="b=1,h=2", cache=self.cache, check=False)
        self.assertEqual((r.ok, r.counts), (False, None))
        with self.assertRaises(stof.ToolError) as cm:
            stof.cache_stats(cache=os.path.join(self.dir.name, "none.db"))
        self.assertIn("no stof cache there", str(cm.exception))
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "none.db")))

    def test_counters_and_tools(self):
        s = stof.stats()
        self.assertEqual(set(s), {"nvrtc_compiles", "nvrtc_ms", "cache_hits", "cache_misses",
                                  "cache_rejects", "module_loads", "timing_runs",
                                  "graph_captures", "remote_hits", "remote_misses",
                                  "remote_rejects", "remote_writes", "remote_errors",
                                  "cache_write_failures"})
        for name in ("stof-warm", "stof-dump"):
            self.assertTrue(os.access(stof.tool_path(name), os.X_OK))


if __name__ == "__main__":
    unittest.main()
