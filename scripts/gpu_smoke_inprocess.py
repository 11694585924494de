"""Part 3 of scripts/gpu_smoke.sh: the GPU path in one Python process, as a notebook kernel lives it.

Trains the smoke env twice in a row with vLLM colocated and checks, on the real GPU, what the CPU tests
can only stand in for: the dtype ``choose_precision`` picks for this GPU is the one of the policy, of
GRPOConfig's bf16/fp16 and of TRL's vLLM engine; ``vllm_max_model_length`` caps vLLM's context below the
model's 32768; after each run the GPU memory is back (``torch.cuda.memory_allocated``), the trainer is
gone, and no process group nor TRL's RANK/WORLD_SIZE... is left, so the second run is not "distributed".

    python scripts/gpu_smoke_inprocess.py MODEL_FOLDER STEPS    # from the folder that holds smoke_env.py
"""

from __future__ import annotations

import os
import sys
import weakref

import torch
import torch.distributed as dist

import grpo_magic.training.trainer as trainer_module
from grpo_magic import GRPOParams, train
from grpo_magic.runtime.device import choose_precision, cuda_capability, vllm_dtype
from grpo_magic.runtime.distributed import TRL_ENV_VARS

MODEL_CONTEXT = 32768  # the smoke model's max_position_embeddings (Qwen2.5-0.5B's)
MEMORY_SLACK = 256 * 2**20  # what may stay allocated after a run (CUDA's own, cuBLAS workspaces)


def main(model: str, steps: int) -> int:
    sys.path.insert(0, os.getcwd())  # smoke_env.py
    problems: list[str] = []
    precision = choose_precision()
    print(
        f"  GPU capability {cuda_capability()}: choose_precision() -> {precision} (vLLM dtype {vllm_dtype(precision)})"
    )
    expected = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(precision, "torch.float32")
    seen: dict = {}
    build = trainer_module.build_trainer

    def observed_build(**kwargs):  # read what the run's trainer and TRL's engine hold; keep a weak reference only
        trainer = build(**kwargs)
        args = trainer.args
        engine = getattr(getattr(getattr(trainer, "vllm_generation", None), "llm", None), "llm_engine", None)
        config = getattr(getattr(engine, "vllm_config", None), "model_config", None) or getattr(
            engine, "model_config", None
        )
        seen.update(
            policy=str(next(trainer.model.parameters()).dtype),
            bf16=args.bf16,
            fp16=args.fp16,
            vllm_max_model_length=args.vllm_max_model_length,
            vllm_dtype=str(getattr(config, "dtype", "?")),
            vllm_max_model_len=getattr(config, "max_model_len", "?"),
            trainer=weakref.ref(trainer),
        )
        return trainer

    trainer_module.build_trainer = observed_build  # run.py imports it from the module at each run
    params = GRPOParams(
        model=model,
        rl_env_module="smoke_env",
        rl_env_class="SmokeHotelEnv",
        rl_env_config='{"max_turns": 3, "n_cases": 32, "max_new_tokens": 48}',
        rl_num_generations=4,
        batch_size=4,
        rl_max_new_tokens=64,
        max_steps=steps,
        lr=1e-6,
        rl_max_error_rate=1.0,
        save_steps=1000,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
    )
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    for n in (1, 2):  # the second run in the same process after the first
        seen.clear()
        torch.cuda.reset_peak_memory_stats()
        run = train(params.replace(project_name=f"inprocess-{n}"), display=False, raise_on_failure=False)
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated()
        if n == 1:  # the "will it fit" estimate against the real peak (a figure for the notes, not a check)
            try:
                from grpo_magic.config.memory import estimate

                est = estimate(params, model, card=None)
                terms = {k: v for k, v in est.terms.items() if k != "vLLM share"}
                print(f"  peak torch allocation {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (vLLM's engine "
                      f"included where it allocates through torch); the estimate less vLLM's share "
                      f"{sum(terms.values()) / 2**30:.2f} GiB: " + ", ".join(
                          f"{k} {v / 2**30:.2f}" for k, v in terms.items()))
            except Exception as exc:  # noqa: BLE001 - a figure, never the smoke test's verdict
                print(f"  no memory estimate: {type(exc).__name__}: {exc}")
        left = {k: os.environ[k] for k in TRL_ENV_VARS if k in os.environ}
        print(
            f"  run {n}: {run.status} {run.reason[:200]}; policy {seen.get('policy')}, GRPOConfig "
            f"bf16={seen.get('bf16')} fp16={seen.get('fp16')}, vLLM dtype {seen.get('vllm_dtype')}; "
            f"vllm_max_model_length {seen.get('vllm_max_model_length')} (engine max_model_len "
            f"{seen.get('vllm_max_model_len')}); memory_allocated {after / 2**20:.0f} MiB after the run "
            f"({baseline / 2**20:.0f} MiB before the first); process group {dist.is_initialized()}; "
            f"TRL's variables left: {left or 'none'}"
        )
        if run.status != "completed":
            problems.append(f"run {n} {run.status}: {run.reason[:300]}")
        if not seen:
            problems.append(f"run {n} built no trainer")
            continue
        if (seen["bf16"], seen["fp16"]) != (precision == "bf16", precision == "fp16"):
            problems.append(f"GRPOConfig's bf16={seen['bf16']} fp16={seen['fp16']} do not say {precision}")
        if precision == "bf16" and seen["policy"] != expected:
            problems.append(f"the policy is {seen['policy']}, not {expected}")
        if precision != "fp32" and seen["vllm_dtype"] != expected:
            problems.append(f"vLLM computes in {seen['vllm_dtype']} while the trainer uses {precision}")
        length = seen["vllm_max_model_length"]
        if not isinstance(length, int) or length >= MODEL_CONTEXT or seen["vllm_max_model_len"] != length:
            problems.append(
                f"vllm_max_model_length {length} (engine {seen['vllm_max_model_len']}) is not the run's "
                f"cap below the model's {MODEL_CONTEXT}"
            )
        if seen["trainer"]() is not None:
            problems.append(f"run {n}'s trainer is still alive after the run")
        if after > baseline + MEMORY_SLACK:
            problems.append(f"run {n} left {(after - baseline) / 2**20:.0f} MiB allocated on the GPU")
        if dist.is_initialized() or left:
            problems.append(f"run {n} left distributed state: process group {dist.is_initialized()}, variables {left}")
    print(
        "  "
        + (
            "PROBLEMS: " + "; ".join(problems)
            if problems
            else "dtype, vllm_max_model_length, memory and distributed state after two runs: OK"
        )
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
