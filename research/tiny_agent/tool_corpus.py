"""A generated corpus of tool-use chats: what ``tiny-agent`` v2 (models/tiny_agent.py), a general offline tool
caller, is fine-tuned on (issue 25).

``tiny-agent`` v1 knew two tools, ``get_weather`` and ``get_time``: it worked for envs/weather_agent.py and for no
env a user wrote. This corpus makes the model *read the offered schemas and the request* rather than remember
tools:

- tool names (``verb`` or ``verb_noun``), descriptions and argument names drawn at random from lists of
  made-up words of English spelling (``pseudo_words``: the tokenizer cuts them as it cuts English names);
  ``HELD_OUT_VERBS``, ``HELD_OUT_NOUNS`` and ``HELD_OUT_ARGS`` (English words) are never used, so that envs
  named from them (tests/agent_cells.py) test reading, not memory;
- requests that name the tool in quotes and give each argument's name then its value as the call's JSON
  writes it, separated by commas where the call's JSON has them and ending with the last value
  (``tool_request``: ``Use the "add" tool with a 3, b 4``);
- 1 to 3 tools offered (``TOOL_COUNTS``), the one the request names among distractors; 0 to 2 arguments
  (``ARG_COUNTS``; the generator takes up to 3) of the JSON-schema types TRL derives from type hints
  (integer, number, boolean, string, ``Literal`` enum), rendered exactly as ``get_json_schema`` renders a
  typed, documented method (a test compares); each value is in the request and copied into the call;
- shares of chats needing two calls in a row (the second tool takes the first one's result), needing none
  (answered directly), and v1's weather and time questions; then the tool's result and a one-line answer;
- a teacher that answers after the first call in ``EARLY_STOP_SHARE`` of the two-call chats, to leave GRPO when
  to stop (it can also call a distractor in ``WRONG_TOOL_SHARE`` of the chats that have one: 0, see below).

``check`` measures a model on held-out-name chats (first reply, greedy and sampled): calls that parse, to
an offered tool with arguments of its types, to the right tool with the right arguments.

How it came to this (measured here, on a 2-core machine shared by other jobs, one torch thread):
``tiny`` (64 wide, 2 layers) after 300 SFT steps of 16 chats (1-4 tools, 0-3 arguments; 269 s of CPU) and
after 600 steps of 8 (1-3 tools, 0-2 arguments; 208 s) wrote well-formed calls (parsed 0.42 and 0.95 of
held-out chats) but never to an offered tool: it names tools from its corpus ("pick_weight"); resized to
128 wide and 4 layers (``RECIPE.sizes``), 450 steps of 8 (157 s): parsed 0.68, offered with the schema's
types 0.135, right 0.0 greedy (0.027 sampled); 1500 steps (479 s of CPU): parsed 1.0, offered 0.135, right
0.081, the loss still falling (0.42). Copying unseen multi-token names only begins long past a build budget
of minutes. Random pseudo-word names (nothing to remember) with quoted names in the requests (the same tokens
as in the schema) did no better in 450 steps (0.185, the weather share); with the loss on the whole chat
(each name seen three times) and 1,500 steps, the model copies: 0.42 offered with the schema's types, 0.30
right, greedy, from 3 to 7 times the build budget (research/tiny_agent/agent_sft_probe.py, research/tiny_agent/RESULTS-agent.md). A copy
circuit set by hand in the weights (research/tiny_agent/induction_circuit.py) that matches on two previous tokens copies
held-out names at step 0 as well as those runs did after 1,500 steps; fine-tuned from it, the model names the
tools and arguments right but invents the values, which the requests spell differently (same file).

``RECIPE`` now starts from ``copy_circuit`` (a three-token match that finds the first token of a tool's
and an argument's name, two heads that copy a value from the request, a head that marks user turns and the
parts not to copy from, a layer of tool bags so that a call's arguments are the called tool's, a head that
copies a chain's first result into its second call, and one that starts a call's name with the tool the request
names), frozen, and fine-tunes layers 3 and 4 for 300 steps of 8 chats on two threads, the learning rate
decaying from 2e-3 to 0; ``sharpen`` then doubles its logits. The teacher is clean: the distractor it used to
call in 30% of the chats with one (``WRONG_TOOL_SHARE``) took values from nowhere, and the fine-tunes learned to
end calls where the request did not. A two-step request names the outer tool first (``Use "b" on the result of
"a" with x 3``), so that the first call's values end the request and the circuit ends the call there. Measured
(research/tiny_agent/RESULTS-agent.md, 2026-12-03, third part), right calls sampled at temperature 1 with the logits doubled,
on the one-integer, two-argument, enum and three-tool envs: seed 0 1.0 / 0.78 / 1.0 / 0.25 (held-out check:
offered with the schema's types 0.64, right 0.56; the two-step env's first call right 1.0), seed 1 0.97 / 0.59 /
0.47 / 0.59 (0.61, 0.52; 0.75). Registered as ``tiny-agent`` v2 with seed 0; v2.1 reads the same chats in
length-grouped batches (a build of 170 s instead of 300, research/tiny_agent/RESULTS-agent.md, "v2.1"). After a chain's first
result, fine-tuned from the four-head circuit, it answered instead of calling the second tool; v2.2 starts from
the circuit with layer 2's chain heads (``circuit_start``), which make that call (research/tiny_agent/RESULTS-agent.md, "the
second call"). What it does not do yet: two offered names that begin alike tie at their second token
(``bake_lemon``, ``borrow_violin``: v2.2 writes the second for both).
"""

from __future__ import annotations

import json
import random
from typing import Any

from grpo_magic.environment.agent import fits_schema
from grpo_magic.models.warmstart import Example

#: v1's weather and time questions (envs/weather_agent.py's), a share of the corpus: cities that are one token in
#: ``tiny``'s vocabulary; the tool a question asks for is called in only ``RIGHT_TOOL_SHARE`` of them (the other
#: one in the rest), so that which of the two a question needs is left to GRPO (tests/test_agent.py).
AGENT_CITIES = ("Paris", "Madrid", "London", "Rome", "Berlin", "Tokyo", "Lima", "Oslo")
WEATHER = ("sunny", "rainy", "snowy", "cloudy", "windy")
WEATHER_QUESTIONS = ("What is the weather in {c}?", "How is the weather in {c} today?", "Weather in {c}?",
                     "Is it raining in {c}?")
TIME_QUESTIONS = ("What time is it in {c}?", "Local time in {c}?", "What is the time in {c} now?")
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
    """The weather chats' function schemas, derived as TRL derives them for an agent env's methods."""
    from transformers.utils import get_json_schema

    return [get_json_schema(get_weather), get_json_schema(get_time)]


#: English spelling in pieces: a word is one to three syllables (an onset, a nucleus, and on the last one, or now and
#: then on another, a coda), so that tiny's vocabulary spells it as it spells English words (``ate``, ``row``,
#: ``lin``, ``er``: 0.39 of the tokens of 3,000 such names are of more than one letter, 0.37 of the held-out
#: names', 0.19 of the consonant-vowel words that came before, which never held ``ate``, ``row`` nor ``lin``).
_ONSETS = tuple("b c d f g h j k l m n p r s t v w z br cr dr gr pr tr st sp sh ch th pl bl cl fl gl sl qu sc sn wh"
                .split()) + ("",) * 4
_NUCLEI = tuple("a e i o u a e i o ea ou oo ai ee ow ay ie".split())
_CODAS = tuple("n r t s l d m ng st ck ll nd rt ve te ne le se ce ge der ter er ate ine ow ing ent ist ord ell "
               "ook ight ure ous ous able ry ly ty son ton ment ness".split()) + ("",) * 12  # (ous twice, as measured)


def pseudo_words(seed: int, n: int) -> tuple[str, ...]:
    """``n`` pronounceable made-up words of English spelling (``"blaister"``, ``"quoment"``), none in the held-out
    lists: names the model cannot have met, so that calling them right means reading them from the prompt, and
    spelled in the same tokens as the English names of the envs it is tried on (see ``_ONSETS``). Why it matters:
    fine-tuned on consonant-vowel words (``"sejmu"``), the model broke held-out names on the tokens it had not
    seen in a name (``bestsrow_violin``) and, one seed in two, the JSON around them (research/tiny_agent/RESULTS-agent.md)."""
    held = set(HELD_OUT_VERBS + HELD_OUT_NOUNS + HELD_OUT_ARGS)
    rng, out = random.Random(seed), set()
    while len(out) < n:
        k = rng.randint(1, 3)
        word = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI)
                       + (rng.choice(_CODAS) if i == k - 1 or rng.random() < 0.3 else "") for i in range(k))
        if 3 <= len(word) <= 11 and word not in held:
            out.add(word)
    return tuple(sorted(out))


# Names in the corpus are drawn from generated words; the HELD_OUT_* lists (English words) are never used
# by the corpus: envs named from them test that the model reads schemas, not memory.
HELD_OUT_VERBS = ("add", "guess", "convert", "multiply", "reserve", "weigh", "paint", "borrow", "greet", "bake",
                  "rotate", "encode")
HELD_OUT_NOUNS = ("sum", "secret", "currency", "grade", "parcel", "garden", "ladder", "violin", "harbor",
                  "blanket", "lemon", "tunnel")
HELD_OUT_ARGS = ("base", "factor", "guess", "shade", "owner", "origin", "volume", "minutes", "grams", "pet",
                 "floor", "flavor")
#: Values of string and enum arguments (strings the request gives and the call copies).
STRING_VALUES = (
    "Paris", "Madrid", "London", "Rome", "Berlin", "Tokyo", "Lima", "Oslo", "red", "green", "blue", "black",
    "white", "apple", "banana", "cherry", "orange", "water", "tea", "fast", "slow", "high", "low", "small",
    "large", "north", "south", "east", "west", "cat", "dog", "fish", "bird", "alpha", "beta", "gold", "silver",
    "summer", "winter", "monday", "friday", "jazz", "rock", "piano", "guitar", "chess", "tennis", "bread",
    "rice", "salt", "sugar", "stone", "glass", "paper", "wood", "iron", "music", "story", "hello", "world",
)
VERBS, NOUNS, ARGS = pseudo_words(1, 3000), pseudo_words(2, 3000), pseudo_words(3, 3000)
TYPES = ("integer", "number", "boolean", "string", "enum")

#: Share of the chats with a distractor in which a noisy teacher would call a distractor (with arguments of its own,
#: not in the request). None: at 0.3 it taught the model to end a call where the request's values did not
#: (two-argument calls ended after the first value; research/tiny_agent/RESULTS-agent.md, 2026-12-03, third part), and which
#: offered tool fits is left imperfect by the fine-tune itself (measured there).
WRONG_TOOL_SHARE = 0.0
#: Share of the two-call chats in which the teacher answers after the first call.
EARLY_STOP_SHARE = 0.3
#: Shares of chats needing no call and two calls, and of v1's weather and time questions (the rest need one call).
NO_CALL_SHARE, TWO_CALL_SHARE, WEATHER_SHARE = 0.12, 0.18, 0.15
CORPUS_SIZE = 6000
#: How many tools a chat offers, and how many arguments a tool takes (drawn uniformly from these).
TOOL_COUNTS = (1, 2, 2, 3)
ARG_COUNTS = (0, 1, 1, 2)

# A request names its tool in quotes and ends with its last value (after ``grams 41.`` a model cannot tell an
# integer's end from a number's decimal point).
_TOOL_REQUESTS = ('Use the "{tool}" tool{args}', 'Call "{tool}"{args}', 'Please run "{tool}"{args}',
                  'Use "{tool}"{args}')
# A two-step request names the outer tool first and ends with the inner one's values, so that its first call ends
# where the request does (the copy circuit calls the last named tool first, then the first).
_CHAINS = ('Use "{t2}" on the result of "{t1}"{args}', 'Call "{t2}" with what "{t1}" returns{args}')
_ANSWERS = ("The result is {r}.", "Done: {r}.", "It is {r}.")
_DIRECT = (("Hello!", "Hello! How can I help?"), ("Hi there.", "Hi! How can I help?"),
           ("Thank you.", "You are welcome."), ("Say {w}.", "{w}."), ("Repeat the word {w}.", "{w}."),
           ("What is {w} in one word?", "{w}."))


def _schema(name: str, description: str, params: list[tuple[str, str, list[str] | None]]) -> dict[str, Any]:
    """A function schema as ``transformers.utils.get_json_schema`` writes one for a typed, documented method."""
    properties: dict[str, Any] = {}
    for arg, kind, options in params:
        prop: dict[str, Any] = {"type": "string" if kind == "enum" else kind}
        if kind == "enum":
            prop["enum"] = list(options or [])
        prop["description"] = f"The {arg}."
        properties[arg] = prop
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if params:
        parameters["required"] = [arg for arg, _, _ in params]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters,
                                             "return": {"type": "string"}}}


class _Corpus:
    """One seeded draw of tools, requests and teacher replies (``tool_use_corpus``)."""

    def __init__(self, rng: random.Random, verbs: tuple[str, ...] = VERBS, nouns: tuple[str, ...] = NOUNS,
                 args: tuple[str, ...] = ARGS) -> None:
        self.rng, self.verbs, self.nouns, self.args = rng, verbs, nouns, args

    def tool(self, used: set[str], nargs: int | None = None, kinds: tuple[str, ...] = TYPES) -> dict[str, Any]:
        rng = self.rng
        while True:
            verb, noun = rng.choice(self.verbs), rng.choice(self.nouns)
            name = verb if rng.random() < 0.2 else f"{verb}_{noun}"
            if name not in used:
                used.add(name)
                break
        n = rng.choice(ARG_COUNTS) if nargs is None else nargs
        params = []
        for arg in rng.sample(self.args, n):
            kind = rng.choice(kinds)
            options = rng.sample(STRING_VALUES, rng.randint(2, 4)) if kind == "enum" else None
            params.append((arg, kind, options))
        description = f"{verb.capitalize()} the {noun}." if "_" in name else f"{verb.capitalize()} something."
        return {"name": name, "params": params, "schema": _schema(name, description, params)}

    def value(self, kind: str, options: list[str] | None) -> Any:
        rng = self.rng
        if kind == "integer":
            return rng.randint(0, 99)
        if kind == "number":
            return rng.randint(0, 99) + rng.choice((0.5, 0.25, 0.1, 0.75))
        if kind == "boolean":
            return rng.random() < 0.5
        return rng.choice(options) if kind == "enum" and options else rng.choice(STRING_VALUES)

    def arguments(self, tool: dict[str, Any]) -> dict[str, Any]:
        return {arg: self.value(kind, options) for arg, kind, options in tool["params"]}

    def result(self) -> str:
        rng = self.rng
        return str(rng.randint(0, 999)) if rng.random() < 0.5 else rng.choice(STRING_VALUES)

    def chat(self) -> Example:
        rng = self.rng
        kind = rng.random()
        if kind < NO_CALL_SHARE:
            return self.direct()
        if kind < NO_CALL_SHARE + TWO_CALL_SHARE:
            return self.two_calls()
        if kind < NO_CALL_SHARE + TWO_CALL_SHARE + WEATHER_SHARE:
            return self.weather()
        return self.one_call()

    def weather(self) -> Example:
        """v1's chats (envs/weather_agent.py's questions): get_weather or get_time, the right one half the time."""
        rng = self.rng
        city = rng.choice(AGENT_CITIES)
        asks_weather = rng.random() < 0.5
        question = rng.choice(WEATHER_QUESTIONS if asks_weather else TIME_QUESTIONS).format(c=city)
        weather_tool = asks_weather == (rng.random() < RIGHT_TOOL_SHARE)
        tool = "get_weather" if weather_tool else "get_time"
        result = (f"{rng.choice(WEATHER)} in {city}" if weather_tool
                  else f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} in {city}")
        return {"tools": agent_tools(), "expected": {"name": "get_weather" if asks_weather else "get_time",
                                                     "arguments": {"city": city}}, "messages": [
            {"role": "user", "content": question},
            _call(tool, {"city": city}),
            {"role": "tool", "name": tool, "content": result},
            {"role": "assistant", "content": f"It is {result}."},
        ]}

    def offered(self, needed: list[dict[str, Any]], used: set[str]) -> list[dict[str, Any]]:
        """The needed tools among 0-3 distractors, in a random order."""
        extra = max(0, self.rng.choice(TOOL_COUNTS) - len(needed))
        tools = needed + [self.tool(used) for _ in range(extra)]
        self.rng.shuffle(tools)
        return tools

    def direct(self) -> Example:
        rng = self.rng
        used: set[str] = set()
        tools = self.offered([], used) or [self.tool(used)]
        request, answer = rng.choice(_DIRECT)
        word = rng.choice(STRING_VALUES)
        return {"tools": [t["schema"] for t in tools], "expected": None, "messages": [
            {"role": "user", "content": request.format(w=word)},
            {"role": "assistant", "content": answer.format(w=word)},
        ]}

    def one_call(self) -> Example:
        rng = self.rng
        used: set[str] = set()
        right = self.tool(used)
        tools = self.offered([right], used)
        args = self.arguments(right)
        request = rng.choice(_TOOL_REQUESTS).format(tool=right["name"], args=_phrase(args))
        called, called_args = right, args
        distractors = [t for t in tools if t is not right]
        if distractors and rng.random() < WRONG_TOOL_SHARE:
            called = rng.choice(distractors)
            called_args = self.arguments(called)
        result = self.result()
        return {"tools": [t["schema"] for t in tools], "expected": {"name": right["name"], "arguments": args},
                "messages": [
            {"role": "user", "content": request},
            _call(called["name"], called_args),
            {"role": "tool", "name": called["name"], "content": result},
            {"role": "assistant", "content": rng.choice(_ANSWERS).format(r=result)},
        ]}

    def two_calls(self) -> Example:
        rng = self.rng
        used: set[str] = set()
        first = self.tool(used)
        second = self.tool(used, nargs=1, kinds=("integer", "string"))
        tools = self.offered([first, second], used)
        args = self.arguments(first)
        (arg2, kind2, _), = second["params"]
        middle: Any = rng.randint(0, 999) if kind2 == "integer" else rng.choice(STRING_VALUES)
        final = self.result()
        request = rng.choice(_CHAINS).format(t1=first["name"], t2=second["name"], args=_phrase(args))
        messages = [
            {"role": "user", "content": request},
            _call(first["name"], args),
            {"role": "tool", "name": first["name"], "content": str(middle)},
        ]
        if rng.random() < EARLY_STOP_SHARE:
            messages.append({"role": "assistant", "content": rng.choice(_ANSWERS).format(r=middle)})
        else:
            messages += [
                _call(second["name"], {arg2: middle}),
                {"role": "tool", "name": second["name"], "content": final},
                {"role": "assistant", "content": rng.choice(_ANSWERS).format(r=final)},
            ]
        return {"tools": [t["schema"] for t in tools], "expected": {"name": first["name"], "arguments": args},
                "messages": messages}


def _phrase(args: dict[str, Any]) -> str:
    """How a request gives the arguments: `` with count 3, city "Paris"``: each name then its value as the
    call's JSON writes it (strings quoted, booleans ``true``), so that the value's tokens are the call's, and
    what follows a value too: ``",`` or ``,`` before another argument, the request's end after the last (the
    call's ``"``, then ``}``), where `` and `` would tell the copy nothing at the token that decides."""
    if not args:
        return ""
    return " with " + ", ".join(f"{k} {json.dumps(v)}" for k, v in args.items())


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def tool_use_corpus(seed: int, size: int = CORPUS_SIZE) -> list[Example]:
    """``size`` generated tool-use chats (see the module docstring), the same for the same seed."""
    corpus = _Corpus(random.Random(f"tool-use-v2-{seed}"))
    return [corpus.chat() for _ in range(size)]


def tool_request(tool: str, arguments: dict[str, Any]) -> str:
    """A request in the corpus's phrasing (``Use the "add" tool with a 3, b 4``): for envs, tests, bench/."""
    return f'Use the "{tool}" tool{_phrase(arguments)}'


def chain_request(first: str, arguments: dict[str, Any], second: str) -> str:
    """A two-call request in the corpus's phrasing: the second tool takes the first one's result."""
    return f'Use "{second}" on the result of "{first}"{_phrase(arguments)}'


def held_out_chats(seed: int, size: int) -> list[Example]:
    """Chats like the corpus's, with every tool and argument named from the held-out lists."""
    corpus = _Corpus(random.Random(f"tool-use-held-out-{seed}"), HELD_OUT_VERBS, HELD_OUT_NOUNS, HELD_OUT_ARGS)
    return [corpus.chat() for _ in range(size)]


def parse_call(text: str) -> dict[str, Any] | None:
    """The first ``<tool_call>`` of a reply as ``{"name", "arguments"}``, or None when there is none that parses."""
    import json

    start, end = text.find("<tool_call>"), text.find("</tool_call>")
    if start < 0 or end < start:
        return None
    try:
        call = json.loads(text[start + len("<tool_call>"):end].strip())
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
        return None
    return call


def check(model: Any, tokenizer: Any, size: int = 96) -> dict[str, Any]:
    """The first reply to held-out-name chats, greedy and sampled (as GRPO samples): shares of replies that
    make a call that parses, to an offered tool with arguments of its schema's types, to the right tool
    with the right arguments, and (chats needing none) no call."""
    import torch

    chats = held_out_chats(0, size)
    prompts = [tokenizer.apply_chat_template(c["messages"][:1], tools=c["tools"], tokenize=False,
                                             add_generation_prompt=True) for c in chats]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    tokenizer.padding_side = side
    out: dict[str, Any] = {"held_out_chats": size}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for mode, options in (("greedy", {"do_sample": False}), ("sampled", {"do_sample": True, "temperature": 1.0})):
            # a static cache: the default one concatenates every layer's keys and values at each new token (its
            # ``aten::cat`` led the profile): a greedy pass over the 96 chats, 503 tokens and 64 new, took 26.8 s
            # here, 10.3 s with the same tokens this way
            ids = model.generate(**enc, max_new_tokens=64, pad_token_id=tokenizer.pad_token_id,
                                 cache_implementation="static", **options)
            texts = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            counts = dict.fromkeys(("needs_call", "parsed", "offered_typed", "right", "needs_none", "none"), 0)
            for chat, text in zip(chats, texts, strict=True):
                call = parse_call(text)
                if chat.get("expected") is None:
                    counts["needs_none"] += 1
                    counts["none"] += "<tool_call>" not in text
                    continue
                # "expected": the call the request asks for, whatever the noisy teacher then called
                counts["needs_call"] += 1
                if call is None:
                    continue
                counts["parsed"] += 1
                schemas = {t["function"]["name"]: t for t in chat["tools"]}
                schema = schemas.get(call["name"])
                counts["offered_typed"] += schema is not None and fits_schema(call["arguments"], schema)
                counts["right"] += call == chat["expected"]
            calls = counts["needs_call"] or 1
            out[mode] = {"parsed": round(counts["parsed"] / calls, 3),
                         "offered_typed": round(counts["offered_typed"] / calls, 3),
                         "right_call": round(counts["right"] / calls, 3),
                         "no_call_when_none_needed": round(counts["none"] / (counts["needs_none"] or 1), 3)}
    return out


#: The fine-tune's length and batch (models/tiny_agent.py): the corpus holds exactly the chats it reads once.
STEPS, BATCH = 300, 8


def recipe_corpus(seed: int) -> list[Example]:
    """The chats ``tiny-agent``'s fine-tune reads: ``STEPS * BATCH`` of them, each once."""
    return tool_use_corpus(seed, STEPS * BATCH)


def circuit_start(seed: int) -> Any:
    """Where ``tiny-agent``'s fine-tune starts: a fresh model with the copy circuit (research/tiny_agent/copy_circuit.py) and
    layer 2's chain heads (research/tiny_agent/chain_heads.py: a two-step request's second call), frozen."""
    from .chain_heads import fresh_model

    return fresh_model(seed, freeze=True)
