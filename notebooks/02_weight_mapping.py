# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Weight mapping: glm-dsa GGUF ↔ HF / vLLM
#
# Nothing public loads a GLM-5 GGUF into vLLM: vLLM dropped in-tree GGUF, `vllm-gguf-plugin` does not know
# `glm-dsa` (it expects the legacy `attn_kv_b`), and transformers' GGUF support covers neither deepseek2 nor
# glm-dsa. People patch loaders by hand, and a wrong layout *loads fine* and only shows up as garbage text.
#
# This notebook walks through `glm5lib.mapping`, which makes the mapping tested and explainable:
#
# 1. **Inventory**: what a glm-dsa file must hold, and `map check` on the file at hand (headers only).
# 2. **Mapping table**: GGUF name/shape → HF name/shape, with the transform.
# 3. **kv_b rebuild**: `attn_k_b` + `attn_v_b` → `kv_b_proj`, and every rebuilt tensor vs the original.
# 4. **Layer-level numeric check**: one attention layer + indexer from GGUF weights vs transformers' reference.
# 5. **Broken mappings**: what `map check` and the layer check report for planted defects.
# 6. **Config and tokenizer** rebuilt from GGUF metadata.
#
# By default it runs on the embedded tiny GLM-5 (real attention geometry: kv_lora 512, nope 192, rope 64,
# v 256), as a llama.cpp-style *split* shard set. Point `GGUF_PATH` at a real shard set to check that instead.

# %% tags=["parameters"]
GGUF_PATH = None  # any shard of a glm-dsa GGUF set; None: the tiny model, split
TINY_TYPE = "Q8_0"  # tiny file type when GGUF_PATH is None: F32, BF16, Q8_0, Q4_0
HF_DIR = None  # HF directory with the original weights (config.json used for the comparison); None: tiny's
HF_CONFIG = None  # a config.json to compare with (defaults to HF_DIR/config.json)
LAYER = None  # attention layer for the numeric check; None: the first MoE layer
TABLE_BLOCKS = None  # blocks shown in the mapping table; None: first dense, first MoE and the MTP block
INTERACTIVE = False
PROFILE = "ci"

# %%
import json
import tempfile
from pathlib import Path

import torch
from IPython.display import Image, display

from glm5lib.mapping import compare_hf_configs, gguf_to_hf_config, mapping_table
from glm5lib.mapping.compare import (compare_weights, kv_b_round_trip, plot_bytes_by_kind, plot_layer_check,
                                     tokenizer_agreement)
from glm5lib.mapping.config import config_from_gguf
from glm5lib.mapping.corpus import defects, write_defect
from glm5lib.mapping.inventory import check, expected_inventory
from glm5lib.mapping.layer_check import layer_check
from glm5lib.model.spec import GLM5Config
from glm5lib.mapping.tiny import ensure_tiny
from glm5lib.paths import outputs_dir
from glm5lib.workbook import record

torch.set_num_threads(2)
FIGURES = outputs_dir() / "figures"
tiny = None
if GGUF_PATH is None:
    tiny = ensure_tiny(progress=False)
    GGUF_PATH = tiny.shards[TINY_TYPE][0]
    HF_DIR = HF_DIR or tiny.hf_dir
HF_CONFIG = HF_CONFIG or (Path(HF_DIR) / "config.json" if HF_DIR else None)
print("GGUF:", GGUF_PATH)
print("HF:  ", HF_DIR)
record("gguf_path", str(GGUF_PATH))
record("is_tiny", tiny is not None)

# %% [markdown]
# ## 1. Inventory
#
# The expected inventory comes from `glm5lib.model.spec` (one source of truth): for GLM-5 with its MTP layer,
# 1,809 tensors: 3 global + 3 dense blocks × 18 + 75 MoE blocks × 23 + the MTP block × 27. GLM-5.2's
# IndexShare layers ("shared") have no indexer tensors, so 57 layers × 5 fewer.

# %%
n_glm5 = len(expected_inventory(GLM5Config.glm5()))
n_glm52 = len(expected_inventory(GLM5Config.glm5_2()))
print(f"GLM-5: {n_glm5} tensors; GLM-5.2 (IndexShare): {n_glm52}")
record("expected_glm5", n_glm5)
record("expected_glm5_2", n_glm52)

# %% [markdown]
# `map check` reads only the headers of every shard (a 400 GB set takes well under a second) and lists missing,
# unexpected, misshapen and oddly typed tensors, metadata that contradicts itself or the tensor shapes, a
# config.json that disagrees, and the bytes per tensor kind. Same as `glm5lib map check PATH --config config.json`.

# %%
given_config = json.loads(Path(HF_CONFIG).read_text()) if HF_CONFIG else None
report = check(GGUF_PATH, config=given_config)
print(report.format_text(max_lines=5))
display(Image(str(plot_bytes_by_kind(report, FIGURES / "02_bytes_by_kind.png"))))
record("check_ok", report.ok)
record("check_tensors", report.n_tensors)
record("check_expected", report.n_expected)
record("check_shards", report.shards)
record("check_counts", {c: report.count(c) for c in ("missing", "unexpected", "misshapen", "type", "metadata",
                                                      "config", "fallback", "note")})

# %% [markdown]
# ## 2. The mapping table
#
# ggml writes shapes fastest-dimension first (`ne`), the reverse of torch's. Most tensors map 1:1. Three
# transforms need care: the stacked experts (`ffn_*_exps`, sliced per expert — quantized bytes too, so one expert
# at a time is dequantized), and `kv_b_proj`, which llama.cpp splits into `attn_k_b` (W_UK, transposed per head)
# and `attn_v_b` (W_UV) so that kernels can absorb them.

# %%
cfg = config_from_gguf(GGUF_PATH)
blocks = set(TABLE_BLOCKS) if TABLE_BLOCKS else {0, cfg.first_k_dense_replace, cfg.num_hidden_layers}
rows = mapping_table(cfg, blocks=blocks)
for r in rows:
    print(f"{r.gguf_name:36s} {str(list(r.ggml_shape)):18s} {r.hf_name:56s} {str(list(r.hf_shape)):14s} {r.transform}")
record("table_rows_full", len(mapping_table(cfg)))
record("table_kinds", {k: sum(r.kind == k for r in mapping_table(cfg)) for k in ("identity", "k_b", "v_b", "experts")})

# %%
if INTERACTIVE:
    import ipywidgets as widgets
    from IPython.display import display

    def _show(block):
        for r in mapping_table(cfg, blocks={block}):
            if r.gguf_name.startswith(f"blk.{block}."):
                print(f"{r.gguf_name:36s} {str(list(r.ggml_shape)):18s} {r.hf_name:56s} {r.transform}")

    display(widgets.interactive(_show, block=widgets.IntSlider(0, 0, cfg.num_layers_total - 1)))

# %% [markdown]
# ## 3. The kv_b rebuild and its round trip
#
# `kv_b_proj` is `[H·(192+256), 512]`; viewed `[H, 448, 512]`, rows `:192` of each head are W_UK and `192:` are
# W_UV. llama.cpp stores `attn_k_b = W_UK.transpose(1, 2)` (`[H, 512, 192]`, ggml ne `[192, 512, H]`) and
# `attn_v_b = W_UV` (`[H, 256, 512]`). Merging and splitting are slices and one transpose, so the round trip is
# exact in any dtype.

# %%
rt = kv_b_round_trip(GGUF_PATH, layer=cfg.first_k_dense_replace)
print(rt)
record("kv_b_round_trip", rt)

# %% [markdown]
# Every HF tensor rebuilt by `iter_hf_weights` (the streaming iterator a vLLM loader calls) against the original
# checkpoint. For the tiny model: F32 and BF16 are bit-exact (BF16 against the original rounded to bf16; tensors
# llama.cpp keeps in F32 stay exact), Q8_0 differs by quantization only.

# %%
if tiny is not None:
    exact = {}
    for ft in ("F32", "BF16", "Q8_0"):
        r = compare_weights(tiny.shards[ft][0], tiny.hf_dir,
                            round_reference_to=torch.bfloat16 if ft == "BF16" else None)
        exact[ft] = r
        print(f"{ft:5s}: {r['bit_exact']}/{r['compared']} bit-exact, worst rel err {r['worst_rel_err']:.2e}"
              f" ({r['worst_tensor']}); HF tensors not rebuilt: {len(r['hf_not_rebuilt'])}")
    record("weights_compare", exact)
elif HF_DIR:
    r = compare_weights(GGUF_PATH, HF_DIR, progress=True)
    print(r)
    record("weights_compare", {"given": r})

# %% [markdown]
# ## 4. Layer-level numeric check
#
# Names and shapes cannot catch a layout bug: a transposed W_UK still has a shape that fits. So we run one
# attention layer (with its DSA indexer; `T = 1.5 × index_topk`, so the indexer really drops keys) three ways on
# the same input:
#
# * `reference`: transformers' `GlmMoeDsaAttention` with the original HF weights;
# * `hf_from_gguf`: the same module with weights rebuilt from the GGUF;
# * `absorbed_from_gguf`: the absorbed MLA form a sparse kernel runs, fed directly with the stored
#   `attn_k_b` / `attn_v_b` (`q̂ = q_nope · k_b`, `o = v_b · o_lat`).
#
# and compare against three deliberately broken loaders (all load without error):
# `k_b_not_transposed`, `kv_swapped` (v rows before k rows), `kv_b_blocked` (all k heads, then all v heads).

# %%
if HF_DIR:
    lc = layer_check(GGUF_PATH, HF_DIR, layer=LAYER)
    print(lc.format_text())
    display(Image(str(plot_layer_check(lc.results, FIGURES / "02_layer_check.png",
                                       title=f"layer {lc.layer}, {Path(GGUF_PATH).name}"))))
    record("layer_check", lc.as_dict())

# %% [markdown]
# Quantization noise (Q8_0) sits around 1e-4 in cosine difference; each broken loader is at 0.3–1, three or more
# orders of magnitude higher. The F32 file gives exactly 0 for `hf_from_gguf` and ~1e-13 for the absorbed form
# (float reassociation only).

# %%
if tiny is not None:
    lc32 = layer_check(tiny.shards["F32"][0], tiny.hf_dir, layer=LAYER)
    print(lc32.format_text())
    record("layer_check_f32", lc32.as_dict())

# %% [markdown]
# ## 5. A corpus of broken files
#
# Copies of the tiny F32 file with one planted defect each. `map check` must flag each one (exit 1) with the
# right category; the clean file passes.

# %%
if tiny is not None:
    caught = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, category) in defects(tiny.config).items():
            bad = write_defect(tiny.gguf["F32"], Path(tmp) / f"{name}.gguf", name)
            rep = check(bad)
            hits = [f.message for f in rep.findings if f.category == category]
            caught[name] = {"expected": category, "exit_code": rep.exit_code, "found": len(hits)}
            print(f"{name:18s} exit {rep.exit_code}  {category:10s} {hits[0] if hits else 'NOT FOUND'}")
    record("defects", caught)

# %% [markdown]
# ## 6. Config and tokenizer from GGUF metadata
#
# `gguf_to_hf_config` rebuilds `config.json` (with the keys vLLM would otherwise default wrongly:
# `indexer_rope_interleave`, `scoring_func: sigmoid`, `topk_method: noaux_tc`). Against the original config the
# only differences are notes: llama.cpp's converter writes `bos = eos`, and a quantized file's checkpoint
# dtype is bfloat16. The tokenizer is rebuilt by transformers' GGUF converter and must encode exactly as the
# original, special tokens and chat template included.

# %%
rebuilt = gguf_to_hf_config(GGUF_PATH)
for key in ("indexer_rope_interleave", "scoring_func", "topk_method", "qk_nope_head_dim", "v_head_dim",
            "kv_lora_rank", "index_topk"):
    print(f"{key:24s} {rebuilt[key]}")
if given_config is not None:
    diffs = compare_hf_configs(rebuilt, given_config)
    for d in diffs:
        print(d)
    record("config_diffs", [{"key": d.key, "severity": d.severity} for d in diffs])

# %%
if HF_DIR and (Path(HF_DIR) / "tokenizer.json").exists():
    from glm5lib.model.tokenizer import corpus_text

    texts = [line for line in corpus_text().splitlines() if line.strip()][:200]
    texts += [" ünïcödé 😀\ttabs  and   spaces\n", "[gMASK]<sop><|user|>\nhello<|assistant|>\n"]
    agreement = tokenizer_agreement(GGUF_PATH, HF_DIR, texts, chat=[{"role": "user", "content": "Hi!"}])
    print(agreement)
    record("tokenizer", agreement)
