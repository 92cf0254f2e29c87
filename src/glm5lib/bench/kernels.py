"""Benchmarks for the sparse-MLA and indexer kernels (run on a CUDA GPU; results as JSON + PNG).

In one run, side by side: our Triton kernels, FlashMLA's sparse kernels as shipped in the vllm 0.33.0 wheel
(`_flashmla_C`, loaded from `.vendor/` when present), a naive torch gather + einsum, and the machine's measured
ceilings (1 GiB device copy, 8192^3 bf16 matmul). GLM-5 shapes: d_qk 576, d_v 512, top-k 2048, scale 1/16.

Timing: `triton.testing.do_bench` medians (it flushes L2 before every timed call); small decode
launches are timed as a CUDA graph of R calls over R different index sets (so each call gathers rows that are
not in L2, and launch gaps do not count), divided by R. Inputs are fresh random data, outputs poisoned.

Every Triton sparse-MLA row also records what its forward kernel compiled to on this GPU (`shared_bytes`:
the compiled kernel's `metadata.shared`; `n_regs`, `n_spills`), and every case is re-timed with the config
the "small" shared-memory class (sm_89 / sm_120, 99 KB per block) would run for that shape (`smem-small` rows),
beside the shipped "big" config. The targets of issue #13 are `evaluate_targets`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from glm5lib.kernels import naive
from glm5lib.kernels.indexer import indexer_flops, indexer_logits
from glm5lib.kernels.mla import (CONFIGS, MLAConfig, config_key, config_num_splits, sparse_mla, sparse_mla_flops,
                                        sparse_mla_kv_bytes, sparse_mla_launch)
from glm5lib.kernels.topk import topk_indices, topk_overlap, topk_select
from glm5lib.model.spec import GLM5Config

GLM5 = GLM5Config.glm5()
SM_SCALE = GLM5.softmax_scale  # 1/16
TOPK = GLM5.index_topk  # 2048
D_V = GLM5.kv_lora_rank  # 512: the value is the latent part of the cached row
L2_BYTES = 60 * 2**20
# A target is "below goal" on its gathers alone only when the ceiling is more than 3 % under the goal: the best
# gather route's rate moved by 1-1.5 points between H200 runs of the same code (bf16 rows at B128: 83.3-84.7 % of
# copy, fp8 rows 74.3-75.4 %), and bf16 rows in sorted order reached 85.05 % once (outputs/bench/gather_h200.json).
CEILING_MARGIN = 0.97
SMEM_SMALL_LIMIT = 99 * 1024  # opt-in shared memory per block on sm_89 / sm_120 (the "small" config class)


def _median_ms(fn, warmup=25, rep=100) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _graph_ms(fns, reps: int = 20) -> float:
    """Median time of one call, from a CUDA graph that runs every fn in `fns` once (falls back to do_bench)."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in fns[:2]:
                f()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        torch.cuda.synchronize()
        return _median_ms(g.replay, warmup=10, rep=max(50, reps)) / len(fns)
    except Exception as exc:  # capture can fail for ops that sync; time them plainly
        print(f"  graph capture failed ({type(exc).__name__}: {str(exc)[:80]}); timing with do_bench", flush=True)
        i = [0]

        def one():
            fns[i[0] % len(fns)]()
            i[0] += 1

        return _median_ms(one)


# ----------------------------------------------------------------------------------------------------------
# Ceilings and FlashMLA
# ----------------------------------------------------------------------------------------------------------


def measure_ceilings() -> dict:
    n = 2**30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src))
    copy_gbs = 2 * n / ms / 1e6  # bytes read + written
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms_mm = _median_ms(lambda: a @ b)
    tflops = 2 * 8192**3 / ms_mm / 1e9
    return {"copy_GBps": copy_gbs, "copy_ms_1GiB": ms, "matmul_bf16_TFLOPs": tflops, "matmul_ms": ms_mm}


def load_flashmla(vendor: str = ".vendor") -> str | None:
    """Load FlashMLA's ops from the vllm wheel's `_flashmla_C.abi3.so` in `vendor` (the extension registers
    `torch.ops._flashmla_C.*` when loaded); returns None, or why it failed. Loaded by file path, so nothing is
    added to sys.path."""
    import importlib.machinery
    import importlib.util

    if hasattr(torch.ops._flashmla_C, "sparse_decode_fwd"):
        return None
    path = Path(vendor).resolve() / "_flashmla_C.abi3.so"
    try:
        loader = importlib.machinery.ExtensionFileLoader("_flashmla_C", str(path))
        spec = importlib.util.spec_from_file_location("_flashmla_C", path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules["_flashmla_C"] = module
        torch.ops._flashmla_C.sparse_decode_fwd  # noqa: B018
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


class FlashMLADecode:
    """`sparse_decode_fwd` with its scheduler metadata kept across calls (as flash_mla_with_kvcache does)."""

    def __init__(self):
        self.meta = None
        self.splits = None

    def __call__(self, q4, kv4, idx3):
        out, lse, md, ns = torch.ops._flashmla_C.sparse_decode_fwd(
            q4, kv4, idx3, None, None, self.meta, self.splits, None, None, None, D_V, SM_SCALE, None, False)
        self.meta, self.splits = md, ns
        return out, lse


def flashmla_prefill(q, kv3, idx3):
    return torch.ops._flashmla_C.sparse_prefill_fwd(q, kv3, idx3, SM_SCALE, D_V, None, None, None)


# ----------------------------------------------------------------------------------------------------------
# Sparse MLA
# ----------------------------------------------------------------------------------------------------------


def fp8_ds_mla_rows(s_kv: int, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8_ds_mla cache of s_kv random rows, the same values in bf16): our kernels read the cache, FlashMLA's sparse
    prefill (bf16 rows only) the bf16 rows, which hold the dequantized values exactly."""
    cache = naive.quantize_fp8_ds_mla(torch.randn(s_kv, naive.D_QK, device=device, dtype=torch.bfloat16))
    return cache, naive.dequantize_fp8_ds_mla(cache).to(torch.bfloat16)


def pad_heads(q: torch.Tensor, h_pad: int) -> torch.Tensor:
    """q [T, H, D] with zero heads appended up to h_pad (FlashMLA's head counts: 64 or 128); q itself if H = h_pad."""
    T, H, D = q.shape
    return q if H == h_pad else torch.cat([q, q.new_zeros(T, h_pad - H, D)], 1)


def _rand_indices(T: int, ctx: int, topk: int, row_base: torch.Tensor | None = None) -> torch.Tensor:
    """Distinct uniform random positions in [0, ctx) per token (+ row_base[t]), int32 [T, topk]."""
    idx = torch.rand(T, ctx, device="cuda").argsort(dim=1)[:, :topk].to(torch.int32)
    if row_base is not None:
        idx = idx + row_base[:, None]
    return idx


# rows quantized at a time into an fp8_ds_mla decode cache: quantizing B = 512 requests of 32K rows at once would
# take about 99 GB of fp32 temporaries (the rows are independent, so chunks give the same bytes)
QUANT_CHUNK_ROWS = 1 << 20


def _make_decode(B: int, H: int, ctx: int, topk: int, kv_format: str, block_size: int = 64, device: str = "cuda"):
    """One request per token; request b owns rows [b*ctx, (b+1)*ctx) of a paged cache of block_size rows (random
    bf16 rows, or their fp8_ds_mla quantization made `QUANT_CHUNK_ROWS` rows at a time)."""
    n_rows = B * ctx
    nb = math.ceil(n_rows / block_size)
    if kv_format == "fp8_ds_mla":
        cache = torch.empty(nb * block_size, naive.FP8_DS_MLA_ROW_BYTES, device=device, dtype=torch.uint8)
        for r0 in range(0, cache.shape[0], QUANT_CHUNK_ROWS):
            r1 = min(cache.shape[0], r0 + QUANT_CHUNK_ROWS)
            cache[r0:r1] = naive.quantize_fp8_ds_mla(torch.randn(r1 - r0, naive.D_QK, device=device,
                                                                  dtype=torch.bfloat16))
    else:
        cache = torch.randn(nb * block_size, naive.D_QK, device=device, dtype=torch.bfloat16)
    q = torch.randn(B, H, naive.D_QK, device=device, dtype=torch.bfloat16)
    base = (torch.arange(B, device=device, dtype=torch.int32) * ctx)
    return q, cache.view(nb, block_size, -1), base


def time_config(q, cache, idx_sets, kv_format, out, cfg: MLAConfig, num_splits: int,
                ref: torch.Tensor | None = None) -> tuple[float, float | None]:
    """(ms per call, rel err against `ref` on idx_sets[0] or None) of one fixed config and split count.

    The output is poisoned first, so an unwritten element shows as a NaN rel err. Used by the `--sweep` rows and
    by `tune_decode`.
    """
    out.fill_(float("nan"))
    o, _ = sparse_mla_launch(q, cache, idx_sets[0], SM_SCALE, kv_format=kv_format, out=out, config=cfg,
                             num_splits=num_splits)
    rel = None if ref is None else float((o.float() - ref).norm() / ref.norm())
    ms = _graph_ms([lambda i=i: sparse_mla_launch(q, cache, i, SM_SCALE, kv_format=kv_format, out=out, config=cfg,
                                                  num_splits=num_splits) for i in idx_sets])
    return ms, rel


@contextlib.contextmanager
def record_fwd_launches():
    """Collect what every sparse-MLA forward launch returns while the block runs (Triton: the CompiledKernel).

    `sparse_mla_launch` launches through the module global `mla._FWD`; it is wrapped for the block and put back.
    """
    from glm5lib.kernels import mla

    inner = mla._FWD
    seen: list = []

    class Recording:
        def launch(self, grid, args, kw, kw_key=None, device_index=None, spec=None):
            ck = inner.launch(grid, args, kw, kw_key, device_index, spec)
            seen.append(ck)
            return ck

    mla._FWD = Recording()
    try:
        yield seen
    finally:
        mla._FWD = inner


def kernel_facts(compiled) -> dict:
    """{"shared_bytes", "n_regs", "n_spills"} of a compiled Triton kernel (what is known; {} for None)."""
    out = {}
    meta = getattr(compiled, "metadata", None)
    if meta is not None and getattr(meta, "shared", None) is not None:
        out["shared_bytes"] = int(meta.shared)
    for k in ("n_regs", "n_spills"):
        v = getattr(compiled, k, None)
        if isinstance(v, int):
            out[k] = v
    return out


def _launch_facts(fn) -> dict:
    """Run fn (one sparse-MLA call) and return the forward kernel's facts."""
    with record_fwd_launches() as seen:
        fn()
    return kernel_facts(seen[0]) if seen else {}


def _shipped(T: int, H: int, kv_format: str, device) -> dict:
    """The config `sparse_mla` runs for this shape on this GPU (`mla.dispatched`: a Triton config or the Gluon
    kernel)."""
    from glm5lib.kernels.mla import dispatched

    key, name = dispatched(T, H, kv_format, device)
    return {"config_key": "/".join(key), "config": name}


def _dispatch_table(device) -> dict[str, str]:
    """{key: config name} `sparse_mla` can run on this GPU: every `CONFIGS` entry, and the Gluon kernels where the
    device takes them (`mla.gluon_large_ready`, `mla.fp8mma_route`)."""
    from glm5lib.kernels.mla import fp8mma_name, fp8mma_route, gluon_large_name, gluon_large_ready, smem_class

    out = {"/".join(k): v.name for k, v in CONFIGS.items()}
    if gluon_large_ready(device) and smem_class(device) == "big":
        for fmt in ("bf16", "fp8_ds_mla"):
            out[f"large-gluon/{fmt}/big"] = gluon_large_name(fmt)
    cfg8 = fp8mma_route(4096, 8, "fp8_ds_mla", device, torch.bfloat16)
    if cfg8:
        out[f"small-fp8mma/fp8_ds_mla/{smem_class(device)}"] = fp8mma_name(cfg8)
    return out


def _small_config(T: int, H: int, kv_format: str, device) -> tuple[str, MLAConfig]:
    """The sm_89 / sm_120 ("small" shared memory) config for this shape, with this GPU's SM count."""
    from glm5lib.kernels.common import num_sms

    key = config_key(T, H, kv_format, "small", num_sms(device))
    return "/".join(key), CONFIGS[key]


def _smem_error_row(case, key, cfg, T, H, kv_format, exc) -> dict:
    """The `smem-small` row of a small-memory config that failed to compile, launch or time."""
    return {"kind": "smem-small", "case": case, "impl": f"triton:{cfg.name}", "config_key": key, "T": T, "H": H,
            "kv_format": kv_format, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _smem_row(kind_of_case, key, cfg, ns, T, H, topk, kv_format, ms, flops, kv_bytes, ceil, facts, rel, big):
    fits = None if facts.get("shared_bytes") is None else bool(facts["shared_bytes"] <= SMEM_SMALL_LIMIT)
    return _row("smem-small", f"triton:{cfg.name}", T, H, topk, kv_format, ms, flops, kv_bytes, ceil,
                {"case": kind_of_case, "config_key": key, "splits": ns, **facts, "fits_99KB": fits, "rel_err": rel,
                 "ok": None if rel is None else bool(rel < 1e-2), "big_config": big.get("config"),
                 "big_us": big.get("us"), "big_shared_bytes": big.get("shared_bytes")})


def _rotations(bytes_per_call: float) -> int:
    return int(min(64, max(1, math.ceil(3 * L2_BYTES / max(bytes_per_call, 1)))))


def _row(kind, impl, B, H, topk, kv_format, ms, flops, kv_bytes, ceil, extra=None):
    r = {
        "kind": kind, "impl": impl, "T": B, "H": H, "topk": topk, "kv_format": kv_format, "ms": ms,
        "us": ms * 1e3, "TFLOPs": flops / ms / 1e9 if ms else None, "GBps": kv_bytes / ms / 1e6 if ms else None,
    }
    if ms and ceil:
        r["pct_bw"] = 100 * r["GBps"] / ceil["copy_GBps"]
        r["pct_mm"] = 100 * r["TFLOPs"] / ceil["matmul_bf16_TFLOPs"]
    if extra:
        r.update(extra)
    return r


def bench_decode_case(B, H, kv_format, ceil, ctx=32768, topk=TOPK, flashmla=True, naive_ref=False,
                      configs: list[MLAConfig] | None = None, check=True, small_smem=False):
    """Our kernel (default pick + optional config sweep), FlashMLA padded to 64/128 heads, naive torch.

    small_smem: also time the sm_89/sm_120 config of this shape (a `smem-small` row with its compiled shared memory).
    """
    rows = []
    q, cache, base = _make_decode(B, H, ctx, topk, kv_format)
    kv_bytes = sparse_mla_kv_bytes(B, topk, kv_format)
    flops = sparse_mla_flops(B, H, topk)
    R = _rotations(kv_bytes)
    idx_sets = [_rand_indices(B, ctx, topk, base) for _ in range(R)]
    out = torch.full((B, H, naive.D_NOPE), float("nan"), device="cuda", dtype=torch.bfloat16)
    facts = _launch_facts(lambda: sparse_mla(q, cache, idx_sets[0], SM_SCALE, kv_format=kv_format, out=out))
    ro = None
    if check:
        o, lse = sparse_mla(q, cache, idx_sets[0], SM_SCALE, kv_format=kv_format, out=out)
        ro, rl = naive.sparse_mla_ref_chunked(q, cache, idx_sets[0], SM_SCALE, kv_format=kv_format, chunk=16)
        rel = float((o.float() - ro).norm() / ro.norm())
        assert not torch.isnan(o).any() and rel < 1e-2, f"decode B{B} H{H} {kv_format}: rel err {rel}"
    else:
        rel = None
    ms = _graph_ms([lambda i=i: sparse_mla(q, cache, i, SM_SCALE, kv_format=kv_format, out=out) for i in idx_sets])
    mine = _row("decode", "triton", B, H, topk, kv_format, ms, flops, kv_bytes, ceil,
                {"rel_err": rel, "rotations": R, **_shipped(B, H, kv_format, q.device), **facts})
    rows.append(mine)
    if small_smem:
        key, cfg = _small_config(B, H, kv_format, q.device)
        ns = config_num_splits(B, H, topk, cfg, q.device)
        try:
            with record_fwd_launches() as seen:
                ms_c, rel_c = time_config(q, cache, idx_sets, kv_format, out, cfg, ns, ro)
            rows.append(_smem_row("decode", key, cfg, ns, B, H, topk, kv_format, ms_c, flops, kv_bytes, ceil,
                                  kernel_facts(seen[0]) if seen else {}, rel_c, mine))
        except Exception as exc:
            rows.append(_smem_error_row("decode", key, cfg, B, H, kv_format, exc))
    for cfg in configs or []:
        for ns_mult in (1, 2):
            # the split count sparse_mla would pick for this config on this GPU, and twice that
            ns = config_num_splits(B, H, topk, cfg, q.device) * ns_mult
            try:
                ms_c, rel_c = time_config(q, cache, idx_sets, kv_format, out, cfg, ns, ro if check else None)
                ok = None if rel_c is None else bool(rel_c < 1e-2)
                rows.append(_row("decode-sweep", f"triton:{cfg.name}:splits{ns}", B, H, topk, kv_format, ms_c, flops,
                                 kv_bytes, ceil, {"ok": ok, "sweep_rel": rel_c}))
            except Exception as exc:
                rows.append({"kind": "decode-sweep", "impl": f"triton:{cfg.name}:splits{ns}", "T": B, "H": H,
                             "kv_format": kv_format, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if flashmla and kv_format == "fp8_ds_mla":
        h_pad = 64 if H <= 64 else 128
        q4 = torch.zeros(B, 1, h_pad, naive.D_QK, device="cuda", dtype=torch.bfloat16)
        q4[:, 0, :H] = q
        kv4 = cache.view(torch.float8_e4m3fn).unsqueeze(2)
        try:
            fm = FlashMLADecode()
            o4, _ = fm(q4, kv4, idx_sets[0].unsqueeze(1))
            fm_rel = float((o4[:, 0, :H].float() - ro).norm() / ro.norm()) if ro is not None else None
            fms = [FlashMLADecode() for _ in idx_sets]
            for f, i in zip(fms, idx_sets):
                f(q4, kv4, i.unsqueeze(1))
            ms_f = _graph_ms([lambda f=f, i=i: f(q4, kv4, i.unsqueeze(1)) for f, i in zip(fms, idx_sets)])
            rows.append(_row("decode", f"flashmla(h_pad={h_pad})", B, H, topk, kv_format, ms_f, flops, kv_bytes, ceil,
                             {"rel_err": fm_rel, "padded_TFLOPs": sparse_mla_flops(B, h_pad, topk) / ms_f / 1e9}))
        except Exception as exc:
            rows.append({"kind": "decode", "impl": "flashmla", "T": B, "H": H, "kv_format": kv_format,
                         "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    if naive_ref:
        flat = naive.kv_row_view(cache)[0]

        def torch_naive(i=idx_sets[0]):
            k = (naive.dequantize_fp8_ds_mla(flat[i.long()]) if kv_format == "fp8_ds_mla" else flat[i.long()].float())
            s = torch.einsum("thd,tkd->thk", q.float(), k) * SM_SCALE
            return torch.einsum("thk,tkd->thd", torch.softmax(s, -1), k[..., :D_V])

        rows.append(_row("decode", "torch-naive", B, H, topk, kv_format, _median_ms(torch_naive), flops, kv_bytes, ceil))
    del q, cache, idx_sets
    torch.cuda.empty_cache()
    return rows


def bench_prefill_case(H, ceil, s_q=4096, s_kv=32768, topk=TOPK, flashmla=True, configs=None, check=True,
                       kv_format="bf16", small_smem=False):
    """One 32K-token sequence, s_q query tokens. kv_format "fp8_ds_mla": our kernel reads the fp8 cache and FlashMLA
    (whose sparse prefill takes bf16 rows only) reads the bf16 cache of the same values (the fp8 cache dequantized,
    exact in bf16), same indices; its row is marked `baseline_for: "fp8_ds_mla"`."""
    rows = []
    fp8 = kv_format == "fp8_ds_mla"
    if fp8:
        cache, kv = fp8_ds_mla_rows(s_kv)  # FlashMLA's input: the same values in bf16
    else:
        cache = kv = torch.randn(s_kv, naive.D_QK, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(s_q, H, naive.D_QK, device="cuda", dtype=torch.bfloat16)
    idx = _rand_indices(s_q, s_kv, topk)
    flops = sparse_mla_flops(s_q, H, topk)
    kv_bytes = sparse_mla_kv_bytes(s_q, topk, kv_format)
    out = torch.full((s_q, H, naive.D_NOPE), float("nan"), device="cuda", dtype=torch.bfloat16)
    rel = ro = None
    sl = slice(0, 256)
    facts = _launch_facts(lambda: sparse_mla(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out))
    if check:
        o, _ = sparse_mla(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out)
        ro, _ = naive.sparse_mla_ref_chunked(q[sl], cache, idx[sl], SM_SCALE, kv_format=kv_format, chunk=32)
        rel = float((o[sl].float() - ro).norm() / ro.norm())
        assert not torch.isnan(o).any() and rel < 1e-2, f"prefill H{H} {kv_format}: rel err {rel}"
    ms = _median_ms(lambda: sparse_mla(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out))
    mine = _row("prefill", "triton", s_q, H, topk, kv_format, ms, flops, kv_bytes, ceil,
                {"rel_err": rel, "s_kv": s_kv, **_shipped(s_q, H, kv_format, q.device), **facts})
    rows.append(mine)
    if small_smem:
        key, cfg = _small_config(s_q, H, kv_format, q.device)
        ns = config_num_splits(s_q, H, topk, cfg, q.device)
        try:
            out.fill_(float("nan"))
            with record_fwd_launches() as seen:
                o, _ = sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out, config=cfg,
                                         num_splits=ns)
            rel_c = None if ro is None else float((o[sl].float() - ro).norm() / ro.norm())
            if torch.isnan(o).any():
                rel_c = float("nan")
            ms_c = _median_ms(lambda: sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out,
                                                        config=cfg, num_splits=ns))
            rows.append(_smem_row("prefill", key, cfg, ns, s_q, H, topk, kv_format, ms_c, flops, kv_bytes, ceil,
                                  kernel_facts(seen[0]) if seen else {}, rel_c, mine))
        except Exception as exc:
            rows.append(_smem_error_row("prefill", key, cfg, s_q, H, kv_format, exc))
    for cfg in configs or []:
        try:
            out.fill_(float("nan"))
            o, _ = sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out, config=cfg, num_splits=1)
            unwritten = bool(torch.isnan(o).any())  # NaN is not JSON: an unwritten output is its own field
            rel_c = None if unwritten or ro is None else float((o[sl].float() - ro).norm() / ro.norm())
            ms_c = _median_ms(lambda: sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format=kv_format, out=out,
                                                        config=cfg, num_splits=1))
            rows.append(_row("prefill-sweep", f"triton:{cfg.name}", s_q, H, topk, kv_format, ms_c, flops,
                             kv_bytes, ceil, {"rel_err": rel_c, **({"error": "unwritten output (NaN)"}
                                                                    if unwritten else {})}))
        except Exception as exc:
            rows.append({"kind": "prefill-sweep", "impl": f"triton:{cfg.name}", "H": H, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if flashmla:
        h_pad = max(64, H)
        qp = pad_heads(q, h_pad)
        extra = {"baseline_for": kv_format} if fp8 else {}
        try:
            res = flashmla_prefill(qp, kv.unsqueeze(1), idx.unsqueeze(1))
            fm_rel = float((res[0][:256, :H].float() - ro).norm() / ro.norm()) if ro is not None else None
            ms_f = _median_ms(lambda: flashmla_prefill(qp, kv.unsqueeze(1), idx.unsqueeze(1)))
            rows.append(_row("prefill", f"flashmla(h_pad={h_pad})", s_q, H, topk, "bf16", ms_f, flops,
                             sparse_mla_kv_bytes(s_q, topk, "bf16"), ceil,
                             {"rel_err": fm_rel, "padded_TFLOPs": sparse_mla_flops(s_q, h_pad, topk) / ms_f / 1e9, **extra}))
        except Exception as exc:
            rows.append({"kind": "prefill", "impl": "flashmla", "T": s_q, "H": H, "kv_format": "bf16", **extra,
                         "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    del kv, cache, q, idx, out
    torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------------------------
# Indexer
# ----------------------------------------------------------------------------------------------------------


def _topk_select_row(kind, logits, topk, kw, T, HI, fmt, ceil, ctx):
    """glm5lib's Triton radix select beside torch.topk on the same scores: time, and the same picked sets
    (random scores have no ties, so the sets must match exactly)."""
    sel = topk_select(logits, topk, **kw)
    ref = topk_indices(logits, topk, ks=kw.get("ks"))
    same = bool(torch.equal(torch.sort(sel, 1).values, torch.sort(ref, 1).values))
    ms = _median_ms(lambda: topk_select(logits, topk, out=sel, **kw))
    return _row(kind, "triton-select", T, HI, topk, fmt, ms, 0.0, T * ctx * 4, ceil,
                {"ctx": ctx, "same_set_as_torch_topk": same})


def paged_indexer_case(B: int, ctx: int, fmt: str, HI: int, block_size: int = 64, width: int | None = None,
                       device: str = "cuda", generator: torch.Generator | None = None):
    """Decode inputs of the paged indexer: B requests of `ctx` keys each in a shuffled paged cache (fp8 in vLLM's
    block-split layout, or bf16), their block table (`width` positions wide, default ctx; columns past the context
    point at block 0), context lengths, bf16 q `[B, HI, 128]` and head weights. -> (cache, table, ctxs, q, w)."""
    per_req = math.ceil(ctx / block_size)
    nb = B * per_req
    keys = torch.randn(nb * block_size, naive.INDEXER_DIM, device=device, dtype=torch.bfloat16, generator=generator)
    cache = (naive.pack_indexer_cache_paged(naive.quantize_indexer_k(keys), block_size) if fmt == "fp8"
             else keys.view(nb, block_size, naive.INDEXER_DIM))
    table = torch.zeros(B, max(per_req, math.ceil((width or ctx) / block_size)), device=device, dtype=torch.int32)
    table[:, :per_req] = torch.randperm(nb, device=device, generator=generator).view(B, per_req).to(torch.int32)
    ctxs = torch.full((B,), ctx, device=device, dtype=torch.int32)
    q = torch.randn(B, HI, naive.INDEXER_DIM, device=device, dtype=torch.bfloat16, generator=generator)
    w = torch.rand(B, HI, device=device, generator=generator) * HI ** -0.5
    return cache, table, ctxs, q, w


@contextlib.contextmanager
def _indexer_knobs():
    """Restores the paged indexer's module knobs (tile, looping-grid programs, dot layout, q rewrite, register
    cap, tiles a program) however the code inside ends (the sweep; `scripts/indexer_*_case.py`)."""
    from glm5lib.kernels import indexer as ix

    names = ("PAGED_LOOP_PROGRAMS_PER_SM", "PAGED_KEYS_M", "PAGED_Q_REWRITE", "PAGED_Q_FORM", "PAGED_MAXNREG",
             "PAGED_TILES")
    kept = {n: getattr(ix, n) for n in names}
    tile = ix.INDEXER_CONFIGS["paged"]
    try:
        yield
    finally:
        ix.INDEXER_CONFIGS["paged"] = tile
        for n, v in kept.items():
            setattr(ix, n, v)


def _indexer_decode_sweep(fmt, q, w, r, fp8q, cache, o, kw, B, HI, ctx, flops, byts, ceil) -> list[dict]:
    """The paged indexer's decode alternatives, each checked against the reference and timed (`bench_indexer`):
    - tiles in both dot layouts (heads as M; "-keysM") and the looping grid (`row_bound_only`, what CUDA-graph
      decode launches) per SM count with the shipped tile, without register caps; bf16 q over fp8 keys rewritten
      into the rule's form ("e4m3x2:" on sm_90, `indexer.paged_q_form`) and, where that is not the exact one, into
      fp16 too ("f16:"), fp8 q ("q8:");
    - fp8 keys: bf16 q scored as it is ("q-bf16") and in each `indexer.Q_FORMS` rewrite, both layouts, no cap
      ("e4m3x2" only with hardware e4m3);
    - fp8 keys: register caps 80 and 96 on the keys-as-M forms and fp8 q (`indexer.PAGED_MAXNREG`);
    - tiles a program scores (`indexer.PAGED_TILES`, "-t<n>") per stage count, in the rule's layout, uncapped and
      (fp8 keys) under the caps; bf16 q over fp8 keys in each form.
    fp8q: (q8, w8, the shipped kernel's scores of the first two queries) or None. Call inside `_indexer_knobs`."""
    from glm5lib.kernels import indexer as ix
    from glm5lib.kernels.common import fp8_hw

    rows = []
    fp8 = fmt == "fp8"

    def time_row(name, qq, ww, ref, **over):
        try:
            got = indexer_logits(qq, cache, ww, **{**kw, **over})[:2]
            ok = bool(torch.allclose(got, ref, rtol=1e-3, atol=1e-3))
            k = min(TOPK, got.shape[-1])  # the top-k sets of the two checked rows, against the reference's
            agree = sum(topk_overlap(got.topk(k).indices, ref.topk(k).indices)) / (k * len(got))
            ms_c = _median_ms(lambda: indexer_logits(qq, cache, ww, out=o, **{**kw, **over}))
            rows.append(_row("indexer-decode-sweep", name, B, HI, ctx, fmt, ms_c, flops, byts, ceil,
                             {"ok": ok, "rel_err": float((got - ref).norm() / ref.norm()), "topk_agree": agree}))
        except Exception as exc:
            rows.append({"kind": "indexer-decode-sweep", "impl": name, "error": str(exc)[:200]})

    shipped, kept_form = ix.INDEXER_CONFIGS["paged"], ix.PAGED_Q_FORM
    rule_form = ix.paged_q_form(q.dtype, fmt, q.device) if fp8 else None
    qs = [(f"{rule_form}:" if fp8 else "", q, w, r, kept_form)]  # (tag, q, weights, reference, PAGED_Q_FORM)
    qs += [("f16:", q, w, r, "f16")] if rule_form not in (None, "f16") else []
    qs += [("q8:", fp8q[0], fp8q[1], fp8q[2], kept_form)] if fp8q else []
    runs = ([(c, None, km) for km in (False, True) for c in SWEEP_INDEXER_PAGED]
            + [(shipped, p, None) for p in (8, 32)])
    loop_programs = ix.PAGED_LOOP_PROGRAMS_PER_SM
    # one tile a program, each tile with the compiler's registers (the caps were timed for the shipped tile only)
    ix.PAGED_TILES, ix.PAGED_MAXNREG = 1, 0
    for cfg, loop, keys_m in runs:
        ix.INDEXER_CONFIGS["paged"] = cfg
        ix.PAGED_LOOP_PROGRAMS_PER_SM = loop or loop_programs
        ix.PAGED_KEYS_M = keys_m
        for tag, qq, ww, ref, form in qs:
            ix.PAGED_Q_FORM = form
            name = (f"triton:{tag}N{cfg[1]}-w{cfg[2]}-s{cfg[3]}" + (f"-loop{loop}" if loop else "")
                    + ("-keysM" if keys_m else ""))
            time_row(name, qq, ww, ref, row_bound_only=loop is not None)
    ix.INDEXER_CONFIGS["paged"], ix.PAGED_LOOP_PROGRAMS_PER_SM, ix.PAGED_Q_FORM = shipped, loop_programs, kept_form
    hw = fp8_hw(q.device)
    if fp8:  # (label, q, weights, reference, q form, the sm_90 cap of its launched dtype)
        tiled = [("f16", q, w, r, "f16", ix.MAXNREG_SM90["fp16"])]
        tiled += [("e4m3x2", q, w, r, "e4m3x2", ix.MAXNREG_SM90["fp8"])] if hw else []
        tiled += [("q8", fp8q[0], fp8q[1], fp8q[2], None, ix.MAXNREG_SM90["fp8"])] if fp8q else []
    else:
        tiled = [("bf16", q, w, r, None, None)]
    ix.PAGED_KEYS_M = None
    for per, stages, caps in SWEEP_INDEXER_TILES:  # several tiles a program, in the rule's layout
        ix.INDEXER_CONFIGS["paged"], ix.PAGED_TILES = (*shipped[:3], stages), per
        for label, qq, ww, ref, form, cap in tiled:
            ix.PAGED_Q_FORM = form or "f16"
            for maxnreg in (0, cap) if caps and cap else (0,):
                ix.PAGED_MAXNREG = maxnreg
                time_row(f"triton:q-{label}-t{per}-s{stages}" + (f"-r{maxnreg}" if maxnreg else ""), qq, ww, ref)
    ix.INDEXER_CONFIGS["paged"], ix.PAGED_TILES, ix.PAGED_Q_FORM, ix.PAGED_MAXNREG = shipped, 1, kept_form, 0
    if not fp8:
        return rows
    forms = [f for f in ix.Q_FORMS if hw or f != "e4m3x2"]
    for form in [None] + forms:  # bf16 q over fp8 keys, as it is and rewritten
        for keys_m in (False, True):
            ix.PAGED_Q_REWRITE, ix.PAGED_KEYS_M = form is not None, keys_m
            if form:
                ix.PAGED_Q_FORM = form
            time_row(f"triton:q-{form or 'bf16'}" + ("-keysM" if keys_m else ""), q, w, r)
    for maxnreg in (80, 96):
        for label, qq, ww, ref, form, _ in tiled:
            ix.PAGED_Q_REWRITE, ix.PAGED_KEYS_M, ix.PAGED_MAXNREG = form is not None, True, maxnreg
            if form:
                ix.PAGED_Q_FORM = form
            time_row(f"triton:q-{label}-keysM-r{maxnreg}", qq, ww, ref)
    return rows


def bench_indexer(ceil, B=128, ctx=32768, s_q=4096, HI=32, topk=TOPK, block_size=64, sweep=False):
    from glm5lib.kernels.common import fp8_hw

    rows = []
    scale = naive.INDEXER_DIM ** -0.5
    q8_ok = fp8_hw(torch.device("cuda"))  # fp8 q needs hardware e4m3 (not GLM5LIB_FP8_SOFTWARE, not sm_80)
    # decode: B requests of ctx tokens, fp8 paged (block-split) and bf16 paged
    for fmt in ("fp8", "bf16"):
        cache, bt, ctxs, q, w = paged_indexer_case(B, ctx, fmt, HI, block_size)
        kw = dict(scale=scale, k_format=fmt, block_table=bt, context_lens=ctxs, max_len=ctx)
        o = indexer_logits(q, cache, w, **kw)
        r = naive.indexer_logits_ref(q[:2], cache, w[:2], **{**kw, "block_table": bt[:2], "context_lens": ctxs[:2]})
        rel = float((o[:2] - r).norm() / r.norm())
        row_b = naive.INDEXER_FP8_ROW_BYTES if fmt == "fp8" else 2 * naive.INDEXER_DIM
        byts = B * ctx * row_b + B * ctx * 4  # keys read + fp32 scores written
        flops = indexer_flops(B, ctx, HI)
        ms = _median_ms(lambda: indexer_logits(q, cache, w, out=o, **kw))
        rows.append(_row("indexer-decode", "triton", B, HI, ctx, fmt, ms, flops, byts, ceil, {"rel_err": rel, "ctx": ctx}))
        if fmt == "fp8" and q8_ok:
            # fp8 q (per-(token, head) scale folded into the weights): fp8 x fp8 tensor-core dot, no conversion
            q8, q_scale = naive.quantize_indexer_q(q)
            w8 = w * q_scale
            o8 = indexer_logits(q8, cache, w8, **kw)
            rel8 = float((o8[:2] - r).norm() / r.norm())
            ms8 = _median_ms(lambda: indexer_logits(q8, cache, w8, out=o8, **kw))
            rows.append(_row("indexer-decode", "triton-q8", B, HI, ctx, fmt, ms8, flops, byts, ceil,
                             {"rel_err_vs_bf16_q": rel8, "ctx": ctx}))
        if sweep:
            with _indexer_knobs():
                rows += _indexer_decode_sweep(fmt, q, w, r, (q8, w8, o8[:2].clone()) if fmt == "fp8" and q8_ok
                                              else None, cache, o, kw, B, HI, ctx, flops, byts, ceil)
        ms_t = _median_ms(lambda: topk_indices(o, topk))
        rows.append(_row("topk-decode", "torch.topk", B, HI, topk, fmt, ms_t, 0.0, B * ctx * 4, ceil, {"ctx": ctx}))
        rows.append(_topk_select_row("topk-decode", o, topk, dict(lengths=ctxs), B, HI, fmt, ceil, ctx))
        del cache, q, w, o
    # prefill: the last s_q tokens of one request of ctx tokens, causal
    N = ctx
    for fmt in ("fp8", "bf16"):
        keys = torch.randn(N, naive.INDEXER_DIM, device="cuda", dtype=torch.bfloat16)
        cache = naive.quantize_indexer_k(keys) if fmt == "fp8" else keys
        q = torch.randn(s_q, HI, naive.INDEXER_DIM, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(s_q, HI, device="cuda") * HI ** -0.5
        ks = torch.zeros(s_q, device="cuda", dtype=torch.int32)
        ke = (N - s_q + 1 + torch.arange(s_q, device="cuda")).to(torch.int32)
        o = indexer_logits(q, cache, w, scale=scale, k_format=fmt, ks=ks, ke=ke)
        r = naive.indexer_logits_ref(q[-4:], cache, w[-4:], scale=scale, k_format=fmt, ks=ks[-4:], ke=ke[-4:])
        fin = torch.isfinite(r)
        rel = float((o[-4:][fin] - r[fin]).norm() / r[fin].norm())
        visible = float(ke.sum() - ks.sum())  # keys seen, summed over the queries
        flops = indexer_flops(s_q, visible / s_q, HI)
        ms = _median_ms(lambda: indexer_logits(q, cache, w, scale=scale, k_format=fmt, ks=ks, ke=ke, out=o))
        rows.append(_row("indexer-prefill", "triton", s_q, HI, N, fmt, ms, flops, s_q * N * 4, ceil, {"rel_err": rel, "ctx": N}))
        if fmt == "fp8" and q8_ok:
            q8, q_scale = naive.quantize_indexer_q(q)
            w8 = w * q_scale
            o8 = indexer_logits(q8, cache, w8, scale=scale, k_format=fmt, ks=ks, ke=ke)
            rel8 = float((o8[-4:][fin] - r[fin]).norm() / r[fin].norm())
            ms8 = _median_ms(lambda: indexer_logits(q8, cache, w8, scale=scale, k_format=fmt, ks=ks, ke=ke, out=o8))
            rows.append(_row("indexer-prefill", "triton-q8", s_q, HI, N, fmt, ms8, flops, s_q * N * 4, ceil,
                             {"rel_err_vs_bf16_q": rel8, "ctx": N}))
        ms_t = _median_ms(lambda: topk_indices(o, topk, ks=ks))
        rows.append(_row("topk-prefill", "torch.topk", s_q, HI, topk, fmt, ms_t, 0.0, s_q * N * 4, ceil, {"ctx": N}))
        rows.append(_topk_select_row("topk-prefill", o, topk, dict(lengths=ke, ks=ks), s_q, HI, fmt, ceil, N))
        del keys, cache, q, w, o
    torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------

C = MLAConfig
SWEEP_DECODE_SMALL = [C(16, 32, 4, 2, True, True), C(16, 32, 4, 2, True, False, True), C(16, 32, 4, 2, False, False, True),
                      C(16, 64, 4, 2, False, False, True), C(16, 32, 4, 3, False, False, True)]
SWEEP_DECODE_LARGE = [C(64, 64, 8, 3), C(64, 64, 8, 3, False, False, True), C(64, 64, 8, 2, False, False, True),
                      C(64, 32, 8, 2, False, False, True), C(64, 64, 8, 2, True, False, True)]
# fp8_ds_mla prefill at 8-16 heads (`bench_prefill_case(..., configs=...)`), against the shipped config: the decode
# loop's int32-word tile (v7c) with and without the index read-ahead, 64-row tiles on 8 warps (shipped since v8d)
SWEEP_PREFILL_FP8_SMALL = [C(16, 32, 4, 2, prefetch=2, nope_f16=True),
                           C(16, 32, 4, 2, prefetch=2, nope_f16=True, idx_ahead=True),
                           C(16, 64, 8, 2, prefetch=2, nope_f16=True, idx_ahead=True),
                           C(16, 64, 8, 2, prefetch=True, nope_f16=True, idx_ahead=True),
                           C(16, 32, 4, 3, nope_f16=True, idx_ahead=True)]
# the paged indexer (decode): (0, BLOCK_N, num_warps, num_stages), `indexer.INDEXER_CONFIGS["paged"]`'s form
SWEEP_INDEXER_PAGED = [(0, 128, 4, 2), (0, 128, 8, 2), (0, 256, 8, 2), (0, 64, 4, 3), (0, 128, 4, 3), (0, 256, 4, 2),
                       (0, 64, 2, 2)]
# tiles a program of the paged indexer scores (`indexer.PAGED_TILES`), its stage count, and whether to time it
# under the sm_90 register caps of `indexer.MAXNREG_SM90` too (fp8 keys); the shipped tile otherwise
SWEEP_INDEXER_TILES = [(per, stages, per in (4, 8)) for per in (2, 4, 8, 16) for stages in (1, 2, 3)]
SWEEP_PREFILL = [C(64, 64, 8, 2), C(64, 64, 8, 3), C(64, 64, 8, 2, True), C(64, 64, 8, 1, True), C(64, 32, 8, 1),
                 C(32, 32, 4, 2), C(16, 32, 4, 2), C(16, 64, 4, 2, True)]


def default_name(gpu: str) -> str:
    """File stem for a GPU's results: "NVIDIA H200" -> "bench_h200", "NVIDIA GeForce RTX 5090" -> "bench_geforce_rtx_5090"."""
    words = [w for w in re.split(r"[^0-9a-z]+", gpu.lower()) if w and w != "nvidia"]
    return "bench_" + ("_".join(words) or "gpu")


def source_commit(explicit: str | None = None) -> str | None:
    """The commit the benchmarked code came from: `explicit`, else $GLM5LIB_COMMIT (the device copy of the checkout
    has no .git), else `git rev-parse HEAD` of this package's checkout (+ "-dirty" with uncommitted tracked
    changes), else None."""
    if explicit:
        return explicit
    if os.environ.get("GLM5LIB_COMMIT"):
        return os.environ["GLM5LIB_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "-uno"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run(what: str = "all", out_dir: str = "outputs/bench", vendor: str = ".vendor", quick: bool = False,
        sweep: bool = False, scaling: bool = True, name: str | None = None, sweep_indexer: bool = False,
        force: bool = False, commit: str | None = None) -> dict:
    """Run the benchmarks and write `out_dir/name.json` (name defaults to `default_name(gpu)`; `res["meta"]["name"]`).

    An existing `name.json` / `name.png` is not overwritten unless `force` (the committed H200 results live there).
    `res["meta"]["commit"]`: `source_commit(commit)`; `res["meta"]["elapsed_s"]`: wall time per part.
    """
    from glm5lib.errors import UserError

    if not torch.cuda.is_available():
        raise UserError("glm5lib bench needs a CUDA GPU (none visible); the CPU checks are `pytest tests/test_kernels_*.py`", exit_code=3)
    import triton

    gpu = torch.cuda.get_device_name()
    name = name or default_name(gpu)
    out = Path(out_dir)
    taken = [p for p in (out / f"{name}.json", out / f"{name}.png") if p.exists()]
    if taken and not force:
        raise UserError(f"{taken[0]} exists; pass --name NEW (or --force to overwrite it)")
    torch.manual_seed(0)
    res: dict = {"meta": {
        "name": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "shapes": {"d_qk": GLM5.mla_qk_dim, "d_v": D_V, "topk": TOPK, "sm_scale": SM_SCALE},
        "configs": _dispatch_table(torch.device("cuda")),
        "commit": source_commit(commit), "quick": quick, "argv": sys.argv[1:],
    }}
    t_start = time.time()
    elapsed = res["meta"]["elapsed_s"] = {}
    fm_err = load_flashmla(vendor)
    res["meta"]["flashmla"] = "loaded" if fm_err is None else fm_err
    fm = fm_err is None
    print(f"flashmla: {res['meta']['flashmla']}", flush=True)
    ceil = measure_ceilings()
    res["ceilings"] = ceil
    print(f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['matmul_bf16_TFLOPs']:.0f} TFLOP/s", flush=True)
    rows: list[dict] = []
    def add(new):
        rows.extend(new)
        _print_rows(new)

    if what in ("all", "sparse-mla"):
        t0 = time.time()
        # decode: every case also times its sm_89/sm_120 ("small" shared memory) config (smem-small rows)
        Bs = (1, 32, 128) if not quick else (32, 128)
        for fmt in ("bf16", "fp8_ds_mla"):
            for H in (8, 16):
                for B in Bs:
                    add(bench_decode_case(B, H, fmt, ceil, flashmla=fm, naive_ref=(B == 32 and H == 16 and fmt == "bf16"),
                                          configs=SWEEP_DECODE_SMALL if sweep and B == 128 and H == 16 and fmt == "fp8_ds_mla" else None,
                                          small_smem=True))
            for H in (64, 128):
                add(bench_decode_case(128, H, fmt, ceil, flashmla=fm, small_smem=True,
                                      configs=SWEEP_DECODE_LARGE if sweep and fmt == "fp8_ds_mla" else None))
        if not quick:
            add(bench_decode_case(64, 64, "bf16", ceil, flashmla=False, naive_ref=True, check=False))
        elapsed["decode"] = time.time() - t0
        t0 = time.time()
        # the decode and prefill rows gathered with nothing after them (glm5lib.bench.gather): the ceiling of the
        # decode and fp8 prefill targets, measured beside them
        from glm5lib.bench.gather import ceiling_rows

        try:
            rows.extend(ceiling_rows(ceil))  # printed by ceiling_rows (its rows have no heads)
        except Exception as exc:  # noqa: BLE001  (the targets still print, without a ceiling)
            rows.append({"kind": "gather-ceiling", "impl": "best-gather", "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"  gather-ceiling: ERROR {rows[-1]['error']}", flush=True)
        elapsed["gather_ceiling"] = time.time() - t0
        t0 = time.time()
        # prefill (s_q 4096, s_kv 32K): bf16 at 8/64/128 heads; the fp8_ds_mla cache at 8/16 heads against
        # FlashMLA's bf16 prefill (its sparse prefill has no fp8 input) on the same values
        for H in (8, 64, 128):
            add(bench_prefill_case(H, ceil, flashmla=fm, small_smem=True))
        for H in (8, 16):
            add(bench_prefill_case(H, ceil, flashmla=fm, kv_format="fp8_ds_mla", small_smem=True))
        elapsed["prefill"] = time.time() - t0
        t0 = time.time()
        # time vs top-k (decode B=128) and vs context length (flat expected: only top-k rows are read)
        for fmt, H in ((("fp8_ds_mla", 16), ("fp8_ds_mla", 64)) if scaling else ()):
            for k in (256, 512, 1024, 2048):
                rows += [dict(r, kind="scale-topk") for r in bench_decode_case(128, H, fmt, ceil, topk=k, flashmla=fm and H >= 64, check=False)]
        for ctx in ((4096, 32768, 131072) if scaling else ()):
            rows += [dict(r, kind="scale-ctx", ctx=ctx) for r in bench_decode_case(64, 16, "fp8_ds_mla", ceil, ctx=ctx, flashmla=False, check=False)]
        elapsed["scaling"] = time.time() - t0
    if what in ("all", "indexer"):
        t0 = time.time()
        add(bench_indexer(ceil, sweep=sweep or sweep_indexer))
        elapsed["indexer"] = time.time() - t0
    elapsed["total"] = time.time() - t_start
    res["rows"] = rows
    res["targets"] = evaluate_targets(res)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{name}.json.tmp"
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, out / f"{name}.json")
    return res


def _print_rows(rows):
    for r in rows:
        if "error" in r:
            print(f"  {r.get('kind')} {r.get('impl')} T{r.get('T')} H{r.get('H')}: ERROR {r['error']}", flush=True)
        else:
            tail = ""
            if r.get("shared_bytes") is not None:
                tail = f" smem {r['shared_bytes'] / 1024:5.1f} KB regs {r.get('n_regs', '-')} spills {r.get('n_spills', '-')}"
            if r["kind"] == "smem-small" and r.get("big_us"):
                tail += f" (big {r['big_config']}: {r['big_us']:.1f} us){'' if r.get('fits_99KB') is not False else ' OVER 99 KB'}"
            print(f"  {r['kind']:14s} {r['impl']:34s} T{r['T']:<5d} H{r['H']:<4d} k{r['topk']:<6d} {r['kv_format']:10s} "
                  f"{r['us']:9.1f} us {r['TFLOPs']:7.1f} TF/s {r['GBps']:7.0f} GB/s{tail}", flush=True)


def _find(rows, **kw):
    for r in rows:
        if "error" not in r and all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _flashmla_for(rows, r):
    """FlashMLA's row timed beside our row `r`: same kind, tokens, heads and top-k, and the same cache format, or
    (fp8 prefill) the bf16 cache of the same values (`baseline_for`)."""
    if r is None:
        return None
    for x in rows:
        if ("error" not in x and str(x.get("impl", "")).startswith("flashmla") and x.get("kind") == r.get("kind")
                and x.get("T") == r.get("T") and x.get("H") == r.get("H") and x.get("topk") == r.get("topk")
                and x.get("baseline_for", x.get("kv_format")) == r.get("kv_format")):
            return x
    return None


def _small_config_keys(res: dict) -> list[str]:
    """The "small" shared-memory config keys the run shipped (its meta), else the ones shipped now."""
    keys = (res.get("meta") or {}).get("configs") or {"/".join(k): v.name for k, v in CONFIGS.items()}
    return sorted(k for k in keys if k.endswith("/small"))


def smem_small_status(res: dict) -> dict[str, dict]:
    """Per "small" config key: {"config", "rows", "timed", "max_shared_bytes", "fits", "ok"} from the smem-small rows.

    timed: every row of that key has a time (none failed) and there is at least one; fits: every compiled shared
    memory is known and <= 99 KB; ok: no row disagrees with the fp32 reference (rel err >= 1e-2, or NaN).
    """
    names = (res.get("meta") or {}).get("configs") or {}
    out = {}
    for key in _small_config_keys(res):
        rs = [r for r in res.get("rows", []) if r.get("kind") == "smem-small" and r.get("config_key") == key]
        shared = [r.get("shared_bytes") for r in rs if "error" not in r]
        out[key] = {
            "config": names.get(key),
            "rows": len(rs),
            "timed": bool(rs) and all("error" not in r and r.get("ms") for r in rs),
            "max_shared_bytes": max((b for b in shared if b is not None), default=None),
            "fits": bool(shared) and all(b is not None and b <= SMEM_SMALL_LIMIT for b in shared),
            "ok": all(r.get("ok") is not False for r in rs),
        }
    return out


def evaluate_targets(res: dict) -> list[dict]:
    """The speed targets of issue #13, each as {"target", "value", "goal", "met", "ceiling", "bounded"}: met is
    value >= goal, None when the value was not measured (e.g. FlashMLA missing, or a JSON from before the target
    existed). ceiling (decode targets and the fp8 prefill targets): what the case's rows gathered with nothing after
    them reach in the same run (`bench.gather.ceiling_rows`), in the target's unit; bounded: that ceiling is more than
    3 % below the goal (`CEILING_MARGIN`; None without a ceiling). A ceiling is the best of the routes measured,
    not a hardware limit."""
    rows = res.get("rows", [])
    out = []

    def add(name, value, goal, ceiling=None, **extra):
        op, g = goal.split()
        assert op == ">="
        met = None if value is None else bool(value >= float(g))
        ceiling = None if ceiling is None else float(ceiling)
        out.append({"target": name, "value": None if value is None else float(value), "goal": goal, "met": met,
                    "ceiling": ceiling, "bounded": None if ceiling is None else bool(ceiling < CEILING_MARGIN * float(g)),
                    **extra})

    def gathers(T, fmt, case="decode"):  # the fastest gather of this case's rows with nothing after them
        return _find(rows, kind="gather-ceiling", impl="best-gather", case=case, T=T, kv_format=fmt)

    def ours(kind, T, H, fmt):
        return _find(rows, kind=kind, impl="triton", T=T, H=H, kv_format=fmt)

    def ratio(r):  # FlashMLA time / our time, same case
        f = _flashmla_for(rows, r)
        return f["ms"] / r["ms"] if (r and f and r.get("ms")) else None

    # decode with the fp8_ds_mla cache, 8-16 heads, B 32-128: against FlashMLA padded to 64 heads, and against the
    # byte floor (gathered bytes at the measured copy bandwidth / kernel time, i.e. % of copy bandwidth)
    # Their ceiling: what the same rows gathered with nothing after them reach (a kernel must also compute), as
    # FlashMLA's time over the gathers' time and as the gathers' % of copy; `bounded` when it is more than 3 %
    # below the goal (the same for the 64-128-head decode and the fp8 prefill below).
    for H in (8, 16):
        for B in (32, 128):
            r = ours("decode", B, H, "fp8_ds_mla")
            g = gathers(B, "fp8_ds_mla")
            f = _flashmla_for(rows, r)
            add(f"decode fp8 H{H} B{B}: speed-up vs FlashMLA padded to 64", ratio(r), ">= 2.5",
                ceiling=f["ms"] / g["ms"] if (f and g) else None)
            add(f"decode fp8 H{H} B{B}: % of byte floor (gathered bytes at copy bandwidth)",
                r and r.get("pct_bw"), ">= 85", ceiling=g and g.get("pct_bw"))
    for H in (8, 16):
        r = ours("decode", 128, H, "bf16")
        g = gathers(128, "bf16")
        add(f"decode bf16 H{H} B128: % of copy bandwidth", r and r.get("pct_bw"), ">= 85",
            ceiling=g and g.get("pct_bw"))
    for H in (64, 128):
        r = ours("decode", 128, H, "fp8_ds_mla")
        f, g = _flashmla_for(rows, r), gathers(128, "fp8_ds_mla")
        add(f"decode fp8 H{H} B128: ratio to FlashMLA", ratio(r), ">= 0.8", ceiling=f["ms"] / g["ms"] if (f and g) else None)
    for H in (64, 128):
        r = _find(rows, kind="prefill", impl="triton", H=H, kv_format="bf16")
        add(f"prefill bf16 H{H}: ratio to FlashMLA (time)", ratio(r), ">= 0.8")
    for H in (8, 16):
        r = _find(rows, kind="prefill", impl="triton", H=H, kv_format="fp8_ds_mla")
        f, g = _flashmla_for(rows, r), gathers(r["T"] if r else None, "fp8_ds_mla", "prefill")
        add(f"prefill fp8_ds_mla H{H}: speed-up vs FlashMLA bf16 padded to 64 (time)", ratio(r), ">= 1.6",
            ceiling=f["ms"] / g["ms"] if (f and g) else None)
    # the sm_89 / sm_120 configs: every one compiled within 99 KB and timed on the H200 (and correct)
    st = smem_small_status(res)
    measured = any(s["rows"] for s in st.values())
    good = sum(s["timed"] and s["fits"] and s["ok"] for s in st.values())
    biggest = max((s["max_shared_bytes"] for s in st.values() if s["max_shared_bytes"] is not None), default=None)
    add("small-smem configs within 99 KB and timed (configs)", good if measured else None, f">= {len(st)}",
        max_shared_bytes=biggest)
    r = _find(rows, kind="indexer-decode", impl="triton", kv_format="fp8")
    add("indexer decode fp8: % of copy bandwidth", r and r.get("pct_bw"), ">= 70")
    r = _find(rows, kind="indexer-decode", impl="triton-q8", kv_format="fp8")
    add("indexer decode fp8 (fp8 q): % of copy bandwidth", r and r.get("pct_bw"), ">= 70")
    r = _find(rows, kind="indexer-decode", impl="triton", kv_format="bf16")
    add("indexer decode bf16: % of copy bandwidth", r and r.get("pct_bw"), ">= 70")
    r = _find(rows, kind="indexer-prefill", impl="triton", kv_format="fp8")
    add("indexer prefill fp8: % of bf16 matmul rate", r and r.get("pct_mm"), ">= 50")
    r = _find(rows, kind="indexer-prefill", impl="triton", kv_format="bf16")
    add("indexer prefill bf16: % of bf16 matmul rate", r and r.get("pct_mm"), ">= 50")
    return out


def smem_table(res: dict) -> str:
    """Markdown: every smem-small row (the sm_89/sm_120 config forced on an H200 case) beside the shipped one."""
    lines = ["| case | T | H | cache | small config (key) | smem KB | regs | spills | us | shipped big config | big smem KB | big us | small/big time |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def kb(b):
        return "-" if b is None else f"{b / 1024:.1f}"

    for r in res.get("rows", []):
        if r.get("kind") != "smem-small":
            continue
        if "error" in r:
            lines.append(f"| {r.get('case')} | {r.get('T')} | {r.get('H')} | {r.get('kv_format')} | {r.get('impl')} "
                         f"({r.get('config_key')}) | - | - | - | ERROR {r['error'][:60]} | - | - | - | - |")
            continue
        rel = "-" if not r.get("big_us") else f"{r['us'] / r['big_us']:.2f}"
        big_us = "-" if r.get("big_us") is None else f"{r['big_us']:.1f}"
        lines.append(f"| {r['case']} | {r['T']} | {r['H']} | {r['kv_format']} | {r['impl'][7:]} ({r['config_key']}) | "
                     f"{kb(r.get('shared_bytes'))}{'' if r.get('fits_99KB') is not False else ' (> 99 KB)'} | "
                     f"{r.get('n_regs', '-')} | {r.get('n_spills', '-')} | {r['us']:.1f} | {r.get('big_config')} | "
                     f"{kb(r.get('big_shared_bytes'))} | {big_us} | {rel} |")
    return "\n".join(lines)


SCALING_ARCHIVE = "sweeps/bench_h200_v6.json"  # beside bench_h200.json: the last full run with the scaling series


def scaling_rows(res: dict, archive: str | Path | None = None) -> tuple[list[dict], str]:
    """The scale-topk / scale-ctx rows of a run, or of `archive` when the run has none (`bench-targets` passes
    `--no-scaling`), and where they came from (for the figure and the notebook to say so)."""
    def pick(r):
        return [x for x in r["rows"] if x.get("kind") in ("scale-topk", "scale-ctx") and "error" not in x]

    rows = pick(res)
    if rows or archive is None or not Path(archive).is_file():
        return rows, "this run"
    old = json.loads(Path(archive).read_text())
    return pick(old), f"{Path(archive).name} ({old['meta'].get('commit') or old['meta']['date'][:10]})"


def plot(json_path: str | Path, png_path: str | Path, scaling_archive: str | Path | None = None) -> Path:
    """Three panels: time per case (ours vs FlashMLA), a roofline (achieved TFLOP/s against FLOP/byte), and time
    against top-k and context (from `scaling_archive` when the run has no scaling series)."""
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()
    res = json.loads(Path(json_path).read_text())
    rows = [r for r in res["rows"] if "error" not in r and r["kind"] in ("decode", "prefill")]
    ceil = res["ceilings"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 5.5))
    labels, ours, theirs = [], [], []
    for r in rows:
        if r["impl"] != "triton":
            continue
        f = _flashmla_for(rows, r)
        labels.append(f"{r['kind'][:3]} {r['kv_format'][:3]} T{r['T']} H{r['H']}")
        ours.append(r["us"])
        theirs.append(f["us"] if f else float("nan"))
    x = range(len(labels))
    a1.bar([i - 0.2 for i in x], ours, 0.4, label="glm5lib (Triton; Gluon on sm_90 at 17-128 heads and fp8 1-16)")
    a1.bar([i + 0.2 for i in x], theirs, 0.4, label="FlashMLA (vllm 0.33 wheel, padded heads)")
    a1.set_xticks(list(x), labels, rotation=80, fontsize=7)
    a1.set_yscale("log")
    a1.set_ylabel("time per call (us)")
    a1.legend(fontsize=8)
    a1.set_title("sparse MLA, top-k 2048")
    bw, mm = ceil["copy_GBps"], ceil["matmul_bf16_TFLOPs"]
    ai = [0.1 * 1.15**i for i in range(80)]
    a2.plot(ai, [min(mm, a * bw / 1e3) for a in ai], "k--", lw=1, label=f"roofline ({bw:.0f} GB/s, {mm:.0f} TF/s)")
    for r in rows:
        inten = r["TFLOPs"] * 1e3 / r["GBps"]
        a2.scatter(inten, r["TFLOPs"], marker="o" if r["impl"] == "triton" else "x",
                   c="C0" if r["impl"] == "triton" else "C1", s=20)
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("FLOP per gathered KV byte")
    a2.set_ylabel("TFLOP/s")
    a2.set_title("roofline (o: Triton, x: FlashMLA)")
    a2.legend(fontsize=8)
    srows, source = scaling_rows(res, scaling_archive)
    sc = [r for r in srows if r["kind"] == "scale-topk"]
    for H in sorted({r["H"] for r in sc}):
        for impl in ("triton", "flashmla"):
            pts = sorted((r["topk"], r["us"]) for r in sc if r["H"] == H and r["impl"].startswith(impl))
            if pts:
                a3.plot(*zip(*pts), marker="o", label=f"{impl} H{H} B128 fp8")
    cx = sorted((r["ctx"], r["us"]) for r in srows if r["kind"] == "scale-ctx")
    if cx:
        a3b = a3.twiny()
        a3b.plot(*zip(*cx), "k:", marker="s", label="triton H16 B64 vs context")
        a3b.set_xscale("log")
        a3b.set_xlabel("context length (dotted)")
    a3.set_xlabel("top-k")
    a3.set_ylabel("time (us)")
    a3.set_title("time grows with top-k, flat in context" + ("" if source == "this run" else f"\n(from {source})"))
    if a3.get_legend_handles_labels()[0]:  # no series when neither this run nor the archive has them
        a3.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, png_path)


def key_table(res: dict) -> str:
    """Markdown: our kernel beside FlashMLA for every decode / prefill case of a benchmark JSON."""
    rows = [r for r in res["rows"] if "error" not in r and r["kind"] in ("decode", "prefill")]
    ceil = res["ceilings"]
    lines = ["| case | T | H | cache | Triton us | FlashMLA us | speed-up | Triton TFLOP/s | KV GB/s | % of copy BW |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["impl"] != "triton":
            continue
        f = _flashmla_for(rows, r)
        fu = f"{f['us']:.1f}" if f else "-"
        sp = f"{f['us'] / r['us']:.2f}x" if f else "-"
        lines.append(f"| {r['kind']} | {r['T']} | {r['H']} | {r['kv_format']} | {r['us']:.1f} | {fu} | {sp} | "
                     f"{r['TFLOPs']:.0f} | {r['GBps']:.0f} | {100 * r['GBps'] / ceil['copy_GBps']:.0f} |")
    for r in res["rows"]:
        if r.get("kind", "").startswith(("indexer-decode", "indexer-prefill", "topk")) and "error" not in r and "sweep" not in r["kind"]:
            lines.append(f"| {r['kind']} ({r['impl']}) | {r['T']} | {r['H']} | {r['kv_format']} | {r['us']:.1f} | - | - | "
                         f"{r['TFLOPs']:.0f} | {r['GBps']:.0f} | {100 * r['GBps'] / ceil['copy_GBps']:.0f} |")
    return "\n".join(lines)


def headline(res: dict) -> dict:
    """The few numbers the notebook's prose cites, computed from a benchmark JSON ([min, max] over the cases)."""
    rows = [r for r in res["rows"] if "error" not in r]

    def span(vals):
        vals = [float(v) for v in vals if v is not None]
        return [min(vals), max(vals)] if vals else None

    dec = [r for r in rows if r["kind"] == "decode" and r["impl"] == "triton" and r["T"] == 128 and r["H"] <= 16]
    pre = [r for r in rows if r["kind"] == "prefill" and r["kv_format"] == "bf16"]
    ours8 = _find(pre, impl="triton", H=8, kv_format="bf16")
    fm8 = _flashmla_for(pre, ours8)
    return {
        "decode_bf16_h8_16_b128_pct_copy": span(r.get("pct_bw") for r in dec if r["kv_format"] == "bf16"),
        "decode_fp8_h8_16_b128_pct_copy": span(r.get("pct_bw") for r in dec if r["kv_format"] == "fp8_ds_mla"),
        "prefill_h64_128_TFLOPs": span(r["TFLOPs"] for r in pre if r["impl"] == "triton" and r["H"] >= 64),
        "prefill_h64_128_flashmla_TFLOPs": span(r["TFLOPs"] for r in pre if r["impl"].startswith("flashmla")
                                                and r["H"] >= 64 and not r.get("baseline_for")),
        "prefill_h8_speedup_vs_flashmla": fm8["ms"] / ours8["ms"] if ours8 and fm8 else None,
        "indexer_decode_fp8q_bf16_pct_copy": span(r.get("pct_bw") for r in rows if r["kind"] == "indexer-decode" and (
            (r["impl"], r["kv_format"]) in (("triton-q8", "fp8"), ("triton", "bf16")))),
        "indexer_decode_bf16q_fp8_pct_copy": next((r.get("pct_bw") for r in rows if r["kind"] == "indexer-decode"
                                                   and (r["impl"], r["kv_format"]) == ("triton", "fp8")), None),
    }


def targets_table(res: dict) -> str:
    """Markdown: every target with its value, goal and whether it is met; where the benchmark measured a ceiling
    (decode and fp8 prefill: the same rows gathered with nothing after them, `evaluate_targets`), that ceiling,
    marked "below goal" when the gathers alone already fall short of the goal."""
    lines = ["| target | measured | goal | met | ceiling (gathers alone) |", "|---|---|---|---|---|"]
    for t in res.get("targets", []):
        v = "-" if t["value"] is None else f"{t['value']:.2f}"
        met = "not measured" if t["met"] is None else "yes" if t["met"] else "no"
        c = t.get("ceiling")
        ceiling = "-" if c is None else f"{c:.2f}" + (" (below goal)" if t.get("bounded") else "")
        lines.append(f"| {t['target']} | {v} | {t['goal']} | {met} | {ceiling} |")
    return "\n".join(lines)
