"""Does the top-k select's time depend on how the scores are spread? (CUDA GPU, one process)

    PYTHONPATH=src python3 scripts/topk_dist_probe.py OUT.json

`topk.topk_select` counts each radix digit with `tl.histogram`, which Triton lowers to one shared-memory atomic
add per element (`atom.shared.add.u32` in the sm_90 PTX). Its first pass counts the ordered key's top 8 bits: the
sign and the exponent's top 7. Scores of one sign within a factor of four of each other share that digit, so
every element of the first pass adds into the same counter, and a warp's 32 adds to one address are serialised.
If that is what the select's time is made of, it is slower on scores whose top digits agree than on scores whose
top digits are spread over all 256 bins, with the same shapes and the same number of passes, and counting each
digit into 8 or 32 sub-counters (`topk.SPREADS`: a warp's adds to one digit on 8 or 32 neighbouring words) takes
most of the difference away.

Score distributions (same shapes, top-k 2048, every row given its length as the indexer does):
- `spread`: uniform random 32-bit patterns as floats (non-finite ones replaced by 0): the top digit uniform over
  its 256 bins, the least contention;
- `randn`: standard normal (two signs, exponents within a few octaves: a few bins);
- `positive`: |N(0, 1)| + 1 (one sign, [1, 8) mostly: one or two bins, the most contention short of ties);
- `indexer`: what the indexer writes, `sum_h w_h relu(q_h . k)` with 32 heads, signed weights (mixed signs).

Per distribution and shape: one program per row at 32K keys (T 1 and 128) and the split select at 128K keys
(T 1), each with the `VARIANTS` (sub-counters `topk.SPREADS`, the next block loaded ahead or not:
`topk.SELECT_PREFETCH`), and torch.topk, CUDA-graph replay (`serving.harness.cuda_timings`); the shipped select's
picks checked against torch.topk's set (no ties at the cut in these distributions), every variant's against the
shipped select's output (the same picks in the same order).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

import glm5lib.kernels.topk as topk
from glm5lib.kernels.topk import topk_indices, topk_select
from glm5lib.serving.harness import cuda_timings

K = 2048
REPEATS = 30
SHAPES = [(1, 32768, None), (128, 32768, None), (1, 131072, topk.SELECT_CHUNK)]
DISTS = ("spread", "randn", "positive", "indexer")
VARIANTS = [(1, False), (8, False), (32, False), (1, True), (32, True)]  # (spread, prefetch); (1, False) shipped


def scores(dist: str, T: int, n: int, dev: str) -> torch.Tensor:
    g = torch.Generator(device=dev).manual_seed(T * 31 + n)
    if dist == "spread":
        bits = torch.randint(-2**31, 2**31, (T, n), generator=g, device=dev, dtype=torch.int64).to(torch.int32)
        x = bits.view(torch.float32)
        return torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    if dist == "randn":
        return torch.randn(T, n, generator=g, device=dev)
    if dist == "positive":
        return torch.randn(T, n, generator=g, device=dev).abs() + 1.0
    if dist == "indexer":  # 32 heads of relu(q . k) weighted by signed per-head weights, keys in chunks
        q = torch.randn(T, 32, 128, generator=g, device=dev)
        w = torch.randn(T, 32, generator=g, device=dev)
        out = torch.empty(T, n, device=dev)
        for s in range(0, n, 8192):
            k = torch.randn(min(8192, n - s), 128, generator=g, device=dev)
            out[:, s:s + k.shape[0]] = torch.einsum("th,thn->tn", w, torch.relu(torch.einsum("thd,nd->thn", q, k)))
        return out
    raise ValueError(f"unknown distribution {dist!r}; one of {DISTS}")


def top_digit_bins(x: torch.Tensor) -> int:
    """How many of the 256 top-digit bins row 0's ordered keys fill (the first pass's spread)."""
    b = x[0].contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    b = torch.where(x[0] == 0, torch.zeros_like(b), b)
    key = torch.where(b >= 2**31, (~b) & 0xFFFFFFFF, b | 2**31)
    return int(torch.unique(key >> 24).numel())


def main(path: str) -> None:
    dev = "cuda"
    t0 = time.time()
    rows = []
    for dist in DISTS:
        for T, n, chunk in SHAPES:
            row = {"dist": dist, "T": T, "n": n, "chunk": chunk, "k": K}
            try:
                x = scores(dist, T, n, dev)
                row["top_digit_bins"] = top_digit_bins(x)
                L = torch.full((T,), n, dtype=torch.int32, device=dev)
                out = torch.empty(T, K, dtype=torch.int32, device=dev)
                c = chunk or n
                base = topk_select(x, K, lengths=L, chunk=c, spread=1, prefetch=False).clone()
                want = topk_indices(x, K).sort(1).values
                row["set_equals_torch_topk"] = bool(torch.equal(base.sort(1).values, want))
                for s, p in VARIANTS:
                    name = f"spread{s}" + ("_prefetch" if p else "")
                    if (s, p) != (1, False):
                        row[f"{name}_equals_spread1"] = bool(torch.equal(
                            topk_select(x, K, lengths=L, chunk=c, spread=s, prefetch=p), base))
                    t = cuda_timings(lambda s=s, p=p: topk_select(x, K, lengths=L, out=out, chunk=c, spread=s,
                                                                  prefetch=p), REPEATS)
                    row[f"select_{name}_graph_us"] = t.get("graph_us")
                t = cuda_timings(lambda: topk_indices(x, K, out=out), REPEATS)
                row["torch_topk_graph_us"] = t.get("graph_us")
            except Exception as e:  # noqa: BLE001  (recorded; the sweep goes on)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "select_config": topk.SELECT_CONFIG, "variants": VARIANTS, "repeats": REPEATS, "seconds": time.time() - t0}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{time.time() - t0:.0f} s; wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not torch.cuda.is_available():
        sys.exit("usage: topk_dist_probe.py OUT.json (needs a CUDA GPU)")
    main(sys.argv[1])
