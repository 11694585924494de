"""Models: resolve and load any model (``loading``); the offline ones the package ships (``tiny``, and
``tiny-math`` and ``tiny-agent`` warm-started from it by a short SFT, ``warmstart``).

Callers import from this package (``from .models import load_model``), never from its modules,
so that there is one place to look up, and to patch in tests, how a model is loaded.
"""

from __future__ import annotations

from .cache import cache_dir
from .loading import (
    OFFLINE_MODELS,
    four_bit_problem,
    has_cuda,
    is_mixture_of_experts,
    load_model,
    load_tokenizer,
    lora_config,
    model_config,
    model_context_length,
    resolve_model,
    supports_bf16,
)
from .tiny import TINY, TINY_VERSION, tiny_model_path
from .tiny_agent import TINY_AGENT, tiny_agent_config, tiny_agent_path
from .tiny_math import TINY_MATH, tiny_math_path
from .warmstart import WarmStart

__all__ = [
    "OFFLINE_MODELS",
    "TINY",
    "TINY_AGENT",
    "TINY_MATH",
    "TINY_VERSION",
    "WarmStart",
    "cache_dir",
    "has_cuda",
    "is_mixture_of_experts",
    "load_model",
    "load_tokenizer",
    "lora_config",
    "model_config",
    "model_context_length",
    "resolve_model",
    "four_bit_problem",
    "supports_bf16",
    "tiny_agent_config",
    "tiny_agent_path",
    "tiny_math_path",
    "tiny_model_path",
]
