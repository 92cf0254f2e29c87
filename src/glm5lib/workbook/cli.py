"""`glm5lib workbook`: execute the notebooks in order with papermill."""

from __future__ import annotations

import argparse
from pathlib import Path

from glm5lib.workbook.run import PROFILES, run_workbook


def _run(args: argparse.Namespace) -> int:
    results = run_workbook(args.profile, only=args.only or None, out_dir=Path(args.out) if args.out else None)
    failed = [r for r in results if r.error]
    print(f"[workbook] {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workbook", help="execute every notebook in order with papermill into outputs/")
    p.add_argument("--profile", choices=PROFILES, default="ci", help="parameter set from params/<profile>.yaml")
    p.add_argument("--only", nargs="*", help="notebook name prefixes to run (e.g. 01 03)")
    p.add_argument("--out", help="output directory (default: outputs/)")
    p.set_defaults(func=_run)
