"""GPU check and timing of the fp8-product sparse-MLA kernel (`glm5lib.kernels.mla_gluon_fp8mma`) beside the shipped
Triton kernel and FlashMLA, in one process.

`PYTHONPATH=src python scripts/fp8mma_device.py OUT.json [--configs 2,3,2 2,2,2] [--no-time] [--budget-s S]
[--only CASE,...]` (--only: those check cases alone, by `case_name`, e.g. under compute-sanitizer with --no-time)
`PYTHONPATH=src python scripts/fp8mma_device.py OUT.json --ablate [--configs ...]`: each config's kernel taken apart
(`mla_gluon_fp8mma.ablate_launch`: the whole kernel, its gathers alone at its programs per SM, its
compute alone on rows gathered once) beside the fastest gather route of the same rows (`bench.gather.ceiling_rows`),
on the timed shapes below; then the checks of the configs
`PYTHONPATH=src python scripts/fp8mma_device.py OUT.json --batches [--batch-sizes 136,256,...] [--heads 8]`: the decode
at batch 1-512 (or the sizes given), 8 and 16 heads (or those given):
`mla.sparse_mla` as captured in a CUDA graph (its rule's choice), the shipped build with two and four key warps
forced, the Triton kernel and FlashMLA padded to 64 heads (`run_batches`; `glm5lib.bench.batches` reads and plots it)
`PYTHONPATH=src python scripts/fp8mma_device.py OUT.json --small-batch`: only batch 1-32 at 8 and 16 heads (graph
replay, and the host time of one eager call), the shipped config beside the Triton kernel and `sparse_mla` itself
(`mla.FP8MMA_MIN_T`'s and `mla.FP8MMA_MIN_T_GRAPH`'s question)

Checks (fp8_ds_mla cache of 32768 rows, `naive.sparse_mla_ref` in fp32, `checks`' bf16 tolerances): B in {1, 32, 128}
x H in {8, 16}; invalid indices (-1, out of range, duplicates, a token with none valid); top-k values that are not a
multiple of 32; 1, 4 and 12 heads; q scaled by 1e3 and 1e-3 (q's per-head power of two); rows whose magnitudes
span 2^-12..2^12 (the per-tile P factor); a paged cache view; 512 tokens (one split). Every config is checked, then
timed with the same method as `glm5lib bench` (CUDA-graph replay over rotated index sets):
- decode B32 / B128 at 8 / 16 heads, one 32K-token request per token (rows from HBM);
- prefill s_q 4096 over one 32K-token sequence (rows from L2), FlashMLA on the bf16 cache of the same values.
A config that fails to compile or run is recorded with its error and the run goes on. Needs a CUDA GPU.
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
from glm5lib.kernels import mla, mla_gluon_fp8mma as fm, naive
from glm5lib.kernels.checks import make_indices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_mla_device import compare  # noqa: E402  (the same comparison as the other Gluon scripts)

SM_SCALE = 1.0 / 16.0
N_ROWS = 32768
TOPK = 2048


def make_case(B, H, topk, invalid, seed, dev, q_scale=1.0, spread=0, paged=False):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, naive.D_QK, generator=gen) * q_scale).to(torch.bfloat16).to(dev)
    kv = torch.randn(N_ROWS, naive.D_QK, generator=gen)
    if spread:  # rows of very different magnitudes: chunk scales over 2^-spread..2^spread
        kv = kv * torch.exp2(torch.randint(-spread, spread + 1, (N_ROWS, 1), generator=gen).float())
    cache = naive.quantize_fp8_ds_mla(kv).to(dev)
    if paged:
        cache = cache.view(N_ROWS // 64, 64, -1)
    idx = make_indices(B, topk, N_ROWS, invalid, gen, dev)
    return q, cache, idx


CHECKS = [dict(B=B, H=H) for B in (1, 32, 128) for H in (8, 16)] + [
    dict(B=32, H=8, invalid="mixed"), dict(B=8, H=16, invalid="oob"), dict(B=4, H=16, topk=2000, invalid="neg"),
    dict(B=3, H=8, topk=37), dict(B=5, H=12, topk=1000), dict(B=2, H=16, topk=96, invalid="allinv"),
    dict(B=6, H=1), dict(B=6, H=4), dict(B=16, H=8, q_scale=1e3), dict(B=16, H=16, q_scale=1e-3),
    dict(B=16, H=8, spread=12), dict(B=16, H=16, spread=12, invalid="mixed"), dict(B=16, H=8, paged=True),
    # rows over 2^-3..2^3 under a small q: softmaxes that mix many keys of different scales (the 2^12 spread makes
    # them one-hot, which tests the rescale but not the mixed-scale sums)
    dict(B=16, H=8, spread=3, q_scale=0.05), dict(B=16, H=16, spread=3, q_scale=0.05, invalid="mixed"),
    dict(B=512, H=8), dict(B=512, H=16, invalid="mixed"),
    # more tokens than the H200's 528 slots at one split: the balanced schedule (`SCHEDS`) cuts tokens between
    # programs (top-k 1024: 16 tiles of 64 keys a token, 21.2 a program at 700 tokens, so almost every boundary cuts)
    dict(B=1100, H=8, invalid="mixed"), dict(B=700, H=5, topk=1024, invalid="neg"),
    # one split at 16 heads over few tiles (140 tokens, 264 slots of four-key-warp programs): the one-split 16-head
    # build small enough for compute-sanitizer's racecheck (`--only`)
    dict(B=140, H=16, topk=256, invalid="mixed"),
    # the same at 8 heads over 300 tokens: four key warps at one split (what a decode step's key-warps rule takes from
    # 1.5 waves, `mla_gluon_fp8mma.DECODE_K4_WAVES`), small enough for racecheck
    dict(B=300, H=8, topk=256, invalid="mixed")]


def case_name(c) -> str:
    tags = [f"B{c['B']}", f"H{c['H']}", f"K{c.get('topk', TOPK)}", c.get("invalid", "none")]
    tags += [f"q{c['q_scale']:g}"] if "q_scale" in c else []
    tags += [f"spread{c['spread']}"] if c.get("spread") else []
    tags += ["paged"] if c.get("paged") else []
    return "-".join(tags)


def run_checks(cfgs, dev, rows, broken, only=None):
    for ci, c in enumerate(CHECKS):
        if only is not None and case_name(c) not in only:
            continue
        q, cache, idx = make_case(c["B"], c["H"], c.get("topk", TOPK), c.get("invalid", "none"), ci, dev,
                                  c.get("q_scale", 1.0), c.get("spread", 0), c.get("paged", False))
        ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx, SM_SCALE, kv_format="fp8_ds_mla", chunk=32)
        name = case_name(c)
        to, tlse = mla.sparse_mla_launch(q, cache, idx, SM_SCALE, kv_format="fp8_ds_mla")
        r = {"case": name, "kernel": "triton", **compare(to, tlse, ro, rlse)}
        rows.append(r)
        print(json.dumps(r), flush=True)
        for cfg in cfgs:
            cn = fm.config_name(cfg)
            r = {"case": name, "kernel": "fp8mma", "config": cn}
            if cn in broken:
                r.update(ok=False, error="skipped: " + broken[cn])
            else:
                try:
                    o, lse = fm.sparse_mla_fp8mma(q, cache, idx, SM_SCALE, **fm.config_kwargs(cfg))
                    torch.cuda.synchronize()
                    r.update(compare(o, lse, ro, rlse))
                    r["splits"] = fm.plan_splits(c["B"], idx.shape[1], fm.head_groups(c["H"]), dev, None, cfg.nbuf,
                                                 cfg.q_terms, cfg.maxnreg, cfg.block_n, cfg.key_warps)[0]
                except Exception as exc:  # noqa: BLE001
                    msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                    r.update(ok=False, error=msg[-1500:])
                    broken[cn] = msg.splitlines()[-1][:300] if msg else repr(exc)
            rows.append(r)
            print(json.dumps(r), flush=True)
        del q, cache, idx
        torch.cuda.empty_cache()


def _time_flashmla_decode(q, cache, idx_sets, res, ro=None):
    """FlashMLA's sparse decode over the same fp8_ds_mla cache, q padded to 64 heads, timed as the other launches
    (graph replay over the rotated index sets): res["flashmla_us"], or res["flashmla_error"]; with `ro` (fp32 output
    on idx_sets[0]) also res["flashmla_ok"], its relative error under 1e-2 (its lse is its own convention)."""
    B, H, _ = q.shape
    try:
        q4 = torch.zeros(B, 1, 64, naive.D_QK, device="cuda", dtype=torch.bfloat16)
        q4[:, 0, :H] = q
        kv4 = cache.view(torch.float8_e4m3fn).unsqueeze(2)
        fms = [bk.FlashMLADecode() for _ in idx_sets]
        for f, i in zip(fms, idx_sets):
            f(q4, kv4, i.unsqueeze(1))
        if ro is not None:
            fo = fms[0](q4, kv4, idx_sets[0].unsqueeze(1))[0][:, 0, :H].float()
            res["flashmla_ok"] = bool(torch.isfinite(fo).all()) and float((fo - ro).norm() / ro.norm()) < 1e-2
        res["flashmla_us"] = 1e3 * bk._graph_ms([lambda f=f, i=i: f(q4, kv4, i.unsqueeze(1))
                                                 for f, i in zip(fms, idx_sets)])
    except Exception as exc:  # noqa: BLE001
        res["flashmla_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def run_timing(cfgs, ceil, rows, broken, deadline, have_fm):
    for B in (32, 128):
        for H in (8, 16):
            if time.time() > deadline:
                rows.append({"kind": "decode", "B": B, "H": H, "error": "skipped: time budget"})
                continue
            q, cache, base = bk._make_decode(B, H, 32768, TOPK, "fp8_ds_mla")
            R = bk._rotations(bk.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla"))
            idx_sets = [bk._rand_indices(B, 32768, TOPK, base) for _ in range(R)]
            out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
            floor_us = bk.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla") / ceil["copy_GBps"] / 1e3
            res = {"kind": "decode", "B": B, "H": H, "floor_us": floor_us}
            res["triton_us"] = 1e3 * bk._graph_ms([lambda i=i: mla.sparse_mla_launch(
                q, cache, i, SM_SCALE, kv_format="fp8_ds_mla", out=out) for i in idx_sets])
            for cfg in cfgs:
                cn = fm.config_name(cfg)
                if cn in broken:
                    continue
                res[cn + "_us"] = 1e3 * bk._graph_ms([lambda i=i: fm.sparse_mla_fp8mma(
                    q, cache, i, SM_SCALE, **fm.config_kwargs(cfg), out=out) for i in idx_sets])
            # the 99 KB class's build with that class's split plan (what sm_89 / sm_120 would run), and the Triton
            # kernel's config of that class, both on this GPU
            small = fm.CONFIG_BY_CLASS["small"]
            mla.force_smem_class("small")
            try:
                res["small_class_" + fm.config_name(small) + "_us"] = 1e3 * bk._graph_ms([
                    lambda i=i: fm.sparse_mla_fp8mma(q, cache, i, SM_SCALE, **fm.config_kwargs(small), out=out)
                    for i in idx_sets])
                res["small_class_triton_us"] = 1e3 * bk._graph_ms([lambda i=i: mla.sparse_mla_launch(
                    q, cache, i, SM_SCALE, kv_format="fp8_ds_mla", out=out) for i in idx_sets])
            finally:
                mla.force_smem_class(None)
            if have_fm:
                _time_flashmla_decode(q, cache, idx_sets, res)
            rows.append(res)
            print(json.dumps(res), flush=True)
            del q, cache, idx_sets, out
            torch.cuda.empty_cache()
    for H in (8, 16):
        if time.time() > deadline:
            rows.append({"kind": "prefill", "H": H, "error": "skipped: time budget"})
            continue
        cache, kvb = bk.fp8_ds_mla_rows(32768)
        q = torch.randn(4096, H, naive.D_QK, device="cuda", dtype=torch.bfloat16)
        idx = bk._rand_indices(4096, 32768, TOPK)
        out = torch.empty(4096, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
        res = {"kind": "prefill", "T": 4096, "H": H}
        res["triton_us"] = 1e3 * bk._median_ms(lambda: mla.sparse_mla_launch(q, cache, idx, SM_SCALE,
                                                                            kv_format="fp8_ds_mla", out=out))
        for cfg in cfgs:
            cn = fm.config_name(cfg)
            if cn in broken:
                continue
            res[cn + "_us"] = 1e3 * bk._median_ms(lambda: fm.sparse_mla_fp8mma(
                q, cache, idx, SM_SCALE, **fm.config_kwargs(cfg), out=out))
        if have_fm:
            qp = bk.pad_heads(q, 64)
            res["flashmla_bf16_us"] = 1e3 * bk._median_ms(lambda: bk.flashmla_prefill(qp, kvb.unsqueeze(1),
                                                                                     idx.unsqueeze(1)))
        rows.append(res)
        print(json.dumps(res), flush=True)
        del kvb, cache, q, idx, out
        torch.cuda.empty_cache()


def run_ablation(cfgs, ceil, rows, deadline):
    """`--ablate`: per timed shape and config, the time of each part (`fm.ABLATIONS`) and what they say about
    overlap: `serial_us` (gathers + compute, nothing overlapped) and `overlap` (`bench.parts.overlap`: 1 when the
    shorter part is hidden entirely, 0 when none of it is)."""
    from glm5lib.bench.gather import ceiling_rows
    from glm5lib.bench.parts import overlap

    rows += ceiling_rows(ceil, formats=("fp8_ds_mla",))
    shapes = [("decode", B, H) for B in (32, 128) for H in (8, 16)] + [("prefill", 4096, H) for H in (8, 16)]
    for kind, B, H in shapes:
        if time.time() > deadline:
            rows.append({"kind": "ablate-" + kind, "B": B, "H": H, "error": "skipped: time budget"})
            continue
        if kind == "decode":
            q, cache, base = bk._make_decode(B, H, 32768, TOPK, "fp8_ds_mla")
            R = bk._rotations(bk.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla"))
            idx_sets = [bk._rand_indices(B, 32768, TOPK, base) for _ in range(R)]
        else:
            cache = naive.quantize_fp8_ds_mla(torch.randn(32768, naive.D_QK, device="cuda", dtype=torch.bfloat16))
            q = torch.randn(B, H, naive.D_QK, device="cuda", dtype=torch.bfloat16)
            idx_sets = [bk._rand_indices(B, 32768, TOPK)]
        out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
        for cfg in cfgs:
            res = {"kind": "ablate-" + kind, "B": B, "H": H, "config": fm.config_name(cfg),
                   "splits": fm.plan_splits(B, TOPK, fm.head_groups(H), q.device, None, cfg.nbuf, cfg.q_terms,
                                            cfg.maxnreg, cfg.block_n, cfg.key_warps)[0]}
            for part in fm.ABLATIONS:
                fns = [lambda i=i, part=part: fm.ablate_launch(q, cache, i, SM_SCALE, part, cfg, out=out)
                       for i in idx_sets]
                try:
                    ms = bk._graph_ms(fns) if kind == "decode" else bk._median_ms(fns[0])
                    res[part + "_us"] = 1e3 * ms
                except Exception as exc:  # noqa: BLE001
                    res[part + "_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if overlap(res) is not None:
                res["serial_us"] = res["gathers_us"] + res["compute_us"]
                res["overlap"] = overlap(res)
            if kind == "decode":
                res["floor_us"] = bk.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla") / ceil["copy_GBps"] / 1e3
            rows.append(res)
            print(json.dumps(res), flush=True)
        del q, cache, idx_sets, out
        torch.cuda.empty_cache()


def run_small_batch(rows):
    """Batch 1-32 decode at 8 and 16 heads: GPU time (graph replay) and one eager call's host time, both kernels;
    and `sparse_mla` itself in graph replay ("dispatch"): under capture it takes the fp8-cache kernel from
    `mla.FP8MMA_MIN_T_GRAPH` tokens, so its time must follow that kernel's from there and Triton's below."""
    import time as _time

    cfg = fm.CONFIG_BY_CLASS["big"]
    for H, B in [(8, b) for b in (1, 4, 8, 12, 16, 24, 32)] + [(16, b) for b in (8, 16, 24)]:
        q, cache, base = bk._make_decode(B, H, 32768, TOPK, "fp8_ds_mla")
        idx_sets = [bk._rand_indices(B, 32768, TOPK, base) for _ in range(8)]
        out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
        calls = {"triton": lambda i: mla.sparse_mla_launch(q, cache, i, SM_SCALE, kv_format="fp8_ds_mla", out=out),
                 "fp8mma": lambda i: fm.sparse_mla_fp8mma(q, cache, i, SM_SCALE, **fm.config_kwargs(cfg), out=out)}
        res = {"kind": "small-batch", "B": B, "H": H, "config": fm.config_name(cfg),
               "dispatch_graph_us": 1e3 * bk._graph_ms(
                   [lambda i=i: mla.sparse_mla(q, cache, i, SM_SCALE, kv_format="fp8_ds_mla", out=out)
                    for i in idx_sets]),
               "graph_rule": "fp8mma" if mla.fp8mma_shape(B, H, "fp8_ds_mla", graph=True) else "triton"}
        for name, f in calls.items():
            res[name + "_graph_us"] = 1e3 * bk._graph_ms([lambda i=i, f=f: f(i) for i in idx_sets])
            for _ in range(20):
                f(idx_sets[0])
            torch.cuda.synchronize()
            host = []
            for _ in range(50):
                t0 = _time.perf_counter()
                f(idx_sets[0])
                host.append(_time.perf_counter() - t0)
                torch.cuda.synchronize()
            res[name + "_eager_host_us"] = 1e6 * sorted(host)[len(host) // 2]
        rows.append(res)
        print(json.dumps(res), flush=True)


BATCHES = (1, 8, 16, 32, 64, 96, 128, 136, 192, 256, 512)


def _batch_row(B, H, ceil, have_fm, builds):
    """One (batch, heads) row of `run_batches`."""
    G = fm.head_groups(H)
    q, cache, base = bk._make_decode(B, H, 32768, TOPK, "fp8_ds_mla")
    R = bk._rotations(bk.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla"))
    idx_sets = [bk._rand_indices(B, 32768, TOPK, base) for _ in range(R)]
    out = torch.empty(B, H, naive.D_NOPE, device="cuda", dtype=torch.bfloat16)
    ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx_sets[0], SM_SCALE, kv_format="fp8_ds_mla", chunk=32)
    dev = q.device
    wm = fm.plan_key_warps(B, TOPK, G, dev, decode=True)  # the rule as the captured decode asks it
    res = {"kind": "batch", "B": B, "H": H, "rule_key_warps": wm,
           "rule_splits": fm.plan_splits(B, TOPK, G, dev, key_warps=wm)[0],
           "graph_route": "fp8mma" if mla.fp8mma_shape(B, H, "fp8_ds_mla", graph=True) else "triton",
           "floor_us": bk.sparse_mla_kv_bytes(B, TOPK, "fp8_ds_mla") / ceil["copy_GBps"] / 1e3}
    calls = {"dispatch": lambda i: mla.sparse_mla(q, cache, i, SM_SCALE, kv_format="fp8_ds_mla", out=out),
             "triton": lambda i: mla.sparse_mla_launch(q, cache, i, SM_SCALE, kv_format="fp8_ds_mla", out=out)}
    for name, cfg in builds.items():
        calls[name] = lambda i, cfg=cfg: fm.sparse_mla_fp8mma(q, cache, i, SM_SCALE, **fm.config_kwargs(cfg), out=out)
        res[name + "_splits"] = fm.plan_splits(B, TOPK, G, dev, key_warps=cfg.key_warps)[0]
    for name, f in calls.items():
        try:
            out.fill_(float("nan"))  # a launch that writes nothing must not pass on the last one's output
            o, lse = f(idx_sets[0])
            torch.cuda.synchronize()
            res[name + "_ok"] = compare(o, lse, ro, rlse)["ok"]
            res[name + "_us"] = 1e3 * bk._graph_ms([lambda i=i: f(i) for i in idx_sets])
        except Exception as exc:  # noqa: BLE001
            res[name + "_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if have_fm:
        _time_flashmla_decode(q, cache, idx_sets, res, ro)
    if "dispatch_us" in res:  # timed first and again last: the order's share of any gap to the forced builds
        res["dispatch_again_us"] = 1e3 * bk._graph_ms([lambda i=i: calls["dispatch"](i) for i in idx_sets])
    return res


def run_batches(rows, ceil, have_fm, save, batches=BATCHES, heads=(8, 16)):
    """`--batches`: the decode (one 32K-token request per token, top-k 2048) at every batch in `batches`, 8 and 16
    heads, timed as `glm5lib bench` times it (CUDA-graph replay over rotated index sets): `mla.sparse_mla` itself
    (what vLLM's captured decode runs: its rule picks the kernel, the key warps and the splits), the shipped
    fp8-cache build with two and with four key warps forced (`Config.key_warps`), the Triton kernel, and FlashMLA
    padded to 64 heads (on sm_90 also four key warps with S as wgmma, `Config.wgmma` 2: "k4wg"). Each launch's
    output on the first index set is checked against fp32 before it is timed
    (`compare`; FlashMLA's by its relative error, its lse being its own): an eager call, so `sparse_mla` itself takes
    the Triton kernel there below `mla.FP8MMA_MIN_T` while its graph takes the fp8-cache kernel from
    `mla.FP8MMA_MIN_T_GRAPH` (the k2 / k4 rows check that kernel). A row whose case fails records the error and the
    run goes on; `save()` writes the JSON after every row."""
    big = fm.CONFIG_BY_CLASS["big"]
    builds = {"k2": big._replace(key_warps=2), "k4": big._replace(key_warps=4)}
    if torch.cuda.get_device_capability()[0] == 9:  # four key warps with S as wgmma one chunk in flight (sm_90 only)
        builds["k4wg"] = big._replace(key_warps=4, wgmma=2)
    for H in heads:
        for B in batches:
            try:
                res = _batch_row(B, H, ceil, have_fm, builds)
            except Exception as exc:  # noqa: BLE001  (e.g. out of memory building the case)
                res = {"kind": "batch", "B": B, "H": H, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rows.append(res)
            print(json.dumps(res), flush=True)
            save()
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_path = argv[0] if argv and not argv[0].startswith("--") else "fp8mma_device.json"
    cfgs = list(fm.CONFIGS)
    # launched directly: the dispatcher's own choice is timed by `glm5lib bench`
    if "--configs" in argv:
        i = argv.index("--configs") + 1
        cfgs = []
        while i < len(argv) and not argv[i].startswith("--"):
            cfgs.append(fm.Config(*(int(x) for x in argv[i].split(","))))
            i += 1
    budget = float(argv[argv.index("--budget-s") + 1]) if "--budget-s" in argv else 400.0
    only = set(argv[argv.index("--only") + 1].split(",")) if "--only" in argv else None
    if only is not None and ("--batches" in argv or "--small-batch" in argv):
        sys.exit("fp8mma_device: --only selects check cases; --batches and --small-batch run none")
    if only is not None and not only <= {case_name(c) for c in CHECKS}:
        sys.exit(f"fp8mma_device: --only names no check case: {sorted(only - {case_name(c) for c in CHECKS})}")
    if ("--batch-sizes" in argv or "--heads" in argv) and "--batches" not in argv:
        sys.exit("fp8mma_device: --batch-sizes and --heads go with --batches")
    sizes, heads = BATCHES, (8, 16)
    try:
        if "--batch-sizes" in argv:
            sizes = tuple(int(b) for b in argv[argv.index("--batch-sizes") + 1].split(","))
        if "--heads" in argv:
            heads = tuple(int(h) for h in argv[argv.index("--heads") + 1].split(","))
    except (IndexError, ValueError):
        sys.exit("fp8mma_device: --batch-sizes and --heads take comma-separated integers, e.g. --batch-sizes 256,512")
    if min(sizes) < 1 or not all(1 <= h <= 16 for h in heads):
        sys.exit(f"fp8mma_device: batch sizes must be >= 1 and heads 1-16, got {sizes}, {heads}")
    if not torch.cuda.is_available():
        sys.exit("fp8mma_device: needs a CUDA GPU (Gluon kernels do not run on the CPU or in the interpreter)")
    t0 = time.time()
    dev = torch.device("cuda")
    info = {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(dev),
            "torch": torch.__version__, "triton": triton.__version__, "configs": [fm.config_name(c) for c in cfgs],
            "flashmla": bk.load_flashmla()}
    print(json.dumps(info), flush=True)
    rows, broken = [], {}
    if "--batches" in argv:
        info["ceilings"] = bk.measure_ceilings()

        def save():
            info["elapsed_s"] = time.time() - t0
            info["failed_checks"] = sum(1 for r in rows for k, v in r.items()
                                        if (k.endswith("_ok") and v is False) or k.endswith("error"))
            with open(out_path, "w") as f:
                json.dump({"meta": info, "rows": rows}, f, indent=1)

        run_batches(rows, info["ceilings"], info["flashmla"] is None, save, sizes, heads)
        save()
        print(json.dumps({k: info[k] for k in ("failed_checks", "elapsed_s")}), flush=True)
        return 1 if info["failed_checks"] else 0
    if "--small-batch" in argv:
        run_small_batch(rows)
        info["elapsed_s"] = time.time() - t0
        with open(out_path, "w") as f:
            json.dump({"meta": info, "rows": rows}, f, indent=1)
        return 0
    if "--ablate" in argv:
        ceil = bk.measure_ceilings()
        info["ceilings"] = ceil
        run_ablation(cfgs, ceil, rows, t0 + budget)
        info["ablate_s"] = time.time() - t0
    run_checks(cfgs, dev, rows, broken, only)
    info["checks_s"] = time.time() - t0
    if "--no-time" not in argv and "--ablate" not in argv:
        ceil = bk.measure_ceilings()
        info["ceilings"] = ceil
        run_timing(cfgs, ceil, rows, broken, t0 + budget, info["flashmla"] is None)
    info["elapsed_s"] = time.time() - t0
    bad = [r for r in rows if r.get("ok") is False]
    info["failed_checks"] = len(bad)
    with open(out_path, "w") as f:
        json.dump({"meta": info, "rows": rows}, f, indent=1)
    print(json.dumps({k: info[k] for k in ("failed_checks", "elapsed_s")}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
