"""What-if re-scoring of a real run log: ``%grpo_rescore`` and ``grpo_magic.rescore``.

Real runs of TRL's GRPOTrainer on the tiny model write the logs; the new scores must be exactly the
edited env's values, the old ones the logged ones, and the new advantages TRL's formula for that
run's settings (checked against a hand computation, and against the advantages TRL itself logged).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import threading

import pytest

import grpo_magic
from envs.letters import LettersEnv
from grpo_magic import GRPOParams, read_run_log, register_env, train
from grpo_magic.analysis.rescoring import ranks, read_logged_run
from grpo_magic.events import GroupScored
from grpo_magic.trl_compat import trl_advantages
from tests.run_support import SlowLettersEnv, wait_for_step

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)

EDITED_CELL = '''
from datasets import Dataset

class LettersEnv:
    """The letters env, edited: two letters or more is a full score, one letter a quarter."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Write the letter a many times: "] * 64, "letter": ["a"] * 64})

    def score_episode(self, model, tokenizer, completion, letter):
        n = completion.lower().count(letter)
        return {"score": 1.0 if n >= 2 else 0.25 * n, "count": n}
'''


def edited(completion: str, letter: str = "a") -> float:
    n = completion.lower().count(letter)
    return 1.0 if n >= 2 else 0.25 * n


@pytest.fixture(scope="module")
def letters_run(tmp_path_factory):
    run = train(GRPOParams(**FAST, max_steps=3, project_name=str(tmp_path_factory.mktemp("rescore") / "run")),
                LettersEnv(), display=False)
    assert run.status == "completed"
    return run


def _logged(run_dir) -> list[GroupScored]:
    return [e for e in read_run_log(run_dir) if isinstance(e, GroupScored)]


def test_rescore_of_a_finished_run_gives_the_edited_values_the_logged_ones_and_trl_advantages(shell, letters_run):
    shell.run_cell_magic("grpo_env", "", EDITED_CELL)
    report = shell.run_line_magic("grpo_rescore", f"{letters_run.output_dir} --env LettersEnv")
    logged = {(g.step, g.group): g for g in _logged(letters_run.output_dir)}
    assert len(report.groups) == len(logged) == 6
    for g in report.groups:
        old = logged[(g["step"], g["group"])]
        assert g["prompt"] == old.prompt and g["completions"] == old.completions
        assert g["new_scores"] == [edited(c) for c in g["completions"]]  # exactly the edited function's values
        assert g["old_scores"] == old.scores and g["old_advantages"] == old.advantages
        assert isinstance(g, dict)  # items are dicts, like run.groups'
        assert g["new_advantages"] == trl_advantages([g["new_scores"]], report.settings)[0]  # one group a step here
        # the same arithmetic gives back the advantages TRL trained on (float32 there); tests/test_trl_compat.py
        # holds it to TRL's for every setting
        assert trl_advantages([g["old_scores"]], report.settings)[0] == pytest.approx(g["old_advantages"], rel=1e-4, abs=1e-4)
        assert [c["count"] for c in g["new_components"]] == [c.lower().count("a") for c in g["completions"]]
        assert g["rank_changes"] == sum(a != b for a, b in zip(ranks(g["old_scores"]), ranks(g["new_scores"]), strict=True))
    s = report.summary
    assert report.settings["scale_rewards"] == "group"
    assert s["mean_old"] == pytest.approx(statistics.mean(x for g in logged.values() for x in g.scores))
    assert s["mean_new"] == pytest.approx(statistics.mean(edited(c) for g in logged.values() for c in g.completions))
    assert s["rank_changes"] == sum(g["rank_changes"] for g in report.groups) and s["completions"] == 24
    zero = sum(len(set(g["new_scores"])) == 1 for g in report.groups) / 6
    assert s["zero_variance_new"] == pytest.approx(zero) and s["zero_variance_old"] == 0.0
    assert s["components_new"]["count"] == pytest.approx(
        statistics.mean(c.lower().count("a") for g in logged.values() for c in g.completions))
    # HTML: groups whose ranking changed first, changed scores highlighted
    page = report._repr_html_()
    first = page.split("<details", 2)[1]
    reranked = max(report.groups, key=lambda g: g["rank_changes"])
    if reranked["rank_changes"]:
        assert "changed rank" in first and "open" in first.split(">", 1)[0]
    changed = sum(sum(g["changed"]) for g in report.groups)
    assert page.count("background:rgba(250,204,21,.35)") == changed == s["changed_scores"]


def test_steps_pick_a_range_and_a_copied_folder_rescores_without_weights(letters_run, in_tmp):
    copy = in_tmp / "from-another-machine"
    copy.mkdir()
    shutil.copy(letters_run.run_log, copy / "events.jsonl")  # the log alone: no weights, no tokenizer
    register_env(LettersEnv, "LettersEnv")
    report = grpo_magic.rescore(str(copy), "LettersEnv", steps="2:3")
    assert {g["step"] for g in report.groups} == {2, 3} and report.summary["steps"] == "2:3"
    for g in report.groups:  # the same env scores the same completions the same way
        assert g["new_scores"] == pytest.approx(g["old_scores"]) and g["rank_changes"] == 0
    assert grpo_magic.rescore(copy / "events.jsonl", LettersEnv, steps=3).summary["groups"] == 2
    assert {g["step"] for g in grpo_magic.rescore(str(copy), LettersEnv(), steps=":1").groups} == {1}


def test_an_old_run_log_without_rows_is_matched_to_the_env_dataset_by_prompt(letters_run, in_tmp):
    old = in_tmp / "old-run"
    old.mkdir()
    with open(letters_run.run_log, encoding="utf-8") as src, open(old / "events.jsonl", "w", encoding="utf-8") as dst:
        for line in src:
            data = json.loads(line)
            data.pop("columns", None)  # what a log written before GroupScored.columns looks like
            dst.write(json.dumps(data) + "\n")
    assert not any(g.columns for g in _logged(old))
    report = grpo_magic.rescore(str(old), LettersEnv)  # score_episode needs `letter`: from the dataset
    assert report.summary["errors"] == 0
    for g in report.groups:
        assert g["new_scores"] == pytest.approx(g["old_scores"])


class ScaleBatchLettersEnv(LettersEnv):
    def score_episode(self, model, tokenizer, completion, letter):
        return min(1.0, completion.count(" ") / 4)


def test_rescore_uses_the_runs_scale_rewards(in_tmp, monkeypatch):
    """A run whose GRPOConfig normalizes over the batch: the new advantages follow that setting."""
    original = GRPOParams.grpo_config_kwargs
    monkeypatch.setattr(GRPOParams, "grpo_config_kwargs",
                        lambda self, *a, **kw: original(self, *a, **{"scale_rewards": "batch", **kw}))
    run = train(GRPOParams(**FAST, max_steps=2), LettersEnv(), display=False)
    report = grpo_magic.rescore(run, ScaleBatchLettersEnv)
    assert report.settings["scale_rewards"] == "batch"
    for step in (1, 2):
        groups = [g for g in report.groups if g["step"] == step]
        new = trl_advantages([g["new_scores"] for g in groups], report.settings)
        assert [g["new_advantages"] for g in groups] == new  # the step's groups together: one batch std
        by_group = trl_advantages([g["new_scores"] for g in groups], {**report.settings, "scale_rewards": "group"})
        assert by_group != new  # the setting matters for these scores
        old = trl_advantages([g["old_scores"] for g in groups], report.settings)
        assert [a for o in old for a in o] == pytest.approx([a for g in groups for a in g["old_advantages"]], abs=1e-4)


def test_rescore_of_a_run_in_progress_covers_the_steps_logged_so_far(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=500), SlowLettersEnv(), display=False, blocking=False)
    try:
        wait_for_step(run, 2)
        before = set(read_logged_run(run.run_log).groups)
        report = grpo_magic.rescore(run, LettersEnv)
        after = set(read_logged_run(run.run_log).groups)
        assert not run.done
        steps = {g["step"] for g in report.groups}
        assert before <= steps <= after and len(steps) >= 2 and max(steps) < 500
    finally:
        run.stop()
        run.wait(timeout=300)


class Concurrency:
    """Counts how many episodes run at the same moment (no clock involved)."""

    def __init__(self) -> None:
        self.active = self.most = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


def test_episodes_run_concurrently_in_threads_and_async_and_failures_are_errors(letters_run):
    seen = Concurrency()
    barrier = threading.Barrier(4, timeout=60)  # four episodes must be inside score_episode together

    class ThreadedEnv(LettersEnv):
        def score_episode(self, model, tokenizer, completion, letter):
            seen.enter()
            try:
                barrier.wait()
                if "a" not in completion:
                    raise ValueError("no letter at all")
                return super().score_episode(model, tokenizer, completion, letter)
            finally:
                seen.leave()

    report = grpo_magic.rescore(letters_run, ThreadedEnv, workers=4)
    assert seen.most == 4  # with one worker the barrier would time out: every episode would fail
    errors = [e for g in report.groups for e in g["errors"] if e]
    no_letter = [c for g in report.groups for c in g["completions"] if "a" not in c]
    assert len(errors) == len(no_letter) == report.summary["errors"]
    assert all(e["kind"] == "ValueError" and "no letter at all" in e["message"] for e in errors)
    for g in report.groups:
        assert all(s is None for s, c in zip(g["new_scores"], g["completions"], strict=True) if "a" not in c)

    async_seen = Concurrency()

    class AsyncEnv(LettersEnv):
        async def score_episode(self, model, tokenizer, completion, letter):
            async_seen.enter()
            await asyncio.sleep(0.01)
            async_seen.leave()
            return 0.5

    report = grpo_magic.rescore(letters_run, AsyncEnv)
    assert async_seen.most == 24  # every logged completion of the run in one concurrent batch
    assert {s for g in report.groups for s in g["new_scores"]} == {0.5}
    assert all(a == 0.0 for g in report.groups for a in g["new_advantages"])  # equal scores: no signal
    assert report.summary["zero_variance_new"] == 1.0
