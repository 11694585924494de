"""The magics in a real IPython InteractiveShell with the extension loaded."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
from IPython.core.error import UsageError

import grpo_magic
from grpo_magic import GRPOParams, registered_envs
from grpo_magic.frontends.cli import build_parser, params_from_namespace

ENV_CELL = '''
from datasets import Dataset

class CountEnv:
    def __init__(self, letter="a", n=8):
        self.letter, self.n = letter, n

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Write {self.letter}: "] * self.n, "case_idx": list(range(self.n))})

    def score_episode(self, model, tokenizer, completion, case_idx):
        return SCORE
'''




def _env_cell(shell, score="completion.count(self.letter) / max(1, len(completion))", line='--config {"letter": "b"}'):
    return shell.run_cell_magic("grpo_env", line, ENV_CELL.replace("SCORE", score))


def test_grpo_env_registers_the_class_with_its_config_and_keeps_it_usable(shell, capsys):
    spec = _env_cell(shell)
    assert spec.name == "CountEnv" and spec.config == {"letter": "b"} and spec.source == "cell"
    assert "CountEnv" in shell.user_ns and shell.user_ns["CountEnv"]().letter == "a"
    shell.run_line_magic("grpo_envs", "")
    assert 'CountEnv: class CountEnv from cell, config {"letter": "b"}' in capsys.readouterr().out


def test_train_from_the_magic_and_rerun_cell_changes_the_next_runs_scores(shell):
    _env_cell(shell, score="0.25 + 0.0 * case_idx")
    run = shell.run_line_magic(
        "grpo_train", "--env CountEnv --model tiny --max-steps 2 --batch-size 4 --rl-max-new-tokens 4 --run --blocking")
    assert run.status == "completed" and run is grpo_magic.last_run()
    assert {s for g in run.groups for s in g["scores"]} == {0.25}
    _env_cell(shell, score="0.75")
    run2 = shell.run_line_magic(
        "grpo_train", "--env CountEnv --max-steps 1 --batch-size 4 --rl-max-new-tokens 4 --run --blocking")
    assert {s for g in run2.groups for s in g["scores"]} == {0.75}


@pytest.mark.parametrize(("cell", "line", "words"), [
    ("class A:\n  def build_dataset(self, t) return 1\n", "", ["syntax error at line 2"]),
    ("raise RuntimeError('no db')\n", "", ["raised RuntimeError: no db"]),
    ("x = 1\n", "", ["defines no class"]),
    ("class A:\n  def build_dataset(self, t): pass\n", "", ["A has no score_episode()"]),
    ("class A:\n  def build_dataset(self, t): pass\n  def score_episode(self, m, t, c): pass\n"
     "class B(A): pass\n", "", ["2 environment classes (A, B)"]),
    (ENV_CELL.replace("SCORE", "1.0"), "--config {letter: b}", ["--config", "not valid JSON"]),
    (ENV_CELL.replace("SCORE", "1.0"), '--config {"lettr": "b"}', ["'lettr'"]),
    (ENV_CELL.replace('"prompt"', '"text"').replace("SCORE", "1.0"), "", ["without a 'prompt' column"]),
])
def test_bad_env_cells_are_one_line_usage_errors(shell, cell, line, words):
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("grpo_env", line, cell)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    assert "CountEnv" not in registered_envs()


def test_two_classes_with_a_name_registers_that_one(shell):
    cell = ("class A:\n  def build_dataset(self, t):\n    from datasets import Dataset\n"
            "    return Dataset.from_dict({'prompt': ['x']})\n  def score_episode(self, m, t, c): return 1.0\n"
            "class B(A): pass\n")
    assert shell.run_cell_magic("grpo_env", "B", cell).cls.__name__ == "B"


@pytest.mark.parametrize(("line", "words"), [
    ("--env CountEnv --rl-num-generations 1 --run", ["rl_num_generations", "at least 2"]),
    ("--env CountEnv --no-such 3", ["unrecognized arguments: --no-such"]),
    ("--env CountEnv --lr abc", ["--lr", "abc"]),
    ("--env Nope --run", ["No environment named 'Nope'"]),
    ("--env CountEnv --batch-size 6 --run", ["not divisible"]),
    ("--env CountEnv --model ./no/such/model --run", ["./no/such/model"]),
    ("--env CountEnv --rl-env-config '[1]' --run", ["JSON object"]),
])
def test_bad_train_flags_are_usage_errors_before_any_model_loads(shell, line, words):
    _env_cell(shell)
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("grpo_train", line)
    for word in words:
        assert word in str(info.value)


def test_help_is_generated_from_the_metadata(shell):
    doc = shell.find_line_magic("grpo_train").__doc__
    assert "--rl-num-generations" in doc and "Completions sampled per prompt" in doc and "--run" in doc


def test_form_widgets_come_from_the_metadata(shell, monkeypatch):
    _env_cell(shell)
    form = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny")
    assert set(form.fields) == {f.name for f in GRPOParams.fields()}
    assert form.fields["rl_num_generations"].tooltip.startswith("Completions sampled per prompt")
    assert form.env.value == "CountEnv"


def test_a_new_params_field_appears_in_the_form_and_the_cli(monkeypatch):
    """Declare a field once (a test subclass); the form and the CLI show it without touching them."""
    from grpo_magic.config import params
    from grpo_magic.frontends import cli, form

    @dataclasses.dataclass
    class MoreParams(GRPOParams):
        rl_repetition_penalty: float = dataclasses.field(
            default=1.0, metadata={"help": "Penalty for repeated tokens.", "group": "Generation", "gt": 0})

    monkeypatch.setattr(params, "GRPOParams", MoreParams)
    monkeypatch.setattr(cli, "GRPOParams", MoreParams)
    monkeypatch.setattr(form, "GRPOParams", MoreParams)
    train_form = form.TrainForm(MoreParams(model="tiny", rl_env_module="m", rl_env_class="C"))
    assert "rl_repetition_penalty" in train_form.fields
    train_form.fields["rl_repetition_penalty"].value = 0.0
    assert train_form.train_button.disabled
    assert "rl_repetition_penalty" in train_form.errors["rl_repetition_penalty"].value
    train = cli.build_parser()._subparsers._group_actions[0].choices["train"]
    assert "--rl-repetition-penalty" in {o for a in train._actions for o in a.option_strings}


def test_invalid_form_value_disables_train_and_shows_the_message(shell):
    _env_cell(shell)
    form = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny")
    assert not form.train_button.disabled
    form.fields["rl_num_generations"].value = 3
    assert form.train_button.disabled
    assert "not divisible by rl_num_generations 3" in form.problems_html.value
    form.fields["batch_size"].value = 6
    assert not form.train_button.disabled
    form.fields["rl_top_p"].value = 1.5
    assert form.train_button.disabled and "rl_top_p" in form.errors["rl_top_p"].value


def test_train_button_starts_a_run_with_exactly_the_form_values(shell):
    _env_cell(shell)
    form = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny")
    form.fields["max_steps"].value = "2"
    form.fields["rl_max_new_tokens"].value = 4
    form.fields["lr"].value = 3e-4
    form.fields["project_name"].value = "from-form"
    expected = form.params()
    form.train_button.click()
    run = form.run
    assert run is not None, form.status.value
    run.wait(timeout=300)
    assert run.params == expected and run.status == "completed" and run.step == 2
    assert run.output_dir.name == "from-form"


def test_command_preview_parses_back_to_the_same_params(shell):
    _env_cell(shell)
    form = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --lr 3e-4 --peft --rl-top-p 0.9")
    command = form.command.value
    assert command.startswith("grpo-magic train ")
    import shlex

    parsed = params_from_namespace(build_parser().parse_args(shlex.split(command)[1:]))
    assert parsed == form.params().replace(rl_env_module="count_env", rl_env_class="CountEnv",
                                           rl_env_config='{"letter": "b"}')


#: An env whose episodes of step 2 wait for the test: the run is surely still training while the test acts.
GATED_ENV_CELL = '''
import threading
from datasets import Dataset

scoring_step_2, release = threading.Event(), threading.Event()
episodes = []

class GatedEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Write a: "] * 8})

    def score_episode(self, model, tokenizer, completion):
        episodes.append(completion)
        if len(episodes) > 4:  # step 1 has 4 completions (batch 4, 4 generations)
            scoring_step_2.set()
            release.wait(300)  # a safety net if the test fails before it releases
        return 0.5
'''


def test_stop_without_a_run_and_second_run_refused(shell, in_tmp, capsys):
    shell.run_line_magic("grpo_stop", "")
    assert "No run is training" in capsys.readouterr().out
    shell.run_cell_magic("grpo_env", "", GATED_ENV_CELL)
    ns = shell.user_ns
    run = shell.run_line_magic(
        "grpo_train", "--env GatedEnv --max-steps 50 --batch-size 4 --rl-max-new-tokens 4 --run")
    try:
        assert ns["scoring_step_2"].wait(300), f"the run never reached step 2: {run.status} {run.reason}"
        assert run.step == 1 and not run.done
        with pytest.raises(UsageError) as info:
            shell.run_line_magic("grpo_train", "--env GatedEnv --max-steps 1 --project-name second --run")
        message = str(info.value)
        assert "already training (GatedEnv, step 1)" in message and "%grpo_stop" in message, message
        assert not (in_tmp / "second").exists()  # refused before any work
        assert grpo_magic.last_run() is run and not run.done
        capsys.readouterr()
        assert shell.run_line_magic("grpo_stop", "") is run
        assert "Stopping GatedEnv after the current step" in capsys.readouterr().out
    except BaseException:
        run.stop()  # a failing test leaves no run training for the next one
        raise
    finally:
        ns["release"].set()
        run.wait(timeout=300)
    assert run.status == "stopped" and run.step == 2 and run.reason == "stopped on request"
    assert (run.output_dir / "model.safetensors").exists()
    shell.run_line_magic("grpo_stop", "")
    assert "No run is training" in capsys.readouterr().out


def test_export_writes_a_module_that_trains_from_the_cli(shell, in_tmp, capsys, cli):
    _env_cell(shell)
    path = shell.run_line_magic("grpo_export", "CountEnv --to count_env.py")
    out = capsys.readouterr().out
    assert path.exists() and "grpo-magic train" in out and "--rl-env-module count_env" in out
    assert "accelerate launch -m grpo_magic train" in out
    with pytest.raises(UsageError, match="exists; pass --force"):
        shell.run_line_magic("grpo_export", "CountEnv --to count_env.py")
    command = next(line.strip() for line in out.splitlines() if line.strip().startswith("grpo-magic train"))
    import shlex

    argv = shlex.split(command)[2:] + ["--max-steps", "1", "--rl-max-new-tokens", "4", "--quiet"]
    proc = cli(["train", *argv], cwd=in_tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "completed after 1 steps" in proc.stderr


def test_config_traitlet_sets_the_default_model(shell):
    shell.run_line_magic("config", "GrpoMagics.default_model = './nowhere/model'")
    _env_cell(shell)
    try:
        with pytest.raises(UsageError, match="nowhere/model"):
            shell.run_line_magic("grpo_train", "--env CountEnv --run")
    finally:
        shell.run_line_magic("config", "GrpoMagics.default_model = 'tiny'")


def test_load_ext_stays_light():
    code = textwrap.dedent("""
        import sys
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "grpo_magic")
        assert "grpo_train" in shell.magics_manager.magics["line"]
        print([m for m in ("torch", "transformers", "trl") if m in sys.modules])
        shell.run_line_magic("unload_ext", "grpo_magic")
        print("grpo_train" in shell.magics_manager.magics["line"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]


def test_grpo_check_magic_reports_equal_scores_and_errors_without_raising(shell):
    _env_cell(shell, score="0.5")
    report = shell.run_line_magic("grpo_check", "CountEnv --samples 2 --rl-max-new-tokens 4")
    assert report.zero_variance_groups == 2 and not report.ready
    assert any("equal scores" in w for w in report.warnings)
    _env_cell(shell, score="1 / 0")
    report = shell.run_line_magic("grpo_check", "CountEnv --samples 2 --rl-max-new-tokens 4")
    assert report.error_count == 8 and "ZeroDivisionError" in report.verdict
    with pytest.raises(UsageError, match="--samples must be at least 1"):
        shell.run_line_magic("grpo_check", "CountEnv --samples 0")
