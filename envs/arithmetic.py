"""ArithmeticEnv: single-turn reasoning with a checkable answer in ``<answer>...</answer>``.

The smallest useful env: no tools, no extra turns. Each row is a generated arithmetic problem; the
reward checks the format first (exactly one ``<answer>`` tag pair) and then the value, so that a
model learns the format before it can learn the arithmetic. See ``RUBRIC``.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

DIFFICULTIES = ("easy", "normal", "hard")

# Scoring rubric (the one place that defines the reward):
RUBRIC: dict[str, float] = {
    "no_tags": 0.0,  # no <answer> tag at all
    "malformed": 0.0,  # unbalanced tags or several answers: spraying guesses must not pay
    "format": 0.2,  # exactly one well-formed <answer>...</answer> pair, wrong or non-numeric content
    "correct": 1.0,  # that pair holds the right number ("42", " 42 ", "42.0" all count for 42)
}

SYSTEM_PROMPT = (
    "You solve arithmetic problems. Think step by step, then give only the final number inside "
    "<answer></answer> tags, for example <answer>42</answer>."
)

_PAIR_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class Node:
    """A tiny expression tree, so that problems are computed exactly (no ``eval``)."""

    def __init__(self, value: int | None = None, op: str = "", left: Node | None = None, right: Node | None = None):
        self.value, self.op, self.left, self.right = value, op, left, right

    def evaluate(self) -> int:
        if self.left is None or self.right is None:
            return int(self.value or 0)
        a, b = self.left.evaluate(), self.right.evaluate()
        return {"+": a + b, "-": a - b, "*": a * b}[self.op]

    def render(self, top: bool = True) -> str:
        if self.left is None or self.right is None:
            return str(self.value)
        text = f"{self.left.render(False)} {self.op} {self.right.render(False)}"
        return text if top else f"({text})"


def _leaf(rng: random.Random, lo: int, hi: int) -> Node:
    return Node(value=rng.randint(lo, hi))


def _problem(rng: random.Random, difficulty: str) -> tuple[str, int]:
    """One problem as (text, answer)."""
    if difficulty == "easy":  # a + b
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        return f"{a} + {b}", a + b
    if difficulty == "normal":  # two operations, usual precedence, no parentheses
        a, b, c = (rng.randint(1, 20) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice("+-")
        if op1 == "*":
            b = rng.randint(2, 9)
        value = {"+": a + b, "-": a - b, "*": a * b}[op1]
        value = value + c if op2 == "+" else value - c
        return f"{a} {op1} {b} {op2} {c}", value
    # hard: three operations with parentheses, e.g. (7 + 5) * (9 - 4) or ((3 + 8) * 4) - 6
    shape = rng.choice(("pair", "nested"))
    if shape == "pair":
        tree = Node(
            op="*",
            left=Node(op=rng.choice("+-"), left=_leaf(rng, 1, 15), right=_leaf(rng, 1, 15)),
            right=Node(op=rng.choice("+-"), left=_leaf(rng, 1, 9), right=_leaf(rng, 1, 9)),
        )
    else:
        inner = Node(op=rng.choice("+-"), left=_leaf(rng, 1, 20), right=_leaf(rng, 1, 20))
        tree = Node(
            op=rng.choice("+-"),
            left=Node(op="*", left=inner, right=_leaf(rng, 2, 9)),
            right=_leaf(rng, 1, 30),
        )
    return tree.render(), tree.evaluate()


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class ArithmeticEnv:
    """Arithmetic problems; ``rl_env_config`` keys: difficulty, n_problems, seed."""

    def __init__(self, difficulty: str = "easy", n_problems: int = 64, seed: int = 0) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTIES)}; got {difficulty!r}")
        if int(n_problems) < 1:
            raise ValueError(f"n_problems must be at least 1; got {n_problems!r}")
        self.difficulty = difficulty
        self.seed = int(seed)
        rng = random.Random(f"arithmetic-{self.seed}-{difficulty}")
        self.problems: list[tuple[str, int]] = [_problem(rng, difficulty) for _ in range(int(n_problems))]

    def build_dataset(self, tokenizer: Any = None) -> Any:
        """Chat prompts plus ``answer`` (a string), which reaches ``score_episode`` as a keyword."""
        from datasets import Dataset

        return Dataset.from_dict(
            {
                "prompt": [
                    [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": f"What is {text}?"},
                    ]
                    for text, _ in self.problems
                ],
                "answer": [str(value) for _, value in self.problems],
            }
        )

    def get_tools(self) -> list[dict[str, Any]]:
        return []

    def score_episode(self, model: Any, tokenizer: Any, completion: str, answer: str) -> float:
        """Single turn: the model is not called again; only the completion text is checked."""
        return score_answer(completion, answer)


def score_answer(completion: str, answer: str) -> float:
    """The ``RUBRIC`` applied to one completion."""
    opens, closes = completion.count("<answer>"), completion.count("</answer>")
    if opens == 0 and closes == 0:
        return RUBRIC["no_tags"]
    pairs = _PAIR_RE.findall(completion)
    if opens != 1 or closes != 1 or len(pairs) != 1:
        return RUBRIC["malformed"]
    got, want = _number(pairs[0]), _number(str(answer))
    if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=1e-6):
        return RUBRIC["correct"]
    return RUBRIC["format"]
