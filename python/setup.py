"""Builds the stof wheel with the library and tools of a `make` build inside
it (stof/libstof.so, stof/stof-warm, stof/stof-dump, and stof/_native.abi3.so,
the launch calls without ctypes, where make built it), so an installed package
needs no checkout. $STOF_BUILD names the build folder (default ../build)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = ("libstof.so", "stof-warm", "stof-dump")
OPTIONAL = ("_native.abi3.so",)   # the launch calls without ctypes, where make built it


class build_with_library(build_py):
    def run(self):
        super().run()
        src = os.environ.get("STOF_BUILD") or os.path.join(HERE, "..", "build")
        missing = [f for f in BUILT if not os.path.isfile(os.path.join(src, f))]
        if missing:
            raise SystemExit("stof: %s not in %s: run `make` in the stof checkout first (or set "
                             "STOF_BUILD to the build folder)" % (", ".join(missing),
                                                                 os.path.abspath(src)))
        for f in BUILT + tuple(f for f in OPTIONAL if os.path.isfile(os.path.join(src, f))):
            shutil.copy2(os.path.join(src, f), os.path.join(self.build_lib, "stof", f))


class with_binaries(Distribution):
    # The wheel carries a shared library: tag it for this platform.
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": build_with_library}, distclass=with_binaries)
