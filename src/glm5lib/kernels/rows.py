"""Paged-cache row helpers the vLLM backend runs every layer, one Triton launch each, no host sync.

`physical_rows`: request-local top-k positions -> physical rows of a paged cache.

The sparse-MLA backend receives the indexer's request-local top-k (`[T, topk]`, -1 padded) and reads the cache
by physical row: `block_table[req, pos // block_size] * block_stride_rows + pos % block_size` (vLLM's
`triton_convert_req_index_to_global_index`). The plain-PyTorch twin, `glm5lib.vllm_plugin.paged.
local_to_physical_rows`, takes about 18 small launches; the backend runs this for every layer of every step,
so on CUDA the conversion is this one kernel. Invalid positions (-1, or past the block table) give -1.

`write_indexer_rows`: quantized indexer keys into the block-split fp8 cache, skipping padding slots;
`quantize_write_indexer_keys` quantizes in the same launch (sm_89+).
"""

from __future__ import annotations

import torch

from glm5lib.kernels import common  # before triton: interpreter switch
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _physical_rows_kernel(REQ, BT, LOCAL, OUT, stride_bt, stride_lt, stride_ot, TOPK, MAX_BLOCKS, BLOCK_SIZE,
                          STRIDE_ROWS, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    inside = offs < TOPK
    pos = tl.load(LOCAL + t.to(tl.int64) * stride_lt + offs, mask=inside, other=-1)
    req = tl.load(REQ + t)
    col = pos // BLOCK_SIZE
    valid = (pos >= 0) & (col < MAX_BLOCKS)
    blk = tl.load(BT + req.to(tl.int64) * stride_bt + col, mask=valid & inside, other=0)
    row = blk.to(tl.int64) * STRIDE_ROWS + pos % BLOCK_SIZE
    tl.store(OUT + t.to(tl.int64) * stride_ot + offs, tl.where(valid, row, -1).to(tl.int32), mask=inside)


_ROWS = common.Prebound(_physical_rows_kernel)


def physical_rows(req_id: torch.Tensor, block_table: torch.Tensor, topk_local: torch.Tensor, block_size: int,
                  block_stride_rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """int32 `[T, topk]` physical rows (see the module docstring); same contract as the PyTorch twin."""
    T, topk = topk_local.shape
    if req_id.shape[0] < T:
        raise ValueError(f"req_id has {req_id.shape[0]} entries for {T} tokens")
    if topk_local.dtype != torch.int32 or block_table.dtype != torch.int32:
        raise ValueError(f"top-k and block table must be int32, got {topk_local.dtype} and {block_table.dtype}")
    if out is None:
        out = torch.empty(T, topk, dtype=torch.int32, device=topk_local.device)
    if T == 0 or topk == 0:
        return out
    if topk_local.stride(-1) != 1:
        topk_local = topk_local.contiguous()
    if block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    req_id = req_id.to(torch.int32)
    block_k = min(1024, triton.next_power_of_2(topk))
    _ROWS((T, triton.cdiv(topk, block_k)),
        req_id, block_table, topk_local, out, block_table.stride(0), topk_local.stride(0), out.stride(0),
        topk, block_table.shape[1], block_size, block_stride_rows, BLOCK_K=block_k, num_warps=4,
    )
    return out


@triton.jit
def _write_indexer_rows_kernel(SRC, SLOT, CACHE, stride_src, stride_blk, BLOCK_SIZE,
                               D: tl.constexpr, SB: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(SLOT + t).to(tl.int64)
    if slot >= 0:  # -1: a padding token, nothing to store
        base = CACHE + (slot // BLOCK_SIZE) * stride_blk
        off = slot % BLOCK_SIZE
        d = tl.arange(0, D)
        tl.store(base + off * D + d, tl.load(SRC + t.to(tl.int64) * stride_src + d))
        s = tl.arange(0, SB)
        tl.store(base + BLOCK_SIZE * D + off * SB + s, tl.load(SRC + t.to(tl.int64) * stride_src + D + s))


def write_indexer_rows(kv_cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store quantized indexer rows `[T, 132]` (128 e4m3 bytes, 4 scale bytes) at `slot_mapping` (block * bs +
    offset; -1 skipped) of a paged cache in DeepGEMM's block-split layout (a block: bs * 128 value bytes, then
    bs * 4 scale bytes). One launch and no host sync: the PyTorch twin (`paged.write_indexer_keys` off CUDA) drops
    the -1 slots with a boolean mask, which waits for the GPU on every layer."""
    nb, bs, row = kv_cache.shape
    T = rows.shape[0]
    if rows.shape[-1] != row or rows.dtype != torch.uint8 or kv_cache.dtype != torch.uint8:
        raise ValueError(f"rows must be uint8 [T, {row}] like the cache, got {rows.dtype} {tuple(rows.shape)}")
    if T == 0:
        return
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    _write_indexer_rows_kernel[(T,)](rows, slot_mapping[:T].contiguous(), kv_cache, rows.stride(0),
                                     kv_cache.stride(0), bs, D=128, SB=row - 128, num_warps=1)


@triton.jit
def _quantize_write_indexer_kernel(K, SLOT, CACHE, stride_k, stride_blk, BLOCK_SIZE, D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(SLOT + t).to(tl.int64)
    if slot >= 0:
        x = tl.load(K + t.to(tl.int64) * stride_k + tl.arange(0, D)).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), 0), 1e-8) / 448.0  # naive.quantize_indexer_k, same fp32 steps
        base = CACHE + (slot // BLOCK_SIZE) * stride_blk
        off = slot % BLOCK_SIZE
        tl.store(base + off * D + tl.arange(0, D), (x / scale).to(tl.float8e4nv).to(tl.uint8, bitcast=True))
        tl.store((base + BLOCK_SIZE * D + off * 4).to(tl.pointer_type(tl.float32)), scale)


_QWRITE = common.Prebound(_quantize_write_indexer_kernel)


def quantize_write_indexer_keys(kv_cache: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """`naive.quantize_indexer_k` and `write_indexer_rows` in one launch: keys `[T, 128]` -> e4m3 + fp32 scale at
    `slot_mapping` (-1 skipped). Needs the hardware e4m3 conversion (sm_89+): the same rounding as PyTorch's
    cast, so the same bytes (checked on the H200 by the vLLM harness)."""
    nb, bs, row = kv_cache.shape
    T = k.shape[0]
    if k.shape[-1] != 128 or row != 132 or kv_cache.dtype != torch.uint8:
        raise ValueError(f"keys [T, 128] into a uint8 [.., {bs}, 132] cache, got {tuple(k.shape)} and {tuple(kv_cache.shape)}")
    if kv_cache.stride(0) % 4:
        raise ValueError("the cache's block stride must be a whole number of 4-byte words (fp32 scales)")
    if T == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    _QWRITE((T,), k, slot_mapping[:T].contiguous(), kv_cache, k.stride(0), kv_cache.stride(0),
                                         bs, D=128, num_warps=1)


__all__ = ["physical_rows", "write_indexer_rows", "quantize_write_indexer_keys"]
