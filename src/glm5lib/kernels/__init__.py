"""Triton kernels for GLM-5 sparse attention: sparse MLA forward, DSA indexer scores, top-k selection.

fp32 references with the same signatures live in `glm5lib.kernels.naive`. Modules: `mla` (sparse MLA; the module
is not named after its function, so `glm5lib.kernels.sparse_mla` stays the function), `indexer`, `topk`, `naive`,
`common`, `rows` (paged-row conversion), `checks` (the numeric case matrix), `compile_report` (AOT compiles for
sm_80/89/90/120). Benchmarks, tuning sweeps and the readers of committed GPU results live in `glm5lib.bench`.

A change goes here when it runs on a GPU inside the model's forward (floor 3: it may use `glm5lib.model`, never
vLLM); how vLLM calls these kernels belongs in `glm5lib.vllm_plugin`.

The names below are imported on first use, so `import glm5lib.kernels.naive` (the vLLM plugin's CPU path, the
DSA analysis) loads neither Triton nor the kernels and leaves TRITON_INTERPRET alone. The kernel modules import
`glm5lib.kernels.common` before Triton; it selects the interpreter on machines without a CUDA GPU.
"""

from importlib import import_module

_EXPORTS = {
    "sparse_mla": "glm5lib.kernels.mla",
    "indexer_logits": "glm5lib.kernels.indexer",
    "topk_indices": "glm5lib.kernels.topk",
    "topk_select": "glm5lib.kernels.topk",
    "quantize_fp8_ds_mla": "glm5lib.kernels.naive",
    "dequantize_fp8_ds_mla": "glm5lib.kernels.naive",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'glm5lib.kernels' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
