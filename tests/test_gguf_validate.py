"""Bad input, one case each: `validate` lists it (exit 1) or calls the file unreadable (exit 2); split, merge and
inspect refuse with one `error:` line, no traceback, and no output."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf_fixtures import make_fixture

from glm5lib.cli import main
from glm5lib.errors import GGUFFormatError
from glm5lib.gguf import open_gguf, read_header
from glm5lib.gguf.split import merge, split


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.mktemp("fx") / "fixture.gguf")


@pytest.fixture()
def shard_set(fixture, tmp_path) -> Path:
    """A 4-shard set in tmp_path/set; returns the first shard."""
    (tmp_path / "set").mkdir()
    split(fixture, tmp_path / "set" / "m", max_tensors=20, progress=False)
    return tmp_path / "set" / "m-00001-of-00004.gguf"


def patch_tensor(path: Path, name: str, *, ggml_type: int | None = None, offset: int | None = None,
                 new_name: str | None = None) -> None:
    """Rewrite one field of a tensor info in place (found by its length-prefixed name in the header)."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.find(key)
    assert at > 0 and data.find(key, at + 1) == -1
    if new_name is not None:
        assert len(new_name) == len(name)
        data[at + 8 : at + 8 + len(name)] = new_name.encode()
    p = at + len(key)
    n_dims = struct.unpack_from("<I", data, p)[0]
    p += 4 + 8 * n_dims
    if ggml_type is not None:
        struct.pack_into("<i", data, p, ggml_type)
    if offset is not None:
        struct.pack_into("<Q", data, p + 4, offset)
    path.write_bytes(bytes(data))


def validate(path: Path, capsys) -> tuple[int, list[str], str]:
    rc = main(["gguf", "validate", str(path)])
    out = capsys.readouterr()
    return rc, out.out.strip().splitlines(), out.err


# ---- clean inputs ------------------------------------------------------------------------------------------


def test_clean_file_and_every_shard_of_a_set_validate(fixture, shard_set, capsys):
    assert validate(fixture, capsys)[0] == 0
    for shard in sorted(shard_set.parent.iterdir()):
        rc, lines, _ = validate(shard, capsys)
        assert rc == 0 and lines == ["ok: 4 file(s), 67 tensors"]


def test_validate_json(shard_set, capsys):
    assert main(["gguf", "validate", "--json", str(shard_set.with_name("m-00004-of-00004.gguf"))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "ok" and report["tensors"] == 67 and len(report["shards"]) == 4


# ---- unreadable: exit 2 from validate and inspect, exit 1 (llama-gguf-split's) from split and merge ---------


def _wrong_magic(fixture, tmp):
    p = tmp / "bad.gguf"
    p.write_bytes(b"GGJT" + fixture.read_bytes()[4:])
    return p, "not a GGUF file"


def _truncated_header(fixture, tmp):
    p = tmp / "bad.gguf"
    p.write_bytes(fixture.read_bytes()[:500])
    return p, "truncated header"


def _empty(fixture, tmp):
    p = tmp / "bad.gguf"
    p.write_bytes(b"")
    return p, "too small"


def _missing(fixture, tmp):
    return tmp / "nope.gguf", "no such file"


def _bad_version(fixture, tmp):
    p = tmp / "bad.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<I", 1) + fixture.read_bytes()[8:])
    return p, "version 1"


UNREADABLE = {"wrong-magic": _wrong_magic, "truncated-header": _truncated_header, "empty": _empty,
              "missing": _missing, "gguf-v1": _bad_version}


@pytest.mark.parametrize("case", UNREADABLE)
def test_unreadable_input(case, fixture, tmp_path, capsys):
    path, words = UNREADABLE[case](fixture, tmp_path)
    for argv, rc in ((["validate"], 2), (["inspect"], 2), (["split", "-q"], 1)):
        assert main(["gguf", *argv, str(path), *([str(tmp_path / "out")] if argv[0] == "split" else [])]) == rc
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], (argv, err)
    assert not list(tmp_path.glob("out*"))
    with pytest.raises(GGUFFormatError):
        open_gguf(path)


# ---- problems inside a readable file: validate exit 1 (each listed), split refuses, nothing written --------


def _truncated_data(fixture, tmp):
    p = tmp / "bad.gguf"
    p.write_bytes(fixture.read_bytes()[:-5000])
    return p, ["'output.weight' data", "runs past the end of the file"], True


def _unknown_type(fixture, tmp):
    p = shutil.copy(fixture, tmp / "bad.gguf")
    patch_tensor(Path(p), "blk.1.ffn_norm.weight", ggml_type=99)
    return Path(p), ["unknown tensor type 99"], True


def _offset_past_eof(fixture, tmp):
    p = Path(shutil.copy(fixture, tmp / "bad.gguf"))
    patch_tensor(p, "blk.0.attn_norm.weight", offset=1 << 40)
    return p, ["'blk.0.attn_norm.weight' data", "runs past the end", "offset 1,099,511,627,776 is not 700,448 (and 1 more): llama.cpp needs tensors packed"], True


def _misaligned_offset(fixture, tmp):
    p = Path(shutil.copy(fixture, tmp / "bad.gguf"))
    h = read_header(p)
    t = next(t for t in h.tensors if t.name == "blk.2.attn_norm.weight")
    patch_tensor(p, t.name, offset=t.offset + 4)
    return p, ["offset", "is not aligned to 32"], False


def _duplicate_name(fixture, tmp):
    p = Path(shutil.copy(fixture, tmp / "bad.gguf"))
    patch_tensor(p, "blk.2.attn_norm.weight", new_name="blk.1.attn_norm.weight")
    return p, ["duplicate tensor name 'blk.1.attn_norm.weight'"], True


def _alignment_64(fixture, tmp):
    p = tmp / "bad.gguf"
    w = GGUFWriter(p, arch="glm-dsa")
    w.add_custom_alignment(64)
    w.add_tensor("token_embd.weight", np.arange(70 * 3, dtype=np.float32).reshape(3, 70))
    w.add_tensor("output_norm.weight", np.ones(70, np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return p, ["alignment 64 is not 32"], False


def _bad_block_multiple(fixture, tmp):
    p = Path(shutil.copy(fixture, tmp / "bad.gguf"))
    patch_tensor(p, "blk.0.attn_norm.weight", ggml_type=8)  # Q8_0: 70 is not a multiple of 32
    return p, ["row of 70 is not a multiple of the Q8_0 block (32)"], True


def _duplicate_key(fixture, tmp):
    p = Path(shutil.copy(fixture, tmp / "bad.gguf"))
    data = p.read_bytes()
    key = struct.pack("<Q", 15) + b"glm5lib.test.u8"
    p.write_bytes(data.replace(key, struct.pack("<Q", 15) + b"glm5lib.test.i8", 1))
    return p, ["duplicate metadata key 'glm5lib.test.i8'"], True


PROBLEMS = {"duplicate-key": _duplicate_key, "truncated-data": _truncated_data, "unknown-type": _unknown_type, "offset-past-eof": _offset_past_eof,
            "misaligned-offset": _misaligned_offset, "duplicate-name": _duplicate_name,
            "alignment-64": _alignment_64, "block-multiple": _bad_block_multiple}


@pytest.mark.parametrize("case", PROBLEMS)
def test_problem_in_one_file(case, fixture, tmp_path, capsys):
    path, words, fatal = PROBLEMS[case](fixture, tmp_path)
    rc, lines, err = validate(path, capsys)
    assert rc == 1
    text = "\n".join(lines)
    for w in words:
        assert w in text, (w, lines)
    assert all(line.startswith("bad.gguf: ") for line in lines), "one problem per line, naming the file"
    assert main(["gguf", "split", "-q", str(path), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bad.gguf: ")
    assert not list(tmp_path.glob("out*")) and not list(tmp_path.glob(".out*"))
    if fatal:
        with pytest.raises(GGUFFormatError):
            open_gguf(path)
        assert main(["gguf", "inspect", str(path)]) == 2
    elif any(p.layout for p in open_gguf(path).problems):  # inspect shows it; every data read refuses it
        g = open_gguf(path)
        assert main(["gguf", "inspect", str(path)]) == 0
        with pytest.raises(GGUFFormatError, match="cannot be read"):
            g.raw(g.tensors[0].name)
    else:  # readable, only not llama.cpp-compatible: open_gguf reads it and gguf-py agrees on the data
        g = open_gguf(path)
        assert g.problems
        reader = GGUFReader(path)
        for rt in reader.tensors:
            assert g.raw(rt.name).tobytes() == rt.data.tobytes()


def test_problems_are_all_listed(fixture, tmp_path, capsys):
    p = Path(shutil.copy(fixture, tmp_path / "bad.gguf"))
    patch_tensor(p, "blk.1.ffn_norm.weight", ggml_type=99)
    patch_tensor(p, "blk.2.attn_norm.weight", new_name="blk.1.attn_norm.weight")
    rc, lines, err = validate(p, capsys)
    assert rc == 1 and len(lines) == 2 and "2 problem(s)" in err


# ---- shard sets --------------------------------------------------------------------------------------------


def _other_set(fixture: Path, tmp: Path, **kw) -> Path:
    d = tmp / "other"
    d.mkdir(exist_ok=True)
    split(fixture, d / "m", progress=False, **kw)
    return d


def test_missing_shard(shard_set, tmp_path, capsys):
    shard_set.with_name("m-00003-of-00004.gguf").unlink()
    for given in ("m-00001-of-00004.gguf", "m-00004-of-00004.gguf"):
        rc, lines, _ = validate(shard_set.with_name(given), capsys)
        assert rc == 1 and "missing shard m-00003-of-00004.gguf (3 of 4)" in lines
        assert len(lines) == 1
    assert main(["gguf", "merge", "-q", str(shard_set), str(tmp_path / "out.gguf")]) == 1
    assert not (tmp_path / "out.gguf").exists()
    with pytest.raises(GGUFFormatError, match="missing shard"):
        open_gguf(shard_set)


def test_extra_shard(shard_set, fixture, tmp_path, capsys):
    shutil.copy(shard_set.with_name("m-00004-of-00004.gguf"), shard_set.with_name("m-00005-of-00004.gguf"))
    rc, lines, _ = validate(shard_set, capsys)
    assert rc == 1 and lines == ["extra shard m-00005-of-00004.gguf next to the 4-shard set"]
    assert main(["gguf", "merge", "-q", str(shard_set), str(tmp_path / "out.gguf")]) == 1
    assert not (tmp_path / "out.gguf").exists()
    assert len(open_gguf(shard_set).tensors) == 67  # readable: the set itself is whole


def test_shard_from_another_set(shard_set, fixture, tmp_path, capsys):
    other = _other_set(fixture, tmp_path, max_tensors=20, no_tensor_first_split=True)  # 5 shards
    shutil.copy(other / "m-00003-of-00005.gguf", shard_set.with_name("m-00003-of-00004.gguf"))
    rc, lines, _ = validate(shard_set, capsys)
    assert rc == 1
    assert "m-00003-of-00004.gguf: split.no is 2, expected 2 (order)" not in lines
    assert "m-00003-of-00004.gguf: split.count is 5, expected 4 (shard from another set?)" in lines
    assert main(["gguf", "merge", "-q", str(shard_set), str(tmp_path / "out.gguf")]) == 1
    assert not (tmp_path / "out.gguf").exists()


def test_shard_with_another_tensor_total(shard_set, tmp_path, capsys):
    p = shard_set.with_name("m-00002-of-00004.gguf")
    key = struct.pack("<Q", 19) + b"split.tensors.count" + struct.pack("<ii", 5, 67)  # INT32 67
    data = p.read_bytes()
    assert data.count(key) == 1
    p.write_bytes(data.replace(key, key[:-4] + struct.pack("<i", 66)))
    rc, lines, _ = validate(shard_set, capsys)
    assert rc == 1 and lines == ["m-00002-of-00004.gguf: split.tensors.count is 66, expected 67 (shard from another set?)"]
    assert main(["gguf", "merge", "-q", str(shard_set), str(tmp_path / "out.gguf")]) == 1
    assert not (tmp_path / "out.gguf").exists()


def test_shards_out_of_order(shard_set, capsys):
    a, b = shard_set.with_name("m-00002-of-00004.gguf"), shard_set.with_name("m-00003-of-00004.gguf")
    tmp = a.with_name("swap")
    a.rename(tmp), b.rename(a), tmp.rename(b)
    rc, lines, _ = validate(shard_set, capsys)
    assert rc == 1
    assert "m-00002-of-00004.gguf: split.no is 2, expected 1 (order)" in lines
    assert "m-00003-of-00004.gguf: split.no is 1, expected 2 (order)" in lines


def test_renamed_shard_count_mismatch(shard_set, tmp_path, capsys):
    renamed = shard_set.with_name("m-00001-of-00003.gguf")
    shutil.copy(shard_set, renamed)
    rc, lines, _ = validate(renamed, capsys)
    assert rc == 1 and any("name says 3 shards but split.count is 4" in line for line in lines)


def test_split_count_without_shard_name(shard_set, tmp_path, capsys):
    lone = tmp_path / "renamed.gguf"
    shutil.copy(shard_set, lone)
    rc, lines, _ = validate(lone, capsys)
    assert rc == 1 and "split.count is 4 but the name is not PREFIX-NNNNN-of-00004.gguf" in lines[0]


def test_truncated_shard(shard_set, tmp_path, capsys):
    p = shard_set.with_name("m-00002-of-00004.gguf")
    p.write_bytes(p.read_bytes()[:-100])
    rc, lines, _ = validate(shard_set, capsys)
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("m-00002-of-00004.gguf: tensor ")
    assert "runs past the end of the file" in lines[0]
    assert main(["gguf", "merge", "-q", str(shard_set), str(tmp_path / "out.gguf")]) == 1
    assert not (tmp_path / "out.gguf").exists()


def test_unreadable_sibling_shard_is_a_problem_not_a_crash(shard_set, capsys):
    shard_set.with_name("m-00004-of-00004.gguf").write_bytes(b"junk")
    rc, lines, _ = validate(shard_set, capsys)
    assert rc == 1 and lines[0].startswith("shard m-00004-of-00004.gguf is unreadable: ")


def test_shard_with_zero_tensors(fixture, tmp_path, capsys):
    # A hand-made 3-shard set whose middle shard is empty (llama-gguf-split refuses to write one).
    from gguf import GGUFValueType

    from glm5lib.gguf.format import KV, set_kv
    from glm5lib.gguf.split import ShardPlan, plan_split, write_plans

    h = read_header(fixture)
    first, second = plan_split(h, tmp_path / "m", max_tensors=40)  # 40 + 27 tensors

    def shard(i, kvs, tensors):
        kvs = set_kv(kvs, KV("split.no", GGUFValueType.UINT16, i))
        kvs = set_kv(kvs, KV("split.tensors.count", GGUFValueType.INT32, 67))
        kvs = set_kv(kvs, KV("split.count", GGUFValueType.UINT16, 3))
        return ShardPlan(tmp_path / f"m-{i + 1:05d}-of-00003.gguf", kvs, tensors)

    write_plans([shard(0, h.kvs, first.tensors), shard(1, [], []), shard(2, [], second.tensors)], progress=False)
    rc, lines, _ = validate(tmp_path / "m-00001-of-00003.gguf", capsys)
    assert rc == 1 and lines == ["m-00002-of-00003.gguf: shard has 0 tensors"]
    assert main(["gguf", "merge", "-q", str(tmp_path / "m-00001-of-00003.gguf"), str(tmp_path / "o.gguf")]) == 1
    assert not (tmp_path / "o.gguf").exists()


def test_no_traceback_from_the_command_line(fixture, tmp_path):
    """The installed entry point, as a user runs it: one `error:` line, exit code, nothing else on stderr."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(fixture.read_bytes()[:-5000])
    cmds = {
        ("inspect", str(bad)): 2,
        ("split", str(bad), str(tmp_path / "out")): 1,
        ("merge", str(fixture), str(tmp_path / "out.gguf")): 1,
    }  # (in-process tests cover the rest; each start of the CLI costs seconds of imports)
    for argv, want in cmds.items():
        r = subprocess.run([sys.executable, "-m", "glm5lib.cli", "gguf", *argv], capture_output=True, text=True)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == want, (argv, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, (argv, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_merge_into_its_own_input_is_refused(shard_set):
    with pytest.raises(Exception, match="already exists"):
        merge(shard_set, shard_set.with_name("m-00002-of-00004.gguf"), progress=False)
