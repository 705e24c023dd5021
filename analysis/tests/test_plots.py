"""Every plot draws on a full run, and draws "no data" instead of failing on a run without the
rows it needs (an untraced run: no kernels, ranges or timings; a crashed run: no finished
request)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import draftscope  # noqa: E402
from draftscope import metrics, plots, schema  # noqa: E402


def _texts(fig):
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def _drawn(fig):
    """Something was plotted: lines, bars or error bars on some axes."""
    return any(ax.lines or ax.patches or ax.collections for ax in fig.axes)


@pytest.mark.parametrize("title,fn", plots.ALL)
def test_plots_on_a_traced_run(samples, title, fn):
    with draftscope.open(samples["sample"]) as run:
        fig = fn(run)
    assert _drawn(fig), title
    assert "no data" not in _texts(fig), title
    plt.close(fig)


@pytest.mark.parametrize("title,fn", plots.ALL)
def test_plots_without_data(samples, title, fn):
    with draftscope.open(samples["killed"]) as run:  # every row dropped: nothing finished
        fig = fn(run)
    assert "no data" in _texts(fig), title
    plt.close(fig)


def test_untraced_run_has_no_timing_plots(samples):
    with draftscope.open(samples["untraced"]) as run:
        assert len(run.kernels) == 0 and len(run.ranges) == 0
        for fn in (plots.kernel_time, plots.predicted_speedup):
            fig = fn(run)
            assert "no data" in _texts(fig)
            plt.close(fig)
        fig = plots.position_acceptance(run, n_boot=20)
        assert _drawn(fig)
        plt.close(fig)


def test_kernel_time_per_phase(samples):
    """The sample's kernels: one per phase range, 1 µs shorter at each end; per step the verify
    kernel takes verify_ns - 2 µs, so the bars show verify time growing with the batch."""
    with draftscope.open(samples["sample"]) as run:
        per, source = plots._phase_times(run)
        assert source == "kernel time"
        s = run.steps.drop_duplicates("step").set_index("step")
        want = (s["verify_ns"] - 2000).groupby(s["batch_size"]).mean()
        assert per["verify"].to_numpy() == pytest.approx(want.to_numpy(), rel=1e-12)
        assert per["verify"].is_monotonic_increasing


def test_phase_times_batch_is_not_the_prefills():
    """A step that admits a request runs its prefill first, under the step's id, and that range's
    batch_size counts the sequences admitted (1), not the step's (4): the step belongs to B 4."""
    def phases(names):
        return pd.Categorical(names, categories=schema.ENUMS["phase"])

    class FakeRun:
        ranges = pd.DataFrame({
            "step": [0, 0, 0, 1, 1, 2], "start_ns": [0, 10, 20, 40, 50, 70],
            "end_ns": [10, 20, 30, 50, 60, 75], "batch_size": [1, 4, 4, 4, 4, 2],
            "phase": phases(["prefill", "draft_extend", "verify", "draft_extend", "verify",
                             "prefill"])})
        kernels = ranges.iloc[:0]
        steps = pd.DataFrame({"step": [0, 0, 0, 0, 1, 1, 1, 1], "batch_size": [4] * 8})
    per, source = plots._phase_times(FakeRun())
    assert source == "phase ranges"
    # B 4: steps 0 and 1, 10 ns of draft_extend and of verify each, step 0's 10 ns prefill; B 2:
    # step 2, a prefill alone (the last admission), keeps its own batch size.
    assert list(per.index) == [2, 4]
    assert per.loc[4, "prefill"] == 5 and per.loc[4, "verify"] == 10
    assert per.loc[2, "prefill"] == 5


def test_channel_acceptance_compares_reached_drafts(samples):
    """The channel plot sets realized acceptance beside Σ min(p, q), the acceptance probability
    of a reached draft, so both bars are over the reached drafts of each channel. Over all drafts
    the realized bar counts the drafts after a rejection as failures: on a rejection-sampling run
    whose reached drafts are accepted exactly as often as Σ min(p, q) predicts it showed 0.15
    against 0.43."""
    with draftscope.open(samples["sample"]) as run:
        d = metrics.reached_drafts(run)
        assert (~d["reached"]).any()  # the sample has drafts after a rejection
        fig = plots.channel_acceptance(run, n_boot=20)
        bars = [p for p in fig.axes[0].patches]
        n = len(bars) // 2
        realized = [b.get_height() for b in bars[:n]]
        expected = [b.get_height() for b in bars[n:]]
        r = d[d["reached"]]
        by = r.groupby("channel", observed=True)
        names = [c for c in schema.ENUMS["channel"] if c in set(r["channel"].astype(str))]
        assert realized == pytest.approx([by["accepted"].mean()[c] for c in names], rel=1e-12)
        assert expected == pytest.approx([by["expected_accept"].mean()[c] for c in names],
                                         rel=1e-6)
        plt.close(fig)


def test_expected_vs_realized_leaves_out_drafts_without_a_finite_expectation(samples):
    """A reached draft whose q held NaN has expected_accept NaN: it belongs in no bin. Before,
    np.digitize put it in the last bin, where its acceptance counted."""
    import numpy as np

    with draftscope.open(samples["sample"]) as run:
        d = metrics.reached_drafts(run)
        i = d.index[d["reached"] & (d["accepted"] == 1)][0]
        run.drafts.loc[i, "expected_accept"] = np.nan
        fig = plots.expected_vs_realized(run)
        d = metrics.reached_drafts(run)
        d = d[d["reached"] & np.isfinite(d["expected_accept"])]
        edges = np.linspace(0, 1, 11)
        drawn = [ln for ln in fig.axes[0].lines if ln.get_label().startswith("position")]
        assert len(drawn) == d["position"].nunique()
        for ln, (pos, g) in zip(drawn, d.groupby("position")):
            b = np.clip(np.digitize(g["expected_accept"], edges) - 1, 0, 9)
            want = g.groupby(b)["accepted"].mean().to_numpy()
            assert ln.get_label() == f"position {pos}"
            assert np.array_equal(np.asarray(ln.get_ydata(), dtype=float), want)
        plt.close(fig)
