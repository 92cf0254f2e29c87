"""`open_gguf(path)`: one GGUF file or a whole llama.cpp shard set, found from any of its shards."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quant_shape_to_byte_shape

from glm5lib.errors import GGUFFormatError, UserError
from glm5lib.gguf.checks import Problem, file_problems
from glm5lib.gguf.format import (
    KEY_ARCH,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS,
    GGUFHeader,
    read_header,
)

# llama.cpp's `llama_split_path`: "%s-%05d-of-%05d.gguf" with split.no + 1
SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
CHUNK = 64 << 20  # bytes per read/copy: bounded memory whatever the tensor size
MAX_SHARDS = 99999  # llama_split_path writes %05d

# numpy dtypes for the types gguf-py's reader also exposes typed; BF16 (no numpy dtype) comes as uint16
_TYPED = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.BF16: np.dtype("<u2"),
    GGMLQuantizationType.I8: np.dtype("<i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


def shard_path(prefix: str | os.PathLike, split_no: int, split_count: int) -> Path:
    """`llama_split_path`: the file of shard `split_no` (0-based) of a set written with `prefix`."""
    return Path(f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file or shard set. `offset` is absolute in `path`; `ne` is ggml order (fastest first)."""

    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]
    path: Path
    offset: int
    nbytes: int
    shard: int

    @property
    def shape(self) -> tuple[int, ...]:
        """torch/numpy order: reversed `ne`, trailing ggml 1s dropped as the file wrote them."""
        return tuple(reversed(self.ne))

    @property
    def type_name(self) -> str:
        return self.ggml_type.name

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64)) if self.ne else 1


class GGUFSet:
    """A GGUF file or shard set: metadata of shard 0, tensors of all shards in order, lazy data access.

    Attributes: `shards` (paths, in split.no order), `headers` (parsed headers, same order), `kv` (shard 0's
    metadata, name -> Python value), `tensors` (list of TensorInfo), `arch`, `problems` (every Problem found;
    none of them fatal, or `open_gguf` would have raised).
    """

    def __init__(self, shards: list[Path], headers: list[GGUFHeader], problems: list[Problem]):
        self.shards = shards
        self.headers = headers
        self.problems = problems
        self.kv: dict[str, Any] = headers[0].kv
        self.tensors: list[TensorInfo] = []
        for i, h in enumerate(headers):
            for t in h.tensors:
                self.tensors.append(
                    TensorInfo(t.name, GGMLQuantizationType(t.ggml_type), t.ne, h.path,
                               h.data_offset + t.offset, int(t.nbytes or 0), i)
                )
        self._by_name = {t.name: t for t in self.tensors}
        self.layout_problems = [p for p in problems if p.layout]

    def check_readable(self) -> None:
        """Raise GGUFFormatError if tensor data is misaligned or overlaps: reading it would give wrong bytes."""
        if self.layout_problems:
            p = self.layout_problems[0]
            raise GGUFFormatError(f"{p}: tensor data cannot be read from this file (llama.cpp refuses it too; "
                                  f"see `glm5lib gguf validate`)")

    def __repr__(self) -> str:
        return f"GGUFSet({self.shards[0].name}, shards={len(self.shards)}, tensors={len(self.tensors)}, arch={self.arch})"

    @property
    def arch(self) -> str | None:
        return self.kv.get(KEY_ARCH)

    @property
    def nbytes(self) -> int:
        """Tensor data bytes (unpadded)."""
        return sum(t.nbytes for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor '{name}' in {self.shards[0].name}") from None

    def raw(self, name: str) -> np.ndarray:
        """A read-only memmap view of the tensor's bytes, in torch order.

        F32/F16/F64/I8-I64: typed, shape `info.shape`. BF16: uint16 of that shape (`torch.from_numpy(a).view(
        torch.bfloat16)`). Quantized types: uint8 [..., bytes per row], the layout gguf-py's dequantizers take.
        """
        t = self.tensor(name)
        self.check_readable()
        if t.nbytes == 0:
            return np.zeros(0, np.uint8)
        data = np.memmap(t.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))
        if t.ggml_type in _TYPED:
            return data.view(_TYPED[t.ggml_type]).reshape(t.shape)
        return data.reshape(quant_shape_to_byte_shape(t.shape, t.ggml_type))

    def dequantize(self, name: str, index: Any = None) -> np.ndarray:
        """float32 values in torch order via `gguf.quants.dequantize`: the whole tensor (shape `info.shape`), or
        with `index` only `raw(name)[index]`, a selection along the outermost torch dim (one expert of a stacked
        `ffn_*_exps`, some embedding rows). Only the selected bytes are read: a quantized block never spans rows."""
        t = self.tensor(name)
        raw = self.raw(name)
        if index is not None:
            raw = raw[index]
        shape = None
        if t.ggml_type in _TYPED:
            if t.ggml_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
                return np.asarray(raw, dtype=np.float32)  # integer / f64 tensors: plain cast
            shape = np.shape(raw)  # gguf-py takes the plain float types as bytes too
            raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        try:
            out = gguf_dequantize(np.asarray(raw), t.ggml_type)
        except (NotImplementedError, ValueError) as exc:  # e.g. ik_llama.cpp-only types
            raise UserError(f"cannot dequantize '{name}' ({t.type_name}) with gguf-py: {exc}") from None
        out = np.asarray(out, dtype=np.float32)
        return out.reshape(shape) if shape is not None else out

    def iter_bytes(self, name: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """The tensor's bytes in bounded chunks, read with pread (no mmap, so they leave no resident pages)."""
        t = self.tensor(name)
        self.check_readable()
        fd = os.open(t.path, os.O_RDONLY)
        try:
            pos, end = t.offset, t.offset + t.nbytes
            while pos < end:
                buf = os.pread(fd, min(chunk, end - pos), pos)
                if not buf:
                    raise GGUFFormatError(f"{t.path}: unexpected end of file in tensor '{name}'")
                pos += len(buf)
                yield buf
        finally:
            os.close(fd)

    def hash_tensor(self, name: str, algorithm: str = "sha256") -> str:
        """Hex digest of the tensor's data bytes, streamed."""
        h = hashlib.new(algorithm)
        for buf in self.iter_bytes(name):
            h.update(buf)
        return h.hexdigest()


def _discover(path: Path, h0: GGUFHeader) -> tuple[list[Path], int, list[Problem]]:
    """The shard paths of the set `path` belongs to, the index of `path` in it, and naming problems."""
    problems: list[Problem] = []
    count = h0.get(KEY_SPLIT_COUNT)
    match = SHARD_NAME.match(path.name)
    if not isinstance(count, int) or count < 1:
        if match and int(match["count"]) > 1:  # readable alone, but not the shard its name promises
            what = "no split.count" if count is None else f"{KEY_SPLIT_COUNT} {count!r} (a merged file?)"
            problems.append(Problem(f"{path.name}: named as shard {int(match['no'])} of {int(match['count'])} "
                                    f"but has {what}", False))
        return [path], 0, problems  # a single (or merged) file
    if count > MAX_SHARDS:  # checked before any list of shard paths is built
        problems.append(Problem(f"{path.name}: {KEY_SPLIT_COUNT} is {count:,}; a shard set has at most "
                                f"{MAX_SHARDS:,} shards (5-digit names)", True))
        return [path], 0, problems
    if match is None:
        if count == 1:
            return [path], 0, problems
        problems.append(Problem(f"{path.name}: {KEY_SPLIT_COUNT} is {count} but the name is not "
                                f"PREFIX-NNNNN-of-{count:05d}.gguf, so the other shards cannot be found", True))
        return [path], 0, problems
    prefix = str(path.parent / match["prefix"])
    if int(match["count"]) != count:
        problems.append(Problem(f"{path.name}: name says {int(match['count'])} shards but {KEY_SPLIT_COUNT} is "
                                f"{count} (shard from another set?)", True))
    index = int(match["no"]) - 1
    if not 0 <= index < count:
        problems.append(Problem(f"{path.name}: shard number {index + 1} is outside 1..{count}", True))
        index = 0
    return [shard_path(prefix, i, count) for i in range(count)], index, problems


def _extra_shards(shards: list[Path]) -> list[Path]:
    """Files next to the set that are named like its shards (same prefix) but are not among them."""
    match = SHARD_NAME.match(shards[0].name)
    if match is None:
        return []
    expected = {p.name for p in shards}
    directory = shards[0].parent
    extra = []
    for entry in sorted(os.listdir(directory)):
        m = SHARD_NAME.match(entry)
        if m and m["prefix"] == match["prefix"] and entry not in expected:
            extra.append(directory / entry)
    return extra


def scan(path: str | os.PathLike) -> tuple[list[Path], list[GGUFHeader | None], list[Problem]]:
    """Find and check the whole set around `path`. Raises GGUFFormatError only when `path` itself is unreadable.

    Returns the shard paths, their headers (None for a missing or unreadable shard) and every problem found.
    """
    path = Path(path)
    h_given = read_header(path)
    shards, index, problems = _discover(path, h_given)
    headers: list[GGUFHeader | None] = []
    try:  # one directory listing instead of a stat per shard (a crafted split.count names up to 99,999)
        present = set(os.listdir(path.parent)) if len(shards) > 1 else set()
    except OSError:
        present = {p.name for p in shards}
    for i, p in enumerate(shards):
        if i == index:
            headers.append(h_given)
            continue
        if p.name not in present or not p.exists():
            problems.append(Problem(f"missing shard {p.name} ({i + 1} of {len(shards)})", True))
            headers.append(None)
            continue
        try:
            headers.append(read_header(p))
        except GGUFFormatError as exc:
            problems.append(Problem(f"shard {p.name} is unreadable: {exc}", True))
            headers.append(None)
    for p in _extra_shards(shards):
        problems.append(Problem(f"extra shard {p.name} next to the {len(shards)}-shard set", False))

    split = len(shards) > 1 or h_given.get(KEY_SPLIT_COUNT) == 1
    ref = headers[0] if headers[0] is not None else h_given
    total = ref.get(KEY_SPLIT_TENSORS) if split else None
    seen: dict[str, str] = {}
    n_tensors = 0
    for i, h in enumerate(headers):
        if h is None:
            continue
        problems.extend(file_problems(h))
        n_tensors += len(h.tensors)
        for t in h.tensors:
            if t.name in seen and seen[t.name] != h.path.name:
                problems.append(Problem(f"{h.path.name}: tensor '{t.name}' is also in {seen[t.name]}", True))
            seen.setdefault(t.name, h.path.name)
        if not split:
            continue
        no, count, tcount = h.get(KEY_SPLIT_NO), h.get(KEY_SPLIT_COUNT), h.get(KEY_SPLIT_TENSORS)
        if no != i:
            problems.append(Problem(f"{h.path.name}: {KEY_SPLIT_NO} is {no}, expected {i} (order)", True))
        if count != len(shards):
            problems.append(Problem(f"{h.path.name}: {KEY_SPLIT_COUNT} is {count}, expected {len(shards)} "
                                    f"(shard from another set?)", True))
        if tcount != total:
            problems.append(Problem(f"{h.path.name}: {KEY_SPLIT_TENSORS} is {tcount}, expected {total} "
                                    f"(shard from another set?)", True))
        if i > 0 and not h.tensors:
            problems.append(Problem(f"{h.path.name}: shard has 0 tensors", False))
    if split and all(h is not None for h in headers):
        if not isinstance(total, int):
            problems.append(Problem(f"{shards[0].name}: no {KEY_SPLIT_TENSORS}", True))
        elif n_tensors != total:
            problems.append(Problem(f"the set holds {n_tensors} tensors but {KEY_SPLIT_TENSORS} is {total} "
                                    f"(missing, extra or foreign shard?)", True))
    return shards, headers, problems


def open_gguf(path: str | os.PathLike) -> GGUFSet:
    """Open a GGUF file, or the whole shard set given any shard. Raises GGUFFormatError when unreadable."""
    shards, headers, problems = scan(path)
    fatal = [p for p in problems if p.fatal]
    if fatal:
        more = f" (+{len(fatal) - 1} more; run `glm5lib gguf validate`)" if len(fatal) > 1 else ""
        msg = str(fatal[0])
        name = Path(path).name
        if msg.startswith(name + ":"):  # problems name files by their base name; the error names the one given
            msg = f"{path}{msg[len(name):]}"
        raise GGUFFormatError(f"{msg}{more}")
    return GGUFSet(shards, headers, problems)  # type: ignore[arg-type]  # no header is None without a fatal
