"""Files that test `map check`: broken copies of a good GGUF, and header-only GLM-5-sized shard sets.

- `write_defect(src, out, defect)`: a copy of a (merged) GGUF with one planted defect (missing tensor, wrong
  shape, swapped k_b/v_b, legacy attn_kv_b, inconsistent metadata, quantized norm). Data bytes are copied, so
  the broken file is as readable as the source; only what the defect changes differs.
- `write_header_only_set(cfg, prefix, ...)`: the tensor infos of a real-size model (1,809 tensors for GLM-5,
  ~425 GB at plain Q4_K, ~455 GB with llama-quantize's Q4_K_M mix: `types="Q4_K_M"`) split into shards whose
  data sections are sparse holes: it proves `check` reads headers only and scales to a real release, not that
  real tensor bytes are right.

Headers are encoded by `glm5lib.gguf.format` (llama.cpp's byte layout).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from gguf.constants import GGMLQuantizationType, GGUFValueType, LlamaFileType

from glm5lib.gguf.format import KV, OutTensor, encode_header, layout, pad, set_kv, tensor_nbytes
from glm5lib.model.quant import RECIPE_TYPES, fallback_type, quant_recipe
from glm5lib.model.spec import GGUF_ARCH, GLM5Config, gguf_metadata, gguf_tensor_specs

# ---- writing -----------------------------------------------------------------------------------------------------


def kv_from_python(key: str, value: Any) -> KV:
    """A KV with the type llama.cpp's converter uses for this kind of value (u32 ints, f32 floats)."""
    if isinstance(value, bool):
        return KV(key, GGUFValueType.BOOL, value)
    if isinstance(value, int):
        return KV(key, GGUFValueType.UINT32, value)
    if isinstance(value, float):
        return KV(key, GGUFValueType.FLOAT32, value)
    if isinstance(value, str):
        return KV(key, GGUFValueType.STRING, value)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, bool) for v in value):
            return KV(key, GGUFValueType.ARRAY, list(value), GGUFValueType.BOOL)
        if all(isinstance(v, str) for v in value):
            return KV(key, GGUFValueType.ARRAY, list(value), GGUFValueType.STRING)
        return KV(key, GGUFValueType.ARRAY, list(value), GGUFValueType.INT32)
    raise TypeError(f"{key}: cannot store {type(value).__name__}")


def _write(out: Path, kvs: list[KV], tensors: list[OutTensor], *, sparse: bool = False) -> Path:
    """Header, then each tensor's bytes (copied from src, or a hole when sparse) padded to 32; temp + rename."""
    tmp = out.with_name(out.name + ".tmp")
    header = encode_header(kvs, tensors)
    with open(tmp, "wb") as f:
        f.write(header)
        if sparse:
            offsets = layout(tensors)
            end = offsets[-1] + pad(tensors[-1].nbytes) if tensors else 0
            f.truncate(len(header) + end)  # a hole: no disk blocks, reads as zeros
        else:
            for t in tensors:
                with open(t.src_path, "rb") as src:
                    src.seek(t.src_offset)
                    shutil.copyfileobj(_limited(src, t.nbytes), f)
                f.write(b"\0" * (pad(t.nbytes) - t.nbytes))
    os.replace(tmp, out)
    return out


class _limited:
    def __init__(self, f, n: int):
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.n if size < 0 else min(size, self.n)
        data = self.f.read(size)
        self.n -= len(data)
        return data


# ---- broken copies of a good file --------------------------------------------------------------------------------

# Each defect edits (kvs, tensors) of the source. tensors: list of OutTensor (order kept).
Edit = Callable[[list[KV], list[OutTensor]], tuple[list[KV], list[OutTensor]]]


def _rename(t: OutTensor, name: str) -> OutTensor:
    return OutTensor(name, t.ne, t.ggml_type, t.nbytes, t.src_path, t.src_offset)


def _drop(name: str) -> Edit:
    return lambda kvs, ts: (kvs, [t for t in ts if t.name != name])


def _transpose(name: str) -> Edit:
    """Swap the first two ggml dims (same bytes): a converter that forgot a transpose."""
    def edit(kvs, ts):
        return kvs, [OutTensor(t.name, (t.ne[1], t.ne[0], *t.ne[2:]), t.ggml_type, t.nbytes, t.src_path, t.src_offset)
                     if t.name == name else t for t in ts]
    return edit


def _swap(a: str, b: str) -> Edit:
    def edit(kvs, ts):
        return kvs, [_rename(t, b) if t.name == a else _rename(t, a) if t.name == b else t for t in ts]
    return edit


def _set(key: str, value: Any) -> Edit:
    return lambda kvs, ts: (set_kv(kvs, kv_from_python(key, value)), ts)


def _legacy_kv_b(block: int) -> Edit:
    """attn_k_b renamed to attn_kv_b and attn_v_b dropped: what a legacy DeepSeek-style file looks like by name."""
    def edit(kvs, ts):
        out = []
        for t in ts:
            if t.name == f"blk.{block}.attn_v_b.weight":
                continue
            out.append(_rename(t, f"blk.{block}.attn_kv_b.weight") if t.name == f"blk.{block}.attn_k_b.weight" else t)
        return kvs, out
    return edit


def _retype(name: str, new_type: GGMLQuantizationType) -> Edit:
    """Declare another type for a tensor (bytes from a same-sized neighbour are not needed: check reads headers)."""
    def edit(kvs, ts):
        return kvs, [OutTensor(t.name, t.ne, int(new_type), tensor_nbytes(t.ne, int(new_type)), t.src_path,
                               t.src_offset) if t.name == name else t for t in ts]
    return edit


def defects(cfg: GLM5Config) -> dict[str, tuple[Edit, str]]:
    """Named defects for a file of config `cfg`: (edit, the finding category `check` must report)."""
    a, last = GGUF_ARCH, cfg.num_hidden_layers - 1
    moe = cfg.first_k_dense_replace
    return {
        "missing_tensor": (_drop(f"blk.{last}.attn_output.weight"), "missing"),
        "missing_indexer": (_drop("blk.0.indexer.attn_k.weight"), "missing"),
        "wrong_shape": (_transpose(f"blk.{moe}.attn_q_b.weight"), "misshapen"),
        "swapped_k_b_v_b": (_swap(f"blk.{moe}.attn_k_b.weight", f"blk.{moe}.attn_v_b.weight"), "misshapen"),
        "legacy_kv_b": (_legacy_kv_b(0), "unexpected"),
        "key_length": (_set(f"{a}.attention.key_length", cfg.kv_lora_rank), "metadata"),
        "head_count": (_set(f"{a}.attention.head_count", cfg.num_attention_heads * 2), "metadata"),
        "expert_count": (_set(f"{a}.expert_count", cfg.n_routed_experts * 2), "metadata"),
        "quantized_norm": (_retype("output_norm.weight", GGMLQuantizationType.F16), "type"),
    }


def write_defect(src: str | os.PathLike, out: str | os.PathLike, defect: str) -> Path:
    """Copy the merged GGUF `src` to `out` with `defect` (a key of `defects(cfg)`) planted."""
    from glm5lib.mapping.config import config_from_kv
    from glm5lib.mapping.source import open_model

    gs = open_model(src)
    if len(gs.shards) != 1:
        raise ValueError("write_defect takes a merged (single-file) GGUF")
    h = gs.headers[0]
    kvs = list(h.kvs)
    tensors = [OutTensor(t.name, t.ne, int(t.ggml_type), t.nbytes, t.path, t.offset) for t in gs.tensors]
    edit, _ = defects(config_from_kv(gs.kv))[defect]
    kvs, tensors = edit(kvs, tensors)
    return _write(Path(out), kvs, tensors)


# ---- header-only real-size shard sets ------------------------------------------------------------------------------


def header_only_types(cfg: GLM5Config, *, main_type: str = "Q4_K",
                      types: str | Mapping[str, str] | None = None) -> dict[str, str]:
    """{gguf name: ggml type name}: `types` itself when it is such a map; llama-quantize's mix for file type
    `types` (e.g. "Q4_K_M"; see glm5lib.model.quant); or else `main_type` everywhere the converter does not write
    F32, with llama.cpp's fallback for rows the type's blocks do not divide."""
    if isinstance(types, Mapping):
        return dict(types)
    if types is not None:
        if types not in RECIPE_TYPES:
            raise ValueError(f"no llama-quantize recipe for {types!r}; choose from {', '.join(RECIPE_TYPES)}")
        return quant_recipe(cfg, types)
    return {s.gguf_name: "F32" if s.storage == "f32" else fallback_type(main_type, s.ggml_shape[0])
            for s in gguf_tensor_specs(cfg)}


def write_header_only_set(cfg: GLM5Config, prefix: str | os.PathLike, *, main_type: str = "Q4_K",
                          types: str | Mapping[str, str] | None = None, max_shard_bytes: int = 50 * 10**9,
                          tokens: list[str] | None = None) -> list[Path]:
    """Shards `PREFIX-0000i-of-0000N.gguf` holding every tensor info of `cfg`, split by size like
    `gguf-split --split-max-size`, with sparse data. Tensor types: `header_only_types(cfg, main_type=, types=)`:
    `types="Q4_K_M"` (a llama-quantize file type: its mix, with `general.file_type` set to match), a GGUF type
    name per tensor (e.g. `glm5lib.model.sizes.quant_recipe(cfg, ...)`), or `main_type` everywhere.

    `tokens` defaults to `vocab_size` placeholder strings, so shard 0's header is as long to parse as a real one's
    (merges are left out)."""
    chosen = header_only_types(cfg, main_type=main_type, types=types)
    md = dict(gguf_metadata(cfg))
    base: list[KV] = [kv_from_python("general.architecture", GGUF_ARCH), kv_from_python("general.name", "synthetic")]
    if isinstance(types, str):
        base.append(kv_from_python("general.file_type", int(LlamaFileType[f"MOSTLY_{types}"])))
    base += [kv_from_python(k, v) for k, v in md.items()]
    base += [kv_from_python("tokenizer.ggml.model", "gpt2"),
             kv_from_python("tokenizer.ggml.tokens", tokens or [f"<t{i}>" for i in range(cfg.vocab_size)])]
    tensors = []
    for s in gguf_tensor_specs(cfg):
        t = int(GGMLQuantizationType[chosen[s.gguf_name]])
        tensors.append(OutTensor(s.gguf_name, s.ggml_shape, t, tensor_nbytes(s.ggml_shape, t), Path(), 0))
    # split by size, as gguf-split: cut before a tensor when the shard would pass the limit
    shards: list[list[OutTensor]] = [[]]
    size = 0
    for t in tensors:
        n = pad(t.nbytes)
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    count = len(shards)
    paths = []
    for i, ts in enumerate(shards):
        split_kvs = [KV("split.no", GGUFValueType.UINT16, i), KV("split.tensors.count", GGUFValueType.INT32,
                                                                 len(tensors)),
                     KV("split.count", GGUFValueType.UINT16, count)]
        kvs = (base if i == 0 else []) + split_kvs
        out = Path(f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf")
        out.parent.mkdir(parents=True, exist_ok=True)
        paths.append(_write(out, kvs, ts, sparse=True))
    return paths
