"""Where glm5lib finds and puts things, independent of the working directory.

- `repo_root()`: the source checkout this package runs from (None for an installed wheel), so notebooks run from
  `notebooks/` (as `make lab` starts them) find `outputs/bench/` like scripts run from the root do.
- `cache_dir()`: rebuildable files (the tiny model, prepared vLLM model directories, built tools):
  `$GLM5LIB_CACHE` if set, else `.cache/` of the checkout, else the user cache directory (XDG).
- `bench_dir()`: committed GPU results (`outputs/bench` of the checkout).
"""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout holding this package (src layout: <root>/src/glm5lib), or None when installed elsewhere."""
    root = _PKG.parents[1]
    return root if (root / "pyproject.toml").exists() and (root / "src" / "glm5lib").is_dir() else None


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/glm5lib (~/.cache/glm5lib)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "glm5lib"


def cache_dir() -> Path:
    """$GLM5LIB_CACHE, else <checkout>/.cache, else the user cache directory."""
    env = os.environ.get("GLM5LIB_CACHE")
    if env:
        return Path(env)
    root = repo_root()
    return root / ".cache" if root is not None else user_cache_dir()


def bench_dir() -> Path | None:
    """<checkout>/outputs/bench (committed GPU evidence), None outside a checkout."""
    root = repo_root()
    return root / "outputs" / "bench" if root is not None else None
