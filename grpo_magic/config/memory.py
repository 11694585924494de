"""Will it fit: the GPU memory a GRPO run needs, estimated before any model loads.

The parameter count comes from the model's ``config.json``, with the model built on PyTorch's meta
device (no weights are read or downloaded). The terms are the usual ones of training with AdamW, in
the precision the run would choose on that card (``device.choose_precision``: bf16 from compute capability
8.0, fp16 mixed precision on a T4): weights, gradients and optimizer state of what trains (all weights, or the LoRA adapters),
a frozen reference model when ``beta > 0``, the activations a backward pass keeps for
``generation batch x (prompt + completion)`` tokens (one layer's worth per sequence with activation
checkpointing), the logits as the installed TRL computes them (``logits_bytes``), and vLLM's share of the GPU
in colocate mode. ``bench/memory.py`` checks the terms against measurements on CPU (optimizer state bytes,
saved activations of a forward pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Cards to compare with, in GB (10^9 bytes, as the cards are sold).
CARDS: dict[str, float] = {"T4": 16, "L4": 24, "A100-40GB": 40, "A100-80GB": 80, "H100": 80}
#: Their CUDA compute capability: the precision a run would choose there (bf16 from 8.0, fp16 on a T4).
CAPABILITY: dict[str, tuple[int, int]] = {"T4": (7, 5), "L4": (8, 9), "A100-40GB": (8, 0), "A100-80GB": (8, 0),
                                          "H100": (9, 0)}
GB = 1e9


def activation_values_per_token_layer(config: Any) -> int:
    """Values a decoder layer keeps per token for backward: about 8 x hidden (norms, q/k/v/o inputs and outputs)
    plus 4 x intermediate (gate, up, activation, down input). bench/memory.py measures 19 x hidden on ``tiny``
    (hidden 64, intermediate 128) where this gives 16 x hidden."""
    h = config.hidden_size
    return 8 * h + 4 * getattr(config, "intermediate_size", 4 * h)


#: The logits tile TRL's fused LM head computes at a time, (tokens, vocabulary columns): ``TOKEN_CHUNK_SIZE`` of
#: ``trl/kernels/chunked_logprob.py`` and the ``chunk_size`` ``trl/trainer/utils.py`` passes it (TRL 1.16).
FUSED_TILE = (4096, 32768)
#: The first TRL whose GRPOTrainer patches the policy with ``add_fused_lm_head`` (log-probabilities in tiles).
FUSED_LM_HEAD_SINCE = "1.15"


def fused_lm_head_tile(version: str | None = None) -> tuple[int, int] | None:
    """The logits tile of the installed TRL (or of ``version``), or None for a TRL that builds the whole
    ``tokens x vocab`` logits (before 1.15)."""
    from importlib.metadata import version as installed

    from packaging.version import Version

    return FUSED_TILE if Version(version or installed("trl")) >= Version(FUSED_LM_HEAD_SINCE) else None


def logits_bytes(config: Any, *, sequences: int, prompt_tokens: int, completion_tokens: int, compute_bytes: int,
                 gpu: bool, head_trains: bool, tile: tuple[int, int] | None) -> float:
    """The memory of the log-probabilities' LM head, as the installed TRL computes them (``fused_lm_head_tile``).

    TRL >= 1.15 never builds the ``tokens x vocab`` logits: one ``[tile tokens, tile columns]`` tile in the compute
    dtype at a time (reused for every tile, forward and backward), per-token float32 statistics, the scored positions'
    hidden states and their float32 gradient, and the LM head's float32 gradient when it trains (full fine-tuning).
    On CUDA (Triton) only the completion tokens are scored; elsewhere every position is, and torch's fold of a tile
    keeps float32 temporaries of its size: peak RSS rose 1.98 GB for 2048 tokens at Qwen2.5-0.5B's shape on CPU
    (forward and backward, float32), about 7.4 tiles, where this gives 2.16 GB. Older TRL (``tile`` None) builds
    float32 logits of every token and their log-softmax.
    """
    vocab, hidden = config.vocab_size, config.hidden_size
    if tile is None:
        return sequences * (prompt_tokens + completion_tokens) * vocab * 4 * 2
    rows = sequences * (completion_tokens if gpu else prompt_tokens + completion_tokens)
    cells = min(rows, tile[0]) * min(vocab, tile[1])
    total = cells * compute_bytes + (0 if gpu else 7 * cells * 4)
    total += rows * hidden * (compute_bytes + 4)  # scored hidden states, and their float32 gradient in backward
    total += rows * 8 * 4  # running max, sums, target logit, log-prob, entropy...: float32 per token
    if head_trains:
        total += vocab * hidden * 4  # the head's gradient, accumulated in float32 over the tiles
    return total


@dataclass
class Estimate:
    """The estimate's terms in bytes, the card it is compared with, and what would make it fit."""

    model: str
    parameters: int
    trainable: int
    terms: dict[str, float]
    card: str
    card_bytes: float | None
    fixes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool | None:
        return None if self.card_bytes is None else self.total <= self.card_bytes

    def text(self) -> str:
        parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in self.terms.items())
        head = f"{self.model}: {self.parameters / 1e6:.1f}M parameters, about {self.total / GB:.2f} GB ({parts})"
        if self.card_bytes is None:
            return head + "; no GPU here to compare with (pass card='T4' and so on)."
        verdict = "fits" if self.fits else "does not fit"
        fix = f"; {' or '.join(self.fixes)}" if self.fixes and not self.fits else ""
        return f"{head}: {verdict} on {self.card} ({self.card_bytes / GB:.0f} GB){fix}."

    def html(self) -> str:
        import html

        color = "#15803d" if self.fits else "#b00020" if self.fits is False else "#444"
        return f"<div class='grpo-memory' style='color:{color}'>{html.escape(self.text())}</div>"


def count_parameters(model_path: str | None = None, *, config: Any = None) -> tuple[int, Any]:
    """(parameter count, config) of a model folder or hub id (or of ``config``), built on the meta device: no
    weights are read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if config is None:
        config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), config


def _lora_parameters(config: Any, r: int) -> int:
    """LoRA on every linear layer of the blocks: r x (in + out) per projection."""
    h = config.hidden_size
    inter = getattr(config, "intermediate_size", 4 * h)
    heads = getattr(config, "num_attention_heads", 1)
    kv = getattr(config, "num_key_value_heads", heads) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    shapes = [
        (h, heads * head_dim),
        (h, kv * head_dim),
        (h, kv * head_dim),
        (heads * head_dim, h),
        (h, inter),
        (h, inter),
        (inter, h),
    ]
    return config.num_hidden_layers * sum(r * (a + b) for a, b in shapes)


def _card_key(card: str) -> str | None:
    """The named card ``card`` means (``A100`` is the 40 GB one), or None."""
    return next((k for k in CARDS if k.lower() == card.lower() or k.lower().startswith(card.lower())), None)


def card_memory(card: str | None) -> tuple[str, float | None]:
    """The card to compare with: a named one, else this kernel's GPU, else none."""
    if card:
        key = _card_key(card)
        if key is None:
            from grpo_magic.errors import GRPOMagicError

            raise GRPOMagicError(f"Unknown card {card!r}; use one of {', '.join(CARDS)}.")
        return key, CARDS[key] * GB
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), float(torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 - no GPU to read: no comparison
        pass
    return "this machine (no GPU)", None


def estimate(
    params: Any,
    model_path: str | None = None,
    *,
    card: str | None = None,
    prompt_tokens: int = 256,
    fixes: bool = True,
) -> Estimate:
    """The memory a run of ``params`` needs on ``card`` (default: this kernel's GPU)."""
    kwargs = params.grpo_config_kwargs()
    path = model_path or params.model
    from grpo_magic.models import model_config

    n, config = count_parameters(config=model_config(str(path)))  # an offline model's without building it
    precision = _precision(params, kwargs, card)
    half = precision != "fp32"  # activations under bf16/fp16 autocast
    # The weights as device.load_dtype loads them: bf16 in bf16; fp16 is mixed precision, so weights that train
    # stay float32 (a LoRA run's frozen base loads in fp16); 4 bits with QLoRA.
    weight_bytes = 0.5 if params.load_in_4bit else 2 if precision == "bf16" or (precision == "fp16" and params.peft) else 4
    trainable = _lora_parameters(config, params.lora_r) if params.peft else n
    trained_bytes = 4 if params.peft else weight_bytes  # PEFT keeps the adapters float32
    completion = int(kwargs.get("max_completion_length") or 0)
    sequences = int(kwargs["per_device_train_batch_size"])
    tokens = sequences * (prompt_tokens + completion)
    layers = config.num_hidden_layers
    act_bytes = 2 if half else 4
    per_token_layer = activation_values_per_token_layer(config) * act_bytes
    checkpointing = kwargs.get("activation_checkpointing", kwargs.get("gradient_checkpointing", True))
    if checkpointing is None:
        checkpointing = True  # TRL's GRPOConfig turns it on by default
    # Checkpointing keeps each layer's input and recomputes one layer at a time during backward.
    boundaries = tokens * config.hidden_size * act_bytes * layers
    activations = boundaries + tokens * per_token_layer if checkpointing else tokens * per_token_layer * layers
    name, card_bytes = card_memory(card)
    logits = logits_bytes(config, sequences=sequences, prompt_tokens=prompt_tokens, completion_tokens=completion,
                          compute_bytes=act_bytes, gpu=card_bytes is not None, head_trains=not params.peft,
                          tile=fused_lm_head_tile())
    terms = {
        "weights": n * weight_bytes,
        "gradients": trainable * trained_bytes,
        "optimizer": trainable * 2 * trained_bytes,  # AdamW: two moments per trained value, in its dtype
        "activations": activations,
        "logits": logits,
    }
    if params.peft:
        terms["weights"] += trainable * 4  # the adapters themselves, in float32
    if float(kwargs.get("beta") or 0) > 0 and not params.peft:
        terms["reference model"] = n * weight_bytes
    if params.use_vllm and params.vllm_mode == "colocate" and card_bytes is not None:
        terms["vLLM share"] = card_bytes * float(params.vllm_gpu_memory_utilization)
    result = Estimate(str(params.model), n, trainable, terms, name, card_bytes)
    if fixes and result.fits is False:
        result.fixes = _fixes(result, params, bool(checkpointing), str(path), card, prompt_tokens)
    return result


def _precision(params: Any, kwargs: dict[str, Any], card: str | None) -> str:
    """bf16, fp16 or fp32, as the run would choose: on this device, or on ``card`` (by its compute capability)."""
    if card is None:
        return "bf16" if kwargs.get("bf16") else "fp16" if kwargs.get("fp16") else "fp32"
    from grpo_magic.runtime.device import choose_precision

    key = _card_key(card)
    explicit = params.__dict__.get("trl_settings") or {}
    return choose_precision(explicit.get("bf16"), explicit.get("fp16"), capability=CAPABILITY.get(key or "", (8, 0)))


def _fixes(
    result: Estimate, params: Any, checkpointing: bool, path: str, card: str | None, prompt_tokens: int
) -> list[str]:
    """The one or two settings that would save the most, each estimated again with that change."""
    candidates: list[tuple[str, dict[str, Any]]] = []
    if not params.peft:
        candidates.append(("train LoRA adapters (--peft) instead of every weight", {"peft": True}))
    elif not params.load_in_4bit:
        candidates.append(("load the model in 4 bits (--load-in-4bit, with --peft)", {"load_in_4bit": True}))
    if not checkpointing:
        candidates.append(("turn on --activation-checkpointing", {"activation_checkpointing": True}))
    if params.batch_size > params.rl_num_generations:
        half = max(params.rl_num_generations, params.batch_size // 2)
        candidates.append(
            (
                f"halve --batch-size (to {half}) and double --gradient-accumulation",
                {"batch_size": half, "gradient_accumulation": params.gradient_accumulation * 2},
            )
        )
    if params.rl_max_new_tokens > 64:
        candidates.append(
            (
                f"lower --rl-max-new-tokens (to {params.rl_max_new_tokens // 2})",
                {"rl_max_new_tokens": params.rl_max_new_tokens // 2},
            )
        )
    saved = []
    for words, change in candidates:
        try:
            other = estimate(params.replace(**change), path, card=card, prompt_tokens=prompt_tokens, fixes=False)
        except Exception:  # noqa: BLE001 - a change these params reject is no fix
            continue
        saved.append((result.total - other.total, words))
    return [words for gain, words in sorted(saved, reverse=True) if gain > 0][:2]
