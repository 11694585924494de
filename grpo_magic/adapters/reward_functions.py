"""Envs from reward code people already have: TRL-style reward functions and reasoning-gym tasks.

Each adapter returns an env *class* (docs/architecture.md, "Adapters"), so it works wherever an env
does: ``train(params, Env)``, ``%%grpo_env`` (``Env = from_reasoning_gym("basic_arithmetic")``),
``%grpo_check``, ``%grpo_rescore``, and the CLI through a module that assigns it. Importing this
module imports neither reasoning_gym nor datasets: both load when an adapter is called.

``from_reward_funcs`` calls the functions exactly as TRL's ``GRPOTrainer`` does, once per *batch*:
its env defines ``score_completions``, which the reward adapter (``reward.EnvReward``) calls with
the batch TRL gave it instead of one ``score_episode`` per completion.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import inspect
import math
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Any

from grpo_magic.environment.env import as_dataset, say_converted
from grpo_magic.environment.episodes import AsyncLoop
from grpo_magic.errors import GRPOMagicError
from grpo_magic.text import one_line
from grpo_magic.trl_compat import REWARD_CALL_KWARGS, REWARD_KWARGS

__all__ = ["from_reasoning_gym", "from_reward_funcs"]

#: What TRL passes to every reward function besides the dataset's columns (``trl_compat.REWARD_KWARGS``; these
#: envs are not agent envs, so no ``environments``).
TRL_PASSES = ("prompts", "completions", *(k for k in REWARD_KWARGS if k != "environments"))

_LOOP: AsyncLoop | None = None


def _loop() -> AsyncLoop:
    """One private event loop (a daemon thread) for async reward functions, as TRL keeps one: the caller
    may be a notebook's main thread, whose loop is running already."""
    global _LOOP
    if _LOOP is None:
        _LOOP = AsyncLoop()
    return _LOOP


# ---------------------------------------------------------------- TRL-style reward functions


def func_name(func: Any) -> str:
    """The name TRL gives a reward function (its metric ``rewards/<name>``): ours for ``components/<name>``."""
    if isinstance(func, functools.partial):
        return func_name(func.func)
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else type(func).__name__


def _check_signature(func: Any, name: str, columns: list[str]) -> None:
    """The function must take what TRL passes it, all by keyword: TRL's arguments and every column."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or C callable: the first call will speak
        return
    passed = [*TRL_PASSES, *columns]
    takes_kwargs = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_kwargs = True
        elif p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise GRPOMagicError(
                f"Reward function {name!r} takes {p.name!r} positionally only, but TRL passes every argument by "
                f"keyword; remove the '/' from its signature, as in def {name}(prompts, completions, **kwargs).")
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in passed:
            raise GRPOMagicError(
                f"Reward function {name!r} needs {p.name!r}, which TRL does not pass (it passes "
                f"{', '.join(passed)}); add {p.name!r} as a dataset column or give it a default.")
    if takes_kwargs:
        return
    names = set(sig.parameters)
    missing = [n for n in passed if n not in names]
    if missing:
        what = "a dataset column, which TRL passes too" if missing[0] in columns else "which TRL passes to every reward function"
        raise GRPOMagicError(
            f"Reward function {name!r} does not accept {missing[0]!r} ({what}); add **kwargs to its signature, as "
            f"in def {name}(prompts, completions, **kwargs).")


def _check_weights(weights: Any, names: list[str]) -> list[float]:
    if weights is None:
        return [1.0] * len(names)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise GRPOMagicError(f"weights must be a list of numbers, got {type(weights).__name__}; pass one weight per "
                             f"reward function ({', '.join(names)}), in the same order.")
    if len(weights) != len(names):
        raise GRPOMagicError(
            f"weights has {len(weights)} value{'s' if len(weights) != 1 else ''} for {len(names)} reward "
            f"function{'s' if len(names) != 1 else ''} ({', '.join(names)}); pass one weight per function, in the "
            "same order.")
    out = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(float(w)) or w < 0:
            raise GRPOMagicError(f"weights[{i}] is {w!r}; pass finite numbers of at least 0 (the score is the "
                                 "weighted mean of the functions' rewards).")
        out.append(float(w))
    if not any(out):
        raise GRPOMagicError("weights are all 0; give at least one reward function a positive weight.")
    return out


def _reward_value(value: Any, name: str, i: int) -> float | None:
    """One reward as TRL reads it: a number, or None (TRL's NaN: this function does not score that completion)."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, numbers.Real):  # a numpy or torch scalar
        try:
            value = value.item()
        except Exception:  # noqa: BLE001 - a tensor of several values: the check below words it
            pass
    if isinstance(value, numbers.Real):
        number = float(value)
        return None if math.isnan(number) else number
    raise GRPOMagicError(f"Reward function {name!r} returned {one_line(repr(value), 60)} ({type(value).__name__}) "
                         f"for completion {i}; return a number, or None to leave it unscored.")


def _as_trl_completion(prompt: Any, completion: Any) -> Any:
    """A completion in the form TRL gives it: a chat prompt's completion is a list with one assistant message."""
    if isinstance(prompt, list) and isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    return completion


def _no_op(*args: Any, **kwargs: Any) -> None:
    """``log_extra`` / ``log_metric`` outside training (a check, a rescore): there is no TRL table to log to."""


class RewardFuncsEnv:
    """An env made of TRL-style reward functions (``from_reward_funcs``); the score is their weighted mean.

    Each function's reward is a component named after it. A function returning None (or NaN) for a
    completion leaves it out of that completion's mean, as TRL leaves it out of its sum.
    """

    reward_funcs: tuple[Callable[..., Any], ...] = ()
    reward_names: tuple[str, ...] = ()
    reward_weights: tuple[float, ...] = ()
    dataset: Any = None

    def build_dataset(self, tokenizer: Any) -> Any:
        return self.dataset

    def score_completions(self, model: Any, tokenizer: Any, prompts: list[Any], completions: list[Any],
                          **kwargs: Any) -> list[Any]:
        """One call per function for the whole batch, with exactly TRL's arguments; one score per completion."""
        n = len(completions)
        completions = [_as_trl_completion(p, c) for p, c in zip(prompts, completions, strict=True)]
        ids = kwargs.pop("completion_ids", None)
        if ids is None:  # a rescore: the run log keeps texts; their tokens are the tokenizer's reading of them
            ids = [_token_ids(tokenizer, c) for c in completions]
        call = {
            "prompts": prompts, "completions": completions, "completion_ids": ids,
            **{k: v for k, v in kwargs.items() if k not in REWARD_CALL_KWARGS},
            "trainer_state": kwargs.get("trainer_state"),
            "log_extra": kwargs.get("log_extra") or _no_op,
            "log_metric": kwargs.get("log_metric") or _no_op,
        }
        outputs: dict[int, Any] = {}
        pending = []
        for k, (func, name) in enumerate(zip(self.reward_funcs, self.reward_names, strict=True)):
            if _is_async(func):
                pending.append((k, func, name))
                continue
            outputs[k] = _call(func, name, call)  # sync functions in order, as TRL runs them
        if pending:  # then the async ones concurrently, as TRL gathers them

            async def gather() -> list[Any]:
                return list(await asyncio.gather(*(_acall(func, name, call) for _, func, name in pending)))

            for (k, _, _), out in zip(pending, _loop().submit(gather()).result(), strict=True):
                outputs[k] = out
        rewards: list[list[float | None]] = []
        for k, name in enumerate(self.reward_names):
            out = outputs[k]
            if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
                raise GRPOMagicError(f"Reward function {name!r} returned a {type(out).__name__}, not a list; return "
                                     "one value per completion (a number, or None to leave it unscored).")
            if len(out) != n:
                raise GRPOMagicError(
                    f"Reward function {name!r} returned {len(out)} value{'s' if len(out) != 1 else ''} for {n} "
                    f"completion{'s' if n != 1 else ''}; return one value per completion (a number, or None).")
            rewards.append(list(out))
        return [self._combine([rewards[k][i] for k in range(len(self.reward_names))], i) for i in range(n)]

    def _combine(self, values: list[Any], i: int) -> Any:
        """The weighted mean over the functions that scored completion ``i``, with each as a component."""
        try:
            scored = {name: _reward_value(v, name, i) for name, v in zip(self.reward_names, values, strict=True)}
        except GRPOMagicError as exc:
            return exc
        parts = {name: v for name, v in scored.items() if v is not None}
        weights = {name: w for name, w in zip(self.reward_names, self.reward_weights, strict=True) if name in parts}
        if not parts or not sum(weights.values()):
            return GRPOMagicError(
                f"No reward function of positive weight scored completion {i} (all returned None); return a number "
                f"from at least one of {', '.join(self.reward_names)}.")
        score = sum(weights[n] * parts[n] for n in parts) / sum(weights.values())
        return {"score": score, **parts}

    def score_episode(self, model: Any, tokenizer: Any, completion: Any, prompt: Any = None, **columns: Any) -> Any:
        """One completion: a batch of one (the reward adapter calls ``score_completions`` for whole batches)."""
        out = self.score_completions(model, tokenizer, [prompt], [completion], **{k: [v] for k, v in columns.items()})
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]


def _is_async(func: Any) -> bool:
    """``async def`` functions, partials of them and objects whose ``__call__`` is one, as TRL tells them."""
    if inspect.iscoroutinefunction(func):
        return True
    call = vars(type(func)).get("__call__") if not inspect.isroutine(func) else None
    return call is not None and inspect.iscoroutinefunction(call)


def _call(func: Callable[..., Any], name: str, call: dict[str, Any]) -> Any:
    try:
        return func(**call)
    except GRPOMagicError:
        raise
    except Exception as exc:
        raise GRPOMagicError(f"Reward function {name!r} raised {type(exc).__name__}: {one_line(exc)}; fix it (the "
                             "traceback shows where).") from exc


async def _acall(func: Callable[..., Any], name: str, call: dict[str, Any]) -> Any:
    try:
        return await func(**call)
    except Exception as exc:
        raise GRPOMagicError(f"Reward function {name!r} raised {type(exc).__name__}: {one_line(exc)}; fix it (the "
                             "traceback shows where).") from exc


def _token_ids(tokenizer: Any, completion: Any) -> list[int]:
    text = completion if isinstance(completion, str) else "".join(
        str(m.get("content", "")) for m in completion if isinstance(m, dict))
    if tokenizer is None or not text:
        return []
    return list(tokenizer(text=text, add_special_tokens=False)["input_ids"])


def from_reward_funcs(funcs: Any, dataset: Any, weights: Sequence[float] | None = None) -> type:
    """An env class from TRL-style reward functions and a dataset with a ``prompt`` column.

    ``funcs``: one function or a list, each ``f(prompts, completions, **kwargs) -> list[float | None]``,
    sync or ``async``, called as TRL's GRPOTrainer calls it (``completion_ids``, every extra column,
    ``trainer_state``, ``log_extra``, ``log_metric``). ``dataset``: a ``datasets.Dataset``, a pandas
    DataFrame or a list of dicts. The score is the weighted mean (``weights`` default to 1); each
    function's reward is the component ``components/<its name>``.
    """
    items = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
    if not items:
        raise GRPOMagicError("from_reward_funcs got no reward function; pass a function or a list of them.")
    for i, func in enumerate(items):
        if not callable(func):
            raise GRPOMagicError(f"funcs[{i}] is a {type(func).__name__}, not a function; pass reward functions "
                                 "such as def f(prompts, completions, **kwargs).")
    names = [func_name(f) for f in items]
    for name in names:
        if names.count(name) > 1 or name == "score":
            why = "two reward functions are named" if names.count(name) > 1 else "a reward function may not be named"
            raise GRPOMagicError(f"{why[0].upper() + why[1:]} {name!r} (each is a component named after it); rename "
                                 "one of them.")
    data = as_dataset(dataset, "from_reward_funcs", given=True, note=False)
    if "prompt" not in data.column_names:
        raise GRPOMagicError(f"The dataset given to from_reward_funcs has no 'prompt' column (columns: "
                             f"{', '.join(data.column_names) or 'none'}); add the prompts as 'prompt'.")
    say_converted(dataset, data, "from_reward_funcs", given=True)
    columns = [c for c in data.column_names if c != "prompt"]
    for func, name in zip(items, names, strict=True):
        _check_signature(func, name, columns)
    checked = _check_weights(weights, names)
    attrs = {
        "reward_funcs": tuple(items), "reward_names": tuple(names), "reward_weights": tuple(checked),
        "dataset": data, "__module__": __name__,
        "__doc__": f"TRL reward functions {', '.join(names)} (weights {', '.join(f'{w:g}' for w in checked)}), "
                   f"on {len(data)} prompts.",
    }
    return type("RewardFuncsEnv", (RewardFuncsEnv,), attrs)


# ---------------------------------------------------------------- reasoning-gym


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise GRPOMagicError("from_reasoning_gym needs the reasoning-gym package; pip install "
                             "'grpo-magic[reasoning-gym]' (or pip install reasoning-gym).") from exc
    return reasoning_gym


def _class_name(task: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", task) if w]
    name = "".join(w[:1].upper() + w[1:] for w in words) or "Task"
    return ("Rg" + name if name[0].isdigit() else name) + "Env"


def _field_defaults(config_cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config_cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = inspect.Parameter.empty
    return out


def _task_config(task: str, config_cls: type, values: dict[str, Any]) -> Any:
    """The task's config dataclass, validated by the task itself; its complaint becomes one sentence."""
    try:
        config = config_cls(**values)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as exc:  # noqa: BLE001 - the task's own checks (assert, ValueError...)
        raise GRPOMagicError(f"reasoning-gym task {task!r} refused its config ({type(exc).__name__}: "
                             f"{one_line(exc) or 'invalid value'}); fix the values you passed.") from exc
    return config


class ReasoningGymEnv:
    """A reasoning-gym task as an env: chat prompts with the answer-format instruction, scored by the task.

    The prompt is the task's question after ``instruction`` (reasoning-gym's own default system prompt:
    the final answer between ``<answer>`` and ``</answer>``). The score is the task's ``score_answer`` on
    what ``reasoning_gym.utils.extract_answer`` finds there; the component ``answer_format`` says
    whether the tags were there. Entries are regenerated from ``source_index`` (procedural datasets are
    deterministic for a seed), so a rescore needs only the logged columns.
    """

    task: str = ""
    instruction: str = ""
    _defaults: dict[str, Any] = {}

    def __init__(self, **config: Any) -> None:
        import reasoning_gym

        unknown = [k for k in config if k not in self._defaults]
        if unknown:
            raise GRPOMagicError(f"reasoning-gym task {self.task!r} has no setting {unknown[0]!r}; use "
                                 f"{', '.join(self._defaults)}.")
        values = {k: v for k, v in {**self._defaults, **config}.items() if v is not inspect.Parameter.empty}
        self.config = _task_config(self.task, reasoning_gym.factory.DATASETS[self.task][1], values)
        self.data = reasoning_gym.factory.DATASETS[self.task][0](config=self.config)
        self._entries: dict[int, Any] = {}

    def entry(self, index: int) -> dict[str, Any]:
        if index not in self._entries:
            self._entries[index] = self.data[index]
        return self._entries[index]

    def build_dataset(self, tokenizer: Any) -> Any:
        from datasets import Dataset

        entries = [self.entry(i) for i in range(len(self.data))]
        return Dataset.from_dict({
            "prompt": [[{"role": "system", "content": self.instruction}, {"role": "user", "content": e["question"]}]
                       for e in entries],
            "answer": ["" if e.get("answer") is None else str(e["answer"]) for e in entries],
            "source_index": list(range(len(entries))),
        })

    def score_episode(self, model: Any, tokenizer: Any, completion: str, source_index: int, **kwargs: Any) -> Any:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(completion)
        score = self.data.score_answer(answer, self.entry(int(source_index)))
        return {"score": float(score), "answer_format": float(answer is not None)}


def from_reasoning_gym(task: str, size: int = 500, seed: int = 42, **config: Any) -> type:
    """An env class for any reasoning-gym task: ``size`` questions generated with ``seed``, ``config`` the task's own settings.

    The class takes the task's settings as keyword arguments too (their defaults are the ones given
    here), so ``--rl-env-config '{"size": 100}'`` works from the CLI.
    """
    rg = _reasoning_gym()
    tasks = rg.factory.DATASETS
    if not isinstance(task, str) or task not in tasks:
        close = difflib.get_close_matches(str(task), list(tasks), n=4, cutoff=0.6)
        hint = f"close names: {', '.join(close)}" if close else f"{len(tasks)} tasks, e.g. {', '.join(sorted(tasks)[:3])}"
        raise GRPOMagicError(f"reasoning-gym has no task {task!r} ({hint}); use one of "
                             "reasoning_gym.factory.DATASETS.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise GRPOMagicError(f"size must be a whole number of questions, at least 1; got {size!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise GRPOMagicError(f"seed must be a whole number (the questions are regenerated from it), got {seed!r}; "
                             "pass seed=42 or another int.")
    dataset_cls, config_cls = tasks[task]
    defaults = _field_defaults(config_cls)
    unknown = [k for k in config if k not in defaults]
    if unknown:
        settings = ", ".join(k for k in defaults if k not in ("size", "seed"))
        raise GRPOMagicError(f"reasoning-gym task {task!r} has no setting {unknown[0]!r}; use {settings or 'none'} "
                             "(and size, seed).")
    defaults.update(config, size=size, seed=seed)
    _task_config(task, config_cls, defaults)  # the task's own checks, now rather than at the first build
    from reasoning_gym.utils import SYSTEM_PROMPTS

    name = _class_name(task)
    cls = type(name, (ReasoningGymEnv,), {
        "task": task, "instruction": SYSTEM_PROMPTS["default"], "_defaults": defaults, "__module__": __name__,
        "__doc__": f"reasoning-gym task {task!r} ({size} questions, seed {seed}), scored by its score_answer.",
    })
    # The constructor's keywords are the task's settings: rl_env_config is checked against them by name.
    cls.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in defaults.items()])
    return cls
