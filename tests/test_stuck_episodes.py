"""Stuck episodes: an abandoned one loses the policy and is counted while it runs; async gets a real deadline.

A sync episode past ``rl_episode_timeout`` cannot be killed: it runs on while training uses the
policy. Its next forward pass on the policy raises ``EpisodeAbandoned`` in it, and the abandoned
episodes still running are counted on each step (``StepLogged.episodes_abandoned``, the dashboard,
the terminal). An ``async def`` that blocks its event loop is given up at the deadline, outside
the loop; an env's own ``TimeoutError`` is the env's error (docs/architecture.md, "Stuck episodes").
"""

from __future__ import annotations

import asyncio
import io
import itertools
import threading
import time

import torch
from run_support import wait_until
from transformers import TrainerCallback

from envs.letters import LettersEnv
from grpo_magic import GRPOParams, read_run_log, train
from grpo_magic.dashboard import Dashboard, html
from grpo_magic.environment.episodes import EpisodeAbandoned, EpisodeRunner
from grpo_magic.events import EpisodeError, StepLogged
from grpo_magic.frontends.progress import TerminalProgress


def test_an_abandoned_sync_episode_cannot_use_the_policy_and_is_counted_until_it_returns():
    policy = torch.nn.Linear(2, 2)
    release, returned = threading.Event(), threading.Event()
    seen: list[str] = []

    def stuck() -> float:
        release.wait(60)
        try:
            policy(torch.ones(2))  # training has the policy again by now
            seen.append("ran the policy")
        except EpisodeAbandoned as exc:
            seen.append(f"barred: {exc}")
            raise
        finally:
            returned.set()
        return 1.0

    runner = EpisodeRunner(workers=2, timeout=0.3)
    outcomes = runner.run([stuck, lambda: 0.5], is_async=False, model=policy)
    assert [o.error["kind"] if o.error else o.score for o in outcomes] == ["timeout", 0.5]
    assert runner.abandoned_running == 1 and policy._forward_pre_hooks  # still running, barred from the policy
    assert policy(torch.ones(2)).shape == (2,)  # training's own forward passes are not barred
    release.set()
    assert returned.wait(30)
    assert seen == ["barred: this episode ran past rl_episode_timeout and was abandoned; it cannot use the policy "
                    "any more"]
    # the episode thread leaves the running set first and takes its hooks off after: wait for both
    wait_until(lambda: not runner.abandoned_running and not policy._forward_pre_hooks, 30)
    assert runner.abandoned_running == 0 and not policy._forward_pre_hooks  # the bar went with it
    again = runner.run([lambda: float(policy(torch.ones(2)).sum() * 0 + 0.25)], is_async=False, model=policy)
    assert again[0].score == 0.25  # a new episode uses the policy as before


def test_an_async_env_that_blocks_its_loop_is_given_up_at_the_deadline_and_the_next_step_goes_on():
    blocked, release = threading.Event(), threading.Event()

    async def blocking() -> float:
        blocked.set()
        release.wait(60)  # a sync wait inside async def: no asyncio timer can fire meanwhile
        return 1.0

    async def fine() -> float:
        await asyncio.sleep(0)
        return 0.5

    runner = EpisodeRunner(timeout=0.3)
    try:
        outcomes = runner.run([blocking, fine], is_async=True)
        assert blocked.is_set() and not release.is_set()  # it returned while the loop was still blocked
        assert outcomes[0].error["kind"] == "timeout" and "blocks it" in outcomes[0].error["message"]
        assert runner.abandoned_running >= 1
        assert [o.score for o in runner.run([fine, fine], is_async=True)] == [0.5, 0.5]  # a fresh loop
    finally:
        release.set()
        runner.close()


def test_an_async_envs_own_timeout_error_is_its_error_not_our_timeout():
    async def slow_tool() -> float:
        await asyncio.sleep(0)
        raise TimeoutError("the booking API did not answer in 2 s")

    async def hangs() -> float:
        await asyncio.sleep(60)
        return 1.0

    runner = EpisodeRunner(timeout=0.5)
    try:
        own, ours = runner.run([slow_tool, hangs], is_async=True)
    finally:
        runner.close()
    assert own.error["kind"] == "TimeoutError" and "booking API" in own.error["message"]
    assert ours.error["kind"] == "timeout" and "rl_episode_timeout (0.5 s)" in ours.error["message"]
    assert runner.abandoned_running == 0  # a cancelled coroutine is done: nothing left running


class StuckEnv(LettersEnv):
    """Step 1's first episode hangs past the timeout until ``release``, then tries the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = itertools.count(1)  # next() is atomic: episodes run in 4 threads
        self.release = threading.Event()
        self.returned = threading.Event()
        self.seen: list[str] = []

    def score_episode(self, model, tokenizer, completion, letter):
        if next(self.calls) == 1:
            try:
                self.release.wait(60)
                ids = tokenizer("Say a: ", return_tensors="pt").input_ids
                model.generate(ids, max_new_tokens=2)
                self.seen.append("generated")
            except EpisodeAbandoned:
                self.seen.append("EpisodeAbandoned")
                raise
            finally:
                self.returned.set()
        return super().score_episode(model, tokenizer, completion, letter)


class ReleaseBeforeStep3(TrainerCallback):
    """Between steps 2 and 3 (training has the policy): release the stuck episode, wait until the runner counted it out.

    The runner counts an episode out in the episode's own thread, after ``score_episode`` returned; the policy
    guard removes its forward hook from the policy with the last one. Waiting for that, not for the env's own
    ``finally`` (which races the runner's bookkeeping: the earlier form of this test saw step 4's count still 1
    on a busy machine), makes every step's count certain: 1, 1, then 0, 0.
    """

    def __init__(self, env: StuckEnv) -> None:
        self.env = env
        self.counted_out: bool | None = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step != 2:
            return
        self.env.release.set()
        assert self.env.returned.wait(60)
        deadline = time.monotonic() + 60
        while model._forward_pre_hooks and time.monotonic() < deadline:
            time.sleep(0.005)
        self.counted_out = not model._forward_pre_hooks


def test_in_a_real_run_the_abandoned_episode_is_barred_and_counted_on_the_dashboard_and_the_terminal(in_tmp):
    env = StuckEnv()
    shown: list[Dashboard] = []
    headers: list[str] = []  # the dashboard's progress line after each step

    def after_step(event) -> None:  # subscribed after the dashboard: it has the step already
        if isinstance(event, StepLogged):
            headers.append(html.progress_text(shown[0].folded()))

    terminal = io.StringIO()
    release = ReleaseBeforeStep3(env)
    try:
        run = train(GRPOParams(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, max_steps=4,
                               rl_episode_timeout=2.0, rl_env_workers=4, rl_max_error_rate=1.0),
                    env, display=shown.append, callbacks=[after_step, TerminalProgress(stream=terminal), release])
    finally:
        env.release.set()
    assert run.status == "completed"
    assert env.seen == ["EpisodeAbandoned"]  # it never ran the policy after it was abandoned
    assert release.counted_out
    events = list(read_run_log(run.output_dir))
    counts = [e.episodes_abandoned for e in events if isinstance(e, StepLogged)]
    assert counts == [1, 1, 0, 0]  # still running at the ends of steps 1 and 2; returned before step 3
    assert [(e.step, e.kind) for e in events if isinstance(e, EpisodeError)] == [(1, "timeout")]
    assert "abandoned 1 still running" in terminal.getvalue()
    assert ["1 abandoned episode still running" in h for h in headers] == [c == 1 for c in counts]
