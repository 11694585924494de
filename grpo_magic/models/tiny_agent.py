"""``tiny-agent``: an offline tool caller that reads the tools its prompt offers (v2.1, issue 25).

The model of the agent envs' offline lessons and tests: an agent env a user writes (a ``%%grpo_env`` cell with
typed, documented tool methods) can be checked and trained on a CPU with it. It is ``tiny``'s vocabulary and
chat template in a 192-wide, 5-layer model that starts from a copy circuit set by hand (models/copy_circuit.py:
it copies a tool's name from the offered schemas, an argument's name from the called tool's schema, a value
from the request), frozen, then fine-tuned for 300 steps of 8 chats of about one length on a generated corpus
of tool-use chats with made-up names (models/tool_corpus.py), and its logits doubled (``sharpen``: sampled at
temperature 1 as the fine-tune at 0.5). v2.1 is v2's recipe in length-grouped batches: built in about 170 s
instead of 300 on a 2-core Intel Xeon (the same bytes from two processes), another draw of the same recipe.

What it does (bench/RESULTS-agent.md, "v2.1"): on envs named from held-out English words it never saw,
sampled at temperature 1 through ``%grpo_check``, the right call for a one-integer, a two-argument and an enum
tool 0.75 / 0.88 / 0.5 of the time (v2's build: 1.0 / 0.5 / 0.94 on that machine, 1.0 / 0.78 / 1.0 on an AMD
EPYC: builds differ across CPUs, and so do these figures); with three tools offered and one named, the right
call seldom (greedy, 2 of 16 held-out prompts; v2 7; names that begin alike get mixed), which GRPO at
temperature 2 raises (a held-out greedy mean of 0.125 before, 0.70-0.75 after 16 steps); a two-step request
gets its first call right, then an answer instead of the second call (``CHAIN_RECIPE``, the recipe from the
circuit with its chain heads, makes the second call: not registered, its GRPO rise on the three-tool env is
gone). It copies what a request spells out (the tool's name in quotes, each argument as ``name value``);
free-form requests and argument names that are one word-token of the vocabulary (``a``, ``city``) get calls
that do not parse, and ``%grpo_check`` says so (``check_agent.uncopyable_arguments``). The weather env's
free-form questions are such a case: the rise v1 had there does not hold (its lesson moved to a held-out-name
env: tests/test_agent.py, notebook 05).

v1 (two tools, ``get_weather`` and ``get_time``, one argument) called those two whatever its prompt offered:
no env a user wrote could be tried on it (its recipe is a test fixture now: tests/weather_caller.py).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from . import tool_corpus
from .warmstart import WarmStart

TINY_AGENT = "tiny-agent"

RECIPE = WarmStart(
    name=TINY_AGENT,
    version="tiny-agent-v2.1",  # v2's recipe in length-grouped batches: other bytes, so another cache folder
    corpus=tool_corpus.recipe_corpus,
    sft={
        "max_steps": tool_corpus.STEPS,
        "per_device_train_batch_size": tool_corpus.BATCH,
        "learning_rate": 2e-3,
        "lr_scheduler_type": "linear",  # decaying to 0: the seeds' fine-tunes agree more (bench/RESULTS-agent.md)
        "warmup_steps": 10,
        "max_length": 768,
        "logging_steps": 50,
        "gradient_checkpointing": False,  # a 5-layer model: recomputing activations only costs time
        # batches of chats of about one length (transformers' LengthGroupedSampler, seeded by the data seed): in
        # random batches of 8 the chats (175-737 tokens) padded to 1.35x their tokens and 1.75x their attention;
        # grouped, the build took 170 s instead of 300 here (bench/RESULTS-agent.md, "v2.1")
        "train_sampling_strategy": "group_by_length",
    },
    start=tool_corpus.circuit_start,
    threads=2,  # a 192-wide model: 1.3 s a step on two threads, 2.5 s on one (a CPU has two, or more)
    sharpen=2.0,  # sampled at temperature 1 as at 0.5: see tool_corpus's docstring
    check=tool_corpus.check,
    description="calls to the tools its prompt offers, about three minutes on 2 CPU cores",
)


#: ``RECIPE`` started from the circuit with layer 2's chain heads (models/chain_heads.py): a two-step
#: request gets its second call (``GuessThenEncode``: both calls right in 8 of 32 sampled episodes, the one-call
#: envs 1.0 / 1.0 / 1.0), but GRPO no longer raises the three-tool env's right calls (0.69 -> 0.69: it writes
#: ``borrow_violin`` for every ``bake_lemon`` request). Not registered: tests/test_tool_calls.py and
#: ``bench/agent_cpu.py --only chain`` build it (bench/RESULTS-agent.md, "the second call").
CHAIN_RECIPE = dataclasses.replace(RECIPE, version="tiny-agent-chain-v1", start=tool_corpus.chain_circuit_start,
                                   description="tiny-agent's recipe with the chain heads (not registered)")


def tiny_agent_path() -> pathlib.Path:
    """The folder of ``tiny-agent``, built on first use and reused after."""
    return RECIPE.path()


def tiny_agent_config() -> Any:
    """``tiny-agent``'s ``Qwen2Config`` without building it (``tiny``'s, resized for the copy circuit): for
    estimates that must not wait minutes for a build (memory.py)."""
    from transformers import AutoConfig

    from .copy_circuit import configure
    from .tiny import tiny_model_path

    return configure(AutoConfig.from_pretrained(str(tiny_model_path())))
