"""The memory estimate's terms (grpo_magic.config.memory) against what can be measured on CPU.

- parameters: counted on the meta device (no weights) vs the loaded model's;
- optimizer state: AdamW's real state bytes after one step vs ``8 x trainable``;
- activations + logits: the bytes of every tensor a forward pass saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), with and without activation checkpointing,
  vs the estimate's activations + logits for the same tokens.

Run: PYTHONPATH=. python bench/memory.py  (prints one JSON object)

``--real-shape lora`` (or ``full``) measures one GRPO step at Qwen2.5-0.5B's shape (random weights from its config,
its 151,936-token vocabulary, tied embeddings; the offline tiny tokenizer) through ``grpo_magic.train`` on CPU, in
float32: the process's resident set sampled every 5 ms from outside torch's accounting (psutil), with marks at
TRL's train begin (the loaded model: ``weights``) and step end (the optimizer's state; gradients are freed by
then), and the transient peak of the step above the step's end (``gradients`` + ``activations`` + ``logits``),
each against ``grpo_magic.config.memory.estimate``. LoRA: about 2.5 minutes on 2 cores; full fine-tuning needs about
10 GB of RAM.
"""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from grpo_magic import GRPOParams
from grpo_magic.config.memory import count_parameters, estimate
from grpo_magic.models import tiny_model_path


def saved_bytes(model, ids: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd keeps for backward (a storage counted once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids)
        torch.log_softmax(out.logits.float(), dim=-1).sum().backward()
    return sum(seen.values())


def main() -> None:
    path = tiny_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    counted, _ = count_parameters(path)
    real = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (4, 64 + 16))
    model(input_ids=ids).logits.sum().backward()
    optimizer.step()
    state = sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    params = GRPOParams(model="tiny", batch_size=4, rl_max_new_tokens=16, rl_num_generations=4)
    out = {
        "parameters_meta": counted,
        "parameters_loaded": real,
        "optimizer_measured": state,
        "optimizer_estimated": estimate(params, path).terms["optimizer"],
    }
    for checkpointing in (False, True):
        model.zero_grad()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        measured = saved_bytes(model, ids)
        est = estimate(params.replace(activation_checkpointing=checkpointing), path, prompt_tokens=64)
        out[f"saved_measured_ckpt_{checkpointing}"] = measured
        out[f"saved_estimated_ckpt_{checkpointing}"] = est.terms["activations"] + est.terms["logits"]
    print(json.dumps(out))


QWEN_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                rms_norm_eps=1e-6, tie_word_embeddings=True)


def build_real_shape(dest: str) -> None:
    """Qwen2.5-0.5B's shape with random bf16 weights, built on the meta device and filled (seconds, not minutes)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    config = Qwen2Config(**QWEN_05B, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.tie_weights()  # to_empty gives the head a storage of its own
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0, 0.02, generator=generator)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


class _ShortEnv:
    """Eight short string prompts; any score (the step's memory, not its learning, is measured)."""

    def build_dataset(self, tokenizer):  # noqa: ANN001, ANN201
        from datasets import Dataset

        return Dataset.from_dict({"prompt": [f"Count the letters in word number {i}, please." for i in range(8)]})

    def score_episode(self, model, tokenizer, completion: str) -> float:  # noqa: ANN001
        return len(completion) % 7 / 7


def real_shape(mode: str) -> dict:
    """One GRPO step at Qwen2.5-0.5B's shape: measured resident memory against the estimate, term by term."""
    import subprocess
    import sys
    import tempfile
    import threading
    import time

    import psutil
    from transformers import TrainerCallback

    from grpo_magic import train

    work = tempfile.mkdtemp(prefix="grpo-memory-shape.")
    path = f"{work}/model"
    subprocess.run([sys.executable, __file__, "--build", path], check=True)  # its memory is not this process's
    proc = psutil.Process()
    marks: dict[str, int] = {}
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    class Marks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            marks["train_begin"] = proc.memory_info().rss
            peak[0] = 0

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            marks["step_end"] = proc.memory_info().rss

    params = GRPOParams(model=path, peft=mode == "lora", rl_num_generations=4, batch_size=4, rl_max_new_tokens=16,
                        max_steps=1, lr=1e-5, rl_kl_coef=0.0, save_steps=1000, project_name=f"{work}/run")
    baseline = proc.memory_info().rss
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.time()
    train(params, _ShortEnv(), display=False, callbacks=[Marks()])
    done.set()
    sampler.join()
    terms = estimate(params, path, prompt_tokens=16).terms
    transient = terms["gradients"] + terms["activations"] + terms["logits"]
    rows = {
        "weights": (marks["train_begin"] - baseline, terms["weights"]),
        "optimizer": (marks["step_end"] - marks["train_begin"], terms["optimizer"]),
        "gradients + activations + logits": (peak[0] - marks["step_end"], transient),
        "total": (peak[0] - baseline, sum(terms.values())),
    }
    return {"mode": mode, "seconds": round(time.time() - start, 1), "measured_with": "psutil RSS every 5 ms",
            "terms": terms, "rows": {k: {"measured": m, "estimated": e, "ratio": round(e / m, 2) if m > 0 else None}
                                     for k, (m, e) in rows.items()}}


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        build_real_shape(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--real-shape":
        result = real_shape(sys.argv[2])
        for name, row in result["rows"].items():
            print(f"{name:>34}: measured {row['measured'] / 2**30:6.2f} GiB, estimated {row['estimated'] / 2**30:6.2f} GiB")
        print(json.dumps(result))
    else:
        main()
