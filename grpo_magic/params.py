"""Every training parameter, declared once.

Each ``GRPOParams`` field carries its CLI help, its form section and its valid range in the
field metadata (as TRL's ``GRPOConfig`` does with ``help``). The CLI flags, the notebook form,
validation and the exported command are all generated from these declarations, so adding a
field here adds it everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import shlex
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

from .distributed import world_size
from .errors import GRPOMagicError
from .text import finite, show

#: Form sections, in display order.
GROUPS = ("Model", "Environment", "GRPO", "Generation", "Optimization", "LoRA", "vLLM", "Output")

#: ``grpo-magic train``'s output folder when no --project-name is given: the seed's, so that a script run again
#: or ``--resume`` finds its folder. Elsewhere no project_name means a new folder per run (``folders``).
CLI_PROJECT_NAME = "grpo-run"

LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo")


def _p(default: Any, help: str, group: str, **meta: Any) -> Any:
    """A parameter: its default, its help text, its form section and its checks.

    Checks in ``meta``: ``ge``/``gt``/``le``/``lt`` bounds, ``choices``, ``required``,
    ``json_object`` (a JSON object string), ``url`` (an http(s) URL), ``path`` (a usable folder
    name), ``why`` (a hint added to range errors). ``checkpoint``: a checkpoint fixes it, so a
    resumed run must use the checkpoint's value (``resume``).
    """
    return field(default=default, metadata={"help": help, "group": group, **meta})


@dataclass
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
        "Environment", ge=1, why="an agent episode needs at least one round of tool calls",
    )
    rl_max_error_rate: float = _p(
        0.5, "Share of a step's episodes that may fail before the run stops (1 never stops).", "Environment",
        ge=0, le=1,
    )

    # GRPO
    rl_num_generations: int = _p(
        4, "Completions sampled per prompt; GRPO compares them within the group.", "GRPO", ge=2,
        why="GRPO needs at least two completions of a prompt to compare", checkpoint=True,
    )
    rl_kl_coef: float = _p(0.1, "KL penalty against the reference model (beta in GRPOConfig).", "GRPO", ge=0)
    rl_clip_range: float = _p(0.2, "Clipping range of the policy ratio (epsilon in GRPOConfig).", "GRPO", gt=0)
    rl_loss_type: str = _p("dapo", "Loss aggregation of TRL's GRPOTrainer (loss_type).", "GRPO", choices=LOSS_TYPES)

    # Generation
    rl_max_new_tokens: int = _p(128, "Most tokens generated per completion.", "Generation", ge=1)
    rl_temperature: float = _p(1.0, "Sampling temperature.", "Generation", gt=0)
    rl_top_k: int = _p(50, "Top-k sampling (0 disables it).", "Generation", ge=0)
    rl_top_p: float = _p(1.0, "Top-p (nucleus) sampling, in (0, 1].", "Generation", gt=0, le=1)

    # Optimization
    epochs: int = _p(1, "Passes over the environment's dataset.", "Optimization", ge=1)
    max_steps: int | None = _p(None, "Stop after this many optimizer steps (empty: run all epochs).", "Optimization", ge=1)
    batch_size: int = _p(
        4, "Completions per device per step (per_device_train_batch_size); prompts per step = this / generations.",
        "Optimization", ge=1, checkpoint=True,
    )
    gradient_accumulation: int = _p(1, "Gradient accumulation steps.", "Optimization", ge=1, checkpoint=True)
    lr: float = _p(1e-5, "Learning rate.", "Optimization", gt=0, checkpoint=True)
    seed: int = _p(42, "Random seed.", "Optimization", ge=0, le=2**32 - 1, why="numpy seeds are 32-bit",
                   checkpoint=True)

    # LoRA
    peft: bool = _p(False, "Train LoRA adapters (PEFT) instead of every weight.", "LoRA", checkpoint=True)
    lora_r: int = _p(16, "LoRA rank.", "LoRA", ge=1, checkpoint=True)
    lora_alpha: int = _p(32, "LoRA alpha (scaling).", "LoRA", ge=1, checkpoint=True)

    # vLLM
    use_vllm: bool = _p(False, "Generate with vLLM (needs a GPU and pip install grpo-magic[vllm]).", "vLLM")
    vllm_mode: str = _p(
        "colocate", "colocate: vLLM shares the training GPUs; server: vLLM runs on its own GPUs.", "vLLM",
        choices=("colocate", "server"),
    )
    vllm_gpu_memory_utilization: float = _p(
        0.3, "Share of GPU memory for vLLM in colocate mode, in (0, 1).", "vLLM", gt=0, lt=1,
    )
    vllm_server_url: str | None = _p(
        None, "URL of a running vLLM server (trl vllm-serve) in server mode, e.g. http://10.0.0.2:8000.", "vLLM",
        url=True,
    )
    vllm_tensor_parallel_size: int = _p(1, "GPUs for vLLM tensor parallelism.", "vLLM", ge=1)
    vllm_server_gpus: int = _p(
        1, "GPUs given to the vLLM server in server mode, taken from the training processes.", "vLLM", ge=1,
    )

    # Output
    logging_steps: int = _p(1, "Log metrics every this many steps.", "Output", ge=1)
    save_steps: int = _p(500, "Save a checkpoint every this many steps.", "Output", ge=1)
    report_to: str = _p(
        "none", "Experiment tracker to report to.", "Output", choices=("none", "trackio", "wandb", "tensorboard"),
    )
    push_to_hub: bool = _p(False, "Push the trained weights to the Hugging Face Hub at the end.", "Output")

    def __post_init__(self) -> None:
        # An empty string in an optional field means "not set", as validation reads it: store None,
        # so that no "" reaches the command line (--rl-episode-timeout '') or TRL.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) and value == "" and self.is_optional(f.name):
                setattr(self, f.name, None)

    # ---------------------------------------------------------------- introspection

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

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
        unknown = sorted(set(changes) - {f.name for f in self.fields()})
        if unknown:
            raise GRPOMagicError(f"Unknown parameter {unknown[0]!r}; {_known_names_fix(unknown[0])}.")
        return dataclasses.replace(self, **changes)

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
        if "choices" in meta and value not in meta["choices"]:
            choices = meta["choices"]
            fix = f"use {flag} {choices[0]}" if len(choices) == 1 else cls._use(name, "use one of them")
            return f"{label} must be one of {', '.join(choices)}, not {value!r}; {fix}."
        if meta.get("json_object"):
            parsed, problem = _parse_json(value, label)
            if problem:
                return problem
            if not isinstance(parsed, dict):
                return (f"{label} must be a JSON object, got {type(parsed).__name__}; write the constructor's keyword "
                        "arguments as one, such as '{\"max_turns\": 3}'.")
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
        if found:
            return found
        return self._cross_field_problems(processes or world_size())

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
            if not include_defaults and value == f.default:
                continue
            flag = self.flag(f.name)
            if self.field_type(f.name) is bool:
                args.append(flag if value else "--no-" + flag[2:])
            elif value is not None:
                args += [flag, str(value)]
        return args

    def to_command(self, program: str = "grpo-magic train") -> str:
        """The shell command of these params; access tokens (in rl_env_config, say) are redacted."""
        from .redaction import redact

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
        from .models import has_cuda, supports_bf16

        kwargs: dict[str, Any] = dict(
            output_dir=output_dir or self.project_name,
            num_generations=self.rl_num_generations,
            max_completion_length=self.rl_max_new_tokens,
            temperature=self.rl_temperature,
            top_k=self.rl_top_k,
            top_p=self.rl_top_p,
            beta=self.rl_kl_coef,
            epsilon=self.rl_clip_range,
            loss_type=self.rl_loss_type,
            max_tool_calling_iterations=self.rl_max_tool_turns,
            use_vllm=self.use_vllm,
            vllm_mode=self.vllm_mode,
            vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=self.vllm_tensor_parallel_size,
            num_train_epochs=self.epochs,
            max_steps=self.max_steps if self.max_steps is not None else -1,
            per_device_train_batch_size=self.batch_size,
            gradient_accumulation_steps=self.gradient_accumulation,
            learning_rate=self.lr,
            seed=self.seed,
            logging_steps=self.logging_steps,
            save_steps=self.save_steps,
            save_strategy="steps",
            report_to=[] if self.report_to == "none" else [self.report_to],
            push_to_hub=self.push_to_hub,
            bf16=supports_bf16(),
            dataloader_pin_memory=has_cuda(),  # pinning on a CPU-only machine only warns
            log_completions=False,
            disable_tqdm=True,
        )
        if self.vllm_server_url:
            kwargs["vllm_server_base_url"] = self.vllm_server_url
        kwargs.update(overrides)
        return kwargs


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


def _known_names_fix(name: str) -> str:
    """The fix for an unknown parameter name: the nearest field name, else where the names are listed."""
    import difflib

    near = difflib.get_close_matches(name, [f.name for f in GRPOParams.fields()], n=1)
    return f"use {near[0]!r}" if near else "use a GRPOParams field name (help(GRPOParams) lists them)"


#: The longest JSON config: it travels as one argument on the command line of launched processes (Linux takes at
#: most 128 KiB in one) and into the run log's first line.
MAX_JSON_CHARS = 100_000
#: The deepest nesting of a JSON config: past it, copying or writing the config recurses too deep.
MAX_JSON_DEPTH = 100
_DATA_FILE_FIX = ("put the data in a file that the env reads and pass its path in the config instead, such as "
                  "'{\"cases_file\": \"cases.json\"}'")


def _json_depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (a scalar is 0, ``[1]`` is 1), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _parse_json(value: str, label: str) -> tuple[Any, str | None]:
    """A JSON text parsed, or the one sentence that says why it cannot be: invalid, too long, too deep, a number too big."""
    if len(value) > MAX_JSON_CHARS:
        return None, (f"{label} is {len(value):,} characters long, more than the {MAX_JSON_CHARS:,} a config may have "
                      f"(it is passed on the command line of launched processes); {_DATA_FILE_FIX}.")
    too_deep = (f"{label} nests deeper than {MAX_JSON_DEPTH} levels of lists or objects; flatten it, or "
                f"{_DATA_FILE_FIX}.")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return None, (f"{label} is not valid JSON ({exc.msg} at character {exc.pos}); write a JSON object such as "
                      "'{\"max_turns\": 3}'.")
    except RecursionError:  # Python's parser recurses once per level
        return None, too_deep
    except ValueError:  # an int past Python's limit on the digits it reads (sys.get_int_max_str_digits)
        return None, (f"{label} holds a number of more than {sys.get_int_max_str_digits()} digits, too long to read; "
                      f"write it as a string, or {_DATA_FILE_FIX}.")
    if _json_depth(parsed) > MAX_JSON_DEPTH:
        return None, too_deep
    return parsed, None


def markdown_table() -> str:
    """The parameter table of the README, generated from the metadata (a test keeps them equal)."""
    rows = ["| parameter | CLI flag | default | section | what it does |", "|---|---|---|---|---|"]
    for f in GRPOParams.fields():
        default = "required" if f.metadata.get("required") else ("" if f.default is None else f"`{f.default}`")
        rows.append(f"| `{f.name}` | `{GRPOParams.flag(f.name)}` | {default} | {f.metadata['group']} | "
                    f"{f.metadata['help'].replace('|', '/')} |")
    return "\n".join(rows)


def params_from_dict(values: dict[str, Any]) -> GRPOParams:
    """Build params from a dict, naming an unknown key instead of raising ``TypeError``."""
    names = {f.name for f in GRPOParams.fields()}
    unknown = sorted(set(values) - names)
    if unknown:
        raise GRPOMagicError(f"Unknown parameter {unknown[0]!r}; {_known_names_fix(unknown[0])}.")
    return GRPOParams(**values)
