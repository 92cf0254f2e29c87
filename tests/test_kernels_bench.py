"""The benchmark plumbing that runs without a GPU: the CLI's error without CUDA, target evaluation and the plot
of the committed H200 JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glm5lib.kernels import bench
from glm5lib.kernels.cli import main as bench_main

COMMITTED = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "bench_h200.json"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_bench_without_gpu_is_a_user_error(tmp_path, capsys):
    assert bench_main(["bench", "sparse-mla", "--out", str(tmp_path)]) == 3
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(not COMMITTED.is_file(), reason="no committed H200 benchmark")
def test_committed_json_targets_and_plot(tmp_path):
    res = json.loads(COMMITTED.read_text())
    assert res["meta"]["gpu"].startswith("NVIDIA") and res["meta"]["flashmla"] == "loaded"
    assert res["ceilings"]["copy_GBps"] > 1000 and res["ceilings"]["matmul_bf16_TFLOPs"] > 100
    again = {t["target"]: t for t in bench.evaluate_targets(res)}
    for t in res["targets"]:  # recomputing from the rows gives the recorded verdicts
        assert again[t["target"]]["met"] == t["met"], t
    # every correctness-checked row agreed with the fp32 reference
    for r in res["rows"]:
        if r.get("rel_err") is not None:
            assert r["rel_err"] < 1e-2, r
    png = bench.plot(COMMITTED, tmp_path / "b.png")
    assert png.stat().st_size > 10_000


def test_plot_cli_missing_file(tmp_path, capsys):
    assert bench_main(["bench", "plot", str(tmp_path / "nope.json")]) == 2
    assert "no benchmark JSON" in capsys.readouterr().err
