"""Split launches with and without programmatic dependent launch (`common.pdl`): every sparse-MLA path whose
partials are merged by a second launch, timed through `mla.sparse_mla` (the dispatcher, as vLLM calls it) with the
merge launched plainly and as the kernel's programmatic dependent, in one process, in the order off, on, on, off
(so that a drift over the run weighs on both alike). One request a token (32K rows each, top-k 2048) for decode;
one 32K-row sequence for the 8-head prefill. Each launch's output and lse are checked against the fp32 reference
(`naive.sparse_mla_ref_chunked`) before timing and again after, and the two settings' outputs must be bit-equal
(the merge reads the same partials either way; only its launch moves). Shapes without a merge (64 heads B128: one
split) are the control: their ratio is the run's noise. FlashMLA (padded to 64 / 128 heads) is timed beside the
fp8_ds_mla decode rows where it loads. Times: CUDA-graph replay over rotated index sets, and eager. Needs sm_90+.

First, the mechanism itself, eager and captured in a CUDA graph: a kernel that triggers and then spins 20 us on every
SM, followed by one that stamps the global timer on entry, waits (`gdc_wait`) and stamps again. With the option the
second kernel's programs leave the wait only after the first ends ("wait_ok", required) and, replayed from a graph,
enter before it ends (the launch moved: "engaged"; eagerly the host may submit the second launch only after the
first has ended, so there it is recorded, not required); without the option they enter after it ends. The plain
graph's entry gap is the most PDL can save a merge launch.

The fp8-cache kernel's launches also run with its programs triggering after their tile loop ("pdl-late",
`mla_gluon_fp8mma.PDL_TRIGGER` 2, its placement since round 26; "pdl" is every kernel's trigger first, as in round
25), in the order plain, pdl, pdl-late, pdl-late, pdl, plain. Decode outputs are checked from a captured and replayed
call, as timed.

`PYTHONPATH=src python scripts/pdl_probe.py OUT.json [--vendor .vendor] [--quick | --fp8mma]`
"""

from __future__ import annotations

import json
import os
import sys

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import common, mla, naive
from glm5lib.kernels import mla_gluon_fp8mma as fm

import triton  # noqa: E402  (after glm5lib.kernels: the interpreter switch)
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from large_small_batch_probe import as_replayed, case_inputs, eager_us, flashmla_padded, write_rows  # noqa: E402

# (format, heads, tokens, decode): the Triton split kernel (bf16 at 8 heads), the fp8-cache kernel's splits
# (fp8 at 8-16 heads) and its balanced prefill (600 tokens: cut tokens, `merge_pieces`), the dq kernel's split
# plan, balanced schedule (64 heads B68, 128 heads B34: `merge_runs`) and tail plan (128 heads B70), the ping-pong
# kernel's split plan (bf16 at 64 heads), and the control without a merge (fp8 64 heads B128)
CASES = [("bf16", 8, 1, True), ("bf16", 8, 8, True), ("bf16", 8, 32, True), ("bf16", 8, 128, True),
         ("fp8_ds_mla", 8, 1, True), ("fp8_ds_mla", 8, 8, True), ("fp8_ds_mla", 8, 32, True),
         ("fp8_ds_mla", 8, 128, True), ("fp8_ds_mla", 16, 32, True), ("fp8_ds_mla", 16, 128, True),
         ("fp8_ds_mla", 8, 600, False),
         ("fp8_ds_mla", 64, 8, True), ("fp8_ds_mla", 64, 32, True), ("fp8_ds_mla", 64, 68, True),
         ("fp8_ds_mla", 128, 16, True), ("fp8_ds_mla", 128, 34, True), ("fp8_ds_mla", 128, 70, True),
         ("bf16", 64, 8, True), ("bf16", 64, 32, True),
         ("fp8_ds_mla", 64, 128, True)]
QUICK = [c for c in CASES if c[2] in (1, 32, 34, 68, 128) and c[1] in (8, 64, 128)]
# --fp8mma: the fp8-cache kernel's split and balanced launches (where the trigger's place is asked), the Triton
# kernel's bf16 B1 (round 25's largest gain) and the control without a merge
FP8MMA = [c for c in CASES if c[0] == "fp8_ds_mla" and c[1] <= 16 and c[2] > 1] + [CASES[0], CASES[-1]]
ORDER = ("plain", "pdl", "pdl", "plain")
# the fp8-cache kernel's launches also with its programs triggering after their tile loop (`PDL_TRIGGER` 2)
ORDER_FP8MMA = ("plain", "pdl", "pdl-late", "pdl-late", "pdl", "plain")
SETTINGS = ("plain", "pdl", "pdl-late")


def apply(setting: str) -> None:
    """PDL off ("plain"), on with the kernels' programs triggering first ("pdl"), or on with the fp8-cache kernel's
    triggering after their tile loop ("pdl-late"; `mla_gluon_fp8mma.PDL_TRIGGER`)."""
    fm.set_pdl_trigger(2 if setting == "pdl-late" else 1)
    mla.set_pdl(setting != "plain")


@triton.jit
def _now(x):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _spin_kernel(STAMP, NS, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    p = tl.program_id(0)
    t0 = _now(p)
    t = t0
    while t - t0 < NS:
        t = _now(p)
    tl.store(STAMP + p, t)


@triton.jit
def _stamp_kernel(STAMP, PDL: tl.constexpr):
    p = tl.program_id(0)
    tl.store(STAMP + 2 * p, _now(p))
    if PDL:
        tl.extra.cuda.gdc_wait()
    tl.store(STAMP + 2 * p + 1, _now(p))


def mechanism(graph: bool) -> list:
    """The spin / stamp pair with and without the option (see the module docstring): one row each."""
    n = common.num_sms(torch.device("cuda"))
    rows = []
    for on in (False, True):
        spin = torch.zeros(n, dtype=torch.int64, device="cuda")
        stamp = torch.zeros(2 * n, dtype=torch.int64, device="cuda")

        def pair():
            _spin_kernel[(n,)](spin, 20_000, PDL=on)
            _stamp_kernel[(n,)](stamp, **common.pdl_kw(on))

        pair()  # compiled outside the capture
        torch.cuda.synchronize()
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                pair()
            g.replay()
        else:
            pair()
        torch.cuda.synchronize()
        end = int(spin.max())
        entry, left = int(stamp[0::2].min()), int(stamp[1::2].min())
        r = {"kind": "mechanism", "graph": graph, "pdl": on, "entry_before_end_us": (end - entry) / 1e3,
             "engaged": entry < end, "wait_ok": left >= end}
        r["ok"] = r["wait_ok"] and (r["engaged"] or not graph if on else not r["engaged"])
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def run_case(fmt: str, H: int, T: int, decode: bool, flash: bool) -> tuple[list, int]:
    q, cache, idx_sets = case_inputs(fmt, H, T, decode, prefill_sets=2)
    flat = cache.view(-1, cache.shape[-1])
    out = torch.empty(T, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
    ro, rlse = naive.sparse_mla_ref_chunked(q, flat, idx_sets[0], bk.SM_SCALE, kv_format=fmt, chunk=16)
    key, cfg = mla.dispatched(T, H, fmt, q.device, graph=decode)
    base = {"format": fmt, "H": H, "T": T, "decode": decode, "route": "/".join(key), "config": cfg}

    def call(i):
        return mla.sparse_mla(q, flat, i, bk.SM_SCALE, kv_format=fmt, out=out, decode=decode)

    def check():
        # a decode step as it is replayed: captured, since outside capture fewer than `mla.FP8MMA_MIN_T` tokens go to
        # the Triton kernel (until c066fea this check ran the call eagerly, so 8 tokens were checked on that kernel)
        out.fill_(float("nan"))
        if decode:
            o, lse = as_replayed(lambda: call(idx_sets[0]), out)
        else:
            o, lse = call(idx_sets[0])
        rel = float((o.float() - ro).norm() / ro.norm())
        ok = rel < 1e-2 and not torch.isnan(o).any() and torch.allclose(lse.float(), rlse, rtol=1e-3, atol=1e-3)
        return rel, bool(ok), o.clone(), lse.clone()

    rows, bad, first = [], 0, {}
    initial, trigger = common.PDL, fm.PDL_TRIGGER
    for k, setting in enumerate(ORDER_FP8MMA if cfg.startswith("fp8mma") else ORDER):
        apply(setting)
        rel, ok, o, lse = check()
        r = {**base, "impl": setting, "pass": k, "pdl_active": common.pdl(q.device) and setting != "plain",
             "rel_err": rel}
        for i in idx_sets[1:]:
            call(i)
        r["graph_us"] = bk._graph_ms([lambda i=i: call(i) for i in idx_sets]) * 1e3
        r["eager_us"] = eager_us(lambda: call(idx_sets[0]))
        rel2, ok2, o2, lse2 = check()
        r["rel_err_again"] = rel2
        prev = first.setdefault(setting, (o, lse))
        others = [v for s_, v in first.items() if s_ != setting]
        r["bit_equal"] = bool(torch.equal(o2, prev[0]) and torch.equal(lse2, prev[1]) and
                              all(torch.equal(o2, v[0]) and torch.equal(lse2, v[1]) for v in others))
        r["ok"] = ok and ok2 and r["bit_equal"]
        bad += not r["ok"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    mla.set_pdl(initial)
    fm.set_pdl_trigger(trigger)
    if flash and decode and fmt == "fp8_ds_mla":
        flash_call = flashmla_padded(q, cache, H)
        for i in idx_sets:
            flash_call(i)  # scheduler metadata per index set, outside the capture
        r = {**base, "impl": "flashmla", "graph_us": bk._graph_ms([lambda i=i: flash_call(i) for i in idx_sets]) * 1e3,
             "ok": True}
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows, bad


def summary(rows: list) -> list:
    """Per case: mean graph / eager time of each setting and their ratios to plain (pdl / plain, pdl-late / plain)."""
    out = []
    rows = [r for r in rows if r.get("kind") != "mechanism"]
    for case in dict.fromkeys((r["format"], r["H"], r["T"]) for r in rows):
        rs = [r for r in rows if (r["format"], r["H"], r["T"]) == case and r["impl"] in SETTINGS]
        s = {"format": case[0], "H": case[1], "T": case[2], "route": rs[0]["route"]}
        present = [x for x in SETTINGS if any(r["impl"] == x for r in rs)]
        for unit in ("graph_us", "eager_us"):
            m = {x: sum(r[unit] for r in rs if r["impl"] == x) / sum(r["impl"] == x for r in rs) for x in present}
            s[unit] = m
            s[unit.replace("_us", "_ratio")] = m["pdl"] / m["plain"]
            if "pdl-late" in m:
                s[unit.replace("_us", "_ratio_late")] = m["pdl-late"] / m["plain"]
        fm_us = [r["graph_us"] for r in rows if (r["format"], r["H"], r["T"]) == case and r["impl"] == "flashmla"]
        if fm_us:
            s["flashmla_graph_us"] = fm_us[0]
        out.append(s)
        late = (f" late {s['graph_us']['pdl-late']:8.1f} ({s['graph_ratio_late']:.3f}x)"
                if "graph_ratio_late" in s else "")
        print(f"{case[0]:>10} H{case[1]:<3} T{case[2]:<4} {s['route']:<32} graph {s['graph_us']['plain']:8.1f} -> "
              f"{s['graph_us']['pdl']:8.1f} us ({s['graph_ratio']:.3f}x){late}  eager {s['eager_ratio']:.3f}x"
              + (f"  flashmla {fm_us[0]:.1f}" if fm_us else ""), flush=True)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("--"):
        sys.exit("usage: pdl_probe.py OUT.json [--vendor DIR] [--quick | --fp8mma]")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        sys.exit("pdl_probe: needs an sm_90+ GPU (programmatic dependent launch)")
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    fm_err = bk.load_flashmla(vendor)
    rows = mechanism(False) + mechanism(True)
    bad = sum(not r["ok"] for r in rows)
    for fmt, H, T, decode in (QUICK if "--quick" in argv else FP8MMA if "--fp8mma" in argv else CASES):
        r, b = run_case(fmt, H, T, decode, fm_err is None)
        rows += r
        bad += b
        torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "sm_count": common.num_sms(torch.device("cuda")), "flashmla": fm_err or "loaded",
            "order": list(ORDER), "order_fp8mma": list(ORDER_FP8MMA), "summary": summary(rows)}
    return write_rows(argv[0], meta, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
