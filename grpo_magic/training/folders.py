"""Where a run writes when no ``project_name`` is given: a new folder per run (docs/architecture.md).

Two notebooks in one directory, or one notebook whose training cell runs twice, must not write
into one folder: with no ``project_name`` (the Python API, ``%grpo_train``, the form) each run gets
a folder of its own, ``grpo-runs/<env>-<date>-<time>``, created here so that two runs starting in
the same second still get two (``-2``, ``-3``...). ``resume`` with no ``project_name`` continues the
newest of this env's folders that has a complete checkpoint. An explicit ``project_name`` is the
folder, exactly, and ``grpo-magic train`` keeps the seed's ``grpo-run`` (``params.CLI_PROJECT_NAME``),
so that a script run again, or ``--resume``, finds its folder.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import RUN_LOG_NAME

from .resume import checkpoint_step, last_checkpoint

#: The parent of the folders runs get when no project_name is given.
RUNS_DIR = "grpo-runs"
#: Set by torchrun (and accelerate launch, which runs it): the same in every process of one launch.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"


def _label(env_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_name).strip("._") or "run"


def new_run_folder(env_name: str, *, processes: int = 1, create: bool = True) -> Path:
    """A folder no run has used, ``grpo-runs/<env>-<YYYYmmdd-HHMMSS>``, created.

    With several processes it is ``grpo-runs/<env>-<launch id>``, created only where ``create`` (the main process).
    """
    base = Path(RUNS_DIR)
    if processes > 1:  # every process must name the same folder: the launch's id, not each one's clock
        run_id = os.environ.get(RUN_ID_ENV, "")
        if not run_id or run_id == "none":
            raise GRPOMagicError(
                "Several processes train together but no project_name was given, and they cannot "
                "agree on a new folder; pass project_name (--project-name) with the output folder."
            )
        folder = base / f"{_label(env_name)}-{_label(run_id)}"
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        return folder
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        folder = base / f"{_label(env_name)}-{stamp}{'' if n == 1 else f'-{n}'}"
        try:
            folder.mkdir()  # atomic: two runs in the same second get two folders
        except FileExistsError:
            continue
        return folder
    raise GRPOMagicError(f"{base} has no free folder name for {env_name} at {stamp}; pass project_name.")


def newest_resumable(env_name: str) -> Path | None:
    """The newest ``grpo-runs/<env>-*`` folder with a complete checkpoint (the run ``resume`` continues)."""
    base = Path(RUNS_DIR)
    if not base.is_dir():
        return None
    found: list[tuple[float, Path]] = []
    for folder in base.glob(f"{_label(env_name)}-*"):
        checkpoint = last_checkpoint(folder) if folder.is_dir() else None
        if checkpoint is not None:
            found.append((Path(checkpoint).stat().st_mtime, folder))
    return max(found)[1] if found else None


def resume_folder(env_name: str) -> Path:
    """The folder a resumed run with no project_name continues, or one sentence saying there is none."""
    folder = newest_resumable(env_name)
    if folder is None:
        raise GRPOMagicError(
            f"Cannot resume: no folder of {env_name} under {RUNS_DIR}/ has a complete checkpoint; pass the "
            "--project-name of the run to continue, or train without --resume to start afresh."
        )
    return folder


def describe_resume(folder: Path) -> str:
    checkpoint = last_checkpoint(folder)
    step = checkpoint_step(checkpoint) if checkpoint else 0
    return (
        f"resuming {folder} from step {step}, the newest run of this env under {RUNS_DIR}/ with a checkpoint "
        "(pass --project-name to continue another)"
    )


def set_aside_old_log(output_dir: Path) -> None:
    """A new run in a used folder keeps the old run log under another name: nothing is lost."""
    log = output_dir / RUN_LOG_NAME
    if log.exists():
        log.rename(output_dir / f"events-{time.strftime('%Y%m%d-%H%M%S', time.localtime(log.stat().st_mtime))}.jsonl")
