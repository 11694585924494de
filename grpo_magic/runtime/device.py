"""Where a run computes and in which precision: the one dtype decision, and the CUDA device of a thread.

``choose_precision`` is the only place that decides between bf16, fp16 and float32. The model load
(``models.load_model``), ``GRPOConfig``'s ``bf16``/``fp16`` (``GRPOParams.grpo_config_kwargs``) and the
vLLM server's ``--dtype`` (``launch``) all take its answer, so that trainer and sampler never disagree.
TRL's colocated engine takes no dtype: vLLM's ``auto`` makes the same choice (bf16 where the GPU has
it, else fp16), which ``scripts/gpu_smoke.sh`` checks on the device.

bf16 only where the hardware has it natively (compute capability 8.0 and up: A100, L4, H100...). A T4
(7.5) or a V100 (7.0) emulates bf16 (``torch.cuda.is_bf16_supported()`` counts that by default): slow
matmuls and the slow attention kernel, while vLLM serves fp16 there. Those GPUs get fp16, the CPU
float32 (TRL's bf16 raises there).

torch is imported inside the functions: ``import grpo_magic`` stays light.
"""

from __future__ import annotations

from typing import Any, Literal

from grpo_magic.errors import GRPOMagicError

Precision = Literal["bf16", "fp16", "fp32"]

#: The compute capability from which bf16 is native on NVIDIA GPUs (Ampere).
BF16_CAPABILITY = (8, 0)


def cuda_capability(device: int | None = None) -> tuple[int, int] | None:
    """The compute capability of a CUDA device (default: the current one), or None without CUDA.

    The one hardware query the precision decision makes (tests stand in for it).
    """
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def native_bf16(device: int | None = None) -> bool:
    """True on a GPU that computes in bf16 natively (not emulated)."""
    capability = cuda_capability(device)
    return capability is not None and capability >= BF16_CAPABILITY


def _flag(value: Any, name: str) -> bool | None:
    """An explicit bf16/fp16 setting as given (bool, or its text from a form or a command line); None: unset."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("", "none"):
        return None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise GRPOMagicError(f"{name} must be true or false (or empty to choose for the device), got {value!r}.")


_THIS_DEVICE: Any = object()


def choose_precision(explicit_bf16: Any = None, explicit_fp16: Any = None, *, device: int | None = None,
                     capability: Any = _THIS_DEVICE) -> Precision:
    """The run's precision: an explicit bf16/fp16 wins; otherwise bf16 where native, fp16 on other GPUs, fp32 on CPU.

    ``None`` means "choose for the device". An explicit False refuses that one: the automatic choice is
    kept unless it was the refused one, which gives float32. ``capability`` decides for a GPU that is not
    here (the memory estimate's cards): a (major, minor) compute capability, or None for a CPU.
    """
    bf16, fp16 = _flag(explicit_bf16, "bf16"), _flag(explicit_fp16, "fp16")
    if bf16 and fp16:
        raise GRPOMagicError(
            "bf16 and fp16 are both set to true; set only one of them (or neither, to choose for the device)."
        )
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    if capability is _THIS_DEVICE:
        capability = cuda_capability(device)
    auto: Precision = "fp32" if capability is None else "bf16" if capability >= BF16_CAPABILITY else "fp16"
    if (auto == "bf16" and bf16 is False) or (auto == "fp16" and fp16 is False):
        return "fp32"
    return auto


def grpo_precision_kwargs(precision: Precision) -> dict[str, bool]:
    """``GRPOConfig``'s ``bf16``/``fp16`` for a precision (both False: float32)."""
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def load_dtype(precision: Precision, *, peft: bool = False) -> Any:
    """The torch dtype to load the policy in.

    bf16 trains in bf16 weights (what TRL does on an A100). fp16 is mixed precision: the Trainer's
    gradient scaler cannot unscale fp16 gradients, so weights that train stay float32 under fp16
    autocast; with LoRA only the adapters train (PEFT keeps them float32), so the frozen base loads in fp16.
    """
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16" and peft:
        return torch.float16
    return torch.float32


def vllm_dtype(precision: Precision) -> str:
    """vLLM's ``--dtype`` for a precision (``auto`` on float32: vLLM then picks as ``choose_precision`` does)."""
    return {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "auto")


# ---------------------------------------------------------------- the CUDA device of a thread


def current_cuda_device() -> int | None:
    """This thread's current CUDA device, or None without CUDA.

    The current device is per thread in CUDA: accelerate sets it (``torch.cuda.set_device``) on the
    main thread of each process only, so threads we start must take it from the thread that starts them.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.current_device())


def process_cuda_device() -> int | None:
    """The CUDA device this process trains on, for loading the model straight onto it; None without CUDA.

    Under a launcher that is ``LOCAL_RANK``'s (accelerate's device for the process: it calls ``set_device``
    only when its state is built, after the model loads); otherwise this thread's current device.
    """
    import os

    import torch

    if not torch.cuda.is_available():
        return None
    local = os.environ.get("LOCAL_RANK", "")
    if local.isdigit():
        return int(local) % max(1, torch.cuda.device_count())
    return int(torch.cuda.current_device())


def use_cuda_device(device: int | None) -> None:
    """Make ``device`` this thread's current CUDA device (None: nothing to do)."""
    if device is None:
        return
    import torch

    torch.cuda.set_device(device)


def policy_device() -> str:
    """Where a run puts the policy in this process: its current CUDA device (accelerate's, under a launcher), else CPU."""
    device = current_cuda_device()
    return "cpu" if device is None else f"cuda:{device}"


def place_model(model: Any) -> Any:
    """Move a model loaded outside a run (``rescore(model="...")``) to where a run would have it."""
    device = policy_device()
    return model if device == "cpu" else model.to(device)
