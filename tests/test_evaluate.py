"""Evaluation on held-out prompts (docs/architecture.md, "Evaluation").

The numbers (pass@k, the bootstrap) on hand-checkable cases; the held-out split and its checks; bad
inputs on every surface before any model loads; a real LoRA run with ``--eval-steps`` whose saved
adapter, reloaded from the run folder, gives the in-memory model's greedy completions on every eval
prompt, and whose training batches never held an eval prompt; and (slow) tiny-math with the fixed
recipe, whose held-out greedy accuracy from ``%grpo_eval`` on the saved run folder rises.
"""

from __future__ import annotations

import json
import math

import pytest
from IPython.core.error import UsageError

import grpo_magic
from grpo_magic import GRPOMagicError, GRPOParams
from grpo_magic.analysis.evaluation import bootstrap_interval, pass_at_k, summarize
from grpo_magic.environment.env import EnvSpec, prepare_env, split_eval
from grpo_magic.events import EvalScored, GroupScored, event_from_dict, event_to_json, read_run_log
from grpo_magic.frontends.cli import main

ENV_SOURCE = '''
from datasets import Dataset


class DigitsEnv:
    """Distinct prompts, so that a leak of an eval prompt into training would show."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Write {n} digits: " for n in range(24)], "n": list(range(24))})

    def score_episode(self, model, tokenizer, completion, n):
        return sum(ch.isdigit() for ch in completion) / max(1, len(completion))
'''


@pytest.fixture
def digits_env(in_tmp, monkeypatch):
    (in_tmp / "digits_env.py").write_text(ENV_SOURCE, encoding="utf-8")
    import importlib

    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.delitem(__import__("sys").modules, "digits_env", raising=False)
    importlib.invalidate_caches()
    return importlib.import_module("digits_env").DigitsEnv


# ---------------------------------------------------------------- the numbers


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 4, 1, 1.0),
        (4, 4, 4, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),
        (4, 2, 2, 5 / 6),
        (5, 2, 3, 0.9),
        (10, 3, 1, 0.3),
        (10, 0, 10, 0.0),
        (10, 1, 10, 1.0),
        (3, 1, 3, 1.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    # 1 - C(n-c, k) / C(n, k): e.g. n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6; n=5, c=2, k=3: 1 - 1/10.
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(n, n + 1, k)


def test_summary_on_hand_checkable_rows_and_a_seeded_bootstrap():
    rows = [
        {"prompt": "a", "greedy_score": 1.0, "sampled_scores": [1.0, 0.0, 0.0, 0.0], "components": {"fmt": 1.0}},
        {"prompt": "b", "greedy_score": 0.0, "sampled_scores": [0.0, 0.0, 0.0, 0.0], "components": {"fmt": 0.0}},
        {"prompt": "c", "greedy_score": 1.0, "sampled_scores": [1.0, 1.0, None, 0.0], "components": {"fmt": 1.0}},
    ]
    s = summarize(rows, samples=4, seed=3)
    assert s["greedy_mean"] == pytest.approx(2 / 3)
    assert s["sampled_mean"] == pytest.approx((0.25 + 0.0 + 2 / 3) / 3)
    assert s["pass_at_k"]["pass@1"] == pytest.approx((0.25 + 0 + 2 / 3) / 3)
    # pass@4 of c has 3 scored samples only (an error is no sample): left out, as k > n there.
    assert s["pass_at_k"]["pass@4"] == pytest.approx((1.0 + 0.0) / 2)
    assert s["components"] == {"fmt": pytest.approx(2 / 3)}
    assert s["errors"] == 0
    again = summarize(rows, samples=4, seed=3)
    assert again["greedy_ci"] == s["greedy_ci"] and again["sampled_ci"] == s["sampled_ci"]
    values = [i / 10 for i in range(11)]
    assert bootstrap_interval(values, seed=1) == bootstrap_interval(values, seed=1)
    assert bootstrap_interval(values, seed=1) != bootstrap_interval(values, seed=2)
    low, high = bootstrap_interval(values, seed=1)
    assert low < 0.5 < high
    base = [dict(r, greedy_score=g) for r, g in zip(rows, (0.0, 1.0, 1.0), strict=True)]
    s = summarize(rows, samples=4, seed=3, baseline_rows=base)
    assert (s["fixed"], s["broke"], s["changed"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3), ["a", "b"])
    assert [r["change"] for r in rows] == ["fixed", "broke", ""]


def test_the_report_escapes_what_envs_and_models_wrote():
    from grpo_magic.analysis.evaluation import EvalReport

    rows = [
        {
            "prompt": "<script>alert(1)</script>",
            "greedy": "<b>x</b>",
            "greedy_score": 1.0,
            "sampled_scores": [1.0, None],
            "components": {},
        }
    ]
    summary = summarize(rows, samples=2, seed=0)
    summary.update(source="build_eval_dataset", seconds=0.1)
    report = EvalReport(env_name="Env<i>", model="m", summary=summary, rows=rows)
    page = report._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "Env&lt;i&gt;" in page and "err" in page  # an episode error is shown, not a made-up score
    text = str(report)
    assert "greedy mean" in text and "pass@2" in text
    assert json.loads(json.dumps(report.to_dict()))["summary"]["prompts"] == 1


def test_eval_scored_goes_through_the_run_log_as_data():
    event = EvalScored(
        step=2,
        prompts=3,
        greedy_mean=0.5,
        sampled_mean=0.25,
        pass_at_k={"pass@1": 0.25},
        rows=[{"prompt": "p", "greedy": "x", "greedy_score": 0.5, "sampled_scores": [0.0, None]}],
    )
    back = event_from_dict(json.loads(event_to_json(event)))
    assert back == event
    import io

    from grpo_magic.frontends.progress import TerminalProgress

    out = io.StringIO()
    TerminalProgress(stream=out)(event)  # the CLI's progress prints each evaluation as one line
    assert "held-out eval (step 2, 3 prompts): greedy 0.500, sampled 0.250, pass@1 0.250" in out.getvalue()


# ---------------------------------------------------------------- the held-out split


def test_eval_split_is_deterministic_by_seed_and_disjoint(digits_env, tiny_path):
    from grpo_magic.models import load_tokenizer

    tok = load_tokenizer(tiny_path)
    a = prepare_env(EnvSpec("DigitsEnv", cls=digits_env), tok, eval_split=0.25, seed=7)
    b = prepare_env(EnvSpec("DigitsEnv", cls=digits_env), tok, eval_split=0.25, seed=7)
    c = prepare_env(EnvSpec("DigitsEnv", cls=digits_env), tok, eval_split=0.25, seed=8)
    train, held = set(a.dataset["prompt"]), set(a.eval_dataset["prompt"])
    assert len(held) == 6 and len(train) == 18 and not train & held and a.eval_source == "eval_split"
    assert a.eval_dataset["prompt"] == b.eval_dataset["prompt"] and a.eval_dataset["prompt"] != c.eval_dataset["prompt"]
    assert prepare_env(EnvSpec("DigitsEnv", cls=digits_env), tok).eval_dataset is None
    from datasets import Dataset

    with pytest.raises(GRPOMagicError, match="leaves no row to train on"):
        split_eval(Dataset.from_dict({"prompt": ["only one"]}), 0.5, 0)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("return Dataset.from_dict({'question': ['x'], 'n': [1]})", "without a 'prompt' column"),
        ("return Dataset.from_dict({'prompt': ['x'], 'n': [1], 'extra': [2]})", "has column 'extra'"),
        ("return Dataset.from_dict({'prompt': ['x']})", "lacks build_dataset's column 'n'"),
    ],
)
def test_a_bad_eval_dataset_is_one_sentence(digits_env, tiny_path, body, words):
    from grpo_magic.models import load_tokenizer

    source = ENV_SOURCE + f"\n    def build_eval_dataset(self, tokenizer):\n        {body}\n"
    namespace: dict = {}
    exec(compile(source, "digits", "exec"), namespace)  # noqa: S102 - the test's own source
    with pytest.raises(GRPOMagicError, match=words) as info:
        prepare_env(EnvSpec("DigitsEnv", cls=namespace["DigitsEnv"]), load_tokenizer(tiny_path), want_eval=True)
    assert "\n" not in str(info.value) and "; " in str(info.value)


# ---------------------------------------------------------------- bad inputs of evaluate, every surface


def _answers(shell, capsys, api, magic_line, cli_args):
    with pytest.raises(GRPOMagicError) as info:
        api()
    answers = [str(info.value)]
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("grpo_eval", magic_line)
    answers.append(str(info.value))
    capsys.readouterr()
    assert main(["eval", *cli_args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    answers.append(err[0].removeprefix("grpo-magic: error: "))
    for message in answers:
        assert "\n" not in message and "Traceback" not in message and "; " in message, message
    return answers


@pytest.fixture
def no_model_loads(monkeypatch):
    from grpo_magic import models

    def guard(*args, **kwargs):
        raise AssertionError("a model loaded before the bad input was answered")

    monkeypatch.setattr(models, "load_model", guard)


def test_evaluate_bad_inputs_are_one_sentence_before_a_model_loads(shell, capsys, digits_env, in_tmp, no_model_loads):
    grpo_magic.register_env(digits_env)
    mod = ["--rl-env-module", "digits_env", "--rl-env-class", "DigitsEnv"]
    for message in _answers(
        shell,
        capsys,
        lambda: grpo_magic.evaluate(digits_env, "tiny", samples=0),
        "DigitsEnv --model tiny --samples 0",
        ["--model", "tiny", "--samples", "0", *mod],
    ):
        assert "--samples" in message
    for bad in ("0", "1", "-0.5"):
        for message in _answers(
            shell,
            capsys,
            lambda b=bad: grpo_magic.evaluate(digits_env, "tiny", eval_split=float(b)),
            f"DigitsEnv --model tiny --eval-split {bad}",
            ["--model", "tiny", "--eval-split", bad, *mod],
        ):
            assert "eval_split" in message or "eval-split" in message
    # A run folder without weights: a run log, nothing saved.
    folder = in_tmp / "unsaved"
    folder.mkdir()
    from grpo_magic.events import RunLog, RunStarted

    log = RunLog(folder)
    log(
        RunStarted(
            params=GRPOParams(model="tiny", rl_env_module="digits_env", rl_env_class="DigitsEnv").to_dict(),
            env_name="DigitsEnv",
            model="tiny",
            output_dir=str(folder),
        )
    )
    log.close()
    (folder / "checkpoint-2").mkdir()
    for message in _answers(
        shell, capsys, lambda: grpo_magic.evaluate(digits_env, str(folder)), f"DigitsEnv {folder}", [str(folder)]
    ):
        assert "no saved weights" in message and "checkpoint-2" in message
    # A baseline whose tokenizer is not the run's: tiny with another chat template.
    import shutil

    from grpo_magic.models import tiny_model_path

    other = in_tmp / "other-template"
    shutil.copytree(tiny_model_path(), other)
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    for message in _answers(
        shell,
        capsys,
        lambda: grpo_magic.evaluate(digits_env, "tiny", baseline=str(other)),
        f"DigitsEnv --model tiny --baseline {other}",
        ["--model", "tiny", "--baseline", str(other), *mod],
    ):
        assert "another tokenizer" in message


# ---------------------------------------------------------------- a real LoRA run with --eval-steps


@pytest.mark.long
@pytest.mark.timeout(900)
def test_lora_run_saved_adapter_gives_the_in_memory_greedy_completions_and_no_eval_prompt_trains(
    digits_env, in_tmp, shell, capsys
):
    params = GRPOParams(
        model="tiny",
        project_name=str(in_tmp / "lora"),
        max_steps=4,
        batch_size=4,
        rl_num_generations=2,
        rl_max_new_tokens=6,
        lr=5e-3,
        rl_kl_coef=0.0,
        peft=True,
        lora_r=4,
        lora_alpha=8,
        eval_split=0.25,
        eval_steps=2,
        eval_samples=2,
        seed=5,
    )
    run = grpo_magic.train(params, digits_env, display=False)
    assert run.status == "completed", run.reason
    assert [e["step"] for e in run.evals] == [0, 2, 4] and run.evals[0]["baseline"]
    assert (in_tmp / "lora" / "adapter_model.safetensors").is_file()
    events = list(read_run_log(run.output_dir))
    evals = [e for e in events if isinstance(e, EvalScored)]
    assert [e.step for e in evals] == [0, 2, 4]
    eval_prompts = {r["prompt"] for r in evals[-1].rows}
    assert len(eval_prompts) == 6
    trained = {e.prompt for e in events if isinstance(e, GroupScored)}
    assert trained and not trained & eval_prompts, trained & eval_prompts
    assert all(len(r["sampled_scores"]) == 2 for r in evals[-1].rows)  # TRL's eval loop: num_generations_eval
    assert any("eval/seconds" in h for h in run.history)  # its cost, next to TRL's step_time

    # The adapter reloaded from disk (base + adapter, not the object in memory): the same greedy texts.
    report = grpo_magic.evaluate(digits_env, str(run.output_dir), greedy_only=True, baseline="none")
    assert report.summary["source"] == "eval_split" and report.summary["prompts"] == 6
    in_memory = {r["prompt"]: r["greedy"] for r in evals[-1].rows}
    reloaded = {r["prompt"]: r["greedy"] for r in report.rows}
    assert reloaded == in_memory
    assert report.summary["greedy_mean"] == pytest.approx(evals[-1].greedy_mean)

    # The other surfaces give the same numbers: the magic (an HTML table, text escaped) and the CLI (JSON).
    grpo_magic.register_env(digits_env)
    magic = shell.run_line_magic("grpo_eval", f"DigitsEnv {run.output_dir} --greedy --baseline none")
    assert magic.summary["greedy_mean"] == report.summary["greedy_mean"]
    html_text = magic._repr_html_()
    assert "<table" in html_text and "Write" in html_text and "<script" not in html_text
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                str(run.output_dir),
                "--samples",
                "2",
                "--json",
                "--rl-env-module",
                "digits_env",
                "--rl-env-class",
                "DigitsEnv",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["greedy_mean"] == pytest.approx(report.summary["greedy_mean"])
    assert set(data["summary"]["pass_at_k"]) == {"pass@1", "pass@2"} and data["baseline"]
    assert "fixed" in data["summary"] and "broke" in data["summary"]

    view = grpo_magic.replay(str(run.output_dir)).view  # the dashboard state keeps them for the charts
    assert [e["step"] for e in view.evals] == [0, 2, 4] and all("greedy_mean" in e for e in view.evals)

    # A base model for the adapter whose tokenizer is not the run's: one sentence, before any model loads.
    import shutil

    from grpo_magic.models import tiny_model_path

    other = in_tmp / "other-template"
    shutil.copytree(tiny_model_path(), other)
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    with pytest.raises(GRPOMagicError, match="another tokenizer than the run"):
        grpo_magic.evaluate(digits_env, str(run.output_dir), model=str(other), baseline="none")

    # Evaluating draws random numbers too, but the training run goes on as if it had not: same rewards without it.
    plain = grpo_magic.train(
        params.replace(eval_steps=None, project_name=str(in_tmp / "plain")), digits_env, display=False
    )
    assert [h["reward"] for h in plain.history] == [h["reward"] for h in run.history]


@pytest.mark.timeout(600)
def test_an_agent_env_is_evaluated_on_whole_episodes_through_the_tool_loop():
    from envs.weather_agent import WeatherAgentEnv

    report = grpo_magic.evaluate(
        WeatherAgentEnv(n_prompts=4), "tiny-agent", samples=2, eval_split=0.5, seed=0, rl_max_new_tokens=48
    )
    assert report.summary["prompts"] == 2 and report.summary["source"] == "eval_split"
    for row in report.rows:
        assert 0.0 <= row["greedy_score"] <= 1.0 and len(row["sampled_scores"]) == 2
    assert set(report.summary["pass_at_k"]) == {"pass@1", "pass@2"}


@pytest.mark.timeout(600)
def test_greedy_agent_episodes_are_one_a_prompt_paired_into_trls_groups_even_for_an_odd_count(monkeypatch):
    """TRL's groups hold two rollouts; greedy ones are identical, so two prompts share a group (the last one of an
    odd count runs twice) and each prompt gets its own greedy episode, in order."""
    import grpo_magic.training.trainer as trainer
    from envs.weather_agent import WeatherAgentEnv

    seen: list[int] = []
    real = trainer.rollouts

    def counting(t, inputs):  # run_agent_episodes imports it at each call: the inputs TRL's tool loop gets
        seen.append(len(inputs))
        return real(t, inputs)

    monkeypatch.setattr(trainer, "rollouts", counting)
    report = grpo_magic.evaluate(WeatherAgentEnv(n_prompts=6), "tiny-agent", greedy_only=True, eval_split=0.5,
                                 seed=0, baseline=None, rl_max_new_tokens=48)
    prompts = [row["prompt"] for row in report.rows]
    assert len(prompts) % 2 == 1 and len(set(prompts)) == len(prompts), prompts
    assert seen == [len(prompts) + 1]  # one episode a prompt, the last one twice: whole groups of two
    assert all(0.0 <= row["greedy_score"] <= 1.0 and isinstance(row["greedy"], str) for row in report.rows)


@pytest.mark.timeout(900)
def test_a_resumed_run_keeps_its_evaluations_and_its_baseline(digits_env, in_tmp):
    params = GRPOParams(
        model="tiny",
        project_name=str(in_tmp / "resumed"),
        max_steps=2,
        batch_size=4,
        rl_num_generations=2,
        rl_max_new_tokens=4,
        eval_split=0.25,
        eval_steps=1,
        eval_samples=2,
        save_steps=2,
    )
    first = grpo_magic.train(params, digits_env, display=False)
    assert [e["step"] for e in first.evals] == [0, 1, 2]
    again = grpo_magic.train(params.replace(max_steps=3), digits_env, display=False, resume=True)
    assert again.status == "completed", again.reason
    assert [e["step"] for e in again.evals] == [0, 1, 2, 3]  # read back, then one more; no second baseline
    assert [e["baseline"] for e in again.evals] == [True, False, False, False]
