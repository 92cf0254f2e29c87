"""`glm5lib tiny ...`: build or locate the embedded tiny GLM-5."""

from __future__ import annotations

import argparse
import json
import os
import shutil

from glm5lib.errors import UserError
from glm5lib.files import check_output, write_error
from glm5lib.model.spec import GGUF_FILE_TYPES, LLAMA_QUANTIZE_TYPES
from glm5lib.model.spec import TINY_DEFAULT_TYPES as DEFAULT_TYPES

FILE_TYPES = GGUF_FILE_TYPES + LLAMA_QUANTIZE_TYPES  # the K-quant mixes need llama-quantize


def _paths_dict(paths) -> dict:
    return {
        "root": str(paths.root),
        "hf_dir": str(paths.hf_dir),
        "gguf": {k: str(v) for k, v in paths.gguf.items()},
        "shards": {k: [str(p) for p in v] for k, v in paths.shards.items()},
    }


def _build(args: argparse.Namespace) -> int:
    types = tuple(args.types)
    bad = [t for t in types if t not in FILE_TYPES]
    if bad:
        raise UserError(f"unsupported GGUF type(s) {', '.join(bad)}; choose from {', '.join(FILE_TYPES)}")
    from safetensors import SafetensorError

    try:
        paths = _build_paths(args, types)
    except OSError as exc:  # full disk, read-only file system, ...
        raise write_error(args.out or "the tiny-model cache", exc) from None
    except SafetensorError as exc:  # safetensors' own type for the same I/O errors
        raise UserError(f"{args.out or 'the tiny-model cache'}: cannot write ({exc})") from None
    print(json.dumps(_paths_dict(paths), indent=1))
    return 0


def _build_paths(args: argparse.Namespace, types: tuple[str, ...]):
    from glm5lib.mapping.tiny import build_tiny, ensure_tiny

    if args.out:
        out = check_output(args.out, force=args.force, directory=True)
        if out.exists() and not (out / "manifest.json").exists():
            raise UserError(f"{out} exists and is not a tiny-model directory; refusing to replace it")
        if out.exists():  # build beside it first: a failed build leaves the old one in place
            new = out.with_name(out.name + f".new-{os.getpid()}")
            build_tiny(new, seed=args.seed, types=types)
            old = out.with_name(out.name + f".old-{os.getpid()}")
            os.replace(out, old)
            os.replace(new, out)
            shutil.rmtree(old)
            from glm5lib.mapping.tiny import load_tiny

            paths = load_tiny(out)
        else:
            paths = build_tiny(out, seed=args.seed, types=types)
    else:
        paths = ensure_tiny(seed=args.seed, types=types)
    return paths


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tiny", help="the embedded tiny GLM-5 (HF directory + glm-dsa GGUF files)")
    tsub = p.add_subparsers(dest="tiny_command", metavar="ACTION")
    tsub.required = True
    b = tsub.add_parser("build", help="build (or locate the cached) tiny model and print its paths as JSON")
    b.add_argument("--out", help="build into this new directory instead of the cache")
    b.add_argument("--types", nargs="+", default=list(DEFAULT_TYPES), help=f"GGUF types ({', '.join(FILE_TYPES)})")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--force", action="store_true", help="replace an existing tiny-model directory given with --out")
    b.set_defaults(func=_build)
