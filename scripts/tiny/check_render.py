#!/usr/bin/env python3
"""Checks that the C renderer renders the sample conversations exactly as the training data
was rendered (standard library only; run by ctest).

    check_render.py DRAFTSCOPE MODEL_DIR

MODEL_DIR holds target/ (with tokenizer.json), sample_conversations.jsonl and
sample_prompt_ids.jsonl, the ids scripts/tiny/tok.py rendered for every user turn of every sample
at every reasoning effort (written by make_tiny.py). For each record this runs
`DRAFTSCOPE render --dataset ... --index I --turn T --reasoning R --tokenizer target --ids` and
compares the ids it prints (its last line) with the recorded ones. Exit 1 on any difference,
77 (skipped) when MODEL_DIR has no sample_prompt_ids.jsonl.
"""

import json
import os
import subprocess
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    exe, mdir = argv[1], argv[2]
    if not os.path.exists(os.path.join(mdir, "sample_prompt_ids.jsonl")):
        print("skipped: %s has no sample_prompt_ids.jsonl (make_tiny.py writes it)" % mdir)
        return 77
    samples = os.path.join(mdir, "sample_conversations.jsonl")
    tokdir = os.path.join(mdir, "target")
    bad = n = 0
    with open(os.path.join(mdir, "sample_prompt_ids.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            cmd = [exe, "render", "--dataset", samples, "--index", str(rec["index"]),
                   "--turn", str(rec["turn"]), "--reasoning", rec["reasoning"],
                   "--tokenizer", tokdir, "--ids"]
            p = subprocess.run(cmd, capture_output=True, text=True)
            n += 1
            if p.returncode != 0:
                print("%s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
                bad += 1
                continue
            got = [int(x) for x in p.stdout.strip().splitlines()[-1].split()]
            if got != rec["ids"]:
                i = next((k for k, (a, b) in enumerate(zip(got, rec["ids"])) if a != b),
                         min(len(got), len(rec["ids"])))
                print("conversation %d turn %d (%s): C renderer differs from the training "
                      "rendering at token %d (C %s, training %s)"
                      % (rec["index"], rec["turn"], rec["reasoning"], i, got[i:i + 5],
                         rec["ids"][i:i + 5]))
                bad += 1
    print("%d of %d prompts rendered identically" % (n - bad, n))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
