"""GPU unit checks of the Gluon pieces `mla_gluon_fp8mma` is built on: e4m3 <-> fp32 conversions in a blocked layout,
the split of a row into e4m3 terms, and m16n8k32 e4m3 products (`mma_v2`) with operands loaded from global memory and
from shared memory. `PYTHONPATH=src python scripts/fp8mma_unit.py`

Each term split is compared with torch's, element by element, on a [8, 512] tile ("mismatches of 4096 per term"):
- 0: the kernel's own `_e4m3_terms` on a bf16 row scaled to 448 (what the kernel does): must match exactly;
- 1, 3, 5, 6: Triton's built-in conversions (widened through uint8, by bit arithmetic, through fp16, two terms);
  on the H200 with Triton 3.6 they returned wrong values for about half of the elements (NOTES.md round 8);
- 2 and 4: the kernel's split on rows it never gets (unscaled, or fp32 values with more bits than bf16): below
  e4m3's normal range (2^-6) its result is rounded twice, so a few elements differ from torch's, by at most 2^-10;
- 7: inline-PTX rounding that also widens the bytes (the round's first fix).
Outputs: `outputs/bench/sweeps/fp8mma_unit_h200.log`."""

from __future__ import annotations

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from glm5lib.kernels.mla_gluon_fp8mma import _e4m3_terms, _exp_to_max, _pow2


@gluon.jit
def _conv(X, T0, Y, T1):
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [2, 1], [1, 0])
    r = gl.arange(0, 8, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, 512, layout=gl.SliceLayout(0, L))
    off = r[:, None] * 512 + c[None, :]
    x = gl.load(X + off)
    t0 = x.to(gl.float8e4nv)
    gl.store(T0 + off, t0.to(gl.uint8, bitcast=True))
    y = t0.to(gl.float32)
    gl.store(Y + off, y)
    gl.store(T1 + off, (x - y).to(gl.float8e4nv).to(gl.uint8, bitcast=True))


@gluon.jit
def _e4m3_to_f32(t):
    """e4m3 -> fp32 from the bits (exact, no conversion instruction)."""
    b = t.to(gl.uint8, bitcast=True).to(gl.int32)
    e = (b >> 3) & 15
    m = b & 7
    mag = gl.where(e == 0, m.to(gl.float32) * 0.001953125, ((e + 120) << 23 | (m << 20)).to(gl.float32, bitcast=True))
    return gl.where((b & 128) != 0, -mag, mag)


@gluon.jit
def _round_e4m3_asm(x):
    """(e4m3 bytes, their fp32 values) of fp32 x, 4 elements per asm: the bytes packed in one 32-bit register."""
    b, y = gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi, h0, h1, h2, h3; .reg .b32 a, c;\n"
        " cvt.rn.satfinite.e4m3x2.f32 lo, $6, $5;\n cvt.rn.satfinite.e4m3x2.f32 hi, $8, $7;\n"
        " mov.b32 $0, {lo, hi};\n cvt.rn.f16x2.e4m3x2 a, lo;\n cvt.rn.f16x2.e4m3x2 c, hi;\n"
        " mov.b32 {h0, h1}, a;\n mov.b32 {h2, h3}, c;\n"
        " cvt.f32.f16 $1, h0;\n cvt.f32.f16 $2, h1;\n cvt.f32.f16 $3, h2;\n cvt.f32.f16 $4, h3; }",
        "=r,=r,=r,=r,=r,r,r,r,r", [x], dtype=(gl.uint8, gl.float32), is_pure=True, pack=4)
    return b, y


@gluon.jit
def _terms(Q, T, H, VARIANT: gl.constexpr):
    """The kernel's prologue: q rows -> per-head power of two -> three e4m3 terms (VARIANT 1: t0 round-tripped through
    uint8 before widening; 2: sigma = 1)."""
    LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [2, 1], [1, 0])
    offs_qh = gl.arange(0, 8, layout=gl.SliceLayout(1, LQ))
    qm = (offs_qh < H)[:, None]
    offs_q = gl.arange(0, 512, layout=gl.SliceLayout(0, LQ))
    if VARIANT == 4:  # fp32 rows from global (as _conv)
        x = gl.load(Q.to(gl.pointer_type(gl.float32), bitcast=True) + offs_qh[:, None] * 512 + offs_q[None, :])
    else:
        qn = gl.load(Q + offs_qh[:, None] * 576 + offs_q[None, :], mask=qm, other=0.0).to(gl.float32)
        if VARIANT == 2:
            x = qn
        else:
            sigma = _pow2(_exp_to_max(gl.max(gl.abs(qn), axis=1)))
            x = qn * sigma[:, None]
    if VARIANT == 7:  # one asm block per 4 values: bytes and fp32 values together
        b0, y0 = _round_e4m3_asm(x)
        r = x - y0
        b1, y1 = _round_e4m3_asm(r)
        b2, y2 = _round_e4m3_asm(r - y1)
        t0 = b0.to(gl.float8e4nv, bitcast=True)
        t1 = b1.to(gl.float8e4nv, bitcast=True)
        t2 = b2.to(gl.float8e4nv, bitcast=True)
    elif VARIANT == 5:  # through fp16
        t0 = x.to(gl.float16).to(gl.float8e4nv)
        r = x - t0.to(gl.float16).to(gl.float32)
        t1 = r.to(gl.float16).to(gl.float8e4nv)
        t2 = (r - t1.to(gl.float16).to(gl.float32)).to(gl.float16).to(gl.float8e4nv)
    elif VARIANT == 6:  # two terms only
        t0 = x.to(gl.float8e4nv)
        t1 = (x - t0.to(gl.float32)).to(gl.float8e4nv)
        t2 = t1
    elif VARIANT == 3:
        t0 = x.to(gl.float8e4nv)
        r = x - _e4m3_to_f32(t0)
        t1 = r.to(gl.float8e4nv)
        t2 = (r - _e4m3_to_f32(t1)).to(gl.float8e4nv)
    elif VARIANT == 1:
        t0 = x.to(gl.float8e4nv)
        r = x - t0.to(gl.uint8, bitcast=True).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        t1 = r.to(gl.float8e4nv)
        t2 = (r - t1.to(gl.float32)).to(gl.float8e4nv)
    else:
        t0, t1, t2 = _e4m3_terms(x, 3)
    off = offs_qh[:, None] * 512 + offs_q[None, :]
    gl.store(T + off, t0.to(gl.uint8, bitcast=True))
    gl.store(T + 4096 + off, t1.to(gl.uint8, bitcast=True))
    gl.store(T + 8192 + off, t2.to(gl.uint8, bitcast=True))
    gl.store((T + 12288).to(gl.pointer_type(gl.float32), bitcast=True) + off, x)


@gluon.jit
def _mma_global(A, B, C, FROM_SMEM: gl.constexpr):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, 1], instr_shape=[16, 8])
    DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4)
    m = gl.arange(0, 32, layout=gl.SliceLayout(1, DA))
    k = gl.arange(0, 128, layout=gl.SliceLayout(0, DA))
    a = gl.load(A + m[:, None] * 128 + k[None, :]).to(gl.float8e4nv, bitcast=True)
    if FROM_SMEM:
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [2, 1], [1, 0])
        n2 = gl.arange(0, 8, layout=gl.SliceLayout(1, LQ))
        k2 = gl.arange(0, 128, layout=gl.SliceLayout(0, LQ))
        SW: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
        bs = gl.allocate_shared_memory(gl.float8e4nv, [8, 128], SW)
        bs.store(gl.load(B + n2[:, None] * 128 + k2[None, :]).to(gl.float8e4nv, bitcast=True))
        gl.thread_barrier() if hasattr(gl, "thread_barrier") else gl.barrier()
        b = bs.permute([1, 0]).load(DB)
    else:
        kb = gl.arange(0, 128, layout=gl.SliceLayout(1, DB))
        n = gl.arange(0, 8, layout=gl.SliceLayout(0, DB))
        b = gl.load(B + n[None, :] * 128 + kb[:, None]).to(gl.float8e4nv, bitcast=True)
    acc = mma_v2(a, b, gl.zeros([32, 8], gl.float32, MMA))
    mc = gl.arange(0, 32, layout=gl.SliceLayout(1, MMA))
    nc = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    gl.store(C + mc[:, None] * 8 + nc[None, :], acc)


def main() -> int:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(8, 512, device=dev) * 100
    t0 = torch.empty(8, 512, dtype=torch.uint8, device=dev)
    y = torch.empty(8, 512, device=dev)
    t1 = torch.empty_like(t0)
    _conv[(1,)](x, t0, y, t1, num_warps=2)
    rt0 = x.to(torch.float8_e4m3fn)
    print("fp32 -> e4m3 equal:", bool(torch.equal(t0, rt0.view(torch.uint8))))
    print("e4m3 -> fp32 equal:", bool(torch.equal(y, rt0.float())), "mismatch at",
          (y != rt0.float()).nonzero()[:6].tolist())
    rt1 = (x - rt0.float()).to(torch.float8_e4m3fn)
    print("residual term equal:", bool(torch.equal(t1, rt1.view(torch.uint8))),
          int((t1 != rt1.view(torch.uint8)).sum()))
    q = torch.randn(8, 576, device=dev).to(torch.bfloat16)
    q32 = torch.randn(8, 512, device=dev) * 100
    for variant in range(8):
        tb = torch.zeros(12288 + 4 * 4096, dtype=torch.uint8, device=dev)
        _terms[(1,)](q32 if variant == 4 else q, tb, 8, VARIANT=variant, num_warps=2)
        x = tb[12288:].view(torch.float32).view(8, 512)
        terms, r = [], x
        for _ in range(3):
            tt = r.to(torch.float8_e4m3fn)
            terms.append(tt)
            r = r - tt.float()
        got = tb[:12288].view(3, 8, 512)
        n_terms = 3 if variant != 6 else 2
        print(f"terms variant {variant}:", [int((got[j] != terms[j].view(torch.uint8)).sum()) for j in range(n_terms)],
              "mismatches of 4096 per term")
        bad = (got[1] != terms[1].view(torch.uint8)).nonzero()[:4].tolist()
        for h, d in bad:
            print("   h", h, "d", d, "x", float(x[h, d]), "t0", float(terms[0][h, d].float()), "t1 kernel",
                  float(got[1][h, d].view(torch.float8_e4m3fn).float()), "t1 torch", float(terms[1][h, d].float()))
    a = (torch.randn(32, 128, device=dev) * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(8, 128, device=dev) * 8).to(torch.float8_e4m3fn)
    ref = a.float() @ b.float().T
    for smem in (False, True):
        c = torch.empty(32, 8, device=dev)
        _mma_global[(1,)](a.view(torch.uint8), b.view(torch.uint8), c, FROM_SMEM=smem, num_warps=2)
        print(f"mma fp8 (B from {'smem' if smem else 'global'}): max rel err",
              float((c - ref).abs().max() / ref.abs().max()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
