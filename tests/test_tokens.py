"""No access token in any file a run writes or any text it prints: by key name and by token shape.

An ``rl_env_config`` holds tokens of the common shapes (``sk-...``, ``ghp_...``, ``github_pat_...``,
an ``hf_...`` shorter than Hugging Face's own) and a password that has no shape at all (caught by
its key's name); the env quotes them in its errors, and one is in every prompt. A real CLI run,
its replayed dashboard, a check report, the printed command, an export and a bad-config error must
hold none of them (docs/architecture.md, "What is redacted").
"""

from __future__ import annotations

import json
import re
import secrets
import string
import sys
from pathlib import Path

import pytest

import grpo_magic
from grpo_magic import GRPOMagicError, GRPOParams, check_env
from grpo_magic.events import EpisodeError
from grpo_magic.frontends.cli import main

REPO = Path(__file__).resolve().parents[1]
ALNUM = string.ascii_letters + string.digits


def _random(n: int) -> str:
    return "".join(secrets.choice(ALNUM) for _ in range(n - 2)) + "Q7"  # random, with a capital and a digit


TOKENS = {
    "api_key": "sk-proj-" + _random(40),
    "github": "ghp_" + _random(36),
    "github_fine": "github_pat_" + _random(22) + "_" + _random(59),
    "hub": "hf_" + _random(12),  # not the 34 characters of a real Hugging Face token
    "db_password": "correct-horse-" + "".join(secrets.choice(string.ascii_lowercase) for _ in range(12)),
}
#: The shapes the issue names, written independently of grpo_magic.redaction.
SHAPES = re.compile(r"sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{10,}")

LEAKY_ENV = '''
import json
from datasets import Dataset


class LeakyEnv:
    """Takes tokens in its config, puts one in every prompt and all of them in its errors."""

    def __init__(self, **secrets):
        self.secrets = secrets
        self.calls = 0

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Call the API with {self.secrets['api_key']} for room {i}: "
                                             for i in range(16)]})

    def score_episode(self, model, tokenizer, completion, **kwargs):
        self.calls += 1
        if self.calls % 2:
            raise PermissionError(f"the hub refused {self.secrets['hub']} and {self.secrets['github']}; "
                                  f"config was {self.secrets!r}; as JSON {json.dumps(self.secrets)}")
        return 0.5
'''


def _assert_clean(text: str, where: str) -> None:
    for name, token in TOKENS.items():
        assert token not in text, f"{name} leaked into {where}"
    found = SHAPES.findall(text)
    assert not found, f"token shapes in {where}: {found}"


@pytest.fixture
def leaky(in_tmp, monkeypatch):
    (in_tmp / "leaky_env.py").write_text(LEAKY_ENV)
    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.delitem(sys.modules, "leaky_env", raising=False)
    return GRPOParams(model="tiny", rl_env_module="leaky_env", rl_env_class="LeakyEnv",
                      rl_env_config=json.dumps(TOKENS), batch_size=8, rl_num_generations=4, rl_max_new_tokens=8,
                      max_steps=5, rl_max_error_rate=1.0, project_name="leaky")


def test_no_token_in_any_file_a_cli_run_writes_or_any_line_it_prints(in_tmp, leaky, cli):
    proc = cli(["train", *leaky.to_cli_args()], cwd=in_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "episode error PermissionError" in proc.stderr and "prompt:" in proc.stderr  # it printed both
    _assert_clean(proc.stdout + proc.stderr, "the terminal")

    out = in_tmp / "leaky"
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 10 and (out / "checkpoint-5" / "trainer_state.json").exists()
    for path in files:
        data = path.read_bytes()
        for name, token in TOKENS.items():
            assert token.encode() not in data, f"{name} leaked into {path}"
        if path.suffix in (".json", ".jsonl", ".md", ".txt", ".jinja", ".yaml"):
            _assert_clean(data.decode("utf-8", "replace"), str(path))
    log = (out / "events.jsonl").read_text()
    assert '\\"db_password\\": \\"<redacted>\\"' in log  # by its key's name, inside the logged rl_env_config
    assert "<sk- token redacted>" in log and "<hf token redacted>" in log and "<github token redacted>" in log
    events = list(grpo_magic.read_run_log(out))  # still valid JSON, event by event
    assert sum(isinstance(e, EpisodeError) for e in events) == 20

    dashboard = grpo_magic.replay(str(out))  # what a notebook shows of it
    dashboard.select_step(1)
    shown = " ".join(str(w.value) for w in (dashboard._header, dashboard._info, dashboard._groups, dashboard._errors))
    assert "PermissionError" in shown and "Call the API with" in shown
    _assert_clean(shown, "the dashboard")


def test_no_token_in_a_check_report_the_command_an_export_or_an_error(leaky, shell, capsys):
    report = check_env(params=leaky, samples=2)
    assert report.error_count
    _assert_clean(str(report), "the check report")
    _assert_clean(report._repr_html_(), "the check report's HTML")

    command = leaky.to_command()
    assert "--rl-env-config" in command
    _assert_clean(command, "the command")
    assert main(["train", *leaky.to_cli_args(), "--dry-run", "--num-processes", "2"]) == 0
    _assert_clean(capsys.readouterr().out, "the dry run")

    cell = (Path("leaky_env.py").read_text() + f"\nFALLBACK = {TOKENS['github']!r}\n")
    shell.run_cell_magic("grpo_env", f"--config '{json.dumps(TOKENS)}'", cell)
    folder = shell.run_line_magic("grpo_export", "LeakyEnv --to cluster")
    for path in folder.iterdir():
        _assert_clean(path.read_text(), str(path))
    _assert_clean(capsys.readouterr().out, "the export's output")

    bad = leaky.replace(rl_env_config=json.dumps({**TOKENS, "max_turns": 3}), rl_env_class="Strict")
    Path("strict_env.py").write_text(LEAKY_ENV.replace("class LeakyEnv:", "class Strict:").replace(
        "self.secrets = secrets", "self.secrets = secrets\n        raise ValueError(f'bad config {secrets}')"))
    with pytest.raises(GRPOMagicError) as info:
        grpo_magic.train(bad.replace(rl_env_module="strict_env"))
    assert "bad config" in str(info.value)
    _assert_clean(str(info.value), "the error")
