"""Reading a magic's line: JSON objects typed unquoted, shell quoting, and every mistake as one ``UsageError``.

``magics`` parses every line here, so that ``%grpo_train --rl-env-config {"a": 1}`` reads as a user typed it.
"""

from __future__ import annotations

import argparse
import re
import shlex

from IPython.core.error import UsageError

from .cli import ArgumentError, OneLineParser, add_param_arguments


def train_parser(*, trl: bool = True) -> OneLineParser:
    parser = OneLineParser(prog="%grpo_train", description="Train with GRPO on a registered env (shows a form "
                           "unless --run is given).", add_help=False)
    parser.add_argument("--env", help="name of an env registered with %%grpo_env or register_env()")
    parser.add_argument("--run", action="store_true", help="start training at once instead of showing the form")
    parser.add_argument("--blocking", action="store_true",
                        help="train in the foreground (default: a background thread, so Stop works; Colab: foreground)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the output folder")
    add_param_arguments(parser, trl=trl)
    return parser


_JSON_FLAG = re.compile(r"(--config|--rl-env-config)(\s+|=)(?=\{)")


def _inside_quotes(line: str, pos: int) -> bool:
    """True when ``pos`` is inside a shell-quoted part of ``line`` (as shlex reads it)."""
    quote, escaped = "", False
    for ch in line[:pos]:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
    return bool(quote)


def _quote_json_values(line: str) -> str:
    """Quote an unquoted JSON object after --config/--rl-env-config, as users type it in a cell.

    shlex would eat the JSON's double quotes (``{"a": 1}`` becomes ``{a: 1}``).
    """
    out, pos = [], 0
    for match in _JSON_FLAG.finditer(line):
        if match.start() < pos or _inside_quotes(line, match.start()):  # already quoted by the user
            continue
        start = match.end()
        depth, in_string, escaped, end = 0, False, False, None
        for i in range(start, len(line)):
            ch = line[i]
            if in_string:
                escaped = ch == "\\" and not escaped
                if ch == '"' and not escaped:
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        if end is None:
            break
        out.append(line[pos:start] + shlex.quote(line[start:end]))
        pos = end
    out.append(line[pos:])
    return "".join(out)


def parse_line(parser: OneLineParser, line: str) -> argparse.Namespace:
    try:
        words = shlex.split(_quote_json_values(line))
    except ValueError as exc:  # unbalanced quotes
        raise UsageError(f"{parser.prog}: cannot read the line ({exc}); check the quotes.") from None
    try:  # not in the try above: ArgumentError is a ValueError too, and is no quoting problem
        return parser.parse_args(words)
    except ArgumentError as exc:
        raise UsageError(str(exc)) from None
