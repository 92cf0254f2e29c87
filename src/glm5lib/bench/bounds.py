"""What bounds small-head decode: the sparse-MLA kernel taken apart stage by stage, timed side by side (GPU).

The decode kernel at 8-16 heads per GPU does three things per gathered tile: gather the rows (index load, then
row loads), turn them into dot operands (fp8_ds_mla: e4m3 -> fp16 plus the rope half-words), and the attention
itself (two dots, the online softmax). The probes below run on the kernel's own launch plan (grid, split sizes,
tile, load path) with only the first stage, then the first two, each with an elementwise sink (an XOR or an add
per loaded word or value, reduced once after the loop), so that differences of times place the cost (`H200.md`'s
"time variants that leave one stage out"):

- `gather`: `_tile_rows` + `_tile_load`, the words XOR-ed (fp8) or the values added (bf16) into registers;
- `gather+convert`: the same plus `_tile_prep` (the operands the dots would take), summed elementwise;
- `kernel`: `sparse_mla_launch` with the shipped config.

The probes' loop is the fp8 kernel's (register prefetch of the next tile, index tile read one step earlier); the
bf16 kernel stages its tiles in shared memory instead (`num_stages=3`), so for bf16 the probe is the same loads of
the same rows in another pipeline, an estimate of the gather rather than the kernel's exact loop. A probe's time
includes its sink, so it bounds its stage from above; the claim it supports is what a kernel built on this load
path can reach, not a hardware limit.
Each is reported in us, GB/s of gathered row bytes, % of the measured copy bandwidth, and as a share of the
kernel's time. `python -m glm5lib.bench.bounds --json OUT.json` (B 32/128, H 8, both cache formats).
On CPU (Triton's interpreter) `probe_checksums` checks on tiny inputs that the probes read exactly the bytes the
kernel reads (their sums against torch's); nothing is timed there.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from glm5lib.kernels import common, mla, naive
from glm5lib.kernels.common import num_sms
import triton  # noqa: E402  (after kernels.common: the interpreter switch)
import triton.language as tl  # noqa: E402

from glm5lib.kernels.mla import _tile_load, _tile_prep, _tile_rows  # noqa: E402


@triton.jit
def _probe_kernel(KV, IDX, OUT, stride_kv, stride_it, TOPK, N_ROWS, KEYS_PER_SPLIT,
                  KV_FP8: tl.constexpr, FP8_HW: tl.constexpr, CONVERT: tl.constexpr, BLOCK_N: tl.constexpr,
                  D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, ALIGNED: tl.constexpr, WORDS: tl.constexpr,
                  NOPE_F16: tl.constexpr):
    """One program per (token, split), as the kernel's grid with one head block; writes one fp32 per program."""
    t = tl.program_id(0)
    sp = tl.program_id(2)
    KVF = KV.to(tl.pointer_type(tl.float32), bitcast=True)
    KVH = KV.to(tl.pointer_type(tl.bfloat16), bitcast=True)
    k_start = sp * KEYS_PER_SPLIT
    k_end = tl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
    idx_row = IDX + t.to(tl.int64) * stride_it
    acc = tl.zeros([BLOCK_N, 128], tl.float32)  # elementwise sinks: one add / XOR per loaded value or word,
    racc = tl.zeros([BLOCK_N], tl.float32)  # reduced once after the loop
    bits = tl.zeros([BLOCK_N, 32], tl.int32)
    # as the kernel's PREFETCH + IDX_AHEAD loop: tile i is consumed while tile i + 1 is gathered and index tile
    # i + 2 is read, so the probes keep as many loads in flight as the kernel does
    a_valid, a_row_b = _tile_rows(idx_row, k_start + BLOCK_N, k_end, N_ROWS, stride_kv, BLOCK_N)
    valid, row_b = _tile_rows(idx_row, k_start, k_end, N_ROWS, stride_kv, BLOCK_N)
    x0, x1, x2, x3, kr, sc = _tile_load(KV, KVF, KVH, row_b, valid, BLOCK_N, D_NOPE, D_ROPE, KV_FP8, ALIGNED, WORDS)
    for start in range(k_start, k_end, BLOCK_N):
        valid, row_b = a_valid, a_row_b
        a_valid, a_row_b = _tile_rows(idx_row, start + 2 * BLOCK_N, k_end, N_ROWS, stride_kv, BLOCK_N)
        y0, y1, y2, y3, yr, ysc = _tile_load(KV, KVF, KVH, row_b, valid, BLOCK_N, D_NOPE, D_ROPE, KV_FP8, ALIGNED,
                                             WORDS)
        if KV_FP8:
            racc += tl.sum(sc, 1)
        if CONVERT:
            k0, k1, k2, k3, kr2, s0, s1, s2, s3 = _tile_prep(x0, x1, x2, x3, kr, sc, KV_FP8, FP8_HW, tl.bfloat16,
                                                              NOPE_F16, False, WORDS)
            acc += k0.to(tl.float32) + k1.to(tl.float32) + k2.to(tl.float32) + k3.to(tl.float32)
            racc += tl.sum(kr2.to(tl.float32), 1)
        elif KV_FP8 and WORDS:  # [BLOCK_N, 32] words each: XOR-ed into one word tile, no reduction in the loop
            bits ^= x0 ^ x1 ^ x2 ^ x3 ^ kr
        else:
            acc += x0.to(tl.float32) + x1.to(tl.float32) + x2.to(tl.float32) + x3.to(tl.float32)
            racc += tl.sum(kr.to(tl.float32), 1)
        x0, x1, x2, x3, kr, sc = y0, y1, y2, y3, yr, ysc
    total = tl.sum(tl.sum(acc, 1) + racc, 0) + tl.sum(tl.sum(bits & 1, 1), 0).to(tl.float32)
    tl.store(OUT + t * tl.num_programs(2) + sp, total)


def run_probe(kind: str, q, cache, idx, kv_format: str, out=None):
    """One probe launch (`kind` in "gather", "gather+convert") on the kernel's grid for these inputs."""
    T, H, _ = q.shape
    topk = idx.shape[1]
    stride_kv, n_rows = naive.kv_row_geometry(cache)
    aligned = stride_kv % 16 == 0 and cache.data_ptr() % 16 == 0
    # the kernel's own launch plan: its grid, split sizes, tile and load switches
    plan = mla._launch_plan(T, H, topk, kv_format, q.device.type, q.device.index, None, None, aligned,
                            q.dtype == torch.float32, common.FP8_SOFTWARE)
    kw = plan.kw
    splits = plan.grid[2]
    out = torch.empty(T * splits, dtype=torch.float32, device=q.device) if out is None else out
    _probe_kernel[(T, 1, splits)](
        cache, idx, out, stride_kv, idx.stride(0), topk, n_rows, plan.keys_per_split,
        KV_FP8=kw["KV_FP8"], FP8_HW=kw["FP8_HW"], CONVERT=kind == "gather+convert", BLOCK_N=kw["BLOCK_N"],
        D_NOPE=naive.D_NOPE, D_ROPE=naive.D_ROPE, ALIGNED=kw["ALIGNED"], WORDS=kw["KV_FP8"] and kw["PREFETCH"] == 2,
        NOPE_F16=kw["NOPE_F16"], num_warps=kw["num_warps"], num_stages=kw["num_stages"])
    return out


def probe_checksums(q, cache, idx, kv_format: str) -> dict:
    """{probe: (probe's total, torch's total)} over the rows the kernel gathers (tests: the probes read the right
    bytes). "gather" of fp8 words is an XOR and is not summed; its scale sum is checked through "gather+convert"."""
    stride_kv, n_rows = naive.kv_row_geometry(cache)
    flat = naive.kv_row_view(cache)[0]
    valid = (idx >= 0) & (idx < n_rows)
    rows = flat[idx.clamp(0, max(n_rows - 1, 0)).long()][valid]  # [n_valid, row]
    res = {}
    if kv_format == "fp8_ds_mla":  # e4m3 latent values (unscaled), the bf16 rope, the 4 fp32 scales
        lat = rows[:, : naive.D_NOPE].contiguous().view(torch.float8_e4m3fn).float()
        scales = rows[:, naive.D_NOPE: naive.D_NOPE + 16].contiguous().view(torch.float32)
        rope = rows[:, naive.D_NOPE + 16:].contiguous().view(torch.bfloat16).float()
        want = float(lat.sum() + rope.sum() + scales.sum())
    else:
        want = float(rows.float().sum())
    res["gather+convert"] = (float(run_probe("gather+convert", q, cache, idx, kv_format).sum()), want)
    if kv_format != "fp8_ds_mla":
        res["gather"] = (float(run_probe("gather", q, cache, idx, kv_format).sum()), want)
    return res


def measure(B: int, H: int, kv_format: str, ceil: dict, ctx: int = 32768, topk: int = 2048) -> dict:
    from glm5lib.bench import kernels as bench

    q, cache, base = bench._make_decode(B, H, ctx, topk, kv_format)
    row = naive.FP8_DS_MLA_ROW_BYTES if kv_format == "fp8_ds_mla" else 2 * naive.D_QK
    reps = bench._rotations(B * topk * row)
    idx_sets = [bench._rand_indices(B, ctx, topk, base) for _ in range(reps)]
    cfg, splits, _ = mla._plan(B, H, topk, kv_format, "cuda", q.device.index, None, None)
    out = torch.empty(B, H, naive.D_NOPE, dtype=q.dtype, device="cuda")
    sink = torch.empty(B * splits, dtype=torch.float32, device="cuda")
    times = {
        "gather": bench._graph_ms([lambda i=i: run_probe("gather", q, cache, i, kv_format, sink) for i in idx_sets]),
        "gather+convert": bench._graph_ms([lambda i=i: run_probe("gather+convert", q, cache, i, kv_format, sink)
                                           for i in idx_sets]),
        "kernel": bench._graph_ms([lambda i=i: mla.sparse_mla_launch(q, cache, i, bench.SM_SCALE, kv_format=kv_format,
                                                                     out=out) for i in idx_sets]),
    }
    gathered = B * topk * row
    res = {"B": B, "H": H, "kv_format": kv_format, "config": cfg.name, "splits": splits, "gathered_bytes": gathered,
           "copy_GBps": ceil["copy_GBps"], "floor_us": gathered / ceil["copy_GBps"] / 1e3}
    for k, ms in times.items():
        res[k] = {"us": ms * 1e3, "GBps": gathered / ms / 1e6, "pct_copy": 100 * gathered / ms / 1e6 / ceil["copy_GBps"],
                  "share_of_kernel": ms / times["kernel"]}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the bounds probes time kernels on a CUDA GPU", file=sys.stderr)
        return 2
    from glm5lib.bench import kernels as bench

    ceil = bench.measure_ceilings()
    rows = []
    for fmt in ("fp8_ds_mla", "bf16"):
        for B in (32, 128):
            try:
                r = measure(B, 8, fmt, ceil)
            except Exception as exc:  # noqa: BLE001  (one broken probe is a row, not a lost run)
                rows.append({"B": B, "H": 8, "kv_format": fmt, "error": f"{type(exc).__name__}: {exc}"[:400]})
                print(rows[-1], flush=True)
                continue
            rows.append(r)
            print(f"{fmt:10s} B{B:<4d} H8 {r['config']:34s} floor {r['floor_us']:6.1f} us | " + " | ".join(
                f"{k} {r[k]['us']:6.1f} us {r[k]['pct_copy']:4.0f}% copy" for k in ("gather", "gather+convert", "kernel")),
                flush=True)
    with open(args.json, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "sms": num_sms(torch.device("cuda")),
                   "commit": bench.source_commit(args.commit), "ceilings": ceil, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
