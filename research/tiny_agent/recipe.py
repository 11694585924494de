"""``tiny-agent``: an offline tool caller that reads the tools its prompt offers (v2.2, issue 25).

The model of the agent envs' offline lessons and tests: an agent env a user writes (a ``%%grpo_env`` cell with
typed, documented tool methods) can be checked and trained on a CPU with it. It is ``tiny``'s vocabulary and
chat template in a 192-wide, 5-layer model that starts from a copy circuit set by hand (research/tiny_agent/copy_circuit.py:
it copies a tool's name from the offered schemas, an argument's name from the called tool's schema, a value
from the request; research/tiny_agent/chain_heads.py: a two-step request's second call, with the first's result), frozen,
then fine-tuned for 300 steps of 8 chats of about one length on a generated corpus of tool-use chats with
made-up names (research/tiny_agent/tool_corpus.py), and its logits doubled (``sharpen``: sampled at temperature 1 as the
fine-tune at 0.5). v2.1 was v2's recipe in length-grouped batches (built in about 170 s instead of 300 on a
2-core Intel Xeon); v2.2 is v2.1's recipe from the circuit with its chain heads (about 170 s there, the same
bytes from six processes; its held-out check runs in bench/agent_cpu.py, not in the build).

What it does (research/tiny_agent/RESULTS-agent.md, "the second call" and "v2.2"): on envs named from held-out
English words it never saw, sampled at temperature 1 through ``%grpo_check``, the right call for a one-integer, a
two-argument and an enum tool 1.0 / 1.0 / 1.0 of the time (v2.1: 0.75 / 0.88 / 0.5; builds differ across
CPUs, and so do these figures); a two-step request gets both calls right, in order, in 8 of 32 sampled
episodes (v2.1: none, it answered after the first result), which GRPO at temperature 1 raises (a held-out
greedy mean of 0.625 before, 1.0 after 16 steps, with a third tool offered). With three tools offered and one
named, names that begin alike get mixed (``bake_lemon`` written as ``borrow_violin``), and GRPO does not move
that (no sampled episode is right). It copies what a request spells out (the tool's name in quotes, each
argument as ``name value``); free-form requests and argument names that are one word-token of the vocabulary
(``a``, ``city``) get calls that do not parse, and ``%grpo_check`` says so
(``check_agent.uncopyable_arguments``). The weather env's free-form questions are such a case: the rise v1 had
there does not hold (its lesson moved to a held-out-name env: tests/test_agent.py, notebook 05).

v1 (two tools, ``get_weather`` and ``get_time``, one argument) called those two whatever its prompt offered:
no env a user wrote could be tried on it (its recipe is a test fixture now: tests/weather_caller.py).
"""

from __future__ import annotations

from grpo_magic.models.tiny_agent import TINY_AGENT, VERSION
from grpo_magic.models.warmstart import WarmStart

from . import tool_corpus

RECIPE = WarmStart(
    name=TINY_AGENT,
    # v2.1: v2's recipe in length-grouped batches; v2.2: from the circuit with its chain heads (a second call)
    version=VERSION,
    corpus=tool_corpus.recipe_corpus,
    sft={
        "max_steps": tool_corpus.STEPS,
        "per_device_train_batch_size": tool_corpus.BATCH,
        "learning_rate": 2e-3,
        # decaying to 0: the seeds' fine-tunes agree more (research/tiny_agent/RESULTS-agent.md)
        "lr_scheduler_type": "linear",
        "warmup_steps": 10,
        "max_length": 768,
        "logging_steps": 50,
        "gradient_checkpointing": False,  # a 5-layer model: recomputing activations only costs time
        # batches of chats of about one length (transformers' LengthGroupedSampler, seeded by the data seed): in
        # random batches of 8 the chats (175-737 tokens) padded to 1.35x their tokens and 1.75x their attention;
        # grouped, the build took 170 s instead of 300 here (research/tiny_agent/RESULTS-agent.md, "v2.1")
        "train_sampling_strategy": "group_by_length",
    },
    start=tool_corpus.circuit_start,
    threads=2,  # a 192-wide model: 1.3 s a step on two threads, 2.5 s on one (a CPU has two, or more)
    sharpen=2.0,  # sampled at temperature 1 as at 0.5: see tool_corpus's docstring
    # no held-out check in the build: tool_corpus.check took 34 s of a 217 s build, over the three minutes a first
    # use may take; bench/agent_cpu.py runs it on the built model (the same weights: it runs after the fine-tune)
    check=None,
    description="calls to the tools its prompt offers, about three minutes on 2 CPU cores",
)
