#!/usr/bin/env python3
"""Times tiktoken (single-threaded) on the corpus that tests/bench_tokenizer.c uses, so the two
MB/s figures can be read side by side on one machine.

Corpus: every turn of the Spec-Bench questions, repeated until it holds --mb MB, each turn one
encode_ordinary call; or, with --text F, every non-empty line of F as one document.

    python3 tests/ref/bench_tiktoken.py [--ranks F] [--questions F] [--text F] [--mb N] [--reps N]

Needs only tiktoken; the ranks are read from the local file (no download).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_tokenizer_golden import DATA, make_encoding  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default=os.path.join(DATA, "o200k_base.tiktoken"))
    ap.add_argument("--questions", default=os.path.join(DATA, "spec_bench_questions.jsonl"))
    ap.add_argument("--text")
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    if args.text:
        with open(args.text, "rb") as f:
            docs = [l.decode("utf-8") for l in f.read().split(b"\n") if l]
    else:
        turns = []
        with open(args.questions, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    turns.extend(json.loads(line)["turns"])
        docs, size = [], 0
        while size < args.mb * 1e6:
            docs.extend(turns)
            size += sum(len(t.encode("utf-8")) for t in turns)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)

    t0 = time.perf_counter()
    enc = make_encoding(args.ranks)
    print(f"tiktoken   load             {time.perf_counter() - t0:.3f} s ({args.ranks})")
    enc.encode_ordinary("warm up")
    best, tokens = float("inf"), 0
    for _ in range(args.reps):
        t0 = time.perf_counter()
        tokens = 0
        for d in docs:
            tokens += len(enc.encode_ordinary(d))
        best = min(best, time.perf_counter() - t0)
    import tiktoken
    print(f"tiktoken {tiktoken.__version__:<19} {len(docs)} docs, {nbytes / 1e6:.2f} MB, {tokens} "
          f"tokens: best of {args.reps} {best:.3f} s = {nbytes / 1e6 / best:.2f} MB/s, "
          f"{tokens / 1e6 / best:.2f} M tokens/s")


if __name__ == "__main__":
    main()
