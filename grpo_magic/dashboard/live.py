"""The live curves: an ``anywidget`` widget whose front end (uPlot, ``static/``) draws them in the page.

The kernel never draws: it sends what is new. ``CurveFeed`` remembers what the page was sent of a
``RunView`` and turns the view's changes into small messages: ``reset`` (every row, when the panels
change, a resumed run cuts history, or a page asks with ``hello``), ``append`` (the rows from
``start`` on; the last row sent goes again, since TRL may log a step twice and the groups' min/max
of a step may still grow) and ``overlay`` (markers, evaluations). The page keeps the series, their
smoothing, zoom and legend state; a click on the reward curve comes back as ``select``.

anywidget (a maintained library) is used so that the widget renders in JupyterLab, Notebook 7, VS
Code and Colab with no extension of ours to install. uPlot 1.6 (MIT, ``static/uPlot.LICENSE``) is
shipped inside the package, so an offline notebook draws too. Neither is imported with this module.
"""

from __future__ import annotations

import bisect
import functools
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .notes import notes as notes_of
from .panels import Panel
from .state import RunView

STATIC = Path(__file__).with_name("static")
#: The default smoothing weight (an exponential moving average, as TensorBoard's slider).
SMOOTHING = 0.6
#: Panels whose y axis can be switched to a log scale (an asinh scale: loss can be negative or zero).
LOG_PANELS = frozenset({"loss", "kl"})


def _clean(values: Sequence[float]) -> list[float | None]:
    """JSON-safe numbers: NaN and infinities (a step that did not log the metric) become null."""
    return [v if v == v and v not in (math.inf, -math.inf) else None for v in values]


def panel_spec(panels: Sequence[Panel]) -> list[dict[str, Any]]:
    """What the page needs to lay out these panels (sent once, and again when a panel appears)."""
    return [
        {
            "key": p.key,
            "title": p.title,
            "series": [
                {"col": s.metric, "label": s.label or s.metric, "color": s.color, "dashed": s.dashed, "share": s.share}
                for s in p.series
            ],
            "band": p.band,
            "group_range": p.group_range,
            "ylim": list(p.ylim) if p.ylim else None,
            "min_top": p.min_top,
            "log": p.key in LOG_PANELS,
        }
        for p in panels
    ]


def _columns(panels: Sequence[Panel]) -> list[str]:
    names: dict[str, None] = {}
    for p in panels:
        for metric in p.metrics:
            names[metric] = None
        if p.group_range:
            names["range_min"] = names["range_max"] = None
    return list(names)


def evals_of(view: RunView, color: str | None = None) -> list[list[Any]]:
    """The in-run evaluations (``state.evals``, kept by grpo_magic.evaluate) as [step, value] points.

    The value is the greedy mean, or the sampled mean where a run has no greedy episodes (agent envs during a
    run), as the PNG draws them. With ``color`` each point is [step, value, color]: the page draws one set of
    points and one baseline line (the first evaluation's value) per color, so compared runs keep theirs apart.
    """
    out: list[list[Any]] = []
    for e in getattr(view, "evals", None) or []:
        if not isinstance(e, dict):
            continue
        value = e.get("greedy_mean")
        if value is None:
            value = e.get("sampled_mean")
        try:
            step, value = float(e["step"]), float(value)
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(step) and math.isfinite(value):
            out.append([step, value] if color is None else [step, value, color])
    return out


class CurveFeed:
    """What the page has of a ``RunView``'s curves, and the messages that bring it up to date."""

    def __init__(self) -> None:
        self.rows = 0  # rows of the view the page has
        self.cuts = -1
        self.panels: tuple[Panel, ...] = ()
        self.version: tuple[int, int] = (-1, -1)
        self.overlay: tuple[Any, Any] = ([], [])
        self.updates = 0  # messages that brought new points
        self.points = 0  # logged steps sent (each once, but for the last one sent again)

    def _rows(self, view: RunView, start: int) -> dict[str, Any]:
        stop = len(view.steps)
        columns: dict[str, list[float | None]] = {}
        for name in _columns(self.panels):
            if name in ("range_min", "range_max"):
                continue
            columns[name] = _clean(view.series(name)[start:stop])
        if any(p.group_range for p in self.panels):
            low, high = [], []
            for x in view.steps[start:stop]:  # the groups' min/max of each logged step (scored before it is logged)
                i = bisect.bisect_left(view.range_steps, x)
                hit = i < len(view.range_steps) and view.range_steps[i] == x
                low.append(view.range_min[i] if hit else None)
                high.append(view.range_max[i] if hit else None)
            columns["range_min"], columns["range_max"] = low, high
        return {
            "start": start,
            "x": [round(x) if x == int(x) else x for x in view.steps[start:stop]],
            "columns": columns,
        }

    def reset(self, view: RunView) -> dict[str, Any]:
        """Every row so far (and the overlays): the page drops what it had."""
        self.panels = view.panels()
        self.cuts = view.cuts
        self.version = (view.curves_version, view.range_version)
        self.overlay = ([list(m) for m in view.markers], evals_of(view))
        msg = {"kind": "reset", **self._rows(view, 0), "markers": self.overlay[0], "evals": self.overlay[1]}
        self.points += len(view.steps) - self.rows if len(view.steps) > self.rows else 0
        self.rows = len(view.steps)
        self.updates += 1
        return msg

    def changes(self, view: RunView) -> list[dict[str, Any]]:
        """The messages that bring the page from what it has to ``view`` (none when nothing changed)."""
        if view.panels() != self.panels or view.cuts != self.cuts or len(view.steps) < self.rows:
            return [self.reset(view)] if len(view.steps) else []
        out = []
        version = (view.curves_version, view.range_version)
        if version != self.version and len(view.steps):
            self.version = version
            start = max(0, self.rows - 1)
            out.append({"kind": "append", **self._rows(view, start)})
            self.points += len(view.steps) - self.rows
            self.rows = len(view.steps)
            self.updates += 1
        overlay = ([list(m) for m in view.markers], evals_of(view))
        if overlay != self.overlay:
            self.overlay = overlay
            out.append({"kind": "overlay", "markers": overlay[0], "evals": overlay[1]})
        return out


@functools.cache
def _widget_class() -> type:
    """The anywidget class, built on first use (anywidget imports ipywidgets)."""
    import anywidget
    import traitlets

    # uPlot's build for <script> tags defines a global; wrapped so that the module gets it as a local.
    esm = (
        "const uPlot = (function () {\n"
        + (STATIC / "uPlot.iife.min.js").read_text(encoding="utf-8")
        + "\nreturn uPlot;\n})();\n"
        + (STATIC / "curves.js").read_text(encoding="utf-8")
    )
    css = (
        (STATIC / "uPlot.min.css").read_text(encoding="utf-8")
        + "\n"
        + (STATIC / "curves.css").read_text(encoding="utf-8")
    )

    class CurvesWidget(anywidget.AnyWidget):
        """The curves in the page: panels (``spec``), notes and caption synced; rows sent as messages."""

        _esm = esm
        _css = css
        spec = traitlets.List().tag(sync=True)
        notes = traitlets.Dict().tag(sync=True)
        caption = traitlets.Unicode("").tag(sync=True)
        smoothing = traitlets.Float(SMOOTHING).tag(sync=True)
        sync_key = traitlets.Unicode("grpo").tag(sync=True)

    return CurvesWidget


class LiveCurves:
    """A run's curves widget and its feed. ``update(view)`` sends what is new; the caller holds ``lock``
    (the dashboard's), which ``hello`` from a page takes too, so that a reset and an append never cross."""

    def __init__(self, lock: Any, on_select: Callable[[int], None] | None = None) -> None:
        import secrets

        self.widget = _widget_class()(sync_key=f"grpo-{secrets.token_hex(4)}")
        self.widget.add_class("grpo-curves")
        self.feed = CurveFeed()
        self._lock = lock
        self._on_select = on_select
        self._view: RunView | None = None
        self._notes: dict[str, list[str]] = {}
        self._panels: tuple[Panel, ...] = ()
        self.widget.on_msg(self._on_msg)

    def update(self, view: RunView, notes: bool = True) -> int:
        """Send the changes of ``view`` since the last update (``notes``: the notes too); returns how many
        messages went."""
        self._view = view
        messages = self.feed.changes(view)
        if not messages and not notes:
            return 0
        with self.widget.hold_sync():
            if self.feed.panels != self._panels:  # a reset: a panel appeared (components, tools)
                self._panels = self.feed.panels
                self.widget.spec = panel_spec(self._panels)
            if notes:
                found = {k: [n.headline, n.text] for k, n in notes_of(view).items()}
                if found != self._notes:
                    self._notes = found
                    self.widget.notes = found
        for msg in messages:
            self.widget.send(msg)
        return len(messages)

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("kind") == "hello":
            with self._lock:
                if self._view is not None and len(self._view.steps):
                    self.widget.send(self.feed.reset(self._view))
        elif content.get("kind") == "select" and self._on_select is not None:
            try:
                step = int(content["step"])
            except (KeyError, TypeError, ValueError):
                return
            self._on_select(step)


def summary_html(view: RunView) -> str:
    """The curves in words, for tests and text frontends: each panel's title, latest values, and its note."""
    found = notes_of(view)
    last_step = round(view.steps[-1]) if view.steps else 0
    cells = []
    for panel in view.panels():
        values = []
        for s in panel.series:
            series = view.series(s.metric)
            last = next((v for v in reversed(series[-50:]) if v == v), None)
            if last is not None:
                values.append(f"{s.label or s.metric}: {last:.3g} at step {last_step}")
        note = found.get(panel.key)
        note_html = (
            f'<details class="grpo-note" data-panel="{panel.key}"><summary>{html.escape(note.headline)}'
            f"</summary><div>{html.escape(note.text)}</div></details>"
            if note
            else ""
        )
        cells.append(
            f'<div class="grpo-panel" data-panel="{panel.key}"><b>{html.escape(panel.title)}</b> '
            f"{html.escape('; '.join(values)) or 'no data'}{note_html}</div>"
        )
    return (
        f'<div class="grpo-chart" data-step="{last_step}" data-points="{len(view.steps)}">' + "".join(cells) + "</div>"
    )
