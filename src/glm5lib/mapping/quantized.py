"""glm-dsa GGUF -> vLLM with the GGUF blocks kept quantized: which modules stay quantized, and the weight stream.

The stream follows vllm-gguf-plugin's convention (its `GGUFLinearMethod` / `GGUFMoEMethod` parameters):
- a tensor kept quantized is two entries, `<module>.qweight_type` (0-d tensor, the ggml type id) and
  `<module>.qweight` (uint8 rows exactly as stored: [rows, bytes per row]);
- anything else is `<module>.weight` in the serving dtype (F32/F16/BF16 converted exactly, quantized types
  dequantized by gguf-py).
Names are the HF checkpoint's (from `glm5lib.model.spec`), which vLLM's `load_weights` fuses and shards.

Quantized bytes are views on the file's memory map (one expert of a stacked `ffn_*_exps` is a view of that
expert's rows): nothing is read until vLLM copies the part its rank keeps (tensor parallel narrows the view
first), so a 400 GB file is never held whole.

Residency policies (which quantized tensors stay quantized):
- `quantized` (default): every quantized tensor except `kv_b_proj` (rebuilt from attn_k_b/attn_v_b; vLLM
  dequantizes it at load anyway), the indexer's `wk` and `weights_proj` (vLLM fuses them in one unquantized
  layer; the converter writes `weights_proj` F32, llama-quantize quantizes it like any 2-D weight) and the MTP
  `eh_proj` (a plain `nn.Linear` in vLLM).
- `dense-attn`: routed experts quantized, every other weight dequantized to the serving dtype (tensor-core
  matmuls for attention and the dense/shared MLPs; GLM-5's non-expert weights are ~3 % of its parameters).
- `dequantized`: everything dequantized to the serving dtype at load (a correctness reference; ~3.5x the
  memory of a Q4 file in bf16).
Modules vLLM fuses into one layer (q_a + kv_a_mqa, gate + up) are quantized only when all their parts are;
otherwise every part is dequantized (one layer has one weight format).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from gguf.constants import GGMLQuantizationType

from glm5lib.errors import GGUFFormatError, UserError
from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.source import open_model, read_tensor
from glm5lib.model.layout import merge_kv_b
from glm5lib.model.spec import GLM5Config, TensorSpec, gguf_tensor_specs

POLICIES = ("quantized", "dense-attn", "dequantized")
DEFAULT_POLICY = "quantized"
POLICY_ENV = "GLM5LIB_GGUF_RESIDENCY"

PLAIN_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
# The block types vllm-gguf-plugin computes with (its DEQUANT_TYPES) and gguf-py can dequantize (the CPU path).
SERVABLE_TYPES = frozenset(
    GGMLQuantizationType[n] for n in (
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
        "IQ1_M", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL")
)

# vLLM module suffixes that one layer computes together (deepseek_v2.py: fused_qkv_a_proj, gate_up_proj).
FUSED_GROUPS = (("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"), ("gate_proj", "up_proj"))
# Always dequantized (see the module docstring).
ALWAYS_DENSE = ("self_attn.kv_b_proj", "self_attn.indexer.wk", "self_attn.indexer.weights_proj", "eh_proj")
MTP_EMBED = "embed_tokens"
MTP_HEAD = "shared_head.head"


def resolve_policy(policy: str | None = None) -> str:
    """`policy`, else $GLM5LIB_GGUF_RESIDENCY, else `quantized`. UserError on an unknown name."""
    p = (policy or os.environ.get(POLICY_ENV, "") or DEFAULT_POLICY).strip()
    if p not in POLICIES:
        raise UserError(f"unknown GGUF residency policy {p!r}; choose from {', '.join(POLICIES)}")
    return p


def _module(hf_name: str) -> str:
    return hf_name.rsplit(".", 1)[0]


@dataclass
class ResidencyPlan:
    """For one model part (`main` trunk or the `mtp` layer): the vLLM modules whose weights stay quantized."""

    policy: str
    part: str
    quantized: set[str]  # HF module names (no `.weight`), e.g. model.layers.1.mlp.experts.3.down_proj
    dense: set[str]  # modules streamed as `.weight` (plain in the file, or dequantized)
    specs: list[TensorSpec]
    config: GLM5Config


def _part_specs(gs: Any, cfg: GLM5Config, part: str) -> list[TensorSpec]:
    if part == "main":
        return gguf_tensor_specs(cfg, include_mtp=False)
    if part != "mtp":
        raise ValueError(part)
    if cfg.num_nextn_predict_layers < 1:
        raise UserError(f"{gs.shards[0]}: the GGUF has no MTP layer (nextn_predict_layers 0); "
                        f"speculative decoding with method mtp needs one")
    mtp = set(range(cfg.num_hidden_layers, cfg.num_layers_total))
    return [s for s in gguf_tensor_specs(cfg, include_mtp=True) if s.block in mtp]


def check_types(gs: Any, specs: list[TensorSpec]) -> None:
    """GGUFFormatError naming the first tensor that is missing or of a type neither vLLM's GGUF kernels nor
    gguf-py's dequantizers take."""
    names = {t.name for t in gs.tensors}
    for s in specs:
        if s.gguf_name not in names:
            raise GGUFFormatError(f"{gs.shards[0]}: tensor '{s.gguf_name}' is missing; run `glm5lib map check`")
        t = gs.tensor(s.gguf_name).ggml_type
        if t not in PLAIN_TYPES and t not in SERVABLE_TYPES:
            raise GGUFFormatError(f"{gs.tensor(s.gguf_name).path}: tensor '{s.gguf_name}' has type {t.name}, "
                                  f"which glm5lib cannot serve (supported: F32, F16, BF16, "
                                  f"{', '.join(sorted(x.name for x in SERVABLE_TYPES))})")


def residency_plan(path: str | os.PathLike | Any, policy: str | None = None, part: str = "main") -> ResidencyPlan:
    """Which modules of `part` stay quantized under `policy` (checks every tensor's presence and type first)."""
    gs = open_model(path) if isinstance(path, (str, os.PathLike)) else path
    cfg = config_from_gguf(gs)
    policy = resolve_policy(policy)
    specs = _part_specs(gs, cfg, part)
    check_types(gs, specs)
    quantized: set[str] = set()
    dense: set[str] = set()
    for s in specs:
        if s.transform in ("k_b", "v_b"):
            dense.add(_module(s.hf_names[0]))
            continue
        qtype = gs.tensor(s.gguf_name).ggml_type
        keep = qtype not in PLAIN_TYPES and not any(_module(s.hf_names[0]).endswith(d) for d in ALWAYS_DENSE)
        if policy == "dequantized" or (policy == "dense-attn" and s.transform != "experts"):
            keep = False
        for hf in s.hf_names:
            if hf.endswith(".weight"):
                (quantized if keep else dense).add(_module(hf))
    if part == "mtp":  # llama.cpp drops the MTP copies of embed/head: they are token_embd / output (shared)
        block = cfg.num_hidden_layers
        for src, dst in (("token_embd.weight", MTP_EMBED), ("output.weight", MTP_HEAD)):
            qtype = gs.tensor(src).ggml_type
            # vLLM builds the MTP embed_tokens without a quant config: always dequantized
            keep = dst == MTP_HEAD and qtype not in PLAIN_TYPES and policy == "quantized"
            (quantized if keep else dense).add(f"model.layers.{block}.{dst}")
    for group in FUSED_GROUPS:
        for mod in list(quantized):
            for suffix in group:
                if mod.endswith("." + suffix):
                    base = mod[: -len(suffix)]
                    members = {base + m for m in group}
                    if not members <= quantized:
                        quantized -= members
                        dense |= members
    for s in specs:  # vLLM fuses gate and up experts into one w13 tensor of one type
        if s.kind == "ffn_gate_exps.weight":
            up = s.gguf_name.replace("ffn_gate_exps", "ffn_up_exps")
            a, b = gs.tensor(s.gguf_name).ggml_type, gs.tensor(up).ggml_type
            if a != b and _module(s.hf_names[0]) in quantized:
                raise GGUFFormatError(f"{gs.tensor(up).path}: '{s.gguf_name}' is {a.name} but '{up}' is {b.name}; "
                                      f"vLLM computes them as one quantized tensor, which needs one type")
    return ResidencyPlan(policy, part, quantized, dense, specs, cfg)


def _raw_rows(gs: Any, name: str, index: int | None = None) -> "torch.Tensor":
    """uint8 [rows, bytes per row] view of a quantized tensor's (or one expert's) bytes on the memory map."""
    import torch

    raw = gs.raw(name)
    if index is not None:
        raw = raw[index]
    raw = raw.reshape(-1, raw.shape[-1])
    with warnings.catch_warnings():  # read-only map: vLLM copies what it keeps and never writes the view
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(raw)


def _qtype_tensor(qtype: GGMLQuantizationType) -> "torch.Tensor":
    import torch

    return torch.tensor(int(qtype), dtype=torch.uint8)


def iter_vllm_weights(plan: ResidencyPlan, path: str | os.PathLike | Any, dtype: "torch.dtype") -> Iterator[
        tuple[str, "torch.Tensor"]]:
    """`(name, tensor)` for vLLM's `load_weights`, per `plan` (see the module docstring for the convention)."""
    gs = open_model(path) if isinstance(path, (str, os.PathLike)) else path
    cfg = plan.config
    k_b = None
    for s in plan.specs:
        qtype = gs.tensor(s.gguf_name).ggml_type
        if s.transform == "k_b":
            k_b = read_tensor(gs, s.gguf_name, dtype).reshape(s.shape)
        elif s.transform == "v_b":
            v_b = read_tensor(gs, s.gguf_name, dtype).reshape(s.shape)
            yield s.hf_names[0], merge_kv_b(k_b, v_b, cfg)
            k_b = None
        elif s.transform == "experts":
            for e, hf in enumerate(s.hf_names):
                if _module(hf) in plan.quantized:
                    yield _module(hf) + ".qweight_type", _qtype_tensor(qtype)
                    yield _module(hf) + ".qweight", _raw_rows(gs, s.gguf_name, e)
                else:
                    yield hf, read_tensor(gs, s.gguf_name, dtype, index=e).reshape(s.shape[1:])
        else:
            yield from _one(gs, plan, s.gguf_name, s.hf_names[0], s.shape, dtype)
    if plan.part == "mtp":
        block = cfg.num_hidden_layers
        yield from _one(gs, plan, "token_embd.weight", f"model.layers.{block}.{MTP_EMBED}.weight",
                        (cfg.vocab_size, cfg.hidden_size), dtype)
        yield from _one(gs, plan, "output.weight", f"model.layers.{block}.{MTP_HEAD}.weight",
                        (cfg.vocab_size, cfg.hidden_size), dtype)


def _one(gs: Any, plan: ResidencyPlan, gguf_name: str, hf: str, shape: tuple[int, ...], dtype: Any):
    if _module(hf) in plan.quantized:
        yield _module(hf) + ".qweight_type", _qtype_tensor(gs.tensor(gguf_name).ggml_type)
        yield _module(hf) + ".qweight", _raw_rows(gs, gguf_name)
    else:
        yield hf, read_tensor(gs, gguf_name, dtype).reshape(shape)


def planned_bytes(plan: ResidencyPlan, path: str | os.PathLike | Any, dense_bytes_per_element: int) -> dict[str, int]:
    """What `plan` should leave resident: GGUF bytes of the tensors kept quantized, and the dequantized/plain ones
    at `dense_bytes_per_element` (the serving dtype). kv_b counts once: the absorbed W_UK_T and W_UV vLLM's MLA
    builds from `kv_b_proj` at load are views of its weight."""
    gs = open_model(path) if isinstance(path, (str, os.PathLike)) else path
    q = d = 0
    for s in plan.specs:
        info = gs.tensor(s.gguf_name)
        if s.transform == "v_b":
            continue
        if s.transform == "k_b":
            cfg = plan.config
            d += cfg.num_attention_heads * cfg.kv_b_head_dim * cfg.kv_lora_rank * dense_bytes_per_element
        elif _module(s.hf_names[0]) in plan.quantized:
            q += info.nbytes
        else:
            d += info.n_elements * dense_bytes_per_element
    if plan.part == "mtp":
        for src, dst in (("token_embd.weight", MTP_EMBED), ("output.weight", MTP_HEAD)):
            info = gs.tensor(src)
            if f"model.layers.{plan.config.num_hidden_layers}.{dst}" in plan.quantized:
                q += info.nbytes
            else:
                d += info.n_elements * dense_bytes_per_element
    return {"quantized_bytes": q, "dense_bytes": d, "total": q + d}


def dequantized_bytes(plan: ResidencyPlan, path: str | os.PathLike | Any, dense_bytes_per_element: int) -> int:
    """What vLLM would hold with every tensor of `plan`'s part dequantized (the comparison for `planned_bytes`)."""
    dense = dataclasses.replace(plan, quantized=set(), dense=plan.dense | plan.quantized)
    return planned_bytes(dense, path, dense_bytes_per_element)["total"]


def dequantize_rows(rows: np.ndarray, qtype: int) -> np.ndarray:
    """float32 [rows, values] from uint8 [rows, bytes] blocks (gguf-py)."""
    from gguf.quants import dequantize

    return dequantize(rows, GGMLQuantizationType(qtype))
