"""One self-contained HTML page for a run: its settings, the summary table and every plot, with
the images embedded as base64 PNGs (the page needs no other file)."""
import base64
import datetime
import html
import io

import matplotlib.pyplot as plt

from . import metrics, plots

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0 1.5em; }
.note { color: #555; font-size: 0.9em; }
"""

SETTINGS = ["tool_version", "git_commit", "command_line", "gpu_name", "driver_version",
            "cuda_version", "target_path", "draft_path", "dataset_path", "rule", "k",
            "temperature", "top_p", "seed", "batch_sizes", "trace_level", "options_json"]


def figure_png(fig):
    """PNG bytes of a figure (closes it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _table(df, index_label):
    head = f"<tr><th class='l'>{html.escape(index_label)}</th>" + "".join(
        f"<th>{html.escape(str(c))}</th>" for c in df.columns) + "</tr>"
    body = []
    for idx, row in df.iterrows():
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("-" if v != v else f"{v:.4f}")
            else:
                cells.append(html.escape(str(v)))
        body.append(f"<tr><td class='l'>{html.escape(str(idx))}</td>" +
                    "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<table>" + head + "".join(body) + "</table>"


def build_html(run, n_boot=200, seed=0):
    """The report page as a string."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>draftscope: "
             f"{html.escape(run.path)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>draftscope run report</h1><p class='note'>{html.escape(run.path)} — "
             f"generated {datetime.datetime.now().isoformat(timespec='seconds')}</p>",
             "<h2>Settings</h2><table>"]
    for key in SETTINGS:
        if key in run.meta:
            parts.append(f"<tr><th class='l'>{key}</th><td class='l'>"
                         f"{html.escape(str(run.meta[key]))}</td></tr>")
    parts.append("</table>")
    if len(run.sessions):
        s = run.sessions[["session", "status", "trace_level", "trace_overhead"]]
        parts.append("<h2>Writer sessions</h2>" + _table(s.set_index("session"), "session"))
    ends = metrics.ending_counts(run)
    n_err, n_err_prompt = ends["error_requests"], ends["error_requests_at_prompt"]
    n_q = ends["nonfinite_q_drafts"]
    stops = ", ".join(f"{name} {n}" for name, n in ends["stop_reasons"].items() if n)
    parts.append(f"<p class='note'>{len(run.steps)} verify-step rows, {len(run.drafts)} drafted "
                 f"tokens, {len(run.requests)} finished requests; left out (request not "
                 f"finished): {run.dropped['steps']} step rows, {run.dropped['drafts']} "
                 f"drafts; {run.dropped['undrafted_steps']} steps that drafted nothing "
                 f"(one position short of the context limit: no verify step); "
                 f"{run.dropped['nonfinite_steps']} steps with non-finite verify logits and "
                 f"their {run.dropped['nonfinite_drafts']} drafts (they verified nothing); "
                 f"{n_err} requests ended with error (non-finite target logits), {n_err_prompt} "
                 f"of them at the prompt, before any step; {n_q} drafted tokens without a finite "
                 f"draft probability (the draft's logits held NaN or Inf: their expected "
                 f"acceptance is undefined, their acceptance counted). Requests by stop reason: "
                 f"{html.escape(stops) if stops else 'none'}.</p>")
    skips = metrics.dataset_skips(run)
    if skips and skips["skipped_empty"] + skips["skipped_malformed"]:
        n = skips["skipped_empty"] + skips["skipped_malformed"]
        first = f"; the first: {skips['first_skip']}" if skips["first_skip"] else ""
        parts.append(f"<p class='note'>Dataset: {n} of the {skips['records_read']} records read "
                     f"{'was' if n == 1 else 'were'} skipped ({skips['skipped_empty']} empty, "
                     f"{skips['skipped_malformed']} malformed){html.escape(first)}.</p>")
    if metrics.numerics(run) != "invariant":
        parts.append("<p class='note'>Numerics: batch-variant (each call's attention split "
                     "follows its size, as in flash-decoding engines): acceptance may differ "
                     "between batch sizes through numerics alone.</p>")
    div = metrics.batch_divergence(run) if run.requests["batch_size"].nunique() > 1 else None
    if div is not None and len(div):
        base = int(run.requests["batch_size"].min())
        lines = []
        for b, g in div.groupby(level="batch"):
            parted = g["first_token_diff"].notna()
            lines.append(f"B {b}: {len(g)} requests, {int(g['bits_equal'].sum())} bit for bit "
                         f"equal, {int((~g['bits_equal'] & ~parted).sum())} with other "
                         f"probabilities but the same tokens, {int(parted.sum())} whose tokens "
                         f"part")
        parts.append(f"<p class='note'>Each request against the same conversation turn at B "
                     f"{base} (batch_divergence, docs/metrics.md): {html.escape('; '.join(lines))}"
                     f".</p>")
    load = metrics.load_info(run)
    if load:
        def _one(name, e):
            gb = e["bytes"] / 1e9
            if not e["uploaded"]:
                return f"{name} {gb:.3f} GB mapped in place ({e['seconds']:.3g} s)"
            rate = f" ({gb / e['seconds']:.2f} GB/s)" if e["seconds"] > 0 else ""
            return f"{name} {gb:.3f} GB in {e['seconds']:.3g} s{rate}"
        parts.append(f"<p class='note'>Weights (the creating run's load): "
                     f"{_one('target', load['target'])}; {_one('draft', load['draft'])}.</p>")
    parts.append("<h2>Summary by batch size</h2><p class='note'>τ = mean acceptance length "
                 "(vLLM/EAGLE, 1 + accepted/steps); SGLang = completion tokens/verify steps; "
                 "draft rate = accepted/drafted; joint_i = P(accepted ≥ i); conditional_i = "
                 "n-α; expected = mean Σ min(p, q). Definitions: docs/metrics.md.</p>")
    if len(run.requests):
        table = metrics.summary(run, "batch")
        parts.append(_table(table, "batch"))
        tau = metrics.metric_ci(run, "mean_acceptance_length", "batch", n_boot=n_boot, seed=seed)
        tau.columns = ["τ", "95% lo", "95% hi", "requests", "steps"]
        parts.append(f"<p class='note'>τ with bootstrap intervals over requests ({n_boot} "
                     f"resamples, seed {seed}):</p>" + _table(tau, "batch"))
    else:
        parts.append("<p>No finished request yet.</p>")
    parts.append("<h2>Plots</h2>")
    for title, fn in plots.ALL:
        png = base64.b64encode(figure_png(fn(run))).decode("ascii")
        parts.append(f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' "
                     f"src='data:image/png;base64,{png}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(run, out_path, n_boot=200, seed=0):
    """Writes the report page to out_path."""
    page = build_html(run, n_boot=n_boot, seed=seed)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(page)
    return out_path
