"""What one episode gave: a usable score, or an episode error (docs/architecture.md, "The environment interface").

A score must be a finite number; out of [0, 1] it is clipped and counted; an exception, ``None``,
NaN or a non-number is an *episode error*: the completion gets no reward (TRL's ``None``, never a
fake 0) and the error, with its traceback, is kept for the run log and the dashboard.
"""

from __future__ import annotations

import math
import numbers
import traceback
from dataclasses import dataclass
from typing import Any

from .redaction import redact
from .text import safe_text


@dataclass
class EpisodeOutcome:
    """What one ``score_episode`` call gave: a usable score, or an error."""

    score: float | None
    clipped: bool = False
    raw: Any = None
    error: dict[str, Any] | None = None
    latency_s: float = 0.0


def episode_error(kind: str, message: str, tb: str = "") -> dict[str, Any]:
    # Env errors end up in logs, dashboards and terminals: a token in a message must not.
    return {"kind": kind, "message": redact(message), "traceback": redact(tb)}


def normalize_score(value: Any) -> EpisodeOutcome:
    """A finite number in [0, 1]; out of range is clipped; anything else is an episode error."""
    if value is None:
        return EpisodeOutcome(None, raw=None, error=episode_error(
            "None", "score_episode returned None; return a float between 0 and 1."))
    if isinstance(value, numbers.Real):  # includes bool, int and numpy scalars
        try:
            score = float(value)
        except Exception:  # noqa: BLE001 - an int too large for a float, a broken __float__
            return EpisodeOutcome(None, raw=safe_text(value)[:200], error=episode_error(
                "not a number", f"score_episode returned {safe_text(value)[:80]}, which is not a finite float; "
                "return a float between 0 and 1."))
        if math.isnan(score):
            return EpisodeOutcome(None, raw=score, error=episode_error(
                "NaN", "score_episode returned NaN; return a float between 0 and 1."))
        if math.isinf(score):
            return EpisodeOutcome(None, raw=score, error=episode_error(
                "inf", f"score_episode returned {score}; return a float between 0 and 1."))
        if score < 0.0 or score > 1.0:
            return EpisodeOutcome(min(1.0, max(0.0, score)), clipped=True, raw=score)
        return EpisodeOutcome(score, raw=score)
    name = type(value).__name__
    try:
        hint = " (use .item() to get a float)" if hasattr(value, "item") else ""
    except Exception:  # noqa: BLE001 - a __getattr__ that raises something else than AttributeError
        hint = ""
    return EpisodeOutcome(None, raw=safe_text(value)[:200], error=episode_error(
        "not a number", f"score_episode returned a {name}, not a number{hint}; return a float between 0 and 1."))


def exception_outcome(exc: BaseException, latency: float) -> EpisodeOutcome:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"{type(exc).__name__}: {safe_text(exc, str)}"
    return EpisodeOutcome(None, error=episode_error(type(exc).__name__, message, tb), latency_s=latency)


def timeout_outcome(timeout: float) -> EpisodeOutcome:
    return EpisodeOutcome(None, error=episode_error(
        "timeout", f"the episode ran past rl_episode_timeout ({timeout:g} s) and was abandoned"), latency_s=timeout)
