"""Probe toward issue 25's general tool caller: the runs of bench/RESULTS-agent.md ("names the model cannot
remember"), reproducible. Not a product path: nothing here is registered as a model.

    python bench/agent_sft_probe.py copier --steps 1500 --save /tmp/copier.pt
    python bench/agent_sft_probe.py sft --steps 1500 --full-loss --init /tmp/copier.pt --save /tmp/model

- ``copier``: the 128-wide, 4-layer model (``tool_corpus.RECIPE.sizes``) trained on repeated random token
  sequences of a fixed length (8 noise, 24 random, the same 24 again). It learns to copy from a fixed
  distance (a shortcut, not an induction circuit; ``--vary`` draws the length and place, which it does not
  learn in minutes).
- ``sft``: ``tool_corpus``'s chats with tool and argument names that are random pseudo-words (nothing to
  remember: the held-out lists are never drawn) and requests that quote names and strings, so that a name is
  the same tokens in the request, the schema and the call. ``--full-loss`` trains on the whole chat, not the
  assistant turns only: each name is then seen, and copied, three times a chat. ``check`` on 96 held-out-name
  chats is printed as JSON. The best run so far (``--full-loss --init`` the copier, 1,500 steps x 8, lr 1e-3)
  made 0.42 of first replies calls to an offered tool with the schema's types and 0.30 the right call
  (greedy), after a drop in loss between steps 500 and 900; 33 minutes of wall time on 2 shared cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import tempfile
import time
from typing import Any

from grpo_magic.models import tool_corpus
from grpo_magic.models.warmstart import Example, WarmStart

_QUOTED_REQUESTS = ('Use the "{tool}" tool{args}.', 'Call "{tool}"{args}.', 'Please run "{tool}"{args}.',
                    'Use "{tool}"{args}.')
_QUOTED_CHAINS = ('Use "{t1}"{args}, then "{t2}" with the result.', 'Call "{t1}"{args} and then "{t2}" on the result.')


def pseudo_words(seed: int, n: int) -> tuple[str, ...]:
    """``n`` pronounceable random words (``"sejmu"``, ``"wuvijkab"``), none in the held-out lists."""
    held = set(tool_corpus.HELD_OUT_VERBS + tool_corpus.HELD_OUT_NOUNS + tool_corpus.HELD_OUT_ARGS)
    rng, cons, vowels, out = random.Random(seed), "bcdfghjklmnprstvwz", "aeiou", set()
    while len(out) < n:
        word = "".join(rng.choice(cons) + rng.choice(vowels) + (rng.choice(cons) if rng.random() < 0.5 else "")
                       for _ in range(rng.randint(1, 3)))
        if word not in held:
            out.add(word)
    return tuple(sorted(out))


def _quoted_phrase(args: dict[str, Any]) -> str:
    """`` with color "red" and n 3``: strings quoted as in JSON, so that they tokenize as in the call."""
    if not args:
        return ""
    parts = [f"{k} {str(v).lower() if isinstance(v, bool) else json.dumps(v) if isinstance(v, str) else v}"
             for k, v in args.items()]
    return " with " + " and ".join(parts)


def quote_requests() -> None:
    """Make ``tool_corpus`` write quoted requests (its corpus and its held-out ``check`` chats alike)."""
    tool_corpus._TOOL_REQUESTS, tool_corpus._CHAINS = _QUOTED_REQUESTS, _QUOTED_CHAINS
    tool_corpus._phrase = _quoted_phrase


def random_name_corpus(seed: int, size: int = tool_corpus.CORPUS_SIZE) -> list[Example]:
    corpus = tool_corpus._Corpus(random.Random(f"tool-use-v2-{seed}"), pseudo_words(1, 3000), pseudo_words(2, 3000),
                                 pseudo_words(3, 3000))
    return [corpus.chat() for _ in range(size)]


@dataclasses.dataclass(frozen=True)
class FromCopier(WarmStart):
    """A recipe whose fresh weights are replaced by a copier's (``init``, a state dict) before the fine-tune."""

    init: str | None = None

    def _start_model(self) -> Any:
        model = super()._start_model()
        if self.init:
            import torch

            model.load_state_dict(torch.load(self.init))
        return model


def copier(steps: int, save: str, vary: bool = False, batch: int = 32, length: int = 24, lr: float = 1e-3) -> None:
    """Language-model batches of a random sequence and its repeat; prints copy accuracy every 100 steps."""
    import torch

    torch.set_num_threads(1)
    recipe = WarmStart(name="probe", version="probe", corpus=random_name_corpus, sizes=tool_corpus.RECIPE.sizes)
    model = recipe._start_model()
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    special = set(tokenizer.all_special_ids) | set(tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]))
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    gen, total = torch.Generator().manual_seed(0), 8 + 2 * length

    def draw(n: int) -> tuple[Any, Any]:
        xs, ys = [], []
        for _ in range(n):
            size = int(torch.randint(6, length + 1, (1,), generator=gen)) if vary else length
            at = int(torch.randint(0, total - 2 * size + 1, (1,), generator=gen)) if vary else 8
            x = pool[torch.randint(len(pool), (total,), generator=gen)]
            x[at + size:at + 2 * size] = x[at:at + size]
            y = torch.full((total,), -100)
            y[at + size + 1:at + 2 * size] = x[at + size + 1:at + 2 * size]
            xs.append(x)
            ys.append(y)
        return torch.stack(xs), torch.stack(ys)

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = draw(batch)
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            with torch.no_grad():
                x, y = draw(64)
                mask = y[:, 1:] != -100
                right = (model(input_ids=x).logits[:, :-1].argmax(-1) == x[:, 1:]) & mask
            print(json.dumps({"step": step, "loss": round(loss.item(), 3),
                              "copy_accuracy": round(right.sum().item() / mask.sum().item(), 3),
                              "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    torch.save(model.state_dict(), save)


def sft(steps: int, full_loss: bool, init: str | None, save: str | None, lr: float = 1e-3, batch: int = 8) -> None:
    """The tool-call fine-tune (``WarmStart.build``) on the random-name corpus; prints its build record."""
    quote_requests()
    settings = {**tool_corpus.RECIPE.sft, "max_steps": steps, "learning_rate": lr, "per_device_train_batch_size": batch}
    if full_loss:
        settings["assistant_only_loss"] = False
    recipe = FromCopier(name="probe", version="probe", corpus=random_name_corpus, sft=settings,
                        sizes=tool_corpus.RECIPE.sizes, check=tool_corpus.check, init=init)
    with tempfile.TemporaryDirectory() as tmp:
        info = recipe.build(pathlib.Path(save or tmp))
    print(json.dumps({k: info[k] for k in ("steps", "loss_curve", "build_seconds", "check")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("copier", "sft"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vary", action="store_true", help="copier: repeats of random length and place")
    parser.add_argument("--full-loss", action="store_true", help="sft: loss on the whole chat")
    parser.add_argument("--init", default=None, help="sft: start from a copier's state dict")
    parser.add_argument("--save", default=None)
    args = parser.parse_args()
    if args.part == "copier":
        copier(args.steps, args.save or "copier.pt", vary=args.vary, lr=args.lr)
    else:
        sft(args.steps, args.full_loss, args.init, args.save, lr=args.lr)


if __name__ == "__main__":
    main()
