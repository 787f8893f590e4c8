#!/usr/bin/env bash
# gpu-peers.sh — FlashAttention-4 beside stof on the device, for the LLM
# peers benchmark (bench/peers_llm.py over bench/workloads/llm.json). The
# device has no package registry, so FA4's wheels travel with the working
# tree in .peers/ (git-ignored). The CUTLASS DSL's CUDA 13 wheel (92 MB) is
# more than one call may carry (64 MiB, the working tree's tracked files
# included): it is unpacked and packed again as an xz tar (about 62 MB, its
# aarch64 stubs left out) and cut in two halves; the first half travels
# alone, and the second follows with the other wheels (about 10 MB) and
# the library (.peers/lib) in a second call while the machine is still warm
# (about 30 s). ../shared/peers/FA4.md has the versions that worked
# together (python 3.12 on the device).
#
# On the build machine (PyPI reachable; DIR defaults to /work/fa4):
#   bash tools/gpu-peers.sh fetch [DIR]   pip download the wheels into DIR/wheels and
#                                         pack DIR/cu13.tar.xz (xz -9e on one thread, 62.2 MB:
#                                         8 minutes; XZ_THREADS=2, 63.5 MB, cuts blocks)
#   bash tools/gpu-peers.sh stage [DIR]   copy DIR/wheels/*.whl into .peers/wheels/ and
#                                         DIR/cu13.tar.xz, in two halves, into .peers/p1/
#                                         and .peers/p2/, and build/'s libstof.so,
#                                         _native.abi3.so and stof-warm into .peers/lib/
#                                         (build/ must be made; all of it is too big to carry)
# On the device, through the run tool, one call after the other:
#   1. carry [".peers/p1"]:                              bash tools/gpu-peers.sh unpack
#   2. carry [".peers/p2", ".peers/wheels", ".peers/lib"], at once:
#                                  STOF_BUILD=.peers/lib bash tools/gpu-peers.sh run [ARG...]
#      (installs into /tmp/site, then python3 bench/peers_llm.py ARG...). While
#      the machine stays warm, more `run` calls need only .peers/lib (the
#      install is kept); a cold machine has lost /tmp: start again from call 1.
#   bash tools/gpu-peers.sh check        only import FA4 and say its versions
#   bash tools/gpu-peers.sh warm [ARG]   stof-warm ARG... bench/workloads/llm.json (all of it,
#                                        decode steps included), into the bench cache
# All of llm.json runs past one 10-minute call (FlexAttention and FA4 compile per
# shape, stof plans per shape): split it, e.g.
#   run --case llama3-8b/        run --case llama3.2 --case gemma2 --case alibi
#   run --case chunked           run --kind decode
# stof's kernel cache is $STOF_BENCH_CACHE (default $STOF_BUILD/bench-cache.db),
# as tools/gpu-check.sh's. Logs and the result file go to ${OUT:-/tmp/gpu-peers}.
# Exit status: 0 when the step did what it says.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PKGS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
    nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi
    torch-c-dlpack-ext quack-kernels einops)
CU13=nvidia_cutlass_dsl_libs_cu13
SITE=/tmp/site
UNPACKED=/tmp/cu13x
PART1=/tmp/cu13.part1

mode=${1:-}
shift $(($# > 0 ? 1 : 0))
say() { echo "gpu-peers: $*"; }
die() {
    echo "gpu-peers: $*" >&2
    exit 1
}

fetch() {
    local dir=${1:-/work/fa4}
    mkdir -p "$dir/wheels" || die "cannot make $dir/wheels"
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d "$dir/wheels" "${PKGS[@]}" || die "pip download failed"
    # The cu13 wheel stays out of wheels/: it travels as the tar alone.
    local whl
    for whl in "$dir"/wheels/"$CU13"-*.whl; do
        [[ -f $whl ]] && { mv "$whl" "$dir/" || die "cannot move $whl"; }
    done
    whl=("$dir"/"$CU13"-*.whl)
    [[ -f ${whl[0]} ]] || die "no $CU13 wheel in $dir"
    local tmp
    tmp=$(mktemp -d) || die "mktemp failed"
    python3 -m zipfile -e "${whl[0]}" "$tmp" || die "cannot unzip ${whl[0]}"
    rm -rf "$tmp/nvidia_cutlass_dsl/cu13/lib/stubs"
    say "packing $dir/cu13.tar.xz (xz -9e on ${XZ_THREADS:-1} threads: minutes)"
    if ! (cd "$tmp" && tar cf - .) | xz -T"${XZ_THREADS:-1}" -9e > "$dir/cu13.tar.xz.part"; then
        die "packing failed"
    fi
    mv "$dir/cu13.tar.xz.part" "$dir/cu13.tar.xz" || die "cannot name $dir/cu13.tar.xz"
    rm -rf "$tmp"
    ls -l "$dir/cu13.tar.xz" "$dir"/wheels/*.whl
}

stage() {
    local dir=${1:-/work/fa4}
    [[ -f $dir/cu13.tar.xz ]] || die "$dir/cu13.tar.xz missing: run fetch first"
    ls "$dir"/wheels/*.whl > /dev/null 2>&1 || die "no wheels in $dir/wheels: run fetch first"
    git check-ignore -q .peers/x || die ".peers/ is not git-ignored here (.gitignore has /.peers/)"
    mkdir -p .peers/wheels || die "cannot make .peers/wheels"
    rm -f .peers/wheels/*.whl
    cp "$dir"/wheels/*.whl .peers/wheels/ || die "copying the wheels into .peers/ failed"
    rm -rf .peers/p1 .peers/p2 .peers/cu13.tar.xz
    mkdir -p .peers/p1 .peers/p2 || die "cannot make .peers/p1 and .peers/p2"
    local half
    half=$((($(stat -c %s "$dir/cu13.tar.xz") + 1) / 2))
    head -c "$half" "$dir/cu13.tar.xz" > .peers/p1/cu13.part1 &&
        tail -c +$((half + 1)) "$dir/cu13.tar.xz" > .peers/p2/cu13.part2 ||
        die "cutting cu13.tar.xz in two failed"
    rm -rf .peers/lib
    mkdir -p .peers/lib || die "cannot make .peers/lib"
    local f
    for f in libstof.so _native.abi3.so stof-warm; do
        if [[ -f build/$f ]]; then
            cp "build/$f" .peers/lib/ || die "copying build/$f into .peers/lib failed"
        else
            say "build/$f missing: run make, then stage again"
        fi
    done
    say "staged: $(du -sh .peers/wheels | cut -f1) of wheels, cu13.tar.xz in halves of" \
        "$(du -sh .peers/p1 | cut -f1) and $(du -sh .peers/p2 | cut -f1)"
    say "call 1: carry [\".peers/p1\"], command: bash tools/gpu-peers.sh unpack"
    say "call 2: carry [\".peers/p2\", \".peers/wheels\", \".peers/lib\"], command:" \
        "STOF_BUILD=.peers/lib bash tools/gpu-peers.sh run ARG..."
}

unpack() {
    [[ -f .peers/p1/cu13.part1 ]] || die ".peers/p1 was not carried"
    cp .peers/p1/cu13.part1 "$PART1" || die "cannot copy the first half to $PART1"
    say "the first half is in $PART1; now call 2, within 30 s"
}

install() {
    if [[ -f $SITE/.complete ]]; then
        say "FA4 already installed in $SITE"
    else
        if [[ ! -d $UNPACKED/nvidia_cutlass_dsl ]]; then
            [[ -f $PART1 ]] || die "$PART1 is missing (the machine went cold, or call 1 was" \
                "not run): run unpack"
            [[ -f .peers/p2/cu13.part2 ]] || die ".peers/p2 was not carried"
            rm -rf "$UNPACKED"
            mkdir -p "$UNPACKED" || die "cannot make $UNPACKED"
            cat "$PART1" .peers/p2/cu13.part2 | xz -dc | tar xf - -C "$UNPACKED" ||
                die "unpacking the two halves failed"
        fi
        ls .peers/wheels/*.whl > /dev/null 2>&1 || die ".peers/wheels was not carried"
        pip install -q --no-deps --no-index --target "$SITE" .peers/wheels/*.whl ||
            die "pip install of .peers/wheels failed"
        cp -a "$UNPACKED/." "$SITE/" || die "cannot copy $UNPACKED into $SITE"
        touch "$SITE/.complete"
    fi
    export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:python
    export LD_LIBRARY_PATH=$SITE/nvidia_cutlass_dsl/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

check() {
    python3 - << 'EOF' || die "FA4 does not import"
import importlib.metadata as md, torch
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func  # noqa: F401
v = {p: md.version(p) for p in ("flash-attn-4", "nvidia-cutlass-dsl")}
print("gpu-peers: FA4 imports;", v, "torch", torch.__version__, torch.cuda.get_device_name(0))
EOF
}

build=${STOF_BUILD:-build}
logs=${OUT:-/tmp/gpu-peers}
export STOF_BUILD=$build STOF_LIB=${STOF_LIB:-$build/libstof.so} PYTHONUNBUFFERED=1
export STOF_CACHE=${STOF_BENCH_CACHE:-$build/bench-cache.db}

case $mode in
fetch) fetch "$@" ;;
stage) stage "$@" ;;
unpack) unpack ;;
check)
    install
    check
    ;;
run)
    [[ -f $STOF_LIB ]] || die "$STOF_LIB not found: make on the build machine and carry $build"
    install
    check
    mkdir -p "$logs"
    say "python3 bench/peers_llm.py $* (log: $logs/peers_llm.log)"
    python3 bench/peers_llm.py "$@" 2>&1 | tee "$logs/peers_llm.log"
    rc=${PIPESTATUS[0]}
    ((rc == 0)) || die "bench/peers_llm.py exited $rc"
    ;;
warm)
    [[ -x $build/stof-warm ]] || die "$build/stof-warm not found: carry $build"
    "$build/stof-warm" --cache "$STOF_CACHE" "$@" bench/workloads/llm.json || die "stof-warm failed"
    ;;
-h | --help)
    sed -n '2,/^set /s/^# \{0,1\}//p' "$0" | sed '$d'
    ;;
*)
    echo "usage: bash tools/gpu-peers.sh fetch|stage [DIR] | unpack | run [ARG...] | check |" \
        "warm [ARG...]" >&2
    exit 2
    ;;
esac
