"""Hot swap on a real background run: ``%%grpo_env NAME --swap`` and ``run.swap_env``.

The groups scored after the swap step come from the new class, the ones before from the old; the
swap is an ``EnvSwapped`` event in the run log, a marker in the dashboard (rebuilt from the log)
and a line of the terminal progress; a refused swap leaves the run training with its env.
"""

from __future__ import annotations

import io
import time

import pytest
from IPython.core.error import UsageError

import grpo_magic
from grpo_magic import read_run_log
from grpo_magic.dashboard.html import info_html
from grpo_magic.events import EnvSwapped, GroupScored
from grpo_magic.frontends.progress import TerminalProgress
from tests.run_support import wait_for_step

CELL = '''
import time
from datasets import Dataset

class SwapEnv:
    def __init__(self, n=16):
        self.n = n

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Say something: "] * self.n, "case_idx": list(range(self.n))})

    def score_episode(self, model, tokenizer, completion, case_idx):
        time.sleep(0.02)
        return SCORE
'''


def _wait(run, step: int) -> None:
    wait_for_step(run, step, poll=0.05)
    assert run.step >= step and not run.done, run.reason


def test_swap_scores_the_next_steps_with_the_new_class_and_a_refused_one_changes_nothing(shell, monkeypatch):
    shown: list = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    shell.run_cell_magic("grpo_env", '--config {"n": 8}', CELL.replace("SCORE", "0.25"))
    run = shell.run_line_magic("grpo_train", "--env SwapEnv --model tiny --max-steps 400 --batch-size 8 "
                                             "--rl-num-generations 4 --rl-max-new-tokens 4 --run")
    try:
        _wait(run, 2)
        # without --swap: registered for the next run, and the summary says the running one keeps its class
        shell.run_cell_magic("grpo_env", "", CELL.replace("SCORE", "0.5"))
        assert "keeps the class it started with" in shown[-1]["text/html"] and "--swap" in shown[-1]["text/html"]
        # a refused swap: one sentence, and the run goes on with its env
        bad = CELL.replace("SCORE", "0.9").replace("def build_dataset(self, tokenizer):",
                                                   "def build_dataset(self, tokenizer):\n        raise KeyError('db')")
        with pytest.raises(UsageError, match=r"^Swap refused, the run goes on with its env: .*KeyError"):
            shell.run_cell_magic("grpo_env", "SwapEnv --swap", bad)
        step = run.step
        _wait(run, step + 1)
        assert run.swaps == []
        spec = shell.run_cell_magic("grpo_env", "SwapEnv --swap", CELL.replace("SCORE", "0.75"))
        assert spec.name == "SwapEnv" and "scores with this class from its next step on" in shown[-1]["text/html"]
        deadline = time.monotonic() + 300
        while not run.swaps and time.monotonic() < deadline and not run.done:
            time.sleep(0.05)
        swapped_at = run.swaps[0]["step"]
        _wait(run, swapped_at + 1)
    finally:
        run.stop()
        run.wait(timeout=300)
    assert run.status == "stopped"
    events = list(read_run_log(run.output_dir))
    swaps = [e for e in events if isinstance(e, EnvSwapped)]
    assert len(swaps) == 1 and swaps[0].step == swapped_at and swaps[0].env_name == "SwapEnv"
    assert swaps[0].class_name == "SwapEnv" and swaps[0].config == {"n": 8}  # the running config, as no --config
    assert len(swaps[0].source_hash) == 12 and swaps[0].previous_hash not in ("", swaps[0].source_hash)
    groups = [e for e in events if isinstance(e, GroupScored)]
    before = {s for g in groups if g.step < swapped_at for s in g.scores}
    after = {s for g in groups if g.step >= swapped_at for s in g.scores}
    assert before == {0.25} and after == {0.75}  # the 0.5 class never scored: registered, not swapped in
    assert max(g.step for g in groups) > swapped_at
    # the dashboard rebuilt from the log marks it; the terminal progress prints it
    dash = grpo_magic.replay(run.output_dir)
    assert [s.step for s in dash.view.swaps] == [swapped_at] and "env swapped to" in info_html(dash.view)
    out = io.StringIO()
    progress = TerminalProgress(stream=out)
    for event in events:
        progress(event)
    assert f"grpo: env swapped: step {swapped_at} on is scored by SwapEnv" in out.getvalue()


class Plain:
    """A module-less env class, for the API."""

    def __init__(self, value=0.25):
        self.value = value

    def build_dataset(self, tokenizer):
        from datasets import Dataset

        return Dataset.from_dict({"prompt": ["Say something: "] * 8})

    def score_episode(self, model, tokenizer, completion):
        time.sleep(0.02)
        return self.value


def test_swap_env_from_python_with_an_instance_and_a_config(in_tmp):
    from grpo_magic import GRPOParams, train

    run = train(GRPOParams(model="tiny", max_steps=400, batch_size=8, rl_num_generations=4, rl_max_new_tokens=4),
                Plain, display=False, blocking=False)
    try:
        _wait(run, 1)
        run.swap_env(Plain, config={"value": 0.5})
        deadline = time.monotonic() + 300
        while not run.swaps and time.monotonic() < deadline:
            time.sleep(0.05)
        first = run.swaps[0]["step"]
        run.swap_env(Plain(0.875))
        while len(run.swaps) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = run.swaps[1]["step"]
        _wait(run, second)
    finally:
        run.stop()
        run.wait(timeout=300)
    groups = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    for g in groups:
        expected = 0.25 if g.step < first else 0.5 if g.step < second else 0.875
        assert set(g.scores) == {expected}, g.step
    with pytest.raises(grpo_magic.GRPOMagicError, match="Swap refused: the run is stopped"):
        run.swap_env(Plain)
