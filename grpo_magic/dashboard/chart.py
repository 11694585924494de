"""The live curves as inline SVG: a pure function of the view, cheap enough to redraw at every step.

Hand-written on purpose. The PNG of ``curves`` (matplotlib) takes ~130 ms to draw on a CPU, which a
1% budget allows every 10-15 s; these panels take about a millisecond (bench/run.py measures it),
so the curves follow training step by step. Plain SVG inside a core ``widgets.HTML`` renders in
every frontend that shows widgets (JupyterLab, Notebook 7, VS Code, Colab) with no extension to
install; maintained chart widgets (bqplot, plotly's FigureWidget) each need their own frontend
extension, which VS Code and Colab do not load by default, and the dashboard uses core ipywidgets
only (docs/architecture.md, "The dashboard"). Only lines, a band, axes and text are drawn, so a
small builder does it; long runs are thinned to ``MAX_POINTS`` per line, keeping each bucket's
lowest and highest value so that spikes stay visible.

The panels come from ``panels.PANELS`` and the notes from ``notes``; every text is escaped.
"""

from __future__ import annotations

import html
import math
from array import array
from collections.abc import Mapping
from typing import Any

from .notes import Note
from .panels import GREY, PANELS, Panel
from .state import RunView

MAX_POINTS = 400  # per line; a panel is ~320 px wide
# Each panel's viewBox, in tenths of a pixel of a 320 x 150 panel: coordinates are whole numbers.
W, H = 3200, 1500
LEFT, RIGHT, RIGHT_SHARE, TOP, BOTTOM = 380, 150, 300, 60, 180
GRID_STYLE = (
    "display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:6px 18px;width:100%;box-sizing:border-box;"
    "margin:6px 0;font-family:var(--jp-ui-font-family,sans-serif)"
)
NOTE_STYLE = (
    "font-size:11.5px;line-height:1.35;margin:2px 0 0 0;padding:4px 6px;border-left:3px solid #d97706;"
    "background:rgba(217,119,6,.08);border-radius:3px"
)


def _np() -> Any:
    import numpy

    return numpy


def _fmt(value: float) -> str:
    """A tick or value label, short: 0.5, 12, 1.2k, 3e-04."""
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1e4:
        return f"{value / 1e3:.0f}k"
    if a >= 1000:
        return f"{value / 1e3:.1f}k"
    if a >= 1e-3:
        return f"{value:.3g}" if a >= 1e-2 else f"{value:.2g}"
    return f"{value:.0e}"


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """Round tick values covering [lo, hi], about ``n`` of them."""
    span = hi - lo
    if not span > 0 or not math.isfinite(span):
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    v = first
    while v <= hi + 1e-9 * span and len(out) < 12:
        out.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return out


def _thin(x: Any, y: Any) -> tuple[Any, Any]:
    """At most MAX_POINTS points: each bucket's lowest and highest value, in step order (vectorized)."""
    np = _np()
    n = len(x)
    if n <= MAX_POINTS:
        return x, y
    buckets = MAX_POINTS // 2
    size = -(-n // buckets)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = y
    grid = padded.reshape(buckets, size)
    empty = np.isnan(grid).all(axis=1)
    grid = np.where(empty[:, None], 0.0, grid)  # nanarg* refuse all-NaN rows; those stay gaps below
    base = np.arange(buckets) * size
    lo, hi = base + np.nanargmin(grid, axis=1), base + np.nanargmax(grid, axis=1)
    real = base < n  # the last buckets can be padding only
    index = np.sort(np.stack([lo, hi], axis=1)[real], axis=1).ravel()
    ys = y[index].copy()
    ys[np.repeat(empty[real], 2)] = np.nan  # a bucket of missing values stays a gap
    return x[index], ys


def _ints(px: Any, py: Any) -> list[str]:
    """``[x, y, x, y, ...]`` as text, in whole viewBox units (a tenth of a pixel): fast to format, exact enough."""
    np = _np()
    coords = np.empty((len(px), 2))
    coords[:, 0] = px
    coords[:, 1] = py
    coords[coords != coords] = 0.0  # NaN: the caller skips those points
    return list(map(str, np.rint(coords).astype(np.int64).ravel().tolist()))


def _pairs(px: Any, py: Any) -> str:
    return " ".join(_ints(px, py))


def _path(px: Any, py: Any) -> str:
    """An SVG path through the points, broken where a value is missing (NaN)."""
    np = _np()
    flat = _ints(px, py)
    finite = np.isfinite(py)
    if finite.all():
        return f"M{flat[0]} {flat[1]}" + ("L" + " ".join(flat[2:]) if len(flat) > 2 else "h1")
    edges = np.flatnonzero(np.diff(np.concatenate([[0], finite.view(np.int8), [0]]))).tolist()
    parts = []
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        parts.append(f"M{flat[2 * a]} {flat[2 * a + 1]}" + ("L" + " ".join(flat[2 * a + 2 : 2 * b]) if b - a > 1
                                                            else "h1"))
    return "".join(parts)


class _Scale:
    """Data to viewBox coordinates for one panel."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, right: int) -> None:
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1
        self.left, self.right = LEFT, W - right
        self.top, self.bottom = TOP, H - BOTTOM

    def x(self, v: Any) -> Any:
        return self.left + (v - self.x0) * ((self.right - self.left) / (self.x1 - self.x0))

    def y(self, v: Any, share: bool = False) -> Any:
        lo, hi = (-0.02, 1.02) if share else (self.y0, self.y1)
        return self.bottom - (v - lo) * ((self.bottom - self.top) / (hi - lo))


def _y_range(panel: Panel, values: list[Any]) -> tuple[float, float]:
    np = _np()
    if panel.ylim is not None:
        return panel.ylim
    finite = [v[np.isfinite(v)] for v in values if len(v)]
    finite = [v for v in finite if len(v)]
    if not finite:
        return (0.0, 1.0)
    lo = min(float(v.min()) for v in finite)
    hi = max(float(v.max()) for v in finite)
    if panel.min_top is not None:
        lo, hi = min(lo, 0.0), max(hi, panel.min_top)
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        pad = max(abs(hi) * 0.1, 0.05)
        return (lo - pad, hi + pad)
    pad = (hi - lo) * 0.06
    return (lo - pad, hi + pad)


def _last_value(metrics: Mapping[str, array], metric: str) -> float | None:
    values = metrics.get(metric)
    if not values:
        return None
    for v in reversed(values[-50:]):
        if not math.isnan(v):
            return v
    return None


def _array(values: array) -> Any:
    np = _np()
    return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)


def panel_svg(view: RunView, panel: Panel) -> str:
    """One panel: axes, grid, its lines (and band, group range, markers), as an ``<svg>`` element."""
    np = _np()
    x = _array(view.steps)
    share = any(s.share for s in panel.series)
    series = [(s, _array(view.metrics[s.metric])) for s in panel.series]
    band = None
    if panel.band and series and len(series[0][1]) and len(view.metrics[panel.band]) == len(series[0][1]):
        std = _array(view.metrics[panel.band])
        band = (series[0][1] - std, series[0][1] + std)
    rx = _array(view.range_steps) if panel.group_range and len(view.range_steps) else None
    ranges = [_array(view.range_min), _array(view.range_max)] if rx is not None else []
    scaled = [y for s, y in series if not s.share] + (list(band) if band else []) + ranges
    has_data = any(len(y) and np.isfinite(y).any() for _s, y in series) or bool(ranges)
    xs = [v for v in (x, rx) if v is not None and len(v)]
    x0 = min(float(v[0]) for v in xs) if xs else 0.0
    x1 = max(float(v[-1]) for v in xs) if xs else 1.0
    if x1 - x0 < 1:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0, y1 = _y_range(panel, scaled) if has_data else (0.0, 1.0)
    sc = _Scale(x0, x1, y0, y1, RIGHT_SHARE if share else RIGHT)
    out = [f'<svg viewBox="0 0 {W} {H}" width="100%" style="display:block;overflow:visible" role="img" '
           f'aria-label="{html.escape(panel.title)}" data-panel="{panel.key}">'
           '<g font-size="90" fill="currentColor" fill-opacity=".7">']
    grid = []
    if has_data:
        for t in _ticks(y0, y1):
            yy = round(sc.y(t))
            grid.append(f"M{sc.left} {yy}H{sc.right}")
            out.append(f'<text x="{sc.left - 30}" y="{yy + 30}" text-anchor="end">{_fmt(t)}</text>')
    for t in _ticks(x0, x1, 5):
        if abs(t - round(t)) > 1e-9:
            continue
        xx = round(sc.x(t))
        grid.append(f"M{xx} {sc.top}V{sc.bottom}")
        out.append(f'<text x="{xx}" y="{H - 50}" text-anchor="middle">{int(round(t))}</text>')
    if share:
        for t in (0.0, 0.5, 1.0):
            out.append(f'<text x="{sc.right + 30}" y="{round(sc.y(t, share=True)) + 30}" fill="#d97706">{t:g}</text>')
    out.append(f'</g><path d="{"".join(grid)}" stroke="currentColor" stroke-opacity=".12" stroke-width="6" '
               f'fill="none"/><rect x="{sc.left}" y="{sc.top}" width="{sc.right - sc.left}" '
               f'height="{sc.bottom - sc.top}" fill="none" stroke="currentColor" stroke-opacity=".3" stroke-width="6"/>')
    if not has_data:
        out.append(f'<text x="{(sc.left + sc.right) // 2}" y="{(sc.top + sc.bottom) // 2 + 30}" font-size="100" '
                   'text-anchor="middle" fill="currentColor" fill-opacity=".55">no data</text>')
    if band is not None:
        finite = np.isfinite(band[0]) & np.isfinite(band[1])
        if finite.any():
            bx, lo_y = _thin(x[finite], band[0][finite])
            _, hi_y = _thin(x[finite], band[1][finite])
            if len(lo_y) == len(hi_y) == len(bx):
                points = _pairs(np.concatenate([sc.x(bx), sc.x(bx)[::-1]]),
                                np.concatenate([sc.y(hi_y), sc.y(lo_y)[::-1]]))
                out.append(f'<polygon points="{points}" fill="{series[0][0].color}" fill-opacity=".16"/>')
    for values in ranges:
        tx, ty = _thin(rx, values)
        out.append(f'<path d="{_path(sc.x(tx), sc.y(ty))}" stroke="{GREY}" stroke-width="8" '
                   'stroke-dasharray="15 20" fill="none"/>')
    for s, y in series:
        if not len(y) or len(y) != len(x):
            continue
        tx, ty = _thin(x, y)
        px, py = sc.x(tx), sc.y(ty, share=s.share)
        dash = ' stroke-dasharray="40 25"' if s.dashed else ""
        if len(tx) <= 40:  # a short run: its points too, as markers on the line's vertices
            dot = f"grpo-dot-{s.color.lstrip('#')}"
            out.append(f'<defs><marker id="{dot}" viewBox="0 0 2 2" refX="1" refY="1" markerWidth="30" '
                       f'markerHeight="30" markerUnits="userSpaceOnUse"><circle cx="1" cy="1" r="1" '
                       f'fill="{s.color}"/></marker></defs>')
            dash += f' marker-start="url(#{dot})" marker-mid="url(#{dot})" marker-end="url(#{dot})"'
        last = _last_value(view.metrics, s.metric)
        tip = f"{s.label or s.metric}: {_fmt(last)} at step {int(x[-1])}" if last is not None else s.metric
        out.append(f'<path d="{_path(px, py)}" stroke="{s.color}" stroke-width="14" fill="none"{dash}>'
                   f"<title>{html.escape(tip)}</title></path>")
    for step, label in view.markers:
        if x0 <= step <= x1:
            xx = round(sc.x(step))
            out.append(f'<path d="M{xx} {sc.top}V{sc.bottom}" stroke="{GREY}" stroke-width="10" '
                       f'stroke-dasharray="30 20"><title>{html.escape(label)} (step {step:g})</title></path>')
    out.append("</svg>")
    return "".join(out)


def _title(view: RunView, panel: Panel) -> str:
    last = _last_value(view.metrics, panel.series[0].metric)
    value = f' <b style="opacity:1">{_fmt(last)}</b>' if last is not None else ""
    return f'<div style="font-size:12px;opacity:.85">{html.escape(panel.title)}{value}</div>'


def chart_html(view: RunView, notes: Mapping[str, Note], panels: tuple[Panel, ...] = PANELS) -> str:
    """Every panel with its title and, where one applies, its note: the live curves of the dashboard."""
    cells = []
    for panel in panels:
        note = notes.get(panel.key)
        note_html = (f'<details class="grpo-note" data-panel="{panel.key}" style="{NOTE_STYLE}">'
                     f'<summary style="cursor:pointer">{html.escape(note.headline)}</summary>'
                     f"<div>{html.escape(note.text)}</div></details>" if note else "")
        cells.append(f'<div class="grpo-panel" data-panel="{panel.key}">{_title(view, panel)}'
                     f"{panel_svg(view, panel)}{note_html}</div>")
    last = int(view.steps[-1]) if len(view.steps) else 0
    return (f'<div class="grpo-chart" data-step="{last}" data-points="{len(view.steps)}" style="{GRID_STYLE}">'
            + "".join(cells) + "</div>")
