"""The view model of a run: events folded into the state every display renders.

``RunView`` is plain Python (no widgets, no plotting): the notebook dashboard renders it with
ipywidgets, the terminal progress prints it, and a replay rebuilds it from the run log, so all
three always agree (docs/architecture.md, "The dashboard"). Memory stays bounded: metric
history is kept as compact float arrays and only the last few steps' groups are held; older
groups live on in the run log.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import OrderedDict, deque
from typing import Any

from grpo_magic.events import (
    AlarmRaised,
    EnvSwapped,
    EpisodeError,
    EvalScored,
    Event,
    GroupScored,
    RunFinished,
    RunStarted,
    StatusChanged,
    StepLogged,
)
from grpo_magic.text import finite

from .panels import COMPONENT_PREFIX, OPTIONAL, PANELS, Panel, components_panel, curve_metrics, reward_panel

# Metrics kept per logged step for the curves (the panels' metrics); everything else TRL logs
# stays in the run log.
CURVE_METRICS = curve_metrics()
LATEST_ERRORS = 5  # tracebacks kept for the errors panel
MAX_COMPONENTS = 12  # curves kept; an env that invents a name per episode must not grow the view forever
MAX_ALARMS = 50  # alarm cards kept (each kind fires once per run by default; a cooldown may fire more)
ALARM = "alarm"  # the kind of a marker that an alarm of the reward-hacking watch put on the curves


def task_names_of(value: Any) -> list[str]:
    """Task metric names from a run's ``watch`` parameter or an env's ``task_metrics``: a name, a comma-separated
    string, or a list of names; anything else gives none (a run log is data, of any shape)."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)):
        return []
    return [n.strip() for n in value if isinstance(n, str) and n.strip()]


def cut_from(step: float, steps: array, *columns: array) -> None:
    """Drop the entries at ``step`` and after from a sorted step array and its columns."""
    i = bisect.bisect_left(steps, step)
    for arr in (steps, *columns):
        del arr[i:]


class RunView:
    """Everything a display shows of one run, updated event by event (``apply``).

    ``max_group_steps`` steps of groups stay in memory. ``stop_requested`` is set by a display's
    Stop button, so that every part of it says "stopping..." at once, before the run answers.
    """

    def __init__(self, max_group_steps: int = 5) -> None:
        self.max_group_steps = max(1, int(max_group_steps))
        self.reset_run()
        self.step = 0
        # Metric history: compact arrays of floats, NaN where a step did not log a metric.
        self.steps = array("d")
        self.metrics: dict[str, array] = {name: array("d") for name in CURVE_METRICS}
        # Reward components (``components/<name>``), aligned with ``steps``, NaN where not logged.
        self.components: dict[str, array] = {}
        self.swaps: list[EnvSwapped] = []  # env swaps, for the markers on the curves
        #: Evaluations on the held-out prompts (``EvalScored``): dicts with ``step``, ``greedy_mean``,
        #: ``sampled_mean``, ``pass_at_k``, ``baseline``; points on the reward panel (the first is the baseline).
        self.evals: list[dict[str, Any]] = []
        self.last_metrics: dict[str, Any] = {}
        self.range_steps = array("d")
        self.range_min = array("d")
        self.range_max = array("d")
        self.curves_version = 0  # bumped by StepLogged (a new point on every curve) and by a new marker
        self.cuts = 0  # bumped when a resumed run drops history: drawings kept from before are stale
        # Steps marked on every curve, as (step, label), or (step, label, kind) for a kind the renderers draw
        # their own way (``ALARM``): an env swapped in, an alarm of the reward-hacking watch.
        self.markers: list[tuple[Any, ...]] = []
        #: Alarms of the reward-hacking watch (``AlarmRaised``): dicts with ``kind``, ``step``, ``message`` and
        #: ``evidence`` (as ``run.alarms``), for the alarm cards; each is a marker on the curves too.
        self.alarms: list[dict[str, Any]] = []
        self.alarms_version = 0
        #: The task metrics the run names (``watch`` in its parameters, an alarm's evidence): drawn beside the
        #: reward when they are reward components.
        self.task_names: list[str] = []
        self.range_version = 0  # bumped by GroupScored: drawn with the next step, or at a flush
        # Groups: the last max_group_steps steps in memory, older ones in the run log.
        self.groups_mem: OrderedDict[int, list[GroupScored]] = OrderedDict()
        self.group_steps_seen = 0
        # Errors.
        self.error_counts: dict[str, int] = {}
        self.error_total = 0
        self.latest_errors: deque[EpisodeError] = deque(maxlen=LATEST_ERRORS)
        self.errors_version = 0
        # Episodes abandoned past rl_episode_timeout whose threads still run (the latest step's count).
        self.abandoned_running = 0
        # Notes of a replay: run-log lines that were skipped (cut short by a kill, damaged).
        self.notes: list[str] = []

    def reset_run(self) -> None:
        """What a new ``RunStarted`` replaces; the history stays, as a resumed run continues it."""
        self.status = "starting"
        self.reason = ""
        self.message = ""
        self.stop_requested = False
        self.finished: RunFinished | None = None
        self.env_name = ""
        self.params: dict[str, Any] = {}  # the run's parameters (RunStarted), for the curves' notes
        self.trl_config: dict[str, Any] = {}  # its GRPOConfig settings that differ from TRL's defaults
        self.model = ""
        self.output_dir = ""
        self.max_steps: int | None = None
        self.t_start: float | None = None
        self.t_last: float | None = None
        self.t_train: float | None = None
        self.step_at_train = 0  # a resumed run starts from its checkpoint's step

    # ---- folding events -------------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Fold one event into the state; True when a display must show it at once."""
        if isinstance(event, RunStarted):
            self.reset_run()
            self.env_name, self.model, self.output_dir = event.env_name, event.model, event.output_dir
            self.params = dict(event.params) if isinstance(event.params, dict) else {}
            self.trl_config = dict(event.trl_config) if isinstance(event.trl_config, dict) else {}
            self.max_steps = event.max_steps
            self.t_start = self.t_last = event.time
            self.groups_mem.clear()  # a resumed run re-scores steps from its checkpoint on: those groups come anew
            # The resolved names (task_metrics); an older run log has only its --watch, where "none" means off.
            resolved = self.params.get("task_metrics")
            watch = self.params.get("watch")
            self._add_task_names(task_names_of(resolved if resolved is not None
                                               else None if str(watch).strip().lower() == "none" else watch))
            return True
        self.t_last = event.time if self.t_last is None else max(self.t_last, event.time)
        if self.t_start is None:
            self.t_start = event.time
        if isinstance(event, StatusChanged):
            self.status, self.message = event.status, event.message
            if event.status == "training" and self.t_train is None:
                self.t_train, self.step_at_train = event.time, self.step
            return True
        if isinstance(event, RunFinished):
            self.finished = event
            self.status, self.reason = event.status, event.reason
            if event.output_dir:
                self.output_dir = event.output_dir
            if event.steps:
                self.step = max(self.step, event.steps)
            return True
        if isinstance(event, StepLogged):
            self._apply_step(event)
        elif isinstance(event, GroupScored):
            self._apply_group(event)
        elif isinstance(event, EnvSwapped):
            self.swaps.append(event)
            self.add_marker(event.step, f"env swapped to {event.class_name}")  # a marker on the curves
            return True
        elif isinstance(event, AlarmRaised):
            self._apply_alarm(event)
            return True
        elif isinstance(event, EvalScored):
            self.evals.append({"step": event.step, "greedy_mean": event.greedy_mean, "sampled_mean": event.sampled_mean,
                               "pass_at_k": dict(event.pass_at_k), "baseline": event.baseline,
                               "prompts": event.prompts, "seconds": event.seconds})
            self.curves_version += 1
            return True
        elif isinstance(event, EpisodeError):
            self.error_counts[event.kind] = self.error_counts.get(event.kind, 0) + 1
            self.error_total += 1
            self.latest_errors.append(event)
            self.errors_version += 1
        return False

    def _apply_step(self, event: StepLogged) -> None:
        if self.status in ("starting", "loading model"):
            self.status = "training"
        if self.t_train is None:
            self.t_train = self.t_start
        if event.max_steps:
            self.max_steps = event.max_steps
        if self.steps and event.step < self.steps[-1]:  # a resumed run went back to its checkpoint
            cut_from(event.step, self.steps, *self.metrics.values(), *self.components.values())
            self.markers = [m for m in self.markers if m[0] < event.step]
            if any(a["step"] >= event.step for a in self.alarms):
                self.alarms = [a for a in self.alarms if a["step"] < event.step]
                self.alarms_version += 1
            self.cuts += 1
        self.step = event.step
        self.last_metrics = event.metrics
        self.abandoned_running = event.episodes_abandoned
        values = {name: finite(event.metrics.get(name)) for name in CURVE_METRICS}
        values["error_rate"] = event.episode_errors / event.episodes if event.episodes else None
        parts = self._component_values(event.metrics)
        if self.steps and self.steps[-1] == event.step:
            # TRL can log one step twice (train metrics, then the run summary): merge them.
            for series, new in ((self.metrics, values), (self.components, parts)):
                for name, value in new.items():
                    if value is not None:
                        series[name][-1] = value
        else:
            self.steps.append(float(event.step))
            for series, new in ((self.metrics, values), (self.components, parts)):
                for name, value in new.items():
                    series[name].append(math.nan if value is None else value)
        self.curves_version += 1

    def _apply_alarm(self, event: AlarmRaised) -> None:
        evidence = event.evidence if isinstance(event.evidence, dict) else {}
        if len(self.alarms) < MAX_ALARMS:
            self.alarms.append({"kind": str(event.kind), "step": event.step, "message": str(event.message),
                                "evidence": evidence})
            self.alarms_version += 1
            self.add_marker(event.step, f"alarm: {event.kind}", ALARM)
        tasks = evidence.get("tasks")
        self._add_task_names(list(tasks) if isinstance(tasks, dict) else [])
        self._add_task_names(task_names_of(evidence.get("metric")))

    def _add_task_names(self, names: list[str]) -> None:
        for name in names:
            if name not in self.task_names and len(self.task_names) < MAX_COMPONENTS:
                self.task_names.append(name)
                self.curves_version += 1

    def _component_values(self, metrics: dict[str, Any]) -> dict[str, float | None]:
        """This step's ``components/<name>``; a name seen for the first time gets NaN for the earlier steps."""
        for key in metrics:
            if key.startswith(COMPONENT_PREFIX) and len(self.components) < MAX_COMPONENTS:
                name = key[len(COMPONENT_PREFIX):]
                if name not in self.components:
                    self.components[name] = array("d", [math.nan] * len(self.steps))
        return {name: finite(metrics.get(COMPONENT_PREFIX + name)) for name in self.components}

    def _apply_group(self, event: GroupScored) -> None:
        step = event.step
        if self.groups_mem and step < next(reversed(self.groups_mem)):
            for old in [s for s in self.groups_mem if s >= step]:  # a resumed run went back
                del self.groups_mem[old]
        if self.range_steps and step < self.range_steps[-1]:
            cut_from(step, self.range_steps, self.range_min, self.range_max)
            self.cuts += 1
        if step not in self.groups_mem:
            self.groups_mem[step] = []
            while len(self.groups_mem) > self.max_group_steps:
                self.groups_mem.popitem(last=False)  # older steps live on in the run log
            self.group_steps_seen += 1
        self.groups_mem[step].append(event)
        valid = [float(s) for s in event.scores if s is not None]
        if valid:
            lo, hi = min(valid), max(valid)
            if self.range_steps and self.range_steps[-1] == step:
                self.range_min[-1] = min(self.range_min[-1], lo)
                self.range_max[-1] = max(self.range_max[-1], hi)
            else:
                self.range_steps.append(float(step))
                self.range_min.append(lo)
                self.range_max.append(hi)
            self.range_version += 1

    # ---- derived views ----------------------------------------------------------------------

    @property
    def status_text(self) -> str:
        """The status as displays say it, e.g. ``training``, ``stopping...``, ``failed: <reason>``."""
        if self.status == "stopping" or (self.stop_requested and self.finished is None):
            return "stopping..."
        if self.status == "failed":
            return f"failed: {self.reason}" if self.reason else "failed"
        if self.finished is not None and self.reason and self.status == "stopped":
            return f"stopped: {self.reason}"
        return self.status

    def elapsed(self) -> float | None:
        """Seconds from the start of the run to its end (or its latest event)."""
        if self.t_start is None or self.t_last is None:
            return None
        end = self.finished.time if self.finished is not None else self.t_last
        return end - self.t_start

    def eta(self) -> float | None:
        """Seconds left at the pace of the steps trained so far in this attempt; None when unknown or done."""
        total = self.max_steps or 0
        done = self.step - self.step_at_train
        if self.finished is not None or not total or done <= 0 or self.t_train is None or not self.t_last:
            return None
        return (self.t_last - self.t_train) / done * max(total - self.step, 0)

    def series(self, metric: str) -> array:
        """A curve's values by its metric name: a kept metric, or a reward component (``components/<name>``)."""
        if metric.startswith(COMPONENT_PREFIX) and metric not in self.metrics:
            return self.components.get(metric[len(COMPONENT_PREFIX):], array("d"))
        return self.metrics.get(metric, array("d"))

    def panels(self) -> tuple[Panel, ...]:
        """The panels this run shows: the fixed ones, the optional ones with data, its reward components."""
        extra = [p for p in OPTIONAL if any(v == v for s in p.series for v in self.metrics[s.metric][-200:])]
        if self.components:
            extra.append(components_panel(tuple(self.components)))
        tasks = self.task_components()
        if tasks:
            colors = {s.label: s.color for s in extra[-1].series}
            return (reward_panel(tasks, colors), *PANELS[1:], *extra)
        return PANELS + tuple(extra)

    def task_components(self) -> tuple[str, ...]:
        """The task metrics of this run that are reward components with data: drawn beside the reward."""
        return tuple(n for n in self.task_names if n in self.components)

    def add_marker(self, step: float, label: str, kind: str = "") -> None:
        """Mark ``step`` on every curve (e.g. where an env was swapped in); ``kind`` ``ALARM`` for an alarm."""
        self.markers.append((float(step), str(label), kind) if kind else (float(step), str(label)))
        self.curves_version += 1

    def latest_group_step(self) -> int | None:
        return next(reversed(self.groups_mem)) if self.groups_mem else None

    def groups_in_memory(self) -> int:
        return sum(len(v) for v in self.groups_mem.values())
