"""The on-disk cache of the models grpo_magic builds itself (``tiny`` and its warm-started kin).

Each model is a folder under ``cache_dir()`` named after its version. It is built in a temporary
folder beside the final one and renamed into place with a marker written last, so no reader ever
sees a half-written folder. One build at a time, between processes too (two notebooks, a notebook
and the terminal, pytest-xdist workers): the builder holds the lock ``.<version>.lock`` in the cache
(``locking.ProcessLock``), and a second process that needs the same model prints one line, waits for
it, then uses its files. A build that died half-way (killed, its machine rebooted) left a temporary
folder and no marker; the next builder, which holds the lock, so no one else builds, discards it
and builds again.

The package ships the three offline models' weights (``weights/<version>/``, each with a model card), built once
by these recipes: a version found there is used as it is, with no build, so that every machine runs the same
bytes (a build's floats differ across CPUs). ``GRPO_MAGIC_BUILD_MODELS=1`` builds from the recipes instead
(the rebuild check, the tests of the cache itself).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from grpo_magic.runtime.locking import Holder, ProcessLock, process_kind

#: Written last into a built folder: its presence means the folder is complete.
MARKER = "grpo_magic_build.json"
#: The offline models' weights as the package ships them, one folder per version.
SHIPPED = pathlib.Path(__file__).resolve().parent / "weights"


def shipped_folder(version: str) -> pathlib.Path | None:
    """The package's own folder of ``version``, unless ``GRPO_MAGIC_BUILD_MODELS=1`` asks for the recipes."""
    if os.environ.get("GRPO_MAGIC_BUILD_MODELS") == "1":
        return None
    folder = SHIPPED / version
    return folder if is_ready(folder) else None


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


def _leftovers(final: pathlib.Path) -> list[pathlib.Path]:
    """What a build that died half-way left: its temporary folders, or a final folder without the marker."""
    found = sorted(final.parent.glob(f".{final.name}.tmp-*"))
    return found + ([final] if final.exists() and not is_ready(final) else [])


def cached_folder(
    version: str, build: Callable[[pathlib.Path], dict[str, Any]], announce: str | None = None
) -> pathlib.Path:
    """The shipped folder of ``version`` (the package's own weights, unless ``GRPO_MAGIC_BUILD_MODELS=1``), else
    ``cache_dir()/version``, built by ``build(tmp)`` the first time it is asked for and reused after.

    ``build`` fills the folder it is given and returns the marker's content; ``announce`` is printed
    by the process that builds (not by one that waits for it).
    """
    shipped = shipped_folder(version)
    if shipped is not None:
        return shipped
    final = cache_dir() / version
    if is_ready(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)

    def waiting(holder: Holder | None) -> None:
        who = holder.describe() if holder is not None else "another process"
        print(
            f"grpo_magic: waiting for {who} to finish building {version} in {final.parent}; its files are used then",
            file=sys.stderr,
            flush=True,
        )

    lock = ProcessLock(final.parent / f".{version}.lock", f"{process_kind()}, building {version}")
    lock.acquire(wait=True, on_wait=waiting)
    try:
        if is_ready(final):  # built by the process we waited for
            return final
        left = _leftovers(final)
        if left or lock.taken_over is not None:
            who = f" by {lock.taken_over.describe()}" if lock.taken_over is not None else ""
            print(
                f"grpo_magic: a build of {version}{who} stopped half-way; discarding it and building again",
                file=sys.stderr,
                flush=True,
            )
            for path in left:
                shutil.rmtree(path, ignore_errors=True)
        if announce:
            print(announce, file=sys.stderr, flush=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=final.parent))
        try:
            info = build(tmp)
            built_by = {"pid": os.getpid(), "host": socket.gethostname()}
            (tmp / MARKER).write_text(
                json.dumps({"version": version, **info, "built_by": built_by}, indent=2) + "\n", encoding="utf-8"
            )
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            try:
                os.rename(tmp, final)
            except OSError:
                if not is_ready(final):  # put there by a process that builds without the lock (an older release)
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        lock.release()
    return final
