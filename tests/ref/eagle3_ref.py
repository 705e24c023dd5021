#!/usr/bin/env python3
"""EAGLE-3 draft reference: tiny drafts for tiny-gptoss-a and their golden outputs.

    python3 tests/ref/eagle3_ref.py OUTDIR            # needs OUTDIR/tiny-gptoss-a (gptoss_ref.py)
    python3 tests/ref/eagle3_ref.py OUTDIR --check    # regenerates into a temp dir and compares

The draft forward below is written only from the EAGLE-3 facts of the project (one Llama-style
layer on [norm(embed) | norm(hidden)], fc over the three aux states in ascending order, optional
norm_before_fc / norm_before_residual, NeoX RoPE theta 10000, full causal attention over the
draft's own KV cache, SiLU MLP, final norm, lm_head over the draft vocabulary mapped by d2t, the
pre-norm hidden fed back), and the loop follows the chain bookkeeping of those facts (§11):
extend over the rows committed by the last verify, K-1 draft steps, greedy verify by the target,
draft KV at committed positions always recomputed from target states.

Two drafts are written, both in the exact on-disk layouts engines load:
  tiny-eagle3-a-lmsys        SpecForge/lmsys layout: midlayer.*, ids in eagle_config in the
                             "output of layer id" convention, embed_tokens included, raw residual
  tiny-eagle3-a-speculators  speculators layout: layers.0.*, top-level ids in the boundary
                             convention, input_norm (norm_before_fc), norm_before_residual,
                             no embed_tokens (the target's table is used)
"""

import collections
import math
import os
import shutil
import sys

try:
    import safetensors  # noqa: F401
    import torch
    import transformers
except ImportError:
    if "--skip-without-torch" in sys.argv:  # ctest: exit code 77 = skipped
        print("skipped: torch, transformers and safetensors are needed")
        sys.exit(77)
    raise

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptoss_ref as gr  # noqa: E402
import refutil as ru  # noqa: E402

TARGET = "tiny-gptoss-a"
K = 3            # draft tokens per round (chain, topk = 1)
ROUNDS = 4
EPS = 1e-5

DRAFTS = {
    "tiny-eagle3-a-lmsys": dict(
        layout="lmsys", seed=3001, aux_ids=[0, 1, 2], boundaries=[1, 2, 3],
        norm_before_fc=False, norm_before_residual=False, with_embed=True, chain_prompt=0),
    "tiny-eagle3-a-speculators": dict(
        layout="speculators", seed=3002, aux_ids=[2, 3, 4], boundaries=[2, 3, 4],
        norm_before_fc=True, norm_before_residual=True, with_embed=False, chain_prompt=1),
}
# Shared shape of both drafts (the target has hidden 64, vocab 512).
SHAPE = dict(hidden=64, inter=192, heads=4, kv_heads=2, head_dim=32, draft_vocab=128,
             theta=10000.0, max_pos=2048)
# Prompts whose target greedy continuations give the token counts behind d2t (as SpecForge
# counts tokens of target-generated training data); the golden prompts come first.
VOCAB_EXTRA_PROMPTS = 5
VOCAB_PROMPT_SEED = 4001


# ----------------------------------------------------------------------------------------------
# The draft model


class Draft:
    """Weights (fp32 or fp64 copies of the bf16 files) and flags of one EAGLE-3 draft."""

    def __init__(self, w, cfg, target_embed, dtype=torch.float32):
        pre = "midlayer." if cfg["layout"] == "lmsys" else "layers.0."
        g = lambda n: w[n].to(dtype)  # noqa: E731
        self.dtype = dtype
        self.H, self.nh, self.nkv, self.d = (SHAPE["hidden"], SHAPE["heads"],
                                             SHAPE["kv_heads"], SHAPE["head_dim"])
        self.fc = g("fc.weight")
        self.input_norm = g("input_norm.weight") if cfg["norm_before_fc"] else None
        self.norm_before_residual = cfg["norm_before_residual"]
        self.hidden_norm = g(pre + "hidden_norm.weight")
        self.input_layernorm = g(pre + "input_layernorm.weight")
        self.wq = g(pre + "self_attn.q_proj.weight")
        self.wk = g(pre + "self_attn.k_proj.weight")
        self.wv = g(pre + "self_attn.v_proj.weight")
        self.wo = g(pre + "self_attn.o_proj.weight")
        self.post_ln = g(pre + "post_attention_layernorm.weight")
        self.w_gate = g(pre + "mlp.gate_proj.weight")
        self.w_up = g(pre + "mlp.up_proj.weight")
        self.w_down = g(pre + "mlp.down_proj.weight")
        self.norm = g("norm.weight")
        self.lm_head = g("lm_head.weight")
        # The draft always embeds with the target's table; a bundled copy must be identical.
        if "embed_tokens.weight" in w:
            assert torch.equal(w["embed_tokens.weight"], target_embed)
        self.embed = target_embed.to(dtype)
        self.hot = w["d2t"] + torch.arange(w["d2t"].shape[0])  # draft id -> target id
        self.inv_freq = 1.0 / (SHAPE["theta"] ** (
            torch.arange(0, self.d, 2, dtype=torch.float64) / self.d))
        self.strict = True
        self.reset()

    def reset(self):
        P = SHAPE["max_pos"]
        self.k_cache = torch.zeros(P, self.nkv, self.d, dtype=self.dtype)
        self.v_cache = torch.zeros(P, self.nkv, self.d, dtype=self.dtype)
        self.written = torch.zeros(P, dtype=torch.bool)

    def project(self, aux):
        """aux [n, 3H] = [low | mid | high] target states -> fc input g [n, H]."""
        a = aux.to(self.dtype)
        if self.input_norm is not None:
            a = rmsnorm(a, self.input_norm)
        return a @ self.fc.T

    def forward(self, g, tokens, positions):
        """One draft layer over rows (g [n, H], target-vocabulary tokens [n], positions [n]).
        Writes the rows' K/V at their positions, then each row attends to every cache entry at
        or before its position. Returns draft logits [n, D] and the pre-norm hidden h2 [n, H]."""
        n = tokens.shape[0]
        e = self.embed[tokens]
        r = rmsnorm(g, self.hidden_norm) if self.norm_before_residual else g
        u = torch.cat([rmsnorm(e, self.input_layernorm), rmsnorm(g, self.hidden_norm)], dim=-1)
        q = (u @ self.wq.T).view(n, self.nh, self.d)
        k = (u @ self.wk.T).view(n, self.nkv, self.d)
        v = (u @ self.wv.T).view(n, self.nkv, self.d)
        q, k = rope(q, positions, self.inv_freq), rope(k, positions, self.inv_freq)
        self.k_cache[positions] = k
        self.v_cache[positions] = v
        self.written[positions] = True
        outs = torch.empty(n, self.nh, self.d, dtype=self.dtype)
        group = self.nh // self.nkv
        for i in range(n):
            p = int(positions[i])
            if self.strict:
                assert self.written[:p + 1].all(), f"row at {p} would read an unwritten KV slot"
            kc, vc = self.k_cache[:p + 1], self.v_cache[:p + 1]
            for h in range(self.nh):
                s = (kc[:, h // group, :] @ q[i, h]) * (self.d ** -0.5)
                outs[i, h] = torch.softmax(s, dim=0) @ vc[:, h // group, :]
        h1 = outs.reshape(n, -1) @ self.wo.T + r
        z = rmsnorm(h1, self.post_ln)
        m = (torch.nn.functional.silu(z @ self.w_gate.T) * (z @ self.w_up.T)) @ self.w_down.T
        h2 = h1 + m
        logits = rmsnorm(h2, self.norm) @ self.lm_head.T
        return logits, h2


def rmsnorm(x, wt):
    return wt * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS))


def rope(x, positions, inv_freq):
    """NeoX half-split rotation of [n, heads, d] at the given absolute positions."""
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cos(ang).to(x.dtype)[:, None, :]
    sin = torch.sin(ang).to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


# ----------------------------------------------------------------------------------------------
# Draft checkpoints


def build_vocab(token_lists, V, D):
    """SpecForge rule: the D most frequent ids (ties: smaller id first), filled with the smallest
    unseen ids, sorted ascending; d2t[i] = used[i] - i, t2d[v] = v in used."""
    cnt = collections.Counter(t for lst in token_lists for t in lst)
    top = [t for t, _ in sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[:D]]
    fill = (t for t in range(V) if t not in cnt)
    while len(top) < D:
        top.append(next(fill))
    used = sorted(top)
    d2t = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    assert torch.equal(t2d.nonzero().flatten(), d2t + torch.arange(D))
    return d2t, t2d


def make_draft_weights(cfg, tw, d2t, t2d):
    """Random bf16 weights with a structure that lets the draft agree with the target sometimes.

    The tiny target's next token is often decided by its current token alone (its layers add
    little to the embedding), so the draft is built to predict "the target's next token after
    my input token": attention heads look mostly at the current row (queries and keys share a
    projection of the normed embedding), the values carry that embedding, o_proj maps it back
    with gain ALIGN, and lm_head / final norm are the target's lm_head rows of the draft
    vocabulary and the target's final norm. Every other weight, and a random part of these, is
    noise large enough that each input (all three aux states, the hidden half, the MLP) moves
    the logits well beyond fp32 rounding."""
    H, I, nh, nkv, d, D = (SHAPE["hidden"], SHAPE["inter"], SHAPE["heads"], SHAPE["kv_heads"],
                           SHAPE["head_dim"], SHAPE["draft_vocab"])
    rng = ru.Rng(cfg["seed"])
    ALIGN, FOCUS = 4.0, 1.5
    pre = "midlayer." if cfg["layout"] == "lmsys" else "layers.0."
    bf = ru.to_bf16
    w = {}
    w["fc.weight"] = bf(rng.normal((H, 3 * H), 1.0 / math.sqrt(3 * H)))
    if cfg["norm_before_fc"]:
        w["input_norm.weight"] = bf(rng.uniform((3 * H,), 0.5, 1.5))
    w[pre + "hidden_norm.weight"] = bf(rng.uniform((H,), 0.5, 1.5))
    w[pre + "input_layernorm.weight"] = bf(rng.uniform((H,), 0.8, 1.2))
    proj = rng.normal((nkv, d, H), 1.0 / math.sqrt(H))   # shared query/key projection
    wq = rng.normal((nh * d, 2 * H), 0.3 / math.sqrt(2 * H))
    wk = rng.normal((nkv * d, 2 * H), 0.3 / math.sqrt(2 * H))
    wv = rng.normal((nkv * d, 2 * H), 0.3 / math.sqrt(2 * H))
    wo = rng.normal((H, nh * d), 0.3 / math.sqrt(nh * d))
    group = nh // nkv
    for h in range(nh):
        kv = h // group
        wq[h * d:(h + 1) * d, :H] += FOCUS * proj[kv]
        # Head h of group kv writes the embedding slice kv*d..kv*d+d (nkv * d == H).
        wo[kv * d:(kv + 1) * d, h * d:(h + 1) * d] += (ALIGN / group) * torch.eye(d)
    for kv in range(nkv):
        wk[kv * d:(kv + 1) * d, :H] += proj[kv]
        wv[kv * d:(kv + 1) * d, kv * d:(kv + 1) * d] += torch.eye(d)
    w[pre + "self_attn.q_proj.weight"] = bf(wq)
    w[pre + "self_attn.k_proj.weight"] = bf(wk)
    w[pre + "self_attn.v_proj.weight"] = bf(wv)
    w[pre + "self_attn.o_proj.weight"] = bf(wo)
    w[pre + "post_attention_layernorm.weight"] = bf(rng.uniform((H,), 0.5, 1.5))
    w[pre + "mlp.gate_proj.weight"] = bf(rng.normal((I, H), 1.0 / math.sqrt(H)))
    w[pre + "mlp.up_proj.weight"] = bf(rng.normal((I, H), 1.0 / math.sqrt(H)))
    w[pre + "mlp.down_proj.weight"] = bf(rng.normal((H, I), 0.5 / math.sqrt(I)))
    w["norm.weight"] = tw["model.norm.weight"].clone()
    hot = d2t + torch.arange(D)
    lm = tw["lm_head.weight"][hot].double() + rng.normal((D, H), 0.05)
    w["lm_head.weight"] = bf(lm)
    w["d2t"] = d2t
    w["t2d"] = t2d
    if cfg["with_embed"]:
        w["embed_tokens.weight"] = tw["model.embed_tokens.weight"].clone()
    return w


def draft_config(cfg, tcfg):
    llama = {
        "attention_bias": False,
        "head_dim": SHAPE["head_dim"],
        "hidden_act": "silu",
        "hidden_size": SHAPE["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": SHAPE["inter"],
        "max_position_embeddings": SHAPE["max_pos"],
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": SHAPE["heads"],
        "num_hidden_layers": 1,
        "num_key_value_heads": SHAPE["kv_heads"],
        "rms_norm_eps": EPS,
        "tie_word_embeddings": False,
        "vocab_size": tcfg["vocab"],
    }
    if cfg["layout"] == "lmsys":
        # SpecForge writes no rope_theta (Llama default 10000) and pins the ids in eagle_config.
        out = {"architectures": ["LlamaForCausalLMEagle3"]}
        out.update(llama)
        out.update({
            "bos_token_id": tcfg["bos"],
            "draft_vocab_size": SHAPE["draft_vocab"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": cfg["aux_ids"]},
            "eos_token_id": tcfg["eos"],
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
            "use_cache": True,
        })
        return dict(sorted(out.items()))
    llama["rope_theta"] = SHAPE["theta"]
    return {
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": SHAPE["draft_vocab"],
        "eagle_aux_hidden_state_layer_ids": cfg["aux_ids"],
        "norm_before_fc": True,
        "norm_before_residual": True,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": K}],
            "verifier": {"architectures": ["GptOssForCausalLM"], "name_or_path": TARGET},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "target_hidden_size": tcfg["hidden"],
        "torch_dtype": "bfloat16",
        "transformer_layer_config": dict(sorted(llama.items())),
    }


# ----------------------------------------------------------------------------------------------
# Goldens


def aux_rows(bounds, boundaries, rows):
    """bounds [L+1, n, H] -> [len(rows), 3H], boundaries in ascending order."""
    return torch.cat([bounds[b, rows] for b in sorted(boundaries)], dim=-1)


def run_chain(model, draft, boundaries, prompt):
    """ROUNDS rounds of chain drafting (K tokens) against the transformers target, greedy.
    Returns per-round records and the emitted token stream (prefill token first)."""
    draft.reset()
    n = prompt.shape[0]
    tl, tb = gr.hf_forward(model, prompt)
    b = int(tl[-1].argmax())
    emitted = [b]
    committed = prompt.tolist()                    # tokens whose target KV exists
    ext_aux = aux_rows(tb, boundaries, list(range(n)))
    ext_tok = committed[1:] + [b]
    ext_pos = list(range(n))
    rounds = []
    for _ in range(ROUNDS):
        C = len(committed)
        assert ext_pos[-1] == C - 1
        logits, h2 = draft.forward(draft.project(ext_aux), torch.tensor(ext_tok),
                                   torch.tensor(ext_pos))
        d_logits = [logits[-1]]
        drafted = [int(draft.hot[logits[-1].argmax()])]
        h = h2[-1:]
        for j in range(1, K):
            lg, h = draft.forward(h, torch.tensor([drafted[-1]]), torch.tensor([C + j - 1]))
            d_logits.append(lg[0])
            drafted.append(int(draft.hot[lg[0].argmax()]))
        seq = torch.tensor(committed + [b] + drafted)
        vl, vb = gr.hf_forward(model, seq)
        v_logits = vl[C:C + K + 1]
        tgt = v_logits.argmax(-1).tolist()
        a = 0
        while a < K and drafted[a] == tgt[a]:
            a += 1
        b_new = tgt[a]
        rounds.append({
            "committed": C,
            "extend_positions": torch.tensor(ext_pos, dtype=torch.int64),
            "extend_tokens": torch.tensor(ext_tok, dtype=torch.int64),
            "extend_aux": ext_aux.float().contiguous(),
            "draft_tokens": torch.tensor(drafted, dtype=torch.int64),
            "draft_logits": torch.stack(d_logits).float(),
            "verify_logits": v_logits.float().contiguous(),
            "accepted": a,
            "emitted": torch.tensor(drafted[:a] + [b_new], dtype=torch.int64),
        })
        emitted += drafted[:a] + [b_new]
        # Rows 0..a of this verify feed the next extend: the aux state of the token at
        # position C+i, paired with the token that follows it (accepted drafts, then b_new).
        ext_aux = aux_rows(vb, boundaries, [C + i for i in range(a + 1)])
        ext_tok = drafted[:a] + [b_new]
        ext_pos = [C + i for i in range(a + 1)]
        committed = committed + [b] + drafted[:a]
        b = b_new
    return rounds, emitted


def chain_mutation_effect(draft, rounds):
    """How far the draft logits move if the KV bookkeeping is done wrong, so a C engine with such
    a bug fails the golden: (a) steps placed one position too far, (b) no overwrite of the
    draft-step KV at committed positions (extend only the new bonus row)."""
    effects = {}
    effects["step_position_plus_one"] = _replay(draft, rounds, step_shift=1)
    effects["no_kv_overwrite"] = _replay(draft, rounds, skip_overwrite=True)
    return effects


def _replay(draft, rounds, step_shift=0, skip_overwrite=False):
    """Replays the recorded rounds (same tokens, same extend inputs) with one bookkeeping bug and
    returns the largest change of the draft logits."""
    draft.reset()
    draft.strict = False  # a buggy schedule may read slots it never wrote
    worst = 0.0
    for r in rounds:
        C = r["committed"]
        pos, tok, aux = r["extend_positions"], r["extend_tokens"], r["extend_aux"]
        if skip_overwrite and pos.shape[0] > 1 and r is not rounds[0]:
            pos, tok, aux = pos[-1:], tok[-1:], aux[-1:]
        logits, h2 = draft.forward(draft.project(aux), tok, pos)
        lg_all = [logits[-1]]
        h = h2[-1:]
        for j in range(1, K):
            lg, h = draft.forward(h, r["draft_tokens"][j - 1:j],
                                  torch.tensor([C + j - 1 + step_shift]))
            lg_all.append(lg[0])
        diff = (torch.stack(lg_all).float() - r["draft_logits"]).abs().max().item()
        worst = max(worst, diff)
    draft.strict = True
    return worst


def build(outdir, name, cfg, model, tw, tgold, vocab_tokens, log):
    tcfg = gr.CONFIGS[TARGET]
    d2t, t2d = build_vocab(vocab_tokens, tcfg["vocab"], SHAPE["draft_vocab"])
    w = make_draft_weights(cfg, tw, d2t, t2d)
    ddir = os.path.join(outdir, name)
    os.makedirs(ddir, exist_ok=True)
    ru.write_json(os.path.join(ddir, "config.json"), draft_config(cfg, tcfg))
    ru.write_safetensors(os.path.join(ddir, "model.safetensors"), w, {"format": "pt"})
    w, _ = ru.read_safetensors(os.path.join(ddir, "model.safetensors"))
    temb = tw["model.embed_tokens.weight"]
    draft = Draft(w, cfg, temb, torch.float32)
    draft64 = Draft(w, cfg, temb, torch.float64)

    golden = {}
    worst64 = 0.0
    min_margin = float("inf")
    agree = total = 0
    p = 0
    while f"prompt{p}.ids" in tgold:
        ids, cont = tgold[f"prompt{p}.ids"], tgold[f"prompt{p}.greedy_ids"]
        n = ids.shape[0]
        aux = aux_rows(tgold[f"prompt{p}.hidden_states"], cfg["boundaries"], list(range(n)))
        toks = torch.cat([ids[1:], cont[:1]])
        pos = torch.arange(n)
        draft.reset()
        logits, h2 = draft.forward(draft.project(aux), toks, pos)
        draft64.reset()
        l64, _ = draft64.forward(draft64.project(aux.double()), toks, pos)
        worst64 = max(worst64, (logits.double() - l64).abs().max().item())
        mapped = draft.hot[logits.argmax(-1)]
        # Row t guesses what the target predicts at position t+1 (the token at t+2).
        t_next = torch.cat([tgold[f"prompt{p}.logits"][1:], tgold[f"prompt{p}.greedy_logits"][1:2]])
        agree += int((mapped == t_next.argmax(-1)).sum())
        total += n
        key = f"prompt{p}."
        golden[key + "aux"] = aux.float().contiguous()
        golden[key + "input_ids"] = toks
        golden[key + "positions"] = pos
        golden[key + "logits"] = logits.float().contiguous()
        golden[key + "hidden"] = h2.float().contiguous()
        golden[key + "argmax_target_ids"] = mapped
        min_margin = min(min_margin, ru.top2_margin(logits).min().item())
        p += 1

    chain_p = cfg["chain_prompt"]
    prompt = tgold[f"prompt{chain_p}.ids"]
    rounds, emitted = run_chain(model, draft, cfg["boundaries"], prompt)
    cont = tgold[f"prompt{chain_p}.greedy_ids"].tolist()
    # Greedy speculative decoding must reproduce plain greedy decoding of the target.
    assert emitted == cont[:len(emitted)], (emitted, cont)
    accepted = [r["accepted"] for r in rounds]
    assert any(a > 0 for a in accepted), f"{name}: no round accepted a draft token {accepted}"
    golden["chain.prompt_ids"] = prompt
    golden["chain.emitted"] = torch.tensor(emitted, dtype=torch.int64)
    chain_margin = chain_tmargin = float("inf")
    for ri, r in enumerate(rounds):
        key = f"chain.round{ri}."
        for field in ("extend_positions", "extend_tokens", "extend_aux", "draft_tokens",
                      "draft_logits", "verify_logits", "emitted"):
            golden[key + field] = r[field]
        golden[key + "committed"] = torch.tensor([r["committed"]], dtype=torch.int64)
        golden[key + "accepted"] = torch.tensor([r["accepted"]], dtype=torch.int64)
        chain_margin = min(chain_margin, ru.top2_margin(r["draft_logits"]).min().item())
        chain_tmargin = min(chain_tmargin, ru.top2_margin(r["verify_logits"]).min().item())
    effects = chain_mutation_effect(draft, rounds)
    log(f"{name}: draft fp32 vs fp64 {worst64:.2e}; draft top-1 = target next token on "
        f"{agree}/{total} golden rows; chain accepted {accepted}, emitted {emitted}; min draft "
        f"margin chain {chain_margin:.4f} rows {min_margin:.4f}; verify margin "
        f"{chain_tmargin:.4f}; bookkeeping-bug effects "
        + ", ".join(f"{k} {v:.3g}" for k, v in effects.items()))
    assert chain_margin > max(1e-3, 100 * worst64), f"{name}: near-tie in the draft chain"
    assert chain_tmargin > 1e-3, f"{name}: near-tie in the verify logits"
    assert effects["step_position_plus_one"] > 1000 * worst64
    if any(a > 0 for a in accepted[:-1]):
        assert effects["no_kv_overwrite"] > 1000 * worst64

    meta = {
        "format": "draftscope golden v1",
        "model": name,
        "target": TARGET,
        "generator": "tests/ref/eagle3_ref.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "weight_seed": cfg["seed"],
        "aux_boundaries": ",".join(str(b) for b in cfg["boundaries"]),
        "aux_ids_in_config": ",".join(str(b) for b in cfg["aux_ids"]),
        "num_prompts": p,
        "chain_prompt": chain_p,
        "chain_k": K,
        "chain_rounds": ROUNDS,
        "chain_accepted": ",".join(str(a) for a in accepted),
        "min_top2_margin_draft_chain": f"{chain_margin:.6g}",
        "min_top2_margin_draft_rows": f"{min_margin:.6g}",
        "min_top2_margin_verify": f"{chain_tmargin:.6g}",
        "max_abs_diff_draft_fp32_vs_fp64": f"{worst64:.6g}",
    }
    for k, v in effects.items():
        meta[f"effect_{k}"] = f"{v:.4g}"
    ru.write_safetensors(os.path.join(outdir, f"{name}.golden.safetensors"), golden, meta)


def vocab_token_lists(model, tgold):
    lists = []
    p = 0
    while f"prompt{p}.greedy_ids" in tgold:
        lists.append(tgold[f"prompt{p}.greedy_ids"].tolist())
        p += 1
    c = dict(gr.CONFIGS[TARGET])
    c["prompt_seed"] = VOCAB_PROMPT_SEED
    c["prompt_lens"] = (24,) * VOCAB_EXTRA_PROMPTS
    for ids in gr.make_prompts(c):
        lists.append(gr.hf_greedy(model, ids, gr.GREEDY_TOKENS).tolist())
    return lists


def generate(outdir, log):
    torch.set_num_threads(1)
    ckdir = os.path.join(outdir, TARGET)
    gpath = os.path.join(outdir, f"{TARGET}.golden.safetensors")
    if not os.path.exists(gpath):
        raise SystemExit(f"{gpath}: missing; run tests/ref/gptoss_ref.py {outdir} first")
    model, tw = gr.load_hf(ckdir)
    tgold, _ = ru.read_safetensors(gpath)
    vocab_tokens = vocab_token_lists(model, tgold)
    for name, cfg in DRAFTS.items():
        build(outdir, name, cfg, model, tw, tgold, vocab_tokens, log)


def copy_target(tmp, outdir):
    """--check rebuilds the drafts on the committed target checkpoint and goldens."""
    shutil.copytree(os.path.join(outdir, TARGET), os.path.join(tmp, TARGET))
    shutil.copy(os.path.join(outdir, f"{TARGET}.golden.safetensors"), tmp)


def main():
    names = [x for name in DRAFTS for x in (name, f"{name}.golden.safetensors")]
    return ru.main(__doc__, generate, names,
                   "golden directory holding tiny-gptoss-a (tests/fixtures/golden)", copy_target)


if __name__ == "__main__":
    sys.exit(main())
