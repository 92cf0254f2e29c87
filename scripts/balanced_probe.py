"""The dequantising-producer kernel (`mla_gluon_large` mode "dq", fp8_ds_mla rows) below one wave, 64 and 128 heads,
top-k 2048, one 32K-row request a token: its split plan (`dq_num_splits`; sched "plan") beside the balanced schedule
(`balanced_plan`: P = SMs / head blocks programs, each a run of the tokens' concatenated lists, merged by
`merge_runs`; forced with sched "balanced") and FlashMLA padded to 64 / 128 heads. Every launch's output and lse are
checked against fp32 before and after timing (`tail_probe.check_and_time`), and so is `sparse_mla_gluon_large`'s
own choice ("shipped", by the rule). Times: CUDA-graph replay over rotated index sets, and eager. Needs an sm_90 GPU.

`PYTHONPATH=src python scripts/balanced_probe.py OUT.json [--vendor .vendor] [--batches64 20,70] [--batches128 10,34]`
"""

from __future__ import annotations

import os
import sys

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import common, mla_gluon_large as gl_large, naive

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from large_small_batch_probe import _ints, flashmla_padded, write_rows  # noqa: E402
from tail_probe import check_and_time  # noqa: E402

# below one wave of 132 SMs at each head count: where the split plan fills the SMs (B32 / B16: 4 splits), where it
# leaves a quarter to half of them idle (B48-B100 / B24-B50), and near one wave
BATCHES = {64: [8, 20, 28, 32, 40, 48, 56, 68, 76, 88, 100, 116, 128], 128: [4, 10, 16, 20, 24, 28, 34, 40, 50, 60]}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("--"):
        sys.exit("usage: balanced_probe.py OUT.json [--vendor DIR] [--batches64 ...] [--batches128 ...]")
    out_path = argv[0]
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit("balanced_probe: needs an sm_90 GPU (wgmma)")
    batches = {64: _ints(argv, "--batches64", BATCHES[64]), 128: _ints(argv, "--batches128", BATCHES[128])}
    n_sms = common.num_sms(torch.device("cuda"))
    fm_err = bk.load_flashmla(vendor)
    rows, bad = [], 0
    for H, B in [(H, B) for H in (64, 128) for B in batches[H]]:
        n_hb = -(-H // 64)
        q, cache, base_row = bk._make_decode(B, H, 32768, bk.TOPK, "fp8_ds_mla")
        flat = cache.view(-1, cache.shape[-1])
        R = bk._rotations(bk.sparse_mla_kv_bytes(B, bk.TOPK, "fp8_ds_mla"))
        idx_sets = [bk._rand_indices(B, 32768, bk.TOPK, base_row) for _ in range(R)]
        out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
        ro, rlse = naive.sparse_mla_ref_chunked(q, flat, idx_sets[0], bk.SM_SCALE, kv_format="fp8_ds_mla", chunk=16)

        def call(i, **kw):
            return gl_large.sparse_mla_gluon_large(q, flat, i, bk.SM_SCALE, kv_format="fp8_ds_mla", out=out,
                                                   mode="dq", **kw)

        impls = {"plan": lambda i: call(i, sched="plan")}
        P = gl_large.balanced_plan(B, n_hb, bk.TOPK, n_sms, force=True)
        if P:
            impls["balanced"] = lambda i: call(i, sched="balanced")
        impls["shipped"] = call
        if fm_err is None:
            impls["flashmla"] = flashmla_padded(q, cache, H)
        splits = gl_large.plan_splits(B, H, bk.TOPK, 64, q.device, mode="dq")[0]
        rule = gl_large.balanced_plan(B, n_hb, bk.TOPK, n_sms)
        base = {"format": "fp8_ds_mla", "H": H, "B": B, "splits": splits, "programs": B * n_hb * splits,
                "bal_programs": P and P * n_hb, "shipped": "balanced" if rule else "plan"}
        bad += check_and_time(impls, idx_sets, out, ro, rlse, base, rows)
        del q, cache, idx_sets, out, ro, impls
        torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(), "sm_count": n_sms,
            "flashmla": fm_err or "loaded", "bal_max_fill": gl_large.BAL_MAX_FILL}
    return write_rows(out_path, meta, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
