"""What the top-k select's time at a decode step's few rows is made of (CUDA GPU, one process).

    PYTHONPATH=src python3 scripts/topk_dist_probe.py OUT.json [--sweep | --sparse | --configs | --rule]

At one or a few rows `topk.topk_select` runs one program per row (or per 16K-key chunk, then one per row to merge),
so the GPU is mostly idle and the select's time is its programs' latency: five scans of the row (four 8-bit radix
passes and the write), each block of scores loaded and then counted. Three questions, on the same rows:

- does the time depend on how the scores are spread over the first digit's bins? Triton 3.6 (the GPU's) lowers
  `tl.histogram` with warp ballots, one per digit bit an element, and popcounts for the bins each lane owns, so it
  should not; Triton 3.9 (this project's CPU pin) lowers it as one shared-memory atomic add an element, where a
  warp's adds to one counter serialise. `spread`: uniform random 32-bit patterns as floats (non-finite ones
  replaced by 0; the first digit over all 256 bins); `randn`: standard normal (about 18 bins);
- whether more warps to issue from help: 16 a program instead of 8 (the first run, eef246a, also loaded the next
  block ahead in each radix pass: 2-4 % slower, removed since);
- what the row split over programs for every pass gains (`topk_select(..., multi=True)`, `topk.SELECT_MULTI`: the
  digit counts summed across a row's programs, seven launches), at chunks of 2048, 4096 and 8192 keys.

Shapes (top-k 2048, every row given its length as the indexer does): one row of 32K keys (one program), 128 rows
of 32K (the GPU busy), one row of 128K keys (the split select: 8 programs, then the merge), and the CUDA-graph
decode path's shape, one row 202752 wide read up to a 128K context. Every variant's output checked against the
select without the split over programs (`multi=False`, "shipped": what `topk_select` took before round 27), whose
set is checked against torch.topk's; CUDA-graph replay (`serving.harness.cuda_timings`; back-to-back eager calls
too, as the indexer step's `topk_fast` runs), torch.topk beside it. "rule": what `topk_select` takes by itself
(`topk._multi_default`: the split over programs while a graph is captured and for a shape's first eager call,
so its eager time is the select's).

`--sweep`: where the row split over programs stops paying, for a rule: `randn` scores at 1-128 rows of 32K and 128K
keys and of the decode path's 202752-wide rows read up to 32K and 128K, the select without `multi` against it at
chunks of 1024-8192 keys, and what `topk_select` takes by its rule (`topk.multi_rule`).

`--sparse` (rounds 28-29): the variants of the select's counting, writing and launch configs against the select
before round 28 (`BEFORE`: `tl.histogram` in every block, 4096-key blocks on 8 warps: today's kernel with round
28-29's changes switched off, so its time moves a little between versions), for the one-program / split select
(`multi=False`) and for what `topk_select` takes by its rule, at 1-128 rows of 32K and 128K keys and the decode
path's 202752-wide rows, over four spreads of the scores: `randn`, `spread`, `narrow` (1 + 0.01 randn: every key in
one first-digit bin, a block's matches after the first pass many) and `ties` (integers -8..7: a few bins, adds to
one address). Each run's variants are in its JSON's meta (round 28: atomics, a list of the candidates, ties ranked in
one block; round 29: the write's scan over rows of 16 keys, `sparse=4`/`2`, the launch config by program count,
warp-aggregated adds `agg` 0-3, another module's select beside this one). Every variant's output checked against
the select before's, whose set is checked against torch.topk's (not for `ties`: torch.topk breaks ties its own way);
the rule's call also captured and replayed with new rows.

`--rule` (round 30): where the multi select and the split's chunk widths pay after round 29's adds, for the rule
(`topk.multi_rule`) and the split's chunk: 1-128 rows of 32K, 128K and 202752-wide rows read up to 128K, `randn`
and `narrow` scores, the split at 8K-32K-key chunks and the multi select at 2048-8192 beside the rule.

`--configs` (round 29): the one-program select's block of keys and warps a program (blocks of 2048-16384 keys, 4-16
warps) beside the shipped choice (`topk.select_config`), over `randn` and `narrow` scores.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

import glm5lib.kernels.topk as topk
from glm5lib.kernels.topk import topk_indices, topk_select

from bench_topk_long import K, REPEATS, WIDE, time_paths  # the long-row top-k script's timer and row width

SHAPES = [(1, 32768, 32768), (128, 32768, 32768), (1, 131072, 131072), (1, WIDE, 131072)]  # (rows, width, length)
DISTS = ("randn", "spread")
SPARSE_DISTS = ("randn", "spread", "narrow", "ties")
SPARSE_SHAPES = [(1, 32768, 32768), (16, 32768, 32768), (64, 32768, 32768), (128, 32768, 32768),
                 (1, WIDE, 131072), (16, 131072, 131072), (64, 131072, 131072), (64, WIDE, 131072)]
# the select before round 28 first (every block by tl.histogram, the write's 1-D scans, 4096-key blocks on 8 warps);
# round 29's v34 (4096-key blocks on 8 warps in every launch); the shipped select (`topk.select_config`: 8192-key
# blocks on 16 warps where a launch's programs fit one wave); v36 (`agg` 0: no warp-aggregated adds), as shipped
# (`topk.SELECT_AGG`), the adds in every pass (1) and from the second pass on (2); the rule before round 28, v36,
# shipped and 1
BEFORE = {"sparse": 0, "scan_rows": 0, "config": (4096, 8, 8), "agg": 0}
SPARSE_VARIANTS = [("select_before", {"multi": False, **BEFORE}),
                   ("select_v36", {"multi": False, "agg": 0}), ("select_shipped", {"multi": False}),
                   ("select_agg1", {"multi": False, "agg": 1}), ("select_agg2", {"multi": False, "agg": 2}),
                   ("rule_before", BEFORE), ("rule_v36", {"agg": 0}), ("rule_shipped", {}), ("rule_agg1", {"agg": 1})]


# the default mode: the one-program select against 16 warps and the multi select's chunk sizes
VARIANTS = [("shipped", {"multi": False}), ("warps16", {"config": (4096, 16, 8), "multi": False}),
            ("multi4096", {"multi": True, "chunk": 4096}), ("multi2048", {"multi": True, "chunk": 2048}),
            ("multi8192", {"multi": True, "chunk": 8192})]
# `--configs`: the one-program select's (block, warps, digit bits) beside the shipped choice (`topk.select_config`)
CONFIG_SHAPES = [(1, 32768, 32768), (128, 32768, 32768), (1, WIDE, 131072), (64, 131072, 131072)]
CONFIG_VARIANTS = [("shipped", {"multi": False})] + [
    (f"b{b}_w{w}", {"multi": False, "config": (b, w, 8)})
    for b, w in ((2048, 4), (2048, 8), (4096, 4), (4096, 16), (8192, 8), (8192, 16), (16384, 16))]


SWEEP_SHAPES = [(T, n, L) for T in (1, 4, 16, 32, 64, 128)
                for n, L in ((32768, 32768), (131072, 131072), (WIDE, 32768), (WIDE, 131072))]
SWEEP_VARIANTS = ([("shipped", {"multi": False}), ("rule", {})]
                  + [(f"multi{c}", {"multi": True, "chunk": c}) for c in (1024, 2048, 4096, 8192)])


# `--rule` (round 30): the multi rule's and the split's chunk bounds after round 29's adds: 1-128 rows of 32K keys,
# of 128K and of the decode path's 202752-wide rows read up to 128K, over `randn` and `narrow` scores; the one-program
# / split select at chunks of 8K, 16K (`SELECT_CHUNK`) and 32K keys, the multi select at chunks of 2048-8192, and
# what `topk_select` takes by its rule (a chunk at least as wide as the row: one program a row)
# (TOPK_RULE_ROWS="20 24 ...": other row counts, e.g. to check a fitted rule on batches it was not fitted to)
RULE_SHAPES = [(T, n, L) for T in map(int, os.environ.get("TOPK_RULE_ROWS", "1 4 16 32 48 64 96 128").split())
               for n, L in ((32768, 32768), (131072, 131072), (WIDE, 131072))]
RULE_VARIANTS = ([("shipped", {"multi": False}), ("rule", {})]
                 + [(f"split{c}", {"multi": False, "chunk": c}) for c in (8192, 16384, 32768)]
                 + [(f"multi{c}", {"multi": True, "chunk": c}) for c in (2048, 4096, 8192)])


# GLM5LIB_TOPK_AB=path/to/topk.py: another version of the module (e.g. `git show REV:src/glm5lib/kernels/topk.py`),
# timed beside this one in the same process as `select_ab` / `rule_ab` (its own kernels, compiled apart)
AB = None
if os.environ.get("GLM5LIB_TOPK_AB"):
    import importlib.util

    _spec = importlib.util.spec_from_file_location("topk_ab", os.environ["GLM5LIB_TOPK_AB"])
    AB = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(AB)


def select(x, k, scan_rows: int | None = None, impl: str | None = None, agg: int | None = None, **kw):
    """`topk_select` with `topk.SELECT_SCAN_ROWS` set to `scan_rows` and `topk.SELECT_AGG` to `agg` for the call
    (None: as they are); `impl` "ab": the GLM5LIB_TOPK_AB module's instead."""
    if impl == "ab":
        return AB.topk_select(x, k, **kw)
    keep = topk.SELECT_SCAN_ROWS, topk.SELECT_AGG
    topk.SELECT_SCAN_ROWS = keep[0] if scan_rows is None else scan_rows
    topk.SELECT_AGG = keep[1] if agg is None else agg
    try:
        return topk_select(x, k, **kw)
    finally:
        topk.SELECT_SCAN_ROWS, topk.SELECT_AGG = keep


def scores(dist: str, T: int, n: int, dev: str) -> torch.Tensor:
    g = torch.Generator(device=dev).manual_seed(T * 31 + n)
    if dist == "spread":
        bits = torch.randint(-2**31, 2**31, (T, n), generator=g, device=dev, dtype=torch.int64).to(torch.int32)
        x = bits.view(torch.float32)
        return torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    if dist == "randn":
        return torch.randn(T, n, generator=g, device=dev)
    if dist == "narrow":
        return 1 + 0.01 * torch.randn(T, n, generator=g, device=dev)
    if dist == "ties":
        return torch.randint(-8, 8, (T, n), generator=g, device=dev).float()
    raise ValueError(f"unknown distribution {dist!r}; one of {SPARSE_DISTS}")


def top_digit_bins(x: torch.Tensor) -> int:
    """How many of the 256 first-digit bins row 0's ordered keys fill (`topk._ordered_key`'s top 8 bits)."""
    return int(torch.unique(topk.ordered_keys(x[0]) >> 24).numel())


def main(path: str, mode: str = "") -> None:
    dev = "cuda"
    t0 = time.time()
    rows = []
    ab = [("select_ab", {"impl": "ab", "multi": False}), ("rule_ab", {"impl": "ab"})] if AB is not None else []
    shapes, dists, variants = {"--sweep": (SWEEP_SHAPES, ("randn",), SWEEP_VARIANTS),
                               "--sparse": (SPARSE_SHAPES, SPARSE_DISTS, SPARSE_VARIANTS),
                               "--configs": (CONFIG_SHAPES, ("randn", "narrow"), CONFIG_VARIANTS),
                               "--rule": (RULE_SHAPES, ("randn", "narrow"), RULE_VARIANTS)}.get(
        mode, (SHAPES, DISTS, VARIANTS))
    sparse = mode == "--sparse"
    variants = variants + ab
    for dist in dists:
        for T, n, length in shapes:
            row = {"dist": dist, "T": T, "n": n, "length": length, "k": K,
                   "chunk": topk.SELECT_CHUNK if n > topk.SELECT_MAX_N else None}
            try:
                x = scores(dist, T, n, dev)
                row["top_digit_bins"] = top_digit_bins(x)
                L = torch.full((T,), length, dtype=torch.int32, device=dev)
                out = torch.empty(T, K, dtype=torch.int32, device=dev)
                base = select(x, K, lengths=L, multi=False, **(BEFORE if sparse else {})).clone()
                if dist != "ties":  # torch.topk breaks ties its own way
                    want = topk_indices(x[:, :length], K).sort(1).values
                    row["set_equals_torch_topk"] = bool(torch.equal(base.sort(1).values, want))
                # what the rule takes under capture (the split over programs where `multi_rule` says so), replayed
                # from a CUDA graph with the rows' contents changed after capture, against the eager select; the
                # call before the capture is the shape's first eager one, as vLLM's warm-up run is
                g_out = torch.full((T, K), -7, dtype=torch.int32, device=dev)
                xg = torch.zeros_like(x)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    topk_select(xg, K, lengths=L, out=g_out)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    topk_select(xg, K, lengths=L, out=g_out)
                xg.copy_(x)
                graph.replay()
                torch.cuda.synchronize()
                row["rule_multi_in_graph"] = topk.multi_rule(T, n)
                row["rule_graph_replay_equals_shipped"] = bool(torch.equal(g_out, base))
                del graph
                for name, kw in variants[0 if sparse else 1:]:
                    row[f"{name}_equals_shipped"] = bool(torch.equal(select(x, K, lengths=L, **kw), base))
                xs = x[:, :length].contiguous()
                row.update(time_paths({**{name: (lambda kw=kw: select(x, K, lengths=L, out=out, **kw))
                                          for name, kw in variants},
                                       "torch_topk": lambda: topk_indices(xs, K, out=out)}))
            except Exception as e:  # noqa: BLE001  (recorded; the sweep goes on)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "select_config": topk.SELECT_CONFIG, "select_config_wave": topk.SELECT_CONFIG_WAVE,
            "select_agg": topk.SELECT_AGG, "variants": variants, "mode": mode or "dist", "repeats": REPEATS,
            "select_sparse": topk.SELECT_SPARSE, "select_scan_rows": topk.SELECT_SCAN_ROWS,
            "ab_module": os.environ.get("GLM5LIB_TOPK_AB"),
            "seconds": time.time() - t0}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{time.time() - t0:.0f} s; wrote {path}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 2) or args[0].startswith("--") or args[1:] not in ([], ["--sweep"], ["--sparse"],
                                                                                ["--configs"], ["--rule"]):
        sys.exit("usage: topk_dist_probe.py OUT.json [--sweep | --sparse | --configs | --rule]")
    if not torch.cuda.is_available():
        sys.exit("topk_dist_probe: needs a CUDA GPU")
    main(args[0], mode=(args[1:] or [""])[0])
