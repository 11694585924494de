"""The live curves (SVG panels in the page), their notes, the PNG kept for replays, and when they update.

Fed with synthetic events, no model. How often the curves update is a rule of time (a 1% budget, a
minimum interval): it is tested with a fake clock, so that the counts are exact and no assertion
depends on this machine's speed (bench/run.py measures the real share).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ipywidgets")

import grpo_magic.dashboard.widget as widget_module  # noqa: E402
from grpo_magic.dashboard import Dashboard, RunView, replay  # noqa: E402
from grpo_magic.dashboard.chart import MAX_POINTS, chart_html  # noqa: E402
from grpo_magic.dashboard.notes import notes  # noqa: E402
from grpo_magic.dashboard.panels import PANELS, curve_metrics  # noqa: E402
from grpo_magic.dashboard.state import CURVE_METRICS  # noqa: E402
from grpo_magic.events import GroupScored, RunFinished, RunLog, RunStarted, StatusChanged, StepLogged  # noqa: E402

PNG = b"\x89PNG"
PARAMS = {"rl_loss_type": "dapo", "rl_kl_coef": 0.0, "rl_num_generations": 8, "rl_temperature": 1.0,
          "rl_max_new_tokens": 8}


def started(params: dict[str, Any] | None = None, output_dir: str = "") -> RunStarted:
    return RunStarted(params=PARAMS if params is None else params, env_name="AdditionEnv", model="tiny-math",
                      output_dir=output_dir, max_steps=100)


def step(s: int, **metrics: float) -> StepLogged:
    values = {"reward": 0.1 * (s % 10), "reward_std": 0.2, "loss": 0.3, "completions/mean_length": 3.0,
              "completions/clipped_ratio": 0.1, "frac_reward_zero_std": 0.1, **metrics}
    return StepLogged(step=s, metrics=values, max_steps=100, episodes=32, episode_errors=0)


def group(s: int, scores: list[float] | None = None) -> GroupScored:
    scores = scores or [0.0, 1.0, 1.0, 0.0]
    return GroupScored(step=s, group=0, prompt="What is 23 + 45?", completions=["68", "58", "68", "69"][: len(scores)],
                       scores=scores, advantages=[0.0] * len(scores), errors=[None] * len(scores),
                       clipped=[False] * len(scores))


def view_of(*events: Any) -> RunView:
    view = RunView()
    for event in events:
        view.apply(event)
    return view


def paths(svg: str) -> list[str]:
    return re.findall(r'<path d="([^"]*)"', svg)


# ---- the SVG panels ----------------------------------------------------------------------------


def test_panels_are_declared_once_for_both_renderers() -> None:
    assert CURVE_METRICS == curve_metrics() and "reward" in CURVE_METRICS and "error_rate" in CURVE_METRICS
    assert len({p.key for p in PANELS}) == len(PANELS)


def test_every_panel_is_an_svg_whose_lines_follow_the_steps() -> None:
    dash = Dashboard(throttle_s=0)
    dash(started())
    seen = []
    for s in range(1, 6):
        dash(group(s))
        dash(step(s, reward=0.1 * s))
        dash.flush()
        seen.append(dash.curves_html)
    html = seen[-1]
    assert html.count("<svg ") == len(PANELS)
    for panel in PANELS:
        assert f'data-panel="{panel.key}"' in html and panel.title in html
    assert 'data-step="5"' in html and "mean reward (± std, group min/max) <b" in html
    assert "mean: 0.5 at step 5" in html  # the line's tooltip: the latest value
    assert len(set(seen)) == 5  # a new picture at every step
    assert dash.curve_updates == 5
    dash.flush()
    assert dash.curve_updates == 5  # nothing new: nothing sent
    kl = re.search(r'<svg [^>]*data-panel="kl".*?</svg>', html).group(0)
    assert "no data" in kl  # rl_kl_coef 0: TRL logs no KL


def test_missing_values_break_the_line_instead_of_faking_a_point() -> None:
    view = view_of(started(), step(1, loss=0.3), StepLogged(step=2, metrics={"reward": 0.5}), step(3, loss=0.2))
    svg = re.search(r'<svg [^>]*data-panel="loss".*?</svg>', chart_html(view, {})).group(0)
    line = paths(svg)[1]  # after the grid
    assert line.count("M") == 2 and "nan" not in svg.lower()


def test_long_runs_are_thinned_and_keep_their_extremes() -> None:
    events = [started()]
    for s in range(1, 10_001):
        events.append(step(s, reward=1.0 if s == 5_000 else -1.0 if s == 7_777 else 0.5))
    view = view_of(*events)
    html = chart_html(view, {})
    for d in paths(html):
        assert len(re.findall(r"-?\d+", d)) <= 2 * MAX_POINTS + 2
    reward = re.search(r'<svg [^>]*data-panel="reward".*?</svg>', html).group(0)
    ys = [int(v) for v in re.findall(r"-?\d+", paths(reward)[1])[1::2]]  # the mean line, after the grid
    assert len(set(ys)) == 3  # the spike up, the spike down and the plateau all survive


def test_lines_kept_between_redraws_draw_what_a_fresh_drawing_draws() -> None:
    """The live dashboard formats only new points; a replay draws from scratch: the same SVG, always."""
    from grpo_magic.dashboard.chart import LineCache

    cache = LineCache()
    view = view_of(started())
    script: list[Any] = []
    for s in range(1, 1_300):  # past MAX_POINTS: buckets of 2, then 4 steps
        script.append(group(s, [0.0, 1.0] if s % 7 else [0.5, 0.5]))
        loss = float("nan") if s % 50 == 0 else 0.01 * s if s > 600 else 0.3  # gaps, and a spread that grows
        script.append(step(s, loss=loss, reward=0.1 * (s % 10)))
        if s == 700:  # TRL logs a step twice: the second merges into the first
            script.append(step(s, loss=5.0))
        if s == 900:  # a resumed run goes back to step 850
            script += [group(850), step(850, reward=0.99)]
    for i, event in enumerate(script):
        view.apply(event)
        if i % 37 == 0 or i == len(script) - 1:
            assert chart_html(view, {}, cache=cache) == chart_html(view, {}), f"after event {i}"
    assert view.cuts >= 1


def test_a_marked_step_shows_on_every_curve_and_in_the_png() -> None:
    dash = Dashboard(throttle_s=0)
    dash(started())
    for s in range(1, 5):
        dash(step(s))
    dash.flush()
    before_png = dash.reward_png
    dash.view.add_marker(3, "env swapped: <AdditionEnv v2>")
    dash.flush()
    assert dash.curves_html.count("env swapped: &lt;AdditionEnv v2&gt; (step 3)") == len(PANELS)
    assert dash.reward_png.startswith(PNG) and dash.reward_png != before_png


# ---- notes ---------------------------------------------------------------------------------------


def test_a_loss_near_zero_is_explained_for_this_runs_loss_type_and_beta() -> None:
    quiet = [step(s, loss=0.004 * (-1) ** s) for s in range(1, 11)]
    note = notes(view_of(started(), *quiet))["loss"]
    assert note.headline.startswith("loss ≈ 0 is expected")
    assert "'dapo'" in note.text and "num_iterations 1" in note.text and "rl_kl_coef is 0" in note.text
    grpo = notes(view_of(started({**PARAMS, "rl_loss_type": "grpo", "rl_kl_coef": 0.04}),
                         *[step(s, loss=0.001, kl=0.02) for s in range(1, 6)]))["loss"]
    assert "'grpo'" in grpo.text and "rl_kl_coef 0.04 adds 0.04 × KL to it (0.0008 at the last step)" in grpo.text
    assert "loss" not in notes(view_of(started(), *[step(s, loss=0.3) for s in range(1, 11)]))
    assert "loss" not in notes(view_of(started(), step(1, loss=0.0), step(2, loss=0.0)))  # too few steps to say


@pytest.mark.parametrize(("reward", "cause"), [(0.95, "too easy"), (0.02, "too hard"), (0.5, "same score")])
def test_many_equal_groups_are_explained_with_what_to_do(reward: float, cause: str) -> None:
    view = view_of(started(), *[step(s, frac_reward_zero_std=0.75, reward=reward) for s in range(1, 6)])
    note = notes(view)["zero_std"]
    assert note.headline.startswith("75% of groups teach nothing")
    assert cause in note.text and "rl_num_generations, now 8" in note.text and "temperature (now 1.0)" in note.text
    assert "zero_std" not in notes(view_of(started(), *[step(s, frac_reward_zero_std=0.2) for s in range(1, 6)]))


def test_cut_off_completions_are_explained() -> None:
    view = view_of(started(), *[step(s, **{"completions/clipped_ratio": 1.0}) for s in range(1, 4)])
    note = notes(view)["length"]
    assert note.headline == "100% of completions cut off: what it means?"
    assert "token limit (8)" in note.text and "mask_truncated_completions" in note.text


def test_notes_sit_next_to_their_curve_escaped_and_come_back_in_a_replay(tmp_path: Path) -> None:
    params = {**PARAMS, "rl_loss_type": "<b>odd</b>"}
    live = Dashboard(throttle_s=0, run_log=str(tmp_path))
    log = RunLog(tmp_path)
    events = [started(params, str(tmp_path)), StatusChanged(status="training")]
    events += [step(s, loss=0.001, frac_reward_zero_std=0.9, reward=1.0) for s in range(1, 8)]
    events.append(RunFinished(status="completed", steps=7))
    for event in events:
        log(event)
        live(event)
    log.close()
    html = live.curves_html
    for key in ("loss", "zero_std"):
        panel = re.search(rf'<div class="grpo-panel" data-panel="{key}">.*?</div></details></div>', html)
        assert panel and 'class="grpo-note"' in panel.group(0), key
    assert "&lt;b&gt;odd&lt;/b&gt;" in html and "<b>odd</b>" not in html
    again = replay(str(tmp_path))
    assert again.curves_html == html


# ---- the PNG, for replays and frontends without widgets -------------------------------------------


def test_the_png_is_drawn_only_when_asked_and_offered_to_frontends_without_widgets(tmp_path: Path) -> None:
    empty = Dashboard()
    assert empty.reward_png == b"" and "image/png" not in empty._repr_mimebundle_()
    log = RunLog(tmp_path)
    for event in (started(output_dir=str(tmp_path)), group(1), step(1), step(2), RunFinished(status="completed")):
        log(event)
    log.close()
    again = replay(str(tmp_path))
    assert again._figure is None  # the replay's curves were drawn as SVG only
    bundle = again._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(PNG)
    assert again.reward_png is again.reward_png  # drawn once, reused while nothing changes


# ---- when the curves update: a fake clock, exact counts ------------------------------------------


class FakeClock:
    """The dashboard's ``time``: monotonic and perf_counter both read ``now``; drawing costs ``cost``."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.cost = 0.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(widget_module, "time", fake)
    monkeypatch.setattr(widget_module, "_curves_cost_seen", 0.001)
    real = widget_module.chart_html

    def costly(*args: Any, **kwargs: Any) -> str:
        fake.now += fake.cost
        return real(*args, **kwargs)

    monkeypatch.setattr(widget_module, "chart_html", costly)
    return fake


def train(clock: FakeClock, steps: int, step_s: float, cost: float) -> Dashboard:
    clock.cost = cost
    dash = Dashboard()  # the default throttle: 0.3 s between renders of everything else
    dash(started())
    dash(StatusChanged(status="training"))
    for s in range(1, steps + 1):
        clock.now += step_s
        dash(group(s))
        dash(step(s))
    return dash


def test_cheap_curves_follow_every_step_of_a_fast_run(clock: FakeClock) -> None:
    dash = train(clock, 200, step_s=0.03125, cost=0.0002)  # 31 ms steps, 0.2 ms drawings
    assert dash.curve_updates >= 196  # every step (the first few wait for the budget's first estimate, 1 ms)
    assert dash.curve_seconds <= 0.01 * 200 * 0.03125


def test_costlier_curves_update_every_other_step_within_one_percent(clock: FakeClock) -> None:
    dash = train(clock, 200, step_s=0.5, cost=0.01)  # 10 ms drawings: 1% of 0.5 s steps allows every other one
    assert 95 <= dash.curve_updates <= 101
    assert dash.curve_seconds <= 0.01 * 200 * 0.5 + 0.01


def test_the_curves_get_what_the_rest_of_the_dashboard_leaves_of_one_percent(clock: FakeClock,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real_apply = RunView.apply

    def slow_apply(self: RunView, event: Any) -> bool:
        clock.now += 0.0001  # 0.1 ms an event, 0.2 ms a step: 0.64% of a 31 ms step
        return real_apply(self, event)

    monkeypatch.setattr(RunView, "apply", slow_apply)
    clock.cost = 0.0002  # curves alone would follow every step (above)
    dash = Dashboard()
    dash(started())
    dash(StatusChanged(status="training"))
    before = dash.busy_seconds
    for s in range(1, 201):
        clock.now += 0.03125
        dash(group(s))
        dash(step(s))
    elapsed = 200 * 0.03125 + (dash.busy_seconds - before)  # the steps, and the dashboard's time in them
    assert dash.busy_seconds - before <= 0.01 * elapsed + 0.0003  # the whole dashboard within 1%, one event over
    assert 70 <= dash.curve_updates <= 130  # the 0.36% left: about every other step


def test_costly_renders_of_the_other_parts_leave_the_curves_their_share(clock: FakeClock,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel with a page attached: 5 ms to send the header, selector and groups. On the 0.3 s
    throttle alone they would take 1.7% of training and the curves would never be drawn."""
    real_groups = Dashboard._render_groups

    def slow_groups(self: Dashboard) -> None:
        clock.now += 0.005
        real_groups(self)

    monkeypatch.setattr(Dashboard, "_render_groups", slow_groups)
    dash = train(clock, 200, step_s=0.03125, cost=0.0002)
    elapsed = 200 * 0.03125 + dash.training_busy_seconds
    assert dash.training_busy_seconds <= 0.01 * elapsed + 0.005  # the whole dashboard within 1%, one render over
    assert dash.render_count >= 5  # the other parts still follow, every 2 s (the longest wait)
    assert dash.curve_updates >= 100  # and the curves at least every other step


def test_very_fast_steps_are_drawn_at_most_fifty_times_a_second(clock: FakeClock) -> None:
    dash = train(clock, 800, step_s=0.00625, cost=0.0)  # 160 steps a second
    assert 195 <= dash.curve_updates <= 251  # 5 s of training, at most 50 a second (here every 4th step: 40)


def test_a_step_longer_than_a_redraw_is_drawn_every_time(clock: FakeClock) -> None:
    dash = train(clock, 50, step_s=3.0, cost=0.025)  # steps of 3 s, drawings of 25 ms
    assert dash.curve_updates == 50
