"""Files a user names on the command line: inputs that must be regular files, and the one rule for outputs.

Inputs: a FIFO, a directory or a device given where a file belongs is refused before anything is read
(opening a FIFO for reading blocks until a writer appears; /dev/zero never ends).

Outputs (every command that writes follows `check_output`): an existing output, a dangling symlink included,
is refused unless `force`; the parent directory must already exist (nothing is created above the output);
an output may not be one of the inputs; the result is written under a temporary name beside it and renamed
when complete, with the permissions the user's umask gives (`output_mode`).

Signals: `handle_termination()` makes SIGTERM and SIGHUP raise `Terminated` (a KeyboardInterrupt) in the main
thread, so the clean-up that runs on Ctrl-C also runs for `kill`, `timeout` and a closed terminal. Once one has
arrived, `termination_signal()` names it, so that an error the interrupted write raises on its way out (e.g. a
file closed under it: EBADF) is reported as the termination it is (`glm5lib.cli.main`).
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from typing import Any, Iterable

from glm5lib.errors import UserError

MAX_JSON_BYTES = 64 << 20  # a config.json is a few kB; anything this large is not one


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(path: str | os.PathLike) -> os.stat_result:
    """stat of `path`, which must be an existing regular file (symlinks followed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: is {_kind(st.st_mode)}, not a regular file")
    return st


def open_input(path: str | os.PathLike) -> int:
    """A read-only descriptor of the regular file `path`. O_NONBLOCK: a FIFO swapped in after a stat cannot block
    the open; the file type is checked on the descriptor itself."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a regular file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot open ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserError(f"{path}: is {_kind(mode)}, not a regular file")
    return fd


def read_json_object(path: str | os.PathLike, what: str = "JSON file") -> dict[str, Any]:
    """The JSON object in `path`; anything else (not a file, too large, not JSON, not an object) is a UserError."""
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_JSON_BYTES:
            raise UserError(f"{path}: {size:,} bytes is too large for a {what}")
        data = os.read(fd, MAX_JSON_BYTES + 1)
    finally:
        os.close(fd)
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: {what} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: {what} is not valid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{path}: {what} is nested too deeply") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: {what} must hold a JSON object, not {type(obj).__name__}")
    return obj


def check_output(path: str | os.PathLike, *, force: bool = False, inputs: Iterable[str | os.PathLike] = (),
                 directory: bool = False) -> Path:
    """Refuse an output that cannot or must not be written; returns it as a Path. See the module docstring."""
    out = Path(path)
    for src in inputs:
        if _same_file(out, Path(src)):
            raise UserError(f"{out}: the output is one of the inputs")
    if os.path.lexists(out):
        if not force:
            what = "a dangling symlink" if not out.exists() else "already exists"
            raise UserError(f"{out}: {what} (use --force to replace it)")
        if out.is_dir() and not out.is_symlink() and not directory:
            raise UserError(f"{out}: is a directory")
        if directory and out.exists() and not out.is_dir():
            raise UserError(f"{out}: exists and is not a directory")
    parent = out.parent
    if not parent.exists():
        raise UserError(f"{out}: directory {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise UserError(f"{out}: {parent} is not a directory")
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def output_mode(directory: bool = False) -> int:
    """Permissions for a new output: what `open`/`mkdir` would give under the user's umask (temporary files and
    directories from `tempfile` are 0600/0700, unreadable by a server running as another user)."""
    return (0o777 if directory else 0o666) & ~umask()


def publish_tree(root: str | os.PathLike) -> None:
    """Give a directory tree written through `tempfile` the umask's permissions before it is renamed into place."""
    root = Path(root)
    os.chmod(root, output_mode(directory=True))
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), output_mode(directory=True))
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), output_mode())


def write_error(out: str | os.PathLike, exc: OSError) -> UserError:
    """The one-line error for an OSError while writing `out` (full disk, read-only file system, ...)."""
    return UserError(f"{out}: cannot write ({exc.strerror or exc})")


# ---- signals -----------------------------------------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C so `finally`/`except BaseException` clean-ups run."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_received: int | None = None  # the termination signal that arrived since `handle_termination`, if any


def _raise_terminated(signum: int, frame: Any) -> None:
    global _received
    _received = signum
    # Further SIGTERM/SIGHUP are ignored while the clean-up runs (Ctrl-C still works; SIGKILL always does).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def termination_signal() -> int | None:
    """The SIGTERM / SIGHUP that arrived since `handle_termination` was last called, or None."""
    return _received


def handle_termination() -> None:
    """Route SIGTERM and SIGHUP to `Terminated` in the main thread (no-op elsewhere, where signals cannot be set)."""
    global _received
    _received = None
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _raise_terminated)
    except ValueError:  # not the main thread
        pass
