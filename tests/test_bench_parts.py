"""glm5lib.bench.parts: the fp8-cache kernel's H200 ablation runs read back, tabled and plotted on the CPU."""

import json

import pytest

from glm5lib.bench import parts


def test_committed_runs_load_with_every_part_and_shape():
    for name in parts.RUNS:
        run = parts.load_run(parts.run_path(name))
        assert run["commit"] and name.endswith(f"_{run['commit']}.json")
        shapes = {k[:3] for k in run["parts"]}
        assert shapes == set(parts.SHAPES)
        assert {("decode", 32), ("decode", 128), ("prefill", 4096)} <= set(run["gather"])
        text = parts.table(run)
        for (kind, T, H, cfg), r in run["parts"].items():
            assert f"| {kind} | {T} | {H} | {cfg} |" in text
            assert f"{r['whole_us']:.1f}" in text


def test_overlap_is_the_hidden_share_of_the_shorter_part():
    assert parts.overlap({"gathers_us": 60.0, "compute_us": 40.0, "whole_us": 60.0}) == 1.0
    assert parts.overlap({"gathers_us": 60.0, "compute_us": 40.0, "whole_us": 100.0}) == 0.0
    assert parts.overlap({"gathers_us": 60.0, "compute_us": 40.0, "whole_us": 80.0}) == pytest.approx(0.5)
    assert parts.overlap({"gathers_us": 60.0, "whole_us": 80.0}) is None  # a part whose launch failed
    run = parts.load_run(parts.run_path(parts.RUNS[0]))
    r = run["parts"]["decode", 128, 8, "fp8mma-nbufG-f16-nplan-t8"]
    assert parts.overlap(r) == pytest.approx(r["overlap"])  # the device script's own figure


def test_plot_writes_one_png(tmp_path):
    out = parts.plot(parts.load_run(parts.run_path(parts.RUNS[0])), tmp_path / "f" / "parts.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["parts.png"]  # no temporary file left beside it


def test_a_run_without_ablation_rows_is_refused(tmp_path):
    bad = tmp_path / "fp8mma.json"
    bad.write_text(json.dumps({"meta": {"commit": "x"}, "rows": [{"case": "B1", "kernel": "fp8mma", "ok": True}]}))
    with pytest.raises(ValueError, match="no ablation rows"):
        parts.load_run(bad)
