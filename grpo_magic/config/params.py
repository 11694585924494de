"""Every training parameter, declared once.

Each ``GRPOParams`` field carries its CLI help, its form section and its valid range in the
field metadata (as TRL's ``GRPOConfig`` does with ``help``). The CLI flags, the notebook form,
validation and the exported command are all generated from these declarations, so adding a
field here adds it everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import numbers
import shlex
import typing
from dataclasses import dataclass, field
from typing import Any

from grpo_magic.errors import GRPOMagicError
from grpo_magic.runtime.distributed import world_size
from grpo_magic.text import finite, show

from . import trl_settings as _trl_settings
from .json_config import parse_json
from .recipes import NAMES as RECIPE_NAMES
from .recipes import RECIPES, unknown_recipe_message

#: Form sections, in display order.
GROUPS = ("Model", "Environment", "GRPO", "Generation", "Optimization", "LoRA", "vLLM", "Evaluation", "Output")

#: ``grpo-magic train``'s output folder when no --project-name is given: the seed's, so that a script run again
#: or ``--resume`` finds its folder. Elsewhere no project_name means a new folder per run (``folders``).
CLI_PROJECT_NAME = "grpo-run"


def _p(default: Any, help: str, group: str, **meta: Any) -> Any:
    """A parameter: its default, its help text, its form section and its checks.

    Checks in ``meta``: ``ge``/``gt``/``le``/``lt`` bounds, ``choices``, ``required``,
    ``json_object`` (a JSON object string), ``url`` (an http(s) URL), ``path`` (a usable folder
    name), ``why`` (a hint added to range errors). ``checkpoint``: a checkpoint fixes it, so a
    resumed run must use the checkpoint's value (``resume``). ``trl``: the ``GRPOConfig`` field it sets
    (that field is then no derived setting: ``trl_settings``); ``trl_choices``: its choices are TRL's.
    """
    return field(default=default, metadata={"help": help, "group": group, **meta})


@dataclass(init=False)
class GRPOParams:
    """Parameters of a GRPO run, with the original description's names and defaults."""

    # Model
    model: str | None = _p(
        None,
        "Model to train: a Hugging Face hub id, a local folder, or 'tiny' (an offline demo model).",
        "Model",
        required=True, checkpoint=True,
    )
    project_name: str | None = _p(
        None, "Output folder of the run (weights, checkpoints, run log); empty: a new folder grpo-runs/ENV-DATE-TIME "
        f"for each run (grpo-magic train: {CLI_PROJECT_NAME}).", "Model", path=True,
        placeholder="a new folder grpo-runs/ENV-DATE-TIME",
    )
    trainer: str = _p("grpo", "Trainer to use; grpo_magic trains with GRPO only.", "Model", choices=("grpo",))

    # Environment
    rl_env_module: str | None = _p(
        None, "Python module of the environment, e.g. my_envs.hotel_env (importable from the current folder).",
        "Environment",
    )
    rl_env_class: str | None = _p(None, "Class name of the environment in that module, e.g. HotelEnv.", "Environment")
    rl_env_config: str | None = _p(
        None, 'JSON object of keyword arguments for the environment\'s constructor, e.g. {"max_turns": 5}.',
        "Environment", json_object=True,
    )
    rl_env_workers: int = _p(
        1, "Threads that run synchronous score_episode calls of a step at once (async envs always run concurrently).",
        "Environment", ge=1,
    )
    rl_episode_timeout: float | None = _p(
        None, "Seconds after which an episode is abandoned and counted as an error (empty: no limit).",
        "Environment", gt=0,
    )
    rl_max_tool_turns: int = _p(
        5, "Agent envs: most tool-calling rounds per episode (max_tool_calling_iterations in GRPOConfig).",
        "Environment", ge=1, why="an agent episode needs at least one round of tool calls", trl="max_tool_calling_iterations",
    )
    rl_max_error_rate: float = _p(
        0.5, "Share of a step's episodes that may fail before the run stops (1 never stops).", "Environment",
        ge=0, le=1,
    )

    # GRPO
    rl_num_generations: int = _p(
        4, "Completions sampled per prompt; GRPO compares them within the group.", "GRPO", ge=2,
        why="GRPO needs at least two completions of a prompt to compare", checkpoint=True, trl="num_generations",
    )
    rl_kl_coef: float = _p(0.1, "KL penalty against the reference model (beta in GRPOConfig).", "GRPO", ge=0, trl="beta")
    rl_clip_range: float = _p(0.2, "Clipping range of the policy ratio (epsilon in GRPOConfig).", "GRPO", gt=0, trl="epsilon")
    rl_loss_type: str = _p("dapo", "Loss aggregation of TRL's GRPOTrainer (loss_type).", "GRPO", trl="loss_type",
                           trl_choices=True)
    recipe: str | None = _p(
        None, "A published GRPO variant (TRL's paper index) as one word: its settings, unless set explicitly "
        "(docs/architecture.md, \"Recipes\").", "GRPO", choices=RECIPE_NAMES,
    )

    # Generation
    rl_max_new_tokens: int = _p(128, "Most tokens generated per completion.", "Generation", ge=1,
                                trl="max_completion_length")
    rl_temperature: float = _p(1.0, "Sampling temperature.", "Generation", gt=0, trl="temperature")
    rl_top_k: int = _p(50, "Top-k sampling (0 disables it).", "Generation", ge=0, trl="top_k")
    rl_top_p: float = _p(1.0, "Top-p (nucleus) sampling, in (0, 1].", "Generation", gt=0, le=1, trl="top_p")

    # Optimization
    epochs: int = _p(1, "Passes over the environment's dataset.", "Optimization", ge=1,
                 trl="num_train_epochs")
    max_steps: int | None = _p(None, "Stop after this many optimizer steps (empty: run all epochs).", "Optimization", ge=1,
                                trl="max_steps")
    batch_size: int = _p(
        4, "Completions per device per step (per_device_train_batch_size); prompts per step = this / generations.",
        "Optimization", ge=1, checkpoint=True, trl="per_device_train_batch_size",
    )
    gradient_accumulation: int = _p(1, "Gradient accumulation steps.", "Optimization", ge=1, checkpoint=True,
                                  trl="gradient_accumulation_steps")
    lr: float = _p(1e-5, "Learning rate.", "Optimization", gt=0, checkpoint=True, trl="learning_rate")
    seed: int = _p(42, "Random seed.", "Optimization", ge=0, le=2**32 - 1, why="numpy seeds are 32-bit",
                   checkpoint=True, trl="seed")
    ddp_timeout: int = _p(
        1800, "Several processes or machines: seconds a process waits for the others in a collective call before "
        "the run fails with a checkpoint (a frozen or unreachable machine ends the run after this long).",
        "Optimization", ge=1, le=365 * 24 * 3600, why="a year; torch's timeout is a timedelta", trl="ddp_timeout",
    )

    # LoRA
    peft: bool = _p(False, "Train LoRA adapters (PEFT) instead of every weight.", "LoRA", checkpoint=True)
    lora_r: int = _p(16, "LoRA rank.", "LoRA", ge=1, checkpoint=True)
    lora_alpha: int = _p(32, "LoRA alpha (scaling).", "LoRA", ge=1, checkpoint=True)
    load_in_4bit: bool = _p(
        False, "Load the model in 4 bits and train LoRA adapters on it (QLoRA; needs --peft, a CUDA GPU and "
        "pip install grpo-magic[qlora]).", "LoRA", checkpoint=True,
    )

    # vLLM
    use_vllm: bool = _p(False, "Generate with vLLM (needs a GPU and pip install grpo-magic[vllm]).", "vLLM",
                       trl="use_vllm")
    vllm_mode: str = _p(
        "colocate", "colocate: vLLM shares the training GPUs; server: vLLM runs on its own GPUs.", "vLLM",
        choices=("colocate", "server"), trl="vllm_mode",
    )
    vllm_gpu_memory_utilization: float = _p(
        0.3, "Share of GPU memory for vLLM in colocate mode, in (0, 1).", "vLLM", gt=0, lt=1,
        trl="vllm_gpu_memory_utilization",
    )
    vllm_server_url: str | None = _p(
        None, "URL of a running vLLM server (trl vllm-serve) in server mode, e.g. http://10.0.0.2:8000.", "vLLM",
        url=True, trl="vllm_server_base_url",
    )
    vllm_tensor_parallel_size: int = _p(1, "GPUs for vLLM tensor parallelism.", "vLLM", ge=1,
                                        trl="vllm_tensor_parallel_size")
    vllm_server_gpus: int = _p(
        1, "GPUs given to the vLLM server in server mode, taken from the training processes.", "vLLM", ge=1,
    )
    vllm_max_model_length: int | None = _p(
        None, "vLLM's context in tokens, prompt plus completion (empty: the longest prompt plus rl_max_new_tokens, "
        "so vLLM does not reserve KV cache for the model's whole context).", "vLLM", ge=1, trl="vllm_max_model_length",
    )

    # Evaluation (docs/architecture.md, "Evaluation")
    eval_split: float | None = _p(
        None, "Share of build_dataset's rows held out for evaluation (by seed); training never sees them. Not "
        "needed when the env defines build_eval_dataset.", "Evaluation", gt=0, lt=1,
        why="some rows must be left to train on and some to evaluate", checkpoint=True,
    )
    eval_steps: int | None = _p(
        None, "Evaluate on the held-out prompts at the start, every this many steps and at the end (TRL's "
        "eval loop, plus greedy episodes and pass@k; empty: no evaluation during the run).", "Evaluation", ge=1,
        trl="eval_steps",
    )
    eval_samples: int = _p(
        4, "Sampled episodes per held-out prompt in an evaluation, for pass@k and the sampled mean "
        "(num_generations_eval in GRPOConfig).", "Evaluation", ge=1, trl="num_generations_eval",
    )

    # The reward-hacking watch (docs/explanation/watch.md)
    watch: str | None = _p(
        None, "Task metrics the reward-hacking watch compares the reward with: names of the env's score components "
        "or eval (the in-run evaluation), comma-separated; empty: the env's task_metrics attribute; none: no watch.",
        "Evaluation", metric_names=True, placeholder="the env's task_metrics",
    )
    on_alarm: str = _p(
        "warn", "What a reward-hacking alarm does: warn (an alarm in the run log, the progress and the trackers) or "
        "stop (the run also ends as the Stop button does, with a checkpoint).", "Evaluation",
        choices=("warn", "stop"),
    )

    # Output
    logging_steps: int = _p(1, "Log metrics every this many steps.", "Output", ge=1, trl="logging_steps")
    save_steps: int = _p(500, "Save a checkpoint every this many steps.", "Output", ge=1, trl="save_steps")
    report_to: str = _p(
        "none", "Experiment tracker to report to.", "Output", choices=("none", "trackio", "wandb", "tensorboard"), trl="report_to",
    )
    push_to_hub: bool = _p(False, "Push the trained weights to the Hugging Face Hub at the end.", "Output",
                              trl="push_to_hub")

    # Every other GRPOConfig setting (trl_settings.py): {TRL name: value}, only those given. Pass them as
    # keywords, GRPOParams(scale_rewards="none"), or as --scale-rewards none; read them as params.scale_rewards.
    trl_settings: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Other GRPOConfig settings, by TRL's names.", "group": "TRL"},
    )

    def __init__(self, **kwargs: Any) -> None:
        """Parameters of a GRPO run. Besides the declared fields, every other setting of TRL's GRPOConfig is a
        keyword by its TRL name (``GRPOParams(scale_rewards='none')``); a TRL name of a declared field (``beta``
        for ``rl_kl_coef``) sets that field; ``recipe='dapo'`` fills what the recipe sets and you did not.

        Written out, not dataclass-generated: the keywords are routed first (declared fields, TRL's other
        settings, a recipe's), and an unknown name is one sentence (``trl_settings.route``)."""
        explicit, trl = _route(kwargs)
        _apply_recipe(explicit, trl)
        for f in self.fields():
            if f.name in explicit:
                value = explicit[f.name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                value = f.default_factory()  # type: ignore[misc]
            setattr(self, f.name, value)
        self.trl_settings = trl
        self.__post_init__()

    def __post_init__(self) -> None:
        # An empty string in an optional field means "not set", as validation reads it: store None,
        # so that no "" reaches the command line (--rl-episode-timeout '') or TRL.
        if not isinstance(self.trl_settings, dict):
            raise GRPOMagicError(f"trl_settings must be a dict of GRPOConfig settings, got {show(self.trl_settings)}; "
                                 "pass them as keywords instead, e.g. GRPOParams(scale_rewards='none').")
        for f in self.fields():
            value = getattr(self, f.name)
            if isinstance(value, str) and value == "" and self.is_optional(f.name):
                setattr(self, f.name, None)

    # ---------------------------------------------------------------- introspection

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        """The declared parameters (``trl_settings``, the bag of derived ones, is not one of them)."""
        return [f for f in dataclasses.fields(cls) if f.name != "trl_settings"]

    @staticmethod
    def trl_fields() -> dict[str, Any]:
        """The derived settings: every other ``GRPOConfig`` field, from the installed TRL (imports trl)."""
        from .trl_settings import settings

        return settings()

    @staticmethod
    def trl_choices(name: str) -> tuple[str, ...]:
        """TRL's choices of a declared field marked ``trl_choices`` (rl_loss_type: TRL's loss types)."""
        from .trl_settings import setting_of

        meta = next(f for f in GRPOParams.fields() if f.name == name).metadata
        return setting_of(meta["trl"]).choices or ()

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: a TRL name reads its value (given, else TRL's default).
        if name.startswith("_") or name == "trl_settings" or "trl_settings" not in self.__dict__:
            raise AttributeError(name)
        explicit = _explicit_by_trl()
        if name in explicit:
            return getattr(self, explicit[name])
        from . import trl_settings as ts

        name = ts.resolve_name(name)
        if name in self.trl_settings:
            return self.trl_settings[name]
        setting = ts.settings().get(name)
        if setting is None:
            raise AttributeError(f"GRPOParams has no parameter or TRL setting {name!r}")
        return setting.default

    def recipe_value(self, trl_name: str) -> Any:
        """What this run's recipe sets ``trl_name`` to, or ``_UNSET``."""
        recipe = RECIPES.get(self.recipe) if isinstance(self.recipe, str) else None
        return recipe.settings.get(trl_name, _UNSET) if recipe else _UNSET

    def _baseline(self, f: dataclasses.Field) -> Any:
        """A field's value when the user did not set it: its recipe's, else its default."""
        value = self.recipe_value(f.metadata["trl"]) if f.metadata.get("trl") else _UNSET
        return f.default if value is _UNSET else value

    def user_values(self) -> dict[str, Any]:
        """What the user set: fields that differ from their baseline, and every TRL setting not from the recipe."""
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in self.fields()
                                  if getattr(self, f.name) != self._baseline(f) or f.name == "recipe"}
        values.update({k: v for k, v in self.trl_settings.items() if v != self.recipe_value(k)})
        return {k: v for k, v in values.items() if not (k == "recipe" and v is None)}

    @classmethod
    def field_type(cls, name: str) -> type:
        """The plain type of a field (``int | None`` gives ``int``)."""
        hint = _type_hints(cls)[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if args else hint

    @classmethod
    def is_optional(cls, name: str) -> bool:
        return type(None) in typing.get_args(_type_hints(cls)[name])

    @staticmethod
    def flag(name: str) -> str:
        """The CLI flag of a field: ``rl_num_generations`` gives ``--rl-num-generations``."""
        return "--" + name.replace("_", "-")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> GRPOParams:
        """A copy with ``changes`` (TRL names too); a new recipe applies to what the user did not set."""
        explicit, trl = _route(changes)
        if "recipe" in explicit and explicit["recipe"] != self.recipe:
            base = {k: v for k, v in self.user_values().items() if k != "recipe"}
            base_explicit, base_trl = _route(base)
            return GRPOParams(**{**base_explicit, **explicit}, trl_settings={**base_trl, **trl})
        return dataclasses.replace(self, **explicit, trl_settings={**self.trl_settings, **trl})

    # ---------------------------------------------------------------- validation

    @classmethod
    def check_value(cls, name: str, value: Any) -> str | None:
        """The problem with one field's value, and its fix, in one sentence, or None when it is valid."""
        f = next(f for f in cls.fields() if f.name == name)
        meta = f.metadata
        flag = cls.flag(name)
        label = f"{name} ({flag})"
        if value is None or (isinstance(value, str) and value == "" and cls.is_optional(name)):
            if meta.get("required"):
                return f"{label} is required; pass a hub id or a local folder, or use --model tiny for the offline demo."
            if cls.is_optional(name):
                return None
            return f"{label} must be set; {cls._use(name, 'pass a value')}."
        kind = cls.field_type(name)
        if kind is bool:
            if not isinstance(value, bool):
                return f"{label} must be true or false, got {show(value)}; pass True or False."
            return None
        if kind in (int, float):
            # Integral/Real, not int/float: numpy numbers are fine; an integral float for an int field is not
            # (it would reach TRL as a float). Huge ints are compared exactly, never turned into floats.
            if isinstance(value, bool) or not isinstance(value, numbers.Integral if kind is int else numbers.Real):
                what = "an integer" if kind is int else "a number"
                return f"{label} must be {what}, got {show(value)}; {cls._use(name, 'pass ' + what)}."
            if kind is float and finite(value) is None:  # an int past float range too
                return f"{label} must be a finite number, got {show(value)}; {cls._use(name, 'pass a finite number')}."
            bounds = [
                ("ge", lambda v, b: v >= b, "at least", "{b} or more"),
                ("gt", lambda v, b: v > b, "greater than", "above {b}"),
                ("le", lambda v, b: v <= b, "at most", "{b} or less"),
                ("lt", lambda v, b: v < b, "less than", "below {b}"),
            ]
            for key, ok, words, fix in bounds:
                if key in meta and not ok(value, meta[key]):
                    why = f" ({meta['why']})" if "why" in meta else ""
                    use = f"use {flag} {fix.format(b=meta[key])}"
                    return f"{label} must be {words} {meta[key]}, got {show(value)}{why}; {cls._use(name, use, then_default=True)}."
            return None
        if not isinstance(value, str):
            return f"{label} must be a string, got {show(value)}; pass it as text, e.g. {name}={str(value)!r}."
        if name == "recipe" and value not in RECIPE_NAMES:
            return unknown_recipe_message(value)
        if meta.get("trl_choices"):
            meta = {**meta, "choices": cls.trl_choices(name)}
        if "choices" in meta and value not in meta["choices"]:
            choices = meta["choices"]
            fix = f"use {flag} {choices[0]}" if len(choices) == 1 else cls._use(name, "use one of them")
            return f"{label} must be one of {', '.join(choices)}, not {value!r}; {fix}."
        if meta.get("json_object"):
            parsed, problem = parse_json(value, label)
            if problem:
                return problem
            if not isinstance(parsed, dict):
                return (f"{label} must be a JSON object, got {type(parsed).__name__}; write the constructor's keyword "
                        "arguments as one, such as '{\"max_turns\": 3}'.")
        if meta.get("metric_names") and (problem := _metric_names_problem(value, label)):
            return problem
        if meta.get("path") and (not value.strip() or "\x00" in value):
            return f"{label} must name a folder, got {value!r}; {cls._use(name, 'use a folder name')}."
        if meta.get("url") and not value.startswith(("http://", "https://")):
            return f"{label} must be an http:// or https:// URL, got {value!r}; use one such as http://localhost:8000."
        return None

    @classmethod
    def _use(cls, name: str, fix: str, *, then_default: bool = False) -> str:
        """``fix`` made concrete with the field's default: ``fix, e.g. --flag 4``, or ``fix (the default is 4)``."""
        default = next(f.default for f in cls.fields() if f.name == name)
        if default is None or isinstance(default, bool):
            return fix
        return f"{fix} (the default is {default})" if then_default else f"{fix}, e.g. {cls.flag(name)} {default}"

    def problems(self, processes: int | None = None) -> list[tuple[str, str]]:
        """Every problem as ``(field name, sentence)``; fields first, then rules across fields.

        ``processes``: how many processes will train together (default: this one's ``world_size()``),
        since the completions of a step are those of every process.
        """
        found = [(f.name, msg) for f in self.fields() if (msg := self.check_value(f.name, getattr(self, f.name)))]
        found += self._trl_setting_problems()
        if found:
            return found
        found = self._cross_field_problems(processes or world_size())
        if found or (processes or world_size()) > 1:
            return found  # TRL's rules for several processes are checked by each of them, when the config is built
        return self.trl_problems()

    def _trl_setting_problems(self) -> list[tuple[str, str]]:
        if not self.trl_settings:
            return []
        from . import trl_settings as ts

        found = []
        for name, value in self.trl_settings.items():
            setting = ts.settings().get(name)
            if setting is None:  # only a dict built by hand gets here: the constructor routes names
                found.append((name, ts.unknown_message(name, [f.name for f in self.fields()])))
            elif msg := setting.check(value, f"{name} ({setting.flag})"):
                found.append((name, msg))
        return found

    def trl_problems(self) -> list[tuple[str, str]]:
        """TRL's own rules: ``GRPOConfig`` built from these params, its error as one sentence naming our flags."""
        from .trl_settings import build_config, trl_error_message

        # bf16/fp16 that grpo_magic chose follow the device that trains, which may not be this one (a launch plan)
        kwargs = {**self.grpo_config_kwargs(), **{n: False for n in ("bf16", "fp16") if self.trl_settings.get(n) is None}}
        try:
            build_config(kwargs)
        except (ValueError, TypeError) as exc:
            return [("trl_settings", trl_error_message(exc, self))]
        return []

    def _cross_field_problems(self, processes: int) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        n = self.rl_num_generations
        per_step = self.batch_size * self.gradient_accumulation * processes
        if per_step % n:
            found.append(("batch_size", _divisibility_message(self.batch_size, self.gradient_accumulation, processes, n)))
        if self.use_vllm and self.vllm_mode == "server" and not self.vllm_server_url:
            found.append((
                "vllm_server_url",
                "vllm_mode server needs --vllm-server-url, the URL of a running server "
                "(start one with: trl vllm-serve --model MODEL); or use --vllm-mode colocate.",
            ))
        if self.load_in_4bit:
            from grpo_magic.models import four_bit_problem

            if problem := four_bit_problem(self.peft, use_vllm=self.use_vllm):
                found.append(("load_in_4bit", problem))
        watched = watch_names(self.watch)
        if watched is not None and "eval" in watched and self.eval_steps is None:
            found.append(("watch", "watch (--watch) names eval, the in-run evaluation, but no --eval-steps is set; "
                                   "add --eval-steps 20, say, or watch a score component instead."))
        if watched is None and self.on_alarm == "stop":
            found.append(("on_alarm", "on_alarm (--on-alarm) stop needs the watch, and --watch none turns it off; "
                                      "drop --watch none, or use --on-alarm warn."))
        if (self.rl_env_module is None) != (self.rl_env_class is None):
            missing = "rl_env_class (--rl-env-class)" if self.rl_env_class is None else "rl_env_module (--rl-env-module)"
            given = "--rl-env-module" if self.rl_env_class is None else "--rl-env-class"
            found.append((missing.split()[0], f"{missing} is required together with {given}; give both, e.g. --rl-env-module my_envs.hotel_env --rl-env-class HotelEnv."))
        return found

    def validate(self, processes: int | None = None) -> GRPOParams:
        """Raise ``GRPOMagicError`` with the first problem; return self when all is well."""
        problems = self.problems(processes)
        if problems:
            raise GRPOMagicError(problems[0][1])
        return self

    @property
    def env_config(self) -> dict[str, Any]:
        return json.loads(self.rl_env_config) if self.rl_env_config else {}

    # ---------------------------------------------------------------- export

    def to_cli_args(self, *, include_defaults: bool = False) -> list[str]:
        """The ``grpo-magic train`` flags that reproduce these params (defaults left out)."""
        args: list[str] = []
        for f in self.fields():
            value = getattr(self, f.name)
            if not include_defaults and value == self._baseline(f) and f.name != "recipe":
                continue
            flag = self.flag(f.name)
            if self.field_type(f.name) is bool:
                args.append(flag if value else "--no-" + flag[2:])
            elif value is not None:
                args += [flag, str(value)]
        for name, value in self.trl_settings.items():
            if value == self.recipe_value(name) or value is None:
                continue
            flag = self.flag(name)
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            else:
                args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
        return args

    def to_command(self, program: str = "grpo-magic train") -> str:
        """The shell command of these params; access tokens (in rl_env_config, say) are redacted."""
        from grpo_magic.redaction import redact

        return redact(" ".join([program, *(shlex.quote(a) for a in self.to_cli_args())]))

    def to_grpo_config(self, output_dir: str | None = None, **overrides: Any):
        """Map to ``trl.GRPOConfig`` (docs/architecture.md, "Parameters"); ``overrides`` win."""
        from trl import GRPOConfig

        return GRPOConfig(**self.grpo_config_kwargs(output_dir, **overrides))

    def grpo_config_kwargs(self, output_dir: str | None = None, **overrides: Any) -> dict[str, Any]:
        """The ``GRPOConfig`` keyword arguments of these params, without building the config.

        Building a ``TrainingArguments`` resets accelerate's process state, which a run training in
        this process needs: readers of a run's settings (``rescore``) use these instead.
        """
        from .config_kwargs import grpo_config_kwargs

        return grpo_config_kwargs(self, output_dir, overrides)

    def trl_differences(self) -> dict[str, Any]:
        """Every ``GRPOConfig`` setting of this run that differs from TRL's default (what the run log and the
        dashboard header say). grpo_magic's own settings (output folder, logging) are left out."""
        from .trl_settings import OWNED, config_defaults

        defaults = config_defaults()
        kwargs = self.grpo_config_kwargs()
        return {k: v for k, v in kwargs.items()
                if k not in OWNED and k in defaults and _differs(v, defaults[k])}

    def eval_config_kwargs(self) -> dict[str, Any]:
        """TRL's eval loop for ``--eval-steps``: at the start, every ``eval_steps`` (and at the end, by our callback).

        ``eval_samples`` completions a prompt (``num_generations_eval``), in batches of about as many
        completions as a training step generates (whole groups), so that evaluation fits where training does.
        """
        prompts = max(1, math.ceil(self.batch_size / self.eval_samples))
        return dict(eval_strategy="steps", eval_steps=self.eval_steps, eval_on_start=True,
                    num_generations_eval=self.eval_samples, per_device_eval_batch_size=self.eval_samples * prompts)

    def precision(self, device: int | None = None) -> str:
        """bf16, fp16 or fp32 for this run on this (or that CUDA) device: ``device.choose_precision``, the one decision.

        An explicit TRL ``bf16``/``fp16`` setting (in ``trl_settings`` where that bag of TRL fields
        exists) wins over the automatic choice.
        """
        from grpo_magic.runtime.device import choose_precision

        explicit = self.__dict__.get("trl_settings") or {}
        return choose_precision(explicit.get("bf16"), explicit.get("fp16"), device=device)


_UNSET: Any = object()

#: ``--watch none``: no reward-hacking watch for the run.
WATCH_OFF = "none"


def watch_names(value: str | None) -> tuple[str, ...] | None:
    """``--watch``'s task metric names: None for ``none`` (no watch), ``()`` for empty (the env's own)."""
    if value is None or not value.strip():
        return ()
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    return None if names == (WATCH_OFF,) else names


def _metric_names_problem(value: str, label: str) -> str | None:
    names = [n.strip() for n in value.split(",")]
    bad = next((n for n in names if not n or not all(c.isalnum() or c in "_-./" for c in n)), None)
    if bad is not None:
        return (f"{label} must be metric names separated by commas, got {value!r}; use e.g. --watch task or "
                "--watch task,valid (the env's score components), eval, or none.")
    if WATCH_OFF in names and len(names) > 1:
        return f"{label} cannot name none together with metrics, got {value!r}; use --watch none alone to turn it off."
    return None


def _differs(value: Any, default: Any) -> bool:
    if isinstance(default, list) and not default and value in ([], None, "none"):
        return False
    return value != default


@functools.cache
def _explicit_by_trl() -> dict[str, str]:
    """TRL name -> the ``GRPOParams`` field that sets it (``trl`` metadata); no trl import."""
    return {f.metadata["trl"]: f.name for f in GRPOParams.fields() if f.metadata.get("trl")}


def _route(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments as (declared fields, derived TRL settings) (``trl_settings.route``)."""
    return _trl_settings.route(kwargs, [f.name for f in GRPOParams.fields()], GRPOParams.flag)


def _apply_recipe(explicit: dict[str, Any], trl: dict[str, Any]) -> None:
    """Fill what a recipe sets and the user did not (explicit settings win)."""
    recipe = RECIPES.get(explicit.get("recipe")) if isinstance(explicit.get("recipe"), str) else None
    if recipe is None:
        return
    by_trl = _explicit_by_trl()
    for name, value in recipe.settings.items():
        if name in by_trl:
            explicit.setdefault(by_trl[name], value)
        else:
            trl.setdefault(name, value)


_trl_settings.EXPLICIT.update(_explicit_by_trl())
# help(GRPOParams) and editors show the declared parameters as keywords, and **trl_settings for TRL's other ones.
GRPOParams.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type,
                       default=f.default if f.default is not dataclasses.MISSING else f.default_factory())  # type: ignore[misc]
     for f in GRPOParams.fields()]
    + [inspect.Parameter("trl_settings", inspect.Parameter.VAR_KEYWORD)]
)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` once per class: it evaluates every annotation, and validation asks per field."""
    return typing.get_type_hints(cls)


def _divisibility_message(batch_size: int, accumulation: int, processes: int, n: int) -> str:
    per_step = batch_size * accumulation * processes
    # Batch sizes that work are the multiples of n / gcd(n, accumulation x processes): take the two
    # nearest by arithmetic, so that an absurd batch size is answered at once.
    unit = n // math.gcd(n, accumulation * processes)
    near = batch_size // unit
    good_batches = [k * unit for k in range(max(1, near - 1), near + 3)]
    good_batches = sorted(good_batches, key=lambda b: (abs(b - batch_size), b))[:2]
    good_gens = [g for g in range(2, min(per_step, 4096) + 1) if per_step % g == 0][:4]
    parts = f"batch_size {batch_size} x gradient_accumulation {accumulation}"
    if processes > 1:
        parts += f" x {processes} processes"
    fix = f"use --batch-size {' or '.join(str(b) for b in sorted(good_batches))}"
    if good_gens:
        fix += f", or --rl-num-generations {', '.join(str(g) for g in good_gens)}"
    return (
        f"{parts} = {per_step} completions per step, which is not divisible by rl_num_generations {n} "
        f"(each prompt needs a whole group); {fix}."
    )
