"""Evidence checks of committed results, not regression tests.

The GPU results under outputs/bench/ come from H200 runs (`bash scripts/device_kernels.sh ...`) and are
committed because CI has no GPU. Nothing here runs a kernel: these checks fail when a committed result is
truncated, edited by hand, or replaced by a run that failed, and they hold the README's and docs/kernels.md's
numbers to the files (all cases passed, worst relative error 2e-3 in bf16, 22/22 call-path cases, a clean
compute-sanitizer log). The code that produced them is tested elsewhere (Triton interpreter, AOT compiles).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import torch

from glm5lib.bench import kernels as bench

BENCH = Path(__file__).resolve().parents[1] / "outputs" / "bench"


def load(name: str):
    return json.loads((BENCH / name).read_text())


def test_evidence_bench_h200_is_an_h200_run_with_flashmla():
    res = load("bench_h200.json")
    assert res["meta"]["gpu"] == "NVIDIA H200" and res["meta"]["flashmla"] == "loaded"
    assert res["ceilings"]["copy_GBps"] > 1000 and res["ceilings"]["matmul_bf16_TFLOPs"] > 100


def test_evidence_bench_h200_rows_agree_with_the_reference_and_verdicts_recompute():
    res = load("bench_h200.json")
    checked = [r for r in res["rows"] if r.get("rel_err") is not None]
    assert checked and all(r["rel_err"] < 1e-2 for r in checked), [r for r in checked if r["rel_err"] >= 1e-2]
    again = {t["target"]: t["met"] for t in bench.evaluate_targets(res)}
    committed = {t["target"]: t["met"] for t in res["targets"]}
    assert res["meta"]["commit"]  # a run of the issue-#13 bench: the same targets, the same verdicts
    assert again == committed  # the verdicts follow from the rows
    assert sum(bool(m) for m in committed.values()) == 9 and len(committed) == 22  # README: "9 of 22 met"


def test_evidence_case_matrix_h200_passed():
    rows = load("checks_h200_full.json")
    assert len(rows) >= 100 and all(r["ok"] for r in rows), [r["name"] for r in rows if not r["ok"]]
    assert max(r["rel"] for r in rows) < 2.5e-3  # README: worst relative error 2e-3 in bf16


def test_evidence_vllm_call_path_h200_passed():
    for name in ("vllm_harness_h200.json", "vllm_harness_h200_swfp8.json"):
        res = load(name)
        assert res["device"] == "NVIDIA H200"
        assert len(res["results"]) == 22 and all(r["ok"] for r in res["results"]), name  # README: 22/22


def test_evidence_sanitizer_h200_clean():
    for name in ("sanitizer_h200.log", "sanitizer_h200_small.log"):  # the sm_90 configs; the sm_89/sm_120 ones
        log = (BENCH / name).read_text()
        summaries = [ln for ln in log.splitlines() if "ERROR SUMMARY" in ln]
        assert summaries and all(ln.rstrip().endswith(": 0 errors") for ln in summaries), name


def test_evidence_every_shipped_config_ran_the_matrix_and_the_sanitizer_on_the_h200():
    from glm5lib.bench import evidence

    cov = evidence.coverage()
    # both shared-memory classes, the Gluon kernels sm_90 takes for 17-128 heads and its fp8-cache kernel for 1-16
    # (and its 99 KB build, taken on sm_89 / sm_120 with GLM5LIB_FP8MMA=1)
    assert len(cov["shipped"]) == len(evidence.CONFIGS) + 4 == len(evidence.shipped_configs())
    h100 = {"h100_full_matrix", "h100_full_matrix_r31", "h100_sanitizer", "h100_bench"}
    small8 = {"h100_full_matrix_smem_small_fp8mma", "h100_sanitizer_smem_small_fp8mma"}
    for key, s in cov["shipped"].items():
        ran = set(s["covered_by"])
        assert ran & {"h200_full_matrix", "h200_full_matrix_smem_small", "h200_full_matrix_r8", "h100_full_matrix",
                      "h100_full_matrix_smem_small_fp8mma"}, key
        assert ran & {"h200_sanitizer", "h200_sanitizer_smem_small", "h200_sanitizer_r8", "h100_sanitizer",
                      "h100_sanitizer_smem_small_fp8mma"}, key
    # the fp8-cache kernel's 99 KB build (round 26) ran the matrix and memcheck on an H100 only, under that class
    assert cov["shipped"]["small-fp8mma/fp8_ds_mla/small"] == {"config": "fp8mma-nbuf1-f16-t8",
                                                               "covered_by": sorted(small8)}
    m8s, s8s = cov["pieces"]["h100_full_matrix_smem_small_fp8mma"], cov["pieces"]["h100_sanitizer_smem_small_fp8mma"]
    assert m8s["passed"] == m8s["cases"] == 131 and s8s["passed"] == s8s["cases"] == 28 and s8s["sanitizer_errors"] == 0
    # every sm_90 config shipped now ran the matrix and memcheck on the H200 at 6eaff6f (round 26), among them the two
    # that rounds 19-25 ran on an H100 only (no H200 could be had): the fp8-cache kernel's (key-warps and wgmma rules)
    # and the dequantising-producer kernel for 17-128 heads over fp8_ds_mla
    m2, s2 = cov["pieces"]["h200_full_matrix"], cov["pieces"]["h200_sanitizer"]
    assert (m2["commit"], s2["commit"]) == ("6eaff6f", "6eaff6f") and m2["recorded"] and s2["recorded"]
    assert m2["passed"] == m2["cases"] == 131 and s2["passed"] == s2["cases"] == 28 and s2["sanitizer_errors"] == 0
    for key in ("large-gluon/fp8_ds_mla/big", "large-gluon/bf16/big", "small-fp8mma/fp8_ds_mla/big"):
        assert {"h200_full_matrix", "h200_sanitizer"} <= set(cov["shipped"][key]["covered_by"]), key
    only_h100 = [k for k, s in cov["shipped"].items() if not set(s["covered_by"]) - h100 - small8 - {"h200_bench"}]
    assert only_h100 == ["small-fp8mma/fp8_ds_mla/small"], only_h100
    # round 31's early-refill copies (REFILL_ROWS 2) ran the matrix on an H100 only, under the same config name
    m31 = cov["pieces"]["h100_full_matrix_r31"]
    assert m31["commit"] == "fc1f348" and m31["recorded"] and m31["passed"] == m31["cases"] == 131
    assert "h100_full_matrix_r31" in cov["shipped"]["small-fp8mma/fp8_ds_mla/big"]["covered_by"]
    mh, sh = cov["pieces"]["h100_full_matrix"], cov["pieces"]["h100_sanitizer"]
    assert (mh["commit"], sh["commit"]) == ("a815ef4", "a815ef4") and mh["passed"] == mh["cases"] == 131
    for old in ("f6a643d", "59e3fa7", "e6bb2f0", "6f7cc40", "18bdc50", "68aed99"):  # rounds 19-25's
        assert "ERROR SUMMARY: 0 errors" in (BENCH / "sweeps" / f"sanitizer_h100_{old}.log").read_text()
    assert sh["passed"] == sh["cases"] == 28 and sh["sanitizer_errors"] == 0
    for tool, summary in (("memcheck", "ERROR SUMMARY: 0 errors"), ("racecheck", "RACECHECK SUMMARY: 0 hazards"),
                          ("synccheck", "ERROR SUMMARY: 0 errors")):
        log = (BENCH / "sweeps" / f"{tool}_wgmma_h200_4812c4d.log").read_text()
        assert summary in log and '"failed_checks": 0' in log and "k4-wga" in log, tool
    # round 8's runs (the fp8-cache kernel then took 1-8 heads) stand in for one config only: the Triton prefill config
    # that 9-16 heads over fp8_ds_mla fall back to on sm_90 (GLM5LIB_FP8MMA=0, fp16 q, no Gluon), unchanged since
    r8 = {"h200_full_matrix_r8", "h200_sanitizer_r8"}
    assert [k for k, s in cov["shipped"].items() if not set(s["covered_by"]) - r8] == ["prefill-small/fp8_ds_mla/big"]
    m8, s8 = cov["pieces"]["h200_full_matrix_r8"], cov["pieces"]["h200_sanitizer_r8"]
    assert m8["commit"] == s8["commit"] == "73d2a37" and m8["passed"] == m8["cases"] == 124
    assert s8["passed"] == s8["cases"] and s8["sanitizer_errors"] == 0


def test_evidence_case_matrix_h200_with_the_sm120_configs_passed():
    # `checks --profile full --smem-class small` on the H200, and the same with GLM5LIB_FP8_SOFTWARE=1 (the "small"
    # configs also serve sm_80, which has no hardware e4m3 conversion)
    for name in ("checks_h200_full_small.json", "checks_h200_full_small_swfp8.json"):
        rows = load(name)
        assert len(rows) >= 100 and all(r["ok"] for r in rows), (name, [r["name"] for r in rows if not r["ok"]])


def test_evidence_bounds_h200_place_the_small_head_decode_cost():
    res = load("bounds_h200.json")
    assert res["gpu"] == "NVIDIA H200" and res["commit"]
    rows = {(r["kv_format"], r["B"]): r for r in res["rows"]}
    assert set(rows) == {("fp8_ds_mla", 32), ("fp8_ds_mla", 128), ("bf16", 32), ("bf16", 128)}
    for r in rows.values():
        # a stage of the kernel's loop cannot take longer than the kernel, nor move bytes faster than a copy
        assert r["gather"]["us"] < r["kernel"]["us"] and r["gather+convert"]["us"] < r["kernel"]["us"]
        assert r["floor_us"] < min(r["gather"]["us"], r["gather+convert"]["us"])  # nothing beats a copy
        # the kernel's share: what the stage probes leave for the attention itself
        assert r["kernel"]["share_of_kernel"] == 1 and 0 < r["gather"]["share_of_kernel"] < 1
    # README: the load path reaches 68-73 % of copy for fp8 rows and 82 % for bf16 (B=128): below the 85 % goals
    assert max(rows[("fp8_ds_mla", 128)][k]["pct_copy"] for k in ("gather", "gather+convert")) < 85
    assert rows[("bf16", 128)]["gather"]["pct_copy"] < 85


def test_evidence_gather_ceiling_h200_bounds_the_small_head_targets():
    """`bench.gather` on the H200: every probe's sums matched torch's before it was timed; the same-size copy is
    faster than any gather; the best read-only gather of the decode's random fp8 rows stays well under the 85 %
    goal, bf16 rows come within a few points of it (README, NOTES round 7: 61 / 75 % fp8, 70 / 85 % bf16)."""
    res = load("gather_h200.json")
    assert res["gpu"] == "NVIDIA H200" and res["commit"]
    rows = res["rows"]
    checked = [r for r in rows if "sums_match" in r]
    assert len(checked) >= 100 and all(r["sums_match"] for r in checked)
    assert not [r for r in rows if "error" in r]
    from glm5lib.bench import gather

    reads = ("triton", "flat", "flat-l2", "tma")  # index_select writes what it reads: its rate counts both
    for fmt in ("fp8_ds_mla", "bf16"):
        for B in (32, 128):
            stream = gather.best(rows, kv_format=fmt, B=B, method="stream")["pct_copy"]
            best = {p: max(gather.best(rows, kv_format=fmt, B=B, method=m, pattern=p)["pct_copy"] for m in reads)
                    for p in gather.PATTERNS}
            assert max(best.values()) < stream <= 100, (fmt, B)
            assert best["random"] < (80 if fmt == "fp8_ds_mla" else 88), (fmt, B)
            assert abs(best["sorted"] - best["random"]) < 1  # order within a token buys next to nothing
            rnd = {m: gather.best(rows, kv_format=fmt, B=B, method=m, pattern="random")["pct_copy"] for m in reads}
            assert rnd["tma"] < min(rnd["triton"], rnd["flat"])  # one TMA copy per row is the slowest route
            if fmt == "fp8_ds_mla":
                assert rnd["flat-l2"] < rnd["flat"] - 3  # the L2::256B hint loses on 656-byte rows (v12e)
    # the benchmark's targets carry the same measurement, recomputed with the margin: the fp8 byte floor and the fp8
    # speed-up at B128 are below goal on the gathers alone; bf16 at B128 sits at the margin (82-85 % in the runs:
    # which side of it a run lands on is the run's noise, NOTES round 8)
    targets = {t["target"]: t for t in bench.evaluate_targets(load("bench_h200.json"))}
    floor = [t for n, t in targets.items() if "% of byte floor" in n]
    assert len(floor) == 4 and all(t["bounded"] is True and t["ceiling"] < 80 for t in floor)
    bf16 = [t for n, t in targets.items() if n.startswith("decode bf16")]
    assert len(bf16) == 2 and all(80 < t["ceiling"] < 85 for t in bf16)
    assert all(t["bounded"] == (t["ceiling"] < 85 * bench.CEILING_MARGIN) for t in bf16)
    speed = {n for n, t in targets.items() if "speed-up vs FlashMLA padded" in n and t["bounded"]}
    assert speed == {f"decode fp8 H{H} B128: speed-up vs FlashMLA padded to 64" for H in (8, 16)}


def test_evidence_ab_launch_path_changed_no_kernel_time():
    res = load("ab_mla_v6_v7_h200.json")  # v6's launch path against the cached-plan / pre-bound one
    rows = [r for r in res["rows"] if "error" not in r]
    assert len(rows) == 18 and all(r["outputs_equal"] for r in rows)
    assert all(0.97 < r["new_over_old"] < 1.03 for r in rows)


def test_evidence_prebound_cuts_eager_host_time():
    """README: the pre-bound launcher cuts an eager layer's host time by 18-34 % with identical outputs."""
    s = load("vllm_graphs_h200.json")["summary"]
    assert s["prebound_same_outputs"] is True
    cuts = [1 - pre / plain for plain, pre in s["eager_host_us_plain_vs_prebound"].values()]
    assert len(cuts) == 2 and 0.15 < min(cuts) <= max(cuts) < 0.4, cuts


def test_evidence_gluon_kernels_h200_correct_and_their_timing_claims():
    """The Gluon small-head kernels (not dispatched): every check case passed in each H200 run, and the README /
    docs/kernels.md numbers follow from the files (0.88x the Triton kernel at B128 H8 with the single-slot ring)."""
    for name in ("gluon_mla_device_h200.json", "gluon_ws_h200.json", "gluon_nbuf1_h200.json"):
        res = load(name)
        assert res["info"]["device"] == "NVIDIA H200" and res["info"]["commit"], name
        assert len(res["checks"]) >= 50 and all(r["ok"] for r in res["checks"]), name
    us = {r["kernel"]: r["us"] for r in load("gluon_nbuf1_h200.json")["bench"] if r["B"] == 128 and r["H"] == 8}
    assert round(us["gluon N-BN32-w4-nbuf1"] / us["triton"], 2) == 0.88
    # README / NOTES.md v8c: the warp-specialized kernel at 0.86-0.93x the Triton kernel at H16 / B32, 0.97x at B128 H8
    bench_ws = load("gluon_ws_h200.json")["bench"]
    ws = {(r["B"], r["H"]): r["us"] for r in bench_ws if r["kernel"] == "gluon W2-BN32-w4-nbuf2"}
    tri = {(r["B"], r["H"]): r["us"] for r in bench_ws if r["kernel"] == "triton"}
    ratio = {k: round(ws[k] / tri[k], 2) for k in ((32, 8), (32, 16), (128, 8), (128, 16))}
    assert ratio[(128, 16)] == 0.86 and {ratio[(32, 8)], ratio[(32, 16)]} == {0.92, 0.93} and ratio[(128, 8)] == 0.97
    # why it is not dispatched: through Triton's plain binder an eager call costs ~95 us of host time, the
    # pre-bound Triton kernel ~50 (B1)
    host = {r["path"]: r["host_us"] for r in load("gluon_mla_eager_h200.json")["rows"] if r["B"] == 1}
    assert round(host["triton"], -1) == 50 and round(host["gluon N-BN32-w4-nbuf1"], -1) == 100


def test_evidence_gluon_stage_probes_place_the_attention_cost():
    """README: at B128 H8 the gathers take 64 us (64 % of copy), the conversion ~0, S = q k^T +40 us, the softmax
    +17, P V +17 (`scripts/gluon_mla_probe.py`)."""
    res = load("gluon_mla_probe_h200.json")
    st = {r["stage"]: r for r in res["rows"] if r["B"] == 128 and r["H"] == 8 and r["impl"] == "gluon N-BN32-w4-nbuf2"}
    assert round(st["gather"]["us"]) == 64 and round(100 * st["gather"]["floor_us"] / st["gather"]["us"]) == 64
    assert abs(st["gather+convert"]["us"] - st["gather"]["us"]) < 3
    assert round(st["+QK"]["us"] - st["gather+convert"]["us"]) == 40
    assert round(st["+QK+softmax"]["us"] - st["+QK"]["us"]) == 17
    assert round(st["kernel"]["us"] - st["+QK+softmax"]["us"]) == 17


def test_evidence_topk_long_rows_split_select():
    """docs/kernels.md: the split select takes 128K-key rows from 460 to 124 us (1-4 rows) and stays slower than
    torch.topk there, which is why `topk_fast` keeps torch.topk past 32K keys."""
    rows = {(r["T"], r["n"]): r for r in load("topk_long_h200.json")["rows"] if not r.get("wide")}
    r = rows[(1, 131072)]
    assert round(r["one_program_graph_us"]) == 460 and round(r["default_graph_us"]) == 124
    for r in rows.values():
        assert all(v for k, v in r.items() if "equals" in k), r  # same picks as one program / torch.topk's set
        if r["n"] > 32768:
            assert r["default_graph_us"] < r["one_program_graph_us"]
            assert r["torch_topk_graph_us"] < r["default_graph_us"]
    # paged.decode_topk: rows 202752 wide (the graph decode path) read up to the context; the same picks
    wide = {(r["T"], r["length"]): r for r in load("topk_long_h200.json")["rows"] if r.get("wide")}
    assert len(wide) == 6 and all(r["default_equals_one_program"] and r["set_equals_torch_topk_of_the_prefix"]
                                  for r in wide.values())
    assert round(wide[(1, 131072)]["default_graph_us"]) == 124 and round(wide[(1, 4096)]["default_graph_us"]) == 29


def test_evidence_topk_multi_at_few_rows():
    """docs/kernels.md v32, README, `topk.SELECT_MULTI`: on an H100 (graph replay, one run at eef246a) the row split
    over programs for every pass takes one row of 32K / 128K keys (and the decode path's 202752-wide row at 128K)
    from 114-124 us to 30-31 us at 2048-key chunks, faster than torch.topk, with the same picks; at 128 rows of 32K
    it is slower than the one-program select at every chunk; the scores' spread moves nothing (within 0.5 %);
    prefetch and 16 warps are slower everywhere. `multi_rule` takes it below its bound and not at 128 x 32K."""
    from glm5lib.kernels import topk

    res = load("sweeps/topk_dist_h100_eef246a.json")
    assert res["meta"]["device"].startswith("NVIDIA H100") and res["meta"]["triton"] == "3.6.0"
    rows = {(r["dist"], r["T"], r["n"]): r for r in res["rows"]}
    assert len(rows) == 8 and not any("error" in r for r in rows.values())
    for r in rows.values():
        assert all(v for k, v in r.items() if "equals" in k), r  # every variant's picks, torch.topk's set
        slower = [round(100 * (r[f"{v}_graph_us"] / r["shipped_graph_us"] - 1)) for v in ("prefetch", "warps16")]
        assert 2 <= slower[0] <= 4 and 11 <= slower[1] <= 19, slower  # "2-4 % and 11-19 % slower"
    # NOTES v32a: the select before, with prefetch, with 16 warps
    for key, want in {(1, 32768): [113.7, 118.2, 134.7], (128, 32768): [114.4, 118.8, 135.5],
                      (1, 131072): [123.5, 125.8, 137.4]}.items():
        r = rows[("randn", *key)]
        assert [round(r[f"{v}_graph_us"], 1) for v in ("shipped", "prefetch", "warps16")] == want, key
    r = rows[("randn", 1, 131072)]
    assert (round(r["shipped_graph_us"], 1), round(r["multi2048_graph_us"], 1)) == (123.5, 30.9)
    assert (round(r["multi4096_graph_us"], 1), round(r["multi8192_graph_us"], 1), round(r["torch_topk_graph_us"], 1)) \
        == (35.0, 49.8, 63.3)
    r = rows[("randn", 1, 32768)]
    assert [round(r[k], 1) for k in ("shipped_graph_us", "multi2048_graph_us", "multi4096_graph_us",
                                     "multi8192_graph_us", "torch_topk_graph_us")] == [113.7, 30.0, 35.0, 49.7, 54.5]
    r = rows[("randn", 1, 202752)]
    assert r["length"] == 131072
    assert [round(r[k], 1) for k in ("shipped_graph_us", "multi2048_graph_us", "torch_topk_graph_us")] == \
        [123.3, 31.0, 62.9]
    busy = rows[("randn", 128, 32768)]
    assert [round(busy[f"multi{c}_graph_us"], 1) for c in (2048, 4096, 8192)] == [170.3, 128.8, 120.1]
    assert round(busy["torch_topk_graph_us"], 1) == 111.6
    assert all(busy[f"multi{c}_graph_us"] > busy["shipped_graph_us"] for c in (2048, 4096, 8192))
    for (dist, T, n), r in rows.items():  # the first digit's spread: randn ~20 bins, spread all 256
        other = rows[("spread" if dist == "randn" else "randn", T, n)]
        assert abs(r["shipped_graph_us"] / other["shipped_graph_us"] - 1) < 0.005
    assert topk.multi_rule(1, 202752) and topk.multi_rule(1, 32768) and not topk.multi_rule(128, 32768)


def test_evidence_topk_multi_rows_sweep():
    """docs/kernels.md v32's table and `topk._multi_default`: the 1-128-row sweep on an H100 (3dc78ef, graph
    replay): every variant picks what the select before picks; the quoted rows; and where `multi_rule` takes the
    split over programs, multi at `multi_chunk`'s chunk is faster than the select before it in this run, while at
    the shapes it leaves (128 x 32K, 128 x 202752 at 32K) the select before is faster than every chunk."""
    from glm5lib.kernels import topk

    res = load("sweeps/topk_rows_h100_3dc78ef.json")
    assert res["meta"]["device"].startswith("NVIDIA H100") and res["meta"]["sweep"]
    rows = {(r["T"], r["n"], r["length"]): r for r in res["rows"]}
    assert len(rows) == 24 and not any("error" in r for r in rows.values())
    for (T, n, L), r in rows.items():
        assert all(v for k, v in r.items() if "equals" in k), r
        multis = [r[f"multi{c}_graph_us"] for c in (1024, 2048, 4096, 8192)]
        if _rule_before_round30(T, n):  # the bounds this run was judged by (refitted in round 30)
            assert r[f"multi{topk.multi_chunk(T, n)}_graph_us"] < r["shipped_graph_us"], (T, n, L)
        elif T == 128 and L == 32768:
            assert min(multis) > r["shipped_graph_us"], (T, n, L)
    quote = {(1, 32768, 32768): (113.7, [26.7, 30.3, 34.8, 49.7], 54.6),  # docs v32's table, topk.py's comment
             (1, 202752, 131072): (124.0, [27.8, 30.7, 35.1, 49.9], 63.4),
             (4, 202752, 131072): (124.3, [48.4, 42.4, 36.6, 51.0], 69.9),
             (16, 131072, 131072): (125.5, [114.9, 93.3, 72.7, 72.6], 87.7),
             (16, 202752, 32768): (84.3, [90.6, 63.7, 55.0, 52.4], 62.5),
             (32, 202752, 131072): (162.6, [250.6, 188.2, 140.4, 140.8], 106.4),
             (64, 32768, 32768): (114.3, [116.2, 92.8, 72.9, 73.4], 82.9),
             (64, 131072, 131072): (263.8, [408.7, 324.3, 243.7, 221.2], 176.3),
             (128, 32768, 32768): (114.4, [214.1, 171.0, 129.3, 119.7], 113.4),
             (128, 202752, 32768): (125.2, [629.8, 400.6, 257.6, 187.2], 112.2)}
    for key, (before, multis, torch_us) in quote.items():
        r = rows[key]
        assert round(r["shipped_graph_us"], 1) == before and round(r["torch_topk_graph_us"], 1) == torch_us, key
        assert [round(r[f"multi{c}_graph_us"], 1) for c in (1024, 2048, 4096, 8192)] == multis, key
    r = rows[(1, 32768, 32768)]
    assert round(r["rule_eager_us"]) == 218 and round(r["shipped_eager_us"]) == 114  # eager: the launches' cost
    # left to the select at 64 x 202752, where multi was 6 % and 12 % faster; torch.topk faster than both from 32
    # rows of 128K keys on
    for L, pct in ((32768, 6), (131072, 12)):
        r = rows[(64, 202752, L)]
        best = min(r[f"multi{c}_graph_us"] for c in (1024, 2048, 4096, 8192))
        assert not topk.multi_rule(64, 202752) and round(100 * (1 - best / r["shipped_graph_us"])) == pct
    for (T, n, L), r in rows.items():
        if T >= 32 and L == 131072:
            assert r["torch_topk_graph_us"] < min(r[f"{v}_graph_us"] for v in
                                                  ("shipped", "multi1024", "multi2048", "multi4096", "multi8192"))


def _rule_before_round30(T: int, n: int) -> bool:
    """`topk.multi_rule` with the bounds rounds 27-29 ran (2^21 scores for rows up to 32K, 2^23 past them)."""
    return n >= 32768 and T * n <= (1 << 21 if n <= 32768 else 1 << 23)


def _sparse_rows(name: str, device: str, commit: str) -> dict:
    res = load(f"sweeps/{name}")
    assert res["meta"]["device"].startswith(device) and res["meta"]["commit"].startswith(commit)
    rows = {(r["dist"], r["T"], r["n"], r["length"]): r for r in res["rows"]}
    assert len(rows) == 32 and not any("error" in r for r in rows.values())
    for key, r in rows.items():  # every variant's picks equal the select before; the rule's replay too
        assert all(v for k, v in r.items() if "equals" in k), key
        assert r.get("set_equals_torch_topk", True) and (key[0] == "ties") == ("set_equals_torch_topk" not in r)
    return rows


def test_evidence_round28_sparse_counts():
    """NOTES round 28 v33a (H100, d1ca47b) and v33b (H200, 464d769): atomics where few keys match took 10 % off the
    one-program select at 32K keys over `randn` scores, 20 % over `spread`, 8 % over `ties`, 1 % over `narrow`
    (128K rows: 12-14, 21-23, 1-8, 2 %), and
    10-19 % (H100) / 7-14 % (H200) off the multi select at 16-64 rows over `randn` and `spread`; the multi select's
    ties case at one decode row lost at d1ca47b (27.9 -> 37.8 us) and not with one add for a block of one digit
    (464d769); the list taken at a fixed pass lost at `narrow` and `ties` (it did not fit and its prefix sums ran
    anyway); memcheck clean."""
    g = "_graph_us"
    rows = _sparse_rows("topk_sparse_h100_d1ca47b.json", "NVIDIA H100", "d1ca47b")
    for (dist, T, n, L), r in rows.items():
        gain = 1 - r["select_sparse8" + g] / r["select_sparse0" + g]
        lo, hi = {"randn": (10, 10), "spread": (20, 20), "ties": (8, 8), "narrow": (1, 1)}[dist] if n == 32768 else \
            {"randn": (12, 14), "spread": (21, 23), "ties": (1, 8), "narrow": (2, 2)}[dist]  # the 128K split rows
        assert lo <= round(100 * gain) <= hi, (dist, T, n, gain)
    assert [round(rows[("randn", T, 32768, 32768)]["select_sparse" + s + g], 1) for T, s in
            ((1, "0"), (1, "8"), (1, "1"), (128, "0"), (128, "8"))] == [114.1, 102.5, 94.6, 114.5, 103.0]
    assert [round(rows[("spread", T, 32768, 32768)]["select_sparse" + s + g], 1) for T, s in
            ((1, "0"), (1, "8"), (64, "0"), (128, "8"))] == [113.7, 91.1, 114.1, 91.5]
    rule = ("rule_sparse0", "rule_sparse8", "rule_sparse1")
    assert [round(rows[("ties", 1, 202752, 131072)][v + g], 1) for v in rule] == [27.9, 37.8, 54.4]
    assert [round(rows[("randn", 64, 131072, 131072)][v + g], 1) for v in rule[:2]] == [223.5, 180.9]
    from glm5lib.kernels import topk

    for name, ranges in (("topk_sparse_h100_d1ca47b.json", ((10, 19), (3, 11))),
                         ("topk_sparse_h200_464d769.json", ((7, 14), (2, 14)))):
        for (dist, T, n, L), r in _sparse_rows(name, "NVIDIA", name.split("_")[-1][:7]).items():
            if 16 <= T <= 64 and r["rule_multi_in_graph"]:  # the rule's multi select at 16-64 rows (then)
                lo, hi = ranges[dist in ("narrow", "ties")]
                assert lo <= round(100 * (1 - r["rule_sparse8" + g] / r["rule_sparse0" + g])) <= hi, (name, dist, T, n)
    rows = _sparse_rows("topk_sparse_h200_464d769.json", "NVIDIA H200", "464d769")
    for (dist, T, n, L), r in rows.items():  # the H200 alike
        gain = round(100 * (1 - r["select_sparse8" + g] / r["select_sparse0" + g]))
        lo, hi = {"randn": (10, 11), "spread": (20, 20), "ties": (8, 9), "narrow": (1, 1)}[dist] if n == 32768 else \
            {"randn": (12, 15), "spread": (21, 24), "ties": (2, 7), "narrow": (2, 2)}[dist]
        assert lo <= gain <= hi, (dist, T, n, gain)
    # docs/kernels.md v33's H200 rows: before / atomics / the list at pass 1 and 2 / torch.topk, 1 and 128 rows
    table = {"randn": (113.5, 114.3, 101.4, 102.2, 97.6, 94.5, 98.1, 95.1, 52.9, 109.7),
             "spread": (113.5, 114.3, 90.7, 91.4, 70.1, 82.2, 70.6, 82.7, 52.2, 107.8),
             "narrow": (113.3, 114.1, 111.9, 112.6, 145.0, 143.7, 145.3, 143.6, 52.5, 112.1)}
    for dist, want in table.items():
        a, b = rows[(dist, 1, 32768, 32768)], rows[(dist, 128, 32768, 32768)]
        got = [a["select_sparse0" + g], b["select_sparse0" + g], a["select_sparse8" + g], b["select_sparse8" + g],
               a["select_sparse8_list1" + g], a["select_sparse8_list2" + g], b["select_sparse8_list1" + g],
               b["select_sparse8_list2" + g], a["torch_topk" + g], b["torch_topk" + g]]
        assert tuple(round(v, 1) for v in got) == want, dist
    a, b = rows[("ties", 16, 32768, 32768)], rows[("ties", 128, 32768, 32768)]
    assert [round(r[v + g], 1) for v in ("select_sparse0", "select_sparse8", "select_sparse8_list1",
                                         "select_sparse8_list2", "torch_topk") for r in (a, b)] == \
        [113.8, 114.4, 104.1, 104.7, 118.2, 115.7, 132.4, 133.8, 61.2, 113.9]
    # docs/kernels.md Next steps 3: the split over programs on the H200, and torch.topk ahead at 64 x 128K
    assert [round(rows[("randn",) + key]["rule_sparse0" + g], 1) for key in
            ((1, 202752, 131072), (16, 131072, 131072), (64, 32768, 32768))] == [27.6, 73.6, 73.6]
    r = rows[("randn", 64, 131072, 131072)]
    assert [round(r[v + g]) for v in ("torch_topk", "rule_sparse8", "select_sparse8")] == [150, 192, 226]
    r = rows[("ties", 1, 202752, 131072)]
    assert r["rule_sparse8" + g] < r["rule_sparse0" + g] < r["rule_sparse1" + g]  # one add a block of one digit
    for T in (1, 16, 64, 128):
        assert rows[("narrow", T, 32768, 32768)]["select_sparse8_list2" + g] > 1.25 * rows[("narrow", T, 32768, 32768)][
            "select_sparse8" + g]
        r = rows[("spread", T, 32768, 32768)]
        assert r["select_sparse8_list1" + g] < r["select_sparse8_list2" + g] < r["select_sparse8" + g]
    for name in ("memcheck_topk_h100_d1ca47b.log", "memcheck_topk_h200_464d769.log"):
        log = (BENCH / "sweeps" / name).read_text()
        assert "ERROR SUMMARY: 0 errors" in log and re.search(r"equal to sparse=0: (\d+) of \1", log)


def test_evidence_round29_round28_options_timed_and_scan_rows():
    """NOTES round 29: v33c's options timed at 2b0a066 (H100): the list gained only over `spread`, lost over `narrow`
    and `ties`, the one-block tie ranking lost 23-26 % on 64 x 128K rows; v34 at ffdad9d (H100): the write's scan
    over rows of 16 keys 1.5-4.9 % faster at every one-program / split shape, `sparse=4` with it 1.5-11.3 % (narrow
    32K rows 101.1-102.5 us), `sparse=2` slower at 128 rows; the rule's multi select a little slower at one row and
    faster at 16-64; memcheck clean at both."""
    g = "_graph_us"

    def span(rows, dist, v, n=32768):
        xs = [r[v + g] for (d, T, nn, L), r in rows.items() if d == dist and nn == n]
        return round(min(xs), 1), round(max(xs), 1)

    rows = _sparse_rows("topk_sparse_h100_2b0a066.json", "NVIDIA H100", "2b0a066")
    table = {"randn": ((100.5, 101.0), (101.8, 102.2), (101.4, 101.6)),
             "spread": ((89.8, 90.2), (72.9, 73.1), (72.0, 72.3)),
             "narrow": ((110.9, 111.3), (132.4, 132.9), (132.3, 132.6)),
             "ties": ((103.0, 103.3), (107.1, 123.6), (107.3, 122.9))}
    for dist, want in table.items():
        assert tuple(span(rows, dist, v) for v in ("select_shipped", "select_listed", "select_listed_unranked")) == \
            want, dist
    assert span(rows, "randn", "select_unranked") == (100.8, 101.3)
    r = rows[("randn", 1, 202752, 131072)]
    assert (round(r["select_shipped" + g], 1), round(r["select_unranked" + g], 1)) == (109.0, 106.4)
    for dist, want in (("randn", (230.0, 285.2)), ("spread", (203.7, 256.3))):
        r = rows[(dist, 64, 131072, 131072)]
        assert (round(r["select_shipped" + g], 1), round(r["select_unranked" + g], 1)) == want
    r = rows[("randn", 64, 202752, 131072)]
    assert (round(r["rule_shipped" + g], 1), round(r["rule_unranked" + g], 1)) == (229.7, 282.7)
    assert round(rows[("randn", 1, 32768, 32768)]["select_sparse1_listed_unranked" + g], 1) == 89.3
    assert span(rows, "narrow", "select_sparse1_listed_unranked")[1] > 1.25 * span(rows, "narrow", "select_shipped")[1]

    rows = _sparse_rows("topk_sparse_h100_ffdad9d.json", "NVIDIA H100", "ffdad9d")
    gains = [100 * (1 - r["select_rows16" + g] / r["select_shipped" + g]) for r in rows.values()]
    assert round(min(gains), 1) == 1.5 and round(max(gains), 1) == 4.9
    both = [100 * (1 - r["select_sparse4_rows16" + g] / r["select_shipped" + g]) for r in rows.values()]
    assert round(min(both), 1) == 1.5 and round(max(both), 1) == 11.3
    assert span(rows, "randn", "select_shipped") == (101.7, 102.4) and span(rows, "randn", "select_rows16") == \
        (99.5, 100.2)
    assert span(rows, "narrow", "select_rows16") == (110.6, 111.1)
    assert span(rows, "narrow", "select_sparse4_rows16") == (101.1, 102.5)
    r = rows[("narrow", 64, 131072, 131072)]
    assert (round(r["select_rows16" + g], 1), round(r["select_sparse4_rows16" + g], 1)) == (248.1, 228.0)
    r = rows[("spread", 64, 131072, 131072)]
    assert (round(r["select_shipped" + g], 1), round(r["select_rows16" + g], 1)) == (201.6, 191.8)
    # sparse=2: faster at one row, slower than shipped at 128 rows
    a, b = rows[("randn", 1, 32768, 32768)], rows[("randn", 128, 32768, 32768)]
    assert round(a["select_sparse2_rows16" + g], 1) == 92.2 and round(b["select_sparse2_rows16" + g], 1) == 103.2
    assert b["select_sparse2_rows16" + g] > b["select_shipped" + g]
    assert round(rows[("ties", 128, 32768, 32768)]["select_sparse2_rows16" + g], 1) == 108.8
    # the rule's multi select: at one row 0.1-0.5 us slower at 7 of 8 shapes (-2.1 to +1.3 %), at 16-64 rows 2-5 %
    # faster but for 16 x 32K standard normal and spread (level)
    one_row, more = [], []
    for (dist, T, n, L), r in rows.items():
        if r["rule_multi_in_graph"]:  # where the rule of this run took the multi select (refitted in round 30)
            gain = round(100 * (1 - r["rule_sparse4_rows16" + g] / r["rule_shipped" + g]), 1)
            (one_row if T == 1 else more).append(gain)
            if T == 16 and n == 32768 and dist in ("randn", "spread"):
                assert -0.2 <= gain < 0, (dist, gain)
            elif T > 1:
                assert 2.2 <= gain <= 5.2, (dist, T, n, gain)
    assert len(one_row) == 8 and min(one_row) == -2.1 and max(one_row) == 1.3
    assert sum(v < 0 for v in one_row) == 7 and len(more) == 16
    for name in ("memcheck_topk_h100_2b0a066.log", "memcheck_topk_h100_ffdad9d.log"):
        log = (BENCH / "sweeps" / name).read_text()
        assert "ERROR SUMMARY: 0 errors" in log and "equal to sparse=0: 36 of 36" in log
    text = (BENCH / "sweeps" / "topk_sass_v34_triton36.txt").read_text()
    totals = dict(re.findall(r"^(.*?): (\d+) instructions", text, re.M))
    assert [int(totals[f"topk_select[B4096-w8-d8:len] SPARSE={s} ROWS={r}"]) for s, r in ((8, 0), (8, 16))] == \
        [7858, 7345]


def test_evidence_round29_wave_config():
    """NOTES round 29 v35 and its profile (H100): the select latency-bound (ncu at 756fb32: issue slots 34 % busy at
    128 rows, 2 warps a scheduler, 0.53 eligible, memory 9 % of peak); 8192-key blocks on 16 warps 8 % faster where
    programs fit one wave, 20 % slower at 64 x 128K (configs run); the shipped rule (dbd95f9) 2.0-11.6 % faster than
    v34 at every one-program / split shape; memcheck 42/42 clean."""
    g = "_graph_us"
    text = (BENCH / "sweeps" / "ncu_topk_128_32768_h100_756fb32.txt").read_text()

    def metric(name):
        return float(re.search(rf"{re.escape(name)}\s+\S+\s+([\d.,]+)", text).group(1).replace(",", ""))

    assert metric("Issue Slots Busy") == 34.11 and metric("Active Warps Per Scheduler") == 2.0
    assert metric("Eligible Warps Per Scheduler") == 0.53 and metric("Max Bandwidth") == 9.25
    assert metric("Executed Instructions") == 37699286
    top = (BENCH / "sweeps" / "ncu_topk_sass_top_128_32768_h100_756fb32.txt").read_text()
    assert "per opcode: LOP3 26.5 %, IMAD 13.1 %, ISETP 9.1 %, VOTE 6.7 %, POPC 6.4 %" in top
    d = load("sweeps/topk_configs_h100_756fb32.json")
    assert d["meta"]["commit"].startswith("756fb32") and "H100" in d["meta"]["device"]
    rows = {(r["dist"], r["T"], r["n"]): r for r in d["rows"]}
    assert all(v for r in rows.values() for k, v in r.items() if k.endswith("equals_shipped"))
    got = [round(rows[("randn",) + key][v + g], 1) for key in ((1, 32768), (128, 32768), (1, 202752), (64, 131072))
           for v in ("shipped", "b8192_w16")]
    assert got == [99.5, 91.7, 100.1, 92.5, 100.4, 91.4, 213.7, 255.4]
    assert [round(rows[("randn", T, 32768)]["b16384_w16" + g], 1) for T in (1, 128)] == [87.1, 92.6]
    assert round(rows[("randn", 1, 32768)]["b4096_w16" + g], 1) == 104.2
    rows = _sparse_rows("topk_sparse_h100_dbd95f9.json", "NVIDIA H100", "dbd95f9")
    gains = [100 * (1 - r["select_shipped" + g] / r["select_v34" + g]) for r in rows.values()]
    assert round(min(gains), 1) == 2.0 and round(max(gains), 1) == 11.6
    for dist, want in (("randn", (99.5, 100.0, 91.7, 92.5)), ("narrow", (100.9, 102.4, 93.7, 98.7)),
                       ("spread", (88.8, 89.5, 78.6, 79.5)), ("ties", (102.1, 102.6, 93.2, 94.9))):
        xs = [r for (d_, T, n, L), r in rows.items() if d_ == dist and n == 32768]
        assert tuple(round(f(r[v + g] for r in xs), 1) for v in ("select_v34", "select_shipped") for f in (min, max)) \
            == (want[0], want[1], want[2], want[3]), dist
    r = rows[("randn", 128, 32768, 32768)]
    assert (round(r["select_shipped" + g], 1), round(r["torch_topk" + g], 1)) == (92.5, 110.9)
    r = rows[("randn", 64, 131072, 131072)]
    assert [round(r[v + g], 1) for v in ("select_before", "select_v34", "select_shipped", "torch_topk")] == \
        [262.6, 214.1, 207.9, 160.2]
    assert [round(rows[("randn", 1, 202752, 131072)][v + g], 1) for v in ("select_v34", "select_shipped")] == \
        [100.4, 91.4]
    log = (BENCH / "sweeps" / "memcheck_topk_h100_dbd95f9.log").read_text()
    assert "ERROR SUMMARY: 0 errors" in log and "equal to sparse=0: 42 of 42" in log


def test_evidence_round29_packed_write_and_warp_adds():
    """NOTES round 29 v36-v39 (H100): the packed write 0.4-2.1 % faster than v35 in one process (19717c6), its loop
    profile (the two histogram passes half the stall samples); the warp-aggregated adds in every pass (01285c0) much
    faster over concentrated scores and slower over spread ones at 128 rows, and in the multi select at one row;
    all four ways of counting in one run (41bf977), the shipped one (3) nowhere slower than v36 but by 0.8 us; memcheck
    clean in every run."""
    g = "_graph_us"

    def span(rows, dist, v, n=32768):
        xs = [r[v + g] for (d, T, nn, L), r in rows.items() if d == dist and nn == n]
        return round(min(xs), 1), round(max(xs), 1)

    rows = _sparse_rows("topk_sparse_h100_19717c6.json", "NVIDIA H100", "19717c6")
    gains = [100 * (1 - r["select_shipped" + g] / r["select_ab" + g]) for r in rows.values()]
    assert round(min(gains), 1) == 0.4 and round(max(gains), 1) == 2.1
    assert span(rows, "randn", "select_ab") == (91.7, 92.6) and span(rows, "randn", "select_shipped") == (90.8, 91.8)
    top = (BENCH / "sweeps" / "ncu_topk_sass_top_128_32768_h100_19717c6.txt").read_text()
    loops = re.findall(r"^loop \S+: \d+ instructions, ([\d.]+) % of stall samples, (\d+) warp", top, re.M)
    assert [float(p) for p, _ in loops][:5] == [25.7, 26.0, 11.6, 12.1, 19.1]
    assert [round(int(n) / 1e5) / 10 for _, n in loops][:5] == [10.6, 10.5, 4.6, 4.6, 7.5]

    rows = _sparse_rows("topk_sparse_h100_01285c0.json", "NVIDIA H100", "01285c0")
    assert span(rows, "randn", "select_shipped") == (90.9, 91.5) and span(rows, "randn", "select_agg") == (58.7, 74.9)
    assert span(rows, "narrow", "select_agg") == (57.2, 62.9) and span(rows, "ties", "select_agg") == (56.1, 68.4)
    r = rows[("spread", 128, 32768, 32768)]
    assert (round(r["select_shipped" + g], 1), round(r["select_agg" + g], 1)) == (78.2, 101.2)
    for dist, want in (("spread", (26.4, 53.3)), ("ties", (26.5, 41.9))):  # the multi select at one decode row
        r = rows[(dist, 1, 202752, 131072)]
        assert (round(r["rule_shipped" + g], 1), round(r["rule_agg" + g], 1)) == want
    top = (BENCH / "sweeps" / "ncu_topk_sass_top_128_32768_agg_h100_01285c0.txt").read_text()
    loops = re.findall(r"^loop \S+: \d+ instructions, ([\d.]+) % of stall samples", top, re.M)
    assert [float(p) for p in loops][:5] == [14.8, 26.9, 10.6, 10.5, 25.5]
    durations = [float(re.search(r"Duration\s+us\s+([\d.]+)", (BENCH / "sweeps" / f).read_text()).group(1)) for f in
                 ("ncu_topk_128_32768_agg_h100_01285c0.txt", "ncu_topk_128_32768_h100_19717c6.txt")]
    assert durations == [88.96, 118.66]  # the kernel under ncu, v37 against v36

    rows = _sparse_rows("topk_sparse_h100_26d7a30.json", "NVIDIA H100", "26d7a30")
    assert span(rows, "spread", "select_agg2") == (64.7, 65.5) and span(rows, "randn", "select_agg2") == (71.8, 86.2)

    rows = _sparse_rows("topk_sparse_h100_41bf977.json", "NVIDIA H100", "41bf977")
    table = {"randn": ((91.0, 91.8), (58.7, 74.6), (71.9, 85.4), (64.2, 79.1)),
             "narrow": ((92.8, 97.6), (57.2, 63.4), (73.3, 79.4), (62.0, 68.0)),
             "ties": ((92.5, 94.3), (56.3, 67.5), (70.8, 74.2), (62.0, 69.8)),
             "spread": ((77.7, 78.5), (75.4, 101.4), (64.9, 65.7), (70.8, 76.5))}
    for dist, want in table.items():
        assert tuple(span(rows, dist, v) for v in ("select_v36", "select_agg1", "select_agg2", "select_shipped")) == \
            want, dist
    slower = [(k, r["select_shipped" + g] - r["select_v36" + g]) for k, r in rows.items()
              if r["select_shipped" + g] > r["select_v36" + g]]
    assert len(slower) == 1 and slower[0][0] == ("spread", 16, 131072, 131072) and round(slower[0][1], 1) == 0.8
    gains = [100 * (1 - r["select_shipped" + g] / r["select_v36" + g]) for r in rows.values()]
    assert round(max(gains)) == 38
    extra = [r["select_shipped" + g] - r["select_agg1" + g] for (d, T, n, L), r in rows.items() if d != "spread"]
    assert (round(min(extra), 1), round(max(extra), 1)) == (2.3, 7.5)
    r = rows[("randn", 64, 131072, 131072)]
    assert [round(r[v + g], 1) for v in ("select_shipped", "rule_shipped", "torch_topk")] == [166.4, 188.4, 159.5]
    # the static counts (Triton 3.6, sm_90, the wave config): each loop by way of counting digits
    text = (BENCH / "sweeps" / "topk_sass_v39_triton36.txt").read_text()
    builds = {}
    for part in re.split(r"^(?=topk_select\[B8192)", text, flags=re.M)[1:]:
        head, *body = part.strip().splitlines()
        loops = [re.match(r"\s+loop: (\d+) instructions; BAR (\d+), MATCH (\d+)", ln) for ln in body
                 if ln.lstrip().startswith("loop:")]
        builds[head.split(": ")[0]] = (int(re.search(r": (\d+) instructions", head).group(1)),
                                       [tuple(int(v) for v in m.groups()) for m in loops])
    agg0, agg1, agg3 = (builds[f"topk_select[B8192-w16-d8:len] AGG={a}"] for a in (0, 1, 3))
    assert (agg0[0], agg1[0]) == (7703, 3354)
    assert [n for n, _, _ in agg0[1][:5]] == [1299, 1519, 1515, 1499, 917] and agg0[1][4][1] == 15
    assert [n for n, _, _ in agg1[1][:4]] == [394, 426, 426, 426] and all(b == 0 and m == 16 for _, b, m in agg1[1][:4])
    assert agg3[1][0][0] == 1764
    for name in ("19717c6", "01285c0", "26d7a30", "41bf977"):
        log = (BENCH / "sweeps" / f"memcheck_topk_h100_{name}.log").read_text()
        assert "ERROR SUMMARY: 0 errors" in log and re.search(r"equal to sparse=0: (\d+) of \1", log)


def test_evidence_round30_ptx_stores_and_rule_bounds():
    """NOTES round 30 / docs v40, against their H100 files: the PTX stores 5.7-8.9 % faster than v39 (timed beside
    it) at every one-program / split shape with the same picks and a clean memcheck; the rule sweep's boundary
    shapes (the multi select ahead at 32 rows of 32K and 16 of 202752, behind at 32 rows of 128K and 64 of 131072),
    the refitted bounds taking the faster side there, and their choice within 1.20x of the fastest variant over the
    sweep where round 29's bounds were 1.46x off."""
    import math

    from glm5lib.kernels import topk

    sparse = json.loads((BENCH / "sweeps" / "topk_sparse_h100_139ee79.json").read_text())
    assert sparse["meta"]["device"].startswith("NVIDIA H100") and sparse["meta"]["ab_module"].endswith("topk_v39.py")
    g = "_graph_us"
    gains = []
    for r in sparse["rows"]:
        assert all(v for k, v in r.items() if k.endswith("_equals_shipped")) and r["rule_graph_replay_equals_shipped"]
        gains.append(100 * (1 - r["select_shipped" + g] / r["select_ab" + g]))
    assert len(gains) == 32 and (round(min(gains), 1), round(max(gains), 1)) == (5.7, 8.9)
    r32 = [r for r in sparse["rows"] if r["n"] == 32768 and r["dist"] == "randn"]
    assert [round(f(r["select_shipped" + g] for r in r32), 1) for f in (min, max)] == [60.0, 73.6]
    r = next(r for r in sparse["rows"] if (r["dist"], r["T"], r["n"]) == ("randn", 64, 131072))
    assert [round(r[v + g], 1) for v in ("select_ab", "select_shipped", "torch_topk")] == [166.8, 156.4, 160.7]
    for log in ("memcheck_topk_h100_139ee79.log", "memcheck_topk_h100_139ee79_b.log"):
        text = (BENCH / "sweeps" / log).read_text()
        assert "ERROR SUMMARY: 0 errors" in text and "equal to sparse=0: 90 of 90" in text

    sweep = json.loads((BENCH / "sweeps" / "topk_rule_h100_139ee79.json").read_text())
    rows = {(r["dist"], r["T"], r["n"]): r for r in sweep["rows"]}
    assert len(rows) == 48 and all(all(v for k, v in r.items() if k.endswith("_equals_shipped")) for r in rows.values())
    for dist in ("randn", "narrow"):  # the multi select (the rule then) against the one-program / 16K split select
        assert rows[(dist, 32, 32768)]["rule" + g] < rows[(dist, 32, 32768)]["shipped" + g]
        assert rows[(dist, 32, 131072)]["rule" + g] > rows[(dist, 32, 131072)]["shipped" + g]
        assert rows[(dist, 64, 131072)]["rule" + g] > 1.1 * rows[(dist, 64, 131072)]["shipped" + g]
    assert rows[("randn", 16, 202752)]["rule" + g] < rows[("randn", 16, 202752)]["shipped" + g]
    assert topk.multi_rule(32, 32768) and not topk.multi_rule(48, 32768)
    assert topk.multi_rule(16, 202752) and not topk.multi_rule(32, 131072) and not topk.multi_rule(64, 131072)
    variants = ("shipped", "rule", "split8192", "split16384", "split32768", "multi2048", "multi4096", "multi8192")

    def off(pick):  # the chosen path's time over the fastest variant's, per shape
        return [r[("rule" if pick(T, n) else "shipped") + g] / min(r[v + g] for v in variants)
                for (d, T, n), r in rows.items()]

    new = off(topk.multi_rule)
    old = off(lambda T, n: T * n <= (1 << 21 if n <= 32768 else 1 << 23))
    assert all(rows[k]["rule_multi_in_graph"] == (k[1] * k[2] <= (1 << 21 if k[2] <= 32768 else 1 << 23))
               for k in rows)  # the sweep ran round 29's bounds
    assert (round(max(new), 2), round(max(old), 2)) == (1.2, 1.46)
    assert round(math.exp(sum(map(math.log, new)) / 48), 2) == 1.03


def test_evidence_round30_quoted_ranges_and_chunks():
    """docs/kernels.md v40's table, README's round-30 sentence and the chunk sentences of docs v40, Next steps 3 and
    NOTES v40b, against the H100 files: each quoted range is the files' min-max; 32K-key chunks against 16K (faster
    at 64 rows of 128K-202752 and 32 rows of 131072, slower at 32 rows of 202752, 48 rows, 96 over `randn` and 1-16
    rows of 202752, graph replay and eager), 16K-key chunks against one program at 48-64 rows of 32K (faster in graph
    replay; eagerly slower over `randn`, faster over `narrow`), the columns timing one path within 5 % of each other,
    and torch.topk against the select at 48-128 rows of 202752 (Next steps 3)."""
    sparse = json.loads((BENCH / "sweeps" / "topk_sparse_h100_139ee79.json").read_text())["rows"]
    g = "_graph_us"

    def span(rows, key):
        vals = [r[key + g] for r in rows]
        return round(min(vals), 1), round(max(vals), 1)

    r32 = [r for r in sparse if r["n"] == 32768]
    groups = {"randn 32K": [r for r in r32 if r["dist"] == "randn"],
              "others 32K": [r for r in r32 if r["dist"] != "randn"],
              "one wide row": [r for r in sparse if r["T"] == 1 and r["n"] == 202752],
              "64 x 128K": [r for r in sparse if r["T"] == 64 and r["n"] == 131072]}
    quoted = {"randn 32K": ((64.2, 78.2), (60.0, 73.6), (54.6, 111.6)),
              "others 32K": ((62.0, 76.7), (57.6, 72.1), (54.5, 115.3)),
              "one wide row": ((68.7, 81.1), (62.7, 75.1), (63.3, 63.5)),
              "64 x 128K": ((155.1, 173.9), (143.3, 163.1), (158.1, 176.6))}
    for name, rows in groups.items():
        got = tuple(span(rows, k) for k in ("select_ab", "select_shipped", "torch_topk"))
        assert got == quoted[name], name
    assert span(groups["64 x 128K"], "rule_shipped") == (179.7, 195.2)  # README: the multi select's 180-195

    rows = {(r["dist"], r["T"], r["n"]): r for r in
            json.loads((BENCH / "sweeps" / "topk_rule_h100_139ee79.json").read_text())["rows"]}

    def chunk32(d, T, n, mode="graph"):  # 32K-key chunks' time over 16K-key chunks'
        r = rows[(d, T, n)]
        return r[f"split32768_{mode}_us"] / r[f"split16384_{mode}_us"]

    dists = ("randn", "narrow")
    gains = [1 - chunk32(d, 64, n) for d in dists for n in (131072, 202752)]
    assert 0.06 < min(gains) and max(gains) < 0.09
    assert all(0.02 < 1 - chunk32(d, 32, 131072) < 0.04 for d in dists)
    assert all(1.05 < chunk32(d, 32, 202752) < 1.08 for d in dists)
    assert all(1.01 < chunk32(d, 48, n) < 1.05 for d in dists for n in (131072, 202752))
    assert all(1.03 < chunk32("randn", 96, n) < 1.05 for n in (131072, 202752))
    losses = [chunk32(d, T, 202752) for d in dists for T in (1, 4, 16)]  # graph replay 13-26 %, eager slower too
    assert (round(min(losses) - 1, 2), round(max(losses) - 1, 2)) == (0.13, 0.26)
    assert all(chunk32(d, T, 202752, "eager") > 1.05 for d in dists for T in (1, 4, 16))
    for d in dists:  # 16K-key chunks against one program a row (`shipped` at 32K rows)
        for T in (48, 64):
            r = rows[(d, T, 32768)]
            assert 0.15 <= 1 - r["split16384" + g] / r["shipped" + g] < 0.165
            assert (r["split16384_eager_us"] > r["shipped_eager_us"]) == (d == "randn")  # eagerly: not settled
    same = [r[("split32768" if n == 32768 else "split16384") + g] / r["shipped" + g] for (d, T, n), r in rows.items()]
    assert max(abs(v - 1) for v in same) < 0.05
    # Next steps 3: torch.topk against the select at 48-64 rows of 202752 read to 128K
    torch_vs = {(d, T): (round(r["torch_topk" + g], 1), round(r["shipped" + g], 1))
                for (d, T, n), r in rows.items() if n == 202752 and T in (48, 64)}
    assert torch_vs[("randn", 48)] == (120.7, 144.8) and torch_vs[("narrow", 48)] == (122.6, 128.9)
    assert torch_vs[("randn", 64)] == (158.8, 165.5)
    wide64 = {r["dist"]: (round(r["torch_topk" + g], 1), round(r["select_shipped" + g], 1))
              for r in sparse if r["T"] == 64 and r["n"] == 202752}
    assert wide64["randn"] == (163.7, 166.8) and wide64["spread"] == (162.0, 166.9)
    assert all(r["torch_topk" + g] > r["shipped" + g] for (d, T, n), r in rows.items() if n == 202752 and T >= 96)


def test_evidence_round30_write_loop_counts():
    """NOTES round 30 (v40): the write loop of every shipped one-program / split / merge build (Triton 3.6, sm_90)
    before and after its picks were stored by PTX in the block's layout: fewer instructions, barriers and
    shared-memory reads in each, and a fraction of the shared memory."""
    def writes(name):
        text = (BENCH / "sweeps" / f"topk_sass_{name}_triton36.txt").read_text()
        return {m.group(1): tuple(int(v) for v in m.groups()[1:]) for m in re.finditer(
            r"^(topk_select\[\S+\]) write loop: (\d+) instructions; BAR (\d+), STG \d+, LDS (\d+), STS \d+, "
            r"SHFL \d+; shared memory (\d+) bytes", text, flags=re.M)}

    before, after = writes("v39"), writes("v40")
    assert sorted(before) == sorted(after) and len(after) == 6
    for build in after:
        assert all(a < b for a, b in zip(after[build], before[build])), build
    wave, split, merge = (f"topk_select[B8192-w16-d8:{t}]" for t in ("len", "split:len", "merge:len"))
    assert [before[wave][:3], after[wave][:3]] == [(930, 15, 20), (795, 9, 11)]
    assert [before[split][:3], after[split][:3]] == [(1434, 17, 75), (1216, 9, 23)]
    assert [before[merge][:2], after[merge][:2]] == [(987, 23), (938, 9)]
    assert (before[wave][3], after[wave][3]) == (32768, 2048)
    assert (before["topk_select[B4096-w8-d8:len]"][3], after["topk_select[B4096-w8-d8:len]"][3]) == (16384, 1024)


def test_evidence_round28_sass_counts():
    """docs/kernels.md v33 and Next steps 3: the static counts `scripts/topk_sass_count.py` wrote with Triton 3.6:
    the select with every pass on the histogram (576 VOTE, 514 POPC, 2000 LOP3 of 6792), the later passes' atomics
    adding REDG; the toy scan 841 instructions 1-D, 495 as 256 x 16 rows, 117 without."""
    text = (BENCH / "sweeps" / "topk_sass_triton36.txt").read_text()
    assert text.startswith("triton 3.6.0, sm_90")
    counts = {}
    for ln in text.splitlines()[1:]:
        name, rest = ln.split(": ", 1)
        total, ops = rest.split(" instructions; ")
        counts[name] = {"total": int(total), **{op: int(c) for op, c in (kv.split() for kv in ops.split(", "))}}
    hist = counts["topk_select[B4096-w8-d8:len] SPARSE=0"]
    assert (hist["total"], hist["VOTE"], hist["POPC"], hist["LOP3"], hist["REDG"]) == (6792, 576, 514, 2000, 0)
    assert counts["topk_select[B4096-w8-d8:len] SPARSE=8"]["REDG"] > 0
    assert [counts[f"toy 4096-key scan, {k}"]["total"] for k in ("1-D cumsum", "256 x 16 rows", "no scan")] == \
        [841, 495, 117]


def test_evidence_round28_key_warps_rule_on_the_h200():
    """NOTES round 28: the fp8-cache decode's key-warps rule (fitted to H100 runs) checked on the H200 (464d769):
    right at 16 of 20 batches (8 heads B8 and B96; 16 heads B96 and B128, by 4-9 %), no failed check; a third H100
    run (d1ca47b): 19 of 20, the miss 8 heads B8 as before."""
    from glm5lib.bench import batches

    for name, misses in (("fp8mma_batches_h200_464d769.json", [(8, 8), (8, 96), (16, 96), (16, 128)]),
                         ("fp8mma_batches_h100_d1ca47b.json", [(8, 8)])):
        run = batches.load_run(BENCH / "sweeps" / name)
        assert batches.failed_checks(run) == []
        verdicts = {k: batches.rule_verdict(r) for k, r in run["rows"].items()}
        judged = {k: v for k, v in verdicts.items() if v["ok"] is not None}
        assert len(judged) == 20 and sorted(k for k, v in judged.items() if not v["ok"]) == misses
        if "h200" in name:
            assert all(1.03 < v["pick_us"] / v["best_us"] < 1.09 for k, v in judged.items() if not v["ok"])


def test_evidence_round27_h100_pdl_late_and_batches():
    """NOTES round 27: round 26's owed re-run of `pdl_probe.py --fp8mma` on an H100 at eef246a, the 8-head B8
    case's fp8-cache launches now checked on a captured call (every kernel row matching fp32; the trigger after the
    loop 0.98-1.02x of plain, B8 16.7 -> 17.0 us); and the decode across batches, the key-warps rule right at 19 of
    20 batches (8 heads B8 the miss, as before), no failed check."""
    from glm5lib.bench import batches

    d = load("sweeps/pdl_late_h100_eef246a.json")
    assert d["meta"]["commit"].startswith("eef246a") and "H100" in d["meta"]["device"]
    assert len(d["rows"]) == 54 and all(r["ok"] for r in d["rows"])  # "54/54": 44 kernel, 6 FlashMLA, 4 mechanism
    kernel_rows = [r for r in d["rows"] if r.get("impl") in ("plain", "pdl", "pdl-late")]
    assert len(kernel_rows) == 44 and all(r["bit_equal"] for r in kernel_rows)
    late = {(s["format"], s["H"], s["T"]): s for s in d["meta"]["summary"] if "graph_ratio_late" in s}
    assert all(0.98 <= s["graph_ratio_late"] <= 1.02 for s in late.values()) and len(late) == 6
    assert [round(late["fp8_ds_mla", 8, 8]["graph_us"][k], 1) for k in ("plain", "pdl-late")] == [16.7, 17.0]
    run = batches.load_run(BENCH / "sweeps" / "fp8mma_batches_h100_eef246a.json")
    assert batches.failed_checks(run) == []
    verdicts = {k: batches.rule_verdict(r) for k, r in run["rows"].items()}
    judged = {k: v for k, v in verdicts.items() if v["ok"] is not None}
    assert len(judged) == 20 and [k for k, v in judged.items() if not v["ok"]] == [(8, 8)]


def test_evidence_fp8_prefill_config_is_the_sweeps_fastest():
    """mla.CONFIGS' fp8 prefill config at 8-16 heads is the fastest correct row of its sweep (NOTES.md v8d: 4.35 ->
    4.05 ms at H8), and the benchmark at 4bea5da ran it."""
    from glm5lib.kernels.mla import CONFIGS

    shipped = CONFIGS[("prefill-small", "fp8_ds_mla", "big")].name
    rows = load("sweeps/prefill_fp8_sweep_h200.json")["rows"]
    for H in (8, 16):
        sweep = [r for r in rows if r["kind"] == "prefill-sweep" and r["H"] == H]
        assert all(r["rel_err"] < 1e-2 for r in sweep)
        best = min(sweep, key=lambda r: r["us"])
        old = next(r for r in rows if r["kind"] == "prefill" and r["H"] == H)  # the config shipped before
        assert best["impl"] == f"triton:{shipped}" and best["us"] < 0.95 * old["us"]
    h8 = {r["impl"]: r["us"] for r in rows if r["H"] == 8}
    assert round(h8["triton"] / 1e3, 2) == 4.35 and round(h8[f"triton:{shipped}"] / 1e3, 2) == 4.05
    assert load("bench_h200.json")["meta"]["configs"]["prefill-small/fp8_ds_mla/big"] == shipped


def _gluon_times(res) -> dict:
    return {(r["kind"], r["kv_format"], r["H"], r["impl"]): r.get("ms") or r["us"] / 1e3
            for r in res["bench"] if "error" not in r}


def test_evidence_gluon_large_h200_checks_and_ratios():
    """`scripts/gluon_mla_large_device.py --variants` at 1b78144: the Gluon kernels for 64-128 heads beside the Triton
    kernel and FlashMLA in one process, the ping-pong producer in FlashMLA's order and token-major grid beside the
    shipped build (NOTES.md round 5, docs/kernels.md v10)."""
    from glm5lib.kernels import mla

    res = load("gluon_large_h200.json")
    meta = res["meta"]
    assert meta["device"] == "NVIDIA H200" and meta["flashmla"] == "loaded" and meta["commit"] == "1b78144"
    assert meta["checks"] == meta["checks_ok"] == len(res["checks"]) == 80 and all(r["ok"] for r in res["checks"])
    t = _gluon_times(res)
    pp, key_split = "gluon-wgmma:BN64-nbuf2-pingpong", "gluon-wgmma:BN64-nbuf2-async"
    assert mla.gluon_large_name("bf16") == "gluon-" + pp.split(":")[1]  # what sparse_mla dispatches
    # the fp8 kernel dispatched until round 21 (the dequantising-producer kernel since: test_evidence_round21_*)
    assert mla.gluon_large_name("fp8_ds_mla") == "gluon-BN64-nbuf2-dq" != "gluon-" + key_split.split(":")[1]

    def ratio(case, impl, over="flashmla"):
        return round(t[case + (over,)] / t[case + (impl,)], 2)

    # NOTES.md v10b: prefill bf16 0.88x / 0.86x FlashMLA, 1.87x / 1.98x the Triton kernel
    assert ratio(("prefill", "bf16", 64), pp) == 0.88 and ratio(("prefill", "bf16", 128), pp) == 0.86
    assert ratio(("prefill", "bf16", 64), pp, "triton") == 1.87
    assert ratio(("prefill", "bf16", 128), pp, "triton") == 1.98
    # the producer's order: every shipped timing beats both FlashMLA-order timings, at 64 and 128 heads
    for H in (64, 128):
        shipped = [t[("prefill", "bf16", H, k)] for k in (pp, "gluon-pingpong-0", "gluon-pingpong-1")]
        order0 = [t[("prefill", "bf16", H, f"gluon-pingpong-order0-{i}")] for i in (0, 1)]
        assert max(shipped) < min(order0), (H, shipped, order0)
    # fp8 decode B128 (the key-split kernel, unchanged): 0.60x / 0.67x FlashMLA
    assert ratio(("decode", "fp8_ds_mla", 64), key_split) == 0.60
    assert ratio(("decode", "fp8_ds_mla", 128), key_split) == 0.67


def test_evidence_gluon_large_v9_probes_h200():
    """Round 4's run (7e11d76, `--probe`): the stage probes that bound the ping-pong kernel (FlashMLA's producer
    order then): its producer alone and its consumers alone each take less than the kernel, the consumers alone less
    than FlashMLA's whole kernel; the key-split kernel's compute alone more."""
    res = load("sweeps/gluon_large_v9_h200.json")
    assert res["meta"]["commit"] == "7e11d76" and res["meta"]["checks_ok"] == 80
    t = _gluon_times(res)
    pp = "gluon-wgmma:BN64-nbuf2-pingpong"
    whole = t[("prefill", "bf16", 64, pp)]
    producer, consumers = (t[("prefill", "bf16", 64, f"gluon-pingpong-probe{i}")] for i in (1, 2))
    assert producer < consumers < t[("prefill", "bf16", 64, "flashmla")] < whole
    assert round(consumers, 2) == 2.12 and round(producer, 2) == 1.33
    assert t[("prefill", "bf16", 64, "gluon-wgmma-probe2")] > t[("prefill", "bf16", 64, "flashmla")]


def test_evidence_fp8_pingpong_and_indexer_sweeps_h200():
    """Round 5's measured-and-not-kept experiments (NOTES.md v10a, v10c): the fp8_ds_mla ping-pong producer (loads,
    conversion, stores by the producer warpgroup; 2d32f13) was no faster than the key-split kernel at decode and
    slower at prefill; no paged-indexer config or looping grid reaches 70 % of copy with fp8 q."""
    import re

    rows = [json.loads(ln) for ln in (BENCH / "sweeps/gluon_large_v10_h200.log").read_text().splitlines()
            if ln.startswith('{"kind"')]
    t = {(r["kind"], r["H"], r["impl"]): r.get("ms") or r["us"] / 1e3 for r in rows
         if r["kv_format"] == "fp8_ds_mla" and "error" not in r}
    key_split = t[("decode", 64, "gluon-wgmma:BN64-nbuf2-async")]
    pingpong = [v for (kind, H, impl), v in t.items() if kind == "decode" and H == 64 and
                re.match(r"gluon-(wgmma:BN64-nbuf2-pingpong|pingpong-early)", impl)]
    assert len(pingpong) == 5 and min(pingpong) > key_split
    assert t[("prefill", 64, "gluon-wgmma:BN64-nbuf2-pingpong")] > t[("prefill", 64, "gluon-wgmma:BN64-nbuf2-async")]
    ix = load("sweeps/indexer_sweep_v10_h200.json")
    q8 = [r for r in ix["rows"] if r["kind"] == "indexer-decode-sweep" and ":q8:" in r["impl"]]
    assert len(q8) == 11 and all(r["ok"] for r in q8) and max(r["pct_bw"] for r in q8) < 70


def test_evidence_indexer_layout_and_loop_sweeps_h200():
    """Round 6 (NOTES.md v11a, v11b): with fp8 q the paged indexer's dot with the keys as M beats heads as M in the
    same run (fdcdf23) and is what `paged_keys_m` picks; bf16 q with fp8 keys keeps heads as M. The looping grid at
    32 programs per SM (the shipped count) is faster than at 8 at B 128 for every format, the same scores."""
    from glm5lib.kernels import indexer as ix

    rows = load("sweeps/indexer_sweep_v10d_h200.json")["rows"]
    t = {r["impl"]: r["us"] for r in rows if r["kind"] == "indexer-decode-sweep" and r["kv_format"] == "fp8"}
    assert all(r["ok"] for r in rows if r["kind"] == "indexer-decode-sweep")
    assert t["triton:q8:N128-w4-s2-keysM"] < 0.92 * t["triton:q8:N128-w4-s2"]  # 179 us against 202
    assert t["triton:N128-w4-s2-keysM"] > t["triton:N128-w4-s2"]  # bf16 q: 313 against 283
    assert ix.paged_keys_m(torch.float8_e4m3fn) and not ix.paged_keys_m(torch.bfloat16)
    loop = load("sweeps/indexer_loop_sweep_h200.json")
    assert all(r["same_scores"] for r in loop["rows"] if r["launch"] != "one-tile")
    us = {(r["B"], r["format"], r["launch"]): r["us"] for r in loop["rows"]}
    for fmt in ("fp8", "fp8-q8", "bf16"):
        assert us[(128, fmt, "loop32")] < 0.9 * us[(128, fmt, "loop8")], fmt
        assert us[(32, fmt, "loop32")] < 1.03 * us[(32, fmt, "loop8")], fmt
    assert ix.PAGED_LOOP_PROGRAMS_PER_SM == 32 and loop["meta"]["shipped_programs_per_sm"] == 8  # measured before
    q8 = [r for r in load("checks_h200_full.json") if r["name"].startswith("indexer") and "-q8" in r["name"]]
    assert len(q8) == 3 and all(r["ok"] for r in q8)  # fp8-q cases, one on the looping grid


def test_evidence_gluon_sanitizer_runs_h200():
    """`device_kernels.sh racecheck` at c2a8f1e on the four sanitize cases that reach the Gluon kernels: synccheck
    clean; racecheck reports hazards only on the shared values the ping-pong warpgroups hand over through
    `_barrier()` + a one-thread mbarrier arrive (the running max sM0 / sM1, the final row sums) and on Triton's own
    warp-specialize captures, and ran out of its 200 s (NOTES.md round 4: not settled)."""
    sync = (BENCH / "synccheck_h200.log").read_text()
    assert "4/4 cases pass on cuda" in sync and "ERROR SUMMARY: 0 errors" in sync
    race = (BENCH / "racecheck_h200.log").read_text()
    import re

    lines = set(re.findall(r"mla_gluon_large\.py:(\d+)", race))
    assert lines and lines <= {"521", "533", "546", "554", "580", "584", "621", "690"}, lines


def test_evidence_fp8mma_h200_round8_correct_and_its_timing_claims():
    """Round 8's e4m3 build of the fp8-cache kernel (`mla_gluon_fp8mma` at 73d2a37, then dispatched on sm_90 for 1-8
    heads over fp8_ds_mla): every check case agrees with fp32 as closely as the Triton kernel does (relative error,
    cosine; the log-sum-exp within the tolerance, or, on the cases with logits in the thousands where the Triton
    kernel misses the absolute lse tolerance too, within 2x of its error), and the NOTES numbers follow from it."""
    res = load("sweeps/fp8mma_h200_73d2a37.json")
    assert res["meta"]["device"] == "NVIDIA H200" and res["meta"]["commit"] and res["meta"]["flashmla"] is None
    checks = [r for r in res["rows"] if "case" in r]
    tri = {r["case"]: r for r in checks if r["kernel"] == "triton"}
    ours = [r for r in checks if r["kernel"] == "fp8mma"]
    assert len(ours) >= 40 and len({r["config"] for r in ours}) == 2 and not [r for r in ours if "error" in r]
    for r in ours:
        t = tri[r["case"]]
        assert r["rel"] <= 1.1 * t["rel"] + 1e-4 and r["cos_diff"] < 1e-4 and r["no_key_rows_ok"], r
        assert r["ok"] or (not t["ok"] and r["lse_abs"] <= 2 * t["lse_abs"]), r
    assert max(r["rel"] for r in ours) < 2e-3
    timing = {(r["kind"], r.get("B", r.get("T")), r["H"]): r for r in res["rows"] if "kind" in r}
    name = "fp8mma-nbuf2-q2-p2_us"
    d32, d128, pre = timing[("decode", 32, 8)], timing[("decode", 128, 8)], timing[("prefill", 4096, 8)]
    # NOTES round 8 / README: at 8 heads 0.88x / 0.74x the Triton kernel's decode time (B32 / B128), 0.60x at
    # prefill; against FlashMLA padded to 64 heads 1.18x / 1.04x faster at decode, 0.79x its bf16 prefill
    assert round(d32[name] / d32["triton_us"], 2) == 0.88 and round(d128[name] / d128["triton_us"], 2) == 0.74
    assert round(pre[name] / pre["triton_us"], 2) == 0.60
    assert round(d32["flashmla_us"] / d32[name], 2) == 1.18 and round(d128["flashmla_us"] / d128[name], 2) == 1.04
    assert round(pre["flashmla_bf16_us"] / pre[name], 2) == 0.79
    # the 99 KB class's one-slot build with that class's split plan beats that class's Triton config on the H200
    for r in (d32, d128):
        assert r["small_class_fp8mma-nbuf1-q2-p2_us"] < r["small_class_triton_us"]
    # at 16 heads (two head groups) it is no faster than the Triton kernel: not dispatched there
    assert timing[("prefill", 4096, 16)][name] > 0.9 * timing[("prefill", 4096, 16)]["triton_us"]


def test_evidence_fp8mma_unit_and_small_batch_h200():
    """NOTES round 8: Triton 3.6's own e4m3 conversion chains returned wrong values for about half of a row on the
    H200 while the kernel's split matched torch's exactly; below 32 tokens the kernel is no faster than the Triton
    kernel (`mla.FP8MMA_MIN_T`) and an eager call costs more host time."""
    import re

    log = (BENCH / "sweeps" / "fp8mma_unit_h200.log").read_text()
    assert log.startswith("commit ")
    terms = {int(v): [int(x) for x in c.split(",")] for v, c in re.findall(r"terms variant (\d): \[([\d, ]+)\]", log)}
    assert set(terms) == set(range(8)) and terms[0] == [0, 0, 0] and terms[7] == [0, 0, 0]
    assert all(terms[v][0] == 0 and terms[v][1] > 1000 for v in (1, 3, 5, 6))  # first term right, the rest not
    assert re.findall(r"mma fp8 \(B from \w+\): max rel err ([\d.e-]+)", log) and all(
        float(e) < 1e-6 for e in re.findall(r"mma fp8 \(B from \w+\): max rel err ([\d.e-]+)", log))
    res = json.loads((BENCH / "sweeps" / "fp8mma_small_batch_h200.json").read_text())
    assert res["meta"]["device"] == "NVIDIA H200" and res["meta"]["commit"]
    rows = {r["B"]: r for r in res["rows"]}
    assert sorted(rows) == [1, 4, 16]
    assert [round(rows[B]["fp8mma_graph_us"] / rows[B]["triton_graph_us"], 2) for B in (1, 4, 16)] == [1.16, 1.07,
                                                                                                           1.04]
    assert all(60 < r["fp8mma_eager_host_us"] < 90 and 25 < r["triton_eager_host_us"] < 45 for r in rows.values())


def test_evidence_fp8mma_two_q_terms_hold_bf16_q_and_the_vllm_call_path_runs_it():
    """NOTES round 8: two and three e4m3 terms of q gave the same errors to six digits in every check case (bf16 q has
    8 significant bits); the vLLM call path with the kernel dispatched passed 22/22, its T64 H8 fp8 case faster on
    the GPU and slower eagerly than the committed run of the Triton kernel."""
    res = json.loads((BENCH / "sweeps" / "fp8mma_q2_q3_f7f4057.json").read_text())
    by: dict = {}
    for r in res["rows"]:
        if r.get("kernel") == "fp8mma":
            by.setdefault(r["case"], {})[r["config"]] = r["rel"]
    assert len(by) >= 20 and all(round(v["fp8mma-nbuf2-q2-p2"], 6) == round(v["fp8mma-nbuf2-q3-p2"], 6)
                                 for v in by.values())
    new = json.loads((BENCH / "sweeps" / "vllm_harness_h200_471ba29.json").read_text())
    old = load("vllm_harness_h200.json")  # the Triton kernel (836d561)
    assert new["device"] == "NVIDIA H200" and len(new["results"]) == 22 and all(r["ok"] for r in new["results"])

    def h8(d):
        return next(r for r in d["results"] if r.get("kv_format") == "fp8_ds_mla" and r["heads"] == 8)

    assert h8(new)["kernel_us"] < 0.8 * h8(old)["kernel_us"] and h8(new)["eager_us"] > 1.3 * h8(old)["eager_us"]


def _fp8mma_timing(res: dict) -> dict:
    return {(r["kind"], r.get("B", r.get("T")), r["H"]): r for r in res["rows"] if "kind" in r}


def _fp8mma_checks_as_close_as_triton(res: dict, n_configs: int) -> list:
    checks = [r for r in res["rows"] if "case" in r]
    tri = {r["case"]: r for r in checks if r["kernel"] == "triton"}
    ours = [r for r in checks if r["kernel"] == "fp8mma"]
    assert res["meta"]["failed_checks"] == 0 and all(r["ok"] for r in checks)  # lse: 1e-3 + 4e-6 |lse|
    assert len({r["config"] for r in ours}) == n_configs and len(ours) == n_configs * len(tri)
    for r in ours:
        assert r["rel"] <= 1.1 * tri[r["case"]]["rel"] + 1e-4 and r["cos_diff"] < 1e-4 and r["no_key_rows_ok"], r
    # the mixed-scale cases (rows over 2^-3..2^3 under a small q: softmaxes over many keys) are in and pass
    assert sum("spread3" in c for c in tri) == 2
    return ours


def test_evidence_fp8mma_h200_round9_fp16_products():
    """NOTES round 9 / docs/kernels.md v14: the fp16-product build (v14b at 08e4e10) and the shipped kernel after the
    bank-conflict and row-max changes (v14c at 33e8f55), both beside the Triton kernel and FlashMLA in one process.
    The fp16 build is as close to fp32 as the Triton kernel (it rounds nothing but P); the ratios the README, NOTES
    and `mla.py` quote follow from the files."""
    b = json.loads((BENCH / "sweeps" / "fp8mma_h200_08e4e10.json").read_text())
    c = load("fp8mma_h200.json")
    assert b["meta"]["commit"] == "08e4e10" and c["meta"]["commit"] == "33e8f55"
    assert b["meta"]["device"] == c["meta"]["device"] == "NVIDIA H200"
    for res, n in ((b, 5), (c, 4)):
        ours = _fp8mma_checks_as_close_as_triton(res, n)
        tri = {r["case"]: r["rel"] for r in res["rows"] if r.get("kernel") == "triton"}
        f16 = [r for r in ours if r["config"] == "fp8mma-nbufG-f16"]
        assert f16 and all(r["rel"] <= 1.001 * tri[r["case"]] + 1e-6 for r in f16)
    tb, tc = _fp8mma_timing(b), _fp8mma_timing(c)
    G, E = "fp8mma-nbufG-f16_us", "fp8mma-nbuf2-q2-p2_us"

    def ratio(t, key, num, den):
        return round(t[key][num] / t[key][den], 2)

    d32, d128, pre = ("decode", 32, 8), ("decode", 128, 8), ("prefill", 4096, 8)
    h32, h128, hpre = ("decode", 32, 16), ("decode", 128, 16), ("prefill", 4096, 16)
    # v14b: the fp16 build against the e4m3 one at 8 heads (0.87 / 0.89 / 0.87) and the Triton kernel at 16
    assert [ratio(tb, k, G, E) for k in (d32, d128, pre)] == [0.87, 0.89, 0.87]
    assert [ratio(tb, k, G, "triton_us") for k in (h32, h128, hpre)] == [0.83, 0.72, 0.74]
    # one ring slot per head group is the faster of one and two at either head count (`ring_slots`)
    n1, n2 = "fp8mma-nbuf1-f16_us", "fp8mma-nbuf2-f16_us"
    assert all(0.93 <= tb[k][n1] / tb[k][n2] <= 0.975 for k in (d32, d128)) and abs(tb[pre][n1] / tb[pre][n2] - 1) < .01
    assert all(1.05 <= tb[k][n1] / tb[k][n2] <= 1.13 for k in (h32, h128, hpre))
    assert all(tb[k][G] == tb[k][n1] or abs(tb[k][G] / tb[k][n1] - 1) < 0.01 for k in (d32, d128, pre))
    # v14c (shipped): against the Triton kernel and FlashMLA padded to 64 heads (its bf16 prefill)
    assert [ratio(tc, k, G, "triton_us") for k in (d32, d128, pre)] == [0.73, 0.64, 0.48]
    assert [ratio(tc, k, G, "triton_us") for k in (h32, h128, hpre)] == [0.77, 0.70, 0.70]
    assert [ratio(tc, k, "flashmla_us", G) for k in (d32, d128)] == [1.43, 1.20]
    assert ratio(tc, pre, "flashmla_bf16_us", G) == 1.01 and ratio(tc, hpre, "flashmla_bf16_us", G) == 0.71
    # v14b -> v14c, each normalised by the Triton kernel of its own run: 1-7 % faster in every row
    for k in tc:
        gain = (tc[k][G] / tc[k]["triton_us"]) / (tb[k][G] / tb[k]["triton_us"])
        assert 0.92 < gain < 0.995, (k, gain)
    # the e4m3 build the 99 KB class took then, with that class's split plan, is faster than that class's Triton config
    small = "small_class_fp8mma-nbuf1-q2-p2_us"
    assert all(tc[k][small] < tc[k]["small_class_triton_us"] for k in (d32, d128, h32, h128))


def test_evidence_fp8mma_h200_round9_steps_that_did_not_ship():
    """NOTES round 9: the first fp16 build (41116af) was faster than the e4m3 one in every row, by less than its
    instruction count predicted; a register cap (d13d6e5: 168 / 160 a thread, 6 programs per SM) made decode slower."""
    first = _fp8mma_timing(json.loads((BENCH / "sweeps" / "fp8mma_41116af.json").read_text()))
    assert all(r["fp8mma-nbuf2-f16_us"] < r["fp8mma-nbuf2-q2-p2_us"] for r in first.values())
    assert round(first[("decode", 128, 8)]["fp8mma-nbuf2-f16_us"] / first[("decode", 128, 8)]["fp8mma-nbuf2-q2-p2_us"],
                 2) == 0.92
    capped = _fp8mma_timing(json.loads((BENCH / "sweeps" / "fp8mma_d13d6e5.json").read_text()))
    base = "fp8mma-nbuf1-f16_us"
    assert all(capped[("decode", 32, H)]["fp8mma-nbuf1-f16-r168_us"] > 1.15 * capped[("decode", 32, H)][base]
               for H in (8, 16))
    assert all(capped[("prefill", 4096, H)]["fp8mma-nbuf1-f16-r168_us"] < 0.96 * capped[("prefill", 4096, H)][base]
               for H in (8, 16))


def test_evidence_fp8mma_h200_round9_sanitizers_host_time_and_call_path():
    """NOTES round 9: racecheck and synccheck on the shipped build (8 heads; 12 heads, paged) clean; the pre-bound
    launch brought an eager call's host time from 105-107 us to 38; the vLLM call path 22/22 with the kernel, its
    fp8 T64 cases at 52 / 60 us of GPU time against the Triton kernel's 82 (836d561)."""
    for tool, summary in (("racecheck", "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"),
                          ("synccheck", "ERROR SUMMARY: 0 errors")):
        log = (BENCH / f"{tool}_fp8mma_h200.log").read_text()
        assert summary in log and "3/3 cases pass on cuda" in log, tool
        assert log.count("fp8_ds_mla") == 2 and log.count("config=fp8mma-nbufG-f16") == 2, tool
    # the same checks at 08e4e10 (v14b, first dispatched) and the matrix through the pre-bound launch at 687b4f1
    for tool in ("racecheck", "synccheck"):
        log = (BENCH / "sweeps" / f"{tool}_fp8mma_h200_08e4e10.log").read_text()
        assert "3/3 cases pass on cuda" in log and log.count("config=fp8mma-nbufG-f16") == 2, tool
    assert "ERROR SUMMARY: 0 errors" in (BENCH / "sweeps" / "sanitizer_h200_08e4e10.log").read_text()
    for rev in ("08e4e10", "687b4f1"):
        rows = json.loads((BENCH / "sweeps" / f"checks_h200_full_{rev}.json").read_text())
        assert len(rows) == 124 and all(r["ok"] for r in rows), rev
        assert sum(r.get("config") == "fp8mma-nbufG-f16" for r in rows) == 19, rev
    prebound = json.loads((BENCH / "sweeps" / "fp8mma_small_batch_h200_687b4f1.json").read_text())
    assert prebound["meta"]["commit"] == "687b4f1"
    assert all(35 < r["fp8mma_eager_host_us"] < 65 for r in prebound["rows"])
    before = json.loads((BENCH / "sweeps" / "fp8mma_small_batch_h200_08e4e10.json").read_text())
    after = json.loads((BENCH / "sweeps" / "fp8mma_small_batch_h200_33e8f55.json").read_text())
    assert before["meta"]["commit"] == "08e4e10" and after["meta"]["commit"] == "33e8f55"
    assert all(104 < r["fp8mma_eager_host_us"] < 108 for r in before["rows"])
    assert all(37 < r["fp8mma_eager_host_us"] < 39 for r in after["rows"])
    assert [round(r["fp8mma_graph_us"] / r["triton_graph_us"], 2) for r in after["rows"]] == [1.02, 0.98, 0.83]
    new = json.loads((BENCH / "sweeps" / "vllm_harness_h200_33e8f55.json").read_text())
    old = load("vllm_harness_h200.json")
    assert old["commit"] == "836d561" and new["commit"] == "33e8f55"
    assert len(new["results"]) == 22 and all(r["ok"] for r in new["results"])

    def fp8(d, heads):
        return next(r for r in d["results"] if r.get("kv_format") == "fp8_ds_mla" and r["heads"] == heads)

    assert [round(fp8(new, h)["kernel_us"]) for h in (8, 16)] == [52, 60]
    assert [round(fp8(old, h)["kernel_us"]) for h in (8, 16)] == [82, 82]


def test_evidence_fp8mma_ncu_decode_before_v14c():
    """NOTES round 9: Nsight Compute on the B128 8-head decode of v14b (687b4f1, the kernel of 08e4e10): 2 warps per
    scheduler (12.5 % theoretical occupancy), IPC 0.91, shared loads 3.4-way conflicted; the stall reasons led
    by short scoreboard and MIO throttle (shared memory)."""
    text = (BENCH / "sweeps" / "ncu_fp8mma_decode_h8_687b4f1.txt").read_text()
    assert "Theoretical Occupancy                     %        12.50" in text
    assert "Executed Ipc Active   inst/cycle         0.91" in text and "3.4 - way bank" in text
    stalls = {}
    for line in (BENCH / "sweeps" / "ncu_stalls_687b4f1.txt").read_text().splitlines():
        name, value = line.split()
        stalls[name.replace("smsp__pcsamp_warps_issue_stalled_", "")] = float(value)
    top = sorted(stalls, key=stalls.get, reverse=True)[:2]
    assert top == ["short_scoreboard", "mio_throttle"], top


def test_evidence_fp8mma_sass_loop_counts():
    """docs/kernels.md v14: the sm_90 loop under Triton 3.6 (`scripts/fp8mma_sass_count.py`, no GPU needed) has
    905 instructions, 272 conversions and 68 HMMA in the fp16-product build against 1698, 448 and 132 in the e4m3
    one, and 3 barriers a tile."""
    import re

    text = (BENCH / "sweeps" / "fp8mma_sass_loop_sm90_triton36.txt").read_text()
    assert text.startswith("triton 3.6.0, sm_90, 8 heads")
    rows = {m[1]: (int(m[2]), int(m[3]), m[4]) for m in re.finditer(r"^(\S+): (\d+) instructions in the loop "
                                                                     r"\(BAR (\d+)\); (.*)$", text, re.M)}
    f16, e4 = rows["fp8mma-nbufG-f16"], rows["fp8mma-nbuf2-q2-p2"]

    def op(row, name):
        return int(re.search(rf"\b{name} (\d+)", row[2])[1])

    assert (f16[0], op(f16, "F2FP"), op(f16, "HMMA"), f16[1]) == (905, 272, 68, 3)
    assert (e4[0], op(e4, "F2FP"), op(e4, "HMMA")) == (1698, 448, 132)


def _ncu_value(name: str, metric: str) -> float:
    import re

    text = (BENCH / "sweeps" / name).read_text()
    return float(re.search(rf"^\s+{re.escape(metric)}\s+\S+\s+([\d.]+)$", text, re.M)[1])


def test_evidence_indexer_q_forms_h200():
    """NOTES round 10: bf16 q over fp8 keys rewritten before its scores, side by side in one run at B128 ctx 32K
    (`bench indexer --sweep-indexer`): every form scores within the bf16 tolerance; the shipped fp16 form in the
    keys-as-M layout is the fastest exact one (1.27x the bf16 dot's 285 us); two e4m3 terms are faster still but
    not exact on sm_90 (its fp8 wgmma's accumulation); fp8 q stays ahead. The shipped bench run's target row is
    that fp16 form, and with software e4m3 (sm_80's path) the fp16 form in keys-as-M wins as well."""
    res = json.loads((BENCH / "sweeps" / "indexer_forms_h200_af1202a.json").read_text())
    assert res["meta"]["gpu"] == "NVIDIA H200" and res["meta"]["commit"] == "af1202a"
    rows = {r["impl"]: r for r in res["rows"] if r["kind"].startswith("indexer-decode") and r["kv_format"] == "fp8"}
    forms = {k: v for k, v in rows.items() if k.startswith("triton:q-")}
    assert len(forms) == 8 and all(r["ok"] for r in forms.values())
    us = {k.removeprefix("triton:q-"): v["us"] for k, v in forms.items()}
    exact = [k for k, v in forms.items() if v["rel_err"] < 1e-6]
    assert min(exact, key=lambda k: forms[k]["us"]) == "triton:q-f16-keysM"
    assert round(us["bf16"] / us["f16-keysM"], 2) == 1.27
    assert us["e4m3x2-keysM"] < us["f16-keysM"] and 1e-5 < forms["triton:q-e4m3x2-keysM"]["rel_err"] < 1e-3
    assert rows["triton-q8"]["us"] < us["e4m3x2-keysM"]
    assert abs(rows["triton"]["us"] / us["f16-keysM"] - 1) < 0.02  # the default is that form
    # round 10's shipped run: that form with its register cap (`indexer.paged_maxnreg`), fp8 q with its own
    shipped = json.loads((BENCH / "sweeps" / "bench_h200_413d3e3.json").read_text())
    assert shipped["meta"]["commit"] == "413d3e3"
    srows = {r["impl"]: r["us"] for r in shipped["rows"] if r["kind"].startswith("indexer-decode")
             and r["kv_format"] == "fp8"}
    assert abs(srows["triton"] / srows["triton:q-f16-keysM-r96"] - 1) < 0.02 < 1 - srows["triton"] / us["f16-keysM"]
    assert abs(srows["triton-q8"] / srows["triton:q-q8-keysM-r80"] - 1) < 0.02
    assert srows["triton-q8"] < 0.97 * rows["triton-q8"]["us"]  # the cap: 180 -> 171 us
    target = {t["target"]: t for t in shipped["targets"]}
    assert 60 < target["indexer decode fp8: % of copy bandwidth"]["value"] < 70
    assert not target["indexer decode fp8: % of copy bandwidth"]["met"]
    assert target["indexer decode fp8 (fp8 q): % of copy bandwidth"]["value"] > 78
    sw = json.loads((BENCH / "sweeps" / "indexer_forms_swfp8_h200_d9ce336.json").read_text())
    sw_rows = {r["impl"]: r["us"] for r in sw["rows"]
               if r["kind"] == "indexer-decode-sweep" and r["kv_format"] == "fp8"}
    assert sw_rows["triton:q-f16-keysM"] < min(sw_rows["triton:q-bf16"], sw_rows["triton:q-f16"])
    assert not any(r["impl"].startswith("triton-q8") for r in sw["rows"])  # no fp8 q without hardware e4m3


def test_evidence_indexer_ncu_registers_bound_the_fp16_form():
    """NOTES round 10: what separates the fp16 form from fp8 q is occupancy: 122 registers (4 programs per SM)
    against 90 (5); the two-term e4m3 form, one accumulator, is back at 90 registers."""
    regs = {f: _ncu_value(name, "Registers Per Thread") for f, name in (
        ("q8", "ncu_indexer_q8_2f2bff4.txt"), ("f16", "ncu_indexer_f16_2f2bff4.txt"),
        ("e4m3x2", "ncu_indexer_e4m3x2_af1202a.txt"))}
    assert regs == {"q8": 90, "f16": 122, "e4m3x2": 90}
    assert _ncu_value("ncu_indexer_f16_2f2bff4.txt", "Theoretical Occupancy") == 25
    assert _ncu_value("ncu_indexer_q8_2f2bff4.txt", "Theoretical Occupancy") == 31.25


def test_evidence_indexer_sanitizer_h200_clean():
    """Every paged-indexer form under compute-sanitizer memcheck, each launch matching the reference."""
    log = (BENCH / "sanitizer_indexer_h200.log").read_text()
    assert "48/48 indexer launches match the reference" in log and "ERROR SUMMARY: 0 errors" in log
    assert log.count(": ok") == 48 and log.count("bf16 keys 8 tiles a program: ok") == 2  # the rule's count, H32/H24


def _decode_us(name: str) -> tuple[str, dict]:
    res = json.loads((BENCH / name).read_text())
    assert res["meta"]["gpu"] == "NVIDIA H200"
    return res["meta"]["commit"], {(r["kv_format"], r["impl"]): r for r in res["rows"]
                                   if r["kind"].startswith("indexer-decode") and "error" not in r}


def _fastest_tiled(us: dict, fmt: str, label: str) -> tuple[float, str]:
    """(time, row) of the fastest several-tiles-a-program sweep row for keys `fmt` and q `label`."""
    return min((v, i) for (f, i), v in us.items() if f == fmt and i.startswith(f"triton:q-{label}-t"))


def test_evidence_indexer_tiles_per_program_h200():
    """NOTES round 11 (`indexer.PAGED_TILES`): several tiles a program, q loaded once, the key loads pipelined by
    the compiler. Over bf16 keys 8 tiles beat one by more than 7 % (the rule on sm_90); over fp8 keys no tile
    count, stage count or cap beat one tile a program for any q (so the rule keeps one there); the looping grid
    (CUDA-graph decode), which runs that loop, is faster for fp8 q and bf16 keys than round 10's. The first run
    (f593c87), which sent one tile a program through the loop too, shows what that cost. The shipped run launches
    the rule's count, every row checked against the reference."""
    from glm5lib.kernels import indexer as ix

    commit, rows = _decode_us("sweeps/indexer_tiles_h200_a15190a.json")
    assert commit == "a15190a" and all(r["ok"] for k, r in rows.items() if k[1].startswith("triton:"))
    us = {k: r["us"] for k, r in rows.items()}

    def tiled(fmt, label):
        return _fastest_tiled(us, fmt, label)[0]

    best = _fastest_tiled(us, "bf16", "bf16")[1]
    assert best.startswith(f"triton:q-bf16-t{ix.TILES_SM90['bf16']}-")  # the rule's count is the fastest
    assert tiled("bf16", "bf16") < 0.93 * us["bf16", "triton"]
    one_tile = {"f16": us["fp8", "triton"], "q8": us["fp8", "triton:q-q8-keysM-r80"],
                "e4m3x2": min(us["fp8", "triton:q-e4m3x2-keysM"], us["fp8", "triton:q-e4m3x2-keysM-r96"])}
    for label, best in one_tile.items():
        assert tiled("fp8", label) > 0.99 * best, label
    old = {k: r["us"] for k, r in _decode_us("sweeps/bench_h200_413d3e3.json")[1].items()}
    assert us["fp8", "triton:q8:N128-w4-s2-loop32"] < 0.93 * old["fp8", "triton:q8:N128-w4-s2-loop32"]
    assert us["bf16", "triton:N128-w4-s2-loop32"] < 0.93 * old["bf16", "triton:N128-w4-s2-loop32"]
    assert us["fp8", "triton:f16:N128-w4-s2-loop32"] < 1.05 * old["fp8", "triton:N128-w4-s2-loop32"]  # then unnamed
    first_commit, first = _decode_us("sweeps/indexer_tiles_h200_f593c87.json")
    assert first_commit == "f593c87"
    assert first["fp8", "triton:q-f16-keysM"]["us"] > 1.5 * us["fp8", "triton:q-f16-keysM"]
    commit, shipped = _decode_us("sweeps/bench_h200_1d31ed4.json")
    assert commit == "1d31ed4"
    assert abs(shipped["bf16", "triton"]["us"] / shipped["bf16", "triton:q-bf16-t8-s2"]["us"] - 1) < 0.03
    assert abs(shipped["fp8", "triton"]["us"] / shipped["fp8", "triton:q-f16-keysM-r96"]["us"] - 1) < 0.03
    target = {t["target"]: t for t in json.loads((BENCH / "sweeps" / "bench_h200_1d31ed4.json").read_text())["targets"]}
    assert target["indexer decode bf16: % of copy bandwidth"]["value"] > 90
    assert 60 < target["indexer decode fp8: % of copy bandwidth"]["value"] < 70
    # the two runs disagree on the fp8-dot loops: f593c87's (TILES a runtime argument) ran them faster, and its
    # 8-tile loop compiles to fewer instructions than the committed constexpr build's
    for row in ("triton:q-e4m3x2-t8-s2", "triton:q-q8-t8-s2"):
        assert first["fp8", row]["us"] < 0.93 * us["fp8", row], row
    import re

    sass = (BENCH / "sweeps" / "indexer_tiles_sass_triton36.txt").read_text().split("== ")[1:]
    line = re.compile(r"^(.+?): \d+ registers, (\d+) instructions", re.M)
    count = [{m[1]: int(m[2]) for m in line.finditer(b)} for b in sass]
    assert sass[0].startswith("f593c87") and sass[1].startswith("a15190a")
    for q in ("fp8 q", "two e4m3 terms"):
        assert count[1][q] > 1.05 * count[0][q], q
    # the committed build (TILES a runtime argument again) runs those loops at f593c87's times, and its rule holds:
    # the shipped forms over fp8 keys gain nothing from several tiles (under 3 %), bf16 keys do
    third_commit, third = _decode_us("sweeps/indexer_tiles_h200_1d31ed4.json")
    assert third_commit == "1d31ed4" and all(r["ok"] for k, r in third.items() if k[1].startswith("triton:"))
    for row in ("triton:q-e4m3x2-t8-s2", "triton:q-q8-t8-s2"):
        assert abs(third["fp8", row]["us"] / first["fp8", row]["us"] - 1) < 0.03, row
    t3 = {k: r["us"] for k, r in third.items()}

    def tiled3(fmt, label):
        return _fastest_tiled(t3, fmt, label)[0]

    assert tiled3("fp8", "f16") > 0.97 * t3["fp8", "triton"] and tiled3("fp8", "q8") > 0.97 * t3["fp8", "triton-q8"]
    assert tiled3("bf16", "bf16") < 0.93 * t3["bf16", "triton:N128-w4-s2"]


def test_evidence_indexer_form_topk_h200():
    """NOTES round 11 (`scripts/indexer_form_topk.py`, all 128 decode rows against the fp32 reference): the fp16
    rewrite and the bf16 dot pick the reference's top-2048 in every row; two e4m3 terms move a few positions (at
    most 4 of 2048 in a row) for a faster call; vLLM's fp8 q moves some 2-3 %, an order of magnitude more."""
    res = json.loads((BENCH / "sweeps" / "indexer_form_topk_h200_63637dd.json").read_text())
    assert res["meta"]["gpu"] == "NVIDIA H200" and res["meta"]["commit"] == "63637dd" and res["meta"]["batch"] == 128
    rows = {r["form"]: r for r in res["rows"]}
    for exact in ("f16", "bf16 dot"):
        assert rows[exact]["rows_identical"] == rows[exact]["rows"] == 128 and rows[exact]["rel_err"] < 1e-6
    two, q8 = rows["e4m3x2"], rows["fp8 q"]
    assert 1e-5 < two["rel_err"] < 1e-3 and two["topk_agree_min"] >= 1 - 4 / 2048
    assert 1 - q8["topk_agree_mean"] > 10 * (1 - two["topk_agree_mean"])
    assert two["us"] < 0.95 * rows["f16"]["us"] < rows["bf16 dot"]["us"] and q8["us"] < two["us"]


def test_evidence_fp8mma_graph_threshold_h200():
    """mla.FP8MMA_MIN_T_GRAPH: `sparse_mla` captured in a CUDA graph runs the fp8-cache kernel from 8 tokens (its
    replay time is that kernel's) and the Triton kernel below; at 8 heads the kernel is faster from B8 on."""
    from glm5lib.kernels import mla

    res = json.loads((BENCH / "sweeps" / "fp8mma_small_batch_h200_2f2bff4.json").read_text())
    assert res["meta"]["commit"] == "2f2bff4" and res["meta"]["device"] == "NVIDIA H200"
    for r in res["rows"]:
        rule = "fp8mma" if mla.fp8mma_shape(r["B"], r["H"], "fp8_ds_mla", graph=True) else "triton"
        assert r["graph_rule"] == rule, r
        assert abs(r["dispatch_graph_us"] / r[f"{rule}_graph_us"] - 1) < 0.08, r  # B1: 11.3 against 12.0 us
        if r["H"] == 8 and r["B"] >= 8:
            assert r["fp8mma_graph_us"] < 0.92 * r["triton_graph_us"], r
    assert {(r["H"], r["B"]) for r in res["rows"] if r["graph_rule"] == "triton"} == {(8, 1), (8, 4)}


def test_evidence_indexer_sass_counts():
    """docs/kernels.md v15: static counts of the paged indexer's scores kernel for bf16 q over fp8 keys under Triton
    3.6 (`scripts/indexer_sass_count.py`): the fp16 form drops the key conversions from 258 to 66 a thread on
    sm_90, sm_89 and sm_120 and holds sm_90's cap of 96 registers; two-term e4m3 converts no key at all."""
    import re

    text = (BENCH / "sweeps" / "indexer_sass_triton36.txt").read_text()
    rows = {(m[1], m[2], m[3]): (int(m[4]), int(m[6])) for m in re.finditer(
        r"^sm_(\d+) (heads|keys)-as-M, q (.+?): (\d+) registers(?: \(cap \d+\))?, (\d+) instructions, "
        r"F2FP\+F2F\+HADD2\+PRMT\+I2F "
        r"(\d+);", text, re.M)}
    for arch in ("90", "89", "120"):
        assert rows[(arch, "keys", "as it is (bf16 dot)")][1] == 258 and rows[(arch, "keys", "f16")][1] == 66
    assert rows[("90", "keys", "f16")][0] == 96 and "96 registers (cap 96)" in text
    assert all(rows[(arch, "keys", "e4m3x2")][1] <= 2 for arch in ("90", "89", "120"))


def test_evidence_readme_target_numbers():
    """The README's issue-#13 paragraph, held to the committed `bench_h200.json` (rounded as it prints them)."""
    t = {x["target"]: x["value"] for x in load("bench_h200.json")["targets"]}

    def r2(name):
        return round(t[name], 2)

    assert load("bench_h200.json")["meta"]["commit"].startswith("6eaff6f")
    assert [r2(f"prefill bf16 H{h}: ratio to FlashMLA (time)") for h in (64, 128)] == [0.88, 0.87]
    assert [r2(f"decode fp8 H{h} B128: ratio to FlashMLA") for h in (64, 128)] == [0.95, 0.91]
    assert [r2(f"decode fp8 H8 B{b}: speed-up vs FlashMLA padded to 64") for b in (128, 32)] == [1.6, 1.62]
    assert [r2(f"decode fp8 H16 B{b}: speed-up vs FlashMLA padded to 64") for b in (128, 32)] == [1.18, 1.43]
    assert [round(t[f"decode fp8 H8 B{b}: % of byte floor (gathered bytes at copy bandwidth)"]) for b in (32, 128)] == [
        33, 55]
    assert [round(t[f"decode bf16 H{h} B128: % of copy bandwidth"]) for h in (16, 8)] == [65, 67]
    assert [r2(f"prefill fp8_ds_mla H{h}: speed-up vs FlashMLA bf16 padded to 64 (time)") for h in (8, 16)] == [
        1.48, 0.92]
    assert not next(x for x in load("bench_h200.json")["targets"] if x["target"].startswith("prefill fp8_ds_mla H8"))[
        "met"]
    rows = load("bench_h200.json")["rows"]
    fp8_h8 = next(r for r in rows if r["kind"] == "prefill" and r["H"] == 8
                  and r.get("kv_format") == "fp8_ds_mla" and r["impl"] == "triton")
    assert round(fp8_h8["us"], 1) == 1284.0 and fp8_h8["config"] == "fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan-wgplan"
    fp8_h16 = next(r for r in rows if r["kind"] == "prefill" and r["H"] == 16
                   and r.get("kv_format") == "fp8_ds_mla" and r["impl"] == "triton")
    assert round(fp8_h16["us"]) == 2159
    # "FlashMLA's 1904 ... (1904, 1992 and 2055 us in the latest: the padded 8- and 16-head prefills are the same
    # work)": its three padded 8-16-head prefill rows of the run; the three runs before: "1.57x (1279.5 against 2008),
    # ... 1.49x (1280.1 against 1909) and 1.59x (1268.8 against 2014)"
    anchors = sorted(round(r["us"]) for r in rows if r["kind"] == "prefill" and r["H"] in (8, 16)
                     and r["impl"].startswith("flashmla"))
    assert anchors == [1904, 1992, 2055]
    assert round(next(r["us"] for r in rows if r.get("baseline_for") == "fp8_ds_mla" and r["H"] == 8)) == 1904
    for commit, want in (("97dc8b8", [1279.5, 2008.0]), ("5b6d93c", [1280.1, 1909.3]), ("30b2ee5", [1268.8, 2014.4])):
        before = load(f"sweeps/bench_h200_{commit}.json")["rows"]
        assert [round(r["us"], 1) for r in before if r["kind"] == "prefill" and r["H"] == 8 and (
            r["impl"] == "triton" and r.get("kv_format") == "fp8_ds_mla" or r.get("baseline_for") == "fp8_ds_mla")] == \
            want, commit
    assert [round(t[f"indexer prefill {f}: % of bf16 matmul rate"]) for f in ("fp8", "bf16")] == [53, 53]
    assert round(t["indexer decode bf16: % of copy bandwidth"]) == 93
    assert round(t["indexer decode fp8 (fp8 q): % of copy bandwidth"]) == 82
    assert round(t["indexer decode fp8: % of copy bandwidth"]) == 65
    # "bf16 rows at B=128 reach 82.0 % and 84.4 % in the last two benchmark runs"
    for name, want in (("sweeps/bench_h200_97dc8b8.json", 82.0), ("bench_h200.json", 84.4)):
        ceil = next(x["ceiling"] for x in load(name)["targets"]
                    if x["target"] == "decode bf16 H8 B128: % of copy bandwidth")
        assert round(ceil, 1) == want, name
    # the fp8-cache kernel against the Triton kernel's 99 KB-class configs in the same run ("0.42-0.66x ... 0.29-0.49x")

    def us(kind, T, H, small):
        return next(r["us"] for r in rows if r.get("kv_format") == "fp8_ds_mla" and r.get("T") == T and r["H"] == H
                    and (r["kind"] == "smem-small" and r.get("case") == kind if small else
                         r["kind"] == kind and r["impl"] == "triton"))

    def ratios(kind, Ts):
        return [round(us(kind, T, H, False) / us(kind, T, H, True), 2) for T in Ts for H in (8, 16)]

    assert (min(ratios("decode", (32, 128))), max(ratios("decode", (32, 128)))) == (0.42, 0.66)
    assert (min(ratios("prefill", (4096,))), max(ratios("prefill", (4096,)))) == (0.29, 0.49)
    # the kernel taken apart ("68 us of gathers and 56 us of compute in 77-81 us, the fastest gather route of the same
    # rows 54 us; at 16 heads the compute alone (88 us)"): the row-thread sweep, and the 8-thread build's second run
    sweep, second = _ablation("bc8f6e0"), _ablation("6e4488e")
    key = ("ablate-decode", 128, 8, "fp8mma-nbufG-f16-nplan-t8")
    assert [int(sweep[key][p + "_us"]) for p in ("gathers", "compute")] == [68, 56]
    assert sorted(int(run[key]["whole_us"]) for run in (sweep, second)) == [77, 81]
    assert int(sweep[("ablate-decode", 128, 16, key[3])]["compute_us"]) == 88
    best = next(r["us"] for r in load("sweeps/fp8mma_ablate_h200_bc8f6e0.json")["rows"]
                if r.get("kind") == "gather-ceiling" and r.get("case") == "decode" and r.get("T") == 128
                and r.get("impl") == "best-gather")
    assert int(best) == 54


def _ablation(commit: str) -> dict:
    """(kind, B, H, config) -> the part times of `sweeps/fp8mma_ablate_h200_<commit>.json`, after its checks."""
    res = load(f"sweeps/fp8mma_ablate_h200_{commit}.json")
    assert res["meta"]["commit"] == commit and res["meta"]["device"] == "NVIDIA H200"
    assert res["meta"]["failed_checks"] == 0
    checked = {r["config"] for r in res["rows"] if r.get("kernel") == "fp8mma" and r.get("ok")}
    parts = {(r["kind"], r["B"], r["H"], r["config"]): r for r in res["rows"] if r.get("kind", "").startswith("ablate")}
    assert {k[3] for k in parts} <= checked  # every config taken apart also passed the checks of that run
    return parts


def test_evidence_fp8mma_ablation_h200():
    """NOTES round 13: the fp8-cache kernel taken apart (`ablate_launch`). With 2 threads a gathered row (the kernel
    until bc8f6e0) its gathers alone took almost the whole kernel's time at decode B128; 8 threads cut the gathers
    and the whole kernel, and the 8-thread build is what both classes ship. A part never takes longer than the whole
    kernel, which never takes longer than the two parts one after the other."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    first, second = _ablation("bc8f6e0"), _ablation("6e4488e")
    old, new = "fp8mma-nbufG-f16-nplan", "fp8mma-nbufG-f16-nplan-t8"
    for parts in (first, second):
        for r in parts.values():
            w, g, c = r["whole_us"], r["gathers_us"], r["compute_us"]
            assert max(g, c) < 1.02 * w and w < 1.02 * (g + c), r
    d_old, d_new = first["ablate-decode", 128, 8, old], first["ablate-decode", 128, 8, new]
    assert d_old["gathers_us"] > 0.85 * d_old["whole_us"]  # 2 threads: the gathers nearly the whole time
    assert d_new["gathers_us"] < 0.8 * d_old["gathers_us"] and d_new["whole_us"] < 0.8 * d_old["whole_us"]
    p_old, p_new = first["ablate-prefill", 4096, 8, old], first["ablate-prefill", 4096, 8, new]
    assert p_new["gathers_us"] < 0.6 * p_old["gathers_us"] and p_new["whole_us"] < 0.8 * p_old["whole_us"]
    for H in (8, 16):  # the 8-thread build never slower than one a warp (2 or 4), 4, 16 or 32 threads by over 3 %
        for kind, B in (("ablate-decode", 32), ("ablate-decode", 128), ("ablate-prefill", 4096)):
            others = [first[kind, B, H, f"{old}{t}"]["whole_us"] for t in ("", "-t16", "-t32")]
            others.append(second[kind, B, H, f"{old}-t4"]["whole_us"])
            assert first[kind, B, H, new]["whole_us"] < 1.03 * min(others), (kind, B, H)
    e4m3 = second["ablate-decode", 128, 8, "fp8mma-nbuf1-q2-p2"], second["ablate-decode", 128, 8, "fp8mma-nbuf1-q2-p2-t8"]
    assert e4m3[1]["whole_us"] < 0.85 * e4m3[0]["whole_us"]  # the 99 KB class's build gains too
    # both classes ship the 8-thread build (sm_90's refilled early at one split since round 15)
    assert fm.config_name(fm.CONFIG_BY_CLASS["big"]._replace(refill=0, sched=0, key_warps=2, wgmma=0)) == new
    # (the 99 KB class took this e4m3 build until round 26, and its fp16-product twin since: both 8 threads a row)
    assert fm.config_name(fm.CONFIG_BY_CLASS["small"]) == "fp8mma-nbuf1-f16-t8"
    # round 13's benchmark ran the 8-thread build, faster than round 12's run of the 2-thread one
    now, before = load("sweeps/bench_h200_e59e9d5.json"), load("sweeps/bench_h200_6068e9e.json")
    assert now["meta"]["commit"] == "e59e9d5" and before["meta"]["commit"] == "6068e9e"

    def fp8_decode(res, B):
        return next(r for r in res["rows"] if r["kind"] == "decode" and r["kv_format"] == "fp8_ds_mla"
                    and r["H"] == 8 and r["T"] == B and r["impl"] == "triton")

    assert fp8_decode(now, 128)["config"] == new and fp8_decode(before, 128)["config"] == old
    assert fp8_decode(now, 128)["us"] < 0.85 * fp8_decode(before, 128)["us"]


def _large_decode(name: str) -> dict:
    """{(H, impl): us} of a `gluon_mla_large_device.py` run's fp8 decode timings, after its checks all passed."""
    res = load(f"sweeps/{name}")
    assert res["meta"]["device"] == "NVIDIA H200" and res["meta"]["checks_ok"] == res["meta"]["checks"] > 0
    assert not [r for r in res["checks"] if not r.get("ok")]
    return {(r["H"], r["impl"]): r["us"] for r in res["bench"] if r.get("kind") == "decode" and "us" in r}


def test_evidence_gluon_large_row_threads_and_probes_h200():
    """NOTES round 14 (v19): 8 threads a raw fp8 row made the key-split kernel faster at 64 and 128 heads without
    making its gathers alone faster; its products alone take longer than FlashMLA's whole kernel, and leaving out S
    or P V saves far less than half of them each (the chain around the products, README's numbers)."""
    from glm5lib.kernels import mla, mla_gluon_large as m

    sweep = _large_decode("gluon_large_rt_h200_2c7ebbc.json")
    probes = _large_decode("gluon_large_probe_h200_e59e9d5.json")
    assert load("sweeps/gluon_large_rt_h200_2c7ebbc.json")["meta"]["commit"] == "2c7ebbc"
    assert load("sweeps/gluon_large_probe_h200_e59e9d5.json")["meta"]["commit"] == "e59e9d5"
    assert m.RAW_ROW_THREADS == 8
    cfg = "gluon-wgmma:BN64-nbuf2-async"
    for H in (64, 128):
        whole = {rt: sweep[H, f"{cfg}-rt{rt}"] for rt in (4, 8, 16, 32)}
        assert min(whole, key=whole.get) == 8 and whole[8] < 0.97 * whole[32], (H, whole)
        gathers = [sweep[H, f"gluon-wgmma-probe1-rt{rt}"] for rt in (4, 8, 16, 32)]
        assert max(gathers) < 1.1 * min(gathers) + 5  # the gathers alone barely moved
        assert probes[H, f"{cfg}-rt32"] > 1.03 * probes[H, cfg]  # the second run: 8 threads (the default) again faster
    fm = probes[64, "flashmla"]
    p = {k: probes[64, f"gluon-wgmma-probe{k}"] for k in (1, 2, 3, 4, 5, 6)}
    assert p[4] > 1.05 * fm and round(p[4]) == 132 and round(p[4] / fm, 2) == 1.12  # the products alone
    assert round(p[2]) == 171 and p[2] > p[4] + 30  # the conversion on top of them, serialized
    for k in (5, 6):  # S or P V left out: 24-25 us each of the 132
        assert 15 < p[4] - p[k] < 35, (k, p)
    assert p[4] - (p[4] - p[5]) - (p[4] - p[6]) > 0.5 * p[4]  # most of the products' time is neither product
    bench = load("sweeps/bench_h200_e59e9d5.json")  # round 14's benchmark
    assert bench["meta"]["commit"] == "e59e9d5"
    rows = {(r["H"], r["impl"]): r for r in bench["rows"] if r["kind"] == "decode" and r.get("kv_format") == "fp8_ds_mla"}
    assert rows[64, "triton"]["config"] == "gluon-BN64-nbuf2-async"  # what sparse_mla dispatched then (round 14)
    t = {x["target"]: x["value"] for x in bench["targets"]}
    assert [round(t[f"decode fp8 H{h} B128: ratio to FlashMLA"], 2) for h in (64, 128)] == [0.64, 0.7]


def _refill_run(commit: str) -> dict:
    """(kind, B, H, config) -> part times of `sweeps/fp8mma_refill_h200_<commit>.json` (an `--ablate` run), after
    its checks."""
    res = load(f"sweeps/fp8mma_refill_h200_{commit}.json")
    assert res["meta"]["commit"] == commit and res["meta"]["device"] == "NVIDIA H200"
    assert res["meta"]["failed_checks"] == 0
    checked = {r["config"] for r in res["rows"] if r.get("kernel") == "fp8mma" and r.get("ok")}
    parts = {(r["kind"], r["B"], r["H"], r["config"]): r for r in res["rows"] if r.get("kind", "").startswith("ablate")}
    assert parts and {k[3] for k in parts} <= checked
    return parts


def test_evidence_fp8mma_refill_h200():
    """NOTES round 15: the one-slot ring refilled piece by piece ("-e", `mla_gluon_fp8mma.REFILLS`) against the slot
    refilled whole, in three H200 runs: faster at 8-head prefill (one split, 64-key tiles) in each, slower at 8-head
    decode (split, 32-key tiles) in each, which is the plan's rule (2) that sm_90 ships; the two variants tried at
    b836ec2 do not beat it. The benchmark and the matrix ran the shipped build, the sanitizer case found nothing."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    whole, early = "fp8mma-nbufG-f16-nplan-t8", "fp8mma-nbufG-f16-nplan-t8-e"
    runs = {c: _refill_run(c) for c in ("e6da82b", "8457230", "b836ec2")}
    for commit, run in runs.items():
        p = [run["ablate-prefill", 4096, 8, n]["whole_us"] for n in (whole, early)]
        assert p[1] < 0.975 * p[0], (commit, p)  # "-3.5 to -7 %"
        for B in (32, 128):
            d = [run["ablate-decode", B, 8, n]["whole_us"] for n in (whole, early)]
            assert d[1] > d[0], (commit, B, d)  # the early refill loses at decode: the rule keeps it to one split
    # docs/kernels.md v20's table: the ranges over the three runs
    def span(kind, B, name):
        v = [run[kind, B, 8, name]["whole_us"] for run in runs.values()]
        return round(min(v), 1), round(max(v), 1)

    assert span("ablate-prefill", 4096, whole) + span("ablate-prefill", 4096, early) == (1316.4, 1372.9, 1270.4, 1276.5)
    assert span("ablate-decode", 128, whole) + span("ablate-decode", 128, early) == (80.7, 81.5, 82.8, 84.0)
    assert span("ablate-decode", 32, whole) + span("ablate-decode", 32, early) == (28.7, 29.8, 31.6, 32.6)
    last = runs["b836ec2"]
    e, t, h = (last["ablate-prefill", 4096, 8, early + s]["whole_us"] for s in ("", "t", "h"))
    assert t > 1.2 * e and abs(h - e) < 0.01 * e  # tail first: much slower; two groups: level
    assert round(runs["8457230"]["ablate-prefill", 4096, 8, early + "s"]["whole_us"]) == 1292  # one group a chunk
    # what round 15 shipped (round 16 adds the balanced schedule to it: `test_evidence_fp8mma_balanced_h200`)
    assert fm.config_name(fm.CONFIG_BY_CLASS["big"]._replace(sched=0, key_warps=2, wgmma=0)) == \
        "fp8mma-nbufG-f16-nplan-t8-eplan"
    bench_run = load("sweeps/bench_h200_30b2ee5.json")
    assert bench_run["meta"]["commit"] == "30b2ee5"
    fp8 = [r for r in bench_run["rows"] if r["kind"] in ("prefill", "decode") and r.get("kv_format") == "fp8_ds_mla"
           and r["H"] <= 16 and r["impl"] == "triton"]
    assert fp8 and {r["config"] for r in fp8} == {"fp8mma-nbufG-f16-nplan-t8-eplan"}
    matrix = [r for r in load("sweeps/checks_h200_full_410f5c9.json")
              if r.get("config") == "fp8mma-nbufG-f16-nplan-t8-eplan"]
    assert len(matrix) >= 10 and all(r["ok"] for r in matrix)
    for tool, summary in (("memcheck", "ERROR SUMMARY: 0 errors"), ("racecheck", "RACECHECK SUMMARY: 0 hazards"),
                          ("synccheck", "ERROR SUMMARY: 0 errors")):
        log = (BENCH / "sweeps" / f"{tool}_fp8mma_refill_h200_410f5c9.log").read_text()
        assert "9/9 launches match the fp32 reference" in log and summary in log, tool
        assert log.count("-eplan: rel") == 3 and log.count("-e: rel") == 3  # the shipped build and the early one


def _waves(commit: str, suffix: str = "") -> dict:
    """T -> row of `sweeps/fp8mma_waves_h200_<commit><suffix>.json` (scripts/fp8mma_waves.py), every timed build
    of it checked against fp32 (relative error of the first 64 tokens)."""
    res = load(f"sweeps/fp8mma_waves_h200_{commit}{suffix}.json")
    assert res["meta"]["gpu"] == "NVIDIA H200" and res["meta"]["heads"] == 8 and res["meta"]["slots"] == 528
    rows = {r["T"]: r for r in res["rows"]}
    for r in rows.values():
        assert all(v < 3e-3 for k, v in r.items() if k.endswith("_rel")), r["T"]
        assert not any(k.endswith("_error") for k in r), r["T"]
    return rows


def test_evidence_fp8mma_balanced_h200():
    """NOTES round 16 / docs/kernels.md v21: the wave measurement, the balanced schedule's versions side by side with
    the one-a-token build, and what the shipped (balanced) build ran on the H200."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    old, new = "fp8mma-nbufG-f16-nplan-t8-eplan", "fp8mma-nbufG-f16-nplan-t8-eplan-b"
    assert fm.config_name(fm.CONFIG_BY_CLASS["big"]._replace(key_warps=2, wgmma=0)) == new  # (round 17 and 19's rules)
    w = _waves("4a85e56")  # v21a: 4096 tokens (7.76 waves) take 99.2 % of 8 waves' time
    assert [round(w[T]["shipped_us"], 1) for T in (3696, 4096, 4224)] == [1134.0, 1278.3, 1288.5]
    assert round(w[4096]["shipped_us"] / w[4224]["shipped_us"], 3) == 0.992
    assert round(w[528]["shipped_us"]) == 177
    runs = {c: _waves(c) for c in ("014f99d", "c80cd30", "373d59a", "1345688", "5b6d93c")}
    runs["373d59a-2"] = _waves("373d59a", "_second")
    b, o = f"{new}_us", f"{old}_us"

    def span(T, key, commits=None):
        v = [r[T][key] for c, r in runs.items() if (commits is None or c in commits) and T in r]
        return round(min(v), 1), round(max(v), 1)

    # the table of v21: the one-a-token build over every run, each balanced version in its own
    assert [(round(lo), round(hi)) for lo, hi in (span(600, o), span(3696, o), span(4096, o))] == [
        (263, 267), (1128, 1140), (1268, 1306)]
    table = {"014f99d": (238, 1215, 1383), "c80cd30": (221, 1188, 1324), "1345688": (214, 1141, 1273),
             "5b6d93c": (213, 1143, 1269)}
    for c, want in table.items():
        assert tuple(round(runs[c][T][b]) for T in (600, 3696, 4096)) == want, c
    # v21d: the flat loop's code one token a program slower than the one-a-token build, in both runs
    for c in ("373d59a", "373d59a-2"):
        assert runs[c][3696]["balanced-programs=T_us"] > 1.04 * runs[c][3696][o], c
    # v21f, shipped: 0.80x at 600 tokens, +1 % at 7 whole waves, level at 4096
    last = runs["5b6d93c"]
    assert round(last[600][b] / last[600][o], 2) == 0.8
    assert 1.005 < last[3696][b] / last[3696][o] < 1.015 and abs(last[4096][b] / last[4096][o] - 1) < 0.005
    # the balanced build's checks at the commits before (1100 tokens at 8 heads, 700 at 5: cut tokens)
    for c in ("014f99d", "c80cd30", "1345688"):
        res = load(f"sweeps/fp8mma_sched_h200_{c}.json")
        assert res["meta"]["failed_checks"] == 0 and res["meta"]["device"] == "NVIDIA H200"
        mine = [r for r in res["rows"] if r.get("config") == new]
        assert mine and all(r["ok"] for r in mine)
        assert {"B1100-H8-K2048-mixed", "B700-H5-K999-neg"} <= {r["case"] for r in mine}
    # the benchmark, the matrix and the sanitizer ran the shipped build at 5b6d93c
    bench_run = load("sweeps/bench_h200_5b6d93c.json")
    assert bench_run["meta"]["commit"] == "5b6d93c"
    fp8 = [r for r in bench_run["rows"] if r["kind"] in ("prefill", "decode") and r.get("kv_format") == "fp8_ds_mla"
           and r["H"] <= 16 and r["impl"] == "triton"]
    assert fp8 and {r["config"] for r in fp8} == {new}
    matrix = load("sweeps/checks_h200_full_5b6d93c.json")
    assert len(matrix) == 127 and all(r["ok"] for r in matrix)
    assert any(r["name"] == "prefill:T600-H8-K2048-N32768-fp8_ds_mla-none" and r["config"] == new for r in matrix)
    san = (BENCH / "sweeps" / "sanitizer_h200_5b6d93c.log").read_text()
    assert "28/28 cases pass" in san and "ERROR SUMMARY: 0 errors" in san
    assert re.search(r"^sanitize:T600-H8-K512-N3000-fp8_ds_mla-mixed\s+ok .* config=" + re.escape(new) + "$", san, re.M)
    for tool, n, summary in (("memcheck", 12, "ERROR SUMMARY: 0 errors"),
                             ("racecheck", 4, "RACECHECK SUMMARY: 0 hazards"), ("synccheck", 4, "ERROR SUMMARY: 0 errors")):
        log = (BENCH / "sweeps" / f"{tool}_fp8mma_balanced_h200_5b6d93c.log").read_text()
        assert f"{n}/{n} launches match the fp32 reference" in log and summary in log, tool
        assert f"T40 H8 K512 splits 1 programs 16 {new}: rel" in log, tool


def test_evidence_fp8mma_key_warps_h200():
    """NOTES round 17 / docs/kernels.md v22: four warps along the keys (`mla_gluon_fp8mma.KEY_WARPS`) taken apart
    beside the two-key-warp build, the 16-head prefill's token sweep, and what the shipped rule ran on the H200."""
    import torch

    from glm5lib.kernels import mla_gluon_fp8mma as fm

    res = load("sweeps/fp8mma_keywarps_h200_eae46c6.json")
    assert res["meta"]["commit"] == "eae46c6" and res["meta"]["device"] == "NVIDIA H200"
    assert res["meta"]["failed_checks"] == 0
    two, early4, slots4 = ("fp8mma-nbufG-f16-nplan-t8-eplan-b", "fp8mma-nbufG-f16-nplan-t8-eplan-b-k4",
                           "fp8mma-nbuf2-f16-nplan-t8-k4")
    checked = {r["config"] for r in res["rows"] if r.get("kernel") == "fp8mma" and r.get("ok")}
    assert {two, early4, slots4} <= checked
    # at eae46c6 key warps 4 with nbuf 0 took one slot (refilled early at one split): the "-eplan-b-k4" rows
    parts = {(r["kind"], r["B"], r["H"], r["config"]): r for r in res["rows"] if r.get("kind", "").startswith("ablate")}

    def w(kind, B, H, cfg, part="whole"):
        return round(parts[kind, B, H, cfg][part + "_us"], 1)

    # the table of v22 (whole kernel)
    assert [w("ablate-decode", 128, 8, c) for c in (two, early4, slots4)] == [82.3, 77.0, 73.9]
    assert [w("ablate-decode", 32, 8, c) for c in (two, early4, slots4)] == [29.9, 31.4, 30.3]
    assert [w("ablate-prefill", 4096, 8, c) for c in (two, early4, slots4)] == [1273.4, 2098.2, 1695.7]
    assert [w("ablate-prefill", 4096, 16, c) for c in (two, early4, slots4)] == [2418.8, 2392.3, 2320.9]
    assert [w("ablate-decode", 128, 16, c) for c in (two, early4, slots4)] == [101.1, 98.5, 102.5]
    assert [w("ablate-decode", 32, 16, c) for c in (two, early4, slots4)] == [34.5, 36.1, 37.1]
    # the parts: compute alone 8-head prefill 812 -> 1188, 16-head 1703 -> 1606; 8-head decode gathers 69 -> 63
    assert [round(w("ablate-prefill", 4096, 8, c, "compute")) for c in (two, slots4)] == [812, 1188]
    assert [round(w("ablate-prefill", 4096, 16, c, "compute")) for c in (two, slots4)] == [1703, 1606]
    assert [round(w("ablate-decode", 128, 8, c, "gathers")) for c in (two, slots4)] == [69, 63]
    waves = load("sweeps/fp8mma_waves16_keywarps_h200_eae46c6.json")
    by_t = {r["T"]: r for r in waves["rows"]}
    assert [round(by_t[T][f"{slots4}_us"]) for T in (528, 2112, 4096)] == [307, 1176, 2303]
    assert [round(by_t[T][f"{two}_us"]) for T in (528, 2112, 4096)] == [320, 1224, 2419]
    assert all(by_t[T][f"{c}_rel"] < 2e-3 for T in by_t for c in (two, early4, slots4))
    # the rule follows the table: four key warps for split lists at 8 heads, for whole lists at 16, two slots
    cpu = torch.device("cpu")  # 132 SMs assumed, the H200's
    assert fm.plan_key_warps(128, 2048, 1, cpu) == 4 and fm.plan_key_warps(32, 2048, 1, cpu) == 4
    assert fm.plan_key_warps(4096, 2048, 1, cpu) == 2 and fm.plan_key_warps(4096, 2048, 2, cpu) == 4
    assert fm.plan_key_warps(128, 2048, 2, cpu) == 2 and fm.ring_slots(0, 1, 4) == 2
    shipped = fm.config_name(fm.CONFIG_BY_CLASS["big"]._replace(wgmma=0))  # (round 19 added the wgmma rule)
    assert shipped == "fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan"
    # the benchmark, the matrix and the sanitizers ran the shipped rule at 97dc8b8 (archived under sweeps/ since the
    # H200 run at 6eaff6f)
    run = load("sweeps/bench_h200_97dc8b8.json")
    assert run["meta"]["commit"] == "97dc8b8"
    fp8 = {(r["kind"], r.get("B") or r.get("T"), r["H"]): r for r in run["rows"]
           if r["kind"] in ("prefill", "decode") and r.get("kv_format") == "fp8_ds_mla" and r["H"] <= 16
           and r["impl"] == "triton"}
    assert fp8 and {r["config"] for r in fp8.values()} == {shipped}
    assert round(fp8["decode", 128, 8]["us"], 1) == 77.7 and round(fp8["prefill", 4096, 16]["us"]) == 2320
    matrix = load("sweeps/checks_h200_full_97dc8b8.json")
    assert len(matrix) == 127 and all(r["ok"] for r in matrix)
    # the matrix's fp8-cache cases under each of the rule's answers
    took = set()
    for r in matrix:
        m = re.match(r"\w+:T(\d+)-H(\d+)-K(\d+)-", r["name"])
        if r.get("config") == shipped and m:
            T, H, K = (int(x) for x in m.groups())
            took.add((fm.head_groups(H), fm.plan_key_warps(T, K, fm.head_groups(H), cpu)))
    assert took == {(1, 2), (1, 4), (2, 2), (2, 4)}
    san = (BENCH / "sweeps" / "sanitizer_h200_97dc8b8.log").read_text()
    assert "28/28 cases pass" in san and "ERROR SUMMARY: 0 errors" in san
    assert re.search(r"^sanitize:T600-H16-K512-N3000-fp8_ds_mla-mixed\s+ok .* config=" + re.escape(shipped) + "$", san,
                     re.M)
    race = (BENCH / "sweeps" / "racecheck_fp8mma_keywarps_h200_97dc8b8.log").read_text()
    assert "4/4 cases pass" in race and "RACECHECK SUMMARY: 0 hazards" in race
    assert re.search(r"^sanitize:T600-H16-K512-N3000-fp8_ds_mla-mixed\s+ok .* config=" + re.escape(shipped) + "$", race,
                     re.M)


def test_evidence_fp8mma_round18_static_counts():
    """NOTES round 18 / docs/kernels.md v23 (no GPU run): the sm_90 loop of the shipped fp8-cache builds under Triton
    3.6 (`scripts/fp8mma_sass_count.py`), with `Config.widen`'s integer widening, and the shared-memory bytes a
    warp moves a tile, from which the round's lower bounds on the prefill follow (128 bytes a clock an SM at 1.98 GHz,
    no bank conflicts, 4096 tokens x 32 tiles of 64 keys over 132 SMs)."""
    import re

    def blocks(name):  # {(heads, "split" / "one-split", config): counts}
        out, key = {}, None
        for line in (BENCH / "sweeps" / name).read_text().splitlines():
            if line.startswith("triton "):
                head = re.match(r"triton 3\.6\.0, sm_90, (\d+) heads, (\S+) build", line).groups()
            elif m := re.match(r"(\S+): (\d+) instructions in the loop \(BAR \d+, F2F\* (\d+), (\d+)-key tile, "
                               r"(\d+) warps\)", line):
                key = (*head, m[1])
                out[key] = {"n": int(m[2]), "f2f": int(m[3]), "keys": int(m[4]), "warps": int(m[5])}
            elif m := re.match(r"  shared memory a warp a tile: (\d+) bytes read, (\d+) written", line):
                out[key].update(read=int(m[1]), written=int(m[2]))
        return out

    shipped = "fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan"
    widen = blocks("fp8mma_widen_sass_sm90_triton36.txt")
    assert [(widen["8", "one-split", shipped + s]["n"], widen["8", "one-split", shipped + s]["f2f"])
            for s in ("", "-i2", "-i4")] == [(1959, 544), (2751, 288), (3514, 32)]
    for H in ("8", "16"):
        for split in ("split", "one-split"):
            row = [widen[H, split, shipped + s] for s in ("", "-i1", "-i2", "-i4")]
            assert [r["n"] for r in row] == sorted(r["n"] for r in row)  # each chunk moved adds instructions
            assert row[0]["f2f"] > row[1]["f2f"] > row[2]["f2f"] > row[3]["f2f"]
    smem = blocks("fp8mma_smem_sass_sm90_triton36.txt")
    p8, p16 = smem["8", "one-split", shipped], smem["16", "one-split", shipped]
    assert (p8["n"], p8["read"], p8["written"]) == (1959, 60800, 22272)
    assert (p16["n"], p16["read"], p16["written"]) == (1618, 53568, 13184)
    assert (p8["keys"], p8["warps"], p16["keys"], p16["warps"]) == (64, 2, 64, 4)  # the bounds' program shapes
    tiles = 4096 * 32 / 132  # program tiles an SM

    def us(b, warps):  # a program's warps: two at 8 heads, four (key warps) at 16 in the one-split build
        return round(tiles * b * warps / 128 / 1.98e3)

    assert (us(p8["read"] + p8["written"], 2), us(p8["read"], 2)) == (651, 476)
    assert (us(p16["read"] + p16["written"], 4), us(p16["read"], 4)) == (1046, 840)
    # against the committed benchmark (97dc8b8): 51 % of the 8-head kernel's 1279.5 us, 45 % of the 16-head one's
    # 2320 us, 82 % of the time the 16-head 1.6x goal allows (FlashMLA's 2030.1 us / 1.6 = 1269 us)
    run = load("sweeps/bench_h200_97dc8b8.json")
    pre = {(r["impl"].split("(")[0], r["H"]): r["us"] for r in run["rows"] if r["kind"] == "prefill"
           and r["H"] in (8, 16) and "fp8_ds_mla" in (r.get("kv_format"), r.get("baseline_for"))}
    assert round(100 * us(p8["read"] + p8["written"], 2) / pre["triton", 8]) == 51
    assert round(100 * us(p16["read"] + p16["written"], 4) / pre["triton", 16]) == 45
    assert round(pre["flashmla", 16] / 1.6) == 1269
    assert round(100 * us(p16["read"] + p16["written"], 4) / (pre["flashmla", 16] / 1.6)) == 82
    # the rest of NOTES round 18's counts: widen 1 at prefill, the 8-head decode (split) build
    one = widen["8", "one-split", shipped + "-i1"]
    assert (one["n"], one["f2f"]) == (2344, 416)
    assert [(widen["8", "split", shipped + s]["n"], widen["8", "split", shipped + s]["f2f"]) for s in ("", "-i2")] == [
        (1213, 288), (1600, 160)]
    # and the bank conflicts it quotes from the 8-head prefill's Nsight Compute report at f7f4057
    ncu = (BENCH / "sweeps" / "ncu_fp8mma_prefill_h8_f7f4057.txt").read_text()
    assert re.search(r"represent\s+31\.19% of the overall \d+ wavefronts for shared loads", ncu)
    text = (BENCH / "sweeps" / "fp8mma_smem_sass_sm90_triton36.txt").read_text()
    # 16 heads: LDSM carries q's fragments (16 heads x 576 fp16 = 18432 bytes, 34 % of 53568) and the keys' rope
    assert re.search(r"16 heads, one-split build.*\n.*\n  shared memory.*LDSM\.16\.M88\.4 20480", text)
    assert round(100 * 16 * 576 * 2 / p16["read"]) == 34


def test_evidence_fp8mma_round19_wgmma_widen_and_batches():
    """NOTES round 19 / docs/kernels.md v24: S as wgmma in the four-key-warp build (H100 ablations and token sweeps,
    the H200's token sweep, checks and sanitizers), integer widening timed, the decode across batch sizes, and the
    Nsight Compute numbers the round's conclusion rests on (latency, not the shared-memory pipe)."""
    import re

    from glm5lib.bench import batches as kbatches
    from glm5lib.bench.parts import overlap

    k4, wg, wga = ("fp8mma-nbufG-f16-nplan-t8-eplan-b-k4" + s for s in ("", "-wg", "-wga"))

    def ablate(name):  # {(kind, B, H, config): row}, every fp8mma check of the run passed
        res = load(f"sweeps/{name}")
        assert res["meta"]["failed_checks"] == 0 and res["meta"]["device"] == "NVIDIA H100 80GB HBM3"
        checks = [r for r in res["rows"] if r.get("kernel") == "fp8mma"]
        assert checks and all(r["ok"] for r in checks)
        return {(r["kind"][7:], r["B"], r["H"], r["config"]): r for r in res["rows"]
                if r.get("kind", "").startswith("ablate")}

    a19, a19b = ablate("fp8mma_round19_h100_0c7cefd.json"), ablate("fp8mma_wgmma_h100_725782d.json")
    us = {k: round(r["whole_us"]) for k, r in a19b.items()}
    assert (us["prefill", 4096, 16, k4], us["prefill", 4096, 16, wga]) == (2296, 2143)  # v24b
    assert [round(a19b["prefill", 4096, 16, c]["compute_us"]) for c in (k4, wga)] == [1585, 1544]
    assert [round(a19b["decode", 128, 8, c]["whole_us"], 1) for c in (k4, wga)] == [88.4, 89.4]
    assert overlap(a19b["prefill", 4096, 16, wga]) > overlap(a19b["prefill", 4096, 16, k4])
    # v24a: a third fewer shared-memory bytes read (the sm_90 SASS under Triton 3.6), the same compute
    sass = (BENCH / "sweeps" / "fp8mma_wgmma_sass_sm90_triton36.txt").read_text()
    reads = [int(x) for x in re.findall(r"shared memory a warp a tile: (\d+) bytes read", sass)]
    assert reads == [53568, 35136, 41280, 32064]  # 16 heads one split, then 8 heads split: mma_v2, wgmma
    assert "16 heads, one-split build" in sass.splitlines()[0] and sass.count("HGMMA 36") == 2
    assert [round(a19["prefill", 4096, 16, c]["compute_us"]) for c in (k4, wg)] == [1584, 1597]
    assert [round(a19["prefill", 4096, 16, c]["whole_us"]) for c in (k4, wg)] == [2255, 2244]
    # v23a: widen 2 / 4 slower everywhere
    ship = "fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan"
    for kind, B, H, want in (("prefill", 4096, 8, [1306, 1641, 2333]), ("prefill", 4096, 16, [2300, 2417, 2829])):
        assert [round(a19[kind, B, H, ship + s]["whole_us"]) for s in ("", "-i2", "-i4")] == want
    assert [round(a19["decode", 128, 8, ship + s]["whole_us"], 1) for s in ("", "-i2", "-i4")] == [92.4, 93.2, 103.2]
    for key, r in a19.items():
        if key[3] in (ship + "-i2", ship + "-i4"):
            assert r["whole_us"] > a19[key[:3] + (ship,)]["whole_us"], key

    # the H200's token sweep: 2342 -> 2259 -> 2157 us at 4096 tokens, FlashMLA 1986 (0.85 -> 0.92x)
    res = load("sweeps/fp8mma_wgmma_waves16_h200_4812c4d.json")
    assert res["meta"]["gpu"] == "NVIDIA H200" and res["meta"]["heads"] == 16 and res["meta"]["slots"] == 264
    rows = {r["T"]: r for r in res["rows"]}
    assert all(r[c + "_rel"] < 2.5e-3 for r in rows.values() for c in (k4, wg, wga))
    assert [round(rows[4096][c + "_us"]) for c in (k4, wg, wga, "flashmla")] == [2342, 2259, 2157, 1986]
    assert [round(rows[2112][c + "_us"]) for c in (k4, wga)] == [1176, 1101]
    assert [round(rows[4096]["flashmla_us"] / rows[4096][c + "_us"], 2) for c in (k4, wga)] == [0.85, 0.92]
    checks = load("sweeps/fp8mma_wgmma_checks_h200_4812c4d.json")
    assert checks["meta"]["failed_checks"] == 0 and checks["meta"]["device"] == "NVIDIA H200"
    mine = [r for r in checks["rows"] if r.get("config") == wga]
    assert len(mine) == 26 and all(r["ok"] for r in mine)
    for tool in ("memcheck", "racecheck", "synccheck"):
        log = (BENCH / "sweeps" / f"{tool}_wgmma_h200_4812c4d.log").read_text()
        assert ("0 hazards" if tool == "racecheck" else "ERROR SUMMARY: 0 errors") in log
        assert sum(f'"config": "{wga}"' in ln and '"ok": true' in ln for ln in log.splitlines()) == 2

    # Nsight Compute (H100, c757078): the L1 / shared pipe half busy, issue slots 39 %, with and without wgmma
    def ncu(tag):
        text = (BENCH / "sweeps" / f"ncu_fp8mma_prefill_h16_{tag}_h100_c757078.txt").read_text()
        return {m: float(re.search(rf"{m}\s+\S+\s+([\d.]+)", text)[1])
                for m in ("L1/TEX Cache Throughput", "Issue Slots Busy", "Warp Cycles Per Issued Instruction")}

    assert list(ncu("k4").values()) == [55.54, 39.0, 4.95] and list(ncu("k4_wg").values()) == [46.25, 39.66, 4.81]

    # the decode across batch sizes (H100, c757078): every launch checked, the rule right at 17 of 20 batches
    run = kbatches.load_run(kbatches.run_path("fp8mma_batches_h100_c757078.json"))
    assert run["device"] == "NVIDIA H100 80GB HBM3" and len(run["rows"]) == 22 and kbatches.failed_checks(run) == []
    verdicts = {k: kbatches.rule_verdict(r) for k, r in run["rows"].items()}
    assert sorted(k for k, v in verdicts.items() if v["ok"] is False) == [(8, 8), (8, 256), (8, 512)]
    assert sum(v["ok"] is True for v in verdicts.values()) == 17
    speed = {k: r["flashmla_us"] / r["dispatch_us"] for k, r in run["rows"].items()}
    # "1.4-1.6x FlashMLA at 8 heads from B8 to B512, 1.1-1.5x at 16" (B136 apart), "1.55-1.85x at B1"
    assert all(1.38 < v < 1.6 for (H, B), v in speed.items() if H == 8 and B >= 8)
    assert all(1.1 < v < 1.5 for (H, B), v in speed.items() if H == 16 and B >= 8 and B != 136)
    assert 1.54 < speed[16, 1] < speed[8, 1] < 1.87
    assert round(speed[16, 136], 2) == 0.92 and run["rows"][16, 136]["rule_splits"] == 1
    assert all(abs(r["dispatch_again_us"] / r["dispatch_us"] - 1) < 0.07 for r in run["rows"].values())
    # "level": sparse_mla within 2 % of the build its rule took, at every batch the captured decode routes to it
    assert all(abs(r["dispatch_us"] / r[kbatches.rule_pick(r) + "_us"] - 1) < 0.02 for r in run["rows"].values()
               if r["graph_route"] == "fp8mma")
    first = kbatches.load_run(kbatches.run_path("fp8mma_batches_h100_0c7cefd.json"))  # the B512 rows' lost memory
    assert [k for k, r in first["rows"].items() if "error" in r] == [(8, 512), (16, 512)]
    gap = [r["dispatch_us"] / min(r["k2_us"], r["k4_us"]) - 1 for (H, B), r in first["rows"].items()
           if "error" not in r and B >= 64]
    assert sorted(g > 0.04 for g in gap) == [False] + [True] * 11 and max(gap) < 0.19  # NOTES: 4-19 % at 11 of 12


def test_evidence_fp8mma_round20_wgmma8_and_decode_key_warps():
    """NOTES round 20 / docs/kernels.md v25: four key warps with S as wgmma at 8 heads (no gain), the 16-head decode
    past 132 tokens under round 19's wgmma rule, the batches the captured decode's key-warps rule is fitted to, and
    the H100 matrix, sanitizer and benchmark of round 20's shipped code."""
    from glm5lib.bench import batches as kbatches
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    base = "fp8mma-nbufG-f16-nplan-t8-eplan-b-"
    ship, k4, k4wg = base + "kplan-wgplan", base + "k4", base + "k4-wga"
    k4wg1 = "fp8mma-nbuf1-f16-nplan-t8-eplan-b-k4-wga"
    res = load("sweeps/fp8mma_wgmma_waves8_h100_3fefa76.json")
    assert res["meta"]["heads"] == 8 and res["meta"]["gpu"] == "NVIDIA H100 80GB HBM3"
    rows = {r["T"]: r for r in res["rows"]}
    assert all(r[c + "_rel"] < 2.5e-3 for r in rows.values() for c in (ship, k4, k4wg, k4wg1))
    assert [round(rows[4096][c + "_us"]) for c in (ship, k4, k4wg, k4wg1, "flashmla")] == [1327, 1710, 1677, 2011, 1986]
    assert [round(rows[2112][c + "_us"]) for c in (ship, k4, k4wg)] == [690, 853, 858]
    r20 = load("sweeps/fp8mma_round20_h100_3fefa76.json")
    assert r20["meta"]["failed_checks"] == 0
    checks = [r for r in r20["rows"] if r.get("kernel") == "fp8mma"]
    assert len(checks) == 104 and all(r["ok"] for r in checks)
    ab = {(r["kind"][7:], r["B"], r["H"], r["config"]): r for r in r20["rows"]
          if r.get("kind", "").startswith("ablate")}
    assert [round(ab["prefill", 4096, 8, c]["compute_us"]) for c in (ship, k4, k4wg)] == [809, 1183, 1211]
    assert [round(ab["prefill", 4096, 16, c]["whole_us"]) for c in (k4, k4wg)] == [2318, 2125]

    # the 16-head decode past 132 tokens under round 19's rule (wgmma), against round 19's run (before it)
    now = kbatches.load_run(kbatches.run_path("fp8mma_batches_h100_3fefa76.json"))
    then = kbatches.load_run(kbatches.run_path("fp8mma_batches_h100_c757078.json"))
    assert kbatches.failed_checks(now) == [] and now["device"] == then["device"] == "NVIDIA H100 80GB HBM3"
    pairs = [(round(then["rows"][16, B]["dispatch_us"], 1), round(now["rows"][16, B]["dispatch_us"], 1))
             for B in (136, 192, 256, 512)]
    assert pairs == [(171.0, 150.5), (176.7, 157.4), (184.1, 164.7), (348.4, 311.7)]
    assert round(now["rows"][16, 136]["flashmla_us"] / now["rows"][16, 136]["dispatch_us"], 2) == 1.04

    # the key-warps rule's batches: the first two guesses' misses, then today's rule right at every one-split batch
    fill, fill2 = (kbatches.load_run(kbatches.run_path(f)) for f in
                   ("fp8mma_batches_fill_h100_59e3fa7.json", "fp8mma_batches_fill2_h100_87757bd.json"))
    assert (fill["commit"], fill2["commit"]) == ("59e3fa7", "87757bd")
    assert kbatches.failed_checks(fill) == kbatches.failed_checks(fill2) == []
    assert sorted(B for (H, B), r in fill["rows"].items() if kbatches.rule_verdict(r)["ok"] is False) == [448, 640]
    assert sorted(B for (H, B), r in fill2["rows"].items() if kbatches.rule_verdict(r)["ok"] is False) == [420, 600]
    assert fm.DECODE_K4_FILL == 0.9 and fm.DECODE_K4_WAVES == 1.5
    one_split = [r for run in (fill, fill2, now, then) for r in run["rows"].values()
                 if "error" not in r and r["graph_route"] == "fp8mma" and r["k4_splits"] == 1]
    assert len(one_split) == 32  # 10 + 6 batches at 8 heads, 4 + 4 at 8 and 16 heads in each full run
    for r in one_split:
        pick = kbatches.rule_now(r)
        assert r[pick + "_us"] <= (1 + kbatches.RULE_MARGIN) * min(r["k2_us"], r["k4_us"]), (r["H"], r["B"], pick)
    # the fitted rule tested on 8 new batches (round20d): right at 7, B230 four key warps 3.1 % faster (0.87 of a wave)
    fill3 = kbatches.load_run(kbatches.run_path("fp8mma_batches_fill3_h100_3d643c8.json"))
    assert kbatches.failed_checks(fill3) == [] and sorted(B for _, B in fill3["rows"]) == [230, 240, 300, 320, 384,
                                                                                          410, 640, 900]
    v3 = {B: kbatches.rule_verdict(r, pick=kbatches.rule_now(r)) for (H, B), r in fill3["rows"].items()}
    assert [B for B, v in v3.items() if not v["ok"]] == [230] and 1.03 < v3[230]["pick_us"] / v3[230]["best_us"] < 1.035
    assert all(kbatches.rule_now(r) == kbatches.rule_pick(r) for r in fill3["rows"].values())  # the rule it ran
    # the full sweep with the rule shipped: right at 19 of 20 (8 heads B8 apart), sparse_mla level with its pick
    full = kbatches.load_run(kbatches.run_path("fp8mma_batches_h100_3d643c8.json"))
    assert kbatches.failed_checks(full) == [] and len(full["rows"]) == 22
    vf = {k: kbatches.rule_verdict(r)["ok"] for k, r in full["rows"].items()}
    assert [k for k, v in vf.items() if v is False] == [(8, 8)] and sum(v is True for v in vf.values()) == 19
    assert [kbatches.rule_pick(full["rows"][8, B]) for B in (136, 192, 256, 512)] == ["k2", "k2", "k4", "k4"]
    assert all(abs(r["dispatch_us"] / r[kbatches.rule_pick(r) + "_us"] - 1) < 0.02 for r in full["rows"].values()
               if r["graph_route"] == "fp8mma")
    # notebook 04's prose of this run: 1.35-1.6x FlashMLA at 8 heads from B8, 1.1-1.5x at 16 (1.05x at B136); four
    # key warps 4-5 % faster than two at 8 heads B256 / B512, two 4 % faster at B8
    sp = {k: r["flashmla_us"] / r["dispatch_us"] for k, r in full["rows"].items()}
    assert all(1.35 <= v < 1.6 for (H, B), v in sp.items() if H == 8 and B >= 8)
    assert all(1.1 < v < 1.5 for (H, B), v in sp.items() if H == 16 and B >= 8 and B != 136)
    assert round(sp[16, 136], 2) == 1.05
    assert [round(full["rows"][8, B]["k2_us"] / full["rows"][8, B]["k4_us"] - 1, 2) for B in (256, 512)] == [0.04, 0.05]
    assert round(full["rows"][8, 8]["k4_us"] / full["rows"][8, 8]["k2_us"] - 1, 2) == 0.04
    three = (fill, fill2, fill3)
    per_token = [r["k2_us"] / B for run in three for (H, B), r in run["rows"].items() if B >= 300]
    assert 0.60 <= min(per_token) and max(per_token) < 0.715  # "0.60-0.71 us a token at B300-B1000"
    less = {(run["commit"], B): 1 - r["k4_us"] / r["k2_us"] for run in three for (H, B), r in run["rows"].items()}
    on = [v for (c, B), v in less.items() if B >= 400]  # "2-13 % less from 1.5 waves on"
    assert 0.02 < min(on) and max(on) < 0.13 and len(on) == 14
    assert all(v > 0.078 for (c, B), v in less.items() if B in (512, 520, 600, 700, 784, 1000))  # "8-13 %"
    lose = [-v for (c, B), v in less.items() if B in (300, 320, 384)]  # "lose 8-19 %"
    assert 0.07 < min(lose) and max(lose) < 0.195
    fitted = {B: 1 - r["k4_us"] / r["k2_us"] for run in (fill, fill2) for (H, B), r in run["rows"].items()}
    assert all(0.05 < fitted[B] < 0.13 for B in fitted if B >= 432)  # "by 5-13 % from B432"
    assert all(-0.18 < fitted[B] < -0.07 for B in (136, 192, 320, 384))  # "slower by 8-18 %"
    # the matrix and memcheck of round 20's shipped code, and memcheck of the four-key-warp one-split build
    rows = load("sweeps/checks_h100_full_59e3fa7.json")
    assert len(rows) == 127 and all(r["ok"] for r in rows)
    fp8mma = [r for r in rows if "fp8mma" in (r.get("config") or "")]
    assert len(fp8mma) >= 10 and {r["config"] for r in fp8mma} == {ship}
    log = (BENCH / "sweeps" / "memcheck_k4_h100_87757bd.log").read_text()
    assert "ERROR SUMMARY: 0 errors" in log and sum(f'"config": "{k4}"' in ln and '"ok": true' in ln
                                                    for ln in log.splitlines()) == 2
    for tool, summary in (("racecheck", "RACECHECK SUMMARY: 0 hazards"), ("synccheck", "ERROR SUMMARY: 0 errors")):
        log = (BENCH / "sweeps" / f"{tool}_k4_h100_592e597.log").read_text()  # one split, B300 at 8 heads
        assert summary in log and '"failed_checks": 0' in log, tool
        assert sum(f'"config": "{k4}"' in ln and '"ok": true' in ln and '"splits": 1' in ln
                   for ln in log.splitlines()) == 1, tool
    bench = load("sweeps/bench_h100_59e3fa7.json")
    targets = {t["target"]: t for t in bench["targets"]}
    assert bench["meta"]["commit"] == "59e3fa7" and sum(t["met"] for t in targets.values()) == 8
    assert round(targets["prefill fp8_ds_mla H16: speed-up vs FlashMLA bf16 padded to 64 (time)"]["value"], 2) == 0.97


def _dq_run(name: str, commit: str, checks: int) -> dict:
    """{(kind, H, impl): us} of a round-21 `gluon_mla_large_device.py` run on an H100, after its checks all passed."""
    res = load(f"sweeps/{name}")
    meta = res["meta"]
    assert meta["device"] == "NVIDIA H100 80GB HBM3" and meta["flashmla"] == "loaded" and meta["commit"][:7] == commit
    assert meta["checks_ok"] == meta["checks"] == checks and all(r.get("ok") for r in res["checks"])
    dq = [r for r in res["checks"] if r["config"] == "fp8_ds_mla:BN64-nbuf2-dq"]
    assert len(dq) == 8 and all(r["rel"] < 5e-3 for r in dq)  # every fp8 case of the script, against fp32
    return {(r["kind"], r["H"], r["impl"]): r.get("us") or r["ms"] * 1e3 for r in res["bench"] if "error" not in r}


def test_evidence_round21_dq_kernel_h100():
    """NOTES round 21 (v26): the dequantising-producer kernel (FlashMLA's sm_90 fp8 decode plan) at fp8 decode B128,
    its producer alone and its consumers alone, the producer's two fixes, the split plan fitted and tested on held-out
    batches, and the build that defers P V (slower). Every number the prose quotes."""
    from glm5lib.kernels import mla, mla_gluon_large as m

    dq, ks, fm = "gluon-wgmma:BN64-nbuf2-dq", "gluon-wgmma:BN64-nbuf2-async", "flashmla"
    v1 = _dq_run("gluon_large_dq_h100_7833ccf.json", "7833ccf", 88)  # the first build: whole tiles, 2 splits
    v2 = _dq_run("gluon_large_dq_h100_c1d5166.json", "c1d5166", 88)  # half tiles one half ahead
    v3 = _dq_run("gluon_large_dq_h100_58bd792.json", "58bd792", 88)  # index tiles one tile further ahead
    d = ("decode", 64)
    assert round(v1[d + (dq,)]) == 199 and round(v1[d + (ks,)]) == 189  # "199 us, the key-split kernel 189"
    assert round(v1[d + ("gluon-dq-probe1",)]) == 167 and round(v1[d + ("gluon-dq-probe2",)]) == 114
    # the consumers alone keep up with FlashMLA's whole kernel, the producer alone does not
    assert v1[d + ("gluon-dq-probe2",)] < v1[d + (fm,)] < v1[d + ("gluon-dq-probe1",)]
    assert round(v2[d + (dq,)]) == 177 and round(v2[("decode", 128, dq)]) == 233
    assert round(v2[d + ("gluon-dq-probe1",)]) == 172  # half tiles: the producer alone no faster
    assert round(v3[d + ("gluon-dq-probe1",)], 1) == 149.5  # indices a tile ahead: 172 -> 150
    # the split plan's data (B128): 1-4 splits, whole and producer alone
    fit = load("sweeps/dq_splits_h100_58bd792.json")
    assert fit["meta"]["commit"][:7] == "58bd792" and fit["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    whole = {r["splits"]: r["us"] for r in fit["rows"] if r.get("H") == 64 and r.get("probe") == 0
             and not r.get("planned") and "impl" not in r}
    assert [round(whole[s]) for s in (1, 2, 3, 4)] == [129, 183, 198, 216]
    alone1 = [r["us"] for r in fit["rows"] if r.get("H") == 64 and r.get("probe") == 1 and r["splits"] == 1]
    assert round(alone1[0]) == 103
    for s in (1, 2, 3, 4):  # the model's constants reproduce the four times within 4 %
        splits, keys = mla.split_keys(2048, s, 64)
        waves = -(-(128 * splits) // 132)
        model = waves * (keys // 64 * m.DQ_TILE_US + m.DQ_PROGRAM_US) + (m.DQ_MERGE_US if splits > 1 else 0)
        assert abs(model / whole[s] - 1) < 0.04, (s, model, whole[s])
    # held out (B16-B200, 64 and 128 heads): today's plan is the fastest split count tried, within 1 %, at all 8
    held = load("sweeps/dq_splits_heldout_h100_c1ec177.json")
    assert held["meta"]["commit"][:7] == "c1ec177"
    shapes = {(r["B"], r["H"]) for r in held["rows"]}
    assert len(shapes) == 8
    for B, H in shapes:
        rows = [r for r in held["rows"] if (r["B"], r["H"]) == (B, H) and "impl" not in r]
        plan = [r for r in rows if r["planned"]]
        assert len(plan) == 1 and plan[0]["splits"] == m.dq_num_splits(B, -(-H // 64), 2048, 132), (B, H)
        assert len(rows) >= 2 and plan[0]["us"] <= 1.01 * min(r["us"] for r in rows), (B, H)
    vs_fm = [r["us"] / p["us"] for r in held["rows"] if r.get("impl") == "flashmla"
             for p in held["rows"] if p.get("planned") and (p["B"], p["H"]) == (r["B"], r["H"])]
    assert len(vs_fm) == 8 and round(min(vs_fm), 2) == 0.77 and round(max(vs_fm), 2) == 0.93  # "0.77-0.93x there"
    # the full run at 1e053bb (the plan and the dispatch): decode and fp8 prefill against the key-split kernel
    full = _dq_run("gluon_large_dq_full_h100_1e053bb.json", "1e053bb", 88)
    for H, want in ((64, 0.95), (128, 0.91)):
        assert round(full["decode", H, fm] / full["decode", H, dq], 2) == want
    assert round(full["prefill", 64, dq] / 1e3, 2) == 3.10 and round(full["prefill", 64, ks] / 1e3, 2) == 4.45
    assert round(full["prefill", 128, dq] / 1e3, 2) == 6.04 and round(full["prefill", 128, ks] / 1e3, 2) == 8.69
    vs_bf16 = [full["prefill", H, fm] / full["prefill", H, dq] for H in (64, 128)]  # FlashMLA's bf16 prefill
    assert [round(x, 2) for x in vs_bf16] == [0.74, 0.68]  # "0.68-0.74x FlashMLA's bf16 prefill"
    # deferring P V behind the next S (807ef42) was slower at all four shapes
    defer = _dq_run("gluon_large_dq_defer_h100_807ef42.json", "807ef42", 96)
    for kind, H in (("decode", 64), ("decode", 128), ("prefill", 64), ("prefill", 128)):
        assert defer[kind, H, "gluon-wgmma:BN64-nbuf2-dq-defer"] > 1.03 * defer[kind, H, dq], (kind, H)
    # widening by integer and bf16x2 instructions (7aa6a4b): bit-identical to the conversion unit's, not faster
    wi = load("sweeps/gluon_large_dq_int_h100_7aa6a4b.json")
    assert wi["meta"]["commit"][:7] == "7aa6a4b" and wi["meta"]["checks_ok"] == wi["meta"]["checks"] == 98
    same = [r for r in wi["checks"] if r["case"].startswith("int-widening")]
    assert len(same) == 2 and all(r["identical"] and r["ok"] for r in same)
    t = {(r["H"], r["impl"]): r["us"] for r in wi["bench"] if "us" in r}
    assert round(t[64, "gluon-dq-probe1"], 1) == 103.1 and round(t[64, "gluon-dq-int-probe1"], 1) == 111.0
    assert round(t[64, "gluon-dq-probe2"], 1) == 78.4  # the consumers alone at one split
    # the producer alone moves the decode's rows at 1.7 TB/s, 55 % of the H100's copy rate in the 1e053bb run
    from glm5lib.bench.kernels import sparse_mla_kv_bytes

    rate = sparse_mla_kv_bytes(128, 2048, "fp8_ds_mla") / (t[64, "gluon-dq-probe1"] * 1e-6) / 1e12
    copy = load("sweeps/bench_h100_1e053bb.json")["ceilings"]["copy_GBps"] / 1e3
    assert round(rate, 1) == 1.7 and round(100 * rate / copy) == 55, (rate, copy)
    for H in (64, 128):
        assert t[H, "gluon-wgmma:BN64-nbuf2-dq-int"] >= t[H, "gluon-wgmma:BN64-nbuf2-dq"], H
    # the matrix, memcheck, synccheck and racecheck of the shipped code (e6bb2f0)
    rows = load("sweeps/checks_h100_full_e6bb2f0.json")
    assert len(rows) == 127 and all(r["ok"] for r in rows)
    assert len([r for r in rows if r.get("config") == "gluon-BN64-nbuf2-dq"]) >= 5
    sweeps = BENCH / "sweeps"
    assert "ERROR SUMMARY: 0 errors" in (sweeps / "synccheck_dq_h100_e6bb2f0.log").read_text()
    race = (sweeps / "racecheck_dq_h100_e6bb2f0.log").read_text()
    assert "config=gluon-BN64-nbuf2-dq" in race and "1/1 cases pass" in race
    # racecheck's hazards: only the values handed over by a barrier and a one-thread mbarrier arrive and Triton's
    # warp-specialize captures, as in the ping-pong kernel (NOTES round 4). The line numbers are those of e6bb2f0's
    # mla_gluon_large.py: 876 / 888 the rescale factor `sc` (stored, loaded), 897 / 905 the final row statistics
    # `sml`, 910 the kernel's def line, 972 its `warp_specialize` call
    lines = set(int(x) for x in re.findall(r"mla_gluon_large\.py:(\d+)", race))
    assert lines == {876, 888, 897, 905, 910, 972}, lines
    bench = load("sweeps/bench_h100_1e053bb.json")
    targets = {t["target"]: t for t in bench["targets"]}
    assert bench["meta"]["commit"][:7] == "1e053bb" and sum(t["met"] for t in targets.values()) == 10
    for H, want in ((64, 0.95), (128, 0.90)):
        t = targets[f"decode fp8 H{H} B128: ratio to FlashMLA"]
        assert t["met"] and round(t["value"], 2) == want


def _small_batch_run(name: str, commit: str) -> dict:
    """{(format, H, B, impl): row} of a round-22 `scripts/large_small_batch_probe.py` run on an H100, after every
    launch (Gluon, Triton, FlashMLA) matched the fp32 reference."""
    res = load(f"sweeps/{name}")
    meta = res["meta"]
    assert meta["device"] == "NVIDIA H100 80GB HBM3" and meta["commit"][:7] == commit and meta["flashmla"] == "loaded"
    assert len(res["rows"]) == 135 and all(r["ok"] and r["rel_err"] < 1e-2 for r in res["rows"])
    return {(r["format"], r["H"], r["B"], r["impl"]): r for r in res["rows"]}


def test_evidence_round22_large_heads_at_small_batches_h100():
    """NOTES round 22 (v27): the 32-128-head decode at B1-B128, Gluon beside Triton, before and after the pre-bound
    launch; the dispatch threshold (`mla.GLUON_LARGE_MIN_HT`) against those runs; the dq split plan's margin."""
    from glm5lib.kernels import mla, mla_gluon_large as m

    before = _small_batch_run("large_small_batch_h100_024dda2.json", "024dda2")
    after = _small_batch_run("large_small_batch_h100_06d1f89.json", "06d1f89")
    shapes = {k[:3] for k in after}
    above = {s for s in shapes if mla.gluon_large_shape(s[2], s[1], s[0])}
    below = shapes - above
    assert len(shapes) == 54 and len(above) == 36

    def ratio(s, t="graph_us"):
        return after[s + ("gluon",)][t] / after[s + ("triton",)][t]

    # from 512 tokens x heads the Gluon kernels took 0.42-0.78x the Triton kernel's time, graph and eager alike
    for t, low in (("graph_us", 0.42), ("eager_us", 0.41)):
        r = [ratio(s, t) for s in above]
        assert round(min(r), 2) == low and round(max(r), 2) == 0.78, t
    # below it: 0.63-1.02x in graph replay; eager, the Triton kernel won at 14 of the 18 by 5-29 us a call
    assert [round(f(ratio(s) for s in below), 2) for f in (min, max)] == [0.63, 1.02]
    extra = [after[s + ("gluon",)]["eager_us"] - after[s + ("triton",)]["eager_us"] for s in below]
    won = [x for x in extra if x > 0]
    assert len(won) == 14 and round(min(won)) == 5 and round(max(won)) == 29
    # below it eager calls are host-bound: most 25-36 us a call against 12-35 us of GPU time; a capture-only rule from
    # one token would save up to 13 us a layer there (32 heads B8)
    eager_below = [after[s + (k,)]["eager_us"] for s in below for k in ("gluon", "triton")]
    assert sum(25 <= x <= 36 for x in eager_below) >= 0.75 * len(eager_below)
    gpu_below = [after[s + (k,)]["graph_us"] for s in below for k in ("gluon", "triton")]
    assert [round(f(gpu_below)) for f in (min, max)] == [12, 35]
    saved = {s: after[s + ("triton",)]["graph_us"] - after[s + ("gluon",)]["graph_us"] for s in below}
    assert max(saved, key=saved.get)[1:] == (32, 8) and round(max(saved.values())) == 13
    # the examples quoted: fp8 64 heads B8 / B32 / B64, bf16 128 heads B4 (Triton -> Gluon, graph replay)
    quoted = {("fp8_ds_mla", 64, 8): (50.6, 29.3), ("fp8_ds_mla", 64, 32): (92.5, 58.1),
              ("bf16", 128, 4): (44.7, 25.3)}
    for s, want in quoted.items():
        assert tuple(round(after[s + (k,)]["graph_us"], 1) for k in ("triton", "gluon")) == want, s
    s64 = ("fp8_ds_mla", 64, 64)
    assert (round(after[s64 + ("triton",)]["graph_us"]), round(after[s64 + ("gluon",)]["graph_us"])) == (173, 92)
    # before the pre-bound launch: eager Gluon / Triton 0.42-9.8x, the Triton kernel's eager call 29-91 us at B1-B16
    e = [before[s + ("gluon",)]["eager_us"] / before[s + ("triton",)]["eager_us"] for s in shapes]
    assert round(min(e), 2) == 0.42 and round(max(e), 1) == 9.8
    g = [before[s + ("gluon",)]["graph_us"] / before[s + ("triton",)]["graph_us"] for s in shapes]
    g64 = [before[s + ("gluon",)]["graph_us"] / before[s + ("triton",)]["graph_us"] for s in shapes
           if s[1] == 64 and s[2] >= 8]
    assert [round(f(g), 2) for f in (min, max)] == [0.42, 1.02]
    assert [round(f(g64), 2) for f in (min, max)] == [0.45, 0.78]
    tri = [before[s + ("triton",)]["eager_us"] for s in shapes if s[2] <= 16]
    assert round(min(tri)) == 29 and round(max(tri)) == 91
    # against FlashMLA (fp8, graph replay): 0.81-1.43x at B1-B64, 1.03-1.43x at 32 heads (FlashMLA pads to 64)
    fm = {s: after[s + ("flashmla",)]["graph_us"] / after[s + ("gluon",)]["graph_us"] for s in shapes
          if s[0] == "fp8_ds_mla" and s[2] <= 64}
    assert [round(f(fm.values()), 2) for f in (min, max)] == [0.81, 1.43]
    assert round(min(v for s, v in fm.items() if s[1] == 32), 2) == 1.03
    # the pre-bound launch: Gluon's eager calls at B1-B16 took 64-130 us through Gluon's binder (three outliers
    # 279-409), 32-36 us where host-bound after; its GPU time the same in both runs (graph replay within 2.5 %)
    small = [s for s in shapes if s[2] <= 16]
    pre = sorted(before[s + ("gluon",)]["eager_us"] for s in small)
    assert round(pre[0]) == 64 and round(pre[-4]) == 129 and pre[-3] > 275
    post = [after[s + ("gluon",)]["eager_us"] for s in small]
    assert sum(31.5 < x < 36 for x in post) == 21
    drift = [after[s + ("gluon",)]["graph_us"] / before[s + ("gluon",)]["graph_us"] for s in shapes
             if s != ("fp8_ds_mla", 128, 96)]  # the split plan changed there (2 splits -> 1)
    assert max(abs(x - 1) for x in drift) < 0.025
    # the dq split plan at B96, 128 heads: 2 splits (the least modelled time) 246.5 us before, 1 split 223.3 after
    k = ("fp8_ds_mla", 128, 96, "gluon")
    assert (before[k]["splits"], round(before[k]["graph_us"], 1)) == (2, 246.5)
    assert (after[k]["splits"], round(after[k]["graph_us"], 1)) == (1, 223.3) == (m.dq_num_splits(96, 2, 2048, 132),
                                                                                   223.3)
    # the margin's run: where it changes the plan, the least modelled time's two splits took 4-11 % longer than one;
    # in one wave the least modelled time was as fast or faster (0-3 %): the margin applies to several waves only
    res = load("sweeps/dq_splits_margin_h100_06d1f89.json")
    assert res["meta"]["commit"][:7] == "06d1f89" and res["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    us = {(r["B"], r["H"], r["splits"]): r["us"] for r in res["rows"] if "impl" not in r and not r["planned"]}
    us.update({(r["B"], r["H"], r["splits"]): r["us"] for r in res["rows"] if r.get("planned")})
    saved = m.DQ_SPLIT_MARGIN
    try:
        m.DQ_SPLIT_MARGIN = 0.0
        least = {(B, H): m.dq_num_splits(B, H // 64, 2048, 132) for B, H, _ in us}
    finally:
        m.DQ_SPLIT_MARGIN = saved
    today = {(B, H): m.dq_num_splits(B, H // 64, 2048, 132) for B, H, _ in us}
    moved = {bh for bh in today if today[bh] != least[bh]}
    assert moved == {(80, 128), (96, 128), (150, 64), (180, 64)}
    gain = [us[bh + (least[bh],)] / us[bh + (today[bh],)] - 1 for bh in moved]
    assert round(100 * min(gain)) == 4 and round(100 * max(gain)) == 11 and all(today[bh] == 1 for bh in moved)
    one_wave = {(12, 128): 5, (20, 64): 6, (24, 64): 5}  # where the margin alone would have moved the plan
    for bh, s in one_wave.items():
        assert today[bh] == least[bh] == s
        fewer = us[bh + (s - 1,)] / us[bh + (s,)] - 1
        assert -0.001 < fewer < 0.035, (bh, fewer)
    # the reason (the margin's comment): two waves of one split ran below the 257 us the model charges them, 244-246 us
    # at 64 heads B150-B200 and 223-231 at 128 heads B80-B128, while three waves of two splits matched it at B150
    c1 = load("sweeps/dq_splits_heldout_h100_c1ec177.json")["rows"]
    fit = load("sweeps/dq_splits_h100_58bd792.json")["rows"]
    two_waves_64 = [us[150, 64, 1], us[180, 64, 1]] + [r["us"] for r in c1 if (r.get("B"), r.get("H"), r.get("splits"),
                                                                              r.get("planned")) == (200, 64, 1, True)]
    two_waves_128 = [us[80, 128, 1], us[96, 128, 1], after[k]["graph_us"]] + [
        r["us"] for r in fit if (r.get("B"), r.get("H"), r.get("splits"), r.get("probe")) == (128, 128, 1, 0)]
    assert [round(f(two_waves_64)) for f in (min, max)] == [244, 246]
    assert [round(f(two_waves_128)) for f in (min, max)] == [223, 231]
    assert m.dq_split_costs(150, 1, 2048, 132)[1] == (257.0, 2) == m.dq_split_costs(96, 2, 2048, 132)[1]
    assert round(m.dq_split_costs(150, 1, 2048, 132)[2][0]) == 254 == round(us[150, 64, 2])


def test_evidence_round22_held_out_split_plan_and_the_matrix_h100():
    """NOTES round 22 (v27d-e): the dq split plan held out at B70 / B140 / B190 after its margin was fitted, and the
    case matrix and memcheck at 6f7cc40 with the Gluon kernels from 512 tokens x heads."""
    from glm5lib.kernels import mla_gluon_large as m

    res = load("sweeps/dq_splits_heldout2_h100_6f7cc40.json")
    assert res["meta"]["commit"][:7] == "6f7cc40" and res["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    rows = [r for r in res["rows"] if "impl" not in r]
    shapes = {(r["B"], r["H"]) for r in rows}
    assert shapes == {(B, H) for B in (70, 140, 190) for H in (64, 128)}
    moved = []
    for B, H in shapes:
        plan = [r for r in rows if (r["B"], r["H"]) == (B, H) and r["planned"]]
        others = [r for r in rows if (r["B"], r["H"]) == (B, H) and not r["planned"]]
        assert len(plan) == 1 and plan[0]["splits"] == m.dq_num_splits(B, H // 64, 2048, 132) == 1
        assert others and all(plan[0]["us"] < r["us"] for r in others), (B, H)  # the fastest tried at all 6
        costs = m.dq_split_costs(B, H // 64, 2048, 132)
        if min(costs, key=lambda s: (costs[s][0], s)) != 1:  # the least modelled time alone would take 2 splits
            moved.append(min(r["us"] for r in others) / plan[0]["us"] - 1)
    assert len(moved) == 3 and round(100 * min(moved), 1) == 1.4 and round(100 * max(moved), 1) == 11.2
    fm = {(r["B"], r["H"]): r["us"] for r in res["rows"] if r.get("impl") == "flashmla"}
    plan = {(r["B"], r["H"]): r["us"] for r in rows if r["planned"]}
    vs = sorted(fm[s] / plan[s] for s in shapes)
    assert round(vs[0], 2) == 0.62 and round(vs[-1], 2) == 0.92  # FlashMLA's balanced scheduler at partial waves
    # the matrix and memcheck of the shipped code with the new dispatch
    cases = load("sweeps/checks_h100_full_6f7cc40.json")
    assert len(cases) == 127 and all(r["ok"] for r in cases)
    gluon = [r["name"] for r in cases if str(r.get("config", "")).startswith("gluon-")]
    assert len(gluon) == 46 and sum(n.startswith("invalid:T33-") for n in gluon) == 20
    log = (BENCH / "sweeps" / "sanitizer_h100_6f7cc40.log").read_text()
    assert "28/28 cases pass on cuda" in log and "ERROR SUMMARY: 0 errors" in log
    assert log.count("config=gluon-") == 10 and "sanitize:T4-H128-K2048-N3000-fp8_ds_mla-oob" in log


def _tail_runs(name: str, commit: str, fmt: str) -> tuple[dict, list]:
    res = load(f"sweeps/{name}")
    assert res["meta"]["commit"][:7] == commit and res["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    assert res["meta"]["sm_count"] == 132 and all(r["ok"] for r in res["rows"])
    by = {(r["H"], r["B"], r["impl"]): r for r in res["rows"]}
    shapes = sorted({(r["H"], r["B"]) for r in res["rows"]})
    assert all(r.get("format", fmt) == fmt for r in res["rows"]) and len(shapes) == 18
    return by, shapes


def test_evidence_round23_tail_plan_h100():
    """NOTES round 23 (v28a-b), docs/kernels.md v28: one launch of the split plan against the tail plan at 64 and 128
    heads, dq (fp8 rows, FlashMLA beside it) and ping-pong (bf16 rows); the threshold `TAIL_MIN_SPLITS` as the runs
    place it, and the numbers the prose quotes."""
    from glm5lib.kernels import mla_gluon_large as m

    dq, shapes = _tail_runs("dq_tail_h100_18bdc50.json", "18bdc50", "fp8_ds_mla")
    pp, pp_shapes = _tail_runs("pp_tail_h100_87ef2d1.json", "87ef2d1", "bf16")
    assert shapes == pp_shapes
    gain, fm_one, fm_tail, pp_gain = [], [], [], {}
    for H, B in shapes:
        one, tail, fm = dq[H, B, "one_launch"], dq[H, B, "tail"], dq[H, B, "flashmla"]
        assert tuple(tail["cut"]) == m.tail_plan(B, H // 64, 2048, 132) and one["rest"] == B * H // 64 % 132
        assert 1 <= one["rest"] <= 66 and one["waves"] >= 2 and m.dq_num_splits(B, H // 64, 2048, 132) == 1
        gain.append(tail["graph_us"] / one["graph_us"])
        fm_one.append(fm["graph_us"] / one["graph_us"])
        fm_tail.append(fm["graph_us"] / tail["graph_us"])
        p_one, p_tail = pp[H, B, "one_launch"], pp[H, B, "tail"]
        assert tuple(p_tail["cut"]) == m.tail_plan(B, H // 64, 2048, 132, "pingpong")
        pp_gain[H, B] = (p_tail["cut"][1], p_tail["graph_us"] / p_one["graph_us"])
    assert max(gain) < 1 and (round(min(gain), 2), round(max(gain), 2)) == (0.63, 0.92)
    assert (round(min(fm_one), 2), round(max(fm_one), 2), round(min(fm_tail), 2), round(max(fm_tail), 2)) == (
        0.60, 0.89, 0.85, 1.04)
    quoted = {(128, 70): (221.2, 149.2), (64, 140): (238.7, 162.3), (64, 198): (245.7, 225.0)}
    for (H, B), pair in quoted.items():
        assert (round(dq[H, B, "one_launch"]["graph_us"], 1), round(dq[H, B, "tail"]["graph_us"], 1)) == pair
    # the ping-pong kernel: faster from 3 splits of the rest everywhere, not with 2: the threshold its calls take
    three = [g for s, g in pp_gain.values() if s >= m.TAIL_MIN_SPLITS["pingpong"]]
    two = [g for s, g in pp_gain.values() if s < m.TAIL_MIN_SPLITS["pingpong"]]
    assert m.TAIL_MIN_SPLITS == {"dq": 2, "pingpong": 3} and len(three) == 14 and len(two) == 4
    assert max(three) < 1 and (round(min(three), 2), round(max(three), 2)) == (0.70, 0.98)
    assert max(two) > 1 and (round(min(two), 2), round(max(two), 2)) == (0.95, 1.04)
    assert pp_gain[64, 198][1] > 1 and all(s == 2 for s, _ in (pp_gain[64, 198], pp_gain[128, 96]))
    assert (round(pp[128, 67, "one_launch"]["graph_us"], 1), round(pp[128, 67, "tail"]["graph_us"], 1)) == (
        158.8, 110.6)
    # correctness: memcheck of the dq tail cases, the matrix with both kernels on the tail plan, the harness
    log = (BENCH / "sweeps" / "memcheck_dq_tail_h100_18bdc50.log").read_text()
    assert "7/7 dq launches match the reference" in log and "ERROR SUMMARY: 0 errors" in log
    assert "T140 H64 K2048 mixed tail 132 tokens + 16 splits: ok" in log
    assert "T70 H128 K1000 oob tail 66 tokens + 16 splits: ok" in log
    log = (BENCH / "sweeps" / "memcheck_tail_h100_c4512b1.log").read_text()  # both kernels' tail plans, shipped
    assert "9/9 launches match the reference" in log and "ERROR SUMMARY: 0 errors" in log
    for kernel, cut in (("dq", "T140 H64 K2048 mixed tail 132 tokens + 16 splits"),
                        ("dq", "T70 H128 K1000 oob tail 66 tokens + 16 splits"),
                        ("pingpong", "T140 H64 K2048 mixed tail 132 tokens + 16 splits"),
                        ("pingpong", "T70 H128 K1000 oob tail 66 tokens + 8 splits")):
        assert f"{kernel} {cut}: ok" in log, (kernel, cut)
    for name in ("checks_h100_full_pptail_87ef2d1.json", "checks_h100_full_18bdc50.json",
                 "checks_h100_full_c4512b1.json"):
        cases = load(f"sweeps/{name}")
        assert len(cases) == 127 and all(r["ok"] for r in cases)
        t160 = {r["name"]: r["config"] for r in cases if r["name"].startswith("invalid:T160-")}
        assert len(t160) == 6 and {c for c in t160.values()} == {"gluon-BN64-nbuf2-pingpong", "gluon-BN64-nbuf2-dq"}
    assert [m.tail_plan(160, -(-H // 64), 2048, 132) for H in (40, 64, 128)] == [(132, 4), (132, 4), (132, 2)]
    graphs = load("sweeps/vllm_graphs_h100_18bdc50.json")
    s = graphs["summary"]
    assert graphs["commit"][:7] == "18bdc50" and s["graph_cases"] == s["graph_cases_ok"] == 24
    assert s["replay_equals_eager"] and round(s["graph_over_kernel_max"], 2) == 1.08
    bench = load("sweeps/bench_h100_18bdc50.json")
    targets = bench["targets"]
    assert bench["meta"]["commit"][:7] == "18bdc50" and sum(t["met"] for t in targets) == 10 and len(targets) == 22
    assert sum(bool(t.get("bounded")) and not t["met"] for t in targets) == 6
    h8 = [t for t in targets if t["target"].startswith("prefill fp8_ds_mla H8")][0]
    assert round(h8["value"], 2) == 1.55 and not h8["met"]
    fm8 = [r["us"] for r in bench["rows"]
           if r["kind"] == "prefill" and r["H"] == 8 and r["impl"] == "flashmla(h_pad=64)"]
    assert sorted(round(u) for u in fm8) == [2035, 2090]  # FlashMLA's padded bf16 prefill, twice in one run
    eager_b1 = s["sparse_mla_over_flashmla_eager_b1"].values()
    assert (round(min(eager_b1), 2), round(max(eager_b1), 2)) == (0.83, 0.98)
    # the ranges the code comment and docs/kernels.md quote: one launch, two waves, and the shapes' GPU times
    one64 = [dq[64, B, "one_launch"]["graph_us"] for B in (133, 140, 150, 160, 170, 180, 198)]
    one128 = [dq[128, B, "one_launch"]["graph_us"] for B in (67, 70, 75, 80, 85, 96, 99)]
    assert (round(min(one64)), round(max(one64)), round(min(one128)), round(max(one128))) == (235, 246, 221, 226)
    times = [r["graph_us"] for res in (dq, pp) for r in res.values() if "graph_us" in r and r["impl"] != "flashmla"]
    assert (round(min(times)), round(max(times))) == (111, 363)
    # the probe's host-bound eager rows (ping-pong tail plan, two public calls composed)
    assert [round(pp[128, B, "tail"]["eager_us"]) for B in (67, 75)] == [160, 535]
    assert [round(pp[128, B, "tail"]["graph_us"]) for B in (67, 75)] == [111, 128]
    round22 = {(r["B"], r["H"]): r["us"]
               for f in ("dq_splits_margin_h100_06d1f89.json", "dq_splits_heldout2_h100_6f7cc40.json")
               for r in load(f"sweeps/{f}")["rows"] if r.get("planned") and r["H"] == 64}
    two_waves = [round22[B, 64] for B in (140, 150, 180, 190)]
    assert (round(min(two_waves)), round(max(two_waves))) == (239, 245)  # docs v28: one split, two waves, 64 heads


def _bal_runs(name: str, commit: str) -> dict:
    """(H, B, impl) -> row of `sweeps/<name>` (scripts/balanced_probe.py), every launch checked against fp32."""
    run = load(f"sweeps/{name}")
    assert run["meta"]["commit"][:7] == commit and run["meta"]["sm_count"] == 132 and "H100" in run["meta"]["device"]
    assert run["meta"]["flashmla"] == "loaded" and all(r["ok"] for r in run["rows"])
    return {(r["H"], r["B"], r["impl"]): r for r in run["rows"]}


def test_evidence_round24_balanced_schedule_h100():
    """NOTES round 24 (v29a-b), docs/kernels.md v29, the README bullet: the dq kernel's split plan against the
    balanced schedule below one wave (FlashMLA beside them), the rule `BAL_MAX_FILL` as the run places it, the
    numbers the prose quotes, and the sanitizer logs."""
    from glm5lib.kernels import mla_gluon_large as m

    runs = _bal_runs("dq_bal_h100_f0ad6ed.json", "f0ad6ed")
    shapes = sorted({(H, B) for H, B, _ in runs})
    assert len(runs) == 92 and len(shapes) == 23
    ratio, fm_best = {}, []
    for H, B in shapes:
        plan, bal, fm = runs[H, B, "plan"], runs[H, B, "balanced"], runs[H, B, "flashmla"]
        n_hb = H // 64
        assert plan["splits"] == m.dq_num_splits(B, n_hb, 2048, 132) and bal["bal_programs"] == 132
        ratio[H, B] = bal["graph_us"] / plan["graph_us"]
        fm_best.append(fm["graph_us"] / min(plan["graph_us"], bal["graph_us"]))
    assert {k: round(v, 2) for k, v in ratio.items() if v < 0.96} == {(64, 68): 0.94, (128, 34): 0.88}
    level = [round(ratio[k], 2) for k in ((64, 48), (64, 76), (128, 24), (128, 40))]
    assert level == [1.0, 1.0, 0.97, 0.99]
    worse = [v for k, v in ratio.items() if k not in {(64, 68), (128, 34), (128, 24), (64, 48), (64, 76), (128, 40)}]
    assert (round(min(worse), 2), round(max(worse), 2)) == (1.01, 1.38)
    assert (round(runs[64, 128, "balanced"]["graph_us"], 1), round(runs[64, 128, "plan"]["graph_us"], 1)) == (
        178.7, 129.6)
    behind = [v for v in fm_best if v < 1]  # FlashMLA's time over the better of ours: below 1 where it is faster
    assert len(behind) == 22 and (round(min(behind), 2), round(max(behind), 2)) == (0.78, 0.96)
    assert round(runs[64, 100, "flashmla"]["graph_us"] / runs[64, 100, "plan"]["graph_us"], 2) == 1.04
    assert [round(runs[64, B, "flashmla"]["graph_us"], 1) for B in (8, 32)] == [24.0, 54.4]
    assert [round(runs[64, B, "plan"]["graph_us"], 1) for B in (8, 32)] == [28.7, 58.1]
    fm128 = [runs[128, B, "flashmla"]["graph_us"] / min(runs[128, B, "plan"]["graph_us"],
                                                        runs[128, B, "balanced"]["graph_us"]) for B in (16, 20, 24, 28)]
    assert (round(min(fm128), 2), round(max(fm128), 2)) == (0.78, 0.87)
    # the rule: one split on at most BAL_MAX_FILL of the SMs; the run's wins sit inside it, its losses outside
    assert m.BAL_MAX_FILL == 0.55
    for (H, B), v in ratio.items():
        taken = m.balanced_plan(B, H // 64, 2048, 132) is not None
        assert not taken or v < 1, (H, B)
    assert [B for B in range(1, 132) if m.balanced_plan(B, 1, 2048, 132)] == list(range(67, 73))
    assert [B for B in range(1, 66) if m.balanced_plan(B, 2, 2048, 132)] == [34, 35, 36]
    # correctness: memcheck of every dq plan and the ping-pong tail, synccheck / racecheck of the balanced cases
    log = (BENCH / "sweeps" / "memcheck_dq_bal_h100_f0ad6ed.log").read_text()
    assert "13/13 launches match the reference" in log and "ERROR SUMMARY: 0 errors" in log
    for case in ("T70 H64 K2048 mixed balanced", "T34 H128 K2048 oob balanced", "T6 H40 K2048 allinv balanced",
                 "T5 H64 K2048 neg balanced"):
        assert f"dq {case}" in log, case
    log = (BENCH / "sweeps" / "synccheck_dq_bal_h100_f0ad6ed.log").read_text()
    assert "2/2 launches match the reference" in log and "ERROR SUMMARY: 0 errors" in log
    log = (BENCH / "sweeps" / "racecheck_dq_bal_h100_f0ad6ed.log").read_text()
    assert "2/2 launches match the reference" in log and "RACECHECK SUMMARY: 12 hazards displayed" in log
    # the same three sites a case as round 21's racecheck of the dq kernel (sc, sml, the warp-specialize captures)
    old = (BENCH / "sweeps" / "racecheck_dq_h100_e6bb2f0.log").read_text()
    assert "RACECHECK SUMMARY: 5 hazards displayed" in old
    # held out at a815ef4: the batches the rule takes ran faster, those it leaves level or slower but one
    held = _bal_runs("dq_bal_heldout_h100_a815ef4.json", "a815ef4")
    assert len(held) == 32
    got = {}
    for H, B in sorted({(H, B) for H, B, _ in held}):
        plan, bal = held[H, B, "plan"], held[H, B, "balanced"]
        taken = m.balanced_plan(B, H // 64, 2048, 132) is not None
        assert plan["shipped"] == ("balanced" if taken else "plan")
        got[H, B] = (taken, round(bal["graph_us"] / plan["graph_us"], 2))
    assert got == {(64, 67): (True, 0.96), (64, 70): (True, 0.97), (64, 72): (True, 0.97), (64, 74): (False, 1.0),
                   (64, 80): (False, 1.04), (128, 35): (True, 0.92), (128, 36): (True, 0.93), (128, 38): (False, 0.96)}
    assert [round(held[64, 70, k]["graph_us"], 1) for k in ("plan", "balanced")] == [116.8, 112.8]
    assert [round(held[128, 35, k]["graph_us"], 1) for k in ("plan", "balanced")] == [111.3, 102.2]
    extra = [r["eager_us"] - r["graph_us"] for run in (runs, held) for (_, _, impl), r in run.items()
             if impl == "balanced"]
    assert len(extra) == 31 and (round(min(extra), 1), round(max(extra), 1)) == (0.4, 4.2)
    # the matrix and memcheck with the shipped rule (the balanced cases among them)
    cases = load("sweeps/checks_h100_full_a815ef4.json")
    assert len(cases) == 131 and all(r["ok"] for r in cases)
    below = {r["name"]: r["config"] for r in cases if r["name"].split("-")[0] in ("invalid:T70", "invalid:T35")}
    assert len(below) == 4 and sorted(below.values()) == ["gluon-BN64-nbuf2-dq"] * 2 + ["gluon-BN64-nbuf2-pingpong"] * 2
    assert m.balanced_plan(70, 1, 2048, 132) == 132 and m.balanced_plan(35, 2, 2048, 132) == 66
    log = (BENCH / "sweeps" / "sanitizer_h100_a815ef4.log").read_text()
    assert "28/28 cases pass on cuda" in log and "ERROR SUMMARY: 0 errors" in log


def test_evidence_round25_pdl_h100():
    """NOTES round 25 (`device_kernels.sh round25 checks sanitize bench-targets` at 68aed99, H100, PDL then on by
    default): the mechanism engaged in graph replay and its wait held; a plain merge launch started 1.1 us after the
    kernel ended; every kernel row bit-equal between the settings and matching fp32; the timings the prose quotes; the
    one failed row is the eager mechanism check (the host submitted the second launch after the first had ended, which
    the probe now records instead of requiring); the matrix and memcheck with PDL on."""
    d = load("sweeps/pdl_h100_68aed99.json")
    assert d["meta"]["commit"].startswith("68aed99") and "H100" in d["meta"]["device"]
    mech = {(r["graph"], r["pdl"]): r for r in d["rows"] if r.get("kind") == "mechanism"}
    assert all(r["wait_ok"] for r in mech.values())
    assert mech[True, True]["engaged"] and round(mech[True, True]["entry_before_end_us"], 1) == 19.6
    assert not mech[True, False]["engaged"] and round(mech[True, False]["entry_before_end_us"], 2) == -1.12
    assert not mech[False, True]["engaged"]
    kernel_rows = [r for r in d["rows"] if r.get("impl") in ("plain", "pdl")]
    assert len(kernel_rows) == 80 and all(r["ok"] and r["bit_equal"] for r in kernel_rows)
    assert [r for r in d["rows"] if not r.get("ok")] == [mech[False, True]]
    ratio = {(s["format"], s["H"], s["T"]): s["graph_ratio"] for s in d["meta"]["summary"]}
    us = {(s["format"], s["H"], s["T"]): s["graph_us"] for s in d["meta"]["summary"]}
    assert [round(us["fp8_ds_mla", 8, T][k], 1) for T in (8, 32) for k in ("plain", "pdl")] == [16.6, 21.5, 35.7, 43.4]
    assert [round(us["bf16", 8, 1][k], 1) for k in ("plain", "pdl")] == [10.6, 10.0]
    assert [round(us["fp8_ds_mla", 8, 1][k], 1) for k in ("plain", "pdl")] == [11.3, 10.5]
    assert [round(ratio[k], 3) for k in (("bf16", 8, 32), ("bf16", 8, 128), ("fp8_ds_mla", 8, 128),
                                         ("fp8_ds_mla", 16, 32), ("fp8_ds_mla", 16, 128), ("fp8_ds_mla", 8, 600),
                                         ("fp8_ds_mla", 64, 128))] == [1.008, 1.016, 1.055, 1.048, 1.063, 1.006, 0.999]
    assert round(mech[False, True]["entry_before_end_us"], 1) == -12.3  # eager: submitted after the first ended
    # below one wave at 64-128 heads (docs/kernels.md Next steps 2): at most 0.5 us saved
    below = [us[k]["plain"] - us[k]["pdl"] for k in us if k[1] >= 64 and k[2] * -(-k[1] // 64) < 128]  # no control
    assert len(below) == 7 and round(max(below), 1) == 0.5
    fp8mma = [ratio[k] for k in ratio if k[0] == "fp8_ds_mla" and k[1] in (8, 16) and k[2] in (8, 32, 128)]
    assert len(fp8mma) == 5 and (round(min(fp8mma), 2), round(max(fp8mma), 2)) == (1.05, 1.29)
    large = [r for k, r in ratio.items() if k[1] >= 64]
    assert len(large) == 9 and (round(min(large), 3), round(max(large), 3)) == (0.984, 1.001)
    cases = load("sweeps/checks_h100_full_68aed99.json")
    assert len(cases) == 131 and all(r["ok"] for r in cases)
    log = (BENCH / "sweeps" / "sanitizer_h100_68aed99.log").read_text()
    assert "28/28 cases pass on cuda" in log and "ERROR SUMMARY: 0 errors" in log
    bench = load("sweeps/bench_h100_68aed99.json")
    met = {t["target"]: t["met"] for t in bench["targets"]}
    assert bench["meta"]["commit"].startswith("68aed99") and sum(met.values()) == 10 and len(met) == 22


def test_evidence_round26_h200_run_and_its_h100_twin():
    """docs/kernels.md "The shipped code on the H200 (round 26)": the H200 run at 6eaff6f (matrix, memcheck, targets)
    and its decode times against the H100 run at 18bdc50, each number as the table quotes it."""
    h200, h100 = load("bench_h200.json"), load("sweeps/bench_h100_18bdc50.json")
    assert h200["meta"]["gpu"] == "NVIDIA H200" and h200["meta"]["commit"].startswith("6eaff6f")
    assert h100["meta"]["gpu"] == "NVIDIA H100 80GB HBM3" and h100["meta"]["commit"].startswith("18bdc50")
    assert round(h200["ceilings"]["copy_GBps"] / h100["ceilings"]["copy_GBps"], 2) == 1.40
    env = (BENCH / "env_h200.txt").read_text()
    assert "NVIDIA H200" in env and "commit 6eaff6f" in env and "triton 3.6.0" in env
    matrix = load("checks_h200_full.json")
    assert len(matrix) == 131 and all(r["ok"] and r.get("config") for r in matrix if "indexer" not in r["name"])

    def us(res, impl, T, H, fmt):
        return next(r["us"] for r in res["rows"] if r["kind"] == "decode" and r["impl"] == impl and r["T"] == T
                    and r["H"] == H and r["kv_format"] == fmt)

    def gather(res, T, fmt):
        return next(r["us"] for r in res["rows"] if r["kind"] == "gather-ceiling" and r["impl"] == "best-gather"
                    and r["T"] == T and r["kv_format"] == fmt)

    quoted = {("bf16", 8, 128): (127.6, 106.5, 1.20), ("bf16", 16, 128): (131.0, 110.8, 1.18),
              ("fp8_ds_mla", 8, 128): (88.6, 73.4, 1.21), ("fp8_ds_mla", 16, 128): (101.6, 99.9, 1.02),
              ("fp8_ds_mla", 16, 32): (36.3, 34.5, 1.05), ("fp8_ds_mla", 8, 32): (35.0, 30.5, 1.15)}
    for (fmt, H, T), (a, b, up) in quoted.items():
        t100, t200 = us(h100, "triton", T, H, fmt), us(h200, "triton", T, H, fmt)
        assert (round(t100, 1), round(t200, 1), round(t100 / t200, 2)) == (a, b, up), (fmt, H, T)
        # the claim: no 8-16-head kernel gains as much from the H200's memory as the gathers of its rows
        assert t100 / t200 < gather(h100, T, fmt) / gather(h200, T, fmt) - 0.05, (fmt, H, T)
    assert [round(gather(h100, 128, f) / gather(h200, 128, f), 2) for f in ("bf16", "fp8_ds_mla")] == [1.38, 1.33]
    assert [round(gather(h100, 32, "fp8_ds_mla") / gather(h200, 32, "fp8_ds_mla"), 2)] == [1.27]
    fm = [(round(us(h100, "flashmla(h_pad=64)", 128, H, "fp8_ds_mla"), 1),
           round(us(h200, "flashmla(h_pad=64)", 128, H, "fp8_ds_mla"), 1)) for H in (8, 16)]
    assert fm == [(122.6, 117.7), (123.1, 117.5)]
    t = {x["target"]: x for x in h200["targets"]}
    assert [round(t[f"decode fp8 H{h} B128: ratio to FlashMLA"]["value"], 2) for h in (64, 128)] == [0.95, 0.91]
    assert round(t["decode bf16 H8 B128: % of copy bandwidth"]["value"]) == 67
    t1 = {x["target"]: x for x in h100["targets"]}
    assert round(t1["decode bf16 H8 B128: % of copy bandwidth"]["value"]) == 78
    assert round(t1["indexer decode fp8: % of copy bandwidth"]["value"]) == 82
    idx = "indexer decode fp8: % of copy bandwidth"
    assert not t[idx]["met"] and t1[idx]["met"]
    old = load("sweeps/bench_h200_97dc8b8.json")
    assert sum(x["met"] for x in old["targets"]) == 7 and sum(x["met"] for x in h200["targets"]) == 9


def test_evidence_round26_late_trigger_and_the_99kb_build_h100():
    """NOTES round 26 / `mla_gluon_fp8mma`'s comments: the fp8-cache kernel's merge triggered after its tile loop
    (`PDL_TRIGGER` 2) and its 99 KB-class build with fp16 products, each number as quoted."""
    from glm5lib.kernels import mla_gluon_fp8mma as fm

    late = load("sweeps/pdl_late_h100_c066fea.json")
    assert late["meta"]["device"] == "NVIDIA H100 80GB HBM3" and late["meta"]["commit"].startswith("c066fea")
    runs = [r for r in late["rows"] if r.get("impl") in ("plain", "pdl", "pdl-late")]
    assert len(late["rows"]) == 54 and all(r["ok"] for r in late["rows"])
    assert all(r["bit_equal"] and r["rel_err"] < 1e-2 for r in runs)
    assert {r["impl"] for r in runs if r["config"].startswith("fp8mma")} == {"plain", "pdl", "pdl-late"}
    s = {(x["H"], x["T"]): x for x in late["meta"]["summary"] if x["format"] == "fp8_ds_mla" and x["H"] <= 16}
    quoted = {(8, 8): (16.5, 21.3, 16.8), (8, 32): (34.8, 42.5, 34.2), (8, 128): (88.6, 93.8, 87.6),
              (16, 32): (36.2, 38.1, 36.6), (16, 128): (102.6, 108.8, 102.4), (8, 600): (227.6, 226.5, 226.0)}
    for k, want in quoted.items():
        assert tuple(round(s[k]["graph_us"][x], 1) for x in ("plain", "pdl", "pdl-late")) == want, k
        assert 0.98 <= s[k]["graph_ratio_late"] <= 1.02, k  # "level with the plain launch (0.98-1.02x)"
    assert fm.PDL_TRIGGER == 2 and fm.PDL_TRIGGERS == (1, 2)

    small = load("sweeps/small_class_h100_ed3743c.json")
    assert small["meta"]["device"] == "NVIDIA H100 80GB HBM3" and small["meta"]["commit"].startswith("ed3743c")
    assert len(small["rows"]) == 46 and all(r["ok"] for r in small["rows"])
    assert small["meta"]["builds"]["fp8mma-f16"] == fm.config_name(fm.CONFIG_BY_CLASS["small"]) == "fp8mma-nbuf1-f16-t8"
    us = {(r["kind"], r["H"], r["T"], r["impl"]): r["us"] for r in small["rows"] if "us" in r}
    dec = [(H, T) for H in (8, 16) for T in (32, 128)]
    f16, e4m3, triton = "fp8mma-f16-held", "fp8mma-e4m3-held", "triton-small"
    to_triton = [round(us["decode", H, T, f16] / us["decode", H, T, triton], 2) for H, T in dec]
    assert (min(to_triton), max(to_triton)) == (0.53, 0.79)  # "0.53-0.79x the decode time"
    assert [round(us["prefill", H, 4096, f16] / us["prefill", H, 4096, triton], 2) for H in (8, 16)] == [0.37, 0.61]
    to_e4m3 = [us[k[:3] + (f16,)] / us[k[:3] + (e4m3,)] for k in us if k[3] == e4m3]
    assert len(to_e4m3) == 6 and (round(min(to_e4m3), 2), round(max(to_e4m3), 2)) == (0.71, 0.88)
    assert (round(us["decode", 8, 128, f16], 1), round(us["decode", 8, 128, triton], 1)) == (93.7, 176.4)
    # every build timed held to the class's programs an SM fits its 99 KB (over-class plans are not timed)
    held = [r for r in small["rows"] if r["impl"].endswith("-held")]
    assert held and all(r["smem_estimate"] <= 99 * 1024 and not r.get("over_class") for r in held)


def test_evidence_round26_what_bounds_the_b32_fp8_speedup():
    """NOTES round 26: the fp8-cache kernel's own gathers alone at 8 heads B32 (round 13's ablations) against the time
    2.5x of FlashMLA allows in the H200 run at 6eaff6f."""
    gathers = [round(_ablation(c)["ablate-decode", 32, 8, "fp8mma-nbufG-f16-nplan-t8"]["gathers_us"], 1)
               for c in ("6e4488e", "bc8f6e0")]
    assert gathers == [23.8, 24.0]
    fm = next(r["us"] for r in load("bench_h200.json")["rows"] if r["kind"] == "decode" and r["T"] == 32
              and r["H"] == 8 and r["impl"] == "flashmla(h_pad=64)")
    assert (round(fm, 1), round(fm / 2.5, 1)) == (49.4, 19.7) and min(gathers) > fm / 2.5


def test_evidence_round26_bf16_decode_issue_rate():
    """NOTES round 26: the bf16 8-16-head decode's static count (`scripts/mla_static_cost.py --arch 90 --fmt bf16`)
    and the issue rate it gives with the H200's time at B128 (2 programs of 4 warps an SM, 32 tiles a program)."""
    from glm5lib.kernels import mla

    static = load("sweeps/static_cost_bf16_sm90_triton39.json")
    shipped = mla.CONFIGS[("small", "bf16", "big")].name
    row = next(r for r in static if r["config"] == shipped and r["arch"] == 90)
    counts = (row["sass_loop"], row["loop_ops"]["HMMA"], row["loop_ops"]["LDSM"], row["ptx_bar_sync"])
    assert counts == (539, 68, 72, 15)
    run = next(r for r in load("bench_h200.json")["rows"] if r["kind"] == "decode" and r["impl"] == "triton"
               and r["T"] == 128 and r["H"] == 8 and r["kv_format"] == "bf16")
    assert run["config"] == shipped and round(run["us"], 1) == 106.5
    assert mla.pick_num_splits(128, 1, 2048, 32, 132, 2, True) == 2  # 256 programs: 2 an SM, 1024 keys (32 tiles) each
    per_scheduler = 2 * 4 * 32 * row["sass_loop"] / 4 / (run["us"] * 1e-6 * 1.98e9)
    assert round(per_scheduler, 2) == 0.16


def test_evidence_round31_refill_rows():
    """NOTES round 31 / docs v41-v42, against their H100 files: the early refill's three copy modes timed in turn with
    bit-equal outputs (mode 1 3-6 % faster than mode 0; mode 2 another 4 % at 528 tokens and level from 2112), the
    FlashMLA ratios of the docs' table, the second machine's probe, the sanitizer logs of modes 1 and 2, the case
    matrix with mode 2 shipped, and the two `glm5lib bench` runs at fc1f348 (8-head fp8 prefill 1.59x and 1.61x,
    1250.0 and 1219.4 us against 1308-1318 us in the four earlier H100 benches)."""
    def probe(name):
        d = load(f"sweeps/refill_rows_{name}.json")
        assert d["meta"]["gpu"].startswith("NVIDIA H100") and d["meta"]["flashmla"] == "loaded"
        for r in d["rows"]:
            rel = {r[f"rows{m}_rel"] for m in (0, 1, 2)}  # the first 64 tokens against fp32, one value: bit-equal
            assert r["bit_equal"] and len(rel) == 1 and 1.6e-3 < rel.pop() < 1.7e-3, r["T"]
        return {r["T"]: r for r in d["rows"]}

    def med(r):
        return [round(r[f"rows{m}_us_median"], 1) for m in (0, 1, 2)]

    def ratio(r):
        fl = (r["flashmla_us_before"] + r["flashmla_us_after"]) / 2
        return round(fl / r["rows0_us_median"], 2), round(fl / r["rows2_us_median"], 2)

    a = probe("h100_071443f")
    assert {T: med(r) for T, r in a.items()} == {528: [184.0, 178.2, 170.6], 2112: [687.9, 654.7, 656.6],
                                                 4096: [1328.2, 1262.0, 1258.8], 8192: [2631.1, 2475.3, 2462.9]}
    assert {T: ratio(r) for T, r in a.items()} == {528: (1.5, 1.61), 2112: (1.54, 1.62), 4096: (1.54, 1.62),
                                                   8192: (1.58, 1.69)}
    one = [1 - r["rows1_us_median"] / r["rows0_us_median"] for r in a.values()]
    assert 0.03 < min(one) and max(one) < 0.06
    two = {T: 1 - r["rows2_us_median"] / r["rows1_us_median"] for T, r in a.items()}
    assert 0.04 < two[528] < 0.045 and all(-0.004 < two[T] < 0.006 for T in (2112, 4096, 8192))
    b = probe("h100_fc1f348")
    assert {T: med(r) for T, r in b.items()} == {528: [184.0, 176.7, 168.7], 4096: [1321.6, 1229.0, 1222.1]}
    assert {T: ratio(r) for T, r in b.items()} == {528: (1.5, 1.64), 4096: (1.53, 1.65)}
    for run in ("racecheck_refill_rows1", "racecheck_refill_rows2", "memcheck_refill_rows1", "memcheck_refill_rows2",
                "synccheck_refill_rows2"):
        log = (BENCH / "sweeps" / f"{run}_h100_071443f.log").read_text()
        assert "4/4 launches match the fp32 reference" in log
        assert ("RACECHECK SUMMARY: 0 hazards" if run.startswith("race") else "ERROR SUMMARY: 0 errors") in log
    cases = load("sweeps/checks_h100_full_fc1f348.json")
    assert len(cases) == 131 and all(r["ok"] for r in cases)

    def h8_prefill(log):  # the 8-head fp8 prefill row's us and the FlashMLA rows of 8 heads, in the bench log
        text = (BENCH / "sweeps" / log).read_text()
        ours = re.findall(r"prefill +triton +T4096 +H8 +k2048 +fp8_ds_mla +([\d.]+) us", text)
        flash = re.findall(r"prefill +flashmla\(h_pad=64\) +T4096 +H8 +k2048 +bf16 +([\d.]+) us", text)
        return [float(x) for x in ours], [float(x) for x in flash]

    assert h8_prefill("bench_h100_fc1f348.log") == ([1250.0], [2136.7, 1992.2])
    assert h8_prefill("bench_h100_fc1f348_b.log") == ([1219.4], [2086.5, 1969.1])
    before = [h8_prefill(f"bench_h100_{c}.log")[0][0] for c in ("18bdc50", "1e053bb", "59e3fa7", "68aed99")]
    assert (min(before), max(before)) == (1308.0, 1317.5)
    for name, met, value in (("fc1f348", 10, 1.59), ("fc1f348_b", 11, 1.61)):
        bench_run = load(f"sweeps/bench_h100_{name}.json")
        targets = {t["target"]: t for t in bench_run["targets"]}
        assert bench_run["meta"]["commit"][:7] == "fc1f348" and sum(t["met"] for t in targets.values()) == met
        t = targets["prefill fp8_ds_mla H8: speed-up vs FlashMLA bf16 padded to 64 (time)"]
        assert round(t["value"], 2) == value and t["met"] == (value >= 1.6)


def test_evidence_round31_topk_rule_held_out():
    """NOTES round 31: round 30's refitted top-k bounds at row counts held out from their fit (20-56 rows, H100,
    every variant's picks equal): the rule's choice within 1.23x of the fastest variant (geometric mean 1.07x, against
    1.20x and 1.03x on the run it was fitted to), the worst where a split chunk wins (40-56 rows of 32K); the multi
    bound's two wrong sides, the select at 20-24 rows of 202752 read to 128K (the multi select 12-18 % faster over
    `randn`) and the multi select at 28 rows of 131072 (slower than the select)."""
    import math

    from glm5lib.kernels import topk

    d = load("sweeps/topk_rule_heldout_h100_071443f.json")
    assert d["meta"]["device"].startswith("NVIDIA H100") and d["meta"]["mode"] == "--rule"
    rows = {(r["dist"], r["T"], r["n"]): r for r in d["rows"]}
    assert {k[1] for k in rows} == {20, 24, 28, 40, 56} and len(rows) == 30
    variants = ("shipped", "split8192", "split16384", "split32768", "multi2048", "multi4096", "multi8192")
    off = []
    for (dist, T, n), r in rows.items():
        assert all(r[v + "_equals_shipped"] for v in variants[1:]) and r["rule_graph_replay_equals_shipped"]
        assert r["rule_multi_in_graph"] == topk.multi_rule(T, n)  # the bounds this run judged are the shipped ones
        off.append(r["rule_graph_us"] / min(r[v + "_graph_us"] for v in variants))
    assert round(max(off), 2) == 1.23 and round(math.exp(sum(map(math.log, off)) / len(off)), 2) == 1.07
    chunks = {(d, T, n): r["shipped_graph_us"] / min(r["split16384_graph_us"], r["split32768_graph_us"])
              for (d, T, n), r in rows.items()}  # the split's chunk rule: a chunk against one program a row
    assert all(1.16 < chunks[(d, T, 32768)] < 1.23 for d, T in (("randn", 56), ("narrow", 40), ("narrow", 56)))
    assert 1.1 < chunks[("narrow", 56, 131072)] < 1.12
    for T in (20, 24):
        r = rows[("randn", T, 202752)]
        assert not r["rule_multi_in_graph"]
        assert 0.12 < 1 - r["multi8192_graph_us"] / r["rule_graph_us"] < 0.19
    for dist in ("randn", "narrow"):
        r = rows[(dist, 28, 131072)]
        assert r["rule_multi_in_graph"] and r["rule_graph_us"] > r["shipped_graph_us"]


def test_evidence_round31_static_counts():
    """docs/kernels.md v41-v42's table and NOTES round 31: the one-split 8-head build's tile loop in each early-refill
    copy mode under Triton 3.6 (`scripts/fp8mma_sass_count.py --no-split --refill-rows M`: 1959 / 1955 / 1906
    instructions, `LDGSTS` 44 / 44 / 41, `LDS` 169 / 167 / 141, `BAR` 6), and under CI's Triton 3.9 the one-a-token
    build's loop spills (2 / 5 / 4: mode 2 within the spill test's bound of 4, mode 1 not)."""
    text = (BENCH / "sweeps" / "fp8mma_refill_rows_sass.txt").read_text()
    loops = [int(m[1]) for m in re.finditer(r"^fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan-wgplan: (\d+) instructions in "
                                            r"the loop \(BAR 6,", text, re.M)]
    copies = {int(m[1]): tuple(int(v) for v in m.groups()[1:]) for m in re.finditer(
        r"^  early refill copy mode (\d): LDGSTS (\d+), BAR (\d+), LDS (\d+)$", text, re.M)}
    assert text.count("triton 3.6.0, sm_90, 8 heads, one-split build") == 3
    assert loops == [1959, 1955, 1906]
    assert copies == {0: (44, 6, 169), 1: (44, 6, 167), 2: (41, 6, 141)}
    spills = {int(m[1]): int(m[2]) for m in re.finditer(
        r"^triton 3\.9\.0 sm_90 fp8mma-nbufG-f16-nplan-t8-eplan-kplan-wgplan one-split, refill rows mode (\d): "
        r"regs 255, stack \d+ B, loop spills (\d+)$", text, re.M)}
    assert spills == {0: 2, 1: 5, 2: 4}


def test_evidence_round32_static_counts():
    """NOTES round 32 / docs v43: the whole-tile builds' tile loops in each `GATHER_SCALES` mode under Triton 3.6 (the
    device's; `scripts/fp8mma_sass_count.py --gather-scales M`): 8-head decode 1213 -> 1171 instructions, `BAR` 6 -> 3,
    `LDS` 141 -> 113, `LDGSTS` 22 -> 21; 16-head decode 962 -> 949, `BAR` 8 -> 5, `LDS` 88 -> 69; 16-head prefill 1619
    -> 1584, `BAR` 6 -> 3, `LDS` 153 -> 131; under CI's Triton 3.9 the same 3 barriers fewer."""
    text = (BENCH / "sweeps" / "fp8mma_gather_scales_sass.txt").read_text()
    runs = re.findall(r"^triton (3\.\d)\.0, sm_90, (\d+) heads, (split|one-split) build;.*\n"
                      r"fp8mma-nbufG-f16-nplan-t8-eplan-b-kplan-wgplan: (\d+) instructions in the loop .*\n"
                      r"  whole-tile gathers' scale-copy mode (\d): LDGSTS (\d+), BAR (\d+), LDS (\d+), STS \d+$",
                      text, re.M)
    got = {(v, int(h), s, int(m)): (int(n), int(ld), int(bar), int(lds)) for v, h, s, n, m, ld, bar, lds in runs}
    assert len(got) == 12
    assert {k[:3]: (got[k[:3] + (0,)], got[k[:3] + (1,)]) for k in got if k[0] == "3.6"} == {
        ("3.6", 8, "split"): ((1213, 22, 6, 141), (1171, 21, 3, 113)),
        ("3.6", 16, "split"): ((962, 11, 8, 88), (949, 11, 5, 69)),
        ("3.6", 16, "one-split"): ((1619, 22, 6, 153), (1584, 21, 3, 131))}
    for v, h, s, m in got:
        if m == 1:
            assert got[v, h, s, 1][2] == got[v, h, s, 0][2] - 3 and got[v, h, s, 1][0] < got[v, h, s, 0][0]


def test_evidence_round32_gather_scales_run():
    """NOTES round 32's outcome / docs v43 (run in round 33 on an H100 at d1e47e4): the two scale-copy modes in turn,
    bit-equal, mode 1 0.1-4 % faster (the table's medians and FlashMLA ratios), each mode planned in its own passes;
    the sanitizer logs and the case matrix under mode 1; the benchmark run with mode 1 (11 of 22 met, the 16-head fp8
    prefill 0.99x against 0.91-0.94x in the two fc1f348 runs)."""
    d = load("sweeps/gather_scales_h100_d1e47e4.json")
    assert d["meta"]["gpu"].startswith("NVIDIA H100") and d["meta"]["order"] == [0, 1, 1, 0]
    assert d["meta"]["shipped_gather_scales"] == 0 and d["meta"]["commit"][:7] == "d1e47e4"
    got = {}
    for r in d["rows"]:
        assert r["ok"] and r["bit_equal"] and r["whole_tile_build"] and r["mode0_rel"] == r["mode1_rel"] < 1.7e-3
        assert r["plan_gscales"] == [0, 1, 1, 0] * d["meta"]["reps"]  # each pass ran the mode it names
        assert all(statistics.median(r[f"mode{m}_us"]) == r[f"mode{m}_us_median"] for m in (0, 1))
        gain = r["mode0_us_median"] / r["mode1_us_median"] - 1
        got[("dec" if r["decode"] else "pre"), r["H"], r["T"]] = (
            round(r["mode0_us_median"], 2), round(r["mode1_us_median"], 2), round(100 * gain, 1))
    assert got == {("dec", 8, 32): (34.78, 34.28, 1.5), ("dec", 8, 128): (88.55, 88.49, 0.1),
                   ("dec", 16, 32): (36.07, 35.28, 2.2), ("dec", 16, 128): (102.93, 101.31, 1.6),
                   ("pre", 16, 4096): (2126.18, 2044.28, 4.0)}
    flash = [(round(r["flashmla_over_mode0"], 2), round(r["flashmla_over_mode1"], 2)) for r in d["rows"] if r["decode"]]
    assert flash == [(1.56, 1.58), (1.39, 1.39), (1.5, 1.54), (1.19, 1.21)]
    for tool in ("memcheck", "racecheck", "synccheck"):
        log = (BENCH / "sweeps" / f"{tool}_gather_scales1_h100_d1e47e4.log").read_text()
        assert "6/6 launches match the fp32 reference" in log and log.count(" H16 ") == 2
        assert ("RACECHECK SUMMARY: 0 hazards" if tool == "racecheck" else "ERROR SUMMARY: 0 errors") in log
    # the case matrix's JSON records neither mode nor commit: `device_kernels.sh round32b` wrote it under mode 1
    cases = load("sweeps/checks_h100_full_gather_scales1_d1e47e4.json")
    assert len(cases) == 131 and all(r["ok"] for r in cases)
    bench_run = load("sweeps/bench_h100_d1e47e4_gscales1.json")
    assert bench_run["meta"]["commit"] == "d1e47e446f11912893975a394c8f01b11ae64ce3+gscales1"
    targets = {t["target"]: t for t in bench_run["targets"]}
    assert sum(t["met"] for t in targets.values()) == 11
    assert round(targets["prefill fp8_ds_mla H16: speed-up vs FlashMLA bf16 padded to 64 (time)"]["value"], 2) == 0.99
    t8 = targets["prefill fp8_ds_mla H8: speed-up vs FlashMLA bf16 padded to 64 (time)"]
    assert round(t8["value"], 2) == 1.62 and t8["met"]
    before = [{t["target"]: t for t in load(f"sweeps/bench_h100_{c}.json")["targets"]}
              ["prefill fp8_ds_mla H16: speed-up vs FlashMLA bf16 padded to 64 (time)"]["value"]
              for c in ("fc1f348", "fc1f348_b")]
    assert [round(v, 2) for v in before] == [0.94, 0.91]


def test_evidence_round31c_refill_alone():
    """NOTES round 31c's outcome / docs Next steps 1 (run in round 33 on an H100): the early refill's copies alone per
    mode (mode 0 10 % slower than 1, mode 2 0.3 % faster than 1), the whole-tile gathers (3.3 % faster than mode 1's
    copies) and the compute alone, and the kernel 7.0 % above its own copies alone under the same harness (10.6 % by
    the shipped route): the 8-head prefill is bound by its copies."""
    d = load("sweeps/refill_ablate_h100_d1e47e4.json")
    assert d["meta"]["gpu"].startswith("NVIDIA H100")
    assert d["meta"]["commit"] == "d1e47e446f11912893975a394c8f01b11ae64ce3+gscales1"
    assert d["meta"]["shipped_refill_rows"] == 2
    (r,) = d["rows"]
    assert r["T"] == 4096 and r["H"] == 8 and r["bit_equal"]
    alone = [round(r[f"refill{m}_alone_us"], 1) for m in (0, 1, 2)]
    assert alone == [1218.5, 1107.3, 1104.5]
    assert round(r["gathers_alone_us"], 1) == 1072.2 and round(r["compute_alone_us"], 1) == 813.5
    assert round(r["rows2_us_median"], 1) == 1221.4
    assert round(100 * (r["rows2_us_median"] / r["refill2_alone_us"] - 1), 1) == 10.6
    assert round(100 * (alone[0] / alone[1] - 1), 1) == 10.0 and round(100 * (alone[1] / alone[2] - 1), 1) == 0.3
    assert round(100 * (alone[1] / r["gathers_alone_us"] - 1), 1) == 3.3
    assert round(r["whole_alone_us"], 1) == 1182.3 and round(100 * (r["whole_alone_us"] / alone[2] - 1), 1) == 7.0
    assert (round(r["flashmla_us_before"], 1), round(r["flashmla_us_after"], 1)) == (1994.3, 2007.4)
    fl = (r["flashmla_us_before"] + r["flashmla_us_after"]) / 2
    assert round(fl / r["rows2_us_median"], 2) == 1.64


def test_evidence_round33_gather_scales_wide_and_ncu():
    """NOTES round 33 / docs v43: mode 1 (shipped at 284b7ff) against mode 0 at decode B8-B512 and the 16-head prefill
    at 528-8192 tokens, the 8-head prefill (an early-refill build) as the control: bit-equal, no whole-tile case
    slower, the control level (-0.1 %), the gains
    of the table; and the Nsight Compute profile of the 16-head prefill beside c757078's."""
    got, flash = {}, {}
    for part in ("a", "b"):
        d = load(f"sweeps/gather_scales_wide_h100_284b7ff_{part}.json")
        assert d["meta"]["gpu"].startswith("NVIDIA H100") and d["meta"]["shipped_gather_scales"] == 1
        assert d["meta"]["commit"][:7] == "284b7ff" and d["meta"]["order"] == [0, 1, 1, 0] and d["meta"]["reps"] == 2
        for r in d["rows"]:
            assert len(r["mode0_us"]) == len(r["mode1_us"]) == 4
            if r["decode"]:
                flash[r["H"], r["T"]] = round(r["flashmla_over_mode0"], 2), round(r["flashmla_over_mode1"], 2)
            assert r["ok"] and r["bit_equal"] and r["mode0_rel"] == r["mode1_rel"] < 1.7e-3
            assert r["whole_tile_build"] == (r["decode"] or r["H"] > 8)  # the control refills early
            assert all(statistics.median(r[f"mode{m}_us"]) == r[f"mode{m}_us_median"] for m in (0, 1))
            got["dec" if r["decode"] else "pre", r["H"], r["T"]] = (
                round(r["mode0_us_median"], 2), round(r["mode1_us_median"], 2),
                round(100 * (r["mode0_us_median"] / r["mode1_us_median"] - 1), 1))
    assert got == {("dec", 8, 8): (16.55, 16.37, 1.1), ("dec", 8, 64): (56.23, 55.7, 1.0),
                   ("dec", 8, 256): (152.06, 151.97, 0.1), ("dec", 8, 512): (282.61, 281.02, 0.6),
                   ("dec", 16, 8): (21.1, 20.53, 2.8), ("dec", 16, 64): (58.78, 57.51, 2.2),
                   ("dec", 16, 256): (165.94, 162.67, 2.0), ("dec", 16, 512): (310.22, 306.95, 1.1),
                   ("pre", 16, 528): (285.54, 273.78, 4.3), ("pre", 16, 2112): (1072.38, 1039.91, 3.1),
                   ("pre", 16, 8192): (4112.45, 3977.5, 3.4), ("pre", 8, 4096): (1255.98, 1257.29, -0.1)}
    assert flash == {(8, 8): (1.45, 1.47), (8, 64): (1.48, 1.49), (8, 256): (1.58, 1.58), (8, 512): (1.65, 1.66),
                     (16, 8): (1.14, 1.17), (16, 64): (1.42, 1.45), (16, 256): (1.45, 1.48), (16, 512): (1.5, 1.52)}

    def ncu(name):
        text = (BENCH / "sweeps" / name).read_text()
        pick = {"Duration": r"Duration +ms +([\d.]+)", "busy": r"Issue Slots Busy +% +([\d.]+)",
                "warps": r"Active Warps Per Scheduler +warp +([\d.]+)", "none": r"No Eligible +% +([\d.]+)"}
        return {k: float(re.search(v, text)[1]) for k, v in pick.items()}

    assert ncu("ncu_fp8mma_prefill_h16_gscales1_h100_284b7ff.txt") == {
        "Duration": 2.59, "busy": 42.62, "warps": 1.96, "none": 56.52}
    assert ncu("ncu_fp8mma_prefill_h16_k4_wg_h100_c757078.txt") == {
        "Duration": 2.86, "busy": 39.66, "warps": 1.97, "none": 58.99}

    def by_opcode(name):
        line = next(ln for ln in (BENCH / "sweeps" / name).read_text().splitlines() if ln.startswith("per opcode:"))
        return {op: float(v) for op, v in re.findall(r"(\w+) ([\d.]+) %", line)}

    new = by_opcode("ncu_fp8mma_prefill_h16_gscales1_sass_top_h100_284b7ff.txt")
    old = by_opcode("ncu_fp8mma_prefill_h16_k4_wg_sass_top_h100_c757078.txt")
    assert (old["WARPGROUP"], new["WARPGROUP"]) == (8.0, 3.0) and (old["IMAD"], new["IMAD"]) == (6.9, 3.2)
    assert (old["F2FP"], new["F2FP"]) == (15.8, 20.6) and max(new, key=new.get) == "F2FP"
    assert old["STS"] == 2.2 and "STS" not in new


def test_evidence_round34_indexer_two_term_rule():
    """NOTES round 34 / docs v44 (an H100 at 0bd890f, the rule shipped): bf16 q over fp8 keys is rewritten into two
    e4m3 terms on sm_90. Against the top-2048 of the fp32 q that bf16 q was rounded from, the two terms agree about
    as often as the exact forms do (the rounding to bf16 moves more picks than the terms add), where vLLM's fp8 q
    moves an order of magnitude more; the rule's launch (4 tiles) is the two-term row of the sweep and faster than
    the fp16 form under its cap, and on the looping grid of CUDA-graph decode faster by a quarter; memcheck of every
    form clean, the case matrix's bf16-q rows scored through the terms and within tolerance."""
    d = load("sweeps/indexer_form_topk_fp32q_h100_0bd890f.json")
    assert d["meta"]["gpu"].startswith("NVIDIA H100") and d["meta"]["commit"][:7] == "0bd890f"
    assert d["meta"]["q_drawn"] == "fp32" and d["meta"]["batch"] == 128 and d["meta"]["ctx"] == 32768
    rows = {r["form"]: r for r in d["rows"]}
    rounding, two, q8 = rows["bf16 rounding"], rows["e4m3x2"], rows["fp8 q"]
    assert rounding["rows_identical_fp32"] == 0  # the rounding alone moves picks in every row
    assert 0.998 < rounding["topk_agree_mean_fp32"] < 0.999
    for exact in ("f16", "bf16 dot"):  # the exact forms pick bf16 q's top-k: the same agreement with fp32 q's
        r = rows[exact]
        assert r["rows_identical"] == 128 and r["rel_err"] < 1e-6 and r["tiles"] == 1
        assert r["topk_agree_mean_fp32"] == rounding["topk_agree_mean_fp32"]
    assert two["tiles"] == 4 and 1e-5 < two["rel_err"] < 1e-3
    assert two["topk_agree_mean"] > 0.999 and two["topk_agree_min"] >= 1 - 4 / 2048
    assert abs(two["topk_agree_mean_fp32"] - rounding["topk_agree_mean_fp32"]) < 2e-4
    assert 1 - two["topk_agree_mean"] < (1 - rounding["topk_agree_mean_fp32"]) / 2
    assert 1 - q8["topk_agree_mean_fp32"] > 10 * (1 - two["topk_agree_mean_fp32"])
    assert two["us"] < 0.97 * rows["f16"]["us"]
    log = (BENCH / "sweeps" / "sanitizer_indexer_h100_0bd890f.log").read_text()
    assert "48/48 indexer launches match the reference" in log and "ERROR SUMMARY: 0 errors" in log
    assert log.count("e4m3x2 4 tiles a program: ok") == 4  # the rule's launch and the forced 4, at 32 and 24 heads
    cases = {r["name"]: r for r in load("sweeps/checks_h100_full_0bd890f.json")}
    assert len(cases) == 131 and all(r["ok"] for r in cases.values())
    bf16q = [r for n, r in cases.items() if n.startswith("indexer-paged") and "-fp8-" in n and "-q8" not in n]
    assert len(bf16q) == 3 and all(1.5e-4 < r["rel"] < 1.65e-4 for r in bf16q)  # through the terms (tolerance 1e-3)
    bench = load("sweeps/bench_h100_0bd890f.json")
    assert bench["meta"]["commit"][:7] == "0bd890f" and bench["meta"]["gpu"].startswith("NVIDIA H100")
    us = {r["impl"]: r for r in bench["rows"] if r["kind"].startswith("indexer-decode") and r["kv_format"] == "fp8"
          and "error" not in r}
    shipped = us["triton"]
    assert abs(shipped["us"] / us["triton:q-e4m3x2-t4-s2"]["us"] - 1) < 0.02 and 1.5e-4 < shipped["rel_err"] < 1.65e-4
    assert shipped["us"] < 0.98 * us["triton:q-f16-keysM-r96"]["us"]
    for grid in ("loop8", "loop32"):
        assert us[f"triton:e4m3x2:N128-w4-s2-{grid}"]["us"] < 0.8 * us[f"triton:f16:N128-w4-s2-{grid}"]["us"], grid
    targets = {t["target"]: t for t in bench["targets"]}
    assert sum(t["met"] for t in targets.values()) == 11
    t = targets["indexer decode fp8: % of copy bandwidth"]
    before = {x["target"]: x for x in load("sweeps/bench_h100_d1e47e4_gscales1.json")["targets"]}[t["target"]]
    assert round(t["value"], 1) == 85.5 and round(before["value"], 1) == 82.1
    # static counts of the looping grid's builds (Triton 3.6): the fp16 form takes 138 registers (3 programs of 4
    # warps an SM), the terms 101 (4), and fewer instructions on sm_89 / sm_120 as well
    import re

    text = (BENCH / "sweeps" / "indexer_loop_sass_triton36.txt").read_text()
    regs = {(m[1], m[2]): (int(m[3]), int(m[4])) for m in re.finditer(
        r"^sm_(\d+) keys-as-M looping grid, q (.+?): (\d+) registers, (\d+) instructions", text, re.M)}
    assert regs[("90", "f16")] == (138, 1615) and regs[("90", "e4m3x2")] == (101, 1050)
    assert [regs[(a, f)] for a in ("89", "120") for f in ("f16", "e4m3x2")] == [(142, 1188), (128, 1028),
                                                                               (148, 1200), (128, 1026)]
    # what the rule's choices rest on (`indexer.Q_FORM_SM90`, `TILES_SM90`): the H200 run of 6eaff6f, the two terms
    # at 4 tiles against one tile and against the fp16 form it shipped; the H100 run of d1e47e4, 4 tiles level
    for name, four, one, f16 in (("bench_h200.json", 185.8, 191.5, 209.3),
                                 ("sweeps/bench_h100_d1e47e4_gscales1.json", 221.5, 220.6, 230.4)):
        run = {r["impl"]: r["us"] for r in load(name)["rows"] if r["kind"].startswith("indexer-decode")
               and r["kv_format"] == "fp8" and "error" not in r}
        got = [run["triton:q-e4m3x2-t4-s2"], run["triton:q-e4m3x2-keysM"], run["triton"]]
        assert [round(x, 1) for x in got] == [four, one, f16], name
