"""HF `config.json` from a glm-dsa GGUF's metadata, and a comparison with a config.json the user has.

GGUF carries the architecture (`glm-dsa.*`) but not every field transformers/vLLM read; the rest come from
`GLM5Config` defaults (zai-org/GLM-5) and `GLM5Config.to_hf_dict()` adds the keys vLLM defaults wrongly
(`indexer_rope_interleave`, `scoring_func`, `topk_method`; docs/glm5.md sections 1 and 5).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from glm5lib.errors import GGUFFormatError
from glm5lib.model.spec import (GGUF_ARCH, GLM5Config, config_from_gguf_metadata, config_problems, json_type,
                                metadata_problems)

# Fields that change shapes or math. A difference in one of these is a problem; the others are notes:
# llama.cpp's converter sets bos = eos, the dtype follows the file type, some quants drop the MTP layer, and a
# context length may be edited without changing any weight.
NOTE_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "tie_word_embeddings",
               "num_nextn_predict_layers", "max_position_embeddings")
ARCH_FIELDS = tuple(f.name for f in dataclasses.fields(GLM5Config) if f.name not in NOTE_FIELDS)


def _f32_to_float(x: float) -> float:
    """GGUF stores floats as f32: 1e-5 reads back as 9.99999974e-06. Take the shortest decimal that rounds to the
    same f32, which is what the original config said."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-")) if x else 0.0


def config_from_kv(kv: dict[str, Any], *, torch_dtype: str = "bfloat16") -> GLM5Config:
    """The GLM5Config a glm-dsa file's metadata describes. GGUFFormatError (naming the key) when it describes none."""
    bad = metadata_problems(kv)
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        raise GGUFFormatError(f"GGUF metadata: {bad[0]}{more}")
    try:
        cfg = config_from_gguf_metadata(kv)
    except KeyError as exc:
        raise GGUFFormatError(f"GGUF metadata lacks {exc.args[0]} (not a complete glm-dsa file?)") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise GGUFFormatError(f"GGUF metadata does not describe a glm-dsa model: {exc}") from None
    bad = config_problems(cfg.to_hf_dict())
    if bad:
        raise GGUFFormatError(f"GGUF metadata describes no usable model: {bad[0]} (from {GGUF_ARCH}.* keys)")
    return cfg.replace(
        rope_theta=_f32_to_float(cfg.rope_theta),
        rms_norm_eps=_f32_to_float(cfg.rms_norm_eps),
        routed_scaling_factor=_f32_to_float(cfg.routed_scaling_factor),
        torch_dtype=torch_dtype,
    )


def file_torch_dtype(gs: Any) -> str:
    """The dtype an HF checkpoint rebuilt from this file should use: float32 only for an all-F32 file."""
    types = {t.ggml_type.name for t in gs.tensors if len(t.ne) > 1}
    return "float32" if types <= {"F32"} else "bfloat16"


def config_from_gguf(path_or_set: Any) -> GLM5Config:
    from glm5lib.mapping.source import open_model

    gs = open_model(path_or_set) if isinstance(path_or_set, (str, os.PathLike)) else path_or_set
    try:
        return config_from_kv(gs.kv, torch_dtype=file_torch_dtype(gs))
    except GGUFFormatError as exc:  # name the file: the message only knows the key
        raise GGUFFormatError(f"{gs.shards[0]}: {exc}") from None


def gguf_to_hf_config(path: str | os.PathLike, *, include_mtp: bool = True) -> dict[str, Any]:
    """`config.json` content (a dict) for the GLM-5 model in a glm-dsa GGUF file or shard set.

    Every field vLLM's `GlmMoeDsaForCausalLM` and transformers read is present. Fields GGUF does not carry
    keep zai-org/GLM-5 values (hidden_act silu, no attention bias). With `include_mtp=False` the config says
    `num_nextn_predict_layers: 0`, matching a checkpoint written without the MTP layer.
    """
    cfg = config_from_gguf(path)
    if not include_mtp:
        cfg = cfg.replace(num_nextn_predict_layers=0)
    return cfg.to_hf_dict()


@dataclass(frozen=True)
class ConfigDiff:
    key: str
    from_gguf: Any
    given: Any
    severity: str  # "problem" (shapes/math differ) or "note"

    def __str__(self) -> str:
        return f"{self.severity}: {self.key}: GGUF says {self.from_gguf!r}, config.json says {self.given!r}"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= 1e-6 * max(abs(float(a)), abs(float(b)), 1e-30)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def compare_hf_configs(from_gguf: dict[str, Any], given: dict[str, Any]) -> list[ConfigDiff]:
    """Differences between the GGUF-derived config and a given config.json, compared as `GLM5Config` fields
    (so equivalent spellings, e.g. rope_theta inside rope_parameters, agree), then the vLLM keys."""
    a, b = GLM5Config.from_hf_dict(from_gguf), GLM5Config.from_hf_dict(given)
    out = []
    for f in dataclasses.fields(GLM5Config):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if f.name not in given and f.name not in ("rope_theta", "indexer_types"):
            continue  # the given config does not say; GGUF's value stands
        if not _same(va, vb):
            out.append(ConfigDiff(f.name, va, vb, "problem" if f.name in ARCH_FIELDS else "note"))
    # Keys vLLM reads that a hub config may lack or spell differently (docs/glm5.md section 1).
    for key in ("indexer_rope_interleave", "rope_interleave", "scoring_func", "topk_method"):
        if key in given and not _same(given[key], from_gguf.get(key)):
            out.append(ConfigDiff(key, from_gguf.get(key), given[key], "problem"))
    return out
