"""HotelAgentEnv: the hotel booking agent as an *agent env*, whose whole episode the trainer runs.

The same world, cases and rubric as ``envs.hotel_env.HotelEnv`` (the seed-style variant, which runs
the tool calls inside ``score_episode`` and trains only the first completion). Here the env has a
``reset`` method and its tools are plain methods with type hints and docstrings: the trainer (TRL's
tool loop, through grpo_magic) makes one instance per rollout, calls ``reset(**row)``, executes every
tool call the model writes on that instance, feeds the result back and lets the model continue; all
the assistant turns are trained, tool results are not. Afterwards ``score_episode`` runs on the same
instance and reads its state (the bookings made, the calls seen) to score the episode with
``RUBRIC``, returning the breakdown too.

Like every example env it imports nothing from grpo_magic: this is the whole contract.
"""

from __future__ import annotations

import json
from typing import Any

from envs.hotel_env import (
    DIFFICULTIES,
    RUBRIC,
    SYSTEM_PROMPT,
    CallRecord,
    HotelEnv,
    HotelSystem,
    ToolError,
    score_breakdown,
)

AGENT_SYSTEM_PROMPT = SYSTEM_PROMPT.replace(
    'To call a tool, write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>. ', ""
)


class HotelAgentEnv:
    """Hotel booking agent env with per-episode state. ``rl_env_config`` keys: difficulty, seed, n_cases."""

    def __init__(self, difficulty: str = "normal", seed: int = 0, n_cases: int = 48) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTIES)}; got {difficulty!r}")
        self.cases_env = HotelEnv(difficulty=difficulty, seed=seed, n_cases=n_cases)  # the same cases and world
        self.system: HotelSystem | None = None
        self.records: list[CallRecord] = []
        self.case_idx = 0

    # -- the env contract ----------------------------------------------------------------------
    def build_dataset(self, tokenizer: Any = None) -> Any:
        """Chat prompts (system + user request) and ``case_idx``; the trainer renders the tools in."""
        from datasets import Dataset

        cases = self.cases_env.cases
        return Dataset.from_dict({
            "prompt": [[{"role": "system", "content": AGENT_SYSTEM_PROMPT},
                        {"role": "user", "content": case.request}] for case in cases],
            "case_idx": [case.idx for case in cases],
        })

    def reset(self, case_idx: int, **row: Any) -> None:
        """A fresh hotel system for this episode: no bookings yet, no calls seen."""
        self.case_idx = int(case_idx)
        self.system = self.cases_env.new_system()
        self.records = []

    def score_episode(self, model: Any, tokenizer: Any, completion: str, case_idx: int,
                      messages: list[dict[str, Any]] | None = None) -> dict[str, float]:
        """The rubric on what this episode did: its calls and the bookings left at the end."""
        assert self.system is not None, "reset() runs before every episode"
        case = self.cases_env.cases[int(case_idx)]
        attempted = bool(self.records) or any(
            "<tool_call>" in str(m.get("content", "")) or m.get("tool_calls")
            for m in messages or [] if m.get("role") == "assistant")
        breakdown = score_breakdown(case, self.system, self.records, attempted)
        score = min(1.0, max(0.0, round(sum(RUBRIC[k] * v for k, v in breakdown.items()), 6)))
        return {"score": score, **breakdown}

    # -- the tools (each call runs on this episode's hotel system) ---------------------------
    def search_rooms(self, city: str, check_in: str, nights: int, room_type: str | None = None,
                     max_price: float | None = None) -> str:
        """Find rooms in a city that are free for every night of a stay.

        Args:
            city: City name, e.g. Lisbon.
            check_in: Check-in date, YYYY-MM-DD.
            nights: Number of nights, 1 to 14.
            room_type: single, double or suite (optional).
            max_price: Highest price per night (optional).
        """
        return self._call("search_rooms", city=city, check_in=check_in, nights=nights, room_type=room_type,
                          max_price=max_price)

    def get_room(self, room_id: str) -> str:
        """Details of one room and the nights it is not free.

        Args:
            room_id: Room id from search_rooms, e.g. LIS1-101.
        """
        return self._call("get_room", room_id=room_id)

    def book_room(self, room_id: str, check_in: str, nights: int, guest_name: str) -> str:
        """Book a room for a guest. Book only once per request.

        Args:
            room_id: Room id from search_rooms, e.g. LIS1-101.
            check_in: Check-in date, YYYY-MM-DD.
            nights: Number of nights.
            guest_name: Full name of the guest.
        """
        return self._call("book_room", room_id=room_id, check_in=check_in, nights=nights, guest_name=guest_name)

    def cancel_booking(self, booking_id: str) -> str:
        """Cancel a booking made earlier in this conversation.

        Args:
            booking_id: The booking id, e.g. BK-001.
        """
        return self._call("cancel_booking", booking_id=booking_id)

    def _call(self, name: str, **arguments: Any) -> str:
        """Run one tool on this episode's system; a bad call raises, and the trainer shows the model the error."""
        assert self.system is not None, "reset() runs before every episode"
        arguments = {k: v for k, v in arguments.items() if v is not None}
        try:
            result = getattr(self.system, name)(**arguments)
        except ToolError as exc:
            self.records.append(CallRecord(len(self.records) + 1, name, arguments, {"error": str(exc)}, False))
            raise
        self.records.append(CallRecord(len(self.records) + 1, name, arguments, result, True))
        return json.dumps(result)
