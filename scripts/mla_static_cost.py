"""Static cost of sparse-MLA configs without a GPU: AOT compile (`triton.compile` with a `GPUTarget`), then
registers / spills / stack / shared memory from the cubin (`cuobjdump -res-usage`), SASS instructions of the main
loop (the longest backward branch in `cuobjdump -sass`), and what Triton's pipeliner did in the TTGIR loop
(async copies, shared-memory buffers, layout conversions).

`python scripts/mla_static_cost.py [--arch 90 120] [--fmt fp8_ds_mla bf16] [--json PATH] [--dump DIR]`
configs: the shipped ("small", fmt, "big") decode config plus `tune_decode.CANDIDATES[fmt]`.
Run with TRITON_INTERPRET=0 (set here); the H200 runs Triton 3.6, so put a 3.6 install first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from glm5lib.kernels import mla  # noqa: E402
from glm5lib.kernels.compile_report import SMEM_LIMIT, _sig, cuobjdump, sass_loop as _sass_loop_text  # noqa: E402
from glm5lib.kernels.naive import D_NOPE, D_ROPE  # noqa: E402

DIV = ("Q", "KV", "IDX", "O", "LSE", "PART", "stride_qt", "stride_qh", "stride_kv", "stride_it", "stride_ot",
       "stride_oh")  # as compile_report


EXTRA: dict = {}  # --set NAME=VALUE: extra constexprs / options for experiments


def compile_cfg(cfg: mla.MLAConfig, fmt: str, arch: int, split: bool = True):
    fp8 = fmt == "fp8_ds_mla"
    fn = mla._sparse_mla_fwd_kernel
    types = {"Q": "*bf16", "KV": "*u8" if fp8 else "*bf16", "IDX": "*i32", "O": "*bf16", "LSE": "*fp32",
             "PART": "*fp32", "qk_scale": "fp32"}
    consts = {"KV_FP8": fp8, "FP8_HW": arch >= 89, "SPLIT": split, "BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n,
              "D_NOPE": D_NOPE, "D_ROPE": D_ROPE, "PREFETCH": cfg.prefetch, "ALIGNED": fp8,
              "NOPE_F16": fp8 and cfg.nope_f16, "DEQUANT": fp8 and cfg.dequant, "IDX_AHEAD": cfg.idx_ahead,
              "PDL": mla.common.PDL and split and arch >= 90}  # as launched (`common.pdl`)
    consts.update({k: v for k, v in EXTRA.items() if k in fn.arg_names})
    c = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in DIV}
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if getattr(cfg, "maxnreg", None):
        opts["maxnreg"] = cfg.maxnreg
    opts.update({k: v for k, v in EXTRA.items() if k in ("maxnreg", "num_warps", "num_stages")})
    return triton.compile(ASTSource(fn, _sig(fn, types, consts), constexprs=c, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=opts)


def _loop_of_ttgir(ttgir: str) -> str:
    """Text of the outermost scf.for in the kernel body (the main loop)."""
    i = ttgir.find("scf.for")
    if i < 0:
        return ""
    depth, j = 0, ttgir.find("{\n", i)  # the body's brace ends the scf.for line (types hold {...} too)
    for k in range(j, len(ttgir)):
        if ttgir[k] == "{":
            depth += 1
        elif ttgir[k] == "}":
            depth -= 1
            if depth == 0:
                return ttgir[i:k + 1]
    return ttgir[i:]


def sass_loop(cubin: bytes) -> tuple[int, int, dict, str]:
    """(instructions in the main loop, instructions in the kernel, opcode histogram of the loop, `-res-usage`)."""
    return (*_sass_loop_text(cuobjdump(cubin, "-sass")), cuobjdump(cubin, "-res-usage"))


def stats(cfg, fmt, arch, dump=None):
    k = compile_cfg(cfg, fmt, arch)
    ttgir = k.asm["ttgir"]
    loop = _loop_of_ttgir(ttgir)
    n_loop, n_all, hist, res = sass_loop(k.asm["cubin"])
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    reg, stack, shared_static, local = (int(x) for x in m.groups()) if m else (None,) * 4
    ptx = k.asm["ptx"]
    allocs = re.findall(r"ttg\.local_alloc\s*(?::|\(.*?\)\s*:)[^\n]*?!ttg\.memdesc<([^,>]+)", ttgir)
    row = {
        "config": cfg.name, "fmt": fmt, "arch": arch, "regs": reg, "stack": stack, "local": local,
        "shared": int(k.metadata.shared), "fits": int(k.metadata.shared) <= SMEM_LIMIT[arch],
        "sass_loop": n_loop, "sass_total": n_all,
        "ttgir_loop_async_copy": loop.count("ttg.async_copy_global_to_local"),
        "ttgir_loop_tt_load": loop.count("tt.load"),
        "ttgir_loop_convert_layout": loop.count("ttg.convert_layout"),
        "ttgir_loop_local_alloc": loop.count("ttg.local_alloc"),
        "ttgir_loop_local_load": loop.count("ttg.local_load"),
        "ttgir_async_wait": re.findall(r"ttg\.async_wait[^\n]*num = (\d+)", ttgir),
        "ttgir_allocs": allocs,
        "mma": "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else None),
        "ptx_bar_sync": ptx.count("bar.sync"),
        "loop_ops": {k_: v for k_, v in list(hist.items())[:14]},
    }
    if dump:
        os.makedirs(dump, exist_ok=True)
        base = os.path.join(dump, f"{fmt}-{cfg.name}-sm{arch}")
        for ext in ("ttgir", "ptx"):
            with open(f"{base}.{ext}", "w") as f:
                f.write(k.asm[ext])
        with open(f"{base}.cubin", "wb") as f:
            f.write(k.asm["cubin"])
    return row


def main(argv=None) -> int:
    from glm5lib.bench.tune_decode import CANDIDATES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="*", default=[90, 120])
    ap.add_argument("--fmt", nargs="*", default=["fp8_ds_mla", "bf16"])
    ap.add_argument("--only", nargs="*", help="config names to keep")
    ap.add_argument("--cfg", nargs="*", help="extra configs as MLAConfig(...) expressions, e.g. 'C(16, 32, 4, 3)'")
    ap.add_argument("--json")
    ap.add_argument("--dump")
    ap.add_argument("--set", nargs="*", default=[], help="NAME=VALUE (python literal): constexpr or compile option")
    a = ap.parse_args(argv)
    import ast
    for kv in a.set:
        k_, v_ = kv.split("=", 1)
        EXTRA[k_] = ast.literal_eval(v_)
    rows = []
    for fmt in a.fmt:
        cfgs = [mla.CONFIGS[("small", fmt, "big")]] + list(CANDIDATES[fmt])
        if a.cfg:
            cfgs = [eval(e, {"C": mla.MLAConfig}) for e in a.cfg]
        for cfg in cfgs:
            if a.only and cfg.name not in a.only:
                continue
            for arch in a.arch:
                try:
                    r = stats(cfg, fmt, arch, a.dump)
                except Exception as exc:  # noqa: BLE001
                    msg = str(exc).strip().splitlines()
                    r = {"config": cfg.name, "fmt": fmt, "arch": arch, "error": (msg[-1] if msg else repr(exc))[:300]}
                rows.append(r)
                print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
