"""Runs side by side: other runs' curves overlaid, from their run logs (``%grpo_compare``, ``grpo_magic.compare``).

Each run log is folded into a ``RunView`` as a replay does (read as data, nothing executed); each run
is named by its folder and the settings that differ between the runs (read from each log's
``RunStarted``), e.g. ``lr-3e-5 (lr=3e-05)``. The curves go to the same page widget as the live
dashboard's (``live``), one line per run in each panel, on the union of the runs' steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import read_run_log, run_log_path

from .live import evals_of
from .panels import COMPONENT_COLORS, PANELS, Panel, Series
from .state import RunView

#: The panels compared: the ones people compare runs by.
COMPARED = ("reward", "kl", "loss", "length")
#: Settings that differ between any two runs without saying anything about them.
IGNORED = frozenset({"project_name", "output_dir", "report_to", "push_to_hub", "rl_env_module",
                     "task_metrics"})  # what --watch resolved to: the watch setting itself is compared
TITLES = {"reward": "mean reward", "length": "completion length"}
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", *COMPONENT_COLORS)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


#: Settings a run log written before they existed lacks, with the value such a run had (it had no watch).
_BEFORE: dict[str, Any] = {"watch": "none", "on_alarm": "warn"}


def differing(params: Sequence[dict[str, Any]]) -> list[str]:
    """The settings whose values are not the same in every run (in the first run's order)."""
    keys: dict[str, None] = {}
    for p in params:
        keys.update(dict.fromkeys(p))
    return [k for k in keys if k not in IGNORED and len({repr(p.get(k, _BEFORE.get(k))) for p in params}) > 1]


class Comparison:
    """Several runs' curves in one widget (``widget``), each run named by its folder and its differing settings."""

    def __init__(self, folders: Sequence[str | Path]) -> None:
        if not folders:
            raise GRPOMagicError("Name the runs to compare: compare(DIR, DIR, ...) or %grpo_compare DIR [DIR ...].")
        self.folders = [Path(f).expanduser() for f in folders]
        for folder in self.folders:
            if not run_log_path(folder).exists():
                raise GRPOMagicError(
                    f"{folder} has no run log (events.jsonl); pass the output folder of a run (its --project-name)."
                )
        self.views: list[RunView] = []
        for folder in self.folders:
            view = RunView()
            for event in read_run_log(folder, skipped=view.notes):
                view.apply(event)
            self.views.append(view)
        self.differs = differing([v.params for v in self.views])
        self.names = [self._name(folder, view) for folder, view in zip(self.folders, self.views, strict=True)]
        self.caption = (
            f"{', '.join(self.differs)} differ{'s' if len(self.differs) == 1 else ''} between these runs"
            if self.differs
            else "these runs have the same settings"
        )
        self._widget: Any = None

    def _name(self, folder: Path, view: RunView) -> str:
        settings = ", ".join(f"{k}={_value(view.params.get(k))}" for k in self.differs)
        return f"{folder.name} ({settings})" if settings else folder.name

    def _compared(self) -> list[tuple[Panel, str]]:
        return [(p, p.series[0].metric) for p in PANELS if p.key in COMPARED]

    def rows(self) -> dict[str, Any]:
        """The page's ``reset`` message: the union of the runs' steps, one column per run and metric."""
        steps = sorted({s for v in self.views for s in v.steps})
        index = {s: i for i, s in enumerate(steps)}
        columns: dict[str, list[float | None]] = {}
        for r, view in enumerate(self.views):
            for _panel, metric in self._compared():
                col: list[float | None] = [None] * len(steps)
                for x, v in zip(view.steps, view.series(metric), strict=False):
                    col[index[x]] = v if v == v and not math.isinf(v) else None
                columns[f"run{r}/{metric}"] = col
        x = [round(s) for s in steps]
        # each run's held-out evaluations on the reward panel, in its line's color (with its baseline line)
        evals = [p for r, view in enumerate(self.views) for p in evals_of(view, COLORS[r % len(COLORS)])]
        return {"kind": "reset", "start": 0, "x": x, "columns": columns, "markers": [], "evals": evals}

    def panels(self) -> list[Panel]:
        """One panel per compared panel, one line per run (its column: ``run<i>/<metric>``)."""
        return [
            Panel(
                panel.key,
                TITLES.get(panel.key, panel.title),
                tuple(Series(f"run{r}/{metric}", COLORS[r % len(COLORS)], name) for r, name in enumerate(self.names)),
            )
            for panel, metric in self._compared()
        ]

    @property
    def widget(self) -> Any:
        """The page widget (built on first use): the panels, the runs' rows, the caption."""
        if self._widget is None:
            from .live import _widget_class, panel_spec

            widget = _widget_class()(smoothing=0.0, caption=self.caption)
            widget.add_class("grpo-compare")
            widget.spec = panel_spec(self.panels())
            message = self.rows()

            def hello(_w: Any, content: Any, _buffers: Any) -> None:
                if isinstance(content, dict) and content.get("kind") == "hello":
                    widget.send(message)

            widget.on_msg(hello)
            self._widget = widget
        return self._widget

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.names)} runs: {'; '.join(self.names)}; {self.caption}>"

    def png(self) -> bytes:
        """The compared panels as a PNG (matplotlib's object API on Agg, ``curves.Curves``), one line per run
        and a legend naming the runs: the picture a saved notebook keeps for viewers without a kernel."""
        from array import array

        from .curves import Curves

        rows = self.rows()
        metrics = {col: array("d", [math.nan if v is None else v for v in values])
                   for col, values in rows["columns"].items()}
        none = array("d")
        return Curves(self.panels()).png(array("d", rows["x"]), metrics, none, none, none)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The page widget, its PNG for a saved notebook (nbviewer, GitHub) and the words for a terminal."""
        import base64

        found = self.widget._repr_mimebundle_(**kwargs)  # anywidget: (data, metadata)
        data, meta = found if isinstance(found, tuple) else (found, {})
        png = base64.b64encode(self.png()).decode("ascii")
        return {**data, "image/png": png, "text/plain": repr(self)}, meta


def compare(*folders: str | Path) -> Comparison:
    """Other runs' curves overlaid, from their run logs: ``compare("runs/a", "runs/b")``."""
    if len(folders) == 1 and isinstance(folders[0], (list, tuple)):
        folders = tuple(folders[0])
    return Comparison(folders)
