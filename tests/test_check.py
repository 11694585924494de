"""The pre-flight check: real tiny-model completions scored through the training adapter, judged."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import pytest
from datasets import Dataset

from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, check_env, register_env
from grpo_magic.analysis.check import REFUSAL, CheckReport

FAST = dict(samples=3, num_generations=4, max_new_tokens=8)
PROMPTS = ["Say something:", "Tell me a story:", "Name a fruit:", "Count to three:", "Describe the sea:"]


class Base:
    """Five short text prompts with a case index."""

    def build_dataset(self, tokenizer) -> Dataset:
        return Dataset.from_dict({"prompt": PROMPTS, "case_idx": list(range(len(PROMPTS)))})


class LengthEnv(Base):
    """Score = reply length / 100: the random tiny model's 8-token replies differ in length, so every group's
    scores differ (a reliably good env; letters scores of a random model are often all 0 in a group). The
    degenerate replies stay low: empty 0, echo at most 0.17, the refusal 0.38."""

    def score_episode(self, model, tokenizer, completion, case_idx):
        return min(1.0, len(completion) / 100)


def test_a_reward_whose_scores_vary_is_ready():
    report = check_env(LengthEnv, **FAST)
    assert isinstance(report, CheckReport)
    assert report.ready and report.verdict == "ready"
    assert report.samples == 3 and report.num_generations == 4 and report.episodes == report.valid == 12
    assert [len(g) for g in report.scores] == [4, 4, 4]
    assert report.zero_variance_groups == 0 and report.error_count == 0 and report.clipped == 0
    assert 0 < report.mean < 1 and report.std > 0 and report.min <= report.mean <= report.max
    assert sum(report.distribution.values()) == 12 and len(report.distribution) == 5
    assert report.degenerate["empty"] == 0.0 and report.degenerate["refusal"] == pytest.approx(len(REFUSAL) / 100)
    assert set(report.latency) == {"mean", "p95", "max"} and report.latency["max"] >= report.latency["p95"] >= 0
    assert 0 <= report.truncated <= 12 and report.truncated_share == report.truncated / 12
    group = report.groups[0]
    assert group["prompt"] in PROMPTS and len(group["completions"]) == 4
    assert group["scores"] == [min(1.0, len(c) / 100) for c in group["completions"]]
    json.dumps(report.to_dict())  # plain data
    text = str(report)
    assert "LengthEnv" in text and "verdict: ready" in text
    assert "verdict: ready" in report._repr_html_()


def test_the_check_is_seeded():
    first, second = check_env(LengthEnv, seed=3, **FAST), check_env(LengthEnv, seed=3, **FAST)
    assert first.scores == second.scores and [g["prompt"] for g in first.groups] == [g["prompt"] for g in second.groups]


def test_constant_scores_make_every_group_zero_variance():
    class Constant(Base):
        def score_episode(self, model, tokenizer, completion):
            return 0.25

    report = check_env(Constant, **FAST)
    assert report.zero_variance_groups == 3 and report.zero_variance_share == 1.0
    assert not report.ready
    assert "3 of 3 groups have equal scores" in report.verdict and "partial credit" in report.verdict
    assert report.std == 0 and report.degenerate == {"empty": 0.25, "echo": 0.25, "refusal": 0.25}


def test_failing_episodes_are_reported_never_raised():
    class Broken(Base):
        def score_episode(self, model, tokenizer, completion, case_idx):
            raise ValueError(f"case {case_idx} needs x < y")

    report = check_env(Broken, **FAST)
    assert report.error_count == 12 and report.error_kinds == {"ValueError": 12} and report.valid == 0
    assert report.mean is None and report.scores == [[None] * 4] * 3
    first = report.errors[0]
    assert first["kind"] == "ValueError" and "needs x < y" in first["message"]
    assert "Traceback" in first["traceback"] and "score_episode" in first["traceback"]
    assert (first["group"], first["completion"], report.errors[5]["group"], report.errors[5]["completion"]) == (0, 0, 1, 1)
    assert not report.ready
    assert report.verdict.startswith("12 of 12 episodes failed (ValueError: case")
    assert "fix score_episode before training" in report.verdict
    assert "x &lt; y" in report._repr_html_() and "x < y" not in report._repr_html_()
    assert "n/a" in str(report)  # no score to show, no crash either


def test_a_reward_that_pays_for_an_empty_reply_is_not_ready():
    class PaysForNothing(Base):
        def score_episode(self, model, tokenizer, completion):
            return 1.0 if not completion.strip() else min(1.0, len(completion) / 100)

    report = check_env(PaysForNothing, **FAST)
    assert report.degenerate["empty"] == 1.0 and report.degenerate["echo"] < 0.5
    assert not report.ready
    assert report.verdict == "an empty reply scores 1.00: the reward pays for doing nothing."
    assert any("empty reply" in w for w in report.warnings)


def test_out_of_range_scores_are_clipped_and_none_or_nan_are_errors():
    class Odd(Base):
        def __init__(self):
            self.calls = 0

        def score_episode(self, model, tokenizer, completion):
            self.calls += 1  # episodes run one at a time (workers=1): the first 12 are the sampled ones
            return [2.0, -1.0, None, math.nan][(self.calls - 1) % 4] if self.calls <= 12 else 0.0

    report = check_env(Odd(), **FAST)
    assert report.clipped == 6 and report.scores[0] == [1.0, 0.0, None, None]
    assert report.error_count == 6 and report.error_kinds == {"None": 3, "NaN": 3}
    assert any("clipped" in w for w in report.warnings)
    assert not report.ready and "6 of 12 episodes failed" in report.verdict


def test_episodes_past_the_timeout_are_errors_that_name_the_timeout():
    class Slow(Base):
        async def score_episode(self, model, tokenizer, completion, case_idx):
            await asyncio.sleep(1.0 if case_idx == 0 else 0.0)  # one prompt's episodes hang
            return min(1.0, len(completion) / 100)

    report = check_env(Slow, samples=5, num_generations=2, max_new_tokens=4, timeout=0.2)
    assert report.error_kinds == {"timeout": 2} and [g["scores"] for g in report.groups][0] == [None, None]
    assert "rl_episode_timeout" in report.verdict and "--rl-episode-timeout" in report.verdict


def test_episodes_get_the_same_arguments_as_in_training():
    class Recording(Base):
        def __init__(self):
            self.seen = []

        def score_episode(self, model, tokenizer, completion, case_idx):
            self.seen.append((model, tokenizer, completion, case_idx))
            return min(1.0, len(completion) / 100)

    env = Recording()
    report = check_env(env, **FAST)
    sampled, degenerate = env.seen[:12], env.seen[12:]
    for g, group in enumerate(report.groups):
        case = PROMPTS.index(group["prompt"])
        assert [s[3] for s in sampled[4 * g:4 * g + 4]] == [case] * 4
        assert [s[2] for s in sampled[4 * g:4 * g + 4]] == group["completions"]
        assert [s[2] for s in degenerate[3 * g:3 * g + 3]] == ["", group["prompt"], REFUSAL]
    model, tokenizer = sampled[0][0], sampled[0][1]
    assert model is not None and hasattr(model, "generate") and tokenizer.padding_side == "left"


def test_chat_prompts_with_tools_get_the_env_prompt_and_text_completions():
    tool = {"type": "function", "function": {"name": "lookup", "description": "Look up a word.",
                                             "parameters": {"type": "object", "properties": {}}}}

    class ToolEnv:
        def __init__(self):
            self.seen = []

        def build_dataset(self, tokenizer):
            return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS[:2]]})

        def get_tools(self):
            return [tool]

        def score_episode(self, model, tokenizer, completion, **kwargs):
            self.seen.append((completion, kwargs))
            return min(1.0, len(completion) / 100)

    env = ToolEnv()
    report = check_env(env, samples=2, num_generations=2, max_new_tokens=4)
    assert report.samples == 2 and report.error_count == 0
    completion, kwargs = env.seen[0]
    assert isinstance(completion, str) and set(kwargs) == {"prompt"}
    assert kwargs["prompt"] == [{"role": "user", "content": PROMPTS[0]}]  # the env's own, not the rendered text
    assert env.seen[4][0] == "" and env.seen[5][0] == PROMPTS[0]  # empty, then the question echoed back


def test_a_registered_env_by_name_and_an_env_from_params():
    register_env(LettersEnv, "letters")
    report = check_env("letters", samples=2, num_generations=2, max_new_tokens=4)
    assert report.env == "letters" and report.episodes == 4 and report.error_count == 0
    params = GRPOParams(model="tiny", rl_env_module="envs.letters", rl_env_class="LettersEnv",
                        rl_env_config='{"n_prompts": 4}', rl_num_generations=2, rl_max_new_tokens=4, batch_size=2)
    report = check_env(params=params, samples=10)
    assert report.env == "LettersEnv" and report.samples == 4 and report.num_generations == 2
    assert check_env(params=params, samples=1, num_generations=3).num_generations == 3  # a given argument wins
    assert check_env(params=params.replace(model=None), samples=1).model == "tiny"  # the check's model fills in


@pytest.mark.parametrize(("env", "kwargs", "words"), [
    ("nope", {}, "No environment named 'nope'"),
    (None, {}, "No environment given"),
    (LengthEnv, {"samples": 0}, "samples must be"),
    (LengthEnv, {"num_generations": 1}, "rl_num_generations"),
    (LengthEnv, {"model": "./no/such/model"}, "does not exist"),
    (LettersEnv, {"params": GRPOParams(model="tiny", rl_env_config='{"colour": 1}')}, "does not accept 'colour'"),
])
def test_bad_input_raises_one_clear_error_before_the_model_loads(env, kwargs, words, monkeypatch):
    import grpo_magic.analysis.check as check

    def no_load(*args, **kw):  # a guard that proves the order, not a stand-in for the model
        raise AssertionError("the model loaded before the input was checked")

    monkeypatch.setattr(check, "_load", no_load)
    with pytest.raises(GRPOMagicError, match=words.replace("(", r"\(")):
        check_env(env, **kwargs)


def test_importing_the_check_stays_light():
    code = "import sys, grpo_magic, grpo_magic.analysis.check; print(sorted({'torch', 'transformers', 'trl'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
