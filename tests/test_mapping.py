"""glm-dsa GGUF <-> HF mapping on the tiny model: weights bit-exact, config/tokenizer round trip, export loads in
transformers with equal logits, `map check` finds planted defects, the layer check separates right from wrong."""

import json
import time

import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from safetensors.torch import load_file

from glm5lib.cli import main as cli_main
from glm5lib.errors import GGUFFormatError, UserError
from glm5lib.mapping import compare_hf_configs, gguf_to_hf_config, gguf_to_hf_tokenizer, iter_hf_weights
from glm5lib.mapping.corpus import defects, write_defect, write_header_only_set
from glm5lib.mapping.inventory import check, expected_inventory
from glm5lib.mapping.source import open_model
from glm5lib.mapping.weights import iter_gguf_arrays
from glm5lib.model.layout import split_kv_b
from glm5lib.model.spec import GLM5Config, gguf_tensor_specs, hf_tensor_shapes
from glm5lib.mapping.tiny import ensure_tiny

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return ensure_tiny(progress=False)


@pytest.fixture(scope="module")
def hf_weights(tiny):
    w = {}
    for f in sorted(tiny.hf_dir.glob("*.safetensors")):
        w.update(load_file(f))
    return w


def _first_shard(tiny, ft):
    return tiny.shards[ft][0] if tiny.shards.get(ft) else tiny.gguf[ft]


# ---- weights --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ft", ["F32", "BF16"])
def test_weights_rebuilt_bit_exact(tiny, hf_weights, ft):
    """Every HF tensor from the (split) GGUF equals the original: F32 exactly; BF16 equals the original rounded to
    bf16 (tensors llama.cpp keeps F32, such as norms and the router, stay exact)."""
    got = dict(iter_hf_weights(_first_shard(tiny, ft), dtype=torch.float32))
    assert set(got) == set(hf_weights) == set(hf_tensor_shapes(tiny.config))
    f32_names = {s.hf_names[0] for s in gguf_tensor_specs(tiny.config) if s.storage == "f32"}
    for name, t in got.items():
        ref = hf_weights[name]
        if ft == "BF16" and name not in f32_names:
            ref = ref.to(torch.bfloat16).float()
        assert t.dtype == torch.float32 and t.shape == ref.shape, name
        assert torch.equal(t, ref), name


def test_bf16_stays_bf16_without_float_round_trip(tiny, hf_weights):
    got = dict(iter_hf_weights(tiny.gguf["BF16"], dtype=torch.bfloat16))
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    assert got[name].dtype == torch.bfloat16
    assert torch.equal(got[name], hf_weights[name].to(torch.bfloat16))


def test_q8_0_equals_gguf_py_dequantization_of_stored_bytes(tiny):
    """Q8_0: each HF tensor equals gguf-py's dequantization of the stored bytes, put through the spec's layout
    (independently: whole-tensor dequantization here vs per-expert slices in the iterator)."""
    gs = open_model(_first_shard(tiny, "Q8_0"))
    cfg = tiny.config
    deq = {}
    for t in gs.tensors:
        raw = np.asarray(gs.raw(t.name))
        deq[t.name] = torch.from_numpy(np.array(gguf_dequantize(raw, t.ggml_type), dtype=np.float32)
                                       ).reshape(t.shape)
    got = dict(iter_hf_weights(gs, dtype=torch.float32))
    for spec in gguf_tensor_specs(cfg):
        if spec.transform == "identity":
            assert torch.equal(got[spec.hf_names[0]], deq[spec.gguf_name].reshape(spec.shape)), spec.gguf_name
        elif spec.transform == "experts":
            for e, n in enumerate(spec.hf_names):
                assert torch.equal(got[n], deq[spec.gguf_name][e]), n
        elif spec.transform == "k_b":
            k_b, v_b = split_kv_b(got[spec.hf_names[0]], cfg)
            assert torch.equal(k_b, deq[spec.gguf_name])
            assert torch.equal(v_b, deq[spec.gguf_name.replace("attn_k_b", "attn_v_b")])


def test_reverse_mapping_round_trips(tiny, hf_weights):
    """HF -> GGUF (iter_gguf_arrays) equals what the tiny F32 file stores; GGUF -> HF brings back the input."""
    gs = open_model(tiny.gguf["F32"])
    arrays = list(iter_gguf_arrays(tiny.config, hf_weights))
    assert [s.gguf_name for s, _ in arrays] == [t.name for t in gs.tensors]
    for spec, t in arrays:
        assert torch.equal(t, torch.from_numpy(np.array(gs.raw(spec.gguf_name))).reshape(spec.shape)), spec.gguf_name


def test_random_access_equals_streaming(tiny):
    from glm5lib.mapping import GGUFHFWeights

    w = GGUFHFWeights(_first_shard(tiny, "Q8_0"))
    streamed = dict(iter_hf_weights(_first_shard(tiny, "Q8_0"), dtype=torch.float32))
    assert sorted(w.keys()) == sorted(streamed)
    for name in reversed(list(streamed)):  # any order
        assert torch.equal(w(name), streamed[name]), name
    with pytest.raises(KeyError):
        w("model.layers.0.self_attn.kv_b_proj.bias")


def test_include_mtp_and_layers_filters(tiny):
    names = [n for n, _ in iter_hf_weights(tiny.gguf["F32"], dtype=torch.float32, include_mtp=False)]
    mtp = f"model.layers.{tiny.config.num_hidden_layers}."
    assert names and not any(n.startswith(mtp) for n in names)
    one = [n for n, _ in iter_hf_weights(tiny.gguf["F32"], dtype=torch.float32, layers=[1])]
    assert one and all(n.startswith("model.layers.1.") for n in one)


def test_iterator_refuses_broken_file_before_yielding(tiny, tmp_path):
    bad = write_defect(tiny.gguf["F32"], tmp_path / "bad.gguf", "missing_tensor")
    with pytest.raises(GGUFFormatError, match="missing"):
        next(iter_hf_weights(bad))


# ---- config and tokenizer -------------------------------------------------------------------------------------------


def test_config_from_gguf_matches_original(tiny):
    orig = json.loads((tiny.hf_dir / "config.json").read_text())
    got = gguf_to_hf_config(_first_shard(tiny, "Q8_0"))
    for key in ("indexer_rope_interleave", "scoring_func", "topk_method", "rope_interleave", "qk_nope_head_dim",
                "v_head_dim", "kv_lora_rank", "index_topk", "n_routed_experts", "rms_norm_eps", "rope_theta"):
        assert got[key] == orig[key], key
    # llama.cpp's converter writes bos = eos (the original tokenizer has no bos), and a quantized file's
    # checkpoint dtype is bfloat16: the only differences, both notes.
    diffs = compare_hf_configs(got, orig)
    assert [(d.key, d.severity) for d in diffs] == [("bos_token_id", "note"), ("torch_dtype", "note")]
    diffs = compare_hf_configs(gguf_to_hf_config(tiny.gguf["F32"]), orig)
    assert [(d.key, d.severity) for d in diffs] == [("bos_token_id", "note")]
    wrong = dict(orig, qk_nope_head_dim=128)
    assert any(d.key == "qk_nope_head_dim" and d.severity == "problem" for d in compare_hf_configs(got, wrong))


def test_tokenizer_from_gguf_encodes_like_original(tiny, tmp_path):
    from transformers import AutoTokenizer

    from glm5lib.model.tokenizer import SPECIAL_TOKENS, corpus_text

    gguf_to_hf_tokenizer(_first_shard(tiny, "Q8_0"), tmp_path)
    a = AutoTokenizer.from_pretrained(str(tiny.hf_dir.resolve()))
    b = AutoTokenizer.from_pretrained(str(tmp_path))
    text = corpus_text()[:4000] + " ünïcödé 😀 tabs\tand  spaces\n" + "".join(SPECIAL_TOKENS)
    assert a(text).input_ids == b(text).input_ids
    for tok in SPECIAL_TOKENS:  # each special token stays one id
        assert b(tok).input_ids == [a.convert_tokens_to_ids(tok)]
    chat = [{"role": "user", "content": "hi <|assistant|>"}, {"role": "assistant", "content": "ok"}]
    assert a.apply_chat_template(chat, add_generation_prompt=True) == b.apply_chat_template(chat, add_generation_prompt=True)
    assert b.eos_token == a.eos_token
    with pytest.raises(UserError, match="overwrite"):
        gguf_to_hf_tokenizer(tiny.gguf["Q8_0"], tmp_path)


# ---- export -----------------------------------------------------------------------------------------------------


def test_export_loads_in_transformers_with_equal_logits(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert cli_main(["map", "export", str(_first_shard(tiny, "F32")), str(out), "--quiet", "--max-shard-size", "2M"]) == 0
    assert len(list(out.glob("*.safetensors"))) > 1
    ref = AutoModelForCausalLM.from_pretrained(str(tiny.hf_dir.resolve()), dtype=torch.float32).eval()
    got, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = torch.randint(0, tiny.config.vocab_size, (1, 96), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, got.eval()(ids).logits)
    # refuses to overwrite, leaves nothing behind
    assert cli_main(["map", "export", str(tiny.gguf["F32"]), str(out), "--quiet"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_export_round_trip_of_a_llama_cpp_layout_file_is_bit_exact(tiny, hf_weights, tmp_path):
    """An HF checkpoint as GLM-5 ships it (BF16, e_score_correction_bias F32) -> BF16 GGUF in llama.cpp's layout
    (norms, router, biases F32) -> `map export --dtype auto`: every tensor comes back bit-exact in its original
    dtype; the F32 bias is not rounded through bf16."""
    from glm5lib.mapping.tiny import write_gguf

    f32_hf = {s.hf_names[0] for s in gguf_tensor_specs(tiny.config) if s.kind == "exp_probs_b.bias"}
    assert f32_hf
    shipped = {n: (t if n in f32_hf else t.to(torch.bfloat16)) for n, t in hf_weights.items()}
    gguf = write_gguf(tiny.config, shipped, tiny.hf_dir, tmp_path / "m.gguf", "BF16", progress=False)
    types = {t.name: t.type_name for t in open_model(gguf).tensors}
    assert types["blk.1.exp_probs_b.bias"] == "F32" and types["blk.1.attn_norm.weight"] == "F32"
    out = tmp_path / "hf"
    assert cli_main(["map", "export", "-q", str(gguf), str(out), "--mtp"]) == 0
    got = {}
    for f in out.glob("*.safetensors"):
        got.update(load_file(f))
    assert set(got) == set(shipped)
    for name, t in shipped.items():
        assert got[name].dtype == t.dtype, name
        assert torch.equal(got[name], t), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


# ---- check ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ft", ["F32", "BF16", "Q8_0", "Q4_0"])
def test_check_passes_clean_files(tiny, ft):
    report = check(_first_shard(tiny, ft), config=json.loads((tiny.hf_dir / "config.json").read_text()))
    assert report.ok, report.format_text()
    assert report.n_tensors == report.n_expected == len(gguf_tensor_specs(tiny.config))


@pytest.mark.parametrize("defect", sorted(defects(GLM5Config.tiny())))
def test_check_finds_each_planted_defect(tiny, tmp_path, defect):
    _, category = defects(tiny.config)[defect]
    bad = write_defect(tiny.gguf["F32"], tmp_path / f"{defect}.gguf", defect)
    report = check(bad)
    assert not report.ok and report.exit_code == 1
    assert report.count(category) >= 1, report.format_text()
    assert cli_main(["map", "check", str(bad), "--json"]) == 1


def test_check_exit_codes(tiny, tmp_path, capsys):
    assert cli_main(["map", "check", str(_first_shard(tiny, "Q8_0"))]) == 0
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all, just text" * 4)
    assert cli_main(["map", "check", str(junk)]) == 2
    assert cli_main(["map", "check", str(tmp_path / "absent.gguf")]) == 2
    assert "error:" in capsys.readouterr().err


def test_expected_inventory_counts():
    assert len(expected_inventory(GLM5Config.glm5())) == 1809
    glm52 = GLM5Config.glm5_2()
    shared = sum(not glm52.has_indexer(i) for i in range(glm52.num_hidden_layers))
    assert shared == 57
    assert len(expected_inventory(glm52)) == 1809 - 5 * shared
    k_b = next(e for e in expected_inventory(GLM5Config.glm5()) if e.name == "blk.0.attn_k_b.weight")
    assert k_b.ggml_shape == (192, 512, 64)
    assert {t.name for t in k_b.allowed_types} >= {"Q8_0", "Q5_0", "IQ4_NL", "BF16"}
    assert not {"Q4_K", "Q6_K", "IQ2_XXS"} & {t.name for t in k_b.allowed_types}


@pytest.mark.parametrize("preset", ["glm5", "glm5_2"])
def test_check_full_size_header_only_set_in_seconds(tmp_path, preset):
    """Real GLM-5 tensor infos (1,809, ~425 GB declared at Q4_K) in 9 sparse shards: proves check reads headers
    only and handles a real release's inventory, fallbacks and shard layout -- not that real bytes are right."""
    cfg = getattr(GLM5Config, preset)()
    shards = write_header_only_set(cfg, tmp_path / "GLM-5-Q4_K")
    assert len(shards) >= 9
    t0 = time.perf_counter()
    report = check(shards[len(shards) // 2])
    elapsed = time.perf_counter() - t0
    assert report.ok, report.format_text()
    assert report.n_tensors == len(gguf_tensor_specs(cfg)) == (1809 if preset == "glm5" else 1524)
    assert report.count("fallback") == cfg.num_layers_total  # every attn_k_b: Q4_K -> Q5_0
    assert report.main_type == "Q4_K" and sum(report.bytes_by_kind.values()) > 400e9
    assert elapsed < 10, elapsed
    # sparse: the data is a hole
    assert sum(p.stat().st_blocks * 512 for p in shards) < 200e6


# ---- layer-level numeric check ------------------------------------------------------------------------------------


def test_layer_check_separates_correct_from_broken_mappings(tiny):
    from glm5lib.mapping.layer_check import BROKEN, layer_check

    exact = layer_check(tiny.gguf["F32"], tiny.hf_dir)
    assert exact.results["hf_from_gguf"]["rel_err"] == 0.0
    assert exact.results["absorbed_from_gguf"]["rel_err"] < 1e-5  # the stored k_b/v_b layouts mean what kernels assume
    assert exact.indexer["topk_agreement"] == 1.0 and exact.indexer["scores_rel_err"] == 0.0
    q8 = layer_check(_first_shard(tiny, "Q8_0"), tiny.hf_dir)
    worst_good = max(q8.results[k]["cos_diff"] for k in ("hf_from_gguf", "absorbed_from_gguf"))
    assert worst_good < 1e-3
    for variant in BROKEN:
        assert q8.results[variant]["cos_diff"] > 0.1, variant  # orders of magnitude above quantization noise
        assert q8.results[variant]["cos_diff"] > 100 * worst_good, variant


# ---- GLM-5.2 IndexShare (shared layers without indexer tensors) -----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_shared(tmp_path_factory):
    from glm5lib.mapping.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("shared") / "tiny52", cfg=GLM5Config.tiny(shared_indexer=True),
                      types=("F32",), progress=False)


def test_index_share_file_maps_checks_and_exports(tiny_shared, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = tiny_shared.config
    assert cfg.indexer_types is not None and "shared" in cfg.indexer_types
    path = tiny_shared.shards["F32"][0] if tiny_shared.shards.get("F32") else tiny_shared.gguf["F32"]
    report = check(path)
    assert report.ok and report.n_tensors == len(gguf_tensor_specs(cfg)), report.format_text()
    assert gguf_to_hf_config(path)["indexer_types"] == list(cfg.indexer_types)
    ref_w = {}
    for f in tiny_shared.hf_dir.glob("*.safetensors"):
        ref_w.update(load_file(f))
    got = dict(iter_hf_weights(path, dtype=torch.float32))
    assert set(got) == set(ref_w) and all(torch.equal(got[k], ref_w[k]) for k in got)
    out = tmp_path / "hf"
    assert cli_main(["map", "export", str(path), str(out), "--quiet"]) == 0
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_shared.hf_dir), dtype=torch.float32).eval()
    new, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.arange(80)[None] % cfg.vocab_size
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, new.eval()(ids).logits)


def test_index_share_without_types_key_is_explained(tmp_path):
    """A GLM-5.2 file whose writer forgot attention.indexer.types: shared layers look like missing indexers."""
    from glm5lib.gguf.format import OutTensor
    from glm5lib.mapping.corpus import _write
    from glm5lib.model.spec import GGUF_ARCH

    cfg = GLM5Config.glm5_2()
    shards = write_header_only_set(cfg, tmp_path / "g52")
    gs = open_model(shards[0])
    kvs = [kv for kv in gs.headers[0].kvs if kv.key != f"{GGUF_ARCH}.attention.indexer.types"]
    ts = [OutTensor(t.name, t.ne, int(t.ggml_type), t.nbytes, t.path, t.offset) for t in gs.tensors
          if t.shard == 0]
    _write(shards[0], kvs, ts, sparse=True)
    report = check(shards[0])
    assert not report.ok and report.count("missing") == 57 * 5
    assert any("indexer.types" in f.message for f in report.findings if f.category == "metadata")


_MEMPROBE = """
import resource, sys, torch
torch.set_num_threads(1)
from glm5lib.mapping import iter_hf_weights
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n_exp, last = 0, None
for name, w in iter_hf_weights(sys.argv[1], dtype=torch.bfloat16, layers=[3]):
    last = (name, list(w.shape), str(w.dtype))
    n_exp += ".experts." in name
    if n_exp == 2:
        break
print(json.dumps({"peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, "last": last}))
"""


def test_streaming_memory_is_one_tensor_not_one_expert_stack(tmp_path):
    """Real GLM-5 shapes (header-only Q4_K set, data reads as zeros): the iterator yields per-expert tensors from
    a 256-expert stack while peak memory stays near one large tensor (o_proj, 100M values), far below the
    12.9 GB one float32 expert stack would take."""
    import subprocess
    import sys

    shards = write_header_only_set(GLM5Config.glm5(), tmp_path / "GLM-5-Q4_K")
    out = subprocess.run([sys.executable, "-c", "import json\n" + _MEMPROBE, str(shards[0])], capture_output=True,
                         text=True, check=True, timeout=300)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["last"] == ["model.layers.3.mlp.experts.1.gate_proj.weight", [2048, 6144], "torch.bfloat16"]
    assert res["peak_mb"] < 2500, res
