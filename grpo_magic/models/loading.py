"""Resolving and loading any model: a hub id, a local folder, or one of the offline models built here.

Heavy libraries (torch, transformers, peft, huggingface_hub) are imported inside the functions so
that ``import grpo_magic`` and ``%load_ext grpo_magic`` stay light. The offline models (``tiny``, ``tiny-math``,
``tiny-agent``) ship with the package (``GRPO_MAGIC_BUILD_MODELS=1`` rebuilds them from their recipes) and load
through the very same ``from_pretrained`` path.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from grpo_magic.errors import GRPOMagicError
from grpo_magic.text import one_line

from .tiny import TINY, tiny_model_path
from .tiny_agent import TINY_AGENT, tiny_agent_path
from .tiny_math import TINY_MATH, tiny_math_path

if TYPE_CHECKING:
    import peft

# Seconds to wait for the Hub before saying it cannot be reached.
_HUB_TIMEOUT = 5.0
_HUB_DEADLINE = 8.0

#: The offline models the package ships instead of downloading: name -> the function that gives their folder.
OFFLINE_MODELS: dict[str, Callable[[], pathlib.Path]] = {
    TINY: tiny_model_path, TINY_AGENT: tiny_agent_path, TINY_MATH: tiny_math_path,
}

def model_config(name_or_path: str) -> Any:
    """The model's transformers config, without reading its weights: what an estimate made before a run needs."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(OFFLINE_MODELS[name_or_path]()) if name_or_path in OFFLINE_MODELS
                                      else name_or_path)


def _not_found(name: str) -> GRPOMagicError:
    return GRPOMagicError(
        f"Model '{name}' was not found: it is not a local folder and the Hugging Face Hub could "
        "not be reached or has no such model; pass a local path, check the id, or use "
        "--model tiny for the offline demo model."
    )


def _looks_like_path(name: str) -> bool:
    """True when ``name`` can only be a filesystem path, not a Hub id (``name`` or ``org/name``)."""
    if name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name in (".", ".."):
        return True
    if "\\" in name or (len(name) > 1 and name[1] == ":"):  # Windows paths
        return True
    if os.sep != "/" and os.sep in name:
        return True
    return name.count("/") > 1 or name.endswith("/")


def _env_flag(var: str) -> bool:
    return os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_offline() -> bool:
    """Offline per the environment now (huggingface_hub reads it only once, at import)."""
    if _env_flag("HF_HUB_OFFLINE") or _env_flag("TRANSFORMERS_OFFLINE"):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cached_config(repo_id: str) -> str | None:
    """The path of ``config.json`` for a Hub id in the local HF cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an id the hub client rejects (bad characters, ...)
        return None
    return found if isinstance(found, str) else None


def _hub_config(repo_id: str) -> str:
    """Fetch ``config.json`` of a Hub model into the HF cache and return its path.

    Raises GRPOMagicError with the reason. Runs in a daemon thread with a deadline, because the hub
    client retries connection errors with back-off for tens of seconds and DNS can hang; a model
    listing (no retries) is asked first so that an unreachable Hub fails at once.
    """
    outcome: dict[str, Any] = {}

    def work() -> None:
        from huggingface_hub import HfApi, hf_hub_download

        try:
            info = HfApi().model_info(repo_id, timeout=_HUB_TIMEOUT)
            siblings = {s.rfilename for s in (info.siblings or [])}
            if siblings and "config.json" not in siblings:
                outcome["error"] = GRPOMagicError(
                    f"Model '{repo_id}' on the Hugging Face Hub has no config.json, so it is not a "
                    "transformers model; pick a repository with transformers weights."
                )
                return
            outcome["path"] = hf_hub_download(repo_id, "config.json", etag_timeout=_HUB_TIMEOUT)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=work, name="grpo-magic-hub-check", daemon=True)
    thread.start()
    thread.join(_HUB_DEADLINE)
    if "path" in outcome:
        return str(outcome["path"])
    error = outcome.get("error")
    if isinstance(error, GRPOMagicError):
        raise error
    from huggingface_hub.errors import GatedRepoError

    if isinstance(error, GatedRepoError):
        raise GRPOMagicError(
            f"Model '{repo_id}' is gated on the Hugging Face Hub; accept its terms on the model "
            "page and log in with `hf auth login`, or pick another model."
        ) from error
    raise _not_found(repo_id) from error


def resolve_model(name: str) -> str:
    """Turn what the user typed into something ``from_pretrained`` can load, or say why not.

    Checked early (before anything heavy is loaded) so that a typo costs seconds, not a failed
    run: ``tiny`` builds the demo model, a local folder is used as is, and a Hub id must be in the
    local HF cache or reachable on the Hub. Answers within seconds when offline.
    """
    name = (name or "").strip()
    if not name:
        raise GRPOMagicError("No model was given; pass a Hub id, a local folder, or tiny for the demo model.")
    if name in OFFLINE_MODELS:
        return str(OFFLINE_MODELS[name]())
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        return expanded
    if os.path.exists(expanded):
        raise GRPOMagicError(
            f"Model path '{name}' is a file, not a folder; pass the folder that holds config.json and the weights."
        )
    if _looks_like_path(name):
        raise GRPOMagicError(
            f"Model path '{name}' does not exist; check the path, or pass a Hugging Face Hub id "
            "or tiny for the offline demo model."
        )
    if _cached_config(name) is not None:
        return name
    if _hub_offline():
        raise GRPOMagicError(
            f"Model '{name}' was not found: it is not a local folder nor in the Hugging Face cache, and the Hub "
            "is off (HF_HUB_OFFLINE is set); pass a local path, unset HF_HUB_OFFLINE to download it, or use "
            "--model tiny for the offline demo model."
        )
    _hub_config(name)
    return name


def _local_or_id(name_or_path: str) -> str:
    """Accept the offline models' names (``tiny``) wherever a model name is taken."""
    return str(OFFLINE_MODELS[name_or_path]()) if name_or_path in OFFLINE_MODELS else name_or_path


def _read_config(name_or_path: str) -> dict[str, Any] | None:
    """The raw config.json of a local folder or a (cached or reachable) Hub id, or None."""
    path = pathlib.Path(os.path.expanduser(name_or_path))
    if path.is_dir():
        file: str | None = str(path / "config.json") if (path / "config.json").is_file() else None
    else:
        file = _cached_config(name_or_path)
        if file is None and not _looks_like_path(name_or_path) and not _hub_offline():
            try:
                file = _hub_config(name_or_path)
            except GRPOMagicError:
                file = None
    if file is None:
        return None
    try:
        data = json.loads(pathlib.Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
    "max_seq_len",
    "model_max_length",
)


def model_context_length(name_or_path: str) -> int | None:
    """The model's context window from its config.json, without loading weights or remote code.

    Used to warn when prompts plus completions cannot fit. Multimodal configs keep the language
    model's settings in a nested ``text_config`` (or similar), which is searched too. None when
    unknown.
    """
    config = _read_config(_local_or_id(name_or_path))
    if config is None:
        return None
    for section in (config, *(config.get(k) for k in ("text_config", "llm_config", "language_config"))):
        if not isinstance(section, dict):
            continue
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


#: config.json keys of mixture-of-experts models (Mixtral, Qwen-MoE, DeepSeek, OLMoE, gpt-oss...).
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def is_mixture_of_experts(name_or_path: str) -> bool:
    """True when the model's config.json names experts (the only models vLLM data parallelism serves)."""
    config = _read_config(_local_or_id(name_or_path)) or {}
    sections = (config, *(config.get(k) for k in ("text_config", "llm_config", "language_config")))
    return any(isinstance(s, dict) and isinstance(s.get(key), int) and s.get(key, 0) > 1
               for s in sections for key in _EXPERT_KEYS)


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def supports_bf16() -> bool:
    """bf16 only where the hardware has it natively (``device.choose_precision`` decides what a run uses)."""
    from grpo_magic.runtime.device import native_bf16

    return native_bf16()


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False) -> Any:
    """Load the tokenizer ready for GRPO: left padding (generation) and a pad token.

    Without a pad token batching fails; the eos token is the usual stand-in. Only when there is
    no eos either is a new pad token added, and the model's embeddings must then be resized (pass
    this tokenizer to ``load_model``).
    """
    from transformers import AutoTokenizer

    path = _local_or_id(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise GRPOMagicError(f"Could not load the tokenizer of '{name_or_path}': {one_line(exc, 10_000)}") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
    return tokenizer


def init_kwargs(value: Any) -> dict[str, Any]:
    """The policy's extra ``from_pretrained`` keywords (``--model-init-kwargs``: JSON text or a dict, checked by
    ``trl_settings.model_init_kwargs_problem``), with a dtype's name as the torch dtype (``auto`` as is)."""
    import torch

    if value is None:
        return {}
    kwargs = dict(json.loads(value) if isinstance(value, str) else value)
    if isinstance(kwargs.get("dtype"), str) and kwargs["dtype"] != "auto":
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    return kwargs


@contextlib.contextmanager
def _bars_only_in_a_terminal() -> Iterator[None]:
    """transformers' "Loading weights" bars off while a model loads, unless stderr is a terminal.

    In a notebook, a log file or a pipe a tqdm bar is no progress but a frozen "0%" line or a stream
    of carriage returns; in a terminal it moves. The setting is put back after.
    """
    import sys

    from transformers.utils import logging as hf_logging

    isatty = getattr(sys.stderr, "isatty", None)
    if not hf_logging.is_progress_bar_enabled() or (callable(isatty) and isatty()):
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_model(
    name_or_path: str,
    *,
    trust_remote_code: bool = False,
    tokenizer: Any = None,
    dtype: Any = None,
    load_in_4bit: bool = False,
    model_init_kwargs: dict[str, Any] | str | None = None,
    use_cpu: bool = False,
) -> Any:
    """Load the causal LM in ``dtype``; default: the precision ``device.choose_precision`` picks for this device.

    A run passes ``device.load_dtype`` of its precision (bf16 weights; float32 weights under fp16
    autocast, or an fp16 base under LoRA; float32 on CPU), and its ``model_init_kwargs`` (attention
    implementation, ``use_kernels``, dtype...), which win over ours.

    On CUDA the weights load straight onto the process's device (``device_map``), not through host memory first:
    a Colab runtime's RAM (about 12 GB) would otherwise cap the model at about 3B parameters in fp16; a run that
    trains on the CPU all the same (TRL's ``use_cpu``) passes ``use_cpu``.

    Always the plain model: TRL applies LoRA itself from the config made by ``lora_config``. When
    ``tokenizer`` has more tokens than the model's embeddings (a pad token was added), the embeddings
    are resized.
    """
    from transformers import AutoModelForCausalLM

    from grpo_magic.runtime.device import choose_precision, load_dtype, process_cuda_device

    path = _local_or_id(name_or_path)
    dtype = dtype if dtype is not None else load_dtype(choose_precision())
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if load_in_4bit:
        kwargs["quantization_config"] = quantization_config(dtype)
    device = None if use_cpu else process_cuda_device()
    if device is not None:
        kwargs["device_map"] = {"": device}
    kwargs.update(init_kwargs(model_init_kwargs))
    try:
        with _bars_only_in_a_terminal():
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as exc:
        raise GRPOMagicError(f"Could not load model '{name_or_path}': {one_line(exc, 10_000)}") from exc
    frozen = set(getattr(model.config, "grpo_magic_frozen", None) or ())
    for name, param in model.named_parameters():  # a model's own hand-set parts, which no run trains
        if name in frozen:
            param.requires_grad_(False)
    if tokenizer is not None:
        embeddings = model.get_input_embeddings()
        if embeddings is not None and len(tokenizer) > embeddings.weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        if model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id
    return model


def quantization_config(compute_dtype: Any) -> Any:
    """QLoRA's 4-bit loading (NF4, double quantization), as the QLoRA paper and transformers' docs set it."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)


def four_bit_problem(peft: bool, *, use_vllm: bool = False) -> str | None:
    """Why --load-in-4bit cannot work here, in one sentence, before any model loads; None when it can.

    With vLLM it cannot work on any machine: TRL starts vLLM with ``quantization="bitsandbytes"`` for a 4-bit
    policy, and bitsandbytes left vLLM's core in 0.28 (a separate plugin now).
    """
    import importlib.util

    if use_vllm:
        return ("load_in_4bit (--load-in-4bit) cannot be used with --use-vllm: TRL would start vLLM with "
                "bitsandbytes quantization, which vLLM no longer ships (since 0.28); drop --use-vllm to generate "
                "with TRL, or drop --load-in-4bit to train LoRA adapters (--peft) on the full-precision model with vLLM.")
    if not peft:
        return ("load_in_4bit (--load-in-4bit) trains LoRA adapters on a frozen 4-bit model, so it needs --peft; "
                "add --peft, or leave --load-in-4bit out.")
    if not has_cuda():
        return ("load_in_4bit (--load-in-4bit) needs a CUDA GPU (bitsandbytes' 4-bit kernels) and this machine has "
                "none; use --peft alone on a CPU (LoRA in full precision), or train on a CUDA GPU.")
    if importlib.util.find_spec("bitsandbytes") is None:
        return "load_in_4bit (--load-in-4bit) needs bitsandbytes; pip install 'grpo-magic[qlora]'."
    return None


def lora_config(lora_r: int, lora_alpha: int) -> peft.LoraConfig:
    """The LoRA config TRL applies to the policy: adapters on every linear layer of the blocks.

    PEFT's ``all-linear`` finds the attention and MLP projections of any architecture (``nn.Linear``
    and GPT-2's ``Conv1D``) and leaves the output head out, so no per-model table is needed.
    """
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=lora_r,
        lora_alpha=lora_alpha,
        lora_dropout=0.05,
        target_modules="all-linear",
        task_type=TaskType.CAUSAL_LM,
    )
