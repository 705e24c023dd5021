"""The tiny target (transformers' GptOssForCausalLM), MXFP4 export, the EAGLE-3 draft, and
checkpoint reading/writing in the Hugging Face / SpecForge layouts.

Layouts follow the project's model facts: gpt-oss HF names, experts as MXFP4 `_blocks` [E, out,
in/32, 16] and `_scales` [E, out, in/32] (low nibble = even element, E8M0 bias 127), gate/up rows
interleaved (even = gate); everything else BF16. The draft is SpecForge's LlamaForCausalLMEagle3:
`fc`, `midlayer.*`, `norm`, `lm_head` over the draft vocabulary, `d2t` (I64) and `t2d` (BOOL), no
embedding (the target's table is used, as SpecForge exports drop it).
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

# E2M1 code -> value (bit 3 = sign; code 1 is the subnormal 0.5).
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# ---------------------------------------------------------------------------------------------
# Configs


def target_config(dims, tok_ids):
    """config.json of the tiny target, in the field set of gpt-oss-20b's."""
    L = dims["layers"]
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": tok_ids["<|return|>"],
        "experts_per_token": dims["top_k"],
        "head_dim": dims["head_dim"],
        "hidden_act": "silu",
        "hidden_size": dims["hidden"],
        "initial_context_length": dims["rope_original"],
        "initializer_range": 0.02,
        "intermediate_size": dims["inter"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(L)],
        "max_position_embeddings": dims["rope_original"] * dims["rope_factor"],
        "model_type": "gpt_oss",
        "num_attention_heads": dims["heads"],
        "num_experts_per_tok": dims["top_k"],
        "num_hidden_layers": L,
        "num_key_value_heads": dims["kv_heads"],
        "num_local_experts": dims["experts"],
        "output_router_logits": False,
        "pad_token_id": tok_ids["<|endoftext|>"],
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": float(dims["rope_factor"]),
            "original_max_position_embeddings": dims["rope_original"],
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": dims["router_aux_coef"],
        "sliding_window": dims["window"],
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "transformers_version": "4.55.0.dev0",
        "use_cache": True,
        "vocab_size": dims["vocab"],
    }


def draft_config(d, target_cfg):
    """config.json of the draft, in the field set of SpecForge's gpt-oss EAGLE-3 configs."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(d["aux_ids"])},
        "head_dim": d["head_dim"],
        "hidden_act": "silu",
        "hidden_size": d["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": d["inter"],
        "max_position_embeddings": d["max_pos"],
        "model_type": "llama",
        "num_attention_heads": d["heads"],
        "num_hidden_layers": 1,
        "num_key_value_heads": d["kv_heads"],
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0",
        "use_cache": True,
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": d["draft_vocab"],
    }


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Target


def build_target(cfg_dict):
    """GptOssForCausalLM from our config dict, fp32, eager attention (the sink-aware path) and
    eager experts."""
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(**{k: v for k, v in cfg_dict.items()
                          if k not in ("architectures", "transformers_version",
                                       "quantization_config", "model_type")})
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        # The per-expert loop: plain matmuls in any dtype (grouped_mm kernels want bf16 weights).
        cfg._experts_implementation = "eager"
    model = GptOssForCausalLM(cfg).to(torch.float32)
    assert model.config._attn_implementation == "eager"
    assert getattr(model.config, "_experts_implementation", "eager") in (None, "eager")
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model


def mxfp4_quantize(w):
    """w [..., K] float (K % 32 == 0) -> (blocks [..., K/32, 16] u8, scales [..., K/32] u8).

    Per block of 32 along the last dim the E8M0 exponent is the smallest one with
    max|x| / 2^e <= 6 (the largest E2M1 magnitude), then every element rounds to the nearest
    E2M1 value (ties to the smaller magnitude)."""
    *lead, K = w.shape
    x = w.detach().to(torch.float64).reshape(*lead, K // 32, 32)
    amax = x.abs().amax(dim=-1)
    e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / 6.0))
    e = torch.where(amax > 0, e, torch.full_like(e, -127.0)).clamp(-127, 127)
    scaled = x / torch.pow(2.0, e)[..., None]
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float64, device=w.device)
    idx = (scaled.abs()[..., None] - mags).abs().argmin(dim=-1)  # first = smaller magnitude
    codes = idx + torch.where((scaled < 0) & (idx > 0), 8, 0)
    codes = codes.to(torch.uint8).reshape(*lead, K // 32, 16, 2)
    blocks = codes[..., 0] | (codes[..., 1] << 4)  # even element in the low nibble
    scales = (e + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def mxfp4_dequant(blocks, scales):
    """blocks [..., G, 16] u8, scales [..., G] u8 -> [..., G*32] float32 (exact)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    lo = (blocks & 0x0F).long()
    hi = (blocks >> 4).long()
    vals = lut[torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)]
    out = torch.ldexp(vals, (scales.to(torch.int32) - 127).unsqueeze(-1).to(torch.float32))
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 32)


def quantize_experts_(model):
    """Replaces every expert weight by its MXFP4 round trip and freezes it. Returns the
    mean relative error (|w - q| / |w|) over all expert weights."""
    num = den = 0.0
    for layer in model.model.layers:
        ex = layer.mlp.experts
        for name in ("gate_up_proj", "down_proj"):
            p = getattr(ex, name)  # transformers layout [E, in, out]
            logical = p.data.transpose(1, 2)  # [E, out, in]
            b, s = mxfp4_quantize(logical)
            q = mxfp4_dequant(b, s).to(p.dtype).transpose(1, 2)
            num += (q - p.data).abs().sum().item()
            den += p.data.abs().sum().item()
            p.data.copy_(q)
            p.requires_grad_(False)
    return num / den


def target_state(model):
    """name -> tensor in the HF gpt-oss layout: BF16, experts as MXFP4 blocks/scales."""
    out = {}
    for name, t in model.state_dict().items():
        if "rotary_emb" in name:
            continue
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            b, s = mxfp4_quantize(t.transpose(1, 2))
            # The weights were frozen at their MXFP4 values, so re-quantizing should be exact. If
            # anything moved them (it happened once on the GPU machine), the export is still the
            # MXFP4 model that everything downstream reads back from the files; say by how much.
            diff = (mxfp4_dequant(b, s) - t.transpose(1, 2).float()).abs()
            if diff.max().item() != 0.0:
                print(f"warning: {name}: re-quantized experts differ from the frozen values "
                      f"(max {diff.max().item():.3g}, {int((diff > 0).sum())} of {diff.numel()})",
                      flush=True)
            out[name + "_blocks"] = b.cpu()
            out[name + "_scales"] = s.cpu()
        else:
            out[name] = t.detach().to(torch.bfloat16).cpu().contiguous()
    return out


def save_safetensors(path, tensors):
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, path,
              metadata={"format": "pt"})


def read_safetensors(path):
    out = {}
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out


def load_target(ckdir, device="cpu"):
    """Reads a target checkpoint from its files (config.json + model.safetensors, or shards with
    the index): BF16 tensors upcast to fp32, experts dequantized by the MXFP4 rule and transposed
    into transformers' [E, in, out] parameters. Returns (model in eval mode, config dict)."""
    with open(os.path.join(ckdir, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(ckdir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(ckdir, fn)))
    model = build_target(cfg)
    sd = {}
    for name, t in w.items():
        if name.endswith("_blocks"):
            base = name[:-len("_blocks")]
            deq = mxfp4_dequant(t, w[base + "_scales"])
            sd[base] = deq.transpose(1, 2).contiguous()
        elif not name.endswith("_scales"):
            sd[name] = t.to(torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if "rotary" not in m], missing
    return model.to(device).eval(), cfg


class AuxCapture:
    """Forward hooks that keep the OUTPUT of the given decoder layers (output-of ids)."""

    def __init__(self, model, layer_ids):
        self.out = {}
        self.hooks = []
        for i in layer_ids:
            self.hooks.append(model.model.layers[i].register_forward_hook(self._hook(i)))

    def _hook(self, i):
        def fn(module, args, output):
            self.out[i] = output[0] if isinstance(output, tuple) else output
        return fn

    def take(self, layer_ids):
        a = torch.cat([self.out[i] for i in layer_ids], dim=-1)  # [low | mid | high]
        self.out = {}
        return a

    def remove(self):
        for h in self.hooks:
            h.remove()


# ---------------------------------------------------------------------------------------------
# Draft (EAGLE-3, eagle3 facts §4)


def wide(dtype):
    """The dtype norms and softmax run in: fp32, or fp64 for fp64 inputs (the self-test)."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.to(wide(x.dtype))
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(xf.dtype) * y


def rope_rotate(x, pos, theta):
    """x [..., n, heads, d], pos [..., n]: rotate-half RoPE (pairs i, i + d/2), no scaling."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [..., n, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :].to(x.dtype)
    half = d // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class Eagle3Draft(nn.Module):
    """One Llama-style layer on [norm(embed) | norm(hidden)]; names as SpecForge's."""

    def __init__(self, d, target_hidden, vocab, embed):
        super().__init__()
        H, nh, nkv, hd = d["hidden"], d["heads"], d["kv_heads"], d["head_dim"]
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, d.get("rope_theta", 10000.0)
        self.fc = nn.Linear(3 * target_hidden, H, bias=False)
        mid = nn.Module()
        mid.input_layernorm = RMSNorm(H)
        mid.hidden_norm = RMSNorm(H)
        mid.post_attention_layernorm = RMSNorm(H)
        attn = nn.Module()
        attn.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        attn.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        attn.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        attn.o_proj = nn.Linear(nh * hd, H, bias=False)
        mid.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(H, d["inter"], bias=False)
        mlp.up_proj = nn.Linear(H, d["inter"], bias=False)
        mlp.down_proj = nn.Linear(d["inter"], H, bias=False)
        mid.mlp = mlp
        self.midlayer = mid
        self.norm = RMSNorm(H)
        self.lm_head = nn.Linear(H, d["draft_vocab"], bias=False)
        self.register_buffer("d2t", torch.zeros(d["draft_vocab"], dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool))
        # The target's embedding table: frozen, not part of the checkpoint.
        self.register_buffer("embed", embed.detach().clone(), persistent=False)

    def qkv(self, tokens, g, pos):
        """tokens [B, n], g [B, n, H] (the hidden input), pos [B, n] -> q, k, v [B, n, h, d]."""
        m = self.midlayer
        e = self.embed[tokens].to(g.dtype)
        u = torch.cat([m.input_layernorm(e), m.hidden_norm(g)], dim=-1).to(g.dtype)
        B, n = tokens.shape
        q = m.self_attn.q_proj(u).view(B, n, self.nh, self.hd)
        k = m.self_attn.k_proj(u).view(B, n, self.nkv, self.hd)
        v = m.self_attn.v_proj(u).view(B, n, self.nkv, self.hd)
        return rope_rotate(q, pos, self.theta), rope_rotate(k, pos, self.theta), v

    def attend(self, q, K, V, allowed):
        """q [B, n, h, d]; K, V [B, m, kvh, d]; allowed [B or 1, n, m] bool -> [B, n, h*d]."""
        rep = self.nh // self.nkv
        Kx = K.repeat_interleave(rep, dim=2)  # query head h uses KV head h // rep
        Vx = V.repeat_interleave(rep, dim=2)
        w = wide(q.dtype)
        s = torch.einsum("bnhd,bmhd->bhnm", q.to(w), Kx.to(w)) / math.sqrt(self.hd)
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("bhnm,bmhd->bnhd", p, Vx.to(w))
        return o.reshape(*q.shape[:2], -1).to(q.dtype)

    def post(self, o, g):
        """Residual from the raw hidden input g; returns the pre-norm output h2."""
        m = self.midlayer
        h1 = m.self_attn.o_proj(o) + g
        z = m.post_attention_layernorm(h1).to(h1.dtype)
        mlp = m.mlp
        return h1 + mlp.down_proj(F.silu(mlp.gate_proj(z)) * mlp.up_proj(z))

    def logits(self, h2):
        return self.lm_head(self.norm(h2).to(h2.dtype))

    def draft_to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]


def ttt_forward(draft, aux, tokens, steps):
    """EAGLE-3 test-time training unroll (eagle3 facts §9).

    aux [B, T, 3Ht]: the target's aux states at every position; tokens [B, T + steps]: the
    sequence padded on the right. Step k at base index t has input token tokens[t + k + 1],
    hidden fc(aux[t]) for k = 0 and the step k-1 output at t otherwise, RoPE position t + k;
    it attends to the step-0 keys at indices <= t and to the keys of steps 1..k at index t.
    Returns the list of draft logits [B, T, Dv], one per step."""
    B, T, _ = aux.shape
    dev = aux.device
    g = draft.fc(aux)
    base = torch.arange(T, device=dev)
    causal = base[None, :] <= base[:, None]  # [T, T]
    eye = torch.eye(T, dtype=torch.bool, device=dev)
    Ks, Vs, out = [], [], []
    for k in range(steps):
        tok = tokens[:, k + 1:k + 1 + T]
        pos = (base + k)[None].expand(B, T)
        q, kk, vv = draft.qkv(tok, g, pos)
        Ks.append(kk)
        Vs.append(vv)
        allowed = torch.cat([causal] + [eye] * k, dim=1)[None]  # [1, T, (k+1)T]
        o = draft.attend(q, torch.cat(Ks, 1), torch.cat(Vs, 1), allowed)
        h2 = draft.post(o, g)
        out.append(draft.logits(h2))
        g = h2
    return out


def draft_chain(draft, aux, tokens, K, forced=None):
    """One drafting round (eagle3 facts §11 steps 1-2) computed from scratch.

    aux [C, 3Ht]: target aux states of the committed positions 0..C-1; tokens: the C tokens at
    positions 1..C (the last one is the bonus token b). Extend rows t = 0..C-1 (hidden fc(aux_t),
    token tokens[t], RoPE position t, causal) give d1 from the last row; then K - 1 rows at
    positions C, C+1, ... take the previous row's pre-norm output as hidden and the previous
    drafted token (or forced[j], to compare with training) and attend to every extend row and
    every earlier chain row. Returns (drafted target ids, logits of each drafted position)."""
    dev = draft.d2t.device
    C = len(tokens)
    g = draft.fc(aux[None])
    pos = torch.arange(C, device=dev)[None]
    q, Ks, Vs = draft.qkv(torch.tensor([list(tokens)], device=dev), g, pos)
    allowed = (pos[0][None, :] <= pos[0][:, None])[None]
    h = draft.post(draft.attend(q, Ks, Vs, allowed), g)[:, -1:]
    logits = [draft.logits(h)[0, 0].to(wide(h.dtype))]
    out = [draft.draft_to_target(logits[-1].argmax()).item()]
    for j in range(1, K):
        tok = out[-1] if forced is None else forced[j - 1]
        q, k, v = draft.qkv(torch.tensor([[tok]], device=dev), h,
                            torch.tensor([[C + j - 1]], device=dev))
        Ks, Vs = torch.cat([Ks, k], 1), torch.cat([Vs, v], 1)
        ones = torch.ones((1, 1, Ks.shape[1]), dtype=torch.bool, device=dev)
        h = draft.post(draft.attend(q, Ks, Vs, ones), h)
        logits.append(draft.logits(h)[0, 0].to(wide(h.dtype)))
        out.append(draft.draft_to_target(logits[-1].argmax()).item())
    return out, logits


def vocab_map(counts, vocab, draft_vocab):
    """SpecForge's construction (eagle3 facts §5): the draft_vocab most frequent ids (ties to
    the smaller id; unseen ids 0, 1, 2, ... fill up), sorted ascending; d2t[i] = used[i] - i,
    t2d[v] = v in used."""
    ranked = sorted((v for v in counts if counts[v] > 0), key=lambda v: (-counts[v], v))
    used = ranked[:draft_vocab]
    have = set(used)
    fill = (v for v in range(vocab) if v not in have)
    while len(used) < draft_vocab:
        used.append(next(fill))
    used = sorted(used)
    d2t = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.tensor(used)] = True
    assert torch.equal(t2d.nonzero().flatten(), d2t + torch.arange(draft_vocab))
    return d2t, t2d


def draft_state(draft):
    out = {}
    for name, t in draft.state_dict().items():
        if name in ("d2t", "t2d"):
            out[name] = t.cpu().contiguous()
        else:
            out[name] = t.detach().to(torch.bfloat16).cpu().contiguous()
    return out


def load_draft(ddir, embed, device="cpu"):
    """Reads a SpecForge-layout draft (config.json + model.safetensors); embed = the target's
    embedding table. Returns (draft in fp32 eval mode, config dict, boundary layer ids)."""
    with open(os.path.join(ddir, "config.json")) as f:
        cfg = json.load(f)
    w = read_safetensors(os.path.join(ddir, "model.safetensors"))
    d = {"hidden": cfg["hidden_size"], "heads": cfg["num_attention_heads"],
         "kv_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
         "inter": cfg["intermediate_size"], "draft_vocab": cfg["draft_vocab_size"],
         "rope_theta": cfg.get("rope_theta", 10000.0)}
    target_hidden = w["fc.weight"].shape[1] // 3
    draft = Eagle3Draft(d, target_hidden, cfg["vocab_size"], embed.float())
    sd = {k: (v if k in ("d2t", "t2d") else v.to(torch.float32)) for k, v in w.items()}
    draft.load_state_dict(sd, strict=True)
    aux_ids = list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    return draft.to(device).eval(), cfg, aux_ids
