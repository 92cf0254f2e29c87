"""Progress bars only where someone watches them: a terminal, or a Jupyter front end (where `tqdm.auto` draws a
widget). In CI logs and pipes every redraw would be one more line, and an error printed there would share the
bar's line; callers pass `disable=not show_progress(progress)` and close their bar (a `with` block) before an
error leaves the function, so the CLI prints it on a line of its own."""

from __future__ import annotations

import sys


def in_jupyter_kernel() -> bool:
    """True inside an IPython kernel (JupyterLab, papermill): tqdm.auto draws its bars as widgets there."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def show_progress(requested: bool = True) -> bool:
    """Whether to draw a progress bar: asked for, and stderr is a terminal or the code runs in a Jupyter kernel."""
    if not requested:
        return False
    if in_jupyter_kernel():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
