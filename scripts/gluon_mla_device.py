"""GPU check and timing of the Gluon sparse-MLA decode kernel (`glm5lib.kernels.mla_gluon`) against the Triton one.

`PYTHONPATH=src python scripts/gluon_mla_device.py OUT.json [--quick | --only-ws | --only-nbuf1]`

Cases (fp8_ds_mla cache of 32768 rows, top-k 2048 distinct random indices): B in {1, 32, 128} x H in {8, 16};
plus invalid indices (-1, out of range, duplicates, a token with none valid) and top-k values that are not a
multiple of BLOCK_N. Every Gluon config is checked against `naive.sparse_mla_ref` with `checks`' bf16 tolerances
and against `mla.sparse_mla_launch`; then the regular cases are timed, Triton and every Gluon config in the same
process with the same method (`triton.testing.do_bench_cudagraph`: CUDA-graph replay, no host time).
A config that fails to compile or run is recorded with its error and the run goes on. `--quick`: only the
32-key, 2-buffer configs; `--only-ws`: the warp-specialized configs, `--only-nbuf1`: the single-slot ring, each
with the default Gluon config (and Triton, as always) for reference. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
import triton

from glm5lib.kernels import mla, mla_gluon, naive
from glm5lib.kernels.checks import _tol, make_indices

SM_SCALE = 1.0 / 16.0  # GLM-5: (192 + 64) ** -0.5
N_ROWS = 32768
TOPK = 2048


def compare(o, lse, ro, rlse) -> dict:
    o32 = o.float()
    diff = (o32 - ro).nan_to_num(nan=1e9)
    rn = float(ro.norm())
    rel = float(diff.norm() / rn) if rn > 0 else float(diff.norm())
    cd = naive.cos_diff(o32.nan_to_num(nan=1e9), ro)
    fin = torch.isfinite(rlse)
    fin_same = bool(torch.equal(fin, torch.isfinite(lse)))
    lse_abs = float((lse[fin] - rlse[fin]).abs().max()) if fin.any() else 0.0
    # lse against 1e-3 plus 4e-6 of its size: at |lse| in the thousands (q scaled by 1e3, rows
    # scaled by 2^12) the fp32 sums of 576 products differ by more than 1e-3 between any two summation orders
    lse_excess = float(((lse[fin] - rlse[fin]).abs() - 4e-6 * rlse[fin].abs()).max()) if fin.any() else 0.0
    none_ok = True
    if (~fin).any():  # tokens without a valid key: zeros and -inf
        none_ok = bool(torch.all(o32[~fin] == 0)) and bool(torch.all(torch.isneginf(lse[~fin])))
    rel_tol, cos_tol, lse_tol = _tol(torch.bfloat16)
    ok = (not torch.isnan(o32).any().item()) and fin_same and none_ok and rel <= rel_tol and cd <= cos_tol \
        and lse_excess <= lse_tol
    return {"ok": bool(ok), "rel": rel, "cos_diff": float(cd), "lse_abs": lse_abs, "lse_excess": lse_excess,
            "max_abs": float(diff.abs().max()), "lse_finite_same": fin_same, "no_key_rows_ok": none_ok}


def make_case(B, H, topk, invalid, seed, dev):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, naive.D_QK, generator=gen).to(torch.bfloat16).to(dev)
    kv = torch.randn(N_ROWS, naive.D_QK, generator=gen)
    cache = naive.quantize_fp8_ds_mla(kv).to(dev)
    idx = make_indices(B, topk, N_ROWS, invalid, gen, dev)
    return q, cache, idx


def splits_of(B, topk, cfg, dev, waves) -> int:
    """The split count `sparse_mla_gluon` picks for a CONFIGS entry."""
    kw = mla_gluon.config_kwargs(cfg)
    depth = kw["depth"] if kw.get("ws") else 0
    return mla_gluon.plan_splits(B, topk, cfg[0], dev, None, waves, cfg[2], depth, kw.get("maxnreg"), cfg[1])[0]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_path = argv[0] if argv else "gluon_mla_device.json"
    quick = "--quick" in argv
    if not torch.cuda.is_available():
        sys.exit("gluon_mla_device: needs a CUDA GPU (Gluon kernels do not run on the CPU or in the interpreter)")
    dev = torch.device("cuda")
    t0 = time.time()
    info = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(dev),
            "torch": torch.__version__, "triton": triton.__version__,
            "have_gluon": mla_gluon.HAVE_GLUON, "num_sms": torch.cuda.get_device_properties(dev).multi_processor_count}
    print(json.dumps(info), flush=True)
    if "--only-ws" in argv:
        cfgs = [mla_gluon.DEFAULT] + mla_gluon.WS_CONFIGS
    elif "--only-nbuf1" in argv:  # the single-slot ring (and register-capped builds, when listed in CONFIGS)
        cfgs = [mla_gluon.DEFAULT] + [c for c in mla_gluon.CONFIGS if c[2] == 1]
    elif quick:
        cfgs = [c for c in mla_gluon.CONFIGS if c[:3] == (32, 4, 2)]
    else:
        cfgs = mla_gluon.CONFIGS
    checks = [(B, H, TOPK, "none") for B in (1, 32, 128) for H in (8, 16)]
    checks += [(32, 8, TOPK, "mixed"), (8, 16, TOPK, "oob"), (4, 16, 2000, "neg"), (3, 8, 37, "none"),
               (5, 12, 1000, "none"), (2, 16, 96, "allinv")]
    rows = []
    broken = {}  # config -> error: skip it from then on
    timing = {}  # (B, H) -> inputs kept for timing
    for ci, (B, H, topk, invalid) in enumerate(checks):
        q, cache, idx = make_case(B, H, topk, invalid, ci, dev)
        ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx, SM_SCALE, kv_format="fp8_ds_mla", chunk=32)
        case = f"B{B}-H{H}-K{topk}-{invalid}"
        to, tlse = mla.sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format="fp8_ds_mla")
        r = {"case": case, "kernel": "triton", "config": "shipped"}
        r.update(compare(to, tlse, ro, rlse))
        rows.append(r)
        print(json.dumps(r), flush=True)
        for cfg in cfgs:
            name = mla_gluon.config_name(cfg)
            r = {"case": case, "kernel": "gluon", "config": name}
            if name in broken:
                r.update(ok=False, error="skipped: " + broken[name])
            else:
                try:
                    o, lse = mla_gluon.sparse_mla_gluon(q, cache, idx, SM_SCALE, **mla_gluon.config_kwargs(cfg))
                    torch.cuda.synchronize()
                    r.update(compare(o, lse, ro, rlse))
                    vt = compare(o, lse, to.float(), tlse)
                    r.update(rel_vs_triton=vt["rel"], lse_vs_triton=vt["lse_abs"])
                    r["splits"] = splits_of(B, topk, cfg, dev, None)
                except Exception as exc:  # noqa: BLE001
                    msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                    r.update(ok=False, error=msg[-2000:])
                    broken[name] = msg.splitlines()[-1][:300] if msg else repr(exc)
                    torch.cuda.synchronize()
            rows.append(r)
            print(json.dumps(r), flush=True)
        if invalid == "none" and topk == TOPK:
            timing[(B, H)] = (q, cache, idx)
        else:
            del q, cache, idx
        del ro, rlse

    bench = []
    for (B, H), (q, cache, idx) in timing.items():
        cfg_t = mla.pick_config(B, H, TOPK, "fp8_ds_mla", mla.smem_class(dev), info["num_sms"])
        runs = [("triton", None, None)]  # (name, gluon config, waves)
        runs += [("gluon " + mla_gluon.config_name(c), c, None) for c in cfgs if mla_gluon.config_name(c) not in broken]
        if B > 1:  # the split rule's waves, tried around each 32-key, 2-buffer config's own
            for c in cfgs:
                if c[0] == 32 and c[2] <= 2 and mla_gluon.config_name(c) not in broken:
                    kw = mla_gluon.config_kwargs(c)
                    own = mla_gluon.programs_per_sm(c[0], c[2], mla.smem_class(dev), kw["depth"] if kw.get("ws") else 0,
                                                    kw.get("maxnreg"), c[1])
                    runs += [(f"gluon {mla_gluon.config_name(c)} waves{w}", c, w) for w in (1, 2, 3, 4) if w != own]
        for kname, c, wv in runs:
            if c is None:
                fn = (lambda: mla.sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format="fp8_ds_mla"))
                splits = mla.config_num_splits(B, H, TOPK, cfg_t, dev)
            else:
                fn = (lambda c=c, wv=wv: mla_gluon.sparse_mla_gluon(
                    q, cache, idx, SM_SCALE, waves=wv, **mla_gluon.config_kwargs(c)))
                splits = splits_of(B, TOPK, c, dev, wv)
            r = {"B": B, "H": H, "kernel": kname, "splits": splits}
            try:
                fn()
                torch.cuda.synchronize()
                r["us"] = 1e3 * triton.testing.do_bench_cudagraph(fn, rep=50 if quick else 100)
                r["TB/s"] = mla.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla") / (r["us"] * 1e-6) / 1e12
            except Exception as exc:  # noqa: BLE001
                r["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1000:]
            bench.append(r)
            print(json.dumps(r), flush=True)

    print()
    print(f"{'case':28} {'kernel':26} {'ok':>3} {'rel':>9} {'cos':>9} {'lse':>9} {'rel_vs_tri':>10}")
    for r in rows:
        print(f"{r['case']:28} {r['kernel'] + ' ' + r['config']:26} {'yes' if r.get('ok') else 'NO':>3} "
              f"{r.get('rel', float('nan')):9.2e} {r.get('cos_diff', float('nan')):9.2e} "
              f"{r.get('lse_abs', float('nan')):9.2e} {r.get('rel_vs_triton', float('nan')):10.2e}"
              + (f"  {r['error'].splitlines()[-1][:80]}" if r.get("error") else ""))
    print()
    print(f"{'B':>4} {'H':>3} {'kernel':34} {'splits':>6} {'us':>9} {'TB/s':>6}")
    for r in bench:
        print(f"{r['B']:4d} {r['H']:3d} {r['kernel']:34} {r.get('splits', 0):6d} {r.get('us', float('nan')):9.1f} "
              f"{r.get('TB/s', float('nan')):6.2f}"
              + (f"  {r['error'].splitlines()[-1][:80]}" if r.get("error") else ""))
    info["seconds"] = time.time() - t0
    with open(out_path, "w") as f:
        json.dump({"info": info, "checks": rows, "bench": bench, "broken": broken}, f, indent=1)
    print(f"wrote {out_path} ({info['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
