"""`glm5lib.bench.bounds`: the stage probes read exactly the rows the sparse-MLA kernel gathers (their totals
against torch's over the same rows, invalid indices included), on Triton's interpreter. Timing is GPU-only."""

import pytest
import torch

from glm5lib.bench import bounds
from glm5lib.kernels import naive


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "bf16"])
def test_probes_read_the_rows_the_kernel_reads(fmt):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, naive.D_QK, generator=gen)
    kv = torch.randn(200, naive.D_QK, generator=gen)
    idx = torch.randint(-3, 210, (3, 100), generator=gen, dtype=torch.int32)  # some -1 / out of range
    cache = naive.quantize_fp8_ds_mla(kv) if fmt == "fp8_ds_mla" else kv
    sums = bounds.probe_checksums(q, cache, idx, fmt)
    assert sums["gather+convert"][0] == pytest.approx(sums["gather+convert"][1], rel=1e-5, abs=1e-2)
    if fmt == "bf16":
        assert sums["gather"][0] == pytest.approx(sums["gather"][1], rel=1e-5, abs=1e-2)
    # a probe that skipped rows would miss: the same check over a shifted index set disagrees
    other = bounds.probe_checksums(q, cache, (idx + 1).clamp(max=199), fmt)
    assert other["gather+convert"][1] != pytest.approx(sums["gather+convert"][1], rel=1e-6)


def test_bounds_refuses_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert bounds.main(["--json", str(tmp_path / "b.json")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
