"""Everything checked before a model loads: params, env, dataset, generation length, vLLM, servers.

A mistake must cost seconds, not a failed run (docs/architecture.md, "Errors"): the runner
(``train``), the pre-flight check (``check_env``) and the launcher (before it starts any process)
all call ``prepare`` here, so that every surface rejects the same inputs with the same sentence.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any

from grpo_magic.config.params import GRPOParams
from grpo_magic.environment.env import PreparedEnv, episode_parameters, prepare_env, resolve_env
from grpo_magic.errors import GRPOMagicError

_log = logging.getLogger(__name__)

#: Seconds ``prepare`` waits for a ``--vllm-server-url`` to answer before saying it does not.
SERVER_CHECK_TIMEOUT_ENV = "GRPO_MAGIC_VLLM_CHECK_TIMEOUT"
SERVER_CHECK_TIMEOUT_S = 10.0


def prepare(
    params: GRPOParams,
    env: Any = None,
    *,
    processes: int | None = None,
    check_server_url: bool = True,
    cuda_required: bool = True,
) -> tuple[GRPOParams, PreparedEnv, str, Any]:
    """Validate everything cheap: params, env, model path, tokenizer, dataset and tools.

    Returns ``(params, prepared env, model path, tokenizer)``. ``processes``: how many processes
    will train (default: this one's world size). The launcher passes ``check_server_url=False``
    (it starts the server itself) and ``cuda_required`` from its own view of the GPUs.
    """
    from grpo_magic.models import load_tokenizer, resolve_model

    params.validate(processes)
    spec = resolve_env(params, env)
    model_path = resolve_model(params.model)  # type: ignore[arg-type]
    check_generation_length(params, model_path)
    if params.use_vllm:
        if check_server_url and params.vllm_mode == "server" and params.vllm_server_url:
            check_server(params.vllm_server_url)  # the server the user named must answer before any model loads
        check_vllm_installed(cuda=cuda_required)
    tokenizer = load_tokenizer(model_path)
    prepared = prepare_env(spec, tokenizer, eval_split=params.eval_split, seed=params.seed,
                           want_eval=params.eval_steps is not None)
    if params.eval_steps is not None and prepared.eval_dataset is None:
        raise GRPOMagicError(
            f"--eval-steps {params.eval_steps} evaluates on held-out prompts, and {prepared.spec.name} has none; pass "
            "--eval-split 0.1 (a share of build_dataset's rows, which training then never sees), or define "
            "build_eval_dataset(self, tokenizer) on the env.")
    if prepared.agent is not None:
        check_tool_template(tokenizer, params.model or model_path, prepared.spec.name)
    if (advice := bf16_adapter_lr_warning(params, model_path)) is not None:
        _log.warning("grpo_magic: %s", advice)
    return params, prepared, model_path, tokenizer


def bf16_lr_floor(hidden_size: int) -> float:
    """The smallest learning rate whose Adam steps (about lr each) a LoRA A matrix in bf16 keeps.

    PEFT starts A Kaiming-uniform within 1/sqrt(hidden), so a typical entry is 1/(2 sqrt(hidden)); bf16 keeps 8
    significant bits, so a step below half a unit in its last place, about |A| x 2^-8, rounds away.
    On 16 x 896 entries (Qwen2.5-0.5B) one AdamW step in bf16 moved 12% of them at lr 1e-5, 47% at 5e-5 and
    94% at this floor (6.5e-5).
    """
    return 2.0**-9 / math.sqrt(hidden_size)


def bf16_adapter_lr_warning(params: GRPOParams, model_path: str) -> str | None:
    """One sentence when the LoRA adapters train in bf16 (QLoRA: TRL casts them to bf16 on a 4-bit model) at a
    learning rate below ``bf16_lr_floor``, with a learning rate that trains them; None otherwise.

    A warning, not another default: ``--lr``'s default is the original description's, and it suits full-precision
    adapters (PEFT keeps them float32 without --load-in-4bit).
    """
    if not (params.peft and params.load_in_4bit):
        return None
    from grpo_magic.models import model_config

    try:
        hidden = int(model_config(model_path).get_text_config().hidden_size)
    except Exception:  # noqa: BLE001 - no config to read: a 7B model's width
        hidden = 4096
    floor = bf16_lr_floor(hidden)
    if params.lr >= floor:
        return None
    exponent = math.floor(math.log10(floor))
    good = next(f"{m}e{e}" for e in (exponent, exponent + 1) for m in (1, 2, 5) if m * 10.0**e >= floor)
    return (f"lr (--lr) {params.lr:g} is too small for LoRA adapters trained in bf16, as TRL trains them with "
            f"--load-in-4bit: Adam's steps below about {floor:.1e} round away in bf16, so most of the adapters' A "
            f"matrices would hardly move; use --lr {good} or more (QLoRA usually trains at 1e-4 to 2e-4).")


def check_tool_template(tokenizer: Any, model: str, env_name: str) -> None:
    """An agent env needs a chat template that renders tool calls and results (TRL checks it too, later)."""
    from trl import supports_tool_calling

    if not supports_tool_calling(tokenizer):
        raise GRPOMagicError(
            f"{env_name} is an agent env (it has reset and tools), but the chat template of model {model!r} cannot "
            "render tool calls and tool results; use a model whose template supports tools (e.g. Qwen2.5 Instruct, "
            "or --model tiny-agent offline)."
        )


def check_launch(params: GRPOParams, *, processes: int, server_url: str | None, gpus: bool) -> None:
    """What the launched training processes would reject, checked once in the launching process."""
    child = params.replace(vllm_server_url=server_url) if server_url else params
    prepare(child, processes=processes, check_server_url=False, cuda_required=gpus)


def check_generation_length(params: GRPOParams, model_path: str) -> None:
    from grpo_magic.models import model_context_length

    context = model_context_length(model_path)
    if context and params.rl_max_new_tokens >= context:
        raise GRPOMagicError(
            f"rl_max_new_tokens {params.rl_max_new_tokens} does not fit the model's context of {context} tokens "
            f"(prompt included); use --rl-max-new-tokens below {context}, e.g. {max(1, context // 4)}."
        )


def longest_prompt_tokens(dataset: Any, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> int:
    """The longest prompt of ``dataset`` in tokens, as TRL renders it (chat prompts through the template, with tools)."""
    prompts = dataset["prompt"] if dataset is not None and "prompt" in dataset.column_names else []
    texts = [p for p in prompts if isinstance(p, str)]
    longest = max((len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]), default=0) if texts else 0
    for prompt in prompts:
        if not isinstance(prompt, str):
            ids = tokenizer.apply_chat_template(prompt, tools=tools or None, add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            longest = max(longest, len(ids))
    return longest


#: Tokens a turn's tool results are given when an env's episodes continue with ``generator`` (the hotel env's
#: largest, a search of six rooms, is about 620 characters of JSON, some 200 tokens, plus the template's markers).
TOOL_RESULT_TOKENS = 256


def episode_turns(env: Any, params: GRPOParams) -> tuple[int, int] | None:
    """(assistant turns, tokens per later reply) of an env whose ``score_episode`` continues episodes with
    ``generator``; None for an env that does not (its episode is the one completion TRL generates).

    Read from the env's ``max_turns`` and ``max_new_tokens`` (the hotel env's config keys) where it has them,
    else ``rl_max_tool_turns`` and ``rl_max_new_tokens``.
    """
    if env is None or "generator" not in episode_parameters(env)[0]:
        return None

    def count(name: str, default: int) -> int:
        value = getattr(env, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else default

    return count("max_turns", params.rl_max_tool_turns), count("max_new_tokens", params.rl_max_new_tokens)


def vllm_context_length(params: GRPOParams, dataset: Any, tokenizer: Any, model_path: str,
                        tools: list[dict[str, Any]] | None = None, env: Any = None) -> int:
    """vLLM's ``max_model_len`` for this run: the explicit ``vllm_max_model_length``, else the longest prompt plus
    ``rl_max_new_tokens`` (TRL bounds a whole tool loop's completion by it), never above the model's context.

    An env that continues its episodes with ``generator`` (``env``) gets the whole episode: after TRL's
    completion, each later turn's tool results and reply (``episode_turns``), so that the engine has room
    for every turn instead of ending the episode after the first. Left unset, vLLM reserves KV cache for the
    model's whole context (32K-128K tokens), which does not fit a T4 or an L4 at the default 0.3 share of GPU memory.
    """
    if params.vllm_max_model_length is not None:
        return params.vllm_max_model_length
    from grpo_magic.models import model_context_length

    length = longest_prompt_tokens(dataset, tokenizer, tools) + params.rl_max_new_tokens
    if (turns := episode_turns(env, params)) is not None:
        length += (turns[0] - 1) * (TOOL_RESULT_TOKENS + turns[1])
    context = model_context_length(model_path)
    return min(length, context) if context else length


def check_vllm_installed(cuda: bool = True) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise GRPOMagicError(
            "--use-vllm needs the vllm package, which is not installed; pip install 'grpo-magic[vllm]' "
            "on a GPU machine, or drop --use-vllm."
        )
    import torch

    if cuda and not torch.cuda.is_available():
        raise GRPOMagicError("--use-vllm needs a CUDA GPU and none is visible here; drop --use-vllm to train without it.")


def server_answers(url: str, timeout: float = 5.0) -> bool:
    """True when a vLLM server (``trl vllm-serve``) answers its health check at ``url``."""
    base = url.rstrip("/")
    for path in ("/health", "/health/"):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as response:  # noqa: S310 - our own URL check
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return False


def check_server(url: str, timeout: float | None = None) -> None:
    """Raise a clear ``GRPOMagicError`` unless the vLLM server at ``url`` answers within ``timeout`` seconds."""
    if timeout is None:
        timeout = float(os.environ.get(SERVER_CHECK_TIMEOUT_ENV, SERVER_CHECK_TIMEOUT_S))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if server_answers(url, timeout=max(0.5, min(5.0, left))):
            return
        if time.monotonic() >= deadline:
            raise GRPOMagicError(
                f"The vLLM server at {url} does not answer (no reply from {url.rstrip('/')}/health within "
                f"{timeout:g} s); start it with `trl vllm-serve --model MODEL` on that machine, check the URL, or "
                "drop --vllm-server-url to let grpo-magic train start one on this machine's GPUs."
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
