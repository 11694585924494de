"""One stream of typed run events, and the run log that records every one of them.

Training talks to the outside world only through this stream (docs/architecture.md, "The flow"): the run log,
the notebook dashboard and the terminal progress are all subscribers. Events are plain
dataclasses that turn into JSON objects with a ``type`` key, so that a run log on disk can be
read back (as data only, never as code) and replayed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .redaction import redact

logger = logging.getLogger(__name__)

RUN_LOG_NAME = "events.jsonl"

@dataclass
class Event:
    """Base of every event: ``time`` is seconds since the epoch when it happened."""

    time: float = field(default_factory=time.time, kw_only=True)

    @property
    def type(self) -> str:
        return EVENT_TYPES_BY_CLASS[type(self)]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["type"] = self.type
        return data


@dataclass
class RunStarted(Event):
    """A run began: its parameters (as ``GRPOParams.to_dict()``), env and where it writes."""

    params: dict[str, Any]
    env_name: str
    model: str
    output_dir: str
    max_steps: int | None = None
    #: Every GRPOConfig setting of the run that differs from TRL's default (``GRPOParams.trl_differences``).
    trl_config: dict[str, Any] | None = None


@dataclass
class StatusChanged(Event):
    """A phase change: ``starting``, ``loading model``, ``training``, ``stopping``, ``saving``."""

    status: str
    message: str = ""


@dataclass
class EpisodeError(Event):
    """One ``score_episode`` call that gave no usable score; its completion got no reward."""

    step: int
    index: int
    kind: str
    message: str
    traceback: str = ""


@dataclass
class GroupScored(Event):
    """One prompt's group of completions with the env's scores and the advantages TRL used.

    ``scores[i]`` is None for an episode error (see ``errors[i]``). ``clipped[i]`` is True when
    the env returned a value outside [0, 1] that was clipped. ``components[i]`` holds the numbers
    ``score_episode`` returned besides ``"score"`` and ``warnings[i]`` what was wrong with them (both
    empty lists when the env returns plain numbers). ``columns`` is the prompt's dataset row beyond
    the prompt text, so that ``rescore`` can score the completions again with the same arguments.
    """

    step: int
    group: int
    prompt: str
    completions: list[str]
    scores: list[float | None]
    advantages: list[float]
    errors: list[dict[str, Any] | None]
    clipped: list[bool]
    raw_scores: list[Any] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    components: list[dict[str, float]] = field(default_factory=list)
    warnings: list[list[str]] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    #: Agent envs: per completion, the episode's turns after the prompt (assistant text and tool calls, tool
    #: results); empty for single-turn envs, whose completion is the whole episode.
    transcripts: list[list[dict[str, Any]]] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        valid = [s for s in self.scores if s is not None]
        return sum(valid) / len(valid) if valid else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation, as TRL's ``nanstd`` computes it for a group."""
        valid = [s for s in self.scores if s is not None]
        if len(valid) < 2:
            return 0.0 if valid else None
        m = sum(valid) / len(valid)
        return math.sqrt(sum((s - m) ** 2 for s in valid) / (len(valid) - 1))

    @property
    def zero_variance(self) -> bool:
        valid = [s for s in self.scores if s is not None]
        return len(valid) > 0 and max(valid) - min(valid) < 1e-9


@dataclass
class StepLogged(Event):
    """TRL's logged metrics for one optimizer step, with TRL's names (``reward``, ``kl``...)."""

    step: int
    metrics: dict[str, float | None]
    max_steps: int | None = None
    epoch: float | None = None
    elapsed_s: float | None = None
    episode_errors: int = 0
    episodes: int = 0
    #: Episodes abandoned past rl_episode_timeout (this step or before) whose thread still runs.
    episodes_abandoned: int = 0


@dataclass
class EnvSwapped(Event):
    """A running run scores with another env class from ``step`` on (``%%grpo_env NAME --swap``).

    ``source_hash`` is a short SHA-256 of the new class's source, so that the run log says which
    version of the code scored which steps; ``previous_hash`` is the one it replaced.
    """

    step: int
    env_name: str
    class_name: str
    source_hash: str
    previous_hash: str = ""
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalScored(Event):
    """An evaluation on the held-out prompts during a run (``--eval-steps``; docs/architecture.md, "Evaluation").

    ``baseline`` marks the one before training (step 0). ``sampled_mean`` and ``pass_at_k`` come from
    TRL's own eval loop (``samples`` = ``num_generations_eval`` completions a prompt, on the generation
    path of training); ``greedy_mean`` from one greedy episode a prompt (None for agent envs in a run).
    ``trl_metrics`` are TRL's ``eval_*`` logs; ``rows`` per prompt: ``prompt``, ``greedy``,
    ``greedy_score``, ``sampled_scores``. ``seconds``: what the evaluation cost the run.
    """

    step: int
    prompts: int
    greedy_mean: float | None
    sampled_mean: float | None = None
    pass_at_k: dict[str, float | None] = field(default_factory=dict)
    greedy_ci: list[float] | None = None
    sampled_ci: list[float] | None = None
    components: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    samples: int = 0
    baseline: bool = False
    seconds: float = 0.0
    trl_metrics: dict[str, float | None] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AlarmRaised(Event):
    """The reward-hacking watch fired (``grpo_magic.watch``; docs/explanation/watch.md): at ``step``, an alarm of
    ``kind`` (divergence, repetition, collapse, length, proxy) with one sentence and its ``evidence``: the metric
    values over the window and two or three example completions."""

    step: int
    kind: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunFinished(Event):
    """The end of a run: ``completed``, ``stopped`` or ``failed``, with the reason and what was saved."""

    status: str
    reason: str = ""
    output_dir: str = ""
    steps: int = 0
    saved: list[str] = field(default_factory=list)


EVENT_TYPES_BY_CLASS: dict[type, str] = {
    RunStarted: "run_started",
    StatusChanged: "status_changed",
    EpisodeError: "episode_error",
    GroupScored: "group_scored",
    StepLogged: "step_logged",
    AlarmRaised: "alarm_raised",
    EnvSwapped: "env_swapped",
    EvalScored: "eval_scored",
    RunFinished: "run_finished",
}
EVENT_CLASSES_BY_TYPE: dict[str, type] = {v: k for k, v in EVENT_TYPES_BY_CLASS.items()}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from its JSON object; unknown keys are ignored (newer writers).

    Data only: the ``type`` picks one of our dataclasses from a fixed table, and each field must
    have its declared JSON type, else ``ValueError``. Nothing in a log is imported or evaluated.
    """
    cls = EVENT_CLASSES_BY_TYPE.get(data.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown event type {data.get('type')!r}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            if not _json_type_ok(str(f.type), data[f.name]):
                raise ValueError(f"{cls.__name__}.{f.name} has the wrong type: {type(data[f.name]).__name__}")
            kwargs[f.name] = data[f.name]
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"{cls.__name__}: {exc}") from None


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,),
}


def _json_type_ok(annotation: str, value: Any) -> bool:
    """Does a JSON value fit a field's annotation (``int``, ``float | None``, ``list[str]``...)?"""
    while "[" in annotation:  # drop type arguments, innermost first: list[dict[str, Any] | None] is a list
        annotation = re.sub(r"\[[^\[\]]*\]", "", annotation)
    kinds = [part.strip() for part in annotation.split("|")]
    if value is None:
        return "None" in kinds or "Any" in kinds
    allowed = tuple(t for k in kinds if k != "None" for t in _JSON_TYPES.get(k, (object,)))
    if isinstance(value, bool) and bool not in allowed and object not in allowed:
        return False
    return isinstance(value, allowed)


def _json_default(value: Any) -> Any:
    # numpy and torch scalars reach us from envs and TRL; store them as plain numbers.
    if hasattr(value, "item"):
        try:
            return value.item()
        except Exception:  # noqa: BLE001 - fall through to repr for anything odd
            pass
    return repr(value)


def _clean(value: Any) -> Any:
    """Make a value strict JSON: NaN and inf become None (``json`` would write invalid tokens)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # each event class's field names, read once


def event_to_json(event: Event) -> str:
    # A shallow dict is enough: _clean copies every list and dict anyway, and it is three times
    # faster than to_dict()'s deep copy (every event of every step goes through here).
    names = _FIELD_NAMES.get(type(event))
    if names is None:
        names = _FIELD_NAMES[type(event)] = tuple(f.name for f in dataclasses.fields(event))
    data = {name: getattr(event, name) for name in names}
    data["type"] = event.type
    try:  # most events hold no NaN or inf: written as they are, without _clean's copy of every list
        return json.dumps(data, default=_json_default, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(_clean(data), default=_json_default, ensure_ascii=False)


Subscriber = Callable[[Event], None]


class RecentList(list):
    """A list that keeps its last ``maxlen`` items: ``run.groups`` and ``run.errors`` index and slice as
    lists (``run.errors[:1]``), and a long run still holds a bounded number of them in memory."""

    maxlen: int | None = None  # a class default: unpickling extends before it sets the instance's

    def __init__(self, items: Iterable[Any] = (), *, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen
        self.extend(items)

    def _trim(self) -> None:
        if self.maxlen is not None and len(self) > self.maxlen:
            del self[: len(self) - self.maxlen]  # the oldest go first, as from a deque

    def append(self, item: Any) -> None:
        super().append(item)
        self._trim()

    def extend(self, items: Iterable[Any]) -> None:
        super().extend(items)
        self._trim()

    def insert(self, index: Any, item: Any) -> None:
        super().insert(index, item)
        self._trim()

    def __iadd__(self, items: Iterable[Any]) -> RecentList:  # type: ignore[override]
        self.extend(items)
        return self


class EventStream:
    """Fan-out of events to subscribers, in the order they subscribed.

    A subscriber that raises is logged and skipped: a broken dashboard must never stop training.
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            with self._lock:
                if subscriber in self._subscribers:
                    self._subscribers.remove(subscriber)

        return unsubscribe

    def emit(self, event: Event) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            try:
                subscriber(event)
            except Exception:  # noqa: BLE001 - a subscriber's bug must not kill the run
                logger.exception("grpo_magic: event subscriber %r failed on %s", subscriber, event.type)


def _ends_torn(path: Path) -> bool:
    """True when a log's last line has no newline (its writer was killed mid-write)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


class RunLog:
    """Appends every event to ``output_dir/events.jsonl`` and flushes it, so a killed process loses nothing.

    A flush hands the line to the operating system, which keeps it even if the process is
    killed with SIGKILL; it costs microseconds per event, so we do it for every event.
    """

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        self.path = Path(output_dir) / RUN_LOG_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = _ends_torn(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if torn:  # a killed writer left half a line: end it, or our first line would be glued to it
            self._file.write("\n")
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        line = redact(event_to_json(event))
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def run_log_path(output_dir: str | os.PathLike[str]) -> Path:
    path = Path(output_dir)
    return path if path.suffix == ".jsonl" else path / RUN_LOG_NAME


def read_run_log(output_dir: str | os.PathLike[str], skipped: list[str] | None = None) -> Iterator[Event]:
    """Yield the events of a run log; a line that is not one is skipped, and the rest still read.

    A line cut short (a process killed mid-write: ``kill -9``, a full disk), damaged or foreign is
    skipped with a note: appended to ``skipped`` when given (``replay`` shows them), else logged
    once at the end as a warning. Data only: nothing in a line is imported or evaluated.
    """
    path = run_log_path(output_dir)
    notes: list[str] = [] if skipped is None else skipped
    noted = len(notes)
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            why = None
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                data = None
                started = text.startswith("{")  # the start of an event that does not parse: cut, or damaged
                why = "cut short or damaged (a process killed mid-write?)" if started else "not valid JSON"
            if why is None and (not isinstance(data, dict) or data.get("type") not in EVENT_CLASSES_BY_TYPE):
                why = "not a grpo_magic event"
            if why is None:
                try:
                    yield event_from_dict(data)  # type: ignore[arg-type]
                    continue
                except ValueError as exc:  # a damaged or foreign line: skipped, as data never runs
                    why = f"not a valid event ({exc})"
            notes.append(f"line {number} of {path.name} skipped: {why}")
    if skipped is None and len(notes) > noted:
        logger.warning("grpo_magic: %s", "; ".join(notes[noted:noted + 5])
                       + (f"; and {len(notes) - noted - 5} more" if len(notes) - noted > 5 else ""))


# ---------------------------------------------------------------- one step's groups, read back

_STEP_RE = re.compile(rb'"step":\s*(-?\d+)')


class RunLogIndex:
    """Finds a step's ``group_scored`` lines in the run log without holding them in memory.

    It indexes the file incrementally (two byte offsets per step), so a long run costs one pass
    over the file however many times the user picks old steps. A resumed run appends a new
    ``run_started`` to the same log and replays steps from its checkpoint on: the first group
    after it rewinds the index to that step, so later steps of the earlier attempt are dropped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._ranges: dict[int, list[int]] = {}  # step -> [start, end) byte offsets
        self._rewind = False

    def _update(self) -> None:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return
        # Read in chunks and split, the offsets counted here (a readline and two tell() calls a line cost the
        # dashboard's renderer thread, beside the training thread, a millisecond a second of a tiny run). Whole lines
        # only: one still being written (no newline yet) waits for the next update.
        with f:
            f.seek(self._pos)
            rest = b""
            while chunk := f.read(1 << 20):
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                rest = data[cut:]
                for line in data[:cut].split(b"\n")[:-1]:
                    self._index(line)

    def _index(self, line: bytes) -> None:
        """One whole line (without its newline), starting at ``self._pos``."""
        start = self._pos
        self._pos += len(line) + 1
        if b'"group_scored"' not in line:
            if b'"run_started"' in line:
                self._rewind = True
            return
        m = _STEP_RE.search(line, 0, 400)
        if m is None:
            return
        step = int(m.group(1))
        if self._rewind:
            self._rewind = False
            for old in [s for s in self._ranges if s >= step]:
                del self._ranges[old]
        r = self._ranges.get(step)
        if r is None:
            self._ranges[step] = [start, self._pos]
        else:
            r[1] = self._pos

    def steps(self) -> list[int]:
        self._update()
        return sorted(self._ranges)

    def groups(self, step: int) -> list[GroupScored]:
        self._update()
        r = self._ranges.get(step)
        if r is None:
            return []
        out: list[GroupScored] = []
        with open(self.path, "rb") as f:
            f.seek(r[0])
            chunk = f.read(r[1] - r[0])
        for raw in chunk.splitlines():
            if b'"group_scored"' not in raw:
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and data.get("type") == "group_scored" and data.get("step") == step:
                try:
                    event = event_from_dict(data)
                except ValueError:  # a damaged line: skipped, like read_run_log does
                    continue
                assert isinstance(event, GroupScored)
                out.append(event)
        return out
