"""Top-k selection of indexer scores in vLLM's convention (int32, -1 padded); fp32 twin: `naive.topk_ref`.

`torch.topk` does the selection (a Triton radix select is future work: at top-k 2048 over a 32K-128K row,
torch's select runs as its own kernel and `bench indexer` reports its time apart from the scores). This
wrapper adds what vLLM expects: -1 for picks whose score is -inf (masked or beyond the row's bounds),
`k` columns even when a row has fewer keys, and positions made request-local by subtracting `ks`.
"""

from __future__ import annotations

import torch


def topk_indices(logits: torch.Tensor, k: int = 2048, *, ks: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """int32 `[T, k]`: positions of the k largest finite scores of each row of `logits [T, N]`, -1 padded.

    `ks [T]` (ragged prefill): positions are returned relative to it (request-local). Order within a row is
    unspecified.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, N], got {tuple(logits.shape)}")
    T, n = logits.shape
    if out is None:
        out = torch.empty(T, k, dtype=torch.int32, device=logits.device)
    kk = min(k, n)
    if kk < k:
        out[:, kk:] = -1
    if T == 0 or kk == 0:
        return out
    vals, idx = torch.topk(logits, kk, dim=-1, sorted=False)
    idx = idx.to(torch.int32)
    if ks is not None:
        idx = idx - ks.to(torch.int32)[:, None]
    out[:, :kk] = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    return out


__all__ = ["topk_indices"]
