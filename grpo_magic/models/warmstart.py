"""Warm-started offline models: ``tiny`` taught a skill by a short supervised fine-tune, then cached.

GRPO can only reinforce what a model already does sometimes. A random ``tiny`` never calls a tool
and never adds two numbers, so the offline models that teach those skills (``tiny-agent``,
``tiny-math``) start from ``tiny`` and are fine-tuned on synthetic chats with TRL's ``SFTTrainer``
(loss on the assistant turns only), just long enough that the skill is there part of the time.

A ``WarmStart`` is the recipe: a corpus function (deterministic from its seed), the SFT settings and
a version that is the cache key. ``path()`` builds the model once (``cache.cached_folder``) and
returns its folder, which loads through the same ``from_pretrained`` path as any hub model.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .cache import cached_folder
from .tiny import tiny_model_path

#: One training example: ``{"messages": [...]}``, with ``"tools"`` (function schemas) for tool use.
Example = dict[str, Any]


@dataclass(frozen=True)
class WarmStart:
    """A recipe for an offline model: ``tiny`` + SFT on ``corpus(seed)``, cached under ``version``."""

    name: str
    version: str  # the cache key: bump it when the corpus or the settings change
    corpus: Callable[[int], list[Example]] = field(repr=False)
    steps: int = 200
    batch_size: int = 16
    learning_rate: float = 3e-3
    seed: int = 0
    max_length: int = 512
    base: Callable[[], pathlib.Path] = field(default=tiny_model_path, repr=False)

    def path(self) -> pathlib.Path:
        """The model's folder, built on first use (a few minutes on a CPU) and reused after."""
        return cached_folder(self.version, self.build)

    def build(self, dest: pathlib.Path) -> dict[str, Any]:
        """Fine-tune the base model on the corpus into ``dest``; returns what the cache marker records."""
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import SFTConfig, SFTTrainer

        started = time.perf_counter()
        base = self.base()
        tokenizer = AutoTokenizer.from_pretrained(str(base))  # tiny's: a pad token, the Qwen2.5 template
        examples = self.corpus(self.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
            config = SFTConfig(
                output_dir=str(dest / "sft"),
                max_steps=self.steps,
                per_device_train_batch_size=self.batch_size,
                learning_rate=self.learning_rate,
                lr_scheduler_type="constant_with_warmup",
                warmup_steps=min(10, self.steps // 10),
                assistant_only_loss=True,  # learn the replies, not the prompts (TRL swaps in a training template)
                max_length=self.max_length,
                seed=self.seed,
                data_seed=self.seed,
                bf16=False,
                use_cpu=not torch.cuda.is_available(),
                save_strategy="no",
                report_to=[],
                logging_steps=max(1, self.steps // 10),
                disable_tqdm=True,
                dataloader_pin_memory=False,
            )
            with _no_progress_bars():
                trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(examples),
                                     processing_class=tokenizer)
                _quiet(trainer)
                result = trainer.train()
        model = trainer.model
        model.generation_config.do_sample = True
        model.save_pretrained(dest, safe_serialization=True)
        tokenizer.save_pretrained(dest)
        _remove_tree(dest / "sft")
        return {
            "name": self.name, "base": base.name, "examples": len(examples), "steps": self.steps,
            "batch_size": self.batch_size, "learning_rate": self.learning_rate, "seed": self.seed,
            "final_loss": round(float(result.training_loss), 4), "build_seconds": round(time.perf_counter() - started, 1),
        }


def _quiet(trainer: Any) -> None:
    """No console printer during a build: it runs inside a user's first run or check."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """datasets prints a bar per preprocessing pass: not under a user's dashboard or CLI progress."""
    from datasets.utils import logging as ds_logging

    was = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            ds_logging.enable_progress_bar()


def _remove_tree(path: pathlib.Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _tool_use_corpus(seed: int) -> list[Example]:
    from .corpora import tool_use_corpus

    return tool_use_corpus(seed)


#: ``--model tiny-agent``: calls tools in the chat template's format with the right argument (weather and time
#: questions), picking the tool at random, so that GRPO on an agent env has something to compare.
TINY_AGENT = WarmStart(name="tiny-agent", version="tiny-agent-v1", corpus=_tool_use_corpus, steps=260,
                       batch_size=16, learning_rate=5e-3)
