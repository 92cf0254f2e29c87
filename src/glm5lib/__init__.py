"""glm5lib: the GLM-5 deployment workbench (GGUF tools, weight mapping, DSA analysis, Triton kernels, vLLM plugin).

The names below are the public API. Each is imported on first use, so `import glm5lib` loads neither torch nor
vLLM; the module named beside it holds the details and its docstring the rest of the API.

GGUF files (`glm5lib.gguf`)::

    g = glm5lib.open_gguf("GLM-5-Q4_K_M-00001-of-00010.gguf")  # a file, or any shard of a llama.cpp set
    g.kv, g.tensors, g.tensor(name), g.dequantize(name)       # metadata, tensor table, float32 tensors
    glm5lib.merge(first_shard, out)                            # byte-identical to llama-gguf-split --merge
    glm5lib.split(path, prefix, max_tensors=N | max_size=BYTES)  # byte-identical to llama-gguf-split --split

GGUF <-> HF mapping (`glm5lib.mapping`)::

    report = glm5lib.map_check(path)       # `glm5lib map check`: inventory and metadata, headers only
    report.ok, report.findings
    glm5lib.export_hf(path, out_dir)        # `glm5lib map export`: an HF directory transformers loads
    glm5lib.gguf_to_hf_config(path)         # config.json content of a glm-dsa GGUF

Reference forward (`glm5lib.model.reference`, `glm5lib.mapping.reference`)::

    model = glm5lib.reference_from_gguf(path)  # fp32 GLM-5 forward on a GGUF's weights (a ReferenceModel)
    glm5lib.ReferenceModel(cfg, weights)       # the same on HF-named weights

Kernels (`glm5lib.kernels`)::

    out = glm5lib.sparse_mla(q, kv_cache, indices, sm_scale)  # Triton sparse MLA (interpreter on CPU)

Serving (`glm5lib.serving`)::

    glm5lib.diagnose("glm5", "12.0")   # `glm5lib doctor`: the backend and indexer vLLM picks, and why
    glm5lib.plan                        # `glm5lib plan`: the deployment planner module (glm5lib.serving.plan)

The embedded tiny GLM-5::

    paths = glm5lib.ensure_tiny()       # build once, cached: HF directory and GGUF files (paths.shards["Q8_0"])

Paths (`glm5lib.paths`): `cache_dir()`, `bench_dir()`, `repo_root()`.
"""

from importlib import import_module as _import_module

__version__ = "0.1.0"

# public name -> (module, attribute in it; None: the module itself). Module paths are strings so that this file
# imports nothing from the floors below it until a name is used.
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "open_gguf": ("glm5lib.gguf.shards", "open_gguf"),
    "merge": ("glm5lib.gguf.split", "merge"),
    "split": ("glm5lib.gguf.split", "split"),
    "map_check": ("glm5lib.mapping.inventory", "check"),
    "export_hf": ("glm5lib.mapping.export", "export_hf"),
    "gguf_to_hf_config": ("glm5lib.mapping.config", "gguf_to_hf_config"),
    "reference_from_gguf": ("glm5lib.mapping.reference", "reference_from_gguf"),
    "ReferenceModel": ("glm5lib.model.reference", "ReferenceModel"),
    "sparse_mla": ("glm5lib.kernels.mla", "sparse_mla"),
    "diagnose": ("glm5lib.serving.doctor", "diagnose"),
    "plan": ("glm5lib.serving.plan", None),
    "ensure_tiny": ("glm5lib.mapping.tiny", "ensure_tiny"),
    "paths": ("glm5lib.paths", None),
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'glm5lib' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = _import_module(module) if attr is None else getattr(_import_module(module), attr)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
