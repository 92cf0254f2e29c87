"""Triton GEMM / grouped-expert kernels on GGUF-quantized weights, dequantized in registers.

`gguf_matmul(x [M, K], w uint8 [N, row_bytes], qtype, N)` -> `[M, N]` and
`gguf_moe(x, w13 [E, 2I, row_bytes], w2 [E, K, row_bytes], topk_weights, topk_ids, type13, type2)` -> `[M, K]`.
The fp32 twins are in `glm5lib.kernels.gguf_naive`. Weights stay as GGUF stores them: each row is a run of
llama.cpp blocks (Q4_K / Q5_K / Q6_K: 256 values in 144 / 176 / 210 bytes; Q8_0 / Q4_0 / Q5_0: 32 values in
34 / 18 / 22 bytes), the layout gguf-py's `gguf.quants` reads.

Why by hand: vllm-gguf-plugin's CUDA kernels quantize the activations to int8 and use dp4a (no tensor cores),
its Triton kernels dequantize element by element; neither reaches the memory rate at decode (NOTES.md).

How a tile is computed (one program: `BLOCK_M` activation rows x `BLOCK_N` weight rows x a range of blocks):
- the quantized bytes of one sub-block (32 values, 16 for Q6_K / Q4_0 / Q5_0 halves) load as a contiguous
  `[BLOCK_N, 32]` byte tile; nibbles / high bits are unpacked with integer ops;
- small M (`scale_in_w=False`): the unsigned integer codes become dot operands by OR-ing them into the mantissa
  of a constant (bf16 0x4300 = 128 + q for codes < 128; fp16 0x6400 = 1024 + q for codes < 1024), exact and
  without an int->float conversion instruction (a quarter-rate unit on sm_90); the per-sub-block scale,
  zero point / minimum and the constant are applied once per [BLOCK_M, BLOCK_N] tile after the tensor-core dot:
  `sum_j w_j x_j = scale * dot(x, h) - (scale * (offset + zp) + min) * sum_j x_j`;
- large M (`scale_in_w=True`): the weight tile is scaled in fp32 and rounded to the dot dtype (one FMA per
  weight, amortized over the activation rows), as a bf16 matmul of the dequantized weight would see it;
- decode shapes with few weight-row tiles split the blocks across programs (`split`), writing fp32 partials
  that a second launch sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glm5lib.kernels.common import capability, num_sms  # noqa: F401  (before triton: interpreter switch)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from glm5lib.errors import UserError  # noqa: E402

# GGML type ids (gguf.GGMLQuantizationType) -> (values per block, bytes per block, code bits)
Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K = 2, 6, 8, 12, 13, 14
QTYPES = {Q4_0: (32, 18, 4), Q5_0: (32, 22, 5), Q8_0: (32, 34, 8), Q4_K: (256, 144, 4), Q5_K: (256, 176, 5),
          Q6_K: (256, 210, 6)}
QTYPE_NAMES = {Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}


@dataclass(frozen=True)
class GGUFConfig:
    """One launch configuration (the benchmark sweeps these; tests AOT-compile the shipped ones)."""

    block_m: int = 16
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    waves: float = 2.0  # split the blocks until about this many programs per SM (1 = no split)
    scale_in_w: bool = False
    f16_dot: bool = False  # bf16 activations: run the dot in fp16 (exact codes up to 10 bits, e.g. Q8_0)

    @property
    def name(self) -> str:
        return (f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}-v{self.waves:g}"
                f"{'-siw' if self.scale_in_w else ''}{'-f16' if self.f16_dot else ''}")


# Shipped configs by activation-row class. Chosen from the H200 sweep (NOTES.md "GGUF kernels").
CONFIGS = {
    "decode": GGUFConfig(16, 64, 4, 3, 2.0),
    "small": GGUFConfig(32, 64, 4, 3, 2.0, scale_in_w=True),
    "large": GGUFConfig(64, 128, 8, 3, 1.0, scale_in_w=True),
    "moe13": GGUFConfig(16, 16, 4, 3, 1.0),
    "moe2": GGUFConfig(16, 64, 4, 3, 1.0),
}


def pick_config(m: int) -> GGUFConfig:
    if m <= 16:
        return CONFIGS["decode"]
    if m <= 32:
        return CONFIGS["small"]
    return CONFIGS["large"]


# ---------------------------------------------------------------------------------------------------- device code


@triton.jit
def _mac(acc, u, scale, shift, X, x_row, m_mask, k0, WIDTH: tl.constexpr, DOT: tl.constexpr, MAGIC: tl.constexpr,
         SCALE_IN_W: tl.constexpr, IEEE: tl.constexpr):
    """acc[m, n] += sum_j (scale[n] * u[n, j] - shift[n]) * x[m, k0 + j], j < WIDTH; u holds unsigned codes."""
    offs_k = k0 + tl.arange(0, WIDTH)
    xs = tl.load(X + x_row[:, None] + offs_k[None, :], mask=m_mask[:, None], other=0.0).to(DOT)
    if SCALE_IN_W:
        w = (u.to(tl.float32) * scale[:, None] - shift[:, None]).to(DOT)
        if IEEE:
            acc = tl.dot(xs, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(xs, tl.trans(w), acc)
    else:
        if MAGIC == 1:  # bf16 bits 0x4300 | q == 128 + q (q < 128)
            h = (u.to(tl.int16) | 0x4300).to(tl.bfloat16, bitcast=True)
            off = 128.0
        elif MAGIC == 2:  # fp16 bits 0x6400 | q == 1024 + q (q < 1024)
            h = (u.to(tl.int16) | 0x6400).to(tl.float16, bitcast=True)
            off = 1024.0
        else:
            h = u.to(tl.float32).to(DOT)
            off = 0.0
        if IEEE:
            part = tl.dot(xs, tl.trans(h), input_precision="ieee")
        else:
            part = tl.dot(xs, tl.trans(h))
        sx = tl.sum(xs.to(tl.float32), 1)
        acc += part * scale[None, :] - sx[:, None] * (scale * off + shift)[None, :]
    return acc


@triton.jit
def _f16(WH, byte_off):
    """fp16 at an even byte offset ([BLOCK_N] offsets), as fp32."""
    return tl.load(WH + byte_off // 2).to(tl.float32)


@triton.jit
def _k4_scale_min(W, base, j: tl.constexpr):
    """Q4_K / Q5_K 6-bit (scale, min) of sub-block j from the 12 packed bytes at base + 4 (llama.cpp's
    get_scale_min_k4)."""
    if j < 4:
        sc = tl.load(W + base + 4 + j) & 63
        mn = tl.load(W + base + 8 + j) & 63
    else:
        hi = tl.load(W + base + 8 + j)
        sc = (hi & 15) | ((tl.load(W + base + j) >> 6) << 4)
        mn = (hi >> 4) | ((tl.load(W + base + 4 + j) >> 6) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _qrows(acc, W, WH, row_off, X, x_row, m_mask, kb0, kb1,
           QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr, BLOCK_N: tl.constexpr,
           DOT: tl.constexpr, MAGIC: tl.constexpr, SCALE_IN_W: tl.constexpr, IEEE: tl.constexpr):
    """acc += x[:, blocks kb0..kb1) @ w[rows, same blocks]^T for one weight-row tile (row_off: byte offsets)."""
    a32 = tl.arange(0, 32)
    a16 = tl.arange(0, 16)
    for kb in range(kb0, kb1):
        base = row_off + kb * BLOCK_BYTES  # [BLOCK_N] int64
        k0 = kb * QK
        if QTYPE == 12:  # Q4_K: d, dmin, scales[12], qs[128]; chunk c: low nibbles = sub-block 2c, high = 2c+1
            d = _f16(WH, base)
            dmin = _f16(WH, base + 2)
            for c in tl.static_range(4):
                q = tl.load(W + base[:, None] + 16 + 32 * c + a32[None, :])
                sc, mn = _k4_scale_min(W, base, 2 * c)
                acc = _mac(acc, q & 15, d * sc, dmin * mn, X, x_row, m_mask, k0 + 64 * c, 32, DOT, MAGIC,
                           SCALE_IN_W, IEEE)
                sc, mn = _k4_scale_min(W, base, 2 * c + 1)
                acc = _mac(acc, q >> 4, d * sc, dmin * mn, X, x_row, m_mask, k0 + 64 * c + 32, 32, DOT, MAGIC,
                           SCALE_IN_W, IEEE)
        elif QTYPE == 13:  # Q5_K: d, dmin, scales[12], qh[32], qs[128]; bit 2c / 2c+1 of qh[l] is the 5th bit
            d = _f16(WH, base)
            dmin = _f16(WH, base + 2)
            qh = tl.load(W + base[:, None] + 16 + a32[None, :])
            for c in tl.static_range(4):
                q = tl.load(W + base[:, None] + 48 + 32 * c + a32[None, :])
                sc, mn = _k4_scale_min(W, base, 2 * c)
                u = (q & 15) | (((qh >> (2 * c)) & 1) << 4)
                acc = _mac(acc, u, d * sc, dmin * mn, X, x_row, m_mask, k0 + 64 * c, 32, DOT, MAGIC,
                           SCALE_IN_W, IEEE)
                sc, mn = _k4_scale_min(W, base, 2 * c + 1)
                u = (q >> 4) | (((qh >> (2 * c + 1)) & 1) << 4)
                acc = _mac(acc, u, d * sc, dmin * mn, X, x_row, m_mask, k0 + 64 * c + 32, 32, DOT, MAGIC,
                           SCALE_IN_W, IEEE)
        elif QTYPE == 14:  # Q6_K: ql[128], qh[64], int8 scales[16] (one per 16 values), d; codes - 32
            d = _f16(WH, base + 208)
            for n in tl.static_range(2):
                for i in tl.static_range(4):
                    for hh in tl.static_range(2):
                        ql = tl.load(W + base[:, None] + 64 * n + 32 * (i % 2) + 16 * hh + a16[None, :])
                        qh = tl.load(W + base[:, None] + 128 + 32 * n + 16 * hh + a16[None, :])
                        u = ((ql >> (4 * (i // 2))) & 15) | (((qh >> (2 * i)) & 3) << 4)
                        sc = tl.load(W + base + 192 + 8 * n + 2 * i + hh).to(tl.int8, bitcast=True).to(tl.float32)
                        s = d * sc
                        acc = _mac(acc, u, s, 32.0 * s, X, x_row, m_mask, k0 + 128 * n + 32 * i + 16 * hh, 16, DOT,
                                   MAGIC, SCALE_IN_W, IEEE)
        elif QTYPE == 8:  # Q8_0: d, int8 qs[32]; code u = q + 128
            d = _f16(WH, base)
            u = tl.load(W + base[:, None] + 2 + a32[None, :]) ^ 0x80
            acc = _mac(acc, u, d, 128.0 * d, X, x_row, m_mask, k0, 32, DOT, MAGIC, SCALE_IN_W, IEEE)
        elif QTYPE == 2:  # Q4_0: d, qs[16]; value j: low nibble of qs[j], value j + 16: high nibble; codes - 8
            d = _f16(WH, base)
            q = tl.load(W + base[:, None] + 2 + a16[None, :])
            acc = _mac(acc, q & 15, d, 8.0 * d, X, x_row, m_mask, k0, 16, DOT, MAGIC, SCALE_IN_W, IEEE)
            acc = _mac(acc, q >> 4, d, 8.0 * d, X, x_row, m_mask, k0 + 16, 16, DOT, MAGIC, SCALE_IN_W, IEEE)
        else:  # Q5_0: d, qh (32 bits, little endian), qs[16]; bit j / j + 16 of qh is value j's / (j+16)'s 5th bit
            d = _f16(WH, base)
            q = tl.load(W + base[:, None] + 6 + a16[None, :])
            h_lo = tl.load(W + base[:, None] + 2 + (a16 // 8)[None, :])
            h_hi = tl.load(W + base[:, None] + 4 + (a16 // 8)[None, :])
            bit = (a16 % 8)[None, :].to(tl.uint8)
            u = (q & 15) | (((h_lo >> bit) & 1) << 4)
            acc = _mac(acc, u, d, 16.0 * d, X, x_row, m_mask, k0, 16, DOT, MAGIC, SCALE_IN_W, IEEE)
            u = (q >> 4) | (((h_hi >> bit) & 1) << 4)
            acc = _mac(acc, u, d, 16.0 * d, X, x_row, m_mask, k0 + 16, 16, DOT, MAGIC, SCALE_IN_W, IEEE)
    return acc


@triton.jit
def _gguf_mm_kernel(X, W, WH, Y, M, N, stride_xm, stride_wn, stride_ys, stride_ym, KB, KB_PER_SPLIT,
                    QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, MAGIC: tl.constexpr,
                    SCALE_IN_W: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr):
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
    acc = _qrows(acc, W, WH, row_off, X, x_row, m_mask, kb0, kb1, QTYPE, BLOCK_BYTES, QK, BLOCK_N, DOT, MAGIC,
                 SCALE_IN_W, IEEE)
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
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, MAGIC: tl.constexpr,
                    SCALE_IN_W: tl.constexpr, IEEE: tl.constexpr):
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
               MAGIC, SCALE_IN_W, IEEE)
    u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    u = _qrows(u, W, WH, ebase + (rows + I) * stride_wn, X, x_row, m_mask, 0, KB, QTYPE, BLOCK_BYTES, QK, BLOCK_N,
               DOT, MAGIC, SCALE_IN_W, IEEE)
    a = g / (1.0 + tl.exp(-g)) * u
    ptrs = A + tl.where(m_mask, pair, 0).to(tl.int64)[:, None] * stride_am + offs_n[None, :]
    tl.store(ptrs, a, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _moe_w2_kernel(A, W, WH, Y, TW, SORTED, BLOCK_E, stride_am, stride_we, stride_wn, stride_ym, N, KB,
                   QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, QK: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, MAGIC: tl.constexpr,
                   SCALE_IN_W: tl.constexpr, IEEE: tl.constexpr):
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
                 BLOCK_BYTES, QK, BLOCK_N, DOT, MAGIC, SCALE_IN_W, IEEE)
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


def _dot_mode(x_dtype: torch.dtype, bits: int, cfg: GGUFConfig) -> tuple[object, int, bool]:
    """(Triton dot dtype, magic kind, ieee) for activations of x_dtype and codes of `bits` bits."""
    if x_dtype == torch.float32:
        return tl.float32, 0, True
    if x_dtype == torch.float16 or cfg.f16_dot:
        return tl.float16, (2 if bits <= 10 else 0), False
    return tl.bfloat16, (1 if bits <= 7 else 0), False


def _num_splits(tiles: int, kb: int, device: torch.device, waves: float) -> int:
    if waves <= 1.0 or tiles >= waves * num_sms(device):
        return 1
    return max(1, min(kb, int(waves * num_sms(device) // tiles)))


def gguf_matmul(x: torch.Tensor, w: torch.Tensor, qtype: int, n: int, *, config: GGUFConfig | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(w)^T. x: [M, K] fp32/fp16/bf16; w: uint8 [n, row_bytes] GGUF rows of type qtype."""
    qk, bb, bits = _check_qtype(qtype)
    if x.dim() != 2 or w.dim() != 2 or w.dtype != torch.uint8:
        raise UserError(f"gguf_matmul: x must be [M, K] and w uint8 [N, row_bytes], got {tuple(x.shape)} "
                        f"and {tuple(w.shape)} {w.dtype}")
    m, k = x.shape
    if w.shape[0] != n or w.shape[1] != row_bytes(qtype, k):
        raise UserError(f"gguf_matmul: w is {tuple(w.shape)}, expected ({n}, {row_bytes(qtype, k)}) for "
                        f"{QTYPE_NAMES[int(qtype)]} rows of {k} values")
    if w.stride(1) != 1 or w.stride(0) % 2:
        raise UserError("gguf_matmul: w rows must be contiguous with an even row stride")
    cfg = config or pick_config(m)
    x = x.contiguous()
    kb = k // qk
    dot, magic, ieee = _dot_mode(x.dtype, bits, cfg)
    tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m)
    split = _num_splits(tiles, kb, x.device, cfg.waves)
    kb_per = triton.cdiv(kb, split)
    split = triton.cdiv(kb, kb_per)
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    target = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), split)
    _gguf_mm_kernel[grid](x, w, w.view(torch.float16), target, m, n, x.stride(0), w.stride(0),
                          m * n if split > 1 else 0, n, kb, kb_per,
                          QTYPE=int(qtype), BLOCK_BYTES=bb, QK=qk, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                          DOT=dot, MAGIC=magic, SCALE_IN_W=cfg.scale_in_w, IEEE=ieee, SPLIT=split > 1,
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
    qk1, bb1, bits1 = _check_qtype(type13)
    qk2, bb2, bits2 = _check_qtype(type2)
    m, k = x.shape
    e, two_i, rb1 = w13.shape
    inter = two_i // 2
    if rb1 != row_bytes(type13, k) or tuple(w2.shape) != (e, k, row_bytes(type2, inter)):
        raise UserError(f"gguf_moe: w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} do not match x [{m}, {k}] with "
                        f"{QTYPE_NAMES[int(type13)]} / {QTYPE_NAMES[int(type2)]} rows")
    top_k = topk_ids.shape[1]
    c13 = config13 or CONFIGS["moe13"]
    c2 = config2 or CONFIGS["moe2"]
    if c13.block_m != c2.block_m:
        raise ValueError("gguf_moe: both configs must group pairs in blocks of the same size")
    x = x.contiguous()
    sorted_pairs, block_expert = moe_align(topk_ids, e, c13.block_m)
    nblocks = block_expert.numel()
    a = torch.empty(m * top_k, inter, dtype=torch.float32, device=x.device)
    dot, magic, ieee = _dot_mode(x.dtype, bits1, c13)
    _moe_w13_kernel[(triton.cdiv(inter, c13.block_n), nblocks)](
        x, w13, w13.view(torch.float16), a, sorted_pairs, block_expert, x.stride(0), w13.stride(0), w13.stride(1),
        a.stride(0), inter, k // qk1, top_k, QTYPE=int(type13), BLOCK_BYTES=bb1, QK=qk1, BLOCK_M=c13.block_m,
        BLOCK_N=c13.block_n, DOT=dot, MAGIC=magic, SCALE_IN_W=c13.scale_in_w, IEEE=ieee,
        num_warps=c13.num_warps, num_stages=c13.num_stages)
    yp = torch.empty(m * top_k, k, dtype=torch.float32, device=x.device)
    dot, magic, ieee = _dot_mode(x.dtype, bits2, c2)
    tw = topk_weights.reshape(-1).contiguous()
    _moe_w2_kernel[(triton.cdiv(k, c2.block_n), nblocks)](
        a, w2, w2.view(torch.float16), yp, tw, sorted_pairs, block_expert, a.stride(0), w2.stride(0), w2.stride(1),
        yp.stride(0), k, inter // qk2, QTYPE=int(type2), BLOCK_BYTES=bb2, QK=qk2, BLOCK_M=c2.block_m,
        BLOCK_N=c2.block_n, DOT=dot, MAGIC=magic, SCALE_IN_W=c2.scale_in_w, IEEE=ieee,
        num_warps=c2.num_warps, num_stages=c2.num_stages)
    return yp.view(m, top_k, k).sum(1).to(x.dtype)


def aot_specs(arch: int) -> list:
    """`compile_report.KernelSpec`s of every shipped GGUF (kernel, config, type) for `arch` (bf16 activations;
    Q8_0 also with the fp16 dot)."""
    from glm5lib.kernels.compile_report import KernelSpec, _sig

    specs = []
    div = ("X", "W", "WH", "Y", "stride_xm", "stride_ym")
    for cls in ("decode", "small", "large"):
        cfg = CONFIGS[cls]
        for qt, (qk, bb, bits) in QTYPES.items():
            for split in ((False, True) if cls == "decode" else (False,)):
                dot, magic, _ = _dot_mode(torch.bfloat16, bits, cfg)
                consts = {"QTYPE": qt, "BLOCK_BYTES": bb, "QK": qk, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                          "DOT": dot, "MAGIC": magic, "SCALE_IN_W": cfg.scale_in_w, "IEEE": False, "SPLIT": split}
                types = {"X": "*bf16", "W": "*u8", "WH": "*fp16", "Y": "*fp32" if split else "*bf16"}
                specs.append(KernelSpec(f"gguf_mm[{cls}:{cfg.name}:{QTYPE_NAMES[qt]}{':split' if split else ''}]",
                                        _gguf_mm_kernel, _sig(_gguf_mm_kernel, types, consts), consts,
                                        cfg.num_warps, cfg.num_stages, div))
    for kname, fn, cfg in (("moe_w13", _moe_w13_kernel, CONFIGS["moe13"]), ("moe_w2", _moe_w2_kernel, CONFIGS["moe2"])):
        for qt, (qk, bb, bits) in QTYPES.items():
            if qk != 256:
                continue
            dot, magic, _ = _dot_mode(torch.bfloat16, bits, cfg)
            consts = {"QTYPE": qt, "BLOCK_BYTES": bb, "QK": qk, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                      "DOT": dot, "MAGIC": magic, "SCALE_IN_W": cfg.scale_in_w, "IEEE": False}
            types = {"X": "*bf16", "A": "*fp32", "W": "*u8", "WH": "*fp16", "Y": "*fp32", "TW": "*fp32",
                     "SORTED": "*i32", "BLOCK_E": "*i32"}
            specs.append(KernelSpec(f"gguf_{kname}[{cfg.name}:{QTYPE_NAMES[qt]}]", fn, _sig(fn, types, consts), consts,
                                    cfg.num_warps, cfg.num_stages, ("X", "A", "W", "WH", "Y")))
    return specs
