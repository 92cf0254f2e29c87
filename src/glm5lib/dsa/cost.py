"""What DSA costs per token: indexer vs sparse attention, FLOPs and bytes, prefill and decode (docs/glm5.md 2-3).

Per query token per layer at context L (keys visible), with k = min(index_topk, L):

    sparse MLA FLOPs   = 2 * H * k * (d_qk + d_v)          d_qk 576, d_v 512 (absorbed form)
    dense MLA FLOPs    = 2 * H * L * (d_qk + d_v)
    indexer FLOPs      = 2 * Hi * Di * L  +  2 * Hi * L     q.k for every index head, then the weighted head sum
    gathered KV bytes  = k * row_bytes                       row 1152 B (bf16 576) or 656 B (fp8_ds_mla)
    indexer key bytes  = L * key_bytes                       132 B (fp8 128 + fp32 scale) or 256 B (bf16)

The projections (q_b, wq_b, wk, weights_proj, o_proj...) do not depend on L and are left out: this model is
about how the two context-dependent parts scale. The indexer is linear in L, the sparse attention flat beyond
k, so they cross: at GLM-5 shapes near 35K tokens for FLOPs.

Prefill of N tokens sums the per-token costs over t = 1..N (causal: query t sees t keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from glm5lib.model.spec import GLM5Config

_G5 = GLM5Config.glm5()
# One absorbed-MLA cache row: bf16 [c_kv | k_rot]; fp8_ds_mla = e4m3 c_kv + one fp32 scale per 128 + bf16 k_rot.
KV_ROW_BYTES = {"bf16": 2 * _G5.mla_qk_dim,
                "fp8_ds_mla": _G5.kv_lora_rank + 4 * (_G5.kv_lora_rank // 128) + 2 * _G5.qk_rope_head_dim}
# One indexer key (vLLM: e4m3 + one fp32 scale).
INDEXER_KEY_BYTES = {"bf16": 2 * _G5.index_head_dim, "fp8": _G5.index_head_dim + 4}


@dataclass(frozen=True)
class CostShapes:
    """Defaults: GLM-5 with all 64 heads on one GPU."""

    heads: int = _G5.num_attention_heads
    topk: int = _G5.index_topk
    d_qk: int = _G5.mla_qk_dim
    d_v: int = _G5.kv_lora_rank
    index_heads: int = _G5.index_n_heads
    index_dim: int = _G5.index_head_dim

    @classmethod
    def from_config(cls, cfg: GLM5Config, *, heads: int | None = None) -> "CostShapes":
        """`heads`: attention heads on one GPU (64 / tensor-parallel degree); default all of them. The indexer
        keeps all its heads: vLLM replicates it on every rank (`wq_b` is a ReplicatedLinear, `wk` has TP off),
        so at 8 heads per GPU the crossover drops from ~35K to ~4.3K tokens."""
        return cls(heads=heads or cfg.num_attention_heads, topk=cfg.index_topk, d_qk=cfg.mla_qk_dim,
                   d_v=cfg.kv_lora_rank, index_heads=cfg.index_n_heads, index_dim=cfg.index_head_dim)


def _L(context) -> np.ndarray:
    return np.asarray(context, dtype=np.float64)


def sparse_attention_flops(context, s: CostShapes = CostShapes()) -> np.ndarray:
    return 2.0 * s.heads * np.minimum(_L(context), s.topk) * (s.d_qk + s.d_v)


def dense_attention_flops(context, s: CostShapes = CostShapes()) -> np.ndarray:
    return 2.0 * s.heads * _L(context) * (s.d_qk + s.d_v)


def indexer_flops(context, s: CostShapes = CostShapes()) -> np.ndarray:
    L = _L(context)
    return 2.0 * s.index_heads * s.index_dim * L + 2.0 * s.index_heads * L


def gathered_kv_bytes(context, s: CostShapes = CostShapes(), kv_format: str = "bf16") -> np.ndarray:
    """Bytes of cache rows the sparse attention reads for one query token (shared by all heads)."""
    return np.minimum(_L(context), s.topk) * KV_ROW_BYTES[kv_format]


def indexer_key_bytes(context, s: CostShapes = CostShapes(), key_format: str = "fp8") -> np.ndarray:
    """Bytes of indexer keys one query token scores (all L of them)."""
    return _L(context) * INDEXER_KEY_BYTES[key_format]


def flops_crossover(s: CostShapes = CostShapes()) -> float:
    """Context length where indexer FLOPs equal sparse-attention FLOPs (beyond top-k)."""
    return 2.0 * s.heads * s.topk * (s.d_qk + s.d_v) / (2.0 * s.index_heads * (s.index_dim + 1))


def bytes_crossover(s: CostShapes = CostShapes(), kv_format: str = "fp8_ds_mla", key_format: str = "fp8") -> float:
    """Context length where indexer key bytes equal gathered KV bytes (decode)."""
    return s.topk * KV_ROW_BYTES[kv_format] / INDEXER_KEY_BYTES[key_format]


def prefill_flops(n_tokens, s: CostShapes = CostShapes()) -> dict[str, np.ndarray]:
    """Total FLOPs of one layer for a prompt of N tokens: sums over t = 1..N (closed forms)."""
    N = _L(n_tokens)
    k = float(s.topk)
    tri = N * (N + 1) / 2  # sum of t
    capped = np.where(N <= k, tri, k * (k + 1) / 2 + (N - k) * k)  # sum of min(t, k)
    return {
        "indexer": 2.0 * s.index_heads * (s.index_dim + 1) * tri,
        "sparse_attention": 2.0 * s.heads * (s.d_qk + s.d_v) * capped,
        "dense_attention": 2.0 * s.heads * (s.d_qk + s.d_v) * tri,
    }


def cost_table(contexts, s: CostShapes = CostShapes()) -> dict[str, np.ndarray]:
    """Per-token decode costs for a list of context lengths (one layer)."""
    L = _L(contexts)
    return {
        "context": L,
        "indexer_flops": indexer_flops(L, s),
        "sparse_attention_flops": sparse_attention_flops(L, s),
        "dense_attention_flops": dense_attention_flops(L, s),
        "gathered_kv_bytes_bf16": gathered_kv_bytes(L, s, "bf16"),
        "gathered_kv_bytes_fp8": gathered_kv_bytes(L, s, "fp8_ds_mla"),
        "indexer_key_bytes_fp8": indexer_key_bytes(L, s, "fp8"),
    }
