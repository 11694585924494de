"""Resuming a run: the checkpoint to continue from, and whether this run can continue it.

Trainer saves complete checkpoints (weights, optimizer, scheduler, RNG states, trainer state)
every ``--save-steps`` steps, at the end, and when a run is stopped (docs/architecture.md,
"Stop, signals and resume"). A resumed run continues the same run, so the parameters that make
a checkpoint what it is (those with ``checkpoint`` in their ``GRPOParams`` metadata: the model,
LoRA, the group size, the batch, the learning rate, the seed) must be the checkpoint's, and so
must the number of processes; anything else (``max_steps``, logging, the env's settings...) may
change. Everything here is checked before a model loads, and read as data only: the checkpoint's
parameters come from the last ``run_started`` line of the run log, its process count from its RNG
files (Trainer writes ``rng_state.pth`` for one process, ``rng_state_<rank>.pth`` for each of several).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.errors import GRPOMagicError
from grpo_magic.events import RUN_LOG_NAME, EpisodeError, RunStarted, StepLogged, read_run_log


def complete_checkpoint(path: Path) -> bool:
    """Trainer writes trainer_state.json last: without a readable one, the save was cut short (a kill)."""
    try:
        return isinstance(json.loads((path / "trainer_state.json").read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def checkpoint_step(path: str | os.PathLike[str]) -> int:
    return int(Path(path).name.split("-")[-1])


def last_checkpoint(output_dir: Path) -> str | None:
    """The newest complete checkpoint; one a killed process left half-written is passed over."""
    checkpoints = sorted(
        (p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit() and complete_checkpoint(p)),
        key=checkpoint_step,
    )
    return str(checkpoints[-1]) if checkpoints else None


#: Written into a checkpoint that the main process saved after losing the others (their RNG files are missing).
PROCESSES_NAME = "grpo_magic_processes.json"


def mark_processes(path: Path, processes: int) -> None:
    """Say in the checkpoint how many processes trained it, where its RNG files cannot (``checkpoint_processes``)."""
    present = sorted(int(p.stem.rsplit("_", 1)[1]) for p in path.glob("rng_state_*.pth") if p.stem.rsplit("_", 1)[1].isdigit())
    missing = [r for r in range(processes) if r not in present]
    (path / PROCESSES_NAME).write_text(json.dumps({"processes": processes, "rng_states_missing": missing}) + "\n",
                                       encoding="utf-8")


def checkpoint_processes(path: Path) -> int | None:
    """How many processes trained the checkpoint, from its RNG files (None when it has none)."""
    try:
        marked = json.loads((path / PROCESSES_NAME).read_text(encoding="utf-8")).get("processes")
        if isinstance(marked, int) and marked >= 1:
            return marked
    except (OSError, ValueError, AttributeError):
        pass
    ranks = list(path.glob("rng_state_*.pth"))
    if ranks:
        return len(ranks)
    return 1 if (path / "rng_state.pth").exists() else None


def logged_params(output_dir: Path) -> dict[str, Any] | None:
    """The parameters of the last run that wrote this folder's run log (its last ``run_started`` line)."""
    found: dict[str, Any] | None = None
    try:
        with open(output_dir / RUN_LOG_NAME, "rb") as f:
            for line in f:
                if b'"run_started"' not in line:
                    continue
                try:
                    data = json.loads(line)
                except ValueError:  # a line cut short: the one before stands
                    continue
                if isinstance(data, dict) and data.get("type") == "run_started" and isinstance(data.get("params"), dict):
                    found = data["params"]
    except OSError:
        return None
    return found


def _same_model(old: Any, new: Any) -> bool:
    if old == new:
        return True
    from grpo_magic.models import resolve_model

    try:  # a local path and the name it was given by ("tiny" and its cache folder) are the same model
        return resolve_model(str(old)) == resolve_model(str(new))
    except Exception:  # noqa: BLE001 - a model that no longer resolves is not this run's
        return False


def differences(checkpoint_params: dict[str, Any], params: GRPOParams) -> list[tuple[str, Any, Any]]:
    """(field, the checkpoint's value, this run's) for each parameter that a checkpoint fixes and that differs."""
    found = []
    for f in GRPOParams.fields():
        if not f.metadata.get("checkpoint") or f.name not in checkpoint_params:
            continue
        old, new = checkpoint_params[f.name], getattr(params, f.name)
        same = _same_model(old, new) if f.name == "model" else old == new
        if not same:
            found.append((f.name, old, new))
    return found


def _flag(name: str, value: Any) -> str:
    """``--lr 1e-05``; a boolean as its flag (``--peft``, ``--no-peft``)."""
    flag = GRPOParams.flag(name)
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {value}"


def checkpoint_to_resume(output_dir: Path, params: GRPOParams, processes: int) -> str:
    """The checkpoint a resumed run continues from, after checking that this run can continue it.

    No checkpoint, a parameter that differs from the checkpoint's where it matters, a ``max_steps`` the
    checkpoint has already reached, or another number of processes: one clear sentence (``GRPOMagicError``)
    naming the difference and the fix.
    """
    checkpoint = last_checkpoint(output_dir)
    if checkpoint is None:
        where = "does not exist" if not output_dir.exists() else "has no complete checkpoint-* folder"
        raise GRPOMagicError(
            f"Cannot resume: {output_dir} {where}; checkpoints are saved every --save-steps steps and when a run "
            "is stopped, so train without --resume to start afresh, or pass the --project-name of the run to continue."
        )
    name = Path(checkpoint).name
    afresh = "or train without --resume (or with another --project-name) to start afresh."
    old = logged_params(output_dir)
    diffs = differences(old, params) if old else []
    if diffs:
        trained = " and ".join(_flag(n, o) for n, o, _ in diffs)
        this = " and ".join(_flag(n, v) if isinstance(v, bool) else str(v) for n, _, v in diffs)
        fix = " ".join(_flag(n, o) for n, o, _ in diffs)
        raise GRPOMagicError(
            f"Cannot resume from {name} in {output_dir}: it was trained with {trained}, and this run has {this}; "
            f"resume with {fix} (other parameters, such as --max-steps, may change), {afresh}"
        )
    trained_by = checkpoint_processes(Path(checkpoint))
    if trained_by is not None and trained_by != processes:
        raise GRPOMagicError(
            f"Cannot resume from {name} in {output_dir}: it was trained by {trained_by} process"
            f"{'es' if trained_by > 1 else ''} and this run has {processes} (a step's batch spans every process); "
            f"resume with --num-processes {trained_by}, {afresh}"
        )
    step = checkpoint_step(checkpoint)
    if params.max_steps is not None and params.max_steps <= step:
        # Trainer would load the checkpoint, find nothing left to do and report "completed": a silent no-op.
        raise GRPOMagicError(
            f"Cannot resume from {name} in {output_dir}: --max-steps {params.max_steps} is at or below its step "
            f"{step}, so nothing would be trained; pass a --max-steps above {step} (e.g. --max-steps {2 * step})."
        )
    return checkpoint


def run_before(output_dir: Path, step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The metrics and the episode errors of steps 1..``step`` from the run log, so that a resumed run's are whole.

    A resumed run redoes the steps after its checkpoint: for each step, the latest attempt's record wins.
    """
    if not (output_dir / RUN_LOG_NAME).exists():
        return [], []
    history: dict[int, dict[str, Any]] = {}
    errors: dict[int, list[dict[str, Any]]] = {}
    attempt, errors_attempt = 0, {}
    for event in read_run_log(output_dir):
        if isinstance(event, RunStarted):
            attempt += 1
        elif isinstance(event, StepLogged) and event.step <= step:
            history[event.step] = {"step": event.step, **event.metrics}
        elif isinstance(event, EpisodeError) and event.step <= step:
            if errors_attempt.get(event.step) != attempt:  # a later attempt at this step: its errors replace these
                errors[event.step], errors_attempt[event.step] = [], attempt
            errors[event.step].append({"step": event.step, "index": event.index, "kind": event.kind,
                                       "message": event.message, "traceback": event.traceback})
    return [history[s] for s in sorted(history)], [e for s in sorted(errors) for e in errors[s]]
