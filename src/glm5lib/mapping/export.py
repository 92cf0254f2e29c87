"""`glm5lib map export PATH OUTDIR`: a complete HF checkpoint directory from a glm-dsa GGUF.

config.json (+ generation_config.json), tokenizer.json/tokenizer_config.json (chat template) and safetensors
shards with an index, streamed tensor by tensor from `iter_hf_weights` (memory: one shard's worth of tensors).
Written into a temp directory beside OUTDIR and renamed when complete; an existing OUTDIR is never touched.

MTP: transformers' `GlmMoeDsaForCausalLM` has no MTP module and only ignores `model.layers.78.*` (GLM-5's
index), so any other model's MTP weights load as "unexpected keys". The default therefore leaves the MTP layer
out and writes `num_nextn_predict_layers: 0`; `include_mtp=True` (`--mtp`) keeps it for vLLM's MTP drafter.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from glm5lib.errors import UserError
from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.source import open_model
from glm5lib.mapping.tokenizer import gguf_to_hf_tokenizer
from glm5lib.mapping.weights import iter_hf_weights
from glm5lib.model.spec import hf_tensor_shapes
from glm5lib.progress import show_progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_hf(path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "auto", include_mtp: bool = False,
              max_shard_bytes: int = 5 * 10**9, progress: bool = True) -> Path:
    """Write the HF directory for the GGUF at `path` into `out_dir` (must not exist). `dtype` "auto": float32 for an
    all-F32 file, else bfloat16."""
    out = Path(out_dir)
    if out.exists():
        raise UserError(f"{out} already exists; refusing to overwrite (choose a new directory)")
    gs = open_model(path)
    cfg = config_from_gguf(gs)
    if dtype == "auto":
        dtype = cfg.torch_dtype
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    cfg = cfg.replace(torch_dtype=dtype)
    if not include_mtp:
        cfg = cfg.replace(num_nextn_predict_layers=0)
    torch_dtype = DTYPES[dtype]

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (work / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
        gen = {"eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
        (work / "generation_config.json").write_text(json.dumps(gen, indent=2))
        gguf_to_hf_tokenizer(gs, work)
        _write_shards(gs, work, torch_dtype, include_mtp, max_shard_bytes, progress,
                      n_total=len(hf_tensor_shapes(cfg, include_mtp=include_mtp)))
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def _write_shards(gs: Any, work: Path, dtype: torch.dtype, include_mtp: bool, max_shard_bytes: int,
                  progress: bool, n_total: int) -> None:
    """Fill shards up to `max_shard_bytes`; shard names get their final `-of-N` once N is known."""
    files: list[tuple[Path, list[str]]] = []
    batch: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal batch, size
        if not batch:
            return
        p = work / f"part-{len(files):05d}.safetensors"
        save_file(batch, str(p), metadata={"format": "pt"})
        files.append((p, list(batch)))
        batch, size = {}, 0

    with tqdm(total=n_total, desc="export", unit="tensor", disable=not show_progress(progress)) as bar:
        for name, t in iter_hf_weights(gs, dtype=dtype, include_mtp=include_mtp):
            n = t.numel() * t.element_size()
            if batch and size + n > max_shard_bytes:
                flush()
            batch[name] = t.contiguous()
            size += n
            total += n
            bar.update(1)
        flush()
    weight_map = {}
    for i, (p, names) in enumerate(files):
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        os.replace(p, work / final)
        weight_map.update({n: final for n in names})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (work / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
