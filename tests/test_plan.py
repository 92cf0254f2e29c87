"""The GLM-5 size model (glm5lib.model.sizes) and `glm5lib plan` on a header-only full-size Q4_K_M shard set."""

import json

import pytest

from glm5lib.cli import main
from glm5lib.mapping.corpus import write_header_only_set
from glm5lib.model import sizes as S
from glm5lib.model.spec import GLM5Config, gguf_tensor_specs

G5 = GLM5Config.glm5()

# ---- hand-counted GLM-5 (docs/glm5.md section 1) ---------------------------------------------------------------
V, D, H, QR, KR, NOPE, ROPE, VD, HI, DI, E, I, IDENSE = 154880, 6144, 64, 2048, 512, 192, 64, 256, 32, 128, 256, 2048, 12288
NORMS = D + QR + KR + D  # attn_norm, q_a_norm, kv_a_norm, ffn_norm
REPL_ATTN = QR * D + (KR + ROPE) * D + HI * DI * QR + DI * D + 2 * DI + HI * D  # q_a, kv_a, wq_b, wk, k_norm, proj
SPLIT_ATTN = H * (NOPE + ROPE) * QR + H * KR * NOPE + H * VD * KR + D * H * VD  # q_b, k_b, v_b, o
DENSE_MLP, ROUTER = 3 * IDENSE * D, E * D + E
EXPERTS, SHARED = 3 * E * I * D, 3 * I * D
MTP_REPL = D * 2 * D + 3 * D  # eh_proj, enorm, hnorm, shared_head_norm
LAYER = NORMS + REPL_ATTN + SPLIT_ATTN
TOTAL = 2 * V * D + D + 79 * LAYER + 3 * DENSE_MLP + 76 * (ROUTER + EXPERTS + SHARED) + MTP_REPL
PER_GPU_TP8 = (2 * V * D) // 8 + D + 79 * (NORMS + REPL_ATTN + SPLIT_ATTN // 8) + 3 * DENSE_MLP // 8 \
    + 76 * (ROUTER + (EXPERTS + SHARED) // 8) + MTP_REPL


def test_parameters_and_tensors_match_a_hand_count():
    assert len(gguf_tensor_specs(G5)) == 1809
    m = S.size_model(G5, None, tp=8)
    assert len(m.tensors) == 1809
    assert m.params_total == TOTAL == 753_864_139_008
    assert m.params_per_gpu == PER_GPU_TP8 == 96_166_994_176
    one = S.size_model(G5, None, tp=1)
    assert one.params_per_gpu == TOTAL
    by = {t.kind: t.split for t in m.tensors}
    assert by["attn_q_a.weight"] == by["attn_kv_a_mqa.weight"] == by["indexer.attn_q_b.weight"] == "replicated"
    assert by["indexer.attn_k.weight"] == by["ffn_gate_inp.weight"] == by["exp_probs_b.bias"] == "replicated"
    assert by["attn_k_b.weight"] == by["attn_q_b.weight"] == by["attn_output.weight"] == "split"
    assert by["ffn_down_exps.weight"] == "experts" and by["output.weight"] == "vocab"


def test_bf16_bytes_per_gpu_are_two_per_parameter_plus_the_fp32_ones_and_buffers():
    m = S.size_model(G5, S.quant_recipe(G5, "BF16"), tp=8, residency="dequantized", max_num_batched_tokens=8192)
    fp32 = sum(t.params_per_gpu for t in m.tensors if t.kind in S.FP32_KINDS)
    assert sum(t.bytes_per_gpu for t in m.tensors) == 2 * PER_GPU_TP8 + 2 * fp32
    assert m.buffer_bytes_per_gpu == 202752 * 64 * 2 + 8192 * 2048 * 4  # RoPE cache, top-k index buffer
    assert m.weights_bytes_per_gpu == 2 * PER_GPU_TP8 + 2 * fp32 + m.buffer_bytes_per_gpu > 190e9


def test_q4_k_m_residencies_order_and_loader_dequantized_tensors():
    r = S.quant_recipe(G5, "Q4_K_M")
    assert r["output.weight"] == "Q6_K" and r["blk.0.attn_k_b.weight"] == "Q5_0" and r["blk.3.attn_norm.weight"] == "F32"
    assert {r[f"blk.{i}.ffn_down_exps.weight"] for i in range(3, 79)} == {"Q4_K", "Q6_K"}
    q, d, f = (S.size_model(G5, r, tp=8, residency=x) for x in ("quantized", "dense-attn", "dequantized"))
    assert q.weights_bytes_per_gpu < d.weights_bytes_per_gpu < f.weights_bytes_per_gpu
    assert q.expert_bytes_per_gpu == d.expert_bytes_per_gpu < f.expert_bytes_per_gpu / 3
    res = {t.kind: t.resident for t in q.tensors}
    for kind in S.LOADER_DEQUANTIZED:  # built unquantized by vLLM / rebuilt by the loader: serving dtype
        assert res[kind] == "bfloat16", kind
    assert res["ffn_up_exps.weight"] == "Q4_K" and res["attn_q_b.weight"] == "Q4_K"
    assert 50e9 < q.weights_bytes_per_gpu < 62e9  # docs/glm5.md section 8: ~52-58 GB per GPU at TP 8
    assert 440e9 < q.file_bytes < 470e9


def test_kv_bytes_per_token_and_block_rounding():
    assert S.kv_bytes_per_token(G5, "fp8_ds_mla")["total"] == 79 * (656 + 132) == 62_252
    assert S.kv_bytes_per_token(G5, "auto", "bfloat16")["total"] == 79 * (1152 + 132)
    assert S.kv_bytes_per_token(G5, "fp8_ds_mla", include_mtp=False)["total"] == 78 * 788
    g52 = GLM5Config.glm5_2()  # IndexShare: 21 of 78 layers (+ MTP) keep indexer keys
    assert S.kv_bytes_per_token(g52, "fp8_ds_mla")["indexer"] == (21 + 1) * 132
    assert S.kv_tokens(64 * 788 * 10 + 787, 788) == 640 and S.kv_tokens(-5, 788) == 0
    assert S.sequences_at(640, 65) == 5 and S.sequences_at(640, 64) == 10


def test_distinct_experts():
    assert S.expected_distinct_experts(1, 256, 8) == pytest.approx(8)
    assert S.expected_distinct_experts(8, 256, 8) == pytest.approx(256 * (1 - (31 / 32) ** 8)) == pytest.approx(57.42, abs=0.01)
    assert 250 < S.expected_distinct_experts(256, 256, 8) < 256


# ---- the command on a header-only full-size Q4_K_M shard set ---------------------------------------------------


@pytest.fixture(scope="module")
def q4km(tmp_path_factory):
    d = tmp_path_factory.mktemp("q4km")
    return write_header_only_set(G5, d / "GLM-5-Q4_K_M", types=S.quant_recipe(G5, "Q4_K_M"))


def _plan(capsys, *args):
    capsys.readouterr()
    rc = main(["plan", *map(str, args), "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else None


KEYS = ("weights_bytes_per_gpu", "kv_bytes_per_token", "max_kv_tokens", "fits", "decode_ms_estimate", "vllm_command")


def test_rtx_pro_6000_fits_quantized_and_not_as_bf16(q4km, capsys):
    shard = q4km[len(q4km) // 2]
    rc, p = _plan(capsys, shard, "--gpus", 8, "--gpu-mem", "96GB", "--cc", "12.0", "--kv-cache-dtype", "fp8_ds_mla")
    assert rc == 0 and p["fits"] and all(k in p for k in KEYS)
    assert p["gpu"] == "NVIDIA RTX PRO 6000 Blackwell" and p["kv_bytes_per_token"] == 62_252
    assert 50e9 < p["weights_bytes_per_gpu"] < 62e9 and p["max_kv_tokens"] > 202_752
    assert p["max_kv_tokens"] % 64 == 0
    assert "--attention-backend GLM5_SPARSE_MLA" in p["vllm_command"] and "-tp 8" in p["vllm_command"]
    assert "--kv-cache-dtype fp8_ds_mla" in p["vllm_command"]
    # the file's header types give the same plan as the recipe for a hypothetical file
    rc2, pre = _plan(capsys, "--preset", "glm5", "--quant", "Q4_K_M", "--gpus", 8, "--gpu-mem", "96GB", "--cc", "12.0",
                     "--kv-cache-dtype", "fp8_ds_mla")
    assert rc2 == 0 and pre["weights_bytes_per_gpu"] == p["weights_bytes_per_gpu"]
    rc, bf = _plan(capsys, shard, "--gpus", 8, "--gpu-mem", "96GB", "--cc", "12.0", "--residency", "dequantized")
    assert rc == 1 and not bf["fits"] and all(k in bf for k in KEYS) and bf["max_kv_tokens"] == 0
    assert bf["weights_bytes_per_gpu"] > 180e9 and bf["shortfall_bytes"] > 90e9
    joined = " ".join(bf["suggestions"])
    assert "--residency" in joined and "GPUs" in joined  # computed: a quantized residency and more GPUs would fit


def test_h200_and_a100_plans(q4km, capsys):
    rc, h = _plan(capsys, q4km[0], "--gpus", 8, "--gpu", "h200")
    assert rc == 0 and h["fits"] and h["attention_backend"] is None and h["kv_bytes_per_token"] == 101_436
    ms = [h["decode_ms_estimate"][b] for b in ("1", "8", "32", "64", "128", "256")]
    assert ms == sorted(ms) and ms[0] > 0
    tok = [h["decode_tokens_per_s"][b] for b in ("1", "8", "32", "64", "128", "256")]
    assert tok == sorted(tok)
    rc, a = _plan(capsys, q4km[0], "--gpus", 8, "--gpu-mem", "80GiB", "--cc", "8.0")
    assert a["gpu"] == "NVIDIA A100 80GB" and a["attention_backend"] == "GLM5_SPARSE_MLA"
    assert a["decode_ms_estimate"]["1"] > h["decode_ms_estimate"]["1"]  # less bandwidth, slower link
    # a 202,752-token sequence does not fit an A100 with the bf16 cache (CUDA graphs reserved); the fp8 cache holds
    # 1152+132 / 656+132 times the tokens in the same bytes, and a shorter context fits
    assert rc == 1 and not a["fits"] and any("max-model-len" in s for s in a["suggestions"])
    rc8, a8 = _plan(capsys, q4km[0], "--gpus", 8, "--gpu-mem", "80GiB", "--cc", "8.0", "--kv-cache-dtype", "fp8_ds_mla")
    ratio = a8["max_kv_tokens"] / a["max_kv_tokens"]
    assert abs(ratio - 101_436 / 62_252) < 0.02, ratio
    rc, short = _plan(capsys, q4km[0], "--gpus", 8, "--gpu-mem", "80GiB", "--cc", "8.0", "--kv-cache-dtype",
                      "fp8_ds_mla", "--max-model-len", 131072)
    assert rc == 0 and short["fits"]


def test_more_context_fewer_sequences(capsys):
    seqs = []
    for L in (8192, 32768, 131072):
        rc, p = _plan(capsys, "--preset", "glm5", "--quant", "Q4_K_M", "--gpus", 8, "--gpu", "h200", "--max-model-len", L)
        assert rc == 0
        seqs.append(p["max_concurrent_seqs"])
        assert p["max_concurrent_seqs"] == p["max_kv_tokens"] // L
    assert seqs[0] > seqs[1] > seqs[2] >= 1


def test_unusable_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf")
    assert main(["plan", str(bad), "--gpus", "8", "--gpu-mem", "96GB"]) == 2
    assert main(["plan", str(tmp_path / "missing.gguf"), "--gpus", "8", "--gpu-mem", "96GB"]) == 2
    assert main(["plan", "--preset", "glm5", "--gpus", "3", "--gpu-mem", "96GB"]) == 2
    assert main(["plan", "--preset", "glm5", "--gpus", "8", "--gpu-mem", "lots"]) == 2
    assert main(["plan", "--preset", "glm5", "--quant", "Q3_X", "--gpus", "8", "--gpu-mem", "96GB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith("error: ") for line in err) and len(err) == 5


def test_human_output_fits_a_screen(capsys):
    rc = main(["plan", "--preset", "glm5", "--quant", "Q4_K_M", "--gpus", "8", "--gpu", "rtx-pro-6000"])
    out = capsys.readouterr().out
    assert rc == 0 and len(out.splitlines()) <= 40
    assert "ESTIMATE" in out and "ESTIMATED" in out and "$ vllm serve GLM-5-Q4_K_M-00001-of-000NN.gguf" in out
