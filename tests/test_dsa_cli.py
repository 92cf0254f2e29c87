"""`glm5lib dsa ...` commands: output and user errors."""

import json

import pytest

from glm5lib.cli import main
from glm5lib.mapping.tiny import ensure_tiny


def test_cost_prints_glm5_numbers(capsys):
    assert main(["dsa", "cost", "--context", "2048,35000"]) == 0
    out = capsys.readouterr().out
    assert "34,546" in out and "285.2" in out


def test_analyze_tiny_gguf_shard(capsys):
    shard = ensure_tiny(progress=False).shards["Q8_0"][1]
    assert main(["dsa", "analyze", str(shard), "--layers", "0-2", "--tokens", "96", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["layer"] for r in res["layers"]] == [0, 1, 2] and res["tokens"] == 96


def test_rope_layout_prints_the_detectors_verdict(capsys):
    from glm5lib.dsa.analysis import detect_indexer_rope_layout
    from glm5lib.dsa.footprint import sample_ids
    from glm5lib.model.reference import ReferenceModel

    hf_dir = ensure_tiny(progress=False).hf_dir
    assert main(["dsa", "rope-layout", str(hf_dir), "--sequences", "1"]) == 0
    out = capsys.readouterr().out
    model = ReferenceModel.from_hf_dir(hf_dir)
    layout, recall = detect_indexer_rope_layout(model, [sample_ids(model, 2 * model.cfg.index_topk, seed=0)])
    assert f"indexer RoPE layout: {layout} (attention mass kept: " in out
    assert all(f"{k} {v:.3f}" in out for k, v in recall.items())


@pytest.mark.parametrize("argv, msg", [
    (["dsa", "analyze", "/nonexistent.gguf"], "no such file"),
    (["dsa", "analyze", "{gguf}", "--layers", "1-2"], "starting at 0"),
    (["dsa", "analyze", "{gguf}", "--layers", "0-9"], "within 0-2"),
], ids=["missing", "not-from-0", "out-of-range"])
def test_user_errors(capsys, argv, msg):
    gguf = str(ensure_tiny(progress=False).gguf["Q8_0"])
    assert main([a.replace("{gguf}", gguf) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err and "Traceback" not in err
