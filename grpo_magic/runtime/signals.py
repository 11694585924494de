"""SIGINT and SIGTERM as Stop (docs/architecture.md, "Stop, signals and resume").

Schedulers, containers and ``timeout`` end a job with SIGTERM, a user with Ctrl-C (SIGINT). Both
mean Stop: the run finishes its current step, saves a complete checkpoint, writes
``RunFinished(stopped)`` and the CLI exits with 128 + the signal's number (130, 143).

A handler runs between two bytecodes of the main thread, which may hold any lock (the run log's,
a stream's), so it only sets a flag (``request_stop``); the training loop does the rest at the
step's end. In a single process a second Ctrl-C abandons the step (``KeyboardInterrupt``: the
last finished step is checkpointed). With several processes no signal ever does: a process that
left the step would leave the others waiting in a collective call, so they all stop at its end.
SIGTERM never escalates either: launchers forward it (torchrun sends it again to its workers),
and schedulers follow it with SIGKILL when they stop waiting.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

#: The CLI's exit status after a run stopped by each signal (the shell's 128 + signal number).
EXIT_STATUS = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal came before there was a run to stop: leave at once (nothing trained, nothing to save)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_status = EXIT_STATUS.get(signal_name, 130)


class StopSignals:
    """While active (main thread only; elsewhere it does nothing), SIGINT and SIGTERM ask for a stop.

    ``request_stop(name)`` is called with ``"SIGINT"`` or ``"SIGTERM"`` and must only set a flag;
    it returns False when there is no run to stop yet, and the handler then raises ``Interrupted``.
    ``escalate``: a second SIGINT raises ``KeyboardInterrupt`` (single process only).
    """

    def __init__(self, request_stop: Callable[[str], bool], *, escalate: bool) -> None:
        self.request_stop = request_stop
        self.escalate = escalate
        self.received: list[str] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if name == "SIGINT" and self.escalate and self.received.count("SIGINT") > 1:
            raise KeyboardInterrupt  # the second Ctrl-C: abandon the step now
        if not self.request_stop(name):
            raise Interrupted(name)
