"""AOT compile of every shipped kernel configuration for sm_80 / sm_89 / sm_90 / sm_120 (no GPU needed).

Each must compile and fit the target's shared memory per block (sm_89 / sm_120: 99 KB), keep its gathers in
16-byte loads, spill nothing to local memory, and (sm_90) use wgmma for the 64-head tiles.
"""

from __future__ import annotations

import pytest

from glm5lib.kernels.compile_report import ARCHS, compile_report


@pytest.fixture(scope="module")
def report():
    return compile_report(ARCHS, progress=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_config_compiles_and_fits(report, arch):
    rows = [r for r in report if r.arch == arch]
    assert len(rows) >= 20, f"sm_{arch}: only {len(rows)} kernels reported"
    bad = [f"{r.kernel}: {r.error or f'{r.shared_bytes} B > {r.limit_bytes} B'}" for r in rows if not (r.ok and r.fits)]
    assert not bad, f"sm_{arch}: " + "; ".join(bad)
    assert all(r.shared_bytes <= 99 * 1024 for r in rows) or arch in (80, 90)
    assert not any(r.local_mem for r in rows), "register spill to local memory"
    gathers = [r for r in rows if r.kernel.startswith(("sparse_mla", "indexer"))]
    assert all(r.vec16_loads > 0 for r in gathers), "a gather compiled to scalar loads"


def test_hopper_uses_wgmma_for_head_tiles(report):
    big = [r for r in report if r.arch == 90 and r.kernel.startswith("sparse_mla[large")]
    assert big and all(r.mma == "wgmma" for r in big)
    assert all(r.mma != "wgmma" for r in report if r.arch in (80, 89, 120))
