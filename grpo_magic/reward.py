"""The reward adapter: an environment's ``score_episode`` as a TRL reward function.

TRL calls reward functions with batches of prompts and completions plus every extra dataset
column. ``EnvReward`` turns that into one ``score_episode`` call per completion, exactly as
docs/architecture.md ("The environment interface") says, and keeps a record of the batch (scores, errors, clipping, latency)
that the trainer turns into events once TRL has computed the advantages.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

from .env import ENV_PROMPT_COLUMN, episode_parameters, prompt_text
from .errors import GRPOMagicError
from .redaction import redact
from .text import safe_text

#: Keyword arguments TRL adds to every reward call that are not dataset columns.
TRL_EXTRA_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments", "completion_ids")


class EnvErrorRateExceeded(GRPOMagicError):
    """Too many episodes of one step failed: the run stops with the first traceback quoted."""


@dataclass
class EpisodeOutcome:
    """What one ``score_episode`` call gave: a usable score, or an error."""

    score: float | None
    clipped: bool = False
    raw: Any = None
    error: dict[str, Any] | None = None
    latency_s: float = 0.0


@dataclass
class BatchRecord:
    """One reward call's inputs and outcomes, kept until TRL's advantages are known."""

    step: int
    prompts: list[str]
    completions: list[str]
    outcomes: list[EpisodeOutcome] = field(default_factory=list)
    #: The error-rate failure of this batch, when the trainer raises it on every process at once.
    failure: str | None = None

    @property
    def scores(self) -> list[float | None]:
        return [o.score for o in self.outcomes]


def completion_text(completion: Any) -> str:
    """TRL gives a string for text prompts and a list of messages for chat prompts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
    return str(completion)


def _error(kind: str, message: str, tb: str = "") -> dict[str, Any]:
    # Env errors end up in logs, dashboards and terminals: a token in a message must not.
    return {"kind": kind, "message": redact(message), "traceback": redact(tb)}


def normalize_score(value: Any) -> EpisodeOutcome:
    """A finite number in [0, 1]; out of range is clipped; anything else is an episode error."""
    if value is None:
        return EpisodeOutcome(None, raw=None, error=_error(
            "None", "score_episode returned None; return a float between 0 and 1."))
    if isinstance(value, numbers.Real):  # includes bool, int and numpy scalars
        try:
            score = float(value)
        except Exception:  # noqa: BLE001 - an int too large for a float, a broken __float__
            return EpisodeOutcome(None, raw=safe_text(value)[:200], error=_error(
                "not a number", f"score_episode returned {safe_text(value)[:80]}, which is not a finite float; "
                "return a float between 0 and 1."))
        if math.isnan(score):
            return EpisodeOutcome(None, raw=score, error=_error(
                "NaN", "score_episode returned NaN; return a float between 0 and 1."))
        if math.isinf(score):
            return EpisodeOutcome(None, raw=score, error=_error(
                "inf", f"score_episode returned {score}; return a float between 0 and 1."))
        if score < 0.0 or score > 1.0:
            return EpisodeOutcome(min(1.0, max(0.0, score)), clipped=True, raw=score)
        return EpisodeOutcome(score, raw=score)
    name = type(value).__name__
    try:
        hint = " (use .item() to get a float)" if hasattr(value, "item") else ""
    except Exception:  # noqa: BLE001 - a __getattr__ that raises something else than AttributeError
        hint = ""
    return EpisodeOutcome(None, raw=safe_text(value)[:200], error=_error(
        "not a number", f"score_episode returned a {name}, not a number{hint}; return a float between 0 and 1."))


def _exception_outcome(exc: BaseException, latency: float) -> EpisodeOutcome:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"{type(exc).__name__}: {safe_text(exc, str)}"
    return EpisodeOutcome(None, error=_error(type(exc).__name__, message, tb), latency_s=latency)


def _timeout_outcome(timeout: float) -> EpisodeOutcome:
    return EpisodeOutcome(None, error=_error(
        "timeout", f"the episode ran past rl_episode_timeout ({timeout:g} s) and was abandoned"), latency_s=timeout)


class _AsyncLoop:
    """A private event loop in a daemon thread, for async envs.

    Our reward call may run in a thread that already has a running loop (the notebook kernel's
    main thread), where ``asyncio.run`` is not allowed; a loop of our own works everywhere.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="grpo-magic-episodes", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        _no_grad_for_this_thread()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class _EpisodeThreads:
    """Threads for sync episodes, kept from one step to the next.

    Starting a thread waits until the OS has scheduled it: on a busy machine 1-2 ms each, one
    after the other, which for 32 episodes is most of a 50 ms tool call (bench/run.py measured 53%
    of the ideal speedup that way). Idle threads here wait on a queue instead. A thread whose
    episode hangs stays busy and never counts as idle: new episodes get a new thread and never
    wait behind it.
    """

    def __init__(self) -> None:
        self._tasks: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0
        self._closed = False

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # that idle thread takes the task
            else:
                self._started += 1
                threading.Thread(target=self._work, name=f"grpo-magic-episode-{self._started}", daemon=True).start()
        self._tasks.put(task)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            task()
            with self._lock:
                if self._closed:
                    return
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, 0
        for _ in range(idle):
            self._tasks.put(None)


def _no_grad_for_this_thread() -> None:
    """Grad mode is per thread in torch: episodes in worker threads must switch it off themselves."""
    try:
        import torch
    except ImportError:  # an env checked without torch (tests of the adapter alone)
        return
    torch.set_grad_enabled(False)


@contextmanager
def _eval_mode(model: Any):
    """The policy in eval mode under no_grad while episodes run, back to train mode after."""
    was_training = getattr(model, "training", False)
    if model is not None and hasattr(model, "eval"):
        model.eval()
    try:
        if model is None:  # checking an env alone (no policy yet): nothing to switch
            yield
        else:
            import torch

            with torch.no_grad():
                yield
    finally:
        if model is not None and was_training and hasattr(model, "train"):
            model.train()


class EnvReward:
    """A TRL reward function that runs one environment episode per completion.

    The model and tokenizer are bound after the trainer is built (``bind``), since the episodes
    need the policy that TRL actually trains (with its LoRA adapters).
    """

    __name__ = "env"  # TRL names its metrics after this: rewards/env/mean

    def __init__(
        self,
        env: Any,
        *,
        workers: int = 1,
        timeout: float | None = None,
        max_error_rate: float = 1.0,
        on_batch: Callable[[BatchRecord], None] | None = None,
    ) -> None:
        self.env = env
        self.workers = max(1, workers)
        self.timeout = timeout
        self.max_error_rate = max_error_rate
        self.on_batch = on_batch
        self.model: Any = None
        self.tokenizer: Any = None
        self.is_async = inspect.iscoroutinefunction(env.score_episode)
        self._names, self._var_kw, _ = episode_parameters(env)
        self._loop: _AsyncLoop | None = None
        self._threads: _EpisodeThreads | None = None
        self._calls = 0
        self.last_batch: BatchRecord | None = None
        self.totals = {"episodes": 0, "errors": 0, "clipped": 0}
        self.generator: Any = None
        #: Several processes: record an error-rate failure on the batch instead of raising in this
        #: process alone (the others would wait for it forever); the trainer raises it everywhere.
        self.defer_failure = False

    def bind(self, model: Any, tokenizer: Any, generator: Any = None) -> None:
        """The policy and tokenizer episodes use; ``generator`` continues episodes (default: HF generate)."""
        self.model = model
        self.tokenizer = tokenizer
        self.generator = generator

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    # ------------------------------------------------------------ TRL entry point

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        state = kwargs.get("trainer_state")
        log_metric = kwargs.get("log_metric")
        self._calls += 1
        step = (state.global_step + 1) if state is not None else self._calls
        columns = {k: v for k, v in kwargs.items() if k not in TRL_EXTRA_KWARGS}
        env_prompts = columns.pop(ENV_PROMPT_COLUMN, None) or prompts
        texts = [completion_text(c) for c in completions]
        calls = [self._episode_kwargs(env_prompts[i], {k: v[i] for k, v in columns.items()}) for i in range(len(texts))]

        outcomes = self.score_batch(texts, calls)
        record = BatchRecord(step=step, prompts=[prompt_text(p) for p in env_prompts], completions=texts,
                             outcomes=outcomes)
        self.last_batch = record
        errors = sum(o.error is not None for o in outcomes)
        clipped = sum(o.clipped for o in outcomes)
        self.totals["episodes"] += len(outcomes)
        self.totals["errors"] += errors
        self.totals["clipped"] += clipped
        if log_metric is not None and outcomes:
            log_metric("env/error_rate", errors / len(outcomes))
            log_metric("env/clipped_rate", clipped / len(outcomes))
            log_metric("env/latency_s", sum(o.latency_s for o in outcomes) / len(outcomes))
        if self.on_batch is not None:
            self.on_batch(record)
        if outcomes and errors / len(outcomes) > self.max_error_rate:
            first = next(o.error for o in outcomes if o.error is not None)
            quoted = (first.get("traceback") or first["message"]).strip()
            message = (
                f"{errors} of {len(outcomes)} episodes failed at step {step}, more than rl_max_error_rate "
                f"{self.max_error_rate:g}; fix score_episode (or raise --rl-max-error-rate). First error:\n{quoted}"
            )
            if not self.defer_failure:
                raise EnvErrorRateExceeded(message)
            record.failure = message
        return [o.score for o in outcomes]

    def _episode_kwargs(self, prompt: Any, row: dict[str, Any]) -> dict[str, Any]:
        row = {"prompt": prompt, **row}
        kwargs = row if self._var_kw else {k: v for k, v in row.items() if k in self._names}
        if "generator" in self._names:  # only envs that name it: the original signature is called as before
            kwargs["generator"] = self._episode_generator()
        return kwargs

    def _episode_generator(self) -> Any:
        if self.generator is None and self.model is not None and self.tokenizer is not None:
            from .generation import HFGenerator

            self.generator = HFGenerator(self.model, self.tokenizer)
        return self.generator

    # ------------------------------------------------------------ running episodes

    def score_batch(self, completions: list[str], kwargs_list: list[dict[str, Any]]) -> list[EpisodeOutcome]:
        """Run every episode of a batch with the policy in eval mode; one outcome per completion."""
        with _eval_mode(self.model):
            if self.is_async:
                return self._run_async(completions, kwargs_list)
            if self.workers == 1 and self.timeout is None:
                return [self._run_one(c, kw) for c, kw in zip(completions, kwargs_list, strict=False)]
            return self._run_threads(completions, kwargs_list)

    def _run_one(self, completion: str, kwargs: dict[str, Any]) -> EpisodeOutcome:
        start = time.perf_counter()
        try:
            value = self.env.score_episode(self.model, self.tokenizer, completion, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an env's failure is recorded, never fatal
            return _exception_outcome(exc, time.perf_counter() - start)
        outcome = normalize_score(value)
        outcome.latency_s = time.perf_counter() - start
        return outcome

    def _run_threads(self, completions: list[str], kwargs_list: list[dict[str, Any]]) -> list[EpisodeOutcome]:
        """Sync episodes in up to ``workers`` threads; one past the timeout is abandoned.

        Not a ThreadPoolExecutor: a hung episode would hold a pool worker forever and starve the
        episodes queued behind it, while an abandoned daemon thread here frees its slot at once.
        """
        n = len(completions)
        results: list[EpisodeOutcome | None] = [None] * n
        done = threading.Condition()

        def work(i: int) -> None:
            _no_grad_for_this_thread()
            try:
                outcome = self._run_one(completions[i], kwargs_list[i])
            except BaseException as exc:  # noqa: BLE001 - SystemExit in a worker: an error, never a missing result
                outcome = _exception_outcome(exc, 0.0)
            with done:
                if results[i] is None:
                    results[i] = outcome
                done.notify_all()

        queue = list(range(n))
        running: dict[int, float] = {}
        with done:
            while queue or running:
                while queue and len(running) < self.workers:
                    i = queue.pop(0)
                    running[i] = time.monotonic()
                    if self._threads is None:
                        self._threads = _EpisodeThreads()
                    self._threads.submit(lambda i=i: work(i))
                now = time.monotonic()
                for i, started in list(running.items()):
                    if results[i] is not None:
                        del running[i]
                    elif self.timeout is not None and now - started >= self.timeout:
                        results[i] = _timeout_outcome(self.timeout)
                        del running[i]
                if running and (not queue or len(running) >= self.workers):
                    wait = 0.5 if self.timeout is None else max(
                        0.001, min(self.timeout - (time.monotonic() - s) for s in running.values()))
                    done.wait(timeout=wait)
        return [r if r is not None else _timeout_outcome(self.timeout or 0) for r in results]

    def _run_async(self, completions: list[str], kwargs_list: list[dict[str, Any]]) -> list[EpisodeOutcome]:
        """All episodes of the batch concurrently on our own event loop."""
        if self._loop is None:
            self._loop = _AsyncLoop()

        async def one(i: int) -> EpisodeOutcome:
            start = time.perf_counter()
            try:
                coro = self.env.score_episode(self.model, self.tokenizer, completions[i], **kwargs_list[i])
                value = await (asyncio.wait_for(coro, self.timeout) if self.timeout is not None else coro)
            except asyncio.TimeoutError:
                return _timeout_outcome(self.timeout or 0)
            except (Exception, KeyboardInterrupt, SystemExit) as exc:  # noqa: BLE001 - these would kill our loop
                return _exception_outcome(exc, time.perf_counter() - start)
            outcome = normalize_score(value)
            outcome.latency_s = time.perf_counter() - start
            return outcome

        async def gather() -> list[EpisodeOutcome]:
            return list(await asyncio.gather(*(one(i) for i in range(len(completions)))))

        return self._loop.run(gather())
