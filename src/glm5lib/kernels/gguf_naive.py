"""fp32 twins of `glm5lib.kernels.gguf`: dequantize with gguf-py (`gguf.quants.dequantize`), then matmul / MoE.

Imports neither Triton nor the kernels (the CPU path and the tests' references use it).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf.quants import dequantize as _gguf_dequantize


def dequantize(w: torch.Tensor, qtype: int) -> torch.Tensor:
    """uint8 GGUF rows [..., row_bytes] -> fp32 [..., K] (on w's device)."""
    arr = _gguf_dequantize(w.detach().cpu().numpy(), int(qtype))
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).to(w.device)


def gguf_matmul_ref(x: torch.Tensor, w: torch.Tensor, qtype: int, n: int) -> torch.Tensor:
    """x @ dequantize(w)^T in fp32 -> [M, n] fp32."""
    wf = dequantize(w, qtype)
    assert wf.shape[0] == n
    return x.float() @ wf.T


def gguf_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, type13: int, type2: int, activation: str = "silu") -> torch.Tensor:
    """sum_slot topk_weights * (silu(x W_gate^T) * (x W_up^T)) W_down^T per token, in fp32 -> [M, K] fp32."""
    if activation != "silu":
        raise ValueError(f"activation {activation!r} not supported")
    xf = x.float()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    inter = w13.shape[1] // 2
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for t in range(x.shape[0]):
        for s in range(topk_ids.shape[1]):
            e = int(topk_ids[t, s])
            if e not in cache:
                cache[e] = (dequantize(w13[e], type13), dequantize(w2[e], type2))
            a, b = cache[e]
            h = a @ xf[t]
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(topk_weights[t, s]) * (b @ act)
    return out
