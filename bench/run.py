"""Benchmarks of grpo_magic: what it costs over plain TRL, and what concurrent episodes gain.

    python bench/run.py --quick          # under 5 minutes (no agent rows, no tiny-math build)
    python bench/run.py                  # the full run (about 10 minutes on 2 CPU cores)
    python bench/run.py --quick --json   # the last line printed is one JSON object
    python bench/run.py --only overhead,scoring
    python bench/run.py --quick --only overhead --fixed-malloc   # glibc malloc with fixed thresholds, both sides

Figures (see bench/RESULTS.md for what each one times and the latest numbers):

- overhead_ratio: training-loop wall time of ``grpo_magic.train`` (events, run log, the dashboard
  rendering headlessly, the reward-hacking watch) over a plain TRL ``GRPOTrainer`` script doing the same
  work, median of pairwise ratios (goal <= 1.03): 12 alternated pairs in 3 processes in the quick run (each
  process's own layout moves all of its pairs by a percent or two). Where the time goes: bench/overhead_parts.py.
  Each run's minor page faults are counted: with glibc's default malloc thresholds they vary from process to process
  and move a run by several percent; ``--fixed-malloc`` runs both sides with fixed thresholds (about 200 a run).
- concurrent_scoring_speedup: a 50 ms-latency env, sequential scoring vs ``async def
  score_episode`` and ``rl_env_workers`` threads (goal >= 80% of the ideal).
- import_ms: ``%load_ext grpo_magic`` in a fresh IPython shell, and proof torch is not imported.
- dashboard_ms_per_event, memory: the dashboard's cost per event at the throttled rate, and
  memory of the dashboard and of a run's event handling after 1,000 and 10,000 synthetic steps.
- learn_seconds: seconds (and steps) until the letters env's mean reward first exceeds a threshold.
- rescore_throughput: ``grpo_magic.rescore`` of a real run log with a 50 ms-latency env, completions
  per second, sequential vs ``rl_env_workers`` threads vs ``async def score_episode`` (goal >= 80%
  of the ideal speedup).
- curves: how often the live curves update (per logged step) and their share of the training loop's
  time, in the overhead runs (real training) and in the paced synthetic stream.
- teach: ``tiny-math`` (the warm-started offline model): its build time, and the rise of its
  exact-match accuracy on sums under the lesson's fixed GRPO recipe, with the seconds to reach it.

Each figure is measured in fresh subprocesses (``--worker NAME``) so that one benchmark's imports,
threads and memory never leak into another's. Benchmarks are scripts, never timed test assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
RESULT_MARK = "@@BENCH_RESULT "

# The workload of the overhead and learning benchmarks (the letters setting).
LETTERS = {"batch_size": 16, "rl_num_generations": 8, "rl_max_new_tokens": 16, "lr": 5e-3, "rl_kl_coef": 0.0, "seed": 42}

QUICK = {
    "overhead": {"procs": 3, "reps": 4, "steps": 40, "sides": ["B", "A"]},
    "scoring": {"steps": 3, "episodes": 32, "latency_s": 0.05},
    "import": {"runs": 3},
    "dashboard": {"paced_steps": 500, "step_s": 0.1, "memory_steps": (1000, 10000)},
    "learn": {"runs": 1, "max_steps": 60},
    "rescore": {"steps": 2, "episodes": 32, "latency_s": 0.05, "workers": 32, "reps": 2},
    "teach": {"seeds": [42, 1], "build": False},  # the build (about 90 s) is timed in the full run
    "evaluate": {"seeds": [42], "samples": 4},
    "kernel": {"runs": 1, "steps": 100},
}
FULL = {
    "overhead": {"procs": 2, "reps": 4, "steps": 500, "sides": ["B", "A"]},
    "scoring": {"steps": 5, "episodes": 32, "latency_s": 0.05},
    "import": {"runs": 7},
    "dashboard": {"paced_steps": 2000, "step_s": 0.1, "memory_steps": (1000, 10000)},
    "learn": {"runs": 3, "max_steps": 60},
    "rescore": {"steps": 4, "episodes": 32, "latency_s": 0.05, "workers": 32, "reps": 3},
    "agent": {"seeds": [1, 2, 3], "max_steps": 16},
    "teach": {"seeds": [42, 1, 2, 3, 4], "build": True},
    "evaluate": {"seeds": [42, 1, 2], "samples": 4},
    "kernel": {"runs": 3, "steps": 200},
}
GOALS = {"overhead_ratio": 1.03, "scoring_efficiency": 0.8, "curve_updates_per_step": 0.5, "curve_share": 0.01,
         "teach_rise": 0.15, "teach_build_s": 180.0}
# The lesson's fixed GRPO recipe on tiny-math (notebooks/04_sft_then_grpo.ipynb; tune the model, never this).
TEACH = {"rl_num_generations": 8, "batch_size": 32, "rl_max_new_tokens": 8, "lr": 5e-4, "rl_kl_coef": 0.0,
         "max_steps": 60}


# ================================================================================== helpers


# glibc's malloc with fixed thresholds (``--fixed-malloc``): no dynamic mmap threshold and no trimming of the heap.
# With glibc's defaults a 40-step letters run takes 40,000 to 240,000 minor page faults (fresh pages for torch's
# buffers), a count that varies from process to process and between the two sides of one process; with these it takes
# about 200. Both sides run under the same setting; the figures record which one was used.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "4294967296",
                "MALLOC_TOP_PAD_": "268435456"}


def _malloc_env() -> dict[str, str]:
    """The glibc malloc settings the workers run under (empty: glibc's defaults)."""
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def _allocator_label(allocator: Any) -> str:
    """A saved run's ``allocator`` in words."""
    if not isinstance(allocator, dict):
        return str(allocator)
    if allocator == FIXED_MALLOC:
        return "fixed thresholds"
    return ", ".join(f"{k}={v}" for k, v in sorted(allocator.items()))


def _minor_faults() -> int | None:
    """The process's minor page faults so far (None where ``resource`` does not exist)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _quiet_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONWARNINGS="ignore",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    return env


def _spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}

    def r(v: float) -> float:
        return int(round(v)) if digits == 0 else round(v, digits)

    return {"median": r(statistics.median(values)), "min": r(min(values)), "max": r(max(values)), "n": len(values)}


def _worker(name: str, args: dict[str, Any], threads: int, timeout: float = 1200) -> dict[str, Any]:
    """Run ``--worker name`` in a fresh interpreter and return the JSON it reports."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--worker-args", json.dumps(args),
           "--threads", str(threads)]
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:  # the runs' output folders go there
        proc = subprocess.run(cmd, cwd=ROOT, env={**_quiet_env(threads), "TMPDIR": tmp}, capture_output=True,
                              text=True, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (proc.stderr or proc.stdout)[-3000:]
    raise RuntimeError(f"benchmark worker {name} failed (exit {proc.returncode}):\n{tail}")


def _report(result: dict[str, Any]) -> None:
    print(RESULT_MARK + json.dumps(result), flush=True)


def _setup_worker(threads: int) -> None:
    """Same thread settings on every side: torch's OpenMP threads spin-wait, which on a busy
    2-core machine turns any contention into large, random slowdowns."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(threads)
    import transformers

    transformers.logging.set_verbosity_error()
    with contextlib.suppress(Exception):
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


@contextlib.contextmanager
def _silence():
    """Plain TRL prints its logs (PrinterCallback); keep the benchmark's own output readable."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def machine_info() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    versions = {}
    for mod in ("torch", "transformers", "trl", "ipywidgets", "matplotlib"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[mod] = version(mod)
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()[0]
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "ram_gib": mem_gib,
        "python": platform.python_version(),
        "versions": versions,
        "load_avg_1min_at_start": round(load, 2) if load is not None else None,
    }


# ================================================================================== the envs


class LatencyEnv:
    """Each episode waits ``latency_s`` (a tool call, a remote API), then scores the length parity."""

    def __init__(self, latency_s: float = 0.05, n_prompts: int = 64) -> None:
        self.latency_s = latency_s
        self.n_prompts = n_prompts

    def build_dataset(self, tokenizer):
        from datasets import Dataset

        return Dataset.from_dict({"prompt": [f"Say something about number {i}: " for i in range(self.n_prompts)]})

    def score_episode(self, model, tokenizer, completion: str) -> float:
        time.sleep(self.latency_s)
        return float(len(completion) % 2)


class AsyncLatencyEnv(LatencyEnv):
    """The same episodes written as ``async def``: one step's episodes run concurrently."""

    async def score_episode(self, model, tokenizer, completion: str) -> float:  # type: ignore[override]
        await asyncio.sleep(self.latency_s)
        return float(len(completion) % 2)


def letters_share(completions: list[str], letter: list[str], **kwargs: Any) -> list[float]:
    """The letters env's reward as a plain TRL reward function (same arithmetic as LettersEnv)."""
    rewards = []
    for completion, target in zip(completions, letter, strict=True):
        chars = [c for c in completion.lower() if not c.isspace()]
        rewards.append(sum(c == target for c in chars) / len(chars) if chars else 0.0)
    return rewards


# ================================================================================== workers


def _timer_callback(dash: Any = None):
    """A TrainerCallback that times the training loop (``on_train_begin`` to ``on_train_end``), and the
    dashboard renderer's time within it (``dash.render_seconds``, off the training thread) when one is given."""
    from transformers import TrainerCallback

    class LoopTimer(TrainerCallback):
        def __init__(self) -> None:
            self.rewards: list[float] = []
            self.lengths: list[float] = []
            self.step_s: list[float] = []
            self._step0 = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.f0 = _minor_faults()
            self.t0, self.c0 = time.perf_counter(), time.process_time()
            self.busy0 = dash.render_seconds if dash is not None else 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._step0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self._step0)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(round(float(logs["reward"]), 6))
                self.lengths.append(float(logs.get("completions/mean_length", 0.0)))

        def on_train_end(self, args, state, control, **kwargs):
            self.wall = time.perf_counter() - self.t0
            self.cpu = time.process_time() - self.c0
            self.busy = (dash.render_seconds - self.busy0) if dash is not None else 0.0
            f1 = _minor_faults()
            self.faults = f1 - self.f0 if f1 is not None and self.f0 is not None else None

    return LoopTimer()


def _letters_params(out: str, steps: int, **changes: Any):
    from grpo_magic import GRPOParams

    return GRPOParams(model="tiny", project_name=out, max_steps=steps, **{**LETTERS, **changes})


def _plain_config(out: str, steps: int):
    """What a plain TRL user writes, spelled out (checked against GRPOParams.to_grpo_config)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out,
        num_generations=LETTERS["rl_num_generations"],
        max_completion_length=LETTERS["rl_max_new_tokens"],
        per_device_train_batch_size=LETTERS["batch_size"],
        learning_rate=LETTERS["lr"],
        beta=LETTERS["rl_kl_coef"],
        max_steps=steps,
        seed=LETTERS["seed"],
        temperature=1.0,
        top_k=50,
        top_p=1.0,
        epsilon=0.2,
        loss_type="dapo",
        num_train_epochs=1,
        gradient_accumulation_steps=1,
        logging_steps=1,
        save_steps=500,
        save_strategy="steps",
        report_to=[],
        bf16=False,
        dataloader_pin_memory=False,  # no GPU to pin for (GRPOParams does the same)
        disable_tqdm=True,
        log_completions=False,
        max_tool_calling_iterations=5,  # GRPOParams always sets rl_max_tool_turns; without tools TRL ignores it
    )


def _config_differences(steps: int) -> list[str]:
    out = tempfile.mkdtemp(prefix="bench-cfg-")
    ours = _letters_params(out, steps).to_grpo_config(out).to_dict()
    plain = _plain_config(out, steps).to_dict()
    skip = {"output_dir", "logging_dir"}
    return sorted(k for k in set(ours) | set(plain) if k not in skip and ours.get(k) != plain.get(k))


def _run_grpo_magic(steps: int, dashboard: bool) -> dict[str, Any]:
    from envs.letters import LettersEnv
    from grpo_magic import train

    out = tempfile.mkdtemp(prefix="bench-gm-")
    dash = None
    if dashboard:
        from grpo_magic.dashboard import Dashboard

        dash = Dashboard(run_log=out)  # as train() builds it, minus display: headless
    timer = _timer_callback(dash)
    callbacks: list[Any] = [timer] if dash is None else [dash, timer]
    t = time.perf_counter()
    with _silence():
        run = train(_letters_params(out, steps), LettersEnv, callbacks=callbacks, display=False)
    e2e = time.perf_counter() - t
    assert run.status == "completed", run.reason
    result = {"loop_s": timer.wall, "loop_cpu_s": timer.cpu, "e2e_s": e2e, "rewards": timer.rewards,
              "step_s": timer.step_s, "faults": timer.faults}
    if dash is not None:
        result.update(renders=dash.render_count, render_s=dash.render_seconds, curve_updates=dash.curve_updates,
                      points_sent=dash.points_sent, busy_s=timer.busy, logged_steps=len(dash.view.steps))
    return result


def _run_plain_trl(steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from envs.letters import LettersEnv
    from grpo_magic.models import tiny_model_path

    path = str(tiny_model_path())
    out = tempfile.mkdtemp(prefix="bench-trl-")
    timer = _timer_callback()
    t = time.perf_counter()
    with _silence():
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        dataset = LettersEnv().build_dataset(tokenizer)
        trainer = GRPOTrainer(model=model, reward_funcs=[letters_share], args=_plain_config(out, steps),
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
        trainer.train()
        trainer.save_model(out)
        tokenizer.save_pretrained(out)
    e2e = time.perf_counter() - t
    return {"loop_s": timer.wall, "loop_cpu_s": timer.cpu, "e2e_s": e2e, "rewards": timer.rewards,
            "step_s": timer.step_s, "faults": timer.faults}


def worker_overhead(args: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then alternate plain TRL (B), grpo_magic with dashboard (A) and without (A0)."""
    steps, reps, offset = args["steps"], args["reps"], args.get("offset", 0)
    _run_plain_trl(2)  # imports, allocator, kernels
    _run_grpo_magic(2, dashboard=True)  # + matplotlib, ipywidgets
    sides = {"B": lambda: _run_plain_trl(steps), "A": lambda: _run_grpo_magic(steps, True),
             "A0": lambda: _run_grpo_magic(steps, False)}
    rounds = []
    for rep in range(reps):
        order = list(args["sides"])
        k = (rep + offset) % len(order)
        order = order[k:] + order[:k]  # every side takes every position in turn (B A, A B, ...)
        rounds.append({"order": order, **{side: sides[side]() for side in order}})
    return {"rounds": rounds, "config_differences": _config_differences(steps)}


def worker_scoring(args: dict[str, Any]) -> dict[str, Any]:
    """Train a few steps on a latency-bound env and time the reward call of each step."""
    from grpo_magic import GRPOParams, train
    from grpo_magic.environment.reward import EnvReward

    calls: list[float] = []
    original = EnvReward.score  # what TRL's reward function of a run calls (trainer.StepRecords)

    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            calls.append(time.perf_counter() - t)

    EnvReward.score = timed  # type: ignore[method-assign]
    n, latency, steps = args["episodes"], args["latency_s"], args["steps"]
    modes = {
        "sequential": (LatencyEnv, 1),
        "threads": (LatencyEnv, n),
        "async": (AsyncLatencyEnv, 1),
    }
    results = {}
    for mode, (env_cls, workers) in modes.items():
        calls.clear()
        out = tempfile.mkdtemp(prefix=f"bench-score-{mode}-")
        timer = _timer_callback()
        params = GRPOParams(model="tiny", project_name=out, batch_size=n, rl_num_generations=8, rl_max_new_tokens=8,
                            rl_kl_coef=0.0, max_steps=steps, rl_env_workers=workers,
                            rl_env_config=json.dumps({"latency_s": latency}))
        with _silence():
            run = train(params, env_cls, callbacks=[timer], display=False)
        assert run.status == "completed", run.reason
        results[mode] = {"reward_call_s": list(calls), "step_s": timer.step_s, "workers": workers}
    return results


IMPORT_PROBE = r"""
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t = time.perf_counter()
shell.run_line_magic("load_ext", "grpo_magic")
ms = (time.perf_counter() - t) * 1000
heavy = ["torch", "transformers", "trl", "datasets", "peft", "accelerate", "matplotlib", "ipywidgets", "numpy"]
print(json.dumps({"load_ext_ms": ms, "loaded": {m: m in sys.modules for m in heavy},
                  "magics": sorted(k for k in shell.magics_manager.magics["line"] if k.startswith("grpo"))}))
"""


def worker_import(args: dict[str, Any]) -> dict[str, Any]:
    runs = []
    for _ in range(args["runs"]):
        proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], cwd=ROOT, env=_quiet_env(1),
                              capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"runs": runs}


# ---- synthetic event stream ----------------------------------------------------------------

_METRICS_TEMPLATE = {
    "loss": -0.0775, "grad_norm": 1.967, "learning_rate": 0.005, "num_tokens": 450.0,
    "completions/mean_length": 15.1, "completions/min_length": 2.0, "completions/max_length": 16.0,
    "completions/clipped_ratio": 0.94, "completions/mean_terminated_length": 2.0,
    "completions/min_terminated_length": 2.0, "completions/max_terminated_length": 2.0,
    "rewards/env/mean": 0.0647, "rewards/env/std": 0.0402, "reward": 0.0647, "reward_std": 0.0402,
    "frac_reward_zero_std": 0.0, "env/clipped_rate": 0.0, "env/error_rate": 0.0, "env/latency_s": 6e-06,
    "kl": 0.0, "entropy": 6.56, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
    "clip_ratio/region_mean": 0.0, "clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.0, "step_time": 0.1,
    "epoch": 0.03,
}


def _synthetic_step(step: int, rng, groups: int = 2, generations: int = 8, error_every: int = 50) -> list[str]:
    """One step of a letters-like run as JSON lines (decoded anew, as TRL's logs are built anew)."""
    from grpo_magic.events import EpisodeError, GroupScored, StepLogged, event_to_json

    alphabet = "abcdefgh ijk lmn a a a"
    lines = []
    for g in range(groups):
        scores = [round(rng.random(), 4) for _ in range(generations)]
        errors: list[Any] = [None] * generations
        if error_every and step % error_every == 0 and g == 0:
            scores[0] = None  # type: ignore[call-overload]
            errors[0] = {"kind": "ValueError", "message": "ValueError: bad",
                         "traceback": "Traceback (most recent call last):\n  ...\nValueError: bad\n"}
            lines.append(event_to_json(EpisodeError(step=step, index=0, kind="ValueError", message="ValueError: bad",
                                                    traceback=errors[0]["traceback"])))
        lines.append(event_to_json(GroupScored(
            step=step, group=g, prompt="Write the letter a many times: ",
            completions=["".join(rng.choice(alphabet) for _ in range(48)) for _ in range(generations)],
            scores=scores, advantages=[round(rng.gauss(0, 1), 4) for _ in range(generations)], errors=errors,
            clipped=[False] * generations, raw_scores=list(scores), latency_s=[5e-06] * generations,
        )))
    metrics = dict(_METRICS_TEMPLATE, reward=rng.random(), loss=rng.gauss(0, 0.1), kl=rng.random() * 0.01)
    lines.append(event_to_json(StepLogged(step=step, metrics=metrics, max_steps=10_000, epoch=step / 32,
                                          elapsed_s=step * 0.1, episode_errors=int(step % error_every == 0),
                                          episodes=groups * generations)))
    return lines


_KEYS: dict[str, str] = {}


def _decode(line: str):
    """An event from its JSON line, with metric names shared between steps as TRL's are (its
    ``_metrics`` dict keeps the same key strings; json.loads would make new ones every step)."""
    import json as _json

    from grpo_magic.events import event_from_dict

    data = _json.loads(line)
    if isinstance(data.get("metrics"), dict):
        data["metrics"] = {_KEYS.setdefault(k, k): v for k, v in data["metrics"].items()}
    return event_from_dict(data)


def worker_dashboard(args: dict[str, Any]) -> dict[str, Any]:
    """What the training thread pays per event (the hand-over to the dashboard's queue), and what one
    renderer turn costs after each step's events (fold, header, new curve points, and every 4th turn the
    slower parts), with no renderer thread: the turns are taken here, one per step, to time them."""
    import random

    from grpo_magic.dashboard import Dashboard
    from grpo_magic.events import EventStream, RunLog, RunStarted, StatusChanged

    out = tempfile.mkdtemp(prefix="bench-dash-")
    stream = EventStream()
    log = RunLog(out)
    stream.subscribe(log)
    dash = Dashboard(run_log=out, interval_s=None)
    spent = [0.0]
    events = [0]

    def timed_dash(event):
        t = time.perf_counter()
        dash(event)
        spent[0] += time.perf_counter() - t
        events[0] += 1

    stream.subscribe(timed_dash)
    stream.emit(RunStarted(params={}, env_name="LettersEnv", model="tiny", output_dir=out, max_steps=10_000))
    stream.emit(StatusChanged(status="training", message="10000 steps"))
    rng = random.Random(0)
    steps, step_s = args["paced_steps"], args["step_s"]
    lines_per_step = [_synthetic_step(s, rng) for s in range(1, steps + 1)]
    spent[0], events[0] = 0.0, 0
    turns: list[float] = []
    renders0, updates0 = dash.render_count, dash.curve_updates
    for i, lines in enumerate(lines_per_step):
        for line in lines:
            stream.emit(_decode(line))
        t = time.perf_counter()
        with dash._lock:
            dash._drain()
            dash._render(every=i % 4 == 0)
        turns.append(time.perf_counter() - t)
    log.close()
    per_step = spent[0] / steps
    return {
        "events": events[0], "steps": steps, "step_s": step_s, "dashboard_s": spent[0],
        "ms_per_event": 1000 * spent[0] / max(events[0], 1), "ms_per_step": 1000 * per_step,
        "share_of_step": per_step / step_s, "renders": dash.render_count - renders0,
        "curve_renders": len(turns), "curve_render_ms": _spread([1000 * p for p in turns], 2),
        "first_curve_render_ms": round(1000 * turns[0], 1) if turns else None,
        "curve_updates": dash.curve_updates - updates0, "curve_updates_per_step": (dash.curve_updates - updates0) / steps,
        "curve_share_of_step": sum(turns) / (steps * step_s),
    }


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return 0


def worker_memory(args: dict[str, Any]) -> dict[str, Any]:
    """Traced memory of one subscriber after 1k and 10k synthetic steps (``target``: run or dashboard)."""
    import gc
    import random
    import tracemalloc

    from grpo_magic import GRPOParams
    from grpo_magic.dashboard import Dashboard
    from grpo_magic.events import RunLog, RunStarted, StatusChanged
    from grpo_magic.training.run import GRPORun

    out = tempfile.mkdtemp(prefix="bench-mem-")
    target = args["target"]
    run = GRPORun(GRPOParams(model="tiny", project_name=out), "LettersEnv", Path(out))  # its own handler subscribes
    log = RunLog(out)
    run.events.subscribe(log)
    dash = None
    if target == "dashboard":
        run.events._subscribers.remove(run._on_event)  # measure the dashboard alone
        # The renderer thread folds the queue a few times a second: what is measured is the state kept.
        dash = Dashboard(run_log=out)
        run.events.subscribe(dash)
    run.events.emit(RunStarted(params={}, env_name="LettersEnv", model="tiny", output_dir=out, max_steps=10_000))
    run.events.emit(StatusChanged(status="training"))
    rng = random.Random(1)
    checkpoints = sorted(args["checkpoints"])
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rss0 = _rss_kib()
    marks = {}
    t = time.perf_counter()
    for step in range(1, checkpoints[-1] + 1):
        for line in _synthetic_step(step, rng):
            run.events.emit(_decode(line))
        if step in checkpoints:
            if dash is not None:
                dash.flush()
            gc.collect()
            marks[step] = {"traced_kib": round((tracemalloc.get_traced_memory()[0] - base) / 1024, 1),
                           "rss_kib": _rss_kib() - rss0}
    top = tracemalloc.take_snapshot().statistics("lineno")[:5]
    tracemalloc.stop()
    log.close()
    info: dict[str, Any] = {"target": target, "marks": marks, "seconds": round(time.perf_counter() - t, 1),
                            "top": [f"{s.traceback[0].filename.split('/site-packages/')[-1].split('/work/main/')[-1]}:"
                                    f"{s.traceback[0].lineno} {s.size // 1024} KiB" for s in top]}
    if target == "run":
        info.update(history=len(run.history), groups=len(run.groups), errors=len(run.errors))
    else:
        info.update(groups_in_memory=dash.groups_in_memory(), renders=dash.render_count)  # type: ignore[union-attr]
    return info


def worker_learn(args: dict[str, Any]) -> dict[str, Any]:
    """Train on the letters env until the mean reward first exceeds ``threshold``."""
    from transformers import TrainerCallback

    from envs.letters import LettersEnv
    from grpo_magic import train

    threshold = args["threshold"]

    class UntilThreshold(TrainerCallback):
        def __init__(self) -> None:
            self.rewards: list[float] = []
            self.reached: tuple[int, float] | None = None

        def on_train_begin(self, a, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            self.rewards.append(round(float(logs["reward"]), 4))
            if self.reached is None and logs["reward"] > threshold:
                self.reached = (state.global_step, time.perf_counter() - self.t0)
                control.should_training_stop = True

    out = tempfile.mkdtemp(prefix="bench-learn-")
    cb = UntilThreshold()
    t = time.perf_counter()
    with _silence():
        run = train(_letters_params(out, args["max_steps"], lr=args["lr"], rl_kl_coef=args["kl"]), LettersEnv,
                    callbacks=[cb], display=False)
    total = time.perf_counter() - t
    return {"reached": cb.reached is not None, "steps": cb.reached[0] if cb.reached else None,
            "loop_seconds": cb.reached[1] if cb.reached else None, "train_call_seconds": total,
            "rewards": cb.rewards, "status": run.status}


def worker_rescore(args: dict[str, Any]) -> dict[str, Any]:
    """Log a short real run, then rescore its completions with a latency-bound env, three ways."""
    from grpo_magic import GRPOParams, rescore, train

    n, latency, steps = args["episodes"], args["latency_s"], args["steps"]
    out = tempfile.mkdtemp(prefix="bench-rescore-")
    params = GRPOParams(model="tiny", project_name=out, batch_size=n, rl_num_generations=8, rl_max_new_tokens=8,
                        rl_kl_coef=0.0, max_steps=steps, rl_env_config=json.dumps({"latency_s": 0.0}))
    with _silence():
        run = train(params, LatencyEnv, display=False)
    assert run.status == "completed", run.reason
    modes = {"sequential": (LatencyEnv, 1), "threads": (LatencyEnv, args["workers"]), "async": (AsyncLatencyEnv, 1)}
    rescore(run.output_dir, LatencyEnv(latency_s=0.0))  # warm-up: imports, the tokenizer's first load
    results: dict[str, Any] = {}
    for mode, (env_cls, workers) in modes.items():
        walls, scoring, completions = [], [], 0
        for _ in range(args["reps"]):
            t = time.perf_counter()
            report = rescore(run.output_dir, env_cls(latency_s=latency), workers=workers)
            walls.append(time.perf_counter() - t)
            scoring.append(report.summary["seconds"])
            completions = report.summary["completions"]
            assert report.summary["errors"] == 0
        results[mode] = {"wall_s": walls, "scoring_s": scoring, "completions": completions, "workers": workers}
    return results


def worker_agent(args: dict[str, Any]) -> dict[str, Any]:
    """GRPO on an agent env through TRL's tool loop: tiny-agent learns to make a two-step request's second call
    (with the first's result) among three offered tools, on an env whose names it never saw (tests/agent_cells.py's
    ``GuessEncodeGreet``), sampled at 1; a quarter of the prompts held out, scored greedy before and after
    (``evaluate``), as tests/test_agent.py does."""
    from grpo_magic import GRPOParams, evaluate, train
    from grpo_magic.models import resolve_model
    from grpo_magic.models.cache import build_info
    from tests.agent_cells import CELLS

    t = time.perf_counter()
    path = resolve_model("tiny-agent")  # built here when the cache does not have it yet
    resolve_s = time.perf_counter() - t
    namespace: dict[str, Any] = {}
    exec(CELLS["GuessEncodeGreet"], namespace)  # noqa: S102 - the test suite's own env cell
    env = namespace["GuessEncodeGreet"]()
    out = tempfile.mkdtemp(prefix="bench-agent-")
    params = GRPOParams(model="tiny-agent", project_name=out, max_steps=args["max_steps"], batch_size=32,
                        rl_num_generations=8, rl_max_new_tokens=128, lr=3e-4, rl_kl_coef=0.0, rl_temperature=1.0,
                        seed=args["seed"], eval_split=0.25)
    with _silence():
        before = evaluate(env, "tiny-agent", eval_split=0.25, seed=args["seed"], greedy_only=True,
                          rl_max_new_tokens=128)
        t = time.perf_counter()
        run = train(params, env, display=False)
        seconds = time.perf_counter() - t
        after = evaluate(env, run.output_dir, greedy_only=True, baseline=None)
    by_step: dict[int, list[bool]] = {}
    for g in run.groups:
        by_step.setdefault(g["step"], []).extend(s == 1.0 for s in g["scores"] if s is not None)
    shares = [round(sum(v) / len(v), 3) for _, v in sorted(by_step.items())]
    info = build_info(Path(path))
    return {"status": run.status, "shares": shares, "train_seconds": seconds, "resolve_seconds": resolve_s,
            "held_out_prompts": before.summary["prompts"], "greedy_before": before.summary["greedy_mean"],
            "greedy_after": after.summary["greedy_mean"],
            "build_seconds": info.get("build_seconds"), "tool_calls": [h.get("tools/call_frequency") for h in run.history]}


def _rise_reached(rewards: list[float], rise: float) -> int | None:
    """The first step whose last-5-steps mean reward is ``rise`` above the first 5 steps' mean, or None."""
    if len(rewards) < 5:
        return None
    base = sum(rewards[:5]) / 5
    for k in range(5, len(rewards) + 1):
        if sum(rewards[k - 5:k]) / 5 - base >= rise:
            return k
    return None


def worker_teach(args: dict[str, Any]) -> dict[str, Any]:
    """Build tiny-math in a fresh cache (timed; ``build`` false: the weights the package ships), then train it with
    the fixed recipe, seed by seed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from envs.addition import AdditionEnv, accuracy
    from grpo_magic import GRPOParams, train
    from grpo_magic.models import cache, load_model, load_tokenizer, tiny_math, tiny_model_path

    default = tiny_math.tiny_math_path()  # the weights the package ships
    built, build_s, same = default, None, None
    if args.get("build", True):
        tiny = tiny_model_path()
        fresh = Path(tempfile.mkdtemp(prefix="bench-cache-"))
        (fresh / tiny.name).symlink_to(tiny)  # the same tiny underneath: only tiny-math is built
        os.environ["GRPO_MAGIC_CACHE"] = str(fresh)
        os.environ["GRPO_MAGIC_BUILD_MODELS"] = "1"  # the recipe, timed, not the weights the package ships
        t = time.perf_counter()
        with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115 - the one "building ..." line
            built = tiny_math.tiny_math_path()
        build_s = time.perf_counter() - t
        same = (built / "model.safetensors").read_bytes() == (default / "model.safetensors").read_bytes()
    info = cache.build_info(built)
    before = accuracy(load_model(str(built)), load_tokenizer(str(built)))

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.rewards: list[float] = []
            self.seconds: list[float] = []

        def on_train_begin(self, a, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(round(float(logs["reward"]), 4))
                self.seconds.append(time.perf_counter() - self.t0)

    runs = []
    for seed in args["seeds"]:
        out = tempfile.mkdtemp(prefix="bench-teach-")
        timer = StepTimes()
        with _silence():
            run = train(GRPOParams(model=str(built), project_name=out, seed=seed, **TEACH), AdditionEnv,
                        callbacks=[timer], display=False)
        r = timer.rewards
        reached = _rise_reached(r, GOALS["teach_rise"])
        after = accuracy(AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out))
        runs.append({"seed": seed, "status": run.status, "rewards": r, "first5": sum(r[:5]) / 5,
                     "last5": sum(r[-5:]) / 5, "rise": sum(r[-5:]) / 5 - sum(r[:5]) / 5,
                     "steps_to_rise": reached, "seconds_to_rise": timer.seconds[reached - 1] if reached else None,
                     "loop_s": timer.seconds[-1] if timer.seconds else None, "greedy_after": after})
    return {"build_s": build_s, "build_info": info, "same_bytes_as_cached": same, "greedy_before": before,
            "runs": runs}


def worker_evaluate(args: dict[str, Any]) -> dict[str, Any]:
    """tiny-math, fixed recipe with --eval-steps 30, then grpo_magic.evaluate on the saved run folder (timed)."""
    from envs.addition import AdditionEnv
    from grpo_magic import GRPOParams, evaluate, train

    runs = []
    for seed in args["seeds"]:
        out = tempfile.mkdtemp(prefix="bench-eval-")
        t = time.perf_counter()
        with _silence():
            run = train(GRPOParams(model="tiny-math", project_name=out, seed=seed, eval_steps=30, eval_samples=2,
                                   **TEACH), AdditionEnv, display=False)
        train_s = time.perf_counter() - t
        t = time.perf_counter()
        with _silence():
            report = evaluate(AdditionEnv, out, samples=args["samples"], seed=seed)
        eval_s = time.perf_counter() - t
        s = report.summary
        runs.append({"seed": seed, "status": run.status, "greedy_before": s["baseline_greedy_mean"],
                     "greedy_after": s["greedy_mean"], "greedy_ci": s["greedy_ci"],
                     "sampled_before": s["baseline"]["sampled_mean"], "sampled_after": s["sampled_mean"],
                     "pass_at_k_after": s["pass_at_k"], "pass_at_k_before": s["baseline"]["pass_at_k"],
                     "fixed": s["fixed"], "broke": s["broke"], "evaluate_s": eval_s, "train_s": train_s,
                     "in_run_evals": [round(e["greedy_mean"], 3) for e in run.evals],
                     "in_run_eval_s": sum(e["seconds"] for e in run.evals)})
    return {"runs": runs, "prompts": 160, "samples": args["samples"]}


KERNEL_CELLS = [
    "import json, time\nimport grpo_magic\nfrom envs.letters import LettersEnv\n"
    "from transformers import TrainerCallback\n"
    "class Loop(TrainerCallback):\n"
    "    def on_train_begin(self, *a, **k): self.t0 = time.perf_counter()\n"
    "    def on_train_end(self, *a, **k): self.wall = time.perf_counter() - self.t0\n"
    "loop = Loop()",
    "params = grpo_magic.GRPOParams(model='tiny', project_name='{out}', max_steps={steps}, **{letters})\n"
    "run = grpo_magic.train(params, LettersEnv, display=True, callbacks=[loop])",
    "d = run.dashboard\nsteps = sum(h.get('step_time', 0.0) for h in run.history)\n"
    "print('@@KERNEL ' + json.dumps({{'status': run.status, 'updates': d.curve_updates, 'points': d.points_sent, "
    "'renders': d.render_count, 'render_s': d.render_seconds, 'busy_s': d.render_seconds, "
    "'logged_steps': len(run.history), 'loop_s': loop.wall, 'step_time_s': steps}}))",
]


def worker_kernel(args: dict[str, Any]) -> dict[str, Any]:
    """The overhead workload in a real Jupyter kernel (nbclient), the dashboard displayed: widget messages
    really go out over the kernel's sockets, as in a notebook (no browser draws them)."""
    import nbformat
    from nbclient import NotebookClient

    out = tempfile.mkdtemp(prefix="bench-kernel-")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [c.format(out=out, steps=args["steps"], letters=repr(LETTERS)) for c in KERNEL_CELLS]
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = NotebookClient(nb, kernel_name="python3", timeout=900, resources={"metadata": {"path": str(ROOT)}})
    client.execute(env=_quiet_env(1))
    for output in nb.cells[-1].outputs:
        for line in output.get("text", "").splitlines():
            if line.startswith("@@KERNEL "):
                return json.loads(line[len("@@KERNEL "):])
    raise RuntimeError("the kernel run printed no result")


WORKERS = {
    "agent": worker_agent,
    "rescore": worker_rescore,
    "kernel": worker_kernel,
    "overhead": worker_overhead,
    "scoring": worker_scoring,
    "import": worker_import,
    "dashboard": worker_dashboard,
    "memory": worker_memory,
    "learn": worker_learn,
    "teach": worker_teach,
    "evaluate": worker_evaluate,
}


# ================================================================================== benchmarks


def bench_overhead(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    rounds, diffs = [], set()
    for p in range(cfg["procs"]):
        res = _worker("overhead", {"steps": cfg["steps"], "reps": cfg["reps"], "offset": p, "sides": cfg["sides"]},
                      threads)
        rounds += res["rounds"]
        diffs.update(res["config_differences"])
        log(f"  overhead: process {p + 1}/{cfg['procs']} done")
    ratio = [r["A"]["loop_s"] / r["B"]["loop_s"] for r in rounds]
    ratio0 = [r["A0"]["loop_s"] / r["B"]["loop_s"] for r in rounds if "A0" in r]
    cpu = [r["A"]["loop_cpu_s"] / r["B"]["loop_cpu_s"] for r in rounds]
    e2e = [r["A"]["e2e_s"] / r["B"]["e2e_s"] for r in rounds]

    def steady(run: dict[str, Any]) -> float:  # mean step time after the first step
        return statistics.mean(run["step_s"][1:])

    steady_ratio = [steady(r["A"]) / steady(r["B"]) for r in rounds]
    rewards = {json.dumps(r[s]["rewards"]) for r in rounds for s in r["order"]}
    step_b = [statistics.median(r["B"]["step_s"]) for r in rounds]
    updates = [r["A"]["curve_updates"] / max(1, r["A"]["logged_steps"]) for r in rounds]
    share = [r["A"]["busy_s"] / r["A"]["loop_s"] for r in rounds]
    return {
        "curves": {
            "updates_per_step": {**_spread(updates), "goal": GOALS["curve_updates_per_step"],
                                 "ok": statistics.median(updates) >= GOALS["curve_updates_per_step"]},
            "dashboard_share_of_loop": {**_spread(share, 4), "goal": GOALS["curve_share"],
                                        "ok": statistics.median(share) <= GOALS["curve_share"]},
            "points_sent_per_step": _spread([r["A"]["points_sent"] / max(1, r["A"]["logged_steps"]) for r in rounds]),
            "step_ms": _spread([1000 * statistics.median(r["A"]["step_s"]) for r in rounds], 1),
            "timed": "the overhead runs with the dashboard (real letters training, headless): curve updates sent "
                     "per logged step, logged steps sent to the page per logged step, and the renderer thread's time "
                     "(Dashboard.render_seconds, beside the training thread) over the training loop's time",
        },
        "overhead_ratio": {**_spread(ratio), "goal": GOALS["overhead_ratio"],
                           "ok": statistics.median(ratio) <= GOALS["overhead_ratio"]},
        "overhead_ratio_no_dashboard": _spread(ratio0),
        "overhead_cpu_ratio": _spread(cpu),
        "overhead_e2e_ratio": _spread(e2e),
        "overhead_steady_step_ratio": _spread(steady_ratio),
        "overhead_details": {
            "timed": "training loop, TrainerCallback.on_train_begin to on_train_end, both sides in the same "
                     "warmed-up process, alternating " + "/".join(cfg["sides"]),
            "steps": cfg["steps"], "pairs": len(rounds), "processes": cfg["procs"], "torch_threads": threads,
            "workload": {**LETTERS, "model": "tiny"},
            "plain_loop_s": _spread([r["B"]["loop_s"] for r in rounds]),
            "grpo_magic_loop_s": _spread([r["A"]["loop_s"] for r in rounds]),
            "grpo_magic_no_dashboard_loop_s": _spread([r["A0"]["loop_s"] for r in rounds if "A0" in r]),
            "plain_step_ms": _spread([1000 * s for s in step_b], 1),
            "dashboard_renders_per_run": _spread([r["A"]["renders"] for r in rounds], 1),
            "curve_updates_per_step": _spread([r["A"]["curve_updates"] / max(1, r["A"]["logged_steps"])
                                               for r in rounds]),
            "points_sent_per_step": _spread([r["A"]["points_sent"] / max(1, r["A"]["logged_steps"]) for r in rounds]),
            "dashboard_render_s_per_run": _spread([r["A"]["render_s"] for r in rounds]),
            # Minor page faults in the loop (fresh pages for torch's buffers): with glibc's default thresholds,
            # their count moves a run by several percent, and the two sides of a pair can differ by tens of
            # thousands; allocator: the malloc settings of the run ("glibc defaults", or --fixed-malloc's).
            "plain_faults_per_run": _spread([r["B"]["faults"] for r in rounds if r["B"].get("faults") is not None], 0),
            "grpo_magic_faults_per_run": _spread([r["A"]["faults"] for r in rounds
                                                  if r["A"].get("faults") is not None], 0),
            "allocator": _malloc_env() or "glibc defaults",
            "same_rewards_every_run": len(rewards) == 1,
            "rounds": [{"order": r["order"], **{side: round(r[side]["loop_s"], 3) for side in r["order"]}}
                       for r in rounds],
            "grpo_config_differences": sorted(diffs),
        },
    }


def bench_scoring(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    res = _worker("scoring", cfg, threads)
    n = cfg["episodes"]
    med = {m: statistics.median(r["reward_call_s"][1:] or r["reward_call_s"]) for m, r in res.items()}
    steps = {m: statistics.median(r["step_s"][1:] or r["step_s"]) for m, r in res.items()}
    out: dict[str, Any] = {}
    for mode in ("async", "threads"):
        ideal = min(n, res[mode]["workers"]) if mode == "threads" else n
        speedup = med["sequential"] / med[mode]
        out[mode] = {"speedup": round(speedup, 2), "ideal": ideal, "efficiency": round(speedup / ideal, 3),
                     "ok": speedup / ideal >= GOALS["scoring_efficiency"]}
    log("  scoring done")
    return {
        "concurrent_scoring_speedup": {
            **out,
            "goal_efficiency": GOALS["scoring_efficiency"],
            "episodes_per_step": n, "latency_s": cfg["latency_s"], "steps": cfg["steps"],
            "timed": "wall time of the reward call (EnvReward.score: every episode of the step plus our "
                     "bookkeeping), median over steps after the first",
            "reward_call_ms": {m: round(1000 * v, 1) for m, v in med.items()},
            "first_step_reward_call_ms": {m: round(1000 * r["reward_call_s"][0], 1) for m, r in res.items()},
            "step_ms": {m: round(1000 * v, 1) for m, v in steps.items()},
        }
    }


def bench_import(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    res = _worker("import", cfg, threads)
    runs = res["runs"]
    loaded = {m: any(r["loaded"][m] for r in runs) for m in runs[0]["loaded"]}
    log("  import done")
    return {"import_ms": {**_spread([r["load_ext_ms"] for r in runs], 1),
                          "torch_imported": loaded["torch"], "heavy_modules_imported": sorted(m for m, v in loaded.items() if v),
                          "magics": runs[0]["magics"]}}


def bench_dashboard(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    paced = _worker("dashboard", {"paced_steps": cfg["paced_steps"], "step_s": cfg["step_s"]}, threads)
    log("  dashboard timing done")
    memory = {}
    for target in ("run", "dashboard"):
        memory[target] = _worker("memory", {"target": target, "checkpoints": list(cfg["memory_steps"]),
                                            "step_s": cfg["step_s"]}, threads)
        log(f"  memory ({target}) done")
    lo, hi = cfg["memory_steps"]
    summary = {}
    for target, info in memory.items():
        a, b = info["marks"][str(lo)], info["marks"][str(hi)]
        summary[target] = {
            f"traced_kib_after_{lo}": a["traced_kib"], f"traced_kib_after_{hi}": b["traced_kib"],
            "growth_kib_per_1k_steps_after_first_1k": round((b["traced_kib"] - a["traced_kib"]) / ((hi - lo) / 1000), 1),
            f"rss_growth_kib_{lo}_to_{hi}": b["rss_kib"] - a["rss_kib"], "top_allocations": info["top"],
            **{k: v for k, v in info.items() if k in ("history", "groups", "errors", "groups_in_memory", "renders")},
        }
    return {
        "dashboard_ms_per_event": {
            "ms_per_event": round(paced["ms_per_event"], 3), "ms_per_step": round(paced["ms_per_step"], 2),
            "share_of_a_step": round(paced["share_of_step"], 4), "events": paced["events"],
            "steps": paced["steps"], "simulated_step_s": paced["step_s"], "renders": paced["renders"],
            "curve_renders": paced["curve_renders"], "curve_render_ms": paced["curve_render_ms"],
            "first_curve_render_ms": paced["first_curve_render_ms"],
            "curve_updates_per_step": round(paced["curve_updates_per_step"], 3),
            "curve_share_of_step": round(paced["curve_share_of_step"], 5),
            "timed": "time inside Dashboard.__call__ over a synthetic letters-like stream (2 groups of 8 + 1 step "
                     "event a step), its clock advanced by simulated_step_s a step so that throttling acts as in "
                     "a run of that pace",
        },
        "memory": summary,
    }


def bench_learn(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    setting = {"threshold": 0.6, "lr": 1e-2, "kl": 0.0, "max_steps": cfg["max_steps"]}
    runs = [_worker("learn", setting, threads) for _ in range(cfg["runs"])]
    reference = _worker("learn", {"threshold": 0.6, "lr": 5e-3, "kl": 0.0, "max_steps": 60}, threads)
    log("  learn done")
    reached = [r for r in runs if r["reached"]]
    return {
        "learn_seconds": {
            **_spread([r["loop_seconds"] for r in reached], 2),
            "threshold": setting["threshold"],
            "steps": reached[0]["steps"] if reached else None,
            "reached_in_every_run": len(reached) == len(runs),
            "setting": {**LETTERS, "lr": setting["lr"], "rl_kl_coef": setting["kl"], "model": "tiny"},
            "train_call_seconds": _spread([r["train_call_seconds"] for r in runs], 2),
            "reward_curve": runs[0]["rewards"],
            "max_steps": cfg["max_steps"],
            "timed": "seconds from the start of the training loop to the end of the first step whose mean reward "
                     "exceeds the threshold (one seed: every run takes the same steps; only the time varies). The "
                     "learning rate decays linearly to 0 at max_steps, so the step count depends on max_steps",
            "reference_lr_5e-3": {"reached": reference["reached"], "steps": reference["steps"],
                                  "max_reward": max(reference["rewards"]), "max_steps": 60,
                                  "reward_curve": reference["rewards"]},
        }
    }


def bench_rescore(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    res = _worker("rescore", cfg, threads)
    n = res["sequential"]["completions"]
    out: dict[str, Any] = {}
    for mode, r in res.items():
        wall, scoring = statistics.median(r["wall_s"]), statistics.median(r["scoring_s"])
        out[mode] = {"completions_per_s": round(n / wall, 1), "scoring_completions_per_s": round(n / scoring, 1),
                     "wall_ms": round(1000 * wall, 1), "scoring_ms": round(1000 * scoring, 1), "workers": r["workers"]}
    for mode in ("threads", "async"):
        ideal = min(n, out[mode]["workers"]) if mode == "threads" else n
        speedup = out["sequential"]["scoring_ms"] / out[mode]["scoring_ms"]  # the episodes: what concurrency speeds up
        out[mode].update(speedup=round(speedup, 2), ideal=ideal, efficiency=round(speedup / ideal, 3),
                         ok=speedup / ideal >= GOALS["scoring_efficiency"])
    log("  rescore done")
    return {
        "rescore_throughput": {
            **out, "completions": n, "latency_s": cfg["latency_s"], "reps": cfg["reps"],
            "goal_efficiency": GOALS["scoring_efficiency"],
            "timed": "scoring_*: the episodes of every logged completion through EnvReward (the report's "
                     "summary['seconds']), which the speedup compares; completions_per_s/wall_ms: the whole "
                     "grpo_magic.rescore(output_dir, env) call (reading the run log, loading the tokenizer, the "
                     "advantages too); medians of reps, after a warm-up call",
        }
    }


def bench_kernel(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    runs = [_worker("kernel", cfg, threads) for _ in range(cfg["runs"])]
    log("  kernel done")
    updates = [r["updates"] / max(1, r["logged_steps"]) for r in runs]
    share = [r["busy_s"] / r["loop_s"] for r in runs]
    return {
        "curves_in_a_kernel": {
            "updates_per_step": {**_spread(updates), "goal": GOALS["curve_updates_per_step"],
                                 "ok": statistics.median(updates) >= GOALS["curve_updates_per_step"]},
            "dashboard_share_of_loop": {**_spread(share, 4), "goal": GOALS["curve_share"],
                                        "ok": statistics.median(share) <= GOALS["curve_share"]},
            "points_sent_per_step": _spread([r["points"] / max(1, r["logged_steps"]) for r in runs]),
            "render_ms": _spread([1000 * r["render_s"] / max(1, r["renders"]) for r in runs], 2),
            "step_ms": _spread([1000 * r["loop_s"] / max(1, r["logged_steps"]) for r in runs], 1),
            "steps": cfg["steps"], "runs": len(runs),
            "timed": "the overhead workload (letters on tiny) run by grpo_magic.train(display=True) in a Jupyter kernel "
                     "driven by nbclient: widget messages go out over the kernel's sockets; loop time: on_train_begin to "
                     "on_train_end (as in the overhead runs); the dashboard's time: its renderer thread's (render_seconds), "
                     "which runs beside training; bench/dashboard_kernel.py times the real cost from outside",
        }
    }


def bench_agent(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    runs = [_worker("agent", {"seed": seed, "max_steps": cfg["max_steps"]}, threads) for seed in cfg["seeds"]]
    log("  agent done")
    rises = [statistics.fmean(r["shares"][-5:]) - statistics.fmean(r["shares"][:3]) for r in runs]
    return {
        "agent_tool_use": {
            "held_out_before": _spread([r["greedy_before"] for r in runs], 3),
            "held_out_after": _spread([r["greedy_after"] for r in runs], 3),
            "held_out_rise": _spread([r["greedy_after"] - r["greedy_before"] for r in runs], 3),
            "held_out_prompts": runs[0]["held_out_prompts"],
            "first_3_steps": _spread([statistics.fmean(r["shares"][:3]) for r in runs], 3),
            "last_5_steps": _spread([statistics.fmean(r["shares"][-5:]) for r in runs], 3),
            "rise": _spread(rises, 3),
            "train_seconds": _spread([r["train_seconds"] for r in runs], 1),
            "tiny_agent_build_seconds": runs[0]["build_seconds"],
            "seeds": cfg["seeds"], "shares_first_seed": runs[0]["shares"],
            "setting": {"env": "tests/agent_cells.py GuessEncodeGreet", "model": "tiny-agent", "max_steps": cfg["max_steps"],
                        "batch_size": 32, "rl_num_generations": 8, "rl_max_new_tokens": 128, "lr": 3e-4,
                        "rl_kl_coef": 0.0, "rl_temperature": 1.0, "eval_split": 0.25},
            "timed": "held_out_*: evaluate's greedy mean score on the held-out quarter of the prompts (1: both calls "
                     "right, in order; 0.5: the first alone), the registered model before, the trained run after; first_3_steps / "
                     "last_5_steps: the share of training episodes with score 1 per step, mean of the first 3 steps vs "
                     "the last 5; train_seconds: the whole train() call (TRL's tool loop, episodes, scoring); "
                     "tiny_agent_build_seconds: what the cache marker recorded when tiny-agent was built",
        }
    }


def bench_teach(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    res = _worker("teach", cfg, threads)
    runs = res["runs"]
    rises = [r["rise"] for r in runs]
    reached = [r for r in runs if r["steps_to_rise"]]
    log("  teach done")
    return {
        "teach": {
            "rise": {**_spread(rises), "goal": GOALS["teach_rise"],
                     "ok_runs": sum(x >= GOALS["teach_rise"] for x in rises), "runs": len(rises)},
            "build_s": {"value": None if res["build_s"] is None else round(res["build_s"], 1),
                        "goal": GOALS["teach_build_s"],
                        "ok": None if res["build_s"] is None else res["build_s"] <= GOALS["teach_build_s"],
                        "recorded": res["build_info"].get("build_seconds"), "steps": res["build_info"].get("steps")},
            "same_bytes_as_cached": res["same_bytes_as_cached"],
            "check": res["build_info"].get("check"),
            "seconds_to_rise": _spread([r["seconds_to_rise"] for r in reached], 2),
            "steps_to_rise": _spread([r["steps_to_rise"] for r in reached], 1),
            "loop_s": _spread([r["loop_s"] for r in runs if r["loop_s"]], 2),
            "greedy_held_out": {"before": round(res["greedy_before"], 3),
                                "after": _spread([r["greedy_after"] for r in runs])},
            "per_seed": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "rewards"}
                         for r in runs],
            "recipe": TEACH,
            "timed": "build (the full run; the quick run trains the shipped weights): tiny_math_path() in a fresh cache (tiny reused), corpus to saved weights plus the "
                     "held-out check; rise: mean reward of the last 5 steps minus the first 5 of the fixed recipe; "
                     "seconds to rise: from the start of the training loop to the end of the first step whose "
                     "last-5 mean is 0.15 above the first 5",
        }
    }


def bench_evaluate(cfg: dict[str, Any], threads: int, log) -> dict[str, Any]:
    res = _worker("evaluate", cfg, threads)
    runs = res["runs"]
    log("  evaluate done")
    return {
        "evaluate": {
            "greedy_before": _spread([r["greedy_before"] for r in runs]),
            "greedy_after": _spread([r["greedy_after"] for r in runs]),
            "sampled_before": _spread([r["sampled_before"] for r in runs]),
            "sampled_after": _spread([r["sampled_after"] for r in runs]),
            "pass_at_k_after": _spread([r["pass_at_k_after"][f"pass@{res['samples']}"] for r in runs]),
            "fixed": _spread([r["fixed"] for r in runs]), "broke": _spread([r["broke"] for r in runs]),
            "evaluate_s": _spread([r["evaluate_s"] for r in runs], 2),
            "in_run_eval_share": _spread([r["in_run_eval_s"] / r["train_s"] for r in runs]),
            "per_seed": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in runs],
            "timed": f"grpo_magic.evaluate(AdditionEnv, run folder, samples={res['samples']}) from the outside: the "
                     "saved weights and the base model loaded, 160 held-out sums, one greedy and K sampled episodes "
                     "each, for both; in-run share: EvalScored seconds (3 evaluations) over the whole train() call",
        }
    }


BENCHMARKS = {
    "agent": bench_agent,
    "overhead": bench_overhead,
    "kernel": bench_kernel,
    "scoring": bench_scoring,
    "import": bench_import,
    "dashboard": bench_dashboard,
    "learn": bench_learn,
    "rescore": bench_rescore,
    "teach": bench_teach,
    "evaluate": bench_evaluate,
}


def _summary_lines(r: dict[str, Any]) -> list[str]:
    lines = []
    if "overhead_ratio" in r:
        o = r["overhead_ratio"]
        lines.append(f"overhead_ratio            {o['median']} (min {o['min']}, max {o['max']}, {o['n']} pairs; "
                     f"goal <= {o['goal']}: {'ok' if o['ok'] else 'MISSED'})")
        lines.append(f"  without dashboard       {r['overhead_ratio_no_dashboard']['median']}; cpu-time ratio "
                     f"{r['overhead_cpu_ratio']['median']}; steps after the first "
                     f"{r['overhead_steady_step_ratio']['median']}; end to end {r['overhead_e2e_ratio']['median']}")
        d = r["overhead_details"]
        if d.get("plain_faults_per_run", {}).get("n"):
            lines.append(f"  page faults per run     plain {d['plain_faults_per_run']['median']:.0f}, grpo_magic "
                         f"{d['grpo_magic_faults_per_run']['median']:.0f}; allocator: {_allocator_label(d['allocator'])}")
    if "concurrent_scoring_speedup" in r:
        c = r["concurrent_scoring_speedup"]
        for mode in ("async", "threads"):
            lines.append(f"scoring speedup {mode:8s}  {c[mode]['speedup']}x of ideal {c[mode]['ideal']}x "
                         f"({100 * c[mode]['efficiency']:.0f}%; goal >= 80%: {'ok' if c[mode]['ok'] else 'MISSED'})")
    if "import_ms" in r:
        i = r["import_ms"]
        lines.append(f"import_ms (%load_ext)     {i['median']} (min {i['min']}, max {i['max']}); torch imported: "
                     f"{i['torch_imported']}")
    if "dashboard_ms_per_event" in r:
        d = r["dashboard_ms_per_event"]
        lines.append(f"dashboard_ms_per_event    {d['ms_per_event']} ({100 * d['share_of_a_step']:.1f}% of a "
                     f"{d['simulated_step_s']} s step; {d['curve_renders']} curve renders of "
                     f"{d['curve_render_ms']['median']} ms)")
        for target, m in r["memory"].items():
            lines.append(f"memory {target:10s}         +{m['growth_kib_per_1k_steps_after_first_1k']} KiB per 1k steps "
                         f"after the first 1k ({ {k: v for k, v in m.items() if k.startswith('traced')} })")
    if "agent_tool_use" in r:
        a = r["agent_tool_use"]
        lines.append(f"agent tool use (tiny-agent) held-out greedy mean {a['held_out_before']['median']} -> "
                     f"{a['held_out_after']['median']} in {a['setting']['max_steps']} steps (training episodes "
                     f"{a['first_3_steps']['median']} -> {a['last_5_steps']['median']}, {a['train_seconds']['median']} s; "
                     f"tiny-agent built in {a['tiny_agent_build_seconds']} s)")
    if "rescore_throughput" in r:
        rs = r["rescore_throughput"]
        lines.append(f"rescore completions/s     sequential {rs['sequential']['scoring_completions_per_s']}, threads "
                     f"{rs['threads']['scoring_completions_per_s']} ({rs['threads']['speedup']}x of ideal "
                     f"{rs['threads']['ideal']}x), async {rs['async']['scoring_completions_per_s']} "
                     f"({rs['async']['speedup']}x of ideal {rs['async']['ideal']}x)")
    if "curves" in r:
        c = r["curves"]
        lines.append(f"curve updates per step    {c['updates_per_step']['median']} (goal >= {c['updates_per_step']['goal']}: "
                     f"{'ok' if c['updates_per_step']['ok'] else 'MISSED'}); {100 * c['dashboard_share_of_loop']['median']:.2f}% "
                     f"of the loop (goal <= 1%: {'ok' if c['dashboard_share_of_loop']['ok'] else 'MISSED'})")
    if "curves_in_a_kernel" in r:
        k = r["curves_in_a_kernel"]
        lines.append(f"  in a kernel             {k['updates_per_step']['median']} per step, "
                     f"{100 * k['dashboard_share_of_loop']['median']:.2f}% of the loop, {k['render_ms']['median']} ms a render")
    if "teach" in r:
        t = r["teach"]
        lines.append(f"tiny-math GRPO rise       {t['rise']['median']} (min {t['rise']['min']}, max {t['rise']['max']}; "
                     f">= {t['rise']['goal']} in {t['rise']['ok_runs']}/{t['rise']['runs']} seeds); "
                     + (f"built in {t['build_s']['value']} s" if t["build_s"]["value"] is not None
                        else "the shipped weights (the full run times the build)")
                     + f"; rise reached in {t['seconds_to_rise']['median']} s")
    if "learn_seconds" in r:
        learn = r["learn_seconds"]
        lines.append(f"learn_seconds             {learn['median']} s to reward > {learn['threshold']} "
                     f"({learn['steps']} steps; min {learn['min']}, max {learn['max']})")
    return lines


def _fmt(s: dict[str, Any] | None, unit: str = "") -> str:
    if not s or s.get("median") is None:
        return "–"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{s['median']}{unit} ({s['min']} to {s['max']})"
    return f"{s['median']}{unit}"


def results_markdown(results: list[dict[str, Any]]) -> str:
    """The RESULTS.md table: one column per run (quick, full), one row per figure."""
    first = results[0]
    m = first["machine"]
    v = m["versions"]
    lines = [
        "| figure | goal | " + " | ".join(f"`{r['mode']}` run ({r['date'][:16].replace('T', ' ')})" for r in results) + " |",
        "|---|---|" + "---|" * len(results),
    ]

    def row(name: str, goal: str, cell) -> None:
        cells = []
        for r in results:
            try:
                cells.append(cell(r))
            except (KeyError, TypeError):
                cells.append("–")
        lines.append(f"| {name} | {goal} | " + " | ".join(cells) + " |")

    def ok(flag: bool) -> str:
        return "ok" if flag else "**missed**"

    row("overhead_ratio (training loop, with dashboard)", "≤ 1.03",
        lambda r: f"{_fmt(r['overhead_ratio'])}, {ok(r['overhead_ratio']['ok'])}; "
                  f"{r['overhead_details']['pairs']} pairs of {r['overhead_details']['steps']} steps")
    row("  same, without the dashboard", "", lambda r: _fmt(r["overhead_ratio_no_dashboard"]))
    row("  CPU-time ratio (less sensitive to other load)", "", lambda r: _fmt(r["overhead_cpu_ratio"]))
    row("  end to end (train() call vs whole plain script)", "", lambda r: _fmt(r["overhead_e2e_ratio"]))
    row("  plain TRL step", "", lambda r: _fmt(r["overhead_details"]["plain_step_ms"], " ms"))
    row("  page faults per run: plain TRL; grpo_magic (allocator)", "",
        lambda r: f"{_fmt(r['overhead_details']['plain_faults_per_run'])}; "
                  f"{_fmt(r['overhead_details']['grpo_magic_faults_per_run'])} "
                  f"({_allocator_label(r['overhead_details']['allocator'])})")
    row("  same completions and rewards on both sides", "",
        lambda r: f"{r['overhead_details']['same_rewards_every_run']}; GRPOConfig differences: "
                  f"{r['overhead_details']['grpo_config_differences'] or 'none'}")
    for mode, label in (("async", "`async def score_episode`"), ("threads", "sync, `rl_env_workers` = episodes")):
        row(f"concurrent_scoring_speedup, {label}", "≥ 80% of ideal",
            lambda r, mode=mode: (f"{r['concurrent_scoring_speedup'][mode]['speedup']}x of ideal "
                                  f"{r['concurrent_scoring_speedup'][mode]['ideal']}x "
                                  f"({100 * r['concurrent_scoring_speedup'][mode]['efficiency']:.0f}%, "
                                  f"{ok(r['concurrent_scoring_speedup'][mode]['ok'])})"))
    row("  reward call per step: sequential / async / threads", "",
        lambda r: " / ".join(f"{r['concurrent_scoring_speedup']['reward_call_ms'][k]} ms"
                             for k in ("sequential", "async", "threads")))
    row("import_ms (`%load_ext grpo_magic`, fresh shell)", "light; no torch",
        lambda r: f"{_fmt(r['import_ms'], ' ms')}; torch imported: {r['import_ms']['torch_imported']}; heavy modules "
                  f"loaded: {', '.join(r['import_ms']['heavy_modules_imported']) or 'none'}")
    row("dashboard_ms_per_event (throttled, 0.1 s steps)", "",
        lambda r: f"{r['dashboard_ms_per_event']['ms_per_event']} ms = "
                  f"{100 * r['dashboard_ms_per_event']['share_of_a_step']:.1f}% of a step; "
                  f"{r['dashboard_ms_per_event']['curve_renders']} curve drawings (SVG) of "
                  f"{_fmt(r['dashboard_ms_per_event']['curve_render_ms'], ' ms')} in "
                  f"{r['dashboard_ms_per_event']['steps']} steps")
    for target, label in (("dashboard", "dashboard"), ("run", "run (GRPORun event handling)")):
        row(f"memory, {label}: traced after 1k → 10k steps", "bounded",
            lambda r, target=target: (f"{r['memory'][target]['traced_kib_after_1000'] / 1024:.1f} → "
                                      f"{r['memory'][target]['traced_kib_after_10000'] / 1024:.1f} MiB "
                                      f"(+{r['memory'][target]['growth_kib_per_1k_steps_after_first_1k']:.0f} KiB "
                                      f"per 1k steps)"))
    row("learn_seconds (letters, tiny, reward > threshold)", "",
        lambda r: f"{_fmt(r['learn_seconds'], ' s')} to > {r['learn_seconds']['threshold']} in "
                  f"{r['learn_seconds']['steps']} steps (lr {r['learn_seconds']['setting']['lr']}, "
                  f"kl {r['learn_seconds']['setting']['rl_kl_coef']})")
    row("  with lr 5e-3, kl 0 (60 steps)", "",
        lambda r: f"best mean reward {r['learn_seconds']['reference_lr_5e-3']['max_reward']}; "
                  f"> 0.6: {r['learn_seconds']['reference_lr_5e-3']['reached']}")
    for mode, label in (("threads", "sync, `rl_env_workers` 32"), ("async", "`async def score_episode`")):
        row(f"rescore_throughput, {label}", "≥ 80% of ideal",
            lambda r, mode=mode: (f"{r['rescore_throughput'][mode]['scoring_completions_per_s']} completions/s "
                                  f"({r['rescore_throughput'][mode]['completions_per_s']} for the whole call) = "
                                  f"{r['rescore_throughput'][mode]['speedup']}x sequential, of ideal "
                                  f"{r['rescore_throughput'][mode]['ideal']}x "
                                  f"({100 * r['rescore_throughput'][mode]['efficiency']:.0f}%, "
                                  f"{ok(r['rescore_throughput'][mode]['ok'])})"))
    row("  rescore, sequential (50 ms episodes; ideal 20/s)", "",
        lambda r: (f"{r['rescore_throughput']['sequential']['scoring_completions_per_s']} completions/s "
                   f"({r['rescore_throughput']['sequential']['completions_per_s']} for the whole call); "
                   f"{r['rescore_throughput']['completions']} completions of a real run log"))
    row("curves: updates per logged step (overhead runs, real training)", "≥ 0.5",
        lambda r: f"{_fmt(r['curves']['updates_per_step'])}, {ok(r['curves']['updates_per_step']['ok'])}; "
                  f"steps of {_fmt(r['curves']['step_ms'], ' ms')}")
    row("  the dashboard's share of the training loop (the curves' own)", "≤ 1%",
        lambda r: f"{100 * r['curves']['dashboard_share_of_loop']['median']:.2f}% "
                  f"({100 * r['curves']['dashboard_share_of_loop']['min']:.2f} to "
                  f"{100 * r['curves']['dashboard_share_of_loop']['max']:.2f}), "
                  f"{ok(r['curves']['dashboard_share_of_loop']['ok'])} "
                  f"({100 * r['curves']['curve_share_of_loop']['median']:.2f}%)")
    row("  in a Jupyter kernel (nbclient, dashboard displayed): updates per step, dashboard share", "≥ 0.5, ≤ 1%",
        lambda r: f"{_fmt(r['curves_in_a_kernel']['updates_per_step'])} per step, dashboard "
                  f"{100 * r['curves_in_a_kernel']['dashboard_share_of_loop']['median']:.2f}% of the loop, "
                  f"{ok(r['curves_in_a_kernel']['dashboard_share_of_loop']['ok'])} (curves "
                  f"{100 * r['curves_in_a_kernel']['curve_share_of_loop']['median']:.2f}%, "
                  f"{_fmt(r['curves_in_a_kernel']['ms_per_update'], ' ms')} an update; steps of "
                  f"{_fmt(r['curves_in_a_kernel']['step_ms'], ' ms')})")
    row("  synthetic stream, 0.1 s steps: updates per step, share", "",
        lambda r: f"{r['dashboard_ms_per_event']['curve_updates_per_step']:.2f} per step, "
                  f"{100 * r['dashboard_ms_per_event']['curve_share_of_step']:.2f}% of step time "
                  f"({_fmt(r['dashboard_ms_per_event']['curve_render_ms'], ' ms')} a drawing)")
    row("tiny-math: GRPO rise, fixed recipe (last 5 − first 5 steps)", "≥ 0.15",
        lambda r: f"{_fmt(r['teach']['rise'])}; ≥ 0.15 in {r['teach']['rise']['ok_runs']} of "
                  f"{r['teach']['rise']['runs']} seeds")
    row("  greedy accuracy on the 160 held-out sums, before → after", "",
        lambda r: f"{r['teach']['greedy_held_out']['before']} → {_fmt(r['teach']['greedy_held_out']['after'])}")
    row("  seconds (steps) of training to reach the rise", "",
        lambda r: f"{_fmt(r['teach']['seconds_to_rise'], ' s')} ({_fmt(r['teach']['steps_to_rise'])} steps); "
                  f"60 steps in {_fmt(r['teach']['loop_s'], ' s')}")
    row("  tiny-math build (fresh cache, 1 torch thread)", "≤ 180 s",
        lambda r: "not built (the shipped weights)" if r["teach"]["build_s"]["value"] is None else
                  f"{r['teach']['build_s']['value']} s, {ok(r['teach']['build_s']['ok'])}; "
                  f"{r['teach']['build_s']['steps']} SFT steps; same bytes as the cached copy: "
                  f"{r['teach']['same_bytes_as_cached']}")
    row("evaluation (%grpo_eval on the saved tiny-math run): held-out greedy accuracy, base → trained", "rises",
        lambda r: f"{_fmt(r['evaluate']['greedy_before'])} → {_fmt(r['evaluate']['greedy_after'])}; sampled "
                  f"{_fmt(r['evaluate']['sampled_before'])} → {_fmt(r['evaluate']['sampled_after'])}; pass@4 "
                  f"{_fmt(r['evaluate']['pass_at_k_after'])}; failing → passing {_fmt(r['evaluate']['fixed'])}, "
                  f"back {_fmt(r['evaluate']['broke'])}")
    row("  evaluate seconds (2 models x 160 prompts x 5 episodes); in-run --eval-steps 30 share of train()", "",
        lambda r: f"{_fmt(r['evaluate']['evaluate_s'], ' s')}; {_fmt(r['evaluate']['in_run_eval_share'])}")
    row("agent tool use: tiny-agent, a two-step request among three held-out-name tools, held-out prompts' greedy mean, before → after", "rises",
        lambda r: f"{_fmt(r['agent_tool_use']['held_out_before'])} → {_fmt(r['agent_tool_use']['held_out_after'])} "
                  f"(rise {_fmt(r['agent_tool_use']['held_out_rise'])}) on {r['agent_tool_use']['held_out_prompts']} "
                  f"prompts, {r['agent_tool_use']['setting']['max_steps']} steps, seeds {r['agent_tool_use']['seeds']}")
    row("  training episodes with both calls right, first 3 → last 5 steps", "",
        lambda r: f"{_fmt(r['agent_tool_use']['first_3_steps'])} → {_fmt(r['agent_tool_use']['last_5_steps'])}")
    row("  agent run seconds (TRL's tool loop); tiny-agent build", "",
        lambda r: f"{_fmt(r['agent_tool_use']['train_seconds'], ' s')}; built in "
                  f"{r['agent_tool_use']['tiny_agent_build_seconds']} s")
    row("benchmark wall time", "", lambda r: f"{r['bench_seconds']:.0f} s")
    machine = (f"{m['nproc']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']}, torch {v.get('torch')}, "
               f"transformers {v.get('transformers')}, trl {v.get('trl')}, ipywidgets {v.get('ipywidgets')}, "
               f"matplotlib {v.get('matplotlib')}; torch threads {first.get('torch_threads')}; 1-minute load "
               + ", ".join(f"{r['machine'].get('load_avg_1min_at_start')} → {r['machine'].get('load_avg_1min_at_end')} "
                           f"({r['mode']})" for r in results))
    return "\n".join(lines) + f"\n\nMachine: {machine}.\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a run of a few minutes")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--only", default="", help="comma-separated: " + ",".join(BENCHMARKS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads on every side (default 1)")
    parser.add_argument("--save", default=None, help="also write the JSON result to this file")
    parser.add_argument("--fixed-malloc", action="store_true",
                        help="run every worker under glibc malloc with fixed thresholds (FIXED_MALLOC): far fewer "
                             "page faults, the same setting on both sides")
    parser.add_argument("--markdown", nargs="+", metavar="JSON", help="print the RESULTS.md table of saved results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        sys.path.insert(0, str(ROOT))
        os.chdir(ROOT)
        _setup_worker(args.threads)
        _report(WORKERS[args.worker](json.loads(args.worker_args)))
        return 0

    if args.markdown:
        print(results_markdown([json.loads(Path(p).read_text(encoding="utf-8")) for p in args.markdown]), end="")
        return 0
    if args.fixed_malloc:  # read by glibc when a worker starts; _quiet_env passes the environment on
        os.environ.update(FIXED_MALLOC)
    cfg = QUICK if args.quick else FULL
    # --quick runs what it has settings for: the agent rows (16 steps of 128-token tool-loop episodes) are full-run only,
    # and it trains the shipped tiny-math weights instead of timing their 90-second build.
    names = [n.strip() for n in args.only.split(",") if n.strip()] or [n for n in BENCHMARKS if n in cfg]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    full_only = [n for n in names if n not in cfg]
    if full_only:
        parser.error(f"{full_only[0]!r} runs in the full run only; drop --quick")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    # Build the tiny model once, outside every timing.
    subprocess.run([sys.executable, "-c", "from grpo_magic.models import tiny_model_path; tiny_model_path()"],
                   cwd=ROOT, env=_quiet_env(args.threads), check=True)
    result: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "torch_threads": args.threads,
    }
    started = time.perf_counter()
    for name in names:
        t = time.perf_counter()
        log(f"[{name}] ...")
        result.update(BENCHMARKS[name](cfg[name], args.threads, log))
        log(f"[{name}] {time.perf_counter() - t:.0f} s")
    result["bench_seconds"] = round(time.perf_counter() - started, 1)
    with contextlib.suppress(OSError):
        result["machine"]["load_avg_1min_at_end"] = round(os.getloadavg()[0], 2)
    for line in _summary_lines(result):
        log(line)
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
