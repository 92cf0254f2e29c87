"""glm5lib.bench.gguf_ops summaries (no GPU): the target ratios and the residency sums computed from result rows."""

from __future__ import annotations

import pytest

from glm5lib.bench import gguf_ops


def _row(op, t, m, path, us, frac, nbytes=1000):
    return {"op": op, "type": t, "batch": m, "path": path, "us": us * 1.5, "us_graph": us, "copy_frac": frac / 1.5,
            "copy_frac_graph": frac, "weight_bytes": nbytes, "err": 1e-3}


def test_targets_ratios_and_verdicts():
    rows = [_row("q_b", "Q4_K", 1, "bf16", 6.0, 0.3), _row("q_b", "Q4_K", 1, "glm5lib", 3.0, 0.7),
            _row("q_b", "Q4_K", 64, "bf16", 6.0, 0.3), _row("q_b", "Q4_K", 64, "glm5lib", 12.0, 0.05),
            _row("q_b", "Q5_K", 8, "bf16", 6.0, 0.3), _row("q_b", "Q5_K", 8, "glm5lib", 4.0, 0.2)]
    tg = {(t["target"], t["type"], t["batch"], t["timing"]): t for t in gguf_ops.targets(rows)}
    cf = tg[("copy_frac", "Q4_K", 1, "_graph")]
    assert cf["measured"] == pytest.approx(0.7) and cf["met"]
    vs = tg[("vs_bf16", "Q4_K", 1, "_graph")]
    assert vs["measured"] == pytest.approx(2.0) and vs["met"]
    slow = tg[("vs_bf16", "Q4_K", 64, "_graph")]
    assert slow["measured"] == pytest.approx(0.5) and not slow["met"]
    assert ("copy_frac", "Q4_K", 64, "_graph") not in tg  # the copy-rate goal is for batch 1-8
    assert ("copy_frac", "Q5_K", 8, "_graph") not in tg  # and for Q4_K, Q6_K, Q8_0 only
    assert ("vs_bf16", "Q5_K", 8, "_graph") in tg


def test_dense_attn_sums_the_nonexpert_ops():
    ops = ["q_b", "o_proj", "q_a+kv_a", "shared_gate_up", "shared_down"]
    rows = []
    for i, op in enumerate(ops):
        rows.append(_row(op, "Q8_0", 1, "bf16", 2.0 + i, 0.5, nbytes=100))
        rows.append(_row(op, "Q8_0", 1, "glm5lib", 1.0, 0.5, nbytes=50))
    recs = [r for r in gguf_ops.dense_attn(rows) if r["group"] == "moe_layer_nonexpert"]
    assert len(recs) == 1  # the dense-layer group lacks its MLP rows: left out, not half-summed
    r = recs[0]
    assert r["bf16_us_graph"] == pytest.approx(sum(2.0 + i for i in range(5)))
    assert r["glm5lib_us_graph"] == pytest.approx(5.0)
    assert (r["bf16_bytes"], r["glm5lib_bytes"]) == (500, 250)
