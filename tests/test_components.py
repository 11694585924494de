"""Reward components: ``score_episode`` returns ``{"score": x, **components}``; they reach every surface.

Real: a ``%%grpo_env`` cell in a real InteractiveShell, real TRL training on the tiny model, the
run log read back, the dashboard replayed from it.
"""

from __future__ import annotations

import math

import pytest

import grpo_magic
from grpo_magic import read_run_log
from grpo_magic.dashboard.html import group_card_html
from grpo_magic.environment.scores import normalize_score
from grpo_magic.events import GroupScored, StepLogged

COMPONENTS_CELL = '''
from datasets import Dataset

class PartsEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Write the letter a many times: "] * 16, "letter": ["a"] * 16})

    def score_episode(self, model, tokenizer, completion, letter):
        chars = [c for c in completion.lower() if not c.isspace()]
        share = sum(c == letter for c in chars) / max(1, len(chars))
        return {"score": share, "length": min(1.0, len(completion) / 40), "has_letter": letter in completion,
                "note": "not a number"}
'''

FAST = "--model tiny --max-steps 3 --batch-size 8 --rl-num-generations 4 --rl-max-new-tokens 8 --seed 0"


@pytest.mark.parametrize(("value", "score", "components", "warned", "error"), [
    ({"score": 0.7, "format": 1.0, "correct": 0}, 0.7, {"format": 1.0, "correct": 0.0}, 0, None),
    ({"score": 1.5, "ok": True}, 1.0, {"ok": 1.0}, 0, None),  # the score is clipped as a number is
    ({"score": 0.5, "why": "long", "bad": math.nan, "inf": math.inf}, 0.5, {}, 3, None),
    ({"score": None, "format": 1.0}, None, {"format": 1.0}, 0, "None"),
    ({"score": math.nan}, None, {}, 0, "NaN"),
    ({"score": {"score": 1.0}}, None, {}, 0, "not a number"),
    ({"format": 1.0, "correct": 0.0}, None, {}, 0, "no score"),
    ({}, None, {}, 0, "no score"),
])
def test_a_mapping_is_a_score_and_components(value, score, components, warned, error):
    outcome = normalize_score(value)
    assert outcome.score == score and outcome.components == components and len(outcome.warnings) == warned
    assert (outcome.error or {}).get("kind") == error
    if warned:
        assert all("not a finite number" in w and "return numbers" in w for w in outcome.warnings)


def test_a_mapping_without_score_names_the_fix_in_one_sentence():
    message = normalize_score({"format": 1.0, "correct": 0.0}).error["message"]
    assert "without 'score'" in message and "keys: correct, format" in message and "{'score':" in message
    assert "\n" not in message and message.endswith(".")


def test_a_cell_env_with_components_trains_and_they_reach_history_log_cards_and_replay(shell):
    shell.run_cell_magic("grpo_env", "", COMPONENTS_CELL)
    run = shell.run_line_magic("grpo_train", f"--env PartsEnv {FAST} --run --blocking")
    assert run.status == "completed", run.reason
    events = list(read_run_log(run.output_dir))
    groups = [e for e in events if isinstance(e, GroupScored)]
    assert {g.step for g in groups} == {1, 2, 3}
    for g in groups:  # per completion, in the run log: the env's own numbers
        assert [set(c) for c in g.components] == [{"length", "has_letter"}] * 4
        assert [c["length"] for c in g.components] == [min(1.0, len(t) / 40) for t in g.completions]
        assert [c["has_letter"] for c in g.components] == [float("a" in t) for t in g.completions]
        assert all(len(w) == 1 and "'note'" in w[0] for w in g.warnings)  # kept, counted, shown
        assert g.columns == {"letter": "a"}
    # run.history: TRL's logs, through log_metric: each the mean over the step's scored episodes
    assert len(run.history) == 3
    for row in run.history:
        step_groups = [g for g in groups if g.step == row["step"]]
        lengths = [c["length"] for g in step_groups for c in g.components]
        assert row["components/length"] == pytest.approx(sum(lengths) / len(lengths), rel=1e-6)
        assert row["env/warning_rate"] == 1.0 and "components/note" not in row
    assert run.groups[-1]["components"] == groups[-1].components
    logged = [e for e in events if isinstance(e, StepLogged)]
    assert all("components/has_letter" in e.metrics for e in logged)
    card = group_card_html(groups[-1])
    assert card.count('class="grpo-component"') == 8 and "length" in card and "has_letter" in card
    assert "warning" in card and "not a finite number" in card
    # the dashboard rebuilt from the run log shows them too: the cards and a curve per component
    dash = grpo_magic.replay(run.output_dir)
    assert "has_letter" in dash.groups_html and "grpo-component" in dash.groups_html
    assert set(dash.view.components) == {"length", "has_letter"}
    assert list(dash.view.components["length"]) == pytest.approx([r["components/length"] for r in run.history])
    assert dash.reward_png[:4] == b"\x89PNG"


def test_a_mapping_without_score_is_an_episode_error_and_training_goes_on(shell):
    cell = COMPONENTS_CELL.replace('return {"score": share,', 'return {("score" if len(completion) % 2 else "s"): share,')
    shell.run_cell_magic("grpo_env", "", cell)
    run = shell.run_line_magic("grpo_train", f"--env PartsEnv {FAST} --rl-max-error-rate 1 --run --blocking")
    assert run.status == "completed", run.reason
    errors = [e for g in run.groups for e in g["errors"] if e]
    even = [t for g in run.groups for t in g["completions"] if len(t) % 2 == 0]
    assert len(errors) == len(even) and even  # every completion of even length returned no "score"
    assert all(e["kind"] == "no score" and "without 'score'" in e["message"] for e in errors)
    assert {e["kind"] for e in run.errors} == {"no score"}
