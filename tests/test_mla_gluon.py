"""Gluon sparse-MLA decode kernel (`kernels.mla_gluon`), compile-only: Gluon does not run in Triton's interpreter,
so numerics are checked by `scripts/gluon_mla_device.py` on a GPU. Here every config is compiled ahead of time for
sm_90 and sm_120 (in a subprocess with TRITON_INTERPRET=0: under the interpreter Triton's own helpers such as
`gl.max` are interpreted functions the compiler refuses) and must spill nothing; the default config must fit
sm_120's 99 KB per block, every config (the warp-specialized ones included) sm_90's 227 KB."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from glm5lib.kernels import mla_gluon

pytestmark = pytest.mark.skipif(not mla_gluon.HAVE_GLUON, reason="this Triton has no Gluon")

_SCRIPT = """
import json, sys
from glm5lib.kernels import mla_gluon as m
for arch in (90, 120):
    for cfg in m.CONFIGS:
        try:
            r = m.compile_stats(arch, *cfg)
        except Exception as exc:
            r = {"config": m.config_name(cfg), "arch": arch, "error": str(exc)[-400:]}
        print(json.dumps(r), flush=True)
"""


@pytest.fixture(scope="module")
def stats():
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if not rows:
        pytest.fail(f"no compile results: {p.stderr[-2000:]}")
    return rows


def _key(r):
    return f"sm_{r['arch']} {r['config']}"


def test_every_config_compiles_without_spills(stats):
    assert len(stats) == 2 * len(mla_gluon.CONFIGS)
    bad = [f"{_key(r)}: {r['error']}" for r in stats if "error" in r]
    assert not bad, "; ".join(bad)
    assert not [_key(r) for r in stats if r["local"] or r["stack"]], "register spill (stack frame or local memory)"


def test_shared_memory_within_the_class_limit(stats):
    for r in stats:
        if r["arch"] == 90:
            assert r["fits"], f"{_key(r)}: {r['shared']} B > {r['limit']} B"
        assert r["shared"] >= mla_gluon.smem_bytes_estimate(r["block_n"], r["nbuf"], r["depth"])
    small = [r for r in stats if r["arch"] == 120 and r["block_n"] == 32 and r["nbuf"] <= 2 and not r["depth"]]
    assert len(small) == 2 and all(r["fits"] for r in small), "the 32-key 1-2 buffer configs must fit sm_120's 99 KB"


def test_split_plan_matches_the_triton_rule():
    import torch

    cpu = torch.device("cpu")  # smem class "big": the sm_90 rule, 132 SMs assumed off-GPU
    for T in (1, 32, 128, 600):
        splits, kps = mla_gluon.plan_splits(T, 2048, 32, cpu)
        assert splits * kps >= 2048 and (splits - 1) * kps < 2048 and kps % 32 == 0
    assert mla_gluon.plan_splits(600, 2048, 32, cpu)[0] == 1


def test_config_names_and_keywords():
    names = [mla_gluon.config_name(c) for c in mla_gluon.CONFIGS]
    assert len(set(names)) == len(names)
    assert mla_gluon.WS_CONFIGS and all(mla_gluon.config_kwargs(c)["ws"] for c in mla_gluon.WS_CONFIGS)
    assert mla_gluon.config_kwargs((32, 4, 2, "ws3"))["depth"] == 3
    assert "ws" not in mla_gluon.config_kwargs(mla_gluon.DEFAULT)
