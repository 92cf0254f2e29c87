"""Numeric case matrix for the kernels, in the style of FlashMLA's tests (`TestParam` + explicit case groups).

Each case draws fresh random data, poisons the output (NaN), runs the kernel and its fp32 reference on the
same (already rounded) inputs and reports max abs error, relative error `||o - r|| / ||r||`, and FlashMLA's
cosine difference `1 - 2 <o, r> / (|o|^2 + |r|^2)`.

Tolerances (why):
- bf16/fp16 inputs on the GPU: the kernel's only roundings are P cast to bf16 before the P V product and the
  bf16 output (2^-9 relative each); QK^T and all accumulators are fp32 on exact bf16 products. So the
  relative error sits near 3e-3: we allow rel <= 1e-2, cos diff <= 1e-4, |lse - ref| <= 1e-3 (lse is fp32
  throughout). fp8_ds_mla: the reference dequantizes the same bytes, so the bound is the same.
- fp32 under the Triton interpreter (CPU): numpy fp32 dots, so rel <= 1e-5 and lse <= 1e-4.
- Structural checks are exact: every output written (no NaN left from the poison), rows with no valid key
  give zeros and lse = -inf, and indexer masks (-inf positions) equal the reference's.

`python -m glm5lib.kernels.checks [--profile ci|full] [--sanitize]` runs the matrix and prints a table;
`--sanitize` runs only the invalid-index cases (small, for `compute-sanitizer --tool memcheck`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field

import torch

from glm5lib.kernels import naive
from glm5lib.kernels.common import fp8_hw
from glm5lib.kernels.indexer import indexer_logits
from glm5lib.kernels.naive import cos_diff  # lives in naive (cheap to import); checks.cos_diff stays valid
from glm5lib.kernels.mla import dispatched, sparse_mla
from glm5lib.kernels.topk import topk_indices, topk_overlap
from glm5lib.model.spec import GLM5Config

SM_SCALE = GLM5Config.glm5().softmax_scale  # 1/16 = (192 + 64) ** -0.5


@dataclass
class MLACase:
    """One sparse-MLA case. `invalid` names how indices are spoiled: none | neg | dup | oob | allinv | mixed."""

    T: int
    H: int
    topk: int
    n_kv: int
    kv_format: str = "bf16"
    invalid: str = "none"
    paged: int = 0  # block size of a paged view with a padded block stride (0 = flat [N, row])
    group: str = "regular"

    @property
    def name(self) -> str:
        p = f"-paged{self.paged}" if self.paged else ""
        return f"{self.group}:T{self.T}-H{self.H}-K{self.topk}-N{self.n_kv}-{self.kv_format}-{self.invalid}{p}"


@dataclass
class Result:
    name: str
    ok: bool
    max_abs: float
    rel: float
    cos_diff: float
    lse_abs: float
    notes: list[str] = field(default_factory=list)
    config: str | None = None  # sparse-MLA cases: what the dispatcher ran (`mla.dispatched`; evidence reads it)


def make_indices(T: int, topk: int, n_kv: int, invalid: str, gen: torch.Generator, device) -> torch.Tensor:
    """int32 [T, topk] distinct random rows, then spoiled as `invalid` asks."""
    idx = torch.stack([torch.randperm(n_kv, generator=gen)[:topk] if topk <= n_kv else
                       torch.randint(0, n_kv, (topk,), generator=gen) for _ in range(T)]).to(torch.int32)
    if invalid in ("neg", "mixed"):
        m = torch.rand(T, topk, generator=gen) < 0.3
        idx[m] = -1
    if invalid in ("oob", "mixed"):
        m = torch.rand(T, topk, generator=gen) < 0.2
        big = torch.tensor([n_kv, n_kv + 1, 2**31 - 1, -7, -(2**31)], dtype=torch.int32)
        idx[m] = big[torch.randint(0, len(big), (int(m.sum()),), generator=gen)]
    if invalid in ("dup", "mixed"):
        half = max(1, topk // 2)
        idx[:, half:] = idx[:, : topk - half]  # every kept row twice
    if invalid == "allinv":
        idx[:] = -1
        if T > 1:  # one row of out-of-range values too
            idx[T - 1] = n_kv + torch.arange(topk, dtype=torch.int32)
    if invalid == "mixed" and T > 1:
        idx[0] = -1  # an all-invalid row inside a normal batch
    return idx.to(device)


def _tol(dtype: torch.dtype) -> tuple[float, float, float]:
    """(rel, cos diff, lse abs) allowed for this compute dtype; see the module docstring."""
    if dtype == torch.float32:
        return 1e-5, 1e-9, 1e-4
    return 1e-2, 1e-4, 1e-3


def run_mla_case(case: MLACase, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Result:
    gen = torch.Generator().manual_seed(seed)
    T, H = case.T, case.H
    q = torch.randn(T, H, naive.D_QK, generator=gen).to(dtype).to(device)
    kv = torch.randn(case.n_kv, naive.D_QK, generator=gen)
    if case.kv_format == "fp8_ds_mla":
        rows = naive.quantize_fp8_ds_mla(kv).to(device)
    else:
        rows = kv.to(dtype).to(device)
    cache = rows
    if case.paged:
        # paged view [nb, bs, row] whose block stride is bs + 3 rows; physical row = blk * (bs+3) + off
        bs = case.paged
        nb = math.ceil(case.n_kv / bs)
        stride_rows = bs + 3
        storage = torch.full((nb * stride_rows, rows.shape[1]), 0, dtype=rows.dtype, device=device)
        perm = torch.arange(nb * bs, device=device)
        phys = (perm // bs) * stride_rows + perm % bs
        storage[phys[: case.n_kv]] = rows
        if rows.dtype.is_floating_point:
            pad = torch.ones(storage.shape[0], dtype=torch.bool, device=device)
            pad[phys[: case.n_kv]] = False
            storage[pad] = float("nan")  # padding rows must never be read as keys
        cache = storage.view(nb, stride_rows, -1)[:, :bs]
        logical = make_indices(T, case.topk, case.n_kv, case.invalid, gen, device)
        ok = (logical >= 0) & (logical < case.n_kv)
        idx = torch.where(ok, phys[logical.clamp(0, case.n_kv - 1).long()].to(torch.int32), logical)
        # out-of-range logical values must stay out of range physically
        idx = torch.where(ok | (logical < 0), idx, torch.full_like(idx, nb * stride_rows + 5))
    else:
        idx = make_indices(T, case.topk, case.n_kv, case.invalid, gen, device)
    out = torch.full((T, H, naive.D_NOPE), float("nan"), dtype=dtype, device=device)
    o, lse = sparse_mla(q, cache, idx, SM_SCALE, kv_format=case.kv_format if case.kv_format != "bf16" or dtype != torch.float32 else "fp32", out=out)
    ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx, SM_SCALE, kv_format=case.kv_format)
    o32 = o.float()
    notes = []
    ok = True
    if torch.isnan(o32).any():
        ok = False
        notes.append("unwritten/NaN output")
    none_valid = ~(((idx >= 0) & (idx < naive.kv_row_view(cache)[1])).any(dim=1))
    if none_valid.any():
        if not torch.all(o32[none_valid] == 0) or not torch.all(torch.isneginf(lse[none_valid])):
            ok = False
            notes.append("no-key rows not zero / -inf")
    diff = (o32 - ro).nan_to_num(nan=1e9)
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    rnorm = float(ro.norm())
    rel = float(diff.norm() / rnorm) if rnorm > 0 else float(diff.norm())
    cd = cos_diff(o32.nan_to_num(nan=1e9), ro)
    fin = torch.isfinite(rlse)
    if not torch.equal(fin, torch.isfinite(lse)):
        ok = False
        notes.append("lse finiteness differs")
    lse_abs = float((lse[fin] - rlse[fin]).abs().max()) if fin.any() else 0.0
    rel_tol, cos_tol, lse_tol = _tol(dtype)
    if rel > rel_tol or cd > cos_tol or lse_abs > lse_tol:
        ok = False
        notes.append(f"tolerance (rel {rel_tol}, cos {cos_tol}, lse {lse_tol})")
    _, ran = dispatched(T, H, case.kv_format, torch.device(device), dtype)
    return Result(case.name, ok, max_abs, rel, cd, lse_abs, notes, ran)


def mla_cases(profile: str) -> list[MLACase]:
    """The case groups. `ci`: tiny sizes for the interpreter; `full`: real sizes for the GPU."""
    cases: list[MLACase] = []
    if profile == "ci":
        for H in (1, 8, 16, 64, 128):
            cases.append(MLACase(T=2, H=H, topk=64, n_kv=200))
        cases += [
            MLACase(T=2, H=8, topk=128, n_kv=300, kv_format="fp8_ds_mla"),
            MLACase(T=3, H=5, topk=100, n_kv=150, group="irregular"),
            MLACase(T=3, H=16, topk=37, n_kv=90, kv_format="fp8_ds_mla", group="irregular"),
            MLACase(T=3, H=8, topk=96, n_kv=120, invalid="mixed", group="invalid"),
            MLACase(T=2, H=16, topk=64, n_kv=100, invalid="allinv", group="invalid"),
            MLACase(T=3, H=8, topk=80, n_kv=100, kv_format="fp8_ds_mla", invalid="mixed", group="invalid"),
            MLACase(T=2, H=8, topk=64, n_kv=130, invalid="oob", paged=16, group="paged"),
            MLACase(T=2, H=4, topk=64, n_kv=130, kv_format="fp8_ds_mla", invalid="dup", paged=64, group="paged"),
        ]
        return cases
    n_kv = 32768
    for fmt in ("bf16", "fp8_ds_mla"):
        for H in (1, 8, 16, 64, 128):
            for topk in (64, 128, 2048):
                for T in (1, 64):
                    cases.append(MLACase(T=T, H=H, topk=topk, n_kv=n_kv, kv_format=fmt))
        cases += [
            MLACase(T=37, H=13, topk=1000, n_kv=5000, kv_format=fmt, group="irregular"),
            MLACase(T=129, H=100, topk=2047, n_kv=n_kv, kv_format=fmt, group="irregular"),
            MLACase(T=300, H=64, topk=2048, n_kv=n_kv, kv_format=fmt, group="prefill"),
            MLACase(T=600, H=8, topk=2048, n_kv=n_kv, kv_format=fmt, group="prefill"),
            MLACase(T=700, H=16, topk=1500, n_kv=n_kv, kv_format=fmt, invalid="mixed", group="prefill"),
            MLACase(T=256, H=128, topk=2048, n_kv=n_kv, kv_format=fmt, group="prefill"),
        ]
        for inv in ("neg", "dup", "oob", "allinv", "mixed"):
            for H in (8, 64, 128):
                cases.append(MLACase(T=33, H=H, topk=2048, n_kv=4096, kv_format=fmt, invalid=inv, group="invalid"))
        # prefill-sized batches for the Gluon kernels on sm_90 (their split plans at one split; mla.gluon_large_shape)
        for inv, H in (("mixed", 64), ("oob", 128), ("mixed", 40)):
            cases.append(MLACase(T=160, H=H, topk=2048, n_kv=4096, kv_format=fmt, invalid=inv, group="invalid"))
        # below one wave: the dq kernel's balanced schedule on sm_90 (`mla_gluon_large.balanced_plan`: 64 heads at 70
        # tokens, 128 at 35, where the split plan leaves about half the SMs idle); bf16 rows: the ping-pong kernel
        for inv, T, H in (("mixed", 70, 64), ("oob", 35, 128)):
            cases.append(MLACase(T=T, H=H, topk=2048, n_kv=4096, kv_format=fmt, invalid=inv, group="invalid"))
        cases.append(MLACase(T=16, H=16, topk=2048, n_kv=20000, kv_format=fmt, invalid="mixed", paged=64, group="paged"))
        # enough tokens for the fp8-cache kernel on sm_90 (mla.FP8MMA_MIN_T): paged, and an odd head count and top-k
        cases.append(MLACase(T=40, H=8, topk=1000, n_kv=20000, kv_format=fmt, invalid="mixed", paged=64, group="paged"))
        cases.append(MLACase(T=45, H=5, topk=999, n_kv=3000, kv_format=fmt, group="irregular"))
        # and enough for one split (each program a token's whole list: the fp8-cache kernel's 64-key tiles), paged,
        # with a last tile mostly past the top-k
        cases.append(MLACase(T=300, H=5, topk=999, n_kv=20000, kv_format=fmt, invalid="mixed", paged=64,
                             group="paged"))
        cases.append(MLACase(T=130, H=128, topk=1000, n_kv=20000, kv_format=fmt, invalid="mixed", paged=64,
                             group="paged"))
    return cases


def sanitize_cases() -> list[MLACase]:
    """Invalid-index cases for compute-sanitizer (small: memcheck slows kernels 100x)."""
    out = []
    for fmt in ("bf16", "fp8_ds_mla"):
        for inv in ("oob", "allinv", "mixed"):
            for H in (8, 128):
                out.append(MLACase(T=4, H=H, topk=2048, n_kv=3000, kv_format=fmt, invalid=inv, group="sanitize"))
        out.append(MLACase(T=4, H=16, topk=512, n_kv=1000, kv_format=fmt, invalid="mixed", paged=64, group="sanitize"))
        # enough tokens for the prefill configs (4 x 132 SMs on the H200) and for the Gluon kernels on sm_90
        out.append(MLACase(T=600, H=16, topk=512, n_kv=3000, kv_format=fmt, invalid="mixed", group="sanitize"))
        out.append(MLACase(T=130, H=128, topk=2048, n_kv=3000, kv_format=fmt, invalid="mixed", group="sanitize"))
        out.append(MLACase(T=130, H=64, topk=1000, n_kv=3000, kv_format=fmt, invalid="oob", paged=64,
                           group="sanitize"))
        # and for the fp8-cache kernel (1-16 heads, >= mla.FP8MMA_MIN_T tokens; 12 heads: two head groups, one of them
        # part padding)
        out.append(MLACase(T=40, H=8, topk=2048, n_kv=3000, kv_format=fmt, invalid="mixed", group="sanitize"))
        out.append(MLACase(T=36, H=3, topk=1000, n_kv=3000, kv_format=fmt, invalid="oob", paged=64, group="sanitize"))
        out.append(MLACase(T=33, H=12, topk=777, n_kv=3000, kv_format=fmt, invalid="mixed", paged=64,
                           group="sanitize"))
        # and its balanced schedule (more tokens than the H200's 528 slots at one split, 8 heads: tokens cut
        # between programs and merged)
        out.append(MLACase(T=600, H=8, topk=512, n_kv=3000, kv_format=fmt, invalid="mixed", group="sanitize"))
    return out


# ----------------------------------------------------------------------------------------------------------
# Indexer
# ----------------------------------------------------------------------------------------------------------


@dataclass
class IndexerCase:
    mode: str  # ragged | paged
    T: int  # ragged: total tokens over the requests; paged: requests
    HI: int
    n: int  # ragged: tokens per request; paged: max context
    k_format: str = "bf16"
    next_n: int = 1
    block_size: int = 64
    topk: int = 2048
    q_fp8: bool = False  # q in float8_e4m3fn with its scale folded into the weights (vLLM's fp8 indexer path)
    row_bound_only: bool = False  # paged: the fixed looping grid CUDA-graph decode launches

    @property
    def name(self) -> str:
        return (f"indexer-{self.mode}:T{self.T}-Hi{self.HI}-n{self.n}-{self.k_format}-nn{self.next_n}-K{self.topk}"
                + ("-q8" if self.q_fp8 else "") + ("-loop" if self.row_bound_only else ""))


def run_indexer_case(case: IndexerCase, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Result:
    gen = torch.Generator().manual_seed(seed)
    scale = naive.INDEXER_DIM ** -0.5
    fp8 = case.k_format == "fp8"
    if case.mode == "ragged":
        # requests of `n` tokens each, causal inside a request: query i of request r sees [r*n, r*n + i]
        n_req = max(1, case.T // case.n)
        N = n_req * case.n
        T = N
        keys = torch.randn(N, naive.INDEXER_DIM, generator=gen)
        cache = naive.quantize_indexer_k(keys).to(device) if fp8 else keys.to(dtype).to(device)
        pos = torch.arange(T)
        ks = ((pos // case.n) * case.n).to(torch.int32).to(device)
        ke = (pos + 1).to(torch.int32).to(device)
        kw = dict(ks=ks, ke=ke)
    else:
        B = case.T
        T = B * case.next_n
        bs = case.block_size
        max_blocks = math.ceil(case.n / bs)
        nb = B * max_blocks + 3
        keys = torch.randn(nb * bs, naive.INDEXER_DIM, generator=gen)
        if fp8:
            cache = naive.pack_indexer_cache_paged(naive.quantize_indexer_k(keys), bs).to(device)
        else:
            cache = keys.to(dtype).view(nb, bs, naive.INDEXER_DIM).to(device)
        bt = torch.randperm(nb, generator=gen)[: B * max_blocks].view(B, max_blocks).to(torch.int32).to(device)
        ctx = torch.randint(case.next_n, case.n + 1, (B,), generator=gen).to(torch.int32)
        ctx[0] = case.n
        kw = dict(block_table=bt, context_lens=ctx.to(device), next_n=case.next_n, max_len=max_blocks * bs)
    q = torch.randn(T, case.HI, naive.INDEXER_DIM, generator=gen).to(dtype).to(device)
    w = (torch.rand(T, case.HI, generator=gen) * case.HI ** -0.5).to(device)
    notes = []
    if case.q_fp8:  # the reference scores the same e4m3 values (the quantization itself is not under test)
        q, amax = naive.quantize_indexer_q(q.float())
        w = w * amax
        if not fp8_hw(q.device):  # as vLLM's path does without hardware e4m3 (sm_80): widened, exactly
            q = q.to(torch.float16 if dtype == torch.bfloat16 else dtype)  # (`vllm_plugin.paged.indexer_q`)
            notes.append("fp8 q widened (software e4m3)")
    run_kw = dict(kw)
    if case.row_bound_only:  # writes each row up to the tile holding its context: the rest stays -inf here
        run_kw.update(row_bound_only=True, out=torch.full((T, kw["max_len"]), float("-inf"), device=device))
    o = indexer_logits(q, cache, w, scale=scale, k_format=case.k_format if fp8 or dtype != torch.float32 else "fp32",
                       **run_kw)
    r = naive.indexer_logits_ref(q.float() if case.q_fp8 else q, cache, w, scale=scale, k_format=case.k_format, **kw)
    ok = True
    if not torch.equal(torch.isinf(o), torch.isinf(r)) or torch.isnan(o).any():
        ok = False
        notes.append("mask differs or NaN")
    fin = torch.isfinite(r)
    d = (o - r)[fin]
    max_abs = float(d.abs().max()) if d.numel() else 0.0
    rel = float(d.norm() / r[fin].norm()) if d.numel() else 0.0
    rel_tol = 1e-5 if dtype == torch.float32 else 1e-3
    if rel > rel_tol:
        ok = False
        notes.append(f"tolerance rel {rel_tol}")
    # top-k: on the kernel's own scores the selection must be exactly the k largest finite scores (checked from
    # the definition); against the reference scores nearly-tied picks may swap, so report the overlap
    ks_arg = kw.get("ks")
    sel = topk_indices(o, case.topk, ks=ks_arg)
    if not topk_is_exact(o, sel, case.topk, ks=ks_arg):
        ok = False
        notes.append("topk picks are not the k largest finite scores")
    ref_sel2 = naive.topk_ref(r, case.topk, ks=ks_arg)
    inter = sum(topk_overlap(sel, ref_sel2))
    total = int((ref_sel2 >= 0).sum())
    notes.append(f"topk overlap with reference scores {inter}/{total}")
    return Result(case.name, ok, max_abs, rel, cos_diff(o[fin], r[fin]) if fin.any() else 0.0, 0.0, notes)


def topk_is_exact(scores: torch.Tensor, sel: torch.Tensor, k: int, *, ks: torch.Tensor | None = None) -> bool:
    """True when every row of `sel` (int32 [T, k], -1 padded, relative to `ks` when given) holds distinct
    positions of finite scores, min(k, finite count) of them, none scoring below an unpicked finite score."""
    scores, sel = scores.float().cpu(), sel.long().cpu()
    T, n = scores.shape
    valid = sel >= 0
    pos = sel + (ks.long().cpu()[:, None] if ks is not None else 0)
    if ((pos < 0) | (pos >= n))[valid].any():
        return False
    picked = torch.zeros(T, n, dtype=torch.bool)
    picked[torch.arange(T)[:, None].expand_as(pos)[valid], pos[valid]] = True
    finite = torch.isfinite(scores)
    if not torch.equal(picked.sum(-1), valid.sum(-1)):  # a position picked twice
        return False
    if not torch.equal(valid.sum(-1), finite.sum(-1).clamp(max=k)) or (picked & ~finite).any():
        return False
    low = torch.where(picked, scores, torch.full_like(scores, math.inf)).amin(-1)
    high = torch.where(finite & ~picked, scores, torch.full_like(scores, -math.inf)).amax(-1)
    return bool((low >= high).all())


def indexer_cases(profile: str) -> list[IndexerCase]:
    if profile == "ci":
        return [
            IndexerCase("ragged", T=96, HI=4, n=48, topk=16),
            IndexerCase("ragged", T=80, HI=8, n=80, k_format="fp8", topk=32),
            IndexerCase("paged", T=2, HI=4, n=150, next_n=2, block_size=16, topk=64),
            IndexerCase("paged", T=3, HI=32, n=100, k_format="fp8", block_size=16, topk=64),
            IndexerCase("paged", T=3, HI=32, n=150, k_format="fp8", next_n=2, block_size=16, topk=64, q_fp8=True),
            IndexerCase("paged", T=2, HI=32, n=300, k_format="fp8", block_size=16, topk=64, q_fp8=True,
                        row_bound_only=True),
        ]
    return [
        IndexerCase("ragged", T=4096, HI=32, n=2048, topk=2048),
        IndexerCase("ragged", T=3000, HI=32, n=1000, k_format="fp8", topk=2048),
        IndexerCase("paged", T=16, HI=32, n=9000, next_n=1, topk=2048),
        IndexerCase("paged", T=8, HI=32, n=20000, k_format="fp8", next_n=2, topk=2048),
        # bf16 q over fp8 keys (rewritten, `indexer.PAGED_Q_FORM`) on the looping grid of CUDA-graph decode
        IndexerCase("paged", T=64, HI=32, n=20000, k_format="fp8", topk=2048, row_bound_only=True),
        IndexerCase("paged", T=5, HI=32, n=1000, k_format="fp8", next_n=1, topk=2048),
        IndexerCase("paged", T=8, HI=32, n=20000, k_format="fp8", next_n=2, topk=2048, q_fp8=True),
        # 64 requests of 157 tiles: at 32 programs per SM on 132 SMs each program loops over 2-3 tiles
        IndexerCase("paged", T=64, HI=32, n=20000, k_format="fp8", topk=2048, q_fp8=True, row_bound_only=True),
        IndexerCase("ragged", T=3000, HI=32, n=1000, k_format="fp8", topk=2048, q_fp8=True),
    ]


def run_all(profile: str = "ci", device: str = "cpu", dtype: torch.dtype | None = None) -> list[Result]:
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    res = [run_mla_case(c, device, dtype, seed=i) for i, c in enumerate(mla_cases(profile))]
    res += [run_indexer_case(c, device, dtype, seed=i) for i, c in enumerate(indexer_cases(profile))]
    return res


def summary(results: list[Result]) -> dict:
    """Counts and worst errors over a run of the matrix (what notebook 04 records)."""
    mla = [r for r in results if not r.name.startswith("indexer")]
    return {
        "cases": len(results),
        "passed": sum(r.ok for r in results),
        "mla_cases": len(mla),
        "groups": sorted({r.name.split(":")[0] for r in results}),
        "max_rel": max((r.rel for r in results), default=0.0),
        "max_cos_diff": max((r.cos_diff for r in results), default=0.0),
        "max_lse_abs": max((r.lse_abs for r in mla), default=0.0),
        "failed": [r.name for r in results if not r.ok],
    }


def format_table(results: list[Result]) -> str:
    lines = [f"{'case':64s} {'ok':3s} {'max_abs':>9s} {'rel':>9s} {'cos_diff':>9s} {'lse_abs':>9s}"]
    for r in results:
        lines.append(f"{r.name:64s} {'ok' if r.ok else 'BAD':3s} {r.max_abs:9.2e} {r.rel:9.2e} {r.cos_diff:9.2e} "
                     f"{r.lse_abs:9.2e} {'; '.join(r.notes)}" + (f" config={r.config}" if r.config else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sparse-MLA / indexer case matrix")
    ap.add_argument("--profile", default="ci", choices=["ci", "full"])
    ap.add_argument("--sanitize", action="store_true", help="only the invalid-index cases (for compute-sanitizer)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", metavar="TEXT", help="with --sanitize: only the cases whose name contains TEXT (or one "
                    "of several, comma-separated)")
    ap.add_argument("--smem-class", choices=["small", "big"],
                    help="run the configs of this shared-memory class whatever the GPU (small: sm_89 / sm_120's)")
    a = ap.parse_args(argv)
    if a.smem_class:
        from glm5lib.kernels import mla

        mla.force_smem_class(a.smem_class)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.sanitize:
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        only = [t for t in (a.only or "").split(",") if t]
        cases = [(i, c) for i, c in enumerate(sanitize_cases()) if not only or any(t in c.name for t in only)]
        if not cases:
            ap.error(f"no sanitize case name contains {a.only!r}")
        res = [run_mla_case(c, device, dtype, seed=i) for i, c in cases]
    else:
        res = run_all(a.profile, device)
    print(format_table(res))
    n_bad = sum(not r.ok for r in res)
    print(f"{len(res) - n_bad}/{len(res)} cases pass on {device}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in res], f, indent=1)
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
