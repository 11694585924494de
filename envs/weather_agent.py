"""WeatherAgentEnv: the smallest agent env (``--model tiny-agent`` offline, Qwen2.5-Instruct on a GPU).

Each prompt asks for the weather (or, with ``asks="time"`` or ``"both"``, the local time) in a city.
The env is an *agent env*: it has a ``reset`` method and two tools, ``get_weather`` and ``get_time``,
plain methods with type hints and docstrings. The trainer runs each episode (the model calls a tool,
reads the result, answers) and then calls ``score_episode`` on the instance that ran it, which knows
which tools were called with which city. The reward is 1 for the right tool with the right city, a
little for a well-formed call of the wrong tool, 0 otherwise. ``tiny-agent`` v1, fine-tuned on these two
tools only, called one with the right city, picked at random, and GRPO taught it which one a weather question
needs. v2, a general tool caller that copies what a request spells out, writes calls that parse for about
two thirds of these free-form questions, and GRPO does not lift it here (notebook 05 and tests/test_agent.py
train it on an env whose requests name the tool instead). (With ``asks="both"`` a model that small tends to
learn one tool for everything instead.)

Like every example env it imports nothing from grpo_magic: this is the whole contract.
"""

from __future__ import annotations

import random
from typing import Any

CITIES = ("Paris", "Madrid", "London", "Rome", "Berlin", "Tokyo", "Lima", "Oslo")
WEATHER_QUESTIONS = ("What is the weather in {c}?", "How is the weather in {c} today?", "Weather in {c}?")
TIME_QUESTIONS = ("What time is it in {c}?", "Local time in {c}?", "What is the time in {c} now?")
WRONG_TOOL_CREDIT = 0.2


class WeatherAgentEnv:
    """Weather (and time) questions; ``rl_env_config`` keys: asks ("weather", "time" or "both"), n_prompts, seed."""

    def __init__(self, asks: str = "weather", n_prompts: int = 64, seed: int = 0) -> None:
        if asks not in ("weather", "time", "both"):
            raise ValueError(f"asks must be 'weather', 'time' or 'both', got {asks!r}")
        self.asks = asks
        self.n_prompts = int(n_prompts)
        self.seed = int(seed)
        self.calls: list[tuple[str, str]] = []

    def build_dataset(self, tokenizer: Any = None) -> Any:
        from datasets import Dataset

        rng = random.Random(self.seed)
        rows: dict[str, list[Any]] = {"prompt": [], "city": [], "wants": []}
        for i in range(self.n_prompts):
            kinds = {"weather": ("get_weather",), "time": ("get_time",), "both": ("get_weather", "get_time")}[self.asks]
            city, wants = rng.choice(CITIES), kinds[i % len(kinds)]
            questions = WEATHER_QUESTIONS if wants == "get_weather" else TIME_QUESTIONS
            rows["prompt"].append([{"role": "user", "content": rng.choice(questions).format(c=city)}])
            rows["city"].append(city)
            rows["wants"].append(wants)
        return Dataset.from_dict(rows)

    def reset(self, **row: Any) -> None:
        """A new episode: no tool called yet."""
        self.calls = []

    def get_weather(self, city: str) -> str:
        """Get today's weather in a city.

        Args:
            city: The city name.
        """
        self.calls.append(("get_weather", city))
        return f"{random.Random(city).choice(('sunny', 'rainy', 'snowy', 'cloudy', 'windy'))} in {city}"

    def get_time(self, city: str) -> str:
        """Get the local time in a city.

        Args:
            city: The city name.
        """
        self.calls.append(("get_time", city))
        rng = random.Random(f"time-{city}")
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} in {city}"

    def score_episode(self, model: Any, tokenizer: Any, completion: str, city: str, wants: str) -> float:
        """1 for the right tool with the right city, a little for another well-formed call, else 0."""
        if (wants, city) in self.calls:
            return 1.0
        return WRONG_TOOL_CREDIT if self.calls else 0.0
