"""The reference forward (`glm5lib.model.reference.ReferenceModel`) on the weights of a glm-dsa GGUF.

    from glm5lib.mapping import reference_from_gguf
    ref = reference_from_gguf("m-00001-of-00009.gguf", stream=True)   # any shard; one layer in RAM
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from glm5lib.mapping.source import read_tensor
from glm5lib.mapping.weights import GGUFHFWeights
from glm5lib.model.reference import ReferenceModel
from glm5lib.model.spec import gguf_tensor_specs


class GGUFWeights:
    """HF-named fp32 tensors from a glm-dsa GGUF file or shard set, dequantized on request.

    The mapping is `glm5lib.mapping.GGUFHFWeights` (names and layouts from
    `glm5lib.model.spec`): identity tensors as stored, `kv_b_proj` merged from attn_k_b/attn_v_b, routed expert e
    sliced out of the stacked `ffn_*_exps` *before* dequantizing, so one expert costs one expert's memory. Added
    here: `rows()`, which reads only the embedding rows a prompt needs."""

    def __init__(self, path: str | Path):
        self._weights = GGUFHFWeights(path, torch.float32)
        self.set, self.config = self._weights.set, self._weights.config
        self._gguf_name = {s.hf_names[0]: s.gguf_name for s in gguf_tensor_specs(self.config)
                           if s.transform == "identity"}

    def __call__(self, name: str) -> torch.Tensor:
        return self._weights(name)

    def rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of an identity-mapped 2-D tensor (the embedding); quantized blocks never span rows."""
        ids = np.asarray(ids, dtype=np.int64)
        return read_tensor(self.set, self._gguf_name[name], torch.float32, index=ids).reshape(len(ids), -1)


def reference_from_gguf(path: str | Path, **kw) -> ReferenceModel:
    """`ReferenceModel` over a glm-dsa GGUF file or shard set (any shard); `kw` as for `ReferenceModel`."""
    src = GGUFWeights(path)
    return ReferenceModel(src.config, src, **kw)
