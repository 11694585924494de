"""A model that calls two tools it was trained on, whatever its prompt offers: for the tests of calls to tools that
were not offered (tests/test_tool_calls.py).

It is ``tiny-agent`` v1's recipe (``tiny`` fine-tuned on weather and time questions, each answered by a call to
``get_weather`` or ``get_time``, picked at random): offered ``get_weather`` alone and asked for the time, it
starts ``get_time`` calls, which TRL answers "Tool get_time not found.". ``tiny-agent`` v2 reads the schemas in
its prompt and calls what they offer, so the check's account of calls to tools not offered needs another model,
as a user's own fine-tune would be. About two minutes to build on two cores, cached like the offline models.
"""

from __future__ import annotations

import random

from grpo_magic.models.warmstart import Example, WarmStart
from research.tiny_agent import tool_corpus


def weather_corpus(seed: int, size: int = 800) -> list[Example]:
    """Weather and time questions, each answered by a well-formed call with the asked city, a result, an answer:
    the weather chats of tiny-agent's own corpus (``tool_corpus``), v1's draws for the same seed."""
    corpus = tool_corpus._Corpus(random.Random(f"tool-use-{seed}"))
    return [corpus.weather() for _ in range(size)]


RECIPE = WarmStart(
    name="tiny-weather-caller",
    version="tiny-weather-caller-v1",
    corpus=weather_corpus,
    sft={"max_steps": 260, "per_device_train_batch_size": 16, "learning_rate": 5e-3,
         "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 10},
    description="tiny-agent v1's recipe, for the tests of calls to tools not offered",
)
