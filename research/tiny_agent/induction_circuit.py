"""A copy (induction) circuit set by hand in a small Qwen2 model: the start of the fine-tunes in agent_sft_probe.

Why: a general tool caller must copy names it has never seen from the offered schemas into its call. A small
model trained from random weights only learns to copy after a long plateau (research/tiny_agent/RESULTS-agent.md: from
400 to 850 steps of 8 chats, far past a build budget of minutes), and a plateau is what an induction circuit
(a previous-token head, then a head that finds the earlier occurrence of the current token and copies the
token after it) looks like while it forms. Written in by hand, the circuit is there at step 0 and the
fine-tune only has to learn when to use it.

The layout of the 128-wide residual stream:

- dims 0-63: the token's code (the tied embedding, whose dims 64-127 start at zero, so that the unembedding
  reads dims 0-63 only);
- layer 0, heads 0 and 1: attend to the previous token (their query and key are constant vectors, in the
  q/k *biases*, rotated so that RoPE's score peaks at a distance of one) and write its code's two halves
  into dims 64-95 and 96-127;
- layer 1, heads 0 and 1: score the current token's code half against the previous-token code half at
  every earlier position, in the RoPE pairs that barely rotate over a chat (``rope_theta`` 1e10: pairs 6-15
  turn by at most 0.11 rad in 600 tokens), and copy the matched position's own code back into dims 0-63;
- every other output projection (attention ``o_proj``, MLP ``down_proj``) starts at zero: the circuit is
  alone in the residual stream until the fine-tune grows the rest.

On repeated random token sequences it copies 97% of the repeated tokens in 80-token sequences and 83% in
600-token ones with no training (``python -m research.tiny_agent.induction_circuit`` from the repository's root).

That circuit matches on one previous token, and tiny's 1,024-token vocabulary spells a held-out name nearly
letter by letter (``paint_garden`` is ``p a in t _ g ar d en``), so one common letter has many earlier
occurrences to match. ``install_two`` matches on *two* previous tokens instead: 2 heads of 64 dims a layer,
codes of 40 dims (dims 0-39 the token's, 40-79 the previous token's, 80-119 the one before; layer 0's two
heads attend at distances one and two), and one head in layer 1 whose score adds the match of the current
code against a position's previous code to the match of the previous code against its previous-previous
code. ``fresh_model(match=2)`` builds it: 92% and 91% of the same runs (the first token of each repeat cannot
be matched on two), and 0.97 of the continuation tokens of held-out tool names in chats, teacher-forced
(``python -m research.tiny_agent.agent_sft_probe names``).
"""

from __future__ import annotations

from typing import Any

from research.tiny_agent.copy_circuit import clear as _clear
from research.tiny_agent.copy_circuit import distance_head as _distance_head

#: RoPE's base: high, so that its low-frequency pairs keep contents comparable across a whole chat.
ROPE_THETA = 1e10
#: The RoPE pairs that make the previous-token pattern, and those that compare contents.
PREV_PAIRS = range(0, 5)
CONTENT_PAIRS = range(6, 16)
SIZES: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 4}
#: ``install_two``'s: two heads of 64 a layer, whose RoPE pairs 0-5 make the distance patterns and 12-31 compare.
SIZES_TWO: dict[str, Any] = {**SIZES, "num_attention_heads": 2, "num_key_value_heads": 2}
PREV_PAIRS_TWO, CONTENT_PAIRS_TWO, CODE_TWO = range(0, 6), range(12, 32), 40
_HEAD_DIM, _CODE = 32, 64


def configure(config: Any, match: int = 1) -> Any:
    """``config`` (tiny's ``Qwen2Config``) resized for the circuit: 128 wide, 4 layers, 4 heads (2 for
    ``match=2``), RoPE base 1e10."""
    for key, value in (SIZES if match == 1 else SIZES_TWO).items():
        setattr(config, key, value)
    config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    return config


def install(model: Any, prev_amplitude: float = 18.0, match_amplitude: float = 5.0, copy_gain: float = 8.0,
            seed: int = 0) -> Any:
    """Write the circuit into ``model``'s weights (see the module docstring), deterministically; returns it."""
    import torch

    hd, half = _HEAD_DIM, _HEAD_DIM // 2
    generator = torch.Generator().manual_seed(seed)
    layers = model.model.layers
    with torch.no_grad():
        _clear(model, _CODE)
        # the previous-token heads, each carrying one half of the code
        first = layers[0].self_attn
        for h in (0, 1):
            rows = slice(h * hd, (h + 1) * hd)
            _distance_head(first, h, hd, 1, PREV_PAIRS, prev_amplitude, ROPE_THETA)
            first.v_proj.weight[rows, rows] = torch.eye(hd)
            first.o_proj.weight[_CODE + h * hd:_CODE + (h + 1) * hd, rows] = torch.eye(hd)
        # the induction heads: current code half against previous-token code half, in the slow RoPE pairs
        second = layers[1].self_attn
        dims = [*CONTENT_PAIRS, *(i + half for i in CONTENT_PAIRS)]
        for h in (0, 1):
            rows = slice(h * hd, (h + 1) * hd)
            basis, _ = torch.linalg.qr(torch.randn(hd, hd, generator=generator))
            for proj in (second.q_proj, second.k_proj, second.v_proj):
                proj.weight[rows] = 0
                proj.bias[rows] = 0
            for j, d in enumerate(dims):
                second.q_proj.weight[h * hd + d, h * hd:(h + 1) * hd] = match_amplitude * basis[j]
                second.k_proj.weight[h * hd + d, _CODE + h * hd:_CODE + (h + 1) * hd] = match_amplitude * basis[j]
            second.v_proj.weight[rows, h * hd:(h + 1) * hd] = torch.eye(hd)
            second.o_proj.weight[h * hd:(h + 1) * hd, rows] = copy_gain * torch.eye(hd)
    return model


def install_two(model: Any, prev_amplitude: float = 14.0, match_amplitude: float = 4.0, copy_gain: float = 8.0,
                seed: int = 0) -> Any:
    """The two-token match (see the module docstring) in a model configured with ``configure(match=2)``."""
    import torch

    hd, half, code = 64, 32, CODE_TWO
    own, prev, prev2 = slice(0, code), slice(code, 2 * code), slice(2 * code, 3 * code)
    generator = torch.Generator().manual_seed(seed)
    layers = model.model.layers
    with torch.no_grad():
        _clear(model, code)
        first = layers[0].self_attn
        for head, (distance, target) in enumerate(((1, prev), (2, prev2))):
            _distance_head(first, head, hd, distance, PREV_PAIRS_TWO, prev_amplitude, ROPE_THETA)
            first.v_proj.weight[head * hd:head * hd + code, own] = torch.eye(code)
            first.o_proj.weight[target, head * hd:head * hd + code] = torch.eye(code)
        second = layers[1].self_attn
        dims = [*CONTENT_PAIRS_TWO, *(i + half for i in CONTENT_PAIRS_TWO)]
        n = len(dims) // 2
        for proj in (second.q_proj, second.k_proj, second.v_proj):
            proj.weight[:hd] = 0
            proj.bias[:hd] = 0
        mine, _ = torch.linalg.qr(torch.randn(code, code, generator=generator))
        before, _ = torch.linalg.qr(torch.randn(code, code, generator=generator))
        for j in range(n):
            # the current token against a position's previous token; the previous against its previous-previous
            second.q_proj.weight[dims[j], own] = match_amplitude * mine[j]
            second.k_proj.weight[dims[j], prev] = match_amplitude * mine[j]
            second.q_proj.weight[dims[n + j], prev] = match_amplitude * before[j]
            second.k_proj.weight[dims[n + j], prev2] = match_amplitude * before[j]
        second.v_proj.weight[:code, own] = torch.eye(code)
        second.o_proj.weight[own, :code] = copy_gain * torch.eye(code)
    return model


def fresh_model(seed: int = 0, circuit: bool = True, match: int = 1) -> Any:
    """A model of tiny's architecture and tokenizer, configured as above, with the circuit (``match`` tokens)
    installed, or not; ``match=3`` is the general recipe's start (research/tiny_agent/copy_circuit.py)."""
    if match == 3:
        from research.tiny_agent import copy_circuit

        return copy_circuit.fresh_model(seed)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from grpo_magic.models.tiny import tiny_model_path

    base = str(tiny_model_path())
    config = configure(AutoConfig.from_pretrained(base), match)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.generation_config = GenerationConfig.from_pretrained(base)
    if not circuit:
        return model
    return install(model, seed=seed) if match == 1 else install_two(model, seed=seed)


def token_pool(tokenizer: Any) -> Any:
    """The ids random token runs are drawn from: every token but the special ones and the tool-call tags."""
    import torch

    special = set(tokenizer.all_special_ids) | set(tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]))
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special])


def copy_accuracy(model: Any, length: int, repeat: int = 12, batch: int = 32, seed: int = 1) -> float:
    """Share of a repeated random run's tokens (after its first) that the model predicts, greedy."""
    import torch
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path

    pool = token_pool(AutoTokenizer.from_pretrained(str(tiny_model_path())))
    gen = torch.Generator().manual_seed(seed)
    right = total = 0
    for _ in range(batch):
        x = pool[torch.randint(len(pool), (length,), generator=gen)]
        at = int(torch.randint(0, length - 2 * repeat - 40, (1,), generator=gen))
        again = at + repeat + int(torch.randint(0, 40, (1,), generator=gen))
        x[again:again + repeat] = x[at:at + repeat]
        with torch.no_grad():
            guess = model(input_ids=x[None]).logits[0].argmax(-1)
        right += int((guess[again:again + repeat - 1] == x[again + 1:again + repeat]).sum())
        total += repeat - 1
    return right / total


if __name__ == "__main__":
    for circuit, match in ((True, 1), (True, 2), (False, 1)):
        model = fresh_model(circuit=circuit, match=match)
        print({"circuit": circuit and f"{match}-token match",
               **{f"copy_accuracy_{n}": round(copy_accuracy(model, n), 3) for n in (80, 300, 600)}})
