"""The reward adapter: score_episode as a TRL reward function, with every fault survived."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from grpo_magic.environment.reward import EnvErrorRateExceeded, EnvReward, normalize_score


class Seen:
    """Scores from a table and remembers every call's arguments."""

    def __init__(self, values):
        self.values = list(values)
        self.calls = []

    def build_dataset(self, tokenizer):  # pragma: no cover - not used by the adapter
        return None


def _call(reward, n, **columns):
    return reward(prompts=[f"p{i // 2}" for i in range(n)], completions=[f"c{i}" for i in range(n)],
                  completion_ids=[[1]] * n, trainer_state=None, log_extra=None, log_metric=None, **columns)


def test_positional_style_signature_gets_its_column_by_keyword():
    class Env(Seen):
        def score_episode(self, model, tokenizer, completion, case_idx):
            self.calls.append((completion, case_idx))
            return case_idx / 10

    env = Env([])
    reward = EnvReward(env)
    assert _call(reward, 4, case_idx=[0, 0, 3, 3], other=["x"] * 4) == [0.0, 0.0, 0.3, 0.3]
    assert env.calls == [("c0", 0), ("c1", 0), ("c2", 3), ("c3", 3)]


def test_var_kwargs_get_every_column_and_the_prompt():
    class Env(Seen):
        def score_episode(self, model, tokenizer, completion, **kwargs):
            self.calls.append(kwargs)
            return 1.0

    env = Env([])
    _call(EnvReward(env), 2, case_idx=[5, 6], answer=["a", "b"])
    assert env.calls[0] == {"prompt": "p0", "case_idx": 5, "answer": "a"}


def test_chat_completions_reach_the_env_as_text():
    class Env(Seen):
        def score_episode(self, model, tokenizer, completion):
            self.calls.append(completion)
            return 0.0

    env = Env([])
    EnvReward(env)(prompts=[[{"role": "user", "content": "hi"}]],
                   completions=[[{"role": "assistant", "content": "hello"}]])
    assert env.calls == ["hello"]


BAD_VALUES = [
    (None, "None"), (float("nan"), "NaN"), (float("inf"), "inf"), ("0.5", "not a number"),
    (torch.tensor(0.5), "not a number"), ([0.5], "not a number"),
]


@pytest.mark.parametrize(("value", "kind"), BAD_VALUES)
def test_bad_scores_are_episode_errors_never_a_fake_zero(value, kind):
    outcome = normalize_score(value)
    assert outcome.score is None and outcome.error["kind"] == kind


def test_numpy_floats_are_accepted_and_out_of_range_is_clipped():
    assert normalize_score(np.float32(0.25)).score == 0.25
    high, low = normalize_score(1.7), normalize_score(-3)
    assert (high.score, high.clipped, high.raw) == (1.0, True, 1.7)
    assert (low.score, low.clipped) == (0.0, True)


def test_a_flaky_env_gets_none_for_bad_episodes_and_every_error_recorded():
    class Env(Seen):
        def score_episode(self, model, tokenizer, completion):
            i = int(completion[1:])
            if i == 1:
                raise RuntimeError("tool crashed")
            return [0.2, None, float("nan"), 1.5, 0.9, "bad"][i]

    records = []
    reward = EnvReward(Env([]), on_batch=records.append)
    assert _call(reward, 6) == [0.2, None, None, 1.0, 0.9, None]
    errors = [o.error for o in records[0].outcomes]
    assert errors[1]["kind"] == "RuntimeError" and "tool crashed" in errors[1]["traceback"]
    assert [e["kind"] for e in errors if e] == ["RuntimeError", "NaN", "not a number"]
    assert records[0].outcomes[3].clipped
    assert reward.totals == {"episodes": 6, "errors": 3, "clipped": 1}


def test_error_rate_over_the_limit_stops_with_the_first_traceback():
    class Env(Seen):
        def score_episode(self, model, tokenizer, completion):
            raise ValueError("no such room 17")

    with pytest.raises(EnvErrorRateExceeded) as info:
        _call(EnvReward(Env([]), max_error_rate=0.5), 4)
    message = str(info.value)
    assert "4 of 4 episodes failed" in message and "rl_max_error_rate" in message
    assert "Traceback" in message and "no such room 17" in message


def test_async_episodes_of_one_step_run_concurrently():
    """Each episode waits for all the others to have started: only possible if they overlap."""
    n = 8
    started: list[int] = []

    class Env(Seen):
        async def score_episode(self, model, tokenizer, completion):
            started.append(int(completion[1:]))
            for _ in range(200):
                if len(started) == n:
                    return 1.0
                await asyncio.sleep(0.005)
            return 0.0  # never saw the others: sequential

    assert _call(EnvReward(Env([])), n) == [1.0] * n


def test_sync_episodes_overlap_in_worker_threads():
    n, workers = 8, 4
    barrier = threading.Barrier(workers, timeout=60)  # only a sequential runner waits that long: it fails then

    class Env(Seen):
        def score_episode(self, model, tokenizer, completion):
            barrier.wait()  # raises BrokenBarrierError unless `workers` episodes run at once
            return 0.5

    assert _call(EnvReward(Env([]), workers=workers), n) == [0.5] * n


def test_a_hanging_episode_is_abandoned_and_the_rest_go_on():
    release, returned = threading.Event(), threading.Event()

    class Env(Seen):
        def score_episode(self, model, tokenizer, completion):
            if completion == "c0":
                release.wait(30)
                returned.set()
            return 0.75

    reward = EnvReward(Env([]), workers=1, timeout=0.3)
    records = []
    reward.on_batch = records.append
    try:
        assert _call(reward, 3) == [None, 0.75, 0.75]
        assert not returned.is_set()  # the batch came back while the hung episode still hangs
    finally:
        release.set()
    assert records[0].outcomes[0].error["kind"] == "timeout"


def test_async_timeout():
    class Env(Seen):
        async def score_episode(self, model, tokenizer, completion):
            await asyncio.sleep(5 if completion == "c1" else 0)
            return 0.5

    assert _call(EnvReward(Env([]), timeout=0.2), 2) == [0.5, None]


def test_model_is_in_eval_mode_under_no_grad_during_episodes_and_back_after():
    seen = []

    class Env(Seen):
        def score_episode(self, model, tokenizer, completion):
            seen.append((model.training, torch.is_grad_enabled()))
            return 0.5

    model = torch.nn.Linear(2, 2)
    model.train()
    for workers in (1, 3):
        reward = EnvReward(Env([]), workers=workers)
        reward.bind(model, None)
        _call(reward, 3)
        assert model.training and torch.is_grad_enabled()
    assert seen == [(False, False)] * 6


def test_a_scorer_that_never_uses_the_policy_leaves_its_mode_alone_but_still_runs_under_no_grad():
    class Counting(torch.nn.Linear):
        switches = 0

        def train(self, mode: bool = True):
            Counting.switches += 1
            return super().train(mode)

    seen = []

    class RuleBased(Seen):
        def score_episode(self, model, tokenizer, completion):  # a rule: the policy is never touched
            seen.append(torch.is_grad_enabled())
            return float(len(completion) % 2)

    class Judge(Seen):
        def score_episode(self, model, tokenizer, completion):
            seen.append(model.training)
            return 0.5

    model = Counting(2, 2)
    for env, switches in ((RuleBased([]), 0), (Judge([]), 2)):  # eval, then train again after the batch
        Counting.switches = 0
        reward = EnvReward(env)
        reward.bind(model, None)
        _call(reward, 3)
        assert Counting.switches == switches and model.training
    assert seen == [False] * 3 + [False] * 3  # no grad for the rule; eval mode for the judge


def test_reads_policy_is_false_only_for_code_that_provably_never_names_the_policy():
    import functools

    from grpo_magic.environment.episodes import reads_policy

    def wrap(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return f(*args, **kwargs)
        return wrapper

    class Env:
        def rule(self, policy, tokenizer, completion, **columns):
            return len(completion)

        def judge(self, model, tokenizer, completion):
            return model(completion)

        def closure(self, model, tokenizer, completion):
            return (lambda: model)()

        def comprehension(self, model, tokenizer, completion):
            return [model for _ in completion]

        def frame(self, model, tokenizer, completion):
            return locals()

        def star(self, *args):
            return 1

        def rebinds(self, model, tokenizer, completion):
            model = None
            return model

        @wrap
        def decorated(self, model, tokenizer, completion):
            return 1

        @staticmethod
        def static_rule(model, tokenizer, completion):
            return 1

    env = Env()
    assert not reads_policy(env.rule) and not reads_policy(env.static_rule)
    for name in ("judge", "closure", "comprehension", "frame", "star", "rebinds", "decorated"):
        assert reads_policy(getattr(env, name)), name
    assert reads_policy(len) and reads_policy(functools.partial(env.rule, None))
