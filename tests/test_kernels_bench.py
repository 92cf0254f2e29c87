"""The benchmark plumbing that runs without a GPU: the CLI's error without CUDA, target evaluation and the plot
of the committed H200 JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glm5lib.bench import kernels as bench
from glm5lib.bench.cli import main as bench_main

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


def test_default_name_comes_from_the_gpu():
    assert bench.default_name("NVIDIA H200") == "bench_h200"
    assert bench.default_name("NVIDIA GeForce RTX 5090") == "bench_geforce_rtx_5090"
    assert bench.default_name("NVIDIA A100-SXM4-80GB") == "bench_a100_sxm4_80gb"


def test_naive_import_leaves_triton_alone():
    """The vLLM plugin's CPU path imports kernels.naive: no Triton, no interpreter switch for the process."""
    code = ("import os, sys; import glm5lib.kernels.naive, glm5lib.kernels; "
            "print('triton' in sys.modules, os.environ.get('TRITON_INTERPRET'))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "None"]
