"""Serve a glm-dsa GGUF (a merged file or any shard of a set) with vLLM: load format `glm5-gguf`.

vLLM 0.32/0.33 have no in-tree GGUF support any more (it moved to `vllm-gguf-plugin`, which does not know
`glm-dsa` and expects the legacy `attn_kv_b`). Two steps, both through `glm5lib.mapping`:

1. `prepare_model_dir(gguf)`: a small directory vLLM can open like a hub repo: `config.json` and the tokenizer
   reconstructed from the GGUF metadata, plus `glm5lib_gguf.json` naming the GGUF. No weights are copied.
2. `--load-format glm5-gguf`: `Glm5GGUFLoader` streams `iter_hf_weights(gguf)` (HF names, per-expert
   weights, `kv_b_proj` rebuilt from attn_k_b/attn_v_b, dequantized by gguf-py) into the model's own
   `load_weights`, one tensor at a time.

`glm5lib serve MODEL.gguf` does both. Quantized types are dequantized to the serving dtype: this is a
correctness path for any GGUF type gguf-py reads, not a memory saver. A real 400 GB Q4 GLM-5 deployment needs
the weights to stay quantized on the GPU, i.e. vLLM's GGUF linear/MoE kernels (`vllm-gguf-plugin`) fed with
our names and our `kv_b_proj` (or its k_b/v_b absorbed directly): see notebooks/05_vllm_serving.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

LOAD_FORMAT = "glm5-gguf"
POINTER_FILE = "glm5lib_gguf.json"


def default_model_dir(gguf: Path) -> Path:
    """Under `glm5lib.paths.model_cache_dir()` (the user cache unless $GLM5LIB_CACHE), keyed by the file."""
    from glm5lib.paths import model_cache_dir

    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return model_cache_dir() / "vllm-gguf" / f"{gguf.stem}-{key}"


def prepare_model_dir(gguf: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """The vLLM model directory for `gguf` (config + tokenizer + pointer), built once (temp dir + rename)."""
    from glm5lib.errors import UserError
    from glm5lib.mapping import gguf_to_hf_config, gguf_to_hf_tokenizer

    gguf = Path(gguf)
    if not gguf.is_file():
        raise UserError(f"{gguf}: no such GGUF file")
    from glm5lib.gguf import open_gguf

    open_gguf(gguf).check_readable()  # serving reads tensor data: refuse a file whose layout is unsafe, now
    out = Path(out_dir) if out_dir else default_model_dir(gguf)
    if (out / POINTER_FILE).exists():
        return out
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not a glm5lib GGUF model directory; choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        config = gguf_to_hf_config(gguf, include_mtp=False)  # vLLM's main model does not load the MTP layer
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


def _loader_cls():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class Glm5GGUFLoader(BaseModelLoader):
        """Streams HF-named GLM-5 weights out of a glm-dsa GGUF into the model's `load_weights`."""

        def download_model(self, model_config: Any) -> None:
            gguf_path_for(model_config.model, self.load_config.model_loader_extra_config)

        def load_weights(self, model: Any, model_config: Any) -> None:
            from glm5lib.mapping import iter_hf_weights

            path = gguf_path_for(model_config.model, self.load_config.model_loader_extra_config)
            loaded = model.load_weights(iter_hf_weights(path, dtype=model_config.dtype, include_mtp=False))
            if loaded is not None:
                missing = {n for n, _ in model.named_parameters()} - set(loaded)
                if missing:
                    raise ValueError(f"{path}: {len(missing)} parameters not loaded, e.g. {sorted(missing)[:3]}")

    Glm5GGUFLoader.__qualname__ = Glm5GGUFLoader.__name__ = "Glm5GGUFLoader"
    return Glm5GGUFLoader


_registered = {"done": False}


def register_gguf_loader() -> bool:
    """Register load format glm5-gguf once per process (a second registration would make vLLM warn)."""
    from vllm.model_executor import model_loader

    if _registered["done"]:
        return False
    model_loader.register_model_loader(LOAD_FORMAT)(_loader_cls())
    _registered["done"] = True
    return True
