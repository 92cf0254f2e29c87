"""Run GLM5_SPARSE_MLA's forward on vLLM-shaped inputs, against the fp32 reference (no vLLM needed).

    python -m glm5lib.vllm_plugin.harness                      # CUDA if present: GLM-5 sizes, Triton kernel
    python -m glm5lib.vllm_plugin.harness --device cpu --tiny  # CI: Triton interpreter, tiny sizes
    python -m glm5lib.vllm_plugin.harness --json out.json

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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch

from glm5lib.kernels.naive import D_QK, FP8_DS_MLA_ROW_BYTES, INDEXER_DIM, INDEXER_FP8_ROW_BYTES, cos_diff
from glm5lib.model.spec import GLM5Config

GLM5 = GLM5Config.glm5()


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
    if repeats > 0:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            sparse_mla_forward(q, cache, batch, topk, scale, case.kv_format, kernel)
        sync()
        us = (time.perf_counter() - t0) / repeats * 1e6
        T = q.shape[0]
        res["us"] = us
        res["tflops"] = sparse_mla_flops(T, case.heads, case.topk) / (us * 1e-6) / 1e12
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5lib.vllm_plugin.harness", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small cases (default on CPU)")
    ap.add_argument("--kernel", default="triton", choices=("triton", "naive"))
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 20 on CUDA, 0 on CPU)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.kernel == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            print("error: set TRITON_INTERPRET=1 before Triton is imported to run on CPU", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter runs the kernel on CPU tensors
    tiny = args.tiny or device.type == "cpu"
    repeats = args.repeats if args.repeats is not None else (20 if device.type == "cuda" else 0)
    results = []
    for case in tiny_cases() if tiny else glm5_cases():
        r = run_case(case, device, args.kernel, repeats)
        results.append(r)
        timing = f"  {r['us']:9.1f} us {r['tflops']:7.1f} TFLOP/s" if "us" in r else ""
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:<32} cos_diff {r['cos_diff']:.2e} "
              f"max_abs {r['max_abs_err']:.2e}{timing}", flush=True)
    for case in indexer_cases(tiny):
        r = run_indexer_case(case, device, args.kernel)
        results.append(r)
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:<32} top-k overlap {r['topk_overlap_min']:.4f}", flush=True)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "results": results}, f, indent=1)
        os.replace(tmp, args.json)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
