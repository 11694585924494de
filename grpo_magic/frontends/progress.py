"""Terminal progress for the CLI: the run's view model (``dashboard.state.RunView``) as plain text.

It folds each event into the same ``RunView`` the notebook dashboard renders, and prints: one
progress line per logged step (updated in place with a carriage return on a TTY, one line per step
otherwise, so that logs and CI output stay readable), a short look at the latest group(s) every few
steps, status changes, env swaps, the first error of each kind, one line per reward-hacking alarm, and the
final line.

Long work outside a run (``%grpo_eval``) says its progress in a notebook on one line that updates
(``updating_line``).
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from grpo_magic.dashboard.state import RunView
from grpo_magic.events import (
    AlarmRaised,
    EnvSwapped,
    EpisodeError,
    EvalScored,
    Event,
    GroupScored,
    RunFinished,
    RunStarted,
    StatusChanged,
    StepLogged,
)
from grpo_magic.redaction import redact
from grpo_magic.text import finite, format_duration, plural, printable

_BAR_WIDTH = 20


def eval_line(event: EvalScored) -> str:
    """One line per held-out evaluation (``--eval-steps``): greedy and sampled means, pass@k, its cost."""
    parts = [f"greedy {_num(event.greedy_mean, '.3f')}" if event.greedy_mean is not None else "",
             f"sampled {_num(event.sampled_mean, '.3f')}" if event.sampled_mean is not None else "",
             *(f"{k} {_num(v, '.3f')}" for k, v in event.pass_at_k.items() if v is not None)]
    what = "baseline" if event.baseline else f"step {event.step}"
    return (f"grpo: held-out eval ({what}, {plural(event.prompts, 'prompt')}): {', '.join(p for p in parts if p)}"
            f" in {event.seconds:.1f} s")


def alarm_line(event: AlarmRaised) -> str:
    """One line per reward-hacking alarm: ``grpo: ALARM (divergence) at step 12: The reward rose ...``."""
    return f"grpo: ALARM ({event.kind}) at step {event.step}: {shorten(event.message, 400)}"


def progress_bar(done: int, total: int, width: int = _BAR_WIDTH) -> str:
    """``[=====>    ]``: the head marks where the run is."""
    if total <= 0:
        return ""
    frac = min(max(done / total, 0.0), 1.0)
    filled = int(frac * width)
    if filled >= width:
        return "[" + "=" * width + "]"
    head = ">" if done > 0 else " "
    return "[" + "=" * max(filled - 1, 0) + (head if filled else " ") + " " * (width - max(filled, 1)) + "]"


def shorten(text: str, width: int) -> str:
    """One line of at most ``width`` characters: newlines become ``⏎``, the rest is cut with ``…``."""
    one_line = " ⏎ ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())
    one_line = " ".join(one_line.split())
    if len(one_line) <= width:
        return one_line
    return one_line[: max(width - 1, 1)] + "…"


def _num(value: object, fmt: str) -> str | None:
    f = finite(value)
    return None if f is None else format(f, fmt)


class TerminalProgress:
    """Writes the run's progress to a text stream (``sys.stderr`` by default).

    ``summary_every``: every that many steps, show ``groups_shown`` of the latest step's groups
    (prompt and completions shortened to one line each, with score and advantage); 0 turns it off.
    """

    def __init__(self, stream: TextIO | None = None, summary_every: int = 5, groups_shown: int = 1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.summary_every = summary_every
        self.groups_shown = groups_shown
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.view = RunView(max_group_steps=1)
        self._lock = threading.Lock()
        self._open_line = False  # a TTY progress line waits to be overwritten or ended
        self._summarized: int | None = None  # the step whose groups were last shown

    # ---- output helpers -----------------------------------------------------------------

    def _width(self) -> int:
        return shutil.get_terminal_size((100, 24)).columns if self.tty else 100

    def _write_line(self, text: str) -> None:
        """A whole line, ending the in-place progress line first; redacted like everything we print, and with
        control characters (from completions, prompts, env errors) escaped."""
        text = printable(redact(text))
        if self._open_line:
            self.stream.write("\n")
            self._open_line = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def _write_progress(self, text: str) -> None:
        text = printable(redact(text))
        if self.tty:
            width = self._width()
            self.stream.write("\r" + text[: width - 1].ljust(width - 1))
            self._open_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    # ---- the subscriber -----------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.view.apply(event)
            if isinstance(event, RunStarted):
                self._write_line(f"grpo: {event.env_name} on {event.model} -> {event.output_dir}")
            elif isinstance(event, StatusChanged):
                message = f" ({event.message})" if event.message else ""
                self._write_line(f"grpo: {event.status}{message}")
            elif isinstance(event, EpisodeError):
                if self.view.error_counts.get(event.kind) == 1:
                    self._write_line(
                        f"grpo: episode error {event.kind} at step {event.step}: "
                        f"{shorten(event.message, self._width() - 40)} (no reward for that completion; "
                        "further errors of this kind are counted on the progress line)"
                    )
            elif isinstance(event, EnvSwapped):
                previous = f" (was {event.previous_hash})" if event.previous_hash else ""
                self._write_line(f"grpo: env swapped: step {event.step} on is scored by {event.class_name} "
                                 f"({event.env_name}, source {event.source_hash}{previous})")
            elif isinstance(event, EvalScored):
                self._write_line(eval_line(event))
            elif isinstance(event, AlarmRaised):
                self._write_line(alarm_line(event))
            elif isinstance(event, StepLogged):
                self._on_step(event)
            elif isinstance(event, RunFinished):
                self._on_finished(event)

    def _on_step(self, event: StepLogged) -> None:
        self._write_progress(self.progress_line(event))
        step = self.view.latest_group_step()
        if self.summary_every > 0 and step is not None and step != self._summarized and event.step % self.summary_every == 0:
            self._summarized = step
            for group in self.view.groups_mem[step][: max(self.groups_shown, 0)]:
                for line in self.group_summary(group):
                    self._write_line(line)

    def progress_line(self, event: StepLogged) -> str:
        """``step 12/40 [=====>    ] reward 0.43 ±0.12 kl 0.003 err 0/16 elapsed 0:12 eta 0:28``."""
        view = self.view
        total = view.max_steps or 0
        parts = [f"step {event.step}/{total}" if total else f"step {event.step}"]
        if total:
            parts.append(progress_bar(event.step, total))
        m = event.metrics
        reward = _num(m.get("reward"), ".2f")
        if reward is not None:
            std = _num(m.get("reward_std"), ".2f")
            parts.append(f"reward {reward}" + (f" ±{std}" if std is not None else ""))
        kl = _num(m.get("kl"), ".3g")
        if kl is not None:
            parts.append(f"kl {kl}")
        parts.append(f"err {event.episode_errors}/{event.episodes}")
        if event.episodes_abandoned:
            parts.append(f"abandoned {event.episodes_abandoned} still running")
        parts.append(f"elapsed {format_duration(view.elapsed())}")
        eta = view.eta()
        if eta is not None:
            parts.append(f"eta {format_duration(eta)}")
        return " ".join(parts)

    def group_summary(self, group: GroupScored) -> list[str]:
        """The group in a few lines: its prompt, then each completion with score and advantage."""
        width = self._width()
        mean = _num(group.mean, ".2f")
        std = _num(group.std, ".2f")
        stats = f"mean {mean} std {std}" if mean is not None else "no valid score"
        if group.zero_variance:
            stats += " (all scores equal: no learning signal)"
        head = f"  step {group.step} group {group.group} ({stats}) prompt: "
        lines = [head + shorten(group.prompt, max(width - len(head), 20))]
        for i, completion in enumerate(group.completions):
            score = group.scores[i] if i < len(group.scores) else None
            adv = group.advantages[i] if i < len(group.advantages) else None
            error = group.errors[i] if i < len(group.errors) else None
            score_text = "err " if score is None else f"{float(score):.2f}"
            adv_text = f"{float(adv):+.2f}" if adv is not None else "  -  "
            mark = ""
            if error:
                mark = f" [{error.get('kind', 'error')}]"
            elif i < len(group.clipped) and group.clipped[i]:
                mark = " [clipped]"
            turns = group.transcripts[i] if i < len(group.transcripts) else []
            if turns:  # an agent episode: the completion is its last reply
                calls = sum(len(t.get("tool_calls") or []) for t in turns)
                failed = sum(1 for t in turns if t.get("role") == "tool" and t.get("error"))
                mark += f" [{plural(calls, 'tool call')}" + (f", {failed} failed]" if failed else "]")
            prefix = f"    {score_text} A {adv_text}{mark} "
            lines.append(prefix + shorten(completion, max(width - len(prefix), 20)))
        return lines

    def _on_finished(self, event: RunFinished) -> None:
        steps = event.steps or self.view.step
        text = f"grpo: run {event.status} after {plural(steps, 'step')}"
        if event.reason:
            text += f": {event.reason}"
        if event.output_dir:
            text += f" (output: {event.output_dir})"
        self._write_line(text)


def updating_line() -> Callable[[str], None]:
    """A notebook's progress line: displayed once, then updated in place (display_id), no widget needed.

    IPython in a terminal prints each update as a line of its own, as the CLI does on stderr."""
    from IPython.display import DisplayHandle

    handle, shown = DisplayHandle(), []

    def say(line: str) -> None:
        (handle.update if shown else handle.display)({"text/plain": line}, raw=True)
        shown.append(line)

    return say
