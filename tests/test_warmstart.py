"""The warm-start recipe (grpo_magic/models/warmstart.py) on a small tool-use corpus, with TRL's real SFTTrainer.

What a recipe promises: the corpus reaches TRL as written (tool-call arguments included), the loss
sees the assistant turns only (tool results and prompts masked, the end-of-turn token trained),
tools are rendered into the prompt, a resized architecture works, the build is deterministic and
cached, and the result loads through the same ``from_pretrained`` path as any model.
"""

from __future__ import annotations

import json
import pathlib
import random
from typing import Any

import pytest

from grpo_magic import models
from grpo_magic.models import cache
from grpo_magic.models.warmstart import WarmStart, corpus_digest

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "weather", "description": "The weather in a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool_corpus(seed: int) -> list[dict[str, Any]]:
    """Tool dialogues whose calls have different argument keys, and plain chats without tools."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(24):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if i % 3 == 0:
            out.append({"messages": [
                {"role": "user", "content": f"Add {a} and {b}."},
                {"role": "assistant", "content": "", "tool_calls": [_call("add", a=a, b=b)]},
                {"role": "tool", "name": "add", "content": f"RESULT-{a + b}"},
                {"role": "assistant", "content": f"It is {a + b}."},
            ], "tools": TOOLS})
        elif i % 3 == 1:
            out.append({"messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [_call("weather", city="Oslo")]},
            ], "tools": TOOLS})
        else:
            out.append({"messages": [{"role": "user", "content": f"Say {a}."}, {"role": "assistant", "content": str(a)}]})
    return out


RECIPE = WarmStart(
    name="tiny-test-tools",
    version="tiny-test-tools-v1",
    corpus=tool_corpus,
    sft={"max_steps": 3, "per_device_train_batch_size": 4, "logging_steps": 1},
    sizes={"num_hidden_layers": 1},  # a resized architecture: fresh weights, tiny's tokenizer
    check=lambda model, tokenizer: {"layers": model.config.num_hidden_layers},
    description="a test recipe",
)


def test_the_corpus_reaches_the_dataset_as_written() -> None:
    dataset = RECIPE.dataset()
    examples = tool_corpus(RECIPE.seed)
    assert len(dataset) == len(examples)
    for row, example in zip(dataset, examples, strict=True):
        assert row["messages"] == example["messages"]  # no other example's argument keys as None
        assert row["tools"] == example.get("tools")
    assert corpus_digest(tool_corpus(0)) == corpus_digest(tool_corpus(0)) != corpus_digest(tool_corpus(1))


def test_only_assistant_turns_are_trained_and_tools_are_rendered(tmp_path: pathlib.Path, tiny_path: str) -> None:
    trainer = RECIPE.trainer(str(tmp_path))
    tokenizer = trainer.processing_class
    processed = trainer.train_dataset
    examples = tool_corpus(RECIPE.seed)
    assert len(processed) == len(examples)
    for row, example in zip(processed, examples, strict=True):
        ids = row["input_ids"]
        mask = [label != -100 for label in row["labels"]]  # TRL's labels: -100 where the loss ignores a token
        trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        ignored = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        for message in example["messages"]:
            if message["role"] == "assistant" and message["content"]:
                assert message["content"] in trained
            if message["role"] in ("user", "tool"):
                assert message["content"] in ignored and message["content"] not in trained
        assert trained.count("<|im_end|>") == sum(m["role"] == "assistant" for m in example["messages"])
        if example.get("tools"):
            call = example["messages"][1]["tool_calls"][0]["function"]
            assert f'"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}' in trained
            assert "<tools>" in ignored and '"name": "weather"' in ignored  # the schemas, in the system prompt
        else:
            assert "<tools>" not in ignored


def test_a_build_is_deterministic_cached_and_loads_like_any_model(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tiny_path: str
) -> None:
    built = []
    for name in ("one", "two"):
        monkeypatch.setenv("GRPO_MAGIC_CACHE", str(tmp_path / name))
        monkeypatch.setenv("GRPO_MAGIC_BUILD_MODELS", "1")  # the recipe, not the shipped weights
        (tmp_path / name).mkdir()
        (tmp_path / name / models.TINY_VERSION).symlink_to(tiny_path)  # the same tiny underneath
        built.append(RECIPE.path())
    assert built[0].name == RECIPE.cache_key == f"tiny-test-tools-v1+{models.TINY_VERSION}"
    for file in ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"):
        assert (built[0] / file).read_bytes() == (built[1] / file).read_bytes(), file
    info = cache.build_info(built[0])
    assert info["name"] == "tiny-test-tools" and info["steps"] == 3 and info["examples"] == 24
    assert info["check"] == {"layers": 1} and info["sft"]["assistant_only_loss"] is True
    assert len(info["loss_curve"]) == 3
    assert RECIPE.path() == built[1]  # reused, not rebuilt

    model = models.load_model(str(built[0]))
    tokenizer = models.load_tokenizer(str(built[0]))
    assert model.config.num_hidden_layers == 1 and len(model.config.layer_types) == 1
    assert tokenizer.chat_template == models.load_tokenizer(tiny_path).chat_template
    assert model.generation_config.eos_token_id == models.load_model(tiny_path).generation_config.eos_token_id
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say 3."}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_sharpen_multiplies_the_built_models_logits_and_nothing_else(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tiny_path: str
) -> None:
    """``sharpen``: the same build (deterministic) with its logits times the factor, recorded in the build info;
    the embedding (tied to the unembedding) and every layer are the same bits."""
    import dataclasses

    import torch

    paths = []
    for factor in (1.0, 2.5):
        monkeypatch.setenv("GRPO_MAGIC_CACHE", str(tmp_path / str(factor)))
        monkeypatch.setenv("GRPO_MAGIC_BUILD_MODELS", "1")  # the recipe, not the shipped weights
        (tmp_path / str(factor)).mkdir()
        (tmp_path / str(factor) / models.TINY_VERSION).symlink_to(tiny_path)
        paths.append(dataclasses.replace(RECIPE, sharpen=factor).path())
    assert [cache.build_info(p)["sharpen"] for p in paths] == [1.0, 2.5]
    plain, sharp = (models.load_model(str(p)) for p in paths)
    plain_state, sharp_state = plain.state_dict(), sharp.state_dict()
    assert [k for k in plain_state if not torch.equal(plain_state[k], sharp_state[k])] == ["model.norm.weight"]
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(sharp(ids).logits, 2.5 * plain(ids).logits, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(sharp(ids).logits, plain(ids).logits, rtol=1e-2)


def _circuit_start(seed: int) -> Any:
    from research.tiny_agent.copy_circuit import fresh_model

    return fresh_model(seed, freeze=True)


def test_a_recipe_can_start_from_its_own_model_and_keep_part_of_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tiny_path: str
) -> None:
    """``start``: the copy circuit's model, frozen where the circuit is, is what SFT trains and saves; on the
    recipe's ``threads`` (at most the machine's cores), after which torch's own setting is back."""
    import dataclasses
    import os

    import torch

    recipe = dataclasses.replace(RECIPE, name="tiny-test-start", version="tiny-test-start-v1", sizes={},
                                 start=_circuit_start, check=None, threads=2)
    before = _circuit_start(recipe.seed).state_dict()
    monkeypatch.setenv("GRPO_MAGIC_CACHE", str(tmp_path))
    monkeypatch.setenv("GRPO_MAGIC_BUILD_MODELS", "1")  # the recipe, not the shipped weights
    (tmp_path / models.TINY_VERSION).symlink_to(tiny_path)
    threads = torch.get_num_threads()
    path = recipe.path()
    assert cache.build_info(path)["threads"] == min(2, os.cpu_count() or 1)
    assert torch.get_num_threads() == threads
    after = models.load_model(str(path)).state_dict()
    assert after["model.embed_tokens.weight"].shape[1] == 192  # the start's architecture, not tiny's
    kept = [k for k in before if k.startswith(("model.embed_tokens", "model.layers.0.", "model.layers.1."))]
    changed = [k for k in before if k.startswith("model.layers.3.") and not torch.equal(before[k], after[k])]
    assert kept and all(torch.equal(before[k], after[k]) for k in kept)
    assert changed  # the layers after the circuit learned
    # and a run that loads it (GRPO, the check) trains what SFT trained, not the circuit
    trainable = {name for name, p in models.load_model(str(path)).named_parameters() if p.requires_grad}
    assert not trainable & set(kept) and trainable >= set(changed)


def test_warm_started_models_are_offline_models() -> None:
    from grpo_magic.models import tiny_math

    assert models.OFFLINE_MODELS[models.TINY_MATH] is tiny_math.tiny_math_path
    assert tiny_math.RECIPE.name == "tiny-math" == models.TINY_MATH
    assert tiny_math.RECIPE.cache_key.startswith("tiny-math-v")
