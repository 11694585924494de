"""The overhead benchmark at a realistic size, for a machine with a CUDA GPU (under 8 minutes).

    python bench/gpu.py                 # on a GPU machine; prints a summary, --json for one JSON line
    python bench/gpu.py --no-vllm       # skip the vLLM colocate pair
    python bench/gpu.py --smoke         # checks this script on a CPU in a minute (tiny sizes, no vLLM)

What it measures, grpo_magic (events, run log, headless dashboard) against a plain TRL script doing
the same work (same model files, seed, GRPOConfig values, reward arithmetic, steps):

1. ``letters``: the letters env, generation with transformers' ``generate``; B A A B in one
   process after a warm-up; training-loop wall time and completion tokens per second.
2. ``vllm``: the same with ``--use-vllm`` colocate, one fresh process per side (vLLM keeps GPU
   memory until its process ends); skipped when vllm is not installed.
3. ``hotel``: the multi-turn tool-using env (envs/hotel_env.py) where every episode continues the
   conversation with the policy: plain TRL's sequential reward wrapper vs grpo_magic with
   ``rl_env_workers`` 1 (the same work) and 8 (episodes in threads).

The model has no hub to come from: a Qwen2-architecture model of about 0.5B parameters with random
weights is built from ``Qwen2Config`` (the shape of Qwen2.5-0.5B with 32 layers; the vocabulary
is the tiny model's, so the embeddings are small), saved once, and loaded from disk by both sides.
Random weights never write a tool call, so in ``hotel`` every completion is prefixed with the
case's correct ``search_rooms`` call: each episode then runs one more policy turn, as a real
agent's would. Every section runs in fresh subprocesses and is skipped when the time left cannot
fit it (the whole script stays under ``--budget-s``, 450 s by default).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def _bench_run():
    """bench/run.py's helpers (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_magic_bench_run", BENCH / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


B = _bench_run()

SIZES = {  # about 0.48B parameters with the tiny tokenizer's 1k vocabulary
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 32, "num_attention_heads": 14,
    "num_key_value_heads": 2, "max_position_embeddings": 2048, "initializer_range": 0.02,
}
SMOKE_SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 2048, "initializer_range": 0.1,
}
WORK = {  # per section: completions per step, generations, new tokens, steps per run
    "letters": {"batch_size": 32, "rl_num_generations": 8, "rl_max_new_tokens": 128, "steps": 4, "reps": 2},
    "vllm": {"batch_size": 32, "rl_num_generations": 8, "rl_max_new_tokens": 128, "steps": 6},
    "hotel": {"batch_size": 16, "rl_num_generations": 8, "rl_max_new_tokens": 64, "steps": 2,
              "env": {"max_turns": 2, "max_new_tokens": 48, "n_cases": 32}, "workers": 8},
}
SMOKE_WORK = {
    "letters": {"batch_size": 8, "rl_num_generations": 4, "rl_max_new_tokens": 8, "steps": 2, "reps": 1},
    "vllm": {"batch_size": 8, "rl_num_generations": 4, "rl_max_new_tokens": 8, "steps": 2},
    "hotel": {"batch_size": 8, "rl_num_generations": 4, "rl_max_new_tokens": 8, "steps": 1,
              "env": {"max_turns": 2, "max_new_tokens": 8, "n_cases": 8}, "workers": 4},
}
# Rough seconds a section needs on an H200 (process start, model load, vLLM start, steps).
ESTIMATE_S = {"letters": 90, "vllm": 200, "hotel": 120}
COMMON = {"lr": 1e-5, "rl_kl_coef": 0.0, "seed": 42}


# ================================================================================== model


def build_model(dest: str, smoke: bool) -> dict[str, Any]:
    """A random-weight Qwen2 model with the tiny model's tokenizer, saved in ``dest``."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from grpo_magic.models import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    sizes = SMOKE_SIZES if smoke else SIZES
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **sizes)
    torch.manual_seed(0)
    dtype = _load_dtype()
    model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return {"path": dest, "parameters": sum(p.numel() for p in model.parameters()), "dtype": str(dtype),
            "sizes": sizes}


# ================================================================================== the two sides


def _precision() -> dict[str, bool]:
    """GRPOConfig's bf16/fp16 as grpo_magic chooses them for this GPU (a plain TRL user on a T4 picks fp16 too)."""
    from grpo_magic.runtime.device import choose_precision, grpo_precision_kwargs

    return grpo_precision_kwargs(choose_precision())


def _load_dtype() -> Any:
    from grpo_magic.runtime.device import choose_precision, load_dtype

    return load_dtype(choose_precision())


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _params(out: str, model_path: str, work: dict[str, Any], **extra: Any):
    from grpo_magic import GRPOParams

    keys = ("batch_size", "rl_num_generations", "rl_max_new_tokens")
    return GRPOParams(model=model_path, project_name=out, max_steps=work["steps"],
                      **{k: work[k] for k in keys}, **COMMON, **extra)


def _plain_config(out: str, work: dict[str, Any], use_vllm: bool = False):
    """A plain TRL user's GRPOConfig, spelled out (compared with GRPOParams.to_grpo_config)."""
    from trl import GRPOConfig

    extra: dict[str, Any] = {}
    if use_vllm:
        extra = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}
    return GRPOConfig(
        output_dir=out, num_generations=work["rl_num_generations"], max_completion_length=work["rl_max_new_tokens"],
        per_device_train_batch_size=work["batch_size"], learning_rate=COMMON["lr"], beta=COMMON["rl_kl_coef"],
        max_steps=work["steps"], seed=COMMON["seed"], temperature=1.0, top_k=50, top_p=1.0, epsilon=0.2,
        loss_type="dapo", num_train_epochs=1, gradient_accumulation_steps=1, logging_steps=1, save_steps=500,
        save_strategy="steps", report_to=[], **_precision(), dataloader_pin_memory=_cuda(), disable_tqdm=True,
        log_completions=False, **extra,
    )


def _config_differences(model_path: str, work: dict[str, Any], use_vllm: bool) -> list[str]:
    out = tempfile.mkdtemp(prefix="gpu-cfg-")
    extra = {"use_vllm": True, "vllm_mode": "colocate"} if use_vllm else {}
    ours = _params(out, model_path, work, **extra).to_grpo_config(out).to_dict()
    plain = _plain_config(out, work, use_vllm).to_dict()
    return sorted(k for k in set(ours) | set(plain)
                  if k not in ("output_dir", "logging_dir") and ours.get(k) != plain.get(k))


def _result(timer: Any, work: dict[str, Any], e2e: float, **extra: Any) -> dict[str, Any]:
    tokens = sum(length * work["batch_size"] for length in timer.lengths)
    return {"loop_s": timer.wall, "e2e_s": e2e, "completion_tokens": tokens,
            "tokens_per_s": tokens / timer.wall if timer.wall else None, "rewards": timer.rewards, **extra}


def run_grpo_magic(model_path: str, work: dict[str, Any], env: Any, *, env_config: dict[str, Any] | None = None,
                   workers: int = 1, use_vllm: bool = False) -> dict[str, Any]:
    from grpo_magic import train
    from grpo_magic.dashboard import Dashboard

    out = tempfile.mkdtemp(prefix="gpu-gm-")
    timer = B._timer_callback()
    dash = Dashboard(run_log=out)  # as train() builds it, headless
    extra: dict[str, Any] = {"rl_env_workers": workers}
    if env_config:
        extra["rl_env_config"] = json.dumps(env_config)
    if use_vllm:
        extra.update(use_vllm=True, vllm_mode="colocate")
    t = time.perf_counter()
    with B._silence():
        run = train(_params(out, model_path, work, **extra), env, callbacks=[dash, timer], display=False)
    e2e = time.perf_counter() - t
    if run.status != "completed":
        raise RuntimeError(f"grpo_magic run {run.status}: {run.reason}")
    return _result(timer, work, e2e, renders=dash.render_count, render_s=dash.render_seconds)


def _load_plain(model_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_load_dtype())
    return model, tokenizer


def run_plain_letters(model_path: str, work: dict[str, Any], use_vllm: bool = False) -> dict[str, Any]:
    from trl import GRPOTrainer

    from envs.letters import LettersEnv

    out = tempfile.mkdtemp(prefix="gpu-trl-")
    timer = B._timer_callback()
    t = time.perf_counter()
    with B._silence():
        model, tokenizer = _load_plain(model_path)
        trainer = GRPOTrainer(model=model, reward_funcs=[B.letters_share], args=_plain_config(out, work, use_vllm),
                              train_dataset=LettersEnv().build_dataset(tokenizer), processing_class=tokenizer,
                              callbacks=[timer])
        trainer.train()
        trainer.save_model(out)
        tokenizer.save_pretrained(out)
    return _result(timer, work, time.perf_counter() - t)


# ---- the multi-turn env ----------------------------------------------------------------------


def _hotel_env_class():
    from envs.hotel_env import HotelEnv

    class HotelEnvForcedTurn(HotelEnv):
        """HotelEnv whose episodes always continue: the case's search call comes first."""

        def score_episode(self, model, tokenizer, completion: str, case_idx: int) -> dict[str, float]:
            first = self.solution_turns(case_idx)[0]
            return super().score_episode(model, tokenizer, f"{first}\n{completion}", case_idx)

    return HotelEnvForcedTurn


def run_plain_hotel(model_path: str, work: dict[str, Any]) -> dict[str, Any]:
    """What a user writes without grpo_magic: prompts rendered with the tools, a sequential wrapper."""
    import torch
    from trl import GRPOTrainer

    env = _hotel_env_class()(**work["env"])
    tools = env.get_tools()
    out = tempfile.mkdtemp(prefix="gpu-trl-hotel-")
    timer = B._timer_callback()
    holder: dict[str, Any] = {}

    def hotel_reward(completions: list[str], case_idx: list[int], **kwargs: Any) -> list[float]:
        model = holder["trainer"].accelerator.unwrap_model(holder["trainer"].model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                # HotelEnv returns {"score": ..., **rubric breakdown}: a plain TRL reward wants the number
                return [env.score_episode(model, holder["tokenizer"], c, i)["score"]
                        for c, i in zip(completions, case_idx, strict=True)]
        finally:
            model.train(was_training)

    t = time.perf_counter()
    with B._silence():
        model, tokenizer = _load_plain(model_path)
        dataset = env.build_dataset(tokenizer).map(lambda row: {"prompt": tokenizer.apply_chat_template(
            row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)})
        trainer = GRPOTrainer(model=model, reward_funcs=[hotel_reward], args=_plain_config(out, work),
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
        holder.update(trainer=trainer, tokenizer=tokenizer)
        trainer.train()
        trainer.save_model(out)
        tokenizer.save_pretrained(out)
    return _result(timer, work, time.perf_counter() - t)


# ================================================================================== workers


def worker_letters(args: dict[str, Any]) -> dict[str, Any]:
    from envs.letters import LettersEnv

    path, work = args["model_path"], args["work"]
    warm = {**work, "steps": 1}
    run_plain_letters(path, warm)
    run_grpo_magic(path, warm, LettersEnv)
    rounds = []
    for rep in range(work["reps"]):
        order = ["B", "A"] if rep % 2 == 0 else ["A", "B"]
        r: dict[str, Any] = {"order": order}
        for side in order:
            r[side] = run_plain_letters(path, work) if side == "B" else run_grpo_magic(path, work, LettersEnv)
        rounds.append(r)
    return {"rounds": rounds, "config_differences": _config_differences(path, work, False)}


def worker_vllm(args: dict[str, Any]) -> dict[str, Any]:
    from envs.letters import LettersEnv

    path, work = args["model_path"], args["work"]
    if args["side"] == "B":
        return run_plain_letters(path, work, use_vllm=True)
    return {**run_grpo_magic(path, work, LettersEnv, use_vllm=True),
            "config_differences": _config_differences(path, work, True)}


def worker_hotel(args: dict[str, Any]) -> dict[str, Any]:
    path, work = args["model_path"], args["work"]
    env = _hotel_env_class()
    return {
        "B": run_plain_hotel(path, work),
        "A1": run_grpo_magic(path, work, env, env_config=work["env"], workers=1),
        "A8": run_grpo_magic(path, work, env, env_config=work["env"], workers=work["workers"]),
    }


def worker_build(args: dict[str, Any]) -> dict[str, Any]:
    return build_model(args["dest"], args["smoke"])


WORKERS = {"build": worker_build, "letters": worker_letters, "vllm": worker_vllm, "hotel": worker_hotel}


# ================================================================================== driver


_THREADS = [os.cpu_count() or 1]  # torch threads of the workers (1 for --smoke on a shared CPU)


def _call(name: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--worker-args", json.dumps(args)]
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-bench-") as tmp:  # the runs' output folders go there
        env = {**B._quiet_env(_THREADS[0]), "TMPDIR": tmp}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 30))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(B.RESULT_MARK):
            return json.loads(line[len(B.RESULT_MARK):])
    raise RuntimeError(f"worker {name} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2500:]}")


def _ratio_summary(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    ratios = [a["loop_s"] / b["loop_s"] for a, b in pairs]
    return {
        "overhead_ratio": B._spread(ratios),
        "tokens_per_s": {"grpo_magic": B._spread([a["tokens_per_s"] for a, _ in pairs], 1),
                         "plain_trl": B._spread([b["tokens_per_s"] for _, b in pairs], 1)},
        "loop_s": {"grpo_magic": B._spread([a["loop_s"] for a, _ in pairs]),
                   "plain_trl": B._spread([b["loop_s"] for _, b in pairs])},
        "e2e_ratio": B._spread([a["e2e_s"] / b["e2e_s"] for a, b in pairs]),
        "same_rewards": all(a["rewards"] == b["rewards"] for a, b in pairs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on any device, to check the script")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM colocate pair")
    parser.add_argument("--only", default="", help="comma-separated: letters,vllm,hotel")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting sections past this (seconds)")
    parser.add_argument("--save", default=None, help="also write the JSON result to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        sys.path.insert(0, str(ROOT))
        os.chdir(ROOT)
        import warnings

        warnings.filterwarnings("ignore")
        B._report(WORKERS[args.worker](json.loads(args.worker_args)))
        return 0

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    import torch  # only the driver's check; every measurement runs in a subprocess

    cuda = torch.cuda.is_available()
    result: dict[str, Any] = {"machine": B.machine_info(), "smoke": args.smoke, "cuda": cuda}
    if cuda:
        result["machine"]["gpu"] = torch.cuda.get_device_name(0)
    if not cuda and not args.smoke:
        result["skipped"] = "no CUDA GPU here: nothing measured (bench/gpu.py --smoke checks the script on a CPU)"
        log(result["skipped"])
        if args.json:
            print(json.dumps(result))
        return 0
    sections = [s.strip() for s in args.only.split(",") if s.strip()] or ["letters", "vllm", "hotel"]
    if args.no_vllm or args.smoke or importlib.util.find_spec("vllm") is None:
        if "vllm" in sections:
            result["vllm"] = {"skipped": "--no-vllm, --smoke or vllm not installed"}
            sections.remove("vllm")
    work = SMOKE_WORK if args.smoke else WORK
    if args.smoke:
        _THREADS[0] = 1
    started = time.perf_counter()

    def left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    model_dir = tempfile.mkdtemp(prefix="gpu-bench-model-")
    result["model"] = _call("build", {"dest": model_dir, "smoke": args.smoke}, left())
    log(f"model: {result['model']['parameters'] / 1e6:.0f}M parameters, {result['model']['dtype']}")
    path = result["model"]["path"]

    for section in sections:
        if not args.smoke and left() < ESTIMATE_S[section]:
            result[section] = {"skipped": f"not enough time left ({left():.0f} s of --budget-s)"}
            log(f"[{section}] skipped: {result[section]['skipped']}")
            continue
        t = time.perf_counter()
        try:
            if section == "letters":
                res = _call("letters", {"model_path": path, "work": work["letters"]}, left())
                result["letters"] = {**_ratio_summary([(r["A"], r["B"]) for r in res["rounds"]]),
                                     "grpo_config_differences": res["config_differences"], "work": work["letters"]}
            elif section == "vllm":
                b = _call("vllm", {"model_path": path, "work": work["vllm"], "side": "B"}, left())
                a = _call("vllm", {"model_path": path, "work": work["vllm"], "side": "A"}, left())
                result["vllm"] = {**_ratio_summary([(a, b)]), "grpo_config_differences": a["config_differences"],
                                  "work": work["vllm"]}
            elif section == "hotel":
                res = _call("hotel", {"model_path": path, "work": work["hotel"]}, left())
                result["hotel"] = {
                    "overhead_ratio_workers_1": round(res["A1"]["loop_s"] / res["B"]["loop_s"], 3),
                    "speedup_workers_n": round(res["B"]["loop_s"] / res["A8"]["loop_s"], 2),
                    "workers_n": work["hotel"]["workers"],
                    "tokens_per_s": {k: round(v["tokens_per_s"], 1) for k, v in res.items()},
                    "loop_s": {k: round(v["loop_s"], 2) for k, v in res.items()},
                    "note": "tokens are TRL's completion tokens; the env's own turns add more work on every side",
                    "work": work["hotel"],
                }
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            result[section] = {"failed": str(exc)[-1500:]}
        log(f"[{section}] {time.perf_counter() - t:.0f} s: {json.dumps(result[section])[:400]}")
    result["bench_seconds"] = round(time.perf_counter() - started, 1)
    with contextlib.suppress(Exception):
        import shutil

        shutil.rmtree(model_dir, ignore_errors=True)
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
