"""Regenerate docs/dashboard.png: the live dashboard of a short run, shot in JupyterLab by Chromium.

The route is the user's: JupyterLab serves a notebook that registers the letters env
(envs/letters.py) with ``%%grpo_env`` and starts ``%grpo_train ... --run`` on the offline ``tiny``
model; headless Chromium runs all cells, waits until the run is well under way and screenshots
the cell with its dashboard, then presses Stop. Needs Debian's chromium and the playwright
Python package (scripts/install.sh installs both); about a minute on two CPU cores.

    python scripts/screenshot_dashboard.py [--out docs/dashboard.png] [--max-steps 300] [--shot-step 80]
"""

from __future__ import annotations

import argparse
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


def letters_env_cell() -> str:
    """envs/letters.py as a ``%%grpo_env`` cell, the way a user would paste it."""
    source = (REPO / "envs" / "letters.py").read_text()
    body = source.split('"""', 2)[2].replace("from __future__ import annotations\n", "").strip()
    return "%%grpo_env LettersEnv\n" + body + "\n"


def train_line(max_steps: int) -> str:
    return (f"run = %grpo_train --env LettersEnv --model tiny --max-steps {max_steps} --batch-size 8 "
            "--rl-num-generations 8 --rl-max-new-tokens 16 --lr 5e-3 --rl-kl-coef 0 --seed 0 --run")


def shoot(out: Path, max_steps: int, shot_step: int, work: Path, timeout_s: float) -> None:
    from playwright.sync_api import expect, sync_playwright

    server = JupyterServer(work / "root", work / "state")
    notebook = "dashboard_demo.ipynb"
    write_notebook(server.root_dir / notebook, training_notebook_cells(letters_env_cell(), train_line(max_steps)))
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
                page.wait_for_function("svg => svg.getBoundingClientRect().width > 200",
                                       arg=dash.locator(".grpo-curves svg").first.element_handle(), timeout=30_000)
                page.wait_for_timeout(500)  # let the last widget update paint
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
                dash.get_by_role("button", name="Stop").click()
                expect(page.locator(".grpo-dashboard .grpo-status").first).to_contain_text(
                    "stopped", timeout=timeout_s * 1000)
            finally:
                context.close()
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--shot-step", type=int, default=80, help="take the screenshot once this step is shown")
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
