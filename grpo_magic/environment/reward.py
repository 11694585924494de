"""The reward adapter: an environment's ``score_episode`` as a TRL reward function.

TRL calls reward functions with batches of prompts and completions plus every extra dataset
column. ``EnvReward`` turns that into one ``score_episode`` call per completion, exactly as
docs/architecture.md ("The environment interface") says, has them run by an ``EpisodeRunner``
(``episodes``), and keeps a record of the batch (scores, errors, clipping, latency) that the
trainer turns into events once TRL has computed the advantages.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_magic.errors import GRPOMagicError
from grpo_magic.trl_compat import reward_call_kwargs

from .agent import last_assistant_text, not_offered_calls, tool_calls_of, transcript
from .env import ENV_PROMPT_COLUMN, episode_parameters, prompt_text
from .episodes import EpisodeRunner, reads_policy
from .scores import EpisodeOutcome, normalize_score

__all__ = ["BatchRecord", "EnvErrorRateExceeded", "EnvReward", "EpisodeOutcome", "error_rate_failure", "normalize_score"]

class EnvErrorRateExceeded(GRPOMagicError):
    """Too many episodes of one step failed: the run stops with the first traceback quoted."""


@dataclass
class BatchRecord:
    """One reward call's inputs and outcomes, kept until TRL's advantages are known."""

    step: int
    prompts: list[str]
    completions: list[str]
    outcomes: list[EpisodeOutcome] = field(default_factory=list)
    #: Agent envs: per completion, the episode's turns (``agent.transcript``); empty for single-turn envs.
    transcripts: list[list[dict[str, Any]]] = field(default_factory=list)
    #: Each completion's dataset row beyond the prompt text (extra columns; ``prompt`` too when it is
    #: chat messages), so that the run log can score it again (``rescore``).
    columns: list[dict[str, Any]] = field(default_factory=list)
    #: The error-rate failure of this batch, when the trainer raises it on every process at once.
    failure: str | None = None
    #: Episodes abandoned past the timeout (this batch or before) still running after this batch.
    abandoned_running: int = 0

    @property
    def scores(self) -> list[float | None]:
        return [o.score for o in self.outcomes]


def error_rate_failure(records: list[BatchRecord], max_error_rate: float) -> str | None:
    """The message that stops a run, when the episodes of these records (one step, every process) failed too often."""
    outcomes = [o for r in records for o in r.outcomes]
    errors = [o.error for o in outcomes if o.error is not None]
    if not outcomes or len(errors) / len(outcomes) <= max_error_rate:
        return None
    quoted = (errors[0].get("traceback") or errors[0]["message"]).strip()
    return (
        f"{len(errors)} of {len(outcomes)} episodes failed at step {records[0].step}, more than rl_max_error_rate "
        f"{max_error_rate:g}; fix score_episode (or raise --rl-max-error-rate). First error:\n{quoted}"
    )


def completion_text(completion: Any) -> str:
    """TRL gives a string for text prompts and a list of messages for chat prompts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
    return str(completion)


def log_components(log_metric: Callable[[str, float], None], outcomes: list[EpisodeOutcome]) -> None:
    """``components/<name>``: each component's mean over the batch's scored episodes, through TRL's
    ``log_metric`` so that it reaches TRL's logs (``run.history``) and every ``report_to`` tracker."""
    sums: dict[str, list[float]] = {}
    warned = 0
    for o in outcomes:
        warned += bool(o.warnings)
        if o.score is None:
            continue
        for name, value in o.components.items():
            sums.setdefault(name, []).append(value)
    for name, values in sums.items():
        log_metric(f"components/{name}", sum(values) / len(values))
    if warned or sums:  # only envs that return components: the others' metrics stay as they were
        log_metric("env/warning_rate", warned / len(outcomes))


class EnvReward:
    """A TRL reward function that runs one environment episode per completion.

    The model and tokenizer are bound after the trainer is built (``bind``), since the episodes
    need the policy that TRL actually trains (with its LoRA adapters). ``agent`` is an agent env's
    spec (``agent.AgentSpec``: TRL builds its episodes, ``trainer.build_trainer`` hands it to TRL).
    ``defer_failure`` is the failure policy of training: an error-rate failure is recorded on the
    batch (``BatchRecord.failure``) instead of raised inside TRL, where the step's groups and errors
    would be lost (and other processes would wait forever); the trainer raises it on every process
    once the step's episodes are events. ``score`` returns each call's record to its caller.
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
        agent: Any = None,
        defer_failure: bool = False,
    ) -> None:
        self.env = env
        self.runner = EpisodeRunner(workers=workers, timeout=timeout)
        self.max_error_rate = max_error_rate
        self.on_batch = on_batch
        self.model: Any = None
        self.tokenizer: Any = None
        self.is_async = inspect.iscoroutinefunction(env.score_episode)
        self._names, self._var_kw, _ = episode_parameters(env)
        self._calls = 0
        self.totals = {"episodes": 0, "errors": 0, "clipped": 0}
        self.generator: Any = None
        self.defer_failure = defer_failure
        #: A swap asked for by another thread (``request_swap``), applied between two steps.
        self._swap: tuple[Any, Callable[[int], None] | None, Callable[[], Any] | None] | None = None
        self._swap_lock = threading.Lock()
        self.agent = agent

    def bind(self, model: Any, tokenizer: Any, generator: Any = None) -> None:
        """The policy and tokenizer episodes use; ``generator`` continues episodes (default: HF generate)."""
        self.model = model
        self.tokenizer = tokenizer
        self.generator = generator

    def close(self) -> None:
        self.runner.close()

    def release(self) -> None:
        """Forget the policy, tokenizer and generator (which may hold TRL's vLLM engine) once the run is over."""
        self.close()
        self.model = self.tokenizer = self.generator = None
        with self._swap_lock:
            self._swap = None

    def request_swap(self, env: Any, on_applied: Callable[[int], None] | None = None,
                     make_env: Callable[[], Any] | None = None) -> None:
        """Score with ``env`` from the next step on (any thread); ``on_applied(step)`` says when.

        Only the training thread changes ``self.env``, between two steps (``apply_swap``: before TRL
        resets the next step's agent episodes, or at the latest at the next reward call), so an episode
        never sees two envs and no lock is held while a step runs. For an agent env, ``make_env`` builds
        the new env of each episode. A later request replaces one not yet applied.
        """
        with self._swap_lock:
            self._swap = (env, on_applied, make_env)

    def apply_swap(self, step: int) -> None:
        """Take a requested swap now (the training thread, between two steps)."""
        with self._swap_lock:
            swap, self._swap = self._swap, None
        if swap is None:
            return
        env, on_applied, make_env = swap
        if self.agent is not None and make_env is not None:
            self.agent.swap(make_env)
        self.env = env
        self.is_async = inspect.iscoroutinefunction(env.score_episode)
        self._names, self._var_kw, _ = episode_parameters(env)
        if on_applied is not None:
            on_applied(step)

    # ------------------------------------------------------------ TRL entry point

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        """TRL's reward function: one score per completion (None: that episode failed)."""
        return self.score(prompts, completions, **kwargs).scores

    def score(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> BatchRecord:
        """Score one batch as TRL passes it (prompts, completions, TRL's keyword arguments and every column)
        and return its record: scores, errors, clipping, latency, transcripts and rows."""
        trl_kwargs, columns = reward_call_kwargs(kwargs)
        state = trl_kwargs.get("trainer_state")
        log_metric = trl_kwargs.get("log_metric")
        self._calls += 1
        step = (state.global_step + 1) if state is not None else self._calls
        self.apply_swap(step)
        env_prompts = columns.pop(ENV_PROMPT_COLUMN, None) or prompts
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        environments = trl_kwargs.get("environments")
        if environments is not None:  # an agent env: TRL ran each episode on its own instance
            record = self._agent_batch(step, env_prompts, completions, rows, environments)
        else:
            texts = [completion_text(c) for c in completions]
            if callable(getattr(self.env, "score_completions", None)):  # a batched env (grpo_magic.adapters)
                outcomes = self.score_completions(env_prompts, completions, columns, trl_kwargs)
            else:
                calls = [self._episode_kwargs(env_prompts[i], rows[i]) for i in range(len(texts))]
                outcomes = self.score_batch(texts, calls)
            record = BatchRecord(step=step, prompts=[prompt_text(p) for p in env_prompts], completions=texts,
                                 outcomes=outcomes)
        record.columns = [row if isinstance(p, str) else {"prompt": p, **row}
                          for p, row in zip(env_prompts, rows, strict=True)]
        record.abandoned_running = self.runner.abandoned_running
        outcomes = record.outcomes
        errors = sum(o.error is not None for o in outcomes)
        clipped = sum(o.clipped for o in outcomes)
        self.totals["episodes"] += len(outcomes)
        self.totals["errors"] += errors
        self.totals["clipped"] += clipped
        if log_metric is not None and outcomes:
            log_metric("env/error_rate", errors / len(outcomes))
            log_metric("env/clipped_rate", clipped / len(outcomes))
            log_metric("env/latency_s", sum(o.latency_s for o in outcomes) / len(outcomes))
            log_components(log_metric, outcomes)
            if record.transcripts:
                failures = sum(1 for t in record.transcripts for turn in t if turn.get("error"))
                log_metric("env/tool_errors", failures / len(outcomes))
                # calls to tools that were not offered (part of tool_errors): the model does not read its schemas
                not_offered = sum(len(not_offered_calls(t)) for t in record.transcripts)
                log_metric("env/tool_not_offered", not_offered / len(outcomes))
        if self.on_batch is not None:
            self.on_batch(record)
        message = error_rate_failure([record], self.max_error_rate)
        if message is not None:
            if not self.defer_failure:
                raise EnvErrorRateExceeded(message)
            record.failure = message
        return record

    def _agent_batch(self, step: int, prompts: list[Any], completions: list[Any], rows: list[dict[str, Any]],
                     environments: list[Any]) -> BatchRecord:
        """Score each agent episode once, on the env instance that ran it (docs/architecture.md, "Agent episodes")."""
        turns = [c if isinstance(c, list) else [{"role": "assistant", "content": completion_text(c)}]
                 for c in completions]
        texts = [last_assistant_text(t) for t in turns]
        calls = []
        for i, episode_turns in enumerate(turns):
            kwargs = self._episode_kwargs(prompts[i], rows[i])
            if "messages" in self._names or self._var_kw:
                kwargs["messages"] = [*(prompts[i] if isinstance(prompts[i], list) else []), *episode_turns]
            if "tool_calls" in self._names or self._var_kw:
                kwargs["tool_calls"] = tool_calls_of(episode_turns)
            calls.append(kwargs)
        envs = [getattr(e, "_env", e) for e in environments]
        offered = self.agent.tool_names if self.agent is not None else None
        return BatchRecord(
            step=step, prompts=[prompt_text(p) for p in prompts], completions=texts,
            outcomes=self.score_batch(texts, calls, envs),
            transcripts=[transcript(t, getattr(e, "_calls", None), offered)
                         for t, e in zip(turns, environments, strict=True)],
        )

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

    def score_completions(self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]],
                          trl_kwargs: dict[str, Any]) -> list[EpisodeOutcome]:
        """A batched env scores the whole batch in one call, with what TRL passed (docs/architecture.md,
        "Adapters"): the prompts, the completions as TRL gave them, every column as a list and TRL's own
        keyword arguments (``trl_compat.REWARD_KWARGS`` but ``environments``)."""
        env, model, tokenizer = self.env, self.model, self.tokenizer
        extras = {k: v for k, v in trl_kwargs.items() if k != "environments"}
        method = env.score_completions

        def call() -> Any:
            return method(model, tokenizer, list(prompts), list(completions), **columns, **extras)

        return self.runner.run_batch(call, len(completions), is_async=inspect.iscoroutinefunction(method),
                                     model=model, what=f"{type(env).__name__}.score_completions()",
                                     switch_mode=reads_policy(method))

    def score_batch(self, completions: list[str], kwargs_list: list[dict[str, Any]],
                    envs: list[Any] | None = None) -> list[EpisodeOutcome]:
        """Run every episode of a batch with the policy in eval mode; one outcome per completion.

        ``envs``: the env instance of each episode (agent envs); default: this adapter's env for all.
        """
        model, tokenizer = self.model, self.tokenizer
        envs = envs if envs is not None else [self.env] * len(completions)
        episodes = [
            (lambda e=e, c=c, kw=kw: e.score_episode(model, tokenizer, c, **kw))
            for e, c, kw in zip(envs, completions, kwargs_list, strict=True)
        ]
        # The policy is switched to eval mode only for a scorer that may use it (a judge, a generator).
        distinct = {id(e): e for e in envs}.values()
        switch = "generator" in self._names or any(reads_policy(e.score_episode) for e in distinct)
        return self.runner.run(episodes, is_async=self.is_async, model=model, switch_mode=switch)
