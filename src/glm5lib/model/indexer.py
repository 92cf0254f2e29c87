"""The DSA lightning indexer in plain fp32 PyTorch (docs/glm5.md section 3), plus the fp8 key codec it is run with.

    score[t, s] = sum_h w[t, h] * relu(qi[t, h] . ki[s] * D^-0.5),   w = weights_proj(x) * H^-0.5
    topk[t]     = the min(index_topk, S) best s <= pos[t]

The score is computed with the same tensor shapes and op order as transformers' `GlmMoeDsaIndexer` so the two
agree bit for bit (then `topk` breaks ties identically). fp8: DeepSeek's reference and vLLM keep indexer keys
(and queries) as e4m3 with one fp32 scale per 128 values; DeepSeek rotates both by a 128-point Hadamard first,
which spreads outliers over the row so the per-row scale wastes less range.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

INDEXER_DIM = 128  # index_head_dim of every GLM-5-family model
INDEXER_FP8_ROW_BYTES = INDEXER_DIM + 4  # 128 e4m3 values, then one fp32 scale (vLLM's indexer cache row)
_E4M3_MAX = 448.0

Fp8Mode = Literal["e4m3", "e4m3_hadamard"]
FP8_MODES: tuple[str, ...] = ("e4m3", "e4m3_hadamard")


def hadamard(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Orthonormal n x n Hadamard matrix (Sylvester construction; n a power of two). H @ H.T = I."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(dtype)


def quantize_indexer_k(k: torch.Tensor) -> torch.Tensor:
    """Indexer keys `[N, 128]` -> uint8 rows `[N, 132]`: e4m3 values then one fp32 scale (amax/448)."""
    if k.shape[-1] != INDEXER_DIM:
        raise ValueError(f"expected indexer keys of {INDEXER_DIM}, got {k.shape[-1]}")
    x = k.float().reshape(-1, INDEXER_DIM)
    scale = torch.clamp_min(x.abs().amax(dim=-1), 1e-8) / _E4M3_MAX
    out = torch.empty(x.shape[0], INDEXER_FP8_ROW_BYTES, dtype=torch.uint8, device=k.device)
    out[:, :INDEXER_DIM] = (x / scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    out[:, INDEXER_DIM:] = scale.contiguous().view(torch.uint8).view(-1, 4)
    return out


def dequantize_indexer_k(rows: torch.Tensor) -> torch.Tensor:
    """uint8 rows `[N, 132]` -> fp32 keys `[N, 128]`."""
    r = rows.reshape(-1, INDEXER_FP8_ROW_BYTES).contiguous()
    vals = r[:, :INDEXER_DIM].view(torch.float8_e4m3fn).float()
    scale = r[:, INDEXER_DIM:].contiguous().view(torch.float32)
    return vals * scale


def fake_quant_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round x [..., 128] to e4m3 with one fp32 scale per row (amax / 448) through the same 132-byte row codec the
    kernels and vLLM's indexer cache use, returned dequantized in fp32."""
    return dequantize_indexer_k(quantize_indexer_k(x)).view(x.shape)


def quantize_indexer_qk(q: torch.Tensor, k: torch.Tensor, mode: Fp8Mode | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., D], k [..., D] as the fp8 indexer sees them (rotated back is unnecessary: H is orthogonal, so
    (Hq).(Hk) = q.k; we keep them rotated)."""
    if mode is None:
        return q, k
    if mode not in FP8_MODES:
        raise ValueError(f"unknown indexer fp8 mode {mode!r}; expected one of {FP8_MODES}")
    if mode == "e4m3_hadamard":
        h = hadamard(q.shape[-1])
        q, k = q.float() @ h, k.float() @ h
    return fake_quant_e4m3(q), fake_quant_e4m3(k)


def indexer_scores(qi: torch.Tensor, ki: torch.Tensor, weights: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """qi [T, H, D], ki [S, D], weights [T, H] (already times H^-0.5) -> index scores [T, S] (fp32, unmasked)."""
    # Same shapes as transformers: [1, T, H, D] @ [1, 1, D, S] -> [1, T, H, S]; [1, T, 1, H] @ that.
    scores = torch.matmul(qi.float()[None], ki.transpose(-1, -2).float()[None, None]) * softmax_scale
    scores = torch.relu(scores)
    return torch.matmul(weights.float()[None].unsqueeze(-2), scores).squeeze(-2)[0]


def causal_mask(q_pos: torch.Tensor, S: int) -> torch.Tensor:
    """[T, S] bool, True where key s may be seen by the query at position q_pos[t] (s <= pos)."""
    return torch.arange(S)[None, :] <= q_pos[:, None]


def select_topk(scores: torch.Tensor, allowed: torch.Tensor, k: int, *, tie_break: str = "stable") -> torch.Tensor:
    """Top-k key indices [T, min(k, S)] per query; positions not `allowed` score -inf. When a query sees fewer
    than k keys, some picks are disallowed keys: callers intersect the picks with `allowed`.

    Exact ties are common (ReLU makes every key whose q.k < 0 on all heads score exactly 0). `torch.topk`
    breaks them in an unspecified order that depends on S, so a query's picks could change when later keys
    exist: prefill + decode would then differ from a full forward. tie_break="stable" prefers the earlier
    key, which depends only on the visible keys. tie_break="torch" is `torch.topk`, as transformers does."""
    masked = scores.masked_fill(~allowed, float("-inf"))
    k = min(k, scores.shape[-1])
    if tie_break == "torch":
        return masked.topk(k, dim=-1).indices
    if tie_break != "stable":
        raise ValueError(f"tie_break must be 'stable' or 'torch', got {tie_break!r}")
    return torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :k]


def selection_mask(topk: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """[T, S] bool: key s was picked for query t and is visible to it."""
    picked = torch.zeros_like(allowed).scatter(-1, topk.long(), True)
    return picked & allowed
