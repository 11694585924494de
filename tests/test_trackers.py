"""``--report-to trackio`` and ``--report-to tensorboard``: real CLI runs on tiny, offline, read back.

Both trackers run locally (trackio writes a SQLite file under ``TRACKIO_DIR``, no account and no
Space; TensorBoard writes event files under the output folder). The reward components and the
episode-error rate that grpo_magic logs through TRL's ``log_metric`` must arrive there with the same
values as in the run log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_magic import read_run_log
from grpo_magic.events import StepLogged

ROOT = Path(__file__).resolve().parents[1]

#: Components, and a third of the episodes failing (episode errors), so that both have values to carry.
ENV = '''from datasets import Dataset


class PartsEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Write the letter a many times: "] * 16})

    def score_episode(self, model, tokenizer, completion):
        if len(completion) % 3 == 0:
            raise ValueError("this episode fails")
        return {"score": completion.count("a") / max(1, len(completion)), "has_a": float("a" in completion)}
'''


def _train(tmp_path: Path, tracker: str) -> tuple[Path, dict[int, dict[str, float]]]:
    (tmp_path / "parts_env.py").write_text(ENV)
    out = tmp_path / f"{tracker}-run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACKIO_DIR": str(tmp_path / "trackio")}
    done = subprocess.run(
        [sys.executable, "-m", "grpo_magic", "train", "--model", "tiny", "--rl-env-module", "parts_env",
         "--rl-env-class", "PartsEnv", "--max-steps", "3", "--batch-size", "8", "--rl-num-generations", "4",
         "--rl-max-new-tokens", "8", "--rl-max-error-rate", "1", "--seed", "1", "--report-to", tracker,
         "--project-name", str(out), "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = {e.step: e.metrics for e in read_run_log(out) if isinstance(e, StepLogged)}
    assert sorted(logged) == [1, 2, 3]
    assert any(m["env/error_rate"] > 0 for m in logged.values())  # episode errors happened, so there is a signal
    return out, logged


def _assert_same(tracked: dict[int, dict[str, float]], logged: dict[int, dict[str, float]]) -> None:
    for step, metrics in logged.items():
        for name in ("components/has_a", "env/error_rate", "reward"):
            assert tracked[step][f"train/{name}"] == pytest.approx(metrics[name], abs=1e-6), (step, name)


@pytest.mark.process
def test_trackio_gets_components_and_episode_errors_offline(tmp_path):
    _, logged = _train(tmp_path, "trackio")
    project = "huggingface"  # transformers' default TrainingArguments.project
    assert (tmp_path / "trackio" / f"{project}.db").is_file()
    # trackio's own reader, in a process of its own: it fixes TRACKIO_DIR when it is imported
    read = subprocess.run(
        [sys.executable, "-c", "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
         f"(run,) = S.get_runs({project!r}); print(json.dumps(S.get_logs({project!r}, run)))"],
        env={**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}, capture_output=True, text=True, timeout=300)
    assert read.returncode == 0, read.stderr[-2000:]
    rows = json.loads(read.stdout.strip().splitlines()[-1])
    tracked = {int(r["step"]): r for r in rows if "train/env/error_rate" in r}
    _assert_same(tracked, logged)


@pytest.mark.process
def test_tensorboard_gets_components_and_episode_errors(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, logged = _train(tmp_path, "tensorboard")
    (events,) = out.glob("runs/*/events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tracked: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for scalar in acc.Scalars(tag):
            tracked.setdefault(scalar.step, {})[tag] = scalar.value
    _assert_same(tracked, logged)
