"""How fast can the decode's rows be gathered at all? The ceiling under the small-head decode targets (GPU).

Issue #13 states the 8-16-head decode targets against bytes at copy rate: 85 % of the byte floor for fp8_ds_mla,
85 % of copy for bf16. The rows are not a stream, though: each token reads its top-k (2048) rows scattered over
its own context, 656 bytes each (fp8_ds_mla: 512 e4m3, 16 of fp32 scales, 128 of bf16 rope) or 1152 (bf16).
`glm5lib.bench.bounds` timed the kernel's own load path with nothing after it (58-82 % of copy); this module asks
the question without the kernel: gathers of exactly those rows, with nothing after them, by five routes over three
index patterns, beside the machine's copy bandwidth in the same run.

Methods:
- `torch`: `index_select` of the rows into a buffer (PyTorch's CUDA gather). It writes what it reads, so its rate
  counts both directions, as the copy's does;
- `triton`: a pointer gather, one `[ROWS, row words]` tile per step (the next tile's loads issued before the
  current one is summed), over tile rows, warps and keys per program; reads only;
- `flat`: the pointer gather with the tile laid out as 16-byte vectors, vector v of a tile being vector v % n of
  row v // n (n vectors a row), so that no lane idles past a row's end; `flat-l2`: the same loads with PTX's
  `L2::256B` prefetch-size hint (inline PTX), as FlashMLA's gathers do;
- `stream` (the reference): the same number of bytes copied (`Tensor.copy_`, half read, half written): what a
  stream of this size reaches, against the 1 GiB copy that sets the rate;
- `tma` (sm_90+, Gluon): one TMA copy per row into a ring of `STAGES` tiles, one mbarrier per tile, the copies for
  tile i + STAGES issued as soon as tile i has been summed out of shared memory. A TMA box must be a power of two
  long, so a row is one `[1, 256]` box over a `[rows, row words]` view (int32 words for 656-byte rows, int64 for
  1152-byte ones): the words past the row are outside the tensor, filled with zeros and never read.

Patterns:
- `random`: the benchmark's indices (distinct uniform positions in each token's 32K context, `bench_decode_case`'s);
- `sorted`: the same rows in ascending order per token (more DRAM page locality, the same bytes);
- `contiguous`: a run of top-k consecutive rows per token (the same kernel on a stream: its own ceiling).

Every probe sums the words it gathered (int32, wrapping); `probe_sums` checks those sums against torch's on small
inputs (the Triton probe in the CPU interpreter; the TMA probe only on a GPU, which `main` does before timing).
Rates are GB/s of row bytes (twice that for `torch`) and % of the copy rate. The question they answer: is 85 % of
copy reachable for gathers of these rows at all, by any of these routes?
`glm5lib bench gather` or `python -m glm5lib.bench.gather --json OUT.json` (`scripts/device_kernels.sh gather`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from glm5lib.kernels import common  # noqa: F401  (before triton: the interpreter switch)
from glm5lib.kernels import naive
from glm5lib.kernels.common import num_sms

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:  # Triton builds without Gluon's Hopper parts leave the TMA probe out
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_TMA = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_TMA = False

TMA_BOX = 256  # words per TMA box: a power of two >= a row's words (164 int32 / 144 int64)
PATTERNS = ("random", "sorted", "contiguous")
METHODS = ("stream", "torch", "triton", "flat", "flat-l2", "tma")
# (rows per tile, warps, keys per program) for the pointer gather; (rows per tile, stages, warps, keys per program)
# for the TMA ring
# (per format: a [ROWS, row words rounded up to a power of two] int32 tile over 32 x warps threads, at most 64
# registers a thread, twice that with the prefetched tile: 656-byte rows take 256 words, 1152-byte rows 512)
TRITON_CONFIGS = {"fp8_ds_mla": [(8, 2, 64), (16, 2, 128), (16, 4, 64), (16, 4, 128), (32, 4, 256), (32, 8, 512)],
                  "bf16": [(8, 2, 64), (8, 4, 128), (16, 4, 64), (16, 4, 128), (16, 8, 256), (32, 8, 512)]}
# (vectors a tile, warps, keys per program) for the flat tile: 1024 vectors hold 24 rows of 656 bytes (41 vectors
# each, 96 % of the lanes busy) or 14 of 1152 (72 each, 98 %); 512 hold 12 / 7
FLAT_CONFIGS = {"fp8_ds_mla": [(512, 4, 120), (1024, 4, 120), (1024, 8, 240), (512, 2, 60)],
                "bf16": [(512, 4, 70), (1024, 4, 126), (1024, 8, 252), (512, 2, 63)]}
# (rows per tile, stages, warps, keys per program) for the TMA ring, per row width (False: int32 words, True:
# int64); STAGES * ROWS a power of two; a 656-byte row takes a 1 KB slot, a 1152-byte row 2 KB
# (the first H200 run, bc6397a, also timed 128 KB rings at one program per SM: 25-38 % of copy, half the 64 KB ones)
TMA_CONFIGS = {False: [(16, 4, 4, 512), (32, 2, 4, 512), (16, 4, 4, 256)],
               True: [(8, 4, 4, 512), (16, 2, 4, 512), (8, 4, 4, 256)]}


def row_bytes(kv_format: str) -> int:
    """Bytes of one cached row: 656 for fp8_ds_mla, 1152 for bf16."""
    return naive.FP8_DS_MLA_ROW_BYTES if kv_format == "fp8_ds_mla" else 2 * naive.D_QK


@triton.jit
def _ptr_gather_kernel(SRC, IDX, OUT, stride_row, stride_it, TOPK, KEYS_PER_PROG, W: tl.constexpr,
                       WP: tl.constexpr, ROWS: tl.constexpr):
    """Program (token t, split sp) sums the int32 words of rows IDX[t, sp*K : (sp+1)*K] (K = KEYS_PER_PROG)."""
    t = tl.program_id(0)
    sp = tl.program_id(1)
    k_start = sp * KEYS_PER_PROG
    k_end = tl.minimum(TOPK, k_start + KEYS_PER_PROG)
    idx_row = IDX + t.to(tl.int64) * stride_it
    offs = tl.arange(0, ROWS)
    cols = tl.arange(0, WP)
    cmask = cols < W  # a row is W words; the tile is a power of two wide
    acc = tl.zeros([ROWS, WP], tl.int32)
    # register prefetch: tile i + 1's loads are issued before tile i is summed
    k = k_start + offs
    # rows start on 16 bytes (656 and 1152 are multiples of 16): said explicitly, since Triton only infers it for
    # strides divisible by 16 words, and 16-byte loads need it
    r = tl.multiple_of(tl.load(idx_row + k, mask=k < k_end, other=0).to(tl.int64) * stride_row, 4)
    x = tl.load(SRC + r[:, None] + cols[None, :], mask=(k < k_end)[:, None] & cmask[None, :], other=0)
    for start in range(k_start + ROWS, k_end, ROWS):
        k = start + offs
        r = tl.multiple_of(tl.load(idx_row + k, mask=k < k_end, other=0).to(tl.int64) * stride_row, 4)
        y = tl.load(SRC + r[:, None] + cols[None, :], mask=(k < k_end)[:, None] & cmask[None, :], other=0)
        acc += x
        x = y
    acc += x
    tl.store(OUT + t * tl.num_programs(1) + sp, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def _l2_256_load(addr):
    """One 16-byte load with PTX's `L2::256B` prefetch-size hint (L2 fetches the whole 256-byte segment from
    DRAM; FlashMLA's gathers use it). Triton's `tl.load` has no such qualifier, hence the inline PTX. `addr`: int64
    byte addresses, 16-byte aligned, inside the tensor (the caller's masked lanes read row 0)."""
    w0, w1, w2, w3 = tl.inline_asm_elementwise(
        "ld.global.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [addr],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    return w0 + w1 + w2 + w3


@triton.jit
def _flat_tile(SRC, idx_row, start, k_end, stride_row, row, word, quad, ROWS: tl.constexpr, L2_HINT: tl.constexpr):
    """The flat tile of keys [start, start + ROWS): each vector's word sum, [V] (0 past k_end)."""
    k = start + row
    ok = (row < ROWS) & (k < k_end)
    r = tl.multiple_of(tl.load(idx_row + k, mask=ok, other=0).to(tl.int64) * stride_row, 4)
    if L2_HINT:
        return tl.where(ok, _l2_256_load(SRC.to(tl.int64, bitcast=True) + (r + word) * 4), 0)
    return tl.sum(tl.load(SRC + (r + word)[:, None] + quad[None, :], mask=ok[:, None], other=0), 1)


@triton.jit
def _flat_gather_kernel(SRC, IDX, OUT, stride_row, stride_it, TOPK, KEYS_PER_PROG, VPR: tl.constexpr,
                        V: tl.constexpr, ROWS: tl.constexpr, L2_HINT: tl.constexpr = False):
    """`_ptr_gather_kernel`'s contract with the tile laid out flat: V 16-byte vectors, vector v of the tile is
    vector v % VPR of row v // VPR (VPR vectors a row, ROWS = V // VPR rows a tile), so that every lane loads
    a vector of some row, where the [ROWS, power of two] tile leaves the lanes past a row's end idle (36 % of
    them for 656-byte rows). L2_HINT: every load through `_l2_256_load` (lanes past the program's keys read row
    0, index `other=0`, and are not summed)."""
    t = tl.program_id(0)
    sp = tl.program_id(1)
    k_start = sp * KEYS_PER_PROG
    k_end = tl.minimum(TOPK, k_start + KEYS_PER_PROG)
    idx_row = IDX + t.to(tl.int64) * stride_it
    v = tl.arange(0, V)
    row = v // VPR
    word = tl.multiple_of((v % VPR) * 4, 4)
    quad = tl.arange(0, 4)
    acc = tl.zeros([V], tl.int32)
    x = _flat_tile(SRC, idx_row, k_start, k_end, stride_row, row, word, quad, ROWS, L2_HINT)
    for start in range(k_start + ROWS, k_end, ROWS):
        y = _flat_tile(SRC, idx_row, start, k_end, stride_row, row, word, quad, ROWS, L2_HINT)
        acc += x
        x = y
    acc += x
    tl.store(OUT + t * tl.num_programs(1) + sp, tl.sum(acc, 0))


if HAVE_TMA:
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    _barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # the name after Triton 3.6
        @gluon.jit
        def _rows_view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            return buf.reinterpret(dtype, shape, layout)
    else:
        @gluon.jit
        def _rows_view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            return buf._reinterpret(dtype, shape, layout)

    @gluon.jit
    def _tma_issue(desc, idx_tile, tile, n_tiles, bar, ring, slot, ROWS: gl.constexpr, BOX: gl.constexpr,
                   WIDE: gl.constexpr):
        """TMA copies of tile `tile`'s ROWS rows into ring slot `slot`, completing on `bar` (nothing past the end)."""
        if tile < n_tiles:
            mbarrier.expect(bar, ROWS * BOX * (8 if WIDE else 4))
            for j in gl.static_range(ROWS):
                r = gl.load(idx_tile + tile * ROWS + j)
                _tma_load(desc, [r, 0], bar, ring.index(slot * ROWS + j))

    @gluon.jit
    def _tma_gather_kernel(desc, IDX, OUT, stride_it, TOPK, KEYS_PER_PROG, ROWS: gl.constexpr,
                           STAGES: gl.constexpr, BOX: gl.constexpr, WIDE: gl.constexpr, num_warps: gl.constexpr):
        """`_ptr_gather_kernel`'s contract (KEYS_PER_PROG a multiple of ROWS) with rows landing by TMA in a ring."""
        t = gl.program_id(0)
        sp = gl.program_id(1)
        k_start = sp * KEYS_PER_PROG
        n_tiles = gl.cdiv(gl.minimum(TOPK - k_start, KEYS_PER_PROG), ROWS)
        idx_tile = IDX + t.to(gl.int64) * stride_it + k_start
        ring = gl.allocate_shared_memory(desc.dtype, [STAGES * ROWS, 1, BOX], desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        for s in gl.static_range(STAGES):
            _tma_issue(desc, idx_tile, s, n_tiles, bars.index(s), ring, s, ROWS, BOX, WIDE)
        # the same bytes as [rows, BOX] for the loads (a TMA destination is [1, BOX]; a 2-D layout must be read 2-D)
        LS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=64 if WIDE else 32, rank=2)
        flat = _rows_view(ring, desc.dtype, [STAGES * ROWS, BOX], LS)
        L: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
        acc = gl.zeros([ROWS, BOX], gl.int32, L)
        for i0 in range(0, n_tiles, STAGES):  # unrolled by STAGES: a slot's slice needs a constant start
            for s in gl.static_range(STAGES):
                i = i0 + s
                if i < n_tiles:
                    mbarrier.wait(bars.index(s), (i0 // STAGES) & 1)
                    x = flat.slice(s * ROWS, ROWS).load(L)
                    if WIDE:  # int64 words: both halves, so the sum is the int32 words' sum
                        acc += x.to(gl.int32) + (x >> 32).to(gl.int32)
                    else:
                        acc += x
                    _barrier()  # every warp has read slot s before it is refilled
                    _tma_issue(desc, idx_tile, i + STAGES, n_tiles, bars.index(s), ring, s, ROWS, BOX, WIDE)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        gl.store(OUT + t * gl.num_programs(1) + sp, gl.sum(gl.sum(acc, 1), 0))


def row_words(cache: torch.Tensor, wide: bool = False) -> torch.Tensor:
    """The cache's rows as a [rows, words] view: int32 words, or int64 with `wide` (bf16 rows for the TMA box)."""
    flat, _ = naive.kv_row_view(cache)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return flat.view(torch.int64 if wide else torch.int32)


def run_triton(words: torch.Tensor, idx: torch.Tensor, cfg, out=None) -> torch.Tensor:
    """Pointer gather of rows `idx` [T, topk] of `words` (int32 [rows, W], W a multiple of 4 words, 16-byte
    aligned); per (token, split) word sums."""
    if words.stride(0) % 4 or words.data_ptr() % 16:
        raise ValueError("the pointer probe loads 16 bytes at a time: rows must start on 16 bytes")
    rows, warps, per = cfg
    T, topk = idx.shape
    splits = triton.cdiv(topk, per)
    out = torch.empty(T * splits, dtype=torch.int32, device=idx.device) if out is None else out
    W = words.shape[1]
    _ptr_gather_kernel[(T, splits)](words, idx, out, words.stride(0), idx.stride(0), topk, per, W=W,
                                    WP=triton.next_power_of_2(W), ROWS=rows, num_warps=warps)
    return out


def run_flat_l2(words: torch.Tensor, idx: torch.Tensor, cfg, out=None) -> torch.Tensor:
    """`run_flat` with the `L2::256B` hint on every load (GPU only: inline PTX does not run in the interpreter)."""
    return run_flat(words, idx, cfg, out, l2_hint=True)


def run_flat(words: torch.Tensor, idx: torch.Tensor, cfg, out=None, l2_hint: bool = False) -> torch.Tensor:
    """`run_triton`'s contract through the flat tile; cfg (vectors a tile, warps, keys per program), keys per
    program a multiple of the rows a tile holds (V // vectors a row)."""
    vecs, warps, per = cfg
    T, topk = idx.shape
    vpr = words.shape[1] // 4
    rows = vecs // vpr
    if words.shape[1] % 4 or words.stride(0) % 4 or words.data_ptr() % 16 or rows < 1 or per % rows:
        raise ValueError(f"flat probe: rows of {words.shape[1]} words in tiles of {vecs} vectors "
                         f"({rows} rows) over {per} keys a program")
    splits = triton.cdiv(topk, per)
    out = torch.empty(T * splits, dtype=torch.int32, device=idx.device) if out is None else out
    _flat_gather_kernel[(T, splits)](words, idx, out, words.stride(0), idx.stride(0), topk, per, VPR=vpr, V=vecs,
                                     ROWS=rows, L2_HINT=l2_hint, num_warps=warps)
    return out


def tma_descriptor(words: torch.Tensor):
    """A [1, TMA_BOX] box over the [rows, W] view (no swizzle: a 1 KB / 2 KB box row is wider than 128 bytes)."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=words.element_size() * 8, rank=2)
    return TensorDescriptor(words, list(words.shape), list(words.stride()), [1, TMA_BOX], layout)


def run_tma(words: torch.Tensor, idx: torch.Tensor, cfg, desc=None, out=None) -> torch.Tensor:
    """`run_triton`'s contract through TMA (sm_90+); `words` int32 or int64 [rows, W <= TMA_BOX]."""
    rows, stages, warps, per = cfg
    T, topk = idx.shape
    if per % rows or topk % rows or words.shape[1] > TMA_BOX:  # every tile whole: no index read past a token's
        raise ValueError(f"TMA probe: top-k {topk} or keys per program {per} not a multiple of {rows} rows, or rows "
                         f"wider than {TMA_BOX} words ({words.shape[1]})")
    splits = triton.cdiv(topk, per)
    out = torch.empty(T * splits, dtype=torch.int32, device=idx.device) if out is None else out
    desc = tma_descriptor(words) if desc is None else desc
    _tma_gather_kernel[(T, splits)](desc, idx, out, idx.stride(0), topk, per, ROWS=rows, STAGES=stages,
                                    BOX=TMA_BOX, WIDE=words.dtype == torch.int64, num_warps=warps)
    return out


def aot_compile_tma(cfg, wide: bool = False, arch: int = 90):
    """Compile one TMA probe config for `sm_<arch>` without a GPU (tests: it builds, within shared memory)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    rows, stages, warps, _ = cfg
    fn = _tma_gather_kernel
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=64 if wide else 32, rank=2)
    consts = {"ROWS": rows, "STAGES": stages, "BOX": TMA_BOX, "WIDE": wide, "num_warps": warps}
    types = {"desc": f"tensordesc<{'i64' if wide else 'i32'}[1, {TMA_BOX}],{layout!r}>", "IDX": "*i32", "OUT": "*i32"}
    sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
    c = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    return triton.compile(GluonASTSource(fn, sig, c, {}), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps})


def torch_sums(words32: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per-token sums of the int32 words of rows `idx`, wrapped to int32 as the probes' sums are."""
    # row sums first, accumulated in int64 without an int64 copy of the cache: O(rows) memory, not O(gathered bytes)
    s = words32.sum(1, dtype=torch.int64)[idx.long()].sum(1)
    return ((s + 2**31) % 2**32 - 2**31).to(torch.int32)


def per_token(out: torch.Tensor, T: int) -> torch.Tensor:
    """A probe's per-(token, split) sums folded per token (int32 wrap-around, as `torch_sums`)."""
    s = out.view(T, -1).long().sum(1)
    return ((s + 2**31) % 2**32 - 2**31).to(torch.int32)


def make_patterns(idx: torch.Tensor, base: torch.Tensor, ctx: int, shift: int = 0) -> dict[str, torch.Tensor]:
    """{pattern: indices} from one random set `idx` [T, topk] (rows base[t] + [0, ctx)); `shift` moves the
    contiguous run so that rotated sets do not reread the same rows."""
    topk = idx.shape[1]
    start = shift % max(ctx - topk + 1, 1)
    run = torch.arange(start, start + topk, device=idx.device, dtype=torch.int32)
    return {"random": idx, "sorted": idx.sort(dim=1).values.contiguous(), "contiguous": base[:, None] + run[None, :]}


def stream_fns(nbytes: int, reps: int) -> list:
    """Calls that copy `nbytes` / 2 contiguous bytes (so `nbytes` move, half read, half written), one per rotated
    source buffer: the stream reference for a gather of `nbytes`."""
    n = nbytes // 4
    half = torch.empty(n // 2, dtype=torch.int32, device="cuda")
    return [lambda b=torch.empty(n, dtype=torch.int32, device="cuda"): half.copy_(b[: n // 2]) for _ in range(reps)]


def measure(B: int, kv_format: str, ceil: dict, ctx: int = 32768, topk: int = 2048, tma_ok: bool = True) -> list:
    """Every route x pattern x config for B decode tokens of one cache format (GPU): a row each, with its time,
    GB/s and % of copy, or its error; each probe's sums are checked against torch's first."""
    from glm5lib.bench import kernels as bench

    _, cache, base = bench._make_decode(B, 8, ctx, topk, kv_format)
    row = row_bytes(kv_format)
    words32 = row_words(cache)
    wide = words32.shape[1] > TMA_BOX
    words_tma = row_words(cache, wide) if tma_ok else None
    reps = bench._rotations(B * topk * row)
    sets = [make_patterns(bench._rand_indices(B, ctx, topk, base), base, ctx, shift=j * topk) for j in range(reps)]
    gathered = B * topk * row
    rows = []

    def add(method, pattern, cfg, fns, check=None, traffic=1):
        res = {"method": method, "pattern": pattern, "config": cfg, "B": B, "kv_format": kv_format,
               "row_bytes": row, "gathered_bytes": gathered}
        try:
            if check is not None:
                got, want = check()
                res["sums_match"] = bool(torch.equal(got, want))
                if not res["sums_match"]:
                    raise AssertionError("the probe's word sums differ from torch's")
            ms = bench._graph_ms(fns)
            gbs = traffic * gathered / ms / 1e6
            res.update(us=ms * 1e3, GBps=gbs, pct_copy=100 * gbs / ceil["copy_GBps"])
        except Exception as exc:  # noqa: BLE001  (one failing probe is a row, not a lost run)
            res["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(res)
        shown = f"{res['us']:7.1f} us {res['GBps']:6.0f} GB/s {res['pct_copy']:4.0f}% copy" if "us" in res else \
            res["error"]
        print(f"{kv_format:10s} B{B:<4d} {method:6s} {pattern:10s} {str(cfg):22s} {shown}", flush=True)
        return res

    # the same number of bytes as a stream: copied, half read, half written (a torch.sum over them, timed at
    # d9c2d7d, reached 14-16 %: torch's int32 sum is no reference)
    add("stream", "contiguous", "copy", stream_fns(gathered, reps))
    for pattern in PATTERNS:
        ids = [s[pattern] for s in sets]
        want = torch_sums(words32, ids[0])
        buf = torch.empty(B * topk, words32.shape[1], dtype=torch.int32, device="cuda")
        add("torch", pattern, "index_select", [lambda i=i: torch.index_select(words32, 0, i.view(-1), out=buf)
                                                for i in ids], traffic=2)
        for cfg in TRITON_CONFIGS[kv_format]:
            out = torch.empty(B * triton.cdiv(topk, cfg[2]), dtype=torch.int32, device="cuda")
            add("triton", pattern, cfg, [lambda i=i, c=cfg, o=out: run_triton(words32, i, c, o) for i in ids],
                check=lambda c=cfg: (per_token(run_triton(words32, ids[0], c), B), want))
        for cfg in FLAT_CONFIGS[kv_format]:
            out = torch.empty(B * triton.cdiv(topk, cfg[2]), dtype=torch.int32, device="cuda")
            add("flat", pattern, cfg, [lambda i=i, c=cfg, o=out: run_flat(words32, i, c, o) for i in ids],
                check=lambda c=cfg: (per_token(run_flat(words32, ids[0], c), B), want))
            add("flat-l2", pattern, cfg, [lambda i=i, c=cfg, o=out: run_flat_l2(words32, i, c, o) for i in ids],
                check=lambda c=cfg: (per_token(run_flat_l2(words32, ids[0], c), B), want))
        if words_tma is None:
            continue
        desc = tma_descriptor(words_tma)
        for cfg in TMA_CONFIGS[wide]:
            out = torch.empty(B * triton.cdiv(topk, cfg[3]), dtype=torch.int32, device="cuda")
            add("tma", pattern, cfg, [lambda i=i, c=cfg, o=out: run_tma(words_tma, i, c, desc, o) for i in ids],
                check=lambda c=cfg: (per_token(run_tma(words_tma, ids[0], c, desc), B), want))
    del cache
    torch.cuda.empty_cache()
    return rows


# what `glm5lib bench` times as the gather ceiling beside the decode cases: the fastest routes of the sweep above
# (H200, d9c2d7d: `outputs/bench/gather_h200.json`; the L2 hint and `index_select` lose, TMA per row too)
BENCH_ROUTES = {"fp8_ds_mla": [("flat", (1024, 8, 240)), ("flat", (512, 4, 120)), ("triton", (8, 2, 64)),
                               ("triton", (16, 4, 128))],
                "bf16": [("flat", (512, 2, 63)), ("flat", (1024, 4, 126)), ("triton", (8, 4, 128)),
                         ("triton", (16, 8, 256))]}


def _route_rows(case: str, T: int, fmt: str, words: torch.Tensor, ids: list, ceil: dict, time_fn) -> list[dict]:
    """The best of `BENCH_ROUTES[fmt]` over the index sets `ids` (each checked against torch's sums first) as one
    "best-gather" row, plus an error row per route whose sums were wrong."""
    from glm5lib.bench import kernels as bench

    topk = ids[0].shape[1]
    row = row_bytes(fmt)
    gathered = T * topk * row
    want = torch_sums(words, ids[0])
    runs = {"flat": run_flat, "triton": run_triton}
    out, timed = [], []
    for method, cfg in BENCH_ROUTES[fmt]:
        buf = torch.empty(T * triton.cdiv(topk, cfg[-1]), dtype=torch.int32, device=words.device)
        try:
            if not torch.equal(per_token(runs[method](words, ids[0], cfg), T), want):
                raise AssertionError("the probe's word sums differ from torch's")
        except Exception as exc:  # noqa: BLE001  (a failing route is an error row; the others still count)
            out.append({"kind": "gather-ceiling", "impl": f"{method} {cfg}", "case": case, "T": T, "H": 0,
                        "topk": topk, "kv_format": fmt, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        timed.append((time_fn([lambda i=i, m=method, c=cfg, o=buf: runs[m](words, i, c, o) for i in ids]),
                      f"{method} {cfg}"))
    if timed:
        ms, name = min(timed)
        out.append(bench._row("gather-ceiling", "best-gather", T, 0, topk, fmt, ms, 0, gathered, ceil,
                              {"case": case, "route": name, "routes_us": {k: m * 1e3 for m, k in timed}}))
    return out


def ceiling_rows(ceil: dict, batches=(32, 128), ctx: int = 32768, topk: int = 2048, s_q: int = 4096,
                 formats=("fp8_ds_mla", "bf16")) -> list[dict]:
    """`glm5lib bench`'s gather-ceiling rows (`bench.kernels._row`s, H 0: no heads, gathers only; `case` decode
    or prefill), the fastest of `BENCH_ROUTES` (`impl` "best-gather") on the benchmark's own shapes:

    - decode, per cache format and batch B: B tokens, each reading top-k random rows of its own 32K context (the
      rows come from DRAM), timed as the decode kernel is (CUDA graph over rotated index sets); beside it the copy
      of the same number of bytes (`impl` "stream");
    - prefill, per cache format: s_q tokens reading top-k random rows each of one 32K-row sequence (21-38 MB:
      the rows come from L2), timed as the prefill kernel is.

    The decode targets at 8-16 and 64-128 heads and the fp8 prefill targets read their ceiling from these."""
    from glm5lib.bench import kernels as bench

    out = []
    for fmt in formats:
        row = row_bytes(fmt)
        for B in batches:
            _, cache, base = bench._make_decode(B, 8, ctx, topk, fmt)
            words = row_words(cache)
            gathered = B * topk * row
            ids = [bench._rand_indices(B, ctx, topk, base) for _ in range(bench._rotations(gathered))]
            out += _route_rows("decode", B, fmt, words, ids, ceil, bench._graph_ms)
            del cache, words
            ms = bench._graph_ms(stream_fns(gathered, len(ids)))
            out.append(bench._row("gather-ceiling", "stream", B, 0, topk, fmt, ms, 0, gathered, ceil,
                                  {"case": "decode", "route": "Tensor.copy_ of the same bytes (half read, half written)"}))
            torch.cuda.empty_cache()
        kv = torch.randn(ctx, naive.D_QK, device="cuda", dtype=torch.bfloat16)
        words = row_words(naive.quantize_fp8_ds_mla(kv) if fmt == "fp8_ds_mla" else kv)
        ids = [bench._rand_indices(s_q, ctx, topk)]
        out += _route_rows("prefill", s_q, fmt, words, ids, ceil, lambda fns: bench._median_ms(fns[0]))
        del kv, words, ids
        torch.cuda.empty_cache()
    for r in out:
        print(f"  gather-ceiling {r['case']:8s} {r['impl']:12s} T{r['T']:<5d} {r['kv_format']:10s} "
              + (f"{r['us']:9.1f} us {r['pct_bw']:5.1f} % of copy  {r.get('route', '')}" if "error" not in r
                 else r["error"]), flush=True)
    return out


def best(rows: list, **match) -> dict | None:
    """The fastest row (of those without an error) that matches every `key=value`."""
    ok = [r for r in rows if "us" in r and all(r.get(k) == v for k, v in match.items())]
    return max(ok, key=lambda r: r["GBps"]) if ok else None


def summary(rows: list) -> list[dict]:
    """Per (format, B, pattern): the best rate of each method and overall, in % of copy."""
    out = []
    for key in sorted({(r["kv_format"], r["B"], r["pattern"]) for r in rows}):
        fmt, B, pattern = key
        line = {"kv_format": fmt, "B": B, "pattern": pattern}
        for m in METHODS:
            b = best(rows, kv_format=fmt, B=B, pattern=pattern, method=m)
            line[m] = None if b is None else {"pct_copy": b["pct_copy"], "config": b["config"], "us": b["us"]}
        out.append(line)
    return out


def plot(json_path, png_path):
    """Bars: % of the copy rate per method on random rows (the stream: the same bytes copied), per cache format and
    batch, with the 85 % goal of the decode targets drawn across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from glm5lib.plotting import save_figure

    res = json.loads(open(json_path).read()) if not isinstance(json_path, dict) else json_path
    groups = sorted({(r["kv_format"], r["B"]) for r in res["rows"]}, key=lambda k: (k[0] != "fp8_ds_mla", k[1]))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(METHODS)
    for j, m in enumerate(METHODS):
        vals = []
        for fmt, B in groups:
            b = best(res["rows"], kv_format=fmt, B=B, method=m,
                     pattern="contiguous" if m == "stream" else "random")
            vals.append(b["pct_copy"] if b else 0.0)
        label = "stream (same bytes, copied)" if m == "stream" else f"{m} (random rows)"
        bars = ax.bar([i + (j - (len(METHODS) - 1) / 2) * width for i in range(len(groups))], vals, width,
                      label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.axhline(85, color="k", linestyle="--", linewidth=1, label="85 % goal")
    ax.set_xticks(range(len(groups)), [f"{fmt} B{B}\n{row_bytes(fmt)} "
                                       f"B rows" for fmt, B in groups])
    ax.set_ylabel("% of the 1 GiB copy rate")
    ax.set_ylim(0, 125)
    ax.set_title(f"decode rows gathered with nothing after them ({res.get('gpu', '?')}, {res.get('commit') or '?'})")
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout()
    return save_figure(fig, png_path)


def main(argv=None) -> int:
    """`python -m glm5lib.bench.gather --json OUT.json` (also `glm5lib bench gather`): every method, pattern and
    config on both cache formats, the summary printed, the JSON and a PNG beside it (neither replaced unless
    --force; written only once everything was measured)."""
    from glm5lib.errors import UserError
    from glm5lib.files import check_output

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="where the results go (a PNG of the same stem beside it)")
    ap.add_argument("--force", action="store_true", help="replace an existing JSON / PNG")
    ap.add_argument("--commit", default=None, help="the commit the code came from (default: $GLM5LIB_COMMIT, git)")
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 32], help="decode batch sizes (default 128 32)")
    args = ap.parse_args(argv)
    try:
        out = check_output(args.json, force=args.force)
        png = check_output(out.with_suffix(".png"), force=args.force)
        if not torch.cuda.is_available():
            raise UserError("the gather probes time kernels on a CUDA GPU (none visible)", exit_code=2)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    from glm5lib.bench import kernels as bench

    tma_ok = HAVE_TMA and torch.cuda.get_device_capability()[0] >= 9
    ceil = bench.measure_ceilings()
    print(f"copy {ceil['copy_GBps']:.0f} GB/s (read + write of 1 GiB)", flush=True)
    rows = []
    for fmt in ("fp8_ds_mla", "bf16"):
        for B in args.batch:
            rows += measure(B, fmt, ceil, tma_ok=tma_ok)
    summ = summary(rows)
    for s in summ:
        print(f"best {s['kv_format']:10s} B{s['B']:<4d} {s['pattern']:10s} " + " | ".join(
            f"{m} {s[m]['pct_copy']:4.0f}%" if s[m] else f"{m} -" for m in METHODS), flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "sms": num_sms(torch.device("cuda")),
           "commit": bench.source_commit(args.commit), "ceilings": ceil, "rows": rows, "summary": summ}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, out)
    print(f"wrote {out} and {plot(res, png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
