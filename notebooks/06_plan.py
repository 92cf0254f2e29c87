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
# # 06 · Will it fit? Planning a GLM-5 deployment before loading 400 GB
#
# vLLM answers the memory question only after loading every weight (tens of minutes for a 400 GB shard set), and
# nobody answers the speed question. `glm5lib plan` does both from the GGUF headers:
#
# 1. **Weights per GPU** from the real tensor types and vLLM's tensor-parallel sharding (q_a/kv_a, the indexer,
#    routers and norms replicated on every rank; attention heads, experts and the vocabulary split), plus what the
#    loader must hold in the serving dtype (`kv_b_proj`, the indexer's `wk`, MTP's `eh_proj`).
# 2. **KV cache**: the MLA latent cache is replicated on every rank (656 B per token per layer in `fp8_ds_mla`,
#    1,152 B in bf16) plus 132 B of indexer keys; after vLLM's reserve (estimated), how many tokens and how many
#    sequences of a given length fit.
# 3. **Decode estimate** per batch size: bytes each GPU reads per step over its bandwidth, at the efficiency the
#    kernels reached on the H200 (`outputs/bench`), plus two all-reduces per layer.
#
# The model is a header-only full-size GLM-5 shard set in the types of a Q4_K_M file (1,809 tensor infos,
# sparse data: a few MB on disk), or `GGUF_PATH` when you have a real one.

# %% tags=["parameters"]
GGUF_PATH = None  # any shard of a real glm-dsa set; None: a header-only full-size GLM-5 set in QUANT's types
QUANT = "Q4_K_M"  # types of the header-only set (llama.cpp's recipe)
SETUPS = [  # (label, plan options)
    ["8x RTX PRO 6000 96 GB", {"gpus": 8, "gpu": "rtx-pro-6000", "kv_cache_dtype": "fp8_ds_mla"}],
    ["8x H200", {"gpus": 8, "gpu": "h200"}],
    ["8x A100 80 GB", {"gpus": 8, "gpu": "a100", "kv_cache_dtype": "fp8_ds_mla", "max_model_len": 131072}],
]
CONTEXTS = [4096, 8192, 16384, 32768, 65536, 131072, 202752]
INTERACTIVE = False
PROFILE = "ci"

# %%
import tempfile
from pathlib import Path

from glm5lib.mapping.corpus import write_header_only_set
from glm5lib.model.sizes import quant_recipe
from glm5lib.model.spec import GLM5Config
from glm5lib.paths import outputs_dir
from glm5lib.plotting import pyplot, save_figure
from glm5lib.serving.plan import PlanOptions, format_plan, load_bench, make_plan, resolve_model
from glm5lib.workbook import record

FIGURES = outputs_dir() / "figures"
if GGUF_PATH is None:
    cfg = GLM5Config.glm5()
    shards = write_header_only_set(cfg, Path(tempfile.mkdtemp()) / f"GLM-5-{QUANT}", types=quant_recipe(cfg, QUANT))
    GGUF_PATH = shards[0]
model = resolve_model(str(GGUF_PATH), None, None)
bench = load_bench()
print(model.label, "| main type", model.quant, "| bench:", bench.source)
record("model", model.label)
record("tensors", len(model.types))
record("bench_copy_gbs", bench.copy_gbs)

# %% [markdown]
# ## 1. The three setups
#
# Each plan is what `glm5lib plan GGUF --gpus 8 --gpu NAME [--kv-cache-dtype fp8_ds_mla]` prints. The A100 and
# the RTX PRO 6000 plans use the `fp8_ds_mla` cache (the glm5lib backend reads it on SM80 and SM120); the H200
# keeps the bf16 cache it has room for. On the A100 one full 202,752-token sequence misses by a fraction of a GB
# once vLLM's CUDA-graph pool is reserved (`glm5lib plan` says by how much), so its setup asks for 128K tokens.

# %%
plans = {}
for label, opts in SETUPS:
    p = make_plan(model, PlanOptions(**opts), bench)
    plans[label] = p
    print(f"=== {label}\n{format_plan(p)}\n")
summary = {label: {"fits": p.fits, "weights_gb_per_gpu": round(p.weights_bytes_per_gpu / 1e9, 2),
                   "kv_bytes_per_token": p.kv_bytes_per_token, "max_kv_tokens": p.max_kv_tokens,
                   "max_concurrent_seqs": p.max_concurrent_seqs, "decode_ms": p.decode_ms_estimate,
                   "vllm_command": p.vllm_command}
           for label, p in plans.items()}
record("setups", summary)

# %% [markdown]
# ## 2. Context length against concurrent sequences
#
# The KV budget is fixed once weights and the reserve are placed; every sequence of length L takes L tokens of it
# (in 64-token blocks), on every GPU. The reserve itself grows a little with `--max-model-len` (the sparse
# prefill workspace), so each point is its own plan.

# %%
curves = {}
for label, opts in SETUPS:
    curves[label] = [make_plan(model, PlanOptions(**{**opts, "max_model_len": L}), bench).max_concurrent_seqs
                     for L in CONTEXTS]
plt = pyplot()
fig, ax = plt.subplots(figsize=(7, 4))
for label, seqs in curves.items():
    ax.plot(CONTEXTS, [max(s, 0.5) for s in seqs], marker="o", label=label)
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("context length (--max-model-len, tokens)")
ax.set_ylabel("concurrent sequences in the KV cache")
ax.set_title(f"GLM-5 {model.quant}, tensor parallel 8 (plan, vLLM reserve estimated)")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
record("curves", {"contexts": CONTEXTS, **curves})
record("fig_context_vs_sequences", str(save_figure(fig, FIGURES / "06_context_vs_sequences.png", close=False)))

# %% [markdown]
# ## 3. The same file as bf16: the refusal
#
# A GGUF dequantized to bf16 on load (`--residency dequantized`, the loader's correctness reference) needs ~190 GB per GPU at tensor parallel 8: it cannot fit 96 GB cards. The plan says by how much
# and what would fit instead, each alternative planned, not assumed.

# %%
label, opts = SETUPS[0]
bf16 = make_plan(model, PlanOptions(**opts, residency="dequantized"), bench)
print(format_plan(bf16))
record("bf16_fits", bf16.fits)
record("bf16_weights_gb_per_gpu", round(bf16.weights_bytes_per_gpu / 1e9, 2))
record("bf16_shortfall_gb", round(bf16.shortfall_bytes / 1e9, 2))
record("bf16_suggestions", bf16.suggestions)

# %% [markdown]
# ## 4. Decode estimate per batch size
#
# An estimate from bytes moved, labelled as such; its assumptions are printed with every plan. At small batches
# the non-expert weights and the 8 routed experts per layer dominate; with the batch the touched experts grow
# towards all 256, and the KV gather and the indexer (which reads every cached key) grow linearly.

# %%
for label, p in plans.items():
    print(f"{label:<24}", "  ".join(f"B={b}: {ms:6.1f} ms" for b, ms in p.decode_ms_estimate.items()))
record("decode_ms", {label: p.decode_ms_estimate for label, p in plans.items()})

if INTERACTIVE:
    import ipywidgets as W
    from IPython.display import display

    def show(setup, max_model_len, kv_cache_dtype, residency):
        opts = dict(dict(SETUPS)[setup], kv_cache_dtype=kv_cache_dtype, residency=residency)
        print(format_plan(make_plan(model, PlanOptions(**{**opts, "max_model_len": max_model_len}), bench)))

    display(W.interactive(show, setup=[s[0] for s in SETUPS], max_model_len=W.SelectionSlider(options=CONTEXTS,
                                                                                               value=CONTEXTS[-1]),
                          kv_cache_dtype=["fp8_ds_mla", "auto"], residency=["quantized", "dense-attn", "dequantized"]))
