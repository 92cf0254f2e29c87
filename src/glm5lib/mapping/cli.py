"""`glm5lib map check|export|table|layer`: the GGUF <-> HF mapping from the command line.

    glm5lib map check PATH [--config config.json] [--json]     exit 0 consistent, 1 problems, 2 unreadable
    glm5lib map export PATH OUTDIR [--dtype auto] [--mtp]       HF directory for transformers / vLLM
    glm5lib map table PATH|--tiny [--blocks 0,1] [--json|--markdown]
    glm5lib map layer PATH HF_DIR [--layer N] [--json]          one attention layer: GGUF vs HF reference
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glm5lib.errors import UserError
from glm5lib.model.spec import PRESET_NAMES, GLM5Config  # dependency-free module: cheap at CLI start-up


def _load_config(path: str | None) -> dict | None:
    if path is None:
        return None
    from glm5lib.files import read_json_object
    from glm5lib.model.spec import config_problems

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    config = read_json_object(p, "config file")
    bad = config_problems(config)
    if bad:
        raise UserError(f"{p}: {bad[0]}")
    return config


def cmd_check(args: argparse.Namespace) -> int:
    from glm5lib.mapping.inventory import check

    report = check(args.path, config=_load_config(args.config))
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print(report.format_text(max_lines=args.max_lines))
    return report.exit_code


def cmd_export(args: argparse.Namespace) -> int:
    from glm5lib.gguf.split import parse_size
    from glm5lib.mapping.export import export_hf

    out = export_hf(args.path, args.outdir, dtype=args.dtype, include_mtp=args.mtp,
                    max_shard_bytes=parse_size(args.max_shard_size), progress=not args.quiet, force=args.force)
    print(f"wrote {out}")
    return 0


def _parse_blocks(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        return {int(b) for b in text.split(",") if b.strip()}
    except ValueError:
        raise UserError(f"--blocks takes comma-separated layer numbers, got {text!r}") from None


def cmd_table(args: argparse.Namespace) -> int:
    from glm5lib.mapping.config import config_from_gguf
    from glm5lib.mapping.weights import mapping_table

    if args.path is None:
        cfg = GLM5Config.preset(args.preset)
    else:
        cfg = config_from_gguf(args.path)
    rows = mapping_table(cfg, blocks=_parse_blocks(args.blocks))
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=1))
    elif args.markdown:
        print("| GGUF | ggml shape | HF | HF shape | transform |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r.gguf_name} | {list(r.ggml_shape)} | {r.hf_name} | {list(r.hf_shape)} | `{r.transform}` |")
    else:
        for r in rows:
            print(f"{r.gguf_name:36s} {str(list(r.ggml_shape)):22s} {r.hf_name:58s} {str(list(r.hf_shape)):18s} "
                  f"{r.transform}")
    return 0


def cmd_layer(args: argparse.Namespace) -> int:
    import torch

    from glm5lib.mapping.layer_check import layer_check

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    try:
        res = layer_check(args.path, args.hf_dir, layer=args.layer, seq_len=args.seq_len)
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(res.as_dict(), indent=1) if args.json else res.format_text())
    worst_good = max(res.results[k]["cos_diff"] for k in ("hf_from_gguf", "absorbed_from_gguf"))
    return 0 if worst_good < args.max_cos_diff else 1


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("map", help="glm-dsa GGUF <-> HF/vLLM weight mapping: check, export, table")
    sub = p.add_subparsers(dest="map_command", metavar="SUBCOMMAND")
    sub.required = True

    c = sub.add_parser("check", help="inventory/metadata report of a GGUF file or shard set (headers only)")
    c.add_argument("path", help="GGUF file or any shard of a set")
    c.add_argument("--config", help="config.json (or a directory holding one) to compare with")
    c.add_argument("--json", action="store_true", help="machine-readable report")
    c.add_argument("--max-lines", type=int, default=20, help="findings shown per category (text output)")
    c.set_defaults(func=cmd_check)

    e = sub.add_parser("export", help="write an HF checkpoint directory (config, tokenizer, safetensors)")
    e.add_argument("path")
    e.add_argument("outdir", help="new directory (its parent must exist)")
    e.add_argument("--force", action="store_true", help="replace an existing OUTDIR (only once the new one is complete)")
    e.add_argument("--dtype", default="auto", help="auto (float32 for an F32 file, else bfloat16), float32, "
                   "bfloat16, float16")
    e.add_argument("--mtp", action="store_true", help="keep the MTP layer (for vLLM; transformers reports it as "
                   "unexpected keys unless the model has 78 layers)")
    e.add_argument("--max-shard-size", default="5G", metavar="N[M|G]",
                   help="safetensors shard size limit (M=1e6, G=1e9 bytes, as gguf split; default 5G)")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_export)

    t = sub.add_parser("table", help="GGUF name/shape -> HF name/shape/transform for every tensor")
    t.add_argument("path", nargs="?", help="GGUF file (or use --preset)")
    t.add_argument("--preset", choices=PRESET_NAMES, default="glm5")
    t.add_argument("--blocks", help="only these blocks, e.g. 0,3,78 (globals always shown)")
    fmt = t.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--markdown", action="store_true")
    t.set_defaults(func=cmd_table)

    lay = sub.add_parser("layer", help="run one attention layer from the GGUF and from an HF reference; compare")
    lay.add_argument("path")
    lay.add_argument("hf_dir", help="HF directory with the original weights")
    lay.add_argument("--layer", type=int, help="layer index (default: first MoE layer)")
    lay.add_argument("--seq-len", type=int, help="tokens (default 1.5 x index_topk)")
    lay.add_argument("--max-cos-diff", type=float, default=1e-2, help="exit 1 above this cosine difference")
    lay.add_argument("--json", action="store_true")
    lay.set_defaults(func=cmd_layer)
