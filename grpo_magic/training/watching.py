"""The reward-hacking watch of a run (docs/explanation/watch.md): a ``grpo_magic.watch.Watch`` subscribed to the
run's event stream, whose alarms go back onto the same stream as ``AlarmRaised`` events.

The watch reads ``RunStarted``, ``GroupScored``, ``StepLogged``, ``EvalScored`` and ``EnvSwapped`` as every other
subscriber does. Alarms it finds while an event is being delivered wait in ``pending`` and are emitted by the run
right after that event (``flush``), so that every subscriber sees a step's ``StepLogged`` before its alarms.
The watch must never end a run: its first exception becomes one warning, and it is off for the rest of the run.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from grpo_magic.config.params import GRPOParams, watch_names
from grpo_magic.events import AlarmRaised, Event, StatusChanged, StepLogged
from grpo_magic.text import one_line
from grpo_magic.watch import EVAL, Watch, task_metrics_of

__all__ = ["WATCH_STOP", "RunWatch", "alarm_dict", "unreported", "unreported_note", "watched_metrics"]

#: How a stop asked by the watch (``--on-alarm stop``) begins its reason: every process of a run learns the reason
#: at the step's end (the stop is agreed across processes), and the CLI exits with its own status for it.
WATCH_STOP = "stopped by the reward-hacking watch"


def watched_metrics(params: GRPOParams, env: Any) -> tuple[str, ...] | None:
    """The task metrics a run watches: ``--watch`` names, else the env's ``task_metrics``; None: no watch."""
    names = watch_names(params.watch)
    if names is None:
        return None
    return names or task_metrics_of(env)


def unreported(names: Iterable[str], reported: set[str]) -> list[str]:
    """The watched names the env does not report (``eval``, the in-run evaluation, is not a component)."""
    return [n for n in names if n != EVAL and n not in reported]


def unreported_note(missing: list[str], components: set[str]) -> str:
    """One sentence on watched task metrics the env does not report: said by the check and by a run's watch."""
    names = ", ".join(repr(n) for n in missing)
    what = f"task metric {names} is" if len(missing) == 1 else f"task metrics {names} are"
    return (f"the watch's {what} not among score_episode's components "
            f"({', '.join(sorted(components)) or 'it returns a bare score'}), so the watch cannot compare the reward "
            f"with it; return {{'score': ..., {missing[0]!r}: ...}} or name a component with --watch.")


def alarm_dict(event: AlarmRaised) -> dict[str, Any]:
    """``run.alarms``' item: ``kind``, ``step``, ``message``, ``evidence``."""
    return {"kind": event.kind, "step": event.step, "message": event.message, "evidence": event.evidence}


class RunWatch:
    """The run's watch: an event subscriber (call it with each event); ``flush(emit)`` emits its pending alarms.

    ``error`` is the sentence of the failure that switched it off (None while it works). ``notes`` collects what it
    said about the watched names (a name the env never reports)."""

    def __init__(self, task_metrics: Iterable[str], *, on_alarm: str = "warn",
                 request_stop: Callable[[str], Any] | None = None, phase: Callable[[], str] = lambda: "training",
                 **settings: Any) -> None:
        self.watch = Watch(tuple(task_metrics), **settings)
        self.on_alarm = on_alarm
        self.request_stop = request_stop
        self.phase = phase  # the run's phase now: a note keeps it (a note during a stop must not say "training")
        self.pending: list[Event] = []
        self.count = 0  # alarms raised so far (train/alarms)
        self.error: str | None = None
        self._checked_names = False

    @property
    def active(self) -> bool:
        return self.error is None

    def prime(self, events: Iterable[Event]) -> None:
        """A resumed run: the steps before its checkpoint, fed silently (their alarms are in the run log already)."""
        for event in events:
            if isinstance(event, AlarmRaised):
                self.count += 1
            else:
                self._guarded(event, silent=True)

    def __call__(self, event: Event) -> None:
        if isinstance(event, AlarmRaised):
            return
        self._guarded(event, silent=False)

    def _guarded(self, event: Event, *, silent: bool) -> None:
        if self.error is not None:
            return
        try:
            alarms = self.watch.observe_event(event)
            if not silent and isinstance(event, StepLogged) and not self._checked_names:
                self._checked_names = self._check_names(event)
        except Exception as exc:  # noqa: BLE001 - the watch never ends a run
            self.error = (f"The reward-hacking watch failed ({type(exc).__name__}: {one_line(exc, 300)}) and is off "
                          "for the rest of this run; training goes on.")
            warnings.warn(self.error, RuntimeWarning, stacklevel=2)
            self.pending.append(StatusChanged(status=self.phase(), message=self.error))
            return
        if silent:
            return
        for alarm in alarms:
            self.count += 1
            self.pending.append(AlarmRaised(step=alarm.step, kind=alarm.kind, message=alarm.message,
                                            evidence=alarm.evidence))
            if self.on_alarm == "stop" and self.request_stop is not None:
                self.request_stop(f"{WATCH_STOP} ({alarm.kind} alarm at step {alarm.step})")

    def _check_names(self, event: StepLogged) -> bool:
        """After the first logged step with a scored episode: a watched name the env does not report is said once,
        and left out. False: this step cannot tell (every episode failed), ask again at the next."""
        step, metrics = event.step, event.metrics
        if event.episodes and event.episode_errors >= event.episodes:
            return False
        rows = self.watch.rows
        components = {k[len("components/"):] for k in metrics if k.startswith("components/")}
        if rows and rows[-1]["step"] == step:
            components |= set(rows[-1]["components"])
        missing = unreported(self.watch.task_metrics, components | set(metrics))
        if not missing:
            return True
        self.watch.task_metrics = tuple(n for n in self.watch.task_metrics if n not in missing)
        self.pending.append(StatusChanged(status=self.phase(), message=f"watch: {unreported_note(missing, components)}"))
        return True

    def flush(self, emit: Callable[[Event], None]) -> None:
        """Emit the alarms (and notes) found while the last event was delivered."""
        while self.pending:
            emit(self.pending.pop(0))
