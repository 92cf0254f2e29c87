"""A corpus of hostile inputs for every `glm5lib` verb, and a runner that bounds each run in time and memory.

Each input case is a small file (or a special file, or a shard set with one bad member) made from the tiny
GLM-5 (a real glm-dsa GGUF that `map check` passes) or from a hand-written header. `CASES` maps a case name to
(class, maker); a maker writes into a directory and returns `Input(path, names)`, where `names` are the file
names an error about it may mention. `run_cli(argv)` calls `glm5lib.cli.main` in-process under a wall-clock
alarm and an address-space limit, and returns (rc, stdout, stderr, seconds).

Headers are written with `glm5lib.gguf.format` (llama.cpp's byte layout); a crafted header field is patched
into the bytes afterwards, because the encoder only writes consistent headers.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import shutil
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType

from glm5lib.gguf.format import KV, OutTensor, encode_header, pad, read_header, set_kv

CASE_SECONDS = 20  # a refusal takes well under a second; this only catches hangs (first-import costs included)
CASE_EXTRA_AS = 3 << 30  # address space a case may add to what the test process already maps


class CaseTimeout(BaseException):
    """Raised by the alarm inside a case that hangs (BaseException: the CLI's handlers must not swallow it)."""


@dataclass
class Input:
    path: Path
    names: tuple[str, ...]  # file names an error line may name (the input, or the bad shard)


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def run_cli(argv: list[str], seconds: float = CASE_SECONDS) -> tuple[int, str, str, float]:
    """`glm5lib ARGV` in this process: exit code, stdout, stderr, wall seconds. A hang raises CaseTimeout; a run
    that maps more than CASE_EXTRA_AS more address space gets MemoryError (which surfaces as a traceback)."""
    from glm5lib.cli import main

    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise CaseTimeout(f"glm5lib {' '.join(argv)}: still running after {seconds} s")

    old_alarm = signal.signal(signal.SIGALRM, alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + CASE_EXTRA_AS
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
            except Exception:  # a bug: keep the traceback as the stderr the user would see
                import traceback

                traceback.print_exc()
                rc = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


# ---- writing GGUF files --------------------------------------------------------------------------------------------


def copy_with(src: Path, out: Path, edit: Callable[[list[KV], list[OutTensor]], tuple[list[KV], list[OutTensor]]]
              ) -> Path:
    """`src` (a single GGUF) rewritten with `edit` applied to its metadata and tensor list; data bytes copied."""
    h = read_header(src)
    tensors = [OutTensor(t.name, t.ne, t.ggml_type, int(t.nbytes or 0), src, h.data_offset + t.offset)
               for t in h.tensors]
    kvs, tensors = edit(list(h.kvs), tensors)
    with open(src, "rb") as f, open(out, "wb") as o:
        o.write(encode_header(kvs, tensors))
        for t in tensors:
            f.seek(t.src_offset)
            o.write(f.read(t.nbytes))
            o.write(b"\0" * (pad(t.nbytes) - t.nbytes))
    return out


def small_gguf(out: Path, *, n_tokens: int = 4) -> Path:
    """A minimal well-formed GGUF (glm-dsa arch, a string, a string array, a u32 array, three small tensors)."""
    kvs = [KV("general.architecture", GGUFValueType.STRING, "glm-dsa"),
           KV("glm-dsa.block_count", GGUFValueType.UINT32, 1),
           KV("tokenizer.ggml.tokens", GGUFValueType.ARRAY, [f"t{i}" for i in range(n_tokens)], GGUFValueType.STRING),
           KV("glm5lib.test.u32s", GGUFValueType.ARRAY, [1, 2, 3], GGUFValueType.UINT32)]
    data = [np.arange(8, dtype=np.float32), np.ones(16, np.float32), np.arange(32, dtype=np.float32)]
    tmp = out.with_name(out.name + ".data")
    tmp.write_bytes(b"".join(a.tobytes() for a in data))
    tensors, off = [], 0
    for name, a in zip(("token_embd.weight", "output_norm.weight", "output.weight"), data):
        tensors.append(OutTensor(name, (a.size,), int(GGMLQuantizationType.F32), a.nbytes, tmp, off))
        off += a.nbytes
    with open(out, "wb") as o:
        o.write(encode_header(kvs, tensors))
        for t in tensors:
            o.write(tmp.read_bytes()[t.src_offset:t.src_offset + t.nbytes] + b"\0" * (pad(t.nbytes) - t.nbytes))
    tmp.unlink()
    return out


def _find(data: bytes, s: str) -> int:
    """Byte offset of the length-prefixed string `s` in a header (its u64 length)."""
    key = struct.pack("<Q", len(s.encode())) + s.encode()
    at = data.find(key)
    assert at >= 0, s
    return at


def patch(path: Path, fn: Callable[[bytearray], None]) -> Path:
    data = bytearray(path.read_bytes())
    fn(data)
    path.write_bytes(bytes(data))
    return path


def tensor_field(data: bytes, name: str) -> int:
    """Offset of the i32 type field of tensor `name` (its u64 offset follows)."""
    p = _find(data, name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, p)[0]
    return p + 4 + 8 * n_dims


def kv_value(data: bytes, key: str) -> int:
    """Offset of the value type (i32) of metadata `key`."""
    return _find(data, key) + 8 + len(key)


# ---- the cases -----------------------------------------------------------------------------------------------------


@dataclass
class Base:
    """Good inputs the cases are made from: a merged tiny GLM-5 GGUF, its shard set, its HF directory."""

    gguf: Path  # merged, passes `map check`
    shards: list[Path]
    hf_dir: Path


def _shard_copy(base: Base, d: Path) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy(p, d / p.name)) for p in base.shards]


def _replace_shard(base: Base, d: Path, make: Callable[[Path], None]) -> Input:
    shards = _shard_copy(base, d / "set")
    victim = shards[1]
    victim.unlink()
    make(victim)
    return Input(shards[0], (victim.name, shards[0].name))


def _mkfifo(p: Path) -> None:
    os.mkfifo(p)


def _symlink_to(target: str) -> Callable[[Path], None]:
    return lambda p: p.symlink_to(target)


def _mkdir(p: Path) -> None:
    p.mkdir()


def special_cases() -> dict[str, Callable[[Base, Path], Input]]:
    def file_as(make: Callable[[Path], None]) -> Callable[[Base, Path], Input]:
        def mk(base: Base, d: Path) -> Input:
            p = d / "model.gguf"
            make(p)
            return Input(p, (p.name,))
        return mk

    return {
        "fifo": file_as(_mkfifo),
        "directory": file_as(_mkdir),
        "dev_zero": file_as(_symlink_to("/dev/zero")),
        "dev_null": file_as(_symlink_to("/dev/null")),
        "dangling_input": file_as(_symlink_to("/nonexistent/glm5lib")),
        "fifo_shard": lambda b, d: _replace_shard(b, d, _mkfifo),
        "directory_shard": lambda b, d: _replace_shard(b, d, _mkdir),
        "dev_zero_shard": lambda b, d: _replace_shard(b, d, _symlink_to("/dev/zero")),
    }


def _small(d: Path, fn: Callable[[bytearray], None], name: str = "small.gguf") -> Input:
    p = small_gguf(d / name)
    patch(p, fn)
    return Input(p, (p.name,))


def huge_claim_cases() -> dict[str, Callable[[Base, Path], Input]]:
    def n_tensors(data):
        struct.pack_into("<q", data, 8, 1 << 40)

    def n_kv(data):
        struct.pack_into("<q", data, 16, 1 << 40)

    def string_len(data):  # general.architecture's value length
        struct.pack_into("<Q", data, kv_value(data, "general.architecture") + 4, 1 << 50)

    def key_len(data):
        struct.pack_into("<Q", data, 24, (1 << 62) + 5)

    def str_array_len(data):
        struct.pack_into("<Q", data, kv_value(data, "tokenizer.ggml.tokens") + 8, 1 << 40)

    def u32_array_len(data):
        struct.pack_into("<Q", data, kv_value(data, "glm5lib.test.u32s") + 8, (1 << 61) + 1)

    def n_dims(data):
        struct.pack_into("<I", data, _find(data, "output_norm.weight") + 8 + len("output_norm.weight"), 1 << 30)

    def ne_huge(data):
        p = _find(data, "output_norm.weight") + 8 + len("output_norm.weight") + 4
        struct.pack_into("<q", data, p, 1 << 60)

    def split_count(base: Base, d: Path) -> Input:
        # a real shard whose split.count (u16 in llama.cpp) is rewritten as a u64 of 2^40
        p = copy_with(base.shards[0], d / "m-00001-of-00003.gguf",
                      lambda kvs, ts: (set_kv(kvs, KV("split.count", GGUFValueType.UINT64, 1 << 40)), ts))
        return Input(p, (p.name,))

    def split_count_named(base: Base, d: Path) -> Input:
        # split.count 65535 with a matching name: 65,534 shards are missing
        p = copy_with(base.shards[0], d / "m-00001-of-65535.gguf",
                      lambda kvs, ts: (set_kv(kvs, KV("split.count", GGUFValueType.UINT16, 65535)), ts))
        return Input(p, (p.name, "m-00002-of-65535.gguf"))

    out: dict[str, Callable[[Base, Path], Input]] = {
        name: (lambda fn: lambda b, d: _small(d, fn))(fn)
        for name, fn in {"n_tensors": n_tensors, "n_kv": n_kv, "string_length": string_len, "key_length": key_len,
                         "string_array_length": str_array_len, "u32_array_length": u32_array_len,
                         "n_dims": n_dims, "ne_huge": ne_huge}.items()
    }
    out["split_count_u64"] = split_count
    out["split_count_65535"] = split_count_named
    return out


def encoding_cases() -> dict[str, Callable[[Base, Path], Input]]:
    def bad_key(data):
        p = _find(data, "glm-dsa.block_count") + 8
        data[p:p + 2] = b"\xff\xfe"

    def bad_string(data):
        p = kv_value(data, "general.architecture") + 4 + 8
        data[p:p + 2] = b"\xc3\x28"

    def bad_array_item(data):
        p = _find(data, "t2") + 8
        data[p] = 0x80

    def bad_tensor_name(data):
        p = _find(data, "output.weight") + 8
        data[p] = 0xFF

    return {name: (lambda fn: lambda b, d: _small(d, fn))(fn) for name, fn in
            {"key_not_utf8": bad_key, "string_not_utf8": bad_string, "token_not_utf8": bad_array_item,
             "tensor_name_not_utf8": bad_tensor_name}.items()}


def layout_cases() -> dict[str, Callable[[Base, Path], Input]]:
    """Tensor data misaligned, overlapping another tensor, or past the end, in an otherwise good glm-dsa file."""
    def edit(name: str, how: Callable[[int, int], int]) -> Callable[[Base, Path], Input]:
        def mk(base: Base, d: Path) -> Input:
            p = Path(shutil.copy(base.gguf, d / "layout.gguf"))
            h = read_header(p)
            names = [t.name for t in h.tensors]
            i = names.index(name)
            other = h.tensors[i - 1]

            def fn(data):
                at = tensor_field(data, name) + 4
                old = struct.unpack_from("<Q", data, at)[0]
                struct.pack_into("<Q", data, at, how(old, other.offset))
            patch(p, fn)
            return Input(p, (p.name,))
        return mk

    return {
        "misaligned": edit("blk.1.attn_norm.weight", lambda old, prev: old + 4),
        "overlapping": edit("blk.1.ffn_norm.weight", lambda old, prev: prev),  # same bytes as its neighbour
        "past_end": edit("output_norm.weight", lambda old, prev: 1 << 40),
        "truncated_data": lambda b, d: Input(_truncate(b.gguf, d / "cut.gguf"), ("cut.gguf",)),
    }


def _truncate(src: Path, out: Path) -> Path:
    out.write_bytes(src.read_bytes()[:-4096])
    return out


def metadata_cases() -> dict[str, Callable[[Base, Path], Input]]:
    """Metadata that parses but describes no usable model."""
    def kv_edit(name: str, fn) -> Callable[[Base, Path], Input]:
        def mk(base: Base, d: Path) -> Input:
            p = copy_with(base.gguf, d / f"{name}.gguf", lambda kvs, ts: (fn(kvs), ts))
            return Input(p, (p.name,))
        return mk

    def drop(key):
        return lambda kvs: [k for k in kvs if k.key != key]

    def put(kv):
        return lambda kvs: set_kv(kvs, kv)

    return {
        "block_count_0": kv_edit("block_count_0", put(KV("glm-dsa.block_count", GGUFValueType.UINT32, 0))),
        "string_for_number": kv_edit("string_for_number",
                                     put(KV("glm-dsa.embedding_length", GGUFValueType.STRING, "6144"))),
        "no_tokenizer": kv_edit("no_tokenizer", drop("tokenizer.ggml.tokens")),
        "bos_out_of_range": kv_edit("bos_out_of_range",
                                    put(KV("tokenizer.ggml.bos_token_id", GGUFValueType.UINT32, 1 << 30))),
        "no_head_count": kv_edit("no_head_count", drop("glm-dsa.attention.head_count")),
        "other_arch": kv_edit("other_arch", put(KV("general.architecture", GGUFValueType.STRING, "llama"))),
        "tokens_not_strings": kv_edit("tokens_not_strings", put(KV("tokenizer.ggml.tokens", GGUFValueType.ARRAY,
                                                                   list(range(1024)), GGUFValueType.INT32))),
    }


INPUT_CLASSES = {"special": special_cases, "huge": huge_claim_cases, "encoding": encoding_cases,
                 "layout": layout_cases, "metadata": metadata_cases}


def input_cases() -> dict[str, tuple[str, Callable[[Base, Path], Input]]]:
    """case name -> (class, maker)."""
    return {name: (cls, mk) for cls, fn in INPUT_CLASSES.items() for name, mk in fn().items()}


# ---- config files (doctor MODEL, map check --config) -----------------------------------------------------------------


def config_cases() -> dict[str, Callable[[Path], Path]]:
    def text(body: str | bytes) -> Callable[[Path], Path]:
        def mk(d: Path) -> Path:
            p = d / "config.json"
            p.write_bytes(body if isinstance(body, bytes) else body.encode())
            return p
        return mk

    def special(make) -> Callable[[Path], Path]:
        def mk(d: Path) -> Path:
            p = d / "config.json"
            make(p)
            return p
        return mk

    return {
        "json_list": text("[1, 2, 3]"),
        "json_string": text('"config"'),
        "json_null": text("null"),
        "not_json": text("{hidden_size: 6144"),
        "not_utf8": text(b'{"a": "\xff\xfe"}'),
        "deep_nesting": text("[" * 100000 + "]" * 100000),
        "string_for_number": text('{"num_attention_heads": "64", "kv_lora_rank": 512, "qk_rope_head_dim": 64}'),
        "layers_zero": text('{"num_attention_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, '
                            '"num_hidden_layers": 0}'),
        "list_for_number": text('{"num_attention_heads": [64], "kv_lora_rank": 512, "qk_rope_head_dim": 64}'),
        "fifo": special(_mkfifo),
        "directory": special(_mkdir),
    }
