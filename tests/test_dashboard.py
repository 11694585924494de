"""Dashboard and terminal progress, fed with synthetic events (no model, no training)."""

from __future__ import annotations

import html as html_lib
import io
import json
import math
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from run_support import wait_until  # noqa: E402

from grpo_magic.dashboard import LATEST, Dashboard, replay  # noqa: E402
from grpo_magic.events import (  # noqa: E402
    EpisodeError,
    EventStream,
    GroupScored,
    RunFinished,
    RunLog,
    RunStarted,
    StatusChanged,
    StepLogged,
)
from grpo_magic.frontends.progress import TerminalProgress, progress_bar, shorten  # noqa: E402

PNG = b"\x89PNG"
T0 = 1_000.0


def advantages(scores: list[float | None]) -> list[float]:
    """TRL's group advantage (scale_rewards='group'): errors excluded, and get 0."""
    valid = [s for s in scores if s is not None]
    mean = sum(valid) / len(valid) if valid else 0.0
    std = math.sqrt(sum((s - mean) ** 2 for s in valid) / (len(valid) - 1)) if len(valid) > 1 else 0.0
    return [0.0 if s is None else (s - mean) / (std + 1e-4) for s in scores]


def group(
    step: int,
    index: int = 0,
    scores: list[float | None] | None = None,
    *,
    prompt: str | None = None,
    completions: list[str] | None = None,
    errors: list[dict | None] | None = None,
    clipped: list[bool] | None = None,
    t: float | None = None,
) -> GroupScored:
    scores = [0.75, 0.25, 0.75, 0.25] if scores is None else scores
    n = len(scores)
    return GroupScored(
        step=step,
        group=index,
        prompt=prompt if prompt is not None else f"prompt of step {step} group {index}",
        completions=completions or [f"completion s{step}g{index}c{i}" for i in range(n)],
        scores=scores,
        advantages=advantages(scores),
        errors=errors or [None] * n,
        clipped=clipped or [False] * n,
        time=T0 + step if t is None else t,
    )


def step_logged(step: int, reward: float = 0.5, *, max_steps: int = 40, errors: int = 0) -> StepLogged:
    return StepLogged(
        step=step,
        metrics={
            "reward": reward,
            "reward_std": 0.1,
            "kl": 0.001 * step,
            "loss": 0.01,
            "frac_reward_zero_std": 0.0,
            "completions/mean_length": 12.0,
            "completions/clipped_ratio": 0.25,
            "entropy": None,
        },
        max_steps=max_steps,
        episodes=8,
        episode_errors=errors,
        time=T0 + step,
    )


def started(output_dir: str = "/tmp/run", max_steps: int = 40) -> RunStarted:
    return RunStarted(params={}, env_name="HotelEnv", model="tiny", output_dir=output_dir, max_steps=max_steps, time=T0)


def run_events(steps: int, groups_per_step: int = 2, output_dir: str = "/tmp/run") -> list:
    events: list = [started(output_dir, steps), StatusChanged(status="training", time=T0)]
    for s in range(1, steps + 1):
        events += [group(s, g, [0.25 * ((s + g + i) % 5) for i in range(4)]) for g in range(groups_per_step)]
        events.append(step_logged(s, 0.1 * (s % 10), max_steps=steps))
    events.append(RunFinished(status="completed", output_dir=output_dir, steps=steps, time=T0 + steps + 1))
    return events


def shown(dash: Dashboard) -> Dashboard:
    """The dashboard with what was handed over rendered (the renderer thread does it a few times a second)."""
    dash.flush()
    return dash


# ---- status, header, stop -------------------------------------------------------------------


def test_status_transitions_and_header() -> None:
    dash = Dashboard()
    assert dash.status_text == "starting"
    dash(started())
    assert dash.status_text == "starting"
    assert "HotelEnv" in shown(dash)._header.value and "tiny" in shown(dash)._info.value and "/tmp/run" in shown(dash)._info.value
    dash(StatusChanged(status="loading model", time=T0 + 1))
    assert dash.status_text == "loading model"
    assert "loading model" in shown(dash)._header.value  # StatusChanged is rendered at once
    dash(StatusChanged(status="training", time=T0 + 2))
    assert dash.status_text == "training"
    dash(step_logged(12))
    dash.flush()
    assert dash.step == 12
    assert shown(dash)._progress.value == 12 and shown(dash)._progress.max == 40
    assert "step 12/40" in shown(dash)._progress_text.value and "ETA" in shown(dash)._progress_text.value
    dash(StatusChanged(status="stopping", time=T0 + 13))
    assert dash.status_text == "stopping..."
    dash(RunFinished(status="stopped", reason="stopped by the user", output_dir="/tmp/run", steps=12, time=T0 + 14))
    assert dash.status_text.startswith("stopped")
    assert "ETA" not in shown(dash)._progress_text.value and "elapsed 0:14" in shown(dash)._progress_text.value


def test_failed_status_shows_reason() -> None:
    dash = Dashboard()
    dash(started())
    dash(RunFinished(status="failed", reason="episode error rate 60% is above rl_max_error_rate 50%", time=T0 + 3))
    assert dash.status_text == "failed: episode error rate 60% is above rl_max_error_rate 50%"
    assert "failed" in shown(dash)._header.value
    assert "above rl_max_error_rate" in shown(dash)._info.value
    assert shown(dash)._progress.bar_style == "danger"


def test_stop_button_calls_on_stop() -> None:
    calls: list[int] = []
    dash = Dashboard(on_stop=lambda: calls.append(1))
    dash(started())
    dash(StatusChanged(status="training", time=T0 + 1))
    dash._stop_button.click()
    assert calls == [1]
    assert dash.status_text == "stopping..."
    assert "stopping..." in shown(dash)._header.value
    assert shown(dash)._stop_button.disabled
    dash._stop_button.click()  # a second click does not stop twice
    assert calls == [1]
    dash(RunFinished(status="stopped", time=T0 + 2))
    assert dash.status_text == "stopped"


def test_stop_button_hidden_without_on_stop() -> None:
    dash = Dashboard()
    assert shown(dash)._stop_button.layout.display == "none"


# ---- curves ---------------------------------------------------------------------------------


def test_reward_png_is_png_and_changes_with_new_steps() -> None:
    dash = Dashboard()
    dash(started())
    assert dash.reward_png == b""  # nothing to plot yet
    for s in range(1, 4):
        dash(group(s))
        dash(step_logged(s, reward=0.1 * s))
    dash.flush()
    first = dash.reward_png
    assert first.startswith(PNG)
    dash(group(4, scores=[1.0, 0.0, 1.0, 0.0]))
    dash(step_logged(4, reward=0.9))
    dash.flush()
    assert dash.reward_png.startswith(PNG)
    assert dash.reward_png != first


def test_curves_survive_missing_and_nan_metrics() -> None:
    dash = Dashboard()
    dash(started())
    dash(StepLogged(step=1, metrics={"reward": None, "kl": float("nan")}, time=T0 + 1))
    dash(StepLogged(step=2, metrics={}, time=T0 + 2))
    dash.flush()
    assert dash.reward_png.startswith(PNG)


# ---- group cards ----------------------------------------------------------------------------


def test_groups_html_shows_every_completion_with_score_and_advantage() -> None:
    dash = Dashboard()
    dash(started())
    dash(group(1, 0, [0.0, 0.0, 1.0, 1.0]))
    dash(group(2, 0, [0.75, 0.25, 0.75, 0.25]))
    dash(group(2, 1, [1.0, 0.5, 0.0, 0.5]))
    dash.flush()
    html = dash.groups_html
    assert "completion s1g0" not in html  # only the latest step
    for g, scores in ((0, [0.75, 0.25, 0.75, 0.25]), (1, [1.0, 0.5, 0.0, 0.5])):
        assert f"step 2 · group {g}" in html
        assert f"prompt of step 2 group {g}" in html
        for i, (score, adv) in enumerate(zip(scores, advantages(scores), strict=True)):
            assert f"completion s2g{g}c{i}" in html
            assert f"score {score:.2f}" in html
            assert f"A {adv:+.2f}" in html
    assert "A = (0.75 - 0.50) / (0.29 + 1e-4) = 0.87" in html
    assert "mean 0.50 · std 0.29" in html
    assert "#16a34a" in html and "#dc2626" in html  # green and red advantage bars
    assert "all scores equal" not in html


def test_zero_variance_group_is_flagged() -> None:
    dash = Dashboard()
    dash(group(1, 0, [0.5, 0.5, 0.5, 0.5]))
    dash.flush()
    assert "all scores equal: no learning signal from this prompt" in dash.groups_html
    assert "= 0.00" in dash.groups_html


def test_episode_error_mark_with_traceback() -> None:
    tb = "Traceback (most recent call last):\n  File \"env.py\", line 3\nKeyError: 'room'"
    error = {"kind": "KeyError", "message": "'room'", "traceback": tb}
    dash = Dashboard()
    dash(group(1, 0, [1.0, None, 0.0, 0.5], errors=[None, error, None, None]))
    dash(EpisodeError(step=1, index=1, kind="KeyError", message="'room'", traceback=tb, time=T0 + 1))
    dash.flush()
    html = dash.groups_html
    assert "episode error" in html and "KeyError" in html
    assert "<details><summary>traceback</summary>" in html
    assert "File &quot;env.py&quot;, line 3" in html
    assert "score –" in html  # no score for the failed episode
    assert "1 episode error" in html and "excluded" in html
    assert "A = (1.00 - 0.50) / (0.50 + 1e-4) = 1.00" in html  # errors left out of mean and std
    # errors panel: counts by kind and the latest traceback
    assert "Episode errors (1)" in shown(dash)._errors_box.get_title(0)
    assert "<b>KeyError</b>: 1" in shown(dash)._errors.value
    assert "File &quot;env.py&quot;" in shown(dash)._errors.value


def test_clipped_score_is_marked() -> None:
    g = group(1, 0, [1.0, 0.0, 0.5, 0.5], clipped=[True, False, False, False])
    g.raw_scores = [3.5, 0.0, 0.5, 0.5]
    dash = Dashboard()
    dash(g)
    dash.flush()
    assert "clipped" in dash.groups_html and "env returned 3.5" in dash.groups_html


def test_user_and_model_text_is_escaped() -> None:
    dash = Dashboard()
    dash(RunStarted(params={}, env_name="<b>Env</b>", model="m<i>", output_dir="/tmp/<x>", max_steps=2, time=T0))
    dash(
        group(
            1,
            0,
            [1.0, 0.0],
            prompt="<img src=x onerror=alert(1)>",
            completions=["<script>alert('x')</script>", "ok & fine"],
        )
    )
    dash(EpisodeError(step=1, index=0, kind="<E>", message="<script>", traceback="<tb>", time=T0 + 1))
    dash.flush()
    everything = dash.groups_html + shown(dash)._errors.value + shown(dash)._header.value + shown(dash)._info.value
    assert "<script>" not in everything and "<img" not in everything and "<tb>" not in everything
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in dash.groups_html
    assert "ok &amp; fine" in dash.groups_html
    assert "&lt;b&gt;Env&lt;/b&gt;" in shown(dash)._header.value


def test_long_prompt_is_collapsible() -> None:
    dash = Dashboard()
    dash(group(1, 0, [1.0, 0.0], prompt="line\n" * 50))
    dash.flush()
    assert "<details><summary><b>prompt</b>" in dash.groups_html


# ---- throttling, threads --------------------------------------------------------------------


def test_the_training_thread_only_hands_events_over_and_the_renderer_shows_them() -> None:
    dash = Dashboard(interval_s=0.05)
    dash(started(max_steps=200))
    sent: list[dict] = []
    dash._curves.send = sent.append  # what goes to the page
    renders = dash.render_count
    for s in range(1, 201):
        dash(step_logged(s, max_steps=200))  # no flush: nothing is rendered by the caller
    # the renderer thread folds the queue by itself
    assert wait_until(
        lambda: "step 200/200" in dash._progress_text.value
        and dash._progress.value == 200
        and dash.pending == 0
        and dash.points_sent == 200
        and len(sent) == dash.curve_updates  # the turn that counted the points has also sent them
    )
    assert dash.render_count - renders < 200
    rows = [x for m in sent for x in m["x"]]
    assert sorted(set(rows)) == list(range(1, 201))  # every step reached the page, in a few messages
    assert dash.points_sent == 200 and dash.curve_updates == len(sent) < 200


def test_a_long_step_gets_its_header_and_cards_within_a_second_without_another_event() -> None:
    """A turn that came within a second of the last draw of the slower parts (header, progress, cards) leaves
    them for later: the renderer draws them once their second has passed, not at the next event (which a long
    step on a real model may bring minutes later)."""
    dash = Dashboard(interval_s=0.05)
    dash(started(max_steps=10))
    dash(group(1))
    dash(step_logged(1, max_steps=10))
    assert wait_until(lambda: "step 1/10" in dash._progress_text.value and "s1g0" in dash._groups.value, 30)
    dash(group(2))  # within the second after step 1's draw: folded, the curves sent, the rest left for later
    dash(step_logged(2, max_steps=10))
    # no event comes: the renderer draws what it left out once due (header first, then the cards)
    assert wait_until(lambda: "step 2/10" in dash._progress_text.value and "s2g0" in dash._groups.value, 30)


def test_a_page_that_never_answers_makes_nobody_wait() -> None:
    """A send stuck for good (a browser far away) holds up the renderer thread, never the training thread."""
    dash = Dashboard(interval_s=0.01)
    dash(started(max_steps=100))
    stuck, release = threading.Event(), threading.Event()

    def send(msg: dict) -> None:
        stuck.set()
        release.wait()

    dash._curves.send = send
    dash(step_logged(1, max_steps=100))
    assert stuck.wait(60)  # the renderer is inside a send that does not return
    for s in range(2, 101):
        dash(step_logged(s, max_steps=100))  # each returns at once: handed over, not rendered
    assert dash.pending == 99
    dash(RunFinished(status="completed", steps=100))  # the end waits a bounded while, then leaves it to the renderer
    release.set()
    assert dash.step == 100 and dash.status_text == "completed"
    dash.flush()
    assert dash.points_sent == 100


def test_forced_render_on_run_finished() -> None:
    dash = Dashboard(interval_s=1e9)
    for event in run_events(5):
        dash(event)
    # no flush: RunFinished renders by itself, with the last state
    assert dash.status_text == "completed" and "step 5/5" in shown(dash)._progress_text.value
    assert "completion s5g1c3" in dash.groups_html
    assert dash.reward_png.startswith(PNG)


def test_selection_from_main_thread_while_training_thread_writes(tmp_path: Path) -> None:
    stream = EventStream()
    log = RunLog(tmp_path)
    stream.subscribe(log)
    dash = Dashboard(interval_s=0.01, max_group_steps=2, run_log=str(tmp_path))
    stream.subscribe(dash)
    events = run_events(60, output_dir=str(tmp_path))
    worker = threading.Thread(target=lambda: [stream.emit(e) for e in events])
    worker.start()
    while worker.is_alive():
        dash.select_step(1)
        dash.select_step(LATEST)
    worker.join()
    log.close()
    assert dash.status_text == "completed"
    assert "completion s60g0c0" in dash.groups_html


# ---- step selector, run log, replay ---------------------------------------------------------


def _write_run(tmp_path: Path, steps: int, dash: Dashboard | None = None) -> None:
    stream = EventStream()
    log = RunLog(tmp_path)
    stream.subscribe(log)
    if dash is not None:
        stream.subscribe(dash)
    for event in run_events(steps, output_dir=str(tmp_path)):
        stream.emit(event)
    log.close()


def test_step_selector_reads_old_steps_from_the_run_log(tmp_path: Path) -> None:
    dash = Dashboard(max_group_steps=2, run_log=str(tmp_path))
    _write_run(tmp_path, 6, dash)
    assert sorted(dash.view.groups_mem) == [5, 6]
    values = [v for _, v in shown(dash)._step_select.options]
    assert values[0] == LATEST and {1, 2, 3, 4, 5, 6} <= set(values)
    dash._step_select.value = 2  # as the user does in the browser
    assert "step 2 · group 0" in dash.groups_html and "completion s2g1c3" in dash.groups_html
    assert "completion s6g0" not in dash.groups_html
    dash._step_select.value = 5  # from memory
    assert "completion s5g0c0" in dash.groups_html
    dash._step_select.value = LATEST
    assert "completion s6g1c3" in dash.groups_html


def test_run_log_defaults_to_the_output_dir_of_run_started(tmp_path: Path) -> None:
    dash = Dashboard(max_group_steps=1)
    _write_run(tmp_path, 3, dash)
    dash.select_step(1)
    assert "completion s1g0c0" in dash.groups_html


def test_old_step_without_run_log_says_so() -> None:
    dash = Dashboard(max_group_steps=1)
    for event in run_events(3, output_dir="/nonexistent/grpo-run"):
        dash(event)
    assert [v for _, v in shown(dash)._step_select.options] == [LATEST, 3]
    dash.select_step(1)
    assert "not in memory" in dash.groups_html


def test_replay_matches_live_dashboard(tmp_path: Path) -> None:
    live = Dashboard(max_group_steps=3)
    _write_run(tmp_path, 8, live)
    live.flush()
    again = replay(str(tmp_path))
    assert again.groups_html == live.groups_html
    assert "completion s8g1c3" in again.groups_html
    assert again.status_text == "completed" and again.step == 8
    assert again.reward_png.startswith(PNG)
    again.select_step(1)
    assert "completion s1g0c0" in again.groups_html


def test_replay_reads_data_only(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = group(1, 0, [1.0, 0.0], completions=[f"__import__('os').system('touch {marker}')", "x"])
    log = RunLog(tmp_path)
    for event in (started(str(tmp_path), 1), evil, step_logged(1, max_steps=1)):
        log(event)
    log.close()
    dash = replay(str(tmp_path))
    assert "__import__" in dash.groups_html and not marker.exists()


def test_a_resumed_run_continues_the_log_from_its_checkpoint(tmp_path: Path) -> None:
    _write_run(tmp_path, 3)
    log = RunLog(tmp_path)  # a resumed run appends to the same log, from its checkpoint (step 1) on
    resumed = [
        started(str(tmp_path), 3),
        group(2, 0, [1.0, 0.0], completions=["resumed", "b"]),
        step_logged(2, reward=0.9, max_steps=3),
    ]
    for event in resumed:
        log(event)
    log.close()
    dash = replay(str(tmp_path))
    assert "resumed" in dash.groups_html
    assert list(dash.view.steps) == [1.0, 2.0]  # step 3 of the first attempt is gone
    assert dash.view.metrics["reward"][-1] == 0.9
    assert [v for _, v in shown(dash)._step_select.options] == [LATEST, 2, 1]
    dash.select_step(1)
    assert "completion s1g0c0" in dash.groups_html
    dash.select_step(3)
    assert "not in memory" in dash.groups_html


def test_memory_stays_bounded_over_a_long_run(tmp_path: Path) -> None:
    dash = Dashboard(max_group_steps=3, run_log=str(tmp_path))
    log = RunLog(tmp_path)
    log(started(str(tmp_path), 10_000))
    log.close()
    dash(started(str(tmp_path), 10_000))
    for s in range(1, 10_001):
        dash(group(s, 0, [0.0, 1.0]))
        dash(group(s, 1, [1.0, 1.0]))
        dash(step_logged(s, max_steps=10_000))
    dash.flush()
    assert dash.groups_in_memory() == 6
    assert len(dash.view.groups_mem) == 3
    assert len(dash.view.steps) == 10_000 and dash.view.steps.itemsize == 8  # compact floats
    assert dash.step == 10_000
    assert dash.reward_png.startswith(PNG)
    # old steps are not in this run log: the selector only offers what it can show
    assert [v for _, v in shown(dash)._step_select.options] == [LATEST, 10_000, 9_999, 9_998]


def test_step_selector_is_thinned_for_long_runs(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log(started(str(tmp_path), 1_000))
    for s in range(1, 1_001):
        log(group(s, 0, [0.0, 1.0]))
    log.close()
    dash = replay(str(tmp_path))
    values = [v for _, v in shown(dash)._step_select.options]
    assert len(values) <= 1 + 200 + dash.max_group_steps
    assert values[:3] == [LATEST, 1_000, 999]
    dash.select_step(10)  # any step can still be picked, also one the dropdown does not list
    assert "step 10 · group 0" in dash.groups_html


# ---- display and import cost -----------------------------------------------------------------


def test_displays_as_a_widget() -> None:
    dash = Dashboard()
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == dash.widget.model_id


def test_module_import_is_light() -> None:
    code = (
        "import sys, grpo_magic.dashboard, grpo_magic.frontends.progress\n"
        "print(sorted(m for m in ('ipywidgets', 'matplotlib', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1]
    )
    assert json.loads(out.stdout.replace("'", '"')) == []


# ---- terminal progress ----------------------------------------------------------------------


def _progress_events() -> list:
    scores = [0.75, 0.25, 0.75, 0.25]
    g = group(12, 0, scores, prompt="How many r's are in\nstrawberry?", completions=["three\nr's", "two", "3", "2"])
    return [
        started("/tmp/out", 40),
        StatusChanged(status="loading model", time=T0),
        StatusChanged(status="training", time=T0),
        EpisodeError(step=12, index=3, kind="TimeoutError", message="episode took too long", time=T0 + 11),
        EpisodeError(step=12, index=4, kind="TimeoutError", message="again", time=T0 + 11),
        g,
        StepLogged(
            step=12,
            metrics={"reward": 0.43, "reward_std": 0.12, "kl": 0.003},
            max_steps=40,
            episodes=16,
            episode_errors=0,
            time=T0 + 12,
        ),
        RunFinished(status="failed", reason="out of memory", output_dir="/tmp/out", steps=12, time=T0 + 13),
    ]


def test_terminal_progress_lines() -> None:
    out = io.StringIO()
    progress = TerminalProgress(stream=out, summary_every=4)
    for event in _progress_events():
        progress(event)
    text = out.getvalue()
    assert "\r" not in text  # not a TTY: plain lines
    assert "step 12/40 [=====>              ] reward 0.43 ±0.12 kl 0.003 err 0/16 elapsed 0:12 eta 0:28" in text
    assert "grpo: loading model" in text and "grpo: training" in text
    assert text.count("TimeoutError") == 1  # first error of a kind only
    # summary of the latest group at step 12 (12 % 4 == 0)
    assert "step 12 group 0 (mean 0.50 std 0.29) prompt: How many r's are in ⏎ strawberry?" in text
    assert "0.75 A +0.87 three ⏎ r's" in text and "0.25 A -0.87 two" in text
    assert text.rstrip().endswith("grpo: run failed after 12 steps: out of memory (output: /tmp/out)")


def test_terminal_progress_updates_in_place_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    progress = TerminalProgress(stream=out, summary_every=0)
    progress(started("/tmp/out", 3))
    for s in (1, 2, 3):
        progress(step_logged(s, max_steps=3))
    progress(RunFinished(status="completed", output_dir="/tmp/out", steps=3, time=T0 + 4))
    text = out.getvalue()
    assert text.count("\r") == 3
    assert "\rstep 1/3" in text and "\rstep 3/3 [====================]" in text
    assert "\n" not in text.split("\rstep 1/3")[1].split("\rstep 3/3")[0]  # same line, overwritten
    assert text.endswith("grpo: run completed after 3 steps (output: /tmp/out)\n")


def test_progress_helpers() -> None:
    assert progress_bar(12, 40) == "[=====>              ]"
    assert progress_bar(0, 40) == "[" + " " * 20 + "]"
    assert progress_bar(40, 40) == "[" + "=" * 20 + "]"
    assert shorten("a\n\n  b   c", 80) == "a ⏎ b c"
    assert shorten("x" * 50, 10) == "x" * 9 + "…"


# ---- the reward-hacking watch's alarms (AlarmRaised): card, marker, text, replay --------------------------------


def hacked_run(steps: int = 20, output_dir: str = "/tmp/run", completion: str = "aaaa aaaa aaaa") -> list:
    """A gameable run's events: the reward rises, the task component stays at 0; the watch's alarm where it fires
    (``grpo_magic.watch.Watch``, fed the same events as in a run), right after the step it fired at."""
    from grpo_magic.events import AlarmRaised
    from grpo_magic.watch import Watch

    watch = Watch(["task"])
    events: list = [RunStarted(params={"watch": ["task"]}, env_name="LetterHackEnv", model="tiny",
                               output_dir=output_dir, max_steps=steps, time=T0),
                    StatusChanged(status="training", time=T0)]
    for s in range(1, steps + 1):
        reward = 0.05 + 0.04 * s + 0.01 * (-1) ** s
        events.append(group(s, 0, [reward, reward / 2, reward, 0.0], prompt="What do bees make? Answer in one word: ",
                            completions=[completion, f"bee {s}", completion, "honey?"]))
        logged = step_logged(s, reward, max_steps=steps)
        logged.metrics["components/task"] = 0.0
        events.append(logged)
        for alarm in watch.observe(events[-2:]):
            events.append(AlarmRaised(step=alarm.step, kind=alarm.kind, message=alarm.message,
                                      evidence=alarm.evidence, time=T0 + s))
    events.append(RunFinished(status="completed", output_dir=output_dir, steps=steps, time=T0 + steps + 1))
    return events


def _alarm_of(events: list):
    return next(e for e in events if e.type == "alarm_raised")


@pytest.mark.unit
def test_an_alarm_shows_as_a_card_with_its_evidence_and_a_marker_on_the_curves() -> None:
    events = hacked_run()
    alarm = _alarm_of(events)
    assert alarm.kind == "divergence" and 8 <= alarm.step <= 20
    dash = Dashboard(interval_s=None)
    assert dash.alarms_html == ""  # no card before an alarm
    for event in events:
        dash(event)
    card = dash.alarms_html
    assert card.count('class="grpo-alarm"') == 1
    assert f'data-kind="divergence" data-step="{alarm.step}"' in card
    assert html_lib.escape(alarm.message, quote=True) in card  # the one sentence
    rows = re.findall(r'<tr class="grpo-evidence-row"><td[^>]*><b>([^<]+)</b>', card)
    assert rows[:2] == ["reward", "task"]  # the window's reward and task metric, each with a sparkline
    assert card.count('class="grpo-sparkline"') >= 2
    assert 2 <= card.count('class="grpo-alarm-example"') <= 3 and "aaaa aaaa aaaa" in card
    assert dash.alarms == [{"kind": "divergence", "step": alarm.step, "message": alarm.message,
                            "evidence": alarm.evidence}]
    # The marker: sent to the page with the curves, and the task metric drawn beside the reward.
    sent = dash.curves_sent
    assert [alarm.step, f"alarm: {alarm.kind}", "alarm"] in dash._live.feed.overlay[0]
    reward = sent["spec"][0]
    assert reward["key"] == "reward" and [s["col"] for s in reward["series"]] == ["reward", "components/task"]
    assert reward["series"][1]["dashed"]
    # The text form (a terminal, repr) lists it.
    text = str(dash)
    assert f"ALARM divergence at step {alarm.step}: The reward rose" in text and "task 0 → 0" in text


@pytest.mark.unit
def test_the_png_marks_the_alarm_step_on_every_panel() -> None:
    from grpo_magic.dashboard.curves import ALARM_GID, ALARM_LABEL_GID

    events = hacked_run()
    alarm = _alarm_of(events)
    dash = Dashboard(interval_s=None)
    for event in events[: events.index(alarm)]:
        dash(event)
    assert dash.reward_png.startswith(PNG)
    figure = dash._figure
    assert not [line for ax in figure.axes for line in ax.lines if line.get_gid() == ALARM_GID]
    dash(alarm)
    assert dash.reward_png.startswith(PNG)
    figure = dash._figure
    drawn = [ax for ax in figure.axes if ax.get_visible()]
    for ax in drawn:
        marks = [line for line in ax.lines if line.get_gid() == ALARM_GID]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [alarm.step, alarm.step], ax.get_title()
    labels = [t.get_text().strip() for ax in drawn for t in ax.texts if t.get_gid() == ALARM_LABEL_GID]
    assert labels == ["alarm: divergence"]  # named once, on the reward panel
    reward_ax = drawn[0]
    assert "task" in reward_ax.get_title() and any(line.get_label() == "task" for line in reward_ax.lines)


@pytest.mark.unit
def test_a_replayed_run_log_shows_its_alarm(tmp_path: Path) -> None:
    from grpo_magic.dashboard.curves import ALARM_GID

    log = RunLog(tmp_path)
    events = hacked_run(output_dir=str(tmp_path))
    for event in events:
        log(event)
    log.close()
    assert '"type": "alarm_raised"' in (tmp_path / "events.jsonl").read_text()
    alarm = _alarm_of(events)
    again = replay(str(tmp_path))
    assert again.alarms == [{"kind": alarm.kind, "step": alarm.step, "message": alarm.message,
                             "evidence": json.loads(json.dumps(alarm.evidence))}]
    assert 'class="grpo-alarm"' in again.alarms_html and "aaaa aaaa aaaa" in again.alarms_html
    assert [alarm.step, "alarm: divergence", "alarm"] in again._live.feed.overlay[0]
    assert again.reward_png.startswith(PNG)
    assert any(line.get_gid() == ALARM_GID for line in again._figure.axes[0].lines)
    assert f"ALARM divergence at step {alarm.step}" in str(again)


@pytest.mark.unit
def test_alarm_text_and_evidence_are_escaped_whatever_their_shape() -> None:
    from grpo_magic.events import AlarmRaised

    evil = "<script>alert('x')</script>"
    dash = Dashboard(interval_s=None)
    dash(started())
    dash(AlarmRaised(step=3, kind="<b>kind</b>", message=f"reward rose {evil}", time=T0 + 3, evidence={
        "steps": [1, 2, "<i>"], "reward": [0.1, "<img src=x onerror=alert(1)>", 0.3, float("nan")],
        "tasks": {"<u>task</u>": [0.0, 0.0, 0.0], "bad": "not a list"},
        "examples": [{"prompt": "<img src=x onerror=alert(1)>", "completion": evil, "score": "<s>",
                      "components": {"<em>c</em>": 1.0}}, "not a dict", {"completion": "ok & fine", "score": 0.5}],
        "evals": [{"step": "<x>", "mean": 0.5}, 7]}))
    dash(AlarmRaised(step=4, kind="length", message="m", evidence="not a dict", time=T0 + 4))  # type: ignore[arg-type]
    card = dash.alarms_html
    assert card.count('class="grpo-alarm"') == 2
    for raw in ("<script>", "<img", "<b>kind", "<u>", "<em>", "<i>", "<x>", "<s>"):
        assert raw not in card, raw
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in card and "ok &amp; fine" in card
    assert "reward rose &lt;script&gt;" in card and "&lt;u&gt;task&lt;/u&gt;" in card


@pytest.mark.unit
def test_a_resumed_run_drops_the_alarms_past_its_checkpoint() -> None:
    events = hacked_run()
    alarm = _alarm_of(events)
    dash = Dashboard(interval_s=None)
    for event in events[:-1]:
        dash(event)
    assert len(dash.alarms) == 1
    dash(started())
    dash(step_logged(alarm.step - 2))  # back to its checkpoint, before the alarm: its steps are trained again
    assert dash.alarms == [] and dash.alarms_html == ""
    assert not [m for m in dash.view.markers if len(m) > 2]
