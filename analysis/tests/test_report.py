"""`python -m draftscope report`: one self-contained HTML page whose images are real PNGs."""
import base64
import re
import struct
import subprocess
import sys

import pytest

from draftscope import plots


def _pngs(html):
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([^']+)'", html)]


def _png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("which", ["sample", "untraced", "killed"])
def test_report(samples, tmp_path, which):
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "draftscope", "report", str(samples[which]), "-o",
                        str(out), "--bootstrap", "50"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    # Self-contained: no reference to another file.
    assert not re.search(r"(src|href)=['\"](?!data:)", html)
    images = _pngs(html)
    assert len(images) == len(plots.ALL)
    for png in images:
        w, h = _png_size(png)
        assert w >= 300 and h >= 200 and len(png) > 5000
    assert "rule" in html and "greedy" in html
    if which == "sample":
        assert "Summary by batch size" in html and "<td class='l'>8</td>" in html
        # Conversation 6 ends with a non-finite verify step at each of the 3 batch sizes: its
        # requests ended with error after steps; the draft's probabilities are all finite.
        assert ("3 requests ended with error (non-finite target logits), 0 of them at the "
                "prompt") in html
        assert "; 0 drafted tokens without a finite draft probability" in html
        assert "Requests by stop reason: " in html and "error 3" in html
        # The dataset records the run skipped (options_json.dataset of the traced sample).
        assert ("Dataset: 3 of the 40 records read were skipped (1 empty, 2 malformed); the "
                "first: questions.jsonl: line 7: record 6: invalid JSON: &#x27;]&#x27; "
                "expected.") in html  # the message's quotes escaped
        # Its batch sizes 1, 4 and 8 replay the same questions with random drafts: every request
        # at B 4 and 8 parts from its B 1 twin.
        assert "Each request against the same conversation turn at B 1 (batch_divergence" in html
        for b, n in ((4, 13), (8, 12)):
            assert (f"B {b}: {n} requests, 0 bit for bit equal, 0 with other probabilities but "
                    f"the same tokens, {n} whose tokens part") in html
        # options_json.load of the traced sample: 65.25 GB in 1.5 s, 1.93 GB in 0.125 s.
        assert ("Weights (the creating run's load): target 65.250 GB in 1.5 s (43.50 GB/s); "
                "draft 1.930 GB in 0.125 s (15.44 GB/s).") in html
    else:
        assert "records read" not in html and "Weights (" not in html
    if which == "killed":
        assert "No finished request yet" in html


def test_report_refuses_a_bad_file(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_text("x")
    r = subprocess.run([sys.executable, "-m", "draftscope", "report", str(bad), "-o",
                        str(tmp_path / "r.html")], capture_output=True, text=True)
    assert r.returncode == 1
    assert "bad.h5: not an HDF5 file" in r.stderr


def test_report_shows_file_text_as_text(samples, tmp_path):
    """A rule with '$' in it is shown as it is: matplotlib read it as mathtext and the report
    failed with a pyparsing traceback. The HTML escapes it too."""
    import shutil

    import h5py
    path = tmp_path / "math.h5"
    shutil.copy(samples["sample"], path)
    with h5py.File(path, "r+") as f:
        f.attrs["rule"] = "$\\frac$ <b>"
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "draftscope", "report", str(path), "-o", str(out),
                        "--bootstrap", "20"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "$\\frac$ &lt;b&gt;" in out.read_text(encoding="utf-8")
