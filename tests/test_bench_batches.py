"""glm5lib.bench.batches: a `--batches` run read back, judged and plotted on the CPU, on synthetic rows (the committed
GPU run is held by tests/test_evidence.py)."""

import json

import pytest

from glm5lib.bench import batches


def _row(H, B, wm, k2, k4, **extra):
    return {"kind": "batch", "B": B, "H": H, "rule_key_warps": wm, "rule_splits": 2, "floor_us": B * 0.3,
            "dispatch_us": k2 if wm == 2 else k4, "k2_us": k2, "k4_us": k4, "triton_us": 2 * k2,
            "flashmla_us": 3 * k2, "dispatch_ok": True, "k2_ok": True, "k4_ok": True, "triton_ok": True, **extra}


def _write(tmp_path, rows):
    p = tmp_path / "fp8mma_batches.json"
    p.write_text(json.dumps({"meta": {"commit": "abc1234", "device": "NVIDIA H200"}, "rows": rows}))
    return p


def test_rule_verdict_names_the_faster_build_and_the_margin():
    right = batches.rule_verdict(_row(8, 64, 4, k2=50.0, k4=40.0))
    assert right == {"pick": "k4", "best": "k4", "pick_us": 40.0, "best_us": 40.0, "ok": True}
    wrong = batches.rule_verdict(_row(8, 192, 2, k2=50.0, k4=40.0))
    assert wrong["ok"] is False and wrong["best"] == "k4" and wrong["pick_us"] == 50.0
    close = batches.rule_verdict(_row(8, 192, 2, k2=41.0, k4=40.0))  # 2.5 % slower: within the margin
    assert close["ok"] is True and close["best"] == "k4"
    assert batches.rule_verdict(_row(8, 192, 2, k2=41.0, k4=40.0), margin=0.01)["ok"] is False
    missing = _row(16, 8, 2, k2=30.0, k4=31.0)
    del missing["k4_us"]
    assert batches.rule_verdict(missing)["ok"] is None
    # a build that failed its check is never the best; the rule's own build failing is a wrong pick
    assert batches.rule_verdict(_row(8, 192, 2, k2=50.0, k4=40.0, k4_ok=False))["ok"] is True
    assert batches.rule_verdict(_row(8, 64, 4, k2=50.0, k4=40.0, k4_ok=False))["ok"] is False
    # where the captured decode takes the Triton kernel the rule is not asked
    assert batches.rule_verdict(_row(8, 1, 4, k2=50.0, k4=40.0, graph_route="triton"))["ok"] is None


def test_rule_now_asks_todays_rule_of_a_rows_shape():
    """`rule_now`: the captured decode's key-warps rule of today for the row's heads and batch (132 SMs), which may
    differ from the rule the run recorded; `rule_verdict(pick=...)` judges that pick against the same times."""
    old = _row(8, 512, 2, k2=308.0, k4=283.0)  # a run whose rule took two key warps at B512
    assert batches.rule_verdict(old)["ok"] is False
    assert batches.rule_now(old) == "k4" and batches.rule_verdict(old, pick=batches.rule_now(old))["ok"] is True
    assert [batches.rule_now(_row(8, B, 2, 1.0, 1.0)) for B in (32, 136, 256, 320, 400)] == ["k4", "k2", "k4", "k2",
                                                                                           "k4"]
    assert [batches.rule_now(_row(16, B, 2, 1.0, 1.0)) for B in (32, 136)] == ["k2", "k4"]


def test_table_and_failed_checks(tmp_path):
    rows = [_row(8, 32, 4, k2=31.0, k4=30.0), _row(8, 192, 2, k2=50.0, k4=40.0, flashmla_ok=False),
            _row(16, 32, 2, k2=35.0, k4=37.0, triton_error="RuntimeError: boom"),
            {"kind": "batch", "B": 512, "H": 16, "error": "OutOfMemoryError: CUDA out of memory"}]
    run = batches.load_run(_write(tmp_path, rows))
    assert run["commit"] == "abc1234" and set(run["rows"]) == {(8, 32), (8, 192), (16, 32), (16, 512)}
    assert batches.failed_checks(run) == ["H8 B192 flashmla", "H16 B32 triton",
                                          "H16 B512 (the case: OutOfMemoryError: CUDA out of memory)"]
    text = batches.rule_table(run)
    # the run's rule and today's (`rule_now`: the same picks at these batches); no k4wg column in these rows
    assert "| 8 | 32 | 2 | k4 | 30.0 | 31.0 | 30.0 | - | 62.0 | 93.0 | 3.10x | yes | k4 | yes |" in text
    assert "| 8 | 192 | 2 | k2 | 50.0 | 50.0 | 40.0 | - | 100.0 | 150.0 | 3.00x | no (k4) | k2 | no (k4) |" in text
    assert "| 16 | 32 | 2 | k2 | 35.0 | 35.0 | 37.0 | - | 70.0 | 105.0 | 3.00x | yes | k2 | yes |" in text
    assert "| 16 | 512 | - | - | - | - | - | - | - | - | - | OutOfMemoryError: CUDA out of memory | - | - |" in text
    assert batches.plot(run, tmp_path / "b.png").is_file()  # a failed case is left out of the figure


def test_plot_writes_one_png(tmp_path):
    run = batches.load_run(_write(tmp_path, [_row(H, B, 4 if B <= 128 else 2, k2=B + 20.0, k4=B + 18.0)
                                             for H in (8, 16) for B in (1, 32, 128, 512)]))
    out = batches.plot(run, tmp_path / "fig" / "batches.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["batches.png"]


def test_a_run_without_batch_rows_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no batch rows"):
        batches.load_run(_write(tmp_path, [{"kind": "ablate-decode", "B": 32, "H": 8}]))


def test_cli_reads_a_run_back(tmp_path, capsys):
    """`glm5lib bench batches RUN.json`: the table with both rules' verdicts and the PNG; exit 1 where a launch failed
    its check; one-line errors (exit 2) for a missing file, a file that is not a run, an existing PNG."""
    from glm5lib.bench.cli import main

    good = _write(tmp_path, [_row(8, 512, 2, k2=308.0, k4=283.0), _row(16, 32, 2, k2=35.0, k4=37.0)])
    assert main(["bench", "batches", str(good)]) == 0
    out = capsys.readouterr().out
    assert "| 8 | 512 | 2 | k2 | 308.0 | 308.0 | 283.0 | - |" in out and "| no (k4) | k4 | yes |" in out
    assert "every launch matched fp32" in out and good.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert main(["bench", "batches", str(good)]) == 2  # the PNG exists: not replaced without --force
    assert "already exists" in capsys.readouterr().err
    assert main(["bench", "batches", str(good), "--force"]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad" / "run.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"meta": {}, "rows": [_row(8, 32, 4, k2=31.0, k4=30.0, k4_ok=False)]}))
    assert main(["bench", "batches", str(bad)]) == 1 and "failed checks: H8 B32 k4" in capsys.readouterr().out
    for text, msg in (("[1]", "must hold a JSON object"), ('{"rows": []}', "no batch rows"), ("{", "JSON")):
        bad.write_text(text)
        assert main(["bench", "batches", str(bad), "--force"]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    assert main(["bench", "batches", str(tmp_path / "none.json")]) == 2
    assert "no batch run at" in capsys.readouterr().err
