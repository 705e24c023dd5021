"""The metrics of docs/metrics.md, by any grouping, with bootstrap confidence intervals.

Every metric is a ratio of sums over rows (plus a constant for the acceptance length), so it is
computed from per-request sums: this makes the grouped value, the bootstrap over requests and the
comparison of two runs one piece of code.

Grouping keys (`by`):
  "batch"       the sweep's concurrency B of the request (requests.batch_size)   request-level
  "turn"        the request's turn                                               request-level
  "category"    the request's dataset category ("(none)" when empty)             request-level
  "step-batch"  the row's own batch_size (sequences in the step)                 row-level
  "position"    drafts.position                                      row-level, drafts only
  "channel"     drafts.channel                                       row-level, drafts only
  "context"     context-length bucket of the row (steps/drafts.context_len)      row-level
`summary_dict(run, by)` (all keys but "context") returns exactly what `draftscope summary --json`
prints; a test compares the two on the same file.
"""
import json
import math
import warnings

import numpy as np
import pandas as pd

from . import schema
from .reader import DraftscopeFormatError

REQUEST_KEYS = ("batch", "turn", "category")
ROW_KEYS = ("step-batch", "position", "channel", "context")
DRAFT_ONLY_KEYS = ("position", "channel")
DEFAULT_CONTEXT_BINS = (0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

# metric name -> (table, numerator, denominator, constant added)
METRICS = {
    "mean_acceptance_length": ("steps", "accepted", "one", 1.0),
    "draft_acceptance_rate": ("steps", "accepted", "drafted", 0.0),
    "emitted_per_step": ("steps", "emitted", "one", 0.0),
    "sglang_accept_length": ("requests", "generated_len", "steps", 0.0),
    "joint": ("steps", "at_least", "one", 0.0),            # needs position=i
    "conditional": ("steps", "at_least", "reached", 0.0),  # needs position=i
    "drafts_rate": ("drafts", "accepted", "one", 0.0),     # position=i optional
    "expected_acceptance": ("drafts", "expected_accept", "one", 0.0),  # position=i optional
    # The same two over reached drafts only (every earlier draft of the chain accepted): the
    # pair to compare, as Σ min(p, q) is the acceptance probability of a reached draft.
    "reached_rate": ("drafts", "accepted", "reached_draft", 0.0),  # position=i optional
    "reached_expected": ("drafts", "expected_accept", "reached_draft", 0.0),
}
METRIC_LABELS = {
    "mean_acceptance_length": "mean acceptance length τ (1 + accepted/steps)",
    "draft_acceptance_rate": "draft acceptance rate (accepted/drafted)",
    "emitted_per_step": "tokens emitted per step",
    "sglang_accept_length": "SGLang accept length (completion tokens/verify steps)",
    "joint": "joint acceptance P(accepted ≥ i)",
    "conditional": "conditional acceptance (n-α)",
    "drafts_rate": "acceptance of drafted tokens",
    "expected_acceptance": "expected acceptance Σ min(p, q)",
    "reached_rate": "acceptance of reached drafts",
    "reached_expected": "expected acceptance Σ min(p, q) of reached drafts",
}


def _check_by(by):
    if by not in REQUEST_KEYS + ROW_KEYS:
        raise ValueError(f"unknown grouping {by!r} (one of {', '.join(REQUEST_KEYS + ROW_KEYS)})")


def _bucket_labels(edges):
    labels = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        labels.append(f"[{lo}, {hi})")
    labels.append(f"≥{edges[-1]}")
    return labels


def _context_bucket(ctx, bins):
    edges = np.asarray(bins, dtype=np.int64)
    idx = np.searchsorted(edges, np.asarray(ctx, dtype=np.int64), side="right") - 1
    return np.clip(idx, 0, len(edges) - 1)


def _request_key(requests, by):
    if by == "batch":
        return requests["batch_size"].to_numpy().astype(np.int64)
    if by == "turn":
        return requests["turn"].to_numpy().astype(np.int64)
    # A category is its string id, as in the C summary: two categories whose texts agree (or
    # "" and "(none)") stay apart.
    return requests["category"].to_numpy().astype(np.int64)


def _category_labels(run):
    """{category string id: label} for the run's requests ("(none)" for the empty text)."""
    ids = run.requests["category"].to_numpy().astype(np.int64)
    n = len(run.strings)
    bad = ids[ids >= n]
    if len(bad):
        raise DraftscopeFormatError(
            f"{run.path}: /requests names category string {int(bad[0])} beyond /strings "
            f"({n} rows)")
    texts = run.string_texts  # a cut text marked with an ellipsis
    return {int(i): (texts[int(i)] or "(none)") for i in set(ids.tolist())}


def _row_key(run, table, by, bins):
    """The group key of every row of run.steps or run.drafts (None: the row has no such key)."""
    df = getattr(run, table)
    if by in REQUEST_KEYS:
        rk = pd.Series(_request_key(run.requests, by), index=run.requests["request"].to_numpy())
        return rk.reindex(df["request"].to_numpy()).to_numpy()
    if by == "step-batch":
        return df["batch_size"].to_numpy().astype(np.int64)
    if by == "context":
        return _context_bucket(df["context_len"].to_numpy(), bins)
    if table != "drafts":
        return None  # position and channel are draft-only keys
    if by == "position":
        return df["position"].to_numpy().astype(np.int64)
    return df["channel"].cat.codes.to_numpy().astype(np.int64)


def _label(by, key, bins, cat_labels=None):
    if by == "channel":
        return schema.ENUMS["channel"][int(key)]
    if by == "category":
        return cat_labels[int(key)]
    if by == "context":
        return _bucket_labels(list(bins))[int(key)]
    return str(int(key))


def _sorted_keys(keys, by, cat_labels=None):
    keys = list(keys)
    if by == "category":  # by label bytes, then id, as the C summary sorts them
        return sorted(keys, key=lambda k: (cat_labels[int(k)].encode("utf-8", "replace"), int(k)))
    return sorted(keys, key=int)


# ---------------------------------------------------------------------------------------------
# Sums of one group (the same counts the C summary keeps).

def _nan_ratio(num, den):
    return float(num) / float(den) if den > 0 else float("nan")


def _group_sums(k, steps, drafts, requests, nonfinite=0):
    """Counts of one group from its rows (DataFrames; requests None for row-level keys;
    nonfinite: the group's steps with non-finite verify logits, kept apart from steps)."""
    acc = steps["accepted"].to_numpy().astype(np.int64)
    drf = steps["drafted"].to_numpy().astype(np.int64)
    g = {
        "steps": len(steps), "drafted": int(drf.sum()), "accepted": int(acc.sum()),
        "emitted": int(steps["emitted"].to_numpy().astype(np.int64).sum()),
        "nonfinite": int(nonfinite),
        "hist": np.bincount(acc, minlength=k + 1)[: k + 1].astype(np.int64),
        "reached": np.zeros(k + 1, dtype=np.int64),
    }
    for i in range(1, k + 1):
        g["reached"][i] = int(((drf >= i) & (acc >= i - 1)).sum())
    if requests is not None:
        g["req_generated"] = int(requests["generated_len"].to_numpy().astype(np.int64).sum())
        g["req_steps"] = int(requests["steps"].to_numpy().astype(np.int64).sum())
    else:
        g["req_generated"] = g["req_steps"] = 0
    pos = drafts["position"].to_numpy().astype(np.int64)
    dac = drafts["accepted"].to_numpy().astype(np.int64)
    exp = drafts["expected_accept"].to_numpy().astype(np.float64)
    ch = drafts["channel"].cat.codes.to_numpy().astype(np.int64)
    nch = len(schema.ENUMS["channel"])
    # Phase times once per step id: the first of each run of rows of the same step among the
    # group's timed rows (file order), as the C summary counts them.
    timed = steps[(steps["draft_ns"].to_numpy() != 0) | (steps["verify_ns"].to_numpy() != 0)]
    sid = timed["step"].to_numpy()
    first = np.ones(len(sid), dtype=bool)
    first[1:] = sid[1:] != sid[:-1]
    g["timed_steps"] = int(first.sum())
    g["draft_ns_sum"] = int(timed["draft_ns"].to_numpy()[first].astype(np.uint64).sum())
    g["verify_ns_sum"] = int(timed["verify_ns"].to_numpy()[first].astype(np.uint64).sum())
    g["base_step_ns"] = float("nan")
    g.update({
        "drafts": len(drafts), "drafts_accepted": int(dac.sum()), "drafts_expected": exp.sum(),
        "pos_drafts": np.bincount(pos, minlength=k + 1)[: k + 1],
        "pos_accepted": np.bincount(pos, weights=dac, minlength=k + 1)[: k + 1],
        "pos_expected": np.bincount(pos, weights=exp, minlength=k + 1)[: k + 1],
        "ch_drafts": np.bincount(ch, minlength=nch)[:nch],
        "ch_accepted": np.bincount(ch, weights=dac, minlength=nch)[:nch],
        "ch_expected": np.bincount(ch, weights=exp, minlength=nch)[:nch],
    })
    return g


def _num(v):
    """JSON-like number: None for NaN (as the C summary prints null)."""
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


def _group_dict(k, key, label, n_requests, g):
    at_least = np.cumsum(g["hist"][::-1])[::-1]  # rows with accepted >= j
    d = {
        "key": key, "label": label, "requests": int(n_requests),
        "steps": g["steps"], "drafted": g["drafted"], "accepted": g["accepted"],
        "emitted": g["emitted"], "nonfinite": g["nonfinite"],
        "completion_tokens": g["req_generated"], "request_steps": g["req_steps"],
        "mean_acceptance_length": _num(1.0 + g["accepted"] / g["steps"]) if g["steps"] else None,
        "sglang_accept_length": _num(_nan_ratio(g["req_generated"], g["req_steps"])),
        "emitted_per_step": _num(_nan_ratio(g["emitted"], g["steps"])),
        "draft_acceptance_rate": _num(_nan_ratio(g["accepted"], g["drafted"])),
        "histogram": [int(x) for x in g["hist"]],
        "positions": [],
        "drafts": {
            "rows": g["drafts"], "accepted": g["drafts_accepted"],
            "rate": _num(_nan_ratio(g["drafts_accepted"], g["drafts"])),
            "expected": _num(_nan_ratio(g["drafts_expected"], g["drafts"])),
        },
        "channels": [],
    }
    tau = 1.0 + g["accepted"] / g["steps"] if g["steps"] else float("nan")
    draft = _nan_ratio(g["draft_ns_sum"], g["timed_steps"])
    verify = _nan_ratio(g["verify_ns_sum"], g["timed_steps"])
    spec = draft + verify
    speedup = tau * g["base_step_ns"] / spec if spec > 0 else float("nan")
    for i in range(1, k + 1):
        d["positions"].append({
            "position": i,
            "joint": _num(_nan_ratio(at_least[i], g["steps"])),
            "conditional": _num(_nan_ratio(at_least[i], g["reached"][i])),
            "reached": int(g["reached"][i]),
            "drafts": int(g["pos_drafts"][i]),
            "drafts_accepted": int(g["pos_accepted"][i]),
            "drafts_rate": _num(_nan_ratio(g["pos_accepted"][i], g["pos_drafts"][i])),
            "expected": _num(_nan_ratio(g["pos_expected"][i], g["pos_drafts"][i])),
        })
    for c, name in enumerate(schema.ENUMS["channel"]):
        d["channels"].append({
            "channel": name, "drafts": int(g["ch_drafts"][c]),
            "accepted": int(g["ch_accepted"][c]),
            "rate": _num(_nan_ratio(g["ch_accepted"][c], g["ch_drafts"][c])),
            "expected": _num(_nan_ratio(g["ch_expected"][c], g["ch_drafts"][c])),
        })
    d.update({
        "timed_steps": g["timed_steps"], "mean_draft_ns": _num(draft),
        "mean_verify_ns": _num(verify), "base_step_ns": _num(g["base_step_ns"]),
        "predicted_speedup": _num(speedup),
        "divergence": None,  # by batch: set by summary_dict for the batch sizes above the base
    })
    return d


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python reads them, JSON has none


def run_options(run):
    """options_json as a dict ({} when absent or empty)."""
    text = run.meta.get("options_json") or ""
    if not text:
        return {}
    try:
        o = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise DraftscopeFormatError(f"{run.path}: options_json is not a JSON object ({e})")
    if not isinstance(o, dict):
        raise DraftscopeFormatError(f"{run.path}: options_json is not a JSON object")
    return o


MAX_BASELINE = 64  # DS_SUMMARY_MAX_BASELINE


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _baseline_entries(run):
    """options_json.baseline checked as the C summary checks it (a list of at most 64 entries,
    each an integer batch_size 1..65535 and a positive median_ns)."""
    base = run_options(run).get("baseline", [])
    if not isinstance(base, list) or len(base) > MAX_BASELINE:
        raise DraftscopeFormatError(
            f"{run.path}: options_json.baseline is not a list of at most {MAX_BASELINE} batch "
            "sizes")
    for i, b in enumerate(base):
        bs = b.get("batch_size") if isinstance(b, dict) else None
        med = b.get("median_ns") if isinstance(b, dict) else None
        if not (_is_int(bs) and 1 <= bs <= 65535 and _is_num(med) and med > 0):
            raise DraftscopeFormatError(
                f"{run.path}: options_json.baseline[{i}] needs batch_size (1..65535) and a "
                "positive median_ns")
    return base


def baseline(run):
    """{batch size: baseline median decode step time in ns} from options_json (see
    docs/tracing.md); {} without a baseline."""
    return {int(b["batch_size"]): float(b["median_ns"]) for b in _baseline_entries(run)}


def ending_counts(run):
    """How the run's finished requests ended and what the draft's numbers did, as the C
    summary's rows count them: drafts without a finite draft probability (q_draft NaN, Inf or 0:
    the draft's logits held NaN or Inf; kept in the metrics as they happened), the requests by
    stop reason (every reason listed), and those that ended with error (non-finite target
    logits), of them the ones with no step (the prompt's last logits failed)."""
    qd = run.drafts["q_draft"].to_numpy()
    stop = run.requests["stop_reason"]
    errored = (stop == "error").to_numpy()
    return {
        "nonfinite_q_drafts": int((~(np.isfinite(qd) & (qd > 0))).sum()),
        "stop_reasons": {name: int((stop == name).sum()) for name in schema.ENUMS["stop_reason"]},
        "error_requests": int(errored.sum()),
        "error_requests_at_prompt": int((errored & (run.requests["steps"] == 0).to_numpy()).sum()),
    }


def dataset_skips(run):
    """What the run read of its dataset and what it skipped, from options_json.dataset:
    {records_read, skipped_empty, skipped_malformed, first_skip (None if nothing was skipped)};
    None for files written before the run recorded it."""
    d = run_options(run).get("dataset")
    if d is None:
        return None
    counts = [d.get(k) for k in ("records_read", "skipped_empty", "skipped_malformed")] \
        if isinstance(d, dict) else []
    if len(counts) != 3 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                   for c in counts) or counts[1] + counts[2] > counts[0]:
        raise DraftscopeFormatError(
            f"{run.path}: options_json.dataset needs records_read, skipped_empty and "
            "skipped_malformed (counts, the skips at most the records read)")
    first = d.get("first_skip")
    return {"records_read": counts[0], "skipped_empty": counts[1],
            "skipped_malformed": counts[2],
            "first_skip": first if isinstance(first, str) and first else None}


def load_info(run):
    """The creating run's model loads, from options_json.load: {"target": {bytes, seconds,
    uploaded}, "draft": {...}} (uploaded False: the CPU reference mapped the checkpoint in place,
    so bytes / seconds is no copy rate); None for files written before the run recorded it."""
    d = run_options(run).get("load")
    if d is None:
        return None
    out = {}
    for name in ("target", "draft"):
        e = d.get(name) if isinstance(d, dict) else None
        b, sec, up = (e.get(k) for k in ("bytes", "seconds", "uploaded")) \
            if isinstance(e, dict) else (None, None, None)
        if not (_is_int(b) and b >= 0 and _is_num(sec) and sec >= 0 and isinstance(up, bool)):
            raise DraftscopeFormatError(
                f"{run.path}: options_json.load.{name} needs bytes (a count), seconds (a "
                "number >= 0) and uploaded (true or false)")
        out[name] = {"bytes": b, "seconds": float(sec), "uploaded": up}
    return out


NUMERICS = ("invariant", "batch-variant")


def numerics(run):
    """options_json.numerics: "invariant" (also for files written before the option) or
    "batch-variant" (each call's attention split follows its size; docs/cli.md)."""
    v = run_options(run).get("numerics", "invariant")
    if v not in NUMERICS:
        raise DraftscopeFormatError(
            f'{run.path}: options_json.numerics is not "invariant" or "batch-variant"')
    return v


def pad_sizes(run):
    """options_json.pad_to_graph_sizes: the verify padding sizes ([] without padding)."""
    v = run_options(run).get("pad_to_graph_sizes", [])
    if not (isinstance(v, list) and len(v) <= 64 and
            all(_is_int(x) and 1 <= x <= 65535 for x in v)):
        raise DraftscopeFormatError(f"{run.path}: options_json.pad_to_graph_sizes is not a list "
                                    "of at most 64 row counts 1..65535")
    return list(v)


def summary_dict(run, by="batch", context_bins=DEFAULT_CONTEXT_BINS):
    """The summary as `draftscope summary --json` prints it (see docs/metrics.md)."""
    _check_by(by)
    k = run.k
    steps, drafts, requests = run.steps, run.drafts, run.requests
    skey = _row_key(run, "steps", by, context_bins)
    dkey = _row_key(run, "drafts", by, context_bins)
    # Steps with non-finite verify logits: in their group's `nonfinite` count (and, for a
    # row-level key, its membership) but in no sum (docs/metrics.md).
    nf = run.nonfinite_steps
    nkey = _row_key(run, "nonfinite_steps", by, context_bins)
    if by in REQUEST_KEYS:
        rkey = _request_key(requests, by)
        keys = set(rkey.tolist())
    else:
        keys = set(dkey.tolist())
        if skey is not None:
            keys |= set(skey.tolist()) | set(nkey.tolist())
    cats = _category_labels(run) if by == "category" else None
    opts = run_options(run)
    base = baseline(run)
    groups = []
    for key in _sorted_keys(keys, by, cats):
        s = steps[skey == key] if skey is not None else steps.iloc[:0]
        n = nf[nkey == key] if nkey is not None else nf.iloc[:0]
        d = drafts[dkey == key]
        if by in REQUEST_KEYS:
            r = requests[rkey == key]
            n_req = len(r)
        else:
            r = None
            n_req = len(set(s["request"].tolist()) | set(d["request"].tolist()) |
                        set(n["request"].tolist()))
        g = _group_sums(k, s, d, r, len(n))
        if by in ("batch", "step-batch"):
            g["base_step_ns"] = base.get(int(key), float("nan"))
        groups.append(_group_dict(k, int(key), _label(by, key, context_bins, cats), n_req, g))
    if by == "batch" and len(requests):
        div = batch_divergence(run)
        base_b = int(requests["batch_size"].min())
        for g in groups:
            if g["key"] == base_b:
                continue
            part = div.xs(g["key"], level="batch") if g["key"] in div.index.get_level_values(
                "batch") else div.iloc[:0]
            same = part["first_token_diff"].isna()
            g["divergence"] = {"base": base_b, "requests": len(part),
                               "bits_equal": int(part["bits_equal"].sum()),
                               "same_tokens": int((same & ~part["bits_equal"]).sum()),
                               "parted": int((~same).sum())}
    all_g = _group_sums(k, steps, drafts, requests, len(nf))
    if by in ("batch", "step-batch") and len(groups) == 1:
        all_g["base_step_ns"] = groups[0]["base_step_ns"]
        all_g["base_step_ns"] = float("nan") if all_g["base_step_ns"] is None \
            else all_g["base_step_ns"]
    overhead = opts.get("trace_overhead")
    meta = run.meta
    status = run.sessions["status"].iloc[-1] if len(run.sessions) else "running"
    return {
        "file": run.path,
        "schema_version": int(meta.get("schema_version")),
        "by": by,
        "run": {
            "rule": meta.get("rule", ""), "k": k,
            "temperature": _num(meta.get("temperature", float("nan"))),
            "top_p": _num(meta.get("top_p", float("nan"))),
            "seed": int(meta.get("seed", 0)), "tool_version": meta.get("tool_version", ""),
            "git_commit": meta.get("git_commit", ""), "gpu_name": meta.get("gpu_name", ""),
            "sessions": len(run.sessions), "last_session_status": str(status),
            "trace_overhead": _num(overhead) if _is_num(overhead) else None,
            "trace_dropped": int(run.sessions["trace_dropped"].sum()) if len(run.sessions) else 0,
            "numerics": numerics(run),
            "pad_to_graph_sizes": pad_sizes(run),
            "dataset": dataset_skips(run),
            "load": load_info(run),
            "baseline": [{"batch_size": int(b["batch_size"]),
                          "steps": b["steps"] if _is_int(b.get("steps")) else 0,
                          "median_ns": _num(b["median_ns"]),
                          "mean_ns": _num(b["mean_ns"]) if _is_num(b.get("mean_ns")) else None,
                          "min_ns": _num(b["min_ns"]) if _is_num(b.get("min_ns")) else None}
                         for b in _baseline_entries(run)],
        },
        "rows": {
            "steps": len(steps) + run.dropped["steps"] * (not run.keep_unfinished) +
            run.dropped["undrafted_steps"] + run.dropped["nonfinite_steps"],
            "drafts": len(drafts) + run.dropped["drafts"] * (not run.keep_unfinished) +
            run.dropped["nonfinite_drafts"],
            "requests": len(requests),
            "dropped_steps": run.dropped["steps"], "dropped_drafts": run.dropped["drafts"],
            "undrafted_steps": run.dropped["undrafted_steps"],
            "nonfinite_steps": run.dropped["nonfinite_steps"],
            "nonfinite_drafts": run.dropped["nonfinite_drafts"],
            **ending_counts(run),
        },
        "groups": groups,
        "all": _group_dict(k, None, "all", len(requests), all_g),
    }


def summary(run, by="batch", context_bins=DEFAULT_CONTEXT_BINS):
    """The summary as a DataFrame: one row per group and a last row "all"."""
    d = summary_dict(run, by, context_bins)
    rows = []
    for g in d["groups"] + [d["all"]]:
        row = {by: g["label"], "requests": g["requests"], "steps": g["steps"],
               "drafts": g["drafts"]["rows"],
               "mean_acceptance_length": g["mean_acceptance_length"],
               "sglang_accept_length": g["sglang_accept_length"],
               "draft_acceptance_rate": g["draft_acceptance_rate"],
               "drafts_rate": g["drafts"]["rate"], "expected": g["drafts"]["expected"]}
        for p in g["positions"]:
            i = p["position"]
            row[f"joint_{i}"] = p["joint"]
            row[f"conditional_{i}"] = p["conditional"]
            row[f"expected_{i}"] = p["expected"]
        # Step times (ms) and the predicted speedup, as `draftscope summary` prints them; NaN
        # where the run was not traced or had no baseline.
        ms = lambda ns: float("nan") if ns is None else ns / 1e6
        row["draft_ms"] = ms(g.get("mean_draft_ns"))
        row["verify_ms"] = ms(g.get("mean_verify_ns"))
        row["base_step_ms"] = ms(g.get("base_step_ns"))
        sp = g.get("predicted_speedup")
        row["predicted_speedup"] = float("nan") if sp is None else sp
        rows.append(row)
    return pd.DataFrame(rows).set_index(by).astype(
        {c: float for c in rows[0] if c not in (by, "requests", "steps", "drafts")})


# ---------------------------------------------------------------------------------------------
# Per-request sums and the bootstrap.

def _row_terms(run, metric, position):
    """(table name, frame, numerator array, denominator array, constant) for a metric."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    table, num, den, const = METRICS[metric]
    if metric in ("joint", "conditional") and position is None:
        raise ValueError(f"metric {metric!r} needs position=i (1..K)")
    if position is not None and not 1 <= int(position) <= run.k:
        raise ValueError(f"position {position} outside 1..{run.k}")
    df = getattr(run, table)
    if table == "drafts" and position is not None:
        df = df[df["position"] == int(position)]
    n = len(df)
    if num == "at_least":
        numer = (df["accepted"].to_numpy() >= position).astype(np.float64)
    else:
        numer = df[num].to_numpy().astype(np.float64)
    if den == "one":
        denom = np.ones(n)
    elif den == "reached":
        denom = ((df["drafted"].to_numpy() >= position) &
                 (df["accepted"].to_numpy().astype(np.int64) >= position - 1)).astype(np.float64)
    elif den == "reached_draft":
        denom = _draft_reached(run, df).astype(np.float64)
        numer = numer * denom
    else:
        denom = df[den].to_numpy().astype(np.float64)
    return table, df, numer, denom, const


def request_sums(run, metric, by="batch", position=None, context_bins=DEFAULT_CONTEXT_BINS):
    """Per (request, group) sums of a metric's numerator and denominator.

    Returns (keys, labels, request ids, num[n_requests, n_groups], den[n_requests, n_groups],
    constant, request group index or None). For request-level keys each request lies in one group
    (its index is returned, so the bootstrap can resample within groups).
    """
    _check_by(by)
    table, df, numer, denom, const = _row_terms(run, metric, position)
    if table == "requests":
        if by not in REQUEST_KEYS:
            raise ValueError(f"metric {metric!r} is per request: group it by "
                             f"{', '.join(REQUEST_KEYS)}")
        rowkey = _request_key(run.requests, by)
    elif table == "steps" and by in DRAFT_ONLY_KEYS:
        raise ValueError(f"metric {metric!r} comes from steps, which have no {by}")
    else:
        if by in REQUEST_KEYS:
            rk = pd.Series(_request_key(run.requests, by),
                           index=run.requests["request"].to_numpy())
            rowkey = rk.reindex(df["request"].to_numpy()).to_numpy()
        elif by == "step-batch":
            rowkey = df["batch_size"].to_numpy().astype(np.int64)
        elif by == "context":
            rowkey = _context_bucket(df["context_len"].to_numpy(), context_bins)
        elif by == "position":
            rowkey = df["position"].to_numpy().astype(np.int64)
        else:
            rowkey = df["channel"].cat.codes.to_numpy().astype(np.int64)
    req_ids = run.requests["request"].to_numpy()
    req_index = pd.Series(np.arange(len(req_ids)), index=req_ids)
    ri = req_index.reindex(df["request"].to_numpy()).to_numpy()
    cats = _category_labels(run) if by == "category" else None
    if by in REQUEST_KEYS:
        req_key = _request_key(run.requests, by)
        keys = _sorted_keys(set(req_key.tolist()), by, cats)
    else:
        keys = _sorted_keys(set(np.asarray(rowkey).tolist()), by, cats)
    kpos = {key: j for j, key in enumerate(keys)}
    gi = np.array([kpos[x] for x in np.asarray(rowkey).tolist()], dtype=np.int64)
    n_req, n_g = len(req_ids), len(keys)
    num = np.zeros((n_req, n_g))
    den = np.zeros((n_req, n_g))
    if len(df):
        flat = ri.astype(np.int64) * n_g + gi
        num = np.bincount(flat, weights=numer, minlength=n_req * n_g).reshape(n_req, n_g)
        den = np.bincount(flat, weights=denom, minlength=n_req * n_g).reshape(n_req, n_g)
    group_of_request = None
    if by in REQUEST_KEYS:
        group_of_request = np.array([kpos[x] for x in req_key.tolist()], dtype=np.int64)
    labels = [_label(by, key, context_bins, cats) for key in keys]
    return keys, labels, req_ids, num, den, const, group_of_request


def _bootstrap_weights(rng, n_boot, members):
    """(n_boot, len(members)) counts of each member in a resample of len(members) of them."""
    m = len(members)
    if m == 0:
        return np.zeros((n_boot, 0))
    idx = rng.integers(0, m, size=(n_boot, m))
    flat = idx + (np.arange(n_boot) * m)[:, None]
    return np.bincount(flat.ravel(), minlength=n_boot * m).reshape(n_boot, m).astype(np.float64)


def _replicates(sums, n_boot, rng):
    """Bootstrap replicates (n_boot, n_groups) of a metric from request_sums' output."""
    keys, _, req_ids, num, den, const, group_of_request = sums
    n_g = len(keys)
    out = np.full((n_boot, n_g), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        if group_of_request is not None:
            # Request-level key: resample each group's own requests (its size stays fixed).
            for j in range(n_g):
                members = np.flatnonzero(group_of_request == j)
                w = _bootstrap_weights(rng, n_boot, members)
                out[:, j] = const + (w @ num[members, j]) / (w @ den[members, j])
        else:
            w = _bootstrap_weights(rng, n_boot, np.arange(len(req_ids)))
            out[:] = const + (w @ num) / (w @ den)
    return out


def _interval(reps, a, n_keys, n_boot):
    """The (a, 1 - a) quantiles of each column of the bootstrap replicates, ignoring NaN; NaN
    for a group with no replicate (none of its requests has a denominator, e.g. a channel whose
    drafts were never reached), without numpy's all-NaN warning, which the report printed."""
    if not n_keys or not n_boot:
        return np.full(n_keys, np.nan), np.full(n_keys, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(reps, a, axis=0), np.nanquantile(reps, 1 - a, axis=0)


def metric_ci(run, metric, by="batch", position=None, n_boot=1000, seed=0, level=0.95,
              context_bins=DEFAULT_CONTEXT_BINS):
    """A metric per group with a percentile bootstrap interval over requests (seeded).

    Returns a DataFrame indexed by group label: value, lo, hi, requests (requests with rows in the
    group), n (denominator: rows or drafted tokens).
    """
    sums = request_sums(run, metric, by, position, context_bins)
    keys, labels, _, num, den, const, _ = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        value = const + num.sum(axis=0) / den.sum(axis=0)
    reps = _replicates(sums, n_boot, np.random.default_rng(seed))
    a = (1 - level) / 2
    lo, hi = _interval(reps, a, len(keys), n_boot)
    return pd.DataFrame({
        by: labels, "value": value, "lo": lo, "hi": hi,
        "requests": (den > 0).sum(axis=0), "n": den.sum(axis=0),
    }).set_index(by)


def compare(run_a, run_b, metric, by="batch", position=None, n_boot=1000, seed=0, level=0.95,
            context_bins=DEFAULT_CONTEXT_BINS):
    """Compares a metric between two runs (two drafts, two aux-layer settings, ...).

    Each run's requests are resampled independently; the interval is the percentile interval of
    the replicate differences b - a. Returns a DataFrame indexed by the groups both runs have:
    a, b, diff, lo, hi.
    """
    sa = request_sums(run_a, metric, by, position, context_bins)
    sb = request_sums(run_b, metric, by, position, context_bins)
    rng = np.random.default_rng(seed)
    ra, rb = _replicates(sa, n_boot, rng), _replicates(sb, n_boot, rng)
    rows = []
    alpha = (1 - level) / 2
    for ja, label in enumerate(sa[1]):
        if label not in sb[1]:
            continue
        jb = sb[1].index(label)
        with np.errstate(invalid="ignore", divide="ignore"):
            va = sa[5] + sa[3][:, ja].sum() / sa[4][:, ja].sum()
            vb = sb[5] + sb[3][:, jb].sum() / sb[4][:, jb].sum()
        d = rb[:, jb] - ra[:, ja]
        d = d[~np.isnan(d)]
        lo, hi = (np.quantile(d, alpha), np.quantile(d, 1 - alpha)) if len(d) else (np.nan,) * 2
        rows.append({by: label, "a": va, "b": vb, "diff": vb - va, "lo": lo, "hi": hi})
    return pd.DataFrame(rows, columns=[by, "a", "b", "diff", "lo", "hi"]).set_index(by)


# ---------------------------------------------------------------------------------------------
# Helpers for plots and notebooks.

def per_position(run, by="batch", n_boot=200, seed=0):
    """Joint and conditional acceptance and mean expected acceptance per (group, position)."""
    rows = []
    for i in range(1, run.k + 1):
        j = metric_ci(run, "joint", by, position=i, n_boot=n_boot, seed=seed)
        c = metric_ci(run, "conditional", by, position=i, n_boot=n_boot, seed=seed)
        e = metric_ci(run, "expected_acceptance", by, position=i, n_boot=0, seed=seed)
        for label in j.index:
            rows.append({by: label, "position": i, "joint": j.at[label, "value"],
                         "joint_lo": j.at[label, "lo"], "joint_hi": j.at[label, "hi"],
                         "conditional": c.at[label, "value"], "conditional_lo": c.at[label, "lo"],
                         "conditional_hi": c.at[label, "hi"],
                         "expected": e["value"].get(label, np.nan)})
    return pd.DataFrame(rows)


def _draft_reached(run, d):
    """For rows d of run.drafts: whether each was evaluated (every earlier draft of its chain was
    accepted), from the step row of the same (step, request); in the order of d."""
    s = run.steps[["step", "request", "accepted"]].rename(columns={"accepted": "step_accepted"})
    m = d[["step", "request", "position"]].merge(s, on=["step", "request"], how="left")
    return (m["position"].astype(np.int64) <= m["step_accepted"].fillna(-1) + 1).to_numpy()


def reached_drafts(run):
    """run.drafts with a column `reached`: the draft was evaluated (every earlier draft of its
    chain was accepted), from the step row of the same (step, request)."""
    d = run.drafts
    s = run.steps[["step", "request", "accepted"]].rename(columns={"accepted": "step_accepted"})
    m = d.merge(s, on=["step", "request"], how="left")
    m["reached"] = _draft_reached(run, d)
    return m


def step_times(run, by="batch"):
    """Mean per-step phase times (ns) per group, one row per step (phase times are per step).

    Steps that were not timed (draft_ns and verify_ns both 0: a session run with --trace off)
    are left out, as the C summary leaves them out (docs/metrics.md, timed_steps)."""
    s = run.steps
    s = s[(s["draft_ns"].to_numpy() != 0) | (s["verify_ns"].to_numpy() != 0)]
    if not len(s):
        return pd.DataFrame(columns=["draft_ns", "verify_ns", "accept_ns", "total_ns"])
    col = "sweep_batch" if by == "batch" else "batch_size"
    one = s.drop_duplicates("step")
    return one.groupby(col)[["draft_ns", "verify_ns", "accept_ns", "total_ns"]].mean()


BITWISE_FIELDS = ("q_draft", "p_draft", "p_target", "margin", "expected_accept",
                  "entropy_target", "entropy_draft")


def _turn_drafts(run):
    """{(batch size, dataset_index, turn): that request's drafts in (step, position) order}."""
    d = run.drafts.sort_values(["request", "step", "position"], kind="stable")
    by_req = {int(r): g for r, g in d.groupby("request", sort=False)}
    out = {}
    for r in run.requests.itertuples():  # the first in file order where a turn repeats
        out.setdefault((int(r.batch_size), int(r.dataset_index), int(r.turn)),
                       by_req.get(int(r.request), d.iloc[:0]))
    return out


def _parting(a, b):
    """Where drafts b part from drafts a (see batch_divergence)."""
    n = min(len(a), len(b))
    fate = ["draft_token", "target_token", "accepted"]
    bad = np.flatnonzero((a[fate].to_numpy()[:n] != b[fate].to_numpy()[:n]).any(axis=1))
    first = int(bad[0]) if len(bad) else (n if len(a) != len(b) else np.nan)
    same_bits = len(a) == len(b) and not len(bad)
    for col in BITWISE_FIELDS:
        if same_bits:
            same_bits = bool((a[col].to_numpy(np.float32).view(np.uint32) ==
                              b[col].to_numpy(np.float32).view(np.uint32)).all())
    upto = n if np.isnan(first) else int(first)
    dp = np.abs(a["p_target"].to_numpy(np.float64)[:upto] -
                b["p_target"].to_numpy(np.float64)[:upto])
    dp = dp[~np.isnan(dp)]
    return {"drafts": len(b), "base_drafts": len(a), "first_token_diff": first,
            "bits_equal": same_bits, "max_abs_dp_target": float(dp.max()) if len(dp) else 0.0}


_DIVERGENCE_COLUMNS = ["batch", "dataset_index", "turn", "drafts", "base_drafts",
                       "first_token_diff", "bits_equal", "max_abs_dp_target"]


def _divergence_frame(rows):
    return pd.DataFrame(rows, columns=_DIVERGENCE_COLUMNS).set_index(
        ["batch", "dataset_index", "turn"]).sort_index()


def batch_divergence(run, base=None):
    """Each request replayed at another batch size against the same conversation turn at `base`
    (default: the smallest batch size of the run): where its drafts part ways.

    A request is matched by (dataset_index, turn); its drafts are compared in (step, position)
    order. With invariant numerics every request should equal its base bit for bit; with
    `run --numerics batch-variant` this shows how far numerics alone move each one. Returns a
    DataFrame indexed by (batch, dataset_index, turn) with: drafts and base_drafts (counts);
    first_token_diff (index of the first draft whose draft token, target token or acceptance
    differs, or where one side ends; NaN when the fates are equal); bits_equal (every field
    equal, the floats of BITWISE_FIELDS compared as bits, NaN equal to the same NaN); and
    max_abs_dp_target (the largest |p_target - base p_target| over the drafts before the first
    token difference: how far the probabilities moved while the tokens agreed).
    """
    sizes = sorted(int(b) for b in run.requests["batch_size"].unique())
    if not sizes:
        return _divergence_frame([])
    base = sizes[0] if base is None else int(base)
    if base not in sizes:
        raise ValueError(f"batch size {base} is not in the run (it has {sizes})")
    turns = _turn_drafts(run)
    rows = [{"batch": k[0], "dataset_index": k[1], "turn": k[2],
             **_parting(turns[(base, k[1], k[2])], v)}
            for k, v in turns.items() if k[0] != base and (base, k[1], k[2]) in turns]
    return _divergence_frame(rows)


def divergence(run_a, run_b):
    """Two runs of the same conversations (say one with `run --pad-to-graph-sizes`, one
    without, or two numerics): every request of run_b against the same batch size and
    conversation turn of run_a, with the columns of batch_divergence (base_drafts: run_a's).
    Turns only one of them finished are left out."""
    ta, tb = _turn_drafts(run_a), _turn_drafts(run_b)
    return _divergence_frame([{"batch": k[0], "dataset_index": k[1], "turn": k[2],
                               **_parting(ta[k], v)} for k, v in tb.items() if k in ta])
