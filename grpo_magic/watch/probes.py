"""Probe replies for the pre-flight check: replies that game a reward without doing the task.

``%grpo_check`` already scores three probes (empty, the prompt echoed, a refusal). These pure functions build
three more: one token repeated to the length limit, a reply of random words, and, where the dataset row has an
answer-like column, the answer stated bare (without the format the prompt asks for). ``gaming_probes`` names the
probes that score at least as well as the model's own samples: each is a way to game the reward.

Duck-typed on the tokenizer (``encode``/``decode``, as every Hugging Face tokenizer has); no heavy import.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Dataset columns that hold an expected answer, in the order they are tried.
ANSWER_COLUMNS = ("answer", "solution", "target", "expected", "label", "ground_truth", "gold", "reference")

#: Plain English words for the random-words probe (no tokenizer needed).
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education").split()


def repeated_token_reply(tokenizer: Any, max_new_tokens: int, text: str = " the") -> str:
    """One token repeated to the length limit: ``text``'s first token (``" the"`` by default), ``max_new_tokens``
    times, decoded. The probe of a reward that pays for length or for one frequent piece of text."""
    ids = [i for i in tokenizer.encode(text, add_special_tokens=False)]
    if not ids:
        raise ValueError(f"the tokenizer gives no token for {text!r}")
    return tokenizer.decode([ids[0]] * int(max_new_tokens), skip_special_tokens=True)


def random_words_reply(n_words: int, seed: int = 0, words: Sequence[str] = WORDS) -> str:
    """``n_words`` words drawn at random (seeded): fluent-looking text that answers nothing."""
    rng = random.Random(seed)
    return " ".join(rng.choice(words) for _ in range(max(1, int(n_words))))


def answer_column(columns: Iterable[str]) -> str | None:
    """The first answer-like column of a dataset (``ANSWER_COLUMNS``, case-insensitive), else None."""
    by_lower = {c.lower(): c for c in columns}
    return next((by_lower[name] for name in ANSWER_COLUMNS if name in by_lower), None)


def bare_answer_reply(row: Mapping[str, Any]) -> str | None:
    """The row's answer stated bare, without the requested format (no tags, no JSON, no reasoning); None when the
    row has no answer-like column or its value is empty."""
    column = answer_column(row)
    if column is None or row[column] is None:
        return None
    text = str(row[column]).strip()
    return text or None


def probe_replies(tokenizer: Any, max_new_tokens: int, row: Mapping[str, Any] | None = None,
                  seed: int = 0) -> dict[str, str]:
    """The extra probes for one dataset row: ``repeated token``, ``random words`` (about as many words as the
    length limit allows) and, when the row has an answer-like column, ``bare answer``."""
    probes = {
        "repeated token": repeated_token_reply(tokenizer, max_new_tokens),
        "random words": random_words_reply(max(1, int(max_new_tokens) // 2), seed=seed),
    }
    answer = bare_answer_reply(row) if row is not None else None
    if answer is not None:
        probes["bare answer"] = answer
    return probes


def gaming_probes(probe_scores: Mapping[str, float | None], sample_scores: Sequence[float | None],
                  margin: float = 0.0) -> list[str]:
    """The probes whose score is at least the mean score of the model's own samples (minus ``margin``): each is a
    reply that does not do the task and still earns the reward, a way to game it. A probe scored 0 never counts
    (nothing to gain) and neither does one without a score (an episode error)."""
    valid = [s for s in sample_scores if s is not None]
    if not valid:
        return []
    bar = sum(valid) / len(valid) - margin
    return [name for name, score in probe_scores.items() if score is not None and score > 0 and score >= bar]
