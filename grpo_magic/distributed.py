"""Where this process stands in a multi-process run (torchrun, accelerate launch).

Both the runner and the launcher ask these questions; they live here so that neither has to
import the other (docs/architecture.md, "Rooms").
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

#: Set in the processes the launcher starts, so that they train instead of launching again.
LAUNCHED_ENV = "GRPO_MAGIC_LAUNCHED"


def world_size() -> int:
    """Processes training together (torchrun and accelerate launch set WORLD_SIZE)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def is_main_process() -> bool:
    """Only rank 0 writes the run log and shows progress under torchrun / accelerate launch."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def inside_launch() -> bool:
    """True in a process started by a launcher (ours, accelerate launch or torchrun)."""
    return bool(os.environ.get(LAUNCHED_ENV)) or "LOCAL_RANK" in os.environ or world_size() > 1


def distributed_overrides() -> dict[str, Any]:
    """GRPOConfig settings a multi-process run needs here: CPU processes must say so.

    Without ``use_cpu`` accelerate sees no GPU and no CPU request, and every torchrun process
    trains alone on its own copy (the same prompts, no gradient exchange).
    """
    if world_size() <= 1:
        return {}
    import torch

    return {} if torch.cuda.is_available() else {"use_cpu": True}


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
