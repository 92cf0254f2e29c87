"""Triton GEMM / grouped-expert kernels on GGUF-quantized weights, dequantized in registers.

`gguf_matmul(x [M, K], w uint8 [N, row_bytes], qtype, N)` -> `[M, N]` and
`gguf_moe(x, w13 [E, 2I, row_bytes], w2 [E, K, row_bytes], topk_weights, topk_ids, type13, type2)` -> `[M, K]`.
The fp32 twins are in `glm5lib.kernels.gguf_naive`. Weights stay as GGUF stores them: each row is a run of
llama.cpp blocks (Q4_K / Q5_K / Q6_K: 256 values in 144 / 176 / 210 bytes; Q8_0 / Q4_0 / Q5_0: 32 values in
34 / 18 / 22 bytes), the layout gguf-py's `gguf.quants` reads.

Why by hand: vllm-gguf-plugin's CUDA kernels quantize the activations to int8 and use dp4a (no tensor cores)
and its Triton kernels dequantize element by element; this is the tensor-core formulation. Measured on the H200
it is correct but slower than a bf16 matmul of the dequantized weight at every batch and than the plugin's MMVQ
at batch 1 (docs/kernels.md, "GGUF kernels": the numbers and what bounds them).

How a tile is computed (one program: `BLOCK_M` activation rows x `BLOCK_N` weight rows x a range of k):
- one loop iteration covers 256 values per row: a K-quant super-block, or 8 blocks of 32 for Q8_0 / Q4_0 /
  Q5_0 when K is a multiple of 256 (else one block);
- the bytes load as `[BLOCK_N, groups, width]` tiles (groups = the sub-blocks that share a scale), codes are
  unpacked with integer ops and turned into exact fp32 by OR-ing them into the mantissa of 2**23 (no int->float
  conversion instruction: that unit runs at a quarter rate on sm_90), scaled per group in fp32, rounded to the
  dot dtype and multiplied by the matching activation columns in one to four tensor-core dots of K = 64..256;
  a large K per dot matters: each dot stages its operands through shared memory behind a barrier, and the
  first version's dots per 32-value sub-block were bound by those barriers (docs/kernels.md);
- decode shapes with few weight-row tiles split k across programs (`waves`), writing fp32 partials that a
  second launch sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from glm5lib.kernels.common import capability, num_sms  # noqa: F401  (before triton: interpreter switch)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from glm5lib.errors import UserError  # noqa: E402

# GGML type ids (gguf.GGMLQuantizationType) -> (values per block, bytes per block, code bits)
# Type ids, values and bytes per block from gguf-py (the one table of ggml types); bits per code are the kernels'.
_BITS = {"Q4_0": 4, "Q5_0": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6}
Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K = (int(GGMLQuantizationType[n]) for n in _BITS)
QTYPES = {int(GGMLQuantizationType[n]): (*GGML_QUANT_SIZES[GGMLQuantizationType[n]], bits) for n, bits in _BITS.items()}
QTYPE_NAMES = {int(GGMLQuantizationType[n]): n for n in _BITS}


@dataclass(frozen=True)
class GGUFConfig:
    """One launch configuration (the benchmark sweeps these; tests AOT-compile the shipped ones)."""

    block_m: int = 16
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    waves: float = 2.0  # split k until about this many programs per SM (<= 1: never split)

    @property
    def name(self) -> str:
        return f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}-v{self.waves:g}"


# Shipped configs by (activation-row class, shared-memory class): "big" is sm_90 / sm_100 (227 KB per block),
# "small" the 99 KB of sm_89 / sm_120 (and sm_80). Decode and large picked from the H200 sweep (docs/kernels.md
# "GGUF kernels"); "small" (17-32 rows) and the "small" shared-memory class are unmeasured.
CONFIGS = {
    ("decode", "big"): GGUFConfig(16, 64, 4, 4, 4.0),
    ("small", "big"): GGUFConfig(32, 64, 4, 3, 2.0),
    ("large", "big"): GGUFConfig(64, 128, 8, 3, 2.0),
    ("decode", "small"): GGUFConfig(16, 64, 4, 4, 4.0),
    ("small", "small"): GGUFConfig(32, 64, 4, 3, 2.0),
    ("large", "small"): GGUFConfig(64, 64, 4, 2, 1.0),
    ("moe13", "big"): GGUFConfig(16, 32, 4, 3, 1.0),
    ("moe2", "big"): GGUFConfig(16, 64, 4, 3, 1.0),
    ("moe13", "small"): GGUFConfig(16, 32, 4, 3, 1.0),
    ("moe2", "small"): GGUFConfig(16, 64, 4, 3, 1.0),
}


def smem_class(device: torch.device) -> str:
    if device.type != "cuda":
        return "big"
    return "big" if capability(device) in ((9, 0), (10, 0)) else "small"


def pick_config(m: int, device: torch.device = torch.device("cpu")) -> GGUFConfig:
    rows = "decode" if m <= 16 else ("small" if m <= 32 else "large")
    return CONFIGS[(rows, smem_class(device))]


# ---------------------------------------------------------------------------------------------------- device code


@triton.jit
def _dot(acc, X, x_row, m_mask, koff, w3, KT: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
         IEEE: tl.constexpr):
    """acc += x[:, koff] @ reshape(w3, [BLOCK_N, KT])^T; koff [KT] are the activation columns of w3's values."""
    xs = tl.load(X + x_row[:, None] + koff[None, :], mask=m_mask[:, None], other=0.0).to(DOT)
    w = tl.reshape(w3, [BLOCK_N, KT]).to(DOT)
    if IEEE:
        return tl.dot(xs, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(xs, tl.trans(w), acc)


@triton.jit
def _codes_f32(u, OFFSET: tl.constexpr):
    """Unsigned integer codes (< 2**23) minus OFFSET as exact fp32, without the quarter-rate int->float
    conversion: the code OR-ed into the mantissa of 2**23 is 2**23 + code."""
    return (u.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)


@triton.jit
def _f16(WH, byte_off):
    """fp16 at even byte offsets, as fp32."""
    return tl.load(WH + byte_off // 2).to(tl.float32)


@triton.jit
def _k4_scales(W, base3, t):
    """Q4_K / Q5_K 6-bit (scale, min) of sub-blocks j (a [1, G, 1] tensor of j values) from the 12 packed bytes
    at base + 4 (llama.cpp's get_scale_min_k4, vectorized over j)."""
    a = tl.load(W + base3 + 4 + t % 4)
    b = tl.load(W + base3 + 8 + t % 4)
    first = t < 4
    c = tl.load(W + base3 + 12 + t % 4)
    sc = tl.where(first, a & 63, (c & 15) | ((a >> 6) << 4))
    mn = tl.where(first, b & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _qrows(acc, W, WH, row_off, X, x_row, m_mask, kb0, kb1,
           QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr, BLOCK_N: tl.constexpr,
           DOT: tl.constexpr, IEEE: tl.constexpr, G: tl.constexpr):
    """acc += x[:, k range] @ w[rows, k range]^T for one weight-row tile (row_off: byte offsets of the rows).

    One iteration covers 256 values (a K-quant super-block, or G = 8 blocks of 32): the bytes load as
    [BLOCK_N, groups, width] tiles, are scaled per group into fp32, rounded to the dot dtype and multiplied
    by the matching activation columns in one or a few tensor-core dots of K = 64..256.
    """
    b3 = row_off[:, None, None]
    for kb in range(kb0, kb1):
        base3 = b3 + kb * BLOCK_BYTES  # [BLOCK_N, 1, 1] int64
        k0 = kb * QK * G
        if QTYPE == 12 or QTYPE == 13:  # Q4_K / Q5_K: d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
            g = tl.arange(0, 4)[None, :, None]  # 32-byte chunk c of qs: low nibbles = sub-block 2c, high = 2c+1
            l = tl.arange(0, 32)[None, None, :]
            d = _f16(WH, base3)
            dmin = _f16(WH, base3 + 2)
            QS: tl.constexpr = 16 if QTYPE == 12 else 48
            q = tl.load(W + base3 + QS + 32 * g + l)
            u_lo = q & 15
            u_hi = q >> 4
            if QTYPE == 13:
                qh = tl.load(W + base3 + 16 + l)
                u_lo = u_lo | (((qh >> (2 * g).to(tl.uint8)) & 1) << 4)
                u_hi = u_hi | (((qh >> (2 * g + 1).to(tl.uint8)) & 1) << 4)
            sc, mn = _k4_scales(W, base3, 2 * g)
            w = _codes_f32(u_lo, 0.0) * (d * sc) - dmin * mn
            koff = tl.reshape(k0 + 64 * g + l, [128])
            acc = _dot(acc, X, x_row, m_mask, koff, w, 128, BLOCK_N, DOT, IEEE)
            sc, mn = _k4_scales(W, base3, 2 * g + 1)
            w = _codes_f32(u_hi, 0.0) * (d * sc) - dmin * mn
            acc = _dot(acc, X, x_row, m_mask, koff + 32, w, 128, BLOCK_N, DOT, IEEE)
        elif QTYPE == 14:  # Q6_K: ql[128], qh[64], int8 scales[16] (one per 16 values), d; codes - 32
            g = tl.arange(0, 4)[None, :, None]  # (n, h) = (g // 2, g % 2): 128-value half n, 16-value half h
            l = tl.arange(0, 16)[None, None, :]
            n = g // 2
            hh = g % 2
            d = _f16(WH, base3 + 208)
            qh = tl.load(W + base3 + 128 + 32 * n + 16 * hh + l)
            for p in tl.static_range(2):
                ql = tl.load(W + base3 + 64 * n + 32 * p + 16 * hh + l)
                for nib in tl.static_range(2):
                    # 32-value quarter p + 2 * nib of each 128-value half
                    u = ((ql >> (4 * nib)) & 15) | (((qh >> (2 * (p + 2 * nib))) & 3) << 4)
                    sc = tl.load(W + base3 + 192 + 8 * n + 2 * (p + 2 * nib) + hh).to(tl.int8, bitcast=True)
                    w = _codes_f32(u, 32.0) * (d * sc.to(tl.float32))
                    koff = tl.reshape(k0 + 128 * n + 32 * (p + 2 * nib) + 16 * hh + l, [64])
                    acc = _dot(acc, X, x_row, m_mask, koff, w, 64, BLOCK_N, DOT, IEEE)
        elif QTYPE == 8:  # Q8_0: G blocks of (d, int8 qs[32])
            g = tl.arange(0, G)[None, :, None]
            l = tl.arange(0, 32)[None, None, :]
            d = _f16(WH, base3 + 34 * g)
            u = tl.load(W + base3 + 34 * g + 2 + l) ^ 0x80  # code = q + 128
            w = _codes_f32(u, 128.0) * d
            koff = tl.reshape(k0 + 32 * g + l, [G * 32])
            acc = _dot(acc, X, x_row, m_mask, koff, w, G * 32, BLOCK_N, DOT, IEEE)
        elif QTYPE == 2:  # Q4_0: G blocks of (d, qs[16]); value j: low nibble of qs[j], j + 16: high nibble; - 8
            g = tl.arange(0, G)[None, :, None]
            l = tl.arange(0, 16)[None, None, :]
            d = _f16(WH, base3 + 18 * g)
            q = tl.load(W + base3 + 18 * g + 2 + l)
            koff = tl.reshape(k0 + 32 * g + l, [G * 16])
            acc = _dot(acc, X, x_row, m_mask, koff, _codes_f32(q & 15, 8.0) * d, G * 16, BLOCK_N, DOT, IEEE)
            acc = _dot(acc, X, x_row, m_mask, koff + 16, _codes_f32(q >> 4, 8.0) * d, G * 16, BLOCK_N, DOT, IEEE)
        else:  # Q5_0: G blocks of (d, qh 32 bits little endian, qs[16]); bit j / j + 16 of qh: 5th bit; - 16
            g = tl.arange(0, G)[None, :, None]
            l = tl.arange(0, 16)[None, None, :]
            d = _f16(WH, base3 + 22 * g)
            q = tl.load(W + base3 + 22 * g + 6 + l)
            bit = (l % 8).to(tl.uint8)
            h_lo = tl.load(W + base3 + 22 * g + 2 + l // 8)
            h_hi = tl.load(W + base3 + 22 * g + 4 + l // 8)
            koff = tl.reshape(k0 + 32 * g + l, [G * 16])
            u = (q & 15) | (((h_lo >> bit) & 1) << 4)
            acc = _dot(acc, X, x_row, m_mask, koff, _codes_f32(u, 16.0) * d, G * 16, BLOCK_N, DOT, IEEE)
            u = (q >> 4) | (((h_hi >> bit) & 1) << 4)
            acc = _dot(acc, X, x_row, m_mask, koff + 16, _codes_f32(u, 16.0) * d, G * 16, BLOCK_N, DOT, IEEE)
    return acc


@triton.jit
def _gguf_mm_kernel(X, W, WH, Y, M, N, stride_xm, stride_wn, stride_ys, stride_ym, KB, KB_PER_SPLIT,
                    QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
                    G: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    x_row = tl.minimum(offs_m, M - 1).to(tl.int64) * stride_xm
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    row_off = tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn  # rows past N read row N-1, not stored
    kb0 = pid_s * KB_PER_SPLIT
    kb1 = tl.minimum(kb0 + KB_PER_SPLIT, KB)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = _qrows(acc, W, WH, row_off, X, x_row, m_mask, kb0, kb1, QTYPE, BLOCK_BYTES, QK, BLOCK_N, DOT, IEEE, G)
    mask = m_mask[:, None] & n_mask[None, :]
    ptrs = Y + pid_s * stride_ys + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    if SPLIT:
        tl.store(ptrs, acc, mask=mask)
    else:
        tl.store(ptrs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _sum_splits_kernel(P, Y, MN, S: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(P + s * MN + offs, mask=mask, other=0.0)
    tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _moe_w13_kernel(X, W, WH, A, SORTED, BLOCK_E, stride_xm, stride_we, stride_wn, stride_am, I, KB, TOPK,
                    QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
                    G: tl.constexpr):
    """A[pair, n] = silu(x[tok] . w13[e, n]) * (x[tok] . w13[e, I + n]) for the pairs of one expert block."""
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    e = tl.load(BLOCK_E + pid_b)
    if e < 0:
        return
    pair = tl.load(SORTED + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = pair >= 0
    x_row = (tl.where(m_mask, pair, 0) // TOPK).to(tl.int64) * stride_xm
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    rows = tl.minimum(offs_n, I - 1).to(tl.int64)
    ebase = e.to(tl.int64) * stride_we
    g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    g = _qrows(g, W, WH, ebase + rows * stride_wn, X, x_row, m_mask, 0, KB, QTYPE, BLOCK_BYTES, QK, BLOCK_N, DOT,
               IEEE, G)
    u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    u = _qrows(u, W, WH, ebase + (rows + I) * stride_wn, X, x_row, m_mask, 0, KB, QTYPE, BLOCK_BYTES, QK, BLOCK_N,
               DOT, IEEE, G)
    a = g / (1.0 + tl.exp(-g)) * u
    ptrs = A + tl.where(m_mask, pair, 0).to(tl.int64)[:, None] * stride_am + offs_n[None, :]
    tl.store(ptrs, a, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _moe_w2_kernel(A, W, WH, Y, TW, SORTED, BLOCK_E, stride_am, stride_we, stride_wn, stride_ym, N, KB,
                   QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
                   G: tl.constexpr):
    """Y[pair, n] = topk_weight[pair] * (A[pair] . w2[e, n]) for the pairs of one expert block."""
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    e = tl.load(BLOCK_E + pid_b)
    if e < 0:
        return
    pair = tl.load(SORTED + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = pair >= 0
    p = tl.where(m_mask, pair, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = _qrows(acc, W, WH, e.to(tl.int64) * stride_we + rows * stride_wn, A, p * stride_am, m_mask, 0, KB, QTYPE,
                 BLOCK_BYTES, QK, BLOCK_N, DOT, IEEE, G)
    tw = tl.load(TW + p, mask=m_mask, other=0.0).to(tl.float32)
    tl.store(Y + p[:, None] * stride_ym + offs_n[None, :], acc * tw[:, None], mask=m_mask[:, None] & n_mask[None, :])


# ------------------------------------------------------------------------------------------------------ host code


def _check_qtype(qtype: int) -> tuple[int, int, int]:
    if int(qtype) not in QTYPES:
        raise UserError(f"GGUF kernels: unsupported quantization type {qtype} "
                        f"(supported: {', '.join(QTYPE_NAMES[t] for t in QTYPES)})")
    return QTYPES[int(qtype)]


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one GGUF row of k values."""
    qk, bb, _ = _check_qtype(qtype)
    if k % qk:
        raise UserError(f"GGUF kernels: a {QTYPE_NAMES[int(qtype)]} row needs a multiple of {qk} values, got {k}")
    return k // qk * bb


def _dot_mode(x_dtype: torch.dtype) -> tuple[object, bool]:
    """(Triton dot dtype, ieee fp32) for activations of x_dtype."""
    if x_dtype == torch.float32:
        return tl.float32, True
    return (tl.float16 if x_dtype == torch.float16 else tl.bfloat16), False


def _group(qtype: int, k: int) -> tuple[int, int, int]:
    """(G, bytes per iteration, iterations per row): 8 blocks of 32 per iteration where K allows it."""
    qk, bb, _ = QTYPES[int(qtype)]
    g = 8 if qk == 32 and k % 256 == 0 else 1
    return g, bb * g, k // (qk * g)


def _num_splits(tiles: int, kb: int, device: torch.device, waves: float) -> int:
    if waves <= 1.0 or tiles >= waves * num_sms(device):
        return 1
    return max(1, min(kb, int(waves * num_sms(device) // tiles)))


def gguf_matmul(x: torch.Tensor, w: torch.Tensor, qtype: int, n: int, *, config: GGUFConfig | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(w)^T. x: [M, K] fp32/fp16/bf16; w: uint8 [n, row_bytes] GGUF rows of type qtype."""
    qk = _check_qtype(qtype)[0]
    if x.dim() != 2 or w.dim() != 2 or w.dtype != torch.uint8:
        raise UserError(f"gguf_matmul: x must be [M, K] and w uint8 [N, row_bytes], got {tuple(x.shape)} "
                        f"and {tuple(w.shape)} {w.dtype}")
    m, k = x.shape
    if w.shape[0] != n or w.shape[1] != row_bytes(qtype, k):
        raise UserError(f"gguf_matmul: w is {tuple(w.shape)}, expected ({n}, {row_bytes(qtype, k)}) for "
                        f"{QTYPE_NAMES[int(qtype)]} rows of {k} values")
    if w.stride(1) != 1 or w.stride(0) % 2:
        raise UserError("gguf_matmul: w rows must be contiguous with an even row stride")
    cfg = config or pick_config(m, x.device)
    x = x.contiguous()
    g, it_bytes, kb = _group(qtype, k)
    dot, ieee = _dot_mode(x.dtype)
    tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m)
    split = _num_splits(tiles, kb, x.device, cfg.waves)
    kb_per = triton.cdiv(kb, split)
    split = triton.cdiv(kb, kb_per)
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    target = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), split)
    _gguf_mm_kernel[grid](x, w, w.view(torch.float16), target, m, n, x.stride(0), w.stride(0),
                          m * n if split > 1 else 0, n, kb, kb_per,
                          QTYPE=int(qtype), BLOCK_BYTES=it_bytes, QK=qk, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                          DOT=dot, IEEE=ieee, G=g, SPLIT=split > 1,
                          num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](target, y, m * n, S=split, BLOCK=block, num_warps=4)
    return y


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group (token, slot) pairs by expert in blocks of block_m, without a host sync.

    Returns `sorted_pairs` [blocks * block_m] (pair id = token * top_k + slot, -1 = padding) and `block_expert`
    [blocks] (-1 = unused block). blocks = pairs // block_m + min(E, pairs) bounds sum_e ceil(count_e / block_m).
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    blocks = pairs // block_m + min(num_experts, pairs)
    sorted_e, order = torch.sort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    nblk = (counts + block_m - 1) // block_m
    first_blk = torch.cumsum(nblk, 0) - nblk
    first_pos = torch.cumsum(counts, 0) - counts
    pos = torch.arange(pairs, device=flat.device) - first_pos[sorted_e]
    blk = first_blk[sorted_e] + pos // block_m
    sorted_pairs = torch.full((blocks * block_m,), -1, dtype=torch.int32, device=flat.device)
    sorted_pairs[blk * block_m + pos % block_m] = order.to(torch.int32)
    block_expert = torch.full((blocks,), -1, dtype=torch.int32, device=flat.device)
    block_expert[blk] = sorted_e.to(torch.int32)
    return sorted_pairs, block_expert


def gguf_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor, type13: int, type2: int, activation: str = "silu", *,
             config13: GGUFConfig | None = None, config2: GGUFConfig | None = None) -> torch.Tensor:
    """sum_slot topk_weights * (act(x @ w13[e]^T) @ w2[e]^T) with e = topk_ids, GGUF weights as stored.

    x [M, K]; w13 uint8 [E, 2I, row_bytes(type13, K)] (gate rows then up rows); w2 uint8 [E, K, row_bytes(type2, I)];
    topk_weights / topk_ids [M, top_k]. activation: "silu" (silu(gate) * up).
    """
    if activation != "silu":
        raise UserError(f"gguf_moe: activation {activation!r} is not supported (silu only)")
    qk1 = _check_qtype(type13)[0]
    qk2 = _check_qtype(type2)[0]
    m, k = x.shape
    e, two_i, rb1 = w13.shape
    inter = two_i // 2
    if rb1 != row_bytes(type13, k) or tuple(w2.shape) != (e, k, row_bytes(type2, inter)):
        raise UserError(f"gguf_moe: w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} do not match x [{m}, {k}] with "
                        f"{QTYPE_NAMES[int(type13)]} / {QTYPE_NAMES[int(type2)]} rows")
    top_k = topk_ids.shape[1]
    c13 = config13 or CONFIGS[("moe13", smem_class(x.device))]
    c2 = config2 or CONFIGS[("moe2", smem_class(x.device))]
    if c13.block_m != c2.block_m:
        raise ValueError("gguf_moe: both configs must group pairs in blocks of the same size")
    x = x.contiguous()
    sorted_pairs, block_expert = moe_align(topk_ids, e, c13.block_m)
    nblocks = block_expert.numel()
    a = torch.empty(m * top_k, inter, dtype=torch.float32, device=x.device)
    dot, ieee = _dot_mode(x.dtype)
    g1, it1, kb1 = _group(type13, k)
    _moe_w13_kernel[(triton.cdiv(inter, c13.block_n), nblocks)](
        x, w13, w13.view(torch.float16), a, sorted_pairs, block_expert, x.stride(0), w13.stride(0), w13.stride(1),
        a.stride(0), inter, kb1, top_k, QTYPE=int(type13), BLOCK_BYTES=it1, QK=qk1, BLOCK_M=c13.block_m,
        BLOCK_N=c13.block_n, DOT=dot, IEEE=ieee, G=g1,
        num_warps=c13.num_warps, num_stages=c13.num_stages)
    yp = torch.empty(m * top_k, k, dtype=torch.float32, device=x.device)
    g2, it2, kb2 = _group(type2, inter)
    tw = topk_weights.reshape(-1).contiguous()
    _moe_w2_kernel[(triton.cdiv(k, c2.block_n), nblocks)](
        a, w2, w2.view(torch.float16), yp, tw, sorted_pairs, block_expert, a.stride(0), w2.stride(0), w2.stride(1),
        yp.stride(0), k, kb2, QTYPE=int(type2), BLOCK_BYTES=it2, QK=qk2, BLOCK_M=c2.block_m,
        BLOCK_N=c2.block_n, DOT=dot, IEEE=ieee, G=g2,
        num_warps=c2.num_warps, num_stages=c2.num_stages)
    return yp.view(m, top_k, k).sum(1).to(x.dtype)


def aot_specs(arch: int, qtypes=None) -> list:
    """`compile_report.KernelSpec`s of every shipped GGUF (kernel, config, type) for `arch` (bf16 activations,
    K = 6144 for the dense and w13 kernels, 256 for w2)."""
    from glm5lib.kernels.compile_report import KernelSpec, _sig

    smem = "big" if arch in (90, 100) else "small"
    qts = [q for q in QTYPES if qtypes is None or q in qtypes]
    specs = []
    div = ("X", "W", "WH", "Y", "stride_xm", "stride_wn", "stride_ym")
    for rows in ("decode", "small", "large"):
        cfg = CONFIGS[(rows, smem)]
        for qt in qts:
            qk = QTYPES[qt][0]
            for split in ((False, True) if rows == "decode" else (False,)):
                g, it, _ = _group(qt, 6144)
                consts = {"QTYPE": qt, "BLOCK_BYTES": it, "QK": qk, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                          "DOT": tl.bfloat16, "IEEE": False, "G": g, "SPLIT": split}
                types = {"X": "*bf16", "W": "*u8", "WH": "*fp16", "Y": "*fp32" if split else "*bf16"}
                specs.append(KernelSpec(f"gguf_mm[{rows}:{cfg.name}:{QTYPE_NAMES[qt]}{':split' if split else ''}]",
                                        _gguf_mm_kernel, _sig(_gguf_mm_kernel, types, consts), consts,
                                        cfg.num_warps, cfg.num_stages, div))
    for kname, fn, k in (("moe13", _moe_w13_kernel, 6144), ("moe2", _moe_w2_kernel, 256)):
        cfg = CONFIGS[(kname, smem)]
        for qt in qts:
            g, it, _ = _group(qt, k)
            consts = {"QTYPE": qt, "BLOCK_BYTES": it, "QK": QTYPES[qt][0], "BLOCK_M": cfg.block_m,
                      "BLOCK_N": cfg.block_n, "DOT": tl.bfloat16, "IEEE": False, "G": g}
            types = {"X": "*bf16", "A": "*fp32", "W": "*u8", "WH": "*fp16", "Y": "*fp32", "TW": "*fp32",
                     "SORTED": "*i32", "BLOCK_E": "*i32"}
            specs.append(KernelSpec(f"gguf_{kname}[{cfg.name}:{QTYPE_NAMES[qt]}]", fn, _sig(fn, types, consts), consts,
                                    cfg.num_warps, cfg.num_stages,
                                    tuple(a for a in ("X", "A", "W", "WH", "Y") if a in fn.arg_names)))
    return specs
