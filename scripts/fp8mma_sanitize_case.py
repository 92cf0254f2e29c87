"""fp8-cache kernel launches (`mla_gluon_fp8mma`) for compute-sanitizer (memcheck, racecheck, synccheck; GPU), one
per given build, each compared with `naive.sparse_mla_ref` (`gluon_mla_device.compare`, the device scripts' bf16
tolerances; the logs at 8457230 and 410f5c9 came from a check of max |err| / max |ref| < 2e-2 and equal finite lse
rows) so that a wrong result fails here too:
8 heads over 40 tokens at one split (64-key tiles: the prefill build) and at 4 splits (32-key tiles: the decode
build), top-k 2048 with invalid and out-of-range indices, 5 tokens of 6 heads over top-k 300 (a tile past the
list's end), and the balanced schedule (`SCHEDS`) over 40 tokens of top-k 512 on 16 programs (20 tiles a program,
8 a token: most program boundaries cut a token). `--h16` adds 16 heads over 40 tokens at one split (the 9-16-head
prefill build: four key warps, two ring slots) and at 4 splits (the 16-head decode build: two head groups side by
side). Small on purpose: the sanitizer runs each launch serially.

`PYTHONPATH=src compute-sanitizer --tool racecheck python scripts/fp8mma_sanitize_case.py [--h16]
[--configs 0,1,1,0,0,8,1 ...]` (default: the shipped big-class build and every `REFILLS` mode of it)
"""

from __future__ import annotations

import os
import sys

import torch

from glm5lib.kernels import mla_gluon_fp8mma as fm
from glm5lib.kernels import naive
from glm5lib.kernels.checks import make_indices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_mla_device import compare  # noqa: E402  (the same comparison as the other Gluon scripts)

SM_SCALE = 1.0 / 16.0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not torch.cuda.is_available():
        sys.exit("fp8mma_sanitize_case: needs a CUDA GPU")
    big = fm.CONFIG_BY_CLASS["big"]
    cfgs = [big._replace(refill=r) for r in fm.REFILLS]
    if "--configs" in argv:
        cfgs = []
        for a in argv[argv.index("--configs") + 1:]:
            if a.startswith("--"):
                break
            cfgs.append(fm.Config(*(int(x) for x in a.split(","))))
    cases = [(40, 8, 2048, 1, None), (40, 8, 2048, 4, None), (5, 6, 300, None, None), (40, 8, 512, 1, 16)]
    if "--h16" in argv:
        cases += [(40, 16, 2048, 1, None), (40, 16, 2048, 4, None)]
    g = torch.Generator().manual_seed(0)
    n_rows = 4096
    cache = naive.quantize_fp8_ds_mla(torch.randn(n_rows, naive.D_QK, generator=g)).cuda()
    bad = total = 0
    for T, H, topk, splits, programs in cases:
        q = torch.randn(T, H, naive.D_QK, generator=g).to(torch.bfloat16).cuda()
        idx = make_indices(T, topk, n_rows, "mixed", g, torch.device("cuda"))
        ro, rlse = naive.sparse_mla_ref_chunked(q, cache, idx, SM_SCALE, kv_format="fp8_ds_mla", chunk=32)
        for cfg in cfgs:
            if programs and not (cfg.sched and fm.refill_mode(cfg.refill, cfg.nbuf, 1, 1) == 1):
                continue  # (the program count applies to the balanced schedule only)
            o, lse = fm.sparse_mla_fp8mma(q, cache, idx, SM_SCALE, num_splits=splits, **fm.config_kwargs(cfg),
                                          **({"programs": programs} if programs else {}))
            torch.cuda.synchronize()
            r = compare(o, lse, ro, rlse)
            err, ok = r["rel"], r["ok"]
            total += 1
            bad += not ok
            tag = f" programs {programs}" if programs else ""
            print(f"T{T} H{H} K{topk} splits {splits}{tag} {fm.config_name(cfg)}: rel {err:.2e} "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
    print(f"{total - bad}/{total} launches match the fp32 reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
