#!/usr/bin/env bash
# gpu-check.sh — the device loop. On the GPU machine, from a checkout whose
# build/ was made elsewhere (this builds nothing: the GPU machine has no
# Check or SQLite headers), it runs the test binary with the GPU suites, the
# Python package's GPU tests, the demo, and every benchmark (build/bench_*),
# keeps their logs under ${OUT:-/tmp/gpu-check}, and prints a summary table
# last.
#
#   bash tools/gpu-check.sh              tests, demo, benchmarks
#   bash tools/gpu-check.sh tests        tests and demo only
#   bash tools/gpu-check.sh warm         stof-warm --tune full over bench/workloads/*.json
#   bash tools/gpu-check.sh bench [ARG]  benchmarks only (make bench); ARGs go to
#                                        bench/peers_mha.py, e.g. --suite bert-heads --seq 2048
#
# The attention benchmark runs as bench/peers_mha.py (stof through the Python
# package, every peer in the same process; its turn comes with build/bench_mha)
# and the encoder-layer one (build/bench_layer) through bench/peers_layer.py,
# each timing its PyTorch peers in the same run. $STOF_LAYER_ARGS goes to
# peers_layer.py, e.g. STOF_LAYER_ARGS="--model bert-base --seq 2048
# --peers eager,sdpa,c-flex": its torch.compile peers compile once per case
# and make it the slowest benchmark. Warm and bench share the
# cache $STOF_BENCH_CACHE (default $STOF_BUILD/bench-cache.db), so a bench
# after a warm shows zero NVRTC compiles and zero timing runs; on a lent
# machine, run both in one call so that the cache is still there.
# CK_RUN_SUITE=gpu_mha (any suite) limits the tests. On an H100 the GPU
# suites take about 2.2 (gpu_mha), 4.8 (gpu_layernorm), 1.5 (gpu_gemm) and
# 5.2 (gpu_layer) minutes, most of it NVRTC; tests and demo together run past
# a lent machine's 10-minute call, so run them there a suite or two a call.
# A full warm of bench/workloads/layers.json takes about 5 minutes.
# A benchmark's summary is its lines starting "summary:", else its last line.
# Exit status: 0 when everything that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

mode=${1:-all}
case $mode in
all | tests | warm | bench) ;;
-h | --help)
    sed -n '2,/^set /s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
*)
    echo "usage: bash tools/gpu-check.sh [tests | warm | bench [ARG...]]" >&2
    exit 2
    ;;
esac
shift $(($# > 0 ? 1 : 0))

build=${STOF_BUILD:-build}
logs=${OUT:-/tmp/gpu-check}
bench_cache=${STOF_BENCH_CACHE:-$build/bench-cache.db}
mkdir -p "$logs"
export STOF_BUILD=$build

names=() states=() details=()
failed=0
row() { # row NAME STATE DETAIL-LINES
    names+=("$1")
    states+=("$2")
    details+=("$3")
    case $2 in PASS | SKIP) ;; *) failed=1 ;; esac
}

# Shared libraries a carried binary needs but this machine lacks.
missing_libs() { ldd "$1" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' '; }

device=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
echo "gpu-check: ${device:-no nvidia-smi}; logs in $logs"

if [[ $mode == warm ]]; then
    echo "gpu-check: warming $bench_cache (log: $logs/warm.log)"
    "$build/stof-warm" --cache "$bench_cache" --tune full bench/workloads/attention.json \
        bench/workloads/layers.json > "$logs/warm.log" 2>&1
    rc=$?
    row warm "$([[ $rc == 0 ]] && echo PASS || echo "FAIL($rc)")" "$(grep -A3 '^stof-warm: ' "$logs/warm.log" | tail -n 4)"
fi

if [[ $mode == all || $mode == tests ]]; then
    tests=$build/stof-tests
    if [[ ! -x $tests ]]; then
        row tests MISSING "$tests not found: run make on the build machine and carry $build/"
    elif [[ -n $(missing_libs "$tests") ]]; then
        row tests MISSING "$tests needs libraries this machine lacks: $(missing_libs "$tests")"
    else
        echo "gpu-check: running $tests (log: $logs/tests.log)"
        "$tests" > "$logs/tests.log" 2>&1
        rc=$?
        line=$(grep -E '^[0-9]+%: Checks: ' "$logs/tests.log" | tail -n 1)
        gpu=$(grep -E '^stof tests: (GPU present|NO GPU)' "$logs/tests.log" | head -n 1)
        fails=$(grep -E ':[FE]:' "$logs/tests.log" | head -n 5)
        detail=${line:-"no Check summary line (crashed? exit $rc)"}
        [[ $gpu == *"NO GPU"* ]] && detail+=$'\n'"GPU suites NOT run: ${gpu#*NOT run }"
        [[ -n $fails ]] && detail+=$'\n'$fails
        row tests "$([[ $rc == 0 && -n $line ]] && echo PASS || echo FAIL)" "$detail"
    fi

    # The Python package's GPU tests (test_gpu*.py: stof.attention, decode,
    # varlen, the layers, stof.hf), where torch is; libstof.so from $build.
    if ! python3 -c "import torch" 2> /dev/null; then
        row python SKIP "no torch for python3: the package's GPU tests NOT run"
    else
        echo "gpu-check: running python/tests/test_gpu*.py (log: $logs/python.log)"
        lib=$(cd "$build" && pwd)/libstof.so pkg=$(pwd)/python
        (cd python/tests && STOF_LIB=$lib PYTHONPATH=$pkg \
            python3 -m unittest -v test_gpu test_gpu_hf) > "$logs/python.log" 2>&1
        rc=$?
        ran=$(grep -E '^Ran [0-9]+ tests' "$logs/python.log" | tail -n 1)
        end=$(grep -E '^(OK|FAILED)' "$logs/python.log" | tail -n 1)
        fails=$(grep -E '^(FAIL|ERROR): ' "$logs/python.log" | head -n 5)
        detail="${ran:-"no unittest summary (exit $rc)"} ${end}"
        [[ -n $fails ]] && detail+=$'\n'$fails
        state=$([[ $rc == 0 && -n $ran ]] && echo PASS || echo FAIL)
        [[ $state == PASS && $ran == "Ran 0 tests"* ]] && state=SKIP detail+=" (torch sees no GPU)"
        row python "$state" "$detail"
    fi

    if [[ ! -x $build/stof-demo || ! -x $build/stof-demo-attn ]]; then
        row demo MISSING "$build/stof-demo or $build/stof-demo-attn not found"
    else
        echo "gpu-check: running tools/demo.sh (log: $logs/demo.log)"
        STOF_DEMO_DIR=$logs/demo bash tools/demo.sh > "$logs/demo.log" 2>&1
        rc=$?
        summary=$(sed -n '/^== demo summary/,$p' "$logs/demo.log" | tail -n +2)
        row demo "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" \
            "${summary:-"no summary (exit $rc): $(tail -n 3 "$logs/demo.log")"}"
    fi
fi

benches=0
for b in "$build"/bench_*; do
    [[ $mode == all || $mode == bench ]] || break
    [[ -x $b && -f $b ]] || continue
    benches=$((benches + 1))
    name=$(basename "$b")
    echo "gpu-check: running $b (log: $logs/$name.log)"
    if [[ $name == bench_mha ]]; then
        # stof through the Python package, in one process with the peers.
        STOF_CACHE=$bench_cache STOF_LIB=$build/libstof.so PYTHONUNBUFFERED=1 \
            python3 bench/peers_mha.py "$@" > "$logs/$name.log" 2>&1
        rc=$?
        summary=$(grep '^summary:' "$logs/$name.log")
    elif [[ $name == bench_layer ]]; then
        # shellcheck disable=SC2086 # STOF_LAYER_ARGS is a list of words
        PYTHONUNBUFFERED=1 python3 bench/peers_layer.py --stof "$b" --cache "$bench_cache" \
            ${STOF_LAYER_ARGS:-} > "$logs/$name.log" 2>&1
        rc=$?
        summary=$(grep '^summary:' "$logs/$name.log")
    else
        "$b" > "$logs/$name.log" 2>&1
        rc=$?
        summary=$(grep '^summary:' "$logs/$name.log")
    fi
    [[ -z $summary ]] && summary=$(tail -n 1 "$logs/$name.log")
    [[ -z $summary ]] && summary="(no output)"
    row "$name" "$([[ $rc == 0 ]] && echo PASS || echo "FAIL($rc)")" "$summary"
done
[[ $benches == 0 && ($mode == all || $mode == bench) ]] && row bench SKIP "no benchmarks built ($build/bench_*)"

echo
echo "== gpu-check summary: ${device:-unknown device} (logs in $logs)"
for i in "${!names[@]}"; do
    first=1
    while IFS= read -r line; do
        if ((first)); then
            printf '%-14s %-8s %s\n' "${names[$i]}" "${states[$i]}" "$line"
            first=0
        else
            printf '%-14s %-8s %s\n' "" "" "$line"
        fi
    done <<< "${details[$i]}"
done
exit $failed
