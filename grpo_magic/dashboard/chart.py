"""The live curves as inline SVG: redrawn at every step, at a cost that does not grow with the run.

Hand-written on purpose. The PNG of ``curves`` (matplotlib) takes ~130 ms to draw on a CPU, which a
1% budget allows every 10-15 s; these panels take a fraction of a millisecond (bench/run.py
measures it), so the curves follow training step by step. Plain SVG inside a core
``widgets.HTML`` renders in every frontend that shows widgets (JupyterLab, Notebook 7, VS Code,
Colab) with no extension to install; maintained chart widgets (bqplot, plotly's FigureWidget) each
need their own frontend extension, which VS Code and Colab do not load by default, and the
dashboard uses core ipywidgets only (docs/architecture.md, "The dashboard"). Only lines, a band,
axes and text are drawn, so a small builder does it.

Why a redraw stays cheap: each line is written in data units (x: the step, y: a whole multiple of
a quantum) and placed by an SVG ``transform``, with ``vector-effect="non-scaling-stroke"`` so that
strokes keep their width. A new step then moves no old point: the text of the points drawn so far
is kept in a ``LineCache`` and only the new points are formatted. Long runs are thinned to at most
``MAX_POINTS`` per line, each bucket of 2^k steps keeping its lowest and highest value (spikes stay
visible); buckets double as the run grows, and only then is a line rewritten.

The panels come from ``RunView.panels()`` (``panels``) and the notes from ``notes``; every text is escaped.
"""

from __future__ import annotations

import html
import math
from array import array
from collections.abc import Mapping
from typing import Any

from .notes import Note
from .panels import GREY, Panel
from .state import RunView

MAX_POINTS = 400  # per line; a panel is ~320 px wide
# Each panel's viewBox, in tenths of a pixel of a 320 x 150 panel: coordinates are whole numbers.
W, H = 3200, 1500
LEFT, RIGHT, RIGHT_SHARE, TOP, BOTTOM = 380, 150, 300, 60, 180
SHARE_RANGE = (-0.02, 1.02)
GRID_STYLE = (
    "display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:6px 18px;width:100%;box-sizing:border-box;"
    "margin:6px 0;font-family:var(--jp-ui-font-family,sans-serif)"
)
NOTE_STYLE = (
    "font-size:11.5px;line-height:1.35;margin:2px 0 0 0;padding:4px 6px;border-left:3px solid #d97706;"
    "background:rgba(217,119,6,.08);border-radius:3px"
)
_LINE = 'vector-effect="non-scaling-stroke" fill="none" stroke-linejoin="round"'


def _fmt(value: float) -> str:
    """A tick or value label, short: 0.5, 12, 1.2k, 0.004, 3e-05."""
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
    out = []
    v = math.ceil(lo / step - 1e-9) * step
    while v <= hi + 1e-9 * span and len(out) < 12:
        out.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return out


# ---------------------------------------------------------------- lines, kept between redraws


def _bucket(n: int) -> int:
    """Steps per bucket for ``n`` points: 1 up to MAX_POINTS, then the smallest power of two that fits."""
    b = 1
    while n > MAX_POINTS if b == 1 else -(-n // b) * 2 > MAX_POINTS:
        b *= 2
    return b


def _frame(extent: tuple[float, float] | None) -> tuple[float, float]:
    """(quantum, reference) of a line's y: stored as whole multiples of the quantum (a power of ten,
    about 1/5000 of the spread) above the reference. Both depend on the data's extent only, so a line
    kept between redraws and one written from scratch come out the same; they change rarely (when
    the spread crosses a power of ten, or a value falls below the reference), and the line is
    rewritten then."""
    if extent is None:
        return (1.0, 0.0)
    lo, hi = extent
    spread = hi - lo or abs(hi) or 1.0
    q = 10.0 ** math.floor(math.log10(spread / 5000))
    unit = q * 100_000
    return (q, math.floor(lo / unit) * unit)


class _Line:
    """One line's points so far, as text in data units: ``tokens`` (``M`` where a segment starts)."""

    __slots__ = ("b", "cuts", "done", "frame", "pen_up", "tokens")

    def __init__(self, b: int, frame: tuple[float, float], cuts: int) -> None:
        self.b, self.frame, self.cuts = b, frame, cuts
        self.done = 0  # points of x/y already in tokens
        self.tokens: list[str] = []
        self.pen_up = True


class LineCache:
    """The dashboard's lines between redraws (one per panel series); a fresh one redraws from scratch."""

    def __init__(self) -> None:
        self.lines: dict[str, _Line] = {}
        self.extents: dict[str, tuple[int, int, float, float]] = {}  # key -> (cuts, points seen, min, max)


class _Shifted:
    """``center[i] + sign * std[i]`` without building the array: one edge of the ± std band."""

    def __init__(self, center: array, std: array, sign: float) -> None:
        self.center, self.std, self.sign = center, std, sign

    def __len__(self) -> int:
        return min(len(self.center), len(self.std))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [c + self.sign * d for c, d in zip(self.center[i], self.std[i], strict=False)]
        return self.center[i] + self.sign * self.std[i]


def _extent(cache: LineCache, key: str, values: Any, cuts: int) -> tuple[float, float] | None:
    """The finite min and max of ``values``, kept between redraws (the last value is read anew each time)."""
    n = len(values)
    seen_cuts, done, lo, hi = cache.extents.get(key, (cuts, 0, math.inf, -math.inf))
    if seen_cuts != cuts or done > max(n - 1, 0):
        done, lo, hi = 0, math.inf, -math.inf
    for v in values[done : n - 1]:
        if v == v:
            lo, hi = min(lo, v), max(hi, v)
    cache.extents[key] = (cuts, max(done, n - 1), lo, hi)
    if n and values[n - 1] == values[n - 1]:
        lo, hi = min(lo, values[n - 1]), max(hi, values[n - 1])
    return (lo, hi) if lo <= hi else None


def _points(x: Any, y: Any, start: int, stop: int, b: int, frame: tuple[float, float], pen_up: bool,
            gaps: bool) -> tuple[list[str], bool]:
    """Tokens of the buckets of ``x``/``y`` from ``start`` to ``stop`` (a bucket: its min and max, in order)."""
    q, ref = frame
    out: list[str] = []
    for a in range(start, stop, b):
        seg = [(y[i], i) for i in range(a, min(a + b, stop)) if y[i] == y[i]]
        if not seg:
            pen_up = True
            continue
        if b == 1:
            picks = [seg[0][1]]
        else:
            lo, hi = min(seg)[1], max(seg)[1]
            picks = [lo] if lo == hi else sorted((lo, hi))
        for i in picks:
            point = f"{round(x[i])} {round((y[i] - ref) / q)}"
            out.append("M" + point if pen_up and gaps else point)
            pen_up = False
    return out, pen_up


def _line_tokens(cache: LineCache, key: str, x: Any, y: Any, cuts: int, frame: tuple[float, float],
                 gaps: bool = True) -> list[str]:
    """Every token of a line: those kept from earlier redraws, then the new ones and the last bucket."""
    n = min(len(x), len(y))
    b = _bucket(n)
    line = cache.lines.get(key)
    if line is None or line.cuts != cuts or line.b != b or line.done > n or line.frame != frame:
        line = cache.lines[key] = _Line(b, frame, cuts)
    # Buckets before the one holding the last point are final (TRL may log the last step twice).
    final = (n - 1) // b * b if n else 0
    if final > line.done:
        tokens, line.pen_up = _points(x, y, line.done, final, b, frame, line.pen_up, gaps)
        line.tokens.extend(tokens)
        line.done = final
    tail, _ = _points(x, y, line.done, n, b, frame, line.pen_up, gaps)
    return line.tokens + tail


# ---------------------------------------------------------------- one panel


class _Scale:
    """Data to viewBox coordinates for one panel."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, right: int) -> None:
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1
        self.left, self.right = LEFT, W - right
        self.top, self.bottom = TOP, H - BOTTOM
        self.sx = (self.right - self.left) / (x1 - x0)

    def x(self, v: float) -> float:
        return self.left + (v - self.x0) * self.sx

    def y(self, v: float, share: bool = False) -> float:
        lo, hi = SHARE_RANGE if share else (self.y0, self.y1)
        return self.bottom - (v - lo) * ((self.bottom - self.top) / (hi - lo))

    def transform(self, frame: tuple[float, float], share: bool = False) -> str:
        """The matrix that takes (step, (y - reference) / quantum) to the viewBox."""
        q, ref = frame
        lo, hi = SHARE_RANGE if share else (self.y0, self.y1)
        sy = (self.bottom - self.top) / (hi - lo)
        return (f"matrix({self.sx:.7g} 0 0 {-sy * q:.7g} {self.left - self.x0 * self.sx:.7g} "
                f"{self.bottom - (ref - lo) * sy:.7g})")


def _join(*extents: tuple[float, float] | None) -> tuple[float, float] | None:
    found = [e for e in extents if e is not None]
    return (min(e[0] for e in found), max(e[1] for e in found)) if found else None


def _y_range(panel: Panel, found: tuple[float, float] | None) -> tuple[float, float]:
    if panel.ylim is not None:
        return panel.ylim
    if found is None:
        return (0.0, 1.0)
    lo, hi = found
    if panel.min_top is not None:
        lo, hi = min(lo, 0.0), max(hi, panel.min_top)
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        pad = max(abs(hi) * 0.1, 0.05)
        return (lo - pad, hi + pad)
    pad = (hi - lo) * 0.06
    return (lo - pad, hi + pad)


def _last_value(values: array | None) -> float | None:
    if not values:
        return None
    for v in reversed(values[-50:]):
        if v == v:
            return v
    return None


def _band(view: RunView, panel: Panel) -> tuple[_Shifted, _Shifted] | None:
    """The ± std band around the panel's first series, as (lower, upper) edges, when both are there."""
    if not panel.band:
        return None
    center, std = view.metrics[panel.series[0].metric], view.metrics[panel.band]
    if not center or len(center) != len(std):
        return None
    return _Shifted(center, std, -1.0), _Shifted(center, std, 1.0)


def panel_svg(view: RunView, panel: Panel, cache: LineCache | None = None) -> str:
    """One panel: axes, grid, its lines (and band, group range, markers), as an ``<svg>`` element."""
    cache = cache if cache is not None else LineCache()
    x = view.steps
    share = any(s.share for s in panel.series)
    series = [(s, view.series(s.metric)) for s in panel.series]
    band = _band(view, panel)
    ranges = [view.range_min, view.range_max] if panel.group_range and view.range_steps else []
    key = panel.key
    extents = {s.metric: _extent(cache, f"{key}/{s.metric}", y, view.cuts) for s, y in series}
    band_extent = _join(*(_extent(cache, f"{key}/band{i}", edge, view.cuts) for i, edge in enumerate(band or ())))
    range_extents = [_extent(cache, f"{key}/range{i}", r, view.cuts) for i, r in enumerate(ranges)]
    found = _join(*(extents[s.metric] for s, _y in series if not s.share), band_extent, *range_extents)
    has_data = found is not None or any(extents.values())
    xs = [v for v in (x, view.range_steps if ranges else None) if v]
    x0 = min(v[0] for v in xs) if xs else 0.0
    x1 = max(v[-1] for v in xs) if xs else 1.0
    if x1 - x0 < 1:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0, y1 = _y_range(panel, found) if has_data else (0.0, 1.0)
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
        out.append(f'<text x="{xx}" y="{H - 50}" text-anchor="middle">{round(t)}</text>')
    if share:
        for t in (0.0, 0.5, 1.0):
            out.append(f'<text x="{sc.right + 30}" y="{round(sc.y(t, share=True)) + 30}" fill="#d97706">{t:g}</text>')
    out.append(f'</g><path d="{"".join(grid)}" stroke="currentColor" stroke-opacity=".12" stroke-width="6" '
               f'fill="none"/><rect x="{sc.left}" y="{sc.top}" width="{sc.right - sc.left}" '
               f'height="{sc.bottom - sc.top}" fill="none" stroke="currentColor" stroke-opacity=".3" stroke-width="6"/>')
    if not has_data:
        out.append(f'<text x="{(sc.left + sc.right) // 2}" y="{(sc.top + sc.bottom) // 2 + 30}" font-size="100" '
                   'text-anchor="middle" fill="currentColor" fill-opacity=".55">no data</text>')
    if band is not None and band_extent is not None:
        frame = _frame(band_extent)
        upper = _line_tokens(cache, f"{key}/band+", x, band[1], view.cuts, frame, gaps=False)
        lower = _line_tokens(cache, f"{key}/band-", x, band[0], view.cuts, frame, gaps=False)
        if upper and lower:
            points = " ".join(upper + lower[::-1])
            out.append(f'<polygon points="{points}" transform="{sc.transform(frame)}" fill="{series[0][0].color}" '
                       'fill-opacity=".16"/>')
    for i, values in enumerate(ranges):
        frame = _frame(range_extents[i])
        tokens = _line_tokens(cache, f"{key}/range-{i}", view.range_steps, values, view.cuts, frame)
        if tokens:
            out.append(f'<path d="{" ".join(tokens)}" transform="{sc.transform(frame)}" stroke="{GREY}" '
                       f'stroke-width=".8" stroke-dasharray="1.5 2" {_LINE}/>')
    for s, y in series:
        frame = _frame(extents[s.metric])
        tokens = _line_tokens(cache, f"{key}/{s.metric}", x, y, view.cuts, frame)
        if not tokens:
            continue
        dash = ' stroke-dasharray="4 2.5"' if s.dashed else ""
        last = _last_value(y)
        tip = f"{s.label or s.metric}: {_fmt(last)} at step {round(x[-1])}" if last is not None else s.metric
        out.append(f'<path d="{" ".join(tokens)}" transform="{sc.transform(frame, s.share)}" stroke="{s.color}" '
                   f'stroke-width="1.4"{dash} {_LINE}><title>{html.escape(tip)}</title></path>')
        if len(x) <= 40:  # a short run: its points too (in viewBox units: no transform, round dots)
            dots = "".join(f"M{round(sc.x(a))} {round(sc.y(b, s.share))}h0" for a, b in zip(x, y, strict=False)
                           if b == b)
            out.append(f'<path d="{dots}" stroke="{s.color}" stroke-width="30" stroke-linecap="round"/>')
    for step, label in view.markers:
        if x0 <= step <= x1:
            xx = round(sc.x(step))
            out.append(f'<path d="M{xx} {sc.top}V{sc.bottom}" stroke="{GREY}" stroke-width="10" '
                       f'stroke-dasharray="30 20"><title>{html.escape(label)} (step {step:g})</title></path>')
    out.append("</svg>")
    return "".join(out)


def _title(view: RunView, panel: Panel) -> str:
    last = _last_value(view.series(panel.series[0].metric)) if panel.series else None
    value = f' <b style="opacity:1">{_fmt(last)}</b>' if last is not None else ""
    return f'<div style="font-size:12px;opacity:.85">{html.escape(panel.title)}{value}</div>'


def chart_html(view: RunView, notes: Mapping[str, Note], panels: tuple[Panel, ...] | None = None,
               cache: LineCache | None = None) -> str:
    """Every panel with its title and, where one applies, its note: the live curves of the dashboard.

    ``panels``: default, what the run shows (``RunView.panels()``). ``cache`` keeps the lines' text
    between calls (the live dashboard passes its own); without it every line is written from
    scratch, with the same result.
    """
    cache = cache if cache is not None else LineCache()
    cells = []
    for panel in panels if panels is not None else view.panels():
        note = notes.get(panel.key)
        note_html = (f'<details class="grpo-note" data-panel="{panel.key}" style="{NOTE_STYLE}">'
                     f'<summary style="cursor:pointer">{html.escape(note.headline)}</summary>'
                     f"<div>{html.escape(note.text)}</div></details>" if note else "")
        cells.append(f'<div class="grpo-panel" data-panel="{panel.key}">{_title(view, panel)}'
                     f"{panel_svg(view, panel, cache)}{note_html}</div>")
    last = round(view.steps[-1]) if view.steps else 0
    return (f'<div class="grpo-chart" data-step="{last}" data-points="{len(view.steps)}" style="{GRID_STYLE}">'
            + "".join(cells) + "</div>")
