"""The notebook dashboard: the one object that displays a run (core ipywidgets, and the curves widget).

It subscribes to the run's event stream. The training thread only hands each event over (a deque
append, microseconds); one renderer thread folds the queue into a ``RunView`` (``state``) a fixed few
times a second (``interval_s``) and sends what changed: new curve points (``live``: the page draws
them with uPlot), new or changed group cards (``html``), the header. Nothing waits for the browser:
a slow or closed page only receives its messages later. It never reaches into the trainer
(docs/architecture.md, "The dashboard"): everything it shows comes from events, so
``replay(output_dir)`` rebuilds the same view from the run log. Older steps' groups are read back
from the run log (``events.RunLogIndex``) when the user selects them (the dropdown, or a click on
the reward curve). The matplotlib PNG (``curves``) is drawn only when asked for: frontends that show
no widgets (nbconvert, GitHub), exports, ``replay(static=True)``.

ipywidgets, anywidget and matplotlib are imported lazily, in ``Dashboard.__init__`` and the plot
code, so that importing this module (and ``%load_ext grpo_magic``) stays light.
"""

from __future__ import annotations

import base64
import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from grpo_magic.events import (
    AlarmRaised,
    EnvSwapped,
    Event,
    GroupScored,
    RunFinished,
    RunLogIndex,
    RunStarted,
    StatusChanged,
    read_run_log,
    run_log_path,
)

from . import html
from .curves import Curves
from .live import LiveCurves, summary_html
from .state import RunView

LATEST = -1
"""Dropdown value meaning "follow the latest step" (steps themselves are >= 0)."""

_MAX_STEP_OPTIONS = 200  # the step selector lists at most this many old steps (thinned evenly)
RENDER_INTERVAL = 0.25  # seconds between the renderer's folds: a few times a second, whatever the step time
_IDLE_EXIT = 5.0  # the renderer thread ends after this long without events (the next event starts it again)
_SLOW_PARTS_S = 1.0  # header and progress, step selector, group cards, errors, notes: at most once a second
_END_WAIT = 2.0  # the longest the end of a run waits for a render in progress
_SHOW_AT_ONCE = (RunStarted, StatusChanged, RunFinished, EnvSwapped, AlarmRaised)  # the renderer wakes for these


class Dashboard:
    """Live view of one run, fed event by event (subscribe it to the run's ``EventStream``).

    ``on_stop`` is called by the Stop button (hidden when None, e.g. for a replay).
    ``max_group_steps`` steps of groups stay in memory; older ones come from ``run_log``
    (a run folder or its ``events.jsonl``; defaults to the ``output_dir`` of ``RunStarted``).
    ``interval_s``: the renderer's fixed wait between folds of the queued events (None: no renderer
    thread, whoever holds the dashboard calls ``flush``).
    """

    def __init__(
        self,
        *,
        on_stop: Callable[[], None] | None = None,
        interval_s: float | None = RENDER_INTERVAL,
        max_group_steps: int = 5,
        run_log: str | None = None,
    ) -> None:
        import ipywidgets as widgets

        self._on_stop = on_stop
        self.interval_s = interval_s
        self.view = RunView(max_group_steps)
        self._run_log_arg = run_log
        self._log_reader: RunLogIndex | None = None
        self._log_cache: tuple[int, list[GroupScored]] | None = None
        self._selected = LATEST
        self._lock = threading.RLock()  # the view and the widgets: the renderer and the main thread
        self._queue: deque[Event] = deque()  # events handed over by the training thread, not folded yet
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()  # starting and ending the renderer thread
        self.render_count = 0  # renders (folds that sent what changed)
        self.render_seconds = 0.0  # their time, in the renderer thread (or whoever flushed)
        self._figure: Curves | None = None  # the PNG's figure, built on first use
        self._png: tuple[Any, bytes] = (None, b"")  # (what it shows, the PNG)
        self._displays: list[Any] = []  # display handles of a live run, updated when it ends
        self._slow_at = -math.inf  # when the renderer last drew the slower parts
        self._slow_pending = False  # a turn since then left them out (the renderer draws them once due)

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
        self._alarms = widgets.HTML()  # the reward-hacking watch's alarm cards (empty until one fires)
        self._live = LiveCurves(self._lock, on_select=self.select_step)
        self._curves = self._live.widget
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
                self._alarms,
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
            (self._alarms, "grpo-alarms"),
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
        """Subscriber: hand the event over to the renderer and return (the training thread waits for nothing).

        The end of a run (``RunFinished``) is folded and rendered at once, in the caller's thread, so
        that what the page and ``run.dashboard`` show when ``train`` returns is the whole run (unless
        a render is stuck sending for more than ``_END_WAIT``: then the renderer shows it later).
        """
        self._queue.append(event)  # deque.append is atomic: no lock on the training thread
        if isinstance(event, RunFinished) and self._lock.acquire(timeout=_END_WAIT):
            try:  # the end of a run, rendered here unless a render is stuck (then the renderer does it)
                # Folded, then the displays given the final bundle (its PNG drawn from the folded view), then the
                # widgets' final state sent: a page re-creates its views before it shows "completed", so nothing
                # a reader (or a browser test) holds after that is replaced under it.
                self._drain()
                self._update_displays()
                self._render()
            finally:
                self._lock.release()
            return
        if isinstance(event, _SHOW_AT_ONCE):
            self._wake.set()
        if self._thread is None and self.interval_s is not None:
            self._start_renderer()

    def _start_renderer(self) -> None:
        with self._thread_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._renderer, name="grpo-dashboard", daemon=True)
                self._thread.start()

    def _renderer(self) -> None:
        """Fold the queue and send the changes every ``interval_s`` (sooner for a status change)."""
        idle = 0.0
        while True:
            self._wake.wait(self.interval_s or RENDER_INTERVAL)
            self._wake.clear()
            if self._queue or self._slow_due():
                idle = 0.0
                try:
                    self._turn()
                except Exception:  # noqa: BLE001 - a display error must not end the renderer (or the run)
                    import traceback

                    traceback.print_exc()
            else:
                idle += self.interval_s or RENDER_INTERVAL
            with self._thread_lock:  # an event appended before this check is seen; one after starts a new thread
                if not self._queue and not self._slow_pending and (
                        idle >= _IDLE_EXIT or self.view.finished is not None):
                    self._thread = None
                    return

    def _slow_due(self) -> bool:
        """True when a turn left the slower parts behind and their second has passed: a step that takes long
        still gets its header and cards within a second, without waiting for the next event."""
        return self._slow_pending and time.monotonic() - self._slow_at >= _SLOW_PARTS_S

    def _drain(self) -> bool:
        """Fold the queued events into the view (under the lock); True when one must show at once."""
        force = False
        while self._queue:
            event = self._queue.popleft()
            force = self.view.apply(event) or force
            if isinstance(event, RunStarted):
                self._log_cache = None
                self._log_reader = None
                self._rendered.clear()
        return force

    def feed(self, events: Iterable[Event]) -> None:
        """Fold many events, then render once (a replay, or a resumed run's history)."""
        with self._lock:
            self._drain()
            for event in events:
                self.view.apply(event)
                if isinstance(event, RunStarted):
                    self._log_cache = None
                    self._log_reader = None
            self._render()

    @property
    def pending(self) -> int:
        """Events handed over and not folded yet (the renderer takes them at its next turn)."""
        return len(self._queue)

    @property
    def curve_updates(self) -> int:
        """How many messages brought new curve points to the page."""
        return self._live.feed.updates

    @property
    def points_sent(self) -> int:
        """Logged steps sent to the page (each once; the page holds exactly the run's logged steps)."""
        return self._live.feed.points

    # ---- read-only views ----------------------------------------------------------------

    def folded(self) -> RunView:
        """The view with every event handed over so far folded in (``view`` itself is the renderer's,
        a turn behind the events)."""
        with self._lock:
            self._drain()
            return self.view

    @property
    def step(self) -> int:
        return self.folded().step

    @property
    def status_text(self) -> str:
        """The status as the header shows it, e.g. ``training``, ``stopping...``, ``failed: <reason>``."""
        return self.folded().status_text

    @property
    def max_group_steps(self) -> int:
        return self.view.max_group_steps

    @property
    def reward_png(self) -> bytes:
        """The curves as a PNG (matplotlib), drawn now if they changed since the last one; b"" with no data."""
        with self._lock:
            view = self.folded()
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
        """The curves in words (each panel's title, latest values and note): what the page draws, as text."""
        return summary_html(self.folded())

    @property
    def curves_sent(self) -> dict[str, Any]:
        """What the page has been sent of the curves: the panels, and the rows (what a reset would send)."""
        self.flush()
        with self._lock:
            return {"spec": list(self._curves.spec), "notes": dict(self._curves.notes),
                    "rows": self._live.feed.rows}

    @property
    def groups_html(self) -> str:
        self.flush()
        return self._rendered.get("groups_html", "")

    @property
    def alarms_html(self) -> str:
        """The alarm cards (the reward-hacking watch's ``AlarmRaised`` events) as shown; "" when none fired."""
        self.flush()
        return self._alarms.value

    @property
    def alarms(self) -> list[dict[str, Any]]:
        """The alarms shown, as ``run.alarms`` gives them: dicts with ``kind``, ``step``, ``message``, ``evidence``."""
        return [dict(a) for a in self.folded().alarms]

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
        return self.folded().groups_in_memory()

    # ---- display ------------------------------------------------------------------------

    def _ipython_display_(self) -> None:
        from IPython.display import display

        handle = display(self._repr_mimebundle_(), raw=True, display_id=True)
        if handle is not None and self.view.finished is None:
            self._displays.append(handle)  # updated at the end of the run: the saved notebook gets the PNG

    def _update_displays(self) -> None:
        """At the end of a blocking run, give each of its displays the final bundle (widget and PNG), so that
        a notebook executed by nbconvert/nbclient, or saved and opened on GitHub, shows the whole run."""
        handles, self._displays = self._displays, []
        if not handles or threading.current_thread() is not threading.main_thread():
            # A background run (``--run``): its cell is long done, so nbconvert has saved it already, and a
            # re-created view in a live page would stay empty until the busy kernel answers its hello.
            return
        bundle = self._repr_mimebundle_()
        for handle in handles:
            try:
                handle.update(bundle, raw=True)
            except Exception:  # noqa: BLE001 - a closed frontend: nothing to update
                pass

    def __str__(self) -> str:
        """The dashboard in words: title and status, progress, model and folder, the alarms (one line each, and
        their window's values), the curves' latest values."""
        view = self.folded()
        parts = [html.header_html(view), html.progress_text(view), html.info_html(view)]
        text = [t for t in map(_plain, parts) if t] + [html.alarms_text(view), _plain(summary_html(view))]
        return "\n".join(t for t in text if t)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, and for frontends that show no widgets (a saved notebook on GitHub, nbconvert) the
        PNG of the curves so far (none yet at the start of a live run; a replay's are complete), and for
        IPython in a terminal the dashboard in words (``str``)."""
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = str(self)
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
        """Fold what was handed over and render all of it now (the end of a run, a replay, a test)."""
        with self._lock:
            self._drain()
            self._render()

    def _turn(self) -> None:
        """The renderer's turn: the curves' new points every time; the header and progress, the step selector,
        the group cards, the errors and the notes at most every ``_SLOW_PARTS_S`` (or at once for a status)."""
        with self._lock:
            force = self._drain()
            now = time.monotonic()
            every = force or now - self._slow_at >= _SLOW_PARTS_S
            if every:
                self._slow_at = now
            self._render(every)

    def _render(self, every: bool = True) -> None:
        """Send what changed since the last render: the curves' new points, and (``every``) the other parts.

        The header's step counter, progress bar and clock go with the slower parts (a status change forces
        them at once): each part changed is one message over the kernel's sockets, which is most of a turn's
        cost in a kernel (bench/RESULTS.md), and a counter read once a second loses nothing.
        """
        t0 = time.perf_counter()
        self._slow_pending = not every
        if every:
            self._render_header()
        self._live.update(self.view, notes=every)
        if every:
            self._render_select()
            self._render_groups()
            self._render_errors()
            self._render_alarms()
        self.render_count += 1
        self.render_seconds += time.perf_counter() - t0

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

    def _render_alarms(self) -> None:
        if self._rendered.get("alarms_version") == self.view.alarms_version:
            return
        self._rendered["alarms_version"] = self.view.alarms_version
        self._alarms.value = html.alarms_html(self.view)

    def _render_errors(self) -> None:
        if self._rendered.get("errors_version") == self.view.errors_version and "errors" in self._rendered:
            return
        self._rendered["errors_version"] = self.view.errors_version
        self._rendered["errors"] = True
        self._errors.value = html.errors_html(self.view)
        self._errors_box.set_title(0, f"Episode errors ({self.view.error_total})")


def replay(output_dir: str, static: bool = False) -> Any:
    """A dashboard rebuilt from a run's log: the log is read as data, nothing in it is executed.

    A line that is not an event (cut short by a kill mid-write, damaged) is skipped and named in a
    note under the header; the rest of the run shows as usual. ``static``: only the curves' PNG (an
    ``IPython.display.Image``), for a frontend that shows no widgets or a report.
    """
    dash = Dashboard(run_log=str(output_dir))
    dash.feed(read_run_log(output_dir, skipped=dash.view.notes))
    if static:
        from IPython.display import Image

        return Image(data=dash.reward_png, format="png")
    return dash


def _plain(markup: str) -> str:
    """HTML as terminal text: block ends become line ends, tags go, entities are decoded, blank lines dropped."""
    import html as html_lib
    import re

    text = re.sub(r"<br\s*/?>|</(div|p|li|tr|h\d)>", "\n", markup)
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", text)).replace("\xa0", " ")
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())

