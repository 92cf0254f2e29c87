"""GPU check and timing of the Gluon wgmma sparse-MLA kernels for 17-128 heads (`glm5lib.kernels.mla_gluon_large`)
beside the Triton kernel and FlashMLA, in one process.

`PYTHONPATH=src python scripts/gluon_mla_large_device.py OUT.json [--vendor .vendor] [--no-time] [--no-check] [--probe]
[--row-threads 8,16,32] [--decode-only]`

Checks (cache of 32768 rows, bf16 and fp8_ds_mla): H in {64, 128, 40}, top-k 2048, 1000 and 777, invalid indices
(-1, out of range, duplicates, a token with none valid), with and without split-K; every config against the fp32
reference `naive.sparse_mla_ref` with `checks`' bf16 tolerances, and against `mla.sparse_mla_launch`.
Timing (the bench's method and shapes; "triton" is `mla.sparse_mla_launch`, the Triton kernel, which `sparse_mla` no
longer takes for these shapes on sm_90): prefill s_q 4096 over 32K rows, top-k 2048, H64 / H128, bf16 and fp8 caches
(`triton.testing.do_bench`, median), and decode B128 H64 / H128 over a paged fp8 cache (CUDA-graph replay over
rotated index sets); FlashMLA (`_flashmla_C.abi3.so` under --vendor) on the same inputs where it runs. A config that
fails is recorded with its error and the run goes on. `--probe` also times the default config's stage builds (the
kernel's PROBE) at H64. `--row-threads` adds the default fp8 config with each of those raw-row mappings
(`RAW_ROW_THREADS`) to the checks and the decode timings, each with its stage builds at H64 and H128;
`--decode-only` skips the prefill timings. With `--probe` the dequantising-producer kernel's (mode "dq") producer alone
and consumers alone are timed at decode H64 too. Needs an sm_90 GPU (wgmma).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
import triton

from glm5lib.bench import kernels as bk
from glm5lib.kernels import mla, mla_gluon_large as gl_large, naive
from glm5lib.kernels.checks import make_indices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_mla_device import compare  # noqa: E402  (the same comparison as the small-head script)

SM_SCALE = bk.SM_SCALE
N_ROWS = 32768
TOPK = bk.TOPK


def make_case(T, H, topk, invalid, fmt, seed, dev):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, naive.D_QK, generator=gen).to(torch.bfloat16).to(dev)
    kv = torch.randn(N_ROWS, naive.D_QK, generator=gen)
    cache = naive.quantize_fp8_ds_mla(kv).to(dev) if fmt == "fp8_ds_mla" else kv.to(torch.bfloat16).to(dev)
    return q, cache, make_indices(T, topk, N_ROWS, invalid, gen, dev)


def _err(exc) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1500:]


def variants(fmt, row_threads):
    """(name, keyword arguments) of every build checked and timed: each config of the format, then (fp8) the default
    config with each of `row_threads` raw-row mappings."""
    out = [(f"{fmt}:{gl_large.config_name(c)}", dict(block_n=c[0], nbuf=c[1], mode=c[2]))
           for c in gl_large.configs_for(fmt)]
    if fmt == "fp8_ds_mla":
        bn, nb, mode = gl_large.DEFAULT
        out += [(f"{fmt}:{gl_large.config_name(gl_large.DEFAULT)}-rt{rt}",
                 dict(block_n=bn, nbuf=nb, mode=mode, row_threads=rt)) for rt in row_threads]
    return out


def run_checks(dev, rows, row_threads=()):
    cases = [(3, 64, TOPK, "none", None), (3, 128, TOPK, "none", None), (4, 40, 1000, "mixed", None),
             (5, 64, 777, "oob", None), (4, 128, TOPK, "neg", 4), (2, 64, 96, "allinv", None),
             (6, 64, TOPK, "dup", 3), (2, 128, 1000, "none", 5)]
    broken = {}
    for fmt in ("bf16", "fp8_ds_mla"):
        for ci, (T, H, topk, invalid, splits) in enumerate(cases):
            q, cache, idx = make_case(T, H, topk, invalid, fmt, ci, dev)
            ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx, SM_SCALE, kv_format=fmt, chunk=8)
            case = f"{fmt}-T{T}-H{H}-K{topk}-{invalid}-splits{splits or 'auto'}"
            to, tlse = mla.sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format=fmt)
            r = {"case": case, "kernel": "triton", "config": mla.pick_config(T, H, topk, fmt).name,
                 **compare(to, tlse, ro, rlse)}
            rows.append(r)
            print(json.dumps(r), flush=True)
            for name, kw in variants(fmt, row_threads):
                bn, mode = kw["block_n"], kw["mode"]
                r = {"case": case, "kernel": "gluon-wgmma", "config": name}
                if name in broken:
                    r.update(ok=False, error="skipped: " + broken[name])
                else:
                    try:
                        o, lse = gl_large.sparse_mla_gluon_large(q, cache, idx, SM_SCALE, kv_format=fmt,
                                                                 num_splits=splits, **kw)
                        torch.cuda.synchronize()
                        r.update(compare(o, lse, ro, rlse))
                        vt = compare(o, lse, to.float(), tlse)
                        r.update(rel_vs_triton=vt["rel"], lse_vs_triton=vt["lse_abs"],
                                 splits=gl_large.plan_splits(T, H, topk, bn, dev, splits, mode)[0])
                    except Exception as exc:  # noqa: BLE001
                        r.update(ok=False, error=_err(exc))
                        broken[name] = r["error"].splitlines()[-1][:300]
                        torch.cuda.synchronize()
                rows.append(r)
                print(json.dumps(r), flush=True)
            del q, cache, idx, ro, rlse
    return broken


def time_prefill(H, fmt, broken, have_fm, rows, s_q=4096, probe=False):
    kv = torch.randn(N_ROWS, naive.D_QK, device="cuda", dtype=torch.bfloat16)
    cache = naive.quantize_fp8_ds_mla(kv) if fmt == "fp8_ds_mla" else kv
    kv_bf16 = naive.dequantize_fp8_ds_mla(cache).to(torch.bfloat16) if fmt == "fp8_ds_mla" else kv
    q = torch.randn(s_q, H, naive.D_QK, device="cuda", dtype=torch.bfloat16)
    idx = bk._rand_indices(s_q, N_ROWS, TOPK)
    sl = slice(0, 128)
    ro, _ = naive.sparse_mla_ref_chunked(q[sl], cache, idx[sl], SM_SCALE, kv_format=fmt, chunk=16)
    flops = bk.sparse_mla_flops(s_q, H, TOPK)
    base = {"kind": "prefill", "T": s_q, "H": H, "kv_format": fmt, "topk": TOPK}

    def add(impl, fn, extra=None):
        try:
            o = fn()[0]
            rel = float((o[sl].float() - ro).norm() / ro.norm())
            ms = bk._median_ms(fn)
            r = {**base, "impl": impl, "ms": ms, "TFLOPs": flops / ms / 1e9, "rel_err": rel, **(extra or {})}
        except Exception as exc:  # noqa: BLE001
            r = {**base, "impl": impl, "error": _err(exc)}
        rows.append(r)
        print(json.dumps(r), flush=True)

    def add_time(impl, fn, bench_ms):
        try:
            fn()
            r = {**base, "impl": impl, "ms": bench_ms(fn)}
        except Exception as exc:  # noqa: BLE001
            r = {**base, "impl": impl, "error": _err(exc)}
        rows.append(r)
        print(json.dumps(r), flush=True)

    out = torch.empty(s_q, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
    # the Triton kernel with its own config (`sparse_mla` itself takes the Gluon kernel for these shapes on sm_90)
    add("triton", lambda: mla.sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format=fmt, out=out),
        {"config": mla.pick_config(s_q, H, TOPK, fmt).name})
    for cfg in gl_large.configs_for(fmt):
        if f"{fmt}:{gl_large.config_name(cfg)}" not in broken:
            add(f"gluon-wgmma:{gl_large.config_name(cfg)}", lambda c=cfg: gl_large.sparse_mla_gluon_large(
                q, cache, idx, SM_SCALE, kv_format=fmt, block_n=c[0], nbuf=c[1], mode=c[2], out=out))
    if probe:  # stage builds of the default config (outputs meaningless: timing only)
        for pr in (1, 2, 3) if fmt == "fp8_ds_mla" else (1, 2):
            add_time(f"gluon-wgmma-probe{pr}", lambda pr=pr: gl_large.sparse_mla_gluon_large(
                q, cache, idx, SM_SCALE, kv_format=fmt, out=out, probe=pr), bench_ms=bk._median_ms)
        if fmt == "bf16":  # the ping-pong kernel: its producer alone, its consumers alone
            for pr in (1, 2):
                add_time(f"gluon-pingpong-probe{pr}", lambda pr=pr: gl_large.sparse_mla_gluon_large(
                    q, cache, idx, SM_SCALE, kv_format=fmt, out=out, mode="pingpong", probe=pr), bench_ms=bk._median_ms)
            for regs in ((216, 72), (200, 104)):  # the partitions' register split (the default is PP_*_REGS)
                add(f"gluon-pingpong-regs{regs[0]}-{regs[1]}", lambda regs=regs: gl_large.sparse_mla_gluon_large(
                    q, cache, idx, SM_SCALE, kv_format=fmt, out=out, mode="pingpong", pp_regs=regs))
    if have_fm:  # FlashMLA's sparse prefill reads bf16 rows (the fp8 cache's values, dequantized: exact in bf16)
        add("flashmla", lambda: bk.flashmla_prefill(q, kv_bf16.unsqueeze(1), idx.unsqueeze(1)),
            {"reads": "bf16"})
    del kv, cache, kv_bf16, q, idx, out
    torch.cuda.empty_cache()


def time_decode(H, fmt, broken, have_fm, rows, B=128, ctx=32768, probe=False, row_threads=()):
    q, cache, base_rows = bk._make_decode(B, H, ctx, TOPK, fmt)
    flat = cache.view(-1, cache.shape[-1])
    R = bk._rotations(bk.sparse_mla_kv_bytes(B, TOPK, fmt))
    idx_sets = [bk._rand_indices(B, ctx, TOPK, base_rows) for _ in range(R)]
    ro, _ = naive.sparse_mla_ref_chunked(q, flat, idx_sets[0], SM_SCALE, kv_format=fmt, chunk=16)
    flops = bk.sparse_mla_flops(B, H, TOPK)
    base = {"kind": "decode", "T": B, "H": H, "kv_format": fmt, "topk": TOPK, "rotations": R}
    out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)

    def add(impl, call, extra=None):
        try:
            o = call(idx_sets[0])[0]
            rel = float((o.float() - ro).norm() / ro.norm())
            ms = bk._graph_ms([lambda i=i: call(i) for i in idx_sets])
            r = {**base, "impl": impl, "us": ms * 1e3, "TFLOPs": flops / ms / 1e9, "rel_err": rel, **(extra or {})}
        except Exception as exc:  # noqa: BLE001
            r = {**base, "impl": impl, "error": _err(exc)}
        rows.append(r)
        print(json.dumps(r), flush=True)

    add("triton", lambda i: mla.sparse_mla_launch(q, flat, i, SM_SCALE, kv_format=fmt, out=out),
        {"config": mla.pick_config(B, H, TOPK, fmt).name})
    for name, kw in variants(fmt, row_threads):
        if name not in broken:
            add("gluon-wgmma:" + name.split(":", 1)[1], lambda i, kw=kw: gl_large.sparse_mla_gluon_large(
                q, flat, i, SM_SCALE, kv_format=fmt, out=out, **kw),
                {"splits": gl_large.plan_splits(B, H, TOPK, kw["block_n"], q.device, None, kw["mode"])[0]})
    # stage builds (outputs meaningless: timing only) of the default config, and with --row-threads of each mapping
    probes = ([(None, "")] if probe else []) + [(rt, f"-rt{rt}") for rt in row_threads]
    for rt, tag in probes:
        for pr in (1, 2, 3, 4, 5, 6) if fmt == "fp8_ds_mla" else (1, 2):
            try:
                ms = bk._graph_ms([lambda i=i, pr=pr: gl_large.sparse_mla_gluon_large(
                    q, flat, i, SM_SCALE, kv_format=fmt, out=out, probe=pr, row_threads=rt) for i in idx_sets])
                r = {**base, "impl": f"gluon-wgmma-probe{pr}{tag}", "us": ms * 1e3}
            except Exception as exc:  # noqa: BLE001
                r = {**base, "impl": f"gluon-wgmma-probe{pr}{tag}", "error": _err(exc)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    if probe and fmt == "fp8_ds_mla":  # the dequantising-producer kernel: its producer alone, its consumers alone
        for pr in (1, 2):
            try:
                ms = bk._graph_ms([lambda i=i, pr=pr: gl_large.sparse_mla_gluon_large(
                    q, flat, i, SM_SCALE, kv_format=fmt, out=out, mode="dq", probe=pr) for i in idx_sets])
                r = {**base, "impl": f"gluon-dq-probe{pr}", "us": ms * 1e3}
            except Exception as exc:  # noqa: BLE001
                r = {**base, "impl": f"gluon-dq-probe{pr}", "error": _err(exc)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    if have_fm and fmt == "fp8_ds_mla":
        q4 = q.unsqueeze(1).contiguous()
        kv4 = cache.view(torch.float8_e4m3fn).unsqueeze(2)
        fms = {}

        def fm_call(i):
            f = fms.setdefault(i.data_ptr(), bk.FlashMLADecode())
            o4, lse = f(q4, kv4, i.unsqueeze(1))
            return o4[:, 0], lse

        for i in idx_sets:  # scheduler metadata made outside the graph
            fm_call(i)
        add("flashmla", fm_call)
    del q, cache, idx_sets, out
    torch.cuda.empty_cache()


def summarize(bench) -> list[str]:
    """Per case: the Triton kernel, each Gluon config and FlashMLA, with time ratios from this run (FlashMLA / ours,
    the issue's measure; Triton / Gluon)."""
    lines = ["| case | impl | time | FlashMLA / it | Triton / it |", "|---|---|---|---|---|"]
    cases = {}
    for r in bench:
        probes = ("gluon-wgmma-probe", "gluon-pingpong-probe", "gluon-dq-probe")
        if "error" not in r and not r["impl"].startswith(probes):
            cases.setdefault((r["kind"], r["kv_format"], r["H"]), []).append(r)
    for (kind, fmt, H), rows in cases.items():
        t = {r["impl"]: r.get("ms") or r.get("us") / 1e3 for r in rows}
        unit = "ms" if kind == "prefill" else "us"
        for impl, ms in t.items():
            fm = t.get("flashmla")
            tri = t.get("triton")
            shown = ms if unit == "ms" else ms * 1e3
            lines.append(f"| {kind} {fmt} H{H} | {impl} | {shown:.3f} {unit} | "
                         f"{fm / ms:.2f} | {tri / ms:.2f} |" if fm and tri else
                         f"| {kind} {fmt} H{H} | {impl} | {shown:.3f} {unit} | - | - |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_path = argv[0] if argv and not argv[0].startswith("--") else "gluon_mla_large_device.json"
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("gluon_mla_large_device: needs an sm_90 GPU (wgmma)")
    dev = torch.device("cuda")
    t0 = time.time()
    fm_err = bk.load_flashmla(vendor)
    info = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(dev),
            "torch": torch.__version__, "triton": triton.__version__, "flashmla": fm_err or "loaded",
            "configs": gl_large.CONFIGS}
    print(json.dumps(info), flush=True)
    checks, bench = [], []
    probe = "--probe" in argv
    row_threads = [int(x) for x in argv[argv.index("--row-threads") + 1].split(",")] if "--row-threads" in argv else []
    info["row_threads"] = row_threads
    broken = run_checks(dev, checks, row_threads) if "--no-check" not in argv else {}
    if "--no-time" not in argv:
        for fmt in ("bf16", "fp8_ds_mla") if "--decode-only" not in argv else ():
            for H in (64, 128):
                time_prefill(H, fmt, broken, fm_err is None, bench, probe=probe and H == 64)
        for H in (64, 128):
            time_decode(H, "fp8_ds_mla", broken, fm_err is None, bench, probe=probe and H == 64,
                        row_threads=row_threads)
    summary = summarize(bench)
    for line in summary:
        print(line)
    info["elapsed_s"] = time.time() - t0
    info["checks_ok"] = sum(bool(r.get("ok")) for r in checks)
    info["checks"] = len(checks)
    with open(out_path, "w") as f:
        json.dump({"meta": info, "checks": checks, "bench": bench, "summary": summary}, f, indent=1)
    print(f"checks {info['checks_ok']}/{info['checks']}; {len(bench)} timings; {info['elapsed_s']:.0f} s -> {out_path}")
    return 0 if info["checks_ok"] == info["checks"] else 1


if __name__ == "__main__":
    sys.exit(main())
