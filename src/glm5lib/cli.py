"""The `glm5lib` command. Each area registers its own sub-commands; this file only wires them up."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from glm5lib.errors import UserError
from glm5lib.files import Terminated, handle_termination, termination_signal

# Sub-command -> module exposing `register_cli(subparsers)`. Order is the order of `glm5lib --help`.
# Only the module of the command being run is imported, so `glm5lib gguf ...` does not pay for torch/vLLM.
COMMANDS = {
    "tiny": "glm5lib.mapping.tiny_cli",
    "gguf": "glm5lib.gguf.cli",
    "map": "glm5lib.mapping.cli",
    "dsa": "glm5lib.dsa.cli",
    "bench": "glm5lib.bench.cli",
    "doctor": "glm5lib.serving.cli",
    "plan": "glm5lib.serving.cli",
    "serve": "glm5lib.serving.cli",
    "workbook": "glm5lib.workbook.cli",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glm5lib", description="GLM-5 deployment workbench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    first = next((a for a in (argv or []) if not a.startswith("-")), None)
    modules = [COMMANDS[first]] if first in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # area not built yet
                continue
            raise
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    handle_termination()  # kill/timeout/hang-up clean up like Ctrl-C: no temporary output is left behind
    try:
        rc = args.func(args)
    except Terminated as exc:
        return _terminated(exc.signum)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # raised while a SIGTERM / SIGHUP unwound (e.g. an interrupted write's own EBADF): the termination it is
        if termination_signal() is not None:
            return _terminated(termination_signal())
        if isinstance(exc, UserError):
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, BrokenPipeError):  # `glm5lib ... | head`: the reader left; not an error of ours
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        raise
    finally:
        _restore(saved)
    return int(rc or 0)


def _terminated(signum: int) -> int:
    print(f"error: terminated by {signal.Signals(signum).name}", file=sys.stderr)
    return 128 + signum


def _restore(saved: dict) -> None:
    try:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    except ValueError:  # not the main thread: nothing was installed
        pass


if __name__ == "__main__":
    sys.exit(main())
