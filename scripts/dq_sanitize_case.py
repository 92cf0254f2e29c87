"""Launches of the three-warpgroup kernels for `compute-sanitizer` (sm_90 GPU). The dequantising-producer kernel
(`mla_gluon_large` mode "dq"): split plans (the split partials and their merge), invalid indices (-1, out of range, a
token with none valid), top-k lists that end inside a tile, a split left with no valid key, 40 heads (a partly masked
head block), and its tail plan (`tail_plan`: a second launch on slices of the call's tensors). The ping-pong kernel
(mode "pingpong", bf16 rows): its tail plan. The dq kernel's balanced schedule (`balanced_plan`, forced). Each launch
is compared with `naive.sparse_mla_ref_chunked` (the case matrix's bf16 tolerances), so a wrong result fails here too.

`PYTHONPATH=src compute-sanitizer --tool memcheck python scripts/dq_sanitize_case.py [--bal]` (--bal: the balanced
schedule's 5- and 6-token cases alone)
"""

from __future__ import annotations

import os
import sys

import torch

from glm5lib.kernels import common, mla, mla_gluon_large as gl_large, naive
from glm5lib.kernels.checks import make_indices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_mla_device import compare  # noqa: E402  (the comparison the device scripts use)

# (T, H, top-k, invalid, splits): None is the kernel's own plan (`dq_num_splits`: 16 splits at T4 H128); T160 H64 took
# 2 splits by the plan before round 22's margin (`DQ_SPLIT_MARGIN`), one since, so it asks for 2. T140 H64 and T70
# H128 on 132 SMs take the tail plan (`tail_plan`: 132 tokens / 66 at one split, the rest in 16 splits; a second
# launch on slices of the call's tensors)
CASES = [(160, 64, 2048, "mixed", 2), (4, 128, 2048, "mixed", None), (33, 40, 777, "oob", 3),
         (2, 64, 1000, "allinv", 4), (6, 128, 96, "neg", 2), (140, 64, 2048, "mixed", None),
         (70, 128, 1000, "oob", None)]
# the ping-pong kernel (bf16 rows) on its tail plan: 132 tokens + 16 splits, 66 + 8 (`TAIL_MIN_SPLITS`)
PP_CASES = [(140, 64, 2048, "mixed", None), (70, 128, 1000, "oob", None)]
# the dq kernel's balanced schedule (`balanced_plan`, forced: sched "balanced"): 132 / 66 programs a head block, a
# program's two pieces (q staged again mid-program), the merge over 2-27 programs a token; 40 heads (masked rows)
BAL_CASES = [(70, 64, 2048, "mixed", "balanced"), (34, 128, 2048, "oob", "balanced"),
             (6, 40, 2048, "allinv", "balanced"), (5, 64, 2048, "neg", "balanced")]


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("dq_sanitize_case: needs an sm_90 GPU (wgmma)")
    gen = torch.Generator().manual_seed(3)
    n_rows = 3000
    rows = torch.randn(n_rows, naive.D_QK, generator=gen)
    caches = {"fp8_ds_mla": naive.quantize_fp8_ds_mla(rows).cuda(), "bf16": rows.to(torch.bfloat16).cuda()}
    cases = [("fp8_ds_mla", *c) for c in CASES] + [("bf16", *c) for c in PP_CASES]
    cases += [("fp8_ds_mla", *c) for c in BAL_CASES]
    if "--bal" in sys.argv[1:]:  # the balanced schedule's small cases alone (racecheck / synccheck: slow tools)
        cases = [c for c in cases if c[-1] == "balanced" and c[1] <= 8]
    bad = 0
    for fmt, T, H, topk, invalid, splits in cases:
        mode, cache = mla.GLUON_LARGE_MODES[fmt], caches[fmt]
        q = torch.randn(T, H, naive.D_QK, generator=gen).to(torch.bfloat16).cuda()
        idx = make_indices(T, topk, n_rows, invalid, gen, torch.device("cuda"))
        kw = {"sched": "balanced"} if splits == "balanced" else {"num_splits": splits, "sched": "plan"}
        o, lse = gl_large.sparse_mla_gluon_large(q, cache, idx, 0.0625, kv_format=fmt, mode=mode, **kw)
        ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx, 0.0625, kv_format=fmt, chunk=8)
        r = compare(o, lse, ro, rlse)
        bad += not r["ok"]
        if splits == "balanced":
            P = gl_large.balanced_plan(T, -(-H // 64), topk, common.num_sms(q.device), force=True)
            plan = f"balanced, {P} programs a head block"
        else:
            got = gl_large.plan_splits(T, H, topk, 64, q.device, splits, mode=mode)[0]
            cut = gl_large._tail_cut(T, H, topk, "cuda", q.device.index, mode) if splits is None else None
            plan = f"tail {cut[0]} tokens + {cut[1]} splits" if cut else f"splits {got}"
        print(f"{mode} T{T} H{H} K{topk} {invalid} {plan}: {'ok' if r['ok'] else 'FAILED'} rel {r['rel']:.2e}",
              flush=True)
    print(f"{len(cases) - bad}/{len(cases)} launches match the reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
