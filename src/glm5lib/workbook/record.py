"""`record(name, value)` for notebooks, and the reader tests use.

papermill dropped `pm.record`/`read_notebook`, so values go to a JSON report beside the executed notebook:
`$GLM5LIB_REPORT` (set by the workbook runner) or `<checkout>/outputs/reports/<notebook>.json`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from glm5lib.paths import outputs_dir

REPORT_ENV = "GLM5LIB_REPORT"


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy / torch
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan
    if isinstance(value, Path):
        return str(value)
    return value


def report_path(default_name: str = "interactive") -> Path:
    env = os.environ.get(REPORT_ENV)
    return Path(env) if env else outputs_dir() / "reports" / f"{default_name}.json"


def record(name: str, value: Any, *, path: str | Path | None = None) -> Any:
    """Store `value` under `name` in the notebook's JSON report (read-modify-write, atomic rename)."""
    target = Path(path) if path else report_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(target.read_text()) if target.exists() else {}
    data[name] = _jsonable(value)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, target)
    return value


def read_report(path: str | Path) -> dict[str, Any]:
    """The values a notebook recorded."""
    return json.loads(Path(path).read_text())
