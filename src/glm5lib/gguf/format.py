"""The GGUF container, byte for byte: read one file's header, and write headers the way llama.cpp does.

Why not `gguf.GGUFReader` / `gguf.GGUFWriter` (we use gguf-py's constants and dequantizers throughout):
- `GGUFReader` stops at the first oddity (duplicate name, unknown tensor type, data past the end of a
  truncated file) and builds a data view for every tensor, but `validate` must list every problem, and
  `inspect` must read a 400 GB shard set's metadata without touching tensor data. It is also slow on large
  string arrays: a GLM-5-sized tokenizer (154,880 tokens, 321k merges) takes it ~65 s, this parser ~2 s.
- `GGUFWriter`'s split mode is not byte-compatible with llama.cpp's `llama-gguf-split` (key order, n_dims,
  size accounting, file names), and the split/merge outputs here must be (docs/glm5.md section 4).

Layout (little-endian, version 3): magic "GGUF", u32 version, i64 n_tensors, i64 n_kv, KVs
(string key, i32 type, value; arrays: i32 ARRAY, i32 item type, u64 count, items), tensor infos (string name,
u32 n_dims, i64 ne[n_dims], i32 ggml type, u64 offset relative to the data section), zero padding to the
alignment, then the data section. Strings are u64 length + bytes.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from glm5lib.errors import GGUFFormatError, UserError
from glm5lib.files import open_input

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3  # what llama.cpp writes
ALIGNMENT = GGUF_DEFAULT_ALIGNMENT  # 32: llama-gguf-split always pads with this
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # llama.cpp refuses names of 64 bytes or more

KEY_ALIGNMENT = "general.alignment"
KEY_ARCH = "general.architecture"
KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS = "split.tensors.count"

# GGUF scalar value types -> numpy dtype (little-endian)
_SCALAR = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("<u1"),
}


def pad(n: int, alignment: int = ALIGNMENT) -> int:
    """`GGML_PAD`: n rounded up to a multiple of alignment."""
    return (n + alignment - 1) // alignment * alignment


def type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def tensor_nbytes(ne: tuple[int, ...], ggml_type: int) -> int:
    """Bytes of a tensor of ggml shape `ne` (`ggml_nbytes`). Raises ValueError for a type gguf-py does not know."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    n = 1
    for d in ne:
        n *= d
    return n // block * size


def ggml_n_dims(ne: tuple[int, ...]) -> int:
    """`ggml_n_dims`: trailing dimensions of size 1 are not written (at least one dimension is)."""
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] != 1:
            return i + 1
    return 1


@dataclass(frozen=True)
class KV:
    """One metadata pair. `value` is a Python scalar/str, a list of str, or a numpy array for numeric arrays."""

    key: str
    type: GGUFValueType  # ARRAY for arrays
    value: Any
    item_type: GGUFValueType | None = None  # arrays only

    def python_value(self) -> Any:
        if self.type == GGUFValueType.ARRAY and isinstance(self.value, np.ndarray):
            out = self.value.tolist()
            return [bool(v) for v in out] if self.item_type == GGUFValueType.BOOL else out
        return self.value


@dataclass(frozen=True)
class RawTensorInfo:
    """A tensor info as stored in one file. `offset` is relative to that file's data section."""

    name: str
    ne: tuple[int, ...]  # ggml order (fastest first), as many dims as the file wrote
    ggml_type: int  # raw id; may be one gguf-py does not know
    offset: int

    @property
    def known_type(self) -> bool:
        try:
            GGMLQuantizationType(self.ggml_type)
        except ValueError:
            return False
        return self.ggml_type in GGML_QUANT_SIZES

    @property
    def nbytes(self) -> int | None:
        """Bytes of data, or None when the type is unknown or the row is not a whole number of blocks."""
        if not self.known_type:
            return None
        block = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)][0]
        if self.ne and self.ne[0] % block:
            return None
        return tensor_nbytes(self.ne, self.ggml_type)


@dataclass
class GGUFHeader:
    """Everything before the data section of one GGUF file, plus where that section starts."""

    path: Path
    version: int
    kvs: list[KV]
    tensors: list[RawTensorInfo]
    header_end: int  # end of the last tensor info, before padding
    data_offset: int  # start of the data section (header_end padded to the alignment)
    file_size: int
    duplicate_keys: list[str] = field(default_factory=list)

    @property
    def kv(self) -> dict[str, Any]:
        return {kv.key: kv.python_value() for kv in self.kvs}

    def get(self, key: str, default: Any = None) -> Any:
        for kv in self.kvs:
            if kv.key == key:
                return kv.python_value()
        return default

    def kv_type(self, key: str) -> GGUFValueType | None:
        for kv in self.kvs:
            if kv.key == key:
                return kv.type
        return None

    @property
    def alignment(self) -> int:
        value = self.get(KEY_ALIGNMENT)
        return int(value) if isinstance(value, int) and value > 0 else ALIGNMENT


class _Cursor:
    """Reads the header from a memory map; running off the end is a truncated header."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFFormatError(
                f"{self.path}: truncated header (needs byte {self.pos + n:,}, file has {len(self.buf):,})"
            )
        # A copy, not a memoryview: a view still referenced by an exception's traceback would keep the mmap
        # from closing (BufferError), masking the real error.
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.take(size))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q")
        if n > self.left:
            raise GGUFFormatError(f"{self.path}: {what} claims a string of {n:,} bytes at byte {self.pos - 8:,}, "
                                  f"past the end of the file ({len(self.buf):,} bytes)")
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(f"{self.path}: {what} is not UTF-8 (byte {self.pos - n + exc.start:,})") from None

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        return np.frombuffer(self.take(dtype.itemsize * count), dtype=dtype).copy()


def _value_type(raw: int, cur: _Cursor, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFFormatError(f"{cur.path}: key '{key}' has invalid GGUF value type {raw}") from None


def _read_kv(cur: _Cursor) -> KV:
    key = cur.string("a key")
    vtype = _value_type(cur.unpack("<i"), cur, key)
    if vtype == GGUFValueType.ARRAY:
        itype = _value_type(cur.unpack("<i"), cur, key)
        count = cur.unpack("<Q")
        if itype == GGUFValueType.ARRAY:
            raise GGUFFormatError(f"{cur.path}: key '{key}' is an array of arrays (llama.cpp does not read these)")
        least = 8 if itype == GGUFValueType.STRING else _SCALAR[itype].itemsize  # bytes per item, at least
        if count * least > cur.left:  # checked before any item is read: a crafted count costs nothing
            raise GGUFFormatError(f"{cur.path}: key '{key}' claims {count:,} array items, more than the "
                                  f"{cur.left:,} bytes left in the file can hold")
        if itype == GGUFValueType.STRING:
            return KV(key, vtype, [cur.string(f"item {i} of '{key}'") for i in range(count)], itype)
        return KV(key, vtype, cur.array(_SCALAR[itype], count), itype)
    if vtype == GGUFValueType.STRING:
        return KV(key, vtype, cur.string(f"'{key}'"))
    value = cur.array(_SCALAR[vtype], 1)[0].item()
    return KV(key, vtype, bool(value) if vtype == GGUFValueType.BOOL else value)


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse one file's header. Raises GGUFFormatError when the header itself cannot be read.

    Problems in what the header describes (unknown types, data past the end, duplicates) are left for
    `glm5lib.gguf.checks` so that they can be listed together.
    """
    path = Path(path)
    try:
        fd = open_input(path)  # a FIFO, directory or device is refused here, before any read
    except UserError as exc:
        raise GGUFFormatError(str(exc)) from None
    try:
        size = os.fstat(fd).st_size
        if size < 24:
            raise GGUFFormatError(f"{path}: {size} bytes is too small to be a GGUF file (truncated?)")
        # The header is parsed from a memory map: only the pages it spans are read.
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path, size)
    finally:
        os.close(fd)


def _parse(buf: mmap.mmap, path: Path, size: int) -> GGUFHeader:
    cur = _Cursor(buf, path)
    magic = bytes(cur.take(4))
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = cur.unpack("<I")
    if version & 0xFFFF == 0:
        raise GGUFFormatError(f"{path}: GGUF version {version:#x} looks big-endian, which is not supported")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: unsupported GGUF version {version} (2 and 3 are readable)")
    n_tensors, n_kv = cur.unpack("<q"), cur.unpack("<q")
    if n_tensors < 0 or n_kv < 0:
        raise GGUFFormatError(f"{path}: corrupt header (n_tensors={n_tensors}, n_kv={n_kv})")
    # Each tensor info takes at least 24 bytes (name length, n_dims, type, offset), each KV at least 13.
    if n_tensors * 24 + n_kv * 13 > cur.left:
        raise GGUFFormatError(f"{path}: truncated header: it claims {n_tensors:,} tensors and {n_kv:,} metadata keys, more than "
                              f"a file of {size:,} bytes can hold")

    kvs: list[KV] = []
    seen: set[str] = set()
    duplicate_keys: list[str] = []
    for _ in range(n_kv):
        kv = _read_kv(cur)
        if kv.key in seen:
            duplicate_keys.append(kv.key)
        seen.add(kv.key)
        kvs.append(kv)

    tensors: list[RawTensorInfo] = []
    for i in range(n_tensors):
        name = cur.string(f"tensor name {i}")
        n_dims = cur.unpack("<I")
        if n_dims > 64:  # far past GGML_MAX_DIMS: a corrupt header, not just an odd tensor
            raise GGUFFormatError(f"{path}: tensor '{name}' has {n_dims} dimensions (corrupt header)")
        ne = tuple(int(d) for d in cur.array(np.dtype("<i8"), n_dims))
        ggml_type = cur.unpack("<i")
        offset = cur.unpack("<Q")
        tensors.append(RawTensorInfo(name, ne, ggml_type, offset))

    header = GGUFHeader(path, version, kvs, tensors, cur.pos, 0, size, duplicate_keys)
    header.data_offset = pad(cur.pos, header.alignment)
    return header


# ---------------------------------------------------------------------------------------------------------
# Writing: the bytes of `gguf_get_meta_data` (ggml/src/gguf.cpp, gguf_write_out with only_meta).


def _encode_str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def encode_kv(kv: KV) -> bytes:
    out = [_encode_str(kv.key)]
    if kv.type == GGUFValueType.ARRAY:
        assert kv.item_type is not None
        out.append(struct.pack("<iiQ", GGUFValueType.ARRAY, kv.item_type, len(kv.value)))
        if kv.item_type == GGUFValueType.STRING:
            out.extend(_encode_str(s) for s in kv.value)
        else:
            values = np.asarray(kv.value)
            if kv.item_type == GGUFValueType.BOOL:
                values = values != 0  # llama.cpp writes bools as 0/1
            out.append(values.astype(_SCALAR[kv.item_type]).tobytes())
    elif kv.type == GGUFValueType.STRING:
        out.append(struct.pack("<i", kv.type))
        out.append(_encode_str(kv.value))
    else:
        value = bool(kv.value) if kv.type == GGUFValueType.BOOL else kv.value
        out.append(struct.pack("<i", kv.type))
        out.append(np.array(value).astype(_SCALAR[kv.type]).tobytes())
    return b"".join(out)


@dataclass(frozen=True)
class OutTensor:
    """A tensor to write: its ggml shape and type, and where its bytes come from."""

    name: str
    ne: tuple[int, ...]
    ggml_type: int
    nbytes: int
    src_path: Path
    src_offset: int  # absolute offset in src_path


def layout(tensors: list[OutTensor]) -> list[int]:
    """Data-section offsets as `gguf_add_tensor` assigns them: each tensor padded to 32."""
    offsets, pos = [], 0
    for t in tensors:
        offsets.append(pos)
        pos += pad(t.nbytes)
    return offsets


def encode_header(kvs: list[KV], tensors: list[OutTensor]) -> bytes:
    """Magic, counts, KVs, tensor infos (n_dims trimmed of trailing 1s), zero padding to 32."""
    out = [GGUF_MAGIC, struct.pack("<Iqq", GGUF_VERSION, len(tensors), len(kvs))]
    out.extend(encode_kv(kv) for kv in kvs)
    for t, offset in zip(tensors, layout(tensors)):
        n_dims = ggml_n_dims(t.ne)
        ne = (tuple(t.ne) + (1,) * GGML_MAX_DIMS)[:n_dims]
        out.append(_encode_str(t.name))
        out.append(struct.pack(f"<I{n_dims}qiQ", n_dims, *ne, t.ggml_type, offset))
    meta = b"".join(out)
    return meta + b"\0" * (pad(len(meta)) - len(meta))


def set_kv(kvs: list[KV], kv: KV) -> list[KV]:
    """`gguf_set_val_*`: remove the key if present, then append (so a re-set key moves to the end)."""
    return [k for k in kvs if k.key != kv.key] + [kv]
