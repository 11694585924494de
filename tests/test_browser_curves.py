"""The curves drawn in the page (uPlot in an anywidget widget), in JupyterLab and Notebook 7.

A real 120-step run of ``tiny`` in the background (``%grpo_train --run``): the number of points the
page's chart holds, read from the page, follows the logged steps of the run log (within one render
interval, plus the way to the browser) and equals them at the end; hovering shows values, dragging
zooms and a double click resets, the smoothing slider changes the drawn line, a click on the reward
curve opens that step's groups, and a replay of the run log draws the same points. A 20,000-step run
of fast fake events keeps the page's draw time flat; ``%grpo_compare`` overlays three runs and says
which setting differs.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from browser_support import (
    JupyterServer,
    open_notebook,
    page_of_a_test,
    start_cells,
    training_notebook_cells,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

KERNEL_AND_FIRST_STEP_S = 150
# How far behind the run log the page may be: one render interval (0.25 s) and the way from the
# kernel to the page on two busy cores (widget messages, the page's own drawing).
BEHIND_S = 0.25 + 1.5

FAST_ENV_CELL = '''%%grpo_env FastLetters
from datasets import Dataset

class FastLetters:
    """Share of 'a' in the reply: no waiting, so steps take what the tiny model takes."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Write the letter a {i} times: " for i in range(32)]})

    def score_episode(self, model, tokenizer, completion):
        return completion.count("a") / max(1, len(completion))
'''

CHART = ".grpo-dashboard .grpo-chart"
# What the page holds: the chart's rows, read from the widget's own state (curves.js keeps it on the element).
HELD = "el => el._grpo.x.length"
UPLOT = "(el, key) => el.querySelector(`.grpo-panel[data-panel='${key}'] .grpo-plot`)._uplot"




def logged_steps(run_log: Path) -> list[tuple[float, int]]:
    """(time, step) of each distinct logged step in a run log (TRL may log the last step twice)."""
    out: list[tuple[float, int]] = []
    seen: set[int] = set()
    try:
        lines = run_log.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if event.get("type") == "step_logged" and event["step"] not in seen:
            seen.add(event["step"])
            out.append((event["time"], event["step"]))
    return out


def uplot(page: Any, chart: Any, key: str, expr: str) -> Any:
    return chart.evaluate(f"(el) => {{ const u = ({UPLOT})(el, {json.dumps(key)}); return {expr}; }}")


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_the_chart_holds_every_logged_step_and_answers_the_mouse(
    ui: str, jupyter: JupyterServer, browser: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    name = f"curves_{ui}.ipynb"
    project = f"run-curves-{ui}"
    steps = 120  # enough for the page to fall behind if it would, and for a mid-run hover
    train_line = (
        f"run = %grpo_train --env FastLetters --model tiny --max-steps {steps} --batch-size 8 "
        f"--rl-num-generations 4 --rl-max-new-tokens 8 --project-name {project} --run"
    )
    replay_cell = f"run.wait()\nimport grpo_magic\ngrpo_magic.replay({project!r})"
    write_notebook(jupyter.root_dir / name, [*training_notebook_cells(FAST_ENV_CELL, train_line), replay_cell])
    run_log = jupyter.root_dir / project / "events.jsonl"
    with page_of_a_test(browser.new_page(), jupyter, tmp_path, f"curves-{ui}-failure.png") as page:
        open_notebook(page, jupyter.url(ui, name))
        start_cells(page)
        chart = page.locator(CHART).first
        chart.wait_for(timeout=KERNEL_AND_FIRST_STEP_S * 1000)
        status = page.locator(".grpo-dashboard .grpo-status").first

        # During the run: what the page holds, against what the run log says was logged by then.
        samples: list[tuple[int, int, int]] = []  # (held, logged BEHIND_S before, logged now)
        deadline = time.monotonic() + KERNEL_AND_FIRST_STEP_S + 240
        while time.monotonic() < deadline:
            now = time.time()
            held = chart.evaluate(HELD)
            logged = logged_steps(run_log)
            if logged:
                samples.append((held, sum(1 for t, _ in logged if t <= now - BEHIND_S), len(logged)))
            if re.search("completed|failed|stopped", status.inner_text()):
                break
            page.wait_for_timeout(200)
        expect(status).to_have_text("completed", timeout=120_000)
        during = [s for s in samples if 0 < s[2] < steps]
        assert len(during) >= 10, samples
        late = [s for s in during if not s[1] <= s[0] <= s[2]]
        assert not late, f"the page held fewer points than were logged {BEHIND_S} s before: {late[:10]}"
        final = logged_steps(run_log)
        expect(chart).to_have_attribute("data-points", str(len(final)), timeout=30_000)
        assert chart.evaluate(HELD) == len(final) == steps
        assert chart.evaluate("el => el._grpo.x") == [s for _, s in final]

        # tiny never learned to stop: the clipped share is near 1, and its note says what that means.
        note = chart.locator(".grpo-note[data-panel='length']")
        expect(note).to_contain_text("completions cut off")
        note.locator("summary").click()
        expect(note).to_contain_text("Raise rl_max_new_tokens")

        # Hover: the legend shows the step and each series' value under the cursor.
        box = chart.locator(".grpo-panel[data-panel='reward'] .u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        legend = chart.locator(".grpo-panel[data-panel='reward'] .u-legend")
        values = legend.locator(".u-series .u-value")
        expect(values.first).to_have_text(re.compile(r"^\d+$"))  # the step under the cursor, mid-run
        assert 0.3 * steps <= int(values.first.inner_text()) <= 0.7 * steps, legend.inner_text()
        assert re.fullmatch(r"-?\d[\d.e+-]*k?", values.nth(1).inner_text()), legend.inner_text()

        # Drag to zoom, double click to reset.
        full = uplot(page, chart, "reward", "[u.scales.x.min, u.scales.x.max]")
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5, steps=8)
        page.mouse.up()
        zoomed = uplot(page, chart, "reward", "[u.scales.x.min, u.scales.x.max]")
        assert full[0] <= zoomed[0] < zoomed[1] <= full[1] and zoomed[1] - zoomed[0] < 0.5 * (full[1] - full[0])
        page.mouse.dblclick(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        page.wait_for_timeout(300)
        assert uplot(page, chart, "reward", "[u.scales.x.min, u.scales.x.max]") == full

        # The smoothing slider changes the drawn line (the smoothed copy of the mean reward).
        drawn = "u.data[2].slice()"
        before = uplot(page, chart, "reward", drawn)
        chart.locator("input.grpo-smoothing").evaluate(
            "el => { el.value = '0.95'; el.dispatchEvent(new Event('input', {bubbles: true})); }"
        )
        page.wait_for_timeout(300)
        after = uplot(page, chart, "reward", drawn)
        assert len(after) == len(before) == steps and after != before
        raw = uplot(page, chart, "reward", "u.data[1].slice()")
        spread = statistics.pstdev(v for v in after if v is not None)
        assert spread < statistics.pstdev(v for v in raw if v is not None)  # smoother than the raw points

        # A click on the reward curve opens that step's groups below (read back from the run log).
        page.mouse.click(box["x"] + box["width"] * 0.25, box["y"] + box["height"] * 0.5)
        clicked = uplot(page, chart, "reward", "u.data[0][u.cursor.idx]")
        assert 1 <= clicked < steps
        groups = page.locator(".grpo-dashboard .grpo-groups-view").first
        expect(groups).to_contain_text(f"step {clicked} · group 0", timeout=30_000)

        # The replay (the last cell) draws the same points from the run log.
        charts = page.locator(".grpo-chart")
        expect(charts).to_have_count(2, timeout=60_000)
        replayed = charts.nth(1)
        expect(replayed).to_have_attribute("data-points", str(steps), timeout=30_000)
        for column in ("x", "cols.reward", "cols.loss"):
            assert replayed.evaluate(f"el => el._grpo.{column}") == chart.evaluate(f"el => el._grpo.{column}"), column
        page.screenshot(path=str(tmp_path / f"curves-{ui}.png"))
        lag = max(s[2] - s[0] for s in during)
        print(f"{ui}: {len(during)} samples during the run, the page at most {lag} steps behind the run log")


FAKE_RUN_CELL = '''import threading, time
from IPython.display import display
from grpo_magic.dashboard import Dashboard
from grpo_magic.events import RunFinished, RunStarted, StatusChanged, StepLogged

N = {steps}
dash = Dashboard()
display(dash)

def fake_run():
    """{steps} logged steps of every curve, about 2 ms apart: fast fake steps, through the real subscriber."""
    dash(RunStarted(params={{}}, env_name="Fake", model="tiny", output_dir="", max_steps=N))
    dash(StatusChanged(status="training"))
    for s in range(1, N + 1):
        dash(StepLogged(step=s, max_steps=N, episodes=8, episode_errors=0, metrics={{
            "reward": (s % 97) / 97, "reward_std": 0.1, "loss": 0.01 * ((s % 13) - 6), "kl": 1e-4 * s,
            "completions/mean_length": 8.0, "completions/clipped_ratio": 0.5, "frac_reward_zero_std": 0.2}}))
        if s % 8 == 0:
            time.sleep(0.01)
    dash(RunFinished(status="completed", steps=N))

worker = threading.Thread(target=fake_run)
worker.start()
'''


def test_twenty_thousand_steps_keep_the_page_drawing_in_flat_time(
    jupyter: JupyterServer, browser: Any, tmp_path: Path
) -> None:
    """The draw time of an update, measured in the page (curves.js times each batch of uPlot redraws),
    does not grow from 1,000 to 20,000 steps held: the ratio of medians stays under 3 (it is ~1 when flat),
    because uPlot gets a bounded number of real points (M4 per pixel column); zoom and reset still work."""
    from playwright.sync_api import expect

    steps = 20_000
    name = "curves_20k.ipynb"
    write_notebook(jupyter.root_dir / name, ["%load_ext grpo_magic", FAKE_RUN_CELL.format(steps=steps)])
    with page_of_a_test(browser.new_page(), jupyter, tmp_path, "curves-20k-failure.png") as page:
        open_notebook(page, jupyter.url("lab", name))
        start_cells(page)
        chart = page.locator(".grpo-dashboard .grpo-chart").first
        chart.wait_for(timeout=KERNEL_AND_FIRST_STEP_S * 1000)
        expect(chart).to_have_attribute("data-points", str(steps), timeout=300_000)
        times = chart.evaluate("el => el._grpo.drawTimes")
        early = [ms for rows, ms in times if 1_000 <= rows <= 3_000]
        late = [ms for rows, ms in times if 18_000 <= rows <= 20_000]
        assert len(early) >= 5 and len(late) >= 5, times
        ratio = statistics.median(late) / statistics.median(early)
        print(
            f"draw time per update: {statistics.median(early):.1f} ms at 1-3k steps, "
            f"{statistics.median(late):.1f} ms at 18-20k ({len(times)} updates): ratio {ratio:.2f}"
        )
        assert ratio < 3, (early, late)
        # Why it stays flat: uPlot is handed a few points per pixel column (M4), not 20,000, and each is a
        # real step; the newest is among them.
        width = chart.locator(".grpo-panel[data-panel='reward']").evaluate("el => el.clientWidth")
        handed = uplot(page, chart, "reward", "u.data[0].slice()")
        assert len(handed) <= 4 * max(100, width) < steps and handed[-1] == steps, (len(handed), width)
        held = set(chart.evaluate("el => el._grpo.x"))
        assert set(handed) <= held and handed == sorted(handed)
        # still answering: a hover reads a value at once
        box = chart.locator(".grpo-panel[data-panel='reward'] .u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] * 0.5)
        expect(chart.locator(".grpo-panel[data-panel='reward'] .u-legend .u-series .u-value").first).to_have_text(
            re.compile(r"^1\d{4}$")
        )
        # A zoom takes the zoomed range's own points (finer than before); a double click goes back to all.
        full = uplot(page, chart, "reward", "[u.scales.x.min, u.scales.x.max]")
        page.mouse.move(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.5, steps=8)
        page.mouse.up()
        page.wait_for_timeout(500)
        lo, hi = uplot(page, chart, "reward", "[u.scales.x.min, u.scales.x.max]")
        assert full[0] < lo < hi < full[1] and hi - lo < 0.2 * (full[1] - full[0]), (lo, hi)
        zoomed = uplot(page, chart, "reward", "u.data[0].slice()")
        inside = [x for x in handed if lo <= x <= hi]
        assert len([x for x in zoomed if lo <= x <= hi]) > 2 * len(inside), (len(zoomed), len(inside))
        page.mouse.dblclick(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        page.wait_for_timeout(500)
        assert uplot(page, chart, "reward", "[u.scales.x.min, u.scales.x.max]") == full
        assert uplot(page, chart, "reward", "u.data[0].length") == len(handed)


COMPARE_CELL = """from grpo_magic import GRPOParams
from grpo_magic.events import EvalScored, RunFinished, RunLog, RunStarted, StepLogged

for i, lr in enumerate((1e-5, 3e-5, 1e-4)):
    folder = f"cmp/lr-{{i}}"
    log = RunLog(folder)
    params = GRPOParams(model="tiny", lr=lr, max_steps=30, project_name=folder).to_dict()
    log(RunStarted(params=params, env_name="Letters", model="tiny", output_dir=folder, max_steps=30))
    log(EvalScored(step=0, prompts=4, greedy_mean=0.1 * (i + 1), baseline=True))
    for s in range(1, 31):
        log(StepLogged(step=s, metrics={{"reward": min(1.0, 0.01 * s * (i + 1)), "loss": 0.1}}, max_steps=30))
    log(EvalScored(step=30, prompts=4, greedy_mean=0.3 * (i + 1)))
    log(RunFinished(status="completed", steps=30))
    log.close()
"""


def test_grpo_compare_shows_three_named_reward_curves_and_says_lr_differs(
    jupyter: JupyterServer, browser: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    name = "compare.ipynb"
    write_notebook(
        jupyter.root_dir / name,
        ["%load_ext grpo_magic", COMPARE_CELL.format(), "%grpo_compare cmp/lr-0 cmp/lr-1 cmp/lr-2"],
    )
    with page_of_a_test(browser.new_page(), jupyter, tmp_path, "compare-failure.png") as page:
        open_notebook(page, jupyter.url("notebook", name))
        start_cells(page)
        chart = page.locator(".grpo-compare .grpo-chart").first
        chart.wait_for(timeout=KERNEL_AND_FIRST_STEP_S * 1000)
        expect(chart.locator(".grpo-caption")).to_have_text("lr differs between these runs", timeout=30_000)
        expect(chart).to_have_attribute("data-points", "30", timeout=30_000)
        legend = chart.locator(".grpo-panel[data-panel='reward'] .u-legend")
        for label in ("lr-0 (lr=1e-05)", "lr-1 (lr=3e-05)", "lr-2 (lr=0.0001)"):
            expect(legend).to_contain_text(label)
        drawn = uplot(page, chart, "reward", "[u.data[1][29], u.data[3][29], u.data[5][29]]")
        assert drawn == pytest.approx([0.3, 0.6, 0.9])  # three curves, each its run's
        # each run's held-out evaluations, with its own baseline line, on the reward panel
        expect(chart).to_have_attribute("data-eval-baselines", "3", timeout=30_000)
        chart.screenshot(path=str(tmp_path / "compare.png"))


ALARM_CELL = '''from IPython.display import display
from grpo_magic.dashboard import Dashboard
from grpo_magic.events import AlarmRaised, RunFinished, RunStarted, StatusChanged, StepLogged

dash = Dashboard()
display(dash)
dash(RunStarted(params={"task_metrics": ["answered"]}, env_name="Quiz", model="tiny", output_dir="", max_steps=20))
dash(StatusChanged(status="training"))
for s in range(1, 21):
    dash(StepLogged(step=s, max_steps=20, episodes=8, episode_errors=0,
                    metrics={"reward": 0.05 + 0.03 * s, "reward_std": 0.1, "components/answered": 0.0}))
    if s == 12:
        dash(AlarmRaised(step=12, kind="divergence", message="The reward rose while 'answered' did not.",
                         evidence={"steps": list(range(1, 13)), "reward": [0.05 + 0.03 * i for i in range(1, 13)],
                                   "tasks": {"answered": [0.0] * 12},
                                   "examples": [{"prompt": "What do bees make?", "completion": "<b>aaaa</b>",
                                                 "score": 0.9, "components": {"answered": 0.0}}]}))
dash(RunFinished(status="completed", steps=20))
'''


def test_an_alarm_is_a_red_line_on_the_page_and_a_card_above_the_curves(
    jupyter: JupyterServer, browser: Any, tmp_path: Path
) -> None:
    """Fed events (an AlarmRaised among them): the page draws the alarm's marker (curves.js counts the alarm
    lines it drew on the reward panel), the task metric beside the reward, and the card shows the completion as
    text, not markup."""
    from playwright.sync_api import expect

    name = "curves_alarm.ipynb"
    write_notebook(jupyter.root_dir / name, ["%load_ext grpo_magic", ALARM_CELL])
    with page_of_a_test(browser.new_page(), jupyter, tmp_path, "curves-alarm-failure.png") as page:
        open_notebook(page, jupyter.url("lab", name))
        start_cells(page)
        chart = page.locator(CHART).first
        chart.wait_for(timeout=KERNEL_AND_FIRST_STEP_S * 1000)
        expect(chart).to_have_attribute("data-points", "20", timeout=60_000)
        expect(chart).to_have_attribute("data-alarms", "1", timeout=30_000)
        assert chart.evaluate("el => el._grpo.markers") == [[12, "alarm: divergence", "alarm"]]
        series = uplot(page, chart, "reward", "u.series.map(s => s.label)")
        assert "answered" in " ".join(str(s) for s in series), series
        card = page.locator(".grpo-dashboard .grpo-alarms .grpo-alarm").first
        expect(card).to_contain_text("divergence")
        expect(card).to_contain_text("at step 12")
        expect(card.locator(".grpo-alarm-example pre")).to_have_text("<b>aaaa</b>")  # shown as text
        assert card.locator(".grpo-sparkline").count() == 2
        page.screenshot(path=str(tmp_path / "curves-alarm.png"))
