"""Shared fixtures (the offline tiny model, a clean env registry, quiet offline Hugging Face libraries) and the
suite's tiers: every test gets one tier marker (CONTRIBUTING.md says which tier proves what)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

#: The tiers, one marker each; ``fast`` is added to the tests of FAST_TIERS (``python -m pytest -m fast``, what a
#: contributor runs on every change: a few minutes on 2 cores). The README's command runs them all.
TIERS = {
    "unit": "no training: parameters, parsers, validation, envs, widgets fed by events, packaging",
    "train": "trains the offline models a few steps in this process (real TRL, real magics): seconds each",
    "long": "trains or generates in this process for tens of seconds: tiny-agent's tool-loop episodes, LoRA saves",
    "process": "starts processes: the CLI as a command, torchrun, two machines, signals, locks between processes",
    "notebook": "runs a shipped notebook top to bottom in a Jupyter kernel",
    "browser": "drives JupyterLab and Notebook 7 in headless Chromium",
    "lesson": "trains tens of steps and asserts that the reward rises (or that a model rebuilds as its card says)",
}
FAST_TIERS = ("unit", "train")
#: A module's tier, unless a test carries a tier marker of its own (a module's slow lesson, its process test).
MODULE_TIERS = {
    "unit": ("test_architecture", "test_bad_inputs", "test_binder", "test_env", "test_envs_arithmetic",
             "test_envs_hotel", "test_gpu_stack", "test_packaging", "test_params", "test_properties", "test_readme",
             "test_trl_settings", "test_copy_circuit"),
    "process": ("test_machines", "test_one_run_per_folder", "test_stop_resume", "test_nothing_lost"),
    "notebook": ("test_notebooks",),
    "browser": ("test_browser", "test_browser_agent", "test_browser_curves"),
}
_TIER_OF_MODULE = {module: tier for tier, modules in MODULE_TIERS.items() for module in modules}


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")
    config.addinivalue_line("markers", f"fast: the tiers {', '.join(FAST_TIERS)} (python -m pytest -m fast)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One tier per test: its own marker (``slow`` counts as ``lesson``), else its module's, else ``train``."""
    for item in items:
        own = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if item.get_closest_marker("slow") is not None:
            own.append("lesson")
        tier = own[-1] if own else _TIER_OF_MODULE.get(item.module.__name__.rsplit(".", 1)[-1], "train")
        if not own:
            item.add_marker(tier)
        if tier in FAST_TIERS and not (set(own) - set(FAST_TIERS)):
            item.add_marker("fast")


@pytest.fixture(scope="session")
def tiny_path() -> str:
    """The offline tiny model's folder, built once and cached on disk."""
    from grpo_magic.models import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(autouse=True)
def _clean_registry():
    """Each test starts with no registered envs and no active run."""
    from grpo_magic.environment import env as env_module

    saved = dict(env_module._REGISTRY)
    env_module._REGISTRY.clear()
    yield
    env_module._REGISTRY.clear()
    env_module._REGISTRY.update(saved)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder, as a user does from their project."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def shell(in_tmp):
    """A real IPython shell with the extension loaded; names a test defines are removed after it."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    before = set(shell.user_ns)
    shell.run_line_magic("load_ext", "grpo_magic")
    yield shell
    shell.run_line_magic("unload_ext", "grpo_magic")
    for name in set(shell.user_ns) - before:
        shell.user_ns.pop(name, None)


@pytest.fixture(scope="session")
def jupyter(tmp_path_factory: pytest.TempPathFactory):
    """One Jupyter server for every browser test (skipped without Chromium and playwright), stopped after."""
    from browser_support import serve_jupyter

    yield from serve_jupyter(tmp_path_factory, "jupyter")


@pytest.fixture(scope="session")
def browser(jupyter, tmp_path_factory: pytest.TempPathFactory):
    """One headless Chromium for every browser test, tall enough for the whole dashboard; each test opens its page."""
    from browser_support import launch_browser
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = launch_browser(p, tmp_path_factory.mktemp("chromium-profile"), height=1800)
        try:
            yield context
        finally:
            context.close()


@dataclass
class CliResult:
    """What ``grpo-magic ARGS`` gave: its exit status and what it printed (a CompletedProcess's names)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``grpo-magic ARGS`` run in this process (``grpo_magic.frontends.cli.main``) from a folder, for the tests where the
    process boundary is not what they prove: torch and TRL are imported once for the session instead of once a
    command. The folder's modules (an env the command imports from its working folder) are forgotten after."""

    def call(args: list[str], cwd: str | Path | None = None) -> CliResult:
        from grpo_magic.frontends.cli import main

        monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts its working folder on the path
        if cwd is not None:
            monkeypatch.chdir(cwd)
        before = set(sys.modules)
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own exits (--help, a bad flag)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        finally:
            here, repo = Path.cwd(), Path(__file__).resolve().parents[1]
            for name in set(sys.modules) - before:  # the package and envs/ stay: one module object each
                path = Path(getattr(sys.modules[name], "__file__", None) or "/").resolve()
                if path.is_relative_to(here) and not path.is_relative_to(repo):
                    del sys.modules[name]
        out = capsys.readouterr()
        return CliResult(int(code or 0), out.out, out.err)

    return call
