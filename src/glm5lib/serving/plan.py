"""`glm5lib plan`: will GLM-5 fit on N GPUs, how many tokens of KV cache remain, which vLLM flags, how fast
decode may go -- from headers only, before loading 400 GB.

Sizes come from `glm5lib.model.sizes` (the one GLM-5 size model, also used by `glm5lib doctor`). vLLM's
memory accounting is followed step by step: `gpu_memory_utilization x total` is requested; weights, the
profiling run's activation peak, memory outside torch (CUDA context, NCCL) and the CUDA-graph pool come off it;
what remains is KV cache, in whole blocks across all layers. The activation peak, the non-torch memory and the
graph pool are estimates (vLLM measures them at start-up); their formulas are printed with the plan.

The decode estimate is a bandwidth model: bytes each GPU reads per step over the card's bandwidth times the
measured efficiency of the kernel that reads them, plus two all-reduces per layer. It is labelled an estimate
and lists its assumptions.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glm5lib.errors import UserError
from glm5lib.model import sizes as S
from glm5lib.model.spec import PRESET_NAMES, GLM5Config
from glm5lib.paths import bench_dir

# ---- GPUs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    name: str
    key: str
    cc: str
    bandwidth_tbs: float  # vendor datasheet, HBM/GDDR
    memory_mib: int  # total as nvidia-smi reports it
    link: str  # nvlink4 | nvlink3 | nvlink5 | pcie5 | pcie4
    source: str


GPUS = (
    GPU("NVIDIA H200", "h200", "9.0", 4.8, 143771, "nvlink4", "NVIDIA H200 Tensor Core GPU datasheet (SXM): 4.8 TB/s"),
    GPU("NVIDIA H100 SXM 80GB", "h100", "9.0", 3.35, 81559, "nvlink4", "NVIDIA H100 datasheet (SXM): 3.35 TB/s"),
    GPU("NVIDIA A100 80GB", "a100", "8.0", 2.039, 81920, "nvlink3", "NVIDIA A100 datasheet (80GB SXM): 2,039 GB/s"),
    GPU("NVIDIA RTX PRO 6000 Blackwell", "rtx-pro-6000", "12.0", 1.792, 97887, "pcie5",
        "NVIDIA RTX PRO 6000 Blackwell datasheet: 1,792 GB/s"),
    GPU("NVIDIA L40S", "l40s", "8.9", 0.864, 46068, "pcie4", "NVIDIA L40S datasheet: 864 GB/s"),
    GPU("NVIDIA GeForce RTX 4090", "rtx-4090", "8.9", 1.008, 24564, "pcie4", "NVIDIA RTX 4090 specifications: 1,008 GB/s"),
    GPU("NVIDIA GeForce RTX 5090", "rtx-5090", "12.0", 1.792, 32607, "pcie5", "NVIDIA RTX 5090 specifications: 1,792 GB/s"),
    GPU("NVIDIA B200", "b200", "10.0", 8.0, 183359, "nvlink5", "NVIDIA DGX B200 / HGX B200 datasheet: 8 TB/s per GPU"),
)

# All-reduce per link (assumed, not measured): NCCL's small-message latency and the bus bandwidth it reaches.
LINKS = {
    "nvlink5": {"latency_us": 8.0, "busbw_gbs": 600.0, "what": "NVLink 5 (900 GB/s per direction)"},
    "nvlink4": {"latency_us": 10.0, "busbw_gbs": 300.0, "what": "NVLink 4 (450 GB/s per direction)"},
    "nvlink3": {"latency_us": 12.0, "busbw_gbs": 200.0, "what": "NVLink 3 (300 GB/s per direction)"},
    "pcie5": {"latency_us": 25.0, "busbw_gbs": 40.0, "what": "PCIe 5.0 x16 (64 GB/s per direction)"},
    "pcie4": {"latency_us": 30.0, "busbw_gbs": 20.0, "what": "PCIe 4.0 x16 (32 GB/s per direction)"},
}

# Kernel efficiencies (fraction of the copy rate) where outputs/bench has no measurement: assumed.
DEFAULT_EFFICIENCY = {
    "weights_quantized": 0.40,  # docs/glm5.md section 8: GGUF GEMV 35-48 % of copy on large matrices (H200)
    "weights_dense": 0.80,  # bf16 GEMV/GEMM streaming a weight once (assumed)
    "sparse_mla": 0.50,
    "indexer": 0.47,
}
H200_DATASHEET_TBS = 4.8


def find_gpu(name: str | None = None, cc: str | None = None, mem_bytes: int | None = None) -> GPU | None:
    """A card from the table: by name, else by compute capability and the memory nearest `mem_bytes`."""
    if name:
        key = name.lower().replace("_", "-").replace(" ", "-")
        for g in GPUS:
            if key in (g.key, g.name.lower().replace(" ", "-")):
                return g
        raise UserError(f"--gpu {name}: unknown; known: {', '.join(g.key for g in GPUS)}")
    cands = [g for g in GPUS if cc is None or g.cc == cc]
    if not cands:
        return None
    if mem_bytes is None:
        return cands[0]
    return min(cands, key=lambda g: abs(g.memory_mib * 2**20 - mem_bytes))


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*$", re.I)


def parse_size(text: str) -> int:
    """'96G', '96GB' (10^9), '80GiB' (2^30), '143771MiB', '1.5T' -> bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise UserError(f"memory size {text!r}: use e.g. 96GB, 80GiB, 143771MiB")
    num, unit, binary = float(m.group(1)), m.group(2).upper(), bool(m.group(3))
    power = " KMGT".index(unit or " ")
    return int(num * (1024 if binary else 1000) ** power)


def parse_cc(text: str) -> str:
    t = text.strip().lower().replace("sm_", "").replace("sm", "")
    if "." not in t and t.isdigit() and len(t) >= 2:
        t = f"{t[:-1]}.{t[-1]}"
    try:
        major, minor = (int(x) for x in t.split("."))
    except ValueError:
        raise UserError(f"compute capability {text!r}: use e.g. 8.0, 8.9, 9.0, 12.0") from None
    return f"{major}.{minor}"


# ---- measured efficiencies ---------------------------------------------------------------------------------------


@dataclass
class BenchData:
    copy_gbs: float | None = None  # measured H200 device-to-device copy
    source: str = "none"
    mla: list[dict[str, Any]] = field(default_factory=list)  # decode rows: H, T, kv_format, pct_bw
    indexer: list[dict[str, Any]] = field(default_factory=list)


def load_bench(directory: Path | None = None) -> BenchData:
    """Copy rate and decode-kernel efficiencies from outputs/bench (bench_h200.json, indexer_h200.json)."""
    d = directory if directory is not None else bench_dir()
    out = BenchData()
    if d is None:
        return out
    files = []
    for name in ("bench_h200.json", "indexer_h200.json"):
        p = Path(d) / name
        if not p.is_file():
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        files.append(p.name)
        copy = (data.get("ceilings") or {}).get("copy_GBps")
        if copy and out.copy_gbs is None:
            out.copy_gbs = float(copy)
        for r in data.get("rows", []):
            if r.get("pct_bw") is None:
                continue
            if r.get("kind") == "decode" and r.get("impl") == "triton":
                out.mla.append(r)
            elif r.get("kind") == "indexer-decode" and r.get("impl") in ("triton", "triton-q8"):
                out.indexer.append(r)
    if files:
        out.source = "outputs/bench/" + ", outputs/bench/".join(files)
    return out


def mla_efficiency(bench: BenchData, heads: int, batch: int, kv_format: str) -> tuple[float, str]:
    """Measured sparse-MLA decode efficiency nearest (heads, batch) for the cache format."""
    fmt = "fp8_ds_mla" if kv_format == "fp8_ds_mla" else "bf16"
    rows = [r for r in bench.mla if r["kv_format"] == fmt]
    if not rows:
        return DEFAULT_EFFICIENCY["sparse_mla"], "assumed"
    r = min(rows, key=lambda r: (abs(math.log2(r["H"] / heads)), abs(math.log2(r["T"] / batch))))
    return r["pct_bw"] / 100.0, f"measured H{r['H']} B{r['T']} {fmt}"


def indexer_efficiency(bench: BenchData, cc: str | None) -> tuple[float, str]:
    # sm_89+ keeps q in fp8 (triton-q8); below, q is widened to bf16 (triton)
    impl = "triton-q8" if cc is not None and float(cc) >= 8.9 else "triton"
    rows = [r for r in bench.indexer if r["impl"] == impl and r["kv_format"] == "fp8"]
    if not rows:
        return DEFAULT_EFFICIENCY["indexer"], "assumed"
    best = max(rows, key=lambda r: r["T"])
    return best["pct_bw"] / 100.0, f"measured {impl} B{best['T']}"


# ---- inputs ----------------------------------------------------------------------------------------------------


@dataclass
class ModelInput:
    label: str
    cfg: GLM5Config
    types: dict[str, str] | None  # GGUF type per tensor (file or recipe); None = plain dtype
    quant: str  # what the types are: the file's main type, or the recipe
    is_gguf: bool
    path: str | None


def resolve_model(model: str | None, preset: str | None, quant: str | None) -> ModelInput:
    """MODEL (GGUF any shard, HF dir, config.json) or a preset, with `quant` naming a hypothetical file's types."""
    if preset is not None:
        if preset not in PRESET_NAMES:
            raise UserError(f"--preset {preset}: choose from {', '.join(PRESET_NAMES)}")
        cfg = GLM5Config.preset(preset)
        q = (quant or "BF16").upper()
        return ModelInput(f"{preset} ({q})", cfg, S.quant_recipe(cfg, q), q, False, None)
    if model is None:
        raise UserError("give MODEL (a .gguf, an HF directory or config.json) or --preset")
    if model in PRESET_NAMES:
        return resolve_model(None, model, quant)
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"{model}: no such file")
        cfg, types = S.types_from_gguf(path)
        if quant:
            return ModelInput(f"{path.name} as {quant.upper()}", cfg, S.quant_recipe(cfg, quant), quant.upper(),
                              True, str(path))
        return ModelInput(path.name, cfg, types, _main_type(types), True, str(path))
    cfg_path = path / "config.json" if path.is_dir() else path
    if cfg_path.name.endswith(".json") and cfg_path.exists():
        from glm5lib.files import read_json_object
        from glm5lib.model.spec import config_problems

        hf = read_json_object(cfg_path, "config file")
        bad = config_problems(hf)
        if bad:
            raise UserError(f"{cfg_path}: {bad[0]}")
        try:
            cfg = GLM5Config.from_hf_dict(hf)
        except (ValueError, TypeError) as exc:
            raise UserError(f"{cfg_path}: not a GLM-5 config.json ({exc})") from None
        q = (quant or {"float32": "F32", "float16": "F16"}.get(cfg.torch_dtype, "BF16")).upper()
        label = str(path.name if path.is_dir() else path)
        return ModelInput(f"{label} ({q})", cfg, S.quant_recipe(cfg, q), q, False, str(path))
    raise UserError(f"{model}: not a .gguf file, an HF model directory, config.json, or a preset "
                    f"({', '.join(PRESET_NAMES)})")


def _main_type(types: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for t in types.values():
        if t != "F32":
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get) if counts else "F32"


# ---- the plan --------------------------------------------------------------------------------------------------


@dataclass
class PlanOptions:
    gpus: int = 8
    gpu_mem_bytes: int | None = None
    cc: str | None = None
    gpu: str | None = None
    kv_cache_dtype: str = "auto"
    dtype: str | None = None  # serving dtype; None: the model's (bf16 for quantized files)
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    residency: str = "quantized"
    include_mtp: bool = True
    enforce_eager: bool | None = None  # None: CUDA graphs (vLLM's default; GLM5_SPARSE_MLA declares UNIFORM_BATCH)
    context: int | None = None  # decode-estimate context; None: min(max_model_len, 16384)
    batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256)


@dataclass
class Plan:
    model: str
    quant: str
    gpus: int
    gpu: str
    gpu_mem_bytes: int
    cc: str | None
    dtype: str
    kv_cache_dtype: str
    residency: str
    include_mtp: bool
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    params_total: int
    params_per_gpu: int
    file_bytes: int
    weights_bytes_per_gpu: int
    weights_detail: dict[str, int]
    reserve: dict[str, Any]
    kv_bytes_per_token: int
    kv_detail: dict[str, int]
    available_kv_bytes: int
    max_kv_tokens: int
    max_concurrent_seqs: int  # sequences of max_model_len tokens the cache holds
    fits: bool
    verdict: str
    shortfall_bytes: int
    suggestions: list[str]
    decode_context: int
    decode_ms_estimate: dict[str, float]
    decode_tokens_per_s: dict[str, float]
    decode_detail: dict[str, dict[str, float]]
    decode_assumptions: list[str]
    attention_backend: str | None
    vllm_command: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _backend_for(cc: str | None) -> str | None:
    """GLM5_SPARSE_MLA where vLLM has no working sparse-MLA backend (SM80, SM89, SM120; docs/glm5.md section 5)."""
    if cc is None:
        return None
    major = int(cc.split(".")[0])
    return None if major in (9, 10) else "GLM5_SPARSE_MLA"


def reserve_estimate(cfg: GLM5Config, m: S.SizeModel, o: PlanOptions, max_model_len: int, eager: bool) -> dict:
    """vLLM's non-KV memory besides weights, estimated (vLLM measures it at start-up):

    activation peak = fused-MoE caches T*k*(3*I/tp + D)*b + hidden states 12*T*D*b
                      + indexer logits buffer 512 MiB (VLLM_SPARSE_INDEXER_MAX_LOGITS_MB)
                      + sparse prefill workspace 5*max_model_len*576*2 B
                      + sampler logits 2*max_num_seqs*vocab*4 B
    non-torch       = 0.5 GiB CUDA context (+ 0.5 GiB NCCL buffers at tp > 1)
    CUDA graphs     = 0 eager, else 1 GiB + the activation of the largest captured batch
    (T = max_num_batched_tokens, k = experts per token, I = moe intermediate, D = hidden, b = dtype bytes)."""
    b = S.DTYPE_BYTES[m.dtype]
    T, D, k = o.max_num_batched_tokens, cfg.hidden_size, cfg.num_experts_per_tok
    moe = T * k * (3 * cfg.moe_intermediate_size // m.tp + D) * b
    hidden = 12 * T * D * b
    idx_logits = 512 * 2**20
    prefill_ws = 5 * max_model_len * cfg.mla_qk_dim * 2
    sampler = 2 * o.max_num_seqs * cfg.vocab_size * 4
    activation = moe + hidden + idx_logits + prefill_ws + sampler
    non_torch = 2**29 + (2**29 if m.tp > 1 else 0)
    cap = min(2 * o.max_num_seqs, 512)
    graphs = 0 if eager else 2**30 + cap * k * (3 * cfg.moe_intermediate_size // m.tp + D) * b + 12 * cap * D * b
    return {"activation_peak": activation, "non_torch": non_torch, "cuda_graphs": graphs,
            "total": activation + non_torch + graphs,
            "parts": {"moe": moe, "hidden": hidden, "indexer_logits": idx_logits, "prefill_workspace": prefill_ws,
                      "sampler": sampler},
            "estimated": True}


def make_plan(mi: ModelInput, o: PlanOptions, bench: BenchData | None = None, *, _suggest: bool = True) -> Plan:
    cfg = mi.cfg
    bench = bench if bench is not None else load_bench()
    cc = parse_cc(o.cc) if o.cc else None
    card = find_gpu(o.gpu, cc, o.gpu_mem_bytes)
    if o.gpu and cc is None:
        cc = card.cc
    mem = o.gpu_mem_bytes if o.gpu_mem_bytes is not None else (card.memory_mib * 2**20 if card else None)
    if mem is None:
        raise UserError("give --gpu-mem SIZE (or --gpu NAME)")
    if o.gpus < 1:
        raise UserError(f"--gpus {o.gpus}: need at least 1")
    if not 0 < o.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {o.gpu_memory_utilization}: between 0 and 1")
    include_mtp = o.include_mtp and cfg.num_nextn_predict_layers > 0
    dtype = o.dtype or ("float32" if cfg.torch_dtype == "float32" and mi.quant == "F32" else "bfloat16")
    if o.kv_cache_dtype not in S.KV_CACHE_DTYPES:
        raise UserError(f"--kv-cache-dtype {o.kv_cache_dtype}: use one of {', '.join(S.KV_CACHE_DTYPES)}")
    max_len = o.max_model_len or cfg.max_position_embeddings
    if max_len < 1:
        raise UserError(f"--max-model-len {max_len}: must be positive")
    m = S.size_model(cfg, mi.types, tp=o.gpus, residency=o.residency, dtype=dtype, include_mtp=include_mtp,
                     max_num_batched_tokens=o.max_num_batched_tokens)
    eager = bool(o.enforce_eager)
    res = reserve_estimate(cfg, m, o, max_len, eager)
    kv = S.kv_bytes_per_token(cfg, o.kv_cache_dtype, dtype, include_mtp=include_mtp)
    requested = int(o.gpu_memory_utilization * mem)
    weights = m.weights_bytes_per_gpu
    available = requested - weights - res["total"]
    tokens = S.kv_tokens(available, kv["total"])
    seqs = S.sequences_at(tokens, max_len)
    one_seq = math.ceil(max_len / S.KV_BLOCK_SIZE) * S.KV_BLOCK_SIZE * kv["total"]
    fits = available >= one_seq and weights <= mem
    shortfall = 0 if fits else int(weights + res["total"] + one_seq - requested)
    if fits:
        verdict = (f"fits: {tokens:,} tokens of KV cache, {seqs} concurrent sequences of {max_len:,} tokens")
    elif weights > requested:
        verdict = (f"does NOT fit: weights alone need {_gb(weights)} per GPU, {_gb(weights - requested)} more than "
                   f"the {_gb(requested)} vLLM may use ({o.gpu_memory_utilization} x {_gb(mem)})")
    else:
        verdict = (f"does NOT fit: {_gb(shortfall)} per GPU short of one {max_len:,}-token sequence of KV cache "
                   f"after weights and vLLM's reserve")
    backend = _backend_for(cc)
    ctx = o.context or min(max_len, 16384)
    dec = decode_estimate(cfg, m, o, kv, ctx, card, cc, bench, o.kv_cache_dtype)
    plan = Plan(
        model=mi.label, quant=mi.quant, gpus=o.gpus, gpu=card.name if card else "unknown", gpu_mem_bytes=mem, cc=cc,
        dtype=dtype, kv_cache_dtype=o.kv_cache_dtype, residency=o.residency, include_mtp=include_mtp,
        max_model_len=max_len, max_num_seqs=o.max_num_seqs, max_num_batched_tokens=o.max_num_batched_tokens,
        gpu_memory_utilization=o.gpu_memory_utilization, params_total=m.params_total,
        params_per_gpu=m.params_per_gpu, file_bytes=m.file_bytes, weights_bytes_per_gpu=weights,
        weights_detail={"experts": m.expert_bytes_per_gpu, "non_experts": m.non_expert_bytes_per_gpu,
                        "buffers": m.buffer_bytes_per_gpu},
        reserve=res, kv_bytes_per_token=kv["total"], kv_detail=kv, available_kv_bytes=int(available),
        max_kv_tokens=tokens, max_concurrent_seqs=seqs, fits=fits, verdict=verdict, shortfall_bytes=shortfall,
        suggestions=[], decode_context=ctx, decode_ms_estimate=dec["ms"], decode_tokens_per_s=dec["tok_s"],
        decode_detail=dec["detail"], decode_assumptions=dec["assumptions"], attention_backend=backend,
        vllm_command=vllm_command(mi, o, cc, dtype, max_len, eager, include_mtp),
    )
    if _suggest and not fits:
        plan.suggestions = suggestions(mi, o, plan, bench)
    return plan


def decode_estimate(cfg: GLM5Config, m: S.SizeModel, o: PlanOptions, kv: dict[str, int], ctx: int, card: GPU | None,
                    cc: str | None, bench: BenchData, kv_cache_dtype: str) -> dict[str, Any]:
    """Per batch size B: ms per decode step on one GPU (all GPUs step together)."""
    copy = bench.copy_gbs
    if card is None:
        bw = None
    elif card.key == "h200" and copy:
        bw = copy
    else:  # the card's datasheet rate at the fraction of it a copy reaches on the H200
        bw = card.bandwidth_tbs * 1000 * ((copy / (H200_DATASHEET_TBS * 1000)) if copy else 0.88)
    link = LINKS[card.link] if card else LINKS["pcie4"]
    heads = cfg.num_attention_heads // m.tp
    quantized = m.residency != "dequantized" and any(
        t.resident not in S.DTYPE_BYTES for t in m.tensors if t.expert)
    eff_w = DEFAULT_EFFICIENCY["weights_quantized" if quantized else "weights_dense"]
    eff_i, src_i = indexer_efficiency(bench, cc)
    trunk = [i for i in range(cfg.num_hidden_layers)]
    non_expert = sum(t.bytes_per_gpu for t in m.tensors if not t.expert and t.kind != "token_embd.weight"
                     and (t.block is None or t.block < cfg.num_hidden_layers))
    row = S.mla_row_bytes(cfg, kv_cache_dtype, m.dtype)
    n_idx = sum(cfg.has_indexer(i) for i in trunk)
    ms, tok_s, detail = {}, {}, {}
    mla_src = ""
    for B in o.batches:
        distinct = S.expected_distinct_experts(B, cfg.n_routed_experts, cfg.num_experts_per_tok)
        experts = sum(distinct * m.expert_slice_bytes_per_gpu(i) for i in m.moe_layers if i < cfg.num_hidden_layers)
        kv_read = B * len(trunk) * min(ctx, cfg.index_topk) * row
        idx_read = B * n_idx * ctx * S.INDEXER_KEY_BYTES
        eff_m, mla_src = mla_efficiency(bench, heads, B, kv_cache_dtype)
        ar = 0.0
        if m.tp > 1:
            msg = B * cfg.hidden_size * 2
            ar = 2 * len(trunk) * (link["latency_us"] * 1e-6 + 2 * (m.tp - 1) / m.tp * msg / (link["busbw_gbs"] * 1e9))
        if bw is None:
            t = float("nan")
            parts = {}
        else:
            g = bw * 1e9
            parts = {"weights_ms": non_expert / (g * eff_w) * 1e3, "experts_ms": experts / (g * eff_w) * 1e3,
                     "kv_gather_ms": kv_read / (g * eff_m) * 1e3, "indexer_ms": idx_read / (g * eff_i) * 1e3,
                     "allreduce_ms": ar * 1e3}
            t = sum(parts.values())
        parts.update({"bytes": non_expert + experts + kv_read + idx_read, "distinct_experts": distinct})
        ms[str(B)] = round(t, 3)
        tok_s[str(B)] = round(B / t * 1e3, 1) if t == t and t > 0 else float("nan")
        detail[str(B)] = parts
    assumptions = [
        "ESTIMATE: a bandwidth model, not a measurement; compute, launch overhead and scheduling are not in it",
        f"bandwidth {bw:.0f} GB/s per GPU: " + (f"measured H200 copy ({bench.source})" if card and card.key == "h200"
                                                 and copy else f"{card.source} x copy fraction "
                                                 f"{(copy or 0.88 * 4800) / 4800:.2f} measured on the H200")
        if bw else "bandwidth unknown: give --gpu NAME",
        f"every non-expert weight read once per step ({_gb(non_expert)}), MTP draft not counted",
        f"routed experts: E*(1-(1-k/E)^B) distinct of {cfg.n_routed_experts} per layer (uniform routing), "
        "each its per-GPU slice",
        f"weights read at {eff_w:.0%} of copy ({'quantized GEMV, docs/glm5.md section 8' if quantized else 'assumed'})",
        f"KV: top-{cfg.index_topk} rows of {row} B per token per layer at context {ctx:,}, sparse-MLA at the "
        f"measured efficiency nearest {heads} heads/GPU ({mla_src})",
        f"indexer reads all {ctx:,} cached keys ({S.INDEXER_KEY_BYTES} B) per token per layer at {eff_i:.0%} ({src_i})",
        (f"2 all-reduces per layer over {link['what']}: {link['latency_us']:.0f} us + bytes / "
         f"{link['busbw_gbs']:.0f} GB/s (assumed)") if m.tp > 1 else "tp 1: no all-reduce",
        "decode runs as CUDA graphs (launch overhead not counted: on the H200 a captured layer step replays "
        "within 1.08x of its kernels' GPU time, outputs/bench/vllm_graphs_h200.json)",
    ]
    return {"ms": ms, "tok_s": tok_s, "detail": detail, "assumptions": assumptions}


def vllm_command(mi: ModelInput, o: PlanOptions, cc: str | None, dtype: str, max_len: int, eager: bool,
                 include_mtp: bool) -> str:
    backend = _backend_for(cc)
    own = ["--dtype", dtype, "--max-model-len", str(max_len), "--max-num-seqs", str(o.max_num_seqs)]
    rest = ["-tp", str(o.gpus), "--max-num-batched-tokens", str(o.max_num_batched_tokens),
            "--gpu-memory-utilization", str(o.gpu_memory_utilization)]
    if o.kv_cache_dtype != "auto":
        rest += ["--kv-cache-dtype", o.kv_cache_dtype]
    spec = ["--speculative-config.method=mtp", "--speculative-config.num_speculative_tokens=1"]
    env = ""
    if mi.is_gguf or (mi.path is None and mi.quant not in ("BF16", "F16", "F32")):
        # stock vLLM takes the .gguf itself (the glm5lib plugin rebuilds config and tokenizer from it); the loader's
        # residency policy is an environment variable, `quantized` its default
        path = mi.path or f"GLM-5-{mi.quant}-00001-of-000NN.gguf"
        env = f"GLM5LIB_GGUF_RESIDENCY={o.residency} " if o.residency != "quantized" else ""
    else:
        path = mi.path or "zai-org/GLM-5"
    cmd = ["vllm", "serve", path, *own, *rest]
    if backend:
        cmd += ["--attention-backend", backend]
    if include_mtp:
        cmd += spec
    return env + shlex.join(cmd + (["--enforce-eager"] if eager else []))


def suggestions(mi: ModelInput, o: PlanOptions, plan: Plan, bench: BenchData) -> list[str]:
    """What would fit, each checked by planning it."""
    out = []
    from dataclasses import replace

    def ok(mi2: ModelInput, o2: PlanOptions) -> Plan | None:
        try:
            p = make_plan(mi2, o2, bench, _suggest=False)
        except UserError:
            return None
        return p if p.fits else None

    heads = mi.cfg.num_attention_heads
    for n in (2, 4, 8, 16, 32, 64):
        if n > o.gpus and heads % n == 0:
            p = ok(mi, replace(o, gpus=n))
            if p:
                out.append(f"{n} GPUs (-tp {n}): {p.max_kv_tokens:,} KV tokens")
                break
    if o.residency != "quantized" and mi.quant not in ("BF16", "F16", "F32"):
        for r in ("dense-attn", "quantized"):
            if r != o.residency:
                p = ok(mi, replace(o, residency=r))
                if p:
                    out.append(f"--residency {r}: weights {_gb(p.weights_bytes_per_gpu)} per GPU, "
                               f"{p.max_kv_tokens:,} KV tokens")
                    break
    if o.kv_cache_dtype != "fp8_ds_mla":
        p = ok(mi, replace(o, kv_cache_dtype="fp8_ds_mla"))
        if p:
            out.append(f"--kv-cache-dtype fp8_ds_mla: {p.kv_bytes_per_token:,} B/token, {p.max_kv_tokens:,} KV tokens")
    for q in ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"):
        recipe = S.quant_recipe(mi.cfg, q)
        mi2 = ModelInput(f"{mi.label} as {q}", mi.cfg, recipe, q, mi.is_gguf, mi.path)
        p = ok(mi2, replace(o, residency="quantized"))
        if p and p.file_bytes < plan.file_bytes:
            out.append(f"a {q} file ({_gb(p.file_bytes)}), quantized residency: weights "
                       f"{_gb(p.weights_bytes_per_gpu)} per GPU, {p.max_kv_tokens:,} KV tokens")
            break
    if plan.available_kv_bytes > 0 and plan.weights_bytes_per_gpu <= plan.gpu_mem_bytes:
        per = plan.kv_bytes_per_token
        tokens = S.kv_tokens(plan.available_kv_bytes, per)
        # the prefill workspace shrinks with max-model-len: step down until it fits
        L = tokens
        while L >= S.KV_BLOCK_SIZE:
            p = ok(mi, replace(o, max_model_len=L))
            if p:
                out.append(f"--max-model-len {L}: {p.max_concurrent_seqs} sequence(s)")
                break
            L = L * 9 // 10 // S.KV_BLOCK_SIZE * S.KV_BLOCK_SIZE
    return out or ["nothing tried fits (more GPUs, smaller quants, fp8 cache, a shorter context)"]


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


# ---- output ----------------------------------------------------------------------------------------------------


def format_plan(p: Plan) -> str:
    w = p.weights_detail
    r = p.reserve
    lines = [
        f"{p.model}: {p.params_total / 1e9:.1f}B params, file {_gb(p.file_bytes)}"
        f"{' (+MTP layer)' if p.include_mtp else ''}; serving {p.dtype}, residency {p.residency}",
        f"{p.gpus}x {p.gpu} ({p.gpu_mem_bytes / 2**30:.1f} GiB, cc {p.cc or '?'}), tensor parallel {p.gpus}",
        "",
        f"per GPU  weights       {_gb(p.weights_bytes_per_gpu):>10}  (experts {_gb(w['experts'])}, other "
        f"{_gb(w['non_experts'])}, buffers {_gb(w['buffers'])}; "
        f"{p.params_per_gpu / 1e9:.1f}B params)",
        f"         vLLM reserve  {_gb(r['total']):>10}  (ESTIMATED: activations {_gb(r['activation_peak'])}, "
        f"non-torch {_gb(r['non_torch'])}, CUDA graphs {_gb(r['cuda_graphs'])})",
        f"         KV cache      {_gb(max(p.available_kv_bytes, 0)):>10}  of {p.gpu_memory_utilization} x "
        f"{_gb(p.gpu_mem_bytes)} requested",
        f"KV bytes per token per GPU: {p.kv_bytes_per_token:,} (MLA {p.kv_detail['mla']:,} "
        f"{p.kv_cache_dtype}, indexer {p.kv_detail['indexer']:,}; replicated on every rank)",
        f"max KV tokens {p.max_kv_tokens:,}; concurrent sequences at --max-model-len {p.max_model_len:,}: "
        f"{p.max_concurrent_seqs}",
        "",
        ("OK " if p.fits else "NO ") + p.verdict,
    ]
    if p.suggestions:
        lines.append("would fit: " + "; ".join(p.suggestions))
    lines.append("")
    lines.append(f"decode estimate (ms per step, tokens/s) at context {p.decode_context:,}:")
    lines.append("  " + "  ".join(f"B={b}: {ms:.1f} ms {p.decode_tokens_per_s[b]:,.0f} tok/s"
                                  for b, ms in p.decode_ms_estimate.items()))
    lines += [f"  - {a}" for a in p.decode_assumptions]
    lines.append("")
    lines.append("$ " + p.vllm_command)
    return "\n".join(lines)
