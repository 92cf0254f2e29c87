"""`glm5lib map export PATH OUTDIR`: a complete HF checkpoint directory from a glm-dsa GGUF.

config.json (+ generation_config.json), tokenizer.json/tokenizer_config.json (chat template) and safetensors
shards with an index, streamed tensor by tensor from `iter_hf_weights` (memory: one shard's worth of tensors).
Written into a temp directory beside OUTDIR and renamed when complete; an existing OUTDIR is replaced only with
`force`, and only once the new one is complete.

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
from safetensors import SafetensorError
from safetensors.torch import save_file
from tqdm.auto import tqdm

from glm5lib.errors import GGUFFormatError, UserError
from glm5lib.files import check_output, publish_tree, write_error
from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.source import open_model
from glm5lib.mapping.tokenizer import gguf_to_hf_tokenizer
from glm5lib.mapping.weights import iter_hf_weights
from glm5lib.model.spec import HF_F32_KINDS, hf_tensor_shapes
from glm5lib.progress import show_progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_hf(path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "auto", include_mtp: bool = False,
              max_shard_bytes: int = 5 * 10**9, progress: bool = True, force: bool = False) -> Path:
    """Write the HF directory for the GGUF at `path` into `out_dir`. `dtype` "auto": float32 for an all-F32 file,
    else bfloat16, with the tensors GLM-5's checkpoint keeps in F32 (`HF_F32_KINDS`) F32 when the file stores them
    F32, so that the round trip of a llama.cpp-converted file is bit-exact.

    A file `map check` finds problems in is refused (nothing is written). An existing `out_dir` is refused
    unless `force`, and then replaced only once the new directory is complete; its parent must exist."""
    from glm5lib.mapping.inventory import check_set

    if max_shard_bytes <= 0:
        raise UserError(f"the safetensors shard size must be positive, got {max_shard_bytes}")
    gs = open_model(path)
    out = check_output(out_dir, force=force, inputs=gs.shards, directory=True)
    report = check_set(gs, path=str(path))  # export writes nothing that `map check` rejects
    if report.problems:
        first = report.problems[0]
        more = f" (+{len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise GGUFFormatError(f"{path}: {first.category}: {first.message}{more}; not exporting (see `glm5lib map "
                              f"check`)")
    cfg = config_from_gguf(gs)
    keep_f32 = HF_F32_KINDS if dtype == "auto" else ()
    if dtype == "auto":
        dtype = cfg.torch_dtype
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    cfg = cfg.replace(torch_dtype=dtype)
    if not include_mtp:
        cfg = cfg.replace(num_nextn_predict_layers=0)
    torch_dtype = DTYPES[dtype]

    work = old = None
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        (work / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
        gen = {"eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
        (work / "generation_config.json").write_text(json.dumps(gen, indent=2))
        gguf_to_hf_tokenizer(gs, work)
        _write_shards(gs, work, torch_dtype, include_mtp, max_shard_bytes, progress,
                      n_total=len(hf_tensor_shapes(cfg, include_mtp=include_mtp)), keep_f32=keep_f32)
        publish_tree(work)  # mkdtemp's 0700 would hide the model from a server running as another user
        if os.path.lexists(out):  # --force: keep the old one until the new one is in place
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "x")
        os.replace(work, out)
        work = None
    except OSError as exc:
        raise write_error(out, exc) from None
    except SafetensorError as exc:  # safetensors reports a full disk or an I/O error as its own type
        raise UserError(f"{out}: cannot write ({exc})") from None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
            if old is not None and os.path.lexists(old / "x"):  # put the previous output back
                os.replace(old / "x", out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out


def _write_shards(gs: Any, work: Path, dtype: torch.dtype, include_mtp: bool, max_shard_bytes: int,
                  progress: bool, n_total: int, keep_f32: Any = ()) -> None:
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
        for name, t in iter_hf_weights(gs, dtype=dtype, include_mtp=include_mtp, keep_f32=keep_f32):
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
