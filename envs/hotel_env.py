"""HotelEnv: a multi-turn, tool-using hotel booking agent (the example env of the seed, made real).

The policy is a booking agent. Each dataset row is a guest's request ("Book the cheapest double
room in Lisbon for 2 nights from 2026-03-10 under 150 per night for Ana Silva"). The agent calls
tools (``search_rooms``, ``get_room``, ``book_room``, ``cancel_booking``) against a small simulated
hotel system; ``score_episode`` runs the tool calls of the completion, feeds the results back,
lets the model continue for up to ``max_turns`` assistant turns, and scores the outcome with
partial credit (see ``RUBRIC``); it returns ``{"score": ..., **breakdown}``, so that each rubric part
is a reward component of its own in the dashboard and ``run.history`` (``components/<part>``).

Design choices worth knowing when you copy this file:

- The world (cities, hotels, rooms, prices, pre-existing reservations) is built once from
  ``seed`` and never changes; each episode gets a fresh ``HotelSystem`` that holds that episode's
  bookings. Nothing mutable is shared, so episodes may run concurrently in threads.
- The env never calls ``model.train()`` / ``model.eval()`` and never imports torch: the trainer
  already puts the model in eval mode under ``torch.no_grad()`` while ``score_episode`` runs.
- ``score_episode`` names a ``generator`` parameter, so grpo_magic passes its generation helper:
  the episode continues on vLLM when the run uses it (HF generate otherwise). Called without one
  (older trainers, tests, plain Python), the env generates with ``model.generate`` itself.
- Tool calls are read in the Qwen/Hermes format ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`` (several per turn allowed) or, when there is no such tag, as plain JSON objects
  ``{"name": ..., "arguments": ...}`` in the text.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

# ---------------------------------------------------------------------------------------------
# Scoring rubric: the one place that says what a good episode is. Weights sum to 1.0, so a
# perfect episode scores exactly 1.0. Components that are fractions (``*_args``, ``constraints``)
# give their weight times the fraction of checks passed.
# ---------------------------------------------------------------------------------------------
RUBRIC: dict[str, float] = {
    # The text tries to call a tool (a <tool_call> tag, or a tool's name), even if unparsable.
    # Gives a broken but recognisable attempt a little signal over plain chat.
    "attempt": 0.05,
    # At least one call parsed into {"name": str, "arguments": object}.
    "well_formed": 0.05,
    # search_rooms was called (the right first tool).
    "search": 0.05,
    # Best search_rooms call: fraction right of city, check_in, nights.
    "search_args": 0.15,
    # A booking exists at the end of the episode.
    "booked": 0.10,
    # That booking (the first one made, if several): fraction right of check_in, nights, guest_name.
    "booking_args": 0.10,
    # The booked room meets the request: fraction of city, room type, budget, amenity that hold
    # (only the ones the case asks for).
    "constraints": 0.15,
    # The booked room is the one the request asks for (cheapest / best-rated matching room).
    "correct_room": 0.25,
    # Exactly one booking at the end: 1.0 when booked in one go, 0.5 when there were failed,
    # repeated or cancelled bookings on the way, 0 when zero or several bookings remain.
    "clean": 0.10,
}
assert abs(sum(RUBRIC.values()) - 1.0) < 1e-9

DIFFICULTIES = ("easy", "normal", "hard")
ROOM_TYPES = ("single", "double", "suite")
AMENITIES = ("breakfast", "balcony", "city_view")
TOOL_NAMES = ("search_rooms", "get_room", "book_room", "cancel_booking")
MAX_CALLS_PER_TURN = 8  # bounds the work a degenerate completion can cause
SEASON_START = date(2026, 3, 1)

CITIES: dict[str, str] = {
    "Lisbon": "LIS",
    "Porto": "OPO",
    "Madrid": "MAD",
    "Barcelona": "BCN",
    "Paris": "PAR",
    "Rome": "ROM",
}
HOTEL_NAMES = (
    "Aurora",
    "Miradouro",
    "Central",
    "Jardim",
    "Riverside",
    "Plaza",
    "Belvedere",
    "Palacio",
    "Colina",
    "Estrela",
    "Marina",
    "Alameda",
    "Lumiere",
    "Tivoli",
)
GUESTS = (
    "Ana Silva",
    "Joao Pereira",
    "Maria Garcia",
    "Luis Fernandez",
    "Claire Martin",
    "Pierre Dubois",
    "Giulia Rossi",
    "Marco Bianchi",
    "Sofia Costa",
    "Diego Lopez",
    "Emma Laurent",
    "Tomas Novak",
)
# Nightly price ranges in tens; every price is 10*k + 9, so a budget "under 150" (always a
# multiple of 10) is never ambiguous.
PRICE_TENS: dict[str, tuple[int, int]] = {"single": (5, 13), "double": (8, 21), "suite": (18, 42)}
AMENITY_TEXT = {"breakfast": "breakfast included", "balcony": "a balcony", "city_view": "a city view"}

SYSTEM_PROMPT = (
    "You are a hotel booking agent. Use the tools to find the room that fits the guest's request, "
    "then book exactly one room. To call a tool, write "
    '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>. '
    "Tool results come back in the next message. When the booking is done, reply with a short "
    "confirmation and no tool call."
)


# ---------------------------------------------------------------------------------------------
# The simulated hotel system
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Room:
    """One bookable room. Immutable: it is shared by every episode."""

    room_id: str
    hotel: str
    city: str
    rating: float
    room_type: str
    price: int
    amenities: tuple[str, ...]
    reserved: frozenset[str]  # nights (ISO dates) already taken before any episode starts

    def describe(self) -> dict[str, Any]:
        return {
            "room_id": self.room_id,
            "hotel": self.hotel,
            "city": self.city,
            "rating": self.rating,
            "room_type": self.room_type,
            "price_per_night": self.price,
            "amenities": list(self.amenities),
        }


@dataclass(frozen=True)
class World:
    """Cities, hotels and rooms, built from a seed. Read-only after construction."""

    rooms: tuple[Room, ...]
    by_id: dict[str, Room]

    @classmethod
    def build(cls, seed: int) -> World:
        rng = random.Random(f"hotel-world-{seed}")
        rooms: list[Room] = []
        for city, code in CITIES.items():
            names = rng.sample(HOTEL_NAMES, 3)
            ratings = rng.sample((3.6, 3.9, 4.1, 4.3, 4.5, 4.7, 4.8), 3)
            used_prices: set[int] = set()
            for h, (name, rating) in enumerate(zip(names, ratings, strict=True), start=1):
                types = ["single", "double", "double", "suite", rng.choice(ROOM_TYPES)]
                for r, room_type in enumerate(sorted(types, key=ROOM_TYPES.index), start=1):
                    lo, hi = PRICE_TENS[room_type]
                    price = 10 * rng.randint(lo, hi) + 9
                    while price in used_prices:  # distinct prices: a unique cheapest room
                        price = 10 * rng.randint(lo, hi) + 9
                    used_prices.add(price)
                    amenities = tuple(a for a, p in zip(AMENITIES, (0.5, 0.4, 0.3), strict=True) if rng.random() < p)
                    reserved: set[str] = set()
                    for _ in range(rng.randint(0, 3)):
                        start = rng.randint(0, 27)
                        for d in range(rng.randint(1, 4)):
                            reserved.add((SEASON_START + timedelta(days=start + d)).isoformat())
                    rooms.append(
                        Room(
                            room_id=f"{code}{h}-{100 * h + r}",
                            hotel=f"Hotel {name}",
                            city=city,
                            rating=rating,
                            room_type=room_type,
                            price=price,
                            amenities=amenities,
                            reserved=frozenset(reserved),
                        )
                    )
        return cls(rooms=tuple(rooms), by_id={room.room_id: room for room in rooms})


def _nights(check_in: date, nights: int) -> list[str]:
    return [(check_in + timedelta(days=i)).isoformat() for i in range(nights)]


class ToolError(Exception):
    """A tool was called with bad arguments; the message goes back to the model."""


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ToolError(f"{name} must be a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.0*)?\s*", value):
        return int(float(value))
    raise ToolError(f"{name} must be a whole number, got {value!r}")


def _as_number(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise ToolError(f"{name} must be a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ToolError(f"{name} must be a number, got {value!r}")


def _as_date(value: Any) -> date:
    try:
        return date.fromisoformat(str(value).strip())
    except ValueError:
        raise ToolError(f"check_in must be a date like 2026-03-10, got {value!r}") from None


def _norm(text: Any) -> str:
    return " ".join(str(text).split()).casefold()


class HotelSystem:
    """The state of one episode: the shared read-only world plus this episode's bookings.

    Each public method is a tool; it returns a JSON-able dict (``{"error": ...}`` on bad input,
    so that the model reads what went wrong instead of the episode crashing).
    """

    def __init__(self, world: World) -> None:
        self.world = world
        self.bookings: dict[str, dict[str, Any]] = {}  # booking_id -> booking, in creation order
        self.cancelled: list[str] = []
        self._taken: dict[str, set[str]] = {}  # room_id -> nights booked in this episode

    # -- helpers -------------------------------------------------------------------------------
    def is_free(self, room: Room, check_in: date, nights: int) -> bool:
        taken = self._taken.get(room.room_id, set())
        return all(n not in room.reserved and n not in taken for n in _nights(check_in, nights))

    def _room(self, room_id: Any) -> Room:
        room = self.world.by_id.get(str(room_id).strip())
        if room is None:
            raise ToolError(f"unknown room_id {room_id!r}; use search_rooms to find room ids")
        return room

    @staticmethod
    def _stay(check_in: Any, nights: Any) -> tuple[date, int]:
        start = _as_date(check_in)
        n = _as_int(nights, "nights")
        if not 1 <= n <= 14:
            raise ToolError("nights must be between 1 and 14")
        return start, n

    # -- tools ---------------------------------------------------------------------------------
    def search_rooms(
        self,
        city: str,
        check_in: str,
        nights: int,
        room_type: str | None = None,
        max_price: float | None = None,
    ) -> dict[str, Any]:
        """Rooms in ``city`` free for every night of the stay, optionally filtered."""
        wanted = _norm(city)
        name = next((c for c in CITIES if c.casefold() == wanted), None)
        if name is None:
            raise ToolError(f"unknown city {city!r}; known cities: {', '.join(CITIES)}")
        start, n = self._stay(check_in, nights)
        kind = None if room_type in (None, "", "any") else _norm(room_type)
        if kind is not None and kind not in ROOM_TYPES:
            raise ToolError(f"room_type must be one of {', '.join(ROOM_TYPES)}")
        cap = None if max_price in (None, "") else _as_number(max_price, "max_price")
        found = [
            {**room.describe(), "total_price": room.price * n}
            for room in self.world.rooms
            if room.city == name
            and (kind is None or room.room_type == kind)
            and (cap is None or room.price <= cap)
            and self.is_free(room, start, n)
        ]
        return {
            "city": name,
            "check_in": start.isoformat(),
            "check_out": (start + timedelta(days=n)).isoformat(),
            "nights": n,
            "rooms": found,
        }

    def get_room(self, room_id: str) -> dict[str, Any]:
        """One room's details and the nights in March 2026 when it is not free."""
        room = self._room(room_id)
        taken = sorted(room.reserved | self._taken.get(room.room_id, set()))
        return {**room.describe(), "unavailable_nights": taken}

    def book_room(self, room_id: str, check_in: str, nights: int, guest_name: str) -> dict[str, Any]:
        """Book a room for a stay; fails when any night is taken."""
        room = self._room(room_id)
        start, n = self._stay(check_in, nights)
        if not str(guest_name).strip():
            raise ToolError("guest_name is required")
        if not self.is_free(room, start, n):
            raise ToolError(f"room {room.room_id} is not available for {n} nights from {start}")
        booking_id = f"BK-{len(self.bookings) + 1:03d}"
        booking = {
            "booking_id": booking_id,
            "room_id": room.room_id,
            "hotel": room.hotel,
            "city": room.city,
            "check_in": start.isoformat(),
            "check_out": (start + timedelta(days=n)).isoformat(),
            "nights": n,
            "guest_name": " ".join(str(guest_name).split()),
            "total_price": room.price * n,
        }
        self.bookings[booking_id] = booking
        self._taken.setdefault(room.room_id, set()).update(_nights(start, n))
        return {"status": "confirmed", **booking}

    def cancel_booking(self, booking_id: str) -> dict[str, Any]:
        """Cancel one of this episode's bookings, freeing its nights."""
        booking = self.bookings.get(str(booking_id).strip())
        if booking is None or booking["booking_id"] in self.cancelled:
            raise ToolError(f"no active booking {booking_id!r}")
        self.cancelled.append(booking["booking_id"])
        start = date.fromisoformat(booking["check_in"])
        self._taken[booking["room_id"]].difference_update(_nights(start, booking["nights"]))
        return {"status": "cancelled", "booking_id": booking["booking_id"]}

    def active_bookings(self) -> list[dict[str, Any]]:
        return [b for b in self.bookings.values() if b["booking_id"] not in self.cancelled]

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Run one tool call; returns (result, ok). Never raises on bad model input."""
        if name not in TOOL_NAMES:
            return {"error": f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}"}, False
        try:
            return getattr(self, name)(**arguments), True
        except ToolError as exc:
            return {"error": str(exc)}, False
        except TypeError as exc:  # missing or unexpected arguments
            message = str(exc).replace("HotelSystem.", "")
            return {"error": f"bad arguments for {name}: {message}"}, False


def tool_schemas() -> list[dict[str, Any]]:
    """OpenAI function-calling schemas of the tools of ``HotelSystem``."""

    def fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": props, "required": required},
            },
        }

    city = {"type": "string", "description": "City name, e.g. Lisbon", "enum": list(CITIES)}
    check_in = {"type": "string", "description": "Check-in date, YYYY-MM-DD"}
    nights = {"type": "integer", "description": "Number of nights", "minimum": 1, "maximum": 14}
    room_id = {"type": "string", "description": "Room id from search_rooms, e.g. LIS1-101"}
    return [
        fn(
            "search_rooms",
            "Find rooms in a city that are free for every night of a stay.",
            {
                "city": city,
                "check_in": check_in,
                "nights": nights,
                "room_type": {"type": "string", "enum": list(ROOM_TYPES)},
                "max_price": {"type": "number", "description": "Highest price per night"},
            },
            ["city", "check_in", "nights"],
        ),
        fn("get_room", "Details of one room and the nights it is not free.", {"room_id": room_id}, ["room_id"]),
        fn(
            "book_room",
            "Book a room for a guest. Book only once per request.",
            {
                "room_id": room_id,
                "check_in": check_in,
                "nights": nights,
                "guest_name": {"type": "string", "description": "Full name of the guest"},
            },
            ["room_id", "check_in", "nights", "guest_name"],
        ),
        fn(
            "cancel_booking",
            "Cancel a booking made earlier in this conversation.",
            {"booking_id": {"type": "string", "description": "e.g. BK-001"}},
            ["booking_id"],
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One guest request and its unique right answer (computed on the episode's initial state)."""

    idx: int
    city: str
    check_in: str
    nights: int
    guest_name: str
    room_type: str
    goal: str  # "cheapest" or "best_rated"
    max_price: int | None
    amenity: str | None
    request: str
    answer: str  # room_id of the room to book

    def matches(self, room: Room) -> bool:
        return (
            room.city == self.city
            and room.room_type == self.room_type
            and (self.max_price is None or room.price < self.max_price)
            and (self.amenity is None or self.amenity in room.amenities)
        )


def best_room(rooms: list[Room], goal: str) -> Room:
    """The room a request asks for among matching free rooms: cheapest, or best-rated then cheapest."""
    if goal == "cheapest":
        return min(rooms, key=lambda r: r.price)
    return min(rooms, key=lambda r: (-r.rating, r.price))


def _plural(n: int) -> str:
    return f"{n} night" if n == 1 else f"{n} nights"


def _make_case(rng: random.Random, world: World, idx: int, difficulty: str) -> Case | None:
    """One random case, or None when this draw has no interesting unique answer (caller redraws)."""
    city = rng.choice(list(CITIES))
    check_in = SEASON_START + timedelta(days=rng.randint(0, 23))
    nights = rng.randint(1, 4)
    guest = rng.choice(GUESTS)
    room_type = rng.choice(ROOM_TYPES)
    system = HotelSystem(world)
    free = [r for r in world.rooms if r.city == city and system.is_free(r, check_in, nights)]
    typed = [r for r in free if r.room_type == room_type]
    if len(typed) < 2:  # the choice should matter
        return None

    amenity = None
    if difficulty == "hard":
        amenity = rng.choice(("breakfast", "balcony"))
        with_amenity = [r for r in typed if amenity in r.amenities]
        # The amenity must matter: the cheapest room of that type lacks it.
        if not with_amenity or best_room(typed, "cheapest") in with_amenity:
            return None
        typed = with_amenity

    goal, max_price = "cheapest", None
    if difficulty != "easy":
        goal = rng.choice(("cheapest", "best_rated"))
        if goal == "best_rated":
            # The budget must matter: it rules out the best-rated room of the type.
            top = best_room(typed, "best_rated")
            cheaper = [r for r in typed if r.price < top.price]
            if not cheaper:
                return None
            max_price = (rng.choice(cheaper).price // 10 + 1) * 10
        else:
            max_price = (best_room(typed, "cheapest").price // 10 + 1 + rng.choice((0, 1, 3))) * 10
    candidates = [r for r in typed if max_price is None or r.price < max_price]
    answer = best_room(candidates, goal)

    stay = f"{_plural(nights)} from {check_in.isoformat()}"
    if difficulty == "easy":
        request = f"Book the cheapest {room_type} room in {city} for {stay} for {guest}."
    elif goal == "cheapest":
        request = f"Book the cheapest {room_type} room in {city} for {stay} under {max_price} per night for {guest}."
    else:
        request = (
            f"Book a {room_type} room in {city} for {stay} for {guest}: the best-rated hotel that has "
            f"one under {max_price} per night (the cheapest such room there)."
        )
    if difficulty == "hard":
        other = rng.choice([c for c in CITIES if c != city])
        distractor = rng.choice(
            (
                f"Last time I was in {other} I paid {rng.randint(9, 30) * 10} a night for a suite, way too much.",
                f"My colleague is staying in {other} that week, but this booking is only for {guest}.",
                f"Ignore the newsletter offering 20% off suites in {other}.",
            )
        )
        want = f"with {AMENITY_TEXT[amenity or '']}"
        if goal == "cheapest":
            ask = f"the cheapest {room_type} room {want} in {city}, under {max_price} per night"
        else:
            ask = (
                f"a {room_type} room {want} in {city} under {max_price} per night, in the best-rated "
                "hotel that has one (the cheapest such room there)"
            )
        request = f"{distractor} Please book {ask}, {stay}. Guest: {guest}."
    return Case(
        idx=idx,
        city=city,
        check_in=check_in.isoformat(),
        nights=nights,
        guest_name=guest,
        room_type=room_type,
        goal=goal,
        max_price=max_price,
        amenity=amenity,
        request=request,
        answer=answer.room_id,
    )


# ---------------------------------------------------------------------------------------------
# Parsing tool calls
# ---------------------------------------------------------------------------------------------
@dataclass
class ParsedTurn:
    """The tool calls found in one assistant turn."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    attempted: bool = False  # something that looks like a tool call, parsable or not


_TAG_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_NAME_RE = re.compile("|".join(TOOL_NAMES))


def _as_call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """{"name": str, "arguments": {...}} (or "parameters", or arguments as a JSON string) -> call."""
    if not isinstance(obj, dict):
        return None
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI style
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    return name.strip(), args


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON object embedded in ``text``, left to right."""
    decoder = json.JSONDecoder()
    found, pos = [], text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        found.append(obj)
        pos = text.find("{", end)
    return found


def parse_tool_calls(text: str) -> ParsedTurn:
    """Tool calls in a turn: ``<tool_call>`` tags if any, else plain ``{"name", "arguments"}`` JSON."""
    turn = ParsedTurn(attempted=bool(_NAME_RE.search(text)) or "<tool_call>" in text)
    bodies = _TAG_RE.findall(text)
    if bodies:
        for body in bodies:
            body = body.strip()
            try:
                call = _as_call(json.loads(body))
            except ValueError:
                objs = _json_objects(body)  # tolerate stray text around the JSON
                call = _as_call(objs[0]) if objs else None
            if call is not None:
                turn.calls.append(call)
    else:
        turn.calls = [c for c in map(_as_call, _json_objects(text)) if c is not None]
    if turn.calls:
        turn.attempted = True
    return turn


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
@dataclass
class CallRecord:
    """One executed tool call, for scoring and for showing an episode."""

    turn: int
    name: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    ok: bool


@dataclass
class EpisodeResult:
    """Everything an episode did: the score, its rubric breakdown, the conversation, the calls."""

    score: float
    breakdown: dict[str, float]
    messages: list[dict[str, Any]]
    calls: list[CallRecord]
    turns: int
    bookings: list[dict[str, Any]]


class HotelEnv:
    """Hotel booking agent env. ``rl_env_config`` keys: max_turns, difficulty, seed, n_cases, max_new_tokens."""

    def __init__(
        self,
        max_turns: int = 3,
        difficulty: str = "normal",
        seed: int = 0,
        n_cases: int = 48,
        max_new_tokens: int = 64,
    ) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTIES)}; got {difficulty!r}")
        if int(max_turns) < 1:
            raise ValueError(f"max_turns must be at least 1; got {max_turns!r}")
        if int(n_cases) < 1:
            raise ValueError(f"n_cases must be at least 1; got {n_cases!r}")
        self.max_turns = int(max_turns)
        self.difficulty = difficulty
        self.seed = int(seed)
        self.max_new_tokens = int(max_new_tokens)
        self.world = World.build(self.seed)
        rng = random.Random(f"hotel-cases-{self.seed}-{difficulty}")
        cases: list[Case] = []
        while len(cases) < int(n_cases):
            case = _make_case(rng, self.world, len(cases), difficulty)
            if case is not None:
                cases.append(case)
        self.cases: tuple[Case, ...] = tuple(cases)

    # -- the env contract ----------------------------------------------------------------------
    def build_dataset(self, tokenizer: Any = None) -> Any:
        """Chat prompts (system + user request) and ``case_idx``; the trainer renders the tools in."""
        from datasets import Dataset

        return Dataset.from_dict(
            {
                "prompt": [self.prompt(i) for i in range(len(self.cases))],
                "case_idx": list(range(len(self.cases))),
            }
        )

    def get_tools(self) -> list[dict[str, Any]]:
        return tool_schemas()

    def score_episode(
        self, model: Any, tokenizer: Any, completion: str, case_idx: int, generator: Any = None
    ) -> dict[str, float]:
        """Run the episode that starts with ``completion``; its score (0..1) and the ``RUBRIC`` breakdown.

        ``{"score": ..., "attempt": ..., "search": ..., ...}``: every rubric part's fraction in [0, 1]
        is a reward component, shown on its own curve and card line (``score`` is their weighted sum).
        """
        result = self.run_episode(model, tokenizer, completion, case_idx, generator=generator)
        return {"score": result.score, **result.breakdown}

    # -- helpers for users, tests and teaching -------------------------------------------------
    def prompt(self, case_idx: int) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.cases[int(case_idx)].request},
        ]

    def new_system(self) -> HotelSystem:
        """A fresh hotel system for one episode (no bookings yet)."""
        return HotelSystem(self.world)

    def solution_turns(self, case_idx: int) -> list[str]:
        """The ideal episode as assistant turns: search, book, confirm."""
        case = self.cases[int(case_idx)]
        search: dict[str, Any] = {"city": case.city, "check_in": case.check_in, "nights": case.nights}
        search["room_type"] = case.room_type
        if case.max_price is not None:
            search["max_price"] = case.max_price
        book = {
            "room_id": case.answer,
            "check_in": case.check_in,
            "nights": case.nights,
            "guest_name": case.guest_name,
        }
        room = self.world.by_id[case.answer]
        return [
            _tool_call_text("search_rooms", search),
            _tool_call_text("book_room", book),
            (
                f"Booked room {room.room_id} at {room.hotel} in {room.city} for {case.guest_name}, "
                f"{_plural(case.nights)} from {case.check_in} at {room.price} per night."
            ),
        ]

    def solution(self, case_idx: int) -> str:
        """The ideal first completion: search and book in one turn (the booking needs no lookup)."""
        search, book, _ = self.solution_turns(case_idx)
        return f"{search}\n{book}"

    def run_episode(
        self, model: Any, tokenizer: Any, completion: str, case_idx: int, generator: Any = None
    ) -> EpisodeResult:
        """Execute tool calls, feed results back, let the model continue (with ``generator`` if given); then score."""
        case = self.cases[int(case_idx)]
        system = self.new_system()
        messages: list[dict[str, Any]] = [*self.prompt(case.idx)]
        records: list[CallRecord] = []
        attempted = False
        text, turn = completion, 1
        while True:
            messages.append({"role": "assistant", "content": text})
            parsed = parse_tool_calls(text)
            attempted = attempted or parsed.attempted
            for name, args in parsed.calls[:MAX_CALLS_PER_TURN]:
                result, ok = system.call(name, args)
                records.append(CallRecord(turn, name, args, result, ok))
                messages.append({"role": "tool", "content": json.dumps(result)})
            if not parsed.calls or turn >= self.max_turns:
                break
            text = self._generate(model, tokenizer, messages, generator)
            if text is None:  # the conversation no longer fits the model's context
                break
            turn += 1
        breakdown = score_breakdown(case, system, records, attempted)
        score = sum(RUBRIC[k] * v for k, v in breakdown.items())
        return EpisodeResult(
            score=min(1.0, max(0.0, round(score, 6))),
            breakdown=breakdown,
            messages=messages,
            calls=records,
            turns=turn,
            bookings=system.active_bookings(),
        )

    def _generate(
        self, model: Any, tokenizer: Any, messages: list[dict[str, Any]], generator: Any = None
    ) -> str | None:
        """The model's next assistant turn as text (sampled), or None when it would not fit."""
        text = tokenizer.apply_chat_template(
            messages, tools=self.get_tools(), add_generation_prompt=True, tokenize=False
        )
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        n_in = enc["input_ids"].shape[1]
        context = getattr(generator, "context_length", None)
        limit = context() if callable(context) else getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if isinstance(limit, int) and n_in + self.max_new_tokens > limit:
            return None
        if generator is not None:  # the same rendered prompt, on vLLM when the run has it
            return generator.generate(text, max_new_tokens=self.max_new_tokens)
        device = _device_of(model)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        out = model.generate(
            input_ids=enc["input_ids"].to(device),
            attention_mask=enc["attention_mask"].to(device),
            max_new_tokens=self.max_new_tokens,
            do_sample=True,
            pad_token_id=pad,
        )
        return _decode_reply(tokenizer, out[0, n_in:].tolist())


def _tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _device_of(model: Any) -> Any:
    device = getattr(model, "device", None)
    if device is None:
        device = next(model.parameters()).device
    return device


def _decode_reply(tokenizer: Any, ids: list[int]) -> str:
    """Text of the generated ids up to the end of the turn, keeping tool-call markup tokens.

    The same as ``grpo_magic.environment.generation.decode_reply``, kept here on purpose: an example env is a plain
    module a user could write, so it imports nothing from grpo_magic.
    """
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    vocab = tokenizer.get_vocab()
    stop.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab)
    stop.discard(None)
    for i, token_id in enumerate(ids):
        if token_id in stop:
            ids = ids[:i]
            break
    text = tokenizer.decode(ids, skip_special_tokens=False)
    for special in tokenizer.all_special_tokens:
        if "tool_call" not in special:
            text = text.replace(special, "")
    return text.strip()


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------
def score_breakdown(case: Case, system: HotelSystem, records: list[CallRecord], attempted: bool) -> dict[str, float]:
    """Each ``RUBRIC`` component as a fraction in [0, 1] for one finished episode."""
    parts = dict.fromkeys(RUBRIC, 0.0)
    parts["attempt"] = float(attempted or bool(records))
    parts["well_formed"] = float(bool(records))

    searches = [r for r in records if r.name == "search_rooms"]
    parts["search"] = float(bool(searches))
    for rec in searches:
        args = rec.arguments
        right = [
            _norm(args.get("city", "")) == _norm(case.city),
            str(args.get("check_in", "")).strip() == case.check_in,
            _int_or_none(args.get("nights")) == case.nights,
        ]
        parts["search_args"] = max(parts["search_args"], sum(right) / len(right))

    active = system.active_bookings()
    if active:
        booking = active[0]
        room = system.world.by_id[booking["room_id"]]
        parts["booked"] = 1.0
        right = [
            booking["check_in"] == case.check_in,
            booking["nights"] == case.nights,
            _norm(booking["guest_name"]) == _norm(case.guest_name),
        ]
        parts["booking_args"] = sum(right) / len(right)
        checks = [room.city == case.city, room.room_type == case.room_type]
        if case.max_price is not None:
            checks.append(room.price < case.max_price)
        if case.amenity is not None:
            checks.append(case.amenity in room.amenities)
        parts["constraints"] = sum(checks) / len(checks)
        parts["correct_room"] = float(room.room_id == case.answer)
        book_calls = [r for r in records if r.name == "book_room"]
        if len(active) == 1:
            parts["clean"] = 1.0 if len(book_calls) == 1 and not system.cancelled else 0.5
    return parts


def _int_or_none(value: Any) -> int | None:
    try:
        return _as_int(value, "nights")
    except ToolError:
        return None
