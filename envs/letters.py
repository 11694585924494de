"""The teaching environment for the offline ``tiny`` model on CPU.

Each prompt asks for text made of one letter; the reward is that letter's share of the
reply's characters. A random tiny model starts near zero and learns within a minute on two
cores. It also shows reward hacking: the model learns to repeat the one letter, which is
exactly what the reward asks for and nothing a user would want.
"""

from __future__ import annotations

import string

from datasets import Dataset


class LettersEnv:
    """Reward = share of the asked letter among the reply's non-space characters."""

    def __init__(self, letters: str = "a", n_prompts: int = 64) -> None:
        if not letters or any(c not in string.ascii_lowercase for c in letters):
            raise ValueError(f"letters must be lowercase ascii letters, got {letters!r}")
        self.letters = letters
        self.n_prompts = n_prompts

    def build_dataset(self, tokenizer) -> Dataset:
        letters = [self.letters[i % len(self.letters)] for i in range(self.n_prompts)]
        return Dataset.from_dict({
            "prompt": [f"Write the letter {c} many times: " for c in letters],
            "letter": letters,
        })

    def score_episode(self, model, tokenizer, completion: str, letter: str) -> float:
        chars = [c for c in completion.lower() if not c.isspace()]
        if not chars:
            return 0.0
        return sum(c == letter for c in chars) / len(chars)

    def get_tools(self) -> list[dict]:
        return []
