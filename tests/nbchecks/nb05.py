"""Values notebook 05 (vLLM serving) records, asserted."""


def check(report: dict) -> None:
    rows = {r["target"]: r for r in report["doctor_rows"]}
    assert set(rows) == {"12.0", "9.0", "8.0", "cpu"}
    # SM120 and SM80 have no sparse MLA backend vLLM can run; CPU refuses sparse attention outright.
    assert rows["12.0"]["vllm_fails"] and rows["8.0"]["vllm_fails"] and rows["cpu"]["vllm_fails"]
    assert all(r["glm5lib_accepts"] for r in rows.values())
    assert rows["8.0"]["indexer_vllm_ok"] is False  # no DeepGEMM on SM80
    assert report["doctor_sm120_vllm_fails"] and report["doctor_sm120_glm5lib_accepts"]
    assert report["doctor_cpu_vllm_error"] == "Sparse Attention is not supported on CPU."

    assert 0 < report["server_start_s"] < 900
    assert report["chat_completion_tokens"] == 8 and report["chat_logprobs_n"] == 8

    assert report["reference_tokens_equal"] is True
    assert report["reference_max_abs_logprob_diff"] <= 1e-3
    assert max(report["reference_prompt_lens"]) > 64  # past the tiny model's index_topk

    assert report["burst_n_ok"] >= 32 and report["burst_n_failed"] == 0
    assert report["burst_equal_sequential"] is True
    assert report["burst_tokens_per_s"] > 0
    assert report["server_generation_tokens"] == 8 * report["burst_n_ok"]

    codes = report["malformed_codes"]
    assert set(codes) >= {"bad_json", "unknown_model", "prompt_too_long", "negative_max_tokens"}
    assert all(400 <= c < 500 for c in codes.values()), codes
    assert report["healthy_after_malformed"] is True
    assert report["server_stopped"] is True
