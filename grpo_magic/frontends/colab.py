"""What a Colab (or any GPU notebook) install may add without breaking the runtime's GPU stack.

Colab ships its own torch, built for the CUDA of its NVIDIA driver. The ``vllm`` extra pins vLLM 0.31.0, which pins
``torch==2.13.0`` (a CUDA 13 build on PyPI) and CUDA 13 kernels: on a driver older than CUDA 13's (580) that torch
sees no GPU after the restart, and the run would train on the CPU. So the notebook installs ``[notebook]`` into the
runtime as it is (the installed torch and ``nvidia-*`` libraries held by constraints), and adds ``vllm`` only where
``nvidia-smi`` says the driver and the GPU can run it. The notebook loads this file by path, before the package is
installed: it uses the standard library only (``%load_ext grpo_magic`` stays light).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from importlib import metadata

#: vLLM 0.31's wheels are CUDA 13 builds: CUDA 13.0 needs an NVIDIA driver of release 580 or newer.
VLLM_MIN_DRIVER = 580
#: CUDA 13 dropped GPUs below compute capability 7.5 (Maxwell, Pascal, Volta); vLLM's own floor is 7.0.
VLLM_MIN_COMPUTE = (7, 5)
#: The query the notebook runs (one line per GPU: ``580.82.07, 8.0``).
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=driver_version,compute_cap", "--format=csv,noheader"]
#: The generation flags notebook 03 adds when vLLM is installed (colocate: one GPU shared with training).
VLLM_FLAGS = "--use-vllm --vllm-mode colocate --vllm-gpu-memory-utilization 0.3"


@dataclass(frozen=True)
class Gpu:
    """One line of ``nvidia-smi``'s query: the driver's version and the GPU's compute capability."""

    driver: str
    compute_cap: tuple[int, int]

    @property
    def driver_major(self) -> int:
        return int(self.driver.split(".")[0])


@dataclass(frozen=True)
class InstallPlan:
    """What to install and how to train: ``extras`` for pip, ``use_vllm``, and one line that says why."""

    extras: tuple[str, ...]
    use_vllm: bool
    reason: str

    def requirement(self, root: str) -> str:
        """The pip requirement for the checkout at ``root`` (``/content/grpo-magic[notebook,vllm]``)."""
        return f"{root}[{','.join(self.extras)}]"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """The GPUs of ``nvidia-smi --query-gpu=driver_version,compute_cap --format=csv,noheader`` output."""
    gpus = []
    for line in text.splitlines():
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)*)\s*,\s*(\d+)\.(\d+)\s*", line)
        if match:
            gpus.append(Gpu(match.group(1), (int(match.group(2)), int(match.group(3)))))
    return gpus


def read_nvidia_smi() -> str | None:
    """``nvidia-smi``'s answer to the query, or None where there is no NVIDIA driver (a CPU runtime)."""
    try:
        done = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def plan_install(nvidia_smi: str | None) -> InstallPlan:
    """``[notebook]`` always; ``vllm`` too where every GPU's driver and compute capability can run vLLM 0.31."""
    gpus = parse_nvidia_smi(nvidia_smi or "")
    notebook = ("notebook",)
    if not gpus:
        return InstallPlan(notebook, False, "vLLM skipped: no NVIDIA GPU found (nvidia-smi); "
                                            "training uses TRL's own generation.")
    old_driver = min(gpus, key=lambda g: g.driver_major)
    if old_driver.driver_major < VLLM_MIN_DRIVER:
        return InstallPlan(notebook, False, (
            f"vLLM skipped: NVIDIA driver {old_driver.driver} is older than {VLLM_MIN_DRIVER}, the first for CUDA 13, "
            "which vLLM 0.31 is built for; training uses TRL's own generation (slower, same results)."))
    old_gpu = min(gpus, key=lambda g: g.compute_cap)
    if old_gpu.compute_cap < VLLM_MIN_COMPUTE:
        cap, need = ".".join(map(str, old_gpu.compute_cap)), ".".join(map(str, VLLM_MIN_COMPUTE))
        return InstallPlan(notebook, False, (
            f"vLLM skipped: the GPU's compute capability {cap} is below {need}, the oldest CUDA 13 builds run on; "
            "training uses TRL's own generation."))
    return InstallPlan(("notebook", "vllm"), True, (
        f"vLLM 0.31 installed: NVIDIA driver {old_driver.driver} (CUDA 13), compute capability "
        f"{'.'.join(map(str, old_gpu.compute_cap))}; it brings its own torch 2.13 (restart the session when asked)."))


def kept_stack() -> list[str]:
    """Constraints that hold the installed torch and ``nvidia-*`` CUDA libraries where they are (``torch==2.9.0+cu126``):
    pip then fails loudly instead of replacing the runtime's GPU stack."""
    pins = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "torch" or name.startswith("nvidia-"):
            pins.add(f"{name}=={dist.version}")
    return sorted(pins)
