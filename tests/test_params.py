"""GRPOParams: one declaration drives validation, the CLI flags and the TRL config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_magic import GRPOMagicError, GRPOParams
from grpo_magic.frontends.cli import build_parser, main, params_from_namespace

BASE = dict(model="tiny", rl_env_module="envs.letters", rl_env_class="LettersEnv")

# (field changes, CLI flags, words the message must contain)
BAD_PARAMS = [
    ({"trainer": "ppo"}, ["--trainer", "ppo"], ["trainer", "grpo"]),
    ({"rl_num_generations": 1}, ["--rl-num-generations", "1"], ["rl_num_generations", "at least 2"]),
    ({"batch_size": 6}, ["--batch-size", "6"], ["not divisible by rl_num_generations 4", "--batch-size 4 or 8"]),
    ({"lr": 0.0}, ["--lr", "0"], ["lr", "greater than 0"]),
    ({"lr": -1e-5}, ["--lr=-1e-5"], ["lr", "greater than 0"]),
    ({"rl_top_p": 0.0}, ["--rl-top-p", "0"], ["rl_top_p", "greater than 0"]),
    ({"rl_top_p": 1.5}, ["--rl-top-p", "1.5"], ["rl_top_p", "at most 1"]),
    ({"rl_temperature": 0.0}, ["--rl-temperature", "0"], ["rl_temperature", "greater than 0"]),
    ({"vllm_mode": "remote"}, ["--vllm-mode", "remote"], ["vllm_mode", "colocate"]),
    ({"use_vllm": True, "vllm_mode": "server"}, ["--use-vllm", "--vllm-mode", "server"],
     ["--vllm-server-url", "trl vllm-serve"]),
    ({"vllm_server_url": "ftp://x:1"}, ["--vllm-server-url", "ftp://x:1"], ["http://", "vllm_server_url"]),
    ({"vllm_gpu_memory_utilization": 1.0}, ["--vllm-gpu-memory-utilization", "1"], ["less than 1"]),
    ({"vllm_gpu_memory_utilization": 0.0}, ["--vllm-gpu-memory-utilization", "0"], ["greater than 0"]),
    ({"rl_env_config": "[1, 2]"}, ["--rl-env-config", "[1, 2]"], ["rl_env_config", "JSON object"]),
    ({"rl_env_config": "{max_turns: 3}"}, ["--rl-env-config", "{max_turns: 3}"], ["rl_env_config", "not valid JSON"]),
    ({"model": None}, None, ["model", "required", "tiny"]),
    ({"rl_env_class": None}, None, ["rl_env_class", "--rl-env-module"]),
]


@pytest.mark.parametrize(("changes", "flags", "words"), BAD_PARAMS)
def test_bad_params_raise_one_clear_sentence_from_the_api(changes, flags, words):
    with pytest.raises(GRPOMagicError) as info:
        GRPOParams(**{**BASE, **changes}).validate()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(("changes", "flags", "words"), [b for b in BAD_PARAMS if b[1]])
def test_bad_params_exit_2_with_one_line_from_the_cli(changes, flags, words, capsys, in_tmp):
    code = main(["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv", *flags])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err


def test_unknown_flag_and_bad_type_are_one_line_exit_2(capsys):
    assert main(["train", "--model", "tiny", "--no-such-flag", "1"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err
    assert main(["train", "--model", "tiny", "--lr", "fast"]) == 2
    err = capsys.readouterr().err
    assert "--lr" in err and "fast" in err and len(err.strip().splitlines()) == 1


@pytest.mark.process
def test_cli_in_a_fresh_process_prints_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_magic", "train", "--model", "tiny", "--rl-env-module", "x", "--rl-env-class",
         "Y", "--rl-num-generations", "1"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "rl_num_generations" in proc.stderr


def test_defaults_follow_the_original_description():
    p = GRPOParams()
    assert (p.trainer, p.rl_num_generations, p.rl_max_new_tokens) == ("grpo", 4, 128)
    assert (p.rl_temperature, p.rl_top_k, p.rl_top_p, p.rl_kl_coef, p.rl_clip_range) == (1.0, 50, 1.0, 0.1, 0.2)
    assert (p.use_vllm, p.vllm_mode, p.vllm_gpu_memory_utilization) == (False, "colocate", 0.3)
    assert (p.vllm_server_url, p.vllm_tensor_parallel_size, p.vllm_server_gpus) == (None, 1, 1)
    assert (p.epochs, p.batch_size, p.lr, p.peft, p.lora_r, p.lora_alpha) == (1, 4, 1e-5, False, 16, 32)
    assert p.report_to == "none"


def test_every_field_has_help_and_a_form_group():
    from grpo_magic.config.params import GROUPS

    for f in GRPOParams.fields():
        assert f.metadata.get("help"), f.name
        assert f.metadata.get("group") in GROUPS, f.name


def test_seed_flags_are_all_generated():
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    flags = {opt for action in train._actions for opt in action.option_strings}
    seed_flags = (
        "--model --trainer --rl-env-module --rl-env-class --rl-env-config --rl-num-generations --rl-max-new-tokens "
        "--rl-top-k --rl-top-p --rl-temperature --rl-kl-coef --rl-clip-range --use-vllm --vllm-mode "
        "--vllm-gpu-memory-utilization --vllm-server-url --vllm-tensor-parallel-size --vllm-server-gpus --epochs "
        "--batch-size --lr --peft --lora-r --lora-alpha"
    ).split()
    assert set(seed_flags) <= flags


def test_command_round_trips_through_the_cli_parser():
    p = GRPOParams(**BASE, rl_env_config='{"max_turns": 5, "difficulty": "hard"}', peft=True, lr=3e-4,
                   rl_num_generations=8, batch_size=8, max_steps=7, rl_episode_timeout=2.5)
    args = p.to_cli_args()
    parsed = params_from_namespace(build_parser().parse_args(["train", *args]))
    assert parsed == p
    assert p.to_command().startswith("grpo-magic train --model tiny")


def test_grpo_config_mapping(tmp_path):
    p = GRPOParams(**BASE, rl_num_generations=8, batch_size=16, rl_max_new_tokens=32, rl_temperature=0.7,
                   rl_top_k=20, rl_top_p=0.9, rl_kl_coef=0.05, rl_clip_range=0.3, epochs=2, lr=2e-5,
                   gradient_accumulation=2, max_steps=9, vllm_server_url="http://127.0.0.1:8000")
    c = p.to_grpo_config(str(tmp_path))
    assert c.num_generations == 8 and c.per_device_train_batch_size == 16
    assert c.max_completion_length == 32 and c.temperature == 0.7 and c.top_k == 20 and c.top_p == 0.9
    assert c.beta == 0.05 and c.epsilon == 0.3 and c.num_train_epochs == 2 and c.learning_rate == 2e-5
    assert c.gradient_accumulation_steps == 2 and c.max_steps == 9
    assert c.vllm_server_base_url == "http://127.0.0.1:8000"
    assert c.bf16 is False  # no bf16 on this CPU
    assert c.report_to in ([], "none", ["none"])


def test_unknown_parameter_is_named():
    with pytest.raises(GRPOMagicError, match="'rl_num_generation'"):
        GRPOParams().replace(rl_num_generation=4)


@pytest.mark.parametrize("value", ["4", 2.5, True, float("nan")])
def test_wrong_types_are_clear_errors(value):
    with pytest.raises(GRPOMagicError, match="rl_num_generations"):
        GRPOParams(**{**BASE, "rl_num_generations": value}).validate()
