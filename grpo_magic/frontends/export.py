"""Notebook to cluster: ``%grpo_export ENV --to DIR`` writes a folder that trains anywhere.

The folder holds the env as a module, ``launch.sh`` with the ``grpo-magic train`` command of the
last run that started (or of the form's values, ``--from-form``; ``params_to_export``), and an accelerate
config template. ``launch.sh`` runs from any working
directory (it changes to its own folder, so the module imports) and passes its arguments through
after the exported flags, so ``./launch.sh --max-steps 1`` or ``./launch.sh --dry-run`` work.

With ``--cluster slurm`` the folder also gets ``slurm.sbatch``: ``srun`` starts ``launch.sh`` once
per node with ``--num-machines/--machine-rank/--main-process-ip/--main-process-port`` taken from
SLURM's variables, so each node's grpo-magic starts accelerate launch (torchrun on CPU nodes) as
on one machine; and ``accelerate_config_slurm.yaml``, the accelerate config for those machines.
"""

from __future__ import annotations

import shlex
import stat
from pathlib import Path
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.redaction import redact
from grpo_magic.training.folders import RUNS_DIR

LAUNCH_NAME = "launch.sh"
ACCELERATE_CONFIG_NAME = "accelerate_config.yaml"
SBATCH_NAME = "slurm.sbatch"
SLURM_ACCELERATE_CONFIG_NAME = "accelerate_config_slurm.yaml"
CLUSTERS = ("none", "slurm")


def module_source(env_name: str, code: str) -> str:
    """The env cell as a module (the cell's usual import added)."""
    header = f'"""Environment {env_name}, exported from a notebook by %grpo_export."""\n\n'
    if "from datasets import Dataset" not in code:  # the usual import of env cells, once
        header += "from datasets import Dataset  # noqa: F401\n\n"
    return redact(header + code.strip() + "\n")  # a token typed into the cell must not travel with it


def _flag_lines(params: GRPOParams) -> list[str]:
    """The exported flags, one flag (with its value) per line, shell-quoted."""
    args = params.to_cli_args()
    lines: list[str] = []
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):  # a flag and its value
            lines.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:  # a boolean flag
            lines.append(args[i])
            i += 1
    return lines


def launch_script(params: GRPOParams, env_name: str) -> str:
    """``launch.sh``: grpo-magic's own launcher by default, plain ``accelerate launch`` with ``accelerate``."""
    flags = "\n".join(f"  {line}" for line in _flag_lines(params))
    return f"""#!/usr/bin/env bash
# Train {env_name} with GRPO (written by %grpo_export from a notebook).
#
#   ./launch.sh [more flags]
#       grpo-magic train on this machine: one process on a CPU or one GPU; one process per GPU
#       when there are several (it starts accelerate launch itself); with --use-vllm
#       --vllm-mode server and no --vllm-server-url it also starts the vLLM server on the last
#       --vllm-server-gpus GPUs and stops it at the end. Add --dry-run to see the plan first.
#   ./launch.sh --accelerate-config {ACCELERATE_CONFIG_NAME} [more flags]
#       the same, with the DeepSpeed / FSDP settings of that file.
#   ./launch.sh accelerate [more flags]
#       plain `accelerate launch --config_file {ACCELERATE_CONFIG_NAME}` (set num_processes there;
#       vLLM server mode then needs --vllm-server-url of a server you started yourself).
#
# Flags given here come after the exported ones and win (e.g. ./launch.sh --max-steps 10).
set -euo pipefail
cd "$(dirname "$0")"
FLAGS=(
{flags}
)
if [ "${{1:-}}" = "accelerate" ]; then
  shift
  exec accelerate launch --config_file {ACCELERATE_CONFIG_NAME} -m grpo_magic train "${{FLAGS[@]}}" "$@"
fi
exec grpo-magic train "${{FLAGS[@]}}" "$@"
"""


ACCELERATE_CONFIG = f"""# accelerate config for this run (written by %grpo_export).
# Used by `./launch.sh accelerate` and by `./launch.sh --accelerate-config {ACCELERATE_CONFIG_NAME}`
# (grpo-magic then sets num_processes itself). Regenerate with `accelerate config` if you like.
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU        # DEEPSPEED or FSDP: set it here and uncomment a block below
num_machines: 1
machine_rank: 0
num_processes: 8                   # GPUs that train; in vLLM server mode, GPUs minus vllm_server_gpus
gpu_ids: all
mixed_precision: bf16
main_training_function: main
rdzv_backend: static
same_network: true
use_cpu: false
# --- DeepSpeed ZeRO-2 (distributed_type: DEEPSPEED) ---
# deepspeed_config:
#   zero_stage: 2
#   offload_optimizer_device: none
#   offload_param_device: none
#   zero3_init_flag: false
# --- FSDP (distributed_type: FSDP) ---
# fsdp_config:
#   fsdp_version: 2
#   fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
#   fsdp_state_dict_type: FULL_STATE_DICT
#   fsdp_cpu_ram_efficient_loading: true
#   fsdp_reshard_after_forward: true
"""


def sbatch_script(env_name: str, nodes: int, gpus_per_node: int, port: int = 29500) -> str:
    """``slurm.sbatch``: one ``launch.sh`` per node through ``srun``, the rendezvous from SLURM's variables.

    The machine rank is read on each node (``SLURM_NODEID``, inside the quoted ``bash -c``); machine
    0's address is the job's first host (``scontrol show hostnames``); ``--num-processes`` counts
    every node's GPUs (accelerate's meaning), from ``SLURM_GPUS_ON_NODE`` where SLURM sets it.
    """
    gpus = f"#SBATCH --gpus-per-node={gpus_per_node}\n" if gpus_per_node else ""
    per_node = f"${{SLURM_GPUS_ON_NODE:-{gpus_per_node}}}" if gpus_per_node else "1"
    where = f"{gpus_per_node} GPUs each" if gpus_per_node else "one CPU process each"
    return f"""#!/usr/bin/env bash
#SBATCH --job-name=grpo-{env_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --signal=TERM@120
#SBATCH --output=grpo-%j.out
# Train {env_name} with GRPO on {nodes} nodes, {where} (written by %grpo_export from a notebook).
#
#   cd THIS_FOLDER && sbatch {SBATCH_NAME} [more flags]
#       e.g. sbatch {SBATCH_NAME} --max-steps 200; sbatch --nodes 4 {SBATCH_NAME} (the count comes from SLURM).
#       Submit from this folder (SLURM runs a copy of this script): srun starts ./{LAUNCH_NAME} once per node
#       (one task per node), and each node's grpo-magic starts one training process per GPU
#       (accelerate launch; torchrun on CPU nodes). Global rank 0 writes the run log and the weights.
#   sbatch {SBATCH_NAME} --accelerate-config {SLURM_ACCELERATE_CONFIG_NAME} [more flags]
#       the same with that file's DeepSpeed / FSDP settings (the flags below set its machine fields).
#
# This folder must be on a filesystem every node sees (checkpoints, the run log, the env module).
# scancel, and the time limit (SIGTERM 120 s before it, --signal above), stop every node after the
# current step with a checkpoint; `sbatch {SBATCH_NAME} --resume` continues it. A lost node ends the
# others with a checkpoint of the last finished step (--ddp-timeout bounds the wait for a frozen one).
set -euo pipefail
HERE="${{SLURM_SUBMIT_DIR:-$PWD}}"
if [ ! -x "$HERE/{LAUNCH_NAME}" ]; then
  echo "{SBATCH_NAME}: $HERE/{LAUNCH_NAME} not found; submit from the exported folder (cd FOLDER && sbatch {SBATCH_NAME})." >&2
  exit 2
fi
# The whole list is read (no `| head`: under pipefail, a long host list would end scontrol by SIGPIPE).
HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MAIN_PROCESS_IP="${{HOSTS%%$'\\n'*}}"
MAIN_PROCESS_PORT="${{MAIN_PROCESS_PORT:-{port}}}"
NUM_PROCESSES=$(( SLURM_NNODES * {per_node} ))
echo "grpo-magic: $SLURM_NNODES nodes, $NUM_PROCESSES processes, rendezvous $MAIN_PROCESS_IP:$MAIN_PROCESS_PORT" >&2
# One launcher per node; its rank is read there. --kill-on-bad-exit: a node that fails ends the others.
srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \\
  bash -c 'exec "$0" --num-machines "$SLURM_NNODES" --machine-rank "$SLURM_NODEID" \\
    --main-process-ip "$1" --main-process-port "$2" --num-processes "$3" "${{@:4}}"' \\
  "$HERE/{LAUNCH_NAME}" "$MAIN_PROCESS_IP" "$MAIN_PROCESS_PORT" "$NUM_PROCESSES" "$@"
"""


def slurm_accelerate_config(nodes: int, gpus_per_node: int) -> str:
    """The accelerate config for ``nodes`` machines (grpo-magic passes the machine fields per node)."""
    config = ACCELERATE_CONFIG.replace(
        f"# Used by `./launch.sh accelerate` and by `./launch.sh --accelerate-config {ACCELERATE_CONFIG_NAME}`",
        f"# For {nodes} machines: `sbatch {SBATCH_NAME} --accelerate-config {SLURM_ACCELERATE_CONFIG_NAME}`")
    config = config.replace(
        "num_machines: 1\nmachine_rank: 0\n",
        f"num_machines: {nodes}                    # --num-machines, --machine-rank, --main-process-ip/-port: "
        f"set per node by {SBATCH_NAME}\nmachine_rank: 0\n",
    )
    config = config.replace("num_processes: 8                   # GPUs that train; in vLLM server mode, GPUs minus "
                            "vllm_server_gpus", f"num_processes: {nodes * max(1, gpus_per_node)}"
                            "                  # every node's GPUs together (accelerate's meaning)")
    if not gpus_per_node:
        config = config.replace("distributed_type: MULTI_GPU", "distributed_type: MULTI_CPU").replace(
            "use_cpu: false", "use_cpu: true").replace("mixed_precision: bf16", "mixed_precision: 'no'")
    return config


def folder_files(folder: Path, module_name: str, cluster: str = "none") -> list[Path]:
    """The files ``write_folder`` writes, in order (for the overwrite check)."""
    files = [folder / f"{module_name}.py", folder / LAUNCH_NAME, folder / ACCELERATE_CONFIG_NAME]
    if cluster == "slurm":
        files += [folder / SBATCH_NAME, folder / SLURM_ACCELERATE_CONFIG_NAME]
    return files


def write_folder(folder: Path, module_name: str, env_name: str, code: str, params: GRPOParams, *,
                 cluster: str = "none", nodes: int = 2, gpus_per_node: int = 8) -> list[Path]:
    """Write the env module, ``launch.sh`` (executable) and the accelerate config; returns their paths.

    ``cluster="slurm"`` adds ``slurm.sbatch`` (executable) and the accelerate config for ``nodes`` machines.
    """
    files = folder_files(folder, module_name, cluster)
    module, launch, config = files[:3]
    folder.mkdir(parents=True, exist_ok=True)
    module.write_text(module_source(env_name, code), encoding="utf-8")
    launch.write_text(redact(launch_script(params, env_name)), encoding="utf-8")
    launch.chmod(launch.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    config.write_text(ACCELERATE_CONFIG, encoding="utf-8")
    if cluster == "slurm":
        sbatch, slurm_config = files[3:]
        sbatch.write_text(sbatch_script(env_name, nodes, gpus_per_node), encoding="utf-8")
        sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        slurm_config.write_text(slurm_accelerate_config(nodes, gpus_per_node), encoding="utf-8")
    return files


def params_to_export(last: Any, form: Any, *, from_form: bool = False,
                     default_model: str | None = None) -> tuple[GRPOParams | None, str]:
    """The parameters ``%grpo_export`` writes and which they are, in words (its output says so); or None and the
    sentence that refuses ``from_form``.

    ``last``: the last run ``%grpo_train`` or its form started (its parameters), since that is what trained; a
    ``%grpo_train`` line that was refused never started, so it is never exported. ``from_form``: the
    shown form's values, which must be valid. With no run yet: the form's values when a valid form is shown,
    else the defaults.
    """
    def form_params() -> tuple[GRPOParams | None, str]:
        if form is None:
            return None, "no form is shown"
        try:
            params = form.params()
            problems = params.problems()
        except (TypeError, ValueError) as exc:  # GRPOMagicError is a ValueError
            return None, str(exc)
        return (None, problems[0][1]) if problems else (params, "")

    if from_form:
        params, problem = form_params()
        if params is None:
            return None, (f"--from-form exports the form's values, and {problem.rstrip('.')}; show a form with valid "
                          "values (%grpo_train --env NAME), or drop --from-form to export the last run's parameters.")
        return params, "the form (--from-form)"
    if last is not None:
        params = last.params
        if params.project_name and Path(params.project_name).parent.name == RUNS_DIR:
            params = params.replace(project_name=None)  # a folder of its own per run, as that run got
        return params, f"the last run that started, {last.output_dir} (--from-form: the form's)"
    params, _ = form_params()
    if params is not None:
        return params, "the form (no run has started in this session)"
    return GRPOParams(model=default_model or None), "the defaults (no run has started in this session)"
