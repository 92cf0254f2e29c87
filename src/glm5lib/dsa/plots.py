"""Figures for notebook 03 (matplotlib, Agg-safe). Each function takes measured values and returns the figure;
`save` writes it to outputs/figures/ atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from glm5lib.dsa import cost
from glm5lib.plotting import pyplot, save_figure


def _plt():
    return pyplot()


def save(fig, name: str, out_dir: str | Path = "outputs/figures") -> Path:
    """Kept open: notebook 03 shows the figure after saving it."""
    return save_figure(fig, Path(out_dir) / f"{name}.png", bbox_inches="tight", close=False)


def recall_curves(by_x: dict[int, dict[int, float]], xlabel: str, title: str, oracle=None):
    """by_x: {x: {layer: recall}} -> one line per layer (and the oracle's dashed, if given)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = sorted(by_x)
    layers = sorted({layer for v in by_x.values() for layer in v})
    for layer in layers:
        line, = ax.plot(xs, [by_x[x].get(layer, np.nan) for x in xs], marker="o", label=f"layer {layer}")
        if oracle is not None:
            ax.plot(xs, [oracle[x].get(layer, np.nan) for x in xs], ls="--", color=line.get_color(), alpha=0.6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("attention mass kept by top-k")
    lows = [v for d in list(by_x.values()) + list((oracle or {}).values()) for v in d.values() if v == v]
    ax.set_ylim(max(0.0, min(lows, default=0.0) - 0.05), 1.005)
    ax.set_title(title + (" (dashed: best possible k keys)" if oracle is not None else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def dense_sparse_error(errors: dict[int, dict[str, float]], topk: int):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = sorted(errors)
    ys = [max(errors[x]["max_abs"], 1e-12) for x in xs]
    ax.semilogy(xs, ys, marker="o", label="max |logit dense - sparse|")
    ax.semilogy(xs, [max(errors[x]["mean_kl"], 1e-12) for x in xs], marker="s", label="mean KL(dense || sparse)")
    ax.axvline(topk, color="gray", ls=":", label=f"index_topk = {topk}")
    ax.set_xlabel("context length T")
    ax.set_title("Switching the indexer off (0 is drawn at 1e-12)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def grouped_bars(values: dict[str, dict[int, float]], ylabel: str, title: str):
    """values: {series: {layer: value}} as grouped bars per layer."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    series = list(values)
    layers = sorted({layer for v in values.values() for layer in v})
    width = 0.8 / max(len(series), 1)
    for j, name in enumerate(series):
        ax.bar(np.arange(len(layers)) + j * width, [values[name].get(layer, np.nan) for layer in layers], width,
               label=name)
    ax.set_xticks(np.arange(len(layers)) + width * (len(series) - 1) / 2, [f"layer {layer}" for layer in layers])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return fig


def cost_model(contexts=None, shapes: cost.CostShapes = cost.CostShapes()):
    """Per-token decode FLOPs and bytes of the indexer vs sparse attention, one layer, GLM-5 shapes."""
    plt = _plt()
    L = np.asarray(contexts if contexts is not None else np.logspace(3, np.log10(202_752), 60))
    t = cost.cost_table(L, shapes)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.loglog(L, t["indexer_flops"], label="indexer")
    a.loglog(L, t["sparse_attention_flops"], label=f"sparse MLA (top-k {shapes.topk})")
    a.loglog(L, t["dense_attention_flops"], ls=":", label="dense MLA")
    x = cost.flops_crossover(shapes)
    a.axvline(x, color="gray", ls="--", label=f"crossover {x / 1000:.1f}K")
    a.set_xlabel("context length")
    a.set_ylabel(f"FLOP per token per layer ({shapes.heads} heads)")
    a.legend(fontsize=8)
    a.grid(alpha=0.3, which="both")
    b.loglog(L, t["indexer_key_bytes_fp8"], label="indexer keys (fp8, 132 B)")
    b.loglog(L, t["gathered_kv_bytes_bf16"], label="gathered KV (bf16, 1152 B)")
    b.loglog(L, t["gathered_kv_bytes_fp8"], label="gathered KV (fp8_ds_mla, 656 B)")
    xb = cost.bytes_crossover(shapes)
    b.axvline(xb, color="gray", ls="--", label=f"bytes crossover {xb / 1000:.1f}K")
    b.set_xlabel("context length")
    b.set_ylabel("bytes read per token per layer (decode)")
    b.legend(fontsize=8)
    b.grid(alpha=0.3, which="both")
    return fig


def prefill_cost(n_tokens=None, shapes: cost.CostShapes = cost.CostShapes()):
    plt = _plt()
    N = np.asarray(n_tokens if n_tokens is not None else np.logspace(3, np.log10(202_752), 60))
    p = cost.prefill_flops(N, shapes)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, v in p.items():
        ax.loglog(N, v, label=key.replace("_", " "), ls=":" if key.startswith("dense") else "-")
    ax.set_xlabel("prompt length N")
    ax.set_ylabel("prefill FLOP per layer")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


def attention_map(sel, k: int, query: int, head: int | None = None):
    """One query's dense attention over keys with the indexer's picks marked."""
    plt = _plt()
    probs = sel.attn if head is None else sel.attn_heads[head]
    row = probs[query].numpy()
    picks = sel.picks(k)[query].numpy()
    fig, ax = plt.subplots(figsize=(7, 2.8))
    s = np.arange(len(row))
    ax.bar(s, row, width=1.0, color=np.where(picks, "tab:blue", "tab:red"))
    kept = float(row[picks].sum())
    ax.set_title(f"query {query}{'' if head is None else f', head {head}'}: top-{k} (blue) keeps {kept:.3f} of "
                 "the attention (red: dropped)", fontsize=9)
    ax.set_xlabel("key position")
    ax.set_xlim(-1, query + 2)
    return fig
