"""The curves as a PNG, drawn with matplotlib on Agg: for replays, exports and frontends without widgets.

The live dashboard's curves are drawn by the page (``live``: uPlot, fed only new points); this
picture (~130 ms on a CPU) is drawn only when asked for (``Dashboard.reward_png``, the static
fallback of a displayed dashboard). Both draw the panels of ``panels.PANELS``. matplotlib's object
API (never pyplot: no global state, safe from the training thread) renders to PNG bytes;
matplotlib is imported when the first figure is built, never at import time.
"""

from __future__ import annotations

import io
import math
from array import array
from collections.abc import Sequence
from typing import Any

from .panels import AMBER, GREY, PANELS, RED, Panel

GREEN = "#16a34a"  # held-out evaluations (``RunView.evals``)
#: The ``gid`` of an alarm's line on every panel and of its label on the reward panel (tests and SVG exports
#: find them by it).
ALARM_GID, ALARM_LABEL_GID = "grpo-alarm", "grpo-alarm-label"


def _named_lines(panel: Panel) -> bool:
    """Whether a panel's lines need a legend to be told apart: several named lines, or the reward components
    (whose names are the env's, which the title cannot say)."""
    named = [s for s in panel.series if s.label]
    return len(named) > 1 or (panel.key == "components" and bool(named))


class Curves:
    """The grid of panels, drawn with matplotlib's object API on Agg, rendered to PNG.

    The figure, axes and line artists are built once and only their data changes between
    renders: rebuilding the figure (its ticks above all) would cost several times more.
    """

    def __init__(self, panels: Sequence[Panel] = PANELS) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self.panels = tuple(panels)
        rows = max(1, math.ceil(len(self.panels) / 3))
        self.fig = Figure(figsize=(10.5, 2.3 * rows), dpi=90)  # 945 px wide: small text stays sharp
        self.canvas = FigureCanvasAgg(self.fig)
        grid = self.fig.subplots(rows, 3, squeeze=False)
        self.fig.subplots_adjust(left=0.06, right=0.94, top=1 - 0.08 / rows, bottom=0.1 / rows, wspace=0.32,
                                 hspace=0.45)
        self.axes = [ax for row in grid for ax in row]
        for ax in self.axes[len(self.panels):]:
            ax.set_visible(False)
        self.lines: dict[tuple[str, str], Any] = {}
        self.empty: dict[str, Any] = {}
        self.twins: dict[str, Any] = {}
        self.ranges: dict[str, tuple[Any, Any]] = {}
        self.bands: dict[str, Any] = {}
        self.marks: list[Any] = []
        for ax, panel in zip(self.axes, self.panels, strict=False):
            ax.set_title(panel.title, fontsize=9)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("step", fontsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.25)
            if panel.ylim is not None:
                ax.set_ylim(*panel.ylim)
            for series in panel.series:
                target = ax
                if series.share:
                    target = self.twins.setdefault(panel.key, ax.twinx())
                    target.tick_params(labelsize=7, colors=AMBER)
                    target.set_ylim(-0.02, 1.02)
                (line,) = target.plot([], [], color=series.color, linewidth=1.0 if series.dashed else 1.3,
                                      linestyle="--" if series.dashed else "-", markersize=2.5,
                                      label=series.label or None)
                self.lines[(panel.key, series.metric)] = line
            if panel.group_range:
                style = {"color": GREY, "linewidth": 0.8, "linestyle": ":", "markersize": 2}
                (low,) = ax.plot([], [], **style)
                (high,) = ax.plot([], [], label="group min/max", **style)
                self.ranges[panel.key] = (low, high)
            self.empty[panel.key] = ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                                            fontsize=8, alpha=0.6)

    def png(self, steps: array, metrics: dict[str, array], range_steps: array, range_min: array,
            range_max: array, markers: Sequence[tuple[Any, ...]] = (),
            evals: Sequence[dict[str, Any]] = ()) -> bytes:
        """The PNG of these arrays (a ``RunView``'s): every panel's data replaced, then one render.

        ``evals`` (``RunView.evals``): held-out evaluations, drawn on the reward panel as points with the
        first one (the baseline, before training) as a horizontal line. ``markers`` (``RunView.markers``): a grey
        dashed line on every panel at each step; an alarm's (kind ``"alarm"``) is red, and named on the reward
        panel.
        """
        import numpy as np

        def arr(values: array) -> Any:
            return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)

        x = arr(steps)
        rx = arr(range_steps)
        marker = "o" if len(x) < 60 else ""
        for mark in self.marks:
            mark.remove()
        self.marks = []
        for ax, panel in zip(self.axes, self.panels, strict=False):
            has = False
            for series in panel.series:
                y = arr(metrics[series.metric])
                line = self.lines[(panel.key, series.metric)]
                if len(y) != len(x):
                    y = np.full(len(x), np.nan)
                line.set_data(x, y)
                line.set_marker(marker)
                finite = bool(len(y)) and bool(np.isfinite(y).any())
                if series.share:
                    self.twins[panel.key].set_visible(finite)
                else:
                    has = has or finite
            if panel.key in self.bands:
                self.bands.pop(panel.key).remove()
            if panel.band:
                center, std = arr(metrics[panel.series[0].metric]), arr(metrics[panel.band])
                if len(center) == len(std) == len(x) and len(x) and np.isfinite(std).any():
                    self.bands[panel.key] = ax.fill_between(x, center - std, center + std, color=panel.series[0].color,
                                                            alpha=0.18, linewidth=0, label="± std")
            if panel.key in self.ranges:
                rmarker = "o" if len(rx) < 60 else ""
                for line, values in zip(self.ranges[panel.key], (range_min, range_max), strict=True):
                    line.set_data(rx, arr(values) if len(rx) else rx)
                    line.set_marker(rmarker)
                has = has or bool(len(rx))
            self.empty[panel.key].set_visible(not has)
            ax.relim()
            ax.autoscale_view(scaley=panel.ylim is None)
            if not has:  # e.g. no KL when rl_kl_coef is 0: the other panels' steps, no made-up y scale
                ax.set_xlim(*((float(x[0]) - 0.5, float(x[-1]) + 0.5) if len(x) else (0.0, 1.0)), auto=None)
                if panel.ylim is None:
                    ax.set_ylim(0.0, 1.0, auto=None)
            elif panel.min_top is not None:
                values = arr(metrics[panel.series[0].metric])
                top = float(np.nanmax(values)) if len(values) and np.isfinite(values).any() else 0.0
                ax.set_ylim(-panel.min_top / 25, max(panel.min_top, top * 1.1))
            ax.tick_params(axis="y", labelleft=has)
            if (panel.group_range or _named_lines(panel)) and (len(x) or len(rx)):
                self._legend(ax, panel)  # rebuilt: its handles copy the lines' markers
            alarms = 0
            for mark in markers:
                step, label = mark[0], mark[1]
                if len(mark) > 2 and mark[2] == "alarm":
                    self.marks.append(ax.axvline(step, color=RED, linewidth=1.3, linestyle="-", alpha=0.85,
                                                 gid=ALARM_GID))
                    if panel.key == "reward":
                        lo, hi = ax.get_xlim()
                        right = step > (lo + hi) / 2  # written on the side of the line with room
                        text = f"{str(label)[:40]} " if right else f" {str(label)[:40]}"
                        height = 0.98 - 0.09 * (alarms % 4)  # labels of several alarms stacked, not overprinted
                        alarms += 1
                        self.marks.append(ax.text(step, height, text, transform=ax.get_xaxis_transform(), color=RED,
                                                  fontsize=6, ha="right" if right else "left", va="top",
                                                  gid=ALARM_LABEL_GID, parse_math=False))
                else:
                    self.marks.append(ax.axvline(step, color=GREY, linewidth=1.0, linestyle="--"))
            if panel.key == "reward" and evals:
                self._draw_evals(ax, evals)
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return buf.getvalue()

    def _legend(self, ax: Any, panel: Panel) -> None:
        """The panel's legend: its own axis's labelled artists, then a share's line on the right-hand axis."""
        handles, labels = ax.get_legend_handles_labels()
        twin = self.twins.get(panel.key)
        if twin is not None and twin.get_visible():
            more, names = twin.get_legend_handles_labels()
            handles, labels = handles + more, labels + names
        ax.legend(handles, labels, fontsize=6, loc="upper left", frameon=False)

    def _draw_evals(self, ax: Any, evals: Sequence[dict[str, Any]]) -> None:
        """Held-out points (greedy mean; sampled mean where no greedy one) and the baseline's line."""
        points = [(e["step"], e["greedy_mean"] if e.get("greedy_mean") is not None else e.get("sampled_mean"))
                  for e in evals]
        points = [(x, y) for x, y in points if y is not None]
        if not points:
            return
        xs, ys = zip(*points, strict=True)
        (dots,) = ax.plot(xs, ys, color=GREEN, marker="D", markersize=4, linewidth=1.0, label="held-out eval")
        self.marks.append(dots)
        self.marks.append(ax.axhline(ys[0], color=GREEN, linewidth=0.8, linestyle=":", label="held-out baseline"))
        ax.legend(fontsize=6, loc="upper left", frameon=False)
