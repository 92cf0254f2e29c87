"""Progress bars only on a terminal: a merge whose stderr is a pipe (CI logs) writes nothing there, the same merge
on a pseudo-terminal draws its bar; an error after a bar starts is printed on a line of its own."""

import fcntl
import os
import pty
import struct
import termios
import subprocess
import sys

from glm5lib.mapping.tiny import ensure_tiny
from glm5lib.progress import show_progress


def _merge(first, out, stderr):
    return subprocess.run([sys.executable, "-m", "glm5lib.cli", "gguf", "merge", str(first), str(out)],
                          stdout=subprocess.PIPE, stderr=stderr, timeout=300)


def _pty():
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    return main, child


def test_bar_on_a_terminal_only(tmp_path):
    first = ensure_tiny(progress=False).shards["Q8_0"][0]
    r = _merge(first, tmp_path / "piped.gguf", subprocess.PIPE)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    main, child = _pty()
    try:
        r = _merge(first, tmp_path / "tty.gguf", child)
        os.close(child)
        drawn = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child side is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(main)
    assert r.returncode == 0 and b"tty.gguf" in drawn and b"\r" in drawn, drawn[-500:]


def test_error_after_a_bar_is_on_its_own_line(tmp_path):
    first = ensure_tiny(progress=False).shards["Q8_0"][0]
    (tmp_path / "exists.gguf").write_bytes(b"")
    main, child = _pty()
    try:  # the output exists: refused before any bar, the error alone on stderr
        r = _merge(first, tmp_path / "exists.gguf", child)
        os.close(child)
        text = os.read(main, 65536).decode()
    finally:
        os.close(main)
    assert r.returncode != 0 and text.startswith("error: ") and text.count("error:") == 1, text


def test_show_progress_follows_stderr(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert show_progress() and not show_progress(False)
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))
    assert not show_progress()


def test_status_line_is_erased_and_only_on_a_terminal(monkeypatch):
    from glm5lib.serving.cli import status_line

    class Term:
        def __init__(self, tty):
            self.tty, self.text = tty, ""

        def isatty(self):
            return self.tty

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    for tty in (True, False):
        term = Term(tty)
        monkeypatch.setattr(sys, "stderr", term)
        try:
            with status_line("importing vLLM ..."):
                raise KeyError("boom")
        except KeyError:
            pass
        # on a terminal: the line, then carriage return + erase, so an error starts on a clean line
        assert term.text == ("importing vLLM ...\r\033[K" if tty else "")
