"""`split` and `merge`: llama.cpp's `llama-gguf-split`, byte for byte, but streaming.

The reference (tools/gguf-split/gguf-split.cpp, llama.cpp as vendored in llama-cpp-python 0.3.36) reads each
whole tensor into RAM before writing it (6.4 GB for one GLM-5 BF16 expert tensor), overwrites split outputs
and leaves a partial file when a merge fails. Here tensor data moves in bounded chunks with
`os.copy_file_range` (in-kernel, no user-space buffer), every output is written to a temporary file next to
it and renamed only once complete, and existing outputs are kept unless `force=True`.

gguf-py's `GGUFWriter(split_max_tensors=...)` is not a substitute: its shards differ from llama.cpp's in key
order, n_dims, size accounting and file names, so headers are written here (`format.encode_header`).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from gguf.constants import GGUFValueType
from tqdm.auto import tqdm

from glm5lib.errors import UserError
from glm5lib.files import check_output, output_mode
from glm5lib.gguf.checks import Problem
from glm5lib.gguf.format import (
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS,
    KV,
    GGUFHeader,
    OutTensor,
    encode_header,
    pad,
    read_header,
    set_kv,
)
from glm5lib.gguf.shards import CHUNK, scan, shard_path
from glm5lib.progress import show_progress

DEFAULT_MAX_TENSORS = 128  # llama-gguf-split's default


class SplitError(UserError):
    """A refusal of split/merge. Exit code 1, as llama-gguf-split's EXIT_FAILURE."""

    exit_code = 1


def parse_size(text: str) -> int:
    """`--split-max-size`: N with M or G (decimal, as llama.cpp: 1M = 1,000,000 bytes); plain N is bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([MG]?)\s*", text)
    if not m:
        raise SplitError(f"bad size '{text}': use N, NM or NG (M and G are 10^6 and 10^9 bytes)")
    n = int(m[1]) * {"": 1, "M": 1000**2, "G": 1000**3}[m[2]]
    if n <= 0:
        raise SplitError("size must be a positive value")
    return n


# ---------------------------------------------------------------------------------------------------------
# Planning: which tensors go to which shard (split_strategy's constructor).


@dataclass(frozen=True)
class ShardPlan:
    path: Path
    kvs: list[KV]
    tensors: list[OutTensor]

    @cached_property
    def header(self) -> bytes:
        return encode_header(self.kvs, self.tensors)

    @property
    def size(self) -> int:
        return len(self.header) + sum(pad(t.nbytes) for t in self.tensors)


def _input_tensors(h: GGUFHeader) -> list[OutTensor]:
    return [OutTensor(t.name, t.ne, t.ggml_type, int(t.nbytes or 0), h.path, h.data_offset + t.offset)
            for t in h.tensors]


def plan_split(
    h: GGUFHeader,
    prefix: str | os.PathLike,
    *,
    max_tensors: int | None = None,
    max_size: int | None = None,
    no_tensor_first_split: bool = False,
) -> list[ShardPlan]:
    """The shards `llama-gguf-split --split` would write for input header `h`."""
    if max_tensors is not None and max_size is not None:
        raise SplitError("either --split-max-tensors or --split-max-size can be specified, but not both")
    if max_size is None:
        max_tensors = DEFAULT_MAX_TENSORS if max_tensors is None else max_tensors
        if max_tensors < 1:
            raise SplitError(f"--split-max-tensors must be at least 1, got {max_tensors}")
    tensors = _input_tensors(h)
    n = len(tensors)

    groups: list[list[OutTensor]] = [[]]
    if no_tensor_first_split:
        groups.append([])  # shard 1 holds metadata only, and may
    current = 0  # bytes of the current shard, tensors only (metadata is not counted)
    for i, t in enumerate(tensors):
        size = pad(t.nbytes)
        if max_size is not None:
            cut = current + size > max_size
        else:
            cut = 0 < i < n and i % max_tensors == 0
        if cut:
            if not groups[-1]:
                raise SplitError("one of splits have 0 tensors. Maybe size or tensors limit is too small")
            groups.append([])
            current = size
        else:
            current += size
        groups[-1].append(t)

    count = len(groups)
    plans = []
    for i, group in enumerate(groups):
        kvs = list(h.kvs) if i == 0 else []  # all metadata in the first shard only
        kvs = set_kv(kvs, KV(KEY_SPLIT_NO, GGUFValueType.UINT16, i))
        kvs = set_kv(kvs, KV(KEY_SPLIT_TENSORS, GGUFValueType.INT32, n))
        kvs = set_kv(kvs, KV(KEY_SPLIT_COUNT, GGUFValueType.UINT16, count))
        plans.append(ShardPlan(shard_path(prefix, i, count), kvs, group))
    return plans


def plan_merge(first_shard: str | os.PathLike, out: str | os.PathLike) -> ShardPlan:
    """The file `llama-gguf-split --merge` would write from the set that starts at `first_shard`."""
    first_shard = Path(first_shard)
    h = read_header(first_shard)
    # llama.cpp's own refusals first, with its wording
    count = h.get(KEY_SPLIT_COUNT)
    if count is None:
        raise SplitError(f"{first_shard.name}: input file does not contain {KEY_SPLIT_COUNT} metadata")
    if not isinstance(count, int) or count < 1:
        raise SplitError(f"{first_shard.name}: input file does not contain a valid split count {count}")
    postfix = f"-00001-of-{count:05d}.gguf"  # llama_split_prefix
    if not (first_shard.name.endswith(postfix) and len(first_shard.name) > len(postfix)):
        raise SplitError(f"unexpected input file name: {first_shard.name} (merge needs the first shard, "
                         f"PREFIX{postfix})")
    shards, headers, problems = scan(first_shard)
    _refuse(problems)
    kvs = set_kv(list(headers[0].kvs), KV(KEY_SPLIT_COUNT, GGUFValueType.UINT16, 0))  # type: ignore[union-attr]
    tensors = [t for hs in headers for t in _input_tensors(hs)]  # type: ignore[arg-type]
    return ShardPlan(Path(out), kvs, tensors)


def _refuse(problems: list[Problem]) -> None:
    """Split and merge need a clean input: any problem (fatal or llama.cpp-incompatible) stops them."""
    if problems:
        more = f" (+{len(problems) - 1} more; see `glm5lib gguf validate`)" if len(problems) > 1 else ""
        raise SplitError(f"{problems[0]}{more}")


# ---------------------------------------------------------------------------------------------------------
# Writing: temp file, header, tensor data in bounded chunks, zero padding, rename.


def copy_range(src_fd: int, dst_fd: int, offset: int, length: int, chunk: int = CHUNK, bar: tqdm | None = None) -> None:
    """Append `length` bytes of `src_fd` from `offset` to `dst_fd` (at its current position), `chunk` at a time."""
    use_cfr = hasattr(os, "copy_file_range")
    while length > 0:
        n = min(chunk, length)
        done = 0
        if use_cfr:
            try:
                done = os.copy_file_range(src_fd, dst_fd, n, offset)
            except OSError:  # EXDEV/EINVAL/ENOSYS on some file systems: fall back to read + write
                use_cfr = False
        if not use_cfr:
            buf = os.pread(src_fd, n, offset)
            done = len(buf)
            view = memoryview(buf)
            while view:
                view = view[os.write(dst_fd, view):]
        if done == 0:
            raise SplitError(f"unexpected end of input at byte {offset:,} (file truncated while copying?)")
        offset += done
        length -= done
        if bar is not None:
            bar.update(done)


def _write(plan: ShardPlan, tmp: Path, bar: tqdm | None) -> None:
    fds: dict[Path, int] = {}
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(out, plan.header)
        for t in plan.tensors:
            if t.src_path not in fds:
                fds[t.src_path] = os.open(t.src_path, os.O_RDONLY)
            copy_range(fds[t.src_path], out, t.src_offset, t.nbytes, bar=bar)
            zeros = pad(t.nbytes) - t.nbytes
            if zeros:
                os.write(out, b"\0" * zeros)
        os.fsync(out)  # complete on disk before the rename makes it visible
    finally:
        os.close(out)
        for fd in fds.values():
            os.close(fd)


def write_plans(plans: list[ShardPlan], *, force: bool = False, progress: bool = True) -> list[Path]:
    """Write every planned file, all or nothing: temporaries first, renamed once all are complete."""
    inputs = {t.src_path for p in plans for t in p.tensors}
    for p in plans:
        check_output(p.path, force=force, inputs=inputs)
    total = sum(t.nbytes for p in plans for t in p.tensors)
    mode = output_mode()  # mkstemp makes 0600 files; outputs get the usual permissions
    temps: list[Path] = []
    renamed: list[Path] = []
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="gguf",
               disable=not show_progress(progress))
    try:
        for p in plans:
            fd, name = tempfile.mkstemp(prefix=f".{p.path.name}.", suffix=".tmp", dir=p.path.parent)
            os.close(fd)
            temps.append(Path(name))
            os.chmod(name, mode)
            bar.set_description(p.path.name)
            _write(p, temps[-1], bar)
        if not force and any(p.path.exists() for p in plans):
            raise SplitError("an output file appeared while writing; not overwriting it")
        for p, tmp in zip(plans, temps):
            os.replace(tmp, p.path)
            renamed.append(p.path)
        temps, renamed = [], []
    except OSError as exc:
        raise SplitError(f"writing {p.path}: {exc.strerror or exc}") from None
    finally:
        bar.close()
        for path in temps + renamed:  # failure: leave nothing behind, not even part of a set
            path.unlink(missing_ok=True)
    return [p.path for p in plans]


def split(
    path: str | os.PathLike,
    prefix: str | os.PathLike,
    *,
    max_tensors: int | None = None,
    max_size: int | None = None,
    no_tensor_first_split: bool = False,
    force: bool = False,
    dry_run: bool = False,
    progress: bool = True,
) -> list[ShardPlan]:
    """Split one GGUF file into `PREFIX-%05d-of-%05d.gguf` shards exactly as llama-gguf-split does."""
    shards, headers, problems = scan(path)
    if len(shards) > 1:
        raise SplitError(f"{Path(path).name} is part of a {len(shards)}-shard set: merge it first")
    _refuse(problems)
    plans = plan_split(headers[0], prefix, max_tensors=max_tensors, max_size=max_size,  # type: ignore[arg-type]
                       no_tensor_first_split=no_tensor_first_split)
    if Path(path).resolve() in {p.path.resolve() for p in plans}:
        raise SplitError(f"an output would overwrite the input {path}")
    if not dry_run:
        write_plans(plans, force=force, progress=progress)
    return plans


def merge(first_shard: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, dry_run: bool = False,
          progress: bool = True) -> ShardPlan:
    """Merge the shard set starting at `first_shard` into one file exactly as llama-gguf-split --merge does."""
    out = check_output(out, force=force, inputs=[first_shard])  # checked first, as llama.cpp does
    plan = plan_merge(first_shard, out)
    if out.resolve() in {t.src_path.resolve() for t in plan.tensors} | {Path(first_shard).resolve()}:
        raise SplitError(f"the output {out} is one of the inputs")
    if not dry_run:
        write_plans([plan], force=force, progress=progress)
    return plan


def ensure_shards(
    path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    mode: str = "tensors",
    max_tensors: int | None = None,
    max_size: int | str | None = None,
    progress: bool = True,
) -> tuple[Path, Path | None]:
    """A shard set to work on: `path` itself if it is a shard, else `path` split into `out_dir`.

    Returns (first shard, the unsplit original or None). `out_dir` is scratch space: earlier outputs of the same
    split there are replaced. `mode` is "tensors" (`max_tensors`, default 128) or "size" (`max_size`, N[M|G]).
    """
    path = Path(path)
    shards, headers, problems = scan(path)
    if len(shards) > 1 or (headers[0] is not None and headers[0].get(KEY_SPLIT_COUNT) == 1):
        return shards[0], None
    if mode not in ("tensors", "size"):
        raise SplitError(f"split mode must be 'tensors' or 'size', got {mode!r}")
    if mode == "size" and max_size is None:
        raise SplitError("split mode 'size' needs a max size (N, NM or NG)")
    size = parse_size(max_size) if isinstance(max_size, str) else max_size
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plans = split(path, out_dir / path.stem, max_tensors=max_tensors if mode == "tensors" else None,
                  max_size=size if mode == "size" else None, force=True, progress=progress)
    return plans[0].path, path
