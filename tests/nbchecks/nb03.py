"""Checks on what notebook 03 (the DSA indexer) records."""

from pathlib import Path


def _num(d: dict) -> dict:
    """JSON turns int keys into strings; give them back."""
    return {int(k): v for k, v in d.items()}


def check(report: dict) -> None:
    K = report["index_topk"]
    # the tiny model learned something worth analysing
    assert report["train_loss_last"] < 0.5 * report["train_loss_first"]
    assert report["indexer_kl_last"] < report["indexer_kl_first"]
    assert report["task_accuracy_dense"] > 0.8, report["task_accuracy_dense"]
    # dense == sparse exactly while T <= top-k, measurably different beyond
    assert report["dense_equals_sparse_upto_topk"] is True
    dvs = _num(report["dense_vs_sparse"])
    assert any(T <= K for T in dvs) and any(T > K for T in dvs)
    for T, e in dvs.items():
        assert e["exact"] is (T <= K), (T, e)
    # recall: a fraction, never above what the best k keys could keep
    mass, oracle = _num(report["mass_recall_vs_length"]), _num(report["oracle_mass_vs_length"])
    for T, layers in mass.items():
        for layer, v in layers.items():
            assert 0.0 < v <= oracle[T][layer] + 1e-6 <= 1.0 + 2e-6
    # the warmed-up indexer keeps most of the attention on the trained model
    T_max = max(mass)
    assert min(mass[T_max].values()) > 0.5, mass[T_max]
    # wrong (NeoX) indexer RoPE: invisible within top-k, measurably lower recall beyond, and detected
    assert report["rope_detected"] == "interleaved"
    assert report["neox_invisible_upto_topk"] is True
    rm = report["rope_mean_recall"]
    assert rm["interleaved"] > rm["neox"] + 0.02, rm
    # fp8: few picks flip
    for mode in ("e4m3", "e4m3_hadamard"):
        assert all(0.0 <= v < 0.5 for v in report["fp8"][mode]["flipped"].values())
    share = report["indexshare"]
    assert share["every_2"]["pattern"].startswith("FS")
    # docs/glm5.md cost numbers
    assert round(report["cost_sparse_mflop_per_token"]) == 285
    assert round(report["cost_gathered_kv_mb_bf16"], 2) == 2.36
    assert round(report["cost_gathered_kv_mb_fp8"], 2) == 1.34
    assert 34_000 < report["cost_flops_crossover"] < 36_000
    # GGUF streaming
    if "gguf_f32_equals_hf" in report:
        assert report["gguf_f32_equals_hf"] is True
    rows = report["gguf_layers"]["layers"]
    assert rows and all(r["seconds"] > 0 and 0 < r["rss_gb"] <= r["peak_rss_gb"] for r in rows)
    for key in ("fig_training", "fig_recall_length", "fig_recall_topk", "fig_dense_sparse", "fig_rope", "fig_fp8",
                "fig_cost", "fig_cost_prefill"):
        assert Path(report[key]).is_file(), key
    # the reference matches transformers on the trained model too
    assert report["reference_vs_transformers_max_abs"] <= 1e-4
    assert report["reference_vs_transformers_same_topk"] is True
    # the detector on weights converted to the NeoX layout: flips, and the recall swaps sides
    assert report["rope_detected_after_conversion"] == "neox"
    conv = report["rope_mean_recall_after_conversion"]
    assert abs(conv["neox"] - rm["interleaved"]) < 1e-3
