"""GGUF decode ops on a CUDA GPU, side by side, without vLLM: GLM-5 layers at tensor parallel 8.

`python -m glm5lib.bench.gguf_ops --out DIR [--plugin-src PATH] [--commit SHA] [--sweep]`

For each quantization type (Q4_K, Q5_K, Q6_K, Q8_0), each per-rank GLM-5 shape and batch 1 / 8 / 64 it times
(a) a bf16 matmul of the dequantized weight (cuBLAS), (b) vllm-gguf-plugin's CUDA extension built from the `csrc/`
of its wheel (`torch.utils.cpp_extension.load`; the op its linear method picks: MMVQ at small batch, MMQ above),
(c) the plugin's Triton path, (d) `glm5lib.kernels.gguf`; the routed experts (256, top-8) the same way through the
plugin's MoE ops and `gguf_moe`. Each result carries its error against the fp32 product with the dequantized
weight, its time by `triton.testing.do_bench` (L2 flushed before each call) and `do_bench_cudagraph` (launch gaps
removed; weights rotated over enough copies to leave the L2), and weight bytes per second against the device copy
bandwidth measured in the same run. Writes `<name>.json` (+ `.png`) under --out; prints every target with its
measured ratio and goal.

The plugin is imported without vLLM: its package `__init__` (which imports vLLM) is replaced by an empty package
module whose path is the plugin's folder, so `vllm_gguf_plugin.ops` and its Triton modules load on their own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import traceback
import types
from pathlib import Path

import torch

from glm5lib.errors import UserError

# (name, N, K) per rank at TP8; `replicated` ones are whole on every rank
SHAPES = [
    ("q_b", 2048, 2048),
    ("o_proj", 6144, 2048),
    ("q_a+kv_a", 2624, 6144),
    ("shared_gate_up", 512, 6144),
    ("shared_down", 6144, 256),
    ("dense_gate_up", 3072, 6144),
    ("dense_down", 6144, 1536),
    ("lm_head", 19360, 6144),
]
MOE = dict(experts=256, inter=256, hidden=6144, top_k=8)  # w13 [256, 512, 6144], w2 [256, 6144, 256]
TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q8_0"]
BATCHES = [1, 8, 64]
TARGET_TYPES = ("Q4_K", "Q6_K", "Q8_0")
PATHS = {"bf16", "plugin_cuda", "plugin_triton", "glm5lib"}  # --skip removes some
TARGET_COPY = 0.60  # weight bytes per second / copy bandwidth at batch 1-8
L2_ROTATE_BYTES = 200 << 20  # weights rotated over at least this many bytes in graph timings


def _log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------- the plugin


def load_plugin(src: Path, build_dir: Path, build_ext: bool = True) -> dict:
    """Import vllm_gguf_plugin's ops without vLLM and build its CUDA extension from csrc. Returns a dict with
    `ops` (module or None), `ext` (True when torch.ops._C_gguf is usable) and the errors met."""
    info: dict = {"ops": None, "ext": False, "ext_error": None, "ops_error": None, "ext_build_s": None}
    pkg_dir = src / "vllm_gguf_plugin"
    if not pkg_dir.is_dir():
        info["ops_error"] = f"no vllm_gguf_plugin under {src}"
        return info
    pkg = types.ModuleType("vllm_gguf_plugin")
    pkg.__path__ = [str(pkg_dir)]
    sys.modules["vllm_gguf_plugin"] = pkg
    if build_ext:
        t0 = time.time()
        try:
            from torch.utils.cpp_extension import load

            build_dir.mkdir(parents=True, exist_ok=True)
            major, minor = torch.cuda.get_device_capability()
            arch = f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"
            load(name="_C_gguf", sources=[str(pkg_dir / "csrc" / "torch_bindings.cpp"),
                                          str(pkg_dir / "csrc" / "gguf" / "gguf_kernel.cu")],
                 extra_cflags=["-O3", "-DUSE_CUDA"], extra_cuda_cflags=["-O3", "-DUSE_CUDA", arch],
                 build_directory=str(build_dir), verbose=False)
            info["ext"] = hasattr(torch.ops._C_gguf, "ggml_mul_mat_vec_a8")
        except Exception as exc:  # recorded, the other paths still run
            info["ext_error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
        info["ext_build_s"] = round(time.time() - t0, 1)
    try:
        import importlib

        info["ops"] = importlib.import_module("vllm_gguf_plugin.ops")
    except Exception as exc:
        info["ops_error"] = f"{type(exc).__name__}: {exc}"
    return info


# ------------------------------------------------------------------------------------------ data and refs


def random_gguf(qtype: int, n: int, k: int, device, gen: torch.Generator, lead: tuple = ()) -> torch.Tensor:
    """Valid GGUF rows with random codes and scales: random bytes with the fp16 super-scales set to small
    positive values (random bytes there would be NaN/Inf half the time)."""
    from glm5lib.kernels.gguf import QTYPES, Q6_K

    qk, bb, _ = QTYPES[qtype]
    nb = k // qk
    shape = (*lead, n, nb, bb)
    w = torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=gen)

    def half_bytes(lo, hi):
        v = torch.rand((*lead, n, nb), device=device, generator=gen) * (hi - lo) + lo
        return v.half().view(torch.uint8).view(*lead, n, nb, 2)

    if qtype == Q6_K:
        w[..., 208:210] = half_bytes(2e-3, 6e-3)
    else:
        w[..., 0:2] = half_bytes(2e-3, 6e-3) if qk == 256 else half_bytes(1e-2, 3e-2)
        if qk == 256 and qtype != Q6_K:
            w[..., 2:4] = half_bytes(0.0, 4e-3)
    return w.view(*lead, n, nb * bb)


def dequantize_gpu(plugin: dict, w: torch.Tensor, qtype: int, n: int, k: int) -> torch.Tensor:
    """fp32 [n, k] on the GPU through the plugin's dequantize kernels (checked against gguf-py separately)."""
    if plugin.get("ext"):
        try:
            return torch.ops._C_gguf.ggml_dequantize(w, qtype, n, k, torch.float32)
        except Exception:
            pass
    if plugin.get("ops") is not None:
        from vllm_gguf_plugin.triton.dequantize.interface import ggml_dequantize_triton

        return ggml_dequantize_triton(w, qtype, n, k, torch.float32).float()
    from glm5lib.kernels.gguf_naive import dequantize

    return dequantize(w, qtype).to(w.device)


def check_dequantize(plugin: dict, qtype: int, device, gen) -> float:
    """max |plugin dequantize - gguf-py dequantize| / max |w| on 32 random rows of 1024 values."""
    from glm5lib.kernels.gguf_naive import dequantize

    w = random_gguf(qtype, 32, 1024, device, gen)
    a = dequantize_gpu(plugin, w, qtype, 32, 1024).cpu()
    b = dequantize(w.cpu(), qtype)
    return float((a - b).abs().max() / b.abs().max())


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).norm() / ref.norm())


# --------------------------------------------------------------------------------------------------- timing


def timings(fn_of_copy, copies: int, eager: bool = True, graph: bool = True) -> dict:
    """Median microseconds by do_bench (L2 flushed) and do_bench_cudagraph (round robin over weight copies)."""
    import triton.testing as tt

    res = {}
    it = itertools.count()

    def rot():
        return fn_of_copy(next(it) % copies)

    rot()
    torch.cuda.synchronize()
    if eager:
        res["us"] = tt.do_bench(rot, warmup=5, rep=25, return_mode="median") * 1e3
    if graph:
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                res["us_graph"] = tt.do_bench_cudagraph(rot, rep=20, return_mode="median") * 1e3
        except Exception as exc:
            res["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return res


def ceilings(device) -> dict:
    import triton.testing as tt

    n = 1 << 28  # 1 GiB of fp32
    a = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)
    ms = tt.do_bench(lambda: b.copy_(a), warmup=10, rep=100, return_mode="median")
    copy_bw = 2 * a.numel() * 4 / (ms * 1e-3)
    del a, b
    s = 8192
    x = torch.randn(s, s, dtype=torch.bfloat16, device=device)
    y = torch.randn(s, s, dtype=torch.bfloat16, device=device)
    ms = tt.do_bench(lambda: x @ y, warmup=10, rep=100, return_mode="median")
    flops = 2 * s ** 3 / (ms * 1e-3)
    del x, y
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": copy_bw, "bf16_flops": flops}


# ------------------------------------------------------------------------------------------------- dense ops


def plugin_linear(plugin, w, x, qtype, n):
    """The op vllm-gguf-plugin's GGUFLinearMethod picks (`_fused_mul_mat_gguf`): MMVQ up to 2 (N > 5120) or
    6 rows, MMQ above."""
    safe = 2 if n > 5120 else 6
    if x.shape[0] <= safe:
        return torch.ops._C_gguf.ggml_mul_mat_vec_a8(w, x, qtype, n)
    return torch.ops._C_gguf.ggml_mul_mat_a8(w, x, qtype, n)


def sweep_configs(m: int):
    from glm5lib.kernels.gguf import GGUFConfig

    if m <= 16:
        return [GGUFConfig(16, 32, 4, 3, 2.0), GGUFConfig(16, 128, 4, 3, 2.0), GGUFConfig(16, 64, 8, 3, 2.0),
                GGUFConfig(16, 64, 4, 4, 4.0), GGUFConfig(16, 64, 4, 2, 1.0), GGUFConfig(16, 32, 4, 3, 4.0)]
    return [GGUFConfig(64, 64, 4, 3, 1.0), GGUFConfig(64, 128, 8, 3, 2.0), GGUFConfig(32, 64, 4, 3, 2.0),
            GGUFConfig(64, 128, 4, 4, 1.0)]


def bench_dense(plugin, qname, shape, batches, device, gen, copy_bw, sweep, deadline, main_paths=True) -> list[dict]:
    from glm5lib.kernels.gguf import QTYPES, gguf_matmul, pick_config
    import gguf as ggufpy

    qtype = int(ggufpy.GGMLQuantizationType[qname])
    name, n, k = shape
    rb = k // QTYPES[qtype][0] * QTYPES[qtype][1]
    qbytes = n * rb
    copies = max(1, min(64, math.ceil(L2_ROTATE_BYTES / qbytes)))
    ws = [random_gguf(qtype, n, k, device, gen) for _ in range(copies)]
    wf = dequantize_gpu(plugin, ws[0], qtype, n, k)
    bcopies = max(1, min(64, math.ceil(L2_ROTATE_BYTES / (n * k * 2)))) if main_paths else 0
    wb = [dequantize_gpu(plugin, w, qtype, n, k).to(torch.bfloat16) for w in ws[:bcopies]]
    # exact reference on sampled output columns: gguf-py's dequantization of those rows (the plugin's dequantize
    # kernels round through fp16)
    from glm5lib.kernels.gguf_naive import dequantize

    cols = torch.arange(0, n, max(1, n // 64), device=device)[:64]
    w_exact = dequantize(ws[0][cols].cpu(), qtype).to(device)
    rows = []
    for m in batches:
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        ref = x.float() @ wf.T
        ref_s = x.float() @ w_exact.T
        paths = {"bf16": (lambda i: x @ wb[i % bcopies].T, n * k * 2)}
        if not main_paths:
            paths = {}
        elif plugin.get("ext"):
            paths["plugin_cuda"] = (lambda i: plugin_linear(plugin, ws[i], x, qtype, n), qbytes)
        if main_paths and plugin.get("ops") is not None and "plugin_triton" in PATHS:
            from vllm_gguf_plugin.triton.gemm.interface import ggml_mul_mat_a8_triton

            paths["plugin_triton"] = (lambda i: ggml_mul_mat_a8_triton(ws[i], x, qtype, n), qbytes)
        if main_paths:
            paths["glm5lib"] = (lambda i: gguf_matmul(x, ws[i], qtype, n), qbytes)
        for pname, (fn, nbytes) in paths.items():
            row = {"op": name, "N": n, "K": k, "type": qname, "batch": m, "path": pname, "weight_bytes": nbytes}
            try:
                y = fn(0)
                row["err"] = rel_err(y[:, cols], ref_s)
                row["err_full"] = rel_err(y, ref)
                row.update(timings(fn, copies if pname != "bf16" else bcopies))
                for key in ("us", "us_graph"):
                    if key in row:
                        row[key.replace("us", "copy_frac")] = nbytes / (row[key] * 1e-6) / copy_bw
                if pname == "glm5lib":
                    row["config"] = pick_config(m, device).name
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
        if sweep and time.time() < deadline:
            for cfg in sweep_configs(m):
                row = {"op": name, "N": n, "K": k, "type": qname, "batch": m, "path": "glm5lib_sweep",
                       "config": cfg.name, "weight_bytes": qbytes}
                try:
                    fn = (lambda c: (lambda i: gguf_matmul(x, ws[i], qtype, n, config=c)))(cfg)
                    y = fn(0)
                    row["err"] = rel_err(y[:, cols], ref_s)
                    row.update(timings(fn, copies, eager=False))
                    row["copy_frac_graph"] = qbytes / (row["us_graph"] * 1e-6) / copy_bw
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
    del ws, wb, wf
    torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------------- experts


def _plugin_moe_cuda(x, w13, w2, tw, ids, t13, t2):
    """vllm-gguf-plugin's `_fused_moe_gguf` MMVQ branch (batch <= 64): ggml_moe_a8_vec, silu-and-mul, again, sum."""
    m, _ = x.shape
    top_k = ids.shape[1]
    n13 = w13.shape[1]
    out = torch.ops._C_gguf.ggml_moe_a8_vec(x, w13, ids, top_k, t13, n13, m)
    act = torch.nn.functional.silu(out[:, : n13 // 2]) * out[:, n13 // 2:]
    out = torch.ops._C_gguf.ggml_moe_a8_vec(act.contiguous(), w2, ids, 1, t2, w2.shape[1], m * top_k)
    return (out.view(m, top_k, -1) * tw.view(m, top_k, 1).to(out.dtype)).sum(1)


def _plugin_moe_triton(x, w13, w2, tw, ids, t13, t2):
    """The same through the plugin's Triton MoE kernels (its CPU/fallback path), grouped by glm5lib's moe_align."""
    from vllm_gguf_plugin.triton.fused_moe.interface import ggml_moe_a8_triton
    from vllm_gguf_plugin.triton.fused_moe.utils import get_triton_moe_block_m

    from glm5lib.kernels.gguf import moe_align

    m, _ = x.shape
    e, n13, _ = w13.shape
    top_k = ids.shape[1]
    sp1, be1 = moe_align(ids, e, get_triton_moe_block_m(t13))
    out = ggml_moe_a8_triton(x, w13, sp1, be1, torch.tensor([sp1.numel()], device=x.device, dtype=torch.int32),
                             t13, n13, top_k, m)
    act = (torch.nn.functional.silu(out[:, : n13 // 2]) * out[:, n13 // 2:]).contiguous()
    sp2, be2 = moe_align(ids, e, get_triton_moe_block_m(t2))
    out = ggml_moe_a8_triton(act, w2, sp2, be2, torch.tensor([sp2.numel()], device=x.device, dtype=torch.int32),
                             t2, w2.shape[1], 1, m * top_k)
    return (out.view(m, top_k, -1) * tw.view(m, top_k, 1).to(out.dtype)).sum(1)


def _bf16_moe(x, w13b, w2b, tw, ids):
    """bf16 grouped GEMM of the dequantized experts (torch._grouped_mm; a loop over used experts without it)."""
    m, k = x.shape
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    sorted_e, order = torch.sort(flat)
    tok = order // top_k
    xs = x[tok]
    inter = w13b.shape[1] // 2
    if hasattr(torch, "_grouped_mm"):
        offs = torch.cumsum(torch.bincount(flat, minlength=w13b.shape[0]), 0).to(torch.int32)
        h = torch._grouped_mm(xs, w13b.transpose(1, 2), offs=offs)
        a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        o = torch._grouped_mm(a, w2b.transpose(1, 2), offs=offs)
    else:
        o = torch.empty(xs.shape[0], k, dtype=x.dtype, device=x.device)
        for e in torch.unique(sorted_e).tolist():
            sel = sorted_e == e
            h = xs[sel] @ w13b[e].T
            o[sel] = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2b[e].T
    w = tw.reshape(-1)[order].to(o.dtype)
    return torch.zeros(m, k, dtype=torch.float32, device=x.device).index_add_(0, tok, (o * w[:, None]).float())


def bench_moe(plugin, t13name, t2name, batches, device, gen, copy_bw) -> list[dict]:
    from glm5lib.kernels.gguf import QTYPES, gguf_moe
    import gguf as ggufpy

    t13 = int(ggufpy.GGMLQuantizationType[t13name])
    t2 = int(ggufpy.GGMLQuantizationType[t2name])
    e, inter, hid, top_k = MOE["experts"], MOE["inter"], MOE["hidden"], MOE["top_k"]
    w13 = random_gguf(t13, 2 * inter, hid, device, gen, lead=(e,))
    w2 = random_gguf(t2, hid, inter, device, gen, lead=(e,))
    b13 = w13.shape[1] * w13.shape[2]
    b2 = w2.shape[1] * w2.shape[2]
    w13b = torch.stack([dequantize_gpu(plugin, w13[i], t13, 2 * inter, hid).to(torch.bfloat16) for i in range(e)])
    w2b = torch.stack([dequantize_gpu(plugin, w2[i], t2, hid, inter).to(torch.bfloat16) for i in range(e)])
    rows = []
    for m in batches:
        x = torch.randn(m, hid, device=device, generator=gen).to(torch.bfloat16)
        ids = torch.rand(m, e, device=device, generator=gen).topk(top_k, dim=1).indices.to(torch.int32)
        tw = torch.softmax(torch.randn(m, top_k, device=device, generator=gen), 1)
        used = torch.unique(ids).tolist()
        # fp32 reference over the used experts
        ref = torch.zeros(m, hid, device=device)
        xf = x.float()
        for ex in used:
            a13 = dequantize_gpu(plugin, w13[ex], t13, 2 * inter, hid)
            a2 = dequantize_gpu(plugin, w2[ex], t2, hid, inter)
            sel = (ids == ex)
            tok, slot = sel.nonzero(as_tuple=True)
            h = xf[tok] @ a13.T
            o = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ a2.T
            ref.index_add_(0, tok, o * tw[tok, slot][:, None])
        qbytes = len(used) * (b13 + b2)
        # each call draws fresh routing from a pool: the experts read change between calls like in decode
        pool = [torch.rand(m, e, device=device, generator=gen).topk(top_k, dim=1).indices.to(torch.int32)
                for _ in range(16)]
        paths = {"bf16": (lambda i: _bf16_moe(x, w13b, w2b, tw, pool[i] if i else ids), len(used) * 2 * (3 * inter * hid))}
        if plugin.get("ext"):
            paths["plugin_cuda"] = (lambda i: _plugin_moe_cuda(x, w13, w2, tw, pool[i] if i else ids, t13, t2), qbytes)
        if plugin.get("ops") is not None and "plugin_triton" in PATHS:
            paths["plugin_triton"] = (lambda i: _plugin_moe_triton(x, w13, w2, tw, pool[i] if i else ids, t13, t2),
                                      qbytes)
        paths["glm5lib"] = (lambda i: gguf_moe(x, w13, w2, tw, pool[i] if i else ids, t13, t2), qbytes)
        for pname, (fn, nbytes) in paths.items():
            row = {"op": "routed_experts", "type": t13name if t13 == t2 else f"{t13name}+{t2name}", "batch": m,
                   "path": pname, "weight_bytes": nbytes, "experts_used": len(used)}
            try:
                row["err"] = rel_err(fn(0), ref)
                row.update(timings(fn, 16))
                for key in ("us", "us_graph"):
                    if key in row:
                        row[key.replace("us", "copy_frac")] = nbytes / (row[key] * 1e-6) / copy_bw
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
    del w13, w2, w13b, w2b
    torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------- summaries


def _find(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()) and "error" not in r:
            return r
    return None


def targets(rows: list[dict]) -> list[dict]:
    """Every target with its measured ratio: glm5lib weight rate / copy at batch 1-8 (>= 0.60) for Q4_K, Q6_K,
    Q8_0; glm5lib time <= bf16 time at every batch (ratio bf16 / glm5lib >= 1)."""
    out = []
    ops = sorted({(r["op"], r["type"]) for r in rows if r["path"] == "glm5lib"})
    for op, t in ops:
        for m in BATCHES:
            g = _find(rows, op=op, type=t, batch=m, path="glm5lib")
            b = _find(rows, op=op, type=t, batch=m, path="bf16")
            if g is None:
                continue
            for mode in ("", "_graph"):
                if f"us{mode}" not in g:
                    continue
                if m <= 8 and t.split("+")[0] in TARGET_TYPES:
                    v = g[f"copy_frac{mode}"]
                    out.append({"target": "copy_frac", "op": op, "type": t, "batch": m, "timing": mode or "eager",
                                "measured": v, "goal": TARGET_COPY, "met": v >= TARGET_COPY})
                if b is not None and f"us{mode}" in b:
                    v = b[f"us{mode}"] / g[f"us{mode}"]
                    out.append({"target": "vs_bf16", "op": op, "type": t, "batch": m, "timing": mode or "eager",
                                "measured": v, "goal": 1.0, "met": v >= 1.0})
    return out


def best_copy_fraction(result: dict, batches: tuple[int, ...] = (1, 8)) -> dict[str, float]:
    """'path type bB' -> the best weight rate over the shapes as a fraction of the measured copy bandwidth, from
    CUDA-graph timings (what a captured decode step sees), for the paths a deployment can take."""
    best: dict[str, float] = {}
    for r in result["rows"]:
        v = r.get("copy_frac_graph")
        if v is None or r["batch"] not in batches or r["path"] not in ("bf16", "plugin_cuda", "glm5lib"):
            continue
        key = f"{r['path']} {r['type']} b{r['batch']}"
        best[key] = max(best.get(key, 0.0), v)
    return dict(sorted(best.items()))


def dense_attn(rows: list[dict]) -> list[dict]:
    """Residency policy: per GLM-5 MoE layer (attention projections + shared expert) and per dense layer, the
    time and bytes of the non-expert weights kept quantized (glm5lib) against dequantized to bf16."""
    groups = {"moe_layer_nonexpert": ["q_b", "o_proj", "q_a+kv_a", "shared_gate_up", "shared_down"],
              "dense_layer": ["q_b", "o_proj", "q_a+kv_a", "dense_gate_up", "dense_down"]}
    out = []
    for g, ops in groups.items():
        for t in TYPES:
            for m in BATCHES:
                rec = {"group": g, "type": t, "batch": m}
                for path in ("bf16", "glm5lib"):
                    rs = [_find(rows, op=o, type=t, batch=m, path=path) for o in ops]
                    if any(r is None for r in rs):
                        break
                    rec[f"{path}_bytes"] = sum(r["weight_bytes"] for r in rs)
                    for key in ("us", "us_graph"):
                        if all(key in r for r in rs):
                            rec[f"{path}_{key}"] = sum(r[key] for r in rs)
                else:
                    out.append(rec)
    return out


def figure(result: dict, path: Path) -> None:
    from glm5lib.plotting import pyplot, save_figure

    plt = pyplot()
    rows = [r for r in result["rows"] if "error" not in r and r["path"] in ("bf16", "plugin_cuda", "plugin_triton", "glm5lib")]
    ops = [s[0] for s in SHAPES] + ["routed_experts"]
    paths = ["bf16", "plugin_cuda", "plugin_triton", "glm5lib"]
    fig, axes = plt.subplots(len(BATCHES), len(TYPES), figsize=(4.2 * len(TYPES), 3.2 * len(BATCHES)), sharey=True,
                             squeeze=False)
    for bi, m in enumerate(BATCHES):
        for ti, t in enumerate(TYPES):
            ax = axes[bi][ti]
            for pi, p in enumerate(paths):
                vals = []
                for o in ops:
                    r = _find(rows, op=o, type=t, batch=m, path=p)
                    vals.append(100 * r.get("copy_frac_graph", r.get("copy_frac", 0)) if r else 0)
                ax.bar([i + 0.2 * pi - 0.3 for i in range(len(ops))], vals, width=0.2, label=p)
            ax.axhline(100 * TARGET_COPY, color="k", lw=0.8, ls="--")
            ax.set_xticks(range(len(ops)))
            ax.set_xticklabels(ops, rotation=60, ha="right", fontsize=7)
            ax.set_title(f"{t}, batch {m}", fontsize=9)
            if ti == 0:
                ax.set_ylabel("weight bytes/s, % of copy")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"GGUF ops, GLM-5 TP8 shapes, {result['env'].get('device', '?')} (graph replay; bf16 counts its "
                 "bf16 bytes)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _write_json(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _fmt(v, pct=False):
    return "-" if v is None else (f"{100 * v:5.1f}%" if pct else f"{v:7.1f}")


def print_tables(rows):
    _log(f"\n{'op':16s} {'type':10s} {'M':>3s} " + " ".join(f"{p:>22s}" for p in
                                                         ("bf16 us/copy", "plugin_cuda", "plugin_triton", "glm5lib")))
    keys = sorted({(r["op"], r["type"], r["batch"]) for r in rows if r["path"] == "glm5lib"},
                  key=lambda t: ([s[0] for s in SHAPES] + ["routed_experts"]).index(t[0]) * 1000 + t[2])
    for op, t, m in keys:
        cells = []
        for p in ("bf16", "plugin_cuda", "plugin_triton", "glm5lib"):
            r = _find(rows, op=op, type=t, batch=m, path=p)
            if r is None:
                cells.append(f"{'-':>22s}")
            else:
                us = r.get("us_graph", r.get("us"))
                cells.append(f"{us:8.1f}us {100 * r.get('copy_frac_graph', r.get('copy_frac', 0)):5.1f}% {r['err']:.0e}")
        _log(f"{op:16s} {t:10s} {m:3d} " + " ".join(cells))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--name", default=None, help="file stem (default gguf_ops_<gpu>)")
    ap.add_argument("--plugin-src", default=None, help="folder holding vllm_gguf_plugin/ (its py files and csrc)")
    ap.add_argument("--commit", default=os.environ.get("GLM5LIB_COMMIT"), help="commit the code came from")
    ap.add_argument("--types", nargs="*", default=TYPES)
    ap.add_argument("--batches", nargs="*", type=int, default=BATCHES)
    ap.add_argument("--ops", nargs="*", default=None, help="subset of the shape names (default all)")
    ap.add_argument("--no-moe", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also time the candidate configs of glm5lib's kernels")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop sweeping after this many seconds")
    ap.add_argument("--skip", nargs="*", default=[], help="paths not to time (e.g. plugin_triton)")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    PATHS.difference_update(a.skip)
    if not torch.cuda.is_available():
        raise UserError("gguf_ops: needs a CUDA GPU")
    t_start = time.time()
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    name = a.name or f"gguf_ops_{gpu}"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"{name}.json"
    if jpath.exists() and not a.force:
        raise UserError(f"{jpath}: exists (use --force to replace it)")
    torch.backends.cuda.matmul.allow_tf32 = False
    import triton

    env = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
           "torch": torch.__version__, "triton": triton.__version__, "commit": a.commit,
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    plugin = {"ops": None, "ext": False}
    if a.plugin_src:
        plugin = load_plugin(Path(a.plugin_src), out / "_build" if False else Path("/tmp/glm5lib_gguf_ext"))
    env.update({"plugin_ext": plugin.get("ext"), "plugin_ext_error": plugin.get("ext_error"),
                "plugin_ext_build_s": plugin.get("ext_build_s"), "plugin_ops": plugin.get("ops") is not None,
                "plugin_ops_error": plugin.get("ops_error")})
    _log("env", json.dumps(env))
    ceil = ceilings(device)
    _log(f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceil['bf16_flops'] / 1e12:.0f} TFLOP/s")
    result = {"env": env, "ceilings": ceil, "rows": [], "dequant_check": {}, "shapes": SHAPES, "moe": MOE}
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    import gguf as ggufpy

    for t in a.types:
        try:
            result["dequant_check"][t] = check_dequantize(plugin, int(ggufpy.GGMLQuantizationType[t]), device, gen)
        except Exception as exc:
            result["dequant_check"][t] = f"{type(exc).__name__}: {exc}"
    _log("dequantize check (plugin vs gguf-py, max abs / max):", result["dequant_check"])
    deadline = t_start + a.budget_s
    shapes = [s for s in SHAPES if a.ops is None or s[0] in a.ops]
    for t in a.types:
        for s in shapes:
            t0 = time.time()
            try:
                result["rows"] += bench_dense(plugin, t, s, a.batches, device, gen, ceil["copy_bytes_per_s"], False,
                                              deadline)
            except Exception:
                result.setdefault("failures", []).append(f"{t} {s[0]}: {traceback.format_exc()[-800:]}")
            _log(f"{t} {s[0]} {time.time() - t0:.1f}s (total {time.time() - t_start:.0f}s)")
            _write_json(result, jpath)
        if not a.no_moe:
            t0 = time.time()
            try:
                result["rows"] += bench_moe(plugin, t, t, a.batches, device, gen, ceil["copy_bytes_per_s"])
            except Exception:
                result.setdefault("failures", []).append(f"{t} moe: {traceback.format_exc()[-800:]}")
            _log(f"{t} moe {time.time() - t0:.1f}s")
            _write_json(result, jpath)
    if not a.no_moe and "Q4_K" in a.types and "Q6_K" in a.types:  # llama.cpp's Q4_K_M gives some ffn_down Q6_K
        try:
            result["rows"] += bench_moe(plugin, "Q4_K", "Q6_K", a.batches, device, gen, ceil["copy_bytes_per_s"])
        except Exception:
            result.setdefault("failures", []).append(f"Q4_K+Q6_K moe: {traceback.format_exc()[-800:]}")
    if a.sweep:  # candidate configs after the main table, until the time budget is spent (small shapes first)
        order = ["q_b", "o_proj", "q_a+kv_a", "shared_gate_up", "shared_down", "lm_head", "dense_gate_up", "dense_down"]
        for s in sorted(shapes, key=lambda s: order.index(s[0])):
            for t in ["Q4_K", "Q8_0", "Q6_K", "Q5_K"]:
                if t not in a.types or time.time() > deadline:
                    continue
                try:
                    result["rows"] += bench_dense(plugin, t, s, a.batches, device, gen, ceil["copy_bytes_per_s"], True,
                                                  deadline, main_paths=False)
                except Exception:
                    result.setdefault("failures", []).append(f"sweep {t} {s[0]}: {traceback.format_exc()[-800:]}")
                _log(f"sweep {t} {s[0]} (total {time.time() - t_start:.0f}s)")
                _write_json(result, jpath)
    result["targets"] = targets(result["rows"])
    result["dense_attn"] = dense_attn(result["rows"])
    result["seconds"] = round(time.time() - t_start, 1)
    _write_json(result, jpath)
    try:
        figure(result, out / f"{name}.png")
    except Exception as exc:
        _log("figure failed:", exc)
    print_tables(result["rows"])
    if a.sweep:
        _log("\nsweep (glm5lib configs, graph us, best per op/type/batch):")
        best = {}
        for r in result["rows"]:
            if r["path"] in ("glm5lib_sweep", "glm5lib") and "us_graph" in r and "config" in r:
                k = (r["op"], r["type"], r["batch"])
                if k not in best or r["us_graph"] < best[k]["us_graph"]:
                    best[k] = r
        for k, r in sorted(best.items()):
            _log(f"  {k[0]:16s} {k[1]:6s} {k[2]:3d} {r['config']:28s} {r['us_graph']:8.1f} "
                 f"{100 * r['copy_frac_graph']:5.1f}%")
    _log("\ntargets (measured vs goal):")
    for tg in result["targets"]:
        _log(f"  {tg['target']:9s} {tg['op']:16s} {tg['type']:10s} M={tg['batch']:<3d} {tg['timing']:6s} "
             f"{tg['measured']:.2f} goal {tg['goal']:.2f} {'ok' if tg['met'] else 'MISS'}")
    for f in result.get("failures", []):
        _log("FAILED", f)
    _log(f"done in {result['seconds']} s -> {jpath}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
