"""The mapping's view of a GGUF file or shard set: metadata, tensor infos and per-tensor (or per-expert) reads.

Everything goes through `glm5lib.gguf.open_gguf` (header-only parse, memmapped data), so opening a ~400 GB
shard set reads only its headers; tensor data is touched one tensor (or one expert slice) at a time.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf.constants import GGMLQuantizationType

from glm5lib.errors import GGUFFormatError
from glm5lib.model.spec import GGUF_ARCH

from glm5lib.gguf import open_gguf as _open_gguf

if TYPE_CHECKING:
    import torch

# Types whose raw memmap view is already the values (no block structure).
_PLAIN = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def open_model(path: str | os.PathLike, *, require_arch: bool = True) -> Any:
    """Open a glm-dsa GGUF (any shard of a set). Raises GGUFFormatError (exit 2) when it is unreadable or not glm-dsa."""
    gs = _open_gguf(path)
    if require_arch and gs.arch != GGUF_ARCH:
        raise GGUFFormatError(f"{path}: general.architecture is {gs.arch!r}, not {GGUF_ARCH!r} (not a GLM-5 GGUF)")
    return gs


def read_tensor(gs: Any, name: str, dtype: "torch.dtype | None" = None, *, index: Any = None) -> "torch.Tensor":
    """One tensor (or, with `index`, a selection along its outermost torch dim) in torch order, as `dtype` (float32).

    Only the bytes of that tensor/selection are read. F32/F16/BF16 are converted exactly from their typed view
    (no float32 round trip for BF16 -> BF16: half the memory on a BF16 file); other types are dequantized to
    float32 by `GGUFSet.dequantize` (gguf-py), then cast.
    """
    import torch  # here, so that header-only users (`map check`) never import torch

    dtype = dtype or torch.float32
    qtype = GGMLQuantizationType(gs.tensor(name).ggml_type)
    if qtype not in _PLAIN:
        return torch.from_numpy(gs.dequantize(name, index=index)).to(dtype)
    raw = gs.raw(name)  # memmap, typed (uint16 for BF16)
    if index is not None:
        raw = raw[index]
    t = torch.from_numpy(np.array(raw))
    return (t.view(torch.bfloat16) if qtype == GGMLQuantizationType.BF16 else t).to(dtype)
