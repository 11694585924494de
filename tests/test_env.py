"""Loading and validating environments, before any model loads."""

from __future__ import annotations

import textwrap

import pytest
from datasets import Dataset

from grpo_magic import GRPOMagicError, GRPOParams, register_env
from grpo_magic.environment.env import (
    ENV_PROMPT_COLUMN,
    get_env,
    load_module_env,
    prepare_env,
    registered_envs,
    resolve_env,
)

PARAMS = GRPOParams(model="tiny")


class GoodEnv:
    def __init__(self, max_turns=3, difficulty="normal"):
        self.max_turns, self.difficulty = max_turns, difficulty

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["a", "b"], "case_idx": [0, 1]})

    def score_episode(self, model, tokenizer, completion, case_idx):
        return 0.5


def _write_module(folder, name, body):
    (folder / f"{name}.py").write_text(textwrap.dedent(body))


def test_module_env_loads_from_the_current_folder(in_tmp):
    (in_tmp / "my_envs").mkdir()
    (in_tmp / "my_envs" / "__init__.py").write_text("")
    _write_module(in_tmp / "my_envs", "hotel_env", """
        class HotelEnv:
            def __init__(self, max_turns=3): self.max_turns = max_turns
            def build_dataset(self, tokenizer): return None
            def score_episode(self, model, tokenizer, completion, case_idx): return 1.0
    """)
    params = GRPOParams(model="tiny", rl_env_module="my_envs.hotel_env", rl_env_class="HotelEnv",
                        rl_env_config='{"max_turns": 5}')
    spec = resolve_env(params)
    assert spec.cls.__name__ == "HotelEnv" and spec.source == "module"
    assert spec.instantiate().max_turns == 5


@pytest.mark.parametrize(("module", "cls", "words"), [
    ("no_such_module_xyz", "Env", ["no_such_module_xyz", "--rl-env-module"]),
    ("json", "NoSuchClass", ["'json'", "NoSuchClass", "--rl-env-class"]),
    ("json", "dumps", ["not a class"]),
])
def test_bad_module_or_class_is_named(module, cls, words):
    with pytest.raises(GRPOMagicError) as info:
        load_module_env(module, cls)
    for word in words:
        assert word in str(info.value)


def test_module_that_raises_on_import_is_named(in_tmp):
    _write_module(in_tmp, "broken_env", "raise RuntimeError('db down')\n")
    with pytest.raises(GRPOMagicError, match=r"'broken_env' raised RuntimeError: db down"):
        load_module_env("broken_env", "X")


def test_missing_methods_are_named():
    class NoScore:
        def build_dataset(self, tokenizer):
            return None

    with pytest.raises(GRPOMagicError, match="no score_episode"):
        register_env(NoScore)

    class NoBuild:
        def score_episode(self, model, tokenizer, completion):
            return 0.0

    with pytest.raises(GRPOMagicError, match="no build_dataset"):
        resolve_env(PARAMS, NoBuild)


def test_unknown_config_key_is_named():
    with pytest.raises(GRPOMagicError) as info:
        resolve_env(GRPOParams(model="tiny", rl_env_config='{"max_turn": 5}'), GoodEnv)
    assert "'max_turn'" in str(info.value) and "max_turns, difficulty" in str(info.value)


def test_registry_replaces_and_names_missing():
    register_env(GoodEnv, "hotel", config={"max_turns": 2})
    register_env(GoodEnv, "hotel", config={"max_turns": 4})
    assert get_env("hotel").config == {"max_turns": 4}
    assert list(registered_envs()) == ["hotel"]
    with pytest.raises(GRPOMagicError, match="No environment named 'nope'.*registered: hotel"):
        get_env("nope")
    assert resolve_env(PARAMS, "hotel").instantiate().max_turns == 4


def test_no_env_at_all_says_how_to_give_one():
    with pytest.raises(GRPOMagicError, match="--rl-env-module and --rl-env-class"):
        resolve_env(PARAMS)


class _Tok:
    """A stand-in tokenizer for checks that never render prompts."""


@pytest.mark.parametrize(("dataset", "words"), [
    (["a", "b"], ["must return a datasets.Dataset, a pandas DataFrame or a list of dicts", "got a list of str",
                  "Dataset.from_dict"]),
    ([{"prompt": "a"}, {"prompt": 3}], ["list of dicts that datasets could not convert", "one type"]),
    (Dataset.from_dict({"text": ["a"]}), ["without a 'prompt' column", "columns: text"]),
    (Dataset.from_dict({"prompt": []}), ["empty dataset"]),
    (Dataset.from_dict({"prompt": [1, 2]}), ["prompt 0 is a int", "chat messages"]),
])
def test_bad_datasets_are_named(dataset, words):
    class Env:
        def build_dataset(self, tokenizer):
            return dataset

        def score_episode(self, model, tokenizer, completion):
            return 0.0

    with pytest.raises(GRPOMagicError) as info:
        prepare_env(resolve_env(PARAMS, Env), _Tok())
    for word in words:
        assert word in str(info.value)


def test_build_dataset_raising_is_named():
    class Env:
        def build_dataset(self, tokenizer):
            raise KeyError("rooms")

        def score_episode(self, model, tokenizer, completion):
            return 0.0

    with pytest.raises(GRPOMagicError, match=r"Env.build_dataset\(\) raised KeyError"):
        prepare_env(resolve_env(PARAMS, Env), _Tok())


def test_score_episode_argument_missing_from_dataset_is_named():
    class Env:
        def build_dataset(self, tokenizer):
            return Dataset.from_dict({"prompt": ["a"]})

        def score_episode(self, model, tokenizer, completion, case_idx):
            return 0.0

    with pytest.raises(GRPOMagicError, match="needs 'case_idx'.*no such column"):
        prepare_env(resolve_env(PARAMS, Env), _Tok())


@pytest.mark.parametrize("tools", ["search", [{"type": "function"}], [{"function": {"name": ""}}]])
def test_bad_tools_are_named(tools):
    class Env(GoodEnv):
        def get_tools(self):
            return tools

    with pytest.raises(GRPOMagicError, match="get_tools"):
        prepare_env(resolve_env(PARAMS, Env), _Tok())


def test_tools_are_rendered_into_the_prompt_the_model_sees(tiny_path):
    from grpo_magic.models import load_tokenizer

    class ToolEnv(GoodEnv):
        def get_tools(self):
            return [{"type": "function", "function": {
                "name": "search_rooms", "description": "Search free rooms",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

    tokenizer = load_tokenizer(tiny_path)
    prepared = prepare_env(resolve_env(PARAMS, ToolEnv), tokenizer)
    rendered = prepared.dataset[0]["prompt"]
    assert isinstance(rendered, str) and "search_rooms" in rendered and "a" in rendered
    assert prepared.dataset[0][ENV_PROMPT_COLUMN] == "a"  # the env still gets its own prompt
    ids = tokenizer(rendered)["input_ids"]
    assert "search_rooms" in tokenizer.decode(ids)
