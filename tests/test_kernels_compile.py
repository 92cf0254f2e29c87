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


_BROKEN = """
import dataclasses
from glm5lib.kernels.compile_report import _sig, compile_one, shipped_kernels
spec = next(s for s in shipped_kernels(90) if s.name.startswith("indexer_paged"))
consts = {k: v for k, v in spec.constexprs.items() if k != "KEYS_M"}
types = {k: v for k, v in spec.signature.items() if v.startswith("*") or k == "scale"}
row = compile_one(dataclasses.replace(spec, signature=_sig(spec.fn, types, consts), constexprs=consts), 90)
print(row.ok, row.error)
"""


def test_a_failed_compile_names_its_root_error():
    """A config that does not compile is a row whose error names Triton's root error and where it happened, not
    the caret line that ends Triton's message (here: the paged indexer without its KEYS_M constexpr, so both
    branches of the dot layout are compiled and their shapes clash). In a child: compiling needs the
    interpreter off."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    r = subprocess.run([sys.executable, "-c", _BROKEN], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ok, error = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert ok == "False" and error.startswith("CompilationError at ") and "of _paged_tile" in error, error
    assert "Mismatched type" in error
