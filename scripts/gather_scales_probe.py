"""The whole-tile gathers' scale-copy modes side by side (`mla_gluon_fp8mma.GATHER_SCALES_MODES`; GPU, one process).

`PYTHONPATH=src python scripts/gather_scales_probe.py OUT.json [--cases dec8:32,dec8:128,...] [--reps 2]
[--no-flashmla] [--ablate]`

Every fp8-cache build whose ring is filled a whole tile at a time (the split decode at 1-16 heads, the 9-16-head
prefill) copies each gathered row's four fp32 scales. Mode 0 copies them one 4-byte copy each into [chunk, key], with
the row ids carried from the latent copies' layout through shared memory; mode 1 copies a row's 16 bytes at once
(one to four copies) into [key, chunk], the row ids read ahead in that layout. The shipped route (`mla.sparse_mla`,
as vLLM calls it: decode steps captured in a CUDA graph and replayed over rotated index sets, as `glm5lib bench` times
them; the prefill eagerly) is timed under each mode in turn, `--reps` rounds of (0, 1, 1, 0), so that drift falls
on both. The modes copy the same bytes, so their outputs must be bit-equal; each mode's output is checked against the
fp32 reference (`naive.sparse_mla_ref_chunked`, the prefill's first 64 tokens). FlashMLA's sparse fp8 decode
(padded to 64 heads, when `.vendor` holds its library) is timed beside the decode cases. `--ablate` adds each mode's
gathers alone (`ablate_launch(part="gathers")`: the same rows into the same ring on the same schedule, nothing
computed) and compute alone (rows gathered once before the loop; the modes read the scales differently), eagerly on
the first index set only (at B32 its 43 MB of rows stay in L2, unlike the rotated sets the whole kernel is timed
over). A case the dispatcher does not send to the fp8-cache kernel (`mla.dispatched`) is refused: there the modes
would time the same code.

Cases: `decH:B` (H heads, B requests of 32K rows, top-k 2048) and `preH:T` (T tokens over one 32K-row sequence).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from large_small_batch_probe import as_replayed, case_inputs, flashmla_padded, write_rows  # noqa: E402

CASES = "dec8:32,dec8:128,dec16:32,dec16:128,pre16:4096"
ORDER = (0, 1, 1, 0)


def parse_cases(text: str) -> list[tuple[bool, int, int]]:
    """`decH:B` / `preH:T` items -> (decode, heads, tokens); a one-line error for anything else."""
    out = []
    for item in text.split(","):
        kind, _, n = item.partition(":")
        if kind[:3] not in ("dec", "pre") or not kind[3:].isdigit() or not n.isdigit():
            sys.exit(f"gather_scales_probe: a case is decH:B or preH:T, got {item!r}")
        H, T = int(kind[3:]), int(n)
        if not 1 <= H <= 16 or T < 1:
            sys.exit(f"gather_scales_probe: {item!r}: the fp8-cache kernel takes 1-16 heads and at least 1 token")
        out.append((kind[:3] == "dec", H, T))
    return out


def run_case(decode: bool, H: int, T: int, reps: int, flash: bool, ablate: bool) -> tuple[dict, bool]:
    fmt = "fp8_ds_mla"
    q, cache, idx_sets = case_inputs(fmt, H, T, decode)
    flat = cache.view(-1, cache.shape[-1])
    nref = T if decode else 64
    ro, rlse = naive.sparse_mla_ref_chunked(q[:nref], flat, idx_sets[0][:nref], bk.SM_SCALE, kv_format=fmt,
                                            chunk=16)
    out = torch.empty(T, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
    key, cfg = mla.dispatched(T, H, fmt, q.device, graph=decode)
    if key[0] != "small-fp8mma":
        sys.exit(f"gather_scales_probe: {'dec' if decode else 'pre'}{H}:{T} runs {'/'.join(key)}, not the fp8-cache "
                 f"kernel; the scale-copy modes would time the same code")
    row = {"decode": decode, "H": H, "T": T, "route": "/".join(key), "config": cfg}

    def call(i):
        return mla.sparse_mla(q, flat, i, bk.SM_SCALE, kv_format=fmt, out=out, decode=decode)

    def checked() -> tuple[torch.Tensor, torch.Tensor]:
        out.fill_(float("nan"))
        if decode:  # as replayed: captured (eagerly, few tokens go to another kernel: `mla.FP8MMA_MIN_T`)
            o, lse = as_replayed(lambda: call(idx_sets[0]), out)
        else:
            o, lse = call(idx_sets[0])
        return o.clone(), lse.clone()

    times = {m: [] for m in fm.GATHER_SCALES_MODES}
    outs = {}
    for _ in range(reps):
        for m in ORDER:
            fm.set_gather_scales(m)
            kw = fm.config_plan(fm.DEFAULT, T, H, bk.TOPK, "cuda", q.device.index, idx_sets[0].stride(0), decode)[3]
            whole = kw["REFILL"] != 1  # the build fills its ring a whole tile at a time: the mode applies
            row.setdefault("whole_tile_build", whole)
            row.setdefault("plan_gscales", []).append(kw["GSCALES"])
            o, lse = checked()
            outs.setdefault(m, (o, lse))
            if decode:
                for i in idx_sets[1:]:
                    call(i)
                times[m].append(1e3 * bk._graph_ms([lambda i=i: call(i) for i in idx_sets]))
            else:
                times[m].append(1e3 * bk._median_ms(lambda: call(idx_sets[0])))
    ok = True
    for m in fm.GATHER_SCALES_MODES:
        o, lse = outs[m]
        rel = float((o[:nref].float() - ro).norm() / ro.norm())
        lse_ok = torch.allclose(lse[:nref].float(), rlse, rtol=1e-3, atol=1e-3)
        row[f"mode{m}_us"] = times[m]
        row[f"mode{m}_us_median"] = statistics.median(times[m])
        row[f"mode{m}_rel"] = rel
        ok &= rel < 1e-2 and bool(lse_ok) and not torch.isnan(o).any()
    base = outs[fm.GATHER_SCALES_MODES[0]]
    row["bit_equal"] = all(torch.equal(outs[m][0], base[0]) and torch.equal(outs[m][1], base[1])
                           for m in fm.GATHER_SCALES_MODES)
    row["speedup_1_vs_0"] = row["mode0_us_median"] / row["mode1_us_median"]
    if ablate:
        for m in fm.GATHER_SCALES_MODES:
            fm.set_gather_scales(m)
            for part in fm.ABLATIONS:
                if part == "whole":
                    continue  # timed above, as vLLM calls it
                row[f"{part}{m}_alone_us"] = 1e3 * bk._median_ms(
                    lambda: fm.ablate_launch(q, flat, idx_sets[0], bk.SM_SCALE, part, out=out))
    if flash and decode:
        f = flashmla_padded(q, cache, H)
        for i in idx_sets:
            f(i)  # scheduler metadata per index set, outside the capture
        row["flashmla_us"] = 1e3 * bk._graph_ms([lambda i=i: f(i) for i in idx_sets])
        for m in fm.GATHER_SCALES_MODES:
            row[f"flashmla_over_mode{m}"] = row["flashmla_us"] / row[f"mode{m}_us_median"]
    row["ok"] = bool(ok and row["bit_equal"] and row["plan_gscales"] == list(ORDER) * reps)
    return row, row["ok"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--ablate", action="store_true", help="also each mode's gathers alone and the compute alone")
    a = ap.parse_args()
    cases = parse_cases(a.cases)
    if a.reps < 1:
        sys.exit(f"gather_scales_probe: --reps takes a positive count, got {a.reps}")
    if not torch.cuda.is_available():
        sys.exit("gather_scales_probe: needs a CUDA GPU")
    fm_err = None if a.no_flashmla else bk.load_flashmla()
    shipped = fm.GATHER_SCALES
    rows, bad = [], 0
    try:
        for decode, H, T in cases:
            row, ok = run_case(decode, H, T, a.reps, fm_err is None and not a.no_flashmla, a.ablate)
            bad += not ok
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    finally:
        fm.set_gather_scales(shipped)
    meta = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("GLM5LIB_COMMIT"), "reps": a.reps,
            "order": ORDER, "flashmla": "skipped" if a.no_flashmla else fm_err or "loaded",
            "shipped_gather_scales": shipped, "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return write_rows(a.out, meta, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
