"""The terminal surface: `grpo-magic train` with the original description's flags."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_magic import read_run_log
from grpo_magic.events import GroupScored, RunFinished, StepLogged

# Written for the original system's interface: string prompts, a positional-style
# score_episode(self, model, tokenizer, completion, case_idx), get_tools returning [].
ORIGINAL_ENV = '''
from datasets import Dataset


class HotelEnv:
    def __init__(self, max_turns=3, difficulty="normal"):
        self.max_turns = max_turns
        self.difficulty = difficulty

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({
            "prompt": ["You are a hotel booking agent. Book a room in Lisbon."] * 8,
            "case_idx": list(range(8)),
        })

    def score_episode(self, model, tokenizer, completion, case_idx):
        bonus = 0.1 if self.difficulty == "hard" else 0.0
        return self.max_turns / 10 + bonus

    def get_tools(self):
        return []
'''


@pytest.mark.process
def test_an_original_interface_env_trains_unchanged_from_its_own_folder(tmp_path):
    project = tmp_path / "project"
    (project / "my_envs").mkdir(parents=True)
    (project / "my_envs" / "__init__.py").write_text("")
    (project / "my_envs" / "hotel_env.py").write_text(textwrap.dedent(ORIGINAL_ENV))
    proc = subprocess.run(
        ["grpo-magic", "train",
         "--model", "tiny",
         "--trainer", "grpo",
         "--rl-env-module", "my_envs.hotel_env",
         "--rl-env-class", "HotelEnv",
         "--rl-env-config", '{"max_turns": 5, "difficulty": "hard"}',
         "--rl-num-generations", "4",
         "--rl-max-new-tokens", "8",
         "--rl-temperature", "1.0", "--rl-kl-coef", "0.1", "--rl-clip-range", "0.2",
         "--epochs", "1", "--batch-size", "4", "--lr", "1e-5", "--max-steps", "2",
         "--project-name", "grpo-agent"],
        cwd=project, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "completed after 2 steps" in proc.stderr
    assert "step 2/2" in proc.stderr + proc.stdout  # the progress line
    out = project / "grpo-agent"
    events = list(read_run_log(out))
    scores = {s for e in events if isinstance(e, GroupScored) for s in e.scores}
    assert scores == {0.6}  # max_turns 5 and difficulty hard reached the constructor
    assert [e.step for e in events if isinstance(e, StepLogged)] == [1, 2]
    assert isinstance(events[-1], RunFinished) and events[-1].status == "completed"
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()


@pytest.mark.process
def test_python_dash_m_and_help(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grpo_magic", "train", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    assert "--rl-num-generations" in proc.stdout and "Completions sampled per prompt" in proc.stdout


def test_missing_env_module_exits_2_with_one_line(tmp_path, cli):
    proc = cli(["train", "--model", "tiny", "--rl-env-module", "my_envs.nope", "--rl-env-class", "HotelEnv"],
               cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "my_envs.nope" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_model_is_named_before_anything_loads(cli):
    proc = cli(["train", "--model", "./models/missing", "--rl-env-module", "envs.letters",
                "--rl-env-class", "LettersEnv"], cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2 and "./models/missing" in proc.stderr and proc.stderr.count("\n") == 1
