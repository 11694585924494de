"""Envs from other libraries (``grpo_magic.adapters``): TRL reward functions and reasoning-gym tasks.

Real runs on the offline ``tiny`` model through each adapter, ``%grpo_check`` on each, a reasoning-gym
task defined in a ``%%grpo_env`` cell by assignment, rescoring from the logged columns, the CLI
through a module that assigns an adapter's class, and what a reward function can get wrong.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from datasets import Dataset

from grpo_magic import GRPOMagicError, GRPOParams, read_run_log, register_env, rescore, train
from grpo_magic.adapters import from_reasoning_gym, from_reward_funcs
from grpo_magic.environment.reward import EnvReward
from grpo_magic.events import GroupScored

FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)
LETTERS = "abcd"


def _letters_dataset(n: int = 16) -> Dataset:
    """Each prompt names its letter, and the row says it again in two columns a reward function reads."""
    return Dataset.from_dict({
        "prompt": [f"Write the letter {LETTERS[i % 4]} many times: " for i in range(n)],
        "letter": [LETTERS[i % 4] for i in range(n)],
        "row": list(range(n)),
    })


def test_reward_functions_train_on_tiny_with_every_argument_trl_passes(tmp_path):
    calls: list[dict] = []

    def has_letter(prompts, completions, letter, row, completion_ids, trainer_state, log_metric, **kwargs):
        calls.append({"prompts": list(prompts), "letter": list(letter), "row": list(row), "n": len(completions),
                      "ids": completion_ids, "step": trainer_state.global_step, "kinds": {type(c) for c in completions}})
        log_metric("custom/letters_seen", float(len(letter)))
        kwargs["log_extra"]("letter_again", list(letter))
        return [float(ch in c) for c, ch in zip(completions, letter, strict=True)]

    async def brevity(completions, **kwargs):
        return [1.0 - min(1.0, len(c) / 40) for c in completions]

    env = from_reward_funcs([has_letter, brevity], _letters_dataset(), weights=[3, 1])
    run = train(GRPOParams(**FAST, max_steps=2, project_name=str(tmp_path / "run")), env, display=False)
    assert run.status == "completed", run.reason

    # TRL called each function once per batch, with the whole batch and its columns
    assert [c["step"] for c in calls] == [0, 1] and all(c["n"] == 8 for c in calls)
    for c in calls:
        assert c["kinds"] == {str}  # text prompts: text completions, as TRL gives them
        for prompt, letter, row in zip(c["prompts"], c["letter"], c["row"], strict=True):
            assert prompt == f"Write the letter {letter} many times: " and LETTERS[row % 4] == letter
        assert len(c["ids"]) == 8 and all(isinstance(t, int) for ids in c["ids"] for t in ids)
    # the score is the weighted mean, each function a component
    last = run.history[-1]
    assert {"components/has_letter", "components/brevity", "custom/letters_seen"} <= set(last)
    for group in run.groups:
        for score, parts in zip(group["scores"], group["components"], strict=True):
            assert set(parts) == {"has_letter", "brevity"}
            assert math.isclose(score, (3 * parts["has_letter"] + parts["brevity"]) / 4, abs_tol=1e-6)


def _reward(env_cls: type, tokenizer=None) -> EnvReward:
    reward = EnvReward(env_cls())
    reward.bind(None, tokenizer)
    return reward


def test_none_is_left_out_of_the_mean_and_all_none_is_an_episode_error():
    def first(prompts, completions, **kwargs):
        return [1.0, None, None, float("nan")]

    def second(prompts, completions, **kwargs):
        return [0.0, 0.5, None, None]

    ds = Dataset.from_dict({"prompt": ["p"] * 4})
    reward = _reward(from_reward_funcs([first, second], ds))
    record = reward.score(prompts=["p"] * 4, completions=["a", "b", "c", "d"])
    scores = record.scores
    assert scores[:2] == [0.5, 0.5] and scores[2] is None and scores[3] is None
    outcomes = record.outcomes
    assert outcomes[0].components == {"first": 1.0, "second": 0.0} and outcomes[1].components == {"second": 0.5}
    assert "No reward function of positive weight scored completion 2" in outcomes[2].error["message"]


def test_a_function_returning_the_wrong_number_of_values_is_one_sentence_naming_it():
    def two_few(prompts, completions, **kwargs):
        return [1.0]

    reward = _reward(from_reward_funcs(two_few, Dataset.from_dict({"prompt": ["p"] * 3})))
    record = reward.score(prompts=["p"] * 3, completions=["a", "b", "c"])
    assert record.scores == [None, None, None]
    messages = {o.error["message"] for o in record.outcomes}
    assert len(messages) == 1
    message = messages.pop()
    assert "Reward function 'two_few' returned 1 value for 3 completions" in message
    assert "return one value per completion" in message and "\n" not in message


def test_a_wrong_length_stops_a_real_run_at_its_first_step_with_that_sentence(tmp_path):
    def broken(prompts, completions, **kwargs):
        return [0.5] * (len(completions) + 1)

    env = from_reward_funcs(broken, _letters_dataset())
    run = train(GRPOParams(**FAST, max_steps=3, project_name=str(tmp_path / "run")), env, display=False,
                raise_on_failure=False)
    assert run.status == "failed" and run.step <= 1
    assert "Reward function 'broken' returned 9 values for 8 completions" in run.reason


@pytest.mark.parametrize(("func", "columns", "words"), [
    (lambda completions: [0.0], [], ["does not accept 'prompts'", "add **kwargs"]),
    (lambda prompts, completions, completion_ids, trainer_state, log_extra, log_metric: [0.0], ["answer"],
     ["does not accept 'answer'", "a dataset column"]),
    (lambda prompts, completions, solution, **kw: [0.0], ["answer"], ["needs 'solution'", "answer", "give it a default"]),
    (lambda prompts, completions, /, **kw: [0.0], [], ["positionally only", "remove the '/'"]),
])
def test_a_signature_trl_cannot_call_is_refused_when_the_env_is_made(func, columns, words):
    ds = Dataset.from_dict({"prompt": ["p"] * 2, **{c: ["x"] * 2 for c in columns}})
    with pytest.raises(GRPOMagicError) as info:
        from_reward_funcs(func, ds)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(("weights", "words"), [
    ([1.0], ["weights has 1 value for 2 reward functions (a, b)", "one weight per function"]),
    ([1.0, -1.0], ["weights[1] is -1.0", "at least 0"]),
    ([0, 0], ["all 0", "positive weight"]),
    ("12", ["list of numbers"]),
])
def test_bad_weights_are_one_sentence(weights, words):
    def a(prompts, completions, **kw):
        return [0.0] * len(completions)

    def b(prompts, completions, **kw):
        return [0.0] * len(completions)

    with pytest.raises(GRPOMagicError) as info:
        from_reward_funcs([a, b], Dataset.from_dict({"prompt": ["p"]}), weights=weights)
    for word in words:
        assert word in str(info.value)


def test_the_dataset_may_be_a_dataframe_or_rows_and_needs_a_prompt_column(capsys):
    import pandas as pd

    def f(prompts, completions, **kw):
        return [0.0] * len(completions)

    env = from_reward_funcs(f, pd.DataFrame({"prompt": ["a", "b"], "x": [1, 2]}))
    assert env.dataset.column_names == ["prompt", "x"]
    assert "from_reward_funcs got a pandas DataFrame; converted it with Dataset.from_pandas (2 rows)" in (
        capsys.readouterr().err)
    assert from_reward_funcs(f, [{"prompt": "a"}]).dataset["prompt"] == ["a"]
    with pytest.raises(GRPOMagicError, match="has no 'prompt' column .columns: text.; add the prompts"):
        from_reward_funcs(f, [{"text": "a"}])


def test_chat_prompts_give_chat_completions_and_check_reports_the_env(shell):
    seen: list = []

    def polite(prompts, completions, **kwargs):
        seen.extend(completions)
        return [float("please" in c[0]["content"]) for c in completions]

    rows = [{"prompt": [{"role": "user", "content": f"Ask for item {i} politely."}], "item": i} for i in range(8)]
    shell.user_ns.update(polite=polite, rows=rows)
    shell.run_cell_magic("grpo_env", "", "from grpo_magic.adapters import from_reward_funcs\n"
                                         "Polite = from_reward_funcs([polite], rows)\n")
    report = shell.run_line_magic("grpo_check", "Polite --samples 2 --rl-max-new-tokens 4")
    assert report.env == "Polite" and report.episodes == 8 and report.error_count == 0
    assert seen and all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen)


def test_reasoning_gym_scores_with_the_task_and_states_its_answer_format():
    env = from_reasoning_gym("basic_arithmetic", size=5, seed=7)()
    data = env.build_dataset(None)
    assert data.column_names == ["prompt", "answer", "source_index"] and len(data) == 5
    system, user = data[0]["prompt"]
    assert system["role"] == "system" and "<answer>" in system["content"] and system["content"] == env.instruction
    assert user["content"].startswith("Calculate")
    right = env.score_episode(None, None, f"thinking... <answer>{data[0]['answer']}</answer>", source_index=0)
    wrong = env.score_episode(None, None, "<answer>nope</answer>", source_index=0)
    bare = env.score_episode(None, None, str(data[0]["answer"]), source_index=0)
    assert right == {"score": 1.0, "answer_format": 1.0}
    assert wrong["score"] < 1.0 and wrong["answer_format"] == 1.0
    assert bare == {"score": 0.0, "answer_format": 0.0}  # the stated format is the only one scored


def test_reasoning_gym_in_a_cell_by_assignment_checks_trains_and_rescores(shell):
    spec = shell.run_cell_magic("grpo_env", "", "from grpo_magic.adapters import from_reasoning_gym\n"
                                                "Gym = from_reasoning_gym('basic_arithmetic', size=16, seed=3)\n")
    assert spec.name == "Gym" and spec.cls is shell.user_ns["Gym"] and spec.attr_name == "Gym"
    report = shell.run_line_magic("grpo_check", "Gym --samples 2 --rl-max-new-tokens 4")
    assert report.episodes == 8 and report.error_count == 0
    run = shell.run_line_magic("grpo_train", "--env Gym --model tiny --max-steps 2 --batch-size 8 "
                                             "--rl-num-generations 4 --rl-max-new-tokens 8 --run --blocking "
                                             "--project-name gym-run")
    assert run.status == "completed", run.reason
    assert "components/answer_format" in run.history[-1]
    logged = [e for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)]
    assert logged and all({"source_index", "answer", "prompt"} <= set(e.columns) for e in logged)  # chat prompts
    again = shell.run_line_magic("grpo_rescore", "--env Gym")
    assert again.summary["completions"] == 16
    assert [g["new_scores"] for g in again.groups] == [g["old_scores"] for g in again.groups]


def test_reasoning_gym_mistakes_are_one_sentence():
    with pytest.raises(GRPOMagicError, match=r"no task 'basic_arithmatic' \(close names: basic_arithmetic"):
        from_reasoning_gym("basic_arithmatic")
    with pytest.raises(GRPOMagicError, match="has no setting 'max_termz'; use min_terms, max_terms"):
        from_reasoning_gym("basic_arithmetic", max_termz=3)
    with pytest.raises(GRPOMagicError, match="refused its config"):
        from_reasoning_gym("basic_arithmetic", min_terms=5, max_terms=2)
    with pytest.raises(GRPOMagicError, match="seed must be a whole number"):
        from_reasoning_gym("basic_arithmetic", seed=None)


def test_an_env_instance_registers_and_trains(tmp_path):
    from envs.letters import LettersEnv

    spec = register_env(LettersEnv(), "Letters")
    assert spec.instance is not None and spec.cls is None
    with pytest.raises(GRPOMagicError, match="pass the class with the config, or the instance alone"):
        register_env(LettersEnv(), "L2", config={"x": 1})
    run = train(GRPOParams(**FAST, max_steps=1, project_name=str(tmp_path / "run")), "Letters", display=False)
    assert run.status == "completed", run.reason


def test_the_cli_trains_an_adapter_class_a_module_assigns(tmp_path, cli):
    (tmp_path / "gym_envs.py").write_text("from grpo_magic.adapters import from_reasoning_gym\n\n"
                                          "Arith = from_reasoning_gym('basic_arithmetic', size=64)\n")
    base = ["train", "--model", "tiny", "--rl-env-module", "gym_envs",
            "--rl-env-class", "Arith", "--max-steps", "1", "--batch-size", "8", "--rl-num-generations", "4",
            "--rl-max-new-tokens", "4", "--project-name", str(tmp_path / "run"), "--quiet"]
    good = cli([*base, "--rl-env-config", '{"size": 8, "max_terms": 3}'], cwd=tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    assert "completed after 1 steps" in good.stderr
    bad = cli([*base, "--rl-env-config", '{"sizes": 8}'], cwd=tmp_path)
    assert bad.returncode == 2
    assert "does not accept 'sizes' from rl_env_config (it takes min_terms, max_terms" in bad.stderr


def test_rescoring_reward_functions_reads_the_logged_columns(tmp_path):
    def has_letter(prompts, completions, letter, **kwargs):
        return [float(ch in c) for c, ch in zip(completions, letter, strict=True)]

    env = from_reward_funcs(has_letter, _letters_dataset())
    run = train(GRPOParams(**FAST, max_steps=1, project_name=str(tmp_path / "run")), env, display=False)
    assert run.status == "completed", run.reason

    def strict(prompts, completions, letter, completion_ids, **kwargs):
        assert all(isinstance(ids, list) for ids in completion_ids)  # re-read from the logged text
        return [float(c.count(ch) >= 2) for c, ch in zip(completions, letter, strict=True)]

    report = rescore(run, from_reward_funcs(strict, _letters_dataset()))
    for group in report.groups:
        letter = group["prompt"].split()[3]
        assert group["new_scores"] == [float(c.count(letter) >= 2) for c in group["completions"]]


def test_build_dataset_may_return_a_dataframe_or_rows_and_says_so_in_one_line(shell, capsys, tmp_path):
    cell = ("import pandas as pd\n\nclass FrameEnv:\n    def build_dataset(self, tokenizer):\n"
            "        return pd.DataFrame({'prompt': ['Write the letter a many times: '] * 8, 'letter': ['a'] * 8})\n\n"
            "    def score_episode(self, model, tokenizer, completion, letter):\n"
            "        return float(letter in completion)\n")
    shell.run_cell_magic("grpo_env", "", cell)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("FrameEnv.build_dataset() returned a pandas DataFrame; converted it with "
                                     "Dataset.from_pandas (8 rows).") in err
    run = train(GRPOParams(**FAST, max_steps=1, project_name=str(tmp_path / "run")), "FrameEnv", display=False)
    assert run.status == "completed", run.reason
    assert {e.columns.get("letter") for e in read_run_log(run.output_dir) if isinstance(e, GroupScored)} == {"a"}
    shell.run_cell_magic("grpo_env", "", cell.replace(
        "pd.DataFrame({'prompt': ['Write the letter a many times: '] * 8, 'letter': ['a'] * 8})",
        "[{'prompt': 'Write b: ', 'letter': 'b'}] * 4"))
    assert "returned a list of dicts; converted it with Dataset.from_list (4 rows)." in capsys.readouterr().err


def test_an_assigned_env_exports_under_its_name(shell, capsys):
    shell.run_cell_magic("grpo_env", "", "from grpo_magic.adapters import from_reasoning_gym\n"
                                         "Gym = from_reasoning_gym('basic_arithmetic', size=8)\n")
    target = shell.run_line_magic("grpo_export", "Gym --to gym_env.py")
    assert "--rl-env-module gym_env --rl-env-class Gym" in capsys.readouterr().out
    namespace: dict = {}
    exec(compile(Path(target).read_text(), str(target), "exec"), namespace)  # noqa: S102 - the file just written
    assert namespace["Gym"].task == "basic_arithmetic"
