"""Time the dequantising-producer kernel (`mla_gluon_large` mode "dq") at fp8 decode (top-k 2048, 64 and 128 heads)
with several split counts of the top-k list, beside the shipped split plan (`dq_num_splits`) and FlashMLA (CUDA-graph
replay over rotated index sets, as `scripts/gluon_mla_large_device.py`): the data the plan's constants were fitted to
(B128, 1-4 splits, with the producer alone) and, with --batches, other batch sizes to test it on. Needs an sm_90 GPU.

`PYTHONPATH=src python scripts/dq_splits_probe.py OUT.json [--vendor .vendor] [--batches 32,64,256] [--triton]`
(--triton: the Triton kernel too, `mla.sparse_mla_launch`, which `sparse_mla` takes below `mla.GLUON_LARGE_MIN_HT`
tokens x heads)."""

from __future__ import annotations

import json
import os
import sys

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import mla, mla_gluon_large as gl_large


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_path = argv[0] if argv else "dq_splits.json"
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("dq_splits_probe: needs an sm_90 GPU (wgmma)")
    batches = [int(b) for b in argv[argv.index("--batches") + 1].split(",")] if "--batches" in argv else [128]
    if any(b < 1 for b in batches):
        sys.exit(f"dq_splits_probe: batch sizes must be >= 1, got {batches}")
    fm_err = bk.load_flashmla(vendor)
    rows = []
    for B, H in [(B, H) for B in batches for H in (64, 128)]:
        q, cache, base_rows = bk._make_decode(B, H, 32768, bk.TOPK, "fp8_ds_mla")
        flat = cache.view(-1, cache.shape[-1])
        R = bk._rotations(bk.sparse_mla_kv_bytes(B, bk.TOPK, "fp8_ds_mla"))
        idx_sets = [bk._rand_indices(B, 32768, bk.TOPK, base_rows) for _ in range(R)]
        out = torch.empty(B, H, 512, device="cuda", dtype=torch.bfloat16)
        plan = gl_large.plan_splits(B, H, bk.TOPK, 64, q.device, mode="dq")[0]
        fitted = B == 128  # the fit's data: 1-4 splits, whole and producer alone; elsewhere the plan and its neighbours
        tries = (None, 1, 2, 3, 4) if fitted else [None] + sorted(
            s for s in {max(1, plan // 2), max(1, plan - 1), plan + 1, 2 * plan} - {plan} if s <= mla.MAX_SPLITS)
        for splits in tries:
            for probe in (0, 1) if fitted else (0,):
                ms = bk._graph_ms([lambda i=i: gl_large.sparse_mla_gluon_large(
                    q, flat, i, bk.SM_SCALE, kv_format="fp8_ds_mla", out=out, mode="dq", num_splits=splits,
                    probe=probe, tail=False) for i in idx_sets])  # one launch of the split plan (no tail plan)
                got = gl_large.plan_splits(B, H, bk.TOPK, 64, q.device, splits, mode="dq")[0]
                r = {"H": H, "B": B, "splits": got, "planned": splits is None, "probe": probe,
                     "us": ms * 1e3}
                rows.append(r)
                print(json.dumps(r), flush=True)
        if "--triton" in argv:
            ms = bk._graph_ms([lambda i=i: mla.sparse_mla_launch(q, flat, i, bk.SM_SCALE, kv_format="fp8_ds_mla",
                                                                 out=out) for i in idx_sets])
            rows.append({"H": H, "B": B, "impl": "triton", "us": ms * 1e3, "probe": 0})
            print(json.dumps(rows[-1]), flush=True)
        if fm_err is None:
            q4 = q.unsqueeze(1).contiguous()
            kv4 = cache.view(torch.float8_e4m3fn).unsqueeze(2)
            fms = {}

            def fm_call(i):
                f = fms.setdefault(i.data_ptr(), bk.FlashMLADecode())
                return f(q4, kv4, i.unsqueeze(1))

            for i in idx_sets:
                fm_call(i)
            ms = bk._graph_ms([lambda i=i: fm_call(i) for i in idx_sets])
            rows.append({"H": H, "B": B, "impl": "flashmla", "us": ms * 1e3, "probe": 0})
            print(json.dumps(rows[-1]), flush=True)
        del q, cache, idx_sets, out
        torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "flashmla": fm_err or "loaded"}
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
