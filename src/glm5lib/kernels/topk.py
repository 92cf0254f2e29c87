"""Top-k selection of indexer scores in vLLM's convention (int32, -1 padded); fp32 twin: `naive.topk_ref`.

Two selections with the same contract (-1 for picks whose score is -inf, i.e. masked or beyond the row's
bounds; `k` columns even when a row has fewer keys; positions made request-local by subtracting `ks`):

- `topk_indices`: `torch.topk`. Ties at the cut are broken in an order that depends on the row length.
- `topk_select`: a Triton radix select. Scores become order-preserving 32-bit keys; four passes of 8-bit digit
  counts find the k-th largest key exactly, and a last pass writes every position above it plus the earliest
  positions equal to it, in ascending position order. The passes count digits by one global add per digit a warp
  holds (`_warp_adds`, `SELECT_AGG`; the multi select below: `tl.histogram` in the first pass, then an add a key
  where few keys match, `_count_digits`); the write's prefix sums run over rows of 16 adjacent keys
  (`SELECT_SCAN_ROWS`). The picked set is the one a stable
  descending sort would give (`paged.stable_topk`, the reference forward's tie-break: exact ties, common where
  ReLU zeroes whole rows, go to the earlier key), so it does not depend on how long the row is or what else is
  in the batch. Per-row `lengths` (read on the device) bound each row, so a fixed-shape launch serves any
  batch: nothing waits on the host.

One program selects from a whole row up to `SELECT_MAX_N` keys. A longer row would leave most of the GPU idle,
so it is split into chunks of `SELECT_CHUNK` keys, each selected by its own program (the same kernel), and a
second launch selects among the chunks' picks. That gives the same set: an element of the row's stable top-k
is beaten (higher score, or equal score at an earlier position) by fewer than k elements of the row, so by
fewer than k of its chunk, and is among its chunk's picks; the second launch keeps it for the same reason, and
since chunks are laid out in position order and each lists its picks in ascending position, "earlier
candidate" means "earlier position" there too.

A decode step's few wide rows leave the GPU idle even so, and the select's time is then its programs' latency.
While a CUDA graph is captured, `multi_rule` sends them to `_multi_select_kernel` instead: every pass runs on all of
a row's chunks at once, each radix pass's digit counts summed across them in global memory (one launch a pass),
then one launch counts each chunk's picks and one writes them at the place the counts of the chunks before it
give, ties still to the earliest positions: the same picks, about 4x faster at one row of 32K-200K keys (see
`SELECT_MULTI`).

torch.topk takes several launches (its eager time is 2-5x its CUDA-graph time at 9K-32K keys in
`outputs/bench/vllm_harness_h200.json`) and leaves the tie order unspecified; a stable descending sort of the
whole row costs more still.
"""

from __future__ import annotations

import torch

from glm5lib.kernels import common  # before triton: interpreter switch
from glm5lib.kernels.common import capturing
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

NEG_INF_KEY = tl.constexpr(0x007FFFFF)  # the ordered key of -inf: keys at or below it are not candidates


@triton.jit
def _ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (negatives flipped, positives' sign bit set).
    -0.0 becomes +0.0 first: they compare equal (and tie) as floats; w * relu(.) = -0.0 for negative w."""
    bits = tl.where(x == 0.0, 0, x.to(tl.uint32, bitcast=True))
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


def ordered_keys(x: torch.Tensor) -> torch.Tensor:
    """`_ordered_key` on the host: fp32 scores -> int64 keys in [0, 2^32) whose order is the scores' order (-0.0 as
    +0.0). For probes and tests (the first radix digit is `ordered_keys(x) >> 24`)."""
    b = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    b = torch.where(x == 0, torch.zeros_like(b), b)
    return torch.where(b >= 2**31, (~b) & 0xFFFFFFFF, b | 2**31)


@triton.jit
def _radix_step(hist, bins, prefix, remaining, shift):
    """One radix pass's verdict from its digit counts `hist` (of the keys that match `prefix`): the bin b holding the
    remaining-th largest key joins the prefix at `shift`, and `remaining` loses the keys strictly above bin b."""
    at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys whose digit is >= b
    b = tl.max(tl.where(at_least >= remaining, bins, 0), 0)
    remaining -= tl.sum(tl.where(bins == b, at_least - hist, 0), 0)  # minus those strictly above bin b
    return prefix | (b.to(tl.uint32) << shift), remaining


@triton.jit
def _warp_adds(COUNTS, digit, match, ASM: tl.constexpr):
    """COUNTS[digit] += 1 for every key that matches, as one relaxed global add per distinct digit a warp holds at
    each element instead of one per key (`match.any.sync` groups the lanes whose keys share a digit; the lowest lane
    of a group adds the group's size), so a block costs a few instructions a key whatever its density: where
    `tl.histogram` (Triton 3.6: 8 ballots and a popcount per bin a lane owns, for every key) or one add a key (the
    keys of a run of ties all at one address) cost far more. Every lane of each warp runs the asm (the caller's loop
    and branches are uniform across a program; a block holds at least one key a thread, or warps would hold copies of
    keys and each copy add: `topk_select` passes no AGG there). ASM False (the interpreter, which runs no PTX): the
    same adds, 32 adjacent keys taken as a warp's lanes. Returns 1 where a key's lane added (a group's lowest), else
    0."""
    if ASM:
        adds = tl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .b32 m, lt, c;\n"
            " match.any.sync.b32 m, $1, 0xffffffff;\n"
            " mov.u32 lt, %lanemask_lt;\n and.b32 lt, lt, m;\n setp.eq.u32 p, lt, 0;\n"  # the group's lowest lane
            " setp.ge.s32 q, $1, 0;\n and.pred p, p, q;\n"  # keys that do not match carry -1: no add
            " popc.b32 c, m;\n @p red.relaxed.gpu.global.add.u32 [$2], c;\n selp.u32 $0, 1, 0, p; }",
            "=r,r,l", [tl.where(match, digit, -1), COUNTS + tl.where(match, digit, 0)], dtype=tl.int32,
            is_pure=False, pack=1)
        return adds
    else:  # the same adds with 32 adjacent keys as a warp's lanes (which lanes a warp holds changes no count)
        BLOCK: tl.constexpr = digit.shape[0]
        d = tl.reshape(tl.where(match, digit, -1), [BLOCK // 32, 32])
        same = d[:, :, None] == d[:, None, :]  # lanes i and j hold one digit
        lane = tl.arange(0, 32)
        earlier = tl.max((same & (lane[None, None, :] < lane[None, :, None])).to(tl.int32), 2)
        lead = (earlier == 0) & (d >= 0)  # the lowest lane of a group of matching keys
        tl.atomic_add(COUNTS + tl.where(lead, d, 0), tl.sum(same.to(tl.int32), 2), mask=lead, sem="relaxed")
        return tl.reshape(lead.to(tl.int32), [BLOCK])


@triton.jit
def _count_digits(hist, COUNTS, digit, match, SPARSE: tl.constexpr, BLOCK: tl.constexpr, DIGIT: tl.constexpr,
                  ONE_BIN: tl.constexpr = False, AGG: tl.constexpr = False, ASM: tl.constexpr = False):
    """`hist` plus one block's digit counts of the keys that `match`: by `tl.histogram` (Triton 3.6 lowers it to 8
    warp ballots and a popcount per bin a lane owns for every key, matching or not), or, with SPARSE > 0 and at most
    BLOCK / SPARSE of the block matching, by one relaxed atomic add per matching key into `COUNTS[digit]` (global
    memory, the caller reads them back): after the first pass only keys whose earlier digits equal the k-th
    largest's match, a few percent of a row for spread scores, and their adds spread over many bins. A block of
    many matches (ties, a narrow spread) keeps the histogram: adds to one bin would queue at one address.
    ONE_BIN: a block whose matching keys all share one digit (a run of equal scores at the cut) adds their count
    once (`_multi_select_kernel`: a row's programs all add into one row of counts). AGG: every block, whatever its
    density and pass, by one add per digit a warp holds at an element (`_warp_adds`), `hist` unchanged."""
    if AGG:
        _warp_adds(COUNTS, digit, match, ASM)
    elif SPARSE > 0:
        n_match = tl.sum(match.to(tl.int32), 0)
        if n_match * SPARSE <= BLOCK:
            if ONE_BIN:
                lo = tl.min(tl.where(match, digit, 1 << DIGIT), 0)
                if lo == tl.max(tl.where(match, digit, -1), 0):
                    tl.atomic_add(COUNTS + lo, n_match, sem="relaxed")
                else:
                    tl.atomic_add(COUNTS + digit, 1, mask=match, sem="relaxed")
            else:
                tl.atomic_add(COUNTS + digit, 1, mask=match, sem="relaxed")
        else:
            hist += tl.histogram(digit, 1 << DIGIT, mask=match)
    else:
        hist += tl.histogram(digit, 1 << DIGIT, mask=match)
    return hist


@triton.jit
def _topk_select_kernel(X, LEN, KS, OUT, OUT_X, POS, HIST, stride_x, stride_o, N, K, chunk,
                        HAS_LEN: tl.constexpr, HAS_KS: tl.constexpr, SPLIT: tl.constexpr, MERGE: tl.constexpr,
                        BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr, DIGIT: tl.constexpr, SPARSE: tl.constexpr,
                        ROWS: tl.constexpr, AGG: tl.constexpr = 0, ASM: tl.constexpr = False,
                        STORES: tl.constexpr = False):
    """Program t: row t's top-K into row t of OUT (see `topk_select`).

    SPARSE > 0: the passes after the first count a block's digits one atomic per matching key into the program's
    row of HIST (`[programs, 2^DIGIT]` int32, zeroed here and left zeroed) where at most BLOCK / SPARSE of its keys
    match (`_count_digits`); 0: every block by `tl.histogram`. AGG 1: every pass counts every block into that row of
    HIST by one add per digit a warp holds (`_warp_adds`; ASM: by PTX, else key by key), SPARSE aside; 2: the same
    from the second pass on, the first by `tl.histogram`; 3: as 1, but the first pass goes on by `tl.histogram` after
    a first block that took more than one add for two of its keys (digits spread over many bins, whose adds queue in
    L2 when many programs add at once).

    ROWS > 0: the write reads a block as BLOCK / ROWS rows of ROWS adjacent keys, so that the picks' places are
    in-row sums plus one scan of the row totals (`_block_scan`); 0: one 1-D prefix sum over the block. STORES: the
    picks (and SPLIT's scores) stored by PTX in the block's layout (`_scatter`), else by `tl.store`.

    SPLIT (grid (T, C)): program (t, c) selects among positions [c * chunk, (c + 1) * chunk) of row t and writes
    its picks (row positions) to OUT[t, c * K:(c + 1) * K] and their scores to OUT_X there, -1 / -inf padded
    (nothing when the chunk starts past the row's length).
    MERGE: X is that score workspace; a pick is written as the position POS (the position workspace, laid out
    like X) holds for it. LEN there bounds a row at the chunks that start before its length.
    """
    tl.static_assert(BLOCK <= 16384, "the write packs two block counts in 16 bits each (`_block_picks`)")
    t = tl.program_id(0)
    row = X + t.to(tl.int64) * stride_x
    out = OUT + t.to(tl.int64) * stride_o
    n = N
    if HAS_LEN:
        length = tl.load(LEN + t)
        if MERGE:  # only the chunks that start before the row's length wrote candidates
            n = tl.minimum((length + chunk - 1) // chunk * tl.minimum(K, chunk), N)
        else:
            n = tl.minimum(length, N)
    first = 0  # the row position of this program's first key
    if SPLIT:
        c = tl.program_id(1)
        first = c * chunk
        n = tl.minimum(tl.maximum(n - first, 0), chunk)
        row += first
        out += c * K
        out_x = OUT_X + t.to(tl.int64) * stride_o + c * K
    offs0 = tl.arange(0, BLOCK)
    bins = tl.arange(0, 1 << DIGIT)
    counts = HIST + (t * tl.num_programs(1) + tl.program_id(1)) * (1 << DIGIT)  # this program's counts (SPARSE)
    # --- the k-th largest key, DIGIT bits at a time (most significant first) ---
    prefix = tl.zeros([], tl.uint32)
    remaining = K  # how many of the keys that match `prefix` are still to be taken
    n_valid = 0
    n_scan = tl.where(n > K, n, 0)  # no more keys than K: all finite ones are picked, no threshold needed
    GLOBAL: tl.constexpr = SPARSE > 0 or AGG > 0  # counts go through HIST (from the second pass on, or all passes)
    if GLOBAL:
        tl.atomic_xchg(counts + bins, tl.zeros([1 << DIGIT], tl.int32), sem="relaxed")
        tl.debug_barrier()
    for r in tl.static_range((32 + DIGIT - 1) // DIGIT):
        hi = 32 - DIGIT * r  # bits above `hi` are settled in `prefix`
        shift = hi - DIGIT if hi > DIGIT else 0
        hist = tl.zeros([1 << DIGIT], tl.int32)
        adds_ok = n_scan >= 0  # AGG 3's first pass: still counting by adds
        for start in range(0, n_scan, BLOCK):
            offs = start + offs0
            key = _ordered_key(tl.load(row + offs, mask=offs < n_scan, other=float("-inf")))
            match = (offs < n_scan) & (key > NEG_INF_KEY)
            if r > 0:
                match = match & ((key >> hi) == (prefix >> hi))
            digit = ((key >> shift) & ((1 << DIGIT) - 1)).to(tl.int32)
            if (AGG == 3) and (r == 0):  # adds while the first block's were at most one for two keys
                if adds_ok:
                    added = _warp_adds(counts, digit, match, ASM)
                    if start == 0:  # (a sum across the program: the first block only)
                        adds = tl.sum(added + (match.to(tl.int32) << 16), 0)
                        adds_ok = (adds & 0xFFFF) * 2 <= (adds >> 16)
                else:
                    hist += tl.histogram(digit, 1 << DIGIT, mask=match)
            else:
                hist = _count_digits(hist, counts, digit, match, SPARSE if r > 0 else 0, BLOCK, DIGIT, False,
                                     (AGG == 1) or ((AGG >= 2) and (r > 0)), ASM)
        if GLOBAL:
            if (r > 0) or (AGG == 1) or (AGG == 3):  # the adds' counts join the block counts; the next pass's adds
                # wait for the reads (every thread of a replicated count layout needs the exchange's result: 16 warps
                # hold 256 bins twice, the wave config, right on an H100 at every probe shape since v35)
                tl.debug_barrier()
                hist += tl.atomic_xchg(counts + bins, tl.zeros([1 << DIGIT], tl.int32), sem="relaxed")
                tl.debug_barrier()
        if r == 0:
            n_valid = tl.sum(hist, 0)
        prefix, remaining = _radix_step(hist, bins, prefix, remaining, shift)
    take_all = n_valid <= K  # no more finite keys than K (or none scanned): every finite score is picked
    # --- write: above the threshold, then the earliest `remaining` equal to it, in position order ---
    base = 0
    if HAS_KS:
        base = tl.load(KS + t)
    # every finite key when the row has no more than K of them: a threshold at -inf's key, no ties taken
    thr = tl.where(take_all, tl.full([], NEG_INF_KEY, tl.uint32), prefix)
    quota = tl.where(take_all, 0, remaining)  # the ties still to take
    written = 0
    for start in range(0, n, BLOCK):
        offs = start + _block_offsets(BLOCK, ROWS)
        inside = offs < n
        x = tl.load(row + offs, mask=inside, other=float("-inf"))
        key = _ordered_key(x)
        take, place, n_taken, n_equal = _block_picks(key, inside & (key > NEG_INF_KEY), thr, quota, ROWS)
        slot = written + place
        pos = first + offs
        if MERGE:
            pos = tl.load(POS + t.to(tl.int64) * stride_x + offs, mask=take, other=-1)
        _scatter(out + slot, (pos - base).to(tl.int32), take, STORES)
        if SPLIT:
            _scatter(out_x + slot, x, take, STORES)
        written += n_taken
        quota -= n_equal
    n_out = K
    if SPLIT:  # a chunk that starts past the row's length is never read by the merge
        n_out = tl.where(n > 0, K, 0)
    for start in range(0, n_out, OUT_BLOCK):
        o = start + tl.arange(0, OUT_BLOCK)
        pad = (o >= written) & (o < K)
        tl.store(out + o, tl.full([OUT_BLOCK], -1, tl.int32), mask=pad)
        if SPLIT:
            tl.store(out_x + o, tl.full([OUT_BLOCK], float("-inf"), tl.float32), mask=pad)


@triton.jit
def _scatter(ptr, val, mask, ASM: tl.constexpr):
    """`tl.store(ptr, val, mask=mask)` of 32-bit `val` (int32 or fp32) at data-dependent places, in the layout the
    block already has. Triton's coalescing pass gives a store whose addresses it cannot prove contiguous a layout of
    its own, and converts the pointers and masks to it through shared memory: 8192 64-bit pointers a write block, with
    barriers (Triton 3.6, sm_90: the write loop's 15 `BAR` and 32 KB of shared memory in the wave config's build).
    Inline PTX keeps the caller's layout. ASM False (the interpreter): `tl.store`."""
    if ASM:
        tl.inline_asm_elementwise(
            "{ .reg .pred p;\n setp.ne.b32 p, $2, 0;\n @p st.global.b32 [$1], $3;\n mov.u32 $0, 0; }",
            "=r,l,r,r", [ptr, mask.to(tl.int32), val.to(tl.int32, bitcast=True)], dtype=tl.int32, is_pure=False,
            pack=1)
    else:
        tl.store(ptr, val, mask=mask)


@triton.jit
def _block_offsets(BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """A write block's offsets: `[BLOCK]`, or with ROWS > 0 `[BLOCK / ROWS, ROWS]` (rows of ROWS adjacent keys)."""
    if ROWS > 0:
        return tl.arange(0, BLOCK // ROWS)[:, None] * ROWS + tl.arange(0, ROWS)[None, :]
    else:
        return tl.arange(0, BLOCK)


@triton.jit
def _block_scan(m, ROWS: tl.constexpr):
    """Inclusive prefix count of the mask `m` in position order (`_block_offsets`' shapes). ROWS > 0: in-row sums
    plus the rows before, one scan of BLOCK / ROWS row totals instead of a BLOCK-wide one (Triton 3.6, sm_90, a
    4096-key toy: 495 SASS instructions against 841 for the 1-D scan; `scripts/topk_sass_count.py`)."""
    c = m.to(tl.int32)
    if ROWS > 0:
        tot = tl.sum(c, 1)
        return (tl.cumsum(tot, 0) - tot)[:, None] + tl.cumsum(c, 1)
    else:
        return tl.cumsum(c, 0)


@triton.jit
def _block_sum(c, ROWS: tl.constexpr):
    """The sum of the int32 block `c` (`_block_offsets`' shapes)."""
    if ROWS > 0:
        return tl.sum(tl.sum(c, 1), 0)
    else:
        return tl.sum(c, 0)


@triton.jit
def _block_picks(key, valid, thr, quota, ROWS: tl.constexpr):
    """A write block's picks among its `valid` keys: those above `thr`, then those equal to it while the `quota` of
    ties still to take lasts (may be negative: none), earliest first. Returns (take, place: each pick's 0-based
    place among the block's picks, how many it takes, how many equal `thr`). The above and equal counts go packed in
    one int32 (16 bits each: blocks of at most 2^14 keys) through one prefix sum and one sum, where ranking the ties
    and then placing the picks took two of each (a pick's place: the keys above before it and itself, plus the ties
    taken before it, at most the quota)."""
    packed = (valid & (key > thr)).to(tl.int32) + ((valid & (key == thr)).to(tl.int32) << 16)
    inc = _block_scan(packed, ROWS)
    tot = _block_sum(packed, ROWS)
    q = tl.maximum(quota, 0)
    ties = inc >> 16  # the equal keys up to and including each key
    take = valid & ((key > thr) | ((key == thr) & (ties <= q)))
    place = (inc & 0xFFFF) + tl.minimum(ties, q) - 1
    return take, place, (tot & 0xFFFF) + tl.minimum(tot >> 16, q), tot >> 16


@triton.jit
def _row_threshold(HIST, t, PASSES: tl.constexpr, K, DIGIT: tl.constexpr):
    """The radix select's state after PASSES passes over row t, from the row's digit counts summed over all its
    programs (`_multi_select_kernel`'s HIST[t, pass, bin]): (prefix, remaining, take_all), as
    `_topk_select_kernel` computes them from its own counts."""
    NPASS: tl.constexpr = (32 + DIGIT - 1) // DIGIT
    bins = tl.arange(0, 1 << DIGIT)
    prefix = tl.zeros([], tl.uint32)
    remaining = K
    take_all = False
    for r in tl.static_range(PASSES):
        hi = 32 - DIGIT * r
        shift = hi - DIGIT if hi > DIGIT else 0
        hist = tl.load(HIST + (t * NPASS + r) * (1 << DIGIT) + bins)
        if r == 0:
            take_all = tl.sum(hist, 0) <= K
        prefix, remaining = _radix_step(hist, bins, prefix, remaining, shift)
    return prefix, remaining, take_all


@triton.jit
def _multi_select_kernel(X, LEN, KS, OUT, HIST, CNT, stride_x, stride_o, N, K, chunk, n_chunks,
                         MODE: tl.constexpr, HAS_LEN: tl.constexpr, HAS_KS: tl.constexpr, BLOCK: tl.constexpr,
                         DIGIT: tl.constexpr, CHUNKS: tl.constexpr, OUT_BLOCK: tl.constexpr, SPARSE: tl.constexpr,
                         ROWS: tl.constexpr, STORES: tl.constexpr = False):
    """Program (t, c) of row t split over `n_chunks` programs of `chunk` keys each, one launch per step
    (`topk_select(..., multi=True)`): the radix select of `_topk_select_kernel` with its digit counts summed over
    the row's programs in global memory, so that every pass of a row runs on all of them.

    MODE p < NPASS: pass p's digit counts of this chunk's finite keys that match the prefix the counts of passes
    before p give (`_row_threshold`), added into HIST[t, p] (from pass 1 on, sparse blocks key by key:
    `_count_digits`). MODE NPASS: how many of its keys are above the
    threshold and equal to it, into CNT[t, c]. MODE NPASS + 1: its picks (above the threshold, then the earliest
    equal ones the row still takes once the chunks before it have taken theirs) written in position order at
    their place in the row's list, which the counts of the chunks before it give; chunk 0 also writes the -1
    padding past the row's picks. Chunks that start past the row's length count nothing and pick nothing. STORES:
    the picks stored by PTX (`_scatter`), as in `_topk_select_kernel`."""
    tl.static_assert(BLOCK <= 16384, "the count and write steps pack two block counts in 16 bits each")
    NPASS: tl.constexpr = (32 + DIGIT - 1) // DIGIT
    t = tl.program_id(0)
    c = tl.program_id(1)
    row = X + t.to(tl.int64) * stride_x
    n = N
    if HAS_LEN:
        n = tl.minimum(tl.load(LEN + t), N)
    first = c * chunk
    m = tl.minimum(tl.maximum(n - first, 0), chunk)  # this chunk's keys
    row += first
    offs0 = tl.arange(0, BLOCK)
    if MODE < NPASS:
        if m > 0:  # chunks past the row's length (a decode row read up to its context) count nothing
            prefix, remaining, take_all = _row_threshold(HIST, t, MODE, K, DIGIT)
            hi: tl.constexpr = 32 - DIGIT * MODE
            shift: tl.constexpr = hi - DIGIT if hi > DIGIT else 0
            counts = HIST + (t * NPASS + MODE) * (1 << DIGIT)
            hist = tl.zeros([1 << DIGIT], tl.int32)
            for start in range(0, m, BLOCK):
                offs = start + offs0
                key = _ordered_key(tl.load(row + offs, mask=offs < m, other=float("-inf")))
                match = (offs < m) & (key > NEG_INF_KEY)
                if MODE > 0:
                    match = match & ((key >> hi) == (prefix >> hi))
                digit = ((key >> shift) & ((1 << DIGIT) - 1)).to(tl.int32)
                hist = _count_digits(hist, counts, digit, match, SPARSE if MODE > 0 else 0, BLOCK, DIGIT, True)
            bins = tl.arange(0, 1 << DIGIT)
            tl.atomic_add(counts + bins, hist, mask=hist != 0)
    elif MODE == NPASS and m == 0:  # nothing to count: no threshold needed
        tl.store(CNT + (t * n_chunks + c) * 2, 0)
        tl.store(CNT + (t * n_chunks + c) * 2 + 1, 0)
    elif (m > 0) | (c == 0):  # the write: chunks with keys, and chunk 0 for the padding
        prefix, remaining, take_all = _row_threshold(HIST, t, NPASS, K, DIGIT)
        # every finite key when the row has no more than K of them: a threshold at -inf's key, no ties taken
        thr = tl.where(take_all, tl.full([], NEG_INF_KEY, tl.uint32), prefix)
        rem = tl.where(take_all, 0, remaining)
        if MODE == NPASS:
            gt = 0
            eq = 0
            for start in range(0, m, BLOCK):
                offs = start + offs0
                key = _ordered_key(tl.load(row + offs, mask=offs < m, other=float("-inf")))
                valid = (offs < m) & (key > NEG_INF_KEY)
                tot = tl.sum((valid & (key > thr)).to(tl.int32) + ((valid & (key == thr)).to(tl.int32) << 16), 0)
                gt += tot & 0xFFFF  # the two counts packed as in `_block_picks`: one sum
                eq += tot >> 16
            tl.store(CNT + (t * n_chunks + c) * 2, gt)
            tl.store(CNT + (t * n_chunks + c) * 2 + 1, eq)
        else:
            cidx = tl.arange(0, CHUNKS)
            cnt_gt = tl.load(CNT + (t * n_chunks + cidx) * 2, mask=cidx < n_chunks, other=0)
            cnt_eq = tl.load(CNT + (t * n_chunks + cidx) * 2 + 1, mask=cidx < n_chunks, other=0)
            eq_before = tl.sum(tl.where(cidx < c, cnt_eq, 0), 0)
            written = tl.sum(tl.where(cidx < c, cnt_gt, 0), 0) + tl.minimum(rem, eq_before)
            quota = rem - eq_before  # the ties this chunk may still take
            base = 0
            if HAS_KS:
                base = tl.load(KS + t)
            out = OUT + t.to(tl.int64) * stride_o
            for start in range(0, m, BLOCK):
                offs = start + _block_offsets(BLOCK, ROWS)
                key = _ordered_key(tl.load(row + offs, mask=offs < m, other=float("-inf")))
                take, place, n_taken, n_equal = _block_picks(key, (offs < m) & (key > NEG_INF_KEY), thr, quota, ROWS)
                _scatter(out + written + place, (first + offs - base).to(tl.int32), take, STORES)
                written += n_taken
                quota -= n_equal
            if c == 0:
                total = tl.sum(cnt_gt, 0) + tl.minimum(rem, tl.sum(cnt_eq, 0))
                for start in range(0, K, OUT_BLOCK):
                    o = start + tl.arange(0, OUT_BLOCK)
                    tl.store(out + o, tl.full([OUT_BLOCK], -1, tl.int32), mask=(o >= total) & (o < K))


# (BLOCK, num_warps, DIGIT bits per radix pass). H200 sweep of one program per row (top-k 2048, do_bench per
# call, host launch cost included): 64 x 9000 rows 56 us against torch.topk 232; 128 x 32K 124 against 158;
# 64 x 128K 488 against 186; 4096 x 32K 2.8 ms against 1.8 ms. 11-bit digits ran 4-8x slower (a histogram's cost
# grows with its bins), 4-bit digits no faster. GPU time alone (CUDA graphs, vllm_harness_h200.json): 51 us
# against 64 at 9K keys, 119 against 109 at 32K, 473 against 156 at 128K: most of torch.topk's cost at short rows
# is its launches, and past 32K one program per row leaves the GPU idle.
SELECT_CONFIG = (4096, 8, 8)
# A launch of at most one program an SM (`select_config`): twice the block on twice the warps, the same 16 keys a
# thread, so each scheduler has four warps to issue from instead of two. Round 29, H100
# (`topk_dist_probe.py --configs`, outputs/bench/sweeps/topk_configs_h100_756fb32.json; graph replay, top-k 2048):
# one-program select at 1 / 128 rows of 32K keys 99.5 / 100.1 -> 91.7 / 92.5 us (narrow scores 100.9 / 102.2 -> 93.6
# / 99.0), one 202752-wide row read up to 128K (13 split programs and the merge) 100.4 -> 91.4; but 64 x 128K (512
# split programs, several an SM) 213.7 -> 255.4, so only where the programs fit one wave. Blocks of 16384 on 16 warps:
# 87.1 at one 32K row, 92.6 at 128; 4 warps a program or blocks of 2048: 12-37 % slower at 32K rows, 9-24 % at 64 x
# 128K. The rule as shipped (topk_sparse_h100_dbd95f9.json): 2.0-11.6 % faster than one config at all 32
# one-program / split shapes of the probe, 64 x 128K (the split's 512 programs on 8 warps, the merge's 64 on 16)
# 214.1 -> 207.9.
SELECT_CONFIG_WAVE = (8192, 16, 8)
# Rows longer than SELECT_MAX_N are split into chunks of SELECT_CHUNK keys, one program each, then merged by one
# program per row over ceil(N / SELECT_CHUNK) * min(k, SELECT_CHUNK) candidates (16K at 128K keys, 26K at GLM-5's
# 202752). H200, top-k 2048 (scripts/bench_topk_long.py, outputs/bench/topk_long_h200.json), split select against
# one program per row and torch.topk:
#   eager (how `topk_fast`'s caller, the indexer step, runs): 128K keys 125 us at 1-4 rows against 460 and
#   146-174; 64K keys 98 us at 1-4 rows against 232 and 143-197, 136 at 64 rows against 233 and 148; but 64 rows of
#   128K 261 against torch.topk's 173;
#   CUDA-graph replay: torch.topk is faster at every shape past 32K (62 against 124 us at 1 row of 128K).
# `topk_fast` therefore takes the split select past 32K keys up to TOPK_FAST_TORCH_ABOVE scores per call and
# torch.topk beyond (measured: 4.2M scores select, 8.4M torch.topk). Left as measured, not tuned: at exactly 32K
# keys 8K-key chunks would beat one program at 1-64 rows (68-85 against 113-114 us, graph replay) but not at 128
# rows (132 against 114).
SELECT_MAX_N = 32768
SELECT_CHUNK = 16384
# The row split over programs for every pass (`_multi_select_kernel`, `topk_select(..., multi=True)`): each radix
# pass's digit counts summed over the row's programs in global memory, one launch a pass (4), then one to count
# each chunk's picks and one to write them where the chunks before it leave off: 7 launches with the counts'
# zeroing, every one over all of a row's chunks, instead of one program a row (or one per 16K keys and then one per
# row over the chunks' 2048 picks each). The same picks. H100, top-k 2048, standard-normal scores, CUDA-graph replay
# (`scripts/topk_dist_probe.py`; outputs/bench/sweeps/topk_dist_h100_eef246a.json, topk_rows_h100_3dc78ef.json):
#   rows x width (read up to)  | select before | multi at chunks of 1024 / 2048 / 4096 / 8192 | torch.topk
#   1 x 32K                    | 113.7 us      | 26.7 / 30.3 / 34.8 / 49.7                    | 54.6
#   1 x 202752 (128K)          | 124.0         | 27.8 / 30.7 / 35.1 / 49.9                    | 63.4
#   4 x 202752 (128K)          | 124.3         | 48.4 / 42.4 / 36.6 / 51.0                    | 69.9
#   16 x 128K                  | 125.5         | 114.9 / 93.3 / 72.7 / 72.6                   | 87.7
#   64 x 32K                   | 114.3         | 116.2 / 92.8 / 72.9 / 73.4                   | 82.9
#   64 x 128K                  | 263.8         | 408.7 / 324.3 / 243.7 / 221.2                | 176.3
#   128 x 32K                  | 114.4         | 214.1 / 171.0 / 129.3 / 119.7                | 113.4
#   128 x 202752 (32K)         | 125.2         | 629.8 / 400.6 / 257.6 / 187.2                | 112.2
# At few rows the time is 7 launches of one chunk's work each (smaller chunks, shorter launches); as rows grow the
# GPU fills and larger chunks win, and at 128 rows the one-program select (five scans of a row against multi's
# six, and no threshold re-derived by every program) is as fast or faster. Called eagerly, multi's seven launches
# cost the host more than they save at these sizes (1 x 32K: 218 us a call against 114), so the rule
# (`_multi_default`, SELECT_MULTI None) takes it while a CUDA graph is being captured (vLLM's decode steps,
# `paged.decode_topk`) and for the first eager call of each such shape only (so that its kernels are loaded before
# a capture), for rows at least MULTI_MIN_N wide and at most MULTI_MAX_SCORES scores in the call
# (rows up to SELECT_MAX_N, which one program a row takes otherwise) or MULTI_MAX_SCORES_LONG (longer rows, which
# the 16K split takes otherwise), at `multi_chunk`'s chunk (T * N / 256 keys rounded up to a power of two, within
# 1024-8192). The scores' spread did not move the select then (standard normal against all 256 first-digit bins
# within 0.5 %: Triton 3.6 counts digits with warp ballots; since round 29 the one-program select's adds do depend on
# it, `SELECT_AGG`). True / False force it, at any size.
SELECT_MULTI: bool | None = None
MULTI_MIN_N = 32768
# Refitted in round 30 (H100, v40, outputs/bench/sweeps/topk_rule_h100_139ee79.json, graph replay, `randn` and
# `narrow` scores at 1-128 rows): the multi select against the one-program / split select
#   32K rows:  32 rows 42.8 / 45.0 us against 60.6 / 57.9; 48 rows 62.9 / 64.1 against 62.7 / 58.5;
#              64 rows 63.6 / 66.9 against 66.1 / 58.4 (round 29's bound, 2^21 scores, took the multi select there)
#   longer:    16 x 202752 (3.24M scores) 70.0 / 77.2 against 78.6 / 77.0; 32 x 131072 (4.19M) 98.7 / 106.7 against
#              94.8 / 88.6; 64 x 131072 (2^23, round 29's bound) 179.1 / 194.3 against 155.1 / 145.9
# so the bounds sit between those: 32 rows of 32K, and about the geometric mean of 3.24M and 4.19M.
MULTI_MAX_SCORES = 1 << 20
MULTI_MAX_SCORES_LONG = 3_700_000
MULTI_CHUNKS_RANGE = (1024, 8192)
# the write step reads every chunk's counts as one block of CHUNKS: at least MULTI_CHUNKS_MIN (GLM-5's 202752-wide
# decode rows at 1024-key chunks are 198 of them: one build whatever the width up to that), at most MULTI_MAX_CHUNKS
MULTI_CHUNKS_MIN = 256
MULTI_MAX_CHUNKS = 4096
TOPK_FAST_TORCH_ABOVE = 6_000_000
# The radix passes after the first count a block's digits by one atomic add per matching key where at most
# BLOCK / SELECT_SPARSE of the block matches (`_count_digits`), both selects; 0: by `tl.histogram` throughout.
# Round 28 (`scripts/topk_dist_probe.py --sparse`; outputs/bench/sweeps/topk_sparse_h100_d1ca47b.json,
# topk_sparse_h200_464d769.json; graph replay, top-k 2048), SELECT_SPARSE 8 against 0, the one-program select at
# 1-128 rows of 32K keys on the H100: standard-normal scores 114.1-114.5 -> 102.5-103.0 us (10 %), spread over all
# 256 first-digit bins 113.7-114.3 -> 91.1-91.5 (20 %), ties (integers -8..7) 8 %, a narrow spread (1 + 0.01 randn)
# 1 %; the 128K split rows 12-15 %, 21-24 %, 1-8 %, 2 %; the H200 alike (113.5 -> 101.4, 113.5 -> 90.7). The multi
# select at 16-64 rows 10-19 % off over standard-normal and spread scores (64 x 128K 223.5 -> 180.9 on the H100;
# the H200 7-14 %). Round 29 (topk_sparse_h100_ffdad9d.json, H100), 4 against 8 with SELECT_SCAN_ROWS 16: narrow
# 32K rows 110.6-111.1 -> 101.1-102.5 us, the 128K split rows 2-8 % (narrow 64 x 128K 248.1 -> 228.0), standard
# normal and spread at 32K level; 2 (atomics from half a block matching) gained more at one row (standard normal
# 32K 92.2 us) and lost at 128 rows (103.2, ties 108.8 against 102.8).
SELECT_SPARSE = 4
# How the one-program / split / merge launches count digits (`_warp_adds`: one add per digit a warp holds at an
# element, `match.any`): 1: every pass, every block; 2: the same from the second pass on, the first by `tl.histogram`;
# 3: as 1, but the first pass goes on by `tl.histogram` after a first block whose adds were more than one for two
# keys; 0: `tl.histogram`, or an add a key where a block is sparse (SELECT_SPARSE). The multi select keeps 0: its
# programs share a row's counts, and at one decode row their adds queued at a few addresses (H100, 01285c0: 26.4 ->
# 53.3 us at one 202752-wide row of spread scores, 26.5 -> 41.9 of ties). Round 29, H100, graph replay, top-k 2048,
# one-program select at 1-128 rows of 32K keys (outputs/bench/sweeps/topk_sparse_h100_41bf977.json, all four in one
# run):
#   scores                   | 0 (v36)     | 1           | 2           | 3 (shipped) | torch.topk, 1 / 128 rows
#   standard normal          | 91.0-91.8   | 58.7-74.6   | 71.9-85.4   | 64.2-79.1   | 54.4 / 111.4
#   narrow (1 + 0.01 randn)  | 92.8-97.6   | 57.2-63.4   | 73.3-79.4   | 62.0-68.0   | 53.7 / 113.9
#   ties (integers -8..7)    | 92.5-94.3   | 56.3-67.5   | 70.8-74.2   | 62.0-69.8   | 54.7 / 116.2
#   spread over all 256 bins | 77.7-78.5   | 75.4-101.4  | 64.9-65.7   | 70.8-76.5   | 54.1 / 109.6
# 1 is the fastest wherever a warp's keys share few first digits, as indexer scores do, but its first pass adds about
# once a key where they do not (spread), and at 128 rows those adds queue in L2; 3 gives up 2.3-7.5 us of 1's gain
# to be no slower than 0 at any of the probe's 32 shapes (the worst 84.4 against 83.7 us, spread at 16 x 128K).
SELECT_AGG = 3
# The write reads a block as rows of SELECT_SCAN_ROWS adjacent keys (`_block_scan`: in-row sums and one scan of the
# row totals, both selects); 0: one 1-D prefix sum a block. Round 29 (topk_sparse_h100_ffdad9d.json, H100, against
# 0 with SELECT_SPARSE 8): 1.5-4.9 % faster at every one of the probe's 32 one-program / split shapes (standard
# normal 32K rows 101.7-102.4 -> 99.5-100.2 us, spread 64 x 128K 201.6 -> 191.8). The predicted 8-12 % did not
# come: its static count fell by 513 of 7858 instructions (scripts/topk_sass_count.py,
# outputs/bench/sweeps/topk_sass_v34_triton36.txt). With SELECT_SPARSE 4 the rule's multi select is 2-5 % faster at
# 16-64 rows (level at 16 x 32K standard normal and spread) and 0.1-0.5 us slower at one row at 7 of 8 shapes.
SELECT_SCAN_ROWS = 16
# The write stores its picks by inline PTX in the layout the block already has (`_scatter`, every launch of both
# selects on a GPU), not by `tl.store`, for which Triton 3.6 converts each block's pick pointers and masks to a
# layout of its own through shared memory. Static (sm_90, outputs/bench/sweeps/topk_sass_v40_triton36.txt against
# topk_sass_v39_triton36.txt): the wave build's write loop 930 -> 795 SASS instructions and 15 -> 9 barriers, the
# split build's 1434 -> 1216 and 17 -> 9, the merge's 987 -> 938 and 23 -> 9; shared memory 32 KB -> 2 KB a program
# in the wave config, 16 KB -> 1 KB in SELECT_CONFIG. False: `tl.store` (what round 29 ran).
SELECT_PTX_STORES = True
# Round 28's two options, timed at 2b0a066 on an H100 (outputs/bench/sweeps/topk_sparse_h100_2b0a066.json) and
# removed: the candidates listed once they fit 4096 (or 8192) for the later passes and the write gained only where
# scores spread over all 256 first-digit bins (32K keys 89.8 -> 73.0 us) and lost elsewhere (standard normal 100.5
# -> 102.2, a narrow spread 110.9 -> 132.4, ties up to 20 %): listing is a prefix sum over the row, and the later
# reads through the list are gathers; the write ranking ties in one block only was level at one program a row and
# 23-26 % slower on the 64 x 128K split rows (standard normal 230.0 -> 285.2 us).


_SELECT = common.Prebound(_topk_select_kernel)
_MULTI = common.Prebound(_multi_select_kernel)


def topk_select(logits: torch.Tensor, k: int = 2048, *, lengths: torch.Tensor | None = None,
                ks: torch.Tensor | None = None, out: torch.Tensor | None = None,
                config: tuple[int, int, int] | None = None, chunk: int | None = None,
                multi: bool | None = None, sparse: int | None = None) -> torch.Tensor:
    """int32 `[T, k]`: positions of the k largest finite scores of each row of fp32 `logits [T, N]`, ties at
    the cut to the earlier position, ascending position order, -1 padded.

    `lengths [T]` (int32, on the device): row t is read up to `lengths[t]` (positions beyond are not scores:
    the paged indexer's rows past a request's context). `ks [T]`: positions returned relative to it.
    `chunk`: keys per program; rows longer than it are split and merged (two launches and a workspace of
    `[T, ceil(N / chunk) * min(k, chunk)]` positions and scores, sized from the shapes alone). Default:
    `SELECT_CHUNK` for rows longer than `SELECT_MAX_N`, else one program per row. Same picks either way.
    `multi`: the row split over programs of `chunk` keys (default `multi_chunk`) for every pass,
    seven launches (`_multi_select_kernel`; a workspace of `[T, 4, 256]` digit counts and `[T, chunks, 2]` pick
    counts); the same picks again. None: `_multi_default` (a CUDA-graph decode step's rows) unless `chunk` is given.
    `sparse`: the passes after the first count a block's digits key by key (atomics) where at most 1 / `sparse`
    of it matches, 0: never (see `_count_digits`); None: `SELECT_SPARSE`; it applies where `SELECT_AGG` is 0 and in
    the multi select (`SELECT_AGG` 1-3: warp-aggregated adds, `_warp_adds`). `config`: (keys a block, warps,
    digit bits) for every launch; None: `select_config`'s for each one-program / split / merge launch, SELECT_CONFIG
    for the multi select. Same picks.
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be fp32 [T, N], got {logits.dtype} {tuple(logits.shape)}")
    T, n = logits.shape
    if out is None:
        out = torch.empty(T, k, dtype=torch.int32, device=logits.device)
    elif out.shape[0] < T or out.shape[1] < k or out.dtype != torch.int32 or out.stride(-1) != 1:
        raise ValueError(f"out must be int32 with at least [{T}, {k}] and contiguous rows, got {out.dtype} "
                         f"{tuple(out.shape)}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    if T == 0 or k == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    block, num_warps, digit = SELECT_CONFIG if config is None else config
    if config is not None and not (2 <= block <= 16384 and block & (block - 1) == 0 and num_warps > 0
                                   and num_warps & (num_warps - 1) == 0 and 1 <= digit <= 16):
        raise ValueError(f"config must be (block, warps, digit bits) with a power-of-two block of 2-16384 keys (the "
                         f"write packs two counts in 16 bits), power-of-two warps and 1-16 bits, got {tuple(config)}")
    n_sms = common.num_sms(logits.device)

    def launch_config(programs: int) -> tuple[int, int]:
        """(block, warps) of a one-program / split / merge launch: `config`, else `select_config`'s."""
        return (block, num_warps) if config is not None else select_config(programs, n_sms)[:2]

    dummy = out  # an unused pointer argument when a flag is off
    lens = lengths.to(torch.int32).contiguous() if lengths is not None else dummy
    ks_ = ks.to(torch.int32).contiguous() if ks is not None else dummy
    if multi is None:
        multi = chunk is None and _multi_default(T, n, k, logits.device, lengths is not None, ks is not None)
    sparse = int(SELECT_SPARSE if sparse is None else sparse)
    if sparse < 0:
        raise ValueError(f"sparse must be 0 (histograms only) or a positive divisor (a block's matching share up to "
                         f"which it counts by atomics, where SELECT_AGG is 0 and in the multi select), got {sparse}")
    if multi and n > 0:  # no columns: the one-program launch below writes the padding
        return _multi_select(logits, k, lens, ks_, out, chunk or multi_chunk(T, n), block, num_warps, digit,
                             lengths is not None, ks is not None, sparse)
    if chunk is None:
        chunk = SELECT_CHUNK if n > SELECT_MAX_N else n
    n_chunks = triton.cdiv(n, chunk) if chunk < n else 1
    # each program's digit counts (`_count_digits`): zeroed and left zeroed by the kernel, so no memset launch
    asm = not common.INTERPRETED
    stores = asm and SELECT_PTX_STORES

    def agg_for(blk: int, w: int) -> int:
        """SELECT_AGG for a launch of `blk`-key blocks on `w` warps: 0 where a block has fewer keys than the program
        has threads (Triton then gives several warps copies of each key, and each copy's PTX would add)."""
        return int(SELECT_AGG) if blk >= 32 * w else 0

    counts = (torch.empty(T * n_chunks, 1 << digit, dtype=torch.int32, device=logits.device) if sparse or SELECT_AGG
              else dummy)
    if chunk >= n:
        b, w = launch_config(T)
        _SELECT((T,),
            logits, lens, ks_, out, dummy, dummy, counts, logits.stride(0), out.stride(0), n, k, 0,
            HAS_LEN=lengths is not None, HAS_KS=ks is not None, SPLIT=False, MERGE=False, BLOCK=b,
            OUT_BLOCK=1024, DIGIT=digit, SPARSE=sparse, ROWS=scan_rows(b), AGG=agg_for(b, w), ASM=asm,
            STORES=stores,
            num_warps=w,
        )
        return out
    kc = min(k, chunk)  # a chunk has at most `chunk` picks
    width = n_chunks * kc
    pos = torch.empty(T, width, dtype=torch.int32, device=logits.device)
    val = torch.empty(T, width, dtype=torch.float32, device=logits.device)
    b, w = launch_config(T * n_chunks)
    split_block = min(b, triton.next_power_of_2(chunk))
    _SELECT((T, n_chunks),
        logits, lens, dummy, pos, val, dummy, counts, logits.stride(0), width, n, kc, chunk,
        HAS_LEN=lengths is not None, HAS_KS=False, SPLIT=True, MERGE=False, BLOCK=split_block,
        OUT_BLOCK=1024, DIGIT=digit, SPARSE=sparse, ROWS=scan_rows(split_block), AGG=agg_for(split_block, w),
        ASM=asm, STORES=stores, num_warps=w,
    )
    b, w = launch_config(T)
    merge_block = min(b, triton.next_power_of_2(width))
    _SELECT((T,),
        val, lens, ks_, out, dummy, pos, counts, width, out.stride(0), width, k, chunk,
        HAS_LEN=lengths is not None, HAS_KS=ks is not None, SPLIT=False, MERGE=True, BLOCK=merge_block,
        OUT_BLOCK=1024, DIGIT=digit, SPARSE=sparse, ROWS=scan_rows(merge_block), AGG=agg_for(merge_block, w),
        ASM=asm, STORES=stores, num_warps=w,
    )
    return out


def select_config(programs: int, n_sms: int) -> tuple[int, int, int]:
    """(block, warps, digit bits) of a one-program / split / merge launch of `programs` programs on a GPU of `n_sms`
    SMs: `SELECT_CONFIG_WAVE` where every program has an SM of its own, else `SELECT_CONFIG` (two programs an SM
    fit; the wave config's 16 warps hold a whole SM's registers)."""
    return SELECT_CONFIG_WAVE if programs <= n_sms else SELECT_CONFIG


def scan_rows(block: int) -> int:
    """The write's keys a row (`_block_scan`'s ROWS) for a block of `block` keys: `SELECT_SCAN_ROWS`, or 0 (the 1-D
    scan) when the block does not hold two such rows."""
    return SELECT_SCAN_ROWS if 0 < SELECT_SCAN_ROWS <= block // 2 else 0


def multi_rule(T: int, n: int) -> bool:
    """The shapes the row split over programs takes while a CUDA graph is captured: rows at least `MULTI_MIN_N`
    wide and at most `MULTI_MAX_SCORES` scores in the call (`MULTI_MAX_SCORES_LONG` for rows past `SELECT_MAX_N`)."""
    return n >= MULTI_MIN_N and T * n <= (MULTI_MAX_SCORES if n <= SELECT_MAX_N else MULTI_MAX_SCORES_LONG)


# (device, T, N, k, lengths, ks) of the eager calls that ran the split over programs once (`_multi_default`)
_MULTI_WARMED: set = set()


def _multi_default(T: int, n: int, k: int, device: torch.device, has_len: bool, has_ks: bool) -> bool:
    """`topk_select`'s choice when neither `multi` nor `chunk` is given (`SELECT_MULTI`; its None): on a GPU, for
    `multi_rule`'s shapes, the split over programs while a CUDA graph is captured; called eagerly, the one-program /
    split select (fewer launches for the host), except the first eager call of each such shape, which runs the split
    over programs once so that its kernels are compiled and loaded before any capture: the driver refuses to load a
    module while a stream is captured, and vLLM runs each captured decode shape eagerly first (its warm-up runs)."""
    if SELECT_MULTI is not None:
        return bool(SELECT_MULTI)
    if not _on_gpu(device) or not multi_rule(T, n):
        return False
    if capturing(device):
        return True
    key = (device.index, T, n, k, has_len, has_ks)
    if key in _MULTI_WARMED:
        return False
    if len(_MULTI_WARMED) >= 4096:
        _MULTI_WARMED.clear()
    _MULTI_WARMED.add(key)
    return True


def _on_gpu(device: torch.device) -> bool:
    return device.type == "cuda" and not common.INTERPRETED


def multi_chunk(T: int, n: int) -> int:
    """The keys a program of `_multi_select_kernel` takes: T * n / 256 rounded up to a power of two, within
    `MULTI_CHUNKS_RANGE` (about 256 programs' worth of a call's scores: 1024 at one 202752-wide row, 8192 from 2M
    scores on)."""
    lo, hi = MULTI_CHUNKS_RANGE
    return min(hi, max(lo, triton.next_power_of_2(max(1, T * n // 256))))


def multi_counts_block(n_chunks: int) -> int:
    """The block the write step reads a row's chunk counts in (`_multi_select_kernel`'s CHUNKS): a power of two,
    at least `MULTI_CHUNKS_MIN`."""
    return max(MULTI_CHUNKS_MIN, triton.next_power_of_2(n_chunks))


def _multi_select(logits, k, lens, ks_, out, chunk, block, num_warps, digit, has_len, has_ks, sparse):
    """`topk_select(..., multi=True)`: `_multi_select_kernel`'s seven steps over `[T, ceil(N / chunk)]` programs."""
    T, n = logits.shape
    n_chunks = triton.cdiv(n, chunk)
    if n_chunks > MULTI_MAX_CHUNKS:
        raise ValueError(f"multi splits a row into at most {MULTI_MAX_CHUNKS} chunks; chunk {chunk} cuts {n} keys "
                         f"into {n_chunks}")
    npass = triton.cdiv(32, digit)
    hist = torch.zeros(T, npass, 1 << digit, dtype=torch.int32, device=logits.device)
    cnt = torch.empty(T, n_chunks, 2, dtype=torch.int32, device=logits.device)
    mblock = min(block, triton.next_power_of_2(chunk))
    for mode in range(npass + 2):
        _MULTI((T, n_chunks),
            logits, lens, ks_, out, hist, cnt, logits.stride(0), out.stride(0), n, k, chunk, n_chunks,
            MODE=mode, HAS_LEN=has_len, HAS_KS=has_ks, BLOCK=mblock, DIGIT=digit,
            CHUNKS=multi_counts_block(n_chunks), OUT_BLOCK=1024, SPARSE=sparse, ROWS=scan_rows(mblock),
            STORES=SELECT_PTX_STORES and not common.INTERPRETED, num_warps=num_warps,
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


def topk_overlap(sel: torch.Tensor, ref: torch.Tensor) -> list[int]:
    """Per row, how many positions two selections `[T, k]` (int, -1 padded, any order) share, padding left out."""
    return [len(set(a.tolist()) & set(b.tolist()) - {-1}) for a, b in zip(sel.cpu(), ref.cpu())]


def topk_fast(logits: torch.Tensor, k: int = 2048, *, lengths: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """The faster of the two on the H200 when called eagerly (as the indexer step calls it): `topk_select` (ties to
    the earlier position) up to `SELECT_MAX_N` columns, and past that while the call holds at most
    `TOPK_FAST_TORCH_ABOVE` scores; `topk_indices` beyond (torch.topk's tie order). See the note at
    `SELECT_CHUNK`. Both -1 pad; neither waits on the host."""
    T, n = logits.shape
    if n <= SELECT_MAX_N or T * n <= TOPK_FAST_TORCH_ABOVE:
        return topk_select(logits, k, lengths=lengths, out=out)
    return topk_indices(logits, k, out=out)


__all__ = ["topk_indices", "topk_select", "topk_fast", "multi_rule", "multi_chunk", "topk_overlap", "SELECT_MAX_N",
           "SELECT_CHUNK", "TOPK_FAST_TORCH_ABOVE"]
