"""The step that trips the error-rate stop is on record: every episode, in one process and in two.

An env that always raises fails every episode of step 1, past the default rl_max_error_rate 0.5:
the run stops, but only after that step's groups and each of its 8 episode errors reached the run
log, the dashboard and ``run.errors`` (docs/architecture.md, "The failing step").
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, read_run_log, train
from grpo_magic.dashboard import Dashboard, html
from grpo_magic.events import EpisodeError, GroupScored, RunFinished, StepLogged

REPO = Path(__file__).resolve().parents[1]

ALWAYS_RAISES = '''
from datasets import Dataset


class BrokenEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Book room {i}: " for i in range(32)]})

    def score_episode(self, model, tokenizer, completion, prompt):
        raise KeyError("room_17 " + prompt.split()[-1])
'''


class BrokenEnv(LettersEnv):
    def score_episode(self, model, tokenizer, completion, letter):
        raise KeyError("room_17")


def _step_1_on_record(out: Path, episodes: int, groups: int) -> list:
    events = list(read_run_log(out))
    errors = [e for e in events if isinstance(e, EpisodeError)]
    assert [(e.step, e.kind) for e in errors] == [(1, "KeyError")] * episodes
    assert sorted(e.index for e in errors) == list(range(episodes))  # every episode, none twice
    scored = [e for e in events if isinstance(e, GroupScored)]
    assert [g.group for g in scored] == list(range(groups)) and {g.step for g in scored} == {1}
    assert all(s is None for g in scored for s in g.scores) and all(a == 0.0 for g in scored for a in g.advantages)
    assert not any(isinstance(e, StepLogged) for e in events)  # the step itself did not train
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "failed"
    assert f"{episodes} of {episodes} episodes failed at step 1" in finished.reason
    return errors


def test_in_one_process_the_failing_steps_episodes_reach_the_log_the_dashboard_and_run_errors(in_tmp):
    shown: list[Dashboard] = []
    run = train(GRPOParams(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, max_steps=5),
                BrokenEnv(), display=shown.append, raise_on_failure=False)
    assert run.status == "failed"
    with pytest.raises(GRPOMagicError, match="8 of 8 episodes failed at step 1"):
        run.wait()
    _step_1_on_record(run.output_dir, episodes=8, groups=2)
    assert run.error_count == 8 and len(run.errors) == 8
    assert all("room_17" in e["traceback"] for e in run.errors)
    assert [g["step"] for g in run.groups] == [1, 1]
    dashboard = shown[0]
    dashboard.flush()  # the end is rendered by the caller unless a render was stuck sending: then a turn later
    assert dashboard.view.error_total == 8 and dashboard.view.groups_in_memory() == 2
    assert "room_17" in html.errors_html(dashboard.view) and "8 of 8 episodes failed" in dashboard.status_text


@pytest.mark.process
def test_in_two_torchrun_processes_the_failing_steps_episodes_of_both_reach_the_log(tmp_path):
    (tmp_path / "broken_env.py").write_text(textwrap.dedent(ALWAYS_RAISES))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GRPO_MAGIC_LAUNCHED")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "grpo_magic", "train", "--model", "tiny",
         "--rl-env-module", "broken_env", "--rl-env-class", "BrokenEnv", "--batch-size", "4",
         "--rl-num-generations", "4", "--rl-max-new-tokens", "8", "--max-steps", "5", "--project-name", "out",
         "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "8 of 8 episodes failed at step 1" in proc.stderr  # judged on both processes' episodes
    errors = _step_1_on_record(tmp_path / "out", episodes=8, groups=2)
    assert len({e.message for e in errors}) == 2  # one prompt per process, 4 completions each
    assert (tmp_path / "out" / "model.safetensors").exists()
