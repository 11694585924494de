"""TRL in one room (grpo_magic/trl_compat.py), held to real GRPOTrainer steps on ``tiny``.

What grpo_magic reads of TRL beyond its public API is read here from real batches of the installed
TRL: the keys of what ``_generate_and_score_completions`` returns, the keyword arguments TRL passes
a reward function, and the advantages TRL trains on, which re-scoring recomputes
(``trl_compat.trl_advantages``) for every ``scale_rewards`` x ``multi_objective_aggregation`` of the
installed ``GRPOConfig``.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import zlib
from typing import Any

import pytest

from envs.letters import LettersEnv
from grpo_magic import GRPOParams
from grpo_magic.errors import GRPOMagicError
from grpo_magic.trl_compat import BATCH_KEYS, REWARD_KWARGS, TRL_RANGE, check_batch

PARAMS = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, rl_kl_coef=0.0, seed=0)


class MixedEnv(LettersEnv):
    """Scores that differ within and between groups, one group of equal scores, and failed episodes:
    every branch of TRL's advantage arithmetic (NaN rewards, zero std) gets exercised."""

    def __init__(self) -> None:
        super().__init__()
        self.episodes = 0

    def build_dataset(self, tokenizer):
        ds = super().build_dataset(tokenizer)
        return ds.add_column("equal", [i % 4 == 1 for i in range(len(ds))])

    def score_episode(self, model, tokenizer, completion: str, letter: str, equal: bool) -> float:
        self.episodes += 1
        if equal:
            return 0.5
        if self.episodes % 5 == 0:
            raise ValueError("a failed episode: TRL's NaN reward")
        return (zlib.crc32(completion.encode()) % 9) / 8


def _trainer(tmp_path, env: Any, on_scored=None, **config: Any):
    from grpo_magic.environment.env import EnvSpec, prepare_env
    from grpo_magic.environment.reward import EnvReward
    from grpo_magic.models import load_model, load_tokenizer, resolve_model
    from grpo_magic.training.trainer import build_trainer

    path = resolve_model("tiny")
    tokenizer = load_tokenizer(path)
    prepared = prepare_env(EnvSpec(name=type(env).__name__, instance=env), tokenizer)
    params = GRPOParams(**PARAMS)
    reward = EnvReward(prepared.env, agent=prepared.agent, defer_failure=True)
    out = tmp_path / "-".join(str(v) for v in config.values()) if config else tmp_path / "run"
    trainer = build_trainer(
        model=load_model(path, tokenizer=tokenizer),
        tokenizer=tokenizer,
        reward=reward,
        config=params.to_grpo_config(str(out), report_to=[], save_strategy="no", logging_steps=1, **config),
        dataset=prepared.dataset,
        on_scored=on_scored,
    )
    return trainer, prepared


def _choices(field: str) -> list[str]:
    """The values the installed GRPOConfig documents for a field (TRL writes them in its help text)."""
    from trl import GRPOConfig

    (f,) = [f for f in dataclasses.fields(GRPOConfig) if f.name == field]
    return list(dict.fromkeys(re.findall(r"`'?([a-z_]+)'`", f.metadata["help"])))


def test_the_batch_trl_scores_has_the_keys_grpo_magic_reads(tmp_path):
    from grpo_magic.training.trainer import rollouts

    trainer, prepared = _trainer(tmp_path, MixedEnv())
    inputs = [prepared.dataset[i] for i in range(2) for _ in range(4)]
    output = trainer._generate_and_score_completions(inputs)  # TRL's own, on a real batch
    assert set(BATCH_KEYS) <= set(output), sorted(output)
    check_batch(output)
    record, batch = rollouts(trainer, inputs)  # what grpo_magic reads of it
    assert len(batch.advantages) == len(batch.completion_ids) == len(record.outcomes) == 8
    assert all(isinstance(ids, list) and all(isinstance(t, int) for t in ids) for ids in batch.completion_ids)
    assert record.completions == [
        trainer.processing_class.decode(ids, skip_special_tokens=True) for ids in batch.completion_ids
    ]
    doctored = {k: v for k, v in output.items() if k != "completion_mask"}
    with pytest.raises(GRPOMagicError) as info:
        check_batch(doctored, "9.0.0")
    message = str(info.value)
    assert message.startswith(
        "The installed TRL 9.0.0's GRPOTrainer._generate_and_score_completions returned no "
        "'completion_mask' (it returned "
    )
    assert message.endswith(f"pip install 'trl{TRL_RANGE}'.") and "\n" not in message


def test_the_reward_keyword_arguments_are_the_ones_trl_passes(tmp_path):
    seen: list[set[str]] = []

    class Recording(MixedEnv):
        def score_completions(self, model, tokenizer, prompts, completions, **kwargs):
            seen.append(set(kwargs))
            return [0.5] * len(completions)

    trainer, _ = _trainer(tmp_path, Recording(), max_steps=1)
    trainer.train()
    columns = {"letter", "equal"}
    assert seen and seen[0] - columns == set(REWARD_KWARGS) - {"environments"}  # not an agent env


COMBINATIONS = [
    (s, m) for s, m in itertools.product(_choices("scale_rewards"), _choices("multi_objective_aggregation"))
]


def test_the_combinations_are_the_installed_trl_s():
    assert {"group", "batch", "none"} <= {s for s, _ in COMBINATIONS}
    assert {"sum_then_normalize", "normalize_then_sum"} <= {m for _, m in COMBINATIONS}


@pytest.mark.parametrize(("scale_rewards", "aggregation"), COMBINATIONS)
def test_rescoring_advantages_are_the_ones_trl_trained_on(tmp_path, scale_rewards, aggregation):
    """Two real steps per combination: TRL's advantages of each batch (the tensor its loss used) against
    ``trl_advantages`` of the same scores, with the settings ``advantage_settings`` reads from a run."""
    from grpo_magic.trl_compat import trl_advantages

    batches: list[tuple[list[list[float | None]], list[float]]] = []

    def on_scored(payload, num_generations):
        for record, advantages in payload:
            scores = record.scores
            groups = [scores[i : i + num_generations] for i in range(0, len(scores), num_generations)]
            batches.append((groups, advantages))

    trainer, _ = _trainer(
        tmp_path,
        MixedEnv(),
        on_scored=on_scored,
        max_steps=2,
        scale_rewards=scale_rewards,
        multi_objective_aggregation=aggregation,
    )
    trainer.train()
    assert len(batches) == 2
    settings = {"scale_rewards": scale_rewards, "multi_objective_aggregation": aggregation, "reward_weight": 1.0}
    failed = equal = 0
    for groups, advantages in batches:
        ours = [a for g in trl_advantages(groups, settings) for a in g]
        assert ours == pytest.approx(advantages, rel=1e-4, abs=1e-4)
        failed += sum(s is None for g in groups for s in g)
        equal += sum(len({s for s in g if s is not None}) == 1 for g in groups)
    assert equal, "no group of equal scores: the zero-std branch went untested"
    assert failed, "no failed episode: the NaN branch went untested"
    assert any(a != 0 for _, adv in batches for a in adv)
