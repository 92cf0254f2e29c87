"""DSA analysis functions on the (random-weight) tiny model: properties that must hold whatever the weights."""

import pytest
import torch

from glm5lib.dsa import analysis
from glm5lib.dsa.footprint import SyntheticWeights, analyze_layers, probe_layer
from glm5lib.model.indexer import fake_quant_e4m3, hadamard, indexer_scores, quantize_indexer_qk
from glm5lib.mapping.reference import reference_from_gguf
from glm5lib.model.reference import DSAOptions, ReferenceModel
from glm5lib.model.spec import GLM5Config, hf_tensor_shapes
from glm5lib.mapping.tiny import ensure_tiny


@pytest.fixture(scope="module")
def ref():
    torch.set_num_threads(1)
    return ReferenceModel.from_hf_dir(ensure_tiny(progress=False).hf_dir)


def _ids(T, seed=0):
    return torch.randint(0, 1024, (T,), generator=torch.Generator().manual_seed(seed))


def test_hadamard_is_orthogonal_and_keeps_scores():
    h = hadamard(128)
    assert torch.allclose(h @ h.T, torch.eye(128), atol=1e-6)
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(5, 4, 128, generator=g), torch.randn(9, 128, generator=g), torch.randn(5, 4, generator=g)
    assert torch.allclose(indexer_scores(q @ h, k @ h, w, 0.1), indexer_scores(q, k, w, 0.1), atol=1e-5)


def test_fp8_roundtrip_error_is_e4m3_sized():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    err = (fake_quant_e4m3(x) - x).abs() / x.abs().amax(-1, keepdim=True)
    assert 0 < float(err.max()) <= 2**-4  # 3 mantissa bits: half an ulp at the top binade is 1/16 of amax
    q, k = quantize_indexer_qk(x[:8, None], x, None)
    assert q is not None and torch.equal(k, x)


def test_dense_vs_sparse_exact_up_to_topk(ref):
    res = analysis.dense_vs_sparse(ref, {32: [_ids(32)], 64: [_ids(64)], 160: [_ids(160)]})
    assert res[32]["exact"] and res[64]["exact"]
    assert not res[160]["exact"] and res[160]["max_abs"] > 0


def test_selection_recall_bounds(ref):
    r = analysis.selection_recall(ref, [_ids(160, 1)], topks=[16, 64, 200])
    for layer, by_k in r["mass"].items():
        assert 0 < by_k[16] <= by_k[64] <= 1.0 + 1e-6
        assert by_k[16] <= r["oracle"][layer][16] + 1e-6  # top-k by attention is the best k keys
        assert by_k[200] != by_k[200]  # nan: no query sees more than 200 keys
        assert 0 <= r["set"][layer][64] <= 1


def test_rope_and_fp8_and_indexshare_run(ref):
    seqs = [_ids(128, 2)]
    layout, recall = analysis.detect_indexer_rope_layout(ref, seqs)
    assert layout in ("interleaved", "neox") and set(recall) == {"interleaved", "neox"}
    fp8 = analysis.fp8_indexer_effect(ref, seqs)
    for mode in ("e4m3", "e4m3_hadamard"):
        assert all(0 <= v <= 1 for v in fp8[mode]["flipped"].values())
    assert analysis.share_pattern(5, 2) == ("full", "shared", "full", "shared", "full")
    same = analysis.indexshare_effect(ref, seqs, everies=(1, 2))
    assert same["every_1"]["max_abs_logit"] == 0.0  # every layer runs its own indexer: nothing changes
    assert same["every_2"]["pattern"] == "FSF"
    assert set(analysis.topk_overlap(ref, seqs)) == {"0-1", "1-2"}


def test_analyze_layers_streams_gguf():
    tiny = ensure_tiny(progress=False)
    model = reference_from_gguf(tiny.shards["Q8_0"][0], stream=True)
    res = analyze_layers(model, tokens=96, layers=[0, 1, 2])
    assert [r["layer"] for r in res["layers"]] == [0, 1, 2]
    assert all(0 < r["mass_recall"] <= 1 for r in res["layers"])
    assert model._resident == {}


def test_synthetic_weights_and_probe():
    cfg = GLM5Config.tiny()
    src = SyntheticWeights(cfg)
    for name, shape in list(hf_tensor_shapes(cfg).items())[:20]:
        assert tuple(src(name).shape) == shape
    assert torch.equal(src("lm_head.weight"), src("lm_head.weight"))  # deterministic
    assert probe_layer(cfg, 0, 32)["attn_s"] > 0
    assert probe_layer(cfg, 1, 32, max_experts=2)["expert_s"] > 0


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_rope_layout_conversion_is_exact(ref, layout):
    """Converted weights run with the other layout score as the originals do with theirs."""
    from glm5lib.model.reference import SafetensorsWeights

    src = SafetensorsWeights(ensure_tiny(progress=False).hf_dir)
    weights = {n: src(n) for n in src.weight_map}
    other = "interleaved" if layout == "neox" else "neox"
    conv = ReferenceModel(ref.cfg, analysis.convert_indexer_rope_layout(weights, ref.cfg, to=layout))
    ids = _ids(160, 3)
    a = analysis.collect(ReferenceModel(ref.cfg, weights), ids, options=DSAOptions(dense=True, indexer_rope=other))
    b = analysis.collect(conv, ids, options=DSAOptions(dense=True, indexer_rope=layout))
    for layer in a:
        torch.testing.assert_close(b[layer].index_scores, a[layer].index_scores, rtol=1e-5, atol=1e-5)
    # and it is a real change: the converted weights with the original layout score differently
    c = analysis.collect(conv, ids, options=DSAOptions(dense=True, indexer_rope=other))
    assert not torch.allclose(c[1].index_scores, a[1].index_scores, atol=1e-3)
