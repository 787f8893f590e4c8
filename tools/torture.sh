#!/usr/bin/env bash
# torture.sh — the kernel cache under abuse, on a CPU machine (compile-only
# for sm_90a; no GPU needed). Three trials, each on a fresh cache:
#   concurrent  several stof-warm processes (two workers each) compile one
#               workload into one cache at once, each in its own order;
#   kill        stof-warm killed with SIGKILL (its whole process group,
#               workers mid-transaction included) at random moments, the
#               cache read by stof-dump just before each kill, then resumed
#               until done;
#   truncate    the cache cut at a random page: stof-warm must refuse it and
#               name `stof-dump recover`, which saves the intact entries
#               into a new file that stof-warm then completes.
# Each trial ends with `stof-dump check` and counts entries lost: kernels
# present before that are gone after, and cases that a run over the whole
# workload still has to compile. The concurrent and kill trials must lose
# nothing; the truncated one loses what its cut pages held. Prints a summary
# last. Builds nothing: run `make` first.
#
# usage: bash tools/torture.sh [PROCESSES [KILLS]]   (default 4 and 6)
# Environment: STOF_BUILD (default build), TORTURE_DIR (default
# $STOF_BUILD/torture: caches and logs), STOF_SEED (the random moments).
# Exit status: 0 nothing lost where nothing may be, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

build=${STOF_BUILD:-build}
dir=${TORTURE_DIR:-$build/torture}
procs=${1:-4}
kills=${2:-6}
seed=${STOF_SEED:-$(date +%s)}
RANDOM=$((seed % 32768))
warm=$build/stof-warm
dump=$build/stof-dump
for b in "$warm" "$dump"; do
    if [[ ! -x $b ]]; then
        echo "torture: $b is missing: run make first" >&2
        exit 1
    fi
done
rm -rf "$dir"
mkdir -p "$dir"
export STOF_NO_GPU=1
echo "torture: seed $seed (set STOF_SEED to replay), $procs processes, $kills kills; files in $dir"

# The workload: 120 LayerNorm kernels (a full run takes long enough that
# the kills land in it) and a small attention case (3 kernels).
cases=()
for ((h = 64; h <= 3840; h += 64)); do
    for t in fp16 bf16; do
        cases+=(--ln "rows=4096,hidden=$h,$t")
    done
done
cases+=(--mha "b=1,h=2,l=256,d=32,fp16,causal_window:64")
ncases=$((${#cases[@]} / 2))

# Cases in a shuffled order (pairs of words kept together).
shuffled() {
    local idx=() i j t
    for ((i = 0; i < ncases; i++)); do idx+=("$i"); done
    for ((i = ncases - 1; i > 0; i--)); do
        j=$((RANDOM % (i + 1)))
        t=${idx[$i]} idx[$i]=${idx[$j]} idx[$j]=$t
    done
    for i in "${idx[@]}"; do printf '%s\n%s\n' "${cases[$((2 * i))]}" "${cases[$((2 * i + 1))]}"; done
}

# keys CACHE: the kernel keys in a cache, sorted, one a line.
keys() { "$dump" --cache "$1" list --json 2> /dev/null | grep -o '"key": "[0-9a-f]*"' | cut -d'"' -f4 | sort; }

# check CACHE LOG: stof-dump check; 0 when sound.
check() { "$dump" --cache "$1" check > "$2" 2>&1; }

# verify CACHE NAME: one more run over the whole workload must find every
# kernel in the cache; prints the number of kernels it had to compile.
verify() {
    local log=$dir/$2-verify.log
    "$warm" --cache "$1" --arch sm_90a --compile-only --jobs 2 --quiet "${cases[@]}" > "$log" 2>&1
    sed -n 's/^  NVRTC: \([0-9]*\) kernel.*/\1/p' "$log" | tail -n 1
}

failed=0
summary=()

# ---- concurrent ----
cache=$dir/concurrent.db
echo "== concurrent: $procs stof-warm processes into $cache"
pids=()
t0=$(date +%s)
for ((p = 0; p < procs; p++)); do
    mapfile -t order < <(shuffled)
    "$warm" --cache "$cache" --arch sm_90a --compile-only --jobs 2 --quiet "${order[@]}" \
        > "$dir/concurrent-$p.log" 2>&1 &
    pids+=($!)
done
bad=0
for ((p = 0; p < procs; p++)); do
    if ! wait "${pids[$p]}"; then
        bad=$((bad + 1))
        echo "torture: concurrent process $p failed:"
        tail -n 5 "$dir/concurrent-$p.log"
    fi
done
compiled=$(cat "$dir"/concurrent-*.log | sed -n 's/^  NVRTC: \([0-9]*\) kernel.*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
check "$cache" "$dir/concurrent-check.log"
ok=$?
n=$(keys "$cache" | wc -l)
again=$(verify "$cache" concurrent)
lost=$((${again:-999}))
echo "   $procs processes compiled $compiled kernels between them in $(($(date +%s) - t0)) s; the cache" \
     "holds $n; check: $(sed -n 's/^result *//p' "$dir/concurrent-check.log"); a run over the workload" \
     "compiled ${again:-?} kernels (lost)"
if ((bad || ok != 0 || lost != 0)); then failed=1; fi
summary+=("concurrent  $procs processes x $ncases cases into one cache: $n kernels, $bad failed, check $([[ $ok == 0 ]] && echo ok || echo FAILED), lost $lost")

# ---- kill ----
cache=$dir/kill.db
echo "== kill: stof-warm killed with SIGKILL $kills times into $cache, then resumed"
lost=0 seen=0 bad_checks=0
for ((k = 1; k <= kills; k++)); do
    mapfile -t order < <(shuffled)
    setsid "$warm" --cache "$cache" --arch sm_90a --compile-only --jobs 2 --quiet "${order[@]}" \
        > "$dir/kill-$k.log" 2>&1 &
    pid=$!
    ms=$((200 + RANDOM % 2800))
    sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
    keys "$cache" > "$dir/kill-$k-before.keys"
    kill -KILL -- "-$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    keys "$cache" > "$dir/kill-$k-after.keys"
    gone=$(comm -23 "$dir/kill-$k-before.keys" "$dir/kill-$k-after.keys" | wc -l)
    before=$(wc -l < "$dir/kill-$k-before.keys")
    after=$(wc -l < "$dir/kill-$k-after.keys")
    check "$cache" "$dir/kill-$k-check.log"
    c=$?
    ((c != 0)) && bad_checks=$((bad_checks + 1))
    lost=$((lost + gone))
    seen=$after
    echo "   kill $k after ${ms} ms: $before kernels before, $after after, $gone lost; check:" \
         "$(sed -n 's/^result *//p' "$dir/kill-$k-check.log")"
done
"$warm" --cache "$cache" --arch sm_90a --compile-only --jobs 2 --quiet "${cases[@]}" \
    > "$dir/kill-resume.log" 2>&1
rc=$?
echo "   resumed: $(grep '^stof-warm: ' "$dir/kill-resume.log" | tail -n 1) (exit $rc)"
check "$cache" "$dir/kill-check.log"
ok=$?
again=$(verify "$cache" kill)
lost=$((lost + ${again:-999}))
n=$(keys "$cache" | wc -l)
echo "   the cache holds $n kernels; check: $(sed -n 's/^result *//p' "$dir/kill-check.log");" \
     "a run over the workload compiled ${again:-?} kernels"
if ((rc != 0 || ok != 0 || bad_checks || lost != 0)); then failed=1; fi
summary+=("kill        $kills SIGKILLs at random moments, resumed: $n kernels, check $([[ $ok == 0 && $bad_checks == 0 ]] && echo "ok after every kill" || echo FAILED), lost $lost")

# ---- truncate ----
src=$dir/kill.db cut=$dir/truncated.db new=$dir/recovered.db
echo "== truncate: $src cut at a random page, then recovered into $new"
psize=$(od -An -tu1 -j16 -N2 "$src" | awk '{ p = $1 * 256 + $2; print p == 1 ? 65536 : p }')
pages=$(($(stat -c %s "$src") / psize))
at=$((pages / 4 + RANDOM % (pages / 2)))
head -c $((at * psize)) "$src" > "$cut"
total=$(keys "$src" | wc -l)
"$warm" --cache "$cut" --arch sm_90a --compile-only --quiet "${cases[@]}" > "$dir/truncate-warm.log" 2>&1
wrc=$?
sed 's/^/   | /' "$dir/truncate-warm.log"
names=0
grep -q "recover NEW.db" "$dir/truncate-warm.log" && names=1
"$dump" --cache "$cut" recover "$new" > "$dir/recover.log" 2>&1
rrc=$?
sed 's/^/   | /' "$dir/recover.log" | head -n 12
check "$new" "$dir/truncate-check.log"
ok=$?
kept=$(keys "$new" | wc -l)
recompiled=$(verify "$new" truncate)
again=$(verify "$new" truncate-2)
echo "   cut at page $at of $pages ($psize-byte pages): kept $kept of $total kernels, lost" \
     "$((total - kept)); stof-warm said recover: $([[ $names == 1 ]] && echo yes || echo NO) (exit $wrc);" \
     "recover exit $rrc; check: $(sed -n 's/^result *//p' "$dir/truncate-check.log");" \
     "warm then compiled ${recompiled:-?} kernels, and ${again:-?} on a second run"
if ((wrc != 2 || names != 1 || rrc > 1 || ok != 0 || ${again:-1} != 0)); then failed=1; fi
summary+=("truncate    cut at page $at of $pages: kept $kept of $total kernels, lost $((total - kept)) (their pages were cut); check $([[ $ok == 0 ]] && echo ok || echo FAILED); warm recompiled ${recompiled:-?} kernels")

echo
echo "== torture summary (seed $seed)"
for s in "${summary[@]}"; do
    echo "$s"
done
echo "result      $([[ $failed == 0 ]] && echo "PASS: nothing lost where nothing may be" || echo FAILED)"
exit $failed
