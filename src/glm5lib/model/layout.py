"""Layout transforms between HF checkpoint tensors and llama.cpp glm-dsa GGUF tensors (torch order).

kv_b_proj [H*(nope+v), kv_lora] viewed [H, nope+v, kv_lora]:
  attn_k_b = W_UK^T per head: [H, kv_lora, nope]   (ggml ne [nope, kv_lora, H])
  attn_v_b = W_UV per head:   [H, v, kv_lora]      (ggml ne [kv_lora, v, H])
These are slices and a transpose only, so the round trip is exact in any dtype.
"""

from __future__ import annotations

import torch

from glm5lib.model.spec import GLM5Config


def split_kv_b(kv_b: torch.Tensor, cfg: GLM5Config) -> tuple[torch.Tensor, torch.Tensor]:
    H, nope, v, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if tuple(kv_b.shape) != (H * (nope + v), r):
        raise ValueError(f"kv_b_proj has shape {tuple(kv_b.shape)}, expected {(H * (nope + v), r)}")
    per_head = kv_b.view(H, nope + v, r)
    k_b = per_head[:, :nope, :].transpose(1, 2).contiguous()
    v_b = per_head[:, nope:, :].contiguous()
    return k_b, v_b


def merge_kv_b(k_b: torch.Tensor, v_b: torch.Tensor, cfg: GLM5Config) -> torch.Tensor:
    H, nope, v, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if tuple(k_b.shape) != (H, r, nope):
        raise ValueError(f"attn_k_b has shape {tuple(k_b.shape)}, expected {(H, r, nope)}")
    if tuple(v_b.shape) != (H, v, r):
        raise ValueError(f"attn_v_b has shape {tuple(v_b.shape)}, expected {(H, v, r)}")
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(H * (nope + v), r).contiguous()
