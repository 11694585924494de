"""Every GRPOConfig setting of the installed TRL reaches every surface; recipes equal TRL's paper index;
the memory estimate; the must-show CLI run whose saved training_args hold each value."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl import GRPOConfig

from grpo_magic import GRPOParams
from grpo_magic.config import trl_settings as ts
from grpo_magic.config.memory import count_parameters, estimate
from grpo_magic.config.recipes import RECIPES
from grpo_magic.frontends.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
#: The checkpointing setting as the installed transformers names it (5.24: activation_checkpointing, 5.17:
#: gradient_checkpointing); both flags and both keyword names reach it.
CHECKPOINTING = ts.ALIASES.get("gradient_checkpointing", "gradient_checkpointing")

#: TRL's paper index (docs/source/paper_index in huggingface/trl at 0fbbe3b2bb0bd98730d5d223495cd7cb627f253d),
#: each entry's GRPOConfig(...) as written there.
PAPER_INDEX = {
    "grpo": dict(
        loss_type="grpo",
        beta=0.001,
        epsilon=10.0,
        num_generations=16,
        max_completion_length=32_768,
        steps_per_generation=16,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=128,
    ),
    "gspo": dict(
        importance_sampling_level="sequence",
        loss_type="grpo",
        beta=0.0,
        epsilon=3e-4,
        epsilon_high=4e-4,
        gradient_accumulation_steps=1,
        steps_per_generation=4,
    ),
    "dapo": dict(
        mask_truncated_completions=True,
        loss_type="dapo",
        epsilon_high=0.28,
        epsilon=0.2,
        per_device_train_batch_size=512,
        num_generations=16,
        max_completion_length=20480,
        beta=0.0,
    ),
    "dr_grpo": dict(
        loss_type="dr_grpo", per_device_train_batch_size=1, num_generations=8, max_completion_length=3000, beta=0.0
    ),
    "lite_ppo": dict(
        scale_rewards="batch",
        loss_type="dapo",
        beta=0.0,
        top_p=0.99,
        top_k=100,
        temperature=0.99,
        num_generations=8,
        num_iterations=1,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=32,
        steps_per_generation=8,
    ),
    "cispo": dict(
        loss_type="cispo", epsilon_high=5.0, num_generations=16, scale_rewards="batch", cast_lm_head_to_fp32=True
    ),
    "sapo": dict(loss_type="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, scale_rewards="group"),
}


@pytest.mark.parametrize("name", sorted(PAPER_INDEX))
def test_each_recipe_is_the_paper_index_entry(name):
    recipe = RECIPES[name]
    assert {**recipe.settings, **recipe.scale} == PAPER_INDEX[name]
    assert not set(recipe.settings) & set(recipe.scale)
    params = GRPOParams(model="tiny", recipe=name)
    for key, value in recipe.settings.items():
        assert getattr(params, key) == value, key  # applied, by its TRL name
        assert params.grpo_config_kwargs()[key] == value
    for field in ts.config_fields():
        assert field.name not in recipe.settings or field.name in {**ts.settings(), **ts.EXPLICIT}


def test_explicit_settings_win_over_the_recipe():
    params = GRPOParams(model="tiny", recipe="dapo", beta=0.3, epsilon_high=0.5)
    assert params.rl_kl_coef == 0.3 and params.epsilon_high == 0.5 and params.mask_truncated_completions is True
    assert params.replace(recipe="gspo").importance_sampling_level == "sequence"
    assert params.replace(recipe="gspo").rl_kl_coef == 0.3  # what the user set stays
    assert "--recipe dapo" in params.to_command() and "--beta" not in params.to_command()


def test_every_settable_grpo_config_field_is_in_help_form_and_params(shell):
    from grpo_magic.frontends.form import TrainForm

    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    form = TrainForm(GRPOParams(model="tiny"), None)
    declared = {f.metadata["trl"]: f.name for f in GRPOParams.fields() if f.metadata.get("trl")}
    missing = []
    for field in dataclasses.fields(GRPOConfig):
        name = field.name
        if name in ts.OWNED:
            with pytest.raises(Exception, match="grpo_magic owns"):
                GRPOParams(model="tiny", **{name: "x"})
            continue
        if name in ts.unsettable():
            continue
        setting = ts.resolve_name(name)
        flag = GRPOParams.flag(declared.get(setting, setting))
        in_help = f"{flag} " in text or f"{flag}," in text or f"--{name.replace('_', '-')}" in text
        in_form = declared.get(setting) in form.fields or setting in form.trl_fields
        in_params = setting in declared or setting in GRPOParams.trl_fields()
        if not (in_help and in_form and in_params):
            missing.append((name, in_help, in_form, in_params))
    assert not missing
    assert len(ts.unsettable()) <= 1  # parallelism_config, an object


def test_the_form_shows_trls_help_text(shell):
    from grpo_magic.frontends.form import TrainForm

    form = TrainForm(GRPOParams(model="tiny", scale_rewards="none"), None)
    trl_help = next(f for f in dataclasses.fields(GRPOConfig) if f.name == "scale_rewards").metadata["help"]
    assert form.trl_fields["scale_rewards"].tooltip == trl_help.replace("%%", "%")
    assert form.trl_box.children[0].children[0].description == "scale_rewards"  # a set value comes first
    form.trl_search.value = "entropy quantile"
    shown = [row.children[0].description for row in form.trl_box.children]
    assert "top_entropy_quantile" in shown and "scale_rewards" not in shown and len(shown) < 5


def test_the_must_show_run_trains_with_each_value(in_tmp):
    out = in_tmp / "run"
    cmd = [
        sys.executable,
        "-m",
        "grpo_magic",
        "train",
        "--model",
        "tiny",
        "--rl-env-module",
        "envs.letters",
        "--rl-env-class",
        "LettersEnv",
        "--recipe",
        "dapo",
        "--scale-rewards",
        "none",
        "--num-iterations",
        "2",
        "--activation-checkpointing",
        "--lr-scheduler-type",
        "cosine",
        "--warmup-steps",
        "0.1",
        "--max-steps",
        "2",
        "--rl-max-new-tokens",
        "8",
        "--project-name",
        str(out),
        "--quiet",
    ]
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    args = torch.load(out / "training_args.bin", weights_only=False)
    assert (args.scale_rewards, args.num_iterations, getattr(args, CHECKPOINTING)) == ("none", 2, True)
    assert (str(args.lr_scheduler_type.value), args.warmup_steps) == ("cosine", 0.1)
    assert (args.loss_type, args.epsilon_high, args.mask_truncated_completions, args.beta) == ("dapo", 0.28, True, 0.0)
    started = json.loads(next(line for line in (out / "events.jsonl").open() if '"run_started"' in line))
    assert started["params"]["recipe"] == "dapo"
    assert started["trl_config"]["scale_rewards"] == "none" and started["trl_config"]["epsilon_high"] == 0.28


#: Qwen2.5-0.5B-Instruct's config.json (its values, as published on the hub).
QWEN_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_memory_estimate_for_qwen_half_a_billion(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_05B))
    n, _ = count_parameters(str(tmp_path))
    assert n == 494_032_768  # Qwen2.5-0.5B's published count, from the config alone
    full = estimate(GRPOParams(model=str(tmp_path), rl_max_new_tokens=512), card="T4")
    # a T4 trains in fp16 mixed precision: float32 weights, gradients and AdamW moments (device.load_dtype)
    assert (full.terms["weights"], full.terms["gradients"], full.terms["optimizer"]) == (4 * n, 4 * n, 8 * n)
    a100 = estimate(GRPOParams(model=str(tmp_path), rl_max_new_tokens=512), card="A100")
    # an A100 trains in bf16 weights: bf16 gradients and moments too
    assert (a100.terms["weights"], a100.terms["gradients"], a100.terms["optimizer"]) == (2 * n, 2 * n, 4 * n)
    fp32 = estimate(GRPOParams(model=str(tmp_path), rl_max_new_tokens=512, bf16=False), card="A100")
    assert fp32.terms["weights"] == 4 * n and fp32.terms["activations"] == 2 * a100.terms["activations"]
    qlora = estimate(GRPOParams(model=str(tmp_path), peft=True, rl_max_new_tokens=512), card="T4")
    assert qlora.terms["weights"] == 2 * n + 4 * qlora.trainable  # the frozen base in fp16, adapters float32
    assert qlora.terms["optimizer"] == 8 * qlora.trainable
    assert full.card_bytes == 16e9 and "T4" in full.text()
    lora = estimate(GRPOParams(model=str(tmp_path), peft=True, rl_max_new_tokens=512), card="T4")
    assert lora.total < full.total and lora.trainable < n / 50
    no_ckpt = estimate(
        GRPOParams(model=str(tmp_path), activation_checkpointing=False, rl_max_new_tokens=512), card="T4"
    )
    assert no_ckpt.terms["activations"] > 5 * full.terms["activations"]
    big = estimate(
        GRPOParams(
            model=str(tmp_path),
            batch_size=64,
            rl_num_generations=8,
            rl_max_new_tokens=4096,
            activation_checkpointing=False,
        ),
        card="T4",
    )
    assert big.fits is False and 1 <= len(big.fixes) <= 2
    assert any("--activation-checkpointing" in f or "--batch-size" in f for f in big.fixes)  # the biggest savings
    assert "does not fit on T4" in big.text() and big.fixes[0] in big.text()


def test_memory_estimate_for_tiny_matches_the_loaded_model():
    from transformers import AutoModelForCausalLM

    from grpo_magic.models import tiny_model_path

    est = estimate(GRPOParams(model="tiny"), card="L4")
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    assert est.parameters == sum(p.numel() for p in loaded.parameters())
    assert est.fits is True and "fits on L4" in est.text()


def test_memory_estimate_for_the_other_offline_models_is_without_a_build_or_the_hub(monkeypatch):
    """tiny-math is tiny fine-tuned (tiny's config); tiny-agent is tiny resized for its copy circuit (its own config,
    read from the shipped folder). Neither builds the model nor asks the Hub (it used to ask the Hub for
    'tiny-agent', and wait through its retries before saying 'no estimate')."""
    import grpo_magic.models as models
    from grpo_magic.models.warmstart import WarmStart
    from research.tiny_agent.copy_circuit import SIZES

    def no_build(*args: object) -> None:
        raise AssertionError("the estimate built an offline model")

    monkeypatch.delenv("GRPO_MAGIC_BUILD_MODELS", raising=False)
    monkeypatch.setattr(WarmStart, "build", no_build)
    tiny = estimate(GRPOParams(model="tiny"), card="T4")
    math = estimate(GRPOParams(model="tiny-math"), card="T4")
    assert (math.parameters, math.total) == (tiny.parameters, tiny.total)
    agent = estimate(GRPOParams(model="tiny-agent"), card="T4")
    n, config = count_parameters(config=models.tiny_agent_config())
    assert agent.parameters == n and config.hidden_size == SIZES["hidden_size"] != tiny_hidden(models)
    assert agent.parameters != tiny.parameters and agent.total > 0


def tiny_hidden(models) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(models.tiny_model_path())).hidden_size


def test_the_exported_launch_folder_carries_trl_settings_and_the_recipe():
    from grpo_magic.frontends.cli import params_from_namespace
    from grpo_magic.frontends.export import launch_script

    params = GRPOParams(
        model="tiny",
        recipe="gspo",
        scale_rewards="batch",
        lr_scheduler_kwargs={"num_cycles": 2},
        activation_checkpointing=False,
    )
    script = launch_script(params, "LettersEnv")
    for line in (
        "--recipe gspo",
        "--scale-rewards batch",
        f"--no-{CHECKPOINTING.replace('_', '-')}",  # the installed transformers' name
        "--lr-scheduler-kwargs '{\"num_cycles\": 2}'",
    ):
        assert line in script, line
    argv = params.to_cli_args()
    again = params_from_namespace(build_parser().parse_args(["train", *argv]))
    assert again.grpo_config_kwargs() == params.grpo_config_kwargs()


def test_gradient_and_activation_checkpointing_are_one_setting_named_as_the_installed_transformers_names_it():
    assert CHECKPOINTING in {f.name for f in dataclasses.fields(GRPOConfig)}
    from grpo_magic.frontends.cli import params_from_namespace

    for flag in ("--no-gradient-checkpointing", "--no-activation-checkpointing"):
        params = params_from_namespace(build_parser().parse_args(["train", "--model", "tiny", flag]))
        assert params.trl_settings == {CHECKPOINTING: False}, flag
    assert getattr(GRPOParams(model="tiny", gradient_checkpointing=True), CHECKPOINTING) is True
    assert getattr(GRPOParams(model="tiny", activation_checkpointing=True), CHECKPOINTING) is True
    with pytest.raises(Exception, match="(old|new) name"):
        GRPOParams(model="tiny", activation_checkpointing=True, gradient_checkpointing=False)


def test_fp16_and_bf16_unset_mean_chosen_for_the_device_and_a_value_wins():
    auto = GRPOParams(model="tiny").grpo_config_kwargs()
    assert auto["bf16"] is False and not auto.get("fp16")  # this CPU: neither
    assert GRPOParams(model="tiny", bf16=False, fp16=False).grpo_config_kwargs()["fp16"] is False
    chosen = GRPOParams(model="tiny", fp16=True).grpo_config_kwargs()
    assert chosen["fp16"] is True and chosen["bf16"] is False


def test_grpo_check_says_whether_the_run_fits_before_checking(shell, capsys):
    from tests.test_magics import _env_cell

    _env_cell(shell, score="0.5")
    shell.run_line_magic("grpo_check", "CountEnv --model tiny --samples 2 --rl-max-new-tokens 4 --card T4")
    out = capsys.readouterr().out
    assert "will it fit: tiny:" in out and "fits on T4 (16 GB)" in out and "optimizer" in out


def test_checking_trls_rules_keeps_accelerates_state():
    """A run training in this process needs accelerate's state: the check builds its config on that state."""
    from accelerate.state import PartialState

    state = PartialState(cpu=True)
    PartialState._shared_state["grpo_magic_test_marker"] = "a run's state"  # a reset would drop it
    before = dict(PartialState._shared_state)
    assert GRPOParams(model="tiny", scale_rewards="batch").problems() == []
    assert PartialState._shared_state == before and PartialState().device == state.device
    problem = GRPOParams(model="tiny", generation_batch_size=6).problems()
    assert problem and "--generation-batch-size" in problem[0][1] and PartialState._shared_state == before
    del PartialState._shared_state["grpo_magic_test_marker"]
