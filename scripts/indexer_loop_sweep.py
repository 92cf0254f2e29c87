"""The paged indexer's looping grid (`row_bound_only`, what CUDA-graph decode launches) against the one-tile-per-
program launch, per `PAGED_LOOP_PROGRAMS_PER_SM`, on a GPU. Rows as wide as max_model_len (128K) with 32K-token
contexts, as a captured decode step sees them; the one-tile launch gets rows of the context (its best case).

usage: python scripts/indexer_loop_sweep.py OUT.json   (on the H200: PYTHONPATH=src)
"""

from __future__ import annotations

import json
import os
import sys

import torch

from glm5lib.bench.kernels import _median_ms, _row, measure_ceilings, paged_indexer_case
from glm5lib.kernels import indexer as ix
from glm5lib.kernels import naive

CTX, WIDTH, HI = 32768, 131072, 32
PROGRAMS = (8, 16, 32, 64, 128)


def main(out_path: str) -> int:
    ceil = measure_ceilings()
    rows = []
    keep = ix.PAGED_LOOP_PROGRAMS_PER_SM
    for B in (32, 128):
        for fmt, q_fp8 in (("fp8", False), ("fp8", True), ("bf16", False)):
            g = torch.Generator(device="cuda").manual_seed(B)
            cache, bt, ctxs, q, w = paged_indexer_case(B, CTX, fmt, HI, width=WIDTH, generator=g)
            if q_fp8:
                q, amax = naive.quantize_indexer_q(q)
                w = w * amax
            kw = dict(scale=naive.INDEXER_DIM ** -0.5, k_format=fmt, block_table=bt, context_lens=ctxs)
            row_b = naive.INDEXER_FP8_ROW_BYTES if fmt == "fp8" else 2 * naive.INDEXER_DIM
            byts, flops = B * CTX * (row_b + 4), ix.indexer_flops(B, CTX, HI)  # keys read + fp32 scores written
            tag = f"{fmt}{'-q8' if q_fp8 else ''}"

            def row(launch, ms, extra=None):
                return _row("indexer-decode-loop", launch, B, HI, CTX, fmt, ms, flops, byts, ceil,
                            {"B": B, "format": tag, "launch": launch, **(extra or {})})

            ref = ix.indexer_logits(q, cache, w, max_len=CTX, **kw)
            rows.append(row("one-tile", _median_ms(lambda: ix.indexer_logits(q, cache, w, max_len=CTX, out=ref, **kw))))
            wide = torch.empty(B, WIDTH, device="cuda")
            for p in PROGRAMS:
                ix.PAGED_LOOP_PROGRAMS_PER_SM = p
                ix.indexer_logits(q, cache, w, max_len=WIDTH, out=wide, row_bound_only=True, **kw)
                same = bool(torch.equal(wide[:, :CTX], ref))
                ms = _median_ms(lambda: ix.indexer_logits(q, cache, w, max_len=WIDTH, out=wide, row_bound_only=True,
                                                          **kw))
                rows.append(row(f"loop{p}", ms, {"same_scores": same}))
            ix.PAGED_LOOP_PROGRAMS_PER_SM = keep
            for r in rows[-1 - len(PROGRAMS):]:
                print(json.dumps(r), flush=True)
            del cache, wide
    res = {"meta": {"commit": os.environ.get("GLM5LIB_COMMIT"), "ctx": CTX, "width": WIDTH, "HI": HI,
                    "shipped_programs_per_sm": keep}, "ceilings": ceil, "rows": rows}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
