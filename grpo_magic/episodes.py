"""Running the episodes of a step: in order, in worker threads, or concurrently on an event loop.

``EpisodeRunner`` takes one callable per episode (a ``score_episode`` call bound to its
arguments), runs them with the policy in eval mode under ``torch.no_grad()``, enforces
``rl_episode_timeout``, and turns each result into an ``EpisodeOutcome`` (``scores``). What an
episode *is* (which env instance, which arguments) is the reward adapter's business, not ours.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from queue import SimpleQueue
from typing import Any

from .scores import EpisodeOutcome, exception_outcome, normalize_score, timeout_outcome

#: One episode: a callable that returns a score (sync), or a coroutine of one (async).
Episode = Callable[[], Any]


class AsyncLoop:
    """A private event loop in a daemon thread, for async envs.

    Our reward call may run in a thread that already has a running loop (the notebook kernel's
    main thread), where ``asyncio.run`` is not allowed; a loop of our own works everywhere.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="grpo-magic-episodes", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        no_grad_for_this_thread()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class EpisodeThreads:
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


def no_grad_for_this_thread() -> None:
    """Grad mode is per thread in torch: episodes in worker threads must switch it off themselves."""
    try:
        import torch
    except ImportError:  # an env checked without torch (tests of the adapter alone)
        return
    torch.set_grad_enabled(False)


@contextmanager
def eval_mode(model: Any):
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


class EpisodeRunner:
    """Runs a step's episodes: sequentially, in up to ``workers`` threads, or all at once when async."""

    def __init__(self, workers: int = 1, timeout: float | None = None) -> None:
        self.workers = max(1, workers)
        self.timeout = timeout
        self._loop: AsyncLoop | None = None
        self._threads: EpisodeThreads | None = None

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    def run(self, episodes: list[Episode], *, is_async: bool, model: Any = None) -> list[EpisodeOutcome]:
        """Run every episode with ``model`` in eval mode; one outcome per episode, in order."""
        with eval_mode(model):
            if is_async:
                return self._run_async(episodes)
            if self.workers == 1 and self.timeout is None:
                return [self._run_one(e) for e in episodes]
            return self._run_threads(episodes)

    def run_batch(self, call: Callable[[], Any], size: int, *, is_async: bool, model: Any = None,
                  what: str = "score_completions") -> list[EpisodeOutcome]:
        """One call that scores a whole batch (``score_completions``): ``size`` outcomes, in order.

        The call returns one value per completion (a score, a mapping, or an exception instance: that
        completion's episode error). An exception or a timeout of the call is every completion's error;
        the call's time is shared out evenly as latency.
        """
        box: dict[str, Any] = {}

        if is_async:
            async def episode() -> float:
                box["values"] = await call()
                return 0.0
        else:
            def episode() -> float:
                box["values"] = call()
                return 0.0

        start = time.perf_counter()
        whole = self.run([episode], is_async=is_async, model=model)[0]
        share = (time.perf_counter() - start) / max(1, size)
        if whole.error is not None:
            return [EpisodeOutcome(None, error=dict(whole.error), latency_s=share) for _ in range(size)]
        values = box.get("values")
        if not isinstance(values, (list, tuple)) or len(values) != size:
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
            error = exception_outcome(ValueError(
                f"{what} returned {got} for {size} completions; return a list with one value per completion."), share)
            return [EpisodeOutcome(None, error=dict(error.error or {}), latency_s=share) for _ in range(size)]
        outcomes = []
        for value in values:
            outcome = exception_outcome(value, share) if isinstance(value, BaseException) else normalize_score(value)
            outcome.latency_s = share
            outcomes.append(outcome)
        return outcomes

    def _run_one(self, episode: Episode) -> EpisodeOutcome:
        start = time.perf_counter()
        try:
            value = episode()
        except Exception as exc:  # noqa: BLE001 - an env's failure is recorded, never fatal
            return exception_outcome(exc, time.perf_counter() - start)
        outcome = normalize_score(value)
        outcome.latency_s = time.perf_counter() - start
        return outcome

    def _run_threads(self, episodes: list[Episode]) -> list[EpisodeOutcome]:
        """Sync episodes in up to ``workers`` threads; one past the timeout is abandoned.

        Not a ThreadPoolExecutor: a hung episode would hold a pool worker forever and starve the
        episodes queued behind it, while an abandoned daemon thread here frees its slot at once.
        """
        n = len(episodes)
        results: list[EpisodeOutcome | None] = [None] * n
        done = threading.Condition()

        def work(i: int) -> None:
            no_grad_for_this_thread()
            try:
                outcome = self._run_one(episodes[i])
            except BaseException as exc:  # noqa: BLE001 - SystemExit in a worker: an error, never a missing result
                outcome = exception_outcome(exc, 0.0)
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
                        self._threads = EpisodeThreads()
                    self._threads.submit(lambda i=i: work(i))
                now = time.monotonic()
                for i, started in list(running.items()):
                    if results[i] is not None:
                        del running[i]
                    elif self.timeout is not None and now - started >= self.timeout:
                        results[i] = timeout_outcome(self.timeout)
                        del running[i]
                if running and (not queue or len(running) >= self.workers):
                    wait = 0.5 if self.timeout is None else max(
                        0.001, min(self.timeout - (time.monotonic() - s) for s in running.values()))
                    done.wait(timeout=wait)
        return [r if r is not None else timeout_outcome(self.timeout or 0) for r in results]

    def _run_async(self, episodes: list[Episode]) -> list[EpisodeOutcome]:
        """All episodes of the batch concurrently on our own event loop."""
        if self._loop is None:
            self._loop = AsyncLoop()

        async def one(episode: Episode) -> EpisodeOutcome:
            start = time.perf_counter()
            try:
                coro = episode()
                value = await (asyncio.wait_for(coro, self.timeout) if self.timeout is not None else coro)
            except asyncio.TimeoutError:
                return timeout_outcome(self.timeout or 0)
            except (Exception, KeyboardInterrupt, SystemExit) as exc:  # noqa: BLE001 - these would kill our loop
                return exception_outcome(exc, time.perf_counter() - start)
            outcome = normalize_score(value)
            outcome.latency_s = time.perf_counter() - start
            return outcome

        async def gather() -> list[EpisodeOutcome]:
            return list(await asyncio.gather(*(one(e) for e in episodes)))

        return self._loop.run(gather())
