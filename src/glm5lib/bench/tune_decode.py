"""Decode tuning on the GPU in one run: candidate configs of the small-head (H <= 16) decode kernel, side by side.

For each cache format: every candidate and the shipped config run the decode part of the full case matrix
(`checks.mla_cases("full")` with H <= 16 and fewer tokens than the prefill switch), then every (candidate, waves)
pair is timed on the same inputs as `bench` (GLM-5 shapes, B 1/32/128, H 8/16, graph replay over rotated index
sets, `bench.time_config`) with the shipped config timed first and last (the spread of those two is the noise).
Variants are kept in a dict by config name (waves included), so the winner is exactly the config that was timed:
the fastest total time among variants that pass every check. With `--bench` and a winner at least `--min-gain`
faster than the shipped config, the winners replace the shipped ("small", fmt, "big") configs in this process and
`glm5lib bench all --sweep-indexer --name bench_tuned` runs, so its JSON records exactly the configs measured.

`python -m glm5lib.bench.tune_decode --out DIR [--bench] [--deadline S]`
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from glm5lib.bench import kernels as bench
from glm5lib.kernels import checks, naive
from glm5lib.kernels import mla as sm
from glm5lib.kernels.mla import MLAConfig as C

DEVICE = "cuda"  # a CPU dry run of the plumbing swaps this (and bench's input makers) out
CTX = 32768
WAVES = (1, 2, 4)
CASES = [(B, H) for H in (8, 16) for B in (1, 32, 128)]
# Issue #13 candidates. Static sm_90 cost (scripts/mla_static_cost.py, Triton 3.6; registers / spill bytes / shared
# memory / SASS instructions per warp per tile): shipped fp8 255 / 64 / 54 KB / 1089 per 32 rows; shipped bf16
# 128 / 0 / 91 KB / 488 per 32 rows. "pfw" (prefetch=2): the prefetched fp8 tile is held as int32 words.
CANDIDATES = {
    "bf16": [
        C(16, 64, 8, 3, idx_ahead=True, waves=1, fit=True),  # 104 / 0 / 164 KB / 458 per 64 rows: 1 program/SM
        C(16, 32, 4, 2, idx_ahead=True, waves=4, fit=True),  # 137 / 0 / 55 KB / 471: one buffer, 3 programs/SM
        C(16, 16, 4, 3, idx_ahead=True, waves=4, fit=True),  # 128 / 0 / 55 KB / 377 per 16 rows: 4 programs/SM
    ],
    "fp8_ds_mla": [
        C(16, 64, 8, 2, prefetch=True, nope_f16=True, idx_ahead=True, waves=1, fit=True),  # 255 / 0 / 90 KB / 958 per 64
        C(16, 32, 4, 2, prefetch=2, nope_f16=True, idx_ahead=True, fit=True),  # 254 / 0 / 86 KB / 1074 per 32
        C(16, 64, 8, 2, prefetch=2, nope_f16=True, idx_ahead=True, waves=1, fit=True),  # 224 / 0 / 154 KB / 1111 per 64
    ],
}


def check_cases(fmt: str) -> list[checks.MLACase]:
    """The full matrix's cases that the small-head decode config serves (below `pick_config`'s prefill switch)."""
    prefill_from = 4 * sm.num_sms(torch.device(DEVICE))
    return [c for c in checks.mla_cases("full") if c.kv_format == fmt and c.H <= 16 and c.T < prefill_from]


def run_checks(fmt: str, cfg: C) -> tuple[int, int, list[str]]:
    keep = sm.CONFIGS[("small", fmt, "big")]
    sm.CONFIGS[("small", fmt, "big")] = cfg
    bad = []
    try:
        cases = check_cases(fmt)
        for i, c in enumerate(cases):
            r = checks.run_mla_case(c, DEVICE, torch.bfloat16 if DEVICE == "cuda" else torch.float32, seed=1000 + i)
            if not r.ok:
                bad.append(f"{r.name}: {r.notes} rel={r.rel:.1e}")
    finally:
        sm.CONFIGS[("small", fmt, "big")] = keep
    return len(cases) - len(bad), len(cases), bad


def time_case(fmt: str, B: int, H: int, variants: dict[str, C]) -> list[dict]:
    """us per call for the shipped config (first and last) and every variant (tag -> config), same inputs."""
    topk = bench.TOPK
    dev = torch.device(DEVICE)
    q, cache, base = bench._make_decode(B, H, CTX, topk, fmt)
    kv_bytes = sm.sparse_mla_kv_bytes(B, topk, fmt)
    idx_sets = [bench._rand_indices(B, CTX, topk, base) for _ in range(bench._rotations(kv_bytes))]
    out = torch.full((B, H, naive.D_NOPE), float("nan"), device=DEVICE, dtype=q.dtype)
    ro, _ = naive.sparse_mla_ref_chunked(q, cache, idx_sets[0], bench.SM_SCALE, kv_format=fmt, chunk=16)
    rows = []

    def one(tag: str, cfg: C):
        ns = sm.config_num_splits(B, H, topk, cfg, dev)
        row = {"fmt": fmt, "B": B, "H": H, "tag": tag, "config": cfg.name, "splits": ns}
        try:
            ms, rel = bench.time_config(q, cache, idx_sets, fmt, out, cfg, ns, ro)
            rows.append({**row, "us": ms * 1e3, "rel": rel, "ok": bool(rel < 1e-2), "GBps": kv_bytes / ms / 1e6})
        except Exception as exc:
            rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})

    shipped = sm.CONFIGS[("small", fmt, "big")]
    one("shipped-a", shipped)
    for tag, cfg in variants.items():
        one(tag, cfg)
    one("shipped-b", shipped)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/bench")
    ap.add_argument("--bench", action="store_true", help="re-run `bench all --sweep-indexer` with the winners")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds from start after which no bench starts")
    ap.add_argument("--bench-seconds", type=float, default=120, help="time the bench needs")
    ap.add_argument("--min-gain", type=float, default=0.03)
    ap.add_argument("--formats", nargs="*", default=["bf16", "fp8_ds_mla"])
    ap.add_argument("--verify", action="store_true", help="only run the decode checks on the shipped configs")
    a = ap.parse_args(argv)
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.verify:
        bad_total = 0
        for fmt in a.formats:
            cfg = sm.CONFIGS[("small", fmt, "big")]
            n_ok, n, bad = run_checks(fmt, cfg)
            bad_total += len(bad)
            print(f"verify {fmt:10s} {cfg.name:34s} {n_ok}/{n} {'; '.join(bad[:3])}  [{time.time() - t0:.0f}s]", flush=True)
        return 1 if bad_total else 0
    res: dict = {"checks": {}, "rows": [], "winners": {}}
    variants: dict[str, dict[str, C]] = {}  # fmt -> tag (config name, waves included) -> config
    checked_as: dict[str, str] = {}  # tag -> its key in res["checks"] (waves change the split count, not the math)
    for fmt in a.formats:
        variants[fmt] = {}
        # the shipped config is checked like the candidates and timed at other waves too, so a split-count
        # change alone can win
        for cfg in [sm.CONFIGS[("small", fmt, "big")]] + CANDIDATES[fmt]:
            key = f"{fmt}/{cfg.name}"
            try:
                n_ok, n, bad = run_checks(fmt, cfg)
            except Exception as exc:
                n_ok, n, bad = 0, 1, [f"{type(exc).__name__}: {str(exc)[:200]}"]
            res["checks"][key] = {"ok": n_ok, "n": n, "bad": bad[:5]}
            print(f"checks {fmt:10s} {cfg.name:34s} {n_ok}/{n} {'; '.join(bad[:2])}  [{time.time() - t0:.0f}s]", flush=True)
            for w in WAVES:
                v = dataclasses.replace(cfg, waves=w)
                variants[fmt][v.name] = v
                checked_as[v.name] = key
    for fmt in a.formats:
        for B, H in CASES:
            rows = time_case(fmt, B, H, variants[fmt])
            torch.cuda.empty_cache()  # the case's inputs are gone with time_case's frame
            res["rows"] += rows
            sh = [r["us"] for r in rows if r["tag"].startswith("shipped") and "us" in r]
            best = min((r for r in rows if "us" in r and r["ok"]), key=lambda r: r["us"])
            print(f"time {fmt:10s} B{B:<4d} H{H:<3d} shipped {sh[0]:7.1f}/{sh[-1]:7.1f} us  best {best['us']:7.1f} us "
                  f"{best['tag']} splits{best['splits']}  [{time.time() - t0:.0f}s]", flush=True)
    # winner per format: fastest total over the cases among variants that pass every check and every timed run
    adopt: dict[str, C] = {}
    for fmt in a.formats:
        rows = [r for r in res["rows"] if r["fmt"] == fmt]
        ship_total = sum(min(r["us"] for r in rows if r["B"] == B and r["H"] == H and r["tag"].startswith("shipped"))
                         for B, H in CASES)
        totals = {}
        for tag in variants[fmt]:
            rs = [r for r in rows if r["tag"] == tag]
            chk = res["checks"][checked_as[tag]]
            if len(rs) == len(CASES) and all("us" in r and r["ok"] for r in rs) and chk["ok"] == chk["n"]:
                totals[tag] = sum(r["us"] for r in rs)
        win = min(totals, key=totals.get) if totals else None
        res["winners"][fmt] = {"shipped_total_us": ship_total, "winner": win, "winner_total_us": totals.get(win),
                               "totals": dict(sorted(totals.items(), key=lambda kv: kv[1]))}
        print(f"winner {fmt}: {win} {totals.get(win, 0):.1f} us vs shipped {ship_total:.1f} us (sum over {len(CASES)} cases)")
        if win and totals[win] < (1 - a.min_gain) * ship_total:
            print(f"{fmt}: adopting {win}: {totals[win]:.1f} us vs {ship_total:.1f} us")
            adopt[fmt] = variants[fmt][win]
    tmp = out / "tune_decode.json.tmp"
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, out / "tune_decode.json")
    print("adopt:", {k: v.name for k, v in adopt.items()} or "nothing", flush=True)
    if a.bench and adopt:
        if time.time() - t0 + a.bench_seconds > a.deadline:
            print(f"no time left for the bench ({time.time() - t0:.0f}s used)")
            return 0
        for fmt, cfg in adopt.items():
            sm.CONFIGS[("small", fmt, "big")] = cfg
        from glm5lib.bench.cli import main as bench_main

        return bench_main(["bench", "all", "--sweep-indexer", "--out", str(out), "--name", "bench_tuned"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
