"""Generation for multi-turn episodes: continue a conversation with the fastest engine at hand.

An env that continues an episode (a tool result comes back, the model answers again) would call
``model.generate`` on the policy: on a GPU run with ``--use-vllm`` that is the slow path while a
vLLM engine sits idle. An env whose ``score_episode`` names a ``generator`` parameter gets one of
these objects instead (envs that do not name it are called exactly as before):

    def score_episode(self, model, tokenizer, completion, case_idx, generator=None):
        reply = generator.chat(messages, tools=self.get_tools(), max_new_tokens=64)

``generate(messages_or_text, max_new_tokens=..., tools=...)`` returns the reply text. The prompt is
always rendered here with the tokenizer's chat template (so HF and vLLM see the same tokens) and
the reply is cut at the end of the turn, tool-call markup kept. The engines:

- ``hf``: ``model.generate`` on the policy (CPU, one GPU, or no vLLM);
- ``vllm-colocate``: TRL's in-process engine (found by ``trl_compat.vllm_engine``), which already
  holds this step's weights;
- ``vllm-server``: TRL's server (``trl vllm-serve``), which TRL updates every step; every process
  can reach it over HTTP.

Where a vLLM engine cannot take single requests (colocate with tensor parallelism, whose
generate is a collective call, or with sleep mode, which drops the weights between steps) the
helper says so once and uses HF generate.
"""

from __future__ import annotations

import threading
from typing import Any

#: Tokens that end an assistant turn in the chat templates we know (besides eos and pad).
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


class PromptTooLong(ValueError):
    """The conversation plus the reply would not fit the model's context: end the episode there."""


def decode_reply(tokenizer: Any, ids: list[int]) -> str:
    """Text of generated ids up to the end of the turn, keeping tool-call markup tokens."""
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    vocab = tokenizer.get_vocab()
    stop.update(vocab[t] for t in END_OF_TURN if t in vocab)
    stop.discard(None)
    for i, token_id in enumerate(ids):
        if token_id in stop:
            ids = ids[:i]
            break
    text = tokenizer.decode(ids, skip_special_tokens=False)
    for special in tokenizer.all_special_tokens:
        if "tool_call" not in special:
            text = text.replace(special, "")
    return text.strip()


class EpisodeGenerator:
    """Renders a prompt, generates one reply with some engine, and decodes it; subclasses pick the engine."""

    backend = "base"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 128,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} backend={self.backend}>"

    # ------------------------------------------------------------ what envs call

    def generate(self, messages_or_text: str | list[dict[str, Any]], max_new_tokens: int | None = None,
                 tools: list[dict[str, Any]] | None = None) -> str:
        """The model's next reply: a string prompt is used as is, chat messages go through the chat template."""
        text = self.render(messages_or_text, tools=tools)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        budget = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        limit = self.context_length()
        if limit is not None and len(ids) + budget > limit:
            raise PromptTooLong(
                f"the conversation has {len(ids)} tokens and the reply may take {budget} more, past the model's "
                f"context of {limit} tokens; end the episode or lower max_new_tokens"
            )
        return decode_reply(self.tokenizer, self._complete(list(ids), budget))

    def chat(self, messages: list[dict[str, Any]], max_new_tokens: int | None = None,
             tools: list[dict[str, Any]] | None = None) -> str:
        """The next assistant turn of a conversation (a list of chat messages)."""
        if isinstance(messages, str):
            raise TypeError("chat() takes a list of chat messages; use generate() for a text prompt")
        return self.generate(messages, max_new_tokens=max_new_tokens, tools=tools)

    def render(self, messages_or_text: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text the engine sees."""
        if isinstance(messages_or_text, str):
            return messages_or_text
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(list(messages_or_text), **kwargs)

    def context_length(self) -> int | None:
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return limit if isinstance(limit, int) else None

    # ------------------------------------------------------------ engines

    def _complete(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        raise NotImplementedError


class HFGenerator(EpisodeGenerator):
    """``model.generate`` on the policy; sampling settings left unset follow the model's generation config."""

    backend = "hf"

    def _complete(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        import torch

        model, tokenizer = self.model, self.tokenizer
        device = getattr(model, "device", None)
        if device is None:
            device = next(model.parameters()).device
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        sampling = {k: v for k, v in self.sampling.items() if v is not None}
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                 max_new_tokens=max_new_tokens, do_sample=True, pad_token_id=pad, **sampling)
        return out[0, len(prompt_ids):].tolist()


class VLLMColocateGenerator(EpisodeGenerator):
    """TRL's colocated vLLM engine (one per process), one request at a time under a lock."""

    backend = "vllm-colocate"

    def __init__(self, llm: Any, model: Any, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.llm = llm
        self._lock = threading.Lock()

    def context_length(self) -> int | None:
        from grpo_magic.trl_compat import vllm_max_model_len

        limit = vllm_max_model_len(self.llm)
        return limit if limit is not None else super().context_length()

    def _complete(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        from vllm import SamplingParams

        sampling = {k: v for k, v in self.sampling.items() if v is not None}
        params = SamplingParams(n=1, max_tokens=max_new_tokens, **sampling)
        with self._lock:  # vLLM's LLM is not thread-safe; episodes may run in worker threads
            outputs = self.llm.generate([{"prompt_token_ids": prompt_ids}], sampling_params=params, use_tqdm=False)
        return list(outputs[0].outputs[0].token_ids)


class VLLMServerGenerator(EpisodeGenerator):
    """TRL's vLLM server: the trainer's client on the main process, a client of our own elsewhere."""

    backend = "vllm-server"

    def __init__(self, model: Any, tokenizer: Any, *, client: Any = None, base_url: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.client = client
        self.base_url = base_url
        self._lock = threading.Lock()
        self._served: int | None = None
        self._served_read = False

    def context_length(self) -> int | None:
        """The context the server was started with (its ``/v1/models`` answer's ``max_model_len``), read once: a
        launched server's is the run's (``preflight.vllm_context_length``), not the model's; else the model's."""
        with self._lock:
            if not self._served_read:
                self._served = served_max_model_len(self.base_url or getattr(self.client, "base_url", None))
                self._served_read = True
        return self._served if self._served is not None else super().context_length()

    def _client(self) -> Any:
        with self._lock:
            if self.client is None:  # only the main process holds TRL's client: the others talk HTTP themselves
                from grpo_magic.trl_compat import vllm_client

                self.client = vllm_client(self.base_url)
            return self.client

    def _complete(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        sampling = {k: v for k, v in self.sampling.items() if v is not None}
        from grpo_magic.trl_compat import vllm_server_generate

        return vllm_server_generate(self._client(), prompt_ids, max_new_tokens, **sampling)


def served_max_model_len(base_url: str | None, timeout: float = 5.0) -> int | None:
    """``max_model_len`` of the model a vLLM server serves (its OpenAI-compatible ``GET /v1/models``), or None
    when the server does not say (no URL, no answer, another reply)."""
    import json
    import urllib.request

    if not base_url:
        return None
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=timeout) as response:  # noqa: S310
            models = json.loads(response.read().decode("utf-8")).get("data") or []
    except (OSError, ValueError, AttributeError):
        return None
    lengths = [m.get("max_model_len") for m in models if isinstance(m, dict)]
    lengths = [n for n in lengths if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return min(lengths) if lengths else None


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a completion, as TRL collects them (the tokenizer's and the model's)."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return ids


def prompt_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """A prompt's token ids as TRL makes them: text as is, chat messages through the chat template."""
    if isinstance(prompt, str):
        return list(tokenizer(text=prompt)["input_ids"])
    text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text=text, add_special_tokens=False)["input_ids"])


def generate_groups(model: Any, prompt_id_lists: list[list[int]], config: Any, *, n: int, pad: int, eos: list[int],
                    batch_size: int) -> list[list[tuple[list[int], bool]]]:
    """``n`` completions of each prompt with HF generate, batched and left-padded as TRL does.

    For each prompt, its ``n`` completions' ids (cut after the first end-of-sequence id, which is kept)
    and whether each ran out of tokens instead. ``config`` is the ``GenerationConfig`` (greedy or
    sampled); the caller seeds and sets eval mode. The same prompts in the same order give the same
    batches, so an in-memory policy and its saved copy give the same greedy completions.
    """
    import torch

    device = next(model.parameters()).device
    per_call = max(1, batch_size // n)
    groups: list[list[tuple[list[int], bool]]] = []
    for start in range(0, len(prompt_id_lists), per_call):
        chunk = [ids for ids in prompt_id_lists[start:start + per_call] for _ in range(n)]  # groups stay contiguous
        width = max(len(ids) for ids in chunk)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
        with torch.no_grad():
            sequences = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
        rows = sequences[:, width:].tolist()
        for g in range(len(chunk) // n):
            group = []
            for row in rows[g * n:(g + 1) * n]:
                end = next((i for i, tok in enumerate(row) if tok in eos), None)
                group.append((row if end is None else row[:end + 1], end is None))
            groups.append(group)
    return groups


def generate_batch(model: Any, tokenizer: Any, prompts: list[Any], *, n: int = 1, greedy: bool = False,
                   max_new_tokens: int = 128, temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0,
                   seed: int = 0, batch_size: int = 64) -> list[list[str]]:
    """``n`` completions of each prompt (``generate_groups``), greedy or sampled with the run's settings from
    ``seed``; each text is cut at the first end-of-sequence id and decoded without special tokens, as TRL
    decodes completions.
    """
    import torch
    from transformers import GenerationConfig

    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    sampling = {} if greedy else {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=pad,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, disable_compile=True, **sampling)
    was_training = model.training
    model.eval()
    try:
        if not greedy:
            torch.manual_seed(seed)
        groups = generate_groups(model, [prompt_ids(tokenizer, p) for p in prompts], config, n=n, pad=pad, eos=eos,
                                 batch_size=batch_size)
    finally:
        model.train(was_training)
    return [[tokenizer.decode(ids if cut else ids[:-1], skip_special_tokens=True) for ids, cut in group]
            for group in groups]
