"""Locks between processes: one run per output folder, one build per cached model (docs/architecture.md).

A lock is filelock's ``FileLock`` (``flock`` on Unix), so the kernel releases it when its process
ends, however it ends (``kill -9``, a kernel restart, a reboot): a dead holder never blocks anyone.
Beside the lock file a small JSON sidecar names the holder (process id, host, since when, what it
does), for the one sentence that refuses a second run. A clean release removes the sidecar first,
so a sidecar that is still there when the lock is taken was left by a holder that died holding
it: the new holder says it took over. A lock that is held while its sidecar names a process that
no longer exists on this host (a fork of the dead holder keeps the lock open) is broken and taken
over too, never waited on forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo_magic.errors import GRPOMagicError

#: How long a lock that is held may lack its sidecar (its holder writes it just after taking the lock).
SIDECAR_GRACE_S = 2.0


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: read from its sidecar."""

    pid: int
    host: str
    since: float
    what: str = ""

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))

    def describe(self) -> str:
        """``grpo-magic train (process 123 on host, since 2026-12-01 21:48:38 UTC)``."""
        what = f"{self.what} " if self.what else ""
        return f"{what}(process {self.pid} on {self.host}, since {self.when()})"

    def dead_here(self) -> bool:
        """True when it is this host's and its process no longer exists (another host's cannot be told)."""
        return self.host == socket.gethostname() and not pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except OSError:
        return False
    return True


def process_kind() -> str:
    """What this process is, in words a user recognises: ``grpo-magic train``, a Jupyter kernel, ``python x.py``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "grpo-magic" or argv0.replace(os.sep, "/").endswith("grpo_magic/__main__.py"):
        return "grpo-magic train"
    if "ipykernel" in sys.modules and "ipykernel_launcher" in argv0:
        return "a Jupyter kernel"
    return f"python {Path(argv0).name}" if argv0 else "python"


def read_holder(sidecar: Path) -> Holder | None:
    try:
        data = json.loads(sidecar.read_text(encoding="utf-8"))
        return Holder(
            pid=int(data["pid"]), host=str(data["host"]), since=float(data["since"]), what=str(data.get("what", ""))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Busy(GRPOMagicError):
    """The lock is held by another live process (``holder``, when its sidecar could be read)."""

    def __init__(self, message: str, holder: Holder | None) -> None:
        super().__init__(message)
        self.holder = holder


class ProcessLock:
    """An inter-process lock at ``path`` (a file, kept), with its holder's sidecar ``path + '.json'``.

    ``what`` says what the holder does, for the message of whoever finds it held.
    """

    def __init__(self, path: Path, what: str) -> None:
        from filelock import FileLock

        self.path = Path(path)
        self.sidecar = self.path.with_name(self.path.name + ".json")
        self.what = what
        # thread_local=False: a run takes its folder's lock in the caller's thread and releases it in the
        # training thread.
        self._lock = FileLock(str(self.path), thread_local=False)
        #: The holder that died holding the lock, when this one took it over (for a note).
        self.taken_over: Holder | None = None

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def holder(self) -> Holder | None:
        return read_holder(self.sidecar)

    def _try(self) -> bool:
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        self._record()
        return True

    def _record(self) -> None:
        """Just taken: note a holder that died holding it, and name this process in the sidecar."""
        left = read_holder(self.sidecar)  # a clean release removes it: this one died holding the lock
        if left is not None and (left.pid, left.host) != (os.getpid(), socket.gethostname()):
            self.taken_over = left
        mine = Holder(pid=os.getpid(), host=socket.gethostname(), since=time.time(), what=self.what)
        tmp = self.sidecar.with_name(f"{self.sidecar.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(mine)) + "\n", encoding="utf-8")
        os.replace(tmp, self.sidecar)

    def _busy_holder(self) -> Holder | None:
        """The sidecar of a held lock, waiting a moment for one its holder is about to write."""
        deadline = time.monotonic() + SIDECAR_GRACE_S
        while (holder := self.holder()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return holder

    def _break(self, dead: Holder) -> bool:
        """Take a lock whose holder's process is gone although the lock is still open (a fork of it)."""
        from filelock import FileLock

        time.sleep(SIDECAR_GRACE_S)  # a process that took the lock an instant ago writes its own sidecar meanwhile
        if self.holder() != dead:
            return False
        if self._try():
            return True
        with contextlib.suppress(OSError):
            self.path.unlink()  # the open lock stays on the old file; a new one takes its name
        self._lock = FileLock(str(self.path), thread_local=False)
        if self._try():
            self.taken_over = dead
            return True
        return False

    def acquire(
        self,
        *,
        wait: bool = False,
        busy: Callable[[Holder | None], str] | None = None,
        on_wait: Callable[[Holder | None], None] | None = None,
        poll_s: float = 1.0,
    ) -> ProcessLock:
        """Take the lock. Held by a live process: raise ``Busy`` (``busy(holder)`` words it), or with
        ``wait`` call ``on_wait(holder)`` once and wait for it, watching that its holder still lives."""
        if self._try():
            return self
        holder = self._busy_holder()
        if holder is not None and holder.dead_here() and self._break(holder):
            return self
        if not wait:
            raise Busy(
                busy(holder)
                if busy
                else f"{self.path} is held by {holder.describe() if holder else 'another process'}.",
                holder,
            )
        if on_wait is not None:
            on_wait(holder)
        from filelock import Timeout

        while True:
            try:
                self._lock.acquire(timeout=poll_s)
            except Timeout:
                holder = self.holder()
                if holder is not None and holder.dead_here() and self._break(holder):
                    return self
                continue
            self._record()
            return self

    def release(self) -> None:
        """Remove the sidecar, then release: a sidecar found later means its holder died."""
        if not self._lock.is_locked:
            return
        with contextlib.suppress(OSError):
            mine = read_holder(self.sidecar)
            if mine is not None and mine.pid == os.getpid():
                self.sidecar.unlink()
        self._lock.release(force=True)

    def __enter__(self) -> ProcessLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def probe(path: Path) -> tuple[bool, Holder | None]:
    """Whether a live process holds the lock at ``path``, and who (when its sidecar says), without keeping it."""
    lock = ProcessLock(path, "")
    if not lock.path.exists():
        return False, None
    from filelock import Timeout

    try:
        lock._lock.acquire(timeout=0)
    except Timeout:
        holder = lock._busy_holder()
        if holder is not None and holder.dead_here():
            return False, holder  # breakable: whoever takes it next takes it over
        return True, holder
    lock._lock.release(force=True)
    return False, lock.holder()


# ---------------------------------------------------------------- one run per output folder

#: The lock of a run's output folder, inside it (its sidecar: the same name + ``.json``).
FOLDER_LOCK_NAME = ".grpo-magic.lock"


def busy_folder_message(folder: Path, holder: Holder | None) -> str:
    who = holder.describe() if holder is not None else "a process whose lock names no holder"
    return (
        f"Output folder {folder} is in use by another run, {who}; use another --project-name, or stop that run first."
    )


def folder_lock(folder: Path, what: str) -> ProcessLock:
    """Take ``folder``'s lock for a run (``what`` it is), or raise ``Busy`` in one sentence naming the running one."""
    return ProcessLock(folder / FOLDER_LOCK_NAME, what).acquire(busy=lambda h: busy_folder_message(folder, h))


def refuse_if_in_use(folder: Path) -> None:
    """Raise ``Busy`` when a live run holds ``folder``; leaves the lock as it found it."""
    busy, holder = probe(folder / FOLDER_LOCK_NAME)
    if busy:
        raise Busy(busy_folder_message(folder, holder), holder)


def take_over_note(folder: Path, lock: ProcessLock) -> str | None:
    """The note when ``lock`` was taken over from a run that died holding it, else None."""
    dead = lock.taken_over
    if dead is None:
        return None
    return (
        f"took over the lock of {folder} from {dead.describe()}, which ended without releasing it (killed?); "
        "its run log and checkpoints are kept"
    )
