#!/usr/bin/env bash
# tools/floors.sh — the house's floors, and the check that keeps them
# (`make floors`; `make all` runs it whenever a source changes).
#
# A file may use files of its own room and of rooms on lower floors: never a
# room on a higher floor, nor another room of its own floor. A use is a
# quoted #include and, for the objects named on the command line, a
# reference to a name that another object defines (what the linker
# resolves), so that a call declared in the public header cannot climb
# unseen. Modules (x.c with its x.h) must also use each other without a
# circle. Every breach is named, and the exit status is then 1.
#
#   tools/floors.sh [--root DIR] [OBJECT.o ...]
#
# OBJECT.o is build/obj/PATH.o (or build/asan/PATH.o) of source PATH.c.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
if [[ ${1:-} == --root ]]; then
    root=$(cd "$2" && pwd)
    shift 2
fi
cd "$root"

# Rooms and their floors, from the ground up. src/stof.h is the ground: the
# public contract (status, dtypes, descriptors) that every floor speaks, as
# SQLite's layers all speak sqlite3.h; it includes nothing, and the call
# check holds each of its functions to the floor that defines it.
rooms='
src/stof.h   0
src/base     1
cache        2
codegen      2
src/gpu      3
src/attn     4
src/layer    5
src          6
tools        7
bench        8
tests        9
'

dirs=()
for d in src cache codegen tools bench tests; do
    [[ -d $d ]] && dirs+=("$d")
done
sources=$(find "${dirs[@]}" -name '*.[ch]' | sort)

# "user<TAB>used<TAB>how" rows. Quoted includes are resolved as the compiler
# does (beside the file, then -Isrc, -I., -Itests); build/gen's are skipped.
includes() {
    declare -A known
    local f inc cand
    for f in $sources; do known[$f]=1; done
    for f in $sources; do
        while read -r inc; do
            for cand in "$(dirname "$f")/$inc" "src/$inc" "$inc" "tests/$inc"; do
                cand=${cand#./}
                if [[ -n ${known[$cand]:-} ]]; then
                    printf '%s\t%s\tincludes\n' "$f" "$cand"
                    break
                fi
            done
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
}

# The same rows from the objects: who refers to a name another one defines.
calls() {
    local o src
    for o in "$@"; do
        src=${o#build/obj/}
        src=${src#build/asan/}
        src=${src%.o}.c
        [[ -f $src ]] || continue
        nm --defined-only -g "$o" | awk -v s="$src" 'NF == 3 { print "D\t" $3 "\t" s }'
        nm -u "$o" | awk -v s="$src" '{ print "U\t" $NF "\t" s }'
    done | awk -F'\t' '
        $1 == "D" { def[$2] = $3; next }
        { use[++n] = $3 "\t" $2 }
        END {
            for (i = 1; i <= n; i++) {
                split(use[i], u, "\t")
                if ((u[2] in def) && def[u[2]] != u[1])
                    print u[1] "\t" def[u[2]] "\tcalls " u[2]
            }
        }'
}

edges=$( { includes; calls "$@"; } | sort -u)

status=0
breaches=$(printf '%s\n' "$edges" | awk -F'\t' -v rooms="$rooms" '
    BEGIN {
        n = split(rooms, l, "\n")
        for (i = 1; i <= n; i++)
            if (split(l[i], f, " ") == 2)
                floor[f[1]] = f[2]
    }
    # A file belongs to the longest room that is its path or a folder of it.
    function room(p,   r, best) {
        best = ""
        for (r in floor)
            if ((p == r || index(p, r "/") == 1) && length(r) > length(best))
                best = r
        return best
    }
    NF == 3 {
        a = room($1); b = room($2)
        if (a == "" || b == "" || a == b)
            next
        if (floor[b] > floor[a])
            printf "upward: %s (%s, floor %d) %s %s (%s, floor %d)\n", $1, a, floor[a], $3, $2, b, floor[b]
        else if (floor[b] == floor[a])
            printf "sideways: %s (%s) %s %s (%s), both on floor %d\n", $1, a, $3, $2, b, floor[a]
    }')
if [[ -n $breaches ]]; then
    printf '%s\n' "$breaches" | sed 's/^/floors: /' >&2
    status=1
fi

# Circles: modules (x.c and x.h are one) must form no loop; tsort names the
# modules of the first one it meets.
loop=$(printf '%s\n' "$edges" | awk -F'\t' 'NF == 3 {
        a = $1; b = $2; sub(/\.[ch]$/, "", a); sub(/\.[ch]$/, "", b)
        if (a != b) print a, b
    }' | tsort 2>&1 >/dev/null |
    awk '/input contains a loop/ { if (seen++) exit; next } { sub(/^tsort: /, ""); printf "%s -> ", $0 }' || true)
if [[ -n $loop ]]; then
    printf 'floors: a circle of modules: %s(and round again)\n' "$loop" >&2
    status=1
fi

if [[ $status == 0 ]]; then
    printf 'floors: %d uses checked (%s): none upward or sideways, no circle\n' \
        "$(printf '%s\n' "$edges" | grep -c .)" "$( (($# > 0)) && echo "includes and calls" || echo "includes")"
fi
exit $status
