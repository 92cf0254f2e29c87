"""Ahead-of-time compile of every shipped kernel configuration for sm_80 / sm_89 / sm_90 / sm_120 (no GPU needed).

`triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", cc, 32), options=...)` runs the
whole pipeline down to PTX/cubin on the CPU; `metadata.shared` is the static shared memory a block needs, which
must fit the target's per-block limit (sm_80 163 KB, sm_90 227 KB, sm_89 / sm_120 99 KB opt-in). The report
also says whether Hopper's wgmma or the older mma.sync was chosen, and whether anything went to local memory.

`python -m glm5lib.kernels.compile_report [--arch 90 ...] [--json PATH]`
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
from dataclasses import asdict, dataclass

# usable shared memory per block (opt-in maximum), bytes
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 120: 99 * 1024}


def _sass_instructions(sass: str, nops: bool) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction in `cuobjdump -sass` text, NOPs only if `nops`."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and (nops or not m.group(2).strip().startswith("NOP")):
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    return ins


def _opcode(text: str) -> str:
    """An instruction's opcode with its suffixes, its predicate left out (`@!P0 LDS.64 R4, [R2]` -> `LDS.64`)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def _opcode_hist(texts) -> dict:
    """{opcode: count}, most frequent first; opcodes lose their predicate and suffixes (`HMMA.16816.F32` -> `HMMA`)."""
    hist: dict = {}
    for t in texts:
        op = _opcode(t).split(".")[0]
        hist[op] = hist.get(op, 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: -kv[1]))


def sass_opcodes(sass: str, nops: bool = False) -> dict:
    """{opcode: count} over the whole kernel in `cuobjdump -sass` text (NOPs left out unless `nops`)."""
    return _opcode_hist(t for _, t in _sass_instructions(sass, nops))


def sass_loop(sass: str, nops: bool = False, inner: bool = False) -> tuple[int, int, dict]:
    """(instructions in the main loop, instructions in the kernel, {opcode: count} of the loop, most frequent first)
    from `cuobjdump -sass` text. The main loop runs from the target of the kernel's longest backward branch to that
    branch; inner: the longest loop (of at least 256 instructions) that holds no other loop of
    that size (a kernel whose tile loop runs inside a loop over pieces of work: the tile loop); opcodes as
    `sass_opcodes` counts them; NOPs are left out unless `nops`."""
    body, n_all = sass_loop_body(sass, nops, inner)
    return len(body), n_all, _opcode_hist(body)


def _backward_branches(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(target, branch) addresses of every backward branch: the loops, in address order of their branches."""
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    return loops


def sass_loops(sass: str, nops: bool = False) -> list[tuple[int, dict]]:
    """(instructions, {opcode: count} as `sass_opcodes` counts them) of every loop in `cuobjdump -sass` text, from a
    backward branch's target to the branch, in address order."""
    ins = _sass_instructions(sass, nops)
    bodies = [[t for a, t in ins if lo <= a <= hi] for lo, hi in _backward_branches(ins)]
    return [(len(b), _opcode_hist(b)) for b in bodies]


def sass_loop_body(sass: str, nops: bool = False, inner: bool = False) -> tuple[list[str], int]:
    """(the main loop's instruction texts, instructions in the kernel): `sass_loop`'s loop."""
    ins = _sass_instructions(sass, nops)
    loops = _backward_branches(ins)
    if inner:
        big = [lp for lp in loops if sum(lp[0] <= a <= lp[1] for a, _ in ins) >= 256]
        loops = [lp for lp in big if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in big)] or loops
    best = max(loops, key=lambda lp: lp[1] - lp[0], default=(0, 0))
    return [t for a, t in ins if best[0] <= a <= best[1]], len(ins)


# bytes a lane moves by an LDS / STS / LDGSTS width suffix (none: 32 bits); LDSM moves 8x8 16-bit matrices, 128
# bytes a matrix for the warp, .1 / .2 / .4 of them
_LANE_BYTES = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


def smem_bytes(texts) -> dict:
    """Shared-memory bytes a warp moves in the given SASS instructions, every lane counted as active: {"read": LDS
    and LDSM, "written": STS, STSM and LDGSTS (cp.async's writes into shared memory), "by_op": {opcode with its
    width: bytes}}.
    A static count: divided by the SM's shared-memory rate (128 bytes a clock on sm_80-sm_90) it bounds a loop's time
    from below before bank conflicts. "uncounted": other shared-memory instructions it met (atomics, generic loads
    and stores that may reach shared memory), whose bytes are not in the totals."""
    by_op: dict = {}
    read = written = 0
    uncounted: dict = {}
    for t in texts:
        op = _opcode(t)
        parts = op.split(".")
        if parts[0] in ("LDSM", "STSM"):
            n = int(parts[-1]) if parts[-1] in ("1", "2", "4") else 1
            b = 128 * n
        elif parts[0] in ("LDS", "STS", "LDGSTS"):
            b = 32 * next((_LANE_BYTES[x] for x in parts[1:] if x in _LANE_BYTES), 4)
        else:
            if parts[0] in ("ATOMS", "LD", "ST", "ATOM", "RED"):
                uncounted[parts[0]] = uncounted.get(parts[0], 0) + 1
            continue
        by_op[op] = by_op.get(op, 0) + b
        if parts[0] in ("LDS", "LDSM"):
            read += b
        else:
            written += b
    return {"read": read, "written": written, "by_op": by_op, "uncounted": uncounted}


def cuobjdump(cubin: bytes, *flags: str) -> str:
    """The output of Triton's bundled `cuobjdump` (e.g. `-sass`, `-res-usage`) on a cubin, no GPU needed."""
    import os
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *flags, f.name], capture_output=True, text=True, check=True).stdout


ARCHS = (80, 89, 90, 120)


@dataclass
class KernelSpec:
    """A kernel with the argument types and constexprs of one shipped configuration."""

    name: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int
    num_stages: int
    divisible: tuple = ()  # args Triton's launcher would specialise as multiples of 16 (pointers, row strides)
    maxnreg: int | None = None  # a register cap the launch sets


@dataclass
class CompileRow:
    kernel: str
    arch: int
    ok: bool
    shared_bytes: int | None
    limit_bytes: int
    fits: bool
    mma: str | None
    local_mem: bool | None
    seconds: float
    error: str | None = None
    vec16_loads: int | None = None  # 16-byte global loads / async copies in the PTX (0 would mean scalar gathers)


def _sig(fn, types: dict, consts: dict) -> dict:
    out = {}
    for a in fn.arg_names:
        if a in consts:
            out[a] = "constexpr"
        else:
            out[a] = types.get(a, "i32")
    return out


_RULE = object()


def indexer_paged_spec(arch: int, q_dtype, fp8: bool, loop: bool, keys_m: bool | None = None,
                       form=_RULE) -> KernelSpec:
    """The paged indexer kernel as `indexer_logits` launches it on `arch` for q of `q_dtype` (32 index heads, the
    shipped tile): after the q rewrite of `form` (a `indexer.Q_FORMS` entry or None; default the dispatch rule,
    `paged_q_form`), in the dot layout `keys_m` (default the rule), with the tiles a program of `paged_tiles` (one
    on the looping grid `loop`) and the register cap of `paged_maxnreg`'s rule."""
    import torch

    from glm5lib.kernels.indexer import (INDEXER_CONFIGS, REWRITTEN_DTYPE, _indexer_paged_kernel, maxnreg_rule,
                                         paged_keys_m, q_form_rule, tiles_for)
    from glm5lib.kernels.naive import INDEXER_DIM

    fmt = "fp8" if fp8 else "bf16"
    if form is _RULE:
        form = q_form_rule(q_dtype, fmt, arch >= 89, divmod(arch, 10))
    launched = REWRITTEN_DTYPE.get(form, q_dtype)
    _, bn, nw, ns = INDEXER_CONFIGS["paged"]
    fn = _indexer_paged_kernel
    qty = {torch.float8_e4m3fn: "fp8e4nv", torch.float16: "fp16"}.get(launched, "bf16")
    types = {"Q": f"*{qty}", "K8": "*u8" if fp8 else "*bf16", "KF": "*fp32" if fp8 else "*bf16",
             "W": "*fp32", "BT": "*i32", "CTX": "*i32", "OUT": "*fp32", "scale": "fp32"}
    consts = {"KV_FP8": fp8, "FP8_HW": arch >= 89, "BLOCK_HI": 32, "BLOCK_N": bn, "D": INDEXER_DIM,
              "TILE_LOOP": loop, "KEYS_M": paged_keys_m(launched, fmt, form) if keys_m is None else keys_m,
              "F16_DOT": form == "f16-kernel", "Q_TERMS": 2 if form == "e4m3x2" else 1}
    per = 1 if loop else tiles_for(fmt, divmod(arch, 10), form)
    consts["MULTI"] = per > 1
    if per == 1:  # Triton specialises an integer argument of 1 as a constant: so does the report
        consts["TILES"] = 1
    qtag = {torch.bfloat16: "", torch.float8_e4m3fn: ":q8"}.get(q_dtype, f":{str(q_dtype).removeprefix('torch.')}")
    ftag = f":{form}" if form else ""
    maxnreg = maxnreg_rule(launched, fmt, consts["KEYS_M"], consts["Q_TERMS"], loop, divmod(arch, 10),
                           per)  # as launched
    tiles = f"-t{per}" if per > 1 else ""
    name = (f"indexer_paged[Hi32-N{bn}{tiles}-w{nw}-s{ns}{f'-r{maxnreg}' if maxnreg else ''}:{fmt}{qtag}{ftag}"
            f"{':loop' if loop else ''}]")
    return KernelSpec(name, fn, _sig(fn, types, consts), consts, nw, ns,
                      ("Q", "K8", "KF", "W", "OUT", "stride_qt", "stride_qh", "stride_qterm", "stride_blk",
                       "stride_val"), maxnreg)


def indexer_prep_spec(form: str) -> KernelSpec:
    """The q rewrite launched before the paged scores for `form` ("f16" or "e4m3x2", as `q_form_rule` resolved it)."""
    from glm5lib.kernels.indexer import _q_prep_kernel
    from glm5lib.kernels.naive import INDEXER_DIM

    terms = 2 if form == "e4m3x2" else 0
    fn = _q_prep_kernel
    types = {"Q": "*bf16", "W": "*fp32", "QO": "*fp8e4nv" if terms else "*fp16", "WO": "*fp32"}
    consts = {"BLOCK_HI": 32, "D": INDEXER_DIM, "TERMS": terms}
    return KernelSpec(f"indexer_q_prep[Hi32:{'e4m3x2' if terms else 'f16'}]", fn, _sig(fn, types, consts), consts,
                      4, 1, ("Q", "QO", "stride_qt", "stride_qh", "stride_term"))


def shipped_kernels(arch: int) -> list[KernelSpec]:
    """Every (kernel, config) the dispatchers can launch on `arch` (fp8 conversion is software before sm_89)."""
    import torch

    from glm5lib.kernels.indexer import INDEXER_CONFIGS, _indexer_ragged_kernel
    from glm5lib.kernels import common
    from glm5lib.kernels.mla import CONFIGS, _merge_splits_kernel, _sparse_mla_fwd_kernel, merge_tile
    from glm5lib.kernels.naive import D_NOPE, D_ROPE, INDEXER_DIM, INDEXER_FP8_ROW_BYTES

    fp8_hw = arch >= 89
    smem = "big" if arch in (90, 100) else "small"
    specs = []
    fn = _sparse_mla_fwd_kernel
    div = ("Q", "KV", "IDX", "O", "LSE", "PART", "stride_qt", "stride_qh", "stride_kv", "stride_it",
           "stride_ot", "stride_oh")
    for (hcls, fmt, scls), cfg in CONFIGS.items():
        if scls != smem:
            continue
        fp8 = fmt == "fp8_ds_mla"
        cname = f"{hcls}-{fmt}"
        for split in (False, True):
            types = {"Q": "*bf16", "KV": "*u8" if fp8 else "*bf16", "IDX": "*i32", "O": "*bf16", "LSE": "*fp32",
                     "PART": "*fp32", "qk_scale": "fp32"}
            consts = {"KV_FP8": fp8, "FP8_HW": fp8_hw, "SPLIT": split, "BLOCK_H": cfg.block_h,
                      "BLOCK_N": cfg.block_n, "D_NOPE": D_NOPE, "D_ROPE": D_ROPE, "PREFETCH": cfg.prefetch,
                      "ALIGNED": fp8, "NOPE_F16": fp8 and cfg.nope_f16,
                      "DEQUANT": fp8 and cfg.dequant, "IDX_AHEAD": cfg.idx_ahead,
                      "PDL": common.PDL and split and arch >= 90}  # as launched (`common.pdl`)
            specs.append(KernelSpec(f"sparse_mla[{cname}:{cfg.name}:{'split' if split else 'direct'}]",
                                    fn, _sig(fn, types, consts), consts, cfg.num_warps, cfg.num_stages, div))
    fn = _merge_splits_kernel
    for n_splits, H in ((2, 128), (32, 8), (32, 16), (4, 64)):
        sp, bh, bd = merge_tile(n_splits, H)
        consts = {"D_NOPE": D_NOPE, "SP": sp, "BLOCK_H": bh, "BLOCK_D": bd, "PDL": common.PDL and arch >= 90}
        specs.append(KernelSpec(f"merge_splits[SP{sp}-H{bh}-D{bd}]", fn,
                                _sig(fn, {"PART": "*fp32", "O": "*bf16", "LSE": "*fp32"}, consts), consts, 4, 3,
                                ("PART", "O", "LSE", "stride_ot", "stride_oh")))
    variants = [(False, "bf16"), (True, "bf16")] + ([(True, "fp8e4nv")] if fp8_hw else [])
    for fp8, qty in variants:
        qtag = "" if qty == "bf16" else ":q8"
        qdt = torch.bfloat16 if qty == "bf16" else torch.float8_e4m3fn
        bm, bn, nw, ns = INDEXER_CONFIGS["ragged"]
        fn = _indexer_ragged_kernel
        types = {"Q": f"*{qty}", "K8": "*u8" if fp8 else "*bf16", "KF": "*fp32" if fp8 else "*bf16", "W": "*fp32",
                 "KS": "*i32", "KE": "*i32", "OUT": "*fp32", "scale": "fp32"}
        consts = {"KV_FP8": fp8, "FP8_HW": fp8_hw, "BLOCK_M": bm, "BLOCK_N": bn, "D": INDEXER_DIM}
        specs.append(KernelSpec(f"indexer_ragged[M{bm}-N{bn}-w{nw}-s{ns}:{'fp8' if fp8 else 'bf16'}{qtag}]", fn,
                                _sig(fn, types, consts), consts, nw, ns,
                                ("Q", "K8", "KF", "W", "OUT", "stride_qt", "stride_qh", "stride_k", "stride_ot")))
        for loop in (False, True):  # the rule's tiles a program (`paged_tiles`); a fixed grid looping over tiles
            # (CUDA-graph decode)
            specs.append(indexer_paged_spec(arch, qdt, fp8, loop))
    from glm5lib.kernels.indexer import REWRITTEN_DTYPE, q_form_rule

    form = q_form_rule(torch.bfloat16, "fp8", fp8_hw, divmod(arch, 10))
    if form in REWRITTEN_DTYPE:  # the rewrite of bf16 q over fp8 keys, launched before the scores
        specs.append(indexer_prep_spec(form))
    from glm5lib.kernels.rows import _physical_rows_kernel, _quantize_write_indexer_kernel, _write_indexer_rows_kernel
    from glm5lib.kernels.topk import (MULTI_CHUNKS_RANGE, SELECT_AGG, SELECT_CONFIG, SELECT_CONFIG_WAVE,
                                      SELECT_PTX_STORES, SELECT_SPARSE, _multi_select_kernel, _topk_select_kernel,
                                      multi_counts_block, scan_rows)
    from glm5lib.model.spec import GLM5Config

    fn = _topk_select_kernel
    block, warps, digit = SELECT_CONFIG
    # one program per row: decode (row lengths), prefill (lengths and ks); split rows: the chunk launch, the merge;
    # each in the config for several programs an SM and in the one for one wave (`topk.select_config`); and the
    # one-program and merge launches with each other way of counting digits (`topk.SELECT_AGG` 0-2, the PTX of
    # its warp-aggregated adds)
    others = [a for a in (0, 1, 2) if a != SELECT_AGG]
    for (b, w, _), (tag, has_len, has_ks, split, merge, agg) in list(itertools.product(
            (SELECT_CONFIG, SELECT_CONFIG_WAVE),
            (("len", True, False, False, False, SELECT_AGG), ("len+ks", True, True, False, False, SELECT_AGG),
             ("split:len", True, False, True, False, SELECT_AGG), ("merge:len", True, False, False, True, SELECT_AGG),
             ("merge:len+ks", True, True, False, True, SELECT_AGG)))) + [
            (SELECT_CONFIG_WAVE, (f"len:agg{a}", True, False, False, False, a)) for a in others] + [
            (SELECT_CONFIG, (f"merge:len:agg{a}", True, False, False, True, a)) for a in others]:
        consts = {"HAS_LEN": has_len, "HAS_KS": has_ks, "SPLIT": split, "MERGE": merge, "BLOCK": b,
                  "OUT_BLOCK": 1024, "DIGIT": digit, "SPARSE": SELECT_SPARSE, "ROWS": scan_rows(b), "AGG": agg,
                  "ASM": True, "STORES": SELECT_PTX_STORES}
        types = {"X": "*fp32", "LEN": "*i32", "KS": "*i32", "OUT": "*i32", "OUT_X": "*fp32" if split else "*i32",
                 "POS": "*i32", "HIST": "*i32"}
        specs.append(KernelSpec(f"topk_select[B{b}-w{w}-d{digit}:{tag}]", fn, _sig(fn, types, consts),
                                consts, w, 3, ("X", "LEN", "KS", "OUT", "OUT_X", "POS", "HIST",
                                               "stride_x", "stride_o")))
    # a decode step's rows split over programs for every pass (`topk.multi_rule`): its seven steps (the radix passes,
    # the count, the write) over GLM-5's 202752-wide decode rows, with row lengths, at the smallest and largest chunk
    # of `topk.multi_chunk` (1024 keys: 1024-score blocks; 4096 and up: `SELECT_CONFIG`'s block)
    fn = _multi_select_kernel
    width = GLM5Config.glm5().max_position_embeddings
    for chunk in MULTI_CHUNKS_RANGE:
        for mode in range(-(-32 // digit) + 2):
            consts = {"MODE": mode, "HAS_LEN": True, "HAS_KS": False, "BLOCK": min(block, chunk), "DIGIT": digit,
                      "CHUNKS": multi_counts_block(-(-width // chunk)), "OUT_BLOCK": 1024, "SPARSE": SELECT_SPARSE,
                      "ROWS": scan_rows(min(block, chunk)), "STORES": SELECT_PTX_STORES}
            types = {"X": "*fp32", "LEN": "*i32", "KS": "*i32", "OUT": "*i32", "HIST": "*i32", "CNT": "*i32"}
            specs.append(KernelSpec(f"topk_multi[B{consts['BLOCK']}-w{warps}-d{digit}:step{mode}]", fn,
                                    _sig(fn, types, consts), consts, warps, 3,
                                    ("X", "LEN", "KS", "OUT", "HIST", "CNT", "stride_x", "stride_o")))

    fn = _write_indexer_rows_kernel
    consts = {"D": INDEXER_DIM, "SB": INDEXER_FP8_ROW_BYTES - INDEXER_DIM}
    specs.append(KernelSpec("write_indexer_rows[D128-SB4]", fn,
                            _sig(fn, {"SRC": "*u8", "SLOT": "*i32", "CACHE": "*u8"}, consts), consts, 1, 3,
                            ("SRC", "SLOT", "CACHE", "stride_src", "stride_blk")))
    if fp8_hw:  # quantizes with the hardware e4m3 conversion; sm_80 takes write_indexer_rows
        fn = _quantize_write_indexer_kernel
        consts = {"D": INDEXER_DIM}
        for kty in ("bf16", "fp32"):  # vLLM's keys (bf16), the harness's (fp32)
            specs.append(KernelSpec(f"quantize_write_indexer[D128:{kty}]", fn,
                                    _sig(fn, {"K": f"*{kty}", "SLOT": "*i32", "CACHE": "*u8"}, consts), consts, 1, 3,
                                    ("K", "SLOT", "CACHE", "stride_k", "stride_blk")))
    fn = _physical_rows_kernel
    for block_k in (64, 1024):  # block_k = next_pow2(topk) up to 1024: tiny model, GLM-5's 2048
        consts = {"BLOCK_K": block_k}
        specs.append(KernelSpec(f"physical_rows[K{block_k}]", fn,
                                _sig(fn, {"REQ": "*i32", "BT": "*i32", "LOCAL": "*i32", "OUT": "*i32"}, consts),
                                consts, 4, 3, ("REQ", "BT", "LOCAL", "OUT", "stride_bt", "stride_lt", "stride_ot")))
    return specs


def compile_spec(spec: KernelSpec, arch: int):
    """`triton.compile` of one spec for `arch` (no GPU needed): the compiled kernel, its `asm` and `metadata`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {(spec.fn.arg_names.index(k),): v for k, v in spec.constexprs.items()}
    attrs = {(spec.fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in spec.divisible}
    src = ASTSource(spec.fn, spec.signature, constexprs=consts, attrs=attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg:
        options["maxnreg"] = spec.maxnreg
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def compile_one(spec: KernelSpec, arch: int) -> CompileRow:
    t0 = time.time()
    limit = SMEM_LIMIT[arch]
    try:
        k = compile_spec(spec, arch)
        shared = int(k.metadata.shared)
        ptx = k.asm.get("ptx", "")
        vec = ptx.count("ld.global.v4") + ptx.count("cp.async.cg")
        mma = "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else ("mma" if "mma" in ptx else None))
        local = ".local" in ptx
        return CompileRow(spec.name, arch, True, shared, limit, shared <= limit, mma, local, time.time() - t0,
                          vec16_loads=vec)
    except Exception as exc:  # a config that does not compile is a failed row, not a crash of the report
        root = exc  # Triton wraps the real error in CompilationErrors that end with the source and a caret
        while root.__cause__ is not None:
            root = root.__cause__
        msg = [line for line in str(root).strip().splitlines() if line.strip() not in ("", "^")]
        where = ""
        if msg and msg[0].startswith("at ") and getattr(root, "src", None):  # "at LINE:COL:" of the innermost jit fn
            where = f" {msg[0].rstrip(':')} of {root.src.split('(')[0].removeprefix('def ').strip()}"
        return CompileRow(spec.name, arch, False, None, limit, False, None, None, time.time() - t0,
                          f"{type(root).__name__}{where}: {msg[-1] if msg else ''}"[:300])


def _interpreted() -> bool:
    from triton.runtime.jit import JITFunction

    from glm5lib.kernels.mla import _sparse_mla_fwd_kernel

    return not isinstance(_sparse_mla_fwd_kernel, JITFunction)


def compile_report(archs=ARCHS, progress: bool = True) -> list[CompileRow]:
    """Rows for every shipped (kernel, config) x arch. On a CPU-only machine the kernels in this process are
    Triton-interpreter functions (see `common`), which cannot be compiled, so the report runs in a child
    process with the interpreter switched off."""
    import os
    import subprocess
    import tempfile

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when unset; keep today's default
    if _interpreted():
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.json")
            env = dict(os.environ, TRITON_INTERPRET="0")
            cmd = [sys.executable, "-m", "glm5lib.kernels.compile_report", "--json", out, "--quiet", "--arch",
                   *[str(a) for a in archs]]
            subprocess.run(cmd, env=env, check=False, stdout=subprocess.DEVNULL, stderr=None if progress else subprocess.DEVNULL)
            if not os.path.exists(out):
                raise RuntimeError("AOT compile report subprocess wrote no result")
            with open(out) as f:
                return [CompileRow(**r) for r in json.load(f)]
    rows = []
    jobs = [(spec, a) for a in archs for spec in shipped_kernels(a)]
    try:
        from tqdm.auto import tqdm
        from glm5lib.progress import show_progress

        it = tqdm(jobs, desc="AOT compile", disable=not show_progress(progress))
    except ImportError:
        it = jobs
    for spec, a in it:
        rows.append(compile_one(spec, a))
    return rows


def format_report(rows: list[CompileRow]) -> str:
    lines = [f"{'kernel':64s} {'sm':>4s} {'ok':3s} {'shared':>8s} {'limit':>8s} {'fits':4s} {'mma':8s} {'local':5s} {'vec16':>5s}"]
    for r in rows:
        lines.append(f"{r.kernel:64s} {r.arch:4d} {'ok' if r.ok else 'ERR':3s} {r.shared_bytes or 0:8d} {r.limit_bytes:8d} "
                     f"{'yes' if r.fits else 'NO':4s} {r.mma or '-':8s} {str(r.local_mem):5s} {r.vec16_loads or 0:5d} {r.error or ''}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="*", default=list(ARCHS))
    ap.add_argument("--json")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    rows = compile_report(a.arch, progress=not a.quiet)
    if not a.quiet:
        print(format_report(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    bad = [r for r in rows if not (r.ok and r.fits)]
    print(f"{len(rows) - len(bad)}/{len(rows)} compile and fit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
