#!/usr/bin/env python3
"""Reference token ids for the Spec-Bench prompts, computed with tiktoken (the reference
implementation of o200k_base / o200k_harmony), from the local ranks file: no download.

Each turn of each question is encoded on its own, as ordinary text (encode_ordinary: "<|...|>"
in a prompt is plain text, never a special token). Output: one JSON object per line, in the
order of the questions file:

    {"question_id": 81, "turns": [[id, ...], [id, ...]]}

and, for a list of pre-tokenizer edge cases, tokenizer_edge_ids.jsonl: {"text": ..., "ids": [...]}.

Usage (from anywhere; the defaults are the files committed next to this script):

    python3 tests/ref/make_tokenizer_golden.py [--ranks F] [--questions F] [--out F] [--check]

--check compares against the existing output file instead of writing it and exits 1 on any
difference. The script also verifies the 64-id default harmony prompt of openai/harmony's test_simple_convo.txt
(an independent check that the reference is set up like o200k_harmony).
"""
import argparse
import hashlib
import json
import os
import random
import string
import sys

# No cache directory: load_tiktoken_bpe then reads the local file and writes nothing.
os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")

try:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
except ImportError:
    if "--skip-without-tiktoken" in sys.argv:  # ctest: exit code 77 = skipped
        print("skipped: tiktoken is not installed")
        sys.exit(77)
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "..", "data"))
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# tiktoken's o200k_base pattern (tiktoken_ext/openai_public.py), the same in o200k_harmony.
PAT_STR = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

SPECIALS = {
    "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
    "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
    "<|message|>": 200008, "<|call|>": 200012,
}

# openai/harmony test-data/test_simple_convo.txt: the default harmony prompt for "What is 2 + 2?".
SPEC_PROMPT_IDS = [int(x) for x in """
200006 17360 200008 3575 553 17554 162016 11 261 4410 6439 2359 22203 656 7788 17527 558 87447
100594 25 220 1323 19 12 3218 279 30377 289 25 14093 279 2 13888 18403 25 8450 11 49159 11 1721
13 21030 2804 413 7360 395 1753 3176 13 200007 200006 1428 200008 4827 382 220 17 659 220 17 30
200007 200006 173781""".split()]

# Edge cases for the pre-tokenizer (Unicode White_Space vs other spaces, CR/LF runs, trailing
# spaces, digit groups, contractions incl. the long s, marks, scripts, emoji, long pieces).
EDGE_CASES = [
    "Hello, world! I'm here. DON'T STOP we'll they've", "\u017f'S 'Ll x'D",
    "a\u0085b c", "x\u00a0\u00a0y", "p\u180eq \u200bz", "\u3000\u3000z \u2028w\u2029",
    "tab\t\tend\t", "line1\r\n\r\n  line2\n\n\n", "   leading and trailing   ",
    "  \n  x", "\n", " ", "1234567 89 0.5 1,000,000", "\u0661\u0662\u0663\u0664 \u0665",
    "na\u00efve caf\u00e9 \ufb01 e\u0301 \u0301x", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad"
    "\u30b9\u30c8\u3001\u30c6\u30b9\u30c8\u3002", "\ud55c\uad6d\uc5b4 \ubb38\uc7a5",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\U0001f600\U0001f44d\U0001f3fd emoji \U0001f1eb\U0001f1f7",
    "def f(x):\n    return x**2  # comment\n", "<|end|><|start|>assistant<|message|>",
    "path/to/file\n/usr/bin", "!!!???...\n\n", " " * 1000 + "x", "a" * 3000, "=" * 2000,
    "ABCdef GHIjkl mNOP", "\tx \x0b\x0cy",
    # long pieces (the heap path of the C BPE): a URL, base64-like noise, a compound word
    "https://example.com/" + "path_segment/" * 20 + "?q=" + "abc123" * 20,
    "".join(random.Random(1).choice(string.ascii_letters + string.digits + "+/")
            for _ in range(600)),
    "Donaudampfschifffahrtsgesellschaftskapit\u00e4n" * 6,
]


def make_encoding(ranks_path):
    with open(ranks_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != O200K_SHA256:
        sys.exit(f"{ranks_path}: sha256 {digest} is not o200k_base's {O200K_SHA256}")
    ranks = load_tiktoken_bpe(ranks_path)
    return tiktoken.Encoding(name="o200k_harmony_local", pat_str=PAT_STR,
                             mergeable_ranks=ranks, special_tokens=SPECIALS)


def check_spec_prompt(enc):
    system = ("You are ChatGPT, a large language model trained by OpenAI.\n"
              "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n"
              "# Valid channels: analysis, commentary, final. "
              "Channel must be included for every message.")
    s = SPECIALS
    ids = ([s["<|start|>"]] + enc.encode_ordinary("system") + [s["<|message|>"]] +
           enc.encode_ordinary(system) + [s["<|end|>"], s["<|start|>"]] +
           enc.encode_ordinary("user") + [s["<|message|>"]] +
           enc.encode_ordinary("What is 2 + 2?") + [s["<|end|>"], s["<|start|>"]] +
           enc.encode_ordinary("assistant"))
    if ids != SPEC_PROMPT_IDS:
        sys.exit("the reference encoding does not reproduce the 64 ids of harmony's test_simple_convo")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default=os.path.join(DATA, "o200k_base.tiktoken"))
    ap.add_argument("--questions", default=os.path.join(DATA, "spec_bench_questions.jsonl"))
    ap.add_argument("--out", default=os.path.join(DATA, "spec_bench_ids.jsonl"))
    ap.add_argument("--edge-out", default=os.path.join(DATA, "tokenizer_edge_ids.jsonl"))
    ap.add_argument("--check", action="store_true", help="compare with --out, do not write")
    ap.add_argument("--skip-without-tiktoken", action="store_true",
                    help="exit 77 (skipped) when tiktoken is not installed")
    args = ap.parse_args()

    enc = make_encoding(args.ranks)
    check_spec_prompt(enc)
    lines = []
    n_turns = 0
    with open(args.questions, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            turns = [enc.encode_ordinary(t) for t in q["turns"]]
            for text, ids in zip(q["turns"], turns):
                if enc.decode(ids) != text:
                    sys.exit(f"question {q['question_id']}: tiktoken round trip failed")
            n_turns += len(turns)
            lines.append(json.dumps({"question_id": q["question_id"], "turns": turns},
                                    separators=(",", ":")))
    text = "\n".join(lines) + "\n"
    edge = "".join(json.dumps({"text": t, "ids": enc.encode_ordinary(t)}) + "\n"
                   for t in EDGE_CASES)
    if args.check:
        with open(args.edge_out, encoding="utf-8") as f:
            if f.read() != edge:
                print(f"{args.edge_out}: differs from tiktoken {tiktoken.__version__}")
                return 1
        with open(args.out, encoding="utf-8") as f:
            old = f.read()
        if old != text:
            old_lines = old.split("\n")
            bad = [i + 1 for i, l in enumerate(lines) if i >= len(old_lines) or old_lines[i] != l]
            print(f"{args.out}: differs from tiktoken {tiktoken.__version__} on "
                  f"{len(bad)} question line(s), first: line {bad[0] if bad else '?'}")
            return 1
        print(f"{args.out}: {len(lines)} questions, {n_turns} turns: identical to tiktoken "
              f"{tiktoken.__version__}")
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    with open(args.edge_out, "w", encoding="utf-8") as f:
        f.write(edge)
    print(f"wrote {args.out}: {len(lines)} questions, {n_turns} turns "
          f"(tiktoken {tiktoken.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
