#!/usr/bin/env bash
# The demo run by `make demo`. The profiler's replay is not built yet; until it is, the demo checks
# the bundled fixture checkpoints with `draftscope inspect` and says so.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
ds="$build/profiler/draftscope"
fx="$root/tests/fixtures/ckpt"
echo "== draftscope demo: the replay profiler is not built yet; inspecting the bundled checkpoints"
echo
for d in draft-lmsys draft-speculators draft-nvidia-v3; do
    echo "== draftscope inspect --target tests/fixtures/ckpt/tiny-target --draft tests/fixtures/ckpt/$d"
    "$ds" inspect --target "$fx/tiny-target" --draft "$fx/$d"
    echo
done
