"""ArithmeticEnv: generated problems, and a reward that checks the format, then the value."""

from __future__ import annotations

import re

import pytest

from envs.arithmetic import RUBRIC, ArithmeticEnv


def question(env: ArithmeticEnv, i: int) -> str:
    return env.build_dataset(None)[i]["prompt"][-1]["content"]


def test_dataset_has_prompt_and_answer_columns() -> None:
    env = ArithmeticEnv(n_problems=10)
    ds = env.build_dataset(None)
    assert set(ds.column_names) == {"prompt", "answer"}
    assert len(ds) == 10
    row = ds[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "<answer>" in row["prompt"][0]["content"]
    assert isinstance(row["answer"], str) and re.fullmatch(r"-?\d+", row["answer"])
    assert env.get_tools() == []


@pytest.mark.parametrize("difficulty", ["easy", "normal", "hard"])
def test_answers_are_the_values_of_the_questions(difficulty: str) -> None:
    ds = ArithmeticEnv(difficulty=difficulty, n_problems=40).build_dataset(None)
    for row in ds:
        expr = re.fullmatch(r"What is (.+)\?", row["prompt"][-1]["content"]).group(1)
        assert re.fullmatch(r"[\d\s+\-*()]+", expr)
        assert str(eval(expr)) == row["answer"]  # only digits and operators, checked above


def test_difficulty_levels_differ() -> None:
    easy, normal, hard = (ArithmeticEnv(difficulty=d, n_problems=20) for d in ("easy", "normal", "hard"))
    q_easy = [question(easy, i) for i in range(20)]
    q_normal = [question(normal, i) for i in range(20)]
    q_hard = [question(hard, i) for i in range(20)]
    assert all(q.count(" ") == 4 and "+" in q for q in q_easy)  # "What is a + b?"
    assert all(sum(q.count(op) for op in "+-*") == 2 and "(" not in q for q in q_normal)
    assert all("(" in q and sum(q.count(op) for op in "+-*") == 3 for q in q_hard)
    with pytest.raises(ValueError, match="easy, normal, hard"):
        ArithmeticEnv(difficulty="extreme")


def test_deterministic_from_seed() -> None:
    assert ArithmeticEnv(seed=1).problems == ArithmeticEnv(seed=1).problems
    assert ArithmeticEnv(seed=1).problems != ArithmeticEnv(seed=2).problems


def test_scores() -> None:
    env = ArithmeticEnv()

    def score(text: str, answer: str = "42") -> float:
        return env.score_episode(None, None, text, answer)

    assert score("Six times seven. <answer>42</answer>") == 1.0
    assert score("<answer> 42 \n</answer>") == 1.0
    assert score("<answer>42.0</answer>") == 1.0
    assert score("<answer>-7</answer>", "-7") == 1.0
    assert score("<answer>41</answer>") == RUBRIC["format"] == 0.2
    assert score("<answer>forty-two</answer>") == 0.2
    assert score("The answer is 42.") == 0.0
    assert score("<answer>42") == 0.0  # unbalanced
    assert score("<answer>41</answer> <answer>42</answer>") == 0.0  # spraying guesses


def test_right_answer_from_the_dataset_scores_one() -> None:
    env = ArithmeticEnv(difficulty="hard", n_problems=8)
    for row in env.build_dataset(None):
        assert env.score_episode(None, None, f"Let me think. <answer>{row['answer']}</answer>", row["answer"]) == 1.0
