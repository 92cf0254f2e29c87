"""Static instruction counts of `mla_gluon_fp8mma`'s main loop without a GPU: AOT compile for sm_90 (`aot_compile`),
`cuobjdump -sass`, then the instructions between the loop's head and its backward branch (the longest backward
branch of the kernel), by opcode. What docs/kernels.md v14 quotes for the fp16- and e4m3-product builds.

`TRITON_INTERPRET=0 python scripts/fp8mma_sass_count.py [--arch 90] [--heads 8] [--no-split] [CONFIG ...]` with
CONFIG as the fields of `mla_gluon_fp8mma.Config` in order, `nbuf,q_terms,p_terms[,maxnreg[,block_n[,row_threads[,
refill[,sched[,key_warps[,widen[,wgmma]]]]]]]]` (default: the shipped sm_90 build and the e4m3 build `2,2,2`);
--no-split counts the build a program owning a token's whole top-k list takes (prefill), the balanced schedule's
tile loop inside its loop over pieces where the config takes that schedule; --refill-rows M builds the early refill's
copy mode M (`REFILL_ROWS`) and prints its loop's copies and barriers; --gather-scales M the same for the whole-tile
gathers' scale-copy mode M (`GATHER_SCALES`: the split decode and the 9-16-head prefill); --smem adds the
shared-memory bytes a warp moves in one tile (`compile_report.smem_bytes`: LDS / LDSM read, STS / LDGSTS written,
by instruction and width). The H200 runs Triton 3.6: put a 3.6 install first on PYTHONPATH to count what it runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys


def loop_counts(sass: str, inner: bool = False) -> tuple[int, collections.Counter]:
    """(instructions, opcode counts) of the main loop, NOPs included (`compile_report.sass_loop`, the parser
    `scripts/mla_static_cost.py` uses too; inner: the innermost such loop, the balanced schedule's tile loop)."""
    from glm5lib.kernels.compile_report import sass_loop

    n, _, hist = sass_loop(sass, nops=True, inner=inner)
    if not n:
        raise SystemExit("fp8mma_sass_count: no backward branch in the SASS")
    return n, collections.Counter(hist)


def main(argv=None) -> int:
    # compiling needs Triton's interpreter off, decided when Triton is first imported (here, not at module import:
    # the tests import `loop_counts` alone)
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton

    from glm5lib.kernels import mla_gluon_fp8mma as fm
    from glm5lib.kernels.compile_report import cuobjdump

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=[",".join(map(str, fm.CONFIG_BY_CLASS["big"])), "2,2,2"],
                    help="Config fields in order: nbuf,q_terms,p_terms[,maxnreg[,block_n[,row_threads[,...]]]]")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--no-split", action="store_true", help="the build without splits (a token's whole list)")
    ap.add_argument("--smem", action="store_true", help="also the shared-memory bytes a warp moves in one tile")
    ap.add_argument("--refill-rows", type=int, choices=fm.REFILL_ROWS_MODES,
                    help="the early refill's copy mode to build (`REFILL_ROWS`; default: the shipped one), and a line "
                         "of the loop's copies (LDGSTS) and barriers for it")
    ap.add_argument("--gather-scales", type=int, choices=fm.GATHER_SCALES_MODES,
                    help="the whole-tile gathers' scale-copy mode to build (`GATHER_SCALES`; default: the shipped "
                         "one), and a line of the loop's copies, barriers and shared-memory loads for it")
    a = ap.parse_args(argv)
    if a.refill_rows is not None:
        fm.set_refill_rows(a.refill_rows)
    if a.gather_scales is not None:
        fm.set_gather_scales(a.gather_scales)
    split = not a.no_split
    print(f"triton {triton.__version__}, sm_{a.arch}, {a.heads} heads, {'split' if split else 'one-split'} build; "
          f"loop = one tile of the keys and warps each line names (`tile_keys`, `key_warps_of`), counts a warp's")
    for text in a.configs:
        try:
            cfg = fm.Config(*(int(x) for x in text.split(",")))
        except (TypeError, ValueError):
            sys.exit(f"fp8mma_sass_count: a config is Config's fields in order, nbuf,q_terms,p_terms[,...], "
                     f"got {text!r}")
        k = fm.aot_compile(a.arch, fm.head_groups(a.heads), **fm.config_kwargs(cfg), split=split)
        sass = cuobjdump(k.asm["cubin"], "-sass")
        inner = bool(cfg.sched) and not split  # the balanced schedule's tile loop sits inside its loop over pieces
        n, ops = loop_counts(sass, inner=inner)
        top = ", ".join(f"{op} {c}" for op, c in ops.most_common(12))
        conv = sum(c for op, c in ops.items() if op.startswith("F2F"))
        G = fm.head_groups(a.heads)
        wm = fm.key_warps_of(cfg.key_warps, G, cfg.q_terms, split, cfg.block_n)
        keys = fm.tile_keys(cfg.block_n, 2 if split else 1, wm)
        print(f"{fm.config_name(cfg)}: {n} instructions in the loop (BAR {ops['BAR']}, F2F* {conv}, {keys}-key tile, "
              f"{fm.num_warps_of(G, wm)} warps); {top}")
        if a.refill_rows is not None:
            print(f"  early refill copy mode {fm.REFILL_ROWS}: LDGSTS {ops['LDGSTS']}, BAR {ops['BAR']}, "
                  f"LDS {ops['LDS']}")
        if a.gather_scales is not None:
            print(f"  whole-tile gathers' scale-copy mode {fm.GATHER_SCALES}: LDGSTS {ops['LDGSTS']}, "
                  f"BAR {ops['BAR']}, LDS {ops['LDS']}, STS {ops['STS']}")
        if a.smem:
            from glm5lib.kernels.compile_report import sass_loop_body, smem_bytes

            sm = smem_bytes(sass_loop_body(sass, True, inner)[0])
            ops_b = ", ".join(f"{op} {b}" for op, b in sorted(sm["by_op"].items(), key=lambda kv: -kv[1]))
            left = f"; not counted: {sm['uncounted']}" if sm["uncounted"] else ""
            print(f"  shared memory a warp a tile: {sm['read']} bytes read, {sm['written']} written ({ops_b}){left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
