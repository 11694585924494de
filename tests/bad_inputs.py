"""The catalogue of bad inputs: what a user can get wrong, and the words the answer must contain.

Each row is tried on every surface it names (see ``tests/test_bad_inputs.py``):

- ``api``: ``grpo_magic.train(...)`` raises ``GRPOMagicError``;
- ``cli``: ``grpo_magic.frontends.cli.main([...])`` returns 2 with one line on stderr;
- ``magic``: ``%grpo_train ... --run --blocking`` in a real InteractiveShell raises ``UsageError``;
- ``cell``: a ``%%grpo_env`` cell (the env source as the cell) raises ``UsageError``.

Every answer must be one line, come before the model loads, and contain ``words``. Rows about
parameter ranges are generated from ``GRPOParams`` metadata, so a new field is covered at once.
"""

from __future__ import annotations

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
    setup: str | None = None  # "fake_vllm", "active_run", "pyproject", "no_tool_template", "checkpoint"
    api_kwargs: dict[str, Any] = field(default_factory=dict)  # more keyword arguments of train()
    #: setup "checkpoint": the output folder holds a complete checkpoint-2 of a run with the base
    #: params and these changes ("processes": how many processes trained it).
    checkpoint: dict[str, Any] = field(default_factory=dict)


def _build(body: str) -> dict[str, str]:
    return {"build": "    def build_dataset(self, tokenizer):\n" + body}


#: JSON that Python's parser cannot take (it recurses per level) and JSON too long for a command line.
DEEP_CONFIG = "[" * 30_000 + "]" * 30_000
HUGE_CONFIG = '{"letter": "a", "cases": [' + ", ".join(['"' + "x" * 98 + '"'] * 2_000) + "]}"

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
    BadInput("build_dataset returns a list of strings", ("datasets.Dataset", "list of str", "list of dicts",
                                                          "Dataset.from_dict"),
             env=env_source(**_build("        return ['hi']\n")), surfaces=ENV_SURFACES),
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
    BadInput("rl_env_config nested too deep (30,000 lists)", ("nests deeper than 100 levels", "flatten it"),
             params={"rl_env_config": DEEP_CONFIG}, surfaces=ENV_SURFACES, env=env_source(),
             cell_line=f"--config '{DEEP_CONFIG}'"),
    BadInput("rl_env_config too large (200 KB)", ("characters long", "the data in a file"),
             params={"rl_env_config": HUGE_CONFIG}, surfaces=ENV_SURFACES, env=env_source(),
             cell_line=f"--config '{HUGE_CONFIG}'"),
    BadInput("rl_env_config with a 5000-digit number", ("more than 4300 digits", "write it as a string"),
             params={"rl_env_config": '{"letter": ' + "7" * 5000 + "}"}, surfaces=ENV_SURFACES, env=env_source(),
             cell_line="--config '{\"letter\": " + "7" * 5000 + "}'"),
    BadInput("rl_env_config not an object", ("JSON object", "list"),
             params={"rl_env_config": "[1, 2]"}, surfaces=ENV_SURFACES, env=env_source(), cell_line="--config '[1, 2]'"),
]

#: An agent env: ``reset`` and one tool method, as TRL's tool loop needs them.
AGENT_RESET = "    def reset(self, **row):\n        self.looked_up = []\n"
AGENT_TOOL = (
    "    def lookup(self, word: str) -> str:\n"
    "        \"\"\"Look a word up.\n\n        Args:\n            word: The word.\n        \"\"\"\n"
    "        return word\n"
)


def agent_source(reset: str = AGENT_RESET, tool: str = AGENT_TOOL, tools: str = "") -> str:
    """An agent env module (class ``Env`` with ``reset`` and a ``lookup`` tool), with one part replaced."""
    return env_source(tools=reset + tool + tools)


AGENT_ROWS: list[BadInput] = [
    BadInput("agent tool without type hints", ("Env.lookup()", "type hint", "docstring"),
             env=agent_source(tool="    def lookup(self, word):\n        \"\"\"Look up.\n\n        Args:\n"
                                   "            word: The word.\n        \"\"\"\n        return word\n"),
             surfaces=ENV_SURFACES),
    BadInput("agent tool without a docstring", ("Env.lookup()", "docstring", "leading underscore"),
             env=agent_source(tool="    def lookup(self, word: str) -> str:\n        return word\n"),
             surfaces=ENV_SURFACES),
    BadInput("get_tools names a method the agent env lacks", ("get_tools() names 'search'", "lookup", "add the method"),
             env=agent_source(tools="    def get_tools(self):\n        return [{'type': 'function', 'function': "
                                    "{'name': 'search', 'description': 'd', 'parameters': {}}}]\n"),
             surfaces=ENV_SURFACES),
    BadInput("agent env whose reset is not callable", ("Env.reset", "not a method", "def reset(self, **row)"),
             env=agent_source(reset="    reset = 5\n"), surfaces=ENV_SURFACES),
    BadInput("agent env on a model without tool support", ("agent env", "cannot render tool calls", "tiny-agent"),
             env=agent_source(), params={"model": "./no-tools-model"}, setup="no_tool_template"),
]

#: Envs made by an adapter (``grpo_magic.adapters``) in the env module or cell, with a mistake the adapter names.
RF_HEAD = ("from datasets import Dataset\nfrom grpo_magic.adapters import from_reward_funcs\n\n"
           "DATA = Dataset.from_dict({'prompt': ['Say a: '] * 8, 'answer': ['a'] * 8})\n\n\n")
RF_GOOD = "def has_a(prompts, completions, **kwargs):\n    return [float('a' in c) for c in completions]\n\n\n"
RG_HEAD = "from grpo_magic.adapters import from_reasoning_gym\n\n"

ADAPTER_ROWS: list[BadInput] = [
    BadInput("reward function with the wrong arity", ("'short'", "does not accept 'prompts'", "**kwargs"),
             env=RF_HEAD + "def short(completions):\n    return [0.0] * len(completions)\n\n\n"
                 "Env = from_reward_funcs([short], DATA)\n", surfaces=ENV_SURFACES),
    BadInput("reward function needing an argument TRL does not pass", ("'graded'", "needs 'solution'", "answer"),
             env=RF_HEAD + "def graded(prompts, completions, solution, **kw):\n    return [0.0] * len(completions)\n"
                 "\n\nEnv = from_reward_funcs(graded, DATA)\n", surfaces=ENV_SURFACES),
    BadInput("reward weights of the wrong length", ("weights has 3 values for 1 reward function", "has_a",
                                                   "one weight per function"),
             env=RF_HEAD + RF_GOOD + "Env = from_reward_funcs([has_a], DATA, weights=[1, 2, 3])\n",
             surfaces=ENV_SURFACES),
    BadInput("reward functions given no prompt column", ("no 'prompt' column", "question", "add the prompts"),
             env=RF_HEAD + RF_GOOD + "Env = from_reward_funcs(has_a, [{'question': 'Say a'}] * 4)\n",
             surfaces=ENV_SURFACES),
    BadInput("unknown reasoning-gym task", ("'basic_arithmatic'", "close names: basic_arithmetic", "use one of"),
             env=RG_HEAD + "Env = from_reasoning_gym('basic_arithmatic')\n", surfaces=ENV_SURFACES),
    BadInput("reasoning-gym setting the task lacks", ("has no setting 'max_termz'", "max_terms"),
             env=RG_HEAD + "Env = from_reasoning_gym('basic_arithmetic', size=8, max_termz=3)\n",
             surfaces=ENV_SURFACES),
    BadInput("reasoning-gym config key the task lacks", ("does not accept 'max_termz'", "max_terms"),
             env=RG_HEAD + "Env = from_reasoning_gym('basic_arithmetic', size=8)\n",
             params={"rl_env_config": '{"max_termz": 3}'}, surfaces=ENV_SURFACES, cell_line='--config {"max_termz": 3}'),
]

#: %%grpo_env cells that are wrong in themselves (the "cell" surface only).
CELL_ROWS: list[BadInput] = [
    BadInput("cell with a syntax error", ("syntax error at line 2",), env="x = 1\ndef f(:\n    pass\n",
             surfaces=("cell",)),
    BadInput("cell with two env classes", ("2 environment classes", "Env, Other", "%%grpo_env Env"),
             env=env_source() + "\n\nclass Other(Env):\n    pass\n", surfaces=("cell",)),
    BadInput("cell with no class", ("defines no class",), env="x = 1\n", surfaces=("cell",)),
    BadInput("cell assigning two env objects without NAME", ("2 environments", "Gym, Legs", "%%grpo_env Gym"),
             env=RG_HEAD + "Gym = from_reasoning_gym('basic_arithmetic', size=8)\n"
                 "Legs = from_reasoning_gym('leg_counting', size=8)\n", surfaces=("cell",)),
    BadInput("cell assigning an env instance and a config", ("instance of LettersEnv", "pass the class"),
             env="from envs.letters import LettersEnv\n\nEnv = LettersEnv()\n", surfaces=("cell",),
             cell_line='--config {"letter": "b"}'),
    BadInput("cell raising", ("ZeroDivisionError", "fix the cell"), env="x = 1 / 0\n", surfaces=("cell",)),
    BadInput("cell naming a class it lacks", ("Env", "score_episode"), env=env_source(score=""),
             surfaces=("cell",), cell_line="Env"),
]

def _eval_build(body: str) -> dict[str, str]:
    """An env whose build_eval_dataset returns ``body`` (the held-out prompts: docs/architecture.md, "Evaluation")."""
    return {"tools": "    def build_eval_dataset(self, tokenizer):\n        return " + body + "\n"}


#: Held-out prompts for evaluation (--eval-split, --eval-steps, build_eval_dataset).
EVAL_ROWS: list[BadInput] = [
    BadInput("eval dataset without a prompt column", ("build_eval_dataset", "without a 'prompt' column"),
             params={"eval_steps": 1},
             env=env_source(**_eval_build("Dataset.from_dict({'question': ['x'], 'case_idx': [0]})"))),
    BadInput("eval dataset with other columns", ("build_eval_dataset", "'answer'", "same columns"),
             params={"eval_steps": 1},
             env=env_source(**_eval_build("Dataset.from_dict({'prompt': ['x'], 'case_idx': [0], 'answer': [1]})"))),
    BadInput("eval dataset lacking a column", ("build_eval_dataset", "lacks build_dataset's column 'case_idx'"),
             params={"eval_steps": 1}, env=env_source(**_eval_build("Dataset.from_dict({'prompt': ['x']})"))),
    BadInput("eval split and an eval dataset", ("build_eval_dataset", "drop --eval-split"),
             params={"eval_split": 0.25},
             env=env_source(**_eval_build("Dataset.from_dict({'prompt': ['x'], 'case_idx': [0]})"))),
    BadInput("eval steps without held-out prompts", ("--eval-steps 2", "--eval-split", "build_eval_dataset"),
             params={"eval_steps": 2}),
    BadInput("eval split holding out every row", ("leaves no row to train on", "--eval-split"),
             params={"eval_split": 0.99}, env=env_source(build="    def build_dataset(self, tokenizer):\n"
                                                          "        return Dataset.from_dict({'prompt': ['a', 'b']})\n")),
]

#: Bad params that are not about ranges (ranges are generated below).
PARAM_ROWS: list[BadInput] = [
    BadInput("trainer not grpo", ("trainer", "must be one of grpo", "'ppo'"), params={"trainer": "ppo"}),
    BadInput("loss type unknown", ("rl_loss_type", "dapo"), params={"rl_loss_type": "ppo"}),
    # TRL's settings, derived from the installed GRPOConfig (trl_settings.py)
    BadInput("TRL loss_type unknown", ("rl_loss_type", "must be one of", "dr_grpo", "'ppo'"), params={"loss_type": "ppo"}),
    BadInput("scale_rewards not one of TRL's", ("scale_rewards", "group, batch, none", "'sometimes'"),
             params={"scale_rewards": "sometimes"}),
    BadInput("TRL JSON setting not JSON", ("lr_scheduler_kwargs", "not valid JSON", "--lr-scheduler-kwargs '"),
             params={"lr_scheduler_kwargs": "{num_cycles: 2}"}),
    BadInput("TRL JSON setting nested too deep (30,000 lists)", ("lr_scheduler_kwargs", "nests deeper than 100 levels"),
             params={"lr_scheduler_kwargs": DEEP_CONFIG}),
    BadInput("TRL JSON setting with a 5000-digit number", ("lr_scheduler_kwargs", "more than 4300 digits"),
             params={"lr_scheduler_kwargs": '{"num_cycles": ' + "7" * 5000 + "}"}),
    BadInput("recipe unknown", ("recipe", "'dapoo'", "use dapo", "closest"), params={"recipe": "dapoo"}),
    BadInput("a setting given twice", ("rl_kl_coef", "--beta", "same setting", "use only --rl-kl-coef"),
             params={"rl_kl_coef": 0.2, "beta": 0.3}),
    BadInput("a setting grpo_magic owns", ("output_dir", "grpo_magic owns", "--project-name"), params={"output_dir": "x"}),
    BadInput("TRL's cross-field rule", ("TRL's GRPOConfig rejects", "generation_batch_size (6)", "--generation-batch-size"),
             params={"generation_batch_size": 6}),
    BadInput("load in 4 bits on a CPU", ("load_in_4bit", "CUDA", "CPU"), params={"peft": True, "load_in_4bit": True}),
    BadInput("load in 4 bits without LoRA", ("load_in_4bit", "--peft"), params={"load_in_4bit": True}),
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
    # Several machines (launcher flags: the CLI only), answered before any process starts.
    BadInput("machine rank out of range", ("--machine-rank 2", "--num-machines 2", "use 0 to 1"),
             flags=("--num-machines", "2", "--machine-rank", "2", "--main-process-ip", "127.0.0.1"), surfaces=("cli",)),
    BadInput("several machines without machine 0's address", ("--num-machines 2", "--main-process-ip",
                                                              "--rdzv-endpoint"),
             flags=("--num-machines", "2"), surfaces=("cli",)),
    BadInput("rendezvous port not a number", ("--main-process-port", "port number", "'twenty'"),
             flags=("--main-process-port", "twenty"), surfaces=("cli",)),
    BadInput("rendezvous port out of range", ("--main-process-port", "1 to 65535", "'70000'"),
             flags=("--main-process-port", "70000"), surfaces=("cli",)),
    BadInput("processes that do not split over the machines", ("--num-processes 3", "--num-machines 2",
                                                               "--num-processes 2 or 4"),
             flags=("--num-machines", "2", "--main-process-ip", "127.0.0.1", "--num-processes", "3"), surfaces=("cli",)),
    BadInput("rendezvous endpoint without a port", ("--rdzv-endpoint", "HOST:PORT", "'node001'"),
             flags=("--num-machines", "2", "--rdzv-endpoint", "node001"), surfaces=("cli",)),
    BadInput("rendezvous endpoint and port that disagree", ("--rdzv-endpoint", "--main-process-port", "give one"),
             flags=("--rdzv-endpoint", "node001:29500", "--main-process-port", "29501"), surfaces=("cli",)),
    BadInput("unknown rendezvous backend", ("--rdzv-backend", "static or c10d", "'etcd'"),
             flags=("--rdzv-backend", "etcd"), surfaces=("cli",)),
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
    for f in GRPOParams.fields():  # the declared ones; TRL's settings have rows of their own (PARAM_ROWS)
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
ROWS: list[BadInput] = ENV_ROWS + AGENT_ROWS + ADAPTER_ROWS + CELL_ROWS + EVAL_ROWS + PARAM_ROWS + RANGE_ROWS


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


# ---------------------------------------------------------------- rescoring and hot swap

#: The env a rescore or a swap row hands over, unless the row gives its own (a letters env, as the runs train).
LETTERS_ENV = (
    "from datasets import Dataset\n\n\nclass Env:\n"
    "    def build_dataset(self, tokenizer):\n"
    "        return Dataset.from_dict({'prompt': ['Write the letter a many times: '] * 8, 'letter': ['a'] * 8})\n\n"
    "    def score_episode(self, model, tokenizer, completion, letter):\n"
    "        return float(letter in completion)\n"
)


@dataclass(frozen=True)
class IterationInput:
    """A bad input to rescoring or a hot swap, tried on its surfaces by ``tests/test_iteration_inputs.py``.

    Surfaces: ``rescore-api`` (``grpo_magic.rescore``), ``rescore-magic`` (``%grpo_rescore``),
    ``swap-api`` (``run.swap_env``), ``swap-cell`` (``%%grpo_env NAME --swap``). ``target`` is what is
    rescored: ``run`` (a finished 2-step run's folder), ``empty`` (a folder without a run log),
    ``missing`` (no such folder), ``none`` (no run in the session); a swap goes to the run that is
    training (``training``) or, without one, to the finished run.
    """

    id: str
    words: tuple[str, ...]
    surfaces: tuple[str, ...]
    env: str = LETTERS_ENV
    target: str = "run"
    steps: str | None = None
    env_name: str | None = None  # rescore: --env NAME (default: the row's env, registered as Env)
    swap_name: str | None = None  # swap-cell: %%grpo_env NAME --swap (default: the training run's env)
    training: bool = True


def _letters_env(build: str = "", score: str = "", extra: str = "") -> str:
    source = LETTERS_ENV
    if build:
        source = source.replace("        return Dataset.from_dict({'prompt': ['Write the letter a many times: '] * 8, "
                                "'letter': ['a'] * 8})\n", build)
    if score:
        source = source.replace("    def score_episode(self, model, tokenizer, completion, letter):\n"
                                "        return float(letter in completion)\n", score)
    return source + extra


RESCORE = ("rescore-api", "rescore-magic")
SWAP = ("swap-api", "swap-cell")

ITERATION_ROWS: list[IterationInput] = [
    IterationInput("rescore a folder with no run log", ("no run log", "events.jsonl", "--project-name"), RESCORE,
                   target="empty"),
    IterationInput("rescore a folder that does not exist", ("does not exist", "output folder"), RESCORE,
                   target="missing"),
    IterationInput("rescore with no run in this session", ("No run to rescore", "output folder"), RESCORE,
                   target="none"),
    IterationInput("rescore with an env whose columns the run lacks", ("needs 'case_idx'", "letter", "give it a default"),
                   RESCORE, env=_letters_env(score="    def score_episode(self, model, tokenizer, completion, case_idx):\n"
                                                   "        return 0.5\n")),
    IterationInput("rescore steps outside the run", ("--steps 50:60", "outside", "1 to 2", "within 1:2"), RESCORE,
                   steps="50:60"),
    IterationInput("rescore steps that are not a range", ("not a step range", "A:B"), RESCORE, steps="first:last"),
    IterationInput("rescore with an env nobody registered", ("No environment named 'Nope'", "%%grpo_env"), RESCORE,
                   env_name="Nope"),
    IterationInput("swap with no run training", ("--swap needs a run that is training", "drop --swap"), ("swap-cell",),
                   training=False),
    IterationInput("swap on a finished run", ("Swap refused", "completed", "train a new run"), ("swap-api",),
                   training=False),
    IterationInput("swap naming another env than the run's", ("scores with env TrainEnv", "not Other", "--swap"),
                   ("swap-cell",), swap_name="Other"),
    IterationInput("swap to an env with other dataset columns", ("Swap refused", "case_idx", "letter", "same columns"),
                   SWAP, env=_letters_env(
                       build="        return Dataset.from_dict({'prompt': ['hi'] * 8, 'case_idx': list(range(8))})\n",
                       score="    def score_episode(self, model, tokenizer, completion, case_idx):\n"
                             "        return 0.5\n")),
    IterationInput("swap to an env whose build_dataset raises", ("Swap refused", "build_dataset", "ValueError",
                                                                 "rows file missing"),
                   SWAP, env=_letters_env(build="        raise ValueError('rows file missing')\n")),
    IterationInput("swap to an env with tools the run lacks", ("Swap refused", "tools", "book", "differ"), SWAP,
                   env=_letters_env(extra="\n    def get_tools(self):\n        return [{'type': 'function', 'function': "
                                          "{'name': 'book', 'description': 'Book.', 'parameters': {'type': 'object', "
                                          "'properties': {}}}}]\n")),
]
