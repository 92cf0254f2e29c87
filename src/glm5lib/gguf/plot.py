"""Figures of GGUF contents (matplotlib, saved to files; no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_bytes_per_block(summary: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Stacked bars: tensor bytes per block, one colour per tensor type. `summary` is `inspect.summarize`'s."""
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()
    blocks = list(summary["blocks"])
    types = sorted({t for b in summary["blocks"].values() for t in b["types"]})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(blocks) + 2), 3.5))
    bottom = [0.0] * len(blocks)
    for t in types:
        mib = [summary["blocks"][b]["types"].get(t, 0) / 2**20 for b in blocks]
        ax.bar(range(len(blocks)), mib, bottom=bottom, label=t)
        bottom = [x + y for x, y in zip(bottom, mib)]
    step = max(1, len(blocks) // 20)
    ax.set_xticks(range(0, len(blocks), step), blocks[::step], rotation=90 if len(blocks) > 20 else 0)
    ax.set_xlabel("block")
    ax.set_ylabel("MiB")
    ax.set_title(title or f"{summary['arch']}: tensor bytes per block")
    ax.legend(title="type")
    fig.tight_layout()
    return save_figure(fig, path)
