#!/usr/bin/env python3
"""Makes the bundled tiny pair: tokenizer, gpt-oss target (MXFP4 experts), EAGLE-3 draft, sample
conversations, and the greedy acceptance figure.

    python3 scripts/tiny/make_tiny.py OUTDIR              # the full run (one GPU, ~10 minutes)
    python3 scripts/tiny/make_tiny.py OUTDIR --smoke      # a few steps of everything (CPU check)
    python3 scripts/tiny/make_tiny.py OUTDIR --stop-after-target, then ... --from-target
                                                          # the same run in two calls

Writes into OUTDIR:
    target/                     config.json, generation_config.json, model.safetensors,
                                tokenizer.json, tokenizer_config.json, special_tokens_map.json
    draft/                      config.json, model.safetensors (SpecForge / lmsys layout)
    sample_conversations.jsonl  the held-out demo conversations (ShareGPT)
    sample_prompt_ids.jsonl     the ids this script renders for them (checked against the C
                                renderer by a ctest)
    results.json, results.md    the figures (losses, accuracies, acceptance)
    log.txt                     everything printed
    README.md                   a copy of models/tiny/README.md with the measured figures filled
                                in (an existing OUTDIR/README.md is updated instead)

so that OUTDIR can replace models/tiny as a whole.

Phases: corpus (scripts/tiny/corpus.py, seed 1 for training, seed 2 for the samples) ->
tokenizer (byte-level BPE, o200k regex, harmony specials) -> target training (bf16 autocast,
loss on the assistant's completion tokens, plus a router load-balancing term) -> MXFP4
quantization of the experts and a fine-tune of everything else with the experts frozen at their
MXFP4 values -> export -> draft vocabulary by token frequency -> EAGLE-3 draft training against
the exported target read back from its files (aux states of three layers, test-time training
unrolled over several steps, soft cross-entropy against the target's distribution on the draft
vocabulary) -> export -> the greedy chain check of check_acceptance.py on the samples.
"""

import argparse
import collections
import json
import math
import os
import random
import shutil
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_acceptance  # noqa: E402
import corpus  # noqa: E402
import selftest  # noqa: E402
import tinymodel as tm  # noqa: E402
import tok as tk  # noqa: E402

TRAIN_SEED, SAMPLE_SEED = 1, 2

TARGET = dict(hidden=256, inter=256, heads=8, head_dim=32, kv_heads=2, layers=6, experts=8,
              top_k=4, window=32, rope_original=256, rope_factor=4, router_aux_coef=0.02)
# Output-of ids: low = output of layer 1 (every EAGLE-3 default), mid = N/2 - 1, high = N - 2
# (the SpecForge gpt-oss configs take N - 3 of 24/36 layers, ~90% of the depth; with six layers
# N - 2 keeps the high state near the top).
DRAFT = dict(hidden=256, inter=1024, heads=8, head_dim=32, kv_heads=2, draft_vocab=2048,
             max_pos=1024, aux_ids=[1, 2, 4])

FULL = dict(train_convs=120000, sample_convs=48, bpe_size=4000, tok_convs=20000,
            target_steps=3000, target_minutes=3.0, target_batch=128, target_lr=2e-3,
            qat_steps=300, qat_lr=3e-4, draft_steps=2500, draft_minutes=2.0, draft_batch=64,
            draft_lr=2e-3, ttt=4, warmup=100, max_new=check_acceptance.MAX_NEW)
SMOKE = dict(train_convs=600, sample_convs=4, bpe_size=1200, tok_convs=600,
             target_steps=3, target_minutes=5.0, target_batch=4, target_lr=2e-3,
             qat_steps=2, qat_lr=3e-4, draft_steps=3, draft_minutes=5.0, draft_batch=4,
             draft_lr=2e-3, ttt=4, warmup=2, max_new=16)


class Log:
    def __init__(self, path):
        self.f = open(path, "a")
        self.t0 = time.time()

    def __call__(self, msg):
        line = "[%7.1fs] %s" % (time.time() - self.t0, msg)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def fit_steps(requested, minutes, done, elapsed):
    """How many steps fit in the time budget, from the pace of the first `done` steps."""
    per = elapsed / max(1, done)
    return max(done + 1, min(requested, int(minutes * 60 / per)))


# ---------------------------------------------------------------------------------------------
# Data


def make_examples(renderer, convs):
    """(ids, loss mask) per assistant turn; the mask marks the completion tokens."""
    texts = []
    for c in convs:
        for t in c["turns"]:
            texts += [t["user"], t["analysis"], t["final"]]
    table = tk.batch_encoder(renderer.tok, texts)
    enc = table.__getitem__
    out = []
    for c in convs:
        for p, comp in renderer.examples(c, enc):
            out.append((p + comp, [0] * len(p) + [1] * len(comp)))
    return out


class Batches:
    """Random batches padded on the right to the longest example (+ extra columns)."""

    def __init__(self, examples, pad_id, seed, device):
        self.ex = examples
        self.pad = pad_id
        self.rng = random.Random(seed)
        self.device = device

    def next(self, n, extra=0):
        pick = [self.ex[self.rng.randrange(len(self.ex))] for _ in range(n)]
        T = max(len(ids) for ids, _ in pick) + extra
        ids = torch.full((n, T), self.pad, dtype=torch.long)
        mask = torch.zeros((n, T), dtype=torch.bool)
        for i, (a, m) in enumerate(pick):
            ids[i, :len(a)] = torch.tensor(a)
            mask[i, :len(m)] = torch.tensor(m, dtype=torch.bool)
        return ids.to(self.device), mask.to(self.device)


def autocast(device):
    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=(device == "cuda"))


# ---------------------------------------------------------------------------------------------
# Target


def target_loss(model, ids, mask, device, aux_coef):
    with autocast(device):
        out = model(input_ids=ids, use_cache=False, output_router_logits=True)
    logits = out.logits[:, :-1].float()
    labels = ids[:, 1:]
    m = mask[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits[m], labels[m])
    acc = (logits[m].argmax(-1) == labels[m]).float().mean()
    return ce + aux_coef * out.aux_loss, ce, acc, out.aux_loss


def train_target(model, batches, P, device, log, steps, minutes, lr, tag, params=None):
    params = [p for p in (params or model.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    total, t0, step = steps, time.time(), 0
    hist = collections.deque(maxlen=50)
    while step < total:
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(step, total, lr, min(P["warmup"], total // 10 + 1))
        ids, mask = batches.next(P["target_batch"])
        loss, ce, acc, aux = target_loss(model, ids, mask, device, TARGET["router_aux_coef"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hist.append((ce.item(), acc.item()))
        step += 1
        if step == 30 and minutes:
            new = fit_steps(steps, minutes, step, time.time() - t0)
            if new != total:
                log("%s: %.0f ms/step; %d steps fit in %.1f min (asked %d)"
                    % (tag, 1000 * (time.time() - t0) / step, new, minutes, steps))
                total = new
        if step % P.get("log_every", 100) == 0 or step == total:
            ce_m = sum(h[0] for h in hist) / len(hist)
            acc_m = sum(h[1] for h in hist) / len(hist)
            log("%s step %d/%d: ce %.4f acc %.4f aux %.4f gnorm %.2f lr %.2e"
                % (tag, step, total, ce_m, acc_m, aux.item(), gn.item(),
                   opt.param_groups[0]["lr"]))
    model.eval()
    return step, sum(h[0] for h in hist) / len(hist), sum(h[1] for h in hist) / len(hist)


@torch.no_grad()
def eval_target(model, batches, device, n_batches, size):
    ce_sum = acc_sum = 0.0
    for _ in range(n_batches):
        ids, mask = batches.next(size)
        _, ce, acc, _ = target_loss(model, ids, mask, device, 0.0)
        ce_sum += ce.item()
        acc_sum += acc.item()
    return ce_sum / n_batches, acc_sum / n_batches


# ---------------------------------------------------------------------------------------------
# Draft


def draft_step(draft, target, cap, padded, mask, P, device):
    """One TTT batch (padded: the ids with P["ttt"] + 1 extra pad columns): returns the weighted
    loss and per-step (loss, accuracy)."""
    steps = P["ttt"]
    ids = padded[:, :padded.shape[1] - steps - 1]
    mask = mask[:, :ids.shape[1]]
    B, T = ids.shape
    with torch.no_grad(), autocast(device):
        logits_t = target(input_ids=ids, use_cache=False).logits.float()
        aux = cap.take(DRAFT["aux_ids"]).float()
    t2d = draft.t2d
    teacher = torch.softmax(logits_t[..., t2d], dim=-1)  # [B, T, Dv]
    arg_t = logits_t.argmax(-1)  # [B, T]
    in_vocab = t2d[arg_t]
    with autocast(device):
        outs = tm.ttt_forward(draft, aux, padded, steps)
    maskp = torch.nn.functional.pad(mask, (0, steps + 2))
    total = 0.0
    stats = []
    for k, lg in enumerate(outs):
        # Step k at index t predicts the token at t + k + 2 (target logits at t + k + 1).
        n = T - (k + 1)
        lg = lg[:, :n].float()
        tgt = teacher[:, k + 1:k + 1 + n]
        valid = maskp[:, k + 2:k + 2 + n] & in_vocab[:, k + 1:k + 1 + n]
        logp = torch.log_softmax(lg, dim=-1)
        ce = -(tgt * logp).sum(-1)
        denom = valid.sum().clamp(min=1)
        lk = (ce * valid).sum() / denom
        pred = draft.draft_to_target(lg.argmax(-1))
        acc = ((pred == arg_t[:, k + 1:k + 1 + n]) & valid).sum() / denom
        total = total + (0.8 ** k) * lk
        stats.append((lk.item(), acc.item()))
    return total, stats


def train_draft(draft, target, batches, P, device, log):
    cap = tm.AuxCapture(target, DRAFT["aux_ids"])
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=P["draft_lr"], betas=(0.9, 0.95), weight_decay=0.01)
    total, t0, step = P["draft_steps"], time.time(), 0
    hist = collections.deque(maxlen=50)
    draft.train()
    while step < total:
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(step, total, P["draft_lr"], min(P["warmup"], total // 10 + 1))
        ids, mask = batches.next(P["draft_batch"], extra=P["ttt"] + 1)
        loss, stats = draft_step(draft, target, cap, ids, mask, P, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hist.append(stats)
        step += 1
        if step == 30 and P["draft_minutes"]:
            new = fit_steps(P["draft_steps"], P["draft_minutes"], step, time.time() - t0)
            if new != total:
                log("draft: %.0f ms/step; %d steps fit in %.1f min (asked %d)"
                    % (1000 * (time.time() - t0) / step, new, P["draft_minutes"],
                       P["draft_steps"]))
                total = new
        if step % P.get("log_every", 100) == 0 or step == total:
            per = [(sum(h[k][0] for h in hist) / len(hist), sum(h[k][1] for h in hist) / len(hist))
                   for k in range(P["ttt"])]
            log("draft step %d/%d: " % (step, total)
                + " ".join("s%d ce %.3f acc %.3f" % (k, a, b) for k, (a, b) in enumerate(per)))
    cap.remove()
    draft.eval()
    return step, per


def make_target(res, P, args, dev, log, tdir, vocab, ids, examples, vb, n_eval):
    """Trains, quantizes, fine-tunes and exports the target; returns its config dict."""
    dims = dict(TARGET, vocab=vocab)
    cfg = tm.target_config(dims, ids)
    model = tm.build_target(cfg).to(dev)
    n_par = sum(p.numel() for p in model.parameters())
    log("target: %d parameters, config %s" % (n_par, json.dumps(dims)))
    pad = ids["<|endoftext|>"]
    tb = Batches(examples, pad, 11, dev)
    steps, ce, acc = train_target(model, tb, P, dev, log, P["target_steps"],
                                  P["target_minutes"], P["target_lr"], "target")
    v_ce, v_acc = eval_target(model, vb, dev, n_eval, P["target_batch"])
    log("target trained: %d steps; held-out ce %.4f acc %.4f" % (steps, v_ce, v_acc))
    res["target"] = {"steps": steps, "train_ce": ce, "train_acc": acc, "val_ce_bf16": v_ce,
                     "val_acc_bf16": v_acc}

    rel = tm.quantize_experts_(model)
    q_ce, q_acc = eval_target(model, vb, dev, n_eval, P["target_batch"])
    log("MXFP4: mean relative error of the expert weights %.4f; held-out ce %.4f acc %.4f"
        % (rel, q_ce, q_acc))
    qsteps, _, _ = train_target(model, tb, P, dev, log, P["qat_steps"], 0, P["qat_lr"],
                                "mxfp4 fine-tune")
    f_ce, f_acc = eval_target(model, vb, dev, n_eval, P["target_batch"])
    log("MXFP4 fine-tune: %d steps; held-out ce %.4f acc %.4f" % (qsteps, f_ce, f_acc))
    res["mxfp4"] = {"rel_err": rel, "val_ce_before_ft": q_ce, "val_acc_before_ft": q_acc,
                    "ft_steps": qsteps, "val_ce": f_ce, "val_acc": f_acc}

    tm.write_json(os.path.join(tdir, "config.json"), cfg)
    tm.write_json(os.path.join(tdir, "generation_config.json"), {
        "bos_token_id": ids["<|startoftext|>"], "do_sample": True,
        "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
        "pad_token_id": pad, "transformers_version": "4.55.0.dev0"})
    tm.save_safetensors(os.path.join(tdir, "model.safetensors"), tm.target_state(model))
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    return cfg


# ---------------------------------------------------------------------------------------------


def sample_records(convs):
    """ShareGPT records of the held-out conversations: human turns and the recorded finals."""
    out = []
    for c in convs:
        msgs = []
        for t in c["turns"]:
            msgs.append({"from": "human", "value": t["user"]})
            msgs.append({"from": "gpt", "value": t["final"]})
        out.append({"id": c["id"], "conversations": msgs})
    return out


def fill_readme(path, res, log):
    """Replaces the figures section of an existing README (between the markers)."""
    begin, end = "<!-- figures:begin", "<!-- figures:end -->"
    if not os.path.exists(path):
        return
    with open(path) as f:
        text = f.read()
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        return
    a = res["acceptance"]
    m = a["fp32_medium"]
    lines = [text[i:text.index("\n", i) + 1],
             "**Mean acceptance length %.3f** (fp32, reasoning medium, %d steps over %d turns; "
             "first turns only %.3f); draft acceptance rate %.3f; per-position acceptance "
             "(fraction of steps accepting at least i drafts) %s; accepted-count histogram "
             "0..3: %s." % (m["mean_acceptance_length"], m["rounds"], m["turns"],
                            m["first_turns"]["mean_acceptance_length"],
                            m["draft_acceptance_rate"],
                            " / ".join("%.3f" % x for x in m["per_position_joint"]),
                            " ".join(map(str, m["histogram"]))),
             "",
             "Reasoning low %.3f, high %.3f; bf16 autocast (medium) %.3f (these three on the "
             "first 16 conversations). %d of %d medium "
             "replies have the analysis -> final -> `<|return|>` structure. Target: %d training "
             "steps + %d MXFP4 fine-tune steps; draft: %d steps."
             % (a["fp32_low"]["mean_acceptance_length"], a["fp32_high"]["mean_acceptance_length"],
                a["bf16_medium"]["mean_acceptance_length"], m["structure_ok"], m["turns"],
                res["target"]["steps"], res["mxfp4"]["ft_steps"], res["draft"]["steps"])]
    with open(path, "w") as f:
        f.write(text[:i] + "\n".join(lines) + "\n" + text[j:])
    log("figures written into %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--smoke", action="store_true", help="a few steps of every phase")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--target-steps", type=int, help="override (default: %d)"
                    % FULL["target_steps"])
    ap.add_argument("--draft-steps", type=int, help="override (default: %d)"
                    % FULL["draft_steps"])
    ap.add_argument("--from-target", action="store_true",
                    help="keep OUTDIR/target (and its figures) and redo the draft and the check")
    ap.add_argument("--stop-after-target", action="store_true",
                    help="stop once the target is exported (split a run in two calls)")
    ap.add_argument("--no-time-budget", action="store_true",
                    help="run the step counts as given, however long they take")
    args = ap.parse_args()
    P = dict(SMOKE if args.smoke else FULL)
    if args.target_steps:
        P["target_steps"] = args.target_steps
    if args.draft_steps:
        P["draft_steps"] = args.draft_steps
    if args.no_time_budget:
        P["target_minutes"] = P["draft_minutes"] = 0
    dev = args.device
    out = args.outdir
    os.makedirs(out, exist_ok=True)
    tdir, ddir = os.path.join(out, "target"), os.path.join(out, "draft")
    os.makedirs(tdir, exist_ok=True)
    os.makedirs(ddir, exist_ok=True)
    log = Log(os.path.join(out, "log.txt"))
    # OUTDIR becomes a complete models/tiny: it gets the README, whose figures are filled in.
    readme = os.path.join(HERE, "..", "..", "models", "tiny", "README.md")
    if not os.path.exists(os.path.join(out, "README.md")) and os.path.exists(readme):
        shutil.copy(readme, os.path.join(out, "README.md"))
    res = {"params": P, "target_dims": TARGET, "draft_dims": DRAFT}
    import tokenizers
    import transformers
    log("make_tiny: device %s%s, torch %s, transformers %s, tokenizers %s; params %s"
        % (dev, (" (%s)" % torch.cuda.get_device_name()) if dev == "cuda" else "",
           torch.__version__, transformers.__version__, tokenizers.__version__, P))
    res["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                       "tokenizers": tokenizers.__version__}
    selftest.main()  # the pipeline's own pieces, before spending GPU time on them
    log("selftest passed")
    torch.manual_seed(1234)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    # Corpus. The samples come from another seed; training conversations that share a user turn
    # with a sample are dropped so the samples are truly unseen.
    samples = corpus.corpus(SAMPLE_SEED, P["sample_convs"])
    held = {t["user"] for c in samples for t in c["turns"]}
    train = [c for c in corpus.corpus(TRAIN_SEED, P["train_convs"])
             if not any(t["user"] in held for t in c["turns"])]
    log("corpus: %d training conversations (%d dropped for sharing a turn with a sample), "
        "%d samples" % (len(train), P["train_convs"] - len(train), len(samples)))

    # Tokenizer.
    if args.from_target:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    else:
        tok = tk.train_tokenizer(tk.training_texts(train[:P["tok_convs"]]), P["bpe_size"])
        tk.save_tokenizer_files(tok, tdir, DRAFT["max_pos"])
    n_ids = tok.get_vocab_size()
    vocab = (n_ids + 63) // 64 * 64  # embedding rows, padded like gpt-oss's 201088
    renderer = tk.Renderer(tok)
    log("tokenizer: %d ids (%d BPE + %d specials); model vocab %d"
        % (n_ids, n_ids - len(tk.SPECIALS), len(tk.SPECIALS), vocab))
    res["tokenizer_ids"] = n_ids

    examples = make_examples(renderer, train)
    lens = [len(e[0]) for e in examples]
    log("examples: %d turns, %d tokens (%d completion), length mean %.1f max %d"
        % (len(examples), sum(lens), sum(sum(m) for _, m in examples),
           sum(lens) / len(lens), max(lens)))
    n_val = max(2, len(examples) // 50)
    val, examples = examples[:n_val], examples[n_val:]
    ids = {n: tok.token_to_id(n) for n in ("<|return|>", "<|endoftext|>", "<|startoftext|>",
                                            "<|call|>")}
    pad = ids["<|endoftext|>"]
    vb = Batches(val, pad, 12, dev)
    n_eval = 8 if not args.smoke else 1
    if args.from_target:
        with open(os.path.join(tdir, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(out, "results.json")) as f:
            old = json.load(f)
        for key in ("target", "mxfp4"):
            res[key] = old[key]
    else:
        cfg = make_target(res, P, args, dev, log, tdir, vocab, ids, examples, vb, n_eval)
        tm.write_json(os.path.join(out, "results.json"), res)  # kept for --from-target
        if args.stop_after_target:
            log("target done; continue with --from-target")
            return 0

    # The draft learns from the target exactly as exported (read back from its files).
    target, _ = tm.load_target(tdir, dev)
    for p in target.parameters():
        p.requires_grad_(False)
    r_ce, r_acc = eval_target(target, vb, dev, n_eval, P["target_batch"])
    log("exported target read back: held-out ce %.4f acc %.4f" % (r_ce, r_acc))
    res["target_exported"] = {"val_ce": r_ce, "val_acc": r_acc}

    counts = collections.Counter()
    for seq, m in examples:
        counts.update(t for t, k in zip(seq, m) if k)
    ddims = dict(DRAFT, draft_vocab=min(DRAFT["draft_vocab"], vocab // 2))  # smoke: small vocab
    d2t, t2d = tm.vocab_map(counts, vocab, ddims["draft_vocab"])
    covered = sum(c for v, c in counts.items() if t2d[v]) / sum(counts.values())
    log("draft vocabulary: %d of %d ids cover %.4f of the completion tokens (%d distinct)"
        % (ddims["draft_vocab"], vocab, covered, len(counts)))
    res["draft_vocab_coverage"] = covered

    torch.manual_seed(4321)
    draft = tm.Eagle3Draft(ddims, TARGET["hidden"], vocab,
                           target.model.embed_tokens.weight.detach()).to(dev)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    log("draft: %d trainable parameters" % sum(p.numel() for p in draft.parameters()))
    db = Batches(examples, pad, 13, dev)
    dsteps, per = train_draft(draft, target, db, P, dev, log)
    res["draft"] = {"steps": dsteps, "ttt": P["ttt"],
                    "train_step_ce_acc": [[round(a, 4), round(b, 4)] for a, b in per]}
    tm.write_json(os.path.join(ddir, "config.json"), tm.draft_config(ddims, cfg))
    tm.save_safetensors(os.path.join(ddir, "model.safetensors"), tm.draft_state(draft))
    del draft, target

    # Samples and the acceptance check on the files as written.
    recs = sample_records(samples)
    with open(os.path.join(out, "sample_conversations.jsonl"), "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    figures = check_acceptance.run(tdir, ddir, os.path.join(out, "sample_conversations.jsonl"),
                                   dev, log, ids_out=os.path.join(out, "sample_prompt_ids.jsonl"),
                                   max_convs=None, max_new=P["max_new"])
    res["acceptance"] = figures
    res["seconds"] = round(time.time() - log.t0, 1)
    tm.write_json(os.path.join(out, "results.json"), res)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(check_acceptance.markdown(res))
    fill_readme(os.path.join(out, "README.md"), res, log)
    log("done in %.1f s; results in %s" % (res["seconds"], os.path.join(out, "results.md")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
