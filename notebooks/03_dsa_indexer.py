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
# # 03 · The DSA indexer: what it keeps, when it matters, how ports break it
#
# GLM-5 attends sparsely: in every layer a small "lightning indexer" scores all previous tokens and the MLA
# attention only looks at the best `index_topk` (2048) of them (DeepSeek Sparse Attention, docs/glm5.md
# section 3). Engineers bringing GLM-5 up keep asking:
#
# 1. **How much attention does the top-k keep?** (attention-mass recall per layer, vs context and top-k)
# 2. **Can the indexer be switched off?** (dense MLA vs DSA: identical up to top-k tokens, then how different)
# 3. **Did my port get the indexer RoPE right?** (interleaved vs NeoX, and a detector)
# 4. **Is fp8 in the indexer safe?** (top-k picks flipped, with and without the Hadamard rotation)
# 5. **What does IndexShare cost?** (GLM-5.2 reuses one layer's top-k in the next ones)
# 6. **What does the indexer cost at GLM-5 shapes?** (FLOPs and bytes per token, the ~35K crossover)
#
# Everything runs on `glm5lib.model.reference.ReferenceModel`, a readable fp32 GLM-5 forward that matches
# transformers' `GlmMoeDsaForCausalLM` (tests/test_reference.py). Random weights attend almost uniformly, so
# we first give the tiny model (real attention geometry: 576/512 MLA, 128-wide indexer heads, top-k 64) some
# structure: `glm5lib.dsa.train` trains it for a few CPU minutes on key-value recall over 160-256 token rows,
# then warms its indexer up by distilling each layer's head-summed attention (KL), as DeepSeek-V3.2 does.
# The result is cached in `.cache/tiny-trained` (HF dir + GGUF).
#
# The last section runs the same analysis straight from a GGUF shard set, one layer in memory at a time:
# point `GGUF_PATH` at a real GLM-5 shard to measure its first layers on a workstation.

# %% tags=["parameters"]
INTERACTIVE = False
PROFILE = "ci"
LENGTHS = [32, 64, 96, 128, 160, 192, 256]  # context lengths for the recall / dense-vs-sparse sweeps
TOPKS = [8, 16, 32, 64, 96, 128]  # top-k sweep at the longest length
N_SEQ = 3  # evaluation rows per length
GGUF_PATH = None  # a real glm-dsa GGUF (any shard) to analyse layer by layer; None: the trained tiny model
GGUF_LAYERS = 3  # how many first layers to run from the GGUF
GGUF_TOKENS = 256
FULL_SIZE_PROBE = False  # time one synthetic full-size GLM-5 dense layer and experts (~3 GB RAM, ~1 min)
FULL_SIZE_TOKENS = 128

# %%
import math
from pathlib import Path

import torch

from glm5lib.dsa import analysis, cost, plots
from glm5lib.dsa.footprint import analyze_layers, dequant_throughput, peak_rss_gb, probe_layer
from glm5lib.dsa.train import TrainRecipe, ensure_trained_tiny, task_accuracy, task_sequences, train_log
from glm5lib.mapping.reference import reference_from_gguf
from glm5lib.model.reference import DSAOptions, ReferenceModel
from glm5lib.model.spec import GLM5Config
from glm5lib.paths import outputs_dir
from glm5lib.workbook import record

torch.set_num_threads(1)
FIG = outputs_dir() / "figures"

# %% [markdown]
# ## 1. A tiny GLM-5 with attention worth analysing
#
# Rows of the task are a stream of "pair" tokens (key k holds value v; every key stored once) with queries
# mixed in: a query names a key seen earlier and the next token must be that key's value. The pair can be
# anywhere in the row, so answering needs attention beyond any local window, and beyond top-k = 64 once the
# row is longer than 64.

# %%
tiny = ensure_trained_tiny()
log = train_log(tiny)
recipe = TrainRecipe(**{k: tuple(v) if isinstance(v, list) else v for k, v in log["recipe"].items()})
ref = ReferenceModel.from_hf_dir(tiny.hf_dir)
cfg = ref.cfg
K = cfg.index_topk
print(f"trained in {log['seconds_dense']:.0f} s (dense) + {log['seconds_indexer']:.0f} s (indexer warm-up); "
      f"loss {log['loss'][0]:.2f} -> {log['loss'][-1]:.3f}, indexer KL {log['indexer_kl'][0]:.2f} -> "
      f"{log['indexer_kl'][-1]:.3f}")
rows = {T: task_sequences(N_SEQ, T, recipe, seed=1000 + T) for T in LENGTHS}
seqs = {T: [ids for ids, _ in r] for T, r in rows.items()}
T_MAX = max(LENGTHS)
acc_sparse = task_accuracy(ref, rows[T_MAX])
acc_dense = task_accuracy(ref, rows[T_MAX], DSAOptions(dense=True))
print(f"task accuracy at T={T_MAX}: sparse (DSA) {acc_sparse:.3f}, dense {acc_dense:.3f}")
record("index_topk", K)
record("train_loss_first", log["loss"][0])
record("train_loss_last", sum(log["loss"][-10:]) / 10)
record("indexer_kl_first", log["indexer_kl"][0])
record("indexer_kl_last", log["indexer_kl"][-1])
record("train_seconds", log["seconds_dense"] + log["seconds_indexer"])
record("task_accuracy_sparse", acc_sparse)
record("task_accuracy_dense", acc_dense)

# %%
fig = plots._plt().figure(figsize=(9, 3))
ax1, ax2 = fig.subplots(1, 2)
ax1.plot(log["loss"]); ax1.set_title("dense warm-up: answer loss", fontsize=9); ax1.set_xlabel("step")
ax2.plot(log["indexer_kl"]); ax2.set_title("indexer warm-up: KL(attention || indexer)", fontsize=9)
ax2.set_xlabel("step")
record("fig_training", str(plots.save(fig, "03_training")))

# %% [markdown]
# The reference against transformers' `GlmMoeDsaForCausalLM` (eager, fp32) on the trained model, at a length
# where the indexer really drops keys: logits and every layer's selected keys.

# %%
from glm5lib.model.indexer import causal_mask, selection_mask
from glm5lib.model.reference import Trace
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()  # the tiny MTP layer is "unexpected" for transformers (it skips layer 78 only)
hf = AutoModelForCausalLM.from_pretrained(tiny.hf_dir, attn_implementation="eager", dtype=torch.float32).eval()
hf_topk = {}
for i, layer in enumerate(hf.model.layers):
    layer.self_attn.register_forward_hook(lambda m, a, out, i=i: hf_topk.__setitem__(i, out[2][0].long()))
probe = seqs[T_MAX][0]
trace = Trace(("topk",))
with torch.no_grad():
    diff = (hf(probe[None]).logits[0] - ref.forward(probe, trace=trace, options=DSAOptions(tie_break="torch"))).abs().max()
allowed = causal_mask(torch.arange(T_MAX), T_MAX)
same_picks = all(torch.equal(selection_mask(hf_topk[i], allowed), selection_mask(trace.layers[i]["topk"], allowed))
                 for i in hf_topk)
print(f"max |logit difference| vs transformers at T={T_MAX}: {float(diff):.2e}; same top-k in every layer: {same_picks}")
record("reference_vs_transformers_max_abs", float(diff))
record("reference_vs_transformers_same_topk", same_picks)
del hf

# %% [markdown]
# ## 2. How much attention does the top-k keep?
#
# For each query that sees more than k keys: the fraction of the (head-averaged, dense) attention probability
# that lands on the indexer's top-k. Dashed: the best any k keys could do (the dense top-k by attention). The
# model runs dense here, so each layer is judged on the same hidden states.

# %%
by_len = {T: analysis.selection_recall(ref, seqs[T], topks=[K]) for T in LENGTHS if T > K}
mass_vs_len = {T: {layer: v[K] for layer, v in r["mass"].items()} for T, r in by_len.items()}
oracle_vs_len = {T: {layer: v[K] for layer, v in r["oracle"].items()} for T, r in by_len.items()}
set_vs_len = {T: {layer: v[K] for layer, v in r["set"].items()} for T, r in by_len.items()}
by_k = analysis.selection_recall(ref, seqs[T_MAX], topks=[k for k in TOPKS if k < T_MAX])
mass_vs_k = {k: {layer: by_k["mass"][layer][k] for layer in by_k["mass"]} for k in TOPKS if k < T_MAX}
oracle_vs_k = {k: {layer: by_k["oracle"][layer][k] for layer in by_k["oracle"]} for k in TOPKS if k < T_MAX}
for T in mass_vs_len:
    print(f"T={T:4d}  mass kept " + "  ".join(f"L{layer} {v:.3f}" for layer, v in mass_vs_len[T].items())
          + "   dense top-k set recall " + "  ".join(f"L{layer} {v:.3f}" for layer, v in set_vs_len[T].items()))
record("mass_recall_vs_length", mass_vs_len)
record("oracle_mass_vs_length", oracle_vs_len)
record("set_recall_vs_length", set_vs_len)
record("mass_recall_vs_topk", mass_vs_k)
record("fig_recall_length", str(plots.save(plots.recall_curves(mass_vs_len, "context length T",
                                                               f"top-{K} attention-mass recall", oracle_vs_len),
                                           "03_recall_vs_length")))
record("fig_recall_topk", str(plots.save(plots.recall_curves(mass_vs_k, "top-k", f"T = {T_MAX}", oracle_vs_k),
                                         "03_recall_vs_topk")))

# %% [markdown]
# ## 3. Can the indexer be switched off?
#
# Dense MLA (indexer off) against DSA. While T <= index_topk the indexer selects every visible key, so the two
# must be *bit-identical*; beyond it they differ by what the dropped keys carried.

# %%
errors = analysis.dense_vs_sparse(ref, seqs)
for T, e in errors.items():
    print(f"T={T:4d}  max|dlogit| {e['max_abs']:.3e}  mean KL {e['mean_kl']:.3e}  argmax agree {e['argmax_agree']:.3f}"
          + ("  (exact)" if e["exact"] else ""))
record("dense_vs_sparse", {T: e for T, e in errors.items()})
record("dense_equals_sparse_upto_topk", all(e["exact"] for T, e in errors.items() if T <= K))
record("fig_dense_sparse", str(plots.save(plots.dense_sparse_error(errors, K), "03_dense_vs_sparse")))

# %% [markdown]
# ## 4. Did the port get the indexer RoPE right?
#
# GLM-5's indexer rotates its first 64 dims with *interleaved* RoPE (pairs (x0,x1), (x2,x3), ...); DeepSeek-V3.2's
# uses NeoX half-split pairs, and ports that copy DeepSeek (or default vLLM's `indexer_rope_interleave`) get it
# wrong. Inside top-k it is invisible (everything is selected); beyond it the wrong layout scrambles the
# position-dependent part of the scores. `detect_indexer_rope_layout` tells which layout weights were trained
# with: the one whose top-k keeps more of the model's own attention.

# %%
rope = analysis.rope_layout_recall(ref, seqs[T_MAX])
layout, rope_mean = analysis.detect_indexer_rope_layout(ref, seqs[T_MAX])
for lay, v in rope.items():
    print(f"{lay:12s} " + "  ".join(f"L{layer} {x:.3f}" for layer, x in v.items()))
print(f"detected layout: {layout}")
acc_neox = task_accuracy(ref, rows[T_MAX], DSAOptions(indexer_rope="neox"))
print(f"task accuracy with NeoX indexer RoPE: {acc_neox:.3f} (interleaved: {acc_sparse:.3f})")
short = task_accuracy(ref, rows[K], DSAOptions(indexer_rope="neox")) == task_accuracy(ref, rows[K])
record("rope_recall", rope)
record("rope_mean_recall", rope_mean)
record("rope_detected", layout)
record("task_accuracy_neox", acc_neox)
record("neox_invisible_upto_topk", short)
# %% [markdown]
# The detector on weights whose answer we know: `convert_indexer_rope_layout` permutes the indexer's rope rows
# so that the weights, run with NeoX RoPE, score exactly as the originals do with interleaved. Detection must
# flip to "neox". (The same function repairs a checkpoint whose layout does not match the engine.)

# %%
from glm5lib.model.reference import SafetensorsWeights

src = SafetensorsWeights(tiny.hf_dir)
as_neox = analysis.convert_indexer_rope_layout({n: src(n) for n in src.weight_map}, cfg, to="neox")
layout_conv, rope_conv = analysis.detect_indexer_rope_layout(ReferenceModel(cfg, as_neox), seqs[T_MAX])
print(f"converted weights: detected {layout_conv} ({', '.join(f'{k} {v:.3f}' for k, v in rope_conv.items())})")
record("rope_detected_after_conversion", layout_conv)
record("rope_mean_recall_after_conversion", rope_conv)

# %%
record("fig_rope", str(plots.save(plots.grouped_bars(rope, "attention mass kept", f"indexer RoPE layout, T={T_MAX}"),
                                  "03_rope_layout")))

# %% [markdown]
# ## 5. Is fp8 in the indexer safe?
#
# vLLM and DeepSeek's reference keep indexer keys (and queries) in e4m3 with one fp32 scale per 128 values;
# DeepSeek rotates both by a 128-point Hadamard first. How many top-k picks change against fp32, and what
# does it do to the output?

# %%
fp8 = analysis.fp8_indexer_effect(ref, seqs[T_MAX])
for mode, v in fp8.items():
    print(f"{mode:14s} flipped " + "  ".join(f"L{layer} {x:.4f}" for layer, x in v["flipped"].items())
          + f"   max|dlogit| {v['max_abs_logit']:.3e}  mean KL {v['mean_kl']:.2e}")
record("fp8", fp8)
record("fig_fp8", str(plots.save(plots.grouped_bars({m: v["flipped"] for m, v in fp8.items()},
                                                    "fraction of top-k picks changed", f"fp8 indexer, T={T_MAX}"),
                                 "03_fp8_flips")))

# %% [markdown]
# ## 6. IndexShare (GLM-5.2): reuse a previous layer's top-k
#
# GLM-5.2 runs the indexer on 21 of 78 layers; the others reuse the last full layer's picks. Here: how similar
# consecutive layers' selections are, and the output error of running the indexer only on every 2nd / 4th layer.

# %%
overlap = analysis.topk_overlap(ref, seqs[T_MAX])
share = analysis.indexshare_effect(ref, seqs[T_MAX], everies=(2, 4))
print("top-k overlap between consecutive layers:", {p: round(v, 3) for p, v in overlap.items()})
for name, v in share.items():
    print(f"{name}: pattern {v['pattern']}  max|dlogit| {v['max_abs_logit']:.3e}  argmax agree {v['argmax_agree']:.3f}")
record("topk_overlap", overlap)
record("indexshare", share)

# %% [markdown]
# ## 7. What the indexer costs at GLM-5 shapes
#
# Per query token per layer (decode) the indexer scores every previous token (linear in context) while the
# sparse MLA reads a fixed top-k of 2048 rows. FLOPs cross near 35K tokens; bytes cross much earlier when
# both sides are fp8, since each indexer key is 132 B against 656 B per gathered KV row. Under tensor
# parallelism the attention heads are split but vLLM replicates the indexer, so per GPU the crossover moves
# down by the TP degree.

# %%
s = cost.CostShapes.from_config(GLM5Config.glm5())
table = cost.cost_table([2048, 8192, 35000, 131072], s)
record("cost_sparse_mflop_per_token", float(cost.sparse_attention_flops(10**6, s)) / 1e6)
record("cost_gathered_kv_mb_bf16", float(cost.gathered_kv_bytes(10**6, s, "bf16")) / 1e6)
record("cost_gathered_kv_mb_fp8", float(cost.gathered_kv_bytes(10**6, s, "fp8_ds_mla")) / 1e6)
record("cost_flops_crossover", cost.flops_crossover(s))
record("cost_bytes_crossover", cost.bytes_crossover(s))
print(f"sparse MLA {cost.sparse_attention_flops(10**6, s) / 1e6:.0f} MFLOP/token/layer; FLOPs crossover "
      f"{cost.flops_crossover(s):,.0f} tokens; bytes crossover {cost.bytes_crossover(s):,.0f} tokens")
s8 = cost.CostShapes.from_config(GLM5Config.glm5(), heads=8)  # tensor-parallel 8: the indexer stays whole
print(f"at 8 heads per GPU (TP 8) the indexer is replicated, so its FLOPs pass the sparse attention's at "
      f"{cost.flops_crossover(s8):,.0f} tokens")
record("cost_flops_crossover_tp8", cost.flops_crossover(s8))
record("fig_cost", str(plots.save(plots.cost_model(shapes=s), "03_cost_decode")))
record("fig_cost_prefill", str(plots.save(plots.prefill_cost(shapes=s), "03_cost_prefill")))

# %% [markdown]
# ## 8. Straight from a GGUF, one layer at a time
#
# `reference_from_gguf(path, stream=True)` opens any shard of a set and dequantizes each layer's tensors
# when the layer runs (routed experts one at a time, only those the router picks); the embedding is read row by
# row. On the tiny model the F32 GGUF must give exactly the HF-directory logits; the Q8_0 one is analysed
# layer by layer as a real GLM-5 shard would be.

# %%
if GGUF_PATH is None:
    exact = torch.equal(reference_from_gguf(tiny.shards["F32"][0], stream=True).forward(seqs[T_MAX][0]),
                        ref.forward(seqs[T_MAX][0]))
    record("gguf_f32_equals_hf", exact)
    gguf_model = reference_from_gguf(tiny.shards["Q8_0"][0], stream=True)
    result = analyze_layers(gguf_model, input_ids=seqs[T_MAX][0], layers=range(min(GGUF_LAYERS, cfg.num_hidden_layers)))
else:
    gguf_model = reference_from_gguf(GGUF_PATH, stream=True)
    result = analyze_layers(gguf_model, tokens=GGUF_TOKENS, layers=range(GGUF_LAYERS))
for row in result["layers"]:
    print(f"layer {row['layer']}: {row['seconds']:.3f} s, RSS {row['rss_gb']:.2f} GB (peak {row['peak_rss_gb']:.2f}), "
          f"mass kept {row['mass_recall']:.3f} (best {row['oracle_mass']:.3f})")
record("gguf_layers", result)

# %% [markdown]
# ### Full-size estimate
#
# With `FULL_SIZE_PROBE` the notebook times one synthetic full-size GLM-5 dense layer (fp32, weights generated
# on request) and a few routed experts, and measures gguf-py's dequantization speed on one expert matrix. A
# real MoE layer from a Q4 GGUF costs the attention part plus, for each expert the router hits (all 256 once a
# prompt has a few hundred tokens), dequantizing three 2048 x 6144 matrices.
#
# The cell prints the measured times, resident weights and dequantization rates of this machine and records
# them as `full_size` (the full profile turns the probe on; the CI profile skips it).

# %%
if FULL_SIZE_PROBE:
    g5 = GLM5Config.glm5()
    dense_probe = probe_layer(g5, 0, FULL_SIZE_TOKENS)
    moe_probe = probe_layer(g5, g5.first_k_dense_replace, FULL_SIZE_TOKENS, max_experts=4)
    deq = {t: dequant_throughput(t) for t in ("Q4_0", "Q8_0")}
    hit = g5.n_routed_experts * (1 - (1 - g5.num_experts_per_tok / g5.n_routed_experts) ** FULL_SIZE_TOKENS)
    moe_s = {t: moe_probe["attn_s"] + hit * (3 * d["seconds"] + moe_probe["expert_s"]) for t, d in deq.items()}
    print("dense layer:", {k: round(v, 3) if isinstance(v, float) else v for k, v in dense_probe.items()})
    print("MoE layer (partial):", {k: round(v, 3) if isinstance(v, float) else v for k, v in moe_probe.items()})
    print("dequantization:", deq)
    print(f"estimated MoE layer time at {FULL_SIZE_TOKENS} tokens ({hit:.0f} experts hit):",
          {t: round(v, 1) for t, v in moe_s.items()})
    record("full_size", {"dense": dense_probe, "moe": moe_probe, "dequant": deq, "moe_layer_seconds": moe_s,
                         "experts_hit": hit})

# %% [markdown]
# ## 9. Explorer
#
# Pick a layer, head, top-k and query position: the bars are that query's dense attention, blue where the
# indexer's top-k keeps the key, red where it drops it. (Set `INTERACTIVE = True`.)

# %%
if INTERACTIVE:
    import ipywidgets as W
    from IPython.display import display

    explore = analysis.collect(ref, seqs[T_MAX][0])

    def show(layer, head, k, query):
        fig = plots.attention_map(explore[layer], k, query, None if head < 0 else head)
        display(fig)  # rendered once into the widget's output, then released
        plots._plt().close(fig)

    display(W.interactive(show, layer=sorted(explore), head=W.IntSlider(-1, -1, cfg.num_attention_heads - 1),
                          k=W.IntSlider(K, 1, T_MAX), query=W.IntSlider(T_MAX - 1, 0, T_MAX - 1)))
else:
    sel = analysis.collect(ref, seqs[T_MAX][0])[min(1, cfg.num_hidden_layers - 1)]
    record("fig_attention_map", str(plots.save(plots.attention_map(sel, K, T_MAX - 1), "03_attention_map")))
