"""Pre-flight check of an environment: sample completions, score them, say whether GRPO can learn.

GRPO learns only from differences between the completions of one prompt, so a reward that gives
every completion of a group the same score, that fails, or that pays for an empty reply wastes a
whole run. ``check_env`` finds that out in seconds, before training: it goes through the same
validation as ``train`` (``run.prepare``), samples a few prompts, generates a group of completions
for each with the model, and scores them through the same ``EnvReward`` adapter that training uses,
called the way TRL calls it, so the keyword arguments and the error handling are the ones training
will see. ``%grpo_check`` shows the returned ``CheckReport``.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import math
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.env import ENV_PROMPT_COLUMN, prompt_text
from grpo_magic.environment.reward import EnvReward
from grpo_magic.environment.scores import EpisodeOutcome
from grpo_magic.errors import GRPOMagicError
from grpo_magic.redaction import redact
from grpo_magic.trl_compat import call_reward
from grpo_magic.watch.probes import gaming_probes, probe_replies

#: A degenerate reply scoring at least this much means the reward pays for no work.
DEGENERATE_LIMIT = 0.5
#: At least this share of groups with equal scores makes the reward too sparse to learn from.
ZERO_VARIANCE_LIMIT = 0.5
#: A note when at least this share of completions hit max_new_tokens without ending.
TRUNCATED_NOTE = 0.5
#: A note when the slowest episodes (p95) take at least this many seconds.
SLOW_EPISODE_S = 5.0
#: Most sequences generated in one ``model.generate`` call.
MAX_GENERATE_BATCH = 64

REFUSAL = "I'm sorry, but I can't help with that."
#: The replies that must not pay, and how a verdict names each.
DEGENERATE_REPLIES = {
    "empty": ("an empty reply", "the reward pays for doing nothing"),
    "echo": ("echoing the prompt back", "the reward pays for repeating the question"),
    "refusal": (f"a refusal ({REFUSAL!r})", "the reward pays for refusing"),
}
BIN_LABELS = ("0.0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0")
_SPARKS = " ▁▂▃▄▅▆▇█"


@dataclass
class CheckReport:
    """What sampling and scoring a few groups showed, with a verdict on whether to train.

    ``scores`` holds one list per group (``None`` for a failed episode). ``warnings`` lists every
    finding as a sentence, problems that block training first; ``ready`` is False when any of them
    blocks, and ``verdict`` is then the first one (else ``"ready"``).
    """

    env: str
    model: str
    samples: int
    num_generations: int
    max_new_tokens: int
    scores: list[list[float | None]]
    episodes: int
    valid: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    mean_group_std: float | None
    distribution: dict[str, int]
    zero_variance_groups: int
    zero_variance_share: float
    errors: list[dict[str, Any]]
    error_count: int
    error_kinds: dict[str, int]
    clipped: int
    latency: dict[str, float]
    truncated: int
    truncated_share: float
    degenerate: dict[str, float | None]
    degenerate_errors: dict[str, dict[str, Any]]
    warnings: list[str]
    verdict: str
    ready: bool
    groups: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    #: Agent envs: tool use of the sampled episodes (``check_agent.agent_stats``); None for single-turn envs.
    agent: dict[str, Any] | None = None
    #: The reward-hacking probes (``grpo_magic.watch.probes``): mean score of each (None: every episode failed).
    probes: dict[str, float | None] = field(default_factory=dict)
    #: The probes that score at least as well as the model's samples: each a way to game the reward.
    gaming_probes: list[str] = field(default_factory=list)
    #: The task metrics the run's watch compares the reward with (``--watch``, else the env's ``task_metrics``),
    #: and those of them that score_episode's components do not report.
    task_metrics: list[str] = field(default_factory=list)
    missing_task_metrics: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-serialisable) for logs, tests and the magic."""
        return dataclasses.asdict(self)

    # ------------------------------------------------------------ display

    def _rows(self) -> list[tuple[str, str]]:
        """The report's lines as (label, text), shared by the text and HTML forms."""
        if self.valid:
            spark = "".join(_SPARKS[_spark_level(n, self.valid)] for n in self.distribution.values())
            scores = (f"mean {self.mean:.2f}  std {self.std:.2f}  min {self.min:.2f}  max {self.max:.2f}  "
                      f"within-group std {self.mean_group_std:.2f}  0 [{spark}] 1")
        else:
            scores = "no valid score"
        groups_scored = sum(1 for g in self.scores if sum(s is not None for s in g) >= 2)
        kinds = ", ".join(f"{k} x{n}" for k, n in self.error_kinds.items())
        degenerate = "  ".join(f"{k} {_fmt(v)}" for k, v in self.degenerate.items())
        probes = "  ".join(f"{k} {_fmt(v)}" + (" (games it)" if k in self.gaming_probes else "")
                           for k, v in self.probes.items())
        lat = self.latency
        return [
            ("scores", scores),
            ("equal groups", f"{self.zero_variance_groups} of {groups_scored} groups"
                             f" ({self.zero_variance_share:.0%}) have equal scores" if groups_scored
                             else "n/a (no group has two valid scores)"),
            ("errors", f"{self.error_count} of {self.episodes} episodes" + (f" ({kinds})" if kinds else "")),
            ("clipped", f"{self.clipped} scores outside [0, 1]"),
            ("truncated", f"{self.truncated} of {self.episodes} completions ({self.truncated_share:.0%}) "
                          f"hit {self.max_new_tokens} tokens"),
            ("latency", f"mean {_secs(lat.get('mean', 0))}  p95 {_secs(lat.get('p95', 0))}  "
                        f"max {_secs(lat.get('max', 0))} per episode"),
            ("degenerate", degenerate),
            *([("probes", probes)] if self.probes else []),
            *([("task metrics", ", ".join(self.task_metrics)
                + (f" (not reported: {', '.join(self.missing_task_metrics)})" if self.missing_task_metrics else ""))]
              if self.task_metrics else []),
            *self._agent_rows(),
        ]

    def _agent_rows(self) -> list[tuple[str, str]]:
        a = self.agent
        if a is None:
            return []
        return [
            ("tool use", f"{a['tool_call_share']:.0%} of {int(a['episodes'])} episodes called a tool "
                         f"({int(a['tool_calls'])} calls)"),
            ("tool errors", f"{int(a['tool_failures'])} of {int(a['tool_calls'])} tool calls failed"),
            ("not offered", f"{int(a['not_offered_calls'])} calls to tools not offered"
                            + (f" ({', '.join(a['not_offered_names'])}): TRL answered {a['not_offered_error']}"
                               if a["not_offered_calls"] else "")),
            ("offered tools", f"{a['offered_call_share']:.0%} of episodes called an offered tool; "
                              f"{int(a['unparsed_calls'])} calls did not parse; {int(a['text_only'])} episodes wrote text only"),
            *([("typed calls", f"{a['typed_call_share']:.0%} of episodes made a first call to an offered tool "
                               "with arguments of its schema's types")] if "typed_call_share" in a else []),
            ("turns", f"{a['turns_mean']:.1f} assistant turns per episode (max {int(a['turns_max'])})"),
        ]

    def __str__(self) -> str:
        head = (f"grpo check: {self.env} on {self.model}: {self.samples} prompts x {self.num_generations} "
                f"completions (max {self.max_new_tokens} new tokens)")
        lines = [head, *(f"  {label:<13}{text}" for label, text in self._rows())]
        lines += [f"  ! {w}" for w in self.warnings]
        lines.append(f"verdict: {self.verdict}")
        return redact("\n".join(lines))  # the report quotes env errors and prompts: no token in it

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython in a terminal shows the text table that ``print(report)`` gives, not the one-line repr."""
        p.text(str(self))

    def __repr__(self) -> str:
        return (f"CheckReport(env={self.env!r}, ready={self.ready}, mean={_fmt(self.mean)}, "
                f"errors={self.error_count}, verdict={self.verdict!r})")

    def _repr_html_(self) -> str:
        def esc(text: str) -> str:  # redacted before escaping: quoted JSON keys are still quotes then
            return html.escape(redact(text))

        color = "#1a7f37" if self.ready else "#b35900"
        rows = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{esc(label)}</th>"
            f"<td style='text-align:left'>{esc(text)}</td></tr>"
            for label, text in self._rows()
        )
        warnings = "".join(f"<li>{esc(w)}</li>" for w in self.warnings)
        return (
            "<div class='grpo-check'>"
            f"<div><b>grpo check</b>: {esc(self.env)} on {esc(self.model)}: {self.samples} prompts &times; "
            f"{self.num_generations} completions (max {self.max_new_tokens} new tokens)</div>"
            f"<table>{rows}</table>"
            + (f"<ul>{warnings}</ul>" if warnings else "")
            + f"<div style='color:{color};font-weight:bold'>verdict: {esc(self.verdict)}</div></div>"
        )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _secs(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _spark_level(count: int, total: int) -> int:
    return 0 if count == 0 else max(1, round(8 * count / total))


# ---------------------------------------------------------------- the check


def check_env(
    env: Any = None,
    *,
    model: str = "tiny",
    samples: int = 8,
    num_generations: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
    params: GRPOParams | None = None,
    workers: int = 1,
    timeout: float | None = None,
) -> CheckReport:
    """Sample ``samples`` prompts, generate ``num_generations`` completions each, score and judge them.

    ``env`` is a registered env's name, an env class or instance, or None to use
    ``params.rl_env_module``/``rl_env_class``. With ``params``, its model and generation settings are
    used (a check should see what training will), except for keyword arguments given here with
    a value other than their default (and ``model`` when the params have none). Bad input raises ``GRPOMagicError`` before the model loads;
    failing episodes never raise: they are reported.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise GRPOMagicError(f"samples must be a whole number of prompts, at least 1; got {samples!r}.")
    params = _check_params(params, model=model, num_generations=num_generations, max_new_tokens=max_new_tokens,
                           temperature=temperature, seed=seed, workers=workers, timeout=timeout)
    from grpo_magic.training.preflight import prepare

    started = time.perf_counter()
    params, prepared, model_path, tokenizer = prepare(params, env)
    spec_name = prepared.spec.name
    dataset = prepared.dataset
    rows = [dataset[i] for i in sorted(random.Random(params.seed).sample(range(len(dataset)), min(samples, len(dataset))))]

    if prepared.agent is not None:
        from .check_agent import refuse_while_training

        refuse_while_training()
    lm = _load(model_path, tokenizer)
    loaded = time.perf_counter()
    reward = EnvReward(prepared.env, workers=params.rl_env_workers, timeout=params.rl_episode_timeout,
                       max_error_rate=1.0, agent=prepared.agent, defer_failure=True)
    reward.bind(lm, tokenizer)
    agent: dict[str, Any] | None = None
    degenerate_texts = [["", _echo(r), REFUSAL] for r in rows]
    probe_texts = [probe_replies(tokenizer, params.rl_max_new_tokens, r, seed=params.seed + i)
                   for i, r in enumerate(rows)]
    try:
        if prepared.agent is not None:  # whole episodes, through TRL's tool loop (generation and scoring at once)
            from .check_agent import (
                agent_stats,
                degenerate_episodes,
                names_a_tool,
                run_agent_episodes,
                uncopyable_arguments,
                why_no_tool_call,
            )

            episodes = run_agent_episodes(params, prepared, lm, tokenizer, reward, rows)
            generated = _Generated(episodes.texts, [], episodes.truncated)
            outcomes = episodes.outcomes
            agent = agent_stats(episodes.transcripts, prepared.agent.tool_names, prepared.agent.schemas)
            generated_at = scored_at = time.perf_counter()
            degenerate_outcomes = degenerate_episodes(prepared, reward, rows, degenerate_texts)
            probe_outcomes = degenerate_episodes(prepared, reward, rows, [list(p.values()) for p in probe_texts])
        else:
            generated = _generate(lm, tokenizer, [r["prompt"] for r in rows], params)
            generated_at = time.perf_counter()
            outcomes = _score(reward, tokenizer, rows, generated.texts)
            scored_at = time.perf_counter()
            degenerate_outcomes = _score(reward, tokenizer, rows, degenerate_texts)
            probe_outcomes = _score(reward, tokenizer, rows, [list(p.values()) for p in probe_texts])
    finally:
        reward.close()
    report = _report(
        env=spec_name, model=params.model or "", params=params, rows=rows, generated=generated,
        outcomes=outcomes, degenerate_outcomes=degenerate_outcomes,
        seconds={"load": round(loaded - started, 3), "generate": round(generated_at - loaded, 3),
                 "score": round(scored_at - generated_at, 3)},
    )
    _judge_probes(report, probe_texts, probe_outcomes, outcomes)
    _judge_task_metrics(report, params, prepared.env, outcomes)
    if agent is not None:
        report.agent = agent
        n = params.rl_num_generations
        for gi, group in enumerate(report.groups):
            group["transcripts"] = episodes.transcripts[gi * n:(gi + 1) * n]
        uncopied, named = None, None
        if params.model == "tiny-agent":  # what it can call is what the request spells out
            uncopied = uncopyable_arguments(prepared.agent.schemas, tokenizer)
            named = names_a_tool([prompt_text(r.get(ENV_PROMPT_COLUMN, r["prompt"])) for r in rows],
                                 prepared.agent.tool_names)
        why = why_no_tool_call(agent, prepared.agent.tool_names, params.model or "", uncopied, named)
        if why is not None:
            report.warnings.append(why)
    return report


def _check_params(params: GRPOParams | None, **args: Any) -> GRPOParams:
    """The run's params: built from the arguments, or the given ones with non-default arguments on top."""
    mapping = {"model": "model", "num_generations": "rl_num_generations", "max_new_tokens": "rl_max_new_tokens",
               "temperature": "rl_temperature", "seed": "seed", "workers": "rl_env_workers",
               "timeout": "rl_episode_timeout"}
    if params is None:
        n = args["num_generations"]
        batch = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 4  # the batch is not checked here
        return GRPOParams(**{mapping[k]: v for k, v in args.items()}, batch_size=batch)
    if not isinstance(params, GRPOParams):
        raise GRPOMagicError(f"params must be a GRPOParams, got {type(params).__name__}.")
    if params.model is None:  # the check's model (tiny unless given) fills a params without one
        params = params.replace(model=args["model"])
    params.validate()  # what training would reject is reported as such, before any override
    defaults = inspect.signature(check_env).parameters
    changes = {mapping[k]: v for k, v in args.items() if v != defaults[k].default}
    if "rl_num_generations" in changes:  # a check-only group size: keep the (unused) batch consistent with it
        n = changes["rl_num_generations"]
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            changes.update(batch_size=n, gradient_accumulation=1)
    return params.replace(**changes) if changes else params


def _load(model_path: str, tokenizer: Any) -> Any:
    """The policy as training starts it, on the GPU when there is one, ready to sample."""
    import torch

    from grpo_magic.models import load_model

    lm = load_model(model_path, tokenizer=tokenizer)
    if torch.cuda.is_available():
        lm = lm.to("cuda")
    lm.eval()
    return lm


@dataclass
class _Generated:
    texts: list[list[str]]
    ids: list[list[list[int]]]
    truncated: list[list[bool]]


def _generate(model: Any, tokenizer: Any, prompts: list[Any], params: GRPOParams) -> _Generated:
    """``num_generations`` sampled completions per prompt, batched and left-padded as TRL does."""
    import torch
    from transformers import GenerationConfig

    from grpo_magic.environment.generation import eos_ids, generate_groups, prompt_ids

    n = params.rl_num_generations
    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    config = GenerationConfig(
        max_new_tokens=params.rl_max_new_tokens, do_sample=True, temperature=params.rl_temperature,
        top_k=params.rl_top_k, top_p=params.rl_top_p, pad_token_id=pad, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos, disable_compile=True,
    )
    torch.manual_seed(params.seed)
    groups = generate_groups(model, [prompt_ids(tokenizer, p) for p in prompts], config, n=n, pad=pad, eos=eos,
                             batch_size=MAX_GENERATE_BATCH)
    out = _Generated([], [], [])
    for group in groups:
        out.texts.append([tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in group])
        out.ids.append([ids for ids, _ in group])
        out.truncated.append([cut for _, cut in group])
    return out


def _echo(row: dict[str, Any]) -> str:
    """The env's own prompt as plain text (the user's question, not the rendered template)."""
    prompt = row.get(ENV_PROMPT_COLUMN) or row["prompt"]
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return prompt_text(prompt)


def _score(reward: EnvReward, tokenizer: Any, rows: list[dict[str, Any]], texts: list[list[str]]) -> list[EpisodeOutcome]:
    """Call the adapter as TRL does: one batch, prompts and every extra column repeated per completion."""
    prompts, completions, ids = [], [], []
    columns: dict[str, list[Any]] = {k: [] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    for row, group in zip(rows, texts, strict=True):
        for text in group:
            prompts.append(row["prompt"])
            chat = isinstance(row["prompt"], list)
            completions.append([{"role": "assistant", "content": text}] if chat else text)
            ids.append(list(tokenizer(text=text, add_special_tokens=False)["input_ids"]) if text else [])
            for key in columns:
                columns[key].append(row[key])
    record = call_reward(reward.score, prompts, completions, completion_ids=ids, **columns)
    return list(record.outcomes)


# ---------------------------------------------------------------- judging


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def _bin(score: float) -> str:
    return BIN_LABELS[min(len(BIN_LABELS) - 1, int(score * len(BIN_LABELS)))]


def _report(*, env: str, model: str, params: GRPOParams, rows: list[dict[str, Any]], generated: _Generated,
            outcomes: list[EpisodeOutcome], degenerate_outcomes: list[EpisodeOutcome],
            seconds: dict[str, float]) -> CheckReport:
    n = params.rl_num_generations
    groups_out = [outcomes[i * n:(i + 1) * n] for i in range(len(rows))]
    scores = [[o.score for o in g] for g in groups_out]
    valid = [s for o in outcomes if (s := o.score) is not None]
    errors = []
    for gi, group in enumerate(groups_out):
        for ci, o in enumerate(group):
            if o.error is not None:
                errors.append({**o.error, "group": gi, "completion": ci, "index": gi * n + ci})
    kinds = dict(Counter(e["kind"] for e in errors).most_common())
    scored_groups = [[s for s in g if s is not None] for g in scores]
    scored_groups = [g for g in scored_groups if len(g) >= 2]
    zero = sum(1 for g in scored_groups if max(g) - min(g) <= 1e-9)
    distribution = dict.fromkeys(BIN_LABELS, 0)
    for s in valid:
        distribution[_bin(s)] += 1
    latencies = [o.latency_s for o in outcomes]
    truncated = sum(sum(g) for g in generated.truncated)

    degenerate: dict[str, float | None] = {}
    degenerate_errors: dict[str, dict[str, Any]] = {}
    for k, name in enumerate(DEGENERATE_REPLIES):
        mine = degenerate_outcomes[k::3]
        got = [o.score for o in mine if o.score is not None]
        degenerate[name] = round(statistics.fmean(got), 4) if got else None
        failed = next((o.error for o in mine if o.error is not None), None)
        if failed is not None:
            degenerate_errors[name] = failed

    groups = [
        {"prompt": prompt_text(row.get(ENV_PROMPT_COLUMN) or row["prompt"]), "completions": generated.texts[gi],
         "scores": scores[gi], "errors": [o.error for o in groups_out[gi]],
         "truncated": generated.truncated[gi], "latency_s": [round(o.latency_s, 6) for o in groups_out[gi]]}
        for gi, row in enumerate(rows)
    ]
    report = CheckReport(
        env=env, model=model, samples=len(rows), num_generations=n, max_new_tokens=params.rl_max_new_tokens,
        scores=scores, episodes=len(outcomes), valid=len(valid),
        mean=statistics.fmean(valid) if valid else None,
        std=statistics.pstdev(valid) if valid else None,
        min=min(valid) if valid else None, max=max(valid) if valid else None,
        mean_group_std=statistics.fmean(statistics.pstdev(g) for g in scored_groups) if scored_groups else None,
        distribution=distribution, zero_variance_groups=zero,
        zero_variance_share=zero / len(scored_groups) if scored_groups else 0.0,
        errors=errors, error_count=len(errors), error_kinds=kinds, clipped=sum(o.clipped for o in outcomes),
        latency={"mean": statistics.fmean(latencies) if latencies else 0.0, "p95": _p95(latencies),
                 "max": max(latencies, default=0.0)},
        truncated=truncated, truncated_share=truncated / len(outcomes) if outcomes else 0.0,
        degenerate=degenerate, degenerate_errors=degenerate_errors,
        warnings=[], verdict="", ready=False, groups=groups, seconds=seconds,
    )
    blocking, notes = _findings(report, scored_groups)
    report.warnings = blocking + notes
    report.ready = not blocking
    if blocking:
        more = len(blocking) - 1
        report.verdict = blocking[0] + (f" ({more} more problem{'s' if more > 1 else ''} in the warnings.)" if more else "")
    else:
        report.verdict = "ready"
    return report


def _findings(r: CheckReport, scored_groups: list[list[float]]) -> tuple[list[str], list[str]]:
    """Sentences that name what is wrong and the fix: (problems that block training, notes)."""
    blocking: list[str] = []
    notes: list[str] = []
    if r.error_count:
        first = r.errors[0]
        message = first["message"].strip().splitlines()[0].rstrip(".") if first["message"].strip() else first["kind"]
        if len(message) > 160:
            message = message[:157] + "..."
        if len(r.error_kinds) > 1:
            message = ", ".join(f"{kind} x{count}" for kind, count in r.error_kinds.items()) + f"; first: {message}"
        fix = ("make score_episode faster or raise --rl-episode-timeout" if set(r.error_kinds) == {"timeout"}
               else "fix score_episode before training")
        blocking.append(f"{r.error_count} of {r.episodes} episodes failed ({message}): {fix}.")
    for name, value in sorted(r.degenerate.items(), key=lambda kv: -(kv[1] or 0.0)):
        if value is not None and value >= DEGENERATE_LIMIT:
            what, why = DEGENERATE_REPLIES[name]
            blocking.append(f"{what} scores {value:.2f}: {why}.")
    if scored_groups and r.zero_variance_share >= ZERO_VARIANCE_LIMIT:
        blocking.append(_equal_groups_advice(r, scored_groups))
    for name, error in r.degenerate_errors.items():
        if error["kind"] in r.error_kinds:  # the same failure as the sampled episodes': said above
            continue
        what, _ = DEGENERATE_REPLIES[name]
        notes.append(f"score_episode fails on {what} ({error['message']}); the model can reply that way, and "
                     "that episode would get no reward.")
    if r.clipped:
        notes.append(f"{r.clipped} of {r.episodes} scores were outside [0, 1] and were clipped; return scores "
                     "between 0 and 1 so that they keep their differences.")
    if r.episodes and r.truncated_share >= TRUNCATED_NOTE:
        notes.append(f"{r.truncated} of {r.episodes} completions hit max_new_tokens ({r.max_new_tokens}) without "
                     "ending; if answers need more room, raise --rl-max-new-tokens.")
    if r.latency["p95"] >= SLOW_EPISODE_S:
        notes.append(f"episodes are slow (p95 {r.latency['p95']:.1f} s, max {r.latency['max']:.1f} s); raise "
                     "--rl-env-workers, make score_episode async, or set --rl-episode-timeout.")
    return blocking, notes


#: How the report names a probe that games the reward, and what that says about the reward.
PROBE_WORDS = {
    "repeated token": ("one token repeated to the length limit", "the reward pays for repetition or length"),
    "random words": ("a reply of random words", "the reward pays for text that answers nothing"),
    "bare answer": ("the bare answer without the format the prompt asks for",
                    "the reward does not check the format (fine if the bare answer is the task)"),
}


def _judge_probes(report: CheckReport, texts: list[dict[str, str]], outcomes: list[EpisodeOutcome],
                  samples: list[EpisodeOutcome]) -> None:
    """Each probe's mean score, the probes that score at least as well as the samples, and a note for each."""
    by_name: dict[str, list[float | None]] = {}
    flat = iter(outcomes)
    for probes in texts:
        for name in probes:
            by_name.setdefault(name, []).append(next(flat).score)
    report.probes = {name: (round(statistics.fmean(got), 4) if (got := [s for s in scores if s is not None]) else None)
                     for name, scores in by_name.items()}
    report.gaming_probes = gaming_probes(report.probes, [o.score for o in samples])
    if report.gaming_probes and report.mean is not None:
        for name in report.gaming_probes:
            what, why = PROBE_WORDS.get(name, (name, "the reward can be gamed"))
            report.warnings.append(f"{what} scores {report.probes[name]:.2f}, as much as the model's own samples "
                                   f"({report.mean:.2f}): {why}, a way to game it; the reward-hacking watch will "
                                   "look for it during training.")


def _judge_task_metrics(report: CheckReport, params: GRPOParams, env: Any, outcomes: list[EpisodeOutcome]) -> None:
    """The watch's task metrics, and a note for each that score_episode does not return as a component."""
    from grpo_magic.training.watching import unreported, unreported_note, watched_metrics

    names = watched_metrics(params, env) or ()
    report.task_metrics = list(names)
    components = {k for o in outcomes for k in (o.components or {})}
    if not any(o.score is not None for o in outcomes):
        return  # nothing was scored: the failures are what the report says
    report.missing_task_metrics = unreported(names, components)
    if report.missing_task_metrics:
        report.warnings.append(unreported_note(report.missing_task_metrics, components))


def _equal_groups_advice(r: CheckReport, scored_groups: list[list[float]]) -> str:
    """Why most groups have equal scores, and the fix for that case: partial credit only where nothing pays.

    Equal groups at the top score mean the env is already solved for this model (partial credit would change
    nothing: raise the difficulty); at zero, the reward never pays it (partial credit, easier prompts or a
    stronger model); at one score in between, the reward does not tell its completions apart.
    """
    equal = [g[0] for g in scored_groups if max(g) - min(g) <= 1e-9]
    top = sum(v >= 1.0 - 1e-9 for v in equal)
    zero = sum(v <= 1e-9 for v in equal)
    flat = {round(s, 9) for g in scored_groups for s in g}
    every = f" (every score is {next(iter(flat)):.2f})" if len(flat) == 1 else ""
    head = f"{r.zero_variance_groups} of {len(scored_groups)} groups have equal scores{every}"
    why = "GRPO learns only from differences within a group"
    if top == len(equal):
        return (f"{head}{'' if every else ', all at the top score 1.00'}: the env is already solved for this model, so there is nothing "
                f"to learn ({why}); raise the difficulty (harder prompts, a stricter score) or train a smaller model.")
    if zero == len(equal):
        return (f"{head}{'' if every else ', all 0.00'}: the reward never pays this model ({why}); give partial credit for steps "
                "towards the answer, or make the prompts easier, or start from a stronger model.")
    if top + zero == len(equal):
        return (f"{head}: {top} at 1.00 (already solved) and {zero} at 0.00 (never paid), so the prompts are too "
                f"easy or too hard for this model ({why}); use prompts of middling difficulty for it, or give partial "
                "credit to the ones that never pay.")
    return (f"{head}: the reward does not tell this model's completions apart ({why}); score finer (partial credit "
            "for partly right answers) so that completions of one prompt differ.")
