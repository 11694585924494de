"""HotelAgentEnv: the hotel agent as an agent env (tools as methods on each episode's instance)."""

from __future__ import annotations

import json

import pytest

from envs.hotel_agent import HotelAgentEnv
from envs.hotel_env import RUBRIC
from grpo_magic.environment.agent import agent_spec


def _episode(difficulty: str = "easy"):
    env = HotelAgentEnv(difficulty=difficulty, n_cases=8)
    return env, agent_spec(env, lambda: HotelAgentEnv(difficulty=difficulty, n_cases=8))


def _solution(env: HotelAgentEnv, idx: int) -> tuple[dict, dict]:
    case = env.cases_env.cases[idx]
    search = {"city": case.city, "check_in": case.check_in, "nights": case.nights, "room_type": case.room_type}
    book = {"room_id": case.answer, "check_in": case.check_in, "nights": case.nights, "guest_name": case.guest_name}
    return search, book


@pytest.mark.parametrize("difficulty", ["easy", "normal", "hard"])
def test_the_ideal_episode_scores_one_on_the_instance_that_ran_it(difficulty: str) -> None:
    env, spec = _episode(difficulty)
    assert spec.tool_names == ["book_room", "cancel_booking", "get_room", "search_rooms"]
    for idx in range(3):
        episode = spec.factory()
        episode.reset(case_idx=idx, prompt=[])
        search, book = _solution(env, idx)
        found = json.loads(episode.search_rooms(**search))
        assert any(r["room_id"] == book["room_id"] for r in found["rooms"])
        assert json.loads(episode.book_room(**book))["status"] == "confirmed"
        result = episode._env.score_episode(None, None, "Booked.", case_idx=idx)
        assert result["score"] == 1.0 and set(result) == {"score", *RUBRIC}


def test_tool_errors_are_raised_recorded_and_scored_less() -> None:
    env, spec = _episode()
    episode = spec.factory()
    episode.reset(case_idx=0)
    with pytest.raises(Exception, match="unknown room_id"):
        episode.book_room(room_id="NOPE-1", check_in="2026-03-10", nights=2, guest_name="Ana")
    assert episode._calls[-1].error and "unknown room_id" in episode._calls[-1].error
    result = episode._env.score_episode(None, None, "", case_idx=0)
    assert 0 < result["score"] < 0.2 and result["booked"] == 0.0  # it tried a tool: a little credit


def test_episodes_have_their_own_bookings() -> None:
    env, spec = _episode()
    first, second = spec.factory(), spec.factory()
    for episode in (first, second):
        episode.reset(case_idx=1)
    search, book = _solution(env, 1)
    first.book_room(**book)
    assert first._env.system.active_bookings() and not second._env.system.active_bookings()
    first.reset(case_idx=1)  # TRL reuses an instance for the next episode: reset starts it afresh
    assert not first._env.system.active_bookings()


@pytest.mark.long
def test_hotel_agent_trains_on_tiny_agent_with_its_rubric_as_components(tmp_path) -> None:
    from grpo_magic import GRPOParams, train

    params = GRPOParams(model="tiny-agent", max_steps=1, batch_size=8, rl_num_generations=4, rl_max_new_tokens=64,
                        rl_max_tool_turns=2, project_name=str(tmp_path / "hotel-agent"))
    run = train(params, HotelAgentEnv(difficulty="easy", n_cases=8), display=False)
    assert run.status == "completed", run.reason
    assert {f"components/{name}" for name in RUBRIC} <= set(run.history[-1])
    transcripts = [t for g in run.groups for t in g["transcripts"]]
    assert len(transcripts) == 8 and all(t and t[0]["role"] == "assistant" for t in transcripts)
    tool_turns = [turn for t in transcripts for turn in t if turn["role"] == "tool"]
    # a call the hotel's tools refuse (a bad argument, an unknown room) is a tool error, counted, not a crash
    errors = [turn for turn in tool_turns if turn.get("error")]
    assert all(turn["content"] for turn in tool_turns)
    assert (run.history[-1].get("env/tool_errors", 0) > 0) == bool(errors), (errors, run.history[-1])
