"""Pure HTML builders of the dashboard: data in, HTML string out (no widgets, no state).

Like transformers' ``utils/notebook.py``, every part of the dashboard is a function of plain data
(events, or the ``RunView`` they fold into), so the live view and a replay of the run log give the
same HTML, and tests can read it. Every user or model text is escaped (and redacted) here.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from grpo_magic.events import GroupScored
from grpo_magic.redaction import redact
from grpo_magic.text import format_duration

from .panels import task_label
from .state import RunView

MAX_TEXT_CHARS = 20_000  # one completion or prompt shown in a card (the full text is in the run log)
MAX_TRACEBACK_CHARS = 6_000
PROMPT_COLLAPSE_CHARS = 240
PROMPT_COLLAPSE_LINES = 4

STATUS_COLORS = {
    "starting": "#6b7280",
    "loading model": "#2563eb",
    "training": "#2563eb",
    "stopping": "#d97706",
    "saving": "#2563eb",
    "completed": "#16a34a",
    "stopped": "#d97706",
    "failed": "#dc2626",
}


def esc(text: Any) -> str:
    """Escaped, and redacted: a token in a prompt, a completion or a reason is not shown either."""
    return html.escape(redact(str(text)), quote=True)


def duration(seconds: float | None) -> str:
    return format_duration(seconds, unknown="–")


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters in the run log)"


# ---------------------------------------------------------------- group cards

CARD_STYLE = "border:1px solid rgba(128,128,128,.35);border-radius:6px;padding:8px 10px;margin:6px 0;"
PRE_STYLE = (
    "white-space:pre-wrap;word-break:break-word;margin:2px 0 0 0;padding:4px 6px;"
    "background:rgba(128,128,128,.08);border-radius:4px;font-size:12px;max-height:16em;overflow:auto;"
)
BADGE = "display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;margin-left:6px;color:#fff;"


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
    prompt = truncate(prompt, MAX_TEXT_CHARS)
    lines = prompt.splitlines() or [""]
    if len(prompt) > PROMPT_COLLAPSE_CHARS or len(lines) > PROMPT_COLLAPSE_LINES:
        head = lines[0][:120] + ("…" if len(lines[0]) > 120 or len(lines) > 1 else "")
        return (
            f'<details><summary><b>prompt</b> <span style="opacity:.75">{esc(head)}</span></summary>'
            f'<pre style="{PRE_STYLE}">{esc(prompt)}</pre></details>'
        )
    return f'<div><b>prompt</b><pre style="{PRE_STYLE}">{esc(prompt)}</pre></div>'


def _completion_html(group: GroupScored, i: int, scale: float) -> str:
    score = group.scores[i] if i < len(group.scores) else None
    adv = group.advantages[i] if i < len(group.advantages) else None
    error = group.errors[i] if i < len(group.errors) else None
    clipped = bool(group.clipped[i]) if i < len(group.clipped) else False
    marks = []
    if error:
        kind = esc(error.get("kind", "error"))
        message = esc(error.get("message", ""))
        marks.append(f'<span style="{BADGE}background:#dc2626">⚠ episode error</span> <b>{kind}</b>: {message}')
    if clipped:
        raw = group.raw_scores[i] if i < len(group.raw_scores) else None
        detail = f" (env returned {esc(raw)})" if raw is not None else ""
        marks.append(f'<span style="{BADGE}background:#d97706">clipped</span> score clipped to [0, 1]{detail}')
    for warning in group.warnings[i] if i < len(group.warnings) else ():
        marks.append(f'<span style="{BADGE}background:#ca8a04">warning</span> {esc(warning)}')
    row = (
        '<div style="margin:6px 0 0 0">'
        f'<div style="font-size:12px"><span style="display:inline-block;width:30px;opacity:.7">#{i}</span>'
        f"{_score_bar(score)}{_advantage_bar(None if adv is None else float(adv), scale)}"
        f"{''.join(' ' + m for m in marks)}</div>"
        f"{components_html(group.components[i] if i < len(group.components) else {})}"
    )
    turns = group.transcripts[i] if i < len(group.transcripts) else None
    if turns:
        row += transcript_html(turns)
    else:
        row += f'<pre style="{PRE_STYLE}">{esc(truncate(group.completions[i], MAX_TEXT_CHARS))}</pre>'

    if error and error.get("traceback"):
        tb = truncate(str(error["traceback"])[-MAX_TRACEBACK_CHARS:], MAX_TRACEBACK_CHARS)
        row += f'<details><summary>traceback</summary><pre style="{PRE_STYLE}">{esc(tb)}</pre></details>'
    return row + "</div>"


_TURN_STYLE = "margin:4px 0 0 10px;padding-left:8px;border-left:3px solid "
_TURN_COLORS = {"assistant": "#3b82f6", "tool": "#16a34a", "error": "#dc2626"}


def _turn_html(turn: dict[str, Any]) -> str:
    """One turn of an agent episode: the assistant's text and tool calls, or a tool's result (or error)."""
    role = str(turn.get("role", ""))
    content = truncate(str(turn.get("content") or ""), MAX_TEXT_CHARS)
    if role == "tool":
        error = turn.get("error")
        color = _TURN_COLORS["error" if error else "tool"]
        head = f"<b>{esc(turn.get('name', 'tool'))}</b> " + ("was not offered" if turn.get("not_offered")
                                                          else "returned an error" if error else "returned")
        body = content if not error or error == content else f"{error}\n{content}"
        return (f'<div class="grpo-turn grpo-turn-tool" style="{_TURN_STYLE}{color}"><div style="font-size:12px">'
                f'{head}</div><pre style="{PRE_STYLE}">{esc(body)}</pre></div>')
    calls = "".join(
        f'<div class="grpo-tool-call" style="font-size:12px">→ call <b>{esc(c.get("name", ""))}</b>'
        f"<code>({esc(_arguments(c.get('arguments')))})</code></div>"
        for c in turn.get("tool_calls") or []
    )
    text = f'<pre style="{PRE_STYLE}">{esc(content)}</pre>' if content.strip() else ""
    return (f'<div class="grpo-turn grpo-turn-{esc(role)}" style="{_TURN_STYLE}{_TURN_COLORS["assistant"]}">'
            f'<div style="font-size:12px;opacity:.8">{esc(role)}</div>{text}{calls}</div>')


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, dict):
        return ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return "" if arguments is None else str(arguments)


def transcript_html(turns: list[dict[str, Any]]) -> str:
    """An agent episode, folded: a one-line summary that opens into every turn, in order."""
    calls = sum(len(t.get("tool_calls") or []) for t in turns)
    failed = sum(1 for t in turns if t.get("role") == "tool" and t.get("error"))
    not_offered = sum(1 for t in turns if t.get("role") == "tool" and t.get("not_offered"))
    replies = sum(1 for t in turns if t.get("role") == "assistant")
    last = next((str(t.get("content") or "") for t in reversed(turns) if t.get("role") == "assistant"), "")
    head = last.strip().splitlines()[0][:100] if last.strip() else "(no text)"
    summary = (f"{replies} assistant turn{'s' if replies != 1 else ''} · {calls} tool call{'s' if calls != 1 else ''}"
               + (f' · <span style="color:#dc2626">{failed} failed</span>' if failed else "")
               + (f' · <span class="grpo-not-offered" style="color:#dc2626">{not_offered} to tools not offered</span>'
                  if not_offered else "")
               + f' · last reply: <span style="opacity:.8">{esc(head)}</span>')
    return (f'<details class="grpo-turns"><summary style="font-size:12px">{summary}</summary>'
            f'{"".join(_turn_html(t) for t in turns)}</details>')


def components_html(components: dict[str, float], before: dict[str, float] | None = None) -> str:
    """A completion's reward components, ``name 0.50`` each; with ``before``, changed ones as ``0.20→0.50``."""
    if not components and not before:
        return ""
    parts = []
    for name in dict.fromkeys([*(before or {}), *components]):
        now, old = components.get(name), (before or {}).get(name)
        text = "–" if now is None else f"{now:.2f}"
        if before is not None and (old is None or now is None or abs(old - now) > 1e-9):
            text = f'{"–" if old is None else f"{old:.2f}"}→<b>{text}</b>'
        parts.append(f'<span class="grpo-component" style="margin-right:10px">{esc(name)} {text}</span>')
    return f'<div style="font-size:11px;opacity:.85;margin:2px 0 0 30px">{"".join(parts)}</div>'


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
        f'<div class="grpo-group" style="{CARD_STYLE}">'
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


# ---------------------------------------------------------------- header, info, errors


def header_html(view: RunView) -> str:
    """Title, status badge and the current phase's message."""
    color = STATUS_COLORS.get(view.status, "#6b7280")
    if view.stop_requested and view.finished is None:
        color = STATUS_COLORS["stopping"]
    message = (
        f' <span style="opacity:.8">{esc(view.message)}</span>' if view.message and view.finished is None else ""
    )
    title = f"GRPO · {esc(view.env_name)}" if view.env_name else "GRPO"
    return (
        f'<div style="font-size:15px"><b>{title}</b> '
        f'<span class="grpo-status" style="{BADGE}background:{color};font-size:12px">{esc(view.status_text)}</span>'
        f"{message}</div>{settings_html(view)}"
    )


def settings_html(view: RunView) -> str:
    """The recipe and every GRPOConfig setting that differs from TRL's defaults, on one small line."""
    recipe = view.params.get("recipe") if isinstance(view.params, dict) else None
    changed = getattr(view, "trl_config", None) or {}
    if not recipe and not changed:
        return ""
    parts = [f"recipe <b>{esc(str(recipe))}</b>"] if recipe else []
    if changed:
        parts.append("TRL settings not at TRL's default: " + ", ".join(
            f"<code>{esc(str(k))}={esc(repr(v))}</code>" for k, v in changed.items()))
    return f'<div class="grpo-settings" style="font-size:11px;opacity:.8">{" · ".join(parts)}</div>'


def progress_text(view: RunView) -> str:
    """``step 12/40 · elapsed 0:12 · ETA 0:28``."""
    total = view.max_steps or 0
    step_text = f"step {view.step}/{total}" if total else f"step {view.step}"
    eta = view.eta()
    text = f"&nbsp;{step_text} · elapsed {duration(view.elapsed())}" + (
        f" · ETA {duration(eta)}" if eta is not None else ""
    )
    if view.abandoned_running:
        n = view.abandoned_running
        text += (f' · <span class="grpo-abandoned" style="color:#d97706" title="episodes past rl_episode_timeout '
                 f'whose score_episode has not returned; they can no longer use the policy">⚠ {n} abandoned '
                 f"episode{'s' if n > 1 else ''} still running</span>")
    return text


def info_html(view: RunView) -> str:
    """Model, env and output folder; at the end, the reason and what was saved."""
    parts = []
    if view.model:
        parts.append(f"model <code>{esc(view.model)}</code>")
    if view.env_name:
        parts.append(f"env <code>{esc(view.env_name)}</code>")
    if view.output_dir:
        parts.append(f"output <code>{esc(view.output_dir)}</code>")
    for swap in view.swaps:
        parts.append(f"env swapped to <code>{esc(swap.class_name)}</code> at step {swap.step} "
                     f'<span style="opacity:.7">(source {esc(swap.source_hash[:8])})</span>')
    info = " · ".join(parts)
    f = view.finished
    if f is not None:
        if f.reason and f.status == "failed":
            info += f'<div style="color:#dc2626"><b>failed:</b> {esc(f.reason)}</div>'
        elif f.reason:
            info += f"<div>{esc(f.status)}: {esc(f.reason)}</div>"
        if f.saved:
            info += "<div>saved: " + ", ".join(f"<code>{esc(s)}</code>" for s in f.saved) + "</div>"
    for note in view.notes[:5]:
        info += f'<div class="grpo-note" style="color:#d97706">note: {esc(note)}</div>'
    if len(view.notes) > 5:
        info += f'<div class="grpo-note" style="color:#d97706">note: {len(view.notes) - 5} more lines skipped</div>'
    return info


def errors_html(view: RunView) -> str:
    """Episode errors: counts by kind, then the latest tracebacks."""
    if not view.error_total:
        return "<i>no episode errors</i>"
    counts = "".join(
        f"<li><b>{esc(kind)}</b>: {n}</li>" for kind, n in sorted(view.error_counts.items(), key=lambda kv: -kv[1])
    )
    latest = "".join(
        f"<details><summary>step {e.step} · #{e.index} · <b>{esc(e.kind)}</b>: {esc(e.message)}</summary>"
        f'<pre style="{PRE_STYLE}">{esc(e.traceback[-MAX_TRACEBACK_CHARS:])}</pre></details>'
        for e in reversed(view.latest_errors)
    )
    return (
        f"<div>{view.error_total} episode errors (their completions got no reward)</div>"
        f'<ul style="margin:4px 0">{counts}</ul><div><b>latest</b></div>{latest}'
    )


# ---------------------------------------------------------------- alarms of the reward-hacking watch

ALARM_COLOR = "#dc2626"
ALARM_STYLE = (f"border:1px solid {ALARM_COLOR};border-left:4px solid {ALARM_COLOR};border-radius:6px;"
               "padding:8px 10px;margin:6px 0;background:rgba(220,38,38,.05);")
MAX_EXAMPLES = 3  # example completions shown per alarm (the watch keeps two or three)
MAX_EXAMPLE_CHARS = 600
MAX_SERIES = 8  # evidence series shown per alarm
#: Evidence series the card shows, beyond the reward and the task metrics: (key, the key of their steps, name).
EVIDENCE_SERIES = (
    ("repetitive_share", "repetitive_steps", "repetitive share"),
    ("collapse_share", "collapse_steps", "near-copies share"),
    ("lengths", "length_steps", "completion length"),
)


def _numbers(values: Any) -> list[float | None]:
    """A list of finite numbers (None where a value is not one) from evidence that is data of any shape."""
    if not isinstance(values, (list, tuple)):
        return []
    out: list[float | None] = []
    for v in values[:500]:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
        out.append(float(v) if ok else None)
    return out


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def sparkline_svg(values: list[float | None], color: str = "#2563eb", width: int = 120, height: int = 22) -> str:
    """A small inline SVG line of ``values`` (numbers only go into it; gaps break the line)."""
    points = [(i, v) for i, v in enumerate(values) if v is not None]
    if not points:
        return ""
    lo, hi = min(v for _, v in points), max(v for _, v in points)
    span = hi - lo or 1.0
    n = max(1, len(values) - 1)
    segments: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            segments.append([])
            continue
        x = 1 + (width - 2) * i / n
        y = height - 2 - (height - 4) * ((v - lo) / span if hi > lo else 0.5)
        segments[-1].append(f"{x:.1f},{y:.1f}")
    lines = "".join(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.5"/>'
                    for seg in segments if len(seg) > 1)
    dots = "".join(f'<circle cx="{seg[-1].split(",")[0]}" cy="{seg[-1].split(",")[1]}" r="1.8" fill="{color}"/>'
                   for seg in segments[-1:] if seg)
    return (f'<svg class="grpo-sparkline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'style="vertical-align:middle">{lines}{dots}</svg>')


def evidence_series(evidence: dict[str, Any]) -> list[tuple[str, list[Any], list[float | None]]]:
    """The metric values over the alarm's window: (name, steps, values), the reward first, then the task metrics,
    then what the kind of alarm measured (a component that took over, repetition, near-copies, lengths)."""
    steps = evidence.get("steps") if isinstance(evidence.get("steps"), list) else []
    out: list[tuple[str, list[Any], list[float | None]]] = []
    reward = _numbers(evidence.get("reward"))
    if reward:
        out.append(("reward", steps, reward))
    named = {"reward"}
    for group, label in (("tasks", task_label), ("components", lambda n: f"component: {n}")):
        series = evidence.get(group)
        if isinstance(series, dict):
            for name, values in series.items():
                shown = label(str(name))
                if shown not in named and _numbers(values):
                    named.add(shown)
                    out.append((shown, steps, _numbers(values)))
    for key, steps_key, name in EVIDENCE_SERIES:
        values = _numbers(evidence.get(key))
        if values:
            own = evidence.get(steps_key)
            out.append((name, own if isinstance(own, list) else steps, values))
    return out[:MAX_SERIES]


def _evidence_table(evidence: dict[str, Any]) -> str:
    series = evidence_series(evidence)
    evals = evidence.get("evals") if isinstance(evidence.get("evals"), list) else []
    if not series and not evals:
        return ""
    colors = ("#2563eb", "#16a34a", "#7c3aed", "#d97706", "#0891b2", "#db2777", "#65a30d", "#6b7280")
    rows = []
    for i, (name, steps, values) in enumerate(series):
        known = [v for v in values if v is not None]
        first, last = (known[0], known[-1]) if known else (None, None)
        span = ""
        nums = [s for s in steps if isinstance(s, int) and not isinstance(s, bool)]
        if nums:
            span = f"steps {nums[0]}–{nums[-1]}"
        every = ", ".join(_fmt(v) for v in values)
        rows.append(
            f'<tr class="grpo-evidence-row"><td style="padding:0 8px 0 0"><b>{esc(name)}</b></td>'
            f'<td style="padding:0 8px 0 0">{sparkline_svg(values, colors[i % len(colors)])}</td>'
            f'<td style="padding:0 8px 0 0;white-space:nowrap">{_fmt(first)} → <b>{_fmt(last)}</b></td>'
            f'<td style="opacity:.7;white-space:nowrap">{esc(span)}</td>'
            f'<td><details><summary style="font-size:11px;opacity:.8">values</summary>'
            f'<code style="font-size:11px">{esc(every)}</code></details></td></tr>'
        )
    for e in evals[:4]:
        if isinstance(e, dict):
            mean = _numbers([e.get("mean")])
            rows.append(f'<tr class="grpo-evidence-row"><td><b>held-out eval</b></td><td></td>'
                        f'<td>{_fmt(mean[0] if mean else None)}</td><td style="opacity:.7">step {esc(e.get("step"))}'
                        "</td><td></td></tr>")
    return f'<table class="grpo-evidence" style="font-size:12px;margin:4px 0;border-collapse:collapse">{"".join(rows)}</table>'


def _example_html(example: Any) -> str:
    if not isinstance(example, dict):
        return ""
    score = _numbers([example.get("score")])
    parts = [f"score {_fmt(score[0] if score else None)}"]
    comps = example.get("components")
    if isinstance(comps, dict):
        for name, value in list(comps.items())[:6]:
            v = _numbers([value])
            parts.append(f"{name} {_fmt(v[0] if v else None)}")
    prompt = str(example.get("prompt", ""))
    head = prompt.strip().splitlines()[0][:120] if prompt.strip() else ""
    return (
        '<div class="grpo-alarm-example" style="margin:4px 0 0 0">'
        f'<div style="font-size:11px;opacity:.85">{esc(" · ".join(parts))}'
        + (f' · prompt <span style="opacity:.8">{esc(head)}</span>' if head else "")
        + f'</div><pre style="{PRE_STYLE}">{esc(truncate(str(example.get("completion", "")), MAX_EXAMPLE_CHARS))}'
        "</pre></div>"
    )


def alarm_card_html(alarm: dict[str, Any]) -> str:
    """One alarm of the reward-hacking watch: its kind and step, the one-sentence message, the evidence (the
    window's reward and task-metric values, a sparkline each) and two or three example completions. Everything
    that comes from the run (the message, the evidence, the completions) is escaped."""
    evidence = alarm.get("evidence") if isinstance(alarm.get("evidence"), dict) else {}
    examples = evidence.get("examples") if isinstance(evidence.get("examples"), list) else []
    shown = "".join(_example_html(e) for e in examples[:MAX_EXAMPLES])
    return (
        f'<div class="grpo-alarm" data-kind="{esc(alarm.get("kind", ""))}" data-step="{esc(alarm.get("step", ""))}" '
        f'style="{ALARM_STYLE}">'
        f'<div><span style="{BADGE}background:{ALARM_COLOR};margin-left:0">⚠ alarm</span> '
        f'<b>{esc(alarm.get("kind", ""))}</b> at step <b>{esc(alarm.get("step", ""))}</b></div>'
        f'<div class="grpo-alarm-message" style="margin:4px 0">{esc(alarm.get("message", ""))}</div>'
        f"{_evidence_table(evidence)}"
        + (f'<div style="font-size:12px;margin-top:4px"><b>example completions</b></div>{shown}' if shown else "")
        + "</div>"
    )


def alarms_html(view: RunView) -> str:
    """The alarm cards of a run, in the order they fired; "" when none fired."""
    if not view.alarms:
        return ""
    head = (f'<div style="font-size:13px;color:{ALARM_COLOR}"><b>Reward-hacking watch: {len(view.alarms)} '
            f"alarm{'s' if len(view.alarms) != 1 else ''}</b> (red lines on the curves; "
            "docs/explanation/watch.md says what each kind tests)</div>")
    return f'<div class="grpo-alarms-list">{head}{"".join(alarm_card_html(a) for a in view.alarms)}</div>'


def alarms_text(view: RunView) -> str:
    """The alarms in words, for a terminal and ``repr``: one line each, and the window's first and last values."""
    lines = []
    for alarm in view.alarms:
        evidence = alarm.get("evidence") if isinstance(alarm.get("evidence"), dict) else {}
        lines.append(f"ALARM {redact(str(alarm.get('kind', '')))} at step {alarm.get('step')}: "
                     f"{redact(str(alarm.get('message', '')))}")
        values = []
        for name, _steps, series in evidence_series(evidence)[:4]:
            known = [v for v in series if v is not None]
            if known:
                values.append(f"{name} {_fmt(known[0])} → {_fmt(known[-1])}")
        if values:
            lines.append("  window: " + "; ".join(values))
    return "\n".join(lines)
