"""The three-warpgroup kernels' last partial wave at decode, 64 and 128 heads, top-k 2048, one 32K-row request a token:
one launch of the split plan (one split over several waves at these batches) beside the tail plan
(`mla_gluon_large.tail_plan`: the whole waves at one split, the last wave's tokens split in a second launch and
merged), for the dequantising-producer kernel (mode "dq", fp8_ds_mla rows, beside FlashMLA) and the ping-pong kernel
(mode "pingpong", bf16 rows). The tail plan is timed wherever it applies, whether or not the mode's calls take it
(`TAIL_MIN_SPLITS`). Each launch's output (and lse, for the Gluon calls; round 23's two runs compared outputs only) is
checked against the fp32 reference (`naive.sparse_mla_ref_chunked`) before it is timed and again after (the pre-bound
launchers' output), and so is `sparse_mla_gluon_large`'s own choice. Times:
CUDA-graph replay over rotated index sets, and eager (calls back to back). Needs an sm_90 GPU. (Round 23's first run,
`sweeps/dq_tail_h100_18bdc50.json`, was this script's fp8 half under the name `dq_tail_probe.py`.)

`PYTHONPATH=src python scripts/tail_probe.py OUT.json [--vendor .vendor] [--formats fp8_ds_mla,bf16]
[--batches64 140,150] [--batches128 70,80]`
"""

from __future__ import annotations

import json
import os
import sys

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import common, mla, mla_gluon_large as gl_large, naive

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from large_small_batch_probe import _ints, eager_us, flashmla_padded, write_rows  # noqa: E402

# the rest of the last wave (tokens x head blocks beyond whole waves of 132 SMs) from 1 to 66 at each head count
BATCHES = {64: [133, 140, 150, 160, 170, 180, 198, 270, 300], 128: [67, 70, 75, 80, 85, 96, 99, 140, 150]}


def check_and_time(impls: dict, idx_sets: list, out, ro, rlse, base: dict, rows: list) -> int:
    """Each call of `impls` (name -> call of an index set returning (out, lse or None), writing into `out`) checked
    against the fp32 reference (ro, rlse) on the first index set, then timed (CUDA-graph replay over every set, and
    eager) and checked again (the pre-bound launchers' output), except "shipped" (one of the others by the rule:
    checked, not timed). Appends a row each (base + impl, rel_err, ok, times) to rows, prints it; returns the
    failures."""

    def check(o, lse):
        """Relative error of the output against fp32, and whether it (and lse, where the call returns one: the
        Gluon calls, natural log like the reference's) is close."""
        rel = float((o.float() - ro).norm() / ro.norm())
        ok = rel < 1e-2 and not torch.isnan(o).any()
        if lse is not None:
            ok = ok and torch.allclose(lse.float(), rlse.float(), rtol=1e-3, atol=1e-3)
        return rel, bool(ok)

    bad = 0
    for name, fn in impls.items():
        out.fill_(float("nan"))
        rel, ok = check(*fn(idx_sets[0]))
        r = {**base, "impl": name, "rel_err": rel, "ok": ok}
        if name != "shipped":
            for i in idx_sets[1:]:
                fn(i)  # FlashMLA's scheduler metadata per index set, outside the capture
            r["graph_us"] = bk._graph_ms([lambda i=i: fn(i) for i in idx_sets]) * 1e3
            r["eager_us"] = eager_us(lambda: fn(idx_sets[0]))
            out.fill_(float("nan"))
            r["rel_err_again"], ok_again = check(*fn(idx_sets[0]))
            r["ok"] = ok and ok_again
        bad += not r["ok"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    return bad


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("--"):
        sys.exit("usage: tail_probe.py OUT.json [--vendor DIR] [--formats ...] [--batches64 ...] [--batches128 ...]")
    out_path = argv[0]
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit("tail_probe: needs an sm_90 GPU (wgmma)")
    batches = {64: _ints(argv, "--batches64", BATCHES[64]), 128: _ints(argv, "--batches128", BATCHES[128])}
    formats = argv[argv.index("--formats") + 1].split(",") if "--formats" in argv else ["fp8_ds_mla", "bf16"]
    if any(f not in mla.GLUON_LARGE_MODES for f in formats):
        sys.exit(f"tail_probe: --formats must name {sorted(mla.GLUON_LARGE_MODES)}, got {formats}")
    n_sms = common.num_sms(torch.device("cuda"))
    fm_err = bk.load_flashmla(vendor)
    rows, bad = [], 0
    for fmt, H, B in [(f, H, B) for f in formats for H in (64, 128) for B in batches[H]]:
        mode = mla.GLUON_LARGE_MODES[fmt]
        n_hb = -(-H // 64)
        cut = gl_large.tail_plan(B, n_hb, bk.TOPK, n_sms, mode)
        q, cache, base = bk._make_decode(B, H, 32768, bk.TOPK, fmt)
        flat = cache.view(-1, cache.shape[-1])
        R = bk._rotations(bk.sparse_mla_kv_bytes(B, bk.TOPK, fmt))
        idx_sets = [bk._rand_indices(B, 32768, bk.TOPK, base) for _ in range(R)]
        out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
        ro, rlse = naive.sparse_mla_ref_chunked(q, flat, idx_sets[0], bk.SM_SCALE, kv_format=fmt, chunk=16)

        def call(i, **kw):
            return gl_large.sparse_mla_gluon_large(q, flat, i, bk.SM_SCALE, kv_format=fmt, out=out, mode=mode, **kw)

        def tail(i, cut=cut):
            whole, splits = cut
            _, l0 = gl_large.sparse_mla_gluon_large(q[:whole], flat, i[:whole], bk.SM_SCALE, kv_format=fmt,
                                                    out=out[:whole], mode=mode, num_splits=1)
            _, l1 = gl_large.sparse_mla_gluon_large(q[whole:], flat, i[whole:], bk.SM_SCALE, kv_format=fmt,
                                                    out=out[whole:], mode=mode, num_splits=splits)
            return out, torch.cat([l0, l1])

        impls = {"one_launch": lambda i: call(i, tail=False), "shipped": lambda i: call(i)}
        if cut is not None:
            impls["tail"] = tail
        if fm_err is None and fmt == "fp8_ds_mla":
            impls["flashmla"] = flashmla_padded(q, cache, H)

        base = {"format": fmt, "H": H, "B": B, "rest": B * n_hb % n_sms, "waves": -(-B * n_hb // n_sms),
                "cut": list(cut) if cut else None,
                "shipped": "tail" if cut and cut[1] >= gl_large.TAIL_MIN_SPLITS.get(mode, 99) else "one_launch"}
        bad += check_and_time(impls, idx_sets, out, ro, rlse, base, rows)
        del q, cache, idx_sets, out, ro, impls
        torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(), "sm_count": n_sms,
            "flashmla": fm_err or "loaded", "tail_min_splits": gl_large.TAIL_MIN_SPLITS}
    return write_rows(out_path, meta, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
