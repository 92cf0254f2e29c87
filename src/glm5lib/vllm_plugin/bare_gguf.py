"""A bare glm-dsa `.gguf` path as vLLM's model: `vllm serve MODEL.gguf`, `python -m
vllm.entrypoints.openai.api_server --model MODEL.gguf`, `vllm.LLM(model="MODEL.gguf")` (merged file or the first
shard of a set), no glm5lib-specific flag. Why this wraps a vLLM function, and what pins it: `patches.BARE_GGUF`.

`point_engine_args_at_gguf` rewrites the engine arguments to the prepared directory (`gguf_loader.
prepare_model_dir`: config and tokenizer from the GGUF, `quantization_config: glm5-gguf`), load format
`glm5-gguf`. It also takes a glm-dsa file out of `model_weights`, where vllm-gguf-plugin's own patch (on
`EngineArgs.create_model_config`, later in the same call) puts a `.gguf` model, so the two coexist whichever runs
first. GGUFs of other architectures are left alone (to vllm-gguf-plugin).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("glm5lib.vllm_plugin")


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


def wrap_create_engine_config() -> bool:
    """Wrap EngineArgs.create_engine_config once per process (patches.BARE_GGUF). True when it wrapped now."""
    from vllm.engine.arg_utils import EngineArgs

    from glm5lib.vllm_plugin import patches

    current = EngineArgs.create_engine_config
    if getattr(current, "_glm5lib_bare_gguf", False):
        return False
    patches.keep_original(patches.BARE_GGUF, current)

    @functools.wraps(current)
    def create_engine_config(self, *args: Any, **kwargs: Any) -> Any:
        point_engine_args_at_gguf(self)
        return current(self, *args, **kwargs)

    create_engine_config._glm5lib_bare_gguf = True
    EngineArgs.create_engine_config = create_engine_config
    return True
