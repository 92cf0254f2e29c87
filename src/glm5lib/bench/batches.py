"""The 8- and 16-head fp8-cache decode across batch sizes: an H200 run of `scripts/fp8mma_device.py --batches` read
back, checked and plotted on the CPU.

The issue's decode targets are taken at batch 32 and 128; a serving GPU sees every batch from 1 to hundreds, and the
fp8-cache kernel (`kernels.mla_gluon_fp8mma`) changes its plan along the way: how many splits of each token's top-k
list (`plan_splits`), and, at 1-8 heads, four warps along the keys where the list is split, two where it is not
(`key_warps_of`, `plan_key_warps`); under CUDA-graph capture `mla.sparse_mla` takes it from
`mla.FP8MMA_MIN_T_GRAPH` tokens, the Triton kernel below. Each row of a run holds, for one batch and head count,
the time of `mla.sparse_mla` itself replayed from a CUDA graph ("dispatch": what vLLM's captured decode runs), of
the shipped build with two ("k2") and four ("k4") key warps forced (runs since round 20 on sm_90 also four with S as
wgmma, "k4wg"), of the Triton kernel and of FlashMLA padded to 64 heads, each checked against fp32 first (`*_ok`).
The rule a row records (`rule_key_warps`) is the one of the run's commit; `rule_now` asks today's. `rule_table`
says at each batch whether either rule's pick was the faster build; `plot` draws the times per token and the
speed-up over FlashMLA.

`bash scripts/device_kernels.sh batches` makes a run, which `glm5lib bench batches RUN.json` reads back anywhere
(table, verdicts, figure) and `load_run(run_path(name))` reads once it is under
outputs/bench/sweeps; the committed ones ran on an H100: `fp8mma_batches_h100_c757078.json` (NOTES.md round 19) and
`fp8mma_batches_h100_3fefa76.json` (round 20, notebook 04's), with the 8-head batches of the key-warps rule beside
them (`fp8mma_batches_fill*_h100_*.json`).
Each row also holds `sparse_mla` timed again after the others ("dispatch_again": the order's share of a gap).
"""

from __future__ import annotations

import json
from pathlib import Path

from glm5lib.bench.parts import run_path

TOPK = 2048  # every run's top-k (`scripts/fp8mma_device.py`)

IMPLS = ("dispatch", "k2", "k4", "k4wg", "triton", "flashmla")
LABELS = {"dispatch": "sparse_mla (its rule, graph replay)", "k2": "fp8-cache kernel, 2 key warps",
          "k4": "fp8-cache kernel, 4 key warps", "k4wg": "4 key warps, S as wgmma in flight (sm_90)",
          "triton": "Triton kernel", "flashmla": "FlashMLA padded to 64 heads"}
# the rule's pick counts as right where it is within this fraction of the faster build's time: the 3 % the
# benchmark allows a ceiling (`bench.kernels.CEILING_MARGIN`), since one build's time moves by 1-3 % between H200
# runs (NOTES.md rounds 13-17)
RULE_MARGIN = 0.03


def load_run(path: str | Path) -> dict:
    """{"commit", "device", "rows": {(heads, batch): row}} of one run; ValueError when it holds no batch rows."""
    res = json.loads(Path(path).read_text())
    rows = {(r["H"], r["B"]): r for r in res.get("rows", []) if r.get("kind") == "batch"}
    if not rows:
        raise ValueError(f"{path}: no batch rows (a run of scripts/fp8mma_device.py --batches?)")
    meta = res.get("meta", {})
    return {"commit": meta.get("commit"), "device": meta.get("device"), "rows": rows}


def failed_checks(run: dict) -> list[str]:
    """Every (heads, batch, launch) whose output disagreed with fp32 or whose launch failed."""
    bad = []
    for (H, B), r in sorted(run["rows"].items()):
        if "error" in r:
            bad.append(f"H{H} B{B} (the case: {r['error']})")
        for impl in IMPLS:
            if r.get(impl + "_ok") is False or impl + "_error" in r:
                bad.append(f"H{H} B{B} {impl}")
    return bad


def rule_pick(row: dict) -> str:
    """The build the key-warps rule took for this row ("k2" / "k4")."""
    return f"k{row['rule_key_warps']}"


def rule_now(row: dict) -> str:
    """The build today's key-warps rule takes for this row's shape as the captured decode asks it
    (`plan_key_warps(..., decode=True)`), planned off-GPU: 132 SMs of sm_90's shared-memory class, the H100's and
    the H200's."""
    import torch

    from glm5lib.kernels import mla_gluon_fp8mma as fm

    return f"k{fm.plan_key_warps(row['B'], TOPK, fm.head_groups(row['H']), torch.device('cpu'), decode=True)}"


def rule_verdict(row: dict, margin: float = RULE_MARGIN, pick: str | None = None) -> dict:
    """{"pick", "best", "pick_us", "best_us", "ok"}: whether the rule's build was within `margin` of the faster of
    the two timed builds at this row. ok is None where the rule does not apply (the captured decode takes the Triton
    kernel at this batch, "graph_route") or either build was not timed, and False where the rule's build failed its
    check; a build that failed its check is never the best. pick: judge that build instead of the run's rule's
    (e.g. `rule_now(row)`)."""
    pick = pick or rule_pick(row)
    times = {k: row.get(k + "_us") for k in ("k2", "k4")}
    if row.get("graph_route", "fp8mma") != "fp8mma" or None in times.values():
        return {"pick": pick, "best": None, "pick_us": times.get(pick), "best_us": None, "ok": None}
    if row.get(pick + "_ok") is False:
        return {"pick": pick, "best": None, "pick_us": times[pick], "best_us": None, "ok": False}
    times = {k: t for k, t in times.items() if row.get(k + "_ok") is not False}
    best = min(times, key=times.get)
    return {"pick": pick, "best": best, "pick_us": times[pick], "best_us": times[best],
            "ok": bool(times[pick] <= (1 + margin) * times[best])}


def rule_table(run: dict) -> str:
    """Markdown: per head count and batch, every launch's time, the run's rule's pick and splits and its verdict, and
    today's rule's pick (`rule_now`) and verdict."""
    lines = [f"run {run['commit']} ({run['device']}); times in us, graph replay; a pick right within "
             f"{RULE_MARGIN:.0%} of the faster build",
             "| heads | batch | splits | rule | " + " | ".join(IMPLS) + " | FlashMLA / dispatch | rule right | "
             "today's rule | right |",
             "|---|---|---|---|" + "---|" * len(IMPLS) + "---|---|---|---|"]
    for (H, B), r in sorted(run["rows"].items()):
        if "error" in r:
            lines.append(f"| {H} | {B} | - | - | " + " | ".join("-" for _ in IMPLS) + f" | - | {r['error'][:60]} |"
                         " - | - |")
            continue
        ts = [f"{r[i + '_us']:.1f}" if i + "_us" in r else "-" for i in IMPLS]
        sp = f"{r['flashmla_us'] / r['dispatch_us']:.2f}x" if "flashmla_us" in r and "dispatch_us" in r else "-"
        v, w = rule_verdict(r), rule_verdict(r, pick=rule_now(r))
        ok, ok_now = ({True: "yes", False: f"no ({x['best']})", None: "-"}[x["ok"]] for x in (v, w))
        lines.append(f"| {H} | {B} | {r['rule_splits']} | {v['pick']} | " + " | ".join(ts) +
                     f" | {sp} | {ok} | {w['pick']} | {ok_now} |")
    return "\n".join(lines)


def plot(run: dict, png_path: str | Path) -> Path:
    """Two panels per head count: time per token (us, log-log) of every launch, and each glm5lib launch's speed-up
    over FlashMLA padded to 64 heads (the issue's 2.5x goal at batch 32-128 drawn)."""
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()
    heads = sorted({H for H, _ in run["rows"]})
    fig, axes = plt.subplots(2, len(heads), figsize=(7 * len(heads), 8.5), squeeze=False)
    for j, H in enumerate(heads):
        bs = sorted(B for h, B in run["rows"] if h == H and "error" not in run["rows"][h, B])
        rows = [run["rows"][H, B] for B in bs]
        top, bottom = axes[0][j], axes[1][j]
        for k, impl in enumerate(IMPLS):
            # sparse_mla follows one of the builds: a wide pale band under them shows which
            style = dict(lw=6, alpha=0.3, zorder=1) if impl == "dispatch" else dict(marker="o", ms=3, zorder=2)
            pts = [(B, r[impl + "_us"] / B) for B, r in zip(bs, rows) if impl + "_us" in r]
            if pts:
                top.plot(*zip(*pts), color=f"C{k}", label=LABELS[impl], ls="--" if impl == "flashmla" else "-",
                         **style)
            if impl != "flashmla":
                pts = [(B, r["flashmla_us"] / r[impl + "_us"]) for B, r in zip(bs, rows)
                       if impl + "_us" in r and "flashmla_us" in r]
                if pts:
                    bottom.plot(*zip(*pts), color=f"C{k}", label=LABELS[impl], **style)
        wrong = [(B, r["dispatch_us"] / B) for B, r in zip(bs, rows)
                 if rule_verdict(r)["ok"] is False and "dispatch_us" in r]
        if wrong:
            top.plot(*zip(*wrong), "x", color="k", ms=9, zorder=3, label="the rule took the slower build")
        floor = [(B, r["floor_us"] / B) for B, r in zip(bs, rows) if "floor_us" in r]
        if floor:
            top.plot(*zip(*floor), color="k", lw=1, ls=":", label="gathered bytes at copy bandwidth")
        top.set(xscale="log", yscale="log", ylabel="us per token", title=f"fp8_ds_mla decode, {H} heads, top-k 2048")
        bottom.axhline(1.0, color="grey", lw=0.8)
        bottom.plot([32, 128], [2.5, 2.5], color="k", lw=2, label="issue #13's goal (B 32-128)")
        bottom.set(xscale="log", xlabel="batch (tokens, one 32K-token request each)", ylabel="FlashMLA time / ours")
        for ax in (top, bottom):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"{run['device']}, run {run['commit']}: CUDA-graph replay over rotated index sets", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return save_figure(fig, png_path)


__all__ = ["IMPLS", "RULE_MARGIN", "run_path", "load_run", "failed_checks", "rule_pick", "rule_now", "rule_verdict",
           "rule_table", "plot"]
