"""The reward, KL, loss, length, zero-std, error-rate and reward-component curves, drawn with matplotlib on Agg.

matplotlib's object API (never pyplot: no global state, safe from the training thread) renders to
PNG bytes that the dashboard puts into a ``widgets.Image``; the same PNG serves replays and every
frontend. matplotlib is imported when the first figure is built, never at import time.
"""

from __future__ import annotations

import io
import math
from array import array
from collections.abc import Sequence
from typing import Any

#: Colors of the reward components' lines, in the order the components first appear.
COMPONENT_COLORS = ("#0891b2", "#db2777", "#65a30d", "#9333ea", "#ea580c", "#0d9488", "#4f46e5", "#ca8a04")


class Curves:
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
        # One line per component (``components/<name>``, the mean over each step's scored episodes).
        ("components", "reward components (mean)", COMPONENT_COLORS[0], None),
    )

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        cols = math.ceil(len(self._PANELS) / 2)
        self.fig = Figure(figsize=(3.5 * cols, 4.6), dpi=90)  # 315 px a panel: small text stays sharp
        self.canvas = FigureCanvasAgg(self.fig)
        grid = self.fig.subplots(2, cols)
        self.fig.subplots_adjust(left=0.05, right=0.95, top=0.92, bottom=0.1, wspace=0.32, hspace=0.45)
        self.axes = [ax for row in grid for ax in row]
        for spare in self.axes[len(self._PANELS):]:
            spare.set_visible(False)
        self.component_ax = self.axes[[panel[0] for panel in self._PANELS].index("components")]
        self.component_lines: dict[str, Any] = {}
        self.swap_marks: list[Any] = []
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
        components: dict[str, array] | None = None,
        swaps: Sequence[float] = (),
    ) -> bytes:
        """The PNG of every panel; ``components`` are the reward components' series, ``swaps`` the steps
        from which a swapped env scored (a dashed marker on every panel)."""
        import numpy as np

        x = np.frombuffer(steps, dtype=np.float64) if len(steps) else np.zeros(0)
        marker = "o" if len(x) < 60 else ""

        def series(name: str, source: dict[str, array] = metrics) -> Any:
            return np.frombuffer(source[name], dtype=np.float64) if len(source[name]) else np.zeros(0)

        parts = components or {}
        for name, values in parts.items():
            if name not in self.component_lines:
                color = COMPONENT_COLORS[len(self.component_lines) % len(COMPONENT_COLORS)]
                (self.component_lines[name],) = self.component_ax.plot([], [], color=color, linewidth=1.2,
                                                                         markersize=2.5, label=name)
            self.component_lines[name].set_data(x[: len(values)], series(name, parts))
            self.component_lines[name].set_marker(marker)
        for ax, (name, _title, _color, ylim) in zip(self.axes, self._PANELS, strict=False):
            if name in metrics:
                y = series(name)
                self.lines[name].set_data(x, y)
                self.lines[name].set_marker(marker)
            else:  # the components panel: its lines are drawn above, one per component
                y = np.concatenate([series(n, parts) for n in parts] or [np.zeros(0)])
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

        if parts:
            self.component_ax.legend(fontsize=6, loc="upper left", frameon=False)
        self._mark_swaps(swaps)

        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return buf.getvalue()

    def _mark_swaps(self, swaps: Sequence[float]) -> None:
        """A dashed line on every panel just before each step a swapped env scored first."""
        for mark in self.swap_marks:
            mark.remove()
        self.swap_marks = [
            ax.axvline(step - 0.5, color="#9333ea", linewidth=0.9, linestyle="--", alpha=0.8)
            for step in swaps for ax in self.axes[: len(self._PANELS)]
        ]
        self.swap_marks += [  # named once, on the reward panel
            self.axes[0].text(step - 0.5, 0.02, " env swap", transform=self.axes[0].get_xaxis_transform(),
                              fontsize=6, color="#9333ea", va="bottom")
            for step in swaps
        ]
