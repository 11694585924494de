"""Regenerate docs/dashboard.png: the live dashboard of a short run, shot in JupyterLab by Chromium.

The route is the user's: JupyterLab serves a notebook that registers the addition env
(envs/addition.py) and starts ``%grpo_train ... --run`` on the offline ``tiny-math`` model with the
lesson's recipe (notebooks/04_sft_then_grpo.ipynb: a run that learns, its reward rising); headless
Chromium runs all cells, waits until the run is well under way (or done) and screenshots the cell with
its dashboard (the curves drawn in the page by uPlot), then presses Stop if it still runs. Needs
Debian's chromium and the playwright Python package (scripts/install.sh installs both); a few
minutes on two CPU cores (tiny-math is built on first use, about a minute).

    python scripts/screenshot_dashboard.py [--out docs/dashboard.png] [--max-steps 60] [--shot-step 60]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from browser_support import (  # noqa: E402
    JupyterServer,
    launch_browser,
    missing_browser_tools,
    open_notebook,
    run_all_cells,
    training_notebook_cells,
    wait_for_step,
    write_notebook,
)

ENV_CELL = """import sys
sys.path.insert(0, {repo!r})  # envs/ (the example environments) sits at the repository root
import grpo_magic
from envs.addition import AdditionEnv
grpo_magic.register_env(AdditionEnv, "Addition")"""


def train_line(max_steps: int) -> str:
    """The lesson's recipe (bench/run.py TEACH): tiny-math learns to add within a minute of training."""
    return (f"run = %grpo_train --env Addition --model tiny-math --rl-num-generations 8 --batch-size 32 "
            f"--rl-max-new-tokens 8 --lr 5e-4 --rl-kl-coef 0 --seed 42 --max-steps {max_steps} "
            "--project-name grpo-run/addition --run")


def shoot(out: Path, max_steps: int, shot_step: int, work: Path, timeout_s: float) -> None:
    from playwright.sync_api import expect, sync_playwright

    server = JupyterServer(work / "root", work / "state")
    notebook = "dashboard_demo.ipynb"
    cells = training_notebook_cells(ENV_CELL.format(repo=str(REPO)), train_line(max_steps))
    write_notebook(server.root_dir / notebook, cells)
    server.start()
    try:
        with sync_playwright() as p:
            context = launch_browser(p, work / "chromium-profile", width=1480, height=2600)
            try:
                page = context.new_page()
                open_notebook(page, server.url("lab", notebook))
                page.keyboard.press("Control+b")  # hide the file browser: the notebook gets the width
                run_all_cells(page)
                dash = page.locator(".grpo-dashboard").first
                dash.wait_for(timeout=timeout_s * 1000)
                step = wait_for_step(page, shot_step, timeout_s)
                expect(dash.locator(".grpo-group").first).to_be_visible(timeout=30_000)
                chart = dash.locator(".grpo-chart").first
                expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]"), timeout=30_000)
                page.wait_for_timeout(1500)  # let the last widget update paint
                cell = page.locator(".jp-CodeCell").filter(has=page.locator(".grpo-dashboard")).first
                cell.scroll_into_view_if_needed()
                # The cell's input line and its dashboard; not what the run prints below it.
                top, bottom = cell.bounding_box(), dash.bounding_box()
                assert top is not None and bottom is not None
                clip = {"x": top["x"], "y": top["y"], "width": top["width"],
                        "height": bottom["y"] + bottom["height"] - top["y"]}
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out), clip=clip)
                print(f"wrote {out} at step {step} of {max_steps}")
                stop = dash.get_by_role("button", name="Stop")
                if stop.is_enabled():
                    stop.click()
                expect(page.locator(".grpo-dashboard .grpo-status").first).to_contain_text(
                    re.compile("stopped|completed"), timeout=timeout_s * 1000)
            finally:
                context.close()
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--shot-step", type=int, default=60, help="take the screenshot once this step is shown")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for each stage")
    parser.add_argument("--keep", type=Path, default=None, help="keep the notebook, run and logs in this folder")
    args = parser.parse_args(argv)
    reason = missing_browser_tools()
    if reason:
        print(f"screenshot_dashboard: {reason}", file=sys.stderr)
        return 2
    if not 1 <= args.shot_step <= args.max_steps:
        parser.error("--shot-step must be between 1 and --max-steps")
    t0 = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        shoot(args.out.resolve(), args.max_steps, args.shot_step, args.keep.resolve(), args.timeout)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-dashboard-shot-") as work:
            shoot(args.out.resolve(), args.max_steps, args.shot_step, Path(work), args.timeout)
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
