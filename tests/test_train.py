"""Real GRPO training with TRL's GRPOTrainer on the offline tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import zlib

import pandas as pd
import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, last_run, read_run_log, train
from grpo_magic.events import EpisodeError, GroupScored, RunFinished, RunStarted, StepLogged
from tests.run_support import SlowLettersEnv, wait_for_step

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)


def _mean(values):
    return sum(values) / len(values)


@pytest.mark.slow
def test_reward_rises_on_letters_with_a_full_fine_tune_and_the_default_kl(in_tmp):
    params = GRPOParams(model="tiny", max_steps=40, batch_size=16, rl_num_generations=8, rl_max_new_tokens=16,
                        lr=5e-3, seed=0)
    assert params.rl_kl_coef == 0.1  # the default: TRL reloads the reference model from the tiny path
    run = train(params, LettersEnv())
    rewards = [h["reward"] for h in run.history]
    assert run.status == "completed" and len(rewards) == 40
    start, end = _mean(rewards[:3]), _mean(rewards[-5:])
    print(f"mean reward: first 3 steps {start:.3f}, last 5 steps {end:.3f}")
    assert start < 0.2
    assert end > start + 0.15
    assert all(h.get("kl") is not None for h in run.history[1:])


class WeightsWatch(TrainerCallback):
    """Snapshots the policy's weights when training begins and ends (TRL passes the model in)."""

    def __init__(self):
        self.before: dict[str, torch.Tensor] = {}
        self.after: dict[str, torch.Tensor] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_peft_changes_lora_weights_and_leaves_the_base_alone(in_tmp):
    watch = WeightsWatch()
    run = train(GRPOParams(**FAST, max_steps=3, peft=True, lora_r=4, lora_alpha=8, lr=5e-2), LettersEnv(),
                callbacks=[watch])
    assert run.status == "completed"
    lora = [k for k in watch.before if "lora_" in k]
    base = [k for k in watch.before if "lora_" not in k]
    assert lora and base
    assert any(not torch.equal(watch.before[k], watch.after[k]) for k in lora)
    assert all(torch.equal(watch.before[k], watch.after[k]) for k in base)
    assert (run.output_dir / "adapter_model.safetensors").exists()
    assert (run.output_dir / "adapter_config.json").exists()


def test_advantages_in_group_events_are_the_ones_trl_used(in_tmp, monkeypatch):
    """Compare with TRL's own record: its completions parquet (log_completions=True)."""
    original = GRPOParams.to_grpo_config
    monkeypatch.setattr(GRPOParams, "to_grpo_config",
                        lambda self, *a, **kw: original(self, *a, log_completions=True, **kw))
    run = train(GRPOParams(**FAST, max_steps=2, lr=1e-3), LettersEnv())
    groups = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    assert {g.step for g in groups} == {1, 2}
    for step in (1, 2):
        table = pd.read_parquet(run.output_dir / "completions" / f"completions_{step:05d}.parquet")
        ours = [g for g in groups if g.step == step]
        assert len(ours) == len(table) // 4
        assert [c for g in ours for c in g.completions] == list(table["completion"])
        assert [a for g in ours for a in g.advantages] == pytest.approx(list(table["advantage"]), abs=1e-6)
        assert [s for g in ours for s in g.scores] == pytest.approx(list(table["env"]), abs=1e-6)


class FlakyEnv:
    """Every third episode raises, returns NaN or None; the rest score normally."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Say a{i}: " for i in range(16)]})

    def score_episode(self, model, tokenizer, completion, prompt):
        kind = zlib.crc32(completion.encode()) % 6
        if kind == 0:
            raise ConnectionError("tool server hiccup")
        if kind == 1:
            return float("nan")
        if kind == 2:
            return None
        return completion.count("a") / max(1, len(completion))


def test_a_flaky_env_trains_to_the_end_with_every_bad_episode_recorded(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=3, rl_max_error_rate=1.0), FlakyEnv())
    assert run.status == "completed" and run.step == 3
    events = list(read_run_log(run.output_dir))
    errors = [e for e in events if isinstance(e, EpisodeError)]
    groups = [e for e in events if isinstance(e, GroupScored)]
    none_scores = sum(s is None for g in groups for s in g.scores)
    assert errors and len(errors) == none_scores == run.error_count
    assert {e.kind for e in errors} <= {"ConnectionError", "NaN", "None"}
    for g in groups:  # an error's completion gets no advantage: TRL excludes it
        for score, adv, err in zip(g.scores, g.advantages, g.errors, strict=False):
            assert (score is None) == (err is not None)
            if score is None:
                assert adv == 0.0
    steps = [e for e in events if isinstance(e, StepLogged)]
    assert sum(s.episode_errors for s in steps) == len(errors)


def test_an_error_rate_over_the_limit_stops_the_run_with_the_traceback(in_tmp):
    class BrokenEnv(LettersEnv):
        def score_episode(self, model, tokenizer, completion, letter):
            raise KeyError("room_17")

    with pytest.raises(GRPOMagicError) as info:
        train(GRPOParams(**FAST, max_steps=5), BrokenEnv())
    message = str(info.value)
    assert "8 of 8 episodes failed at step 1" in message and "KeyError: 'room_17'" in message
    output_dir = last_run().output_dir
    events = list(read_run_log(output_dir))
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "failed" and "room_17" in finished.reason
    assert (output_dir / "model.safetensors").exists()  # what was trained is never lost


def test_stop_on_a_background_run_saves_weights_and_log(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=200), SlowLettersEnv(), blocking=False)
    wait_for_step(run, 1, timeout=120)
    assert run.status == "running"
    with pytest.raises(GRPOMagicError, match="already training.*stop"):
        train(GRPOParams(**FAST, max_steps=1, project_name="other"), LettersEnv())
    run.stop()
    run.wait(timeout=120)
    assert run.status == "stopped" and run.step < 200
    assert (run.output_dir / "model.safetensors").exists()
    events = list(read_run_log(run.output_dir))
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    assert events[-1].status == "stopped"
    assert [h["step"] for h in run.history] == [e.step for e in events if isinstance(e, StepLogged)]


def test_run_log_is_plain_json_lines_matching_the_history(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=2), LettersEnv())
    lines = run.run_log.read_text().splitlines()
    types = [json.loads(line)["type"] for line in lines]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert types.count("step_logged") == 2 and types.count("group_scored") == 4
    logged = [e.metrics for e in read_run_log(run.output_dir) if isinstance(e, StepLogged)]
    assert [m["reward"] for m in logged] == [h["reward"] for h in run.history]
    assert {"reward", "reward_std", "loss", "frac_reward_zero_std", "completions/mean_length"} <= set(logged[0])


def test_a_second_run_in_the_same_folder_keeps_the_old_log(in_tmp):
    train(GRPOParams(**FAST, max_steps=1, project_name="grpo-run"), LettersEnv())
    train(GRPOParams(**FAST, max_steps=1, project_name="grpo-run"), LettersEnv())
    assert len(list((in_tmp / "grpo-run").glob("events*.jsonl"))) == 2


def test_importing_grpo_magic_stays_light():
    code = ("import sys, grpo_magic; heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets', 'peft') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class ThreadWatch(TrainerCallback):
    """Records the thread that trains (TRL calls its callbacks from the training loop)."""

    def __init__(self):
        self.threads: set[threading.Thread] = set()

    def on_step_end(self, args, state, control, **kwargs):
        self.threads.add(threading.current_thread())


def test_background_training_thread_is_named_and_ends(in_tmp):
    watch = ThreadWatch()
    run = train(GRPOParams(**FAST, max_steps=1), LettersEnv(), blocking=False, callbacks=[watch])
    assert threading.current_thread().name != "grpo-magic-train"
    run.wait(timeout=120)
    (thread,) = watch.threads
    assert run.status == "completed" and thread.name == "grpo-magic-train" and thread.daemon
    assert not thread.is_alive()  # ended, and joined by wait()
