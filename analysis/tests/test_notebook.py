"""analysis/examples/acceptance.ipynb runs from start to end on a sample run file."""
import os

import nbformat
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOK = os.path.join(ROOT, "analysis", "examples", "acceptance.ipynb")


def test_notebook_executes(samples, monkeypatch):
    monkeypatch.setenv("DRAFTSCOPE_RUN", str(samples["sample"]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Outputs are not committed: the notebook in the repository is clean.
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = " ".join(str(o.get("data", {}).get("text/plain", "")) + o.get("text", "")
                    for o in outputs)
    assert "mean_acceptance_length" in text and "<draftscope.Run" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 7


def test_notebook_is_valid():
    nbformat.validate(nbformat.read(NOTEBOOK, as_version=4))
