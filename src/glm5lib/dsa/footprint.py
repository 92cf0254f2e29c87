"""Running the first layers of a big model on a CPU: per-layer time, peak memory, and the same DSA numbers.

- `analyze_layers(model, ...)`: embed a sequence, run layers one at a time (the model should be opened with
  `stream=True`: one layer's weights resident, routed experts one at a time), and report per layer the wall
  time, the process's resident memory after the layer (and the peak so far), and how much dense attention the indexer's top-k keeps.
- `SyntheticWeights(cfg)`: deterministic random weights of any GLM-5 shape, made on request, so the full-size
  geometry can be timed without the 1.5 TB checkpoint.
- `dequant_throughput(type)`: gguf-py dequantization speed on one full-size expert matrix; the cost of a real
  GGUF MoE layer is dominated by dequantizing the experts the router picks.
"""

from __future__ import annotations

import resource
import time
import zlib

import numpy as np
import torch

from glm5lib.dsa.analysis import LayerSelection, mass_recall, oracle_mass, set_recall
from glm5lib.model.indexer import causal_mask
from glm5lib.model.reference import DSAOptions, ReferenceModel, Trace
from glm5lib.model.spec import GLM5Config, hf_tensor_shapes


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB): a lifetime maximum."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rss_gb() -> float:
    """Resident memory now (VmRSS), which shows whether a layer's weights were released after it ran."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:  # not Linux: fall back to the lifetime peak
        pass
    return peak_rss_gb()


def sample_ids(model: ReferenceModel, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(seed))


def analyze_layers(model: ReferenceModel, *, tokens: int = 256, layers=None, seed: int = 0,
                   topk: int | None = None, input_ids=None) -> dict:
    """Dense pass through `layers` (contiguous from 0), one at a time, with per-layer DSA numbers."""
    ids = input_ids if input_ids is not None else sample_ids(model, tokens, seed)
    ids = torch.as_tensor(ids)
    T = ids.shape[0]
    k = topk or model.cfg.index_topk
    layers = list(layers if layers is not None else range(model.cfg.num_hidden_layers))
    pos = torch.arange(T)
    rows = []
    with torch.no_grad():
        t0 = time.perf_counter()
        h = model.embed(ids)
        embed_s = time.perf_counter() - t0
        for i in layers:
            trace = Trace(("index_scores", "attn_probs"))
            h = model.run_layers(h, pos, layers=[i], options=DSAOptions(dense=True), trace=trace)
            row = {"layer": i, "seconds": trace.seconds[i], "rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()}
            d = trace.layers.get(i, {})
            if "index_scores" in d and T > k:
                probs = d["attn_probs"]
                sel = LayerSelection(probs.mean(0), probs, d["index_scores"], causal_mask(pos, T))
                row.update(mass_recall=float(mass_recall(sel, k).mean()), oracle_mass=float(oracle_mass(sel, k).mean()),
                           set_recall=float(set_recall(sel, k).mean()))
            else:
                row.update(mass_recall=float("nan"), oracle_mass=float("nan"), set_recall=float("nan"))
            rows.append(row)
            del trace
    return {"tokens": T, "topk": k, "embed_seconds": embed_s, "layers": rows}


class SyntheticWeights:
    """HF-named random fp32 tensors of `cfg`'s shapes, generated per request from (seed, name): nothing is held."""

    def __init__(self, cfg: GLM5Config, seed: int = 0):
        self.cfg, self.seed = cfg, seed
        self.shapes = hf_tensor_shapes(cfg)

    def _gen(self, name: str) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))

    def __call__(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        if len(shape) == 1:
            if name.endswith("e_score_correction_bias") or name.endswith(".bias"):
                return torch.zeros(shape)
            return torch.ones(shape)
        std = 0.02 if "embed_tokens" in name else shape[-1] ** -0.5
        return torch.randn(shape, generator=self._gen(name)) * std

    def rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows only (the full GLM-5 table is 3.8 GB in fp32)."""
        D = self.shapes[name][1]
        return torch.stack([torch.randn(D, generator=self._gen(f"{name}[{int(i)}]")) * 0.02 for i in ids])


def probe_layer(cfg: GLM5Config, layer: int, tokens: int, *, seed: int = 0, max_experts: int | None = 8) -> dict:
    """Time one full-size layer with synthetic weights: attention and MLP separately. For MoE layers only
    `max_experts` routed experts are run (the rest would cost the same each); the per-expert time is reported."""
    model = ReferenceModel(cfg, SyntheticWeights(cfg, seed), stream=True)
    w = model.layer_weights(layer)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, cfg.hidden_size, generator=gen)
    pos = torch.arange(tokens)
    out = {"layer": layer, "tokens": tokens, "moe": cfg.is_moe_layer(layer)}
    with torch.no_grad():
        t0 = time.perf_counter()
        for name in ("self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
                     "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "self_attn.indexer.wq_b.weight",
                     "self_attn.indexer.wk.weight", "self_attn.indexer.weights_proj.weight"):
            w[name]  # fetch (= generate) the attention weights before timing the math
        out["attn_weights_gb"] = sum(t.numel() * 4 for t in w.store.values()) / 1e9
        t1 = time.perf_counter()
        model.attention(w, x, pos, layer, None, DSAOptions(), None, "full", None)
        t2 = time.perf_counter()
        out.update(attn_fetch_s=t1 - t0, attn_s=t2 - t1)
        if not cfg.is_moe_layer(layer):
            t3 = time.perf_counter()
            for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
                w[name]
            t4 = time.perf_counter()
            model.mlp(w, x, layer)
            out.update(mlp_fetch_s=t4 - t3, mlp_s=time.perf_counter() - t4)
        else:
            n = max_experts or cfg.n_routed_experts
            t3 = time.perf_counter()
            ws = [model.get(f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.weight") for e in range(n)
                  for p in ("gate", "up", "down")]
            t4 = time.perf_counter()
            xe = x[: max(1, tokens * cfg.num_experts_per_tok // cfg.n_routed_experts)]  # tokens an expert sees
            for e in range(n):
                g, u, d = ws[3 * e: 3 * e + 3]
                (torch.nn.functional.silu(xe @ g.T) * (xe @ u.T)) @ d.T
            t5 = time.perf_counter()
            del ws
            out.update(expert_fetch_s=(t4 - t3) / n, expert_s=(t5 - t4) / n,
                       expert_gb=3 * cfg.moe_intermediate_size * cfg.hidden_size * 4 / 1e9)
        out["peak_rss_gb"] = peak_rss_gb()
    return out


def dequant_throughput(type_name: str = "Q4_0", rows: int = 2048, cols: int = 6144, seed: int = 0) -> dict:
    """Seconds to dequantize one [rows, cols] matrix (a GLM-5 expert projection) with gguf-py, and values/s."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    rng = np.random.default_rng(seed)
    try:
        data = gguf.quants.quantize(rng.standard_normal((rows, cols), dtype=np.float32) * cols**-0.5, qtype)
    except NotImplementedError:  # gguf-py cannot quantize K-quants: random blocks dequantize at the same speed
        data = rng.integers(0, 256, gguf.quant_shape_to_byte_shape((rows, cols), qtype), dtype=np.uint8)
    t0 = time.perf_counter()
    gguf.quants.dequantize(data, qtype)
    dt = time.perf_counter() - t0
    return {"type": type_name, "seconds": dt, "values_per_s": rows * cols / dt}
