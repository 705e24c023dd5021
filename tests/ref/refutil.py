"""Shared helpers for the reference scripts (gptoss_ref.py, eagle3_ref.py).

Everything here is written from the project's model facts (gpt-oss MXFP4 layout, bf16 storage,
safetensors) and deliberately avoids the model libraries, so that the numbers the C engine is
tested against do not depend on one library's own conversion code.
"""

import argparse
import json
import math
import os
import random
import shutil
import tempfile

import torch
from safetensors import safe_open

# E2M1 code -> value; bit 3 is the sign, code 1 is the subnormal 0.5.
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class Rng:
    """Seeded generator whose stream does not depend on the torch version.

    torch's own generators are not promised to give the same numbers across releases; the
    weights are committed, but --check regenerates them, so they must come out identical.
    """

    def __init__(self, seed):
        self.r = random.Random(seed)

    def normal(self, shape, std=1.0, mean=0.0):
        n = math.prod(shape)
        vals = [self.r.gauss(mean, std) for _ in range(n)]
        return torch.tensor(vals, dtype=torch.float64).reshape(shape)

    def uniform(self, shape, lo, hi):
        n = math.prod(shape)
        vals = [self.r.uniform(lo, hi) for _ in range(n)]
        return torch.tensor(vals, dtype=torch.float64).reshape(shape)

    def integers(self, shape, lo, hi):
        """Integers in [lo, hi] inclusive."""
        n = math.prod(shape)
        vals = [self.r.randint(lo, hi) for _ in range(n)]
        return torch.tensor(vals, dtype=torch.int64).reshape(shape)

    def choice(self, seq):
        return self.r.choice(seq)


def to_bf16(t):
    """Round to bf16 (round to nearest even, through fp32) without relying on torch's cast."""
    f = t.to(torch.float32).contiguous()
    bits = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounding = ((bits >> 16) & 1) + 0x7FFF
    hi = ((bits + rounding) >> 16) & 0xFFFF
    # Finite weights only: NaN/Inf never occur in generated data.
    assert torch.isfinite(f).all()
    hi = torch.where(hi >= 0x8000, hi - 0x10000, hi).to(torch.int16)
    out = hi.view(torch.bfloat16)
    # Cross-check against torch's own cast (both must be round-to-nearest-even).
    assert torch.equal(out.view(torch.int16), f.to(torch.bfloat16).view(torch.int16))
    return out


def mxfp4_dequant(blocks, scales):
    """MXFP4 -> fp32, per the HF layout.

    blocks [..., G, 16] uint8, scales [..., G] uint8 -> [..., G*32] float32 where logical element
    k of a row lives in byte (k%32)//2 of group k//32: the low nibble holds even k, the high
    nibble odd k. Value = FP4_VALUES[code] * 2^(scale - 127), exact in fp32.
    """
    assert blocks.dtype == torch.uint8 and scales.dtype == torch.uint8
    assert blocks.shape[:-1] == scales.shape and blocks.shape[-1] == 16
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    lo = (blocks & 0x0F).to(torch.int64)
    hi = (blocks >> 4).to(torch.int64)
    codes = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = lut[codes]
    exp = scales.to(torch.int32) - 127
    out = torch.ldexp(vals, exp.unsqueeze(-1).to(torch.float32))
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 32)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
             torch.uint8: "U8", torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL"}


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> torch tensor; metadata: name -> str (goes to __metadata__).

    Written here rather than by the safetensors package so the bytes are reproducible (sorted
    header keys, data in name order); read_safetensors (the package) reads every file back."""
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = bytes(t.view(torch.uint8).flatten().tolist()) if t.numel() else b""
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in sorted(metadata.items())}
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in chunks:
            f.write(raw)
    back, meta = read_safetensors(path)
    assert set(back) == set(tensors) and meta == (header.get("__metadata__") or {})
    for name, t in tensors.items():
        assert torch.equal(back[name], t), f"{path}: {name} did not read back"


def read_safetensors(path):
    out = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out, meta


def tensor_bytes(t):
    return t.numel() * t.element_size()


def write_sharded(dirpath, tensors, groups, num_files):
    """Writes HF-style shards with the zero-based naming quirk of the gpt-oss converter:
    `num_files` files named model-00000-of-{num_files-1:05d} ... plus the index json.
    groups: list (one per file) of tensor-name lists."""
    assert len(groups) == num_files
    last = num_files - 1
    weight_map = {}
    total = 0
    for i, names in enumerate(groups):
        fname = f"model-{i:05d}-of-{last:05d}.safetensors"
        part = {n: tensors[n] for n in names}
        write_safetensors(os.path.join(dirpath, fname), part, {"format": "pt"})
        for n in names:
            weight_map[n] = fname
            total += tensor_bytes(tensors[n])
    assert set(weight_map) == set(tensors), "every tensor must land in exactly one shard"
    index = {"metadata": {"total_size": total},
             "weight_map": dict(sorted(weight_map.items()))}
    write_json(os.path.join(dirpath, "model.safetensors.index.json"), index)


def read_checkpoint(dirpath):
    """Reads a single-file or sharded checkpoint (through the index's weight_map)."""
    idx = os.path.join(dirpath, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for fname in sorted(set(wm.values())):
            part, _ = read_safetensors(os.path.join(dirpath, fname))
            for k, v in part.items():
                assert wm[k] == fname, f"{k} is in {fname}, index says {wm[k]}"
                out[k] = v
        assert set(out) == set(wm)
        return out
    out, _ = read_safetensors(os.path.join(dirpath, "model.safetensors"))
    return out


def top2_margin(logits):
    """Per row: top-1 minus top-2 logit."""
    v = torch.topk(logits.to(torch.float64), 2, dim=-1).values
    return v[..., 0] - v[..., 1]


# Largest float difference seen by the last --check (reported, to size tolerances).
CHECK_STATS = {"max_float_diff": 0.0}


def compare_paths(fresh_root, committed_root, subs, float_tol):
    """--check over the named files/directories (relative to both roots)."""
    problems = []
    for sub in subs:
        fresh, committed = os.path.join(fresh_root, sub), os.path.join(committed_root, sub)
        if not os.path.exists(committed):
            problems.append(f"{sub}: not in {committed_root}")
        elif os.path.isdir(committed):
            problems += [f"{sub}/{p}" for p in compare_dirs(fresh, committed, float_tol)]
        elif not os.path.exists(fresh):
            problems.append(f"{sub}: missing from the fresh run")
        else:
            problems += _compare_st(sub, fresh, committed, float_tol)
    return problems


def compare_dirs(fresh, committed, float_tol):
    """--check: compares every file of `committed` with the fresh run.

    Checkpoint tensors must be bit-identical (they come from a version-independent generator);
    golden float tensors agree within float_tol (different torch builds sum in different orders);
    integer tensors (token ids, counts) must be equal. Returns a list of problems."""
    problems = []
    for root, _, files in os.walk(committed):
        for name in sorted(files):
            c_path = os.path.join(root, name)
            rel = os.path.relpath(c_path, committed)
            f_path = os.path.join(fresh, rel)
            if not os.path.exists(f_path):
                problems.append(f"{rel}: missing from the fresh run")
                continue
            if name.endswith(".json"):
                with open(c_path) as a, open(f_path) as b:
                    if json.load(a) != json.load(b):
                        problems.append(f"{rel}: json differs")
            elif name.endswith(".safetensors"):
                problems += _compare_st(rel, f_path, c_path, float_tol)
    return problems


def _compare_st(rel, f_path, c_path, float_tol):
    problems = []
    a, _ = read_safetensors(f_path)
    b, _ = read_safetensors(c_path)
    if set(a) != set(b):
        return [f"{rel}: tensor names differ: {sorted(set(a) ^ set(b))[:5]}"]
    golden = rel.endswith(".golden.safetensors")
    for k in sorted(a):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{rel}:{k}: dtype/shape {x.dtype}{tuple(x.shape)} vs "
                            f"{y.dtype}{tuple(y.shape)}")
        elif golden and x.is_floating_point():
            d = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
            CHECK_STATS["max_float_diff"] = max(CHECK_STATS["max_float_diff"], d)
            if not d <= float_tol:
                problems.append(f"{rel}:{k}: max abs diff {d:.3g} > {float_tol}")
        elif not torch.equal(x, y):
            problems.append(f"{rel}:{k}: values differ")
    return problems


def main(doc, generate, names, outdir_help, prepare=None):
    """Command line shared by the reference scripts: OUTDIR [--check] [--skip-without-torch].

    generate(outdir, log) writes `names` (directories and/or .golden.safetensors files) into
    outdir; --check does that in a temporary directory (after prepare(tmp, outdir), which copies
    inputs the generator needs) and compares with the committed files."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("outdir", help=outdir_help)
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare with OUTDIR")
    ap.add_argument("--skip-without-torch", action="store_true",
                    help="exit 77 (skipped) when torch/transformers are not installed")
    args = ap.parse_args()
    if not args.check:
        generate(args.outdir, print)
        return 0
    tmp = tempfile.mkdtemp(prefix="ds-ref-")
    try:
        if prepare:
            prepare(tmp, args.outdir)
        generate(tmp, lambda s: None)
        # fp32 runs on different torch builds differ by summation order only.
        problems = compare_paths(tmp, args.outdir, names, 1e-4)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print("MISMATCH", p)
    print(f"check: {'OK' if not problems else f'{len(problems)} problem(s)'} (largest golden "
          f"float difference {CHECK_STATS['max_float_diff']:.3g}, tolerance 1e-4)")
    return 1 if problems else 0
