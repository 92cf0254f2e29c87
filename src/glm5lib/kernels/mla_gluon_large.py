"""Gluon sparse MLA forward for 17-128 heads on sm_90 (Hopper wgmma): prefill and decode, bf16 or fp8_ds_mla cache.

`sparse_mla_gluon_large(q, kv_cache, indices, sm_scale, kv_format=..., mode=...)` -> `(out [T, H, 512], lse [T, H])`,
the contract of `mla.sparse_mla_launch`; the fp32 twin is `naive.sparse_mla_ref`. `mla.sparse_mla` takes it on sm_90
for 17-128 heads and at least `mla.GLUON_LARGE_MIN_HT` tokens x heads (`mla.gluon_large_shape`): bf16 caches ->
"pingpong", fp8_ds_mla -> "dq" (the key-split kernel, "async", before round 21).

Why. The Triton kernel (`mla._sparse_mla_fwd_kernel`, `BLOCK_H` 64 on 8 warps) computes `S = q k^T` twice: its
wgmma layout for S is chosen by Triton's heuristic for a dot whose result feeds another dot (flash attention), which
puts all 8 warps along the 64 head rows (`warpsPerCTA = [8, 1]`, TTGIR of the sm_90 build); a warpgroup covers 64
rows, so the second warpgroup holds a copy of the first's S. The 576-wide product is done twice for every tile, and
the tensor cores do 1664 units of work per key and head where 1088 (576 + 512) are needed. Gluon takes the layouts
from the kernel. Three kernels:

- key-split (`_sparse_mla_wgmma_kernel`, modes "sync" / "async" / "defer"; 8 warps, no specialisation):
  - S `[64 heads, BLOCK_N keys]`: warps `[4, 2]`, each warpgroup the products for half of the keys (no copy);
  - the accumulator `[64, 512]` as four `[64, 128]` chunks, warps `[4, 2]`: each warpgroup half the columns (128
    fp32 registers per thread), as in the Triton kernel;
  - the row max and sum cross the two warpgroups (the compiler's reduction through shared memory), and P goes to the
    wgmma A-operand layout in registers (each warpgroup needs all keys' P for its half of the columns);
  - rows gathered by `cp.async` (a pointer tensor and a mask) into a ring of `NBUF` tiles in the wgmma (128-byte
    swizzled) layout, tile i + NBUF - 1 in flight while tile i is computed; q in shared memory. fp8_ds_mla rows go
    into a raw ring and every thread converts its share of each tile once, `e4m3 * scale` rounded to bf16 (exact
    for power-of-two scales, as FlashMLA's; the Triton kernel's `DEQUANT`), into one bf16 tile; the rope part
    (bf16 in the row) goes straight in.
  Measured (NOTES.md v9a-v9b): each warpgroup's S at N = 32 reads all of q from shared memory per tile, so S is bound
  by shared-memory bandwidth, not the tensor cores: its compute alone (no gathers) takes longer than FlashMLA's whole
  kernel. With each raw row over 8 threads (`RAW_ROW_THREADS`; NOTES.md v19a-v19b) its products alone
  (no gathers, no conversion) still take 132 us at fp8 decode B128 H64 against FlashMLA's 118 us whole, about 83 of
  them neither product but the per-tile chain around them (cross-warpgroup row statistics, P to both warpgroups).
- ping-pong (`_sparse_mla_pingpong_kernel`, mode "pingpong", bf16 caches; FlashMLA's sm_90 sparse prefill plan):
  three warpgroups. The two consumers take alternate 64-key tiles, each computing its tile's whole S (N = 64: q and
  the tile read at the tensor cores' pace) and P V on its half of the value columns for every tile, its own P from
  registers and the other's from shared memory (written into its tile's rope part, free once S is done); the running
  max passes between them through shared memory. A producer warpgroup gathers each tile in two halves (latent chunks
  0-1 and 2-3 + rope), each refilled as soon as its readers are done and in the order they are freed, with the next
  pair's index tiles read ahead.
  Buffer indices are computed at run time so that the compiler does not hoist (and spill) every wgmma's
  shared-memory descriptor; the partitions' registers (`PP_*_REGS`) are split so that the consumers spill nothing
  (the producer keeps 8 bytes of stack in Triton 3.6's sm_90 build).
- dequantising producer (`_sparse_mla_dq_kernel`, mode "dq", fp8_ds_mla caches; FlashMLA's sm_90 fp8 decode plan):
  three warpgroups and two bf16 tile buffers (q and both: 216 KB). Warpgroup 0 computes each 64-key tile's whole S
  (N = 64), so its softmax needs no reduction across warpgroups, then P V on value columns 0-255 with P from
  registers; it writes P (bf16) into the tile's rope part, which S has read, and hands it with the accumulator's
  rescale factor to warpgroup 1, which computes P V on columns 256-511 with P from shared memory. The producer loads
  rows into registers (16 bytes a thread and row, one row a thread, half a tile at a time, one half ahead of its
  conversion; the index tiles one tile further ahead), converts `e4m3 * scale` to bf16 and stores into the free
  buffer: no raw ring in shared memory. Its split plan is `dq_num_splits` (one program an SM: a fitted model of waves,
  a program's fixed cost and the merge). Measured (NOTES.md round 21, H100): fp8 decode B128 0.95x / 0.91x FlashMLA at
  64 / 128 heads, where the key-split kernel took 0.65x / 0.69x in the same run; its producer alone (103 us of the
  130 at 64 heads, another run) bounds it.

One program owns (token, 64-head block, split). Split-K partials (decode) use `mla._part_rows`'s layout and are
merged by `mla._merge_splits_kernel`; the split count is `mla.pick_num_splits` with one program per SM (shared
memory: about 221 KB at 64-key tiles), `dq_num_splits` for the dequantising-producer kernel. Below one wave the
dequantising-producer kernel may instead take the balanced schedule (`balanced_plan`): one program an SM, each a run
of equal length of the tokens' concatenated lists (the end of one token's and the start of the next's), its pieces'
partials merged by `_merge_runs_kernel`; past whole waves, the tail plan (`tail_plan`). Gluon does not run in
Triton's interpreter: the numeric checks are `scripts/gluon_mla_large_device.py` and `checks --profile full` (whose
large-head cases with >= 512 tokens x heads reach this module on sm_90), on an sm_90 GPU; `tests/test_mla_gluon.py`
compiles every config for sm_90.
"""

from __future__ import annotations

import functools

import torch

from glm5lib.kernels import common  # noqa: F401  (before triton: the interpreter switch)
from glm5lib.kernels import mla
from glm5lib.kernels.common import num_sms
from glm5lib.kernels.compile_report import SMEM_LIMIT
from glm5lib.kernels.mla import LOG2E, _merge_rows, _part_rows
from glm5lib.kernels.naive import D_NOPE, D_QK, D_ROPE

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from glm5lib.kernels.mla_gluon import HAVE_GLUON, prepare_call, split_buffer  # noqa: E402

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma, warpgroup_mma_init,
                                                                   warpgroup_mma_wait)

    from glm5lib.kernels.mla_gluon import _async_copy, _barrier, _softmax_step, _store_outputs, _tile_idx

BLOCK_H = 64  # wgmma's M: one warpgroup covers 64 rows
NUM_WARPS = 8  # two warpgroups, splitting S by keys and the accumulator by columns
# (block_n, nbuf, mode) the device script times; DEFAULT is what `sparse_mla_gluon_large` takes unless told. mode:
# "sync" / "async" / "defer" the key-split kernel with its ASYNC 0 / 1 / 2 (its docstring: one wait per wgmma, one per
# tile's S and one per its P V, P V waited for behind the next tile's S), "pingpong" the three-warpgroup kernel
# (`_sparse_mla_pingpong_kernel`, nbuf must be 2), "dq" the three-warpgroup kernel with a dequantising producer
# (`_sparse_mla_dq_kernel`, nbuf 2). "defer" and "pingpong" take bf16 caches only, "dq" fp8_ds_mla only.
CONFIGS = [(64, 2, "async"), (64, 2, "sync"), (64, 2, "defer"), (32, 2, "async"), (64, 2, "pingpong"), (64, 2, "dq")]
DEFAULT = (64, 2, "async")
ASYNC = {"sync": 0, "async": 1, "defer": 2}
BF16_ONLY = ("defer", "pingpong")
FP8_ONLY = ("dq",)
WS_MODES = ("pingpong", "dq")  # the warp-specialised kernels: 64-key tiles, two buffers, probes 1-2
# setmaxnreg of the ping-pong kernel's second consumer and of its producer (the first consumer, the default partition,
# takes what the launch leaves). Triton 3.6's sm_90 builds: the consumers spill nothing down to 208; the producer (which
# holds two pairs' index tiles) keeps 8 bytes of stack at 88 and more below
PP_CONSUMER_REGS = 208
PP_PRODUCER_REGS = 88
# the same for the dequantising-producer kernel; the default partition (warpgroup 0) takes the rest, 208. Triton 3.6's
# sm_90 build: FlashMLA's split (192 / 160 / 152) spills 104 bytes a thread in warpgroup 0; at 160 / 136 only
# warpgroup 0 keeps a few (6 stores, 5 loads); the producer, which holds two half tiles' loads (88 registers), spills
# at 128
DQ_CONSUMER_REGS = 160
DQ_PRODUCER_REGS = 136
# threads that copy one raw fp8_ds_mla row's 512 e4m3 bytes in the key-split kernel, 16 bytes each (its TPR): 32 is
# one warp a row (a warp's copy instruction reads one row's four 128-byte lines; each thread holds 8 row offsets at
# 64-key tiles), 8 reads 4 rows' lines (2 row offsets a thread), the mapping that was faster in the fp8-cache kernel
# for 1-16 heads (`mla_gluon_fp8mma.ROW_THREADS`)
RAW_ROW_THREADS = 8
RAW_ROW_THREADS_CHOICES = (4, 8, 16, 32)


def configs_for(kv_format: str) -> list:
    """The CONFIGS entries that apply to a cache format."""
    return [c for c in CONFIGS if c[2] not in (FP8_ONLY if kv_format == "bf16" else BF16_ONLY)]


def config_name(cfg) -> str:
    return f"BN{cfg[0]}-nbuf{cfg[1]}-{cfg[2]}"


def smem_bytes_estimate(block_n: int, nbuf: int, kv_format: str = "bf16", mode: str = DEFAULT[2]) -> int:
    """Shared memory of one program: q, the bf16 tile ring, and (fp8, but for "dq", whose producer converts from
    registers) the raw gather ring with its scales."""
    q = BLOCK_H * D_QK * 2
    # the key-split kernel over fp8 rows: one bf16 latent tile, a ring of rope tiles and raw rows + scales
    if kv_format == "fp8_ds_mla" and mode not in FP8_ONLY:
        return q + block_n * D_NOPE * 2 + nbuf * block_n * (D_ROPE * 2 + D_NOPE + 16)
    return q + nbuf * block_n * D_QK * 2


if HAVE_GLUON:
    @gluon.jit
    def _gather_bf16(KV, idx_g, idx_r, N_ROWS, stride_kv, k0, k1, k2, k3, kr, slot, LG: gl.constexpr,
                     LGR: gl.constexpr):
        """cp.async one tile of bf16 rows into ring slot `slot` of the four latent chunks and the rope tile;
        invalid rows are masked copies of row 0 (zero-filled)."""
        CH: gl.constexpr = 128
        v = (idx_g >= 0) & (idx_g < N_ROWS)
        rb = gl.multiple_of(gl.where(v, idx_g, 0).to(gl.int64) * stride_kv, 8)  # elements
        offs = gl.arange(0, CH, layout=gl.SliceLayout(0, LG))
        m = v[:, None]
        _async_copy(k0.index(slot), KV + rb[:, None] + 0 * CH + offs[None, :], mask=m)
        _async_copy(k1.index(slot), KV + rb[:, None] + 1 * CH + offs[None, :], mask=m)
        _async_copy(k2.index(slot), KV + rb[:, None] + 2 * CH + offs[None, :], mask=m)
        _async_copy(k3.index(slot), KV + rb[:, None] + 3 * CH + offs[None, :], mask=m)
        v = (idx_r >= 0) & (idx_r < N_ROWS)
        rb = gl.multiple_of(gl.where(v, idx_r, 0).to(gl.int64) * stride_kv, 8)
        offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, LGR))
        _async_copy(kr.index(slot), KV + rb[:, None] + 4 * CH + offs_r[None, :], mask=v[:, None])

    @gluon.jit
    def _gather_fp8(KV, idx_g, idx_r, idx_s, N_ROWS, stride_kv, raw, sc, kr, slot, LW: gl.constexpr,
                    LGR: gl.constexpr, LSC: gl.constexpr):
        """cp.async one tile of fp8_ds_mla rows: the 512 e4m3 bytes as int32 words into raw ring slot `slot`, the
        4 fp32 scales into `sc`, and the bf16 rope part straight into the rope tile (zero-filled when invalid)."""
        v = (idx_g >= 0) & (idx_g < N_ROWS)
        w_off = gl.multiple_of(gl.where(v, idx_g, 0).to(gl.int64) * (stride_kv // 4), 4)
        offs_w = gl.arange(0, 128, layout=gl.SliceLayout(0, LW))
        KVW = KV.to(gl.pointer_type(gl.int32), bitcast=True)
        _async_copy(raw.index(slot), KVW + w_off[:, None] + offs_w[None, :], mask=v[:, None])
        v = (idx_r >= 0) & (idx_r < N_ROWS)
        h_off = gl.multiple_of((gl.where(v, idx_r, 0).to(gl.int64) * stride_kv + 528) // 2, 8)
        offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, LGR))
        KVH = KV.to(gl.pointer_type(gl.bfloat16), bitcast=True)
        _async_copy(kr.index(slot), KVH + h_off[:, None] + offs_r[None, :], mask=v[:, None])
        v = (idx_s >= 0) & (idx_s < N_ROWS)
        f_off = gl.multiple_of((gl.where(v, idx_s, 0).to(gl.int64) * stride_kv + 512) // 4, 4)
        offs_s = gl.arange(0, 4, layout=gl.SliceLayout(0, LSC))
        KVF = KV.to(gl.pointer_type(gl.float32), bitcast=True)
        _async_copy(sc.index(slot), KVF + f_off[:, None] + offs_s[None, :], mask=v[:, None])

    @gluon.jit
    def _dequant_chunk(raw, sc, slot, c: gl.constexpr, dst, LW: gl.constexpr, LSC: gl.constexpr):
        """Latent chunk c (128 columns = 32 words) of raw slot `slot`: e4m3 * the row's chunk scale -> bf16 into
        `dst` ([BLOCK_N, 128] in the wgmma layout)."""
        w = raw.index(slot).slice(c * 32, 32, 1).load(LW)  # [N, 32] int32
        s = sc.index(slot).load(LSC)  # [N, 4]
        col = gl.arange(0, 4, layout=gl.SliceLayout(0, LSC))
        NW: gl.constexpr = gl.num_warps()
        LX: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NW, 1], [1, 0])  # what the word unpacking gives
        s_c = gl.convert_layout(gl.sum(gl.where(col[None, :] == c, s, 0.0), axis=1), gl.SliceLayout(1, LX))
        dst.store((_e4m3_words_f32(w, LX) * s_c[:, None]).to(gl.bfloat16))

    @gluon.jit
    def _e4m3_words_f32(w, LX: gl.constexpr):
        """[N, 32] int32 words of e4m3 bytes -> [N, 128] fp32 in memory order, in layout LX."""
        N: gl.constexpr = w.shape[0]
        # e4m3 -> fp16 is exact: two cvt.rn.f16x2.e4m3x2 per word, bytes in memory order e0..e3
        e0, e1, e2, e3 = gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .b32 a, b;\n mov.b32 {lo, hi}, $4;\n cvt.rn.f16x2.e4m3x2 a, lo;\n"
            " cvt.rn.f16x2.e4m3x2 b, hi;\n mov.b32 {$0, $1}, a;\n mov.b32 {$2, $3}, b; }",
            "=h,=h,=h,=h,r", [w], dtype=(gl.float16, gl.float16, gl.float16, gl.float16), is_pure=True, pack=1)
        # join(join(e0, e2), join(e1, e3))[n, j, a, b] = e_(2a + b): memory order after the reshape
        return gl.convert_layout(gl.reshape(gl.join(gl.join(e0, e2), gl.join(e1, e3)), [N, 128]), LX).to(gl.float32)

    @gluon.jit
    def _scores_wgmma(q0, q1, q2, q3, qr, k0, k1, k2, k3, kr, zero_s, IS_ASYNC: gl.constexpr):
        """S = q k^T of one tile: the four latent chunks and the rope part, K^T as transposed views of the tile
        (IS_ASYNC: issued without waiting; the caller waits)."""
        s = warpgroup_mma(q0, k0.permute([1, 0]), zero_s, use_acc=False, is_async=IS_ASYNC)
        s = warpgroup_mma(q1, k1.permute([1, 0]), s, is_async=IS_ASYNC)
        s = warpgroup_mma(q2, k2.permute([1, 0]), s, is_async=IS_ASYNC)
        s = warpgroup_mma(q3, k3.permute([1, 0]), s, is_async=IS_ASYNC)
        return warpgroup_mma(qr, kr.permute([1, 0]), s, is_async=IS_ASYNC)

    @gluon.jit
    def _sparse_mla_wgmma_kernel(
        Q, KV, IDX, O, LSE, PART,
        stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
        H, TOPK, N_ROWS, KEYS_PER_SPLIT, qk_scale,
        KV_FP8: gl.constexpr, SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, NBUF: gl.constexpr,
        ASYNC: gl.constexpr = 1, PROBE: gl.constexpr = 0, TPR: gl.constexpr = RAW_ROW_THREADS,
    ):
        """One program: token t, head block hb (64 heads), split sp of the top-k list (module docstring).

        ASYNC: 0 every wgmma waited for on its own; 1 a tile's five S products issued together and waited for once,
        its four P V products likewise; 2 (bf16 caches) as 1, with each tile's P V waited for only after the next
        tile's S has been issued.
        PROBE (stage timing, `scripts/gluon_mla_large_device.py --probe`; the outputs are meaningless): 1 only the
        gathers (fp8: not converted), 2 no gathers (the products on whatever the tiles hold), 3 (fp8) the gathers and
        the conversion, no products, 4 (fp8) the products alone (no gathers, no conversion), 5 (fp8) as 4 without
        S (the softmax and P V on zeros), 6 (fp8) as 4 without P V (nor P's conversion to its operand layout).
        TPR (fp8): threads that copy one raw row's 512 e4m3 bytes, 16 bytes each (`RAW_ROW_THREADS`)."""
        gl.static_assert(not (KV_FP8 and ASYNC == 2), "ASYNC 2 needs a tile ring (bf16 caches)")
        BH: gl.constexpr = 64
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        DR: gl.constexpr = 64
        NW: gl.constexpr = gl.num_warps()
        WN: gl.constexpr = NW // 4  # warpgroups, side by side along the keys (S) and the columns (acc)
        t = gl.program_id(0)
        hb = gl.program_id(1)
        sp = gl.program_id(2)

        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WN],
                                                      instr_shape=[16, BLOCK_N // WN, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WN],
                                                      instr_shape=[16, CH // WN, 16])
        PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
        ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
        COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
        ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
        COL_O: gl.constexpr = gl.SliceLayout(0, O_L)
        LG: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NW, 1], [1, 0])  # [N, 128] bf16, 16 B per copy
        LGR: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])  # [N, 64] bf16
        LW: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])  # [N, 32] int32 words of a chunk
        LWG: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPR, TPR], [NW, 1], [1, 0])  # [N, 128] words: raw gather
        LSC: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [NW, 1], [1, 0])  # [N, 4] fp32 scales

        # the wgmma operand layout (128-byte swizzle); a ring [NBUF, N, C] takes the rank-2 layout of its slots
        SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # bf16 rows are gathered into the tile ring itself; fp8 rows into a raw ring, then converted into one tile
        TS: gl.constexpr = 1 if KV_FP8 else NBUF
        k0 = gl.allocate_shared_memory(gl.bfloat16, [TS, BLOCK_N, CH], SH)
        k1 = gl.allocate_shared_memory(gl.bfloat16, [TS, BLOCK_N, CH], SH)
        k2 = gl.allocate_shared_memory(gl.bfloat16, [TS, BLOCK_N, CH], SH)
        k3 = gl.allocate_shared_memory(gl.bfloat16, [TS, BLOCK_N, CH], SH)
        kr = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BLOCK_N, DR], SH)
        q0 = gl.allocate_shared_memory(gl.bfloat16, [BH, CH], SH)
        q1 = gl.allocate_shared_memory(gl.bfloat16, [BH, CH], SH)
        q2 = gl.allocate_shared_memory(gl.bfloat16, [BH, CH], SH)
        q3 = gl.allocate_shared_memory(gl.bfloat16, [BH, CH], SH)
        qr = gl.allocate_shared_memory(gl.bfloat16, [BH, DR], SH)
        if KV_FP8:
            FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
            raw = gl.allocate_shared_memory(gl.int32, [NBUF, BLOCK_N, CH], FLAT)
            sc = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N, 4], FLAT)

        k_start = sp * KEYS_PER_SPLIT
        k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
        n_tiles = gl.cdiv(k_end - k_start, BLOCK_N)
        idx_row = IDX + t.to(gl.int64) * stride_it
        IG: gl.constexpr = gl.SliceLayout(1, LWG) if KV_FP8 else gl.SliceLayout(1, LG)
        IR: gl.constexpr = gl.SliceLayout(1, LGR)
        IS: gl.constexpr = gl.SliceLayout(1, LSC)

        # the first NBUF - 1 tiles' gathers go out before q is staged
        for j in gl.static_range(NBUF - 1):
            s0 = k_start + j * BLOCK_N
            if KV_FP8:
                _gather_fp8(KV, _tile_idx(idx_row, s0, k_end, BLOCK_N, IG), _tile_idx(idx_row, s0, k_end, BLOCK_N, IR),
                            _tile_idx(idx_row, s0, k_end, BLOCK_N, IS), N_ROWS, stride_kv, raw, sc, kr, j, LWG, LGR,
                            LSC)
            else:
                _gather_bf16(KV, _tile_idx(idx_row, s0, k_end, BLOCK_N, IG),
                             _tile_idx(idx_row, s0, k_end, BLOCK_N, IR), N_ROWS, stride_kv, k0, k1, k2, k3, kr, j,
                             LG, LGR)
            cp.commit_group()
        s0 = k_start + (NBUF - 1) * BLOCK_N
        nxt_g = _tile_idx(idx_row, s0, k_end, BLOCK_N, IG)
        nxt_r = _tile_idx(idx_row, s0, k_end, BLOCK_N, IR)
        nxt_s = _tile_idx(idx_row, s0, k_end, BLOCK_N, IS)

        # q rows of this head block (rows past H are zeros) into shared memory, the wgmma A operand
        offs_qh = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, LG))
        q_row = Q + t.to(gl.int64) * stride_qt + offs_qh[:, None] * stride_qh
        qm = (offs_qh < H)[:, None]
        offs_q = gl.arange(0, CH, layout=gl.SliceLayout(0, LG))
        q0.store(gl.load(q_row + 0 * CH + offs_q[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        q1.store(gl.load(q_row + 1 * CH + offs_q[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        q2.store(gl.load(q_row + 2 * CH + offs_q[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        q3.store(gl.load(q_row + 3 * CH + offs_q[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        offs_qhr = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, LGR))
        offs_qr = gl.arange(0, DR, layout=gl.SliceLayout(0, LGR))
        qr.store(gl.load(Q + t.to(gl.int64) * stride_qt + offs_qhr[:, None] * stride_qh + DN + offs_qr[None, :],
                         mask=(offs_qhr < H)[:, None], other=0.0).to(gl.bfloat16))

        m_i = gl.full([BH], float("-inf"), gl.float32, ROW_S)
        l_i = gl.full([BH], 0.0, gl.float32, ROW_S)
        acc0 = gl.full([BH, CH], 0.0, gl.float32, O_L)
        acc1 = gl.full([BH, CH], 0.0, gl.float32, O_L)
        acc2 = gl.full([BH, CH], 0.0, gl.float32, O_L)
        acc3 = gl.full([BH, CH], 0.0, gl.float32, O_L)
        zero_s = gl.full([BH, BLOCK_N], 0.0, gl.float32, S_L)

        if ASYNC == 2:  # the P V products of a tile are waited for in the next iteration: carried as in flight
            acc0 = warpgroup_mma_init(acc0)
            acc1 = warpgroup_mma_init(acc1)
            acc2 = warpgroup_mma_init(acc2)
            acc3 = warpgroup_mma_init(acc3)
            pa = gl.full([BH, BLOCK_N], 0.0, gl.bfloat16, PA)
        for i in range(n_tiles):
            # 1. tile i has landed (every thread's copies, then the barrier, which also ends every warpgroup's reads
            #    of tile i - 1 unless its P V is still in flight (ASYNC 2): its slot is refilled next)
            cp.wait_group(NBUF - 2)
            _barrier()
            slot = i % NBUF
            ts = slot  # the bf16 tile's slot
            if KV_FP8:  # the raw slot -> the one bf16 tile, converted once for all heads
                ts = 0
                if PROBE != 1 and PROBE < 4:
                    _dequant_chunk(raw, sc, slot, 0, k0.index(0), LW, LSC)
                    _dequant_chunk(raw, sc, slot, 1, k1.index(0), LW, LSC)
                    _dequant_chunk(raw, sc, slot, 2, k2.index(0), LW, LSC)
                    _dequant_chunk(raw, sc, slot, 3, k3.index(0), LW, LSC)
                    _barrier()
            fence_async_shared()  # generic-proxy writes (cp.async, stores) before the wgmma reads
            if ASYNC == 2:
                # 2a. S of tile i goes out behind tile i - 1's P V; then that P V is waited for (5 groups, tile i's
                #     products, stay in flight) and a barrier ends both warpgroups' reads of tile i - 1's slot
                s = _scores_wgmma(q0, q1, q2, q3, qr, k0.index(ts), k1.index(ts), k2.index(ts), k3.index(ts),
                                  kr.index(slot), zero_s, True)
                acc0, acc1, acc2, acc3, pa = warpgroup_mma_wait(5, deps=[acc0, acc1, acc2, acc3, pa])
                _barrier()
            # 2. the gather of tile i + NBUF - 1 into the slot tile i - 1 used
            slot_w = (i + NBUF - 1) % NBUF
            if PROBE != 2 and PROBE < 4:
                if KV_FP8:
                    _gather_fp8(KV, nxt_g, nxt_r, nxt_s, N_ROWS, stride_kv, raw, sc, kr, slot_w, LWG, LGR, LSC)
                else:
                    _gather_bf16(KV, nxt_g, nxt_r, N_ROWS, stride_kv, k0, k1, k2, k3, kr, slot_w, LG, LGR)
            cp.commit_group()
            s0 = k_start + (i + NBUF) * BLOCK_N
            nxt_g = _tile_idx(idx_row, s0, k_end, BLOCK_N, IG)
            nxt_r = _tile_idx(idx_row, s0, k_end, BLOCK_N, IR)
            nxt_s = _tile_idx(idx_row, s0, k_end, BLOCK_N, IS)

            if PROBE != 1 and PROBE != 3:
                # 3. S = q k^T: each warpgroup its half of the keys
                cur = _tile_idx(idx_row, k_start + i * BLOCK_N, k_end, BLOCK_N, COL_S)
                valid = (cur >= 0) & (cur < N_ROWS)
                if PROBE == 5:  # S left out: the softmax and P V on zeros
                    s = zero_s
                elif ASYNC != 2:
                    s = _scores_wgmma(q0, q1, q2, q3, qr, k0.index(ts), k1.index(ts), k2.index(ts), k3.index(ts),
                                      kr.index(slot), zero_s, ASYNC == 1)
                if ASYNC and PROBE != 5:  # the five products in flight together, one wait
                    s = warpgroup_mma_wait(0, deps=[s])
                s = gl.where(valid[None, :], s * qk_scale, float("-inf"))  # log2 domain

                # 4. online softmax (row statistics across both warpgroups) and acc += P V
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
                pa = gl.convert_layout(p.to(gl.bfloat16), PA)
                a2 = gl.convert_layout(alpha, ROW_O)[:, None]
                if PROBE == 6:  # P V (and P's conversion to the A-operand layout) left out: only the rescale
                    acc0 = acc0 * a2
                    acc1 = acc1 * a2
                    acc2 = acc2 * a2
                    acc3 = acc3 * a2
                else:
                    acc0 = warpgroup_mma(pa, k0.index(ts), acc0 * a2, is_async=ASYNC > 0)
                    acc1 = warpgroup_mma(pa, k1.index(ts), acc1 * a2, is_async=ASYNC > 0)
                    acc2 = warpgroup_mma(pa, k2.index(ts), acc2 * a2, is_async=ASYNC > 0)
                    acc3 = warpgroup_mma(pa, k3.index(ts), acc3 * a2, is_async=ASYNC > 0)
                    if ASYNC == 1:  # P (registers) stays alive until the four products are done
                        acc0, acc1, acc2, acc3, pa = warpgroup_mma_wait(0, deps=[acc0, acc1, acc2, acc3, pa])
        if ASYNC == 2:
            acc0, acc1, acc2, acc3, pa = warpgroup_mma_wait(0, deps=[acc0, acc1, acc2, acc3, pa])
        cp.wait_group(0)

        _store_outputs(O, LSE, PART, t, sp, H, stride_ot, stride_oh, stride_lt, gl.convert_layout(m_i, ROW_O),
                       gl.convert_layout(l_i, ROW_O), acc0, acc1, acc2, acc3, SPLIT, ROW_O, COL_O, BH, hb * BH, 2, 1.0)


    # ---- ping-pong kernel (bf16 caches): the two warpgroups take alternate tiles (FlashMLA's sm_90 prefill plan) ----

    @gluon.jit
    def _opaque_zero(x):
        """0, computed from x at run time (the compiler cannot fold it)."""
        return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [x], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def _pp_gather(KV, idx_g, idx_r, N_ROWS, stride_kv, ka, kb, kr, slot, RIGHT: gl.constexpr, LG: gl.constexpr,
                   LGR: gl.constexpr):
        """cp.async one half of a tile's rows (indices idx_g / idx_r in the two copy layouts) into buffer `slot`: the
        latent chunks 0-1 (left) or 2-3 and the rope part (right); invalid rows are masked copies of row 0
        (zero-filled)."""
        CH: gl.constexpr = 128
        v = (idx_g >= 0) & (idx_g < N_ROWS)
        rb = gl.multiple_of(gl.where(v, idx_g, 0).to(gl.int64) * stride_kv + 2 * RIGHT * CH, 8)  # elements
        offs = gl.arange(0, CH, layout=gl.SliceLayout(0, LG))
        _async_copy(ka.index(slot), KV + rb[:, None] + offs[None, :], mask=v[:, None])
        _async_copy(kb.index(slot), KV + rb[:, None] + CH + offs[None, :], mask=v[:, None])
        if RIGHT:
            v = (idx_r >= 0) & (idx_r < N_ROWS)
            rb = gl.multiple_of(gl.where(v, idx_r, 0).to(gl.int64) * stride_kv, 8)
            offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, LGR))
            _async_copy(kr.index(slot), KV + rb[:, None] + 4 * CH + offs_r[None, :], mask=v[:, None])

    @gluon.jit
    def _pp_producer(KV, idx_row, k_start, k_end, n_pairs, N_ROWS, stride_kv, k0, k1, k2, k3, kr, ready, free,
                     BLOCK_N: gl.constexpr, PROBE: gl.constexpr):
        """Worker partition: per pair r, the halves of tiles 2r (buffer 0) and 2r + 1 (buffer 1) in the order the
        consumers free them: 0-left (WG0 after P0 V0), 0-right (WG1 after sS0 V0, mid-pair), 1-right and 1-left (at
        the end of the pair). FlashMLA's order, 0-left, 1-right, 0-right, 1-left, would hold buffer 0's right half
        back until the end of the pair, and WG0 then waits for it at the start of the next: 8 % slower at H64 (NOTES.md
        v10b). A half (barrier 2 * buffer + side) is refilled once `free` says its readers are done; each thread's
        copies arrive on `ready` when they land (cp.async.mbarrier.arrive, count = this partition's threads). The next
        pair's index tiles are read one pair ahead, so no copy waits on an index load."""
        PW: gl.constexpr = gl.num_warps()
        LG: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [PW, 1], [1, 0])
        LGR: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
        IG: gl.constexpr = gl.SliceLayout(1, LG)
        IR: gl.constexpr = gl.SliceLayout(1, LGR)
        n_g0 = _tile_idx(idx_row, k_start, k_end, BLOCK_N, IG)
        n_g1 = _tile_idx(idx_row, k_start + BLOCK_N, k_end, BLOCK_N, IG)
        n_r0 = _tile_idx(idx_row, k_start, k_end, BLOCK_N, IR)
        n_r1 = _tile_idx(idx_row, k_start + BLOCK_N, k_end, BLOCK_N, IR)
        for r in range(n_pairs):
            ph = (r & 1) ^ 1  # the first use of each half passes at once
            g0 = n_g0
            g1 = n_g1
            r0 = n_r0
            r1 = n_r1
            s2 = k_start + (2 * r + 2) * BLOCK_N  # past the split: -1 (masked), nothing is loaded
            n_g0 = _tile_idx(idx_row, s2, k_end, BLOCK_N, IG)
            n_g1 = _tile_idx(idx_row, s2 + BLOCK_N, k_end, BLOCK_N, IG)
            n_r0 = _tile_idx(idx_row, s2, k_end, BLOCK_N, IR)
            n_r1 = _tile_idx(idx_row, s2 + BLOCK_N, k_end, BLOCK_N, IR)
            b0 = _opaque_zero(r)  # as in `_pp_consumer`: shared addresses computed in the loop, not hoisted
            b1 = b0 + 1
            mbarrier.wait(free.index(0), ph)
            if PROBE != 2:
                _pp_gather(KV, g0, r0, N_ROWS, stride_kv, k0, k1, kr, b0, False, LG, LGR)
            cp.mbarrier_arrive(ready.index(0), increment_count=False)
            mbarrier.wait(free.index(1), ph)
            if PROBE != 2:
                _pp_gather(KV, g0, r0, N_ROWS, stride_kv, k2, k3, kr, b0, True, LG, LGR)
            cp.mbarrier_arrive(ready.index(1), increment_count=False)
            mbarrier.wait(free.index(3), ph)
            if PROBE != 2:
                _pp_gather(KV, g1, r1, N_ROWS, stride_kv, k2, k3, kr, b1, True, LG, LGR)
            cp.mbarrier_arrive(ready.index(3), increment_count=False)
            mbarrier.wait(free.index(2), ph)
            if PROBE != 2:
                _pp_gather(KV, g1, r1, N_ROWS, stride_kv, k0, k1, kr, b1, False, LG, LGR)
            cp.mbarrier_arrive(ready.index(2), increment_count=False)
        cp.wait_group(0)

    @gluon.jit
    def _pp_consumer(W: gl.constexpr, O, LSE, PART, t, n_t, hb, sp, H, stride_ot, stride_oh, stride_lt, N_ROWS, qk_scale,
                     idx_row, k_start, k_end, n_pairs, qa, qr, k0, k1, k2, k3, kr, sm0, sm1, sl0, sl1,
                     ready, free, bar_a, bar_b, bar_l, SPLIT: gl.constexpr, BLOCK_N: gl.constexpr,
                     PROBE: gl.constexpr):
        """Warpgroup W (0: the default partition, 1: a worker) of the ping-pong kernel: S of tiles 2r + W, and P V
        for every tile on its half of the value columns (chunks 2W, 2W + 1): its own P from registers, the other
        warpgroup's from shared memory. Per pair of tiles r, with m the running max after tile 2r - 1:

        WG0: S0; m0 = max(m, rowmax S0); acc, l to m0; P0 (to m0) -> sS0, m0 -> sM0, arrive `a`; acc += P0 V0;
             frees buffer 0's left half; waits `b`; acc, l from m0 to m1; acc += sS1 V1; frees buffer 1's left half
             and (with WG1) its right half, where sS1 lives.
        WG1: S1; waits `a`; m1 = max(m0, rowmax S1); l to m1 plus its P1; P1 -> sS1, m1 -> sM1; acc to m0;
             acc += sS0 V0; (sS0 read) arrive `b`, frees buffer 0's right half; acc from m0 to m1; acc += P1 V1;
             frees (with WG0) buffer 1's right half.

        sS0 / sS1 are the rope parts of the tile buffers (free once that tile's S is done; FlashMLA does the same).
        Each warpgroup's l sums its own tiles' P; the two are added at the end. Every shared buffer is rewritten
        only after the barrier that follows its last read: sS0 / sM0 after `b`, sS1 / sM1 after the next `a`."""
        BH: gl.constexpr = 64
        CH: gl.constexpr = 128
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH, 16])
        PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
        ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
        COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
        ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
        COL_O: gl.constexpr = gl.SliceLayout(0, O_L)
        if W == 0:  # this warpgroup's value columns
            va = k0
            vb = k1
        else:
            va = k2
            vb = k3

        m_run = gl.full([BH], float("-inf"), gl.float32, ROW_S)
        l_i = gl.full([BH], 0.0, gl.float32, ROW_S)
        acc_a = gl.full([BH, CH], 0.0, gl.float32, O_L)
        acc_b = gl.full([BH, CH], 0.0, gl.float32, O_L)
        zero_s = gl.full([BH, BLOCK_N], 0.0, gl.float32, S_L)
        n_main = n_pairs
        if PROBE == 1:  # the producer alone: every half handed back unread by the warpgroups that free it
            for r in range(n_pairs):
                mbarrier.wait(ready.index(2 * W), r & 1)
                mbarrier.wait(ready.index(2 * W + 1), r & 1)
                _barrier()
                if W == 0:
                    mbarrier.arrive(free.index(0))
                    mbarrier.arrive(free.index(2))
                else:
                    mbarrier.arrive(free.index(1))
                mbarrier.arrive(free.index(3))
            n_main = 0
        for r in range(n_main):
            ph = r & 1
            # buffer indices the compiler cannot fold: with constant ones it hoists every wgmma's shared-memory
            # descriptor (one 64-bit value per 16-column step) out of the loop, and they spill
            b0 = _opaque_zero(r)
            b1 = b0 + 1
            bw = b0 + W
            # S of tile 2r + W, a half of the tile as it lands: WG0 the left half first, WG1 the right (the order
            # the producer fills them in)
            mbarrier.wait(ready.index(2 * W + W), ph)
            fence_async_shared()  # the producer's cp.async writes before this warpgroup's wgmma reads
            if W == 0:
                s = warpgroup_mma(qa.index(b0), k0.index(bw).permute([1, 0]), zero_s, use_acc=False, is_async=True)
                s = warpgroup_mma(qa.index(b0 + 1), k1.index(bw).permute([1, 0]), s, is_async=True)
            else:
                s = warpgroup_mma(qa.index(b0 + 2), k2.index(bw).permute([1, 0]), zero_s, use_acc=False,
                                  is_async=True)
                s = warpgroup_mma(qa.index(b0 + 3), k3.index(bw).permute([1, 0]), s, is_async=True)
                s = warpgroup_mma(qr.index(b0), kr.index(bw).permute([1, 0]), s, is_async=True)
            mbarrier.wait(ready.index(2 * W + 1 - W), ph)
            fence_async_shared()
            if W == 0:
                s = warpgroup_mma(qa.index(b0 + 2), k2.index(bw).permute([1, 0]), s, is_async=True)
                s = warpgroup_mma(qa.index(b0 + 3), k3.index(bw).permute([1, 0]), s, is_async=True)
                s = warpgroup_mma(qr.index(b0), kr.index(bw).permute([1, 0]), s, is_async=True)
            else:
                s = warpgroup_mma(qa.index(b0), k0.index(bw).permute([1, 0]), s, is_async=True)
                s = warpgroup_mma(qa.index(b0 + 1), k1.index(bw).permute([1, 0]), s, is_async=True)
            cur = _tile_idx(idx_row, k_start + (2 * r + W) * BLOCK_N, k_end, BLOCK_N, COL_S)
            s = warpgroup_mma_wait(0, deps=[s])
            s = gl.where(((cur >= 0) & (cur < N_ROWS))[None, :], s * qk_scale, float("-inf"))  # log2 domain
            if W == 0:
                m0 = gl.maximum(m_run, gl.max(s, axis=1))
                m0u = gl.where(m0 == float("-inf"), 0.0, m0)  # rows with no key yet: keep exp2 finite
                alpha = gl.exp2(m_run - m0u)
                p = gl.exp2(s - m0u[:, None])
                l_i = l_i * alpha + gl.sum(p, axis=1)
                pb = p.to(gl.bfloat16)
                kr.index(b0).store(pb)  # sS0
                sm0.store(m0)
                fence_async_shared()
                _barrier()  # every thread's stores before the (one-thread) arrive
                mbarrier.arrive(bar_a)
                a2 = gl.convert_layout(alpha, ROW_O)[:, None]
                pa = gl.convert_layout(pb, PA)
                acc_a = warpgroup_mma(pa, va.index(b0), acc_a * a2, is_async=True)
                acc_b = warpgroup_mma(pa, vb.index(b0), acc_b * a2, is_async=True)
                acc_a, acc_b, pa = warpgroup_mma_wait(0, deps=[acc_a, acc_b, pa])
                _barrier()
                mbarrier.arrive(free.index(0))  # buffer 0, left half: S and P0 V0 done
                mbarrier.wait(bar_b, ph)
                m1 = sm1.load(ROW_S)
                sc = gl.exp2(m0 - gl.where(m1 == float("-inf"), 0.0, m1))
                l_i = l_i * sc
                a2 = gl.convert_layout(sc, ROW_O)[:, None]
                acc_a = warpgroup_mma(kr.index(b1), va.index(b1), acc_a * a2, is_async=True)
                acc_b = warpgroup_mma(kr.index(b1), vb.index(b1), acc_b * a2, is_async=True)
                acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])
                _barrier()
                mbarrier.arrive(free.index(2))  # buffer 1, left half: sS1 V1 done
                mbarrier.arrive(free.index(3))  # buffer 1, right half: sS1 (its rope part) read
                m_run = m1
            else:
                mbarrier.wait(bar_a, ph)
                m0 = sm0.load(ROW_S)
                m0u = gl.where(m0 == float("-inf"), 0.0, m0)
                m1 = gl.maximum(m0, gl.max(s, axis=1))
                m1u = gl.where(m1 == float("-inf"), 0.0, m1)
                p = gl.exp2(s - m1u[:, None])
                l_i = l_i * gl.exp2(m_run - m1u) + gl.sum(p, axis=1)
                pb = p.to(gl.bfloat16)
                kr.index(b1).store(pb)  # sS1
                sm1.store(m1)
                # P1 is out of the fp32 registers before the products that hold the accumulators start
                a2 = gl.convert_layout(gl.exp2(m_run - m0u), ROW_O)[:, None]
                acc_a = warpgroup_mma(kr.index(b0), va.index(b0), acc_a * a2, is_async=True)
                acc_b = warpgroup_mma(kr.index(b0), vb.index(b0), acc_b * a2, is_async=True)
                acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])  # sS0 and buffer 0 read
                fence_async_shared()
                _barrier()
                mbarrier.arrive(bar_b)
                mbarrier.arrive(free.index(1))  # buffer 0, right half: sS0 V0 done (WG0's S was before `a`)
                a2 = gl.convert_layout(gl.exp2(m0 - m1u), ROW_O)[:, None]
                pa = gl.convert_layout(pb, PA)
                acc_a = warpgroup_mma(pa, va.index(b1), acc_a * a2, is_async=True)
                acc_b = warpgroup_mma(pa, vb.index(b1), acc_b * a2, is_async=True)
                acc_a, acc_b, pa = warpgroup_mma_wait(0, deps=[acc_a, acc_b, pa])
                _barrier()
                mbarrier.arrive(free.index(3))  # buffer 1, right half: S and P1 V1 done
                m_run = m1

        # the row sum over both warpgroups' tiles; both hold the same final max
        if W == 0:
            sl_own = sl0
            sl_other = sl1
        else:
            sl_own = sl1
            sl_other = sl0
        sl_own.store(l_i)
        _barrier()
        mbarrier.arrive(bar_l.index(W))
        mbarrier.wait(bar_l.index(1 - W), 0)
        l_all = l_i + sl_other.load(ROW_S)
        _store_half(O, LSE, PART, t, n_t, sp, gl.num_programs(2), H, stride_ot, stride_oh, stride_lt,
                    gl.convert_layout(m_run, ROW_O),
                    gl.convert_layout(l_all, ROW_O), acc_a, acc_b, hb * BH, W, SPLIT, ROW_O, COL_O)

    @gluon.jit
    def _store_half(O, LSE, PART, t, n_t, sp, n_sp, H, stride_ot, stride_oh, stride_lt, m_i, l_i, acc_a, acc_b, h0,
                    W: gl.constexpr, SPLIT: gl.constexpr, ROW: gl.constexpr, COL: gl.constexpr):
        """`mla_gluon._store_outputs` for one warpgroup's half of the columns (256 W + [0, 256)); WG0 writes the
        lse. SPLIT: into partial row (sp, t) of an `n_sp` x `n_t` split buffer (`mla._part_rows`), else token t's."""
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        BH: gl.constexpr = 64
        has_key = l_i > 0
        inv_l = gl.where(has_key, 1.0 / gl.where(has_key, l_i, 1.0), 0.0)
        lse2 = gl.where(has_key, m_i + gl.log2(gl.where(has_key, l_i, 1.0)), float("-inf"))
        offs_h = h0 + gl.arange(0, BH, layout=ROW)
        h_mask = offs_h < H
        offs_c = 2 * W * CH + gl.arange(0, CH, layout=COL)
        il = inv_l[:, None]
        if not SPLIT:
            o_ty: gl.constexpr = O.dtype.element_ty
            o_row = O + t.to(gl.int64) * stride_ot + offs_h[:, None] * stride_oh + offs_c[None, :]
            gl.store(o_row, (acc_a * il).to(o_ty), mask=h_mask[:, None])
            gl.store(o_row + CH, (acc_b * il).to(o_ty), mask=h_mask[:, None])
            if W == 0:
                gl.store(LSE + t * stride_lt + offs_h, lse2 * 0.6931471805599453, mask=h_mask)
        else:
            rows = (sp * n_t + t).to(gl.int64) * H + offs_h  # mla._part_rows
            o_part = PART + rows[:, None] * DN + offs_c[None, :]
            gl.store(o_part, acc_a * il, mask=h_mask[:, None])
            gl.store(o_part + CH, acc_b * il, mask=h_mask[:, None])
            if W == 0:
                gl.store(PART + n_sp.to(gl.int64) * n_t * H * DN + rows, lse2, mask=h_mask)

    @gluon.jit
    def _alloc_tiles(BLOCK_N: gl.constexpr):
        """The three-warpgroup kernels' shared tiles in the wgmma layout (128-byte swizzle): two buffers of a tile's
        four latent chunks and its rope part, q's four latent chunks and its rope part."""
        BH: gl.constexpr = 64
        CH: gl.constexpr = 128
        DR: gl.constexpr = 64
        SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        k0 = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, CH], SH)
        k1 = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, CH], SH)
        k2 = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, CH], SH)
        k3 = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, CH], SH)
        kr = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DR], SH)
        qa = gl.allocate_shared_memory(gl.bfloat16, [4, BH, CH], SH)
        qr = gl.allocate_shared_memory(gl.bfloat16, [1, BH, DR], SH)
        return k0, k1, k2, k3, kr, qa, qr

    @gluon.jit
    def _stage_q(Q, t, hb, H, stride_qt, stride_qh, qa, qr):
        """The three-warpgroup kernels' q: token t's rows of head block hb (rows past H are zeros) into shared memory
        as bf16 (latent chunks into `qa`, the rope part into `qr`), by the calling warps, fenced for the tensor
        cores."""
        BH: gl.constexpr = 64
        CH: gl.constexpr = 128
        DR: gl.constexpr = 64
        NW: gl.constexpr = gl.num_warps()
        LG: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NW, 1], [1, 0])
        LGR: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        offs_qh = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, LG))
        q_row = Q + t.to(gl.int64) * stride_qt + offs_qh[:, None] * stride_qh
        qm = (offs_qh < H)[:, None]
        offs_q = gl.arange(0, CH, layout=gl.SliceLayout(0, LG))
        for c in gl.static_range(4):
            qa.index(c).store(gl.load(q_row + c * CH + offs_q[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        offs_qhr = hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, LGR))
        offs_qr = gl.arange(0, DR, layout=gl.SliceLayout(0, LGR))
        q_rope = Q + t.to(gl.int64) * stride_qt + offs_qhr[:, None] * stride_qh + 4 * CH + offs_qr[None, :]
        qr.index(0).store(gl.load(q_rope, mask=(offs_qhr < H)[:, None], other=0.0).to(gl.bfloat16))
        fence_async_shared()

    @gluon.jit
    def _sparse_mla_pingpong_kernel(
        Q, KV, IDX, O, LSE, PART,
        stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
        H, TOPK, N_ROWS, KEYS_PER_SPLIT, qk_scale,
        SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        PROBE: gl.constexpr = 0, PDL: gl.constexpr = False,
    ):
        """bf16 caches: one program = (token t, 64-head block hb, split sp), grid axis 0 = t * head blocks + hb (a
        token's head blocks side by side), axis 2 = sp; 3 warpgroups: the default partition and a
        worker are the two consumers (`_pp_consumer`), a third gathers (`_pp_producer`). Tiles 2r and 2r + 1 go to
        buffers 0 and 1, each in two halves (left: latent chunks 0-1; right: chunks 2-3 and the rope part). Barriers,
        per half (2 * buffer + side): `ready` (producer -> consumers: the producer's 128 threads' copies landed),
        `free` (its readers are done); `a` / `b` (the per-pair handshake in
        `_pp_consumer`), `l[w]` (the final row sums). PROBE (stage timing; outputs meaningless): 1 the producer alone
        (the consumers hand buffers back unread), 2 the consumers alone (the producer gathers nothing)."""
        if PDL:  # a split launch: its merge may launch once every program has started (`common.pdl`)
            tl.extra.cuda.gdc_launch_dependents()
        BH: gl.constexpr = 64
        # axis 0 runs over (token, head block), head blocks fastest: a token's head blocks run side by side
        n_hb = gl.cdiv(H, BH)
        t = gl.program_id(0) // n_hb
        hb = gl.program_id(0) % n_hb
        n_t = gl.num_programs(0) // n_hb
        sp = gl.program_id(2)
        k0, k1, k2, k3, kr, qa, qr = _alloc_tiles(BLOCK_N)
        FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        sm0 = gl.allocate_shared_memory(gl.float32, [BH], FLAT1)  # the running max after tile 2r / 2r + 1
        sm1 = gl.allocate_shared_memory(gl.float32, [BH], FLAT1)
        sl0 = gl.allocate_shared_memory(gl.float32, [BH], FLAT1)  # the two warpgroups' row sums
        sl1 = gl.allocate_shared_memory(gl.float32, [BH], FLAT1)
        ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # 2 * buffer + side
        free = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        bar_l = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        bar_a = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bar_b = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for j in gl.static_range(4):
            mbarrier.init(ready.index(j), count=4 * 32)  # the producer's threads (4 warps)
            # each half's readers: WG0 alone (0-left, 1-left), WG1 alone (0-right), both (1-right: WG1's P1 V1 and
            # WG0's read of sS1, the rope part)
            mbarrier.init(free.index(j), count=2 if j == 3 else 1)
        for j in gl.static_range(2):
            mbarrier.init(bar_l.index(j), count=1)
        mbarrier.init(bar_a, count=1)
        mbarrier.init(bar_b, count=1)

        _stage_q(Q, t, hb, H, stride_qt, stride_qh, qa, qr)  # by the default partition's warps
        _barrier()  # barriers initialised and q staged before any partition runs

        k_start = sp * KEYS_PER_SPLIT
        k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
        n_pairs = gl.cdiv(k_end - k_start, 2 * BLOCK_N)
        idx_row = IDX + t.to(gl.int64) * stride_it
        gl.warp_specialize([
            (_pp_consumer, (0, O, LSE, PART, t, n_t, hb, sp, H, stride_ot, stride_oh, stride_lt, N_ROWS, qk_scale, idx_row,
                            k_start, k_end, n_pairs, qa, qr, k0, k1, k2, k3, kr, sm0, sm1, sl0, sl1, ready,
                            free, bar_a, bar_b, bar_l, SPLIT, BLOCK_N, PROBE)),
            (_pp_consumer, (1, O, LSE, PART, t, n_t, hb, sp, H, stride_ot, stride_oh, stride_lt, N_ROWS, qk_scale, idx_row,
                            k_start, k_end, n_pairs, qa, qr, k0, k1, k2, k3, kr, sm0, sm1, sl0, sl1, ready,
                            free, bar_a, bar_b, bar_l, SPLIT, BLOCK_N, PROBE)),
            (_pp_producer, (KV, idx_row, k_start, k_end, n_pairs, N_ROWS, stride_kv, k0, k1, k2, k3, kr, ready, free,
                            BLOCK_N, PROBE)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])

    # ---- the dequantising producer (fp8_ds_mla caches): FlashMLA's sm_90 fp8 decode plan ----

    @gluon.jit
    def _dq_load_half(KV, i_w, N_ROWS, stride_kv, LW: gl.constexpr, LR: gl.constexpr, LX: gl.constexpr):
        """Issue the loads of the rows `i_w` names (a half tile, one row a thread; -1 past the split: nothing is
        loaded) into registers: the four latent chunks as int32 words (16 bytes a thread and row, 4 threads a 64-byte
        run), the rope part, the four chunk scales. Invalid rows load as zeros."""
        KVW = KV.to(gl.pointer_type(gl.int32), bitcast=True)
        KVH = KV.to(gl.pointer_type(gl.bfloat16), bitcast=True)
        KVF = KV.to(gl.pointer_type(gl.float32), bitcast=True)
        v = (i_w >= 0) & (i_w < N_ROWS)
        row = gl.where(v, i_w, 0).to(gl.int64) * stride_kv  # bytes
        w_row = KVW + gl.multiple_of(row // 4, 4)[:, None] + gl.arange(0, 32, layout=gl.SliceLayout(0, LW))[None, :]
        m = v[:, None]
        w0 = gl.load(w_row, mask=m, other=0)
        w1 = gl.load(w_row + 32, mask=m, other=0)
        w2 = gl.load(w_row + 64, mask=m, other=0)
        w3 = gl.load(w_row + 96, mask=m, other=0)
        v_r = gl.convert_layout(v, gl.SliceLayout(1, LR))
        h_off = gl.multiple_of((gl.convert_layout(row, gl.SliceLayout(1, LR)) + 528) // 2, 8)
        rope = gl.load(KVH + h_off[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, LR))[None, :],
                       mask=v_r[:, None], other=0.0)
        v_x = gl.convert_layout(v, gl.SliceLayout(1, LX))
        f_row = KVF + (gl.convert_layout(row, gl.SliceLayout(1, LX)) + 512) // 4
        s0 = gl.load(f_row, mask=v_x, other=0.0)
        s1 = gl.load(f_row + 1, mask=v_x, other=0.0)
        s2 = gl.load(f_row + 2, mask=v_x, other=0.0)
        s3 = gl.load(f_row + 3, mask=v_x, other=0.0)
        return w0, w1, w2, w3, rope, s0, s1, s2, s3

    @gluon.jit
    def _dq_store_half(k0, k1, k2, k3, kr, b, r0: gl.constexpr, w0, w1, w2, w3, rope, s0, s1, s2, s3,
                       LX: gl.constexpr):
        """Rows r0..r0 + HN of buffer b from `_dq_load_half`'s registers: e4m3 * the row's chunk scale, rounded to
        bf16 (exact for power-of-two scales), into the wgmma layout; the rope part as it is."""
        HN: gl.constexpr = w0.shape[0]
        k0.index(b).slice(r0, HN).store((_e4m3_words_f32(w0, LX) * s0[:, None]).to(gl.bfloat16))
        k1.index(b).slice(r0, HN).store((_e4m3_words_f32(w1, LX) * s1[:, None]).to(gl.bfloat16))
        k2.index(b).slice(r0, HN).store((_e4m3_words_f32(w2, LX) * s2[:, None]).to(gl.bfloat16))
        k3.index(b).slice(r0, HN).store((_e4m3_words_f32(w3, LX) * s3[:, None]).to(gl.bfloat16))
        kr.index(b).slice(r0, HN).store(rope)

    @gluon.jit
    def _dq_producer(KV, idx_row, k_start, k_end, n_tiles, N_ROWS, stride_kv, k0, k1, k2, k3, kr, ready, free,
                     BLOCK_N: gl.constexpr, PROBE: gl.constexpr):
        """Worker partition: tile i's rows into buffer i % 2 as bf16, in two halves of BLOCK_N / 2 rows whose loads
        go to registers (`_dq_load_half`, one row a thread) one half ahead of their conversion: once buffer i % 2 is
        free (`free`: both consumers done with tile i - 2), the first half is converted and stored, the next tile's
        first half is loaded, the second half is converted, `ready` is arrived (the stores fenced for the tensor
        cores), and the next tile's second half is loaded. So a tile's worth of loads stays in flight while the
        partition converts. The index tiles are read one tile further ahead, so that no row load waits on an index
        load (with them read just before, each half waited for two memory latencies in a row). PROBE 2: nothing is
        loaded, converted or stored (the consumers alone)."""
        PW: gl.constexpr = gl.num_warps()
        HN: gl.constexpr = BLOCK_N // 2
        LW: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [PW, 1], [1, 0])  # [HN, 32] int32 words of a chunk
        LX: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [PW, 1], [1, 0])  # the words' values, [HN, 128]
        LR: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [PW, 1], [1, 0])  # [HN, 64] bf16 rope part
        IW: gl.constexpr = gl.SliceLayout(1, LW)
        if PROBE != 2:
            a = _dq_load_half(KV, _tile_idx(idx_row, k_start, k_end, HN, IW), N_ROWS, stride_kv, LW, LR, LX)
            c = _dq_load_half(KV, _tile_idx(idx_row, k_start + HN, k_end, HN, IW), N_ROWS, stride_kv, LW, LR, LX)
            n_a = _tile_idx(idx_row, k_start + BLOCK_N, k_end, HN, IW)  # tile 1's halves
            n_c = _tile_idx(idx_row, k_start + BLOCK_N + HN, k_end, HN, IW)
        for i in range(n_tiles):
            b = i & 1
            mbarrier.wait(free.index(b), ((i >> 1) & 1) ^ 1)  # the first use of each buffer passes at once
            if PROBE != 2:
                _dq_store_half(k0, k1, k2, k3, kr, b, 0, *a, LX)
                a = _dq_load_half(KV, n_a, N_ROWS, stride_kv, LW, LR, LX)  # tile i + 1
                n_a = _tile_idx(idx_row, k_start + (i + 2) * BLOCK_N, k_end, HN, IW)  # tile i + 2
                _dq_store_half(k0, k1, k2, k3, kr, b, HN, *c, LX)
                fence_async_shared()  # the generic-proxy stores before the consumers' wgmma reads
            _barrier()  # every thread's stores before the (one-thread) arrive
            mbarrier.arrive(ready.index(b))
            if PROBE != 2:
                c = _dq_load_half(KV, n_c, N_ROWS, stride_kv, LW, LR, LX)
                n_c = _tile_idx(idx_row, k_start + (i + 2) * BLOCK_N + HN, k_end, HN, IW)

    @gluon.jit
    def _dq_tiles(W: gl.constexpr, i0, i1, m_run, l_i, acc_a, acc_b, N_ROWS, qk_scale, idx_row, k_start, k_end, qa,
                  qr, k0, k1, k2, k3, kr, sc, ready, free, bar_p, BLOCK_N: gl.constexpr):
        """Tiles i0 .. i1 - 1 of the program's list (tile i in buffer i % 2) for warpgroup W of the
        dequantising-producer kernel (`_dq_consumer`); returns the running max, sum and accumulator halves."""
        CH: gl.constexpr = 128
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH, 16])
        PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
        COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
        ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
        if W == 0:  # this warpgroup's value columns
            va = k0
            vb = k1
        else:
            va = k2
            vb = k3
        zero_s = gl.full([64, BLOCK_N], 0.0, gl.float32, S_L)
        for i in range(i0, i1):
            # the buffer index at run time: with a constant one the compiler hoists every wgmma's shared-memory
            # descriptor out of the loop, and they spill (as in `_pp_consumer`)
            b = _opaque_zero(i) + (i & 1)
            ph = (i >> 1) & 1
            if W == 0:
                mbarrier.wait(ready.index(b), ph)
                s = _scores_wgmma(qa.index(0), qa.index(1), qa.index(2), qa.index(3), qr.index(0), k0.index(b),
                                  k1.index(b), k2.index(b), k3.index(b), kr.index(b), zero_s, True)
                cur = _tile_idx(idx_row, k_start + i * BLOCK_N, k_end, BLOCK_N, COL_S)
                s = warpgroup_mma_wait(0, deps=[s])
                s = gl.where(((cur >= 0) & (cur < N_ROWS))[None, :], s * qk_scale, float("-inf"))  # log2 domain
                p, alpha, m_run, l_i = _softmax_step(s, m_run, l_i)
                pb = p.to(gl.bfloat16)
                kr.index(b).store(pb)  # P for warpgroup 1, in the rope part S has read
                sc.index(b).store(alpha)
                fence_async_shared()
                _barrier()
                mbarrier.arrive(bar_p.index(b))
                a2 = gl.convert_layout(alpha, ROW_O)[:, None]
                pa = gl.convert_layout(pb, PA)
                acc_a = warpgroup_mma(pa, va.index(b), acc_a * a2, is_async=True)
                acc_b = warpgroup_mma(pa, vb.index(b), acc_b * a2, is_async=True)
                acc_a, acc_b, pa = warpgroup_mma_wait(0, deps=[acc_a, acc_b, pa])
            else:
                mbarrier.wait(bar_p.index(b), ph)
                a2 = sc.index(b).load(ROW_O)[:, None]
                acc_a = warpgroup_mma(kr.index(b), va.index(b), acc_a * a2, is_async=True)
                acc_b = warpgroup_mma(kr.index(b), vb.index(b), acc_b * a2, is_async=True)
                acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])
            _barrier()
            mbarrier.arrive(free.index(b))
        return m_run, l_i, acc_a, acc_b

    @gluon.jit
    def _dq_state(BLOCK_N: gl.constexpr):
        """A piece's fresh running max, sum and accumulator halves ([64] x 2, [64, 128] x 2) in the dq consumers'
        layouts."""
        CH: gl.constexpr = 128
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH, 16])
        ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
        return (gl.full([64], float("-inf"), gl.float32, ROW_S), gl.full([64], 0.0, gl.float32, ROW_S),
                gl.full([64, CH], 0.0, gl.float32, O_L), gl.full([64, CH], 0.0, gl.float32, O_L))

    @gluon.jit
    def _dq_finish(W: gl.constexpr, piece: gl.constexpr, m_run, l_i, acc_a, acc_b, O, LSE, PART, st, n_st, sp, n_sp,
                   H, stride_ot, stride_oh, stride_lt, hb, sml, bar_l, SPLIT: gl.constexpr):
        """The end of a piece of work (a token's list, or its part in the program): warpgroup 0 hands its row max
        and sum to warpgroup 1 (`sml` slots 2 piece and 2 piece + 1, `bar_l[piece]`); each stores its half of the
        columns (`_store_half`: token st, or partial row (sp, st) of an n_sp x n_st buffer)."""
        CH: gl.constexpr = 128
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CH, 16])
        ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
        COL_O: gl.constexpr = gl.SliceLayout(0, O_L)
        if W == 0:
            sml.index(2 * piece).store(m_run)
            sml.index(2 * piece + 1).store(l_i)
            _barrier()
            mbarrier.arrive(bar_l.index(piece))
            m_o = gl.convert_layout(m_run, ROW_O)
            l_o = gl.convert_layout(l_i, ROW_O)
        else:
            mbarrier.wait(bar_l.index(piece), 0)
            m_o = sml.index(2 * piece).load(ROW_O)
            l_o = sml.index(2 * piece + 1).load(ROW_O)
        _store_half(O, LSE, PART, st, n_st, sp, n_sp, H, stride_ot, stride_oh, stride_lt, m_o, l_o, acc_a, acc_b,
                    hb * 64, W, SPLIT, ROW_O, COL_O)

    @gluon.jit
    def _dq_consumer(W: gl.constexpr, Q, O, LSE, PART, t, st, n_st, hb, sp, n_sp, H, stride_qt, stride_qh, stride_ot,
                     stride_oh, stride_lt, N_ROWS, qk_scale, idx_row, k_start, k_end, n_tiles, i_cut, qa, qr, k0, k1,
                     k2, k3, kr, sc, sml, ready, free, bar_p, bar_l, SPLIT: gl.constexpr, BAL: gl.constexpr,
                     BLOCK_N: gl.constexpr, PROBE: gl.constexpr):
        """Warpgroup W of the dequantising-producer kernel. W 0 (the default partition) computes each tile's whole S
        (no row statistics cross warpgroups), its softmax, and P V on value chunks 0-1 with P from registers; it
        writes P (bf16) into the tile's rope part (read by S already) and the accumulator's rescale factor into
        `sc[b]`, then arrives `bar_p[b]`. W 1 waits `bar_p[b]`, rescales its accumulator and computes P V on chunks
        2-3 with P from shared memory. Each arrives `free[b]` once its wgmma have read the buffer. At the end W 0
        hands its row max and sum to W 1 through `sml` (`bar_l`). BAL (the balanced schedule, `balanced_plan`): the
        program's tiles 0 .. i_cut - 1 are token t's, stored as partial row (0, st); any from i_cut on are token
        t + 1's, whose q W 0 stages in place of t's once its last S is done, stored as row (1, st). PROBE 1: the
        producer alone (buffers handed back unread)."""
        m_run, l_i, acc_a, acc_b = _dq_state(BLOCK_N)
        n_main = i_cut
        if PROBE == 1:  # the producer alone: each buffer handed back unread
            for i in range(n_tiles):
                mbarrier.wait(ready.index(i & 1), (i >> 1) & 1)
                _barrier()
                mbarrier.arrive(free.index(i & 1))
            n_main = 0
        m_run, l_i, acc_a, acc_b = _dq_tiles(W, 0, n_main, m_run, l_i, acc_a, acc_b, N_ROWS, qk_scale, idx_row,
                                             k_start, k_end, qa, qr, k0, k1, k2, k3, kr, sc, ready, free, bar_p,
                                             BLOCK_N)
        _dq_finish(W, 0, m_run, l_i, acc_a, acc_b, O, LSE, PART, st, n_st, sp, n_sp, H, stride_ot, stride_oh,
                   stride_lt, hb, sml, bar_l, SPLIT)
        if BAL:
            if i_cut < n_tiles:  # the next token's first tiles
                if W == 0:
                    _stage_q(Q, t + 1, hb, H, stride_qt, stride_qh, qa, qr)  # its last wgmma on q were waited for
                    _barrier()
                m_run, l_i, acc_a, acc_b = _dq_state(BLOCK_N)
                m_run, l_i, acc_a, acc_b = _dq_tiles(W, i_cut, n_tiles, m_run, l_i, acc_a, acc_b, N_ROWS, qk_scale,
                                                     idx_row, k_start, k_end, qa, qr, k0, k1, k2, k3, kr, sc, ready,
                                                     free, bar_p, BLOCK_N)
                _dq_finish(W, 1, m_run, l_i, acc_a, acc_b, O, LSE, PART, st, n_st, 1, n_sp, H, stride_ot, stride_oh,
                           stride_lt, hb, sml, bar_l, SPLIT)

    @gluon.jit
    def _sparse_mla_dq_kernel(
        Q, KV, IDX, O, LSE, PART,
        stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
        H, TOPK, N_ROWS, KEYS_PER_SPLIT, N_TOK, qk_scale,
        SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        PROBE: gl.constexpr = 0, BAL: gl.constexpr = False, PDL: gl.constexpr = False,
    ):
        """fp8_ds_mla caches: one program = (token t, 64-head block hb, split sp), grid axis 0 = t * head blocks + hb,
        axis 2 = sp; 3 warpgroups (`_dq_consumer` 0 and 1, `_dq_producer`), two bf16 tile buffers (tile i in i % 2).
        Barriers per buffer: `ready` (producer -> consumers), `free` (both consumers -> producer), `p` (warpgroup 0's
        P and rescale factor -> warpgroup 1); `l` (the final row statistics, one per piece). BAL (the balanced
        schedule, `balanced_plan`): axis 0 = program p * head blocks + hb, P programs a head block; the N_TOK tokens'
        index rows are one flat list of N_TOK * TOPK / BLOCK_N tiles (row stride TOPK, a whole number of tiles), and
        program p runs tiles [p n / P, (p + 1) n / P): the end of one token's list and the start of the next's at
        most (P > N_TOK), each piece's partial into row (piece, p) of a 2 x P split buffer (`merge_runs`). The
        producer runs the flat list as one; the consumers store at the token boundary and stage the next q. PROBE
        (stage timing; outputs meaningless; not with BAL): 1 the producer alone, 2 the consumers alone."""
        if PDL:  # a split launch: its merge may launch once every program has started (`common.pdl`)
            tl.extra.cuda.gdc_launch_dependents()
        BH: gl.constexpr = 64
        n_hb = gl.cdiv(H, BH)
        hb = gl.program_id(0) % n_hb
        k0, k1, k2, k3, kr, qa, qr = _alloc_tiles(BLOCK_N)
        FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])  # of each slot
        sc = gl.allocate_shared_memory(gl.float32, [2, BH], FLAT1)  # per buffer: the rescale factor of its tile
        PIECES: gl.constexpr = 2 if BAL else 1  # pieces of work a program ends (each hands its row statistics over)
        sml = gl.allocate_shared_memory(gl.float32, [2 * PIECES, BH], FLAT1)  # per piece: the final row max and sum
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        bar_p = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        bar_l = gl.allocate_shared_memory(gl.int64, [PIECES, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(2):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(free.index(j), count=2)
            mbarrier.init(bar_p.index(j), count=1)
        for j in gl.static_range(PIECES):
            mbarrier.init(bar_l.index(j), count=1)

        if BAL:
            p = gl.program_id(0) // n_hb
            n_p = gl.num_programs(0) // n_hb
            nt = TOPK // BLOCK_N  # tiles a token
            n = N_TOK * nt
            g0 = p * n // n_p
            g1 = (p + 1) * n // n_p
            t = g0 // nt
            k_start = g0 * BLOCK_N  # in the flat list
            k_end = g1 * BLOCK_N
            n_tiles = g1 - g0
            i_cut = gl.minimum(n_tiles, (t + 1) * nt - g0)
            idx_row = IDX
            st = p
            n_st = n_p
            sp = 0
            n_sp = 2
        else:
            t = gl.program_id(0) // n_hb
            n_t = gl.num_programs(0) // n_hb
            sp = gl.program_id(2)
            k_start = sp * KEYS_PER_SPLIT
            k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
            n_tiles = gl.cdiv(k_end - k_start, BLOCK_N)
            i_cut = n_tiles
            idx_row = IDX + t.to(gl.int64) * stride_it
            st = t
            n_st = n_t
            n_sp = gl.num_programs(2)
        _stage_q(Q, t, hb, H, stride_qt, stride_qh, qa, qr)  # by the default partition's warps
        _barrier()  # barriers initialised and q staged before any partition runs
        gl.warp_specialize([
            (_dq_consumer, (0, Q, O, LSE, PART, t, st, n_st, hb, sp, n_sp, H, stride_qt, stride_qh, stride_ot,
                            stride_oh, stride_lt, N_ROWS, qk_scale, idx_row, k_start, k_end, n_tiles, i_cut, qa, qr,
                            k0, k1, k2, k3, kr, sc, sml, ready, free, bar_p, bar_l, SPLIT, BAL, BLOCK_N, PROBE)),
            (_dq_consumer, (1, Q, O, LSE, PART, t, st, n_st, hb, sp, n_sp, H, stride_qt, stride_qh, stride_ot,
                            stride_oh, stride_lt, N_ROWS, qk_scale, idx_row, k_start, k_end, n_tiles, i_cut, qa, qr,
                            k0, k1, k2, k3, kr, sc, sml, ready, free, bar_p, bar_l, SPLIT, BAL, BLOCK_N, PROBE)),
            (_dq_producer, (KV, idx_row, k_start, k_end, n_tiles, N_ROWS, stride_kv, k0, k1, k2, k3, kr, ready, free,
                            BLOCK_N, PROBE)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


# The three-warpgroup kernels launch through the pre-bound launcher (`common.Prebound`) with their split plan and
# constexprs cached per call shape (`_ws_plan`): through Gluon's own binder an eager decode call at B1-B16 took
# 64-130 us on an H100 (host-bound; the Triton kernel's pre-bound path 29-91), pre-bound 32-36 us where host-bound
# (`sweeps/large_small_batch_h100_024dda2.json`, `..._06d1f89.json`).
_WS_LAUNCH = {"pingpong": common.Prebound(_sparse_mla_pingpong_kernel),
              "dq": common.Prebound(_sparse_mla_dq_kernel)} if HAVE_GLUON else {}


def check_row_threads(row_threads: int | None, block_n: int) -> int:
    """`row_threads` (None: `RAW_ROW_THREADS`) if the key-split kernel's raw gather can take it at `block_n`-key tiles
    (a layout of `RAW_ROW_THREADS_CHOICES` threads a row whose warps do not cover more rows than the tile has), else
    ValueError."""
    row_threads = RAW_ROW_THREADS if row_threads is None else row_threads
    if row_threads not in RAW_ROW_THREADS_CHOICES or NUM_WARPS * 32 // row_threads > block_n:
        raise ValueError(f"row_threads must be one of {RAW_ROW_THREADS_CHOICES} with at most {block_n} rows per "
                         f"copy step ({NUM_WARPS} warps), got {row_threads}")
    return row_threads


# The dequantising-producer kernel's split plan (`dq_num_splits`). One program an SM (shared memory), so a launch
# takes ceil(programs / SMs) waves, each as long as its programs' tiles plus a fixed cost a program (q staged, the
# first tiles' loads not yet overlapped, the epilogue); a split plan adds the partials' round trip and the merge.
# Fitted to fp8 decode B128 at 64 heads on an H100 (132 SMs; 1-4 splits: 129 / 183 / 198 / 216 us,
# outputs/bench/sweeps/dq_splits_h100_58bd792.json): a 64-key tile 3.5 us, a program 16.5 us, the merge 36.5 us.
# `mla.pick_num_splits` (one wave of programs, rounded up) took 2 splits there: 256 programs, 1.94 waves, 182 us.
DQ_TILE_US = 3.5
DQ_PROGRAM_US = 16.5
DQ_MERGE_US = 36.5
# The model charges every wave a whole program's time. Launches of more than one wave run below it: one split at 64
# heads took 244-246 us for two waves at B150-B200 (257 modelled) and at 128 heads 223-231 us for two at B80-B128
# (257 modelled), while two splits there, three fuller waves, matched it (254 us at B150 64 heads, 254 modelled; H100,
# sweeps/dq_splits_heldout_h100_c1ec177.json, sweeps/dq_splits_margin_h100_06d1f89.json). So where fewer splits
# take more than one wave, the plan takes them when their modelled time is within DQ_SPLIT_MARGIN of the least:
# at B80-B96 at 128 heads and B150-B180 at 64 the two splits of the least modelled time took 4-11 % longer than one;
# in one wave the least modelled time stands (B12-B24, where the margin would have cost 0-3 %).
DQ_SPLIT_MARGIN = 0.05


def dq_split_costs(T: int, n_hb: int, topk: int, n_sms: int, block_n: int = 64) -> dict[int, tuple[float, int]]:
    """{split count: (modelled time in us, waves)} for each split count `mla.split_keys` makes of 1..MAX_SPLITS
    wanted, for T tokens of n_hb 64-head blocks on n_sms SMs (constants above)."""
    tiles = max(1, -(-topk // block_n))
    costs: dict[int, tuple[float, int]] = {}
    for want in range(1, min(mla.MAX_SPLITS, tiles) + 1):
        splits, keys = mla.split_keys(topk, want, block_n)
        waves = -(-(T * n_hb * splits) // n_sms)
        cost = waves * (keys // block_n * DQ_TILE_US + DQ_PROGRAM_US) + (DQ_MERGE_US if splits > 1 else 0.0)
        costs[splits] = (cost, waves)
    return costs


def dq_num_splits(T: int, n_hb: int, topk: int, n_sms: int, block_n: int = 64) -> int:
    """The split plan for T tokens of n_hb 64-head blocks on n_sms SMs: the least modelled time (`dq_split_costs`;
    ties to fewer splits), or fewer splits of more than one wave within `DQ_SPLIT_MARGIN` of it."""
    costs = dq_split_costs(T, n_hb, topk, n_sms, block_n)
    least = min(c for c, _ in costs.values())
    best = min(s for s, (c, _) in costs.items() if c <= least + 1e-9)
    near = [s for s, (c, w) in costs.items() if s < best and w > 1 and c <= least * (1 + DQ_SPLIT_MARGIN)]
    return min(near, default=best)


# The one-split plan's last wave. Where the tokens x head blocks outnumber the SMs, one split runs in whole waves plus
# a last one of the rest, and a program of that wave takes nearly a whole wave's time however few run beside it (dq,
# H100, one split: 64 heads 117-130 us in one wave at B70-B128 (outputs/bench/sweeps/dq_splits_heldout2_h100_6f7cc40
# .json, dq_splits_margin_h100_06d1f89.json) and 235-246 us in two at B133-B198; 128 heads 221-226 us at B67-B99,
# whose second waves hold 2-66 programs (sweeps/dq_tail_h100_18bdc50.json)). Splitting every token instead adds
# waves and the merge (two splits took 1.4-11 % longer in round 22's runs). The tail plan (`tail_plan`) keeps the
# whole waves at one split and splits only the rest's tokens, as many ways as fill the SMs once, in a second launch
# of the same kernel on slices of the call's tensors, whose partials are merged: Stream-K's data-parallel waves and
# a split tail, at whole tokens so that the kernel is unchanged. H100, one launch against the tail plan, 1-66
# programs past whole waves of 132 (NOTES.md round 23): dq (sweeps/dq_tail_h100_18bdc50.json) 0.63-0.92x the time at
# all 18 shapes, 0.60-0.89x -> 0.85-1.04x FlashMLA's; ping-pong (sweeps/pp_tail_h100_87ef2d1.json) 0.70-0.98x at
# the 14 shapes with 3 splits or more, and with 2 (the rest 45-66 programs) 0.95-1.04x, slower at 64 heads B198 (a
# bf16 program is shorter, so the merge weighs more). TAIL_MIN_SPLITS: the kernels whose calls take the tail plan,
# from how many splits of the rest.
TAIL_MIN_SPLITS = {"dq": 2, "pingpong": 3}


def tail_plan(T: int, n_hb: int, topk: int, n_sms: int, mode: str = "dq", block_n: int = 64) -> tuple[int, int] | None:
    """(tokens run at one split, split count of the remaining tokens) for T tokens of n_hb 64-head blocks on n_sms
    SMs, where mode's split plan takes one split over more than one wave and the last wave's programs can be split at
    least twice and still run in one wave; None otherwise (the split plan stands). The tokens of the whole waves keep
    both head blocks together, so with an odd SM count the first launch falls one program short of whole waves."""
    units = T * n_hb
    if topk <= 0 or units <= n_sms or plan_splits_of(T, n_hb, topk, n_sms, mode, block_n) != 1:
        return None
    whole = units // n_sms * n_sms // n_hb
    rest = (T - whole) * n_hb
    if rest == 0:
        return None
    tile = split_tile(mode, block_n)
    splits = mla.split_keys(topk, min(mla.MAX_SPLITS, -(-topk // tile), n_sms // rest), tile)[0]
    return (whole, splits) if splits > 1 else None


def split_tile(mode: str, block_n: int) -> int:
    """The keys a split is a whole number of: the kernel's tile, or a pair of them for the ping-pong kernel (its
    two consumers take alternate tiles)."""
    return 2 * block_n if mode == "pingpong" else block_n


# The balanced schedule (dq kernel; FlashMLA's scheduler). Below one wave (tokens x head blocks fewer than the SMs)
# the split plan gives each program a token's list or an equal split of it, so the SMs fill only as far as
# T * n_hb * splits falls into a wave: 64 heads at B68 ran 68 programs on 132 SMs. The balanced schedule cuts the
# tokens' concatenated lists instead: P = n_sms // n_hb programs a head block, program p the tiles [p n / P,
# (p + 1) n / P) of the n = T * topk / 64 (`run_pieces`), so each program runs the end of one token's list and the
# start of the next's at most (T < P), and every token's pieces are merged from a 2 x P partial buffer
# (`merge_runs`). Its fixed cost is a split plan's and more: every token's fp32 partials (128 KB a piece at 64 heads)
# written and merged in a second launch, and a second q staged and stored mid-program: 49 us over one split of the
# same 32 tiles a program (H100, 64 heads B128: 178.7 against 129.6 us). So it pays only where one split leaves about
# half the SMs idle: H100 (outputs/bench/sweeps/dq_bal_h100_f0ad6ed.json, 23 batches at 64 / 128 heads) 0.94x the
# split plan's time at 64 heads B68 and 0.88x at 128 heads B34 (one split, 52 % of the SMs), 0.97-1.00x at 64 heads
# B48 / B76 and 128 heads B24 / B40 (58-73 %), 1.01-1.38x at the other 17. BAL_MAX_FILL: the rule takes it where
# the split plan runs one split on at most that share of the SMs (64 heads B67-B72, 128 heads B34-B36 on 132 SMs),
# at top-k lists of BAL_MIN_TOPK keys or more (the runs' 2048, GLM-5's: with shorter lists a program's tiles shrink
# and the fixed cost weighs more; not measured).
BAL_MAX_FILL = 0.55
BAL_MIN_TOPK = 2048


def balanced_plan(T: int, n_hb: int, topk: int, n_sms: int, block_n: int = 64, flat: bool = True,
                  force: bool = False) -> int | None:
    """Programs a head block of the balanced schedule for T tokens of n_hb 64-head blocks on n_sms SMs, or None: it
    needs the index rows as one flat list of whole tiles (flat: row stride = top-k, top-k a multiple of block_n),
    fewer tokens than programs a head block (at most two pieces a program), at least as many tiles as programs, a
    token over at most `mla.MAX_SPLITS` programs (the merge's tile) and P x tiles within int32 (the kernel's run
    bounds); without force it is taken where the split plan (`dq_num_splits`) runs one split on at most
    `BAL_MAX_FILL` of the SMs, at top-k lists of at least `BAL_MIN_TOPK`."""
    P = n_sms // n_hb
    if not flat or topk <= 0 or topk % block_n or not 1 <= T < P:
        return None
    nt = topk // block_n
    if T * nt < P or P * T * nt >= 2**31 or run_span_max(T, nt, P) > mla.MAX_SPLITS:
        return None
    if force:
        return P
    one = dq_num_splits(T, n_hb, topk, n_sms, block_n) == 1
    return P if one and topk >= BAL_MIN_TOPK and T * n_hb <= BAL_MAX_FILL * n_sms else None


def run_pieces(T: int, nt: int, P: int) -> list[list[tuple[int, int, int]]]:
    """The balanced schedule in Python, as the kernel computes it: per program p (of P, a head block) its pieces
    (token, first tile, end tile) of the n = T * nt tiles [p n / P, (p + 1) n / P) (token-major, nt tiles a token);
    piece j of program p goes to partial row (j, p)."""
    n = T * nt
    out = []
    for p in range(P):
        g, g1 = p * n // P, (p + 1) * n // P
        pieces = []
        while g < g1:
            t = g // nt
            e = min(g1, (t + 1) * nt)
            pieces.append((t, g - t * nt, e - t * nt))
            g = e
        out.append(pieces)
    return out


def run_span(t: int, nt: int, n: int, P: int) -> tuple[int, int]:
    """(first, last) program whose tiles hold token t's (the merge's formula: first = the last program starting at
    or before the token's first tile, last = the last starting before its end)."""
    return -(-((t * nt + 1) * P) // n) - 1, -(-((t + 1) * nt * P) // n) - 1


@functools.lru_cache(maxsize=1024)
def run_span_max(T: int, nt: int, P: int) -> int:
    """The most programs one token's tiles are spread over (the merge's tile along them)."""
    return max(b - a + 1 for a, b in (run_span(t, nt, T * nt, P) for t in range(T)))


@triton.jit
def _merge_runs_kernel(PART, O, LSE, stride_ot, stride_oh, stride_lt, H, NT, N, P,
                       D_NOPE: tl.constexpr, SP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                       PDL: tl.constexpr = False):
    """The balanced schedule's merge (`run_pieces`): token t's pieces sit in programs a..b (`run_span`), each in
    partial row (0, p) where the program starts inside the token and (1, p) where it starts in the token before, of a
    2 x P split buffer (`mla._part_rows`); merged as `mla._merge_splits_kernel` merges a token's splits
    (`mla._merge_rows`), all of them loaded at once. Plain Triton (it runs in the interpreter). PDL: launched as the
    kernel's programmatic dependent, so it waits for the kernel first (`common.pdl`)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0)
    hb = tl.program_id(1)
    db = tl.program_id(2)
    a = ((t * NT + 1) * P + N - 1) // N - 1
    b = ((t + 1) * NT * P + N - 1) // N - 1
    p = a + tl.arange(0, SP)
    slot = ((p * N) // P < t * NT).to(tl.int32)  # the program starts in the token before: its second piece
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    h_mask = offs_h < H
    sh_mask = (p <= b)[:, None] & h_mask[None, :]
    rows = _part_rows(slot[:, None], p[:, None], P, H, offs_h[None, :])  # [SP, BLOCK_H]
    _merge_rows(PART, PART + 2 * P.to(tl.int64) * H * D_NOPE, rows, sh_mask, O, LSE, t, offs_h, h_mask, offs_d, db,
                stride_ot, stride_oh, stride_lt, D_NOPE)


_MERGE_RUNS = common.Prebound(_merge_runs_kernel)


def merge_runs(part: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, nt: int, P: int) -> None:
    """Merge every token's pieces of the balanced schedule (`_merge_runs_kernel`) into out `[T, H, 512]` and lse
    `[T, H]`; part: `split_buffer(2, P, H, ...)` as the kernel wrote it, nt tiles a token, P programs a head block."""
    T, H, _ = out.shape
    sp, bh, bd = mla.merge_tile(run_span_max(T, nt, P), H)
    _MERGE_RUNS.launch((T, -(-H // bh), D_NOPE // bd), (part, out, lse, out.stride(0), out.stride(1), lse.stride(0),
                                                        H, nt, T * nt, P),
                       dict(D_NOPE=D_NOPE, SP=sp, BLOCK_H=bh, BLOCK_D=bd, num_warps=4,
                            **common.merge_pdl_kw(out.device)))


def plan_splits_of(T: int, n_hb: int, topk: int, n_sms: int, mode: str, block_n: int = 64) -> int:
    """The split count `plan_splits` takes for mode without num_splits (before `split_keys` rounds it)."""
    if mode == "dq":
        return dq_num_splits(T, n_hb, topk, n_sms, block_n)
    return mla.pick_num_splits(T, n_hb, topk, split_tile(mode, block_n), n_sms, waves=1)


def plan_splits(T: int, H: int, topk: int, block_n: int, device: torch.device,
                num_splits: int | None = None, mode: str = DEFAULT[2]) -> tuple[int, int]:
    """(split count, keys per split): for mode "dq" `dq_num_splits`, else `mla.pick_num_splits` at one program per
    SM (shared memory); rounded by `mla.split_keys` to whole `split_tile`s. block_n: the kernel's tile."""
    if num_splits is None:
        num_splits = plan_splits_of(T, -(-H // BLOCK_H), topk, num_sms(device), mode, block_n)
    return mla.split_keys(topk, num_splits, split_tile(mode, block_n))


@functools.lru_cache(maxsize=4096)
def _ws_plan(T: int, H: int, topk: int, dev_type: str, dev_index: int | None, num_splits: int | None, mode: str,
             block_n: int, probe: int, pp_regs: tuple[int, int] | None,
             bal: int = 0) -> tuple[int, int, tuple, dict, tuple]:
    """(splits, keys per split, grid, constexprs and options, their values as a key) of a three-warpgroup kernel's
    call shape: the host work an eager layer would otherwise repeat on every call; bal: the balanced schedule's
    programs a head block (dq only; splits is then 2, the partial rows a program). Cached: code that changes the
    split model's, the tail plan's, the balanced schedule's or the register constants (`DQ_*`, `TAIL_MIN_SPLITS`,
    `BAL_*`, `PP_*`) after a launch calls `clear_plans()`."""
    dev = torch.device(dev_type, dev_index) if dev_index is not None else torch.device(dev_type)
    cr, pr = pp_regs or ((PP_CONSUMER_REGS, PP_PRODUCER_REGS) if mode == "pingpong" else
                         (DQ_CONSUMER_REGS, DQ_PRODUCER_REGS))
    n_hb = -(-H // BLOCK_H)
    if bal:
        kw = dict(SPLIT=True, BLOCK_N=block_n, CONSUMER_REGS=cr, PRODUCER_REGS=pr, PROBE=0, BAL=True,
                  PDL=common.pdl(dev), num_warps=4)
        return 2, 0, (bal * n_hb, 1, 1), kw, tuple(kw.values())
    splits, keys_per_split = plan_splits(T, H, topk, block_n, dev, num_splits, mode)
    kw = dict(SPLIT=splits > 1, BLOCK_N=block_n, CONSUMER_REGS=cr, PRODUCER_REGS=pr, PROBE=probe,
              **({"BAL": False} if mode == "dq" else {}), PDL=splits > 1 and common.pdl(dev), num_warps=4)
    return splits, keys_per_split, (T * n_hb, 1, splits), kw, tuple(kw.values())


def clear_plans() -> None:
    """Forget the cached launch plans (`_ws_plan`, `_tail_cut`, `_bal_cut`): after changing `DQ_*`,
    `TAIL_MIN_SPLITS`, `BAL_*` or `PP_*`."""
    _ws_plan.cache_clear()
    _tail_cut.cache_clear()
    _bal_cut.cache_clear()


@functools.lru_cache(maxsize=4096)
def _bal_cut(T: int, H: int, topk: int, dev_type: str, dev_index: int | None, flat: bool, force: bool) -> int | None:
    """`balanced_plan` of a dq call shape, cached (host time of an eager layer; `clear_plans` forgets it)."""
    dev = torch.device(dev_type, dev_index) if dev_index is not None else torch.device(dev_type)
    return balanced_plan(T, -(-H // BLOCK_H), topk, num_sms(dev), 64, flat, force)


@functools.lru_cache(maxsize=4096)
def _tail_cut(T: int, H: int, topk: int, dev_type: str, dev_index: int | None, mode: str) -> tuple[int, int] | None:
    """`tail_plan` of a call shape where mode's calls take it (`TAIL_MIN_SPLITS`), cached (host time of an eager
    layer; `clear_plans` forgets it); else None."""
    dev = torch.device(dev_type, dev_index) if dev_index is not None else torch.device(dev_type)
    cut = tail_plan(T, -(-H // BLOCK_H), topk, num_sms(dev), mode, 64)
    return cut if cut and mode in TAIL_MIN_SPLITS and cut[1] >= TAIL_MIN_SPLITS[mode] else None


def _launch_ws(mode, q, kv_cache, indices, out, lse, stride_kv, n_rows, sm_scale, num_splits, block_n, probe, regs,
               bal=0):
    """One launch of a three-warpgroup kernel over q's tokens (and the merge of its partials where it splits); bal:
    the balanced schedule over that many programs a head block (dq; `balanced_plan`)."""
    T, H, _ = q.shape
    topk = indices.shape[1]
    dev = q.device
    splits, keys_per_split, grid, kw, kw_key = _ws_plan(T, H, topk, dev.type, dev.index, num_splits, mode, block_n,
                                                        probe, regs, bal)
    part = split_buffer(splits, bal or T, H, lse)
    ptrs = (q, kv_cache, indices, out, lse, part)
    ints = (q.stride(0), q.stride(1), stride_kv, indices.stride(0), out.stride(0), out.stride(1), H, H, topk,
            n_rows, keys_per_split) + (((T if bal else 0),) if mode == "dq" else ())  # N_TOK: read under BAL only
    # what Triton specializes on: the dtypes, each pointer's 16-byte alignment, the int values themselves
    spec = (q.dtype, kv_cache.dtype, out.dtype, tuple(t.data_ptr() % 16 == 0 for t in ptrs), ints)
    _WS_LAUNCH[mode].launch(grid, (*ptrs, *ints, float(sm_scale) * LOG2E), kw, kw_key, dev.index, spec)
    if bal:
        merge_runs(part, out, lse, topk // block_n, bal)
    elif splits > 1:
        mla.merge_splits(part, out, lse, splits)


def sparse_mla_gluon_large(q, kv_cache, indices, sm_scale, *, kv_format="bf16", num_splits=None,
                           block_n=DEFAULT[0], nbuf=DEFAULT[1], mode=DEFAULT[2], probe=0, out=None,
                           pp_regs=None, row_threads=None, tail=True, sched=None):
    """Sparse MLA forward for 17-128 heads on sm_90 (module docstring); returns `(out, lse)` as
    `mla.sparse_mla_launch` does: out `[T, H, 512]` in q's dtype, lse `[T, H]` fp32 natural log, zeros / -inf for a
    token without a valid key. mode: a CONFIGS mode ("pingpong" (bf16) and "dq" (fp8_ds_mla): the three-warpgroup
    kernels, 64-key tiles, two buffers); the default is the key-split kernel ("async"), while `mla.sparse_mla` takes
    the mode `mla.GLUON_LARGE_MODES` names for the cache's format. probe: a stage-timing build (`PROBE` in the
    kernels' docstrings). pp_regs:
    (consumer, producer) registers of the three-warpgroup kernels' worker partitions (default `PP_*_REGS`,
    `DQ_*_REGS`).
    row_threads: threads a raw fp8 row is copied by in the key-split kernel (default `RAW_ROW_THREADS`; the
    three-warpgroup kernels take none). tail: without num_splits, the tail plan (`tail_plan`: the last partial
    wave's tokens split, in a second launch) where it applies and `TAIL_MIN_SPLITS` takes it; False: one launch of
    the split plan. sched (mode "dq", without num_splits): None the rule (`balanced_plan`: the balanced schedule
    where one split would leave about half the SMs idle, else the split and tail plans), "balanced" that schedule
    wherever it can run (an error elsewhere), "plan" never."""
    if not HAVE_GLUON:
        raise RuntimeError("this Triton has no Gluon (triton.experimental.gluon)")
    T, H, d = q.shape
    if d != D_QK or not 1 <= H <= 128:
        raise ValueError(f"q must be [T, H <= 128, {D_QK}], got {tuple(q.shape)}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bf16 (wgmma with the bf16 tile), got {q.dtype}")
    if nbuf < 2:
        raise ValueError(f"nbuf must be >= 2 (the next tile's gather overlaps this tile), got {nbuf}")
    if (mode not in ASYNC and mode not in WS_MODES or (mode in BF16_ONLY and kv_format != "bf16")
            or (mode in FP8_ONLY and kv_format != "fp8_ds_mla")):
        raise ValueError(f"mode must be one of {sorted(ASYNC) + list(WS_MODES)} ({', '.join(BF16_ONLY)}: bf16 caches "
                         f"only, {', '.join(FP8_ONLY)}: fp8_ds_mla only), got {mode!r} for {kv_format}")
    if mode in WS_MODES and ((block_n, nbuf) != (64, 2) or probe not in (0, 1, 2)):
        kind = "ping-pong" if mode == "pingpong" else "dequantising-producer"
        raise ValueError(f"the {kind} kernel takes 64-key tiles, two buffers and probes 1-2, got block_n={block_n} "
                         f"nbuf={nbuf} probe={probe}")
    if mode not in WS_MODES and probe not in (range(7) if kv_format == "fp8_ds_mla" else (0, 1, 2)):
        raise ValueError(f"probe must be 0-6 (fp8_ds_mla) or 0-2 (bf16) for the key-split kernel, got {probe}")
    if sched not in (None, "plan", "balanced") or (sched == "balanced" and (mode != "dq" or num_splits is not None
                                                                              or probe)):
        raise ValueError(f"sched must be None, 'plan' or 'balanced' (mode 'dq', no num_splits, no probe), got "
                         f"{sched!r} with mode={mode!r} num_splits={num_splits} probe={probe}")
    if mode not in WS_MODES:  # the key-split kernel's raw gather; the three-warpgroup kernels have their own mappings
        row_threads = check_row_threads(row_threads, block_n)
    elif row_threads is not None:
        raise ValueError(f"row_threads applies to the key-split kernel only, got {row_threads} for mode {mode!r}")
    fp8 = kv_format == "fp8_ds_mla"
    q, indices, stride_kv, n_rows, out, lse = prepare_call(q, kv_cache, indices, out, kv_format)
    topk = indices.shape[1]
    dev = q.device
    if T == 0:
        return out, lse
    if mode in WS_MODES:
        regs = tuple(pp_regs) if pp_regs else None
        bal = None
        if mode == "dq" and num_splits is None and not probe and sched != "plan":
            flat = indices.stride(0) == topk and T * topk < 2**31
            bal = _bal_cut(T, H, topk, dev.type, dev.index, flat, sched == "balanced")
            if bal is None and sched == "balanced":
                raise ValueError(f"the balanced schedule needs fewer tokens than {num_sms(dev) // -(-H // BLOCK_H)} "
                                 f"(programs a head block), at least as many 64-key tiles, a token over at most "
                                 f"{mla.MAX_SPLITS} programs, programs x tiles < 2^31, and index rows back to back "
                                 f"of a whole number of tiles; got T={T} H={H} top-k={topk} row stride "
                                 f"{indices.stride(0)}")
        cut = _tail_cut(T, H, topk, dev.type, dev.index, mode) if num_splits is None and tail and not bal else None
        if bal:
            _launch_ws(mode, q, kv_cache, indices, out, lse, stride_kv, n_rows, sm_scale, None, block_n, 0, regs, bal)
        elif cut is None:
            _launch_ws(mode, q, kv_cache, indices, out, lse, stride_kv, n_rows, sm_scale, num_splits, block_n, probe,
                       regs)
        else:  # the whole waves at one split, then the rest split (`tail_plan`)
            whole, splits = cut
            _launch_ws(mode, q[:whole], kv_cache, indices[:whole], out[:whole], lse[:whole], stride_kv, n_rows,
                       sm_scale, 1, block_n, probe, regs)
            _launch_ws(mode, q[whole:], kv_cache, indices[whole:], out[whole:], lse[whole:], stride_kv, n_rows,
                       sm_scale, splits, block_n, probe, regs)
        return out, lse
    splits, keys_per_split = plan_splits(T, H, topk, block_n, dev, num_splits, mode)
    part = split_buffer(splits, T, H, lse)
    grid = (T, -(-H // BLOCK_H), splits)
    args = (q, kv_cache, indices, out, lse, part,
            q.stride(0), q.stride(1), stride_kv, indices.stride(0), out.stride(0), out.stride(1), H,
            H, topk, n_rows, keys_per_split, float(sm_scale) * LOG2E)
    _sparse_mla_wgmma_kernel[grid](*args, KV_FP8=fp8, SPLIT=splits > 1, BLOCK_N=block_n, NBUF=nbuf,
                                   ASYNC=ASYNC[mode], PROBE=probe, TPR=row_threads, num_warps=NUM_WARPS)
    if splits > 1:
        mla.merge_splits(part, out, lse, splits)
    return out, lse


def aot_compile(arch: int = 90, block_n: int = DEFAULT[0], nbuf: int = DEFAULT[1], kv_format: str = "bf16",
                split: bool = False, mode: str = DEFAULT[2], probe: int = 0, row_threads: int | None = None,
                bal: bool = False, pdl: bool | None = None):
    """Compile a config for `sm_<arch>` without a GPU (`triton.compile` on a `GluonASTSource`); bal: the dq
    kernel's balanced-schedule build (`balanced_plan`; split partials); pdl: the three-warpgroup kernels' PDL
    constexpr (None: as launched, on for a build whose partials are merged on sm_90+ while `common.PDL` is)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    if (mode, kv_format) not in {(c[2], f) for f in ("bf16", "fp8_ds_mla") for c in configs_for(f)}:
        raise ValueError(f"mode {mode!r} does not take {kv_format} caches (configs_for)")
    fp8 = kv_format == "fp8_ds_mla"
    if bal and (mode != "dq" or probe):
        raise ValueError(f"bal: the dq kernel's build without a probe only, got mode {mode!r} probe {probe}")
    if mode in WS_MODES:
        fn = _sparse_mla_pingpong_kernel if mode == "pingpong" else _sparse_mla_dq_kernel
        regs = (PP_CONSUMER_REGS, PP_PRODUCER_REGS) if mode == "pingpong" else (DQ_CONSUMER_REGS, DQ_PRODUCER_REGS)
        consts = {"SPLIT": split or bal, "BLOCK_N": block_n, "CONSUMER_REGS": regs[0], "PRODUCER_REGS": regs[1],
                  "PROBE": probe}
        if mode == "dq":
            consts["BAL"] = bal
        consts["PDL"] = bool(common.PDL and (split or bal) and arch >= 90) if pdl is None else pdl
        nw = 4
    else:
        fn = _sparse_mla_wgmma_kernel
        consts = {"KV_FP8": fp8, "SPLIT": split, "BLOCK_N": block_n, "NBUF": nbuf, "ASYNC": ASYNC[mode],
                  "PROBE": probe,
                  "TPR": check_row_threads(row_threads, block_n)}
        nw = NUM_WARPS
    types = {"Q": "*bf16", "KV": "*u8" if fp8 else "*bf16", "IDX": "*i32", "O": "*bf16", "LSE": "*fp32",
             "PART": "*fp32", "qk_scale": "fp32"}
    sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
    c = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    div = ("Q", "KV", "IDX", "O", "LSE", "PART", "stride_qt", "stride_qh", "stride_kv", "stride_it", "stride_ot",
           "stride_oh")
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in div}
    return triton.compile(GluonASTSource(fn, sig, c, attrs), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": nw})


def compile_stats(kv_format: str, cfg=DEFAULT, split: bool = False, arch: int = 90, bal: bool = False) -> dict:
    """`aot_compile` plus what the cubin says (shared memory; registers, stack and local memory per thread)."""
    from glm5lib.kernels.mla_gluon import cubin_usage

    k = aot_compile(arch, cfg[0], cfg[1], kv_format, split, cfg[2], bal=bal)
    row = {"config": config_name(cfg) + ("-bal" if bal else ""), "kv_format": kv_format, "split": split or bal,
           "arch": arch,
           "shared": int(k.metadata.shared), "limit": SMEM_LIMIT[arch],
           "estimate": smem_bytes_estimate(cfg[0], cfg[1], kv_format, cfg[2])}
    row["fits"] = row["shared"] <= row["limit"]
    row.update(cubin_usage(k.asm["cubin"]))
    return row


__all__ = ["sparse_mla_gluon_large", "compile_stats", "CONFIGS", "DEFAULT", "config_name", "configs_for",
           "plan_splits", "dq_num_splits", "dq_split_costs", "tail_plan", "TAIL_MIN_SPLITS", "clear_plans",
           "balanced_plan", "run_pieces", "run_span", "run_span_max", "merge_runs", "BAL_MAX_FILL", "BAL_MIN_TOPK",
           "smem_bytes_estimate", "aot_compile", "check_row_threads", "RAW_ROW_THREADS"]
