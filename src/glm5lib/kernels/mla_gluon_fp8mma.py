"""Gluon sparse MLA forward for 1-16 heads over an fp8_ds_mla cache, on tensor-core products of the cached bytes.

`sparse_mla_fp8mma(q, kv_cache, indices, sm_scale)` -> `(out [T, H, 512], lse [T, H])`, the contract of
`mla.sparse_mla_launch(..., kv_format="fp8_ds_mla")`; the fp32 twin is `naive.sparse_mla_ref`. `mla.sparse_mla`
takes it on sm_90 for 1-16 heads and at least `mla.FP8MMA_MIN_T` tokens (`mla.fp8mma_route`).

Why another kernel. At 8-16 heads per GPU the products are small and every cached byte is used by few heads, so
what a kernel does per byte decides its speed. The other kernels (`mla._sparse_mla_fwd_kernel`,
`mla_gluon._sparse_mla_gluon_kernel`) put heads on the mma's M of 16 (half of every product is padding at 8 heads)
and pass the widened rows through shared memory. This kernel does neither:

- keys are the mma's M and heads its N (8 per warp): `S^T = K q^T` and `O^T = V^T P^T`; no padding at 8 heads, and
  per-key work (the row max, the row scales) runs along M;
- the K and V operands are loaded from the gathered tile straight into the mma's registers: the order of the 128
  columns inside a chunk is free in `S = sum_k K[:, k] q[:, k]` as long as q takes the same order, so it is chosen
  so that each thread's share of a row is 32 contiguous bytes, read without bank conflicts (`_k_logical`,
  `_k_logical16`). For `O^T = V^T P^T` the output rows (the value columns) may be permuted the same way and put
  back when stored (`_v_logical`, `_d_order`): each thread loads 8 contiguous bytes of 8 keys, and only the bytes'
  order inside registers changes.
  Every such load is `convert_layout(..., assert_trivial=True)`: a layout under which any byte had to cross threads
  does not compile.

Two builds of the products (`Config.q_terms`, `p_terms`):
- e4m3 products (m16n8k32; q_terms, p_terms 2 or 3): the cached e4m3 bytes are the operands as they are, and the
  small operand is split into e4m3 terms instead: q (bf16) as `q sigma ~ q0 + q1 (+ q2)` (each term the rounding
  rest of the ones before it, `sigma` a power of two per head that brings `max |q|` to 448: two 4-bit terms hold a
  bf16 value), and P, scaled per 128-column chunk by the rows' fp32 scale, as `P s F ~ p0 + p1` (`F` a power of two
  per tile that brings the tile's largest row scale to 448: about bf16's precision). sm_89 / sm_120 run these
  natively (unmeasured: no such GPU has run them; `q_terms=2, p_terms=2` takes this build).
- fp16 products (m16n8k16; q_terms = p_terms = 1): each K and V byte is widened to fp16 once in registers (one
  `cvt.rn.f16x2.e4m3x2` per pair, exact), q sigma and P s F are one fp16 term each (q exact, P with fp16's 11 bits).
  Both classes take this build (`CONFIG_BY_CLASS`; the 99 KB class of sm_89 / sm_120 only with `GLM5LIB_FP8MMA=1`).
  sm_90 has no e4m3 `mma.sync` of its own: ptxas converts both operands of each to fp16 and issues fp16 products
  (the SASS of the H200 build, NOTES.md round 8), so the e4m3 build converts every K byte once per q term and every
  V byte once per P term there. The fp16 build needs about half the instructions (SASS of the sm_90 loop under
  Triton 3.6, one 32-key tile: 905 instructions, 272 conversions and 68 HMMA, against 1698, 448 and 132) and is
  the one sm_90 takes.
The rope part (64 bf16 per row) is a bf16 product in both. Where four warps along the keys make one warpgroup
(`Config.key_warps`), S^T's products may be sm_90's wgmma instead, K from the same registers and q read by the tensor
cores from shared memory, each chunk's product in flight while the next chunk's K is widened (`Config.wgmma`,
`WGMMAS`; taken by the one-split 9-16-head build on sm_90: prefill, and decode batches past a wave).

A program owns (token, split of its top-k list) and all its heads: `2 * G` warps, G head groups of 8 (G = 1 up to
8 heads, 2 up to 16). Each tile of `BN` keys (32, or 64 where a program owns a token's whole top-k list:
`tile_keys`; at 64 each warp's S is two m16 tiles on the same q fragments) is gathered once by `cp.async` into a
ring of `NBUF` slots (a barrier per tile, two with one slot; `Config.nbuf = 0` takes one slot per head group,
`ring_slots`; one slot is refilled whole before its tile or, at one split on sm_90, piece by piece
as its bytes are read for the last time: `REFILLS`); the two
warps of a head group split the tile's keys for S and the value columns for `O^T`, so per-tile state crosses them
only through shared memory: P^T, against each half's own row max, and the two halves' maxima (`m_s`), after which
both warps bring P to the common max (one more barrier; at 9-16 heads the check whether the accumulators need a
rescale still reduces across the head groups). The online softmax runs in the log2 domain; invalid keys (-1,
>= N rows, past the split) are gathered as zero-filled masked copies of row 0 and get logit -inf. Split-K partials
use `mla._part_rows`'s layout and are merged by `mla.merge_splits`.

The e4m3 values are made by inline PTX, four per asm block (`_to_e4m3`), and never widened again: Triton 3.6's own
fp32 -> e4m3 -> fp32 chain returned wrong fp32 values for about half of a 512-wide row on the H200
(`scripts/fp8mma_unit.py`); the fp32 value of a leading term comes from Veltkamp's split instead (`_split4`). The
widening of the cached bytes is inline PTX too (`_e4m3_f16`), the hardware's own conversion; `Config.widen` takes
integer instructions for some chunks instead (`_e4m3_f16_int`, `WIDENS`: a measurement knob, not shipped).

Gluon does not run in Triton's interpreter: numerics are checked on a GPU (`scripts/fp8mma_device.py`, `checks
--profile full`, and, for the e4m3 build, tile 0's operands and products against torch with
`scripts/fp8mma_debug.py`, the `DEBUG` record); `tests/test_mla_fp8mma.py` compiles every config for sm_89 / sm_90 /
sm_120 and checks the column and row orders and the power-of-two rule on the CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import functools

import torch

from glm5lib.kernels import common  # noqa: F401  (before triton: the interpreter switch)
from glm5lib.kernels import mla
from glm5lib.kernels.common import Prebound, capability, num_sms
from glm5lib.kernels.compile_report import SMEM_LIMIT
from glm5lib.kernels.mla import LOG2E, _merge_rows, _part_rows
from glm5lib.kernels.naive import D_NOPE, D_QK, D_ROPE

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from glm5lib.kernels.mla_gluon import HAVE_GLUON, cubin_usage, prepare_call, split_buffer  # noqa: E402

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from glm5lib.kernels.mla_gluon import _as, _async_copy, _barrier, _tile_idx

BLOCK_N = 32  # keys per tile unless a Config says otherwise: two m16 tiles, one per warp of a head group
BLOCK_NS = (32, 64)  # a tile of 64 keys gives each warp two m16 tiles of S that share every q fragment it loads
# threads a gathered row's 512 latent bytes are spread over, 16 bytes each (0: one a warp, 2 G). With 8 a warp's copy
# instruction reads 4 whole 128-byte lines; with 2 (the kernel until bc8f6e0) 16 rows' 32-byte pieces, every line
# over four instructions. H200, 8 heads, the kernel's own gathers alone (`ablate_launch`, rows from HBM at decode
# B128, from L2 at prefill s_q 4096): 91 -> 68 us and 1706 -> 934 us; the whole kernel 103 -> 77-81 us and 1833 ->
# 1336-1345 us (2 -> 4 -> 8 -> 16 -> 32 threads: 91, 74, 68, 69, 71 us at decode;
# `sweeps/fp8mma_ablate_h200_bc8f6e0.json`, `sweeps/fp8mma_ablate_h200_6e4488e.json`)
ROW_THREADS = (0, 2, 4, 8, 16, 32)
# how the one-slot ring (1-8 heads, `ring_slots`) is refilled. 0: the next tile whole, gathered and waited for before
# it is computed, so a program's own gathers never overlap its products (only other programs' on the SM do).
# 1 ("early"): each part as soon as its bytes are read for the last time: the rope part and the scales once the P^T
# exchange has ended S, and each 128-column latent chunk behind its P V product (which warp copies which bytes:
# `REFILL_ROWS`); the next tile is waited for at the top of its iteration. The slot is then four allocations, one a
# chunk, so that the compiler's shared-memory barrier analysis, which tracks whole allocations, inserts one barrier a
# chunk (before its refill) and none between a chunk's refill and the next chunk's reads. 2 ("plan"): early where a
# program owns a token's whole top-k list (one split: 64-key tiles under `tile_keys`' rule), whole where the list is
# split.
# H200, 8 heads, the fp16-product build (`sweeps/fp8mma_refill_h200_e6da82b.json`, `..._8457230.json`): prefill
# s_q 4096 1372 -> 1275 us, 1373 -> 1277 (-7 %); decode B128 81.4 -> 84.0, 80.7 -> 83.2 us and B32 28.9 -> 32.6,
# 28.7 -> 31.8 (slower: 32-key tiles from HBM); the 99 KB class's e4m3 build over 32-key tiles slower in both
# (prefill 1816 -> 1872 us, decode B128 89.6 -> 93.9). One cp.async group a chunk, each waited for in S just before
# the chunk's product (8457230's refill 2, since removed): 1292 us at prefill, no better
REFILLS = (0, 1, 2)
# how programs are laid over the work where each owns a token's whole top-k list (one split) and the slot is refilled
# early. 0: one program a token (the grid is (T, splits)); the hardware starts a new program wherever one ends, and
# since every program does the same work the last wave fills only the fractional part of T / slots of the machine
# (`slots`: the programs that fit on all SMs at once, `programs_per_sm` times the SM count): s_q 4096 at 8 heads is
# 7.76 waves of 528 and takes 99 % of 8 waves' time (H200, `sweeps/fp8mma_waves_h200_4a85e56.json`: 1278 us at 4096
# tokens, 1289 at 4224, 1134 at 3696). 1 ("balanced"): where T > slots, `slots` programs, each a contiguous run of T *
# tiles / slots tiles of the tokens' tile list in token order (FlashMLA's scheduler does the same), so a token is done
# whole by one program or in two pieces by two neighbouring ones, whose partials `_merge_pieces_kernel` combines; the
# next piece's first tile is refilled behind the last one's products like any other tile (`balanced_pieces` is the
# schedule in Python). A cut token's output is the merge of two fp32 partials, so it rounds differently from the same
# token done whole (in fp32; after the bf16 store an element can differ by one bf16 step): under this schedule a
# token's output depends on the token count and the GPU's SM count. H200, 8 heads
# (`sweeps/fp8mma_waves_h200_5b6d93c.json`, one run): 600 tokens 266 -> 213 us, 3696 (7 whole waves) 1131 -> 1143 (its
# per-token q loads, resets and stores inside each run, and the merge launch), 4096 1268 -> 1269
SCHEDS = (0, 1)
# where the programs of a launch whose merge follows trigger it under PDL (`common.pdl`, off by default): 1 as the
# first thing they do, 2 after their tile loop (at one split before the epilogue's stores; under the balanced schedule
# after its last piece's; the merge still waits for the whole kernel, `gdc_wait`, so only when its programs may be
# placed moves). H100, CUDA-graph replay, plain -> trigger first -> trigger after the loop
# (`sweeps/pdl_late_h100_c066fea.json`, one process; each launch checked and bit-equal across the settings, but B8's,
# timed only): 8 heads B8 16.5 -> 21.3 -> 16.8 us, B32 34.8 -> 42.5 -> 34.2, B128 88.6 -> 93.8 -> 87.6; 16 heads B32
# 36.2 -> 38.1 -> 36.6, B128 102.6 -> 108.8 -> 102.4; the balanced prefill at 600 tokens 227.6 -> 226.5 -> 226.0.
# After the loop PDL is level with the plain launch (0.98-1.02x); that the merge's programs, placed early, slowed the
# kernel's own is inferred from this, not measured. Set it with `set_pdl_trigger` (the launch plans are cached)
PDL_TRIGGERS = (1, 2)
PDL_TRIGGER = 2
# how the early refill (`REFILLS` 1) copies a latent chunk of the next tile's rows. 0: each warp the half of every
# row's 128 bytes that it read in its P V product (words 16 w..16 w + 15), 4 threads a 64-byte piece, so a warp's
# copy instruction reads 8 rows' 64-byte pieces; a row starts every 656 bytes, so 3 in 8 of those pieces straddle two
# 128-byte lines. 1: each row's whole 128 bytes by 8 threads of one warp, the warps along the rows (4 rows' 128-byte
# pieces an instruction), after a barrier that ends both warps' reads of the chunk (the compiler had put one there
# anyway: its shared-memory barrier analysis tracks whole allocations). The kernel's gathers alone, which copy whole
# tiles, took 1103 us at s_q 4096 with 64-byte pieces (`row_threads` 4) and 934 with 128-byte ones (8) on the H200
# (`sweeps/fp8mma_ablate_h200_6e4488e.json`); the early refill had kept the 64-byte pieces. Set it with
# `set_refill_rows` (the launch plans are cached). 2: as 1, and the rows' scales (16 bytes at byte 512 of a row) one
# 16-byte copy a row into a [key, chunk] slot instead of four 4-byte copies into [chunk, key], where each of the
# program's threads owns one row of the tile (64 keys, two warps: the 1-8-head prefill); the readers sum a [BN, 1]
# column loaded in the products' layout (`_scale`). Per 64-key tile the copies then touch about 480 + 120 + 64
# 128-byte lines (latent, rope, scales) instead of 480 + 120 + 256 (mode 1) or 704 + 120 + 256 (mode 0).
# H100, the shipped 8-head prefill over 32K keys, modes 0 / 1 / 2 in turn in one process, bit-equal outputs
# (`sweeps/refill_rows_h100_071443f.json`, `scripts/refill_rows_probe.py`): 528 tokens 184.0 / 178.2 / 170.6 us,
# 2112 687.9 / 654.7 / 656.6, 4096 1328.2 / 1262.0 / 1258.8, 8192 2631.1 / 2475.3 / 2462.9; 2 ships
REFILL_ROWS_MODES = (0, 1, 2)
REFILL_ROWS = 2
# how the whole-tile gathers (`_gather`: every build's ring but the early refill's, so the split decode at 1-16
# heads, the 9-16-head prefill and the 99 KB class) copy a row's four fp32 scales (bytes 512-527 of the row). 0: into
# [slot, chunk, key], one 4-byte copy each, so each copy instruction reads 32 rows' lines for 4 bytes each (256 line
# requests a 64-key tile, beside about 480 for the latent bytes at 8 threads a row and 120 for the rope), with the
# row ids (their validity and byte offsets: two conversions, 3 barriers a tile) carried from the latent copies'
# layout into the scale copies' through shared memory. 1: into [slot, key, chunk], a row's 16 bytes over 32 NW / BN
# threads (`_scale_rows_layout`: one 16-byte copy a row at two warps over 64 keys, two 8-byte ones at four warps,
# four 4-byte ones at four warps over 32 keys), a row's scales never straddling a line (16-byte aligned: rows start
# every 656 = 41 x 16 bytes, the scales at byte 512): 64 line requests a 64-key tile; the row ids read ahead in that
# layout as the latent copies' are, so nothing is converted; `_scale` reads them as `REFILL_ROWS` 2 has them. 1 is
# shipped since round 33: bit-equal to 0, sanitizers clean, the case matrix passing, faster or level on an H100 (up
# to 4 %, the 16-head prefill; docs/kernels.md v43). Set it with `set_gather_scales` (the launch plans are cached)
GATHER_SCALES_MODES = (0, 1)
GATHER_SCALES = 1
# warps along a tile's keys (S) and along the value rows (O^T). 2: a head group of 8 heads is two warps, and at 9-16
# heads the two groups sit side by side (4 warps), each widening every K and V byte of the tile for its own 8 heads.
# 4: all 8 G heads in one group of four warps over 64-key tiles (each warp one m16 tile of S for 16 keys and every
# head, and a quarter of the value columns in O^T), so each byte is widened by one warp and a thread holds as many
# accumulators (64 registers) as at 8 heads; two programs an SM by registers, two ring slots (`ring_slots`). Only
# the fp16-product build. 0: the rule (`key_warps_of`). H200 (`sweeps/fp8mma_keywarps_h200_eae46c6.json`, one run,
# whole kernel / compute alone): 8 heads decode B128 82.3 -> 73.9 us (compute alone 56 -> 57, gathers alone 69 ->
# 63), B32 29.9 -> 30.3, prefill s_q 4096 1273 -> 1696 (compute alone 812 -> 1188: each warp loads all of q and P^T
# for a quarter of the tile's products); 16 heads prefill 2419 -> 2321 (compute alone 1703 -> 1606), decode B128
# 101.1 -> 102.5, B32 34.5 -> 37.1
KEY_WARPS = (0, 2, 4)
# how the fp16-product build widens its cached e4m3 bytes: the latent chunks c < widen (of 4, K and V alike) by integer
# instructions (`_e4m3_f16_int`: a byte permute, a shift and two masks put each byte's sign, exponent and mantissa
# bits where fp16 keeps them, exactly, as 2^-8 times the value; the 2^8 is folded into that chunk's row scales in S
# and into its accumulator's final scale in O), the rest by the hardware's `cvt.rn.f16x2.e4m3x2` (`_e4m3_f16`). The
# question it asks: whether the hardware conversion's throughput bounds the compute (one F2FP a pair against four
# integer instructions, PRMT, SHF and two LOP3, which may run beside it). Static cost, sm_90 loop under Triton 3.6
# (`sweeps/fp8mma_widen_sass_sm90_triton36.txt`, `scripts/fp8mma_sass_count.py`): the 8-head prefill's 64-key tile
# 1959 instructions with 544 F2FP at 0, 2751 with 288 at 2, 3514 with 32 at 4. Not timed yet (NOTES.md round 18:
# `bash scripts/device_kernels.sh widen`); Nsight Compute's stalls of the shipped kernel (shared-memory results and
# the MIO queue first, math-pipe throttles rare: `sweeps/ncu_stalls_687b4f1.txt`) predict no gain. The e4m3 builds
# widen nothing and take 0 only; nothing ships with another value.
WIDENS = (0, 1, 2, 3, 4)
# how the four-key-warp build (`KEY_WARPS` 4: one warpgroup) computes S^T = K q^T's latent and rope products. 0:
# `mma_v2` (m16n8k16), each warp loading all of q's fragments from shared memory every tile (NOTES.md round 18: 34 %
# of the bytes a warp reads from shared memory a tile in the 16-head prefill, 18432 of 53568). 1: `warpgroup_mma`
# (sm_90's wgmma, m64nHNk16) with K from registers, widened as before (its operand layout is mma_v2's, warp w keys
# 16 w..16 w + 15), and q read by the tensor cores themselves from shared memory, once for the warpgroup instead of
# once a warp (q then lives in four [HN, 128] tiles under the wgmma's 128-byte swizzle). O^T = V^T P^T stays mma_v2:
# its B operand P^T is scaled per key and chunk in registers (`_pv_chunk`), which a shared-memory operand cannot be.
# 2: as 1, each chunk's wgmma issued without waiting, so that the next chunk's K is loaded and widened while it runs
# (waited for one chunk behind; two chunks' K operands live at once). sm_90 only. 3: the rule (`wgmma_of`), 2 where
# four key warps hold 9-16 heads on sm_90 (the one-split build, prefill), else 0. H200 (NOTES.md round 19,
# `sweeps/fp8mma_wgmma_waves16_h200_4812c4d.json`), 16-head prefill over 32K keys: 4096 tokens 2342 -> 2259 (1) ->
# 2157 us (2), 2112 tokens 1176 -> 1101; on an H100 the 8-head decode with four key warps 1-2 % slower with it
WGMMAS = (0, 1, 2, 3)


class Config(NamedTuple):
    """One build: ring slots (0: one per head group, `ring_slots`), e4m3 terms of q and of P (1 and 1: the
    fp16-product build of the module docstring: K and V widened to fp16 once, q and P one fp16 term each, m16n8k16
    products), a register cap per thread (0: the compiler's choice, 208-242; a cap lets more programs share an
    SM's 64 K registers), and the keys of a tile (`BLOCK_NS`: 32, or 64, where each warp's S is two m16 tiles on
    the same q fragments and the per-tile steps, barriers included, come once per 64 keys; 0: `tile_keys`'s rule,
    64 where the split plan gives each program a token's whole top-k list, 32 where it splits the list), the
    threads that gather one row's latent bytes, 16 each (`ROW_THREADS`; 0: one per warp, 2 or 4), and the one-slot
    ring's refill (`REFILLS`: 0 the whole next tile before it is computed, 1 piece by piece as the slot's bytes are
    read for the last time, 2 piece by piece where a program owns a token's whole list; only where the ring has one
    slot at 1-8 heads: `refill_mode`), and the programs' schedule (`SCHEDS`: 0 one a token and split, 1 balanced
    runs of tiles where the early refill owns whole lists and the tokens outnumber the slots: `balanced_mode`), and
    the warps along the keys (`KEY_WARPS`: 2, or 4 with all heads in one group, or 0: `key_warps_of`'s rule), and
    the latent chunks widened by integer instructions instead of the hardware conversion (`WIDENS`), and, with four
    key warps on sm_90, S's products as wgmma with q from shared memory (`WGMMAS`)."""
    nbuf: int
    q_terms: int
    p_terms: int
    maxnreg: int = 0
    block_n: int = BLOCK_N
    row_threads: int = 0
    refill: int = 0
    sched: int = 0
    key_warps: int = 2
    widen: int = 0
    wgmma: int = 0


# the builds the device script checks and times; DEFAULT is what `sparse_mla_fp8mma` takes unless told
CONFIGS = [Config(0, 1, 1, 0, 0, 8, 2, 1, 0, 0, 3), Config(0, 1, 1, 0, 0, 8, 2, 1, 0), Config(0, 1, 1, 0, 0, 8, 2, 1),
           Config(0, 1, 1, 0, 0, 8, 2),
           Config(1, 1, 1, 0, 0, 8, 2, 0, 4), Config(0, 1, 1, 0, 0), Config(0, 1, 1),
           Config(0, 1, 1, 0, 64), Config(1, 1, 1),
           Config(2, 1, 1, 0, 0, 8), Config(1, 1, 1, 168), Config(2, 2, 2), Config(1, 2, 2, 0, BLOCK_N, 8),
           Config(1, 2, 2), Config(2, 3, 2), Config(0, 1, 1, 0, 0, 8), Config(0, 1, 1, 0, 0, 8, 1),
           Config(1, 2, 2, 0, BLOCK_N, 8, 1), Config(1, 1, 1, 0, BLOCK_N, 8)]
# what `mla.sparse_mla` takes by shared-memory class. sm_90: the fp16-product build with one ring slot per head group,
# `tile_keys`'s rule for the tile (64 keys at one split, 32 when splitting; H200 at 4a3fbe7, in its docstring) and
# 8 threads a gathered row (`ROW_THREADS`' docstring: H200 at bc8f6e0 and 6e4488e), refilled early at one split
# (`REFILLS`' comment: H200 at e6da82b and 8457230), four key warps where `key_warps_of`'s rule takes them (decode
# at 1-8 heads, prefill at 9-16: `KEY_WARPS`' comment; a decode step at 1-8 heads also at one split from 0.9 of a
# wave or from 1.5 waves: `DECODE_K4_FILL`), and there at 9-16 heads S as wgmma issued ahead of the next
# chunk's widening (`WGMMAS`' comment: H200 at 4812c4d). The 32-key, 2-thread build at
# 33e8f55 (`fp8mma_h200.json`): 0.86x / 0.88x the time of the e4m3 build at decode B32 / B128 and 0.83x
# at prefill, 8 heads; 0.75-0.81x at 16 heads. The 99 KB class (sm_89 / sm_120; taken only with GLM5LIB_FP8MMA=1,
# since no such GPU has run it): the fp16-product build with one slot (31 KB at 1-8 heads, 41 KB at 9-16: 3 / 2
# programs an SM there), 32-key tiles and 8 threads a row. Its numerics are sm_90's (each byte widened exactly,
# fp16 products, fp32 accumulation), whatever the GPU's e4m3 tensor cores accumulate in. Under that class on an H100
# (`scripts/small_class_probe.py`, `sweeps/small_class_h100_ed3743c.json`: planned for the class and held to its
# programs an SM by a pad; every launch against fp32) it took 0.53-0.79x the decode time of the Triton kernel's 99 KB
# config at 8-16 heads B32 / B128 (8 heads B128 93.7 against 176.4 us) and 0.37 / 0.61x at prefill (s_q 4096, 8 /
# 16 heads), and 0.71-0.88x the time of the e4m3-product build (that build's products are fp16 on sm_90, so its
# time there is not its time on sm_89 / sm_120; `q_terms=2, p_terms=2` still takes it). Two q terms hold a bf16 q
# exactly (8 significant bits = two 4-bit e4m3 terms) except for elements whose scaled value is below 2^-2 (about
# 2^-11 of the head's largest): their rest falls under e4m3's subnormal step
CONFIG_BY_CLASS = {"big": Config(0, 1, 1, 0, 0, 8, 2, 1, 0, 0, 3), "small": Config(1, 1, 1, 0, BLOCK_N, 8)}
DEFAULT = CONFIG_BY_CLASS["big"]


def tile_keys(block_n: int, splits: int, wm: int = 2) -> int:
    """Keys a tile: 64 with four key warps (wm, `KEY_WARPS`); else block_n, or for block_n = 0 the rule: 64 at one
    split (each program a token's whole top-k list: prefill, and batches that fill every SM's programs without
    splitting), 32 when the list is split (decode).
    H200, `sweeps/fp8mma_n64_h200_4a3fbe7.json` (one process, the fp16-product build): prefill s_q 4096 over 32K
    keys 1945 -> 1825 us at 8 heads, 2828 -> 2522 at 16; split decode B32 / B128 34.4 / 97.9 -> 35.7 / 100.3 us at
    8 heads, 36.5 / 108.8 -> 38.7 / 105.6 at 16."""
    if wm == 4:
        return BLOCK_NS[1]
    return block_n or (BLOCK_NS[1] if splits == 1 else BLOCK_N)


def key_warps_of(key_warps: int, G: int, q_terms: int, split: bool, block_n: int = 0) -> int:
    """The warps along the keys a build takes (`KEY_WARPS`): key_warps, or for 0 the rule: 4 for the fp16-product
    build over the rule's tiles (block_n 0) where the top-k list is split at 1-8 heads (decode: few programs an SM,
    each tile's work over four warps) or is not split at 9-16 heads (prefill: each byte widened once instead of
    twice), else 2. The launcher asks the split question of the plan the answer would take (`plan_key_warps`)."""
    if key_warps:
        return key_warps
    if q_terms != 1 or block_n != 0:
        return 2
    return 4 if split == (G == 1) else 2


def num_warps_of(G: int, wm: int) -> int:
    """Warps a program: two a head group at wm = 2, four at wm = 4 (`KEY_WARPS`)."""
    return 2 * G if wm == 2 else 4


def check_key_warps(key_warps: int, q_terms: int, block_n: int) -> None:
    """`KEY_WARPS`; four only with fp16 products (q_terms 1) over 64-key tiles (block_n 64 or the rule's 0)."""
    if key_warps not in KEY_WARPS:
        raise ValueError(f"key_warps must be one of {KEY_WARPS} (0: the rule), got {key_warps}")
    if key_warps == 4 and (q_terms != 1 or block_n not in (0, BLOCK_NS[1])):
        raise ValueError(f"key_warps 4 takes the fp16-product build (q_terms 1) over {BLOCK_NS[1]}-key tiles, got "
                         f"q_terms {q_terms}, block_n {block_n}")


def ring_slots(nbuf: int, G: int, wm: int = 2) -> int:
    """The gather ring's slots: nbuf, or for nbuf = 0 one per head group (G) at wm = 2: 1 at 1-8 heads (4 programs
    per SM by registers, so 4 tiles in flight), 2 at 9-16 (2 programs of 4 warps: 4 tiles again); two at wm = 4
    (2 programs of 4 warps, `KEY_WARPS`; one slot refilled early was slower there). On the H200 (fp16 build,
    `sweeps/fp8mma_h200_08e4e10.json`) one slot was 3-6 % faster than two at 8 heads' decode and within 1 % at
    prefill; two were 6-12 % faster at 16 heads."""
    return nbuf or (G if wm == 2 else 2)


def config_name(cfg) -> str:
    c = Config(*cfg)
    slots = c.nbuf or "G"
    name = f"fp8mma-nbuf{slots}-f16" if c.q_terms == 1 else f"fp8mma-nbuf{slots}-q{c.q_terms}-p{c.p_terms}"
    keys = "" if c.block_n == BLOCK_N else f"-n{c.block_n or 'plan'}"
    return (name + (f"-r{c.maxnreg}" if c.maxnreg else "") + keys + (f"-t{c.row_threads}" if c.row_threads else "")
            + ("", "-e", "-eplan")[c.refill] + ("", "-b")[c.sched] + {2: "", 4: "-k4", 0: "-kplan"}[c.key_warps]
            + (f"-i{c.widen}" if c.widen else "") + ("", "-wg", "-wga", "-wgplan")[c.wgmma])


def config_kwargs(cfg) -> dict:
    """`sparse_mla_fp8mma`'s keyword arguments for a build."""
    return Config(*cfg)._asdict()


def check_widen(widen: int, q_terms: int, p_terms: int) -> None:
    """`WIDENS`: 0-4 latent chunks widened by integer instructions, only in the fp16-product build."""
    if widen not in WIDENS:
        raise ValueError(f"widen must be one of {WIDENS} (latent chunks widened by integer instructions), got {widen}")
    if widen and (q_terms != 1 or p_terms != 1):
        raise ValueError(f"widen {widen} takes the fp16-product build (q_terms = p_terms = 1), got q_terms {q_terms}, "
                         f"p_terms {p_terms}")


def check_wgmma(wgmma: int, key_warps: int, arch: int | None = None) -> None:
    """`WGMMAS`: 1 and 2 only with four key warps forced (key_warps 4: the rule may take two), and only on sm_90
    (arch: the target's compute capability as major * 10 + minor, where known); 3 (the rule) anywhere."""
    if wgmma not in WGMMAS:
        raise ValueError(f"wgmma must be one of {WGMMAS} (S's products as wgmma with q from shared memory), "
                         f"got {wgmma}")
    if wgmma == 3:
        return
    if wgmma and key_warps != 4:
        raise ValueError(f"wgmma {wgmma} takes four key warps (key_warps 4: one warpgroup), got key_warps {key_warps}")
    if wgmma and arch is not None and arch // 10 != 9:
        raise ValueError(f"wgmma {wgmma} needs sm_90's warpgroup products (wgmma), not "
                         f"{f'sm_{arch}' if arch else 'a device without CUDA'}")


def wgmma_of(wgmma: int, wm: int, G: int, arch: int) -> int:
    """The S product a build takes (`WGMMAS`): wgmma, or for 3 the rule: 2 where four key warps (wm) hold 9-16
    heads (G 2) on sm_90 (arch: major * 10 + minor), else 0."""
    if wgmma != 3:
        return wgmma
    return 2 if wm == 4 and G == 2 and arch // 10 == 9 else 0


def check_block_n(block_n: int) -> None:
    """32 or 64 keys a tile (`BLOCK_NS`), or 0 (`tile_keys`'s rule)."""
    if block_n not in (0, *BLOCK_NS):
        raise ValueError(f"block_n (keys a tile) must be one of {BLOCK_NS} or 0 (the split plan's rule), got {block_n}")


def check_row_threads(row_threads: int, G: int, wm: int = 2) -> None:
    """`ROW_THREADS`, and not fewer than one a warp (`num_warps_of`): with fewer, a tile's rows would be covered
    twice, by copies of different warps into the same bytes."""
    nw = num_warps_of(G, wm)
    if row_threads not in ROW_THREADS or 0 < row_threads < nw:
        raise ValueError(f"row_threads must be 0 or one of {tuple(t for t in ROW_THREADS if t >= nw)} at {8 * G} "
                         f"heads and {nw} warps a program, got {row_threads}")


def check_refill(refill: int) -> None:
    """`REFILLS`: 0 (whole), 1 (early) or 2 (the plan's rule)."""
    if refill not in REFILLS:
        raise ValueError(f"refill must be one of {REFILLS} (0: the slot refilled whole, 1: piece by piece, 2: piece "
                         f"by piece at one split), got {refill}")


def check_sched(sched: int) -> None:
    """`SCHEDS`: 0 (a program a token and split) or 1 (balanced runs of tiles)."""
    if sched not in SCHEDS:
        raise ValueError(f"sched must be one of {SCHEDS} (0: a program a token and split, 1: balanced runs of tiles), "
                         f"got {sched}")


def balanced_mode(sched: int, refill: int, splits: int, T: int, slots: int, rows_flat: bool = True) -> bool:
    """Whether a launch takes the balanced schedule (`SCHEDS`): sched 1, the early refill (`refill_mode`'s 1), one
    split, more tokens than slots (so that every program's run holds at least one token's tiles and a token is cut
    at most once), and rows_flat: the index rows a whole number of tiles each and back to back (top-k a multiple of
    the tile, row stride = top-k, T * top-k < 2^31), so that the kernel reads them as one list whose tiles run
    across token boundaries with the same loop as one token's (GLM-5's top-k 2048 in a fresh [T, 2048] tensor)."""
    return bool(sched) and refill == 1 and splits == 1 and T > slots and rows_flat


def balanced_pieces(T: int, tiles: int, programs: int) -> list[list[tuple[int, int, int, str]]]:
    """The balanced schedule in Python, as the kernel computes it: program p runs global tiles [p n / P, (p + 1) n / P)
    of n = T * tiles (token-major); per program its pieces (token, first tile, end tile, kind), kind "whole" (the
    token's every tile), "head" (its first part: partial slot 0 of boundary p) or "tail" (the rest: slot 1 of
    boundary p - 1). `_merge_pieces_kernel` finds boundary b's token as ((b + 1) n / P) // tiles."""
    n = T * tiles
    out = []
    for p in range(programs):
        g0, g1 = p * n // programs, (p + 1) * n // programs
        pieces = []
        g = g0
        while g < g1:
            t = g // tiles
            e = min(g1, (t + 1) * tiles)
            kind = "whole" if g == t * tiles and e == (t + 1) * tiles else ("tail" if g > t * tiles else "head")
            pieces.append((t, g - t * tiles, e - t * tiles, kind))
            g = e
        out.append(pieces)
    return out


def refill_mode(refill: int, nbuf: int, G: int, splits: int, wm: int = 2) -> int:
    """The refill a build takes (`REFILLS`: 0 whole, 1 early): refill 2 resolves to early at one split, whole when
    split; early only where the ring has one slot and each value column is read by one warp (1-8 heads, or four key
    warps, `KEY_WARPS`: at 9-16 heads over two key warps, two warps of different head groups read the same value
    columns, and `ring_slots` gives two slots), else whole."""
    if ring_slots(nbuf, G, wm) != 1 or (G != 1 and wm == 2):
        return 0
    return int(splits == 1) if refill == 2 else refill


def check_terms(q_terms: int, p_terms: int) -> None:
    """2-3 e4m3 terms each, or 1 and 1: the fp16-product build."""
    if not ((q_terms, p_terms) == (1, 1) or (q_terms in (2, 3) and p_terms in (2, 3))):
        raise ValueError(f"q_terms and p_terms must be 2 or 3 each (e4m3 products) or both 1 (fp16 products), got "
                         f"{q_terms}, {p_terms}")


def smem_bytes_estimate(G: int, nbuf: int, q_terms: int, block_n: int = BLOCK_N, wm: int = 2) -> int:
    """Shared memory of one program: the gather ring (latent, rope, scales), q's terms (one fp16 copy when
    q_terms = 1) and rope part, and P (block_n 0: the larger of its two tiles; wm 4: 64-key tiles)."""
    nbuf = ring_slots(nbuf, G, wm)
    block_n = tile_keys(block_n, 1, wm) if wm == 4 else block_n or max(BLOCK_NS)
    q_bytes = 2 * D_NOPE if q_terms == 1 else q_terms * D_NOPE
    return nbuf * block_n * (D_NOPE + 2 * D_ROPE + 16) + 8 * G * (q_bytes + 2 * D_ROPE + 4 * block_n)


# `_e4m3_f16_int`'s PTX (a module constant so that the tests can run it through `tests/test_mla_fp8mma.py`'s small
# emulator of these five instructions over every byte): $2 holds 4 e4m3 bytes, $0 and $1 the fp16 pairs of bytes
# 0, 1 and 2, 3. prmt's selector nibbles pick byte 0-3 of $2 or 4 (a zero byte of z) for result bytes 0-3
E4M3_F16_INT_PTX = ("{ .reg .b32 z, y, t;\n mov.b32 z, 0;\n"
                    " prmt.b32 y, $2, z, 0x1404;\n shr.b32 t, y, 1;\n and.b32 t, t, 0x3F803F80;\n"
                    " and.b32 y, y, 0x80008000;\n or.b32 $0, y, t;\n"
                    " prmt.b32 y, $2, z, 0x3424;\n shr.b32 t, y, 1;\n and.b32 t, t, 0x3F803F80;\n"
                    " and.b32 y, y, 0x80008000;\n or.b32 $1, y, t; }")

if HAVE_GLUON:
    _E4M3_F16_INT_PTX = gl.constexpr(E4M3_F16_INT_PTX)

    @gluon.jit
    def _k_logical(x):
        """[R, W] bytes of latent columns in memory order -> the column order the products use, chunk by chunk of 128
        (a bit permutation: memory byte p = 32 c + 16 s1 + 8 s0 + 4 h + b of a chunk is its column
        k = 64 s1 + 32 s0 + 16 h + 4 c + b). Thread (g, c) of the mma's operand layout owns columns 4c..4c+3 and
        4c+16..4c+19 of each 32-column step: in memory, 32 contiguous bytes per row of a chunk, and the 16-byte halves
        that one load instruction reads for lanes c = 0..3 are every other unit (0, 2, 4, 6), so that rows g and
        g + 1 (one quarter-warp) land on the odd and even units of the row-swizzled tile: no bank conflict."""
        R: gl.constexpr = x.shape[0]
        W: gl.constexpr = x.shape[1]
        x = gl.reshape(x, [R, W // 128, 2, 2, 2, 2, 2, 4])  # (chunk, c1, c0, s1, s0, h, b)
        x = gl.permute(x, [0, 1, 4, 5, 6, 2, 3, 7])  # (chunk, s1, s0, h, c1, c0, b)
        return gl.reshape(x, [R, W])

    @gluon.jit
    def _k_logical16(x):
        """The same for the fp16 products (m16n8k16): memory element p = 32 c + 16 s + 8 r3 + 4 r2 + 2 r1 + r0 of a
        chunk is its column k = 64 s + 32 r3 + 16 r2 + 8 r1 + 2 c + r0. Thread (g, c) owns columns 2c, 2c + 1,
        2c + 8, 2c + 9 of each 16-column step: the same 32 contiguous bytes per row of a chunk as `_k_logical`'s (and
        the same conflict-free loads), and each pair of neighbouring bytes is one fp16x2 register of the operand."""
        R: gl.constexpr = x.shape[0]
        W: gl.constexpr = x.shape[1]
        x = gl.reshape(x, [R, W // 128, 2, 2, 2, 2, 2, 2, 2])  # (chunk, c1, c0, s, r3, r2, r1, r0)
        x = gl.permute(x, [0, 1, 4, 5, 6, 7, 2, 3, 8])  # (chunk, s, r3, r2, r1, c1, c0, r0)
        return gl.reshape(x, [R, W])

    @gluon.jit
    def _e4m3_f16(x):
        """e4m3 bytes (uint8) -> fp16, exactly: one `cvt.rn.f16x2.e4m3x2` per pair of neighbouring registers (inline
        PTX, so that the conversion is the hardware's own and no fp32 step is in it)."""
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi;\n mov.b32 {lo, hi}, $2;\n cvt.rn.f16x2.e4m3x2 $0, lo;\n cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x], dtype=gl.float16, is_pure=True, pack=4)

    @gluon.jit
    def _e4m3_f16_int(x):
        """e4m3 bytes (uint8) -> fp16 holding 2^-8 times each value, exactly, by integer instructions: the register
        pairs `_e4m3_f16` makes (bytes 0, 1 and 2, 3 of a word), each byte permuted to the top of a 16-bit half,
        then its sign kept at bit 15 and its 7 exponent and mantissa bits shifted right by one, under fp16's sign,
        where fp16's exponent field (bias 15) reads e4m3's (bias 7): 2^(7 - 15) times the value, subnormals
        included (e4m3's smallest, 2^-9, becomes 2^-17, above fp16's 2^-24). The cache holds no NaN (vLLM's
        quantization saturates), which this would widen to 1.875. Marlin's and FasterTransformer's fast
        dequantization use the same bit placement; here without their multiply by 2^8, which the callers fold into
        the row scales (S) and the output's scale (O)."""
        return gl.inline_asm_elementwise(_E4M3_F16_INT_PTX, "=r,=r,r", [x], dtype=gl.float16, is_pure=True, pack=4)

    @gluon.jit
    def _widen(x, INT: gl.constexpr):
        """`_e4m3_f16_int` (2^-8 times the values) where INT, else `_e4m3_f16` (`WIDENS`)."""
        if INT:
            return _e4m3_f16_int(x)
        else:
            return _e4m3_f16(x)

    @gluon.jit
    def _v_logical(x, WM: gl.constexpr):
        """[BLOCK_N keys, 128 columns] of a chunk in memory order -> V^T [128 rows m, keys] with the rows permuted.
        WM 2 (two warps along the value rows): memory column d = 64 m16 + 8 (m & 7) + 4 m64 + 2 m32 + m8 (m16 ... m64:
        the bits of m); thread (g, c) of the operand layout owns rows g + {0, 8} + {0, 32} + {0, 64} (+16 in the
        second warp): 8 contiguous bytes of each of its 8 keys. WM 4 (`Config.key_warps`): d = 64 m32 + 32 m16 +
        4 (m & 7) + 2 m64 + m8; thread (g, c) of warp w owns rows g + {0, 8} + {0, 64} + 16 w: 4 contiguous bytes of
        each key, warp w the chunk's columns 32 w..32 w + 31."""
        N: gl.constexpr = x.shape[0]
        x = gl.permute(x, [1, 0])  # [d, key]
        if WM == 4:
            x = gl.reshape(x, [2, 2, 2, 2, 2, 2, 2, N])  # d bits high to low: (m32, m16, m4, m2, m1, m64, m8)
            x = gl.permute(x, [5, 0, 1, 6, 2, 3, 4, 7])  # (m64, m32, m16, m8, m4, m2, m1)
        else:
            x = gl.reshape(x, [2, 2, 2, 2, 2, 2, 2, N])  # d bits high to low: (m16, m4, m2, m1, m64, m32, m8)
            x = gl.permute(x, [4, 5, 0, 6, 1, 2, 3, 7])  # (m64, m32, m16, m8, m4, m2, m1)
        return gl.reshape(x, [128, N])

    @gluon.jit
    def _d_order(acc, WM: gl.constexpr):
        """The inverse of `_v_logical`'s row permutation on an [128 rows m, heads] accumulator: rows in memory order."""
        HN: gl.constexpr = acc.shape[1]
        x = gl.reshape(acc, [2, 2, 2, 2, 2, 2, 2, HN])  # (m64, m32, m16, m8, m4, m2, m1)
        if WM == 4:
            x = gl.permute(x, [1, 2, 4, 5, 6, 0, 3, 7])  # (m32, m16, m4, m2, m1, m64, m8): d high to low
        else:
            x = gl.permute(x, [2, 4, 5, 6, 0, 1, 3, 7])  # (m16, m4, m2, m1, m64, m32, m8): d high to low
        return gl.reshape(x, [128, HN])

    @gluon.jit
    def _split4(x):
        """x rounded to 4 significant bits, e4m3's precision (Veltkamp's split with 2^20 + 1; inline PTX so that no
        multiply-add is fused into it, which would break the split). Exact in e4m3 from 2^-6 up; below, e4m3 keeps
        fewer bits and its rounding of the result moves it by at most 2^-10."""
        return gl.inline_asm_elementwise(
            "{ .reg .f32 t, u;\n mul.rn.f32 t, $1, 0f49800008;\n sub.rn.f32 u, t, $1;\n sub.rn.f32 $0, t, u; }",
            "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _to_e4m3(x):
        """e4m3 of x rounded to nearest even, 4 values per asm block (the bytes in one 32-bit register). Triton's own
        fp32 -> e4m3 -> fp32 chain returned wrong fp32 values for about half of a 512-wide row on the H200 (Triton 3.6,
        `scripts/fp8mma_unit.py`); here no e4m3 value is widened again."""
        b = gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
            " cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n mov.b32 $0, {lo, hi}; }",
            "=r,r,r,r,r", [x], dtype=gl.uint8, is_pure=True, pack=4)
        return b.to(gl.float8e4nv, bitcast=True)

    @gluon.jit
    def _e4m3_terms(x, TERMS: gl.constexpr):
        """x (fp32, |x| <= 448) as TERMS e4m3 tensors whose sum approximates x: each term rounds what is left."""
        y0 = _split4(x)
        r = x - y0
        if TERMS == 3:
            y1 = _split4(r)
            t1 = _to_e4m3(y1)
            t2 = _to_e4m3(r - y1)
        else:
            t1 = _to_e4m3(r)
            t2 = t1
        return _to_e4m3(y0), t1, t2

    @gluon.jit
    def _exp_to_max(amax):
        """The largest integer e with amax * 2^e <= 448 (= 1.75 * 2^8), read off amax's fp32 bits (exact; a log2 can
        land one too high at a power of two, and e4m3 would then saturate); 0 for amax = 0."""
        bits = amax.to(gl.int32, bitcast=True)
        e = 135 - (bits >> 23) - ((bits & 0x7FFFFF) > 0x600000).to(gl.int32)  # 8 - E, or 7 - E above 1.75 * 2^E
        return gl.where(amax > 0, gl.minimum(gl.maximum(e, -126), 126), 0)

    @gluon.jit
    def _pow2(e):
        """2^e for an integer e in [-126, 127], exactly (built from its exponent bits)."""
        return ((e + 127) << 23).to(gl.float32, bitcast=True)

    @gluon.jit
    def _gather(KV, idx, idx_s, N_ROWS, stride_kv, lat, rope, scs, slot, LW: gl.constexpr, LR: gl.constexpr,
                LS: gl.constexpr, SR: gl.constexpr):
        """cp.async one tile's rows into ring slot `slot`: the 512 e4m3 bytes as int32 words (idx in
        `SliceLayout(1, LW)`, LW: `Config.row_threads` threads a row, 16 bytes each), the bf16 rope part (LR) and the
        4 fp32 scales into scs[slot] as [chunk, key] (LS: one 4-byte copy a scale, the row ids converted from idx), or,
        SR (`GATHER_SCALES` 1), as [key, chunk] (LS: `_scale_rows_layout`, the row ids idx_s, read in
        `SliceLayout(1, LS)`; without SR idx_s is not read). Invalid rows are masked copies of row 0 (zero-filled)."""
        v = (idx >= 0) & (idx < N_ROWS)
        rb = gl.where(v, idx, 0).to(gl.int64) * stride_kv  # bytes
        w_off = gl.multiple_of(rb // 4, 4)
        offs_w = gl.arange(0, 128, layout=gl.SliceLayout(0, LW))
        _async_copy(lat.index(slot), KV.to(gl.pointer_type(gl.int32), bitcast=True) + w_off[:, None] + offs_w[None, :],
                    mask=v[:, None])
        if SR:
            vs = (idx_s >= 0) & (idx_s < N_ROWS)
            _gather_tail(KV, v, rb, vs, gl.where(vs, idx_s, 0).to(gl.int64) * stride_kv, rope, scs, slot, LR, LS, SR)
        else:
            _gather_tail(KV, v, rb, gl.convert_layout(v, gl.SliceLayout(0, LS)),
                         gl.convert_layout(rb, gl.SliceLayout(0, LS)), rope, scs, slot, LR, LS)

    @gluon.jit
    def _gather_tail(KV, v, rb, vs, rbs, rope, scs, slot, LR: gl.constexpr, LS: gl.constexpr, SR: gl.constexpr = False):
        """cp.async the rope part and the scales of a tile's rows into ring slot `slot` (v: valid, rb: byte offsets,
        as `_gather` makes them; vs, rbs: the same in the scale copies' layout, `SliceLayout(0, LS)`). The scales land
        as [chunk, key], one 4-byte copy each, or, SR (`REFILL_ROWS` 2, `GATHER_SCALES` 1), as [key, chunk], a row's
        16 bytes in one to four copies (LS then `_scale_rows_layout` and vs, rbs in its `SliceLayout(1, LS)`)."""
        vr = gl.convert_layout(v, gl.SliceLayout(1, LR))
        h_off = gl.multiple_of(gl.convert_layout(rb, gl.SliceLayout(1, LR)) // 2 + 264, 8)
        offs_r = gl.arange(0, 64, layout=gl.SliceLayout(0, LR))
        _async_copy(rope.index(slot), KV.to(gl.pointer_type(gl.bfloat16), bitcast=True) + h_off[:, None] +
                    offs_r[None, :], mask=vr[:, None])
        if SR:
            f_off = gl.multiple_of(rbs // 4 + 128, 4)
            offs_c = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
            _async_copy(scs.index(slot), KV.to(gl.pointer_type(gl.float32), bitcast=True) + f_off[:, None] +
                        offs_c[None, :], mask=vs[:, None])
        else:
            f_off = rbs // 4 + 128
            offs_c = gl.arange(0, 4, layout=gl.SliceLayout(1, LS))
            _async_copy(scs.index(slot), KV.to(gl.pointer_type(gl.float32), bitcast=True) + f_off[None, :] +
                        offs_c[:, None], mask=vs[None, :])

    @gluon.jit
    def _refill_tail(KV, idx_r, idx_s, N_ROWS, stride_kv, rope, scs, LR: gl.constexpr, LS: gl.constexpr,
                     SR: gl.constexpr = False):
        """The early refill's rope and scale copies (`_gather_tail`) from row ids loaded in each copy's layout
        (idx_r: `SliceLayout(1, LR)`, idx_s: the scale copies', `SliceLayout(0, LS)`, or `SliceLayout(1, LS)` where
        SR): no vector crosses warps through shared memory, where `_gather`'s conversions cost three barriers a tile."""
        v = (idx_r >= 0) & (idx_r < N_ROWS)
        vs = (idx_s >= 0) & (idx_s < N_ROWS)
        _gather_tail(KV, v, gl.where(v, idx_r, 0).to(gl.int64) * stride_kv, vs,
                     gl.where(vs, idx_s, 0).to(gl.int64) * stride_kv, rope, scs, 0, LR, LS, SR)

    @gluon.jit
    def _scale(scs, sc_c, slot, c: gl.constexpr, P: gl.constexpr, SR: gl.constexpr):
        """The row scales of latent chunk c of ring slot `slot`'s keys, in `SliceLayout(1, P)`: from sc_c (the scales
        as [slot, chunk, key], chunk c of slot s at row 4 s + c), or, SR, from scs as [slot, key, chunk] through a
        [BN, 1] column loaded in P and summed over its one column (no element moves between threads)."""
        if SR:
            return gl.sum(scs.index(slot).slice(c, 1, 1).load(P), axis=1)
        else:
            return sc_c.index(4 * slot + c).load(gl.SliceLayout(1, P))

    @gluon.jit
    def _refill_chunk(KV, idx, N_ROWS, stride_kv, latc, c: gl.constexpr, LC: gl.constexpr, ROWS: gl.constexpr):
        """The early refill's latent copy of chunk c (`REFILLS`) into latc[c] (the slot as four [BN, 32]-word
        allocations, one a chunk): idx in `SliceLayout(1, LC)` (`_refill_layout`). ROWS 0: warp w copies words
        16 w..16 w + 15 of each row, the value columns 64 w..64 w + 63 that it read in its P V product of the chunk;
        ROWS 1 (`REFILL_ROWS`): each row's 128 bytes by one warp, the warps along the rows, after a barrier that
        ends every warp's reads of the chunk. Invalid rows are masked copies of row 0."""
        if ROWS:
            # the other warps' P V reads of this chunk end here (Triton's shared-memory barrier analysis inserts the
            # same barrier by itself, since it tracks whole allocations; written out, the copies do not rely on it)
            _barrier()
        v = (idx >= 0) & (idx < N_ROWS)
        w_off = gl.multiple_of(gl.where(v, idx, 0).to(gl.int64) * stride_kv // 4, 4)
        offs_w = gl.arange(0, 32, layout=gl.SliceLayout(0, LC))
        _async_copy(latc[c], KV.to(gl.pointer_type(gl.int32), bitcast=True) + w_off[:, None] + c * 32 +
                    offs_w[None, :], mask=v[:, None])

    @triton.constexpr_function
    def _refill_layout(NW, ROWS=0):
        """`_refill_chunk`'s layout: [BN, 32] words of a chunk, 16 bytes a copy. ROWS 0: 4 threads a 64-byte row
        half, the warps along the halves (as `_pv_chunk`'s V loads split the value columns): a warp's instruction
        copies 8 rows' 64-byte pieces. ROWS 1: 8 threads a row's 128 bytes, the warps along the rows: 4 rows' 128-byte
        pieces an instruction (`REFILL_ROWS`)."""
        if ROWS:
            return gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])
        return gl.BlockedLayout([1, 4], [8, 4], [1, NW], [1, 0])

    @triton.constexpr_function
    def _scale_rows_layout(NW, BN):
        """The scale copies' layout where a row's four scales land as [key, chunk] (`REFILL_ROWS` 2,
        `GATHER_SCALES` 1): [BN, 4] fp32 over the NW warps' threads, 32 NW / BN threads a row (1, 2 or 4), each
        copying 16, 8 or 4 contiguous bytes; the warps along the rows, no thread holding another's element."""
        tpr = 32 * NW // BN
        assert tpr in (1, 2, 4) and tpr * BN == 32 * NW, f"no scale-row layout for {NW} warps over {BN} keys"
        return gl.BlockedLayout([1, 4 // tpr], [32 // tpr, tpr], [NW, 1], [1, 0])

    @triton.constexpr_function
    def _gather_layouts(NW, TPR):
        """The gather's register layouts for NW warps and TPR threads a row (0: one a warp): [BN, 128] latent int32
        words over TPR threads a row, 16 bytes each; [BN, 64] bf16 rope over up to 8; [4 chunks, BN] fp32 scales, one
        4-byte copy each. A thread holds pieces of BN / (32 NW / TPR) rows."""
        tw = TPR if TPR > 0 else NW
        tr = min(tw, 8)
        return (gl.BlockedLayout([1, 4], [32 // tw, tw], [NW, 1], [1, 0]),
                gl.BlockedLayout([1, 8], [32 // tr, tr], [NW, 1], [1, 0]),
                gl.BlockedLayout([4 // NW, 1], [1, 32], [NW, 1], [1, 0]))

    @gluon.jit
    def _idx_pair(idx_row, k0, k_end, BN: gl.constexpr, LW: gl.constexpr, LS: gl.constexpr, SR: gl.constexpr):
        """The index tile at list position k0 in the latent copies' layout and, SR, again in the scale copies'
        (`_gather`'s idx and idx_s; without SR the first twice, since `_gather` then converts it)."""
        idx_w = _tile_idx(idx_row, k0, k_end, BN, gl.SliceLayout(1, LW))
        if SR:
            idx_s = _tile_idx(idx_row, k0, k_end, BN, gl.SliceLayout(1, LS))
        else:
            idx_s = idx_w
        return idx_w, idx_s

    @gluon.jit
    def _ring_start(KV, idx_row, k_start, k_end, N_ROWS, stride_kv, lat, rope, scs, NBUF: gl.constexpr,
                    BN: gl.constexpr, LW: gl.constexpr, LR: gl.constexpr, LS: gl.constexpr,
                    ALL_SLOTS: gl.constexpr, SR: gl.constexpr):
        """The ring's first NBUF - 1 tiles in flight before the loop (ALL_SLOTS, the compute-alone measurement: every
        slot, landed); returns the index tiles of the loop's first gather (`_ring_step`): in the latent copies' layout
        and, SR, in the scale copies' (`_gather`; without SR the first again)."""
        NG: gl.constexpr = NBUF if ALL_SLOTS else NBUF - 1
        for j in gl.static_range(NG):
            idx_w, idx_s = _idx_pair(idx_row, k_start + j * BN, k_end, BN, LW, LS, SR)
            _gather(KV, idx_w, idx_s, N_ROWS, stride_kv, lat, rope, scs, j, LW, LR, LS, SR)
            cp.commit_group()
        if ALL_SLOTS:
            cp.wait_group(0)
        return _idx_pair(idx_row, k_start + (NBUF - 1 if NBUF > 1 else 0) * BN, k_end, BN, LW, LS, SR)

    @gluon.jit
    def _occupancy_pad(PAD: gl.constexpr, NW: gl.constexpr):
        """PAD int32 words of shared memory (0: none), held by a store, so that fewer programs share an SM (the
        measurements of `ablate_launch`)."""
        if PAD > 0:
            FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
            pad = gl.allocate_shared_memory(gl.int32, [PAD], FLAT1)
            pad.slice(0, 32 * NW).store(gl.full([32 * NW], 0, gl.int32, gl.BlockedLayout([1], [32], [NW], [0])))

    @gluon.jit
    def _ring_step(KV, idx_row, nxt_w, nxt_s, i, k_start, k_end, N_ROWS, stride_kv, lat, rope, scs,
                   NBUF: gl.constexpr, BN: gl.constexpr, LW: gl.constexpr, LR: gl.constexpr, LS: gl.constexpr,
                   GATHER: gl.constexpr, SR: gl.constexpr):
        """The gather ring's step before tile i is computed, as the kernel and `_gathers_alone_kernel` take it: tile
        i's rows landed in slot i % NBUF and every warp past the barrier; returns the index tiles of the next gather
        (`_ring_start`'s two). GATHER False (compute alone) keeps the barriers and copies nothing."""
        if NBUF == 1:
            # one slot (1-8 heads on sm_90, the 99 KB class: more programs per SM instead): the last tile's reads are
            # done, then tile i is gathered and waited for
            _barrier()
            if GATHER:
                _gather(KV, nxt_w, nxt_s, N_ROWS, stride_kv, lat, rope, scs, 0, LW, LR, LS, SR)
                cp.commit_group()
            nxt_w, nxt_s = _idx_pair(idx_row, k_start + (i + 1) * BN, k_end, BN, LW, LS, SR)
            if GATHER:
                cp.wait_group(0)
            _barrier()
        else:
            # tile i has landed (every thread's copies, then the barrier, which also ends every warp's reads of the slot
            # refilled next and, the first time, orders q's stores before its loads)
            if GATHER:
                cp.wait_group(NBUF - 2)
            _barrier()
            if GATHER:
                _gather(KV, nxt_w, nxt_s, N_ROWS, stride_kv, lat, rope, scs, (i + NBUF - 1) % NBUF, LW, LR, LS, SR)
                cp.commit_group()
            nxt_w, nxt_s = _idx_pair(idx_row, k_start + (i + NBUF) * BN, k_end, BN, LW, LS, SR)
        return nxt_w, nxt_s

    @gluon.jit
    def _chunk(tile, c: gl.constexpr, CM: gl.constexpr):
        """Latent chunk c ([BN, 128] bytes) of a gathered tile: [BN, 512] in row order, or four [BN, 128]
        allocations, one a chunk (CM: the early refill's slot, `REFILLS`)."""
        if CM:
            return tile[c]
        else:
            return tile.slice(c * 128, 128, 1)

    @gluon.jit
    def _scores_chunk(kc, q_s, c: gl.constexpr, s_c, acc, zero, LK: gl.constexpr, DA: gl.constexpr,
                      DB: gl.constexpr, Q_TERMS: gl.constexpr, WIDEN: gl.constexpr = 0, WG: gl.constexpr = 0,
                      zero_wg=None):
        """acc + s_c * (K_c q_c^T) for latent chunk c: K_c straight from the tile's chunk kc (e4m3 bytes), q_c as its
        e4m3 terms (rows of q_s, already in `_k_logical`'s column order). WIDEN: `WIDENS` (chunk c < WIDEN widened by
        integer instructions, 2^-8 times K_c: s_c takes the 2^8). WG (`WGMMAS`): the product as wgmma, K_c from
        registers (DA then has the wgmma layout's parent, as zero_wg), q_c read by the tensor cores from q_s[c]."""
        CH: gl.constexpr = 128
        if WG:
            k = gl.convert_layout(_k_logical16(_widen(kc.load(LK), c < WIDEN)), DA, assert_trivial=True)
            s = warpgroup_mma(k, q_s.index(c).permute([1, 0]), zero_wg, use_acc=False)
            s = gl.convert_layout(s, zero.type.layout, assert_trivial=True)
            if c < WIDEN:
                s_c = s_c * 256.0
        elif Q_TERMS == 1:  # fp16 products: K widened once, q one fp16 term
            k = gl.convert_layout(_k_logical16(_widen(kc.load(LK), c < WIDEN)), DA, assert_trivial=True)
            s = mma_v2(k, q_s.index(0).slice(c * CH, CH, 1).permute([1, 0]).load(DB), zero)
            if c < WIDEN:
                s_c = s_c * 256.0
        else:
            k = gl.convert_layout(_k_logical(kc.load(LK)), DA, assert_trivial=True)
            k = k.to(gl.float8e4nv, bitcast=True)
            s = mma_v2(k, q_s.index(0).slice(c * CH, CH, 1).permute([1, 0]).load(DB), zero)
            s = mma_v2(k, q_s.index(1).slice(c * CH, CH, 1).permute([1, 0]).load(DB), s)
            if Q_TERMS == 3:
                s = mma_v2(k, q_s.index(2).slice(c * CH, CH, 1).permute([1, 0]).load(DB), s)
        return acc + s * s_c[:, None]

    @gluon.jit
    def _pv_chunk(vc, p, s_c, acc, LV: gl.constexpr, LVP: gl.constexpr, DA: gl.constexpr, P_TERMS: gl.constexpr,
                  WM: gl.constexpr, INT: gl.constexpr = False):
        """acc_c += V_c^T (P s_c)^T for a latent chunk vc, `P s_c` (the tile's P factor 2^e already in s_c) split
        into e4m3 terms, or one fp16 term (P_TERMS = 1; V widened to fp16 first, by integer instructions where INT:
        then acc_c holds 2^-8 times its value, which the output's scale takes back, `_out_scale`)."""
        if P_TERMS == 1:
            # the fp16 operand pairs two keys of one value row: the bytes are regrouped (LVP: key pairs innermost, a
            # register permutation) before they are widened, so that each conversion's pair is already an operand's
            v8 = gl.convert_layout(vc.load(LV), LVP, assert_trivial=True)
            v = gl.convert_layout(_v_logical(_widen(v8, INT), WM), DA, assert_trivial=True)
            acc = mma_v2(v, (p * s_c[:, None]).to(gl.float16), acc)
        else:
            v = gl.convert_layout(_v_logical(vc.load(LV), WM), DA, assert_trivial=True)
            v = v.to(gl.float8e4nv, bitcast=True)
            p0, p1, p2 = _e4m3_terms(p * s_c[:, None], P_TERMS)
            acc = mma_v2(v, p0, acc)
            acc = mma_v2(v, p1, acc)
            if P_TERMS == 3:
                acc = mma_v2(v, p2, acc)
        return acc

    @gluon.jit
    def _out_scale(inv_l, c: gl.constexpr, WIDEN: gl.constexpr):
        """The scale of accumulator c at the store: inv_l, times 2^8 where its V was widened by integer instructions
        (`_e4m3_f16_int`'s 2^-8; `WIDENS`)."""
        if c < WIDEN:
            return inv_l * 256.0
        else:
            return inv_l

    @gluon.jit
    def _store_chunk(O, PART, t, sp, H, stride_ot, stride_oh, acc, scale, c: gl.constexpr, SPLIT: gl.constexpr,
                     LO: gl.constexpr, WM: gl.constexpr):
        """acc_c [128 rows m, heads] * scale[head] -> O[t, h, 128 c + d] (or the split partial), rows back in memory
        order (`_d_order`)."""
        CH: gl.constexpr = 128
        HN: gl.constexpr = acc.shape[1]
        x = gl.convert_layout(_d_order(acc * scale[None, :], WM), LO)
        offs_d = gl.arange(0, CH, layout=gl.SliceLayout(1, LO))
        offs_h = gl.arange(0, HN, layout=gl.SliceLayout(0, LO))
        hm = (offs_h < H)[None, :]
        if not SPLIT:
            ptr = O + t.to(gl.int64) * stride_ot + offs_h[None, :] * stride_oh + c * CH + offs_d[:, None]
            gl.store(ptr, x.to(O.dtype.element_ty), mask=hm)
        else:
            n_t = gl.num_programs(0)
            rows = (sp * n_t + t).to(gl.int64) * H + offs_h  # mla._part_rows
            gl.store(PART + rows[None, :] * 512 + c * CH + offs_d[:, None], x, mask=hm)

    @gluon.jit
    def _debug_base(DBG, t, sp, HN: gl.constexpr):
        """Bytes of one program's debug record (the size is `debug_record_bytes`'s): 8 fp32 [32, HN] slots, K
        (logical) [32, 512], V^T (logical) [4, 128, 32], q's terms in q_s [3, HN, 512] and as computed [3, HN, 512]."""
        size: gl.constexpr = 8 * 32 * HN * 4 + 32 * 512 + 4 * 128 * 32 + 6 * HN * 512
        return DBG + (t * gl.num_programs(1) + sp).to(gl.int64) * size

    @gluon.jit
    def _debug_f32(DBG, t, sp, HN: gl.constexpr, slot: gl.constexpr, x, L: gl.constexpr):
        base = _debug_base(DBG, t, sp, HN).to(gl.pointer_type(gl.float32), bitcast=True) + slot * 32 * HN
        r = gl.arange(0, 32, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, HN, layout=gl.SliceLayout(0, L))
        gl.store(base + r[:, None] * HN + c[None, :], x)

    @gluon.jit
    def _debug_u8(ptr, x, R: gl.constexpr, C: gl.constexpr, STRIDE: gl.constexpr):
        LB: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0])
        y = gl.convert_layout(x, LB)
        r = gl.arange(0, R, layout=gl.SliceLayout(1, LB))
        c = gl.arange(0, C, layout=gl.SliceLayout(0, LB))
        gl.store(ptr + r[:, None] * STRIDE + c[None, :], y)

    @gluon.jit
    def _debug_dump(DBG, t, sp, t8, q_s, LK: gl.constexpr, LV: gl.constexpr, DA: gl.constexpr, DB: gl.constexpr,
                    MMA: gl.constexpr, LQ: gl.constexpr, HN: gl.constexpr, zero, Q_TERMS: gl.constexpr, s0, inv_sigma):
        """DEBUG: tile 0's operands and chunk products as the kernel sees them (`sparse_mla_fp8mma(debug=buffer)`,
        a uint8 buffer of `debug_record_bytes(H)` per program; read by `scripts/fp8mma_debug.py`)."""
        CH: gl.constexpr = 128
        base = _debug_base(DBG, t, sp, HN)
        for c in gl.static_range(4):
            k = gl.convert_layout(_k_logical(t8.slice(c * CH, CH, 1).load(LK)), DA, assert_trivial=True)
            _debug_u8(base + 8 * 32 * HN * 4 + c * CH, k, 32, CH, 512)
            kf = k.to(gl.float8e4nv, bitcast=True)
            sc = mma_v2(kf, q_s.index(0).slice(c * CH, CH, 1).permute([1, 0]).load(DB), zero)
            sc = mma_v2(kf, q_s.index(1).slice(c * CH, CH, 1).permute([1, 0]).load(DB), sc)
            if Q_TERMS == 3:
                sc = mma_v2(kf, q_s.index(2).slice(c * CH, CH, 1).permute([1, 0]).load(DB), sc)
            _debug_f32(DBG, t, sp, HN, c, sc, MMA)
            v = gl.convert_layout(_v_logical(t8.slice(c * CH, CH, 1).load(LV), 2), DA, assert_trivial=True)
            _debug_u8(base + 8 * 32 * HN * 4 + 32 * 512 + c * CH * 32, v, CH, 32, 32)
        _debug_f32(DBG, t, sp, HN, 4, zero + s0[:, None] + 0.0 * inv_sigma[None, :], MMA)
        for j in gl.static_range(3):
            if j < Q_TERMS:
                _debug_u8(base + 8 * 32 * HN * 4 + 32 * 512 + 4 * CH * 32 + j * HN * 512,
                          q_s.index(j).load(LQ).to(gl.uint8, bitcast=True), HN, 512, 512)

    @gluon.jit
    def _q_terms_store(qs, q_s, DBG, t, sp, HN: gl.constexpr, Q_TERMS: gl.constexpr, DEBUG: gl.constexpr):
        """q sigma (fp32, |.| <= 448) as its e4m3 terms into q_s, columns in the products' order (DEBUG: the terms as
        computed, in memory order, after the record's q_s copy)."""
        q0, q1, q2 = _e4m3_terms(qs, Q_TERMS)
        if DEBUG:
            qreg = _debug_base(DBG, t, sp, HN) + 8 * 32 * HN * 4 + 32 * 512 + 4 * 128 * 32 + 3 * HN * 512
            _debug_u8(qreg, q0.to(gl.uint8, bitcast=True), HN, 512, 512)
            _debug_u8(qreg + HN * 512, q1.to(gl.uint8, bitcast=True), HN, 512, 512)
            _debug_u8(qreg + 2 * HN * 512, q2.to(gl.uint8, bitcast=True), HN, 512, 512)
        q_s.index(0).store(_k_logical(q0))
        q_s.index(1).store(_k_logical(q1))
        if Q_TERMS == 3:
            q_s.index(2).store(_k_logical(q2))

    @gluon.jit
    def _load_q(Q, t, stride_qt, stride_qh, H, q_s, qr_s, DBG, sp, HN: gl.constexpr, LQ: gl.constexpr,
                HEADS: gl.constexpr, Q_TERMS: gl.constexpr, DEBUG: gl.constexpr, WG: gl.constexpr = 0):
        """Token t's q into shared memory: per head a power of two sigma with max |q sigma| <= 448, the latent part
        as its e4m3 terms or (Q_TERMS 1) one fp16 copy, columns in the products' order, the rope part as bf16; rows
        past H are zeros. WG (`WGMMAS`): the fp16 copy as four [HN, 128] chunk tiles, read by wgmma (the async proxy:
        fenced after the stores). Returns 1 / sigma per head (S = (K q_terms^T) / sigma)."""
        DN: gl.constexpr = 512
        DR: gl.constexpr = 64
        offs_qh = gl.arange(0, HN, layout=gl.SliceLayout(1, LQ))
        qm = (offs_qh < H)[:, None]
        q_row = Q + t.to(gl.int64) * stride_qt + offs_qh[:, None] * stride_qh
        offs_q = gl.arange(0, DN, layout=gl.SliceLayout(0, LQ))
        qn = gl.load(q_row + offs_q[None, :], mask=qm, other=0.0).to(gl.float32)
        sigma = _pow2(_exp_to_max(gl.max(gl.abs(qn), axis=1)))
        if WG:  # each chunk loaded again (from L1 / L2) in its 128 columns: the column order is chunk-local
            offs_c = gl.arange(0, 128, layout=gl.SliceLayout(0, LQ))
            for c in gl.static_range(4):
                qc = gl.load(q_row + c * 128 + offs_c[None, :], mask=qm, other=0.0).to(gl.float32)
                q_s.index(c).store(_k_logical16((qc * sigma[:, None]).to(gl.float16)))
        elif Q_TERMS == 1:  # bf16 q sigma is exact in fp16 down to 2^-17 (about 2^-26 of the head's largest)
            q_s.index(0).store(_k_logical16((qn * sigma[:, None]).to(gl.float16)))
        else:
            _q_terms_store(qn * sigma[:, None], q_s, DBG, t, sp, HN, Q_TERMS, DEBUG)
        offs_qr = gl.arange(0, DR, layout=gl.SliceLayout(0, LQ))
        qr_s.store(gl.load(q_row + DN + offs_qr[None, :], mask=qm, other=0.0).to(gl.bfloat16))
        if WG:
            fence_async_shared()
        return gl.convert_layout(1.0 / sigma, HEADS)

    @triton.constexpr_function
    def _out_layout(HN, WM):
        """The accumulator's own distribution after `_d_order`, with the registers enumerated value column first, so
        that converting to it moves no data. WM 2 (1-8 heads, 2 warps): thread (g, c) of warp w holds columns 64 w +
        8 g + 0..7 of heads 2c, 2c + 1 (its rows g + {0, 8} + {0, 32} + {0, 64} + 16 w, `_v_logical`): a store of one
        head's 8 columns is one 16-byte (bf16) or two (fp32) vector stores. WM 4: columns 32 w + 4 g + 0..3 of heads
        2c, 2c + 1 (+ 8 at 16 heads): 8-byte (bf16) stores."""
        if WM == 4:
            return gl.DistributedLinearLayout(reg_bases=[[1, 0], [2, 0], [0, 1]] + ([[0, 8]] if HN == 16 else []),
                                              lane_bases=[[0, 2], [0, 4], [4, 0], [8, 0], [16, 0]],
                                              warp_bases=[[32, 0], [64, 0]], block_bases=[], shape=[128, HN])
        return gl.DistributedLinearLayout(reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1]],
                                          lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                                          warp_bases=[[64, 0]], block_bases=[], shape=[128, HN])

    @gluon.jit
    def _store_mma(ptr_h, x, c: gl.constexpr, H, WM: gl.constexpr):
        """x [128 rows m, heads] (the accumulator's layout at 1-8 heads, rows in `_v_logical`'s order) ->
        ptr_h[h] + 128 c + d in memory order, from the registers it lives in (`_out_layout`: no shared-memory scratch
        beside the ring, which the balanced schedule needs, since it stores inside its loop)."""
        CH: gl.constexpr = 128
        HN: gl.constexpr = x.shape[1]
        LOD: gl.constexpr = _out_layout(HN, WM)
        y = gl.convert_layout(_d_order(x, WM), LOD, assert_trivial=True)
        d = gl.arange(0, CH, layout=gl.SliceLayout(1, LOD))
        h = gl.arange(0, HN, layout=gl.SliceLayout(0, LOD))
        hp = gl.convert_layout(ptr_h, gl.SliceLayout(0, LOD))
        gl.store(hp[None, :] + c * CH + d[:, None], y.to(ptr_h.dtype.element_ty), mask=(h < H)[None, :])

    @gluon.jit
    def _by_warp(keys, g0, g1, g2, g3, WM: gl.constexpr):
        """[BN, HN]: for each key of a tile (keys: its position) the factor g_w of the warp w whose S held it (key
        16 w + k + 16 WM r: `_tiles`), per head (g2, g3 only at WM 4)."""
        w = (keys // 16) % WM
        f = gl.where((w == 0)[:, None], g0[None, :], g1[None, :])
        if WM == 4:
            f = gl.where((w == 2)[:, None], g2[None, :], f)
            f = gl.where((w == 3)[:, None], g3[None, :], f)
        return f

    @gluon.jit
    def _tiles(KV, idx_row, k_start, k_end, n_tiles, N_ROWS, stride_kv, qk_scale,
               lat, lat8, rope, scs, sc_c, q_s, qr_s, p_s, m_s, nxt_w, nxt_s, nxt_k, inv_sigma, zero,
               m_i, l_acc, acc0, acc1, acc2, acc3, e_prev, DBG, t, sp,
               NBUF: gl.constexpr, BN: gl.constexpr, HN: gl.constexpr, Q_TERMS: gl.constexpr,
               P_TERMS: gl.constexpr, EARLY: gl.constexpr, COMPUTE_ALONE: gl.constexpr, DEBUG: gl.constexpr,
               MMA: gl.constexpr, KEYS: gl.constexpr, HEADS: gl.constexpr, PKEYS: gl.constexpr,
               DA: gl.constexpr, DB: gl.constexpr, DA8: gl.constexpr, DB8: gl.constexpr, DA16: gl.constexpr,
               DB16: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, LVP: gl.constexpr, LW: gl.constexpr,
               LR: gl.constexpr, LS: gl.constexpr, LQ: gl.constexpr, LC: gl.constexpr, IR: gl.constexpr,
               IC: gl.constexpr, WM: gl.constexpr, WIDEN: gl.constexpr, WG: gl.constexpr = 0,
               DAK: gl.constexpr = None, zero_wg=None, ROWS: gl.constexpr = 0, SR: gl.constexpr = False):
        """The kernel's loop: n_tiles tiles of the index list at idx_row from position k_start (the list ends at
        k_end), each gathered, scored and attended into the online-softmax state (m_i, l_acc, acc0-acc3, e_prev),
        which it returns with the index tiles read ahead (nxt_w, nxt_s: `_ring_step`'s; nxt_k). The balanced
        schedule passes the whole index array as one list (`balanced_mode`: rows of top-k a whole number of tiles,
        back to back), so that the read-ahead and early refill of a piece's last tile fetch the next token's first
        tile."""
        CH: gl.constexpr = 128
        for i in range(n_tiles):
            k_n = k_start + (i + 1) * BN  # the tile after this one (the early refill's and the key ids' next)
            if EARLY:
                # tile i has landed (every thread's copies, then the barrier, which also ends every warp's reads of
                # the last tile's P^T and maxima)
                cp.wait_group(0)
                _barrier()
            else:
                nxt_w, nxt_s = _ring_step(KV, idx_row, nxt_w, nxt_s, i, k_start, k_end, N_ROWS, stride_kv, lat, rope,
                                          scs, NBUF, BN, LW, LR, LS, not COMPUTE_ALONE, SR)
            slot = i % NBUF
            valid = (nxt_k >= 0) & (nxt_k < N_ROWS)
            nxt_k = _tile_idx(idx_row, k_n, k_end, BN, KEYS)
            t8 = lat8 if EARLY else lat8.index(slot)
            if DEBUG:  # the e4m3 builds only (the launcher refuses debug with fp16 products)
                if i == 0:
                    _debug_dump(DBG, t, sp, t8, q_s, LK, LV, DA8, DB8, MMA, LQ, HN, zero, Q_TERMS,
                                _scale(scs, sc_c, slot, 0, MMA, SR), inv_sigma)
            s = zero
            if WG == 2:  # each chunk's wgmma in flight while the next chunk's K is loaded and widened
                k = gl.convert_layout(_k_logical16(_widen(_chunk(t8, 0, EARLY).load(LK), 0 < WIDEN)), DAK,
                                      assert_trivial=True)
                pend = warpgroup_mma(k, q_s.index(0).permute([1, 0]), zero_wg, use_acc=False, is_async=True)
                for c in gl.static_range(1, 5):
                    if c < 4:
                        k_c = gl.convert_layout(_k_logical16(_widen(_chunk(t8, c, EARLY).load(LK), c < WIDEN)), DAK,
                                                assert_trivial=True)
                        nxt = warpgroup_mma(k_c, q_s.index(c).permute([1, 0]), zero_wg, use_acc=False, is_async=True)
                        pend, k = warpgroup_mma_wait(1, deps=[pend, k])  # chunk c - 1's product done
                    else:
                        pend, k = warpgroup_mma_wait(0, deps=[pend, k])
                    s_c = _scale(scs, sc_c, slot, c - 1, MMA, SR)
                    if c - 1 < WIDEN:
                        s_c = s_c * 256.0
                    s = s + gl.convert_layout(pend, MMA, assert_trivial=True) * s_c[:, None]
                    if c < 4:
                        pend = nxt
                        k = k_c
            else:
                for c in gl.static_range(4):
                    s = _scores_chunk(_chunk(t8, c, EARLY), q_s, c, _scale(scs, sc_c, slot, c, MMA, SR), s, zero, LK,
                                      DAK if WG else DA, DB, Q_TERMS, WIDEN, WG, zero_wg)
            if WG:
                s = gl.convert_layout(warpgroup_mma(
                    rope.index(slot).load(DAK), qr_s.permute([1, 0]),
                    gl.convert_layout(s * inv_sigma[None, :], zero_wg.type.layout, assert_trivial=True)), MMA,
                    assert_trivial=True)
            else:
                s = mma_v2(rope.index(slot).load(DA16), qr_s.permute([1, 0]).load(DB16), s * inv_sigma[None, :])
            s = gl.where(valid[:, None], s * qk_scale, float("-inf"))  # log2 domain

            # P against each warp's own max of its keys (no cross-warp reduction here): the maxima travel with P^T
            # through shared memory, and P is brought to the common max after the barrier (g0-g3 below)
            s4 = gl.reshape(s, [BN // (16 * WM), WM, 16, HN])  # (m16 tile of the warp, its warp, its keys, heads)
            mu3 = gl.max(gl.max(s4, axis=2), axis=0)
            p = gl.convert_layout(gl.reshape(
                gl.exp2(s4 - gl.where(mu3 == float("-inf"), 0.0, mu3)[None, :, None, :]), [BN, HN]), MMA,
                assert_trivial=True)
            m_s.store(gl.reshape(mu3, [WM * HN]))
            p_s.store(gl.permute(p, [1, 0]))
            # one P factor 2^e per tile for the four chunks; the accumulators move to it (and to the new max) only
            # when either changed
            ps0 = _scale(scs, sc_c, slot, 0, DB, SR)
            ps1 = _scale(scs, sc_c, slot, 1, DB, SR)
            ps2 = _scale(scs, sc_c, slot, 2, DB, SR)
            ps3 = _scale(scs, sc_c, slot, 3, DB, SR)
            # e is in [-120, 126] for any row scale; e - e_prev stays in `_pow2`'s range while consecutive tiles'
            # largest scales are within 2^+-120 of each other (vLLM's are amax / 448 of bf16 rows)
            e = _exp_to_max(gl.max(gl.maximum(gl.maximum(ps0, ps1), gl.maximum(ps2, ps3)), axis=0))
            _barrier()  # P^T and the maxima are read after every warp's are in; rewritten after the next tile's first
            if EARLY:  # the next tile's row ids (loaded here, used behind the first P V chunk: fewer registers in S)
                idx_r = _tile_idx(idx_row, k_n, k_end, BN, IR)
                idx_s = _tile_idx(idx_row, k_n, k_end, BN, gl.SliceLayout(1 if SR else 0, LS))
                idx_c = _tile_idx(idx_row, k_n, k_end, BN, IC)
            mw0 = m_s.slice(0, HN).load(HEADS)
            mw1 = m_s.slice(HN, HN).load(HEADS)
            m_new = gl.maximum(m_i, gl.maximum(mw0, mw1))
            if WM == 4:
                mw2 = m_s.slice(2 * HN, HN).load(HEADS)
                mw3 = m_s.slice(3 * HN, HN).load(HEADS)
                m_new = gl.maximum(m_new, gl.maximum(mw2, mw3))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # heads with no key yet: keep exp2 finite
            alpha = gl.exp2(m_i - m_use)
            m_i = m_new
            # each warp's P to the common max (<= 1; a warp without a valid key has P = 0 and factor 0)
            g0 = gl.where(mw0 == float("-inf"), 0.0, gl.exp2(mw0 - m_use))
            g1 = gl.where(mw1 == float("-inf"), 0.0, gl.exp2(mw1 - m_use))
            g2 = g1
            g3 = g1
            if WM == 4:
                g2 = gl.where(mw2 == float("-inf"), 0.0, gl.exp2(mw2 - m_use))
                g3 = gl.where(mw3 == float("-inf"), 0.0, gl.exp2(mw3 - m_use))
            p = p * _by_warp(gl.arange(0, BN, layout=KEYS), g0, g1, g2, g3, WM)
            if DEBUG:
                if i == 0:
                    _debug_f32(DBG, t, sp, HN, 5, s, MMA)
                    _debug_f32(DBG, t, sp, HN, 6, p, MMA)
            f = alpha * _pow2(e - e_prev)
            e_prev = e
            if gl.max(gl.abs(f - 1.0) + gl.abs(alpha - 1.0), axis=0) > 0.0:
                acc0 = acc0 * f[None, :]
                acc1 = acc1 * f[None, :]
                acc2 = acc2 * f[None, :]
                acc3 = acc3 * f[None, :]
                l_acc = l_acc * alpha[None, :]
            l_acc = l_acc + p
            PH: gl.constexpr = gl.SliceLayout(0, DB)
            pb = p_s.permute([1, 0]).load(DB) * _by_warp(
                gl.arange(0, BN, layout=PKEYS), gl.convert_layout(g0, PH), gl.convert_layout(g1, PH),
                gl.convert_layout(g2, PH), gl.convert_layout(g3, PH), WM)
            fe = _pow2(e)
            # (early refill: behind each chunk's product the next tile's copy of that chunk, `REFILL_ROWS`)
            acc0 = _pv_chunk(_chunk(t8, 0, EARLY), pb, ps0 * fe, acc0, LV, LVP, DA, P_TERMS, WM,
                             0 < WIDEN)
            if EARLY:  # S has read the rope part and the scales (ps0-ps3 above) before the barrier
                _refill_tail(KV, idx_r, idx_s, N_ROWS, stride_kv, rope, scs, LR, LS, SR)
                _refill_chunk(KV, idx_c, N_ROWS, stride_kv, lat, 0, LC, ROWS)
            acc1 = _pv_chunk(_chunk(t8, 1, EARLY), pb, ps1 * fe, acc1, LV, LVP, DA, P_TERMS, WM,
                             1 < WIDEN)
            if EARLY:
                _refill_chunk(KV, idx_c, N_ROWS, stride_kv, lat, 1, LC, ROWS)
            acc2 = _pv_chunk(_chunk(t8, 2, EARLY), pb, ps2 * fe, acc2, LV, LVP, DA, P_TERMS, WM,
                             2 < WIDEN)
            if EARLY:
                _refill_chunk(KV, idx_c, N_ROWS, stride_kv, lat, 2, LC, ROWS)
            acc3 = _pv_chunk(_chunk(t8, 3, EARLY), pb, ps3 * fe, acc3, LV, LVP, DA, P_TERMS, WM,
                             3 < WIDEN)
            if EARLY:
                _refill_chunk(KV, idx_c, N_ROWS, stride_kv, lat, 3, LC, ROWS)
                cp.commit_group()
        return m_i, l_acc, acc0, acc1, acc2, acc3, e_prev, nxt_w, nxt_s, nxt_k

    @gluon.jit
    def _sparse_mla_fp8mma_kernel(
        Q, KV, IDX, O, LSE, PART,
        stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
        H, TOPK, N_ROWS, KEYS_PER_SPLIT, N_TOK, qk_scale,
        SPLIT: gl.constexpr, G: gl.constexpr, NBUF: gl.constexpr, Q_TERMS: gl.constexpr, P_TERMS: gl.constexpr,
        BN: gl.constexpr, TPR: gl.constexpr, REFILL: gl.constexpr = 0, DBG=None, DEBUG: gl.constexpr = 0,
        COMPUTE_ALONE: gl.constexpr = False, PAD: gl.constexpr = 0, BALANCED: gl.constexpr = False,
        WM: gl.constexpr = 2, WIDEN: gl.constexpr = 0, WG: gl.constexpr = 0, PDL: gl.constexpr = 0,
        ROWS: gl.constexpr = 0, GSCALES: gl.constexpr = 0,
    ):
        """One program: token t, split sp of its top-k list, all heads (module docstring). REFILL: `REFILLS`.
        COMPUTE_ALONE (a measurement, wrong outputs): every tile read from the ring slots gathered before the loop;
        PAD: `_occupancy_pad` (`ablate_launch`). BALANCED (`SCHEDS`' 1, with the early refill at one split only): a
        program runs global tiles [p n / P, (p + 1) n / P) of the N_TOK tokens' n tiles (`balanced_pieces`), one piece
        (token) at a time through the tile loop (`_tiles`), storing each piece after it, whole into O / LSE or, cut
        at a program boundary, as a partial into PART (`_merge_pieces_kernel`'s layout). WM (`Config.key_warps`):
        warps along the keys and value rows, 2 (G head groups of 8 heads side by side, 2 G warps) or 4 (all 8 G heads
        in one group of 4 warps, 64-key tiles, fp16 products: each K and V byte widened by one warp only). WIDEN:
        `WIDENS` (latent chunks widened by integer instructions; their accumulators' 2^-8 undone by `_out_scale`).
        PDL (launches whose partials are merged, on sm_90+; `common.pdl`): let the merge launch once every program
        has triggered, first thing (1) or after its tile loop (2; `PDL_TRIGGER`); 0 (or False): no trigger. ROWS:
        the early refill's copies of a latent chunk (`REFILL_ROWS`); GSCALES: the whole-tile gathers' scale copies
        (`GATHER_SCALES`)."""
        gl.static_assert(PDL == 0 or PDL == 1 or PDL == 2, "PDL: 0, or where the trigger sits (PDL_TRIGGERS)")
        if PDL == 1:
            tl.extra.cuda.gdc_launch_dependents()
        CH: gl.constexpr = 128
        DN: gl.constexpr = 512
        DR: gl.constexpr = 64
        HN: gl.constexpr = 8 * G
        GN: gl.constexpr = G if WM == 2 else 1  # warps along the heads
        NW: gl.constexpr = WM * GN
        F16: gl.constexpr = Q_TERMS == 1  # fp16 products (K and V widened once) instead of e4m3 ones
        gl.static_assert(WM == 2 or (WM == 4 and BN == 64 and F16 and not DEBUG),
                         "four warps along the keys take 64-key tiles and fp16 products")
        gl.static_assert(not WG or WM == 4, "S as wgmma takes four key warps (one warpgroup)")
        # S^T [keys, heads] and O^T [value rows, heads]: warps (head group, key warp) -> heads along N, key warps
        # along M; key 16 WM r + 16 w + k of a tile is key warp w's (at 64 keys and WM 2 each warp holds two m16
        # tiles, r = 0, 1)
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WM, GN], instr_shape=[16, 8])
        DA8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
        DB8: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4)
        DA16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        DB16: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        KEYS: gl.constexpr = gl.SliceLayout(1, MMA)  # [BN] per key of S^T
        HEADS: gl.constexpr = gl.SliceLayout(0, MMA)  # [HN] per head
        DA: gl.constexpr = DA16 if F16 else DA8  # the latent products' operands
        DB: gl.constexpr = DB16 if F16 else DB8
        PKEYS: gl.constexpr = gl.SliceLayout(1, DB)  # [BN] per key of P^T
        # S as wgmma (`WGMMAS`): the warpgroup's accumulator for [64 keys, HN heads] holds the same elements in each
        # thread as MMA's (warp w keys 16 w..16 w + 15), and its register A operand K's; the conversions between
        # them are asserted trivial
        MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HN, 16])
        DAK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_S, k_width=2)
        # physical loads of a chunk whose logical view (`_k_logical`, `_v_logical`) is the operand layout: the K tile
        # [BN, 128] 32 contiguous bytes of rows g, g + 8 per thread; the V tile [BN, 128] 8 bytes of 8 keys (keys
        # 4c + {0..3, 16..19} for the k32 e4m3 product, 2c + {0, 1, 8, 9, 16, 17, 24, 25} for the k16 fp16 one);
        # at 64 keys the same again for keys 32..63 (RB: one more register basis in each; in the K tile only at WM 2,
        # where a warp's S holds two m16 tiles; at WM 4 the other two warps hold them, WB)
        RB: gl.constexpr = [[32, 0]] if BN == 64 else []
        RBK: gl.constexpr = RB if WM == 2 else []
        if WM == 4:
            WB: gl.constexpr = [[16, 0], [32, 0]]
            WBV: gl.constexpr = [[0, 32], [0, 64]]  # warp w: the chunk's value columns 32 w..32 w + 31
            VC: gl.constexpr = [[0, 1], [0, 2]]  # a thread's 4 contiguous value columns (`_v_logical`), in registers
            VL: gl.constexpr = [[0, 4], [0, 8], [0, 16]]  # ... and the lane's g
        else:
            WB: gl.constexpr = [[0, 0], [16, 0]] if G == 2 else [[16, 0]]
            WBV: gl.constexpr = [[0, 0], [0, 64]] if G == 2 else [[0, 64]]
            VC: gl.constexpr = [[0, 1], [0, 2], [0, 4]]  # 8 contiguous value columns
            VL: gl.constexpr = [[0, 8], [0, 16], [0, 32]]
        LK: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0], [0, 16]] + RBK,
            lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]], warp_bases=WB, block_bases=[], shape=[BN, CH])
        VK: gl.constexpr = ([[1, 0], [8, 0], [16, 0], [2, 0], [4, 0]] if F16 else
                            [[1, 0], [2, 0], [16, 0], [4, 0], [8, 0]])  # key bases: 3 in registers, 2 in lanes
        LV: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=VC + [VK[0], VK[1], VK[2]] + RB,
            lane_bases=[VK[3], VK[4]] + VL, warp_bases=WBV, block_bases=[], shape=[BN, CH])
        LVP: gl.constexpr = gl.DistributedLinearLayout(  # LV with keys 2c, 2c + 1 in neighbouring registers
            reg_bases=[VK[0]] + VC + [VK[1], VK[2]] + RB,
            lane_bases=[VK[3], VK[4]] + VL, warp_bases=WBV, block_bases=[], shape=[BN, CH])
        # [128, HN] output, 8 rows per thread, the warps along the rows (no element is stored twice)
        LO: gl.constexpr = gl.BlockedLayout([8, 1], [4, 8], [NW, 1], [0, 1])
        # the gather (`_gather`): latent words, rope and scales of a row over `Config.row_threads` threads
        LW: gl.constexpr = _gather_layouts(NW, TPR)[0]
        LR: gl.constexpr = _gather_layouts(NW, TPR)[1]
        # the scales land as [key, chunk] (SR): in the early refill (`REFILLS`; the launcher takes it for one slot at
        # 1-8 heads only) where ROWS is 2 (`REFILL_ROWS`) and each thread has one row of the tile, in the whole-tile
        # gathers where GSCALES is 1 (`GATHER_SCALES`); an early build's compute alone gathers whole tiles, as its
        # gathers alone and the same build with refill 0 do (`ablate_launch`)
        EARLY: gl.constexpr = REFILL == 1 and not COMPUTE_ALONE
        SR: gl.constexpr = (ROWS == 2 and BN == 32 * NW) if EARLY else GSCALES == 1
        LS: gl.constexpr = _scale_rows_layout(NW, BN) if SR else _gather_layouts(NW, TPR)[2]
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])  # q rows
        # the early refill's next index tiles in the layouts of its rope copies (IR) and of its latent chunk copies (IC)
        LC: gl.constexpr = _refill_layout(NW, ROWS)
        IR: gl.constexpr = gl.SliceLayout(1, LR)
        IC: gl.constexpr = gl.SliceLayout(1, LC)

        # shared memory: 16-byte units XOR-swizzled by row, so the operand loads of 8 rows hit 8 bank groups
        SW8: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
        SW32: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])  # SW8 in words
        SW16: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        if EARLY:
            # the one slot chunk by chunk (four [BN, 128]-byte allocations, the same swizzle inside a chunk): the
            # compiler's shared-memory barrier analysis then sees each chunk's refill apart from the other chunks' reads
            lat = (gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32),
                   gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32),
                   gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32),
                   gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32))
            lat8 = (_as(lat[0], gl.uint8, [BN, CH], SW8), _as(lat[1], gl.uint8, [BN, CH], SW8),
                    _as(lat[2], gl.uint8, [BN, CH], SW8), _as(lat[3], gl.uint8, [BN, CH], SW8))
        else:
            lat = gl.allocate_shared_memory(gl.int32, [NBUF, BN, CH], SW32)
            lat8 = _as(lat, gl.uint8, [NBUF, BN, DN], SW8)  # the same bytes: SW32 is SW8 in 4-byte units
        rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, DR], SW16)
        FLAT1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        FLAT2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        if SR:
            scs = gl.allocate_shared_memory(gl.float32, [NBUF, BN, 4], FLAT2)  # the rows' scales as [slot, key, chunk]
            sc_c = scs  # (not read: `_scale` reads scs)
        else:
            scs = gl.allocate_shared_memory(gl.float32, [NBUF, 4, BN], FLAT2)  # the rows' scales as [slot, chunk, key]
            sc_c = _as(scs, gl.float32, [NBUF * 4, BN], FLAT1)  # the same bytes: chunk c of slot s at 4 s + c
        # q's e4m3 terms (or its fp16 copy), columns in the products' order
        if WG:  # the wgmma's B operand layout (128-byte swizzle), one tile a chunk
            SHQ: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            q_s = gl.allocate_shared_memory(gl.float16, [4, HN, CH], SHQ)
            qr_s = gl.allocate_shared_memory(gl.bfloat16, [HN, DR], SHQ)
        else:
            if F16:
                q_s = gl.allocate_shared_memory(gl.float16, [1, HN, DN], SW16)
            else:
                q_s = gl.allocate_shared_memory(gl.float8e4nv, [Q_TERMS, HN, DN], SW8)
            qr_s = gl.allocate_shared_memory(gl.bfloat16, [HN, DR], SW16)
        # P^T passes between the warps (each needs all the tile's keys) as [heads, keys], 16-byte units swizzled by
        # head: the B-operand loads of 4 keys of one head are then conflict-free
        SWP: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        p_s = gl.allocate_shared_memory(gl.float32, [HN, BN], SWP)
        m_s = gl.allocate_shared_memory(gl.float32, [WM * HN], FLAT1)  # each key warp's maxima, warp 0 first

        _occupancy_pad(PAD, NW)
        if BALANCED:  # global tiles [g0, g1) of the tokens' tile list, token-major (`balanced_pieces`)
            NT = gl.cdiv(TOPK, BN)  # tiles a token
            n_prog = gl.num_programs(0)
            total = N_TOK.to(gl.int64) * NT
            g0 = gl.program_id(0) * total // n_prog
            g1 = (gl.program_id(0) + 1) * total // n_prog
            t = (g0 // NT).to(gl.int32)
            sp = 0
            j0 = (g0 - t * NT).to(gl.int32)  # the run's first tile in its token (> 0: a tail piece)
            # the index rows as one list (`balanced_mode`: TOPK = NT * BN, rows back to back): the run's tiles are
            # positions [g0 BN, g1 BN) of it
            k_start = g0.to(gl.int32) * BN
            k_end = g1.to(gl.int32) * BN
            n_tiles = NT - j0  # (the one-a-token code after the piece loop's return is traced too, never run)
            t_last = ((g1 - 1) // NT).to(gl.int32)
            j_last = (g1 - t_last * NT).to(gl.int32)  # the end tile of the run's last piece (< NT: a head piece)
        else:
            t = gl.program_id(0)
            sp = gl.program_id(1)
            k_start = sp * KEYS_PER_SPLIT
            k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
            n_tiles = gl.cdiv(k_end - k_start, BN)
        idx_row = IDX if BALANCED else IDX + t.to(gl.int64) * stride_it
        # index tiles are read one iteration before they are used: the next gather's, and the next tile's key ids
        # (compute alone: every slot gathered here, and the loop gathers nothing)
        nxt_w, nxt_s = _ring_start(KV, idx_row, k_start, k_end, N_ROWS, stride_kv, lat, rope, scs, NBUF, BN, LW, LR,
                                   LS, COMPUTE_ALONE, SR)
        nxt_k = _tile_idx(idx_row, k_start, k_end, BN, KEYS)
        if EARLY:  # tile 0 whole; from then on the slot is refilled piece by piece inside the loop
            idx_c = _tile_idx(idx_row, k_start, k_end, BN, IC)
            _refill_tail(KV, _tile_idx(idx_row, k_start, k_end, BN, IR),
                         _tile_idx(idx_row, k_start, k_end, BN, gl.SliceLayout(1 if SR else 0, LS)), N_ROWS,
                         stride_kv, rope, scs, LR, LS, SR)
            for c in gl.static_range(4):
                _refill_chunk(KV, idx_c, N_ROWS, stride_kv, lat, c, LC, ROWS)
            cp.commit_group()

        zero = gl.full([BN, HN], 0.0, gl.float32, MMA)
        zero_wg = gl.full([BN, HN], 0.0, gl.float32, MMA_S) if WG else zero
        if BALANCED:
            for tk in range(t, t_last + 1):  # the run's pieces, one token each
                a = gl.where(tk == t, j0, 0)
                b = gl.where(tk == t_last, j_last, NT)
                inv_sigma = _load_q(Q, tk, stride_qt, stride_qh, H, q_s, qr_s, DBG, sp, HN, LQ, HEADS, Q_TERMS, DEBUG,
                                    WG)
                m_i, l_acc, acc0, acc1, acc2, acc3, e_prev, nxt_w, nxt_s, nxt_k = _tiles(
                    KV, IDX, (tk * NT + a) * BN, k_end, b - a, N_ROWS, stride_kv, qk_scale, lat, lat8, rope, scs,
                    sc_c, q_s, qr_s, p_s, m_s, nxt_w, nxt_s, nxt_k, inv_sigma, zero,
                    gl.full([HN], float("-inf"), gl.float32, HEADS), gl.full([BN, HN], 0.0, gl.float32, MMA),
                    gl.full([CH, HN], 0.0, gl.float32, MMA), gl.full([CH, HN], 0.0, gl.float32, MMA),
                    gl.full([CH, HN], 0.0, gl.float32, MMA), gl.full([CH, HN], 0.0, gl.float32, MMA),
                    gl.to_tensor(0), DBG, tk, sp,
                    NBUF, BN, HN, Q_TERMS, P_TERMS, EARLY, COMPUTE_ALONE, DEBUG, MMA, KEYS, HEADS, PKEYS, DA, DB,
                    DA8, DB8, DA16, DB16, LK, LV, LVP, LW, LR, LS, LQ, LC, IR, IC, WM, WIDEN, WG, DAK, zero_wg,
                    ROWS, SR)
                # the token done (b = NT, a = 0), or this program's piece of it: the tail (slot 1) of boundary
                # p - 1 (a > 0) or the head (slot 0) of boundary p
                l_i = gl.sum(l_acc, axis=0)
                has_key = l_i > 0
                inv_l = gl.where(has_key, 1.0 / gl.where(has_key, l_i, 1.0), 0.0) * _pow2(-e_prev)
                lse2 = gl.where(has_key, m_i + gl.log2(gl.where(has_key, l_i, 1.0)), float("-inf"))
                offs_h = gl.arange(0, HN, layout=HEADS)
                if (a == 0) & (b == NT):
                    o_h = O + tk.to(gl.int64) * stride_ot + offs_h * stride_oh
                    _store_mma(o_h, acc0 * _out_scale(inv_l, 0, WIDEN)[None, :], 0, H, WM)
                    _store_mma(o_h, acc1 * _out_scale(inv_l, 1, WIDEN)[None, :], 1, H, WM)
                    _store_mma(o_h, acc2 * _out_scale(inv_l, 2, WIDEN)[None, :], 2, H, WM)
                    _store_mma(o_h, acc3 * _out_scale(inv_l, 3, WIDEN)[None, :], 3, H, WM)
                    gl.store(LSE + tk.to(gl.int64) * stride_lt + offs_h, lse2 * 0.6931471805599453, mask=offs_h < H)
                else:
                    ts = (a > 0).to(gl.int32)
                    rows = ((ts * n_prog + gl.program_id(0) - ts) * H).to(gl.int64) + offs_h
                    p_h = PART + rows * DN
                    _store_mma(p_h, acc0 * _out_scale(inv_l, 0, WIDEN)[None, :], 0, H, WM)
                    _store_mma(p_h, acc1 * _out_scale(inv_l, 1, WIDEN)[None, :], 1, H, WM)
                    _store_mma(p_h, acc2 * _out_scale(inv_l, 2, WIDEN)[None, :], 2, H, WM)
                    _store_mma(p_h, acc3 * _out_scale(inv_l, 3, WIDEN)[None, :], 3, H, WM)
                    gl.store(PART + 2 * n_prog.to(gl.int64) * H * DN + rows, lse2, mask=offs_h < H)
            if PDL == 2:
                tl.extra.cuda.gdc_launch_dependents()
            cp.wait_group(0)
            return
        inv_sigma = _load_q(Q, t, stride_qt, stride_qh, H, q_s, qr_s, DBG, sp, HN, LQ, HEADS, Q_TERMS, DEBUG, WG)

        m_i = gl.full([HN], float("-inf"), gl.float32, HEADS)
        l_acc = gl.full([BN, HN], 0.0, gl.float32, MMA)  # row sums, reduced over the keys once after the loop
        acc0 = gl.full([CH, HN], 0.0, gl.float32, MMA)
        acc1 = gl.full([CH, HN], 0.0, gl.float32, MMA)
        acc2 = gl.full([CH, HN], 0.0, gl.float32, MMA)
        acc3 = gl.full([CH, HN], 0.0, gl.float32, MMA)
        e_prev = 0  # exponent of the P factor the accumulators hold (2^e: the tile's largest scale brought to 448)
        m_i, l_acc, acc0, acc1, acc2, acc3, e_prev, nxt_w, nxt_s, nxt_k = _tiles(
            KV, idx_row, k_start, k_end, n_tiles, N_ROWS, stride_kv, qk_scale, lat, lat8, rope, scs,
            sc_c, q_s, qr_s, p_s, m_s, nxt_w, nxt_s, nxt_k, inv_sigma, zero, m_i, l_acc, acc0, acc1, acc2, acc3, e_prev,
            DBG, t, sp, NBUF, BN, HN, Q_TERMS, P_TERMS, EARLY, COMPUTE_ALONE, DEBUG, MMA, KEYS, HEADS, PKEYS, DA, DB,
            DA8, DB8, DA16, DB16, LK, LV, LVP, LW, LR, LS, LQ, LC, IR, IC, WM, WIDEN, WG, DAK, zero_wg, ROWS, SR)
        if PDL == 2:
            tl.extra.cuda.gdc_launch_dependents()
        cp.wait_group(0)
        l_i = gl.sum(l_acc, axis=0)
        has_key = l_i > 0
        inv_l = gl.where(has_key, 1.0 / gl.where(has_key, l_i, 1.0), 0.0)
        inv_l = inv_l * _pow2(-e_prev)
        _store_chunk(O, PART, t, sp, H, stride_ot, stride_oh, acc0, _out_scale(inv_l, 0, WIDEN), 0, SPLIT,
                     LO, WM)
        _store_chunk(O, PART, t, sp, H, stride_ot, stride_oh, acc1, _out_scale(inv_l, 1, WIDEN), 1, SPLIT,
                     LO, WM)
        _store_chunk(O, PART, t, sp, H, stride_ot, stride_oh, acc2, _out_scale(inv_l, 2, WIDEN), 2, SPLIT,
                     LO, WM)
        _store_chunk(O, PART, t, sp, H, stride_ot, stride_oh, acc3, _out_scale(inv_l, 3, WIDEN), 3, SPLIT,
                     LO, WM)
        lse2 = gl.where(has_key, m_i + gl.log2(gl.where(has_key, l_i, 1.0)), float("-inf"))
        offs_h = gl.arange(0, HN, layout=HEADS)
        if not SPLIT:
            gl.store(LSE + t * stride_lt + offs_h, lse2 * 0.6931471805599453, mask=offs_h < H)
        else:
            n_t = gl.num_programs(0)
            rows = (sp * n_t + t).to(gl.int64) * H + offs_h
            gl.store(PART + gl.num_programs(1).to(gl.int64) * n_t * H * DN + rows, lse2, mask=offs_h < H)


if HAVE_GLUON:
    @gluon.jit
    def _gathers_alone_kernel(KV, IDX, stride_kv, stride_it, TOPK, N_ROWS, KEYS_PER_SPLIT, NW: gl.constexpr,
                              NBUF: gl.constexpr, BN: gl.constexpr, TPR: gl.constexpr, PAD: gl.constexpr,
                              PDL: gl.constexpr = 0, GSCALES: gl.constexpr = 0):
        """A measurement (`ablate_launch`): the kernel's gathers with nothing computed, on its grid, ring and
        `_ring_step` schedule, its NW warps' share of each row, its scale copies (GSCALES: `GATHER_SCALES`); PAD int32
        words of shared memory (0: none, else a power of two) hold the programs per SM at the whole kernel's; PDL as
        the kernel's (its merge follows): the trigger first (1) or after the loop (2)."""
        gl.static_assert(PDL == 0 or PDL == 1 or PDL == 2, "PDL: 0, or where the trigger sits (PDL_TRIGGERS)")
        if PDL == 1:
            tl.extra.cuda.gdc_launch_dependents()
        CH: gl.constexpr = 128
        LW: gl.constexpr = _gather_layouts(NW, TPR)[0]
        LR: gl.constexpr = _gather_layouts(NW, TPR)[1]
        SR: gl.constexpr = GSCALES == 1
        LS: gl.constexpr = _scale_rows_layout(NW, BN) if SR else _gather_layouts(NW, TPR)[2]
        SW32: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        SW16: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        lat = gl.allocate_shared_memory(gl.int32, [NBUF, BN, CH], SW32)
        rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, 64], SW16)
        FLAT2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        if SR:
            scs = gl.allocate_shared_memory(gl.float32, [NBUF, BN, 4], FLAT2)
        else:
            scs = gl.allocate_shared_memory(gl.float32, [NBUF, 4, BN], FLAT2)
        _occupancy_pad(PAD, NW)
        t = gl.program_id(0)
        sp = gl.program_id(1)
        k_start = sp * KEYS_PER_SPLIT
        k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
        idx_row = IDX + t.to(gl.int64) * stride_it
        nxt_w, nxt_s = _ring_start(KV, idx_row, k_start, k_end, N_ROWS, stride_kv, lat, rope, scs, NBUF, BN, LW, LR,
                                   LS, False, SR)
        for i in range(gl.cdiv(k_end - k_start, BN)):
            nxt_w, nxt_s = _ring_step(KV, idx_row, nxt_w, nxt_s, i, k_start, k_end, N_ROWS, stride_kv, lat, rope, scs,
                                      NBUF, BN, LW, LR, LS, True, SR)
        if PDL == 2:
            tl.extra.cuda.gdc_launch_dependents()
        cp.wait_group(0)


    @gluon.jit
    def _refill_alone_kernel(KV, IDX, stride_kv, stride_it, TOPK, N_ROWS, KEYS_PER_SPLIT, NW: gl.constexpr,
                             BN: gl.constexpr, TPR: gl.constexpr, ROWS: gl.constexpr, PAD: gl.constexpr):
        """A measurement (`ablate_launch`'s "refill"): the early refill's own copies (`REFILLS` 1, one ring slot) with
        nothing computed, on the kernel's grid: each tile waited for, then the next one copied into the slot as
        `_tiles` copies it (rope and scales, then the four latent chunks, each behind its barrier), in `REFILL_ROWS`
        mode ROWS; PAD as `_gathers_alone_kernel`'s. The layouts and allocations are the kernel's for that mode."""
        CH: gl.constexpr = 128
        SR: gl.constexpr = ROWS == 2 and BN == 32 * NW
        LR: gl.constexpr = _gather_layouts(NW, TPR)[1]
        LS: gl.constexpr = _scale_rows_layout(NW, BN) if SR else _gather_layouts(NW, TPR)[2]
        LC: gl.constexpr = _refill_layout(NW, ROWS)
        IR: gl.constexpr = gl.SliceLayout(1, LR)
        IS: gl.constexpr = gl.SliceLayout(1 if SR else 0, LS)
        IC: gl.constexpr = gl.SliceLayout(1, LC)
        SW32: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        SW16: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        FLAT2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        lat = (gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32),
               gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32),
               gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32),
               gl.allocate_shared_memory(gl.int32, [BN, CH // 4], SW32))
        rope = gl.allocate_shared_memory(gl.bfloat16, [1, BN, 64], SW16)
        if SR:
            scs = gl.allocate_shared_memory(gl.float32, [1, BN, 4], FLAT2)
        else:
            scs = gl.allocate_shared_memory(gl.float32, [1, 4, BN], FLAT2)
        _occupancy_pad(PAD, NW)
        t = gl.program_id(0)
        sp = gl.program_id(1)
        k_start = sp * KEYS_PER_SPLIT
        k_end = gl.minimum(TOPK, k_start + KEYS_PER_SPLIT)
        idx_row = IDX + t.to(gl.int64) * stride_it
        for i in range(gl.cdiv(k_end - k_start, BN) + 1):  # tile 0's copies, then each tile's successor's
            k0 = k_start + i * BN
            if i > 0:
                cp.wait_group(0)
                _barrier()
            if k0 < k_end:
                _refill_tail(KV, _tile_idx(idx_row, k0, k_end, BN, IR), _tile_idx(idx_row, k0, k_end, BN, IS), N_ROWS,
                             stride_kv, rope, scs, LR, LS, SR)
                idx_c = _tile_idx(idx_row, k0, k_end, BN, IC)
                for c in gl.static_range(4):
                    _refill_chunk(KV, idx_c, N_ROWS, stride_kv, lat, c, LC, ROWS)
                cp.commit_group()
        cp.wait_group(0)


SMEM_PER_SM = {"big": 228 * 1024, "small": 100 * 1024}  # sm_90 / sm_89-sm_120 class, per SM (1 KB per block reserved)


def head_groups(H: int) -> int:
    """G: head groups of 8 (the mma's N) a program holds, 2 warps each."""
    if not 1 <= H <= 16:
        raise ValueError(f"sparse_mla_fp8mma takes 1-16 heads, got {H}")
    return 1 if H <= 8 else 2


def programs_per_sm(G: int, nbuf: int, q_terms: int, smem: str = "big", maxnreg: int = 0,
                    block_n: int = BLOCK_N, wm: int = 2) -> int:
    """Programs that fit on one SM by shared memory and registers (the split rule's waves): without a cap the sm_90 /
    sm_120 builds take 208-242 registers a thread, so 64 K registers hold 4 programs of 2 warps (G = 1), 2 of 4
    (G = 2, or four key warps: `KEY_WARPS`); with a cap of 168, 6 and 3."""
    need = smem_bytes_estimate(G, nbuf, q_terms, block_n, wm) + 2048  # compiler scratch, the driver's 1 KB a block
    by_regs = 65536 // ((maxnreg or 232) * 32 * num_warps_of(G, wm))
    return max(1, min(by_regs, SMEM_PER_SM[smem] // need))


def plan_splits(T: int, topk: int, G: int, device: torch.device, num_splits: int | None = None, nbuf: int = DEFAULT[0],
                q_terms: int = DEFAULT[1], maxnreg: int = 0, block_n: int = DEFAULT.block_n,
                key_warps: int = DEFAULT.key_warps, decode: bool = False) -> tuple[int, int]:
    """(split count, keys per split): enough programs for every SM's resident slots (`mla.pick_num_splits` with the
    fit rule), each split whole tiles of `block_n` keys (`mla.split_keys`; block_n 0: planned with 32-key tiles,
    then `tile_keys`'s rule; four key warps: 64-key tiles, `KEY_WARPS`; key_warps 0: `plan_key_warps`'s pick, which
    reads decode)."""
    if key_warps == 0:
        key_warps = plan_key_warps(T, topk, G, device, num_splits, nbuf, q_terms, maxnreg, block_n, decode)
    wm = key_warps
    bn = tile_keys(block_n, 1, wm) if wm == 4 else block_n or BLOCK_N
    if num_splits is None:
        waves = programs_per_sm(G, nbuf, q_terms, mla.smem_class(device), maxnreg, bn, wm)
        num_splits = mla.pick_num_splits(T, 1, topk, bn, num_sms(device), waves, True)
    splits, _ = mla.split_keys(topk, num_splits, bn)
    return mla.split_keys(topk, splits, tile_keys(block_n, splits, wm))


# a decode step at 1-8 heads (`plan_key_warps`' decode: no two tokens share a request's rows) takes four key warps at
# one split where their programs fill at least `DECODE_K4_FILL` of one wave's slots or span at least
# `DECODE_K4_WAVES` waves. H100 runs, graph
# replay, each token its own 32K-token request (NOTES.md round 20; 264 four-key-warp slots on 132 SMs): two key warps
# spread a token's list over twice the slots, in a time nearly proportional to the tokens (0.60-0.71 us each at one
# split, B300-B1000); four take 2-13 % less from 1.5 waves on, but a short second wave leaves half an SM's slots idle.
# `sweeps/fp8mma_batches_fill_h100_59e3fa7.json` and `_fill2_h100_87757bd.json`: four key warps faster at B256 (0.97
# waves) and at every batch from 400 (1.52 waves: by 2 %) to 1000 (by 5-13 % from 432), slower at B136, 192 (0.52,
# 0.73 waves), 320 and 384 (1.21, 1.45 waves; by 8-18 %). Fitted to those 16 batches after two guesses missed (0.9 of
# the last wave alone: B448, B640; 0.8 of all waves' slots: B420, B600); on 8 new batches (`_fill3_h100_3d643c8.json`)
# right at 7, wrong at B230 (0.87 of a wave, four key warps 3.1 % faster). The prefill, whose tokens share one request's
# rows (L2 hits), is the other way round at every token count (8 heads, 2112 tokens: 684 against 853 us, whole
# waves): hence a decode-only rule
DECODE_K4_FILL = 0.9
DECODE_K4_WAVES = 1.5


def plan_key_warps(T: int, topk: int, G: int, device: torch.device, num_splits: int | None = None,
                   nbuf: int = DEFAULT[0], q_terms: int = DEFAULT[1], maxnreg: int = 0,
                   block_n: int = DEFAULT.block_n, decode: bool = False) -> int:
    """`key_warps_of`'s rule (key_warps 0) for a call: at 1-8 heads whether four key warps' own plan splits the
    top-k list, at 9-16 whether two key warps' plan does (their programs per SM are the same there). decode: each
    token gathers its own request's rows (a decode step: `mla.sparse_mla`'s decode): at 1-8 heads four key warps
    also where their plan does not split and its programs fill at least `DECODE_K4_FILL` of one wave or span at
    least `DECODE_K4_WAVES` waves."""
    wm = 4 if G == 1 and q_terms == 1 and block_n == 0 else 2
    splits = plan_splits(T, topk, G, device, num_splits, nbuf, q_terms, maxnreg, block_n, wm)[0]
    pick = key_warps_of(0, G, q_terms, splits > 1, block_n)
    if decode and wm == 4 and splits == 1:
        slots = programs_per_sm(G, nbuf, q_terms, mla.smem_class(device), maxnreg, BLOCK_NS[1], wm) * num_sms(device)
        waves = T / slots
        pick = 4 if waves >= DECODE_K4_WAVES or DECODE_K4_FILL <= waves <= 1 else pick
    return pick


_FP8MMA = Prebound(_sparse_mla_fp8mma_kernel) if HAVE_GLUON else None


@triton.jit
def _merge_pieces_kernel(PART, O, LSE, stride_ot, stride_oh, stride_lt, H, N_TOK, NT, N_PROG, HP: tl.constexpr,
                         BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """The balanced schedule's cut tokens (`SCHEDS`): boundary b (between programs b and b + 1) cuts token
    ((b + 1) n / P) // NT unless that run end is a token's end (n = N_TOK * NT tiles, P = N_PROG programs); its two
    pieces' partials (fp32, normalised, with their log2 lse) sit in a two-split buffer over P rows, `mla._part_rows`'s
    layout and `split_buffer`'s allocation (slot 0 the head, slot 1 the tail, row b), and merge into out and lse as
    `mla._merge_splits_kernel` merges splits (`mla._merge_rows`); apart from it because the row it writes is the cut
    token, not its own program id, and most boundaries write nothing. Plain Triton (it runs in the interpreter).
    PDL: launched as the kernel's programmatic dependent, so it waits for the kernel first (`common.pdl`)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    db = tl.program_id(1)
    g1 = (b + 1) * (N_TOK.to(tl.int64) * NT) // N_PROG
    if g1 % NT != 0:
        t = g1 // NT
        offs_h = tl.arange(0, HP)
        offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
        hm = offs_h < H
        rows = _part_rows(tl.arange(0, 2)[:, None], b, N_PROG, H, offs_h[None, :])  # [2, HP]: head, tail piece
        _merge_rows(PART, PART + 2 * N_PROG.to(tl.int64) * H * 512, rows, tl.broadcast_to(hm[None, :], (2, HP)), O,
                    LSE, t, offs_h, hm, offs_d, db, stride_ot, stride_oh, stride_lt, 512)


_MERGE_PIECES = Prebound(_merge_pieces_kernel)
MERGE_BLOCK_D = 128


def merge_pieces(part: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, tiles: int, programs: int) -> None:
    """Merge the cut tokens' two partials into out `[T, H, 512]` and lse `[T, H]` (`_merge_pieces_kernel`); tokens
    done whole are left as the kernel wrote them."""
    T, H, _ = out.shape
    if programs < 2:
        return
    _MERGE_PIECES.launch((programs - 1, D_NOPE // MERGE_BLOCK_D),
                         (part, out, lse, out.stride(0), out.stride(1), lse.stride(0), H, T, tiles, programs),
                         dict(HP=max(2, 1 << (H - 1).bit_length()), BLOCK_D=MERGE_BLOCK_D, num_warps=4,
                              **common.merge_pdl_kw(out.device)))


@functools.lru_cache(maxsize=4096)
def _launch_plan(T: int, H: int, topk: int, dev_type: str, dev_index: int | None, nbuf: int, q_terms: int,
                 p_terms: int, maxnreg: int, block_n: int, row_threads: int, refill: int, sched: int,
                 num_splits: int | None, idx_stride: int = 0,
                 programs: int | None = None, key_warps: int = 2,
                 widen: int = 0, wgmma: int = 0, decode: bool = False) -> tuple[int, int, tuple, dict, tuple]:
    """(splits, keys per split, grid, constexprs and options, their values as a key) for a call shape: the host work
    an eager layer would otherwise repeat on every call. The grid is (T, splits), or under the balanced schedule
    (`balanced_mode`) (slots,): one program per slot of the machine; programs (a measurement knob) takes the
    balanced schedule over that many programs wherever it applies with T >= programs."""
    dev = torch.device(dev_type, dev_index) if dev_index is not None else torch.device(dev_type)
    G = head_groups(H)
    wm = key_warps or plan_key_warps(T, topk, G, dev, num_splits, nbuf, q_terms, maxnreg, block_n, decode)
    nbuf = ring_slots(nbuf, G, wm)
    splits, keys_per_split = plan_splits(T, topk, G, dev, num_splits, nbuf, q_terms, maxnreg, block_n, wm)
    bn = tile_keys(block_n, splits, wm)
    refill = refill_mode(refill, nbuf, G, splits, wm)
    slots = programs_per_sm(G, nbuf, q_terms, mla.smem_class(dev), maxnreg, bn, wm) * num_sms(dev)
    rows_flat = topk > 0 and topk % bn == 0 and idx_stride == topk and T * topk < 2**31
    if programs:  # T >= programs: every run still holds a token's tiles, so a token is still cut at most once
        slots = programs
        flat = balanced_mode(sched, refill, splits, T + 1, slots, rows_flat)
    else:
        flat = balanced_mode(sched, refill, splits, T, slots, rows_flat)
    kw = dict(SPLIT=splits > 1, G=G, NBUF=nbuf, Q_TERMS=q_terms, P_TERMS=p_terms, BN=bn,
              TPR=row_threads, REFILL=refill, DBG=None, DEBUG=0, COMPUTE_ALONE=False,
              PAD=0, BALANCED=flat, WM=wm, WIDEN=widen, WG=wgmma_of(wgmma, wm, G, _arch(dev)),
              # a merge follows (`merge_pieces` / `mla.merge_splits`): where the programs trigger it
              PDL=PDL_TRIGGER if (splits > 1 or flat) and common.pdl(dev) else 0,
              ROWS=REFILL_ROWS if refill == 1 else 0, GSCALES=GATHER_SCALES,
              num_warps=num_warps_of(G, wm), **({"maxnreg": maxnreg} if maxnreg else {}))
    return splits, keys_per_split, ((slots,) if flat else (T, splits)), kw, tuple(kw.values())


def config_plan(cfg: Config, T: int, H: int, topk: int, dev_type: str, dev_index: int | None, idx_stride: int,
                decode: bool = False) -> tuple[int, int, tuple, dict, tuple]:
    """`_launch_plan` for a `Config`'s build as `sparse_mla_fp8mma` plans it unforced (the split plan's splits, one
    program a token or the balanced schedule by its rule): what the probes and tests ask of a shipped build."""
    return _launch_plan(T, H, topk, dev_type, dev_index, cfg.nbuf, cfg.q_terms, cfg.p_terms, cfg.maxnreg, cfg.block_n,
                        cfg.row_threads, cfg.refill, cfg.sched, None, idx_stride, None, cfg.key_warps, cfg.widen,
                        cfg.wgmma, decode)


def clear_plans() -> None:
    """Forget the cached launch plans (`mla.set_pdl`)."""
    _launch_plan.cache_clear()


def _set_knob(name: str, value: int, modes: tuple, what: str) -> None:
    """Module setting `name` to value (one of modes, else a ValueError naming `what`); the cached launch plans, which
    hold it as a constexpr, are dropped."""
    if value not in modes:
        raise ValueError(f"{what} must be one of {modes}, got {value!r}")
    globals()[name] = value
    clear_plans()


def set_pdl_trigger(where: int) -> None:
    """Where the programs trigger their merge under PDL from now on (`PDL_TRIGGERS`)."""
    _set_knob("PDL_TRIGGER", where, PDL_TRIGGERS, "the PDL trigger's place")


def set_gather_scales(mode: int) -> None:
    """How the whole-tile gathers copy a row's scales from now on (`GATHER_SCALES_MODES`)."""
    _set_knob("GATHER_SCALES", mode, GATHER_SCALES_MODES, "the whole-tile gathers' scale-copy mode")


def set_refill_rows(rows: int) -> None:
    """How the early refill copies a latent chunk from now on (`REFILL_ROWS_MODES`)."""
    _set_knob("REFILL_ROWS", rows, REFILL_ROWS_MODES, "the early refill's copy mode")


def _arch(dev: torch.device) -> int:
    """major * 10 + minor of a CUDA device (`common.capability`, cached; 0 elsewhere)."""
    if dev.type != "cuda":
        return 0
    major, minor = capability(dev)
    return 10 * major + minor


def debug_record_bytes(H: int) -> int:
    """Bytes of one program's DEBUG record (the layout `_debug_base` documents)."""
    HN = 8 * head_groups(H)
    return 8 * 32 * HN * 4 + 32 * 512 + 4 * 128 * 32 + 6 * HN * 512


def sparse_mla_fp8mma(q, kv_cache, indices, sm_scale, *, num_splits=None, nbuf=DEFAULT.nbuf, q_terms=DEFAULT.q_terms,
                      p_terms=DEFAULT.p_terms, maxnreg=DEFAULT.maxnreg, block_n=DEFAULT.block_n,
                      row_threads=DEFAULT.row_threads, refill=DEFAULT.refill, sched=DEFAULT.sched,
                      key_warps=DEFAULT.key_warps, widen=DEFAULT.widen, wgmma=DEFAULT.wgmma, out=None, debug=None,
                      programs=None, decode=False, per_sm=None):
    """Sparse MLA forward over an fp8_ds_mla cache for 1-16 heads (module docstring); returns `(out, lse)` as
    `mla.sparse_mla_launch` does: out `[T, H, 512]` in q's dtype, lse `[T, H]` fp32 natural log, zeros / -inf for a
    token without a valid key. q_terms / p_terms: e4m3 terms of q and of P (2 or 3), or 1 and 1 for the fp16-product
    build; maxnreg: register cap per thread (0: none); block_n: keys a tile (32 or 64); row_threads: threads a
    gathered row's latent bytes are spread over; refill: how a one-slot ring is refilled (`Config`, `REFILLS`);
    sched: the programs' schedule (`SCHEDS`); key_warps: warps along the keys (`KEY_WARPS`); widen: latent chunks
    widened by integer instructions (`WIDENS`); wgmma: S's products as wgmma (`WGMMAS`). `config_kwargs(cfg)`
    gives these for a `Config`. programs (a measurement knob): the balanced schedule's program count instead of the
    slots (T: one token a program). decode: each token gathers its own request's rows (a decode step: `mla.sparse_mla`
    passes its caller's word, or whether the call is being captured into a CUDA graph), which the key-warps rule
    reads (`plan_key_warps`). per_sm (a measurement knob): hold the kernel to that many programs an SM by a
    shared-memory pad (`pad_words`; e.g. the 99 KB class's count on an sm_90 GPU, with `mla.force_smem_class`)."""
    if not HAVE_GLUON:
        raise RuntimeError("this Triton has no Gluon (triton.experimental.gluon)")
    T, H, d = q.shape
    if d != D_QK:
        raise ValueError(f"q must be [T, H, {D_QK}], got {tuple(q.shape)}")
    G = head_groups(H)  # 1-16 heads, else ValueError
    check_terms(q_terms, p_terms)
    check_block_n(block_n)
    check_key_warps(key_warps, q_terms, block_n)
    check_widen(widen, q_terms, p_terms)
    # forced builds (1, 2) refused off sm_90; the rule (3) resolves per device in `_launch_plan`
    check_wgmma(wgmma, key_warps, _arch(q.device) if wgmma in (1, 2) else None)
    check_row_threads(row_threads, G, key_warps or 4)  # (the rule: as many threads a row as it may take warps)
    if nbuf < 0 or maxnreg < 0:
        raise ValueError(f"nbuf (0: one slot per head group) and maxnreg must be >= 0, got {nbuf}, {maxnreg}")
    check_refill(refill)
    check_sched(sched)
    if per_sm is not None and (per_sm < 1 or debug is not None):
        raise ValueError(f"per_sm (programs an SM, held by a pad) must be >= 1 and without debug, got {per_sm}")
    if programs is not None and not 1 < programs <= T:
        raise ValueError(f"programs (the balanced schedule's program count) must be in 2..{T}, got {programs}")
    debug_refused = (f"the DEBUG record is built for the e4m3 products (q_terms 2 or 3) over {BLOCK_N}-key tiles in a "
                     f"slot refilled whole")
    if debug is not None and (q_terms == 1 or block_n == BLOCK_NS[1] or refill == 1 or key_warps == 4):
        raise ValueError(debug_refused)
    q, indices, stride_kv, n_rows, out, lse = prepare_call(q, kv_cache, indices, out)
    topk = indices.shape[1]
    dev = q.device
    if T == 0:
        return out, lse
    splits, keys_per_split, grid, kw, kw_key = _launch_plan(T, H, topk, dev.type, dev.index, nbuf, q_terms, p_terms,
                                                            maxnreg, block_n, row_threads, refill, sched, num_splits,
                                                            indices.stride(0), programs, key_warps, widen, wgmma,
                                                            bool(decode))
    flat = kw["BALANCED"]
    if programs is not None and not flat:
        raise ValueError("programs (the balanced schedule's program count) applies only where the balanced schedule "
                         "does (sched 1, the early refill at one split, index rows back to back)")
    part = split_buffer(2 if flat else splits, grid[0] if flat else T, H, lse)  # (flat: two slots a boundary)
    ints = (q.stride(0), q.stride(1), stride_kv, indices.stride(0), out.stride(0), out.stride(1), H, H, topk, n_rows,
            keys_per_split, T)
    ptrs = (q, kv_cache, indices, out, lse, part)
    args = (*ptrs, *ints, float(sm_scale) * LOG2E)
    if debug is not None:
        if kw["BN"] != BLOCK_N or kw["REFILL"]:  # block_n 0 / refill 2 as the split plan resolved them
            raise ValueError(debug_refused)
        _sparse_mla_fp8mma_kernel[grid](*args, **dict(kw, DBG=debug, DEBUG=1))
    else:
        # the pre-bound launcher (`common.Prebound`): an eager call through Gluon's own binder cost 105-107 us of host
        # time on the H200 against the Triton kernel's 43-45 (`sweeps/fp8mma_small_batch_h200_08e4e10.json`)
        # what Triton specializes on: the dtypes, each pointer's 16-byte alignment, the int values themselves
        # (the token count only as Triton specializes it, so that a new T does not miss the launcher's cache)
        spec = (q.dtype, out.dtype, tuple(t.data_ptr() % 16 == 0 for t in ptrs), ints[:-1], T == 1, T % 16 == 0)
        if per_sm is not None:
            est = smem_bytes_estimate(kw["G"], nbuf, q_terms, kw["BN"], kw["WM"])
            kw = dict(kw, PAD=pad_words(est, per_sm, "big" if 90 <= _arch(dev) < 120 else "small"))  # this GPU's own
            kw_key = tuple(kw.values())
        _FP8MMA.launch(grid, args, kw, kw_key, dev.index, spec)
    if flat:
        merge_pieces(part, out, lse, -(-topk // kw["BN"]), grid[0])
    elif splits > 1:
        mla.merge_splits(part, out, lse, splits)
    return out, lse


ABLATIONS = ("whole", "gathers", "compute")
REFILL_ABLATION = "refill"  # the early refill's own copies alone (`_refill_alone_kernel`); builds that refill early


def pad_words(own_bytes: int, per_sm: int, smem: str = "big") -> int:
    """int32 words of padding (a power of two, for the shared tensor's shape) that bring a program of own_bytes of
    shared memory to per_sm programs per SM (with `programs_per_sm`'s 2 KB a program); ValueError where none does."""
    avail = SMEM_PER_SM[smem] // per_sm - 2048 - own_bytes
    words = 1 << (max(avail, 4) // 4).bit_length() - 1
    # at least 128 words: `_occupancy_pad` stores one word a thread (up to 4 warps) to hold the allocation
    if words < 128 or SMEM_PER_SM[smem] // (own_bytes + 4 * words + 2048) != per_sm:
        raise ValueError(f"no power-of-two pad brings a {own_bytes}-byte program to {per_sm} programs per SM")
    return words


def ablate_launch(q, kv_cache, indices, sm_scale, part: str, cfg=DEFAULT, out=None):
    """One part of the kernel's work on the shapes and split plan of `sparse_mla_fp8mma(q, kv_cache, indices,
    sm_scale, **config_kwargs(cfg))` (a measurement: the outputs of every part but "whole" are wrong):
    - "whole": the kernel (and the split merge);
    - "gathers": `_gathers_alone_kernel`, the same rows into the same ring on the same schedule, nothing computed,
      its shared memory padded so that as many programs share an SM as the whole kernel's (`programs_per_sm`) (without
      the pad the same times on the H200 at bc8f6e0: the split plan's grid holds about that many programs per SM);
    - "compute": the kernel with every ring slot gathered once before the loop and the loop gathering nothing, its
      programs per SM held at the whole kernel's by a shared-memory pad.
    The split merge runs after each part, as after the kernel, so that differences are the kernel's. A build that
    refills its slot early (`REFILLS`) is taken apart on the whole-refill schedule: its gathers and compute alone are
    those of the same build with refill 0 (the same bytes and products); only "whole" differs. `REFILL_ABLATION`
    ("refill", where the build refills early at this shape): its own copies alone, in the copy layouts of today's
    `REFILL_ROWS` (`_refill_alone_kernel`), padded to the whole kernel's programs per SM. Every part, "whole"
    included, runs on the one-program-a-token grid whatever the build's `sched`."""
    if part not in ABLATIONS + (REFILL_ABLATION,):
        raise ValueError(f"part must be one of {ABLATIONS + (REFILL_ABLATION,)}, got {part!r}")
    c = Config(*cfg)
    check_terms(c.q_terms, c.p_terms)
    check_block_n(c.block_n)
    check_key_warps(c.key_warps, c.q_terms, c.block_n)
    check_widen(c.widen, c.q_terms, c.p_terms)
    check_wgmma(c.wgmma, c.key_warps, _arch(q.device) if c.wgmma in (1, 2) else None)
    check_row_threads(c.row_threads, head_groups(q.shape[1]), c.key_warps or 4)
    check_refill(c.refill)
    check_sched(c.sched)
    if part == "whole":
        return sparse_mla_fp8mma(q, kv_cache, indices, sm_scale, **config_kwargs(c._replace(sched=0)), out=out)
    T, H, _ = q.shape
    q, indices, stride_kv, n_rows, out, lse = prepare_call(q, kv_cache, indices, out)
    topk = indices.shape[1]
    dev = q.device
    splits, keys_per_split, _, kw, _ = _launch_plan(T, H, topk, dev.type, dev.index, c.nbuf, c.q_terms, c.p_terms,
                                                    c.maxnreg, c.block_n, c.row_threads, c.refill, 0, None,
                                                    key_warps=c.key_warps, widen=c.widen, wgmma=c.wgmma)
    part_buf = split_buffer(splits, T, H, lse)
    G, nbuf, bn, wm = kw["G"], kw["NBUF"], kw["BN"], kw["WM"]
    smem = mla.smem_class(dev)
    per_sm = programs_per_sm(G, c.nbuf, c.q_terms, smem, c.maxnreg, bn, wm)
    if part == "compute":
        # without its gathers the kernel needs fewer registers (sm_90: 168 against 248), so more programs would share
        # an SM than the whole kernel's: shared memory holds them at its count
        pad = pad_words(smem_bytes_estimate(G, c.nbuf, c.q_terms, bn, wm), per_sm, smem)
        _sparse_mla_fp8mma_kernel[(T, splits)](
            q, kv_cache, indices, out, lse, part_buf, q.stride(0), q.stride(1), stride_kv, indices.stride(0),
            out.stride(0), out.stride(1), H, H, topk, n_rows, keys_per_split, T, float(sm_scale) * LOG2E,
            **dict(kw, COMPUTE_ALONE=True, PAD=pad))
    elif part == REFILL_ABLATION:
        if not kw["REFILL"]:
            raise ValueError(f"part {REFILL_ABLATION!r} takes a build that refills its slot early at this shape "
                             f"(`refill_mode`), not {config_name(c)} at {T} tokens")
        pad = pad_words(bn * (D_NOPE + 2 * D_ROPE + 16), per_sm, smem)
        _refill_alone_kernel[(T, splits)](kv_cache, indices, stride_kv, indices.stride(0), topk, n_rows,
                                          keys_per_split, NW=kw["num_warps"], BN=bn, TPR=kw["TPR"],
                                          ROWS=REFILL_ROWS, PAD=pad, num_warps=kw["num_warps"])
    else:
        ring = nbuf * bn * (D_NOPE + 2 * D_ROPE + 16)
        pad = pad_words(ring, per_sm, smem)
        _gathers_alone_kernel[(T, splits)](kv_cache, indices, stride_kv, indices.stride(0), topk, n_rows,
                                           keys_per_split, NW=kw["num_warps"], NBUF=nbuf, BN=bn, TPR=kw["TPR"],
                                           PAD=pad, PDL=kw["PDL"], GSCALES=kw["GSCALES"],
                                           num_warps=kw["num_warps"])
    if splits > 1:
        mla.merge_splits(part_buf, out, lse, splits)
    return out, lse


def aot_compile(arch: int, G: int = 1, nbuf: int = DEFAULT.nbuf, q_terms: int = DEFAULT.q_terms,
                p_terms: int = DEFAULT.p_terms, split: bool = True, debug: int = 0, maxnreg: int = DEFAULT.maxnreg,
                block_n: int = DEFAULT.block_n, row_threads: int = DEFAULT.row_threads, compute_alone: bool = False,
                pad: int = 0, refill: int = DEFAULT.refill, sched: int = DEFAULT.sched,
                key_warps: int = DEFAULT.key_warps, widen: int = DEFAULT.widen, wgmma: int = DEFAULT.wgmma,
                pdl: int | None = None, rows: int | None = None, gscales: int | None = None):
    """Compile the kernel for `sm_<arch>` without a GPU (`triton.compile` on a `GluonASTSource`); block_n 0: the
    tile `tile_keys` gives a split build (32 keys) or one without splits (64); compute_alone, pad: the kernel's
    COMPUTE_ALONE and PAD (`aot_compile_part`); sched 1 compiles the balanced schedule (`SCHEDS`) where a launch
    with more tokens than slots would take it (no split, early refill); key_warps: `KEY_WARPS`; widen: `WIDENS`;
    wgmma: `WGMMAS`; pdl: the PDL constexpr (0, or where the trigger sits: `PDL_TRIGGERS`; None: as launched,
    `PDL_TRIGGER` for a build whose partials are merged on sm_90+ while `common.PDL` is: GLM5LIB_PDL=1); rows: the
    early refill's copies (`REFILL_ROWS_MODES`; None: `REFILL_ROWS` where the build refills early, as launched);
    gscales: the whole-tile gathers' scale copies (`GATHER_SCALES_MODES`; None: `GATHER_SCALES`, as launched)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    check_terms(q_terms, p_terms)
    check_block_n(block_n)
    check_key_warps(key_warps, q_terms, block_n)
    check_widen(widen, q_terms, p_terms)
    check_wgmma(wgmma, key_warps, arch)
    wm = key_warps_of(key_warps, G, q_terms, split, block_n)
    check_row_threads(row_threads, G, wm)
    check_refill(refill)
    check_sched(sched)
    fn = _sparse_mla_fp8mma_kernel
    mode = refill_mode(refill, nbuf, G, 2 if split else 1, wm)
    consts = {"SPLIT": split, "G": G, "NBUF": ring_slots(nbuf, G, wm), "Q_TERMS": q_terms, "P_TERMS": p_terms,
              "BN": tile_keys(block_n, 2 if split else 1, wm), "TPR": row_threads,
              "REFILL": mode,
              "DEBUG": debug,
              "COMPUTE_ALONE": compute_alone, "PAD": pad,
              "BALANCED": balanced_mode(sched, mode, 2 if split else 1, 1, 0) and not compute_alone, "WM": wm,
              "WIDEN": widen, "WG": wgmma_of(wgmma, wm, G, arch)}
    consts["PDL"] = (PDL_TRIGGER if common.PDL and (split or consts["BALANCED"]) and arch >= 90 else 0) \
        if pdl is None else pdl
    consts["ROWS"] = (REFILL_ROWS if mode == 1 else 0) if rows is None else rows
    consts["GSCALES"] = GATHER_SCALES if gscales is None else gscales
    types = {"Q": "*bf16", "KV": "*u8", "IDX": "*i32", "O": "*bf16", "LSE": "*fp32", "PART": "*fp32",
             "qk_scale": "fp32", "DBG": "*u8"}
    sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
    c = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    div = ("Q", "KV", "IDX", "O", "LSE", "PART", "stride_qt", "stride_qh", "stride_kv", "stride_it", "stride_ot",
           "stride_oh")  # what the launcher specialises for GLM-5 shapes (all multiples of 16)
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in div}
    return triton.compile(GluonASTSource(fn, sig, c, attrs), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps_of(G, wm), **({"maxnreg": maxnreg} if maxnreg else {})})


def aot_compile_part(arch: int, part: str, G: int = 1, cfg=DEFAULT, split: bool = True):
    """`aot_compile` for the measurement builds of `ablate_launch` ("gathers": `_gathers_alone_kernel` with its pad;
    "compute": the kernel's compute-alone build with its pad; "refill": `_refill_alone_kernel`), on sm_90's
    shared-memory class."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    c = Config(*cfg)
    wm = key_warps_of(c.key_warps, G, c.q_terms, split, c.block_n)
    check_row_threads(c.row_threads, G, wm)
    bn = tile_keys(c.block_n, 2 if split else 1, wm)
    per_sm = programs_per_sm(G, c.nbuf, c.q_terms, "big", c.maxnreg, bn, wm)
    if part == "compute":
        pad = pad_words(smem_bytes_estimate(G, c.nbuf, c.q_terms, bn, wm), per_sm)
        return aot_compile(arch, G, c.nbuf, c.q_terms, c.p_terms, split, maxnreg=c.maxnreg, block_n=c.block_n,
                           row_threads=c.row_threads, compute_alone=True, pad=pad, refill=c.refill,
                           key_warps=c.key_warps, widen=c.widen, wgmma=c.wgmma)
    if part == REFILL_ABLATION:  # the early refill's copies alone, in today's `REFILL_ROWS` mode
        if not refill_mode(c.refill, c.nbuf, G, 2 if split else 1, wm):
            raise ValueError(f"part {REFILL_ABLATION!r} takes a build that refills early; {config_name(c)} refills "
                             f"whole tiles {'when split' if split else 'at one split'}")
        nw = num_warps_of(G, wm)
        consts = {"NW": nw, "BN": bn, "TPR": c.row_threads, "ROWS": REFILL_ROWS,
                  "PAD": pad_words(bn * (D_NOPE + 2 * D_ROPE + 16), per_sm)}
        fn = _refill_alone_kernel
        sig = {a: ("constexpr" if a in consts else {"KV": "*u8", "IDX": "*i32"}.get(a, "i32")) for a in fn.arg_names}
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("KV", "IDX", "stride_kv", "stride_it")}
        return triton.compile(GluonASTSource(fn, sig, {(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": nw})
    if part != "gathers":
        raise ValueError(f"part must be 'gathers', 'compute' or {REFILL_ABLATION!r}, got {part!r}")
    nbuf = ring_slots(c.nbuf, G, wm)
    fn = _gathers_alone_kernel
    nw = num_warps_of(G, wm)
    consts = {"NW": nw, "NBUF": nbuf, "BN": bn, "TPR": c.row_threads,
              "PAD": pad_words(nbuf * bn * (D_NOPE + 2 * D_ROPE + 16), per_sm),
              "PDL": PDL_TRIGGER if common.PDL and split and arch >= 90 else 0, "GSCALES": GATHER_SCALES}
    sig = {a: ("constexpr" if a in consts else {"KV": "*u8", "IDX": "*i32"}.get(a, "i32")) for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("KV", "IDX", "stride_kv", "stride_it")}
    return triton.compile(GluonASTSource(fn, sig, {(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": nw})


def compile_stats(arch: int, G: int = 1, nbuf: int = DEFAULT.nbuf, q_terms: int = DEFAULT.q_terms,
                  p_terms: int = DEFAULT.p_terms, split: bool = True, maxnreg: int = DEFAULT.maxnreg,
                  block_n: int = DEFAULT.block_n, row_threads: int = DEFAULT.row_threads,
                  refill: int = DEFAULT.refill, sched: int = DEFAULT.sched, key_warps: int = DEFAULT.key_warps,
                  widen: int = DEFAULT.widen, wgmma: int = DEFAULT.wgmma) -> dict:
    """`aot_compile` plus what the cubin says: shared memory, registers / stack / local memory per thread, and where
    the stack is used, the spill stores and loads (STL, LDL) in the tile loop's SASS (`loop_spills`; the balanced
    schedule's tile loop runs inside its loop over pieces: `sass_loop(inner=True)`)."""
    k = aot_compile(arch, G, nbuf, q_terms, p_terms, split, maxnreg=maxnreg, block_n=block_n, row_threads=row_threads,
                    refill=refill, sched=sched, key_warps=key_warps, widen=widen, wgmma=wgmma)
    wm = key_warps_of(key_warps, G, q_terms, split, block_n)
    row = {"config": config_name((nbuf, q_terms, p_terms, maxnreg, block_n, row_threads, refill, sched, key_warps,
                                  widen, wgmma)),
           "arch": arch, "G": G, "split": split,
           "shared": int(k.metadata.shared), "limit": SMEM_LIMIT[arch],
           "estimate": smem_bytes_estimate(G, nbuf, q_terms, tile_keys(block_n, 2 if split else 1, wm), wm)}
    row["fits"] = row["shared"] <= row["limit"]
    row.update(cubin_usage(k.asm["cubin"]))
    if row["stack"]:
        from glm5lib.kernels.compile_report import cuobjdump, sass_loop

        hist = sass_loop(cuobjdump(k.asm["cubin"], "-sass"), nops=True, inner=True)[2]
        row["loop_spills"] = hist.get("STL", 0) + hist.get("LDL", 0)
    return row


__all__ = ["sparse_mla_fp8mma", "ablate_launch", "ABLATIONS", "REFILL_ABLATION", "Config", "ring_slots",
           "CONFIGS", "DEFAULT",
           "PDL_TRIGGERS", "set_pdl_trigger", "REFILL_ROWS_MODES", "set_refill_rows", "GATHER_SCALES_MODES",
           "set_gather_scales", "config_plan",
           "config_name", "config_kwargs", "check_terms", "check_block_n", "check_row_threads", "check_refill",
           "refill_mode", "REFILLS", "check_sched", "balanced_mode", "KEY_WARPS", "key_warps_of", "num_warps_of",
           "DECODE_K4_FILL", "DECODE_K4_WAVES",
           "check_key_warps", "balanced_pieces", "SCHEDS", "merge_pieces", "WIDENS", "check_widen", "WGMMAS",
           "check_wgmma", "wgmma_of",
           "pad_words", "BLOCK_NS", "head_groups", "plan_splits", "smem_bytes_estimate", "aot_compile",
           "aot_compile_part", "compile_stats"]
