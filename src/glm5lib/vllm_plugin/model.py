"""`GlmMoeDsaForCausalLM` as vLLM builds it, with the indexer's q kept in full precision where glm5lib indexes.

vLLM's `Indexer.forward` quantizes the indexer q to fp8 inline before calling `SparseAttnIndexer`: on CPU
`per_token_group_quant_fp8` has no path at all, and on sm_80 (CUDA without DeepGEMM) the fused q-RoPE-quant
Triton kernel cannot store e4m3. So this class, registered for the architecture with
`ModelRegistry.register_model`, gives each `Indexer` whose op is glm5lib's a forward that does the same
projections, norm and RoPE (the unfused branch of vLLM's body) and hands q over unquantized: scores in fp32, as
the reference computes them. Everything else is vLLM's model, weights loading included. Why no public hook
does this, and what pins the copied body to vLLM's: `patches.INDEXER_FORWARD`.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP
from vllm.model_executor.models.deepseek_v2 import GlmMoeDsaForCausalLM, Indexer

ARCHITECTURE = "GlmMoeDsaForCausalLM"
MODEL_PATH = "glm5lib.vllm_plugin.model:Glm5MoeDsaForCausalLM"
# vLLM's MTP drafter for glm_moe_dsa (SpeculativeConfig.hf_config_override); its indexer needs the same change
MTP_ARCHITECTURE = "DeepseekV32MTPModel"
MTP_MODEL_PATH = "glm5lib.vllm_plugin.model:Glm5DeepSeekMTP"


def indexer_forward_fp32(self: Indexer, hidden_states: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor,
                         rotary_emb: Any) -> torch.Tensor:
    """vLLM's unfused Indexer path without the fp8 q quantization (docs/glm5.md section 3)."""
    q, _ = self.wq_b(qr)
    q = q.view(-1, self.n_head, self.head_dim)
    q_pe, q_nope = torch.split(q, [self.rope_dim, self.head_dim - self.rope_dim], dim=-1)  # rope first
    kw, _ = self.wk_weights_proj(hidden_states)
    k = self.k_norm(kw[:, : self.head_dim])
    weights = kw[:, self.head_dim :].float()
    k_pe, k_nope = torch.split(k, [self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
    q_pe, k_pe = rotary_emb(positions, q_pe.contiguous(), k_pe.unsqueeze(1).contiguous())
    q = torch.cat([q_pe.reshape(-1, self.n_head, self.rope_dim), q_nope], dim=-1)
    k = torch.cat([k_pe.reshape(-1, self.rope_dim), k_nope], dim=-1)
    weights = weights * self.softmax_scale * self.n_head_scale
    return self.indexer_op(hidden_states, q, k, weights)


def use_fp32_indexer_q(model: torch.nn.Module) -> None:
    from glm5lib.vllm_plugin.indexer import Glm5SparseAttnIndexer

    for module in model.modules():
        op = getattr(module, "indexer_op", None)
        if isinstance(module, Indexer) and isinstance(op, Glm5SparseAttnIndexer) and not op.delegate:
            module.forward = types.MethodType(indexer_forward_fp32, module)


class Glm5MoeDsaForCausalLM(GlmMoeDsaForCausalLM):
    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        use_fp32_indexer_q(self)


class Glm5DeepSeekMTP(DeepSeekMTP):
    """vLLM's generic MTP drafter (what CPU runs for glm_moe_dsa) with the same indexer change."""

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        use_fp32_indexer_q(self)


def register_model() -> bool:
    """Register Glm5MoeDsaForCausalLM for the architecture and Glm5DeepSeekMTP for its MTP drafter. Returns True
    when it registered now."""
    from vllm import ModelRegistry

    entry = ModelRegistry.models.get(ARCHITECTURE)
    if entry is not None and f"{entry.module_name}:{entry.class_name}" == MODEL_PATH:
        return False
    ModelRegistry.register_model(ARCHITECTURE, MODEL_PATH)
    ModelRegistry.register_model(MTP_ARCHITECTURE, MTP_MODEL_PATH)
    return True
