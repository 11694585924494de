"""Notebook to cluster: ``%grpo_export ENV --to DIR`` writes a folder that trains anywhere.

The folder holds the env as a module, ``launch.sh`` with the ``grpo-magic train`` command of the
current form values, and an accelerate config template. ``launch.sh`` runs from any working
directory (it changes to its own folder, so the module imports) and passes its arguments through
after the exported flags, so ``./launch.sh --max-steps 1`` or ``./launch.sh --dry-run`` work.
"""

from __future__ import annotations

import shlex
import stat
from pathlib import Path

from .params import GRPOParams
from .redaction import redact

LAUNCH_NAME = "launch.sh"
ACCELERATE_CONFIG_NAME = "accelerate_config.yaml"


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


def folder_files(folder: Path, module_name: str) -> list[Path]:
    """The files ``write_folder`` writes, in order (for the overwrite check)."""
    return [folder / f"{module_name}.py", folder / LAUNCH_NAME, folder / ACCELERATE_CONFIG_NAME]


def write_folder(folder: Path, module_name: str, env_name: str, code: str, params: GRPOParams) -> list[Path]:
    """Write the env module, ``launch.sh`` (executable) and the accelerate config; returns their paths."""
    module, launch, config = folder_files(folder, module_name)
    folder.mkdir(parents=True, exist_ok=True)
    module.write_text(module_source(env_name, code), encoding="utf-8")
    launch.write_text(redact(launch_script(params, env_name)), encoding="utf-8")
    launch.chmod(launch.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    config.write_text(ACCELERATE_CONFIG, encoding="utf-8")
    return [module, launch, config]
