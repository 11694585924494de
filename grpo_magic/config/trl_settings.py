"""Every other setting of TRL's ``GRPOConfig``, derived from the installed TRL's dataclass at run time.

``GRPOParams`` declares the original description's parameters; each that sets a ``GRPOConfig``
field names it in its metadata (``trl="beta"``). Every other field of the installed ``GRPOConfig``
(its own and those it inherits from ``TrainingArguments``) becomes a setting here: its type, its
default, its choices and its help text are TRL's, read from ``dataclasses.fields(GRPOConfig)``, so a
new TRL release brings its new fields with it. Nothing is a hand-kept copy, except two short lists
that are ours by nature: the settings grpo_magic owns (``OWNED``, each with the parameter to use
instead) and the CLI-group of a setting (``_GROUPS``, name patterns).

Importing this module is light; ``settings()`` imports trl the first time it is called.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import numbers
import re
import threading
import types
import typing
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .json_config import parse_json

#: Settings grpo_magic itself must own, and the sentence's fix: what to use instead.
OWNED: dict[str, str] = {
    "output_dir": "use project_name (--project-name), the run's folder",
    "logging_dir": "grpo_magic writes the run log into the project folder; use project_name (--project-name)",
    "logging_strategy": "grpo_magic logs every logging_steps steps for its run log; use logging_steps (--logging-steps)",
    "save_strategy": "grpo_magic saves every save_steps steps and when a run stops; use save_steps (--save-steps)",
    "run_name": "the run is named by project_name (--project-name)",
    "log_completions": "grpo_magic keeps every completion in the run log and the dashboard already (run.completions)",
    "log_completions_hub_repo": "grpo_magic keeps every completion in the run log (events.jsonl in the project folder)",
    "num_completions_to_print": "grpo_magic shows completions on the dashboard and in the run log",
    "log_unique_prompts": "grpo_magic shows completions on the dashboard and in the run log",
    "disable_tqdm": "grpo_magic prints its own progress (--quiet prints only the final line)",
    "resume_from_checkpoint": "use resume (--resume), which also checks the checkpoint's parameters",
    "do_train": "grpo_magic always trains",
    "do_predict": "grpo_magic trains; evaluate a run with its env instead",
    "local_rank": "the launcher sets it; use --num-processes",
    "hub_token": "log in with `hf auth login` or set HF_TOKEN, so that no token is written into the run log",
    "deepspeed": "put DeepSpeed settings in an accelerate config and pass --accelerate-config FILE",
    "fsdp": "put FSDP settings in an accelerate config and pass --accelerate-config FILE",
    "fsdp_config": "put FSDP settings in an accelerate config and pass --accelerate-config FILE",
    "vllm_server_host": "use vllm_server_url (--vllm-server-url)",
    "vllm_server_port": "use vllm_server_url (--vllm-server-url); --vllm-server-port is the port of the server grpo-magic starts",
    "vllm_server_timeout": "grpo-magic waits for the server it starts itself (--vllm-server-timeout)",
    "remove_unused_columns": "grpo_magic passes the env's dataset columns to score_episode and needs them kept",
}

#: Settings transformers renamed, as (old name, new name). transformers 5.17's ``TrainingArguments`` has only the
#: old names; 5.24 has the new ones, with the old kept as deprecated aliases. Both names are accepted everywhere.
RENAMED: tuple[tuple[str, str], ...] = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)


def aliases_for(field_names: Iterable[str]) -> dict[str, str]:
    """alias -> setting for a ``GRPOConfig`` with these fields: the setting is the name that exists (the new one
    when both do), the other name its alias; a pair with neither name is left out."""
    names = set(field_names)
    out: dict[str, str] = {}
    for old, new in RENAMED:
        if new in names:
            out[old] = new
        elif old in names:
            out[new] = old
    return out


class _InstalledAliases(Mapping[str, str]):
    """``aliases_for`` the installed ``GRPOConfig``, read on first use (importing this module stays light)."""

    def _data(self) -> dict[str, str]:
        return _installed_aliases()

    def __getitem__(self, name: str) -> str:
        return self._data()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def __repr__(self) -> str:
        return repr(self._data())


#: Other names of a setting (alias -> setting), derived from the installed ``TrainingArguments`` (``aliases_for``).
ALIASES: Mapping[str, str] = _InstalledAliases()

#: Settings whose unset value means "chosen for this machine by grpo_magic" rather than TRL's default.
AUTO: dict[str, str] = {
    "bf16": "empty: chosen for the device (bf16 where the hardware has it)",
    "fp16": "empty: chosen for the device (fp16 on a GPU without bf16)",
    "dataloader_pin_memory": "empty: pinned on a CUDA machine only",
}

#: The CLI and form groups of the derived settings: the first pattern that matches a name wins.
_GROUPS: tuple[tuple[str, str], ...] = (
    (
        "TRL: loss",
        r"^(beta|epsilon|delta|loss_type|scale_rewards|importance_sampling|num_iterations|sapo_|vespo_|"
        r"reward_weights|multi_objective|mask_truncated|top_entropy|entropy|use_adaptive_entropy|"
        r"off_policy|use_bias_correction|sync_ref|ref_model|cast_lm_head|router_aux|disable_dropout)",
    ),
    (
        "TRL: generation",
        r"^(num_generations|generation_|steps_per_generation|max_completion|temperature|top_|min_p|"
        r"repetition|cache_impl|chat_template|use_transformers|transformers_|shuffle|pad_to|ds3_|"
        r"max_tool|trust_remote)",
    ),
    ("TRL: vLLM", r"^vllm_"),
    (
        "TRL: evaluation",
        r"(^eval_|_eval$|^per_device_eval|^prediction|^batch_eval|^include_for|^do_eval|"
        r"^metric_for|^greater_is|^load_best|num_generations_eval)",
    ),
    (
        "TRL: optimizer and schedule",
        r"^(optim|adam|lr_|learning|warmup|weight_decay|max_grad|label_smooth|"
        r"average_tokens)",
    ),
    (
        "TRL: memory and speed",
        r"^(bf16|fp16|tf32|activation_|gradient_checkpointing|torch_|use_liger|liger|use_cache|model_init|"
        r"neftune|auto_find|dataloader|ddp_|parallelism|accelerator|use_cpu|jit|"
        r"enable_jit|skip_memory|full_determinism|data_seed|train_sampling|length_column|"
        r"label_names|debug)",
    ),
    ("TRL: saving and hub", r"^(save_|hub_|push_|ignore_data|restore_callback)"),
    ("TRL: logging", r".*"),
)


@dataclass(frozen=True)
class Setting:
    """One derived ``GRPOConfig`` setting, as TRL declares it."""

    name: str
    kinds: tuple[type, ...]  # the plain types a value may have (bool, int, float, str, dict, list)
    optional: bool  # None is a value
    default: Any  # TRL's default (None for an AUTO setting: grpo_magic chooses)
    help: str
    choices: tuple[str, ...] | None
    group: str
    own: bool  # GRPOConfig's own field, not TrainingArguments'

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def kind(self) -> type:
        """The type a command-line value is read as (JSON text for dicts and lists)."""
        if str in self.kinds and len(self.kinds) > 1:
            return str  # "auto" or 8: the text as typed, which TRL reads itself (pad_to_multiple_of)
        for kind in (bool, float, int, str, dict, list):
            if kind in self.kinds:
                return kind
        return str

    @property
    def is_json(self) -> bool:
        return dict in self.kinds or list in self.kinds

    def _check_kind(self, value: Any, label: str) -> str | None:
        if value is None:
            if self.optional:
                return None
            return f"{label} cannot be empty; pass a value or leave it out (TRL's default is {self.default!r})."
        closed = self.choices is not None and self.kinds == (str,)
        if closed and value not in self.choices:
            return f"{label} must be one of {', '.join(self.choices)} (TRL's choices), not {value!r}; use one of them."
        if isinstance(value, bool):
            if bool in self.kinds or closed:
                return None
        elif isinstance(value, numbers.Integral) and (int in self.kinds or float in self.kinds):
            return None
        elif isinstance(value, numbers.Real) and float in self.kinds:
            if value != value or value in (float("inf"), float("-inf")):
                return f"{label} must be a finite number, got {value!r}; pass a finite number."
            return None
        elif isinstance(value, str) and str in self.kinds:
            if self._json_text(value):
                return self._read_json(value, label)[1]
            return None
        elif isinstance(value, (dict, list, str)) and (dict in self.kinds or list in self.kinds):
            parsed = value
            if isinstance(value, str):
                parsed, problem = self._read_json(value, label)
                if problem:
                    return problem
            if (dict in self.kinds and isinstance(parsed, dict)) or (list in self.kinds and isinstance(parsed, list)):
                return None
        return f"{label} must be {self._kind_words()}, got {value!r}; e.g. {self.flag} {self._example()}."

    def check(self, value: Any, label: str) -> str | None:
        """The problem with a value of this setting, and its fix, in one sentence, or None."""
        problem = self._check_kind(value, label)
        if problem is None and self.name in VALUE_CHECKS and value is not None:
            return VALUE_CHECKS[self.name](self.parse(value) if isinstance(value, str) else value, label)
        return problem

    def _read_json(self, value: str, label: str) -> tuple[Any, str | None]:
        """JSON text read as ``json_config`` reads env configs: too deep or too long is one sentence, not a traceback."""
        return parse_json(value, label, example=f"{self.flag} '{self._example()}'",
                          data_fix="pass a smaller value")

    def _kind_words(self) -> str:
        words = {
            bool: "true or false",
            int: "an integer",
            float: "a number",
            str: "text",
            dict: "a JSON object",
            list: "a JSON list",
        }
        return " or ".join(dict.fromkeys(words[k] for k in self.kinds))

    def _example(self) -> str:
        if self.choices:
            return self.choices[0]
        if self.default not in (None, "") and not isinstance(self.default, bool):
            return json.dumps(self.default) if self.is_json else str(self.default)
        if self.name in EXAMPLES:
            return EXAMPLES[self.name]
        if self.is_json:  # a JSON setting that also takes text (dict | str): its JSON form is the one to show
            return "{}" if dict in self.kinds else "[]"
        return {dict: "{}", list: "[]", int: "1", float: "1.0", bool: "", str: "VALUE"}[self.kind]

    def _json_text(self, value: Any) -> bool:
        """Text that TRL takes as a JSON object or list (a setting typed ``dict | str`` also takes plain text)."""
        return self.is_json and isinstance(value, str) and value.strip()[:1] in ("{", "[")

    def parse(self, value: Any) -> Any:
        """A checked value as TRL takes it: JSON text as the object it writes."""
        return json.loads(value) if self._json_text(value) else value


#: ``from_pretrained`` keywords that grpo_magic sets from its own parameters, with the parameter to use instead.
MODEL_INIT_OWNED: dict[str, str] = {
    "quantization_config": "use --load-in-4bit (with --peft) for QLoRA's 4-bit loading",
    "revision": "the tokenizer would not follow it; pass a local folder of that revision as --model",
}
#: The dtypes TRL's ``create_model_from_path`` takes as text (it builds the reference model from the same keywords).
MODEL_INIT_DTYPES = ("auto", "bfloat16", "float16", "float32")
#: A value to show in a setting's messages where TRL's default says nothing.
EXAMPLES: dict[str, str] = {"model_init_kwargs": '{"attn_implementation": "sdpa", "dtype": "bfloat16"}'}
_MODEL_INIT_EXAMPLE = f"--model-init-kwargs '{EXAMPLES['model_init_kwargs']}'"


def model_init_kwargs_problem(value: Any, label: str) -> str | None:
    """What is wrong with a ``model_init_kwargs`` value (the keywords of the policy's ``from_pretrained``), or None.

    Plain text passes the generic check of a ``dict | str`` field, so the JSON object is asked for here.
    """
    if not isinstance(value, dict):
        return f"{label} must be a JSON object of from_pretrained's keywords, got {value!r}; e.g. {_MODEL_INIT_EXAMPLE}."
    for key in value:
        if key in MODEL_INIT_OWNED:
            return f"{label} cannot set {key}: {MODEL_INIT_OWNED[key]}."
    dtype = value.get("dtype")
    if dtype is not None and dtype not in MODEL_INIT_DTYPES:
        return (f"{label} has dtype {dtype!r}, which TRL does not load; use one of {', '.join(MODEL_INIT_DTYPES)}, "
                f"e.g. {_MODEL_INIT_EXAMPLE}.")
    return None


#: Checks of a setting's value beyond its type (name -> check(parsed value, label)).
VALUE_CHECKS: dict[str, Any] = {"model_init_kwargs": model_init_kwargs_problem}


def _plain_kinds(hint: Any) -> tuple[tuple[type, ...], bool, tuple[str, ...] | None, bool]:
    """(plain types, optional, enum/Literal choices, settable) of a field's annotation."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    kinds: list[type] = []
    choices: list[str] = []
    optional = False
    settable = True
    for arg in args:
        if arg is type(None) or arg is None:
            optional = True
        elif typing.get_origin(arg) is typing.Literal:
            for v in typing.get_args(arg):
                if isinstance(v, bool):
                    kinds.append(bool)
                else:
                    choices.append(str(v))
                    kinds.append(str)
        elif isinstance(arg, type) and issubclass(arg, enum.Enum):
            choices += [str(m.value) for m in arg]
            kinds.append(str)
        elif arg in (bool, int, float, str):
            kinds.append(arg)
        elif arg is dict or typing.get_origin(arg) is dict:
            kinds.append(dict)
        elif arg is list or typing.get_origin(arg) is list:
            kinds.append(list)
        else:  # a class such as accelerate's ParallelismConfig: not a value a flag or a form can hold
            settable = False
    return tuple(dict.fromkeys(kinds)), optional, tuple(dict.fromkeys(choices)) or None, settable and bool(kinds)


_QUOTED = re.compile(r"(?<![=\w])[`'\"]+([a-z][a-z0-9_]*)[`'\"]+")


def _help_choices(help_text: str, default: Any) -> tuple[str, ...] | None:
    """The values a text field's help lists ("Supported values are 'a', 'b'"), when its default is one of them.

    TRL 1.16 declares some closed sets only in help text and checks them in the trainer (scale_rewards,
    loss_type, importance_sampling_level); reading them here lets a bad value be refused before a model
    loads. The default must be among them, a check that the text was read right.
    """
    if not isinstance(default, str) or not re.search(
        r"(?i)supported (values|options)|must be one of|options:|"
        r"either|at the .* or .* level|one of",
        help_text,
    ):
        return None
    fields = {f.name for f in config_fields()}  # `use_vllm` in a sentence is a field, not a value
    found = tuple(dict.fromkeys(v for v in _QUOTED.findall(help_text) if v not in fields))
    return found if default in found and len(found) >= 2 else None


def _group(name: str) -> str:
    return next(group for group, pattern in _GROUPS if re.search(pattern, name))


@functools.cache
def config_fields() -> tuple[dataclasses.Field, ...]:
    """The installed ``GRPOConfig``'s fields, in declaration order."""
    from trl import GRPOConfig

    return tuple(dataclasses.fields(GRPOConfig))


@functools.cache
def _installed_aliases() -> dict[str, str]:
    return aliases_for(f.name for f in config_fields())


@functools.cache
def _hints() -> dict[str, Any]:
    from transformers import TrainingArguments
    from trl import GRPOConfig

    return {**typing.get_type_hints(TrainingArguments), **typing.get_type_hints(GRPOConfig)}


@functools.cache
def _own_names() -> frozenset[str]:
    from transformers import TrainingArguments

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    return frozenset(f.name for f in config_fields() if f.name not in inherited)


#: ``GRPOConfig`` field -> the ``GRPOParams`` field that sets it (its ``trl`` metadata); filled by ``params``.
EXPLICIT: dict[str, str] = {}


def explicit_names() -> dict[str, str]:
    return EXPLICIT


@functools.cache
def unsettable() -> dict[str, str]:
    """Fields no flag or form can hold (a class instance), with why."""
    out = {}
    for f in config_fields():
        if f.name in OWNED or f.name in ALIASES:
            continue
        if not f.init:
            out[f.name] = "not an argument of GRPOConfig"
            continue
        settable = _plain_kinds(_hints()[f.name])[3]
        if not settable:
            out[f.name] = f"its type ({_hints()[f.name]}) is an object, not a value; build GRPOConfig yourself for it"
    return out


def _make_setting(f: dataclasses.Field) -> Setting:
    kinds, optional, choices, _ = _plain_kinds(_hints()[f.name])
    help_text = str(f.metadata.get("help", "")).replace("%%", "%").strip()
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = None
    if isinstance(default, enum.Enum):
        default = default.value
    if "choices" in f.metadata and choices is None:
        choices = tuple(str(c) for c in f.metadata["choices"])
    if choices is None and kinds == (str,):
        choices = _help_choices(help_text, default)
    if f.name in AUTO:
        default, optional = None, True
        help_text = f"{help_text} ({AUTO[f.name]})"
    return Setting(f.name, kinds, optional, default, help_text, choices, _group(f.name), f.name in _own_names())


@functools.cache
def setting_of(name: str) -> Setting:
    """Any ``GRPOConfig`` field as a setting (a declared field's TRL choices, say)."""
    return _make_setting(next(f for f in config_fields() if f.name == name))


@functools.cache
def settings() -> dict[str, Setting]:
    """Every derived setting, by name, in ``GRPOConfig``'s order (explicit, owned, alias, unsettable skipped)."""
    skip = set(explicit_names()) | set(OWNED) | set(ALIASES) | set(unsettable())
    return {f.name: setting_of(f.name) for f in config_fields() if f.name not in skip}


@functools.cache
def config_defaults() -> dict[str, Any]:
    """TRL's default of every field, as its dataclass declares it (enums as their values)."""
    out = {}
    for f in config_fields():
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default.value if isinstance(f.default, enum.Enum) else f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


_BUILD_LOCK = threading.Lock()


def build_config(kwargs: dict[str, Any]) -> Any:
    """``GRPOConfig(**kwargs)`` as TRL builds it, without resetting accelerate's state.

    Building a ``TrainingArguments`` resets accelerate's process state (``AcceleratorState._reset_state``)
    unless ``accelerator_config={"use_configured_state": True}`` asks it to use the state there is; a run
    training in this process (or one that trained) needs that state, so a check built here uses it.
    """
    from trl import GRPOConfig

    from grpo_magic.trl_compat import accelerate_state_exists

    kwargs = dict(kwargs)
    with _BUILD_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if accelerate_state_exists():  # set up already, so keep it
            config = dict(kwargs.get("accelerator_config") or {})
            kwargs["accelerator_config"] = {**config, "use_configured_state": True}
        return GRPOConfig(**kwargs)


def trl_error_message(exc: BaseException, params: Any) -> str:
    """TRL's error as one sentence that names our flags for the settings it names, and the fix."""
    text = re.sub(r"\.\s+(?=[A-Z])", "; ", " ".join(str(exc).split())).rstrip(".")  # one sentence
    by_trl = explicit_names()
    named = [f.name for f in config_fields() if re.search(rf"(?<![\w]){re.escape(f.name)}(?![\w])", text)]
    flags = list(dict.fromkeys("--" + by_trl.get(n, n).replace("_", "-") for n in named if n not in OWNED))
    fix = f"change {' or '.join(flags)}" if flags else "change the settings it names"
    if "bf16" in text and "support" in text:
        fix = "leave --bf16 out (grpo_magic chooses it for the device) or pass --no-bf16"
    return f"TRL's GRPOConfig rejects these settings: {text}; {fix}."


def groups() -> list[str]:
    """The derived settings' groups, in display order."""
    present = {s.group for s in settings().values()}
    return [g for g, _ in _GROUPS if g in present]


def owned_message(name: str) -> str:
    return f"{name} is a setting grpo_magic owns, not one to pass through to TRL; {OWNED[name]}."


def resolve_name(name: str) -> str:
    """The setting a user's name means (an alias's new name), or the name itself."""
    return ALIASES.get(name, name)


def _alias_kind(alias: str) -> str:
    """"old" for a deprecated name, "new" for the name a newer transformers gives a setting this one lacks."""
    return "new" if any(alias == new for _, new in RENAMED) else "old"


def unknown_message(name: str, known: list[str]) -> str:
    import difflib

    near = difflib.get_close_matches(name, [*known, *settings()], n=2)
    hint = (
        f"use {' or '.join(repr(n) for n in near)}"
        if near
        else "use a name that help(GRPOParams) or grpo-magic train --help lists"
    )
    return f"Unknown parameter {name!r}: neither a GRPOParams field nor a setting of TRL's GRPOConfig; {hint}."


def route(kwargs: dict[str, Any], names: list[str], flag: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments as (declared fields, derived TRL settings): a TRL name of a declared field becomes that
    field; naming one setting twice, a setting grpo_magic owns, or an unknown name is one sentence."""
    from grpo_magic.errors import GRPOMagicError

    explicit = {k: v for k, v in kwargs.items() if k in names}
    if not isinstance(kwargs.get("trl_settings") or {}, dict):
        raise GRPOMagicError(
            "trl_settings must be a dict of GRPOConfig settings; pass them as keywords instead, e.g. scale_rewards='none'."
        )
    trl: dict[str, Any] = dict(kwargs.get("trl_settings") or {})
    extra = {k: v for k, v in kwargs.items() if k not in names and k != "trl_settings"}
    given_as: dict[str, str] = {name: name for name in trl}  # setting -> the name it was given by
    for given, value in extra.items():
        name = resolve_name(given)
        label = f"{given} (--{given.replace('_', '-')})"
        if name in EXPLICIT:
            ours = EXPLICIT[name]
            if ours in explicit:
                raise GRPOMagicError(
                    f"{ours} ({flag(ours)}) and {label} are the same setting (GRPOConfig's {name}); "
                    f"keep one of them: use only {flag(ours)}."
                )
            explicit[ours] = value
        elif name in OWNED:
            raise GRPOMagicError(owned_message(name))
        elif name in settings():
            if given_as.get(name, given) != given:  # in either order: the alias first, or the setting's own name
                alias = given if given != name else given_as[name]
                raise GRPOMagicError(
                    f"{name} (--{name.replace('_', '-')}) and {alias} (--{alias.replace('_', '-')}) are the same "
                    f"setting ({alias} is its {_alias_kind(alias)} name); use only --{name.replace('_', '-')}."
                )
            given_as[name] = given
            trl[name] = value
        elif name in unsettable():
            raise GRPOMagicError(f"{name} cannot be set by grpo_magic: {unsettable()[name]}.")
        else:
            raise GRPOMagicError(unknown_message(given, sorted(names)))
    return explicit, trl
