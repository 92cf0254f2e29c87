"""Measurements that answer the DSA bring-up questions, on any `ReferenceModel` (tiny or a real GGUF).

- `selection_recall`: how much dense attention probability the indexer's top-k keeps, per layer.
- `dense_vs_sparse`: the output error of switching the indexer off (exactly 0 while T <= index_topk).
- `rope_layout_recall` / `detect_indexer_rope_layout`: interleaved vs NeoX indexer RoPE.
- `fp8_indexer_effect`: top-k picks flipped by e4m3 indexer q/k (with / without the Hadamard rotation).
- `indexshare_effect`: top-k overlap between consecutive layers and the error of reusing a previous selection.

Conventions. Attention "mass" is the head-averaged dense causal softmax, so it sums to 1 over the keys a query
sees. Queries that see no more than top-k keys lose nothing and are left out of every average (the question is
what happens beyond top-k). Unless said otherwise the model runs dense (indexer picks computed, not applied),
so each layer is judged on the same hidden states; `dense_vs_sparse` measures the end-to-end effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from glm5lib.model.indexer import causal_mask, select_topk, selection_mask
from glm5lib.model.reference import DSAOptions, ReferenceModel, Trace
from glm5lib.model.rope import ROPE_LAYOUTS


@dataclass
class LayerSelection:
    """One layer's dense attention and indexer scores for one sequence (queries t, keys s)."""

    attn: torch.Tensor  # [T, S] head-mean dense causal probabilities
    attn_heads: torch.Tensor  # [H, T, S]
    index_scores: torch.Tensor  # [T, S], -inf outside the causal range
    allowed: torch.Tensor  # [T, S] bool

    def picks(self, k: int, tie_break: str = "stable") -> torch.Tensor:
        return selection_mask(select_topk(self.index_scores, self.allowed, k, tie_break=tie_break), self.allowed)

    def dense_picks(self, k: int) -> torch.Tensor:
        """The k keys with the most dense attention (the oracle selection)."""
        return selection_mask(select_topk(self.attn, self.allowed, k), self.allowed)

    def beyond(self, k: int) -> torch.Tensor:
        """[T] bool: queries that see more than k keys."""
        return self.allowed.sum(-1) > k


def collect(model: ReferenceModel, input_ids, *, options: DSAOptions | None = None) -> dict[int, LayerSelection]:
    """Run dense (unless `options` says otherwise) and keep, per layer with an indexer, attention and index scores."""
    options = options or DSAOptions(dense=True)
    trace = Trace(("index_scores", "attn_probs"))
    with torch.no_grad():
        model.forward(input_ids, options=options, trace=trace)
    out = {}
    for i, d in sorted(trace.layers.items()):
        if "index_scores" not in d:
            continue  # shared layer: no indexer
        probs = d["attn_probs"]
        T, S = probs.shape[1:]
        out[i] = LayerSelection(probs.mean(0), probs, d["index_scores"], causal_mask(torch.arange(S - T, S), S))
    return out


def _mean(values: list[torch.Tensor]) -> float:
    v = torch.cat([x.flatten() for x in values]) if values else torch.zeros(0)
    return float(v.mean()) if v.numel() else float("nan")


def mass_recall(sel: LayerSelection, k: int, *, heads: bool = False) -> torch.Tensor:
    """Per query beyond k: dense attention mass that falls on the indexer's top-k ([T'] or [H, T'] per head)."""
    picks, rows = sel.picks(k), sel.beyond(k)
    if heads:
        return (sel.attn_heads * picks).sum(-1)[:, rows]
    return (sel.attn * picks).sum(-1)[rows]


def oracle_mass(sel: LayerSelection, k: int) -> torch.Tensor:
    """The best any k-key selection can keep (the dense top-k by attention), per query beyond k."""
    return (sel.attn * sel.dense_picks(k)).sum(-1)[sel.beyond(k)]


def set_recall(sel: LayerSelection, k: int) -> torch.Tensor:
    """Per query beyond k: |indexer top-k & dense top-k| / k."""
    rows = sel.beyond(k)
    return (sel.picks(k) & sel.dense_picks(k)).sum(-1)[rows].float() / k


def selection_recall(model: ReferenceModel, sequences: Iterable, *, topks: Sequence[int] | None = None,
                     options: DSAOptions | None = None) -> dict[str, dict]:
    """{"mass": {layer: {k: mean}}, "oracle": ..., "set": ...} averaged over sequences and queries beyond k."""
    topks = list(topks or [model.cfg.index_topk])
    acc: dict[str, dict[int, dict[int, list]]] = {"mass": {}, "oracle": {}, "set": {}}
    for ids in sequences:
        for layer, sel in collect(model, ids, options=options).items():
            for k in topks:
                acc["mass"].setdefault(layer, {}).setdefault(k, []).append(mass_recall(sel, k))
                acc["oracle"].setdefault(layer, {}).setdefault(k, []).append(oracle_mass(sel, k))
                acc["set"].setdefault(layer, {}).setdefault(k, []).append(set_recall(sel, k))
    return {m: {layer: {k: _mean(v) for k, v in ks.items()} for layer, ks in d.items()} for m, d in acc.items()}


def logit_error(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """max |a - b| over logits, mean KL(softmax a || softmax b) per position, argmax agreement."""
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    kl = (la.exp() * (la - lb)).sum(-1)
    return {"max_abs": float((a - b).abs().max()), "mean_kl": float(kl.mean()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def dense_vs_sparse(model: ReferenceModel, sequences_by_length: dict[int, list]) -> dict[int, dict[str, float]]:
    """Per context length T: logit error of the dense model against the sparse (DSA) one, over its sequences."""
    out = {}
    with torch.no_grad():
        for T, seqs in sorted(sequences_by_length.items()):
            errs = [logit_error(model.forward(ids, options=DSAOptions(dense=True)), model.forward(ids))
                    for ids in seqs]
            out[T] = {key: max(e[key] for e in errs) if key == "max_abs" else sum(e[key] for e in errs) / len(errs)
                      for key in errs[0]}
            out[T]["exact"] = all(e["max_abs"] == 0.0 for e in errs)
    return out


def rope_layout_recall(model: ReferenceModel, sequences: Iterable, k: int | None = None) -> dict[str, dict[int, float]]:
    """Attention-mass recall per layer with the indexer's RoPE applied interleaved vs NeoX."""
    seqs = list(sequences)
    k = k or model.cfg.index_topk
    return {layout: {layer: v[k] for layer, v in selection_recall(
        model, seqs, topks=[k], options=DSAOptions(dense=True, indexer_rope=layout))["mass"].items()}
        for layout in ROPE_LAYOUTS}


def detect_indexer_rope_layout(model: ReferenceModel, sequences: Iterable, k: int | None = None
                               ) -> tuple[str, dict[str, float]]:
    """Which RoPE layout the indexer weights were trained with: the one whose top-k keeps more of the model's own
    dense attention. Give sequences longer than top-k (ideally real text). Returns (layout, mean recall by layout)."""
    per_layout = {layout: sum(v.values()) / len(v) for layout, v in rope_layout_recall(model, sequences, k).items()}
    return max(per_layout, key=per_layout.get), per_layout


def convert_indexer_rope_layout(weights: dict[str, torch.Tensor], cfg, *, to: str = "neox") -> dict[str, torch.Tensor]:
    """Weights whose indexer, run with RoPE layout `to`, scores exactly as the given weights do with the other
    layout. Permutes the rope rows of every layer's `wq_b` (per index head) and `wk` and the matching entries of
    `k_norm` (LayerNorm is permutation-equivariant). Use it when a checkpoint's indexer layout does not match
    the engine's (e.g. `detect_indexer_rope_layout` says "neox" but the engine applies interleaved RoPE)."""
    from glm5lib.model.rope import deinterleave_permutation

    R, Di, Hi = cfg.qk_rope_head_dim, cfg.index_head_dim, cfg.index_n_heads
    perm = deinterleave_permutation(R)
    if to == "interleaved":
        perm = torch.argsort(perm)  # the inverse: re-interleave
    elif to != "neox":
        raise ValueError(f"to must be 'neox' or 'interleaved', got {to!r}")
    full = torch.cat([perm, torch.arange(R, Di)])  # the pass-through dims stay put
    out = dict(weights)
    for name, t in weights.items():
        if name.endswith("self_attn.indexer.wq_b.weight"):
            out[name] = t.view(Hi, Di, -1)[:, full].reshape(t.shape).contiguous()
        elif name.endswith(("self_attn.indexer.wk.weight", "self_attn.indexer.k_norm.weight",
                            "self_attn.indexer.k_norm.bias")):
            out[name] = t[full].contiguous()
    return out


def fp8_indexer_effect(model: ReferenceModel, sequences: Iterable) -> dict[str, dict]:
    """Per fp8 mode: fraction of top-k picks that change vs fp32 (per layer), mass recall, and the logit error of
    the sparse model run with fp8 indexer q/k against fp32."""
    seqs = list(sequences)
    k = model.cfg.index_topk
    base = [collect(model, ids) for ids in seqs]
    out: dict[str, dict] = {}
    with torch.no_grad():
        ref_logits = [model.forward(ids) for ids in seqs]
        for mode in ("e4m3", "e4m3_hadamard"):
            flips: dict[int, list] = {}
            recall: dict[int, list] = {}
            errs = []
            for ids, b, ref_l in zip(seqs, base, ref_logits):
                q = collect(model, ids, options=DSAOptions(dense=True, indexer_fp8=mode))
                for layer, sel in q.items():
                    rows = sel.beyond(k)
                    changed = (sel.picks(k) & ~b[layer].picks(k)).sum(-1)[rows].float() / k
                    flips.setdefault(layer, []).append(changed)
                    recall.setdefault(layer, []).append(mass_recall(sel, k))
                errs.append(logit_error(model.forward(ids, options=DSAOptions(indexer_fp8=mode)), ref_l))
            out[mode] = {
                "flipped": {layer: _mean(v) for layer, v in flips.items()},
                "mass_recall": {layer: _mean(v) for layer, v in recall.items()},
                "max_abs_logit": max(e["max_abs"] for e in errs),
                "mean_kl": sum(e["mean_kl"] for e in errs) / len(errs),
            }
    return out


def share_pattern(num_layers: int, every: int) -> tuple[str, ...]:
    """IndexShare-style pattern: layer i runs its indexer when i % every == 0, else reuses the last full layer."""
    return tuple("full" if i % every == 0 else "shared" for i in range(num_layers))


def topk_overlap(model: ReferenceModel, sequences: Iterable) -> dict[str, float]:
    """|top-k(layer i) & top-k(layer i+1)| / k between consecutive indexer layers, queries beyond k."""
    k = model.cfg.index_topk
    acc: dict[str, list] = {}
    for ids in sequences:
        sel = collect(model, ids)
        layers = sorted(sel)
        for a, b in zip(layers, layers[1:]):
            rows = sel[a].beyond(k)
            acc.setdefault(f"{a}-{b}", []).append((sel[a].picks(k) & sel[b].picks(k)).sum(-1)[rows].float() / k)
    return {pair: _mean(v) for pair, v in acc.items()}


def indexshare_effect(model: ReferenceModel, sequences: Iterable, everies: Sequence[int] = (2, 4)
                      ) -> dict[str, dict]:
    """Logit error of reusing the previous full layer's top-k on all but every N-th layer, vs every layer's own."""
    seqs = list(sequences)
    n = model.cfg.num_hidden_layers
    out = {}
    with torch.no_grad():
        base = [model.forward(ids) for ids in seqs]
        for every in everies:
            pattern = share_pattern(n, every)
            errs = [logit_error(model.forward(ids, options=DSAOptions(indexer_types=pattern)), b)
                    for ids, b in zip(seqs, base)]
            out[f"every_{every}"] = {"pattern": "".join("F" if p == "full" else "S" for p in pattern),
                                     "max_abs_logit": max(e["max_abs"] for e in errs),
                                     "mean_kl": sum(e["mean_kl"] for e in errs) / len(errs),
                                     "argmax_agree": sum(e["argmax_agree"] for e in errs) / len(errs)}
    return out
