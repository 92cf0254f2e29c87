"""The DSA lightning indexer for platforms vLLM leaves without one (CPU; CUDA without DeepGEMM).

vLLM's `SparseAttnIndexer` (a CustomOp) writes each token's indexer key into the fp8 indexer cache and
leaves top-k request-local positions in the shared buffer the sparse-MLA impl reads. On CPU its kernels only
handle `index_topk == 512` and raise for DeepSeek-V3.2-style models (which insert keys inside the op); on
CUDA its constructor refuses to run without DeepGEMM (SM80/SM89). `Glm5SparseAttnIndexer` replaces it by
registration (`CustomOp.register_oot`), with the reference math of docs/glm5.md section 3:

    score[t, s] = sum_h w[t, h] * relu(q[t, h] . k[s]),  s <= pos(t),   top-k per token, -1 padded.

vLLM has already folded 128^-0.5 and n_heads^-0.5 into `w` (and the fp8 q scale where q is quantized:
relu(c x) = c relu(x), c > 0). Keys are stored as vLLM stores them (fp8 e4m3 + one fp32 scale per token,
DeepGEMM's block-split paged layout: a block holds `block_size * 128` value bytes then `block_size * 4` scale
bytes), so the cache is interchangeable with vLLM's own kernels.

Key precision (`GLM5LIB_VLLM_INDEXER_KEYS`): `fp32` (default on CPU) also keeps every key in an fp32 side
cache with the same slot numbering and scores from it, so top-k equals the fp32 reference forward exactly;
`fp8` (default on CUDA) scores from the fp8 cache, as vLLM's kernels do, with glm5lib's Triton paged indexer
kernel (`glm5lib.kernels.indexer_logits`) on CUDA. Near-tied index scores are common (in the random tiny model,
everywhere): fp8 keys flip top-k picks past the top-k length and the greedy text diverges. The fp32 side cache
(512 B a token a layer) is allocated outside vLLM's KV-cache budget: a CPU/reference-path feature.

Per step (`paged.step_topk`): on CUDA the decode requests (vLLM puts them first) are scored in one paged-indexer
launch with one Triton top-k select, prefill chunks one request at a time, and the keys go into the cache in one
Triton launch; with fp8 keys (the CUDA default) nothing on that path waits for the GPU. Exact score ties (ReLU
zeroes whole rows) go to the earlier key, as in the reference forward (on CUDA up to 32K keys, see
`paged.step_topk`). The per-step layout comes from `Glm5IndexerBackend`, a subclass of vLLM's indexer-cache
backend (same cache spec) whose metadata builder is plain PyTorch: vLLM's builds prefill chunk metadata with
Triton kernels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.v1.attention.backend import (AttentionCGSupport, AttentionMetadata, AttentionMetadataBuilder,
                                       CommonAttentionMetadata)
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend

from glm5lib.kernels.naive import INDEXER_DIM, INDEXER_FP8_ROW_BYTES
from glm5lib.vllm_plugin.paged import key_precision, step_topk, write_indexer_keys

log = logging.getLogger("glm5lib.vllm_plugin")

OOT_NAME = "SparseAttnIndexer"  # vLLM swaps classes by the replaced class's __name__


@dataclass
class Glm5IndexerMetadata(AttentionMetadata):
    """Per-step layout the reference indexer needs (vLLM's indexer metadata is built by Triton kernels)."""

    num_actual_tokens: int
    query_start_loc_cpu: torch.Tensor  # [R + 1]
    seq_lens_cpu: torch.Tensor  # [R]
    seq_lens: torch.Tensor  # [R] int32, on the device (the batched decode launch reads it there)
    slot_mapping: torch.Tensor  # [T]
    block_table: torch.Tensor  # [R, max_blocks]


class Glm5IndexerMetadataBuilder(AttentionMetadataBuilder[Glm5IndexerMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device,
                 **kwargs: Any):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> Glm5IndexerMetadata:
        m = common_attn_metadata
        seq_lens_cpu = getattr(m, "seq_lens_cpu", None)
        if seq_lens_cpu is None:
            seq_lens_cpu = m.seq_lens.cpu()
        return Glm5IndexerMetadata(
            num_actual_tokens=m.num_actual_tokens,
            query_start_loc_cpu=m.query_start_loc_cpu[: m.num_reqs + 1],
            seq_lens_cpu=seq_lens_cpu[: m.num_reqs],
            seq_lens=m.seq_lens[: m.num_reqs],
            slot_mapping=m.slot_mapping[: m.num_actual_tokens],
            block_table=m.block_table_tensor,
        )


class Glm5IndexerBackend(DeepseekV32IndexerBackend):
    """vLLM's indexer-cache backend (same cache spec and block size) with a plain metadata builder."""

    @staticmethod
    def get_name() -> str:
        return "GLM5_INDEXER"

    @staticmethod
    def get_builder_cls() -> type[Glm5IndexerMetadataBuilder]:
        return Glm5IndexerMetadataBuilder


class Glm5SparseAttnIndexer(SparseAttnIndexer):
    """Drop-in for vLLM's SparseAttnIndexer (same constructor), computing top-k with the fp32 reference math."""

    def __init__(self, k_cache: Any, quant_block_size: int, scale_fmt: str | None, topk_tokens: int,
                 head_dim: int, max_model_len: int, max_total_seq_len: int, topk_indices_buffer: torch.Tensor,
                 skip_k_cache_insert: bool = False, **kwargs: Any):
        # vLLM swaps the class for every model: indexers that are not GLM-5 / DeepSeek-V3.2 style (DeepSeek-V4:
        # compressed keys written elsewhere, fp4 caches) keep vLLM's own implementation.
        self.delegate = bool(skip_k_cache_insert or kwargs.get("compress_ratio", 1) != 1 or kwargs.get("use_fp4_cache"))
        if self.delegate:
            SparseAttnIndexer.__init__(self, k_cache, quant_block_size, scale_fmt, topk_tokens, head_dim, max_model_len,
                                       max_total_seq_len, topk_indices_buffer, skip_k_cache_insert, **kwargs)
            return
        # Not SparseAttnIndexer.__init__: it raises on CUDA without DeepGEMM, the case this class exists for.
        CustomOp.__init__(self)
        self.k_cache = k_cache
        self.quant_block_size = quant_block_size
        self.scale_fmt = scale_fmt
        self.topk_tokens = topk_tokens
        self.head_dim = head_dim
        self.max_model_len = max_model_len
        self.max_total_seq_len = max_total_seq_len
        self.topk_indices_buffer = topk_indices_buffer
        self.skip_k_cache_insert = skip_k_cache_insert
        self.keys_fp32: torch.Tensor | None = None  # [num_blocks * block_size, 128] side cache, same slots
        # The cache layer was built just before this op; its metadata comes from our builder from now on (an
        # instance attribute: other models' indexer caches keep vLLM's backend). Registry entry:
        # patches.INDEXER_CACHE_BACKEND.
        k_cache.get_attn_backend = lambda: Glm5IndexerBackend

    def forward_native(self, hidden_states: torch.Tensor, q_quant: Any, k: torch.Tensor | None,
                       weights: torch.Tensor) -> torch.Tensor:
        if self.delegate:
            return SparseAttnIndexer.forward_native(self, hidden_states, q_quant, k, weights)
        ctx = get_forward_context()
        attn_metadata = ctx.attn_metadata
        if not isinstance(attn_metadata, dict):
            return self.topk_indices_buffer  # profiling / dummy run
        metadata = attn_metadata.get(self.k_cache.prefix)
        if not isinstance(metadata, Glm5IndexerMetadata):
            return self.topk_indices_buffer
        if isinstance(q_quant, tuple):
            raise NotImplementedError("glm5lib indexer: fp4 q is not supported")
        kv_cache = self.k_cache.kv_cache
        T = metadata.num_actual_tokens
        exact = key_precision(kv_cache.device) == "fp32"
        if exact and (self.keys_fp32 is None or self.keys_fp32.shape[0] != kv_cache.shape[0] * kv_cache.shape[1]):
            self.keys_fp32 = torch.zeros(kv_cache.shape[0] * kv_cache.shape[1], INDEXER_DIM, dtype=torch.float32,
                                         device=kv_cache.device)
        if k is not None and not self.skip_k_cache_insert:
            write_indexer_keys(kv_cache, k[:T], metadata.slot_mapping)  # quantized from k's own dtype
            if exact:
                keep = metadata.slot_mapping >= 0
                self.keys_fp32[metadata.slot_mapping[keep].long()] = k[:T][keep].float()
        return step_topk(q_quant, weights, kv_cache, metadata.block_table, metadata.query_start_loc_cpu.tolist(),
                         metadata.seq_lens_cpu.tolist(), self.topk_tokens, self.topk_indices_buffer,
                         keys_fp32=self.keys_fp32 if exact else None, seq_lens_dev=metadata.seq_lens)

    def forward_cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.delegate:
            return SparseAttnIndexer.forward_cpu(self, *args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.delegate:
            return SparseAttnIndexer.forward_cuda(self, *args, **kwargs)
        return self.forward_native(*args, **kwargs)


def register_indexer() -> bool:
    """Make vLLM build Glm5SparseAttnIndexer wherever it builds SparseAttnIndexer (idempotent).

    Another plugin's replacement under the same name is left in place (vLLM allows one; register_oot asserts
    the name is free): glm5lib then neither runs its indexer nor patches the indexer's q (see model.py)."""
    from vllm.model_executor.custom_op import op_registry_oot

    existing = op_registry_oot.get(OOT_NAME)
    if existing is Glm5SparseAttnIndexer:
        return False
    if existing is not None:
        log.warning("glm5lib: %s is already replaced by %s.%s; glm5lib's indexer is not registered", OOT_NAME,
                    existing.__module__, existing.__qualname__)
        return False
    CustomOp.register_oot(Glm5SparseAttnIndexer, name=OOT_NAME)
    return True


assert INDEXER_FP8_ROW_BYTES == INDEXER_DIM + 4
