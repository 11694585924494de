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
from collections import Counter
from dataclasses import dataclass
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.agent import fits_schema, not_offered_calls, tool_calls_of, unparsed_calls
from grpo_magic.environment.reward import EnvReward
from grpo_magic.environment.scores import EpisodeOutcome
from grpo_magic.errors import GRPOMagicError
from grpo_magic.trl_compat import call_reward


@dataclass
class AgentEpisodes:
    """What one batch of agent episodes gave: per group, texts, outcomes, transcripts and truncation."""

    texts: list[list[str]]
    outcomes: list[EpisodeOutcome]
    transcripts: list[list[dict[str, Any]]]
    truncated: list[list[bool]]


def run_agent_episodes(params: GRPOParams, prepared: Any, model: Any, tokenizer: Any, reward: EnvReward,
                       rows: list[dict[str, Any]], config_overrides: dict[str, Any] | None = None,
                       per_row: int | None = None) -> AgentEpisodes:
    """``num_generations`` episodes of each row, run by TRL's tool loop with the policy ``model``.

    ``reward`` is built with the env's agent spec (``EnvReward(agent=...)``), which the trainer hands to TRL.
    ``config_overrides``: more GRPOConfig settings (``evaluate``'s greedy episodes turn ``do_sample`` off).
    ``per_row``: episodes of each row when TRL's groups do not matter (their advantages are not read): one greedy
    episode a row, TRL pairing the rows into its groups of two, instead of two identical episodes a row. The rows'
    episodes must fill whole groups.
    """
    from grpo_magic.training.trainer import build_trainer, rollouts

    refuse_while_training()

    n = params.rl_num_generations if per_row is None else per_row
    if (len(rows) * n) % params.rl_num_generations:
        raise ValueError(f"{len(rows)} rows of {n} episodes do not fill groups of {params.rl_num_generations}")
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
    from grpo_magic.training.run import active_run

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
    record = call_reward(reward.score, prompts, completions, environments=environments, **columns)
    return list(record.outcomes)


def agent_stats(transcripts: list[list[dict[str, Any]]], offered: list[str] | None = None,
                schemas: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Tool use of the sampled episodes: who called a tool, how many calls failed, how many turns.

    With the offered tools' ``schemas``, ``typed_call_share``: the share of episodes whose first call is to an
    offered tool with arguments of its schema's types (``agent.fits_schema``), the call the tool can take.

    And what the episodes that called no offered tool did instead (``offered_call_share`` is the
    share that did): called tools not offered (``not_offered_calls``, by name in ``not_offered_names``,
    with TRL's answer in ``not_offered_error``), wrote a call that did not parse (``unparsed_calls``),
    or wrote text only (``text_only``). An episode called an offered tool when one answered it, or when
    it called one of ``offered`` by name and the completion budget ended the episode before TRL ran it.
    """
    episodes = len(transcripts) or 1
    calls = [sum(len(t.get("tool_calls") or []) for t in turns) for turns in transcripts]
    failures = sum(1 for turns in transcripts for t in turns if t.get("role") == "tool" and t.get("error"))
    turns = [sum(1 for t in ts if t.get("role") == "assistant") for ts in transcripts]
    missing = [not_offered_calls(ts) for ts in transcripts]
    names = set(offered or ())
    called_offered = [any(t.get("role") == "tool" and not t.get("not_offered") for t in ts)
                      or any(c["name"] in names for c in tool_calls_of(ts)) for ts in transcripts]
    unparsed = [unparsed_calls(ts) for ts in transcripts]
    errors = [t["content"] for ts in transcripts for t in ts if t.get("role") == "tool" and t.get("not_offered")]
    typed: dict[str, Any] = {}
    if schemas is not None:
        by_name = {s.get("function", s).get("name"): s for s in schemas}
        firsts = [next(iter(tool_calls_of(ts)), None) for ts in transcripts]
        typed["typed_call_share"] = sum(1 for c in firsts if c is not None and c["name"] in by_name
                                        and fits_schema(c["arguments"], by_name[c["name"]])) / episodes
    return {
        "offered_call_share": sum(called_offered) / episodes,
        "not_offered_calls": float(sum(len(m) for m in missing)),
        "not_offered_names": dict(Counter(n for m in missing for n in m).most_common()),
        "not_offered_error": errors[0] if errors else "",
        "unparsed_calls": float(sum(unparsed)),
        "text_only": float(sum(1 for c, u in zip(calls, unparsed, strict=True) if not c and not u)),
        "episodes": float(len(transcripts)),
        "tool_call_share": sum(1 for c in calls if c) / episodes,
        "tool_calls": float(sum(calls)),
        "tool_failures": float(failures),
        "tool_failure_share": failures / sum(calls) if sum(calls) else 0.0,
        "turns_mean": statistics.fmean(turns) if turns else 0.0,
        "turns_max": float(max(turns, default=0)),
        **typed,
    }


def why_no_tool_call(stats: dict[str, Any], offered: list[str], model: str = "",
                     uncopied: list[str] | None = None, named: bool | None = None) -> str | None:
    """One sentence when no sampled episode called an offered tool: what the model did instead, and what to try.

    For tiny-agent, which calls only what a request spells out (README, "What tiny-agent can and cannot call"):
    ``uncopied``, the offered arguments whose values it cannot copy (``uncopyable_arguments``); ``named``, whether
    any sampled prompt names an offered tool in quotes (``names_a_tool``), False when none does."""
    if stats["offered_call_share"] > 0:
        return None
    did = []
    if stats["text_only"]:
        did.append(f"{_count(stats['text_only'], 'episode')} wrote text only")
    if stats["not_offered_calls"]:
        names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in stats["not_offered_names"].items())
        did.append(f"{_count(stats['not_offered_calls'], 'call')} went to tools that were not offered ({names}; TRL "
                   f"answered {stats['not_offered_error']})")
    if stats["unparsed_calls"]:
        did.append(f"{_count(stats['unparsed_calls'], 'tool call')} did not parse")
    if model == "tiny-agent":  # the offline tool caller copies what the request and the schemas spell out
        fix = ('tiny-agent only calls a tool whose name the request gives in quotes, each argument as `name value` '
               '(Use the "weigh_parcel" tool with grams 41; README, "What tiny-agent can and cannot call")')
        if named is False:
            fix += f", and none of these prompts names {' or '.join(repr(n) for n in offered)} in quotes"
        if uncopied:
            fix += (f", and it cannot copy the values of arguments whose name is one word in its vocabulary "
                    f"({', '.join(uncopied)}): rename them (e.g. grams, minutes, owner)")
        fix += "; or try a model trained on tool calls (e.g. Qwen/Qwen2.5-0.5B-Instruct on a GPU)"
    else:
        fix = ("use a model whose chat template and training know tool calls (e.g. --model tiny-agent offline, "
               "Qwen/Qwen2.5-0.5B-Instruct on a GPU)")
    return (f"no episode called an offered tool ({', '.join(offered)}) in {int(stats['episodes'])} episodes: "
            f"{'; '.join(did) or 'none wrote anything'}; GRPO can only reinforce calls the model already makes: "
            f"{fix}, or warm it up with supervised examples of tool calls.")


def names_a_tool(prompts: list[str], offered: list[str]) -> bool:
    """Whether any of ``prompts`` names an offered tool in quotes, the one way tiny-agent knows which to call."""
    return any(f"{q}{name}{q}" in p for p in prompts for name in offered for q in ('"', "'"))


def uncopyable_arguments(schemas: list[dict[str, Any]], tokenizer: Any) -> list[str]:
    """The offered argument names whose values tiny-agent cannot copy from a request.

    Why: its copy circuit (research/tiny_agent/copy_circuit.py) finds a value in the request by the argument name's last two
    tokens, and a name the vocabulary spells differently after a space and after the call's ``"`` (``a`` and
    `` a``, ``city`` and `` city``: one token each, and not the same one) has none in common."""
    names = []
    for schema in schemas:
        for name in schema.get("function", {}).get("parameters", {}).get("properties", {}):
            in_call, in_request = tokenizer.tokenize(name), tokenizer.tokenize(" " + name)
            if len(in_call) < 2 or in_call[-2:] != in_request[-2:]:
                names.append(name)
    return names


def _count(n: float, noun: str) -> str:
    return f"{int(n)} {noun}{'' if int(n) == 1 else 's'}"
