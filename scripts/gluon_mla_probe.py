"""Stage timing of the Gluon small-head decode kernel (`mla_gluon`, PROBE builds) on a GPU, beside the Triton kernel.

`PYTHONPATH=src python scripts/gluon_mla_probe.py OUT.json`: fp8_ds_mla decode, ctx 32K, top-k 2048, H 8 and 16,
B 32 and 128. For each Gluon config it times the kernel built to stop after each stage (1: gathers only, 2: + the
e4m3 -> fp16 tile, 4: + S = q k^T, 3: + the softmax statistics, 0: the whole kernel) with the same grid and splits,
plus the Triton kernel; inputs and timing (CUDA-graph replay over rotated index sets, so the gathered rows do not
stay in L2) are `glm5lib.bench.kernels`'. A stage's time includes everything before it, so the differences are
what each stage adds on this structure; the floor is the gathered bytes at the measured copy bandwidth.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from glm5lib.bench import kernels as bench
from glm5lib.kernels import mla, mla_gluon
from glm5lib.kernels.mla import sparse_mla_kv_bytes

CTX = 32768
CONFIGS = [(32, 4, 2), (64, 8, 2)]  # (block_n, num_warps, nbuf) of the key-split kernel
STAGES = {1: "gather", 2: "gather+convert", 4: "+QK", 3: "+QK+softmax", 0: "kernel"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_path = argv[0] if argv else "gluon_mla_probe.json"
    t0 = time.time()
    ceil = bench.measure_ceilings()
    rows = []
    print(f"copy {ceil['copy_GBps']:.0f} GB/s", flush=True)
    for H in (8, 16):
        for B in (32, 128):
            fmt = "fp8_ds_mla"
            q, cache, base = bench._make_decode(B, H, CTX, bench.TOPK, fmt)
            kv_bytes = sparse_mla_kv_bytes(B, bench.TOPK, fmt)
            floor_us = kv_bytes / (ceil["copy_GBps"] * 1e3)
            idx_sets = [bench._rand_indices(B, CTX, bench.TOPK, base) for _ in range(bench._rotations(kv_bytes))]
            out = torch.empty(B, H, 512, device="cuda", dtype=torch.bfloat16)
            ms = bench._graph_ms([lambda i=i: mla.sparse_mla_launch(q, cache, i, bench.SM_SCALE, kv_format=fmt, out=out)
                                  for i in idx_sets])
            rows.append({"B": B, "H": H, "impl": "triton", "stage": "kernel", "us": ms * 1e3, "floor_us": floor_us})
            print(f"B{B:<4d} H{H:<3d} triton              kernel          {ms * 1e3:8.1f} us  floor {floor_us:.1f}",
                  flush=True)
            for bn, nw, nb in CONFIGS:
                name = mla_gluon.config_name((bn, nw, nb, False))
                for probe, stage in STAGES.items():
                    row = {"B": B, "H": H, "impl": f"gluon {name}", "stage": stage, "probe": probe,
                           "floor_us": floor_us}
                    try:
                        ms = bench._graph_ms([lambda i=i: mla_gluon.sparse_mla_gluon(
                            q, cache, i, bench.SM_SCALE, block_n=bn, num_warps=nw, nbuf=nb, out=out, probe=probe)
                            for i in idx_sets])
                        row["us"] = ms * 1e3
                        print(f"B{B:<4d} H{H:<3d} {name:18s} {stage:15s} {ms * 1e3:8.1f} us  "
                              f"({100 * floor_us / (ms * 1e3):.0f} % of copy)", flush=True)
                    except Exception as exc:  # noqa: BLE001  (one failing build must not end the run)
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        print(f"B{B:<4d} H{H:<3d} {name:18s} {stage:15s} error {row['error'][:120]}", flush=True)
                    rows.append(row)
            del q, cache, idx_sets, out
            torch.cuda.empty_cache()
    res = {"meta": {"device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
                    "elapsed_s": time.time() - t0, "commit": os.environ.get("GLM5LIB_COMMIT")},
           "ceilings": ceil, "rows": rows}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out_path} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
