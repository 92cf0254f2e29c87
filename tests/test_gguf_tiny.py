"""The GGUF tools on the tiny GLM-5 model (glm5lib.mapping.tiny): real glm-dsa names, shapes and metadata,
including a tokenizer. Byte identity with llama-gguf-split in every mode when the binary is present."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gguf_fixtures import llama_gguf_split

from glm5lib.gguf import open_gguf, scan
from glm5lib.gguf.inspect import diff_tensors
from glm5lib.gguf.split import merge, split
from glm5lib.mapping import tiny as tiny_module
LLAMA = llama_gguf_split()

MODES = {  # name -> (llama-gguf-split flags, our keyword arguments)
    "tensors16": (["--split-max-tensors", "16"], {"max_tensors": 16}),
    "size3M": (["--split-max-size", "3M"], {"max_size": 3_000_000}),
    "tensors40-nofirst": (["--split-max-tensors", "40", "--no-tensor-first-split"],
                          {"max_tensors": 40, "no_tensor_first_split": True}),
}


@pytest.fixture(scope="module")
def tiny():
    return tiny_module.ensure_tiny(progress=False)


def test_tiny_shard_sets_validate_and_merge_losslessly(tiny, tmp_path):
    for file_type, shards in tiny.shards.items():
        if not shards:
            continue
        _, _, problems = scan(shards[-1])
        assert problems == [], (file_type, problems)
        merge(shards[0], tmp_path / f"{file_type}.gguf", progress=False)
        assert diff_tensors(open_gguf(tiny.gguf[file_type]), open_gguf(tmp_path / f"{file_type}.gguf"),
                            progress=False) == []


@pytest.mark.skipif(LLAMA is None, reason="llama-gguf-split not built (scripts/build_llama_gguf_split.sh)")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("file_type", ["F32", "Q8_0"])
def test_tiny_split_merge_identical_to_llama(tiny, tmp_path, mode, file_type):
    flags, kwargs = MODES[mode]
    src = tiny.gguf[file_type]
    ref, mine = tmp_path / "ref", tmp_path / "mine"
    ref.mkdir(), mine.mkdir()
    subprocess.run([str(LLAMA), *flags, str(src), str(ref / "t")], check=True, capture_output=True)
    split(src, mine / "t", progress=False, **kwargs)
    names = sorted(p.name for p in ref.iterdir())
    assert names == sorted(p.name for p in mine.iterdir()) and len(names) > 1
    for n in names:
        assert (ref / n).read_bytes() == (mine / n).read_bytes(), n
    subprocess.run([str(LLAMA), "--merge", str(ref / names[0]), str(tmp_path / "ref.gguf")], check=True,
                   capture_output=True)
    merge(mine / names[0], tmp_path / "mine.gguf", progress=False)
    assert Path(tmp_path / "ref.gguf").read_bytes() == Path(tmp_path / "mine.gguf").read_bytes()
