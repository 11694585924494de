"""Faults during real training on the tiny model are survived, and nothing trained is lost.

Each test injects one fault (a bad score, a hung episode, Stop at an awkward moment, Ctrl-C, an
exception inside TRL or torch, a GPU out-of-memory error, a failing save) into a short run
(batch 8, 4 generations, 8 new tokens) and checks the run's status, its reason, the run log and
the saved weights: the saved weights are those of the last completed step.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import TrainerCallback

from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, last_run, read_run_log, train
from grpo_magic.events import EpisodeError, GroupScored, RunFinished, StepLogged
from grpo_magic.training.trainer import trainer_class

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0, lr=1e-3)


class StepWeights(TrainerCallback):
    """Keeps a copy of the policy's weights at the end of each step, and runs ``hook`` at each step's start."""

    def __init__(self, hook: Any = None) -> None:
        self.after: dict[int, dict[str, torch.Tensor]] = {}
        self.hook = hook

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.hook is not None:
            self.hook(state.global_step + 1, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def _saved_weights_are(run, weights: dict[str, torch.Tensor]) -> bool:
    saved = load_file(str(run.output_dir / "model.safetensors"))
    common = [k for k in saved if k in weights]
    assert len(common) > 10
    return all(torch.equal(saved[k], weights[k].to(saved[k].dtype)) for k in common)


def _finished(run) -> RunFinished:
    events = list(read_run_log(run.output_dir))
    assert isinstance(events[-1], RunFinished)
    return events[-1]


# ---------------------------------------------------------------- bad scores


class EveryBadScoreEnv:
    """Each step's 8 episodes give, in order: raise, numpy float, None, 1.7, NaN, a string, inf, a tensor.

    The second group of each step has no valid score at all.
    """

    def __init__(self) -> None:
        self.calls = 0

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Say a{i}: " for i in range(16)]})

    def score_episode(self, model, tokenizer, completion, **kwargs):
        kind = self.calls % 8
        self.calls += 1
        outcomes = [None, np.float64(0.25), None, 1.7, float("nan"), "0.5", float("inf"), torch.tensor(0.5)]
        if kind == 0:
            raise ConnectionError("tool server hiccup")
        return outcomes[kind]


def test_every_kind_of_bad_score_is_survived_counted_and_never_a_fake_zero(in_tmp):
    def broken_subscriber(event):  # a dashboard bug must not stop training either
        raise RuntimeError("subscriber bug")

    run = train(GRPOParams(**FAST, max_steps=3, rl_max_error_rate=1.0), EveryBadScoreEnv(),
                callbacks=[broken_subscriber])
    assert run.status == "completed" and run.step == 3
    events = list(read_run_log(run.output_dir))
    errors = [e for e in events if isinstance(e, EpisodeError)]
    assert Counter(e.kind for e in errors) == {"ConnectionError": 3, "None": 3, "NaN": 3, "inf": 3, "not a number": 6}
    assert any(".item()" in e.message for e in errors)  # the tensor's message says how to fix it
    groups = [e for e in events if isinstance(e, GroupScored)]
    assert [g.scores for g in groups if g.step == 1] == [[None, 0.25, None, 1.0], [None, None, None, None]]
    assert sum(c for g in groups for c in g.clipped) == 3  # 1.7 clipped to 1.0 and counted
    assert all(a == 0.0 for g in groups for s, a in zip(g.scores, g.advantages, strict=True) if s is None)
    steps = [e for e in events if isinstance(e, StepLogged)]
    assert [s.episode_errors for s in steps] == [6, 6, 6] and run.error_count == 18
    saved = load_file(str(run.output_dir / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in saved.values())  # an all-error group poisons nothing


class HangingEnv(LettersEnv):
    """The first episode of every step hangs (until released); the rest score at once."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = itertools.count(1)  # next() is atomic; `calls += 1` from 2 episode threads can lose a count
        self.hung_returned = 0  # hung episodes that got past their wait
        self.release = threading.Event()

    def score_episode(self, model, tokenizer, completion, letter):
        if next(self.calls) % 8 == 1:
            self.release.wait(600)  # released by the test's `finally`; a slow machine must not run out first
            self.hung_returned += 1
        return super().score_episode(model, tokenizer, completion, letter)


def test_a_hanging_episode_is_abandoned_counted_and_training_goes_on(in_tmp):
    env = HangingEnv()
    try:
        run = train(GRPOParams(**FAST, max_steps=2, rl_episode_timeout=0.5, rl_env_workers=2), env)
        assert env.hung_returned == 0  # both steps went on while their hung episode was still hanging
    finally:
        env.release.set()
    assert run.status == "completed" and run.step == 2
    errors = [e for e in read_run_log(run.output_dir) if isinstance(e, EpisodeError)]
    assert [e.kind for e in errors] == ["timeout", "timeout"]
    assert "rl_episode_timeout (0.5 s)" in errors[0].message


class FailsFromStep2(LettersEnv):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def score_episode(self, model, tokenizer, completion, letter):
        self.calls += 1
        if self.calls > 8:
            raise KeyError("room_17")
        return super().score_episode(model, tokenizer, completion, letter)


def test_past_the_error_rate_the_run_stops_cleanly_quoting_the_first_traceback(in_tmp):
    weights = StepWeights()
    with pytest.raises(GRPOMagicError) as info:
        train(GRPOParams(**FAST, max_steps=5, rl_max_error_rate=0.5), FailsFromStep2(), callbacks=[weights])
    message = str(info.value)
    assert "8 of 8 episodes failed at step 2" in message and "rl_max_error_rate 0.5" in message
    assert "Traceback (most recent call last)" in message and "KeyError: 'room_17'" in message
    run = last_run()
    assert run.status == "failed" and run.step == 1
    finished = _finished(run)
    assert finished.status == "failed" and "KeyError: 'room_17'" in finished.reason
    assert _saved_weights_are(run, weights.after[1])  # step 1's weights: nothing trained is lost


# ---------------------------------------------------------------- Stop, Ctrl-C


class GatedEnv(LettersEnv):
    """Step ``at``'s first episode signals ``entered`` and sleeps until ``release`` (Stop comes meanwhile)."""

    def __init__(self, at: int = 2) -> None:
        super().__init__()
        self.calls = 0
        self.at = at
        self.entered = threading.Event()
        self.release = threading.Event()

    def score_episode(self, model, tokenizer, completion, letter):
        self.calls += 1
        if self.calls == (self.at - 1) * 8 + 1:
            self.entered.set()
            self.release.wait(60)
        return super().score_episode(model, tokenizer, completion, letter)


def test_stop_while_the_env_is_scoring_finishes_the_step_and_saves(in_tmp):
    env = GatedEnv(at=2)
    weights = StepWeights()
    run = train(GRPOParams(**FAST, max_steps=50), env, blocking=False, callbacks=[weights])
    try:
        assert env.entered.wait(300)
        run.stop()  # while score_episode sleeps
        assert run.phase == "stopping"
    finally:
        env.release.set()
    run.wait(timeout=120)
    assert run.status == "stopped" and run.step == 2
    assert [h["step"] for h in run.history] == [1, 2]
    assert _finished(run).status == "stopped"
    assert _saved_weights_are(run, weights.after[2])
    assert not _saved_weights_are(run, weights.after[1])  # steps change the weights: the check has teeth


def test_stop_while_generating_finishes_the_step_and_saves(in_tmp):
    generating = threading.Event()
    holder: dict[str, Any] = {}

    def hook(step: int, model) -> None:
        if step != 2 or "wrapped" in holder:
            return
        original = model.generate

        def generate(*args, **kwargs):  # generation of step 2 waits until Stop was pressed
            generating.set()
            deadline = time.monotonic() + 60
            while not holder["run"].stop_requested and time.monotonic() < deadline:
                time.sleep(0.01)
            return original(*args, **kwargs)

        model.generate = generate
        holder["wrapped"] = True

    weights = StepWeights(hook)
    run = train(GRPOParams(**FAST, max_steps=50), LettersEnv(), blocking=False, callbacks=[weights])
    holder["run"] = run
    assert generating.wait(300)
    run.stop()
    run.wait(timeout=120)
    assert run.status == "stopped" and run.step == 2
    assert _finished(run).status == "stopped"
    assert _saved_weights_are(run, weights.after[2])


class InterruptedEnv(LettersEnv):
    """Ctrl-C arrives while step 2 is being scored (the run trains in this, the main, thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def score_episode(self, model, tokenizer, completion, letter):
        self.calls += 1
        if self.calls == 10:
            raise KeyboardInterrupt
        return super().score_episode(model, tokenizer, completion, letter)


def test_ctrl_c_in_a_foreground_run_is_a_stop_with_weights_and_log_saved(in_tmp):
    assert threading.current_thread() is threading.main_thread()
    weights = StepWeights()
    run = train(GRPOParams(**FAST, max_steps=5), InterruptedEnv(), callbacks=[weights])
    assert run.status == "stopped" and "KeyboardInterrupt" in run.reason and run.step == 1
    finished = _finished(run)
    checkpoint = run.output_dir / "checkpoint-1"  # the abandoned step 2 is not in it: step 1 is
    assert finished.status == "stopped" and finished.saved == [str(run.output_dir), str(checkpoint)]
    assert _saved_weights_are(run, weights.after[1])
    assert (run.output_dir / "tokenizer.json").exists()
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 1


def test_ctrl_c_at_a_step_end_keeps_that_step(in_tmp):
    class CtrlC(StepWeights):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            super().on_step_end(args, state, control, model=model, **kwargs)
            if state.global_step == 2:
                raise KeyboardInterrupt

    weights = CtrlC()
    run = train(GRPOParams(**FAST, max_steps=5), LettersEnv(), callbacks=[weights])
    assert run.status == "stopped" and _finished(run).status == "stopped"
    assert _saved_weights_are(run, weights.after[2])


# ---------------------------------------------------------------- failures inside TRL, torch, the GPU, the disk


def _fail_at_step_2(exc: BaseException):
    """A step hook that makes the model's forward raise ``exc`` from step 2 on (inside TRL's own calls)."""

    def hook(step: int, model) -> None:
        if step == 2:
            def forward(*args, **kwargs):
                raise exc

            model.forward = forward

    return hook


def test_an_exception_inside_torch_fails_the_run_keeping_the_reason_and_step_1s_weights(in_tmp):
    weights = StepWeights(_fail_at_step_2(RuntimeError("CUDA error: an illegal memory access was encountered")))
    run = train(GRPOParams(**FAST, max_steps=5), LettersEnv(), callbacks=[weights], raise_on_failure=False)
    assert run.status == "failed" and "illegal memory access" in run.reason
    with pytest.raises(GRPOMagicError, match="Training failed: RuntimeError: CUDA error"):
        run.wait()
    finished = _finished(run)
    assert finished.status == "failed" and "illegal memory access" in finished.reason
    assert finished.saved and _saved_weights_are(run, weights.after[1])


def test_gpu_out_of_memory_names_the_parameters_to_lower(in_tmp):
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")  # torch.OutOfMemoryError
    weights = StepWeights(_fail_at_step_2(oom))
    run = train(GRPOParams(**FAST, max_steps=5), LettersEnv(), callbacks=[weights], raise_on_failure=False)
    assert run.status == "failed"
    for flag in ("--rl-max-new-tokens", "--rl-num-generations", "--batch-size", "--vllm-gpu-memory-utilization"):
        assert flag in run.reason
    assert "Tried to allocate 20.00 GiB" in run.reason and _finished(run).reason == run.reason
    assert _saved_weights_are(run, weights.after[1])


def test_an_env_calling_sys_exit_fails_the_run_instead_of_ending_it_silently(in_tmp):
    class ExitingEnv(LettersEnv):
        def score_episode(self, model, tokenizer, completion, letter):
            raise SystemExit(3)

    run = train(GRPOParams(**FAST, max_steps=2), ExitingEnv(), raise_on_failure=False)
    assert run.status == "failed" and "SystemExit" in run.reason
    assert _finished(run).status == "failed"


def test_a_failing_save_is_reported_and_the_log_still_ends(in_tmp, monkeypatch):
    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer_class(), "save_model", full_disk)
    run = train(GRPOParams(**FAST, max_steps=1), LettersEnv(), raise_on_failure=False)
    assert run.status == "failed" and "saving the weights failed too" in run.reason
    assert "No space left on device" in run.reason
    finished = _finished(run)
    assert finished.status == "failed" and finished.saved == [] and finished.steps == 1


@pytest.mark.process
def test_ctrl_c_in_the_terminal_stops_the_cli_run_with_weights_and_log_saved(in_tmp):
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_magic", "train", "--model", "tiny", "--rl-env-module", "envs.letters",
         "--rl-env-class", "LettersEnv", "--batch-size", "8", "--rl-max-new-tokens", "8", "--max-steps", "500",
         "--project-name", "interrupted", "--quiet"],
        cwd=in_tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = in_tmp / "interrupted"
    deadline = time.monotonic() + 300
    try:
        while not ((out / "events.jsonl").exists() and '"step_logged"' in (out / "events.jsonl").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or never logged a step"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "stopped after" in err and "Traceback" not in err
    events = list(read_run_log(out))
    assert isinstance(events[-1], RunFinished) and events[-1].status == "stopped"
    logged = [e.step for e in events if isinstance(e, StepLogged)]
    assert events[-1].steps == logged[-1] and (out / "model.safetensors").exists()
    checkpoint = out / f"checkpoint-{logged[-1]}"  # the stopped step, complete: --resume continues it
    assert events[-1].saved == [str(out), str(checkpoint)] and (checkpoint / "optimizer.pt").exists()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == logged[-1]
