"""Small text helpers every surface shares: one-line messages, safe reprs, durations, numbers.

User-facing errors are one sentence (docs/architecture.md, "Errors"), whatever an env or a
library raised; these helpers are the one place that turns arbitrary values and exceptions into
short, printable text, so that the API, the CLI, the magics and the dashboard word them alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def one_line(exc: BaseException | str, limit: int = 200) -> str:
    """The first non-empty line of an exception (or text), at most ``limit`` characters.

    An exception whose ``__str__`` raises, or that has no message, gives its type's name.
    """
    try:
        text = exc if isinstance(exc, str) else str(exc)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        lines = []
    first = lines[0] if lines else (type(exc).__name__ if not isinstance(exc, str) else "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def safe_text(value: Any, how: Callable[[Any], str] = repr) -> str:
    """``repr`` (or ``str``) of anything an env hands us, even an object whose ``__repr__`` raises."""
    try:
        return how(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break an error message
        return f"<{type(value).__name__} object>"


def show(value: Any, limit: int = 60) -> str:
    """A value for a message: its ``repr``, cut to ``limit`` characters (a 5000-digit int cannot even print)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finite(value: Any) -> float | None:
    """A number as a finite float, or None when missing, not a number, NaN or infinite (bools are not numbers)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def format_duration(seconds: float | None, unknown: str = "-") -> str:
    """``m:ss``, or ``h:mm:ss`` past an hour; ``unknown`` when not known."""
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        return unknown
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 GPU``, ``2 GPUs``; ``many`` for irregular plurals (``process`` -> ``processes``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def module_name_of_path(value: str) -> str | None:
    """The dotted module name that a file path given as a module means (``my_envs/json_env.py`` is
    ``my_envs.json_env``, relative to the current folder when inside it), or None when ``value`` is no path."""
    import os
    from pathlib import Path

    text = value.strip().replace("\\", "/")
    if not (text.endswith(".py") or "/" in text):
        return None
    path = Path(text[:-3] if text.endswith(".py") else text).expanduser()
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(Path(os.getcwd()).resolve())
        except ValueError:  # outside the current folder: its own name, imported from its folder
            path = Path(path.name)
    parts = [part for part in path.parts if part not in ("", ".")]
    return ".".join(parts) if parts else None


def printable(text: str) -> str:
    """``text`` with control characters shown as escapes (NUL as ``\\x00``, ESC as ``\\x1b``): a completion's bytes
    must not ring the terminal's bell, move its cursor, colour it, or make ``grep`` call a log binary.
    Line ends and tabs stay."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii") for c in text)
