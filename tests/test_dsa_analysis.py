"""DSA analysis functions on the (random-weight) tiny model: properties that must hold whatever the weights."""

import math

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
    q, k = quantize_indexer_qk(x[:8, None], x, None)  # no fp8 mode: q and k as given
    assert torch.equal(q, x[:8, None]) and torch.equal(k, x)
    q, k = quantize_indexer_qk(x[:8, None], x, "e4m3")
    assert torch.equal(q, fake_quant_e4m3(x[:8, None])) and torch.equal(k, fake_quant_e4m3(x))


def test_dense_vs_sparse_exact_up_to_topk(ref):
    res = analysis.dense_vs_sparse(ref, {32: [_ids(32)], 64: [_ids(64)], 160: [_ids(160)]})
    assert res[32]["exact"] and res[64]["exact"]
    assert not res[160]["exact"] and res[160]["max_abs"] > 0


def _stable_topk(scores: torch.Tensor, visible: int, k: int) -> list[int]:
    """Independent of glm5lib: python sort by (score desc, position asc) over the visible keys."""
    return sorted(range(visible), key=lambda s: (-float(scores[s]), s))[:k]


def test_selection_recall_against_a_hand_count(ref):
    ids, k = _ids(160, 1), 16
    r = analysis.selection_recall(ref, [ids], topks=[k, 64, 200])
    sel = analysis.collect(ref, ids)
    for layer, by_k in r["mass"].items():
        s = sel[layer]
        masses, sets = [], []
        for t in range(k, 160):  # queries that see more than k keys (t + 1 of them)
            picks = _stable_topk(s.index_scores[t], t + 1, k)
            best = _stable_topk(s.attn[t], t + 1, k)
            masses.append(float(s.attn[t, picks].sum()))
            sets.append(len(set(picks) & set(best)) / k)
        assert by_k[k] == pytest.approx(sum(masses) / len(masses), rel=1e-5)
        assert r["set"][layer][k] == pytest.approx(sum(sets) / len(sets), rel=1e-5)
        assert by_k[k] < by_k[64] < 1  # more keys keep more mass; the random indexer never keeps all
        assert by_k[k] < r["oracle"][layer][k] <= 1  # the dense top-k by attention is the best k keys
        assert math.isnan(by_k[200])  # no query sees more than 200 keys: nothing to average


def test_rope_fp8_and_indexshare_effects(ref):
    seqs = [_ids(128, 2)]
    layout, recall = analysis.detect_indexer_rope_layout(ref, seqs)
    # random weights favour neither layout: the detector picks the higher recall, and the layouts differ
    assert layout == max(recall, key=recall.get) and recall["interleaved"] != recall["neox"]
    own = analysis.selection_recall(ref, seqs, topks=[64])["mass"]  # the model's own (interleaved) layout
    assert recall["interleaved"] == pytest.approx(sum(v[64] for v in own.values()) / len(own), rel=1e-6)
    fp8 = analysis.fp8_indexer_effect(ref, seqs)
    for mode in ("e4m3", "e4m3_hadamard"):
        # e4m3 q/k flip a few picks (near-tied scores), never most of them, and move the logits
        assert all(0 < v < 0.05 for v in fp8[mode]["flipped"].values()), fp8[mode]
        assert fp8[mode]["max_abs_logit"] > 0
    assert analysis.share_pattern(5, 2) == ("full", "shared", "full", "shared", "full")
    same = analysis.indexshare_effect(ref, seqs, everies=(1, 2))
    assert same["every_1"]["max_abs_logit"] == 0.0  # every layer runs its own indexer: nothing changes
    assert same["every_2"]["pattern"] == "FSF"
    assert same["every_2"]["max_abs_logit"] > 0 and same["every_2"]["argmax_agree"] < 1  # layer 1 reuses layer 0's
    overlap = analysis.topk_overlap(ref, seqs)
    assert set(overlap) == {"0-1", "1-2"} and all(0 < v < 1 for v in overlap.values())


def test_analyze_layers_streams_gguf():
    from glm5lib.dsa.footprint import sample_ids

    tiny = ensure_tiny(progress=False)
    model = reference_from_gguf(tiny.shards["Q8_0"][0], stream=True)
    res = analyze_layers(model, tokens=96, layers=[0, 1, 2])
    assert [r["layer"] for r in res["layers"]] == [0, 1, 2]
    assert model._resident == {}  # streamed: nothing kept after the pass
    # layer by layer, streamed, the same numbers as the whole-model analysis of the same file held in memory
    whole = reference_from_gguf(tiny.shards["Q8_0"][0], stream=False)
    r = analysis.selection_recall(whole, [sample_ids(whole, 96, 0)], topks=[whole.cfg.index_topk])
    for row in res["layers"]:
        assert row["mass_recall"] == pytest.approx(r["mass"][row["layer"]][whole.cfg.index_topk], rel=1e-5)
        assert row["set_recall"] == pytest.approx(r["set"][row["layer"]][whole.cfg.index_topk], rel=1e-5)


def test_synthetic_weights_and_probe():
    cfg = GLM5Config.tiny()
    src = SyntheticWeights(cfg)
    shapes = hf_tensor_shapes(cfg)
    for name, shape in list(shapes.items())[:20]:
        assert tuple(src(name).shape) == shape
    assert torch.equal(src("lm_head.weight"), src("lm_head.weight"))  # deterministic
    assert not torch.equal(src("lm_head.weight"), SyntheticWeights(cfg, seed=1)("lm_head.weight"))
    dense = probe_layer(cfg, 0, 32)
    assert dense["attn_s"] > 0 and dense["mlp_s"] > 0 and not dense["moe"]
    attn = [n for n in shapes if n.startswith("model.layers.0.self_attn.") and n.endswith("proj.weight")
            and "_norm" not in n]
    assert dense["attn_weights_gb"] >= sum(torch.Size(shapes[n]).numel() * 4 for n in attn) / 1e9 > 0
    moe = probe_layer(cfg, 1, 32, max_experts=2)
    assert moe["moe"] and moe["expert_s"] > 0
    assert moe["expert_gb"] == 3 * cfg.moe_intermediate_size * cfg.hidden_size * 4 / 1e9


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
