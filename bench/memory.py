"""The memory estimate's terms (grpo_magic.memory) against what can be measured on CPU.

- parameters: counted on the meta device (no weights) vs the loaded model's;
- optimizer state: AdamW's real state bytes after one step vs ``8 x trainable``;
- activations + logits: the bytes of every tensor a forward pass saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), with and without activation checkpointing,
  vs the estimate's activations + logits for the same tokens.

Run: PYTHONPATH=. python bench/memory.py  (prints one JSON object)
"""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from grpo_magic import GRPOParams
from grpo_magic.memory import count_parameters, estimate
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


if __name__ == "__main__":
    main()
