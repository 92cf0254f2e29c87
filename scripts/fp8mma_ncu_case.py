"""One `mla_gluon_fp8mma` launch set for Nsight Compute: `prefill` (s_q 4096 over one 32K sequence) or `decode`
(B=128, one 32K request per token), HEADS heads (8 unless given); fp8_ds_mla, top-k 2048.

`ncu -k regex:_sparse_mla_fp8mma --launch-skip 2 --launch-count 1 --set full python scripts/fp8mma_ncu_case.py prefill
[HEADS [CONFIG]]` runs the kernel three times (the first two compile and warm up; ncu profiles the third); CONFIG:
`mla_gluon_fp8mma.Config`'s fields in order, comma-separated (default: the shipped sm_90 build).
"""

from __future__ import annotations

import sys

import torch

from glm5lib.bench import kernels as bench
from glm5lib.kernels import mla_gluon_fp8mma as fm, naive

if __name__ == "__main__":
    H = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    if sys.argv[1:2] == ["decode"]:
        q, cache, base = bench._make_decode(128, H, 32768, bench.TOPK, "fp8_ds_mla")
        idx = bench._rand_indices(128, 32768, bench.TOPK, base)
    else:
        cache = naive.quantize_fp8_ds_mla(torch.randn(32768, naive.D_QK, device="cuda", dtype=torch.bfloat16))
        q = torch.randn(4096, H, naive.D_QK, device="cuda", dtype=torch.bfloat16)
        idx = bench._rand_indices(4096, 32768, bench.TOPK)
    cfg = fm.Config(*(int(x) for x in sys.argv[3].split(","))) if len(sys.argv) > 3 else fm.DEFAULT
    for _ in range(3):
        fm.sparse_mla_fp8mma(q, cache, idx, bench.SM_SCALE, **fm.config_kwargs(cfg))
    torch.cuda.synchronize()
