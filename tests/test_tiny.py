"""The tiny GLM-5: deterministic, loadable by transformers, and laid out in GGUF as llama.cpp's converter does."""

import hashlib
import json

import gguf
import numpy as np
import pytest
import torch

from glm5lib.model.spec import GGUF_ARCH, gguf_metadata, gguf_tensor_specs
from glm5lib.mapping.tiny import build_tiny, ensure_tiny, hf_to_gguf_arrays, init_weights
from glm5lib.model.tokenizer import SPECIAL_TOKENS


@pytest.fixture(scope="module")
def tiny():
    return ensure_tiny(progress=False)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_is_deterministic(tmp_path, tiny):
    again = build_tiny(tmp_path / "again", types=("F32", "Q8_0"), progress=False)
    for t in ("F32", "Q8_0"):
        assert _sha(again.gguf[t]) == _sha(tiny.gguf[t])
    for f in sorted(tiny.hf_dir.glob("*.safetensors")):
        assert _sha(again.hf_dir / f.name) == _sha(f)


def test_build_refuses_existing_dir_and_leaves_nothing(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(Exception, match="already exists"):
        build_tiny(tmp_path / "x", types=("F32",), progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_tiny_keeps_real_attention_geometry(tiny):
    c = tiny.config
    assert (c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim, c.index_head_dim) == (512, 64, 192, 256, 128)
    assert c.first_k_dense_replace >= 1 and c.num_hidden_layers > c.first_k_dense_replace  # dense and MoE layers
    assert c.num_nextn_predict_layers == 1


@pytest.mark.parametrize("ftype", ["F32", "BF16", "Q8_0", "Q4_0"])
def test_gguf_layout_matches_converter(tiny, ftype):
    reader = gguf.GGUFReader(tiny.gguf[ftype])
    assert reader.fields["general.architecture"].contents() == GGUF_ARCH
    specs = gguf_tensor_specs(tiny.config)
    assert [t.name for t in reader.tensors] == [s.gguf_name for s in specs]  # names and converter order
    main = gguf.GGMLQuantizationType[ftype]
    for t, s in zip(reader.tensors, specs):
        assert tuple(int(x) for x in t.shape) == s.ggml_shape, s.gguf_name
        want = gguf.GGMLQuantizationType.F32 if s.storage == "f32" else main
        assert t.tensor_type == want, s.gguf_name
    for key, value in gguf_metadata(tiny.config).items():
        got = reader.fields[key].contents()
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key
    assert reader.alignment == 32


def test_gguf_tokenizer_matches_hf_tokenizer(tiny):
    reader = gguf.GGUFReader(tiny.gguf["F32"])
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = json.loads((tiny.hf_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(tokens) == tiny.config.vocab_size
    assert all(vocab.get(t, i) == i for i, t in enumerate(tokens))
    assert tokens[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert len(reader.fields["tokenizer.ggml.merges"].contents()) > 0
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == tiny.config.eos_token_id
    assert "gMASK" in reader.fields["tokenizer.chat_template"].contents()


def test_f32_gguf_tensors_equal_hf_layout_bit_for_bit(tiny):
    weights = init_weights(tiny.config, seed=0)
    reader = gguf.GGUFReader(tiny.gguf["F32"])
    by_name = {t.name: t for t in reader.tensors}
    for spec, t in hf_to_gguf_arrays(tiny.config, weights):
        stored = np.asarray(by_name[spec.gguf_name].data).reshape(spec.shape)
        assert np.array_equal(stored, t.numpy()), spec.gguf_name


def test_transformers_loads_tiny_hf_dir(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny.hf_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny.hf_dir)
    weights = init_weights(tiny.config, seed=0)
    sd = model.state_dict()
    assert torch.equal(sd["model.layers.0.self_attn.kv_b_proj.weight"], weights["model.layers.0.self_attn.kv_b_proj.weight"])
    gate_up = sd["model.layers.1.mlp.experts.gate_up_proj"][3]
    assert torch.equal(gate_up, torch.cat([weights["model.layers.1.mlp.experts.3.gate_proj.weight"],
                                           weights["model.layers.1.mlp.experts.3.up_proj.weight"]]))
    ids = tok("The lightning indexer picks the top-k keys.", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "The lightning indexer picks the top-k keys."
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], tiny.config.vocab_size) and torch.isfinite(logits).all()
