"""Static instruction counts of the paged indexer kernel (decode) for bf16 q over fp8 keys without a GPU: q scored as
it is (a bf16 dot) against each rewrite of q (`indexer.PAGED_Q_FORM`), both dot layouts, per architecture. AOT
compile (`compile_report.indexer_paged_spec`), `cuobjdump -sass`, whole scores kernel (one 128-key tile a
program, with the register cap `indexer.paged_maxnreg` sets; the prepass is not counted), by opcode. `--loop`: the
looping grid's builds instead (`row_bound_only`, what a captured decode step launches; never capped).

`TRITON_INTERPRET=0 python scripts/indexer_sass_count.py [--arch 90 89 120 80] [--loop]`. The H200 runs Triton 3.6:
put a 3.6 install first on PYTHONPATH to count what it runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys

def main(argv=None) -> int:
    os.environ["TRITON_INTERPRET"] = "0"  # decided when Triton is first imported: here, not at module import
    import torch
    import triton

    from glm5lib.kernels.compile_report import compile_spec, cuobjdump, indexer_paged_spec, sass_opcodes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 89, 120, 80])
    ap.add_argument("--loop", action="store_true", help="the looping grid's builds (row_bound_only)")
    a = ap.parse_args(argv)
    if len(a.arch) > 1:  # one process per target: Triton 3.6 fails ptxas on a second target in one process
        for arch in a.arch:
            rc = subprocess.run([sys.executable, __file__, "--arch", str(arch)] + ["--loop"] * a.loop).returncode
            if rc:
                return rc
        return 0
    from glm5lib.kernels import indexer as ix

    ix.PAGED_TILES = 1  # one tile a program, whatever the rule gives a form (sm_90: 4 for two e4m3 terms)
    grid = "the looping grid" if a.loop else "one 128-key tile"
    print(f"triton {triton.__version__}; paged indexer, bf16 q [32 heads] over fp8 keys, {grid}, 4 warps", flush=True)
    for arch in a.arch:
        for keys_m in (False, True):
            for form in (None, "f16-kernel", "f16", "e4m3x2"):
                if form == "e4m3x2" and arch < 89:
                    continue
                spec = indexer_paged_spec(arch, torch.bfloat16, True, a.loop, keys_m=keys_m, form=form)
                cubin = compile_spec(spec, arch).asm["cubin"]
                regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage"))
                ops = collections.Counter(sass_opcodes(cuobjdump(cubin, "-sass")))
                conv = sum(ops[o] for o in ("F2FP", "F2F", "I2F", "HADD2", "PRMT"))
                top = ", ".join(f"{op} {c}" for op, c in ops.most_common(8))
                print(f"sm_{arch} {'keys' if keys_m else 'heads'}-as-M{' looping grid' if a.loop else ''}, "
                      f"q {form or 'as it is (bf16 dot)'}: "
                      f"{regs.group(1) if regs else '?'} registers{f' (cap {spec.maxnreg})' if spec.maxnreg else ''}, "
                      f"{sum(ops.values())} instructions, "
                      f"F2FP+F2F+HADD2+PRMT+I2F {conv}; {top}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
