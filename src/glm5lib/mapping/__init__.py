"""glm-dsa GGUF <-> HF/vLLM: config, tokenizer, weight names and layouts, and checks that the mapping is right.

Public entry points (the vLLM loader uses the first three):

    gguf_to_hf_config(path) -> dict                 config.json content (incl. the keys vLLM defaults wrongly)
    gguf_to_hf_tokenizer(path, out_dir)             tokenizer.json + tokenizer_config.json (chat template)
    iter_hf_weights(path, dtype=torch.bfloat16, include_mtp=True) -> Iterator[(hf_name, tensor)]
    GGUFHFWeights(path, dtype)                      random access by HF name: w("model.layers.3....") -> tensor
    iter_gguf_arrays(cfg, weights)                  the reverse: HF tensors -> GGUF tensors (converter order)
    mapping_table(cfg)                              GGUF name/shape -> HF name/shape/transform
    reference_from_gguf(path, stream=True)          the fp32 reference forward on a GGUF's weights
    compare_hf_configs(from_gguf, given)            differences between two config.json dicts

`path` is a GGUF file or any shard of a llama.cpp shard set. Modules: `config`, `tokenizer`, `weights`,
`inventory` (expected tensors, `map check`), `export` (`map export`), `layer_check` (numeric layout proof),
`corpus` (broken and header-only test files), `compare` (whole-model comparisons for notebook 02), `tiny`
(the tiny GLM-5 builder, `ensure_tiny()`), `reference` (the reference forward on a GGUF).

A change goes here when it connects GGUF files to GLM-5's HF/vLLM names and layouts (floor 3, above `gguf` and
`model`); names and shapes themselves belong in `glm5lib.model.spec`.
"""

from importlib import import_module

# Imported on first use, so `glm5lib map check` (headers only) does not pay for torch/transformers.
_EXPORTS = {
    "gguf_to_hf_config": "glm5lib.mapping.config",
    "compare_hf_configs": "glm5lib.mapping.config",
    "gguf_to_hf_tokenizer": "glm5lib.mapping.tokenizer",
    "iter_hf_weights": "glm5lib.mapping.weights",
    "iter_gguf_arrays": "glm5lib.mapping.weights",
    "GGUFHFWeights": "glm5lib.mapping.weights",
    "mapping_table": "glm5lib.mapping.weights",
    "reference_from_gguf": "glm5lib.mapping.reference",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'glm5lib.mapping' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
