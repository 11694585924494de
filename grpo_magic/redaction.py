"""Access tokens never reach a file we write or a line we print.

Run logs, exported modules, commands, check reports and error messages get shared (a notebook on
GitHub, a CI log, a bug report), so everything that leaves the process goes through ``redact``
first. Three rules, applied in this order (docs/architecture.md, "What is redacted"):

1. the values of environment variables with token-like names (``HF_TOKEN``, ``*_API_KEY``...);
2. the string value of every key whose name contains ``key``, ``token``, ``secret`` or
   ``password`` (any case) in JSON or a Python dict, also inside a JSON string (an
   ``rl_env_config`` inside a run-log line);
3. the shapes of common access tokens (``TOKEN_SHAPES``), wherever they appear.

Hand-written rather than a secret-scanning library: those scan repositories for findings and
report them, while we need a fast, dependency-free rewrite of every line we write.
"""

from __future__ import annotations

import json
import logging
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

#: Words that make a key's string value a secret (rule 2), matched anywhere in the key, any case.
SECRET_KEY_WORDS = ("key", "token", "secret", "password")
_KEY = r"[^\"'\\\s:]*(?:" + "|".join(SECRET_KEY_WORDS) + r")[^\"'\\\s:]*"
# A quoted key holding one of the words, a colon and a string value, in three quotings: "k": "v"
# (JSON, Python), 'k': 'v' (Python), and \"k\": \"v\" (JSON inside a JSON string: an rl_env_config
# in a run-log line). Escapes inside the value are kept whole, so a JSON line stays valid JSON.
_SECRET_KEY_VALUE = re.compile(
    r"(?P<dq>\")(?P<dk>" + _KEY + r")\"(?P<ds>\s*:\s*)\"(?P<dv>(?:[^\"\\]|\\.)*)\""
    r"|(?P<sq>')(?P<sk>" + _KEY + r")'(?P<ss>\s*:\s*)'(?P<sv>(?:[^'\\]|\\.)*)'"
    r"|(?P<eq>\\\")(?P<ek>" + _KEY + r")\\\"(?P<es>\s*:\s*)\\\"(?P<ev>(?:(?!\\\").)*)\\\"",
    re.IGNORECASE,
)
_ALREADY = re.compile(r"<[^<>]* redacted>")
# What follows a key word in every match of _SECRET_KEY_VALUE: the rest of the key, its closing quote, the colon
# and the value's opening quote. Tried only where a key word occurs (``_may_hold_secret_key``): a run-log line
# names "num_tokens" and the like, whose values are numbers, and the full pattern tried at every quote costs more.
_AFTER_KEY_WORD = re.compile(r"[^\"'\\\s:]*\\?[\"']\s*:\s*\\?[\"']")

# Rule 3. The body of a shaped token must look random: at least one digit or capital letter (a
# name such as hf_hub_download or sk-learn-compatible is left alone), or, for hf_, 20 characters.
# Each pattern starts with its literal prefix (checked before it, with a lookbehind) and runs only
# when that prefix is in the text: most lines hold none, and `in` is far faster than a regex.
_NOT_BEFORE = "(?<![A-Za-z0-9]{prefix})"
#: (what, prefix, the rest of the pattern): each shape becomes ``<what redacted>`` wherever it appears.
TOKEN_SHAPES: tuple[tuple[str, str, str], ...] = (
    ("hf token", "hf_", r"(?:(?=[A-Za-z0-9]*[0-9A-Z])[A-Za-z0-9]{8,}|[A-Za-z0-9]{20,})(?![A-Za-z0-9])"),
    ("sk- token", "sk-", r"(?=[A-Za-z0-9_-]*[0-9A-Z])[A-Za-z0-9_-]{16,}"),
    *(("github token", prefix, r"[A-Za-z0-9]{20,}") for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    ("github token", "github_pat_", r"[A-Za-z0-9_]{20,}"),
    ("gitlab token", "glpat-", r"[A-Za-z0-9_-]{20,}"),
    *(("slack token", f"xox{c}-", r"[A-Za-z0-9-]{10,}") for c in "abposr"),
    *(("aws key", prefix, r"[A-Z0-9]{16}(?![A-Za-z0-9])") for prefix in ("AKIA", "ASIA")),
    ("google api key", "AIza", r"[0-9A-Za-z_-]{35}"),
    *(("bearer token", prefix, r"(?=[A-Za-z0-9._~+/=-]*[0-9A-Z])[A-Za-z0-9._~+/=-]{16,}") for prefix in ("Bearer ", "bearer ")),
    ("private key", "-----BEGIN ", r"[A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----"),
)
_SHAPES = [
    (prefix, re.compile(re.escape(prefix) + _NOT_BEFORE.format(prefix=re.escape(prefix)) + rest, re.DOTALL),
     f"{prefix if what == 'bearer token' else ''}<{what} redacted>")
    for what, prefix, rest in TOKEN_SHAPES
]
# Any shape's prefix, in one scan: most lines hold none, and one scan costs less than a `in` per prefix.
_ANY_PREFIX = re.compile("|".join(re.escape(prefix) for _, prefix, _ in TOKEN_SHAPES))


_ENV_SEEN: tuple[dict | None, list[tuple[str, str]]] = (None, [])  # (a copy of the environment, its secrets)


def _secret_values() -> list[tuple[str, str]]:
    """(name, value) of every token-like environment variable, longest value first.

    Read afresh at each call, but rescanned only when the environment changed: comparing it with a
    copy costs a microsecond, decoding every variable thirty (and the dashboard redacts each text
    it shows). ``os.environ._data`` is where CPython keeps it; without it, we scan every time.
    """
    global _ENV_SEEN
    data = getattr(os.environ, "_data", None)
    seen, secrets = _ENV_SEEN
    if data is not None and seen is not None and data == seen:
        return secrets
    found = {
        name: value for name, value in os.environ.items()
        if _is_secret_name(name) and len(value.strip()) >= 8
    }
    secrets = sorted(found.items(), key=lambda kv: -len(kv[1]))
    if isinstance(data, dict):
        _ENV_SEEN = (dict(data), secrets)
    return secrets


_SECRET_NAMES: dict[str, bool] = {}  # name -> looks like a secret's (values are always read afresh)


def _is_secret_name(name: str) -> bool:
    secret = _SECRET_NAMES.get(name)
    if secret is None:
        secret = _SECRET_NAMES[name] = bool(name in SECRET_ENV_VARS or _SECRET_NAME.search(name))
    return secret


def _key_redacted(match: re.Match[str]) -> str:
    form = match.lastgroup[0]  # type: ignore[index]  # d, s or e: the quoting that matched
    quote, key, sep, value = (match[form + part] for part in "qksv")
    if _ALREADY.fullmatch(value):  # rule 1 named it already: keep the more telling name
        return match[0]
    return f"{quote}{key}{quote}{sep}{quote}<redacted>{quote}"


def _may_hold_secret_key(text: str) -> bool:
    """Whether ``_SECRET_KEY_VALUE`` can match: a key word followed by the rest of a key, a quote, a colon and
    a quote (a necessary condition of each of its three forms), looked for only where a key word occurs. Case-folded,
    not lowered: the pattern's IGNORECASE also takes "ſ" for "s", which only casefold() turns into one."""
    lower = text.casefold()
    for word in SECRET_KEY_WORDS:
        start = lower.find(word)
        while start != -1:
            if _AFTER_KEY_WORD.match(lower, start + len(word)):
                return True
            start = lower.find(word, start + 1)
    return False


def redact(text: str) -> str:
    """``text`` without access tokens (the three rules of the module docstring).

    Read from the environment at each call (a notebook may set ``HF_TOKEN`` after import). Applied
    to everything we write or print: run logs, exported modules and commands, the dashboard, the
    terminal progress, check reports and error messages.
    """
    if not isinstance(text, str) or not text:
        return text
    for name, value in _secret_values():
        for form in dict.fromkeys((value, json.dumps(value, ensure_ascii=False)[1:-1])):  # as is, and inside JSON
            if form in text:
                text = text.replace(form, f"<{name} redacted>")
    if _may_hold_secret_key(text):
        text = _SECRET_KEY_VALUE.sub(_key_redacted, text)
    if _ANY_PREFIX.search(text):
        for prefix, pattern, replacement in _SHAPES:
            if prefix in text:
                text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message: for library loggers that quote our data."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def redact_library_logs(names: tuple[str, ...]) -> None:
    """Redact what library loggers that quote our data print (TRL's: ``trl_compat.LIBRARY_LOGGERS``).

    A filter on a logger sees only its own records: hence each name.
    """
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
