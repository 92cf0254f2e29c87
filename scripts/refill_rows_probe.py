"""The early refill's copy modes side by side (`mla_gluon_fp8mma.REFILL_ROWS_MODES`; GPU, one process).

`PYTHONPATH=src python scripts/refill_rows_probe.py OUT.json [--heads 8] [--tokens 528,2112,4096,8192] [--reps 3]
[--no-flashmla] [--ablate]`

The 1-8-head prefill over an fp8_ds_mla cache refills its one ring slot chunk by chunk behind each P V product
(`REFILLS`). Mode 0 copies each row's chunk as two 64-byte halves, one per warp; mode 1 copies it as one 128-byte
piece, the warps along the rows; mode 2 also copies a row's four scales at once. The shipped route
(`mla.sparse_mla`, eager, as `glm5lib bench` times the prefill) is timed under each mode in turn, `--reps` rounds
of (0, 1, 2), so that drift of the clock or the L2 falls on each; the modes copy the same bytes (the scales into
another order), so their outputs must be bit-equal, and the first 64 tokens' outputs are checked against the fp32
reference. FlashMLA's bf16 prefill (padded to 64 heads, when `.vendor` holds its library) is timed before and after
each token count's rounds: the ratio the issue's target asks for, and its drift. `--ablate` adds the parts alone
(`mla_gluon_fp8mma.ablate_launch`): each mode's early-refill copies with nothing computed ("refill"; mode 0's copies
have no barriers of their own, the kernel's came from its reads, so there they run between one barrier a tile), the
whole-tile gathers and the compute alone as round 13 took them apart, and the whole kernel on the one-a-token grid.
One 32K-token sequence, random distinct top-k 2048 rows per token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import mla, mla_gluon_fp8mma as fm, naive

S_KV = 32768


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", default="528,2112,4096,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--ablate", action="store_true",
                    help="also the parts alone (`ablate_launch`): each mode's early-refill copies (\"refill\"), the "
                         "whole-tile gathers, the compute, and the whole kernel on the one-a-token grid")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("refill_rows_probe: needs a CUDA GPU")
    dev = torch.device("cuda")
    H = a.heads
    fm_err = None if a.no_flashmla else bk.load_flashmla()
    cache, kv = bk.fp8_ds_mla_rows(S_KV, dev)
    shipped = fm.REFILL_ROWS
    rows = []
    try:
        for T in [int(x) for x in a.tokens.split(",")]:
            q = torch.randn(T, H, naive.D_QK, device=dev, dtype=torch.bfloat16)
            idx = bk._rand_indices(T, S_KV, bk.TOPK)
            ref, _ = naive.sparse_mla_ref_chunked(q[:64], cache, idx[:64], bk.SM_SCALE, kv_format="fp8_ds_mla",
                                                  chunk=32)
            row = {"T": T, "H": H}
            qp = None
            if fm_err is None and not a.no_flashmla:
                qp = bk.pad_heads(q, 64)

                def flash():
                    return bk.flashmla_prefill(qp, kv.unsqueeze(1), idx.unsqueeze(1))
                row["flashmla_us_before"] = 1e3 * bk._median_ms(flash)
            outs = {}
            times = {m: [] for m in fm.REFILL_ROWS_MODES}
            for _ in range(a.reps):
                for m in fm.REFILL_ROWS_MODES:
                    fm.set_refill_rows(m)
                    out = torch.empty(T, H, naive.D_NOPE, device=dev, dtype=torch.bfloat16)
                    o, lse = mla.sparse_mla(q, cache, idx, bk.SM_SCALE, kv_format="fp8_ds_mla", out=out)
                    outs.setdefault(m, (o.clone(), lse.clone()))
                    times[m].append(1e3 * bk._median_ms(lambda: mla.sparse_mla(
                        q, cache, idx, bk.SM_SCALE, kv_format="fp8_ds_mla", out=out)))
            for m in fm.REFILL_ROWS_MODES:
                o = outs[m][0]
                row[f"rows{m}_us"] = times[m]
                row[f"rows{m}_us_median"] = statistics.median(times[m])
                row[f"rows{m}_rel"] = float((o[:64].float() - ref).norm() / ref.norm())
            if a.ablate:
                out = torch.empty(T, H, naive.D_NOPE, device=dev, dtype=torch.bfloat16)
                for m in fm.REFILL_ROWS_MODES:
                    fm.set_refill_rows(m)
                    row[f"refill{m}_alone_us"] = 1e3 * bk._median_ms(
                        lambda: fm.ablate_launch(q, cache, idx, bk.SM_SCALE, fm.REFILL_ABLATION, out=out))
                fm.set_refill_rows(shipped)
                for part in fm.ABLATIONS:
                    row[f"{part}_alone_us"] = 1e3 * bk._median_ms(
                        lambda: fm.ablate_launch(q, cache, idx, bk.SM_SCALE, part, out=out))
            base_o, base_lse = outs[fm.REFILL_ROWS_MODES[0]]
            row["bit_equal"] = all(torch.equal(outs[m][0], base_o) and torch.equal(outs[m][1], base_lse)
                                   for m in fm.REFILL_ROWS_MODES)
            for m in fm.REFILL_ROWS_MODES[1:]:
                row[f"speedup_{m}_vs_0"] = row["rows0_us_median"] / row[f"rows{m}_us_median"]
            if qp is not None:
                row["flashmla_us_after"] = 1e3 * bk._median_ms(flash)
                fl = (row["flashmla_us_before"] + row["flashmla_us_after"]) / 2
                for m in fm.REFILL_ROWS_MODES:
                    row[f"flashmla_over_rows{m}"] = fl / row[f"rows{m}_us_median"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            del q, idx, qp
            torch.cuda.empty_cache()
    finally:
        fm.set_refill_rows(shipped)
    meta = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("GLM5LIB_COMMIT"), "heads": H,
            "s_kv": S_KV, "reps": a.reps, "flashmla": "skipped" if a.no_flashmla else fm_err or "loaded",
            "shipped_refill_rows": shipped, "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    json.dump({"meta": meta, "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
