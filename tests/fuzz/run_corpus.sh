#!/usr/bin/env bash
# Regression run of a fuzz target over its seed corpus (used by ctest, see tests/cmake/fuzz.cmake):
#
#   tests/fuzz/run_corpus.sh <target-name> <corpus-dir> [extra sources...]
#
# Builds the target with build.sh and runs every corpus file through it once (no mutation).
# Exits 77 (skipped) when clang with libFuzzer is not available.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 <target-name> <corpus-dir> [extra sources...]" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
target=$1
corpus=$2
shift 2

cc=${DS_FUZZ_CC:-$(command -v clang || command -v clang-14 || true)}
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n);\n%s\n' \
    'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
    >"$probe/p.c"
if [ -z "$cc" ] || ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" \
    >/dev/null 2>&1; then
    echo "skipped: clang with libFuzzer (libclang-rt-dev) is not available"
    exit 77
fi

export DS_FUZZ_CC=$cc
bin=$("$here/build.sh" "$target" "$@" | tail -n 1)
shopt -s nullglob
files=("$corpus"/*)
if [ ${#files[@]} -eq 0 ]; then
    echo "$corpus: empty seed corpus" >&2
    exit 1
fi
# Given files (not a directory), libFuzzer runs each input once and exits non-zero on a crash.
"$bin" "${files[@]}"
echo "${#files[@]} corpus inputs ran clean through $target"
