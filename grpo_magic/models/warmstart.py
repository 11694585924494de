"""Warm-started offline models: ``tiny`` taught one skill by a short supervised fine-tune, built once.

A random model gives GRPO nothing to compare but noise; a model that already does the task some of
the time gives it groups with better and worse answers. A ``WarmStart`` recipe makes such a model
here, without the Hub: a name (what ``--model`` takes), a version (the cache key), a corpus
function (a seed in, synthetic chat examples out, the same every time), TRL ``SFTConfig`` settings,
and, when the skill needs more capacity than ``tiny`` has, new sizes for its architecture.
``build(dest)`` fine-tunes with TRL's own ``SFTTrainer``; ``path()`` gives the weights the package ships, or
(``GRPO_MAGIC_BUILD_MODELS=1``, or a recipe not shipped) builds once and then reuses the cached folder
(``models.cache``); either loads through the same ``from_pretrained`` path as any hub model. Adding a model is
a corpus function and settings, and its name in ``loading.OFFLINE_MODELS``.

What TRL 1.16's ``SFTTrainer`` does with this corpus, checked in its source: a dataset with a
``messages`` column is conversational; with ``assistant_only_loss=True`` (set here) it renders each
example with its *training* variant of the chat template (``get_training_chat_template``: TRL's
copy of Qwen2.5's template, which ``tiny`` uses, with ``{% generation %}`` markers around every
assistant turn, the end-of-turn token included, so the model learns to stop), and only the tokens
inside the markers count in the loss: the system prompt, the user's turns and tool results do not.
A ``tools`` column is passed to the template as ``tools=``, so schemas are rendered into the system
prompt as at inference. (``completion_only_loss`` is for prompt/completion datasets; it is not used.)

Each column is stored with the ``datasets.Json`` feature: Arrow would otherwise merge the keys of
every example's tool-call arguments into one struct and hand each example the others' keys as
``None``, which the template then renders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .cache import build_info, cached_folder
from .tiny import TINY_VERSION, tiny_model_path

#: One example of a corpus: ``{"messages": [...]}``, optionally with ``"tools": [schemas]``.
Example = dict[str, Any]

# SFTConfig settings every recipe gets; a recipe's own ``sft`` settings override them.
_SFT_DEFAULTS: dict[str, Any] = {
    "assistant_only_loss": True,  # train on the assistant turns only (see the module docstring)
    "num_train_epochs": 1,
    "per_device_train_batch_size": 32,
    "learning_rate": 3e-3,
    "lr_scheduler_type": "linear",
    "weight_decay": 0.0,
    "max_length": 512,
    "logging_steps": 50,
    "save_strategy": "no",
    "report_to": [],
    "bf16": False,
    "use_cpu": True,  # the same model on every machine: CPU arithmetic, whatever accelerator is there
    "dataloader_pin_memory": False,
    "disable_tqdm": True,
}


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """A recipe for a warm-started offline model (see the module docstring).

    ``corpus(seed)`` returns the training examples in the order given (pass
    ``train_sampling_strategy="sequential"`` in ``sft`` to train in that order, e.g. a curriculum).
    ``sizes`` overrides ``tiny``'s architecture (``hidden_size``, ``num_hidden_layers``...); the
    weights then start fresh from ``seed``, with the same tokenizer. ``check(model, tokenizer)``
    measures the built model (its result goes into the cache marker, ``build_info``).
    """

    name: str
    version: str
    corpus: Callable[[int], list[Example]]
    sft: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    sizes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    check: Callable[[Any, Any], dict[str, Any]] | None = None
    description: str = ""
    #: A function of the seed that returns the model to fine-tune, instead of ``tiny`` or a fresh model of
    #: ``sizes`` (tiny-agent v2: a fresh model with a copy circuit set by hand, research/tiny_agent/copy_circuit.py).
    start: Callable[[int], Any] | None = None
    #: torch's threads during the build. One by default (see ``build``); a model big enough to use a second
    #: core says so (the general tool caller: 2.5 s a step on one thread, 1.3 s on two, here).
    threads: int = 1
    #: The built model's next-token logits are multiplied by this (its final norm's weight is, once, after the
    #: fine-tune), so that sampling it at temperature 1 samples the trained model at ``1 / sharpen``. Why: GRPO
    #: and ``%grpo_check`` sample at the run's temperature (1 by default), and a fine-tune of minutes leaves a
    #: flat distribution whose sampled calls fail on single junk tokens where its greedy ones are right (the
    #: general tool caller: research/tiny_agent/RESULTS-agent.md). GRPO still explores: the distribution stays a distribution.
    sharpen: float = 1.0

    @property
    def build_threads(self) -> int:
        """The threads a build runs on: ``threads``, at most the machine's cores."""
        return max(1, min(self.threads, os.cpu_count() or 1))

    @property
    def cache_key(self) -> str:
        """The cache folder's name: this recipe's version on top of the ``tiny`` it starts from."""
        return f"{self.version}+{TINY_VERSION}"

    def path(self) -> pathlib.Path:
        """The model's folder: the package's own weights when it ships them; otherwise (``GRPO_MAGIC_BUILD_MODELS=1``)
        built from this recipe into the cache (a minute or a few on a CPU), then reused."""
        from .cache import cache_dir

        announce = (f"grpo_magic: building the offline model '{self.name}' once ({self.description}); it is cached "
                    f"in {cache_dir() / self.cache_key}")
        return cached_folder(self.cache_key, self.build, announce=announce)

    def info(self) -> dict[str, Any]:
        """What the build recorded (settings, timings, ``check`` results), building it if needed."""
        return build_info(self.path())

    def dataset(self) -> Any:
        """The corpus as a ``datasets.Dataset``: ``messages`` (and ``tools`` when any example has them)."""
        from datasets import Dataset, Features, Json, List

        examples = self.corpus(self.seed)
        if not examples:
            raise ValueError(f"the corpus of {self.name} is empty")
        columns: dict[str, list[Any]] = {"messages": [e["messages"] for e in examples]}
        features: dict[str, Any] = {"messages": List(Json())}
        if any(e.get("tools") for e in examples):
            columns["tools"] = [e.get("tools") or None for e in examples]
            features["tools"] = List(Json())
        return Dataset.from_dict(columns, features=Features(features))

    def _start_model(self) -> Any:
        """``start(seed)``, else ``tiny`` itself, or a fresh model of its architecture with ``sizes`` changed."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        if self.start is not None:
            return self.start(self.seed)
        base = str(tiny_model_path())
        if not self.sizes:
            return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        config = AutoConfig.from_pretrained(base)
        for key, value in self.sizes.items():
            setattr(config, key, value)
        if "num_hidden_layers" in self.sizes:  # one entry per layer; rebuilt for the new depth
            config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = AutoModelForCausalLM.from_config(config).to(torch.float32)
        model.generation_config = GenerationConfig.from_pretrained(base)
        return model

    def trainer(self, output_dir: str) -> Any:
        """TRL's ``SFTTrainer`` on this recipe's corpus and start model, ready to ``train()``.

        Its ``train_dataset`` is TRL's processed corpus (``input_ids``, ``assistant_masks``): what
        the loss will see, for tests to read.
        """
        import torch
        from transformers import AutoTokenizer, PrinterCallback
        from trl import SFTConfig, SFTTrainer

        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))  # tiny's, pad token and all
        torch.manual_seed(self.seed)
        args = SFTConfig(output_dir=output_dir, seed=self.seed, data_seed=self.seed, **{**_SFT_DEFAULTS, **self.sft})
        trainer = SFTTrainer(model=self._start_model(), args=args, train_dataset=self.dataset(),
                             processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)  # its log lines would land in the user's cell
        return trainer

    def build(self, dest: pathlib.Path) -> dict[str, Any]:
        """Fine-tune into ``dest``, deterministically on one machine; returns what the cache marker records.

        Another CPU may build other bytes: the fine-tune grows the last-bit differences of its float kernels
        (tiny-agent on an AMD EPYC and an Intel Xeon with AVX-512: research/tiny_agent/RESULTS-agent.md), so what a test
        asserts of a built model must hold for any build of its recipe, not for one file.

        torch runs on ``threads`` threads meanwhile (at most the machine's cores), one by default:
        tiny-sized models gain little from a second, and on a busy machine OpenMP's spin-waiting made
        a 1-minute build take 5 (measured here: 63 s on 1 thread, 316 s on 2, the same bytes either way).
        """
        import torch

        started = time.perf_counter()
        threads = torch.get_num_threads()
        torch.set_num_threads(self.build_threads)
        try:
            with _quiet(), torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory(prefix="grpo-warmstart-") as tmp:
                trainer = self.trainer(tmp)
                trained = trainer.train()
                model, tokenizer = trainer.model.eval(), trainer.processing_class
                if self.sharpen != 1.0:
                    _sharpen(model, self.sharpen)
                checked = self.check(model, tokenizer) if self.check is not None else {}
                # the parts the start model keeps as set (a hand-set circuit) stay so in every run that loads it
                # (models.load_model): Adam's steps are of one size whatever a weight's scale, and a circuit
                # scored in hundreds of nats lost its copying in one GRPO step at lr 1e-4 (research/tiny_agent/RESULTS-agent.md)
                frozen = [name for name, param in model.named_parameters() if not param.requires_grad]
                if frozen:
                    model.config.grpo_magic_frozen = frozen
                model.save_pretrained(dest, safe_serialization=True)
                tokenizer.save_pretrained(dest)
        finally:
            torch.set_num_threads(threads)
        settings = {**_SFT_DEFAULTS, **self.sft}
        losses = [round(float(h["loss"]), 4) for h in trainer.state.log_history if "loss" in h]
        return {
            "name": self.name,
            "recipe_version": self.version,
            "base": TINY_VERSION,
            "seed": self.seed,
            "examples": len(trainer.train_dataset),
            "steps": trainer.state.global_step,
            "sft": {k: v for k, v in settings.items() if isinstance(v, (int, float, str, bool))},
            "sizes": dict(self.sizes),
            "threads": self.build_threads,
            "sharpen": self.sharpen,
            "train_loss": round(float(trained.training_loss), 4),
            "loss_curve": losses,
            "build_seconds": round(time.perf_counter() - started, 1),
            "check": checked,
        }


def _sharpen(model: Any, factor: float) -> None:
    """Multiply ``model``'s logits by ``factor``: the final norm's weight, which feeds the unembedding alone (a
    tied embedding's input side is untouched)."""
    import torch

    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise ValueError(f"sharpen needs a final norm with a weight; {type(model).__name__} has none")
    with torch.no_grad():
        norm.weight.mul_(factor)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars, info logs or deprecation notes from datasets, transformers and TRL during a build."""
    import datasets
    import transformers

    bars_were_on = not datasets.are_progress_bars_disabled()
    tf_bars_were_on = transformers.utils.logging.is_progress_bar_enabled()
    ds_level, tf_level = datasets.logging.get_verbosity(), transformers.logging.get_verbosity()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # SFTConfig's own deprecated defaults
            yield
    finally:
        datasets.logging.set_verbosity(ds_level)
        transformers.logging.set_verbosity(tf_level)
        if bars_were_on:
            datasets.enable_progress_bars()
        if tf_bars_were_on:
            transformers.utils.logging.enable_progress_bar()


def corpus_digest(examples: list[Example]) -> str:
    """A short fingerprint of a corpus, so that tests can check it is the same for the same seed."""
    import hashlib

    return hashlib.sha256(json.dumps(examples, sort_keys=True).encode()).hexdigest()[:16]
