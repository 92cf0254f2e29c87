"""Where glm5lib finds and puts things, independent of the working directory.

- `repo_root()`: the source checkout this package runs from (None for an installed wheel), so notebooks run from
  `notebooks/` (as `make lab` starts them) find `outputs/bench/` like scripts run from the root do.
- `cache_dir()`: what the workbench builds from its own code (the tiny models, llama.cpp's tool, vLLM 0.33's
  sources): `$GLM5LIB_CACHE` if set, else `.cache/` of the checkout, else the user cache directory. Kept beside
  the checkout because its recipe is the checkout's code (each worktree or branch gets the tiny model its code
  builds) and tests, notebooks and CI read it constantly.
- `model_cache_dir()`: what glm5lib derives from a user's own model files (the vLLM model directories `serve`
  prepares for a GGUF): `$GLM5LIB_CACHE` if set, else the user cache directory (XDG), never the source tree: they
  belong to the model file, not to a checkout, and a checkout may be read-only or shared.
- `bench_dir()`: committed GPU results (`outputs/bench` of the checkout).
- `outputs_dir()`, `resolve()`: notebook outputs and relative paths, anchored at the checkout.
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


def model_cache_dir() -> Path:
    """$GLM5LIB_CACHE, else the user cache directory (never the checkout)."""
    env = os.environ.get("GLM5LIB_CACHE")
    return Path(env) if env else user_cache_dir()


def resolve(path: str | os.PathLike) -> Path:
    """`path` itself if absolute, else relative to the checkout root (the working directory outside a checkout):
    a notebook run from `notebooks/` (JupyterLab) and one run from the root (papermill) name the same file."""
    p = Path(path).expanduser()
    root = repo_root()
    return p if p.is_absolute() or root is None else root / p


def outputs_dir() -> Path:
    """<checkout>/outputs (executed notebooks, figures, reports, logs); ./outputs outside a checkout."""
    return resolve("outputs")


def bench_dir() -> Path | None:
    """<checkout>/outputs/bench (committed GPU evidence), None outside a checkout."""
    root = repo_root()
    return root / "outputs" / "bench" if root is not None else None
