"""AdditionEnv: "What is 23 + 45?" answered with the number, scored by exact match.

The verifiable reward of the SFT-then-GRPO lesson (notebooks/04_sft_then_grpo.ipynb): the offline
``tiny-math`` model was warm-started on such chats and answers in that format, right part of the
time; GRPO with this env makes it right more often. The reward is all or nothing: 1.0 when the
reply, stripped of surrounding whitespace, is exactly the sum's digits, else 0.0.

Some sums are held out: ``tiny-math``'s warm-up never saw them and the ``train`` split never asks
them, so ``split="held_out"`` measures the skill, not a memory. The held-out pairs are drawn by
``held_out_pairs`` (the same draw as the warm-up's corpus in grpo_magic; this module imports nothing
from grpo_magic, so the two copies are kept equal by tests/test_teaching.py).
"""

from __future__ import annotations

import random
from typing import Any

LOW, HIGH = 10, 49  # the operands of the lesson's sums
HELD_OUT = 160  # of the 1,600 pairs (a, b), 10% are held out
SPLITS = ("train", "held_out", "all")


def all_pairs(low: int = LOW, high: int = HIGH) -> list[tuple[int, int]]:
    return [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]


def held_out_pairs() -> set[tuple[int, int]]:
    """The pairs of 10..49 that neither tiny-math's warm-up nor the train split contains."""
    return set(random.Random("addition-held-out").sample(all_pairs(), HELD_OUT))


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def score_answer(completion: str, answer: str) -> float:
    """Exact match: the reply is the number and nothing else (surrounding whitespace aside)."""
    return 1.0 if completion.strip() == str(answer) else 0.0


class AdditionEnv:
    """Sums of two numbers; ``rl_env_config`` keys: split (train, held_out, all), low, high, seed.

    ``low``/``high`` other than 10/49 give sums outside the held-out draw (``split`` must be ``all``).
    """

    def __init__(self, split: str = "train", low: int = LOW, high: int = HIGH, seed: int = 0) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
        low, high = int(low), int(high)
        if not 0 <= low <= high:
            raise ValueError(f"need 0 <= low <= high; got low={low}, high={high}")
        if (low, high) != (LOW, HIGH) and split != "all":
            raise ValueError(f"the held-out draw covers {LOW}..{HIGH} only; pass split='all' for other ranges")
        pairs = all_pairs(low, high)
        if split != "all":
            held = held_out_pairs()
            pairs = [p for p in pairs if (p in held) == (split == "held_out")]
        random.Random(f"addition-order-{seed}").shuffle(pairs)
        self.split = split
        self.pairs: list[tuple[int, int]] = pairs

    def build_dataset(self, tokenizer: Any = None) -> Any:
        """A chat prompt per pair, and ``answer`` (the sum, as text) for ``score_episode``."""
        from datasets import Dataset

        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": question(a, b)}] for a, b in self.pairs],
                "answer": [str(a + b) for a, b in self.pairs],
            }
        )

    def build_eval_dataset(self, tokenizer: Any = None) -> Any:
        """The held-out sums (those the train split and tiny-math's warm-up never saw), for ``%grpo_eval``."""
        from datasets import Dataset

        pairs = sorted(held_out_pairs())
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": question(a, b)}] for a, b in pairs],
                "answer": [str(a + b) for a, b in pairs],
            }
        )

    def get_tools(self) -> list[dict[str, Any]]:
        return []

    def score_episode(self, model: Any, tokenizer: Any, completion: str, answer: str) -> float:
        return score_answer(completion, answer)


def answers(model: Any, tokenizer: Any, pairs: list[tuple[int, int]], *, sample: bool = False,
            max_new_tokens: int = 8, batch_size: int = 64, seed: int = 0) -> list[str]:
    """The model's replies to these sums: greedy, or sampled as GRPO samples (temperature 1, top-k 50).

    Batched with left padding (generation continues from the right end), in eval mode and without
    gradients; the model's train/eval mode is restored after.
    """
    import torch

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    replies: list[str] = []
    try:
        generator = torch.Generator().manual_seed(seed) if sample else None
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            texts = [
                tokenizer.apply_chat_template([{"role": "user", "content": question(a, b)}], tokenize=False,
                                              add_generation_prompt=True)
                for a, b in chunk
            ]
            enc = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
            options: dict[str, Any] = {"do_sample": False}
            if sample:
                options = {"do_sample": True, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     **options)
            replies += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return replies


def accuracy(model: Any, tokenizer: Any, pairs: list[tuple[int, int]] | None = None, **options: Any) -> float:
    """Share of exact answers (greedy unless ``sample=True``); the held-out sums by default."""
    pairs = sorted(held_out_pairs()) if pairs is None else list(pairs)
    replies = answers(model, tokenizer, pairs, **options)
    return sum(score_answer(r, str(a + b)) for r, (a, b) in zip(replies, pairs, strict=True)) / max(1, len(pairs))
