"""Every notebook executes under papermill with the CI profile, and the values it records are asserted
(the assertions for notebook NN live in tests/nbchecks/nbNN.py)."""

import importlib
import json
from pathlib import Path

import jupytext
import nbformat
import pytest

from glm5lib.workbook import read_report
from glm5lib.workbook.run import execute_notebook, notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebooks(ROOT)


def run(nb, **kw):
    """Execute once more only when a cell hung past the runner's timeout (a lost kernel message, seen once in
    CI); any error or failed assertion counts at the first run."""
    result = execute_notebook(nb, "ci", **kw)
    if result.timed_out:
        print(f"{nb.name}: {result.error}; running it again")
        result = execute_notebook(nb, "ci", **kw)
    return result


def test_every_notebook_has_a_check_and_a_pair():
    assert [nb.stem[:2] for nb in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06"]
    for nb in NOTEBOOKS:
        assert nb.with_suffix(".py").exists(), f"{nb.name} has no paired py:percent file"
        assert (ROOT / "tests" / "nbchecks" / f"nb{nb.stem[:2]}.py").exists()


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped_paired_and_parameterised(nb):
    book = nbformat.read(nb, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "outputs must be stripped"
    assert "parameters" in code[0].metadata.get("tags", []), "first code cell must be tagged parameters"
    assert "INTERACTIVE" in code[0].source and "PROFILE" in code[0].source
    text = jupytext.read(nb.with_suffix(".py"))
    assert [c.source for c in text.cells] == [c.source for c in book.cells], "ipynb and py:percent differ: jupytext --sync"


@pytest.mark.slow  # 03 trains the tiny model, 05 starts a vLLM server
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_records_checked_values(nb):
    result = run(nb, out_dir=ROOT / "outputs")
    assert result.output.exists(), "the executed notebook must be kept, also on failure"
    assert result.error is None, f"{nb.name} failed: {result.error} (see {result.output})"
    report = read_report(result.report)
    check = importlib.import_module(f"nbchecks.nb{nb.stem[:2]}").check
    check(report)
    json.dumps(report)  # the report stays machine readable


# Notebook 03's interact() cell: twice in clean-clone CI runs (never when run alone) nbclient waited forever for
# a reply the idle kernel had sent, when it ran after the other notebooks in one pytest process. It runs in
# JupyterLab instead, as users meet it (tests/test_lab.py, every notebook's INTERACTIVE path in a real browser).
FLAKY_UNDER_NBCLIENT = {"03_dsa_indexer"}
INTERACTIVE_NOTEBOOKS = [
    pytest.param(nb, marks=pytest.mark.skip(reason="nbclient hang on its interact() cell, see FLAKY_UNDER_NBCLIENT"))
    if nb.stem in FLAKY_UNDER_NBCLIENT else nb
    for nb in NOTEBOOKS if "if INTERACTIVE:" in nb.with_suffix(".py").read_text()
]


@pytest.mark.slow
@pytest.mark.parametrize("nb", INTERACTIVE_NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_widget_path_runs(nb, tmp_path):
    """The JupyterLab path (ipywidgets behind INTERACTIVE=True) builds its widgets without error."""
    result = run(nb, out_dir=tmp_path, extra_params={"INTERACTIVE": True})
    assert result.error is None, f"{nb.name} with INTERACTIVE=True failed: {result.error}"
