"""Run GLM5_SPARSE_MLA's forward on vLLM-shaped inputs, against the fp32 reference (no vLLM needed).

    python -m glm5lib.serving.harness                      # CUDA if present: GLM-5 sizes, Triton kernel
    python -m glm5lib.serving.harness --device cpu --tiny  # CI: Triton interpreter, tiny sizes
    python -m glm5lib.serving.harness --json out.json
    python -m glm5lib.serving.harness --graphs --json out.json   # decode step in a CUDA graph (glm5lib.serving.graphs)

What vLLM hands the backend is rebuilt here: requests with different context and query lengths (decode tokens
first, then a prefill chunk, as vLLM orders them), a paged cache `[num_blocks, block_size, row]` whose blocks sit
`block_stride_rows > block_size` rows apart (another layer's pages in between) and are allocated in random
order, a block table, the indexer's request-local top-k (`[T, index_topk]`, -1 padded when the context is
shorter). `paged.sparse_mla_forward` (the exact function `Glm5SparseMLAImpl.forward_mqa` calls) converts the
top-k to physical rows and runs the kernel; the reference gathers the same keys from the unpaged per-request
rows and runs `glm5lib.kernels.naive.sparse_mla_ref` in fp32. Checked like FlashMLA's tests: cosine
difference and max abs error; each case also prints microseconds and TFLOP/s.

Indexer cases: the plugin indexer's fp8 path (`paged.request_topk`: keys written by `write_indexer_keys` into a
block-strided paged fp8 cache, glm5lib's Triton paged indexer kernel) against the same keys scored in PyTorch;
top-k overlap must be 1 (fp32 / interpreter) or >= 0.99 (bf16 q on the GPU: near-ties at the cut may swap).
Indexer step cases run `paged.step_topk` (what `Glm5SparseAttnIndexer` calls each layer) on a whole step, a
decode batch with or without a prefill chunk behind it: the batched decode launch must give exactly the
per-request loop's top-k. Top-k select cases hold glm5lib's Triton radix select (`kernels.topk.topk_select`,
what the step uses) to a stable descending sort on the same device, ties and signed zeros included.

Timings on CUDA (CUDA events): `eager_us`, the call as the backend makes it (one eager call per layer: host
launch overhead shows here), `graph_us`, the same call captured in a CUDA graph and replayed (GPU time alone;
capture also proves the path never waits on the host), and `kernel_us`, the attention kernel alone (graph
replay, physical rows precomputed) with the bandwidth it reaches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import torch

from glm5lib.kernels.naive import D_QK, FP8_DS_MLA_ROW_BYTES, INDEXER_DIM, INDEXER_FP8_ROW_BYTES, cos_diff
from glm5lib.model.spec import GLM5Config

GLM5 = GLM5Config.glm5()


def _events_us(fn, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


def cuda_timings(fn, repeats: int, graph: bool = True) -> dict:
    """`eager_us`: back-to-back eager calls (the larger of host and GPU time per call); `graph_us`: the same call
    replayed from a CUDA graph (GPU time alone). A path that syncs with the host cannot be captured:
    `graph_error` says why."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    res = {"eager_us": _events_us(fn, repeats)}
    if not graph:
        return res
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        res["graph_us"] = _events_us(g.replay, repeats)
    except Exception as e:  # noqa: BLE001  (reported: the harness measures, it does not fix)
        torch.cuda.synchronize()
        res["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return res


@dataclass
class Case:
    heads: int
    topk: int
    kv_format: str  # bf16 | fp8_ds_mla
    seq_lens: tuple[int, ...]  # context length per request, after this step
    query_lens: tuple[int, ...]  # tokens of each request in this step (1 = decode)
    block_size: int = 64
    stride_pad_rows: int = 16  # extra rows between this layer's blocks

    @property
    def id(self) -> str:
        return f"H{self.heads}-K{self.topk}-{self.kv_format}-R{len(self.seq_lens)}-T{sum(self.query_lens)}"


def tiny_cases() -> list[Case]:
    return [
        Case(4, 64, "bf16", (37, 130, 70), (1, 1, 5)),
        Case(4, 64, "fp8_ds_mla", (64, 9), (2, 9)),
    ]


def glm5_cases() -> list[Case]:
    out, k = [], GLM5.index_topk
    for kv in ("bf16", "fp8_ds_mla"):
        for h in (8, 16, 64, 128):
            out.append(Case(h, k, kv, (4096, 9000, 2100, 777) * 16, (1,) * 64))  # decode batch 64
        out.append(Case(GLM5.num_attention_heads, k, kv, (1500, 6000, 3000), (1, 1, 512)))  # decode + prefill chunk
    return out


def build_inputs(case: Case, device: torch.device, seed: int = 0):
    from glm5lib.kernels.naive import quantize_fp8_ds_mla
    from glm5lib.vllm_plugin.paged import PagedBatch

    g = torch.Generator(device="cpu").manual_seed(seed)
    R, bs = len(case.seq_lens), case.block_size
    blocks_per_req = [math.ceil(L / bs) for L in case.seq_lens]
    n_blocks = sum(blocks_per_req) + 3
    perm = torch.randperm(n_blocks, generator=g)
    block_table = torch.zeros(R, max(blocks_per_req), dtype=torch.int32)
    k = 0
    for r, nb in enumerate(blocks_per_req):
        block_table[r, :nb] = perm[k : k + nb].to(torch.int32)
        k += nb
    kv_logical = [torch.randn(L, D_QK, generator=g) for L in case.seq_lens]  # fp32 per-request rows
    fp8 = case.kv_format == "fp8_ds_mla"
    width = FP8_DS_MLA_ROW_BYTES if fp8 else D_QK
    # bf16 on the GPU; fp32 on CPU, where Triton's interpreter stands in fp32 for bf16 (glm5lib.kernels.checks)
    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = torch.uint8 if fp8 else act
    stride_rows = bs + case.stride_pad_rows
    storage = torch.zeros(n_blocks * stride_rows, width, dtype=dtype)
    cache = storage.as_strided((n_blocks, bs, width), (stride_rows * width, width, 1))
    ref_rows = []
    for r, kv in enumerate(kv_logical):
        stored = quantize_fp8_ds_mla(kv) if fp8 else kv.to(act)
        pos = torch.arange(kv.shape[0])
        cache[block_table[r, pos // bs].long(), pos % bs] = stored
        ref_rows.append(stored)
    T = sum(case.query_lens)
    q = (torch.randn(T, case.heads, D_QK, generator=g) * 0.5).to(act)
    topk = torch.full((T, case.topk), -1, dtype=torch.int32)
    req_of_token = []
    t = 0
    for r, (L, n) in enumerate(zip(case.seq_lens, case.query_lens)):
        for i in range(n):
            p = L - n + i  # this token's position
            cand = torch.randperm(p + 1, generator=g)[: case.topk]
            topk[t, : cand.numel()] = cand.to(torch.int32)
            req_of_token.append(r)
            t += 1
    from glm5lib.vllm_plugin.paged import req_id_per_token

    qsl = torch.tensor([0, *torch.tensor(case.query_lens).cumsum(0).tolist()])
    batch = PagedBatch(req_id_per_token(qsl, T).to(device), block_table.to(device), bs, case.topk)
    return q.to(device), storage.to(device).as_strided(cache.shape, cache.stride()), batch, topk.to(device), \
        ref_rows, torch.tensor(req_of_token)


def reference(q, ref_rows, topk, req_of_token, kv_format, scale):
    """fp32: the same keys gathered from unpaged per-request rows (on q's device, in token chunks)."""
    from glm5lib.kernels.naive import dequantize_fp8_ds_mla, sparse_mla_ref_chunked

    rows = [dequantize_fp8_ds_mla(r) if kv_format == "fp8_ds_mla" else r.float() for r in ref_rows]
    offsets = torch.tensor([0, *torch.tensor([r.shape[0] for r in rows]).cumsum(0).tolist()[:-1]])
    flat = torch.cat(rows).to(q.device)
    tk = topk.cpu().long()
    idx = torch.where(tk >= 0, tk + offsets[req_of_token][:, None], torch.full_like(tk, -1))
    out, lse = sparse_mla_ref_chunked(q.float(), flat, idx.to(torch.int32).to(q.device), scale, kv_format="fp32",
                                      chunk=64)
    return out.cpu(), lse.cpu()


def run_case(case: Case, device: torch.device, kernel: str, repeats: int) -> dict:
    from glm5lib.kernels.mla import sparse_mla_flops
    from glm5lib.vllm_plugin.paged import sparse_mla_forward

    scale = GLM5.softmax_scale  # (192 + 64) ** -0.5 = 1/16
    q, cache, batch, topk, ref_rows, req_of_token = build_inputs(case, device)
    out, lse = sparse_mla_forward(q, cache, batch, topk, scale, case.kv_format, kernel)
    ref_out, ref_lse = reference(q, ref_rows, topk, req_of_token, case.kv_format, scale)
    o = out.float().cpu()
    res = {"case": case.id, **asdict(case), "kernel": kernel, "device": str(device),
           "max_abs_err": float((o - ref_out).abs().max()), "cos_diff": cos_diff(o, ref_out),
           "lse_max_abs_err": float((lse.float().cpu() - ref_lse).abs().max())}
    res["ok"] = res["cos_diff"] < 1e-5 and res["max_abs_err"] < 2e-2 and res["lse_max_abs_err"] < 1e-2
    if repeats > 0 and device.type == "cuda":
        from glm5lib.kernels.mla import sparse_mla_kv_bytes
        from glm5lib.vllm_plugin.paged import flat_kv_rows, local_to_physical_rows, physical_rows_for, run_sparse_mla

        T = q.shape[0]
        res.update(cuda_timings(lambda: sparse_mla_forward(q, cache, batch, topk, scale, case.kv_format, kernel),
                                repeats))
        kv_rows, stride_rows = flat_kv_rows(cache, batch.block_size)
        rows = physical_rows_for(kernel)(batch.req_id_per_token, batch.block_table, topk, batch.block_size,
                                         stride_rows)
        k = cuda_timings(lambda: run_sparse_mla(q, kv_rows, rows, scale, case.kv_format, kernel), repeats)
        res["kernel_us"] = k.get("graph_us", k["eager_us"])
        res["tflops"] = sparse_mla_flops(T, case.heads, case.topk) / (res["kernel_us"] * 1e-6) / 1e12
        res["kernel_tb_s"] = sparse_mla_kv_bytes(T, case.topk, case.kv_format) / (res["kernel_us"] * 1e-6) / 1e12
        res["convert_torch_eager_us"] = cuda_timings(
            lambda: local_to_physical_rows(batch.req_id_per_token, batch.block_table, topk, batch.block_size,
                                           stride_rows), repeats, graph=False)["eager_us"]
    return res


@dataclass
class IndexerCase:
    topk: int
    seq_len: int
    n_query: int  # the request's last n positions (1 = decode)
    heads: int = GLM5.index_n_heads
    block_size: int = 64
    stride_pad_rows: int = 8

    @property
    def id(self) -> str:
        return f"indexer-H{self.heads}-K{self.topk}-L{self.seq_len}-n{self.n_query}"


def indexer_cases(tiny: bool) -> list[IndexerCase]:
    if tiny:
        return [IndexerCase(16, 150, 3, heads=4), IndexerCase(64, 40, 1, heads=4)]
    k = GLM5.index_topk
    return [IndexerCase(k, 9000, 1), IndexerCase(k, 32768, 1), IndexerCase(k, 6000, 256)]


def run_indexer_case(case: IndexerCase, device: torch.device, kernel: str) -> dict:
    """The plugin indexer's fp8 path (`paged.request_topk`: paged cache written by `write_indexer_keys`, block
    stride > block size, scrambled block table) against the same keys read back and scored in PyTorch."""
    from glm5lib.vllm_plugin.paged import read_indexer_keys, request_topk, write_indexer_keys

    g = torch.Generator(device="cpu").manual_seed(1)
    bs, L, n = case.block_size, case.seq_len, case.n_query
    nb = math.ceil(L / bs)
    n_blocks = nb + 2
    stride = bs + case.stride_pad_rows
    row = INDEXER_FP8_ROW_BYTES
    storage = torch.zeros(n_blocks * stride, row, dtype=torch.uint8)
    cache = storage.as_strided((n_blocks, bs, row), (stride * row, row, 1))
    block_row = torch.randperm(n_blocks, generator=g)[:nb].to(torch.int32)
    keys = torch.randn(L, INDEXER_DIM, generator=g)
    pos = torch.arange(L)
    write_indexer_keys(cache, keys, block_row[pos // bs].long() * bs + pos % bs)
    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(n, case.heads, INDEXER_DIM, generator=g).to(act)
    w = torch.randn(n, case.heads, generator=g) * case.heads**-0.5 * INDEXER_DIM**-0.5
    cache_d = storage.to(device).as_strided(cache.shape, cache.stride())
    got = request_topk(q.to(device), w.to(device), cache_d, block_row.to(device), L, case.topk, kernel=kernel).cpu()
    ref = request_topk(q.float(), w, cache, block_row, L, case.topk, kernel="naive")
    same = [len((set(a.tolist()) & set(b.tolist())) - {-1}) / max(1, int((b >= 0).sum())) for a, b in zip(got, ref)]
    same_padding = bool(((got < 0) == (ref < 0)).all()) or act == torch.bfloat16
    back = read_indexer_keys(cache, block_row, L)
    res = {"case": case.id, **asdict(case), "kernel": kernel, "device": str(device),
           "topk_overlap_min": min(same), "keys_fp8_max_rel_err": float((back - keys).abs().max() / keys.abs().max())}
    # bf16 q on the GPU moves scores by ~1e-3 relative: near-ties at the cut may swap; fp32 must agree exactly
    res["ok"] = res["topk_overlap_min"] >= (0.99 if act == torch.bfloat16 else 1.0) and same_padding
    return res


def same_picks(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Row-wise the same picked positions (-1 padding included), whatever their order."""
    return bool(torch.equal(torch.sort(a, 1).values, torch.sort(b, 1).values))


@dataclass
class StepCase:
    """One indexer step: each request's context length and query tokens this step (decodes first, as vLLM
    orders them; prefill chunks after)."""

    topk: int
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    heads: int = GLM5.index_n_heads
    block_size: int = 64
    q_fp8: bool = False  # q as vLLM hands it over: e4m3 per (token, head), the scale folded into the weights

    @property
    def id(self) -> str:
        return (f"indexer-step-H{self.heads}-K{self.topk}-R{len(self.seq_lens)}-T{sum(self.query_lens)}"
                + ("-q8" if self.q_fp8 else ""))


def step_cases(tiny: bool) -> list[StepCase]:
    if tiny:
        return [StepCase(16, (40, 9, 150, 70, 33), (1, 1, 1, 1, 20), heads=4),
                StepCase(16, (41, 20, 90), (2, 2, 2), heads=4), StepCase(16, (30, 77, 12), (1, 1, 5), heads=4, q_fp8=True)]
    k = GLM5.index_topk
    return [StepCase(k, (4096, 9000, 2100, 777) * 16, (1,) * 64),  # decode batch 64
            StepCase(k, (4096, 9000, 2100, 777) * 16, (1,) * 64, q_fp8=True),
            StepCase(k, (4096, 9000, 2100, 777) * 8 + (6000,), (1,) * 32 + (256,)),  # decodes + a prefill chunk
            StepCase(k, (30000, 12000) * 32, (2,) * 64)]  # MTP: next_n = 2


def run_step_case(case: StepCase, device: torch.device, kernel: str, repeats: int) -> dict:
    """`paged.step_topk` on a whole step: batched decode launch vs the per-request loop vs the PyTorch twin."""
    from glm5lib.vllm_plugin.paged import step_topk, write_indexer_keys

    g = torch.Generator(device="cpu").manual_seed(2)
    bs, R = case.block_size, len(case.seq_lens)
    nblk = [math.ceil(L / bs) for L in case.seq_lens]
    n_blocks = sum(nblk) + 2
    perm = torch.randperm(n_blocks, generator=g)
    table = torch.zeros(R, max(nblk), dtype=torch.int32)
    cache = torch.zeros(n_blocks, bs, INDEXER_FP8_ROW_BYTES, dtype=torch.uint8)
    k0 = 0
    for r, (L, nb) in enumerate(zip(case.seq_lens, nblk)):
        table[r, :nb] = perm[k0 : k0 + nb].to(torch.int32)
        k0 += nb
        pos = torch.arange(L)
        write_indexer_keys(cache, torch.randn(L, INDEXER_DIM, generator=g), table[r, pos // bs].long() * bs + pos % bs)
    T = sum(case.query_lens)
    qsl = [0, *torch.tensor(case.query_lens).cumsum(0).tolist()]
    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(T, case.heads, INDEXER_DIM, generator=g).to(act)
    w = torch.randn(T, case.heads, generator=g) * case.heads**-0.5 * INDEXER_DIM**-0.5
    if case.q_fp8:
        from glm5lib.kernels.naive import quantize_indexer_q

        q, q_scale = quantize_indexer_q(q)
        w = w * q_scale
    qd, wd, cd, td = q.to(device), w.to(device), cache.to(device), table.to(device)
    lens_d = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)

    def step(batch_decodes: bool, kern: str = kernel) -> torch.Tensor:
        buf = torch.empty(T, case.topk, dtype=torch.int32, device=device)
        return step_topk(qd, wd, cd, td, qsl, list(case.seq_lens), case.topk, buf, seq_lens_dev=lens_d,
                         kernel=kern, batch_decodes=batch_decodes)

    batched, loop = step(True).cpu(), step(False).cpu()
    ref = step(False, "naive") if device.type == "cpu" else None
    res = {"case": case.id, **asdict(case), "kernel": kernel, "device": str(device),
           "batched_equals_loop": bool(torch.equal(batched, loop))}
    if ref is not None:  # fp32 interpreter: the kernels must pick exactly what the PyTorch twin picks
        res["equals_naive"] = same_picks(batched, ref.cpu())
    res["ok"] = res["batched_equals_loop"] and res.get("equals_naive", True)
    if repeats > 0 and device.type == "cuda":
        res["batched_eager_us"] = cuda_timings(lambda: step(True), repeats, graph=False)["eager_us"]
        res["loop_eager_us"] = cuda_timings(lambda: step(False), max(3, repeats // 4), graph=False)["eager_us"]
        # this step's keys into the cache (the op's first half): the Triton scatter against the PyTorch writer,
        # whose boolean mask over -1 slots makes the host wait for the GPU
        from glm5lib.vllm_plugin.paged import write_indexer_keys_torch

        last = torch.tensor([L - n + i for L, n in zip(case.seq_lens, case.query_lens) for i in range(n)])
        req = torch.tensor([r for r, n in enumerate(case.query_lens) for _ in range(n)])
        slots = (table[req, last // bs].long() * bs + last % bs).to(torch.int32)
        slots[::7] = -1  # padding tokens
        k_new, slots_d = torch.randn(T, INDEXER_DIM, generator=g).to(device), slots.to(device)
        before = cd.clone()
        write_indexer_keys(cd, k_new, slots_d)
        triton_cache = cd.clone()
        cd.copy_(before)
        write_indexer_keys_torch(cd, k_new, slots_d)
        res["key_write_same_bytes"] = bool(torch.equal(cd, triton_cache))
        res["ok"] = res["ok"] and res["key_write_same_bytes"]
        t = cuda_timings(lambda: write_indexer_keys(cd, k_new, slots_d), repeats)
        res["key_write_eager_us"], res["key_write_graph_us"] = t["eager_us"], t.get("graph_us")
        t = cuda_timings(lambda: write_indexer_keys_torch(cd, k_new, slots_d), repeats)
        res["key_write_torch_eager_us"], res["key_write_torch_graph_error"] = t["eager_us"], t.get("graph_error")
    return res


def format_results(report: dict) -> str:
    """One line per case: check result and, where measured, the timings."""
    lines = []
    for r in report["results"]:
        head = f"{r['case']:<32} {'ok  ' if r['ok'] else 'FAIL'}"
        if "kv_format" in r:
            line = f"{head} cos diff {r['cos_diff']:.1e}  max abs {r['max_abs_err']:.1e}"
            if "eager_us" in r:
                graph = f"{r['graph_us']:6.1f} us" if "graph_us" in r else "(" + r.get("graph_error", "?")[:40] + ")"
                line += (f"  eager {r['eager_us']:6.1f} us  graph {graph}  kernel {r['kernel_us']:6.1f} us "
                         f"({r['kernel_tb_s']:.2f} TB/s, {r['tflops']:.0f} TFLOP/s)")
        elif "same_picks" in r:
            line = f"{head} same picks as a stable sort: {r['same_picks']}, ascending: {r['ascending']}"
            if "select_us" in r:
                line += "".join(f"  {label} {r[k + '_eager_us']:6.1f}/{r.get(k + '_graph_us', float('nan')):6.1f} us"
                                for k, label in (("select", "select"), ("stable_sort", "stable sort"),
                                                 ("torch_topk", "torch.topk")))
                line += "  (eager/graph)"
        elif "batched_equals_loop" in r:
            line = f"{head} batched == one at a time: {r['batched_equals_loop']}"
            if "batched_eager_us" in r:
                line += f"  batched {r['batched_eager_us']:7.0f} us  one request at a time {r['loop_eager_us']:7.0f} us"
            if "key_write_eager_us" in r:
                line += (f"  key write: same bytes {r['key_write_same_bytes']}, Triton {r['key_write_eager_us']:.0f} us"
                         f" (graph {'ok' if r['key_write_graph_us'] else 'FAILED'}), PyTorch"
                         f" {r['key_write_torch_eager_us']:.0f} us"
                         f" (graph {'fails: syncs' if r['key_write_torch_graph_error'] else 'ok'})")
        else:
            line = f"{head} top-k overlap {r['topk_overlap_min']:.4f}"
        lines.append(line)
    return "\n".join(lines)


def summarize(report: dict) -> dict:
    """What a reader wants from a harness JSON: pass counts, and on CUDA the call path's cost against the kernel."""
    res = report["results"]
    mla = [r for r in res if "kv_format" in r]
    steps = [r for r in res if r["case"].startswith("indexer-step")]
    out = {"device": report["device"], "cases": len(res), "passed": sum(bool(r["ok"]) for r in res),
           "mla_cases": len(mla), "max_cos_diff": max(r["cos_diff"] for r in mla),
           "indexer_step_batched_equals_loop": all(r["batched_equals_loop"] for r in steps)}
    timed = [r for r in mla if "eager_us" in r]
    if timed:
        out["graph_captured"] = sum("graph_us" in r for r in timed)
        out["mla_timed"] = len(timed)
        # decode at 8-16 heads per GPU (GLM-5 at TP 8 / 4): where launch overhead can exceed the GPU time
        small = [r for r in timed if max(r["query_lens"]) == 1 and r["heads"] <= 16 and "graph_us" in r]
        if small:
            out["small_heads_decode_eager_over_graph"] = [min(r["eager_us"] / r["graph_us"] for r in small),
                                                          max(r["eager_us"] / r["graph_us"] for r in small)]
            out["small_heads_decode_host_excess_us"] = [min(r["eager_us"] - r["graph_us"] for r in small),
                                                        max(r["eager_us"] - r["graph_us"] for r in small)]
        out["large_eager_over_graph_max"] = max(r["eager_us"] / r["graph_us"] for r in timed
                                                if r["heads"] >= 64 and "graph_us" in r)
        out["path_over_kernel_max"] = max(r["graph_us"] / r["kernel_us"] for r in timed if "graph_us" in r)
    sel = [r for r in res if "select_us" in r]
    if sel:  # GPU time against GPU time where both captured; eager against eager too (what the eager indexer pays)
        out["topk_select_vs_stable_sort"] = {r["case"]: r["stable_sort_us"] / r["select_us"] for r in sel}
        out["topk_select_vs_torch_topk"] = {r["case"]: r["torch_topk_us"] / r["select_us"] for r in sel}
        out["topk_select_vs_torch_topk_eager"] = {r["case"]: r["torch_topk_eager_us"] / r["select_eager_us"]
                                                  for r in sel if "select_eager_us" in r}  # older files lack it
        out["topk_timing"] = {r["case"]: "graph" if "select_graph_us" in r and "torch_topk_graph_us" in r
                              else "mixed" for r in sel}
    step_t = [r for r in steps if "batched_eager_us" in r]
    if step_t:
        out["indexer_step_speedup"] = {r["case"]: r["loop_eager_us"] / r["batched_eager_us"] for r in step_t}
    writes = [r for r in steps if "key_write_eager_us" in r]
    if writes:
        out["key_write_same_bytes"] = all(r["key_write_same_bytes"] for r in writes)
        out["key_write_triton_captures"] = all(r["key_write_graph_us"] for r in writes)
        out["key_write_torch_captures"] = any(not r["key_write_torch_graph_error"] for r in writes)
        out["key_write_eager_speedup"] = [min(r["key_write_torch_eager_us"] / r["key_write_eager_us"] for r in writes),
                                          max(r["key_write_torch_eager_us"] / r["key_write_eager_us"] for r in writes)]
    return out


def plot(report: dict):
    """Bars per sparse-MLA case (eager call, graph replay, kernel alone) and per indexer step (batched vs the
    per-request loop), in microseconds on a log scale. Needs CUDA timings."""
    from glm5lib.plotting import pyplot

    plt = pyplot()
    mla = [r for r in report["results"] if "eager_us" in r]
    steps = [r for r in report["results"] if "batched_eager_us" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 1]})
    x = range(len(mla))
    for i, (key, label) in enumerate([("eager_us", "eager call (as vLLM runs it)"),
                                      ("graph_us", "CUDA-graph replay"), ("kernel_us", "attention kernel alone")]):
        a.bar([j + (i - 1) * 0.27 for j in x], [r.get(key, float("nan")) for r in mla], 0.27, label=label)
    a.set_xticks(list(x), [r["case"].replace("-K2048", "").replace("fp8_ds_mla", "fp8") for r in mla],
                 rotation=35, ha="right", fontsize=8)
    a.set_yscale("log")
    a.set_ylabel("us per call")
    a.set_title(f"GLM5_SPARSE_MLA forward_mqa, {report['device']}")
    a.legend(fontsize=8)
    y = range(len(steps))
    b.bar([j - 0.2 for j in y], [r["loop_eager_us"] for r in steps], 0.4, label="one request at a time")
    b.bar([j + 0.2 for j in y], [r["batched_eager_us"] for r in steps], 0.4, label="batched decode launch")
    b.set_xticks(list(y), [f"R{len(r['seq_lens'])} T{sum(r['query_lens'])}" + (" q8" if r.get("q_fp8") else "")
                           for r in steps], fontsize=8)
    b.set_yscale("log")
    b.set_title("indexer step (top-k 2048)")
    b.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    return fig


@dataclass
class SelectCase:
    """Top-k over index-score rows: `rows` rows of `n` scores (`distinct` values: ties at the cut), per-row lengths."""

    topk: int
    rows: int
    n: int
    distinct: int = 0  # 0: continuous scores; else scores drawn from this many values, some of them +-0.0

    @property
    def id(self) -> str:
        return f"topk-select-K{self.topk}-T{self.rows}-N{self.n}" + (f"-ties{self.distinct}" if self.distinct else "")


def select_cases(tiny: bool) -> list[SelectCase]:
    if tiny:
        return [SelectCase(16, 5, 300, 6), SelectCase(64, 3, 200)]
    k = GLM5.index_topk
    return [SelectCase(k, 64, 9000), SelectCase(k, 64, 9000, 16), SelectCase(k, 128, 32768),
            SelectCase(k, 64, 131072, 64), SelectCase(k, 2048, 8192)]


def run_select_case(case: SelectCase, device: torch.device, repeats: int) -> dict:
    """`kernels.topk.topk_select` (what the indexer step uses with the Triton kernel) against `paged.stable_topk`
    (stable descending sort) on the same device: the same picks, row by row."""
    from glm5lib.kernels.topk import topk_indices, topk_select
    from glm5lib.vllm_plugin.paged import stable_topk

    g = torch.Generator(device="cpu").manual_seed(4)
    x = torch.randn(case.rows, case.n, generator=g)
    if case.distinct:
        x = torch.randint(-case.distinct // 2, case.distinct // 2, x.shape, generator=g).float()
        x[x == 0] = torch.where(torch.rand((x == 0).sum(), generator=g) < 0.5, -0.0, 0.0)
    lengths = torch.randint(case.n // 4, case.n + 1, (case.rows,), generator=g, dtype=torch.int32)
    lengths[0] = min(case.n, case.topk // 2)  # a row with fewer keys than top-k
    x[torch.arange(case.n)[None, :] >= lengths[:, None]] = float("-inf")
    xd, ld = x.to(device), lengths.to(device)
    got = topk_select(xd, case.topk, lengths=ld)
    ref = stable_topk(xd, case.topk)
    res = {"case": case.id, **asdict(case), "device": str(device), "same_picks": same_picks(got.cpu(), ref.cpu()),
           "ascending": bool(((got[:, 1:] > got[:, :-1]) | (got[:, 1:] < 0)).all())}
    res["ok"] = res["same_picks"] and res["ascending"]
    if repeats > 0 and device.type == "cuda":
        # each timed eager (as the indexer runs) and from a CUDA graph where it captures (GPU time alone);
        # `*_us` is the graph time when there is one, else the eager time
        for name, fn in (("select", lambda: topk_select(xd, case.topk, lengths=ld, out=got)),
                         ("stable_sort", lambda: stable_topk(xd, case.topk)),
                         ("torch_topk", lambda: topk_indices(xd, case.topk))):
            t = cuda_timings(fn, repeats)
            res[f"{name}_eager_us"] = t["eager_us"]
            if "graph_us" in t:
                res[f"{name}_graph_us"] = t["graph_us"]
            res[f"{name}_us"] = t.get("graph_us", t["eager_us"])
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5lib.serving.harness", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small cases (default on CPU)")
    ap.add_argument("--kernel", default="triton", choices=("triton", "naive"))
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 20 on CUDA, 0 on CPU)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--graphs", action="store_true",
                    help="a multi-layer decode step captured in a CUDA graph and replayed with new metadata, against "
                         "eager; per-layer graph / kernel / eager times; sparse_mla vs FlashMLA eager at batch 1 "
                         "(glm5lib.serving.graphs); with --json also writes the figure next to it (.png)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.kernel == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            print("error: set TRITON_INTERPRET=1 before Triton is imported to run on CPU", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter runs the kernel on CPU tensors
    tiny = args.tiny or device.type == "cpu"
    repeats = args.repeats if args.repeats is not None else (20 if device.type == "cuda" else 0)
    if args.graphs:
        return _graphs_main(device, repeats, tiny, args.json)
    results = []
    for case in tiny_cases() if tiny else glm5_cases():
        results.append(run_case(case, device, args.kernel, repeats))
        print(format_results({"results": results[-1:]}), flush=True)
    for case in indexer_cases(tiny):
        results.append(run_indexer_case(case, device, args.kernel))
        print(format_results({"results": results[-1:]}), flush=True)
    for case in step_cases(tiny):
        results.append(run_step_case(case, device, args.kernel, repeats))
        print(format_results({"results": results[-1:]}), flush=True)
    if args.kernel == "triton":
        for case in select_cases(tiny):
            results.append(run_select_case(case, device, repeats))
            print(format_results({"results": results[-1:]}), flush=True)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "commit": os.environ.get("GLM5LIB_COMMIT"), "results": results},
                      f, indent=1)
        os.replace(tmp, args.json)
    return 0 if all(r["ok"] for r in results) else 1


def _graphs_main(device: torch.device, repeats: int, tiny: bool, json_path: str | None) -> int:
    from glm5lib.serving import graphs

    def write(report: dict) -> None:  # after every case: a crash part-way keeps what was measured
        tmp = json_path + ".tmp"
        with open(tmp, "w") as f:  # the commit: GLM5LIB_COMMIT (a device copy of the checkout has no .git)
            json.dump({**report, "commit": os.environ.get("GLM5LIB_COMMIT")}, f, indent=1)
        os.replace(tmp, json_path)

    report = graphs.run(device, repeats, tiny, log=lambda line: print(line, flush=True),
                        checkpoint=write if json_path else None)
    print(json.dumps(report["summary"], indent=1))
    if json_path:
        write(report)
        if any("graph_us" in r for r in report["results"]):
            from glm5lib.plotting import save_figure

            save_figure(graphs.plot(report), os.path.splitext(json_path)[0] + ".png")
    return 0 if all(r.get("ok") for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
