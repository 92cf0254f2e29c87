"""Which ggml type llama.cpp's `llama-quantize` gives each tensor of a glm-dsa file, per file type (Q4_K_M, ...).

`quant_recipe(cfg, "Q4_K_M")` -> {gguf tensor name: ggml type name} for every tensor of `gguf_tensor_specs(cfg)`,
as `llama_tensor_get_type` in llama.cpp's src/llama-quant.cpp (the one vendored in llama-cpp-python 0.3.36)
decides it without an importance matrix or overrides. Only what reaches glm-dsa tensors is modelled:

- quantized at all: tensors of 2+ dims whose name ends in "weight", except `*_norm.weight` and the router
  `ffn_gate_inp.weight`; the rest keep the converter's type (F32). `indexer.proj.weight` is 2-D, so it IS
  quantized although the converter writes it F32;
- categories by name substring: `output.weight` (Q6_K unless its rows need a fallback, then Q8_0),
  `token_embd.weight` (the default type: GLM-5 has an untied output), `attn_k.weight` (only
  `indexer.attn_k`), `attn_output.weight`, `ffn_down` (dense, routed and shared experts alike),
  `ffn_gate`/`ffn_up`; glm-dsa has no `attn_v`/`attn_qkv`/`attn_kv_b` tensors, the counters of which depend
  on tensor order;
- `ffn_down` gets Q6_K on layers where `use_more_bits(layer, block_count)` holds (block_count counts the MTP
  layer), for Q4_K_M and Q5_K_M; Q5_K on the first eighth of the layers for Q4_K_S;
- models with exactly 8 experts (the tiny GLM-5, not GLM-5's 256) get Q8_0 on `attn_k` and, for Q4_K_M/Q4_K_S,
  Q5_K on `attn_output`: llama.cpp's Mixtral rules, keyed on the expert count alone;
- rows not a whole number of blocks fall back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (F16 if that fails
  too). GLM-5's `attn_k_b` (rows of 192) is the one tensor kind this hits at full size.

llama.cpp is C++ with no callable type chooser (`--dry-run` needs the real file), so the choice is restated here;
tests prove it against the real `llama-quantize` output of the tiny model, tensor by tensor.
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from glm5lib.model.spec import GLM5Config, TensorSpec, gguf_tensor_specs

# llama-quantize file types this module models -> their default tensor type (llama_ftype_get_default_type).
RECIPE_TYPES: dict[str, str] = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "Q5_K_S": "Q5_K",
                                "Q6_K": "Q6_K", "Q8_0": "Q8_0"}

# tensor_type_fallback: the block-32 type a 256-block type falls back to when rows do not divide.
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0",
             "TQ2_0": "Q4_0", **{t: "IQ4_NL" for t in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                                                       "IQ3_S", "IQ4_XS")}}


def _block(type_name: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's layer pick for extra bits: the first and last eighth, and every third layer between.
    (`//` matches C++ integer division for the non-negative values here.)"""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def is_quantized_by_llama(spec: TensorSpec) -> bool:
    """tensor_allows_quantization for the names a glm-dsa file holds."""
    name = spec.gguf_name
    return (len(spec.shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name)


def _category(name: str) -> str:
    """tensor_get_category (first match wins, by substring, as llama.cpp tests them)."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for sub, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                     ("ffn_down", "ffn_down")):
        if sub in name:
            return cat
    return "other"


def fallback_type(type_name: str, row: int) -> str:
    """tensor_type_fallback: `type_name` if it divides rows of `row`, else its block-32 fallback, else F16."""
    if row % _block(type_name) == 0:
        return type_name
    new = _FALLBACK.get(type_name, type_name)
    if new == type_name and _block(type_name) > 32:
        raise ValueError(f"llama.cpp defines no fallback from {type_name} for rows of {row}")
    return new if row % _block(new) == 0 else "F16"


def tensor_quant_type(cfg: GLM5Config, spec: TensorSpec, file_type: str) -> str:
    """The ggml type llama-quantize `file_type` writes for one tensor of a converter-written glm-dsa file."""
    if file_type not in RECIPE_TYPES:
        raise ValueError(f"no llama-quantize recipe for {file_type!r}; choose from {', '.join(RECIPE_TYPES)}")
    if not is_quantized_by_llama(spec):
        return "F32"  # every tensor llama.cpp leaves alone is one the converter wrote F32
    new = RECIPE_TYPES[file_type]
    cat = _category(spec.gguf_name)
    n_layer = cfg.num_layers_total  # hparams.n_layer_all: block_count, MTP included
    eight_experts = cfg.n_routed_experts == 8
    if cat == "output":
        row = spec.ggml_shape[0]
        new = "Q8_0" if row % _block(new) else new if new == "Q8_0" else "Q6_K"
    elif cat == "attn_v":
        raise ValueError(f"{spec.gguf_name}: glm-dsa has no attn_v-like tensors; this recipe does not model them")
    elif cat == "attn_k":
        if eight_experts:
            new = "Q8_0"
    elif cat == "ffn_down":
        if file_type in ("Q4_K_M", "Q5_K_M") and use_more_bits(spec.block, n_layer):
            new = "Q6_K"
        elif file_type == "Q4_K_S" and spec.block < n_layer // 8:
            new = "Q5_K"
    elif cat == "attn_output":
        if eight_experts and file_type in ("Q4_K_M", "Q4_K_S"):
            new = "Q5_K"
    return fallback_type(new, spec.ggml_shape[0])


def quant_recipe(cfg: GLM5Config, file_type: str = "Q4_K_M", *, include_mtp: bool = True) -> dict[str, str]:
    """{gguf tensor name: ggml type name} that llama-quantize `file_type` produces from a converter-written
    (F32 or BF16) glm-dsa file of `cfg`, in converter order."""
    return {s.gguf_name: tensor_quant_type(cfg, s, file_type)
            for s in gguf_tensor_specs(cfg, include_mtp=include_mtp)}
