#!/usr/bin/env python3
"""Tiny gpt-oss checkpoints and their reference outputs (the target oracle of the C engine).

    python3 tests/ref/gptoss_ref.py OUTDIR            # writes checkpoints + goldens into OUTDIR
    python3 tests/ref/gptoss_ref.py OUTDIR --check    # regenerates into a temp dir and compares

For each tiny configuration this script
  1. draws random weights from a version-independent seeded generator, rounds them to bf16 and
     draws random MXFP4 codes and E8M0 scales for the experts;
  2. writes the checkpoint in the exact Hugging Face layout (config.json, generation_config.json,
     model.safetensors or zero-based shards + model.safetensors.index.json);
  3. reads the files back, dequantizes the experts with the MXFP4 rule of the model facts, loads
     the numbers into transformers' GptOssForCausalLM (fp32, eager attention, eager experts);
  4. checks transformers against an independent fp64 forward written from the model facts
     (sinks, sliding window on even layers, YaRN without truncation, top-k-then-softmax router,
     interleaved clamped SwiGLU), and checks that each of those features changes the logits;
  5. writes, per prompt, the logits of every prompt position, a 32-token greedy continuation and
     its logits, and the residual stream at every layer boundary (the draft's aux inputs).
The golden tensors and their meaning are described in docs/references.md.
"""

import math
import os
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
import refutil as ru  # noqa: E402

GREEDY_TOKENS = 32
SWIGLU_ALPHA = 1.702

# Scale bytes around 127 - a few keep the dequantized experts in a sane range: gate_up
# pre-activations of a few units (so the clamp at 7 is reached sometimes), down outputs
# comparable with the residual stream.
CONFIGS = {
    "tiny-gptoss-a": dict(
        seed=1001, hidden=64, inter=64, heads=4, head_dim=32, kv_heads=2, layers=4, experts=8,
        top_k=4, window=8, vocab=512, theta=150000.0, factor=32.0, beta_fast=32.0,
        beta_slow=1.0, orig_max_pos=64, swiglu_limit=7.0, eos=511, pad=510, bos=509,
        gate_up_scales=(122, 125), down_scales=(114, 117), o_std=0.25, shards=None,
        prompt_lens=(23, 31, 40), prompt_seed=2001),
    "tiny-gptoss-b": dict(
        seed=1002, hidden=96, inter=32, heads=6, head_dim=16, kv_heads=2, layers=6, experts=12,
        top_k=4, window=6, vocab=288, theta=150000.0, factor=8.0, beta_fast=16.0,
        beta_slow=1.0, orig_max_pos=1024, swiglu_limit=7.0, eos=287, pad=286, bos=285,
        gate_up_scales=(122, 125), down_scales=(116, 119), o_std=0.5, shards=3,
        prompt_lens=(20, 29, 37), prompt_seed=2003),
}


# ----------------------------------------------------------------------------------------------
# Checkpoint generation


def hf_config(c):
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention"
                   for i in range(c["layers"])]
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": c["eos"],
        "experts_per_token": c["top_k"],
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": c["hidden"],
        "initial_context_length": c["orig_max_pos"],
        "initializer_range": 0.02,
        "intermediate_size": c["inter"],
        "layer_types": layer_types,
        "max_position_embeddings": int(c["orig_max_pos"] * c["factor"]),
        "model_type": "gpt_oss",
        "num_attention_heads": c["heads"],
        "num_experts_per_tok": c["top_k"],
        "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["kv_heads"],
        "num_local_experts": c["experts"],
        "output_router_logits": False,
        "pad_token_id": c["pad"],
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": c["beta_fast"],
            "beta_slow": c["beta_slow"],
            "factor": c["factor"],
            "original_max_position_embeddings": c["orig_max_pos"],
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": c["theta"],
        "router_aux_loss_coef": 0.9,
        "sliding_window": c["window"],
        "swiglu_limit": c["swiglu_limit"],
        "tie_word_embeddings": False,
        "transformers_version": "4.55.0.dev0",
        "use_cache": True,
        "vocab_size": c["vocab"],
    }


def make_weights(c):
    """name -> tensor in the HF layout; bf16 everywhere except the U8 MXFP4 blocks/scales."""
    rng = ru.Rng(c["seed"])
    H, I, E = c["hidden"], c["inter"], c["experts"]
    nh, nkv, d, V = c["heads"], c["kv_heads"], c["head_dim"], c["vocab"]
    bf = ru.to_bf16
    w = {}
    w["model.embed_tokens.weight"] = bf(rng.normal((V, H), 1.0))
    for li in range(c["layers"]):
        p = f"model.layers.{li}."
        w[p + "input_layernorm.weight"] = bf(rng.uniform((H,), 0.5, 1.5))
        w[p + "self_attn.q_proj.weight"] = bf(rng.normal((nh * d, H), 1.0 / math.sqrt(H)))
        w[p + "self_attn.q_proj.bias"] = bf(rng.normal((nh * d,), 0.2))
        w[p + "self_attn.k_proj.weight"] = bf(rng.normal((nkv * d, H), 1.0 / math.sqrt(H)))
        w[p + "self_attn.k_proj.bias"] = bf(rng.normal((nkv * d,), 0.2))
        w[p + "self_attn.v_proj.weight"] = bf(rng.normal((nkv * d, H), 1.0 / math.sqrt(H)))
        w[p + "self_attn.v_proj.bias"] = bf(rng.normal((nkv * d,), 0.2))
        o_std = c["o_std"] / math.sqrt(nh * d)
        w[p + "self_attn.o_proj.weight"] = bf(rng.normal((H, nh * d), o_std))
        w[p + "self_attn.o_proj.bias"] = bf(rng.normal((H,), 0.1))
        # Sinks of the size of typical attention logits, so they take a real share.
        w[p + "self_attn.sinks"] = bf(rng.normal((nh,), 1.0, mean=0.5))
        w[p + "post_attention_layernorm.weight"] = bf(rng.uniform((H,), 0.5, 1.5))
        w[p + "mlp.router.weight"] = bf(rng.normal((E, H), 2.0 / math.sqrt(H)))
        w[p + "mlp.router.bias"] = bf(rng.normal((E,), 0.5))
        lo, hi = c["gate_up_scales"]
        w[p + "mlp.experts.gate_up_proj_blocks"] = \
            rng.integers((E, 2 * I, H // 32, 16), 0, 255).to(torch.uint8)
        w[p + "mlp.experts.gate_up_proj_scales"] = \
            rng.integers((E, 2 * I, H // 32), lo, hi).to(torch.uint8)
        w[p + "mlp.experts.gate_up_proj_bias"] = bf(rng.normal((E, 2 * I), 0.5))
        lo, hi = c["down_scales"]
        w[p + "mlp.experts.down_proj_blocks"] = \
            rng.integers((E, H, I // 32, 16), 0, 255).to(torch.uint8)
        w[p + "mlp.experts.down_proj_scales"] = \
            rng.integers((E, H, I // 32), lo, hi).to(torch.uint8)
        w[p + "mlp.experts.down_proj_bias"] = bf(rng.normal((E, H), 0.1))
    w["model.norm.weight"] = bf(rng.uniform((H,), 0.5, 1.5))
    w["lm_head.weight"] = bf(rng.normal((V, H), 3.0 / math.sqrt(H)))
    return w


def make_prompts(c):
    rng = ru.Rng(c["prompt_seed"])
    specials = {c["eos"], c["pad"], c["bos"]}
    ordinary = [t for t in range(c["vocab"]) if t not in specials]
    return [torch.tensor([rng.choice(ordinary) for _ in range(n)], dtype=torch.int64)
            for n in c["prompt_lens"]]


def write_checkpoint(dirpath, c, w):
    os.makedirs(dirpath, exist_ok=True)
    ru.write_json(os.path.join(dirpath, "config.json"), hf_config(c))
    ru.write_json(os.path.join(dirpath, "generation_config.json"), {
        "bos_token_id": c["bos"], "do_sample": True, "eos_token_id": [c["eos"], c["pad"]],
        "pad_token_id": c["pad"], "transformers_version": "4.55.0.dev0"})
    if not c["shards"]:
        ru.write_safetensors(os.path.join(dirpath, "model.safetensors"), w, {"format": "pt"})
        return
    # Layers spread over the first files; embed, final norm and lm_head in the last one, as in
    # the published 20b index.
    n = c["shards"]
    per = math.ceil(c["layers"] / (n - 1))
    groups = [[] for _ in range(n)]
    for name in w:
        if name.startswith("model.layers."):
            groups[int(name.split(".")[2]) // per].append(name)
        else:
            groups[n - 1].append(name)
    ru.write_sharded(dirpath, w, groups, n)


# ----------------------------------------------------------------------------------------------
# Independent fp64 forward, written from the model facts


def dequant_experts(w, li):
    p = f"model.layers.{li}.mlp.experts."
    gu = ru.mxfp4_dequant(w[p + "gate_up_proj_blocks"], w[p + "gate_up_proj_scales"])
    dn = ru.mxfp4_dequant(w[p + "down_proj_blocks"], w[p + "down_proj_scales"])
    return gu, dn  # [E, 2I, H] and [E, H, I], torch layout W[out, in]


def yarn_inv_freq(c, dtype=torch.float64):
    """inv_freq and concentration, YaRN with truncate=false (model facts §4.4)."""
    d, theta, s = c["head_dim"], c["theta"], c["factor"]
    L0, bf_, bs_ = c["orig_max_pos"], c["beta_fast"], c["beta_slow"]

    def corr(rot):
        return (d / 2) * math.log(L0 / (rot * 2 * math.pi)) / math.log(theta)
    low, high = max(corr(bf_), 0.0), min(corr(bs_), d - 1.0)
    out = []
    for i in range(d // 2):
        f = theta ** (2 * i / d)
        r = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(r * (1.0 / (s * f)) + (1.0 - r) * (1.0 / f))
    conc = 0.1 * math.log(s) + 1.0
    return torch.tensor(out, dtype=dtype), conc, low, high


def rmsnorm(x, wt, eps=1e-5):
    return wt * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def rope_neox(x, pos, inv_freq, conc):
    """x [n, heads, d]; rotates pairs (i, i + d/2)."""
    ang = pos.to(x.dtype)[:, None] * inv_freq.to(x.dtype)[None, :]
    cos, sin = (conc * torch.cos(ang))[:, None, :], (conc * torch.sin(ang))[:, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def spec_forward(c, w, ids, dtype=torch.float64, sinks=True, sliding=True, yarn=True,
                 clamp=True, stats=None):
    """Returns logits [n, V] and the residual stream at every boundary [L+1, n, H].
    The keyword switches turn one feature off, to prove the fixtures exercise it."""
    nh, nkv, d = c["heads"], c["kv_heads"], c["head_dim"]
    lim, k_top = c["swiglu_limit"], c["top_k"]
    n = ids.shape[0]
    g = lambda name: w[name].to(dtype)  # noqa: E731
    pos = torch.arange(n)
    if yarn:
        inv_freq, conc, _, _ = yarn_inv_freq(c, dtype)
    else:
        inv_freq = 1.0 / (c["theta"] ** (torch.arange(0, d, 2, dtype=dtype) / d))
        conc = 1.0
    x = g("model.embed_tokens.weight")[ids]
    bounds = [x]
    i_idx, j_idx = torch.arange(n)[:, None], torch.arange(n)[None, :]
    for li in range(c["layers"]):
        p = f"model.layers.{li}."
        t = rmsnorm(x, g(p + "input_layernorm.weight"))
        q = (t @ g(p + "self_attn.q_proj.weight").T + g(p + "self_attn.q_proj.bias"))
        k = (t @ g(p + "self_attn.k_proj.weight").T + g(p + "self_attn.k_proj.bias"))
        v = (t @ g(p + "self_attn.v_proj.weight").T + g(p + "self_attn.v_proj.bias"))
        q = rope_neox(q.view(n, nh, d), pos, inv_freq, conc)
        k = rope_neox(k.view(n, nkv, d), pos, inv_freq, conc)
        v = v.view(n, nkv, d)
        allowed = j_idx <= i_idx
        if sliding and li % 2 == 0:
            allowed = allowed & (j_idx > i_idx - c["window"])
        outs = []
        for h in range(nh):
            kv = h // (nh // nkv)
            lg = (q[:, h, :] @ k[:, kv, :].T) * (d ** -0.5)
            lg = lg.masked_fill(~allowed, float("-inf"))
            if sinks:
                s = g(p + "self_attn.sinks")[h].expand(n, 1)
                full = torch.cat([lg, s], dim=1)
                m = full.max(dim=1, keepdim=True).values
                e = torch.exp(full - m)
                pr = e[:, :n] / e.sum(dim=1, keepdim=True)
                if stats is not None:
                    stats.setdefault("sink_mass", []).append((e[:, n] / e.sum(dim=1)).mean())
            else:
                pr = torch.softmax(lg, dim=1)
            outs.append(pr @ v[:, kv, :])
        o = (torch.cat(outs, dim=1) @ g(p + "self_attn.o_proj.weight").T
             + g(p + "self_attn.o_proj.bias"))
        x = x + o
        t2 = rmsnorm(x, g(p + "post_attention_layernorm.weight"))
        rl = t2 @ g(p + "mlp.router.weight").T + g(p + "mlp.router.bias")
        srt = torch.sort(rl, dim=1, descending=True).values
        if stats is not None:
            stats.setdefault("router_gap", []).append((srt[:, k_top - 1] - srt[:, k_top]).min())
        top_v, top_i = torch.topk(rl, k_top, dim=1)
        top_w = torch.softmax(top_v, dim=1)
        gu, dn = dequant_experts(w, li)
        gu, dn = gu.to(dtype), dn.to(dtype)
        b1 = g(p + "mlp.experts.gate_up_proj_bias")
        b2 = g(p + "mlp.experts.down_proj_bias")
        # Gather the selected experts per (token, slot): [n, k, out, in].
        u = torch.einsum("nkoi,ni->nko", gu[top_i], t2) + b1[top_i]
        gate, lin = u[..., 0::2], u[..., 1::2]
        if stats is not None:
            stats.setdefault("gate_clamped", []).append((gate > lim).double().mean())
            stats.setdefault("lin_clamped", []).append((lin.abs() > lim).double().mean())
        if clamp:
            gate = gate.clamp(max=lim)
            lin = lin.clamp(-lim, lim)
        hact = gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (lin + 1.0)
        y = torch.einsum("nkoi,nki->nko", dn[top_i], hact) + b2[top_i]
        moe = (top_w[..., None] * y).sum(dim=1)
        x = x + moe
        bounds.append(x)
    logits = rmsnorm(x, g("model.norm.weight")) @ g("lm_head.weight").T
    return logits, torch.stack(bounds)


# ----------------------------------------------------------------------------------------------
# transformers side


def load_hf(ckdir):
    """GptOssForCausalLM in fp32, eager attention and eager experts, with the checkpoint's
    numbers: bf16 tensors upcast, experts dequantized by our MXFP4 rule and transposed into
    transformers' [E, in, out] parameter layout."""
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig.from_pretrained(ckdir)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"
    model = GptOssForCausalLM(cfg).to(torch.float32).eval()
    assert model.config._attn_implementation == "eager"
    assert getattr(model.config, "_experts_implementation", "eager") in (None, "eager")
    w = ru.read_checkpoint(ckdir)
    sd = {}
    for name, t in w.items():
        if name.endswith("_blocks") or name.endswith("_scales"):
            continue
        sd[name] = t.to(torch.float32)
    for li in range(cfg.num_hidden_layers):
        gu, dn = dequant_experts(w, li)
        p = f"model.layers.{li}.mlp.experts."
        sd[p + "gate_up_proj"] = gu.transpose(1, 2).contiguous()
        sd[p + "down_proj"] = dn.transpose(1, 2).contiguous()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # Only non-persistent buffers may be absent from a checkpoint.
    assert not unexpected, unexpected
    assert not [m for m in missing if "rotary" not in m], missing
    return model, w


def hf_forward(model, ids):
    """logits [n, V] fp32 and residual stream at boundaries [L+1, n, H] (boundary 0 = embedding
    output, boundary j = output of layer j-1, boundary L taken before the final norm)."""
    caps = []
    hooks = [model.model.embed_tokens.register_forward_hook(lambda m, i, o: caps.append(o))]
    for layer in model.model.layers:
        hooks.append(layer.register_forward_hook(
            lambda m, i, o: caps.append(o[0] if isinstance(o, tuple) else o)))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None, :], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float(), torch.stack([t[0] for t in caps]).float()


def hf_greedy(model, ids, n_new):
    seq = ids.clone()
    for _ in range(n_new):
        logits, _ = hf_forward(model, seq)
        seq = torch.cat([seq, logits[-1].argmax().view(1)])
    return seq[ids.shape[0]:]


def check_rope(model, c):
    """The inv_freq transformers computes equals the YaRN formula (truncate=false)."""
    mine, conc, low, high = yarn_inv_freq(c)
    rot = model.model.rotary_emb
    theirs = rot.inv_freq.double()
    err = ((theirs - mine).abs() / mine).max().item()
    assert err < 1e-6, f"transformers inv_freq differs from the YaRN formula by {err}"
    assert abs(rot.attention_scaling - conc) < 1e-12, (rot.attention_scaling, conc)
    # The fixture must really blend: some frequencies pure, some interpolated, some ramped.
    r = [(i - low) / (high - low) for i in range(c["head_dim"] // 2)]
    assert any(0 < x < 1 for x in r), "no frequency on the YaRN ramp"
    return err, low, high


def check_spec_vector():
    """Our YaRN formula reproduces the published inv_freq test vector of the real model."""
    real = dict(head_dim=64, theta=150000.0, factor=32.0, orig_max_pos=4096, beta_fast=32.0,
                beta_slow=1.0)
    inv, conc, low, high = yarn_inv_freq(real)
    for i, want in [(0, 1.0), (8, 5.081327482e-02), (9, 3.170569618e-02),
                    (17, 1.293187012e-04), (18, 3.830881237e-05), (31, 3.023511428e-07)]:
        assert abs(inv[i].item() - want) / want < 1e-8, (i, inv[i].item(), want)
    assert abs(low - 8.092779115512402) < 1e-12 and abs(high - 17.39802450158856) < 1e-12
    assert abs(conc - 1.3465735902799727) < 1e-15


def try_hf_dequant(ckdir, model):
    """If this transformers can dequantize MXFP4 on the CPU, its numbers must equal ours."""
    try:
        from transformers import GptOssForCausalLM, Mxfp4Config
        ref = GptOssForCausalLM.from_pretrained(
            ckdir, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 -- any failure only means "not checked"
        return f"not checked ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    a = dict(model.named_parameters())
    for name, t in ref.named_parameters():
        if name.endswith("gate_up_proj") or name.endswith("down_proj"):
            if not torch.equal(t.float(), a[name].float()):
                raise AssertionError(f"transformers' own MXFP4 dequantization differs at {name}")
    return "equal"


# ----------------------------------------------------------------------------------------------


def build(outdir, name, c, log):
    ckdir = os.path.join(outdir, name)
    w = make_weights(c)
    write_checkpoint(ckdir, c, w)
    model, w = load_hf(ckdir)  # numbers read back from the files
    rope_err, low, high = check_rope(model, c)
    hf_deq = try_hf_dequant(ckdir, model)
    log(f"{name}: YaRN low {low:.4f} high {high:.4f}, inv_freq rel err {rope_err:.2e}; "
        f"transformers' MXFP4 dequantization: {hf_deq}")

    prompts = make_prompts(c)
    golden = {}
    stats = {}
    worst_spec = 0.0
    min_margin_greedy = min_margin_prompt = float("inf")
    effects = {"sinks": 0.0, "sliding": 0.0, "yarn": 0.0, "clamp": 0.0}
    bigram_hits = bigram_total = 0
    for pi, ids in enumerate(prompts):
        n = ids.shape[0]
        cont = hf_greedy(model, ids, GREEDY_TOKENS)
        full = torch.cat([ids, cont])
        logits, bounds = hf_forward(model, full[:-1])
        # The continuation is exactly the argmax chain of one full forward.
        assert torch.equal(logits[n - 1:].argmax(-1), cont), "greedy chain is not self-consistent"
        spec_logits, spec_bounds = spec_forward(c, w, full[:-1], stats=stats)
        diff = (logits.double() - spec_logits).abs().max().item()
        worst_spec = max(worst_spec, diff)
        assert diff < 1e-3, f"{name} prompt {pi}: transformers vs model facts differ by {diff}"
        assert torch.equal(spec_logits[n - 1:].argmax(-1), cont)
        for feat in effects:
            alt, _ = spec_forward(c, w, full[:-1], **{feat: False})
            effects[feat] = max(effects[feat], (alt - spec_logits).abs().max().item())
        m_greedy = ru.top2_margin(logits[n - 1:]).min().item()
        m_prompt = ru.top2_margin(logits[:n]).min().item()
        min_margin_greedy = min(min_margin_greedy, m_greedy)
        min_margin_prompt = min(min_margin_prompt, m_prompt)
        distinct = len(set(cont.tolist()))
        assert distinct >= 6, f"{name} prompt {pi}: degenerate continuation {cont.tolist()}"
        # How often the next token depends on the current token only (used to size the draft).
        emb = w["model.embed_tokens.weight"].double()
        bigram = (rmsnorm(emb[full[:-1]], w["model.norm.weight"].double())
                  @ w["lm_head.weight"].double().T).argmax(-1)
        bigram_hits += int((bigram == logits.argmax(-1)).sum())
        bigram_total += full.shape[0] - 1

        key = f"prompt{pi}."
        golden[key + "ids"] = ids
        golden[key + "logits"] = logits[:n].contiguous()
        golden[key + "greedy_ids"] = cont
        golden[key + "greedy_logits"] = logits[n - 1:].contiguous()
        golden[key + "hidden_states"] = bounds[:, :n].contiguous()
        log(f"{name} prompt {pi}: n={n} continuation {cont.tolist()} ({distinct} distinct), "
            f"min margin greedy {m_greedy:.4f}, spec diff {diff:.2e}")

    sink_mass = torch.stack(stats["sink_mass"]).mean().item()
    router_gap = torch.stack(stats["router_gap"]).min().item()
    gate_cl = torch.stack(stats["gate_clamped"]).mean().item()
    lin_cl = torch.stack(stats["lin_clamped"]).mean().item()
    log(f"{name}: max |transformers fp32 - facts fp64| = {worst_spec:.3e}; feature effects "
        + ", ".join(f"{k} {v:.3g}" for k, v in effects.items())
        + f"; sink mass {sink_mass:.3f}; min router gap {router_gap:.3g}; clamped gate "
        f"{gate_cl:.3f} lin {lin_cl:.3f}; min margin greedy {min_margin_greedy:.4f} prompt "
        f"{min_margin_prompt:.4f}; bigram agreement {bigram_hits / bigram_total:.2f}")
    # Each feature must move the logits far beyond any fp32 summation-order effect.
    for feat, eff in effects.items():
        assert eff > 1000 * max(worst_spec, 1e-6), f"{name}: the fixture barely uses {feat}"
    assert gate_cl > 0 and lin_cl > 0, "the SwiGLU clamp is never reached"
    assert min_margin_greedy > max(1e-3, 30 * worst_spec), f"{name}: near-tie in the greedy run"
    assert router_gap > 1e-4, f"{name}: near-tie between the 4th and 5th expert"

    meta = {
        "format": "draftscope golden v1",
        "model": name,
        "generator": "tests/ref/gptoss_ref.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "weight_seed": c["seed"],
        "prompt_seed": c["prompt_seed"],
        "num_prompts": len(prompts),
        "greedy_tokens": GREEDY_TOKENS,
        "min_top2_margin_greedy": f"{min_margin_greedy:.6g}",
        "min_top2_margin_prompt": f"{min_margin_prompt:.6g}",
        "min_router_gap_k_k1": f"{router_gap:.6g}",
        "max_abs_diff_transformers_fp32_vs_fp64": f"{worst_spec:.6g}",
        "sink_mass_mean": f"{sink_mass:.4g}",
        "gate_clamped_fraction": f"{gate_cl:.4g}",
        "lin_clamped_fraction": f"{lin_cl:.4g}",
        "yarn_low_high": f"{low:.9g},{high:.9g}",
        "transformers_mxfp4_dequant": hf_deq,
        "attention": "eager fp32",
    }
    for feat, eff in effects.items():
        meta[f"effect_without_{feat}"] = f"{eff:.4g}"
    ru.write_safetensors(os.path.join(outdir, f"{name}.golden.safetensors"), golden, meta)
    return model, w, prompts, golden


def generate(outdir, log):
    # One thread: tiny tensors gain nothing from more, and shared CPUs make them wait.
    torch.set_num_threads(1)
    check_spec_vector()
    os.makedirs(outdir, exist_ok=True)
    for name, c in CONFIGS.items():
        build(outdir, name, c, log)


def main():
    names = [x for name in CONFIGS for x in (name, f"{name}.golden.safetensors")]
    return ru.main(__doc__, generate, names,
                   "where checkpoints and goldens go (tests/fixtures/golden)")


if __name__ == "__main__":
    sys.exit(main())
