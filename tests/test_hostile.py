"""Hostile inputs over every verb: special files, headers claiming huge work, bad encodings, unsafe tensor layouts,
metadata that parses but is wrong, bad config files, unwritable outputs, SIGTERM/SIGHUP mid-write.

Each run is bounded in time (an alarm) and address space (RLIMIT_AS), in-process through `glm5lib.cli.main`;
subprocesses only where a real signal is needed. The rule checked for a refusal: a non-zero exit, no traceback,
exactly one `error:` line on stderr that names the offending file; report verbs (`gguf validate`, `map check`)
may instead exit 1 with their findings on stdout. Writers leave no temporary file behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_corpus import (
    Base,
    CaseTimeout,
    config_cases,
    input_cases,
    run_cli,
    small_gguf,
)

REPO = Path(__file__).resolve().parents[1]
CASES = input_cases()
CONFIGS = config_cases()

# verb -> argv for an input PATH, scratch dir D and the tiny model's HF dir
VERBS = {
    "inspect": lambda p, d, hf: ["gguf", "inspect", p],
    "validate": lambda p, d, hf: ["gguf", "validate", p],
    "split": lambda p, d, hf: ["gguf", "split", "-q", p, str(d / "out" / "s")],
    "merge": lambda p, d, hf: ["gguf", "merge", "-q", p, str(d / "out" / "merged.gguf")],
    "map-check": lambda p, d, hf: ["map", "check", p],
    "map-export": lambda p, d, hf: ["map", "export", "-q", p, str(d / "out" / "hf")],
    "map-table": lambda p, d, hf: ["map", "table", p],
    "map-layer": lambda p, d, hf: ["map", "layer", p, hf],
    "doctor": lambda p, d, hf: ["doctor", p, "--cc", "cpu"],
    "serve": lambda p, d, hf: ["serve", "--dry-run", p],
    "plan": lambda p, d, hf: ["plan", p, "--gpus", "8", "--gpu-mem", "96GB", "--json"],
}
REPORT_VERBS = {"validate", "map-check"}  # may list findings on stdout and exit 1 instead of one error line
DATA_VERBS = ["split", "merge", "map-check", "map-export", "map-layer", "serve"]  # read tensor data or vouch for it
CONFIG_VERBS = ["map-check", "map-export", "map-table", "map-layer", "doctor", "serve", "plan"]  # need a usable glm-dsa config

# Which verbs must refuse each class (the others may legitimately succeed: `inspect` shows a file with an
# unsafe layout, `gguf split` does not care that a model has no tokenizer).
MUST_REFUSE = {
    "special": list(VERBS),
    "huge": list(VERBS),
    "encoding": list(VERBS),
    "layout": DATA_VERBS + ["validate"],
    "metadata": ["map-check", "map-export", "serve"],
}
CONFIG_BROKEN = {"block_count_0", "string_for_number", "no_head_count", "other_arch"}  # no config can be formed


def _pairs():
    for name, (cls, _) in CASES.items():
        verbs = list(MUST_REFUSE[cls])
        if name in CONFIG_BROKEN:
            verbs = sorted(set(verbs) | set(CONFIG_VERBS), key=list(VERBS).index)
        for verb in verbs:
            yield pytest.param(name, verb, id=f"{cls}-{name}-{verb}")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from glm5lib.mapping.tiny import ensure_tiny

    tiny = ensure_tiny(progress=False)
    return Base(gguf=tiny.gguf["Q4_0"], shards=tiny.shards["Q4_0"], hf_dir=tiny.hf_dir)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    # serve --dry-run prepares a model directory in the cache: keep the checkout's .cache out of it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def assert_refused(verb: str, rc: int, out: str, err: str, names: tuple[str, ...]) -> None:
    assert "Traceback" not in err, err
    assert rc != 0, (rc, out[-2000:], err)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if verb in REPORT_VERBS and rc == 1 and not any(line.startswith("error:") for line in lines):
        assert out.strip(), "a report verb exiting 1 lists its findings"
        return
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert any(n in lines[0] for n in names), (names, lines[0])


def assert_nothing_left(d: Path, before: set[str]) -> None:
    left = {p.name for p in d.iterdir()} - before
    assert not left, f"left behind in {d}: {sorted(left)}"


@pytest.mark.parametrize("case, verb", list(_pairs()))
def test_hostile_input(case, verb, base, tmp_path):
    cls, make = CASES[case]
    d = tmp_path / "in"
    d.mkdir()
    inp = make(base, d)
    (tmp_path / "out").mkdir()
    argv = VERBS[verb](str(inp.path), tmp_path, str(base.hf_dir))
    rc, out, err, seconds = run_cli(argv)
    assert_refused(verb, rc, out, err, inp.names)
    assert seconds < 10, f"{seconds:.1f} s"
    assert_nothing_left(tmp_path / "out", set())


@pytest.mark.parametrize("case", [c for c, (cls, _) in CASES.items() if cls == "layout"])
def test_inspect_lists_layout_problems(case, base, tmp_path):
    _, make = CASES[case]
    inp = make(base, tmp_path)
    rc, out, err, _ = run_cli(["gguf", "inspect", str(inp.path)])
    assert "Traceback" not in err
    if rc == 0:  # readable header: shown, with the problem listed
        assert "problems" in out and ("aligned" in out or "overlaps" in out), out[-1500:]
    else:
        assert_refused("inspect", rc, out, err, inp.names)


def test_map_check_and_export_agree(base, tmp_path):
    """For every input, `map export` writes a model exactly when `map check` finds no problem."""
    for name, (cls, make) in CASES.items():
        if cls not in ("layout", "metadata"):
            continue
        d = tmp_path / name
        d.mkdir()
        inp = make(base, d)
        rc_check, *_ = run_cli(["map", "check", str(inp.path)])
        rc_export, _, err, _ = run_cli(["map", "export", "-q", str(inp.path), str(d / "hf")])
        assert (rc_check == 0) == (rc_export == 0) == (d / "hf").exists(), (name, rc_check, rc_export, err)


# ---- config files --------------------------------------------------------------------------------------------------


def _config_argv(verb: str, cfg: Path, base: Base) -> list[str]:
    return {"doctor": ["doctor", str(cfg), "--cc", "cpu"],
            "map-check": ["map", "check", str(base.gguf), "--config", str(cfg)],
            "bench-plot": ["bench", "plot", str(cfg)],
            "bench-batches": ["bench", "batches", str(cfg)],
            "serve": ["serve", "--dry-run", str(cfg.parent)],
            "plan": ["plan", str(cfg), "--gpus", "8", "--gpu-mem", "96GB"]}[verb]


@pytest.mark.parametrize("verb", ["doctor", "map-check", "bench-plot", "bench-batches", "serve", "plan"])
@pytest.mark.parametrize("case", list(CONFIGS))
def test_bad_config(case, verb, base, tmp_path):
    cfg = CONFIGS[case](tmp_path)
    rc, out, err, seconds = run_cli(_config_argv(verb, cfg, base))
    if verb == "map-check" and rc == 1 and "Traceback" not in err:  # a config it can compare reports differences
        assert "config" in out
        return
    assert_refused("doctor", rc, out, err, ("config.json",))
    assert seconds < 10


# ---- outputs -------------------------------------------------------------------------------------------------------

WRITERS = {
    "split": lambda src, out: ["gguf", "split", "-q", "--split-max-tensors", "100000", str(src.gguf), str(out)],
    "merge": lambda src, out: ["gguf", "merge", "-q", str(src.shards[0]), str(out)],
    "map-export": lambda src, out: ["map", "export", "-q", str(src.gguf), str(out)],
    "tiny-build": lambda src, out: ["tiny", "build", "--types", "Q4_0", "--out", str(out)],
    "bench-plot": lambda src, out: ["bench", "plot", str(src.hf_dir / "bench.json"), "--png", str(out)],
    "bench-batches": lambda src, out: ["bench", "batches", str(src.hf_dir / "batches.json"), "--png", str(out)],
}


def _out_name(verb: str) -> str:
    return {"split": "s-00001-of-00001.gguf", "merge": "m.gguf", "map-export": "hf", "tiny-build": "tiny",
            "bench-plot": "b.png", "bench-batches": "bb.png"}[verb]


def _prefix(verb: str, out: Path) -> Path:
    return out.with_name("s") if verb == "split" else out  # split takes a prefix


@pytest.fixture()
def src(base, tmp_path):
    hf = tmp_path / "hfsrc"
    hf.mkdir()
    (hf / "bench.json").write_text(json.dumps({"rows": [], "meta": {"name": "x"}, "targets": []}))
    (hf / "batches.json").write_text(json.dumps({"meta": {"commit": "x", "device": "x"}, "rows": [
        {"kind": "batch", "B": 32, "H": 8, "rule_key_warps": 4, "rule_splits": 8, "k2_us": 31.0, "k4_us": 30.0,
         "dispatch_us": 30.0}]}))
    return Base(base.gguf, base.shards, hf)


def _mount_tmpfs(where: Path, opts: str) -> bool:
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


@pytest.mark.parametrize("verb", list(WRITERS))
@pytest.mark.parametrize("case", ["exists", "parent_is_file", "parent_missing", "dangling_symlink", "read_only",
                                  "full_disk"])
def test_unwritable_output(case, verb, src, tmp_path):
    d = tmp_path / "o"
    d.mkdir()
    out = d / _out_name(verb)
    mounted = None
    if case == "exists":
        (out.mkdir() if verb in ("map-export", "tiny-build") else out.write_bytes(b"keep"))
    elif case == "parent_is_file":
        (d / "f").write_text("a file")
        out = d / "f" / out.name
    elif case == "parent_missing":
        out = d / "no" / "such" / out.name
    elif case == "dangling_symlink":
        out.symlink_to(d / "nowhere")
    elif case in ("read_only", "full_disk"):
        mounted = d / "mnt"
        opts = "ro,size=1m" if case == "read_only" else "size=1m"
        if not _mount_tmpfs(mounted, opts):
            pytest.skip("mount -t tmpfs needs root (CI runs as root)")
        out = mounted / out.name
    before = {p.name for p in out.parent.iterdir()} if out.parent.is_dir() else set()
    try:
        rc, o, err, seconds = run_cli(WRITERS[verb](src, _prefix(verb, out)))
        if verb in ("bench-plot", "bench-batches") and case == "full_disk" and rc == 0:  # a PNG fits in 1 MB: whole
            assert out.is_file() and out.read_bytes().startswith(b"\x89PNG"), (o, err)
            return
        assert_refused(verb, rc, o, err, (out.name, out.parent.name, "s-00001-of-00001.gguf", "s"))
        if out.parent.is_dir():
            assert_nothing_left(out.parent, before)
        if case == "exists":
            assert (out.is_dir() and not any(out.iterdir())) or out.read_bytes() == b"keep"
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)


@pytest.mark.parametrize("verb", ["split", "merge", "map-export"])
def test_output_equal_to_input_is_refused_even_with_force(verb, src, tmp_path):
    if verb == "split":  # the one output of a 1-shard split has the input's name
        inp = Path(shutil.copy(src.gguf, tmp_path / "s-00001-of-00001.gguf"))
        argv = ["gguf", "split", "-q", "--force", "--split-max-tensors", "100000", str(inp), str(tmp_path / "s")]
    elif verb == "merge":
        inp = src.shards[0]
        argv = ["gguf", "merge", "-q", "--force", str(inp), str(inp)]
    else:
        inp = Path(shutil.copy(src.gguf, tmp_path / "model.gguf"))
        argv = ["map", "export", "-q", "--force", str(inp), str(inp)]
    digest = inp.stat().st_size, inp.stat().st_mtime_ns
    rc, out, err, _ = run_cli(argv)
    assert_refused(verb, rc, out, err, (inp.name,))
    assert (inp.stat().st_size, inp.stat().st_mtime_ns) == digest


def test_outputs_get_the_umask_and_force_replaces(src, tmp_path):
    old = os.umask(0o022)
    try:
        d = tmp_path / "x"
        d.mkdir()
        out = d / "hf"
        out.mkdir()
        (out / "stale.txt").write_text("old")
        assert run_cli(["map", "export", "-q", str(src.gguf), str(out)])[0] != 0  # exists, no --force
        rc, _, err, _ = run_cli(["map", "export", "-q", "--force", str(src.gguf), str(out)])
        assert rc == 0, err
        assert not (out / "stale.txt").exists() and (out / "config.json").exists()
        assert out.stat().st_mode & 0o777 == 0o755
        assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o644}
        assert [p.name for p in d.iterdir()] == ["hf"]  # no temporary or backup directory left
        m = d / "m.gguf"
        assert run_cli(["gguf", "merge", "-q", str(src.shards[0]), str(m)])[0] == 0
        assert m.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


# ---- signals: SIGTERM and SIGHUP clean up like Ctrl-C ----------------------------------------------------------------


def _big_shard_set(d: Path) -> Path:
    """A 2-shard set of 4 x 150 MB tensors (sparse files): a merge takes long enough to be killed mid-write."""
    from gguf.constants import GGUFValueType

    from glm5lib.gguf.format import KV, OutTensor, encode_header, layout, pad
    from glm5lib.gguf.shards import shard_path

    d.mkdir(parents=True)
    n = 1 << 30  # 4 GiB of holes to merge: the signal lands long before the copy could finish (it never gets far)
    names = [f"t{i}" for i in range(4)]
    for i, group in enumerate((names[:2], names[2:])):
        kvs = [KV("general.architecture", GGUFValueType.STRING, "glm-dsa")] if i == 0 else []
        kvs += [KV("split.no", GGUFValueType.UINT16, i), KV("split.count", GGUFValueType.UINT16, 2),
                KV("split.tensors.count", GGUFValueType.INT32, 4)]
        ts = [OutTensor(t, (n // 4,), 0, n, Path(), 0) for t in group]
        header = encode_header(kvs, ts)
        with open(shard_path(d / "set", i, 2), "wb") as f:
            f.write(header)
            f.truncate(len(header) + layout(ts)[-1] + pad(n))  # a hole: no disk blocks, reads as zeros
    return shard_path(d / "set", 0, 2)


# The CLI with every copy chunk delayed by 20 ms: the merge of 4 GiB then takes seconds whatever the machine's load
# (under CI load a full-speed merge once finished between "the temporary file has data" and the signal).
_SLOW_CLI = """
import os, sys, time
for name in ("copy_file_range", "pread"):
    if hasattr(os, name):
        def slow(*a, _f=getattr(os, name)):
            time.sleep(0.02)
            return _f(*a)
        setattr(os, name, slow)
from glm5lib.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _kill_mid_write(argv: list[str], out_dir: Path, sig: int, started, slow: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-c", _SLOW_CLI, *argv] if slow else [sys.executable, "-m", "glm5lib.cli", *argv]
    # SIGTERM/SIGHUP at their defaults in the child, as in a terminal: a test run started under `nohup` would
    # otherwise pass on an ignored SIGHUP, which the CLI rightly keeps ignoring
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)])
    deadline = time.monotonic() + 120
    while not started() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert p.poll() is None, ("finished before the signal: make the input larger", p.communicate())
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _temp_entries(d: Path) -> list[Path]:
    return [p for p in d.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_during_merge_leaves_nothing(sig, tmp_path):
    first = _big_shard_set(tmp_path / "src")
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def started():  # the temporary output exists and has data in it
        return any(p.stat().st_size > 0 for p in _temp_entries(out_dir))

    r = _kill_mid_write(["gguf", "merge", str(first), str(out_dir / "merged.gguf")], out_dir, sig, started, slow=True)
    assert r.returncode == 128 + sig, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"error: terminated by {signal.Signals(sig).name}"
    assert list(out_dir.iterdir()) == []


def test_sigterm_during_export_leaves_nothing(base, tmp_path):
    from glm5lib.mapping.tiny import ensure_tiny

    gguf = ensure_tiny(progress=False).gguf["F32"]  # the largest tiny file: ~40 MB of tensors to write
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def started():  # the temporary directory holds a tokenizer: tensors are being written now
        return any((p / "tokenizer.json").exists() for p in _temp_entries(out_dir) if p.is_dir())

    r = _kill_mid_write(["map", "export", "-q", str(gguf), str(out_dir / "hf")], out_dir, signal.SIGTERM, started)
    assert r.returncode == 128 + signal.SIGTERM, (r.stderr, sorted(p.name for p in out_dir.iterdir()))
    assert "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1] == "error: terminated by SIGTERM"
    assert list(out_dir.iterdir()) == []


def test_error_raised_while_a_termination_unwinds_reports_the_termination(monkeypatch, capsys):
    """A write interrupted by SIGTERM may fail on its way out (a CI run of the export above once ended with "cannot
    write (Bad file descriptor)", exit 2): once the signal has arrived, the exit is the termination's, whatever error
    the unwinding raised. Without a signal the same error is reported as itself."""
    import argparse

    import glm5lib.cli as cli
    from glm5lib import files
    from glm5lib.errors import UserError

    def interrupted(args):
        try:
            files._raise_terminated(signal.SIGTERM, None)  # what the handler does when the signal arrives
        except files.Terminated:
            raise UserError("out/hf: cannot write (Bad file descriptor)") from None

    def failing(args):
        raise UserError("out/hf: cannot write (Bad file descriptor)")

    def interrupted_raw(args):  # an error no command turned into a UserError (e.g. from a `finally`)
        try:
            files._raise_terminated(signal.SIGHUP, None)
        except files.Terminated:
            raise OSError(9, "Bad file descriptor") from None

    for func, rc, line in ((interrupted, 128 + signal.SIGTERM, "error: terminated by SIGTERM"),
                           (interrupted_raw, 128 + signal.SIGHUP, "error: terminated by SIGHUP"),
                           (failing, 2, "error: out/hf: cannot write (Bad file descriptor)")):
        parser = argparse.ArgumentParser()
        parser.set_defaults(func=func)
        monkeypatch.setattr(cli, "build_parser", lambda argv, p=parser: p)
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
        assert cli.main([]) == rc
        assert capsys.readouterr().err.strip() == line
        assert {sig: signal.getsignal(sig) for sig in before} == before  # the handlers are given back


def test_case_timeout_is_not_swallowed():
    """The corpus's hang detector itself: an alarm inside the CLI surfaces as CaseTimeout."""
    import glm5lib.cli as cli

    real = cli.main
    with pytest.raises(CaseTimeout):
        cli.main = lambda argv: time.sleep(5)
        try:
            run_cli(["gguf", "inspect", "x"], seconds=0.2)
        finally:
            cli.main = real


# ---- property: any mutation of a real header gets a clean answer -----------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXTREMES = [0, 1, 2, 3, 31, 32, 33, 64, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62,
            2**63 - 1, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def headers(base, tmp_path_factory):
    """Two real headers to mutate: a complete small GGUF, and the tiny GLM-5's first shard cut after its header
    (1,024 tokens, merges, every glm-dsa key, tensor infos)."""
    d = tmp_path_factory.mktemp("headers")
    from glm5lib.gguf.format import read_header

    small = small_gguf(d / "small.gguf").read_bytes()
    h = read_header(base.shards[0])
    tiny = base.shards[0].read_bytes()[: h.data_offset + 4096]
    return {"small": small, "tiny": tiny}


@st.composite
def mutations(draw, size: int):
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, size - 1))
        kind = draw(st.sampled_from(["byte", "u64", "u32", "truncate"]))
        if kind == "byte":
            edits.append((pos, bytes([draw(st.integers(0, 255))])))
        elif kind == "truncate":
            edits.append((pos, None))
        else:
            n = 8 if kind == "u64" else 4
            edits.append((pos, (draw(st.sampled_from(EXTREMES)) % (1 << (8 * n))).to_bytes(n, "little")))
    return edits


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.sampled_from(["small", "tiny"]), data=st.data())
def test_mutated_header_gets_a_clean_answer(which, data, headers, tmp_path):
    raw = bytearray(headers[which])
    for pos, new in data.draw(mutations(len(raw))):
        if new is None:
            del raw[pos:]
        else:
            raw[pos:pos + len(new)] = new
    p = tmp_path / "m.gguf"
    p.write_bytes(bytes(raw))
    for argv in (["gguf", "inspect", str(p)], ["gguf", "validate", str(p)], ["map", "check", str(p)]):
        rc, out, err, seconds = run_cli(argv)
        assert "Traceback" not in err, err
        assert rc in (0, 1, 2) and seconds < 10, (argv, rc, err)
        lines = err.strip().splitlines()
        if rc == 2:
            assert len(lines) == 1 and lines[0].startswith(f"error: {p}"), err


def test_config_check_accepts_real_configs_and_names_each_bad_field():
    from glm5lib.model.spec import PRESET_NAMES, GLM5Config, config_problems

    for name in PRESET_NAMES:
        assert config_problems(GLM5Config.preset(name).to_hf_dict()) == [], name
    hub = {**GLM5Config.glm5().to_hf_dict(), "eos_token_id": [154820, 154827, 154829]}  # as the hub's file has it
    assert config_problems(hub) == []
    bad = config_problems({"hidden_size": True, "rope_theta": "1e6", "num_hidden_layers": 0, "eos_token_id": "x"})
    assert [b.split()[0] for b in bad] == ["hidden_size", "num_hidden_layers", "rope_theta", "eos_token_id"]


# ---- workbook ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, names", [
    (["--only", "99"], ("99",)),
    (["-p", "1bad", "3"], ("1bad",)),
    (["-p", "X", "[unclosed"], ("X",)),
    (["--out", "/dev/null"], ("/dev/null",)),
    (["--out", "FILE"], ("FILE",)),
], ids=["unknown-notebook", "bad-parameter-name", "bad-parameter-value", "out-device", "out-file"])
def test_workbook_refuses_bad_arguments_before_running_anything(argv, names, tmp_path):
    f = tmp_path / "FILE"
    f.write_text("mine")
    argv = [str(f) if a == "FILE" else a for a in argv]
    rc, out, err, seconds = run_cli(["workbook", *argv])
    assert_refused("workbook", rc, out, err, names)
    assert seconds < 10 and f.read_text() == "mine"  # nothing ran, nothing of the user's touched
