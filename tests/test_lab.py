"""Every notebook's INTERACTIVE path as a user meets it: JupyterLab in a real browser.

JupyterLab is started as `make lab` starts it (rooted at `notebooks/`, so kernels do not run from the repository
root) and driven in headless Chromium (Debian's `chromium`, through Playwright; no browser is downloaded). Each
notebook is copied into a temporary folder under `notebooks/` with a cell after its parameters that sets the CI
profile's values and `INTERACTIVE = True` (as papermill injects parameters); all cells are run through
`window.jupyterapp` (`--LabApp.expose_app_in_browser`), and once the kernel is idle the test asserts: no error
output, every widget view rendered by the front end (ipywidgets' DOM nodes, no "Error displaying widget"),
every figure displayed as an image, notebook 03's explorer with its figure, and tqdm's bars drawn as widgets.
On failure a screenshot and the notebook with its outputs go to `outputs/logs/lab/`.

Needs the `lab` extra (jupyterlab, playwright) and /usr/bin/chromium (or $GLM5LIB_CHROMIUM); CI installs all
three (.ci/run) and sets GLM5LIB_REQUIRE_LAB=1, under which a missing piece fails. Elsewhere it is skipped with
the reason.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

from glm5lib.workbook.run import load_params, notebooks, params_for

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "outputs" / "logs" / "lab"
CHROMIUM = os.environ.get("GLM5LIB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage"]
SERVER_START_S = 180  # JupyterLab's first start builds its page config; 2 busy cores
NOTEBOOK_S = 1200  # one notebook, all cells (notebook 05 starts a vLLM server: 1-3 min; 03 may train: ~4 min)
SETTLE_S = 60  # widgets and images drawn after the kernel went idle

pytestmark = pytest.mark.slow


def _missing() -> str | None:
    for module, what in (("playwright.sync_api", "the `playwright` package"), ("jupyterlab", "the `lab` extra")):
        try:
            importlib.import_module(module)
        except ImportError:
            return f"{what} is not installed"
    return None if os.access(CHROMIUM, os.X_OK) else f"no Chromium at {CHROMIUM} (apt-get install chromium)"


# CI (.ci/run sets GLM5LIB_REQUIRE_LAB=1) fails instead of skipping, so the browser test cannot vanish unnoticed:
# a failing test, not an error at collection (which would stop every other test of the run).
_why = _missing()
if _why is not None and os.environ.get("GLM5LIB_REQUIRE_LAB") != "1":
    pytest.skip(_why, allow_module_level=True)


def test_browser_pieces_are_installed():
    assert _why is None, f"tests/test_lab.py cannot run: {_why}"


playwright_api = importlib.import_module("playwright.sync_api") if _why is None else None

NOTEBOOKS = notebooks(ROOT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _interactive_copy(nb: Path, folder: Path) -> Path:
    """`nb` with the CI profile's parameters and INTERACTIVE = True in a cell after the parameters cell."""
    book = nbformat.read(nb, as_version=4)
    params = params_for(nb, "ci", load_params("ci", ROOT))
    params["INTERACTIVE"] = True
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    first = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    book.cells.insert(first + 1, cell)
    out = folder / nb.name
    nbformat.write(book, out)
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL, token, folder under notebooks/ holding the copies) of a JupyterLab rooted at notebooks/."""
    port, token = _free_port(), uuid.uuid4().hex
    home = tmp_path_factory.mktemp("jupyter")
    folder = ROOT / "notebooks" / f"lab-test-{os.getpid()}"
    folder.mkdir()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), PYTHONUNBUFFERED="1")
    LOGS.mkdir(parents=True, exist_ok=True)
    log = open(LOGS / "server.log", "w")
    # As `make lab` (jupyter lab notebooks/), plus: a fixed port and token, the app exposed to the page, no
    # update checks or announcements fetched.
    cmd = [sys.executable, "-m", "jupyter", "lab", str(ROOT / "notebooks"), "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=",
           f"--LabApp.workspaces_dir={home / 'workspaces'}"] + (["--allow-root"] if os.geteuid() == 0 else [])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start (see {LOGS / 'server.log'})") from None
                time.sleep(1)
        yield base, token, folder
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its kernels (and notebook 05's vLLM server) go with it
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _shutdown_kernels(base: str, token: str) -> None:
    req = urllib.request.Request(f"{base}/api/sessions?token={token}")
    for s in json.loads(urllib.request.urlopen(req, timeout=10).read()):
        urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions/{s['id']}?token={token}",
                                                      method="DELETE"), timeout=60)


# The state of the open notebook, read in the page: kernel status, code cells queued/running ([*]), executed.
_STATE = """() => {
  const p = window.jupyterapp.shell.currentWidget;
  if (!p || !p.content || !p.sessionContext) return null;
  const cells = p.content.widgets.filter(c => c.model.type === 'code');
  const kernel = p.sessionContext.session && p.sessionContext.session.kernel;
  return {status: kernel ? kernel.status : 'none', total: cells.length,
          pending: cells.filter(c => (c.promptNode && c.promptNode.textContent || '').includes('*')).length,
          executed: cells.filter(c => c.model.executionCount !== null).length};
}"""

# What the front end drew: widget views, broken widgets, images (outside and inside widgets), progress bars.
_DOM = """() => {
  const area = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const q = s => area ? area.querySelectorAll(s).length : 0;
  const text = area ? area.innerText : '';
  return {widgets: q('.jp-OutputArea-output .jupyter-widgets'), images: q('.jp-OutputArea-output img'),
          widget_images: q('.jupyter-widgets img'), progress: q('.widget-hprogress, .widget-vprogress'),
          widget_errors: (text.match(/Error displaying widget|Loading widget\\.\\.\\./g) || []).length};
}"""


def _interactive_block(nb: Path) -> str:
    """The source of the notebook's `if INTERACTIVE:` cells (empty when it has none)."""
    cells = nb.with_suffix(".py").read_text().split("\n# %%")
    return "\n".join(c for c in cells if "\nif INTERACTIVE:" in c)


def _outputs(book: dict) -> list[dict]:
    return [o for c in book["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_interactive_path_in_jupyterlab(nb, lab, browser):
    base, token, folder = lab
    copy = _interactive_copy(nb, folder)
    rel = copy.relative_to(ROOT / "notebooks").as_posix()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    book: dict = {}
    try:
        page.goto(f"{base}/lab?token={token}&reset", timeout=120_000)
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined",
                               timeout=120_000)
        page.evaluate("""async (path) => {
            const app = window.jupyterapp;
            await app.started; await app.restored;
            const panel = await app.commands.execute('docmanager:open',
                                                     {path, factory: 'Notebook', kernel: {name: 'python3'}});
            await panel.context.ready; await panel.sessionContext.ready;
            app.shell.activateById(panel.id);
        }""", rel)
        page.wait_for_function(f"() => {{ const s = ({_STATE})(); return s && s.status === 'idle'; }}",
                               timeout=180_000)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        deadline, idle_polls, state = time.monotonic() + NOTEBOOK_S, 0, None
        while time.monotonic() < deadline:
            time.sleep(3)
            state = page.evaluate(_STATE)
            done = state and state["executed"] > 0 and state["pending"] == 0 and state["status"] == "idle"
            idle_polls = idle_polls + 1 if done else 0
            if idle_polls >= 2:
                break
        else:
            raise AssertionError(f"{nb.name}: not finished after {NOTEBOOK_S} s (last state {state})")
        book = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()")
        outputs = _outputs(book)
        errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error"]
        assert not errors, f"{nb.name}: {errors}"
        assert state["executed"] == state["total"], f"{nb.name}: run stopped early: {state}"
        n_views = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
        n_png = sum("image/png" in o.get("data", {}) for o in outputs)
        deadline, dom = time.monotonic() + SETTLE_S, {}
        while time.monotonic() < deadline:  # the front end draws widgets and images after the kernel is idle
            dom = page.evaluate(_DOM)
            if dom["widget_errors"] == 0 and dom["images"] >= n_png and (n_views == 0 or dom["widgets"] > 0):
                break
            time.sleep(2)
        print(f"{nb.name}: {state}, {n_views} widget views and {n_png} figures in the outputs, drawn: {dom}")
        assert dom["widget_errors"] == 0, f"{nb.name}: a widget failed to render: {dom}"
        assert dom["images"] >= n_png, f"{nb.name}: {n_png} figures in the outputs, {dom['images']} drawn: {dom}"
        if "widget" in _interactive_block(nb):  # an explorer (ipywidgets, notebook 05's chat box)
            assert n_views > 0 and dom["widgets"] > 0, f"{nb.name}: the explorer's widgets are missing: {dom}"
        if nb.stem.startswith("03"):  # the explorer draws its attention map inside the widget
            assert dom["widget_images"] > 0, f"{nb.name}: the explorer shows no figure: {dom}"
        if nb.stem.startswith("01"):  # merge(progress=True): tqdm's bar stays (leave=True) as an ipywidget
            assert dom["progress"] > 0, f"{nb.name}: no progress bar drawn: {dom}"
    except Exception:
        LOGS.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(LOGS / f"{nb.stem}.png"), full_page=True)
            if not book:
                book = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()")
        except Exception as exc:  # the page itself may be gone; the assertion above is the error to report
            print(f"could not save the page state: {exc}")
        if book:
            (LOGS / f"{nb.stem}.ipynb").write_text(json.dumps(book, indent=1))
        raise
    finally:
        page.close()
        _shutdown_kernels(base, token)

