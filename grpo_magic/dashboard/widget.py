"""The notebook dashboard: a subscriber of the run's event stream that renders it with ipywidgets.

It never reaches into the trainer (DESIGN.md section 4): everything it shows comes from events,
so ``replay(output_dir)`` rebuilds the same view from the run log. The training thread is the
only writer during a run; renders are throttled and batched with ``hold_sync`` so a fast run
does not flood the browser, and memory stays bounded: only the last few steps' groups are held,
older ones are read back from the run log when the user selects them.

ipywidgets and matplotlib are imported lazily, in ``Dashboard.__init__`` and the plot code, so
that importing this module (and ``%load_ext grpo_magic``) stays light.
"""

from __future__ import annotations

import bisect
import html
import io
import json
import logging
import math
import re
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from grpo_magic.events import (
    EpisodeError,
    Event,
    GroupScored,
    RunFinished,
    RunStarted,
    StatusChanged,
    StepLogged,
    event_from_dict,
    read_run_log,
    run_log_path,
)

logger = logging.getLogger(__name__)

LATEST = -1
"""Dropdown value meaning "follow the latest step" (steps themselves are >= 0)."""

# Metrics kept per logged step for the curves; everything else TRL logs stays in the run log.
_CURVE_METRICS = (
    "reward",
    "reward_std",
    "kl",
    "loss",
    "completions/mean_length",
    "completions/clipped_ratio",
    "frac_reward_zero_std",
    "error_rate",
)
_MAX_STEP_OPTIONS = 200  # the step selector lists at most this many old steps (thinned evenly)
# The curves (a matplotlib PNG, ~50-200 ms on a CPU) are the one costly part of a render. Between
# forced renders they are redrawn at most every max(throttle_s, last drawing's cost / budget)
# seconds (up to _CURVES_MAX_WAIT), counted from the start of training, so that they take about
# 1% of the training thread's time however fast the steps and slow the machine (bench/run.py
# measures it: overhead_ratio). A short run on a CPU thus shows its curves at the end.
_CURVES_BUDGET = 0.01
_CURVES_MAX_WAIT = 20.0
_curves_cost_seen = 0.1  # the last drawing's cost in this process: the next run's first estimate
_MAX_TEXT_CHARS = 20_000  # one completion or prompt shown in a card (the full text is in the run log)
_MAX_TRACEBACK_CHARS = 6_000
_LATEST_TRACEBACKS = 5
_PROMPT_COLLAPSE_CHARS = 240
_PROMPT_COLLAPSE_LINES = 4

_STATUS_COLORS = {
    "starting": "#6b7280",
    "loading model": "#2563eb",
    "training": "#2563eb",
    "stopping": "#d97706",
    "saving": "#2563eb",
    "completed": "#16a34a",
    "stopped": "#d97706",
    "failed": "#dc2626",
}


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _finite(value: Any) -> float | None:
    """A metric as a float, or None when missing, non-numeric or NaN (TRL logs NaN at times)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters in the run log)"


# --------------------------------------------------------------------------------------------
# Group cards (pure functions of the events, so live view and replay give the same HTML)
# --------------------------------------------------------------------------------------------

_CARD_STYLE = "border:1px solid rgba(128,128,128,.35);border-radius:6px;padding:8px 10px;margin:6px 0;"
_PRE_STYLE = (
    "white-space:pre-wrap;word-break:break-word;margin:2px 0 0 0;padding:4px 6px;"
    "background:rgba(128,128,128,.08);border-radius:4px;font-size:12px;max-height:16em;overflow:auto;"
)
_BADGE = "display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;margin-left:6px;color:#fff;"


def _score_bar(score: float | None) -> str:
    if score is None:
        return (
            '<span style="display:inline-block;width:90px;text-align:center;color:#dc2626">—</span>'
            '<span style="display:inline-block;width:72px;text-align:right">score –</span>'
        )
    frac = min(max(score, 0.0), 1.0)
    return (
        '<span style="display:inline-block;width:90px;height:10px;background:rgba(128,128,128,.2);'
        'border-radius:2px;vertical-align:middle;position:relative">'
        f'<span style="position:absolute;left:0;top:0;bottom:0;width:{frac * 100:.1f}%;'
        'background:#3b82f6;border-radius:2px"></span></span>'
        f'<span style="display:inline-block;width:72px;text-align:right">score {score:.2f}</span>'
    )


def _advantage_bar(adv: float | None, scale: float) -> str:
    if adv is None:
        return '<span style="display:inline-block;width:150px">A –</span>'
    half = min(abs(adv) / scale, 1.0) * 50.0
    color = "#16a34a" if adv > 0 else "#dc2626" if adv < 0 else "#6b7280"
    left = 50.0 if adv >= 0 else 50.0 - half
    return (
        '<span style="display:inline-block;width:90px;height:10px;background:rgba(128,128,128,.2);'
        'border-radius:2px;vertical-align:middle;position:relative;margin-left:14px">'
        '<span style="position:absolute;left:50%;top:-2px;bottom:-2px;width:1px;background:#888"></span>'
        f'<span style="position:absolute;left:{left:.1f}%;top:0;bottom:0;width:{half:.1f}%;'
        f'background:{color};border-radius:2px"></span></span>'
        f'<span style="display:inline-block;width:60px;text-align:right;color:{color}">A {adv:+.2f}</span>'
    )


def _advantage_formula(group: GroupScored) -> str:
    """TRL's group advantage, filled in with this group's numbers for its first scored completion."""
    mean, std = group.mean, group.std
    if mean is None or std is None:
        return "every episode failed: no reward, no learning signal from this prompt"
    first = next((i for i, s in enumerate(group.scores) if s is not None), None)
    if first is None:  # pragma: no cover - mean is None then
        return ""
    r = float(group.scores[first])  # type: ignore[arg-type]
    computed = (r - mean) / (std + 1e-4)
    text = (
        f"A<sub>i</sub> = (r<sub>i</sub> − mean) / (std + 1e-4); for #{first}: "
        f"A = ({r:.2f} - {mean:.2f}) / ({std:.2f} + 1e-4) = {computed:.2f}"
    )
    used = group.advantages[first] if first < len(group.advantages) else None
    if used is not None and abs(float(used) - computed) > 5e-3 * max(1.0, abs(computed)):
        text += f" (TRL used {float(used):.2f}: another scale_rewards setting)"
    return text


def _prompt_html(prompt: str) -> str:
    prompt = _truncate(prompt, _MAX_TEXT_CHARS)
    lines = prompt.splitlines() or [""]
    if len(prompt) > _PROMPT_COLLAPSE_CHARS or len(lines) > _PROMPT_COLLAPSE_LINES:
        head = lines[0][:120] + ("…" if len(lines[0]) > 120 or len(lines) > 1 else "")
        return (
            f'<details><summary><b>prompt</b> <span style="opacity:.75">{_esc(head)}</span></summary>'
            f'<pre style="{_PRE_STYLE}">{_esc(prompt)}</pre></details>'
        )
    return f'<div><b>prompt</b><pre style="{_PRE_STYLE}">{_esc(prompt)}</pre></div>'


def _completion_html(group: GroupScored, i: int, scale: float) -> str:
    score = group.scores[i] if i < len(group.scores) else None
    adv = group.advantages[i] if i < len(group.advantages) else None
    error = group.errors[i] if i < len(group.errors) else None
    clipped = bool(group.clipped[i]) if i < len(group.clipped) else False
    marks = []
    if error:
        kind = _esc(error.get("kind", "error"))
        message = _esc(error.get("message", ""))
        marks.append(f'<span style="{_BADGE}background:#dc2626">⚠ episode error</span> <b>{kind}</b>: {message}')
    if clipped:
        raw = group.raw_scores[i] if i < len(group.raw_scores) else None
        detail = f" (env returned {_esc(raw)})" if raw is not None else ""
        marks.append(f'<span style="{_BADGE}background:#d97706">clipped</span> score clipped to [0, 1]{detail}')
    row = (
        '<div style="margin:6px 0 0 0">'
        f'<div style="font-size:12px"><span style="display:inline-block;width:30px;opacity:.7">#{i}</span>'
        f"{_score_bar(score)}{_advantage_bar(None if adv is None else float(adv), scale)}"
        f"{''.join(' ' + m for m in marks)}</div>"
        f'<pre style="{_PRE_STYLE}">{_esc(_truncate(group.completions[i], _MAX_TEXT_CHARS))}</pre>'
    )
    if error and error.get("traceback"):
        tb = _truncate(str(error["traceback"])[-_MAX_TRACEBACK_CHARS:], _MAX_TRACEBACK_CHARS)
        row += f'<details><summary>traceback</summary><pre style="{_PRE_STYLE}">{_esc(tb)}</pre></details>'
    return row + "</div>"


def group_card_html(group: GroupScored) -> str:
    """One group's card: prompt, completions with score and advantage bars, the formula."""
    mean, std = group.mean, group.std
    stats = f"mean {mean:.2f} · std {std:.2f}" if mean is not None and std is not None else "no valid scores"
    n_err = sum(1 for e in group.errors if e)
    if n_err:
        stats += f" · {n_err} episode error{'s' if n_err > 1 else ''} (no reward, excluded)"
    flag = ""
    if group.zero_variance:
        flag = '<div style="color:#d97706;margin:4px 0">⚠ all scores equal: no learning signal from this prompt</div>'
    advs = [abs(float(a)) for a in group.advantages if a is not None]
    scale = max([1.0, *advs])
    rows = "".join(_completion_html(group, i, scale) for i in range(len(group.completions)))
    return (
        f'<div class="grpo-group" style="{_CARD_STYLE}">'
        f"<div><b>step {group.step} · group {group.group}</b> "
        f'<span style="opacity:.8">· {len(group.completions)} completions · {stats}</span></div>'
        f"{flag}{_prompt_html(group.prompt)}{rows}"
        f'<div style="font-size:12px;opacity:.85;margin-top:6px">{_advantage_formula(group)}</div>'
        "</div>"
    )


def groups_html(groups: Iterable[GroupScored]) -> str:
    """The cards of one step's groups, in group order."""
    cards = [group_card_html(g) for g in sorted(groups, key=lambda g: g.group)]
    return "".join(cards) if cards else "<i>no groups scored yet</i>"


# --------------------------------------------------------------------------------------------
# Reading old steps' groups back from the run log
# --------------------------------------------------------------------------------------------

_STEP_RE = re.compile(rb'"step":\s*(-?\d+)')


class _RunLogGroups:
    """Finds a step's ``group_scored`` lines in the run log without holding them in memory.

    It indexes the file incrementally (two byte offsets per step), so a long run costs one pass
    over the file however many times the user picks old steps. A resumed run appends a new
    ``run_started`` to the same log and replays steps from its checkpoint on: the first group
    after it rewinds the index to that step, so later steps of the earlier attempt are dropped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._ranges: dict[int, list[int]] = {}  # step -> [start, end) byte offsets
        self._rewind = False

    def _update(self) -> None:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return
        with f:
            f.seek(self._pos)
            while True:
                start = f.tell()
                line = f.readline()
                if not line.endswith(b"\n"):  # end of file, or a line still being written
                    break
                self._pos = f.tell()
                if b'"group_scored"' not in line:
                    if b'"run_started"' in line:
                        self._rewind = True
                    continue
                m = _STEP_RE.search(line, 0, 400)
                if m is None:
                    continue
                step = int(m.group(1))
                if self._rewind:
                    self._rewind = False
                    for old in [s for s in self._ranges if s >= step]:
                        del self._ranges[old]
                r = self._ranges.get(step)
                if r is None:
                    self._ranges[step] = [start, self._pos]
                else:
                    r[1] = self._pos

    def steps(self) -> list[int]:
        self._update()
        return sorted(self._ranges)

    def groups(self, step: int) -> list[GroupScored]:
        self._update()
        r = self._ranges.get(step)
        if r is None:
            return []
        out: list[GroupScored] = []
        with open(self.path, "rb") as f:
            f.seek(r[0])
            chunk = f.read(r[1] - r[0])
        for raw in chunk.splitlines():
            if b'"group_scored"' not in raw:
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and data.get("type") == "group_scored" and data.get("step") == step:
                try:
                    event = event_from_dict(data)
                except ValueError:  # a damaged line: skipped, like read_run_log does
                    continue
                assert isinstance(event, GroupScored)
                out.append(event)
        return out


def _cut_from(step: float, steps: array, *columns: array) -> None:
    """Drop the entries at ``step`` and after from a sorted step array and its columns."""
    i = bisect.bisect_left(steps, step)
    for arr in (steps, *columns):
        del arr[i:]


# --------------------------------------------------------------------------------------------
# The dashboard
# --------------------------------------------------------------------------------------------


class Dashboard:
    """Live view of one run, fed event by event (subscribe it to the run's ``EventStream``).

    ``on_stop`` is called by the Stop button (hidden when None, e.g. for a replay).
    ``max_group_steps`` steps of groups stay in memory; older ones come from ``run_log``
    (a run folder or its ``events.jsonl``; defaults to the ``output_dir`` of ``RunStarted``).
    """

    def __init__(
        self,
        *,
        on_stop: Callable[[], None] | None = None,
        throttle_s: float = 0.3,
        max_group_steps: int = 5,
        run_log: str | None = None,
    ) -> None:
        import ipywidgets as widgets

        self._on_stop = on_stop
        self.throttle_s = throttle_s
        self.max_group_steps = max(1, int(max_group_steps))
        self._run_log_arg = run_log
        self._log_reader: _RunLogGroups | None = None
        self._lock = threading.RLock()
        self._rendering_enabled = True
        self._last_render = -math.inf
        self._last_render_cost = 0.0
        self._curves_at = -math.inf  # when the curves were last drawn (time.monotonic)
        self._curves_cost = _curves_cost_seen  # what that drawing cost (seconds)
        self.render_count = 0
        self.render_seconds = 0.0
        self._figure: _Curves | None = None
        self._reset_state()

        # Widgets. Each part is re-sent only when its content changed.
        self._header = widgets.HTML()
        self._progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="320px"))
        self._progress_text = widgets.HTML()
        self._stop_button = widgets.Button(
            description="Stop",
            button_style="danger",
            icon="stop",
            tooltip="Stop training after the current step (the model is saved)",
            layout=widgets.Layout(width="90px"),
        )
        self._stop_button.on_click(self._stop_clicked)
        if on_stop is None:
            self._stop_button.layout.display = "none"
        self._info = widgets.HTML()
        self._curves = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self._step_select = widgets.Dropdown(
            options=[("latest", LATEST)],
            value=LATEST,
            description="step",
            layout=widgets.Layout(width="200px"),
        )
        self._step_select.observe(self._step_selected, names="value")
        self._groups = widgets.HTML()
        self._errors = widgets.HTML()
        self._errors_box = widgets.Accordion(children=[self._errors])
        self._errors_box.set_title(0, "Episode errors (0)")
        self._errors_box.selected_index = None
        self.widget = widgets.VBox(
            [
                self._header,
                widgets.HBox([self._progress, self._progress_text, self._stop_button]),
                self._info,
                self._curves,
                widgets.HBox([widgets.HTML("<b>Group rollouts</b>"), self._step_select]),
                self._groups,
                self._errors_box,
            ]
        )
        # Stable hooks for styling and for browser tests (the DOM of ipywidgets is not an API).
        for widget, name in (
            (self.widget, "grpo-dashboard"),
            (self._header, "grpo-header"),
            (self._progress_text, "grpo-progress-text"),
            (self._stop_button, "grpo-stop"),
            (self._info, "grpo-info"),
            (self._curves, "grpo-curves"),
            (self._step_select, "grpo-step-select"),
            (self._groups, "grpo-groups-view"),
            (self._errors_box, "grpo-errors"),
        ):
            widget.add_class(name)
        self._updating_select: int | None = None  # the thread now setting the options itself
        self._rendered: dict[str, Any] = {}
        self.flush()

    # ---- state --------------------------------------------------------------------------

    def _reset_state(self) -> None:
        self._reset_run()
        self.step = 0
        # Metric history: compact arrays of floats, NaN where a step did not log a metric.
        self._steps = array("d")
        self._metrics: dict[str, array] = {name: array("d") for name in _CURVE_METRICS}
        self._range_steps = array("d")
        self._range_min = array("d")
        self._range_max = array("d")
        self._curves_version = 0  # bumped by StepLogged: a new point on every curve
        self._range_version = 0  # bumped by GroupScored: drawn with the next step, or at a flush
        # Groups: the last max_group_steps steps in memory, older ones in the run log.
        self._groups_mem: OrderedDict[int, list[GroupScored]] = OrderedDict()
        self._group_steps_seen = 0
        self._selected = LATEST
        self._log_cache: tuple[int, list[GroupScored]] | None = None
        # Errors.
        self._error_counts: dict[str, int] = {}
        self._error_total = 0
        self._latest_errors: deque[EpisodeError] = deque(maxlen=_LATEST_TRACEBACKS)
        self._errors_version = 0

    def _reset_run(self) -> None:
        """What a new ``RunStarted`` replaces; the history stays, as a resumed run continues it."""
        self.status = "starting"
        self.reason = ""
        self._message = ""
        self._stop_requested = False
        self._finished: RunFinished | None = None
        self.env_name = ""
        self.model = ""
        self.output_dir = ""
        self.max_steps: int | None = None
        self._t_start: float | None = None
        self._t_last: float | None = None
        self._t_train: float | None = None
        self._step_at_train = 0  # a resumed run starts from its checkpoint's step

    def __call__(self, event: Event) -> None:
        """Subscriber: update the state, then render if the throttle allows (or must).

        The wait between renders is ``throttle_s``, or three times what the last render cost
        when that is longer (up to a second), so that drawing takes at most about a quarter of
        the training thread's time even on a slow machine.
        """
        with self._lock:
            force = self._apply(event)
            if not self._rendering_enabled:
                return
            wait = max(self.throttle_s, min(3.0 * self._last_render_cost, 1.0))
            if force or time.monotonic() - self._last_render >= wait:
                self._render(full=force)

    def _apply(self, event: Event) -> bool:
        """Fold one event into the state; True when it must be rendered at once."""
        if isinstance(event, RunStarted):
            self._reset_run()
            self.env_name, self.model, self.output_dir = event.env_name, event.model, event.output_dir
            self.max_steps = event.max_steps
            self._t_start = self._t_last = event.time
            # A resumed run re-scores steps from its checkpoint on: those groups come anew.
            self._groups_mem.clear()
            self._log_cache = None
            self._log_reader = None
            self._rendered.clear()
            return True
        self._t_last = event.time if self._t_last is None else max(self._t_last, event.time)
        if self._t_start is None:
            self._t_start = event.time
        if isinstance(event, StatusChanged):
            self.status, self._message = event.status, event.message
            if event.status == "training" and self._t_train is None:
                self._t_train, self._step_at_train = event.time, self.step
                self._curves_at = time.monotonic()  # the first curves wait for the budget too
            return True
        if isinstance(event, RunFinished):
            self._finished = event
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
        elif isinstance(event, EpisodeError):
            self._error_counts[event.kind] = self._error_counts.get(event.kind, 0) + 1
            self._error_total += 1
            self._latest_errors.append(event)
            self._errors_version += 1
        return False

    def _apply_step(self, event: StepLogged) -> None:
        if self.status in ("starting", "loading model"):
            self.status = "training"
        if self._t_train is None:
            self._t_train = self._t_start
        if event.max_steps:
            self.max_steps = event.max_steps
        if self._steps and event.step < self._steps[-1]:  # a resumed run went back to its checkpoint
            _cut_from(event.step, self._steps, *self._metrics.values())
        self.step = event.step
        values = {name: _finite(event.metrics.get(name)) for name in _CURVE_METRICS}
        values["error_rate"] = event.episode_errors / event.episodes if event.episodes else None
        if self._steps and self._steps[-1] == event.step:
            # TRL can log one step twice (train metrics, then the run summary): merge them.
            for name, value in values.items():
                if value is not None:
                    self._metrics[name][-1] = value
        else:
            self._steps.append(float(event.step))
            for name, value in values.items():
                self._metrics[name].append(math.nan if value is None else value)
        self._curves_version += 1

    def _apply_group(self, event: GroupScored) -> None:
        step = event.step
        if self._groups_mem and step < next(reversed(self._groups_mem)):
            for old in [s for s in self._groups_mem if s >= step]:  # a resumed run went back
                del self._groups_mem[old]
        if self._range_steps and step < self._range_steps[-1]:
            _cut_from(step, self._range_steps, self._range_min, self._range_max)
        if step not in self._groups_mem:
            self._groups_mem[step] = []
            while len(self._groups_mem) > self.max_group_steps:
                self._groups_mem.popitem(last=False)  # older steps live on in the run log
            self._group_steps_seen += 1
        self._groups_mem[step].append(event)
        valid = [float(s) for s in event.scores if s is not None]
        if valid:
            lo, hi = min(valid), max(valid)
            if self._range_steps and self._range_steps[-1] == step:
                self._range_min[-1] = min(self._range_min[-1], lo)
                self._range_max[-1] = max(self._range_max[-1], hi)
            else:
                self._range_steps.append(float(step))
                self._range_min.append(lo)
                self._range_max.append(hi)
            self._range_version += 1

    # ---- read-only views ----------------------------------------------------------------

    @property
    def status_text(self) -> str:
        """The status as the header shows it, e.g. ``training``, ``stopping...``, ``failed: <reason>``."""
        if self.status == "stopping" or (self._stop_requested and self._finished is None):
            return "stopping..."
        if self.status == "failed":
            return f"failed: {self.reason}" if self.reason else "failed"
        if self._finished is not None and self.reason and self.status == "stopped":
            return f"stopped: {self.reason}"
        return self.status

    @property
    def reward_png(self) -> bytes:
        return bytes(self._curves.value)

    @property
    def groups_html(self) -> str:
        return self._rendered.get("groups_html", "")

    @property
    def selected_step(self) -> int:
        """The step whose groups are shown (``LATEST`` follows the run)."""
        return self._selected

    def select_step(self, step: int) -> None:
        """Show one step's groups (``LATEST`` to follow the run), as picking it in the dropdown does."""
        with self._lock:
            self._selected = int(step)
            self._rendered.pop("select", None)  # the options must include the selected step
            self._render_select()
            self._render_groups()

    def groups_in_memory(self) -> int:
        """How many groups are held in memory (the rest are in the run log)."""
        return sum(len(v) for v in self._groups_mem.values())

    # ---- display ------------------------------------------------------------------------

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ---- user actions (main thread) -----------------------------------------------------

    def _stop_clicked(self, _button: Any = None) -> None:
        with self._lock:
            if self._finished is not None or self._stop_requested:
                return
            self._stop_requested = True
            with self._stop_button.hold_sync():
                self._stop_button.disabled = True
                self._stop_button.description = "stopping..."
            self._render_header()
        if self._on_stop is not None:
            self._on_stop()

    def _step_selected(self, change: dict[str, Any]) -> None:
        if self._updating_select == threading.get_ident():  # our own options update, not the user
            return
        with self._lock:
            self._selected = int(change["new"])
            self._render_groups()

    # ---- rendering ----------------------------------------------------------------------

    def flush(self) -> None:
        """Render the current state now (the end of a run, a replay, a test)."""
        with self._lock:
            self._render(full=True)

    def _render(self, full: bool = True) -> None:
        """Send what changed since the last render; ``full`` also redraws curves for new groups only."""
        t0 = time.perf_counter()
        self._render_header()
        self._render_curves(full)
        self._render_select()
        self._render_groups()
        self._render_errors()
        self._last_render = time.monotonic()
        self._last_render_cost = time.perf_counter() - t0
        self.render_count += 1
        self.render_seconds += self._last_render_cost

    def _set_once(self, key: str, value: Any, setter: Callable[[Any], None]) -> None:
        if self._rendered.get(key) != value:
            self._rendered[key] = value
            setter(value)

    def _render_header(self) -> None:
        status = self.status_text
        color = _STATUS_COLORS.get(self.status, "#6b7280")
        if self._stop_requested and self._finished is None:
            color = _STATUS_COLORS["stopping"]
        message = (
            f' <span style="opacity:.8">{_esc(self._message)}</span>'
            if self._message and self._finished is None
            else ""
        )
        title = f"GRPO · {_esc(self.env_name)}" if self.env_name else "GRPO"
        header = (
            f'<div style="font-size:15px"><b>{title}</b> '
            f'<span class="grpo-status" style="{_BADGE}background:{color};font-size:12px">{_esc(status)}</span>'
            f"{message}</div>"
        )
        self._set_once("header", header, lambda v: setattr(self._header, "value", v))

        total = self.max_steps or 0
        elapsed = None
        if self._t_start is not None and self._t_last is not None:
            end = self._finished.time if self._finished is not None else self._t_last
            elapsed = end - self._t_start
        eta = None
        done = self.step - self._step_at_train
        if self._finished is None and total and done > 0 and self._t_train is not None and self._t_last:
            per_step = (self._t_last - self._t_train) / done
            eta = per_step * max(total - self.step, 0)
        step_text = f"step {self.step}/{total}" if total else f"step {self.step}"
        progress_text = f"&nbsp;{step_text} · elapsed {_fmt_duration(elapsed)}" + (
            f" · ETA {_fmt_duration(eta)}" if eta is not None else ""
        )
        self._set_once("progress_text", progress_text, lambda v: setattr(self._progress_text, "value", v))
        bar = (max(total, 1), min(self.step, max(total, 1)) if total else 0)
        if self._finished is not None and self.status == "completed":
            bar = (bar[0], bar[0])

        def set_bar(v: tuple[int, int, str]) -> None:
            with self._progress.hold_sync():
                self._progress.max = v[0]
                self._progress.value = v[1]
                self._progress.bar_style = {"failed": "danger", "completed": "success"}.get(v[2], "")

        self._set_once("bar", (*bar, self.status), set_bar)

        parts = []
        if self.model:
            parts.append(f"model <code>{_esc(self.model)}</code>")
        if self.env_name:
            parts.append(f"env <code>{_esc(self.env_name)}</code>")
        if self.output_dir:
            parts.append(f"output <code>{_esc(self.output_dir)}</code>")
        info = " · ".join(parts)
        if self._finished is not None:
            f = self._finished
            if f.reason and f.status == "failed":
                info += f'<div style="color:#dc2626"><b>failed:</b> {_esc(f.reason)}</div>'
            elif f.reason:
                info += f"<div>{_esc(f.status)}: {_esc(f.reason)}</div>"
            if f.saved:
                info += "<div>saved: " + ", ".join(f"<code>{_esc(s)}</code>" for s in f.saved) + "</div>"
        self._set_once("info", info, lambda v: setattr(self._info, "value", v))

        if self._finished is not None:

            def done(_: Any) -> None:
                with self._stop_button.hold_sync():
                    self._stop_button.disabled = True
                    self._stop_button.description = "Stop"

            self._set_once("button", "done", done)

    def _render_curves(self, full: bool) -> None:
        global _curves_cost_seen
        if not self._steps and not self._range_steps:
            return
        drawn = self._rendered.get("curves_version")
        if drawn == (self._curves_version, self._range_version):
            return
        if not full:
            if drawn is not None and drawn[0] == self._curves_version:
                return  # only group min/max moved: wait for the step's metrics
            wait = max(self.throttle_s, min(self._curves_cost / _CURVES_BUDGET, _CURVES_MAX_WAIT))
            if time.monotonic() - self._curves_at < wait:
                return  # drawn by a later render, once the time budget allows (or a forced one)
        self._rendered["curves_version"] = (self._curves_version, self._range_version)
        if self._figure is None:
            self._figure = _Curves()
        t0 = time.perf_counter()
        self._curves.value = self._figure.png(
            self._steps, self._metrics, self._range_steps, self._range_min, self._range_max
        )
        self._curves_cost = _curves_cost_seen = time.perf_counter() - t0
        self._curves_at = time.monotonic()

    def _available_steps(self) -> list[int]:
        """Steps whose groups can be shown: in memory, or older ones when the run log is there."""
        in_mem = list(self._groups_mem)
        reader = self._reader()
        if reader is None:
            return in_mem
        logged = reader.steps()  # sorted; every step in memory is >= min(in_mem)
        older = logged[: bisect.bisect_left(logged, min(in_mem, default=math.inf))]
        if len(older) > _MAX_STEP_OPTIONS:
            stride = math.ceil(len(older) / _MAX_STEP_OPTIONS)
            keep = older[::-stride][::-1]  # thin evenly, always keeping the most recent old step
            older = keep
        return older + in_mem

    def _render_select(self) -> None:
        key = (self._group_steps_seen, tuple(self._groups_mem), self._log_reader is not None)
        if self._rendered.get("select") == key:
            return
        self._rendered["select"] = key
        steps = self._available_steps()
        if self._selected != LATEST and self._selected not in steps:
            steps = sorted([*steps, self._selected])
        options = [("latest", LATEST)] + [(f"step {s}", s) for s in reversed(steps)]
        self._updating_select = threading.get_ident()
        try:
            with self._step_select.hold_sync():
                self._step_select.options = options
                self._step_select.value = self._selected
        finally:
            self._updating_select = None

    def _reader(self) -> _RunLogGroups | None:
        if self._log_reader is None:
            source = self._run_log_arg or self.output_dir
            if source:
                path = run_log_path(source)
                if path.exists():
                    self._log_reader = _RunLogGroups(path)
        return self._log_reader

    def _groups_for(self, step: int) -> list[GroupScored]:
        if step in self._groups_mem:
            return self._groups_mem[step]
        if self._log_cache is not None and self._log_cache[0] == step:
            return self._log_cache[1]
        reader = self._reader()
        groups = reader.groups(step) if reader is not None else []
        if groups:  # a miss may be a log not written yet: ask again next time
            self._log_cache = (step, groups)
        return groups

    def _render_groups(self) -> None:
        step = self._selected
        if step == LATEST:
            step = next(reversed(self._groups_mem)) if self._groups_mem else None
        if step is None:
            key: Any = None
        elif step in self._groups_mem:
            key = (step, len(self._groups_mem[step]))
        else:
            key = (step, "log")
        if "groups_html" in self._rendered and self._rendered.get("groups_key") == key:
            return
        self._rendered["groups_key"] = key
        if step is None:
            content = "<i>no groups scored yet</i>"
        else:
            groups = self._groups_for(step)
            if groups:
                content = groups_html(groups)
            elif step in self._groups_mem:
                content = "<i>no groups scored yet</i>"
            else:
                content = f"<i>the groups of step {step} are not in memory, and no run log has them</i>"
        self._rendered["groups_html"] = content
        self._groups.value = f'<div class="grpo-groups">{content}</div>'

    def _render_errors(self) -> None:
        if self._rendered.get("errors_version") == self._errors_version and "errors" in self._rendered:
            return
        self._rendered["errors_version"] = self._errors_version
        self._rendered["errors"] = True
        if not self._error_total:
            body = "<i>no episode errors</i>"
        else:
            counts = "".join(
                f"<li><b>{_esc(kind)}</b>: {n}</li>"
                for kind, n in sorted(self._error_counts.items(), key=lambda kv: -kv[1])
            )
            latest = "".join(
                f"<details><summary>step {e.step} · #{e.index} · <b>{_esc(e.kind)}</b>: {_esc(e.message)}</summary>"
                f'<pre style="{_PRE_STYLE}">{_esc(e.traceback[-_MAX_TRACEBACK_CHARS:])}</pre></details>'
                for e in reversed(self._latest_errors)
            )
            body = (
                f"<div>{self._error_total} episode errors (their completions got no reward)</div>"
                f'<ul style="margin:4px 0">{counts}</ul><div><b>latest</b></div>{latest}'
            )
        self._errors.value = body
        self._errors_box.set_title(0, f"Episode errors ({self._error_total})")

    # ---- replay -------------------------------------------------------------------------

    def feed(self, events: Iterable[Event]) -> None:
        """Fold many events without rendering in between, then render once."""
        with self._lock:
            self._rendering_enabled = False
            try:
                for event in events:
                    self(event)
            finally:
                self._rendering_enabled = True
            self._render(full=True)


class _Curves:
    """The grid of small curves, drawn with matplotlib's object API on Agg, rendered to PNG.

    The figure, axes and line artists are built once and only their data changes between
    renders: rebuilding the figure (its ticks above all) would cost several times more.
    """

    _PANELS = (
        # (metric, title, color, fixed y-limits)
        ("reward", "mean reward (± std, group min/max)", "#2563eb", None),
        ("kl", "KL", "#7c3aed", None),
        ("loss", "loss", "#0f766e", None),
        ("completions/mean_length", "completion length · clipped share (dashed)", "#2563eb", None),
        ("frac_reward_zero_std", "share of groups with zero reward std", "#d97706", (-0.02, 1.02)),
        ("error_rate", "episode error rate", "#dc2626", None),
    )

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self.fig = Figure(figsize=(10.5, 4.6), dpi=90)  # 945 x 414 px: small text stays sharp
        self.canvas = FigureCanvasAgg(self.fig)
        grid = self.fig.subplots(2, 3)
        self.fig.subplots_adjust(left=0.06, right=0.94, top=0.92, bottom=0.1, wspace=0.32, hspace=0.45)
        self.axes = [ax for row in grid for ax in row]
        self.lines: dict[str, Any] = {}
        self.empty: dict[str, Any] = {}
        for ax, (name, title, color, ylim) in zip(self.axes, self._PANELS, strict=False):
            ax.set_title(title, fontsize=9)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("step", fontsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.25)
            (self.lines[name],) = ax.plot([], [], color=color, linewidth=1.3, markersize=2.5)
            if ylim is not None:
                ax.set_ylim(*ylim)
            self.empty[name] = ax.text(
                0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=8, alpha=0.6
            )
        reward_ax = self.axes[0]
        self.lines["reward"].set_label("mean")
        range_style = {"color": "#6b7280", "linewidth": 0.8, "linestyle": ":", "markersize": 2}
        (self.range_min,) = reward_ax.plot([], [], **range_style)
        (self.range_max,) = reward_ax.plot([], [], label="group min/max", **range_style)
        self.band: Any = None
        self.twin = self.axes[3].twinx()
        self.twin.tick_params(labelsize=7, colors="#d97706")
        self.twin.set_ylim(-0.02, 1.02)
        (self.clipped,) = self.twin.plot([], [], color="#d97706", linewidth=1.0, linestyle="--", markersize=2)

    def png(
        self,
        steps: array,
        metrics: dict[str, array],
        range_steps: array,
        range_min: array,
        range_max: array,
    ) -> bytes:
        import numpy as np

        x = np.frombuffer(steps, dtype=np.float64) if len(steps) else np.zeros(0)
        marker = "o" if len(x) < 60 else ""

        def series(name: str) -> Any:
            return np.frombuffer(metrics[name], dtype=np.float64) if len(metrics[name]) else np.zeros(0)

        for ax, (name, _title, _color, ylim) in zip(self.axes, self._PANELS, strict=False):
            y = series(name)
            line = self.lines[name]
            line.set_data(x, y)
            line.set_marker(marker)
            has = bool(len(y)) and bool(np.isfinite(y).any())
            empty = not has and not (name == "reward" and len(range_steps))
            self.empty[name].set_visible(empty)
            ax.relim()
            ax.autoscale_view(scaley=ylim is None)
            if empty:  # e.g. no KL when rl_kl_coef is 0: the other panels' steps, no made-up y scale
                ax.set_xlim(*((float(x[0]) - 0.5, float(x[-1]) + 0.5) if len(x) else (0.0, 1.0)), auto=None)
                if ylim is None:
                    ax.set_ylim(0.0, 1.0, auto=None)
            ax.tick_params(axis="y", labelleft=not empty)
            if name == "error_rate" and has:
                ax.set_ylim(-0.002, max(0.05, float(np.nanmax(y)) * 1.1))

        reward_ax = self.axes[0]
        if self.band is not None:
            self.band.remove()
            self.band = None
        reward, rstd = series("reward"), series("reward_std")
        if len(reward) and np.isfinite(rstd).any():
            self.band = reward_ax.fill_between(
                x, reward - rstd, reward + rstd, color="#2563eb", alpha=0.18, linewidth=0, label="± std"
            )
        rx = np.frombuffer(range_steps, dtype=np.float64) if len(range_steps) else np.zeros(0)
        rmarker = "o" if len(rx) < 60 else ""
        self.range_min.set_data(rx, np.frombuffer(range_min, dtype=np.float64) if len(rx) else rx)
        self.range_max.set_data(rx, np.frombuffer(range_max, dtype=np.float64) if len(rx) else rx)
        self.range_min.set_marker(rmarker)
        self.range_max.set_marker(rmarker)
        reward_ax.relim()
        reward_ax.autoscale_view()
        if len(x) or len(rx):  # rebuilt each time: its handles copy the lines' current markers
            reward_ax.legend(fontsize=6, loc="upper left", frameon=False)

        clipped = series("completions/clipped_ratio")
        self.clipped.set_data(x, clipped)
        self.clipped.set_marker(marker)
        self.twin.set_visible(bool(len(clipped)) and bool(np.isfinite(clipped).any()))

        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return buf.getvalue()


def replay(output_dir: str) -> Dashboard:
    """A dashboard rebuilt from a run's log: the log is read as data, nothing in it is executed."""
    dash = Dashboard(run_log=str(output_dir))
    dash.feed(read_run_log(output_dir))
    return dash
