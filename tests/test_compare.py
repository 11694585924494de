"""Runs side by side: ``grpo_magic.compare`` and ``%grpo_compare`` overlay runs' curves from their run logs.

The run logs are written event by event as a run writes them (``RunLog``), with the parameters of
real ``GRPOParams`` that differ in ``lr`` only; the page's side is in tests/test_browser_curves.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("anywidget")

from IPython.core.error import UsageError  # noqa: E402

import grpo_magic  # noqa: E402
from grpo_magic import GRPOParams  # noqa: E402
from grpo_magic.errors import GRPOMagicError  # noqa: E402
from grpo_magic.events import EvalScored, RunFinished, RunLog, RunStarted, StepLogged  # noqa: E402

LRS = (1e-5, 3e-5, 1e-4)


def write_runs(root: Path, steps: int = 20) -> list[Path]:
    """Three run logs whose settings differ in lr only; run i learns at i+1 times the pace."""
    folders = []
    for i, lr in enumerate(LRS):
        folder = root / f"lr-{i}"
        params = GRPOParams(model="tiny", lr=lr, max_steps=steps, project_name=str(folder)).to_dict()
        log = RunLog(folder)
        log(RunStarted(params=params, env_name="Letters", model="tiny", output_dir=str(folder), max_steps=steps))
        log(EvalScored(step=0, prompts=4, greedy_mean=0.25, baseline=True))  # the held-out baseline
        for s in range(1, steps + 1 - i):  # the runs end at different steps
            log(StepLogged(step=s, metrics={"reward": min(1.0, 0.01 * s * (i + 1)), "loss": 0.1}, max_steps=steps))
            if s == 10:
                log(EvalScored(step=s, prompts=4, greedy_mean=0.25 + 0.25 * i))
        log(RunFinished(status="completed", steps=steps - i))
        log.close()
        folders.append(folder)
    return folders


def test_three_runs_are_named_by_folder_and_the_setting_that_differs(tmp_path: Path) -> None:
    folders = write_runs(tmp_path)
    comparison = grpo_magic.compare(*folders)
    assert comparison.differs == ["lr"]
    assert comparison.names == ["lr-0 (lr=1e-05)", "lr-1 (lr=3e-05)", "lr-2 (lr=0.0001)"]
    assert comparison.caption == "lr differs between these runs"
    reward = next(p for p in comparison.widget.spec if p["key"] == "reward")
    assert [s["label"] for s in reward["series"]] == comparison.names
    rows = comparison.rows()
    assert rows["x"] == list(range(1, 21))  # the union of the runs' steps
    third = rows["columns"]["run2/reward"]
    assert third[:3] == [0.03, 0.06, 0.09] and third[-2:] == [None, None]  # it ended at step 18
    # each run's held-out evaluations go to the reward panel in its line's color (the first is its baseline)
    colors = [s["color"] for s in reward["series"]]
    assert rows["evals"] == [
        p for i in range(3) for p in ([0.0, 0.25, colors[i]], [10.0, 0.25 + 0.25 * i, colors[i]])]
    assert "lr differs" in repr(comparison)
    bundle, _ = comparison._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "lr differs" in bundle["text/plain"]


def test_the_magic_compares_and_says_what_is_wrong(shell: Any, tmp_path: Path) -> None:
    folders = write_runs(tmp_path)
    comparison = shell.run_line_magic("grpo_compare", " ".join(str(f) for f in folders))
    assert comparison.differs == ["lr"] and len(comparison.names) == 3
    with pytest.raises(UsageError, match="Name the runs to compare"):
        shell.run_line_magic("grpo_compare", "")
    with pytest.raises(UsageError, match=r"nowhere has no run log \(events.jsonl\); pass the output folder"):
        shell.run_line_magic("grpo_compare", f"{folders[0]} nowhere")
    with pytest.raises(GRPOMagicError, match="Name the runs"):
        grpo_magic.compare()


def test_runs_with_the_same_settings_are_named_by_folder(tmp_path: Path) -> None:
    folders = write_runs(tmp_path)
    same = grpo_magic.compare(folders[0], folders[0])
    assert same.differs == [] and same.names == ["lr-0", "lr-0"] and "same settings" in same.caption
