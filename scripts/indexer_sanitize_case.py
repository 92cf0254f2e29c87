"""Paged indexer launches for `compute-sanitizer --tool memcheck` (GPU): bf16 q over fp8 keys in each rewrite
(`indexer.PAGED_Q_FORM`: fp16 by a prepass or inside the scores kernel, two e4m3 terms) and as it is (a bf16 dot),
fp8 q, and bf16 q over bf16 keys; 32 and 24 index heads (a masked head tile), both launch grids, one tile and four
tiles a program besides the rule's count (`indexer.PAGED_TILES`: 8 over bf16 keys on the H200 and 4 for two e4m3
terms, so a program's tiles run past the row's end), contexts that end inside a tile, and a padding request.
Each launch is compared with `naive.indexer_logits_ref` (bf16 tolerance), so a wrong result fails here too.

`PYTHONPATH=src compute-sanitizer --tool memcheck python scripts/indexer_sanitize_case.py`
"""

from __future__ import annotations

import sys

import torch

from glm5lib.bench.kernels import _indexer_knobs
from glm5lib.kernels import indexer as ix
from glm5lib.kernels import naive


def main() -> int:
    if not torch.cuda.is_available():
        sys.exit("indexer_sanitize_case: needs a CUDA GPU")
    g = torch.Generator().manual_seed(0)
    bs, nb = 64, 40
    keys = torch.randn(nb * bs, 128, generator=g)
    cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(keys), bs).cuda()
    cache16 = keys.to(torch.bfloat16).view(nb, bs, 128).cuda()
    table = torch.randperm(nb, generator=g)[:36].view(4, 9).to(torch.int32).cuda()
    ctx = torch.tensor([576, 0, 300, 77], dtype=torch.int32).cuda()
    bad = total = 0
    with _indexer_knobs():  # the module's knobs back as they were, however the launches end
        for HI in (32, 24):
            q = torch.randn(4, HI, 128, generator=g).to(torch.bfloat16).cuda()
            w = (torch.rand(4, HI, generator=g) * HI ** -0.5).cuda()
            q8, amax = naive.quantize_indexer_q(q.float())
            kw = dict(k_format="fp8", block_table=table, context_lens=ctx, max_len=9 * bs, scale=128 ** -0.5)
            ref = naive.indexer_logits_ref(q.float(), cache, w, **kw)
            ref8 = naive.indexer_logits_ref(q8.float(), cache, w * amax, **kw)
            kw16 = {**kw, "k_format": "bf16"}
            ref16 = naive.indexer_logits_ref(q.float(), cache16, w, **kw16)
            runs = [(form, True, form, q, w, ref, cache, kw) for form in ix.Q_FORMS]
            runs += [("bf16", False, "f16", q, w, ref, cache, kw), ("q8", None, "f16", q8, w * amax, ref8, cache, kw),
                     ("bf16 keys", None, "f16", q, w, ref16, cache16, kw16)]
            for label, rewrite, form, qq, ww, want, kc, kwk in runs:
                ix.PAGED_Q_REWRITE, ix.PAGED_Q_FORM = rewrite, form
                for loop, tiles in ((False, None), (False, 1), (False, 4), (True, None)):
                    ix.PAGED_TILES = tiles
                    out = torch.full_like(want, float("-inf"))
                    ix.indexer_logits(qq, kc, ww, out=out, row_bound_only=loop, **kwk)
                    fin = torch.isfinite(want)
                    ok = torch.equal(torch.isinf(out), torch.isinf(want)) and torch.allclose(out[fin], want[fin],
                                                                                             rtol=1e-3, atol=1e-3)
                    bad += not ok
                    total += 1
                    fmt = kwk["k_format"]
                    per = ix.paged_tiles(fmt, q.device, ix.paged_q_form(qq.dtype, fmt, q.device))
                    how = " loop" if loop else f" {per} tiles a program"
                    print(f"indexer paged H{HI} {label}{how}: {'ok' if ok else 'FAILED'}", flush=True)
    print(f"{total - bad}/{total} indexer launches match the reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
