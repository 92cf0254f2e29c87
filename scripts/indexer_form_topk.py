"""What each way of scoring bf16 q over fp8 keys does to the indexer's top-k (GPU): the decode case of the benchmark
(B requests of 32K keys, 32 index heads, vLLM's block-split fp8 cache), every query's scores against the fp32
reference (`naive.indexer_logits_ref`), for q rewritten into fp16 (the default, exact for bf16 values), into two
e4m3 terms ("e4m3x2", `indexer.PAGED_Q_FORM`), scored as it is (a bf16 dot), and quantized to fp8 with a scale per
(token, head) (vLLM's own path). Per form: the scores' relative error, the share of each row's top-2048 positions
that the reference's top-2048 also holds (worst row, mean, rows identical) and the eager time of the call; each
form launched with the rule's tiles a program and register cap (`indexer.paged_tiles`, `paged_maxnreg`).

`--fp32-q` (from round 34): q is drawn in fp32 and rounded to bf16 for the kernels, and every form is also compared
with the top-2048 of that fp32 q ("_fp32" keys), beside a row "bf16 rounding" (the bf16 q's own reference
against the fp32 one): how much the rounding a bf16 GEMM output already carries moves the picks, against what each
form adds to it.

`PYTHONPATH=src python scripts/indexer_form_topk.py OUT.json [--batch 128] [--ctx 32768] [--fp32-q]`
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--fp32-q", action="store_true", help="draw q in fp32 and compare with its top-k too")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("indexer_form_topk: needs a CUDA GPU")
    from glm5lib.bench.kernels import TOPK, _indexer_knobs, _median_ms, paged_indexer_case, source_commit
    from glm5lib.kernels import indexer as ix
    from glm5lib.kernels import naive
    from glm5lib.kernels.topk import topk_overlap

    g = torch.Generator(device="cuda").manual_seed(0)
    cache, table, ctxs, q, w = paged_indexer_case(a.batch, a.ctx, "fp8", 32, generator=g)
    kw = dict(scale=naive.INDEXER_DIM ** -0.5, k_format="fp8", block_table=table, context_lens=ctxs, max_len=a.ctx)
    ref = naive.indexer_logits_ref(q.float(), cache, w, **kw)
    want = ref.topk(TOPK).indices
    want32 = None
    if a.fp32_q:  # a fresh standard normal q in fp32 (the same keys and weights); the kernels get it rounded to bf16
        q32 = torch.randn(q.shape, device="cuda", generator=g)
        q = q32.bfloat16()
        ref = naive.indexer_logits_ref(q.float(), cache, w, **kw)
        want = ref.topk(TOPK).indices
        want32 = naive.indexer_logits_ref(q32, cache, w, **kw).topk(TOPK).indices

    def agreement(got):
        out = {}
        for tag, sel in (("", want), ("_fp32", want32)):
            if sel is None:
                continue
            agree = torch.tensor(topk_overlap(got.topk(TOPK).indices, sel), dtype=torch.float64) / TOPK
            out.update({f"topk_agree_min{tag}": float(agree.min()), f"topk_agree_mean{tag}": float(agree.mean()),
                        f"rows_identical{tag}": int((agree == 1).sum())})
        return out

    q8, amax = naive.quantize_indexer_q(q)
    forms = [("f16", True, "f16", q, w), ("e4m3x2", True, "e4m3x2", q, w), ("bf16 dot", False, "f16", q, w),
             ("fp8 q", None, "f16", q8, w * amax)]
    rows = []
    if want32 is not None:
        rows.append({"form": "bf16 rounding", "rows": len(want), **agreement(ref)})
        print(json.dumps(rows[-1]), flush=True)
    with _indexer_knobs():
        for label, rewrite, form, qq, ww in forms:
            ix.PAGED_Q_REWRITE, ix.PAGED_Q_FORM = rewrite, form
            got = ix.indexer_logits(qq, cache, ww, **kw)
            dev = got.device
            launched = {"tiles": ix.paged_tiles("fp8", dev, ix.paged_q_form(qq.dtype, "fp8", dev))}
            rows.append({"form": label, "rel_err": float((got - ref).norm() / ref.norm()), **agreement(got),
                         "rows": len(want), **launched,
                         "us": 1000 * _median_ms(lambda: ix.indexer_logits(qq, cache, ww, out=got, **kw))})
            print(json.dumps(rows[-1]), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "commit": source_commit(), "batch": a.batch, "ctx": a.ctx,
            "heads": 32, "topk": TOPK, "q_drawn": "fp32" if a.fp32_q else "bf16"}
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
