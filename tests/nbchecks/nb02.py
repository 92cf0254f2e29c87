"""Notebook 02 (weight mapping): the values it records, asserted."""


def check(report: dict) -> None:
    assert report["expected_glm5"] == 1809
    assert report["expected_glm5_2"] == 1809 - 57 * 5
    assert report["check_ok"] is True
    assert report["check_tensors"] == report["check_expected"]
    counts = report["check_counts"]
    for category in ("missing", "unexpected", "misshapen", "type", "metadata", "config"):
        assert counts[category] == 0, category

    kinds = report["table_kinds"]
    assert kinds["k_b"] == kinds["v_b"] > 0 and kinds["experts"] % 3 == 0
    assert sum(kinds.values()) == report["table_rows_full"] == report["check_expected"]

    rt = report["kv_b_round_trip"]
    assert rt["k_b_exact"] and rt["v_b_exact"]
    assert rt["w_uk_head0_is_k_b_transposed"] and rt["w_uv_head0_is_v_b"]

    lc = report["layer_check"]["results"]
    good = max(lc["hf_from_gguf"]["cos_diff"], lc["absorbed_from_gguf"]["cos_diff"])
    assert good < 1e-2
    for broken in ("k_b_not_transposed", "kv_swapped", "kv_b_blocked"):
        assert lc[broken]["cos_diff"] > 0.1 and lc[broken]["cos_diff"] > 100 * good, broken

    if not report["is_tiny"]:
        return
    w = report["weights_compare"]
    for ft in ("F32", "BF16"):
        assert w[ft]["bit_exact"] == w[ft]["compared"] > 0, ft
        assert not w[ft]["hf_not_rebuilt"] and not w[ft]["missing_in_hf"]
    assert w["Q8_0"]["compared"] == w["F32"]["compared"] and 0 < w["Q8_0"]["worst_rel_err"] < 0.02

    f32 = report["layer_check_f32"]
    assert f32["results"]["hf_from_gguf"]["rel_err"] == 0.0
    assert f32["results"]["absorbed_from_gguf"]["rel_err"] < 1e-5
    assert f32["indexer"]["topk_agreement"] == 1.0

    for name, d in report["defects"].items():
        assert d["exit_code"] == 1 and d["found"] >= 1, name
    assert {"missing_tensor", "wrong_shape", "swapped_k_b_v_b", "key_length"} <= set(report["defects"])

    assert {d["key"] for d in report["config_diffs"]} <= {"bos_token_id", "torch_dtype"}
    assert all(d["severity"] == "note" for d in report["config_diffs"])
    tok = report["tokenizer"]
    assert tok["texts_equal"] == tok["texts"] > 0 and tok["chat_equal"] is True
    assert tok["special_tokens_whole"] == tok["special_tokens"] > 0
