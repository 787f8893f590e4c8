"""`pip install ./python`: the wheel built from the package carries the
library and both tools of the `make` build and is tagged for this platform.
Built from a copy of python/ without fetching anything (no build isolation),
so it needs pip and setuptools (with bdist_wheel) here; without them it says so and skips."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

from _util import REPO
from stof import _lib


def have(module):
    return subprocess.run([sys.executable, "-c", "import " + module],
                          capture_output=True).returncode == 0


class Package(unittest.TestCase):
    @unittest.skipUnless(have("pip") and (have("wheel") or have("setuptools.command.bdist_wheel")),
                         "pip, or setuptools able to build wheels, is missing")
    @unittest.skipUnless(os.path.exists(os.path.join(REPO, "build", "libstof.so")), "no build/")
    def test_wheel_carries_library_and_tools(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "src")
            shutil.copytree(os.path.join(REPO, "python"), src,
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                          "tests", "*.so", "stof-*"))
            env = dict(os.environ, STOF_BUILD=os.path.join(REPO, "build"))
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                                "--no-deps", "-q", "-w", os.path.join(d, "dist"), src],
                               env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            wheel, = glob.glob(os.path.join(d, "dist", "stof-0.1.0-*.whl"))
            self.assertNotIn("none-any", wheel)
            names = zipfile.ZipFile(wheel).namelist()
            for f in ("stof/__init__.py", "stof/libstof.so", "stof/stof-warm", "stof/stof-dump"):
                self.assertIn(f, names)
            if os.path.exists(os.path.join(REPO, "build", _lib.NATIVE)):
                self.assertIn("stof/" + _lib.NATIVE, names)
            env["STOF_BUILD"] = os.path.join(d, "nowhere")
            shutil.rmtree(os.path.join(src, "build"), ignore_errors=True)
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                                "--no-deps", "-q", "-w", os.path.join(d, "dist2"), src],
                               env=env, capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("run `make`", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
