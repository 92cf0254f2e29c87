"""What an sm_89 / sm_120 GPU (the 99 KB shared-memory class) would run for the 8-16-head fp8_ds_mla cases, timed on
an sm_90 GPU under that class's budget, side by side in one process:

- "triton-small": what `mla.sparse_mla` runs there today, the Triton kernel's 99 KB-class config (`CONFIGS[(...,
  "small")]`, the benchmark's `smem-small` rows);
- "fp8mma-e4m3": the fp8-cache kernel's 99 KB-class build with e4m3 products (native on sm_89 / sm_120; on sm_90
  ptxas widens both operands to fp16, so its time here is not its time there), what `GLM5LIB_FP8MMA=1` took there
  until round 26 (this probe's run, `sweeps/small_class_h100_ed3743c.json`, is why it no longer does);
- "fp8mma-f16": the same build with fp16 products (each cached byte widened once, exactly, and products in fp16 with
  fp32 accumulation: the numerics sm_90 runs, independent of the GPU's e4m3 tensor cores), 31 KB of shared memory as
  the e4m3 build: `mla_gluon_fp8mma.CONFIG_BY_CLASS["small"]` since round 26;
- "fp8mma-f16-rules": the sm_90 build's rules (one slot per head group, `tile_keys`, the early refill, the balanced
  schedule, `plan_key_warps`) without wgmma (sm_90 only), planned for the 99 KB class (a plan over the class's
  99 KB, e.g. four key warps' two slots at 9-16 heads, 104 KB, is recorded and not timed);
each fp8mma build planned for the 99 KB class (`mla.force_smem_class("small")`: split counts and schedules by its
programs per SM) and timed twice: as compiled for this GPU ("free": sm_90 holds more of its programs an SM than the
99 KB class would) and held to the class's programs per SM by a shared-memory pad ("held", `per_sm`). The shipped
sm_90 build and FlashMLA (padded to 64 heads) are timed beside them. Decode: one request a token (32K rows, top-k
2048), CUDA-graph replay over rotated index sets; prefill: s_q 4096 over one 32K-row sequence, `do_bench`. Every
glm5lib launch's output and lse are checked against the fp32 reference (`naive.sparse_mla_ref_chunked`) before timing
(FlashMLA's rows are timed only).

`PYTHONPATH=src python scripts/small_class_probe.py OUT.json [--vendor .vendor]`
"""

from __future__ import annotations

import os
import sys

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import mla, naive
from glm5lib.kernels import mla_gluon_fp8mma as fm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from large_small_batch_probe import case_inputs, flashmla_padded, write_rows  # noqa: E402

CASES = [("decode", 8, 32), ("decode", 8, 128), ("decode", 16, 32), ("decode", 16, 128),
         ("prefill", 8, 4096), ("prefill", 16, 4096)]
SMALL = fm.CONFIG_BY_CLASS["small"]._replace(q_terms=2, p_terms=2)  # the class's build until round 26
SMEM_SMALL = 99 * 1024  # opt-in shared memory a block on sm_89 / sm_120
BUILDS = {"fp8mma-e4m3": SMALL, "fp8mma-f16": fm.CONFIG_BY_CLASS["small"],
          "fp8mma-f16-rules": fm.CONFIG_BY_CLASS["big"]._replace(wgmma=0)}


def per_sm_small(cfg, T: int, H: int, decode: bool) -> tuple[int, int, dict]:
    """The 99 KB class's programs an SM for this build's plan of the shape (`mla.force_smem_class("small")` on)."""
    G = fm.head_groups(H)
    splits, _, _, kw, _ = fm.config_plan(cfg, T, H, bk.TOPK, "cuda", torch.cuda.current_device(), bk.TOPK, decode)
    kw = dict(kw, smem_estimate=fm.smem_bytes_estimate(G, cfg.nbuf, cfg.q_terms, kw["BN"], kw["WM"]))
    return fm.programs_per_sm(G, cfg.nbuf, cfg.q_terms, "small", cfg.maxnreg, kw["BN"], kw["WM"]), splits, kw


def run_case(kind: str, H: int, T: int, fm_ok: bool) -> tuple[list, int]:
    q, cache, idx_sets = case_inputs("fp8_ds_mla", H, T, kind == "decode")
    flat = cache.view(-1, cache.shape[-1])
    sl = slice(0, min(T, 256))
    ro, rlse = naive.sparse_mla_ref_chunked(q[sl], flat, idx_sets[0][sl], bk.SM_SCALE, kv_format="fp8_ds_mla",
                                            chunk=16)
    out = torch.empty(T, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
    dev = q.device
    rows, bad = [], 0

    def timed(name, call, extra):
        nonlocal bad
        out.fill_(float("nan"))
        o, lse = call(idx_sets[0])
        rel = float((o[sl].float() - ro).norm() / ro.norm())
        ok = bool(rel < 1e-2 and not torch.isnan(o).any() and (lse is None or torch.allclose(
            lse[sl].float(), rlse, rtol=1e-3, atol=1e-3)))
        if kind == "decode":
            for i in idx_sets[1:]:
                call(i)
            us = bk._graph_ms([lambda i=i: call(i) for i in idx_sets]) * 1e3
        else:
            us = bk._median_ms(lambda: call(idx_sets[0])) * 1e3
        r = {"kind": kind, "H": H, "T": T, "impl": name, "us": us, "rel_err": rel, "ok": ok, **extra}
        bad += not ok
        rows.append(r)
        print(f"{kind:>7} H{H:<3} T{T:<5} {name:<24} {us:9.1f} us  rel {rel:.1e} {'ok' if ok else 'BAD'} "
              + " ".join(f"{k}={v}" for k, v in extra.items()), flush=True)

    # what sm_90 runs (the shipped fp8-cache build)
    timed("shipped-sm90", lambda i: mla.sparse_mla(q, flat, i, bk.SM_SCALE, kv_format="fp8_ds_mla", out=out,
                                                   decode=kind == "decode"), {"config": mla.dispatched(
                                                       T, H, "fp8_ds_mla", dev, graph=kind == "decode")[1]})
    mla.force_smem_class("small")
    fm.clear_plans()
    try:
        key, cfg = bk._small_config(T, H, "fp8_ds_mla", dev)
        ns = mla.config_num_splits(T, H, bk.TOPK, cfg, dev)
        timed("triton-small", lambda i: mla.sparse_mla_launch(q, flat, i, bk.SM_SCALE, kv_format="fp8_ds_mla",
                                                                out=out, config=cfg, num_splits=ns),
              {"config": cfg.name, "splits": ns})
        for name, c in BUILDS.items():
            per_sm, splits, kw = per_sm_small(c, T, H, kind == "decode")
            kwargs = fm.config_kwargs(c)
            for hold in (False, True):
                label = f"{name}-{'held' if hold else 'free'}"
                extra = {"config": fm.config_name(c), "per_sm_small": per_sm, "splits": splits, "BN": kw["BN"],
                         "WM": kw["WM"], "balanced": bool(kw["BALANCED"]), "smem_estimate": kw["smem_estimate"]}
                if kw["smem_estimate"] > SMEM_SMALL:  # its plan here would not launch on sm_89 / sm_120
                    rows.append({"kind": kind, "H": H, "T": T, "impl": label, "ok": True, "over_class": True, **extra})
                    print(f"{kind:>7} H{H:<3} T{T:<5} {label:<24} over the 99 KB class "
                          f"({kw['smem_estimate']} bytes): not timed", flush=True)
                    continue
                try:
                    timed(label, lambda i, kwargs=kwargs, hold=hold: fm.sparse_mla_fp8mma(
                        q, flat, i, bk.SM_SCALE, out=out, decode=kind == "decode",
                        per_sm=per_sm if hold else None, **kwargs), extra)
                except Exception as exc:  # a build that does not compile or launch here: recorded, not fatal
                    bad += 1
                    rows.append({"kind": kind, "H": H, "T": T, "impl": label, "ok": False, **extra,
                                 "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                    print(f"{kind:>7} H{H:<3} T{T:<5} {label:<24} ERROR {type(exc).__name__}: {str(exc)[:120]}",
                          flush=True)
    finally:
        mla.force_smem_class(None)
        fm.clear_plans()
    if fm_ok and kind == "decode":
        f = flashmla_padded(q, cache, H)
        for i in idx_sets:
            f(i)
        us = bk._graph_ms([lambda i=i: f(i) for i in idx_sets]) * 1e3
        rows.append({"kind": kind, "H": H, "T": T, "impl": "flashmla(h_pad=64)", "us": us, "ok": True})
        print(f"{kind:>7} H{H:<3} T{T:<5} {'flashmla(h_pad=64)':<24} {us:9.1f} us", flush=True)
    return rows, bad


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("--"):
        sys.exit("usage: small_class_probe.py OUT.json [--vendor DIR]")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        sys.exit("small_class_probe: needs an sm_90 GPU (the fp8-cache kernel's builds run there)")
    vendor = argv[argv.index("--vendor") + 1] if "--vendor" in argv else ".vendor"
    fm_err = bk.load_flashmla(vendor)
    rows, bad = [], 0
    for kind, H, T in CASES:
        r, b = run_case(kind, H, T, fm_err is None)
        rows += r
        bad += b
        torch.cuda.empty_cache()
    meta = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "flashmla": fm_err or "loaded",
            "builds": {k: fm.config_name(c) for k, c in BUILDS.items()}}
    return write_rows(argv[0], meta, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
