"""Several machines: two local "nodes" (two launchers on 127.0.0.1), the plans, and the SLURM export.

Each "node" is one ``grpo-magic train --num-machines 2 --machine-rank R`` launcher with one CPU
process (torchrun, gloo), so two launchers on this machine rendezvous exactly as two machines do.
SLURM is not here: the sbatch script runs with stand-ins for ``srun`` and ``scontrol`` that record
what they would start and run each node's command with ``--dry-run`` (docs/architecture.md,
"Several machines").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from grpo_magic import read_run_log
from grpo_magic.events import GroupScored, RunFinished, RunStarted, StepLogged
from grpo_magic.frontends.cli import main
from grpo_magic.training.resume import PROCESSES_NAME, checkpoint_processes, last_checkpoint

REPO = Path(__file__).resolve().parents[1]

# Distinct prompts, and a score that says which process scored the episode (rank 0 below 0.5, rank 1 from 0.5).
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
TRAIN = ["--model", "tiny", "--rl-env-module", "ranked_env", "--rl-env-class", "RankedEnv", "--batch-size", "4",
         "--rl-num-generations", "4", "--rl-max-new-tokens", "8", "--lr", "1e-3", "--project-name", "out", "--quiet"]
CHECKPOINT_FILES = {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GRPO_MAGIC_LAUNCHED", "GRPO_MAGIC_FAKE_GPUS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_nodes(folder: Path, rendezvous: list[str], *flags: str) -> list[subprocess.Popen]:
    """Machine 0's and machine 1's launchers, each in its own session (a machine of its own)."""
    return [subprocess.Popen(
        [sys.executable, "-m", "grpo_magic", "train", *TRAIN, *flags, "--num-machines", "2", "--machine-rank", str(r),
         *rendezvous],
        cwd=folder, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) for r in (0, 1)]


def _finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[str]:
    errs = []
    try:
        for proc in procs:
            errs.append(proc.communicate(timeout=timeout)[1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc.pid)
                proc.communicate()
    return errs


def _descendants(pid: int) -> list[int]:
    """The process and everything it started (read from /proc): a machine's processes."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid, *(p for child in children for p in _descendants(int(child)))]


def _kill_tree(pid: int) -> None:
    for p in _descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _steps(output_dir: Path) -> list[int]:
    return [e.step for e in read_run_log(output_dir) if isinstance(e, StepLogged)]


def _wait_for_step(output_dir: Path, procs: list[subprocess.Popen], step: int, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not ((output_dir / "events.jsonl").exists() and len(_steps(output_dir)) >= step):
        assert all(p.poll() is None for p in procs), f"a node ended early: {[p.returncode for p in procs]}"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.1)


# ---------------------------------------------------------------- two local "machines" for real


def test_two_machines_train_one_run_together_with_every_process_s_groups(tmp_path):
    (tmp_path / "ranked_env.py").write_text(textwrap.dedent(RANKED_ENV))
    # torchrun's elastic rendezvous (c10d): it, not --machine-rank, decides which machine's process is rank 0.
    procs = _start_nodes(tmp_path, ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"],
                         "--max-steps", "2")
    errs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
    assert "machine 0 of 2" in errs[0] and "machine 1 of 2" in errs[1]
    assert "".join(errs).count("completed after 2 steps") == 1  # only the global main process reports
    out = tmp_path / "out"
    events = list(read_run_log(out))
    assert sum(isinstance(e, RunStarted) for e in events) == 1 and isinstance(events[-1], RunFinished)
    assert events[-1].status == "completed" and len(list(out.glob("events*.jsonl"))) == 1
    for step in (1, 2):
        groups = [e for e in events if isinstance(e, GroupScored) and e.step == step]
        assert [g.group for g in groups] == [0, 1]  # 2 machines x 4 completions, groups of 4
        scores = [s for g in groups for s in g.scores]
        assert all(s < 0.5 for s in scores[:4]) and all(s >= 0.5 for s in scores[4:])  # rank 0's, then rank 1's
        assert next(e for e in events if isinstance(e, StepLogged) and e.step == step).episodes == 8
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("model.safetensors") if "checkpoint" not in str(p)] == [
        Path("out/model.safetensors")]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (out / "checkpoint-2").iterdir()}


def test_losing_machine_1_ends_machine_0_with_a_clear_line_and_a_checkpoint_that_resumes(tmp_path):
    (tmp_path / "ranked_env.py").write_text(textwrap.dedent(RANKED_ENV))
    rendezvous = ["--main-process-ip", "127.0.0.1", "--main-process-port", str(_free_port())]
    # --ddp-timeout bounds the wait for a machine that stops answering; a killed one fails the next call at once.
    procs = _start_nodes(tmp_path, rendezvous, "--max-steps", "500", "--ddp-timeout", "60")
    out = tmp_path / "out"
    try:
        _wait_for_step(out, procs, 1)
        _kill_tree(procs[1].pid)  # machine 1 is gone: its launcher, torchrun and training process at once
        errs = _finish(procs, timeout=240)
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc.pid)
    assert procs[0].returncode == 1, errs[0][-3000:]
    line = next((x for x in errs[0].splitlines() if "lost contact with the other training processes" in x), "")
    assert line.startswith("grpo-magic: error: Training failed: lost contact"), errs[0][-3000:]
    assert not re.search(r'File ".*grpo_magic/', errs[0])  # ours is one line (torchrun prints its own traceback)
    finished = list(read_run_log(out))[-1]
    assert isinstance(finished, RunFinished) and finished.status == "failed"
    saved = last_checkpoint(out)
    assert saved is not None and f"a checkpoint of step {Path(saved).name.split('-')[1]} is in {saved}" in line
    step = int(Path(saved).name.split("-")[1])
    assert step == finished.steps and step >= 1
    names = {p.name for p in Path(saved).iterdir()}
    assert CHECKPOINT_FILES | {"rng_state_0.pth", PROCESSES_NAME} <= names and "rng_state_1.pth" not in names
    assert json.loads((Path(saved) / PROCESSES_NAME).read_text()) == {"processes": 2, "rng_states_missing": [1]}
    assert checkpoint_processes(Path(saved)) == 2 and json.loads(
        (Path(saved) / "trainer_state.json").read_text())["global_step"] == step

    # Both machines back: --resume continues from that checkpoint, one more step.
    resumed = _start_nodes(tmp_path, rendezvous, "--max-steps", str(step + 1), "--resume")
    errs = _finish(resumed)
    assert [p.returncode for p in resumed] == [0, 0], "\n".join(e[-2000:] for e in errs)
    assert _steps(out)[-1] == step + 1 and sum(isinstance(e, RunStarted) for e in read_run_log(out)) == 2


def test_sigterm_to_machine_1_s_launcher_stops_both_machines_at_the_same_step_with_a_checkpoint(tmp_path):
    (tmp_path / "ranked_env.py").write_text(textwrap.dedent(RANKED_ENV))
    rendezvous = ["--main-process-ip", "127.0.0.1", "--main-process-port", str(_free_port())]
    procs = _start_nodes(tmp_path, rendezvous, "--max-steps", "500")
    out = tmp_path / "out"
    try:
        _wait_for_step(out, procs, 1)
        procs[1].send_signal(signal.SIGTERM)  # as scancel does: the launcher forwards it to torchrun, then to training
        errs = _finish(procs, timeout=240)
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc.pid)
    assert procs[1].returncode == 143, errs[1][-3000:]
    finished = list(read_run_log(out))[-1]
    assert isinstance(finished, RunFinished) and finished.status == "stopped" and "SIGTERM" in finished.reason
    step = _steps(out)[-1]
    assert finished.steps == step and f"stopped after {step} steps (SIGTERM)" in errs[0], errs[0][-3000:]
    names = {p.name for p in (out / f"checkpoint-{step}").iterdir()}
    assert CHECKPOINT_FILES | {"rng_state_0.pth", "rng_state_1.pth"} <= names  # both processes saved their part
    assert last_checkpoint(out) == str(out / f"checkpoint-{step}")


def test_a_frozen_machine_ends_the_other_after_ddp_timeout_with_a_checkpoint(tmp_path):
    (tmp_path / "ranked_env.py").write_text(textwrap.dedent(RANKED_ENV))
    rendezvous = ["--main-process-ip", "127.0.0.1", "--main-process-port", str(_free_port())]
    procs = _start_nodes(tmp_path, rendezvous, "--max-steps", "500", "--ddp-timeout", "10")  # its value is not asserted
    out = tmp_path / "out"
    frozen: list[int] = []
    try:
        _wait_for_step(out, procs, 1)
        frozen = _descendants(procs[1].pid)
        for pid in frozen:  # machine 1 stops answering, its connections stay open: only the timeout can tell
            os.kill(pid, signal.SIGSTOP)
        err = procs[0].communicate(timeout=240)[1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc.pid)
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert procs[0].returncode == 1, err[-3000:]
    assert "lost contact with the other training processes" in err and "Timed out" in err, err[-3000:]
    saved = last_checkpoint(out)
    assert saved is not None and f"is in {saved} (--resume continues from there)" in err
    assert checkpoint_processes(Path(saved)) == 2


# The launcher's torchrun stand-in: says when SIGTERM reaches it.
CHILD = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def tell(path, text):  # whole or not at all: the test polls for the file and reads it at once
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
signal.signal(signal.SIGTERM, lambda *a: (tell(out, "SIGTERM"), sys.exit(143)))
tell(out.with_suffix(".pid"), str(os.getpid()))
time.sleep(120)
"""
LAUNCHER = """
import sys
from grpo_magic import GRPOParams
from grpo_magic.launch.processes import Command, LaunchPlan, execute
plan = LaunchPlan(gpus=[], train_gpus=[], server_gpus=[], num_processes=1, launcher="torchrun",
                  train=Command("train", [sys.executable, sys.argv[1], sys.argv[2]]))
execute(plan, GRPOParams(model="tiny", rl_env_module="envs.letters", rl_env_class="LettersEnv"))
"""


def test_a_launcher_killed_outright_still_stops_what_it_started(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    told = tmp_path / "child.txt"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "child.py"), str(told)], cwd=REPO,
                                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not told.with_suffix(".pid").exists():
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.05)
        launcher.kill()  # SIGKILL: the launcher cannot forward anything
        launcher.wait()
        while not told.exists():  # the kernel sends torchrun (here its stand-in) SIGTERM: a Stop, not an orphan
            assert time.monotonic() < deadline, "the launched process was not told"
            time.sleep(0.05)
    finally:
        if told.with_suffix(".pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(told.with_suffix(".pid").read_text()), signal.SIGKILL)
    assert told.read_text() == "SIGTERM"


# ---------------------------------------------------------------- plans (nothing starts)

BASE = ["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv"]


def _plan(capsys, monkeypatch, gpus: int, *flags: str) -> tuple[int, str, str]:
    monkeypatch.setenv("GRPO_MAGIC_FAKE_GPUS", str(gpus))
    code = main([*BASE, *flags, "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _train_line(out: str) -> list[str]:
    return shlex.split(next(line for line in out.splitlines() if "grpo_magic train" in line))


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_on_gpus_each_machine_runs_accelerate_launch_with_its_rank(capsys, monkeypatch):
    code, out, err = _plan(capsys, monkeypatch, 4, "--num-machines", "2", "--machine-rank", "1",
                           "--main-process-ip", "10.0.0.1", "--main-process-port", "29400", "--batch-size", "8")
    assert code == 0, err
    assert "machine 1 of 2, rendezvous 10.0.0.1:29400 (static): training on GPUs 0,1,2,3 (4 processes here, 8 on 2" in out
    argv = _train_line(out)
    assert argv[0] == "CUDA_VISIBLE_DEVICES=0,1,2,3" and Path(argv[2]).name == "accelerate" and argv[3] == "launch"
    assert {f: _after(argv, f) for f in ("--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
                                         "--main_process_port", "--rdzv_backend")} == {
        "--num_processes": "8", "--num_machines": "2", "--machine_rank": "1", "--main_process_ip": "10.0.0.1",
        "--main_process_port": "29400", "--rdzv_backend": "static"}
    assert "--multi_gpu" in argv and "--num-machines" not in argv  # the training processes get no launcher flags
    # --num-processes counts every machine's processes (accelerate's meaning); --rdzv-endpoint is the same rendezvous.
    code, out, err = _plan(capsys, monkeypatch, 4, "--num-machines", "2", "--rdzv-endpoint", "10.0.0.1:29400",
                           "--num-processes", "4", "--rdzv-backend", "c10d")
    argv = _train_line(out)
    assert code == 0 and "2 processes here, 4 on 2 machines" in out, err
    assert (_after(argv, "--num_processes"), _after(argv, "--main_process_ip"), _after(argv, "--rdzv_backend")) == (
        "4", "10.0.0.1", "c10d") and argv[0] == "CUDA_VISIBLE_DEVICES=0,1"


def test_on_cpu_each_machine_runs_torchrun_with_a_static_or_c10d_rendezvous(capsys, monkeypatch):
    code, out, err = _plan(capsys, monkeypatch, 0, "--num-machines", "3", "--machine-rank", "2",
                           "--main-process-ip", "node0", "--batch-size", "4")
    argv = _train_line(out)
    assert code == 0 and Path(argv[1]).name == "torchrun" and "--standalone" not in argv, err
    assert [argv[argv.index("--nnodes"):argv.index("-m")]] == [[
        "--nnodes", "3", "--node_rank", "2", "--nproc_per_node", "1", "--rdzv_backend", "static",
        "--master_addr", "node0", "--master_port", "29500"]]
    code, out, _ = _plan(capsys, monkeypatch, 0, "--num-machines", "2", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "[fd00::1]:29600")
    argv = _train_line(out)
    assert code == 0 and _after(argv, "--rdzv_endpoint") == "[fd00::1]:29600" and "--master_addr" not in argv
    # One machine with no rendezvous flag: today's plan, in this process.
    code, out, _ = _plan(capsys, monkeypatch, 0)
    assert code == 0 and "train in this process:" in out


@pytest.mark.parametrize(("gpus", "flags", "needle"), [
    (4, ["--num-machines", "2", "--main-process-ip", "h", "--num-processes", "10"],
     "needs 5 GPUs on each machine but only 4 are visible here; use --num-processes 8 or fewer"),
    (4, ["--num-machines", "2", "--main-process-ip", "h", "--use-vllm", "--vllm-mode", "server"],
     "pass its --vllm-server-url to every machine"),
    (0, ["--num-machines", "2", "--main-process-ip", "h", "--batch-size", "3"], "x 2 processes"),
])
def test_plans_for_several_machines_that_cannot_work_exit_2_before_anything_starts(capsys, monkeypatch, gpus, flags,
                                                                                  needle):
    code, out, err = _plan(capsys, monkeypatch, gpus, *flags)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


# ---------------------------------------------------------------- the SLURM export

ENV_CELL = '''
from datasets import Dataset

class CountEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Write a: "] * 8})

    def score_episode(self, model, tokenizer, completion):
        return completion.count("a") / max(1, len(completion))
'''

# srun: record the command, then run it once per node as SLURM would (SLURM_NODEID/SLURM_PROCID set).
STUB_SRUN = r'''#!/usr/bin/env bash
printf '%s\0' "$@" > "$STUB_LOG/srun.args"
nodes=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes=*) nodes="${1#--nodes=}"; shift ;;
    --*) shift ;;
    *) break ;;
  esac
done
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 "$@" > "$STUB_LOG/node-$i.out" 2> "$STUB_LOG/node-$i.err"
  echo $? > "$STUB_LOG/node-$i.rc"
done
'''
STUB_SCONTROL = r'''#!/usr/bin/env bash
[ "$1 $2 $3" = "show hostnames gpu-[07-08]" ] || { echo "unexpected: $*" >&2; exit 1; }
# The second host comes later, as from a real scontrol with a long list: a reader that stops after the first
# line (`| head -n1` under pipefail) would end this with SIGPIPE and the sbatch script with exit 141.
printf 'gpu-07\n'
sleep 0.3
printf 'gpu-08\n'
'''


def test_export_for_slurm_writes_an_sbatch_script_that_starts_one_launcher_per_node(shell, in_tmp):
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    shell.run_line_magic("grpo_train", "--env CountEnv --model tiny --batch-size 8")
    shell.run_line_magic("grpo_export", "CountEnv --to job --cluster slurm --nodes 2 --gpus-per-node 4")
    folder = in_tmp / "job"
    sbatch = folder / "slurm.sbatch"
    assert os.access(sbatch, os.X_OK) and (folder / "launch.sh").exists()
    syntax = subprocess.run(["bash", "-n", str(sbatch)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    text = sbatch.read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=4\n" in text and "#SBATCH --ntasks-per-node=1" in text
    import yaml

    config = yaml.safe_load((folder / "accelerate_config_slurm.yaml").read_text())
    assert (config["num_machines"], config["num_processes"], config["distributed_type"]) == (2, 8, "MULTI_GPU")

    stubs, log = in_tmp / "stubs", in_tmp / "log"
    stubs.mkdir()
    log.mkdir()
    for name, body in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    env = _env(PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(log), SLURM_NNODES="2",
               SLURM_JOB_NODELIST="gpu-[07-08]", SLURM_SUBMIT_DIR=str(folder), SLURM_GPUS_ON_NODE="4",
               GRPO_MAGIC_FAKE_GPUS="4")
    # SLURM runs a copy of the script from its spool folder: run it from elsewhere, with a flag for the nodes.
    proc = subprocess.run(["bash", str(sbatch), "--dry-run"], cwd=in_tmp, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 nodes, 8 processes, rendezvous gpu-07:29500" in proc.stderr
    srun = (log / "srun.args").read_text().split("\0")[:-1]
    assert srun[:3] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"] and srun[3:5] == ["bash", "-c"]
    assert '--machine-rank "$SLURM_NODEID"' in srun[5]  # read on each node, not here
    assert srun[6:] == [str(folder / "launch.sh"), "gpu-07", "29500", "8", "--dry-run"]
    for rank in (0, 1):
        assert (log / f"node-{rank}.rc").read_text().strip() == "0", (log / f"node-{rank}.err").read_text()
        out = (log / f"node-{rank}.out").read_text()
        assert f"machine {rank} of 2, rendezvous gpu-07:29500 (static): training on GPUs 0,1,2,3" in out, out
        argv = _train_line(out)
        assert Path(argv[2]).name == "accelerate" and {
            f: _after(argv, f) for f in ("--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
                                         "--main_process_port")} == {
            "--num_processes": "8", "--num_machines": "2", "--machine_rank": str(rank), "--main_process_ip": "gpu-07",
            "--main_process_port": "29500"}
        train = argv[argv.index("-m"):]
        assert train[:3] == ["-m", "grpo_magic", "train"] and _after(train, "--rl-env-module") == "count_env"
        assert _after(train, "--batch-size") == "8" and "--machine-rank" not in train


def test_export_without_a_cluster_writes_today_s_folder_and_bad_cluster_flags_are_one_sentence(shell, in_tmp):
    shell.run_cell_magic("grpo_env", "", ENV_CELL)
    shell.run_line_magic("grpo_export", "CountEnv --to plain --cluster none")
    assert sorted(p.name for p in (in_tmp / "plain").iterdir()) == ["accelerate_config.yaml", "count_env.py",
                                                                    "launch.sh"]
    for line, words in [
        ("CountEnv --to x --cluster pbs", "--cluster must be none or slurm, not 'pbs'"),
        ("CountEnv --to x --cluster slurm --nodes 0", "--nodes must be at least 1"),
        ("CountEnv --to x --cluster slurm --gpus-per-node -1", "--gpus-per-node must be 0 (CPU nodes) or more"),
        ("CountEnv --to env.py --cluster slurm", "use --to DIR"),
    ]:
        with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
            shell.run_line_magic("grpo_export", line)
        assert "\n" not in str(info.value)
    assert not (in_tmp / "x").exists() and not (in_tmp / "env.py").exists()
