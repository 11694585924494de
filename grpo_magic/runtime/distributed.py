"""Where this process stands in a multi-process run (torchrun, accelerate launch).

Both the runner and the launcher ask these questions; they live here so that neither has to
import the other (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

#: Set in the processes the launcher starts, so that they train instead of launching again.
LAUNCHED_ENV = "GRPO_MAGIC_LAUNCHED"

#: What TRL's colocated vLLM writes into ``os.environ`` for vLLM (trl/generation/vllm_generation.py,
#: ``ensure_master_addr_port``) and leaves there: the next run in the process would read them as a
#: distributed launch (``world_size``, ``inside_launch``). A run puts them back as they were.
TRL_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def world_size() -> int:
    """Processes training together (torchrun and accelerate launch set WORLD_SIZE)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def is_main_process() -> bool:
    """Only rank 0 writes the run log and shows progress under torchrun / accelerate launch."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def inside_launch() -> bool:
    """True in a process started by a launcher (ours, accelerate launch or torchrun)."""
    return bool(os.environ.get(LAUNCHED_ENV)) or "LOCAL_RANK" in os.environ or world_size() > 1


def environment_snapshot(names: tuple[str, ...] = TRL_ENV_VARS) -> dict[str, str | None]:
    """The values of ``names`` in ``os.environ`` now (None: unset), for ``restore_environment``."""
    return {name: os.environ.get(name) for name in names}


def restore_environment(snapshot: dict[str, str | None]) -> None:
    """Put the variables of a snapshot back as they were: set ones to their value, unset ones removed."""
    for name, value in snapshot.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def distributed_initialized() -> bool:
    """True when this process has a torch.distributed process group (without importing torch)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def distributed_overrides() -> dict[str, Any]:
    """GRPOConfig settings a multi-process run needs here: CPU processes must say so.

    Without ``use_cpu`` accelerate sees no GPU and no CPU request, and every torchrun process
    trains alone on its own copy (the same prompts, no gradient exchange).
    """
    if world_size() <= 1:
        return {}
    import torch

    return {} if torch.cuda.is_available() else {"use_cpu": True}


def start_process_group(timeout_s: float) -> None:
    """On CPU, start the gloo process group with the run's ``ddp_timeout``, before TRL's config is built.

    transformers passes ``ddp_timeout`` to accelerate only off CPU (``use_cpu`` leaves it out), so
    a CPU run would wait 30 minutes for a frozen machine; accelerate keeps a group that exists.
    """
    if world_size() <= 1:
        return
    import datetime

    import torch

    dist = torch.distributed
    if torch.cuda.is_available() or not dist.is_available() or dist.is_initialized():
        return
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))


def end_distributed(barrier: bool = False) -> None:
    """Tear down the process group at exit; a live gloo group aborts the interpreter on its way out.

    ``barrier``: first wait until every process got here (a run that ended well everywhere). A
    stopped run exits non-zero (130, 143), and torchrun tears down the other processes as soon as
    one exits so: none may leave before the main one has written the end of the run log.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        if barrier:
            with contextlib.suppress(Exception):
                dist.barrier()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


#: How gloo and NCCL word a collective call whose peers are gone or silent (torch raises most as RuntimeError).
_LOST_PEER_WORDS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "timed out waiting",
    "watchdog caught collective operation timeout", "nccl communicator was aborted", "remote worker crashing",
)


def lost_other_processes(exc: BaseException) -> bool:
    """True for the error of a collective call whose other processes are gone (a machine ended, the network failed).

    Connections that close (a killed process) fail the next collective call at once; a peer that
    stops answering (a frozen machine) fails it after the process group's timeout (``ddp_timeout``).
    """
    if world_size() <= 1:
        return False
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    kinds = tuple(k for k in (getattr(dist, "DistBackendError", None), getattr(dist, "DistNetworkError", None)) if k)
    if kinds and isinstance(exc, kinds):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(words in text for words in _LOST_PEER_WORDS)


def lost_processes_reason(exc: BaseException, step: int) -> str:
    """The one sentence of a run that lost its other processes (the first line of torch's error kept)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"lost contact with the other training processes during step {step} (a machine or one of its "
            f"processes ended, or the network between them failed): {type(exc).__name__}: {first}")
