"""The notebook dashboard: the one object that displays a run, with core ipywidgets.

It subscribes to the run's event stream, folds each event into a ``RunView`` (``state``) and
renders that view with the pure builders of ``html``, the live curves of ``chart`` (SVG, with the
notes of ``notes``) and, when asked, the PNG of ``curves``. It never reaches
into the trainer (docs/architecture.md, "The dashboard"): everything it shows comes from events,
so ``replay(output_dir)`` rebuilds the same view from the run log. The training thread is the only
writer during a run; renders are throttled and batched with ``hold_sync`` so a fast run does not
flood the browser. Older steps' groups are read back from the run log (``events.RunLogIndex``)
when the user selects them.

ipywidgets and matplotlib are imported lazily, in ``Dashboard.__init__`` and the plot code, so
that importing this module (and ``%load_ext grpo_magic``) stays light.
"""

from __future__ import annotations

import base64
import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..events import (
    Event,
    GroupScored,
    RunLogIndex,
    RunStarted,
    StatusChanged,
    StepLogged,
    read_run_log,
    run_log_path,
)
from . import html
from .chart import LineCache, chart_html
from .curves import Curves
from .notes import notes
from .state import RunView

LATEST = -1
"""Dropdown value meaning "follow the latest step" (steps themselves are >= 0)."""

_MAX_STEP_OPTIONS = 200  # the step selector lists at most this many old steps (thinned evenly)
# The curves follow the steps: they are redrawn (SVG, ``chart``, ~0.3 ms) at a logged step,
# outside the throttle of the other parts, whenever the whole dashboard's time so far (events,
# renders and curves) plus one more drawing stays within _CURVES_BUDGET of the time since training
# started, and at most every _CURVES_MIN_INTERVAL seconds (a browser is not sent more than 50 a
# second). The curves thus get what the rest of the dashboard leaves of 1%: with 40-50 ms CPU steps
# about every other step headless, every third in a kernel (sending an update costs as much as
# drawing it there); bench/run.py measures it (curve_updates_per_step, the dashboard's share).
_CURVES_BUDGET = 0.01
_CURVES_MIN_INTERVAL = 0.02
# The other parts (header, step selector, groups, errors) are redrawn on the throttle, but never so
# often that they take more than a quarter of that budget: the wait between their renders is at
# least their last render's cost divided by _RENDER_SHARE (a 1.5 ms render: 0.6 s), up to
# _MAX_RENDER_WAIT. Without that floor, renders that cost 1-3 ms in a kernel (the widget messages
# are built and sent from the training thread) ate the whole 1% when steps are 20-30 ms, and the
# curves stopped following; folding the events takes about another 0.4% of such steps.
_RENDER_SHARE = _CURVES_BUDGET / 4
_MAX_RENDER_WAIT = 2.0
_curves_cost_seen = 0.001  # the last drawing's cost in this process: the next run's first estimate


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
        self.view = RunView(max_group_steps)
        self._run_log_arg = run_log
        self._log_reader: RunLogIndex | None = None
        self._log_cache: tuple[int, list[GroupScored]] | None = None
        self._selected = LATEST
        self._lock = threading.RLock()
        self._rendering_enabled = True
        self._last_render = -math.inf
        self._last_render_cost = 0.0
        self._curves_at = -math.inf  # when the curves were last drawn (time.monotonic)
        self._curves_cost = _curves_cost_seen  # what that drawing cost (seconds)
        self._curves_clock = time.monotonic()  # the budget's start: training's start, once it starts
        self.training_busy_seconds = 0.0  # time spent in this dashboard (events, renders, curves) while training
        self.curve_updates = 0  # how many times the curves were updated (sent to the page)
        self.curve_seconds = 0.0  # and the time that took, in total
        self.render_count = 0
        self.render_seconds = 0.0
        self.busy_seconds = 0.0  # all the time spent handling events (renders and curves included)
        self._figure: Curves | None = None  # the PNG's figure, built on first use
        self._png: tuple[Any, bytes] = (None, b"")  # (what it shows, the PNG)
        self._lines = LineCache()  # the curves' lines so far: a redraw formats only the new points

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
        self._curves = widgets.HTML(layout=widgets.Layout(width="100%"))
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

    # ---- events -------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        """Subscriber: update the view, then render if the throttle allows (or must).

        The wait between renders is ``throttle_s``, or longer when the last render was costly
        (see ``_RENDER_SHARE``): the other parts keep within a quarter of the dashboard's 1%, and the
        curves, drawn at logged steps in between, get what is left.
        """
        t0 = time.perf_counter()
        with self._lock:
            try:
                self._handle(event)
            finally:
                cost = time.perf_counter() - t0
                self.busy_seconds += cost
                if self.view.t_train is not None and self.view.finished is None:  # the budget's time: training's
                    self.training_busy_seconds += cost

    def _handle(self, event: Event) -> None:
        """Fold one event into the view and render what is due (under the lock)."""
        training_starts = isinstance(event, StatusChanged) and event.status == "training" and not self.view.t_train
        force = self.view.apply(event)
        if isinstance(event, RunStarted):
            self._log_cache = None
            self._log_reader = None
            self._rendered.clear()
        elif training_starts:
            self._curves_clock = time.monotonic()  # the budget counts training time
            self.training_busy_seconds = 0.0
        if not self._rendering_enabled:
            return
        wait = max(self.throttle_s, min(self._last_render_cost / _RENDER_SHARE, _MAX_RENDER_WAIT))
        if force or time.monotonic() - self._last_render >= wait:
            self._render(full=force)
        elif isinstance(event, StepLogged):
            self._render_curves(False)  # the curves follow the steps, not the throttle

    def feed(self, events: Iterable[Event]) -> None:
        """Fold many events without rendering in between, then render once (a replay)."""
        with self._lock:
            self._rendering_enabled = False
            try:
                for event in events:
                    self(event)
            finally:
                self._rendering_enabled = True
            self._render(full=True)

    # ---- read-only views ----------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.view.step

    @property
    def status_text(self) -> str:
        """The status as the header shows it, e.g. ``training``, ``stopping...``, ``failed: <reason>``."""
        return self.view.status_text

    @property
    def max_group_steps(self) -> int:
        return self.view.max_group_steps

    @property
    def reward_png(self) -> bytes:
        """The curves as a PNG (matplotlib), drawn now if they changed since the last one; b"" with no data."""
        with self._lock:
            view = self.view
            if not view.steps and not view.range_steps:
                return b""
            key = (view.curves_version, view.range_version)
            if self._png[0] != key:
                panels = view.panels()
                if self._figure is None or self._figure.panels != panels:  # a component or tool panel appeared
                    self._figure = Curves(panels)
                series = {s.metric: view.series(s.metric) for p in panels for s in p.series}
                png = self._figure.png(view.steps, {**view.metrics, **series}, view.range_steps, view.range_min,
                                       view.range_max, view.markers, evals=getattr(view, "evals", []))
                self._png = (key, png)
            return self._png[1]

    @property
    def curves_html(self) -> str:
        """The live curves as the page has them: SVG panels, with their notes."""
        return str(self._curves.value)

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
        return self.view.groups_in_memory()

    # ---- display ------------------------------------------------------------------------

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, and for frontends that show no widgets (a saved notebook on GitHub, nbconvert) the
        PNG of the curves so far (none yet at the start of a live run; a replay's are complete)."""
        bundle = dict(self.widget._repr_mimebundle_(**kwargs))
        png = self.reward_png
        if png:
            bundle["image/png"] = base64.b64encode(png).decode("ascii")
        return bundle

    # ---- user actions (main thread) -----------------------------------------------------

    def _stop_clicked(self, _button: Any = None) -> None:
        with self._lock:
            if self.view.finished is not None or self.view.stop_requested:
                return
            self.view.stop_requested = True
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
        t0, curves0 = time.perf_counter(), self.curve_seconds
        self._render_header()
        self._render_curves(full)
        self._render_select()
        self._render_groups()
        self._render_errors()
        self._last_render = time.monotonic()
        cost = time.perf_counter() - t0
        self._last_render_cost = cost - (self.curve_seconds - curves0)  # the curves have their own account
        self.render_count += 1
        self.render_seconds += cost

    def _set_once(self, key: str, value: Any, setter: Callable[[Any], None]) -> None:
        if self._rendered.get(key) != value:
            self._rendered[key] = value
            setter(value)

    def _render_header(self) -> None:
        view = self.view
        self._set_once("header", html.header_html(view), lambda v: setattr(self._header, "value", v))
        self._set_once("progress_text", html.progress_text(view), lambda v: setattr(self._progress_text, "value", v))
        total = view.max_steps or 0
        bar = (max(total, 1), min(view.step, max(total, 1)) if total else 0)
        if view.finished is not None and view.status == "completed":
            bar = (bar[0], bar[0])

        def set_bar(v: tuple[int, int, str]) -> None:
            with self._progress.hold_sync():
                self._progress.max = v[0]
                self._progress.value = v[1]
                self._progress.bar_style = {"failed": "danger", "completed": "success"}.get(v[2], "")

        self._set_once("bar", (*bar, view.status), set_bar)
        self._set_once("info", html.info_html(view), lambda v: setattr(self._info, "value", v))
        if view.finished is not None:

            def done(_: Any) -> None:
                with self._stop_button.hold_sync():
                    self._stop_button.disabled = True
                    self._stop_button.description = "Stop"

            self._set_once("button", "done", done)

    def _render_curves(self, full: bool) -> None:
        """Redraw the live curves if a step came in, within the time budget (``full``: now, whatever it says)."""
        global _curves_cost_seen
        view = self.view
        if not view.steps and not view.range_steps:
            return
        drawn = self._rendered.get("curves_version")
        if drawn == (view.curves_version, view.range_version):
            return
        if not full:
            if drawn is not None and drawn[0] == view.curves_version:
                return  # only group min/max moved: wait for the step's metrics
            now = time.monotonic()
            if now - self._curves_at < _CURVES_MIN_INTERVAL:
                return
            if self.training_busy_seconds + self._curves_cost > _CURVES_BUDGET * (now - self._curves_clock):
                return  # drawn at a later step, once the budget allows (or by a forced render)
        self._rendered["curves_version"] = (view.curves_version, view.range_version)
        t0 = time.perf_counter()
        content = chart_html(view, notes(view), cache=self._lines)
        if self._rendered.get("curves_html") != content:
            self._rendered["curves_html"] = content
            self._curves.value = content
            self.curve_updates += 1
        cost = time.perf_counter() - t0
        self._curves_cost = _curves_cost_seen = cost
        self.curve_seconds += cost
        self._curves_at = time.monotonic()

    def _available_steps(self) -> list[int]:
        """Steps whose groups can be shown: in memory, or older ones when the run log is there."""
        in_mem = list(self.view.groups_mem)
        reader = self._reader()
        if reader is None:
            return in_mem
        logged = reader.steps()  # sorted; every step in memory is >= min(in_mem)
        older = logged[: bisect.bisect_left(logged, min(in_mem, default=math.inf))]
        if len(older) > _MAX_STEP_OPTIONS:
            stride = math.ceil(len(older) / _MAX_STEP_OPTIONS)
            older = older[::-stride][::-1]  # thin evenly, always keeping the most recent old step
        return older + in_mem

    def _render_select(self) -> None:
        key = (self.view.group_steps_seen, tuple(self.view.groups_mem), self._log_reader is not None)
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

    def _reader(self) -> RunLogIndex | None:
        if self._log_reader is None:
            source = self._run_log_arg or self.view.output_dir
            if source:
                path = run_log_path(source)
                if path.exists():
                    self._log_reader = RunLogIndex(path)
        return self._log_reader

    def _groups_for(self, step: int) -> list[GroupScored]:
        if step in self.view.groups_mem:
            return self.view.groups_mem[step]
        if self._log_cache is not None and self._log_cache[0] == step:
            return self._log_cache[1]
        reader = self._reader()
        groups = reader.groups(step) if reader is not None else []
        if groups:  # a miss may be a log not written yet: ask again next time
            self._log_cache = (step, groups)
        return groups

    def _render_groups(self) -> None:
        step = self._selected
        in_mem = self.view.groups_mem
        if step == LATEST:
            step = self.view.latest_group_step()
        if step is None:
            key: Any = None
        elif step in in_mem:
            key = (step, len(in_mem[step]))
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
                content = html.groups_html(groups)
            elif step in in_mem:
                content = "<i>no groups scored yet</i>"
            else:
                content = f"<i>the groups of step {step} are not in memory, and no run log has them</i>"
        self._rendered["groups_html"] = content
        self._groups.value = f'<div class="grpo-groups">{content}</div>'

    def _render_errors(self) -> None:
        if self._rendered.get("errors_version") == self.view.errors_version and "errors" in self._rendered:
            return
        self._rendered["errors_version"] = self.view.errors_version
        self._rendered["errors"] = True
        self._errors.value = html.errors_html(self.view)
        self._errors_box.set_title(0, f"Episode errors ({self.view.error_total})")


def replay(output_dir: str) -> Dashboard:
    """A dashboard rebuilt from a run's log: the log is read as data, nothing in it is executed.

    A line that is not an event (cut short by a kill mid-write, damaged) is skipped and named in a
    note under the header; the rest of the run shows as usual.
    """
    dash = Dashboard(run_log=str(output_dir))
    dash.feed(read_run_log(output_dir, skipped=dash.view.notes))
    return dash
