"""GLM-5 sizes on a tensor-parallel vLLM deployment: weight bytes per GPU and KV-cache bytes per token.

One model of where every byte lives, shared by `glm5lib plan` and `glm5lib doctor` (docs/glm5.md sections 5
and 8). Inputs are the tensor inventory of `spec.py` and, per tensor, the GGUF type it is stored in: read from a
file's headers (`types_from_gguf`), or chosen by a quantization recipe (`quant_recipe`, llama.cpp's choices) for
a file that does not exist yet.

Per tensor, vLLM's `GlmMoeDsaForCausalLM` (the DeepSeek-V3.2 code) decides how tensor parallelism splits it:

| GGUF kind | vLLM module | per rank |
|---|---|---|
| token_embd, output | VocabParallelEmbedding / ParallelLMHead | vocab rows padded to 64, / tp |
| attn_q_a + attn_kv_a_mqa | fused_qkv_a_proj (disable_tp) | replicated |
| attn_q_b, attn_k_b + attn_v_b (kv_b_proj), ffn_gate/up(_shexp) | ColumnParallelLinear | / tp (by heads / rows) |
| attn_output, ffn_down(_shexp) | RowParallelLinear | / tp |
| ffn_{gate,up,down}_exps | FusedMoE (w13, w2 split on the intermediate dim) | / tp |
| indexer.attn_q_b (wq_b) | ReplicatedLinear | replicated |
| indexer.attn_k + indexer.proj | wk_weights_proj (disable_tp, unquantized) | replicated |
| norms, ffn_gate_inp (router), exp_probs_b | RMSNorm / GateLinear / fp32 parameter | replicated |
| nextn.eh_proj (MTP) | nn.Linear | replicated |

Residency (what the GPU holds):
- `quantized`: GGUF blocks kept as stored, except what the glm5lib loader must dequantize into the serving dtype
  (`kv_b_proj` rebuilt from attn_k_b/attn_v_b, the indexer's `wk`, MTP's `eh_proj`: modules built unquantized);
- `dense-attn`: every non-expert weight in the serving dtype, routed experts quantized;
- `dequantized`: every weight in the serving dtype.
Norms are held in the serving dtype and `e_score_correction_bias` and the indexer's k_norm in fp32 in every
mode. vLLM's MLA layer derives `W_UK_T`/`W_UV` from `kv_b_proj`: views of the same storage when kv_b_proj is
unquantized (always, with the glm5lib loader), so they cost nothing extra.

KV cache per token per GPU (replicated on every rank: the latent cache has one "head"): per attention layer one
MLA row (`fp8_ds_mla` 656 B: 512 e4m3 + 4 fp32 scales + 64 bf16; otherwise 576 values of the cache dtype), plus
one indexer key (132 B: 128 e4m3 + one fp32 scale) per layer that runs the indexer. vLLM allocates in blocks of
`block_size` tokens, all layers at once.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Literal, Mapping

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from glm5lib.errors import UserError
from glm5lib.model.quant import RECIPE_TYPES as LLAMA_RECIPES
from glm5lib.model.quant import fallback_type
from glm5lib.model.quant import quant_recipe as llama_quant_recipe
from glm5lib.model.spec import GLM5Config, TensorSpec, gguf_tensor_specs

Residency = Literal["quantized", "dense-attn", "dequantized"]
RESIDENCIES: tuple[str, ...] = ("quantized", "dense-attn", "dequantized")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# GGUF type names a plain (unquantized) dtype is stored as.
_DTYPE_GGML = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
KV_BLOCK_SIZE = 64  # sparse MLA needs blocks that are a multiple of 64 (the indexer cache); vLLM picks 64
INDEXER_KEY_BYTES = 132  # 128 e4m3 + one fp32 scale per 128 values (vLLM's indexer cache, any cache dtype)

# Kinds (GGUF name without "blk.N.") the glm5lib loader always dequantizes to the serving dtype.
LOADER_DEQUANTIZED = ("attn_k_b.weight", "attn_v_b.weight", "indexer.attn_k.weight", "indexer.proj.weight",
                      "nextn.eh_proj.weight")
# Kinds held in fp32 whatever the serving dtype (vLLM builds them so).
FP32_KINDS = ("exp_probs_b.bias", "indexer.k_norm.weight", "indexer.k_norm.bias")
EXPERT_KINDS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
_REPLICATED = ("attn_q_a.weight", "attn_kv_a_mqa.weight", "indexer.attn_q_b.weight", "indexer.attn_k.weight",
               "indexer.proj.weight", "ffn_gate_inp.weight", "nextn.eh_proj.weight")
_VOCAB = ("token_embd.weight", "output.weight")


@functools.lru_cache(maxsize=16)
def _specs(cfg: GLM5Config, include_mtp: bool = True) -> tuple[TensorSpec, ...]:
    return tuple(gguf_tensor_specs(cfg, include_mtp=include_mtp))


def split_of(spec: TensorSpec) -> str:
    """How vLLM's tensor parallelism holds this tensor: 'vocab', 'experts', 'split' or 'replicated'."""
    if spec.kind in _VOCAB:
        return "vocab"
    if spec.kind in EXPERT_KINDS:
        return "experts"
    if len(spec.shape) == 1 or spec.kind in _REPLICATED:
        return "replicated"
    return "split"


# ---- types: from a file, or from a recipe ---------------------------------------------------------------------


def ggml_nbytes(numel: int, row: int, type_name: str) -> int:
    """Bytes of `numel` values in GGML type `type_name` (rows of `row` values; gguf-py's block sizes)."""
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    if row % block:
        raise UserError(f"type {type_name}: rows of {row} values are not whole blocks of {block}")
    return numel // block * nbytes


# Recipes (llama.cpp ftype names) and their main type; plain types name themselves.
RECIPES = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "Q5_K_S": "Q5_K", "Q6_K": "Q6_K",
           "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q5_0": "Q5_0", "BF16": "BF16", "F16": "F16", "F32": "F32"}


def quant_recipe(cfg: GLM5Config, ftype: str) -> dict[str, str]:
    """GGUF type per tensor that llama.cpp's quantizer picks for `ftype`: the K-quant mixes and Q8_0 exactly as
    llama-quantize does (glm5lib.model.quant, proven against its output); other types as the converter writes
    them (1-D and router tensors F32, the rest `ftype` with the block-32 fallback)."""
    ftype = ftype.upper()
    if ftype in LLAMA_RECIPES:
        return llama_quant_recipe(cfg, ftype)
    return dict(_recipe(cfg, ftype))


@functools.lru_cache(maxsize=32)
def _recipe(cfg: GLM5Config, ftype: str) -> tuple[tuple[str, str], ...]:
    if ftype not in RECIPES and ftype not in GGMLQuantizationType.__members__:
        raise UserError(f"--quant {ftype}: use one of {', '.join(RECIPES)} or a GGML type name")
    main = RECIPES.get(ftype, ftype)
    return tuple((s.gguf_name, "F32" if s.storage == "f32" else fallback_type(main, s.ggml_shape[0]))
                 for s in _specs(cfg))


def types_from_gguf(path: str | os.PathLike) -> tuple[GLM5Config, dict[str, str]]:
    """The config and the GGUF type of every tensor, from the headers of a glm-dsa file (any shard of a set)."""
    from glm5lib.gguf import open_gguf
    from glm5lib.model.spec import GGUF_ARCH, config_from_gguf_metadata, config_problems, metadata_problems

    g = open_gguf(path)
    if g.arch != GGUF_ARCH:
        raise UserError(f"{path}: architecture {g.arch!r}, not {GGUF_ARCH}")
    wrong = metadata_problems(g.kv)
    if wrong:
        raise UserError(f"{path}: {wrong[0]}")
    try:
        cfg = config_from_gguf_metadata(g.kv)
    except KeyError as exc:
        raise UserError(f"{path}: metadata key {exc.args[0]} missing") from None
    except (TypeError, ValueError) as exc:  # a string or a list where a number belongs
        raise UserError(f"{path}: unusable {GGUF_ARCH} metadata ({exc})") from None
    bad = config_problems(cfg.to_hf_dict())
    if bad:
        raise UserError(f"{path}: {bad[0]}")
    return cfg, {t.name: t.ggml_type.name for t in g.tensors}


# ---- the size model --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSize:
    name: str
    kind: str
    block: int | None
    numel: int
    row: int  # values per ggml row (the block-divisibility unit)
    stored_type: str  # GGUF type in the file (or recipe)
    resident: str  # what the GPU holds: a GGUF type name, or a dtype ("bfloat16", "float32")
    split: str  # vocab | experts | split | replicated
    params_per_gpu: int  # rank 0's share of the values
    bytes_per_gpu: int  # rank 0's bytes, as resident
    expert: bool


@dataclass
class SizeModel:
    cfg: GLM5Config
    tp: int
    residency: str
    dtype: str
    include_mtp: bool
    tensors: list[TensorSize] = field(default_factory=list)
    buffer_bytes_per_gpu: int = 0  # RoPE cos/sin caches, the top-k index buffer

    # -- totals --
    @property
    def weights_bytes_per_gpu(self) -> int:
        """Everything the model holds on one GPU before the KV cache: weights and fixed buffers."""
        return sum(t.bytes_per_gpu for t in self.tensors) + self.buffer_bytes_per_gpu

    @property
    def params_per_gpu(self) -> int:
        return sum(t.params_per_gpu for t in self.tensors)

    @property
    def params_total(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def file_bytes(self) -> int:
        return sum(ggml_nbytes(t.numel, t.row, t.stored_type) for t in self.tensors)

    @property
    def expert_bytes_per_gpu(self) -> int:
        return sum(t.bytes_per_gpu for t in self.tensors if t.expert)

    @property
    def non_expert_bytes_per_gpu(self) -> int:
        return sum(t.bytes_per_gpu for t in self.tensors if not t.expert)

    def bytes_by(self, key: str = "kind") -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            k = getattr(t, key)
            out[k] = out.get(k, 0) + t.bytes_per_gpu
        return out

    def expert_slice_bytes_per_gpu(self, layer: int) -> float:
        """One routed expert's gate+up+down on one GPU in MoE layer `layer` (its per-rank slice)."""
        b = sum(t.bytes_per_gpu for t in self.tensors if t.expert and t.block == layer)
        return b / self.cfg.n_routed_experts

    @property
    def moe_layers(self) -> list[int]:
        return sorted({t.block for t in self.tensors if t.expert and t.block is not None})


def _resident(spec: TensorSpec, stored: str, residency: str, dtype: str) -> str:
    if spec.kind in FP32_KINDS:
        return "float32"
    if len(spec.shape) == 1 or spec.kind == "indexer.proj.weight" or spec.kind == "ffn_gate_inp.weight":
        return dtype  # norms, router and weights_proj (fused with wk) are built unquantized
    if stored in ("F32", "F16", "BF16"):
        return dtype
    if spec.kind in LOADER_DEQUANTIZED or residency == "dequantized":
        return dtype
    if residency == "dense-attn" and spec.kind not in EXPERT_KINDS:
        return dtype
    return stored


def _share(spec: TensorSpec, split: str, tp: int, cfg: GLM5Config) -> tuple[int, float]:
    """(values on rank 0, fraction of the tensor's values they are)."""
    n = spec.numel
    if split == "replicated" or tp == 1:
        return n, 1.0
    if split == "vocab":
        per = math.ceil(_round_up(spec.shape[0], VOCAB_PADDING) / tp)
        rows = min(per, spec.shape[0])
        return rows * spec.shape[1], rows / spec.shape[0]
    if split in ("split", "experts"):
        return math.ceil(n / tp), 1.0 / tp
    raise AssertionError(split)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def size_model(cfg: GLM5Config, types: Mapping[str, str] | None = None, *, tp: int = 1,
               residency: str = "quantized", dtype: str = "bfloat16", include_mtp: bool = True,
               max_num_batched_tokens: int = 8192) -> SizeModel:
    """Weight bytes per GPU of `cfg` at tensor parallel `tp`. `types`: GGUF type per tensor name (a file's, or
    `quant_recipe`'s); None = every weight stored in `dtype`."""
    if residency not in RESIDENCIES:
        raise UserError(f"residency {residency!r}: use one of {', '.join(RESIDENCIES)}")
    if dtype not in DTYPE_BYTES:
        raise UserError(f"dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    if tp < 1 or cfg.num_attention_heads % tp:
        raise UserError(f"tensor parallel {tp} does not divide {cfg.num_attention_heads} attention heads")
    specs = _specs(cfg, include_mtp)
    if types is not None:
        missing = [s.gguf_name for s in specs if s.gguf_name not in types]
        if missing:
            raise UserError(f"{len(missing)} tensors have no type (first: {missing[0]}); not a complete glm-dsa file")
    m = SizeModel(cfg, tp, residency, dtype, include_mtp)
    for s in specs:
        stored = types[s.gguf_name] if types is not None else ("F32" if s.storage == "f32" else _DTYPE_GGML[dtype])
        resident = _resident(s, stored, residency, dtype)
        split = split_of(s)
        n_rank, frac = _share(s, split, tp, cfg)
        if resident in DTYPE_BYTES:
            nbytes = n_rank * DTYPE_BYTES[resident]
        else:  # quantized blocks split with their values
            nbytes = math.ceil(ggml_nbytes(s.numel, s.ggml_shape[0], resident) * frac)
        m.tensors.append(TensorSize(s.gguf_name, s.kind, s.block, s.numel, s.ggml_shape[0], stored, resident, split, n_rank, nbytes,
                                    s.kind in EXPERT_KINDS))
    m.buffer_bytes_per_gpu = fixed_buffer_bytes(cfg, max_num_batched_tokens=max_num_batched_tokens, dtype=dtype)
    return m


def fixed_buffer_bytes(cfg: GLM5Config, *, max_num_batched_tokens: int = 8192, dtype: str = "bfloat16") -> int:
    """Buffers vLLM's model allocates besides weights: the RoPE cos/sin cache (max positions x rope dim in the
    model dtype; the indexer's RoPE has the same parameters, so vLLM's `get_rope` shares one) and the top-k index
    buffer (max_num_batched_tokens x index_topk int32, shared by all layers)."""
    rope = cfg.max_position_embeddings * cfg.qk_rope_head_dim * DTYPE_BYTES[dtype]
    topk = max_num_batched_tokens * cfg.index_topk * 4
    return rope + topk


# ---- KV cache --------------------------------------------------------------------------------------------------

KV_CACHE_DTYPES = ("auto", "fp8_ds_mla", "bfloat16", "float16", "float32")


def mla_row_bytes(cfg: GLM5Config, kv_cache_dtype: str = "auto", dtype: str = "bfloat16") -> int:
    """One token's latent-cache row in one layer."""
    if kv_cache_dtype == "fp8_ds_mla":
        return cfg.kv_lora_rank + 4 * (cfg.kv_lora_rank // 128) + 2 * cfg.qk_rope_head_dim
    d = dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    if d not in DTYPE_BYTES:
        raise UserError(f"kv-cache dtype {kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}")
    return cfg.mla_qk_dim * DTYPE_BYTES[d]


def attention_layers(cfg: GLM5Config, include_mtp: bool = True) -> list[int]:
    n = cfg.num_layers_total if include_mtp else cfg.num_hidden_layers
    return list(range(n))


def kv_bytes_per_token(cfg: GLM5Config, kv_cache_dtype: str = "auto", dtype: str = "bfloat16", *,
                       include_mtp: bool = True) -> dict[str, int]:
    """Per GPU (every rank holds all of it): {'mla': .., 'indexer': .., 'total': ..} bytes per token."""
    layers = attention_layers(cfg, include_mtp)
    mla = len(layers) * mla_row_bytes(cfg, kv_cache_dtype, dtype)
    idx = sum(INDEXER_KEY_BYTES for i in layers if cfg.has_indexer(i))
    return {"mla": mla, "indexer": idx, "total": mla + idx}


def kv_tokens(available_bytes: float, per_token: int, block_size: int = KV_BLOCK_SIZE) -> int:
    """Tokens vLLM's cache holds in `available_bytes`: whole blocks of `block_size` tokens across all layers."""
    if available_bytes <= 0:
        return 0
    blocks = int(available_bytes // (per_token * block_size))
    return blocks * block_size


def sequences_at(tokens: int, seq_len: int, block_size: int = KV_BLOCK_SIZE) -> int:
    """Sequences of `seq_len` tokens that fit `tokens` cache tokens (each takes whole blocks)."""
    per = math.ceil(seq_len / block_size) * block_size
    return tokens // per if per else 0


def expected_distinct_experts(batch: int, n_experts: int, k: int) -> float:
    """Distinct experts a batch of `batch` tokens touches in one layer, for uniform independent routing."""
    return n_experts * (1.0 - (1.0 - k / n_experts) ** batch)


def total_params(cfg: GLM5Config, include_mtp: bool = True) -> int:
    return sum(s.numel for s in _specs(cfg, include_mtp))
