"""The GPU extra's stack, shown on a CPU (issue 39): TRL settings named as the installed transformers names them,
refusals before a model loads, what reaches ``from_pretrained``, a memory estimate that follows the installed TRL,
the ``vllm`` extra's pin, and vLLM's context for whole episodes.

Unit level: no GRPO training. What CUDA would decide is stood in for at its one query (``torch.cuda.is_available``,
the compute capability); transformers 5.17's ``TrainingArguments`` is stood in for by its field names.
"""

from __future__ import annotations

import pytest

from grpo_magic import GRPOMagicError, GRPOParams
from grpo_magic.config import trl_settings as ts

# ---------------------------------------------------------------- 1. checkpointing: the installed transformers' names

#: The pair as transformers 5.17 declares it: only the old names (read from its wheel's training_args.py).
FIELDS_5_17 = ("gradient_checkpointing", "gradient_checkpointing_kwargs")
#: ... and as 5.24 does: the new names, the old ones kept as deprecated aliases.
FIELDS_5_24 = ("activation_checkpointing", "activation_checkpointing_kwargs", *FIELDS_5_17)


def test_the_setting_is_the_name_the_installed_transformers_has_and_the_other_its_alias():
    assert ts.aliases_for(FIELDS_5_17) == {"activation_checkpointing": "gradient_checkpointing",
                                           "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}
    assert ts.aliases_for(FIELDS_5_24) == {"gradient_checkpointing": "activation_checkpointing",
                                           "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}
    assert ts.aliases_for(("learning_rate",)) == {}
    installed = {f.name for f in ts.config_fields()}
    assert dict(ts.ALIASES) == ts.aliases_for(installed)


@pytest.fixture
def transformers_5_17(monkeypatch):
    """The installed GRPOConfig's fields without the names transformers 5.17 lacks (the activation_* pair)."""
    real = ts.config_fields()
    monkeypatch.setattr(ts, "config_fields", lambda: tuple(f for f in real if not f.name.startswith("activation_")))
    cached = (ts._installed_aliases, ts.settings, ts.setting_of, ts.unsettable, ts._own_names, ts.config_defaults)

    def clear():
        for function in cached:
            function.cache_clear()

    clear()
    yield
    monkeypatch.undo()
    clear()


@pytest.mark.parametrize("given", ["gradient_checkpointing", "activation_checkpointing"])
def test_both_checkpointing_names_set_gradient_checkpointing_on_transformers_5_17(transformers_5_17, given):
    assert "activation_checkpointing" not in ts.settings() and "gradient_checkpointing" in ts.settings()
    names = [f.name for f in GRPOParams.fields()]
    explicit, trl = ts.route({given: False}, names, GRPOParams.flag)
    assert (explicit, trl) == ({}, {"gradient_checkpointing": False})
    with pytest.raises(GRPOMagicError, match="same setting .*activation_checkpointing is its new name"):
        ts.route({"gradient_checkpointing": True, "activation_checkpointing": False}, names, GRPOParams.flag)
    from grpo_magic.frontends.cli import build_parser, params_from_namespace

    args = build_parser().parse_args(["train", "--model", "tiny", f"--no-{given.replace('_', '-')}"])
    assert params_from_namespace(args).trl_settings == {"gradient_checkpointing": False}


@pytest.mark.parametrize("given", ["gradient_checkpointing", "activation_checkpointing"])
def test_both_checkpointing_flags_reach_the_installed_grpo_config(given):
    from grpo_magic.frontends.cli import build_parser, params_from_namespace

    setting = "activation_checkpointing" if "activation_checkpointing" in ts.settings() else "gradient_checkpointing"
    args = build_parser().parse_args(["train", "--model", "tiny", f"--no-{given.replace('_', '-')}"])
    params = params_from_namespace(args)
    assert params.trl_settings == {setting: False}
    assert GRPOParams(model="tiny", **{given: True}).trl_settings == {setting: True}
    config = ts.build_config(GRPOParams(model="tiny", **{given: False}).grpo_config_kwargs("out"))
    assert config.gradient_checkpointing is False and getattr(config, setting) is False


# ---------------------------------------------------------------- 2. QLoRA with vLLM: refused before a model loads


def test_load_in_4bit_with_use_vllm_is_refused_in_one_sentence(capsys, monkeypatch):
    from grpo_magic.frontends.cli import main

    with pytest.raises(GRPOMagicError, match=r"cannot be used with --use-vllm.*drop --use-vllm") as caught:
        GRPOParams(model="tiny", peft=True, load_in_4bit=True, use_vllm=True).validate()
    message = str(caught.value)
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence, on any machine (no GPU check first)
    assert GRPOParams(model="tiny", peft=True, use_vllm=True).problems() == []
    monkeypatch.setattr("grpo_magic.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv",
                 "--peft", "--load-in-4bit", "--use-vllm", "--dry-run"])
    assert code == 2 and "cannot be used with --use-vllm" in capsys.readouterr().err


# ---------------------------------------------------------------- 3. --model-init-kwargs reaches the model's loading

INIT = '{"attn_implementation": "eager", "use_kernels": false, "dtype": "float32"}'


@pytest.fixture
def from_pretrained(monkeypatch):
    """``from_pretrained``'s keyword arguments, recorded; the model is loaded as asked, minus the device map."""
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained
    seen: list[dict] = []

    def record(path, **kwargs):
        seen.append(kwargs)
        return real(path, **{k: v for k, v in kwargs.items() if k != "device_map"})

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", record)
    return seen


def test_model_init_kwargs_is_a_setting_that_reaches_from_pretrained(from_pretrained):
    import torch

    from grpo_magic.frontends.cli import build_parser, params_from_namespace
    from grpo_magic.models import load_model

    params = params_from_namespace(build_parser().parse_args(["train", "--model", "tiny", "--model-init-kwargs", INIT]))
    assert params.problems() == [] and params.model_init_kwargs == INIT
    assert params.grpo_config_kwargs("out")["model_init_kwargs"] == {"attn_implementation": "eager",
                                                                      "use_kernels": False, "dtype": "float32"}
    assert "--model-init-kwargs" in params.to_command()
    model = load_model("tiny", dtype=torch.bfloat16, model_init_kwargs=params.model_init_kwargs)
    kwargs = from_pretrained[-1]
    assert kwargs["attn_implementation"] == "eager" and kwargs["use_kernels"] is False
    assert kwargs["dtype"] is torch.float32 and model.dtype == torch.float32  # the user's dtype wins over the run's
    assert model.config._attn_implementation == "eager"
    load_model("tiny", model_init_kwargs={"dtype": "auto"})
    assert from_pretrained[-1]["dtype"] == "auto"


@pytest.mark.parametrize(("value", "words"), [
    ("{bad", "is not valid JSON"),
    ("sdpa", "must be a JSON object"),
    ('{"dtype": "bf16"}', "use one of auto, bfloat16, float16, float32"),
    ('{"quantization_config": {"load_in_4bit": true}}', "use --load-in-4bit"),
])
def test_a_bad_model_init_kwargs_is_one_sentence_before_any_model_loads(capsys, monkeypatch, value, words):
    from grpo_magic.frontends.cli import main

    with pytest.raises(GRPOMagicError, match=words) as caught:
        GRPOParams(model="tiny", model_init_kwargs=value).validate()
    assert str(caught.value).startswith("model_init_kwargs (--model-init-kwargs) ") and str(caught.value).endswith(".")
    monkeypatch.setattr("grpo_magic.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv",
                 "--model-init-kwargs", value, "--dry-run"])
    assert code == 2 and words in capsys.readouterr().err


# ---------------------------------------------------------------- 4. on CUDA the weights load onto the process's device


@pytest.fixture
def cuda(monkeypatch):
    """Stand in for CUDA with ``n`` devices, the current one 0 (its only queries: available, count, current)."""
    import torch

    def set_to(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    return set_to


def test_on_cuda_the_model_loads_straight_onto_the_process_s_device(cuda, from_pretrained, monkeypatch):
    import torch

    from grpo_magic.models import load_model

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    load_model("tiny", dtype=torch.float32)  # no CUDA: no device map, the CPU as before
    assert "device_map" not in from_pretrained[-1]
    cuda(1)
    load_model("tiny", dtype=torch.float32)
    assert from_pretrained[-1]["device_map"] == {"": 0}
    cuda(2)
    monkeypatch.setenv("LOCAL_RANK", "1")  # a launched process: its device, before accelerate sets it
    load_model("tiny", dtype=torch.float32)
    assert from_pretrained[-1]["device_map"] == {"": 1}
    load_model("tiny", dtype=torch.float32, model_init_kwargs={"device_map": "auto"})  # the user's wins
    assert from_pretrained[-1]["device_map"] == "auto"
    load_model("tiny", dtype=torch.float32, use_cpu=True)  # a run that trains on the CPU (use_cpu) all the same
    assert "device_map" not in from_pretrained[-1]


# ---------------------------------------------------------------- 5. the memory estimate follows the installed TRL

#: Qwen2.5-0.5B-Instruct's config.json (its shape: the numbers that size every term).
QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
            "tie_word_embeddings": True, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "torch_dtype": "bfloat16"}
#: Notebook 03's training line.
NOTEBOOK_03 = dict(peft=True, lora_r=16, lora_alpha=32, use_vllm=True, vllm_mode="colocate",
                   vllm_gpu_memory_utilization=0.3, rl_num_generations=8, batch_size=16, rl_max_new_tokens=512,
                   rl_max_tool_turns=4, lr=5e-5, max_steps=60)


@pytest.fixture
def qwen_05b(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(QWEN_05B))
    return str(tmp_path)


def test_notebook_03_s_run_fits_a_t4_because_trl_computes_the_logits_in_tiles(qwen_05b, monkeypatch):
    import trl
    from packaging.version import Version

    from grpo_magic.config import memory
    from grpo_magic.config.memory import estimate, fused_lm_head_tile

    if Version(trl.__version__) >= Version("1.15"):  # the tile is TRL's own (TRL 1.14 has no fused head, nor triton)
        from trl.kernels import chunked_logprob
        from trl.trainer import utils as trl_utils

        assert fused_lm_head_tile() == (chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE)
    monkeypatch.setattr(memory, "fused_lm_head_tile", lambda version=None: (4096, 32768))  # TRL >= 1.15, the vllm extra's
    est = estimate(GRPOParams(model="Qwen/Qwen2.5-0.5B-Instruct", **NOTEBOOK_03), qwen_05b, card="T4")
    completion_tokens = 16 * 512  # a micro-batch's completions: on CUDA only they are scored
    tile = 4096 * 32768 * 2  # one fp16 tile, reused (a T4 trains in fp16)
    assert est.terms["logits"] == tile + completion_tokens * 896 * (2 + 4) + completion_tokens * 32
    assert est.terms["logits"] < 0.35e9  # was 14.94 GB: tokens x vocab x 8 bytes
    assert est.fits is True and "fits on T4 (16 GB)" in est.text(), est.text()
    assert 7.0e9 < est.total < 8.0e9  # weights 1.02, gradients 0.04, optimizer 0.07, activations 1.18, vLLM 4.80
    full = estimate(GRPOParams(model="Qwen/Qwen2.5-0.5B-Instruct", **{**NOTEBOOK_03, "peft": False}), qwen_05b,
                    card="T4")
    assert full.terms["logits"] - est.terms["logits"] == 151936 * 896 * 4  # the trained head's float32 gradient


def test_an_older_trl_keeps_the_whole_logits_term(qwen_05b, monkeypatch):
    from grpo_magic.config import memory

    assert memory.fused_lm_head_tile("1.14.0") is None and memory.fused_lm_head_tile("1.15.0") == (4096, 32768)
    monkeypatch.setattr(memory, "fused_lm_head_tile", lambda version=None: None)
    est = memory.estimate(GRPOParams(model="Qwen/Qwen2.5-0.5B-Instruct", **NOTEBOOK_03), qwen_05b, card="T4")
    assert est.terms["logits"] == 16 * (256 + 512) * 151936 * 8 and est.fits is False


# ---------------------------------------------------------------- 6. the vllm extra: the release TRL declares


def test_the_vllm_extra_pins_the_newest_vllm_the_installed_trl_declares():
    from importlib.metadata import requires, version
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    root = Path(__file__).resolve().parents[1]
    pinned = next(line.split("==")[1].strip() for line in (root / "requirements-ci.txt").read_text().splitlines()
                  if line.startswith("trl=="))
    if version("trl") != pinned:
        pytest.skip(f"the extra follows TRL {pinned}'s declaration (requirements-ci.txt); trl {version('trl')} here")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    (extra,) = [Requirement(r) for r in project["optional-dependencies"]["vllm"] if Requirement(r).name == "vllm"]
    (trl,) = [Requirement(r) for r in requires("trl") or []
              if Requirement(r).name == "vllm" and r.split(";")[1:] and Requirement(r).marker.evaluate({"extra": "vllm"})]
    (newest,) = [Version(s.version) for s in trl.specifier if s.operator == "<="]
    assert [(s.operator, Version(s.version)) for s in extra.specifier] == [("==", newest)]  # TRL 1.16: 0.31.0
    assert newest in trl.specifier and Version(f"{newest}.post1") not in extra.specifier
    later = Version(f"{newest.major}.{newest.minor}.{newest.micro + 1}")
    assert later not in trl.specifier and later not in extra.specifier  # 0.31.1: outside TRL's range and the extra


# ---------------------------------------------------------------- 7. a learning rate bf16 adapters can take


def test_bf16_rounds_away_adam_steps_below_the_floor_on_lora_s_a_matrices():
    """The floor's reason, measured: one AdamW step on a LoRA A matrix (PEFT's init) kept in bf16."""
    import math

    import torch

    from grpo_magic.training.preflight import bf16_lr_floor

    torch.manual_seed(0)

    def moved(lr: float) -> float:
        a = torch.empty(16, 896)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        p = torch.nn.Parameter(a.to(torch.bfloat16))
        before = p.detach().clone()
        p.grad = torch.randn_like(p)
        torch.optim.AdamW([p], lr=lr, weight_decay=0.0).step()
        return (p.detach() != before).float().mean().item()

    assert moved(1e-5) < 0.2 and moved(bf16_lr_floor(896)) > 0.85 and bf16_lr_floor(896) == pytest.approx(6.5e-5, 0.01)


def test_qlora_at_a_learning_rate_bf16_cannot_resolve_is_warned_in_one_sentence(qwen_05b, monkeypatch, caplog):
    from grpo_magic import models
    from grpo_magic.training.preflight import bf16_adapter_lr_warning, prepare

    qlora = GRPOParams(model="tiny", peft=True, load_in_4bit=True)  # --lr's default, 1e-5
    words = bf16_adapter_lr_warning(qlora, qwen_05b)
    assert words.startswith("lr (--lr) 1e-05 is too small") and "use --lr 1e-4 or more" in words
    assert words.count(". ") == 0 and words.endswith(".")
    assert bf16_adapter_lr_warning(qlora.replace(lr=1e-4), qwen_05b) is None
    assert bf16_adapter_lr_warning(qlora.replace(load_in_4bit=False), qwen_05b) is None  # PEFT keeps them float32
    monkeypatch.setattr(models, "four_bit_problem", lambda peft, use_vllm=False: None)  # stand in for a CUDA GPU
    with caplog.at_level("WARNING", logger="grpo_magic.training.preflight"):
        prepare(qlora.replace(rl_env_module="envs.letters", rl_env_class="LettersEnv"))
    assert any("lr (--lr) 1e-05 is too small" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- 8. vLLM's context holds whole episodes


class ThreeTurnEnv:
    """Three assistant turns: TRL's completion, then two more through ``generator`` after each tool result."""

    def __init__(self, max_turns: int = 3, max_new_tokens: int = 40) -> None:
        self.max_turns, self.max_new_tokens = max_turns, max_new_tokens

    def build_dataset(self, tokenizer):
        from datasets import Dataset

        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Book room {i}."}] for i in range(8)]})

    def score_episode(self, model, tokenizer, completion, generator=None):
        messages = [{"role": "assistant", "content": completion}]
        for _ in range(self.max_turns - 1):
            messages += [{"role": "tool", "content": '{"rooms": []}'}]
            messages += [{"role": "assistant", "content": generator.chat(messages, max_new_tokens=self.max_new_tokens)}]
        return 1.0


class OneReplyEnv(ThreeTurnEnv):
    def score_episode(self, model, tokenizer, completion):
        return 1.0


def test_vllm_s_context_holds_a_three_turn_episode_capped_by_the_model_s(tiny_path):
    from grpo_magic.models import load_tokenizer
    from grpo_magic.training.preflight import (
        TOOL_RESULT_TOKENS,
        episode_turns,
        longest_prompt_tokens,
        vllm_context_length,
    )

    tokenizer = load_tokenizer("tiny")
    params = GRPOParams(model="tiny", rl_max_new_tokens=64, use_vllm=True)
    env = ThreeTurnEnv()
    data = env.build_dataset(tokenizer)
    prompt = longest_prompt_tokens(data, tokenizer)
    assert vllm_context_length(params, data, tokenizer, tiny_path, env=OneReplyEnv()) == prompt + 64  # as before
    assert episode_turns(env, params) == (3, 40)
    episode = vllm_context_length(params, data, tokenizer, tiny_path, env=env)
    assert episode == prompt + 64 + 2 * (TOOL_RESULT_TOKENS + 40)  # TRL's completion, then two tool results + replies
    assert vllm_context_length(params, data, tokenizer, tiny_path, env=ThreeTurnEnv(max_turns=30)) == 2048  # tiny's
    assert vllm_context_length(params.replace(vllm_max_model_length=300), data, tokenizer, tiny_path, env=env) == 300

    class NoTurns(ThreeTurnEnv):  # no max_turns or max_new_tokens of its own: the run's tool turns and reply length
        def __init__(self):
            pass

    assert episode_turns(NoTurns(), params) == (params.rl_max_tool_turns, 64)


@pytest.fixture
def vllm_server():
    """A stand-in vLLM server on 127.0.0.1 that answers ``GET /v1/models`` as vLLM's OpenAI server does."""
    import http.server
    import json
    import threading

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"object": "list", "data": [
                {"id": "tiny", "object": "model", "root": "tiny", "max_model_len": 120}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_server_generator_reads_the_context_the_server_was_started_with(vllm_server, tiny_path):
    from types import SimpleNamespace

    from grpo_magic.environment.generation import PromptTooLong, VLLMServerGenerator, served_max_model_len
    from grpo_magic.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048))
    assert served_max_model_len(vllm_server) == 120
    generator = VLLMServerGenerator(model, tokenizer, client=SimpleNamespace(base_url=vllm_server), max_new_tokens=40)
    assert generator.context_length() == 120  # the server's cap, not the model's 2048
    generator._complete = lambda ids, budget: pytest.fail("a request the server would refuse was sent")
    with pytest.raises(PromptTooLong, match="context of 120 tokens"):
        generator.generate("word " * 100)
    silent = VLLMServerGenerator(model, tokenizer, base_url="http://127.0.0.1:9")  # nothing answers there
    assert served_max_model_len("http://127.0.0.1:9", timeout=1) is None and silent.context_length() == 2048
