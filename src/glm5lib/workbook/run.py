"""Run the workbook: every notebook in order with papermill, parameters from `params/<profile>.yaml`.

Each notebook NN_name.ipynb is executed into outputs/NN_name.ipynb; the values it records go to
outputs/reports/NN_name.json (GLM5LIB_REPORT); figures land in outputs/figures/. A failing notebook still leaves
its executed copy (papermill writes it on error) and fails the run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from glm5lib import paths
from glm5lib.errors import UserError
from glm5lib.workbook.record import REPORT_ENV

PROFILES = ("ci", "full")


def repo_root() -> Path:
    """The checkout (glm5lib.paths); the working directory for an installed package run inside a checkout."""
    root = paths.repo_root()
    return root if root is not None and (root / "notebooks").is_dir() else Path.cwd()


def notebooks(root: Path | None = None) -> list[Path]:
    root = root or repo_root()
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def load_params(profile: str, root: Path | None = None) -> dict[str, dict]:
    """{notebook stem or '_all': {param: value}} from params/<profile>.yaml."""
    root = root or repo_root()
    path = root / "params" / f"{profile}.yaml"
    if not path.exists():
        raise UserError(f"no parameter file for profile {profile!r} ({path})")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of notebook name to parameters")
    return data


def params_for(nb: Path, profile: str, params: dict[str, dict]) -> dict:
    merged = {"PROFILE": profile, "INTERACTIVE": False}
    merged.update(params.get("_all") or {})
    merged.update(params.get(nb.stem) or {})
    return merged


# Longest CI cell: training the tiny model on a cold cache (~3-4 min on 2 cores). A cell past this is a hang
# (seen once: a kernel reply lost between ipykernel and nbclient), reported instead of stalling CI for an hour.
CELL_TIMEOUT_S = 600


@dataclass
class NotebookResult:
    notebook: str
    output: Path
    report: Path
    seconds: float
    error: str | None = None
    timed_out: bool = False


def execute_notebook(nb: Path, profile: str = "ci", *, out_dir: Path | None = None,
                     extra_params: dict | None = None, root: Path | None = None,
                     kernel_name: str = "python3", cell_timeout_s: int | None = CELL_TIMEOUT_S) -> NotebookResult:
    """Execute one notebook with papermill; its report path is set through GLM5LIB_REPORT."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError

    root = root or repo_root()
    out_dir = Path(out_dir) if out_dir else root / "outputs"
    (out_dir / "reports").mkdir(parents=True, exist_ok=True)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    output = out_dir / nb.name
    report = out_dir / "reports" / f"{nb.stem}.json"
    if report.exists():
        report.unlink()  # a stale report must not pass for a fresh run
    parameters = params_for(nb, profile, load_params(profile, root))
    parameters.update(extra_params or {})
    old = os.environ.get(REPORT_ENV)
    os.environ[REPORT_ENV] = str(report)
    t0 = time.perf_counter()
    error, timed_out = None, False
    try:
        pm.execute_notebook(str(nb), str(output), parameters=parameters, cwd=str(root), kernel_name=kernel_name,
                            progress_bar=False, request_save_on_cell_execute=True, execution_timeout=cell_timeout_s)
    except pm.PapermillExecutionError as exc:
        error = f"{exc.ename}: {exc.evalue}"
    except CellTimeoutError as exc:
        error, timed_out = f"cell timed out after {cell_timeout_s} s: {exc}".splitlines()[0], True
    finally:
        if old is None:
            os.environ.pop(REPORT_ENV, None)
        else:
            os.environ[REPORT_ENV] = old
    return NotebookResult(nb.stem, output, report, time.perf_counter() - t0, error, timed_out)


def run_workbook(profile: str = "ci", *, only: list[str] | None = None, out_dir: Path | None = None,
                 overrides: dict | None = None) -> list[NotebookResult]:
    """Execute the notebooks (those whose name starts with one of `only`) in order; `overrides` (parameter ->
    value) replace the profile's values in each of them."""
    if profile not in PROFILES:
        raise UserError(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
    nbs = notebooks()
    if not nbs:
        raise UserError(f"no notebooks found under {repo_root() / 'notebooks'}")
    if only:
        nbs = [nb for nb in nbs if any(nb.stem.startswith(o) for o in only)]
        if not nbs:
            raise UserError(f"no notebook matches {', '.join(only)}")
    if out_dir is not None:  # the output directory is a workspace, re-written by every run; it must be one
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise UserError(f"{out_dir}: exists and is not a directory")
        if not out_dir.exists() and not out_dir.parent.is_dir():
            raise UserError(f"{out_dir}: directory {out_dir.parent} does not exist (create it first)")
    results = []
    for nb in nbs:
        print(f"[workbook] {nb.name} ({profile}) ...", flush=True)
        res = execute_notebook(nb, profile, out_dir=out_dir, extra_params=overrides)
        status = "ok" if res.error is None else f"FAILED ({res.error})"
        print(f"[workbook] {nb.name}: {status} in {res.seconds:.1f} s -> {res.output}", flush=True)
        results.append(res)
    return results
