"""One paged-indexer decode launch set for Nsight Compute (B=128 requests of 32K keys, 32 index heads, fp8 keys in
vLLM's block-split cache), q as `form`: `q8` (fp8 q, vLLM's path), `f16` / `e4m3x2` (bf16 q rewritten, see
`indexer.PAGED_Q_FORM`) or `bf16` (bf16 q scored as it is).

`ncu -k regex:_indexer_paged_kernel --launch-skip 2 --launch-count 1 --set full python scripts/indexer_ncu_case.py f16`
runs the scores three times (the first two compile and warm up; ncu profiles the third).
"""

from __future__ import annotations

import sys

import torch

from glm5lib.bench import kernels as bench
from glm5lib.kernels import indexer as ix, naive

FORMS = ("q8", "f16", "e4m3x2", "bf16")

if __name__ == "__main__":
    form = sys.argv[1] if len(sys.argv) > 1 else "f16"
    if form not in FORMS:
        sys.exit(f"indexer_ncu_case: form must be one of {FORMS}, got {form!r}")
    cache, table, ctxs, q, w = bench.paged_indexer_case(128, 32768, "fp8", 32)
    if form == "q8":
        q, q_scale = naive.quantize_indexer_q(q)
        w = w * q_scale
    ix.PAGED_Q_REWRITE = form in ("f16", "e4m3x2")
    ix.PAGED_Q_FORM = form if form in ix.Q_FORMS else ix.PAGED_Q_FORM
    for _ in range(3):
        ix.indexer_logits(q, cache, w, scale=naive.INDEXER_DIM ** -0.5, k_format="fp8", block_table=table,
                          context_lens=ctxs, max_len=32768)
    torch.cuda.synchronize()
