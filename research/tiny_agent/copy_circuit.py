"""A copy circuit set by hand in the weights of a small Qwen2: where the general tool caller's fine-tune starts.

Why: a tool caller must copy into its call names it has never seen (from the schemas in its prompt) and
values (from the request). A small model trained from random weights learns to copy only after a long
plateau, far past a build budget of minutes (research/tiny_agent/RESULTS-agent.md); written in by hand, the copying is
there at step 0 and the fine-tune learns the rest: the call's fixed JSON, when to call, which tool, the
answer after a result.

tiny's vocabulary spells names nearly letter by letter (``weigh_parcel`` is ``we igh _ par ce l``), so
copying means continuing a run of tokens. The residual stream (192 wide) holds codes of 40 dims: the
token's own (its tied embedding, all of one length; the unembedding reads these dims) and, written by layer
0's three distance heads, the codes of the tokens one, two and three back. A few tokens are also marked
exactly in dims past the codes (``MARKS``), because two codes overlap by about 0.16 of their length.

- Layer 2, head 0 scores every earlier position by how many of the three tokens before it equal the current
  token and the two before it (the nearer counting more, ``MATCH_WEIGHTS``) and copies the best one's token.
  After a call's ``"name": "`` that finds the first token of an offered tool's name in the schema (a
  two-token match would find every ``": "``), and the rest of the name follows. Its query reads
  ``arguments`` as ``properties``, so that the call's ``"arguments": {"`` finds the first argument name after
  the schema's ``"properties": {"``. It never copies the instructions' placeholder ``<`` or a value's opener.
  Where several schemas match alike (each one's ``"properties": {"``), it prefers the key whose tool bag is
  the query's: the call's arguments are the called tool's, not another offered tool's. What it copies is
  written as is, but for the request's end, which it writes as the call's (``}}`` and a newline): a request
  ends with its last value, so the call it is copied into ends there too; and a schema's ``description``, which
  follows a tool's name there as ``arguments`` follows it in a call (``COPY_AS``).
- Layer 2, heads 1 and 2 copy an argument's value from the request (``_value_heads``); head 3 copies the
  latest tool result's first token where a call's value is not in the request (a chain's second call,
  ``_result_head``), and at a call's ``"name": "`` the first token of the tool the request names
  (``_name_terms``): the last named before any result, the first after (a two-step request names its outer
  tool first: ``Use "b" on the result of "a" with x 3``). Head 0 alone
  could not choose: every schema's name follows the same ``"name": "``, and it copied the last one's.
- Layer 0's fourth head tells every token which section it is in (``_section_head``): a user turn (the
  request, a tool's result), or the system turn's opening or a schema's ``required`` list and what follows it
  (the ``return`` key). Head 0 never copies from the latter (after a call's first value, ``, "`` finds the
  second argument's name and ``return`` alike) and prefers the former when matches tie (a value ends as the
  request's does: ``"green"`` then its end, not the schema's ``"green",`` then ``"blue"``). It also marks the
  tokens of a tool-name span (from a ``name`` key to the next section: a schema's ``description``, a call's
  ``arguments``).
- Layer 1 (``_bag_head``) writes into every token a *tool bag*: the mean code of the latest name span's
  tokens, JSON left out, in 16 dims of its own (``TOOL``). A schema's argument names carry their tool's bag, a
  call's ``"arguments": {"`` the called tool's; two tools whose names share their first token still differ.
  Layers 0 and 1 cannot find a tool's name by themselves (it comes a variable distance after its ``name``
  key), hence a layer of its own before the copying. Its head 1 flags (``NAMED``) a request token that follows
  `` "`` and is, after `` "``, a token of a schema's name span: the first token of a tool the request names in
  quotes (the request comes after the schemas, so it can look them up). Its head 2 flags every token after a
  tool's result (``RESULTED``).
- research/tiny_agent/chain_heads.py adds three heads to layer 2 (``fresh_model``'s ``extra_heads`` and ``extra``): what a
  two-step request's second call needs and no request spells out.
- Layers 3 and 4 and every MLP start with zero output: the circuit is alone in the residual stream until the
  fine-tune grows the rest.

RoPE's base is 1e20, so that the slow pairs of the 128-dim heads (``CONTENT_PAIRS``) keep contents
comparable across a chat while the fast ones (``DISTANCE_PAIRS``) make the distance heads. Scores are set in
nats (after the attention's scaling). Untrained, teacher-forced on calls of the corpus's chats, it predicts
0.97 of the tokens after a name's first, an argument name's first token 0.79 of the time and a value's 0.83
(research/tiny_agent/agent_sft_probe.py ``names``; the first token of a tool name is a pick among the offered tools).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: The architecture the circuit needs: tiny's (Qwen2, its tokenizer), 192 wide, four heads of 128.
SIZES: dict[str, Any] = {"hidden_size": 192, "intermediate_size": 384, "num_hidden_layers": 5,
                         "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 128}
ROPE_THETA = 1e20
#: The RoPE pairs that make the distance heads, those that compare contents, and a code's dims.
DISTANCE_PAIRS, CONTENT_PAIRS, CODE = range(0, 6), range(10, 64), 40
#: How much each of the three token matches counts: the nearer more, so that a two-token match that includes
#: the current token (continuing a run: ``Ġ 4`` then ``1``) beats one that does not (``Ġ [`` then ``"``).
MATCH_WEIGHTS = (1.0, 0.75, 0.55)
#: Dims past the codes that mark tokens exactly: the sink, ``":``, the openers (one dim for all), and the tokens
#: head 0 never copies (``NO_COPY``: the instructions' placeholder ``<``, and the openers that only open values,
#: not `` "`` which the call's JSON needs between fields); the size of a mark (a share of a code's length); the
#: dim marking ``":`` one token back; by how much head 0 avoids a token it does not copy (nats). ``required``
#: is not copied either: after a call's ``, "`` it ties with the second argument's name (the same two before).
SINK, COLON, OPENER, NO_COPY, COLON_BEFORE, KEY, KEY_BEFORE = 160, 161, 164, 165, 163, 166, 167
#: Section marks: the tokens that open a part of the chat (``SECTION``: the turns' roles, a schema's ``name``,
#: ``description``, ``properties`` and ``required`` keys, a call's ``arguments``, and ``<tool_call>``, which
#: ends the last schema's ``required``), and
#: which of them open a user turn (``USER``: the request, a tool's result) or a part head 0 never copies from
#: (``SKIP``: the system turn's fixed opening up to the first schema, and a ``required`` list with what follows
#: it); layer 0's fourth head carries the last section's kind to every token after it (``IN_USER``, ``IN_SKIP``).
SECTION, USER, SKIP, IN_USER, IN_SKIP = 168, 169, 170, 171, 172
#: The tool-name span: a function's ``name`` key opens it (a section of kind ``NAME``), the next section token
#: (the schema's ``description``, the call's ``arguments``) closes it; the section head marks the tokens in it
#: ``IN_NAME``, and layer 1 writes a bag of the latest span's tokens into ``TOOL`` (a projection of their codes)
#: at every token after it: which tool a schema's arguments, or a call's, belong to.
NAME, IN_NAME = 173, 174
TOOL = range(176, 192)
#: Layer 1's flags: a request token that is an offered tool's name (its first token, after the same `` "`` as in the
#: schema: ``NAMED``), and a token after a tool's result (``RESULTED``). Layer 2's head 3 copies, at a call's
#: ``"name": "``, the last named tool of the request before any result, the first one after (a chain's two calls).
NAMED, RESULTED = 162, 175
MARKS: dict[str, tuple[int, ...]] = {"<|im_start|>": (SINK,), '":': (COLON,), "Ġ<": (NO_COPY,), 'Ġ"': (OPENER,),
                                     **{token: (OPENER, NO_COPY) for token in ("Ġ", "Ġtrue", "Ġfalse")},
                                     "name": (KEY, SECTION, NAME), "arguments": (KEY, SECTION), "description": (SECTION,),
                                     "required": (NO_COPY, SECTION, SKIP), "properties": (SECTION,),
                                     "user": (SECTION, USER), "system": (SECTION, SKIP), "assistant": (SECTION,),
                                     "<tool_call>": (SECTION,)}
FLAG, NO_COPY_PENALTY = 0.25, 30.0
#: By how much head 0 prefers a token of a user turn to an equal match elsewhere (nats): a value's end is
#: copied from the request (``"green"`` then the request's end), not from the schema's list of options
#: (``"green",``). Less than the smallest match (0.55 of a slot), so it only breaks ties.
USER_BONUS = 3.0
#: The fourth head of layer 0 attends to the last section token: a section mark scores ``SECTION_SCORE`` nats,
#: and a RoPE pair slow enough to turn less than a quarter over a chat (``RECENCY_PAIR``) takes
#: ``RECENCY`` nats times the sine of its angle, so that nearer sections win by some nats a few tokens apart.
RECENCY_PAIR, RECENCY, SECTION_SCORE = 9, 400.0, 800.0
#: Layer 1's bag head: a token of a name span scores ``BAG_SCORE`` nats, less ``BAG_RECENCY`` times the sine of
#: the distance's angle in ``RECENCY_PAIR`` (about 0.05 nats a token: the latest span's tokens alike, an earlier
#: schema's span, 50 or more tokens further, a few hundredths of it); the JSON tokens every span has are left out
#: of the bag (``BAG_COMMON``), so that two tools' bags differ by their names' tokens alone.
BAG_SCORE, BAG_RECENCY = 40.0, 32.0
BAG_COMMON = ("name", '":', 'Ġ"', '",', "_", "Ġ<", ">,")
#: Layer 2's result head prefers the latest tool result by this many nats times the sine of the distance's angle
#: in ``RECENCY_PAIR`` (about 0.15 nats a token).
RESULT_RECENCY = 100.0
#: At a call's ``"name": "`` the result head scores a named request token ``NAME_SCORE`` nats (and that much less
#: elsewhere, where it must never win: up to ``NAME_FARTHER / freq`` nats, about 140, come from the order term),
#: its sink ``NAME_SINK`` nats above a value's (above a tool result, which a name never copies), and the named
#: token's position in ``ORDER_PAIR``: ``NAME_NEARER`` nats a token the nearer the better before any result (a
#: two-step request names its outer tool first, ``Use "b" on the result of "a" with x 3``: ``a`` is called first and
#: the call ends where the request does), ``NAME_FARTHER`` the further the better after one (then ``b``).
NAME_SCORE, NAME_SINK, NAME_NEARER, NAME_FARTHER, ORDER_PAIR = 200.0, 10.0, 0.6, 0.45, 8
#: What the name-span mark reads at layer 2 (a share of a mark, measured: its ``name`` key's other marks shrink it).
IN_NAME_READING = 0.75
#: A code's length: the norms make the circuit indifferent to it, but the tied unembedding reads the codes, so
#: it sets how sharp the next-token distribution can be (at init's 0.6, sampling at temperature 1 was noise;
#: 2 and 3 did about as well, 3 a little better summed over the three must-show envs, 4 worse on two of them:
#: research/tiny_agent/RESULTS-agent.md).
CODE_LENGTH = 3.0
#: What head 0's query reads a token as (``_remap``): a call's ``arguments`` as a schema's ``properties``, so that
#: the call's ``"arguments": {"`` finds the first argument name after the schema's ``"properties": {"``. (Reading
#: the call's ``}}Ċ`` as the instructions' ``>}Ċ``, for the ``</tool_call>`` after it, also turned a chain's copied
#: result ``121`` into ``1_response>``: a map leaks into the codes that overlap its token's.)
QUERY_AS = (("arguments", "properties"),)
#: What head 0 writes a copied token as: the request's end as a call's (``}}Ċ``), a schema's ``description``
#: (which follows its name) as a call's ``arguments`` (which follows the called name).
COPY_AS = (("<|im_end|>", "}}Ċ"), ("description", "arguments"))


def configure(config: Any, extra_heads: int = 0) -> Any:
    """``config`` (tiny's ``Qwen2Config``) resized for the circuit (``SIZES`` and ``extra_heads`` more heads a layer,
    RoPE base ``ROPE_THETA``)."""
    for key, value in SIZES.items():
        setattr(config, key, value)
    config.num_attention_heads = config.num_key_value_heads = SIZES["num_attention_heads"] + extra_heads
    config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    return config


def clear(model: Any, code: int) -> None:
    """The embedding's dims past ``code`` and every output projection (attention and MLP) to zero: the residual
    stream holds the token codes alone until the circuit writes into it and the fine-tune grows the rest."""
    model.model.embed_tokens.weight[:, code:] = 0
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def distance_head(attention: Any, head: int, hd: int, distance: int, pairs: range, amplitude: float,
                   theta: float) -> None:
    """Make ``head`` attend ``distance`` tokens back whatever the contents: a constant query and key (in the
    biases, the weights zero), the key turned by ``distance`` positions' angle in each RoPE pair of ``pairs``."""
    import torch

    half = hd // 2
    freqs = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    query, key = torch.zeros(hd, dtype=torch.float64), torch.zeros(hd, dtype=torch.float64)
    for i in pairs:
        query[i] = amplitude
        key[i] = amplitude * math.cos(distance * freqs[i])
        key[i + half] = amplitude * math.sin(distance * freqs[i])
    rows = _clear_head(attention, head, hd)
    attention.q_proj.bias[rows] = query.float()
    attention.k_proj.bias[rows] = key.float()


def _clear_head(attention: Any, head: int, hd: int) -> slice:
    """Zero ``head``'s query, key and value rows (weights and biases), for a head set by hand; returns the rows."""
    rows = slice(head * hd, (head + 1) * hd)
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        proj.weight[rows] = 0
        proj.bias[rows] = 0
    return rows


def _slow_dims(hd: int) -> list[int]:
    """The dims of a head's slow RoPE pairs (``CONTENT_PAIRS``, both halves): where contents are compared."""
    return [*CONTENT_PAIRS, *(i + hd // 2 for i in CONTENT_PAIRS)]


def _basis(size: int, generator: Any) -> Any:
    """A random orthonormal basis (rows), computed in float64 so that its float32 bits do not depend on how
    many threads LAPACK used (they did, in the last bit)."""
    import torch

    basis, _ = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64))
    return basis.float()


def install(model: Any, tokenizer: Any, prev_amplitude: float = 20.0, match_amplitude: float = 1.6,
            copy_gain: float = 8.0, seed: int = 0, bag_gain: float = 2.0, tool_amplitude: float = 5.0,
            marks: dict[str, tuple[int, ...]] | None = None, copy_as: tuple[tuple[str, str], ...] = ()) -> Any:
    """Write the circuit into ``model`` (configured with ``configure``), deterministically; returns it.

    Layer 0's heads 0-2 write the codes of the tokens one, two and three back (scaled to the size of the
    token's own code, so that each counts alike after layer 2's norm). Layer 2's head 0 scores every earlier
    position by how many of the three tokens before it equal the current token and the two before (in three
    groups of the slow RoPE dims) and copies the best one's token: after ``"name": "`` in a call it finds the
    token after the same three in the schema, the first token of a tool's name, where a two-token match
    finds every ``": "``. The query reads the token two back through a map that takes ``arguments`` to
    ``properties``, so that the call's ``"arguments": {"`` finds the first argument name after the schema's
    ``"properties": {"``.

    ``tool_amplitude`` weighs head 0's comparison of tool bags (``_bag_head``): at 4 and more the untrained
    circuit gave the called tool's first argument p > 0.99 among four one-argument tools, and at 10 the bags
    outweighed the matches (a value's second digit became a tool name's token).

    ``marks`` and ``copy_as`` add to ``MARKS`` and ``COPY_AS`` (research/tiny_agent/chain_heads.py's).
    """
    import torch

    hd, code = 128, CODE
    slots = [slice(i * code, (i + 1) * code) for i in range(4)]  # own, one back, two back, three back
    generator = torch.Generator().manual_seed(seed)
    embed = model.model.embed_tokens.weight
    layers = model.model.layers
    marks = {**MARKS, **(marks or {})}
    with torch.no_grad():
        clear(model, code)
        # codes of one length, so that every slot has the same size after the norms and a token's presence in a
        # slot reads alike for every token
        length = CODE_LENGTH
        embed[:, :code] *= length / embed[:, :code].norm(dim=1, keepdim=True).clamp_min(1e-6)
        scale = float(length / math.sqrt(model.config.hidden_size))
        for token, dims in marks.items():  # exact marks of a few tokens, in dims the codes do not use
            embed[tokenizer.convert_tokens_to_ids(token), list(dims)] = FLAG * length
        # a section mark the same share of every section token's norm (the others' marks make their rows
        # longer, and layer 0's norm would shrink their mark: scored in hundreds of nats, that outweighs recency)
        share = FLAG / math.sqrt(1 + FLAG**2)  # a section token's mark over its norm, with no other mark
        for token, dims in marks.items():
            if SECTION in dims:
                rest = length**2 + (len(dims) - 1) * (FLAG * length) ** 2
                embed[tokenizer.convert_tokens_to_ids(token), SECTION] = share * math.sqrt(rest / (1 - share**2))
        slot_size = math.sqrt(model.config.hidden_size / len(slots))  # a slot's norm after layer 2's norm
        first = layers[0].self_attn
        for head, distance in enumerate((1, 2, 3)):
            distance_head(first, head, hd, distance, DISTANCE_PAIRS, prev_amplitude, ROPE_THETA)
            first.v_proj.weight[head * hd:head * hd + code, slots[0]] = torch.eye(code)
            first.o_proj.weight[slots[distance], head * hd:head * hd + code] = scale * torch.eye(code)
        # the distance-1 head also carries the marks of ``":`` and of the call's own keys one back
        for i, (mark, before) in enumerate(((COLON, COLON_BEFORE), (KEY, KEY_BEFORE))):
            first.v_proj.weight[code + i, mark] = 1.0
            first.o_proj.weight[before, code + i] = scale
        _section_head(first, 3, hd, scale)
        second = layers[2].self_attn
        _clear_head(second, 0, hd)
        dims = _slow_dims(hd)
        per = (len(dims) - 1 - len(TOOL)) // 3  # then the tool bags' dims; the last slow dim: the penalty below
        # the call's ``arguments`` read as the schema's ``properties``
        to_properties = _remap(embed[:, :code], tokenizer, QUERY_AS)
        for group, (query, key) in enumerate(((0, 1), (1, 2), (2, 3))):
            basis = _basis(code, generator)
            rows = dims[group * per:(group + 1) * per]
            read = basis[:per] @ to_properties
            second.q_proj.weight[rows, slots[query]] = match_amplitude * MATCH_WEIGHTS[group] * read
            second.k_proj.weight[rows, slots[key]] = match_amplitude * basis[:per]
        # never copy the instructions' placeholder ``<`` (``"name": <function-name>``), nor a number's or
        # boolean's opener (the request's ``grams 41`` continues ``gram`` as the schema's ``"grams":`` does; the
        # value heads below open values)
        second.q_proj.bias[dims[-1]] = 1.0
        second.k_proj.weight[dims[-1], NO_COPY] = -NO_COPY_PENALTY * math.sqrt(hd) / (FLAG * slot_size)
        # nor anything in a skipped section: after a schema's ``required`` (the list's names, the ``return`` key:
        # after a call's first value, ``, "`` would find the second argument's name and ``return`` alike) and the
        # system turn's opening (``Qwen, created by``: after the call's ``,`` too); and prefer the request
        second.k_proj.weight[dims[-1], IN_SKIP] = -NO_COPY_PENALTY * math.sqrt(hd) / (FLAG * slot_size)
        second.k_proj.weight[dims[-1], IN_USER] = USER_BONUS * math.sqrt(hd) / (FLAG * slot_size)
        # what it copies, but for the request's end (``<|im_end|>``), which it writes as the call's (``}}Ċ``): a
        # request ends with its last value, so a call copied from it ends where it does; and a schema's
        # ``description`` after its name, which it writes as the call's ``arguments``
        second.v_proj.weight[:code, slots[0]] = _remap(embed[:, :code], tokenizer, COPY_AS + copy_as)
        second.o_proj.weight[slots[0], :code] = copy_gain * torch.eye(code)
        _value_heads(second, embed[:, :code], tokenizer, slots, hd, generator, 2 * copy_gain)
        _result_head(second, 3, embed[:, :code], tokenizer, slots, hd, 2 * copy_gain)
        # the tool bags (layer 1), and head 0's preference for a key whose bag is the query's
        _bag_head(layers[1].self_attn, 0, hd, embed[:, :code], tokenizer, generator, bag_gain * scale)
        tool_dims = dims[3 * per:3 * per + len(TOOL)]
        tool_rows, tool_cols = torch.tensor(tool_dims)[:, None], torch.tensor(list(TOOL))
        second.q_proj.weight[tool_rows, tool_cols] = tool_amplitude * torch.eye(len(TOOL))
        second.k_proj.weight[tool_rows, tool_cols] = tool_amplitude * torch.eye(len(TOOL))
        # which offered tool the request names, and whether a result came: the result head's choice of a name
        _named_head(layers[1].self_attn, 1, hd, embed[:, :code], tokenizer, slots, generator)
        _resulted_head(layers[1].self_attn, 2, hd, embed[:, :code], tokenizer, slots)
        _name_terms(second, 3, hd, slots)
    return model


def _remap(codes: Any, tokenizer: Any, pairs: tuple[tuple[str, str], ...]) -> Any:
    """A map of codes that takes each pair's first token's code to its second's and leaves the rest about as they
    are (the identity plus one rank-one term a pair), computed in float64 so that its float32 bits do not
    depend on the thread count."""
    import torch

    out = torch.eye(codes.shape[1], dtype=torch.float64)
    for source, target in pairs:
        a, b = (codes[tokenizer.convert_tokens_to_ids(t)].double() for t in (source, target))
        out += torch.outer(b - a, a) / a.dot(a)
    return out.float()


def _recency(attention: Any, base: int, hd: int, nats: float) -> None:
    """The head at ``base`` scores a key ``nats`` times the sine of its distance's angle in ``RECENCY_PAIR``
    lower: nearer keys win. The quarter turn: q = (0, a), k = (a, 0) in the pair (biases), so q.k after RoPE
    is -a^2 sin(distance * freq)."""
    amplitude = math.sqrt(nats * math.sqrt(hd))
    attention.q_proj.bias[base + RECENCY_PAIR + hd // 2] = amplitude
    attention.k_proj.bias[base + RECENCY_PAIR] = amplitude


def _section_head(attention: Any, head: int, hd: int, scale: float) -> None:
    """Layer 0's ``head``: every token attends to the last section token at or before it (``MARKS``'s
    ``SECTION``) and writes whether it opened a user turn (``IN_USER``), a part not to copy from (``IN_SKIP``)
    or a tool-name span (``IN_NAME``).

    The query and key are constant (biases) but for the key's section mark: in one slow dim the mark scores
    ``SECTION_SCORE``; in the RoPE pair ``RECENCY_PAIR`` the query is a quarter turn ahead of the key, so the
    score is ``-RECENCY * sin(angle of the distance)``, lower the further back (to about 1,000 tokens).
    """
    _clear_head(attention, head, hd)
    base, root = head * hd, math.sqrt(hd)
    _recency(attention, base, hd, RECENCY)
    # the section mark, after layer 0's norm: about FLAG * CODE_LENGTH * sqrt(hidden) / CODE_LENGTH
    mark = FLAG * math.sqrt(attention.q_proj.in_features)
    slow = CONTENT_PAIRS[-1]
    attention.q_proj.bias[base + slow] = 1.0
    attention.k_proj.weight[base + slow, SECTION] = SECTION_SCORE * root / mark
    for i, (kind, into) in enumerate(((USER, IN_USER), (SKIP, IN_SKIP), (NAME, IN_NAME))):
        attention.v_proj.weight[base + i, kind] = 1.0
        attention.o_proj.weight[into, base + i] = scale


def _bag_head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, generator: Any, gain: float,
              margin: float = 10.0) -> None:
    """Layer 1's ``head``: every token after a tool-name span attends to the latest span's tokens (``IN_NAME``,
    a slow recency) and writes the mean of their codes, projected into ``TOOL`` without the JSON tokens every
    span has (``BAG_COMMON``) and the sink's code: the tool a schema's keys, or a call's, belong to. Before the
    first span it attends to ``<|im_start|>`` (``margin`` nats below a span's score) and writes nothing."""
    import torch

    _clear_head(attention, head, hd)
    base, root = head * hd, math.sqrt(hd)
    size = math.sqrt(attention.q_proj.in_features / 4)  # a slot's norm after the norm; a mark is FLAG of it
    _recency(attention, base, hd, BAG_RECENCY)
    slow = CONTENT_PAIRS[-1]
    attention.q_proj.bias[base + slow] = 1.0
    attention.k_proj.weight[base + slow, IN_NAME] = BAG_SCORE * root / (FLAG * size)
    attention.k_proj.weight[base + slow, SINK] = (BAG_SCORE - margin) * root / (FLAG * size)
    code = codes.shape[1]
    left_out = torch.stack([codes[tokenizer.convert_tokens_to_ids(t)] for t in ("<|im_start|>", *BAG_COMMON)])
    span, _ = torch.linalg.qr(left_out.double().T)  # an orthonormal basis of what the bag leaves out
    keep = torch.eye(code, dtype=torch.float64) - span @ span.T
    project = _basis(code, generator)[:len(TOOL)].double() @ keep
    attention.v_proj.weight[base:base + len(TOOL), :code] = project.float()
    attention.o_proj.weight[list(TOOL), base:base + len(TOOL)] = gain * torch.eye(len(TOOL))


def _mark_row(width: int, dim: int, size: float) -> Any:
    """A row that reads 1 from a token's mark in ``dim`` (after layer 2's norm, where a slot's norm is ``size``
    and a mark ``FLAG`` of it), 0 without it."""
    import torch

    row = torch.zeros(width)
    row[dim] = 1 / (FLAG * size)
    return row


def _value_heads(attention: Any, codes: Any, tokenizer: Any, slots: list[slice], hd: int, generator: Any,
                 gain: float, match: float = 10.0, pick: float = 8.0, margin: float = 16.0) -> None:
    """Layer 2's heads 1 and 2: copy an argument's value from the request into the call.

    The call writes ``"grams": 41`` where the request has ``grams 41`` (tokens ``s ": Ġ 4 1`` against
    ``s Ġ 4 1``). Head 1, after the call's ``":``, finds the request's token whose two before equal the two
    before ``":`` (the argument name's last two) and that opens a value (`` `` or `` "``); head 2, on that
    opener, finds the request's token whose one before equals it and whose two before equals the token two
    back (the name's last): the value's first token. Each attends to ``<|im_start|>`` (a sink that copies
    nothing) unless its trigger is there, so they are silent everywhere else. Scores are in nats.
    """
    import torch

    def mark(dim: int) -> Any:
        return _mark_row(attention.q_proj.in_features, dim, size)

    # the norm of a slot after layer 2's norm: four slots of about equal size share the stream's
    size = math.sqrt(attention.q_proj.in_features / len(slots))
    root = math.sqrt(hd)
    sink, colon, colon_before, openers = mark(SINK), mark(COLON), mark(COLON_BEFORE), mark(OPENER)
    key_before = mark(KEY_BEFORE)
    start = codes[tokenizer.convert_tokens_to_ids("<|im_start|>")]
    start = start / start.norm()  # the sink's own code, which the heads' values leave out
    free = _slow_dims(hd)
    code = slots[0].stop
    a = math.sqrt(match * root) / size  # content weight: a match of one slot scores ``match`` nats
    # head 2's trigger is two marks (a value's opener after ``":``), each half of it: one alone (``": {"``
    # before an argument name) leaves the sink above a two-token match
    # head 1's trigger is a ``":`` after an argument's name, not after the call's own ``"name"`` or ``"arguments"``
    for head, (reads, trigger) in ((1, (((1, 1), (2, 2)), colon - key_before)),
                                   (2, (((0, 1), (2, 2)), (colon_before + openers) / 2))):
        base = head * hd
        _clear_head(attention, head, hd)
        for group, (query, key) in enumerate(reads):
            basis = _basis(code, generator)
            rows = [base + d for d in free[group * code:(group + 1) * code]]
            attention.q_proj.weight[rows, slots[query]] = a * basis
            attention.k_proj.weight[rows, slots[key]] = a * basis
        d_sink, d_pick = base + free[2 * code], base + free[2 * code + 1]
        # the sink: above any two-slot match at <|im_start|>, but between one and two matches where the trigger
        # token is in its slot (so that a half match does not copy)
        off, on = 2 * match + margin, 1.3 * match
        attention.k_proj.weight[d_sink] = root * sink
        attention.q_proj.bias[d_sink] = off
        attention.q_proj.weight[d_sink] = -(off - on) * trigger
        if head == 1:  # prefer a value's opener, and never the ``":`` itself (the call's own, the schema's)
            attention.q_proj.bias[d_pick] = 1.0
            attention.k_proj.weight[d_pick] = root * pick * (openers - colon)
        # the value: the token's own code, without the sink's (so that the sink copies nothing)
        attention.v_proj.weight[base:base + code, slots[0]] = torch.eye(code) - torch.outer(start, start)
        attention.o_proj.weight[slots[0], base:base + code] = gain * torch.eye(code)


def _result_head(attention: Any, head: int, codes: Any, tokenizer: Any, slots: list[slice], hd: int, gain: float,
                 match: float = 10.0, margin: float = 16.0) -> None:
    """Layer 2's ``head``: a call's argument whose value is the latest tool result (a chain's second call:
    ``Use "b" on the result of "a" with x 3``) copies the result's first token.

    Its trigger is head 2's (a value's opener after an argument's ``":``); its key, the token after
    ``_response >Ċ`` (the first token of a ``<tool_response>``), two fixed codes one and two back, the latest one
    by a slow recency. Where no result came yet (a first call), it attends to ``<|im_start|>`` and copies
    nothing; where the request also has the value, head 2 copies it too and the fine-tune settles it.
    """
    import torch

    size, root = math.sqrt(attention.q_proj.in_features / len(slots)), math.sqrt(hd)
    base = head * hd
    _clear_head(attention, head, hd)

    def mark(dim: int) -> Any:
        return _mark_row(attention.q_proj.in_features, dim, size)

    free = _slow_dims(hd)
    for d, (slot, token) in zip(free[:2], ((1, ">Ċ"), (2, "_response")), strict=True):
        want = codes[tokenizer.convert_tokens_to_ids(token)]
        attention.q_proj.bias[base + d] = 1.0
        attention.k_proj.weight[base + d, slots[slot]] = match * root / size * want / want.norm()
    _recency(attention, base, hd, RESULT_RECENCY)
    d_sink = base + free[2]
    off, on = 2 * match + margin, 1.3 * match
    trigger = (mark(COLON_BEFORE) + mark(OPENER)) / 2
    attention.k_proj.weight[d_sink] = root * mark(SINK)
    attention.q_proj.bias[d_sink] = off
    attention.q_proj.weight[d_sink] = -(off - on) * trigger
    start = codes[tokenizer.convert_tokens_to_ids("<|im_start|>")]
    start = start / start.norm()
    code = slots[0].stop
    attention.v_proj.weight[base:base + code, slots[0]] = torch.eye(code) - torch.outer(start, start)
    attention.o_proj.weight[slots[0], base:base + code] = gain * torch.eye(code)


def _named_head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, slots: list[slice], generator: Any,
                match: float = 15.0, quoted: float = 15.0, bonus: float = 18.0, on: float = 36.0,
                off: float = 80.0) -> None:
    """Layer 1's ``head``: a request token after `` "`` that is also, after `` "``, a tool-name span's token in a
    schema (the first token of an offered tool's name) sets ``NAMED``.

    A user-turn query scores a key ``match`` nats for the same token, ``quoted`` more where both come after
    `` "`` (one rank of the one-back slot), ``bonus`` more in a name span; its sink scores ``on`` (other queries:
    ``off``, so they always attend to it), 12 nats below a key with all three and 3 or more above any with two
    (the same token elsewhere in a name; a quoted value that is also a schema's string). Lower scores (10, 10,
    12 against 24) left a name's ``NAMED`` at 0.96 of another's, which the result head's 200 nats turned into a
    preference of 8 nats; a larger bonus alone flagged tokens inside names too.
    The schemas come before the request, so the request's tokens can look them up (not the other way round).
    """
    _clear_head(attention, head, hd)
    base, root, size = head * hd, math.sqrt(hd), math.sqrt(attention.q_proj.in_features / 4)
    width = attention.q_proj.in_features
    free, code = _slow_dims(hd), slots[0].stop
    a = math.sqrt(match * root) / size  # a slot's match scores ``match`` nats
    basis = _basis(code, generator)
    rows = [base + d for d in free[:code]]
    attention.q_proj.weight[rows, slots[0]] = a * basis
    attention.k_proj.weight[rows, slots[0]] = a * basis
    quote = codes[tokenizer.convert_tokens_to_ids('Ġ"')]
    quote = quote / quote.norm()
    d_quote, d_name, d_sink = (base + free[code + i] for i in range(3))
    b = math.sqrt(quoted * root) / size
    attention.q_proj.weight[d_quote, slots[1]] = b * quote
    attention.k_proj.weight[d_quote, slots[1]] = b * quote
    attention.q_proj.bias[d_name] = 1.0
    attention.k_proj.weight[d_name] = root * bonus * _mark_row(width, IN_NAME, size)
    attention.k_proj.weight[d_sink] = root * _mark_row(width, SINK, size)
    attention.q_proj.bias[d_sink] = off
    attention.q_proj.weight[d_sink] = -(off - on) * _mark_row(width, IN_USER, size)
    # the value: the key's ``IN_NAME`` (none at a sink), written as a mark of the embedding's size
    attention.v_proj.weight[base, IN_NAME] = 1.0
    attention.o_proj.weight[NAMED, base] = CODE_LENGTH / size


def _resulted_head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, slots: list[slice],
                   match: float = 30.0, user: float = 10.0, sink: float = 32.0) -> None:
    """Layer 1's ``head``: every token after a tool's result (a ``_response`` token in a user turn) sets
    ``RESULTED``; before any, it attends to ``<|im_start|>`` (``sink`` nats, between a user token's score and a
    result's) and writes about nothing (the sink's code barely overlaps ``_response``'s)."""
    _clear_head(attention, head, hd)
    base, root, size = head * hd, math.sqrt(hd), math.sqrt(attention.q_proj.in_features / 4)
    width = attention.q_proj.in_features
    free = _slow_dims(hd)
    want = codes[tokenizer.convert_tokens_to_ids("_response")]
    want = want / want.norm()
    d_token, d_user, d_sink = (base + free[i] for i in range(3))
    for d in (d_token, d_user):
        attention.q_proj.bias[d] = 1.0
    attention.k_proj.weight[d_token, slots[0]] = match * root / size * want
    # (not at a sink: the ``<|im_start|>`` after a user turn is in it)
    attention.k_proj.weight[d_user] = root * user * (_mark_row(width, IN_USER, size) - _mark_row(width, SINK, size))
    attention.q_proj.bias[d_sink] = sink
    attention.k_proj.weight[d_sink] = root * _mark_row(width, SINK, size)
    attention.v_proj.weight[base, slots[0]] = want  # about a slot's norm at a result's token
    attention.o_proj.weight[RESULTED, base] = FLAG * CODE_LENGTH / size


def _name_terms(attention: Any, head: int, hd: int, slots: list[slice]) -> None:
    """Layer 2's result head, at a call's ``"name": "``: the request's ``NAMED`` token, the nearest before any
    result and the furthest after, instead of a tool's result (``NAME_SCORE``, ``NAME_SINK``, ``NAME_NEARER``,
    ``NAME_FARTHER``). Its value copies that token, the name's first.

    The query's gate ``g`` is twice its name-span mark plus its trigger (a `` "`` after ``":``) less 1.5: 1 at a
    name's opener, at most -1 elsewhere (a value's opener, the rest of a name), where the named keys lose. (The
    schemas' openers have no request before them to look at.)
    """
    base, root = head * hd, math.sqrt(hd)
    width = attention.q_proj.in_features
    size = math.sqrt(width / len(slots))
    free = _slow_dims(hd)
    in_name, named, resulted = (_mark_row(width, d, size) for d in (IN_NAME, NAMED, RESULTED))
    opener = in_name / IN_NAME_READING + (_mark_row(width, COLON_BEFORE, size) + _mark_row(width, OPENER, size)) / 2
    d_named, d_sink = base + free[3], base + free[2]
    attention.q_proj.weight[d_named] = 2 * opener
    attention.q_proj.bias[d_named] = -3.0
    attention.k_proj.weight[d_named] = root * NAME_SCORE * named
    attention.q_proj.weight[d_sink] += NAME_SINK * in_name / IN_NAME_READING
    # the order: q = (0, b1 - (b1 + b2) RESULTED), k = (NAMED, 0) in ``ORDER_PAIR``; q.k after RoPE is
    # -q2 k1 sin(distance * freq): for small angles b1 nats a token nearer is better before a result, b2 further
    # after one (everywhere: the gate above keeps the named keys out elsewhere)
    freq = ROPE_THETA ** (-2 * ORDER_PAIR / hd)
    nearer, farther = NAME_NEARER * root / freq, NAME_FARTHER * root / freq
    row = base + ORDER_PAIR + hd // 2
    attention.q_proj.weight[row] = -(nearer + farther) * resulted
    attention.q_proj.bias[row] = nearer
    attention.k_proj.weight[base + ORDER_PAIR] = named


def fresh_model(seed: int = 0, freeze: bool = False, extra_heads: int = 0,
                extra: Callable[[Any, Any], None] | None = None, **install_args: Any) -> Any:
    """A model of tiny's architecture and tokenizer, configured and with the circuit installed (``extra_heads``
    more heads a layer, which ``extra(model, tokenizer)`` sets after it; ``install_args``: ``install``'s ``marks``
    and ``copy_as``).

    ``freeze``: the circuit's layers (0, 1 and 2) and the token embedding (the codes, the marks and the tied
    unembedding) keep their set values through a fine-tune; layers 3 and 4 learn around them.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from grpo_magic.models.tiny import tiny_model_path

    base = str(tiny_model_path())
    config = configure(AutoConfig.from_pretrained(base), extra_heads)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
        if extra_heads:
            torch.manual_seed(seed)  # the four-head draw's codes, whose overlaps the circuit was measured on
            four = configure(AutoConfig.from_pretrained(base))
            model.model.embed_tokens.weight.data.copy_(AutoModelForCausalLM.from_config(four).model.embed_tokens.weight)
    model.generation_config = GenerationConfig.from_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    install(model, tokenizer, seed=seed, **install_args)
    if extra is not None:
        with torch.no_grad():
            extra(model, tokenizer)
    if freeze:
        model.model.embed_tokens.weight.requires_grad_(False)
        for layer in model.model.layers[:3]:  # all of them: the MLPs and norms before feed layer 2's matches
            layer.requires_grad_(False)
    return model
