#!/usr/bin/env bash
# Builds one libFuzzer target with clang (-fsanitize=fuzzer,address,undefined).
#
#   tests/fuzz/build.sh <target-name> [extra sources...]
#
# compiles tests/fuzz/<target-name>.c + kernels/status.c + the extra sources (paths relative to
# the repository root, or absolute). Without extra sources, those listed in
# tests/fuzz/<target-name>.sources are used. Prints the path of the built binary.
#
# Environment: DS_FUZZ_CC (default: clang, else clang-14), DS_FUZZ_OUT (output directory, default
# build-fuzz/ at the repository root), DS_FUZZ_PKGS (pkg-config packages, default "jansson"),
# DS_FUZZ_CFLAGS (appended, e.g. "-fprofile-instr-generate -fcoverage-mapping" for a coverage
# build; see docs/fuzzing.md).
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 <target-name> [extra sources...]" >&2
    exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=$1
shift
src="$root/tests/fuzz/$target.c"
if [ ! -f "$src" ]; then
    echo "$0: $src: no such fuzz target" >&2
    exit 2
fi

extra=("$@")
if [ ${#extra[@]} -eq 0 ] && [ -f "$root/tests/fuzz/$target.sources" ]; then
    while read -r line; do
        line=${line%%#*}
        line=${line//[[:space:]]/}
        [ -n "$line" ] && extra+=("$line")
    done <"$root/tests/fuzz/$target.sources"
fi
sources=("$src" "$root/kernels/status.c")
for s in "${extra[@]}"; do
    case $s in
    /*) sources+=("$s") ;;
    *) sources+=("$root/$s") ;;
    esac
done

cc=${DS_FUZZ_CC:-}
if [ -z "$cc" ]; then
    cc=$(command -v clang || command -v clang-14 || true)
fi
if [ -z "$cc" ]; then
    echo "$0: clang not found (set DS_FUZZ_CC)" >&2
    exit 2
fi
out=${DS_FUZZ_OUT:-$root/build-fuzz}
mkdir -p "$out"
# shellcheck disable=SC2046,SC2086  # pkg-config output and DS_FUZZ_CFLAGS are lists of flags
"$cc" -std=c11 -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter -Werror \
    -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -DDS_VERSION='"fuzz"' -DDS_GIT_COMMIT='"fuzz"' \
    -I"$root/kernels/include" -I"$root/models/include" -I"$root/profiler/include" \
    ${DS_FUZZ_CFLAGS:-} "${sources[@]}" $(pkg-config --cflags --libs ${DS_FUZZ_PKGS:-jansson}) \
    -o "$out/$target"
echo "$out/$target"
