"""Agent envs: episodes trained whole through TRL's tool loop, their transcripts, check and dashboard."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from grpo_magic.agent import AgentEpisode, agent_spec, episode_class, tool_calls_of, transcript
from grpo_magic.events import GroupScored, RunLog, RunStarted, StepLogged, read_run_log

WEATHER = {"Paris": "sunny", "Rome": "rainy", "Oslo": "snowy", "Lima": "cloudy"}


class WeatherAgent:
    """Answers weather questions; the right episode calls get_weather with the asked city."""

    def __init__(self, n: int = 16) -> None:
        self.n = n
        self.asked: list[str] = []

    def build_dataset(self, tokenizer):
        from datasets import Dataset

        cities = list(WEATHER)
        return Dataset.from_dict({"prompt": [f"What is the weather in {cities[i % 4]}?" for i in range(self.n)],
                                  "city": [cities[i % 4] for i in range(self.n)]})

    def reset(self, city: str, **row) -> None:
        self.city = city
        self.asked = []

    def get_weather(self, city: str) -> str:
        """Get today's weather in a city.

        Args:
            city: The city name, e.g. Paris.
        """
        self.asked.append(city)
        if city not in WEATHER:
            raise KeyError(f"no weather station in {city}")
        return f"{WEATHER[city]} in {city}"

    def helper_for_tests(self) -> int:  # public but not a tool when get_tools names the tools
        return 1

    def get_tools(self):
        return [{"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {}}}]

    def score_episode(self, model, tokenizer, completion, city, messages=None, tool_calls=None):
        return 1.0 if self.city in self.asked else 0.0


TURNS = [
    {"role": "assistant", "content": "Let me look.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "get_time", "arguments": {}}}]},
    {"role": "tool", "name": "get_weather", "content": "sunny in Paris"},
    {"role": "tool", "name": "get_time", "content": "{'error': 'Tool get_time not found.'}"},
    {"role": "assistant", "content": "It is sunny in Paris."},
]


# ---------------------------------------------------------------- the class TRL builds


def test_trl_sees_only_reset_and_the_tools_and_each_call_is_recorded() -> None:
    import inspect

    env = WeatherAgent()
    spec = agent_spec(env, WeatherAgent, env.get_tools())
    episode = spec.factory()
    assert isinstance(episode, AgentEpisode) and episode._env is not env  # a fresh env for each rollout
    public = [n for n, _ in inspect.getmembers(type(episode), inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["get_weather", "reset"]  # what TRL turns into tools, reset aside
    assert spec.schemas[0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    episode.reset(city="Rome", prompt=[{"role": "user", "content": "?"}], extra_column=1)
    assert episode.get_weather(city="Rome") == "rainy in Rome"
    with pytest.raises(KeyError):  # re-raised: TRL feeds the error to the model
        episode.get_weather(city="Atlantis")
    assert [(c.name, c.arguments, bool(c.error)) for c in episode._calls] == [
        ("get_weather", {"city": "Rome"}, False), ("get_weather", {"city": "Atlantis"}, True)]
    assert episode._env.asked == ["Rome", "Atlantis"]


def test_without_get_tools_every_public_method_is_a_tool() -> None:
    class NoList(WeatherAgent):
        get_tools = None

    cls = episode_class(NoList, ["get_weather", "helper_for_tests"])
    assert callable(cls.helper_for_tests) and cls.get_weather.__doc__ == WeatherAgent.get_weather.__doc__


def test_transcript_marks_failed_and_unknown_tools() -> None:
    from grpo_magic.agent import ToolCall

    out = transcript(TURNS, [ToolCall("get_weather", {"city": "Paris"})])
    assert [t["role"] for t in out] == ["assistant", "tool", "tool", "assistant"]
    assert out[0]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                    {"name": "get_time", "arguments": {}}]
    assert "error" not in out[1] and out[2]["error"].startswith("{'error'")
    assert tool_calls_of(TURNS) == out[0]["tool_calls"]
    failed = transcript(TURNS[:2], [ToolCall("get_weather", {"city": "Paris"}, error="KeyError: 'x'")])
    assert failed[1]["error"] == "KeyError: 'x'"


# ---------------------------------------------------------------- the run log, replay and the dashboard


def _group(step: int = 1) -> GroupScored:
    turns = transcript(TURNS)
    return GroupScored(step=step, group=0, prompt="user: What is the weather in Paris?",
                       completions=["It is sunny in Paris.", "no idea"], scores=[1.0, 0.0],
                       advantages=[0.7071, -0.7071], errors=[None, None], clipped=[False, False],
                       transcripts=[turns, [{"role": "assistant", "content": "no idea"}]])


def test_transcripts_round_trip_through_the_run_log_and_replay(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    from grpo_magic import replay

    log = RunLog(tmp_path)
    log(RunStarted(params={}, env_name="WeatherAgent", model="tiny-agent", output_dir=str(tmp_path), max_steps=1))
    log(_group())
    log(StepLogged(step=1, metrics={"reward": 0.5, "tools/call_frequency": 1.0}, max_steps=1))
    log.close()
    back = next(e for e in read_run_log(tmp_path) if isinstance(e, GroupScored))
    assert back.transcripts == _group().transcripts
    html = replay(str(tmp_path)).groups_html
    for text in ("get_weather", "city=&#x27;Paris&#x27;", "sunny in Paris", "It is sunny in Paris.",
                 "get_time", "returned an error", "2 tool calls", "1 failed"):
        assert text in html, text
    turns = html.split('class="grpo-turns"', 1)[1].split("</summary>", 1)[1]  # the opened card, in order
    assert turns.index("Let me look.") < turns.index("sunny in Paris") < turns.index("It is sunny in Paris.")
    assert 'class="grpo-turns"' in html and "score 1.00" in html and "A +0.71" in html


def test_terminal_summary_counts_tool_calls() -> None:
    from grpo_magic.progress import TerminalProgress

    out = io.StringIO()
    progress = TerminalProgress(stream=out, summary_every=1)
    progress(RunStarted(params={}, env_name="WeatherAgent", model="tiny-agent", output_dir="/tmp/x", max_steps=1))
    progress(_group())
    progress(StepLogged(step=1, metrics={"reward": 0.5}, max_steps=1, episodes=2))
    assert "[2 tool calls, 1 failed] It is sunny in Paris." in out.getvalue()
    assert "[0 tool calls] no idea" in out.getvalue()


def test_single_turn_groups_have_no_transcripts_and_render_as_before() -> None:
    pytest.importorskip("ipywidgets")
    from grpo_magic.dashboard.html import group_card_html

    plain = GroupScored(step=1, group=0, prompt="p", completions=["a", "b"], scores=[1.0, 0.0],
                        advantages=[0.7, -0.7], errors=[None, None], clipped=[False, False])
    assert plain.transcripts == [] and "grpo-turns" not in group_card_html(plain)
    assert math.isclose(plain.mean, 0.5)
