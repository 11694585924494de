"""The one exception type users see from the Python API."""

from __future__ import annotations

from typing import Any

from .redaction import redact


class GRPOMagicError(ValueError):
    """A bad input or a run that cannot go on, said in one sentence that names the fix.

    Its message is redacted (docs/architecture.md, "What is redacted"): it is printed by the CLI,
    shown by the magics and pasted into bug reports, and may quote a config or an env's traceback.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))
