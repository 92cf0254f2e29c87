#!/usr/bin/env bash
# Runs on the lent H200 (device tool): correctness matrix, compute-sanitizer, benchmarks. Logs under $OUT.
# usage: scripts/device_kernels.sh [checks] [checks-small] [checks-small-fp8mma] [sanitize] [sanitize-indexer] [racecheck] [sanitize-small] [harness]
#   [racecheck-fp8mma] [harness-graphs] [bench] [bench-targets] [bounds] [gather] [bench-sweep] [prefill-fp8-sweep] [bench-indexer] [topk-sweep]
#   [topk-long] [tune] [verify] [compile] [fp8mma] [batches] [widen] [round19] [round19b] [sanitize-wgmma] [ncu16] [round20] [round20b] [round20c] [round20d] [racecheck-k4] [round21] [round21b] [racecheck-dq] [round21c] [round22] [round22b] [round22c] [round23] [round23b] [round23c] [round24] [round24b] [round25] [round26] [round26b] [round27] [round27b] [round28] [round30] [round31] [round31b] [round31c] [round32] [round32b] [round33] [round33-ncu] [round34] [memcheck-topk]
# harness: the kernels through the vLLM backend's call path (paged caches, block tables, top-k 2048; no vLLM needed)
# harness-graphs: a 3-layer decode step captured in a CUDA graph vs eager, per-layer times, sparse_mla vs FlashMLA at batch 1
# harness-swfp8: the same with the sm_80 software fp8 path (GLM5LIB_FP8_SOFTWARE=1: what an A100 runs)
# topk-long: top-k over 32K-128K keys: one program per row, split rows and torch.topk (scripts/bench_topk_long.py)
# tune: decode candidates side by side (checks + timings), then `bench all` with the winners (tune_decode.py)
# bench-targets: issue #13's targets in one run (`bench all --quick --no-scaling --sweep-indexer`: B32/B128, fp8 prefill against
#   FlashMLA's bf16 prefill, the sm_89/sm_120 configs forced on the H200 with their compiled shared memory);
#   writes bench_h200.json/.png and bench.log under $OUT
# racecheck: compute-sanitizer racecheck and synccheck on the sanitize cases that reach the Gluon kernels on sm_90
#   (the T130 ones); racecheck-fp8mma: the same on two cases of the fp8-cache kernel (8 heads; 12 heads, paged)
# checks-small / sanitize-small: the case matrix / compute-sanitizer with the sm_89/sm_120 (99 KB) configs forced
# checks-small-fp8mma: the case matrix and memcheck with the sm_89/sm_120 class forced and GLM5LIB_FP8MMA=1 (the
#   fp8-cache kernel's 99 KB build, `CONFIG_BY_CLASS["small"]`, for 1-16 heads over fp8_ds_mla)
# sanitize-indexer: compute-sanitizer memcheck on every paged-indexer q form (scripts/indexer_sanitize_case.py)
# prefill-fp8-sweep: fp8_ds_mla prefill at 8/16 heads, shipped config vs bench.kernels.SWEEP_PREFILL_FP8_SMALL
# bounds: the small-head decode kernel taken apart (gather / gather+convert / kernel), glm5lib.bench.bounds
# gather: the decode's rows gathered with nothing after them (torch / Triton pointers / TMA per row; random, sorted and
#   contiguous rows), glm5lib.bench.gather: the ceiling under the 8-16-head decode targets
# fp8mma: the fp8-cache kernel for 1-16 heads (mla_gluon_fp8mma), its fp16- and e4m3-product builds, checked and timed
#   beside the Triton kernel and FlashMLA (scripts/fp8mma_device.py; fp8mma_h200.json/.log)
# batches: the fp8-cache decode at batch 1-512, 8 and 16 heads: sparse_mla as captured (its key-warps rule), the
#   shipped build with two and four key warps forced, Triton, FlashMLA padded (fp8mma_batches_h200.json; read by
#   glm5lib.bench.batches)
# widen: the fp8-cache kernel with 0 / 1 / 2 / 4 latent chunks widened by integer instructions (`Config.widen`),
#   taken apart (--ablate; fp8mma_widen_h200.json), then the 8- and 16-head prefill at s_q 4096 with each
#   (fp8mma_widen_waves*). `batches` and `widen` together can outrun one device call: run them in two
# round19: the shipped build, four key warps forced, four key warps with S as wgmma (`Config.wgmma`), widen 2 and 4,
#   taken apart and checked (--ablate; fp8mma_round19_h200.json), then the 16-head prefill at 2112 / 4096 tokens with
#   and without wgmma (fp8mma_wgmma_waves16_h200.json): one device call, in place of `widen`
# round19b: four key warps with S by mma_v2, by wgmma waited for at each chunk, and by wgmma one chunk in flight
#   (`Config.wgmma` 0 / 1 / 2), taken apart and checked, then the 16-head prefill at 2112 / 4096 tokens
# sanitize-wgmma: compute-sanitizer memcheck, racecheck and synccheck on the four-key-warp build with S as wgmma one
#   chunk in flight (`Config.wgmma` 2): a one-split and a split 16-head case (the kernel's async-proxy fence and barriers)
# ncu16: Nsight Compute (--set full) of the 16-head prefill (s_q 4096), four key warps with S by mma_v2 and by wgmma:
#   details and the stall samples by SASS instruction (ncu_fp8mma_prefill_h16_*.txt)
# round20: four key warps at 8 heads with S as wgmma (`Config.wgmma` 2; two ring slots, and one refilled early) beside
#   the shipped build and four key warps by mma_v2: the prefill at 2112 / 4096 tokens (fp8mma_wgmma_waves8_h200.json),
#   taken apart and checked (--ablate; fp8mma_round20_h200.json), then `batches` (with the wgmma build: "k4wg")
# round20b: the 8-head decode at batches 128-784 (`batches` with more sizes: the captured decode's key-warps rule by
#   the last wave's fill, round 20's first guess, against both builds forced; fp8mma_batches_fill_h200.json)
# round20c: the same at batches either side of the rule's threshold (mean fill of all waves >= 0.8, round 20's second
#   guess): 400, 420, 432, 600, 700 and 1000 tokens (fp8mma_batches_fill2_h200.json); memcheck and racecheck
#   of the four-key-warp build at one split (8 heads, 512 tokens; 5 heads, 700 tokens with invalid indices)
# round20d: the same at batches either side of the rule fitted to round20b-c (`mla_gluon_fp8mma.DECODE_K4_FILL`,
#   `DECODE_K4_WAVES`): 230, 240, 300, 320, 384, 410, 640 and 900 tokens (fp8mma_batches_fill3_h200.json)
# racecheck-k4: compute-sanitizer racecheck and synccheck on four key warps at one split at 8 heads (300 tokens, top-k
#   256: the build a decode step's key-warps rule takes from 1.5 waves)
# round21c: compute-sanitizer memcheck on the dq kernel's split plans and invalid indices (scripts/dq_sanitize_case.py),
#   then the dq kernel at B4, B32 and B150 (its split plan against other counts) beside the Triton kernel and FlashMLA
# round22: compute-sanitizer memcheck on the dq kernel's split plans (scripts/dq_sanitize_case.py), then the 32-128-head
#   decode at B1-B128 with the Gluon kernel beside the Triton kernel and FlashMLA, graph replay and eager, each launch
#   checked (scripts/large_small_batch_probe.py; large_small_batch_h200.json): where `sparse_mla` should start on Gluon
# round22b: the same probe (large_small_batch_h200.json), then the dq split plan at the batches where its margin
#   (`mla_gluon_large.DQ_SPLIT_MARGIN`) changes it, against the neighbouring split counts (dq_splits_margin_h200.json)
# round22c: the dq split plan held out at B70, B140 and B190 (64 and 128 heads) against the neighbouring split counts
#   (dq_splits_heldout2_h200.json)
# round23: compute-sanitizer memcheck on the dq kernel's split and tail plans (scripts/dq_sanitize_case.py), then the
#   dq kernel's last partial wave at 64 / 128 heads: one launch of the split plan against the tail plan
#   (`mla_gluon_large.tail_plan`) and FlashMLA, each launch checked (scripts/tail_probe.py; dq_tail_h200.json)
# round23b: the same for the ping-pong kernel (bf16 rows; pp_tail_h200.json), then the case matrix with the tail plan
#   taken by the ping-pong kernel's calls too (at 87ef2d1, `TAIL_MODES`, since `TAIL_MIN_SPLITS`; checks_full_pptail.json)
# round23c: compute-sanitizer memcheck on both kernels' tail plans and the dq split plans (scripts/dq_sanitize_case.py)
# round24: the dq kernel below one wave at 64 / 128 heads: its split plan against the balanced schedule
#   (`balanced_plan`) and FlashMLA (scripts/balanced_probe.py; dq_bal_h200.json), then compute-sanitizer memcheck on
#   the dq kernel's plans and its balanced schedule (scripts/dq_sanitize_case.py), racecheck and synccheck on the
#   balanced schedule's small cases (--bal)
# round24b: the same probe at batches held out from round24's (the rule, `BAL_MAX_FILL`, was fitted on that run)
# round25: every split path through `mla.sparse_mla` with its merge launched plainly and as the kernel's programmatic
#   dependent (`common.pdl`), off / on / on / off in one process, each launch checked, the settings bit-equal
#   (scripts/pdl_probe.py; pdl_h200.json)
# round26: the same probe on the fp8-cache kernel's split and balanced launches, with its programs also triggering
#   after their tile loop (`mla_gluon_fp8mma.PDL_TRIGGER` 2; pdl_late_h200.json)
# round26b: the 8-16-head fp8_ds_mla decode and prefill as an sm_89 / sm_120 GPU would run them, timed here under
#   the 99 KB class's budget: the Triton kernel's 99 KB config, the fp8-cache kernel's 99 KB builds (e4m3 and fp16
#   products, planned for the class, free and held to its programs an SM), the shipped sm_90 build and FlashMLA
#   (scripts/small_class_probe.py; small_class_h200.json)
# round27: the top-k select at a decode step's few rows: its time by how the scores spread over the first digit's
#   bins, with the next block loaded ahead (`topk.SELECT_PREFETCH`) and with 16 warps a program, beside torch.topk
#   (scripts/topk_dist_probe.py; topk_dist_h200.json); round27b: the select before round 27 (`multi=False`)
#   against the row split over programs for every pass (`topk_select(multi=True)`) at 1-128 rows and chunks of 1-8K
#   keys, and the rule's captured call replayed against the eager select (topk_rows_h200.json)
# round28: the top-k passes after the first counted by atomics where few keys match (`topk_select(sparse=)`) and the
#   write's prefix sums over rows of 16 keys (`topk.SELECT_SCAN_ROWS`, round 29), against tl.histogram in every
#   block, 1-128 rows, four score spreads (topk_sparse_h200.json); memcheck of each path (memcheck_topk.log)
# round30: the multi rule's and the split's chunk bounds after round 29's adds (`topk_dist_probe.py --rule`,
#   topk_rule_h200.json), then memcheck-topk
# round31: the early refill's copy modes side by side (scripts/refill_rows_probe.py; refill_rows_h200.json), then
#   racecheck, memcheck and synccheck of the shipped fp8-cache build under modes 1 and 2 (fp8mma_sanitize_case.py)
# round31b: the top-k rule's bounds (refitted in round 30) at row counts held out from their fit (TOPK_RULE_ROWS)
# round31c: the 8-head prefill's parts alone, each early-refill copy mode's copies among them (refill_rows_probe.py --ablate)
# round32: the whole-tile gathers' scale-copy modes side by side at decode (8 / 16 heads, B32 / B128) and the 16-head
#   prefill, with each mode's gathers alone (scripts/gather_scales_probe.py --ablate; gather_scales_h200.json), then
#   memcheck, racecheck and synccheck under mode 1 on fp8mma_sanitize_case.py's cases with 16 heads (--h16);
#   round32b: the case matrix under mode 1 (checks_full_gather_scales1.json)
# round33: the same A/B (no ablation) at decode B8-B512 and the 16-head prefill at 528-8192 tokens, the 8-head prefill
#   (an early-refill build, the same SASS in both modes) as the control (gather_scales_wide_h200.json; ROUND33_CASES
#   replaces the case list);
#   round33-ncu: Nsight Compute on the shipped 16-head prefill (ncu_fp8mma_prefill_h16_gscales1*.txt)
# round34: bf16 q over fp8 keys in each form (two e4m3 terms, the sm_90 rule from round 34) against the top-2048 of
#   bf16 q and of the fp32 q it was rounded from (scripts/indexer_form_topk.py --fp32-q;
#   indexer_form_topk_fp32q_h200.json), then memcheck of every paged-indexer form (sanitizer_indexer_h200.log)
# memcheck-topk: memcheck of the one-program, split and multi selects with each way of counting (memcheck_topk.log)
# ncu-topk: Nsight Compute of the one-program top-k select (1 and 128 rows of 32K standard-normal scores, one of a
#   narrow spread; NCU_TOPK_CASES="128_32768_agg ..." picks others: scripts/topk_ncu_case.py's arguments joined by
#   _; ncu_topk_*.txt, ncu_topk_sass_top_*.txt), and its block / warp configs timed (`topk_dist_probe.py --configs`,
#   topk_configs_h200.json; NCU_TOPK_CONFIGS=0 skips them)
# racecheck-dq: compute-sanitizer racecheck and synccheck on the 130-token 128-head fp8 case (the dq kernel)
# round21: the 64-128-head kernels at fp8 decode B128 with the dequantising-producer kernel (`mla_gluon_large` mode
#   "dq", FlashMLA's sm_90 fp8 decode plan) checked and timed beside the key-split kernel and FlashMLA, its producer
#   alone and its consumers alone (gluon_large_dq_h200.json/.log); round21b: the same script with the prefill
#   timings (bf16 and fp8 caches, s_q 4096) and no stage builds (gluon_large_dq_full_h200.json/.log)
# The benchmark JSON records the commit: set GLM5LIB_COMMIT=<sha> (the device copy of the checkout has no .git).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export GLM5LIB_COMMIT=${GLM5LIB_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/env.txt"
echo "commit ${GLM5LIB_COMMIT:-unknown}" | tee -a "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
for step in "$@"; do
  case $step in
    checks) timeout 150 python3 -m glm5lib.kernels.checks --profile full --json "$OUT/checks_full.json" > "$OUT/checks_full.log" 2>&1
            echo "checks rc=$?"; grep -v " ok " "$OUT/checks_full.log" | tail -20 ;;
    checks-small) timeout 150 python3 -m glm5lib.kernels.checks --profile full --smem-class small --json "$OUT/checks_full_small.json" > "$OUT/checks_full_small.log" 2>&1
            echo "checks-small rc=$?"; grep -v " ok " "$OUT/checks_full_small.log" | tail -20 ;;
    sanitize) timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 -m glm5lib.kernels.checks --sanitize > "$OUT/sanitizer.log" 2>&1
            echo "sanitizer rc=$?"; tail -6 "$OUT/sanitizer.log" ;;
    racecheck) for tool in racecheck synccheck; do  # the Gluon kernels' mbarrier / shared-memory protocol
                 timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 -m glm5lib.kernels.checks --sanitize \
                   --only T130 > "$OUT/${tool}.log" 2>&1; echo "$tool rc=$?"; tail -3 "$OUT/${tool}.log"; done ;;
    racecheck-fp8mma) for tool in racecheck synccheck; do  # the fp8-cache kernel's barriers around its ring and P^T
                 timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 -m glm5lib.kernels.checks --sanitize \
                   --only T40-H8-K2048-N3000-fp8,T33-H12,T600-H16-K512-N3000-fp8 > "$OUT/${tool}_fp8mma.log" 2>&1; echo "$tool rc=$?"
                 tail -3 "$OUT/${tool}_fp8mma.log"; done ;;
    sanitize-indexer) timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/indexer_sanitize_case.py > "$OUT/sanitizer_indexer_h200.log" 2>&1
            echo "sanitizer-indexer rc=$?"; tail -2 "$OUT/sanitizer_indexer_h200.log" ;;
    checks-small-fp8mma) GLM5LIB_FP8MMA=1 timeout 200 python3 -m glm5lib.kernels.checks --profile full --smem-class small \
              --json "$OUT/checks_full_small_fp8mma.json" > "$OUT/checks_full_small_fp8mma.log" 2>&1
            echo "checks-small-fp8mma rc=$?"; grep -v " ok " "$OUT/checks_full_small_fp8mma.log" | tail -8
            GLM5LIB_FP8MMA=1 timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m glm5lib.kernels.checks \
              --sanitize --smem-class small > "$OUT/sanitizer_small_fp8mma.log" 2>&1
            echo "sanitizer-small-fp8mma rc=$?"; tail -4 "$OUT/sanitizer_small_fp8mma.log" ;;
    sanitize-small) timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 -m glm5lib.kernels.checks --sanitize --smem-class small > "$OUT/sanitizer_small.log" 2>&1
            echo "sanitizer-small rc=$?"; tail -4 "$OUT/sanitizer_small.log" ;;
    harness) timeout 300 python3 -m glm5lib.serving.harness --json "$OUT/vllm_harness_h200.json" > "$OUT/vllm_harness_h200.log" 2>&1
            echo "harness rc=$?"; grep -v Warn "$OUT/vllm_harness_h200.log" | tail -24 ;;
    harness-graphs) timeout 300 python3 -m glm5lib.serving.harness --graphs --json "$OUT/vllm_graphs_h200.json" > "$OUT/vllm_graphs_h200.log" 2>&1
            echo "harness-graphs rc=$?"; grep -v Warn "$OUT/vllm_graphs_h200.log" | tail -40 ;;
    harness-swfp8) GLM5LIB_FP8_SOFTWARE=1 timeout 300 python3 -m glm5lib.serving.harness --json "$OUT/vllm_harness_h200_swfp8.json" > "$OUT/vllm_harness_h200_swfp8.log" 2>&1
            echo "harness-swfp8 rc=$?"; grep -v Warn "$OUT/vllm_harness_h200_swfp8.log" | grep -v "^topk" | tail -20 ;;
    bench) timeout 540 python3 -m glm5lib.bench.cli bench all --sweep-indexer --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^  " ;;
    bench-targets) timeout 480 python3 -m glm5lib.bench.cli bench all --quick --no-scaling --sweep-indexer --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^  "
            echo "bench-targets rc=${PIPESTATUS[0]}" ;;
    bounds) timeout 200 python3 -m glm5lib.bench.bounds --json "$OUT/bounds_h200.json" 2>&1 | grep -v Warn | tee "$OUT/bounds.log"
            echo "bounds rc=${PIPESTATUS[0]}" ;;
    gather) timeout 300 python3 -m glm5lib.bench.gather --json "$OUT/gather_h200.json" --force 2>&1 | grep -v Warn | tee "$OUT/gather.log" | grep -v "^fp8\|^bf16"
            echo "gather rc=${PIPESTATUS[0]}" ;;
    bench-sweep) timeout 300 python3 -m glm5lib.bench.cli bench sparse-mla --sweep --quick --no-scaling --name sweep --out "$OUT" > "$OUT/sweep.log" 2>&1
            echo "sweep rc=$?"; tail -30 "$OUT/sweep.log" ;;
    bench-indexer) timeout 150 python3 -m glm5lib.bench.cli bench indexer --name indexer --out "$OUT" > "$OUT/indexer.log" 2>&1
            echo "indexer rc=$?"; grep -v Warn "$OUT/indexer.log" | tail -12 ;;
    bench-swfp8) GLM5LIB_FP8_SOFTWARE=1 timeout 200 python3 -m glm5lib.bench.cli bench sparse-mla --quick --no-scaling --name swfp8 --out "$OUT" > "$OUT/swfp8.log" 2>&1
            echo "swfp8 rc=$?"; grep -v Warn "$OUT/swfp8.log" | grep "fp8_ds_mla" | sort -u | head -20 ;;
    prefill-fp8-sweep) timeout 240 python3 -c "
import json, os
from glm5lib.bench import kernels as b
ceil = b.measure_ceilings()
rows = []
for H in (8, 16):
    rows += b.bench_prefill_case(H, ceil, flashmla=False, kv_format='fp8_ds_mla', configs=b.SWEEP_PREFILL_FP8_SMALL)
json.dump({'meta': {'commit': os.environ.get('GLM5LIB_COMMIT')}, 'ceilings': ceil, 'rows': rows},
          open('$OUT/prefill_fp8_sweep.json', 'w'), indent=1)
for r in rows:
    print(r.get('kind'), r.get('impl'), r.get('H'), round(r.get('us', 0) / 1e3, 3) if 'us' in r else r.get('error'), r.get('rel_err'))
" 2>&1 | grep -v Warn
            echo "prefill-fp8-sweep rc=${PIPESTATUS[0]}" ;;
    topk-sweep) timeout 300 python3 scripts/sweep_topk_select.py "$OUT/topk_select_sweep.json" 2>&1 | grep -v Warn
            echo "topk-sweep rc=${PIPESTATUS[0]}" ;;
    topk-long) timeout 300 python3 scripts/bench_topk_long.py "$OUT/topk_long_h200.json" 2>&1 | grep -v Warn
            echo "topk-long rc=${PIPESTATUS[0]}" ;;
    tune) timeout 340 python3 -m glm5lib.bench.tune_decode --out "$OUT" --bench --deadline 200 --bench-seconds 0 2>&1 | tee "$OUT/tune.log" | grep -v "^  "
            echo "tune rc=${PIPESTATUS[0]}" ;;
    verify) timeout 120 python3 -m glm5lib.bench.tune_decode --verify --out "$OUT" 2>&1 | tee "$OUT/verify.log"
            echo "verify rc=${PIPESTATUS[0]}" ;;
    fp8mma) timeout 300 python3 scripts/fp8mma_device.py "$OUT/fp8mma_h200.json" --configs 0,1,1 1,1,1 2,1,1 2,2,2 1,2,2 --budget-s 200 \
              2>&1 | grep -v Warn > "$OUT/fp8mma_h200.log"; echo "fp8mma rc=${PIPESTATUS[0]}"; tail -8 "$OUT/fp8mma_h200.log" ;;
    batches) timeout 420 python3 scripts/fp8mma_device.py "$OUT/fp8mma_batches_h200.json" --batches 2>&1 | grep -v Warn \
              > "$OUT/fp8mma_batches_h200.log"; echo "batches rc=${PIPESTATUS[0]}"; tail -3 "$OUT/fp8mma_batches_h200.log" ;;
    widen) W="0,1,1,0,0,8,2,1,0 0,1,1,0,0,8,2,1,0,1 0,1,1,0,0,8,2,1,0,2 0,1,1,0,0,8,2,1,0,4"
           timeout 330 python3 scripts/fp8mma_device.py "$OUT/fp8mma_widen_h200.json" --ablate --budget-s 220 --configs $W \
             2>&1 | grep -v Warn > "$OUT/fp8mma_widen_h200.log"; echo "widen rc=${PIPESTATUS[0]}"; grep ablate "$OUT/fp8mma_widen_h200.log" | cut -c1-300
           for H in 8 16; do timeout 90 python3 scripts/fp8mma_waves.py "$OUT/fp8mma_widen_waves${H}_h200.json" --heads $H \
             --tokens 4096 --configs $W 2>&1 | grep -v Warn | tail -2; done ;;
    round19) W="0,1,1,0,0,8,2,1,0 0,1,1,0,0,8,2,1,4 0,1,1,0,0,8,2,1,4,0,1 0,1,1,0,0,8,2,1,0,2 0,1,1,0,0,8,2,1,0,4"
           timeout 330 python3 scripts/fp8mma_device.py "$OUT/fp8mma_round19_h200.json" --ablate --budget-s 240 --configs $W \
             2>&1 | grep -v Warn > "$OUT/fp8mma_round19_h200.log"; echo "round19 rc=${PIPESTATUS[0]}"; grep -v "^{\"kind\": \"gather" "$OUT/fp8mma_round19_h200.log" | cut -c1-260 | tail -40
           timeout 100 python3 scripts/fp8mma_waves.py "$OUT/fp8mma_wgmma_waves16_h200.json" --heads 16 --tokens 2112,4096 \
             --configs 0,1,1,0,0,8,2,1,4 0,1,1,0,0,8,2,1,4,0,1 2>&1 | grep -v Warn | tail -3 ;;
    round19b) W="0,1,1,0,0,8,2,1,4 0,1,1,0,0,8,2,1,4,0,1 0,1,1,0,0,8,2,1,4,0,2"
           timeout 240 python3 scripts/fp8mma_device.py "$OUT/fp8mma_wgmma_h200.json" --ablate --budget-s 180 --configs $W \
             2>&1 | grep -v Warn > "$OUT/fp8mma_wgmma_h200.log"; echo "round19b rc=${PIPESTATUS[0]}"; tail -1 "$OUT/fp8mma_wgmma_h200.log"
           timeout 100 python3 scripts/fp8mma_waves.py "$OUT/fp8mma_wgmma_waves16_h200.json" --heads 16 --tokens 2112,4096 \
             --configs $W 2>&1 | grep -v Warn | tail -3 ;;
    sanitize-wgmma) C=0,1,1,0,0,8,2,1,4,0,2; K=B140-H16-K256-mixed,B2-H16-K96-allinv
           for tool in memcheck racecheck synccheck; do
             timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/fp8mma_device.py /tmp/san_$tool.json --no-time \
               --only $K --configs $C > "$OUT/${tool}_wgmma.log" 2>&1; echo "$tool rc=$?"; tail -2 "$OUT/${tool}_wgmma.log"; done ;;
    ncu16) for C in 0,1,1,0,0,8,2,1,4 0,1,1,0,0,8,2,1,4,0,1; do n=$(echo $C | tr , _)
             timeout 240 ncu -k regex:_sparse_mla_fp8mma --launch-skip 2 --launch-count 1 --set full -f -o /tmp/ncu16_$n \
               python3 scripts/fp8mma_ncu_case.py prefill 16 $C > /tmp/ncu16_$n.log 2>&1; echo "ncu16 $C rc=$?"
             ncu -i /tmp/ncu16_$n.ncu-rep --page details > "$OUT/ncu_fp8mma_prefill_h16_$n.txt" 2>&1
             ncu -i /tmp/ncu16_$n.ncu-rep --page source --print-source sass --csv > /tmp/ncu16_$n.csv 2>&1
             python3 scripts/ncu_sass_top.py /tmp/ncu16_$n.csv 60 > "$OUT/ncu_fp8mma_prefill_h16_sass_top_$n.txt" 2>&1
             grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Shared Memory|Bank" "$OUT/ncu_fp8mma_prefill_h16_$n.txt" | head -12; done ;;
    round20) W="0,1,1,0,0,8,2,1,0,0,3 0,1,1,0,0,8,2,1,4 0,1,1,0,0,8,2,1,4,0,2 1,1,1,0,0,8,2,1,4,0,2"
           timeout 120 python3 scripts/fp8mma_waves.py "$OUT/fp8mma_wgmma_waves8_h200.json" --heads 8 --tokens 2112,4096 \
             --configs $W 2>&1 | grep -v Warn | tail -3
           timeout 250 python3 scripts/fp8mma_device.py "$OUT/fp8mma_round20_h200.json" --ablate --budget-s 140 --configs $W \
             2>&1 | grep -v Warn > "$OUT/fp8mma_round20_h200.log"; echo "round20 rc=${PIPESTATUS[0]}"; tail -1 "$OUT/fp8mma_round20_h200.log"
           timeout 170 python3 scripts/fp8mma_device.py "$OUT/fp8mma_batches_h200.json" --batches 2>&1 | grep -v Warn \
             > "$OUT/fp8mma_batches_h200.log"; echo "batches rc=${PIPESTATUS[0]}"; tail -1 "$OUT/fp8mma_batches_h200.log" ;;
    round20b) timeout 150 python3 scripts/fp8mma_device.py "$OUT/fp8mma_batches_fill_h200.json" --batches --heads 8 \
               --batch-sizes 128,136,192,256,320,384,448,512,520,640,784 2>&1 | grep -v Warn > "$OUT/fp8mma_batches_fill_h200.log"
             echo "round20b rc=${PIPESTATUS[0]}"; tail -1 "$OUT/fp8mma_batches_fill_h200.log" ;;
    round20c) timeout 150 python3 scripts/fp8mma_device.py "$OUT/fp8mma_batches_fill2_h200.json" --batches --heads 8 \
               --batch-sizes 400,420,432,600,700,1000 2>&1 | grep -v Warn > "$OUT/fp8mma_batches_fill2_h200.log"
             echo "round20c rc=${PIPESTATUS[0]}"; tail -1 "$OUT/fp8mma_batches_fill2_h200.log"
             for tool in memcheck racecheck; do  # the four-key-warp build the rule now takes at one split, 1-8 heads
               timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/fp8mma_device.py /tmp/san_$tool.json \
                 --no-time --only B512-H8-K2048-none,B700-H5-K1024-neg --configs 0,1,1,0,0,8,2,1,4 > "$OUT/${tool}_k4.log" 2>&1
               echo "$tool rc=$?"; tail -2 "$OUT/${tool}_k4.log"; done ;;
    round20d) timeout 150 python3 scripts/fp8mma_device.py "$OUT/fp8mma_batches_fill3_h200.json" --batches --heads 8 \
               --batch-sizes 230,240,300,320,384,410,640,900 2>&1 | grep -v Warn > "$OUT/fp8mma_batches_fill3_h200.log"
             echo "round20d rc=${PIPESTATUS[0]}"; tail -1 "$OUT/fp8mma_batches_fill3_h200.log" ;;
    racecheck-dq) for tool in racecheck synccheck; do  # the dequantising-producer kernel's barriers (64-128 heads, fp8)
                 timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 -m glm5lib.kernels.checks --sanitize \
                   --only T130-H128-K2048-N3000-fp8 > "$OUT/${tool}_dq.log" 2>&1; echo "$tool rc=$?"; tail -3 "$OUT/${tool}_dq.log"; done ;;
    round21c) timeout 110 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/dq_sanitize_case.py \
        > "$OUT/memcheck_dq_splits.log" 2>&1; echo "memcheck-dq rc=$?"; tail -3 "$OUT/memcheck_dq_splits.log"
        timeout 100 python3 scripts/dq_splits_probe.py "$OUT/dq_splits_small_h200.json" --batches 4,32,150 \
          --triton 2>&1 | grep -v Warn | tail -40 ;;
    racecheck-k4) for tool in racecheck synccheck; do  # four key warps at one split, 8 heads (the decode rule's build)
               timeout 140 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/fp8mma_device.py /tmp/san_$tool.json \
                 --no-time --only B300-H8-K256-mixed --configs 0,1,1,0,0,8,2,1,4 > "$OUT/${tool}_k4.log" 2>&1
               echo "$tool rc=$?"; tail -2 "$OUT/${tool}_k4.log"; done ;;
    round21) timeout 400 python3 scripts/gluon_mla_large_device.py "$OUT/gluon_large_dq_h200.json" --decode-only --probe \
        > "$OUT/gluon_large_dq_h200.log" 2>&1; echo "round21 rc=$?"; grep -v "^{" "$OUT/gluon_large_dq_h200.log" | tail -30 ;;
    round21b) timeout 400 python3 scripts/gluon_mla_large_device.py "$OUT/gluon_large_dq_full_h200.json" \
        > "$OUT/gluon_large_dq_full_h200.log" 2>&1; echo "round21b rc=$?"; grep -v "^{" "$OUT/gluon_large_dq_full_h200.log" | tail -40 ;;
    round22) timeout 110 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/dq_sanitize_case.py \
        > "$OUT/memcheck_dq_splits.log" 2>&1; echo "memcheck-dq rc=$?"; tail -3 "$OUT/memcheck_dq_splits.log"
        timeout 330 python3 scripts/large_small_batch_probe.py "$OUT/large_small_batch_h200.json" \
          > "$OUT/large_small_batch.log" 2>&1; echo "probe rc=$?"; tail -4 "$OUT/large_small_batch.log" ;;
    round22b) timeout 200 python3 scripts/large_small_batch_probe.py "$OUT/large_small_batch_h200.json" \
          > "$OUT/large_small_batch.log" 2>&1; echo "probe rc=$?"; tail -2 "$OUT/large_small_batch.log"
        timeout 250 python3 scripts/dq_splits_probe.py "$OUT/dq_splits_margin_h200.json" --batches 12,20,24,80,96,150,180 \
          > "$OUT/dq_splits_margin.log" 2>&1; echo "splits rc=$?"; grep -c '"us"' "$OUT/dq_splits_margin.log" ;;
    round22c) timeout 150 python3 scripts/dq_splits_probe.py "$OUT/dq_splits_heldout2_h200.json" --batches 70,140,190 \
          > "$OUT/dq_splits_heldout2.log" 2>&1; echo "splits rc=$?"; grep -c '"us"' "$OUT/dq_splits_heldout2.log" ;;
    round23) timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/dq_sanitize_case.py \
        > "$OUT/memcheck_dq_tail.log" 2>&1; echo "memcheck-dq rc=$?"; tail -3 "$OUT/memcheck_dq_tail.log"
        timeout 300 python3 scripts/tail_probe.py "$OUT/dq_tail_h200.json" --formats fp8_ds_mla > "$OUT/dq_tail.log" 2>&1
        echo "tail probe rc=$?"; tail -2 "$OUT/dq_tail.log" ;;
    round24) timeout 250 python3 scripts/balanced_probe.py "$OUT/dq_bal_h200.json" > "$OUT/dq_bal.log" 2>&1
        echo "balanced probe rc=$?"; tail -2 "$OUT/dq_bal.log"
        timeout 110 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/dq_sanitize_case.py \
        > "$OUT/memcheck_dq_bal.log" 2>&1; echo "memcheck-dq rc=$?"; tail -3 "$OUT/memcheck_dq_bal.log"
        for tool in racecheck synccheck; do
          timeout 70 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/dq_sanitize_case.py --bal \
            > "$OUT/${tool}_dq_bal.log" 2>&1; echo "$tool rc=$?"; tail -3 "$OUT/${tool}_dq_bal.log"; done ;;
    round24b) timeout 200 python3 scripts/balanced_probe.py "$OUT/dq_bal_heldout_h200.json" --batches64 67,70,72,74,80 \
          --batches128 35,36,38 > "$OUT/dq_bal_heldout.log" 2>&1; echo "balanced probe rc=$?"; tail -1 "$OUT/dq_bal_heldout.log" ;;
    round25) timeout 300 python3 scripts/pdl_probe.py "$OUT/pdl_h200.json" > "$OUT/pdl.log" 2>&1
        echo "pdl probe rc=$?"; grep -v '^{' "$OUT/pdl.log" | tail -24 ;;
    round26b) timeout 420 python3 scripts/small_class_probe.py "$OUT/small_class_h200.json" > "$OUT/small_class.log" 2>&1
        echo "small-class probe rc=$?"; grep -v '^{' "$OUT/small_class.log" | tail -60 ;;
    round26) timeout 240 python3 scripts/pdl_probe.py "$OUT/pdl_late_h200.json" --fp8mma > "$OUT/pdl_late.log" 2>&1
        echo "pdl probe rc=$?"; grep -v '^{' "$OUT/pdl_late.log" | tail -14 ;;
    round27) timeout 200 python3 scripts/topk_dist_probe.py "$OUT/topk_dist_h200.json" > "$OUT/topk_dist.log" 2>&1
        echo "topk dist probe rc=$?"; cut -c1-330 "$OUT/topk_dist.log" | tail -14 ;;
    round27b) timeout 300 python3 scripts/topk_dist_probe.py "$OUT/topk_rows_h200.json" --sweep > "$OUT/topk_rows.log" 2>&1
        echo "topk rows sweep rc=$?"; tail -1 "$OUT/topk_rows.log" ;;
    round28) timeout 400 python3 scripts/topk_dist_probe.py "$OUT/topk_sparse_h200.json" --sparse > "$OUT/topk_sparse.log" 2>&1
        echo "topk sparse rc=$?"; tail -1 "$OUT/topk_sparse.log"; bash "$0" memcheck-topk ;;
    round30) timeout 400 python3 scripts/topk_dist_probe.py "$OUT/topk_rule_h200.json" --rule > "$OUT/topk_rule.log" 2>&1
        echo "topk rule rc=$?"; tail -1 "$OUT/topk_rule.log"; bash "$0" memcheck-topk ;;
    round31) timeout 300 python3 scripts/refill_rows_probe.py "$OUT/refill_rows_h200.json" > "$OUT/refill_rows.log" 2>&1
        echo "refill rows probe rc=$?"; grep -a "^{" "$OUT/refill_rows.log" | cut -c1-400
        for run in racecheck:1 racecheck:2 memcheck:2 synccheck:2 memcheck:1; do tool=${run%:*}; m=${run#*:}
          timeout 100 compute-sanitizer --tool $tool --print-limit 20 python3 -c "import sys; sys.path.insert(0, 'scripts')
from glm5lib.kernels import mla_gluon_fp8mma as fm
import fp8mma_sanitize_case as c
fm.set_refill_rows($m)
sys.exit(c.main(['--configs', '0,1,1,0,0,8,2,1,0,0,3']))" > "$OUT/${tool}_refill_rows$m.log" 2>&1; echo "$tool mode $m rc=$?"
          tail -2 "$OUT/${tool}_refill_rows$m.log"; done ;;
    round31c) timeout 300 python3 scripts/refill_rows_probe.py "$OUT/refill_ablate_h200.json" --tokens 4096 --reps 1 \
          --ablate > "$OUT/refill_ablate.log" 2>&1; echo "refill ablate rc=$?"; grep -a "^{" "$OUT/refill_ablate.log" ;;
    round32) timeout 300 python3 scripts/gather_scales_probe.py "$OUT/gather_scales_h200.json" --ablate \
          > "$OUT/gather_scales.log" 2>&1; echo "gather scales probe rc=$?"; grep -a "^{" "$OUT/gather_scales.log" | cut -c1-600
        for tool in memcheck racecheck synccheck; do
          timeout 100 compute-sanitizer --tool $tool --print-limit 20 python3 -c "import sys; sys.path.insert(0, 'scripts')
from glm5lib.kernels import mla_gluon_fp8mma as fm
import fp8mma_sanitize_case as c
fm.set_gather_scales(1)
sys.exit(c.main(['--h16', '--configs', '0,1,1,0,0,8,2,1,0,0,3']))" > "$OUT/${tool}_gather_scales1.log" 2>&1; echo "$tool mode 1 rc=$?"
          tail -2 "$OUT/${tool}_gather_scales1.log"; done ;;
    round33) # v43 across batch sizes and token counts (the 8-head prefill, an early-refill build, as the control)
        C=${ROUND33_CASES:-dec8:8,dec8:64,dec8:256,dec8:512,dec16:8,dec16:64,dec16:256,dec16:512,pre16:528,pre16:2112,pre16:8192,pre8:4096}
        timeout 330 python3 scripts/gather_scales_probe.py "$OUT/gather_scales_wide_h200.json" --cases "$C" \
          > "$OUT/gather_scales_wide.log" 2>&1; echo "gather scales wide rc=$?"
        grep -a "^{" "$OUT/gather_scales_wide.log" | python3 -c "import json, sys
for r in map(json.loads, sys.stdin):
    print(r['decode'], r['H'], r['T'], round(r['mode0_us_median'], 2), round(r['mode1_us_median'], 2),
          round(r['speedup_1_vs_0'], 4), r['bit_equal'], r['ok'])" ;;
    round33-ncu) # the shipped 16-head prefill under Nsight Compute (issue slots, stalls, SASS lines)
        timeout 200 ncu -k regex:_sparse_mla_fp8mma --launch-skip 2 --launch-count 1 --set full -f -o /tmp/ncu33 \
          python3 scripts/fp8mma_ncu_case.py prefill 16 > /tmp/ncu33.log 2>&1; echo "ncu prefill 16 rc=$?"
        ncu -i /tmp/ncu33.ncu-rep --page details > "$OUT/ncu_fp8mma_prefill_h16_gscales1.txt" 2>&1
        ncu -i /tmp/ncu33.ncu-rep --page source --print-source sass --csv > /tmp/ncu33.csv 2>&1
        python3 scripts/ncu_sass_top.py /tmp/ncu33.csv 60 > "$OUT/ncu_fp8mma_prefill_h16_gscales1_sass_top.txt" 2>&1
        grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Issued Warp|No Eligible|Active Warps Per" \
          "$OUT/ncu_fp8mma_prefill_h16_gscales1.txt" | head -12 ;;
    round34) # the indexer's q forms against bf16 q's and fp32 q's top-k at B128 ctx 32K, each as the rule launches it
        timeout 200 python3 scripts/indexer_form_topk.py "$OUT/indexer_form_topk_fp32q_h200.json" --fp32-q \
          > "$OUT/indexer_form_topk.log" 2>&1; echo "form topk rc=$?"; cat "$OUT/indexer_form_topk.log" | cut -c1-400
        timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/indexer_sanitize_case.py \
          > "$OUT/sanitizer_indexer_h200.log" 2>&1; echo "sanitize indexer rc=$?"; tail -2 "$OUT/sanitizer_indexer_h200.log" ;;
    round32b) timeout 200 python3 -c "import sys
from glm5lib.kernels import checks, mla_gluon_fp8mma as fm
fm.set_gather_scales(1)
sys.exit(checks.main(['--profile', 'full', '--json', '$OUT/checks_full_gather_scales1.json']))" \
          > "$OUT/checks_full_gather_scales1.log" 2>&1; echo "checks mode 1 rc=$?"; tail -3 "$OUT/checks_full_gather_scales1.log" ;;
    round31b) TOPK_RULE_ROWS="20 24 28 40 56" timeout 300 python3 scripts/topk_dist_probe.py "$OUT/topk_rule_heldout_h200.json" \
          --rule > "$OUT/topk_rule_heldout.log" 2>&1; echo "topk rule held out rc=$?"; tail -1 "$OUT/topk_rule_heldout.log" ;;
    memcheck-topk)
        # memcheck: the one-program, split and multi selects with atomics in every block and by the default rule, in
        # the wave config (these few rows) and the several-an-SM one, with each way of counting digits (SELECT_AGG),
        # and small k on split rows (merge blocks smaller than a program's threads: no adds there)
        timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 -c "
import torch
import glm5lib.kernels.topk as topk
from glm5lib.kernels.topk import topk_select
g = torch.Generator(device='cuda').manual_seed(1)
ok = total = 0
for T, n in ((3, 5000), (2, 40000), (4, 70000), (1, 40000)):
    x = torch.randn(T, n, generator=g, device='cuda')
    x[0, ::3] = 0.0
    L = torch.randint(n // 2, n + 1, (T,), generator=g, device='cuda', dtype=torch.int32)
    topk.SELECT_SCAN_ROWS, topk.SELECT_AGG = 0, 0  # the base: histograms, 1-D scans, no adds
    base = topk_select(x, 2048, lengths=L, multi=False, sparse=0)
    for kw in ({'multi': False, 'sparse': 1}, {'multi': False}, {'multi': False, 'sparse': 4},
               {'multi': False, 'config': (4096, 8, 8)}):
        for rows, agg in ((16, 0), (16, 1), (16, 2), (16, 3)):  # topk.SELECT_SCAN_ROWS, topk.SELECT_AGG
            topk.SELECT_SCAN_ROWS, topk.SELECT_AGG = rows, agg
            ok += bool(torch.equal(topk_select(x, 2048, lengths=L, **kw), base)); total += 1
    for kw in ({'multi': True, 'sparse': 1}, {'multi': True}, {'multi': True, 'sparse': 4}):  # no adds in multi
        for rows in (0, 16):
            topk.SELECT_SCAN_ROWS = rows
            ok += bool(torch.equal(topk_select(x, 2048, lengths=L, **kw), base)); total += 1
x = torch.randn(2, 40000, generator=g, device='cuda')  # small k on split rows: merge blocks below a thread a key
topk.SELECT_AGG = 0
base = topk_select(x, 64, multi=False, sparse=0)
for agg in (1, 3):
    topk.SELECT_AGG = agg
    ok += bool(torch.equal(topk_select(x, 64, multi=False), base)); total += 1
print('topk memcheck cases equal to sparse=0:', ok, 'of', total)
" > "$OUT/memcheck_topk.log" 2>&1; echo "topk memcheck rc=$?"; grep -a "ERROR SUMMARY\|equal to" "$OUT/memcheck_topk.log" ;;
    ncu-topk) for n in ${NCU_TOPK_CASES:-1_32768 128_32768 1_32768_narrow}; do C=$(echo $n | tr _ ' ')
             timeout 200 ncu -k regex:_topk_select_kernel --launch-skip 2 --launch-count 1 --set full -f -o /tmp/ncut_$n \
               python3 scripts/topk_ncu_case.py $C > /tmp/ncut_$n.log 2>&1; echo "ncu-topk $C rc=$?"; grep -a picks /tmp/ncut_$n.log
             ncu -i /tmp/ncut_$n.ncu-rep --page details > "$OUT/ncu_topk_$n.txt" 2>&1
             ncu -i /tmp/ncut_$n.ncu-rep --page source --print-source sass --csv > /tmp/ncut_$n.csv 2>&1
             python3 scripts/ncu_sass_top.py /tmp/ncut_$n.csv 80 > "$OUT/ncu_topk_sass_top_$n.txt" 2>&1
             grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Registers Per|Achieved Occupancy" "$OUT/ncu_topk_$n.txt" | head -8
           done
           if [ "${NCU_TOPK_CONFIGS:-1}" != 0 ]; then
             timeout 200 python3 scripts/topk_dist_probe.py "$OUT/topk_configs_h200.json" --configs > "$OUT/topk_configs.log" 2>&1
             echo "topk configs rc=$?"; tail -1 "$OUT/topk_configs.log"; fi ;;
    round23b) timeout 300 python3 scripts/tail_probe.py "$OUT/pp_tail_h200.json" --formats bf16 > "$OUT/pp_tail.log" 2>&1
        echo "tail probe rc=$?"; tail -2 "$OUT/pp_tail.log"
        timeout 200 python3 -c "import sys; from glm5lib.kernels import checks, mla_gluon_large as m
m.TAIL_MIN_SPLITS = {'dq': 2, 'pingpong': 2}
sys.exit(checks.main(['--profile', 'full', '--json', '$OUT/checks_full_pptail.json']))" \
          > "$OUT/checks_full_pptail.log" 2>&1; echo "checks (ping-pong tail) rc=$?"
        tail -1 "$OUT/checks_full_pptail.log" ;;
    round23c) timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/dq_sanitize_case.py \
        > "$OUT/memcheck_tail.log" 2>&1; echo "memcheck-tail rc=$?"; tail -3 "$OUT/memcheck_tail.log" ;;
    compile) timeout 150 python3 -m glm5lib.kernels.compile_report --arch 90 --json "$OUT/compile_sm90_triton36.json" > /dev/null 2>&1; echo "compile rc=$?" ;;
  esac
done
