"""The offline tiny model, model resolution, loading and the LoRA config, on real objects."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from grpo_magic import models
from grpo_magic.errors import GRPOMagicError
from grpo_magic.models import cache
from grpo_magic.models import tiny as tiny_module

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_rooms",
            "description": "Search free rooms in a city.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok(tiny_path: str) -> Any:
    return models.load_tokenizer(tiny_path)


@pytest.fixture(scope="module")
def model(tiny_path: str) -> Any:
    return models.load_model(tiny_path)


# ---------------------------------------------------------------- building and caching tiny


def test_tiny_is_built_once_then_returned_from_the_cache(tiny_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_second_build(dest: pathlib.Path) -> dict:
        raise AssertionError("tiny was built again although the cache holds it")

    monkeypatch.setattr(tiny_module, "_build_tiny", no_second_build)
    again = models.tiny_model_path()
    assert str(again) == tiny_path and cache.is_ready(again)
    assert again.name == models.TINY_VERSION
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja"):
        assert (again / name).is_file(), name


def test_the_offline_models_ship_with_the_package_and_load_with_no_build(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: pathlib.Path) -> None:
    import hashlib

    from grpo_magic.models import warmstart

    def no_build(*args: Any, **kwargs: Any) -> dict:
        raise AssertionError("built although the package ships it")

    monkeypatch.setattr(tiny_module, "_build_tiny", no_build)
    monkeypatch.setattr(warmstart.WarmStart, "build", no_build)
    monkeypatch.setenv("GRPO_MAGIC_CACHE", str(tmp_path / "empty-cache"))
    for resolve in (models.tiny_model_path, models.tiny_math_path, models.tiny_agent_path):
        folder = resolve()
        assert folder.parent == cache.SHIPPED and cache.is_ready(folder)
        assert json.loads((folder / cache.MARKER).read_text())["version"] == folder.name
        card = (folder / "MODEL_CARD.md").read_text()
        assert hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() in card, folder.name
    assert not (tmp_path / "empty-cache").exists()
    assert len(list(cache.SHIPPED.iterdir())) == 3


def test_tiny_build_is_deterministic(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    for name in ("one", "two"):
        monkeypatch.setenv("GRPO_MAGIC_CACHE", str(tmp_path / name))
        monkeypatch.setenv("GRPO_MAGIC_BUILD_MODELS", "1")  # the recipe, not the shipped weights
        assert models.cache_dir() == tmp_path / name
        built.append(models.tiny_model_path())
    for file in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (built[0] / file).read_bytes() == (built[1] / file).read_bytes(), file


def test_a_build_that_loses_the_race_keeps_the_winners_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process renames its complete build into place while ours is still building."""
    monkeypatch.setenv("GRPO_MAGIC_CACHE", str(tmp_path))
    monkeypatch.setenv("GRPO_MAGIC_BUILD_MODELS", "1")  # the recipe, not the shipped weights
    final = tmp_path / models.TINY_VERSION
    real_build = tiny_module._build_tiny

    def build_while_another_process_finishes_first(dest: pathlib.Path) -> dict:
        other = tmp_path / "other-process"
        other.mkdir()
        info = real_build(other)
        (other / cache.MARKER).write_text(json.dumps(info))  # as the other process's cached_folder does
        os.rename(other, final)
        return real_build(dest)

    monkeypatch.setattr(tiny_module, "_build_tiny", build_while_another_process_finishes_first)
    assert models.tiny_model_path() == final
    assert cache.is_ready(final)
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith((".lock", ".lock.json")))
    assert left == [models.TINY_VERSION]  # our temp copy is gone (the build's lock file stays)


def test_tiny_loads_with_from_pretrained(tiny_path: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.max_position_embeddings == 2048
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id in model.generation_config.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.do_sample is True


def test_load_tokenizer_and_load_model(tok: Any, model: Any, tiny_path: str) -> None:

    assert tok.padding_side == "left" and tok.pad_token is not None
    assert model.name_or_path == tiny_path  # TRL reloads the reference model from here when beta > 0
    assert type(models.load_model(models.TINY)).__name__ == "Qwen2ForCausalLM"  # plain: TRL applies LoRA itself
    with pytest.raises(TypeError):
        models.load_model(models.TINY, peft=True)  # no argument that is taken and dropped


def test_the_run_s_precision_is_one_this_machine_trains_in(tiny_path: str, in_tmp: pathlib.Path) -> None:
    """bf16 only where the hardware has it: the TRL config, the loaded weights and the saved ones agree."""
    import torch
    import trl
    from safetensors import safe_open

    from envs.letters import LettersEnv
    from grpo_magic import GRPOParams, train

    params = GRPOParams(model="tiny", max_steps=1, batch_size=4, rl_max_new_tokens=4, project_name="run")
    config = params.to_grpo_config(str(in_tmp / "config"))
    precision = torch.bfloat16 if config.bf16 else torch.float32
    assert models.load_model(tiny_path).dtype == precision
    if not torch.cuda.is_available():  # here: TRL's own default (bf16) is refused, the config we give it is not
        with pytest.raises(ValueError, match="bf16"):
            trl.GRPOConfig(output_dir=str(in_tmp / "trl-default"))
        assert precision == torch.float32
    run = train(params, LettersEnv(), display=False)
    assert run.status == "completed" and run.step == 1
    with safe_open(str(run.output_dir / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {precision}


# ---------------------------------------------------------------- tokenizer and chat template


def test_chat_template_renders_tools_and_the_generation_prompt(tok: Any) -> None:
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert "search_rooms" in text
    assert "<tools>" in text and "</tools>" in text
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_renders_a_tool_call_conversation(tok: Any) -> None:
    messages = [
        {"role": "system", "content": "Book hotels."},
        {"role": "user", "content": "A room in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "search_rooms", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "name": "search_rooms", "content": '{"rooms": [12]}'},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBook hotels.")
    assert '<tool_call>\n{"name": "search_rooms", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"rooms": [12]}\n</tool_response><|im_end|>' in text


def test_trl_recognises_the_template_for_tool_calling(tok: Any) -> None:
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    assert tok.chat_template == qwen2_5_chat_template
    assert supports_tool_calling(tok)


@pytest.mark.parametrize(
    "text",
    [
        "How many r's are in strawberry? s t r a w b e r r y -> 3",
        '<tool_call>\n{"name": "search_rooms", "arguments": {"city": "París", "guests": 2}}\n</tool_call>',
        "  spaces,\ttabs\n\nnewlines 12345 and ünïcödé 日本",
    ],
)
def test_decoding_round_trips_text(tok: Any, text: str) -> None:
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text  # the tool-call tags are not special


def test_special_tokens_are_single_tokens(tok: Any) -> None:
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(tok(token)["input_ids"]) == 1, token


def test_sampling_gives_varied_completions(tok: Any, model: Any) -> None:
    import torch

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Count the letters in apple."}], tokenize=False, add_generation_prompt=True
    )
    batch = tok([prompt] * 8, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**batch, do_sample=True, max_new_tokens=12)
    completions = tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert len(set(completions)) > 1


def test_a_tokenizer_without_pad_or_eos_gets_a_pad_and_the_model_is_resized(
    tok: Any, tiny_path: str, tmp_path: pathlib.Path
) -> None:
    import torch

    for special in ("pad", "eos"):
        setattr(tok, f"{special}_token", None)
        tok.save_pretrained(tmp_path / f"no-{special}")
        if special == "pad":
            assert models.load_tokenizer(str(tmp_path / "no-pad")).pad_token == "<|im_end|>"
    tok.pad_token, tok.eos_token = "<|endoftext|>", "<|im_end|>"  # restore the shared fixture

    bare = models.load_tokenizer(str(tmp_path / "no-eos"))
    assert bare.pad_token is not None and bare.pad_token_id == len(bare) - 1
    resized = models.load_model(tiny_path, tokenizer=bare)
    assert resized.get_input_embeddings().weight.shape[0] == len(bare)
    with torch.no_grad():
        resized(**bare(["hi", "a longer prompt"], return_tensors="pt", padding=True))


# ---------------------------------------------------------------- resolve_model


def test_resolve_tiny_and_local_folders(tiny_path: str) -> None:
    assert models.resolve_model("tiny") == tiny_path
    assert models.resolve_model(tiny_path) == tiny_path


@pytest.mark.parametrize("name", ["/no/such/model", "./no-such-model", "../no-such-model", "~/no-such-model", "a/b/c"])
def test_a_missing_local_path_is_named_in_the_error(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path is never taken for a Hub id: neither the HF cache nor the Hub is asked."""
    from grpo_magic.models import loading

    for hub_lookup in ("_cached_config", "_hub_config"):
        monkeypatch.setattr(loading, hub_lookup, lambda *a, _n=hub_lookup: pytest.fail(f"{_n} was called"))
    with pytest.raises(GRPOMagicError, match="does not exist") as info:
        models.resolve_model(name)
    assert f"'{name}'" in str(info.value)


def test_a_file_is_not_a_model_folder(tiny_path: str) -> None:
    with pytest.raises(GRPOMagicError, match="is a file, not a folder"):
        models.resolve_model(os.path.join(tiny_path, "config.json"))


def test_an_unknown_hub_id_offline_fails_fast_with_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast: offline, the Hub is not tried at all (its client retries for tens of seconds)."""
    from grpo_magic.models import loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "_hub_config", lambda *a: pytest.fail("the Hub was tried while offline"))
    with pytest.raises(GRPOMagicError) as info:
        models.resolve_model("nobody-here/no-such-model-3f9a")
    message = str(info.value)
    assert "'nobody-here/no-such-model-3f9a' was not found" in message
    assert "tiny" in message and "\n" not in message


def test_a_hub_id_in_the_local_cache_resolves_offline(tmp_path: pathlib.Path) -> None:
    """The HF cache location is read when huggingface_hub is imported, so this runs in a fresh process."""
    snapshot = tmp_path / "hub" / "models--some-org--some-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 4096}))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    code = textwrap.dedent(
        """
        from grpo_magic.models import model_context_length, resolve_model
        print(resolve_model("some-org/some-model"), model_context_length("some-org/some-model"))
        """
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["some-org/some-model", "4096"]


def test_importing_models_stays_light() -> None:
    code = "import sys, grpo_magic.models; print(sorted({'torch', 'transformers', 'peft', 'trl'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------- context length


def test_context_length_of_tiny() -> None:
    assert models.model_context_length(models.TINY) == 2048


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"n_positions": 1024}, 1024),
        ({"model_type": "llava", "text_config": {"max_position_embeddings": 8192}}, 8192),
        ({"model_type": "mystery"}, None),
    ],
)
def test_context_length_from_the_config_alone(tmp_path: pathlib.Path, config: dict, expected: int | None) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert models.model_context_length(str(tmp_path)) == expected


# ---------------------------------------------------------------- LoRA


def test_lora_config_targets_attention_and_mlp_of_tiny(tiny_path: str) -> None:
    """Applied by PEFT to tiny, the config puts adapters on every attention and MLP projection, nowhere else."""
    import peft

    cfg = models.lora_config(8, 16)
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (8, 16, 0.05)
    assert cfg.task_type == peft.TaskType.CAUSAL_LM
    wrapped = peft.get_peft_model(models.load_model(tiny_path), cfg)
    adapted = {name.rsplit(".", 1)[-1] for name, module in wrapped.named_modules() if hasattr(module, "lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    layers = tiny_module._TINY_SIZES["num_hidden_layers"]
    assert sum(hasattr(m, "lora_A") for _, m in wrapped.named_modules()) == 7 * layers  # every block, every one


def test_peft_wraps_tiny_with_the_config(tiny_path: str) -> None:
    import peft
    import torch

    base = models.load_model(tiny_path)
    wrapped = peft.get_peft_model(base, models.lora_config(4, 8))
    trainable = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    out = wrapped(input_ids=torch.tensor([[1, 5, 7]]), labels=torch.tensor([[1, 5, 7]]))
    out.loss.backward()
    grads = {name: p.grad for name, p in wrapped.named_parameters() if p.grad is not None}
    assert set(grads) == set(trainable)  # the loss reaches every adapter and no base weight
    assert any(g.abs().sum() > 0 for name, g in grads.items() if "lora_B" in name)  # B starts at 0, A's grad too
