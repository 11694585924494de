"""The offline ``tiny`` model: a small Qwen2 causal LM with a tokenizer trained here, shipped with the package.

The Hub cannot be reached everywhere (CI, this project's machines), so the demo and test model is
made from random weights and a byte-level BPE tokenizer trained on a generated corpus,
deterministically. The package ships the built folder (``weights/tiny-v1``); ``GRPO_MAGIC_BUILD_MODELS=1``
rebuilds it from this recipe into the cache (``models.cache``). It loads through the same
``from_pretrained`` path as any hub model.
"""

from __future__ import annotations

import json
import pathlib
import random
from typing import Any

from .cache import cached_folder

TINY = "tiny"

# Bump when anything about the tiny model changes, so stale caches are not reused.
TINY_VERSION = "tiny-v1"

# The tiny model's shape: small enough that a GRPO step on 2 CPU cores takes well under a second.
_TINY_SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "initializer_range": 0.1,
}
_TINY_VOCAB = 1024
_TINY_SEED = 1234

_PAD, _IM_START, _IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
# Qwen2's pre-tokenizer split (transformers' `tokenization_qwen2.PRETOKENIZE_REGEX`).
_QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

def _tiny_corpus(seed: int = 0) -> list[str]:
    """A small, generated training corpus for the tiny tokenizer.

    It mixes English-ish sentences, spelled-out letters, numbers, JSON and tool-call text so that
    the byte-level BPE learns merges for what demos and tests actually feed it.
    """
    rng = random.Random(seed)
    words = (
        "the a an and or of to in on for with is are was be it this that you he she we they "
        "what which how many much count letters letter word words number numbers answer question "
        "please give me tell find search book room rooms hotel city date night nights guest guests "
        "price cheap best free available call tool tools function result results user assistant "
        "system hello hi yes no true false null name arguments value list check in out first last "
        "one two three four five six seven eight nine ten apple banana cherry strawberry orange "
        "water weather today tomorrow time good bad more less than right wrong think step final "
        "reply json object key string integer array type properties required description"
    ).split()
    cities = ["Paris", "Madrid", "London", "Rome", "Berlin", "Tokyo", "Lima", "Oslo"]
    tools = ["search_rooms", "book_room", "get_weather", "count_letters", "calculator", "lookup"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    lines: list[str] = []
    for _ in range(3000):
        kind = rng.randrange(7)
        if kind in (0, 1):
            sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
            lines.append(sent.capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind == 2:
            word = rng.choice(words)
            letter = rng.choice(letters)
            lines.append(f"How many '{letter}' in \"{word}\"? {' '.join(word)} -> {word.count(letter)}")
        elif kind == 3:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            lines.append(f"{a} + {b} = {a + b}; {a} * {rng.randint(0, 9)}; 0.{rng.randint(0, 99)}")
        elif kind == 4:
            args = {"city": rng.choice(cities), "guests": rng.randint(1, 6), "nights": rng.randint(1, 9)}
            call = json.dumps({"name": rng.choice(tools), "arguments": args})
            lines.append(f"<tool_call>\n{call}\n</tool_call>")
        elif kind == 5:
            result = {"rooms": [{"id": rng.randint(1, 99), "price": rng.randint(40, 400)}]}
            lines.append(f"<tool_response>\n{json.dumps(result)}\n</tool_response>")
        else:
            schema = {
                "type": "function",
                "function": {
                    "name": rng.choice(tools),
                    "description": " ".join(rng.choice(words) for _ in range(6)),
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
            lines.append(f"<tools>\n{json.dumps(schema)}\n</tools>")
    lines.append(letters + " " + letters.upper() + " 0123456789 " + " ".join(letters))
    # The fixed text of the chat template, so that prompts with tools stay short in tokens.
    fixed = (
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\nYou are provided "
        "with function signatures within <tools></tools> XML tags:\n<tools>\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\n</tool_call>\nsystem\nuser\nassistant\n'
    )
    lines.extend([fixed] * 20)
    return lines


def _build_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained here, as a ``Qwen2Tokenizer`` with TRL's Qwen2.5 template.

    The template is TRL's own copy of Qwen2.5's (``trl.chat_template_utils``): being that exact
    template lets TRL recognise it and enable tool calling (response parsing) for ``tiny``.

    It is trained with Qwen2's own normalizer and pre-tokenizer because ``AutoTokenizer`` loads
    any ``qwen2`` model's tokenizer as ``Qwen2Tokenizer``, which rebuilds that pipeline from the
    vocab and merges: training with another pipeline would tokenize differently after reloading.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    from grpo_magic.trl_compat import qwen2_5_chat_template

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB,
        min_frequency=2,
        special_tokens=[_PAD, _IM_START, _IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(merge) for merge in trained["merges"]],
        unk_token=None,
        eos_token=_IM_END,
        pad_token=_PAD,
        extra_special_tokens=[_IM_START],
        model_max_length=_TINY_SIZES["max_position_embeddings"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    # Not special, like Qwen2.5: tool-call tags must survive `skip_special_tokens=True` decoding.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in _TOOL_TOKENS])
    tokenizer.chat_template = qwen2_5_chat_template()
    return tokenizer


def _build_tiny(dest: pathlib.Path) -> dict[str, Any]:
    """Build the tiny model and tokenizer into ``dest``, deterministically; returns what the marker records."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _build_tiny_tokenizer()
    pad_id = tokenizer.convert_tokens_to_ids(_PAD)
    eos_id = tokenizer.convert_tokens_to_ids(_IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        **_TINY_SIZES,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id],
        pad_token_id=pad_id,
        do_sample=True,
        temperature=1.0,
        top_k=50,
        top_p=1.0,
    )
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return {"name": TINY, "seed": _TINY_SEED, "vocab_size": len(tokenizer), **_TINY_SIZES}


def tiny_model_path() -> pathlib.Path:
    """The folder of the offline ``tiny`` model: the package's own; ``GRPO_MAGIC_BUILD_MODELS=1`` builds it from
    the recipe into the cache (once, reused after)."""
    return cached_folder(TINY_VERSION, lambda dest: _build_tiny(dest))
