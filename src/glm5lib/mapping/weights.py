"""glm-dsa GGUF tensors <-> HF checkpoint tensors (names and layouts), streaming, one tensor at a time.

GGUF -> HF (`iter_hf_weights`) yields what vLLM's `GlmMoeDsaForCausalLM.load_weights` and transformers consume:
- `attn_k_b` [H, r, nope] + `attn_v_b` [H, v, r] -> `kv_b_proj` [H*(nope+v), r] (`glm5lib.model.layout.merge_kv_b`),
- `ffn_*_exps` [E, ...] -> `mlp.experts.{e}.*_proj.weight`, read one expert slice at a time (quantized bytes
  are sliced before dequantization, so a 12 GB expert stack never sits in memory),
- `exp_probs_b.bias` -> `mlp.gate.e_score_correction_bias`, indexer tensors, the MTP block.
HF -> GGUF (`iter_gguf_arrays`) is the inverse, used to write GGUF files. Names come from `glm5lib.model.spec`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Mapping

import torch
from gguf.constants import GGMLQuantizationType
from tqdm.auto import tqdm

from glm5lib.errors import GGUFFormatError
from glm5lib.model.layout import merge_kv_b, split_kv_b
from glm5lib.model.spec import GLM5Config, TensorSpec, gguf_tensor_specs
from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.source import open_model, read_tensor
from glm5lib.progress import show_progress


def _check_present(gs: Any, specs: list[TensorSpec]) -> None:
    names = {t.name for t in gs.tensors}
    missing = [s.gguf_name for s in specs if s.gguf_name not in names]
    if missing:
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise GGUFFormatError(f"tensor '{missing[0]}' is missing{more}; run `glm5lib map check` for a full report")
    for s in specs:
        shape = gs.tensor(s.gguf_name).shape
        # ggml drops trailing 1s from ne, so compare with those stripped from the torch shape's front
        want = tuple(s.shape)
        while len(want) > len(shape) and want[0] == 1:
            want = want[1:]
        if tuple(shape) != want:
            raise GGUFFormatError(f"tensor '{s.gguf_name}' has torch shape {tuple(shape)}, expected {s.shape}; "
                                  f"run `glm5lib map check`")


def iter_hf_weights(path: str | os.PathLike | Any, dtype: torch.dtype = torch.bfloat16, include_mtp: bool = True,
                    *, layers: Collection[int] | None = None, progress: bool = False,
                    keep_f32: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream `(hf_name, tensor)` pairs for a glm-dsa GGUF file or shard set (any shard, or an opened set).

    Names and layouts are the HF checkpoint's (per-expert weights, fused `kv_b_proj`), in GGUF file order.
    Each tensor is read and dequantized (gguf-py) only when the iterator reaches it and is returned as `dtype`;
    peak memory is one tensor (one expert slice for stacked experts; `attn_k_b` is held until `attn_v_b`).
    With `include_mtp=False` the MTP block (`model.layers.{num_hidden_layers}.*`) is skipped; with `layers` only
    those blocks' tensors are produced (no embedding/head/final norm). Tensors of the kinds in `keep_f32`
    (e.g. `HF_F32_KINDS`) that the file stores F32 come as float32 whatever `dtype` is.

    Raises GGUFFormatError before yielding anything if a tensor is missing or misshapen.
    """
    gs = open_model(path) if isinstance(path, (str, os.PathLike)) else path
    cfg = config_from_gguf(gs)
    specs = gguf_tensor_specs(cfg, include_mtp=include_mtp)
    if layers is not None:
        specs = [s for s in specs if s.block in set(layers)]
    _check_present(gs, specs)
    k_b: torch.Tensor | None = None
    gs.check_readable()
    for spec in tqdm(specs, desc="GGUF -> HF", disable=not show_progress(progress), leave=False):
        if spec.transform == "identity":
            f32 = spec.kind in keep_f32 and gs.tensor(spec.gguf_name).ggml_type == GGMLQuantizationType.F32
            yield spec.hf_names[0], read_tensor(gs, spec.gguf_name, torch.float32 if f32 else dtype).reshape(spec.shape)
        elif spec.transform == "experts":
            for e, name in enumerate(spec.hf_names):
                yield name, read_tensor(gs, spec.gguf_name, dtype, index=e).reshape(spec.shape[1:])
        elif spec.transform == "k_b":  # converter order puts k_b right before v_b of the same block
            k_b = read_tensor(gs, spec.gguf_name, dtype).reshape(spec.shape)
        else:
            v_b = read_tensor(gs, spec.gguf_name, dtype).reshape(spec.shape)
            assert k_b is not None, "attn_k_b must precede attn_v_b"
            yield spec.hf_names[0], merge_kv_b(k_b, v_b, cfg)
            k_b = None


class GGUFHFWeights:
    """Random access to HF-named tensors of a glm-dsa GGUF: `w(name)` / `w[name]` -> tensor (`dtype`), read on request.

    Same mapping as `iter_hf_weights` (one implementation of each transform: `read_tensor` slices an expert's
    bytes before dequantizing, `merge_kv_b` rebuilds kv_b_proj). For callers that fetch by name in their own
    order, such as a layer-by-layer reference forward."""

    def __init__(self, path: str | os.PathLike | Any, dtype: torch.dtype = torch.float32, include_mtp: bool = True):
        self.set = open_model(path) if isinstance(path, (str, os.PathLike)) else path
        self.config = config_from_gguf(self.set)
        self.dtype = dtype
        specs = gguf_tensor_specs(self.config, include_mtp=include_mtp)
        _check_present(self.set, specs)
        self._where: dict[str, tuple[TensorSpec, int | None]] = {}
        for spec in specs:
            if spec.transform == "v_b":
                continue  # kv_b_proj is assembled from its k_b entry
            for e, hf in enumerate(spec.hf_names):
                self._where[hf] = (spec, e if spec.transform == "experts" else None)

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __getitem__(self, name: str) -> torch.Tensor:
        return self(name)

    def __call__(self, name: str) -> torch.Tensor:
        try:
            spec, e = self._where[name]
        except KeyError:
            raise KeyError(f"no GGUF tensor maps to {name!r}") from None
        if spec.transform == "experts":
            return read_tensor(self.set, spec.gguf_name, self.dtype, index=e).reshape(spec.shape[1:])
        if spec.transform == "k_b":
            v_name = spec.gguf_name.replace("attn_k_b", "attn_v_b")
            k_b = read_tensor(self.set, spec.gguf_name, self.dtype).reshape(spec.shape)
            v_b = read_tensor(self.set, v_name, self.dtype).reshape(self.set.tensor(v_name).shape)
            return merge_kv_b(k_b, v_b, self.config)
        return read_tensor(self.set, spec.gguf_name, self.dtype).reshape(spec.shape)


def iter_gguf_arrays(cfg: GLM5Config, get: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor], *,
                     include_mtp: bool = True) -> Iterator[tuple[TensorSpec, torch.Tensor]]:
    """HF -> GGUF: `(spec, tensor)` in converter order, tensors in torch order of the GGUF tensor (`spec.shape`).

    `get(hf_name)` (or a mapping) supplies HF tensors on demand, so a caller reading safetensors lazily keeps
    memory at one GGUF tensor (E expert tensors for the stacked ones, as llama.cpp's converter does)."""
    fetch = get.__getitem__ if isinstance(get, Mapping) else get
    for spec in gguf_tensor_specs(cfg, include_mtp=include_mtp):
        if spec.transform == "identity":
            t = fetch(spec.hf_names[0])
        elif spec.transform == "experts":
            t = torch.stack([fetch(n) for n in spec.hf_names])
        else:
            k_b, v_b = split_kv_b(fetch(spec.hf_names[0]), cfg)
            t = k_b if spec.transform == "k_b" else v_b
        if tuple(t.shape) != spec.shape:
            raise ValueError(f"{spec.gguf_name}: got {tuple(t.shape)}, expected {spec.shape}")
        yield spec, t


# ---- the mapping table (for reports and notebook 02) ------------------------------------------------------------


@dataclass(frozen=True)
class MappingRow:
    gguf_name: str
    ggml_shape: tuple[int, ...]  # ne order, as gguf_dump prints it
    hf_name: str  # "{e}" stands for the expert index
    hf_shape: tuple[int, ...]
    transform: str  # a short formula
    kind: str  # the spec's transform: identity, k_b, v_b, experts

    def as_dict(self) -> dict[str, Any]:
        return {"gguf": self.gguf_name, "ggml_shape": list(self.ggml_shape), "hf": self.hf_name,
                "hf_shape": list(self.hf_shape), "transform": self.transform, "kind": self.kind}


def _formula(spec: TensorSpec, cfg: GLM5Config) -> str:
    H, nope, v, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if spec.transform == "k_b":
        return f"kv_b.view({H}, {nope + v}, {r})[:, :{nope}, :].transpose(1, 2)"
    if spec.transform == "v_b":
        return f"kv_b.view({H}, {nope + v}, {r})[:, {nope}:, :]"
    if spec.transform == "experts":
        return f"stack(experts 0..{cfg.n_routed_experts - 1}, dim=0)"
    return "identity (F32)" if spec.storage == "f32" else "identity"


def mapping_table(cfg: GLM5Config, *, include_mtp: bool = True, blocks: set[int] | None = None) -> list[MappingRow]:
    """One row per GGUF tensor (optionally only `blocks`, plus globals): GGUF name/shape, HF name/shape, transform."""
    rows = []
    for s in gguf_tensor_specs(cfg, include_mtp=include_mtp):
        if blocks is not None and s.block is not None and s.block not in blocks:
            continue
        if s.transform == "experts":
            hf = s.hf_names[0].replace(".experts.0.", ".experts.{e}.")
            hf_shape = s.shape[1:]
        elif s.transform in ("k_b", "v_b"):
            hf, hf_shape = s.hf_names[0], (cfg.num_attention_heads * cfg.kv_b_head_dim, cfg.kv_lora_rank)
        else:
            hf, hf_shape = s.hf_names[0], s.shape
        rows.append(MappingRow(s.gguf_name, s.ggml_shape, hf, tuple(hf_shape), _formula(s, cfg), s.transform))
    return rows
