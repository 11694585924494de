"""grpo_magic: train language models with GRPO (TRL) on your own environment, from a notebook.

``%load_ext grpo_magic`` registers the magics; the same engine is importable from Python
(``GRPOParams``, ``train``) and runs from the terminal (``grpo-magic train``). Importing this
package stays light: torch, transformers and trl load only when a run or a check starts.
"""

from __future__ import annotations

from typing import Any

from .config.params import GRPOParams
from .environment.env import EnvSpec, register_env, registered_envs
from .errors import GRPOMagicError
from .events import read_run_log
from .training.run import GRPORun, last_run, train

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "GRPOMagicError",
    "GRPOParams",
    "GRPORun",
    "check_env",
    "compare",
    "evaluate",
    "last_run",
    "load_ipython_extension",
    "read_run_log",
    "register_env",
    "registered_envs",
    "replay",
    "rescore",
    "train",
    "unload_ipython_extension",
]


def replay(output_dir: str, static: bool = False) -> Any:
    """Rebuild the dashboard of a run from its run log (a crashed kernel's run, a CLI run...);
    ``static=True``: only the curves' PNG, for frontends without widgets."""
    from .dashboard import replay as _replay

    return _replay(output_dir, static=static)


def compare(*output_dirs: Any) -> Any:
    """Other runs' curves overlaid, from their run logs, each named by its folder and the settings that differ."""
    from .dashboard.compare import compare as _compare

    return _compare(*output_dirs)


def check_env(*args: Any, **kwargs: Any) -> Any:
    """Pre-flight an environment on sampled completions without training (see ``grpo_magic.analysis.check``)."""
    from .analysis.check import check_env as _check_env

    return _check_env(*args, **kwargs)


def rescore(run_or_dir: Any = None, env: Any = None, **kwargs: Any) -> Any:
    """Score a run log's completions again with ``env`` as it is now (see ``grpo_magic.analysis.rescoring``)."""
    from .analysis.rescoring import rescore as _rescore

    return _rescore(run_or_dir, env, **kwargs)


def evaluate(env: Any = None, model_or_run_dir: Any = None, **kwargs: Any) -> Any:
    """Score a model or a run folder's saved weights on the env's held-out prompts (see ``grpo_magic.analysis.evaluation``)."""
    from .analysis.evaluation import evaluate as _evaluate

    return _evaluate(env, model_or_run_dir, **kwargs)


def load_ipython_extension(ipython: Any) -> None:
    from .frontends.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .frontends.magics import unload_ipython_extension as _unload

    _unload(ipython)
