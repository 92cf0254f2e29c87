"""Checks on what notebook 01 (GGUF shard sets: validate, merge, inspect) records."""

from pathlib import Path


def check(report: dict) -> None:
    assert report["arch"] == "glm-dsa"
    assert report["shard_count"] >= 2, "the CI run must exercise a real multi-shard set"
    assert report["validate_status"] == "ok" and report["validate_problems"] == []
    assert report["lossless"] is True
    assert report["merged_split_count"] == 0  # llama.cpp's marker: a merged file is not merged again
    assert report["tensor_count"] > 0 and report["tensor_bytes"] > 0
    # totals agree however they are cut
    assert sum(report["block_bytes"].values()) == report["tensor_bytes"]
    assert sum(report["type_bytes"].values()) == report["tensor_bytes"]
    assert report["merged_bytes"] > report["tensor_bytes"]  # + header and padding
    assert Path(report["figure"]).is_file()
    if report["split_mode"] != "given":
        assert report["compared_with_original"] is True
