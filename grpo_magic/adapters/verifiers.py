"""verifiers v1 tasksets as grpo_magic envs (``from_verifiers``): its tasks as the prompts, its rubric as the score.

A verifiers v1 ``Taskset`` yields ``Task``\\ s: each one's ``data`` (a ``TaskData``: ``prompt``, ``system_prompt``,
its own fields) and its rubric, the ``@vf.reward`` methods (weighted; their weighted sum is the trace's reward)
and ``@vf.metric`` methods, which score a ``vf.Trace``. ``from_verifiers`` returns an env *class* (usable
wherever an env is: ``train``, ``%%grpo_env NAME`` by assignment, ``%grpo_check``, ``%grpo_rescore``):

- **single-turn** (no toolsets): the prompt is the task's system prompt and prompt; ``score_episode`` builds
  the trace verifiers would record (the prompt's messages, then the completion as the sampled assistant turn),
  runs ``Task.score`` on it, and returns ``{"score": trace.reward, <reward name>: its score, <metric>: ...}``.
- **multi-turn** (the task's or taskset's ``toolsets``): an *agent env*; each ``@vf.tool`` method of the
  toolsets, run in this process, is a tool of TRL's tool loop (named ``<server>_<tool>`` as verifiers
  advertises it), a fresh set of toolsets per episode (``setup``, then ``setup_task``), and the whole
  episode (every turn, tool calls and results) is the trace the rubric scores.

Refused in one sentence when the adapter is called: tasks that need a container or a sandbox runtime (a
reward that takes ``runtime``), a GPU, an LLM judge (a model endpoint over the network), a toolset served at a
URL, a rubric that is not ``async def`` (verifiers awaits it), an infinite taskset without ``limit``.
Importing this module does not import verifiers.
"""

from __future__ import annotations

import inspect
import json
import math
import typing
import uuid
from collections.abc import Callable
from typing import Any

from grpo_magic.environment.episodes import AsyncLoop
from grpo_magic.errors import GRPOMagicError
from grpo_magic.text import one_line

__all__ = ["from_verifiers"]

INSTALL = 'pip install "grpo-magic[verifiers]"'
_LOOP: AsyncLoop | None = None


def _loop() -> AsyncLoop:
    """One private event loop (a daemon thread) for verifiers' async scoring and tools."""
    global _LOOP
    if _LOOP is None:
        _LOOP = AsyncLoop()
    return _LOOP


def _run(coro: Any) -> Any:
    return _loop().submit(coro).result()


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise GRPOMagicError(f"from_verifiers needs the verifiers package (v1), which is not installed; {INSTALL} "
                             "(it cannot share an environment with openenv: their mcp versions conflict).") from exc
    return vf


# ---------------------------------------------------------------- messages and traces


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(getattr(p, "text", None) or (p.get("text", "") if isinstance(p, dict) else "")) for p in content)
    return "" if content is None else str(content)


def prompt_messages(data: Any) -> list[dict[str, Any]]:
    """The task's prompt as chat messages: its system prompt, then its prompt (a string is the user's turn)."""
    messages: list[dict[str, Any]] = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        for m in data.prompt or []:
            messages.append({"role": m.role, "content": _content_text(m.content)})
    return messages


def _vf_message(vf: Any, message: dict[str, Any], ids: list[str]) -> Any:
    """One chat message (as TRL gives them) as verifiers' message model."""
    role = message.get("role")
    content = _content_text(message.get("content"))
    if role == "system":
        return vf.SystemMessage(content=content)
    if role == "user":
        return vf.UserMessage(content=content)
    if role == "tool":
        call_id = ids.pop(0) if ids else uuid.uuid4().hex[:12]
        return vf.ToolMessage(tool_call_id=call_id, content=content, name=message.get("name"))
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        arguments = fn.get("arguments", {})
        call_id = str(call.get("id") or uuid.uuid4().hex[:12])
        ids.append(call_id)
        calls.append(vf.ToolCall(id=call_id, name=str(fn.get("name", "")),
                                 arguments=arguments if isinstance(arguments, str) else json.dumps(arguments)))
    return vf.AssistantMessage(content=content or None, tool_calls=calls or None)


def build_trace(task: Any, messages: list[dict[str, Any]], n_prompt: int) -> Any:
    """The trace verifiers records for these messages: one chain of nodes, the model's turns marked sampled."""
    vf = _vf()
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask

    ids: list[str] = []
    nodes = []
    for i, message in enumerate(messages):
        nodes.append(MessageNode(parent=i - 1 if i else None, message=_vf_message(vf, message, ids),
                                 sampled=i >= n_prompt and message.get("role") == "assistant"))
    return vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                    agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes)


def score_trace(task: Any, trace: Any) -> dict[str, Any]:
    """``Task.score`` on the trace: the weighted sum of its rewards as the score, each reward and metric a component."""
    _run(task.score(trace))
    missing = [name for name, r in trace.rewards.items() if r is None]
    if missing:
        raise GRPOMagicError(f"verifiers task {type(task).__name__} did not score reward {missing[0]!r}; see its "
                             "logs for why.")
    parts: dict[str, Any] = {name: r.score for name, r in trace.rewards.items()}
    for name, value in trace.metrics.items():
        if value is not None and math.isfinite(float(value)):
            parts[name if name not in parts and name != "score" else f"{name}_metric"] = float(value)
    return {"score": trace.reward, **parts}


# ---------------------------------------------------------------- what can be mapped


def _requires_runtime(fn: Callable[..., Any]) -> bool:
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _check_task(task: Any, where: str) -> None:
    """Refuse, in one sentence, what scoring in this process cannot do for this task."""
    name = type(task).__name__
    data = task.data
    if getattr(task, "NEEDS_CONTAINER", False) or data.image:
        raise GRPOMagicError(f"{where}: task {name} needs a container (image {data.image!r}) to run and score in, "
                             "which from_verifiers does not start; use a taskset whose rewards read the trace alone.")
    if data.resources.gpu:
        raise GRPOMagicError(f"{where}: task {name} asks for a GPU ({data.resources.gpu}) for its episodes, which "
                             "from_verifiers does not provide; use a taskset that runs on the trace alone.")
    if task.config.judges:
        judge = task.config.judges[0]
        raise GRPOMagicError(f"{where}: task {name} is scored by an LLM judge ({judge.id}, {judge.model} at "
                             f"{getattr(judge, 'base_url', 'its endpoint')}), a model endpoint over the network; remove "
                             "the judge (score with @vf.reward functions) to train it here.")
    rewards, metrics = task.hooks("reward"), task.hooks("metric")
    if not rewards:
        raise GRPOMagicError(f"{where}: task {name} has no @vf.reward method, so there is no score; add one.")
    for fn in (*rewards, *metrics):
        if _requires_runtime(fn):
            raise GRPOMagicError(f"{where}: {name}.{fn.__name__} needs a sandbox runtime (its 'runtime' argument), "
                                 "which from_verifiers does not start; score from the trace, or give runtime a default.")
        if not inspect.iscoroutinefunction(fn):
            raise GRPOMagicError(f"{where}: {name}.{fn.__name__} is not async def, and verifiers awaits every reward "
                                 "and metric; write it as async def.")


def _toolsets(vf: Any, taskset: Any, task: Any) -> list[Any]:
    """The tool servers of one episode: the taskset's, then the task's, fresh instances."""
    servers = [*type(taskset).toolsets(taskset.config), *type(task).toolsets(task.config)]
    for server in servers:
        if not isinstance(server, vf.Toolset):
            raise GRPOMagicError(f"verifiers taskset {type(taskset).__name__}'s toolset {type(server).__name__} is "
                                 "not a vf.Toolset; from_verifiers runs only vf.Toolset tools in this process.")
        url = getattr(server.config, "url", None)
        if url:
            raise GRPOMagicError(f"verifiers toolset {type(server).__name__} is served at {url}, over the network; "
                                 "leave its url unset so that its tools run in this process.")
    return servers


def _tools_of(server: Any) -> dict[str, Callable[..., Any]]:
    from verifiers.v1.utils.decorators import discover_decorated

    prefix = server.server_name
    out = {}
    for fn in discover_decorated(server, "tool"):
        name = getattr(fn, "tool_name", None) or fn.__name__
        out[f"{prefix}_{name}" if prefix else name] = fn
    return out


def _tool_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A typed, documented method for one verifiers tool (TRL derives its schema from them)."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an unresolvable hint: the tool's schema check says which
        hints = {}
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotations[p.name] = hints.get(p.name, str)
        params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotations[p.name]))
        lines.append(f"\n    {p.name}: {_arg_doc(fn, p.name)}")
    doc = inspect.getdoc(fn) or f"The {name} tool."
    summary = doc.split("\nArgs:")[0].strip()

    def method(self: VerifiersToolEnv, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = summary + (f"\n\nArgs:{''.join(lines)}" if lines else "")
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    return method


def _arg_doc(fn: Callable[..., Any], arg: str) -> str:
    """The argument's line of the tool's own ``Args:`` section, else its name."""
    doc = inspect.getdoc(fn) or ""
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith(f"{arg}:") or stripped.startswith(f"{arg} ("):
            return one_line(stripped.split(":", 1)[1]) or arg
    return arg


# ---------------------------------------------------------------- the envs


class VerifiersEnv:
    """A verifiers v1 taskset, single-turn: each task's prompt, scored by its rubric on the completion's trace."""

    taskset_name: str = ""
    tasks: tuple[Any, ...] = ()

    def build_dataset(self, tokenizer: Any) -> Any:
        from datasets import Dataset

        return Dataset.from_dict({"prompt": [prompt_messages(t.data) for t in self.tasks],
                                  "task_index": list(range(len(self.tasks)))})

    def score_episode(self, model: Any, tokenizer: Any, completion: str, task_index: int, **row: Any) -> Any:
        task = self.tasks[int(task_index)]
        prompt = prompt_messages(task.data)
        trace = build_trace(task, [*prompt, {"role": "assistant", "content": completion}], len(prompt))
        return score_trace(task, trace)


class VerifiersToolEnv(VerifiersEnv):
    """A verifiers v1 taskset with toolsets, multi-turn: an agent env whose tools are the toolsets' ``@vf.tool``\\ s."""

    taskset: Any = None
    tool_names_: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.servers: list[Any] = []
        self.tools: dict[str, Callable[..., Any]] = {}

    def reset(self, task_index: int, **row: Any) -> None:
        """Fresh toolsets for this episode, set up for its task."""
        vf = _vf()
        task = self.tasks[int(task_index)]
        self.servers = _toolsets(vf, self.taskset, task)
        self.tools = {}
        for server in self.servers:
            _run(server.setup())
            _run(server.setup_task(task))
            self.tools.update(_tools_of(server))

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        result = self.tools[name](**arguments)
        if inspect.isawaitable(result):
            result = _run(_awaited(result))
        return result if isinstance(result, str) else json.dumps(result, default=str)

    def score_episode(self, model: Any, tokenizer: Any, completion: str, task_index: int,
                      messages: list[dict[str, Any]] | None = None, **row: Any) -> Any:
        task = self.tasks[int(task_index)]
        prompt = prompt_messages(task.data)
        turns = list(messages) if messages else [*prompt, {"role": "assistant", "content": completion}]
        return score_trace(task, build_trace(task, turns, len(prompt)))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def from_verifiers(taskset: Any, *, limit: int | None = None) -> type:
    """An env class from a verifiers v1 ``Taskset`` (an instance, or a class built with its default config).

    Its tasks (the first ``limit`` of them; required for an infinite taskset) are the prompts, its rubric
    (``@vf.reward``, weighted and summed as verifiers does) the score, every reward and ``@vf.metric`` a
    component. With toolsets (``Task.toolsets`` / ``Taskset.toolsets``) it is an agent env whose tools are
    their ``@vf.tool`` methods, run in this process.
    """
    vf = _vf()
    if inspect.isclass(taskset) and issubclass(taskset, vf.Taskset):
        from verifiers.v1.configs.taskset import TasksetConfig
        from verifiers.v1.utils.generic import concrete_type

        config_cls = concrete_type(taskset, TasksetConfig, origin=vf.Taskset) or TasksetConfig
        try:
            taskset = taskset(config_cls())
        except Exception as exc:
            raise GRPOMagicError(f"verifiers taskset {taskset.__name__} cannot be built with its default config "
                                 f"({type(exc).__name__}: {one_line(exc)}); build it yourself and pass the "
                                 "instance.") from exc
    if not isinstance(taskset, vf.Taskset):
        hint = " (a taskset id: load it with vf.load_taskset and pass the taskset)" if isinstance(taskset, str) else ""
        raise GRPOMagicError(f"from_verifiers got a {type(taskset).__name__}{hint}, not a verifiers v1 Taskset; "
                             "pass a vf.Taskset instance or class.")
    name = type(taskset).__name__
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise GRPOMagicError(f"limit must be a whole number of tasks, at least 1; got {limit!r}.")
    if limit is None and not taskset.bounded:
        raise GRPOMagicError(f"verifiers taskset {name} is infinite; pass limit= the number of tasks to train on.")
    view = taskset.take(limit) if limit is not None else taskset
    try:
        tasks = tuple(view)
    except Exception as exc:
        raise GRPOMagicError(f"verifiers taskset {name} failed to load its tasks ({type(exc).__name__}: "
                             f"{one_line(exc)}); fix its load().") from exc
    if not tasks:
        raise GRPOMagicError(f"verifiers taskset {name} yielded no tasks; check its load() and config.")
    for task in tasks:
        _check_task(task, f"verifiers taskset {name}")
        if task.data.prompt is None:
            raise GRPOMagicError(f"verifiers taskset {name}: task {task.data.idx} has no prompt (the user opens its "
                                 "conversation), and a GRPO prompt is needed; give every task a prompt.")
    servers = _toolsets(vf, taskset, tasks[0])
    attrs: dict[str, Any] = {"taskset_name": name, "tasks": tasks, "__module__": __name__}
    if not servers:
        return type(f"{name}Env", (VerifiersEnv,), {
            **attrs, "__doc__": f"verifiers taskset {name} ({len(tasks)} tasks), scored by its rubric."})
    tools: dict[str, Callable[..., Any]] = {}
    for server in servers:
        tools.update(_tools_of(server))
    if not tools:
        raise GRPOMagicError(f"verifiers taskset {name}'s toolsets have no @vf.tool method; add one, or drop the "
                             "toolsets for a single-turn taskset.")
    clash = [n for n in tools if n in vars(VerifiersToolEnv) or n in vars(VerifiersEnv) or n.startswith("_")]
    if clash:
        raise GRPOMagicError(f"verifiers tool {clash[0]!r} has a name the agent env itself uses; rename the tool.")
    methods = {n: _tool_method(n, fn) for n, fn in tools.items()}
    return type(f"{name}Env", (VerifiersToolEnv,), {
        **attrs, "taskset": taskset, "tool_names_": tuple(methods), **methods,
        "get_tools": lambda self: [{"type": "function", "function": {"name": n}} for n in self.tool_names_],
        "__doc__": f"verifiers taskset {name} ({len(tasks)} tasks) with tools {', '.join(methods)}, scored by its "
                   "rubric on the whole episode."})
