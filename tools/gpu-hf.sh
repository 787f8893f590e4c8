#!/usr/bin/env bash
# gpu-hf.sh — stof.hf on the device. From a checkout whose build/ was made
# elsewhere (it builds nothing), it runs the CPU and GPU suites of stof.hf
# (python/tests/test_hf_cpu.py, python/tests/test_gpu_hf.py) and the
# end-to-end benchmark bench/e2e.py, keeps their logs under
# ${OUT:-/tmp/gpu-hf}, and prints a summary last. It needs torch and
# transformers on the machine (accelerate and sentence-transformers are
# used where present, else their tests say so and skip).
#
#   bash tools/gpu-hf.sh              tests, then bench/e2e.py --quick
#   bash tools/gpu-hf.sh tests        the suites only
#   bash tools/gpu-hf.sh e2e [ARG]    bench/e2e.py only, with ARGs in place of --quick
#                                     (--models bert-base,vit-base: the whole benchmark)
#
# The benchmark's kernel cache is $STOF_BENCH_CACHE (default
# $STOF_BUILD/bench-cache.db), as tools/gpu-check.sh's: its first calls plan
# (searches on an empty cache), and bench/e2e.py prints that time per model.
# The suites use a private cache and STOF_TUNE=off (python/tests/_util.py).
# Exit status: 0 when everything that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

mode=${1:-all}
case $mode in
all | tests | e2e) ;;
-h | --help)
    sed -n '2,/^set /s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
*)
    echo "usage: bash tools/gpu-hf.sh [tests | e2e [ARG...]]" >&2
    exit 2
    ;;
esac
shift $(($# > 0 ? 1 : 0))

build=${STOF_BUILD:-build}
logs=${OUT:-/tmp/gpu-hf}
mkdir -p "$logs"
export STOF_BUILD=$build STOF_LIB=${STOF_LIB:-$build/libstof.so} PYTHONPATH=python
export PYTHONUNBUFFERED=1
failed=0
summary=()

device=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
    sort | uniq -c | sed 's/^ *//' | tr '\n' ';')
versions=$(python3 -c 'import torch, transformers; print("torch", torch.__version__,
    "transformers", transformers.__version__, "GPUs", torch.cuda.device_count())' 2>&1 | tail -n 1)
echo "gpu-hf: ${device:-no nvidia-smi}; $versions; logs in $logs"

if [[ ! -f $STOF_LIB ]]; then
    echo "gpu-hf: $STOF_LIB not found: run make on the build machine and carry $build/" >&2
    exit 1
fi

if [[ $mode == all || $mode == tests ]]; then
    for t in test_hf_cpu test_gpu_hf; do
        echo "gpu-hf: running python/tests/$t.py (log: $logs/$t.log)"
        python3 -m unittest discover -s python/tests -p "$t.py" -v > "$logs/$t.log" 2>&1
        rc=$?
        [[ $rc == 0 ]] || failed=1
        last=$(grep -E '^(OK|FAILED)' "$logs/$t.log" | tail -n 1)
        state=$([[ $rc == 0 ]] && echo PASS || echo FAIL)
        summary+=("$t $state: ${last:-no unittest result (exit $rc)}")
        while IFS= read -r line; do summary+=("    $line"); done < <(
            grep -E '(rel L2|NOT run|\.\.\. skipped|^(FAIL|ERROR):)' "$logs/$t.log" | head -n 30)
    done
fi

if [[ $mode == all || $mode == e2e ]]; then
    args=("$@")
    ((${#args[@]})) || args=(--quick)
    echo "gpu-hf: running bench/e2e.py ${args[*]} (log: $logs/e2e.log)"
    STOF_CACHE=${STOF_BENCH_CACHE:-$build/bench-cache.db} \
        python3 bench/e2e.py "${args[@]}" > "$logs/e2e.log" 2> "$logs/e2e.err"
    rc=$?
    [[ $rc == 0 ]] || failed=1
    summary+=("e2e $([[ $rc == 0 ]] && echo PASS || echo "FAIL($rc)"): bench/e2e.py ${args[*]}")
    [[ $rc == 0 ]] || while IFS= read -r line; do summary+=("    $line"); done < <(
        grep -E '^(e2e: .*failed|[A-Za-z]*Error)' "$logs/e2e.err" | tail -n 8)
    while IFS= read -r line; do summary+=("    $line"); done < "$logs/e2e.log"
fi

echo
echo "== gpu-hf summary: ${device:-unknown device} (logs in $logs)"
printf '%s\n' "${summary[@]}"
exit $failed
