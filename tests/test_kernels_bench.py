"""The benchmark plumbing that runs without a GPU: the CLI's error without CUDA, the plot, default names."""

from __future__ import annotations

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


def test_plot_of_a_benchmark_json(tmp_path):
    """The plot reads a benchmark JSON (the committed H200 one as input; its contents: tests/test_evidence.py)."""
    png = bench.plot(COMMITTED, tmp_path / "b.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


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
