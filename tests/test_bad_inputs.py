"""Every bad input in ``tests/bad_inputs.py`` is answered on every surface, before the model loads.

The answer is one line that names the problem and the fix: ``GRPOMagicError`` from the API, exit
status 2 and one stderr line from the CLI, ``UsageError`` from the magics. A guard on
``grpo_magic.models.load_model`` proves that nothing slow ran first.
"""

from __future__ import annotations

import re
import shlex
import sys

import pytest
from IPython.core.error import UsageError

import grpo_magic
from grpo_magic import GRPOMagicError, GRPOParams
from grpo_magic import models as models_module
from grpo_magic.frontends.cli import main
from grpo_magic.training import run as run_module
from tests.bad_inputs import ROWS, BadInput, cli_flags

BASE = dict(model="tiny", rl_env_module="envs.letters", rl_env_class="LettersEnv", max_steps=1, batch_size=4,
            rl_max_new_tokens=4)

#: Verbs that say what to do. "must", "needs", "takes", "is required" and "see ..." state a problem or
#: point elsewhere; they are no fix.
FIX_VERBS = (
    "use", "pass", "add", "fix", "check", "start", "define", "install", "drop", "return", "give", "name", "wrap",
    "lower", "raise", "set", "stop", "run", "pick", "write", "train", "unset", "remove", "rename", "choose",
    "change", "register",
)
#: A fix is an imperative clause: one of FIX_VERBS heading the answer or one of its clauses (after ; : ( ,
#: or "or", "then", "so", "and"), as in "...; use --batch-size 4 or 8." ("pip install" counts as install).
FIX_WORDS = re.compile(r"(?:^|[;:(,]\s*|\b(?:or|then|so|and)\s+)(?:pip\s+)?(?:" + "|".join(FIX_VERBS) + r")\b", re.I)

CASES = [pytest.param(row, surface, id=f"{row.id}-{surface}") for row in ROWS for surface in row.surfaces]


class _Busy:
    """Stands for a run that is training in this process."""

    done = False
    env_name = "OtherEnv"
    step = 3


@pytest.fixture
def model_guard(monkeypatch):
    """Record any model load: a bad input must be answered before it."""
    loads: list[str] = []

    def guard(*args, **kwargs):
        loads.append(str(args[:1]))
        raise RuntimeError("the model was loaded before the bad input was answered")

    monkeypatch.setattr(models_module, "load_model", guard)
    return loads




def _setup(row: BadInput, surface: str, tmp, monkeypatch) -> dict:
    """Write the row's env module, apply its setup; returns the params (as a dict) to use."""
    params = dict(BASE)
    if row.env is not None and surface != "cell":
        module = "bad_" + re.sub(r"\W+", "_", row.id).strip("_") + "_" + surface
        (tmp / f"{module}.py").write_text(row.env, encoding="utf-8")
        params.update(rl_env_module=module, rl_env_class="Env")
        monkeypatch.delitem(sys.modules, module, raising=False)
    before = dict(params)  # what a checkpoint in the folder was trained with (setup "checkpoint")
    params.update(row.params)
    monkeypatch.setenv("GRPO_MAGIC_VLLM_CHECK_TIMEOUT", "1")
    if row.setup == "fake_vllm":  # vllm "installed" on a machine without a GPU
        (tmp / "fakepkgs" / "vllm").mkdir(parents=True)
        (tmp / "fakepkgs" / "vllm" / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp / "fakepkgs"))
    elif row.setup == "active_run":
        monkeypatch.setattr(run_module, "_ACTIVE", _Busy())
    elif row.setup == "pyproject":
        (tmp / "pyproject.toml").write_text("[project]\n")
    elif row.setup == "no_tool_template":  # tiny, with a chat template that knows no tools
        import shutil

        from grpo_magic.models import tiny_model_path

        folder = tmp / "no-tools-model"
        shutil.copytree(tiny_model_path(), folder)
        (folder / "chat_template.jinja").write_text(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    elif row.setup == "checkpoint":
        # Where a resume without --project-name looks: grpo-run for the CLI, the env's newest grpo-runs/ folder elsewhere.
        default = "grpo-run" if surface == "cli" else "grpo-runs/LettersEnv-20260101-000000"
        _write_checkpoint(tmp / params.get("project_name", default), {**before, **row.checkpoint})
    return params


def _write_checkpoint(output_dir, old: dict) -> None:
    """A folder as a stopped run leaves it: a complete checkpoint-2 and a run log naming its params.

    Written by hand (not trained) so that a row costs milliseconds; what the resume check reads is
    exactly what Trainer and RunLog write: trainer_state.json, the RNG files, the run_started line.
    """
    import json

    from grpo_magic.events import RunLog, RunStarted

    processes = old.pop("processes", 1)
    folder = output_dir / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    for rank in range(processes):
        (folder / ("rng_state.pth" if processes == 1 else f"rng_state_{rank}.pth")).write_bytes(b"")
    log = RunLog(output_dir)
    log(RunStarted(params=GRPOParams(**old).to_dict(), env_name="LettersEnv", model=old["model"],
                   output_dir=str(output_dir), max_steps=old.get("max_steps")))
    log.close()


def _answer(row: BadInput, surface: str, params: dict, shell, capsys) -> str:
    """Try the bad input on one surface; returns the one-line answer."""
    if surface == "api":
        with pytest.raises(GRPOMagicError) as info:
            grpo_magic.train(GRPOParams(**params), display=False, **row.api_kwargs)
        return str(info.value)
    if surface == "cli":
        capsys.readouterr()
        code = main(["train", *cli_flags(params), *row.flags, "--quiet"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "Traceback" not in err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("grpo-magic: error: ")
        return lines[0].removeprefix("grpo-magic: error: ")
    if surface == "magic":
        line = shlex.join([*cli_flags(params), *row.flags, "--run", "--blocking"]) + " " + row.raw_line
        with pytest.raises(UsageError) as info:
            shell.run_line_magic("grpo_train", line)
        return str(info.value)
    assert surface == "cell" and row.env is not None
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("grpo_env", row.cell_line, row.env)
    assert "Env" not in grpo_magic.registered_envs()  # a bad cell registers nothing
    return str(info.value)


def _has(message: str, word: str) -> bool:
    """A word matches in the spelling of either surface: rl_env_class or --rl-env-class."""
    return word in message or word.replace("_", "-") in message or word.replace("-", "_") in message


@pytest.mark.parametrize(("row", "surface"), CASES)
def test_every_bad_input_is_answered_in_one_sentence_before_the_model_loads(
    row: BadInput, surface: str, in_tmp, monkeypatch, model_guard, capsys, request
):
    shell = request.getfixturevalue("shell") if surface in ("magic", "cell") else None
    params = _setup(row, surface, in_tmp, monkeypatch)
    message = _answer(row, surface, params, shell, capsys)
    print(f"{row.id} [{surface}]: {message}")  # the catalogue's answers: pytest -rP shows them
    assert not model_guard, f"the model loaded before {row.id!r} was answered"
    assert "\n" not in message and "Traceback" not in message, message
    assert message.rstrip().endswith((".", ")")), message
    assert FIX_WORDS.search(message), f"no fix in: {message}"
    if "quote" not in row.id:
        assert "check the quotes" not in message, message  # a flag mistake is not a quoting one
    missing = [w for w in row.words if not _has(message, w)]
    assert not missing, f"{missing} not in: {message}"


@pytest.mark.parametrize(("message", "names_a_fix"), [
    ("lr (--lr) must be greater than 0, got 0.", False),
    ("Unknown parameter 'lrr'; see GRPOParams for the valid names.", False),
    ("Env.build_dataset() returned an empty dataset; it needs at least one prompt.", False),
    ("Env() does not accept 'max_turns' (it takes letter).", False),
    ("model (--model) is required.", False),
    ("Env.build_dataset() must return a datasets.Dataset, got list.", False),
    ("lr (--lr) must be greater than 0, got 0; use --lr above 0 (the default is 1e-05).", True),
    ("--use-vllm needs the vllm package; pip install 'grpo-magic[vllm]' on a GPU machine.", True),
    ("Cannot resume: no checkpoint, so train without --resume.", True),
    ("Check the path.", True),
])
def test_a_fix_is_an_imperative_clause(message: str, names_a_fix: bool):
    """The check above: a verb that says what to do heads a clause; "must", "needs", "see" do not count."""
    assert bool(FIX_WORDS.search(message)) is names_a_fix


def test_the_catalogue_covers_every_field_and_every_surface():
    """A new GRPOParams field with a range gets rows without anyone writing them."""
    ranged = {f.name for f in GRPOParams.fields() if {"ge", "gt", "le", "lt"} & set(f.metadata)}
    covered = {name for row in ROWS for name in row.params}
    assert ranged <= covered
    assert {s for row in ROWS for s in row.surfaces} == {"api", "cli", "magic", "cell"}
    assert len(CASES) >= 150
