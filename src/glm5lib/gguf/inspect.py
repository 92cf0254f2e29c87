"""What is in a GGUF file or shard set: metadata, tensors per block and type, shard layout, tensor digests.

Everything here reads headers only, except `tensor_digests`/`diff_tensors`, which stream tensor bytes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from tqdm.auto import tqdm

from glm5lib.gguf.format import KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS
from glm5lib.gguf.shards import GGUFSet
from glm5lib.progress import show_progress

_BLOCK = re.compile(r"^blk\.(\d+)\.")
MAX_LIST = 8  # longer metadata arrays are summarised, not printed (a GLM-5 vocabulary has 154,880 entries)


def block_of(name: str) -> str:
    """'blk.12.attn_q_a.weight' -> '12'; token_embd, output_norm, output -> 'global'."""
    m = _BLOCK.match(name)
    return m[1] if m else "global"


def _short(value: Any) -> Any:
    if isinstance(value, list) and len(value) > MAX_LIST:
        kind = type(value[0]).__name__ if value else "?"
        return f"[{len(value):,} x {kind}]"
    return value


def summarize(gset: GGUFSet) -> dict[str, Any]:
    """A JSON-able summary: architecture, metadata (long arrays shortened), shards, per-block and per-type totals."""
    per_type: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    per_block: dict[str, dict[str, Any]] = {}
    for t in gset.tensors:
        per_type[t.type_name]["count"] += 1
        per_type[t.type_name]["bytes"] += t.nbytes
        b = per_block.setdefault(block_of(t.name), {"count": 0, "bytes": 0, "types": defaultdict(int)})
        b["count"] += 1
        b["bytes"] += t.nbytes
        b["types"][t.type_name] += t.nbytes
    order = sorted(per_block, key=lambda k: (k == "global", int(k) if k.isdigit() else 0))
    shards = []
    for i, h in enumerate(gset.headers):
        shards.append({
            "path": str(h.path),
            "split_no": h.get(KEY_SPLIT_NO),
            "tensors": len(h.tensors),
            "tensor_bytes": sum(int(t.nbytes or 0) for t in h.tensors),
            "file_bytes": h.file_size,
            "header_bytes": h.data_offset,
        })
    return {
        "path": str(gset.shards[0]),
        "arch": gset.arch,
        "split_count": gset.kv.get(KEY_SPLIT_COUNT),
        "split_tensors_count": gset.kv.get(KEY_SPLIT_TENSORS),
        "tensor_count": len(gset.tensors),
        "tensor_bytes": gset.nbytes,
        "file_bytes": sum(h.file_size for h in gset.headers),
        "metadata": {k: _short(v) for k, v in gset.kv.items()},
        "types": {k: dict(v) for k, v in sorted(per_type.items())},
        "blocks": {k: {**per_block[k], "types": dict(sorted(per_block[k]["types"].items()))} for k in order},
        "shards": shards,
        "problems": [str(p) for p in gset.problems],
    }


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def format_summary(s: dict[str, Any], *, all_metadata: bool = False) -> str:
    """The summary as readable text: key metadata, shards, blocks, types."""
    lines = [
        f"file      {s['path']}",
        f"arch      {s['arch']}",
        f"tensors   {s['tensor_count']:,}   data {_size(s['tensor_bytes'])}   files {_size(s['file_bytes'])}",
        f"shards    {len(s['shards'])}",
        "",
        "metadata",
    ]
    arch = s["arch"] or ""
    for k, v in s["metadata"].items():
        if all_metadata or k.startswith(("general.", "split.", f"{arch}.")) or k == "tokenizer.ggml.model":
            lines.append(f"  {k:<48} {f'{v:.7g}' if isinstance(v, float) else v}")  # f32 values print short
    if len(s["shards"]) > 1 or s["split_count"]:
        lines += ["", f"  {'shard':<40} {'split.no':>8} {'tensors':>8} {'data':>12} {'file':>12}"]
        for sh in s["shards"]:
            name = sh["path"].rsplit("/", 1)[-1]
            lines.append(f"  {name:<40} {sh['split_no']!s:>8} {sh['tensors']:>8,} {_size(sh['tensor_bytes']):>12} "
                         f"{_size(sh['file_bytes']):>12}")
    lines += ["", f"  {'block':<8} {'tensors':>8} {'bytes':>12}  types (bytes)"]
    for name, b in s["blocks"].items():
        types = ", ".join(f"{t} {_size(n)}" for t, n in b["types"].items())
        lines.append(f"  {name:<8} {b['count']:>8,} {_size(b['bytes']):>12}  {types}")
    lines += ["", f"  {'type':<8} {'tensors':>8} {'bytes':>12}"]
    for t, v in s["types"].items():
        lines.append(f"  {t:<8} {v['count']:>8,} {_size(v['bytes']):>12}")
    if s["problems"]:
        lines += ["", "problems"] + [f"  {p}" for p in s["problems"]]
    return "\n".join(lines)


def tensor_digests(gset: GGUFSet, algorithm: str = "sha256", progress: bool = True) -> dict[str, str]:
    """name -> digest of the tensor's bytes, streamed in bounded chunks (no tensor is held whole)."""
    out = {}
    with tqdm(total=gset.nbytes, unit="B", unit_scale=True, unit_divisor=1024, desc="hash",
              disable=not show_progress(progress)) as bar:
        for t in gset.tensors:
            out[t.name] = gset.hash_tensor(t.name, algorithm)
            bar.update(t.nbytes)
    return out


def diff_tensors(a: GGUFSet, b: GGUFSet, progress: bool = True, *,
                 digests_b: dict[str, str] | None = None) -> list[str]:
    """Differences between two files' tensors (names, order, types, shapes, bytes). Empty: lossless.

    `digests_b`: `tensor_digests(b)` computed earlier, so comparing several files with one `b` hashes `b` once
    (a merged GLM-5 is ~400 GB of reads per hash)."""
    out = []
    names_a, names_b = [t.name for t in a.tensors], [t.name for t in b.tensors]
    if set(names_a) != set(names_b):
        out += [f"only in {a.shards[0].name}: {n}" for n in names_a if n not in set(names_b)]
        out += [f"only in {b.shards[0].name}: {n}" for n in names_b if n not in set(names_a)]
    elif names_a != names_b:
        out.append("same tensors in a different order")
    common = [n for n in names_a if n in set(names_b)]
    for n in common:
        ta, tb = a.tensor(n), b.tensor(n)
        if ta.ggml_type != tb.ggml_type or ta.shape != tb.shape:
            # n_dims may differ by trailing 1s (llama.cpp trims them); compare the padded ggml shape
            pa, pb = (tuple(ta.ne) + (1,) * 4)[:4], (tuple(tb.ne) + (1,) * 4)[:4]
            if ta.ggml_type != tb.ggml_type or pa != pb:
                out.append(f"{n}: {ta.type_name}{list(ta.ne)} vs {tb.type_name}{list(tb.ne)}")
    da = tensor_digests(a, progress=progress)
    db = tensor_digests(b, progress=progress) if digests_b is None else digests_b
    out += [f"{n}: bytes differ" for n in common if da[n] != db[n]]
    return out
