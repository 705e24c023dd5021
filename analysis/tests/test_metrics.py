"""The Python metrics against the C summary on the same files, identities between metrics, and
the bootstrap against a direct resampling."""
import json
import math
import shutil
import subprocess
import sys
import warnings

import h5py
import numpy as np
import pytest

import draftscope
from draftscope import metrics, schema

from conftest import summary_command, tiny_run_args

C_KEYS = ["batch", "turn", "category", "step-batch", "position", "channel"]


def _same(a, b, where=""):
    """Equal structures; floats to 1e-12 relative: C sums expected_accept in file order, numpy
    pairwise, so the last bits of a mean of float32 values may differ (every other figure is a
    ratio of integer counts, the same double on both sides)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: lengths"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, f"{where}: {a} != {b}"
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _c_summary(programs, path, by):
    out = subprocess.run(summary_command(programs) + [str(path), "--json", "--by", by],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _c_equals_python(programs, path, by):
    """The C summary's JSON of path, after checking that the Python summary equals it."""
    c = _c_summary(programs, path, by)
    with draftscope.open(path) as run:
        py = metrics.summary_dict(run, by)
    c.pop("file")
    py.pop("file")
    _same(c, py, by)
    return c


@pytest.mark.parametrize("by", C_KEYS)
@pytest.mark.parametrize("which", ["sample", "closed", "untraced"])
def test_python_equals_c_summary(programs, samples, which, by):
    c = _c_summary(programs, samples[which], by)
    with draftscope.open(samples[which]) as run:
        py = metrics.summary_dict(run, by)
    c.pop("file")
    py.pop("file")
    _same(c, py, by)


def test_python_module_summary_equals_c(programs, samples):
    out = subprocess.run([sys.executable, "-m", "draftscope", "summary", str(samples["sample"]),
                          "--json", "--by", "category"], check=True, capture_output=True,
                         text=True).stdout
    py = json.loads(out)
    c = _c_summary(programs, samples["sample"], "category")
    c.pop("file")
    py.pop("file")
    _same(c, py)


@pytest.mark.parametrize("which", ["sample", "untraced"])
def test_summary_table_step_times_equal_c(programs, samples, which):
    """The text table's step-time columns carry the C summary's figures (ns -> ms), NaN where
    the C summary has null (an untraced run)."""
    c = _c_summary(programs, samples[which], "batch")
    with draftscope.open(samples[which]) as run:
        table = metrics.summary(run, "batch")
    for g, (_, row) in zip(c["groups"] + [c["all"]], table.iterrows()):
        for col, key, scale in [("draft_ms", "mean_draft_ns", 1e6),
                                ("verify_ms", "mean_verify_ns", 1e6),
                                ("base_step_ms", "base_step_ns", 1e6),
                                ("predicted_speedup", "predicted_speedup", 1.0)]:
            if g[key] is None:
                assert math.isnan(row[col]), f"{which} {col}"
            else:
                assert row[col] == pytest.approx(g[key] / scale, rel=1e-12), f"{which} {col}"
    if which == "sample":
        assert not math.isnan(table["draft_ms"].iloc[-1])


def test_metric_identities(samples):
    """Every step of the sample drafts K, so joint(i) = Π conditional(1..i) and
    τ = 1 + Σ joint(i) (docs/metrics.md), per batch size."""
    with draftscope.open(samples["sample"]) as run:
        d = metrics.summary_dict(run, "batch")
        for g in d["groups"] + [d["all"]]:
            prod = 1.0
            for p in g["positions"]:
                prod *= p["conditional"]
                assert math.isclose(p["joint"], prod, rel_tol=1e-12)
            tau = 1 + sum(p["joint"] for p in g["positions"])
            assert math.isclose(g["mean_acceptance_length"], tau, rel_tol=1e-12)
            assert sum(g["histogram"]) == g["steps"]
            # Acceptance from /steps and from /drafts agree in a consistent file.
            assert math.isclose(g["draft_acceptance_rate"], g["drafts"]["rate"], rel_tol=1e-12)


def test_nonfinite_steps_left_out(samples):
    """test_summary.c's sample ends conversation 6 (one request per sweep: B 1, 4, 8) with a step
    whose verify logits were not finite. The reader keeps those 3 steps and their 3 x K drafts
    apart, and tau over the raw rows (finished, drafted, finite), computed here with numpy from
    the file itself, is the summary's."""
    with h5py.File(samples["sample"], "r") as f:
        st, dr, rq = f["steps"][()], f["drafts"][()], f["requests"][()]
    fin = np.isin(st["request"], rq["request"])
    nf = fin & (st["nonfinite"] != 0)
    assert nf.sum() == 3
    keep = fin & (st["drafted"] > 0) & (st["nonfinite"] == 0)
    tau = 1 + st["accepted"][keep].astype(np.int64).sum() / keep.sum()
    nf_pairs = set(zip(st["request"][nf].tolist(), st["step"][nf].tolist()))
    nf_drafts = np.array([(r, s) in nf_pairs for r, s in zip(dr["request"].tolist(),
                                                            dr["step"].tolist())])
    assert nf_drafts.sum() == 3 * 3
    with draftscope.open(samples["sample"]) as run:
        assert run.dropped["nonfinite_steps"] == 3 and run.dropped["nonfinite_drafts"] == 9
        assert len(run.nonfinite_steps) == 3 and (run.steps["nonfinite"] == 0).all()
        kept = set(zip(run.drafts["request"].tolist(), run.drafts["step"].tolist()))
        assert not kept & nf_pairs
        d = metrics.summary_dict(run, "batch")
        assert d["all"]["mean_acceptance_length"] == pytest.approx(tau, rel=1e-12)
        assert d["all"]["nonfinite"] == 3 and d["rows"]["nonfinite_steps"] == 3
        # Their requests ended with error (code 5) after steps, not at the prompt.
        err = rq["stop_reason"] == 5
        assert d["rows"]["error_requests"] == err.sum() == 3
        assert d["rows"]["error_requests_at_prompt"] == (err & (rq["steps"] == 0)).sum() == 0
        codes = np.bincount(rq["stop_reason"], minlength=6)
        assert [d["rows"]["stop_reasons"][n] for n in schema.ENUMS["stop_reason"]] == \
            codes.tolist()
        assert [g["nonfinite"] for g in d["groups"]] == [1, 1, 1]
        assert d["all"]["steps"] == keep.sum()


def test_cut_category_labelled_alike(programs, samples, tmp_path):
    """A category text the writer cut (its /strings length beyond the bytes stored) is labelled
    with an ellipsis by both summaries, sorted by that label, and the other labels unchanged."""
    cut = tmp_path / "cut_category.h5"
    shutil.copy(samples["sample"], cut)
    with draftscope.open(cut) as run:
        cat = int(run.requests["category"].iloc[0])
        name = run.string_texts[cat]
    with h5py.File(cut, "r+") as f:
        s = f["strings"][()]
        s["length"][cat] += 5000
        f["strings"][...] = s
    c = _c_equals_python(programs, cut, "category")
    labels = [g["label"] for g in c["groups"]]
    assert name + "\u2026" in labels and name not in labels


def test_nonfinite_q_drafts_counted_alike(programs, samples, tmp_path):
    """Drafts whose q_draft is NaN (a draft with non-finite logits: expected_accept NaN too) are
    counted by both summaries among the kept drafts only, stay in the acceptance figures, and make
    the expected means they fall in null. Which rows are kept is computed here from the file."""
    bad = tmp_path / "nan_q.h5"
    shutil.copy(samples["sample"], bad)
    with h5py.File(bad, "r+") as f:
        d = f["drafts"][()]
        st, rq = f["steps"][()], f["requests"][()]
        pick = np.arange(0, len(d), 7)             # every 7th row: kept and dropped ones alike
        d["q_draft"][pick] = np.nan
        d["expected_accept"][pick] = np.nan
        f["drafts"][...] = d
    nf = set(zip(st["request"][st["nonfinite"] != 0].tolist(),
                 st["step"][st["nonfinite"] != 0].tolist()))
    kept = np.array([r in set(rq["request"].tolist()) and (r, s) not in nf
                     for r, s in zip(d["request"].tolist(), d["step"].tolist())])
    want = int((~np.isfinite(d["q_draft"]) & kept).sum())
    assert 0 < want < len(pick)
    c = _c_equals_python(programs, bad, "batch")
    assert c["rows"]["nonfinite_q_drafts"] == want
    assert c["all"]["drafts"]["expected"] is None
    with draftscope.open(samples["sample"]) as run:
        assert metrics.summary_dict(run, "batch")["rows"]["nonfinite_q_drafts"] == 0
        acc = metrics.summary_dict(run, "batch")["all"]["draft_acceptance_rate"]
    assert c["all"]["draft_acceptance_rate"] == acc


def test_context_buckets(samples):
    with draftscope.open(samples["sample"]) as run:
        ci = draftscope.metric_ci(run, "mean_acceptance_length", "context", n_boot=0)
        # Every step row falls in one bucket; the n column counts them.
        assert ci["n"].sum() == len(run.steps)
        ctx = run.steps["context_len"]
        first = ((ctx >= 0) & (ctx < 128))
        assert ci.loc["[0, 128)", "value"] == pytest.approx(
            1 + run.steps.loc[first, "accepted"].mean(), rel=1e-12)


def test_bootstrap_matches_direct_resampling(samples):
    """metric_ci's replicates (per-request sums reweighted) equal a direct resampling: draw the
    same request indices, concatenate those requests' step rows, compute τ from the rows."""
    with draftscope.open(samples["sample"]) as run:
        n_boot, seed = 50, 3
        sums = metrics.request_sums(run, "mean_acceptance_length", "batch")
        reps = metrics._replicates(sums, n_boot, np.random.default_rng(seed))
        rng = np.random.default_rng(seed)
        req = run.requests
        by_request = {r: g["accepted"].to_numpy() for r, g in run.steps.groupby("request")}
        for j, key in enumerate(sums[0]):
            members = req["request"].to_numpy()[req["batch_size"].to_numpy() == key]
            idx = rng.integers(0, len(members), size=(n_boot, len(members)))
            for b in range(n_boot):
                rows = np.concatenate([by_request.get(members[i], np.empty(0)) for i in idx[b]])
                assert reps[b, j] == pytest.approx(1 + rows.mean(), rel=1e-12)


def test_bootstrap_is_seeded_and_brackets_the_value(samples):
    with draftscope.open(samples["sample"]) as run:
        a = draftscope.metric_ci(run, "conditional", "batch", position=2, n_boot=300, seed=1)
        b = draftscope.metric_ci(run, "conditional", "batch", position=2, n_boot=300, seed=1)
        c = draftscope.metric_ci(run, "conditional", "batch", position=2, n_boot=300, seed=2)
        assert a.equals(b)
        assert not a["lo"].equals(c["lo"])
        assert ((a["lo"] <= a["value"]) & (a["value"] <= a["hi"])).all()
        assert (a["hi"] - a["lo"] > 0).all()
        # The point value is the summary's conditional rate at position 2.
        d = metrics.summary_dict(run, "batch")
        for g in d["groups"]:
            assert a.loc[g["label"], "value"] == pytest.approx(g["positions"][1]["conditional"],
                                                               rel=1e-12)


def test_compare_two_runs(samples):
    with draftscope.open(samples["sample"]) as a, draftscope.open(samples["untraced"]) as b:
        same = draftscope.compare(a, a, "mean_acceptance_length", "batch", n_boot=200, seed=0)
        assert (same["diff"] == 0).all()
        assert ((same["lo"] <= 0) & (0 <= same["hi"])).all()
        # The untraced sample simulates the same sweep from the same seed: same acceptance.
        other = draftscope.compare(a, b, "draft_acceptance_rate", "batch", n_boot=100)
        assert other["diff"].abs().max() == 0
        diff = draftscope.compare(a, b, "drafts_rate", "channel", n_boot=100)
        assert list(diff.index) == ["header", "analysis", "final"]


def test_argument_errors(samples):
    with draftscope.open(samples["sample"]) as run:
        with pytest.raises(ValueError, match="needs position"):
            draftscope.metric_ci(run, "joint", "batch")
        with pytest.raises(ValueError, match="per request"):
            draftscope.metric_ci(run, "sglang_accept_length", "step-batch")
        with pytest.raises(ValueError, match="no channel"):
            draftscope.metric_ci(run, "mean_acceptance_length", "channel")
        with pytest.raises(ValueError, match="unknown grouping"):
            draftscope.summary(run, "colour")
        with pytest.raises(ValueError, match="position 4 outside"):
            draftscope.metric_ci(run, "conditional", "batch", position=4)


def test_dataset_skips(samples):
    """What the run skipped of its dataset (options_json.dataset, as test_summary.c's traced
    sample writes it); absent in the untraced sample; impossible counts are a format error."""
    with draftscope.open(samples["sample"]) as run:
        d = metrics.dataset_skips(run)
        assert (d["records_read"], d["skipped_empty"], d["skipped_malformed"]) == (40, 1, 2)
        assert d["first_skip"].startswith("questions.jsonl: line 7: record 6: invalid JSON")
        assert metrics.summary_dict(run, "batch")["run"]["dataset"] == d
        for bad in ('{"dataset": [3]}',
                    '{"dataset": {"records_read": 3, "skipped_empty": 0}}',
                    '{"dataset": {"records_read": 3, "skipped_empty": 2, "skipped_malformed": 2}}',
                    '{"dataset": {"records_read": 3, "skipped_empty": true, '
                    '"skipped_malformed": 0}}'):
            run.meta["options_json"] = bad
            with pytest.raises(draftscope.DraftscopeFormatError, match="options_json.dataset"):
                metrics.dataset_skips(run)
    with draftscope.open(samples["untraced"]) as run:
        assert metrics.dataset_skips(run) is None
        assert metrics.summary_dict(run, "batch")["run"]["dataset"] is None


def test_step_times_and_speedup(samples):
    """The traced sample has a baseline for B 1 and 4 (median 1.0 and 1.2 ms) and none for B 8;
    the untraced one has no step times. The speedup is rebuilt here from the rows directly."""
    with draftscope.open(samples["sample"]) as run:
        d = metrics.summary_dict(run, "batch")
        steps = run.steps
        by_label = {g["label"]: g for g in d["groups"]}
        for label, base in (("1", 1.0e6), ("4", 1.2e6)):
            g = by_label[label]
            s = steps[steps["sweep_batch"] == int(label)]
            one = s.drop_duplicates("step")  # the sample's rows of a step are contiguous
            tau = 1.0 + s["accepted"].sum() / len(s)
            spec = one["draft_ns"].mean() + one["verify_ns"].mean()
            assert g["timed_steps"] == len(one)
            assert g["base_step_ns"] == base
            assert math.isclose(g["predicted_speedup"], tau * base / spec, rel_tol=1e-12)
        assert by_label["8"]["predicted_speedup"] is None
        assert by_label["8"]["mean_verify_ns"] is not None
        assert d["run"]["trace_overhead"] == 0.031
        assert d["run"]["trace_dropped"] == 7  # test_summary.c write_sample, traced
    with draftscope.open(samples["untraced"]) as run:
        d = metrics.summary_dict(run, "batch")
        assert all(g["timed_steps"] == 0 and g["mean_draft_ns"] is None for g in d["groups"])
        assert d["run"]["baseline"] == [] and d["run"]["trace_overhead"] is None
        assert d["run"]["trace_dropped"] == 0


def test_categories_are_string_ids(programs, samples, tmp_path):
    """Two categories whose texts are equal stay two groups, keyed by string id, in the order
    (label, id), as the C summary groups them; Python merged them by text before."""
    path = tmp_path / "same_text.h5"
    shutil.copy(samples["sample"], path)
    with h5py.File(path, "r+") as f:
        req = f["requests"][()]
        ids = sorted(set(int(c) for c in req["category"]))
        assert len(ids) >= 2, "the sample needs two categories"
        strings = f["strings"][()]
        strings["text"][ids[1]] = strings["text"][ids[0]]  # the second now reads as the first
        f["strings"][...] = strings
    c = _c_summary(programs, path, "category")
    with draftscope.open(path) as run:
        py = metrics.summary_dict(run, "category")
    assert len(py["groups"]) == len(c["groups"]) == len(ids)
    c.pop("file")
    py.pop("file")
    _same(c, py, "category")


def test_options_json_checked_as_c_checks_it(samples):
    """A baseline entry without a median, a batch size of 1.0 or a negative median, and NaN
    anywhere in options_json are format errors naming the file (KeyError, TypeError or silent
    acceptance before), as in the C summary."""
    with draftscope.open(samples["sample"]) as run:
        for bad, says in (('{"baseline": [{"batch_size": 1}]}', r"baseline\[0\] needs"),
                          ('{"baseline": 5}', "baseline is not a list"),
                          ('{"baseline": [{"batch_size": 1.0, "median_ns": 5}]}', "needs"),
                          ('{"baseline": [{"batch_size": 1, "median_ns": -5}]}', "needs"),
                          ('{"trace_overhead": NaN}', "options_json is not a JSON object"),
                          ('{"numerics": "fast"}', "numerics is not"),
                          ('{"numerics": 1}', "numerics is not"),
                          ('{"pad_to_graph_sizes": [0]}', "pad_to_graph_sizes is not"),
                          ('{"pad_to_graph_sizes": 8}', "pad_to_graph_sizes is not"),
                          ('{"load": [1]}', r"load\.target needs"),
                          ('{"load": {"target": {"bytes": 1, "seconds": 1, "uploaded": true}}}',
                           r"load\.draft needs"),
                          ('{"load": {"target": {"bytes": 1, "seconds": -1, "uploaded": true}, '
                           '"draft": {"bytes": 1, "seconds": 1, "uploaded": true}}}',
                           r"load\.target needs"),
                          ('{"load": {"target": {"bytes": 1, "seconds": 1, "uploaded": 1}, '
                           '"draft": {"bytes": 1, "seconds": 1, "uploaded": true}}}',
                           r"load\.target needs")):
            run.meta["options_json"] = bad
            with pytest.raises(draftscope.DraftscopeFormatError, match=says):
                metrics.summary_dict(run, "batch")


def test_numerics_read_as_c_reads_it(programs, samples, tmp_path):
    """options_json.numerics: absent reads "invariant" (files before the option), and a
    batch-variant file says so in the C summary's JSON and in the Python one alike."""
    with draftscope.open(samples["sample"]) as run:
        assert metrics.summary_dict(run)["run"]["numerics"] == "invariant"
    path = tmp_path / "variant.h5"
    shutil.copy(samples["sample"], path)
    with h5py.File(path, "r+") as f:
        o = json.loads(f.attrs["options_json"])
        o["numerics"] = "batch-variant"
        f.attrs["options_json"] = json.dumps(o)
    c = _c_equals_python(programs, path, "batch")
    assert c["run"]["numerics"] == "batch-variant"


def test_step_times_skip_untimed_steps(programs, samples, tmp_path):
    """A file whose early steps were not timed (a session resumed with --trace off, say): the
    per-step means of step_times, and the speedup the plot draws, leave those steps out as the
    C summary does, rather than averaging their zeros in."""
    path = tmp_path / "mixed.h5"
    shutil.copy(samples["sample"], path)
    with h5py.File(path, "r+") as f:
        s = f["steps"][()]
        cut = np.unique(s["step"])[len(np.unique(s["step"])) // 2]
        for col in ("draft_ns", "verify_ns", "accept_ns", "total_ns"):
            s[col][s["step"] < cut] = 0
        f["steps"][...] = s
    c = _c_summary(programs, path, "batch")
    with draftscope.open(path) as run:
        times = metrics.step_times(run, "batch")
        fig = draftscope.plots.predicted_speedup(run)
        xs, ys = fig.axes[0].get_lines()[0].get_data()
    speedup = dict(zip(xs.tolist(), ys.tolist()))
    for g in c["groups"]:
        b = int(g["key"])
        assert times.at[b, "draft_ns"] == pytest.approx(g["mean_draft_ns"], rel=1e-12)
        assert times.at[b, "verify_ns"] == pytest.approx(g["mean_verify_ns"], rel=1e-12)
        if g["predicted_speedup"] is not None:
            assert speedup[b] == pytest.approx(g["predicted_speedup"], rel=1e-12)


def test_interval_of_a_group_without_replicates_is_nan_and_quiet():
    """A group none of whose requests has a denominator (the demo's "other" channel for reached
    drafts) gets a NaN interval, and numpy's all-NaN warning no longer reaches the report."""
    reps = np.array([[0.5, np.nan], [0.7, np.nan], [0.6, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = metrics._interval(reps, 0.025, 2, 3)
    assert lo[0] == pytest.approx(0.505) and hi[0] == pytest.approx(0.695)
    assert np.isnan(lo[1]) and np.isnan(hi[1])


def test_batch_divergence_finds_what_moved(programs, tmp_path):
    """A CPU run at batch sizes 1 and 2 (invariant numerics): every request equals its B 1 twin
    bit for bit. Then, in a copy, one B 2 request's p_target of its third draft is nudged by one
    ulp (bits differ, fates agree) and another's fifth draft token changed (fates part at index
    4): batch_divergence says exactly that, and nothing about the others."""
    if not programs.get("draftscope"):
        pytest.skip("the draftscope executable is not built")
    out = tmp_path / "div.h5"
    subprocess.run(tiny_run_args(programs, tmp_path / "conv.jsonl", out,
                                 [("a", "hello world"), ("b", "hell or held"), ("c", "world"),
                                  ("d", "or hello")],
                                 ["--batch-sizes", "1,2", "--max-new-tokens", "24"]),
                   check=True, capture_output=True, text=True)
    with draftscope.open(out) as run:
        div = metrics.batch_divergence(run)
        assert list(div.index.get_level_values("batch").unique()) == [2]
        assert len(div) == 4 and div["bits_equal"].all()
        assert div["first_token_diff"].isna().all() and (div["max_abs_dp_target"] == 0).all()
        assert (div["drafts"] == div["base_drafts"]).all() and (div["drafts"] >= 5).all()
        req = run.requests
        two = req[req["batch_size"] == 2].sort_values("dataset_index")
        r_bits, r_tok = int(two["request"].iloc[0]), int(two["request"].iloc[1])
        i_bits, i_tok = int(two["dataset_index"].iloc[0]), int(two["dataset_index"].iloc[1])
    moved = tmp_path / "moved.h5"
    shutil.copy(out, moved)
    with h5py.File(moved, "r+") as f:
        d = f["drafts"][()]
        order = np.lexsort((d["position"], d["step"]))
        rows_bits = [i for i in order if d["request"][i] == r_bits]
        rows_tok = [i for i in order if d["request"][i] == r_tok]
        p = d["p_target"][rows_bits[2]]
        d["p_target"][rows_bits[2]] = np.nextafter(p, np.float32(2), dtype=np.float32)
        d["draft_token"][rows_tok[4]] = d["draft_token"][rows_tok[4]] + 1
        f["drafts"][...] = d
    with draftscope.open(moved) as run:
        div = metrics.batch_divergence(run)
    a = div.loc[(2, i_bits, 0)]
    assert not a["bits_equal"] and np.isnan(a["first_token_diff"])
    assert 0 < a["max_abs_dp_target"] < 1e-6
    b = div.loc[(2, i_tok, 0)]
    assert not b["bits_equal"] and b["first_token_diff"] == 4 and b["max_abs_dp_target"] == 0
    rest = div.drop([(2, i_bits, 0), (2, i_tok, 0)])
    assert len(rest) == 2 and rest["bits_equal"].all()
    # The C summary counts the same (through hashes of each request's drafts), Python alike.
    c = _c_equals_python(programs, moved, "batch")
    assert [g["divergence"] for g in c["groups"]] == [
        None, {"base": 1, "requests": 4, "bits_equal": 2, "same_tokens": 1, "parted": 1}]
    assert c["all"]["divergence"] is None
    assert _c_equals_python(programs, out, "batch")["groups"][1]["divergence"]["bits_equal"] == 4
    text = subprocess.run(summary_command(programs) + [str(moved)], check=True,
                          capture_output=True, text=True).stdout
    assert ("  against B 1 (the same conversation turns): 4 requests, 2 bit for bit equal, 1 with "
            "the same tokens but other probabilities, 1 whose tokens part\n") in text
    with pytest.raises(ValueError, match="batch size 3 is not in the run"):
        metrics.batch_divergence(run, base=3)


def test_divergence_of_a_padded_run(programs, tmp_path):
    """The same CPU run with every verify padded to 8, 16 or 32 rows: divergence finds every
    request of both batch sizes equal to its unpadded twin bit for bit (the reference ops are
    batch invariant), and the padding is in options_json; a run against itself is equal too."""
    if not programs.get("draftscope"):
        pytest.skip("the draftscope executable is not built")
    conv = [("a", "hello world"), ("b", "hell or held"), ("c", "world")]
    plain, padded = tmp_path / "plain.h5", tmp_path / "padded.h5"
    for out, extra in ((plain, []), (padded, ["--pad-to-graph-sizes", "8,16,32"])):
        subprocess.run(tiny_run_args(programs, tmp_path / "conv.jsonl", out, conv,
                                     ["--batch-sizes", "1,3", "--max-new-tokens", "24", *extra]),
                       check=True, capture_output=True, text=True)
    with draftscope.open(plain) as a, draftscope.open(padded) as b:
        assert metrics.run_options(b)["pad_to_graph_sizes"] == [8, 16, 32]
        assert metrics.run_options(a)["pad_to_graph_sizes"] == []
        div = draftscope.divergence(a, b)
        assert len(div) == 6 and div["bits_equal"].all() and div["first_token_diff"].isna().all()
        assert sorted(div.index.get_level_values("batch").unique()) == [1, 3]
        assert draftscope.divergence(a, a)["bits_equal"].all()
    c = _c_equals_python(programs, padded, "batch")  # and the summaries read it alike
    assert c["run"]["pad_to_graph_sizes"] == [8, 16, 32]
    text = subprocess.run(summary_command(programs) + [str(padded)], check=True,
                          capture_output=True, text=True).stdout
    assert "  verify padded to graph sizes 8, 16, 32 (rows, as CUDA-graph engines pad)\n" in text
