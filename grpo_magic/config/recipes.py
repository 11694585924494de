"""Recipes: the published GRPO variants, one word each, from TRL's own paper index.

Each recipe is the ``GRPOConfig`` of an entry of TRL's paper index (``docs/source/paper_index`` in the
repository huggingface/trl, read at commit 0fbbe3b2bb0bd98730d5d223495cd7cb627f253d), with the paper's link.
``settings`` are the algorithm's settings, which a recipe sets; ``scale`` are the paper's batch sizes
and lengths (the hardware it ran on), shown in the docs but not applied: 512 completions of 20480
tokens per device is not what a notebook run means by "DAPO". Explicit settings win over a recipe.
BNPO has no entry in TRL's paper index (TRL 1.16 has ``loss_type="bnpo"``): it is no recipe here,
``--loss-type bnpo`` sets it.

Plain data only: this module is imported by ``params`` and stays light (no trl).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Where the settings were read.
PAPER_INDEX = (
    "https://github.com/huggingface/trl/blob/0fbbe3b2bb0bd98730d5d223495cd7cb627f253d/docs/source/paper_index" + ".md"
)


@dataclass(frozen=True)
class Recipe:
    """One paper's GRPOConfig: what the algorithm sets, and the scale the paper ran at."""

    name: str
    title: str
    paper: str
    settings: dict[str, Any]
    scale: dict[str, Any] = field(default_factory=dict)
    note: str = ""


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "grpo",
            "GRPO as in DeepSeek-R1 (the paper index's DeepSeekMath entry)",
            "https://huggingface.co/papers/2402.03300",
            {"loss_type": "grpo", "beta": 0.001, "epsilon": 10.0},
            {
                "num_generations": 16,
                "max_completion_length": 32_768,
                "steps_per_generation": 16,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 128,
            },
            "hyperparameters of 'DeepSeek-R1 incentivizes reasoning in LLMs through reinforcement learning'",
        ),
        Recipe(
            "dr_grpo",
            "Dr. GRPO: Understanding R1-Zero-Like Training",
            "https://huggingface.co/papers/2503.20783",
            {"loss_type": "dr_grpo", "beta": 0.0},
            {"per_device_train_batch_size": 1, "num_generations": 8, "max_completion_length": 3000},
        ),
        Recipe(
            "dapo",
            "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
            "https://huggingface.co/papers/2503.14476",
            {
                "mask_truncated_completions": True,
                "loss_type": "dapo",
                "epsilon_high": 0.28,
                "epsilon": 0.2,
                "beta": 0.0,
            },
            {"per_device_train_batch_size": 512, "num_generations": 16, "max_completion_length": 20480},
            "the soft overlong punishment is a reward (trl.rewards.get_soft_overlong_punishment); dynamic sampling is not in TRL",
        ),
        Recipe(
            "gspo",
            "GSPO: Group Sequence Policy Optimization",
            "https://huggingface.co/papers/2507.18071",
            {
                "importance_sampling_level": "sequence",
                "loss_type": "grpo",
                "beta": 0.0,
                "epsilon": 3e-4,
                "epsilon_high": 4e-4,
                "gradient_accumulation_steps": 1,
                "steps_per_generation": 4,
            },
            note="only has an effect off-policy: steps_per_generation > gradient_accumulation_steps or num_iterations > 1",
        ),
        Recipe(
            "cispo",
            "CISPO, in ScaleRL: The Art of Scaling Reinforcement Learning",
            "https://huggingface.co/papers/2510.13786",
            {"loss_type": "cispo", "epsilon_high": 5.0, "scale_rewards": "batch", "cast_lm_head_to_fp32": True},
            {"num_generations": 16},
        ),
        Recipe(
            "lite_ppo",
            "Lite PPO: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
            "https://huggingface.co/papers/2508.08221",
            {
                "scale_rewards": "batch",
                "loss_type": "dapo",
                "beta": 0.0,
                "top_p": 0.99,
                "top_k": 100,
                "temperature": 0.99,
                "num_iterations": 1,
            },
            {
                "num_generations": 8,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 32,
                "steps_per_generation": 8,
            },
        ),
        Recipe(
            "sapo",
            "SAPO: Soft Adaptive Policy Optimization",
            "https://huggingface.co/papers/2511.20347",
            {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "scale_rewards": "group"},
        ),
    )
}

NAMES = tuple(RECIPES)


def unknown_recipe_message(name: str, flag: str = "--recipe") -> str:
    """One sentence for a recipe name that is not one, with the close names."""
    import difflib

    near = difflib.get_close_matches(str(name), NAMES, n=2, cutoff=0.4)
    hint = f"use {' or '.join(near)} (the closest names)." if near else "use one of them (or none)."
    return f"recipe ({flag}) must be one of {', '.join(NAMES)}, not {name!r}; {hint}"


def markdown_table() -> str:
    """The recipe table of the docs, generated from ``RECIPES`` (a test keeps the docs equal)."""
    rows = ["| recipe | paper | sets | the paper's scale (not applied) |", "|---|---|---|---|"]
    for r in RECIPES.values():
        sets = ", ".join(f"`{k}={v!r}`" for k, v in r.settings.items())
        scale = ", ".join(f"`{k}={v!r}`" for k, v in r.scale.items()) or "–"
        rows.append(f"| `{r.name}` | [{r.title}]({r.paper}) | {sets} | {scale} |")
    return "\n".join(rows)
