"""Stop then resume, and SIGTERM: every stop leaves a complete checkpoint that ``--resume`` continues.

Stop (``%grpo_stop`` here; the button and ``run.stop()`` call the same method), Ctrl-C and SIGTERM
finish the step, and Trainer saves a complete checkpoint of it (weights, optimizer, scheduler, RNG,
trainer state); the run log ends with ``RunFinished(stopped)``. ``--resume`` continues from that
step, with the history and a live dashboard starting from the steps before it. SIGTERM is tried on
a real CLI run and on one of two torchrun processes (docs/architecture.md, "Stop, signals and
resume"). Also: replay skips a run-log line cut short by a kill and shows the rest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

import grpo_magic
from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, read_run_log, train
from grpo_magic.dashboard import Dashboard
from grpo_magic.events import RunFinished, RunStarted, StepLogged
from grpo_magic.frontends.cli import main
from grpo_magic.training.resume import last_checkpoint

REPO = Path(__file__).resolve().parents[1]
FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0, lr=1e-3)
CLI = ["--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv", "--batch-size", "8",
       "--rl-max-new-tokens", "8", "--lr", "1e-3", "--seed", "0"]
CHECKPOINT_FILES = {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"}


def _steps(output_dir) -> list[int]:
    return [e.step for e in read_run_log(output_dir) if isinstance(e, StepLogged)]


def _complete(checkpoint: Path, step: int, processes: int = 1) -> None:
    names = {p.name for p in checkpoint.iterdir()}
    rng = {"rng_state.pth"} if processes == 1 else {f"rng_state_{r}.pth" for r in range(processes)}
    assert CHECKPOINT_FILES | rng <= names, names
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GRPO_MAGIC_LAUNCHED")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended early: {proc.stderr.read() if proc.stderr else ''}"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.05)


class GatedEnv(LettersEnv):
    """Step 2's first episode signals ``entered`` and waits for ``release`` (Stop comes meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def score_episode(self, model, tokenizer, completion, letter):
        self.calls += 1
        if self.calls == 9:
            self.entered.set()
            self.release.wait(60)
        return super().score_episode(model, tokenizer, completion, letter)


class OptimizerProbe(TrainerCallback):
    """Where training begins: the step and how much optimizer state came back."""

    begin_step: int | None = None
    optimizer_state = 0

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.begin_step = state.global_step
        self.optimizer_state = len(optimizer.state) if optimizer is not None else 0


def test_grpo_stop_leaves_a_complete_checkpoint_and_resume_reaches_max_steps_numbered_on(in_tmp, shell):
    params = GRPOParams(**FAST, max_steps=5, save_steps=500, project_name="stopped")  # no periodic checkpoint
    env = GatedEnv()
    run = train(params, env, blocking=False, display=lambda dashboard: None)
    try:
        assert env.entered.wait(120)
        shell.run_line_magic("grpo_stop", "")  # while step 2 is being scored
    finally:
        env.release.set()
    run.wait(timeout=120)
    assert run.status == "stopped" and run.step == 2 and run.reason == "stopped on request"
    checkpoint = run.output_dir / "checkpoint-2"
    _complete(checkpoint, 2)
    finished = list(read_run_log(run.output_dir))[-1]
    assert isinstance(finished, RunFinished) and finished.saved == [str(run.output_dir), str(checkpoint)]

    probe = OptimizerProbe()
    shown: list[Dashboard] = []
    resumed = train(params, LettersEnv(), resume=True, callbacks=[probe], display=shown.append)
    assert resumed.status == "completed" and resumed.step == 5
    assert probe.begin_step == 2 and probe.optimizer_state  # Adam's moments came back with the step count
    assert [h["step"] for h in resumed.history] == [1, 2, 3, 4, 5]
    assert resumed.history[:2] == run.history
    assert _steps(run.output_dir) == [1, 2, 3, 4, 5]  # one log, the steps numbered on from the stop
    shown[0].flush()  # its view is a turn behind unless the end was rendered by the caller (it nearly always is)
    assert list(shown[0].view.steps) == [1, 2, 3, 4, 5]  # the live dashboard continued too
    assert list(grpo_magic.replay(str(run.output_dir)).view.steps) == [1, 2, 3, 4, 5]


def test_ctrl_c_in_a_foreground_run_finishes_the_step_with_a_checkpoint(in_tmp):
    """As on Colab: the run trains in the main thread, and the interrupt button sends SIGINT."""
    assert threading.current_thread() is threading.main_thread()
    sent: list[int] = []

    def interrupt_after_step_2(event) -> None:
        if isinstance(event, StepLogged) and event.step == 2 and not sent:
            sent.append(event.step)
            os.kill(os.getpid(), signal.SIGINT)  # handled between two bytecodes of this (the training) thread

    previous = signal.getsignal(signal.SIGINT)
    run = train(GRPOParams(**FAST, max_steps=50, project_name="interrupted"), LettersEnv(),
                callbacks=[interrupt_after_step_2])
    assert signal.getsignal(signal.SIGINT) is previous  # the run's handler is gone with the run
    assert run.status == "stopped" and run.reason == "stopped by Ctrl-C (SIGINT)" and run.step == 3
    _complete(run.output_dir / "checkpoint-3", 3)  # step 3 was under way: it was finished, then saved
    statuses = [e.status for e in read_run_log(run.output_dir) if hasattr(e, "status")]
    assert statuses[-3:] == ["stopping", "saving", "stopped"]


def test_resume_allows_harmless_changes_and_names_one_that_matters(in_tmp):
    params = GRPOParams(**FAST, max_steps=2, save_steps=500, project_name="changed")
    train(params, LettersEnv())
    with pytest.raises(GRPOMagicError, match=r"trained with --rl-num-generations 4, and this run has 2"):
        train(params.replace(rl_num_generations=2, max_steps=4), LettersEnv(), resume=True)
    harmless = params.replace(max_steps=3, save_steps=7, rl_max_error_rate=1.0, rl_env_workers=2, rl_temperature=0.8)
    resumed = train(harmless, LettersEnv(), resume=True)
    assert resumed.status == "completed" and _steps(resumed.output_dir) == [1, 2, 3]


def test_the_launcher_checks_a_resume_before_starting_any_process(in_tmp, capsys):
    train(GRPOParams(**FAST, max_steps=1, project_name="single"), LettersEnv())
    code = main(["train", *CLI, "--max-steps", "2", "--project-name", "single", "--resume", "--num-processes", "2",
                 "--batch-size", "4", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "trained with --batch-size 8, and this run has 4" in err


def test_sigterm_to_a_cli_run_stops_it_with_a_checkpoint_and_resume_continues(in_tmp):
    out = in_tmp / "terminated"
    argv = [sys.executable, "-m", "grpo_magic", "train", *CLI, "--project-name", "terminated", "--quiet"]
    proc = subprocess.Popen([*argv, "--max-steps", "500"], cwd=in_tmp, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / "events.jsonl").exists() and len(_steps(out)) >= 1, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "SIGTERM" in err
    events = list(read_run_log(out))
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "stopped" and "SIGTERM" in finished.reason
    stopped_at = _steps(out)[-1]
    assert finished.steps == stopped_at and (out / "model.safetensors").exists()
    _complete(out / f"checkpoint-{stopped_at}", stopped_at)

    resumed = subprocess.run([*argv, "--max-steps", str(stopped_at + 2), "--resume"], cwd=in_tmp, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(out) == list(range(1, stopped_at + 3))
    assert sum(isinstance(e, RunStarted) for e in read_run_log(out)) == 2


def _rank_pids(parent: int) -> dict[int, int]:
    """RANK -> pid of the worker processes of a torchrun (read from /proc)."""
    found = {}
    for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((int(v.split(b"=", 1)[1]) for v in env if v.startswith(b"RANK=")), None)
        if rank is not None:
            found[rank] = int(child)
    return found


def test_sigterm_to_one_of_two_torchrun_processes_stops_both_at_the_same_step_with_a_checkpoint(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "grpo_magic", "train", *CLI,
         "--batch-size", "4", "--max-steps", "500", "--project-name", "out", "--quiet"],
        cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / "events.jsonl").exists() and len(_steps(out)) >= 1, proc)
        pids = _rank_pids(proc.pid)
        assert sorted(pids) == [0, 1]
        os.kill(pids[1], signal.SIGTERM)  # not the main process: the stop must reach it
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Both processes ended as a SIGTERM'd program does (143); torchrun reports that as its own failure (1).
    statuses = dict(re.findall(r"rank\s*:\s*(\d) \(local_rank: \d\)\s*\n\s*exitcode\s*:\s*(\d+)", err))
    assert statuses == {"0": "143", "1": "143"} and proc.returncode == 1, err[-3000:]
    events = list(read_run_log(out))
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "stopped", err[-3000:]
    assert "SIGTERM" in finished.reason
    stopped_at = _steps(out)[-1]
    assert finished.steps == stopped_at and (out / "model.safetensors").exists()
    _complete(out / f"checkpoint-{stopped_at}", stopped_at, processes=2)
    assert last_checkpoint(out) == str(out / f"checkpoint-{stopped_at}")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_sigterm_to_the_launcher_of_two_processes_stops_both_with_a_checkpoint_the_weights_and_143(tmp_path):
    """``grpo-magic train --num-processes 2`` on CPU starts torchrun itself; SIGTERM to it is SIGTERM to the run."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_magic", "train", *CLI, "--batch-size", "4", "--max-steps", "500",
         "--project-name", "out", "--num-processes", "2", "--quiet"],
        cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        _wait_for(lambda: (out / "events.jsonl").exists() and len(_steps(out)) >= 1, proc)
        (torchrun,) = _children(proc.pid)
        started = [torchrun, *_children(torchrun)]
        assert len(started) == 3  # torchrun and its two training processes
        proc.send_signal(signal.SIGTERM)  # to the launcher alone, as a scheduler or `timeout` sends it
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    # Our processes print no traceback; torchrun prints its own on the SIGTERM it gets (SignalException).
    ours, _, torchrun_report = err.partition("Traceback (most recent call last)")
    assert "grpo-magic: stopped after" in ours and "Traceback" not in torchrun_report, err[-3000:]
    assert not torchrun_report or torchrun_report.rstrip().endswith(f"Process {torchrun} got signal: 15"), err[-3000:]
    events = list(read_run_log(out))
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "stopped" and "SIGTERM" in finished.reason
    stopped_at = _steps(out)[-1]
    assert finished.steps == stopped_at and (out / "model.safetensors").exists()
    assert str(out) in finished.saved and str(out / f"checkpoint-{stopped_at}") in finished.saved
    _complete(out / f"checkpoint-{stopped_at}", stopped_at, processes=2)
    assert sum(isinstance(e, RunStarted) for e in events) == 1  # one run, written by the main process
    assert not (out / ".grpo-magic.lock.json").exists()  # its folder is free again
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()]  # nothing left running


def test_replay_skips_a_line_cut_short_by_a_kill_with_a_note_and_shows_the_rest(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=3, project_name="torn"), LettersEnv())
    log = run.run_log
    lines = log.read_text().splitlines()
    step_2 = next(i for i, line in enumerate(lines) if '"step_logged"' in line and '"step": 2' in line)
    group = next(i for i, line in enumerate(lines) if '"group_scored"' in line and '"step": 3' in line)
    lines[group] = lines[group][: len(lines[group]) // 2]  # killed mid-write, then a resumed writer went on
    lines.insert(step_2, "\x00\x00garbage")
    log.write_text("\n".join(lines) + "\n")

    notes: list[str] = []
    events = list(read_run_log(run.output_dir, skipped=notes))
    assert [e.step for e in events if isinstance(e, StepLogged)] == [1, 2, 3] and isinstance(events[-1], RunFinished)
    assert notes == [f"line {step_2 + 1} of events.jsonl skipped: not valid JSON",
                     f"line {group + 2} of events.jsonl skipped: cut short or damaged (a process killed mid-write?)"]
    dashboard = grpo_magic.replay(str(run.output_dir))
    assert dashboard.step == 3 and list(dashboard.view.steps) == [1, 2, 3] and dashboard.view.notes == notes
    assert "cut short" in dashboard._info.value
    dashboard.select_step(3)  # the step with the damaged line: its other group is still shown
    assert dashboard.groups_html.count('class="grpo-group"') == 1
