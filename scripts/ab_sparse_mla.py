"""A/B timing of two versions of the sparse-MLA kernel module in one process, on a CUDA GPU.

    python scripts/ab_sparse_mla.py OLD_MLA_PY --json OUT.json

OLD_MLA_PY is another version of src/glm5lib/kernels/mla.py (e.g. `git show REV:src/glm5lib/kernels/mla.py`); it
is loaded under its own module name beside the current one and must use the same helpers (`kernels.common`,
`kernels.naive`). Every shipped config is timed on the shapes its dispatcher picks it for, old and new alternating
(A B A B ...) so clock and thermal drift hit both alike; outputs are compared for equality. Timing: one CUDA graph
of R calls over R index sets (`glm5lib.bench.kernels._graph_ms`), median of `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys

import torch

from glm5lib.bench import kernels as B
from glm5lib.kernels import mla as new_mla
from glm5lib.kernels import naive


def load_module(path: str, name: str = "glm5lib_mla_old"):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


CASES = [  # (kind, T, H, kv_format): decode batches and prefill chunks at the heads-per-GPU of TP 8/4/1
    ("decode", 1, 8, "bf16"), ("decode", 1, 8, "fp8_ds_mla"), ("decode", 1, 16, "fp8_ds_mla"),
    ("decode", 1, 64, "fp8_ds_mla"), ("decode", 1, 128, "fp8_ds_mla"), ("decode", 32, 64, "fp8_ds_mla"),
    ("decode", 32, 8, "bf16"), ("decode", 128, 8, "bf16"), ("decode", 128, 16, "bf16"),
    ("decode", 32, 8, "fp8_ds_mla"), ("decode", 128, 8, "fp8_ds_mla"), ("decode", 128, 16, "fp8_ds_mla"),
    ("decode", 128, 64, "bf16"), ("decode", 128, 64, "fp8_ds_mla"), ("decode", 128, 128, "fp8_ds_mla"),
    ("prefill", 2048, 16, "bf16"), ("prefill", 2048, 64, "bf16"), ("prefill", 1024, 16, "fp8_ds_mla"),
]


def run_case(kind, T, H, fmt, old, rounds, ctx=32768, topk=2048):
    if kind == "decode":  # one request per token, each with its own ctx rows
        q, cache, base = B._make_decode(T, H, ctx, topk, fmt)
    else:  # a prefill chunk: T tokens of one request over the same ctx rows
        _, cache, _ = B._make_decode(1, H, ctx, topk, fmt)
        q, base = torch.randn(T, H, naive.D_QK, device="cuda", dtype=torch.bfloat16), None
    reps = B._rotations(T * topk * (656 if fmt == "fp8_ds_mla" else 1152))
    idx_sets = [B._rand_indices(T, ctx, topk, base) for _ in range(reps)]
    out_new = torch.empty(T, H, naive.D_QK - naive.D_ROPE, dtype=q.dtype, device="cuda")
    out_old = torch.empty_like(out_new)
    a, _ = new_mla.sparse_mla(q, cache, idx_sets[0], B.SM_SCALE, kv_format=fmt, out=out_new)
    b, _ = old.sparse_mla(q, cache, idx_sets[0], B.SM_SCALE, kv_format=fmt, out=out_old)
    equal = bool(torch.equal(a, b))
    rel = float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
    cfg = new_mla.pick_config(T, H, topk, fmt, new_mla.smem_class(q.device), new_mla.num_sms(q.device))
    t_new, t_old = [], []
    for _ in range(rounds):
        t_old.append(B._graph_ms([lambda i=i: old.sparse_mla(q, cache, i, B.SM_SCALE, kv_format=fmt, out=out_old)
                                  for i in idx_sets]))
        t_new.append(B._graph_ms([lambda i=i: new_mla.sparse_mla(q, cache, i, B.SM_SCALE, kv_format=fmt, out=out_new)
                                  for i in idx_sets]))
    mo, mn = statistics.median(t_old), statistics.median(t_new)
    return {"kind": kind, "T": T, "H": H, "kv_format": fmt, "config": cfg.name, "outputs_equal": equal, "rel_diff": rel,
            "old_us": mo * 1e3, "new_us": mn * 1e3, "new_over_old": mn / mo,
            "old_rounds_us": [t * 1e3 for t in t_old], "new_rounds_us": [t * 1e3 for t in t_new]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the other version of kernels/mla.py")
    ap.add_argument("--json", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    old = load_module(args.old)
    rows = []
    for case in CASES:
        try:
            r = run_case(*case, old, args.rounds)
        except Exception as exc:  # one broken case is a row, not a lost run
            r = {"kind": case[0], "T": case[1], "H": case[2], "kv_format": case[3], "error": f"{type(exc).__name__}: {exc}"}
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("rounds_us")}), flush=True)
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
