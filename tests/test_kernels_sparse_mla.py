"""Sparse MLA: Triton kernel vs fp32 reference (interpreter on CPU), reference vs an independent dense attention,
fp8_ds_mla codec layout, paged views, input validation. Case ids read like FlashMLA's groups."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from glm5lib.kernels import checks, common, naive  # checks imports the kernels (common first: interpreter on CPU)
from glm5lib.kernels.mla import MLAConfig, sparse_mla, sparse_mla_launch

torch.set_num_threads(1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter has no bf16 dot


@pytest.mark.parametrize("case", checks.mla_cases("ci"), ids=lambda c: c.name)
def test_case_matrix(case):
    res = checks.run_mla_case(case, DEVICE, DTYPE, seed=zlib.crc32(case.name.encode()) % 1000)  # stable across processes
    assert res.ok, f"{res.name}: {res.notes} rel={res.rel:.2e} cos={res.cos_diff:.2e} lse={res.lse_abs:.2e}"


@pytest.mark.parametrize("cfg", [MLAConfig(16, 16, 4, 1), MLAConfig(16, 32, 4, 2, prefetch=True),
                                 MLAConfig(32, 16, 4, 1, prefetch=True), MLAConfig(16, 16, 4, 1, nope_f16=True),
                                 MLAConfig(16, 32, 4, 3, idx_ahead=True),
                                 MLAConfig(16, 32, 4, 2, prefetch=True, idx_ahead=True),
                                 MLAConfig(16, 32, 4, 2, prefetch=2, idx_ahead=True)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_every_kernel_variant_matches_reference(cfg, num_splits, monkeypatch):
    """Prefetch / split / software-fp8 (sm_80) variants compute the same function."""
    if DEVICE == "cpu":
        monkeypatch.setattr(common, "FP8_SOFTWARE", bool(cfg.prefetch))  # GLM5LIB_FP8_SOFTWARE, read at import
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 20, naive.D_QK, generator=gen).to(DTYPE).to(DEVICE)
    kv = torch.randn(90, naive.D_QK, generator=gen)
    idx = torch.randint(-4, 100, (3, 77), generator=gen, dtype=torch.int32).to(DEVICE)
    for fmt, cache in (("fp8_ds_mla", naive.quantize_fp8_ds_mla(kv).to(DEVICE)), ("bf16", kv.to(DTYPE).to(DEVICE))):
        o, lse = sparse_mla_launch(q, cache, idx, 1 / 16, kv_format=fmt, config=cfg, num_splits=num_splits)
        ro, rlse = naive.sparse_mla_ref(q, cache, idx, 1 / 16, kv_format=fmt)
        rel = float((o.float() - ro).norm() / ro.norm())
        assert rel < (1e-5 if DTYPE == torch.float32 else 1e-2), (fmt, rel)
        fin = torch.isfinite(rlse)
        assert torch.equal(fin, torch.isfinite(lse))
        assert float((lse[fin] - rlse[fin]).abs().max()) < 1e-3


def test_reference_equals_dense_attention():
    """With distinct valid indices, sparse MLA is softmax attention over the gathered rows (MQA, v = kv[:, :512])."""
    gen = torch.Generator().manual_seed(1)
    T, H, K, N = 3, 4, 50, 200
    q = torch.randn(T, H, naive.D_QK, generator=gen, dtype=torch.float64)
    kv = torch.randn(N, naive.D_QK, generator=gen, dtype=torch.float64)
    idx = torch.stack([torch.randperm(N, generator=gen)[:K] for _ in range(T)]).to(torch.int32)
    out, lse = naive.sparse_mla_ref(q, kv, idx, 1 / 16)
    for t in range(T):
        k = kv[idx[t].long()]
        o = torch.nn.functional.scaled_dot_product_attention(q[t][None], k[None, None], k[None, None, :, :512],
                                                             scale=1 / 16)[0]
        assert torch.allclose(out[t].double(), o, atol=1e-5)
        assert torch.allclose(lse[t].double(), torch.logsumexp(q[t] @ k.T / 16, -1), atol=1e-5)


def test_duplicates_count_twice():
    """A duplicated index is two keys (a plain gather), as in FlashMLA's reference: doubling every key of a row
    leaves the output unchanged and raises lse by ln 2."""
    q = torch.randn(1, 2, naive.D_QK)
    kv = torch.randn(40, naive.D_QK)
    idx = torch.randperm(40)[:8].to(torch.int32)[None]
    o1, l1 = sparse_mla(q, kv, idx, 1 / 16, kv_format="fp32")
    o2, l2 = sparse_mla(q, kv, torch.cat([idx, idx], 1), 1 / 16, kv_format="fp32")
    assert torch.allclose(o1, o2, atol=1e-5)
    assert torch.allclose(l2 - l1, torch.full_like(l1, math.log(2)), atol=1e-5)


def test_fp8_ds_mla_layout():
    """656-byte rows: 512 e4m3, 4 fp32 power-of-two scales (one per 128), 64 bf16 rope copied exactly."""
    kv = torch.randn(5, naive.D_QK) * torch.tensor([0.01, 1, 10, 300, 3]).view(5, 1)
    rows = naive.quantize_fp8_ds_mla(kv)
    assert rows.shape == (5, 656) and rows.dtype == torch.uint8
    rope = rows[:, 528:].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, kv[:, 512:].to(torch.bfloat16))
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
    amax = kv[:, :512].abs().view(5, 4, 128).amax(-1)
    assert torch.all(amax / scales <= 448)
    big = amax / 448 > 1e-4  # below that FlashMLA's quantizer clamps the scale (its FP8_AMAX_MARGIN)
    assert torch.all((amax / scales)[big] > 448 / 2 - 1e-3)  # the smallest power of two that fits
    back = naive.dequantize_fp8_ds_mla(rows)
    err = (back[:, :512] - kv[:, :512]).abs() / scales.repeat_interleave(128, 1)
    assert float(err.max()) <= 16  # half an e4m3 step at the top of the range (step 32 at 256..448)
    rel = (back[:, :512] - kv[:, :512]).norm() / kv[:, :512].norm()
    assert rel < 0.05


def test_paged_view_row_addressing():
    """A [nb, bs, row] view with a padded block stride addresses row block*stride_rows + offset."""
    storage = torch.arange(6 * 7 * 3, dtype=torch.float32).view(6 * 7, 3)
    view = storage.view(6, 7, 3)[:, :5]  # block_size 5, block stride 7 rows
    flat, n = naive.kv_row_view(view)
    assert n == 5 * 7 + 5
    assert torch.equal(flat[2 * 7 + 4], storage[2 * 7 + 4])
    with pytest.raises(ValueError):
        naive.kv_row_view(torch.as_strided(storage, (4, 5, 3), (16, 3, 1)))  # block stride not whole rows


@pytest.mark.parametrize("kv_format", ["fp8_ds_mla", "fp32"])
def test_chunked_reference_gathers_only_its_rows_and_equals_the_reference(kv_format):
    """`sparse_mla_ref_chunked` widens only the rows a chunk names: on a padded paged view, with out-of-range and -1
    indices, duplicates and a token with no valid key, it gives the whole reference's output and lse bit for bit."""
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(9 * 8, naive.D_QK, generator=g)
    storage = naive.quantize_fp8_ds_mla(kv) if kv_format == "fp8_ds_mla" else kv
    view = storage.view(9, 8, -1)[:, :6]  # block_size 6, block stride 8 rows: 8 * 8 + 6 = 70 addressable rows
    n = naive.kv_row_view(view)[1]
    q = torch.randn(7, 3, naive.D_QK, generator=g)
    idx = torch.randint(0, n, (7, 24), generator=g, dtype=torch.int32)
    idx[1, :5] = -1
    idx[2, 3] = n  # past the view: invalid
    idx[3, :12] = idx[3, 12:]  # duplicates
    idx[4] = -1  # no valid key
    idx[6] = n + 5  # ... and a chunk (tokens 6-) with none
    ro, rl = naive.sparse_mla_ref(q, view, idx, 0.07, kv_format=kv_format)
    co, cl = naive.sparse_mla_ref_chunked(q, view, idx, 0.07, kv_format=kv_format, chunk=3)
    assert torch.equal(co, ro) and torch.equal(cl, rl)
    assert torch.isneginf(cl[[4, 6]]).all() and torch.isfinite(cl[:4]).all() and not co[6].any()


@pytest.mark.parametrize("bad", ["shape", "heads", "dtype", "format", "dv"])
def test_input_validation(bad):
    q = torch.randn(2, 4, naive.D_QK)
    kv = torch.randn(10, naive.D_QK)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    kw = dict(kv_format="fp32")
    if bad == "shape":
        q = q[..., :500]
    elif bad == "heads":
        q = torch.randn(2, 129, naive.D_QK)
    elif bad == "dtype":
        idx = idx.long()
    elif bad == "format":
        kw = dict(kv_format="fp8_ds_mla")
    elif bad == "dv":
        kw["d_v"] = 256
    with pytest.raises(ValueError):
        sparse_mla(q, kv, idx, 1 / 16, **kw)


def test_empty_and_out_param():
    q = torch.randn(0, 4, naive.D_QK)
    o, lse = sparse_mla(q, torch.randn(10, naive.D_QK), torch.zeros(0, 8, dtype=torch.int32), 1 / 16, kv_format="fp32")
    assert o.shape == (0, 4, 512) and lse.shape == (0, 4)
    q = torch.randn(1, 3, naive.D_QK)
    out = torch.full((1, 3, 512), float("nan"))
    o, _ = sparse_mla(q, torch.randn(10, naive.D_QK), torch.arange(8, dtype=torch.int32)[None], 1 / 16,
                      kv_format="fp32", out=out)
    assert o.data_ptr() == out.data_ptr() and not torch.isnan(out).any()


def test_fp16_inputs():
    """fp16 q with an fp16 cache (kv_format "fp16") and with fp8 rows."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 6, naive.D_QK, generator=gen).half().to(DEVICE)
    kv = torch.randn(64, naive.D_QK, generator=gen)
    idx = torch.randint(-2, 70, (2, 48), generator=gen, dtype=torch.int32).to(DEVICE)
    for fmt, cache in (("fp16", kv.half().to(DEVICE)), ("fp8_ds_mla", naive.quantize_fp8_ds_mla(kv).to(DEVICE))):
        o, _ = sparse_mla(q, cache, idx, 1 / 16, kv_format=fmt)
        ro, _ = naive.sparse_mla_ref(q, cache, idx, 1 / 16, kv_format=fmt)
        assert o.dtype == torch.float16
        assert float((o.float() - ro).norm() / ro.norm()) < 5e-3, fmt


def test_package_exports_the_kernel_functions():
    import glm5lib.kernels as kernels
    import glm5lib.kernels.mla  # noqa: F401  (a loaded submodule must not shadow the function)

    assert callable(kernels.sparse_mla) and kernels.sparse_mla.__name__ == "sparse_mla"
    assert callable(kernels.indexer_logits) and callable(kernels.topk_indices)


def test_split_launch_merges_every_split():
    """Several splits merged by the log-sum-exp rule: the result matches the reference, including a token whose
    valid keys all fall in the first split and one with none (zeros, lse -inf); a second launch over the same
    split buffer layout gives the same bits."""
    gen = torch.Generator().manual_seed(11)
    T, H, K = 3, 20, 160
    q = torch.randn(T, H, naive.D_QK, generator=gen).to(DTYPE).to(DEVICE)
    kv = torch.randn(300, naive.D_QK, generator=gen)
    idx = torch.randint(0, 300, (T, K), generator=gen, dtype=torch.int32)
    idx[1, 32:] = -1  # token 1: keys only in the first split (32 keys per split)
    idx[2] = -1  # token 2: no key at all
    idx = idx.to(DEVICE)
    cfg = MLAConfig(16, 16, 4, 1)
    for fmt, cache in (("fp8_ds_mla", naive.quantize_fp8_ds_mla(kv).to(DEVICE)), ("bf16", kv.to(DTYPE).to(DEVICE))):
        o, lse = sparse_mla_launch(q, cache, idx, 1 / 16, kv_format=fmt, config=cfg, num_splits=5)
        ro, rlse = naive.sparse_mla_ref(q, cache, idx, 1 / 16, kv_format=fmt)
        assert float((o.float() - ro).norm() / ro.norm()) < (1e-5 if DTYPE == torch.float32 else 1e-2)
        assert torch.equal(torch.isfinite(lse), torch.isfinite(rlse)) and not torch.isfinite(lse[2]).any()
        assert float((lse[:2] - rlse[:2]).abs().max()) < 1e-3
        assert torch.equal(o[2].float(), torch.zeros_like(o[2].float()))
        o2, lse2 = sparse_mla_launch(q, cache, idx, 1 / 16, kv_format=fmt, config=cfg, num_splits=5)
        assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_tune_decode_candidates_run_under_the_interpreter():
    """tune_decode imports on a CPU-only machine, its candidate names (the keys of its timing table) are distinct,
    and every candidate computes the reference function on a small decode case (the GPU run checks the full
    decode matrix before timing)."""
    from glm5lib.bench import tune_decode

    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 8, naive.D_QK, generator=gen).to(DTYPE).to(DEVICE)
    kv = torch.randn(70, naive.D_QK, generator=gen)
    idx = torch.randint(-2, 75, (2, 40), generator=gen, dtype=torch.int32).to(DEVICE)
    for fmt, cands in tune_decode.CANDIDATES.items():
        assert len({c.name for c in cands}) == len(cands)
        cache = naive.quantize_fp8_ds_mla(kv).to(DEVICE) if fmt == "fp8_ds_mla" else kv.to(DTYPE).to(DEVICE)
        ro, _ = naive.sparse_mla_ref(q, cache, idx, 1 / 16, kv_format=fmt)
        for cfg in cands:
            o, _ = sparse_mla_launch(q, cache, idx, 1 / 16, kv_format=fmt, config=cfg, num_splits=2)
            rel = float((o.float() - ro).norm() / ro.norm())
            assert rel < (1e-5 if DTYPE == torch.float32 else 1e-2), (fmt, cfg.name, rel)


def test_forced_shared_memory_class(monkeypatch):
    """GLM5LIB_SMEM_CLASS picks the configs of a class on any device (how the H200 runs the sm_89/sm_120 ones);
    anything else is refused by name."""
    from glm5lib.kernels import mla

    monkeypatch.setattr(mla, "FORCE_SMEM_CLASS", "small")
    assert mla.smem_class(torch.device("cpu")) == "small"
    monkeypatch.setattr(mla, "FORCE_SMEM_CLASS", None)
    assert mla.smem_class(torch.device("cpu")) == "big"
    monkeypatch.setattr(mla, "FORCE_SMEM_CLASS", "huge")
    with pytest.raises(ValueError, match="GLM5LIB_SMEM_CLASS"):
        mla.smem_class(torch.device("cpu"))


def test_launch_key_separates_what_triton_specializes_on(monkeypatch):
    """The pre-bound launch key built by sparse_mla_launch changes with each property Triton compiles a separate
    kernel for: a pointer's 16-byte alignment, the indices' dtype, an int argument's value."""
    from glm5lib.kernels import mla

    keys = []

    class Recorder:
        def launch(self, grid, args, kw, kw_key=None, device_index=None, spec=None):
            keys.append(spec)

    monkeypatch.setattr(mla, "_FWD", Recorder())
    monkeypatch.setattr(mla, "_MERGE", Recorder())
    kv = torch.zeros(64, naive.D_QK)
    flat = torch.zeros(2 * 8 * naive.D_QK + 1)
    q = flat[: 2 * 8 * naive.D_QK].view(2, 8, naive.D_QK)
    q_misaligned = flat[1:].view(2, 8, naive.D_QK)  # 4 bytes off
    idx = torch.zeros(2, 32, dtype=torch.int32)
    cfg = MLAConfig(16, 16, 4, 1)
    for qq, ii, kk in ((q, idx, kv), (q_misaligned, idx, kv), (q, idx.long(), kv), (q, idx, kv[:48])):
        keys.clear()
        sparse_mla_launch(qq, kk, ii, 0.1, kv_format="fp32", config=cfg, num_splits=1)
        assert len(keys) == 1
        if qq is q and ii is idx and kk is kv:
            base = keys[0]
        else:
            assert keys[0] != base
