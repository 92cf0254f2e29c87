"""The GLM-5 family in one place: config fields, tensor names (HF and GGUF), shapes and storage types.

Everything that needs a GLM-5 name or shape (the tiny builder, the GGUF <-> HF mapping, the validator, the
reference forward and the vLLM loader) asks this module; nothing else spells a tensor name.

Conventions
- `shape` is the torch shape (row-major, as in safetensors); GGUF stores `ne = reversed(shape)`.
- HF names are the checkpoint names (per-expert weights, fused `kv_b_proj`), i.e. what zai-org ships and what
  vLLM's `GlmMoeDsaForCausalLM.load_weights` consumes.
- GGUF names follow llama.cpp's `glm-dsa` converter (docs/glm5.md section 4).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterator, Literal

# GGUF file types the tiny builder writes (the ones gguf-py can quantize to) and its default set.
GGUF_FILE_TYPES = ("F32", "BF16", "Q8_0", "Q5_0", "Q4_0")
TINY_DEFAULT_TYPES = ("F32", "BF16", "Q8_0", "Q4_0")
# llama.cpp's K-quant mixes, which the tiny builder makes with a `llama-quantize` binary (per-tensor types as
# llama.cpp chooses them: glm5lib.model.quant), and the tiny type set that includes them.
LLAMA_QUANTIZE_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K")
TINY_KQUANT_TYPES = TINY_DEFAULT_TYPES + LLAMA_QUANTIZE_TYPES

HF_ARCHITECTURE = "GlmMoeDsaForCausalLM"
HF_MODEL_TYPE = "glm_moe_dsa"
GGUF_ARCH = "glm-dsa"

# How a GGUF tensor relates to HF tensors.
Transform = Literal["identity", "k_b", "v_b", "experts"]
# Where a tensor may use the file's main type, or must stay F32 (llama.cpp's converter keeps 1-D tensors,
# biases, the router and the indexer's weights_proj in F32).
Storage = Literal["main", "f32"]


@dataclass(frozen=True)
class GLM5Config:
    """The config fields that define a GLM-5-family model. Defaults are zai-org/GLM-5."""

    vocab_size: int = 154880
    hidden_size: int = 6144
    intermediate_size: int = 12288
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 78
    num_attention_heads: int = 64
    q_lora_rank: int = 2048
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 192
    qk_rope_head_dim: int = 64
    v_head_dim: int = 256
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 2048
    first_k_dense_replace: int = 3
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    max_position_embeddings: int = 202752
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-5
    num_nextn_predict_layers: int = 1
    # GLM-5.2 "IndexShare": per layer "full" (runs the indexer) or "shared" (reuses the previous full layer's
    # top-k, has no indexer weights). None means every layer is "full" (GLM-5, GLM-5.1).
    indexer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | None = 1
    pad_token_id: int | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"

    # ---- named members of the family -------------------------------------------------------------------
    @classmethod
    def glm5(cls) -> "GLM5Config":
        return cls()

    @classmethod
    def glm5_2(cls) -> "GLM5Config":
        """GLM-5.2: longer RoPE, IndexShare (21 of 78 layers run the indexer: freq 4, offset 3)."""
        n = 78
        return cls(
            rope_theta=8_000_000.0,
            max_position_embeddings=1_048_576,
            indexer_types=tuple(indexer_pattern(n, freq=4, offset=3)),
        )

    @classmethod
    def tiny(cls, *, vocab_size: int = 1024, index_topk: int = 64, shared_indexer: bool = False) -> "GLM5Config":
        """The embedded tiny GLM-5: real attention geometry (kv_lora 512, rope 64, nope 192, v 256, indexer
        head 128), few heads/layers/experts. Layer 0 dense, layers 1-2 MoE, layer 3 = MTP."""
        n = 3
        return cls(
            vocab_size=vocab_size,
            hidden_size=256,
            intermediate_size=512,
            moe_intermediate_size=128,
            num_hidden_layers=n,
            num_attention_heads=4,
            q_lora_rank=128,
            index_n_heads=4,
            index_topk=index_topk,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=4096,
            indexer_types=tuple(indexer_pattern(n, freq=2, offset=1)) if shared_indexer else None,
            torch_dtype="float32",
        )

    @classmethod
    def preset(cls, name: str) -> "GLM5Config":
        """A named family member: one of PRESET_NAMES."""
        try:
            return _PRESETS[name](cls)
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESET_NAMES)}") from None

    # ---- derived geometry --------------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:  # 256: per-head q width (nope + rope)
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_b_head_dim(self) -> int:  # 448: rows of kv_b_proj per head (k_nope + v)
        return self.qk_nope_head_dim + self.v_head_dim

    @property
    def mla_qk_dim(self) -> int:  # 576: absorbed q / cached kv row width
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:  # 1/16 for GLM-5 (no YaRN mscale: rope_type default)
        return self.qk_head_dim**-0.5

    @property
    def num_layers_total(self) -> int:  # GGUF block_count: trunk + MTP
        return self.num_hidden_layers + self.num_nextn_predict_layers

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    def is_mtp_layer(self, layer: int) -> bool:
        return layer >= self.num_hidden_layers

    def has_indexer(self, layer: int) -> bool:
        """False for GLM-5.2 'shared' layers. MTP layers always carry an indexer."""
        if self.indexer_types is None or layer >= self.num_hidden_layers:
            return True
        return self.indexer_types[layer] == "full"

    # ---- HF config.json ------------------------------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """config.json for transformers and vLLM (docs/glm5.md sections 1 and 5)."""
        d: dict[str, Any] = {
            "architectures": [HF_ARCHITECTURE],
            "model_type": HF_MODEL_TYPE,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_head_dim": self.qk_head_dim,
            "head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "first_k_dense_replace": self.first_k_dense_replace,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": self.norm_topk_prob,
            "routed_scaling_factor": self.routed_scaling_factor,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_scaling": None,
            "rms_norm_eps": self.rms_norm_eps,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype,
            "use_cache": True,
            # vLLM reads these and defaults them wrongly for GLM-5 when absent (docs/glm5.md section 1).
            "indexer_rope_interleave": True,
            "rope_interleave": True,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
        }
        if self.indexer_types is not None:
            d["indexer_types"] = list(self.indexer_types)
            # vLLM ignores indexer_types and reads the pattern string.
            d["index_topk_pattern"] = "".join("F" if t == "full" else "S" for t in self.indexer_types)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "GLM5Config":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "rope_theta" not in d and isinstance(d.get("rope_parameters"), dict):
            kw["rope_theta"] = d["rope_parameters"].get("rope_theta", cls.rope_theta)
        if kw.get("indexer_types") is not None:
            kw["indexer_types"] = tuple(kw["indexer_types"])
        elif "index_topk_pattern" in d:
            kw["indexer_types"] = tuple("full" if c == "F" else "shared" for c in d["index_topk_pattern"])
        elif d.get("index_topk_freq", 1) > 1:
            kw["indexer_types"] = tuple(
                indexer_pattern(d["num_hidden_layers"], d["index_topk_freq"], d.get("index_skip_topk_offset", 2))
            )
        if kw.get("indexer_types") is not None and all(t == "full" for t in kw["indexer_types"]):
            kw["indexer_types"] = None
        for k in ("rope_theta", "rms_norm_eps", "routed_scaling_factor"):
            if k in kw:
                kw[k] = float(kw[k])
        return cls(**kw)

    def replace(self, **changes: Any) -> "GLM5Config":
        return dataclasses.replace(self, **changes)


# Tensors (GGUF kinds) that GLM-5's HF checkpoint stores in F32 while the rest is BF16: the router's
# e_score_correction_bias. An export keeps them F32 when the GGUF stores them F32 (llama.cpp's converter does).
HF_F32_KINDS = ("exp_probs_b.bias",)

# Fields that are sizes or counts: a model needs each to be at least this.
_AT_LEAST = {"vocab_size": 1, "hidden_size": 1, "intermediate_size": 1, "moe_intermediate_size": 1,
             "num_hidden_layers": 1, "num_attention_heads": 1, "q_lora_rank": 1, "kv_lora_rank": 1,
             "qk_nope_head_dim": 1, "qk_rope_head_dim": 2, "v_head_dim": 1, "index_n_heads": 1, "index_head_dim": 1,
             "index_topk": 1, "first_k_dense_replace": 0, "n_routed_experts": 1, "n_shared_experts": 0,
             "num_experts_per_tok": 1, "n_group": 1, "topk_group": 1, "max_position_embeddings": 1,
             "num_nextn_predict_layers": 0}


def config_problems(d: Any) -> list[str]:
    """What is wrong with an HF config dict as a GLM-5-family config: wrong JSON types, sizes below 1.
    Empty when `GLM5Config.from_hf_dict(d)` gives a usable config. Fields it lacks keep GLM-5 defaults."""
    if not isinstance(d, dict):
        return [f"a config must be a JSON object, not {type(d).__name__}"]
    out = []
    for f in dataclasses.fields(GLM5Config):
        if f.name not in d:
            continue
        v, default = d[f.name], f.default
        if f.name == "indexer_types":
            ok = v is None or (isinstance(v, list) and all(t in ("full", "shared") for t in v))
            want = 'null or a list of "full"/"shared"'
        elif isinstance(default, bool):
            ok, want = isinstance(v, bool), "true or false"
        elif isinstance(default, float):
            ok, want = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
        elif f.name.endswith("_token_id"):  # hub configs list several eos ids
            ok = v is None or _is_int(v) or (isinstance(v, list) and all(_is_int(x) for x in v))
            want = "an integer, a list of integers or null"
        elif isinstance(default, int):
            ok, want = _is_int(v), "an integer"
        else:
            ok, want = isinstance(v, str), "a string"
        if not ok:
            out.append(f"{f.name} is {json_type(v)} {v!r:.40}, expected {want}")
        elif f.name in _AT_LEAST and v < _AT_LEAST[f.name]:
            out.append(f"{f.name} is {v}, must be at least {_AT_LEAST[f.name]}")
    for key in ("index_topk_freq", "index_skip_topk_offset"):
        if key in d and (not isinstance(d[key], int) or isinstance(d[key], bool)):
            out.append(f"{key} is {json_type(d[key])}, expected an integer")
    for key in ("rope_parameters",):
        if key in d and d[key] is not None and not isinstance(d[key], dict):
            out.append(f"{key} is {json_type(d[key])}, expected an object")
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def json_type(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


_PRESETS = {"glm5": lambda c: c.glm5(), "glm5.2": lambda c: c.glm5_2(), "tiny": lambda c: c.tiny()}
PRESET_NAMES = tuple(_PRESETS)


def indexer_pattern(num_layers: int, freq: int, offset: int) -> list[str]:
    """IndexShare pattern, as transformers derives it from `index_topk_freq` / `index_skip_topk_offset`."""
    freq = max(freq, 1)
    return ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(num_layers)]


# ---- the tensor inventory --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One GGUF tensor and the HF tensor(s) it comes from."""

    gguf_name: str
    shape: tuple[int, ...]  # torch order; GGUF ne is reversed(shape)
    hf_names: tuple[str, ...]  # one, or E for stacked experts; kv_b_proj for k_b / v_b
    transform: Transform
    storage: Storage
    kind: str  # gguf name without "blk.N." (e.g. "attn_k_b.weight"): groups tensors in reports
    block: int | None  # layer index, None for global tensors

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _layer_tensors(cfg: GLM5Config, i: int) -> Iterator[TensorSpec]:
    """Tensors of block i in llama.cpp converter order (HF checkpoint order within the layer)."""
    D, H = cfg.hidden_size, cfg.num_attention_heads
    hf = f"model.layers.{i}."
    blk = f"blk.{i}."

    def t(gguf: str, shape: tuple[int, ...], hf_name: str | tuple[str, ...], storage: Storage = "main",
          transform: Transform = "identity") -> TensorSpec:
        names = (hf + hf_name,) if isinstance(hf_name, str) else tuple(hf + n for n in hf_name)
        return TensorSpec(blk + gguf, shape, names, transform, storage, gguf, i)

    if cfg.is_mtp_layer(i):  # MTP-only tensors (llama.cpp drops the MTP copies of embed/head)
        yield t("nextn.eh_proj.weight", (D, 2 * D), "eh_proj.weight")
        yield t("nextn.enorm.weight", (D,), "enorm.weight", "f32")
        yield t("nextn.hnorm.weight", (D,), "hnorm.weight", "f32")
        yield t("nextn.shared_head_norm.weight", (D,), "shared_head.norm.weight", "f32")
    yield t("attn_norm.weight", (D,), "input_layernorm.weight", "f32")
    yield t("attn_q_a.weight", (cfg.q_lora_rank, D), "self_attn.q_a_proj.weight")
    yield t("attn_q_a_norm.weight", (cfg.q_lora_rank,), "self_attn.q_a_layernorm.weight", "f32")
    yield t("attn_q_b.weight", (H * cfg.qk_head_dim, cfg.q_lora_rank), "self_attn.q_b_proj.weight")
    yield t("attn_kv_a_mqa.weight", (cfg.mla_qk_dim, D), "self_attn.kv_a_proj_with_mqa.weight")
    yield t("attn_kv_a_norm.weight", (cfg.kv_lora_rank,), "self_attn.kv_a_layernorm.weight", "f32")
    # kv_b_proj [H*(192+256), 512] is split: k_b = W_UK^T per head, v_b = W_UV (docs/glm5.md section 4).
    yield t("attn_k_b.weight", (H, cfg.kv_lora_rank, cfg.qk_nope_head_dim), "self_attn.kv_b_proj.weight",
            transform="k_b")
    yield t("attn_v_b.weight", (H, cfg.v_head_dim, cfg.kv_lora_rank), "self_attn.kv_b_proj.weight",
            transform="v_b")
    yield t("attn_output.weight", (D, H * cfg.v_head_dim), "self_attn.o_proj.weight")
    if cfg.has_indexer(i):
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        yield t("indexer.attn_q_b.weight", (Hi * Di, cfg.q_lora_rank), "self_attn.indexer.wq_b.weight")
        yield t("indexer.attn_k.weight", (Di, D), "self_attn.indexer.wk.weight")
        yield t("indexer.k_norm.weight", (Di,), "self_attn.indexer.k_norm.weight", "f32")
        yield t("indexer.k_norm.bias", (Di,), "self_attn.indexer.k_norm.bias", "f32")
        yield t("indexer.proj.weight", (Hi, D), "self_attn.indexer.weights_proj.weight", "f32")
    yield t("ffn_norm.weight", (D,), "post_attention_layernorm.weight", "f32")
    if not cfg.is_moe_layer(i):
        I = cfg.intermediate_size
        yield t("ffn_gate.weight", (I, D), "mlp.gate_proj.weight")
        yield t("ffn_up.weight", (I, D), "mlp.up_proj.weight")
        yield t("ffn_down.weight", (D, I), "mlp.down_proj.weight")
        return
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    yield t("ffn_gate_inp.weight", (E, D), "mlp.gate.weight", "f32")
    yield t("exp_probs_b.bias", (E,), "mlp.gate.e_score_correction_bias", "f32")
    for proj, shape in (("gate", (E, I, D)), ("up", (E, I, D)), ("down", (E, D, I))):
        names = tuple(f"mlp.experts.{e}.{proj}_proj.weight" for e in range(E))
        yield t(f"ffn_{proj}_exps.weight", shape, names, transform="experts")
    Is = I * cfg.n_shared_experts
    yield t("ffn_gate_shexp.weight", (Is, D), "mlp.shared_experts.gate_proj.weight")
    yield t("ffn_up_shexp.weight", (Is, D), "mlp.shared_experts.up_proj.weight")
    yield t("ffn_down_shexp.weight", (D, Is), "mlp.shared_experts.down_proj.weight")


def gguf_tensor_specs(cfg: GLM5Config, *, include_mtp: bool = True) -> list[TensorSpec]:
    """Every GGUF tensor of a glm-dsa file, in the converter's order: token_embd, blocks, output_norm, output.

    1,809 for GLM-5 with MTP (3 global + 3 dense x 18 + 75 MoE x 23 + MTP 27)."""
    V, D = cfg.vocab_size, cfg.hidden_size
    specs = [TensorSpec("token_embd.weight", (V, D), ("model.embed_tokens.weight",), "identity", "main",
                        "token_embd.weight", None)]
    n_blocks = cfg.num_layers_total if include_mtp else cfg.num_hidden_layers
    for i in range(n_blocks):
        specs.extend(_layer_tensors(cfg, i))
    specs.append(TensorSpec("output_norm.weight", (D,), ("model.norm.weight",), "identity", "f32",
                            "output_norm.weight", None))
    specs.append(TensorSpec("output.weight", (V, D), ("lm_head.weight",), "identity", "main", "output.weight", None))
    return specs


def hf_tensor_shapes(cfg: GLM5Config, *, include_mtp: bool = True) -> dict[str, tuple[int, ...]]:
    """Every HF checkpoint tensor and its shape (per-expert names, fused kv_b_proj)."""
    out: dict[str, tuple[int, ...]] = {}
    for s in gguf_tensor_specs(cfg, include_mtp=include_mtp):
        if s.transform == "identity":
            out[s.hf_names[0]] = s.shape
        elif s.transform == "experts":
            for n in s.hf_names:
                out[n] = s.shape[1:]
        elif s.transform == "k_b":  # kv_b_proj appears once (from k_b)
            out[s.hf_names[0]] = (cfg.num_attention_heads * cfg.kv_b_head_dim, cfg.kv_lora_rank)
    return out


def specs_by_gguf_name(cfg: GLM5Config, *, include_mtp: bool = True) -> dict[str, TensorSpec]:
    return {s.gguf_name: s for s in gguf_tensor_specs(cfg, include_mtp=include_mtp)}


_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def split_block_name(gguf_name: str) -> tuple[int | None, str]:
    """'blk.12.attn_k_b.weight' -> (12, 'attn_k_b.weight'); 'output.weight' -> (None, 'output.weight')."""
    m = _BLOCK_RE.match(gguf_name)
    return (int(m.group(1)), m.group(2)) if m else (None, gguf_name)


# ---- GGUF metadata -------------------------------------------------------------------------------------------

# (gguf key suffix after "glm-dsa.", GLM5Config field or derived value). One table for the writer (tiny builder)
# and the reader (config reconstruction in the mapping).
def gguf_metadata(cfg: GLM5Config) -> dict[str, Any]:
    """The `glm-dsa.*` keys llama.cpp's converter writes (docs/glm5.md section 4), in its order."""
    a = GGUF_ARCH
    md: dict[str, Any] = {
        f"{a}.block_count": cfg.num_layers_total,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": 1,  # absorbed MLA: one shared latent "head"
        f"{a}.rope.freq_base": float(cfg.rope_theta),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.expert_used_count": cfg.num_experts_per_tok,
        f"{a}.expert_group_count": cfg.n_group,
        f"{a}.expert_group_used_count": cfg.topk_group,
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.attention.q_lora_rank": cfg.q_lora_rank,
        f"{a}.attention.kv_lora_rank": cfg.kv_lora_rank,
        f"{a}.attention.key_length": cfg.mla_qk_dim,  # 576
        f"{a}.attention.value_length": cfg.kv_lora_rank,  # 512
        f"{a}.attention.key_length_mla": cfg.qk_head_dim,  # 256
        f"{a}.attention.value_length_mla": cfg.v_head_dim,  # 256
        f"{a}.leading_dense_block_count": cfg.first_k_dense_replace,
        f"{a}.expert_feed_forward_length": cfg.moe_intermediate_size,
        f"{a}.expert_count": cfg.n_routed_experts,
        f"{a}.expert_shared_count": cfg.n_shared_experts,
        f"{a}.expert_weights_scale": float(cfg.routed_scaling_factor),
        f"{a}.expert_weights_norm": bool(cfg.norm_topk_prob),
        f"{a}.expert_gating_func": 2,  # llama.cpp ExpertGatingFuncType.SIGMOID
        f"{a}.rope.dimension_count": cfg.qk_rope_head_dim,
        f"{a}.nextn_predict_layers": cfg.num_nextn_predict_layers,
        f"{a}.attention.indexer.head_count": cfg.index_n_heads,
        f"{a}.attention.indexer.key_length": cfg.index_head_dim,
        f"{a}.attention.indexer.top_k": cfg.index_topk,
    }
    if cfg.indexer_types is not None:
        md[f"{a}.attention.indexer.types"] = [t == "full" for t in cfg.indexer_types]
    return md


def metadata_problems(kv: dict[str, Any]) -> list[str]:
    """glm-dsa keys of the wrong GGUF type (a string where a number belongs, ...)."""
    out = []
    for key, value in kv.items():
        if not key.startswith(GGUF_ARCH + "."):
            continue
        if key == f"{GGUF_ARCH}.attention.indexer.types":
            if not (isinstance(value, list) and all(isinstance(v, (bool, int)) for v in value)):
                out.append(f"{key} is {json_type(value)}, expected an array of bools")
        elif not isinstance(value, (int, float)):
            out.append(f"{key} is {json_type(value)} {value!r:.40}, expected a number")
    return out


def config_from_gguf_metadata(kv: dict[str, Any]) -> GLM5Config:
    """Inverse of `gguf_metadata` (fields GGUF does not carry keep GLM-5 defaults). Raises KeyError on a missing key."""
    a = GGUF_ARCH
    n_next = int(kv.get(f"{a}.nextn_predict_layers", 0))
    n_layers = int(kv[f"{a}.block_count"]) - n_next
    types = kv.get(f"{a}.attention.indexer.types")
    key_mla = int(kv[f"{a}.attention.key_length_mla"])
    rope = int(kv[f"{a}.rope.dimension_count"])
    return GLM5Config(
        vocab_size=int(kv.get(f"{a}.vocab_size", 0)) or len(kv.get("tokenizer.ggml.tokens", [])),
        hidden_size=int(kv[f"{a}.embedding_length"]),
        intermediate_size=int(kv[f"{a}.feed_forward_length"]),
        moe_intermediate_size=int(kv[f"{a}.expert_feed_forward_length"]),
        num_hidden_layers=n_layers,
        num_attention_heads=int(kv[f"{a}.attention.head_count"]),
        q_lora_rank=int(kv[f"{a}.attention.q_lora_rank"]),
        kv_lora_rank=int(kv[f"{a}.attention.kv_lora_rank"]),
        qk_nope_head_dim=key_mla - rope,
        qk_rope_head_dim=rope,
        v_head_dim=int(kv[f"{a}.attention.value_length_mla"]),
        index_n_heads=int(kv[f"{a}.attention.indexer.head_count"]),
        index_head_dim=int(kv[f"{a}.attention.indexer.key_length"]),
        index_topk=int(kv[f"{a}.attention.indexer.top_k"]),
        first_k_dense_replace=int(kv[f"{a}.leading_dense_block_count"]),
        n_routed_experts=int(kv[f"{a}.expert_count"]),
        n_shared_experts=int(kv[f"{a}.expert_shared_count"]),
        num_experts_per_tok=int(kv[f"{a}.expert_used_count"]),
        n_group=int(kv.get(f"{a}.expert_group_count", 1)),
        topk_group=int(kv.get(f"{a}.expert_group_used_count", 1)),
        norm_topk_prob=bool(kv.get(f"{a}.expert_weights_norm", True)),
        routed_scaling_factor=float(kv[f"{a}.expert_weights_scale"]),
        max_position_embeddings=int(kv[f"{a}.context_length"]),
        rope_theta=float(kv[f"{a}.rope.freq_base"]),
        rms_norm_eps=float(kv[f"{a}.attention.layer_norm_rms_epsilon"]),
        num_nextn_predict_layers=n_next,
        indexer_types=None if types is None or all(types) else tuple("full" if t else "shared" for t in types),
        bos_token_id=kv.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=kv.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=kv.get("tokenizer.ggml.padding_token_id"),
    )
