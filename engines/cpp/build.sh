#!/bin/sh
# Builds the C++ adapter kit (engines/cpp/build/), installing what it needs first where it
# can: with root and apt-get, the Debian packages g++, make, nlohmann-json3-dev and libb2-dev,
# only when the compiler or the headers are missing. Where they are missing and cannot be
# installed, it says so in one line and exits 0: the kit's tests then skip with that reason.
# Run by `make cpp` (and so by `make test`). Takes no arguments; builds no command from input.
set -u
cd "$(dirname "$0")" || exit 1
CXX="${CXX:-g++}"

probe() {  # can we compile and link against nlohmann/json and libb2?
    command -v "$CXX" >/dev/null 2>&1 || return 1
    command -v make >/dev/null 2>&1 || return 1
    mkdir -p build
    printf '#include <nlohmann/json.hpp>\n#include <blake2.h>\nint main() { blake2b_state s; return blake2b_init(&s, 8); }\n' \
        > build/probe.cpp
    "$CXX" -std=c++17 build/probe.cpp -o build/probe -lb2 >/dev/null 2>&1
    status=$?
    rm -f build/probe.cpp build/probe
    return $status
}

# Built and up to date: nothing to probe (the probe compiles a program, ~2 s, on every `make test`).
if command -v make >/dev/null 2>&1 && make --no-print-directory -q all 2>/dev/null; then
    exit 0
fi
if ! probe; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "cpp kit: installing g++ make nlohmann-json3-dev libb2-dev with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null 2>&1
        apt-get install -y -qq --no-install-recommends g++ make nlohmann-json3-dev libb2-dev >/dev/null 2>&1 \
            || echo "cpp kit: apt-get install failed"
    fi
fi
if ! probe; then
    echo "cpp kit: not built: needs $CXX (C++17), make, nlohmann/json and libb2 (apt-get install g++ make nlohmann-json3-dev libb2-dev)"
    exit 0
fi
exec make --no-print-directory -j2 all
