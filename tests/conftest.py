"""Shared fixtures: the offline tiny model, a clean env registry, quiet offline Hugging Face libraries."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path() -> str:
    """The offline tiny model's folder, built once and cached on disk."""
    from grpo_magic.models import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(autouse=True)
def _clean_registry():
    """Each test starts with no registered envs and no active run."""
    from grpo_magic import env as env_module

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
