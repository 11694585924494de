"""The TRL adapter: builds the observed GRPOTrainer of a run, its callbacks and its episode generator.

We never re-implement generation, the loss or the advantages. The trainer subclass of
``trl_compat`` (the one module that touches TRL's internals, docs/architecture.md, "TRL") shows a
``StepObserver`` each batch's advantages as TRL computed them; the reward's record of that batch
comes to the observer explicitly (``StepRecords``: TRL's reward function of the run, which hands
each call's record over), and the observer hands both to an ``on_scored`` hook. A
``TrainerCallback`` turns TRL's logs into step events and carries Stop requests in (a stop is saved
as a complete checkpoint by Trainer itself, ``control.should_save``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_magic.environment.generation import EpisodeGenerator, HFGenerator, VLLMColocateGenerator, VLLMServerGenerator
from grpo_magic.environment.reward import BatchRecord, EnvErrorRateExceeded, EnvReward, error_rate_failure
from grpo_magic.trl_compat import (
    BatchObserver,
    ScoredBatch,
    construction_warnings_ignored,
    generate_and_score,
    quiet_library_logs,
    save_checkpoint,
    skip_flos_sum,
    trainer_class,
    vllm_engine,
)

__all__ = ["StepObserver", "StepRecords", "build_trainer", "events_callback", "generator_for_trainer", "report_after_events",
           "rollouts", "save_abandoned", "trainer_class", "vllm_engine"]

#: (record, advantages) of each process, in process order.
ScoredHook = Callable[[list[tuple[BatchRecord, list[float]]], int], None]
#: (step, TRL's eval metrics, the eval batches' records of every process, seconds TRL's eval loop took).
EvalHook = Callable[[int, dict[str, Any], list[BatchRecord], float], None]

_log = logging.getLogger(__name__)


class StepRecords:
    """The reward function TRL calls in a run: the reward's scores go to TRL, its record of the batch here.

    TRL calls it once per generation batch; the observer takes that batch's record once TRL has
    computed the advantages (``take``), so each record is handed from the reward to the trainer by
    this one object, never left on the reward for another module to find.
    """

    def __init__(self, reward: EnvReward) -> None:
        self.reward = reward
        self.__name__ = reward.__name__  # TRL names its metrics after it: rewards/env/mean
        self._records: list[BatchRecord] = []

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        record = self.reward.score(prompts, completions, **kwargs)
        self._records.append(record)
        return record.scores

    def take(self) -> BatchRecord | None:
        """The record of the batch TRL scored last (None if the reward was not called since)."""
        records, self._records = self._records, []
        return records[-1] if records else None


class StepObserver(BatchObserver):
    """Pairs each training batch's record with TRL's advantages, reports it, and applies the failure policy."""

    def __init__(self, reward: EnvReward, records: StepRecords, on_scored: ScoredHook | None,
                 on_eval: EvalHook | None = None) -> None:
        self.reward, self.records, self.on_scored, self.on_eval = reward, records, on_scored, on_eval
        self.eval_records: list[BatchRecord] | None = None  # a list only while TRL's eval loop runs

    def before_batch(self, step: int) -> None:
        self.reward.apply_swap(step)

    def scored(self, trainer: Any, batch: ScoredBatch) -> None:
        record = self.records.take()
        if self.on_scored is None:
            return
        # TRL computed the advantages over all processes' rewards and kept this process's slice,
        # in the order of its completions: the same order as this process's reward record.
        payload = [(record, batch.advantages)]
        if trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            # Every rank's groups in rank order; a group split across two ranks is whole again.
            payload = gather_object(payload)
        payload = [p for p in payload if p[0] is not None]
        if trainer.accelerator.is_main_process:
            self.on_scored(payload, trainer.args.num_generations)
        # One path for one process and several: the step's groups and errors are events first, then
        # the run stops, on every process at once, judged on the episodes of every process.
        failure = error_rate_failure([r for r, _ in payload], self.reward.max_error_rate)
        if failure is not None:
            raise EnvErrorRateExceeded(failure)

    def eval_scored(self, trainer: Any) -> None:
        """A batch of TRL's eval loop: its record is kept for ``evaluate`` (none outside an evaluation)."""
        if self.eval_records is not None:
            record = self.records.take()
            if record is not None:
                self.eval_records.append(record)

    def evaluate(self, trainer: Any, run_eval: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """TRL's evaluation (``eval_reward``...), then grpo_magic's additions through ``on_eval``."""
        started = time.monotonic()
        self.eval_records = []
        rng = _rng_state()  # evaluating samples too: the training run goes on as if it had not happened
        try:
            metrics = run_eval()
        finally:
            records, self.eval_records = self.eval_records, None
        if trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            records = [r for part in gather_object([records]) for r in part]
        try:
            if self.on_eval is not None and trainer.accelerator.is_main_process:
                self.on_eval(trainer.state.global_step, dict(metrics), records, time.monotonic() - started)
        finally:
            _set_rng_state(rng)
        return metrics


def _rng_state() -> tuple[Any, ...]:
    """Every random generator an evaluation's sampling draws from (python, numpy, torch, CUDA)."""
    import random

    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), np.random.get_state(), torch.random.get_rng_state(), cuda


def _set_rng_state(state: tuple[Any, ...]) -> None:
    import random

    import numpy as np
    import torch

    python, numpy_state, torch_state, cuda = state
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.random.set_rng_state(torch_state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def build_trainer(
    *,
    model: Any,
    tokenizer: Any,
    reward: EnvReward,
    config: Any,
    dataset: Any,
    peft_config: Any = None,
    callbacks: list[Any] | None = None,
    on_scored: ScoredHook | None = None,
    eval_dataset: Any = None,
    on_eval: EvalHook | None = None,
) -> Any:
    """The observed GRPOTrainer of a run, with the reward adapter bound to the policy TRL trains.

    An agent env (the reward's ``agent``, an ``agent.AgentSpec``) goes to TRL as ``environment_factory``:
    TRL runs each episode through its tool loop, one instance per rollout (docs/architecture.md,
    "Agent episodes").
    """
    extra: dict[str, Any] = {}
    if reward.agent is not None:
        extra["environment_factory"] = reward.agent.factory
    records = StepRecords(reward)
    quiet_library_logs(model)  # TRL's None-reward dumps, a tied head "missing" on resume: said better by us
    with construction_warnings_ignored():
        trainer = trainer_class()(
            model=model,
            reward_funcs=[records],
            args=config,
            train_dataset=dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks or []),
            **extra,
        )
    drop_console_callbacks(trainer)
    report_after_events(trainer, list(callbacks or [])[:1])
    trainer.grpo_magic_observer = StepObserver(reward, records, on_scored, on_eval)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reward.bind(policy, tokenizer, generator=generator_for_trainer(trainer, policy, tokenizer))
    return trainer


def rollouts(trainer: Any, inputs: list[dict[str, Any]]) -> tuple[BatchRecord, ScoredBatch]:
    """One batch of TRL's rollouts (generation, tool loop, rewards, advantages) with no optimizer step,
    and the reward's record of it.

    The pre-flight check of an agent env uses it to see whole episodes exactly as training makes them.
    """
    batch = generate_and_score(trainer, inputs)
    record = trainer.grpo_magic_observer.records.take()
    assert record is not None, "TRL scored a batch without calling the reward"
    return record, batch


def events_callback(
    *,
    on_log: Callable[[int, dict[str, Any], int, float | None, float], dict[str, Any] | None],
    on_train_begin: Callable[[int], None],
    should_stop: Callable[[], str | None],
):
    """A TrainerCallback that reports TRL's logs and stops training at the end of a step when asked.

    What ``on_log`` returns is added to the logs the ``report_to`` trackers write (``train/alarms``): they run
    after this callback (``report_after_events``).

    ``should_stop`` gives the reason to stop (or None). A stop saves a complete checkpoint through
    Trainer's own saving (``control.should_save``: weights, optimizer, scheduler, RNG, trainer state),
    so ``--resume`` continues from the stopped step; ``stop_reason`` keeps the reason every process
    agreed on. ``updating`` is True from the optimizer step to the step's end, when the weights and
    the optimizer do not match ``global_step`` (no checkpoint may be taken then: ``save_abandoned``).
    """
    from transformers import TrainerCallback

    class EventsCallback(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.monotonic()
            self.stop_reason: str | None = None
            self.updating = False

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.monotonic()
            on_train_begin(state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            # The end-of-training summary (train_runtime...) is not a step, nor are TRL's eval logs (eval_*:
            # they reach the run through the trainer's evaluate, as an EvalScored event).
            if not state.is_world_process_zero or not logs or "train_runtime" in logs:
                return
            if any(key.startswith("eval_") for key in logs):
                return
            extra = on_log(state.global_step, dict(logs), state.max_steps, state.epoch, time.monotonic() - self.started)
            if extra:  # for the trackers, which see these logs after this callback (report_after_events)
                logs.update(extra)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.updating = True

        def on_step_end(self, args, state, control, **kwargs):
            self.updating = False
            if getattr(args, "eval_strategy", "no") != "no" and state.max_steps and state.global_step >= state.max_steps:
                control.should_evaluate = True  # and at the end, whatever eval_steps says (docs: "Evaluation")
            reason = should_stop()
            if args.world_size > 1:  # every process stops at the same step, or the others wait forever
                from accelerate.utils import gather_object

                reason = next((r for r in gather_object([reason]) if r), None)
            if reason:
                self.stop_reason = reason
                control.should_training_stop = True
                control.should_save = True  # Trainer's own complete checkpoint of this step
                control.should_log = True  # and the step in the history, whatever logging_steps says

    return EventsCallback()


def save_abandoned(trainer: Any, callback: Any, *, alone: bool = False) -> str | None:
    """After Ctrl-C abandoned a step: a complete checkpoint of the last finished one, if one can be taken.

    Trainer's own ``_save_checkpoint`` (``trl_compat.save_checkpoint``), as a stop at a step's end
    would have done. Not during the optimizer step (the weights are half updated), not before any
    step, and not with several processes (the others are in the middle of a collective call),
    unless ``alone``: the other processes are gone (a lost machine), and a plain data-parallel
    save makes no collective call (each process writes its RNG state, the main one the rest).
    Returns the checkpoint folder, or None.
    """
    import json
    from pathlib import Path

    state = trainer.state
    if callback.updating or state.global_step <= 0 or (trainer.args.world_size > 1 and not alone):
        return None
    folder = Path(trainer.args.output_dir) / f"checkpoint-{state.global_step}"
    try:
        if isinstance(json.loads((folder / "trainer_state.json").read_text(encoding="utf-8")), dict):
            return str(folder)  # saved at that step already (save_steps)
    except (OSError, ValueError):
        pass
    if alone:  # Trainer sums the floating-point operations of every process first: a collective call
        skip_flos_sum(trainer)  # this trainer is done: the lost processes' count stays unknown
    save_checkpoint(trainer)
    return str(folder)


def save_alone(trainer: Any, callback: Any) -> tuple[str | None, str]:
    """The checkpoint of the last finished step after the other processes were lost (``save_abandoned``), or why not.

    The lost processes' RNG files are missing from it, so it says how many processes trained it
    (``resume.checkpoint_processes`` reads that): ``--resume`` with all of them continues it.
    """
    if trainer is None or callback is None:
        return None, " (the trainer had not started)"
    from grpo_magic.runtime.distributed import is_main_process, world_size

    from .resume import complete_checkpoint, mark_processes

    try:
        folder = save_abandoned(trainer, callback, alone=True)
    except Exception as exc:  # noqa: BLE001 - the run failed already; the reason says why there is no checkpoint
        return None, f" ({type(exc).__name__}: {exc})"
    if folder is None:
        return None, " (no step had finished, or the optimizer step was cut short)"
    if is_main_process():
        mark_processes(Path(folder), world_size())
        if not complete_checkpoint(Path(folder)):
            return None, f" ({folder} is incomplete)"
    return folder, ""


def report_after_events(trainer: Any, ours: list[Any]) -> None:
    """The ``report_to`` trackers' callbacks move after ours (the first of ``callbacks``), so that what the events
    callback adds to a step's logs (the watch's ``alarms``, logged as ``train/alarms``) reaches them."""
    if not ours:
        return
    from transformers.integrations import get_reporting_integration_callbacks

    classes = tuple(get_reporting_integration_callbacks(trainer.args.report_to))
    if not classes:
        return
    trackers = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, classes)]
    for cb in trackers:
        trainer.remove_callback(cb)
        trainer.add_callback(cb)


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


def generator_for_trainer(trainer: Any, model: Any, tokenizer: Any) -> EpisodeGenerator:
    """The generator an env gets during training: TRL's vLLM engine when it runs one, else HF generate.

    Sampling follows the run's settings (temperature, top_p, top_k) and ``max_new_tokens`` defaults
    to ``rl_max_new_tokens``. What TRL runs is read by ``vllm_engine``.
    """
    args = trainer.args
    kwargs: dict[str, Any] = {
        "max_new_tokens": int(getattr(args, "max_completion_length", None) or 128),
        "temperature": getattr(args, "temperature", None),
        "top_p": getattr(args, "top_p", None),
        "top_k": getattr(args, "top_k", None),
    }
    engine = vllm_engine(trainer)
    if engine is None:
        return HFGenerator(model, tokenizer, **kwargs)
    if engine.mode == "server":
        return VLLMServerGenerator(model, tokenizer, client=engine.client, base_url=engine.base_url, **kwargs)
    if engine.llm is not None and engine.tensor_parallel_size == 1 and not engine.sleep_mode:
        return VLLMColocateGenerator(engine.llm, model, tokenizer, **kwargs)
    why = ("no engine was found on the trainer" if engine.llm is None else
           "its generate is a collective call across the tensor-parallel group" if engine.tensor_parallel_size > 1 else
           "sleep mode drops its weights between steps")
    _log.warning("grpo_magic: episodes continue with HF generate, not the colocated vLLM engine (%s).", why)
    return HFGenerator(model, tokenizer, **kwargs)
