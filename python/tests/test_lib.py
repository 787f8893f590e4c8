"""The binding itself: its struct mirrors against stof.h (compiled by the C
compiler), finding the library and saying where it looked when it cannot,
one exception class per stof_status, and a package that imports without
torch or numpy."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from _util import HERE, REPO, stof
from stof import _lib

PKG_PARENT = os.path.dirname(HERE)


def run_py(code, **env):
    e = dict(os.environ, PYTHONPATH=PKG_PARENT, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)


class Binding(unittest.TestCase):
    @unittest.skipUnless(shutil.which("cc") and os.path.exists(os.path.join(REPO, "src/stof.h")),
                         "no C compiler or no stof.h here")
    def test_structs_match_header(self):
        lines = []
        for cname, py in _lib.STRUCTS.items():
            lines.append('printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
            for f, _ in py._fields_:
                lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (cname, f, cname, f))
        src = ("#include <stddef.h>\n#include <stdio.h>\n#include \"stof.h\"\nint main(void){%s"
               "return 0;}\n" % "".join(lines))
        with tempfile.TemporaryDirectory() as d:
            c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(c, "w") as f:
                f.write(src)
            subprocess.run(["cc", "-I", os.path.join(REPO, "src"), "-o", exe, c], check=True)
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        want = dict(line.rsplit(" ", 1) for line in out.splitlines())
        for cname, py in _lib.STRUCTS.items():
            self.assertEqual(int(want[cname]), ctypes.sizeof(py), cname)
            for f, _ in py._fields_:
                self.assertEqual(int(want["%s.%s" % (cname, f)]), getattr(py, f).offset,
                                 "%s.%s" % (cname, f))

    @unittest.skipUnless(shutil.which("cc") and os.path.exists(os.path.join(REPO, "src/stof.h")),
                         "no C compiler or no stof.h here")
    def test_limits_match_header(self):
        src = ('#include <stdio.h>\n#include "stof.h"\n'
               'static const int d[] = {STOF_MHA_HEAD_DIMS};\n'
               'int main(void){printf("%d %d %d", STOF_MAX_SEQ, STOF_MAX_BATCH_HEADS,'
               ' STOF_MAX_BIAS_BUCKETS);'
               'for (unsigned i = 0; i < sizeof d / sizeof d[0]; i++) printf(" %d", d[i]);'
               'return 0;}\n')
        with tempfile.TemporaryDirectory() as d:
            c, exe = os.path.join(d, "limits.c"), os.path.join(d, "limits")
            with open(c, "w") as f:
                f.write(src)
            subprocess.run(["cc", "-I", os.path.join(REPO, "src"), "-o", exe, c], check=True)
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        got = [int(x) for x in out.split()]
        self.assertEqual(got[:3], [_lib.MAX_SEQ, _lib.MAX_BATCH_HEADS, _lib.MAX_BIAS_BUCKETS])
        self.assertEqual(tuple(got[3:]), _lib.MHA_HEAD_DIMS)
        # And the library's own answer agrees, where it has the call.
        f = getattr(_lib.lib(), "mha_head_dim_supported", None)
        if f is not None:
            for d in range(-1, 300):
                self.assertEqual(bool(f(d)), d in _lib.MHA_HEAD_DIMS, d)

    @unittest.skipUnless(os.path.exists(os.path.join(REPO, "src/stof.h")), "no stof.h here")
    def test_prototypes_match_header(self):
        """Each ctypes prototype takes as many arguments as stof.h's declaration
        (a call with one too few would read garbage for the last)."""
        import re
        with open(os.path.join(REPO, "src/stof.h")) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for name, (_, args) in list(_lib._PROTOS.items()) + list(_lib._OPTIONAL.items()):
            m = re.search(r"\b%s\s*\(([^;{]*?)\)\s*;" % name, text)
            self.assertIsNotNone(m, name + " is not declared in stof.h")
            params = m.group(1).strip()
            n = 0 if params in ("", "void") else params.count(",") + 1
            self.assertEqual(n, len(args), name)

    def test_version(self):
        self.assertEqual(stof.version(), stof.__version__)

    def test_errors_by_status(self):
        names = ["STOF_ERR_INVALID_ARG", "STOF_ERR_UNSUPPORTED", "STOF_ERR_NO_DEVICE",
                 "STOF_ERR_CUDA", "STOF_ERR_COMPILE", "STOF_ERR_CACHE", "STOF_ERR_NO_MEMORY",
                 "STOF_ERR_INTERNAL"]
        L = _lib.lib()
        for status, name in enumerate(names, 1):
            e = _lib.error_for(status, "why")
            self.assertIsInstance(e, stof.Error)
            self.assertEqual(e.status, name)
            self.assertEqual(L.status_str(status).decode(), name)
            self.assertEqual(str(e), "why")
        self.assertIsInstance(_lib.error_for(1, "x"), ValueError)

    def test_context(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.db")
            ctx = stof.Context(cache=path)
            self.assertEqual(ctx.cache_path, path)
            self.assertEqual(ctx.stats()["nvrtc_compiles"], 0)
            self.assertEqual(stof.Context(no_cache=True).cache_path, "")
        # With no GPU the device's name says why there is none.
        r = run_py("import stof; print(stof.Context(no_cache=True).device_info())",
                   STOF_NO_GPU="1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(False, '', 'no GPU: STOF_NO_GPU is set')", r.stdout)
        with self.assertRaises(stof.InvalidArgumentError):
            stof.Context(device=-1)
        with self.assertRaises(stof.Error) as cm:
            stof.Context(arch="sm_1")
        self.assertIn("sm_1", str(cm.exception))

    def test_imports_without_torch(self):
        r = run_py("import sys, stof; stof.Mask('causal', 8); "
                   "assert 'torch' not in sys.modules and 'numpy' not in sys.modules")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_launcher(self):
        # Both ways in reach the library: a NULL plan is STOF_ERR_INVALID_ARG
        # (1) before anything is launched, so no GPU is needed.
        L = _lib.lib()
        native = os.path.join(os.path.dirname(L.path), _lib.NATIVE)
        if os.path.exists(native):
            self.assertIsNotNone(L.native, "%s is there but was not loaded" % native)
        for name, n in (("mha_run", 7), ("layer_run", 6)):
            call, fn = L.launcher(name)
            args = [None, 16, 32, 48, 64, None, None][:n]
            self.assertEqual(call(fn, *args), 1, name)
            self.assertEqual(_lib._ctypes_call(getattr(L, name), *args), 1, name)
        if L.native is not None:
            call, fn = L.launcher("mha_run")
            self.assertIs(call, L.native.call)
            with self.assertRaises(TypeError):
                call(fn, None, 1)                      # six or seven arguments only
            with self.assertRaises(TypeError):
                call(fn, "q", 1, 2, 3, 4, None, None)  # pointers are ints
            with self.assertRaises(ValueError):
                call(None, None, 1, 2, 3, 4, None, None)
        # The decode and varlen launches' forms, with their ints.
        for name, form, at_int, args in (
                ("decode_run", "decode_run", 6, [None, 16, 32, 48, 64, None, 1, 4096, None]),
                ("mha_run_varlen", "varlen_run", 7,
                 [None, 16, 32, 48, 64, 80, 96, 2, 1 << 33, 1 << 33, None])):
            call, fn = L.launcher(name, form)
            self.assertEqual(call(fn, *args), 1, name)
            self.assertEqual(_lib._ctypes_call(getattr(L, name), *args), 1, name)
            if L.native is not None:
                self.assertIs(call, getattr(L.native, form))
                with self.assertRaises(TypeError):
                    call(fn, None, 1)                  # the form's count only
                bad = list(args)
                bad[at_int] = 1 << 40                  # past an int
                with self.assertRaises(OverflowError):
                    call(fn, *bad)

    def test_library_not_found_says_where(self):
        r = run_py("import stof\ntry:\n stof.version()\nexcept stof.LibraryNotFoundError as e:\n"
                   " print(e)", STOF_LIB="/nonexistent/libstof.so")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("/nonexistent/libstof.so", r.stdout)
        self.assertIn("make", r.stdout)
        r = run_py("import stof; print(stof.library_path())",
                   STOF_LIB=os.path.join(REPO, "build"))
        if os.path.exists(os.path.join(REPO, "build", "libstof.so")):
            self.assertEqual(r.stdout.strip(), os.path.join(REPO, "build", "libstof.so"))


if __name__ == "__main__":
    unittest.main()
