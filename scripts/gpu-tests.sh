#!/usr/bin/env bash
# Runs everything that needs a GPU, on a machine that has one: builds a release tree, runs the GPU
# tests (ctest label gpu), then the CPU tests too (they must also pass there), compute-sanitizer
# memcheck and racecheck over the GPU tests, and the benchmarks. Logs go to the directory given as
# the first argument (default gpu-logs/). Usage: scripts/gpu-tests.sh [LOGDIR] [--quick]
# Environment: SAN_TIMEOUT (seconds per sanitizer tool and test, default 600), SAN_TESTS (below).
set -uo pipefail
logs=$(mkdir -p "${1:-gpu-logs}" && cd "${1:-gpu-logs}" && pwd)
quick=${2:-}
mkdir -p "$logs"
build=build-gpu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH=/usr/local/cuda/bin:$PATH

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$logs/gpu.txt" 2>&1
{ cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DDS_WERROR=OFF &&
  cmake --build $build -j"$(nproc)"; } > "$logs/build.log" 2>&1 || { tail -50 "$logs/build.log"; exit 1; }
echo "build ok"

(cd $build && ctest -L gpu --output-on-failure -j1) > "$logs/ctest-gpu.log" 2>&1
echo "gpu tests: $(grep -E 'tests passed|tests failed' "$logs/ctest-gpu.log")"
grep -E "^\s*[0-9]+/[0-9]+ Test" "$logs/ctest-gpu.log" | sed 's/^ *//'

if [ "$quick" != "--quick" ]; then
    (cd $build && ctest -L cpu --output-on-failure -j8) > "$logs/ctest-cpu.log" 2>&1
    echo "cpu tests: $(grep -E 'tests passed|tests failed' "$logs/ctest-cpu.log")"
    # Sanitizers: one background job per test (the tests write their own output folders, so
    # the two tools of one test run one after the other), each tool bounded by SAN_TIMEOUT
    # seconds (rc 124 = not finished). They run the small-shape cases only (DS_GPU_TEST_SMALL=1,
    # set for these jobs alone: racecheck never finishes the real gpt-oss shapes); the real
    # shapes are covered by the normal run above. rc 77 = every case was large (gpu_run_synthetic)
    # or needs CUPTI, which the sanitizer itself holds (gpu_run_trace; gpu_trace skips those
    # cases and runs the rest). racecheck takes 330 - 380 s on gpu_models, gpu_ops_vocab and
    # gpu_replay_parity alone, and three of them side by side did not all finish in 560 s: the
    # tests named in SAN_SERIAL (default those three) run their memcheck with the others and
    # their racecheck afterwards, one at a time (about 18 minutes for the three). Output is
    # line-buffered (stdbuf), so a run cut off by the timeout still shows the cases it finished.
    # SAN_TESTS (an extended regex, default every GPU test) picks the tests to sanitize, e.g.
    # SAN_TESTS='gpu_ops_(moe|attention)' after a change to those kernels.
    san_t=${SAN_TIMEOUT:-600}
    san_serial=" ${SAN_SERIAL-gpu_models gpu_ops_vocab gpu_replay_parity} "
    san_one() { # test binary, tool
        local n
        n=$(basename "$1")
        DS_GPU_TEST_SMALL=1 timeout "$san_t" stdbuf -oL compute-sanitizer --tool "$2" \
            --error-exitcode 3 "$1" > "$logs/sanitizer-$2-$n.log" 2>&1
        echo "compute-sanitizer $2 $n: rc=$?  $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed' "$logs/sanitizer-$2-$n.log" | tail -2 | tr '\n' ' ')" \
            > "$logs/sanitizer-$2-$n.rc"
    }
    later=()
    for t in $build/tests/gpu_*; do
        [ -x "$t" ] || continue
        n=$(basename "$t")
        [[ "$n" =~ ^(${SAN_TESTS:-.*})$ ]] || continue
        if [[ "$san_serial" == *" $n "* ]]; then
            san_one "$t" memcheck &
            later+=("$t")
        else
            (san_one "$t" memcheck; san_one "$t" racecheck) &
        fi
    done
    wait
    for t in "${later[@]}"; do san_one "$t" racecheck; done
    cat "$logs"/sanitizer-*.rc
fi

if [ -x $build/profiler/draftscope ] && $build/profiler/draftscope bench --help >/dev/null 2>&1; then
    # The issue's targets are at the 120b shapes (the one-token MoE reads the same bytes at 20b).
    $build/profiler/draftscope bench --ops --shape 120b > "$logs/bench-ops.txt" 2>&1
    echo "bench: $(wc -l < "$logs/bench-ops.txt") lines in bench-ops.txt"
    $build/profiler/draftscope bench --steps --shape 120b --batches 1,32 > "$logs/bench-steps.txt" 2>&1
    grep -E "copy bandwidth|  on  " "$logs/bench-steps.txt"
fi
