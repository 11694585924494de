"""The SFT-then-GRPO lesson: the ``tiny-math`` warm start, ``envs/addition.py``, and the rise GRPO gives.

The slow test is the issue's claim, checked with the real GRPOTrainer: the fixed recipe (8
generations, batch 32, 8 new tokens, lr 5e-4, ``rl_kl_coef`` 0, 60 steps) on sums of two numbers from
10 to 49 raises the exact-match accuracy of ``tiny-math`` (mean reward of the first 5 steps vs the
last 5) by at least 0.15.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from envs import addition
from envs.addition import AdditionEnv, score_answer
from grpo_magic.models import tiny_math

#: The lesson's fixed GRPO recipe (the issue's; tune the model, never this).
FIXED_RECIPE: dict[str, Any] = {
    "rl_num_generations": 8, "batch_size": 32, "rl_max_new_tokens": 8, "lr": 5e-4, "rl_kl_coef": 0.0, "max_steps": 60,
}
MIN_RISE = 0.15


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


@pytest.fixture(scope="module")
def tiny_math_path() -> str:
    """tiny-math, built once (about a minute) and cached like tiny."""
    return str(tiny_math.tiny_math_path())


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_grpo_raises_tiny_math_accuracy_with_the_fixed_recipe(tiny_math_path: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_magic import GRPOParams, train
    from grpo_magic.models import TINY_MATH, load_model, load_tokenizer

    info = tiny_math.RECIPE.info()["check"]
    assert 0.2 <= info["sampled_accuracy"] <= 0.8, info  # right part of the time, as the lesson needs
    before = addition.accuracy(load_model(TINY_MATH), load_tokenizer(TINY_MATH))
    assert before == pytest.approx(info["greedy_accuracy"], abs=1e-3)  # the build measured the same

    params = GRPOParams(model=TINY_MATH, project_name=str(tmp_path / "run"), **FIXED_RECIPE)
    run = train(params, AdditionEnv, display=False)
    assert run.status == "completed", run.reason
    rewards = [h["reward"] for h in run.history]
    assert len(rewards) == FIXED_RECIPE["max_steps"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last - first >= MIN_RISE, f"mean reward {first:.3f} -> {last:.3f}: {rewards}"

    trained = AutoModelForCausalLM.from_pretrained(str(run.output_dir))
    after = addition.accuracy(trained, AutoTokenizer.from_pretrained(str(run.output_dir)))
    assert after > before, (before, after)  # greedy, on sums it never trained on
    print(f"tiny-math: reward {first:.3f} -> {last:.3f}; greedy held-out accuracy {before:.3f} -> {after:.3f}")
