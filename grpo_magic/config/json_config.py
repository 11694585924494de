"""JSON configs read safely: too long, too deep or holding a number too big is one sentence, never a traceback.

``params`` checks ``rl_env_config`` with it, and the magics and the form check ``--config`` the same way.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: The longest JSON config: it travels as one argument on the command line of launched processes (Linux takes at
#: most 128 KiB in one) and into the run log's first line.
MAX_JSON_CHARS = 100_000
#: The deepest nesting of a JSON config: past it, copying or writing the config recurses too deep.
MAX_JSON_DEPTH = 100
_DATA_FILE_FIX = ("put the data in a file that the env reads and pass its path in the config instead, such as "
                  "'{\"cases_file\": \"cases.json\"}'")


def _json_depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (a scalar is 0, ``[1]`` is 1), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_json(value: str, label: str, *, example: str = "'{\"max_turns\": 3}'",
               data_fix: str = _DATA_FILE_FIX) -> tuple[Any, str | None]:
    """A JSON text parsed, or the one sentence that says why it cannot be: invalid, too long, too deep, a number too big.

    ``example`` is what the fix for invalid JSON shows; ``data_fix`` is the way out for a config too big to pass.
    """
    if len(value) > MAX_JSON_CHARS:
        return None, (f"{label} is {len(value):,} characters long, more than the {MAX_JSON_CHARS:,} a config may have "
                      f"(it is passed on the command line of launched processes); {data_fix}.")
    too_deep = f"{label} nests deeper than {MAX_JSON_DEPTH} levels of lists or objects; flatten it, or {data_fix}."
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return None, f"{label} is not valid JSON ({exc.msg} at character {exc.pos}); write it as JSON, e.g. {example}."
    except RecursionError:  # Python's parser recurses once per level
        return None, too_deep
    except ValueError:  # an int past Python's limit on the digits it reads (sys.get_int_max_str_digits)
        return None, (f"{label} holds a number of more than {sys.get_int_max_str_digits()} digits, too long to read; "
                      f"write it as a string, or {data_fix}.")
    if _json_depth(parsed) > MAX_JSON_DEPTH:
        return None, too_deep
    return parsed, None
