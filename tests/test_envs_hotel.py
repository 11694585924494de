"""HotelEnv: real episodes against the simulated hotel system.

The model is scripted (its replies are fixed texts, tokenized with the real ``tiny`` tokenizer), so
that each test controls what the agent does in later turns; one test runs the real ``tiny`` model.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from envs.hotel_env import RUBRIC, HotelEnv, parse_tool_calls

CONFIRM = "Your room is booked."


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from grpo_magic.models import load_model, load_tokenizer, tiny_model_path

    path = tiny_model_path()
    return load_tokenizer(str(path)), load_model(str(path))


@pytest.fixture(scope="module")
def tok(tiny: tuple[Any, Any]) -> Any:
    return tiny[0]


class ScriptedModel:
    """Stands in for the policy: each ``generate`` call returns the prompt plus the next reply.

    Replies run out into repeats of the last one, so that a model that "keeps calling tools" is
    one reply long.
    """

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.device = torch.device("cpu")
        self.calls = 0
        self.prompts: list[str] = []

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
        assert attention_mask is not None and attention_mask.shape == input_ids.shape
        self.prompts.append(self.tokenizer.decode(input_ids[0]))
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        ids = self.tokenizer(reply + "<|im_end|>", add_special_tokens=False, return_tensors="pt")["input_ids"]
        return torch.cat([input_ids, ids], dim=1)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def book(env: HotelEnv, case_idx: int, room_id: str) -> str:
    case = env.cases[case_idx]
    return call("book_room", room_id=room_id, check_in=case.check_in, nights=case.nights, guest_name=case.guest_name)


def other_rooms(env: HotelEnv, case_idx: int, same_city: bool = True) -> list[str]:
    """Rooms free for the case's stay other than the right one (same type), matching ones first."""
    case = env.cases[case_idx]
    system = env.new_system()
    cities = [case.city] if same_city else [c for c in ("Lisbon", "Porto", "Madrid", "Paris") if c != case.city]
    found = []
    for city in cities:
        result = system.search_rooms(city, case.check_in, case.nights, room_type=case.room_type)
        found += [r["room_id"] for r in result["rooms"] if r["room_id"] != case.answer]
    return sorted(found, key=lambda room_id: not case.matches(env.world.by_id[room_id]))


# -- dataset, tools, cases -----------------------------------------------------------------------
def test_dataset_and_tools_shapes(tok: Any) -> None:
    env = HotelEnv()
    ds = env.build_dataset(tok)
    assert set(ds.column_names) == {"prompt", "case_idx"}
    assert 32 <= len(ds) <= 64
    assert ds["case_idx"] == list(range(len(ds)))
    first = ds[0]["prompt"]
    assert [m["role"] for m in first] == ["system", "user"]
    assert "Book" in first[1]["content"] or "book" in first[1]["content"]

    tools = env.get_tools()
    assert {t["function"]["name"] for t in tools} == {"search_rooms", "get_room", "book_room", "cancel_booking"}
    for tool in tools:
        assert tool["type"] == "function"
        fn = tool["function"]
        assert fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object"
        assert set(params["required"]) <= set(params["properties"])
        json.dumps(tool)  # JSON-able
    # The tools render into the prompt through the chat template.
    text = tok.apply_chat_template(first, tools=tools, add_generation_prompt=True, tokenize=False)
    assert "search_rooms" in text and first[1]["content"] in text


def test_rubric_sums_to_one() -> None:
    assert math.isclose(sum(RUBRIC.values()), 1.0)


def test_unknown_difficulty_names_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="easy, normal, hard"):
        HotelEnv(difficulty="medium")


def test_difficulty_changes_the_cases() -> None:
    easy, normal, hard = (HotelEnv(difficulty=d) for d in ("easy", "normal", "hard"))
    assert all(c.max_price is None and c.amenity is None and c.goal == "cheapest" for c in easy.cases)
    assert all(c.max_price is not None and c.amenity is None for c in normal.cases)
    assert {c.goal for c in normal.cases} == {"cheapest", "best_rated"}
    assert all(c.max_price is not None and c.amenity is not None for c in hard.cases)
    assert [c.request for c in easy.cases] != [c.request for c in normal.cases]
    assert len(hard.cases[0].request) > len(easy.cases[0].request)


def test_deterministic_from_seed() -> None:
    a, b, c = HotelEnv(seed=3), HotelEnv(seed=3), HotelEnv(seed=4)
    assert a.cases == b.cases and a.world == b.world
    assert a.cases != c.cases and a.world.rooms != c.world.rooms


def test_every_case_has_its_answer_as_the_unique_best_match() -> None:
    for difficulty in ("easy", "normal", "hard"):
        env = HotelEnv(difficulty=difficulty)
        for case in env.cases:
            system = env.new_system()
            rooms = system.search_rooms(case.city, case.check_in, case.nights)["rooms"]
            matching = [env.world.by_id[r["room_id"]] for r in rooms if case.matches(env.world.by_id[r["room_id"]])]
            assert case.answer in {r.room_id for r in matching}
            if case.goal == "cheapest":
                prices = sorted(r.price for r in matching)
                assert env.world.by_id[case.answer].price == prices[0]
                assert len(prices) == 1 or prices[0] < prices[1]


# -- parsing -------------------------------------------------------------------------------------
def test_parse_tags_and_plain_json() -> None:
    text = call("search_rooms", city="Lisbon", check_in="2026-03-10", nights=2) + "\n" + call("get_room", room_id="X")
    parsed = parse_tool_calls(text)
    assert [name for name, _ in parsed.calls] == ["search_rooms", "get_room"]
    plain = parse_tool_calls('I will search. {"name": "search_rooms", "arguments": {"city": "Porto", "nights": 1}}')
    assert plain.calls == [("search_rooms", {"city": "Porto", "nights": 1})]
    as_string = parse_tool_calls('<tool_call>{"name": "get_room", "arguments": "{\\"room_id\\": \\"A\\"}"}</tool_call>')
    assert as_string.calls == [("get_room", {"room_id": "A"})]
    broken = parse_tool_calls('<tool_call>{"name": "search_rooms", "arguments": {"city": </tool_call>')
    assert broken.calls == [] and broken.attempted
    chat = parse_tool_calls("Sure, happy to help with your stay!")
    assert chat.calls == [] and not chat.attempted


# -- scoring -------------------------------------------------------------------------------------
@pytest.mark.parametrize("difficulty", ["easy", "normal", "hard"])
def test_perfect_episode_scores_one(tok: Any, difficulty: str) -> None:
    env = HotelEnv(difficulty=difficulty)
    for idx in range(0, len(env.cases), 6):
        model = ScriptedModel(tok, [CONFIRM])
        result = env.run_episode(model, tok, env.solution(idx), idx)
        assert result.score == 1.0, (env.cases[idx].request, result.breakdown)
        assert model.calls == 1  # the confirmation ends the episode
        assert len(result.bookings) == 1 and result.bookings[0]["room_id"] == env.cases[idx].answer
        assert env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, env.solution(idx), idx)["score"] == 1.0


def test_score_episode_returns_the_rubric_breakdown_as_components(tok: Any) -> None:
    from grpo_magic.environment.scores import normalize_score

    env = HotelEnv()
    idx = 3
    search = env.solution_turns(idx)[0]
    wrong = f"{search}\n{book(env, idx, other_rooms(env, idx)[0])}"
    result = env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, wrong, idx)
    assert set(result) == {"score", *RUBRIC}
    assert math.isclose(result["score"], sum(RUBRIC[k] * result[k] for k in RUBRIC), abs_tol=1e-6)
    assert result["search"] == 1.0 and result["correct_room"] == 0.0  # searched, booked the wrong room
    outcome = normalize_score(result)  # what training makes of it: the score, and the parts as components
    assert outcome.score == result["score"] and outcome.error is None and not outcome.warnings
    assert outcome.components == {k: result[k] for k in RUBRIC}


def test_multi_turn_search_then_book(tok: Any) -> None:
    env = HotelEnv(max_turns=3)
    idx = 5
    search, booking, confirm = env.solution_turns(idx)
    model = ScriptedModel(tok, [booking, confirm])
    result = env.run_episode(model, tok, search, idx)
    assert result.score == 1.0, result.breakdown
    assert model.calls == 2 and result.turns == 3
    # The model saw the search results as a tool response, rendered by the chat template.
    assert "<tool_response>" in model.prompts[0] and env.cases[idx].answer in model.prompts[0]
    roles = [m["role"] for m in result.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert json.loads(result.messages[5]["content"])["status"] == "confirmed"


def test_plain_json_calls_count(tok: Any) -> None:
    env = HotelEnv(difficulty="easy")
    case = env.cases[0]
    search = {
        "name": "search_rooms",
        "arguments": {"city": case.city, "check_in": case.check_in, "nights": case.nights},
    }
    args = {"room_id": case.answer, "check_in": case.check_in, "nights": case.nights, "guest_name": case.guest_name}
    booking = {"name": "book_room", "arguments": args}
    completion = f"{json.dumps(search)}\n{json.dumps(booking)}"
    assert env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, completion, 0)["score"] == 1.0


def test_malformed_call_scores_a_little(tok: Any) -> None:
    env = HotelEnv()
    model = ScriptedModel(tok, [CONFIRM])
    broken = '<tool_call>{"name": "search_rooms", "arguments": {"city": "Lisbon", "check_in": </tool_call>'
    score = env.score_episode(model, tok, broken, 0)["score"]
    assert 0 < score < 0.3
    assert model.calls == 0  # no parsable call: the episode ends at once
    assert env.score_episode(model, tok, "Happy to help with your stay!", 0)["score"] == 0.0
    # Well-formed but a made-up tool: a little more than a broken attempt, still low.
    made_up = env.score_episode(model, tok, call("reserve", hotel="any"), 0)["score"]
    assert score < made_up < 0.3


def test_bad_arguments_come_back_as_errors(tok: Any) -> None:
    env = HotelEnv()
    completion = call("book_room", room_id="NOPE-1") + call("search_rooms", city="Atlantis", check_in="x", nights=2)
    result = env.run_episode(ScriptedModel(tok, [CONFIRM]), tok, completion, 0)
    errors = [json.loads(m["content"]) for m in result.messages if m["role"] == "tool"]
    assert len(errors) == 2 and all("error" in e for e in errors)
    assert 0 < result.score < 0.3


def test_wrong_room_scores_less_than_the_right_one(tok: Any) -> None:
    env = HotelEnv()
    # A case where another room meets every constraint but is not the one asked for.
    idx = next(i for i in range(len(env.cases)) if env.cases[i].matches(env.world.by_id[other_rooms(env, i)[0]]))
    search = env.solution_turns(idx)[0]
    right = env.score_episode(
        ScriptedModel(tok, [CONFIRM]), tok, f"{search}\n{book(env, idx, env.cases[idx].answer)}", idx
    )["score"]
    wrong_room = other_rooms(env, idx)[0]
    wrong = env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, f"{search}\n{book(env, idx, wrong_room)}", idx)["score"]
    far_room = other_rooms(env, idx, same_city=False)[0]
    far = env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, f"{search}\n{book(env, idx, far_room)}", idx)["score"]
    search_only = env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, search, idx)["score"]
    assert right == 1.0
    assert far < wrong < right
    assert search_only < wrong


def test_booking_twice_is_penalized(tok: Any) -> None:
    env = HotelEnv()
    idx = 1
    perfect = env.solution(idx)
    twice_same = f"{perfect}\n{book(env, idx, env.cases[idx].answer)}"  # second one fails: taken
    twice_other = f"{perfect}\n{book(env, idx, other_rooms(env, idx)[0])}"
    again_later = ScriptedModel(tok, [book(env, idx, env.cases[idx].answer), CONFIRM])
    same = env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, twice_same, idx)["score"]
    other = env.score_episode(ScriptedModel(tok, [CONFIRM]), tok, twice_other, idx)["score"]
    later = env.score_episode(again_later, tok, perfect, idx)["score"]
    assert same < 1.0 and later < 1.0
    assert other < same  # two rooms held is worse than a refused duplicate


def test_cancel_and_rebook_recovers_most_of_the_credit(tok: Any) -> None:
    env = HotelEnv()
    idx = 1
    search = env.solution_turns(idx)[0]
    first = f"{search}\n{book(env, idx, other_rooms(env, idx)[0])}"
    fix = ScriptedModel(
        tok, [call("cancel_booking", booking_id="BK-001") + book(env, idx, env.cases[idx].answer), CONFIRM]
    )
    result = env.run_episode(fix, tok, first, idx)
    assert [b["room_id"] for b in result.bookings] == [env.cases[idx].answer]
    assert 0.9 <= result.score < 1.0


@pytest.mark.parametrize("max_turns", [1, 2, 4])
def test_max_turns_is_respected(tok: Any, max_turns: int) -> None:
    env = HotelEnv(max_turns=max_turns)
    search = env.solution_turns(0)[0]
    model = ScriptedModel(tok, [search])  # keeps calling tools forever
    result = env.run_episode(model, tok, search, 0)
    assert model.calls == max_turns - 1
    assert result.turns == max_turns
    assert sum(m["role"] == "assistant" for m in result.messages) == max_turns


def test_episodes_do_not_share_state() -> None:
    env = HotelEnv()
    first = env.new_system()
    case = env.cases[0]
    first.book_room(case.answer, case.check_in, case.nights, case.guest_name)
    # A fresh episode still sees the room as free.
    rooms = env.new_system().search_rooms(case.city, case.check_in, case.nights)["rooms"]
    assert case.answer in {r["room_id"] for r in rooms}


def test_concurrent_episodes_match_sequential(tok: Any) -> None:
    env = HotelEnv(difficulty="hard")
    jobs = []
    for idx in range(24):
        search, booking, confirm = env.solution_turns(idx)
        kind = idx % 3
        if kind == 0:
            jobs.append((idx, env.solution(idx), [confirm]))
        elif kind == 1:
            jobs.append((idx, search, [booking, confirm]))
        else:
            jobs.append((idx, f"{search}\n{book(env, idx, other_rooms(env, idx)[0])}", [booking, confirm]))

    def run(job: tuple[int, str, list[str]]) -> float:
        idx, completion, replies = job
        return env.score_episode(ScriptedModel(tok, replies), tok, completion, idx)["score"]

    sequential = [run(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        threaded = list(pool.map(run, jobs * 2))
    assert threaded == sequential * 2
    assert sequential[0] == 1.0 and sequential[1] == 1.0 and sequential[2] < 1.0


# -- the real tiny model -------------------------------------------------------------------------
def test_tiny_model_episode_runs(tiny: tuple[Any, Any]) -> None:
    tokenizer, model = tiny
    env = HotelEnv(max_turns=2, max_new_tokens=32)
    completion = env.solution_turns(0)[0]  # a search, so the model must take turn 2
    with torch.no_grad():
        result = env.run_episode(model, tokenizer, completion, 0)
    assert isinstance(result.score, float) and 0.0 <= result.score <= 1.0
    assert result.turns == 2 and result.messages[-1]["role"] in ("assistant", "tool")
    with torch.no_grad():
        score = env.score_episode(model, tokenizer, "no tool call here", 0)["score"]
    assert score == 0.0
