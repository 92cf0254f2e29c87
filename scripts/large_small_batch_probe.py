"""The 17-128-head decode at B1-B128: the Gluon kernel (`mla_gluon_large`, mode "pingpong" for bf16 rows, "dq" for
fp8_ds_mla, each with its own split plan) beside the Triton kernel (`mla.sparse_mla_launch`), between which
`mla.gluon_large_shape` chooses there, and FlashMLA (fp8_ds_mla, padded to 64 / 128 heads), at decode batches of
one 32K-row request a token, top-k 2048. Each launch is checked against the fp32 reference
(`naive.sparse_mla_ref_chunked`) before it is timed, and again after (the pre-bound launchers' output). Two times a
row: CUDA-graph replay over rotated index sets (what a captured decode step pays) and eager (calls back to back,
host and GPU, what an uncaptured step pays at least). Needs an sm_90 GPU.

`PYTHONPATH=src python scripts/large_small_batch_probe.py OUT.json [--vendor .vendor] [--batches 1,4,16,64]
[--heads 32,64,128] [--formats bf16,fp8_ds_mla]`
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import mla, mla_gluon_large as gl_large, naive

EAGER_CALLS = 50


def case_inputs(fmt: str, H: int, T: int, decode: bool, prefill_sets: int = 1):
    """(q, cache, index sets) of a probe case: decode, one 32K-row request a token and as many rotated index sets as
    keep the rows out of L2 (`bench.kernels._rotations`); prefill, T tokens over one 32K-row sequence."""
    if decode:
        q, cache, base = bk._make_decode(T, H, 32768, bk.TOPK, fmt)
        R = bk._rotations(bk.sparse_mla_kv_bytes(T, bk.TOPK, fmt))
        return q, cache, [bk._rand_indices(T, 32768, bk.TOPK, base) for _ in range(R)]
    _, cache, _ = bk._make_decode(1, H, 32768, bk.TOPK, fmt)
    q = torch.randn(T, H, naive.D_QK, device="cuda", dtype=torch.bfloat16)
    return q, cache, [bk._rand_indices(T, 32768, bk.TOPK) for _ in range(prefill_sets)]


def as_replayed(call, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`call()`'s (out, lse) as a captured decode step gives them: called once (compiled and planned outside the
    capture), captured in a CUDA graph and replayed into `out` filled with NaN first, so a launch that writes nothing
    shows. The dispatcher routes captured calls as vLLM's graphs run them (eagerly, fewer than
    `mla.FP8MMA_MIN_T` tokens go to the Triton kernel)."""
    call()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, lse = call()
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return o, lse


def eager_us(fn, calls: int = EAGER_CALLS) -> float:
    """Wall time a call of `calls` back-to-back eager calls (host and GPU; the queue never drains between them)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def flashmla_padded(q, cache, H: int):
    """FlashMLA's sparse fp8 decode for q `[B, H, 576]` over an fp8_ds_mla cache, q padded to the 64 / 128 heads it
    takes: a call of an index set -> (out `[B, H, 512]`, None), its scheduler metadata kept per index set."""
    h_pad = 64 if H <= 64 else 128
    q4 = torch.zeros(q.shape[0], 1, h_pad, naive.D_QK, device="cuda", dtype=torch.bfloat16)
    q4[:, 0, :H] = q
    kv4 = cache.view(torch.float8_e4m3fn).unsqueeze(2)
    fms = {}

    def flashmla(i):
        f = fms.setdefault(i.data_ptr(), bk.FlashMLADecode())
        o4, _ = f(q4, kv4, i.unsqueeze(1))
        return o4[:, 0, :H], None

    return flashmla


def write_rows(out_path: str, meta: dict, rows: list, bad: int) -> int:
    """The run's JSON (written whole, then renamed into place), a one-line summary; the exit status."""
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    os.replace(tmp, out_path)
    print(f"{len(rows) - bad}/{len(rows)} launches match the reference")
    return 1 if bad else 0


def _ints(argv, flag, default):
    if flag not in argv:
        return default
    values = [int(v) for v in argv[argv.index(flag) + 1].split(",")]
    if any(v < 1 for v in values):
        sys.exit(f"large_small_batch_probe: {flag} takes positive integers, got {values}")
    return values


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("--"):
        sys.exit("usage: large_small_batch_probe.py OUT.json [--batches ...] [--heads ...] [--formats ...]")
    out_path = argv[0]
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit("large_small_batch_probe: needs an sm_90 GPU (wgmma)")
    batches = _ints(argv, "--batches", [1, 2, 4, 8, 16, 32, 64, 96, 128])
    heads = _ints(argv, "--heads", [32, 64, 128])
    if any(not 16 < h <= 128 for h in heads):
        sys.exit(f"large_small_batch_probe: --heads must lie in 17-128 (the Gluon kernel's range), got {heads}")
    formats = argv[argv.index("--formats") + 1].split(",") if "--formats" in argv else ["bf16", "fp8_ds_mla"]
    if any(f not in mla.GLUON_LARGE_MODES for f in formats):
        sys.exit(f"large_small_batch_probe: --formats must name {sorted(mla.GLUON_LARGE_MODES)}, got {formats}")
    fm_err = bk.load_flashmla(vendor)
    rows, bad = [], 0
    for fmt in formats:
        mode = mla.GLUON_LARGE_MODES[fmt]
        for H in heads:
            for B in batches:
                q, cache, base = bk._make_decode(B, H, 32768, bk.TOPK, fmt)
                flat = cache.view(-1, cache.shape[-1])
                R = bk._rotations(bk.sparse_mla_kv_bytes(B, bk.TOPK, fmt))
                idx_sets = [bk._rand_indices(B, 32768, bk.TOPK, base) for _ in range(R)]
                out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
                ro, _ = naive.sparse_mla_ref_chunked(q, flat, idx_sets[0], bk.SM_SCALE, kv_format=fmt, chunk=16)
                splits = gl_large.plan_splits(B, H, bk.TOPK, 64, q.device, mode=mode)[0]
                tail = gl_large._tail_cut(B, H, bk.TOPK, "cuda", q.device.index, mode)  # None: one launch
                impls = {
                    "triton": lambda i: mla.sparse_mla_launch(q, flat, i, bk.SM_SCALE, kv_format=fmt, out=out),
                    "gluon": lambda i: gl_large.sparse_mla_gluon_large(q, flat, i, bk.SM_SCALE, kv_format=fmt,
                                                                       out=out, mode=mode),
                }
                if fmt == "fp8_ds_mla" and fm_err is None:
                    impls["flashmla"] = flashmla_padded(q, cache, H)
                for name, fn in impls.items():
                    out.fill_(float("nan"))
                    o = fn(idx_sets[0])[0]
                    rel = float((o.float() - ro).norm() / ro.norm())
                    ok = bool(rel < 1e-2 and not torch.isnan(o).any())
                    bad += not ok
                    for i in idx_sets[1:]:
                        fn(i)  # FlashMLA's scheduler metadata per index set, outside the capture
                    graph = bk._graph_ms([lambda i=i: fn(i) for i in idx_sets]) * 1e3
                    out.fill_(float("nan"))
                    eager = eager_us(lambda: fn(idx_sets[0]))
                    # the eager loop's launches go through the pre-bound launchers (the first call above did not)
                    o = fn(idx_sets[0])[0]
                    rel_again = float((o.float() - ro).norm() / ro.norm())
                    ok_again = bool(rel_again < 1e-2 and not torch.isnan(o).any())
                    bad += not ok_again
                    r = {"format": fmt, "H": H, "B": B, "impl": name, "graph_us": graph, "eager_us": eager,
                         "rel_err": rel, "ok": ok and ok_again, "rel_err_again": rel_again,
                         "splits": splits if name == "gluon" else None,
                         "tail": list(tail) if tail and name == "gluon" else None}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                del q, cache, idx_sets, out, ro, impls
                torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "flashmla": fm_err or "loaded", "eager_calls": EAGER_CALLS, "gluon_large_min_ht": mla.GLUON_LARGE_MIN_HT}
    return write_rows(out_path, meta, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
