"""The copy circuit set by hand (research/tiny_agent/copy_circuit.py): untrained, it already copies held-out names and values.

Each case is a prompt with one of tests/agent_cells.py's held-out-name tools and a request in the corpus's
phrasing, then the start of a call; greedy decoding of the *untrained* circuit must continue it with the
tool's name, the argument's name or the request's value, none of which it has ever seen.
"""

from __future__ import annotations

import pytest

from research.tiny_agent import tool_corpus

TOOLS = {
    "weigh_parcel": [("grams", "integer", None)],
    "reserve_harbor": [("minutes", "integer", None), ("owner", "string", None)],
    "paint_garden": [("shade", "enum", ["red", "green", "blue"])],
}
CASES = [  # (tool, arguments, the call's start, what the circuit must write next)
    ("weigh_parcel", {"grams": 41}, '{"name": "', 'weigh_parcel"'),
    # (the ``":`` after it ties with the description's ``.`` after ``The grams``: the fine-tune settles it)
    ("weigh_parcel", {"grams": 41}, '{"name": "weigh_parcel", "arguments": {"', "grams"),
    ("weigh_parcel", {"grams": 41}, '{"name": "weigh_parcel", "arguments": {"grams":', " 41"),
    ("reserve_harbor", {"minutes": 7, "owner": "Oslo"}, '{"name": "', 'reserve_harbor"'),
    # the name's end: the schema's `` "`` after ``",``, not the request's ``Ġtool`` after its quoted name
    ("reserve_harbor", {"minutes": 7, "owner": "Oslo"}, '{"name": "reserve_harbor",', ' "'),
    # then ``arguments``, where the schema has ``description`` (head 0 writes it as the call's key, ``COPY_AS``)
    ("reserve_harbor", {"minutes": 7, "owner": "Oslo"}, '{"name": "reserve_harbor", "', 'arguments'),
    ("reserve_harbor", {"minutes": 7, "owner": "Oslo"}, '{"name": "reserve_harbor", "arguments": {"minutes":', " 7"),
    # the second argument's name, not the schema's ``return`` key, which has the same three tokens before it
    ("reserve_harbor", {"minutes": 7, "owner": "Oslo"}, '{"name": "reserve_harbor", "arguments": {"minutes": 7, "',
     "owner"),
    # after a string argument's name the request's `` "`` ties with the schema's ``":`` (the fine-tune settles it)
    ("paint_garden", {"shade": "green"}, '{"name": "paint_garden", "arguments": {"', "shade"),
    ("paint_garden", {"shade": "green"}, '{"name": "paint_garden", "arguments": {"shade":', ' "green"'),
]


def _prompt(tokenizer, tool: str, request: str) -> str:
    """The generation prompt of a chat offering ``tool`` (of ``TOOLS``) with ``request`` as the user's turn."""
    schema = tool_corpus._schema(tool, f"{tool.split('_')[0].capitalize()} the {tool.split('_')[1]}.", TOOLS[tool])
    return tokenizer.apply_chat_template([{"role": "user", "content": request}], tools=[schema], tokenize=False,
                                         add_generation_prompt=True)


@pytest.fixture(scope="module")
def circuit():
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path
    from research.tiny_agent.copy_circuit import fresh_model

    return fresh_model(0).eval(), AutoTokenizer.from_pretrained(str(tiny_model_path()))


@pytest.mark.parametrize(("tool", "arguments", "start", "want"), CASES)
def test_the_untrained_circuit_copies_held_out_names_and_values(circuit, tool, arguments, start, want) -> None:
    import torch

    model, tokenizer = circuit
    prompt = _prompt(tokenizer, tool, tool_corpus.tool_request(tool, arguments))
    enc = tokenizer(prompt + "<tool_call>\n" + start, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=len(tokenizer(want)["input_ids"]) + 1, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    assert tokenizer.decode(out[0, enc["input_ids"].shape[1]:]).startswith(want)


def test_a_value_ends_where_the_request_does_not_where_the_schemas_options_go_on(circuit) -> None:
    """After ``"green`` the request has ``"`` then its end, the schema's list ``",`` then ``"blue"``: the section
    head marks the request's tokens, and head 0 prefers them when the matches tie."""
    import torch

    model, tokenizer = circuit
    prompt = _prompt(tokenizer, "paint_garden", tool_corpus.tool_request("paint_garden", {"shade": "green"}))
    enc = tokenizer(prompt + '<tool_call>\n{"name": "paint_garden", "arguments": {"shade": "green', return_tensors="pt")
    with torch.no_grad():
        probs = model(**enc).logits[0, -1].softmax(-1)
    quote, quote_comma = tokenizer.convert_tokens_to_ids(['"', '",'])
    assert probs[quote] > 0.9 > 0.05 > probs[quote_comma], (float(probs[quote]), float(probs[quote_comma]))


DISTRACTORS = [("bake_lemon", "grams"), ("rotate_ladder", "floor"), ("borrow_violin", "minutes")]


@pytest.mark.parametrize(("tool", "argument"), DISTRACTORS)
def test_a_calls_arguments_are_the_called_tools_among_distractors(circuit, tool, argument) -> None:
    """Three tools offered, each with its own argument: after the call's ``"arguments": {"`` every schema's
    ``"properties": {"`` matches alike, and the tool bags pick the called tool's (``bake_lemon`` and
    ``borrow_violin`` even share their first token). Before the bags, every call got the middle tool's."""
    import torch

    model, tokenizer = circuit
    schemas = [tool_corpus._schema(name, f"{name.split('_')[0].capitalize()} the {name.split('_')[1]}.",
                                   [(arg, "integer", None)]) for name, arg in DISTRACTORS]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": tool_corpus.tool_request(tool, {argument: 41})}], tools=schemas,
        tokenize=False, add_generation_prompt=True)
    enc = tokenizer(prompt + f'<tool_call>\n{{"name": "{tool}", "arguments": {{"', return_tensors="pt")
    with torch.no_grad():
        probs = model(**enc).logits[0, -1].softmax(-1)
    firsts = {arg: tokenizer.convert_tokens_to_ids(tokenizer.tokenize(arg)[0]) for _, arg in DISTRACTORS}
    assert probs[firsts[argument]] > 0.95, {arg: float(probs[i]) for arg, i in firsts.items()}


@pytest.mark.parametrize("result", ["121", "kiwi"])
def test_a_chains_second_call_takes_the_first_calls_result(circuit, result) -> None:
    """``Use "encode_grade" on the result of "guess_secret" with pet "cat"``: after the first call and its
    result, the second call's argument is the second tool's, and its value the result (the request has none)."""
    import torch

    model, tokenizer = circuit
    schemas = [tool_corpus._schema("guess_secret", "Guess the secret.", [("pet", "string", None)]),
               tool_corpus._schema("encode_grade", "Encode the grade.", [("factor", "integer", None)])]
    messages = [{"role": "user", "content": tool_corpus.chain_request("guess_secret", {"pet": "cat"}, "encode_grade")},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "guess_secret", "arguments": {"pet": "cat"}}}]},
                {"role": "tool", "name": "guess_secret", "content": result}]
    prompt = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)
    call = '<tool_call>\n{"name": "encode_grade", "arguments": {"'
    for start, want in ((call, "factor"), (call + 'factor": ', result)):
        enc = tokenizer(prompt + start, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=len(tokenizer(want)["input_ids"]), do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        assert tokenizer.decode(out[0, enc["input_ids"].shape[1]:]) == want


@pytest.mark.parametrize(("tool", "arguments", "start", "want"), [
    ("weigh_parcel", {"grams": 41}, '{"name": "weigh_parcel", "arguments": {"grams": 41', "}}\n"),
    ("reserve_harbor", {"minutes": 41, "owner": "Oslo"}, '{"name": "reserve_harbor", "arguments": {"minutes": 41', ","),
    ("reserve_harbor", {"minutes": 41, "owner": "Oslo"},
     '{"name": "reserve_harbor", "arguments": {"minutes": 41, "owner": "Oslo"', "}}\n"),
])
def test_a_call_ends_where_its_request_does(circuit, tool, arguments, start, want) -> None:
    """After a value the copy writes what follows it in the request: ``,`` before another argument, and for
    the request's end the call's (``}}`` and a newline), not ``<|im_end|>``."""
    import torch

    model, tokenizer = circuit
    prompt = _prompt(tokenizer, tool, tool_corpus.tool_request(tool, arguments))
    enc = tokenizer(prompt + "<tool_call>\n" + start, return_tensors="pt")
    with torch.no_grad():
        probs = model(**enc).logits[0, -1].softmax(-1)
    assert probs[tokenizer.convert_tokens_to_ids(tokenizer.tokenize(want))[0]] > 0.9


def test_a_request_in_another_phrasing_gives_the_value_heads_nothing_to_copy(circuit) -> None:
    """The value heads match the argument name's last two tokens before the value: ``grams=41`` has none."""
    import torch

    model, tokenizer = circuit
    prompt = _prompt(tokenizer, "weigh_parcel", "weigh_parcel(grams=41)")
    enc = tokenizer(prompt + '<tool_call>\n{"name": "weigh_parcel", "arguments": {"grams":', return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert not tokenizer.decode(out[0, enc["input_ids"].shape[1]:]).startswith(" 41")


def test_the_frozen_start_trains_only_the_layers_after_the_circuit() -> None:
    from research.tiny_agent.copy_circuit import SIZES, fresh_model

    model = fresh_model(0, freeze=True)
    trained = {name.split(".")[2] if name.startswith("model.layers.") else name.split(".")[1]
               for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"3", "4", "norm"}, trained  # layers 3 and 4 and the final norm; codes and circuit kept
    assert model.config.hidden_size == SIZES["hidden_size"] and model.config.head_dim == SIZES["head_dim"]


def _first_name(model, tokenizer, messages, schemas) -> str:
    """The first token the circuit writes after a call's ``{"name": "``, greedy."""
    import torch

    prompt = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(prompt + '<tool_call>\n{"name": "', return_tensors="pt")
    with torch.no_grad():
        return tokenizer.convert_ids_to_tokens(int(model(**enc).logits[0, -1].argmax()))


NAMED_TOOLS = [("rotate_ladder", "floor"), ("weigh_parcel", "grams"), ("paint_garden", "shade")]


@pytest.mark.parametrize("order", [0, 1, 2])
@pytest.mark.parametrize(("tool", "argument"), NAMED_TOOLS)
def test_a_calls_name_is_the_tool_its_request_names_among_distractors(circuit, tool, argument, order) -> None:
    """Three offered tools, in three orders: the call's name begins as the tool the request names in quotes (layer 1
    flags the request's token that is an offered tool's name, layer 2's head 3 copies it at the name's opener).
    Before, every call named the last schema's tool."""
    model, tokenizer = circuit
    tools = NAMED_TOOLS[order:] + NAMED_TOOLS[:order]
    schemas = [tool_corpus._schema(name, f"{name.split('_')[0].capitalize()} the {name.split('_')[1]}.",
                                   [(arg, "integer", None)]) for name, arg in tools]
    messages = [{"role": "user", "content": tool_corpus.tool_request(tool, {argument: 41})}]
    assert _first_name(model, tokenizer, messages, schemas) == tokenizer.tokenize(tool)[0]


@pytest.mark.parametrize("reverse", [False, True])
def test_a_chains_calls_name_its_tools_in_the_requests_order(circuit, reverse) -> None:
    """``Use "encode_grade" on the result of "guess_secret" with pet "cat"``: the first call names the inner tool
    (the request's last named) and ends where the request does, the call after its result the outer one,
    whichever schema comes first. Before, both named the last schema's (the second call's name began with the
    result's first token)."""
    import torch

    model, tokenizer = circuit
    schemas = [tool_corpus._schema("guess_secret", "Guess the secret.", [("pet", "string", None)]),
               tool_corpus._schema("encode_grade", "Encode the grade.", [("factor", "integer", None)])]
    schemas = schemas[::-1] if reverse else schemas
    request = [{"role": "user", "content": tool_corpus.chain_request("guess_secret", {"pet": "cat"}, "encode_grade")}]
    first = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "guess_secret", "arguments": {"pet": "cat"}}}]},
             {"role": "tool", "name": "guess_secret", "content": "121"}]
    assert _first_name(model, tokenizer, request, schemas) == "gues"
    assert _first_name(model, tokenizer, request + first, schemas) == "en"
    prompt = tokenizer.apply_chat_template(request, tools=schemas, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(prompt + '<tool_call>\n{"name": "guess_secret", "arguments": {"pet": "cat"', return_tensors="pt")
    with torch.no_grad():  # the first call ends where the request does (a request with a "then" went on)
        assert tokenizer.convert_ids_to_tokens(int(model(**enc).logits[0, -1].argmax())) == "}}Ċ"


def test_a_request_that_quotes_no_tool_leaves_the_name_to_the_schemas(circuit) -> None:
    """Unquoted (``Use the weigh_parcel tool``), no request token is flagged: the name still comes from the one
    offered schema, not from whatever the request says."""
    model, tokenizer = circuit
    schema = tool_corpus._schema("weigh_parcel", "Weigh the parcel.", [("grams", "integer", None)])
    messages = [{"role": "user", "content": "Use the weigh_parcel tool with grams 41"}]
    assert _first_name(model, tokenizer, messages, [schema]) == "we"


# ---------------------------------------------------------------- the chain heads (research/tiny_agent/chain_heads.py)

CHAIN_SCHEMAS = [("guess_secret", "Guess the secret.", [("pet", "string", None)]),
                 ("encode_grade", "Encode the grade.", [("factor", "integer", None)])]


@pytest.fixture(scope="module")
def chain_circuit():
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path
    from research.tiny_agent.chain_heads import fresh_model

    return fresh_model(0).eval(), AutoTokenizer.from_pretrained(str(tiny_model_path()))


def _after_first_result(tokenizer, result: str, request: str | None = None, factor_type: str = "integer") -> str:
    """A two-step chat up to the reply after the first call's result (``request``: another user turn instead)."""
    schemas = [tool_corpus._schema(name, text, params) for name, text, params in CHAIN_SCHEMAS]
    schemas[1] = tool_corpus._schema("encode_grade", "Encode the grade.", [("factor", factor_type, None)])
    messages = [{"role": "user", "content": request or tool_corpus.chain_request("guess_secret", {"pet": "cat"},
                                                                                  "encode_grade")},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "guess_secret", "arguments": {"pet": "cat"}}}]},
                {"role": "tool", "name": "guess_secret", "content": result}]
    return tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)


def _argmax(model, tokenizer, text: str) -> str:
    """The token the model writes next after ``text``, greedy."""
    return max(_next(model, tokenizer, text).items(), key=lambda kv: kv[1])[0]


def _next(model, tokenizer, text: str) -> dict[str, float]:
    import torch

    with torch.no_grad():
        probs = model(**tokenizer(text, return_tensors="pt")).logits[0, -1].softmax(-1)
    top = probs.topk(3)
    return {tokenizer.convert_ids_to_tokens(int(i)): float(p) for p, i in zip(top.values, top.indices, strict=True)}


def test_the_chain_heads_call_again_after_a_two_step_requests_first_result_only(chain_circuit) -> None:
    """After a two-step request's first result the chain head pushes the reply toward ``<tool_call>`` (untrained,
    the circuit then writes it); after a one-call request's result it pushes against it (+ a chain word, - a
    result)."""
    import torch

    model, tokenizer = chain_circuit
    head = model.model.layers[2].self_attn.o_proj
    seen: dict[str, torch.Tensor] = {}
    hook = head.register_forward_pre_hook(lambda module, args: seen.__setitem__("x", args[0]))
    try:
        pushes = {}
        for kind, request in (("chain", None), ("one call", 'Use the "guess_secret" tool with pet "cat"')):
            text = _after_first_result(tokenizer, "121", request)
            assert kind == "one call" or _next(model, tokenizer, text).get("<tool_call>", 0) > 0.9
            with torch.no_grad():
                model(**tokenizer(text, return_tensors="pt"))
            pushes[kind] = float(seen["x"][0, -1, 4 * 128])  # head 4's one value dim: chain words - results
    finally:
        hook.remove()
    assert pushes["chain"] > 0.02 and pushes["one call"] < -0.3, pushes


@pytest.mark.parametrize(("result", "factor_type", "opener"), [("121", "integer", "Ġ"), ("kiwi", "string", 'Ġ"')])
def test_the_chain_heads_open_the_second_value_as_the_result_is_written(chain_circuit, result, factor_type,
                                                                        opener) -> None:
    """The second call's value is the result, which the request does not have: a number opens with `` ``, a word
    with `` "``; then the result is copied, and after a number's last digit the call ends (``}}Ċ``, then
    ``</tool_call>``)."""
    model, tokenizer = chain_circuit
    text = _after_first_result(tokenizer, result, factor_type=factor_type)
    start = text + '<tool_call>\n{"name": "encode_grade", "arguments": {"factor":'
    assert _argmax(model, tokenizer, start) == opener
    if factor_type == "integer":
        value = start + " " + result
        assert _argmax(model, tokenizer, value) == "}}Ċ"
        assert _argmax(model, tokenizer, value + "}}\n") == "</tool_call>"


def test_without_the_chain_heads_the_circuit_is_the_four_head_one() -> None:
    """Without the chain heads (tiny-agent v2.1's start) the circuit keeps four heads a layer, no digit marks, and
    the same codes as the chain circuit (whose extra heads would otherwise change the random draw they come from)."""
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path
    from research.tiny_agent import chain_heads
    from research.tiny_agent.chain_heads import CHAIN_HEADS, DIGIT
    from research.tiny_agent.copy_circuit import CODE, SIZES, fresh_model

    plain, chained = fresh_model(0), chain_heads.fresh_model(0)
    assert plain.config.num_attention_heads == SIZES["num_attention_heads"] == 4
    assert chained.config.num_attention_heads == 4 + CHAIN_HEADS
    codes = plain.model.embed_tokens.weight[:, :CODE] - chained.model.embed_tokens.weight[:, :CODE]
    assert float(codes.detach().abs().max()) == 0.0
    seven = AutoTokenizer.from_pretrained(str(tiny_model_path())).convert_tokens_to_ids("7")
    marks = [float(model.model.embed_tokens.weight[seven, DIGIT].detach()) for model in (plain, chained)]
    assert marks[0] == 0 < marks[1], marks
