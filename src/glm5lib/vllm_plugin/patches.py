"""Every change glm5lib makes to vLLM behaviour that no public hook allows, in one registry.

Each entry names the patched symbol, why, the vLLM versions whose code was checked, the condition for removing
it, and the symbol's signature as checked; tests/test_vllm_patches.py compares that signature with each vLLM
version's source and fails loudly when it changes. Patches wrap (never edit installed files), keep the original
on the owner (`_glm5lib_original_<name>`), and apply once per process.

(The CPU platform's `get_attn_backend_cls` / `check_and_update_config` wrappers are in `cpu.py`.)
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("glm5lib.vllm_plugin")


@dataclass(frozen=True)
class Patch:
    module: str  # where the owner lives
    owner: str  # class name ("" for a module-level function)
    name: str  # attribute patched
    why: str
    checked: tuple[str, ...]  # vLLM versions whose code this was checked against
    remove_when: str
    params: tuple[str, ...]  # the patched function's parameters as checked (names, in order)
    fields: tuple[str, ...]  # attributes of the owner the patch reads or writes
    wrap: Callable[[Callable], Callable]

    @property
    def symbol(self) -> str:
        return ".".join(p for p in (self.module, self.owner, self.name) if p)


# ---- a bare glm-dsa GGUF path as the model -------------------------------------------------------------------


def glm_dsa_gguf(path: Any) -> Path | None:
    """`path` when it is a glm-dsa GGUF file (merged or a shard), else None (other GGUFs are left to others).

    A `.gguf` file whose header cannot be read raises GGUFFormatError (one line naming the file)."""
    if not path or not str(path).endswith(".gguf") or not os.path.isfile(path):
        return None
    from glm5lib.gguf.format import read_header
    from glm5lib.model.spec import GGUF_ARCH

    return Path(path) if read_header(path).get("general.architecture") == GGUF_ARCH else None


def point_engine_args_at_gguf(args: Any) -> bool:
    """Rewrite EngineArgs whose `model` (or `model_weights`, as vllm-gguf-plugin's own patch leaves it) is a
    glm-dsa GGUF: the model becomes its prepared directory (config + tokenizer from the GGUF, built once; bad
    files fail here with one line naming the file or tensor), load format `glm5-gguf`; the quantization comes
    from that directory's config.json. Returns True when it rewrote."""
    from glm5lib.vllm_plugin.gguf_loader import LOAD_FORMAT, POINTER_FILE, prepare_model_dir, served_name

    gguf = glm_dsa_gguf(args.model) or glm_dsa_gguf(args.model_weights)
    if gguf is None:  # a prepared directory needs only the load format
        if args.model and (Path(args.model) / POINTER_FILE).is_file() and args.load_format == "auto":
            args.load_format = LOAD_FORMAT
            return True
        return False
    from glm5lib.errors import UserError
    from glm5lib.vllm_plugin.gguf_loader import PLUGIN_HINT, have_gguf_plugin

    if not have_gguf_plugin():
        raise UserError(f"{gguf}: serving a GGUF needs vllm-gguf-plugin ({PLUGIN_HINT})")
    model_dir = str(prepare_model_dir(gguf))
    given = {str(args.model), str(args.model_weights or ""), str(gguf)}
    if args.served_model_name is None or args.served_model_name in (str(gguf), [str(gguf)]):
        args.served_model_name = [served_name(gguf)]
    if args.tokenizer is None or str(args.tokenizer) in given:
        args.tokenizer = model_dir
    args.model, args.model_weights = model_dir, ""
    if args.load_format in ("auto", "gguf"):  # "gguf": set by vllm-gguf-plugin's patch, if it ran first
        args.load_format = LOAD_FORMAT
    if args.quantization == "gguf":
        args.quantization = None
    if args.config_format == "gguf":
        args.config_format = "auto"
    log.info("glm5lib: serving glm-dsa GGUF %s from %s (load format %s)", gguf, model_dir, LOAD_FORMAT)
    return True


def _wrap_create_engine_config(original: Callable) -> Callable:
    @functools.wraps(original)
    def create_engine_config(self, *args: Any, **kwargs: Any) -> Any:
        point_engine_args_at_gguf(self)
        return original(self, *args, **kwargs)

    return create_engine_config


BARE_GGUF = Patch(
    module="vllm.engine.arg_utils",
    owner="EngineArgs",
    name="create_engine_config",
    why="vLLM has no hook between the engine arguments and the model config: a plugin's register() never sees "
        "`--model MODEL.gguf`, and vLLM 0.32/0.33 read no config or tokenizer from a .gguf path. Wrapping "
        "create_engine_config (the first thing `vllm serve`, the OpenAI api_server and vllm.LLM do with the "
        "arguments, before the speculators probe reads `model` as a Hugging Face path) points the arguments at "
        "the prepared directory. vllm-gguf-plugin wraps create_model_config for its GGUFs; this runs first and "
        "also undoes its rewrite (model_weights = the .gguf) if it ran first, for glm-dsa files only.",
    checked=("0.32.0", "0.33.0"),
    remove_when="vLLM offers a model-resolution hook to plugins (or reads GGUF configs again) for glm-dsa",
    params=("self", "usage_context", "headless"),
    fields=("model", "model_weights", "tokenizer", "served_model_name", "load_format", "quantization",
            "config_format"),
    wrap=_wrap_create_engine_config,
)

PATCHES: tuple[Patch, ...] = (BARE_GGUF,)


def _owner(p: Patch) -> Any:
    import importlib

    obj = importlib.import_module(p.module)
    return getattr(obj, p.owner) if p.owner else obj


def apply_patches() -> list[str]:
    """Apply every patch not yet applied in this process; returns the symbols patched now."""
    done = []
    for p in PATCHES:
        owner = _owner(p)
        marker = f"_glm5lib_original_{p.name}"
        if marker in vars(owner):
            continue
        original = vars(owner)[p.name]
        setattr(owner, marker, original)
        setattr(owner, p.name, p.wrap(original))
        done.append(p.symbol)
    return done
