"""`glm5lib gguf split|merge|inspect|validate|bench`."""

from __future__ import annotations

import argparse
import json
import sys

from glm5lib.errors import GGUFFormatError, UserError

MAX_PROBLEMS = 100  # validate lists at most this many problems, then a count


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    gguf = subparsers.add_parser("gguf", help="GGUF container tools: split, merge, inspect, validate, bench")
    sub = gguf.add_subparsers(dest="gguf_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("split", help="split a GGUF file into shards, byte-identical to llama-gguf-split")
    p.add_argument("input", metavar="IN")
    p.add_argument("prefix", metavar="PREFIX", help="outputs are PREFIX-00001-of-0000N.gguf, ...")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--split-max-tensors", type=int, metavar="N", help="max tensors per shard (default 128)")
    mode.add_argument("--split-max-size", metavar="N[M|G]", help="max tensor bytes per shard (M=1e6, G=1e9)")
    p.add_argument("--no-tensor-first-split", action="store_true", help="first shard holds metadata only")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--force", action="store_true", help="overwrite existing outputs")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_split)

    p = sub.add_parser("merge", help="merge a shard set into one file, byte-identical to llama-gguf-split --merge")
    p.add_argument("first_shard", metavar="FIRST_SHARD", help="the PREFIX-00001-of-0000N.gguf shard")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--dry-run", action="store_true", help="check the set, write nothing")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_merge)

    p = sub.add_parser("inspect", help="metadata, tensors per block and type, shard layout")
    p.add_argument("path", metavar="PATH", help="a GGUF file or any shard of a set")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all-metadata", action="store_true", help="print every metadata key (long arrays shortened)")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("validate", help="check a file or a whole shard set; exit 0 clean, 1 problems, 2 unreadable")
    p.add_argument("path", metavar="PATH", help="a GGUF file or any shard of a set")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_validate)

    p = sub.add_parser("bench", help="split + merge throughput and peak RSS on a synthetic multi-GB file")
    p.add_argument("--size", default="2G", help="synthetic file size, N[M|G] (default 2G)")
    p.add_argument("--dir", required=True, help="scratch directory (needs ~4x --size free)")
    p.add_argument("--tensor-size", default="512M", help="size of the largest tensors (default 512M)")
    p.add_argument("--llama", default=None, help="also time this llama-gguf-split binary")
    p.add_argument("--rounds", type=int, default=3, help="cp/split/merge rounds; medians are reported (default 3)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the scratch files")
    p.set_defaults(func=_bench)


def _as_exit_1(fn):
    """split/merge refusals exit 1 like llama-gguf-split's EXIT_FAILURE, unreadable input included."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except UserError as exc:
            raise UserError(str(exc), exit_code=1) from None

    return wrapped


@_as_exit_1
def _split(args: argparse.Namespace) -> int:
    from glm5lib.gguf.split import parse_size, split

    max_size = parse_size(args.split_max_size) if args.split_max_size is not None else None
    plans = split(args.input, args.prefix, max_tensors=args.split_max_tensors, max_size=max_size,
                  no_tensor_first_split=args.no_tensor_first_split, force=args.force, dry_run=args.dry_run,
                  progress=not args.quiet)
    print(f"n_split: {len(plans)}")
    for p in plans:
        print(f"{'plan' if args.dry_run else 'wrote'} {p.path}  tensors {len(p.tensors)}  bytes {p.size:,}")
    return 0


@_as_exit_1
def _merge(args: argparse.Namespace) -> int:
    from glm5lib.gguf.split import merge

    plan = merge(args.first_shard, args.output, force=args.force, dry_run=args.dry_run, progress=not args.quiet)
    print(f"{'plan' if args.dry_run else 'wrote'} {plan.path}  tensors {len(plan.tensors)}  bytes {plan.size:,}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from glm5lib.gguf.inspect import format_summary, summarize
    from glm5lib.gguf.shards import open_gguf

    s = summarize(open_gguf(args.path))
    print(json.dumps(s, indent=1) if args.json else format_summary(s, all_metadata=args.all_metadata))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from glm5lib.gguf.shards import scan

    try:
        shards, headers, problems = scan(args.path)
    except GGUFFormatError as exc:
        if args.json:
            print(json.dumps({"status": "unreadable", "problems": [str(exc)]}))
            return 2
        raise
    n_tensors = sum(len(h.tensors) for h in headers if h is not None)
    shown = problems[:MAX_PROBLEMS]  # a crafted set can have ~100k (one per missing shard)
    if args.json:
        print(json.dumps({"status": "problems" if problems else "ok", "shards": [str(p) for p in shards[:MAX_PROBLEMS]],
                          "n_shards": len(shards), "tensors": n_tensors, "problems": [str(p) for p in shown],
                          "n_problems": len(problems)}, indent=1))
    elif problems:
        for p in shown:
            print(p)
        if len(problems) > len(shown):
            print(f"... and {len(problems) - len(shown):,} more")
        print(f"{len(problems)} problem(s) in {len(shards)} file(s)", file=sys.stderr)
    else:
        print(f"ok: {len(shards)} file(s), {n_tensors:,} tensors")
    return 1 if problems else 0


def _bench(args: argparse.Namespace) -> int:
    from glm5lib.gguf.bench import format_bench, run_bench
    from glm5lib.gguf.split import parse_size

    result = run_bench(args.dir, size=parse_size(args.size), tensor_size=parse_size(args.tensor_size),
                       llama=args.llama, keep=args.keep, rounds=args.rounds)
    print(json.dumps(result, indent=1) if args.json else format_bench(result))
    return 0
