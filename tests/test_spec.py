"""The GLM-5 family description against independent references: gguf-py's tensor name map, transformers'
GlmMoeDsa module tree, and the counts in docs/glm5.md."""

import collections

import gguf
import pytest
import torch

from glm5lib.model.layout import merge_kv_b, split_kv_b
from glm5lib.model.spec import (
    GLM5Config, config_from_gguf_metadata, gguf_metadata, gguf_tensor_specs, hf_tensor_shapes, split_block_name,
)

CONFIGS = {"glm5": GLM5Config.glm5(), "glm5.2": GLM5Config.glm5_2(), "tiny": GLM5Config.tiny(),
           "tiny-shared": GLM5Config.tiny(shared_indexer=True)}


def test_glm5_tensor_count_matches_facts():
    specs = gguf_tensor_specs(GLM5Config.glm5())
    assert len(specs) == 1809  # 3 global + 3 dense x 18 + 75 MoE x 23 + MTP 27
    per_block = collections.Counter(s.block for s in specs)
    assert per_block[None] == 3
    assert [per_block[i] for i in range(3)] == [18, 18, 18]
    assert all(per_block[i] == 23 for i in range(3, 78))
    assert per_block[78] == 27
    assert len({s.gguf_name for s in specs}) == 1809


def test_glm5_2_indexshare_drops_indexer_tensors():
    cfg = GLM5Config.glm5_2()
    assert sum(t == "full" for t in cfg.indexer_types) == 21  # docs/glm5.md: 21 of 78 layers run the indexer
    specs = gguf_tensor_specs(cfg)
    assert len(specs) == 1809 - 5 * (78 - 21)
    shared = [i for i, t in enumerate(cfg.indexer_types) if t == "shared"]
    assert not any(s.block in shared and s.kind.startswith("indexer.") for s in specs)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gguf_names_agree_with_gguf_py_tensor_map(name):
    """Every identity/expert tensor's GGUF name is what gguf-py's glm-dsa TensorNameMap gives for its HF name."""
    cfg = CONFIGS[name]
    tmap = gguf.TensorNameMap(gguf.MODEL_ARCH.GLM_DSA, cfg.num_layers_total)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GLM_DSA]}
    for s in gguf_tensor_specs(cfg):
        block, kind = split_block_name(s.gguf_name)
        base = kind.rsplit(".", 1)[0]
        assert (f"blk.{{bid}}.{base}" if block is not None else base) in allowed, s.gguf_name
        if s.transform in ("k_b", "v_b"):
            continue  # derived from kv_b_proj; checked by the round trip below
        hf = s.hf_names[0]
        if s.transform == "experts":  # gguf-py maps the expert-less name
            hf = hf.replace(".experts.0.", ".experts.")
        hf = hf.replace("e_score_correction_bias", "e_score_correction.bias")  # llama.cpp's converter renames it
        assert tmap.get_name(hf, try_suffixes=(".weight", ".bias")) == s.gguf_name


@pytest.mark.parametrize("name", ["tiny", "tiny-shared"])
def test_hf_names_and_shapes_agree_with_transformers(name):
    """HF checkpoint names/shapes equal transformers' GlmMoeDsa parameters (experts fused there as gate_up)."""
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    cfg = CONFIGS[name]
    with torch.device("meta"):
        model = GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**cfg.to_hf_dict()))
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = hf_tensor_shapes(cfg, include_mtp=False)
    fused = {}
    for k, shape in ours.items():
        if ".mlp.experts." in k:
            prefix, rest = k.split(".mlp.experts.")
            e, proj = rest.split(".", 1)
            key = f"{prefix}.mlp.experts." + ("down_proj" if proj.startswith("down") else "gate_up_proj")
            fused.setdefault(key, set()).add((proj, shape))
        else:
            assert theirs.pop(k) == shape, k
    E, I, D = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for key in fused:
        assert theirs.pop(key) == ((E, 2 * I, D) if key.endswith("gate_up_proj") else (E, D, I))
    assert not theirs, f"transformers has parameters the spec lacks: {sorted(theirs)[:5]}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gguf_metadata_round_trip(name):
    cfg = CONFIGS[name]
    md = gguf_metadata(cfg)
    assert md["glm-dsa.attention.key_length"] == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    back = config_from_gguf_metadata(md)
    keep = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype")
    assert back.replace(**{k: getattr(cfg, k) for k in keep}) == cfg


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_config_round_trip(name):
    cfg = CONFIGS[name]
    assert GLM5Config.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_glm5_geometry_facts():
    cfg = GLM5Config.glm5()
    assert cfg.softmax_scale == 1 / 16
    assert (cfg.mla_qk_dim, cfg.kv_b_head_dim, cfg.qk_head_dim) == (576, 448, 256)
    d = cfg.to_hf_dict()
    assert d["indexer_rope_interleave"] is True and d["scoring_func"] == "sigmoid" and d["topk_method"] == "noaux_tc"


def test_kv_b_split_matches_facts_and_round_trips():
    cfg = GLM5Config.tiny()
    H, r = cfg.num_attention_heads, cfg.kv_lora_rank
    kv_b = torch.randn(H * 448, r)
    k_b, v_b = split_kv_b(kv_b, cfg)
    # docs/glm5.md: k_b = kv_b.view(H, 448, 512)[:, :192, :].transpose(1, 2); v_b = [..., 192:, :]
    assert torch.equal(k_b, kv_b.view(H, 448, r)[:, :192, :].transpose(1, 2))
    assert torch.equal(v_b, kv_b.view(H, 448, r)[:, 192:, :])
    assert tuple(reversed(k_b.shape)) == (192, 512, H) and tuple(reversed(v_b.shape)) == (512, 256, H)
    assert torch.equal(merge_kv_b(k_b, v_b, cfg), kv_b)
    with pytest.raises(ValueError):
        merge_kv_b(v_b, k_b, cfg)  # swapped k/v is refused by shape
