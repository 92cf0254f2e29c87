"""Figures for notebooks and commands: one way to get pyplot and one way to write a PNG."""

from __future__ import annotations

import os
from pathlib import Path


def pyplot():
    """matplotlib.pyplot; headless (Agg) unless a display or a notebook's inline backend is there to keep."""
    import matplotlib

    if not os.environ.get("DISPLAY") and "inline" not in matplotlib.get_backend():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 110, close: bool = True, **savefig_kw) -> Path:
    """Write `fig` as PNG through a temporary file renamed when complete (never a half-written figure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix or '.png'}")
    fig.savefig(tmp, dpi=dpi, **savefig_kw)
    os.replace(tmp, path)
    if close:
        pyplot().close(fig)
    return path
