"""Triton sparse MLA forward (absorbed / MQA form, DeepSeek-V3.2 DSA and GLM-5).

`sparse_mla(q, kv_cache, indices, sm_scale)` -> `(out [T, H, 512], lse [T, H])`; the fp32 twin is
`naive.sparse_mla_ref`. One kernel serves decode and prefill:

- a program owns one query token, a block of `BLOCK_H` heads and a slice of that token's top-k list;
  it gathers `BLOCK_N` cache rows at a time (once for all its heads: heads share the row, so HBM traffic
  is one pass over the gathered rows per head block), computes `S = q k^T` on tensor cores, and runs the
  online softmax with `acc += P V` (V = the first 512 columns of the same rows);
- when `T * head_blocks` is too small to fill the GPU (decode), the top-k list is split across
  `num_splits` programs that write fp32 partials and a second kernel merges them with the log-sum-exp rule;
- the 512 latent columns are handled as 4 chunks of 128: fp8_ds_mla keeps one fp32 scale per chunk, so the
  e4m3 bytes convert exactly to the dot dtype and the scale is applied on the `[BLOCK_H, BLOCK_N]` side
  (to S, and to P before the P V product) instead of on every element.

Indices are data: `row = load(indices)`, then `load(kv + row * stride)` with the row masked and clamped to
0 when it is -1 or >= N, so no address outside the cache is formed whatever the indices hold.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from glm5lib.kernels import common  # before triton: the interpreter switch
from glm5lib.kernels.common import Prebound, capability, capturing, e4m3_bits_to, fp8_hw, num_sms
import triton  # noqa: E402  (after common, which sets the interpreter switch)
import triton.language as tl  # noqa: E402

from glm5lib.kernels.naive import D_NOPE, D_QK, D_ROPE, FP8_DS_MLA_ROW_BYTES, kv_row_geometry

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class MLAConfig:
    """One shipped kernel configuration (tests compile every one of them for sm_80/89/90/120)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    prefetch: int = 0  # 1: register double-buffering of the gathered tile; 2: the same, fp8 tile held as int32 words
    nope_f16: bool = False  # fp8 caches: latent dots in fp16 instead of bf16
    dequant: bool = False  # fp8 caches: scale into bf16 in registers (one P operand) instead of scaling S and P
    waves: int = 2  # split the top-k until about this many programs per SM
    idx_ahead: bool = False  # read each index tile one iteration before its gather
    fit: bool = False  # split count: all programs fit in `waves` per SM (floor) instead of covering it (ceil)

    @property
    def name(self) -> str:
        return f"H{self.block_h}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}{'-pf' if self.prefetch else ''}{'w' if self.prefetch == 2 else ''}{'-f16' if self.nope_f16 else ''}{'-dq' if self.dequant else ''}{'-ia' if self.idx_ahead else ''}-v{self.waves}{'-fit' if self.fit else ''}"


# Configs the dispatcher picks from, by (head count class, cache format, shared-memory class). "big" is
# sm_90's 227 KB per block; "small" fits the 99 KB of sm_89 / sm_120 (compile_report checks every one).
CONFIGS = {
    # decode H <= 16 (docs/kernels.md v5, H200): index read-ahead + 2 programs/SM in one wave; bf16 B32 42 -> 38 us,
    # fp8 B128 206 -> 159 us. v7 (NOTES.md): the fp8 tile held as int32 words (no spills), B128 149.4 us against
    # 154.5 / 159.3 for the v5 config timed twice in the same run
    ("small", "bf16", "big"): MLAConfig(16, 32, 4, 3, idx_ahead=True, fit=True),
    ("small", "fp8_ds_mla", "big"): MLAConfig(16, 32, 4, 2, prefetch=2, nope_f16=True, idx_ahead=True, fit=True),
    ("prefill-small", "bf16", "big"): MLAConfig(16, 64, 4, 2),
    # fp8 prefill H <= 16 (NOTES.md v8d, outputs/bench/sweeps/prefill_fp8_sweep_h200.json): 64-row tiles on 8 warps
    # with the index read-ahead, s_q 4096 4.35 -> 4.05 ms at H8 (the int32-word tile: 4.17-4.27 ms)
    ("prefill-small", "fp8_ds_mla", "big"): MLAConfig(16, 64, 8, 2, prefetch=True, nope_f16=True, idx_ahead=True),
    ("large", "bf16", "big"): MLAConfig(64, 64, 8, 2),
    ("large", "fp8_ds_mla", "big"): MLAConfig(64, 64, 8, 2, dequant=True),
    ("small", "bf16", "small"): MLAConfig(16, 32, 4, 2),
    # sm_89 / sm_120 (99 KB per block): the sm_90 decode loop at one program per SM (88 KB), no spills there
    ("small", "fp8_ds_mla", "small"): MLAConfig(16, 32, 4, 2, prefetch=2, nope_f16=True, idx_ahead=True, waves=1,
                                                fit=True),
    ("prefill-small", "bf16", "small"): MLAConfig(16, 32, 4, 2),
    ("prefill-small", "fp8_ds_mla", "small"): MLAConfig(16, 32, 4, 2, prefetch=True, nope_f16=True),
    ("large", "bf16", "small"): MLAConfig(32, 32, 4, 2),
    # 72 KB and no spills whatever the target (Triton 3.6: 242 registers on sm_90, 222 on sm_120); the H64 dequant
    # tile took 108 KB built for sm_90 (over the class) and spilled 176 bytes built for sm_120
    ("large", "fp8_ds_mla", "small"): MLAConfig(32, 32, 8, 2, prefetch=True, nope_f16=True),
}


@triton.jit
def _tile_rows(idx_row, start, k_end, N_ROWS, stride_kv, BLOCK_N: tl.constexpr):
    """Row offsets of one tile of BLOCK_N keys; invalid ids (-1, >= N, past the split) become row 0, masked."""
    offs_n = start + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_row + offs_n, mask=offs_n < k_end, other=-1)
    valid = (idx >= 0) & (idx < N_ROWS)
    row_b = tl.where(valid, idx, 0).to(tl.int64) * stride_kv  # bytes (fp8) / elements (bf16)
    return valid, row_b


@triton.jit
def _tile_load(KV8, KVF, KVH, row_b, valid, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
               KV_FP8: tl.constexpr, ALIGNED: tl.constexpr, WORDS: tl.constexpr = False):
    """Raw gathered rows: 4 latent chunks of 128 (e4m3 bytes or bf16), the rope part, and the 4 fp32 scales.

    WORDS (fp8 caches): the latent chunks and the rope part as int32 words ([BLOCK_N, 32] each: 4 e4m3 bytes or
    2 bf16 per word), unpacked by `_tile_prep`. A tile held across iterations (PREFETCH) then takes one 32-bit
    register per 4 bytes; as uint8 / bf16 elements every byte or half-word is a register of its own.
    """
    CH: tl.constexpr = 128
    offs = tl.arange(0, CH)
    offs_r = tl.arange(0, D_ROPE)
    m = valid[:, None]
    if KV_FP8 and WORDS:
        KVW = KVF.to(tl.pointer_type(tl.int32), bitcast=True)
        offs_w = tl.arange(0, CH // 4)
        w_off = row_b // 4
        if ALIGNED:
            w_off = tl.multiple_of(w_off, 4)
        x0 = tl.load(KVW + w_off[:, None] + 0 * CH // 4 + offs_w[None, :], mask=m, other=0)
        x1 = tl.load(KVW + w_off[:, None] + 1 * CH // 4 + offs_w[None, :], mask=m, other=0)
        x2 = tl.load(KVW + w_off[:, None] + 2 * CH // 4 + offs_w[None, :], mask=m, other=0)
        x3 = tl.load(KVW + w_off[:, None] + 3 * CH // 4 + offs_w[None, :], mask=m, other=0)
        kr = tl.load(KVW + w_off[:, None] + (D_NOPE + 16) // 4 + tl.arange(0, D_ROPE // 2)[None, :], mask=m, other=0)
        sc = tl.load(KVF + w_off[:, None] + D_NOPE // 4 + tl.arange(0, 4)[None, :], mask=m, other=0.0)
    else:
        x0 = tl.load(KV8 + row_b[:, None] + 0 * CH + offs[None, :], mask=m, other=0)
        x1 = tl.load(KV8 + row_b[:, None] + 1 * CH + offs[None, :], mask=m, other=0)
        x2 = tl.load(KV8 + row_b[:, None] + 2 * CH + offs[None, :], mask=m, other=0)
        x3 = tl.load(KV8 + row_b[:, None] + 3 * CH + offs[None, :], mask=m, other=0)
        if KV_FP8:
            # rope: 64 bf16 at byte 528; scales: 4 fp32 at byte 512. The hints let both load as 16-byte vectors
            # (the host sets ALIGNED only when the row stride and base are multiples of 16 bytes).
            rope_off = (row_b + D_NOPE + 16) // 2
            sc_off = (row_b + D_NOPE) // 4
            if ALIGNED:
                rope_off = tl.multiple_of(rope_off, 8)
                sc_off = tl.multiple_of(sc_off, 4)
            kr = tl.load(KVH + rope_off[:, None] + offs_r[None, :], mask=m, other=0.0)
            sc = tl.load(KVF + sc_off[:, None] + tl.arange(0, 4)[None, :], mask=m, other=0.0)
        else:
            kr = tl.load(KV8 + row_b[:, None] + D_NOPE + offs_r[None, :], mask=m, other=0.0)
            sc = tl.full([BLOCK_N, 4], 1.0, tl.float32)
    return x0, x1, x2, x3, kr, sc


@triton.jit
def _col(sc, c: tl.constexpr):
    """Column c of a [BLOCK_N, 4] tile, as [BLOCK_N]."""
    return tl.sum(tl.where(tl.arange(0, 4)[None, :] == c, sc, 0.0), 1)


# the interpreter runs no PTX: FP8_ASM falls back to Triton's conversion there
_INTERPRETED: tl.constexpr = tl.constexpr(common.INTERPRETED)


@triton.jit
def _words_e4m3(w, DOT_DTYPE: tl.constexpr, FP8_HW: tl.constexpr, ASM: tl.constexpr):
    """[N, W] int32 words of 4 e4m3 bytes -> ([N, 4 W] DOT_DTYPE, factor), bytes in memory order.

    ASM (fp16, sm_89+): two cvt.rn.f16x2.e4m3x2 per word on its halves, no byte unpacking."""
    if ASM:
        e0, e1, e2, e3 = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .b32 a, b;\n mov.b32 {lo, hi}, $4;\n cvt.rn.f16x2.e4m3x2 a, lo;\n"
            " cvt.rn.f16x2.e4m3x2 b, hi;\n mov.b32 {$0, $1}, a;\n mov.b32 {$2, $3}, b; }",
            "=h,=h,=h,=h,r", [w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1)
        f = 1.0
    else:
        e0, f = e4m3_bits_to((w & 0xFF).to(tl.uint8), DOT_DTYPE, FP8_HW)
        e1, f = e4m3_bits_to(((w >> 8) & 0xFF).to(tl.uint8), DOT_DTYPE, FP8_HW)
        e2, f = e4m3_bits_to(((w >> 16) & 0xFF).to(tl.uint8), DOT_DTYPE, FP8_HW)
        e3, f = e4m3_bits_to(((w >> 24) & 0xFF).to(tl.uint8), DOT_DTYPE, FP8_HW)
    N: tl.constexpr = w.shape[0]
    W: tl.constexpr = w.shape[1]
    # join(join(e0, e2), join(e1, e3))[n, j, a, b] = e_(2a + b): memory order after the reshape
    return tl.reshape(tl.join(tl.join(e0, e2), tl.join(e1, e3)), [N, 4 * W]), f


@triton.jit
def _words_bf16(w):
    """[N, W] int32 words of 2 bf16 -> [N, 2 W] bf16 (exact: each half becomes the top of an fp32)."""
    lo = (w << 16).to(tl.float32, bitcast=True).to(tl.bfloat16)
    hi = (w & -65536).to(tl.float32, bitcast=True).to(tl.bfloat16)
    N: tl.constexpr = w.shape[0]
    W: tl.constexpr = w.shape[1]
    return tl.reshape(tl.join(lo, hi), [N, 2 * W])


@triton.jit
def _tile_prep(x0, x1, x2, x3, kr, sc, KV_FP8: tl.constexpr, FP8_HW: tl.constexpr, DOT_DTYPE: tl.constexpr,
               NOPE_F16: tl.constexpr, DEQUANT: tl.constexpr, WORDS: tl.constexpr = False):
    """Raw tile -> dot operands (k0..k3, kr) and the per-row chunk scales (s0..s3) the dots still apply.

    NOPE_F16 (fp8 caches): the latent dots run in fp16 (e4m3 -> fp16 is one conversion instruction, bf16 takes
    more); q chunks arrive pre-scaled by 2^-8 and P is scaled by 2^8 so both stay inside fp16's range, and the
    accumulator is divided by 2^8 at the end.
    DEQUANT (fp8 caches): scale the e4m3 values into the dot dtype in registers instead (one P operand for all
    four P V products, as with bf16 rows; exact for FlashMLA's power-of-two scales).
    WORDS: the tile arrives as int32 words (`_tile_load`); with NOPE_F16 on sm_89+ the e4m3 -> fp16 conversion
    is inline PTX on whole words (the same values).
    """
    s0 = 1.0  # bf16 rows and DEQUANT: nothing left to scale
    s1 = 1.0
    s2 = 1.0
    s3 = 1.0
    if KV_FP8 and DEQUANT:
        k0, f = e4m3_bits_to(x0, tl.float32, FP8_HW)
        k1, f = e4m3_bits_to(x1, tl.float32, FP8_HW)
        k2, f = e4m3_bits_to(x2, tl.float32, FP8_HW)
        k3, f = e4m3_bits_to(x3, tl.float32, FP8_HW)
        x0 = (k0 * (_col(sc, 0) * f)[:, None]).to(DOT_DTYPE)
        x1 = (k1 * (_col(sc, 1) * f)[:, None]).to(DOT_DTYPE)
        x2 = (k2 * (_col(sc, 2) * f)[:, None]).to(DOT_DTYPE)
        x3 = (k3 * (_col(sc, 3) * f)[:, None]).to(DOT_DTYPE)
        kr = kr.to(DOT_DTYPE)
    if KV_FP8 and not DEQUANT:
        # e4m3 -> dot dtype is exact; the per-chunk scale goes on the [H, N] side, to S and to P
        NOPE_DTYPE: tl.constexpr = tl.float16 if NOPE_F16 else DOT_DTYPE
        if WORDS:
            ASM: tl.constexpr = NOPE_F16 and FP8_HW and not _INTERPRETED
            x0, f = _words_e4m3(x0, NOPE_DTYPE, FP8_HW, ASM)
            x1, f = _words_e4m3(x1, NOPE_DTYPE, FP8_HW, ASM)
            x2, f = _words_e4m3(x2, NOPE_DTYPE, FP8_HW, ASM)
            x3, f = _words_e4m3(x3, NOPE_DTYPE, FP8_HW, ASM)
            kr = _words_bf16(kr)
        else:
            x0, f = e4m3_bits_to(x0, NOPE_DTYPE, FP8_HW)
            x1, f = e4m3_bits_to(x1, NOPE_DTYPE, FP8_HW)
            x2, f = e4m3_bits_to(x2, NOPE_DTYPE, FP8_HW)
            x3, f = e4m3_bits_to(x3, NOPE_DTYPE, FP8_HW)
        s0 = _col(sc, 0) * f
        s1 = _col(sc, 1) * f
        s2 = _col(sc, 2) * f
        s3 = _col(sc, 3) * f
        kr = kr.to(DOT_DTYPE)
    return x0, x1, x2, x3, kr, s0, s1, s2, s3


@triton.jit
def _tile_attend(q0, q1, q2, q3, qr, k0, k1, k2, k3, kr, s0, s1, s2, s3, valid, m_i, l_i, acc0, acc1, acc2, acc3,
                 qk_scale, KV_FP8: tl.constexpr, DOT_DTYPE: tl.constexpr, NOPE_F16: tl.constexpr,
                 DEQUANT: tl.constexpr):
    """S = q k^T on a prepared tile (`_tile_prep`), online-softmax update of (m, l, acc) with acc += P V
    (V = the latent chunks)."""
    if KV_FP8 and not DEQUANT:
        s = tl.dot(q0, tl.trans(k0)) * s0[None, :]
        s += tl.dot(q1, tl.trans(k1)) * s1[None, :]
        s += tl.dot(q2, tl.trans(k2)) * s2[None, :]
        s += tl.dot(q3, tl.trans(k3)) * s3[None, :]
        if NOPE_F16:
            s = s * 256.0
        s += tl.dot(qr, tl.trans(kr))
    else:
        s = tl.dot(q0, tl.trans(k0))
        s += tl.dot(q1, tl.trans(k1))
        s += tl.dot(q2, tl.trans(k2))
        s += tl.dot(q3, tl.trans(k3))
        s += tl.dot(qr, tl.trans(kr))
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))  # log2 domain

    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: keep exp2 finite
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if KV_FP8 and not DEQUANT:
        if NOPE_F16:
            p = p * 256.0
        acc0 = acc0 * alpha[:, None] + tl.dot((p * s0[None, :]).to(k0.dtype), k0)
        acc1 = acc1 * alpha[:, None] + tl.dot((p * s1[None, :]).to(k0.dtype), k1)
        acc2 = acc2 * alpha[:, None] + tl.dot((p * s2[None, :]).to(k0.dtype), k2)
        acc3 = acc3 * alpha[:, None] + tl.dot((p * s3[None, :]).to(k0.dtype), k3)
    else:
        pd = p.to(DOT_DTYPE)
        acc0 = acc0 * alpha[:, None] + tl.dot(pd, k0)
        acc1 = acc1 * alpha[:, None] + tl.dot(pd, k1)
        acc2 = acc2 * alpha[:, None] + tl.dot(pd, k2)
        acc3 = acc3 * alpha[:, None] + tl.dot(pd, k3)
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _sparse_mla_fwd_kernel(
    Q, KV, IDX, O, LSE, PART,
    stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
    H, TOPK, N_ROWS, KEYS_PER_SPLIT, qk_scale,
    KV_FP8: tl.constexpr, FP8_HW: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
    PREFETCH: tl.constexpr = False, ALIGNED: tl.constexpr = False, NOPE_F16: tl.constexpr = False,
    DEQUANT: tl.constexpr = False, IDX_AHEAD: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One program: token t, head block hb, split sp of the top-k list (see the module docstring).

    SPLIT: the program writes its normalised fp32 partial and its log2 lse to PART (layout in `_part_rows`);
    `_merge_splits_kernel` combines them. Otherwise it writes O and LSE directly. PDL (split launches on sm_90+):
    let the merge launch once every program has started (`common.pdl`).
    """
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    CH: tl.constexpr = 128
    t = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    DOT_DTYPE: tl.constexpr = Q.dtype.element_ty
    # the cache seen as bytes (latent e4m3 / bf16 rows), fp32 (fp8 scales) and bf16 (fp8 rope): pointer casts here
    # instead of three tensor views on the host, which an eager decode layer would pay for on every call
    KV8 = KV
    KVF = KV.to(tl.pointer_type(tl.float32), bitcast=True)
    KVH = KV.to(tl.pointer_type(tl.bfloat16), bitcast=True)

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_c = tl.arange(0, CH)
    offs_r = tl.arange(0, D_ROPE)
    q_row = Q + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q0 = tl.load(q_row + 0 * CH + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    q1 = tl.load(q_row + 1 * CH + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    q2 = tl.load(q_row + 2 * CH + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    q3 = tl.load(q_row + 3 * CH + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    qr = tl.load(q_row + D_NOPE + offs_r[None, :], mask=h_mask[:, None], other=0.0)
    if KV_FP8 and NOPE_F16 and not DEQUANT:
        q0 = (q0.to(tl.float32) * (1.0 / 256.0)).to(tl.float16)
        q1 = (q1.to(tl.float32) * (1.0 / 256.0)).to(tl.float16)
        q2 = (q2.to(tl.float32) * (1.0 / 256.0)).to(tl.float16)
        q3 = (q3.to(tl.float32) * (1.0 / 256.0)).to(tl.float16)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, CH], tl.float32)
    acc1 = tl.zeros([BLOCK_H, CH], tl.float32)
    acc2 = tl.zeros([BLOCK_H, CH], tl.float32)
    acc3 = tl.zeros([BLOCK_H, CH], tl.float32)

    k_start = sp * KEYS_PER_SPLIT
    k_end = tl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
    idx_row = IDX + t.to(tl.int64) * stride_it
    # One pipelined loop. Two switches move loads earlier than the tile that uses them:
    # - PREFETCH: register double-buffering. The gathered tile x is loaded one iteration before it is attended
    #   to, so the next tile's gathers are in flight while this one is computed (Triton's own pipeliner cannot
    #   stage loads that are converted before the dot, as fp8 rows are). PREFETCH == 2 (fp8): the tile is held
    #   as int32 words (`_tile_load` WORDS), a quarter of the registers of uint8 elements.
    # - IDX_AHEAD: the index tile is read one iteration before its gather (carried in `a_*`), so no gather waits
    #   for its own index load; with num_stages=3 Triton's pipeliner then keeps two gathered bf16 tiles in shared
    #   memory, one in flight while the other is computed.
    # Iteration i attends tile i; it gathers tile i + LOAD_AHEAD and reads index tile i + LOAD_AHEAD + IDX_AHEAD.
    LOAD_AHEAD: tl.constexpr = 1 if PREFETCH else 0
    WORDS: tl.constexpr = PREFETCH == 2 and KV_FP8 and not DEQUANT
    if IDX_AHEAD:
        a_valid, a_row_b = _tile_rows(idx_row, k_start + LOAD_AHEAD * BLOCK_N, k_end, N_ROWS, stride_kv, BLOCK_N)
    if PREFETCH:
        x_valid, x_row_b = _tile_rows(idx_row, k_start, k_end, N_ROWS, stride_kv, BLOCK_N)
        x0, x1, x2, x3, kr, sc = _tile_load(KV8, KVF, KVH, x_row_b, x_valid, BLOCK_N, D_NOPE, D_ROPE, KV_FP8, ALIGNED,
                                            WORDS)
    for start in range(k_start, k_end, BLOCK_N):
        if IDX_AHEAD:
            valid, row_b = a_valid, a_row_b
            a_valid, a_row_b = _tile_rows(idx_row, start + (LOAD_AHEAD + 1) * BLOCK_N, k_end, N_ROWS, stride_kv,
                                          BLOCK_N)
        else:
            valid, row_b = _tile_rows(idx_row, start + LOAD_AHEAD * BLOCK_N, k_end, N_ROWS, stride_kv, BLOCK_N)
        y0, y1, y2, y3, yr, ysc = _tile_load(KV8, KVF, KVH, row_b, valid, BLOCK_N, D_NOPE, D_ROPE, KV_FP8, ALIGNED,
                                            WORDS)
        if PREFETCH:  # attend the tile gathered last iteration; keep this one for the next
            k0, k1, k2, k3, kk, s0, s1, s2, s3 = _tile_prep(x0, x1, x2, x3, kr, sc, KV_FP8, FP8_HW, DOT_DTYPE,
                                                            NOPE_F16, DEQUANT, WORDS)
            t_valid = x_valid
            x0, x1, x2, x3, kr, sc, x_valid = y0, y1, y2, y3, yr, ysc, valid
        else:
            k0, k1, k2, k3, kk, s0, s1, s2, s3 = _tile_prep(y0, y1, y2, y3, yr, ysc, KV_FP8, FP8_HW, DOT_DTYPE,
                                                            NOPE_F16, DEQUANT, WORDS)
            t_valid = valid
        m_i, l_i, acc0, acc1, acc2, acc3 = _tile_attend(
            q0, q1, q2, q3, qr, k0, k1, k2, k3, kk, s0, s1, s2, s3, t_valid, m_i, l_i, acc0, acc1, acc2, acc3,
            qk_scale, KV_FP8, DOT_DTYPE, NOPE_F16, DEQUANT)

    has_key = l_i > 0
    inv_l = tl.where(has_key, 1.0 / tl.where(has_key, l_i, 1.0), 0.0)
    if KV_FP8 and NOPE_F16 and not DEQUANT:
        inv_l = inv_l * (1.0 / 256.0)
    lse2 = tl.where(has_key, m_i + tl.log2(tl.where(has_key, l_i, 1.0)), float("-inf"))
    o_ty = O.dtype.element_ty
    if not SPLIT:
        o_row = O + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh
        tl.store(o_row + 0 * CH + offs_c[None, :], (acc0 * inv_l[:, None]).to(o_ty), mask=h_mask[:, None])
        tl.store(o_row + 1 * CH + offs_c[None, :], (acc1 * inv_l[:, None]).to(o_ty), mask=h_mask[:, None])
        tl.store(o_row + 2 * CH + offs_c[None, :], (acc2 * inv_l[:, None]).to(o_ty), mask=h_mask[:, None])
        tl.store(o_row + 3 * CH + offs_c[None, :], (acc3 * inv_l[:, None]).to(o_ty), mask=h_mask[:, None])
        tl.store(LSE + t * stride_lt + offs_h, lse2 * 0.6931471805599453, mask=h_mask)
    else:
        n_t = tl.num_programs(0)
        n_sp = tl.num_programs(2)
        rows = _part_rows(sp, t, n_t, H, offs_h)
        o_part = PART + rows[:, None] * D_NOPE
        tl.store(o_part + 0 * CH + offs_c[None, :], acc0 * inv_l[:, None], mask=h_mask[:, None])
        tl.store(o_part + 1 * CH + offs_c[None, :], acc1 * inv_l[:, None], mask=h_mask[:, None])
        tl.store(o_part + 2 * CH + offs_c[None, :], acc2 * inv_l[:, None], mask=h_mask[:, None])
        tl.store(o_part + 3 * CH + offs_c[None, :], acc3 * inv_l[:, None], mask=h_mask[:, None])
        tl.store(PART + n_sp.to(tl.int64) * n_t * H * D_NOPE + rows, lse2, mask=h_mask)


@triton.jit
def _part_rows(s, t, n_t, H, offs_h):
    """Row of (split s, token t, head h) in the split buffer: fp32 partial outputs `[S, T, H, D_NOPE]`
    (normalised), followed by their log2 lse `[S, T, H]`, in one allocation."""
    return (s * n_t + t).to(tl.int64) * H + offs_h


@triton.jit
def _merge_splits_kernel(PART, O, LSE, stride_ot, stride_oh, stride_lt, H, NUM_SPLITS,
                         D_NOPE: tl.constexpr, SP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                         PDL: tl.constexpr = False):
    """out = sum_s 2^(lse_s - lse) o_s, lse = log2 sum_s 2^lse_s (partials hold normalised o_s).

    One program owns (token, head block, BLOCK_D columns) and loads every split at once ([SP, BLOCK_H, BLOCK_D]),
    so the split loads are all in flight together instead of one dependent round trip per split. PDL: launched as a
    programmatic dependent of the kernel that wrote the partials, so it waits for that kernel first (`common.pdl`).
    """
    if PDL:
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0)
    hb = tl.program_id(1)
    db = tl.program_id(2)
    n_t = tl.num_programs(0)
    offs_s = tl.arange(0, SP)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    h_mask = offs_h < H
    sh_mask = (offs_s < NUM_SPLITS)[:, None] & h_mask[None, :]
    rows = _part_rows(offs_s[:, None], t, n_t, H, offs_h[None, :])  # [SP, BLOCK_H]
    _merge_rows(PART, PART + NUM_SPLITS.to(tl.int64) * n_t * H * D_NOPE, rows, sh_mask, O, LSE, t, offs_h, h_mask,
                offs_d, db, stride_ot, stride_oh, stride_lt, D_NOPE)


@triton.jit
def _merge_rows(PART, PART_LSE, rows, sh_mask, O, LSE, t, offs_h, h_mask, offs_d, db, stride_ot, stride_oh, stride_lt,
                D_NOPE: tl.constexpr):
    """Token t's merge from the partial rows `rows` [SP, BLOCK_H] (masked by sh_mask): normalised outputs at
    PART + row * D_NOPE, log2 lse at PART_LSE + row; writes out's BLOCK_D columns offs_d and, from the first column
    block (db 0), the natural-log lse. Shared by the split merge and the balanced schedule's (`mla_gluon_large`)."""
    ls = tl.load(PART_LSE + rows, mask=sh_mask, other=float("-inf"))
    m = tl.max(ls, 0)  # [BLOCK_H]
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(ls - m_use[None, :])  # [SP, BLOCK_H]; 0 for splits without keys
    l = tl.sum(w, 0)
    o = tl.load(PART + rows[:, :, None] * D_NOPE + offs_d[None, None, :], mask=sh_mask[:, :, None], other=0.0)
    acc = tl.sum(o * w[:, :, None], 0)  # [BLOCK_H, BLOCK_D]
    has_key = l > 0
    inv_l = tl.where(has_key, 1.0 / tl.where(has_key, l, 1.0), 0.0)
    tl.store(O + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
             (acc * inv_l[:, None]).to(O.dtype.element_ty), mask=h_mask[:, None])
    if db == 0:
        lse = tl.where(has_key, (m_use + tl.log2(tl.where(has_key, l, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + t * stride_lt + offs_h, lse, mask=h_mask)


def merge_splits(part: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, splits: int) -> None:
    """Combine `splits` fp32 partials in `part` (`_part_rows`'s layout) into out `[T, H, 512]` and a fresh lse
    `[T, H]`: one launch of `_merge_splits_kernel` through the pre-bound launcher (the Gluon launchers';
    `sparse_mla_launch` keeps its own plan for it)."""
    T, H, _ = out.shape
    sp, bh, bd = merge_tile(splits, H)
    _MERGE.launch((T, -(-H // bh), D_NOPE // bd), (part, out, lse, out.stride(0), out.stride(1), H, H, splits),
                  dict(D_NOPE=D_NOPE, SP=sp, BLOCK_H=bh, BLOCK_D=bd, num_warps=4,
                       **common.merge_pdl_kw(out.device)))


MAX_SPLITS = 32  # keeps the merge's [splits, heads, columns] tile small; >= 64 keys per split at top-k 2048


def merge_tile(num_splits: int, H: int) -> tuple[int, int, int]:
    """(SP, BLOCK_H, BLOCK_D) for the merge: about 4K fp32 values in flight per program."""
    sp = 1 << (num_splits - 1).bit_length()
    bh = min(16, 1 << (H - 1).bit_length())
    bd = max(16, min(128, 4096 // (sp * bh)))
    return sp, bh, bd


_num_sms = num_sms  # older name, kept for callers


# GLM5LIB_SMEM_CLASS=small|big: take that class's configs on any GPU (the H200 then runs, and its case matrix and
# benchmark time, the configs shipped for sm_89 / sm_120). Read once: launch plans are cached per shape.
FORCE_SMEM_CLASS = os.environ.get("GLM5LIB_SMEM_CLASS") or None


def force_smem_class(value: str | None) -> None:
    """Take `value`'s configs on any GPU from now on (None: by the device again); cached launch plans are dropped."""
    global FORCE_SMEM_CLASS
    FORCE_SMEM_CLASS = value
    _plan.cache_clear()
    _launch_plan.cache_clear()


def set_pdl(on: bool) -> None:
    """Launch split merges as programmatic dependents (`common.pdl`) from now on, or not (the default; GLM5LIB_PDL=1
    sets it on at import); the cached launch plans of every sparse-MLA kernel are dropped (the probe compares both in
    one process)."""
    import sys

    common.PDL = bool(on)
    common._MERGE_PDL_KW.clear()
    _launch_plan.cache_clear()
    for name in ("glm5lib.kernels.mla_gluon_fp8mma", "glm5lib.kernels.mla_gluon_large"):
        mod = sys.modules.get(name)
        if mod is not None:
            mod.clear_plans()


def smem_class(device: torch.device) -> str:
    """'big' on sm_90/sm_100 (>= 200 KB of shared memory per block), else 'small' (sm_80 is served by 'small' too)."""
    if FORCE_SMEM_CLASS is not None:
        if FORCE_SMEM_CLASS not in ("small", "big"):
            raise ValueError(f"GLM5LIB_SMEM_CLASS must be 'small' or 'big', got {FORCE_SMEM_CLASS!r}")
        return FORCE_SMEM_CLASS
    if device.type != "cuda":
        return "big"
    return "big" if capability(device)[0] in (9, 10) else "small"


def pick_config(T: int, H: int, topk: int, kv_format: str, smem: str = "big", n_sms: int = 132) -> MLAConfig:
    """All of a token's heads in one program up to 16 (tl.dot pads M to 16); 64-head tiles beyond.

    Small-H prefill (enough tokens to fill the GPU without splitting) takes wider key tiles (H200 sweep:
    1.96 ms with N=64 against 2.62 ms with N=32 at H=8, s_q 4096).
    """
    return CONFIGS[config_key(T, H, kv_format, smem, n_sms)]


def config_key(T: int, H: int, kv_format: str, smem: str = "big", n_sms: int = 132) -> tuple[str, str, str]:
    """The `CONFIGS` key `pick_config` uses: (head class, cache format, shared-memory class)."""
    fmt = "fp8_ds_mla" if kv_format == "fp8_ds_mla" else "bf16"
    if H > 16:
        return ("large", fmt, smem)
    return ("prefill-small" if T >= 4 * n_sms else "small", fmt, smem)


# sm_90 with Gluon: 17-128 heads go to the Gluon wgmma kernels (`mla_gluon_large`, NOTES.md rounds 4, 21 and 22):
# bf16 caches to the ping-pong kernel, fp8_ds_mla to the one with a dequantising producer ("dq", FlashMLA's sm_90
# fp8 decode plan), from GLUON_LARGE_MIN_HT tokens x heads. At 128-token decode and 4096-token prefill: on the H200
# the ping-pong kernel 1.9-2.0x the Triton kernel (round 5), on an H100 the dq kernel 2.1-2.4x (round 21). Below that
# (round 22, an H100, decode at B1-B128, 32 / 64 / 128 heads, both formats, outputs/bench/sweeps/
# large_small_batch_h100_06d1f89.json): from 512 tokens x heads the Gluon kernels took 0.41-0.78x the Triton kernel's
# time, in CUDA-graph replay and eager alike; below it, where both are bound by host time (most eager calls 25-36 us,
# against 12-35 us of GPU time), the Triton kernel's leaner host path won at 14 of the 18 shapes by 5-29 us a call,
# while in graph replay the Gluon kernels took 0.63-1.02x. One rule for both, so that a captured step computes what
# the same step does eagerly, bit for bit. Everything the CPU CI runs stays on Triton (Gluon has no interpreter).
# GLM5LIB_GLUON_LARGE=0 turns them off.
GLUON_LARGE_MIN_HT = 512
GLUON_LARGE_MODES = {"bf16": "pingpong", "fp8_ds_mla": "dq"}


def gluon_large_shape(T: int, H: int, kv_format: str, smem: str = "big") -> str | None:
    """The rule alone: the `mla_gluon_large` mode for a shape on an sm_90 GPU with Gluon (None: the Triton kernel).
    kv_format: "bf16" (bf16 rows) or "fp8_ds_mla"; anything else stays on Triton."""
    if smem != "big" or not 16 < H <= 128 or T * H < GLUON_LARGE_MIN_HT:
        return None
    return GLUON_LARGE_MODES.get(kv_format)


def gluon_large_enabled() -> bool:
    """GLM5LIB_GLUON_LARGE: 1 / on (the default) or 0 / off, read at each call."""
    value = os.environ.get("GLM5LIB_GLUON_LARGE", "1").strip().lower()
    if value in ("1", "on", "true", "yes", ""):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"GLM5LIB_GLUON_LARGE must be 0 / off or 1 / on, got {value!r}")


def gluon_large_name(kv_format: str) -> str:
    """The config name checks and the benchmark record for a case the Gluon kernel ran."""
    from glm5lib.kernels.mla_gluon_large import config_name

    return "gluon-" + config_name((64, 2, GLUON_LARGE_MODES[kv_format]))


@functools.lru_cache(maxsize=16)
def _gluon_large_ready(dev_type: str, dev_index: int | None) -> bool:
    if dev_type != "cuda" or common.INTERPRETED or common.FP8_SOFTWARE:
        return False
    if capability(torch.device(dev_type, dev_index)) != (9, 0):
        return False
    try:
        from glm5lib.kernels import mla_gluon_large
    except ImportError:  # pragma: no cover - depends on the installed Triton
        return False
    return mla_gluon_large.HAVE_GLUON


def gluon_large_ready(device: torch.device) -> bool:
    """This device runs the Gluon wgmma kernels: sm_90, Gluon in this Triton, not interpreted, hardware e4m3."""
    return _gluon_large_ready(device.type, device.index)


def gluon_large_route(T: int, H: int, kv_format: str, device: torch.device, q_dtype: torch.dtype,
                      kv_dtype: torch.dtype, aligned: bool = True) -> str | None:
    """What `sparse_mla` decides for a call: the Gluon mode, or None for the Triton kernel. kv_format as
    `sparse_mla` normalises it ("bf16" for bf16 / fp16 rows, "fp32", "fp8_ds_mla"); kv_dtype: the cache's element
    type; aligned: cache base and row stride are multiples of 16 bytes (every gather is a 16-byte cp.async)."""
    if q_dtype != torch.bfloat16 or not aligned or (kv_format == "bf16" and kv_dtype != torch.bfloat16):
        return None
    mode = gluon_large_shape(T, H, kv_format, smem_class(device))
    if mode is None or not gluon_large_ready(device) or not gluon_large_enabled():
        return None
    return mode


# 1-16 heads over an fp8_ds_mla cache, at least FP8MMA_MIN_T tokens, on sm_90 with Gluon: the fp8-cache kernel of
# `mla_gluon_fp8mma` in its fp16-product build (NOTES.md rounds 8-9; H200 at 33e8f55, one process,
# outputs/bench/fp8mma_h200.json: 0.73x / 0.64x the Triton kernel's decode time at B32 / B128 and 0.48x at prefill
# at 8 heads, 0.70-0.77x at 16). Fewer tokens stay on Triton: at B1 / B4 the kernel's GPU time is the Triton
# kernel's (1.02x / 0.98x in graph replay; 0.83x at B16) while an eager call costs 38 us of host time against 28-31
# (`sweeps/fp8mma_small_batch_h200_33e8f55.json`); so does every CPU run (no interpreter). No sm_89 / sm_120 GPU has
# run the kernel: GLM5LIB_FP8MMA=1 takes it there too (its one-slot fp16-product build for the 99 KB class, measured
# under that class on an H100 at 0.37-0.79x the time of the Triton kernel's 99 KB configs: `CONFIG_BY_CLASS`'
# comment), 0 turns it off.
FP8MMA_MIN_T = 32
# Under CUDA-graph capture a call's host time is paid once, at capture, and only the GPU time is replayed: there
# the kernel takes 8 tokens and more. Graph replay against the Triton kernel (outputs/bench/sweeps/
# fp8mma_small_batch_h200_2f2bff4.json): 8 heads 0.99x / 0.89x / 0.80x / 0.83x at B4 / B8 / B12 / B16, 16 heads
# 1.01x / 0.87x at B8 / B16.
FP8MMA_MIN_T_GRAPH = 8
FP8MMA_MAX_H = 16
FP8MMA_CAPS = {(9, 0)}  # measured; sm_89 / sm_120 only with GLM5LIB_FP8MMA=1


def fp8mma_mode() -> str:
    """GLM5LIB_FP8MMA: "auto" (unset: measured GPUs only), "on" (every sm_89+ GPU), "off"; read at each call."""
    value = os.environ.get("GLM5LIB_FP8MMA", "").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("1", "on", "true", "yes"):
        return "on"
    if value in ("0", "off", "false", "no"):
        return "off"
    raise ValueError(f"GLM5LIB_FP8MMA must be 0 / off, 1 / on or auto, got {value!r}")


def fp8mma_shape(T: int, H: int, kv_format: str, graph: bool = False) -> bool:
    """The rule alone: this shape goes to `mla_gluon_fp8mma` on a GPU that runs it; graph: the call is being
    captured into a CUDA graph (`capturing`: `FP8MMA_MIN_T_GRAPH` tokens suffice)."""
    min_t = FP8MMA_MIN_T_GRAPH if graph else FP8MMA_MIN_T
    return kv_format == "fp8_ds_mla" and 1 <= H <= FP8MMA_MAX_H and T >= min_t


@functools.lru_cache(maxsize=16)
def _fp8mma_ready(dev_type: str, dev_index: int | None, forced: bool) -> bool:
    if dev_type != "cuda" or common.INTERPRETED:
        return False
    cap = capability(torch.device(dev_type, dev_index))
    if forced and (cap < (8, 9) or common.FP8_SOFTWARE):  # said once per device (the result is cached)
        import warnings

        warnings.warn(f"GLM5LIB_FP8MMA=1 has no effect on sm_{cap[0]}{cap[1]}"
                      f"{' with GLM5LIB_FP8_SOFTWARE' if common.FP8_SOFTWARE else ''}: the kernel needs sm_89+ "
                      "hardware e4m3 (conversions and products); the Triton kernel runs", stacklevel=3)
    if common.FP8_SOFTWARE or (cap not in FP8MMA_CAPS and not (forced and cap >= (8, 9))):
        return False
    try:
        from glm5lib.kernels import mla_gluon_fp8mma
    except ImportError:  # pragma: no cover - depends on the installed Triton
        return False
    return mla_gluon_fp8mma.HAVE_GLUON


def fp8mma_route(T: int, H: int, kv_format: str, device: torch.device, q_dtype: torch.dtype,
                 aligned: bool = True, graph: bool = False):
    """What `sparse_mla` decides for a call: the `mla_gluon_fp8mma.Config` of the device's shared-memory class
    (`CONFIG_BY_CLASS`), or None. aligned: cache base and row stride are multiples of 16 bytes; graph: the call
    is being captured into a CUDA graph (`capturing`)."""
    if q_dtype != torch.bfloat16 or not aligned or not fp8mma_shape(T, H, kv_format, graph):
        return None
    mode = fp8mma_mode()
    if mode == "off" or not _fp8mma_ready(device.type, device.index, mode == "on"):
        return None
    smem = smem_class(device)
    if mode == "auto" and smem != "big":  # auto means sm_90's class: a forced 99 KB class stands for sm_89 / sm_120
        return None
    from glm5lib.kernels.mla_gluon_fp8mma import CONFIG_BY_CLASS

    return CONFIG_BY_CLASS[smem]


def fp8mma_name(cfg) -> str:
    from glm5lib.kernels.mla_gluon_fp8mma import config_name

    return config_name(cfg)


def dispatched(T: int, H: int, kv_format: str, device: torch.device,
               q_dtype: torch.dtype = torch.bfloat16, graph: bool = False) -> tuple[tuple[str, str, str], str]:
    """(key, config name) of what `sparse_mla` runs for a shape on a device, for q (and a bf16-format cache) in
    q_dtype with 16-byte aligned rows, as the case matrix and the benchmark build them: a `CONFIGS` entry,
    (("large-gluon", format, "big"), `gluon_large_name`) for the Gluon kernel (`gluon_large_route`), or
    (("small-fp8mma", "fp8_ds_mla", class), `fp8mma_name`) for the fp8-cache kernel (`fp8mma_route`). graph: as
    captured into a CUDA graph."""
    smem = smem_class(device)
    fmt = "fp8_ds_mla" if kv_format == "fp8_ds_mla" else "bf16"
    cfg8 = fp8mma_route(T, H, fmt, device, q_dtype, graph=graph)
    if cfg8:
        return ("small-fp8mma", fmt, smem), fp8mma_name(cfg8)
    if gluon_large_route(T, H, fmt, device, q_dtype, q_dtype if fmt == "bf16" else torch.uint8):
        return ("large-gluon", fmt, smem), gluon_large_name(fmt)
    key = config_key(T, H, fmt, smem, num_sms(device))
    return key, CONFIGS[key].name


def pick_num_splits(T: int, n_hblk: int, topk: int, block_n: int, n_sms: int, waves: int = 2, fit: bool = False) -> int:
    """Split the top-k list until about `waves` programs per SM are in flight (1 when T*heads already fill it).

    fit: round down, so that every program is resident at once when `waves` programs fit on an SM (H200, 2 per
    SM: B=128 -> 2 splits = 256 programs in one wave, where rounding up gave 3 splits = 1.45 waves).
    """
    base = T * n_hblk
    if base >= waves * n_sms:
        return 1
    max_splits = max(1, min(MAX_SPLITS, triton.cdiv(topk, block_n)))
    want = (waves * n_sms) // base if fit else triton.cdiv(waves * n_sms, base)
    return int(min(max_splits, max(1, want)))


def config_num_splits(T: int, H: int, topk: int, cfg: MLAConfig, device: torch.device) -> int:
    """The split count `sparse_mla` uses for `cfg` on `device` (cfg's waves and fit rule, the device's SM count)."""
    return pick_num_splits(T, triton.cdiv(H, cfg.block_h), topk, cfg.block_n, num_sms(device), cfg.waves, cfg.fit)


def _check_inputs(q, kv_cache, indices, d_v, kv_format):
    if q.dim() != 3 or q.shape[-1] != D_QK:
        raise ValueError(f"q must be [T, H, {D_QK}], got {tuple(q.shape)}")
    if not 1 <= q.shape[1] <= 128:
        raise ValueError(f"H must be in 1..128, got {q.shape[1]}")
    if d_v != D_NOPE:
        raise ValueError(f"d_v must be {D_NOPE} (the value is the latent part of the row), got {d_v}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"indices must be [T, topk] with T = {q.shape[0]}, got {tuple(indices.shape)}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32, got {indices.dtype}")
    if kv_format == "fp8_ds_mla":
        if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != FP8_DS_MLA_ROW_BYTES:
            raise ValueError(f"fp8_ds_mla cache must be uint8 rows of {FP8_DS_MLA_ROW_BYTES}, got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    elif kv_format in ("bf16", "fp16", "fp32"):  # fp32: the interpreter's stand-in for bf16
        if kv_cache.shape[-1] != D_QK or kv_cache.dtype != q.dtype:
            raise ValueError(f"{kv_format} cache must be rows of {D_QK} in q's dtype {q.dtype}, got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    else:
        raise ValueError(f"kv_format must be 'bf16' or 'fp8_ds_mla', got {kv_format!r}")


@functools.lru_cache(maxsize=4096)
def _plan(T: int, H: int, topk: int, kv_format: str, dev_type: str, dev_index: int | None,
          cfg: MLAConfig | None, num_splits: int | None) -> tuple[MLAConfig, int, int]:
    """(config, split count, keys per split) for a call shape: worked out once per shape, not on every launch
    (the eager path calls this for every layer of every step)."""
    dev = torch.device(dev_type, dev_index) if dev_index is not None else torch.device(dev_type)
    cfg = cfg or pick_config(T, H, topk, kv_format, smem_class(dev), num_sms(dev))
    if num_splits is None:
        num_splits = config_num_splits(T, H, topk, cfg, dev)
    return (cfg, *split_keys(topk, num_splits, cfg.block_n))


def split_keys(topk: int, num_splits: int, block_n: int) -> tuple[int, int]:
    """(split count, keys per split) for `num_splits` asked: each split a whole number of BLOCK_N tiles, and no split
    left empty (the count drops when rounding up to tiles covers the top-k list with fewer)."""
    keys_per_split = -(-(-(-max(topk, 1) // num_splits)) // block_n) * block_n
    return max(1, -(-topk // keys_per_split)), keys_per_split


@dataclass(frozen=True)
class _Launch:
    cfg: MLAConfig
    grid: tuple[int, int, int]
    keys_per_split: int
    kw: dict  # constexprs and launch options
    kw_key: tuple  # tuple(kw.values()), for the pre-bound launcher
    merge_grid: tuple[int, int, int]
    merge_kw: dict
    merge_kw_key: tuple


@functools.lru_cache(maxsize=4096)
def _launch_plan(T: int, H: int, topk: int, kv_format: str, dev_type: str, dev_index: int | None,
                 cfg: MLAConfig | None, num_splits: int | None, aligned: bool, exact_fp32: bool,
                 fp8_software: bool) -> _Launch:
    """Everything about a launch that follows from the call's shape (host code an eager layer runs once per shape)."""
    cfg, num_splits, keys_per_split = _plan(T, H, topk, kv_format, dev_type, dev_index, cfg, num_splits)
    dev = torch.device(dev_type, dev_index) if dev_index is not None else torch.device(dev_type)
    fp8 = kv_format == "fp8_ds_mla"
    pdl = num_splits > 1 and common.pdl(dev)  # the merge launched as the kernel's programmatic dependent
    kw = dict(KV_FP8=fp8, FP8_HW=fp8_hw(dev), SPLIT=num_splits > 1, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
              D_NOPE=D_NOPE, D_ROPE=D_ROPE, PREFETCH=cfg.prefetch, ALIGNED=fp8 and aligned,
              NOPE_F16=fp8 and cfg.nope_f16 and not exact_fp32,  # fp32 q: the interpreter's exact path
              DEQUANT=fp8 and cfg.dequant, IDX_AHEAD=cfg.idx_ahead, PDL=pdl,
              num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    sp, bh, bd = merge_tile(num_splits, H)
    merge_kw = dict(D_NOPE=D_NOPE, SP=sp, BLOCK_H=bh, BLOCK_D=bd, num_warps=4, **common.pdl_kw(pdl))
    del fp8_software  # part of the cache key only: fp8_hw reads it
    return _Launch(cfg, (T, -(-H // cfg.block_h), num_splits), keys_per_split, kw, tuple(kw.values()),
                   (T, -(-H // bh), D_NOPE // bd), merge_kw, tuple(merge_kw.values()))


_FWD = Prebound(_sparse_mla_fwd_kernel)

_MERGE = Prebound(_merge_splits_kernel)


def sparse_mla_launch(q, kv_cache, indices, sm_scale, *, kv_format="bf16", out=None,
                      config: MLAConfig | None = None, num_splits: int | None = None):
    """`sparse_mla` with the configuration and split count chosen by the caller (tests and benchmarks).

    Written for host time: an eager decode layer calls it once per layer and step, so everything that follows
    from the shape is looked up in `_launch_plan`, and the launch goes through the pre-bound launcher."""
    T, H, _ = q.shape
    topk = indices.shape[1]
    stride_kv, n_rows = kv_row_geometry(kv_cache)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if indices.stride(-1) != 1:
        indices = indices.contiguous()
    dev = q.device
    if out is None:
        out = torch.empty(T, H, D_NOPE, dtype=q.dtype, device=dev)
    elif out.shape != (T, H, D_NOPE) or out.stride(-1) != 1:
        raise ValueError(f"out must be [T, H, {D_NOPE}] with contiguous rows, got {tuple(out.shape)}")
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    if T == 0:
        return out, lse
    fp8 = kv_format == "fp8_ds_mla"
    base = kv_cache.data_ptr()
    if fp8 and (stride_kv % 4 or base % 4):  # the kernel reads the fp32 scales and bf16 rope through pointer casts
        raise ValueError("fp8_ds_mla rows must start on 4-byte boundaries")
    plan = _launch_plan(T, H, topk, kv_format, dev.type, dev.index, config, num_splits,
                        stride_kv % 16 == 0 and base % 16 == 0, q.dtype == torch.float32, common.FP8_SOFTWARE)
    grid = plan.grid
    splits = grid[2]
    part = torch.empty(splits * T * H * (D_NOPE + 1), dtype=torch.float32, device=dev) if splits > 1 else lse
    ints = (q.stride(0), q.stride(1), stride_kv, indices.stride(0), out.stride(0), out.stride(1), H, topk, n_rows,
            plan.keys_per_split)
    # what Triton specializes on, exactly: dtypes, 16-byte alignment of every pointer, the int values themselves
    aligned = (q.data_ptr() % 16 == 0, base % 16 == 0, indices.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0)
    spec = (q.dtype, kv_cache.dtype, indices.dtype, out.dtype, aligned, ints)
    _FWD.launch(grid, (q, kv_cache, indices, out, lse, part, *ints[:6], H, *ints[6:], float(sm_scale) * LOG2E),
                plan.kw, plan.kw_key, dev.index, spec)  # lse: a fresh [T, H], so its row stride is H
    if splits > 1:
        _MERGE.launch(plan.merge_grid, (part, out, lse, out.stride(0), out.stride(1), H, H, splits),
                      plan.merge_kw, plan.merge_kw_key, dev.index, (out.dtype, aligned[3], ints[4:7], splits))
    return out, lse


def sparse_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    d_v: int = D_NOPE,
    kv_format: str = "bf16",
    block_size: int | None = None,
    out: torch.Tensor | None = None,
    decode: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA forward over gathered cache rows.

    q: `[T, H, 576]` bf16/fp16 (absorbed: 512 latent + 64 rope), H in 1..128.
    kv_cache: `[N, 576]` (bf16/fp16), `[N, 656]` uint8 (`kv_format="fp8_ds_mla"`), or a paged view
      `[num_blocks, block_size, (1,) row]` whose block stride may exceed block_size rows.
    indices: int32 `[T, topk]` physical rows; -1 or >= N (or beyond the last block) means "no key".
    Returns `(out [T, H, 512] in q's dtype, lse [T, H] fp32 natural log)`; a row with no key gives zeros
    and lse = -inf.
    decode: every token is its request's only query token, so no two tokens gather the same request's rows (a decode
      step without speculative tokens; the fp8-cache kernel's key-warps rule reads it at 1-8 heads,
      `mla_gluon_fp8mma.plan_key_warps`); None: taken as so while a CUDA graph is being captured (vLLM captures
      decode batches) and not otherwise.

    On sm_90 with Gluon, 17-128 heads and at least `GLUON_LARGE_MIN_HT` tokens x heads (bf16 q, bf16 or fp8_ds_mla
    rows on 16-byte boundaries) run the Gluon wgmma kernels of `mla_gluon_large` (`gluon_large_route`), 1-16 heads
    over an fp8_ds_mla cache and at least `FP8MMA_MIN_T` tokens (`FP8MMA_MIN_T_GRAPH` under CUDA-graph capture) the
    fp8-cache kernel of `mla_gluon_fp8mma` (`fp8mma_route`); everything else the Triton kernel below.
    """
    fmt = "bf16" if kv_format == "fp16" else kv_format
    _check_inputs(q, kv_cache, indices, d_v, kv_format)
    if block_size is not None and kv_cache.dim() >= 3 and kv_cache.shape[1] != block_size:
        raise ValueError(f"block_size {block_size} does not match the cache view's {kv_cache.shape[1]}")
    T, H, _ = q.shape
    graph = False
    gluon_fp8 = fp8mma_shape(T, H, fmt)
    if not gluon_fp8 and fp8mma_shape(T, H, fmt, graph=True) and capturing(q.device):  # asked only when it matters
        gluon_fp8 = graph = True
    large = q.is_cuda and H > 16 and T * H >= GLUON_LARGE_MIN_HT
    if q.is_cuda and (gluon_fp8 or large):
        # every Gluon gather is a 16-byte cp.async
        aligned = kv_cache.data_ptr() % 16 == 0 and (kv_row_geometry(kv_cache)[0] * kv_cache.element_size()) % 16 == 0
    if gluon_fp8 and q.is_cuda:
        cfg8 = fp8mma_route(T, H, fmt, q.device, q.dtype, aligned, graph)
        if cfg8:
            from glm5lib.kernels.mla_gluon_fp8mma import config_kwargs, sparse_mla_fp8mma

            if decode is None:  # asked only where the rule reads it (1-8 heads)
                decode = graph or (H <= 8 and capturing(q.device))
            return sparse_mla_fp8mma(q, kv_cache, indices, sm_scale, **config_kwargs(cfg8), out=out, decode=decode)
    if large:
        mode = gluon_large_route(T, H, fmt, q.device, q.dtype, kv_cache.dtype, aligned)
        if mode:
            from glm5lib.kernels.mla_gluon_large import sparse_mla_gluon_large

            return sparse_mla_gluon_large(q, kv_cache, indices, sm_scale, kv_format=fmt, mode=mode, out=out)
    return sparse_mla_launch(q, kv_cache, indices, sm_scale, kv_format=fmt, out=out)


def sparse_mla_flops(T: int, H: int, topk: int) -> float:
    """Useful FLOPs: QK^T over 576 plus PV over 512 for every (token, head, key)."""
    return 2.0 * T * H * topk * (D_QK + D_NOPE)


def sparse_mla_kv_bytes(T: int, topk: int, kv_format: str) -> float:
    """Gathered cache bytes, each row counted once per token (what decode must move)."""
    row = FP8_DS_MLA_ROW_BYTES if kv_format == "fp8_ds_mla" else 2 * D_QK
    return float(T) * topk * row


__all__ = ["sparse_mla", "sparse_mla_launch", "CONFIGS", "MLAConfig", "pick_config", "pick_num_splits",
           "dispatched", "gluon_large_shape", "gluon_large_route", "gluon_large_ready", "gluon_large_enabled",
           "gluon_large_name", "GLUON_LARGE_MIN_HT", "fp8mma_route", "fp8mma_shape", "fp8mma_mode", "fp8mma_name",
           "FP8MMA_MIN_T", "FP8MMA_MIN_T_GRAPH", "capturing",
           "config_num_splits", "sparse_mla_flops", "sparse_mla_kv_bytes", "set_pdl"]
