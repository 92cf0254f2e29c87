"""The fp8-cache sparse-MLA kernel taken apart: tables and a figure from H200 runs of `scripts/fp8mma_device.py
--ablate` (no GPU needed to read them).

Each run times, per shape and build, three launches on the same rows and split plan
(`kernels.mla_gluon_fp8mma.ablate_launch`):
- whole: the kernel and its split merge;
- gathers: the kernel's own gathers alone, on its ring, schedule and thread mapping, at its programs per SM;
- compute: the kernel with every ring slot gathered once before the loop, so that it computes on rows already in
  shared memory, at its programs per SM;
and, once per run, the fastest gather route of the same rows (`bench.gather.ceiling_rows`: rows gathered with
nothing after them). The whole kernel can be no faster than either part, and no slower than the two one after the
other; where it lies between says how much of the shorter part it hides (`overlap`).
"""

from __future__ import annotations

import json
from pathlib import Path

from glm5lib.paths import bench_dir

# the committed runs (outputs/bench/sweeps), oldest first: the row-thread sweep, the ring / tile / class builds at
# 8 threads, the register caps
RUNS = ("fp8mma_ablate_h200_bc8f6e0.json", "fp8mma_ablate_h200_6e4488e.json", "fp8mma_ablate_caps_h200_bffb462.json")
SHAPES = (("decode", 32, 8), ("decode", 128, 8), ("prefill", 4096, 8),
          ("decode", 32, 16), ("decode", 128, 16), ("prefill", 4096, 16))
PARTS = ("gathers", "compute", "whole")


def run_path(name: str) -> Path:
    """A committed run's path (outputs/bench/sweeps/<name>)."""
    root = bench_dir()
    if root is None:
        raise FileNotFoundError("no checkout: the committed H200 runs live under outputs/bench/sweeps")
    return root / "sweeps" / name


def load_run(path: str | Path) -> dict:
    """{"commit", "parts": {(kind, tokens, heads, config): row}, "gather": {(kind, tokens): us}} of one run; rows
    whose launch failed keep their error fields and lack the failed part's time."""
    res = json.loads(Path(path).read_text())
    parts = {(r["kind"].removeprefix("ablate-"), r["B"], r["H"], r["config"]): r
             for r in res["rows"] if r.get("kind", "").startswith("ablate-") and "config" in r}
    gather = {(r["case"], r["T"]): r["us"] for r in res["rows"]
              if r.get("kind") == "gather-ceiling" and r.get("impl") == "best-gather" and "us" in r
              and r.get("kv_format") == "fp8_ds_mla"}
    if not parts:
        raise ValueError(f"{path}: no ablation rows (a run of scripts/fp8mma_device.py --ablate?)")
    return {"commit": res["meta"].get("commit"), "parts": parts, "gather": gather}


def overlap(row: dict) -> float | None:
    """(gathers + compute - whole) / min(gathers, compute): 1 when the shorter part is hidden entirely, 0 when the
    parts run one after the other; None where a part is missing."""
    try:
        g, c, w = row["gathers_us"], row["compute_us"], row["whole_us"]
    except KeyError:
        return None
    return (g + c - w) / min(g, c)


def table(run: dict) -> str:
    """Markdown: every shape and build of a run, its three times, the overlap and the fastest gather route."""
    lines = [f"run {run['commit']}",
             "| case | tokens | heads | build | splits | gathers us | compute us | whole us | overlap | fastest gather us |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, T, H, cfg), r in sorted(run["parts"].items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        def us(p):
            return f"{r[p + '_us']:.1f}" if p + "_us" in r else "-"
        ov = overlap(r)
        best = run["gather"].get((kind, T))
        lines.append(f"| {kind} | {T} | {H} | {cfg} | {r.get('splits', '-')} | {us('gathers')} | {us('compute')} | "
                     f"{us('whole')} | {'-' if ov is None else f'{ov:.2f}'} | {'-' if best is None else f'{best:.1f}'} |")
    return "\n".join(lines)


def plot(run: dict, png_path: str | Path, configs: list[str] | None = None) -> Path:
    """One panel per shape (`SHAPES`): per build the gathers alone, the compute alone and the whole kernel, the
    fastest gather route of the same rows as a dashed line."""
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()
    configs = configs or list(dict.fromkeys(k[3] for k in run["parts"]))  # the run's own order
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, (kind, T, H) in zip(axes.flat, SHAPES):
        have = [c for c in configs if (kind, T, H, c) in run["parts"]]
        for j, part in enumerate(PARTS):
            ys = [run["parts"][kind, T, H, c].get(part + "_us", float("nan")) for c in have]
            ax.bar([i + (j - 1) * 0.27 for i in range(len(have))], ys, 0.27, label=f"{part}" + (" alone" if
                   part != "whole" else " kernel"), color=f"C{j}")
        best = run["gather"].get((kind, T))
        if best is not None:
            ax.axhline(best, color="k", ls="--", lw=1, label="fastest gather route of these rows")
        ax.set_xticks(range(len(have)), [c.removeprefix("fp8mma-") for c in have], rotation=30, fontsize=7,
                      ha="right")
        ax.set_ylabel("us")
        ax.set_title(f"{kind} {'B' if kind == 'decode' else 's_q '}{T}, {H} heads", fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, ncol=4)
    fig.suptitle(f"fp8-cache sparse MLA taken apart, H200, top-k 2048 (run {run['commit']}; -t<n>: n threads a "
                 "gathered row, none: one a warp)", x=0.02, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save_figure(fig, png_path)


__all__ = ["RUNS", "SHAPES", "PARTS", "run_path", "load_run", "overlap", "table", "plot"]
