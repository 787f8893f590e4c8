#!/usr/bin/env bash
# demo.sh — `make demo`: the fused LayerNorm (8 x 2048 rows, hidden 768,
# fp16) in two processes on one fresh kernel cache. The first compiles with
# NVRTC and stores the kernel; the second must load it from the cache with
# no compile at all (else this fails). Prints a short summary last. With no
# GPU both processes compile for sm_90a only, and the summary says what was
# not run and why. Builds nothing: run `make` first.
#
# Environment: STOF_BUILD (default build), STOF_DEMO_DIR (default
# $STOF_BUILD/demo: the two logs), STOF_DEMO_CACHE (default
# $STOF_DEMO_DIR/cache.db; removed first), STOF_SEED.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${STOF_BUILD:-build}
bin=$build/stof-demo
dir=${STOF_DEMO_DIR:-$build/demo}
if [[ ! -x $bin ]]; then
    echo "demo: $bin is missing: run make first" >&2
    exit 1
fi
cache=${STOF_DEMO_CACHE:-$dir/cache.db}
mkdir -p "$dir"
rm -rf "$cache" "$cache-wal" "$cache-shm"
args=(--cache "$cache" --rows $((8 * 2048)) --hidden 768 --dtype fp16)

run() { # run NAME: one process, its output shown and kept in $dir/NAME.log
    echo "== $1"
    if ! "$bin" "${args[@]}" > "$dir/$1.log" 2>&1; then
        cat "$dir/$1.log"
        echo "demo: $1 failed (log: $dir/$1.log)" >&2
        exit 1
    fi
    cat "$dir/$1.log"
}
# field LOG KEY: KEY's value on the log's "result:" line
field() { sed -n 's/^result: .*\b'"$2"'=\([^ ]*\).*/\1/p' "$1" | tail -n 1; }

run first
run second
first=$dir/first.log second=$dir/second.log
for f in "$first" "$second"; do
    if [[ -z $(field "$f" compiles) ]]; then
        echo "demo: no result line in $f" >&2
        exit 1
    fi
done

c1=$(field "$first" compiles) c2=$(field "$second" compiles) h2=$(field "$second" cache_hits)
echo
echo "== demo summary"
how() { # how COMPILES HITS: what got the kernel
    if [[ $1 -gt 0 ]]; then echo NVRTC; elif [[ $2 -gt 0 ]]; then echo "cache hit"; else echo "in memory"; fi
}
plural() { [[ $1 == 1 ]] || echo s; }
echo "first process: $(how "$c1" "$(field "$first" cache_hits)") $(field "$first" ready_ms) ms" \
     "($c1 compile$(plural "$c1")); second: $(how "$c2" "$h2") $(field "$second" ready_ms) ms" \
     "($c2 compile$(plural "$c2"), $h2 cache hit$(plural "$h2"))"
if [[ $(field "$second" gpu) == 1 ]]; then
    awk -v us="$(field "$second" kernel_us)" -v k="$(field "$second" kernel_gbs)" \
        -v c="$(field "$second" copy_gbs)" 'BEGIN {
        if (c > 0)
            printf "LayerNorm 8x2048x768 fp16: %.1f us, %.2f TB/s = %.0f%% of copy %.2f TB/s\n",
                   us, k / 1000, 100 * k / c, c / 1000
        else
            printf "LayerNorm 8x2048x768 fp16: %.1f us, %.2f TB/s (copy bandwidth not measured)\n",
                   us, k / 1000 }'
    echo "max abs err $(field "$second" max_abs_err), rel L2 $(field "$second" rel_l2) against the CPU reference (double)"
else
    echo "NOT RUN on a GPU: $(sed -n 's/^not run: //p' "$second" | tail -n 1)"
    grep '^the kernel for ' "$second" | tail -n 1
fi
if [[ $c2 != 0 || $h2 -lt 1 ]]; then
    echo "FAILED: the second process should find the kernel in the cache, but compiled $c2 time(s)" \
         "with $h2 cache hit(s)"
    exit 1
fi
