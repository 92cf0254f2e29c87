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
# # 04 · Triton sparse MLA and the DSA indexer: reference, kernel, numeric checks, benchmarks
#
# GLM-5 attends sparsely: each query token reads only the `index_topk` = 2048 cache rows its lightning
# indexer picked. In the absorbed (MQA) form every head of a token uses the same gathered rows
# (`[c_kv 512 | k_rope 64]`, value = the first 512), so (docs/glm5.md sections 2 and 7):
#
# - **decode at 8-16 heads per GPU is a gather-bandwidth problem**: 2048 x 1152 B (bf16) or 656 B (fp8_ds_mla)
#   per token, used by every head;
# - **prefill at 64-128 heads is a tensor-core problem**: 285 MFLOP per token per layer at 64 heads.
#
# This notebook tells the kernel's story in the order of Triton's tutorials: the fp32 reference, the kernel,
# the case matrix with error statistics, the ahead-of-time compile report for sm_80 / sm_89 / sm_90 / sm_120,
# and the H200 benchmark against FlashMLA (run live when a GPU is present, read from the committed JSON
# otherwise). All code lives in `glm5lib.kernels`; the notebook only calls it.

# %% tags=["parameters"]
INTERACTIVE = False
PROFILE = "ci"  # "ci": interpreter cases on CPU; "full": real sizes (needs a GPU)
ARCHS = [80, 89, 90, 120]  # AOT compile targets
BENCH_JSON = None  # benchmark results to plot when no GPU is present; None: the committed H200 run
RUN_GPU_BENCH = False  # on a GPU: run `glm5lib bench all` here instead of reading BENCH_JSON
BENCH_RUN_NAME = None  # file stem for that run (None: bench_<gpu>); an existing file is never overwritten
FIGURE = "outputs/figures/04_sparse_mla_bench.png"  # relative: to the checkout
PARTS_FIGURE = "outputs/figures/04_fp8mma_parts.png"  # the fp8-cache kernel taken apart (committed H200 runs)
BATCHES_RUN = "fp8mma_batches_h100_3d643c8.json"  # the decode across batch sizes (a committed run under sweeps/)
BATCHES_FIGURE = "outputs/figures/04_fp8mma_batches.png"

# %%
import json
from pathlib import Path

import torch

from glm5lib.bench import kernels as kbench
from glm5lib.bench import evidence
from glm5lib.kernels import checks, indexer_logits, naive, topk_indices, topk_select
from glm5lib.kernels.compile_report import compile_report, format_report
from glm5lib.kernels.mla import sparse_mla
from glm5lib.paths import bench_dir, resolve
from glm5lib.workbook import record

SM_SCALE = checks.SM_SCALE  # GLM-5: 1/16 (GLM5Config.glm5().softmax_scale)

torch.manual_seed(0)
torch.set_num_threads(1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the Triton interpreter (CPU) has no bf16 dot: compute in fp32 there, bf16 on a GPU
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
record("device", DEVICE)
print(DEVICE, DTYPE)

# %% [markdown]
# ## 1. The reference
#
# `naive.sparse_mla_ref` is the obviously-correct twin: gather the rows named by `indices` (-1 or >= N means
# "no key"), softmax over `q . k * sm_scale`, weight the first 512 columns. A token without any valid key gets
# zeros and lse = -inf. fp8_ds_mla rows (656 B: 512 e4m3, 4 fp32 scales, 64 bf16 rope; FlashMLA's
# `V32_FP8Sparse` layout) are dequantized first with `naive.dequantize_fp8_ds_mla`.

# %%
T, H, N, K = 4, 16, 512, 128
q = torch.randn(T, H, naive.D_QK).to(DTYPE).to(DEVICE)
kv = torch.randn(N, naive.D_QK)
idx = torch.stack([torch.randperm(N)[:K] for _ in range(T)]).to(torch.int32)
idx[1, ::3] = -1  # some empty slots
idx[2, :] = -1  # a token with no key at all
idx[3, :5] = N + 7  # out of range
idx = idx.to(DEVICE)
cache = kv.to(DTYPE).to(DEVICE)
ref_out, ref_lse = naive.sparse_mla_ref(q, cache, idx, SM_SCALE)
print("lse per token (head 0):", ref_lse[:, 0].tolist())

# %% [markdown]
# ## 2. The kernel
#
# `sparse_mla(q, kv_cache, indices, sm_scale)` runs one Triton kernel for decode and prefill: a program owns a
# token, a block of heads (all heads up to 16, else 64) and a slice of the token's top-k list; it gathers
# 32-64 rows at a time once for all its heads, runs `q k^T` and `P V` on tensor cores with an online softmax,
# and when tokens x head blocks cannot fill the GPU the top-k list is split and a second kernel merges the
# partial results with the log-sum-exp rule. fp8 rows keep their per-128 scale out of the dot (applied to S
# and P), so e4m3 converts exactly.

# %%
out, lse = sparse_mla(q, cache, idx, SM_SCALE, kv_format="bf16" if DTYPE != torch.float32 else "fp32")
rel = float((out.float() - ref_out).norm() / ref_out.norm())
print(f"relative error vs reference: {rel:.2e}; token 2 (no keys): out all zero = {bool((out[2] == 0).all())}, "
      f"lse = {lse[2, 0].item()}")
record("demo_rel_err", rel)
record("demo_empty_row_zero", bool((out[2] == 0).all()) and bool(torch.isneginf(lse[2]).all()))

rows8 = naive.quantize_fp8_ds_mla(kv).to(DEVICE)
out8, _ = sparse_mla(q, rows8, idx, SM_SCALE, kv_format="fp8_ds_mla")
ref8, _ = naive.sparse_mla_ref(q, rows8, idx, SM_SCALE, kv_format="fp8_ds_mla")
rel8 = float((out8.float() - ref8).norm() / ref8.norm())
fp8_vs_bf16 = float((ref8 - ref_out).norm() / ref_out.norm())
print(f"fp8_ds_mla: kernel vs reference {rel8:.2e}; fp8 cache vs bf16 cache (quantization itself) {fp8_vs_bf16:.2e}")
record("demo_fp8_rel_err", rel8)
record("fp8_quantization_rel_err", fp8_vs_bf16)

# %% [markdown]
# The indexer side: `indexer_logits` gives the fp32 scores `sum_h w[t, h] relu(scale q[t, h] . k[s])` with the
# causal / per-request bounds (ragged rows for prefill, vLLM's paged block-split cache for decode), and
# `topk_indices` returns vLLM's convention: int32, -1 padded, request-local positions.

# %%
Tq, HI, NK = 24, 8, 96
qi = torch.randn(Tq, HI, 128).to(DTYPE).to(DEVICE)
ki = torch.randn(NK, 128).to(DTYPE).to(DEVICE)
wi = (torch.rand(Tq, HI) * HI**-0.5).to(DEVICE)
ke = torch.arange(NK - Tq + 1, NK + 1, dtype=torch.int32, device=DEVICE)  # causal: the last Tq tokens
scores = indexer_logits(qi, ki, wi, scale=128**-0.5, ke=ke)
ref_scores = naive.indexer_logits_ref(qi, ki, wi, scale=128**-0.5, ke=ke)
fin = torch.isfinite(ref_scores)
idx_rel = float((scores[fin] - ref_scores[fin]).norm() / ref_scores[fin].norm())
sel = topk_indices(scores, 32)
print(f"indexer relative error {idx_rel:.2e}; masks equal: {torch.equal(torch.isinf(scores), torch.isinf(ref_scores))}")
print("top-32 of the first query (it sees", int(ke[0]), "keys):", sorted(sel[0].tolist())[:8], "...")
record("indexer_demo_rel_err", idx_rel)

# %% [markdown]
# Exact index-score ties are common in a real model (ReLU zeroes every head of a key whose `q . k < 0`, and a
# negative head weight turns that zero into -0.0). `torch.topk` breaks ties in an order that depends on the row
# length; the reference forward and vLLM's CPU path take the earlier key. `topk_select`, glm5lib's Triton radix
# select (four 8-bit histogram passes over order-preserving integer keys, then one writing pass), picks exactly
# what a stable descending sort picks, lists them by position, and reads per-row lengths on the device. Here on
# scores rounded to a few values, so the cut falls inside a run of ties:

# %%
from glm5lib.vllm_plugin.paged import stable_topk

tied = torch.round(scores * 4) / 4  # few distinct values; -inf stays -inf
tied[tied == 0] = -0.0  # w * relu(.) with negative w gives -0.0: it must tie with +0.0
sel_t = topk_select(tied, 32)
ref_t = stable_topk(tied, 32)
same = torch.equal(sel_t.sort(1).values, ref_t.sort(1).values)
print(f"top-32 by radix select == stable sort's picks: {same}; ascending positions: "
      f"{bool(((sel_t[:, 1:] > sel_t[:, :-1]) | (sel_t[:, 1:] < 0)).all())}")
record("topk_select_equals_stable_sort", same)

# %% [markdown]
# ## 3. The case matrix
#
# FlashMLA-style groups: regular shapes (H in 1, 8, 16, 64, 128), irregular shapes and top-k values, invalid
# indices (-1, duplicates, out-of-range including INT_MAX and negative values, all-invalid rows), paged views
# with a block stride larger than the block, bf16 and fp8_ds_mla caches; plus the indexer (ragged and paged,
# bf16 and fp8) and its top-k. Each case poisons the output with NaN first. Tolerances (`checks` docstring):
# bf16 on the GPU rel <= 1e-2, cos diff <= 1e-4, lse <= 1e-3 (P and the output are the only bf16 roundings);
# fp32 in the interpreter rel <= 1e-5.
#
# The committed H200 evidence: the full matrix (`outputs/bench/checks_h200_full.json`) and `compute-sanitizer --tool
# memcheck` on the invalid-index cases (`outputs/bench/sanitizer_h200.log`), each also with the sm_89/sm_120 configs
# forced on the H200 (`checks --smem-class small`), record the config every case ran; the v5 decode verification
# (`outputs/bench/sweeps/verify_v5_decode.log`) and the benchmark name theirs too. The vLLM backend's call path
# (`outputs/bench/vllm_harness_h200.json`, notebook 05) predates that record: its configs are inferred from the
# shapes and it credits none. The table below is read from those files (`glm5lib.bench.evidence`): which config
# each piece ran, and for each config the H200 runs now, which pieces ran exactly that config. Rounds 19-25 ran the
# matrix and memcheck on H100s only (the same sm_90 cubins; no H200 could be had); round 26's H200 run (6eaff6f) ran
# every shipped sm_90 config again, round 21's kernel for 64-128 heads over the fp8 cache ("gluon-BN64-nbuf2-dq") and
# the fp8-cache kernel's rules among them. The fp8-cache kernel's 99 KB build (sm_89 / sm_120 with GLM5LIB_FP8MMA=1)
# ran them on an H100 with that class forced.

# %%
profile = PROFILE if DEVICE == "cuda" else "ci"
results = checks.run_all(profile, DEVICE)
print(checks.format_table(results))
summ = checks.summary(results)
print(f"\n{summ['passed']}/{summ['cases']} pass; worst rel {summ['max_rel']:.2e}, cos diff {summ['max_cos_diff']:.2e}")
record("matrix", summ)

h200 = bench_dir() / "checks_h200_full.json"
if h200.is_file():
    full = json.loads(h200.read_text())
    record("h200_matrix_cases", len(full))
    record("h200_matrix_passed", sum(r["ok"] for r in full))
    record("h200_matrix_max_rel", max(r["rel"] for r in full))
    print(f"H200 full-size matrix: {sum(r['ok'] for r in full)}/{len(full)} pass, worst rel {max(r['rel'] for r in full):.2e}")

cov = evidence.coverage()
print(evidence.format_coverage(cov))
record("h200_evidence", cov)

# %% [markdown]
# ## 4. Ahead-of-time compile report
#
# Every configuration the dispatcher can pick, compiled for each target without a GPU
# (`triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`), with its static shared memory against
# the per-block limit (sm_80 163 KB, sm_90 227 KB, sm_89 / sm_120 99 KB), the matrix instruction chosen, and
# the count of 16-byte global loads (0 would mean the gathers went scalar). sm_90 gets the large-tile family;
# sm_80 / sm_89 / sm_120 a family that fits 99 KB, and sm_80 converts e4m3 in software.

# %%
rows = compile_report(ARCHS, progress=False)
print(format_report(rows))
record("compile_rows", len(rows))
record("compile_ok", all(r.ok and r.fits for r in rows))
record("compile_archs", sorted({r.arch for r in rows}))
record("compile_max_shared_sm120", max(r.shared_bytes or 0 for r in rows if r.arch == 120))

# %% [markdown]
# ## 5. Benchmarks on the H200 against FlashMLA
#
# One run, side by side: this kernel, FlashMLA's sparse kernels from the vllm 0.33.0 wheel (heads padded to
# 64 / 128, as vLLM runs them), a naive torch gather + einsum, and the machine's ceilings measured in the same
# run (1 GiB device copy, 8192^3 bf16 matmul). Decode is timed as a CUDA graph over index sets bigger than L2;
# prefill reads one 32K-token sequence, which fits in L2, so its "GB/s" can exceed the HBM copy rate.

# %%
bench_json = resolve(BENCH_JSON) if BENCH_JSON else bench_dir() / "bench_h200.json"
if DEVICE == "cuda" and RUN_GPU_BENCH:
    res = kbench.run("all", out_dir=str(bench_json.parent), name=BENCH_RUN_NAME)
    bench_json = bench_json.parent / f"{res['meta']['name']}.json"
else:
    res = json.loads(bench_json.read_text())
record("h200_bench_json", str(bench_json))
print(res["meta"]["gpu"], "| torch", res["meta"]["torch"], "| triton", res["meta"]["triton"], "| FlashMLA:",
      res["meta"]["flashmla"])
print(f"ceilings: copy {res['ceilings']['copy_GBps']:.0f} GB/s, bf16 matmul {res['ceilings']['matmul_bf16_TFLOPs']:.0f} TFLOP/s")
print(kbench.key_table(res))

# %%
scaling_archive = bench_json.parent / kbench.SCALING_ARCHIVE  # the targets run skips the scaling series
fig_path = kbench.plot(bench_json, resolve(FIGURE), scaling_archive)
record("figure", str(fig_path))
if INTERACTIVE:
    from IPython.display import Image, display

    display(Image(str(fig_path)))

# %% [markdown]
# ## 6. Targets
#
# The speed targets, recomputed from the rows. Where they are missed, `docs/kernels.md` says by
# how much and why. Beside each decode and fp8-prefill target the benchmark times the same rows gathered with
# nothing after them (`glm5lib.bench.gather`, the fastest of its pointer-gather routes): a kernel that must also
# compute cannot beat that, so where this ceiling is more than 3 % below the goal the table says "below goal". In
# short (the numbers are printed below from the JSON): small-head decode with bf16 rows reaches about two thirds of
# the copy bandwidth, short of the 85 % target, while its rows alone gather at 82-84 % (two runs), at the margin of
# the goal; the fp8 path at 8-16 heads (on sm_90 the fp8-cache kernel of `mla_gluon_fp8mma`: keys as the mma's M,
# each cached byte loaded straight into the mma's registers and widened to fp16 once) runs 1.4-1.7x as fast as
# FlashMLA padded to 64 heads at 8 heads and 1.1-1.4x at 16, short of the 2.5x goal (at B=128 the gathers alone rule
# the goal out; the kernel taken apart, below, shows how much of its time is its own gathers); at 64-128 heads the
# prefill (on sm_90 the Gluon ping-pong kernel of `mla_gluon_large`) reaches about 0.9x FlashMLA's TFLOP/s;
# H = 8 prefill is bound by L2 bandwidth for both kernels, so the two run at about the same speed. The indexer's
# decode reads its keys at 81-82 % of the copy bandwidth with fp8 keys and fp8 q, and 90-91 % with bf16 keys (8 key
# tiles a program on sm_90, q loaded once for all of them); bf16 q on fp8 keys is first rewritten into fp16 (each
# head times a power of two, exactly) and reaches about 64-65 % on the H200: its widened keys take registers, so
# fewer programs fit on an SM. Since round 34 sm_90 rewrites it into two e4m3 terms instead (within 1.6e-4 of the
# exact scores; 85.5 % of copy on an H100 against 82.1 % for fp16; docs/kernels.md v44).

# %%
head = kbench.headline(res)
for k, v in head.items():
    print(f"{k}: {v[0]:.1f} - {v[1]:.1f}" if isinstance(v, list) else f"{k}: {v}")
record("headline", head)

targets = kbench.evaluate_targets(res)
print(kbench.targets_table({"targets": targets}))
record("targets", targets)
record("targets_met", sum(bool(t["met"]) for t in targets))
record("targets_total", len(targets))
record("ceilings", res["ceilings"])
srows, source = kbench.scaling_rows(res, scaling_archive)
sc = sorted((r["topk"], r["us"]) for r in srows if r["kind"] == "scale-topk" and r["impl"] == "triton" and r["H"] == 16)
cx = sorted((r["ctx"], r["us"]) for r in srows if r["kind"] == "scale-ctx")
print(f"scaling series from {source}")
print("time vs top-k (H16, B128, fp8):", sc)
print("time vs context (H16, B64, fp8, top-k 2048):", cx)
record("scale_source", source)
record("scale_topk_us", sc)
record("scale_ctx_us", cx)

# %% [markdown]
# The same targets recomputed from a `bench all --quick` run on an H100 (round 23, at 18bdc50: its ratios are the
# H100's against its own copy rate and FlashMLA, not the issue's). Set beside the H200 run above (round 26), it shows
# which targets move with the GPU's memory (docs/kernels.md, "The shipped code on the H200").

# %%
H100_RUN = "bench_h100_18bdc50.json"  # a committed run under sweeps/
h100_res = json.loads((bench_dir() / "sweeps" / H100_RUN).read_text())
h100_targets = kbench.evaluate_targets(h100_res)
print(f"{H100_RUN}: {h100_res['meta']['gpu']}, commit {h100_res['meta']['commit'][:7]}")
print(kbench.targets_table({"targets": h100_targets}))
record("h100_targets", h100_targets)

# %% [markdown]
# ### The fp8-cache kernel taken apart
#
# `scripts/fp8mma_device.py --ablate` times each build of `mla_gluon_fp8mma` three ways on the same rows and split
# plan, at the whole kernel's programs per SM: the whole kernel, its own gathers alone (its ring, schedule and thread
# mapping, nothing computed) and its compute alone (every ring slot gathered once, then computed on again and
# again), beside the fastest gather route of the same rows. The first such run showed the 8-head decode's own
# gathers taking nearly all of the kernel's time: each row's 512 latent bytes were copied by 2 threads, so one copy
# instruction read 32-byte pieces of 16 rows and every 128-byte line took four instructions. Spread over 8 threads
# (`ROW_THREADS`), one instruction reads whole lines of 4 rows: the gathers alone went from 91 to 68 us at decode
# B=128 and from 1706 to 934 us at prefill, the whole kernel from 103 to 77-81 us and from 1833 to 1336-1345 us.
# What is left at 8 heads: the gathers alone (68 us) take longer than the compute alone (56 us), and both stay above
# the fastest gather route of the same rows (54 us: 2.2x as fast as FlashMLA's 118 us, under the 2.5x goal); at
# 16 heads the compute alone sets the pace. More programs per SM under a register cap made it no faster (the caps
# run: level at B=128, slower at B=32 and at prefill).

# %%
from glm5lib.bench import parts as kparts

part_runs = [kparts.load_run(kparts.run_path(name)) for name in kparts.RUNS]
for run in part_runs:
    print(kparts.table(run), end="\n\n")
sweep = part_runs[0]
parts_fig = kparts.plot(sweep, resolve(PARTS_FIGURE))
record("fp8mma_parts_figure", str(parts_fig))
b128 = {cfg: {p: round(sweep["parts"]["decode", 128, 8, cfg][p + "_us"], 1) for p in kparts.PARTS}
        for cfg in ("fp8mma-nbufG-f16-nplan", "fp8mma-nbufG-f16-nplan-t8")}
record("fp8mma_parts_decode_b128_h8", b128)
record("fp8mma_parts_fastest_gather_b128_us", round(sweep["gather"]["decode", 128], 1))
if INTERACTIVE:
    from IPython.display import Image, display

    display(Image(str(parts_fig)))

# %% [markdown]
# ### The decode across batch sizes
#
# The targets take the decode at batch 32 and 128; a serving GPU sees every batch from 1 to hundreds, and the
# fp8-cache kernel's plan changes along the way: how many splits of each token's top-k list (`plan_splits`), and at
# 1-8 heads four warps along the keys where that plan splits the list, two where it does not (`key_warps_of`), and
# since round 20 also four in a captured decode at one split from 0.9 of a wave or from 1.5 waves (`plan_key_warps`).
# `scripts/fp8mma_device.py --batches` times `sparse_mla` as vLLM's captured decode runs it (its rule's pick),
# both key-warp builds forced (and four with S as wgmma, "k4wg"), the Triton kernel and FlashMLA padded to 64 heads,
# each checked against fp32 first; the committed run is from an H100 (round 20: no H200 could be had), so its ratios
# are the H100's. The last two columns ask today's rule (`rule_now`) of the same times; for this run it is the rule
# its `sparse_mla` ran. What it shows: 1.35-1.6x FlashMLA at 8 heads from batch 8 to 512, 1.1-1.5x at 16 (1.05x at
# B 136, where one split leaves half of the 264 program slots empty: 0.92x before round 19's wgmma rule); the rule
# takes the faster build within 3 % at 19 of 20 batches, four key warps at 8 heads B 256 and 512 (4-5 % faster than
# two, which round 19's rule took), and misses at 8 heads B 8 (two key warps 4 % faster).

# %%
from glm5lib.bench import batches as kbatches

batch_run = kbatches.load_run(kbatches.run_path(BATCHES_RUN))
print(kbatches.rule_table(batch_run))
record("fp8mma_batches_failed_checks", kbatches.failed_checks(batch_run))
verdicts = [kbatches.rule_verdict(r)["ok"] for r in batch_run["rows"].values() if "error" not in r]
record("fp8mma_batches_rule_right", [sum(v is True for v in verdicts), sum(v is not None for v in verdicts)])
now = [kbatches.rule_verdict(r, pick=kbatches.rule_now(r))["ok"]
       for r in batch_run["rows"].values() if "error" not in r]
record("fp8mma_batches_rule_now_right", [sum(v is True for v in now), sum(v is not None for v in now)])
batches_fig = kbatches.plot(batch_run, resolve(BATCHES_FIGURE))
record("fp8mma_batches_figure", str(batches_fig))
if INTERACTIVE:
    from IPython.display import Image, display

    display(Image(str(batches_fig)))

# %% [markdown]
# ### How fast can the rows be gathered at all?
#
# The 8-16-head decode targets count bytes at the copy rate of a 1 GiB stream. The decode's rows are not a stream:
# each token reads 2048 rows scattered over its own 32K context, 656 bytes each (fp8_ds_mla) or 1152 (bf16).
# `python -m glm5lib.bench.gather` (`bash scripts/device_kernels.sh gather`) gathers exactly those rows with
# nothing after them, by PyTorch's `index_select`, Triton pointer tiles (`triton`: a row per tile line; `flat`:
# 16-byte vectors laid across rows so no lane idles; `flat-l2`: the same with PTX's `L2::256B` prefetch hint), and
# one TMA copy per row in Gluon (`tma`), beside a copy of the same number of bytes (`stream`). What the committed
# H200 run shows: the copy of that size reaches 83-93 % of the 1 GiB copy rate (and moves by several points between
# runs); the best gather of random rows that only reads (`index_select` also writes) 61 % / 75 % of it for fp8 rows
# and 70 % / 85 % for bf16 rows at B=32 / 128. Sorting each token's rows changes less than a point, reading a
# contiguous run with the same kernels gains 1-5: what is lost is mostly the row-by-row gather itself, not the
# randomness. The L2 hint loses 4-10 points on fp8 rows. One TMA copy per row is the slowest route (38-57 %).

# %%
from glm5lib.bench import gather as kgather

gather_json = bench_json.parent / "gather_h200.json"
if gather_json.is_file():
    gres = json.loads(gather_json.read_text())
    gsum = kgather.summary(gres["rows"])
    print(f"{gres['gpu']}, commit {gres['commit']}, copy {gres['ceilings']['copy_GBps']:.0f} GB/s")
    for line in gsum:
        print(f"{line['kv_format']:10s} B{line['B']:<4d} {line['pattern']:10s} " + " | ".join(
            f"{m} {line[m]['pct_copy']:3.0f}%" if line[m] else f"{m}   -" for m in kgather.METHODS))
    gfig = kgather.plot(gres, resolve(FIGURE).with_name("04_gather_ceiling.png"))
    record("gather_summary", gsum)
    record("gather_commit", gres["commit"])
    record("gather_figure", str(gfig))
    if INTERACTIVE:
        from IPython.display import Image, display

        display(Image(str(gfig)))
else:
    print(f"no {gather_json.name} in {gather_json.parent}: run `bash scripts/device_kernels.sh gather` on a GPU")
    record("gather_summary", None)
