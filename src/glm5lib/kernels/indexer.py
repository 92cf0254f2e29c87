"""Triton DSA lightning-indexer scores (docs/glm5.md section 3); fp32 twin: `naive.indexer_logits_ref`.

`score[t, s] = sum_h w[t, h] * relu(scale * q[t, h] . k[s])` in fp32, -inf where key s is outside query t's
bounds. Two kernels behind one function:

- ragged (prefill): keys are rows `[N, 128]` (bf16) or `[N, 132]` uint8 (fp8 e4m3 + fp32 scale); query t sees
  `ks[t] <= s < ke[t]`. A program computes a `[BLOCK_M queries, BLOCK_N keys]` tile as a GEMM per index
  head (K = 128) with ReLU and the head weight folded into the epilogue, so the key tile is staged once for
  all heads and queries: the FLOPs (`2 T N Hi 128`) dominate and the tile is tensor-core bound.
- paged (decode): a vLLM paged cache (`[num_blocks, block_size, 128]` bf16, or fp8 in vLLM/DeepGEMM's
  block-split layout `[num_blocks, block_size, 132]`) read through a block table; query `b * next_n + i`
  sees positions `j <= context_lens[b] - next_n + i`. A program owns one query and `BLOCK_N` positions (or several
  such tiles: `PAGED_TILES`, and the looping grid of `row_bound_only`) and does `[Hi, 128] x [128, BLOCK_N]`
  (`[BLOCK_N, 128] x [128, Hi]` for fp8 q: `PAGED_KEYS_M`): every key byte is read once per query, a bandwidth
  problem. bf16 q over fp8 keys is rewritten first (`PAGED_Q_FORM`: fp16 scaled
  per head by a power of two, or two e4m3 terms): e4m3 widens to fp16 in one instruction per pair, to bf16 in
  several.

The fp8 per-token scale is positive, so `relu(x * s) = relu(x) * s`: the kernel applies it once after the
head sum instead of per head.
"""

from __future__ import annotations

import torch

from glm5lib.kernels.common import Prebound, capability, e4m3_bits_to, fp8_hw, num_sms  # before triton: interpreter
import triton  # noqa: E402  (after common, which sets the interpreter switch)
import triton.language as tl  # noqa: E402

from glm5lib.kernels.naive import INDEXER_DIM, INDEXER_FP8_ROW_BYTES

INDEXER_CONFIGS = {
    # name: (BLOCK_M, BLOCK_N, num_warps, num_stages); ragged uses M and N, paged uses N only
    "ragged": (64, 128, 8, 2),
    "paged": (0, 128, 4, 2),  # H200 sweep (round 6, fp8 keys, bf16 q, B=128, ctx 32K): 283 us against 334 for N=64
}
# row_bound_only launches (the CUDA-graph decode path, rows as wide as max_model_len): programs per SM in all.
# H200, ctx 32K in 128K-wide rows (outputs/bench/sweeps/indexer_loop_sweep_h200.json): at B 128, 32 per SM is
# within 1-13 % of the one-tile launch where 8 was 18-38 % behind (fp8 q 204 us against 250); at B 32 every count
# from 8 to 32 is within 1.5 % of each other.
PAGED_LOOP_PROGRAMS_PER_SM = 32
# Launches without `row_bound_only`: how many consecutive tiles a program scores (grid (T, cdiv(tiles, n))), q
# loaded once for all of them and the key loads pipelined by the compiler across them (`_indexer_paged_kernel`).
# H200, the shipped tile, B 128, ctx 32K (outputs/bench/sweeps/indexer_tiles_h200_1d31ed4.json; the earlier
# builds: indexer_tiles_h200_f593c87.json, a15190a.json): bf16 keys 8 tiles 284 us against 310 for one (83 -> 90 %
# of copy); over fp8 keys the shipped forms gain nothing: fp16 q 208 us at 4-8 tiles (1 stage, cap 96) against
# 208, fp8 q 166 (4 tiles, cap 80) against 165; two e4m3 terms 185 against 190. The H200 run of 6eaff6f
# (outputs/bench/bench_h200.json, its `indexer-decode-sweep` rows) again: two e4m3 terms, uncapped, 185.8 us at 4
# tiles and 185.1 at 8 against 191.5 at one; an H100 level (221.5 at 4, 220.6 at one;
# outputs/bench/sweeps/bench_h100_d1e47e4_gscales1.json). So the rule takes 8 for bf16 keys and 4 for q rewritten
# into two e4m3 terms on sm_90, with the tile it was timed with (`SM90_TIMED_TILE`, as the caps), and 1 elsewhere
# (`paged_tiles`); None: that rule; a number: that count.
PAGED_TILES: int | None = None
TILES_SM90 = {"bf16": 8, "e4m3x2": 4}  # by key format, or by q form where q is rewritten
# The paged kernel's dot layout. Keys as M (`[BLOCK_N, 128] x [128, Hi]`, the head sum along rows) when q is fp8:
# the fp8 MMA then takes the key tile as it sits in shared memory (K-contiguous) and only the small q tile as the
# transposed operand; so too when q is rewritten over fp8 keys (`PAGED_Q_FORM`) or is fp16 there (timed on sm_90,
# and on the H200 with sm_80's software e4m3; not on sm_89 / sm_120); heads as M (`[Hi, 128] x [128, BLOCK_N]`)
# otherwise. H200 sweeps (B 128, ctx 32K, fp8 keys): fp8 q 179 us keys-as-M against
# 202 us heads-as-M, bf16 q (its bf16 dot) 313 against 283 (outputs/bench/sweeps/indexer_sweep_v10d_h200.json);
# q rewritten into fp16 224 against 250, into two e4m3 terms 199 against 302 (outputs/bench/sweeps/
# indexer_forms_h200_af1202a.json; with software e4m3, sm_80's path, fp16 294 against 328:
# indexer_forms_swfp8_h200_d9ce336.json). None: that rule; True/False force one layout (`bench_indexer(sweep=True)`).
PAGED_KEYS_M: bool | None = None
# A register cap for the paged kernel (Triton's `maxnreg`). At 4 warps a program (registers are allocated 8 a
# thread at a time) the 65536 registers of an SM hold 4 programs at the 122 registers the fp16 q form takes, 5 at
# <= 96, 6 at <= 80 (fp8 q takes 90). H200, keys as M, the shipped tile, B 128, ctx 32K (outputs/bench/sweeps/
# indexer_maxnreg_h200_81217ca.json): fp16 q 226 -> 214 us at a cap of 96 (219 at 80), fp8 q 180 -> 171 us at 80
# (181 at 96), two e4m3 terms 200 -> 213 at 80 (200 at 96, not capped). So the rule caps those two on sm_90, for
# the tile they were timed with (`SM90_TIMED_TILE`), one tile a program (not several, not the looping grid); other
# GPUs and tiles are not measured and keep the compiler's choice.
# None: that rule (`paged_maxnreg`); 0: no cap; a number: that cap on every launch (`bench_indexer(sweep=True)`).
PAGED_MAXNREG: int | None = None
MAXNREG_SM90 = {"fp8": 80, "fp16": 96}
SM90_TIMED_TILE = (0, 128, 4, 2)  # `INDEXER_CONFIGS["paged"]` when the sm_90 caps and tile counts were timed


# bf16 q over fp8 keys (the paged kernel) is rewritten before it is scored: sm_89+ widens e4m3 to fp16 in one
# instruction per pair (`cvt.rn.f16x2.e4m3x2`) but has no direct e4m3 -> bf16, so a bf16 dot costs several
# conversions per key byte, and decode reads each key byte once per query: the conversions, not the bytes, set
# its pace (H200, B 128, ctx 32K: 47 % of copy scored as it is, 63 % rewritten into fp16 under the register cap,
# 79 % with fp8 q; outputs/bench/sweeps/bench_h200_413d3e3.json). PAGED_Q_FORM says into what:
# - "f16": a launch before the scores (`_q_prep_kernel`, one program per query) writes q times a power of two per
#   head in fp16 (`_rows_to_f16`; exact for bf16 values) and the weights times the inverse; the scores kernel then
#   takes that fp16 q as it is and widens the keys to fp16;
# - "f16-kernel": the same rescale inside every program of the scores kernel (a 128-wide max per head per tile);
# - "e4m3x2": the prepass writes q as two e4m3 terms per head under one power of two (`_rows_to_e4m3`: the second
#   is the first's rounding error, e4m3's exponent keeping it to 4 bits) and the inverse into the weight; the scores
#   kernel accumulates two fp8 dots on the keys' bytes as they are into one accumulator. The two terms hold a bf16
#   value's 8 significant bits unless it lies more than 2^14 below its head's largest (e4m3 subnormals): on the
#   interpreter (fp32 products) they score within 1e-5 of the bf16 dot. On sm_90 the fp8 products accumulate in
#   the tensor cores' own precision: within ~1.6e-4 there (H200 and H100, the bench's `rel_err`; vLLM's fp8 q, one
#   term, 8.8e-3). Over the decode benchmark's 128 rows the terms move 0.05 % of bf16 q's top-2048 picks, where
#   rounding an fp32 q to bf16 at all moves 0.15 % of its picks (scripts/indexer_form_topk.py --fp32-q, docs v44).
#   sm_89+ only (elsewhere "f16").
# PAGED_Q_FORM None is the rule (`q_form_rule`): "e4m3x2" on sm_90, where it was timed (H200 185.8 us at the rule's
# 4 tiles against 209.3 for "f16" under its cap, 73 against 65 % of copy; an H100 221.5 against 230.4), "f16"
# elsewhere (sm_89 / sm_120 not timed). "f16" keeps the scores those of the bf16 dot on every GPU.
# PAGED_Q_REWRITE: None is the rule (bf16 q over fp8 keys only); True / False force it for any non-fp8 q over fp8
# keys (tests run it on the interpreter's fp32 q; the benchmark sweep times every form). The ragged (prefill)
# kernel converts each key tile once for all heads and queries and keeps bf16.
PAGED_Q_REWRITE: bool | None = None
PAGED_Q_FORM: str | None = None
Q_FORM_SM90 = "e4m3x2"
Q_FORMS = ("f16", "f16-kernel", "e4m3x2")
REWRITTEN_DTYPE = {"f16": torch.float16, "e4m3x2": torch.float8_e4m3fn}  # the forms the prepass writes


def paged_keys_m(q_dtype: torch.dtype, k_format: str = "bf16", form: str | None = None) -> bool:
    """Whether the paged kernel puts the keys as the dot's M for queries of this dtype over keys of this format,
    q rewritten into `form` (`paged_q_form`) or not (see PAGED_KEYS_M)."""
    if PAGED_KEYS_M is not None:
        return PAGED_KEYS_M
    return q_dtype == torch.float8_e4m3fn or (k_format == "fp8" and (q_dtype == torch.float16 or form is not None))


def paged_q_form(q_dtype: torch.dtype, k_format: str, device: torch.device | None = None) -> str | None:
    """Into what the paged launch rewrites q of this dtype over keys of this format (a `Q_FORMS` entry, see
    PAGED_Q_FORM), or None: scored as it is. "e4m3x2" becomes "f16" on a device without hardware e4m3."""
    cap = capability(device) if device is not None and device.type == "cuda" else None
    return q_form_rule(q_dtype, k_format, device is None or fp8_hw(device), cap)


def q_form_rule(q_dtype: torch.dtype, k_format: str, e4m3_hw: bool, cap=None) -> str | None:
    """`paged_q_form`'s rule for a GPU of compute capability `cap` (None: not a GPU) with (or without) hardware
    e4m3."""
    if k_format != "fp8" or q_dtype == torch.float8_e4m3fn:
        return None
    if not (q_dtype == torch.bfloat16 if PAGED_Q_REWRITE is None else PAGED_Q_REWRITE):
        return None
    form = PAGED_Q_FORM if PAGED_Q_FORM is not None else (Q_FORM_SM90 if cap == (9, 0) else "f16")
    if form not in Q_FORMS:
        raise ValueError(f"indexer.PAGED_Q_FORM must be one of {Q_FORMS} or None, got {form!r}")
    return "f16" if form == "e4m3x2" and not e4m3_hw else form


def paged_tiles(k_format: str, device: torch.device, form: str | None = None) -> int:
    """Tiles a program of a paged launch without `row_bound_only` scores over keys of `k_format`, q rewritten into
    `form` (`paged_q_form`) or not (see PAGED_TILES)."""
    return tiles_for(k_format, capability(device) if device.type == "cuda" else None, form)


def tiles_for(k_format: str, cap, form: str | None = None) -> int:
    """`paged_tiles` for a GPU of compute capability `cap` (None: not a GPU): PAGED_TILES if set, else the rule."""
    if PAGED_TILES is not None:
        return max(1, int(PAGED_TILES))
    if cap != (9, 0) or tuple(INDEXER_CONFIGS["paged"]) != SM90_TIMED_TILE:
        return 1
    return TILES_SM90.get(form or k_format, 1)


def paged_maxnreg(q_dtype: torch.dtype, k_format: str, keys_m: bool, q_terms: int, loop: bool,
                  device: torch.device, tiles: int = 1) -> int | None:
    """The register cap of a paged launch (see PAGED_MAXNREG) for the q it launches with (after any rewrite), in
    the dot layout `keys_m`, with `q_terms` terms, on the looping grid or not, `tiles` a program; None: no cap."""
    if PAGED_MAXNREG is not None:
        return PAGED_MAXNREG or None
    cap = capability(device) if device.type == "cuda" else None
    return maxnreg_rule(q_dtype, k_format, keys_m, q_terms, loop, cap, tiles)


def maxnreg_rule(q_dtype: torch.dtype, k_format: str, keys_m: bool, q_terms: int, loop: bool, cap,
                 tiles: int = 1) -> int | None:
    """`paged_maxnreg`'s rule for a GPU of compute capability `cap` (None: not a GPU). Not on the looping grid
    (`row_bound_only`): there the caps spill (ptxas, Triton 3.6: 56 / 32 bytes of stack) and were not timed; not
    for several tiles a program (the same loop; timed under the caps in the sweeps only)."""
    if k_format != "fp8" or not keys_m or q_terms != 1 or loop or tiles != 1 or cap != (9, 0):
        return None
    if tuple(INDEXER_CONFIGS["paged"]) != SM90_TIMED_TILE:
        return None
    return MAXNREG_SM90.get({torch.float8_e4m3fn: "fp8", torch.float16: "fp16"}.get(q_dtype))


@triton.jit
def _pow2_rows(x, TOP: tl.constexpr):
    """(up, down = 1 / up) per row of fp32 `[R, D]`: `up` the power of two that puts the row's largest |x| in
    [2^TOP, 2^(TOP + 1)), at most 2^126 (zero or tiny rows) so that `down` stays normal. Built from the exponent
    bits, not `exp2` (an approximation)."""
    e = (tl.max(tl.abs(x), 1).to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent of the row's max
    up_e = tl.minimum(254 + TOP - e, 253)  # 2^(TOP - (e - 127))
    return (up_e << 23).to(tl.float32, bitcast=True), ((254 - up_e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _rows_to_f16(x):
    """`[R, D]` rows (bf16 / fp32) -> (fp16 rows `x * up`, `down = 1 / up` per row, fp32 `[R]`), `up` a power of two
    that puts the row's largest |x| in [2^14, 2^15) (at most 2^126, for zero or tiny rows). Powers of two scale
    exactly, and a bf16 value's 8 significant bits fit fp16's 11, so for bf16 rows the fp16 values are exact down
    to 2^-29 of the row's largest (fp16 subnormals below that): the dot then sums the same products as a bf16 dot
    (`_pow2_rows`)."""
    xf = x.to(tl.float32)
    up, down = _pow2_rows(xf, 14)
    return (xf * up[:, None]).to(tl.float16), down


@triton.jit
def _e4m3_rn(y):
    """fp32 -> the nearest e4m3 value (ties to even), as fp32 (|y| < 448). Rounded to e4m3's grid by hand: Triton's
    interpreter rounds fp32 -> e4m3 wrongly (126 -> 64, ties away from even), and the CI runs the interpreter; a
    value on the grid converts exactly everywhere. Normals (|y| >= 2^-6) keep 4 significant bits by integer
    rounding of the fp32 bits; subnormals are multiples of 2^-9, rounded by fp32 addition of 1.5 * 2^14 (whose ulp
    is 2^-9)."""
    b = y.to(tl.int32, bitcast=True)
    norm = ((b + 0x7FFFF + ((b >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    sub = (y + 24576.0) - 24576.0
    return tl.where(tl.abs(y) >= 0.015625, norm, sub)


@triton.jit
def _rows_to_e4m3(x):
    """`[R, D]` fp32 rows -> (two e4m3 terms `a`, `b` with `a + b ~= x * up`, `down = 1 / up` per row), `up` a
    power of two that puts the row's largest |x| in [2^7, 2^8) (under e4m3's 448; at most 2^126). `x * up - a` is
    exact in fp32 and `b` rounds it: e4m3's own exponent keeps 4 significant bits of each element's error
    (`_pow2_rows`)."""
    up, down = _pow2_rows(x, 7)
    y = x * up[:, None]
    a = _e4m3_rn(y)
    return a.to(tl.float8e4nv), _e4m3_rn(y - a).to(tl.float8e4nv), down


@triton.jit
def _q_prep_kernel(Q, W, QO, WO, stride_qt, stride_qh, stride_wt, stride_term, HI, BLOCK_HI: tl.constexpr,
                   D: tl.constexpr, TERMS: tl.constexpr):
    """Query t's heads rewritten for the scores kernel (`PAGED_Q_FORM`), outputs contiguous, and the weights times
    the inverse factors into WO `[T, HI]`. TERMS 0: fp16 q into QO `[T, HI, D]` (`_rows_to_f16`). TERMS 2: two e4m3
    terms into QO `[2, T, HI, D]` (`_rows_to_e4m3`), the second `stride_term = T * HI * D` elements after the first
    (from the host: 64-bit where it must be)."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_HI)
    offs_d = tl.arange(0, D)
    h_mask = offs_h < HI
    q = tl.load(Q + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    w = tl.load(W + t * stride_wt + offs_h, mask=h_mask, other=0.0)
    rows = (t * HI + offs_h)[:, None] * D + offs_d[None, :]
    if TERMS == 0:
        q16, down = _rows_to_f16(q)
        tl.store(QO + rows, q16, mask=h_mask[:, None])
    else:
        q1, q2, down = _rows_to_e4m3(q.to(tl.float32))
        tl.store(QO + rows, q1, mask=h_mask[:, None])
        tl.store(QO + stride_term + rows, q2, mask=h_mask[:, None])
    tl.store(WO + t * HI + offs_h, w * down, mask=h_mask)


_Q_PREP = Prebound(_q_prep_kernel)


def rewrite_q(q: torch.Tensor, weights: torch.Tensor, form: str):
    """(q', weights') that score as (q, weights) do, rewritten by the prepass for `form` ("f16" or "e4m3x2", see
    PAGED_Q_FORM): each head times a power of two, its inverse folded into that head's weight. "f16": fp16
    `[T, Hi, 128]` (exact for bf16 q). "e4m3x2": e4m3 `[2, T, Hi, 128]`, two terms to add. q `[T, Hi, 128]` with
    unit last stride, weights `[T, Hi]` fp32 contiguous."""
    T, HI, D = q.shape
    terms = 2 if form == "e4m3x2" else 0
    qo = torch.empty(*((2,) if terms else ()), T, HI, D, dtype=REWRITTEN_DTYPE[form], device=q.device)
    wo = torch.empty(T, HI, dtype=torch.float32, device=q.device)
    if T:
        _Q_PREP((T,), q, weights, qo, wo, q.stride(0), q.stride(1), weights.stride(0), T * HI * D, HI,
                BLOCK_HI=max(16, triton.next_power_of_2(HI)), D=D, TERMS=terms, num_warps=4)
    return qo, wo


@triton.jit
def _indexer_ragged_kernel(
    Q, K8, KF, W, KS, KE, OUT,
    stride_qt, stride_qh, stride_k, stride_wt, stride_ot,
    T, N, HI, scale,
    KV_FP8: tl.constexpr, FP8_HW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    m_mask = offs_m < T
    ks = tl.load(KS + offs_m, mask=m_mask, other=0)
    ke = tl.load(KE + offs_m, mask=m_mask, other=0)
    inside = (offs_n[None, :] >= ks[:, None]) & (offs_n[None, :] < ke[:, None]) & m_mask[:, None]
    # a tile no query of the block can see: write -inf only (causal prefill skips about half the tiles)
    lo = tl.min(tl.where(m_mask, ks, N), 0)
    hi = tl.max(tl.where(m_mask, ke, 0), 0)
    tile_live = (pid_n * BLOCK_N < hi) & (pid_n * BLOCK_N + BLOCK_N > lo)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    DOT_DTYPE: tl.constexpr = Q.dtype.element_ty
    if tile_live:
        n_mask = offs_n < N
        rows = tl.where(n_mask, offs_n, 0).to(tl.int64) * stride_k
        k = tl.load(K8 + rows[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0)
        if KV_FP8:
            k, f8 = e4m3_bits_to(k, DOT_DTYPE, FP8_HW)
        q_base = Q + offs_m.to(tl.int64)[:, None] * stride_qt + offs_d[None, :]
        for h in range(0, HI):
            qh = tl.load(q_base + h * stride_qh, mask=m_mask[:, None], other=0.0)
            wh = tl.load(W + offs_m * stride_wt + h, mask=m_mask, other=0.0)
            s = tl.dot(qh, tl.trans(k))
            acc += tl.maximum(s, 0.0) * wh[:, None]
        if KV_FP8:
            ksc = tl.load(KF + (rows + D) // 4, mask=n_mask, other=0.0)
            acc = acc * (ksc * (scale * f8))[None, :]
        else:
            acc = acc * scale
    out = tl.where(inside, acc, float("-inf"))
    o_mask = m_mask[:, None] & (offs_n[None, :] < N)
    tl.store(OUT + offs_m.to(tl.int64)[:, None] * stride_ot + offs_n[None, :], out, mask=o_mask)


@triton.jit
def _paged_q(Q, W, t, stride_qt, stride_qh, stride_qterm, stride_wt, HI, BLOCK_HI: tl.constexpr, D: tl.constexpr,
             F16_DOT: tl.constexpr, Q_TERMS: tl.constexpr):
    """Query t's (q, second term or q again, weights) as the paged dot takes them. F16_DOT: q rescaled per head into
    fp16 here ("f16-kernel"). Q_TERMS 2: the second e4m3 term lies `stride_qterm` elements after the first
    ("e4m3x2", `PAGED_Q_FORM`)."""
    offs_h = tl.arange(0, BLOCK_HI)
    offs_d = tl.arange(0, D)
    h_mask = offs_h < HI
    rows = t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + rows, mask=h_mask[:, None], other=0.0)
    w = tl.load(W + t.to(tl.int64) * stride_wt + offs_h, mask=h_mask, other=0.0)
    if F16_DOT:  # relu(down * x) = down * relu(x): the per-head factor joins the weight
        q, down = _rows_to_f16(q)
        w = w * down
    q2 = q
    if Q_TERMS == 2:  # the second term, accumulated with the first before the ReLU
        q2 = tl.load(Q + stride_qterm + rows, mask=h_mask[:, None], other=0.0)
    return q, q2, w


@triton.jit
def _paged_tile(q, q2, w, K8, KF, BT, OUT, t, b, last, tile, stride_bt, stride_ot, stride_blk, stride_val,
                scale_base, stride_sc, MAX_LEN, BLOCK_SIZE, scale, KV_FP8: tl.constexpr, FP8_HW: tl.constexpr,
                BLOCK_N: tl.constexpr, D: tl.constexpr, KEYS_M: tl.constexpr, DOT_DTYPE: tl.constexpr,
                Q_TERMS: tl.constexpr, SCALES_FIRST: tl.constexpr):
    """Scores of query t (`_paged_q`'s q, q2, w) against positions [tile * BLOCK_N, +BLOCK_N), a tile holding at
    least one position <= `last`: -inf past it. KEYS_M: the dot with the keys as M ([BLOCK_N, BLOCK_HI], the head
    sum along rows) instead of the heads (`paged_keys_m`). Q_TERMS 2: q + q2 into one dot. SCALES_FIRST: the key
    scales loaded with the keys (in flight through the dot; the tile loop), else after the dot, as the one-tile
    kernel was timed (H200: sending one tile a program through the tile loop with the scales first took the fp16
    form from 217 to 366 us, outputs/bench/sweeps/indexer_tiles_h200_f593c87.json; the two changes were not timed
    apart)."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    see = (offs_n <= last) & (offs_n < MAX_LEN)
    blk = tl.load(BT + b.to(tl.int64) * stride_bt + offs_n // BLOCK_SIZE, mask=see, other=0)
    base = blk.to(tl.int64) * stride_blk
    off = (offs_n % BLOCK_SIZE).to(tl.int64)
    k = tl.load(K8 + (base + off * stride_val)[:, None] + offs_d[None, :], mask=see[:, None], other=0)
    if KV_FP8:
        if SCALES_FIRST:
            ksc = tl.load(KF + (base + scale_base + off * stride_sc) // 4, mask=see, other=0.0)
        k, f8 = e4m3_bits_to(k, DOT_DTYPE, FP8_HW)
    if KEYS_M:
        s = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_HI]
        if Q_TERMS == 2:
            s = tl.dot(k, tl.trans(q2), s)
        acc = tl.sum(tl.maximum(s, 0.0) * w[None, :], 1)
    else:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_HI, BLOCK_N]
        if Q_TERMS == 2:
            s = tl.dot(q2, tl.trans(k), s)
        acc = tl.sum(tl.maximum(s, 0.0) * w[:, None], 0)
    if KV_FP8:
        if not SCALES_FIRST:
            ksc = tl.load(KF + (base + scale_base + off * stride_sc) // 4, mask=see, other=0.0)
        acc = acc * ksc * (scale * f8)
    else:
        acc = acc * scale
    tl.store(OUT + t.to(tl.int64) * stride_ot + offs_n, tl.where(see, acc, float("-inf")), mask=offs_n < MAX_LEN)


@triton.jit
def _paged_inf(OUT, t, tile, stride_ot, MAX_LEN, BLOCK_N: tl.constexpr):
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(OUT + t.to(tl.int64) * stride_ot + offs_n, tl.full([BLOCK_N], float("-inf"), tl.float32),
             mask=offs_n < MAX_LEN)


@triton.jit
def _indexer_paged_kernel(
    Q, K8, KF, W, BT, CTX, OUT,
    stride_qt, stride_qh, stride_qterm, stride_wt, stride_bt, stride_ot,
    stride_blk, stride_val, scale_base, stride_sc,
    HI, MAX_LEN, NEXT_N, BLOCK_SIZE, scale, TILES,
    KV_FP8: tl.constexpr, FP8_HW: tl.constexpr, BLOCK_HI: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
    TILE_LOOP: tl.constexpr, KEYS_M: tl.constexpr, F16_DOT: tl.constexpr, Q_TERMS: tl.constexpr,
    MULTI: tl.constexpr,
):
    """Program (t, pid_n) scores query t over its tiles: tile pid_n (not MULTI), TILES consecutive tiles from
    pid_n * TILES (MULTI), or (TILE_LOOP) tiles pid_n, pid_n + G, ... up to the request's context. With more than
    one tile, q and the weights are loaded once for all of them and the loop over the tiles holding a visible
    position has no branch in it, so the compiler pipelines its key loads (num_stages); the program's tiles past
    the query's position are written -inf after it. TILES is a runtime argument: as a constexpr the 8-tile loop
    compiled to 9 % more instructions under Triton 3.6 (outputs/bench/sweeps/indexer_tiles_sass_triton36.txt)."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = t // NEXT_N
    ctx = tl.load(CTX + b)
    last = ctx - NEXT_N + t % NEXT_N  # this query's own position
    DOT_DTYPE: tl.constexpr = tl.float16 if F16_DOT else Q.dtype.element_ty
    if TILE_LOOP or MULTI:
        if TILE_LOOP:
            # a fixed grid (T, G) over a row of MAX_LEN: the program leaves the row past the request's context
            # alone (the reader bounds each row by its context), so the launch's cost follows the contexts
            start = pid_n
            step = tl.num_programs(1)
            stop = tl.cdiv(tl.minimum(ctx, MAX_LEN), BLOCK_N)
        else:
            start = pid_n * TILES
            step = 1
            stop = tl.minimum(start + TILES, tl.cdiv(MAX_LEN, BLOCK_N))
        seen = tl.minimum(stop, tl.cdiv(tl.maximum(last + 1, 0), BLOCK_N))  # [.., seen): a visible position each
        q, q2, w = _paged_q(Q, W, t, stride_qt, stride_qh, stride_qterm, stride_wt, HI, BLOCK_HI, D, F16_DOT, Q_TERMS)
        for tile in range(start, seen, step):
            _paged_tile(q, q2, w, K8, KF, BT, OUT, t, b, last, tile, stride_bt, stride_ot, stride_blk, stride_val,
                        scale_base, stride_sc, MAX_LEN, BLOCK_SIZE, scale, KV_FP8, FP8_HW, BLOCK_N, D, KEYS_M,
                        DOT_DTYPE, Q_TERMS, True)
        for tile in range(start + tl.cdiv(tl.maximum(seen - start, 0), step) * step, stop, step):
            _paged_inf(OUT, t, tile, stride_ot, MAX_LEN, BLOCK_N)
    elif pid_n * BLOCK_N <= last:
        q, q2, w = _paged_q(Q, W, t, stride_qt, stride_qh, stride_qterm, stride_wt, HI, BLOCK_HI, D, F16_DOT, Q_TERMS)
        _paged_tile(q, q2, w, K8, KF, BT, OUT, t, b, last, pid_n, stride_bt, stride_ot, stride_blk, stride_val,
                    scale_base, stride_sc, MAX_LEN, BLOCK_SIZE, scale, KV_FP8, FP8_HW, BLOCK_N, D, KEYS_M, DOT_DTYPE,
                    Q_TERMS, False)
    else:
        _paged_inf(OUT, t, pid_n, stride_ot, MAX_LEN, BLOCK_N)


_PAGED = Prebound(_indexer_paged_kernel)


def _check_q(q, weights):
    if q.dim() != 3 or q.shape[-1] != INDEXER_DIM:
        raise ValueError(f"q must be [T, Hi, {INDEXER_DIM}], got {tuple(q.shape)}")
    if weights.shape != q.shape[:2]:
        raise ValueError(f"weights must be [T, Hi] = {tuple(q.shape[:2])}, got {tuple(weights.shape)}")


def indexer_logits(
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
    out: torch.Tensor | None = None,
    row_bound_only: bool = False,
) -> torch.Tensor:
    """Indexer scores (fp32, ReLU, per-head weights, bounds); ragged when `block_table` is None, else paged.

    q: `[T, Hi, 128]` bf16/fp16 (fp32 under the interpreter), or float8_e4m3fn with fp8 keys: then the key bytes
    feed an fp8 tensor-core dot as they are (no conversion, twice the bf16 rate) and the caller folds q's
    per-(token, head) scale into `weights`, as vLLM's DeepGEMM path does. Paged, bf16 q over fp8 keys is first
    rewritten by a launch of its own into two new tensors (`PAGED_Q_FORM`: exact as fp16, or on sm_90 two e4m3
    terms, within ~1.6e-4 of the bf16 dot's scores there). weights: `[T, Hi]`
    fp32 (keep fp32: bf16 weights flip near-tied top-k picks). `scale` multiplies `q . k` (GLM-5: 128^-0.5; fold
    32^-0.5 into weights).
    Ragged: `k_cache` `[N, 128]` or fp8 `[N, 132]` uint8; `ks`/`ke` int32 `[T]` (defaults 0 / N) -> `[T, N]`.
    Paged: `k_cache` `[num_blocks, block_size, 128]` or fp8 `[num_blocks, block_size, 132]` (block-split);
    `block_table` int32 `[B, max_blocks]`, `context_lens` int32 `[B]`, `T = B * next_n` -> `[T, max_len]`.
    Paged launches score `paged_tiles` consecutive key tiles a program (`PAGED_TILES`: 8 over bf16 keys on sm_90, 4
    for q rewritten into two e4m3 terms).
    `row_bound_only`: row t is written only up to the end of the key tile holding its request's context (the rest
    keeps whatever `out` held)
    and the grid no longer grows with `max_len`: for a fixed, wide `max_len` (max_model_len, CUDA graphs) read
    with per-row lengths (`topk_select(lengths=...)`).
    """
    _check_q(q, weights)
    fp8 = k_format == "fp8"
    if k_format not in ("bf16", "fp16", "fp32", "fp8"):
        raise ValueError(f"k_format must be 'bf16' or 'fp8', got {k_format!r}")
    if fp8 and (k_cache.dtype != torch.uint8 or k_cache.shape[-1] != INDEXER_FP8_ROW_BYTES):
        raise ValueError(f"fp8 indexer keys must be uint8 rows of {INDEXER_FP8_ROW_BYTES}, got {k_cache.dtype} {tuple(k_cache.shape)}")
    if q.dtype == torch.float8_e4m3fn and not (fp8 and fp8_hw(q.device)):
        raise ValueError("fp8 q needs fp8 keys and an sm_89+ GPU (or the interpreter)")
    if not fp8 and (k_cache.shape[-1] != INDEXER_DIM or k_cache.dtype != q.dtype):
        raise ValueError(f"bf16 indexer keys must be rows of {INDEXER_DIM} in q's dtype, got {k_cache.dtype} {tuple(k_cache.shape)}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    weights = weights.float().contiguous()
    T, HI, _ = q.shape
    dev = q.device
    kf = k_cache.view(torch.float32) if fp8 else k_cache  # scale bytes seen as fp32; only the base pointer is used

    if block_table is None:
        if k_cache.dim() != 2 or k_cache.stride(-1) != 1:
            raise ValueError(f"ragged indexer keys must be 2-D rows, got {tuple(k_cache.shape)}")
        N = k_cache.shape[0]
        ks = torch.zeros(T, dtype=torch.int32, device=dev) if ks is None else ks.to(torch.int32).contiguous()
        ke = torch.full((T,), N, dtype=torch.int32, device=dev) if ke is None else ke.to(torch.int32).contiguous()
        if out is None:
            out = torch.empty(T, N, dtype=torch.float32, device=dev)
        if T == 0 or N == 0:
            return out
        bm, bn, nw, ns = INDEXER_CONFIGS["ragged"]
        grid = (triton.cdiv(T, bm), triton.cdiv(N, bn))
        _indexer_ragged_kernel[grid](
            q, k_cache, kf, weights, ks, ke, out,
            q.stride(0), q.stride(1), k_cache.stride(0), weights.stride(0), out.stride(0),
            T, N, HI, float(scale),
            KV_FP8=fp8, FP8_HW=fp8_hw(dev), BLOCK_M=bm, BLOCK_N=bn, D=INDEXER_DIM, num_warps=nw, num_stages=ns,
        )
        return out

    if k_cache.dim() != 3:
        raise ValueError(f"paged indexer cache must be [num_blocks, block_size, row], got {tuple(k_cache.shape)}")
    if context_lens is None:
        raise ValueError("paged indexer_logits needs context_lens")
    B = block_table.shape[0]
    if T != B * next_n:
        raise ValueError(f"T = {T} queries but block_table has {B} requests x next_n {next_n}")
    bs = k_cache.shape[1]
    if max_len is None:
        max_len = block_table.shape[1] * bs
    if out is None:
        out = torch.empty(T, max_len, dtype=torch.float32, device=dev)
    if T == 0 or max_len == 0:
        return out
    if fp8:
        stride_val, scale_base, stride_sc = INDEXER_DIM, bs * INDEXER_DIM, 4  # block-split layout
    else:
        stride_val, scale_base, stride_sc = k_cache.stride(1), 0, 0
    _, bn, nw, ns = INDEXER_CONFIGS["paged"]
    tiles = triton.cdiv(max_len, bn)
    per = 1
    if row_bound_only:  # enough programs per row to fill the GPU a few times over, each looping over its tiles
        grid = (T, max(1, min(tiles, triton.cdiv(PAGED_LOOP_PROGRAMS_PER_SM * num_sms(dev), T))))
    form = paged_q_form(q.dtype, k_format, dev)
    if not row_bound_only:
        per = paged_tiles(k_format, dev, form)
        grid = (T, triton.cdiv(tiles, per))
    block_table = block_table.to(torch.int32)
    q_terms = 1
    if form in REWRITTEN_DTYPE:  # rewritten by the prepass: the scores kernel takes that q as it is
        q, weights = rewrite_q(q, weights, form)
        if form == "e4m3x2":
            q, q_terms = q[0], 2  # the first term; the second lies T * Hi * 128 elements further
    keys_m = paged_keys_m(q.dtype, k_format, form)
    maxnreg = paged_maxnreg(q.dtype, k_format, keys_m, q_terms, row_bound_only, dev, per)
    _PAGED(grid,
        q, k_cache, kf, weights, block_table, context_lens.to(torch.int32).contiguous(), out,
        q.stride(0), q.stride(1), T * HI * INDEXER_DIM, weights.stride(0), block_table.stride(0), out.stride(0),
        k_cache.stride(0), stride_val, scale_base, stride_sc,
        HI, max_len, next_n, bs, float(scale), per,
        KV_FP8=fp8, FP8_HW=fp8_hw(dev), BLOCK_HI=max(16, triton.next_power_of_2(HI)), BLOCK_N=bn, D=INDEXER_DIM,
        TILE_LOOP=row_bound_only, KEYS_M=keys_m, F16_DOT=form == "f16-kernel", Q_TERMS=q_terms, MULTI=per > 1,
        num_warps=nw,
        num_stages=ns, **({} if maxnreg is None else {"maxnreg": maxnreg}),
    )
    return out


def indexer_flops(T: int, n_keys: float, HI: int) -> float:
    """Useful FLOPs of the scores: `T` queries, each seeing `n_keys` keys (a mean for causal prefill), `HI` heads."""
    return 2.0 * T * n_keys * HI * INDEXER_DIM


__all__ = ["indexer_logits", "indexer_flops", "paged_keys_m", "paged_q_form", "paged_maxnreg", "paged_tiles",
           "rewrite_q", "INDEXER_CONFIGS", "Q_FORMS", "REWRITTEN_DTYPE"]
