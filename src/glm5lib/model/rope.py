"""Rotary position embedding as GLM-5 uses it: default RoPE (no YaRN), pairs rotated "interleaved".

Two layouts of the same rotation, differing only in which dimensions form a pair:
- interleaved (GLM-5 attention and indexer, DeepSeek's MLA): pairs (x0, x1), (x2, x3), ...
- neox (half-split, DeepSeek-V3.2's *indexer*): pairs (x0, x32), (x1, x33), ... for a 64-wide rope part.

Applying the wrong one to weights trained with the other is the #1 GLM-5 port bug (docs/glm5.md section 3).

`apply_rope(..., "interleaved")` writes its result de-interleaved (evens then odds), exactly as transformers'
`apply_rotary_pos_emb_interleave` does, so the reference matches it bit for bit; dot products between q and k
are the same either way as long as both sides use the same function.
"""

from __future__ import annotations

from typing import Literal

import torch

RopeLayout = Literal["interleaved", "neox"]
ROPE_LAYOUTS: tuple[str, ...] = ("interleaved", "neox")


def inv_freq(dim: int, theta: float) -> torch.Tensor:
    """[dim/2] inverse frequencies, computed as transformers computes them (float32)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [T, dim/2], for integer positions [T]."""
    freqs = positions.float()[:, None] * inv_freq(dim, theta)[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: RopeLayout = "interleaved") -> torch.Tensor:
    """Rotate x [T, ..., dim] by position. cos/sin [T, dim/2] broadcast over the middle (head) axes."""
    extra = x.dim() - 2
    cos = cos.reshape(cos.shape[0], *([1] * extra), cos.shape[-1])
    sin = sin.reshape(sin.shape[0], *([1] * extra), sin.shape[-1])
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
    elif layout == "neox":
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
    else:
        raise ValueError(f"unknown RoPE layout {layout!r}; expected one of {ROPE_LAYOUTS}")
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def deinterleave_permutation(dim: int) -> torch.Tensor:
    """perm with x[perm] = (x0, x2, x4, ..., x1, x3, ...): NeoX RoPE on x[perm] equals interleaved RoPE on x
    (both write the rotated pairs in that order), so weights trained with one layout can be converted to the
    other by permuting the rows that produce the rope dims."""
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])
