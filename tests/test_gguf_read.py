"""`open_gguf` and `inspect` against gguf-py's own reader: same metadata, tensor infos, bytes and values."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from gguf_fixtures import make_fixture

from glm5lib.cli import main
from glm5lib.gguf import open_gguf, read_header
from glm5lib.gguf.format import KEY_SPLIT_COUNT, encode_kv
from glm5lib.gguf.inspect import block_of, diff_tensors, summarize, tensor_digests
from glm5lib.gguf.split import split


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.mktemp("fx") / "fixture.gguf")


@pytest.fixture(scope="module")
def shards(fixture, tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("set")
    return [p.path for p in split(fixture, d / "m", max_size=1_000_000, progress=False)]


def test_metadata_and_tensor_infos_match_gguf_reader(fixture):
    g, reader = open_gguf(fixture), GGUFReader(fixture)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(g.kv) == list(fields)
    for k, v in fields.items():
        assert g.kv[k] == pytest.approx(v) if isinstance(v, float) else g.kv[k] == v, k
    assert g.arch == "glm-dsa" and g.shards == [fixture] and not g.problems
    assert [t.name for t in g.tensors] == [t.name for t in reader.tensors]
    for t, rt in zip(g.tensors, reader.tensors):
        assert t.ggml_type == rt.tensor_type
        assert t.ne == tuple(rt.shape.tolist())
        assert (t.offset, t.nbytes, t.n_elements) == (rt.data_offset, rt.n_bytes, rt.n_elements)


def test_header_kv_bytes_round_trip(fixture):
    # Our KV encoder writes back exactly the bytes gguf-py wrote (scalars, strings, arrays of each type).
    h = read_header(fixture)
    blob = fixture.read_bytes()[: h.header_end]
    encoded = b"".join(encode_kv(kv) for kv in h.kvs)
    assert blob[24 : 24 + len(encoded)] == encoded


def test_raw_views_and_dequantize_match_gguf_reader(fixture):
    g, reader = open_gguf(fixture), GGUFReader(fixture)
    seen = set()
    for rt in reader.tensors:
        t, raw = g.tensor(rt.name), g.raw(rt.name)
        assert raw.tobytes() == rt.data.tobytes()
        assert not raw.flags.writeable
        values = g.dequantize(rt.name)
        assert values.dtype == np.float32 and values.shape == t.shape
        want = dequantize(np.asarray(rt.data).view(np.uint8).reshape(-1), rt.tensor_type).reshape(t.shape)
        np.testing.assert_array_equal(values, want.astype(np.float32))
        seen.add(t.type_name)
    assert seen == {"F32", "BF16", "Q8_0"}


def test_dequantize_index_reads_a_slice_equal_to_the_whole_tensors(fixture):
    """`dequantize(name, index=)` (one expert, some rows) equals the same selection of the whole dequantized tensor."""
    g = open_gguf(fixture)
    rows = np.array([4, 0, 5002])
    for t in g.tensors:
        whole = g.dequantize(t.name)
        for index in (0, len(whole) - 1, rows[rows < len(whole)]):
            part = g.dequantize(t.name, index=index)
            assert part.dtype == np.float32
            np.testing.assert_array_equal(part, whole[index], err_msg=f"{t.name}[{index}]")


def test_typed_views(fixture):
    g = open_gguf(fixture)
    f32, bf16, q8 = g.raw("blk.0.attn_norm.weight"), g.raw("token_embd.weight"), g.raw("blk.0.ffn_down.weight")
    assert f32.dtype == np.float32 and f32.shape == (70,)
    assert bf16.dtype == np.uint16 and bf16.shape == (5003, 70)
    assert q8.dtype == np.uint8 and q8.shape == (70, 2 * 34)  # 64 values per row = 2 blocks of 34 bytes
    # BF16 is the top half of an f32: widening the raw bits gives the dequantized values exactly
    np.testing.assert_array_equal((bf16.astype(np.uint32) << 16).view(np.float32), g.dequantize("token_embd.weight"))
    assert g.tensor("blk.1.exp_probs_b.bias").shape == (1, 8)


def test_any_shard_opens_the_whole_set(fixture, shards):
    whole = open_gguf(fixture)
    for p in shards:
        g = open_gguf(p)
        assert g.shards == shards
        assert [t.name for t in g.tensors] == [t.name for t in whole.tensors]
        assert g.kv[KEY_SPLIT_COUNT] == len(shards)
    g = open_gguf(shards[-1])
    for t in whole.tensors:
        assert g.raw(t.name).tobytes() == whole.raw(t.name).tobytes()
        assert g.hash_tensor(t.name) == hashlib.sha256(whole.raw(t.name).tobytes()).hexdigest()
    assert {t.shard for t in g.tensors} == set(range(len(shards)))
    assert diff_tensors(whole, g, progress=False) == []


def test_diff_tensors_finds_a_changed_byte(fixture, tmp_path):
    copy = tmp_path / "copy.gguf"
    data = bytearray(fixture.read_bytes())
    t = open_gguf(fixture).tensor("blk.2.ffn_down_exps.weight")
    data[t.offset + 100] ^= 1
    copy.write_bytes(bytes(data))
    assert diff_tensors(open_gguf(fixture), open_gguf(copy), progress=False) == ["blk.2.ffn_down_exps.weight: bytes differ"]
    # digests of `b` computed once and passed in (notebook 01 compares two files with one merged file)
    digests = tensor_digests(open_gguf(copy), progress=False)
    assert digests["blk.2.ffn_down_exps.weight"] == hashlib.sha256(open_gguf(copy).raw(t.name).tobytes()).hexdigest()
    assert diff_tensors(open_gguf(fixture), open_gguf(copy), progress=False, digests_b=digests) == [
        "blk.2.ffn_down_exps.weight: bytes differ"]


def test_summary_totals_add_up(fixture, shards):
    s = summarize(open_gguf(shards[1]))
    assert s["tensor_count"] == 67 and len(s["shards"]) == len(shards)
    assert sum(b["count"] for b in s["blocks"].values()) == 67
    assert sum(b["bytes"] for b in s["blocks"].values()) == s["tensor_bytes"]
    assert sum(v["bytes"] for v in s["types"].values()) == s["tensor_bytes"]
    assert sum(sh["tensors"] for sh in s["shards"]) == 67
    assert sum(sh["file_bytes"] for sh in s["shards"]) == sum(p.stat().st_size for p in shards)
    assert list(s["blocks"]) == ["0", "1", "2", "global"]
    assert s["blocks"]["0"]["count"] == 18 and s["blocks"]["1"]["count"] == 23 and s["blocks"]["global"]["count"] == 3
    assert s["metadata"]["tokenizer.ggml.tokens"] == "[63 x str]"
    assert block_of("blk.12.attn_q_a.weight") == "12" and block_of("output.weight") == "global"


def test_inspect_cli_plain_and_json(shards, capsys):
    assert main(["gguf", "inspect", "--json", str(shards[2])]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["gguf", "inspect", "--json", str(shards[0])]) == 0
    assert json.loads(capsys.readouterr().out) == a
    assert a["arch"] == "glm-dsa" and a["tensor_count"] == 67 and a["split_count"] == len(shards)
    assert main(["gguf", "inspect", str(shards[1])]) == 0
    text = capsys.readouterr().out
    assert "glm-dsa.expert_count" in text and "m-00002-of-00004.gguf" in text and "Q8_0" in text


def test_tensor_lookup_error(fixture):
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        open_gguf(fixture).tensor("nope")


def test_gguf_type_enum_is_exposed(fixture):
    assert open_gguf(fixture).tensor("output.weight").ggml_type is GGMLQuantizationType.BF16
