"""The one exception type users see from the Python API."""

from __future__ import annotations


class GRPOMagicError(ValueError):
    """A bad input or a run that cannot go on, said in one sentence that names the fix."""
