"""Drive a real Jupyter server and headless Chromium: shared by tests/test_browser.py and
scripts/screenshot_dashboard.py.

Chromium is Debian's (``/usr/bin/chromium``), driven by the ``playwright`` Python package; no
Playwright browser download is needed. The server runs in its own process group with private
config, runtime, settings and workspace folders, so it neither reads nor changes the user's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("GRPO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
STEP_RE = re.compile(r"step (\d+)(?:/(\d+))?")


def missing_browser_tools() -> str | None:
    """Why the browser route cannot run here (Chromium or playwright missing), or None."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"{CHROMIUM} is missing (apt-get install chromium; scripts/install.sh does it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is missing (pip install playwright)"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JupyterServer:
    """``jupyter lab`` on 127.0.0.1 with a random port and token; it also serves Notebook 7.

    ``root_dir`` holds the notebooks (kernels run there, so runs write there too); ``state_dir``
    holds the server's private config, runtime files, settings and its log.
    """

    def __init__(self, root_dir: Path, state_dir: Path) -> None:
        self.root_dir = Path(root_dir)
        self.state_dir = Path(state_dir)
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.log_path = self.state_dir / "jupyter.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, ui: str, notebook: str) -> str:
        """The page of a notebook in JupyterLab (``lab``) or Notebook 7 (``notebook``)."""
        route = {"lab": "lab/tree", "notebook": "notebooks"}[ui]
        # JupyterLab restores the last workspace's tabs and focuses the one open before, so a menu
        # command could act on an earlier test's notebook: ``reset`` opens this notebook alone.
        reset = "reset&" if ui == "lab" else ""
        return f"{self.base_url}/{route}/{notebook}?{reset}token={self.token}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("config", "runtime", "settings", "workspaces", "ipython"):
            (self.state_dir / name).mkdir(parents=True, exist_ok=True)
        # No news or update toasts over the page (there is no network anyway), and no kernel
        # dialog: the notebook's own kernel starts by itself even while kernelspecs still load.
        user_settings = {
            "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
            "notebook-extension/tracker": {"autoStartDefaultKernel": True},
        }
        for plugin, values in user_settings.items():
            path = self.state_dir / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env.update(
            JUPYTER_CONFIG_DIR=str(self.state_dir / "config"),
            JUPYTER_RUNTIME_DIR=str(self.state_dir / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(self.state_dir / "settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(self.state_dir / "workspaces"),
            IPYTHONDIR=str(self.state_dir / "ipython"),
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_VERBOSITY="error",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        return env

    def start(self, timeout: float = 90.0) -> JupyterServer:
        """Start the server and wait until its REST API answers."""
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            f"--ServerApp.token={self.token}",
            "--ServerApp.allow_root=True",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, cwd=self.root_dir, env=self._env(), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "status", timeout=2)
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def api(self, method: str, path: str, timeout: float = 10.0) -> Any:
        """Call the server's REST API (``/api/<path>``); returns the decoded JSON or None."""
        req = urllib.request.Request(f"{self.base_url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - our own loopback server
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Shut down every kernel (and so every run in it), freeing the CPU for what comes next."""
        try:
            for kernel in self.api("GET", "kernels") or []:
                self.api("DELETE", f"kernels/{kernel['id']}", timeout=30)
        except (OSError, urllib.error.URLError):
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server and its kernels: SIGTERM to its process group, then SIGKILL to what is left.

        Kernels run in sessions of their own, so they are found (as the server's descendants)
        before the server goes, and killed by pid if the server did not take them down.
        """
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            import psutil

            descendants = psutil.Process(proc.pid).children(recursive=True)
        except Exception:  # noqa: BLE001 - psutil missing or the server already gone
            descendants = []
        if proc.poll() is None:
            self.shutdown_kernels()
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        for child in descendants:
            try:
                if child.is_running():
                    child.kill()
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        if self._log is not None:
            self._log.close()
            self._log = None


def serve_jupyter(tmp_path_factory: Any, name: str) -> Iterator[JupyterServer]:
    """A test module's Jupyter server (the module is skipped without Chromium and playwright), stopped after."""
    import pytest

    reason = missing_browser_tools()
    if reason:
        pytest.skip(f"browser test needs Chromium and playwright: {reason}")
    base = tmp_path_factory.mktemp(name)
    server = JupyterServer(base / "root", base / "state")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def page_of_a_test(page: Any, jupyter: JupyterServer, tmp_path: Path, failure_png: str) -> Iterator[Any]:
    """A test's page: on failure a screenshot and the server's log; always the page closed and the
    kernels shut down (which frees the CPU, and ends a run, before the next test)."""
    try:
        yield page
    except BaseException:
        try:
            page.screenshot(path=str(tmp_path / failure_png))
        except Exception:  # noqa: BLE001 - the page may be gone
            pass
        print(f"screenshots in {tmp_path}\njupyter log:\n{jupyter.log_tail()}")
        raise
    finally:
        page.close()
        jupyter.shutdown_kernels()


def write_notebook(path: Path, cells: list[str]) -> Path:
    """A notebook of code cells on the python3 kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def launch_browser(playwright: Any, user_data_dir: Path, *, width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium context with a fresh profile (Debian's chromium, no Playwright download)."""
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir),
        executable_path=CHROMIUM,
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": width, "height": height},
    )


def open_notebook(page: Any, url: str, timeout_s: float = 90.0) -> None:
    """Open a notebook page and wait until its cells are there."""
    page.goto(url, timeout=timeout_s * 1000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_s * 1000)


def run_all_cells(page: Any, timeout_s: float = 90.0) -> None:
    """Wait for the kernel, then Run > Run All Cells from the menu bar (JupyterLab and Notebook 7 alike)."""
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        state="attached", timeout=timeout_s * 1000
    )
    accept_kernel_dialog(page)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()


def start_cells(page: Any) -> None:
    """Run > Run All Cells, once more if no cell has started a minute later: on two busy cores a fresh
    JupyterLab sometimes takes the click before its kernel connection is up, and runs nothing."""
    run_all_cells(page)
    started = page.locator(".jp-InputPrompt", has_text=re.compile(r"\[(\*|\d+)\]"))
    try:
        started.first.wait_for(timeout=60_000)
    except Exception:  # noqa: BLE001 - playwright's TimeoutError: try the menu once more
        run_all_cells(page)


def accept_kernel_dialog(page: Any, wait_s: float = 1.5) -> None:
    """Accept a "Select Kernel" dialog (the notebook's own kernel) if one shows up soon."""
    dialog = page.locator(".jp-Dialog").filter(has_text="Select Kernel")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if dialog.count():
            dialog.locator(".jp-Dialog-button.jp-mod-accept").first.click()
            dialog.first.wait_for(state="detached", timeout=10_000)
            return
        page.wait_for_timeout(100)


def dashboard_step(page: Any) -> int:
    """The step the dashboard's progress text shows now (``step 3/200 · ...``)."""
    text = page.locator(".grpo-dashboard .grpo-progress-text").first.inner_text(timeout=5_000)
    match = STEP_RE.search(text)
    return int(match.group(1)) if match else -1


def wait_for_step(page: Any, at_least: int, timeout_s: float) -> int:
    """Wait until the dashboard shows step ``at_least`` or later; returns the step shown."""
    deadline = time.monotonic() + timeout_s
    step = -1
    while time.monotonic() < deadline:
        step = dashboard_step(page)
        if step >= at_least:
            return step
        page.wait_for_timeout(250)
    raise AssertionError(f"the dashboard stayed at step {step} for {timeout_s:.0f} s (waited for {at_least})")


def training_notebook_cells(env_cell: str, train_line: str) -> list[str]:
    """The three cells of a training notebook: load the extension, define the env, train."""
    return ["%load_ext grpo_magic", env_cell, train_line]
