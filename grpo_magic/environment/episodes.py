"""Running the episodes of a step: in order, in worker threads, or concurrently on an event loop.

``EpisodeRunner`` takes one callable per episode (a ``score_episode`` call bound to its
arguments), runs them with the policy in eval mode under ``torch.no_grad()``, enforces
``rl_episode_timeout``, and turns each result into an ``EpisodeOutcome`` (``scores``). What an
episode *is* (which env instance, which arguments) is the reward adapter's business, not ours.

An episode past the timeout is *abandoned*: its completion gets no reward and the step goes on.
Python cannot kill a thread, so an abandoned sync episode keeps running until ``score_episode``
returns, and training meanwhile puts the policy back in train mode and updates it. So an
abandoned episode loses the policy: ``PolicyGuard`` makes the policy's next forward pass in that
episode raise ``EpisodeAbandoned``, and ``abandoned_running`` counts the abandoned episodes that
still run (shown on the dashboard and the progress line). Async episodes get a deadline outside
their event loop too, since an ``async def`` that blocks (``time.sleep``) stops every timer in it.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from .scores import EpisodeOutcome, episode_error, exception_outcome, normalize_score, timeout_outcome

if TYPE_CHECKING:
    import concurrent.futures

# asyncio is imported where an async env's episodes run: it is a sixth of ``%load_ext grpo_magic`` in a bare shell.

#: One episode: a callable that returns a score (sync), or a coroutine of one (async).
Episode = Callable[[], Any]


class EpisodeAbandoned(BaseException):
    """Raised inside an abandoned episode when it next runs the policy, which is no longer its to use.

    A BaseException, like ``asyncio.CancelledError``, so that an env's ``except Exception`` does
    not swallow it and go on.
    """


class Ticket:
    """One episode's standing, seen by the policy guard from inside the episode (a context variable)."""

    __slots__ = ("abandoned", "finished", "started")

    def __init__(self) -> None:
        self.started = False
        self.abandoned = False
        self.finished = False


_TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("grpo_magic_episode", default=None)


def _refuse_abandoned(module: Any, args: Any) -> None:
    """Forward pre-hook: an abandoned episode may not run the policy any more."""
    ticket = _TICKET.get()
    if ticket is not None and ticket.abandoned:
        raise EpisodeAbandoned("this episode ran past rl_episode_timeout and was abandoned; it cannot use the "
                               "policy any more")


class PolicyGuard:
    """Counts abandoned episodes that still run, and bars them from the policy while any does.

    The bar is a forward pre-hook on the policy (and on its base model under PEFT, whose
    ``generate`` calls the base model's forward), installed while an abandoned episode runs and
    removed after the last one returns: hooks put every forward of torch on its slower path.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Ticket] = set()
        self._handles: list[Any] = []

    @property
    def running(self) -> int:
        return len(self._running)

    def abandon(self, ticket: Ticket, model: Any) -> None:
        """Mark an episode abandoned; counted (and the policy barred) until it finishes, if it started."""
        ticket.abandoned = True
        with self._lock:
            if ticket.finished or not ticket.started:
                return
            self._running.add(ticket)
            if not self._handles and model is not None:
                for module in _policy_modules(model):
                    self._handles.append(module.register_forward_pre_hook(_refuse_abandoned))

    def finish(self, ticket: Ticket) -> None:
        """The episode returned (or never ran): no longer counted; the bar goes with the last one."""
        with self._lock:
            ticket.finished = True
            self._running.discard(ticket)
            if not self._running:
                handles, self._handles = self._handles, []
                for handle in handles:
                    handle.remove()


def _policy_modules(model: Any) -> list[Any]:
    """The modules whose forward every use of the policy passes through (PEFT: the wrapper and the base)."""
    modules = [model]
    base = getattr(model, "get_base_model", None)
    if callable(base):
        try:
            inner = base()
        except Exception:  # noqa: BLE001 - an odd wrapper: the outer module is guarded anyway
            inner = None
        if inner is not None and inner is not model:
            modules.append(inner)
    return [m for m in modules if hasattr(m, "register_forward_pre_hook")]


class AsyncLoop:
    """A private event loop in a daemon thread, for async envs.

    Our reward call may run in a thread that already has a running loop (the notebook kernel's
    main thread), where ``asyncio.run`` is not allowed; a loop of our own works everywhere. A loop
    that an episode blocked past the deadline is given up (``abandon``): it cancels what it runs
    once it gets control back, and stops.
    """

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self._cuda_device = submitter_cuda_device()  # the loop's thread computes where its creator does
        self.thread = threading.Thread(target=self._run, name="grpo-magic-episodes", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import asyncio

        no_grad_for_this_thread(self._cuda_device)
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def abandon(self) -> None:
        """Cancel every task and stop, once the loop runs again (a blocked loop: whenever it unblocks)."""
        import asyncio

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # their finally blocks run: counts drop
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(drain(), self.loop)

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


def no_grad_for_this_thread(cuda_device: int | None = None) -> None:
    """Grad mode and the CUDA device are per thread in torch: episodes in worker threads set both themselves.

    ``cuda_device``: the submitting thread's (``device.current_cuda_device``). accelerate sets each
    process's device on its main thread only, so without this an episode on rank 1 would run the
    policy or that rank's vLLM engine from ``cuda:0``.
    """
    try:
        import torch
    except ImportError:  # an env checked without torch (tests of the adapter alone)
        return
    torch.set_grad_enabled(False)
    from grpo_magic.runtime.device import use_cuda_device

    use_cuda_device(cuda_device)


def submitter_cuda_device() -> int | None:
    """The calling thread's CUDA device (None without torch or CUDA), for the threads it hands episodes to."""
    try:
        import torch  # noqa: F401 - only to know whether it is there
    except ImportError:
        return None
    from grpo_magic.runtime.device import current_cuda_device

    return current_cuda_device()


# What a function reads its locals with besides its own code: one that calls these may read the policy unseen.
_FRAME_READERS = frozenset({"locals", "vars", "eval", "exec", "_getframe", "currentframe", "stack", "getframeinfo"})
_READS_POLICY: dict[tuple[Any, int], bool] = {}  # (code, index of the policy parameter) -> reads it


def reads_policy(score: Callable[..., Any]) -> bool:
    """Might ``score`` (an env's ``score_episode`` or ``score_completions``) use the policy it is passed first?

    False only when its code provably never refers to that parameter (a rule-based reward: most envs), so that the
    runner can leave the policy's mode alone: switching every module of a model to eval mode and back costs more
    than a rule-based step's episodes (0.15 ms a step for the two-layer ``tiny``). Anything it cannot read (a
    builtin, a callable object, a decorated function, ``*args``, a closure over the parameter) counts as reading.
    """
    import dis

    func = getattr(score, "__func__", score)
    code = getattr(func, "__code__", None)
    if code is None or hasattr(func, "__wrapped__"):
        return True
    index = 1 if getattr(score, "__self__", None) is not None else 0  # a bound method's first parameter is self
    known = _READS_POLICY.get((code, index))
    if known is not None:
        return known
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if code.co_argcount <= index or not _FRAME_READERS.isdisjoint(code.co_names):
        reads = True
    else:
        name = names[index]
        reads = name in code.co_cellvars or any(  # any instruction on it (LOAD_FAST, STORE_FAST, LOAD_FAST_LOAD_FAST...)
            ins.argval == name or (isinstance(ins.argval, tuple) and name in ins.argval)
            for ins in dis.get_instructions(code) if "FAST" in ins.opname)
    _READS_POLICY[(code, index)] = reads
    return reads


@contextmanager
def eval_mode(model: Any, switch: bool = True):
    """The policy in eval mode under no_grad while episodes run, back to train mode after. ``switch=False``: under
    no_grad only, for episodes that never use the policy (``reads_policy``): an env's own judge model still runs
    without building a graph."""
    was_training = switch and getattr(model, "training", False)
    if switch and model is not None and hasattr(model, "eval"):
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
        self.guard = PolicyGuard()

    @property
    def abandoned_running(self) -> int:
        """Episodes abandoned past the timeout (this step or before) that have not returned yet."""
        return self.guard.running

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    def run(self, episodes: list[Episode], *, is_async: bool, model: Any = None,
            switch_mode: bool = True) -> list[EpisodeOutcome]:
        """Run every episode with ``model`` in eval mode (left in its mode with ``switch_mode=False``: episodes
        that never use it); one outcome per episode, in order."""
        with eval_mode(model, switch_mode):
            if is_async:
                return self._run_async(episodes, model)
            if self.workers == 1 and self.timeout is None:
                return [self._run_one(e) for e in episodes]
            return self._run_threads(episodes, model)

    def run_batch(self, call: Callable[[], Any], size: int, *, is_async: bool, model: Any = None,
                  what: str = "score_completions", switch_mode: bool = True) -> list[EpisodeOutcome]:
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
        whole = self.run([episode], is_async=is_async, model=model, switch_mode=switch_mode)[0]
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

    def _run_threads(self, episodes: list[Episode], model: Any) -> list[EpisodeOutcome]:
        """Sync episodes in up to ``workers`` threads; one past the timeout is abandoned.

        Not a ThreadPoolExecutor: a hung episode would hold a pool worker forever and starve the
        episodes queued behind it, while an abandoned daemon thread here frees its slot at once.
        """
        n = len(episodes)
        results: list[EpisodeOutcome | None] = [None] * n
        tickets = [Ticket() for _ in range(n)]
        done = threading.Condition()
        cuda_device = submitter_cuda_device()  # this step's: threads are kept between steps (EpisodeThreads)
        # When each episode began in its thread: its timeout counts from there, not from its submission, so that
        # a busy machine that is slow to schedule a thread never times out an episode that has not run yet.
        began: dict[int, float] = {}

        def work(i: int) -> None:
            ticket = tickets[i]
            with done:
                if results[i] is not None:  # given up before a thread took it: never runs
                    self.guard.finish(ticket)
                    return
                ticket.started = True
                began[i] = time.monotonic()
                done.notify_all()  # its deadline is known now
            no_grad_for_this_thread(cuda_device)
            token = _TICKET.set(ticket)
            try:
                outcome = self._run_one(episodes[i])
            except BaseException as exc:  # noqa: BLE001 - SystemExit in a worker: an error, never a missing result
                outcome = exception_outcome(exc, 0.0)
            finally:
                _TICKET.reset(token)
            with done:
                if results[i] is None:
                    results[i] = outcome
                self.guard.finish(ticket)  # an abandoned episode that returned at last: counted no more
                done.notify_all()

        queue = list(range(n))
        running: set[int] = set()
        with done:
            while queue or running:
                while queue and len(running) < self.workers:
                    i = queue.pop(0)
                    running.add(i)
                    if self._threads is None:
                        self._threads = EpisodeThreads()
                    self._threads.submit(lambda i=i: work(i))
                now = time.monotonic()
                for i in list(running):
                    if results[i] is not None:
                        running.discard(i)
                    elif self.timeout is not None and i in began and now - began[i] >= self.timeout:
                        results[i] = timeout_outcome(self.timeout)
                        self.guard.abandon(tickets[i], model)
                        running.discard(i)
                if running and (not queue or len(running) >= self.workers):
                    timeout = self.timeout
                    deadlines = [timeout - (time.monotonic() - began[i]) for i in running if i in began] if timeout is not None else []
                    wait = max(0.001, min(deadlines)) if deadlines else 0.5
                    done.wait(timeout=wait)
        return [r if r is not None else timeout_outcome(self.timeout or 0) for r in results]

    def _run_async(self, episodes: list[Episode], model: Any) -> list[EpisodeOutcome]:
        """All episodes of the batch concurrently on our own event loop, with a deadline outside it.

        Each episode runs as its own task, so that our timeout (``asyncio.wait``) is told apart from
        a ``TimeoutError`` the env raises itself (that one is the env's error). A loop blocked past
        the deadline is given up with every episode still in it.
        """
        import asyncio
        import concurrent.futures

        if self._loop is None:
            self._loop = AsyncLoop()
        loop = self._loop
        n = len(episodes)
        tickets = [Ticket() for _ in range(n)]
        results: list[EpisodeOutcome | None] = [None] * n
        lock = threading.Lock()
        given_up = False
        guard, timeout = self.guard, self.timeout

        async def scored(episode: Episode, ticket: Ticket) -> EpisodeOutcome:
            start = time.perf_counter()
            try:
                value = await episode()
            except EpisodeAbandoned:  # barred from the policy after the timeout: its outcome was given already
                return timeout_outcome(timeout or 0)
            except (Exception, KeyboardInterrupt, SystemExit, asyncio.CancelledError) as exc:  # noqa: BLE001 - these would kill our loop
                return exception_outcome(exc, time.perf_counter() - start)
            finally:
                guard.finish(ticket)
            outcome = normalize_score(value)
            outcome.latency_s = time.perf_counter() - start
            return outcome

        async def one(i: int) -> None:
            ticket = tickets[i]
            with lock:
                if given_up:
                    return
                ticket.started = True
            _TICKET.set(ticket)  # this task's context, copied into the episode's task
            task = asyncio.ensure_future(scored(episodes[i], ticket))
            if timeout is None:
                outcome = await task
            else:
                finished, _ = await asyncio.wait({task}, timeout=timeout)
                if finished:
                    outcome = task.result()
                else:
                    guard.abandon(ticket, model)
                    task.cancel()
                    outcome = timeout_outcome(timeout)
            with lock:
                if not given_up:
                    results[i] = outcome

        async def gather() -> None:
            await asyncio.gather(*(one(i) for i in range(n)))

        future = loop.submit(gather())
        deadline = None if timeout is None else timeout + max(1.0, 0.1 * timeout)
        try:
            future.result(timeout=deadline)
        except concurrent.futures.TimeoutError:
            # The loop did not answer: an episode blocks it (a sync call in an async def). Give the loop
            # up with what still runs in it, and start a fresh one next step.
            with lock:
                given_up = True
                late = [i for i in range(n) if results[i] is None]
            for i in late:
                guard.abandon(tickets[i], model)
                results[i] = EpisodeOutcome(None, latency_s=timeout or 0.0, error=episode_error(
                    "timeout", f"the episode did not finish within rl_episode_timeout ({timeout:g} s) and the event "
                    "loop of async episodes did not answer: an async score_episode blocks it (time.sleep, a blocking "
                    "request...; await asyncio.sleep or asyncio.to_thread instead); it was abandoned"))
            future.cancel()
            loop.abandon()
            self._loop = None
        return [r if r is not None else timeout_outcome(timeout or 0) for r in results]
