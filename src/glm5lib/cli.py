"""The `glm5lib` command. Each area registers its own sub-commands; this file only wires them up."""

from __future__ import annotations

import argparse
import importlib
import sys

from glm5lib.errors import UserError

# Modules that expose `register_cli(subparsers)`. Order is the order of `glm5lib --help`.
COMMAND_MODULES = (
    "glm5lib.model.cli",  # glm5lib tiny ...
    "glm5lib.gguf.cli",  # glm5lib gguf ...
    "glm5lib.mapping.cli",  # glm5lib map ...
    "glm5lib.dsa.cli",  # glm5lib dsa ...
    "glm5lib.kernels.cli",  # glm5lib bench ...
    "glm5lib.vllm_plugin.cli",  # glm5lib doctor / serve
    "glm5lib.workbook.cli",  # glm5lib workbook
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glm5lib", description="GLM-5 deployment workbench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # area not built yet
                continue
            raise
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
