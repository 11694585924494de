"""Every bad input to rescoring and hot swap (``tests/bad_inputs.py``, ``ITERATION_ROWS``) is one sentence.

As in ``tests/test_bad_inputs.py``: the answer is one line that names the problem and the fix, a
``GRPOMagicError`` from the API and a ``UsageError`` from the magics, and nothing slow runs first
(no model or tokenizer loads for a rescore, no model for a swap). A refused swap leaves the run
that is training untouched: it goes on, with its env, and no ``EnvSwapped`` is logged.
"""

from __future__ import annotations

import time

import pytest
from IPython.core.error import UsageError

import grpo_magic
from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, register_env, train
from grpo_magic import models as models_module
from grpo_magic.training import run as run_module
from tests.bad_inputs import ITERATION_ROWS, IterationInput
from tests.run_support import SlowLettersEnv, wait_for_step
from tests.test_bad_inputs import FIX_WORDS, _has

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)
CASES = [pytest.param(row, surface, id=f"{row.id}-{surface}") for row in ITERATION_ROWS for surface in row.surfaces]


class TrainEnv(SlowLettersEnv):
    """The env of the run that trains while the swap rows are tried: slow enough to be caught mid-run."""

    delay = 0.03


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = train(GRPOParams(**FAST, max_steps=2, project_name=str(tmp_path_factory.mktemp("done") / "run")),
                LettersEnv(), display=False)
    assert run.status == "completed"
    return run


@pytest.fixture(scope="module")
def training_run(tmp_path_factory, finished_run):
    run = train(GRPOParams(**FAST, max_steps=2000, project_name=str(tmp_path_factory.mktemp("live") / "run")),
                TrainEnv, display=False, blocking=False)
    wait_for_step(run, 1)
    assert run.status == "running" and not run.done, run.reason
    yield run
    run.stop()
    run.wait(timeout=300)


def _env_class(source: str) -> type:
    namespace: dict = {}
    exec(compile(source, "<row env>", "exec"), namespace)  # noqa: S102 - the catalogue's own source
    return namespace["Env"]


def _answer(row: IterationInput, surface: str, request, tmp, monkeypatch) -> str:
    if surface.startswith("rescore"):
        target = {"run": str(request.getfixturevalue("finished_run").output_dir), "empty": str(tmp),
                  "missing": str(tmp / "no-such-run"), "none": None}[row.target]
        if row.target == "none":
            monkeypatch.setattr(run_module, "_LAST", None)
        register_env(_env_class(row.env), "Env")
        env = row.env_name or "Env"
        for name in ("load_model", "load_tokenizer"):  # nothing slow before the answer
            monkeypatch.setattr(models_module, name, lambda *a, **k: pytest.fail("loaded before the answer"))
        if surface == "rescore-api":
            with pytest.raises(GRPOMagicError) as info:
                grpo_magic.rescore(target, env, steps=row.steps)
            return str(info.value)
        shell = request.getfixturevalue("shell")
        line = " ".join([target or "", f"--env {env}", f"--steps {row.steps}" if row.steps else ""])
        with pytest.raises(UsageError) as info:
            shell.run_line_magic("grpo_rescore", line)
        return str(info.value)
    run = request.getfixturevalue("training_run") if row.training else request.getfixturevalue("finished_run")
    if not row.training:
        monkeypatch.setattr(run_module, "_ACTIVE", None)
    monkeypatch.setattr(models_module, "load_model", lambda *a, **k: pytest.fail("a model loaded before the answer"))
    if surface == "swap-api":
        with pytest.raises(GRPOMagicError) as info:
            run.swap_env(_env_class(row.env))
        return str(info.value)
    shell = request.getfixturevalue("shell")
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("grpo_env", f"{row.swap_name or 'TrainEnv'} --swap", row.env)
    assert not grpo_magic.registered_envs()  # a refused cell registers nothing
    return str(info.value)


@pytest.mark.parametrize(("row", "surface"), CASES)
def test_every_bad_iteration_input_is_one_sentence_and_a_refused_swap_leaves_the_run_alone(
    row: IterationInput, surface: str, request, in_tmp, monkeypatch
):
    message = _answer(row, surface, request, in_tmp, monkeypatch)
    print(f"{row.id} [{surface}]: {message}")
    assert "\n" not in message and "Traceback" not in message, message
    assert message.rstrip().endswith((".", ")")), message
    assert FIX_WORDS.search(message), f"no fix in: {message}"
    missing = [w for w in row.words if not _has(message, w)]
    assert not missing, f"{missing} not in: {message}"
    if surface.startswith("swap") and row.training:
        run = request.getfixturevalue("training_run")
        step = run.step
        deadline = time.monotonic() + 120
        while run.step == step and time.monotonic() < deadline:  # it goes on training
            time.sleep(0.05)
        assert run.step > step and not run.done and run.swaps == []


def test_the_iteration_catalogue_covers_the_issue_s_bad_inputs():
    ids = " ".join(row.id for row in ITERATION_ROWS)
    for words in ("no run log", "columns the run lacks", "steps outside", "no run training"):
        assert words in ids
    assert {s for row in ITERATION_ROWS for s in row.surfaces} == {"rescore-api", "rescore-magic", "swap-api",
                                                                     "swap-cell"}
