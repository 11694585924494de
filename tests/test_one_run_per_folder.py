"""One run per output folder, between processes; folders that do not collide; one build per cached model.

A run holds its folder's lock (``grpo_magic.runtime.locking``, filelock) while it trains: a second run into
it, from another terminal or a notebook kernel, is refused in one line that names the running one,
and the first run's log, checkpoints and weights come out as those of a run that was alone (the
same bytes: same seed, same steps). A run killed with SIGKILL leaves a stale lock that the next run
takes over with a note; ``--resume`` then works. Without a project_name each run gets a folder of
its own. Two processes that need ``tiny-math`` on an empty cache build it once (docs/architecture.md,
"One run per folder").
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import grpo_magic
from envs.letters import LettersEnv
from grpo_magic import GRPOParams, read_run_log, train
from grpo_magic.events import EpisodeError, RunFinished, RunStarted, StatusChanged, StepLogged
from grpo_magic.models import cache as models_cache
from grpo_magic.runtime.locking import FOLDER_LOCK_NAME, Busy, ProcessLock, probe
from grpo_magic.training.folders import RUNS_DIR, new_run_folder
from grpo_magic.training.resume import complete_checkpoint

REPO = Path(__file__).resolve().parents[1]
HOST = socket.gethostname()

#: An env whose step 2 waits until the file ``gate`` exists: the test opens it when it is done with the run.
GATE_ENV = '''
import os
import time

from envs.letters import LettersEnv


class GateEnv(LettersEnv):
    def __init__(self, gate: str = "", **kwargs):
        super().__init__(**kwargs)
        self.gate, self.calls = gate, 0

    def score_episode(self, model, tokenizer, completion, letter):
        self.calls += 1  # one episode at a time (rl_env_workers 1), 8 a step
        if self.gate and self.calls == 9:
            deadline = time.monotonic() + 600  # a safety net: the test opens the gate
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().score_episode(model, tokenizer, completion, letter)
'''
FLAGS = ["--model", "tiny", "--rl-env-module", "gate_env", "--rl-env-class", "GateEnv", "--batch-size", "8",
         "--rl-max-new-tokens", "8", "--lr", "1e-3", "--seed", "0", "--max-steps", "3", "--save-steps", "2"]


class Rescorer(LettersEnv):
    """GateEnv's scores, without the gate: what a rescore of a gated run's log uses."""

    def __init__(self, gate: str = "", **kwargs) -> None:
        super().__init__(**kwargs)


def _env(folder: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GRPO_MAGIC_LAUNCHED")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return {**env, **extra}


def _cli(*flags: str) -> list[str]:
    return [sys.executable, "-m", "grpo_magic", "train", *FLAGS, *flags, "--quiet"]


def _gate_config(gate: Path) -> str:
    return json.dumps({"gate": str(gate)})


def _start_gated(folder: Path, project: str, gate: Path, *flags: str) -> subprocess.Popen:
    (folder / "gate_env.py").write_text(GATE_ENV)
    return subprocess.Popen(_cli("--project-name", project, "--rl-env-config", _gate_config(gate), *flags),
                            cwd=folder, env=_env(folder), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _steps(folder: Path) -> list[int]:
    if not (folder / "events.jsonl").exists():
        return []
    return [e.step for e in read_run_log(folder) if isinstance(e, StepLogged)]


def _wait_until(predicate, proc: subprocess.Popen | None = None, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen, gate: Path) -> str:
    """Open the gate and let the run end; its stderr."""
    gate.touch()
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    return err


def _refusal(stderr: str) -> str:
    """The one line a refused CLI run printed."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("grpo-magic: error: Output folder "), lines[0]
    return lines[0]


def _names_the_running_run(message: str, pid: int, what: str) -> None:
    assert f"process {pid} on {HOST}, since 20" in message, message  # process, host, since when
    assert what in message, message
    assert "use another --project-name, or stop that run first." in message, message


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> Path:
    """A run with the same settings that trained alone (no gate: the env's config does not change a score)."""
    folder = tmp_path_factory.mktemp("alone")
    (folder / "gate_env.py").write_text(GATE_ENV)
    proc = subprocess.run(_cli("--project-name", "alone"), cwd=folder, env=_env(folder), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder / "alone"


def _whole_as_if_alone(folder: Path, alone: Path) -> None:
    """One run's log, checkpoints and weights, exactly those of the run that trained alone."""
    events = list(read_run_log(folder))
    assert [type(e).__name__ for e in events if isinstance(e, (RunStarted, RunFinished))] == ["RunStarted",
                                                                                             "RunFinished"]
    assert events[-1].status == "completed"
    assert _steps(folder) == _steps(alone) == [1, 2, 3]
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in alone.iterdir())  # nothing set aside
    assert not (folder / (FOLDER_LOCK_NAME + ".json")).exists()  # released: no holder named any more
    for part in ("model.safetensors", "checkpoint-2/model.safetensors", "checkpoint-3/model.safetensors",
                 "checkpoint-3/optimizer.pt"):
        assert (folder / part).read_bytes() == (alone / part).read_bytes(), part


# ---------------------------------------------------------------- two processes, one folder


def test_two_cli_runs_into_one_folder_the_second_is_refused_in_one_line_and_the_first_stays_whole(tmp_path, alone):
    gate = tmp_path / "open"
    first = _start_gated(tmp_path, "shared", gate)
    shared = tmp_path / "shared"
    try:
        _wait_until(lambda: _steps(shared) == [1], first)  # step 2 waits at the gate: the run holds the folder
        second = subprocess.run(_cli("--project-name", "shared"), cwd=tmp_path, env=_env(tmp_path),
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2
        _names_the_running_run(_refusal(second.stderr), first.pid, "grpo-magic train, training GateEnv on tiny")
        # Through the launcher too: refused before any process starts.
        launched = subprocess.run(_cli("--project-name", "shared", "--num-processes", "2", "--batch-size", "4"),
                                  cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert launched.returncode == 2 and "starting 2 training processes" not in launched.stderr
        _names_the_running_run(_refusal(launched.stderr), first.pid, "grpo-magic train")
        assert list(shared.glob("events*.jsonl")) == [shared / "events.jsonl"]  # the running log was left alone
        # Reading a folder in use takes no lock: the dashboard of the run so far, and a rescore of its steps.
        assert grpo_magic.replay(str(shared)).step == 1
        report = grpo_magic.rescore(str(shared), Rescorer)
        assert {g["step"] for g in report.groups} == {1}
        assert probe(shared / FOLDER_LOCK_NAME)[0]  # still held by the first run
    finally:
        err = _finish(first, gate)
    assert "error" not in err
    _whole_as_if_alone(shared, alone)


def _kernel(tmp_path: Path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    from tests.test_notebooks import _kernel_manager

    notebook = nbformat.v4.new_notebook()
    client = NotebookClient(notebook, km=_kernel_manager(), timeout=600, resources={"metadata": {"path": str(tmp_path)}})

    def run_cell(source: str) -> str:
        cell = nbformat.v4.new_code_cell(textwrap.dedent(source))
        notebook.cells.append(cell)
        client.execute_cell(cell, len(notebook.cells) - 1)
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        assert not errors, errors
        return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")

    return client, run_cell


def test_a_cli_run_and_a_notebook_kernel_into_one_folder_the_second_is_refused_either_way(tmp_path, alone):
    (tmp_path / "gate_env.py").write_text(GATE_ENV)
    gate, gate2 = tmp_path / "open", tmp_path / "open2"
    line = " ".join([*FLAGS, "--rl-env-config", f"'{_gate_config(gate)}'"])
    client, run_cell = _kernel(tmp_path)
    cli = None
    with client.setup_kernel(env=_env(tmp_path)):
        kernel_pid = int(run_cell("import os\n%load_ext grpo_magic\nprint(os.getpid())").strip())
        run_cell(f"run = %grpo_train {line} --project-name shared --run")  # trains in the kernel's background thread
        shared = tmp_path / "shared"
        _wait_until(lambda: _steps(shared) == [1])
        refused = subprocess.run(_cli("--project-name", "shared"), cwd=tmp_path, env=_env(tmp_path),
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2
        _names_the_running_run(_refusal(refused.stderr), kernel_pid, "a Jupyter kernel, training GateEnv on tiny")
        gate.touch()
        assert run_cell("print(run.wait().status)").strip() == "completed"

        # The other way round: a CLI run holds the folder, the notebook's %grpo_train is refused.
        try:
            cli = _start_gated(tmp_path, "shared2", gate2)
            _wait_until(lambda: _steps(tmp_path / "shared2") == [1], cli)
            out = run_cell(f"""
                from IPython.core.error import UsageError
                try:
                    get_ipython().run_line_magic("grpo_train", "{" ".join(FLAGS)} --project-name shared2 --run --blocking")
                except UsageError as exc:
                    print("REFUSED", exc)
            """)
        finally:
            if cli is not None:
                _finish(cli, gate2)
    assert out.startswith("REFUSED Output folder ") and out.count("\n") == 1, out
    _names_the_running_run(out, cli.pid, "grpo-magic train, training GateEnv on tiny")
    _whole_as_if_alone(shared, alone)
    _whole_as_if_alone(tmp_path / "shared2", alone)


# ---------------------------------------------------------------- a run that died holding its folder


def test_a_run_killed_with_sigkill_leaves_a_stale_lock_that_the_next_run_takes_over_with_a_note(tmp_path):
    gate = tmp_path / "open"  # never opened: the run is killed at step 2
    killed = _start_gated(tmp_path, "killed", gate, "--save-steps", "1")
    folder = tmp_path / "killed"
    try:
        _wait_until(lambda: _steps(folder) == [1] and complete_checkpoint(folder / "checkpoint-1"), killed)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
    sidecar = json.loads((folder / (FOLDER_LOCK_NAME + ".json")).read_text())
    assert sidecar["pid"] == killed.pid and sidecar["host"] == HOST  # what the dead run left: a stale lock
    busy, holder = probe(folder / FOLDER_LOCK_NAME)
    assert not busy and holder is not None and holder.pid == killed.pid  # the kernel freed it; the sidecar stayed

    resumed = subprocess.run(_cli("--project-name", "killed", "--resume"), cwd=tmp_path, env=_env(tmp_path),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    note = next(line for line in resumed.stderr.splitlines() if "took over the lock" in line)
    assert note.startswith("grpo-magic: note: took over the lock of ") and f"process {killed.pid} on {HOST}" in note
    assert "ended without releasing it" in note
    events = list(read_run_log(folder))
    assert any(isinstance(e, StatusChanged) and "took over the lock" in e.message for e in events)  # in the log too
    assert _steps(folder) == [1, 2, 3] and isinstance(events[-1], RunFinished) and events[-1].status == "completed"
    assert not (folder / (FOLDER_LOCK_NAME + ".json")).exists()


HOLD_AND_FORK = """
import os, sys, time
from pathlib import Path
from grpo_magic.runtime.locking import ProcessLock
ProcessLock(Path(sys.argv[1]), "a test process").acquire()
if os.fork() == 0:  # the child keeps the lock open (the same open file) after its parent is gone
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1), os.dup2(null, 2)  # and lets go of the test's pipes
    time.sleep(120)
    os._exit(0)
print(os.getpid(), flush=True)
os._exit(0)  # the parent dies without releasing
"""


def test_a_lock_kept_open_by_a_fork_of_a_dead_holder_is_broken_and_taken_over(tmp_path):
    path = tmp_path / "x.lock"
    out = subprocess.run([sys.executable, "-c", HOLD_AND_FORK, str(path)], env=_env(tmp_path), capture_output=True,
                         text=True, timeout=120, start_new_session=True)
    dead = int(out.stdout.strip())
    try:
        busy, holder = probe(path)
        assert not busy and holder.pid == dead  # its holder is gone: not in use, though the fork holds it open
        lock = ProcessLock(path, "the next one").acquire()
        assert lock.taken_over is not None and lock.taken_over.pid == dead
        with pytest.raises(Busy, match=r"held by the next one \(process \d+ on .*, since 20"):
            ProcessLock(path, "a third").acquire()
        lock.release()
        assert not path.with_name("x.lock.json").exists()
    finally:
        os.killpg(dead, signal.SIGKILL)  # the fork, in the dead parent's process group (its own session)


# ---------------------------------------------------------------- the lock goes with the run, however it ends


class FailsFromStep2(LettersEnv):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def score_episode(self, model, tokenizer, completion, letter):
        self.calls += 1
        if self.calls > 8:
            raise KeyError("room_17")
        if self.calls % 4 == 1:
            raise ValueError(f"episode {self.calls} failed")  # one error in each group of step 1
        return super().score_episode(model, tokenizer, completion, letter)


LETTERS_CELL = "from envs.letters import LettersEnv\n\n\nclass Letters(LettersEnv):\n    pass\n"
FAST = dict(model="tiny", batch_size=8, rl_num_generations=4, rl_max_new_tokens=8, seed=0, lr=1e-3)


def test_the_error_rate_stop_releases_the_folder_and_a_resume_has_the_errors_before_its_checkpoint(in_tmp):
    params = GRPOParams(**FAST, max_steps=3, save_steps=1, rl_max_error_rate=0.5, project_name="errors")
    with pytest.raises(grpo_magic.GRPOMagicError, match="8 of 8 episodes failed at step 2"):
        train(params, FailsFromStep2())
    folder = in_tmp / "errors"
    assert probe(folder / FOLDER_LOCK_NAME) == (False, None)  # released, and nothing names a holder
    logged = [e for e in read_run_log(folder) if isinstance(e, EpisodeError)]
    assert [e.step for e in logged] == [1, 1] + [2] * 8

    resumed = train(params, LettersEnv(), resume=True)  # from checkpoint-1: step 2 again, then 3
    assert resumed.status == "completed" and [h["step"] for h in resumed.history] == [1, 2, 3]
    assert [(e["step"], e["message"]) for e in resumed.errors] == [(1, "ValueError: episode 1 failed"),
                                                                       (1, "ValueError: episode 5 failed")]
    assert resumed.error_count == 2  # step 2's errors were those of the attempt the checkpoint came before
    assert probe(folder / FOLDER_LOCK_NAME) == (False, None)


# ---------------------------------------------------------------- default folders


def test_runs_without_a_project_name_get_a_folder_each_and_resume_continues_the_newest(in_tmp, shell):
    params = GRPOParams(**FAST, max_steps=1, save_steps=1)
    first = train(params, LettersEnv(), display=False)
    second = train(params, LettersEnv(), display=False)
    assert first.output_dir != second.output_dir
    for run in (first, second):
        assert run.output_dir.parent == in_tmp / RUNS_DIR and re.fullmatch(r"LettersEnv-\d{8}-\d{6}(-\d+)?",
                                                                            run.output_dir.name)
        assert run.params.project_name == str(run.output_dir.relative_to(in_tmp))  # the run log says where
        assert _steps(run.output_dir) == [1]
    resumed = train(params.replace(max_steps=2), LettersEnv(), display=False, resume=True)
    assert resumed.output_dir == second.output_dir and _steps(second.output_dir) == [1, 2]
    # The magic without --project-name too; the CLI keeps the seed's grpo-run.
    shell.run_cell_magic("grpo_env", "Letters", LETTERS_CELL)
    run = shell.run_line_magic("grpo_train", "--env Letters --model tiny --batch-size 8 --rl-max-new-tokens 8 "
                                             "--max-steps 1 --run --blocking")
    assert run.output_dir.parent == in_tmp / RUNS_DIR and run.output_dir.name.startswith("Letters-")


def test_two_runs_in_the_same_second_get_two_folders(in_tmp):
    folders = [new_run_folder("Env") for _ in range(3)]
    assert len(set(folders)) == 3 and all(f.is_dir() for f in folders)


def test_the_cli_without_a_project_name_trains_into_grpo_run(capsys):
    from grpo_magic.frontends.cli import main

    assert main(["train", "--model", "tiny", "--rl-env-module", "envs.letters", "--rl-env-class", "LettersEnv",
                 "--dry-run"]) == 0
    assert "--project-name grpo-run" in capsys.readouterr().out


# ---------------------------------------------------------------- JSON the parser cannot take, in the form


@pytest.mark.parametrize(("config", "words"), [
    ("[" * 30_000 + "]" * 30_000, "nests deeper than 100 levels"),
    ('{"letter": "' + "a" * 150_000 + '"}', "characters long"),
])
def test_the_form_answers_a_config_too_deep_or_too_large_in_one_sentence(shell, config, words):
    shell.run_cell_magic("grpo_env", "Letters", LETTERS_CELL)
    form = shell.run_line_magic("grpo_train", "--env Letters --model tiny")
    assert not form.train_button.disabled
    form.fields["rl_env_config"].value = config
    assert form.train_button.disabled
    message = form.errors["rl_env_config"].value
    assert words in message and "pass its path in the config" in message and "\n" not in message
    with pytest.raises(UsageError, match=words):
        shell.run_cell_magic("grpo_env", f"Letters --config '{config}'", LETTERS_CELL)


# ---------------------------------------------------------------- one build per cached model, between processes

BUILD = """
import sys, time
from grpo_magic.models.cache import cached_folder

def build(dest):
    (dest / "part").write_text(sys.argv[1])
    if sys.argv[1] == "dies":
        print("building", flush=True)
        time.sleep(600)  # killed here, half-way
    return {"by": sys.argv[1]}

print(cached_folder("fake-v1", build), flush=True)
"""


def test_a_build_that_died_half_way_is_waited_for_then_detected_and_redone(tmp_path):
    cache = tmp_path / "cache"
    env = _env(tmp_path, GRPO_MAGIC_CACHE=str(cache), GRPO_MAGIC_BUILD_MODELS="1")  # the recipe builds
    dying = subprocess.Popen([sys.executable, "-c", BUILD, "dies"], env=env, stdout=subprocess.PIPE, text=True)
    waiter = None
    try:
        assert dying.stdout.readline().strip() == "building"
        assert len(list(cache.glob(".fake-v1.tmp-*"))) == 1  # its half-built folder
        err = tmp_path / "waiter.err"
        with open(err, "w") as stream:
            waiter = subprocess.Popen([sys.executable, "-c", BUILD, "finishes"], env=env, stdout=subprocess.PIPE,
                                      stderr=stream, text=True)
        _wait_until(lambda: "waiting for" in err.read_text(), waiter, timeout=120)
        dying.send_signal(signal.SIGKILL)
        out, _ = waiter.communicate(timeout=120)
    finally:
        for proc in (dying, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert waiter.returncode == 0
    lines = err.read_text().strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("grpo_magic: waiting for python -c, building fake-v1 (process "
                               f"{dying.pid} on {HOST}, since 20") and lines[0].endswith("its files are used then")
    assert lines[1] == (f"grpo_magic: a build of fake-v1 by python -c, building fake-v1 (process {dying.pid} on "
                        f"{HOST}, since {lines[1].split('since ')[1].split(')')[0]}) stopped half-way; discarding it and "
                        "building again")
    folder = Path(out.strip())
    assert folder == cache / "fake-v1" and (folder / "part").read_text() == "finishes"
    marker = json.loads((folder / "grpo_magic_build.json").read_text())
    assert marker["by"] == "finishes" and marker["built_by"]["pid"] == waiter.pid
    assert not list(cache.glob(".fake-v1.tmp-*")) and not (cache / ".fake-v1.lock.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_processes_that_need_tiny_math_on_an_empty_cache_build_it_once_and_both_train(tmp_path):
    cache = tmp_path / "cache"
    env = _env(tmp_path, GRPO_MAGIC_CACHE=str(cache), GRPO_MAGIC_BUILD_MODELS="1")  # the recipe builds
    argv = [sys.executable, "-m", "grpo_magic", "train", "--model", "tiny-math", "--rl-env-module", "envs.addition",
            "--rl-env-class", "AdditionEnv", "--batch-size", "8", "--rl-num-generations", "4", "--rl-max-new-tokens",
            "8", "--lr", "5e-4", "--rl-kl-coef", "0", "--max-steps", "2", "--quiet"]
    procs = {name: subprocess.Popen([*argv, "--project-name", name], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True) for name in ("a", "b")}
    errs = {}
    try:
        for name, proc in procs.items():
            errs[name] = proc.communicate(timeout=1700)[1]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs.values()), errs
    built = [n for n, e in errs.items() if "building the offline model 'tiny-math'" in e]
    waited = [n for n, e in errs.items() if "waiting for grpo-magic train, building tiny-math" in e]
    assert len(built) == 1 and waited == [n for n in errs if n not in built], errs  # one build, the other waited
    assert errs[waited[0]].count("waiting for") == 1
    folders = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert len(folders) == 2 and any(f.startswith("tiny-math") for f in folders)  # tiny-math and the tiny it starts from
    assert not list(cache.glob(".*.tmp-*")) and not list(cache.glob("*.lock.json"))
    math_folder = next(cache / f for f in folders if f.startswith("tiny-math"))
    marker = json.loads((math_folder / "grpo_magic_build.json").read_text())
    assert marker["built_by"]["pid"] == procs[built[0]].pid
    # The recipe rebuilds the model the package ships: it scores as its card says (floats may differ across CPUs).
    shipped = json.loads((Path(models_cache.SHIPPED) / math_folder.name / "grpo_magic_build.json").read_text())
    for measure in ("greedy_accuracy", "sampled_accuracy"):
        assert abs(marker["check"][measure] - shipped["check"][measure]) <= 0.05, (measure, marker, shipped)
    for name in ("a", "b"):
        events = list(read_run_log(tmp_path / name))
        assert events[-1].status == "completed" and _steps(tmp_path / name) == [1, 2]
    # Both trained from the very same files with the same seed: the same weights, byte for byte.
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
