"""TRL's GRPOTrainer, configured and observed: the only module that touches the trainer.

We never re-implement generation, the loss or the advantages. A thin subclass reads the
advantages TRL computed for each generation batch (the ``advantages`` entry of what
``_generate_and_score_completions`` returns, the very tensor the loss uses), pairs them with the
reward adapter's record of that batch, and hands both to an ``on_scored`` hook; a
``TrainerCallback`` turns TRL's logs into step events and carries Stop requests in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .reward import BatchRecord, EnvErrorRateExceeded, EnvReward

#: (record, advantages) of each process, in process order.
ScoredHook = Callable[[list[tuple[BatchRecord, list[float]]], int], None]

_TRAINER_CLASS: type | None = None


def trainer_class() -> type:
    """The GRPOTrainer subclass, built on first use so that importing grpo_magic stays light."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    from accelerate.utils import gather_object
    from trl import GRPOTrainer

    class ObservedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that reports each scored batch with the advantages it trains on."""

        grpo_magic_reward: EnvReward | None = None
        grpo_magic_on_scored: ScoredHook | None = None

        def _generate_and_score_completions(self, inputs):  # noqa: D401 - TRL's hook point
            output = super()._generate_and_score_completions(inputs)
            reward, hook = self.grpo_magic_reward, self.grpo_magic_on_scored
            if reward is None or hook is None or not self.model.training:
                return output
            record, reward.last_batch = reward.last_batch, None
            # TRL computed the advantages over all processes' rewards and kept this process's slice,
            # in the order of its completions: the same order as this process's reward record.
            advantages = output["advantages"].detach().float().reshape(-1).cpu().tolist()
            payload = [(record, advantages)]
            if self.accelerator.num_processes > 1:
                # Every rank's groups in rank order; a group split across two ranks is whole again.
                payload = gather_object(payload)
            if self.accelerator.is_main_process:
                hook([p for p in payload if p[0] is not None], self.num_generations)
            failures = [p[0].failure for p in payload if p[0] is not None and p[0].failure]
            if failures:  # raised on every process at once, after the main one logged the step's groups
                raise EnvErrorRateExceeded(failures[0])
            return output

    _TRAINER_CLASS = ObservedGRPOTrainer
    return ObservedGRPOTrainer


def events_callback(
    *,
    on_log: Callable[[int, dict[str, Any], int, float | None, float], None],
    on_train_begin: Callable[[int], None],
    should_stop: Callable[[], bool],
):
    """A TrainerCallback that reports TRL's logs and stops training at the end of a step when asked."""
    from transformers import TrainerCallback

    class EventsCallback(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.monotonic()

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.monotonic()
            on_train_begin(state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            # The end-of-training summary (train_runtime...) is not a step.
            if not state.is_world_process_zero or not logs or "train_runtime" in logs:
                return
            on_log(state.global_step, dict(logs), state.max_steps, state.epoch, time.monotonic() - self.started)

        def on_step_end(self, args, state, control, **kwargs):
            stop = should_stop()
            if args.world_size > 1:  # every process stops at the same step, or the others wait forever
                from accelerate.utils import gather_object

                stop = any(gather_object([stop]))
            if stop:
                control.should_training_stop = True

    return EventsCallback()


def drop_console_callbacks(trainer: Any) -> None:
    """Remove Trainer's own printers: our event stream drives the dashboard and the terminal."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    try:
        from transformers.utils.notebook import NotebookProgressCallback

        trainer.remove_callback(NotebookProgressCallback)
    except ImportError:  # pragma: no cover - transformers without notebook support
        pass
