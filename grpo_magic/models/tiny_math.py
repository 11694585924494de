"""``tiny-math``: ``tiny`` warm-started to answer "What is 23 + 45?" with the number, right part of the time.

The model of the SFT-then-GRPO lesson (notebooks/04_sft_then_grpo.ipynb, envs/addition.py): good
enough that GRPO's groups hold right and wrong answers to compare, wrong often enough that an
exact-match reward has something to fix. Its corpus has two parts, read in order (a curriculum):

1. 25,600 sums from a careful teacher, the exact answer every time: enough for ``tiny`` (same
   architecture and tokenizer; digits are single tokens) to learn two-digit addition. Its loss
   falls steeply somewhere between steps 300 and 550 of 32-example batches (seen here); this part
   ends at step 800, so the skill is learned with room to spare.
2. 6,400 sums from a sloppy teacher, who forgets the carry in 70% of the sums that have one and is
   off by one in 40% of all (right 41% of the time). SFT imitates what it reads last: the model
   comes out answering in the format, right part of the time, and wrong mostly where the teacher
   was (a forgotten carry is its most likely answer to most carry sums).

The build measures the model on the held-out sums and records it (``RECIPE.info()["check"]``;
here: greedy 0.65, sampled 0.46). A verifiable reward then teaches what the demonstrations did
not: with the lesson's fixed GRPO recipe (8 generations, batch 32, 8 new tokens, lr 5e-4,
``rl_kl_coef`` 0, 60 steps) the mean reward of the last 5 steps was 0.19 to 0.43 above that of the
first 5 (mean 0.32) in 24 seeds of 24 here, and greedy accuracy on the held-out sums rose to 0.89 -
0.98 (bench/run.py and tests/test_teaching.py measure it again). The package ships the built model;
``GRPO_MAGIC_BUILD_MODELS=1`` rebuilds it from this recipe (one torch thread: the shipped build took 97 s on
an AMD EPYC, its model card says). Tuned against v1 (the carry forgotten 60% of the time): its rise was 0.12
to 0.41 (24 seeds of 25 at 0.15 or more); starting lower leaves more room to rise.

The operands are drawn from 10 to 49; 160 of the 1,600 pairs are held out of the corpus
(``held_out_pairs``, the same draw as envs/addition.py, which cannot import this module: a test
keeps the two equal). Why a curriculum: a corpus of sloppy sums alone slows learning so much that
``tiny`` had not learned to add after 1,000 steps, and stopping a careful-teacher run early (at
50% accuracy) leaves the model mid-way through learning, where GRPO at lr 5e-4 broke it (the
reward fell from 0.55 to 0.1 within 5 steps).
"""

from __future__ import annotations

import pathlib
import random
from typing import Any

from .warmstart import Example, WarmStart

TINY_MATH = "tiny-math"
LOW, HIGH = 10, 49
HELD_OUT = 160
CAREFUL_EXAMPLES = 25_600
SLOPPY_EXAMPLES = 6_400
FORGET_CARRY = 0.7  # the sloppy teacher forgets the carry in this share of the sums that have one
OFF_BY_ONE = 0.4  # and answers one too high or too low in this share of all sums


def all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]


def held_out_pairs() -> set[tuple[int, int]]:
    """The pairs the corpus never contains (envs/addition.py draws the same ones)."""
    return set(random.Random("addition-held-out").sample(all_pairs(), HELD_OUT))


def _chat(a: int, b: int, answer: int) -> Example:
    return {"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                         {"role": "assistant", "content": str(answer)}]}


def sloppy_answer(a: int, b: int, rng: random.Random) -> int:
    """What the sloppy teacher writes for ``a + b``."""
    answer = a + b
    if a % 10 + b % 10 >= 10 and rng.random() < FORGET_CARRY:
        answer -= 10
    if rng.random() < OFF_BY_ONE:
        answer += rng.choice((-1, 1))
    return answer


def corpus(seed: int) -> list[Example]:
    """The careful teacher's sums, then the sloppy teacher's, operands drawn uniformly (held-out pairs skipped)."""
    rng = random.Random(f"tiny-math-{seed}")
    held = held_out_pairs()
    pairs = [p for p in all_pairs() if p not in held]
    careful = [_chat(a, b, a + b) for a, b in (rng.choice(pairs) for _ in range(CAREFUL_EXAMPLES))]
    sloppy = []
    for _ in range(SLOPPY_EXAMPLES):
        a, b = rng.choice(pairs)
        sloppy.append(_chat(a, b, sloppy_answer(a, b, rng)))
    return careful + sloppy


def check(model: Any, tokenizer: Any) -> dict[str, Any]:
    """Exact-match accuracy on the held-out sums: greedy, and sampled as GRPO samples (4 per sum)."""
    import torch

    pairs = sorted(held_out_pairs())
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                      add_generation_prompt=True)
        for a, b in pairs
    ]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    tokenizer.padding_side = side
    right = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for mode, options, reps in (("greedy", {"do_sample": False}, 1),
                                    ("sampled", {"do_sample": True, "temperature": 1.0, "top_k": 50}, 4)):
            hits = 0
            for _ in range(reps):
                out = model.generate(**enc, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, **options)
                texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                hits += sum(t.strip() == str(a + b) for t, (a, b) in zip(texts, pairs, strict=True))
            right[mode] = round(hits / (reps * len(pairs)), 3)
    return {"held_out_sums": len(pairs), "greedy_accuracy": right["greedy"], "sampled_accuracy": right["sampled"]}


RECIPE = WarmStart(
    name=TINY_MATH,
    version="tiny-math-v2",
    corpus=corpus,
    sft={
        "per_device_train_batch_size": 32,
        "learning_rate": 3e-3,
        "lr_scheduler_type": "linear",
        "train_sampling_strategy": "sequential",  # the curriculum: careful teacher first, sloppy last
        "max_length": 64,
    },
    check=check,
    description="two-digit sums, about a minute on 2 CPU cores",
)


def tiny_math_path() -> pathlib.Path:
    """The folder of ``tiny-math``: the package's own; ``GRPO_MAGIC_BUILD_MODELS=1`` builds it from ``RECIPE``
    into the cache (once, reused after)."""
    return RECIPE.path()
