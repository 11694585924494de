"""The dashboard fed by real GRPO training on the offline tiny model (no browser)."""

from __future__ import annotations

import html
import re
import threading
from typing import Any

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from datasets import Dataset  # noqa: E402

import grpo_magic  # noqa: E402
from envs.letters import LettersEnv  # noqa: E402
from grpo_magic import GRPOParams, train  # noqa: E402
from tests.run_support import SlowLettersEnv, wait_for_step  # noqa: E402

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)
PNG = b"\x89PNG\r\n\x1a\n"


def _no_display(_widget: Any) -> None:
    """Stands in for IPython's display outside a notebook: the dashboard is built, not shown."""


def _last_step_groups(run: grpo_magic.GRPORun) -> list[dict[str, Any]]:
    last = max(g["step"] for g in run.groups)
    return sorted((g for g in run.groups if g["step"] == last), key=lambda g: g["group"])


def _cards(groups_html: str) -> list[str]:
    """The HTML of each group card, in order."""
    return groups_html.split('class="grpo-group"')[1:]


def _assert_card_shows_group(card: str, group: dict[str, Any]) -> None:
    """Every completion of the group appears in order, with its score and the advantage TRL used."""
    pos = 0
    for i, completion in enumerate(group["completions"]):
        score, adv = group["scores"][i], group["advantages"][i]
        score_text = "score –" if score is None else f"score {score:.2f}"
        adv_text = f"A {float(adv):+.2f}"
        pattern = (
            re.escape(f"#{i}</span>") + ".*?" + re.escape(score_text) + ".*?" + re.escape(adv_text)
            + ".*?<pre[^>]*>" + re.escape(html.escape(completion, quote=True)) + "</pre>"
        )
        match = re.compile(pattern, re.DOTALL).search(card, pos)
        assert match, f"completion #{i} ({completion!r}, {score_text}, {adv_text}) is not in the card"
        pos = match.end()


def test_a_real_run_fills_the_dashboard_and_replay_gives_the_same_groups(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=2), LettersEnv(), display=_no_display)
    assert run.status == "completed" and run.dashboard is not None
    dash = run.dashboard
    assert dash.status_text == "completed" and dash.step == 2
    assert dash.reward_png.startswith(PNG) and len(dash.reward_png) > 5_000

    groups = _last_step_groups(run)
    assert len(groups) == 2  # batch 8 / 4 generations
    cards = _cards(dash.groups_html)
    assert len(cards) == len(groups)
    for card, group in zip(cards, groups, strict=True):
        assert f"step {group['step']} · group {group['group']}" in card
        _assert_card_shows_group(card, group)

    again = grpo_magic.replay(str(run.output_dir))
    assert again.groups_html == dash.groups_html
    assert again.step == dash.step and again.status_text == dash.status_text
    assert again.reward_png.startswith(PNG)


class ConstantEnv(LettersEnv):
    """Every completion scores the same: no learning signal from any group."""

    def score_episode(self, model, tokenizer, completion: str, letter: str) -> float:
        return 0.5


def test_a_zero_variance_group_is_flagged(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=2), ConstantEnv(), display=_no_display)
    assert run.status == "completed"
    groups = _last_step_groups(run)
    cards = _cards(run.dashboard.groups_html)
    assert len(cards) == len(groups) == 2
    for card, group in zip(cards, groups, strict=True):
        assert set(group["scores"]) == {0.5} and all(a == 0.0 for a in group["advantages"])
        assert "all scores equal: no learning signal" in card
        _assert_card_shows_group(card, group)


class EveryThirdFailsEnv:
    """Every third episode raises; the others score the share of 'a'."""

    def __init__(self) -> None:
        self._calls = 0
        self._lock = threading.Lock()

    def build_dataset(self, tokenizer) -> Dataset:
        return Dataset.from_dict({"prompt": [f"Say a{i}: " for i in range(16)]})

    def score_episode(self, model, tokenizer, completion: str) -> float:
        with self._lock:
            self._calls += 1
            call = self._calls
        if call % 3 == 0:
            raise LookupError(f"room {call} is not booked")
        return completion.count("a") / max(1, len(completion))


def test_an_episode_error_is_marked_in_its_group(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=2, rl_max_error_rate=1.0), EveryThirdFailsEnv(), display=_no_display)
    assert run.status == "completed" and run.error_count >= 4
    groups = _last_step_groups(run)
    page = run.dashboard.groups_html
    failed = [(g, i) for g in groups for i, e in enumerate(g["errors"]) if e]
    assert failed, "the last step had no episode error"
    assert page.count("⚠ episode error") == len(failed)
    assert "LookupError" in page and "is not booked" in page and "traceback" in page
    for card, group in zip(_cards(page), groups, strict=True):
        _assert_card_shows_group(card, group)
    for group, i in failed:
        assert group["scores"][i] is None and group["advantages"][i] == 0.0
    assert f"Episode errors ({run.error_count})" == run.dashboard._errors_box.get_title(0)
    assert grpo_magic.replay(str(run.output_dir)).groups_html == page


def test_the_stop_button_stops_a_background_run_and_saves_the_weights(in_tmp):
    run = train(GRPOParams(**FAST, max_steps=200), SlowLettersEnv(), blocking=False, display=_no_display)
    try:
        wait_for_step(run, 1)
        assert run.status == "running" and run.step >= 1
        button = run.dashboard._stop_button
        assert button.description == "Stop" and not button.disabled
        button.click()
        assert button.disabled and run.stop_requested
        run.wait(timeout=120)
    finally:
        run.stop()
        run.wait(timeout=120)
    assert run.status == "stopped" and run.step < 200
    assert (run.output_dir / "model.safetensors").exists()
    dash = run.dashboard
    dash.flush()  # the end is rendered by the caller unless a render was stuck sending: then a turn later
    assert dash.status_text.startswith("stopped")
    assert "stopped" in dash._header.value and "saved" in dash._info.value
