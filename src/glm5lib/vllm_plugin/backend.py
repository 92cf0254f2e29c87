"""`GLM5_SPARSE_MLA`: a vLLM sparse-MLA attention backend for GLM-5 on the glm5lib kernels.

It meets vLLM's sparse-MLA contract (docs/glm5.md section 5): `is_mla()`/`is_sparse()`, head size 576, kernel block
sizes `MultipleOf(64)` (the indexer's cache shares the block table and needs 64), bf16/fp16 and `fp8_ds_mla`
caches (fp32 too on CPU, for exact comparisons), any head count, compute capability 8.0 and newer (12.x
included), and on the CPU platform.

Every query token (prefill or decode) goes through the top-k path, as vLLM's XPU sparse backend does:
the indexer leaves request-local top-k positions in the shared buffer (`[T, index_topk]`, -1 padded); the
impl turns them into physical cache rows (`block * block_stride_rows + offset`, the cache read through
`flat_kv_row_view` because vLLM may interleave other layers' pages between this layer's blocks) and
calls the sparse-MLA kernel, which returns the latent output `[T, H, 512]`; the layer applies W_UV.

Kernels: `glm5lib.kernels.sparse_mla` (Triton, in `glm5lib.kernels.mla`; Gluon on sm_90 for 17-128 heads, and for 1-8
heads over an fp8_ds_mla cache) on CUDA,
its fp32 twin `glm5lib.kernels.naive.sparse_mla_ref`
on CPU (`GLM5LIB_SPARSE_MLA_KERNEL=naive|triton` overrides, e.g. to run Triton's interpreter on CPU). The
forward itself is `glm5lib.vllm_plugin.paged.sparse_mla_forward` (no vLLM import: the GPU harness runs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm.config import VllmConfig
from vllm.model_executor.layers.attention.sparse_mla_attention import SharedTopkIndicesBuffer
from vllm.platforms import current_platform
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MLAAttentionImpl,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows

from glm5lib.vllm_plugin.compat import is_quantized_kv_cache
from glm5lib.vllm_plugin.indexer import max_tokens_of
from glm5lib.vllm_plugin.paged import HEAD_SIZE, StepBuffers, kernel_choice, sparse_mla_forward, write_kv_rows

BACKEND_NAME = "GLM5_SPARSE_MLA"
KERNEL_BLOCK = 64
MIN_CAPABILITY = (8, 0)


class Glm5SparseMLABackend(AttentionBackend):
    accept_output_buffer: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "bfloat16", "float16", "fp8_ds_mla"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(KERNEL_BLOCK)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [HEAD_SIZE]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        # Triton's tl.dot needs sm_80+; shared memory configs are kept under sm_89/sm_120's ~99 KB.
        return (capability.major, capability.minor) >= MIN_CAPABILITY

    @classmethod
    def customize_spec(cls, spec: Any) -> Any:
        return align_blocks_to_rows(spec)

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_metadata_cls() -> type["Glm5SparseMLAMetadata"]:
        return Glm5SparseMLAMetadata

    @staticmethod
    def get_builder_cls() -> type["Glm5SparseMLAMetadataBuilder"]:
        return Glm5SparseMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["Glm5SparseMLAImpl"]:
        return Glm5SparseMLAImpl


@dataclass
class Glm5SparseMLAMetadata(AttentionMetadata):
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor  # [num_reqs, max_blocks] kernel blocks
    req_id_per_token: torch.Tensor  # [num_actual_tokens] int32
    block_size: int
    topk_tokens: int
    # The shared MLA layer splits tokens into MQA (decode) and MHA (prefill) by these. This backend has no
    # dense-MHA prefill: every token is "decode", so the layer routes all of them to forward_mqa.
    num_decodes: int = 0
    num_prefills: int = 0
    num_decode_tokens: int = 0


class Glm5SparseMLAMetadataBuilder(AttentionMetadataBuilder[Glm5SparseMLAMetadata]):
    """UNIFORM_BATCH like FlashMLA-sparse's builder (docs/glm5.md section 9): the forward has fixed shapes for a
    given token count and reads only tensors at fixed addresses (vLLM's persistent buffers, and
    `req_id_per_token` refilled in place here), so vLLM's full CUDA graphs replay it. It would allow ALWAYS;
    the indexer's builder, whose prefill path loops over requests on the host, does not, and vLLM takes the
    minimum over all builders."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.topk_tokens = int(vllm_config.model_config.hf_text_config.index_topk)
        self.buffers = StepBuffers(max_tokens_of(vllm_config), device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> Glm5SparseMLAMetadata:
        m = common_attn_metadata
        return Glm5SparseMLAMetadata(
            num_reqs=m.num_reqs,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            num_actual_tokens=m.num_actual_tokens,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            slot_mapping=m.slot_mapping,
            block_table=m.block_table_tensor,
            req_id_per_token=self.buffers.fill_req_ids(m.query_start_loc, m.num_reqs, m.num_actual_tokens),
            block_size=self.kv_cache_spec.block_size,
            topk_tokens=self.topk_tokens,
            num_decodes=m.num_reqs,
            num_prefills=0,
            num_decode_tokens=m.num_actual_tokens,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> Glm5SparseMLAMetadata:
        """The same `build`. vLLM's dummy capture metadata (zeroed or stale lengths, null or stale blocks) is
        harmless: picks come from lengths <= max_model_len through block-table entries that name cache blocks,
        and the kernel masks any row id outside the cache."""
        return self.build(0, common_attn_metadata)


def kv_format_of(kv_cache_dtype: str) -> str:
    if kv_cache_dtype == "fp8_ds_mla":
        return "fp8_ds_mla"
    if is_quantized_kv_cache(kv_cache_dtype):
        raise NotImplementedError(f"{BACKEND_NAME} supports bf16/fp16/fp32 and fp8_ds_mla caches, not {kv_cache_dtype}")
    return "bf16"


class Glm5SparseMLAImpl(MLAAttentionImpl[Glm5SparseMLAMetadata], SharedTopkIndicesBuffer):
    is_sparse = True

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 topk_indices_buffer: torch.Tensor | None = None, indexer: Any = None, **mla_args: Any) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank: int = mla_args["kv_lora_rank"]
        self.kv_format = kv_format_of(kv_cache_dtype)
        self.kernel: str | None = None  # picked on first use, from the device the cache lives on
        self.init_topk_indices_buffer(indexer, topk_indices_buffer)

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        if kv_cache.numel() == 0:
            return
        if current_platform.is_cuda_alike():  # vLLM's concat_and_cache_mla (also writes fp8_ds_mla rows)
            super().do_kv_cache_update(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
            return
        write_kv_rows(kv_cache, kv_c_normed, k_pe.reshape(k_pe.shape[0], -1), slot_mapping)

    # Hooks the MLA layer calls on sparse impls for vLLM's index groups (shared top-k conversion across layers);
    # this impl converts its own top-k in forward_mqa, so they have nothing to do.
    def record_logical_topk_ready(self) -> None:
        pass

    def prepare_for_batch(self, attn_metadata: Any) -> None:
        pass

    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_c_and_k_pe_cache: torch.Tensor,
                    attn_metadata: Glm5SparseMLAMetadata, layer: AttentionLayer
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self.topk_indices_buffer is not None
        if self.kernel is None:
            self.kernel = kernel_choice(kv_c_and_k_pe_cache.device)
        out, lse = sparse_mla_forward(q, kv_c_and_k_pe_cache, attn_metadata, self.topk_indices_buffer, self.scale,
                                      self.kv_format, self.kernel)
        return out[:, : self.num_heads, :], lse
