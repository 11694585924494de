"""Layer 2's chain heads: what a two-step request's second call needs that no request spells out, set by hand
like the rest of the circuit (research/tiny_agent/copy_circuit.py).

A two-step request (``Use "b" on the result of "a" with x 3``) needs, after the first call's result, a second
call whose value is that result. Fine-tuned from the four-head circuit, tiny-agent v2.1 answered there instead
(p(``<tool_call>``) 0.005: one-call chats answer after their result, and the circuit made the two look alike),
opened 30 of 44 second values with the wrong opener (the request has none to copy) and ended them with ``.``
(a result's ``Ċ``, which answers end with). Three heads, each silent elsewhere (its sink wins):

- ``_call_again_head`` (head 4): ``<tool_call>`` at the reply after a two-step request's first result;
- ``_opener_head`` (head 5): the second value's opener, `` `` before a digit, `` "`` before a word;
- ``_close_head`` (head 6): ``</tool_call>`` after a call's ``}}Ċ``.

Head 0 also writes a result's ``Ċ`` as the call's ``}}Ċ`` (``CHAIN_COPY_AS``), so that a value copied from a
result ends the call. Fine-tuned from them with tiny-agent's recipe (``tool_corpus.circuit_start``: tiny-agent
v2.2), the model makes both calls of a two-step env in a quarter of sampled episodes (research/tiny_agent/RESULTS-agent.md,
"the second call").
"""

from __future__ import annotations

import math
from typing import Any

from . import copy_circuit
from .copy_circuit import (
    CODE,
    COLON,
    IN_USER,
    KEY,
    KEY_BEFORE,
    NAME,
    RESULTED,
    SECTION,
    SINK,
    _clear_head,
    _mark_row,
    _slow_dims,
)

#: Layer 2's chain heads (``_call_again_head``, ``_opener_head``, ``_close_head``), each layer's fifth to seventh.
CHAIN_HEADS = 3
HEAD_DIM = copy_circuit.SIZES["head_dim"]
#: A digit's mark (``0`` to ``9``), which layer 2's chain head reads to open a chain's second value as a number
#: (`` ``) or a string (`` "``). It shares ``NAME``'s dim: that one is read only at section tokens (the section
#: head attends to nothing else), which digits are not.
DIGIT = NAME
#: The marks the chain heads add: a digit's (``DIGIT``), and ``KEY`` on ``assistant``, which the distance-1 head
#: carries to the reply's first position (``KEY_BEFORE``), where ``_call_again_head`` reads it.
CHAIN_MARKS: dict[str, tuple[int, ...]] = {"assistant": (SECTION, KEY), **{str(d): (DIGIT,) for d in range(10)}}
#: With the chain heads, a result's ``Ċ`` too: the end of a value copied from a result (a chain's second call) is
#: the call's end, as the request's end is a first call's.
CHAIN_COPY_AS = (("Ċ", "}}Ċ"),)


def fresh_model(seed: int = 0, freeze: bool = False) -> Any:
    """``copy_circuit.fresh_model`` with the chain heads (layer 2's heads 4 to 6), their marks and copy map."""
    return copy_circuit.fresh_model(seed, freeze, extra_heads=CHAIN_HEADS, extra=install_chain_heads,
                                    marks=CHAIN_MARKS, copy_as=CHAIN_COPY_AS)


def install_chain_heads(model: Any, tokenizer: Any) -> None:
    """Write the three heads into layer 2 of ``model`` (the circuit installed, ``CHAIN_HEADS`` more heads)."""
    attention, codes = model.model.layers[2].self_attn, model.model.embed_tokens.weight[:, :CODE]
    slots = [slice(i * CODE, (i + 1) * CODE) for i in range(4)]
    _call_again_head(attention, 4, HEAD_DIM, codes, tokenizer, slots)
    _opener_head(attention, 5, HEAD_DIM, codes, tokenizer, slots)
    _close_head(attention, 6, HEAD_DIM, codes, tokenizer, slots)


def _head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, slots: list[slice]) -> tuple[Any, ...]:
    """Clear ``head`` for setting by hand; its first row, the score scale, the stream's width, a slot's norm after
    the norm, and ``_unit_rows``'s ``read`` and ``unit``."""
    _clear_head(attention, head, hd)
    width = attention.q_proj.in_features
    size = math.sqrt(width / len(slots))
    return (head * hd, math.sqrt(hd), width, size, *_unit_rows(codes, tokenizer, slots, width, size))


def _unit_rows(codes: Any, tokenizer: Any, slots: list[slice], width: int, size: float) -> tuple[Any, Any]:
    """``read(slot, token)``: a row reading about 1 where ``slot`` holds ``token``'s code (after the norm) and 0 at
    the sinks (what they hold left out); ``unit(token)``: the token's code of length 1."""
    import torch

    start = codes[tokenizer.convert_tokens_to_ids("<|im_start|>")]
    start = start / start.norm()

    def unit(token: str) -> Any:
        vector = codes[tokenizer.convert_tokens_to_ids(token)]
        return vector / vector.norm()

    # what a sink holds: its own code, and one back (slot 1) the ``Ċ`` that ends the turn before it
    newline = unit("Ċ") - unit("Ċ").dot(start) * start
    newline = newline / newline.norm()

    def read(slot: int, token: str) -> Any:
        vector = unit(token)
        vector = vector - vector.dot(start) * start
        if slot == 1:
            vector = vector - vector.dot(newline) * newline
        row = torch.zeros(width)
        row[slots[slot]] = vector / size
        return row

    return read, unit


#: The words of a two-step request (``tool_corpus._CHAINS``: ``on the result of``, ``with what ... returns``).
CHAIN_WORDS = ("Ġresult", "Ġreturn")


def _call_again_head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, slots: list[slice],
                     score: float = 12.0, sink: float = 9.0, off: float = 40.0, gain: float = 32.0) -> None:
    """Layer 2's ``head``: at a reply's start (the ``Ċ`` after ``assistant``, whose ``KEY`` mark the distance-1 head
    carries there) it attends to a two-step request's word (``CHAIN_WORDS`` in a user turn, ``ln 2`` nats above
    ``score``), to each tool result's two ``_response`` tokens (``ln 2`` below) and to the sinks, and writes
    ``<tool_call>`` by what it reads: + a chain word, - a result. Measured untrained (tests/test_copy_circuit.py):
    about +0.05 after a two-step request's first result (its word takes half the attention, the result's two tokens
    0.4, the reads 0.82 and 0.9 of a token's), -0.7 after a one-call request's result. The fine-tune takes the sign
    from there. Elsewhere the sink wins (``off``).

    Why by hand: fine-tuned, the model answered after a chain's first result (p(``<tool_call>``) 0.005 on
    tiny-agent v2.1): one-call chats answer after theirs, and the circuit made the two look alike. (Counting the
    request's named tools instead failed: ``NAMED`` reads 0.93 on one name and 0.17 on another.)
    """
    base, root, width, size, read, unit = _head(attention, head, hd, codes, tokenizer, slots)
    d_call, d_sink = (base + d for d in _slow_dims(hd)[:2])
    chain = sum(read(0, word) for word in CHAIN_WORDS)
    in_user = _mark_row(width, IN_USER, size)
    # 1 at a reply's start, 0 after a ``name`` or ``arguments`` key (its ``":``), -1 at an argument's ``":``
    trigger = _mark_row(width, KEY_BEFORE, size) - _mark_row(width, COLON, size)
    attention.q_proj.weight[d_call] = root * trigger
    # a chain word in a user turn scores ``score + ln 2``, one elsewhere 0, a result's ``_response`` ``score - ln 2``
    attention.k_proj.weight[d_call] = ((score + math.log(2)) * (chain + in_user) + (score - math.log(2))
                                       * read(0, "_response"))
    attention.k_proj.bias[d_call] = -(score + math.log(2))
    attention.q_proj.bias[d_sink] = off
    attention.q_proj.weight[d_sink] = -(off - sink) * trigger
    attention.k_proj.weight[d_sink] = root * _mark_row(width, SINK, size)
    attention.v_proj.weight[base] = chain - read(0, "_response")
    attention.o_proj.weight[slots[0], base] = gain * size * unit("<tool_call>")


def _opener_head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, slots: list[slice],
                 match: float = 10.0, off: float = 40.0, on: float = 12.0, gain: float = 32.0) -> None:
    """Layer 2's ``head``: at an argument's ``":`` in a call after a result (not a ``name`` or ``arguments`` key's,
    not in a user turn), it attends to the latest result's first token (after ``_response >Ċ``: ``match`` nats
    each) and writes the value's opener, `` `` before a digit (``DIGIT``), `` "`` before anything else: a chain's
    second call takes its value from the result, and the request has no opener to copy. Elsewhere the sink
    wins (``off``). Fine-tuned without it, tiny-agent v2.1 opened 30 of 44 such values wrong.
    """
    base, root, width, size, read, unit = _head(attention, head, hd, codes, tokenizer, slots)
    d_first, d_sink = (base + d for d in _slow_dims(hd)[:2])

    def mark(dim: int) -> Any:
        return _mark_row(width, dim, size)

    attention.q_proj.bias[d_first] = root
    attention.k_proj.weight[d_first] = match * (read(1, ">Ċ") + read(2, "_response"))
    trigger = mark(COLON) + mark(RESULTED) - mark(IN_USER) - mark(KEY_BEFORE)  # less 1: 1 there, 0 or less elsewhere
    attention.q_proj.bias[d_sink] = off + (off - on)
    attention.q_proj.weight[d_sink] = -(off - on) * trigger
    attention.k_proj.weight[d_sink] = root * mark(SINK)
    attention.v_proj.weight[base] = read(1, ">Ċ")
    attention.v_proj.weight[base + 1] = mark(DIGIT)
    quote, space = unit('Ġ"'), unit("Ġ")
    attention.o_proj.weight[slots[0], base] = gain * size * quote
    attention.o_proj.weight[slots[0], base + 1] = gain * size * (space - quote)


def _close_head(attention: Any, head: int, hd: int, codes: Any, tokenizer: Any, slots: list[slice],
                on: float = 10.0, off: float = 40.0, gain: float = 32.0) -> None:
    """Layer 2's ``head``: after a call's ``}}Ċ`` it writes ``</tool_call>`` (it attends to the sinks, whose value
    it is; elsewhere to the other tokens, which write nothing). Head 0 copies there whatever followed the same
    tokens elsewhere (in a chain's second call, a result's ``</``, a request's word), and the fine-tune closed
    first calls but not second ones (tiny-agent v2.1: 10 of 44 second calls went on)."""
    base, root, width, size, read, unit = _head(attention, head, hd, codes, tokenizer, slots)
    d_sink = base + _slow_dims(hd)[0]
    attention.q_proj.weight[d_sink] = (off + on) * read(0, "}}Ċ")
    attention.q_proj.bias[d_sink] = -off
    attention.k_proj.weight[d_sink] = root * _mark_row(width, SINK, size)
    attention.v_proj.weight[base] = _mark_row(width, SINK, size)
    attention.o_proj.weight[slots[0], base] = gain * size * unit("</tool_call>")
