"""Security: no access token in anything we write, run logs are data only, cells run in the user's namespace."""

from __future__ import annotations

import json
import re

import pytest
from datasets import Dataset

import grpo_magic
import grpo_magic.frontends.magics
from grpo_magic import GRPOMagicError, GRPOParams, read_run_log, train
from grpo_magic.events import RunStarted, StepLogged
from grpo_magic.redaction import redact

FAKE_HF = "hf_FAKE123abcdefghijklmnopqrstuvwxyz"
FAKE_WANDB = "wandb-fake-0123456789abcdef"
FAKE_TOOL = "tool-secret-9876543210"
LITERAL_HF = "hf_" + "Q" * 34  # an HF token that is in no variable: caught by its shape
SECRETS = (FAKE_HF, FAKE_WANDB, FAKE_TOOL, LITERAL_HF)
FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0)


@pytest.fixture
def tokens(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_HF)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_WANDB)
    monkeypatch.setenv("HOTEL_TOOL_API_KEY", FAKE_TOOL)


def _assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", text)


class LeakyEnv:
    """An env that takes a token in its config and puts tokens into its error messages."""

    def __init__(self, api_key: str = "", wandb: str = "") -> None:
        self.api_key = api_key
        self.calls = 0

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Book room {i}: " for i in range(8)]})

    def score_episode(self, model, tokenizer, completion, **kwargs):
        self.calls += 1
        if self.calls % 2:
            import os

            raise PermissionError(f"hub refused token {os.environ['HF_TOKEN']} (also tried {LITERAL_HF}, "
                                  f"{self.api_key})")
        return 0.5


def test_no_token_reaches_the_run_log_the_command_or_the_errors(in_tmp, tokens):
    params = GRPOParams(**FAST, max_steps=2, rl_max_error_rate=1.0,
                        rl_env_config=json.dumps({"api_key": FAKE_TOOL, "wandb": FAKE_WANDB}))
    run = train(params, LeakyEnv)
    assert run.status == "completed" and run.error_count == 8
    log_text = run.run_log.read_text()
    _assert_clean(log_text)
    assert "<HF_TOKEN redacted>" in log_text and "<hf token redacted>" in log_text
    assert "<HOTEL_TOOL_API_KEY redacted>" in log_text  # in RunStarted's params and in the tracebacks
    for error in run.errors:  # what the dashboard and the terminal show
        _assert_clean(error["message"] + error["traceback"])
    events = list(read_run_log(run.output_dir))  # the redacted log is still valid JSON lines
    assert isinstance(events[0], RunStarted) and sum(isinstance(e, StepLogged) for e in events) == 2
    command = params.to_command()
    _assert_clean(command)
    assert "--rl-env-config" in command


def test_a_failed_runs_reason_quotes_the_traceback_without_the_token(in_tmp, tokens):
    with pytest.raises(GRPOMagicError) as info:
        train(GRPOParams(**FAST, max_steps=2, rl_max_error_rate=0.1), LeakyEnv)
    assert "PermissionError" in str(info.value)
    _assert_clean(str(info.value))
    _assert_clean((grpo_magic.last_run().output_dir / "events.jsonl").read_text())


def test_redact_leaves_ordinary_text_alone(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("HF_TOKEN_PATH", "/root/.cache/huggingface/token")  # a path, not a token
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to be one: would mangle ordinary text
    text = "tokenizers false /root/.cache/huggingface/token abc hf_short"
    assert redact(text) == text


@pytest.mark.unit
def test_redact_finds_a_secret_keys_string_value_in_each_quoting_and_leaves_numbers_alone():
    """Rule 2 is tried only where a key word is followed by a quote, a colon and a quote: each quoting still matches."""
    secret = "s3cr3t-value-123"
    cases = {
        f'{{"api_key": "{secret}", "num_tokens": 12}}': '{"api_key": "<redacted>", "num_tokens": 12}',
        f"{{'Password': '{secret}'}}": "{'Password': '<redacted>'}",
        f'{{"rl_env_config": "{{\\"my_token\\": \\"{secret}\\"}}"}}':
            '{"rl_env_config": "{\\"my_token\\": \\"<redacted>\\"}"}',
        f'{{"\u017fecret": "{secret}"}}': '{"\u017fecret": "<redacted>"}',  # the pattern's IGNORECASE takes ſ for s
    }
    for text, expected in cases.items():
        assert redact(text) == expected, text
    line = '{"metrics": {"num_tokens": 12.0, "completions/mean_length": 3.5}, "tokens_seen": 40}'
    assert redact(line) == line


ENV_CELL = f'''
from datasets import Dataset

HOTEL_KEY = "{LITERAL_HF}"
CELL_ONLY_NAME = 42

class TokenEnv:
    def __init__(self, key="{FAKE_HF}"):
        self.key = key

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({{"prompt": ["Say a: "] * 8}})

    def score_episode(self, model, tokenizer, completion, **kwargs):
        return 0.5
'''




def test_exported_modules_launch_scripts_and_printed_commands_hold_no_token(shell, in_tmp, tokens, capsys):
    shell.run_cell_magic("grpo_env", f'--config {{"key": "{FAKE_WANDB}"}}', ENV_CELL)
    module = shell.run_line_magic("grpo_export", "TokenEnv --to token_env.py")
    folder = shell.run_line_magic("grpo_export", "TokenEnv --to cluster")
    printed = capsys.readouterr().out
    written = [module, *sorted(p for p in folder.iterdir() if p.is_file())]
    assert len(written) >= 3
    for path in written:
        _assert_clean(path.read_text())
    _assert_clean(printed)
    assert "<hf token redacted>" in module.read_text()
    compile(module.read_text(), str(module), "exec")  # still a module (the token was inside a string)


def test_a_grpo_env_cell_runs_in_the_users_namespace_only(shell):
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    assert shell.user_ns["CELL_ONLY_NAME"] == 42 and "TokenEnv" in shell.user_ns
    for module in (grpo_magic, grpo_magic.frontends.magics, grpo_magic.environment.env):
        assert "CELL_ONLY_NAME" not in vars(module) and "TokenEnv" not in vars(module)


def test_replay_reads_the_log_as_data_and_ignores_what_is_not_an_event(in_tmp):
    out = in_tmp / "run"
    out.mkdir()
    pwned = in_tmp / "pwned"
    good = StepLogged(step=1, metrics={"reward": 0.5}, max_steps=2).to_dict()
    lines = [
        {"type": f"__import__('os').system('touch {pwned}')", "step": 1},
        {"type": "step_logged", "step": f"__import__('os').system('touch {pwned}')", "metrics": {}},
        {"type": "step_logged", "metrics": {"reward": 1.0}},  # no step
        {"type": "run_started", "params": "!!python/object/apply:os.system ['touch pwned']", "env_name": "x",
         "model": "m", "output_dir": str(out)},
        {"type": "group_scored", "step": 1, "group": "0", "prompt": 1, "completions": "c", "scores": [],
         "advantages": [], "errors": [], "clipped": []},
        {"type": "run_finished", "status": {"__reduce__": "os.system"}},
        {"__class__": "subprocess.Popen", "args": ["touch", str(pwned)]},
        ["not", "an", "object"],
        good,
    ]
    (out / "events.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n"
                                      + "cos\nsystem\n(S'touch pwned'\ntR.\n")  # a pickle, as text
    events = list(read_run_log(out))
    assert [e.to_dict() for e in events] == [good]
    dashboard = grpo_magic.replay(str(out))
    assert dashboard.step == 1
    dashboard.select_step(1)  # reads the step's groups from the log: the malformed one is skipped
    assert not pwned.exists() and not (in_tmp / "pwned").exists()


@pytest.mark.parametrize("url", ["file:///etc/passwd", "javascript:alert(1)", "ws://10.0.0.2:8000", "10.0.0.2:8000"])
def test_the_vllm_server_url_must_be_http(url):
    with pytest.raises(GRPOMagicError, match="http:// or https://"):
        GRPOParams(model="tiny", use_vllm=True, vllm_mode="server", vllm_server_url=url).validate()
