"""Plain-PyTorch fp32 references for the sparse-MLA and DSA-indexer kernels, and the cache codecs.

Every Triton kernel in this package has its slow, obviously-correct twin here with the same signature
(fla's `naive.py` convention). The math is docs/glm5.md sections 2-3:

- sparse MLA (absorbed / MQA form): `out[t, h] = sum_s softmax_s(q[t, h] . kv[s] * sm_scale) kv[s, :d_v]`
  over the rows `s` named by `indices[t]`; `lse[t, h]` is the natural-log log-sum-exp of the logits.
  A row with no valid key gives zeros and lse = -inf.
- indexer: `score[t, s] = sum_h w[t, h] * relu(scale * q[t, h] . k[s])`, fp32, -inf outside the bounds.

Cache row layouts:
- `fp8_ds_mla` (656 bytes a row): bytes 0..511 e4m3 of c_kv[0:512]; bytes 512..527 four fp32 scales (one
  per 128 values, value = e4m3 * scale); bytes 528..655 the 64 bf16 rope values. This is FlashMLA's
  `V32_FP8Sparse` layout (FlashMLA `tests/quant.py`, `flash_mla_interface.py` docstring: "First 512
  bytes ... Next 16 bytes: Scale factors, containing 4 float32 values ... Last 128 bytes: The RoPE part,
  64 bfloat16 values") and vLLM's `fp8_ds_mla` cache dtype.
- indexer fp8 keys (132 bytes a token): 128 e4m3 values and one fp32 scale. Ragged (prefill) caches are
  rows `[N, 132]` = values then scale. Paged (decode) caches use vLLM/DeepGEMM's block-split layout:
  `[num_blocks, block_size, 132]` whose block holds `block_size * 128` value bytes then `block_size * 4`
  scale bytes (vLLM `fp8_paged_mqa_logits_torch`: `kv_cache_flat[..., :block_size * dim]` values,
  `[..., block_size * dim:]` fp32 scales).

Physical row ids: a paged view `[num_blocks, block_size, row]` whose block stride is `k` rows (k >= block_size)
is addressed as flat rows `block * k + offset` (vLLM's `flat_kv_row_view`); see `kv_row_view`.
"""

from __future__ import annotations

import math

import torch

# The indexer key codec is model knowledge (the reference forward uses it too); re-exported here beside the
# kernels' other codecs.
from glm5lib.model.indexer import INDEXER_DIM, INDEXER_FP8_ROW_BYTES, dequantize_indexer_k, quantize_indexer_k
from glm5lib.model.metrics import cos_diff
from glm5lib.model.spec import GLM5Config

_GLM5 = GLM5Config.glm5()
D_NOPE = _GLM5.kv_lora_rank  # 512: latent width, also d_v of the absorbed attention
D_ROPE = _GLM5.qk_rope_head_dim  # 64
D_QK = _GLM5.mla_qk_dim  # 576: the cached row / absorbed q
FP8_DS_MLA_TILE = 128  # values per fp32 scale
FP8_DS_MLA_ROW_BYTES = D_NOPE + 4 * (D_NOPE // FP8_DS_MLA_TILE) + 2 * D_ROPE  # 656: e4m3, fp32 scales, bf16 rope
E4M3_MAX = 448.0

KV_FORMATS = ("bf16", "fp8_ds_mla")


# --------------------------------------------------------------------------------------------------------------
# Cache views and codecs
# --------------------------------------------------------------------------------------------------------------


def kv_row_geometry(kv_cache: torch.Tensor) -> tuple[int, int]:
    """(row stride in elements, number of addressable rows) of `[N, row]` or a paged view, without building a view
    (the kernels read rows as `base + row * stride`; this runs on every eager layer call).

    A paged view `[num_blocks, block_size, (1,) row]` may have a block stride of `k >= block_size` rows
    (vLLM pads blocks); physical row `block * k + offset` then addresses the flat storage. Rows past the
    last block's `block_size` are outside the view and count as invalid.
    """
    shape, strides = kv_cache.shape, kv_cache.stride()
    if len(shape) == 4:  # [num_blocks, block_size, 1, row] (FlashMLA's h_k = 1 axis)
        if shape[2] != 1:
            raise ValueError(f"paged kv cache must have one kv head, got shape {tuple(shape)}")
        shape, strides = (shape[0], shape[1], shape[3]), (strides[0], strides[1], strides[3])
    if len(shape) == 2:
        if strides[1] != 1:
            raise ValueError("kv cache rows must be contiguous")
        return strides[0], shape[0]
    if len(shape) != 3:
        raise ValueError(f"kv cache must be [N, row] or [num_blocks, block_size, row], got {tuple(kv_cache.shape)}")
    nb, bs, row = shape
    s0, s1, s2 = strides
    if s2 != 1 or s1 < row or s0 % s1 != 0 or s0 < bs * s1:
        raise ValueError(f"paged kv cache strides {tuple(kv_cache.stride())} are not whole rows per block")
    return s1, ((nb - 1) * (s0 // s1) + bs if nb > 0 else 0)


def kv_row_view(kv_cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(flat 2-D view over the cache's rows, number of addressable rows): `kv_row_geometry` as a tensor."""
    stride, n_rows = kv_row_geometry(kv_cache)
    return torch.as_strided(kv_cache, (n_rows, kv_cache.shape[-1]), (stride, 1)), n_rows


def quantize_fp8_ds_mla(kv: torch.Tensor) -> torch.Tensor:
    """bf16/fp32 rows `[..., 576]` -> uint8 rows `[..., 656]` in the fp8_ds_mla layout.

    Scales are amax/448 rounded up to a power of two, as FlashMLA's `tests/quant.py` does (so the
    dequantized value e4m3 * scale is exact in bf16).
    """
    if kv.shape[-1] != D_QK:
        raise ValueError(f"expected rows of {D_QK}, got {kv.shape[-1]}")
    lead = kv.shape[:-1]
    x = kv.reshape(-1, D_QK)
    out = torch.empty(x.shape[0], FP8_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=kv.device)
    nope = x[:, :D_NOPE].float().view(-1, 4, FP8_DS_MLA_TILE)
    amax = nope.abs().amax(dim=-1) / E4M3_MAX
    scale = torch.pow(2.0, torch.clamp_min(amax, 1e-4).log2().ceil())  # [n, 4]
    q8 = (nope / scale[..., None]).to(torch.float8_e4m3fn).view(-1, D_NOPE)
    out[:, :D_NOPE] = q8.view(torch.uint8)
    out[:, D_NOPE : D_NOPE + 16] = scale.float().contiguous().view(torch.uint8).view(-1, 16)
    out[:, D_NOPE + 16 :] = x[:, D_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8).view(-1, 2 * D_ROPE)
    return out.view(*lead, FP8_DS_MLA_ROW_BYTES)


def dequantize_fp8_ds_mla(rows: torch.Tensor) -> torch.Tensor:
    """uint8 rows `[..., 656]` -> fp32 `[..., 576]` (e4m3 * per-128 scale | bf16 rope)."""
    if rows.shape[-1] != FP8_DS_MLA_ROW_BYTES or rows.dtype != torch.uint8:
        raise ValueError(f"expected uint8 rows of {FP8_DS_MLA_ROW_BYTES} bytes, got {rows.dtype} {tuple(rows.shape)}")
    lead = rows.shape[:-1]
    r = rows.reshape(-1, FP8_DS_MLA_ROW_BYTES).contiguous()
    nope = r[:, :D_NOPE].view(torch.float8_e4m3fn).float().view(-1, 4, FP8_DS_MLA_TILE)
    scale = r[:, D_NOPE : D_NOPE + 16].contiguous().view(torch.float32)  # [n, 4]
    rope = r[:, D_NOPE + 16 :].contiguous().view(torch.bfloat16).float()
    out = torch.cat([(nope * scale[..., None]).view(-1, D_NOPE), rope], dim=-1)
    return out.view(*lead, D_QK)


def quantize_indexer_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer queries `[T, H, 128]` -> (float8_e4m3fn `[T, H, 128]`, fp32 scale `[T, H]`), one scale per
    (token, head) = amax / 448.

    The scale is positive, so it folds into the head weights: `indexer_logits(q8, k, w * scale)` scores like
    `indexer_logits(q, k, w)` up to e4m3 rounding of q (relu(s x) = s relu(x) for s > 0), and the kernel's dot is
    fp8 x fp8 on fp8 keys.
    """
    scale = q.float().abs().amax(-1).clamp_min(1e-8) / E4M3_MAX
    return (q.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def pack_indexer_cache_paged(rows: torch.Tensor, block_size: int) -> torch.Tensor:
    """Ragged fp8 rows `[N, 132]` -> vLLM's block-split paged cache `[ceil(N/bs), bs, 132]` (block b = rows b*bs..)."""
    n = rows.shape[0]
    nb = max(1, math.ceil(n / block_size))
    padded = torch.zeros(nb * block_size, INDEXER_FP8_ROW_BYTES, dtype=torch.uint8, device=rows.device)
    padded[:n] = rows
    padded = padded.view(nb, block_size, INDEXER_FP8_ROW_BYTES)
    out = torch.empty(nb, block_size * INDEXER_FP8_ROW_BYTES, dtype=torch.uint8, device=rows.device)
    out[:, : block_size * INDEXER_DIM] = padded[:, :, :INDEXER_DIM].reshape(nb, -1)
    out[:, block_size * INDEXER_DIM :] = padded[:, :, INDEXER_DIM:].reshape(nb, -1)
    return out.view(nb, block_size, INDEXER_FP8_ROW_BYTES)


def unpack_indexer_cache_paged(cache: torch.Tensor) -> torch.Tensor:
    """vLLM's block-split paged fp8 cache `[nb, bs, 132]` -> fp32 keys `[nb * bs, 128]` in physical order."""
    nb, bs, _ = cache.shape
    flat = cache.reshape(nb, bs * INDEXER_FP8_ROW_BYTES)
    vals = flat[:, : bs * INDEXER_DIM].contiguous().view(torch.float8_e4m3fn).float().view(nb * bs, INDEXER_DIM)
    scale = flat[:, bs * INDEXER_DIM :].contiguous().view(torch.float32).reshape(nb * bs)
    return vals * scale[:, None]


# --------------------------------------------------------------------------------------------------------------
# Sparse MLA reference
# --------------------------------------------------------------------------------------------------------------


def _kv_rows_fp32(kv_cache: torch.Tensor, kv_format: str) -> tuple[torch.Tensor, int]:
    flat, n_rows = kv_row_view(kv_cache)
    if kv_format == "fp8_ds_mla":
        return dequantize_fp8_ds_mla(flat), n_rows
    if kv_format in ("bf16", "fp16", "fp32"):
        return flat.float(), n_rows
    raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv_format!r}")


def sparse_mla_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    d_v: int = D_NOPE,
    kv_format: str = "bf16",
    block_size: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 sparse MLA: `q [T, H, 576]`, cache rows, `indices [T, topk]` -> `(out [T, H, d_v] fp32, lse [T, H])`.

    Duplicated indices count twice (a plain gather), as in FlashMLA's reference.
    """
    del block_size  # the reference reads any view through kv_row_view
    kv, n_rows = _kv_rows_fp32(kv_cache, kv_format)
    idx = indices.long()
    valid = (idx >= 0) & (idx < n_rows)  # [T, K]
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    k = kv[safe]  # [T, K, 576]
    logits = torch.einsum("thd,tkd->thk", q.float(), k) * sm_scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [T, H], -inf when no valid key
    p = torch.exp(logits - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    o = torch.einsum("thk,tkd->thd", p, k[..., :d_v])
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


def sparse_mla_ref_chunked(q, kv_cache, indices, sm_scale, *, d_v=D_NOPE, kv_format="bf16", chunk=256):
    """`sparse_mla_ref` in token chunks, each over only the cache rows its indices name (gathered, then widened to
    fp32; the same rows in the same order of the sum, so the same result on a finite cache), so that references at
    real sizes fit in memory: a decode of 512 requests of 32K tokens has a cache of 16.7M rows, 38 GB in fp32. (An
    invalid index reads no row here; the whole reference gathers row 0 for it and masks the logit, so a non-finite
    row 0 makes its output NaN where this one's is not.)"""
    flat, n_rows = kv_row_view(kv_cache)
    outs, lses = [], []
    for s in range(0, q.shape[0], chunk):
        idx = indices[s : s + chunk].long()
        valid = (idx >= 0) & (idx < n_rows)
        rows, local = torch.unique(idx[valid], return_inverse=True)
        sub = torch.full_like(idx, -1)  # invalid stays invalid: -1 is masked by the reference
        sub[valid] = local
        if rows.numel() == 0:  # no valid key in the chunk: one row to gather from, every index masked
            rows = torch.zeros(1, dtype=torch.long, device=idx.device)
        o, l = sparse_mla_ref(q[s : s + chunk], flat[rows], sub, sm_scale, d_v=d_v, kv_format=kv_format)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


# --------------------------------------------------------------------------------------------------------------
# Indexer reference
# --------------------------------------------------------------------------------------------------------------


def indexer_keys_fp32(k_cache: torch.Tensor, k_format: str, paged: bool) -> torch.Tensor:
    """Indexer cache -> fp32 keys `[rows, 128]` in physical row order."""
    if k_format == "fp8":
        if paged:
            return unpack_indexer_cache_paged(k_cache)
        return dequantize_indexer_k(k_cache)
    if k_format in ("bf16", "fp16", "fp32"):
        return k_cache.reshape(-1, INDEXER_DIM).float()
    raise ValueError(f"k_format must be 'bf16' or 'fp8', got {k_format!r}")


def indexer_logits_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    weights: torch.Tensor,
    *,
    scale: float = 1.0,
    k_format: str = "bf16",
    ks: torch.Tensor | None = None,
    ke: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    context_lens: torch.Tensor | None = None,
    next_n: int = 1,
    max_len: int | None = None,
) -> torch.Tensor:
    """fp32 indexer scores `score[t, s] = sum_h w[t, h] * relu(scale * q[t, h] . k[s])`, -inf where masked.

    Ragged (prefill): `k_cache` holds rows `[N, 128]` (or fp8 `[N, 132]`); query t sees rows `ks[t] <= s < ke[t]`
    (ks defaults to 0, ke to N); out `[T, N]`.
    Paged (decode): `block_table [B, max_blocks]`, `context_lens [B]`, T = B * next_n queries; query
    `b * next_n + i` sees request positions `j <= context_lens[b] - next_n + i`; out `[T, max_len]`.
    """
    paged = block_table is not None
    keys = indexer_keys_fp32(k_cache, k_format, paged)
    qf, wf = q.float(), weights.float()
    T = q.shape[0]
    if not paged:
        n = keys.shape[0]
        s = torch.relu(torch.einsum("thd,nd->thn", qf, keys) * scale)
        logits = torch.einsum("thn,th->tn", s, wf)
        pos = torch.arange(n, device=q.device)
        lo = ks.long()[:, None] if ks is not None else torch.zeros(T, 1, dtype=torch.long, device=q.device)
        hi = ke.long()[:, None] if ke is not None else torch.full((T, 1), n, dtype=torch.long, device=q.device)
        return logits.masked_fill(~((pos >= lo) & (pos < hi)), float("-inf"))
    bs = k_cache.shape[1]
    if max_len is None:
        max_len = block_table.shape[1] * bs
    out = torch.full((T, max_len), float("-inf"), dtype=torch.float32, device=q.device)
    for t in range(T):
        b, i = divmod(t, next_n)
        last = int(context_lens[b]) - next_n + i  # this query's own position
        n_see = min(last + 1, max_len)
        if n_see <= 0:
            continue
        j = torch.arange(n_see, device=q.device)
        rows = block_table[b].long()[j // bs] * bs + j % bs
        s = torch.relu(qf[t] @ keys[rows].T * scale)  # [H, n]
        out[t, :n_see] = (wf[t][:, None] * s).sum(0)
    return out


def topk_ref(logits: torch.Tensor, k: int, *, ks: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM convention: int32 `[T, k]` positions of the k largest finite scores, -1 padded.

    Positions are relative to `ks[t]` when given (request-local for ragged prefill). Order within the k
    is unspecified; compare as sets.
    """
    T, n = logits.shape
    kk = min(k, n)
    vals, idx = torch.topk(logits, kk, dim=-1)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    if ks is not None:
        idx = torch.where(idx >= 0, idx - ks.long()[:, None], idx)
    out = torch.full((T, k), -1, dtype=torch.int32, device=logits.device)
    out[:, :kk] = idx.to(torch.int32)
    return out
