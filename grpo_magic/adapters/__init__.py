"""Envs from code people already have: TRL-style reward functions (``from_reward_funcs``), reasoning-gym tasks
(``from_reasoning_gym``), OpenEnv environments (``from_openenv``) and verifiers tasksets (``from_verifiers``).

Each returns an env class, assigned in a ``%%grpo_env NAME`` cell or passed to ``grpo_magic.train``. The libraries
are imported only when an adapter is called; a missing one is one sentence with its ``pip install``.
"""

from __future__ import annotations

from .openenv import from_openenv
from .reward_functions import from_reasoning_gym, from_reward_funcs
from .verifiers import from_verifiers

__all__ = ["from_openenv", "from_reasoning_gym", "from_reward_funcs", "from_verifiers"]
