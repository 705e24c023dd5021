#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian/Ubuntu machine: installs whatever the build, the tests and
# the demo need and is missing, then says what it did. Safe to run again: it checks before acting.
set -euo pipefail

need_pkgs=(build-essential cmake pkg-config git python3 python3-venv
           libhdf5-dev libpcre2-dev libjansson-dev zlib1g-dev
           clang libclang-rt-dev)

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# Debian names the compiler-rt package after the clang version (libclang-rt-14-dev).
resolve() {
    if [ "$1" = libclang-rt-dev ]; then
        local v
        v=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
        [ -n "$v" ] && echo "libclang-rt-$v-dev" || echo ""
    else
        echo "$1"
    fi
}

missing=()
for p in "${need_pkgs[@]}"; do
    r=$(resolve "$p")
    [ -z "$r" ] && continue
    have_pkg "$r" || missing+=("$r")
done

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@";
    elif command -v sudo >/dev/null; then sudo "$@";
    else echo "setup: need root to run: $*" >&2; return 1; fi
}

if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # clang may have just arrived: install its compiler-rt (libFuzzer, sanitizers) too.
    r=$(resolve libclang-rt-dev)
    if [ -n "$r" ] && ! have_pkg "$r"; then as_root apt-get install -y -qq "$r" >/dev/null; fi
fi

# The CUDA toolkit (nvcc, cudart, CUPTI, NVTX3) is a build requirement: the CUDA sources are always
# compiled, whether or not this machine has a GPU.
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    if apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        echo "setup: installing nvidia-cuda-toolkit"
        as_root apt-get install -y -qq nvidia-cuda-toolkit >/dev/null
    else
        echo "setup: the CUDA toolkit (nvcc) is missing and no package provides it here;" \
             "install CUDA 12.4 or newer (NVIDIA's repository) and run again" >&2
        exit 1
    fi
fi
echo "setup: build dependencies present"

# The analysis package and the Python tests' environment (.venv at the repository root).
"$(dirname "$0")/setup_venv.sh"
