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
#   bash tools/gpu-hf.sh e2e-rows [ARG]  bench/e2e.py a process a row (its --list-rows of
#                                     ARGs, e.g. --models bert-base,mistral-7b --layers 8),
#                                     under a time budget: $STOF_E2E_BUDGET seconds (540,
#                                     a lent machine's call), no row started with fewer
#                                     than $STOF_E2E_ROW (120) left; it prints the rows left
#                                     over as the command that runs them ($STOF_E2E_ROWS:
#                                     the row names to run, else all)
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
all | tests | e2e | e2e-rows) ;;
-h | --help)
    sed -n '2,/^set /s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
*)
    echo "usage: bash tools/gpu-hf.sh [tests | e2e [ARG...] | e2e-rows [ARG...]]" >&2
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

if [[ $mode == e2e-rows ]]; then
    budget=${STOF_E2E_BUDGET:-540} need=${STOF_E2E_ROW:-120}
    if ! listed=$(python3 bench/e2e.py --list-rows "$@"); then
        echo "gpu-hf: bench/e2e.py --list-rows $* failed" >&2
        exit 2
    fi
    left=()
    while IFS='|' read -r name row; do
        [[ -z $name ]] && continue
        if [[ -n ${STOF_E2E_ROWS:-} && " $STOF_E2E_ROWS " != *" $name "* ]]; then
            continue
        fi
        if ((budget - SECONDS < need)); then
            left+=("$name")
            continue
        fi
        log=$logs/e2e-${name//\//_}
        echo "gpu-hf: bench/e2e.py $row, $((budget - SECONDS)) s of the budget left (log: $log.log)"
        # The row's own arguments come last, so that they pick it.
        # shellcheck disable=SC2086
        STOF_CACHE=${STOF_BENCH_CACHE:-$build/bench-cache.db} timeout $((budget - SECONDS)) \
            python3 bench/e2e.py "$@" $row > "$log.log" 2> "$log.err"
        rc=$?
        [[ $rc == 0 ]] || failed=1
        summary+=("e2e $name $([[ $rc == 0 ]] && echo PASS || echo "FAIL($rc)")")
        [[ $rc == 0 ]] || while IFS= read -r line; do summary+=("    $line"); done < <(
            { grep -E '^(e2e: .*failed|[A-Za-z]*Error)' "$log.err" || tail -n 2 "$log.err"; } |
                tail -n 8)
        while IFS= read -r line; do summary+=("    $line"); done < <(
            grep -E '^(model |planning|summary|tolerance|[a-z][a-z0-9.]*-[a-z0-9.]+ +[0-9])' \
                "$log.log" | grep -v ': not measured$')
    done <<< "$listed"
    if ((${#left[@]})); then
        summary+=("e2e: ${#left[@]} rows left over: STOF_E2E_ROWS='${left[*]}' bash tools/gpu-hf.sh e2e-rows $*")
    fi
fi

echo
echo "== gpu-hf summary: ${device:-unknown device} (logs in $logs)"
printf '%s\n' "${summary[@]}"
exit $failed
