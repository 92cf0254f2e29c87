"""`glm5lib gguf split|merge` against llama.cpp's llama-gguf-split: same bytes, same names, same refusals.

Byte identity is proven twice: against committed sha256 digests of the real tool's outputs on a deterministic
fixture (tests/golden/gguf_split.txt, always run), and side by side with the binary when it is present
(scripts/build_llama_gguf_split.sh or $GLM5LIB_LLAMA_GGUF_SPLIT).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_fixtures import SPLIT_CASES, llama_gguf_split, make_fixture, read_golden, sha256

import glm5lib.gguf.split as split_mod
from glm5lib.cli import main
from glm5lib.errors import UserError
from glm5lib.gguf import open_gguf
from glm5lib.gguf.inspect import diff_tensors

LLAMA = llama_gguf_split()
needs_llama = pytest.mark.skipif(LLAMA is None, reason="llama-gguf-split not built (scripts/build_llama_gguf_split.sh)")


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.mktemp("fx") / "fixture.gguf")


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    return read_golden()


def ours(*argv: str) -> int:
    return main(["gguf", *argv, "-q"] if argv[0] in ("split", "merge") else ["gguf", *argv])


def llama(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LLAMA), *argv], capture_output=True, text=True)


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_fixture_is_the_one_the_goldens_were_made_from(fixture, golden):
    assert sha256(fixture) == golden["fixture"], (
        "the fixture's bytes changed (tests/gguf_fixtures.py or gguf-py): regenerate the goldens with "
        "`python tests/gguf_fixtures.py --golden` after building llama-gguf-split"
    )


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_and_merge_match_golden_digests(case, fixture, golden, tmp_path):
    assert ours("split", *SPLIT_CASES[case], str(fixture), str(tmp_path / "m")) == 0
    want = {k.split("/", 1)[1]: v for k, v in golden.items() if k.startswith(f"{case}/") and k != f"{case}/merged"}
    assert listing(tmp_path) == sorted(want), "shard file names differ from llama-gguf-split's"
    for name, digest in want.items():
        assert sha256(tmp_path / name) == digest, f"{case}/{name} differs from llama-gguf-split's bytes"
    first = sorted(tmp_path.glob("m-00001-of-*.gguf"))[0]
    assert ours("merge", str(first), str(tmp_path / "merged.gguf")) == 0
    assert sha256(tmp_path / "merged.gguf") == golden[f"{case}/merged"]


def test_every_mode_merges_to_the_same_file(golden):
    # An independent property of the reference outputs: the merge does not depend on how the file was split.
    assert len({v for k, v in golden.items() if k.endswith("/merged")}) == 1


def test_resplitting_a_merged_file_reproduces_the_shards(fixture, tmp_path):
    # merge moves split.count to the end and split re-appends split.no, split.tensors.count, split.count:
    # so splitting the merged file the same way gives the original shards, byte for byte.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert ours("split", "--split-max-tensors", "20", str(fixture), str(a / "m")) == 0
    assert ours("merge", str(a / "m-00001-of-00004.gguf"), str(tmp_path / "merged.gguf")) == 0
    assert ours("split", "--split-max-tensors", "20", str(tmp_path / "merged.gguf"), str(b / "m")) == 0
    assert listing(a) == listing(b)
    for name in listing(a):
        assert sha256(a / name) == sha256(b / name)


def test_split_merge_is_lossless(fixture, tmp_path):
    ours("split", "--split-max-size", "1M", str(fixture), str(tmp_path / "m"))
    ours("merge", str(tmp_path / "m-00001-of-00004.gguf"), str(tmp_path / "merged.gguf"))
    original, shards, merged = (open_gguf(fixture), open_gguf(tmp_path / "m-00003-of-00004.gguf"),
                                open_gguf(tmp_path / "merged.gguf"))
    assert diff_tensors(original, shards, progress=False) == []
    assert diff_tensors(original, merged, progress=False) == []
    for key, value in original.kv.items():
        assert merged.kv[key] == value
    assert (merged.kv["split.count"], merged.kv["split.no"], merged.kv["split.tensors.count"]) == (0, 0, 67)


# ---- side by side with the real binary ------------------------------------------------------------------


@needs_llama
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_and_merge_byte_identical_to_llama(case, fixture, tmp_path):
    ref, mine = tmp_path / "ref", tmp_path / "mine"
    ref.mkdir(), mine.mkdir()
    assert llama(*SPLIT_CASES[case], str(fixture), str(ref / "m")).returncode == 0
    assert ours("split", *SPLIT_CASES[case], str(fixture), str(mine / "m")) == 0
    assert listing(ref) == listing(mine)
    for name in listing(ref):
        assert (ref / name).read_bytes() == (mine / name).read_bytes(), name
    first = listing(ref)[0]
    # merge each other's shards too: the two tools are interchangeable
    assert llama("--merge", str(ref / first), str(tmp_path / "ref.gguf")).returncode == 0
    assert ours("merge", str(ref / first), str(tmp_path / "mine.gguf")) == 0
    assert ours("merge", str(mine / first), str(tmp_path / "mine2.gguf")) == 0
    assert (tmp_path / "ref.gguf").read_bytes() == (tmp_path / "mine.gguf").read_bytes()
    assert (tmp_path / "ref.gguf").read_bytes() == (tmp_path / "mine2.gguf").read_bytes()


@needs_llama
def test_resplit_of_merged_file_identical_to_llama(fixture, tmp_path):
    llama("--split-max-tensors", "7", str(fixture), str(tmp_path / "a"))
    llama("--merge", str(tmp_path / "a-00001-of-00010.gguf"), str(tmp_path / "merged.gguf"))
    (tmp_path / "ref").mkdir(), (tmp_path / "mine").mkdir()
    assert llama("--split-max-size", "2M", str(tmp_path / "merged.gguf"), str(tmp_path / "ref" / "b")).returncode == 0
    assert ours("split", "--split-max-size", "2M", str(tmp_path / "merged.gguf"), str(tmp_path / "mine" / "b")) == 0
    assert listing(tmp_path / "ref") == listing(tmp_path / "mine")
    for name in listing(tmp_path / "ref"):
        assert (tmp_path / "ref" / name).read_bytes() == (tmp_path / "mine" / name).read_bytes()


# ---- refusals: same cases as llama-gguf-split, exit 1, nothing written -------------------------------------


def _set(fixture: Path, d: Path) -> Path:
    d.mkdir()
    assert ours("split", "--split-max-tensors", "20", str(fixture), str(d / "m")) == 0
    return d / "m-00001-of-00004.gguf"


def _refusal_merge_non_first(fixture, tmp):
    first = _set(fixture, tmp / "s")
    return ["merge", str(first.with_name("m-00002-of-00004.gguf")), str(tmp / "out.gguf")]


def _refusal_merge_without_split_count(fixture, tmp):
    return ["merge", str(fixture), str(tmp / "out.gguf")]


def _refusal_merge_merged_file(fixture, tmp):
    first = _set(fixture, tmp / "s")
    assert ours("merge", str(first), str(tmp / "s" / "merged-00001-of-00004.gguf")) == 0  # split.count 0 now
    return ["merge", str(tmp / "s" / "merged-00001-of-00004.gguf"), str(tmp / "out.gguf")]


def _refusal_merge_existing_output(fixture, tmp):
    first = _set(fixture, tmp / "s")
    (tmp / "out.gguf").write_bytes(b"keep me")
    return ["merge", str(first), str(tmp / "out.gguf")]


def _refusal_merge_missing_shard(fixture, tmp):
    first = _set(fixture, tmp / "s")
    first.with_name("m-00003-of-00004.gguf").unlink()
    return ["merge", str(first), str(tmp / "out.gguf")]


def _refusal_split_empty_shard(fixture, tmp):
    big = make_fixture(tmp / "big.gguf", vocab=10007)  # token_embd alone is over 1M
    return ["split", "--split-max-size", "1M", str(big), str(tmp / "out")]


def _refusal_split_bad_magic(fixture, tmp):
    bad = tmp / "bad.gguf"
    bad.write_bytes(b"GGML" + fixture.read_bytes()[4:])
    return ["split", str(bad), str(tmp / "out")]


def _refusal_merge_bad_magic(fixture, tmp):
    first = _set(fixture, tmp / "s")
    first.write_bytes(b"XXXX" + first.read_bytes()[4:])
    return ["merge", str(first), str(tmp / "out.gguf")]


REFUSALS = {
    "merge-non-first-shard": _refusal_merge_non_first,
    "merge-no-split-count": _refusal_merge_without_split_count,
    "merge-merged-file": _refusal_merge_merged_file,
    "merge-existing-output": _refusal_merge_existing_output,
    "merge-missing-shard": _refusal_merge_missing_shard,
    "split-empty-shard": _refusal_split_empty_shard,
    "split-bad-magic": _refusal_split_bad_magic,
    "merge-bad-magic": _refusal_merge_bad_magic,
}


def _outputs(tmp: Path) -> set[Path]:
    return {p for p in tmp.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_exit_1_and_write_nothing(case, fixture, tmp_path, capsys):
    argv = REFUSALS[case](fixture, tmp_path)
    before = {p: p.read_bytes() for p in _outputs(tmp_path)}
    assert ours(*argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert {p: p.read_bytes() for p in _outputs(tmp_path)} == before, "a refusal must not write or change files"


@needs_llama
@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_match_llama(case, fixture, tmp_path):
    argv = REFUSALS[case](fixture, tmp_path)
    op, args = argv[0], argv[1:]
    flags = ["--merge"] if op == "merge" else []
    ref = llama(*flags, *args)
    assert ref.returncode == 1, (ref.returncode, ref.stderr)
    assert ours(*argv) == ref.returncode


# ---- our additions: no overwrite without --force, all-or-nothing, bounded chunks ---------------------------


def test_split_refuses_existing_outputs_unless_forced(fixture, tmp_path, capsys):
    assert ours("split", "--split-max-tensors", "20", str(fixture), str(tmp_path / "m")) == 0
    victim = tmp_path / "m-00002-of-00004.gguf"
    want = victim.read_bytes()
    victim.write_bytes(b"user data")
    assert ours("split", "--split-max-tensors", "20", str(fixture), str(tmp_path / "m")) == 1
    assert "already exists" in capsys.readouterr().err
    assert victim.read_bytes() == b"user data"
    assert ours("split", "--split-max-tensors", "20", "--force", str(fixture), str(tmp_path / "m")) == 0
    assert victim.read_bytes() == want


def test_merge_force_overwrites(fixture, tmp_path):
    first = _set(fixture, tmp_path / "s")
    (tmp_path / "out.gguf").write_bytes(b"old")
    assert ours("merge", "--force", str(first), str(tmp_path / "out.gguf")) == 0
    assert open_gguf(tmp_path / "out.gguf").kv["split.count"] == 0


def test_failure_mid_write_leaves_nothing(fixture, tmp_path, monkeypatch):
    first = _set(fixture, tmp_path / "s")
    real_copy, calls = split_mod.copy_range, []

    def failing_copy(*args, **kwargs):  # the disk fills up in the middle of the second file
        calls.append(1)
        if len(calls) == 30:
            raise OSError(28, "No space left on device")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(split_mod, "copy_range", failing_copy)
    with pytest.raises(UserError, match="No space left"):
        split_mod.split(fixture, tmp_path / "m", max_tensors=20, progress=False)
    assert listing(tmp_path) == ["s"], "no shard and no temporary file may remain"
    calls.clear()
    with pytest.raises(UserError, match="No space left"):
        split_mod.merge(first, tmp_path / "out.gguf", progress=False)
    assert listing(tmp_path) == ["s"]
    assert len(listing(tmp_path / "s")) == 4


@pytest.mark.parametrize("use_copy_file_range", [True, False], ids=["copy_file_range", "pread-write"])
def test_small_chunks_give_the_same_bytes(fixture, tmp_path, monkeypatch, golden, use_copy_file_range):
    monkeypatch.setattr(split_mod, "CHUNK", 4096)
    monkeypatch.setattr(split_mod.copy_range, "__defaults__", (4096, None))  # chunk, bar
    if not use_copy_file_range:
        monkeypatch.delattr(os, "copy_file_range")
    split_mod.split(fixture, tmp_path / "m", max_size=1_000_000, progress=False)
    for name in listing(tmp_path):
        assert sha256(tmp_path / name) == golden[f"size1M/{name}"]


def test_merge_peak_memory_does_not_grow_with_tensor_size(tmp_path):
    """Merging a 512 MiB tensor in a child process: peak RSS stays far below the tensor size."""
    script = f"""
import resource, sys, numpy as np
from gguf import GGUFWriter
from glm5lib.gguf.split import split, merge
w = GGUFWriter({str(tmp_path / 'big.gguf')!r}, arch="glm-dsa")
w.add_tensor_info("blk.0.ffn_up_exps.weight", (64, 1024, 2048), np.dtype(np.float32), 512 << 20)
w.add_tensor_info("output_norm.weight", (70,), np.dtype(np.float32), 280)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_ti_data_to_file(); w.close()
with open({str(tmp_path / 'big.gguf')!r}, "r+b") as f:  # data: a byte pattern every 1 MiB, holes between
    start = (f.seek(0, 2) + 31) // 32 * 32; f.truncate(start + (512 << 20) + 288)
    for i in range(0, 512 << 20, 1 << 20):
        f.seek(start + i); f.write(i.to_bytes(8, "little"))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
split({str(tmp_path / 'big.gguf')!r}, {str(tmp_path / 'm')!r}, max_tensors=1, progress=False)
merge({str(tmp_path / 'm-00001-of-00002.gguf')!r}, {str(tmp_path / 'merged.gguf')!r}, progress=False)
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    assert out.returncode == 0, out.stderr
    base_kb, peak_kb = map(int, out.stdout.split())
    assert peak_kb - base_kb < 64 * 1024, f"peak RSS grew by {(peak_kb - base_kb) // 1024} MiB for a 512 MiB tensor"
    merged = open_gguf(tmp_path / "merged.gguf")
    t = merged.tensor("blk.0.ffn_up_exps.weight")
    assert t.nbytes == 512 << 20
    raw = merged.raw(t.name).reshape(-1).view("uint8")
    assert int.from_bytes(raw[(300 << 20):(300 << 20) + 8].tobytes(), "little") == 300 << 20


def test_outputs_get_normal_permissions(fixture, tmp_path):
    mask = os.umask(0o022)
    try:
        split_mod.split(fixture, tmp_path / "m", max_tensors=40, progress=False)
        split_mod.merge(tmp_path / "m-00001-of-00002.gguf", tmp_path / "merged.gguf", progress=False)
    finally:
        os.umask(mask)
    for p in tmp_path.iterdir():
        assert p.stat().st_mode & 0o777 == 0o644, p.name
