"""Whole-model comparisons between a GGUF and an HF directory (for notebook 02 and quick audits).

- `compare_weights`: every HF tensor rebuilt from the GGUF vs the HF checkpoint (exact count, worst error).
- `kv_b_round_trip`: attn_k_b/attn_v_b -> kv_b_proj -> split again (exactness of the layout transform itself).
- `tokenizer_agreement`: ids of the GGUF-rebuilt tokenizer vs the original on texts and a chat.
- `plot_bytes_by_kind`, `plot_layer_check`: the notebook's figures.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.source import open_model, read_tensor
from glm5lib.mapping.weights import iter_hf_weights
from glm5lib.model.layout import merge_kv_b, split_kv_b
from glm5lib.model.reference import SafetensorsWeights


def compare_weights(gguf_path: str | os.PathLike, hf_dir: str | os.PathLike, *, include_mtp: bool = True,
                    round_reference_to: torch.dtype | None = None, progress: bool = False) -> dict[str, Any]:
    """Rebuild every HF tensor from the GGUF (float32) and compare with `hf_dir`'s tensor, streamed.

    `round_reference_to` (e.g. torch.bfloat16) rounds the reference first for tensors the GGUF does not keep F32,
    so a BF16 file is checked for bit-exactness against what it should hold."""
    gs = open_model(gguf_path)
    cfg = config_from_gguf(gs)
    hf = SafetensorsWeights(hf_dir)  # the shard of each name from model.safetensors.index.json
    from glm5lib.model.spec import gguf_tensor_specs

    f32_names = {s.hf_names[0] for s in gguf_tensor_specs(cfg) if s.storage == "f32"}
    n = exact = 0
    missing, worst, worst_name = [], 0.0, None
    seen = set()
    for name, t in iter_hf_weights(gs, dtype=torch.float32, include_mtp=include_mtp, progress=progress):
        seen.add(name)
        if name not in hf.weight_map:
            missing.append(name)
            continue
        ref = hf(name)  # float32
        if round_reference_to is not None and name not in f32_names:
            ref = ref.to(round_reference_to).float()
        n += 1
        if tuple(ref.shape) == tuple(t.shape) and torch.equal(ref, t):
            exact += 1
            continue
        err = float((ref - t).abs().max() / ref.abs().max().clamp_min(1e-30)) if ref.shape == t.shape else float("inf")
        if err > worst:
            worst, worst_name = err, name
    not_rebuilt = sorted(set(hf.weight_map) - seen)
    return {"compared": n, "bit_exact": exact, "worst_rel_err": worst, "worst_tensor": worst_name,
            "missing_in_hf": missing, "hf_not_rebuilt": not_rebuilt}


def kv_b_round_trip(gguf_path: str | os.PathLike, layer: int = 0) -> dict[str, Any]:
    """merge(attn_k_b, attn_v_b) then split again returns the stored tensors exactly (a pure permutation)."""
    gs = open_model(gguf_path)
    cfg = config_from_gguf(gs)
    k_b = read_tensor(gs, f"blk.{layer}.attn_k_b.weight")
    v_b = read_tensor(gs, f"blk.{layer}.attn_v_b.weight")
    kv_b = merge_kv_b(k_b, v_b, cfg)
    k2, v2 = split_kv_b(kv_b, cfg)
    per_head = kv_b.view(cfg.num_attention_heads, cfg.kv_b_head_dim, cfg.kv_lora_rank)
    return {
        "k_b_shape": list(k_b.shape), "v_b_shape": list(v_b.shape), "kv_b_shape": list(kv_b.shape),
        "k_b_exact": bool(torch.equal(k2, k_b)), "v_b_exact": bool(torch.equal(v2, v_b)),
        # W_UK of head 0 is k_b[0]^T: row j of kv_b (j < nope) is column j of attn_k_b[0]
        "w_uk_head0_is_k_b_transposed": bool(torch.equal(per_head[0, : cfg.qk_nope_head_dim], k_b[0].T)),
        "w_uv_head0_is_v_b": bool(torch.equal(per_head[0, cfg.qk_nope_head_dim:], v_b[0])),
    }


def tokenizer_agreement(gguf_path: str | os.PathLike, hf_dir: str | os.PathLike, texts: list[str],
                        chat: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Token ids of the tokenizer rebuilt from the GGUF vs the original's (`hf_dir`)."""
    from transformers import AutoTokenizer

    from glm5lib.mapping.tokenizer import gguf_to_hf_tokenizer

    original = AutoTokenizer.from_pretrained(str(Path(hf_dir).resolve()))
    with tempfile.TemporaryDirectory() as tmp:
        gguf_to_hf_tokenizer(gguf_path, tmp)
        rebuilt = AutoTokenizer.from_pretrained(tmp)
        same = [original(t).input_ids == rebuilt(t).input_ids for t in texts]
        n_tokens = sum(len(original(t).input_ids) for t in texts)
        chat_same = None
        if chat is not None:
            chat_same = (original.apply_chat_template(chat, add_generation_prompt=True)
                         == rebuilt.apply_chat_template(chat, add_generation_prompt=True))
        specials = {a.content: rebuilt(a.content).input_ids == [original.convert_tokens_to_ids(a.content)]
                    for a in original.added_tokens_decoder.values()}
    return {"texts_equal": sum(same), "texts": len(texts), "tokens": n_tokens, "chat_equal": chat_same,
            "special_tokens_whole": sum(specials.values()), "special_tokens": len(specials)}


# ---- figures ---------------------------------------------------------------------------------------------------------


def plot_bytes_by_kind(report: Any, path: str | os.PathLike, *, top: int = 12) -> Path:
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()

    items = sorted(report.bytes_by_kind.items(), key=lambda kv: -kv[1])[:top]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(items) + 1))
    ax.barh([k for k, _ in items][::-1], [v / 1e6 for _, v in items][::-1])
    ax.set_xlabel("MB")
    ax.set_title(f"bytes by tensor kind ({Path(report.path).name})")
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def plot_layer_check(results: dict[str, dict[str, float]], path: str | os.PathLike, title: str = "") -> Path:
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()

    names = list(results)
    vals = [max(results[n]["cos_diff"], 1e-16) for n in names]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(names, vals, color=["tab:green" if "gguf" in n else "tab:red" for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("cosine difference vs reference")
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
