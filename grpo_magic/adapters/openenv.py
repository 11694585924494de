"""OpenEnv environments as grpo_magic envs (``from_openenv``): the env's reset/step loop is the episode.

An OpenEnv environment (``openenv.core.Environment``: ``reset(seed=...)`` -> observation, ``step(action)`` ->
observation with ``reward`` and ``done``) becomes an env *class*, usable wherever an env is (``train``,
``%%grpo_env NAME`` by assignment, ``%grpo_check``, ``%grpo_rescore``, a module for the CLI):

- **A text action** (an ``Action`` with one text field, e.g. the echo env's ``message``): each prompt is
  the observation of ``reset(seed=row_seed)``; ``score_episode`` resets a fresh env with the same seed,
  ``step``\\ s the completion as the action and returns the observation's ``reward`` (numeric observation
  fields are components).
- **An MCP tool env** (``openenv.core.MCPEnvironment``): an *agent env*; its MCP tools are the tools of
  TRL's tool loop, each call one ``step(CallToolAction(...))`` on the episode's own env, its result (the
  observation) the tool message in the transcript; the score is the last reward an observation carried.
- **The local server** OpenEnv serves an env from (``create_app`` + uvicorn on 127.0.0.1): pass its URL,
  ``from_openenv("http://127.0.0.1:8000", action_field="message")``; each episode opens its own session.

What cannot be mapped is refused in one sentence when the adapter is called: a hub id or a URL off this
machine (the network), an action with no text field (images, tensors, numbers), an env class that cannot be
built. Importing this module does not import openenv.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import math
import numbers
import typing
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from grpo_magic.errors import GRPOMagicError
from grpo_magic.text import one_line

__all__ = ["from_openenv"]

INSTALL = 'pip install "grpo-magic[openenv]"'
#: Observation fields every OpenEnv observation has; the rest is what the env observed.
BASE_OBSERVATION_FIELDS = ("done", "reward", "metadata")
_JSON_TO_PY: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                               "object": dict}


def _openenv() -> Any:
    try:
        import openenv.core as core
    except ImportError as exc:
        raise GRPOMagicError(f"from_openenv needs the openenv package, which is not installed; {INSTALL} "
                             "(it cannot share an environment with verifiers: their mcp versions conflict).") from exc
    return core


# ---------------------------------------------------------------- observations as text


def observation_fields(observation: Any) -> dict[str, Any]:
    """What an observation says, less ``done``/``reward``/``metadata``: a dict of its own fields."""
    if hasattr(observation, "model_dump"):
        data = observation.model_dump()
    elif isinstance(observation, dict):
        data = dict(observation)
    else:
        return {"observation": observation}
    return {k: v for k, v in data.items() if k not in BASE_OBSERVATION_FIELDS}


def observation_text(observation: Any) -> str:
    """An observation as the model reads it: its one text field, else ``name: value`` lines."""
    fields = observation_fields(observation)
    texts = [v for v in fields.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in fields.items())


def _reward(observation: Any) -> Any:
    return observation.get("reward") if isinstance(observation, dict) else getattr(observation, "reward", None)


def _number(value: Any) -> float | None:
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return None


# ---------------------------------------------------------------- what the env is


def _action_type(env_cls: type) -> Any:
    """The env's action class: ``step``'s annotation, else the ``Environment[Act, Obs, State]`` parameter."""
    try:
        hints = typing.get_type_hints(env_cls.step)
    except Exception:  # noqa: BLE001 - a forward reference that does not resolve: try the generic base
        hints = {}
    action = hints.get("action")
    if inspect.isclass(action):
        return action
    for base in getattr(env_cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and inspect.isclass(args[0]):
            return args[0]
    return None


def _text_fields(action_cls: type) -> tuple[list[str], list[str]]:
    """The action's text fields and its other required fields (besides ``metadata``)."""
    text, other = [], []
    for name, info in action_cls.model_fields.items():
        if name == "metadata":
            continue
        annotation = info.annotation
        args = typing.get_args(annotation)
        if annotation is str or (args and str in args and all(a in (str, type(None)) for a in args)):
            text.append(name)
        elif info.is_required():
            other.append(name)
    return text, other


def _pick_action_field(action_cls: type, action_field: str | None, where: str) -> str:
    text, other = _text_fields(action_cls)
    name = action_cls.__name__
    if action_field is not None:
        if action_field not in action_cls.model_fields:
            raise GRPOMagicError(f"{where}'s action {name} has no field {action_field!r} (fields: "
                                 f"{', '.join(k for k in action_cls.model_fields if k != 'metadata')}); pass "
                                 "action_field= one of its text fields.")
        if action_field not in text:
            raise GRPOMagicError(f"{where}'s action field {name}.{action_field} is not text, and a completion is "
                                 "text; pass action_field= a str field, or wrap the env in one whose action is text.")
        text = [action_field]
    if not text:
        raise GRPOMagicError(f"{where}'s action {name} has no text field (fields: "
                             f"{', '.join(k for k in action_cls.model_fields if k != 'metadata') or 'none'}), so a "
                             "completion cannot be its action; from_openenv maps only text actions and MCP tool envs.")
    if other:
        raise GRPOMagicError(f"{where}'s action {name} also requires {other[0]!r}, which a completion cannot fill; "
                             "give it a default, or wrap the env in one whose action is the text alone.")
    if len(text) > 1:
        raise GRPOMagicError(f"{where}'s action {name} has several text fields ({', '.join(text)}); pass "
                             "action_field= the one the completion fills.")
    return text[0]


def _refuse_remote(source: str) -> None:
    parsed = urlparse(source)
    if parsed.scheme not in ("http", "https", "ws", "wss"):
        raise GRPOMagicError(
            f"from_openenv got {source!r}, which names a hub-hosted environment: running it needs the network, "
            "which this machine does not reach; pass the env class (pip install its package) or the URL of its "
            "local server, http://127.0.0.1:PORT.")
    host = parsed.hostname or ""
    local = host == "localhost"
    try:
        local = local or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not local:
        raise GRPOMagicError(f"from_openenv got the server {source!r}, which is not on this machine; only a local "
                             "server (http://127.0.0.1:PORT, as OpenEnv's create_app + uvicorn serves one) is "
                             "reached, so start the env there or pass its class.")


# ---------------------------------------------------------------- episodes


class _InProcess:
    """One episode's env, built in this process (a fresh one per episode: envs keep state)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.env = make()

    def reset(self, **kwargs: Any) -> Any:
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        return self.env.step(action)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


class _Served:
    """One episode's session on the local server (OpenEnv's ``GenericEnvClient``, synchronously)."""

    def __init__(self, url: str) -> None:
        from openenv.core import GenericEnvClient

        self.client = GenericEnvClient(base_url=url).sync()
        self.client.connect()

    def reset(self, **kwargs: Any) -> Any:
        result = self.client.reset(**kwargs)
        return {**(result.observation or {}), "reward": result.reward, "done": result.done}

    def step(self, action: Any) -> Any:
        result = self.client.step(action)
        return {**(result.observation or {}), "reward": result.reward, "done": result.done}

    def close(self) -> None:
        self.client.close()


class OpenEnvTextEnv:
    """An OpenEnv env whose action is text: one ``step`` with the completion, scored by its reward.

    Each row's ``seed`` (and any ``reset_kwargs``) resets a fresh env, so a rescore replays the episode from the
    logged columns alone.
    """

    openenv_name: str = ""
    open_episode: Callable[[], Any] = staticmethod(lambda: None)  # type: ignore[assignment]
    make_action: Callable[[str], Any] = staticmethod(lambda text: text)  # type: ignore[assignment]
    n_prompts: int = 16
    seed: int = 0
    reset_kwargs: dict[str, Any] = {}
    system_prompt: str | None = None

    def build_dataset(self, tokenizer: Any) -> Any:
        from datasets import Dataset

        rows: dict[str, list[Any]] = {"prompt": [], "seed": []}
        for i in range(self.n_prompts):
            episode = self.open_episode()
            try:
                observation = episode.reset(seed=self.seed + i, **self.reset_kwargs)
            finally:
                episode.close()
            text = observation_text(observation)
            rows["prompt"].append(text if self.system_prompt is None else
                                  [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}])
            rows["seed"].append(self.seed + i)
        return Dataset.from_dict(rows)

    def score_episode(self, model: Any, tokenizer: Any, completion: str, seed: int, **columns: Any) -> Any:
        episode = self.open_episode()
        try:
            episode.reset(seed=int(seed), **self.reset_kwargs)
            observation = episode.step(self.make_action(completion))
        finally:
            episode.close()
        reward = _number(_reward(observation))
        if reward is None:
            raise GRPOMagicError(f"OpenEnv env {self.openenv_name} returned no numeric reward for the step "
                                 f"(reward={_reward(observation)!r}); set observation.reward in its step().")
        parts = {k: float(v) for k, v in observation_fields(observation).items()
                 if not isinstance(v, bool) and _number(v) is not None}
        return {"score": reward, **parts}


class OpenEnvToolEnv:
    """An OpenEnv MCP tool env as an agent env: its MCP tools run through TRL's tool loop, one ``step`` each."""

    openenv_name: str = ""
    make_env: Callable[[], Any] = staticmethod(lambda: None)  # type: ignore[assignment]
    tool_specs: tuple[dict[str, Any], ...] = ()
    prompts: tuple[Any, ...] = ()
    seed: int = 0

    def __init__(self) -> None:
        self.env: Any = None
        self.rewards: list[float] = []
        self.observations: list[str] = []

    def build_dataset(self, tokenizer: Any) -> Any:
        from datasets import Dataset

        prompts = [p if isinstance(p, list) else [{"role": "user", "content": str(p)}] for p in self.prompts]
        return Dataset.from_dict({"prompt": prompts, "seed": [self.seed + i for i in range(len(prompts))]})

    def get_tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                  "parameters": t["input_schema"]}} for t in self.tool_specs]

    def reset(self, seed: int = 0, **row: Any) -> None:
        """A fresh OpenEnv env for this episode, reset with the row's seed."""
        if self.env is not None:
            _close(self.env)
        self.env = self.make_env()
        self.rewards, self.observations = [], []
        observation = self.env.reset(seed=int(seed))
        self._note(observation)

    def _note(self, observation: Any) -> None:
        reward = _number(_reward(observation))
        if reward is not None:
            self.rewards.append(reward)

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        from openenv.core import CallToolAction

        observation = self.env.step(CallToolAction(tool_name=name, arguments=arguments))
        self._note(observation)
        error = getattr(observation, "error", None)
        if error is not None:
            raise RuntimeError(getattr(error, "message", str(error)))
        return _tool_result_text(getattr(observation, "result", observation))

    def score_episode(self, model: Any, tokenizer: Any, completion: str, **row: Any) -> Any:
        """The last reward the episode's observations carried (a tool env's reward comes from its steps)."""
        if not self.rewards:
            raise GRPOMagicError(f"OpenEnv env {self.openenv_name} gave no reward in this episode (no observation "
                                 "carried one); the episode's tool calls set it, so the model called none.")
        return {"score": self.rewards[-1], "steps": float(len(self.rewards) - 1)}


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001, S110 - a close that fails must not fail the next episode
            pass


def _tool_result_text(result: Any) -> str:
    """An MCP tool result as the tool message the model reads: its text content, else its data as JSON."""
    content = getattr(result, "content", None)
    if content:
        texts = [getattr(c, "text", None) for c in content]
        if all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    data = getattr(result, "data", result)
    return data if isinstance(data, str) else json.dumps(data, default=str)


def _tool_method(spec: dict[str, Any]) -> Callable[..., Any]:
    """A typed, documented method for one MCP tool (TRL derives the tool's schema from it)."""
    name = spec["name"]
    schema = spec["input_schema"] or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    for arg, prop in props.items():
        kind = prop.get("type")
        py = _JSON_TO_PY.get(kind if isinstance(kind, str) else "string", str)
        annotations[arg] = py if arg in required else (py | None)
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[arg],
                                        **({} if arg in required else {"default": None})))
    args_doc = "".join(f"\n    {a}: {one_line(p.get('description') or p.get('title') or a)}" for a, p in props.items())
    description = one_line(spec.get("description") or f"The {name} tool.")

    def method(self: OpenEnvToolEnv, **arguments: Any) -> str:
        return self._call_tool(name, {k: v for k, v in arguments.items() if v is not None})

    method.__name__ = method.__qualname__ = name
    method.__doc__ = description + (f"\n\nArgs:{args_doc}" if props else "")
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    return method


def _list_tools(env: Any) -> list[dict[str, Any]]:
    from openenv.core import ListToolsAction

    observation = env.step(ListToolsAction())
    error = (getattr(observation, "metadata", None) or {}).get("error")
    if error:
        raise GRPOMagicError(f"The OpenEnv env could not list its MCP tools ({one_line(error)}); fix its server.")
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in observation.tools]


def _class_name(name: str) -> str:
    name = "".join(ch for ch in name if ch.isalnum()) or "OpenEnv"
    return name if name.endswith("Env") else name + "Env"


def from_openenv(env: Any, *, action_field: str | None = None, n_prompts: int = 16, seed: int = 0,
                 prompts: list[Any] | None = None, system_prompt: str | None = None,
                 reset_kwargs: dict[str, Any] | None = None, **env_kwargs: Any) -> type:
    """An env class from an OpenEnv environment: its reset/step loop as the episode, its reward as the score.

    ``env``: an ``openenv.core.Environment`` subclass (built with ``env_kwargs``, one per episode), or the URL
    of its local server (``http://127.0.0.1:PORT``). A text-action env gives ``n_prompts`` prompts, the
    observations of ``reset(seed=seed + i)`` (``system_prompt`` makes them chat prompts); ``action_field``
    names the action's text field when it has several. An ``MCPEnvironment`` is an agent env whose tools are
    its MCP tools; ``prompts`` (its requests to the model) is then required.
    """
    core = _openenv()
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise GRPOMagicError(f"n_prompts must be a whole number of prompts, at least 1; got {n_prompts!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise GRPOMagicError(f"seed must be a whole number of at least 0 (OpenEnv's reset takes seeds >= 0); got {seed!r}.")
    reset_kwargs = dict(reset_kwargs or {})
    if isinstance(env, str):
        _refuse_remote(env)
        if env_kwargs:
            raise GRPOMagicError(f"from_openenv got env settings ({', '.join(env_kwargs)}) for a server, which builds "
                                 "its env itself; pass them where the server starts.")
        if action_field is None:
            raise GRPOMagicError("from_openenv needs action_field= for a server (the name of its action's text "
                                 "field, e.g. 'message'): the client cannot read the action's class.")
        url = env.rstrip("/")
        attrs = {"openenv_name": url, "open_episode": staticmethod(lambda: _Served(url)),
                 "make_action": staticmethod(lambda text: {action_field: text}), "n_prompts": n_prompts,
                 "seed": seed, "reset_kwargs": reset_kwargs, "system_prompt": system_prompt, "__module__": __name__,
                 "__doc__": f"The OpenEnv server at {url}: the completion is the action's {action_field!r}."}
        try:
            _Served(url).close()
        except Exception as exc:  # noqa: BLE001 - refused connection, timeout, handshake
            raise GRPOMagicError(f"from_openenv could not reach the OpenEnv server at {url} ({type(exc).__name__}: "
                                 f"{one_line(exc)}); start it first (uvicorn on 127.0.0.1) or pass the env class.") from exc
        return type("OpenEnvServerEnv", (OpenEnvTextEnv,), attrs)
    if not inspect.isclass(env) or not issubclass(env, core.Environment):
        what = "an instance" if isinstance(env, core.Environment) else type(env).__name__
        raise GRPOMagicError(f"from_openenv got {what}, not an OpenEnv Environment class; pass the class (one env "
                             "is built per episode, as OpenEnv's server does) or the URL of its local server.")
    name = env.__name__

    def make() -> Any:
        try:
            return env(**env_kwargs)
        except Exception as exc:
            raise GRPOMagicError(f"OpenEnv env {name}({', '.join(f'{k}=...' for k in env_kwargs)}) could not be "
                                 f"built ({type(exc).__name__}: {one_line(exc)}); fix the settings you passed.") from exc

    probe = make()  # now, so that a bad setting is one sentence here, not an error per episode
    mcp_env = core.MCPEnvironment is not None and isinstance(probe, core.MCPEnvironment)
    if mcp_env:
        try:
            probe.reset(seed=seed)
            specs = _list_tools(probe)
        finally:
            _close(probe)
        if not specs:
            raise GRPOMagicError(f"OpenEnv env {name} is an MCP env with no tools; register tools on its FastMCP "
                                 "server (@mcp.tool), or give it a text action.")
        if not prompts:
            raise GRPOMagicError(f"OpenEnv env {name} is an MCP tool env: pass prompts= (what the model is asked "
                                 "to do with its tools), a list of strings or chat messages.")
        methods = {s["name"]: _tool_method(s) for s in specs}
        clash = [n for n in methods if n in vars(OpenEnvToolEnv) or n.startswith("_")]
        if clash:
            raise GRPOMagicError(f"OpenEnv env {name}'s tool {clash[0]!r} has a name the agent env itself uses; "
                                 "rename the tool.")
        return type(_class_name(name), (OpenEnvToolEnv,), {
            "openenv_name": name, "make_env": staticmethod(make), "tool_specs": tuple(specs),
            "prompts": tuple(prompts), "seed": seed, "__module__": __name__, **methods,
            "__doc__": f"OpenEnv MCP env {name}: tools {', '.join(methods)}; the score is its last reward."})
    _close(probe)
    if prompts is not None:
        raise GRPOMagicError(f"OpenEnv env {name} has a text action: its prompts are its reset observations, so "
                             "prompts= is only for MCP tool envs; use n_prompts= and seed=.")
    action_cls = _action_type(env)
    if action_cls is None or not hasattr(action_cls, "model_fields"):
        raise GRPOMagicError(f"OpenEnv env {name}'s action type cannot be read (annotate step(self, action: "
                             "MyAction) or subclass Environment[MyAction, MyObservation, State]); then its text "
                             "field becomes the completion.")
    field = _pick_action_field(action_cls, action_field, f"OpenEnv env {name}")

    def make_action(text: str) -> Any:
        return action_cls(**{field: text})

    def open_episode() -> Any:
        return _InProcess(make)

    return type(_class_name(name), (OpenEnvTextEnv,), {
        "openenv_name": name, "open_episode": staticmethod(open_episode), "make_action": staticmethod(make_action),
        "n_prompts": n_prompts, "seed": seed, "reset_kwargs": reset_kwargs, "system_prompt": system_prompt,
        "__module__": __name__,
        "__doc__": f"OpenEnv env {name}: the completion is its {action_cls.__name__}.{field}; the score its reward."})

