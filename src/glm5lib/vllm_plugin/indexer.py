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

Per step: a uniform decode batch (every request the same 1..8 query tokens, vLLM's padding requests none,
`paged.uniform_decode_len`) takes `paged.decode_topk` on CUDA: one paged-indexer launch over a fixed grid with
scores as wide as `max_model_len` in a shared workspace and one Triton top-k select bounded by each row's length on
the device; the builder refills each token's length in a persistent buffer (`paged.StepBuffers`), so vLLM's full
CUDA graphs replay it (`UNIFORM_BATCH`). Other steps take `paged.step_topk` (the decode run batched, prefill chunks
one request at a time on the host: not capturable). The keys go into the cache in one Triton launch; with fp8 keys
(the CUDA default) nothing on either path waits for the GPU. Exact score ties (ReLU zeroes whole rows) go to the
earlier key, as in the reference forward. The op body runs inside `torch.ops.glm5lib.sparse_attn_indexer`
(opaque to torch.compile, a splitting op: see `patches.py`). The per-step layout comes from `Glm5IndexerBackend`,
a subclass of vLLM's indexer-cache backend (same cache spec) whose metadata builder is plain PyTorch: vLLM's
builds prefill chunk metadata with Triton kernels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm.config import get_current_vllm_config_or_none
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.v1.attention.backend import (AttentionCGSupport, AttentionMetadata, AttentionMetadataBuilder,
                                       CommonAttentionMetadata)
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend

from glm5lib.kernels.naive import INDEXER_DIM, INDEXER_FP8_ROW_BYTES
from glm5lib.vllm_plugin.paged import (MAX_BATCHED_NEXT_N, StepBuffers, decode_logits_workspace, decode_topk,
                                      kernel_choice, key_precision, step_topk, uniform_decode_len,
                                      write_indexer_keys)

log = logging.getLogger("glm5lib.vllm_plugin")

OOT_NAME = "SparseAttnIndexer"  # vLLM swaps classes by the replaced class's __name__


@dataclass
class Glm5IndexerMetadata(AttentionMetadata):
    """Per-step layout the indexer needs (vLLM's indexer metadata is built by Triton kernels)."""

    num_actual_tokens: int
    query_start_loc_cpu: torch.Tensor  # [R + 1]
    seq_lens_cpu: torch.Tensor  # [R] (prefill rows exact; only the per-request path reads it)
    seq_lens: torch.Tensor  # [R] int32, on the device (the batched decode launch reads it there)
    slot_mapping: torch.Tensor  # [T]
    block_table: torch.Tensor  # [R, max_blocks]
    # uniform decode batch (`paged.uniform_decode_len`): its query length n, else 0; then `token_lens [R * n]` is
    # each token's row length, in the builder's persistent buffer (CUDA graphs replay it)
    decode_next_n: int = 0
    token_lens: torch.Tensor | None = None


def host_seq_lens(m: CommonAttentionMetadata) -> torch.Tensor:
    """Context lengths on the host without waiting for the GPU: vLLM 0.33's `seq_lens_cpu_upper_bound` (exact
    except for async speculative decode rows, which the per-request path never sees: those are uniform
    decodes), 0.32's `seq_lens_cpu`; a device copy only when neither exists."""
    for name in ("seq_lens_cpu_upper_bound", "seq_lens_cpu"):
        v = getattr(m, name, None)
        if v is not None:
            return v
    return m.seq_lens.cpu()


def max_tokens_of(vllm_config: Any, default: int = 8192) -> int:
    sched = getattr(vllm_config, "scheduler_config", None)
    return int(getattr(sched, "max_num_batched_tokens", None) or default)


def max_model_len_of(vllm_config: Any, default: int = 8192) -> int:
    mc = getattr(vllm_config, "model_config", None)
    return int(getattr(mc, "max_model_len", None) or default)


def max_decode_tokens_of(vllm_config: Any) -> int:
    """The largest uniform decode batch in tokens: max_num_seqs x (1 + speculative tokens)."""
    sched = getattr(vllm_config, "scheduler_config", None)
    seqs = int(getattr(sched, "max_num_seqs", None) or 256)
    spec = getattr(vllm_config, "speculative_config", None)
    n = 1 + int(getattr(spec, "num_speculative_tokens", None) or 0)
    return seqs * min(n, MAX_BATCHED_NEXT_N)


class Glm5IndexerMetadataBuilder(AttentionMetadataBuilder[Glm5IndexerMetadata]):
    """Uniform decode batches replay from vLLM's full CUDA graphs (like FlashMLA-sparse's builder): `build()`
    refills `StepBuffers` in place and the op's decode path has fixed shapes. Mixed batches take the
    per-request path (host loop over prefill chunks): not capturable, so not ALWAYS."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device,
                 **kwargs: Any):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.buffers = StepBuffers(max_tokens_of(vllm_config), device)
        self.max_model_len = max_model_len_of(vllm_config)
        self.max_decode_tokens = max_decode_tokens_of(vllm_config)
        dev = torch.device(device)
        if dev.type == "cuda" and key_precision(dev) == "fp8" and kernel_choice(dev) == "triton":
            # before vLLM captures its graphs (the op's profile run reserves it already when it knows the config)
            decode_logits_workspace(dev, self.max_decode_tokens, self.max_model_len)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> Glm5IndexerMetadata:
        m = common_attn_metadata
        R, T = m.num_reqs, m.num_actual_tokens
        n = uniform_decode_len(m.query_start_loc_cpu, R, T)
        if n and T > self.max_decode_tokens:
            n = 0  # larger than the score workspace: the per-request path
        return Glm5IndexerMetadata(
            num_actual_tokens=T,
            query_start_loc_cpu=m.query_start_loc_cpu[: R + 1],
            seq_lens_cpu=host_seq_lens(m)[:R],
            seq_lens=m.seq_lens[:R],
            slot_mapping=m.slot_mapping[:T],
            block_table=m.block_table_tensor,
            decode_next_n=n,
            token_lens=self.buffers.fill_token_lens(m.seq_lens, R, n) if n else None,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> Glm5IndexerMetadata:
        """vLLM's dummy metadata (uniform decode at the captured size; zero or stale lengths, null blocks): the
        same `build`, whose decode path is safe on any lengths <= max_model_len and slot -1."""
        return self.build(0, common_attn_metadata)


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
        _INSTANCES[k_cache.prefix] = self  # the custom op finds its layer by the cache's name

    def forward_native(self, hidden_states: torch.Tensor, q_quant: Any, k: torch.Tensor | None,
                       weights: torch.Tensor) -> torch.Tensor:
        if self.delegate:
            return SparseAttnIndexer.forward_native(self, hidden_states, q_quant, k, weights)
        if isinstance(q_quant, tuple):
            raise NotImplementedError("glm5lib indexer: fp4 q is not supported")
        # an opaque op for torch.compile, and a splitting op: piecewise graphs leave it eager (patches.py)
        return torch.ops.glm5lib.sparse_attn_indexer(hidden_states, self.k_cache.prefix, q_quant, k, weights,
                                                     self.topk_indices_buffer)

    def run(self, hidden_states: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None,
            weights: torch.Tensor) -> torch.Tensor:
        """The op's body: this step's keys into the cache, then top-k into the shared buffer."""
        ctx = get_forward_context()
        attn_metadata = ctx.attn_metadata
        kv_cache = self.k_cache.kv_cache
        metadata = attn_metadata.get(self.k_cache.prefix) if isinstance(attn_metadata, dict) else None
        if not isinstance(metadata, Glm5IndexerMetadata):
            # profile / dummy run: reserve the decode score workspace now, so vLLM's memory profile counts it
            if kv_cache.device.type == "cuda" and key_precision(kv_cache.device) == "fp8":
                cfg = get_current_vllm_config_or_none()
                if cfg is not None:
                    decode_logits_workspace(kv_cache.device, max_decode_tokens_of(cfg), self.max_model_len)
            return self.topk_indices_buffer
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
        if metadata.decode_next_n and not exact and kernel_choice(kv_cache.device) == "triton":
            # fixed shapes, nothing read on the host: what vLLM's full CUDA graphs capture
            ws = decode_logits_workspace(kv_cache.device, T, self.max_model_len)
            return decode_topk(q, weights, kv_cache, metadata.block_table, metadata.seq_lens, metadata.token_lens,
                               metadata.decode_next_n, self.topk_tokens, self.topk_indices_buffer, ws)
        return step_topk(q, weights, kv_cache, metadata.block_table, metadata.query_start_loc_cpu.tolist(),
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


# k_cache prefix -> the op instance the custom op runs (custom ops take tensors and scalars, not modules)
_INSTANCES: dict[str, Glm5SparseAttnIndexer] = {}


def sparse_attn_indexer(hidden_states: torch.Tensor, k_cache_prefix: str, q: torch.Tensor, k: torch.Tensor | None,
                        weights: torch.Tensor, topk_indices_buffer: torch.Tensor) -> torch.Tensor:
    """`torch.ops.glm5lib.sparse_attn_indexer`: one layer's indexer (writes `topk_indices_buffer` in place and
    returns it, as vLLM's `vllm::sparse_attn_indexer` does)."""
    return _INSTANCES[k_cache_prefix].run(hidden_states, q, k, weights)


def sparse_attn_indexer_fake(hidden_states: torch.Tensor, k_cache_prefix: str, q: torch.Tensor,
                             k: torch.Tensor | None, weights: torch.Tensor,
                             topk_indices_buffer: torch.Tensor) -> torch.Tensor:
    return topk_indices_buffer


OP_NAMESPACE = "glm5lib"
OP_NAME = "sparse_attn_indexer"
SPLITTING_OP = f"{OP_NAMESPACE}::{OP_NAME}"
_LIB: dict[str, Any] = {}


def register_indexer_op() -> bool:
    """Define `torch.ops.glm5lib.sparse_attn_indexer` (once per process), with vLLM's helper and the platform's
    dispatch key; under vLLM's breakable CUDA graphs it is an eager break like vLLM's own indexer op."""
    if "lib" in _LIB:
        return False
    from torch.library import Library
    from vllm.utils.torch_utils import direct_register_custom_op

    fn = sparse_attn_indexer
    try:
        from vllm.compilation.breakable_cudagraph import eager_break_during_capture

        fn = eager_break_during_capture(fn)
    except ImportError:  # older vLLM: no breakable capture
        pass
    lib = Library(OP_NAMESPACE, "FRAGMENT")
    direct_register_custom_op(OP_NAME, fn, mutates_args=["topk_indices_buffer"], fake_impl=sparse_attn_indexer_fake,
                              target_lib=lib)
    _LIB["lib"] = lib  # the op lives as long as its library object
    return True


def add_splitting_op() -> bool:
    """Registry entry patches.SPLITTING_OPS: glm5lib's indexer op joins vLLM's default splitting ops
    (idempotent; True when it changed something now)."""
    from vllm.config.compilation import CompilationConfig

    ops = CompilationConfig._attention_ops
    if SPLITTING_OP in ops:
        return False
    ops.append(SPLITTING_OP)
    return True


def register_indexer() -> bool:
    """Make vLLM build Glm5SparseAttnIndexer wherever it builds SparseAttnIndexer (idempotent).

    Another plugin's replacement under the same name is left in place (vLLM allows one; register_oot asserts
    the name is free): glm5lib then neither runs its indexer nor patches the indexer's q (see model.py)."""
    from vllm.model_executor.custom_op import op_registry_oot

    register_indexer_op()
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
