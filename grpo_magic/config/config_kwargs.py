"""``GRPOParams`` as ``GRPOConfig``'s keyword arguments: the declared fields by their TRL names, the device's
precision, the eval loop, and every other TRL setting given (docs/architecture.md, "Parameters").

Kept apart from ``params`` so that the declarations stay one page; ``GRPOParams.grpo_config_kwargs`` calls it.
"""

from __future__ import annotations

from typing import Any


def grpo_config_kwargs(params: Any, output_dir: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``params`` (a ``GRPOParams``), without building the config (building one resets accelerate's state)."""
    from grpo_magic.models import has_cuda
    from grpo_magic.runtime.device import grpo_precision_kwargs

    kwargs: dict[str, Any] = dict(
        output_dir=output_dir or params.project_name,
        num_generations=params.rl_num_generations,
        max_completion_length=params.rl_max_new_tokens,
        temperature=params.rl_temperature,
        top_k=params.rl_top_k,
        top_p=params.rl_top_p,
        beta=params.rl_kl_coef,
        epsilon=params.rl_clip_range,
        loss_type=params.rl_loss_type,
        max_tool_calling_iterations=params.rl_max_tool_turns,
        use_vllm=params.use_vllm,
        vllm_mode=params.vllm_mode,
        vllm_gpu_memory_utilization=params.vllm_gpu_memory_utilization,
        vllm_tensor_parallel_size=params.vllm_tensor_parallel_size,
        num_train_epochs=params.epochs,
        max_steps=params.max_steps if params.max_steps is not None else -1,
        per_device_train_batch_size=params.batch_size,
        gradient_accumulation_steps=params.gradient_accumulation,
        learning_rate=params.lr,
        seed=params.seed,
        ddp_timeout=params.ddp_timeout,
        logging_steps=params.logging_steps,
        save_steps=params.save_steps,
        save_strategy="steps",
        report_to=[] if params.report_to == "none" else [params.report_to],
        push_to_hub=params.push_to_hub,
        **grpo_precision_kwargs(params.precision()),
        dataloader_pin_memory=has_cuda(),  # pinning on a CPU-only machine only warns
        log_completions=False,
        disable_tqdm=True,
    )
    if params.vllm_server_url:
        kwargs["vllm_server_base_url"] = params.vllm_server_url
    if params.eval_steps is not None:  # TRL's eval loop on the held-out prompts (docs/architecture.md, "Evaluation")
        kwargs.update(params.eval_config_kwargs())
    if params.vllm_max_model_length is not None:
        kwargs["vllm_max_model_length"] = params.vllm_max_model_length
    if params.trl_settings:
        from .trl_settings import settings

        known = settings()
        for name, value in params.trl_settings.items():
            if value is None and name in ("bf16", "fp16", "dataloader_pin_memory"):
                continue  # unset: chosen for this machine above
            kwargs[name] = known[name].parse(value) if name in known else value
        if kwargs.get("fp16") and "bf16" not in params.trl_settings:
            kwargs["bf16"] = False  # fp16 asked for: the automatic bf16 steps aside
    kwargs.update(overrides)
    return kwargs
