"""Static SASS counts behind docs/kernels.md v33-v39 (no GPU): the one-program top-k select with every radix pass
counted by `tl.histogram` (`SPARSE=0`), with the later passes by atomics (`SPARSE=8`, round 28), with the write's
prefix sums over rows of 16 keys as well (`ROWS=16`, round 29), and as shipped (`topk.SELECT_SPARSE`,
`topk.SELECT_SCAN_ROWS`, with no warp-aggregated adds), the wave config's build per loop with each way of counting
digits (`topk.SELECT_AGG` 0-3: round 29's v36-v39), and a toy
kernel that loads a 4096-key block, scans a mask of it and stores by the scan, three ways: a 1-D `tl.cumsum` (the
write's prefix sums), the block as 256 rows of 16 adjacent keys (in-row scans, one scan of the row totals), and no
scan (the load and store alone).

`TRITON_INTERPRET=0 PYTHONPATH=src python scripts/topk_sass_count.py [--arch 90]`. The GPUs run Triton 3.6: put a
3.6 install first on PYTHONPATH to count what they run (outputs/bench/sweeps/topk_sass_triton36.txt at 686d2d2,
round 28's select; topk_sass_v34_triton36.txt at ffdad9d; topk_sass_v39_triton36.txt at ae57c33 (its write
loops counted by round 30's script); topk_sass_v40_triton36.txt since, with the write loop of every shipped
one-program / split / merge launch).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    os.environ["TRITON_INTERPRET"] = "0"  # decided when Triton is first imported: here, not at module import
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from glm5lib.kernels import topk
    from glm5lib.kernels.compile_report import compile_spec, cuobjdump, sass_loops, sass_opcodes, shipped_kernels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    arch = ap.parse_args(argv).arch

    def line(name: str, cubin: bytes) -> str:
        ops = sass_opcodes(cuobjdump(cubin, "-sass"))
        top = ", ".join(f"{op} {ops.get(op, 0)}" for op in ("VOTE", "POPC", "LOP3", "SHFL", "ATOMS", "REDG"))
        return f"{name}: {sum(ops.values())} instructions; {top}"

    print(f"triton {triton.__version__}, sm_{arch}", flush=True)
    spec = next(s for s in shipped_kernels(arch) if s.name.endswith(":len]") and s.name.startswith("topk_select"))
    for sparse, rows in ((0, 0), (8, 0), (8, 16), (topk.SELECT_SPARSE, topk.SELECT_SCAN_ROWS)):  # the last: v36
        spec.constexprs.update(SPARSE=sparse, ROWS=rows, AGG=0)
        print(line(f"{spec.name} SPARSE={sparse} ROWS={rows}", compile_spec(spec, arch).asm["cubin"]), flush=True)
    # the wave config's build per loop (each radix pass, the write) with each way of counting digits (SELECT_AGG)
    wave = next(s for s in shipped_kernels(arch) if s.name.endswith(":len]") and s.name.startswith(
        f"topk_select[B{topk.SELECT_CONFIG_WAVE[0]}-"))
    for agg in (0, 1, 2, 3):
        wave.constexprs.update(AGG=agg)
        cubin = compile_spec(wave, arch).asm["cubin"]
        print(line(f"{wave.name} AGG={agg}", cubin), flush=True)
        sass = cuobjdump(cubin, "-sass")
        for n, ops in sass_loops(sass, nops=True):
            print(f"  loop: {n} instructions; " + ", ".join(f"{op} {ops.get(op, 0)}" for op in
                                                          ("BAR", "MATCH", "REDG", "VOTE", "POPC", "SHFL", "LDS")))

    # the write loop of every shipped one-program / split / merge launch (round 30's v40: the picks stored by PTX in
    # the block's layout, `topk._scatter`), with each build's shared memory
    for spec in shipped_kernels(arch):
        if spec.name.startswith("topk_select") and "agg" not in spec.name and not spec.name.endswith("+ks]"):
            k = compile_spec(spec, arch)
            n, ops = sass_loops(cuobjdump(k.asm["cubin"], "-sass"), nops=True)[4]  # the four radix passes, the write
            print(f"{spec.name} write loop: {n} instructions; " + ", ".join(
                f"{op} {ops.get(op, 0)}" for op in ("BAR", "STG", "LDS", "STS", "SHFL")) +
                f"; shared memory {k.metadata.shared} bytes", flush=True)

    @triton.jit
    def _scan_toy(X, O, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
        if MODE == 0:  # 1-D prefix sum
            offs = tl.arange(0, BLOCK)
            m = (tl.load(X + offs, mask=offs < n, other=0.0) > 1.0).to(tl.int32)
            tl.store(O + tl.cumsum(m, 0) - 1, offs, mask=m != 0)
        elif MODE == 1:  # rows of 16 adjacent keys
            offs = tl.arange(0, BLOCK // 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
            m = (tl.load(X + offs, mask=offs < n, other=0.0) > 1.0).to(tl.int32)
            tot = tl.sum(m, 1)
            tl.store(O + (tl.cumsum(tot, 0) - tot)[:, None] + tl.cumsum(m, 1) - 1, offs, mask=m != 0)
        else:  # no scan
            offs = tl.arange(0, BLOCK)
            m = tl.load(X + offs, mask=offs < n, other=0.0) > 1.0
            tl.store(O + offs, offs, mask=m)

    for mode, name in enumerate(("1-D cumsum", "256 x 16 rows", "no scan")):
        src = triton.compiler.ASTSource(
            fn=_scan_toy, signature={"X": "*fp32", "O": "*i32", "n": "i32", "BLOCK": "constexpr", "MODE": "constexpr"},
            constexprs={"BLOCK": 4096, "MODE": mode}, attrs={(0,): [["tt.divisibility", 16]],
                                                             (1,): [["tt.divisibility", 16]]})
        cubin = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 8}).asm["cubin"]
        print(line(f"toy 4096-key scan, {name}", cubin), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
