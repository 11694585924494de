"""Environments: load, register, instantiate and validate them before any model is loaded.

An environment is any class with ``build_dataset(tokenizer)`` and ``score_episode(model,
tokenizer, completion, **columns)`` (docs/architecture.md, "The environment interface"). It can come from a module
(``rl_env_module`` + ``rl_env_class``), from the inline registry (``register_env``, which
``%%grpo_env`` uses), or be passed to ``train(env=...)`` as a class or an instance. Every problem
is reported as one ``GRPOMagicError`` sentence that names the thing and the fix.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.errors import GRPOMagicError
from grpo_magic.text import module_name_of_path, one_line

from .agent import EPISODE_KWARGS, AgentSpec, agent_spec, is_agent_env

REQUIRED_METHODS = ("build_dataset", "score_episode")
#: How each required method is declared, for the messages that ask for it.
METHOD_SIGNATURES = {
    "build_dataset": "build_dataset(self, tokenizer)",
    "score_episode": "score_episode(self, model, tokenizer, completion, ...)",
}
#: Leading parameters of ``score_episode`` that we pass positionally.
EPISODE_POSITIONAL = ("model", "tokenizer", "completion")
#: Keyword arguments of ``score_episode`` that grpo_magic supplies itself (not dataset columns).
PROVIDED_KWARGS = ("generator",)
#: Hidden dataset column that keeps the env's own prompt when we pre-render prompts with tools.
ENV_PROMPT_COLUMN = "_grpo_env_prompt"


@dataclass
class EnvSpec:
    """Where an environment comes from and how to build it."""

    name: str
    cls: type | None = None
    instance: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    source: str = "python"  # "cell", "module", "python"
    module: str | None = None
    code: str | None = None  # the cell's source, for %grpo_export
    #: The name the env is bound to in its module or cell (``Gym = from_reasoning_gym(...)``), when that
    #: is not its class name: what ``--rl-env-class`` must say for the exported module.
    attr: str | None = None

    def __repr__(self) -> str:  # short: a %%grpo_env cell's Out[] must not repeat the whole cell
        config = f", config={self.config}" if self.config else ""
        return f"<EnvSpec {self.name} from {self.source}{config}>"

    @property
    def attr_name(self) -> str:
        """The module attribute that holds the env: its bound name, else its class name."""
        if self.attr:
            return self.attr
        if self.cls is not None:
            return self.cls.__name__
        return type(self.instance).__name__ if self.instance is not None else self.name

    def instantiate(self) -> Any:
        """A fresh instance (or the given one); constructor problems become one clear sentence."""
        if self.instance is not None:
            return self.instance
        assert self.cls is not None
        return instantiate(self.cls, self.config)

    def fresh_env(self) -> Any:
        """A new instance for one rollout of an agent env (a copy of a given instance)."""
        if self.instance is not None:
            return copy.deepcopy(self.instance)
        assert self.cls is not None
        return instantiate(self.cls, self.config)


_REGISTRY: dict[str, EnvSpec] = {}
_REGISTRY_LOCK = threading.Lock()


def is_env_class(obj: Any) -> bool:
    """True for a class that has both methods an environment needs."""
    return inspect.isclass(obj) and all(callable(getattr(obj, m, None)) for m in REQUIRED_METHODS)


def is_env_instance(obj: Any) -> bool:
    """True for an object (not a class) that has both methods an environment needs."""
    return not inspect.isclass(obj) and all(callable(getattr(obj, m, None)) for m in REQUIRED_METHODS)


def register_env(
    cls: Any,
    name: str | None = None,
    *,
    config: dict[str, Any] | str | None = None,
    source: str = "python",
    code: str | None = None,
    attr: str | None = None,
) -> EnvSpec:
    """Register an environment class (or instance) under ``name`` (default: its class name); replaces an earlier one.

    An instance is used as it is (agent envs get a deep copy per episode), so it takes no ``config``.
    """
    if not inspect.isclass(cls):
        if not is_env_instance(cls):
            raise GRPOMagicError(
                f"register_env expects an environment class or instance, got {type(cls).__name__}; pass a class with "
                "build_dataset and score_episode (or an instance of one).")
        if config not in (None, "", {}):
            raise GRPOMagicError(
                f"register_env got an instance of {type(cls).__name__} and a config; pass the class with the config, "
                "or the instance alone.")
        spec = EnvSpec(name=name or type(cls).__name__, instance=cls, source=source,
                       module=getattr(type(cls), "__module__", None), code=code, attr=attr)
    else:
        check_interface(cls, cls.__name__)
        spec = EnvSpec(
            name=name or cls.__name__,
            cls=cls,
            config=_parse_config(config, cls.__name__),
            source=source,
            module=getattr(cls, "__module__", None),
            code=code,
            attr=attr,
        )
        _check_constructor(cls, spec.config)
    with _REGISTRY_LOCK:
        _REGISTRY[spec.name] = spec
    return spec


def unregister_env(name: str) -> None:
    with _REGISTRY_LOCK:
        _REGISTRY.pop(name, None)


def registered_envs() -> dict[str, EnvSpec]:
    with _REGISTRY_LOCK:
        return dict(_REGISTRY)


def get_env(name: str) -> EnvSpec:
    with _REGISTRY_LOCK:
        spec = _REGISTRY.get(name)
        names = sorted(_REGISTRY)
    if spec is None:
        known = f"registered: {', '.join(names)}" if names else "none is registered yet"
        raise GRPOMagicError(
            f"No environment named {name!r} ({known}); define it in a %%grpo_env cell or call register_env()."
        )
    return spec


def _parse_config(config: dict[str, Any] | str | None, owner: str) -> dict[str, Any]:
    if config is None or config == "":
        return {}
    if isinstance(config, dict):
        return dict(config)
    problem = GRPOParams.check_value("rl_env_config", config)
    if problem:
        raise GRPOMagicError(problem)
    import json

    return json.loads(config)


def _check_constructor(cls: type, config: dict[str, Any]) -> None:
    """Name a config key the constructor does not accept, before anything is built."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # builtins or C classes: let the call itself speak
        return
    try:
        sig.bind(**config)
    except TypeError as exc:
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        accepted = [name for name, p in sig.parameters.items() if p.kind not in variadic]
        unknown = [k for k in config if k not in sig.parameters]
        takes = f"it takes {', '.join(accepted)}" if accepted else "it takes no arguments"
        if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            raise GRPOMagicError(
                f"{cls.__name__}() does not accept {unknown[0]!r} from rl_env_config ({takes}); "
                "fix the JSON keys or the constructor."
            ) from None
        raise GRPOMagicError(
            f"{cls.__name__}() cannot be built from rl_env_config {config!r} ({one_line(exc)}); {takes}."
        ) from None


def instantiate(cls: type, config: dict[str, Any]) -> Any:
    _check_constructor(cls, config)
    try:
        return cls(**config)
    except Exception as exc:  # noqa: BLE001 - any constructor failure is the user's to fix
        raise GRPOMagicError(
            f"{cls.__name__}(**rl_env_config) raised {type(exc).__name__}: {one_line(exc)}; fix the constructor or the config."
        ) from exc


def check_interface(obj: Any, name: str) -> None:
    for method in REQUIRED_METHODS:
        if not callable(getattr(obj, method, None)):
            raise GRPOMagicError(
                f"Environment {name} has no {method}() method; add {METHOD_SIGNATURES[method]} to it."
            )


def load_module_env(module_name: str, class_name: str) -> Any:
    """Import ``module_name`` (the current folder is importable) and return its ``class_name``.

    That is a class, or an env instance the module binds to that name (``env = HotelEnv(max_turns=5)``).
    """
    if dotted := module_name_of_path(module_name):  # a file path: import_module would only say "no module named"
        raise GRPOMagicError(f"--rl-env-module takes a module's dotted name, not a file path ({module_name!r}); use "
                             f"--rl-env-module {dotted}, from the folder that holds {dotted.replace('.', '/')}.py.")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise GRPOMagicError(
                f"Could not import environment module {module_name!r} (no module named {exc.name!r}); run from "
                "the folder that contains it or check --rl-env-module."
            ) from exc
        raise GRPOMagicError(
            f"Importing environment module {module_name!r} failed: {one_line(exc)}; install what it imports."
        ) from exc
    except SyntaxError as exc:
        raise GRPOMagicError(
            f"Environment module {module_name!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}; "
            "fix that line."
        ) from exc
    except GRPOMagicError as exc:  # an adapter's answer (from_reasoning_gym...) is one sentence with its fix
        raise GRPOMagicError(f"Importing environment module {module_name!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module code raised while importing
        raise GRPOMagicError(
            f"Importing environment module {module_name!r} raised {type(exc).__name__}: {one_line(exc)}; fix the module."
        ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items() if is_env_class(v))
        hint = f"environment classes there: {', '.join(found)}" if found else "it defines no environment class"
        raise GRPOMagicError(
            f"Module {module_name!r} has no class {class_name!r} ({hint}); check --rl-env-class."
        )
    if is_env_instance(cls):
        return cls
    if not inspect.isclass(cls):
        raise GRPOMagicError(f"{module_name}.{class_name} is a {type(cls).__name__}, not a class; check --rl-env-class.")
    check_interface(cls, f"{module_name}.{class_name}")
    return cls


def resolve_env(params: GRPOParams, env: Any = None) -> EnvSpec:
    """Find the environment of a run: ``env`` (name, spec, class or instance) or the params' module/class."""
    config = params.env_config
    if env is None:
        if params.rl_env_module and params.rl_env_class:
            cls = load_module_env(params.rl_env_module, params.rl_env_class)
            if not inspect.isclass(cls):  # an instance the module built
                if config:
                    raise GRPOMagicError(
                        f"{params.rl_env_module}.{params.rl_env_class} is an instance of {type(cls).__name__}, which "
                        "rl_env_config cannot configure; drop --rl-env-config or name the class in --rl-env-class.")
                return EnvSpec(name=params.rl_env_class, instance=cls, source="module", module=params.rl_env_module)
            spec = EnvSpec(name=params.rl_env_class, cls=cls, config=config, source="module", module=params.rl_env_module)
            _check_constructor(cls, config)
            return spec
        raise GRPOMagicError(
            "No environment given; set --rl-env-module and --rl-env-class, or pass env= (a class, an instance "
            "or the name of a registered env)."
        )
    if isinstance(env, EnvSpec):
        spec = env
    elif isinstance(env, str):
        spec = get_env(env)
    elif inspect.isclass(env):
        check_interface(env, env.__name__)
        spec = EnvSpec(name=env.__name__, cls=env, source="python", module=env.__module__)
    else:
        check_interface(env, type(env).__name__)
        return EnvSpec(name=type(env).__name__, instance=env, source="python", module=type(env).__module__)
    if params.rl_env_config is not None:  # the params' config wins over the registration's
        spec = EnvSpec(**{**spec.__dict__, "config": config})
    if spec.cls is not None:
        _check_constructor(spec.cls, spec.config)
    return spec


# ---------------------------------------------------------------- dataset and tools


def _where(env: Any, method: str) -> str:
    return f"{type(env).__name__}.{method}()"


def check_tools(env: Any) -> list[dict[str, Any]]:
    """``get_tools()`` as a list of function schemas (empty when the env has none)."""
    get_tools = getattr(env, "get_tools", None)
    if get_tools is None:
        return []
    try:
        tools = get_tools()
    except Exception as exc:  # noqa: BLE001
        raise GRPOMagicError(f"{_where(env, 'get_tools')} raised {type(exc).__name__}: {one_line(exc)}; fix get_tools.") from exc
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise GRPOMagicError(
            f"{_where(env, 'get_tools')} must return a list of function schemas, got {type(tools).__name__}; "
            "return [{'type': 'function', 'function': {...}}, ...], or [] for no tools."
        )
    for i, tool in enumerate(tools):
        schema = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str) or not schema["name"]:
            raise GRPOMagicError(
                f"{_where(env, 'get_tools')} item {i} is not a function schema; use "
                "{'type': 'function', 'function': {'name': ..., 'description': ..., 'parameters': {...}}}."
            )
    return list(tools)


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def _is_dataframe(value: Any) -> bool:
    """A pandas DataFrame, told without importing pandas for anything else."""
    return type(value).__name__ == "DataFrame" and type(value).__module__.startswith("pandas")


def as_dataset(value: Any, where: str, *, given: bool = False, note: bool = True):
    """A ``datasets.Dataset`` from what people return: a Dataset, a pandas DataFrame or a list of dicts.

    ``where`` names the source (``Env.build_dataset()``, or with ``given`` a function that was passed
    the dataset). A conversion is said in one line on stderr (``note``), so that nobody wonders where
    the Dataset came from.
    """
    from datasets import Dataset

    if isinstance(value, Dataset):
        return value
    subject, verb = (f"The dataset given to {where}", "got") if given else (where, "returned")
    if _is_dataframe(value):
        how, convert = "a pandas DataFrame", lambda: Dataset.from_pandas(value, preserve_index=False)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(row, dict) for row in value):
        how, convert = "a list of dicts", lambda: Dataset.from_list(list(value))
    else:
        got = type(value).__name__
        if isinstance(value, (list, tuple)):
            got = f"a {got} of {type(value[0]).__name__}" if value else f"an empty {got}"
        must = "must be" if given else "must return"
        raise GRPOMagicError(
            f"{subject} {must} a datasets.Dataset, a pandas DataFrame or a list of dicts, got {got}; wrap your "
            "rows with Dataset.from_dict({'prompt': [...]}) or use [{'prompt': ...}, ...]."
        )
    try:
        dataset = convert()
    except Exception as exc:  # noqa: BLE001 - Arrow refuses columns of mixed types
        raise GRPOMagicError(
            f"{where} {verb} {how} that datasets could not convert ({type(exc).__name__}: {one_line(exc)}); give "
            "each column values of one type, or use a datasets.Dataset."
        ) from exc
    if note:
        say_converted(value, dataset, where, given=given)
    return dataset


def say_converted(value: Any, dataset: Any, where: str, *, given: bool = False) -> None:
    """The one-line note of a conversion by ``as_dataset`` (nothing when ``value`` was a Dataset already)."""
    if value is dataset:
        return
    how, method = ("a pandas DataFrame", "Dataset.from_pandas") if _is_dataframe(value) else (
        "a list of dicts", "Dataset.from_list")
    print(f"grpo-magic: note: {where} {'got' if given else 'returned'} {how}; converted it with {method} "
          f"({len(dataset)} rows).", file=sys.stderr)


def build_and_check_dataset(env: Any, tokenizer: Any, method: str = "build_dataset"):
    """Call ``build_dataset(tokenizer)`` (or ``method``: ``build_eval_dataset``) and check what came back."""
    from datasets import Dataset

    where = _where(env, method)
    try:
        dataset = getattr(env, method)(tokenizer)
    except Exception as exc:  # noqa: BLE001
        raise GRPOMagicError(f"{where} raised {type(exc).__name__}: {one_line(exc)}; fix {method}.") from exc
    returned = dataset
    if not isinstance(dataset, Dataset):
        dataset = as_dataset(dataset, where, note=False)  # said once it passed the checks
    if "prompt" not in dataset.column_names:
        raise GRPOMagicError(
            f"{where} returned a dataset without a 'prompt' column "
            f"(columns: {', '.join(dataset.column_names) or 'none'}); add the prompts as 'prompt'."
        )
    if len(dataset) == 0:
        raise GRPOMagicError(f"{where} returned an empty dataset; return at least one prompt.")
    for i, prompt in enumerate(dataset["prompt"]):
        if isinstance(prompt, str):
            if not prompt.strip():
                raise GRPOMagicError(f"{where}: prompt {i} is empty; give every prompt some text.")
        elif not _is_messages(prompt):
            raise GRPOMagicError(
                f"{where}: prompt {i} is a {type(prompt).__name__}, not a string or a list "
                "of chat messages; return prompts like 'Say hi' or [{'role': 'user', 'content': '...'}]."
            )
    say_converted(returned, dataset, where)
    return dataset


def has_eval_dataset(env: Any) -> bool:
    """True for an env that defines its own held-out prompts (``build_eval_dataset(tokenizer)``)."""
    return callable(getattr(env, "build_eval_dataset", None))


def build_eval_dataset(env: Any, tokenizer: Any, columns: list[str]):
    """The env's ``build_eval_dataset(tokenizer)``, checked as ``build_dataset``'s and against its columns.

    The held-out rows go through the same ``score_episode`` as the training rows, so they must have
    the same columns (docs/architecture.md, "Evaluation").
    """
    dataset = build_and_check_dataset(env, tokenizer, "build_eval_dataset")
    got, want = set(dataset.column_names), set(columns)
    if got != want:
        extra, missing = sorted(got - want), sorted(want - got)
        what = (f"has column{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} that build_dataset's has not"
                if extra else f"lacks build_dataset's column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(repr, missing))}")
        raise GRPOMagicError(
            f"{_where(env, 'build_eval_dataset')} returned a dataset that {what} (build_dataset's columns: "
            f"{', '.join(columns)}); return the same columns, since score_episode scores both."
        )
    return dataset.select_columns(list(columns))


def split_eval(dataset, eval_split: float, seed: int):
    """``(train rows, held-out rows)``: a deterministic share ``eval_split`` of ``dataset`` held out by ``seed``.

    datasets' own ``train_test_split`` (shuffled by ``seed``), so the same seed always holds out the same rows.
    """
    n = len(dataset)
    held = math.ceil(eval_split * n)
    if n < 2 or held >= n:
        raise GRPOMagicError(
            f"eval_split {eval_split:g} of {n} row{'s' if n != 1 else ''} leaves no row to train on; use a smaller "
            "--eval-split, or give build_dataset more rows (or define build_eval_dataset)."
        )
    parts = dataset.train_test_split(test_size=held, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def episode_parameters(env: Any) -> tuple[set[str], bool, list[str]]:
    """What ``score_episode`` accepts beyond model, tokenizer and completion.

    Returns (named parameters, whether it takes **kwargs, required names).
    """
    sig = inspect.signature(env.score_episode)
    params = list(sig.parameters.values())
    rest = params[len(EPISODE_POSITIONAL):] if len(params) >= len(EPISODE_POSITIONAL) else []
    if len(params) < len(EPISODE_POSITIONAL) and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise GRPOMagicError(
            f"{_where(env, 'score_episode')} takes ({', '.join(p.name for p in params)}) but must accept "
            "(model, tokenizer, completion, ...); add the missing parameters."
        )
    names = {p.name for p in rest if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    required = [
        p.name for p in rest
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is inspect.Parameter.empty
    ]
    return names, var_kw, required


def check_episode_signature(env: Any, columns: list[str], provided: tuple[str, ...] = ()) -> None:
    """Every required ``score_episode`` argument must be a dataset column (or ``prompt``, or ``provided``)."""
    _, _, required = episode_parameters(env)
    missing = [name for name in required if name not in columns and name not in (*PROVIDED_KWARGS, *provided)]
    if missing:
        raise GRPOMagicError(
            f"{_where(env, 'score_episode')} needs {missing[0]!r}, but the dataset from build_dataset has no such "
            f"column (columns: {', '.join(columns)}); add it to the dataset or give it a default."
        )


def render_prompts_with_tools(dataset, tokenizer: Any, tools: list[dict[str, Any]]):
    """Render every prompt through the chat template with the env's tools (docs/architecture.md, "The environment interface").

    TRL passes ``tools=`` to the chat template itself only for its own tool loop, so the prompts are
    pre-rendered to text here; the env's own prompt is kept for ``score_episode(prompt=...)``.
    """
    if not tools:
        return dataset

    def render(example: dict[str, Any]) -> dict[str, Any]:
        prompt = example["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return {ENV_PROMPT_COLUMN: prompt, "prompt": text}

    try:
        return dataset.map(render)
    except Exception as exc:  # noqa: BLE001
        raise GRPOMagicError(
            f"Rendering the prompts with the tokenizer's chat template and the env's tools failed ({one_line(exc)}); "
            "use a model whose chat template supports tools."
        ) from exc


def prompt_text(prompt: Any) -> str:
    """A readable one-string form of a prompt, for logs and the dashboard."""
    if isinstance(prompt, str):
        return prompt
    if _is_messages(prompt):
        return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
    return str(prompt)


@dataclass
class PreparedEnv:
    """An instantiated, validated environment with its dataset ready for TRL.

    ``agent`` is set for an agent env (one with ``reset``): TRL runs its episodes through its tool loop
    with ``agent.factory`` as ``environment_factory`` (docs/architecture.md, "Agent episodes").
    """

    spec: EnvSpec
    env: Any
    dataset: Any
    tools: list[dict[str, Any]]
    agent: AgentSpec | None = None
    #: Held-out prompts (``build_eval_dataset``, or ``eval_split``'s share of build_dataset's rows, which
    #: ``dataset`` then lacks); None when the run holds none out (docs/architecture.md, "Evaluation").
    eval_dataset: Any = None
    #: Where ``eval_dataset`` came from: "build_eval_dataset", "eval_split" or "" (none).
    eval_source: str = ""


def prepare_env(spec: EnvSpec, tokenizer: Any, *, eval_split: float | None = None, seed: int = 42,
                want_eval: bool = False) -> PreparedEnv:
    """Instantiate and validate the env and build its dataset: everything before the model loads.

    Held-out prompts (``PreparedEnv.eval_dataset``): the env's ``build_eval_dataset`` when it defines
    one and they are wanted (``want_eval``, or ``eval_split`` given), else ``eval_split``'s share of
    build_dataset's rows by ``seed``, which the training dataset then lacks.
    """
    env = spec.instantiate()
    check_interface(env, spec.name)
    agent = agent_spec(env, spec.fresh_env, check_tools(env)) if is_agent_env(env) else None
    tools = agent.schemas if agent is not None else check_tools(env)
    dataset = build_and_check_dataset(env, tokenizer)
    columns = list(dataset.column_names)
    check_episode_signature(env, columns, EPISODE_KWARGS if agent is not None else ())
    eval_dataset, source = None, ""
    if has_eval_dataset(env) and (want_eval or eval_split is not None):
        if eval_split is not None:
            raise GRPOMagicError(
                f"{type(env).__name__} defines build_eval_dataset, which gives the held-out prompts, and eval_split "
                f"{eval_split:g} would hold out training rows too; drop --eval-split (or build_eval_dataset).")
        eval_dataset, source = build_eval_dataset(env, tokenizer, columns), "build_eval_dataset"
    elif eval_split is not None:
        dataset, eval_dataset = split_eval(dataset, eval_split, seed)
        source = "eval_split"

    def ready(rows):
        if rows is None:
            return None
        return as_chat_prompts(rows) if agent is not None else render_prompts_with_tools(rows, tokenizer, tools)

    return PreparedEnv(spec=spec, env=env, dataset=ready(dataset), tools=tools, agent=agent,
                       eval_dataset=ready(eval_dataset), eval_source=source)


def as_chat_prompts(dataset):
    """TRL's tool loop needs chat prompts: a string prompt becomes the user message."""
    prompts = dataset["prompt"]
    if not any(isinstance(p, str) for p in prompts):
        return dataset
    chats = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
    return dataset.remove_columns("prompt").add_column("prompt", chats)  # no map(): it prints a progress bar
