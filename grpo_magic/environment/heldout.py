"""Held-out scoring: the numbers of an evaluation and its single-turn episodes (docs/architecture.md, "Evaluation").

pass@k (the unbiased estimator), a seeded bootstrap interval, the summary of per-prompt rows and the
comparison with a baseline; and ``evaluate_rows``, which generates and scores the episodes of held-out
prompts through the reward adapter of training. ``evaluation.evaluate`` (after a run) and the runner's
``--eval-steps`` (during one) both use it; agent episodes come from the caller (``agent_episodes``),
since they run through TRL's tool loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.trl_compat import call_reward

from .env import ENV_PROMPT_COLUMN, PreparedEnv, prompt_text
from .reward import EnvReward
from .scores import EpisodeOutcome

#: A greedy episode "passes" when it scores at least this (the full score, by default).
PASS_THRESHOLD = 1.0
BOOTSTRAP_RESAMPLES = 1000
#: Rows shown in the notebook table and kept in an ``EvalScored`` event.
MAX_ROWS_SHOWN = 50
#: Prompts scored between two progress lines (``evaluate_rows(progress=...)``): a slow env says where it is
#: every few prompts rather than minutes later.
PROGRESS_EVERY = 4
#: Where progress lines go (``evaluation.evaluate``: stderr in the CLI, an updating line in a notebook).
Progress = Callable[[str], None]


# ---------------------------------------------------------------- the numbers


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` passed: 1 - C(n-c, k) / C(n, k).

    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code".) Exact integer binomials,
    so the hand-checkable cases are exact.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_interval(
    values: list[float], seed: int, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> list[float] | None:
    """A percentile bootstrap interval of the mean over prompts, seeded (the same seed, the same interval).

    Written with numpy's seeded generator rather than scipy.stats.bootstrap: scipy is no dependency of
    grpo_magic, and resampling prompts with replacement is a few lines.
    """
    import numpy as np

    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if data.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return [round(float(low), 6), round(float(high), 6)]


def _mean(values: list[float | None]) -> float | None:
    valid = [v for v in values if v is not None]
    return sum(valid) / len(valid) if valid else None


def _passes(score: float | None, threshold: float) -> bool:
    return score is not None and score >= threshold - 1e-9


def pass_ks(samples: int) -> list[int]:
    """The k of pass@k reported for ``samples`` sampled episodes a prompt: 1 and ``samples``."""
    return sorted({1, samples}) if samples >= 1 else []


def summarize(
    rows: list[dict[str, Any]],
    *,
    samples: int,
    seed: int,
    threshold: float = PASS_THRESHOLD,
    baseline_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report's summary of per-prompt rows (``greedy_score``, ``sampled_scores``, ``components``)."""
    greedy = [r.get("greedy_score") for r in rows]
    sampled = [_mean(r.get("sampled_scores") or []) for r in rows]
    summary: dict[str, Any] = {
        "prompts": len(rows),
        "samples": samples,
        "threshold": threshold,
        "seed": seed,
        "greedy_mean": _mean(greedy),
        "greedy_ci": bootstrap_interval([g for g in greedy if g is not None], seed),
        "greedy_pass": _mean([float(_passes(g, threshold)) for g in greedy if g is not None]),
        "sampled_mean": _mean(sampled) if samples else None,
        "sampled_ci": bootstrap_interval([s for s in sampled if s is not None], seed) if samples else None,
        "pass_at_k": {},
        "pass_at_k_ci": {},
        "errors": sum(int(r.get("greedy_error") is not None) + int(r.get("sampled_errors") or 0) for r in rows),
    }
    for k in pass_ks(samples):
        per_prompt = []
        for r in rows:
            scores = [s for s in r.get("sampled_scores") or [] if s is not None]
            if len(scores) >= k:  # an episode error is no sample: pass@k of the scored ones
                per_prompt.append(pass_at_k(len(scores), sum(_passes(s, threshold) for s in scores), k))
        summary["pass_at_k"][f"pass@{k}"] = _mean(per_prompt)
        summary["pass_at_k_ci"][f"pass@{k}"] = bootstrap_interval(per_prompt, seed)
    parts: dict[str, list[float]] = {}
    for r in rows:
        for name, value in (r.get("components") or {}).items():
            parts.setdefault(name, []).append(value)
    summary["components"] = {name: sum(v) / len(v) for name, v in parts.items()}
    if baseline_rows is not None:
        summary.update(compare(rows, baseline_rows, threshold))
    return summary


def compare(rows: list[dict[str, Any]], baseline_rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Failing -> passing (``fixed``) and back (``broke``), per prompt's greedy episode; marks the rows that changed."""
    base = {r["prompt"]: r for r in baseline_rows}
    fixed = broke = both = 0
    for r in rows:
        b = base.get(r["prompt"])
        if b is None:
            continue
        both += 1
        now, before = _passes(r.get("greedy_score"), threshold), _passes(b.get("greedy_score"), threshold)
        r["baseline_greedy"] = b.get("greedy")
        r["baseline_score"] = b.get("greedy_score")
        r["change"] = "fixed" if now and not before else "broke" if before and not now else ""
        fixed += r["change"] == "fixed"
        broke += r["change"] == "broke"
    return {
        "baseline_greedy_mean": _mean([b.get("greedy_score") for b in baseline_rows]),
        "baseline_sampled_mean": _mean([_mean(b.get("sampled_scores") or []) for b in baseline_rows])
        if any(b.get("sampled_scores") for b in baseline_rows)
        else None,
        "fixed": fixed / both if both else None,
        "broke": broke / both if both else None,
        "changed": [r["prompt"] for r in rows if r.get("change")],
    }


# ---------------------------------------------------------------- episodes


def _score(reward: EnvReward, rows: list[dict[str, Any]], texts: list[list[str]]) -> list[list[EpisodeOutcome]]:
    """Score each row's completions as TRL calls the reward: one batch, columns repeated per completion."""
    prompts, completions = [], []
    columns: dict[str, list[Any]] = {k: [] for k in rows[0] if k != "prompt"}
    for row, group in zip(rows, texts, strict=True):
        for text in group:
            prompts.append(row["prompt"])
            completions.append([{"role": "assistant", "content": text}] if isinstance(row["prompt"], list) else text)
            for key in columns:
                columns[key].append(row[key])
    if not completions:
        return [[] for _ in rows]
    record = call_reward(reward.score, prompts, completions, **columns)
    outcomes = list(record.outcomes)
    out, at = [], 0
    for group in texts:
        out.append(outcomes[at : at + len(group)])
        at += len(group)
    return out


def _env_prompt(row: dict[str, Any]) -> str:
    return prompt_text(row.get(ENV_PROMPT_COLUMN) or row["prompt"])


#: (prepared, model, tokenizer, reward, rows, params=, samples=, greedy=, seed=) -> (greedy groups, sampled groups)
AgentEpisodes = Callable[..., tuple[list, list]]


def _silent(_line: str) -> None:
    """No progress asked for."""


def _episodes_said(prompts: int, greedy: bool, samples: int) -> str:
    """What a progress line says runs, e.g. 'the greedy and 4 sampled episodes of 32 prompts'."""
    kinds = [k for k, on in (("greedy", greedy), (f"{samples} sampled", samples)) if on]
    return f"the {' and '.join(kinds)} episodes of {prompts} prompts"


def evaluate_rows(
    prepared: PreparedEnv,
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    params: GRPOParams,
    samples: int,
    greedy: bool = True,
    seed: int = 0,
    reward: EnvReward | None = None,
    agent_episodes: AgentEpisodes | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One row per prompt of ``dataset``: the greedy episode (``greedy``) and ``samples`` sampled ones, scored.

    Single-turn envs generate with HF generate in batches (``generation.generate_batch``); agent envs run
    whole episodes with ``agent_episodes`` (``evaluation``'s: TRL's tool loop). Scores go through
    ``reward`` (default: a new ``EnvReward`` of the env, with the run's workers and timeout). With
    ``progress``, a line says what runs and, every ``PROGRESS_EVERY`` prompts, how many are scored; without
    it, each kind of episode is scored in one batch, as TRL calls the reward.
    """
    from .generation import generate_batch

    own = reward is None
    if reward is None:
        reward = EnvReward(prepared.env, workers=params.rl_env_workers, timeout=params.rl_episode_timeout,
                           agent=prepared.agent)
    reward.bind(model, tokenizer, generator=reward.generator)
    data = [dict(r) for r in dataset]
    say = progress or _silent
    try:
        if prepared.agent is not None:
            if agent_episodes is None:
                raise ValueError("an agent env's episodes need agent_episodes (evaluation.agent_episodes)")
            say(f"running {_episodes_said(len(data), greedy, samples)} through TRL's tool loop")
            greedy_groups, sampled_groups = agent_episodes(
                prepared, model, tokenizer, reward, data, params=params, samples=samples, greedy=greedy, seed=seed
            )
        else:
            prompts = [r["prompt"] for r in data]
            settings = dict(
                max_new_tokens=params.rl_max_new_tokens,
                temperature=params.rl_temperature,
                top_k=params.rl_top_k,
                top_p=params.rl_top_p,
            )
            say(f"generating {_episodes_said(len(data), greedy, samples)}")
            greedy_texts = generate_batch(model, tokenizer, prompts, greedy=True, **settings) if greedy else []
            sampled_texts = (
                generate_batch(model, tokenizer, prompts, n=samples, seed=seed, **settings) if samples else []
            )
            greedy_scored: list[list[EpisodeOutcome]] = []
            sampled_scored: list[list[EpisodeOutcome]] = []
            every = PROGRESS_EVERY if progress is not None else max(1, len(data))
            for at in range(0, len(data), every):
                part = slice(at, at + every)
                if greedy:
                    greedy_scored += _score(reward, data[part], greedy_texts[part])
                if samples:
                    sampled_scored += _score(reward, data[part], sampled_texts[part])
                say(f"scored {min(at + every, len(data))}/{len(data)} prompts")
            greedy_groups = list(zip(greedy_texts, greedy_scored, strict=True)) if greedy else []
            sampled_groups = list(zip(sampled_texts, sampled_scored, strict=True)) if samples else []
    finally:
        if own:
            reward.close()
    if prepared.agent is not None:
        say(f"scored {len(data)}/{len(data)} prompts")
    rows = []
    for i, row in enumerate(data):
        item: dict[str, Any] = {"prompt": _env_prompt(row)}
        if greedy:
            texts, outcomes = greedy_groups[i]
            o = outcomes[0]
            item.update(
                greedy=texts[0],
                greedy_score=o.score,
                greedy_error=o.error["message"] if o.error else None,
                components=dict(o.components),
            )
        if samples:
            texts, outcomes = sampled_groups[i]
            item.update(
                sampled=list(texts),
                sampled_scores=[o.score for o in outcomes],
                sampled_errors=sum(o.error is not None for o in outcomes),
            )
        rows.append(item)
    return rows
