"""The live dashboard in a real browser: JupyterLab and Notebook 7 in headless Chromium.

A notebook registers a slow env and starts a background run with ``%grpo_train --run``; the page
must show the step counter advancing, scored groups and the curves while the cell is done
and the kernel idle (widget messages from the training thread reach the browser live), and the
dashboard's Stop button must end the run as ``stopped`` with its weights saved (the curves of a fast
run, in depth: tests/test_browser_curves.py).
Screenshots of the dashboard mid-run and at the end are kept in the test's tmp folder.
"""

from __future__ import annotations

import re
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
    wait_for_step,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

SLOW_ENV_CELL = '''%%grpo_env SlowLetters
import time
from datasets import Dataset

class SlowLetters:
    """Share of 'a' in the reply; each episode sleeps 0.2 s so that the run lasts."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Write the letter a {i} times: " for i in range(32)]})

    def score_episode(self, model, tokenizer, completion):
        time.sleep(0.2)
        return completion.count("a") / max(1, len(completion))
'''

KERNEL_AND_FIRST_STEP_S = 150  # kernel start, torch import, model load and TRL's first step on 2 busy cores
NEXT_STEP_S = 60
STOP_S = 90




@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_live_dashboard_and_stop_button(ui: str, jupyter: JupyterServer, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    name = f"train_{ui}.ipynb"
    project = f"run-{ui}"
    train_line = (f"run = %grpo_train --env SlowLetters --model tiny --max-steps 200 --batch-size 4 "
                  f"--rl-max-new-tokens 8 --project-name {project} --run")
    write_notebook(jupyter.root_dir / name, training_notebook_cells(SLOW_ENV_CELL, train_line))

    t0 = time.monotonic()
    timings: dict[str, float] = {}
    with page_of_a_test(browser.new_page(), jupyter, tmp_path, f"page-{ui}-failure.png") as page:
        open_notebook(page, jupyter.url(ui, name))
        start_cells(page)
        dash = page.locator(".grpo-dashboard").first
        dash.wait_for(timeout=KERNEL_AND_FIRST_STEP_S * 1000)
        timings["dashboard shown"] = time.monotonic() - t0

        # The step counter advances while the cell is finished: updates come from the training thread.
        first = wait_for_step(page, 1, KERNEL_AND_FIRST_STEP_S)
        timings["first step"] = time.monotonic() - t0
        second = wait_for_step(page, first + 1, NEXT_STEP_S)
        assert second > first
        expect(page.locator(".grpo-dashboard .grpo-status").first).to_have_text(re.compile("training"))

        # A group of completions with their scores and advantages.
        card = dash.locator(".grpo-group").first
        expect(card).to_contain_text(re.compile(r"step \d+ · group 0 · 4 completions"), timeout=30_000)
        expect(card).to_contain_text(re.compile(r"score \d\.\d\d"))
        expect(card).to_contain_text(re.compile(r"A [+-]\d\.\d\d"))
        expect(card).to_contain_text("Write the letter a")

        # The curves: drawn in the page by uPlot (tests/test_browser_curves.py tests them in depth).
        plot = dash.locator(".grpo-chart .grpo-panel[data-panel='reward'] canvas")
        expect(plot).to_be_visible(timeout=30_000)
        page.wait_for_function("c => c.getBoundingClientRect().width > 200", arg=plot.element_handle(),
                               timeout=30_000)
        dash.screenshot(path=str(tmp_path / f"dashboard-{ui}-mid-run.png"))
        page.screenshot(path=str(tmp_path / f"page-{ui}-mid-run.png"))

        # Stop, found by its text: the run finishes its step, saves and ends as stopped.
        stop = dash.get_by_role("button", name="Stop")
        expect(stop).to_be_enabled()
        stop.click()
        expect(page.locator(".grpo-dashboard .grpo-status").first).to_contain_text("stopped", timeout=STOP_S * 1000)
        timings["stopped"] = time.monotonic() - t0
        expect(stop).to_be_disabled()
        expect(dash.locator(".grpo-info")).to_contain_text("saved")
        dash.screenshot(path=str(tmp_path / f"dashboard-{ui}-stopped.png"))
        output_dir = jupyter.root_dir / project
        assert (output_dir / "model.safetensors").exists()
        assert '"status": "stopped"' in (output_dir / "events.jsonl").read_text().splitlines()[-1]
        print(f"{ui}: " + ", ".join(f"{k} at {v:.0f} s" for k, v in timings.items()) + f"; screenshots in {tmp_path}")
