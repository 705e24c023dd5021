#!/usr/bin/env python3
"""Greedy speculative decoding of the tiny pair in PyTorch: the mean acceptance length.

    python3 scripts/tiny/check_acceptance.py TARGET_DIR DRAFT_DIR SAMPLES.jsonl [--device D]
        [--max-convs N] [--ids-out F]

Reads both checkpoints from their files (the target's experts dequantized from MXFP4), renders
every user turn of every sample conversation in harmony (earlier turns with their recorded
replies as final-channel messages, as the profiler replays them) and runs the chain loop of the
EAGLE-3 facts §11 with K = 3 and the greedy rule, max 256 new tokens, stopping at <|return|>,
<|call|> or <|endoftext|>:

  prefill: target over the prompt -> first token b; aux states of every prompt position.
  round:   draft extend over every committed position t (hidden fc(aux_t), token at t + 1,
           RoPE position t) -> d1 from the last row; d2..dK from the draft's own pre-norm hidden
           at positions C, C+1, ... (each row attends to the extend rows and the earlier chain
           rows); target verify over [b, d1..dK]; accept while d_i equals the target's argmax;
           emit the accepted drafts and the target's token after them.

The draft's rows are recomputed from scratch every round, which gives the same numbers as a KV
cache whose committed entries always come from target aux states (facts §6.2). Reported: mean
acceptance length = 1 + accepted / rounds (bonus included), draft acceptance rate, per-position
rates (joint: fraction of rounds accepting at least i drafts; conditional: given i - 1), the
histogram of accepted counts, and whether every reply had the analysis -> final structure.
Computed in fp32 (TF32 off) and, for comparison, in bf16 autocast.
"""

import argparse
import json
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tinymodel as tm  # noqa: E402
import tok as tk  # noqa: E402

K = 3
MAX_NEW = 256
EFFORTS = ("medium", "low", "high")
STRUCTURE = re.compile(r"^<\|channel\|>analysis<\|message\|>(?:(?!<\|).)+<\|end\|><\|start\|>"
                       r"assistant<\|channel\|>final<\|message\|>(?:(?!<\|).)+<\|return\|>$",
                       re.S)


class Pair:
    def __init__(self, target, draft, aux_ids, dtype, max_new=MAX_NEW):
        self.target, self.draft, self.aux_ids = target, draft, aux_ids
        self.max_new = max_new
        self.dtype = dtype
        self.cap = tm.AuxCapture(target, aux_ids)

    def ctx(self):
        dev = next(self.target.parameters()).device.type
        return torch.autocast(device_type=dev, dtype=torch.bfloat16,
                              enabled=(self.dtype == torch.bfloat16))

    @torch.no_grad()
    def target_pass(self, seq):
        ids = torch.tensor([seq], device=self.draft.d2t.device)
        with self.ctx():
            logits = self.target(input_ids=ids, use_cache=False).logits[0].float()
            aux = self.cap.take(self.aux_ids)[0].float()
        return logits.argmax(-1), aux

    @torch.no_grad()
    def draft_chain(self, seq, aux, C):
        """seq holds C + 1 tokens (the last, b, not yet verified); aux the C committed rows."""
        with self.ctx():
            return tm.draft_chain(self.draft, aux[:C], seq[1:C + 1], K)[0]

    def generate(self, prompt, stops):
        """Returns (generated ids, accepted count per round)."""
        arg, aux = self.target_pass(prompt)
        seq = list(prompt) + [arg[-1].item()]
        C = len(prompt)
        gen = [seq[-1]]
        rounds = []
        while gen[-1] not in stops and len(gen) < self.max_new:
            drafts = self.draft_chain(seq, aux, C)
            arg, aux_all = self.target_pass(seq + drafts)
            a = 0
            while a < K and drafts[a] == arg[C + a].item():
                a += 1
            emitted = drafts[:a] + [arg[C + a].item()]
            rounds.append(a)
            aux = aux_all[:C + a + 1]
            C += a + 1
            for t in emitted:
                seq.append(t)
                gen.append(t)
                if t in stops or len(gen) >= self.max_new:
                    break
            seq = seq[:C + 1]
        return gen, rounds


def summarize(rounds):
    n = len(rounds)
    acc = sum(rounds)
    hist = [sum(1 for r in rounds if r == i) for i in range(K + 1)]
    joint = [sum(1 for r in rounds if r >= i) / max(1, n) for i in range(1, K + 1)]
    cond = []
    for i in range(1, K + 1):
        reach = sum(1 for r in rounds if r >= i - 1)
        cond.append(sum(1 for r in rounds if r >= i) / max(1, reach))
    return {"rounds": n, "accepted": acc, "mean_acceptance_length": 1 + acc / max(1, n),
            "draft_acceptance_rate": acc / max(1, n * K), "per_position_joint": joint,
            "per_position_conditional": cond, "histogram": hist}


def load_samples(path):
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def turns_of(rec):
    """(history of (user, reply), user) for every user turn of a ShareGPT record."""
    out, hist, pending = [], [], None
    for m in rec["conversations"]:
        if m["from"] in ("human", "user"):
            pending = m["value"]
            out.append((list(hist), pending))
        elif m["from"] in ("gpt", "assistant") and pending is not None:
            hist.append((pending, m["value"]))
            pending = None
    return out


def run(tdir, ddir, samples_path, device, log=print, ids_out=None, max_convs=None,
        max_new=MAX_NEW):
    """Runs the check; returns the figures as a dict."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    target, tcfg = tm.load_target(tdir, device)
    draft, dcfg, aux_ids = tm.load_draft(ddir, target.model.embed_tokens.weight.detach(), device)
    r = tk.Renderer(os.path.join(tdir, "tokenizer.json"))
    stops = {r.sp["<|return|>"], r.sp["<|call|>"], r.sp["<|endoftext|>"]}
    recs = load_samples(samples_path)[:max_convs]
    if ids_out:
        with open(ids_out, "w") as f:
            for i, rec in enumerate(recs):
                for t, (hist, user) in enumerate(turns_of(rec)):
                    for effort in EFFORTS:
                        f.write(json.dumps({"index": i, "turn": t + 1, "reasoning": effort,
                                            "ids": r.prompt(effort, hist, user)}) + "\n")
    figures = {"K": K, "max_new_tokens": max_new, "conversations": len(recs),
               "aux_layer_ids_output_of": aux_ids}
    for dtype, dname in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        pair = Pair(target, draft, aux_ids, dtype, max_new)
        for effort in (EFFORTS if dname == "fp32" else ("medium",)):
            rounds_all, rounds_first, ok, n_turns, gen_tokens, distinct = [], [], 0, 0, 0, set()
            shown = 0
            # The headline (fp32, medium) runs every sample; the comparisons the first 16.
            n_convs = len(recs) if (dname, effort) == ("fp32", "medium") else min(16, len(recs))
            for rec in recs[:n_convs]:
                for t, (hist, user) in enumerate(turns_of(rec)):
                    gen, rounds = pair.generate(r.prompt(effort, hist, user), stops)
                    rounds_all += rounds
                    if t == 0:
                        rounds_first += rounds
                    text = r.tok.decode(gen, skip_special_tokens=False)
                    ok += bool(STRUCTURE.match(text))
                    n_turns += 1
                    gen_tokens += len(gen)
                    distinct.update(gen)
                    if dname == "fp32" and shown < 3:
                        log("  [%s] user: %s\n             reply: %s" % (effort, user, text))
                        shown += 1
            s = summarize(rounds_all)
            s["first_turns"] = summarize(rounds_first)
            s.update({"conversations": n_convs, "turns": n_turns, "structure_ok": ok,
                      "generated_tokens": gen_tokens, "distinct_generated_ids": len(distinct)})
            figures["%s_%s" % (dname, effort)] = s
            log("acceptance %s reasoning %s, %d conversations: mean acceptance length %.3f "
                "over %d rounds "
                "(first turns %.3f); draft acceptance %.3f; per position joint %s cond %s; "
                "histogram %s; analysis->final structure %d/%d; %d tokens, %d distinct ids"
                % (dname, effort, n_convs, s["mean_acceptance_length"], s["rounds"],
                   s["first_turns"]["mean_acceptance_length"], s["draft_acceptance_rate"],
                   " ".join("%.3f" % x for x in s["per_position_joint"]),
                   " ".join("%.3f" % x for x in s["per_position_conditional"]),
                   s["histogram"], ok, n_turns, gen_tokens, len(distinct)))
        pair.cap.remove()
    return figures


def markdown(res):
    a = res["acceptance"]
    lines = ["# Tiny pair: measured figures", "",
             "Written by scripts/tiny/make_tiny.py (%s s, torch %s, transformers %s)."
             % (res.get("seconds"), res["versions"]["torch"], res["versions"]["transformers"]),
             "", "## Greedy acceptance, K = %d, every user turn of the sample conversations"
             % a["K"], "",
             "| numerics | reasoning | conversations | mean acceptance length | first turns only "
             "| draft acceptance | joint per position | conditional per position | histogram 0..K "
             "| rounds | analysis->final replies |", "|---" * 11 + "|"]
    for key in sorted(k for k in a if k.startswith(("fp32_", "bf16_"))):
        s = a[key]
        num, eff = key.split("_")
        lines.append("| %s | %s | %d | %.3f | %.3f | %.3f | %s | %s | %s | %d | %d/%d |" % (
            num, eff, s["conversations"], s["mean_acceptance_length"],
            s["first_turns"]["mean_acceptance_length"], s["draft_acceptance_rate"],
            " ".join("%.3f" % x for x in s["per_position_joint"]),
            " ".join("%.3f" % x for x in s["per_position_conditional"]),
            " ".join(map(str, s["histogram"])), s["rounds"], s["structure_ok"], s["turns"]))
    t, q, e = res["target"], res["mxfp4"], res["target_exported"]
    lines += ["", "## Training", "",
              "- tokenizer: %d ids" % res["tokenizer_ids"],
              "- target: %d steps; held-out completion cross-entropy %.4f, next-token accuracy "
              "%.4f (bf16, before MXFP4)" % (t["steps"], t["val_ce_bf16"], t["val_acc_bf16"]),
              "- MXFP4: mean relative weight error %.4f; held-out ce %.4f -> %.4f after %d "
              "fine-tune steps with the experts frozen" % (q["rel_err"], q["val_ce_before_ft"],
                                                           q["val_ce"], q["ft_steps"]),
              "- exported target read back from its files: held-out ce %.4f, accuracy %.4f"
              % (e["val_ce"], e["val_acc"]),
              "- draft vocabulary covers %.4f of the completion tokens"
              % res["draft_vocab_coverage"],
              "- draft: %d steps, TTT %d; last-50-step (ce, accuracy) per TTT step: %s"
              % (res["draft"]["steps"], res["draft"]["ttt"],
                 res["draft"]["train_step_ce_acc"]), ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("samples")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-convs", type=int)
    ap.add_argument("--ids-out")
    args = ap.parse_args()
    figs = run(args.target, args.draft, args.samples, args.device, ids_out=args.ids_out,
               max_convs=args.max_convs)
    print(json.dumps(figs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
