"""Plots of a run (matplotlib). Each function takes a Run, returns a Figure, and draws a "no data"
panel instead of failing when the rows it needs are absent (an untraced run has no kernels or
ranges; a run just started may have no finished request yet)."""
import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import metrics, schema  # noqa: E402

PHASE_COLORS = {"prefill": "#8c8c8c", "draft_extend": "#4c72b0", "draft_step": "#64b5cd",
                "verify": "#dd8452", "accept": "#55a868", "sample": "#c44e52"}


def _figure(title, size=(6.4, 4.0)):
    fig, ax = plt.subplots(figsize=size)
    ax.set_title(title, fontsize=11)
    return fig, ax


def _no_data(ax, why):
    ax.text(0.5, 0.5, f"no data\n({why})", ha="center", va="center", transform=ax.transAxes,
            fontsize=12, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])
    return ax.figure


def position_acceptance(run, n_boot=200, seed=0):
    """Per-position acceptance (joint and conditional, with 95% bootstrap intervals) against the
    sweep's batch size."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    fig.suptitle("Per-position acceptance against batch size", fontsize=11)
    if not len(run.steps):
        _no_data(axes[0], "no finished request")
        _no_data(axes[1], "no finished request")
        return fig
    pp = metrics.per_position(run, "batch", n_boot=n_boot, seed=seed)
    pp["B"] = pp["batch"].astype(int)
    for ax, what, title in ((axes[0], "joint", "joint P(accepted ≥ i) (vLLM)"),
                            (axes[1], "conditional", "conditional n-α (EAGLE)")):
        for i, g in pp.groupby("position"):
            g = g.sort_values("B")
            err = np.vstack([g[what] - g[f"{what}_lo"], g[f"{what}_hi"] - g[what]])
            ax.errorbar(g["B"], g[what], yerr=np.nan_to_num(np.abs(err)), marker="o", capsize=3,
                        label=f"position {i}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(pp["B"].unique()))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("batch size (concurrency B)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("acceptance")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def accepted_histogram(run):
    """Share of verify steps that accepted exactly j drafts, per batch size."""
    fig, ax = _figure("Accepted drafts per verify step")
    if not len(run.steps):
        return _no_data(ax, "no finished request")
    k = run.k
    groups = sorted(run.steps["sweep_batch"].dropna().astype(int).unique())
    width = 0.8 / max(len(groups), 1)
    for n, b in enumerate(groups):
        acc = run.steps.loc[run.steps["sweep_batch"] == b, "accepted"].to_numpy().astype(int)
        h = np.bincount(acc, minlength=k + 1)[: k + 1] / max(len(acc), 1)
        ax.bar(np.arange(k + 1) + (n - (len(groups) - 1) / 2) * width, h, width, label=f"B={b}")
    ax.set_xticks(range(k + 1))
    ax.set_xlabel("accepted drafts j")
    ax.set_ylabel("share of steps")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def channel_acceptance(run, n_boot=200, seed=0):
    """Acceptance of reached drafts (every earlier draft of the chain accepted) by harmony
    channel, with 95% bootstrap intervals, beside their mean expected acceptance Σ min(p, q).
    Both bars count the same drafts: over all drafts, the realized rate would count the drafts
    after a rejection as failures, while Σ min(p, q) is the acceptance probability of a reached
    draft, and the two would differ even for a perfectly calibrated rejection-sampling run."""
    fig, ax = _figure("Acceptance by harmony channel (reached drafts)")
    if not len(run.drafts):
        return _no_data(ax, "no drafts of a finished request")
    ci = metrics.metric_ci(run, "reached_rate", "channel", n_boot=n_boot, seed=seed)
    ci = ci[ci["n"] > 0]
    if not len(ci):
        return _no_data(ax, "no reached drafts")
    ex = metrics.metric_ci(run, "reached_expected", "channel", n_boot=0)
    x = np.arange(len(ci))
    err = np.vstack([ci["value"] - ci["lo"], ci["hi"] - ci["value"]])
    ax.bar(x - 0.2, ci["value"], 0.4, yerr=np.nan_to_num(np.abs(err)), capsize=3,
           label="realized (accepted/reached)")
    ax.bar(x + 0.2, ex["value"].reindex(ci.index), 0.4, label="expected Σ min(p, q)")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{c}\n(n={int(n)})" for c, n in zip(ci.index, ci["n"])])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("acceptance")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def context_acceptance(run, n_boot=200, seed=0, bins=metrics.DEFAULT_CONTEXT_BINS):
    """Mean acceptance length and draft acceptance rate against context length."""
    fig, ax = _figure("Acceptance against context length")
    if not len(run.steps):
        return _no_data(ax, "no finished request")
    tau = metrics.metric_ci(run, "mean_acceptance_length", "context", n_boot=n_boot, seed=seed,
                            context_bins=bins)
    x = np.arange(len(tau))
    err = np.vstack([tau["value"] - tau["lo"], tau["hi"] - tau["value"]])
    ax.errorbar(x, tau["value"], yerr=np.nan_to_num(np.abs(err)), marker="o", capsize=3,
                label="mean acceptance length τ")
    ax.set_xticks(x)
    ax.set_xticklabels(tau.index, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("τ (tokens per verify step)")
    ax.set_ylim(1, run.k + 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def expected_vs_realized(run, n_bins=10):
    """Calibration: drafts binned by expected acceptance Σ min(p, q); the share accepted among
    those evaluated (every earlier draft of the chain accepted), per position."""
    fig, ax = _figure("Expected against realized acceptance")
    if not len(run.drafts):
        return _no_data(ax, "no drafts of a finished request")
    d = metrics.reached_drafts(run)
    # A draft without a finite Σ min(p, q) (its q held NaN) has no bin: np.digitize would put it
    # in the last one and count its acceptance there.
    d = d[d["reached"] & np.isfinite(d["expected_accept"])]
    if not len(d):
        return _no_data(ax, "no evaluated drafts")
    edges = np.linspace(0, 1, n_bins + 1)
    for i, g in d.groupby("position"):
        b = np.clip(np.digitize(g["expected_accept"], edges) - 1, 0, n_bins - 1)
        t = pd.DataFrame({"b": b, "e": g["expected_accept"], "a": g["accepted"]}).groupby("b")
        m = t.mean()
        ax.plot(m["e"], m["a"], marker="o", label=f"position {i}")
    ax.plot([0, 1], [0, 1], color="#999999", lw=1, ls="--", label="expected = realized")
    ax.set_xlabel("expected acceptance Σ min(p, q) (binned)")
    # Text from the file, shown as it is: a '$' would start matplotlib's mathtext.
    rule = str(run.meta.get("rule", "?")).replace("$", r"\$")
    ax.set_ylabel(f"realized acceptance (rule: {rule})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _phase_times(run):
    """Mean time per step (ns) by (batch size of the step, phase): from kernels, else ranges."""
    # A step's batch size from its ranges, but not from a prefill range: that one counts the
    # sequences it admitted (the prefill runs under the id of the step that admits them), not
    # the sequences the step runs. Then the steps rows; a step with nothing but a prefill (the
    # last admission of a run) keeps the prefill's.
    sources = []
    r = run.ranges
    if len(r):
        sources.append(r[r["phase"] != "prefill"])
    sources += [run.steps, r]
    step_batch = None
    for t in sources:
        if not len(t):
            continue
        b = t.drop_duplicates("step").set_index("step")["batch_size"]
        step_batch = b if step_batch is None else step_batch.combine_first(b)
    for table, source in (("kernels", "kernel time"), ("ranges", "phase ranges")):
        t = getattr(run, table)
        if not len(t) or step_batch is None:
            continue
        t = t.assign(dur=(t["end_ns"].astype(np.int64) - t["start_ns"].astype(np.int64)),
                     B=t["step"].map(step_batch))
        t = t.dropna(subset=["B"])
        if not len(t):
            continue
        n_steps = t.groupby("B")["step"].nunique()
        per = t.groupby(["B", "phase"], observed=True)["dur"].sum().unstack(fill_value=0)
        return per.div(n_steps, axis=0), source
    return None, None


def kernel_time(run):
    """GPU time per step, by phase, against the batch size of the step."""
    fig, ax = _figure("Time per step by phase")
    per, source = _phase_times(run)
    if per is None:
        return _no_data(ax, "no kernels or ranges traced (--trace off)")
    x = np.arange(len(per))
    bottom = np.zeros(len(per))
    for phase in schema.ENUMS["phase"]:
        if phase not in per.columns:
            continue
        v = per[phase].to_numpy() / 1e6
        ax.bar(x, v, 0.6, bottom=bottom, label=phase, color=PHASE_COLORS.get(phase))
        bottom += v
    ax.set_xticks(x)
    ax.set_xticklabels([str(int(b)) for b in per.index])
    ax.set_xlabel("sequences in the step")
    ax.set_ylabel(f"ms per step ({source})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def predicted_speedup(run, baseline_ns=None):
    """Predicted speedup against batch size: τ × base step time ÷ (draft + verify time).

    baseline_ns: {batch size: plain decoding step time in ns}; by default the baseline the run
    measured (`draftscope run --baseline`, stored in options_json). Without one the verify time
    stands in for the base step (a memory-bound decode step reads the same weights as a K+1-token
    verify; an upper bound for MoE targets, whose verify touches more experts), and the plot says
    so."""
    if baseline_ns is None:
        baseline_ns = metrics.baseline(run)
    fig, ax = _figure("Predicted speedup against batch size")
    times = metrics.step_times(run, "batch")
    if not len(times) or not len(run.steps):
        return _no_data(ax, "no step timings (--trace off)")
    tau = metrics.metric_ci(run, "mean_acceptance_length", "batch", n_boot=0)
    rows = []
    for b in times.index:
        label = str(int(b))
        if label not in tau.index:
            continue
        spec = times.at[b, "draft_ns"] + times.at[b, "verify_ns"]
        base = (baseline_ns or {}).get(int(b), times.at[b, "verify_ns"])
        if spec > 0:
            rows.append((int(b), tau.at[label, "value"] * base / spec))
    if not rows:
        return _no_data(ax, "no step timings (--trace off)")
    bs, sp = zip(*rows)
    ax.plot(bs, sp, marker="o")
    ax.axhline(1.0, color="#999999", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs)
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch size (concurrency B)")
    ax.set_ylabel("predicted speedup")
    missing = [b for b in bs if b not in (baseline_ns or {})]
    if missing:
        what = "no baseline run" if len(missing) == len(bs) else \
            "no baseline at B " + ", ".join(str(b) for b in missing)
        ax.text(0.02, 0.02, f"base step ≈ verify time ({what})", transform=ax.transAxes,
                fontsize=8, color="#666666")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


ALL = [
    ("Per-position acceptance against batch size", position_acceptance),
    ("Accepted-count histogram", accepted_histogram),
    ("Acceptance by harmony channel", channel_acceptance),
    ("Acceptance against context length", context_acceptance),
    ("Expected against realized acceptance", expected_vs_realized),
    ("Time per step by phase and batch size", kernel_time),
    ("Predicted speedup against batch size", predicted_speedup),
]
