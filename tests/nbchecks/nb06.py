"""Checks on what notebook 06 (deployment plan) records."""


def check(report: dict) -> None:
    assert report["tensors"] == 1809
    s = report["setups"]
    pro, h200, a100 = s["8x RTX PRO 6000 96 GB"], s["8x H200"], s["8x A100 80 GB"]
    # the seed's case: Q4_K_M fits 8x RTX PRO 6000 with quantized weights, and not as bf16
    assert pro["fits"] is True and report["bf16_fits"] is False
    assert 50 < pro["weights_gb_per_gpu"] < 62 and report["bf16_weights_gb_per_gpu"] > 180
    assert report["bf16_shortfall_gb"] > 80 and report["bf16_suggestions"]
    assert h200["fits"] is True and a100["fits"] is True
    # the same weights everywhere (same file, same tp); fp8 cache 79 x 788 B, bf16 79 x 1284 B
    assert pro["weights_gb_per_gpu"] == h200["weights_gb_per_gpu"] == a100["weights_gb_per_gpu"]
    assert pro["kv_bytes_per_token"] == a100["kv_bytes_per_token"] == 62_252 and h200["kv_bytes_per_token"] == 101_436
    assert h200["max_kv_tokens"] > pro["max_kv_tokens"] > a100["max_kv_tokens"] > 0
    for p in s.values():
        ms = [p["decode_ms"][b] for b in sorted(p["decode_ms"], key=int)]
        assert ms == sorted(ms) and ms[0] > 0
        assert "-tp 8" in p["vllm_command"]
    assert h200["decode_ms"]["1"] < a100["decode_ms"]["1"]
    # longer contexts, fewer sequences, for every setup
    c = report["curves"]
    for label in s:
        seqs = c[label]
        assert seqs == sorted(seqs, reverse=True) and seqs[0] > seqs[-1]
    assert report["fig_context_vs_sequences"].endswith(".png")
