"""The TRL adapter: the only module that touches GRPOTrainer's internals (docs/architecture.md, "TRL").

We never re-implement generation, the loss or the advantages. A thin subclass reads the
advantages TRL computed for each generation batch (the ``advantages`` entry of what
``_generate_and_score_completions`` returns, the very tensor the loss uses), pairs them with the
reward adapter's record of that batch, and hands both to an ``on_scored`` hook; a
``TrainerCallback`` turns TRL's logs into step events and carries Stop requests in (a stop is
saved as a complete checkpoint by Trainer itself, ``control.should_save``);
``vllm_engine`` reads which vLLM engine TRL runs, for episodes that continue a conversation.

Each private thing used here is listed in ``TRL_INTERNALS`` and checked when the adapter is first
built (``check_trl``), so that a TRL release that renamed one fails at once with one sentence,
not with an AttributeError in the middle of a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import GRPOMagicError
from .generation import EpisodeGenerator, HFGenerator, VLLMColocateGenerator, VLLMServerGenerator
from .reward import BatchRecord, EnvErrorRateExceeded, EnvReward, error_rate_failure

#: (record, advantages) of each process, in process order.
ScoredHook = Callable[[list[tuple[BatchRecord, list[float]]], int], None]

_log = logging.getLogger(__name__)

_TRAINER_CLASS: type | None = None

#: What we use of TRL that is not its documented API: (owner, attribute, what we do with it).
TRL_INTERNALS = (
    ("GRPOTrainer", "_generate_and_score_completions",
     "overrides to read the advantages each batch trains on, and calls for the agent pre-flight check"),
    ("GRPOTrainer", "_save_checkpoint", "calls (Trainer's own) to save a complete checkpoint when Ctrl-C abandons a step"),
)


#: The TRL releases grpo_magic is tested with: pyproject.toml's range (a test keeps them equal).
TRL_RANGE = ">=1.16,<1.17"


def check_trl(owners: dict[str, type] | None = None, version: str | None = None) -> None:
    """Raise one clear sentence when the installed TRL lacks something the adapter overrides or reads.

    ``owners``/``version``: the classes to look at (default: the installed TRL's), so that a test can
    show the sentence for a release that lacks one.
    """
    if owners is None:
        import trl

        owners, version = {"GRPOTrainer": trl.GRPOTrainer, "GRPOConfig": trl.GRPOConfig}, trl.__version__
    for owner, name, why in TRL_INTERNALS:
        if not hasattr(owners[owner], name):
            raise GRPOMagicError(
                f"The installed TRL {version} has no {owner}.{name}, which grpo_magic {why}; install a TRL release "
                f"grpo_magic supports: pip install 'trl{TRL_RANGE}'."
            )


def trainer_class() -> type:
    """The GRPOTrainer subclass, built on first use so that importing grpo_magic stays light."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    from accelerate.utils import gather_object
    from trl import GRPOTrainer

    check_trl()

    class ObservedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that reports each scored batch with the advantages it trains on."""

        grpo_magic_reward: EnvReward | None = None
        grpo_magic_on_scored: ScoredHook | None = None

        def _generate_and_score_completions(self, inputs):  # noqa: D401 - TRL's hook point
            if self.grpo_magic_reward is not None and self.model.training:  # a hot swap, before TRL resets episodes
                self.grpo_magic_reward.apply_swap(self.state.global_step + 1)
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
            payload = [p for p in payload if p[0] is not None]
            if self.accelerator.is_main_process:
                hook(payload, self.num_generations)
            # One path for one process and several: the step's groups and errors are events first, then
            # the run stops, on every process at once, judged on the episodes of every process.
            failure = error_rate_failure([record for record, _ in payload], reward.max_error_rate)
            if failure is not None:
                raise EnvErrorRateExceeded(failure)
            return output

    _TRAINER_CLASS = ObservedGRPOTrainer
    return ObservedGRPOTrainer


def build_trainer(
    *,
    model: Any,
    tokenizer: Any,
    reward: EnvReward,
    config: Any,
    dataset: Any,
    agent: Any = None,
    peft_config: Any = None,
    callbacks: list[Any] | None = None,
    on_scored: ScoredHook | None = None,
) -> Any:
    """The observed GRPOTrainer of a run, with the reward adapter bound to the policy TRL trains.

    An agent env (``agent``, an ``agent.AgentSpec``) goes to TRL as ``environment_factory``: TRL runs
    each episode through its tool loop, one instance per rollout (docs/architecture.md, "Agent episodes").
    """
    import warnings

    extra: dict[str, Any] = {}
    if agent is not None:
        extra["environment_factory"] = agent.factory
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*environment_factory.*experimental", category=UserWarning)
        trainer = trainer_class()(
            model=model,
            reward_funcs=[reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks or []),
            **extra,
        )
    drop_console_callbacks(trainer)
    trainer.grpo_magic_reward = reward
    reward.agent = agent
    trainer.grpo_magic_on_scored = on_scored
    reward.defer_failure = True  # raised by the trainer hook once the step's episodes are events (see above)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reward.bind(policy, tokenizer, generator=generator_for_trainer(trainer, policy, tokenizer))
    return trainer


def rollouts(trainer: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch of TRL's rollouts (generation, tool loop, rewards, advantages) with no optimizer step.

    The pre-flight check of an agent env uses it to see whole episodes exactly as training makes them.
    """
    return trainer._generate_and_score_completions(inputs)


def events_callback(
    *,
    on_log: Callable[[int, dict[str, Any], int, float | None, float], None],
    on_train_begin: Callable[[int], None],
    should_stop: Callable[[], str | None],
):
    """A TrainerCallback that reports TRL's logs and stops training at the end of a step when asked.

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
            # The end-of-training summary (train_runtime...) is not a step.
            if not state.is_world_process_zero or not logs or "train_runtime" in logs:
                return
            on_log(state.global_step, dict(logs), state.max_steps, state.epoch, time.monotonic() - self.started)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.updating = True

        def on_step_end(self, args, state, control, **kwargs):
            self.updating = False
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

    Trainer's own ``_save_checkpoint`` (listed in ``TRL_INTERNALS``), as a stop at a step's end
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
        trainer.store_flos = lambda: None  # this trainer is done: the lost processes' count stays unknown
    trainer._save_checkpoint(trainer.model, trial=None)
    return str(folder)


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


@dataclass
class VLLMEngine:
    """The vLLM engine TRL generates with, as the episode generator needs it."""

    mode: str  # "colocate" or "server"
    llm: Any = None  # colocate: TRL's in-process vllm.LLM
    client: Any = None  # server: TRL's VLLMClient (main process only)
    base_url: str | None = None
    tensor_parallel_size: int = 1
    sleep_mode: bool = False


def vllm_engine(trainer: Any) -> VLLMEngine | None:
    """Which vLLM engine the trainer runs (None without vLLM); read from TRL's attributes.

    TRL keeps the engine on ``trainer.vllm_generation`` (``llm`` in colocate mode, ``vllm_client``
    in server mode; older releases kept them on the trainer itself).
    """
    args = trainer.args
    if not getattr(args, "use_vllm", False):
        return None
    engine = getattr(trainer, "vllm_generation", None)
    if getattr(args, "vllm_mode", "colocate") == "server":
        client = getattr(engine, "vllm_client", None) or getattr(trainer, "vllm_client", None)
        base_url = getattr(args, "vllm_server_base_url", None) or (
            f"http://{getattr(args, 'vllm_server_host', '0.0.0.0')}:{getattr(args, 'vllm_server_port', 8000)}")
        return VLLMEngine(mode="server", client=client, base_url=base_url)
    return VLLMEngine(
        mode="colocate",
        llm=getattr(engine, "llm", None) or getattr(trainer, "llm", None),
        tensor_parallel_size=int(getattr(engine, "tensor_parallel_size", getattr(args, "vllm_tensor_parallel_size", 1))
                                 or 1),
        sleep_mode=bool(getattr(engine, "enable_sleep_mode", getattr(args, "vllm_enable_sleep_mode", False))),
    )


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
