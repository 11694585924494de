"""``%grpo_check``'s account of agent episodes without a call to an offered tool, and the tool-use corpus.

The envs come from tests/agent_cells.py: ``%%grpo_env`` cells whose tool and argument names the corpus
(research/tiny_agent/tool_corpus.py) never uses (``HELD_OUT_*``).
"""

from __future__ import annotations

import collections
import json
import typing
from pathlib import Path

import pytest

from research.tiny_agent import tool_corpus as tiny_agent
from tests.agent_cells import CELLS


@pytest.fixture(scope="module")
def weather_caller() -> str:
    """A model trained to call get_weather and get_time whatever its prompt offers (tests/weather_caller.py)."""
    from tests.weather_caller import RECIPE

    return str(RECIPE.path())


def _names(corpus: list[dict]) -> tuple[set[str], set[str]]:
    tools, args = set(), set()
    for chat in corpus:
        for schema in chat["tools"]:
            tools.add(schema["function"]["name"])
            args |= set(schema["function"]["parameters"]["properties"])
    return tools, args


def test_the_corpus_is_seeded_varied_and_never_uses_the_held_out_names() -> None:
    from grpo_magic.models.warmstart import corpus_digest

    corpus = tiny_agent.tool_use_corpus(0)
    assert corpus_digest(corpus) == corpus_digest(tiny_agent.tool_use_corpus(0))
    assert corpus_digest(corpus) != corpus_digest(tiny_agent.tool_use_corpus(1))
    tools, args = _names(corpus)
    words = {w for name in tools for w in name.split("_")}
    assert not words & (set(tiny_agent.HELD_OUT_VERBS) | set(tiny_agent.HELD_OUT_NOUNS))
    assert not args & set(tiny_agent.HELD_OUT_ARGS)
    assert len(tools) > 500 and len(args) > 500  # names drawn from generated words, not remembered
    offered = collections.Counter(len(c["tools"]) for c in corpus)
    assert set(offered) == set(tiny_agent.TOOL_COUNTS)
    types = collections.Counter(p.get("enum") and "enum" or p["type"] for c in corpus for s in c["tools"]
                                for p in s["function"]["parameters"]["properties"].values())
    assert set(types) == {"integer", "number", "boolean", "string", "enum"}
    calls = collections.Counter(sum(1 for m in c["messages"] if m.get("tool_calls")) for c in corpus)
    assert calls[0] and calls[1] and calls[2]  # answered directly, one call, two calls in a row
    for chat in corpus:  # every value of the request's call is in the request; chains pass the result on
        if chat["expected"] is None or chat["tools"] == tiny_agent.agent_tools():  # no call; v1's weather questions
            continue
        request = chat["messages"][0]["content"]
        assert chat["expected"]["name"] in request
        for key, value in chat["expected"]["arguments"].items():
            assert f"{key} {json.dumps(value)}" in request  # as the call's JSON writes it
        steps = [m for m in chat["messages"] if m.get("tool_calls")]
        if len(steps) == 2:
            (second,) = steps[1]["tool_calls"][0]["function"]["arguments"].values()
            assert str(second) == chat["messages"][2]["content"]


def test_the_corpus_schemas_are_what_trl_derives_from_type_hints() -> None:
    """Each schema equals transformers' ``get_json_schema`` of a method with those hints and that docstring."""
    from transformers.utils import get_json_schema

    hints = {"integer": int, "number": float, "boolean": bool, "string": str}
    seen = 0
    for chat in tiny_agent.tool_use_corpus(0, size=200):
        for schema in chat["tools"]:
            fn = schema["function"]
            props = fn["parameters"]["properties"]
            doc = fn["description"] + ("\n\nArgs:\n" + "".join(f"    {k}: {p['description']}\n" for k, p in props.items())
                                       if props else "")

            annotations = {k: typing.Literal[tuple(p["enum"])] if "enum" in p else hints[p["type"]]
                           for k, p in props.items()}
            namespace: dict = {}
            exec(f"def {fn['name']}({', '.join(props)}) -> str:\n    pass", namespace)  # noqa: S102 - a test's own code
            method = namespace[fn["name"]]
            method.__doc__, method.__annotations__ = doc, {**annotations, "return": str}
            assert get_json_schema(method) == schema
            seen += 1
    assert seen > 300


def test_fits_schema_checks_types_and_enums() -> None:
    from transformers.utils import get_json_schema

    from grpo_magic.environment.agent import fits_schema

    schema = tiny_agent._schema("t", "T.", [("a", "integer", None), ("s", "enum", ["x", "y"])])
    assert fits_schema({"a": 3, "s": "x"}, schema)
    assert not fits_schema({"a": "3", "s": "x"}, schema)
    assert not fits_schema({"a": 3, "s": "z"}, schema)
    assert not fits_schema({"a": True, "s": "x"}, schema)
    assert not fits_schema({"a": 3}, schema)
    assert not fits_schema('{"a": 3, "s": "x"}', schema)  # arguments TRL could not read as an object

    def book(room: int, nights: float, guests: list[str], note: str | None = None) -> str:
        """Book a room.

        Args:
            room: The room number.
            nights: How many nights.
            guests: Who stays.
            note: Anything to add.
        """
        return ""

    real = get_json_schema(book)  # what a user's typed tool method gives TRL
    assert fits_schema({"room": 4, "nights": 2, "guests": ["Ann"]}, real)  # an optional argument left out
    assert fits_schema({"room": 4, "nights": 1.5, "guests": [], "note": None}, real)
    assert not fits_schema({"room": 4, "nights": 2, "guests": "Ann"}, real)
    assert not fits_schema({"room": 4, "nights": 2, "guests": [], "floor": 3}, real)  # an argument it does not take
    assert not fits_schema({"nights": 2, "guests": []}, real)  # a required one missing
    assert tiny_agent.parse_call('<tool_call>\n{"name": "t", "arguments": {"a": 1}}\n</tool_call>') == {
        "name": "t", "arguments": {"a": 1}}
    assert tiny_agent.parse_call('<tool_call>\n{"name": "t", "arguments": {"a": }\n</tool_call>') is None


# ---------------------------------------------------------------- the check's account of what the model did


CHECK = "--samples 4 --rl-num-generations 4 --rl-max-new-tokens 64"


def test_the_check_says_why_tiny_never_calls_a_tool(shell) -> None:
    shell.run_cell_magic("grpo_env", "", CELLS["WeighParcel"])
    report = shell.run_line_magic("grpo_check", f"WeighParcel --model tiny {CHECK}")
    (why,) = [w for w in report.warnings if w.startswith("no episode called an offered tool")]
    assert "(weigh_parcel) in 16 episodes" in why and "episodes wrote text only" in why
    assert "--model tiny-agent offline" in why and "Qwen/Qwen2.5-0.5B-Instruct on a GPU" in why
    assert why in str(report) and report.agent["offered_call_share"] == 0


def test_the_check_tells_why_tiny_agent_cannot_copy_one_letter_arguments(shell) -> None:
    """The issue's first try, ``add(a: int, b: int)`` asked for in free words: tiny-agent starts calls to ``add``
    that do not parse, and the check names the arguments to rename and the phrasing it copies."""
    from grpo_magic.analysis.check_agent import uncopyable_arguments
    from grpo_magic.models import load_tokenizer

    shell.run_cell_magic("grpo_env", "", CELLS["Adder"])
    report = shell.run_line_magic("grpo_check", f"Adder --model tiny-agent {CHECK}")
    print(report.agent, report.warnings)
    (why,) = [w for w in report.warnings if w.startswith("no episode called an offered tool")]
    assert "(add) in 16 episodes: " in why and "tool calls did not parse" in why
    assert "cannot copy the values of arguments whose name is one word in its vocabulary (a, b): rename them" in why
    assert 'Use the "weigh_parcel" tool with grams 41' in why
    tokenizer = load_tokenizer("tiny-agent")
    schema = tiny_agent._schema("t", "T.", [(n, "integer", None) for n in ("a", "city", "query", "grams", "owner",
                                                                              "minutes", "first_number")])
    assert uncopyable_arguments([schema], tokenizer) == ["a", "city", "query"]


@pytest.mark.long
@pytest.mark.parametrize("name", ["WeighParcel", "ReserveHarbor", "PaintGarden"])
def test_tiny_agent_calls_the_tools_of_envs_it_has_never_seen(shell, name: str) -> None:
    """Envs named from the held-out lists (one integer, two arguments, an enum): through ``%grpo_check``, at least
    half of the sampled episodes call the offered tool with arguments of its schema's types."""
    from grpo_magic.environment.agent import fits_schema, tool_names, tool_schemas

    shell.run_cell_magic("grpo_env", "", CELLS[name])
    cls = shell.user_ns[name]
    schemas = {s["function"]["name"]: s for s in tool_schemas(cls, tool_names(cls))}
    report = shell.run_line_magic("grpo_check", f"{name} --model tiny-agent --samples 8 --rl-num-generations 4 "
                                  "--rl-max-new-tokens 64")
    episodes = [t for g in report.groups for t in g["transcripts"]]
    firsts = [next((c for turn in t for c in turn.get("tool_calls") or []), None) for t in episodes]
    typed = [c for c in firsts if c and c["name"] in schemas and fits_schema(c["arguments"], schemas[c["name"]])]
    print(name, len(typed), "of", len(episodes), report.agent)
    assert len(episodes) == 32 and len(typed) >= 16
    assert report.agent["typed_call_share"] == len(typed) / 32  # the check reports it: a row of its own
    assert f"{len(typed) / 32:.0%} of episodes made a first call to an offered tool" in str(report)
    assert report.agent["offered_call_share"] >= 0.5 and not report.agent["not_offered_calls"]


@pytest.mark.long
def test_a_two_step_env_gets_episodes_with_both_calls_in_order(shell) -> None:
    """``GuessThenEncode``: ``encode_grade`` must be called with what ``guess_secret`` returned (121 to 135, three
    tokens the request does not have). tiny-agent (v2.2: fine-tuned from the circuit with its chain heads) makes
    both calls right, in order, in some sampled episodes of ``%grpo_check`` (the env scores them 1, the first call
    alone 0.5; v2.1 made none). 128 new tokens: two calls and a result do not fit in 64."""
    shell.run_cell_magic("grpo_env", "", CELLS["GuessThenEncode"])
    report = shell.run_line_magic("grpo_check", "GuessThenEncode --model tiny-agent --samples 8 "
                                  "--rl-num-generations 4 --rl-max-new-tokens 128")
    episodes = [t for g in report.groups for t in g["transcripts"]]
    pairs = [[c for turn in t for c in turn.get("tool_calls") or []][:2] for t in episodes]
    both = [p for p in pairs if len(p) == 2 and p[0]["name"] == "guess_secret" and p[1]["name"] == "encode_grade"
            and p[1]["arguments"] == {"factor": 7 * len(p[0]["arguments"]["pet"]) + 100}]
    scores = [s for g in report.scores for s in g]
    print(len(both), "of", len(episodes), sorted(scores))
    assert len(episodes) == 32 and len(both) >= 1
    assert scores.count(1.0) == len(both)  # the env's own score says the same


def test_calls_to_tools_not_offered_are_named_in_the_check_the_metrics_and_the_card(shell, tmp_path: Path,
                                                                                     weather_caller: str) -> None:
    """Offered get_weather alone and asked for the time, a model trained on both calls get_time: TRL answers
    "not found"."""
    from grpo_magic import GRPOParams, train
    from grpo_magic.dashboard.html import transcript_html

    shell.run_cell_magic("grpo_env", "", CELLS["OnlyWeather"])
    # Asked for the time with get_weather alone in its prompt, the weather caller (trained on both tools, never on one)
    # mostly starts a get_time call; how many of those parse depends on the build's last bits, which differ
    # between CPUs (one machine: 3 of 16 parsed, another: none), so the check samples 64 episodes.
    report = shell.run_line_magic("grpo_check", f"OnlyWeather --model {weather_caller} --samples 16 "
                                  "--rl-num-generations 4 --rl-max-new-tokens 64")
    agent = report.agent
    print(report)
    assert agent["not_offered_calls"] >= 1 and set(agent["not_offered_names"]) == {"get_time"}, agent
    assert agent["not_offered_error"] == "{'error': 'Tool get_time not found.'}"
    assert 0 < agent["offered_call_share"] < 1  # get_weather, the tool offered, is called too
    assert "calls to tools not offered (get_time): TRL answered {'error': 'Tool get_time not found.'}" in str(report)

    params = GRPOParams(model=weather_caller, max_steps=2, batch_size=32, rl_num_generations=8, rl_max_new_tokens=64,
                        lr=1e-9, project_name=str(tmp_path / "not-offered"))  # 64 episodes of (almost) one policy
    run = train(params, shell.user_ns["OnlyWeather"](), display=False)
    assert run.status == "completed", run.reason
    assert any(0 < h.get("env/tool_not_offered", 0) <= h["env/tool_errors"] for h in run.history), run.history
    turns = [t for g in run.groups for t in g["transcripts"] if any(m.get("not_offered") for m in t)]
    assert turns and all(m["name"] == "get_time" for t in turns for m in t if m.get("not_offered"))
    card = transcript_html(turns[0])
    assert "to tools not offered" in card and "<b>get_time</b> was not offered" in card
    assert "Tool get_time not found." in card


def test_the_check_names_the_tools_not_offered_when_no_episode_called_an_offered_one(shell, weather_caller: str) -> None:
    """A tool the weather caller has never seen: it calls the two it knows (or writes calls that do not parse)."""
    shell.run_cell_magic("grpo_env", "", CELLS["Forecast"])
    report = shell.run_line_magic("grpo_check", f"Forecast --model {weather_caller} {CHECK}")
    print(report)
    assert report.agent["offered_call_share"] == 0 and report.agent["not_offered_calls"] >= 1, report.agent
    (why,) = [w for w in report.warnings if w.startswith("no episode called an offered tool")]
    assert "(get_forecast) in 16 episodes: " in why and " calls went to tools that were not offered (get_" in why
    assert "TRL answered {'error': 'Tool get_" in why
    assert "--model tiny-agent offline" in why and "Qwen/Qwen2.5-0.5B-Instruct on a GPU" in why


def test_the_account_of_episodes_without_an_offered_call_from_their_transcripts() -> None:
    """TRL's own answers (a tool not found, a call kept as text) become the figures and the sentence."""
    from grpo_magic.analysis.check_agent import agent_stats, why_no_tool_call
    from grpo_magic.dashboard.html import transcript_html
    from grpo_magic.environment.agent import ToolCall, transcript

    def call(name: str, **arguments):
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}

    not_found = "{'error': 'Tool get_time not found.'}"
    episodes = [
        transcript([call("get_time", city="Oslo"), {"role": "tool", "name": "get_time", "content": not_found},
                    {"role": "assistant", "content": "It is late."}], [], offered=["add"]),
        transcript([call("get_time", city="Lima"), {"role": "tool", "name": "get_time", "content": not_found}],
                   [], offered=["add"]),
        transcript([{"role": "assistant", "content": '<tool_call>\n{"name": "add", "arguments": {"a": }\n</tool_call>'}],
                   [], offered=["add"]),
        transcript([{"role": "assistant", "content": "Seven."}], [], offered=["add"]),
    ]
    assert episodes[0][1]["not_offered"] and episodes[0][1]["error"] == not_found
    stats = agent_stats(episodes)
    assert stats["offered_call_share"] == 0 and stats["not_offered_calls"] == 2
    assert stats["not_offered_names"] == {"get_time": 2} and stats["not_offered_error"] == not_found
    assert stats["unparsed_calls"] == 1 and stats["text_only"] == 1
    why = why_no_tool_call(stats, ["add"])
    assert why == (
        "no episode called an offered tool (add) in 4 episodes: 1 episode wrote text only; 2 calls went to tools "
        f"that were not offered (get_time x2; TRL answered {not_found}); 1 tool call did not parse; GRPO can only "
        "reinforce calls the model already makes: use a model whose chat template and training know tool calls "
        "(e.g. --model tiny-agent offline, Qwen/Qwen2.5-0.5B-Instruct on a GPU), or warm it up with supervised "
        "examples of tool calls.")
    for_tiny_agent = why_no_tool_call(stats, ["add"], "tiny-agent", ["a", "b"])
    assert "tiny-agent only calls a tool whose name the request gives in quotes" in for_tiny_agent
    assert "(a, b): rename them" in for_tiny_agent and "rename" not in why_no_tool_call(stats, ["add"], "tiny-agent")
    card = transcript_html(episodes[0])
    assert "1 to tools not offered" in card and "was not offered" in card and "Tool get_time not found." in card

    ran = transcript([call("add", a=1, b=2), {"role": "tool", "name": "add", "content": "3"}],
                     [ToolCall("add", {"a": 1, "b": 2})], offered=["add"])
    assert "not_offered" not in ran[1] and why_no_tool_call(agent_stats([ran, *episodes]), ["add"]) is None
    assert "not offered" not in transcript_html(ran)
    # a call to an offered tool whose result the completion budget cut off (TRL never ran it) is still a call to an
    # offered tool: the check said "none wrote anything" of 32 right two-argument calls with 64 new tokens
    cut = transcript([call("add", a=1, b=2)], [], offered=["add"])
    assert agent_stats([cut], ["add"])["offered_call_share"] == 1.0
    assert why_no_tool_call(agent_stats([cut, *episodes], ["add"]), ["add"]) is None
