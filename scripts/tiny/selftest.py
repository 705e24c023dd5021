#!/usr/bin/env python3
"""Quick checks of the pipeline's own pieces (CPU, a few seconds); make_tiny.py runs them first.

    python3 scripts/tiny/selftest.py

1. MXFP4: hand-computed codes for one block (expected values written below), nibble order, the
   scale rule (the block max fits, one exponent less would not), and that quantizing the
   dequantized values again gives the same values.
2. The draft: the test-time-training unroll computes, for every base index and step, the same
   logits as the inference chain of check_acceptance.py run with the same tokens. This is what
   makes the training objective the quantity the acceptance check measures.
3. The draft vocabulary map: a hand-made count table gives the d2t/t2d written below.
"""

import os
import sys

try:
    import torch
except ImportError:
    print("skipped: selftest needs torch")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinymodel as tm  # noqa: E402


def check_mxfp4():
    # One row, one block: max |x| = 3.0 -> exponent ceil(log2(3/6)) = -1 (3 / 2^-1 = 6 fits,
    # 3 / 2^-2 = 12 would not) -> scale byte 126. Scaled values x / 0.5:
    #   0.25 -> 0.5 (code 1), -0.75 -> -1.5 (code 11), 3.0 -> 6 (code 7), 1.1 -> 2.2 ~ 2 (code 4),
    #   0.0 -> 0 (code 0), -3.0 -> -6 (code 15), 0.6 -> 1.2 ~ 1 (code 2), 2.6 -> 5.2 ~ 6 (code 7)
    # and zeros for the rest. Bytes pair (even, odd) elements: low nibble = even element.
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :8] = torch.tensor([0.25, -0.75, 3.0, 1.1, 0.0, -3.0, 0.6, 2.6], dtype=torch.float64)
    b, s = tm.mxfp4_quantize(x)
    assert s.tolist() == [[126]], s
    want = [1 | (11 << 4), 7 | (4 << 4), 0 | (15 << 4), 2 | (7 << 4)] + [0] * 12
    assert b[0, 0].tolist() == want, b[0, 0].tolist()
    deq = tm.mxfp4_dequant(b, s)
    assert deq[0, :8].tolist() == [0.25, -0.75, 3.0, 1.0, 0.0, -3.0, 0.5, 3.0], deq[0, :8]
    # Random data: every block max fits within 6 * 2^e; requantizing is exact.
    g = torch.Generator().manual_seed(5)
    w = torch.randn(4, 6, 64, generator=g) * torch.logspace(-3, 1, 6)[None, :, None]
    b, s = tm.mxfp4_quantize(w)
    deq = tm.mxfp4_dequant(b, s)
    scale = torch.pow(2.0, s.to(torch.float32) - 127)
    amax = w.reshape(4, 6, 2, 32).abs().amax(-1)
    assert (amax <= 6 * scale + 1e-12).all() and (amax > 3 * scale).all()
    # Requantizing gives the same values (the bytes may differ: a block whose max rounded down
    # can take a smaller exponent).
    assert torch.equal(tm.mxfp4_dequant(*tm.mxfp4_quantize(deq)), deq)
    err = ((deq - w).abs() / scale.repeat_interleave(32, -1)).max().item()
    assert err <= 1.0 + 1e-6, err  # at most half of the widest E2M1 step (2) times the scale


def check_ttt_equals_chain():
    torch.manual_seed(0)
    d = dict(hidden=32, inter=48, heads=4, head_dim=8, kv_heads=2, draft_vocab=24)
    V, Ht, T, steps = 40, 16, 9, 3
    embed = torch.randn(V, 32)
    draft = tm.Eagle3Draft(d, Ht, V, embed).double()
    used = torch.tensor(sorted(torch.randperm(V)[:24].tolist()))
    draft.d2t.copy_(used - torch.arange(24))
    draft.t2d[used] = True
    aux = torch.randn(1, T, 3 * Ht, dtype=torch.float64)
    tokens = torch.randint(0, V, (1, T + steps + 1))
    outs = tm.ttt_forward(draft, aux, tokens, steps)
    worst = 0.0
    for t in range(T):
        # Committed positions 0..t; chain tokens forced to the training inputs.
        forced = [tokens[0, t + 1 + j].item() for j in range(1, steps)]
        _, logits = tm.draft_chain(draft, aux[0, :t + 1], tokens[0, 1:t + 2].tolist(), steps,
                                   forced=forced)
        for k in range(steps):
            worst = max(worst, (logits[k] - outs[k][0, t]).abs().max().item())
    assert worst < 1e-9, worst  # fp64: only summation order differs


def check_vocab_map():
    counts = {7: 5, 2: 5, 9: 1, 4: 3, 0: 0}
    d2t, t2d = tm.vocab_map(counts, 12, 3)  # top 3: 2 and 7 (5 each), 4 (3) -> used 2, 4, 7
    assert d2t.tolist() == [2, 3, 5], d2t
    assert t2d.nonzero().flatten().tolist() == [2, 4, 7]
    d2t, t2d = tm.vocab_map({5: 1}, 8, 3)  # one seen id, then the smallest unseen: 0, 1
    assert d2t.tolist() == [0, 0, 3], d2t


def main():
    check_mxfp4()
    check_ttt_equals_chain()
    check_vocab_map()
    print("selftest: MXFP4, TTT == chain, vocab map: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
