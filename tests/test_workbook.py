"""Workbook plumbing: record/read_report, and a failing notebook keeps its executed copy and fails the run."""

import math

import nbformat
import pytest

from glm5lib.workbook import read_report, record
from glm5lib.workbook import run as wb
from glm5lib.cli import main


def test_record_round_trips_and_sanitises(tmp_path):
    path = tmp_path / "r.json"
    record("a", 1.5, path=path)
    record("b", {"x": [1, 2], "inf": math.inf}, path=path)
    assert read_report(path) == {"a": 1.5, "b": {"x": [1, 2], "inf": "inf"}}


def _book(root, name, source):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("PROFILE = 'x'\nINTERACTIVE = False")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(source)]
    (root / "notebooks").mkdir(exist_ok=True)
    nbformat.write(nb, root / "notebooks" / name)


@pytest.fixture
def root(tmp_path, monkeypatch):
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "ci.yaml").write_text("_all: {}\n")
    _book(tmp_path, "01_ok.ipynb", "from glm5lib.workbook import record\nrecord('profile', PROFILE)")
    _book(tmp_path, "02_fails.ipynb", "raise RuntimeError('planted failure')")
    monkeypatch.setattr(wb, "repo_root", lambda: tmp_path)
    return tmp_path


def test_failing_notebook_keeps_its_executed_copy_and_fails_the_command(root, capsys):
    assert main(["workbook", "--profile", "ci"]) == 1
    out = capsys.readouterr().out
    assert "01_ok.ipynb: ok" in out and "planted failure" in out and "1 passed, 1 failed" in out
    assert read_report(root / "outputs" / "reports" / "01_ok.json") == {"profile": "ci"}
    executed = nbformat.read(root / "outputs" / "02_fails.ipynb", as_version=4)
    assert any(o.get("ename") == "RuntimeError" for c in executed.cells for o in c.get("outputs", []))


def test_unknown_notebook_is_a_user_error(root, capsys):
    assert main(["workbook", "--only", "99"]) == 2
    assert capsys.readouterr().err.startswith("error: no notebook matches 99")


def test_a_hung_cell_is_reported_as_a_timeout_not_a_stall(root):
    _book(root, "03_hangs.ipynb", "import time\ntime.sleep(60)")
    result = wb.execute_notebook(root / "notebooks" / "03_hangs.ipynb", "ci", root=root, out_dir=root / "outputs",
                                 cell_timeout_s=3)
    assert result.timed_out and "timed out" in result.error and result.seconds < 45
    assert result.output.exists()


def test_parameters_from_the_command_line_reach_the_notebooks_run(root, capsys):
    _book(root, "03_also.ipynb", "from glm5lib.workbook import record\nrecord('interactive', INTERACTIVE)")
    assert main(["workbook", "--only", "01", "03", "-p", "PROFILE", "[1, two]", "-p", "INTERACTIVE", "true"]) == 0
    assert read_report(root / "outputs" / "reports" / "01_ok.json") == {"profile": [1, "two"]}
    assert read_report(root / "outputs" / "reports" / "03_also.json") == {"interactive": True}
    assert not (root / "outputs" / "02_fails.ipynb").exists()  # --only: the others are not run
    assert main(["workbook", "-p", "not a name", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: -p not a name: ")


def test_workbook_help_explains_the_profiles(capsys):
    with pytest.raises(SystemExit):
        main(["workbook", "--help"])
    out = capsys.readouterr().out
    assert "params/<profile>.yaml" in out and "ci " in out and "full " in out and "-p NAME VALUE" in out
