#!/bin/sh
# Guards the bundled tiny pair (models/tiny): it still loads, and its greedy acceptance on a fixed
# small sample stays within a band of the figure recorded when the pair was committed.
#
# Recorded figure: mean acceptance length 3.7083 (1 + 260/96 steps) on the first 6 sample
# conversations, B = 1, K = 3, greedy, max 128 new tokens, CPU reference (draftscope run, commit
# of models/tiny). The CPU reference is deterministic and batch invariant, so the same build gives
# the same figure; the band (+-0.15, about 15 accepted drafts out of 96 steps) leaves room for
# reduction-order changes in the kernels, while a broken target, draft, aux wiring or vocabulary map
# falls far below it (random drafts accept almost nothing: 1.0). The issue's floor is 2.0.
# Usage: tiny_acceptance.sh DRAFTSCOPE ROOT WORKDIR
set -eu
ds=$1 root=$2 work=$3
mkdir -p "$work"
tiny="$root/models/tiny"
[ -f "$tiny/target/model.safetensors" ] || { echo "skipped: models/tiny has no checkpoint"; exit 77; }
"$ds" inspect --target "$tiny/target" --draft "$tiny/draft" > "$work/inspect.txt"
"$ds" run --target "$tiny/target" --draft "$tiny/draft" \
    --dataset "$tiny/sample_conversations.jsonl" --batch-sizes 1 --num-conversations 6 \
    --max-new-tokens 128 --device cpu --out "$work/tiny_band.h5" --overwrite --quiet --json \
    > "$work/tiny_band.json"
python3 - "$work/tiny_band.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
g = [g for g in d["groups"] if g["key"] == 1][0]
al, steps = g["mean_acceptance_length"], g["steps"]
recorded, band = 3.7083, 0.15
print(f"tiny pair: mean acceptance length {al:.4f} over {steps} steps "
      f"(recorded {recorded}, band +-{band})")
ok = abs(al - recorded) <= band and al >= 2.0 and g["requests"] == 6
print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
sys.exit(0 if ok else 1)
PY
