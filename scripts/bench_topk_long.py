"""Long-row top-k on a CUDA GPU: `topk_select` with one program per row, split into chunks (two launches), and
torch.topk, checked and timed side by side.

    PYTHONPATH=src python3 scripts/bench_topk_long.py OUT.json

Checks, per shape: on random scores (no ties) the split select picks torch.topk's set and exactly what one
program per row writes; on tie-heavy scores (few distinct values, -0.0 among the zeros, random row lengths)
exactly what one program per row writes. Times: `serving.harness.cuda_timings` for every path (the same call
replayed from a CUDA graph: GPU time; and back-to-back eager calls). Top-k 2048, every row given its length
(as the indexer calls it). Then the CUDA-graph decode path's shape: rows WIDE = 202752 wide read up to a context
of 4K-128K, one program per row against the split. A failing case is recorded with its error and the sweep goes
on. "default" is what `topk_select` takes by itself: since round 27 (`topk._multi_default`) that is, at a few wide
rows, the row split over programs in the graph replay and the split select in the eager calls (the run committed as
`outputs/bench/topk_long_h200.json` predates it); `scripts/topk_dist_probe.py` times the split over programs.
"""

import json
import os
import sys
import time

import torch

import glm5lib.kernels.topk as topk
from glm5lib.kernels.topk import topk_indices, topk_select
from glm5lib.model.spec import GLM5Config
from glm5lib.serving.harness import cuda_timings

K = 2048
SHAPES = [(1, 32768), (4, 32768), (64, 32768), (128, 32768), (1, 65536), (4, 65536), (64, 65536),
          (1, 131072), (4, 131072), (64, 131072)]
CHUNKS = (8192, 16384, 32768)
REPEATS = 50
# the CUDA-graph decode path (`paged.decode_topk`): rows as wide as max_model_len (GLM-5: 202752), each read up to
# its context; beyond it the workspace holds whatever an earlier step left (random here)
WIDE = GLM5Config.glm5().max_position_embeddings  # 202752
WIDE_SHAPES = [(T, L) for T in (1, 64) for L in (4096, 32768, 131072)]


def check(T: int, n: int, dev: str) -> dict:
    g = torch.Generator().manual_seed(T * 7 + n)
    x = torch.randn(T, n, generator=g).to(dev)
    L = torch.full((T,), n, dtype=torch.int32, device=dev)
    one = topk_select(x, K, lengths=L, chunk=n)
    want = topk_indices(x, K).sort(1).values
    res = {}
    for c in CHUNKS:
        if c >= n:
            continue
        got = topk_select(x, K, lengths=L, chunk=c)
        res[f"chunk{c}_equals_one_program"] = bool(torch.equal(got, one))
        res[f"chunk{c}_set_equals_torch_topk"] = bool(torch.equal(got.sort(1).values, want))
    t = torch.randint(-8, 8, (T, n), generator=g).float()
    t[t == 0] = torch.where(torch.rand(int((t == 0).sum()), generator=g) < 0.5, -0.0, 0.0)
    lt = torch.randint(n // 4, n + 1, (T,), generator=g, dtype=torch.int32)
    lt[0] = min(n, K // 2)  # fewer keys than k
    t, lt = t.to(dev), lt.to(dev)
    one_t = topk_select(t, K, lengths=lt, chunk=n)
    for c in CHUNKS:
        if c < n:
            res[f"chunk{c}_ties_equals_one_program"] = bool(torch.equal(topk_select(t, K, lengths=lt, chunk=c), one_t))
    return res


def time_paths(paths: dict) -> dict:
    """`{name}_graph_us` / `{name}_eager_us` per path (`cuda_timings`); a failing path is recorded, not fatal."""
    res = {}
    for name, fn in paths.items():
        try:
            t = cuda_timings(fn, REPEATS)
            res[f"{name}_graph_us"] = t.get("graph_us")
            res[f"{name}_eager_us"] = t["eager_us"]
            if "graph_error" in t:
                res[f"{name}_graph_error"] = t["graph_error"]
        except Exception as e:  # noqa: BLE001  (recorded; the sweep goes on)
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return res


def timings(T: int, n: int, dev: str) -> dict:
    x = torch.randn(T, n, device=dev)
    L = torch.full((T,), n, dtype=torch.int32, device=dev)
    out = torch.empty(T, K, dtype=torch.int32, device=dev)
    paths = {"one_program": lambda: topk_select(x, K, lengths=L, out=out, chunk=n),
             "default": lambda: topk_select(x, K, lengths=L, out=out),
             "torch_topk": lambda: topk_indices(x, K, out=out)}
    for c in CHUNKS:
        if c < n:
            paths[f"chunk{c}"] = lambda c=c: topk_select(x, K, lengths=L, out=out, chunk=c)
    return time_paths(paths)


def wide(T: int, L: int, dev: str) -> dict:
    """One program per row (`chunk=WIDE`, the path before rows were split) against the default split, on
    `[T, WIDE]` rows read up to L: the same picks, and both times."""
    x = torch.randn(T, WIDE, device=dev)
    lens = torch.full((T,), L, dtype=torch.int32, device=dev)
    out = torch.empty(T, K, dtype=torch.int32, device=dev)
    one = topk_select(x, K, lengths=lens, chunk=WIDE).clone()
    res = {"default_equals_one_program": bool(torch.equal(topk_select(x, K, lengths=lens), one)),
           "set_equals_torch_topk_of_the_prefix": bool(torch.equal(one.sort(1).values,
                                                                   topk_indices(x[:, :L], K).sort(1).values))}
    res.update(time_paths({"one_program": lambda: topk_select(x, K, lengths=lens, out=out, chunk=WIDE),
                           "default": lambda: topk_select(x, K, lengths=lens, out=out)}))
    return res


def main(path: str) -> None:
    dev = "cuda"
    t0 = time.time()
    rows = []
    for T, n in SHAPES:
        row = {"T": T, "n": n, "k": K, "default_chunk": topk.SELECT_CHUNK if n > topk.SELECT_MAX_N else None}
        for part in (check, timings):
            try:
                row.update(part(T, n, dev))
            except Exception as e:  # noqa: BLE001
                row[f"{part.__name__}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        oks = [v for key, v in row.items() if key.startswith("chunk") and isinstance(v, bool)]
        cells = " ".join(f"{name}={row.get(f'{name}_graph_us') or float('nan'):7.1f}"
                         for name in ("one_program", "torch_topk", "default", *(f"chunk{c}" for c in CHUNKS)))
        print(f"T{T:<4} N{n:<7} checks {'ok ' if oks and all(oks) else 'BAD'} graph us: {cells}", flush=True)
    for T, L in WIDE_SHAPES:
        row = {"T": T, "n": WIDE, "length": L, "k": K, "wide": True}
        try:
            row.update(wide(T, L, dev))
        except Exception as e:  # noqa: BLE001
            row["wide_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        us = {k: row.get(k) or float("nan") for k in ("one_program_graph_us", "default_graph_us",
                                                        "one_program_eager_us", "default_eager_us")}
        print(f"wide T{T:<3} W{WIDE} L{L:<7} same {row.get('default_equals_one_program')} graph us: one_program="
              f"{us['one_program_graph_us']:7.1f} default={us['default_graph_us']:7.1f}  eager: "
              f"{us['one_program_eager_us']:7.1f} / {us['default_eager_us']:7.1f}", flush=True)
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": __import__("triton").__version__, "select_config": topk.SELECT_CONFIG,
            "select_max_n": topk.SELECT_MAX_N, "select_chunk": topk.SELECT_CHUNK, "repeats": REPEATS,
            "seconds": time.time() - t0}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{time.time() - t0:.0f} s; wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
