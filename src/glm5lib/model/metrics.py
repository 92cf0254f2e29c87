"""How far apart two tensors are, one definition for every comparison in glm5lib (kernels, mapping, serving)."""

from __future__ import annotations

import torch


def cos_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """FlashMLA's test metric `1 - 2 <a, b> / (|a|^2 + |b|^2)` in fp64 (0 for equal tensors, also when both are 0)."""
    a, b = a.double().flatten(), b.double().flatten()
    den = (a * a).sum() + (b * b).sum()
    if den == 0:
        return 0.0
    return float(1 - 2 * (a * b).sum() / den)
