"""``tiny-agent``: the offline tool caller of the agent envs' lessons and tests, shipped with the package.

It reads the tools its prompt offers and copies what a request spells out: the tool's name in quotes, each
argument as ``name value``. Free-form requests and one-token argument names (``a``, ``city``) get calls that do
not parse, and ``%grpo_check`` says so. It cannot be relied on to call tools of an unseen shape; its model card
(``weights/<version>/MODEL_CARD.md``) gives the accuracy measured on another build of its recipe (builds differ
across CPUs; no measurement of the shipped bytes is recorded). How it is built (a hand-set copy circuit, a
generated corpus, a short SFT) lives in the repository's ``research/tiny_agent/``, not in the package.
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

from .cache import shipped_folder
from .tiny import TINY_VERSION

TINY_AGENT = "tiny-agent"
VERSION = "tiny-agent-v2.2"


def tiny_agent_path() -> pathlib.Path:
    """The folder of ``tiny-agent``: the package's own weights; ``GRPO_MAGIC_BUILD_MODELS=1`` builds them from
    the recipe instead (a checkout of the repository only: the recipe is research, not package code)."""
    shipped = shipped_folder(f"{VERSION}+{TINY_VERSION}")
    if shipped is not None:
        return shipped
    return _recipe().path()


def _recipe() -> Any:
    from grpo_magic.errors import GRPOMagicError

    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / "research" / "tiny_agent" / "recipe.py").is_file():
        missing = "GRPO_MAGIC_BUILD_MODELS=1 is set" if os.environ.get("GRPO_MAGIC_BUILD_MODELS") == "1" else (
            "the package's weights are missing")
        raise GRPOMagicError(f"Cannot build {TINY_AGENT}: {missing} and its recipe (research/tiny_agent) is only in "
                             "a checkout of the grpo_magic repository; unset GRPO_MAGIC_BUILD_MODELS or reinstall.")
    if str(root) not in sys.path:
        sys.path.append(str(root))
    from research.tiny_agent.recipe import RECIPE

    return RECIPE


def tiny_agent_config() -> Any:
    """``tiny-agent``'s ``Qwen2Config``, read from its folder."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(tiny_agent_path()))
