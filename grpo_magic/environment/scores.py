"""What one episode gave: a usable score, or an episode error (docs/architecture.md, "The environment interface").

A score must be a finite number; out of [0, 1] it is clipped and counted; an exception, ``None``,
NaN or a non-number is an *episode error*: the completion gets no reward (TRL's ``None``, never a
fake 0) and the error, with its traceback, is kept for the run log and the dashboard.

``score_episode`` may also return a mapping ``{"score": x, **components}``: ``x`` is checked as a
number is, and every other finite number is a *component* (a part of the reward shown on its own:
``{"score": 0.7, "format": 1.0, "correct": 0.0}``). A component that is not a finite number is an
episode *warning*: the episode keeps its score, the warning is counted and shown.
"""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_magic.redaction import redact
from grpo_magic.text import safe_text


@dataclass
class EpisodeOutcome:
    """What one ``score_episode`` call gave: a usable score, or an error."""

    score: float | None
    clipped: bool = False
    raw: Any = None
    error: dict[str, Any] | None = None
    latency_s: float = 0.0
    #: The finite numbers a mapping returned besides ``"score"`` (none for a plain number).
    components: dict[str, float] = field(default_factory=dict)
    #: One sentence per problem that cost no reward (a component that is not a number).
    warnings: list[str] = field(default_factory=list)


def episode_error(kind: str, message: str, tb: str = "") -> dict[str, Any]:
    # Env errors end up in logs, dashboards and terminals: a token in a message must not.
    return {"kind": kind, "message": redact(message), "traceback": redact(tb)}


def normalize_score(value: Any) -> EpisodeOutcome:
    """A finite number in [0, 1]; out of range is clipped; anything else is an episode error.

    A mapping is ``{"score": number, **components}`` (``split_components``).
    """
    if type(value) is float:  # the usual return, checked as the numbers.Real branch below checks it, without the
        return _float_outcome(value)  # two abstract-class checks (about a microsecond an episode)
    if isinstance(value, Mapping):
        return split_components(value)
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
        return _float_outcome(score)
    name = type(value).__name__
    try:
        hint = " (use .item() to get a float)" if hasattr(value, "item") else ""
    except Exception:  # noqa: BLE001 - a __getattr__ that raises something else than AttributeError
        hint = ""
    return EpisodeOutcome(None, raw=safe_text(value)[:200], error=episode_error(
        "not a number", f"score_episode returned a {name}, not a number{hint}; return a float between 0 and 1."))


def _float_outcome(score: float) -> EpisodeOutcome:
    """A float score: NaN and inf are episode errors, out of [0, 1] is clipped."""
    if math.isnan(score):
        return EpisodeOutcome(None, raw=score, error=episode_error(
            "NaN", "score_episode returned NaN; return a float between 0 and 1."))
    if math.isinf(score):
        return EpisodeOutcome(None, raw=score, error=episode_error(
            "inf", f"score_episode returned {score}; return a float between 0 and 1."))
    if score < 0.0 or score > 1.0:
        return EpisodeOutcome(min(1.0, max(0.0, score)), clipped=True, raw=score)
    return EpisodeOutcome(score, raw=score)


def split_components(value: Mapping[Any, Any]) -> EpisodeOutcome:
    """``{"score": x, **components}``: ``x`` as a plain score, the finite numbers as components."""
    if "score" not in value:
        keys = ", ".join(sorted(safe_text(k, str)[:40] for k in value)[:8]) or "none"
        return EpisodeOutcome(None, raw=safe_text(value)[:200], error=episode_error(
            "no score", f"score_episode returned a mapping without 'score' (keys: {keys}); return "
            "{'score': <a float between 0 and 1>, **components}, or a float."))
    inner = value["score"]
    if isinstance(inner, Mapping):  # no recursion: {"score": {"score": ...}} is a mistake, not a format
        outcome = EpisodeOutcome(None, raw=safe_text(inner)[:200], error=episode_error(
            "not a number", "score_episode returned a mapping whose 'score' is a mapping; make 'score' a float "
            "between 0 and 1."))
    else:
        outcome = normalize_score(inner)
    for key, part in value.items():
        if key == "score":
            continue
        name = safe_text(key, str)[:80]
        number = _finite(part)
        if number is None:
            outcome.warnings.append(redact(f"component {name!r} is {safe_text(part)[:60]} ({type(part).__name__}), "
                                           "not a finite number; it was left out (return numbers for components)."))
        else:
            outcome.components[name] = number
    return outcome


def _finite(value: Any) -> float | None:
    """A component as a float (bools count: ``{"format_ok": True}`` is 1.0), None unless finite."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except Exception:  # noqa: BLE001 - an int too large for a float, a broken __float__
        return None
    return number if math.isfinite(number) else None


def exception_outcome(exc: BaseException, latency: float) -> EpisodeOutcome:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"{type(exc).__name__}: {safe_text(exc, str)}"
    return EpisodeOutcome(None, error=episode_error(type(exc).__name__, message, tb), latency_s=latency)


def timeout_outcome(timeout: float) -> EpisodeOutcome:
    return EpisodeOutcome(None, error=episode_error(
        "timeout", f"the episode ran past rl_episode_timeout ({timeout:g} s) and was abandoned"), latency_s=timeout)
