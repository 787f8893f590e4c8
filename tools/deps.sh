#!/usr/bin/env bash
# tools/deps.sh — what `make demo` and `make test` need on the build machine,
# checked before they build. What is missing is installed with apt-get when
# this runs as root on a machine that has it; otherwise the exact command is
# printed and the status is 1. The CUDA toolkit is not installed here (it is
# NVIDIA's, not Debian's): without NVRTC's header the message says where it
# was looked for and how to name another place.
#
#   bash tools/deps.sh build|demo|test
#
# build: a C compiler, the CUDA toolkit, SQLite's and Check's headers and
#        libraries (Check and subunit statically), hiredis (header and static
#        library: without it stof builds with the Redis tier left out, so it is
#        wanted, not required, when apt-get cannot be used), pkg-config.
# demo:  what build needs.
# test:  build's, and redis-server (the remote suite's real server) and python3
#        (the Python package's suites).
set -uo pipefail

goal=${1:-build}
case $goal in
build | demo | test) ;;
*)
    echo "usage: bash tools/deps.sh build|demo|test" >&2
    exit 2
    ;;
esac
cc=${CC:-cc}
cuda=${CUDA:-/usr/local/cuda}

has_header() { printf '#include <%s>\n' "$1" | "$cc" -E -x c - >/dev/null 2>&1; }
has_static() { local f; f=$("$cc" -print-file-name="$1" 2>/dev/null) && [[ $f == /* && -f $f ]]; }

need=() wanted=()
command -v "$cc" >/dev/null 2>&1 || need+=(build-essential)
if command -v "$cc" >/dev/null 2>&1; then
    has_header sqlite3.h || need+=(libsqlite3-dev)
    { has_header check.h && has_static libcheck.a; } || need+=(check)
    has_static libsubunit.a || need+=(libsubunit-dev)
    { has_header hiredis/hiredis.h && has_static libhiredis.a; } || wanted+=(libhiredis-dev)
fi
command -v pkg-config >/dev/null 2>&1 || wanted+=(pkg-config)
if [[ $goal == test ]]; then
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    command -v python3 >/dev/null 2>&1 || need+=(python3)
fi

missing=("${need[@]}" "${wanted[@]}")
if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "make $goal: installing ${missing[*]} (apt-get, as root)"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get update -qq || ! apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
            echo "make $goal: apt-get could not install ${missing[*]}" >&2
            exit 1
        fi
    elif ((${#need[@]})); then
        echo "make $goal: missing ${missing[*]}; install them with:" >&2
        echo "    sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    else
        echo "make $goal: going on without ${wanted[*]} (the Redis tier is left out);" \
            "to have it: sudo apt-get install -y ${wanted[*]}" >&2
    fi
fi

if [[ ! -e $cuda/include/nvrtc.h ]]; then
    echo "make $goal: no CUDA toolkit at $cuda (NVRTC's header and library are needed):" \
        "install NVIDIA's CUDA toolkit there, or name its folder: make $goal CUDA=/path/to/cuda" >&2
    exit 1
fi
exit 0
