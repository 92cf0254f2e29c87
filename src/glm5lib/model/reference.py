"""A readable GLM-5 forward in plain PyTorch (fp32): the reference everything else is compared with.

    from glm5lib.model.reference import ReferenceModel, DSAOptions, Trace, KVCache

    ref = ReferenceModel.from_hf_dir("path/to/hf")        # safetensors, lazily read
    ref = glm5lib.mapping.reference_from_gguf("m-00001-of-00009.gguf", stream=True)  # any shard; one layer in RAM
    logits = ref.forward(input_ids)                      # [T, V] float32 (input_ids: [T] or [1, T])
    logp = ref.logprobs(input_ids)                       # [T, V] log-softmax
    tokens, token_logprobs = ref.generate_greedy(prompt_ids, max_new_tokens=16)   # KV + indexer caches

    # analysis knobs (glm5lib.dsa uses them)
    ref.forward(ids, options=DSAOptions(dense=True))                  # indexer off: dense causal MLA
    ref.forward(ids, options=DSAOptions(indexer_rope="neox"))         # the classic port bug
    ref.forward(ids, options=DSAOptions(indexer_fp8="e4m3_hadamard")) # fp8 indexer q/k
    ref.forward(ids, options=DSAOptions(indexer_types=("full", "shared", "full")))  # IndexShare
    ref.forward(ids, options=DSAOptions(tie_break="torch"))           # break index-score ties as torch.topk
    tr = Trace(("topk", "index_scores", "attn_probs")); ref.forward(ids, trace=tr); tr.layers[1]["topk"]

Index-score ties are exact and common (ReLU zeros). By default the earlier key wins ("stable"), which keeps
prefill + decode equal to a full forward; transformers uses `torch.topk`, whose order among ties depends on
the sequence length. With tie_break="torch" the reference selects exactly what transformers selects
(tests/test_reference.py). vLLM's top-k kernels make their own choice among ties: compare selections as sets
and count differences at tied scores rather than expecting identity.

Weights are taken by HF checkpoint name (per-expert `mlp.experts.{e}.*`, fused `kv_b_proj`) from a
`Mapping[str, Tensor]` or a callable `get(name) -> Tensor`, so the same code runs from a dict, an HF directory
or a GGUF shard set (`glm5lib.mapping.reference.GGUFWeights`: lazy dequantization, `rows()` for embeddings).
With `stream=True` a layer's weights are fetched when the layer runs and dropped after it (routed experts one
at a time, only those the router picked), so the first layers of the real 744B model run in a few GB.

The math (docs/glm5.md sections 2-3), per layer, for x = input_layernorm(h):
- q_resid = RMSNorm(W_qa x) [eps 1e-6, as transformers]; q = W_qb q_resid -> [H, nope 192 | rope 64].
- W_kva x -> [c_kv 512 | k_rot 64]; c_kv = RMSNorm(c_kv) [eps 1e-6]; q_rot, k_rot get interleaved RoPE.
- absorbed MLA: q_hat = [q_nope @ W_UK (512) | q_rot (64)], kv_hat[s] = [c_kv | k_rot] (576, one shared
  "head", the cached row); p = softmax(q_hat . kv_hat * (nope+rope)^-0.5) over the causal, selected keys;
  o = W_UV (p @ c_kv); out = o_proj(o).
- DSA indexer (glm5lib.model.indexer) picks min(index_topk, S) keys per query; "shared" layers (GLM-5.2
  IndexShare) reuse the previous full layer's picks.
- MLP: SwiGLU on the first `first_k_dense_replace` layers, else sigmoid noaux_tc routing (bias for choice
  only, weights renormalised, x routed_scaling_factor) over routed experts plus the shared expert.
The MTP ("nextn") layer is not part of the forward (transformers does not run it either).

Incremental decoding: pass a `KVCache` (`ref.new_cache()`); each call appends the new tokens' kv rows and
indexer keys, so prefill followed by token-by-token calls equals one full forward.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from glm5lib.model.indexer import (Fp8Mode, causal_mask, indexer_scores, quantize_indexer_qk, select_topk,
                                 selection_mask)
from glm5lib.errors import UserError
from glm5lib.model.rope import RopeLayout, apply_rope, rope_cos_sin
from glm5lib.model.spec import GLM5Config, gguf_tensor_specs
from glm5lib.progress import show_progress

WeightGetter = Callable[[str], torch.Tensor]
# transformers builds q_a_layernorm / kv_a_layernorm with the RMSNorm default eps, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6
INDEXER_K_NORM_EPS = 1e-6
TRACE_KEYS = ("topk", "index_scores", "attn_probs", "hidden", "attn_out")


# ---- options, traces, caches -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DSAOptions:
    """How the sparse attention runs. The defaults are GLM-5 as trained."""

    dense: bool = False  # indexer off: every layer attends to all causal keys
    index_topk: int | None = None  # override cfg.index_topk
    indexer_rope: RopeLayout = "interleaved"  # "neox" reproduces the common port bug
    indexer_fp8: Fp8Mode | None = None  # e4m3 indexer q/k, optionally Hadamard-rotated first
    indexer_types: tuple[str, ...] | None = None  # per layer "full"/"shared"; None: the config's
    tie_break: str = "stable"  # exact index-score ties: "stable" (earlier key wins) or "torch" (torch.topk)


@dataclass
class Trace:
    """What to capture per layer: any of TRACE_KEYS.
    topk [T, k] (int64; picks outside the causal range can appear when S < k), index_scores [T, S] (causal-masked
    with -inf), attn_probs [H, T, S] dense causal softmax (before the top-k mask), hidden [T, D] (layer input),
    attn_out [T, D] (attention output). `seconds[i]` is the wall time of layer i."""

    capture: tuple[str, ...] = ()
    layers: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)

    def __post_init__(self):
        bad = set(self.capture) - set(TRACE_KEYS)
        if bad:
            raise ValueError(f"unknown trace keys {sorted(bad)}; expected some of {TRACE_KEYS}")

    def wants(self, key: str) -> bool:
        return key in self.capture

    def put(self, layer: int, key: str, value: torch.Tensor) -> None:
        if key in self.capture:
            self.layers.setdefault(layer, {})[key] = value


@dataclass
class KVCache:
    """Per layer: absorbed-MLA rows [S, 576] = [c_kv | k_rot], and indexer keys [S, index_head_dim]."""

    kv: dict[int, torch.Tensor] = field(default_factory=dict)
    index_k: dict[int, torch.Tensor] = field(default_factory=dict)
    length: int = 0

    @staticmethod
    def _append(store: dict[int, torch.Tensor], layer: int, rows: torch.Tensor) -> torch.Tensor:
        old = store.get(layer)
        store[layer] = rows if old is None else torch.cat([old, rows], 0)
        return store[layer]


# ---- weight sources ----------------------------------------------------------------------------------------------


def as_getter(weights: Mapping[str, torch.Tensor] | WeightGetter) -> WeightGetter:
    if callable(weights) and not isinstance(weights, Mapping):
        return weights
    return weights.__getitem__  # type: ignore[union-attr]


class SafetensorsWeights:
    """Lazy HF-directory reader: `get(name)` opens the shard that holds `name` (model.safetensors.index.json)."""

    def __init__(self, hf_dir: str | Path):
        from safetensors import safe_open

        self._safe_open = safe_open
        self.dir = Path(hf_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            self.weight_map = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise UserError(f"{self.dir}: no safetensors files")
            self.weight_map = {}
            for f in files:
                with safe_open(str(f), "pt") as h:
                    self.weight_map.update({k: f.name for k in h.keys()})

    def __call__(self, name: str) -> torch.Tensor:
        try:
            fname = self.weight_map[name]
        except KeyError:
            raise KeyError(f"{self.dir}: no tensor {name!r}") from None
        with self._safe_open(str(self.dir / fname), "pt") as h:
            return h.get_tensor(name).float()


class _LayerWeights:
    """A layer's tensors by short name ('self_attn.q_a_proj.weight'); fetched on first use."""

    def __init__(self, get: WeightGetter, layer: int, keep: dict[str, torch.Tensor] | None):
        self.get, self.prefix = get, f"model.layers.{layer}."
        self.store = keep if keep is not None else {}

    def __getitem__(self, short: str) -> torch.Tensor:
        name = self.prefix + short
        if name not in self.store:
            self.store[name] = self.get(name).float()
        return self.store[name]

    def expert(self, e: int, proj: str, keep: bool) -> torch.Tensor:
        name = f"{self.prefix}mlp.experts.{e}.{proj}_proj.weight"
        if name in self.store:
            return self.store[name]
        t = self.get(name).float()
        if keep:
            self.store[name] = t
        return t


# ---- the model -------------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


class ReferenceModel:
    """GLM-5 forward over HF-named weights. See the module docstring for the API."""

    def __init__(self, cfg: GLM5Config, weights: Mapping[str, torch.Tensor] | WeightGetter, *,
                 stream: bool = False, progress: bool = False):
        self.cfg = cfg
        self.get = as_getter(weights)
        self.stream = stream  # True: hold one layer's weights at a time
        self.progress = progress
        self._resident: dict[str, torch.Tensor] = {}

    # -- constructors --
    @classmethod
    def from_hf_dir(cls, path: str | Path, **kw) -> "ReferenceModel":
        path = Path(path)
        if not (path / "config.json").exists():
            raise UserError(f"{path}: no config.json (not a Hugging Face model directory)")
        cfg = GLM5Config.from_hf_dict(json.loads((path / "config.json").read_text()))
        return cls(cfg, SafetensorsWeights(path), **kw)

    # -- weights --
    def _global(self, name: str) -> torch.Tensor:
        if name not in self._resident:
            self._resident[name] = self.get(name).float()
        return self._resident[name]

    def layer_weights(self, i: int) -> _LayerWeights:
        return _LayerWeights(self.get, i, None if self.stream else self._resident)

    def new_cache(self) -> KVCache:
        return KVCache()

    # -- pieces --
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        name = "model.embed_tokens.weight"
        if self.stream and hasattr(self.get, "rows"):  # only the rows asked for, not the whole table
            return self.get.rows(name, ids).float()
        if self.stream:
            return self.get(name).float()[ids]
        return self._global(name)[ids]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        h = rms_norm(h, self._weight_global("model.norm.weight"), self.cfg.rms_norm_eps)
        return h @ self._weight_global("lm_head.weight").T

    def _weight_global(self, name: str) -> torch.Tensor:
        return self.get(name).float() if self.stream else self._global(name)

    def layer_types(self, options: DSAOptions) -> tuple[str, ...]:
        if options.indexer_types is not None:
            if len(options.indexer_types) != self.cfg.num_hidden_layers:
                raise ValueError("indexer_types needs one entry per trunk layer")
            return tuple(options.indexer_types)
        return tuple("full" if self.cfg.has_indexer(i) else "shared" for i in range(self.cfg.num_hidden_layers))

    def indexer(self, w: _LayerWeights, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, layer: int, cache: KVCache | None, options: DSAOptions) -> torch.Tensor:
        """Index scores [T, S] (unmasked) of this layer's lightning indexer; appends the keys to the cache."""
        cfg = self.cfg
        T, Hi, Di, R = x.shape[0], cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        q = (q_resid @ w["self_attn.indexer.wq_b.weight"].T).view(T, Hi, Di)
        k = F.layer_norm(x @ w["self_attn.indexer.wk.weight"].T, (Di,), w["self_attn.indexer.k_norm.weight"],
                         w["self_attn.indexer.k_norm.bias"], INDEXER_K_NORM_EPS)
        # rope part first (0:64), the rest passes (docs/glm5.md section 3)
        q = torch.cat([apply_rope(q[..., :R], cos, sin, options.indexer_rope), q[..., R:]], -1)
        k = torch.cat([apply_rope(k[..., :R], cos, sin, options.indexer_rope), k[..., R:]], -1)
        if cache is not None:
            k = KVCache._append(cache.index_k, layer, k)
        weights = (x @ w["self_attn.indexer.weights_proj.weight"].float().T) * Hi**-0.5
        q, k = quantize_indexer_qk(q, k, options.indexer_fp8)
        return indexer_scores(q, k, weights, Di**-0.5)

    def attention(self, w: _LayerWeights, x: torch.Tensor, pos: torch.Tensor, layer: int, cache: KVCache | None,
                  options: DSAOptions, prev_topk: torch.Tensor | None, layer_type: str,
                  trace: Trace | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Absorbed MLA with DSA selection. Returns (output [T, D], this layer's top-k or None)."""
        cfg = self.cfg
        T, H = x.shape[0], cfg.num_attention_heads
        nope, R, r, V = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
        cos, sin = rope_cos_sin(pos, R, cfg.rope_theta)

        q_resid = rms_norm(x @ w["self_attn.q_a_proj.weight"].T, w["self_attn.q_a_layernorm.weight"], LATENT_NORM_EPS)
        q = (q_resid @ w["self_attn.q_b_proj.weight"].T).view(T, H, cfg.qk_head_dim)
        q_nope, q_rot = q[..., :nope], apply_rope(q[..., nope:], cos, sin)
        ckv = x @ w["self_attn.kv_a_proj_with_mqa.weight"].T
        c_kv = rms_norm(ckv[:, :r], w["self_attn.kv_a_layernorm.weight"], LATENT_NORM_EPS)
        k_rot = apply_rope(ckv[:, r:], cos, sin)

        kv_b = w["self_attn.kv_b_proj.weight"].view(H, nope + V, r)
        w_uk, w_uv = kv_b[:, :nope, :], kv_b[:, nope:, :]
        q_hat = torch.cat([torch.einsum("thn,hnc->thc", q_nope, w_uk), q_rot], -1)  # [T, H, 576]
        kv = torch.cat([c_kv, k_rot], -1)  # [T, 576]: the cached row
        if cache is not None:
            kv = KVCache._append(cache.kv, layer, kv)
        S = kv.shape[0]
        allowed = causal_mask(pos, S)

        # DSA selection
        topk = None
        want_index = trace is not None and (trace.wants("topk") or trace.wants("index_scores"))
        if layer_type == "full" and (not options.dense or want_index or cache is not None):  # fill the key cache
            scores = self.indexer(w, x, q_resid, cos, sin, layer, cache, options)
            topk = select_topk(scores, allowed, options.index_topk or cfg.index_topk, tie_break=options.tie_break)
            if trace is not None:
                trace.put(layer, "index_scores", scores.masked_fill(~allowed, float("-inf")))
        elif layer_type == "shared":
            topk = prev_topk
        if trace is not None and topk is not None:
            trace.put(layer, "topk", topk)

        logits = torch.einsum("thc,sc->hts", q_hat, kv) * cfg.softmax_scale  # [H, T, S]
        if trace is not None and trace.wants("attn_probs"):
            trace.put(layer, "attn_probs", torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1))
        keep = allowed if (options.dense or topk is None) else selection_mask(topk, allowed)
        p = torch.softmax(logits.masked_fill(~keep, float("-inf")), -1)
        o_lat = torch.einsum("hts,sc->thc", p, kv[:, :r])  # [T, H, 512]
        o = torch.einsum("thc,hvc->thv", o_lat, w_uv).reshape(T, H * V)
        out = o @ w["self_attn.o_proj.weight"].T
        if trace is not None:
            trace.put(layer, "attn_out", out)
        return out, topk

    def mlp(self, w: _LayerWeights, x: torch.Tensor, layer: int) -> torch.Tensor:
        cfg = self.cfg
        if not cfg.is_moe_layer(layer):
            return F.silu(x @ w["mlp.gate_proj.weight"].T) * (x @ w["mlp.up_proj.weight"].T) @ w["mlp.down_proj.weight"].T
        # sigmoid noaux_tc routing; the correction bias only steers the choice
        E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        scores = torch.sigmoid(x.float() @ w["mlp.gate.weight"].float().T)  # [T, E]
        choice = scores + w["mlp.gate.e_score_correction_bias"]
        if cfg.n_group > 1:
            grouped = choice.view(-1, cfg.n_group, E // cfg.n_group)
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(group_scores).scatter(1, group_scores.topk(cfg.topk_group, dim=-1)[1], 1)
            choice = choice.masked_fill(~keep.bool().repeat_interleave(E // cfg.n_group, 1), float("-inf"))
        idx = choice.topk(k, dim=-1, sorted=False)[1]  # [T, k]
        weight = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        weight = weight * cfg.routed_scaling_factor
        out = torch.zeros_like(x)
        for e in idx.unique().tolist():  # ascending, as transformers accumulates
            tok, slot = torch.where(idx == e)
            xe = x[tok]
            keep_w = not self.stream
            h = F.silu(xe @ w.expert(e, "gate", keep_w).T) * (xe @ w.expert(e, "up", keep_w).T)
            out = out.index_add(0, tok, (h @ w.expert(e, "down", keep_w).T) * weight[tok, slot, None])
        sh = "mlp.shared_experts."
        shared = F.silu(x @ w[sh + "gate_proj.weight"].T) * (x @ w[sh + "up_proj.weight"].T) @ w[sh + "down_proj.weight"].T
        return out + shared

    def layer(self, i: int, h: torch.Tensor, pos: torch.Tensor, cache: KVCache | None, options: DSAOptions,
              prev_topk: torch.Tensor | None, layer_type: str, trace: Trace | None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = self.layer_weights(i)
        if trace is not None:
            trace.put(i, "hidden", h)
        x = rms_norm(h, w["input_layernorm.weight"], self.cfg.rms_norm_eps)
        a, topk = self.attention(w, x, pos, i, cache, options, prev_topk, layer_type, trace)
        h = h + a
        h = h + self.mlp(w, rms_norm(h, w["post_attention_layernorm.weight"], self.cfg.rms_norm_eps), i)
        return h, topk

    def run_layers(self, h: torch.Tensor, pos: torch.Tensor, *, layers: Iterable[int] | None = None,
                   cache: KVCache | None = None, options: DSAOptions | None = None,
                   trace: Trace | None = None) -> torch.Tensor:
        """Hidden states [T, D] through trunk `layers` (default: all, in order)."""
        options = options or DSAOptions()
        types = self.layer_types(options)
        layers = list(range(self.cfg.num_hidden_layers) if layers is None else layers)
        prev_topk = None
        it = layers
        if self.progress and show_progress():
            from tqdm.auto import tqdm

            it = tqdm(layers, desc="layers", leave=False)
        for i in it:
            t0 = time.perf_counter()
            h, topk = self.layer(i, h, pos, cache, options, prev_topk, types[i], trace)
            if topk is not None and types[i] == "full":
                prev_topk = topk
            if trace is not None:
                trace.seconds[i] = time.perf_counter() - t0
        return h

    # -- public entry points --
    @staticmethod
    def _ids(input_ids) -> torch.Tensor:
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError("the reference runs one sequence at a time; pass [T] or [1, T]")
            ids = ids[0]
        return ids

    def forward(self, input_ids, *, cache: KVCache | None = None, options: DSAOptions | None = None,
                trace: Trace | None = None) -> torch.Tensor:
        """Logits [T, V] (fp32). With a cache, positions continue from `cache.length` and the cache grows."""
        ids = self._ids(input_ids)
        start = cache.length if cache is not None else 0
        pos = torch.arange(start, start + ids.shape[0])
        h = self.run_layers(self.embed(ids), pos, cache=cache, options=options, trace=trace)
        if cache is not None:
            cache.length += ids.shape[0]
        return self.head(h)

    __call__ = forward

    def logprobs(self, input_ids, **kw) -> torch.Tensor:
        """log-softmax of the logits, [T, V]."""
        return torch.log_softmax(self.forward(input_ids, **kw), -1)

    def token_logprobs(self, input_ids, **kw) -> torch.Tensor:
        """[T-1]: log p(input_ids[t+1] | input_ids[:t+1])."""
        ids = self._ids(input_ids)
        lp = self.logprobs(ids, **kw)
        return lp[:-1].gather(1, ids[1:, None])[:, 0]

    @torch.no_grad()
    def generate_greedy(self, prompt_ids, max_new_tokens: int, *, options: DSAOptions | None = None,
                        eos_token_id: int | None = None) -> tuple[list[int], list[float]]:
        """Greedy continuation with KV + indexer caches: (new token ids, their log-probabilities)."""
        cache = self.new_cache()
        logits = self.forward(prompt_ids, cache=cache, options=options)[-1]
        tokens: list[int] = []
        logps: list[float] = []
        for _ in range(max_new_tokens):
            lp = torch.log_softmax(logits, -1)
            tok = int(lp.argmax())
            tokens.append(tok)
            logps.append(float(lp[tok]))
            if eos_token_id is not None and tok == eos_token_id:
                break
            logits = self.forward(torch.tensor([tok]), cache=cache, options=options)[-1]
        return tokens, logps
