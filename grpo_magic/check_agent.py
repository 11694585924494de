"""The pre-flight check of an agent env: whole episodes through TRL's own tool loop, no training.

An agent env's episode is multi-turn (tool calls, tool results, more assistant turns), and it is
TRL that runs it. So the check builds the very trainer a run would (``trainer.build_trainer``) and
asks TRL for one batch of rollouts of the sampled prompts (``trainer.rollouts``: the same call a
training step makes), without any optimizer step. It gives the reward adapter's record of that batch
(the scores and each episode's transcript) and the completion tokens TRL kept (``trl_compat.ScoredBatch``).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from typing import Any

from .errors import GRPOMagicError
from .params import GRPOParams
from .reward import EnvReward
from .scores import EpisodeOutcome


@dataclass
class AgentEpisodes:
    """What one batch of agent episodes gave: per group, texts, outcomes, transcripts and truncation."""

    texts: list[list[str]]
    outcomes: list[EpisodeOutcome]
    transcripts: list[list[dict[str, Any]]]
    truncated: list[list[bool]]


def run_agent_episodes(params: GRPOParams, prepared: Any, model: Any, tokenizer: Any, reward: EnvReward,
                       rows: list[dict[str, Any]], config_overrides: dict[str, Any] | None = None) -> AgentEpisodes:
    """``num_generations`` episodes of each row, run by TRL's tool loop with the policy ``model``.

    ``reward`` is built with the env's agent spec (``EnvReward(agent=...)``), which the trainer hands to TRL.
    ``config_overrides``: more GRPOConfig settings (``evaluate``'s greedy episodes turn ``do_sample`` off).
    """
    from .trainer import build_trainer, rollouts

    refuse_while_training()

    n = params.rl_num_generations
    with tempfile.TemporaryDirectory(prefix="grpo-check-") as out:
        config = params.to_grpo_config(out, max_steps=1, save_strategy="no", report_to=[], logging_steps=1,
                                       **(config_overrides or {}))
        trainer = build_trainer(model=model, tokenizer=tokenizer, reward=reward, config=config,
                                dataset=prepared.dataset)
        inputs = [dict(row) for row in rows for _ in range(n)]  # groups contiguous, as TRL's sampler gives them
        record, batch = rollouts(trainer, inputs)
    eos = {tokenizer.eos_token_id, tokenizer.pad_token_id, *_ids(model.generation_config.eos_token_id)}
    cut = [bool(ids) and ids[-1] not in eos for ids in batch.completion_ids]
    return AgentEpisodes(
        texts=[record.completions[g * n:(g + 1) * n] for g in range(len(rows))],
        outcomes=list(record.outcomes),
        transcripts=list(record.transcripts),
        truncated=[cut[g * n:(g + 1) * n] for g in range(len(rows))],
    )


def refuse_while_training() -> None:
    """One sentence, before any model loads, when a run trains in this process.

    Building a ``GRPOConfig`` resets accelerate's process state, which the running trainer uses.
    """
    from .run import active_run

    running = active_run()
    if running is not None:
        raise GRPOMagicError(
            f"A run is training in this process ({running.env_name}, step {running.step}), and checking an agent env "
            "builds a trainer of its own, which would disturb it; stop the run first (%grpo_stop), or check after it."
        )


def _ids(value: Any) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def degenerate_episodes(prepared: Any, reward: EnvReward, rows: list[dict[str, Any]],
                        replies: list[list[str]]) -> list[EpisodeOutcome]:
    """Score replies that must not pay (empty, echo, refusal) as episodes without a tool call.

    Each runs on a fresh episode instance reset with its row, as TRL would have made it.
    """
    prompts, completions, environments = [], [], []
    columns: dict[str, list[Any]] = {k: [] for k in rows[0] if k != "prompt"}
    for row, texts in zip(rows, replies, strict=True):
        for text in texts:
            episode = prepared.agent.factory()
            episode.reset(**row)
            environments.append(episode)
            prompts.append(row["prompt"])
            completions.append([{"role": "assistant", "content": text}])
            for key in columns:
                columns[key].append(row[key])
    record = reward.score(prompts=prompts, completions=completions, completion_ids=[[] for _ in completions],
                          trainer_state=None, log_extra=None, log_metric=None, environments=environments, **columns)
    return list(record.outcomes)


def agent_stats(transcripts: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Tool use of the sampled episodes: who called a tool, how many calls failed, how many turns."""
    episodes = len(transcripts) or 1
    calls = [sum(len(t.get("tool_calls") or []) for t in turns) for turns in transcripts]
    failures = sum(1 for turns in transcripts for t in turns if t.get("role") == "tool" and t.get("error"))
    turns = [sum(1 for t in ts if t.get("role") == "assistant") for ts in transcripts]
    return {
        "episodes": float(len(transcripts)),
        "tool_call_share": sum(1 for c in calls if c) / episodes,
        "tool_calls": float(sum(calls)),
        "tool_failures": float(failures),
        "tool_failure_share": failures / sum(calls) if sum(calls) else 0.0,
        "turns_mean": statistics.fmean(turns) if turns else 0.0,
        "turns_max": float(max(turns, default=0)),
    }
