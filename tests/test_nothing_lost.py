"""Nothing is lost: the run log survives kill -9, and runs resume from their last checkpoint.

The run log is appended and flushed per event, so a killed process leaves a log that reads back
(and replays) up to its last step; a checkpoint cut short by the kill is passed over; ``resume``
continues the step count, the optimizer state, the run log and the history, from the API, the
magic and the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

import grpo_magic
from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, read_run_log, train
from grpo_magic.events import RunFinished, RunLog, RunStarted, StatusChanged, StepLogged
from grpo_magic.training.resume import last_checkpoint as _last_checkpoint

REPO = Path(__file__).resolve().parents[1]
FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0, lr=1e-3)


def _steps(output_dir) -> list[int]:
    return [e.step for e in read_run_log(output_dir) if isinstance(e, StepLogged)]


def test_each_event_is_on_disk_as_soon_as_it_is_emitted(tmp_path):
    log = RunLog(tmp_path)
    for i in range(3):
        log(StatusChanged(status=f"phase {i}"))
        lines = (tmp_path / "events.jsonl").read_text().splitlines()  # another reader, file still open
        assert len(lines) == i + 1 and json.loads(lines[-1])["status"] == f"phase {i}"
    log.close()


def test_a_torn_last_line_is_skipped_and_the_next_writer_starts_afresh(tmp_path):
    log_file = tmp_path / "events.jsonl"
    log_file.write_text(json.dumps({"type": "status_changed", "status": "training", "time": 1.0}) + "\n"
                        + '{"type": "step_logged", "step": 3, "metr')  # killed mid-write
    assert [e.status for e in read_run_log(tmp_path)] == ["training"]
    log = RunLog(tmp_path)  # a resumed run appends to the same log
    log(StatusChanged(status="resumed"))
    log.close()
    assert [e.status for e in read_run_log(tmp_path)] == ["training", "resumed"]


def _wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_kill_9_mid_training_leaves_a_readable_log_and_a_run_that_resumes(in_tmp):
    out = in_tmp / "killed"
    argv = [sys.executable, "-m", "grpo_magic", "train", "--model", "tiny", "--rl-env-module", "envs.letters",
            "--rl-env-class", "LettersEnv", "--batch-size", "8", "--rl-max-new-tokens", "8", "--lr", "1e-3",
            "--max-steps", "500", "--save-steps", "1", "--project-name", "killed", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(argv, cwd=in_tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / "events.jsonl").exists() and len(_steps(out)) >= 2
                  and _last_checkpoint(out) is not None, 300, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    events = list(read_run_log(out))
    assert isinstance(events[0], RunStarted) and not any(isinstance(e, RunFinished) for e in events)
    logged = _steps(out)
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= 2
    dashboard = grpo_magic.replay(str(out))  # the dashboard of the dead run, from its log
    assert dashboard.step == logged[-1]

    checkpoint = int(Path(_last_checkpoint(out)).name.split("-")[-1])
    resumed = subprocess.run([*argv[:argv.index("--max-steps")], "--max-steps", str(checkpoint + 2),
                              "--save-steps", "1", "--project-name", "killed", "--quiet", "--resume"],
                             cwd=in_tmp, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"completed after {checkpoint + 2} steps" in resumed.stderr
    events = list(read_run_log(out))
    assert sum(isinstance(e, RunStarted) for e in events) == 2  # one log, both attempts
    assert isinstance(events[-1], RunFinished) and events[-1].status == "completed"
    after_resume = _steps(out)[len(logged):]
    assert after_resume == list(range(checkpoint + 1, checkpoint + 3))
    assert grpo_magic.replay(str(out)).step == checkpoint + 2


class OptimizerProbe(TrainerCallback):
    """Notes where training begins: the step and whether the optimizer already has state (resumed)."""

    def __init__(self) -> None:
        self.begin_step: int | None = None
        self.optimizer_state: int | None = None

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.begin_step = state.global_step
        self.optimizer_state = len(optimizer.state) if optimizer is not None else None




def test_resume_continues_steps_optimizer_log_and_history_from_the_api_and_the_magic(in_tmp, shell):
    params = GRPOParams(**FAST, max_steps=2, save_steps=2, project_name="resumable")
    first_probe = OptimizerProbe()
    first = train(params, LettersEnv(), callbacks=[first_probe])
    assert first.status == "completed" and first_probe.optimizer_state == 0
    assert (first.output_dir / "checkpoint-2" / "optimizer.pt").exists()

    probe = OptimizerProbe()
    second = train(params.replace(max_steps=4), LettersEnv(), resume=True, callbacks=[probe])
    assert second.status == "completed" and second.step == 4
    assert probe.begin_step == 2 and probe.optimizer_state  # Adam's moments came back with the step count
    assert [h["step"] for h in second.history] == [1, 2, 3, 4]
    assert second.history[:2] == first.history  # the earlier steps, loaded from the run log
    assert _steps(second.output_dir) == [1, 2, 3, 4]

    grpo_magic.register_env(LettersEnv)
    third = shell.run_line_magic(
        "grpo_train", "--env LettersEnv --model tiny --batch-size 8 --rl-max-new-tokens 8 --lr 1e-3 --seed 0 "
                      "--max-steps 6 --save-steps 2 --project-name resumable --resume --run --blocking")
    assert third.status == "completed" and [h["step"] for h in third.history] == [1, 2, 3, 4, 5, 6]
    events = list(read_run_log(third.output_dir))
    assert _steps(third.output_dir) == [1, 2, 3, 4, 5, 6]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["completed"] * 3
    assert list(grpo_magic.replay(str(third.output_dir)).view.steps) == [1, 2, 3, 4, 5, 6]


def test_resume_without_a_checkpoint_is_a_clear_error_before_anything_loads(in_tmp):
    (in_tmp / "empty-run" / "checkpoint-3").mkdir(parents=True)  # cut short: no trainer_state.json
    with pytest.raises(GRPOMagicError, match="Cannot resume: .*empty-run has no complete checkpoint"):
        train(GRPOParams(**FAST, max_steps=1, project_name="empty-run"), LettersEnv(), resume=True)
    assert not (in_tmp / "empty-run" / "events.jsonl").exists()  # and nothing was started
