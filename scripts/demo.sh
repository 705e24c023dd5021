#!/usr/bin/env bash
# The demo run by `make demo`: checks the bundled tiny pair, replays its sample conversations at
# two batch sizes, writes the run file, prints the summary, and renders the HTML report.
# The tiny pair (models/tiny) is a trained gpt-oss-architecture target and an EAGLE-3 draft for it;
# models/tiny/README.md says how they were made.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
ds="$build/profiler/draftscope"
tiny="$root/models/tiny"
out=${DS_DEMO_OUT:-$root/demo-out}
mkdir -p "$out"

echo "== draftscope inspect --target models/tiny/target --draft models/tiny/draft"
"$ds" inspect --target "$tiny/target" --draft "$tiny/draft"
echo
echo "== draftscope run: 16 sample conversations at batch sizes 1 and 4, K = 3, greedy"
"$ds" run --target "$tiny/target" --draft "$tiny/draft" \
    --dataset "$tiny/sample_conversations.jsonl" --num-conversations 16 \
    --batch-sizes 1,4 --draft-tokens 3 --max-new-tokens 128 \
    --out "$out/run.h5" --overwrite
echo
if [ -x "$root/.venv/bin/python" ]; then
    "$root/.venv/bin/python" -m draftscope report "$out/run.h5" -o "$out/report.html"
    echo "report: $out/report.html"
fi
echo "run file: $out/run.h5  (draftscope summary $out/run.h5; in Python: draftscope.open(path))"
