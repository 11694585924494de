"""The GPU extra's stack, shown on a CPU (issue 39): TRL settings named as the installed transformers names them,
refusals before a model loads, what reaches ``from_pretrained``, a memory estimate that follows the installed TRL,
the ``vllm`` extra's pin, and vLLM's context for whole episodes.

Unit level: no GRPO training. What CUDA would decide is stood in for at its one query (``torch.cuda.is_available``,
the compute capability); transformers 5.17's ``TrainingArguments`` is stood in for by its field names.
"""

from __future__ import annotations

import pytest

from grpo_magic import GRPOMagicError, GRPOParams
from grpo_magic import trl_settings as ts

# ---------------------------------------------------------------- 1. checkpointing: the installed transformers' names

#: The pair as transformers 5.17 declares it: only the old names (read from its wheel's training_args.py).
FIELDS_5_17 = ("gradient_checkpointing", "gradient_checkpointing_kwargs")
#: ... and as 5.24 does: the new names, the old ones kept as deprecated aliases.
FIELDS_5_24 = ("activation_checkpointing", "activation_checkpointing_kwargs", *FIELDS_5_17)


def test_the_setting_is_the_name_the_installed_transformers_has_and_the_other_its_alias():
    assert ts.aliases_for(FIELDS_5_17) == {"activation_checkpointing": "gradient_checkpointing",
                                           "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}
    assert ts.aliases_for(FIELDS_5_24) == {"gradient_checkpointing": "activation_checkpointing",
                                           "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}
    assert ts.aliases_for(("learning_rate",)) == {}
    installed = {f.name for f in ts.config_fields()}
    assert dict(ts.ALIASES) == ts.aliases_for(installed)


@pytest.fixture
def transformers_5_17(monkeypatch):
    """The installed GRPOConfig's fields without the names transformers 5.17 lacks (the activation_* pair)."""
    real = ts.config_fields()
    monkeypatch.setattr(ts, "config_fields", lambda: tuple(f for f in real if not f.name.startswith("activation_")))
    cached = (ts._installed_aliases, ts.settings, ts.setting_of, ts.unsettable, ts._own_names, ts.config_defaults)

    def clear():
        for function in cached:
            function.cache_clear()

    clear()
    yield
    monkeypatch.undo()
    clear()


@pytest.mark.parametrize("given", ["gradient_checkpointing", "activation_checkpointing"])
def test_both_checkpointing_names_set_gradient_checkpointing_on_transformers_5_17(transformers_5_17, given):
    assert "activation_checkpointing" not in ts.settings() and "gradient_checkpointing" in ts.settings()
    names = [f.name for f in GRPOParams.fields()]
    explicit, trl = ts.route({given: False}, names, GRPOParams.flag)
    assert (explicit, trl) == ({}, {"gradient_checkpointing": False})
    with pytest.raises(GRPOMagicError, match="same setting .*activation_checkpointing is its new name"):
        ts.route({"gradient_checkpointing": True, "activation_checkpointing": False}, names, GRPOParams.flag)


@pytest.mark.parametrize("given", ["gradient_checkpointing", "activation_checkpointing"])
def test_both_checkpointing_flags_reach_the_installed_grpo_config(given):
    from grpo_magic.cli import build_parser, params_from_namespace

    setting = "activation_checkpointing" if "activation_checkpointing" in ts.settings() else "gradient_checkpointing"
    args = build_parser().parse_args(["train", "--model", "tiny", f"--no-{given.replace('_', '-')}"])
    params = params_from_namespace(args)
    assert params.trl_settings == {setting: False}
    assert GRPOParams(model="tiny", **{given: True}).trl_settings == {setting: True}
    config = ts.build_config(GRPOParams(model="tiny", **{given: False}).grpo_config_kwargs("out"))
    assert config.gradient_checkpointing is False and getattr(config, setting) is False


# ---------------------------------------------------------------- 2. QLoRA with vLLM: refused before a model loads


def test_load_in_4bit_with_use_vllm_is_refused_in_one_sentence(capsys, monkeypatch):
    from grpo_magic.cli import main

    with pytest.raises(GRPOMagicError, match=r"cannot be used with --use-vllm.*drop --use-vllm") as caught:
        GRPOParams(model="tiny", peft=True, load_in_4bit=True, use_vllm=True).validate()
    message = str(caught.value)
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence, on any machine (no GPU check first)
    assert GRPOParams(model="tiny", peft=True, use_vllm=True).problems() == []
    monkeypatch.setattr("grpo_magic.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv",
                 "--peft", "--load-in-4bit", "--use-vllm", "--dry-run"])
    assert code == 2 and "cannot be used with --use-vllm" in capsys.readouterr().err
