"""`glm5lib bench sparse-mla|indexer|all|gather|plot|batches|compile|check`: kernel benchmarks (GPU) and checks (CPU
or GPU)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from glm5lib.errors import UserError


def _bench(args) -> int:
    from glm5lib.bench import kernels as bench

    res = bench.run(args.what, out_dir=args.out, vendor=args.vendor, quick=args.quick, sweep=args.sweep,
                    scaling=not args.no_scaling, name=args.name, sweep_indexer=args.sweep_indexer, force=args.force,
                    commit=args.commit)
    name = res["meta"]["name"]
    png = bench.plot(Path(args.out) / f"{name}.json", Path(args.out) / f"{name}.png",
                     Path(args.out) / bench.SCALING_ARCHIVE)
    if any(r.get("kind") == "smem-small" for r in res["rows"]):
        print("sm_89/sm_120 ('small' shared memory) configs forced on the H200 cases, beside the shipped ones:")
        print(bench.smem_table(res))
    print(f"commit {res['meta']['commit']}, {res['meta']['elapsed_s'].get('total', 0):.0f} s")
    for t in res["targets"]:
        v = t["value"]
        c = t.get("ceiling")
        ceiling = "" if c is None else f"; gathers alone reach {c:.2f}" + (", below the goal" if t.get("bounded") else "")
        print(f"{'MET ' if t['met'] else 'MISS' if t['met'] is False else 'n/a '} {t['target']}: "
              f"{'-' if v is None else f'{v:.2f}'} (goal {t['goal']}{ceiling})")
    print(f"wrote {Path(args.out) / (name + '.json')} and {png}")
    return 0


def _plot(args) -> int:
    from glm5lib.bench import kernels as bench

    from glm5lib.files import check_output, read_json_object

    src = Path(args.json)
    if not os.path.lexists(src):
        raise UserError(f"no benchmark JSON at {src}")
    res = read_json_object(src, "benchmark JSON")
    if not isinstance(res.get("rows"), list):
        raise UserError(f"{src}: no \"rows\" list: not a `glm5lib bench` result")
    out = check_output(src.with_suffix(".png") if args.png is None else Path(args.png), force=args.force,
                       inputs=[src])
    try:
        png = bench.plot(src, out)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{src}: not a `glm5lib bench` result ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise UserError(f"{out}: cannot write ({exc.strerror or exc})") from None
    print(f"wrote {png}")
    return 0


def _batches(args) -> int:
    """A `scripts/fp8mma_device.py --batches` run read back on any machine: the table of every launch's time with the
    run's and today's key-warps verdicts (`bench.batches.rule_table`), the launches that failed their check, and the
    figure (`bench.batches.plot`). Exit 1 where a launch failed its check."""
    from glm5lib.bench import batches
    from glm5lib.files import check_output, read_json_object

    src = Path(args.json)
    if not os.path.lexists(src):
        raise UserError(f"no batch run at {src}")
    read_json_object(src, "batch run")  # one-line errors for a file that is not JSON or not an object
    try:
        run = batches.load_run(src)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{src}: not a `scripts/fp8mma_device.py --batches` run ({type(exc).__name__}: {exc})") \
            from None
    out = check_output(src.with_suffix(".png") if args.png is None else Path(args.png), force=args.force,
                       inputs=[src])
    try:
        print(batches.rule_table(run))
        png = batches.plot(run, out)
    except (KeyError, TypeError) as exc:
        raise UserError(f"{src}: a batch row lacks a field ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise UserError(f"{out}: cannot write ({exc.strerror or exc})") from None
    bad = batches.failed_checks(run)
    print(f"failed checks: {', '.join(bad)}" if bad else "every launch matched fp32")
    print(f"wrote {png}")
    return 1 if bad else 0


def _gather(args) -> int:
    from glm5lib.bench import gather
    from glm5lib.bench.kernels import default_name

    json_path = args.json
    if json_path is None:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "gpu"
        json_path = str(Path(args.out) / (default_name(gpu).replace("bench_", "gather_", 1) + ".json"))
    argv = ["--json", json_path, "--batch", *map(str, args.batch)] + (["--force"] if args.force else [])
    return gather.main(argv + (["--commit", args.commit] if args.commit else []))


def _compile(args) -> int:
    from glm5lib.kernels.compile_report import compile_report, format_report

    rows = compile_report(args.arch)
    print(format_report(rows))
    return 0 if all(r.ok and r.fits for r in rows) else 1


def _check(args) -> int:
    from glm5lib.kernels import checks

    argv = ["--profile", args.profile] + (["--sanitize"] if args.sanitize else [])
    return checks.main(argv)


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("bench", help="sparse-MLA / indexer kernel benchmarks and checks")
    sub = p.add_subparsers(dest="bench_cmd", metavar="WHAT")
    sub.required = True
    for what in ("sparse-mla", "indexer", "all"):
        b = sub.add_parser(what, help=f"benchmark {what} on the GPU (JSON + PNG under --out)")
        b.add_argument("--out", default="outputs/bench")
        b.add_argument("--name", help="file stem of the JSON/PNG (default: bench_<gpu>, e.g. bench_h200)")
        b.add_argument("--force", action="store_true", help="overwrite an existing JSON/PNG of that name")
        b.add_argument("--vendor", default=".vendor", help="folder holding FlashMLA's _flashmla_C.abi3.so")
        b.add_argument("--quick", action="store_true", help="fewer batch sizes")
        b.add_argument("--sweep", action="store_true", help="also time alternative kernel configurations")
        b.add_argument("--sweep-indexer", action="store_true", help="also time alternative paged-indexer tiles")
        b.add_argument("--no-scaling", action="store_true", help="skip the top-k / context scaling series")
        b.add_argument("--commit", help="commit the code came from, recorded in the JSON (default: $GLM5LIB_COMMIT, "
                       "else git rev-parse HEAD)")
        b.set_defaults(func=_bench, what=what)
    g = sub.add_parser("gather", help="how fast the decode's rows can be gathered at all (GPU; JSON + PNG)")
    g.add_argument("--out", default="outputs/bench")
    g.add_argument("--json", help="output JSON (default: OUT/gather_<gpu>.json, e.g. gather_h200.json)")
    g.add_argument("--force", action="store_true", help="overwrite an existing JSON/PNG")
    g.add_argument("--batch", type=int, nargs="+", default=[128, 32])
    g.add_argument("--commit", help="commit the code came from, recorded in the JSON")
    g.set_defaults(func=_gather)
    pl = sub.add_parser("plot", help="plot a benchmark JSON")
    pl.add_argument("json")
    pl.add_argument("--png")
    pl.add_argument("--force", action="store_true", help="overwrite an existing PNG")
    pl.set_defaults(func=_plot)
    bt = sub.add_parser("batches", help="read back a decode batch sweep (scripts/fp8mma_device.py --batches): the "
                        "key-warps rule's verdicts, table and PNG")
    bt.add_argument("json")
    bt.add_argument("--png", help="figure path (default: the JSON's path with .png)")
    bt.add_argument("--force", action="store_true", help="overwrite an existing PNG")
    bt.set_defaults(func=_batches)
    c = sub.add_parser("compile", help="AOT-compile every shipped config for sm_80/89/90/120 and check shared memory")
    c.add_argument("--arch", type=int, nargs="*", default=[80, 89, 90, 120])
    c.set_defaults(func=_compile)
    k = sub.add_parser("check", help="run the numeric case matrix (GPU if present, else the Triton interpreter)")
    k.add_argument("--profile", default="ci", choices=["ci", "full"])
    k.add_argument("--sanitize", action="store_true")
    k.set_defaults(func=_check)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="glm5lib")
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
