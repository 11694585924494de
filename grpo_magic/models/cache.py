"""The on-disk cache of the models grpo_magic builds itself (``tiny`` and its warm-started kin).

Each model is a folder under ``cache_dir()`` named after its version. It is built in a temporary
folder beside the final one and renamed into place with a marker written last, so processes
building at the same time never see a half-written folder; the loser of the race discards its copy.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

#: Written last into a built folder: its presence means the folder is complete.
MARKER = "grpo_magic_build.json"

_build_lock = threading.RLock()  # re-entrant: a warm-start build first builds the tiny it starts from


def cache_dir() -> pathlib.Path:
    """Where grpo_magic keeps what it builds: ``$GRPO_MAGIC_CACHE`` or ``~/.cache/grpo_magic``."""
    env = os.environ.get("GRPO_MAGIC_CACHE")
    base = pathlib.Path(env) if env else pathlib.Path("~/.cache/grpo_magic")
    return base.expanduser()


def is_ready(path: pathlib.Path) -> bool:
    """The marker is written last, so its presence means the folder is complete."""
    return (path / MARKER).is_file()


def build_info(path: pathlib.Path) -> dict[str, Any]:
    """What the builder wrote into the marker (name, version, seeds, sizes, measurements)."""
    try:
        data = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_folder(version: str, build: Callable[[pathlib.Path], dict[str, Any]]) -> pathlib.Path:
    """The folder ``cache_dir()/version``, built by ``build(tmp)`` on first use and reused after.

    ``build`` fills the folder it is given and returns the marker's content.
    """
    final = cache_dir() / version
    if is_ready(final):
        return final
    with _build_lock:
        if is_ready(final):
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and not is_ready(final):  # left incomplete by something else: rebuild it
            shutil.rmtree(final, ignore_errors=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=final.parent))
        try:
            info = build(tmp)
            (tmp / MARKER).write_text(json.dumps({"version": version, **info}, indent=2) + "\n", encoding="utf-8")
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            try:
                os.rename(tmp, final)
            except OSError:
                if not is_ready(final):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
