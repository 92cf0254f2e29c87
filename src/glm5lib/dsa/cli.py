"""`glm5lib dsa ...`: train the tiny model, analyse a model's indexer layer by layer, print the cost model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glm5lib.errors import UserError


def _layers(text: str) -> list[int]:
    """'0-2' -> [0, 1, 2]; '0,3,5' -> [0, 3, 5]."""
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                a, b = part.split("-")
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad layer list {text!r}; use e.g. 0-2 or 0,3,5") from None
    return out


def _open_model(path: str, stream: bool = True):
    from glm5lib.mapping.reference import reference_from_gguf
    from glm5lib.model.reference import ReferenceModel

    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file or directory")
    if p.is_dir():
        return ReferenceModel.from_hf_dir(p, stream=stream)
    return reference_from_gguf(p, stream=stream)


def cmd_train_tiny(args) -> int:
    from glm5lib.dsa.train import ensure_trained_tiny, train_log

    paths = ensure_trained_tiny(Path(args.out) if args.out else None)
    log = train_log(paths)
    print(f"trained tiny model: {paths.root}")
    print(f"  hf dir: {paths.hf_dir}")
    for t, p in paths.gguf.items():
        print(f"  gguf {t}: {p}")
    print(f"  dense loss {log['loss'][0]:.3f} -> {log['loss'][-1]:.3f} in {log['seconds_dense']:.0f} s; "
          f"indexer KL {log['indexer_kl'][0]:.3f} -> {log['indexer_kl'][-1]:.3f} in {log['seconds_indexer']:.0f} s")
    return 0


def cmd_analyze(args) -> int:
    from glm5lib.dsa.footprint import analyze_layers

    model = _open_model(args.model)
    n = model.cfg.num_hidden_layers
    layers = args.layers if args.layers is not None else list(range(min(3, n)))
    if max(layers) >= n or min(layers) < 0:
        raise UserError(f"layers must be within 0-{n - 1}")
    if layers != list(range(layers[0], layers[-1] + 1)) or layers[0] != 0:
        raise UserError("--layers must be a contiguous range starting at 0 (hidden states flow through them)")
    result = analyze_layers(model, tokens=args.tokens, layers=layers, seed=args.seed, topk=args.topk)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.model}: {result['tokens']} tokens, top-k {result['topk']}")
    print(f"{'layer':>5} {'seconds':>8} {'RSS GB':>7} {'peak RSS GB':>11} {'mass kept':>9} {'best k':>7} "
          f"{'set recall':>10}")
    for row in result["layers"]:
        print(f"{row['layer']:>5} {row['seconds']:>8.2f} {row['rss_gb']:>7.2f} {row['peak_rss_gb']:>11.2f} "
              f"{row['mass_recall']:>9.3f} "
              f"{row['oracle_mass']:>7.3f} {row['set_recall']:>10.3f}")
    return 0


def cmd_cost(args) -> int:
    from glm5lib.dsa import cost
    from glm5lib.model.spec import GLM5Config

    s = cost.CostShapes.from_config(GLM5Config.glm5(), heads=args.heads)
    t = cost.cost_table(args.context, s)
    print(f"GLM-5, one layer, {s.heads} heads, top-k {s.topk}; FLOPs crossover {cost.flops_crossover(s):,.0f} "
          f"tokens, bytes crossover (fp8 keys vs fp8_ds_mla rows) {cost.bytes_crossover(s):,.0f} tokens")
    print(f"{'context':>9} {'indexer MFLOP':>13} {'sparse MFLOP':>12} {'dense MFLOP':>11} {'idx keys MB':>11} "
          f"{'KV bf16 MB':>10} {'KV fp8 MB':>9}")
    for i, L in enumerate(t["context"]):
        print(f"{int(L):>9} {t['indexer_flops'][i] / 1e6:>13.1f} {t['sparse_attention_flops'][i] / 1e6:>12.1f} "
              f"{t['dense_attention_flops'][i] / 1e6:>11.1f} {t['indexer_key_bytes_fp8'][i] / 1e6:>11.2f} "
              f"{t['gathered_kv_bytes_bf16'][i] / 1e6:>10.2f} {t['gathered_kv_bytes_fp8'][i] / 1e6:>9.2f}")
    return 0


def cmd_rope_layout(args) -> int:
    from glm5lib.dsa.analysis import detect_indexer_rope_layout
    from glm5lib.dsa.footprint import sample_ids

    model = _open_model(args.model, stream=False)
    T = args.tokens or 2 * model.cfg.index_topk
    seqs = [sample_ids(model, T, seed=args.seed + i) for i in range(args.sequences)]
    layout, recall = detect_indexer_rope_layout(model, seqs)
    print(f"indexer RoPE layout: {layout} (attention mass kept: "
          + ", ".join(f"{k} {v:.3f}" for k, v in recall.items()) + ")")
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("dsa", help="DSA indexer analysis and the trained tiny model")
    sub = p.add_subparsers(dest="dsa_command", metavar="SUBCOMMAND")
    sub.required = True

    t = sub.add_parser("train-tiny", help="train (or reuse) the tiny model with structured attention")
    t.add_argument("--out", help="output directory (default: .cache/tiny-trained)")
    t.set_defaults(func=cmd_train_tiny)

    a = sub.add_parser("analyze", help="run the first layers of a GGUF / HF model, one layer in memory at a time")
    a.add_argument("model", help="GGUF file or any shard of a set, or an HF directory")
    a.add_argument("--layers", type=_layers, default=None, help="e.g. 0-2 (default: the first 3)")
    a.add_argument("--tokens", type=int, default=256, help="sequence length (random token ids)")
    a.add_argument("--topk", type=int, default=None, help="override index_topk")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=cmd_analyze)

    c = sub.add_parser("cost", help="indexer vs sparse-attention FLOPs and bytes per token (GLM-5 shapes)")
    c.add_argument("--context", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1024, 2048, 8192, 32768, 35000, 65536, 131072, 202752])
    c.add_argument("--heads", type=int, default=None, help="heads per GPU (default 64)")
    c.set_defaults(func=cmd_cost)

    r = sub.add_parser("rope-layout", help="tell which RoPE layout a model's indexer was trained with")
    r.add_argument("model", help="GGUF file/shard or HF directory")
    r.add_argument("--tokens", type=int, default=None)
    r.add_argument("--sequences", type=int, default=2)
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=cmd_rope_layout)
