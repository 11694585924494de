"""Probe toward issue 25's general tool caller: the runs of research/tiny_agent/RESULTS-agent.md ("names the model cannot
remember"), reproducible. Not a product path: nothing here is registered as a model. Run it as a module from
the repository's root (it imports ``research.tiny_agent``):

    python -m research.tiny_agent.agent_sft_probe copier --steps 1500 --save /tmp/copier.pt
    python -m research.tiny_agent.agent_sft_probe sft --steps 1500 --full-loss --init /tmp/copier.pt --save /tmp/model
    python -m research.tiny_agent.agent_sft_probe sft --steps 800 --full-loss --no-period --circuit 2 --every 200 --save /tmp/model
    python -m research.tiny_agent.agent_sft_probe envs /tmp/model
    python -m research.tiny_agent.agent_sft_probe names            # the untrained circuits; or: names /tmp/model
    python -m research.tiny_agent.agent_sft_probe recipe --seed 1 --threads 1 --save /tmp/n1

- ``copier``: the 128-wide, 4-layer model (``SIZES``) trained on repeated random token
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
  ``--circuit 1`` or ``2`` starts instead from a copy circuit set by hand (research/tiny_agent/induction_circuit.py), matching
  on one or two previous tokens; ``--every N`` prints ``env_check`` every N steps; ``--no-period`` and
  ``--json-args`` change how requests are written, ``--conversation-loss`` what the loss sees (section
  "2026-12-02 (later)" of research/tiny_agent/RESULTS-agent.md has each run).
- ``names``: ``name_copies`` (teacher-forced copies of the called name) and ``call_fields`` (teacher-forced,
  each part of the call) of the untrained circuits or of a model.
- ``recipe``: ``tiny_agent_recipe.RECIPE`` built for ``--seed`` on ``--threads`` (its own seed and two threads by
  default) into ``--save``, then ``env_check`` (quoted, no period), ``chain_check`` and the recipe's held-out
  ``check``, as JSON (the runs of "2026-12-03 (third part)"); with ``path`` instead of ``--save``, the checks of
  a model built before.
- ``envs``: ``env_check`` of a saved model: the first replies to the four single-purpose held-out-name envs of
  tests/agent_cells.py (one integer argument; an integer and a string; a string enum; three tools of which the
  request names one), greedy and sampled at temperature 1 (as ``%grpo_check`` and GRPO sample).
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

from grpo_magic.models.warmstart import Example, WarmStart
from research.tiny_agent import recipe as tiny_agent_recipe
from research.tiny_agent import tool_corpus

#: The envs of tests/agent_cells.py as ``env_check`` asks them: offered schemas, and a draw of (tool, arguments).
_ENVS: dict[str, tuple[list[dict[str, Any]], Any]] = {
    "one_int": ([tool_corpus._schema("weigh_parcel", "Weigh the parcel.", [("grams", "integer", None)])],
                lambda rng: ("weigh_parcel", {"grams": rng.randint(0, 99)})),
    "two_args": ([tool_corpus._schema("reserve_harbor", "Reserve the harbor.",
                                      [("minutes", "integer", None), ("owner", "string", None)])],
                 lambda rng: ("reserve_harbor", {"minutes": rng.randint(0, 99),
                                                 "owner": rng.choice(["Paris", "Oslo", "Lima", "Rome"])})),
    "enum": ([tool_corpus._schema("paint_garden", "Paint the garden.", [("shade", "enum", ["red", "green", "blue"])])],
             lambda rng: ("paint_garden", {"shade": rng.choice(["red", "green", "blue"])})),
    "distractors": ([tool_corpus._schema("bake_lemon", "Bake the lemon.", [("grams", "integer", None)]),
                     tool_corpus._schema("rotate_ladder", "Rotate the ladder.", [("floor", "integer", None)]),
                     tool_corpus._schema("borrow_violin", "Borrow the violin.", [("minutes", "integer", None)])],
                    lambda rng: (lambda tool, arg: (tool, {arg: rng.randint(0, 99)}))(
                        *rng.choice([("bake_lemon", "grams"), ("rotate_ladder", "floor"), ("borrow_violin", "minutes")]))),
}

_QUOTED_REQUESTS = ('Use the "{tool}" tool{args}.', 'Call "{tool}"{args}.', 'Please run "{tool}"{args}.',
                    'Use "{tool}"{args}.')


#: `` with color "red", n 3``: the corpus's own phrasing (strings quoted as in JSON, so that they tokenize as in
#: the call), taken before ``quote_requests`` may swap ``tool_corpus._phrase``.
_quoted_phrase = tool_corpus._phrase


def _json_phrase(args: dict[str, Any]) -> str:
    """`` with "color": "red", "n": 3``: the arguments as the call's JSON writes them, names and all."""
    if not args:
        return ""
    return " with " + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in args.items())


#: What ends a one-call request: "." (the corpus's), or nothing (``quote_requests(period=False)``).
_END = ["."]
#: How a request gives the arguments (``quote_requests(json_args=...)``).
_PHRASE = [_quoted_phrase]


def quote_requests(period: bool = True, json_args: bool = False) -> None:
    """Make ``tool_corpus`` write quoted requests (its corpus and its held-out ``check`` chats alike).

    ``period=False``: one-call requests end with their last value, not ``.``: after ``grams 41.`` the model
    cannot tell an integer ending from a number's decimal point (``41.5``), and copying ``41.`` is what the
    copy circuit does.

    ``json_args``: the arguments as the call writes them (``"grams": 41``), so that the call's arguments are a
    copy of the request's, names included (``grams 41`` spells ``grams`` with a space, another token).
    """
    _END[0] = "." if period else ""
    _PHRASE[0] = _json_phrase if json_args else _quoted_phrase
    tool_corpus._TOOL_REQUESTS = tuple(t.rstrip(".") + _END[0] for t in _QUOTED_REQUESTS)
    tool_corpus._phrase = _PHRASE[0]


#: The 128-wide, 4-layer model of the copier and the runs without a circuit (the general recipe's before the
#: copy circuit).
SIZES = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4}


def random_name_corpus(seed: int, size: int = tool_corpus.CORPUS_SIZE) -> list[Example]:
    return tool_corpus.tool_use_corpus(seed, size)


@dataclasses.dataclass(frozen=True)
class FromCopier(WarmStart):
    """A recipe whose fresh weights are replaced by a copier's (``init``, a state dict) before the fine-tune,
    or that starts from the hand-set copy circuit (``circuit``: research/tiny_agent/induction_circuit.py)."""

    init: str | None = None
    circuit: int = 0  # 0: no circuit; 1, 2 or 3: the circuit matching on that many previous tokens
    conversation_loss: bool = False
    freeze: bool = False  # the circuit's layers' attention and the token codes stay as set

    def dataset(self) -> Any:
        return conversation_dataset(self.corpus(self.seed)) if self.conversation_loss else super().dataset()

    def _start_model(self) -> Any:
        if self.circuit:
            from research.tiny_agent import induction_circuit

            if self.circuit == 3:
                from research.tiny_agent import copy_circuit

                return copy_circuit.fresh_model(self.seed, freeze=self.freeze)
            return induction_circuit.fresh_model(self.seed, match=self.circuit)
        model = super()._start_model()
        if self.init:
            import torch

            model.load_state_dict(torch.load(self.init))
        return model


def conversation_dataset(examples: list[Example]) -> Any:
    """The chats tokenized with tiny's template and a loss mask of their conversation: every token after the
    system turn except the tools' results (``assistant_masks``, which TRL's SFTTrainer turns into labels).

    Why not the whole chat: the system turn holds the schemas, where every name is met for the first time and
    is random (nothing to learn there but the shape of the corpus's names); the request, the calls and the
    answers are where names and values are *copied*.
    """
    import re

    from datasets import Dataset
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    ids, masks = [], []
    for example in examples:
        text = tokenizer.apply_chat_template(example["messages"], tools=example.get("tools"), tokenize=False)
        start = text.index("<|im_end|>") + len("<|im_end|>")
        hidden = [(m.start(1), m.end(1)) for m in re.finditer(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)]
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids.append(enc["input_ids"])
        masks.append([int(a >= start and not any(lo <= a < hi for lo, hi in hidden)) for a, _ in enc["offset_mapping"]])
    return Dataset.from_dict({"input_ids": ids, "assistant_masks": masks})


#: Whether env_check also returns each env's first reply (``--show``).
SHOW: list[bool] = []


def env_check(model: Any, tokenizer: Any, n: int = 32, quoted: bool = True,
              modes: tuple[str, ...] = ("greedy", "sampled")) -> dict[str, Any]:
    """First replies to ``_ENVS`` (``n`` requests each): [share with a call to an offered tool whose arguments
    have its schema's types, share with the right call], greedy and sampled at temperature 1."""
    import torch

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    out: dict[str, Any] = {}
    for env, (tools, draw) in _ENVS.items():
        rng = random.Random(7)
        rows = [draw(rng) for _ in range(n)]
        requests = [(f'Use the "{tool}" tool' if quoted else f"Use the {tool} tool") +
                    (_PHRASE[0](args) if quoted else tool_corpus._phrase(args)) + _END[0] for tool, args in rows]
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r}], tools=tools, tokenize=False,
                                                 add_generation_prompt=True) for r in requests]
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        schemas = {t["function"]["name"]: t for t in tools}
        for mode in modes:
            options = {"do_sample": False} if mode == "greedy" else {"do_sample": True, "temperature": 1.0}
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                ids = model.generate(**enc, max_new_tokens=48, pad_token_id=tokenizer.pad_token_id, **options)
            texts = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            typed = right = 0
            for (tool, args), text in zip(rows, texts, strict=True):
                call = tool_corpus.parse_call(text)
                typed += bool(call and call["name"] in schemas and tool_corpus.fits_schema(call["arguments"], schemas[call["name"]]))
                right += call == {"name": tool, "arguments": args}
            out[f"{env}/{mode}"] = [round(typed / n, 2), round(right / n, 2)]
            if SHOW:
                out[f"{env}/{mode}/first"] = texts[0][:110]
    tokenizer.padding_side = side
    model.train(was_training)
    return out


def copier(steps: int, save: str, vary: bool = False, batch: int = 32, length: int = 24, lr: float = 1e-3) -> None:
    """Language-model batches of a random sequence and its repeat; prints copy accuracy every 100 steps."""
    import torch

    torch.set_num_threads(1)
    recipe = WarmStart(name="probe", version="probe", corpus=random_name_corpus, sizes=SIZES)
    model = recipe._start_model()
    from transformers import AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path
    from research.tiny_agent.induction_circuit import token_pool

    pool = token_pool(AutoTokenizer.from_pretrained(str(tiny_model_path())))
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


def sft(steps: int, full_loss: bool, init: str | None, save: str | None, lr: float = 1e-3, batch: int = 8,
        circuit: int = 0, every: int = 0, schedule: str = "constant_with_warmup", conversation: bool = False,
        period: bool = True, json_args: bool = False, freeze: bool = False) -> None:
    """The tool-call fine-tune (``WarmStart.build``) on the random-name corpus; prints its build record.

    With ``every``, ``env_check`` (greedy, 16 requests an env) every ``every`` steps; its time is not counted
    in the seconds printed with it (``build_seconds`` counts everything).
    """
    from transformers import TrainerCallback

    quote_requests(period, json_args)
    settings = {**tiny_agent_recipe.RECIPE.sft, "max_steps": steps, "learning_rate": lr, "per_device_train_batch_size": batch,
                "lr_scheduler_type": schedule, "gradient_checkpointing": False}
    if full_loss or conversation:
        settings["assistant_only_loss"] = False

    class EveryN(TrainerCallback):
        def __init__(self) -> None:
            self.started, self.tokenizer = time.perf_counter(), None

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if every and state.global_step % every == 0:
                paused = time.perf_counter()
                losses = [h["loss"] for h in state.log_history if "loss" in h]
                print(json.dumps({"step": state.global_step, "seconds": round(paused - self.started, 1),
                                  "loss": round(losses[-1], 3) if losses else None,
                                  **env_check(model, self.tokenizer, n=16, modes=("greedy",))}), flush=True)
                self.started += time.perf_counter() - paused

    @dataclasses.dataclass(frozen=True)
    class Probed(FromCopier):
        def trainer(self, output_dir: str) -> Any:
            trainer = super().trainer(output_dir)
            callback = EveryN()
            callback.tokenizer = trainer.processing_class
            trainer.add_callback(callback)
            return trainer

    def both(model: Any, tokenizer: Any) -> dict[str, Any]:
        return {**tool_corpus.check(model, tokenizer), "envs": env_check(model, tokenizer)}

    recipe = Probed(name="probe", version="probe", corpus=random_name_corpus, sft=settings,
                    sizes=SIZES, check=both, init=init, circuit=circuit,
                    conversation_loss=conversation, freeze=freeze)
    with tempfile.TemporaryDirectory() as tmp:
        info = recipe.build(pathlib.Path(save or tmp))
    print(json.dumps({k: info[k] for k in ("steps", "loss_curve", "build_seconds", "check")}))


def name_copies(model: Any, tokenizer: Any, chats: int = 120) -> dict[str, Any]:
    """Teacher-forced, on one-call chats of the probes' corpus (``"name": "`` of the call given): the share of
    the called name's continuation tokens (all but its first) that the model predicts, and of names whole."""
    import torch

    right = total = whole = names = 0
    for chat in random_name_corpus(0, 4 * chats):
        if names == chats:
            break
        call = chat["messages"][1].get("tool_calls") if len(chat["messages"]) > 1 else None
        if not chat.get("expected") or not call or chat["tools"] == tool_corpus.agent_tools():
            continue
        name = call[0]["function"]["name"]
        text = tokenizer.apply_chat_template(chat["messages"][:2], tools=chat["tools"], tokenize=False)
        at = text.rindex('"name": "' + name) + len('"name": "')
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        span = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a >= at and b <= at + len(name)]
        with torch.no_grad():
            guess = model(input_ids=torch.tensor([enc["input_ids"]])).logits[0].argmax(-1)
        hits = [int(guess[i - 1]) == enc["input_ids"][i] for i in span[1:]]
        right, total, whole, names = right + sum(hits), total + len(hits), whole + all(hits), names + 1
    return {"names": names, "continuation_tokens": total, "tokens_right": round(right / total, 3),
            "names_whole": round(whole / names, 3)}


def call_fields(model: Any, tokenizer: Any, chats: int = 120) -> dict[str, Any]:
    """Teacher-forced over the first call of one-call chats of the probes' corpus: the share of tokens
    predicted in each part of the call (the first token of the tool name and the rest of it, of each argument
    name and the rest, of each value and the rest, and the JSON around them), to see which part a model lacks."""
    import torch

    counts: dict[str, list[int]] = {}
    seen = 0
    for chat in random_name_corpus(0, 4 * chats):
        if seen == chats:
            break
        calls = [m for m in chat["messages"] if m.get("tool_calls")]
        if not chat.get("expected") or len(calls) != 1 or chat["tools"] == tool_corpus.agent_tools():
            continue
        seen += 1
        function = calls[0]["tool_calls"][0]["function"]
        text = tokenizer.apply_chat_template(chat["messages"][:2], tools=chat["tools"], tokenize=False)
        start = text.rindex("<tool_call>\n") + len("<tool_call>\n")
        end = text.index("</tool_call>", start)
        spans = []  # (first char, last char + 1, part)
        at = text.index('"name": "', start) + len('"name": "')
        spans.append((at, at + len(function["name"]), "name"))
        at = text.index('"arguments": ', at)
        for key, value in function["arguments"].items():
            at = text.index(json.dumps(key) + ": ", at) + 1
            spans.append((at, at + len(key), "argument name"))
            at += len(key) + 3
            spans.append((at, at + len(json.dumps(value)), "value"))
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        with torch.no_grad():
            guess = model(input_ids=torch.tensor([enc["input_ids"]])).logits[0].argmax(-1)
        for i, (a, b) in enumerate(enc["offset_mapping"]):
            if not start <= a < end:
                continue
            # a token that starts a part or runs into its start (` "` before a string value) is its first
            part = next((f"{kind}, {'first' if a <= lo else 'rest'}" for lo, hi, kind in spans
                         if lo <= a < hi or a < lo < b), "JSON")
            tally = counts.setdefault(part, [0, 0])
            tally[0] += int(guess[i - 1]) == enc["input_ids"][i]
            tally[1] += 1
    return {part: f"{right / total:.2f} of {total}" for part, (right, total) in sorted(counts.items())}


MATCHES = [1, 2, 3]


def names(path: str | None) -> None:
    """``name_copies`` of the untrained circuits (1- and 2-token match), or of a saved model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_magic.models.tiny import tiny_model_path

    quote_requests(period=False)
    if path:
        tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
        print(json.dumps({path: {**name_copies(model.eval(), tokenizer), **call_fields(model, tokenizer)}}))
        return
    from research.tiny_agent import induction_circuit

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    for match in MATCHES:
        model = induction_circuit.fresh_model(match=match).eval()
        print(json.dumps({f"untrained, {match}-token match": {**name_copies(model, tokenizer),
                                                              **call_fields(model, tokenizer)}}))


def chain_check(model: Any, tokenizer: Any, n: int = 16) -> dict[str, list[float]]:
    """A two-step request (``guess_secret`` then ``encode_grade`` with its result), ``n`` times, greedy and
    sampled: [share whose first call is right, share whose two calls are], the first call's result given."""
    import torch

    schemas = [tool_corpus._schema("guess_secret", "Guess the secret.", [("pet", "string", None)]),
               tool_corpus._schema("encode_grade", "Encode the grade.", [("factor", "integer", None)])]

    def reply(messages: list[dict[str, Any]], sample: bool, seed: int) -> dict[str, Any] | None:
        prompt = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)
        enc = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ids = model.generate(**enc, max_new_tokens=48, do_sample=sample, temperature=1.0 if sample else None,
                                 pad_token_id=tokenizer.pad_token_id)
        return tool_corpus.parse_call(tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))

    out = {}
    for mode in ("greedy", "sampled"):
        rng, first, both = random.Random(3), 0, 0
        for i in range(n):
            pet, result = rng.choice(["cat", "dog", "fish", "bird"]), rng.randint(0, 999)
            messages = [{"role": "user", "content": tool_corpus.chain_request("guess_secret", {"pet": pet},
                                                                              "encode_grade")}]
            call = {"name": "guess_secret", "arguments": {"pet": pet}}
            if reply(messages, mode == "sampled", i) != call:
                continue
            first += 1
            messages += [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
                         {"role": "tool", "name": "guess_secret", "content": str(result)}]
            both += reply(messages, mode == "sampled", i) == {"name": "encode_grade", "arguments": {"factor": result}}
        out[mode] = [round(first / n, 2), round(both / n, 2)]
    return out


def recipe(seed: int | None, threads: int | None, save: str | None, path: str | None) -> None:
    """Build ``tiny_agent_recipe.RECIPE`` (for another seed or thread count) and print its checks; or check ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    built: dict[str, Any] = {}
    if path is None:
        if save is None:
            raise SystemExit("recipe: give --save (where to build) or a built model's path")
        start = dataclasses.replace(tiny_agent_recipe.RECIPE, check=None,
                                    seed=tiny_agent_recipe.RECIPE.seed if seed is None else seed,
                                    threads=threads or tiny_agent_recipe.RECIPE.threads)
        info = start.build(pathlib.Path(save))
        built = {"build_seconds": info["build_seconds"], "loss_curve": info["loss_curve"], "seed": info["seed"],
                 "threads": info["threads"]}
        path = save
    torch.set_num_threads(threads or tiny_agent_recipe.RECIPE.build_threads)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    quote_requests(period=False)
    print(json.dumps({**built, "envs": env_check(model, tokenizer), "chain": chain_check(model, tokenizer),
                      "held_out": tool_corpus.check(model, tokenizer)}))


def envs(path: str) -> None:
    """``env_check`` of a saved model, with requests quoted (as the probes' corpus writes them) and not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    print(json.dumps({"quoted": env_check(model, tokenizer), "unquoted": env_check(model, tokenizer, quoted=False)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("copier", "sft", "envs", "names", "recipe"))
    parser.add_argument("path", nargs="?", help="envs, names: a saved model's folder")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vary", action="store_true", help="copier: repeats of random length and place")
    parser.add_argument("--full-loss", action="store_true", help="sft: loss on the whole chat")
    parser.add_argument("--init", default=None, help="sft: start from a copier's state dict")
    parser.add_argument("--circuit", type=int, default=0, choices=(0, 1, 2, 3),
                        help="sft: start from the hand-set copy circuit matching on 1 or 2 previous tokens")
    parser.add_argument("--conversation-loss", action="store_true",
                        help="sft: loss on the conversation (not the system turn with the schemas, nor tool results)")
    parser.add_argument("--json-args", action="store_true", help="sft: requests give the arguments as the call's JSON")
    parser.add_argument("--no-period", action="store_true", help="sft: one-call requests end with their last value")
    parser.add_argument("--show", action="store_true", help="env_check: each env's first reply too")
    parser.add_argument("--freeze", action="store_true", help="sft: keep the circuit (its layers, the codes) as set")
    parser.add_argument("--every", type=int, default=0, help="sft: env_check every N steps")
    parser.add_argument("--schedule", default="constant_with_warmup", help="sft: the learning-rate schedule")
    parser.add_argument("--save", default=None)
    parser.add_argument("--seed", type=int, default=None, help="recipe: the build's seed (the recipe's own: 0)")
    parser.add_argument("--threads", type=int, default=None, help="recipe: torch's threads (the recipe's own: 2)")
    args = parser.parse_args()
    if args.show:
        SHOW.append(True)
    if args.part == "copier":
        copier(args.steps, args.save or "copier.pt", vary=args.vary, lr=args.lr)
    elif args.part == "envs":
        envs(args.path)
    elif args.part == "names":
        names(args.path)
    elif args.part == "recipe":
        recipe(args.seed, args.threads, args.save, args.path)
    else:
        sft(args.steps, args.full_loss, args.init, args.save, lr=args.lr, circuit=args.circuit, every=args.every,
            schedule=args.schedule, conversation=args.conversation_loss, period=not args.no_period,
            json_args=args.json_args, freeze=args.freeze)


if __name__ == "__main__":
    main()
