"""Scale out from one ``grpo-magic train`` command: several processes, and the vLLM server split.

``grpo-magic train`` trains in its own process on a CPU or a single GPU. On a machine with
several GPUs (or with ``--num-processes N``) it starts ``accelerate launch`` itself (``torchrun``
on CPU, where ``accelerate launch --cpu`` starts only one process), and the processes it starts
train data-parallel with the very same command. With ``--use-vllm --vllm-mode server`` and no
``--vllm-server-url`` it starts ``trl vllm-serve`` on the last ``vllm_server_gpus`` GPUs, waits
until the server answers, trains on the other GPUs and stops the server however training ends.

Commands are built as argument lists (never shell strings) so that ``--dry-run`` prints exactly
what would run. The GPU count can be faked with ``GRPO_MAGIC_FAKE_GPUS=8``, so that the plans for
machines we do not have can be tested here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_magic.config.params import CLI_PROJECT_NAME, GRPOParams
from grpo_magic.errors import GRPOMagicError
from grpo_magic.runtime.distributed import LAUNCHED_ENV, inside_launch
from grpo_magic.runtime.locking import refuse_if_in_use
from grpo_magic.text import plural
from grpo_magic.training.preflight import check_launch, server_answers

from .machines import DEFAULT_SERVER_TIMEOUT_S, SERVER_HOST, LaunchOptions

#: Number of GPUs to pretend this machine has (tests and dry runs of cluster plans).
FAKE_GPUS_ENV = "GRPO_MAGIC_FAKE_GPUS"
SERVER_LOG_NAME = "vllm-server.log"


@dataclass
class Command:
    """One process to start: its arguments, the environment variables it adds, and its log file."""

    role: str  # "vllm-server" or "train"
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None

    def shell(self) -> str:
        """The command as one line a user can paste into a shell."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*assignments, shlex.join(self.argv)])


@dataclass
class LaunchPlan:
    """Which processes run where: the GPU assignment and the exact commands."""

    gpus: list[str]
    train_gpus: list[str]
    server_gpus: list[str]
    num_processes: int
    launcher: str  # "accelerate", "torchrun" or "" (this process trains)
    train: Command
    server: Command | None = None
    server_url: str | None = None
    server_timeout: float = DEFAULT_SERVER_TIMEOUT_S
    output_dir: Path = field(default_factory=Path)
    num_machines: int = 1
    machine_rank: int = 0
    rendezvous: str | None = None  # "HOST:PORT (backend)" when the launcher was given rendezvous flags

    @property
    def processes_here(self) -> int:
        """Training processes this machine starts (num_processes counts every machine's)."""
        return self.num_processes // max(1, self.num_machines)

    def where(self) -> str:
        """``machine 1 of 2, rendezvous 10.0.0.1:29500 (static): `` before the launcher's lines; "" on one machine."""
        if self.rendezvous is None:
            return ""
        return f"machine {self.machine_rank} of {self.num_machines}, rendezvous {self.rendezvous}: "

    @property
    def in_process(self) -> bool:
        return not self.launcher

    def describe(self) -> str:
        """The dry-run text: GPU assignment first, then each command exactly as it would run."""
        gpus = f"{plural(len(self.gpus), 'GPU')} visible"
        gpus += f" ({','.join(self.gpus)})" if self.gpus else ""
        lines = [f"grpo-magic: {gpus}"]
        processes = plural(self.processes_here, "process", "processes")
        if self.num_machines > 1:
            processes += f" here, {self.num_processes} on {self.num_machines} machines"
        if self.server is not None:
            lines.append(f"grpo-magic: vLLM server on GPUs {','.join(self.server_gpus)}, "
                         f"training on GPUs {','.join(self.train_gpus)} ({self.num_processes} processes)")
        elif self.train_gpus:
            lines.append(f"grpo-magic: {self.where()}training on GPUs {','.join(self.train_gpus)} ({processes})")
        else:
            lines.append(f"grpo-magic: {self.where()}training on CPU ({processes})")
        if self.server is not None:
            lines.append(f"1. start the vLLM server (log: {self.server.log}):")
            lines.append(f"   {self.server.shell()}")
            lines.append(f"2. wait until {self.server_url}/health answers (at most {self.server_timeout:g} s)")
            lines.append("3. train (the server is stopped when training ends):")
        else:
            lines.append("train:" if not self.in_process else "train in this process:")
        lines.append(f"   {self.train.shell()}")
        return "\n".join(lines)


# ---------------------------------------------------------------- where we are


def visible_gpus() -> list[str]:
    """The ids of the GPUs this process may use, as CUDA_VISIBLE_DEVICES names them.

    ``GRPO_MAGIC_FAKE_GPUS=N`` pretends there are N GPUs (0..N-1): a plan for a cluster machine
    can then be checked anywhere.
    """
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake is not None and fake.strip() != "":
        try:
            count = int(fake)
        except ValueError:
            raise GRPOMagicError(f"{FAKE_GPUS_ENV} must be a number of GPUs, got {fake!r}.") from None
        return [str(i) for i in range(max(0, count))]
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA is zero GPUs, not a crash
        count = 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        names = [name.strip() for name in listed.split(",") if name.strip()]
        return names[:count]
    return [str(i) for i in range(count)]


# ---------------------------------------------------------------- the plan


def _tool(name: str, module: str) -> list[str]:
    """A console script of this Python's environment (``accelerate``, ``trl``), else its module form."""
    sibling = Path(sys.executable).with_name(name)
    if sibling.exists():
        return [str(sibling)]
    return [sys.executable, "-m", module]


def plan_launch(params: GRPOParams, options: LaunchOptions, *, gpus: list[str] | None = None) -> LaunchPlan:
    """Decide how to train: in this process, or which processes to start on which GPUs.

    Raises ``GRPOMagicError`` (one sentence) for a plan that cannot work, before anything starts.
    """
    options.check()
    gpus = visible_gpus() if gpus is None else gpus
    if params.project_name is None:  # the terminal's folder, as grpo-magic train names it (params.CLI_PROJECT_NAME)
        params = params.replace(project_name=CLI_PROJECT_NAME)
    output_dir = Path(params.project_name).expanduser().resolve()
    split = params.use_vllm and params.vllm_mode == "server" and not params.vllm_server_url
    if inside_launch():
        return _in_process_plan(params, options, gpus, output_dir)

    server_gpus: list[str] = []
    server_url: str | None = None
    if split:
        s, tp = params.vllm_server_gpus, params.vllm_tensor_parallel_size
        if not gpus:
            raise GRPOMagicError(
                "--vllm-mode server without --vllm-server-url starts a vLLM server on its own GPUs, but no GPU is "
                "visible here; pass --vllm-server-url of a running server (trl vllm-serve), or drop --use-vllm."
            )
        if tp > s:
            raise GRPOMagicError(
                f"vllm_tensor_parallel_size {tp} needs {tp} GPUs but the vLLM server gets vllm_server_gpus {s}; "
                f"use --vllm-server-gpus {tp} or --vllm-tensor-parallel-size {s}."
            )
        if s % tp:
            raise GRPOMagicError(
                f"vllm_server_gpus {s} is not a multiple of vllm_tensor_parallel_size {tp} (the server runs "
                f"{s}/{tp} model copies); use --vllm-server-gpus {tp * max(1, s // tp)}."
            )
        if s >= len(gpus):
            lower = f"use --vllm-server-gpus {len(gpus) - 1} or fewer, " if len(gpus) > 1 else ""
            raise GRPOMagicError(
                f"vllm_server_gpus {s} takes every GPU of this machine ({plural(len(gpus), 'GPU')} visible) and "
                f"leaves none to train on; {lower}use --vllm-mode colocate (vLLM shares the training GPUs), or pass "
                "--vllm-server-url of a server on another machine."
            )
        server_gpus = gpus[len(gpus) - s:]
        available = gpus[: len(gpus) - s]
        server_url = f"http://{SERVER_HOST}:{options.vllm_server_port}"
    else:
        available = gpus

    m = options.num_machines
    if m > 1 and split:
        raise GRPOMagicError(
            f"--vllm-mode server without --vllm-server-url starts a vLLM server on this machine only, which the other "
            f"machines of --num-machines {m} cannot reach; start one server (trl vllm-serve --host 0.0.0.0) and pass "
            "its --vllm-server-url to every machine, or use --vllm-mode colocate."
        )
    if options.num_processes is not None:
        n = options.num_processes
        here = n // m  # accelerate's meaning: --num-processes counts the processes of every machine
        if available and here > len(available):
            left = f"left after the {plural(len(server_gpus), 'GPU')} of the vLLM server" if split else "visible"
            verb = "is" if len(available) == 1 else "are"
            if m > 1:
                raise GRPOMagicError(
                    f"--num-processes {n} over --num-machines {m} needs {plural(here, 'GPU')} on each machine but "
                    f"only {len(available)} {verb} {left} here; use --num-processes {len(available) * m} or fewer."
                )
            raise GRPOMagicError(
                f"--num-processes {n} needs {plural(n, 'GPU')} but only {len(available)} {verb} {left}; "
                f"use --num-processes {len(available)} or fewer."
            )
    else:
        here = max(1, len(available))
        n = here * m
    train_gpus = available[:here]

    if params.use_vllm and params.vllm_mode == "colocate" and n % params.vllm_tensor_parallel_size:
        raise GRPOMagicError(
            f"vllm_tensor_parallel_size {params.vllm_tensor_parallel_size} must divide the {n} training process(es) "
            "in colocate mode (each group of that many processes shares one vLLM); change --vllm-tensor-parallel-size "
            "or --num-processes."
        )
    child_params = params.replace(vllm_server_url=server_url) if split else params
    child_params.validate(processes=n)  # as the training processes will see them

    if n == 1 and not split and options.accelerate_config is None and not options.multi_machine:
        return _in_process_plan(params, options, gpus, output_dir, train_gpus=train_gpus)
    if options.resume:  # a checkpoint this run cannot continue is said here, before any process starts
        from grpo_magic.training.resume import checkpoint_to_resume

        checkpoint_to_resume(output_dir, child_params, processes=n)

    args = ["-m", "grpo_magic", "train", *_child_args(child_params, options)]
    env = {LAUNCHED_ENV: "1"}
    rendezvous = options.rendezvous() if options.multi_machine else None
    if train_gpus or options.accelerate_config is not None:
        launcher = "accelerate"
        argv = [*_tool("accelerate", "accelerate.commands.launch")]
        if argv[-1] != "accelerate.commands.launch":
            argv.append("launch")
        if options.accelerate_config is not None:  # DeepSpeed / FSDP settings: the file decides the rest
            argv += ["--config_file", str(Path(options.accelerate_config).expanduser().resolve()),
                     "--num_processes", str(n)]
            if rendezvous is not None:
                argv += ["--num_machines", str(m)]
        else:
            argv += [*(["--multi_gpu"] if n > 1 else []), "--num_processes", str(n), "--num_machines", str(m),
                     "--dynamo_backend", "no"]
        if rendezvous is not None:  # accelerate hands these to torchrun (rdzv_endpoint = ip:port)
            argv += ["--machine_rank", str(options.machine_rank), "--main_process_ip", rendezvous[0],
                     "--main_process_port", str(rendezvous[1]), "--rdzv_backend", options.rdzv_backend]
        if not train_gpus:
            argv.append("--cpu")
        if train_gpus:
            env = {"CUDA_VISIBLE_DEVICES": ",".join(train_gpus), **env}
    else:  # CPU: accelerate launch --cpu starts one process only; torchrun starts them all
        launcher = "torchrun"
        argv = [*_tool("torchrun", "torch.distributed.run")]
        if rendezvous is None:
            argv += ["--standalone", "--nproc_per_node", str(n)]
        else:
            host, port = rendezvous
            argv += ["--nnodes", str(m), "--node_rank", str(options.machine_rank), "--nproc_per_node", str(here),
                     "--rdzv_backend", options.rdzv_backend]
            if options.rdzv_backend == "static":  # fixed ranks: machine 0 is the master
                argv += ["--master_addr", host, "--master_port", str(port)]
            else:  # c10d: torchrun's elastic rendezvous, hosted at the endpoint
                argv += ["--rdzv_endpoint", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    train = Command("train", [*argv, *args], env)

    server = None
    if split:
        assert server_url is not None
        from grpo_magic.models import resolve_model

        model_path = resolve_model(params.model or "")
        serve = [*_tool("trl", "trl.cli.main"), "vllm-serve", *server_args(params, model_path, server_gpus),
                 "--host", SERVER_HOST, "--port", str(options.vllm_server_port)]
        server = Command("vllm-server", serve, {"CUDA_VISIBLE_DEVICES": ",".join(server_gpus)},
                         log=output_dir / SERVER_LOG_NAME)
    return LaunchPlan(gpus=gpus, train_gpus=train_gpus, server_gpus=server_gpus, num_processes=n,
                      launcher=launcher, train=train, server=server, server_url=server_url,
                      server_timeout=options.vllm_server_timeout, output_dir=output_dir, num_machines=m,
                      machine_rank=options.machine_rank,
                      rendezvous=None if rendezvous is None else f"{rendezvous[0]}:{rendezvous[1]} ({options.rdzv_backend})")


def server_args(params: GRPOParams, model_path: str, server_gpus: list[str]) -> list[str]:
    """``trl vllm-serve``'s model, parallelism, dtype and context for this run's server GPUs.

    More server GPUs than the tensor-parallel size would be vLLM data parallelism, which TRL documents as
    failing for dense models (``trl vllm-serve --help``: "will error out", vLLM PR #30739): refused here
    unless the model has experts. The dtype is the run's precision (``device.choose_precision``), so that
    the server samples in what the trainer trains in; the context is the run's (``preflight.vllm_context_length``).
    """
    from grpo_magic.models import is_mixture_of_experts
    from grpo_magic.runtime.device import vllm_dtype

    s, tp = params.vllm_server_gpus, params.vllm_tensor_parallel_size
    args = ["--model", model_path, "--tensor-parallel-size", str(tp)]
    if s > tp:
        if not is_mixture_of_experts(model_path):
            raise GRPOMagicError(
                f"vllm_server_gpus {s} with vllm_tensor_parallel_size {tp} would run trl vllm-serve with "
                f"--data-parallel-size {s // tp}, which TRL says errors out for a dense model like {params.model}; use "
                f"--vllm-tensor-parallel-size {s} (one model copy on all {s} server GPUs) or --vllm-server-gpus {tp}."
            )
        args += ["--data-parallel-size", str(s // tp)]
    precision = params.precision(device=_cuda_index(server_gpus[0]) if server_gpus else None)
    if precision != "fp32":  # float32 (no CUDA here, e.g. a dry run elsewhere): vLLM's auto picks the same way
        args += ["--dtype", vllm_dtype(precision)]  # type: ignore[arg-type]
    return [*args, "--max-model-len", str(_server_context_length(params, model_path))]


def _cuda_index(name: str) -> int | None:
    """The CUDA index, in this process, of a GPU named as CUDA_VISIBLE_DEVICES names it (None: not a visible one)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [n.strip() for n in listed.split(",")] if listed is not None else None
    if names is not None:
        return names.index(name) if name in names else None
    return int(name) if name.isdigit() else None


def _server_context_length(params: GRPOParams, model_path: str) -> int:
    """The server's ``--max-model-len``: the explicit one, else the longest prompt plus ``rl_max_new_tokens`` (plus
    the later turns of an env that continues its episodes with ``generator``: ``preflight.vllm_context_length``).

    The env's dataset is built here for it, as every training process will (a bad env is said here, once).
    """
    if params.vllm_max_model_length is not None:
        return params.vllm_max_model_length
    from grpo_magic.environment.env import prepare_env, resolve_env
    from grpo_magic.models import load_tokenizer
    from grpo_magic.training.preflight import vllm_context_length

    tokenizer = load_tokenizer(model_path)
    prepared = prepare_env(resolve_env(params, None), tokenizer)
    return vllm_context_length(params, prepared.dataset, tokenizer, model_path, prepared.tools, env=prepared.env)


def _child_args(params: GRPOParams, options: LaunchOptions) -> list[str]:
    """The training flags of every launched process: the params, plus --resume/--quiet."""
    return [*params.to_cli_args(), *(["--resume"] if options.resume else []), *(["--quiet"] if options.quiet else [])]


def _in_process_plan(params: GRPOParams, options: LaunchOptions, gpus: list[str], output_dir: Path,
                     train_gpus: list[str] | None = None) -> LaunchPlan:
    argv = ["grpo-magic", "train", *_child_args(params, options)]
    return LaunchPlan(gpus=gpus, train_gpus=train_gpus if train_gpus is not None else gpus[:1], server_gpus=[],
                      num_processes=1, launcher="", train=Command("train", argv), output_dir=output_dir)


# ---------------------------------------------------------------- running a plan


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((SERVER_HOST, port)) == 0


def _log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:]
    return "\n".join(text)


def start_server(command: Command) -> subprocess.Popen:
    """Start the vLLM server in its own session (a Ctrl-C of training does not reach it; we stop it)."""
    assert command.log is not None
    command.log.parent.mkdir(parents=True, exist_ok=True)
    log = open(command.log, "ab")  # noqa: SIM115 - owned by the server process; closed with it
    try:
        return subprocess.Popen(command.argv, env={**os.environ, **command.env}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError as exc:
        raise GRPOMagicError(f"Could not start the vLLM server: {exc.filename} not found; pip install "
                             "'grpo-magic[vllm]' (vllm and trl) on this machine.") from None
    finally:
        log.close()


def wait_for_server(url: str, process: subprocess.Popen, timeout: float, log: Path | None) -> None:
    """Wait until the server we started answers; fail fast if it exits, and quote its log either way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise GRPOMagicError(
                f"The vLLM server exited with status {process.returncode} before answering at {url}; its log is "
                f"{log}. Last lines:\n{_log_tail(log)}"
            )
        if server_answers(url, timeout=2.0):
            return
        time.sleep(2.0)
    raise GRPOMagicError(
        f"The vLLM server did not answer at {url}/health within {timeout:g} s (raise --vllm-server-timeout for a "
        f"large model); its log is {log}. Last lines:\n{_log_tail(log)}"
    )


def stop_process(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process's whole session, then SIGKILL what is left after ``grace`` seconds."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _terminate_with_parent() -> None:
    """In the launched torchrun / accelerate: SIGTERM when the launcher dies, even by SIGKILL (Linux).

    Without it a killed launcher leaves its machine's processes training on, unseen; with it they
    stop after the step with a checkpoint, as on SIGTERM, and the other machines stop with them.
    """
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class _Terminated(Exception):
    """SIGTERM reached the launcher: stop training, then the server, then exit."""


def execute(plan: LaunchPlan, params: GRPOParams) -> int:
    """Run a plan: the vLLM server if any (waited for), then training; returns training's exit status.

    The server is stopped however training ends: success, failure, Ctrl-C or SIGTERM.
    """
    check_launch(params, processes=plan.num_processes, server_url=plan.server_url, gpus=bool(plan.gpus))
    # A folder another run trains into is refused here, before any process starts; the main training process
    # takes the folder's lock itself (a run that starts meanwhile is refused there).
    refuse_if_in_use(plan.output_dir)
    server: subprocess.Popen | None = None
    trainer: subprocess.Popen | None = None

    def on_sigterm(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if plan.server is not None:
            assert plan.server_url is not None
            port = int(plan.server_url.rsplit(":", 1)[1])
            if _port_in_use(port):
                raise GRPOMagicError(
                    f"Port {port} is already in use, so the vLLM server cannot start there; pass "
                    "--vllm-server-port with a free port, or --vllm-server-url if that is a vLLM server already."
                )
            print(f"grpo-magic: starting the vLLM server on GPUs {','.join(plan.server_gpus)} (log: "
                  f"{plan.server.log})", file=sys.stderr, flush=True)
            server = start_server(plan.server)
            wait_for_server(plan.server_url, server, plan.server_timeout, plan.server.log)
            print(f"grpo-magic: the vLLM server answers at {plan.server_url}", file=sys.stderr, flush=True)
        where = f"GPUs {','.join(plan.train_gpus)}" if plan.train_gpus else "CPU"
        processes = plural(plan.processes_here, "training process", "training processes")
        print(f"grpo-magic: {plan.where()}starting {processes} on {where} "
              f"({plan.launcher})", file=sys.stderr, flush=True)
        trainer = subprocess.Popen(plan.train.argv, env={**os.environ, **plan.train.env},
                                   preexec_fn=_terminate_with_parent if sys.platform == "linux" else None)
        while True:
            try:
                return trainer.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the training processes too: let them save and end
                continue
    except _Terminated:
        # SIGTERM to the launcher is SIGTERM to every training process (torchrun and accelerate forward
        # it): each finishes its step, saves a checkpoint and ends. The launcher kills after 30 s.
        if trainer is not None and trainer.poll() is None:
            trainer.terminate()
            try:
                trainer.wait(timeout=120)
            except subprocess.TimeoutExpired:
                trainer.kill()
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            stop_process(server)
