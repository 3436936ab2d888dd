"""The notebooks run top to bottom (nbclient, a fresh kernel) and are stored without outputs."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"01_quickstart.ipynb", "02_attention_explained.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, (
                f"{path.name}: outputs are committed; strip them (make strip-notebooks)")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("QUICKSTART_IMAGES", "200")  # a third of the quickstart's data, 3 epochs: the
    monkeypatch.setenv("QUICKSTART_EPOCHS", "3")  # cells run top to bottom, the captions need not be good
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    if path.stem.startswith("01"):
        captions = json.loads((tmp_path / "work" / "captions" / "captions.json").read_text())
        assert captions and all("error" not in e for e in captions)
