"""TRL in one room: every touch of TRL beyond its public API (docs/architecture.md, "TRL").

grpo_magic configures TRL through its public API (``GRPOConfig``, ``GRPOTrainer(reward_funcs=...,
callbacks=..., environment_factory=...)``, ``TrainerCallback``). What it needs beyond that lives
here and nowhere else, so that a TRL release that moves one thing breaks one module, and
``check_trl`` can say which thing in one sentence before a model loads:

- the private method ``GRPOTrainer._generate_and_score_completions``, overridden (``trainer_class``)
  to read the advantages each batch trains on, and called for the agent pre-flight check
  (``generate_and_score``); the keys read from what it returns (``BATCH_KEYS``);
- ``Trainer._save_checkpoint``, called when Ctrl-C abandons a step (``save_checkpoint``);
- the keyword arguments TRL passes reward functions (``REWARD_KWARGS``, one list for ``reward`` and
  ``adapters``), and how TRL words a tool call it answered itself (``TOOL_ERROR_PREFIX``);
- the name of TRL's GRPO logger, whose warnings quote whole rows (``LIBRARY_LOGGERS``), and the library
  warnings grpo_magic already says better, silenced by logger and wording (``quiet_library_logs``,
  ``construction_warnings_ignored``);
- where TRL keeps its vLLM engine (``vllm_engine``), that engine's context length
  (``vllm_max_model_len``) and TRL's server client (``vllm_client``, ``vllm_server_generate``);
- TRL's copy of Qwen2.5's chat template, a module attribute TRL does not export
  (``qwen2_5_chat_template``).

This module imports nothing of grpo_magic but ``errors``: every other module may use it.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import GRPOMagicError

#: The TRL releases grpo_magic is tested with: pyproject.toml's range (a test keeps them equal), CI's
#: main leg on the newest, its "oldest" leg on the oldest (requirements-oldest.txt).
TRL_RANGE = ">=1.14,<1.17"

#: What we use of TRL that is not its documented API: (owner, attribute, parameters it must take, what we do).
#: ``check_trl`` checks that each exists and takes these parameters (by name, after ``self``).
TRL_INTERNALS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (
        "GRPOTrainer",
        "_generate_and_score_completions",
        ("inputs",),
        "overrides to read the advantages each batch trains on, and calls for the agent pre-flight check",
    ),
    (
        "GRPOTrainer",
        "_save_checkpoint",
        ("model", "trial"),
        "calls (Trainer's own) to save a complete checkpoint when Ctrl-C abandons a step",
    ),
    (
        "GRPOTrainer",
        "store_flos",
        (),
        "replaces with a no-op before a trainer whose other processes were lost saves alone (a collective call)",
    ),
    (
        "GRPOTrainer",
        "__init__",
        (
            "model",
            "reward_funcs",
            "args",
            "train_dataset",
            "processing_class",
            "peft_config",
            "callbacks",
            "environment_factory",
        ),
        "builds the trainer with",
    ),
)

#: accelerate's private state grpo_magic reads: (owner, attribute, what we do); ``check_trl`` checks each exists.
ACCELERATE_INTERNALS = (("PartialState", "_shared_state", "reads to keep a process state set up already"),)

#: The keys grpo_magic reads from what ``_generate_and_score_completions`` returns.
BATCH_KEYS = ("advantages", "completion_ids", "completion_mask")

#: Keyword arguments TRL adds to every reward call besides ``prompts``, ``completions`` and the dataset
#: columns (``GRPOTrainer._calculate_rewards``); ``environments`` only with an ``environment_factory``.
REWARD_KWARGS = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
#: Of those, the ones that are not one value per completion (TRL leaves them out of its per-row warnings).
REWARD_CALL_KWARGS = ("trainer_state", "log_extra", "log_metric")

#: How TRL's tool loop words a tool call it answered itself (an unknown tool, arguments it could not parse).
TOOL_ERROR_PREFIX = "{'error':"

#: TRL's loggers whose messages quote prompts or reward arguments (TRL warns with a whole row when every
#: reward function returned None for it).
LIBRARY_LOGGERS = ("trl.trainer.grpo_trainer",)

#: Library warnings a user cannot act on, because grpo_magic already says the same thing better:
#: (logger, how the message starts, why it is noise). TRL dumps a whole row when every reward function
#: returned None for it (an episode error, which grpo_magic counts, keeps and shows); transformers' Trainer
#: calls a tied ``lm_head.weight`` missing on every resume (it is the embedding matrix, saved once).
QUIET_WARNINGS: tuple[tuple[str, str, str], ...] = (
    ("trl.trainer.grpo_trainer", "All reward functions returned None for the following kwargs",
     "episode errors: counted in the run's progress, kept in run.errors"),
    ("transformers.trainer", "There were missing keys in the checkpoint model loaded: ['lm_head.weight']",
     "a tied LM head, which is the input embedding"),
)
#: Which of those holds only for a model whose LM head is its input embedding (``quiet_library_logs(model)``).
TIED_HEAD_WARNING = QUIET_WARNINGS[1][1]

#: Warnings TRL gives when a trainer is built, by wording (``construction_warnings_ignored``): TRL calls
#: ``environment_factory`` experimental, which a user of an agent env chose and cannot change.
CONSTRUCTION_WARNINGS = (".*environment_factory.*experimental",)


class QuietFilter(logging.Filter):
    """Drops the records of one logger whose message starts with one of ``prefixes`` (``QUIET_WARNINGS``)."""

    def __init__(self, prefixes: set[str]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(p) for p in self.prefixes)


def has_tied_head(model: Any) -> bool:
    """Whether ``model``'s LM head is its input embedding (one tensor), so a checkpoint saves it once."""
    try:
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    except Exception:  # a model without the usual accessors
        return False
    return head is not None and embeddings is not None and head.weight is embeddings.weight


def quiet_library_logs(model: Any = None) -> None:
    """Silence ``QUIET_WARNINGS`` on their loggers (one filter per logger, installed once).

    The tied-head warning is silenced only for a ``model`` whose head is tied (``has_tied_head``): on an
    untied model a missing ``lm_head.weight`` is a real fault and stays loud. The latest model decides.
    """
    for name, prefix, _why in QUIET_WARNINGS:
        logger = logging.getLogger(name)
        quiet = next((f for f in logger.filters if isinstance(f, QuietFilter)), None)
        if quiet is None:
            quiet = QuietFilter(set())
            logger.addFilter(quiet)
        if prefix != TIED_HEAD_WARNING or (model is not None and has_tied_head(model)):
            quiet.prefixes.add(prefix)
        else:
            quiet.prefixes.discard(prefix)


@contextmanager
def construction_warnings_ignored() -> Iterator[None]:
    """While a trainer is built: TRL's ``CONSTRUCTION_WARNINGS`` ignored, by wording."""
    with warnings.catch_warnings():
        for pattern in CONSTRUCTION_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
        yield


#: Attributes of TRL's objects grpo_magic reads or sets (``vllm_engine``: the trainer's vLLM engine and client;
#: ``vllm_max_model_len``: vLLM's engine config; ``vllm_server_generate``: what TRL's client returns;
#: ``skip_flos_sum``: the trainer's flops sum).
TRL_ATTRIBUTES = ("vllm_generation", "vllm_client", "llm_engine", "enable_sleep_mode", "store_flos")

#: TRL's modules grpo_magic imports beyond ``trl`` itself (checked to exist, not imported, by ``check_trl``).
TRL_MODULES = ("trl.trainer.grpo_trainer", "trl.generation.vllm_client", "trl.chat_template_utils")


def _parameters(func: Any) -> list[str]:
    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []


def check_trl(
    owners: dict[str, type] | None = None, version: str | None = None, modules: tuple[str, ...] = TRL_MODULES
) -> None:
    """Raise one clear sentence when the installed TRL lacks something grpo_magic overrides, calls or reads.

    Checks that each of ``TRL_INTERNALS`` exists and takes its parameters (``inspect.signature``), and
    that ``TRL_MODULES`` exist. ``owners``/``version``/``modules``: what to look at (default: the installed
    TRL's), so that a test can show the sentence for a release that lacks one.
    """
    if owners is None:
        import trl

        owners, version = {"GRPOTrainer": trl.GRPOTrainer, "GRPOConfig": trl.GRPOConfig}, trl.__version__
    fix = f"install a TRL release grpo_magic supports: pip install 'trl{TRL_RANGE}'."
    for owner, name, wanted, why in TRL_INTERNALS:
        member = getattr(owners[owner], name, None)
        if member is None:
            raise GRPOMagicError(f"The installed TRL {version} has no {owner}.{name}, which grpo_magic {why}; {fix}")
        params = _parameters(member)
        missing = [p for p in wanted if p not in params]
        if missing:
            raise GRPOMagicError(
                f"The installed TRL {version}'s {owner}.{name} takes no {missing[0]!r} argument (it takes "
                f"{', '.join(params[1:]) or 'nothing'}), and grpo_magic {why} it; {fix}"
            )
    from accelerate import state as accelerate_state

    for owner, name, why in ACCELERATE_INTERNALS:
        if not hasattr(getattr(accelerate_state, owner, None), name):
            raise GRPOMagicError(f"The installed accelerate has no {owner}.{name}, which grpo_magic {why}; install an "
                                 "accelerate release grpo_magic supports: pip install 'accelerate>=1.4'.")
    for module in modules:
        if _module_missing(module):
            raise GRPOMagicError(f"The installed TRL {version} has no module {module}, which grpo_magic uses; {fix}")


def _module_missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def check_batch(output: Any, version: str | None = None) -> None:
    """One sentence when what ``_generate_and_score_completions`` returned lacks a key grpo_magic reads."""
    missing = [k for k in BATCH_KEYS if not (isinstance(output, dict) and k in output)]
    if missing:
        if version is None:
            import trl

            version = trl.__version__
        have = ", ".join(sorted(output)) if isinstance(output, dict) else type(output).__name__
        raise GRPOMagicError(
            f"The installed TRL {version}'s GRPOTrainer._generate_and_score_completions returned no {missing[0]!r} "
            f"(it returned {have}), which grpo_magic reads each batch; install a TRL release grpo_magic supports: "
            f"pip install 'trl{TRL_RANGE}'."
        )


# ---------------------------------------------------------------- the private method


@dataclass
class ScoredBatch:
    """What grpo_magic reads of one scored generation batch, in this process's completion order."""

    advantages: list[float]  # the very values the loss uses
    completion_ids: list[list[int]]  # each completion's tokens, up to its mask's length


def scored_batch(output: dict[str, Any]) -> ScoredBatch:
    """The advantages and completion tokens of a batch TRL scored (``BATCH_KEYS``)."""
    check_batch(output)
    advantages = output["advantages"].detach().float().reshape(-1)
    lengths = output["completion_mask"].sum(dim=1).tolist()
    ids = output["completion_ids"].tolist()
    return ScoredBatch(
        advantages=advantages.cpu().tolist(),
        completion_ids=[row[: int(n)] for row, n in zip(ids, lengths, strict=True)],
    )


class BatchObserver:
    """What the trainer subclass calls around each training batch (``trainer.StepObserver`` implements it)."""

    def before_batch(self, step: int) -> None:  # pragma: no cover - an interface
        """Before TRL generates the batch of ``step`` (and resets an agent env's episodes)."""

    def scored(self, trainer: Any, batch: ScoredBatch) -> None:  # pragma: no cover - an interface
        """After TRL scored the batch and computed its advantages."""

    def eval_scored(self, trainer: Any) -> None:  # pragma: no cover - an interface
        """After TRL scored a batch of its eval loop (the model in eval mode)."""

    def evaluate(self, trainer: Any, run_eval: Any) -> dict[str, Any]:  # pragma: no cover - an interface
        """Around Trainer's public ``evaluate``: ``run_eval()`` runs TRL's eval loop and gives its metrics."""
        return run_eval()


_TRAINER_CLASS: type | None = None


def trainer_class() -> type:
    """The GRPOTrainer subclass whose batches an observer sees, built on first use (importing stays light)."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    from trl import GRPOTrainer

    check_trl()

    class ObservedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that reports each scored training batch with the advantages it trains on."""

        grpo_magic_observer: BatchObserver | None = None

        def _generate_and_score_completions(self, inputs):  # noqa: D401 - TRL's hook point
            observer, training = self.grpo_magic_observer, self.model.training
            if observer is not None and training:  # a hot swap, before TRL resets the episodes
                observer.before_batch(self.state.global_step + 1)
            output = super()._generate_and_score_completions(inputs)
            if observer is not None:
                if training:
                    observer.scored(self, scored_batch(output))
                else:  # TRL's eval loop (or a pre-flight batch, which the observer leaves alone)
                    observer.eval_scored(self)
            return output

        def evaluate(self, *args, **kwargs):  # Trainer's public entry point of its eval loop
            parent = super().evaluate
            if self.grpo_magic_observer is None:
                return parent(*args, **kwargs)
            return self.grpo_magic_observer.evaluate(self, lambda: parent(*args, **kwargs))

    _TRAINER_CLASS = ObservedGRPOTrainer
    return ObservedGRPOTrainer


def generate_and_score(trainer: Any, inputs: list[dict[str, Any]]) -> ScoredBatch:
    """One batch of TRL's rollouts (generation, tool loop, rewards, advantages) with no optimizer step."""
    return scored_batch(trainer._generate_and_score_completions(inputs))


def save_checkpoint(trainer: Any) -> None:
    """Trainer's own complete checkpoint of the current step (weights, optimizer, scheduler, RNG, state)."""
    trainer._save_checkpoint(trainer.model, trial=None)


# ---------------------------------------------------------------- vLLM


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
            f"http://{getattr(args, 'vllm_server_host', '0.0.0.0')}:{getattr(args, 'vllm_server_port', 8000)}"
        )
        return VLLMEngine(mode="server", client=client, base_url=base_url)
    return VLLMEngine(
        mode="colocate",
        llm=getattr(engine, "llm", None) or getattr(trainer, "llm", None),
        tensor_parallel_size=int(
            getattr(engine, "tensor_parallel_size", getattr(args, "vllm_tensor_parallel_size", 1)) or 1
        ),
        sleep_mode=bool(getattr(engine, "enable_sleep_mode", getattr(args, "vllm_enable_sleep_mode", False))),
    )



def drop_forward_patches(model: Any) -> None:
    """Drop the ``forward`` TRL and accelerate set on a policy's instance (a bound method of the model itself, or a
    wrapper closing over one): a reference cycle that keeps the whole policy alive after its run until Python's
    cycle collector happens to run. Without it the policy goes as soon as the run lets go of it. PEFT's wrappers
    are walked to the model inside."""
    seen: set[int] = set()
    stack = [model]
    while stack:
        module = stack.pop()
        attributes = getattr(module, "__dict__", None)
        if attributes is None or id(module) in seen:
            continue
        seen.add(id(module))
        attributes.pop("forward", None)
        children = attributes.get("_modules") or {}
        stack.extend(children.get(name) for name in ("base_model", "model"))


def release_trainer(trainer: Any, *, end_vllm_distributed: bool = False) -> None:
    """Let go of what a finished trainer holds on the GPU: TRL's vLLM engine (colocate) and client (server).

    TRL keeps the engine on ``trainer.vllm_generation`` for the trainer's life, and a notebook keeps
    objects alive long after a run (the last run, a traceback): a second run in the same kernel would
    start a second engine next to the first. ``end_vllm_distributed``: also end vLLM's (and torch's)
    process groups, which vLLM made in this process for a run that was not launched with several.
    """
    import contextlib

    drop_forward_patches(getattr(trainer, "model", None))
    engine = getattr(trainer, "vllm_generation", None)
    client = getattr(engine, "vllm_client", None) or getattr(trainer, "vllm_client", None)
    if client is not None:
        with contextlib.suppress(Exception):  # the server may be gone already; nothing to release then
            client.close_communicator()
    llm = getattr(engine, "llm", None)
    for owner in (engine, trainer):
        for name in ("llm", "vllm_client"):
            if owner is not None and getattr(owner, name, None) is not None:
                setattr(owner, name, None)
    if llm is not None:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):  # vLLM's engine core (v1): its workers and their memory
            if core is not None and callable(getattr(core, "shutdown", None)):
                core.shutdown()
        del llm
    if end_vllm_distributed:
        import sys

        parallel_state = sys.modules.get("vllm.distributed.parallel_state")
        if parallel_state is not None:
            with contextlib.suppress(Exception):
                parallel_state.destroy_model_parallel()
            with contextlib.suppress(Exception):
                parallel_state.destroy_distributed_environment()


def vllm_max_model_len(llm: Any) -> int | None:
    """The context length of TRL's colocated ``vllm.LLM`` (None when it cannot be read)."""
    try:
        return int(llm.llm_engine.model_config.max_model_len)
    except (AttributeError, TypeError, ValueError):
        return None


def vllm_client(base_url: str | None) -> Any:
    """A client of TRL's vLLM server of our own (only the main process holds the trainer's)."""
    from trl.generation.vllm_client import VLLMClient

    return VLLMClient(base_url=base_url, connection_timeout=60.0)


def vllm_server_generate(client: Any, prompt_ids: list[int], max_tokens: int, **sampling: Any) -> list[int]:
    """One completion's tokens from TRL's vLLM server (``VLLMClient.generate``'s ``completion_ids``)."""
    output = client.generate(prompts=[prompt_ids], n=1, max_tokens=max_tokens, logprobs=None, **sampling)
    return list(output["completion_ids"][0])


def qwen2_5_chat_template() -> str:
    """TRL's own copy of Qwen2.5's chat template (``trl.chat_template_utils``), which TRL recognises as
    one it can parse tool calls of: the offline ``tiny`` models use it."""
    from trl.chat_template_utils import qwen2_5_chat_template as template

    return template


def reward_call_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a reward call's keyword arguments into TRL's own (``REWARD_KWARGS``) and the dataset columns."""
    ours = {k: v for k, v in kwargs.items() if k in REWARD_KWARGS}
    return ours, {k: v for k, v in kwargs.items() if k not in REWARD_KWARGS}


# ---------------------------------------------------------------- TRL's arithmetic and rules, mirrored


def _nanmean(values: list[float]) -> float:
    valid = [v for v in values if not math.isnan(v)]
    return sum(valid) / len(valid) if valid else math.nan


def _nanstd(values: list[float]) -> float:
    """TRL's ``nanstd``: Bessel-corrected over the non-NaN values, NaN for fewer than two."""
    valid = [v for v in values if not math.isnan(v)]
    if len(valid) < 2:
        return math.nan
    m = sum(valid) / len(valid)
    return math.sqrt(sum((v - m) ** 2 for v in valid) / (len(valid) - 1))


def trl_advantages(groups: list[list[float | None]], settings: dict[str, Any]) -> list[list[float]]:
    """The advantages TRL computes for one generation batch with one reward function.

    The same arithmetic as ``GRPOTrainer._generate_and_score_completions``: a failed episode
    (``None``, TRL's NaN) is left out of its group's mean and std and gets advantage 0; the std is
    ``nanstd`` of the group (``scale_rewards`` "group"/"none") or of the whole batch ("batch"),
    plus 1e-4; "none" does not divide; ``normalize_then_sum`` normalizes per group, then over the batch.
    Written out here, in TRL's room, because TRL computes it inline in that method, with no function to call
    on new rewards; tests/test_trl_compat.py holds it to the advantages TRL itself trained on in real steps,
    for every ``scale_rewards`` x ``multi_objective_aggregation`` of the installed TRL.
    """
    w = settings.get("reward_weight", 1.0)
    scale = settings.get("scale_rewards", "group")
    rewards = [[math.nan if s is None else float(s) * w for s in g] for g in groups]
    if settings.get("multi_objective_aggregation", "sum_then_normalize") == "normalize_then_sum":
        normalized = []
        for g in groups:
            raw = [math.nan if s is None else float(s) for s in g]
            mean, std = _nanmean(raw), _nanstd(raw) if len(raw) > 1 else 0.0
            # TRL's nansum over the (one) reward function turns a NaN into 0; an unscorable row stays NaN.
            normalized.append([math.nan if s is None else _zero_nan((r - mean) / (std + 1e-4)) * w
                               for s, r in zip(g, raw, strict=True)])
        flat = [r for g in normalized for r in g]
        mean, std = _nanmean(flat), _nanstd(flat) if len(flat) > 1 else 0.0
        return [[_zero_nan((r - mean) / (std + 1e-4)) for r in g] for g in normalized]
    batch_std = _nanstd([r for g in rewards for r in g]) if scale == "batch" else math.nan
    out = []
    for g in rewards:
        mean = _nanmean(g)
        std = batch_std if scale == "batch" else (_nanstd(g) if len(g) > 1 else 0.0)
        out.append([_zero_nan((r - mean) / (std + 1e-4) if scale != "none" else r - mean) for r in g])
    return out


def _zero_nan(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def call_reward(score: Any, prompts: list[Any], completions: list[Any], *, completion_ids: list[list[int]] | None = None,
                environments: list[Any] | None = None, **columns: Any) -> Any:
    """A reward function called as ``GRPOTrainer`` calls it, outside a trainer (the check, held-out episodes):
    TRL's own keyword arguments (``REWARD_KWARGS``) with no trainer state behind them, then the columns."""
    kwargs: dict[str, Any] = {
        "completion_ids": completion_ids if completion_ids is not None else [[] for _ in completions],
        "trainer_state": None, "log_extra": None, "log_metric": None,
    }
    if environments is not None:
        kwargs["environments"] = environments
    return score(prompts=prompts, completions=completions, **kwargs, **columns)


#: Methods of an ``environment_factory`` env that TRL's tool loop does not offer as tools (``GRPOTrainer.__init__``).
TRL_ENV_METHODS = ("reset", "get_reward")


def environment_tool_names(cls: type, also_not: tuple[str, ...] = ()) -> list[str]:
    """The methods TRL's tool loop offers as tools of an env of class ``cls``: its public functions, listed on the
    class as ``GRPOTrainer.__init__`` lists them, but ``TRL_ENV_METHODS`` (and ``also_not``)."""
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not n.startswith("_") and n not in TRL_ENV_METHODS and n not in also_not]


def skip_flos_sum(trainer: Any) -> None:
    """Before saving alone: ``Trainer.store_flos`` sums every process's floating-point operations (a collective
    call), which a trainer whose other processes were lost cannot make; that count stays unknown instead."""
    trainer.store_flos = lambda: None


def accelerate_state_exists() -> bool:
    """Whether accelerate's process state was set up in this process (its borg ``PartialState._shared_state``)."""
    from accelerate.state import PartialState

    return bool(PartialState._shared_state)


#: Library warnings about settings grpo_magic sets on purpose, ignored by wording (transformers warns that
#: gradient checkpointing will change and that pin_memory has no accelerator on a CPU).
SETTING_WARNINGS = (".*gradient_checkpointing.*", ".*is_gradient_checkpointing.*", ".*pin_memory.*")


def ignore_setting_warnings() -> None:
    """Ignore ``SETTING_WARNINGS`` for the rest of the process (the run's event stream is its progress display)."""
    for pattern in SETTING_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
