"""How processes and machines are asked for: ``LaunchOptions`` (accelerate launch's names and meaning) and their checks.

Every option is checked before any process starts, one sentence each (docs/architecture.md,
"Several machines"); ``launch`` turns valid options into the commands of each machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_magic.errors import GRPOMagicError

DEFAULT_SERVER_PORT = 8000
DEFAULT_SERVER_TIMEOUT_S = 900.0
SERVER_HOST = "127.0.0.1"
#: torchrun's and accelerate's default rendezvous port.
DEFAULT_MAIN_PROCESS_PORT = 29500
RDZV_BACKENDS = ("static", "c10d")


@dataclass
class LaunchOptions:
    """The launcher's own flags: how to start processes, not what to train (so not GRPOParams)."""

    num_processes: int | None = None
    accelerate_config: str | None = None
    dry_run: bool = False
    vllm_server_port: int = DEFAULT_SERVER_PORT
    vllm_server_timeout: float = DEFAULT_SERVER_TIMEOUT_S
    resume: bool = False
    quiet: bool = False
    # Several machines, with accelerate's names and meaning (num_processes counts every machine's).
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_endpoint: str | None = None

    @classmethod
    def from_namespace(cls, args: Any) -> LaunchOptions:
        return cls(**{k: getattr(args, k) for k in cls.__dataclass_fields__ if hasattr(args, k)})

    def check(self) -> None:
        if self.num_processes is not None and self.num_processes < 1:
            raise GRPOMagicError(f"--num-processes must be at least 1, got {self.num_processes}.")
        if self.accelerate_config is not None and not Path(self.accelerate_config).expanduser().is_file():
            raise GRPOMagicError(
                f"--accelerate-config {self.accelerate_config} is not a file; write one with `accelerate config` "
                "(DeepSpeed or FSDP settings) and pass its path."
            )
        if not 0 < self.vllm_server_port < 65536:
            raise GRPOMagicError(f"--vllm-server-port must be a port number, got {self.vllm_server_port}.")
        if self.vllm_server_timeout <= 0:
            raise GRPOMagicError(f"--vllm-server-timeout must be positive seconds, got {self.vllm_server_timeout}.")
        self._check_machines()

    def _check_machines(self) -> None:
        """The rendezvous flags, one sentence each, before anything starts."""
        m, r = self.num_machines, self.machine_rank
        if m < 1:
            raise GRPOMagicError(f"--num-machines must be at least 1, got {m}.")
        if not 0 <= r < m:
            top = f"0 to {m - 1}" if m > 1 else "0 (or raise --num-machines)"
            raise GRPOMagicError(
                f"--machine-rank {r} is out of range for --num-machines {m}; use {top}, a different one on each "
                "machine (0 on the machine at --main-process-ip)."
            )
        if self.main_process_port is not None and not 0 < self.main_process_port < 65536:
            raise GRPOMagicError(
                f"--main-process-port must be a port number from 1 to 65535, got {self.main_process_port}; "
                f"use a free port on machine 0, e.g. {DEFAULT_MAIN_PROCESS_PORT}."
            )
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise GRPOMagicError(
                f"--rdzv-backend must be static or c10d, not {self.rdzv_backend!r}; use static (fixed machine ranks) "
                "or c10d (torchrun's elastic rendezvous)."
            )
        if self.main_process_ip is not None and not self.main_process_ip.strip():
            raise GRPOMagicError("--main-process-ip is empty; pass the host name or address of machine 0.")
        if self.rdzv_endpoint is not None:
            host, port = parse_endpoint(self.rdzv_endpoint)
            given = [(flag, old, new) for flag, old, new in (("--main-process-ip", self.main_process_ip, host),
                                                             ("--main-process-port", self.main_process_port, port))
                     if old is not None and old != new]
            if given:
                flag, old, new = given[0]
                raise GRPOMagicError(
                    f"--rdzv-endpoint {self.rdzv_endpoint} says {new} but {flag} says {old}; give one of them "
                    "(--rdzv-endpoint HOST:PORT, or --main-process-ip HOST --main-process-port PORT)."
                )
        if m > 1 and self.main_process_ip is None and self.rdzv_endpoint is None:
            raise GRPOMagicError(
                f"--num-machines {m} needs the address of machine 0, reachable from every machine: pass "
                "--main-process-ip HOST (and --main-process-port PORT), or --rdzv-endpoint HOST:PORT."
            )
        if self.num_processes is not None and self.num_processes % m:
            near = sorted({max(m, self.num_processes // m * m), (self.num_processes // m + 1) * m})
            raise GRPOMagicError(
                f"--num-processes {self.num_processes} does not split evenly over --num-machines {m} (it counts the "
                f"processes of every machine, as accelerate's does); use --num-processes {' or '.join(map(str, near))}."
            )

    @property
    def multi_machine(self) -> bool:
        """Any rendezvous flag given: the launcher passes them on, even for one machine."""
        return (self.num_machines > 1 or self.main_process_ip is not None or self.main_process_port is not None
                or self.rdzv_endpoint is not None or self.rdzv_backend != "static")

    def rendezvous(self) -> tuple[str, int]:
        """(host, port) of machine 0's rendezvous: from --rdzv-endpoint, else --main-process-ip/--main-process-port."""
        if self.rdzv_endpoint is not None:
            return parse_endpoint(self.rdzv_endpoint)
        return self.main_process_ip or SERVER_HOST, self.main_process_port or DEFAULT_MAIN_PROCESS_PORT


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as torchrun's ``--rdzv-endpoint`` takes it, or one sentence."""
    host, sep, port = endpoint.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GRPOMagicError(
            f"--rdzv-endpoint must be HOST:PORT with a port from 1 to 65535, got {endpoint!r}; use e.g. "
            f"node001:{DEFAULT_MAIN_PROCESS_PORT} (machine 0's address)."
        )
    return host, int(port)
