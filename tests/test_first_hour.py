"""A new user's first hour (issue 40): typos, a resume with nothing to do, list shapes, advice, missing folders,
what %grpo_export writes and which model %grpo_train uses. Unit level: no GRPO training here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets import Dataset
from IPython.core.error import UsageError

import grpo_magic
from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, check_env
from grpo_magic.analysis.check import REFUSAL
from grpo_magic.events import EpisodeError, GroupScored, RunStarted, StepLogged, event_to_json
from grpo_magic.frontends.cli import build_parser, main
from grpo_magic.frontends.magic_args import train_parser
from grpo_magic.training.resume import checkpoint_to_resume
from grpo_magic.training.run import MAX_ERRORS_IN_MEMORY, MAX_GROUPS_IN_MEMORY, GRPORun

ENV_CELL = '''
from datasets import Dataset

class CountEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Write b: "] * 8})

    def score_episode(self, model, tokenizer, completion):
        return completion.count("b") / max(1, len(completion))
'''
CLI = ["--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv", "--batch-size", "8",
       "--rl-max-new-tokens", "8", "--seed", "0"]


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------- 1. typos: no prefixes, the nearest flag


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_no_parser_takes_a_prefix_of_a_flag():
    parsers = [*_parsers(build_parser()), train_parser(trl=False)]
    assert len(parsers) >= 4 and all(p.allow_abbrev is False for p in parsers)


@pytest.mark.parametrize(("argv", "near"), [
    (["train", "--max-step", "3"], "--max-steps"),  # a prefix: argparse took it as --max-steps
    (["train", "--max-stesp", "3"], "--max-steps"),
    (["eval", "--sampels", "2"], "--samples"),
])
def test_the_cli_refuses_a_typo_with_the_nearest_flag(argv, near, capsys):
    assert main(argv) == 2
    line = _err_line(capsys)
    assert f"unrecognized arguments: {argv[1]}" in line and f"did you mean {near}?" in line


@pytest.mark.parametrize(("magic", "line", "near"), [
    ("grpo_train", "--env CountEnv --max-step 3", "--max-steps"),
    ("grpo_train", "--env CountEnv --max-stesp 3 --run", "--max-steps"),
    ("grpo_check", "CountEnv --sample 2", "--samples"),
    ("grpo_export", "CountEnv --forc", "--force"),
])
def test_the_magics_refuse_a_typo_with_the_nearest_flag(shell, magic, line, near):
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    with pytest.raises(UsageError, match=f"did you mean {near}\\?"):
        shell.run_line_magic(magic, line)


# ---------------------------------------------------------------- 2. a resume with nothing left to train


def _checkpoint(folder: Path, step: int) -> Path:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "rng_state.pth").write_bytes(b"")
    return path


def test_resume_at_or_below_the_checkpoint_step_is_one_sentence_naming_both(in_tmp):
    _checkpoint(in_tmp / "out", 5)
    for max_steps in (3, 5):
        with pytest.raises(GRPOMagicError) as info:
            checkpoint_to_resume(in_tmp / "out", GRPOParams(model="tiny", max_steps=max_steps), processes=1)
        message = str(info.value)
        assert "checkpoint-5" in message and f"--max-steps {max_steps}" in message and "step 5" in message
        assert "\n" not in message and "above 5" in message
    assert checkpoint_to_resume(in_tmp / "out", GRPOParams(model="tiny", max_steps=6), 1).endswith("checkpoint-5")
    assert checkpoint_to_resume(in_tmp / "out", GRPOParams(model="tiny"), 1).endswith("checkpoint-5")  # epochs


def test_the_cli_refuses_such_a_resume_before_a_model_loads(in_tmp, tiny_path, capsys, monkeypatch):
    import transformers

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    _checkpoint(in_tmp / "out", 4)
    assert main(["train", *CLI, "--max-steps", "4", "--project-name", "out", "--resume", "--quiet"]) == 2
    line = _err_line(capsys)
    assert "Cannot resume from checkpoint-4" in line and "--max-steps 4" in line


# ---------------------------------------------------------------- 3. lists of dicts


def test_run_errors_and_groups_index_and_slice_as_bounded_lists_of_dicts():
    run = GRPORun(GRPOParams(model="tiny"), "E", Path("nowhere"))
    for i in range(MAX_ERRORS_IN_MEMORY + 3):
        run.events.emit(EpisodeError(step=1, index=i, kind="exception", message=f"e{i}"))
    for g in range(MAX_GROUPS_IN_MEMORY + 2):
        run.events.emit(GroupScored(step=1, group=g, prompt="p", completions=["a", "b"], scores=[0.0, 1.0],
                                    advantages=[-1.0, 1.0], errors=[None, None], clipped=[False, False]))
    first = run.errors[:1]
    assert isinstance(first, list) and isinstance(first[0], dict) and first[0]["index"] == 3  # the oldest went
    assert len(run.errors) == MAX_ERRORS_IN_MEMORY and run.error_count == MAX_ERRORS_IN_MEMORY + 3
    assert run.errors[-1]["message"] == f"e{MAX_ERRORS_IN_MEMORY + 2}"
    assert len(run.groups) == MAX_GROUPS_IN_MEMORY and run.groups[0]["group"] == 2
    assert [g["group"] for g in run.groups[-2:]] == [MAX_GROUPS_IN_MEMORY, MAX_GROUPS_IN_MEMORY + 1]


def test_a_rescore_reports_groups_are_dicts_with_the_documented_keys(in_tmp, tiny_path):
    log = in_tmp / "run"
    log.mkdir()
    params = GRPOParams(model="tiny", rl_num_generations=2, batch_size=2)
    events = [RunStarted(params=params.to_dict(), env_name="LettersEnv", model="tiny", output_dir=str(log))]
    for step in (1, 2):
        events.append(GroupScored(step=step, group=0, prompt="Write the letter a many times: ",
                                  completions=["aaa", "abc"], scores=[1.0, 1 / 3], advantages=[0.7, -0.7],
                                  errors=[None, None], clipped=[False, False], columns={"letter": "a"}))
    (log / "events.jsonl").write_text("".join(event_to_json(e) + "\n" for e in events))
    report = grpo_magic.rescore(str(log), LettersEnv)
    assert isinstance(report.groups[0], dict) and isinstance(report.groups[:1], list)
    group = report.groups[-1]
    assert {"step", "prompt", "completions", "old_scores", "new_scores", "old_advantages",
            "new_advantages"} <= set(group)
    assert group["step"] == 2 and group["new_scores"] == pytest.approx([1.0, 1 / 3]) and group["changed"] == [False] * 2
    assert "grpo rescore" in report._repr_html_()


# ---------------------------------------------------------------- 4. %grpo_check's advice fits the case

PROMPTS = ["Say something:", "Tell me a story:", "Name a fruit:"]


class _Base:
    def build_dataset(self, tokenizer) -> Dataset:
        return Dataset.from_dict({"prompt": PROMPTS})


class SolvedEnv(_Base):
    """Full marks for every real reply; nothing for the degenerate ones (empty, echo, refusal)."""

    def score_episode(self, model, tokenizer, completion):
        return 0.0 if not completion.strip() or completion in PROMPTS or completion == REFUSAL else 1.0


class NeverEnv(_Base):
    def score_episode(self, model, tokenizer, completion):
        return 0.0


FAST = dict(samples=3, num_generations=4, max_new_tokens=8)


def test_check_says_an_env_at_full_marks_is_solved_and_one_at_zero_never_pays():
    solved = check_env(SolvedEnv, **FAST)
    assert not solved.ready and "already solved for this model" in solved.verdict
    assert "raise the difficulty" in solved.verdict and "1.00" in solved.verdict
    assert not any("partial credit" in w or "sparse" in w for w in solved.warnings)
    never = check_env(NeverEnv, **FAST)
    assert "never pays this model" in never.verdict and "partial credit" in never.verdict


# ---------------------------------------------------------------- 5. a missing run folder, a file as module


def test_eval_of_a_missing_run_folder_says_the_folder_is_missing(shell, capsys):
    assert main(["eval", "runs/does-not-exist"]) == 2
    line = _err_line(capsys)
    assert "runs/does-not-exist does not exist" in line and "Hub" not in line
    for magic_line in ("runs/does-not-exist", "CountEnv runs/does-not-exist --greedy"):
        shell.run_cell_magic("grpo_env", "", ENV_CELL)
        with pytest.raises(UsageError, match="runs/does-not-exist does not exist") as info:
            shell.run_line_magic("grpo_eval", magic_line)
        assert "Hub" not in str(info.value)
    Path("runs").mkdir()
    with pytest.raises(GRPOMagicError, match="does not exist"):  # the API: runs/ is here, so this is a folder
        grpo_magic.evaluate(LettersEnv, "runs/does-not-exist")


def test_a_file_path_given_as_module_is_answered_with_the_dotted_name(in_tmp, tiny_path, capsys):
    folder = in_tmp / "my_envs"
    folder.mkdir()
    (folder / "json_env.py").write_text("class JsonEnv:\n    pass\n")
    for argv in (["train", "--model", "tiny"], ["eval", "--model", "tiny", "--greedy"]):
        assert main([*argv, "--rl-env-module", "my_envs/json_env.py", "--rl-env-class", "JsonEnv"]) == 2
        line = _err_line(capsys)
        assert "--rl-env-module my_envs.json_env" in line and "not a file path" in line


# ---------------------------------------------------------------- 6. %grpo_export writes what ran


def test_export_writes_the_last_started_run_or_the_form_when_asked_never_a_refused_line(shell, capsys, monkeypatch):
    started = []

    def fake_train(params, env_name, **kwargs):  # a run that started: its parameters, its folder
        run = SimpleNamespace(params=params.replace(project_name="grpo-runs/CountEnv-1"),
                              output_dir=Path("grpo-runs/CountEnv-1").resolve())
        started.append(run)
        return run

    monkeypatch.setattr("grpo_magic.frontends.magics.train", fake_train)
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    with pytest.raises(UsageError, match="--from-form exports the form's values"):
        shell.run_line_magic("grpo_export", "CountEnv --to none.py --from-form")
    assert not Path("none.py").exists()
    shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --lr 1e-2 --batch-size 8 --run")
    shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --lr 0.005")  # a form
    with pytest.raises(UsageError):  # refused: never started
        shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --batch-size 6 --lr 0.3 --run")
    assert len(started) == 1
    capsys.readouterr()
    shell.run_line_magic("grpo_export", "CountEnv --to count_env.py")
    out = capsys.readouterr().out
    assert "parameters from the last run that started, " in out and "CountEnv-1" in out
    command = next(line for line in out.splitlines() if line.strip().startswith("grpo-magic train"))
    assert "--lr 0.01" in command and "--batch-size 8" in command
    assert "0.005" not in command and "0.3" not in command and "--project-name" not in command
    folder = shell.run_line_magic("grpo_export", "CountEnv --to cluster --from-form")
    out = capsys.readouterr().out
    assert "parameters from the form (--from-form)" in out
    assert "--lr 0.005" in (folder / "launch.sh").read_text()


# ---------------------------------------------------------------- 7. the model %grpo_train uses


def test_train_without_model_says_which_model_it_uses(shell, capsys):
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    capsys.readouterr()
    shell.run_line_magic("grpo_train", "--env CountEnv")
    out = capsys.readouterr().out
    assert "model: tiny (no --model given: GrpoMagics.default_model, the offline demo model" in out
    shell.run_line_magic("grpo_train", "--env CountEnv --model tiny")
    assert "no --model given" not in capsys.readouterr().out


# ---------------------------------------------------------------- 8. IPython in a terminal: text, not reprs


def _plain_text(shell, obj) -> str:
    """What IPython in a terminal prints for ``obj`` (the text/plain of its display bundle)."""
    from IPython.display import display

    data, _ = shell.display_formatter.format(obj)
    if hasattr(obj, "_ipython_display_"):  # displayed by itself: what it publishes
        published = []
        original = shell.display_pub.publish
        shell.display_pub.publish = lambda data, *a, **k: published.append(data)
        try:
            display(obj)
        finally:
            shell.display_pub.publish = original
        data = published[-1]
    return data["text/plain"]


def test_reports_show_their_text_table_in_a_terminal(shell):
    report = check_env(NeverEnv, **FAST)
    assert _plain_text(shell, report) == str(report) and "verdict:" in str(report)
    evaluated = grpo_magic.evaluate(SolvedEnv, "tiny", greedy_only=True, baseline=None, rl_max_new_tokens=4)
    assert _plain_text(shell, evaluated) == str(evaluated) and "greedy mean" in str(evaluated)


def test_the_env_summary_form_and_dashboard_have_a_text_form(shell, capsys, in_tmp):
    capsys.readouterr()
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    out = capsys.readouterr().out
    assert "registered env CountEnv (class CountEnv" in out and "dataset: 8 prompts" in out
    assert "IPython.core.display.HTML object" not in out
    form = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --batch-size 8")
    text = _plain_text(shell, form)
    assert text == str(form) and "GRPO training form: env CountEnv" in text and "grpo-magic train" in text
    assert "VBox" not in text
    log = in_tmp / "run"
    log.mkdir()
    events = [RunStarted(params=GRPOParams(model="tiny").to_dict(), env_name="LettersEnv", model="tiny",
                         output_dir=str(log), max_steps=2),
              StepLogged(step=1, metrics={"reward": 0.25}, max_steps=2)]
    (log / "events.jsonl").write_text("".join(event_to_json(e) + "\n" for e in events))
    dash = grpo_magic.replay(str(log))
    text = _plain_text(shell, dash)
    assert text == str(dash) and "GRPO · LettersEnv" in text and "step 1/2" in text and "VBox" not in text


# ---------------------------------------------------------------- 9. control characters in terminal progress


def test_terminal_progress_escapes_control_characters_of_completions():
    import io

    from grpo_magic.frontends.progress import TerminalProgress

    out = io.StringIO()
    progress = TerminalProgress(stream=out, summary_every=1)
    progress(RunStarted(params={}, env_name="E", model="tiny", output_dir="out", max_steps=2))
    progress(EpisodeError(step=1, index=0, kind="exception", message="bad \x07 byte"))
    progress(GroupScored(step=1, group=0, prompt="say \x1b[31mred", completions=["a\x00b\x08c", "ok"],
                         scores=[0.5, 1.0], advantages=[-0.7, 0.7], errors=[None, None], clipped=[False, False]))
    progress(StepLogged(step=1, metrics={"reward": 0.75}, max_steps=2))
    text = out.getvalue()
    assert not any(ord(c) < 32 and c != "\n" or ord(c) == 127 for c in text), repr(text)
    assert "a\\x00b\\x08c" in text and "say \\x1b[31mred" in text and "bad \\x07 byte" in text


def test_a_run_from_ipython_in_a_terminal_prints_the_cli_s_progress(shell, capsys, in_tmp):
    """No kernel, so no widgets: %grpo_train --run writes the CLI's progress lines, not silence."""
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    capsys.readouterr()
    run = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --max-steps 2 --batch-size 4 "
                                             "--rl-num-generations 2 --rl-max-new-tokens 4 --run --blocking")
    assert run.status == "completed", run.reason
    err = capsys.readouterr().err
    assert "grpo: CountEnv on tiny ->" in err and "step 2/2" in err, err
