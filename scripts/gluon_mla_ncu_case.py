"""One Gluon small-head decode launch set for Nsight Compute (B=128, H=8, fp8_ds_mla, ctx 32K, top-k 2048).

`ncu -k regex:_sparse_mla_gluon --launch-skip 2 --launch-count 1 --section ... python scripts/gluon_mla_ncu_case.py`
runs the kernel three times (the first two compile and warm up; ncu profiles the third).
"""

from __future__ import annotations

import sys

import torch

from glm5lib.bench import kernels as bench
from glm5lib.kernels import mla_gluon

if __name__ == "__main__":
    ws = "--ws" in sys.argv
    q, cache, base = bench._make_decode(128, 8, 32768, bench.TOPK, "fp8_ds_mla")
    idx = bench._rand_indices(128, 32768, bench.TOPK, base)
    for _ in range(3):
        mla_gluon.sparse_mla_gluon(q, cache, idx, bench.SM_SCALE, ws=ws)
    torch.cuda.synchronize()
