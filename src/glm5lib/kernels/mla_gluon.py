"""Gluon sparse MLA forward for decode with few heads (H <= 16) over an fp8_ds_mla cache.

`sparse_mla_gluon(q, kv_cache, indices, sm_scale)` -> `(out [T, H, 512], lse [T, H])`, the contract of
`mla.sparse_mla_launch(..., kv_format="fp8_ds_mla")`; the fp32 twin is `naive.sparse_mla_ref`.

Why Gluon. In the Triton kernel (`mla._sparse_mla_fwd_kernel`) the `[16 heads, N keys]` tile splits the keys
across warps, so every warp holds the whole of q (`[16, 576]`, about 144 registers) as its dot operand for the
whole loop, on top of a register-prefetched gathered tile: 255 registers with spills; and Triton's pipeliner
cannot stage the gathers because the fp8 rows are converted before the dot. Gluon lets the kernel say where every
tensor lives and when memory moves:

- q (pre-scaled to fp16, below) sits in shared memory and is read into the mma operand layout only while a dot
  runs;
- the gathered rows go global -> shared with `cp.async` (a pointer tensor and a mask, so gathers by index work)
  into a ring of `NBUF` slots: tile i + NBUF - 1 is in flight while tile i is computed (with a single slot, tile
  i + 1 is issued as soon as tile i has been converted out of it), and the index tile for the next gather is read
  one iteration ahead;
- each tile's e4m3 bytes are converted once, as int32 words (one `cvt.rn.f16x2.e4m3x2` per half word, exact),
  into an fp16 shared tile that is B of both products: `K^T` as a transposed view for `S = q k^T`, `V` as is for
  `acc += P V` (`mma_v2`, ldmatrix from swizzled shared memory).

Two kernels, sharing their scores, softmax step, P V and epilogue:

- `_sparse_mla_gluon_kernel` (key split): the mma tile `[16, N]` splits the keys across warps, as Triton does;
  every warp reads all of q from shared memory per tile, and the scaled P goes through shared memory once;
- `_sparse_mla_gluon_ws_kernel` (warp-specialized, `ws=True`): the key-split kernel with the gather and the
  e4m3 -> fp16 conversion moved to a 4-warp producer partition that fills a ring of `depth` fp16 tiles, so that
  they overlap the consumer's products and softmax (per-slot `ready` / `free` mbarriers between the partitions).

(A third, warps split over the latent chunks, was timed on the H200 and removed: 150 against 134 us at B128 H8,
NOTES.md v8a; the commit that has it is c6a6ee6.)

Numerics are the Triton kernel's NOPE_F16 scheme: e4m3 -> fp16 is exact, the per-128-column fp32 scale goes on
the `[16, N]` side (to S and to P), q's latent chunks are pre-scaled by 2^-8 and P by 2^8 so both stay inside
fp16's range, and the accumulator is divided by 2^8 at the end. The rope part is a bf16 product. The online
softmax runs in the log2 domain; invalid keys (-1, >= N rows, past the split) are gathered as masked copies of
row 0 (zero-filled: no address outside the cache is formed) and get logit -inf.

One program owns (token, split) for all heads (padded to 16 rows). Split-K partials use `mla._part_rows`'s
layout and are merged by `mla._merge_splits_kernel`; the split count is `mla.pick_num_splits`'s with the shipped
fp8 decode config's rule and as many waves as programs fit on an SM by shared memory.

Shared memory per program: NBUF * BLOCK_N * 656 (ring) + BLOCK_N * 1024 (fp16 tile) + 18 KB (q) + 2 or 4 KB per
32 keys (P tiles / S reduction); the ws kernel holds `depth` fp16 tiles, each with its rope and scales, instead of
one (one program per SM on sm_90; it does not fit sm_120); `tests/test_mla_gluon.py` checks it against the sm_90
/ sm_120 limits. Gluon does not run in Triton's interpreter: the numeric checks are `scripts/gluon_mla_device.py`,
on a GPU. Not dispatched by `mla.sparse_mla` (NOTES.md v8a-v8e: measured, and why).
"""

from __future__ import annotations

import torch

from glm5lib.kernels import common  # noqa: F401  (before triton: the interpreter switch)
from glm5lib.kernels import mla
from glm5lib.kernels.common import num_sms
from glm5lib.kernels.compile_report import SMEM_LIMIT
from glm5lib.kernels.mla import LOG2E
from glm5lib.kernels.naive import D_NOPE, D_QK, D_ROPE, FP8_DS_MLA_ROW_BYTES, kv_row_geometry

import triton  # noqa: E402

try:  # Triton builds without Gluon (or without its NVIDIA parts) leave the module importable, unusable
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mbarrier, mma_v2
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BLOCK_H = 16  # mma_v2's M: all heads of a token, padded

# (block_n, num_warps, nbuf, variant) the device script times; variant: False the key-split kernel, "ws" / "ws<depth>"
# the warp-specialized one (num_warps: its consumer; fp16 ring depth 2 unless given). DEFAULT is what `sparse_mla_gluon`
# takes unless told. All compile without spills; sm_120 (99 KB) takes only block_n 32 with nbuf 1-2 of the key-split
# kernel. On the H200 (NOTES.md v8a-v8e) nbuf 1 (single-slot ring) was the fastest at B128 H8 (0.88x the Triton kernel),
# the warp-specialized one at B128 H16 and B32 (0.86-0.93x). DEFAULT keeps nbuf 2: the stage probes (`probe`) need a
# second slot.
CONFIGS = [(32, 4, 2, False), (32, 4, 1, False), (64, 8, 2, False), (32, 4, 2, "ws"), (32, 4, 2, "ws3")]
# Timed on the H200 and dropped (no faster; outputs/bench/gluon_*_h200.json): a 3-slot fp8 ring (nbuf 3) in every
# kernel, 64-key tiles on 4 warps (these spill when built by Triton 3.9), and register caps (a 5th element,
# `maxnreg`: (32, 4, 1, False, 160) ran three programs per SM at f4e4745, no faster than two; re-add it to time it).
WS_CONFIGS = [c for c in CONFIGS if isinstance(c[3], str)]
DEFAULT = (32, 4, 2, False)
WS_PRODUCER_WARPS = 4
WS_PRODUCER_REGS = 128  # setmaxnreg for the producer (it compiles without spills down to 64; at one program per SM
# by shared memory the consumer keeps 256 either way)


def config_kwargs(cfg) -> dict:
    """`sparse_mla_gluon` keywords of a CONFIGS entry (an optional 5th element: the register cap per thread)."""
    bn, nw, nb, v = cfg[:4]
    kw = {"block_n": bn, "num_warps": nw, "nbuf": nb}
    if isinstance(v, str):
        kw.update(ws=True, depth=int(v[2:] or 2))
    if len(cfg) > 4 and cfg[4]:
        kw["maxnreg"] = cfg[4]
    return kw


def config_name(cfg) -> str:
    bn, nw, nb, v = cfg[:4]
    cap = f"-r{cfg[4]}" if len(cfg) > 4 and cfg[4] else ""
    if isinstance(v, str):
        return f"W{v[2:] or 2}-BN{bn}-w{nw}-nbuf{nb}{cap}"
    return f"N-BN{bn}-w{nw}-nbuf{nb}{cap}"


def smem_bytes_estimate(block_n: int, nbuf: int, depth: int = 0) -> int:
    """Shared memory of one program: the gather ring, the fp16 tile, q, and the P tiles (key-split kernel); depth > 0:
    the warp-specialized kernel, whose fp16 ring holds `depth` tiles with their rope and scales (+ mbarriers)."""
    ring = nbuf * block_n * FP8_DS_MLA_ROW_BYTES
    p_tiles = 4 * BLOCK_H * block_n * 2
    if depth:
        return ring + depth * block_n * (2 * D_NOPE + 2 * D_ROPE + 4 * 4) + p_tiles + BLOCK_H * 2 * D_QK + 16 * depth
    return ring + block_n * 2 * D_NOPE + BLOCK_H * 2 * D_QK + p_tiles

if HAVE_GLUON:
    # names that changed after Triton 3.6 (what the H200 runs): cp.async is `async_load`, the CTA barrier `barrier`
    # and the shared-memory view `reinterpret` there, so the same source also compiles with the newer CPU build the
    # tests may have
    _async_copy = cp.async_load if hasattr(cp, "async_load") else cp.async_copy_global_to_shared
    _barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    _REINTERPRET = "reinterpret" if hasattr(gl.shared_memory_descriptor, "reinterpret") else "_reinterpret"

    if _REINTERPRET == "reinterpret":
        @gluon.jit
        def _as(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            """The same shared-memory bytes viewed as another dtype, shape and layout."""
            return buf.reinterpret(dtype, shape, layout)
    else:
        @gluon.jit
        def _as(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            """The same shared-memory bytes viewed as another dtype, shape and layout."""
            return buf._reinterpret(dtype, shape, layout)

    @gluon.jit
    def _as_f16(buf, shape: gl.constexpr, layout: gl.constexpr):
        return _as(buf, gl.float16, shape, layout)

    @gluon.jit
    def _e4m3_words_f16(w):
        """int32 words of 4 e4m3 bytes -> int64 holding the 4 fp16 values in memory order (exact)."""
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .b32 a, b;\n mov.b32 {lo, hi}, $1;\n cvt.rn.f16x2.e4m3x2 a, lo;\n"
            " cvt.rn.f16x2.e4m3x2 b, hi;\n mov.b64 $0, {a, b}; }",
            "=l,r", [w], dtype=gl.int64, is_pure=True, pack=1)

    @gluon.jit
    def _tile_idx(idx_row, start, k_end, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """Index tile [BLOCK_N] in `layout`; positions past the split read as -1."""
        offs = start + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(idx_row + offs, mask=offs < k_end, other=-1)

    @gluon.jit
    def _issue_gather(KVW, KVH, KVF, idx_w, idx_r, idx_s, N_ROWS, stride_kv, lat_s, rope_s, sc0, sc1, sc2, sc3,
                      slot, LW: gl.constexpr, LR: gl.constexpr):
        """cp.async one tile's rows into ring slot `slot`: latent words, rope, and the scale of chunk c into
        sc<c> (a [BLOCK_N] vector, read back in the mma column layout; four allocations, so that the compiler
        sees they do not alias). Invalid rows become masked copies of row 0 (zero-filled)."""
        v = (idx_w >= 0) & (idx_w < N_ROWS)
        rb = gl.where(v, idx_w, 0).to(gl.int64) * stride_kv  # bytes
        w_off = gl.multiple_of(rb // 4, 4)
        offs_w = gl.arange(0, 128, layout=gl.SliceLayout(0, LW))
        _async_copy(lat_s.index(slot), KVW + w_off[:, None] + offs_w[None, :], mask=v[:, None])
        v = (idx_r >= 0) & (idx_r < N_ROWS)
        rb = gl.where(v, idx_r, 0).to(gl.int64) * stride_kv
        h_off = gl.multiple_of((rb + 528) // 2, 8)
        offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, LR))
        _async_copy(rope_s.index(slot), KVH + h_off[:, None] + offs_r[None, :], mask=v[:, None])
        v = (idx_s >= 0) & (idx_s < N_ROWS)
        f_off = (gl.where(v, idx_s, 0).to(gl.int64) * stride_kv + 512) // 4
        _async_copy(sc0.index(slot), KVF + f_off + 0, mask=v)
        _async_copy(sc1.index(slot), KVF + f_off + 1, mask=v)
        _async_copy(sc2.index(slot), KVF + f_off + 2, mask=v)
        _async_copy(sc3.index(slot), KVF + f_off + 3, mask=v)

    @gluon.jit
    def _scores(q_s, qr_s, k16, kr, s_0, s_1, s_2, s_3, valid, zero_s, qk_scale, DA: gl.constexpr,
                DB: gl.constexpr):
        """S = q k^T of one fp16 tile in the log2 domain, -inf for invalid keys: one product per 128-column chunk
        (q from shared memory, K^T a transposed view of the tile) scaled by that chunk's per-key scale, then 2^8 (q
        was pre-scaled by 2^-8) and the bf16 rope product."""
        CH: gl.constexpr = 128
        s = mma_v2(q_s.slice(0 * CH, CH, 1).load(DA), k16.slice(0 * CH, CH, 1).permute([1, 0]).load(DB),
                   zero_s) * s_0[None, :]
        s += mma_v2(q_s.slice(1 * CH, CH, 1).load(DA), k16.slice(1 * CH, CH, 1).permute([1, 0]).load(DB),
                    zero_s) * s_1[None, :]
        s += mma_v2(q_s.slice(2 * CH, CH, 1).load(DA), k16.slice(2 * CH, CH, 1).permute([1, 0]).load(DB),
                    zero_s) * s_2[None, :]
        s += mma_v2(q_s.slice(3 * CH, CH, 1).load(DA), k16.slice(3 * CH, CH, 1).permute([1, 0]).load(DB),
                    zero_s) * s_3[None, :]
        s = mma_v2(qr_s.load(DA), kr, s * 256.0)
        return gl.where(valid[None, :], s * qk_scale, float("-inf"))

    @gluon.jit
    def _softmax_step(s, m_i, l_i):
        """Online-softmax update for a tile of log2 logits: (P, the accumulator's rescale alpha, new m, new l)."""
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: keep exp2 finite
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _pv(p, alpha, s_0, s_1, s_2, s_3, p0, p1, p2, p3, k16, acc0, acc1, acc2, acc3, DA: gl.constexpr,
            DB: gl.constexpr):
        """acc_c = alpha acc_c + (2^8 P * scale_c) V_c per chunk: the scaled P goes to shared memory once (one
        barrier instead of one layout conversion per chunk), V_c is the tile's chunk as it is."""
        CH: gl.constexpr = 128
        p = p * 256.0
        p0.store((p * s_0[None, :]).to(gl.float16))
        p1.store((p * s_1[None, :]).to(gl.float16))
        p2.store((p * s_2[None, :]).to(gl.float16))
        p3.store((p * s_3[None, :]).to(gl.float16))
        _barrier()
        a2 = alpha[:, None]
        acc0 = mma_v2(p0.load(DA), k16.slice(0 * CH, CH, 1).load(DB), acc0 * a2)
        acc1 = mma_v2(p1.load(DA), k16.slice(1 * CH, CH, 1).load(DB), acc1 * a2)
        acc2 = mma_v2(p2.load(DA), k16.slice(2 * CH, CH, 1).load(DB), acc2 * a2)
        acc3 = mma_v2(p3.load(DA), k16.slice(3 * CH, CH, 1).load(DB), acc3 * a2)
        return acc0, acc1, acc2, acc3

    @gluon.jit
    def _store_outputs(O, LSE, PART, t, sp, H, stride_ot, stride_oh, stride_lt, m_i, l_i, acc0, acc1, acc2, acc3,
                       SPLIT: gl.constexpr, ROW: gl.constexpr, COL: gl.constexpr, BH: gl.constexpr = 16, h0=0,
                       SP_AXIS: gl.constexpr = 1, ACC_SCALE: gl.constexpr = 1.0 / 256.0):
        """Normalise and write: O [T, H, 512] and the natural-log LSE, or (SPLIT) the fp32 partial and its log2 lse
        in `mla._part_rows`'s layout. A head with no key gets zeros and -inf. The program's heads are h0 + [0, BH);
        its split is program id SP_AXIS; the accumulator holds ACC_SCALE^-1 times the output (2^8: the fp16
        scheme)."""
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        has_key = l_i > 0
        inv_l = gl.where(has_key, 1.0 / gl.where(has_key, l_i, 1.0), 0.0) * ACC_SCALE
        lse2 = gl.where(has_key, m_i + gl.log2(gl.where(has_key, l_i, 1.0)), float("-inf"))
        offs_h = h0 + gl.arange(0, BH, layout=ROW)
        h_mask = offs_h < H
        offs_c = gl.arange(0, CH, layout=COL)
        il = inv_l[:, None]
        if not SPLIT:
            o_ty: gl.constexpr = O.dtype.element_ty
            o_row = O + t.to(gl.int64) * stride_ot + offs_h[:, None] * stride_oh + offs_c[None, :]
            gl.store(o_row + 0 * CH, (acc0 * il).to(o_ty), mask=h_mask[:, None])
            gl.store(o_row + 1 * CH, (acc1 * il).to(o_ty), mask=h_mask[:, None])
            gl.store(o_row + 2 * CH, (acc2 * il).to(o_ty), mask=h_mask[:, None])
            gl.store(o_row + 3 * CH, (acc3 * il).to(o_ty), mask=h_mask[:, None])
            gl.store(LSE + t * stride_lt + offs_h, lse2 * 0.6931471805599453, mask=h_mask)
        else:
            n_t = gl.num_programs(0)
            n_sp = gl.num_programs(SP_AXIS)
            rows = (sp * n_t + t).to(gl.int64) * H + offs_h  # mla._part_rows
            o_part = PART + rows[:, None] * DN + offs_c[None, :]
            gl.store(o_part + 0 * CH, acc0 * il, mask=h_mask[:, None])
            gl.store(o_part + 1 * CH, acc1 * il, mask=h_mask[:, None])
            gl.store(o_part + 2 * CH, acc2 * il, mask=h_mask[:, None])
            gl.store(o_part + 3 * CH, acc3 * il, mask=h_mask[:, None])
            gl.store(PART + n_sp.to(gl.int64) * n_t * H * DN + rows, lse2, mask=h_mask)

    @gluon.jit
    def _sparse_mla_gluon_kernel(
        Q, KV, IDX, O, LSE, PART,
        stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
        H, TOPK, N_ROWS, KEYS_PER_SPLIT, qk_scale,
        SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, NBUF: gl.constexpr, PROBE: gl.constexpr = 0,
    ):
        """One program: token t, split sp of its top-k list, all heads (see the module docstring).

        PROBE (stage timing, scripts/gluon_mla_probe.py): 1 runs only the gathers (cp.async, wait, barrier), 2 adds
        the e4m3 -> fp16 tile, 4 adds S = q k^T (summed elementwise, no softmax), 3 S and the softmax statistics
        (cross-warp max and sum); 0 is the kernel. The probes take NBUF >= 2 (a single slot is refilled after
        the conversion, which PROBE 1 skips)."""
        BH: gl.constexpr = 16
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        DR: gl.constexpr = 64
        NW: gl.constexpr = gl.num_warps()
        t = gl.program_id(0)
        sp = gl.program_id(1)

        # register layouts: the mma tile [16, N] splits N across warps; gathers are one 16-byte copy per thread
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW],
                                                      instr_shape=[16, 8])
        DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        ROW: gl.constexpr = gl.SliceLayout(1, MMA)  # [16] per head
        COL: gl.constexpr = gl.SliceLayout(0, MMA)  # [BLOCK_N] per key
        LW: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])  # [N, 128] int32 words
        LR: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])  # [N, 64] bf16 rope
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])  # q rows

        # shared memory: 16-byte swizzle for everything ldmatrix reads (rows of 128 / 1024 bytes)
        SW: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        SW64: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])  # SW in int64
        FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        lat_s = gl.allocate_shared_memory(gl.int32, [NBUF, BLOCK_N, CH], FLAT)
        rope_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_N, DR], SW)
        FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        sc0 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        sc1 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        sc2 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        sc3 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        p0 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)  # P * scale of chunk c, one each
        p1 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        p2 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        p3 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        k16_w = gl.allocate_shared_memory(gl.int64, [BLOCK_N, CH], SW64)
        k16 = _as_f16(k16_w, [BLOCK_N, DN], SW)  # the same bytes: SW64 is SW in 8-byte units
        q_s = gl.allocate_shared_memory(gl.float16, [BH, DN], SW)
        qr_s = gl.allocate_shared_memory(gl.bfloat16, [BH, DR], SW)

        KVW = KV.to(gl.pointer_type(gl.int32), bitcast=True)
        KVH = KV.to(gl.pointer_type(gl.bfloat16), bitcast=True)
        KVF = KV.to(gl.pointer_type(gl.float32), bitcast=True)
        k_start = sp * KEYS_PER_SPLIT
        k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
        n_tiles = gl.cdiv(k_end - k_start, BLOCK_N)
        idx_row = IDX + t.to(gl.int64) * stride_it

        # the first NBUF - 1 gathers (one with a single slot) go out before q is staged
        PRO: gl.constexpr = NBUF - 1 if NBUF > 1 else 1
        for j in gl.static_range(PRO):
            s0 = k_start + j * BLOCK_N
            _issue_gather(KVW, KVH, KVF, _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LW)),
                          _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LR)),
                          _tile_idx(idx_row, s0, k_end, BLOCK_N, COL),
                          N_ROWS, stride_kv, lat_s, rope_s, sc0, sc1, sc2, sc3, j % NBUF, LW, LR)
            cp.commit_group()
        s0 = k_start + PRO * BLOCK_N
        nxt_w = _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LW))
        nxt_r = _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LR))
        nxt_s = _tile_idx(idx_row, s0, k_end, BLOCK_N, COL)

        # q: latent chunks to fp16 pre-scaled by 2^-8, rope as bf16; rows past H are zeros
        offs_qh = gl.arange(0, BH, layout=gl.SliceLayout(1, LQ))
        q_row = Q + t.to(gl.int64) * stride_qt + offs_qh[:, None] * stride_qh
        qm = (offs_qh < H)[:, None]
        offs_q = gl.arange(0, DN, layout=gl.SliceLayout(0, LQ))
        qn = gl.load(q_row + offs_q[None, :], mask=qm, other=0.0)
        q_s.store((qn.to(gl.float32) * (1.0 / 256.0)).to(gl.float16))
        offs_qr = gl.arange(0, DR, layout=gl.SliceLayout(0, LQ))
        qr_s.store(gl.load(q_row + DN + offs_qr[None, :], mask=qm, other=0.0).to(gl.bfloat16))

        m_i = gl.full([BH], float("-inf"), gl.float32, ROW)
        l_i = gl.full([BH], 0.0, gl.float32, ROW)
        acc0 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        acc1 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        acc2 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        acc3 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        zero_s = gl.full([BH, BLOCK_N], 0.0, gl.float32, MMA)
        if PROBE == 4:
            s_sink = zero_s
        offs_col = gl.arange(0, BLOCK_N, layout=COL)

        for i in range(n_tiles):
            # 1. gather tile i + NBUF - 1 into the slot tile i - 1 used (read before last iteration's barrier 3);
            #    with a single slot (NBUF 1) tile i + 1 goes out after barrier 3 instead, once tile i is converted
            if NBUF > 1:
                slot_w = (i + NBUF - 1) % NBUF
                _issue_gather(KVW, KVH, KVF, nxt_w, nxt_r, nxt_s, N_ROWS, stride_kv, lat_s, rope_s,
                              sc0, sc1, sc2, sc3, slot_w, LW, LR)
                cp.commit_group()
                s0 = k_start + (i + NBUF) * BLOCK_N
                nxt_w = _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LW))
                nxt_r = _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LR))
                nxt_s = _tile_idx(idx_row, s0, k_end, BLOCK_N, COL)
            start = k_start + i * BLOCK_N
            cur = _tile_idx(idx_row, start, k_end, BLOCK_N, COL)
            valid = (cur >= 0) & (cur < N_ROWS)

            # 2. tile i has landed (every thread's copies: wait, then barrier); the barrier also ends
            #    last iteration's reads of the fp16 tile
            cp.wait_group(NBUF - 1)
            _barrier()
            slot = i % NBUF
            if PROBE != 1:
                w = lat_s.index(slot).load(LW)
                k16_w.store(_e4m3_words_f16(w))
                # everything else this slot holds goes to registers before barrier 3 (the slot is refilled after it)
                kr = rope_s.index(slot).permute([1, 0]).load(DB)  # [64, N] bf16
                s_0 = sc0.index(slot).load(COL)
                s_1 = sc1.index(slot).load(COL)
                s_2 = sc2.index(slot).load(COL)
                s_3 = sc3.index(slot).load(COL)
                # 3. the fp16 tile is complete
                _barrier()
                if NBUF == 1:  # the slot is read out: the next tile's gather overlaps this tile's products
                    _issue_gather(KVW, KVH, KVF, nxt_w, nxt_r, nxt_s, N_ROWS, stride_kv, lat_s, rope_s,
                                  sc0, sc1, sc2, sc3, 0, LW, LR)
                    cp.commit_group()
                    s0 = k_start + (i + 2) * BLOCK_N
                    nxt_w = _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LW))
                    nxt_r = _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LR))
                    nxt_s = _tile_idx(idx_row, s0, k_end, BLOCK_N, COL)

                if PROBE != 2:
                    s = _scores(q_s, qr_s, k16, kr, s_0, s_1, s_2, s_3, valid, zero_s, qk_scale, DA, DB)
                    if PROBE == 4:  # S only: kept elementwise, reduced once after the loop
                        s_sink = s_sink + gl.where(valid[None, :], s, 0.0)
                    else:
                        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
                    if PROBE != 3 and PROBE != 4:
                        acc0, acc1, acc2, acc3 = _pv(p, alpha, s_0, s_1, s_2, s_3, p0, p1, p2, p3, k16,
                                                     acc0, acc1, acc2, acc3, DA, DB)
        cp.wait_group(0)
        if PROBE == 4:
            l_i = l_i + gl.sum(s_sink, axis=1)

        _store_outputs(O, LSE, PART, t, sp, H, stride_ot, stride_oh, stride_lt, m_i, l_i, acc0, acc1, acc2, acc3,
                       SPLIT, ROW, COL)


    @gluon.jit
    def _ws_producer(KV, idx_row, k_start, k_end, n_tiles, N_ROWS, stride_kv, lat_s, rope_s, sc0, sc1, sc2, sc3,
                     k16_w, rope16, t0, t1, t2, t3, ready, free, BLOCK_N: gl.constexpr, NBUF: gl.constexpr,
                     DEPTH: gl.constexpr):
        """Worker partition of `_sparse_mla_gluon_ws_kernel`: gathers into the fp8 ring (as the key-split kernel),
        converts tile i into fp16 ring slot i % DEPTH once the consumer has freed it, copies rope and scales
        alongside (the fp8 slot is refilled before the consumer is done), and signals `ready`."""
        CH: gl.constexpr = 128
        PW: gl.constexpr = gl.num_warps()  # this partition's warps
        LW: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [PW, 1], [1, 0])
        LR: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
        LS: gl.constexpr = gl.BlockedLayout([1], [32], [PW], [0])
        KVW = KV.to(gl.pointer_type(gl.int32), bitcast=True)
        KVH = KV.to(gl.pointer_type(gl.bfloat16), bitcast=True)
        KVF = KV.to(gl.pointer_type(gl.float32), bitcast=True)

        for j in gl.static_range(NBUF - 1):
            s0 = k_start + j * BLOCK_N
            _issue_gather(KVW, KVH, KVF, _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LW)),
                          _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LR)),
                          _tile_idx(idx_row, s0, k_end, BLOCK_N, LS),
                          N_ROWS, stride_kv, lat_s, rope_s, sc0, sc1, sc2, sc3, j, LW, LR)
            cp.commit_group()
        for i in range(n_tiles):
            # gather tile i + NBUF - 1 into the slot of tile i - 1 (its reads ended before last iteration's
            # second barrier); past the split the indices read -1: masked, nothing is loaded
            s0 = k_start + (i + NBUF - 1) * BLOCK_N
            _issue_gather(KVW, KVH, KVF, _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LW)),
                          _tile_idx(idx_row, s0, k_end, BLOCK_N, gl.SliceLayout(1, LR)),
                          _tile_idx(idx_row, s0, k_end, BLOCK_N, LS),
                          N_ROWS, stride_kv, lat_s, rope_s, sc0, sc1, sc2, sc3, (i + NBUF - 1) % NBUF, LW, LR)
            cp.commit_group()
            cp.wait_group(NBUF - 1)
            _barrier()  # tile i landed for every producer thread's copies
            slot = i % NBUF
            w = lat_s.index(slot).load(LW)
            r = rope_s.index(slot).load(LR)
            c0 = sc0.index(slot).load(LS)
            c1 = sc1.index(slot).load(LS)
            c2 = sc2.index(slot).load(LS)
            c3 = sc3.index(slot).load(LS)
            ks = i % DEPTH
            # slot ks was last used by tile i - DEPTH; the first DEPTH waits pass at once (parity 1 = the phase
            # before the barrier's first)
            mbarrier.wait(free.index(ks), ((i // DEPTH) & 1) ^ 1)
            k16_w.index(ks).store(_e4m3_words_f16(w))
            rope16.index(ks).store(r)
            t0.index(ks).store(c0)
            t1.index(ks).store(c1)
            t2.index(ks).store(c2)
            t3.index(ks).store(c3)
            _barrier()  # every producer thread's stores are done (arrive is one thread's) and slot reads ended
            mbarrier.arrive(ready.index(ks))
        cp.wait_group(0)

    @gluon.jit
    def _ws_consumer(Q, IDX, O, LSE, PART, stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, H, N_ROWS, qk_scale,
                     t, sp, idx_row, k_start, k_end, n_tiles, q_s, qr_s, p0, p1, p2, p3, k16_w, rope16, t0, t1,
                     t2, t3, ready, free, SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, DEPTH: gl.constexpr):
        """Default partition of `_sparse_mla_gluon_ws_kernel`: stages q, then per tile waits `ready`, runs the
        key-split kernel's two products and online softmax on fp16 ring slot i % DEPTH, frees the slot, and
        writes the outputs / split partials as that kernel does."""
        BH: gl.constexpr = 16
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        DR: gl.constexpr = 64
        NW: gl.constexpr = gl.num_warps()
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW],
                                                      instr_shape=[16, 8])
        DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        ROW: gl.constexpr = gl.SliceLayout(1, MMA)
        COL: gl.constexpr = gl.SliceLayout(0, MMA)
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        SW: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        k16r = _as_f16(k16_w, [DEPTH, BLOCK_N, DN], SW)  # the same bytes: SW64 is SW in 8-byte units

        offs_qh = gl.arange(0, BH, layout=gl.SliceLayout(1, LQ))
        q_row = Q + t.to(gl.int64) * stride_qt + offs_qh[:, None] * stride_qh
        qm = (offs_qh < H)[:, None]
        offs_q = gl.arange(0, DN, layout=gl.SliceLayout(0, LQ))
        qn = gl.load(q_row + offs_q[None, :], mask=qm, other=0.0)
        q_s.store((qn.to(gl.float32) * (1.0 / 256.0)).to(gl.float16))
        offs_qr = gl.arange(0, DR, layout=gl.SliceLayout(0, LQ))
        qr_s.store(gl.load(q_row + DN + offs_qr[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        _barrier()  # q staged for every consumer warp

        m_i = gl.full([BH], float("-inf"), gl.float32, ROW)
        l_i = gl.full([BH], 0.0, gl.float32, ROW)
        acc0 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        acc1 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        acc2 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        acc3 = gl.full([BH, CH], 0.0, gl.float32, MMA)
        zero_s = gl.full([BH, BLOCK_N], 0.0, gl.float32, MMA)

        for i in range(n_tiles):
            cur = _tile_idx(idx_row, k_start + i * BLOCK_N, k_end, BLOCK_N, COL)
            valid = (cur >= 0) & (cur < N_ROWS)
            ks = i % DEPTH
            mbarrier.wait(ready.index(ks), (i // DEPTH) & 1)
            k16 = k16r.index(ks)
            kr = rope16.index(ks).permute([1, 0]).load(DB)  # [64, N] bf16
            s_0 = t0.index(ks).load(COL)
            s_1 = t1.index(ks).load(COL)
            s_2 = t2.index(ks).load(COL)
            s_3 = t3.index(ks).load(COL)

            s = _scores(q_s, qr_s, k16, kr, s_0, s_1, s_2, s_3, valid, zero_s, qk_scale, DA, DB)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
            acc0, acc1, acc2, acc3 = _pv(p, alpha, s_0, s_1, s_2, s_3, p0, p1, p2, p3, k16, acc0, acc1, acc2, acc3,
                                         DA, DB)
            # every consumer warp is done with slot ks and with P (arrive is one thread's; P is rewritten next)
            _barrier()
            mbarrier.arrive(free.index(ks))

        _store_outputs(O, LSE, PART, t, sp, H, stride_ot, stride_oh, stride_lt, m_i, l_i, acc0, acc1, acc2, acc3,
                       SPLIT, ROW, COL)

    @gluon.jit
    def _sparse_mla_gluon_ws_kernel(
        Q, KV, IDX, O, LSE, PART,
        stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
        H, TOPK, N_ROWS, KEYS_PER_SPLIT, qk_scale,
        SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, NBUF: gl.constexpr, DEPTH: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    ):
        """The key-split kernel, warp-specialized (`ws=True`): a producer partition of PRODUCER_WARPS warps
        gathers and converts tiles into a DEPTH-slot fp16 ring, the default partition (num_warps warps) runs the
        products and the softmax, so that gather / conversion and mma overlap within a program. Per slot,
        mbarrier `ready` (producer -> consumer) and `free` (consumer -> producer), count 1 each: the k-th use of
        slot s is tile k * DEPTH + s and waits for parity k & 1 (`free` for k & 1 ^ 1: its first wait passes)."""
        BH: gl.constexpr = 16
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        DR: gl.constexpr = 64
        t = gl.program_id(0)
        sp = gl.program_id(1)

        SW: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        SW64: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])  # SW in int64
        FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        lat_s = gl.allocate_shared_memory(gl.int32, [NBUF, BLOCK_N, CH], FLAT)
        rope_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_N, DR], SW)
        sc0 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        sc1 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        sc2 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        sc3 = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N], FLAT1)
        k16_w = gl.allocate_shared_memory(gl.int64, [DEPTH, BLOCK_N, CH], SW64)
        rope16 = gl.allocate_shared_memory(gl.bfloat16, [DEPTH, BLOCK_N, DR], SW)
        t0 = gl.allocate_shared_memory(gl.float32, [DEPTH, BLOCK_N], FLAT1)  # scales of chunk c: t<c>
        t1 = gl.allocate_shared_memory(gl.float32, [DEPTH, BLOCK_N], FLAT1)
        t2 = gl.allocate_shared_memory(gl.float32, [DEPTH, BLOCK_N], FLAT1)
        t3 = gl.allocate_shared_memory(gl.float32, [DEPTH, BLOCK_N], FLAT1)
        p0 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        p1 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        p2 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        p3 = gl.allocate_shared_memory(gl.float16, [BH, BLOCK_N], SW)
        q_s = gl.allocate_shared_memory(gl.float16, [BH, DN], SW)
        qr_s = gl.allocate_shared_memory(gl.bfloat16, [BH, DR], SW)
        ready = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(DEPTH):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(free.index(j), count=1)
        _barrier()  # initialised before either partition uses them

        k_start = sp * KEYS_PER_SPLIT
        k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
        n_tiles = gl.cdiv(k_end - k_start, BLOCK_N)
        idx_row = IDX + t.to(gl.int64) * stride_it
        gl.warp_specialize([
            (_ws_consumer, (Q, IDX, O, LSE, PART, stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, H, N_ROWS,
                            qk_scale, t, sp, idx_row, k_start, k_end, n_tiles, q_s, qr_s, p0, p1, p2, p3, k16_w,
                            rope16, t0, t1, t2, t3, ready, free, SPLIT, BLOCK_N, DEPTH)),
            (_ws_producer, (KV, idx_row, k_start, k_end, n_tiles, N_ROWS, stride_kv, lat_s, rope_s, sc0, sc1, sc2,
                            sc3, k16_w, rope16, t0, t1, t2, t3, ready, free, BLOCK_N, NBUF, DEPTH)),
        ], [PRODUCER_WARPS], [PRODUCER_REGS])


SMEM_PER_SM = {"big": 228 * 1024, "small": 100 * 1024}  # sm_90 / sm_120 class, per SM (1 KB of it per block reserved)


def programs_per_sm(block_n: int, nbuf: int, smem: str = "big", depth: int = 0, maxnreg: int | None = None,
                    num_warps: int = 4) -> int:
    """Programs that fit on one SM by shared memory and registers (the split rule's `waves`); depth: `ws` kernel.
    Without a register cap the kernels take 186-255 registers a thread: 2 programs of 4 warps at most."""
    # + the compiler's scratch (256 B in the sm_90 builds) and the 1 KB the driver reserves per block, of 228 KB
    need = smem_bytes_estimate(block_n, nbuf, depth) + 1536
    by_regs = 65536 // (maxnreg * 32 * num_warps) if maxnreg else 2
    return max(1, min(by_regs, SMEM_PER_SM[smem] // need))


def plan_splits(T: int, topk: int, block_n: int, device: torch.device, num_splits: int | None = None,
                waves: int | None = None, nbuf: int = DEFAULT[2], depth: int = 0, maxnreg: int | None = None,
                num_warps: int = 4) -> tuple[int, int]:
    """(split count, keys per split): `mla.pick_num_splits` with the shipped fp8 decode config's fit rule and, as
    waves, the programs per SM this config allows (unless given), rounded by `mla.split_keys`. depth > 0: the
    warp-specialized kernel with that fp16 ring depth."""
    smem = mla.smem_class(device)
    cfg = mla.CONFIGS[("small", "fp8_ds_mla", smem)]
    if num_splits is None:
        waves = waves or programs_per_sm(block_n, nbuf, smem, depth, maxnreg, num_warps)
        num_splits = mla.pick_num_splits(T, 1, topk, block_n, num_sms(device), waves, cfg.fit)
    return mla.split_keys(topk, num_splits, block_n)


def prepare_call(q, kv_cache, indices, out, kv_format="fp8_ds_mla"):
    """What the Gluon launchers share once q's shape is checked: the cache's format ("fp8_ds_mla": uint8 rows of 656
    bytes; "bf16": bf16 rows of 576) and the indices (int32 `[T, topk]`) are checked; returns (q, indices with unit
    last stride, the cache's row stride and row count, out (allocated, or checked), a fresh lse `[T, H]`)."""
    T, H, _ = q.shape
    if kv_format == "fp8_ds_mla":
        if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != FP8_DS_MLA_ROW_BYTES:
            raise ValueError(f"fp8_ds_mla cache must be uint8 rows of {FP8_DS_MLA_ROW_BYTES}, got {kv_cache.dtype} "
                             f"{tuple(kv_cache.shape)}")
    elif kv_format == "bf16":
        if kv_cache.dtype != torch.bfloat16 or kv_cache.shape[-1] != D_QK:
            raise ValueError(f"bf16 cache must be bf16 rows of {D_QK}, got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    else:
        raise ValueError(f"kv_format must be 'bf16' or 'fp8_ds_mla', got {kv_format!r}")
    if indices.dtype != torch.int32 or indices.dim() != 2 or indices.shape[0] != T:
        raise ValueError(f"indices must be int32 [T, topk] with T = {T}, got {indices.dtype} {tuple(indices.shape)}")
    stride_kv, n_rows = kv_row_geometry(kv_cache)
    if (stride_kv * kv_cache.element_size()) % 16 or kv_cache.data_ptr() % 16:  # every gather is 16-byte cp.async
        raise ValueError("cache rows must start on 16-byte boundaries")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if indices.stride(-1) != 1:
        indices = indices.contiguous()
    if out is None:
        out = torch.empty(T, H, D_NOPE, dtype=q.dtype, device=q.device)
    elif out.shape != (T, H, D_NOPE) or out.stride(-1) != 1:
        raise ValueError(f"out must be [T, H, {D_NOPE}] with contiguous rows, got {tuple(out.shape)}")
    return q, indices, stride_kv, n_rows, out, torch.empty(T, H, dtype=torch.float32, device=q.device)


def split_buffer(splits: int, T: int, H: int, lse: torch.Tensor) -> torch.Tensor:
    """The fp32 split partials and their lse in one allocation (`mla._part_rows`'s layout); with one split the
    kernel writes out and lse directly and takes lse as a placeholder."""
    return torch.empty(splits * T * H * (D_NOPE + 1), dtype=torch.float32, device=lse.device) if splits > 1 else lse


def sparse_mla_gluon(q, kv_cache, indices, sm_scale, *, num_splits=None, block_n=DEFAULT[0],
                     num_warps=DEFAULT[1], nbuf=DEFAULT[2], waves=None, out=None, ws=False, depth=2, probe=0,
                     maxnreg=None):
    """Sparse MLA forward over an fp8_ds_mla cache for H <= 16 (module docstring); returns `(out, lse)` as
    `mla.sparse_mla_launch` does: out `[T, H, 512]` in q's dtype, lse `[T, H]` fp32 natural log, zeros / -inf
    for a token without a valid key. ws: the warp-specialized kernel (num_warps consumer warps, 4 producer warps,
    an fp16 ring of `depth` tiles). probe: a stage-timing build of the key-split kernel (`PROBE` in its
    docstring). maxnreg: cap registers per thread (more programs per SM when shared memory allows them)."""
    if not HAVE_GLUON:
        raise RuntimeError("this Triton has no Gluon (triton.experimental.gluon)")
    if probe and (ws or nbuf < 2):
        raise ValueError(f"probe builds exist for the key-split kernel with nbuf >= 2, got ws={ws} nbuf={nbuf}")
    if maxnreg and ws:
        raise ValueError("maxnreg does not apply to the warp-specialized kernel (its partitions set their registers)")
    T, H, d = q.shape
    if d != D_QK or not 1 <= H <= BLOCK_H:
        raise ValueError(f"q must be [T, H <= {BLOCK_H}, {D_QK}], got {tuple(q.shape)}")
    q, indices, stride_kv, n_rows, out, lse = prepare_call(q, kv_cache, indices, out)
    topk = indices.shape[1]
    dev = q.device
    if T == 0:
        return out, lse
    splits, keys_per_split = plan_splits(T, topk, block_n, dev, num_splits, waves, nbuf, depth if ws else 0,
                                         maxnreg, num_warps)
    part = split_buffer(splits, T, H, lse)
    args = (q, kv_cache, indices, out, lse, part,
            q.stride(0), q.stride(1), stride_kv, indices.stride(0), out.stride(0), out.stride(1), H,
            H, topk, n_rows, keys_per_split, float(sm_scale) * LOG2E)
    if ws:
        _sparse_mla_gluon_ws_kernel[(T, splits)](
            *args, SPLIT=splits > 1, BLOCK_N=block_n, NBUF=nbuf, DEPTH=depth, PRODUCER_WARPS=WS_PRODUCER_WARPS,
            PRODUCER_REGS=WS_PRODUCER_REGS, num_warps=num_warps)
    else:
        _sparse_mla_gluon_kernel[(T, splits)](
            *args, SPLIT=splits > 1, BLOCK_N=block_n, NBUF=nbuf, num_warps=num_warps,
            **({"PROBE": probe} if probe else {}),  # a stage-timing build
            **({"maxnreg": maxnreg} if maxnreg else {}))
    if splits > 1:
        mla.merge_splits(part, out, lse, splits)
    return out, lse


def aot_compile(arch: int, block_n: int = DEFAULT[0], num_warps: int = DEFAULT[1], nbuf: int = DEFAULT[2],
                variant=DEFAULT[3], split: bool = True, maxnreg: int | None = None):
    """Compile the key-split kernel (variant False) or the warp-specialized one ("ws" / "ws<depth>", as in a CONFIGS
    entry) for `sm_<arch>` without a GPU (`triton.compile` on a `GluonASTSource`)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ws = isinstance(variant, str)
    fn = _sparse_mla_gluon_ws_kernel if ws else _sparse_mla_gluon_kernel
    consts = {"SPLIT": split, "BLOCK_N": block_n, "NBUF": nbuf}
    if "PROBE" in fn.arg_names:
        consts["PROBE"] = 0  # a constexpr with a default is still a constexpr of the signature
    if ws:
        consts.update(DEPTH=int(variant[2:] or 2), PRODUCER_WARPS=WS_PRODUCER_WARPS, PRODUCER_REGS=WS_PRODUCER_REGS)
    types = {"Q": "*bf16", "KV": "*u8", "IDX": "*i32", "O": "*bf16", "LSE": "*fp32", "PART": "*fp32",
             "qk_scale": "fp32"}
    sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
    c = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    div = ("Q", "KV", "IDX", "O", "LSE", "PART", "stride_qt", "stride_qh", "stride_kv", "stride_it", "stride_ot",
           "stride_oh")  # what the launcher specialises for GLM-5 shapes (all multiples of 16)
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in div}
    return triton.compile(GluonASTSource(fn, sig, c, attrs), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps,
                                   **({"maxnreg": maxnreg} if maxnreg else {})})


def compile_stats(arch: int, block_n: int = DEFAULT[0], num_warps: int = DEFAULT[1], nbuf: int = DEFAULT[2],
                  variant=DEFAULT[3], split: bool = True, maxnreg: int | None = None) -> dict:
    """`aot_compile` plus what the cubin says: shared memory, and registers / stack / local memory per thread from
    `cuobjdump -res-usage` when the Triton install ships it (None otherwise)."""
    k = aot_compile(arch, block_n, num_warps, nbuf, variant, split, maxnreg)
    row = {"config": config_name((block_n, num_warps, nbuf, variant, maxnreg)), "arch": arch, "block_n": block_n,
           "num_warps": num_warps, "nbuf": nbuf, "split": split, "variant": variant,
           "shared": int(k.metadata.shared), "limit": SMEM_LIMIT[arch],
           "depth": int(variant[2:] or 2) if isinstance(variant, str) else 0}
    row["fits"] = row["shared"] <= row["limit"]
    row.update(cubin_usage(k.asm["cubin"]))
    return row


def cubin_usage(cubin: bytes) -> dict:
    """{"regs", "stack", "local"} per thread from `cuobjdump -res-usage` when the Triton install ships it (None
    values otherwise)."""
    import os
    import re
    import subprocess
    import tempfile

    out = {"regs": None, "stack": None, "local": None}
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if os.path.exists(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(cubin)
        try:
            res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        finally:
            os.unlink(f.name)
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
        if m:
            out["regs"], out["stack"], out["local"] = (int(x) for x in m.groups())
    return out


__all__ = ["sparse_mla_gluon", "prepare_call", "split_buffer", "CONFIGS", "WS_CONFIGS", "DEFAULT", "config_name", "config_kwargs",
           "HAVE_GLUON", "plan_splits", "smem_bytes_estimate", "aot_compile", "compile_stats"]


if __name__ == "__main__":  # compile-only report: `TRITON_INTERPRET=0 python -m glm5lib.kernels.mla_gluon [ARCH ...]`
    import json
    import sys

    for a in [int(x) for x in sys.argv[1:]] or [90, 120]:
        for cfg in CONFIGS:
            try:
                r = compile_stats(a, *cfg)
            except Exception as exc:  # noqa: BLE001
                r = {"config": config_name(cfg), "arch": a, "error": str(exc).strip()[-300:]}
            print(json.dumps(r), flush=True)
