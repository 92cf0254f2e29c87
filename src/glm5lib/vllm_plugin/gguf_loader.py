"""Serve a glm-dsa GGUF (a merged file or the first shard of a set) with vLLM, its blocks kept quantized.

vLLM 0.32/0.33 have no in-tree GGUF support; `vllm-gguf-plugin` has the GGUF linear/MoE methods and kernels
but its weight adapter cannot map `glm-dsa` (stacked experts, split attn_k_b/attn_v_b). glm5lib supplies:

1. `prepare_model_dir(gguf)`: a small cached directory vLLM opens like a hub repo: `config.json` (with the MTP
   layer count, and `quantization_config: {"quant_method": "glm5-gguf"}` when the file holds quantized
   tensors), the tokenizer rebuilt from the GGUF metadata, and `glm5lib_gguf.json` naming the GGUF. No weights
   are copied. `bare_gguf.py` points a bare `--model MODEL.gguf` at it.
2. Load format `glm5-gguf`: `Glm5GGUFLoader`, a subclass of the plugin's `GGUFModelLoader`, streams the file
   in the plugin's weight convention (`glm5lib.mapping.quantized`): quantized tensors as raw uint8 rows from
   the memory map, one expert at a time; `kv_b_proj` rebuilt from attn_k_b/attn_v_b, the indexer `wk` and
   the MTP `eh_proj` dequantized; F32 router, bias and norms as stored. The residency plan (which modules stay
   quantized) goes into the `glm5-gguf` quantization config before vLLM builds the model.

Residency policy: `--model-loader-extra-config '{"residency": "dense-attn"}'` or `GLM5LIB_GGUF_RESIDENCY`
(`quantized`, the default, or `dense-attn`; see `glm5lib.mapping.quantized`). A GGUF without quantized tensors
(F32/BF16) has no quantization config and is streamed as plain weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

LOAD_FORMAT = "glm5-gguf"
POINTER_FILE = "glm5lib_gguf.json"
DIR_FORMAT = 2  # bump when the directory's content changes, so cached directories are rebuilt


def default_model_dir(gguf: Path) -> Path:
    """Under `glm5lib.paths.model_cache_dir()` (the user cache unless $GLM5LIB_CACHE), keyed by the file."""
    from glm5lib.paths import model_cache_dir

    st = gguf.stat()
    key = f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}:{DIR_FORMAT}"
    return model_cache_dir() / "vllm-gguf" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def served_name(gguf: str | os.PathLike) -> str:
    """`GLM-5-Q4_K_M` for `GLM-5-Q4_K_M-00001-of-00010.gguf` or `GLM-5-Q4_K_M.gguf`."""
    return Path(gguf).name.split("-00001-of-")[0].removesuffix(".gguf")


def has_quantized_tensors(gguf: str | os.PathLike) -> bool:
    from glm5lib.mapping.quantized import PLAIN_TYPES
    from glm5lib.mapping.source import open_model

    return any(t.ggml_type not in PLAIN_TYPES for t in open_model(gguf).tensors if t.name.endswith(".weight"))


def prepare_model_dir(gguf: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """The vLLM model directory for `gguf` (config + tokenizer + pointer), built once (temp dir + rename)."""
    from glm5lib.errors import UserError
    from glm5lib.mapping import gguf_to_hf_config, gguf_to_hf_tokenizer
    from glm5lib.mapping.quantized import residency_plan

    gguf = Path(gguf)
    if not gguf.is_file():
        raise UserError(f"{gguf}: no such GGUF file")
    from glm5lib.gguf import open_gguf

    open_gguf(gguf).check_readable()  # serving reads tensor data: refuse a file whose layout is unsafe, now
    # every shard and tensor present and of a servable type (headers only): fail here, not in a worker
    residency_plan(gguf)
    out = Path(out_dir) if out_dir else default_model_dir(gguf)
    if (out / POINTER_FILE).exists():
        return out
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not a glm5lib GGUF model directory; choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        config = gguf_to_hf_config(gguf)  # with num_nextn_predict_layers: vLLM's MTP drafter reads it
        if has_quantized_tensors(gguf):
            from glm5lib.vllm_plugin.gguf_quant import QUANT_NAME

            config["quantization_config"] = {"quant_method": QUANT_NAME}
        (work / "config.json").write_text(json.dumps(config, indent=2))
        gen = {"eos_token_id": config.get("eos_token_id"), "pad_token_id": config.get("pad_token_id")}
        (work / "generation_config.json").write_text(json.dumps(gen, indent=2))
        gguf_to_hf_tokenizer(gguf, work)
        (work / POINTER_FILE).write_text(json.dumps({"gguf": str(gguf.resolve())}, indent=2))
        work.chmod(0o755)
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        try:
            os.replace(work, out)
        except OSError:
            if not (out / POINTER_FILE).exists():
                raise
            shutil.rmtree(work, ignore_errors=True)  # another process built the same directory first
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def gguf_path_for(model_dir: str, extra: dict[str, Any] | None) -> Path:
    if extra and extra.get("gguf"):
        return Path(extra["gguf"])
    pointer = Path(model_dir) / POINTER_FILE
    if pointer.exists():
        return Path(json.loads(pointer.read_text())["gguf"])
    if str(model_dir).endswith(".gguf"):
        return Path(model_dir)
    raise ValueError(f"load format {LOAD_FORMAT}: {model_dir} has no {POINTER_FILE}; build it with "
                     f"glm5lib.vllm_plugin.gguf_loader.prepare_model_dir(gguf) or pass "
                     f"--model-loader-extra-config '{{\"gguf\": \"PATH\"}}'")


def is_mtp_config(model_config: Any) -> bool:
    """vLLM's MTP drafter config (`SpeculativeConfig.hf_config_override` renames glm_moe_dsa to deepseek_mtp)."""
    return getattr(model_config.hf_config, "model_type", None) == "deepseek_mtp"


def _loader_cls():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm_gguf_plugin import GGUFModelLoader

    from glm5lib.mapping.quantized import iter_vllm_weights, residency_plan
    from glm5lib.vllm_plugin.gguf_quant import Glm5GGUFConfig

    class Glm5GGUFLoader(GGUFModelLoader):
        """The plugin's GGUF loader with glm5lib's glm-dsa weight stream and residency plan.

        `load_model` is BaseModelLoader's (which passes the drafter's `model_config` on to the model builder;
        the plugin's builds `vllm_config.model_config` and so cannot load vLLM's MTP drafter) after the
        residency plan is in the quantization config."""

        def __init__(self, load_config: Any):
            # the plugin's loader refuses any extra config; ours takes `gguf` and `residency`
            super().__init__(dataclasses.replace(load_config, model_loader_extra_config={}))
            self.load_config = load_config
            self.extra = dict(load_config.model_loader_extra_config or {})
            self._plan: Any = None

        def _prepare_weights(self, model_config: Any) -> str:
            return str(gguf_path_for(model_config.model, self.extra))

        def _plan_for(self, model_config: Any) -> Any:
            return residency_plan(self._prepare_weights(model_config), self.extra.get("residency"),
                                  "mtp" if is_mtp_config(model_config) else "main")

        def download_model(self, model_config: Any) -> None:
            self._plan_for(model_config)

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
            self._plan = plan = self._plan_for(model_config)
            qc = vllm_config.quant_config
            if isinstance(qc, Glm5GGUFConfig):
                qc.add_plan(plan.quantized, plan.dense)
            else:  # no quantization config (F32/BF16 file, or chosen so): everything as plain weights
                plan.dense |= plan.quantized
                plan.quantized = set()
            return BaseModelLoader.load_model(self, vllm_config, model_config, prefix)

        def load_weights(self, model: Any, model_config: Any) -> None:
            plan = self._plan or self._plan_for(model_config)
            path = self._prepare_weights(model_config)
            loaded = model.load_weights(iter_vllm_weights(plan, path, model_config.dtype))
            if loaded is not None and plan.part == "main":
                missing = {n for n, _ in model.named_parameters()} - set(loaded)
                if missing:
                    raise ValueError(f"{path}: {len(missing)} parameters not loaded, e.g. {sorted(missing)[:3]}")

    Glm5GGUFLoader.__qualname__ = Glm5GGUFLoader.__name__ = "Glm5GGUFLoader"
    return Glm5GGUFLoader


PLUGIN_HINT = "pip install --no-deps vllm-gguf-plugin==0.0.5"
_registered = {"done": False}


def have_gguf_plugin() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm_gguf_plugin") is not None


def register_gguf_loader() -> bool:
    """Register quantization and load format glm5-gguf once per process (a second registration would make vLLM
    warn). Without vllm-gguf-plugin nothing is registered; a glm-dsa GGUF then fails at start with PLUGIN_HINT."""
    from vllm.model_executor import model_loader

    if _registered["done"] or not have_gguf_plugin():
        return False
    from glm5lib.vllm_plugin.gguf_quant import register_quant_config

    register_quant_config()
    model_loader.register_model_loader(LOAD_FORMAT)(_loader_cls())
    _registered["done"] = True
    return True
