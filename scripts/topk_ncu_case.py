"""One top-k select launch for Nsight Compute: `topk_select` over `rows` rows of `n` scores (standard normal, or
`narrow` = 1 + 0.01 randn), top-k 2048, the one-program select (`multi=False`, rows up to 32K keys), as shipped
(`topk.SELECT_SPARSE`, `topk.SELECT_SCAN_ROWS`, `topk.SELECT_AGG`), or with `agg` every pass counted by
warp-aggregated adds (`topk.SELECT_AGG` 1). (Before round 29's v37, 19717c6 and earlier, "as shipped" had no adds.)

`ncu -k regex:_topk_select_kernel --launch-skip 2 --launch-count 1 --set full python scripts/topk_ncu_case.py 1 32768`
runs the select three times (the first two compile and warm up; ncu profiles the third) and checks its picks
against torch.topk's set.
"""

from __future__ import annotations

import sys

import torch

import glm5lib.kernels.topk as topk
from glm5lib.kernels.topk import topk_indices, topk_select

if __name__ == "__main__":
    args = sys.argv[1:]
    flags = args[2:]
    if len(args) < 2 or not all(a.isdigit() for a in args[:2]) or not set(flags) <= {"narrow", "agg"}:
        sys.exit("usage: topk_ncu_case.py ROWS N [narrow] [agg]")
    if not torch.cuda.is_available():
        sys.exit("topk_ncu_case: needs a CUDA GPU")
    T, n = int(args[0]), int(args[1])
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(T, n, generator=g, device="cuda")
    if "narrow" in flags:
        x = 1 + 0.01 * x
    if "agg" in flags:  # round 29's v37 (01285c0): adds in every pass; without: as shipped
        topk.SELECT_AGG = 1
    L = torch.full((T,), n, dtype=torch.int32, device="cuda")
    for _ in range(3):
        got = topk_select(x, 2048, lengths=L, multi=False)
    torch.cuda.synchronize()
    same = torch.equal(got.sort(1).values, topk_indices(x, 2048).sort(1).values)
    print(f"topk_ncu_case: {T} x {n}, picks equal torch.topk's set: {same}")
