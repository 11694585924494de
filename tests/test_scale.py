"""Scale out: several processes, the vLLM server split, vLLM for episodes, notebook to cluster.

Real multi-process runs use torchrun on CPU (gloo). What needs GPUs or vLLM is checked through
the plans (GPU count faked with GRPO_MAGIC_FAKE_GPUS), stand-in HTTP servers, and TRL's real
GRPOConfig, GRPOTrainer and VLLMClient around a stand-in for vllm.LLM (see "generation for
episodes"); scripts/gpu_smoke.sh runs the real thing on a GPU machine.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from datasets import Dataset

from envs.hotel_env import HotelEnv
from envs.letters import LettersEnv
from grpo_magic import GRPOMagicError, GRPOParams, read_run_log, train
from grpo_magic.environment.generation import (
    HFGenerator,
    PromptTooLong,
    VLLMColocateGenerator,
    VLLMServerGenerator,
)
from grpo_magic.events import GroupScored, RunFinished, RunStarted, StepLogged
from grpo_magic.frontends.cli import main
from grpo_magic.launch.processes import Command, LaunchOptions, LaunchPlan, execute, plan_launch
from grpo_magic.training.trainer import generator_for_trainer
from grpo_magic.trl_compat import trl_advantages

REPO = Path(__file__).resolve().parents[1]

# Distinct prompts, and a score that tells which process scored the episode (rank 0 below 0.5,
# rank 1 from 0.5 up), so the run log shows whose groups it holds and in what order.
RANKED_ENV = '''
import os
from datasets import Dataset


class RankedEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Say a{i}: " for i in range(64)]})

    def score_episode(self, model, tokenizer, completion, prompt):
        rank = int(os.environ.get("RANK", "0"))
        return 0.5 * rank + 0.4 * completion.count("a") / max(1, len(completion))
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GRPO_MAGIC_LAUNCHED")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: TRL's default advantage settings (tests/test_trl_compat.py holds trl_advantages to TRL's own for each).
GROUP = {"scale_rewards": "group", "multi_objective_aggregation": "sum_then_normalize", "reward_weight": 1.0}


# ---------------------------------------------------------------- several processes for real


@pytest.mark.process
def test_two_torchrun_processes_train_one_run_with_every_rank_s_groups_once(tmp_path):
    (tmp_path / "ranked_env.py").write_text(textwrap.dedent(RANKED_ENV))
    # 6 completions per process, groups of 4: 3 groups a step, the middle one split across the two ranks.
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "grpo_magic", "train", "--model", "tiny",
         "--rl-env-module", "ranked_env", "--rl-env-class", "RankedEnv", "--batch-size", "6",
         "--rl-num-generations", "4", "--rl-max-new-tokens", "8", "--max-steps", "2", "--project-name", "out"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("grpo-magic: completed after 2 steps") == 1  # only the main process reports
    events = list(read_run_log(tmp_path / "out"))
    assert sum(isinstance(e, RunStarted) for e in events) == 1 and isinstance(events[-1], RunFinished)
    assert events[-1].status == "completed"
    for step in (1, 2):
        groups = [e for e in events if isinstance(e, GroupScored) and e.step == step]
        assert [g.group for g in groups] == [0, 1, 2]  # 2 processes x 6 / 4 generations
        assert len({g.prompt for g in groups}) == 3  # each rank got its own prompts, none twice
        scores = [s for g in groups for s in g.scores]
        assert all(s < 0.5 for s in scores[:6]) and all(s >= 0.5 for s in scores[6:])  # rank 0, then rank 1
        for g in groups:  # the advantages TRL computed over the whole group, split or not
            assert g.advantages == pytest.approx(trl_advantages([g.scores], GROUP)[0], abs=2e-3)
        logged = next(e for e in events if isinstance(e, StepLogged) and e.step == step)
        assert logged.episodes == 12
    out = tmp_path / "out"
    assert (out / "model.safetensors").exists() and len(list(out.glob("events*.jsonl"))) == 1
    assert sorted(p.name for p in tmp_path.rglob("model.safetensors") if "checkpoint" not in str(p)) == [
        "model.safetensors"]


@pytest.mark.process
def test_num_processes_on_cpu_starts_torchrun_itself(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_magic", "train", "--model", "tiny", "--rl-env-module", "envs.letters",
         "--rl-env-class", "LettersEnv", "--batch-size", "4", "--rl-max-new-tokens", "8", "--max-steps", "1",
         "--project-name", str(tmp_path / "out"), "--num-processes", "2", "--quiet"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting 2 training processes on CPU (torchrun)" in proc.stderr
    groups = [e for e in read_run_log(tmp_path / "out") if isinstance(e, GroupScored)]
    assert len(groups) == 2  # 2 x 4 completions, groups of 4


# ---------------------------------------------------------------- plans (GPUs faked)

BASE = ["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv"]
SERVER = ["--use-vllm", "--vllm-mode", "server"]


def _dry_run(capsys, monkeypatch, gpus: int | None, *flags: str) -> tuple[int, str, str]:
    if gpus is None:
        monkeypatch.delenv("GRPO_MAGIC_FAKE_GPUS", raising=False)
    else:
        monkeypatch.setenv("GRPO_MAGIC_FAKE_GPUS", str(gpus))
    code = main([*BASE, *flags, "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _line(out: str, needle: str) -> list[str]:
    return shlex.split(next(line for line in out.splitlines() if needle in line))


def test_server_split_on_8_gpus_with_2_for_vllm_and_tensor_parallel_2(capsys, monkeypatch, tiny_path):
    code, out, err = _dry_run(capsys, monkeypatch, 8, *SERVER, "--vllm-server-gpus", "2",
                              "--vllm-tensor-parallel-size", "2")
    assert code == 0, err
    assert "vLLM server on GPUs 6,7, training on GPUs 0,1,2,3,4,5 (6 processes)" in out
    serve = _line(out, "vllm-serve --model")
    assert serve[0] == "CUDA_VISIBLE_DEVICES=6,7" and Path(serve[1]).name == "trl" and serve[2] == "vllm-serve"
    assert serve[serve.index("--model") + 1] == tiny_path
    assert serve[serve.index("--tensor-parallel-size") + 1] == "2" and "--data-parallel-size" not in serve
    assert serve[serve.index("--port") + 1] == "8000"
    trainer = _line(out, "grpo_magic train")
    assert trainer[0] == "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" and "GRPO_MAGIC_LAUNCHED=1" in trainer
    assert trainer[trainer.index("--num_processes") + 1] == "6" and "--multi_gpu" in trainer
    assert "launch" in trainer and trainer[trainer.index("-m") + 1:trainer.index("-m") + 3] == ["grpo_magic", "train"]
    assert trainer[trainer.index("--vllm-server-url") + 1] == "http://127.0.0.1:8000"
    assert "wait until http://127.0.0.1:8000/health answers" in out


def test_server_mode_on_one_gpu_leaves_nothing_to_train_on(capsys, monkeypatch):
    code, out, err = _dry_run(capsys, monkeypatch, 1, *SERVER)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "leaves none to train on" in err and "--vllm-mode colocate" in err


def test_server_mode_without_gpus_asks_for_a_url(capsys, monkeypatch):
    code, _, err = _dry_run(capsys, monkeypatch, 0, *SERVER)
    assert code == 2 and "no GPU is visible" in err and "--vllm-server-url" in err


def test_colocate_on_8_gpus_trains_on_all_of_them(capsys, monkeypatch):
    code, out, err = _dry_run(capsys, monkeypatch, 8, "--use-vllm")
    assert code == 0, err
    assert "vllm-serve" not in out
    trainer = _line(out, "grpo_magic train")
    assert trainer[0] == "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"
    assert trainer[trainer.index("--num_processes") + 1] == "8" and "--vllm-server-url" not in trainer


@pytest.mark.parametrize(("gpus", "flags", "needle"), [
    (8, ["--use-vllm", "--vllm-tensor-parallel-size", "3"], "must divide the 8 training process"),
    (8, ["--num-processes", "10"], "--num-processes 10 needs 10 GPUs but only 8 are visible"),
    (8, [*SERVER, "--vllm-server-gpus", "2", "--num-processes", "7"], "left after the 2 GPUs of the vLLM server"),
    (8, [*SERVER, "--vllm-server-gpus", "1", "--vllm-tensor-parallel-size", "2"], "use --vllm-server-gpus 2"),
    (0, ["--num-processes", "2", "--batch-size", "3"], "x 2 processes"),
    (0, ["--accelerate-config", "missing.yaml"], "accelerate config"),
])
def test_plans_that_cannot_work_exit_2_before_anything_starts(capsys, monkeypatch, gpus, flags, needle):
    code, out, err = _dry_run(capsys, monkeypatch, gpus, *flags)
    assert code == 2 and out == "" and needle in err, err


def test_cpu_processes_use_torchrun_and_an_accelerate_config_is_passed_through(capsys, monkeypatch, tmp_path):
    code, out, _ = _dry_run(capsys, monkeypatch, 0, "--num-processes", "2", "--batch-size", "2")
    assert code == 0
    trainer = _line(out, "grpo_magic train")
    assert Path(trainer[1]).name == "torchrun" and trainer[trainer.index("--nproc_per_node") + 1] == "2"
    config = tmp_path / "ds.yaml"
    config.write_text("distributed_type: DEEPSPEED\n")
    code, out, _ = _dry_run(capsys, monkeypatch, 4, "--accelerate-config", str(config))
    trainer = _line(out, "grpo_magic train")
    assert code == 0 and trainer[trainer.index("--config_file") + 1] == str(config)
    assert trainer[trainer.index("--num_processes") + 1] == "4" and "--multi_gpu" not in trainer


def test_one_gpu_or_none_trains_in_this_process(capsys, monkeypatch):
    for gpus in (0, 1):
        code, out, _ = _dry_run(capsys, monkeypatch, gpus)
        assert code == 0 and "train in this process:" in out and "torchrun" not in out and "accelerate" not in out


def test_a_launched_process_never_launches_again(monkeypatch):
    monkeypatch.setenv("GRPO_MAGIC_FAKE_GPUS", "8")
    monkeypatch.setenv("GRPO_MAGIC_LAUNCHED", "1")
    plan = plan_launch(GRPOParams(model="tiny"), LaunchOptions())
    assert plan.in_process


# ---------------------------------------------------------------- the vLLM server

FAKE_SERVER = '''
import os, sys, http.server

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path.rstrip("/") == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        print("request", self.path, flush=True)

print("fake vLLM server starting, pid", os.getpid(), flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
'''


def _plan(tmp_path: Path, server_argv: list[str], train_argv: list[str], port: int, timeout: float = 30) -> LaunchPlan:
    log = tmp_path / "vllm-server.log"
    return LaunchPlan(gpus=["0", "1"], train_gpus=["0"], server_gpus=["1"], num_processes=1, launcher="test",
                      train=Command("train", train_argv), server=Command("vllm-server", server_argv, log=log),
                      server_url=f"http://127.0.0.1:{port}", server_timeout=timeout, output_dir=tmp_path)


LETTERS = GRPOParams(model="tiny", rl_env_module="envs.letters", rl_env_class="LettersEnv")


def test_the_launcher_waits_for_its_server_trains_and_stops_the_server(tmp_path):
    port = _free_port()
    (tmp_path / "server.py").write_text(FAKE_SERVER)
    probe = (f"import urllib.request; r = urllib.request.urlopen('http://127.0.0.1:{port}/health'); "
             "raise SystemExit(3 if r.status == 200 else 1)")
    plan = _plan(tmp_path, [sys.executable, str(tmp_path / "server.py"), str(port)], [sys.executable, "-c", probe],
                 port)
    assert execute(plan, LETTERS) == 3  # training saw the server, and its exit status comes back
    log = (tmp_path / "vllm-server.log").read_text()
    assert "fake vLLM server starting" in log
    _assert_gone(int(log.split("pid")[1].split()[0]))


def _assert_gone(pid: int) -> None:
    """The process has ended and been reaped (the launcher waits for what it stops)."""
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.process
def test_a_server_that_dies_or_never_answers_is_reported_with_its_log(tmp_path):
    port = _free_port()
    dies = [sys.executable, "-c", "print('CUDA out of memory while loading'); raise SystemExit(1)"]
    with pytest.raises(GRPOMagicError, match="(?s)exited with status 1.*CUDA out of memory"):
        execute(_plan(tmp_path, dies, [sys.executable, "-c", "pass"], port), LETTERS)
    # Still loading when the 3 s wait ends (had the launcher waited on, this one would have "exited with
    # status 0"): reported with its log, and stopped, not left running.
    silent = [sys.executable, "-c", "import os, time; print('loading weights, pid', os.getpid(), flush=True); "
              "time.sleep(60)"]
    with pytest.raises(GRPOMagicError, match=r"(?s)did not answer .* within 3 s.*loading weights"):
        execute(_plan(tmp_path, silent, [sys.executable, "-c", "pass"], port, timeout=3), LETTERS)
    _assert_gone(int((tmp_path / "vllm-server.log").read_text().split("pid")[-1].split()[0]))


SERVER_PARAMS = dict(model="tiny", use_vllm=True, vllm_mode="server", rl_max_new_tokens=8)


@pytest.mark.process
def test_a_server_url_that_does_not_answer_fails_before_the_model_loads(in_tmp, monkeypatch):
    monkeypatch.setenv("GRPO_MAGIC_VLLM_CHECK_TIMEOUT", "2")
    import grpo_magic.models

    monkeypatch.setattr(grpo_magic.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(GRPOMagicError) as info:
        train(GRPOParams(**SERVER_PARAMS, vllm_server_url=url), LettersEnv())
    assert url in str(info.value) and "trl vllm-serve" in str(info.value) and "within 2 s" in str(info.value)
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_magic", *BASE, *SERVER, "--vllm-server-url", url],
        cwd=REPO, env=_env(GRPO_MAGIC_VLLM_CHECK_TIMEOUT="2"), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and url in proc.stderr, proc.stderr


def test_a_server_url_that_answers_passes_the_check(in_tmp, tmp_path):
    port = _free_port()
    (tmp_path / "server.py").write_text(FAKE_SERVER)
    server = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(port)], stdout=subprocess.DEVNULL)
    try:
        from grpo_magic.training.preflight import check_server

        check_server(f"http://127.0.0.1:{port}", timeout=20)
        with pytest.raises(GRPOMagicError, match="vllm package"):  # the next check: vLLM itself is not here
            train(GRPOParams(**SERVER_PARAMS, vllm_server_url=f"http://127.0.0.1:{port}"), LettersEnv())
    finally:
        server.kill()
        server.wait()


# ---------------------------------------------------------------- generation for episodes


@pytest.fixture(scope="module")
def tiny(tiny_path):
    from grpo_magic.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(tiny_path)
    return load_model(tiny_path, tokenizer=tokenizer).eval(), tokenizer


def test_hotel_env_runs_the_same_episode_through_the_hf_generator(tiny):
    import torch

    model, tokenizer = tiny
    env = HotelEnv(max_turns=3, max_new_tokens=16)
    search = env.solution_turns(0)[0]  # a search call: the model must continue the episode
    torch.manual_seed(0)
    plain = env.run_episode(model, tokenizer, search, 0)
    torch.manual_seed(0)
    helped = env.run_episode(model, tokenizer, search, 0, generator=HFGenerator(model, tokenizer))
    assert plain.turns >= 2 and len(plain.messages) > 3
    assert helped.messages == plain.messages and helped.score == plain.score


class GeneratorEnv:
    """Continues each episode with the helper; records what it was given."""

    seen: list[str] = []

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Say a{i}: " for i in range(16)]})

    def score_episode(self, model, tokenizer, completion, prompt, generator):
        reply = generator.chat([{"role": "user", "content": prompt}, {"role": "assistant", "content": completion},
                                {"role": "user", "content": "Again:"}], max_new_tokens=4)
        GeneratorEnv.seen.append(f"{generator.backend}:{type(reply).__name__}")
        return reply.count("a") / max(1, len(reply))


def test_an_env_that_names_generator_gets_the_helper_during_training(in_tmp):
    GeneratorEnv.seen = []
    run = train(GRPOParams(model="tiny", batch_size=4, rl_max_new_tokens=4, max_steps=1), GeneratorEnv())
    assert run.status == "completed" and run.error_count == 0
    assert GeneratorEnv.seen == ["hf:str"] * 4


def test_the_helper_says_when_a_conversation_no_longer_fits(tiny):
    model, tokenizer = tiny
    generator = HFGenerator(model, tokenizer)
    limit = model.config.max_position_embeddings
    with pytest.raises(PromptTooLong, match=f"context of {limit} tokens"):
        generator.generate("a " * limit, max_new_tokens=8)


# What these tests build is TRL's: a real GRPOConfig (from GRPOParams, as a run makes it), a real
# GRPOTrainer with use_vllm=True, whose real VLLMGeneration holds the engine, and in server mode TRL's
# real VLLMClient talking HTTP to a stand-in server started here. Two stand-ins remain, because neither
# can exist without the vllm package and a GPU: the engine start-up (VLLMGeneration._init_vllm creates a
# vllm.LLM, or a client plus an NCCL weight-sync communicator) and the vllm.LLM object itself.

REPLY = "hello there"
SAMPLING = dict(rl_temperature=0.7, rl_top_p=0.9, rl_top_k=20, rl_max_new_tokens=32)


class StandInLLM:
    """Stands for vllm.LLM (TRL's colocated engine), which needs vllm and a GPU: records each request."""

    def __init__(self, reply_ids: list[int]) -> None:
        self.reply_ids = reply_ids
        self.requests: list[tuple[list, dict]] = []

    def generate(self, prompts, sampling_params, use_tqdm):
        self.requests.append((prompts, sampling_params))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=self.reply_ids)])]


class StandInVLLMServer:
    """`trl vllm-serve` as far as TRL uses it here: /health, /v1/models, /server_info, /v1/completions."""

    def __init__(self, reply_ids: list[int]) -> None:
        import http.server
        import threading

        server = self
        self.requests: list[tuple[str, str, dict | None]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                server.requests.append(("GET", self.path, None))
                if self.path == "/health":
                    self._send(200)
                elif self.path == "/v1/models":
                    self._send(200, {"data": [{"id": "tiny"}]})
                elif self.path.startswith("/server_info"):  # GRPOTrainer checks the logprobs mode at start
                    self._send(200, {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}})
                else:
                    self._send(404)

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(("POST", self.path, payload))
                if self.path != "/v1/completions":
                    return self._send(404)
                self._send(200, {"choices": [
                    {"prompt_token_ids": prompt, "token_ids": reply_ids, "logprobs": None}
                    for prompt in payload["prompt"] for _ in range(payload["n"])
                ]})

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def posts(self) -> list[dict]:
        return [payload for method, path, payload in self.requests if method == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def reply_ids(tiny):
    _, tokenizer = tiny
    # The reply, the end of the turn, then tokens past it that must not reach the env.
    return tokenizer(REPLY, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id, 5, 6]


@pytest.fixture
def vllm_server(reply_ids, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = StandInVLLMServer(reply_ids)
    yield server
    server.close()


@pytest.fixture
def trl_vllm_trainer(tiny, reply_ids, tmp_path, monkeypatch):
    """Build TRL's GRPOTrainer with use_vllm=True from GRPOParams, as a run does; returns (trainer, policy).

    Only ``VLLMGeneration._init_vllm`` is replaced. Like TRL's, it sets ``llm`` in colocate mode and,
    on the main process, ``vllm_client`` (TRL's real ``VLLMClient``) in server mode; it skips what needs
    vllm and a GPU (creating vllm.LLM, the NCCL communicator). ``main_process=False`` builds what
    another process of a multi-process run holds: no client.
    """
    from trl.generation import vllm_client, vllm_generation
    from trl.generation.vllm_client import VLLMClient

    from grpo_magic.models import load_model
    from grpo_magic.training.trainer import trainer_class

    _, tokenizer = tiny
    # VLLMClient refuses to exist without the vllm package, though all it does is HTTP.
    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *a, **k: True)

    def build(main_process: bool = True, overrides: dict | None = None, **params):
        def init_vllm(self):
            if self.mode == "colocate":
                self.llm = StandInLLM(reply_ids)
            elif main_process:
                self.vllm_client = VLLMClient(base_url=self.server_base_url, group_port=self.group_port,
                                              connection_timeout=self.server_timeout)

        monkeypatch.setattr(vllm_generation.VLLMGeneration, "_init_vllm", init_vllm)
        grpo = GRPOParams(model="tiny", rl_kl_coef=0.0, **{**SAMPLING, **params})
        overrides = dict(overrides or {})
        if not main_process:  # TRL asks the server for its logprobs mode on the main process only
            overrides["vllm_importance_sampling_correction"] = False
        config = grpo.to_grpo_config(str(tmp_path / "out"), **overrides)
        trainer = trainer_class()(model=load_model(grpo.model, tokenizer=tokenizer), args=config,
                                  reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                                  train_dataset=Dataset.from_dict({"prompt": ["Say a: "] * 8}),
                                  processing_class=tokenizer)
        return trainer, trainer.accelerator.unwrap_model(trainer.model)

    return build


def test_grpo_config_with_vllm_constructs_on_this_cpu_in_both_modes():
    for mode, url in (("colocate", None), ("server", "http://10.0.0.2:8000")):
        config = GRPOParams(model="tiny", use_vllm=True, vllm_mode=mode, vllm_server_url=url).to_grpo_config("out")
        assert (config.use_vllm, config.vllm_mode, config.vllm_server_base_url) == (True, mode, url)


def test_colocate_episodes_generate_with_trl_s_engine_and_the_run_s_sampling(trl_vllm_trainer, tiny, monkeypatch):
    from grpo_magic.training.trainer import vllm_engine

    trainer, policy = trl_vllm_trainer(use_vllm=True, vllm_mode="colocate")
    llm = trainer.vllm_generation.llm  # where TRL keeps its engine
    engine = vllm_engine(trainer)
    assert (engine.mode, engine.llm, engine.tensor_parallel_size, engine.sleep_mode) == ("colocate", llm, 1, False)
    _, tokenizer = tiny
    generator = generator_for_trainer(trainer, policy, tokenizer)
    assert isinstance(generator, VLLMColocateGenerator) and generator.llm is llm
    # vllm.SamplingParams, like vllm.LLM, needs vllm: a stand-in that keeps what it was given.
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    messages = [{"role": "user", "content": "hi"}]
    assert generator.chat(messages, max_new_tokens=7) == REPLY  # cut at the end of the turn
    assert generator.generate("Say a: ") == REPLY
    (chat_prompt, chat_sampling), (_, text_sampling) = llm.requests
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat_prompt == [{"prompt_token_ids": tokenizer(rendered, add_special_tokens=False)["input_ids"]}]
    assert chat_sampling == {"n": 1, "max_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 20}
    assert text_sampling["max_tokens"] == 32  # rl_max_new_tokens, when the env gives no budget


def test_server_episodes_generate_through_trl_s_vllm_client(trl_vllm_trainer, vllm_server, tiny):
    from trl.generation.vllm_client import VLLMClient

    from grpo_magic.training.trainer import vllm_engine

    trainer, policy = trl_vllm_trainer(use_vllm=True, vllm_mode="server", vllm_server_url=vllm_server.url)
    client = trainer.vllm_generation.vllm_client
    assert isinstance(client, VLLMClient) and client.base_url == vllm_server.url
    engine = vllm_engine(trainer)
    assert (engine.mode, engine.client, engine.base_url) == ("server", client, vllm_server.url)
    _, tokenizer = tiny
    generator = generator_for_trainer(trainer, policy, tokenizer)
    assert isinstance(generator, VLLMServerGenerator) and generator.client is client
    assert [p for _, p, _ in vllm_server.requests] == ["/health", "/v1/models", "/server_info?config_format=json"]
    assert generator.generate("Say hi: ") == REPLY  # cut at the end of the turn
    (payload,) = vllm_server.posts()
    assert payload["prompt"] == [tokenizer("Say hi: ", add_special_tokens=False)["input_ids"]]
    assert {k: payload[k] for k in ("n", "max_tokens", "temperature", "top_p", "top_k", "logprobs")} == {
        "n": 1, "max_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "logprobs": None}


def test_a_process_without_trl_s_client_connects_to_the_server_itself(trl_vllm_trainer, vllm_server, tiny):
    from trl.generation.vllm_client import VLLMClient

    trainer, policy = trl_vllm_trainer(main_process=False, use_vllm=True, vllm_mode="server",
                                       vllm_server_url=vllm_server.url)
    assert not hasattr(trainer.vllm_generation, "vllm_client")  # TRL gives only the main process a client
    _, tokenizer = tiny
    generator = generator_for_trainer(trainer, policy, tokenizer)
    assert generator.client is None and generator.base_url == vllm_server.url
    assert vllm_server.requests == []  # nothing until an episode generates
    assert generator.chat([{"role": "user", "content": "hi"}], max_new_tokens=5) == REPLY
    assert isinstance(generator.client, VLLMClient)
    assert [(m, p) for m, p, _ in vllm_server.requests] == [  # the served context first, then TRL's client
        ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")]
    assert vllm_server.posts()[0]["max_tokens"] == 5


@pytest.mark.parametrize(("params", "overrides", "why"), [
    ({"vllm_tensor_parallel_size": 2}, {}, "collective call"),
    ({}, {"vllm_enable_sleep_mode": True}, "sleep mode"),
])
def test_colocate_engines_that_cannot_take_one_request_leave_episodes_to_hf_generate(
        trl_vllm_trainer, tiny, caplog, params, overrides, why):
    trainer, policy = trl_vllm_trainer(use_vllm=True, vllm_mode="colocate", overrides=overrides, **params)
    _, tokenizer = tiny
    with caplog.at_level("WARNING", logger="grpo_magic.training.trainer"):
        generator = generator_for_trainer(trainer, policy, tokenizer)
    assert isinstance(generator, HFGenerator) and why in caplog.text
    assert trainer.vllm_generation.llm.requests == [] and isinstance(generator.generate("Say a: "), str)


def test_without_vllm_episodes_generate_with_the_policy(trl_vllm_trainer, tiny):
    from grpo_magic.training.trainer import vllm_engine

    trainer, policy = trl_vllm_trainer(use_vllm=False)
    _, tokenizer = tiny
    generator = generator_for_trainer(trainer, policy, tokenizer)
    assert vllm_engine(trainer) is None and isinstance(generator, HFGenerator) and generator.model is policy
    assert generator.sampling == {"temperature": 0.7, "top_p": 0.9, "top_k": 20} and generator.max_new_tokens == 32


def test_a_required_generator_parameter_is_not_taken_for_a_missing_column():
    from grpo_magic.environment.env import check_episode_signature

    check_episode_signature(GeneratorEnv(), ["prompt"])  # generator is ours to give: no error

    class NeedsRoom(GeneratorEnv):
        def score_episode(self, model, tokenizer, completion, prompt, generator, room):
            return 0.0

    with pytest.raises(GRPOMagicError, match="needs 'room'"):  # while a real column that is missing is named
        check_episode_signature(NeedsRoom(), ["prompt"])


# ---------------------------------------------------------------- notebook to cluster

ENV_CELL = '''
from datasets import Dataset

class CountEnv:
    def __init__(self, letter="a"):
        self.letter = letter

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Write {self.letter}: "] * 8})

    def score_episode(self, model, tokenizer, completion):
        return completion.count(self.letter) / max(1, len(completion))
'''


@pytest.mark.process
def test_export_to_a_folder_trains_through_launch_sh_in_a_fresh_process(in_tmp, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "grpo_magic")
    try:
        shell.run_cell_magic("grpo_env", '--config {"letter": "b"}', ENV_CELL)
        form = shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --batch-size 4")
        form.fields["rl_max_new_tokens"].value = 6  # the form's current values are what gets exported
        folder = shell.run_line_magic("grpo_export", "CountEnv --to cluster")
        out = capsys.readouterr().out
    finally:
        shell.run_line_magic("unload_ext", "grpo_magic")
        shell.user_ns.pop("CountEnv", None)
    assert folder == Path("cluster") and "launch.sh" in out
    launch = in_tmp / "cluster" / "launch.sh"
    assert os.access(launch, os.X_OK) and (in_tmp / "cluster" / "count_env.py").exists()
    script = launch.read_text()
    assert "--rl-max-new-tokens 6" in script and "--rl-env-config '{\"letter\": \"b\"}'" in script
    assert "accelerate launch --config_file accelerate_config.yaml -m grpo_magic train" in script
    import yaml

    assert yaml.safe_load((in_tmp / "cluster" / "accelerate_config.yaml").read_text())["distributed_type"] == "MULTI_GPU"
    elsewhere = in_tmp / "elsewhere"
    elsewhere.mkdir()
    dry = subprocess.run([str(launch), "--dry-run"], cwd=elsewhere, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert dry.returncode == 0 and "train in this process" in dry.stdout, dry.stderr
    proc = subprocess.run([str(launch), "--max-steps", "1", "--quiet"], cwd=elsewhere, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "completed after 1 steps" in proc.stderr
    events = list(read_run_log(in_tmp / "cluster" / "grpo-run"))
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.params["rl_max_new_tokens"] == 6 and json.loads(started.params["rl_env_config"]) == {"letter": "b"}
