"""Evaluation inside a run (``--eval-steps``): TRL's eval batches plus greedy episodes, as one ``EvalScored``.

``run`` calls ``eval_event`` after each of TRL's evaluations and ``evals_before`` when a run resumes,
so that ``run.evals`` holds the evaluations before the checkpoint too (docs/architecture.md, "Evaluation").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.env import PreparedEnv
from grpo_magic.environment.reward import BatchRecord, EnvReward
from grpo_magic.events import RUN_LOG_NAME, EvalScored, read_run_log


def eval_dict(event: EvalScored) -> dict[str, Any]:
    """An ``EvalScored`` event as ``run.evals`` and the dashboard keep it."""
    import dataclasses

    data = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    data.pop("time", None)
    return data


def eval_event(prepared: PreparedEnv, params: GRPOParams, reward: EnvReward, step: int, metrics: dict[str, Any],
               records: list[BatchRecord], seconds: float, *, baseline: bool) -> EvalScored:
    """TRL's eval batches (sampled episodes) plus one greedy episode a held-out prompt, as one event.

    The greedy episodes run on the policy being trained, in this (the training) thread between two
    steps, with HF generate; agent envs get none in a run (their episodes need TRL's tool loop, which
    an evaluation after the run gives: ``grpo_magic.evaluate``).
    """
    import json

    from grpo_magic.environment.env import ENV_PROMPT_COLUMN, prompt_text
    from grpo_magic.environment.heldout import MAX_ROWS_SHOWN, evaluate_rows, summarize

    def key(prompt: str, columns: dict[str, Any]) -> str:
        extra = {k: v for k, v in columns.items() if k not in ("prompt", ENV_PROMPT_COLUMN)}
        return prompt + "\x00" + json.dumps(extra, sort_keys=True, default=str)

    started = time.monotonic()
    # TRL's eval sampler repeats each prompt samples times in a row: one group a dataset row, found by its
    # prompt and columns (rows that are equal share their groups out in order).
    k = params.eval_samples
    sampled: dict[str, list[list[float | None]]] = {}
    errors = 0
    for record in records:
        for start in range(0, len(record.outcomes), k):
            group = record.outcomes[start:start + k]
            columns = record.columns[start] if start < len(record.columns) else {}
            sampled.setdefault(key(record.prompts[start], columns), []).append([o.score for o in group])
            errors += sum(o.error is not None for o in group)
    greedy = prepared.agent is None and reward.model is not None
    rows: list[dict[str, Any]] = []
    if greedy:
        scorer = EnvReward(reward.env, workers=params.rl_env_workers, timeout=params.rl_episode_timeout)
        try:
            rows = evaluate_rows(prepared, reward.model, reward.tokenizer, prepared.eval_dataset, params=params,
                                 samples=0, greedy=True, seed=params.seed, reward=scorer)
        finally:
            scorer.close()
    else:
        rows = [{"prompt": prompt_text(r.get(ENV_PROMPT_COLUMN) or r["prompt"])} for r in prepared.eval_dataset]
    for row, data in zip(rows, prepared.eval_dataset, strict=True):
        groups = sampled.get(key(row["prompt"], data), [])
        row["sampled_scores"] = groups.pop(0) if groups else []
    summary = summarize(rows, samples=params.eval_samples, seed=params.seed)
    summary["errors"] = errors + sum(r.get("greedy_error") is not None for r in rows)
    return EvalScored(
        step=step, prompts=len(rows), greedy_mean=summary["greedy_mean"] if greedy else None,
        sampled_mean=summary["sampled_mean"], pass_at_k=summary["pass_at_k"], greedy_ci=summary["greedy_ci"],
        sampled_ci=summary["sampled_ci"], components=summary["components"], errors=summary["errors"],
        samples=params.eval_samples, baseline=baseline, seconds=round(seconds + time.monotonic() - started, 4),
        trl_metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float)) or v is None},
        rows=[{k: r.get(k) for k in ("prompt", "greedy", "greedy_score", "sampled_scores")} for r in rows][
            :MAX_ROWS_SHOWN],
    )


def evals_before(output_dir: Path, step: int) -> list[dict[str, Any]]:
    """The held-out evaluations of steps 0..``step`` from the run log (a later attempt at a step wins)."""
    if not (output_dir / RUN_LOG_NAME).exists():
        return []
    evals: dict[int, dict[str, Any]] = {}
    for event in read_run_log(output_dir):
        if isinstance(event, EvalScored) and event.step <= step:
            evals[event.step] = eval_dict(event)
    return [evals[s] for s in sorted(evals)]
