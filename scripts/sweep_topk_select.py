"""Sweep kernels.topk.topk_select configurations (BLOCK, num_warps, DIGIT) against torch.topk on a CUDA GPU.

    PYTHONPATH=src python3 scripts/sweep_topk_select.py OUT.json

Each config is checked (same picked sets as torch.topk: random scores have no ties) and timed with
triton.testing.do_bench (median). Rows longer than `SELECT_MAX_N` take the split path (both of its launches use
the config); scripts/bench_topk_long.py compares it with one program per row. The chosen config is
`SELECT_CONFIG` in src/glm5lib/kernels/topk.py; outputs/bench/sweeps/topk_select_sweep_h200.json holds the H200
runs behind it.
"""

import json
import sys

import torch
import triton.testing

from glm5lib.kernels.topk import topk_indices, topk_select

dev = "cuda"
shapes = [(64, 9000), (128, 32768), (64, 131072), (2048, 8192), (4096, 32768)]
cfgs = [(1024, 8, 8), (2048, 8, 8), (4096, 8, 8), (8192, 8, 8), (4096, 16, 8), (1024, 8, 11), (4096, 8, 11),
        (2048, 8, 4), (8192, 8, 4), (4096, 8, 6), (8192, 16, 6)]
res = []
for T, n in shapes:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, n, generator=g).to(dev)
    L = torch.full((T,), n, dtype=torch.int32, device=dev)
    ref = topk_indices(x, 2048).sort(1).values
    t_torch = triton.testing.do_bench(lambda: topk_indices(x, 2048), warmup=10, rep=50, return_mode="median") * 1e3
    line = f"T{T} N{n}: torch.topk {t_torch:8.1f} us |"
    for cfg in cfgs:
        try:
            out = topk_select(x, 2048, lengths=L, config=cfg)
            ok = torch.equal(out.sort(1).values, ref)
            t = triton.testing.do_bench(lambda: topk_select(x, 2048, lengths=L, out=out, config=cfg), warmup=10, rep=50, return_mode="median") * 1e3
            res.append(dict(T=T, n=n, cfg=cfg, us=t, ok=ok, torch_us=t_torch))
            line += f" {cfg}: {t:7.1f}{'' if ok else ' BAD'}"
        except Exception as e:
            line += f" {cfg}: ERR {str(e)[:60]}"
    print(line, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
