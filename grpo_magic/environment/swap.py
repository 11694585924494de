"""Hot swap: check a new env class against a running run, in the caller's thread.

``run.swap_env(env)`` and ``%%grpo_env NAME --swap`` replace the env a run scores with, from its
next step on (docs/architecture.md, "Hot swap"). Everything that can be wrong is found here,
before the training thread sees anything: the new class goes through the checks ``train`` runs
(``env.prepare_env``: constructor, interface, tools, dataset), and it must build the same dataset
columns and tools as the running env, since the run keeps its prompts (TRL's dataloader holds
them) and only the scoring changes. A refused swap is one ``GRPOMagicError`` sentence, and the
run goes on untouched.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

from grpo_magic.errors import GRPOMagicError

from .env import ENV_PROMPT_COLUMN, EnvSpec, PreparedEnv, check_interface, get_env, prepare_env


def source_hash(spec: EnvSpec) -> str:
    """A short SHA-256 of an env's source: the cell's code, or the class's source file lines.

    It tells two versions of a class apart in the run log; the config is part of it, as the same
    code with another config scores differently.
    """
    code = spec.code
    if code is None:
        cls = spec.cls if spec.cls is not None else type(spec.instance)
        try:
            code = inspect.getsource(cls)
        except (OSError, TypeError):  # a class made at runtime, or defined in a REPL line
            code = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', repr(cls))}"
    digest = hashlib.sha256(code.encode("utf-8", "replace"))
    digest.update(json.dumps(spec.config, sort_keys=True, default=repr).encode())
    return digest.hexdigest()[:12]


def swap_spec(env: Any, running: EnvSpec, config: dict[str, Any] | None = None) -> EnvSpec:
    """The spec to swap in: a registered name, an ``EnvSpec``, a class or an instance.

    Without ``config`` the new class gets the running env's config ("same config unless
    --config is given"); an instance is used as it is.
    """
    if isinstance(env, str):
        spec = get_env(env)
    elif isinstance(env, EnvSpec):
        spec = env
    elif inspect.isclass(env):
        check_interface(env, env.__name__)
        spec = EnvSpec(name=running.name, cls=env, source="python", module=env.__module__)
    else:
        check_interface(env, type(env).__name__)
        return EnvSpec(name=running.name, instance=env, source="python", module=type(env).__module__)
    return EnvSpec(**{**spec.__dict__, "config": dict(running.config if config is None else config)})


def _columns(prepared: PreparedEnv) -> list[str]:
    return [c for c in prepared.dataset.column_names if c != ENV_PROMPT_COLUMN]


def _tool_names(prepared: PreparedEnv) -> list[str]:
    return [t.get("function", t).get("name", "?") for t in prepared.tools]


def prepare_swap(spec: EnvSpec, running: PreparedEnv, tokenizer: Any) -> PreparedEnv:
    """The new env, built and checked as ``train`` does; refused when it no longer fits the run."""
    name = spec.cls.__name__ if spec.cls is not None else type(spec.instance).__name__
    try:
        prepared = prepare_env(spec, tokenizer)
    except GRPOMagicError as exc:  # the checks of train(), worded as a refusal
        raise GRPOMagicError(f"Swap refused, the run goes on with its env: {exc}") from exc
    if (prepared.agent is None) != (running.agent is None):
        kinds = ("an agent env (reset and tools)", "a single-turn env")
        new_kind, old_kind = kinds if prepared.agent is not None else kinds[::-1]
        raise GRPOMagicError(
            f"Swap refused, the run goes on with its env: {name} is {new_kind} but the run trains {old_kind}; keep "
            "the kind of env, or stop the run and train anew."
        )
    old, new = _columns(running), _columns(prepared)
    if set(old) != set(new):
        raise GRPOMagicError(
            f"Swap refused, the run goes on with its env: {name}'s dataset has the columns {', '.join(new)} but the "
            f"run's has {', '.join(old)}; build the same columns (the run keeps its prompts), or stop the run and "
            "train anew."
        )
    if prepared.tools != running.tools:
        raise GRPOMagicError(
            f"Swap refused, the run goes on with its env: {name}'s tools ({', '.join(_tool_names(prepared)) or 'none'})"
            f" differ from the run's ({', '.join(_tool_names(running)) or 'none'}), which its prompts were rendered "
            "with; keep the tools, or stop the run and train anew."
        )
    return prepared
