#!/usr/bin/env bash
# fuzz.sh — `make fuzz`: every fuzz target (tests/fuzz/fuzz_*.c: the JSON
# reader, the workload reader, the mask spec parser, the cache readers) for
# SECONDS each (default 60) under ASan and UBSan, starting from its corpus
# in tests/corpus/TARGET and its dictionary tests/fuzz/TARGET.dict. With
# clang's libFuzzer when it links ($FUZZ_CC, default clang: apt-get install
# clang libclang-rt-14-dev), coverage-guided; else the plain driver built
# with gcc, which mutates without guidance. New inputs libFuzzer finds go to
# build/fuzz/found-TARGET (copy the ones worth keeping into the corpus);
# findings to build/fuzz/crash-*. Prints a table last.
#
# usage: bash tools/fuzz.sh [SECONDS] [TARGET...]
# Exit status: 0 no finding, 1 a finding or a failed build.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

secs=${1:-60}
shift $(($# > 0 ? 1 : 0))
targets=("$@")
[[ ${#targets[@]} == 0 ]] && targets=(json workload mask cache)
cc=${FUZZ_CC:-clang}
out=build/fuzz
mkdir -p "$out"

probe=$(mktemp -d)
engine=driver
if command -v "$cc" > /dev/null &&
    echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
    "$cc" -x c -fsanitize=fuzzer,address,undefined - -o "$probe/probe" 2> /dev/null; then
    engine=libfuzzer
fi
rm -rf "$probe"
echo "fuzz: ${#targets[@]} target(s), $secs s each, with $([[ $engine == libfuzzer ]] &&
    echo "libFuzzer ($cc)" || echo "the plain driver (no libFuzzer: $cc -fsanitize=fuzzer does not link)")"

declare -A maxlen=([json]=16384 [workload]=16384 [mask]=600 [cache]=131072)
rows=()
failed=0
for t in "${targets[@]}"; do
    if [[ $engine == libfuzzer ]]; then
        bin=$out/libfuzzer_$t
    else
        bin=$out/replay_$t
    fi
    if ! make --no-print-directory "$bin" > "$out/build-$t.log" 2>&1; then
        echo "fuzz: building $bin failed (log: $out/build-$t.log)"
        tail -n 20 "$out/build-$t.log"
        rows+=("$(printf '%-9s %-9s %6s %12s %10s  %s' "$t" "$engine" - - - "BUILD FAILED")")
        failed=1
        continue
    fi
    log=$out/$t.log
    rm -f "$out"/crash-"$t"-* "$out"/"$t"-crash-* "$out"/"$t"-leak-* "$out"/"$t"-timeout-* \
        "$out"/"$t"-oom-*
    echo "fuzz: $t ($bin, log: $log)"
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    if [[ $engine == libfuzzer ]]; then
        mkdir -p "$out/found-$t"
        "$bin" -max_total_time="$secs" -dict="tests/fuzz/$t.dict" -max_len="${maxlen[$t]:-16384}" \
            -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/$t-" \
            "$out/found-$t" "tests/corpus/$t" > "$log" 2>&1
        rc=$?
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        per=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
        cov=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 | sed -n 's/.*cov: \([0-9]*\).*ft: \([0-9]*\).*/cov \1, ft \2/p')
        found=$(find "$out/found-$t" -type f | wc -l)
        note="$cov; $found new inputs"
    else
        FUZZ_ARTIFACTS=$out "$bin" -t "$secs" -dict "tests/fuzz/$t.dict" \
            -max_len "${maxlen[$t]:-16384}" "tests/corpus/$t" > "$log" 2>&1
        rc=$?
        line=$(grep -E '^replay_[a-z]+: ' "$log" | tail -n 1)
        execs=$(sed -n 's/.* replayed, \([0-9]*\) mutated.*/\1/p' <<< "$line")
        per=$(sed -n 's/.*(\([0-9]*\)\/s).*/\1/p' <<< "$line")
        note="no coverage feedback"
    fi
    crashes=$(find "$out" -maxdepth 1 -type f \( -name "crash-$t-*" -o -name "$t-crash-*" \
        -o -name "$t-leak-*" -o -name "$t-timeout-*" -o -name "$t-oom-*" \) | wc -l)
    if [[ $rc != 0 || $crashes != 0 ]]; then
        state="FINDING (exit $rc, $crashes saved)"
        failed=1
        grep -E 'ERROR|runtime error|check failed|Assertion|SUMMARY' "$log" | head -n 8
    else
        state="no finding"
    fi
    rows+=("$(printf '%-9s %-9s %6s %12s %10s  %s; %s' "$t" "$engine" "$secs" "${execs:-?}" \
        "${per:-?}" "$state" "$note")")
done

echo
echo "== fuzz summary (logs and findings in $out)"
printf '%-9s %-9s %6s %12s %10s  %s\n' TARGET ENGINE SECS EXECS "EXECS/S" RESULT
for r in "${rows[@]}"; do
    echo "$r"
done
exit $failed
