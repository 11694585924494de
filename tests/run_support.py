"""What the tests that catch a run mid-training share: a letters env slow enough to catch, a wait for a
background run's step (the tests assert what they need of the run afterwards), and a wait for a whole state."""

from __future__ import annotations

import time
from typing import Any

from envs.letters import LettersEnv


class SlowLettersEnv(LettersEnv):
    """LettersEnv whose every episode takes ``delay`` seconds more (a subclass sets its own)."""

    delay = 0.05

    def score_episode(self, model, tokenizer, completion, letter):
        time.sleep(self.delay)
        return super().score_episode(model, tokenizer, completion, letter)


def wait_for_step(run: Any, step: int, timeout: float = 300.0, poll: float = 0.1) -> None:
    """Wait until a background run reaches ``step``, ends, or ``timeout`` seconds pass."""
    wait_until(lambda: run.step >= step or run.done, timeout, poll)


def wait_until(predicate: Any, timeout: float = 60.0, poll: float = 0.02) -> bool:
    """Wait for a thread to reach a whole state, not one part of it (a dashboard turn sets the header before
    the cards: a test that waited for the header alone could read the cards mid-turn); the last reading."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(poll)
    return predicate()
