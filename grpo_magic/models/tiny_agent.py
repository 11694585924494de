"""``tiny-agent``: ``tiny`` warm-started to call tools in the chat template's format, picking the tool at random.

The model of the agent envs' offline demo and tests (envs/weather_agent.py). Its corpus: weather and
time questions, each answered by a tool call (the format of TRL's Qwen2.5 template), the tool's
result, then a one-line answer. The call is always well formed and its ``city`` is the one asked
about; the *tool* is the one the question asks for in only half of the chats (at random), so the
model comes out calling a tool with the right city and picking ``get_weather`` or ``get_time`` at
random: which tool a question needs is what GRPO then teaches it (tests/test_agent.py and
bench/run.py measure the rise). A corpus where the right tool came 65% of the time taught no more:
260 steps of SFT do not pick up so weak a link between question and tool.
"""

from __future__ import annotations

import pathlib
import random
from typing import Any

from .warmstart import Example, WarmStart

TINY_AGENT = "tiny-agent"

#: Cities that are one token in ``tiny``'s vocabulary, so copying one into a tool call is one step.
AGENT_CITIES = ("Paris", "Madrid", "London", "Rome", "Berlin", "Tokyo", "Lima", "Oslo")
WEATHER = ("sunny", "rainy", "snowy", "cloudy", "windy")
WEATHER_QUESTIONS = ("What is the weather in {c}?", "How is the weather in {c} today?", "Weather in {c}?",
                     "Is it raining in {c}?")
TIME_QUESTIONS = ("What time is it in {c}?", "Local time in {c}?", "What is the time in {c} now?")
#: Share of the tool-use demonstrations that call the tool the question asks for (the others call the other one).
RIGHT_TOOL_SHARE = 0.5


def get_weather(city: str) -> str:
    """Get today's weather in a city.

    Args:
        city: The city name.
    """
    raise NotImplementedError  # only its schema is used: the corpus writes the results itself


def get_time(city: str) -> str:
    """Get the local time in a city.

    Args:
        city: The city name.
    """
    raise NotImplementedError


def agent_tools() -> list[dict[str, Any]]:
    """The function schemas of the corpus's tools, derived as TRL derives them for an agent env's methods."""
    from transformers.utils import get_json_schema

    return [get_json_schema(get_weather), get_json_schema(get_time)]


def tool_use_corpus(seed: int, size: int = 800) -> list[Example]:
    """Weather and time questions answered by a tool call, the tool's result, then a one-line answer.

    The call is always well formed and its ``city`` is the one asked about; the *tool* is the one the
    question asks for in only ``RIGHT_TOOL_SHARE`` of the chats (half: at random), so a model trained on
    them calls a tool with the right city and picks the tool at random: which tool is what GRPO teaches.
    """
    rng = random.Random(f"tool-use-{seed}")
    tools = agent_tools()
    chats = []
    for _ in range(size):
        city = rng.choice(AGENT_CITIES)
        asks_weather = rng.random() < 0.5
        question = rng.choice(WEATHER_QUESTIONS if asks_weather else TIME_QUESTIONS).format(c=city)
        right = rng.random() < RIGHT_TOOL_SHARE
        weather_tool = asks_weather == right
        tool = "get_weather" if weather_tool else "get_time"
        result = (f"{rng.choice(WEATHER)} in {city}" if weather_tool
                  else f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} in {city}")
        chats.append({"tools": tools, "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": {"city": city}}}]},
            {"role": "tool", "name": tool, "content": result},
            {"role": "assistant", "content": f"It is {result}."},
        ]})
    return chats


RECIPE = WarmStart(
    name=TINY_AGENT,
    version="tiny-agent-v1",
    corpus=tool_use_corpus,
    sft={
        "max_steps": 260,
        "per_device_train_batch_size": 16,
        "learning_rate": 5e-3,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": 10,
    },
    description="tool calls for weather and time questions, about two minutes on 2 CPU cores",
)


def tiny_agent_path() -> pathlib.Path:
    """The folder of ``tiny-agent``, built on first use and reused after."""
    return RECIPE.path()
