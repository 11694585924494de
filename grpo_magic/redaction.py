"""Access tokens never reach a file we write or a line we print.

Run logs, exported modules, commands and error messages get shared (a notebook on GitHub, a CI
log, a bug report), so everything that leaves the process goes through ``redact`` first. See
docs/architecture.md, "What is redacted".
"""

from __future__ import annotations

import json
import os
import re

#: Environment variables that hold access tokens; their values never reach a file we write.
SECRET_ENV_VARS = (
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_API_TOKEN", "WANDB_API_KEY",
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GITHUB_TOKEN", "GH_TOKEN", "COMET_API_KEY", "NEPTUNE_API_TOKEN",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
)
#: Names that look like a secret's: a token an env reads from, e.g., MY_TOOL_API_KEY is scrubbed too.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|API_KEY|SECRET|SECRET_KEY|ACCESS_KEY|PASSWORD)$", re.IGNORECASE)
#: Hugging Face access tokens, wherever they come from (a cell, an exception message).
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")


def _secret_values() -> list[tuple[str, str]]:
    """(name, value) of every token-like environment variable, longest value first."""
    found = {
        name: value for name, value in os.environ.items()
        if _is_secret_name(name) and len(value.strip()) >= 8
    }
    return sorted(found.items(), key=lambda kv: -len(kv[1]))


_SECRET_NAMES: dict[str, bool] = {}  # name -> looks like a secret's (values are always read afresh)


def _is_secret_name(name: str) -> bool:
    secret = _SECRET_NAMES.get(name)
    if secret is None:
        secret = _SECRET_NAMES[name] = bool(name in SECRET_ENV_VARS or _SECRET_NAME.search(name))
    return secret


def redact(text: str) -> str:
    """``text`` without access tokens: known token variables' values and ``hf_...`` tokens.

    Read from the environment at each call (a notebook may set ``HF_TOKEN`` after import). Applied
    to everything we write (run logs, exported modules and commands), since those get shared.
    """
    if not isinstance(text, str) or not text:
        return text
    for name, value in _secret_values():
        for form in dict.fromkeys((value, json.dumps(value, ensure_ascii=False)[1:-1])):  # as is, and inside JSON
            if form in text:
                text = text.replace(form, f"<{name} redacted>")
    return _HF_TOKEN.sub("<hf token redacted>", text)
