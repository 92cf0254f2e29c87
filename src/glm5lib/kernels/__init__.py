"""Triton kernels for GLM-5 sparse attention: sparse MLA forward, DSA indexer scores, top-k selection.

fp32 references with the same signatures live in `glm5lib.kernels.naive`.
"""

from glm5lib.kernels import common  # noqa: F401  (first: sets the interpreter switch on CPU-only machines)
from glm5lib.kernels.indexer import indexer_logits
from glm5lib.kernels.naive import dequantize_fp8_ds_mla, quantize_fp8_ds_mla
from glm5lib.kernels.sparse_mla import sparse_mla
from glm5lib.kernels.topk import topk_indices

__all__ = ["sparse_mla", "indexer_logits", "topk_indices", "quantize_fp8_ds_mla", "dequantize_fp8_ds_mla"]
