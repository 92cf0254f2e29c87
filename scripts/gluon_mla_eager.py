"""Eager call cost of the Gluon small-head decode kernel beside the Triton one (a prerequisite for dispatching it).

`PYTHONPATH=src python scripts/gluon_mla_eager.py OUT.json`: fp8_ds_mla decode, ctx 32K, top-k 2048, H 8, B 1 and
32. Per path: host time per call (a loop of launches without synchronising, divided by the count: what the
Python side costs while the GPU keeps up), eager time per call and CUDA-graph replay time
(`serving.harness.cuda_timings`). The Triton kernel launches through its pre-bound launcher (`mla.sparse_mla`);
the Gluon kernel through Triton's plain `kernel[grid](...)` binder.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from glm5lib.bench import kernels as bench
from glm5lib.kernels import mla, mla_gluon
from glm5lib.serving.harness import cuda_timings

REPEATS = 200


def host_us(fn, n: int = REPEATS) -> float:
    """Host time per call: n calls back to back, timed on the host before the GPU is waited for."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not torch.cuda.is_available():
        sys.exit("gluon_mla_eager: needs a CUDA GPU")
    rows = []
    for B in (1, 32):
        q, cache, base = bench._make_decode(B, 8, 32768, bench.TOPK, "fp8_ds_mla")
        idx = bench._rand_indices(B, 32768, bench.TOPK, base)
        out = torch.empty(B, 8, 512, device="cuda", dtype=torch.bfloat16)
        paths = {"triton": lambda: mla.sparse_mla(q, cache, idx, bench.SM_SCALE, kv_format="fp8_ds_mla", out=out)}
        for cfg in ((32, 4, 1, False), mla_gluon.DEFAULT):
            paths[f"gluon {mla_gluon.config_name(cfg)}"] = (lambda cfg=cfg: mla_gluon.sparse_mla_gluon(
                q, cache, idx, bench.SM_SCALE, out=out, **mla_gluon.config_kwargs(cfg)))
        for name, fn in paths.items():
            row = {"B": B, "H": 8, "path": name}
            try:
                row["host_us"] = host_us(fn)
                row.update(cuda_timings(fn, REPEATS))
            except Exception as exc:  # noqa: BLE001  (recorded; the others still run)
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            print(f"B{B:<3d} {name:24s} host {row.get('host_us', float('nan')):6.1f} us  eager "
                  f"{row.get('eager_us', float('nan')):6.1f}  graph {row.get('graph_us', float('nan')):6.1f}",
                  flush=True)
    res = {"meta": {"commit": os.environ.get("GLM5LIB_COMMIT"), "device": torch.cuda.get_device_name(),
                    "triton": __import__("triton").__version__}, "rows": rows}
    if argv:
        with open(argv[0], "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
