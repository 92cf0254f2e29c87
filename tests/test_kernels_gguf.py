"""glm5lib.kernels.gguf under Triton's interpreter: GGUF-block GEMM and grouped experts against gguf-py.

Weights are real GGUF bytes: Q8_0 / Q4_0 / Q5_0 quantized by gguf-py; Q4_K / Q5_K / Q6_K packed here from random
fields following llama.cpp's block layouts (gguf-py cannot quantize K-quants), the packer itself checked against
gguf-py's dequantization. Shapes are small and irregular (rows not a multiple of the tile, several tiles, split
and unsplit k, the 8-blocks-per-iteration path and the one-block path of the 32-value types). Also: the
ahead-of-time compile of every shipped configuration for sm_80 / 89 / 90 / 120 within each class's shared memory.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from glm5lib.errors import UserError
from glm5lib.kernels import gguf_naive
from glm5lib.kernels.gguf import (Q4_0, Q4_K, Q5_0, Q5_K, Q6_K, Q8_0, GGUFConfig, aot_specs, gguf_matmul, gguf_moe,
                                  moe_align, row_bytes)

K_QUANTS = (Q4_K, Q5_K, Q6_K)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(*v.shape, 2)


def pack_kquant(qtype: int, rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random K-quant rows packed by llama.cpp's layout -> (bytes [n, row_bytes], values [n, k] fp32 computed
    from the unpacked fields: d * sc * q - dmin * m (Q4_K / Q5_K), d * sc * (q - 32) (Q6_K))."""
    nb = k // 256
    shape = (n, nb)
    d = rng.uniform(1e-3, 8e-3, shape).astype(np.float16)
    if qtype in (Q4_K, Q5_K):
        bits = 4 if qtype == Q4_K else 5
        dmin = rng.uniform(0, 4e-3, shape).astype(np.float16)
        sc = rng.integers(0, 64, (*shape, 8))
        mn = rng.integers(0, 64, (*shape, 8))
        q = rng.integers(0, 1 << bits, (*shape, 256))
        scales = np.zeros((*shape, 12), dtype=np.int64)
        for j in range(4):
            scales[..., j] = (sc[..., j] & 63) | ((sc[..., j + 4] >> 4) << 6)
            scales[..., j + 4] = (mn[..., j] & 63) | ((mn[..., j + 4] >> 4) << 6)
            scales[..., 8 + j] = (sc[..., j + 4] & 15) | ((mn[..., j + 4] & 15) << 4)
        qs = np.zeros((*shape, 128), dtype=np.int64)
        qh = np.zeros((*shape, 32), dtype=np.int64)
        for c in range(4):
            lo = q[..., 64 * c: 64 * c + 32]
            hi = q[..., 64 * c + 32: 64 * c + 64]
            qs[..., 32 * c: 32 * c + 32] = (lo & 15) | ((hi & 15) << 4)
            qh |= ((lo >> 4) & 1) << (2 * c)
            qh |= ((hi >> 4) & 1) << (2 * c + 1)
        parts = [_f16_bytes(d), _f16_bytes(dmin), scales.astype(np.uint8)]
        if qtype == Q5_K:
            parts.append(qh.astype(np.uint8))
        parts.append(qs.astype(np.uint8))
        j = np.arange(256) // 32
        vals = (d.astype(np.float32)[..., None] * sc[..., j] * q
                - dmin.astype(np.float32)[..., None] * mn[..., j])
    else:
        sc = rng.integers(-128, 128, (*shape, 16))
        q = rng.integers(0, 64, (*shape, 256))
        ql = np.zeros((*shape, 128), dtype=np.int64)
        qh = np.zeros((*shape, 64), dtype=np.int64)
        for h in range(2):
            y = q[..., 128 * h: 128 * h + 128]
            ql[..., 64 * h: 64 * h + 32] = (y[..., 0:32] & 15) | ((y[..., 64:96] & 15) << 4)
            ql[..., 64 * h + 32: 64 * h + 64] = (y[..., 32:64] & 15) | ((y[..., 96:128] & 15) << 4)
            qh[..., 32 * h: 32 * h + 32] = ((y[..., 0:32] >> 4) | ((y[..., 32:64] >> 4) << 2)
                                            | ((y[..., 64:96] >> 4) << 4) | ((y[..., 96:128] >> 4) << 6))
        parts = [ql.astype(np.uint8), qh.astype(np.uint8), sc.astype(np.int8).view(np.uint8), _f16_bytes(d)]
        vals = d.astype(np.float32)[..., None] * sc[..., np.arange(256) // 16] * (q - 32)
    blocks = np.concatenate(parts, axis=-1)
    assert blocks.shape[-1] == row_bytes(qtype, 256)
    return blocks.reshape(n, -1), vals.reshape(n, k).astype(np.float32)


def gguf_rows(qtype: int, rng: np.random.Generator, n: int, k: int) -> torch.Tensor:
    if qtype in K_QUANTS:
        return torch.from_numpy(pack_kquant(qtype, rng, n, k)[0])
    return torch.from_numpy(np.ascontiguousarray(gguf_quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)))


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_kquant_packer_matches_gguf_py(qtype):
    """The test's K-quant packer and gguf-py read the same values out of the same bytes (else the kernel tests
    below would compare against a layout of our own making)."""
    rng = np.random.default_rng(qtype)
    w, vals = pack_kquant(qtype, rng, 5, 512)
    got = gguf_dequantize(w, qtype)
    np.testing.assert_allclose(got, vals, rtol=1e-5, atol=1e-6)
    assert np.abs(vals).max() > 0.01  # not a degenerate draw


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


# (qtype, K): K-quants with 2 super-blocks; 32-value types with K % 256 == 0 (8 blocks per iteration) and not
CASES = [(Q4_K, 512), (Q5_K, 512), (Q6_K, 512), (Q8_0, 512), (Q8_0, 96), (Q4_0, 256), (Q4_0, 160), (Q5_0, 256),
         (Q5_0, 96)]


@pytest.mark.parametrize("qtype,k", CASES)
def test_gguf_matmul_matches_gguf_py(qtype, k):
    rng = np.random.default_rng(100 + qtype + k)
    n = 37  # not a multiple of the tile
    w = gguf_rows(qtype, rng, n, k)
    for m, cfg in ((1, GGUFConfig(16, 16, 4, 2, 100.0)), (3, GGUFConfig(16, 32, 4, 2, 1.0))):
        # waves=100 on 132 "SMs" (the interpreter's count) splits k as far as it goes: partials + sum launch
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m))
        out = torch.full((m, n), float("nan"))
        y = gguf_matmul(x, w, qtype, n, config=cfg, out=out)
        assert y.data_ptr() == out.data_ptr()
        assert torch.isfinite(y).all(), "every output element written"
        ref = gguf_naive.gguf_matmul_ref(x, w, qtype, n)
        assert _rel(y, ref) < 1e-5, (m, cfg.name)


def test_gguf_matmul_larger_tiles_and_default_config():
    """Several row tiles and activation-row tiles: M = 20 > 16 (the small-rows config, BLOCK_M 32 on one tile
    plus masking) and M = 40 (the large config, BLOCK_M 64)."""
    rng = np.random.default_rng(7)
    n, k = 70, 256
    w = gguf_rows(Q4_K, rng, n, k)
    for m in (20, 40):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        y = gguf_matmul(x, w, Q4_K, n)
        assert _rel(y, gguf_naive.gguf_matmul_ref(x, w, Q4_K, n)) < 1e-5


def test_gguf_matmul_fp16_activations():
    """fp16 activations take the fp16 dot (weights rounded to fp16 in registers): fp16-level error."""
    rng = np.random.default_rng(8)
    n, k = 24, 256
    w = gguf_rows(Q6_K, rng, n, k)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(3)).half()
    y = gguf_matmul(x, w, Q6_K, n, config=GGUFConfig(16, 16, 4, 2, 1.0))
    assert y.dtype == torch.float16
    err = _rel(y, gguf_naive.gguf_matmul_ref(x, w, Q6_K, n))
    assert 1e-6 < err < 3e-3  # rounded somewhere (not the fp32 path), but only to fp16


def test_gguf_moe_mixed_types_repeated_experts():
    """w13 Q4_K and w2 Q6_K (llama.cpp's Q4_K_M puts Q6_K on some ffn_down), top-k rows that name the same
    expert twice, experts shared between tokens and experts nobody picked."""
    rng = np.random.default_rng(11)
    e, inter, hid, m, top_k = 5, 256, 256, 4, 3
    w13 = torch.from_numpy(pack_kquant(Q4_K, rng, e * 2 * inter, hid)[0]).view(e, 2 * inter, -1)
    w2 = torch.from_numpy(pack_kquant(Q6_K, rng, e * hid, inter)[0]).view(e, hid, -1)
    x = torch.randn(m, hid, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[1, 1, 4], [0, 4, 2], [4, 4, 4], [2, 0, 1]], dtype=torch.int32)
    tw = torch.rand(m, top_k, generator=torch.Generator().manual_seed(2))
    cfg = GGUFConfig(16, 32, 4, 2, 1.0)
    y = gguf_moe(x, w13, w2, tw, ids, Q4_K, Q6_K, config13=cfg, config2=GGUFConfig(16, 64, 4, 2, 1.0))
    ref = gguf_naive.gguf_moe_ref(x, w13, w2, tw, ids, Q4_K, Q6_K)
    assert y.shape == (m, hid)
    assert _rel(y, ref) < 1e-5
    # the routing matters: other weights for the same experts give another answer
    y2 = gguf_moe(x, w13, w2, tw.flip(1), ids, Q4_K, Q6_K, config13=cfg, config2=GGUFConfig(16, 64, 4, 2, 1.0))
    assert _rel(y2, ref) > 1e-2


def test_gguf_moe_legacy_types():
    rng = np.random.default_rng(12)
    e, inter, hid, m = 3, 64, 96, 2
    w13 = torch.from_numpy(gguf_quantize(rng.standard_normal((e * 2 * inter, hid)).astype(np.float32), Q8_0))
    w2 = torch.from_numpy(gguf_quantize(rng.standard_normal((e * hid, inter)).astype(np.float32), Q5_0))
    w13, w2 = w13.view(e, 2 * inter, -1), w2.view(e, hid, -1)
    x = torch.randn(m, hid, generator=torch.Generator().manual_seed(5))
    ids = torch.tensor([[2, 0], [2, 2]], dtype=torch.int32)
    tw = torch.tensor([[0.7, 0.3], [0.5, 0.5]])
    y = gguf_moe(x, w13, w2, tw, ids, Q8_0, Q5_0)
    assert _rel(y, gguf_naive.gguf_moe_ref(x, w13, w2, tw, ids, Q8_0, Q5_0)) < 1e-5


def test_moe_align_groups_every_pair_once():
    ids = torch.tensor([[3, 1], [1, 1], [0, 3], [3, 3]])
    block = 2
    pairs, experts = moe_align(ids, 4, block)
    flat = ids.reshape(-1)
    seen = sorted(int(p) for p in pairs if p >= 0)
    assert seen == list(range(flat.numel()))
    for b, ex in enumerate(experts.tolist()):
        members = [int(p) for p in pairs[b * block:(b + 1) * block] if p >= 0]
        if ex < 0:
            assert not members
        else:
            assert members and all(int(flat[p]) == ex for p in members)


def test_bad_inputs_are_user_errors():
    w = torch.zeros(4, row_bytes(Q8_0, 64), dtype=torch.uint8)
    with pytest.raises(UserError, match="unsupported quantization type"):
        gguf_matmul(torch.zeros(1, 64), w, 3, 4)  # Q4_1
    with pytest.raises(UserError, match="expected"):
        gguf_matmul(torch.zeros(1, 96), w, Q8_0, 4)
    with pytest.raises(UserError, match="multiple of 256"):
        row_bytes(Q4_K, 300)


# Compiling every shipped (kernel, config, type) for 4 archs takes minutes on a loaded CPU; the test compiles the
# types whose byte handling differs (Q4_K: packed scales, Q6_K: 16-value groups, Q8_0: 8 blocks per iteration)
# and the harness's full report covers the rest.
_AOT = """
import json, sys
from dataclasses import asdict
from glm5lib.kernels.compile_report import compile_one
from glm5lib.kernels.gguf import Q4_K, Q6_K, Q8_0, aot_specs
arch = int(sys.argv[1])
print(json.dumps([asdict(compile_one(s, arch)) for s in aot_specs(arch, qtypes=(Q4_K, Q6_K, Q8_0))]))
"""


@pytest.mark.parametrize("arch", [80, 89, 90, 120])
def test_aot_compile_shipped_configs_fit(arch):
    """Every shipped config compiles for the arch and fits its shared memory (a child process: this one runs
    Triton's interpreter, whose kernels cannot be compiled)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, "-c", _AOT, str(arch)], env=env, capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    bad = [r for r in rows if not (r["ok"] and r["fits"])]
    assert len(rows) == 3 * (3 + 1 + 2) and not bad, bad  # 3 types x (3 row classes + split + 2 MoE kernels)
    assert all(r["mma"] for r in rows), "the dots run on tensor cores"
    if arch == 90:
        assert any(r["mma"] == "wgmma" for r in rows)  # the 64-row config reaches Hopper's wgmma
