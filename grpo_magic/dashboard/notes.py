"""Notes next to the curves people puzzle over: why the loss sits at zero, what equal groups and cut-off
completions mean, and what to do.

Each note is a pure function of the view (``RunView``): the run's parameters (from ``RunStarted``)
and its recent metrics (from ``StepLogged``), so a replay of the run log shows the same notes as
the live dashboard. The wording follows TRL 1.16's ``GRPOTrainer._compute_loss`` (read there):
grpo_magic trains each generation batch once (TRL's ``num_iterations`` = 1), so the policy ratio is
exactly 1 when the loss is computed, and the loss is the advantage-weighted mean that the loss type
defines, plus ``beta`` x KL.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, NamedTuple

from .state import RunView

RECENT = 10  # steps a note looks back on
LOSS_NEAR_ZERO = 0.05  # mean |loss| below this is "near zero" (advantages are of order 1)
ZERO_STD_HIGH = 0.5  # at least half the groups with equal scores
CLIPPED_HIGH = 0.9  # at least 90% of completions cut off at the token limit

_LOSS_WHY = {
    "grpo": "'grpo' averages the tokens of each completion, then the completions: with the ratio at 1 the "
            "loss is −mean(A), and the advantages of every group sum to 0, so it is 0 up to rounding",
    "sapo": "'sapo' averages the tokens of each completion, then the completions: with the ratio at 1 its soft "
            "gate is constant, the loss is a constant times −mean(A), and the advantages of every group sum to 0",
    "dapo": "'dapo' averages over every token of the batch, so each completion weighs by its length: the loss "
            "is −Σ Aᵢ·|oᵢ| / Σ |oᵢ|, zero when completions are equally long, since a group's advantages sum to 0",
    "bnpo": "'bnpo' averages over every token of the batch, so each completion weighs by its length: the loss "
            "is −Σ Aᵢ·|oᵢ| / Σ |oᵢ|, zero when completions are equally long, since a group's advantages sum to 0",
    "dr_grpo": "'dr_grpo' sums the tokens and divides by a constant (completions × max length): the loss is "
               "−Σ Aᵢ·|oᵢ| / (B·L), zero when completions are equally long, since a group's advantages sum to 0",
    "cispo": "'cispo' weighs each token's log-probability by its advantage: near 0 means the better and the "
             "worse completions of each group are about as likely as each other",
}


class Note(NamedTuple):
    """A headline (shown next to the curve) and the explanation (one click away)."""

    headline: str
    text: str


def _recent(values: array, n: int = RECENT) -> list[float]:
    return [v for v in values[-n:] if not math.isnan(v)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _number(value: Any, default: float) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def loss_note(view: RunView) -> Note | None:
    """Why the loss sits near zero, for this run's loss type and KL coefficient."""
    losses = _recent(view.metrics["loss"])
    if len(losses) < 3 or _mean([abs(v) for v in losses]) >= LOSS_NEAR_ZERO:
        return None
    loss_type = str(view.params.get("rl_loss_type") or "dapo")
    beta = _number(view.params.get("rl_kl_coef"), 0.0)
    why = _LOSS_WHY.get(loss_type, f"with loss type '{loss_type}' the loss is an advantage-weighted mean, and "
                                   "the advantages of every group sum to 0")
    kl = _recent(view.metrics["kl"], 1)
    if beta:
        kl_text = (f" rl_kl_coef {beta:g} adds {beta:g} × KL to it" +
                   (f" ({beta * kl[0]:.2g} at the last step)" if kl else "") + ", which grows as the policy drifts.")
    else:
        kl_text = " rl_kl_coef is 0, so no KL term is added."
    return Note("loss ≈ 0 is expected here: why?", f"The loss sits near 0 (mean |loss| "
                f"{_mean([abs(v) for v in losses]):.2g} over the last {len(losses)} steps): that is expected and "
                "says nothing about learning. Each batch is trained on "
            f"once (TRL's num_iterations 1), so the policy ratio is 1 when the loss is computed, and {why}."
            f"{kl_text} Its gradient is not 0: it raises the tokens of completions with A > 0 and lowers the others. "
            "Judge progress by the reward curve.")


def zero_std_note(view: RunView) -> Note | None:
    """What a high share of equal-score groups means, and what to do about it."""
    shares = _recent(view.metrics["frac_reward_zero_std"], 5)
    if not shares or _mean(shares) < ZERO_STD_HIGH:
        return None
    share = _mean(shares)
    rewards = _recent(view.metrics["reward"], 5)
    reward = _mean(rewards) if rewards else None
    generations = view.params.get("rl_num_generations")
    temperature = view.params.get("rl_temperature")
    if reward is not None and reward >= 0.9:
        cause = "Most of them are all right: the prompts have become too easy (or the task is learned)."
    elif reward is not None and reward <= 0.1:
        cause = "Most of them are all wrong: the prompts are too hard for the model, or the reward never pays."
    else:
        cause = "The reward gives the same score to every completion of those prompts."
    fixes = "a graded reward (partial credit)"
    fixes += f", more generations per prompt (rl_num_generations, now {generations})" if generations else ""
    fixes += f", a higher temperature (now {temperature})" if temperature is not None else ""
    return Note(f"{share:.0%} of groups teach nothing: why, and what to do?",
                f"{share:.0%} of the groups of the last {len(shares)} steps had equal scores: their advantages are 0 "
            f"and they teach nothing, though they cost their generation time. {cause} Fixes: {fixes}, or prompts "
            "of the right difficulty (%grpo_check measures it before training).")


def clipped_note(view: RunView) -> Note | None:
    """What a share of cut-off completions near 1 means."""
    shares = _recent(view.metrics["completions/clipped_ratio"], 5)
    if not shares or _mean(shares) < CLIPPED_HIGH:
        return None
    limit = view.params.get("rl_max_new_tokens")
    limit_text = f" ({limit})" if limit else ""
    return Note(f"{_mean(shares):.0%} of completions cut off: what it means?",
                f"{_mean(shares):.0%} of the completions of the last {len(shares)} steps reached the token limit"
            f"{limit_text} without ending: the env scores cut-off text, and TRL still trains on it (its "
            "mask_truncated_completions is off). Raise rl_max_new_tokens if answers need more room, or reward "
            "ending on time; a model that never learned to stop (like the random tiny) is cut off every time.")


def notes(view: RunView) -> dict[str, Note]:
    """The notes that apply now, by panel key (see ``panels.PANELS``)."""
    found = {"loss": loss_note(view), "zero_std": zero_std_note(view), "length": clipped_note(view)}
    return {key: text for key, text in found.items() if text}
