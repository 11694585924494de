"""The prepared GPU check: one process, one GPU, no network, about 10 minutes; it writes one JSON object.

It replaces scripts/gpu_smoke.sh's part 3 for machines without vLLM (gpu_smoke.sh and gpu_smoke_inprocess.py stay
for a machine with the vllm extra). What it checks, each case one GRPO step through ``grpo_magic.train``:

- ``full_bf16`` and ``lora_bf16``: a model of Qwen2.5-0.5B's shape (random weights from its config, its 151,936-token
  vocabulary, the offline tiny tokenizer), peak ``torch.cuda.max_memory_allocated`` against
  ``grpo_magic.config.memory.estimate`` term by term;
- ``t4_fp16_lora``: the T4 path (fp16 forced, bf16 off) with LoRA, the loss finite;
- ``multi_turn_workers``: HotelEnv's episodes continued with the generation helper on TRL's own generation
  (no vLLM), ``rl_env_workers 4``, how many episodes went past one turn;
- every case after the first is a second run in the same process: ``memory_allocated`` before and after each.

``--dry-run`` runs the same code on CPU with ``tiny`` in seconds and writes the same keys (CI keeps it from rotting).
The machine's Python needs torch, transformers, peft and accelerate; trl and datasets come as wheels (IPython,
ipywidgets, matplotlib and anywidget are not imported on this path). trl 1.16.0, datasets 5.2.0, dill, multiprocess
and xxhash are 2.3 MB; pyarrow and pandas (datasets needs both) add about 55 MB where the machine lacks them:

    pip download --no-deps -d wheels/ trl==1.16.0 datasets==5.2.0 dill multiprocess xxhash [pyarrow pandas]

    python scripts/gpu_check.py --wheels wheels/ --out gpu-check.json     # on the GPU machine
    python scripts/gpu_check.py --dry-run --out /tmp/gpu-check.json       # anywhere, on CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # grpo_magic and envs/ from the checkout

#: Qwen2.5-0.5B's shape (494M parameters with tied embeddings).
QWEN_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.02)
CASES = ("full_bf16", "lora_bf16", "t4_fp16_lora", "multi_turn_workers")
MEMORY_SLACK = 256 * 2**20  # what may stay allocated after a run (CUDA's own workspaces)


def install_wheels(folder: str) -> dict[str, Any]:
    """trl and datasets from copied wheels (no network): ``pip install --no-index --find-links``."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", folder,
                           "trl", "datasets"], capture_output=True, text=True)
    return {"returncode": done.returncode, "stderr": done.stderr[-2000:]}


def build_model(work: Path, cuda: bool) -> str:
    """Qwen2.5-0.5B's shape with random weights, saved with the tiny tokenizer (ids it never emits are unused)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from grpo_magic.models import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    config = Qwen2Config(**QWEN_05B, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    dest = work / "qwen2.5-0.5b-shape"
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    del model
    return str(dest)


def _smoke_env() -> type:
    """HotelEnv whose even cases start from the right search call, so that episodes continue past turn 1."""
    from envs.hotel_env import HotelEnv

    class CheckHotelEnv(HotelEnv):
        turns: list[int] = []

        def score_episode(self, model, tokenizer, completion, case_idx, generator=None):  # noqa: ANN001
            if int(case_idx) % 2 == 0:
                completion = self.solution_turns(case_idx)[0]
            result = self.run_episode(model, tokenizer, completion, case_idx, generator=generator)
            CheckHotelEnv.turns.append(int(result.turns))
            return result.score

    return CheckHotelEnv


def _params(case: str, model: str, work: Path, dry: bool, steps: int) -> Any:
    from grpo_magic import GRPOParams

    common = dict(model=model, rl_num_generations=4, batch_size=4 if dry else 8, max_steps=steps, lr=1e-6,
                  rl_max_error_rate=1.0, save_steps=1000, project_name=str(work / case), seed=0)
    if case == "multi_turn_workers":
        config = {"max_turns": 3, "n_cases": 16, "max_new_tokens": 8 if dry else 48}
        return GRPOParams(**common, rl_env_config=json.dumps(config), rl_max_new_tokens=16 if dry else 64,
                          rl_env_workers=4, peft=True)
    precision = {} if dry else {"bf16": True} if case != "t4_fp16_lora" else {"fp16": True, "bf16": False}
    return GRPOParams(**common, rl_env_config=json.dumps({"n_cases": 16, "max_new_tokens": 8}),
                      rl_max_new_tokens=16 if dry else 128, peft=case != "full_bf16", trl_settings=precision)


def _memory(cuda: bool) -> dict[str, float]:
    """Now and peak: torch's allocator on CUDA; on CPU the resident set and the process's lifetime peak RSS."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        return {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated()}
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") if os.path.exists(
        "/proc/self/statm") else 0
    return {"allocated": rss, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_case(case: str, model: str, work: Path, dry: bool, cuda: bool, steps: int) -> dict[str, Any]:
    """One GRPO run; what it measured, what the estimate says, and what is wrong (``problems``)."""
    import torch

    from grpo_magic import train
    from grpo_magic.config.memory import estimate

    env = _smoke_env()
    env.turns.clear()
    params = _params(case, model, work, dry, steps)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = _memory(cuda)
    start = time.perf_counter()
    out: dict[str, Any] = {"case": case, "problems": []}
    try:
        run = train(params, env, display=False, raise_on_failure=False)
        out.update(status=run.status, reason=(run.reason or "")[:500], history=run.history[-1:] if run.history else [])
        del run
    except Exception as exc:  # noqa: BLE001 - a case's failure is a finding, not the end of the check
        out.update(status="raised", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    out["seconds"] = round(time.perf_counter() - start, 1)
    peak = _memory(cuda)["peak"]
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    after = _memory(cuda)
    out["memory"] = {"before": before["allocated"], "peak": peak, "after": after["allocated"],
                     "measured_with": "torch.cuda.max_memory_allocated" if cuda else "peak RSS (process lifetime)"}
    try:
        est = estimate(params, model)
        out["estimate"] = {"terms": est.terms, "total": est.total, "card": est.card}
        if cuda:
            out["estimate"]["peak_over_estimate"] = round((peak - before["allocated"]) / est.total, 3)
    except Exception as exc:  # noqa: BLE001
        out["estimate"] = {"error": f"{type(exc).__name__}: {exc}"}
    loss = (out.get("history") or [{}])[-1].get("loss")
    out["loss"] = loss
    out["loss_finite"] = isinstance(loss, (int, float)) and math.isfinite(loss)
    out["episode_turns"] = {"episodes": len(env.turns), "past_turn_1": sum(t > 1 for t in env.turns)}
    if out["status"] != "completed":
        out["problems"].append(f"{case}: {out['status']}: {out['reason'][:300]}")
    if not out["loss_finite"]:
        out["problems"].append(f"{case}: the loss is {loss!r}, not a finite number")
    if case == "multi_turn_workers" and not out["episode_turns"]["past_turn_1"]:
        out["problems"].append(f"{case}: no episode continued past its first turn")
    if cuda and after["allocated"] > before["allocated"] + MEMORY_SLACK:
        out["problems"].append(f"{case}: {(after['allocated'] - before['allocated']) / 2**20:.0f} MiB left allocated")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, the offline tiny model, seconds")
    parser.add_argument("--wheels", help="a folder of wheels for trl and datasets, installed with --no-index first")
    parser.add_argument("--out", default="gpu-check.json")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES), help="a comma-separated subset of " + ", ".join(CASES))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report: dict[str, Any] = {"dry_run": args.dry_run, "python": platform.python_version()}
    if args.wheels:
        report["wheels"] = install_wheels(args.wheels)
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.dry_run
    if not args.dry_run and not cuda:
        print("gpu_check: no CUDA device here; use --dry-run on a CPU", file=sys.stderr)
        return 2
    try:
        import trl

        report["trl"] = trl.__version__
    except ImportError as exc:
        report["trl"] = f"missing: {exc}"
    report.update(torch=torch.__version__, transformers=transformers.__version__,
                  gpu=torch.cuda.get_device_name(0) if cuda else None,
                  capability=list(torch.cuda.get_device_capability(0)) if cuda else None)
    work = Path(tempfile.mkdtemp(prefix="grpo-gpu-check."))
    start = time.perf_counter()
    model = "tiny" if args.dry_run else build_model(work, cuda)
    report["model"] = {"path": model, "built_s": round(time.perf_counter() - start, 1),
                       "shape": "tiny" if args.dry_run else "Qwen2.5-0.5B"}
    baseline = _memory(cuda)["allocated"]
    report["cases"] = {}
    for case in [c for c in args.cases.split(",") if c]:
        report["cases"][case] = run_case(case, model, work, args.dry_run, cuda, args.steps)
        print(f"gpu_check: {case}: {report['cases'][case]['status']} in {report['cases'][case]['seconds']} s",
              file=sys.stderr, flush=True)
    gc.collect()
    end = _memory(cuda)["allocated"]
    report["second_run"] = {"baseline": baseline, "after_all_runs": end,
                            "back_near_start": (end - baseline <= MEMORY_SLACK) if cuda else None}
    problems = [p for c in report["cases"].values() for p in c["problems"]]
    if cuda and not report["second_run"]["back_near_start"]:
        problems.append(f"{(end - baseline) / 2**20:.0f} MiB left allocated after all runs")
    report["problems"] = problems
    report["ok"] = not problems
    report["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print(f"gpu_check: {'OK' if not problems else 'PROBLEMS: ' + '; '.join(problems)} ({args.out})", file=sys.stderr)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
