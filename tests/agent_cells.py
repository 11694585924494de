"""``%%grpo_env`` cells of agent envs whose tool and argument names no offline model has seen.

Every name comes from research/tiny_agent/tool_corpus.py's ``HELD_OUT_*`` (lists its corpus never uses), so a
right call to these tools shows that a model read the schema in its prompt. Each cell is what a user would type; the
requests use the corpus's phrasing (``tool_corpus.tool_request``: ``Use the "weigh_parcel" tool with grams 42``).
tests/test_tool_calls.py and bench/agent_cpu.py run them.
"""

from __future__ import annotations

#: What every cell starts with: the request helpers and a scorer shared by the envs below.
PRELUDE = '''
import random
from typing import Literal

from datasets import Dataset


def _right(calls, name, arguments):
    """1.0 when the first call is the right tool with the right arguments, 0.2 for another call, else 0."""
    if calls and calls[0]["name"] == name and calls[0]["arguments"] == arguments:
        return 1.0
    return 0.2 if calls else 0.0
'''

ONE_INT = PRELUDE + '''
class WeighParcel:
    """One tool, one integer argument."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(0)
        grams = [rng.randint(0, 99) for _ in range(32)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f'Use the "weigh_parcel" tool with grams {g}'}]
                                             for g in grams], "grams": grams})

    def reset(self, **row):
        pass

    def weigh_parcel(self, grams: int) -> str:
        """Weigh the parcel.

        Args:
            grams: The grams.
        """
        return str(grams * 3)

    def score_episode(self, model, tokenizer, completion, tool_calls, grams):
        return _right(tool_calls, "weigh_parcel", {"grams": grams})
'''

TWO_ARGS = PRELUDE + '''
class ReserveHarbor:
    """One tool, two arguments: an integer and a string."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(1)
        rows = [(rng.randint(0, 99), rng.choice(["Paris", "Oslo", "Lima", "Rome"])) for _ in range(32)]
        return Dataset.from_dict({
            "prompt": [[{"role": "user", "content": f'Use the "reserve_harbor" tool with minutes {m}, owner "{o}"'}]
                       for m, o in rows],
            "minutes": [m for m, _ in rows], "owner": [o for _, o in rows]})

    def reset(self, **row):
        pass

    def reserve_harbor(self, minutes: int, owner: str) -> str:
        """Reserve the harbor.

        Args:
            minutes: The minutes.
            owner: The owner.
        """
        return f"reserved for {owner}"

    def score_episode(self, model, tokenizer, completion, tool_calls, minutes, owner):
        return _right(tool_calls, "reserve_harbor", {"minutes": minutes, "owner": owner})
'''

ENUM = PRELUDE + '''
class PaintGarden:
    """One tool, one string-enum argument (a Literal type hint)."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(2)
        shades = [rng.choice(["red", "green", "blue"]) for _ in range(32)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f'Use the "paint_garden" tool with shade "{s}"'}]
                                             for s in shades], "shade": shades})

    def reset(self, **row):
        pass

    def paint_garden(self, shade: Literal["red", "green", "blue"]) -> str:
        """Paint the garden.

        Args:
            shade: The shade.
        """
        return f"painted {shade}"

    def score_episode(self, model, tokenizer, completion, tool_calls, shade):
        return _right(tool_calls, "paint_garden", {"shade": shade})
'''

TWO_STEP = PRELUDE + '''
class GuessThenEncode:
    """Two calls in a row: guess_secret gives a number, encode_grade must be called with it."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(3)
        pets = [rng.choice(["cat", "dog", "fish", "bird"]) for _ in range(32)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content":
                                               f'Use "encode_grade" on the result of "guess_secret" with pet "{p}"'}]
                                             for p in pets], "pet": pets})

    def reset(self, **row):
        self.secret = None

    def guess_secret(self, pet: str) -> str:
        """Guess the secret.

        Args:
            pet: The pet.
        """
        self.secret = 7 * len(pet) + 100
        return str(self.secret)

    def encode_grade(self, factor: int) -> str:
        """Encode the grade.

        Args:
            factor: The factor.
        """
        return "ok" if factor == self.secret else "wrong"

    def score_episode(self, model, tokenizer, completion, tool_calls, pet):
        secret = 7 * len(pet) + 100
        want = [{"name": "guess_secret", "arguments": {"pet": pet}}, {"name": "encode_grade", "arguments": {"factor": secret}}]
        return 1.0 if tool_calls[:2] == want else (0.5 if tool_calls[:1] == want[:1] else 0.0)
'''

#: Three held-out-name tools offered in every prompt, the request names one of them (two begin alike: ``b a``, ``b o``).
DISTRACTORS = PRELUDE + '''
class BakeRotateBorrow:
    """Three tools offered, one asked for: the right tool with the right argument pays 1, another call 0.2."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(4)
        rows = {"prompt": [], "tool": [], "arg": [], "value": []}
        for _ in range(64):
            tool, arg = rng.choice([("bake_lemon", "grams"), ("rotate_ladder", "floor"), ("borrow_violin", "minutes")])
            value = rng.randint(0, 99)
            rows["prompt"].append([{"role": "user", "content": f'Use the "{tool}" tool with {arg} {value}'}])
            rows["tool"].append(tool)
            rows["arg"].append(arg)
            rows["value"].append(value)
        return Dataset.from_dict(rows)

    def reset(self, **row):
        pass

    def bake_lemon(self, grams: int) -> str:
        """Bake the lemon.

        Args:
            grams: The grams.
        """
        return f"baked {grams}"

    def rotate_ladder(self, floor: int) -> str:
        """Rotate the ladder.

        Args:
            floor: The floor.
        """
        return f"rotated to {floor}"

    def borrow_violin(self, minutes: int) -> str:
        """Borrow the violin.

        Args:
            minutes: The minutes.
        """
        return f"borrowed for {minutes}"

    def score_episode(self, model, tokenizer, completion, tool_calls, tool, arg, value):
        return _right(tool_calls, tool, {arg: value})
'''

#: The GRPO env: a two-step request with a third, distractor tool offered; 64 prompts (a held-out quarter), eight pets
#: of six lengths, so six secrets. tiny-agent makes the first call and, in part of the episodes, the second.
TWO_STEP_DISTRACTOR = PRELUDE + '''
class GuessEncodeGreet:
    """Two calls in a row among three tools: 1 for both in order, 0.5 for the first alone."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(6)
        pets = [rng.choice(["cat", "fish", "horse", "parrot", "rabbit", "ox", "tiger", "eel"]) for _ in range(64)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content":
                                               f'Use "encode_grade" on the result of "guess_secret" with pet "{p}"'}]
                                             for p in pets], "pet": pets})

    def reset(self, **row):
        self.secret = None

    def guess_secret(self, pet: str) -> str:
        """Guess the secret.

        Args:
            pet: The pet.
        """
        self.secret = 7 * len(pet) + 100
        return str(self.secret)

    def greet_tunnel(self, volume: int) -> str:
        """Greet the tunnel.

        Args:
            volume: The volume.
        """
        return "hello"

    def encode_grade(self, factor: int) -> str:
        """Encode the grade.

        Args:
            factor: The factor.
        """
        return "ok" if factor == self.secret else "wrong"

    def score_episode(self, model, tokenizer, completion, tool_calls, pet):
        secret = 7 * len(pet) + 100
        want = [{"name": "guess_secret", "arguments": {"pet": pet}}, {"name": "encode_grade", "arguments": {"factor": secret}}]
        return 1.0 if tool_calls[:2] == want else (0.5 if tool_calls[:1] == want[:1] else 0.0)
'''

#: The issue's first try: ``add(a: int, b: int)`` asked for in free words. tiny-agent starts calls to ``add`` but cannot
#: copy the values of one-letter arguments (``a`` after the call's quote, `` a`` in a request: no token in common).
ADDER = PRELUDE + '''
class Adder:
    """One tool with one-letter arguments, asked for in free words."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(5)
        pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(16)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Use the add tool: what is {a} + {b}?"}]
                                             for a, b in pairs], "a": [a for a, _ in pairs], "b": [b for _, b in pairs]})

    def reset(self, **row):
        pass

    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return str(a + b)

    def score_episode(self, model, tokenizer, completion, tool_calls, a, b):
        return _right(tool_calls, "add", {"a": a, "b": b})
'''


#: Envs for a model that knows get_weather and get_time only (tests/weather_caller.py): this one offers
#: get_weather alone and asks for the time half of the time (that model then calls get_time, not offered).
ONLY_WEATHER = '''
import random

from datasets import Dataset


class OnlyWeather:
    """Offers get_weather only; half of the questions ask for the time."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(0)
        cities = [rng.choice(["Paris", "Oslo", "Lima", "Rome"]) for _ in range(16)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What time is it in {c}?" if i % 2 else
                                               f"What is the weather in {c}?"}] for i, c in enumerate(cities)],
                                  "city": cities})

    def reset(self, **row):
        self.calls = []

    def get_weather(self, city: str) -> str:
        """Get today's weather in a city.

        Args:
            city: The city name.
        """
        self.calls.append(city)
        return f"sunny in {city}"

    def score_episode(self, model, tokenizer, completion, city):
        return 1.0 if city in self.calls else 0.0
'''

#: A tool that model has never seen, asked with its own questions: it calls tools that are not offered.
FORECAST = '''
import random

from datasets import Dataset


class Forecast:
    """Offers get_forecast, a tool the weather caller has never seen, for weather and time questions."""

    def build_dataset(self, tokenizer=None):
        rng = random.Random(0)
        cities = [rng.choice(["Paris", "Oslo", "Lima", "Rome"]) for _ in range(16)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What time is it in {c}?" if i % 2 else
                                               f"What is the weather in {c}?"}] for i, c in enumerate(cities)],
                                  "city": cities})

    def reset(self, **row):
        self.calls = []

    def get_forecast(self, city: str) -> str:
        """Get the forecast of a city.

        Args:
            city: The city name.
        """
        self.calls.append(city)
        return f"sunny in {city}"

    def score_episode(self, model, tokenizer, completion, city):
        return 1.0 if city in self.calls else 0.0
'''

#: The cells above by env class name.
CELLS = {"WeighParcel": ONE_INT, "ReserveHarbor": TWO_ARGS, "PaintGarden": ENUM, "GuessThenEncode": TWO_STEP,
         "BakeRotateBorrow": DISTRACTORS, "GuessEncodeGreet": TWO_STEP_DISTRACTOR, "OnlyWeather": ONLY_WEATHER, "Forecast": FORECAST,
         "Adder": ADDER}
