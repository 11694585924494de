"""The live curves: what the kernel sends the page (only new points), their notes, and the PNG kept
for frontends without widgets.

Fed with synthetic events, no model. The page's side (uPlot in the browser) is tested in
tests/test_browser_curves.py; here, the messages: a page that applies them holds exactly the
view's rows, whatever order resumes, repeated steps and late pages come in.
"""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from grpo_magic.dashboard import Dashboard, RunView, replay  # noqa: E402
from grpo_magic.dashboard.live import CurveFeed, evals_of, panel_spec  # noqa: E402
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


class Page:
    """What curves.js does with the messages, in Python: the rows it holds."""

    def __init__(self) -> None:
        self.x: list[float] = []
        self.cols: dict[str, list[Any]] = {}
        self.markers: list[Any] = []
        self.evals: list[Any] = []

    def __call__(self, msg: dict[str, Any]) -> None:
        if msg["kind"] == "overlay":
            self.markers, self.evals = msg["markers"], msg["evals"]
            return
        start = 0 if msg["kind"] == "reset" else msg["start"]
        assert start <= len(self.x), "a gap: the page would ask for everything again"
        if msg["kind"] == "reset":
            self.cols = {}
            self.markers, self.evals = msg["markers"], msg["evals"]
        self.x[start:] = msg["x"]
        for name, values in msg["columns"].items():
            col = self.cols.setdefault(name, [None] * start)
            col[start:] = values


def same(view: RunView, page: Page) -> None:
    assert page.x == list(view.steps)
    for metric in ("reward", "loss", "completions/clipped_ratio"):
        want = [None if math.isnan(v) else v for v in view.series(metric)]
        assert page.cols[metric] == want, metric


# ---- what the kernel sends -----------------------------------------------------------------------


def test_panels_are_declared_once_for_both_renderers() -> None:
    assert CURVE_METRICS == curve_metrics() and "reward" in CURVE_METRICS and "error_rate" in CURVE_METRICS
    assert len({p.key for p in PANELS}) == len(PANELS)
    spec = panel_spec(PANELS)
    assert [p["key"] for p in spec] == [p.key for p in PANELS]
    assert {p["key"] for p in spec if p["log"]} == {"loss", "kl"}  # a log scale where values span decades


def test_each_step_is_sent_once_and_the_page_holds_every_row() -> None:
    dash = Dashboard(interval_s=None)  # no renderer thread: the test's flushes are the renderer's turns
    sent: list[dict[str, Any]] = []
    dash._curves.send = sent.append
    dash(started())
    page = Page()
    for s in range(1, 41):
        dash(group(s))
        dash(step(s, reward=0.1 * s))
        if s % 7 == 0:
            dash.flush()  # a renderer's turn: the steps since the last one, in one message
    dash.flush()
    for msg in sent:
        page(msg)
    same(dash.view, page)
    assert sent[0]["kind"] == "reset" and all(m["kind"] == "append" for m in sent[1:])
    assert len(sent) == 6 and dash.curve_updates == 6 and dash.points_sent == 40  # steps 7, 14, ..., 35, then 40
    new_rows = sum(len(m["x"]) for m in sent)
    assert new_rows <= 40 + len(sent)  # each step once, but for the last row of each message sent again
    assert page.cols["range_min"][-1] == 0.0 and page.cols["range_max"][-1] == 1.0  # the groups' min/max
    dash.flush()
    assert len(sent) == 6  # nothing new: nothing sent


def test_a_step_logged_twice_a_resume_and_a_late_page_all_end_with_the_views_rows() -> None:
    view = RunView()
    feed = CurveFeed()
    page, late = Page(), None
    script: list[Any] = [started()]
    for s in range(1, 301):
        script += [group(s), step(s, loss=float("nan") if s % 50 == 0 else 0.01 * s)]
        if s == 100:
            script.append(step(100, loss=5.0))  # TRL logs a step twice: merged into one row
        if s == 200:
            script += [group(150), step(150, reward=0.99)]  # a resumed run goes back to step 150
    for i, event in enumerate(script):
        view.apply(event)
        if i % 13 == 0:
            for msg in feed.changes(view):
                page(msg)
        if i == 400:
            late = Page()
            late(feed.reset(view))  # a page opened mid-run says hello and gets every row
    for msg in feed.changes(view):
        page(msg)
    same(view, page)
    assert view.cuts >= 1 and page.cols["loss"][99] == 5.0 and page.x[150] == 201
    assert late is not None and late.x != page.x


def test_markers_and_evaluations_travel_as_an_overlay() -> None:
    view = view_of(started(), step(1), step(2))
    feed = CurveFeed()
    page = Page()
    for msg in feed.changes(view):
        page(msg)
    view.add_marker(2, "env swapped to B")
    view.evals = [{"step": 2, "greedy_mean": 0.75}, {"step": 3, "greedy_mean": float("nan")}]  # i23's state.evals
    msgs = feed.changes(view)
    for msg in msgs:
        page(msg)
    assert [m["kind"] for m in msgs] == ["append", "overlay"]
    assert page.markers == [[2.0, "env swapped to B"]] and page.evals == [[2.0, 0.75]]
    assert evals_of(RunView()) == []  # no evaluations: nothing drawn


def test_an_evaluation_without_greedy_episodes_is_drawn_at_its_sampled_mean() -> None:
    """Agent envs get no greedy episode during a run: the page draws the sampled mean, as the PNG does."""
    view = RunView()
    view.evals = [{"step": 0, "greedy_mean": None, "sampled_mean": 0.25}, {"step": 4, "greedy_mean": 0.5,
                                                                          "sampled_mean": 0.1},
                  {"step": 8, "greedy_mean": None, "sampled_mean": None}]
    assert evals_of(view) == [[0.0, 0.25], [4.0, 0.5]]
    assert evals_of(view, "#dc2626") == [[0.0, 0.25, "#dc2626"], [4.0, 0.5, "#dc2626"]]


def test_missing_values_are_sent_as_gaps_not_points() -> None:
    view = view_of(started(), step(1, loss=0.3), StepLogged(step=2, metrics={"reward": 0.5}), step(3, loss=0.2))
    msg = CurveFeed().changes(view)[0]
    assert msg["columns"]["loss"] == [0.3, None, 0.2] and msg["columns"]["kl"] == [None, None, None]


def test_a_click_on_the_reward_curve_selects_that_step(tmp_path: Path) -> None:
    dash = Dashboard(max_group_steps=2, run_log=str(tmp_path))
    log = RunLog(tmp_path)
    for event in (started(output_dir=str(tmp_path)), *[e for s in range(1, 6) for e in (group(s), step(s))]):
        log(event)
        dash(event)
    log.close()
    dash.flush()
    dash._live._on_msg(dash._curves, {"kind": "select", "step": 2}, [])  # what curves.js sends on a click
    assert dash.selected_step == 2 and "step 2 · group 0" in dash.groups_html
    dash._live._on_msg(dash._curves, {"kind": "select", "step": "x"}, [])  # a bad message changes nothing
    assert dash.selected_step == 2


def test_a_page_that_says_hello_gets_every_row() -> None:
    dash = Dashboard()
    sent: list[dict[str, Any]] = []
    for s in (1, 2, 3):
        dash(step(s))
    dash.flush()
    dash._curves.send = sent.append
    dash._live._on_msg(dash._curves, {"kind": "hello"}, [])
    assert sent[-1]["kind"] == "reset" and sent[-1]["x"] == [1, 2, 3]


def test_a_marked_step_shows_in_the_png() -> None:
    dash = Dashboard()
    dash(started())
    for s in range(1, 5):
        dash(step(s))
    before_png = dash.reward_png
    dash.view.add_marker(3, "env swapped: <AdditionEnv v2>")
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
    live = Dashboard(run_log=str(tmp_path))
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
    sent = live._curves.notes  # what the page shows under each panel (as text: curves.js never parses it as HTML)
    assert set(sent) >= {"loss", "zero_std"} and "<b>odd</b>" in sent["loss"][1]
    again = replay(str(tmp_path))
    assert again.curves_html == html and again.curves_sent["notes"] == sent


# ---- the PNG, for replays and frontends without widgets -------------------------------------------


def test_the_png_is_drawn_only_when_asked_and_offered_to_frontends_without_widgets(tmp_path: Path) -> None:
    empty = Dashboard()
    assert empty.reward_png == b"" and "image/png" not in empty._repr_mimebundle_()
    log = RunLog(tmp_path)
    for event in (started(output_dir=str(tmp_path)), group(1), step(1), step(2), RunFinished(status="completed")):
        log(event)
    log.close()
    again = replay(str(tmp_path))
    assert again._figure is None  # the replay's curves went to the page as points only
    bundle = again._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(PNG)
    assert again.reward_png is again.reward_png  # drawn once, reused while nothing changes


def test_a_static_replay_is_the_png_alone(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    for event in (started(output_dir=str(tmp_path)), group(1), step(1), step(2), RunFinished(status="completed")):
        log(event)
    log.close()
    picture = replay(str(tmp_path), static=True)
    data = picture.data  # an IPython Image: what nbconvert, GitHub and any frontend show
    assert data.startswith(PNG) and not hasattr(picture, "widget")


def test_the_page_code_ships_inside_the_package_with_its_licence() -> None:
    """No CDN: uPlot, its CSS and licence and our front end are package data (an offline notebook draws too)."""
    import tomllib

    from grpo_magic.dashboard.live import STATIC, _widget_class

    config = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["grpo_magic.dashboard"]
    shipped = {p.name for pattern in patterns for p in STATIC.parent.glob(pattern)}
    assert {"uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "curves.js", "curves.css"} <= shipped
    assert "MIT License" in (STATIC / "uPlot.LICENSE").read_text()
    widget = _widget_class()
    assert "uPlot" in widget._esm and "export default" in widget._esm and "http" not in widget._esm.split("*/", 1)[1]
