"""The GPU path, shown on a CPU: what CUDA would decide is stood in for at its one query.

The precision decision (``device.choose_precision``) is fed the compute capability of a T4 (7.5), an
A100 (8.0) or no GPU; the CUDA device of a thread is a per-thread stand-in for ``torch.cuda``'s
``set_device``/``current_device``; TRL's colocated vLLM engine is a stand-in object where TRL keeps
it. Everything else is real: GRPOConfig, the launcher's plans, real runs of TRL on ``tiny``.
``scripts/gpu_smoke.sh`` runs the same things on a GPU.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import threading
import weakref
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, train
from grpo_magic.environment.episodes import EpisodeRunner
from grpo_magic.frontends.cli import main
from grpo_magic.runtime import device
from grpo_magic.runtime.distributed import TRL_ENV_VARS, inside_launch, world_size
from grpo_magic.runtime.release import oom_hint as _oom_hint
from grpo_magic.training.run import last_run

REPO = Path(__file__).resolve().parents[1]
T4, A100 = (7, 5), (8, 0)
FAST = dict(model="tiny", batch_size=4, rl_num_generations=4, rl_max_new_tokens=6, seed=0)


@pytest.fixture
def capability(monkeypatch):
    """Stand in for the GPU's compute capability (None: no CUDA), the one query the decision makes."""

    def set_to(value):
        monkeypatch.setattr(device, "cuda_capability", lambda device=None: value)

    return set_to


# ---------------------------------------------------------------- one precision decision


@pytest.mark.parametrize(
    ("gpu", "precision", "config", "load", "load_peft", "vllm"),
    [
        (T4, "fp16", {"bf16": False, "fp16": True}, torch.float32, torch.float16, "float16"),
        (A100, "bf16", {"bf16": True, "fp16": False}, torch.bfloat16, torch.bfloat16, "bfloat16"),
        (None, "fp32", {"bf16": False, "fp16": False}, torch.float32, torch.float32, "auto"),
    ],
)
def test_one_decision_for_the_load_grpo_config_and_vllm(capability, gpu, precision, config, load, load_peft, vllm):
    capability(gpu)
    params = GRPOParams(model="tiny")
    assert params.precision() == device.choose_precision() == precision
    kwargs = params.grpo_config_kwargs("out")
    assert {k: kwargs[k] for k in ("bf16", "fp16")} == config
    assert device.load_dtype(precision) == load and device.load_dtype(precision, peft=True) == load_peft
    assert device.vllm_dtype(precision) == vllm


def test_a_t4_is_not_taken_for_a_bf16_gpu(capability):
    # torch.cuda.is_bf16_supported() counts emulation by default, so sm75 said yes: the decision reads
    # the capability instead, as is_bf16_supported(including_emulation=False) does.
    from grpo_magic.models import supports_bf16

    capability(T4)
    assert not supports_bf16() and not device.native_bf16()
    capability(A100)
    assert supports_bf16() and device.native_bf16()


def test_the_cpu_config_builds_and_the_model_loads_in_the_run_s_dtype(capability, tiny_path):
    from grpo_magic.models import load_model

    capability(None)
    config = GRPOParams(model="tiny").to_grpo_config("out")
    assert (config.bf16, config.fp16) == (False, False)
    assert load_model(tiny_path).dtype == torch.float32  # no dtype given: the device's choice
    assert load_model(tiny_path, dtype=device.load_dtype("bf16")).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("bf16", "fp16", "gpu", "expected"),
    [
        (True, None, T4, "bf16"),  # explicit wins over the device
        (None, True, A100, "fp16"),
        (False, None, A100, "fp32"),  # bf16 refused where it was the choice: float32
        (None, False, T4, "fp32"),
        (False, None, T4, "fp16"),  # refusing what was not chosen changes nothing
        ("true", "", None, "bf16"),  # as a form or a command line gives them
    ],
)
def test_an_explicit_bf16_or_fp16_wins(capability, bf16, fp16, gpu, expected):
    capability(gpu)
    assert device.choose_precision(bf16, fp16) == expected
    params = GRPOParams(model="tiny")
    params.__dict__["trl_settings"] = {"bf16": bf16, "fp16": fp16}  # where the TRL settings bag keeps them
    assert params.precision() == expected


def test_bf16_and_fp16_together_is_one_sentence(capability):
    capability(A100)
    with pytest.raises(GRPOMagicError, match="both set to true; set only one") as info:
        device.choose_precision(True, True)
    assert str(info.value).count(".") == 1
    with pytest.raises(GRPOMagicError, match="bf16 must be true or false"):
        device.choose_precision("maybe")


# ---------------------------------------------------------------- trl vllm-serve for each GPU split

SERVER = ["--use-vllm", "--vllm-mode", "server"]


def _plan(capsys, monkeypatch, gpus: int, *flags: str, model: str = "tiny") -> tuple[int, str, str]:
    monkeypatch.setenv("GRPO_MAGIC_FAKE_GPUS", str(gpus))
    code = main(
        [
            "train",
            "--model",
            model,
            "--rl-env-module",
            "envs.letters",
            "--rl-env-class",
            "LettersEnv",
            *SERVER,
            *flags,
            "--dry-run",
        ]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


def _serve(out: str) -> list[str]:
    return shlex.split(next(line for line in out.splitlines() if "vllm-serve --model" in line))


def _longest_letters_prompt(tiny_path: str) -> int:
    from grpo_magic.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_path)
    prompts = list(LettersEnv().build_dataset(tokenizer)["prompt"])
    return max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize(
    ("gpus", "server", "tp", "gpu", "dtype"),
    [
        (2, 1, 1, A100, "bfloat16"),
        (4, 2, 2, T4, "float16"),
        (8, 4, 4, A100, "bfloat16"),
    ],
)
def test_each_split_that_works_serves_in_the_run_s_dtype_and_context(
    capsys, monkeypatch, capability, tiny_path, gpus, server, tp, gpu, dtype
):
    capability(gpu)
    code, out, err = _plan(
        capsys,
        monkeypatch,
        gpus,
        "--vllm-server-gpus",
        str(server),
        "--vllm-tensor-parallel-size",
        str(tp),
        "--rl-max-new-tokens",
        "20",
    )
    assert code == 0, err
    serve = _serve(out)
    assert serve[0] == "CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(gpus - server, gpus))
    assert serve[serve.index("--tensor-parallel-size") + 1] == str(tp) and "--data-parallel-size" not in serve
    assert serve[serve.index("--dtype") + 1] == dtype
    assert int(serve[serve.index("--max-model-len") + 1]) == _longest_letters_prompt(tiny_path) + 20


def test_the_data_parallel_split_of_a_dense_model_is_refused_in_one_sentence(capsys, monkeypatch, capability):
    capability(A100)
    code, out, err = _plan(capsys, monkeypatch, 8, "--vllm-server-gpus", "4", "--vllm-tensor-parallel-size", "2")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--data-parallel-size 2" in err and "dense model" in err
    assert "--vllm-tensor-parallel-size 4" in err and "--vllm-server-gpus 2" in err


def test_a_mixture_of_experts_model_may_use_data_parallelism(capsys, monkeypatch, capability, tiny_path, tmp_path):
    moe = tmp_path / "tiny-moe"
    shutil.copytree(tiny_path, moe)
    config = json.loads((moe / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({**config, "num_local_experts": 4, "num_experts_per_tok": 2}))
    capability(None)  # a dry run on a machine without the GPUs: vLLM's auto dtype, no --dtype
    code, out, err = _plan(
        capsys,
        monkeypatch,
        8,
        "--vllm-server-gpus",
        "4",
        "--vllm-tensor-parallel-size",
        "2",
        "--vllm-max-model-length",
        "512",
        model=str(moe),
    )
    assert code == 0, err
    serve = _serve(out)
    assert serve[serve.index("--data-parallel-size") + 1] == "2" and "--dtype" not in serve
    assert serve[serve.index("--max-model-len") + 1] == "512"  # the explicit length wins


# ---------------------------------------------------------------- vllm_max_model_length


def test_vllm_max_model_length_is_the_longest_prompt_plus_the_completion(tiny_path, in_tmp):
    from grpo_magic.training.preflight import prepare
    from grpo_magic.training.run import run_config_overrides

    params, prepared, model_path, tokenizer = prepare(
        GRPOParams(**FAST, use_vllm=False, rl_env_module="envs.letters", rl_env_class="LettersEnv")
    )
    assert "vllm_max_model_length" not in run_config_overrides(params, prepared, tokenizer, model_path)
    vllm = params.replace(use_vllm=True)
    overrides = run_config_overrides(vllm, prepared, tokenizer, model_path)
    config = vllm.to_grpo_config("out", **overrides)
    assert config.vllm_max_model_length == _longest_letters_prompt(tiny_path) + FAST["rl_max_new_tokens"]
    explicit = vllm.replace(vllm_max_model_length=300)
    assert (
        explicit.to_grpo_config(
            "out", **run_config_overrides(explicit, prepared, tokenizer, model_path)
        ).vllm_max_model_length
        == 300
    )


def test_chat_prompts_count_their_template_and_tools(tiny_path):
    from datasets import Dataset

    from grpo_magic.models import load_tokenizer
    from grpo_magic.training.preflight import longest_prompt_tokens

    tokenizer = load_tokenizer("tiny-agent")
    messages = [{"role": "user", "content": "Book a room for two nights."}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "book",
                "description": "Book a room.",
                "parameters": {"type": "object", "properties": {"nights": {"type": "integer"}}, "required": ["nights"]},
            },
        }
    ]
    data = Dataset.from_dict({"prompt": [messages, [{"role": "user", "content": "Hi"}]]})
    bare = longest_prompt_tokens(data, tokenizer)
    assert bare == len(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    assert longest_prompt_tokens(data, tokenizer, tools) > bare


def test_the_oom_hint_names_vllm_max_model_length():
    hint = _oom_hint(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert "--vllm-max-model-length" in hint and "--vllm-gpu-memory-utilization" in hint


# ---------------------------------------------------------------- the CUDA device of episode threads


@pytest.fixture
def cuda_devices(monkeypatch):
    """Stand in for torch.cuda's per-thread current device: set_device and current_device, per thread."""
    local = threading.local()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: setattr(local, "device", int(d)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(local, "device", 0))
    return local


@pytest.mark.parametrize("is_async", [False, True])
def test_episode_threads_take_the_submitting_thread_s_device(cuda_devices, is_async):
    torch.cuda.set_device(1)  # what accelerate does on rank 1's main thread
    seen: list[tuple[str, int]] = []

    def record() -> float:
        seen.append((threading.current_thread().name, torch.cuda.current_device()))
        return 1.0

    async def record_async() -> float:
        return record()

    runner = EpisodeRunner(workers=4, timeout=30)
    try:
        outcomes = runner.run([record_async if is_async else record] * 8, is_async=is_async)
    finally:
        runner.close()
    assert [o.score for o in outcomes] == [1.0] * 8
    assert {name for name, _ in seen} != {threading.current_thread().name}  # other threads ran them
    assert {d for _, d in seen} == {1}
    assert threading.current_thread().name != "grpo-magic-episode-1" and torch.cuda.current_device() == 1


# ---------------------------------------------------------------- a finished run lets go


class Watch(TrainerCallback):
    """Weak references to what a run holds, and TRL's colocate-mode environment variables set as TRL sets them."""

    def __init__(self, stop: bool = False) -> None:
        self.refs: dict[str, weakref.ref] = {}
        self.stop = stop

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.refs["model"] = weakref.ref(model)
        run = last_run()
        self.refs["reward"] = weakref.ref(run._reward)
        # trl/generation/vllm_generation.py, colocate mode (it needs vllm and a GPU, so here by hand):
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="localhost", MASTER_PORT="29511")

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop:
            last_run().stop()


class FailingLettersEnv(LettersEnv):
    def score_episode(self, model, tokenizer, completion, letter):
        raise RuntimeError("the env broke")


@pytest.mark.parametrize("end", ["completed", "stopped", "failed"])
def test_a_finished_run_releases_the_policy_and_the_reward_and_restores_trl_s_variables(in_tmp, monkeypatch, end):
    for name in TRL_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")  # the user's own value comes back as it was
    watch = Watch(stop=end == "stopped")
    env = FailingLettersEnv() if end == "failed" else LettersEnv()
    run = train(
        GRPOParams(**FAST, max_steps=2, rl_max_error_rate=0.0, project_name="run"),
        env,
        callbacks=[watch],
        display=False,
        raise_on_failure=False,
    )
    assert run.status == end, run.reason
    assert set(watch.refs) == {"model", "reward"}
    assert watch.refs["model"]() is None, "the policy is still alive after the run"
    assert watch.refs["reward"]() is None and run._reward is None
    assert {n: os.environ.get(n) for n in TRL_ENV_VARS} == {
        n: "10.0.0.9" if n == "MASTER_ADDR" else None for n in TRL_ENV_VARS
    }
    assert world_size() == 1 and not inside_launch()
    if end == "failed":  # the kept failure still tells where it happened
        import traceback

        assert "the env broke" in "".join(traceback.format_exception(run.exception))


def test_the_policy_goes_with_its_run_without_the_cycle_collector(in_tmp):
    """No reference cycle holds a finished run's policy (TRL's and accelerate's ``forward`` on the instance was
    one): with Python's cycle collector off, the policy is gone when ``train`` returns, so no run needs a
    ``gc.collect()`` pass over every object to give its memory back."""
    import gc

    watch = Watch(stop=False)
    gc.collect()
    gc.disable()
    try:
        run = train(GRPOParams(**FAST, max_steps=2, project_name="run"), LettersEnv(), callbacks=[watch], display=False)
        alive = watch.refs["model"]() is not None
    finally:
        gc.enable()
    assert run.status == "completed", run.reason
    assert not alive, "a reference cycle keeps the policy alive after its run"


def test_trl_s_vllm_engine_is_released_with_the_trainer(tiny_path, tmp_path, monkeypatch):
    """TRL's real GRPOTrainer with use_vllm=True; only the creation of vllm.LLM (vLLM, a GPU) is stood in for."""
    from datasets import Dataset
    from trl.generation import vllm_generation

    from grpo_magic.models import load_model, load_tokenizer
    from grpo_magic.trl_compat import release_trainer, trainer_class

    shut_down: list[bool] = []

    class StandInEngineCore:
        def shutdown(self):
            shut_down.append(True)

    class StandInLLM:
        def __init__(self):
            self.llm_engine = type("Engine", (), {"engine_core": StandInEngineCore()})()

    monkeypatch.setattr(vllm_generation.VLLMGeneration, "_init_vllm", lambda self: setattr(self, "llm", StandInLLM()))
    tokenizer = load_tokenizer(tiny_path)
    config = GRPOParams(**FAST, use_vllm=True).to_grpo_config(str(tmp_path / "out"), vllm_max_model_length=64)
    trainer = trainer_class()(
        model=load_model(tiny_path, tokenizer=tokenizer),
        args=config,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=Dataset.from_dict({"prompt": ["Say a: "] * 8}),
        processing_class=tokenizer,
    )
    engine = weakref.ref(trainer.vllm_generation.llm)
    release_trainer(trainer)
    assert engine() is None and shut_down == [True] and trainer.vllm_generation.llm is None


# ---------------------------------------------------------------- rescore places the model


def test_rescore_puts_the_model_where_a_run_would(in_tmp, monkeypatch, cuda_devices):
    from grpo_magic import rescore

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the run itself trains on this CPU
    run = train(GRPOParams(**FAST, max_steps=1, project_name="run"), LettersEnv(), display=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.cuda.set_device(1)
    moved: list[str] = []

    def to(self, *args, **kwargs):  # the stand-in GPU: record where the model is sent, keep it here
        moved.append(str(args[0] if args else kwargs.get("device")))
        return self

    monkeypatch.setattr(torch.nn.Module, "to", to)
    from transformers import AutoModelForCausalLM

    real_load, maps = AutoModelForCausalLM.from_pretrained, []

    def load(path, **kwargs):  # the stand-in GPU: the device map the weights would load onto, recorded
        maps.append(kwargs.pop("device_map", None))
        return real_load(path, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load)
    seen: list[object] = []

    class Seeing(LettersEnv):
        def score_episode(self, model, tokenizer, completion, letter):
            seen.append(model)
            return super().score_episode(model, tokenizer, completion, letter)

    monkeypatch.setattr(device, "cuda_capability", lambda device=None: None)  # loads in float32 on this CPU
    report = rescore(run, Seeing(), model="tiny")
    assert report.groups and moved == ["cuda:1"] and maps == [{"": 1}]  # loaded onto cuda:1 (load_model's device_map)
    assert seen and all(isinstance(m, torch.nn.Module) for m in seen)


# ---------------------------------------------------------------- the GPU smoke script


def test_gpu_smoke_script_parses():
    script = REPO / "scripts" / "gpu_smoke.sh"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    inprocess = REPO / "scripts" / "gpu_smoke_inprocess.py"
    compile(inprocess.read_text(), str(inprocess), "exec")
    text = script.read_text() + inprocess.read_text()
    assert "gpu_smoke_inprocess.py" in script.read_text()
    for what in (
        "vllm_max_model_length",
        "choose_precision",
        "second run",
        "current_device",
        "memory_allocated",
        "--rl-env-workers 2",
        "dist.is_initialized()",
        "TRL_ENV_VARS",
    ):
        assert what in text, what


# ---------------------------------------------------------------- the vllm extra's CI check


def test_the_vllm_extra_check_reads_pip_s_report():
    """scripts/check_vllm_extra.py's judgement of a resolution (CI runs the real dry run; it needs PyPI)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_vllm_extra", REPO / "scripts" / "check_vllm_extra.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    pins = check.ci_pins()
    trl_range = check.trl_vllm_range()
    assert "<=0.31" in trl_range.replace(" ", "")

    def report(**versions):
        return {"install": [{"metadata": {"name": n, "version": v}} for n, v in versions.items()]}

    good = check.resolved(report(vllm="0.31.0", torch=pins["torch"] + "+cu130", transformers="5.17.0", trl=pins["trl"]))
    assert check.judge(good, pins, trl_range) == []
    bad = check.resolved(report(vllm="0.33.0", torch="2.14.0", trl="1.15.0"))
    problems = " ".join(check.judge(bad, pins, trl_range))
    assert "vllm 0.33.0 is outside TRL's vllm extra" in problems and "torch 2.14.0" in problems
    assert f"trl 1.15.0 is not CI's pin {pins['trl']}" in problems
    assert check.judge({}, pins, trl_range) == ["the resolution installs no vllm"]
    vllm = {"metadata": {"name": "vllm", "version": "0.31.0", "requires_dist": [
        "nvidia-cutlass-dsl[cu13]==4.7.1", "humming-kernels[cu13]==0.1.16; platform_machine == 'x86_64'",
        "torch==2.13.0", "pytest; extra == 'test'", "flashinfer-cubin[cu12]; extra == 'flashinfer'"]}}
    assert check.cuda_builds({"install": [vllm]}) == ["nvidia-cutlass-dsl[cu13]", "humming-kernels[cu13]"]
    assert check.cuda_builds(report(vllm="0.31.0")) == []


# ---------------------------------------------------------------- notebook 03's install cell


def _install_cell() -> str:
    """Notebook 03's install cell up to the %pip line (which would install here): finding or fetching the checkout."""
    notebook = json.loads((REPO / "notebooks" / "03_hotel_agent.ipynb").read_text())
    source = next(
        "".join(c["source"])
        for c in notebook["cells"]
        if c["cell_type"] == "code" and "REPO_URL" in "".join(c["source"])
    )
    return source.split("if importlib.util.find_spec", 1)[0]


def test_notebook_03_installs_from_the_repository_the_colab_badge_names():
    import re

    badge = re.search(
        r"colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/[^/]+/notebooks/03_hotel_agent",
        (REPO / "README.md").read_text(),
    )
    cell = _install_cell()
    assert badge and re.findall(r'^REPO_URL = "(.*)"', cell, re.M) == [f"https://github.com/{badge.group(1)}"]


@pytest.mark.parametrize("where", ["in the repository", "next to an earlier clone"])
def test_notebook_03_finds_an_existing_checkout_before_cloning(tmp_path, monkeypatch, where):
    if where == "in the repository":
        monkeypatch.chdir(REPO / "notebooks")
        expected = REPO
    else:  # Colab after the restart: ./grpo-magic is there from the first run of the cell
        (tmp_path / "grpo-magic").symlink_to(REPO)
        monkeypatch.chdir(tmp_path)
        expected = (tmp_path / "grpo-magic").resolve()
    cell = _install_cell().replace('REPO_URL = "', 'REPO_URL = "file:///nowhere/never-cloned', 1)
    namespace: dict = {}
    exec(compile(cell, "03_hotel_agent.ipynb", "exec"), namespace)  # the clone would fail: it must not be tried
    assert namespace["root"] == expected


def test_notebook_03_says_what_to_set_when_there_is_neither_a_checkout_nor_a_clone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = _install_cell().replace('REPO_URL = "https://github.com/', f'REPO_URL = "{tmp_path}/no-such-repo/', 1)
    with pytest.raises(RuntimeError) as info:
        exec(compile(cell, "03_hotel_agent.ipynb", "exec"), {})
    message = str(info.value)
    assert "set REPO_URL to your copy's URL" in message and "no-such-repo" in message and message.count("\n") == 0
