"""What-if re-scoring: the completions a run log recorded, scored again by the env as it is now.

``rescore(run_or_dir, env)`` (``%grpo_rescore``) generates nothing. It reads the ``group_scored``
events of a run log (a finished run, one still training, or a folder copied from another
machine), runs the new env's ``score_episode`` on each logged completion through the same
``EnvReward``/``EpisodeRunner`` path as training (async envs and ``rl_env_workers`` run episodes
concurrently; a failing episode is an error in the report, as in training), and recomputes the
advantages with TRL's formula and that run's settings (``trl_advantages``). The dataset columns
``score_episode`` takes come from the run log: each group event records its prompt's row
(``GroupScored.columns``); a log written before that field existed is matched to the new env's
dataset by prompt text instead.
"""

from __future__ import annotations

import html
import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.agent import agent_spec, is_agent_env, replay_episode, trl_messages
from grpo_magic.environment.env import (
    PROVIDED_KWARGS,
    EnvSpec,
    build_and_check_dataset,
    check_interface,
    check_tools,
    episode_parameters,
    get_env,
    prompt_text,
)
from grpo_magic.environment.reward import EnvReward
from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import RUN_LOG_NAME, AlarmRaised, GroupScored, RunStarted, read_run_log, run_log_path
from grpo_magic.trl_compat import trl_advantages

#: Completions scored per reward call: whole groups, enough for async envs and worker threads to overlap.
CHUNK_COMPLETIONS = 256
MAX_HTML_GROUPS = 40
SCORE_EPS = 1e-9


#: The keys of each of a rescore report's ``.groups`` (dicts, like ``run.groups``' items): the logged group's
#: old scores and advantages next to the new env's; ``changed`` per completion, ``rank_changes`` per group.
GROUP_KEYS = ("step", "group", "prompt", "completions", "old_scores", "new_scores", "old_advantages", "new_advantages",
              "errors", "old_components", "new_components", "warnings", "rank_changes", "changed")


@dataclass
class RescoreReport:
    """What the new env says about a run's logged completions; ``_repr_html_`` shows it in a notebook."""

    run_log: str
    env_name: str
    groups: list[dict[str, Any]]  # GROUP_KEYS, as run.groups' items are dicts
    summary: dict[str, Any]
    settings: dict[str, Any]
    #: The reward-hacking watch's alarms in the run log (``run.alarms``' dicts: kind, step, message, evidence).
    alarms: list[dict[str, Any]] = field(default_factory=list)

    def __repr__(self) -> str:
        s = self.summary
        alarms = f", {len(self.alarms)} alarm{'s' if len(self.alarms) != 1 else ''}" if self.alarms else ""
        return (f"<RescoreReport {self.env_name} on {s['completions']} completions of steps {s['steps']}: mean reward "
                f"{_fmt(s['mean_old'])} -> {_fmt(s['mean_new'])}, {s['rank_changes']} rank changes, "
                f"{s['errors']} errors{alarms}>")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython in a terminal: the one-line summary, then one line per alarm of the run log."""
        p.text("\n".join([repr(self), *alarm_lines(self.alarms)]))

    def _repr_html_(self) -> str:
        return report_html(self)


# ---------------------------------------------------------------- reading the run log


@dataclass
class LoggedRun:
    """The parts of a run log that rescoring needs: the run's params and its latest groups per step."""

    path: Path
    params: dict[str, Any]
    env_name: str
    groups: dict[int, list[GroupScored]]
    alarms: list[dict[str, Any]] = field(default_factory=list)


def _log_of(run_or_dir: Any) -> Path:
    if run_or_dir is None:
        from grpo_magic.training.run import last_run  # noqa: PLC0415 - only the default needs the runner

        run = last_run()
        if run is None:
            raise GRPOMagicError("No run to rescore in this session; pass a run's output folder (its --project-name) "
                                 "or a run object.")
        run_or_dir = run.output_dir
    path = run_log_path(getattr(run_or_dir, "output_dir", run_or_dir))
    if not path.is_file():
        where = "does not exist" if not path.parent.exists() else f"has no run log ({RUN_LOG_NAME})"
        raise GRPOMagicError(f"Cannot rescore {path.parent}: that folder {where}; pass the output folder of a run "
                             "(its --project-name), where grpo_magic writes events.jsonl.")
    return path


def read_logged_run(path: Path) -> LoggedRun:
    """The run's last params and, per step, its groups of the latest attempt (a resumed run redoes steps)."""
    params: dict[str, Any] = {}
    env_name = ""
    groups: dict[int, dict[int, GroupScored]] = {}
    alarms: list[AlarmRaised] = []
    rewind = False
    for event in read_run_log(path):
        if isinstance(event, RunStarted):
            params, env_name, rewind = event.params, event.env_name, True
        elif isinstance(event, GroupScored):
            if rewind:
                for old in [s for s in groups if s >= event.step]:
                    del groups[old]
                alarms = [a for a in alarms if a.step < event.step]  # a resumed run judges those steps again
                rewind = False
            groups.setdefault(event.step, {})[event.group] = event
        elif isinstance(event, AlarmRaised):
            alarms.append(event)
    return LoggedRun(path, params, env_name,
                     {s: [g[k] for k in sorted(g)] for s, g in sorted(groups.items())},
                     [{"kind": a.kind, "step": a.step, "message": a.message, "evidence": a.evidence} for a in alarms])


def alarm_lines(alarms: list[dict[str, Any]]) -> list[str]:
    """One line per alarm: ``ALARM (divergence) at step 11: The reward rose ...``."""
    return [f"ALARM ({a['kind']}) at step {a['step']}: {a['message']}" for a in alarms]


def parse_steps(steps: Any) -> tuple[int | None, int | None]:
    """``"A:B"`` (both ends included, either may be left out), ``"N"``, an int, a pair or a range."""
    if steps is None:
        return None, None
    if isinstance(steps, range):
        return steps.start, steps.stop - 1
    if isinstance(steps, int) and not isinstance(steps, bool):
        return steps, steps
    if isinstance(steps, (tuple, list)) and len(steps) == 2:
        return steps[0], steps[1]
    text = str(steps).strip()
    first, sep, last = text.partition(":")
    try:
        a = int(first) if first.strip() else None
        b = (int(last) if last.strip() else None) if sep else a
    except ValueError:
        raise GRPOMagicError(f"--steps {text!r} is not a step range; write A:B (both included), A:, :B or N, "
                             "e.g. --steps 3:5.") from None
    return a, b


def select_steps(logged: LoggedRun, steps: Any) -> dict[int, list[GroupScored]]:
    if not logged.groups:
        raise GRPOMagicError(f"The run log {logged.path} has no scored groups yet; rescore it once training has "
                             "logged a step.")
    a, b = parse_steps(steps)
    chosen = {s: g for s, g in logged.groups.items() if (a is None or s >= a) and (b is None or s <= b)}
    if not chosen:
        first, last = min(logged.groups), max(logged.groups)
        asked = f"{'' if a is None else a}:{'' if b is None else b}"
        raise GRPOMagicError(f"--steps {asked} is outside the steps this run logged ({first} to {last}); pass steps "
                             f"within {first}:{last}.")
    return chosen


# ---------------------------------------------------------------- the env and its arguments


def _spec(env: Any, params: dict[str, Any]) -> EnvSpec:
    """A registered name keeps its registration's config; a class gets the run's rl_env_config."""
    if env is None:
        raise GRPOMagicError("Rescoring needs the env to score with; pass env= (a registered name, a class or an "
                             "instance), or --env NAME.")
    if isinstance(env, EnvSpec):
        return env
    if isinstance(env, str):
        return get_env(env)
    if inspect.isclass(env):
        check_interface(env, env.__name__)
        raw = params.get("rl_env_config")
        config = json.loads(raw) if isinstance(raw, str) and raw.strip().startswith("{") else {}
        return EnvSpec(name=env.__name__, cls=env, config=config, module=env.__module__)
    check_interface(env, type(env).__name__)
    return EnvSpec(name=type(env).__name__, instance=env, module=type(env).__module__)


def _missing_columns(env: Any, groups: list[GroupScored]) -> tuple[list[str], list[str]]:
    """The required ``score_episode`` arguments the logged rows lack, and the columns they have."""
    have = sorted({"prompt", *(k for g in groups for k in g.columns)})
    _, _, required = episode_parameters(env)
    return [n for n in required if n not in have and n not in PROVIDED_KWARGS], have


def _rows_from_dataset(env: Any, tokenizer: Any) -> dict[str, dict[str, Any]]:
    """Old run logs have no rows: the new env's dataset, by prompt text, stands in for them."""
    dataset = build_and_check_dataset(env, tokenizer)
    rows: dict[str, dict[str, Any]] = {}
    for row in dataset:
        prompt = row["prompt"]
        extra = {k: v for k, v in row.items() if k != "prompt"}
        rows.setdefault(prompt_text(prompt), extra if isinstance(prompt, str) else {"prompt": prompt, **extra})
    return rows


def _tokenizer(log_dir: Path, params: dict[str, Any]) -> Any:
    """The run's tokenizer: saved with its weights (the folder or a checkpoint), else its model's; None if neither loads."""
    from grpo_magic.models import load_tokenizer, resolve_model

    saved = [log_dir, *sorted(log_dir.glob("checkpoint-*"), key=lambda p: p.name, reverse=True)]
    for folder in saved:
        if (folder / "tokenizer_config.json").is_file():
            try:
                return load_tokenizer(str(folder))
            except GRPOMagicError:
                continue
    try:
        return load_tokenizer(resolve_model(params.get("model") or "tiny"))
    except GRPOMagicError:
        return None


# ---------------------------------------------------------------- TRL's advantages


def advantage_settings(params: dict[str, Any]) -> dict[str, Any]:
    """What TRL's advantage formula used in that run: its GRPOConfig's ``scale_rewards``,
    ``multi_objective_aggregation`` and reward weight.

    They are what the run's params passed to ``GRPOConfig`` (``GRPOParams.grpo_config_kwargs``),
    else ``GRPOConfig``'s defaults (today ``GRPOParams`` sets none of them: "group",
    "sum_then_normalize", weight 1). The config itself is never built: building a
    ``TrainingArguments`` resets accelerate's state under a run training in this process.
    """
    import dataclasses

    from trl import GRPOConfig

    names = ("scale_rewards", "multi_objective_aggregation", "reward_weights")
    values = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in names}
    try:
        known = {f.name for f in GRPOParams.fields()} | {"trl_settings"}
        run_params = GRPOParams(**{k: v for k, v in params.items() if k in known})
        kwargs = run_params.grpo_config_kwargs(str(run_params.project_name))
    except Exception:  # noqa: BLE001 - params this version cannot read: the defaults, the same in practice
        kwargs = {}
    values.update({k: kwargs[k] for k in names if k in kwargs})
    weights = values.pop("reward_weights") or [1.0]
    return {**values, "reward_weight": float(weights[0])}


def ranks(scores: list[float | None]) -> list[int]:
    """Each completion's place in its group: how many others scored strictly higher (failed ones come last)."""
    valid = [s for s in scores if s is not None]
    return [len(valid) if s is None else sum(v > s + SCORE_EPS for v in valid) for s in scores]


def _differs(a: float | None, b: float | None) -> bool:
    return (a is None) != (b is None) or (a is not None and b is not None and abs(a - b) > SCORE_EPS)


# ---------------------------------------------------------------- rescoring


def rescore(
    run_or_dir: Any = None,
    env: Any = None,
    *,
    steps: Any = None,
    workers: int | None = None,
    model: Any = None,
    tokenizer: Any = None,
) -> RescoreReport:
    """Score the completions of a run log with ``env`` as it is now, without generating anything.

    ``run_or_dir``: a run, its output folder, or its ``events.jsonl`` (default: this session's last
    run). ``env``: a registered env's name, a class (built with the run's ``rl_env_config``) or an
    instance. ``steps``: ``"A:B"`` (both included), ``"A:"``, ``":B"``, ``N`` or a range. ``workers``
    threads run sync episodes (default: the run's ``rl_env_workers``; async envs run concurrently).
    ``score_episode`` gets ``model`` (default None: nothing is generated; pass a model for an env that
    continues episodes) and the run's tokenizer. Bad input raises ``GRPOMagicError`` before any episode.
    """
    path = _log_of(run_or_dir)
    logged = read_logged_run(path)
    chosen = select_steps(logged, steps)
    spec = _spec(env, logged.params)
    env_obj = spec.instantiate()
    check_interface(env_obj, spec.name)
    groups = [g for gs in chosen.values() for g in gs]
    missing, have = _missing_columns(env_obj, groups)
    logged_rows = any(g.columns for g in logged.groups[max(logged.groups)])
    if missing and logged_rows:
        raise GRPOMagicError(
            f"{type(env_obj).__name__}.score_episode needs {missing[0]!r}, but the rows this run logged have no such "
            f"column (they have {', '.join(have)}); give it a default, or rescore a run of an env with that column."
        )
    tok = tokenizer if tokenizer is not None else _tokenizer(path.parent, logged.params)
    rows: dict[str, dict[str, Any]] | None = None
    if missing:  # a run log without rows (written before they were logged): the new env's dataset, by prompt
        rows = _rows_from_dataset(env_obj, tok)
        unknown = sum(g.prompt not in rows for g in groups)
        columns = sorted({"prompt", *(k for r in rows.values() for k in r)})
        if unknown or any(n not in columns for n in missing):
            raise GRPOMagicError(
                f"{type(env_obj).__name__}.score_episode needs {missing[0]!r}, but the rows this run logged have no "
                f"such column (they have {', '.join(have)}) and {unknown} of its {len(groups)} prompts are not in "
                "the env's dataset; give it a default, or rescore a run of an env with that column."
            )
    if isinstance(model, str):  # in the run's precision, on the device a run would use (the GPU when there)
        from grpo_magic.models import load_model, resolve_model
        from grpo_magic.runtime.device import place_model

        model = place_model(load_model(resolve_model(model), tokenizer=tok))
    settings = advantage_settings(logged.params)
    run_workers = logged.params.get("rl_env_workers") or 1
    reward = EnvReward(env_obj, workers=int(workers or run_workers), timeout=logged.params.get("rl_episode_timeout"),
                       max_error_rate=1.0)
    reward.bind(model, tok)
    agent = agent_spec(env_obj, spec.fresh_env, check_tools(env_obj)) if is_agent_env(env_obj) else None
    started = time.perf_counter()
    try:
        outcomes = _score(reward, groups, rows, agent)
    finally:
        reward.close()
    elapsed = time.perf_counter() - started
    rescored = _rescored_groups(chosen, outcomes, settings)
    return RescoreReport(run_log=str(path), env_name=spec.name, groups=rescored,
                         summary=summarize(rescored, elapsed), settings=settings, alarms=logged.alarms)


def _score(reward: EnvReward, groups: list[GroupScored], rows: dict[str, dict[str, Any]] | None,
           agent: Any = None) -> dict[int, list]:
    """Every logged completion through the reward adapter, whole groups per call, as TRL calls it.

    An agent env's episodes are replayed from their transcripts (``replay_episode``) on fresh instances,
    which ``score_episode`` then runs on, as in training.
    """
    outcomes: dict[int, list] = {}
    chunk: list[tuple[int, GroupScored]] = []
    size = max(CHUNK_COMPLETIONS, reward.runner.workers)

    def flush() -> None:
        prompts, completions, row_list, episodes = [], [], [], []
        for _, g in chunk:
            row = g.columns if rows is None else rows.get(g.prompt, {})
            for i, c in enumerate(g.completions):
                prompts.append(row.get("prompt", g.prompt))
                row_list.append({k: v for k, v in row.items() if k != "prompt"})
                if agent is None:
                    completions.append(c)
                    continue
                turns = g.transcripts[i] if i < len(g.transcripts) else [{"role": "assistant", "content": c}]
                episodes.append(replay_episode(agent, {"prompt": prompts[-1], **row_list[-1]}, turns))
                completions.append(trl_messages(turns))
        names = sorted({k for r in row_list for k in r})
        extra = {"environments": episodes} if agent is not None else {}
        batch = reward.score(prompts, completions, **{k: [r.get(k) for r in row_list] for k in names}, **extra).outcomes
        at = 0
        for key, g in chunk:
            outcomes[key] = batch[at: at + len(g.completions)]
            at += len(g.completions)
        chunk.clear()

    count = 0
    for key, g in enumerate(groups):
        chunk.append((key, g))
        count += len(g.completions)
        if count >= size:
            flush()
            count = 0
    if chunk:
        flush()
    return outcomes


def _rescored_groups(chosen: dict[int, list[GroupScored]], outcomes: dict[int, list],
                     settings: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    key = 0
    for step_groups in chosen.values():
        new_scores = [[o.score for o in outcomes[key + i]] for i in range(len(step_groups))]
        advantages = trl_advantages(new_scores, settings)  # one step is one generation batch in TRL
        for i, g in enumerate(step_groups):
            results = outcomes[key + i]
            old, new = list(g.scores), new_scores[i]
            out.append({
                "step": g.step, "group": g.group, "prompt": g.prompt, "completions": list(g.completions),
                "old_scores": old, "new_scores": new, "old_advantages": list(g.advantages),
                "new_advantages": advantages[i], "errors": [o.error for o in results],
                "old_components": list(g.components),
                "new_components": [o.components for o in results] if any(o.components for o in results) else [],
                "warnings": [o.warnings for o in results] if any(o.warnings for o in results) else [],
                "rank_changes": sum(a != b for a, b in zip(ranks(old), ranks(new), strict=True)),
                # per completion: did its score change (a new error counts as a change)?
                "changed": [_differs(a, b) for a, b in zip(old, new, strict=True)],
            })
        key += len(step_groups)
    return out


def _zero_variance(scores: list[float | None]) -> bool:
    valid = [s for s in scores if s is not None]
    return bool(valid) and max(valid) - min(valid) < SCORE_EPS


def _mean(values: list[float | None]) -> float | None:
    valid = [v for v in values if v is not None]
    return sum(valid) / len(valid) if valid else None


def summarize(groups: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    """Mean reward old/new, zero-variance share old/new, rank changes, changed scores, errors, throughput."""
    n = sum(len(g["completions"]) for g in groups)
    components: dict[str, list[float]] = {}
    for g in groups:
        for c, s in zip(g["new_components"] or [{}] * len(g["completions"]), g["new_scores"], strict=True):
            if s is not None:
                for name, value in c.items():
                    components.setdefault(name, []).append(value)
    steps = sorted({g["step"] for g in groups})
    return {
        "steps": f"{steps[0]}:{steps[-1]}" if steps else "",
        "groups": len(groups),
        "completions": n,
        "mean_old": _mean([s for g in groups for s in g["old_scores"]]),
        "mean_new": _mean([s for g in groups for s in g["new_scores"]]),
        "zero_variance_old": sum(_zero_variance(g["old_scores"]) for g in groups) / len(groups) if groups else 0.0,
        "zero_variance_new": sum(_zero_variance(g["new_scores"]) for g in groups) / len(groups) if groups else 0.0,
        "rank_changes": sum(g["rank_changes"] for g in groups),
        "groups_reranked": sum(g["rank_changes"] > 0 for g in groups),
        "changed_scores": sum(sum(g["changed"]) for g in groups),
        "errors": sum(e is not None for g in groups for e in g["errors"]),
        "components_new": {k: sum(v) / len(v) for k, v in components.items()},
        "seconds": round(elapsed, 4),
        "completions_per_s": round(n / elapsed, 1) if elapsed > 0 else None,
    }


# ---------------------------------------------------------------- HTML


def _fmt(value: float | None, fmt: str = ".3f") -> str:
    return "–" if value is None else format(value, fmt)


def _components(parts: dict[str, float], before: dict[str, float]) -> str:
    cells = []
    for name in dict.fromkeys([*before, *parts]):
        now, old = parts.get(name), before.get(name)
        text = html.escape(f"{name} {_fmt(now, '.2f')}")
        cells.append(f"<b>{html.escape(name)} {_fmt(old, '.2f')}→{_fmt(now, '.2f')}</b>" if before and _differs(old, now)
                     else text)
    return " · ".join(cells)


def _group_html(g: dict[str, Any]) -> str:
    rows = []
    changed, old_scores, new_scores = g["changed"], g["old_scores"], g["new_scores"]
    old_adv, new_adv, reranked = g["old_advantages"], g["new_advantages"], g["rank_changes"]
    for i, text in enumerate(g["completions"]):
        hot = "background:rgba(250,204,21,.35);font-weight:bold" if changed[i] else ""
        error = g["errors"][i]
        new = f"error: {html.escape(error.get('kind', ''))}" if error else _fmt(new_scores[i])
        title = f" title='{html.escape(error.get('message', ''), quote=True)}'" if error else ""
        parts = _components(g["new_components"][i] if i < len(g["new_components"]) else {},
                            g["old_components"][i] if i < len(g["old_components"]) else {})
        snippet = html.escape(text[:400] + ("…" if len(text) > 400 else ""))
        rows.append(
            f"<tr><td>#{i}</td><td>{_fmt(old_scores[i])}</td><td style='{hot}'{title}>{new}</td>"
            f"<td>{_fmt(old_adv[i] if i < len(old_adv) else None, '+.2f')}</td>"
            f"<td>{_fmt(new_adv[i], '+.2f')}</td><td style='font-size:11px'>{parts}</td>"
            f"<td><pre style='white-space:pre-wrap;margin:0;max-height:6em;overflow:auto'>{snippet}</pre></td></tr>"
        )
    rerank = f" · <b style='color:#b35900'>{reranked} completions changed rank</b>" if reranked else ""
    prompt = html.escape(g["prompt"][:300] + ("…" if len(g["prompt"]) > 300 else ""))
    return (
        f"<details class='grpo-rescore-group' {'open' if reranked else ''}><summary>step {g['step']} · group "
        f"{g['group']}{rerank} · mean {_fmt(_mean(old_scores))} → {_fmt(_mean(new_scores))}</summary>"
        f"<div style='opacity:.8;font-size:12px'>{prompt}</div>"
        "<table style='font-size:12px'><tr><th></th><th>old score</th><th>new score</th><th>old A</th><th>new A</th>"
        f"<th>components</th><th>completion</th></tr>{''.join(rows)}</table></details>"
    )


def report_html(report: RescoreReport) -> str:
    """The summary, then the groups whose ranking changed first; changed scores are highlighted."""
    s = report.summary
    ordered = sorted(report.groups, key=lambda g: (-g["rank_changes"], -sum(g["changed"]), g["step"], g["group"]))
    shown = ordered[:MAX_HTML_GROUPS]
    more = (f"<div>… {len(ordered) - len(shown)} more groups in <code>report.groups</code></div>"
            if len(ordered) > len(shown) else "")
    parts = " · ".join(f"{html.escape(k)} {v:.2f}" for k, v in s["components_new"].items())
    lines = [
        ("mean reward", f"{_fmt(s['mean_old'])} → {_fmt(s['mean_new'])}"),
        ("zero-variance groups", f"{s['zero_variance_old']:.0%} → {s['zero_variance_new']:.0%}"),
        ("rank changes", f"{s['rank_changes']} completions in {s['groups_reranked']} of {s['groups']} groups"),
        ("changed scores", f"{s['changed_scores']} of {s['completions']} completions"),
        ("episode errors", str(s["errors"])),
        ("advantages", f"TRL's formula, scale_rewards {report.settings.get('scale_rewards')!r}"),
    ] + ([("components (new)", parts)] if parts else [])
    lines += [(f"alarm ({a['kind']})", f"step {a['step']}: {html.escape(a['message'])}") for a in report.alarms]
    table = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th><td>{v}</td></tr>"
                    for k, v in lines)
    return (
        f"<div class='grpo-rescore'><div><b>grpo rescore</b>: {html.escape(report.env_name)} on steps {s['steps']} of "
        f"<code>{html.escape(report.run_log)}</code> ({s['completions']} completions in {s['seconds']:.2f} s)</div>"
        f"<table>{table}</table>{''.join(_group_html(g) for g in shown)}{more}</div>"
    )
