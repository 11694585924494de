"""What a finished run lets go of, so that the next run in the same kernel starts with its memory back (and what
it says when the GPU ran out of it).

``run`` calls these at the end of every run (completed, stopped or failed; docs/architecture.md, "GPU path").
"""

from __future__ import annotations

import sys


def forget_frames(exc: BaseException | None) -> None:
    """Clear the locals of a kept failure's frames (the trainer, the policy), keeping its traceback text.

    ``run.exception`` lives as long as the run (``last_run()``), and each frame of its traceback holds
    that frame's locals: the policy and TRL's trainer would stay in GPU memory.
    """
    import traceback

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def free_gpu_memory() -> None:
    """On a GPU: collect what the run let go of and hand CUDA's cached blocks back (memory back for the next run).

    On a CPU there is nothing cached to hand back, and the policy goes by reference counting as soon as the run
    lets go of it (``trl_compat.drop_forward_patches`` breaks the one cycle that held it; a test checks it is
    gone), so the cycle collector's pass over every object of torch, transformers and TRL (about 0.2 s) is
    skipped."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def oom_hint(exc: BaseException) -> str:
    """A failure's reason; a GPU out of memory also names the settings that would make the run fit."""
    text = f"{type(exc).__name__}: {exc}"
    if "out of memory" in text.lower() or type(exc).__name__ == "OutOfMemoryError":
        return (
            f"{text}. The GPU ran out of memory; lower --rl-max-new-tokens, --rl-num-generations or --batch-size "
            "(with vLLM: --vllm-max-model-length, the context vLLM reserves KV cache for, or "
            "--vllm-gpu-memory-utilization), or use --peft."
        )
    return text
