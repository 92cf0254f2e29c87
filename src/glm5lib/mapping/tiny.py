"""Build the embedded tiny GLM-5: an HF directory and glm-dsa GGUF files (F32, BF16, Q8_0, ...), merged and split.

Nothing is downloaded: weights are drawn from a seed, the tokenizer is trained on text the package ships.
The GGUF files are laid out as llama.cpp's `glm-dsa` converter lays them out (names and order from
`glm5lib.model.spec`, kv_b split into attn_k_b/attn_v_b, stacked experts, F32 norms/router/biases/indexer proj).
The K-quant mixes (Q4_K_M, Q5_K_M, Q6_K: `LLAMA_QUANTIZE_TYPES`) are made by llama.cpp's own `llama-quantize`
from the BF16 file, as a real release is (scripts/build_llama_quantize.sh, or $GLM5LIB_LLAMA_QUANTIZE): gguf-py
cannot quantize K-quants, and the per-tensor type choices are llama.cpp's to make.

    paths = ensure_tiny()            # builds into .cache/tiny (or $GLM5LIB_CACHE/tiny) once
    paths.hf_dir, paths.gguf["Q8_0"], paths.shards["Q8_0"][0]
    ensure_tiny(types=TINY_KQUANT_TYPES).gguf["Q4_K_M"]     # needs llama-quantize
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from glm5lib.errors import UserError
from glm5lib.paths import cache_dir, repo_root
from glm5lib.model.spec import (
    GGUF_ARCH, GGUF_FILE_TYPES, LLAMA_QUANTIZE_TYPES, TINY_DEFAULT_TYPES, TINY_KQUANT_TYPES, GLM5Config, TensorSpec,
    gguf_metadata, hf_tensor_shapes,
)
from glm5lib.model.tokenizer import EOS_TOKEN, SPECIAL_TOKENS, save_hf_tokenizer, train_tokenizer
from glm5lib.progress import show_progress

# Types gguf-py can quantize and llama.cpp's converter would write for the main weights.
FILE_TYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "F32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "BF16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q5_0": (gguf.GGMLQuantizationType.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
DEFAULT_TYPES = TINY_DEFAULT_TYPES
assert tuple(FILE_TYPES) == GGUF_FILE_TYPES
# The K-quant types are made from this one (a real release quantizes the converter's BF16 output), whatever
# other types are asked for, so their bytes do not depend on the type set.
KQUANT_SOURCE = "BF16"
TINY_NAME = "tiny-glm5"
# Shards "like a real release": a split every N tensors gives several shards for the 94-tensor tiny model.
TINY_SPLIT_MAX_TENSORS = 32


def default_cache_dir() -> Path:
    """Where rebuildable models live: `glm5lib.paths.cache_dir()` ($GLM5LIB_CACHE, the checkout's .cache, or XDG)."""
    return cache_dir()


# ---- weights ---------------------------------------------------------------------------------------------------


def init_weights(cfg: GLM5Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic HF-named fp32 weights. Norm weights and biases are not trivial (1 + noise) so that a
    mapping that drops or swaps them changes the output."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in hf_tensor_shapes(cfg).items():
        if len(shape) == 1:
            if name.endswith("e_score_correction_bias"):
                t = 0.1 * torch.randn(shape, generator=gen)
            elif name.endswith(".bias"):
                t = 0.05 * torch.randn(shape, generator=gen)
            else:  # RMSNorm / LayerNorm weight
                t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            fan_in = shape[-1]
            std = 0.02 if "embed_tokens" in name else fan_in**-0.5
            t = std * torch.randn(shape, generator=gen)
        out[name] = t.float()
    return out


def hf_to_gguf_arrays(cfg: GLM5Config, weights: Mapping[str, torch.Tensor]) -> Iterable[tuple[TensorSpec, torch.Tensor]]:
    """HF checkpoint tensors -> GGUF tensors (torch order), one at a time, in converter order (the mapping's
    HF -> GGUF direction; one implementation lives in glm5lib.mapping)."""
    from glm5lib.mapping.weights import iter_gguf_arrays

    return iter_gguf_arrays(cfg, weights)


# ---- writers ---------------------------------------------------------------------------------------------------


def write_hf_dir(cfg: GLM5Config, weights: Mapping[str, torch.Tensor], out_dir: Path, *, tokenizer=None,
                 shard_layers: int = 2) -> None:
    """config.json, generation_config.json, tokenizer files and safetensors shards with an index, like a hub repo."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    gen_cfg = {"eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))
    if tokenizer is not None:
        save_hf_tokenizer(tokenizer, out_dir)
    # Shard by layer groups so the index/multi-file path is exercised.
    groups: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in weights.items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        groups.setdefault(max(layer, 0) // shard_layers, {})[name] = t.contiguous()
    n = len(groups)
    weight_map = {}
    for k, (gi, tensors) in enumerate(sorted(groups.items())):
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in tensors})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _add_tokenizer(writer: gguf.GGUFWriter, hf_dir: Path) -> None:
    """tokenizer.ggml.* as llama.cpp's converter writes them for a gpt2-style BPE (get_vocab_base + SpecialVocab)."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("tokenizer ids are not contiguous")
    special = set(SPECIAL_TOKENS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the tiny tokenizer uses the GPT-2 byte-level split regex
    writer.add_token_list([t for t, _ in by_id])
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id])
    special_vocab = gguf.SpecialVocab(hf_dir, load_merges=True)
    eos = vocab[EOS_TOKEN]
    special_vocab._set_special_token("eos", eos)  # as the glm converter does (private API, same call)
    special_vocab._set_special_token("eot", vocab["<|user|>"])
    special_vocab._set_special_token("unk", eos)
    special_vocab._set_special_token("bos", eos)
    special_vocab._set_special_token("pad", eos)
    special_vocab.add_to_gguf(writer, quiet=True)


def write_gguf(cfg: GLM5Config, weights: Mapping[str, torch.Tensor], hf_dir: Path, out_path: Path,
               file_type: str = "F32", *, name: str = TINY_NAME, progress: bool = True) -> Path:
    """One merged glm-dsa GGUF file. `hf_dir` supplies the tokenizer files."""
    if file_type not in FILE_TYPES:
        raise UserError(f"unsupported GGUF type {file_type!r}; choose from {', '.join(FILE_TYPES)}")
    qtype, ftype = FILE_TYPES[file_type]
    tmp = out_path.with_name(out_path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), GGUF_ARCH)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_file_type(int(ftype))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in gguf_metadata(cfg).items():
        _add_kv(writer, key, value)
    _add_tokenizer(writer, hf_dir)
    specs = list(hf_to_gguf_arrays(cfg, weights))
    for spec, t in tqdm(specs, desc=f"gguf {file_type}", disable=not show_progress(progress), leave=False):
        arr = t.detach().to(torch.float32).numpy()
        this_type = gguf.GGMLQuantizationType.F32 if spec.storage == "f32" else qtype
        if this_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(spec.gguf_name, np.ascontiguousarray(arr))
        else:
            data = gguf.quants.quantize(arr, this_type)
            writer.add_tensor(spec.gguf_name, data, raw_shape=data.shape, raw_dtype=this_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    os.replace(tmp, out_path)
    return out_path


def _add_kv(writer: gguf.GGUFWriter, key: str, value) -> None:
    # gguf-py 0.19 has no add_indexer_types (GLM-5.2); write every arch key with explicit types instead.
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        writer.add_string(key, str(value))


# ---- llama.cpp's llama-quantize (K-quant mixes) ---------------------------------------------------------------

LLAMA_QUANTIZE_ENV = "GLM5LIB_LLAMA_QUANTIZE"


def llama_quantize_binary() -> Path | None:
    """$GLM5LIB_LLAMA_QUANTIZE, else what scripts/build_llama_quantize.sh builds (.cache/llama.cpp/build/bin), or
    None. A system llama-quantize on PATH is not used: one older than llama.cpp's glm-dsa support refuses the arch."""
    env = os.environ.get(LLAMA_QUANTIZE_ENV)
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"{path}: ${LLAMA_QUANTIZE_ENV} is not an executable file")
        return path
    roots = [cache_dir()] + ([repo_root() / ".cache"] if repo_root() is not None else [])
    for root in roots:
        path = root / "llama.cpp" / "build" / "bin" / "llama-quantize"
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def llama_quantize(binary: Path, src: Path, out: Path, file_type: str, *, threads: int = 1) -> str:
    """Run `llama-quantize SRC OUT FILE_TYPE THREADS` (temp name + rename); returns its log (stdout + stderr),
    which names every tensor's chosen type and each shape fallback."""
    tmp = out.with_name(out.name + ".tmp")
    proc = subprocess.run([str(binary), str(src), str(tmp), file_type, str(threads)], capture_output=True,
                          text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = " | ".join(line.strip() for line in log.strip().splitlines()[-3:])
        raise UserError(f"{src}: llama-quantize {file_type} failed (exit {proc.returncode}): {tail}")
    os.replace(tmp, out)
    return log


# ---- the cached tiny model ---------------------------------------------------------------------------------------


@dataclass
class TinyPaths:
    root: Path
    config: GLM5Config
    hf_dir: Path
    gguf: dict[str, Path] = field(default_factory=dict)  # merged file per type
    shards: dict[str, list[Path]] = field(default_factory=dict)  # shard files per type, first shard first

    def first_shard(self, file_type: str = "Q8_0") -> Path:
        return self.shards[file_type][0]


def _manifest(cfg: GLM5Config, seed: int, types: tuple[str, ...]) -> dict:
    m = {"config": cfg.to_hf_dict(), "seed": seed, "types": list(types), "split_max_tensors": TINY_SPLIT_MAX_TENSORS,
         "version": 1}
    if any(t in LLAMA_QUANTIZE_TYPES for t in types):
        m["kquant_source"] = KQUANT_SOURCE
    return m


def build_tiny(out_dir: Path, *, cfg: GLM5Config | None = None, seed: int = 0,
               types: tuple[str, ...] = DEFAULT_TYPES, weights: Mapping[str, torch.Tensor] | None = None,
               progress: bool = True) -> TinyPaths:
    """Build the tiny model into `out_dir` (must not exist); built in a temp dir and renamed when complete."""
    cfg = cfg or GLM5Config.tiny()
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise UserError(f"{out_dir} already exists; remove it or choose another directory")
    bad = [t for t in types if t not in FILE_TYPES and t not in LLAMA_QUANTIZE_TYPES]
    if bad:
        raise UserError(f"unsupported GGUF type(s) {', '.join(bad)}; choose from "
                        f"{', '.join(tuple(FILE_TYPES) + LLAMA_QUANTIZE_TYPES)}")
    kquants = [t for t in types if t in LLAMA_QUANTIZE_TYPES]
    binary = llama_quantize_binary() if kquants else None
    if kquants and binary is None:
        raise UserError(f"{out_dir}: {', '.join(kquants)} need llama.cpp's llama-quantize: build it with "
                        f"scripts/build_llama_quantize.sh or set ${LLAMA_QUANTIZE_ENV}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        tok = train_tokenizer(cfg.vocab_size)
        eos = tok.token_to_id(EOS_TOKEN)
        cfg = cfg.replace(bos_token_id=None, eos_token_id=eos, pad_token_id=eos)
        weights = dict(weights) if weights is not None else init_weights(cfg, seed)
        hf_dir = work / "hf"
        write_hf_dir(cfg, weights, hf_dir, tokenizer=tok)
        from glm5lib.gguf.split import split  # lazy: glm5lib.gguf users import this module

        source = work / f"{TINY_NAME}-{KQUANT_SOURCE}.gguf"
        if kquants:
            write_gguf(cfg, weights, hf_dir, source, KQUANT_SOURCE, progress=progress)
        for ft in types:
            merged = work / f"{TINY_NAME}-{ft}.gguf"
            if ft in kquants:
                log = llama_quantize(binary, source, merged, ft)
                (work / f"llama-quantize-{ft}.log").write_text(log)  # llama.cpp's per-tensor choices, for reading
            elif not merged.exists():  # (the K-quant source is already written)
                write_gguf(cfg, weights, hf_dir, merged, ft, progress=progress)
            shard_dir = work / f"shards-{ft}"
            shard_dir.mkdir()
            split(merged, shard_dir / f"{TINY_NAME}-{ft}", max_tensors=TINY_SPLIT_MAX_TENSORS, progress=False)
        if kquants and KQUANT_SOURCE not in types:
            source.unlink()
        (work / "manifest.json").write_text(json.dumps(_manifest(cfg, seed, types), indent=1))
        work.chmod(0o755)
        try:
            os.replace(work, out_dir)
        except OSError:
            if not (out_dir / "manifest.json").exists():
                raise
            shutil.rmtree(work)  # another process finished the same build first: use theirs
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return load_tiny(out_dir)


def load_tiny(root: Path) -> TinyPaths:
    root = Path(root)
    manifest = json.loads((root / "manifest.json").read_text())
    cfg = GLM5Config.from_hf_dict(manifest["config"])
    paths = TinyPaths(root=root, config=cfg, hf_dir=root / "hf")
    for ft in manifest["types"]:
        paths.gguf[ft] = root / f"{TINY_NAME}-{ft}.gguf"
        paths.shards[ft] = sorted((root / f"shards-{ft}").glob("*.gguf"))
    return paths


def ensure_tiny(root: Path | None = None, *, seed: int = 0, types: tuple[str, ...] = DEFAULT_TYPES,
                progress: bool = True) -> TinyPaths:
    """The cached tiny model, built on first use (a few seconds). Rebuilt if the recipe changed."""
    if root is None:  # other type sets get their own cache, so they never replace the one others are reading
        root = default_cache_dir() / ("tiny" if tuple(types) == DEFAULT_TYPES else "tiny-" + "-".join(types))
    root = Path(root)
    cfg = GLM5Config.tiny()
    if (root / "manifest.json").exists():
        paths = load_tiny(root)
        want = _manifest(cfg.replace(bos_token_id=None, eos_token_id=paths.config.eos_token_id,
                                     pad_token_id=paths.config.pad_token_id), seed, types)
        if json.loads((root / "manifest.json").read_text()) == want:
            return paths
        shutil.rmtree(root)  # our own cache, never user data
    return build_tiny(root, seed=seed, types=types, progress=progress)
