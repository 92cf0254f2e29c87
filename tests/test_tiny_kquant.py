"""llama.cpp K-quant fixtures of the tiny GLM-5 and the recipe that restates llama.cpp's per-tensor type choice.

- The fixtures (`ensure_tiny(types=TINY_KQUANT_TYPES)`: Q4_K_M, Q5_K_M, Q6_K made by the real `llama-quantize`)
  need the binary (scripts/build_llama_quantize.sh or $GLM5LIB_LLAMA_QUANTIZE). Without it those tests skip,
  unless GLM5LIB_REQUIRE_Q4KM=1 (CI), where they fail.
- The recipe (`glm5lib.model.quant.quant_recipe`) is proven against those files tensor by tensor, then used for
  header-only full-size GLM-5 Q4_K_M shard sets.
"""

from __future__ import annotations

import os
import re
import stat

import gguf
import numpy as np
import pytest

from glm5lib.errors import UserError
from glm5lib.gguf.format import tensor_nbytes
from glm5lib.mapping.corpus import header_only_types, write_header_only_set
from glm5lib.mapping.inventory import check
from glm5lib.mapping.source import open_model
from glm5lib.mapping.tiny import build_tiny, ensure_tiny, llama_quantize, llama_quantize_binary
from glm5lib.model.quant import quant_recipe, use_more_bits
from glm5lib.model.spec import LLAMA_QUANTIZE_TYPES, TINY_KQUANT_TYPES, GLM5Config, gguf_tensor_specs, split_block_name

REQUIRE = os.environ.get("GLM5LIB_REQUIRE_Q4KM") == "1"
try:
    BINARY = llama_quantize_binary()
except UserError:  # $GLM5LIB_LLAMA_QUANTIZE names no executable: the fixture reports it
    BINARY = None
needs_binary = pytest.mark.skipif(BINARY is None and not REQUIRE,
                                  reason="llama-quantize not built (scripts/build_llama_quantize.sh)")


@pytest.fixture(scope="module")
def kq():
    if BINARY is None:
        pytest.fail("GLM5LIB_REQUIRE_Q4KM=1 but llama-quantize is missing: run scripts/build_llama_quantize.sh or "
                    "set GLM5LIB_LLAMA_QUANTIZE")
    return ensure_tiny(types=TINY_KQUANT_TYPES, progress=False)


def _tensors(path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _kind_types(types: dict[str, str]) -> dict[str, list[str]]:
    """{tensor kind: sorted distinct types} for a report line."""
    out: dict[str, set[str]] = {}
    for name, t in types.items():
        out.setdefault(split_block_name(name)[1], set()).add(t)
    return {k: sorted(v) for k, v in out.items()}


# ---- the real llama-quantize output of the tiny model -----------------------------------------------------------


@needs_binary
@pytest.mark.parametrize("ftype", LLAMA_QUANTIZE_TYPES)
def test_llama_quantize_types_match_the_recipe(kq, ftype):
    got = {name: t.tensor_type.name for name, t in _tensors(kq.gguf[ftype]).items()}
    want = quant_recipe(kq.config, ftype)
    print(ftype, _kind_types(got))
    assert set(got) == set(want)
    assert {n: (got[n], want[n]) for n in want if got[n] != want[n]} == {}
    # the mix is a mix: several K-quant and fallback types, not one type everywhere
    assert len(set(got.values()) - {"F32"}) >= 2
    reader = gguf.GGUFReader(kq.gguf[ftype])
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType[f"MOSTLY_{ftype}"])


# Relative RMS error bound of each tensor type against the F32 weights (bf16 rounding of the source included);
# the tiny model's Gaussian weights measure at most 0.006 (Q8_0), 0.018 (Q6_K), 0.037-0.043 (Q5_K, Q5_1, Q5_0),
# 0.075 (Q4_K).
_REL_ERR = {"F32": 0.0, "Q8_0": 0.012, "Q6_K": 0.03, "Q5_K": 0.06, "Q5_0": 0.07, "Q5_1": 0.06, "Q4_K": 0.11}


@needs_binary
@pytest.mark.parametrize("ftype", ["Q4_K_S", "Q5_K_S", "Q8_0"])
def test_other_llama_quantize_types_match_the_recipe(kq, ftype, tmp_path):
    out = tmp_path / f"{ftype}.gguf"
    llama_quantize(BINARY, kq.gguf["BF16"], out, ftype)
    got = {name: t.tensor_type.name for name, t in _tensors(out).items()}
    want = quant_recipe(kq.config, ftype)
    assert {n: (got[n], want[n]) for n in want if got[n] != want[n]} == {} and set(got) == set(want)


@needs_binary
@pytest.mark.parametrize("ftype", LLAMA_QUANTIZE_TYPES)
def test_every_tensor_dequantizes_with_gguf_py_close_to_the_weights(kq, ftype):
    ref = _tensors(kq.gguf["F32"])
    worst: dict[str, float] = {}
    for name, t in _tensors(kq.gguf[ftype]).items():
        deq = gguf.quants.dequantize(t.data, t.tensor_type)
        want = np.asarray(ref[name].data, dtype=np.float32)
        assert deq.shape == want.shape, name
        err = float(np.linalg.norm(deq - want) / np.linalg.norm(want))
        kind = t.tensor_type.name
        assert err <= _REL_ERR[kind], (name, kind, err)
        worst[kind] = max(worst.get(kind, 0.0), err)
    print(ftype, {k: round(v, 4) for k, v in sorted(worst.items())})
    assert worst["F32"] == 0.0  # norms, router, biases: copied, not rounded


@needs_binary
@pytest.mark.parametrize("ftype", LLAMA_QUANTIZE_TYPES)
def test_map_check_passes_on_merged_file_and_shard_set(kq, ftype):
    n = len(gguf_tensor_specs(kq.config))
    for path in (kq.gguf[ftype], kq.shards[ftype][0]):
        report = check(path)
        assert report.ok, report.format_text()
        assert report.n_tensors == n
    assert len(kq.shards[ftype]) > 1
    merged = _tensors(kq.gguf[ftype])
    sharded = {t.name: t for t in open_model(kq.shards[ftype][0]).tensors}
    assert {k: t.ggml_type.name for k, t in sharded.items()} == {k: t.tensor_type.name for k, t in merged.items()}


@needs_binary
def test_llama_quantize_log_names_the_shape_fallbacks(kq):
    """llama.cpp's own account of its choices (kept beside the file): every tensor whose rows a K-quant cannot
    hold is named with the type it fell back to, and those are exactly where the recipe falls back."""
    log = (kq.root / "llama-quantize-Q4_K_M.log").read_text()
    fell = {name: t.upper() for name, t in  # ggml_type_name spells types in lower case
            re.findall(r"warning: (\S+)\s+- ncols\s+\d+ not divisible by \d+ .*?-> falling back to\s+(\S+)", log)}
    assert fell, log[-2000:]
    recipe = quant_recipe(kq.config, "Q4_K_M")
    assert {n: recipe[n] for n in fell} == fell
    kinds = {split_block_name(n)[1] for n in fell}
    assert {"attn_k_b.weight", "attn_q_b.weight", "indexer.attn_q_b.weight"} <= kinds  # rows of 192, 128, 128


def test_a_failing_llama_quantize_is_one_user_error_and_leaves_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "llama-quantize"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"llama_model_quantize: failed to quantize: unknown model architecture\" >&2\n"
                    "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("GLM5LIB_LLAMA_QUANTIZE", str(fake))
    out = tmp_path / "models"
    out.mkdir()
    with pytest.raises(UserError, match="llama-quantize Q4_K_M failed .*unknown model architecture"):
        build_tiny(out / "t", types=("F32", "Q4_K_M"), progress=False)
    assert list(out.iterdir()) == []
    monkeypatch.setenv("GLM5LIB_LLAMA_QUANTIZE", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="GLM5LIB_LLAMA_QUANTIZE"):
        build_tiny(out / "t", types=("Q4_K_M",), progress=False)
    assert list(out.iterdir()) == []


# ---- the recipe at full size ---------------------------------------------------------------------------------------


def test_use_more_bits_picks_first_last_eighth_and_every_third_layer():
    # GLM-5: 79 blocks (78 + MTP): 79 // 8 = 9, 7 * 79 // 8 = 69
    assert {i for i in range(79) if use_more_bits(i, 79)} == set(range(9)) | set(range(11, 69, 3)) | set(range(69, 79))
    assert [i for i in range(4) if use_more_bits(i, 4)] == [2, 3]  # the tiny model's 4 blocks


def test_glm5_q4_k_m_recipe():
    cfg = GLM5Config.glm5()
    r = quant_recipe(cfg, "Q4_K_M")
    specs = gguf_tensor_specs(cfg)
    assert len(r) == len(specs) == 1809
    kinds = _kind_types(r)
    assert kinds["output.weight"] == ["Q6_K"] and kinds["token_embd.weight"] == ["Q4_K"]
    assert kinds["attn_k_b.weight"] == ["Q5_0"]  # rows of 192: the block-32 fallback
    for k in ("attn_q_b.weight", "attn_output.weight", "indexer.attn_k.weight", "indexer.attn_q_b.weight",
              "attn_v_b.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "nextn.eh_proj.weight"):
        assert kinds[k] == ["Q4_K"], k
    # llama-quantize quantizes every 2-D "...weight" that is not a norm or the router: indexer.proj too
    assert kinds["indexer.proj.weight"] == ["Q4_K"] and kinds["ffn_gate_inp.weight"] == ["F32"]
    assert all(r[s.gguf_name] == "F32" for s in specs if len(s.shape) == 1)
    q6 = {split_block_name(n)[0] for n, t in r.items() if "ffn_down" in n and t == "Q6_K"}
    q4 = {split_block_name(n)[0] for n, t in r.items() if "ffn_down" in n and t == "Q4_K"}
    assert q6 == {i for i in range(79) if use_more_bits(i, 79)} and len(q6) == 39 and q4 == set(range(79)) - q6


def test_eight_expert_rules_follow_the_expert_count():
    """llama.cpp's Mixtral rules fire on any 8-expert model: the tiny GLM-5 gets Q8_0 indexer.attn_k and Q5_K
    attn_output, GLM-5 (256 experts) does not."""
    for cfg, attn_k, attn_out in ((GLM5Config.tiny(), "Q8_0", "Q5_K"), (GLM5Config.glm5(), "Q4_K", "Q4_K"),
                                  (GLM5Config.glm5().replace(n_routed_experts=8), "Q8_0", "Q5_K")):
        r = quant_recipe(cfg, "Q4_K_M")
        assert r["blk.1.indexer.attn_k.weight"] == attn_k and r["blk.1.attn_output.weight"] == attn_out
    assert quant_recipe(GLM5Config.tiny(), "Q5_K_M")["blk.1.attn_output.weight"] == "Q5_K"
    with pytest.raises(ValueError, match="no llama-quantize recipe"):
        quant_recipe(GLM5Config.tiny(), "IQ2_XXS")


def test_header_only_glm5_q4_k_m_set_is_release_sized_and_checks(tmp_path):
    cfg = GLM5Config.glm5()
    shards = write_header_only_set(cfg, tmp_path / "GLM-5-Q4_K_M", types="Q4_K_M")
    gs = open_model(shards[0])
    types = {t.name: t.ggml_type.name for t in gs.tensors}
    assert types == quant_recipe(cfg, "Q4_K_M")
    total = sum(t.nbytes for t in gs.tensors)
    q4_k = header_only_types(cfg, main_type="Q4_K")
    plain = sum(tensor_nbytes(s.ggml_shape, int(gguf.GGMLQuantizationType[q4_k[s.gguf_name]]))
                for s in gguf_tensor_specs(cfg))
    print(f"GLM-5 Q4_K_M header-only: {len(shards)} shards, {total / 1e9:.1f} GB declared "
          f"({total / 2**30:.1f} GiB); plain Q4_K {plain / 1e9:.1f} GB")
    assert 430e9 < total < 470e9  # public GLM-5 Q4_K_M releases: ~400-460 GB
    assert total > plain  # Q6_K on output and 39 of 79 ffn_down blocks
    assert gs.kv["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    report = check(shards[len(shards) // 2])
    assert report.ok, report.format_text()
    assert report.main_type == "Q4_K" and report.count("fallback") == cfg.num_layers_total  # attn_k_b
