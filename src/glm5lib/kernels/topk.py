"""Top-k selection of indexer scores in vLLM's convention (int32, -1 padded); fp32 twin: `naive.topk_ref`.

Two selections with the same contract (-1 for picks whose score is -inf, i.e. masked or beyond the row's
bounds; `k` columns even when a row has fewer keys; positions made request-local by subtracting `ks`):

- `topk_indices`: `torch.topk`. Ties at the cut are broken in an order that depends on the row length.
- `topk_select`: a Triton radix select, one program per row. Scores become order-preserving 32-bit keys;
  four passes of an 8-bit histogram (`tl.histogram`) find the k-th largest key exactly, and a last pass writes
  every position above it plus the earliest positions equal to it, in ascending position order. The picked
  set is the one a stable descending sort would give (`paged.stable_topk`, the reference forward's
  tie-break: exact ties, common where ReLU zeroes whole rows, go to the earlier key), so it does not depend on
  how long the row is or what else is in the batch. Per-row `lengths` (read on the device) bound each row,
  so a fixed-shape launch serves any batch: nothing waits on the host.

torch.topk takes several launches (its eager time is 2-5x its CUDA-graph time at 9K-32K keys in
`outputs/bench/vllm_harness_h200.json`) and leaves the tie order unspecified; a stable descending sort of the
whole row costs more still.
"""

from __future__ import annotations

import torch

from glm5lib.kernels import common  # before triton: interpreter switch
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

NEG_INF_KEY = tl.constexpr(0x007FFFFF)  # the ordered key of -inf: keys at or below it are not candidates


@triton.jit
def _ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (negatives flipped, positives' sign bit set).
    -0.0 becomes +0.0 first: they compare equal (and tie) as floats; w * relu(.) = -0.0 for negative w."""
    bits = tl.where(x == 0.0, 0, x.to(tl.uint32, bitcast=True))
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


@triton.jit
def _topk_select_kernel(X, LEN, KS, OUT, stride_x, stride_o, N, K,
                        HAS_LEN: tl.constexpr, HAS_KS: tl.constexpr, BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr,
                        DIGIT: tl.constexpr):
    t = tl.program_id(0)
    row = X + t.to(tl.int64) * stride_x
    out = OUT + t.to(tl.int64) * stride_o
    n = N
    if HAS_LEN:
        n = tl.minimum(tl.load(LEN + t), N)
    offs0 = tl.arange(0, BLOCK)
    bins = tl.arange(0, 1 << DIGIT)
    # --- the k-th largest key, DIGIT bits at a time (most significant first) ---
    prefix = tl.zeros([], tl.uint32)
    remaining = K  # how many of the keys that match `prefix` are still to be taken
    n_valid = 0
    for r in tl.static_range((32 + DIGIT - 1) // DIGIT):
        hi = 32 - DIGIT * r  # bits above `hi` are settled in `prefix`
        shift = hi - DIGIT if hi > DIGIT else 0
        hist = tl.zeros([1 << DIGIT], tl.int32)
        for start in range(0, n, BLOCK):
            offs = start + offs0
            key = _ordered_key(tl.load(row + offs, mask=offs < n, other=float("-inf")))
            match = (offs < n) & (key > NEG_INF_KEY)
            if r > 0:
                match = match & ((key >> hi) == (prefix >> hi))
            hist += tl.histogram(((key >> shift) & ((1 << DIGIT) - 1)).to(tl.int32), 1 << DIGIT, mask=match)
        if r == 0:
            n_valid = tl.sum(hist, 0)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys whose digit is >= b
        b = tl.max(tl.where(at_least >= remaining, bins, 0), 0)
        remaining -= tl.sum(tl.where(bins == b, at_least - hist, 0), 0)  # minus those strictly above bin b
        prefix = prefix | (b.to(tl.uint32) << shift)
    take_all = n_valid <= K  # fewer candidates than k: every finite score is picked
    # --- write: above the threshold, then the earliest `remaining` equal to it, in position order ---
    base = 0
    if HAS_KS:
        base = tl.load(KS + t)
    written = 0
    equal_seen = 0
    for start in range(0, n, BLOCK):
        offs = start + offs0
        key = _ordered_key(tl.load(row + offs, mask=offs < n, other=float("-inf")))
        valid = (offs < n) & (key > NEG_INF_KEY)
        equal = valid & (key == prefix)
        eq_rank = equal_seen + tl.cumsum(equal.to(tl.int32), 0)
        take = valid & ((key > prefix) | (equal & (eq_rank <= remaining)))
        take = tl.where(take_all, valid, take)
        slot = written + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(out + slot, (offs - base).to(tl.int32), mask=take)
        written += tl.sum(take.to(tl.int32), 0)
        equal_seen += tl.sum(equal.to(tl.int32), 0)
    for start in range(0, K, OUT_BLOCK):
        o = start + tl.arange(0, OUT_BLOCK)
        tl.store(out + o, tl.full([OUT_BLOCK], -1, tl.int32), mask=(o >= written) & (o < K))


# (BLOCK, num_warps, DIGIT bits per radix pass). H200 sweep (top-k 2048, do_bench per call, host launch cost
# included): 64 x 9000 rows 56 us against torch.topk 232; 128 x 32K 124 against 158; 64 x 128K 488 against 186;
# 4096 x 32K 2.8 ms against 1.8 ms. 11-bit digits ran 4-8x slower (a histogram's cost grows with its bins), 4-bit
# digits no faster. GPU time alone (CUDA graphs, vllm_harness_h200.json): 51 us against 64 at 9K keys, 119 against
# 109 at 32K, 473 against 156 at 128K: most of torch.topk's cost at short rows is its launches.
SELECT_CONFIG = (4096, 8, 8)
SELECT_MAX_N = 32768  # past this row length torch.topk is faster (one program per row runs out of parallelism)


_SELECT = common.Prebound(_topk_select_kernel)


def topk_select(logits: torch.Tensor, k: int = 2048, *, lengths: torch.Tensor | None = None,
                ks: torch.Tensor | None = None, out: torch.Tensor | None = None,
                config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """int32 `[T, k]`: positions of the k largest finite scores of each row of fp32 `logits [T, N]`, ties at
    the cut to the earlier position, ascending position order, -1 padded.

    `lengths [T]` (int32, on the device): row t is read up to `lengths[t]` (positions beyond are not scores:
    the paged indexer's rows past a request's context). `ks [T]`: positions returned relative to it.
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be fp32 [T, N], got {logits.dtype} {tuple(logits.shape)}")
    T, n = logits.shape
    if out is None:
        out = torch.empty(T, k, dtype=torch.int32, device=logits.device)
    elif out.shape[0] < T or out.shape[1] < k or out.dtype != torch.int32 or out.stride(-1) != 1:
        raise ValueError(f"out must be int32 with at least [{T}, {k}] and contiguous rows, got {out.dtype} {tuple(out.shape)}")
    if T == 0 or k == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    block, num_warps, digit = SELECT_CONFIG if config is None else config
    dummy = out  # an unused pointer argument when a flag is off
    lens = lengths.to(torch.int32).contiguous() if lengths is not None else dummy
    ks_ = ks.to(torch.int32).contiguous() if ks is not None else dummy
    _SELECT((T,),
        logits, lens, ks_, out, logits.stride(0), out.stride(0), n, k,
        HAS_LEN=lengths is not None, HAS_KS=ks is not None, BLOCK=block, OUT_BLOCK=1024, DIGIT=digit,
        num_warps=num_warps,
    )
    return out


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


def topk_fast(logits: torch.Tensor, k: int = 2048, *, lengths: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """The faster of the two on the H200 for this row length: `topk_select` up to `SELECT_MAX_N` columns (ties to
    the earlier position), `topk_indices` beyond (torch.topk's tie order). Both -1 pad; neither waits on the host."""
    if logits.shape[-1] <= SELECT_MAX_N:
        return topk_select(logits, k, lengths=lengths, out=out)
    return topk_indices(logits, k, out=out)


__all__ = ["topk_indices", "topk_select", "topk_fast"]
