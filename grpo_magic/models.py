"""Finding, building and loading models and tokenizers.

Heavy libraries (torch, transformers, peft, tokenizers, huggingface_hub) are imported inside the
functions so that ``import grpo_magic`` and ``%load_ext grpo_magic`` stay light.

The ``tiny`` model is the offline demo and test model: the Hub cannot be reached everywhere, so it
is built here from random weights and a locally trained tokenizer, once, and cached on disk.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from grpo_magic.errors import GRPOMagicError

if TYPE_CHECKING:
    import peft

TINY = "tiny"

# Bump when anything about the tiny model changes, so stale caches are not reused.
TINY_VERSION = "tiny-v1"
_TINY_MARKER = "grpo_magic_tiny.json"

# Seconds to wait for the Hub before saying it cannot be reached.
_HUB_TIMEOUT = 5.0
_HUB_DEADLINE = 8.0

# The tiny model's shape: small enough that a GRPO step on 2 CPU cores takes well under a second.
_TINY_SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "initializer_range": 0.1,
}
_TINY_VOCAB = 1024
_TINY_SEED = 1234

_PAD, _IM_START, _IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
# Qwen2's pre-tokenizer split (transformers' `tokenization_qwen2.PRETOKENIZE_REGEX`).
_QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen2.5's chat template, verbatim (it is the one TRL ships as `qwen2_5.jinja`): being byte-for-byte
# identical lets TRL recognise it and enable its tool-calling support (response parsing) for `tiny`.
QWEN2_5_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

_build_lock = threading.Lock()


def cache_dir() -> pathlib.Path:
    """Where grpo_magic keeps what it builds: ``$GRPO_MAGIC_CACHE`` or ``~/.cache/grpo_magic``."""
    env = os.environ.get("GRPO_MAGIC_CACHE")
    base = pathlib.Path(env) if env else pathlib.Path("~/.cache/grpo_magic")
    return base.expanduser()


def _tiny_ready(path: pathlib.Path) -> bool:
    """The marker is written last, so its presence means the folder is complete."""
    return (path / _TINY_MARKER).is_file()


def tiny_model_path() -> pathlib.Path:
    """The folder of the offline ``tiny`` model, built on first use and reused after.

    The model is built in a temporary folder beside the final one and renamed into place, so
    processes building at the same time never see a half-written folder; the loser of the race
    discards its copy.
    """
    final = cache_dir() / TINY_VERSION
    if _tiny_ready(final):
        return final
    with _build_lock:
        if _tiny_ready(final):
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and not _tiny_ready(final):  # left incomplete by something else: rebuild it
            shutil.rmtree(final, ignore_errors=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{TINY_VERSION}.tmp-", dir=final.parent))
        try:
            _build_tiny(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            try:
                os.rename(tmp, final)
            except OSError:
                if not _tiny_ready(final):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _tiny_corpus(seed: int = 0) -> list[str]:
    """A small, generated training corpus for the tiny tokenizer.

    It mixes English-ish sentences, spelled-out letters, numbers, JSON and tool-call text so that
    the byte-level BPE learns merges for what demos and tests actually feed it.
    """
    rng = random.Random(seed)
    words = (
        "the a an and or of to in on for with is are was be it this that you he she we they "
        "what which how many much count letters letter word words number numbers answer question "
        "please give me tell find search book room rooms hotel city date night nights guest guests "
        "price cheap best free available call tool tools function result results user assistant "
        "system hello hi yes no true false null name arguments value list check in out first last "
        "one two three four five six seven eight nine ten apple banana cherry strawberry orange "
        "water weather today tomorrow time good bad more less than right wrong think step final "
        "reply json object key string integer array type properties required description"
    ).split()
    cities = ["Paris", "Madrid", "London", "Rome", "Berlin", "Tokyo", "Lima", "Oslo"]
    tools = ["search_rooms", "book_room", "get_weather", "count_letters", "calculator", "lookup"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    lines: list[str] = []
    for _ in range(3000):
        kind = rng.randrange(7)
        if kind in (0, 1):
            sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
            lines.append(sent.capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind == 2:
            word = rng.choice(words)
            letter = rng.choice(letters)
            lines.append(f"How many '{letter}' in \"{word}\"? {' '.join(word)} -> {word.count(letter)}")
        elif kind == 3:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            lines.append(f"{a} + {b} = {a + b}; {a} * {rng.randint(0, 9)}; 0.{rng.randint(0, 99)}")
        elif kind == 4:
            args = {"city": rng.choice(cities), "guests": rng.randint(1, 6), "nights": rng.randint(1, 9)}
            call = json.dumps({"name": rng.choice(tools), "arguments": args})
            lines.append(f"<tool_call>\n{call}\n</tool_call>")
        elif kind == 5:
            result = {"rooms": [{"id": rng.randint(1, 99), "price": rng.randint(40, 400)}]}
            lines.append(f"<tool_response>\n{json.dumps(result)}\n</tool_response>")
        else:
            schema = {
                "type": "function",
                "function": {
                    "name": rng.choice(tools),
                    "description": " ".join(rng.choice(words) for _ in range(6)),
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
            lines.append(f"<tools>\n{json.dumps(schema)}\n</tools>")
    lines.append(letters + " " + letters.upper() + " 0123456789 " + " ".join(letters))
    # The fixed text of the chat template, so that prompts with tools stay short in tokens.
    fixed = (
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\nYou are provided "
        "with function signatures within <tools></tools> XML tags:\n<tools>\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\n</tool_call>\nsystem\nuser\nassistant\n'
    )
    lines.extend([fixed] * 20)
    return lines


def _build_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained here, as a ``Qwen2Tokenizer`` with the Qwen2.5 template.

    It is trained with Qwen2's own normalizer and pre-tokenizer because ``AutoTokenizer`` loads
    any ``qwen2`` model's tokenizer as ``Qwen2Tokenizer``, which rebuilds that pipeline from the
    vocab and merges: training with another pipeline would tokenize differently after reloading.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB,
        min_frequency=2,
        special_tokens=[_PAD, _IM_START, _IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(merge) for merge in trained["merges"]],
        unk_token=None,
        eos_token=_IM_END,
        pad_token=_PAD,
        extra_special_tokens=[_IM_START],
        model_max_length=_TINY_SIZES["max_position_embeddings"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    # Not special, like Qwen2.5: tool-call tags must survive `skip_special_tokens=True` decoding.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in _TOOL_TOKENS])
    tokenizer.chat_template = QWEN2_5_CHAT_TEMPLATE
    return tokenizer


def _build_tiny(dest: pathlib.Path) -> None:
    """Build the tiny model and tokenizer into ``dest``, deterministically, marker last."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _build_tiny_tokenizer()
    pad_id = tokenizer.convert_tokens_to_ids(_PAD)
    eos_id = tokenizer.convert_tokens_to_ids(_IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        **_TINY_SIZES,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id],
        pad_token_id=pad_id,
        do_sample=True,
        temperature=1.0,
        top_k=50,
        top_p=1.0,
    )
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    info = {"name": TINY, "version": TINY_VERSION, "seed": _TINY_SEED, "vocab_size": len(tokenizer)}
    info.update(_TINY_SIZES)
    (dest / _TINY_MARKER).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


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
    if name == TINY:
        return str(tiny_model_path())
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
    """Accept ``tiny`` wherever a model name is taken."""
    return str(tiny_model_path()) if name_or_path == TINY else name_or_path


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


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def supports_bf16() -> bool:
    """bf16 only where the hardware has it: on CPU, TRL's default bf16 raises."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


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
        raise GRPOMagicError(f"Could not load the tokenizer of '{name_or_path}': {_first_line(exc)}") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
    return tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_model(
    name_or_path: str,
    *,
    peft: bool = False,
    lora_r: int = 16,
    lora_alpha: int = 32,
    trust_remote_code: bool = False,
    tokenizer: Any = None,
) -> Any:
    """Load the causal LM, in bf16 where the hardware supports it and float32 otherwise.

    Returns the plain model even when ``peft`` is set: TRL applies LoRA itself from the config
    made by ``lora_config`` (the ``peft``/``lora_*`` arguments are accepted for symmetry with the
    parameters and not used here). When ``tokenizer`` has more tokens than the model's embeddings
    (a pad token was added), the embeddings are resized.
    """
    del peft, lora_r, lora_alpha
    import torch
    from transformers import AutoModelForCausalLM

    path = _local_or_id(name_or_path)
    dtype = torch.bfloat16 if supports_bf16() else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise GRPOMagicError(f"Could not load model '{name_or_path}': {_first_line(exc)}") from exc
    if tokenizer is not None:
        embeddings = model.get_input_embeddings()
        if embeddings is not None and len(tokenizer) > embeddings.weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        if model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id
    return model


def _lora_target_modules(model: Any) -> list[str]:
    """Names of the linear layers inside the transformer blocks (attention and MLP).

    The output head and embeddings are left out, as PEFT's ``all-linear`` does. Conv1D covers
    GPT-2 style models, whose projections are not ``nn.Linear``.
    """
    import torch

    linear_types: tuple[type, ...] = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        linear_types += (Conv1D,)
    except ImportError:
        pass
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names: list[str] = []
    for full_name, module in model.named_modules():
        if not isinstance(module, linear_types) or module is output:
            continue
        leaf = full_name.rsplit(".", 1)[-1]
        if leaf in ("lm_head", "score", "classifier") or leaf in names:
            continue
        names.append(leaf)
    return names


def lora_config(lora_r: int, lora_alpha: int, model: Any = None) -> peft.LoraConfig:
    """The LoRA config TRL applies to the policy.

    Targets are the attention and MLP projections found in ``model`` (for Qwen2: q/k/v/o_proj and
    gate/up/down_proj), so that any architecture gets adapters without a per-model table; without
    a model, PEFT's ``all-linear`` does the same lookup later.
    """
    from peft import LoraConfig, TaskType

    targets: list[str] | str = "all-linear"
    if model is not None:
        targets = _lora_target_modules(model) or "all-linear"
    return LoraConfig(
        r=lora_r,
        lora_alpha=lora_alpha,
        lora_dropout=0.05,
        target_modules=targets,
        task_type=TaskType.CAUSAL_LM,
    )
