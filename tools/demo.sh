#!/usr/bin/env bash
# demo.sh — `make demo`, in two steps, each in two processes on one fresh
# kernel cache: the first process compiles with NVRTC (and, on a GPU,
# searches) and stores what it found; the second must get it from the
# cache with no compile at all (else this fails).
#   1. masked attention (stof-demo-attn): BERT-base heads (batch 8, 12
#      heads, head_dim 64, fp16) at L 2048 under a Longformer-style mask,
#      window:256+global:64; on a GPU, stof's time, the same kernel's time
#      on the dense mask, the share of the work the mask saved, and a check
#      against the CPU reference.
#   2. the fused bias + residual + LayerNorm (stof-demo), 8 x 2048 rows of
#      768, fp16.
# Prints a short summary last. With no GPU every process compiles for
# sm_90a only, and the summary says what was not run and why. Builds
# nothing: run `make` first.
#
# Environment: STOF_BUILD (default build), STOF_DEMO_DIR (default
# $STOF_BUILD/demo: the logs), STOF_DEMO_CACHE (default
# $STOF_DEMO_DIR/cache.db; removed first), STOF_SEED, STOF_DEMO_ATTN_ARGS
# (more stof-demo-attn options, after the defaults: the tests use a smaller
# case).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${STOF_BUILD:-build}
dir=${STOF_DEMO_DIR:-$build/demo}
for bin in "$build/stof-demo-attn" "$build/stof-demo"; do
    if [[ ! -x $bin ]]; then
        echo "demo: $bin is missing: run make first" >&2
        exit 1
    fi
done
cache=${STOF_DEMO_CACHE:-$dir/cache.db}
mkdir -p "$dir"
rm -rf "$cache" "$cache-wal" "$cache-shm"
attn_args=(--cache "$cache" --batch 8 --heads 12 --seq 2048 --head-dim 64 --dtype fp16
           --mask window:256+global:64)
read -r -a more <<< "${STOF_DEMO_ATTN_ARGS:-}"
attn_args+=(${more[@]+"${more[@]}"})
ln_args=(--cache "$cache" --rows $((8 * 2048)) --hidden 768 --dtype fp16)

run() { # run NAME PROGRAM ARGS...: one process, its output shown and kept in $dir/NAME.log
    local name=$1
    shift
    echo "== $name"
    if ! "$@" > "$dir/$name.log" 2>&1; then
        cat "$dir/$name.log"
        echo "demo: $name failed (log: $dir/$name.log)" >&2
        exit 1
    fi
    cat "$dir/$name.log"
}
# field LOG KEY: KEY's value on the log's "result:" line
field() { sed -n 's/^result: .*\b'"$2"'=\([^ ]*\).*/\1/p' "$1" | tail -n 1; }

run attention-first "$build/stof-demo-attn" "${attn_args[@]}"
run attention-second "$build/stof-demo-attn" "${attn_args[@]}"
run layernorm-first "$build/stof-demo" "${ln_args[@]}"
run layernorm-second "$build/stof-demo" "${ln_args[@]}"
a1=$dir/attention-first.log a2=$dir/attention-second.log
first=$dir/layernorm-first.log second=$dir/layernorm-second.log
for f in "$a1" "$a2" "$first" "$second"; do
    if [[ -z $(field "$f" compiles) ]]; then
        echo "demo: no result line in $f" >&2
        exit 1
    fi
done

how() { # how COMPILES HITS: what got the kernel
    if [[ $1 -gt 0 ]]; then echo NVRTC; elif [[ $2 -gt 0 ]]; then echo "cache hit"; else echo "in memory"; fi
}
plural() { [[ $1 == 1 ]] || echo s; }
pct() { awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }'; }

echo
echo "== demo summary"
ac1=$(field "$a1" compiles) ac2=$(field "$a2" compiles) ah2=$(field "$a2" cache_hits)
kernel="$(field "$a2" kernel) on $(field "$a2" engine), $(field "$a2" tile) tiles"
case_="attention $(field "$a2" case | tr , ' ') $(field "$a2" mask)"
if [[ $(field "$a2" gpu) == 1 ]]; then
    awk -v s="$(field "$a2" stof_ms)" -v d="$(field "$a2" dense_ms)" -v x="$(field "$a2" speedup)" \
        -v k="$kernel" -v saved="$(field "$a2" saved)" -v c="$case_" 'BEGIN {
        printf "%s: stof %.3f ms, the same kernel (%s) on the dense mask %.3f ms: %.2fx; the mask saved %.1f%% of the work\n",
               c, s, k, d, x, 100 * saved }'
    echo "  checked against the CPU reference (double): rel L2 $(field "$a2" rel_l2), max abs err" \
         "$(field "$a2" max_abs_err): $([[ $(field "$a2" ok) == 1 ]] && echo ok || echo FAILED)"
    echo "  planned by NVRTC and the search in the first process: $(field "$a1" ready_ms) ms" \
         "($ac1 compile$(plural "$ac1"), $(field "$a1" timings) timings); second: $(how "$ac2" "$ah2")" \
         "$(field "$a2" ready_ms) ms ($ac2 compiles, $(field "$a2" timings) timings)"
else
    echo "$case_: compiled for $(field "$a2" arch) only;" \
         "the model's pick ($kernel) would skip $(pct "$(field "$a2" saved)") of the dense work"
    echo "  first process: $(how "$ac1" "$(field "$a1" cache_hits)") $(field "$a1" ready_ms) ms" \
         "($ac1 compile$(plural "$ac1")); second: $(how "$ac2" "$ah2") $(field "$a2" ready_ms) ms" \
         "($ac2 compiles, $ah2 cache hit$(plural "$ah2"))"
    echo "  NOT RUN on a GPU ($(sed -n 's/^not run: //p' "$a2" | tail -n 1)): stof's time, the" \
         "dense time and the check against the CPU reference need one"
fi

c1=$(field "$first" compiles) c2=$(field "$second" compiles) h2=$(field "$second" cache_hits)
echo "layernorm first process: $(how "$c1" "$(field "$first" cache_hits)") $(field "$first" ready_ms) ms" \
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
failed=0
if [[ $ac2 != 0 || $ah2 -lt 1 ]]; then
    echo "FAILED: the second attention process should find its kernels in the cache, but compiled" \
         "$ac2 time(s) with $ah2 cache hit(s)"
    failed=1
fi
if [[ $c2 != 0 || $h2 -lt 1 ]]; then
    echo "FAILED: the second process should find the kernel in the cache, but compiled $c2 time(s)" \
         "with $h2 cache hit(s)"
    failed=1
fi
exit $failed
