"""The catalogue of bad inputs: what a user can get wrong, and the words the answer must contain.

Each row is tried on every surface it names (see ``tests/test_bad_inputs.py``):

- ``api``: ``grpo_magic.train(...)`` raises ``GRPOMagicError``;
- ``cli``: ``grpo_magic.cli.main([...])`` returns 2 with one line on stderr;
- ``magic``: ``%grpo_train ... --run --blocking`` in a real InteractiveShell raises ``UsageError``;
- ``cell``: a ``%%grpo_env`` cell (the env source as the cell) raises ``UsageError``.

Every answer must be one line, come before the model loads, and contain ``words``. Rows about
parameter ranges are generated from ``GRPOParams`` metadata, so a new field is covered at once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from grpo_magic import GRPOParams

ALL = ("api", "cli", "magic")
ENV_SURFACES = ("api", "cli", "magic", "cell")

#: A good environment; rows replace one of its parts.
GOOD_PARTS: dict[str, str] = {
    "imports": "from datasets import Dataset\n",
    "init": "    def __init__(self, letter='a'):\n        self.letter = letter\n",
    "build": (
        "    def build_dataset(self, tokenizer):\n"
        "        return Dataset.from_dict({'prompt': ['Say a: '] * 8, 'case_idx': list(range(8))})\n"
    ),
    "score": (
        "    def score_episode(self, model, tokenizer, completion, **kwargs):\n"
        "        return completion.count(self.letter) / max(1, len(completion))\n"
    ),
    "tools": "",
}


def env_source(**parts: str) -> str:
    """The source of a module with one class ``Env``, built from the good parts and ``parts``."""
    merged = {**GOOD_PARTS, **parts}
    return merged["imports"] + "\n\nclass Env:\n" + "".join(merged[k] for k in ("init", "build", "score", "tools"))


@dataclass(frozen=True)
class BadInput:
    """One bad input: params changes (API; CLI flags are derived), an env source, the expected words."""

    id: str
    words: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()  # more CLI/magic flags (the rest are derived from ``params``)
    raw_line: str = ""  # appended to the magic's line as typed (not shell-quoted)
    env: str | None = None  # module source with class Env (None: envs.letters:LettersEnv)
    surfaces: tuple[str, ...] = ALL
    cell_line: str = ""  # the %%grpo_env line for the "cell" surface
    setup: str | None = None  # "fake_vllm", "active_run", "pyproject", "checkpoint"
    api_kwargs: dict[str, Any] = field(default_factory=dict)  # more keyword arguments of train()
    #: setup "checkpoint": the output folder holds a complete checkpoint-2 of a run with the base
    #: params and these changes ("processes": how many processes trained it).
    checkpoint: dict[str, Any] = field(default_factory=dict)


def _build(body: str) -> dict[str, str]:
    return {"build": "    def build_dataset(self, tokenizer):\n" + body}


ENV_ROWS: list[BadInput] = [
    BadInput("env module missing", ("'no_such_envs'", "--rl-env-module"),
             params={"rl_env_module": "no_such_envs.hotel", "rl_env_class": "Env"}),
    BadInput("env class missing", ("has no class 'Nope'", "environment classes there: Env", "--rl-env-class"),
             params={"rl_env_class": "Nope"}, env=env_source()),
    BadInput("env class is not a class", ("not a class", "--rl-env-class"),
             params={"rl_env_class": "Env"}, env="Env = 3\n"),
    BadInput("env module import fails", ("no_such_dependency_xyz", "install what it imports"),
             env="import no_such_dependency_xyz\n" + env_source()),
    BadInput("env module syntax error", ("syntax error",), env=env_source() + "\ndef broken(:\n"),
    BadInput("env module raises on import", ("RuntimeError", "configure me first", "fix the module"),
             env="raise RuntimeError('configure me first')\n"),
    BadInput("no build_dataset", ("build_dataset",), env=env_source(build=""), surfaces=ENV_SURFACES),
    BadInput("no score_episode", ("score_episode",), env=env_source(score=""), surfaces=ENV_SURFACES),
    BadInput("build_dataset raises (multi-line message)", ("build_dataset", "ValueError", "rows file missing"),
             env=env_source(**_build("        raise ValueError('rows file missing\\nsee docs\\nmore')\n")),
             surfaces=ENV_SURFACES),
    BadInput("build_dataset returns a list", ("datasets.Dataset", "list", "Dataset.from_dict"),
             env=env_source(**_build("        return [{'prompt': 'hi'}]\n")), surfaces=ENV_SURFACES),
    BadInput("build_dataset returns None", ("datasets.Dataset", "NoneType"),
             env=env_source(**_build("        pass\n")), surfaces=ENV_SURFACES),
    BadInput("empty dataset", ("empty dataset", "at least one prompt"),
             env=env_source(**_build("        return Dataset.from_dict({'prompt': []})\n")), surfaces=ENV_SURFACES),
    BadInput("no prompt column", ("'prompt' column", "question"),
             env=env_source(**_build("        return Dataset.from_dict({'question': ['hi'] * 4})\n")),
             surfaces=ENV_SURFACES),
    BadInput("prompts are numbers", ("prompt 0", "int", "not a string or a list of chat messages"),
             env=env_source(**_build("        return Dataset.from_dict({'prompt': [1, 2, 3, 4]})\n")),
             surfaces=ENV_SURFACES),
    BadInput("prompts are malformed messages", ("prompt 0", "list", "not a string or a list of chat messages"),
             env=env_source(**_build("        return Dataset.from_dict({'prompt': [[{'text': 'hi'}]] * 4})\n")),
             surfaces=ENV_SURFACES),
    BadInput("an empty prompt", ("prompt 1 is empty",),
             env=env_source(**_build("        return Dataset.from_dict({'prompt': ['hi', '  ', 'ho']})\n")),
             surfaces=ENV_SURFACES),
    BadInput("get_tools returns a dict", ("get_tools", "list of function schemas", "dict"),
             env=env_source(tools="    def get_tools(self):\n        return {'name': 'book'}\n"),
             surfaces=ENV_SURFACES),
    BadInput("get_tools returns strings", ("get_tools", "item 0", "not a function schema"),
             env=env_source(tools="    def get_tools(self):\n        return ['book_room']\n"),
             surfaces=ENV_SURFACES),
    BadInput("get_tools raises", ("get_tools", "KeyError", "fix get_tools"),
             env=env_source(tools="    def get_tools(self):\n        raise KeyError('tools')\n"),
             surfaces=ENV_SURFACES),
    BadInput("score_episode takes too few arguments", ("score_episode", "(model, tokenizer, completion"),
             env=env_source(score="    def score_episode(self, completion):\n        return 0.5\n"),
             surfaces=ENV_SURFACES),
    BadInput("score_episode needs a column the dataset lacks", ("room_id",),
             env=env_source(score="    def score_episode(self, model, tokenizer, completion, room_id):\n"
                                  "        return 0.5\n"),
             surfaces=ENV_SURFACES),
    BadInput("rl_env_config unknown key", ("does not accept 'max_turns'", "letter"),
             params={"rl_env_config": '{"max_turns": 3}'}, env=env_source(), surfaces=ENV_SURFACES,
             cell_line='--config {"max_turns": 3}'),
    BadInput("constructor raises on the config", ("ValueError", "letter must be one character", "constructor"),
             params={"rl_env_config": '{"letter": "abc"}'},
             env=env_source(init="    def __init__(self, letter='a'):\n"
                                 "        if len(letter) != 1:\n"
                                 "            raise ValueError('letter must be one character')\n"
                                 "        self.letter = letter\n"),
             surfaces=ENV_SURFACES, cell_line='--config {"letter": "abc"}'),
    BadInput("rl_env_config not JSON", ("not valid JSON", '{"max_turns": 3}'),
             params={"rl_env_config": "{max_turns: 3}"}, surfaces=ENV_SURFACES, env=env_source(),
             cell_line="--config '{max_turns: 3}'"),
    BadInput("rl_env_config not an object", ("JSON object", "list"),
             params={"rl_env_config": "[1, 2]"}, surfaces=ENV_SURFACES, env=env_source(), cell_line="--config '[1, 2]'"),
]

#: %%grpo_env cells that are wrong in themselves (the "cell" surface only).
CELL_ROWS: list[BadInput] = [
    BadInput("cell with a syntax error", ("syntax error at line 2",), env="x = 1\ndef f(:\n    pass\n",
             surfaces=("cell",)),
    BadInput("cell with two env classes", ("2 environment classes", "Env, Other", "%%grpo_env Env"),
             env=env_source() + "\n\nclass Other(Env):\n    pass\n", surfaces=("cell",)),
    BadInput("cell with no class", ("defines no class",), env="x = 1\n", surfaces=("cell",)),
    BadInput("cell raising", ("ZeroDivisionError", "fix the cell"), env="x = 1 / 0\n", surfaces=("cell",)),
    BadInput("cell naming a class it lacks", ("Env", "score_episode"), env=env_source(score=""),
             surfaces=("cell",), cell_line="Env"),
]

#: Bad params that are not about ranges (ranges are generated below).
PARAM_ROWS: list[BadInput] = [
    BadInput("trainer not grpo", ("trainer", "must be one of grpo", "'ppo'"), params={"trainer": "ppo"}),
    BadInput("loss type unknown", ("rl_loss_type", "dapo"), params={"rl_loss_type": "ppo"}),
    BadInput("batch not divisible by generations", ("not divisible by rl_num_generations 4", "--batch-size 4 or 8"),
             params={"batch_size": 6}),
    BadInput("generations do not divide batch x accumulation", ("not divisible by rl_num_generations 3",),
             params={"batch_size": 4, "gradient_accumulation": 1, "rl_num_generations": 3}),
    BadInput("max new tokens past the context", ("rl_max_new_tokens 4096", "context of 2048", "--rl-max-new-tokens"),
             params={"rl_max_new_tokens": 4096}),
    BadInput("model path missing", ("./models/missing", "does not exist"), params={"model": "./models/missing"}),
    BadInput("model id missing offline", ("'nobody-xyz/no-such-model'", "not found", "HF_HUB_OFFLINE", "tiny"),
             params={"model": "nobody-xyz/no-such-model"}),
    BadInput("model is a file", ("is a file, not a folder",), params={"model": "./pyproject.toml"},
             setup="pyproject"),
    BadInput("no model", ("model", "required", "tiny"), params={"model": None}, surfaces=("api", "cli")),
    BadInput("only the env module", ("rl_env_class", "--rl-env-module"), params={"rl_env_class": None}),
    BadInput("no env at all", ("No environment", "--rl-env-module"),
             params={"rl_env_module": None, "rl_env_class": None}),
    BadInput("use vllm without vllm installed", ("vllm package", "pip install", "drop --use-vllm"),
             params={"use_vllm": True}),
    BadInput("use vllm without a GPU", ("CUDA GPU", "drop --use-vllm"), params={"use_vllm": True},
             setup="fake_vllm"),
    BadInput("server mode without a URL", ("--vllm-server-url", "trl vllm-serve"),
             params={"use_vllm": True, "vllm_mode": "server"}),
    BadInput("server mode with an unreachable server", ("http://127.0.0.1:9", "does not answer", "trl vllm-serve"),
             params={"use_vllm": True, "vllm_mode": "server", "vllm_server_url": "http://127.0.0.1:9"}),
    BadInput("server URL not http", ("http://", "vllm_server_url", "'ftp://10.0.0.2:8000'"),
             params={"vllm_server_url": "ftp://10.0.0.2:8000"}),
    BadInput("project name empty", ("project_name", "folder"), params={"project_name": " "}),
    BadInput("a run is already training", ("already training", "stop it first"), setup="active_run"),
    BadInput("resume without a checkpoint", ("Cannot resume", "checkpoint", "without --resume"),
             flags=("--resume",), api_kwargs={"resume": True}),
    *(BadInput(f"resume with another {what}", ("Cannot resume from checkpoint-2", *words, "without --resume"),
               params=params, flags=("--resume",), api_kwargs={"resume": True}, setup="checkpoint", checkpoint=old)
      for what, params, old, words in [
          ("group size", {"rl_num_generations": 2}, {}, ("trained with --rl-num-generations 4", "this run has 2",
                                                         "resume with --rl-num-generations 4")),
          ("batch size", {"batch_size": 8}, {}, ("--batch-size 4", "this run has 8")),
          ("model", {}, {"model": "Qwen/Qwen2.5-0.5B-Instruct"}, ("--model Qwen/Qwen2.5-0.5B-Instruct", "tiny")),
          ("learning rate and LoRA", {"lr": 1e-3, "peft": True}, {},
           ("--lr 1e-05 and --no-peft", "this run has 0.001 and --peft", "resume with --lr 1e-05 --no-peft")),
          ("seed", {"seed": 7}, {}, ("--seed 42", "this run has 7")),
          ("number of processes", {}, {"processes": 2}, ("trained by 2 processes", "this run has 1",
                                                        "--num-processes 2")),
      ]),
    BadInput("unknown flag / parameter", ("no_such_flag",), api_kwargs={"no_such_flag": 1},
             flags=("--no-such-flag", "1")),
    BadInput("a number that is not one", ("--lr", "fast"), params={"lr": "fast"}),
    BadInput("an integer that is not one", ("--batch-size", "2.5"), params={"batch_size": 2.5}),
    BadInput("a boolean that is not one", ("peft", "true or false"), params={"peft": "yes"}, surfaces=("api",)),
    BadInput("unbalanced quote in the magic line", ("No closing quotation", "check the quotes"),
             raw_line="--project-name 'my run", surfaces=("magic",)),
]


def _outside(meta: dict[str, Any], kind: type) -> list[tuple[str, Any, str]]:
    """Values just outside each bound of a field, with the words its message must contain."""
    step = 1 if kind is int else 0.5
    out: list[tuple[str, Any, str]] = []
    if "ge" in meta:
        out.append(("ge", meta["ge"] - step, f"at least {meta['ge']}"))
    if "gt" in meta:
        out.append(("gt", meta["gt"], f"greater than {meta['gt']}"))
        out.append(("gt", meta["gt"] - step, f"greater than {meta['gt']}"))
    if "le" in meta:
        out.append(("le", meta["le"] + step, f"at most {meta['le']}"))
    if "lt" in meta:
        out.append(("lt", meta["lt"], f"less than {meta['lt']}"))
    return out


def range_rows() -> list[BadInput]:
    """One row per bound (and per choice list, JSON, URL and type) of every GRPOParams field."""
    rows: list[BadInput] = []
    for f in dataclasses.fields(GRPOParams):
        kind = GRPOParams.field_type(f.name)
        meta = dict(f.metadata)
        if kind in (int, float):
            for bound, value, words in _outside(meta, kind):
                rows.append(BadInput(f"{f.name} {bound} {value}", (f.name, words), params={f.name: value}))
            rows.append(BadInput(f"{f.name} nan", (f.name,), params={f.name: math.nan}, surfaces=("api",)))
            rows.append(BadInput(f"{f.name} text", (f.name, "'many'"), params={f.name: "many"}, surfaces=("api",)))
        if "choices" in meta:
            rows.append(BadInput(f"{f.name} not a choice", (f.name, "must be one of", meta["choices"][0]),
                                 params={f.name: "bogus"}))
        if meta.get("json_object"):
            rows.append(BadInput(f"{f.name} a JSON string", (f.name, "JSON object"), params={f.name: '"x"'}))
        if meta.get("url"):
            rows.append(BadInput(f"{f.name} not a URL", (f.name, "http://"), params={f.name: "localhost:8000"}))
        if kind is str and not meta.get("choices"):
            rows.append(BadInput(f"{f.name} a number", (f.name, "string"), params={f.name: 3}, surfaces=("api",)))
    return rows


RANGE_ROWS = range_rows()
ROWS: list[BadInput] = ENV_ROWS + CELL_ROWS + PARAM_ROWS + RANGE_ROWS


def cli_flags(params: dict[str, Any]) -> list[str]:
    """The CLI/magic flags of params (``--flag=value``; None is left out, as a flag cannot say it)."""
    flags: list[str] = []
    for name, value in params.items():
        flag = GRPOParams.flag(name)
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            flags.append(f"{flag}={value}")
    return flags
