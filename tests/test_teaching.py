"""The SFT-then-GRPO lesson: the ``tiny-math`` warm start, ``envs/addition.py``, and the rise GRPO gives.

The lesson itself (the fixed recipe: 8 generations, batch 32, 8 new tokens, lr 5e-4, ``rl_kl_coef`` 0, 60
steps, raises the mean reward of ``tiny-math`` by at least 0.15 from the first 5 steps to the last 5, and its
held-out greedy accuracy as the run saved it) is proven once, by notebooks/04_sft_then_grpo.ipynb's own
assertions (tests/test_notebooks.py runs it); the tests here check its parts.
"""

from __future__ import annotations

import collections

import pytest

from envs import addition
from envs.addition import AdditionEnv, score_answer
from grpo_magic.models import tiny_math


def test_the_env_and_the_warm_start_hold_out_the_same_sums() -> None:
    held = addition.held_out_pairs()
    assert held == tiny_math.held_out_pairs()
    assert len(held) == 160 and all(10 <= a <= 49 and 10 <= b <= 49 for a, b in held)
    assert addition.all_pairs() == tiny_math.all_pairs()


def test_the_corpus_never_shows_a_held_out_sum_and_its_teachers_are_as_described() -> None:
    examples = tiny_math.corpus(0)
    assert len(examples) == tiny_math.CAREFUL_EXAMPLES + tiny_math.SLOPPY_EXAMPLES
    held = tiny_math.held_out_pairs()
    outcomes: dict[str, collections.Counter[str]] = {"careful": collections.Counter(), "sloppy": collections.Counter()}
    for i, example in enumerate(examples):
        user, assistant = example["messages"]
        a, b = (int(x) for x in user["content"].removeprefix("What is ").removesuffix("?").split(" + "))
        assert (a, b) not in held and assistant["role"] == "assistant"
        teacher = "careful" if i < tiny_math.CAREFUL_EXAMPLES else "sloppy"
        answer = int(assistant["content"])
        carry = a % 10 + b % 10 >= 10
        kind = "right" if answer == a + b else "forgot carry" if carry and abs(answer - (a + b - 10)) <= 1 else "off by one"
        assert kind != "off by one" or abs(answer - (a + b)) == 1
        outcomes[teacher][kind] += 1
    assert outcomes["careful"] == {"right": tiny_math.CAREFUL_EXAMPLES}
    right = outcomes["sloppy"]["right"] / tiny_math.SLOPPY_EXAMPLES
    keep = 1 - tiny_math.OFF_BY_ONE  # 55% of the sums have no carry (units digits uniform), 45% have one
    assert right == pytest.approx(0.55 * keep + 0.45 * (1 - tiny_math.FORGET_CARRY) * keep, abs=0.03)
    assert tiny_math.corpus(0) == examples and tiny_math.corpus(1) != examples


def test_addition_env_splits_and_exact_match() -> None:
    train, held, every = AdditionEnv(), AdditionEnv(split="held_out"), AdditionEnv(split="all")
    assert len(train.pairs) == 1440 and len(held.pairs) == 160 and len(every.pairs) == 1600
    assert set(held.pairs) == addition.held_out_pairs() and not set(train.pairs) & set(held.pairs)
    dataset = train.build_dataset(None)
    assert dataset.column_names == ["prompt", "answer"]
    a, b = train.pairs[0]
    assert dataset[0]["prompt"] == [{"role": "user", "content": f"What is {a} + {b}?"}]
    assert dataset[0]["answer"] == str(a + b)
    assert AdditionEnv(seed=1).pairs != train.pairs and sorted(AdditionEnv(seed=1).pairs) == sorted(train.pairs)
    assert score_answer("68", "68") == score_answer(" 68\n", "68") == 1.0
    for wrong in ("58", "68.", "6 8", "The answer is 68", "", "680"):
        assert score_answer(wrong, "68") == 0.0, wrong
    assert train.score_episode(None, None, "68", answer="68") == 1.0
    with pytest.raises(ValueError, match="split must be one of"):
        AdditionEnv(split="test")
    with pytest.raises(ValueError, match="split='all'"):
        AdditionEnv(low=0, high=9)
    assert len(AdditionEnv(split="all", low=0, high=9).pairs) == 100
