"""_tools: warming the kernel cache and looking into it, by running the built
stof-warm and stof-dump.

Why the tools and not the library: the workload reader (bench/workloads/
*.json and the --mha/--ln one-liners), the scheduling over devices and
worker processes, progress and resuming live in stof-warm and in modules
that are not part of the public API, and the cache's statistics, listings
and checks live in stof-dump; calling the tools keeps one implementation.
Their JSON output (stof-dump --json) is what the functions here return. The
per-context counters (stof_get_stats) come from the library: stats().
"""
import json
import os
import re
import shutil
import subprocess

from . import _lib as L


def tool_path(name):
    """A built tool: beside the loaded libstof.so (pip install puts them
    there; so does build/), the checkout's build/, then $PATH."""
    places = [os.path.dirname(os.path.abspath(L.library_path())), L._REPO_BUILD]
    for d in places:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    p = shutil.which(name)
    if p:
        return p
    raise L.ToolError("%s not found beside %s, in %s or on PATH: build it with `make`"
                      % (name, L.library_path(), L._REPO_BUILD))


def _run(argv, echo=False):
    """(exit status, everything it printed); echo also prints it as it comes."""
    if not echo:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return r.returncode, r.stdout
    lines = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as p:
        for line in p.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    return p.returncode, "".join(lines)


class WarmReport:
    """What stof-warm did: returncode (0 all done, 1 some cases failed, 130
    interrupted), its output, and the summary's counts (cases, hits,
    compiled, tuned, failed) when it printed one."""

    def __init__(self, returncode, output):
        self.returncode, self.output = returncode, output
        m = re.search(r"stof-warm: (\d+) cases? in [\d:]+: (\d+) cache hits?, (\d+) compiled, "
                      r"(\d+) tuned, (\d+) failed", output)
        names = ("cases", "hits", "compiled", "tuned", "failed")
        self.counts = dict(zip(names, map(int, m.groups()))) if m else None

    @property
    def ok(self):
        return self.returncode == 0

    def __repr__(self):
        return "WarmReport(returncode=%d, counts=%r)" % (self.returncode, self.counts)


def warm(*workloads, mha=(), ln=(), decoder=(), decode=(), arch=None, compile_only=False,
         tune=None, cache=None, devices=None, jobs=None, quiet=True, echo=False, check=True):
    """Fills the kernel cache as `stof-warm` does (it runs it): workload files
    (the format of bench/workloads/*.json) and one-liners, mha=["b=8,h=12,
    l=2048,d=64,fp16,window:256", ...], ln=["rows=16384,hidden=768,fp16"],
    decoder=["b=1,s=4096,hidden=4096,h=32,kv=8,ffn=14336,bf16,causal"],
    decode=["b=8,h=32,kv=8,d=128,cache=32768,new=1,bf16,causal"].
    With no GPU: arch="sm_90a", compile_only=True. cache: the cache file
    (default $STOF_CACHE, else the default path). echo prints its progress.
    Returns a WarmReport; raises ToolError when it fails and check is set."""
    argv = [tool_path("stof-warm")]
    if cache:
        argv += ["--cache", os.fspath(cache)]
    if arch:
        argv += ["--arch", arch]
    if compile_only:
        argv.append("--compile-only")
    if tune:
        argv += ["--tune", tune]
    if devices is not None:
        argv += ["--devices", ",".join(str(d) for d in devices)]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    if quiet and not echo:
        argv.append("--quiet")
    for line in [mha] if isinstance(mha, str) else mha:
        argv += ["--mha", line]
    for line in [ln] if isinstance(ln, str) else ln:
        argv += ["--ln", line]
    for line in [decoder] if isinstance(decoder, str) else decoder:
        argv += ["--decoder", line]
    for line in [decode] if isinstance(decode, str) else decode:
        argv += ["--decode", line]
    argv += [os.fspath(w) for w in workloads]
    code, out = _run(argv, echo)
    report = WarmReport(code, out)
    if check and code != 0:
        last = "\n".join(out.strip().splitlines()[-6:])
        raise L.ToolError("stof-warm exited %d:\n%s" % (code, last), code, out)
    return report


def dump(command, *args, cache=None):
    """`stof-dump [--cache PATH] COMMAND ARGS... --json`, parsed."""
    argv = [tool_path("stof-dump")]
    if cache:
        argv += ["--cache", os.fspath(cache)]
    argv += [command, *args, "--json"]
    code, out = _run(argv)
    try:
        doc = json.loads(out) if code in (0, 1) else None
    except ValueError:
        doc = None
    if doc is None:
        raise L.ToolError("stof-dump %s exited %d: %s" % (command, code, out.strip()[-500:]),
                          code, out)
    return doc


def cache_stats(cache=None):
    """Entries, bytes, hits and compile time saved, by op and arch (stof-dump stats)."""
    return dump("stats", cache=cache)


def cache_list(op=None, arch=None, cache=None):
    """The kernels in the cache, one dict each (stof-dump list)."""
    args = (["--op", op] if op else []) + (["--arch", arch] if arch else [])
    return dump("list", *args, cache=cache)["kernels"]


def cache_tuning(op=None, mask=None, cache=None):
    """Tuning records: winners and what they beat (stof-dump tuning)."""
    args = (["--op", op] if op else []) + (["--mask", mask] if mask else [])
    return dump("tuning", *args, cache=cache)["tuning"]


def cache_check(cache=None):
    """The integrity check (stof-dump check): checksums, versions, orphans."""
    return dump("check", cache=cache)


def stats(device=0):
    """This process's counters on a device's context (stof_get_stats): NVRTC
    compiles and time, cache hits, misses and rejects, module loads, timing
    runs, graph captures."""
    return L.Context.for_device(device).stats()
