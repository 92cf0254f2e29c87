"""How the fp8-cache prefill's time grows with its token count: the wave question (H200, one process).

`PYTHONPATH=src python scripts/fp8mma_waves.py OUT.json [--heads 8] [--tokens 528,1056,...]
[--configs 0,1,1,0,0,8,2 ...] [--balanced-variants] [--no-flashmla]`

At one split a program owns a token's whole top-k list, so a prefill of T tokens is T equal programs, and
`mla_gluon_fp8mma.programs_per_sm` of them share an SM (4 at 8 heads: 528 slots on 132 SMs). If the programs' time
does not depend on how many share an SM, T = 4096 (7.76 waves) takes as long as 4224 (8 full waves), and the
last wave's idle slots cost 3 % of s_q 4096's time. If an SM with fewer programs runs each faster, the time grows
with T instead. Each token count is timed with `sparse_mla` (the shipped route, eager, as `glm5lib bench` times the
prefill) and, with `--configs`, each given build at one split; FlashMLA's bf16 prefill (padded to 64 heads) beside it
when `.vendor` holds its library. One 32K-token sequence, random distinct top-k 2048 rows per token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from glm5lib.bench import kernels as bk
from glm5lib.kernels import mla, mla_gluon_fp8mma as fm, naive

S_KV = 32768


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", default="528,1056,2112,3168,3696,3960,4096,4224")
    ap.add_argument("--configs", nargs="*", default=[], help="builds as comma-separated Config fields")
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--balanced-variants", action="store_true",
                    help="also the balanced build (sched 1) with one program a token (its code on the one-a-token "
                         "schedule)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fp8mma_waves: needs a CUDA GPU")
    dev = torch.device("cuda")
    H = a.heads
    fm_err = None if a.no_flashmla else bk.load_flashmla()
    cache, kv = bk.fp8_ds_mla_rows(S_KV, dev)
    cfgs = [fm.Config(*[int(x) for x in c.split(",")]) for c in a.configs]
    G = fm.head_groups(H)
    slots = fm.programs_per_sm(G, fm.DEFAULT.nbuf, fm.DEFAULT.q_terms) * torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for T in [int(x) for x in a.tokens.split(",")]:
        q = torch.randn(T, H, naive.D_QK, device=dev, dtype=torch.bfloat16)
        idx = bk._rand_indices(T, S_KV, bk.TOPK)
        out = torch.empty(T, H, naive.D_NOPE, device=dev, dtype=torch.bfloat16)
        ref, _ = naive.sparse_mla_ref_chunked(q[:64], cache, idx[:64], bk.SM_SCALE, kv_format="fp8_ds_mla", chunk=32)

        def rel(o):
            return float((o[:64].float() - ref).norm() / ref.norm())

        row = {"T": T, "waves": T / slots}
        o, _ = mla.sparse_mla(q, cache, idx, bk.SM_SCALE, kv_format="fp8_ds_mla", out=out)
        row["shipped_rel"] = rel(o)
        row["shipped_us"] = 1e3 * bk._median_ms(lambda: mla.sparse_mla(q, cache, idx, bk.SM_SCALE,
                                                                        kv_format="fp8_ds_mla", out=out))
        for c in cfgs:
            name = fm.config_name(c)
            try:
                kw = fm.config_kwargs(c)
                o, _ = fm.sparse_mla_fp8mma(q, cache, idx, bk.SM_SCALE, out=out, num_splits=1, **kw)
                row[f"{name}_rel"] = rel(o)
                row[f"{name}_us"] = 1e3 * bk._median_ms(lambda: fm.sparse_mla_fp8mma(
                    q, cache, idx, bk.SM_SCALE, out=out, num_splits=1, **kw))
            except Exception as exc:
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        variants = [("programs=T", dict(programs=T))] if a.balanced_variants else []
        for tag, extra in variants:
            kw = dict(fm.config_kwargs(fm.DEFAULT), sched=1, **extra)
            try:
                o, _ = fm.sparse_mla_fp8mma(q, cache, idx, bk.SM_SCALE, out=out, **kw)
                row[f"balanced-{tag}_rel"] = rel(o)
                row[f"balanced-{tag}_us"] = 1e3 * bk._median_ms(lambda: fm.sparse_mla_fp8mma(
                    q, cache, idx, bk.SM_SCALE, out=out, **kw))
            except Exception as exc:
                row[f"balanced-{tag}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if fm_err is None and not a.no_flashmla:
            qp = bk.pad_heads(q, 64)
            row["flashmla_us"] = 1e3 * bk._median_ms(lambda: bk.flashmla_prefill(qp, kv.unsqueeze(1), idx.unsqueeze(1)))
            del qp
        row["shipped_us_per_token"] = row["shipped_us"] / T
        print(json.dumps(row), flush=True)
        rows.append(row)
        del q, idx, out
        torch.cuda.empty_cache()
    flashmla = "skipped" if a.no_flashmla else fm_err or "loaded"
    meta = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("GLM5LIB_COMMIT"), "heads": H, "s_kv": S_KV,
            "slots": slots, "flashmla": flashmla,
            "configs": [fm.config_name(c) for c in cfgs], "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    json.dump({"meta": meta, "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
