"""Layout proof: run one attention layer (with its DSA indexer) from GGUF-derived weights and from the HF reference.

A wrong kv_b/W_UK/W_UV orientation loads without complaint (the shapes fit) and only shows as garbage output,
so names and shapes are not enough. On the same input x (a normed hidden state) and positions this computes:

- `reference`: transformers' `GlmMoeDsaAttention` (with its `GlmMoeDsaIndexer`) holding the original HF weights.
- `hf_from_gguf`: the same module holding the weights `GGUFHFWeights` rebuilt from the GGUF (kv_b_proj merged
  from attn_k_b/attn_v_b). Exact (0) for an F32 file, quantization noise otherwise.
- `absorbed_from_gguf`: the absorbed MLA form a sparse kernel runs (docs/glm5.md section 2), fed *directly* with
  the stored `attn_k_b` [H, r, nope] and `attn_v_b` [H, v, r]: q_hat = q_nope @ k_b^T, o = v_b @ o_lat. This is
  the check that the GGUF tensors mean what the kernels assume.
- `indexer`: GGUF-derived indexer scores and top-k vs the reference's.
- broken mappings, each loaded into the HF module (all load: the shapes fit), to show the size of a real bug:
  `k_b_not_transposed` (attn_k_b's bytes read as [H, nope, r] without the transpose), `kv_swapped` (v rows
  before k rows in each head), `kv_b_blocked` (all heads' k rows, then all heads' v rows).

Errors are `max|a - ref| / max|ref|` and FlashMLA's cosine difference `1 - 2<a,b>/(<a,a>+<b,b>)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

from glm5lib.model.metrics import cos_diff  # FlashMLA's metric, one definition for all checks
from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.source import open_model, read_tensor
from glm5lib.mapping.weights import GGUFHFWeights
from glm5lib.model.layout import merge_kv_b
from glm5lib.model.reference import SafetensorsWeights
from glm5lib.model.spec import GLM5Config

BROKEN = ("k_b_not_transposed", "kv_swapped", "kv_b_blocked")


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


# ---- the HF reference module ---------------------------------------------------------------------------------------


def _hf_config(cfg: GLM5Config):
    from transformers import GlmMoeDsaConfig

    d = cfg.replace(torch_dtype="float32").to_hf_dict()
    d.pop("architectures", None)
    d.pop("model_type", None)
    hc = GlmMoeDsaConfig(**d)
    hc._attn_implementation = "eager"
    return hc


def build_attention(cfg: GLM5Config, layer: int, weights: dict[str, torch.Tensor]):
    """transformers' GlmMoeDsaAttention for `layer`, fp32, with `weights` (HF names, `model.layers.{layer}.` prefix)."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaAttention

    module = GlmMoeDsaAttention(_hf_config(cfg), layer).float().eval()
    prefix = f"model.layers.{layer}.self_attn."
    state = {k[len(prefix):]: v.float() for k, v in weights.items() if k.startswith(prefix)}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"layer {layer}: missing {missing}, unexpected {unexpected}")
    return module


def _inputs(cfg: GLM5Config, seq_len: int, seed: int):
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaRotaryEmbedding

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, seq_len, cfg.hidden_size, generator=gen)
    pos = torch.arange(seq_len)[None]
    cos, sin = GlmMoeDsaRotaryEmbedding(_hf_config(cfg))(x, pos)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, seq_len, seq_len).masked_fill(~causal, torch.finfo(torch.float32).min)
    return x, pos, (cos, sin), mask


def run_attention(module, x, pos, cos_sin, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention output [T, D], top-k indices [T, k]) of one transformers attention layer."""
    with torch.no_grad():
        out, _, topk = module(x, cos_sin, mask, position_ids=pos)
    return out[0], topk[0]


def run_indexer_scores(module, x, cos_sin, mask) -> torch.Tensor:
    """The indexer's causal scores [T, T] (fp32), recomputed from the module's weights the way it computes them."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

    ix = module.indexer
    with torch.no_grad():
        q_resid = module.q_a_layernorm(module.q_a_proj(x))
        T = x.shape[1]
        q = ix.wq_b(q_resid).view(1, T, ix.n_heads, ix.head_dim)
        k = ix.k_norm(ix.wk(x)).unsqueeze(2)
        r = ix.qk_rope_head_dim
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q[..., :r], k[..., :r], *cos_sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q[..., r:]], -1)
        k = torch.cat([k_rot, k[..., r:]], -1).squeeze(2)
        s = torch.relu(torch.einsum("bthd,bsd->bths", q.float(), k.float()) * ix.softmax_scale)
        w = ix.weights_proj(x).float() * ix.n_heads**-0.5
        scores = torch.einsum("bth,bths->bts", w, s)[0]
    return scores + mask[0, 0]


# ---- the absorbed form, fed with GGUF tensors in their stored layout ------------------------------------------------


def absorbed_attention(cfg: GLM5Config, g: Callable[[str], torch.Tensor], layer: int, x: torch.Tensor,
                       cos_sin, mask: torch.Tensor, topk: torch.Tensor) -> torch.Tensor:
    """Absorbed MLA over the selected keys, reading GGUF tensors by name (`g(gguf_name)`, torch order, fp32).

    attn_k_b [H, r, nope] multiplies q_nope into latent space; attn_v_b [H, v, r] maps the latent output back."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

    b = f"blk.{layer}."
    H, nope, r, rope = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    x = x[0]
    T = x.shape[0]

    def rms(v, w, eps=1e-6):  # q_a/kv_a norms: transformers' RMSNorm default eps
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w

    q_resid = rms(x @ g(b + "attn_q_a.weight").T, g(b + "attn_q_a_norm.weight"))
    q = (q_resid @ g(b + "attn_q_b.weight").T).view(T, H, nope + rope)
    kv = x @ g(b + "attn_kv_a_mqa.weight").T
    c_kv = rms(kv[:, :r], g(b + "attn_kv_a_norm.weight"))  # [T, r]: the cached latent, also the value
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q[None, :, :, nope:].transpose(1, 2),
                                                   kv[None, None, :, r:], *cos_sin)
    q_rot, k_rot = q_rot[0].transpose(0, 1), k_rot[0, 0]  # [T, H, rope], [T, rope]
    q_hat = torch.einsum("thn,hrn->thr", q[:, :, :nope], g(b + "attn_k_b.weight"))  # W_UK absorbed: [T, H, r]
    scores = (torch.einsum("thr,sr->hts", q_hat, c_kv) + torch.einsum("thp,sp->hts", q_rot, k_rot)) \
        * cfg.softmax_scale
    keep = torch.zeros(T, T, dtype=torch.bool).scatter(-1, topk.long(), True) & (mask[0, 0] == 0)
    p = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    o_lat = torch.einsum("hts,sr->thr", p, c_kv)  # [T, H, r]
    o = torch.einsum("thr,hvr->thv", o_lat, g(b + "attn_v_b.weight"))  # W_UV: [T, H, v]
    return o.reshape(T, -1) @ g(b + "attn_output.weight").T


# ---- broken mappings -----------------------------------------------------------------------------------------------


def broken_kv_b(variant: str, k_b: torch.Tensor, v_b: torch.Tensor, cfg: GLM5Config) -> torch.Tensor:
    """kv_b_proj as a buggy loader would build it from GGUF attn_k_b [H, r, nope] and attn_v_b [H, v, r]."""
    H, nope, v, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if variant == "k_b_not_transposed":  # bytes reinterpreted as [H, nope, r] instead of transposed
        return torch.cat([k_b.reshape(H, nope, r), v_b], dim=1).reshape(H * (nope + v), r)
    if variant == "kv_swapped":  # per head [v | k] instead of [k | v]
        return torch.cat([v_b, k_b.transpose(1, 2)], dim=1).reshape(H * (nope + v), r)
    if variant == "kv_b_blocked":  # all heads' k rows, then all heads' v rows
        return torch.cat([k_b.transpose(1, 2).reshape(H * nope, r), v_b.reshape(H * v, r)], dim=0)
    raise ValueError(f"unknown variant {variant!r}; choose from {BROKEN}")


# ---- the check ------------------------------------------------------------------------------------------------------


@dataclass
class LayerCheck:
    layer: int
    seq_len: int
    index_topk: int
    results: dict[str, dict[str, float]]  # name -> {"rel_err", "cos_diff"}
    indexer: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "seq_len": self.seq_len, "index_topk": self.index_topk,
                "results": self.results, "indexer": self.indexer}

    def format_text(self) -> str:
        lines = [f"layer {self.layer}, T={self.seq_len}, index_topk={self.index_topk}: error vs transformers "
                 f"reference (HF weights)"]
        for name, r in self.results.items():
            lines.append(f"  {name:24s} rel_err {r['rel_err']:.3e}  cos_diff {r['cos_diff']:.3e}")
        ix = self.indexer
        lines.append(f"  indexer scores rel_err {ix['scores_rel_err']:.3e}; top-k agreement {ix['topk_agreement']:.4f}")
        return "\n".join(lines)


def _hf_layer_weights(hf_dir: str | os.PathLike, layer: int) -> dict[str, torch.Tensor]:
    """The HF checkpoint's attention tensors of `layer` (float32); only the shards that hold them are opened."""
    hf = SafetensorsWeights(hf_dir)
    prefix = f"model.layers.{layer}.self_attn."
    return {k: hf(k) for k in hf.weight_map if k.startswith(prefix)}


def layer_check(gguf_path: str | os.PathLike, hf_dir: str | os.PathLike, *, layer: int | None = None,
                seq_len: int | None = None, seed: int = 0, broken: tuple[str, ...] = BROKEN) -> LayerCheck:
    """Compare one attention layer run from the GGUF with transformers' run from `hf_dir` (see module doc).

    `layer` defaults to the first MoE layer; `seq_len` to 1.5 x index_topk so the indexer really selects."""
    gs = open_model(gguf_path)
    gs.check_readable()  # before the reference run: a file whose data cannot be read fails at once
    cfg = config_from_gguf(gs)
    layer = cfg.first_k_dense_replace if layer is None else layer
    if not cfg.has_indexer(layer):
        raise ValueError(f"layer {layer} is an IndexShare 'shared' layer without its own indexer; pick a full layer")
    seq_len = seq_len or (cfg.index_topk * 3) // 2
    x, pos, cos_sin, mask = _inputs(cfg, seq_len, seed)

    ref_module = build_attention(cfg, layer, _hf_layer_weights(hf_dir, layer))
    ref_out, ref_topk = run_attention(ref_module, x, pos, cos_sin, mask)

    cache: dict[str, torch.Tensor] = {}

    def g(name: str) -> torch.Tensor:  # GGUF tensors by GGUF name, each dequantized once
        if name not in cache:
            cache[name] = read_tensor(gs, name, torch.float32)
        return cache[name]

    # GGUF -> HF weights of this layer's attention only (its experts and other layers are never read);
    # kv_b_proj is merged from the k_b/v_b that the absorbed form and the broken variants also use.
    prefix = f"model.layers.{layer}.self_attn."
    kv_b_name = prefix + "kv_b_proj.weight"
    w = GGUFHFWeights(gs, torch.float32)
    gguf_w = {k: w(k) for k in w.keys() if k.startswith(prefix) and k != kv_b_name}
    k_b, v_b = g(f"blk.{layer}.attn_k_b.weight"), g(f"blk.{layer}.attn_v_b.weight")
    gguf_w[kv_b_name] = merge_kv_b(k_b, v_b, cfg)
    results: dict[str, dict[str, float]] = {}

    def score(name: str, out: torch.Tensor) -> None:
        results[name] = {"rel_err": rel_err(out, ref_out), "cos_diff": cos_diff(out, ref_out)}

    gg_module = build_attention(cfg, layer, gguf_w)
    gg_out, gg_topk = run_attention(gg_module, x, pos, cos_sin, mask)
    score("hf_from_gguf", gg_out)

    with torch.no_grad():
        score("absorbed_from_gguf", absorbed_attention(cfg, g, layer, x, cos_sin, mask, ref_topk))

    for variant in broken:
        w = dict(gguf_w)
        w[prefix + "kv_b_proj.weight"] = broken_kv_b(variant, k_b, v_b, cfg)
        bad_out, _ = run_attention(build_attention(cfg, layer, w), x, pos, cos_sin, mask)
        score(variant, bad_out)

    ref_scores = run_indexer_scores(ref_module, x, cos_sin, mask)
    gg_scores = run_indexer_scores(gg_module, x, cos_sin, mask)
    causal = mask[0, 0] == 0  # masked entries hold finfo.min, not -inf
    k = ref_topk.shape[-1]
    # agreement counts only causal picks (the rest of a row's top-k are -inf ties)
    agree = []
    for t in range(seq_len):
        n = min(k, t + 1)
        a = set(ref_topk[t].tolist()) & set(range(t + 1))
        b = set(gg_topk[t].tolist()) & set(range(t + 1))
        agree.append(len(a & b) / n)
    indexer = {
        "scores_rel_err": rel_err(gg_scores[causal], ref_scores[causal]),
        "topk_agreement": sum(agree) / len(agree),
    }
    return LayerCheck(layer, seq_len, cfg.index_topk, results, indexer)

