"""Agent envs: an env with ``reset(**row)`` and tool methods, whose whole episode TRL runs and trains.

An env class that defines ``reset`` is an *agent env* (docs/architecture.md, "Agent episodes"). TRL's
tool loop (``GRPOTrainer(environment_factory=...)``) runs each episode: one instance per rollout,
``reset(**row)`` before it, the model's tool calls executed on that instance, tool results fed back,
the later assistant turns generated and trained (tool-result tokens masked out of the loss). We never
write a loop of our own; this module only makes a user's class fit TRL's factory contract:

- TRL turns *every* public function of the instance's class into a tool (``reset`` and ``get_reward``
  aside), which would expose ``build_dataset`` and ``score_episode``. So TRL gets a generated class
  (``AgentEpisode`` subclass) that holds the user's instance and exposes only ``reset`` and the tools:
  the env's public methods with type hints and a docstring, or only those ``get_tools()`` names.
- Each tool call is recorded on the episode (name, arguments, error), so that a failing tool is counted
  and the transcript marks it, while TRL still feeds the exception to the model as it always does.
- After the episode, ``score_episode`` runs once on the user's instance that ran it (``reward``), with
  ``completion`` the last assistant turn and, when named, ``messages`` and ``tool_calls``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_magic.errors import GRPOMagicError
from grpo_magic.text import one_line
from grpo_magic.trl_compat import TOOL_ERROR_PREFIX, environment_tool_names

#: Methods of an env that are never tools.
RESERVED_METHODS = ("build_dataset", "score_episode", "get_tools", "reset", "get_reward")
#: Keyword arguments ``score_episode`` of an agent env may name, filled from the episode itself.
EPISODE_KWARGS = ("messages", "tool_calls")


def is_agent_env(obj: Any) -> bool:
    """True for an env class or instance that defines ``reset`` (callable or not: a bad one is an error)."""
    return hasattr(_env_class(obj), "reset")


def _env_class(obj: Any) -> type:
    return obj if inspect.isclass(obj) else type(obj)


def tool_names(env: Any, declared: list[dict[str, Any]] | None = None) -> list[str]:
    """The env's tools: the methods ``declared`` (its ``get_tools()`` schemas) names, else every public method."""
    cls = _env_class(env)
    name = cls.__name__
    reset = getattr(cls, "reset", None)
    if not callable(reset):
        raise GRPOMagicError(
            f"{name}.reset is a {type(reset).__name__}, not a method; an agent env defines "
            "def reset(self, **row) to set up each episode from its dataset row (or remove reset for a single-turn env)."
        )
    if declared:
        named = [t.get("function", t)["name"] for t in declared]
        missing = [n for n in named if not callable(getattr(cls, n, None)) or n.startswith("_")]
        if missing:
            raise GRPOMagicError(
                f"{name}.get_tools() names {missing[0]!r}, but {name} has no public method of that name "
                f"(methods: {', '.join(_public_methods(cls)) or 'none'}); add the method or fix the schema's name."
            )
        return list(dict.fromkeys(named))
    return _public_methods(cls)


def _public_methods(cls: type) -> list[str]:
    """The tools TRL offers of an env of class ``cls`` (TRL's rule), less the env interface's own methods."""
    return environment_tool_names(cls, also_not=RESERVED_METHODS)


def tool_schemas(env: Any, names: list[str]) -> list[dict[str, Any]]:
    """The function schemas TRL will render for these tools, derived from type hints and docstrings.

    Derived exactly as TRL does (``transformers.utils.get_json_schema``), so that a method TRL could not
    describe to the model is one clear sentence here, before any model loads.
    """
    from transformers.utils import get_json_schema

    cls = _env_class(env)
    schemas = []
    for n in names:
        method = getattr(cls, n)
        try:
            schemas.append(get_json_schema(method))
        except Exception as exc:  # noqa: BLE001 - TypeHintParsingException, DocstringParsingException
            raise GRPOMagicError(
                f"Tool {cls.__name__}.{n}() cannot be described to the model ({one_line(exc)}); give every argument "
                "a type hint and write a docstring with an Args: section describing each one (as TRL derives tool "
                "schemas), or make it private with a leading underscore."
            ) from None
    return schemas


# ---------------------------------------------------------------- what TRL instantiates


@dataclass
class ToolCall:
    """One tool call of an episode, as the tool method saw it."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


class AgentEpisode:
    """What TRL's ``environment_factory`` builds: the user's env, with only ``reset`` and its tools public.

    Subclasses are generated per env class (``episode_class``); the tool methods are added there.
    """

    def __init__(self, spec: AgentSpec) -> None:
        self._spec = spec
        self._calls: list[ToolCall] = []
        self._new_env()

    def _new_env(self) -> None:
        self._version = self._spec.version
        self._env = self._spec.make_env()
        self._reset_params = _accepted_params(self._env.reset)

    def reset(self, **row: Any) -> Any:
        if self._version != self._spec.version:  # the env was swapped: TRL's pooled episodes take the new class
            self._new_env()
        self._calls = []
        names, var_kw = self._reset_params
        return self._env.reset(**(row if var_kw else {k: v for k, v in row.items() if k in names}))


def _accepted_params(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set(), True
    return ({p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)},
            any(p.kind is p.VAR_KEYWORD for p in params))


def _tool(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """A tool method of the generated class: calls the user's method, records the call, re-raises errors.

    ``functools.wraps`` keeps the name, docstring, annotations and signature that TRL derives the schema from.
    """
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_tool(self: AgentEpisode, *args: Any, **kwargs: Any) -> Any:
            call = ToolCall(name, dict(kwargs))
            self._calls.append(call)
            try:
                return await getattr(self._env, name)(*args, **kwargs)
            except Exception as exc:
                call.error = f"{type(exc).__name__}: {one_line(exc)}"
                raise

        return async_tool

    @functools.wraps(method)
    def tool(self: AgentEpisode, *args: Any, **kwargs: Any) -> Any:
        call = ToolCall(name, dict(kwargs))
        self._calls.append(call)
        try:
            return getattr(self._env, name)(*args, **kwargs)
        except Exception as exc:
            call.error = f"{type(exc).__name__}: {one_line(exc)}"
            raise

    return tool


def episode_class(env_cls: type, names: list[str]) -> type[AgentEpisode]:
    """A subclass of ``AgentEpisode`` with one method per tool of ``env_cls``."""
    methods = {n: _tool(n, getattr(env_cls, n)) for n in names}
    return type(f"{env_cls.__name__}Episode", (AgentEpisode,), {"__module__": __name__, **methods})


@dataclass
class AgentSpec:
    """An agent env ready for TRL: its tools, their schemas, and the factory TRL calls per rollout.

    ``make_env`` builds the user's env of one episode; ``swap`` replaces it (a hot swap, in the training
    thread between two steps), and every episode instance TRL pools takes the new env at its next reset.
    """

    tool_names: list[str]
    schemas: list[dict[str, Any]]
    make_env: Callable[[], Any] = field(repr=False)
    episode_cls: type[AgentEpisode] = field(repr=False)
    version: int = 0

    def factory(self) -> AgentEpisode:
        """What TRL's ``environment_factory`` calls: one episode instance per rollout."""
        return self.episode_cls(self)

    def swap(self, make_env: Callable[[], Any]) -> None:
        self.make_env = make_env
        self.version += 1


def agent_spec(env: Any, make_env: Callable[[], Any], declared: list[dict[str, Any]] | None = None) -> AgentSpec:
    """Validate an agent env (``env``, an instance) and build TRL's factory; ``make_env`` gives a fresh env.

    ``declared``: the env's ``get_tools()`` schemas, when it has them (only the methods they name are tools).
    """
    names = tool_names(env, declared)
    if not names:
        raise GRPOMagicError(
            f"Agent env {type(env).__name__} has reset() but no tools; add public methods with type hints and a "
            "docstring (they become the tools), or remove reset for a single-turn env."
        )
    schemas = tool_schemas(env, names)
    cls = episode_class(type(env), names)
    return AgentSpec(tool_names=names, schemas=schemas, make_env=make_env, episode_cls=cls)


# ---------------------------------------------------------------- after the episode


def not_offered_calls(turns: list[dict[str, Any]]) -> list[str]:
    """The names of the tools an episode's transcript called that were not offered, in order."""
    return [str(t.get("name", "")) for t in turns if t.get("role") == "tool" and t.get("not_offered")]


def unparsed_calls(turns: list[dict[str, Any]]) -> int:
    """Assistant turns that wrote a ``<tool_call>`` TRL could not parse (it then keeps the reply as text)."""
    return sum(1 for t in turns if t.get("role") == "assistant" and "<tool_call>" in str(t.get("content") or ""))


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The text of the episode's last assistant turn (its final answer)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


#: The Python types of JSON-schema's types, as ``transformers.utils.get_json_schema`` writes them for a typed method.
_JSON_TYPES: dict[str, tuple[type, ...]] = {"integer": (int,), "number": (int, float), "boolean": (bool,),
                                            "string": (str,), "array": (list, tuple), "object": (dict,),
                                            "null": (type(None),)}


def _of_type(value: Any, kind: Any) -> bool:
    """``value`` is of JSON type ``kind`` (a name, a list of names, or none given: anything); a bool is no number."""
    if kind is None:
        return True
    kinds = kind if isinstance(kind, list) else [kind]
    for k in kinds:
        types = _JSON_TYPES.get(str(k))
        if types is None:
            return True  # a type this check does not know: the tool's own code judges
        if isinstance(value, types) and not (isinstance(value, bool) and k in ("integer", "number")):
            return True
    return False


def fits_schema(arguments: Any, schema: dict[str, Any]) -> bool:
    """A call the tool's own code can take as its signature declares: every required argument there, no unknown
    one, each of its JSON-schema type (an enum's value among its options). ``%grpo_check``'s typed share and
    tiny-agent's corpus measure calls by it."""
    if not isinstance(arguments, dict):
        return False
    parameters = schema.get("function", schema).get("parameters") or {}
    props = parameters.get("properties") or {}
    if not set(parameters.get("required") or ()) <= set(arguments) <= set(props):
        return False
    for key, value in arguments.items():
        prop = props[key]
        if value is None and prop.get("nullable"):  # ``x: T | None`` in the method's signature
            continue
        if not _of_type(value, prop.get("type")) or ("enum" in prop and value not in prop["enum"]):
            return False
    return True


def tool_calls_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tool call of the episode's assistant turns, as ``{"name", "arguments"}``, in order."""
    calls = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                fn = call.get("function", call) if isinstance(call, dict) else {}
                calls.append({"name": str(fn.get("name", "")), "arguments": fn.get("arguments", {})})
    return calls


def transcript(messages: list[dict[str, Any]], calls: list[ToolCall] | None = None,
               offered: list[str] | None = None) -> list[dict[str, Any]]:
    """The episode's turns as plain JSON: assistant text and tool calls, tool results (marked when they failed).

    TRL feeds a failing tool's exception to the model as ``{'error': ...}``; the episode's own record of
    the calls (``calls``) says which results were errors, also for a tool that returned normally. A call
    to a tool that is not among the ``offered`` names (TRL answered ``Tool ... not found.``) is marked
    ``not_offered``: a model that does not read the schemas in its prompt calls such tools.
    """
    recorded = list(calls or [])
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        content = message.get("content")
        if not isinstance(content, str):
            content = "" if content is None else str(content)
        if role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": content}
            calls_here = tool_calls_of([message])
            if calls_here:
                turn["tool_calls"] = calls_here
            out.append(turn)
        elif role == "tool":
            name = str(message.get("name", ""))
            error = None
            if recorded and recorded[0].name == name:  # a tool of the env ran: its own record says how it went
                error = recorded.pop(0).error
            elif content.startswith(TOOL_ERROR_PREFIX):  # TRL answered itself: an unknown tool, a bad call
                error = content
            turn = {"role": "tool", "name": name, "content": content}
            if error:
                turn["error"] = error
                if offered is not None and name not in offered:
                    turn["not_offered"] = True
            out.append(turn)
        else:
            out.append({"role": role, "content": content})
    return out


# ---------------------------------------------------------------- replaying a logged episode


def trl_messages(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A transcript (``transcript``) back in TRL's message form, as reward functions receive episodes."""
    out = []
    for turn in turns:
        if turn.get("role") == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": turn.get("content", "")}
            if turn.get("tool_calls"):
                message["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                                         for c in turn["tool_calls"]]
            out.append(message)
        elif turn.get("role") == "tool":
            out.append({"role": "tool", "name": turn.get("name", ""), "content": turn.get("content", "")})
        else:
            out.append({"role": turn.get("role", ""), "content": turn.get("content", "")})
    return out


def replay_episode(spec: AgentSpec, row: dict[str, Any], turns: list[dict[str, Any]]) -> AgentEpisode:
    """A fresh episode instance, reset with ``row``, that makes the logged tool calls again in order.

    Re-scoring an agent episode needs the state its tool calls left (bookings, answers seen...). The
    calls themselves are in the transcript, so they are made again on a new instance: for tools that
    give the same result for the same calls, the state is the episode's. A call the episode's env did
    not run (an unknown tool) is skipped; one that raises is recorded as it was in training.
    """
    episode = spec.factory()
    episode.reset(**row)
    tools = set(spec.tool_names)
    for turn in turns:
        for call in turn.get("tool_calls") or [] if turn.get("role") == "assistant" else []:
            name, arguments = call.get("name"), call.get("arguments")
            if name in tools and isinstance(arguments, dict):
                try:
                    getattr(episode, name)(**arguments)
                except Exception:  # noqa: BLE001 - recorded on the episode by the tool wrapper, as in training
                    continue
    return episode
