"""Ahead-of-time compiles for the tests, in a child process with Triton's interpreter off (under the interpreter
Triton's own helpers such as `gl.max` are interpreted functions the compiler refuses): `compile_rows(script)` runs a
script that prints one JSON object a line and returns those objects (the child's stderr goes in the failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def compile_rows(script: str, timeout: int = 900) -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if not rows:
        pytest.fail(f"no compile results: {p.stderr[-2000:]}")
    return rows
