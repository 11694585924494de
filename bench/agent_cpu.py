"""Benchmarks of offline tool calling on envs the model has never seen (issue 25).

    python bench/agent_cpu.py --only check                 # tiny-agent on the held-out-name envs
    python bench/agent_cpu.py --only build                 # the general tool-caller recipe, built twice
    python bench/agent_cpu.py --only rise --model /tmp/model   # GRPO on the two-step env with a distractor
    python bench/agent_cpu.py --save bench/results-agent.json

- check: ``%grpo_check`` (``--model``, default tiny-agent) on the ``%%grpo_env`` cells of
  tests/agent_cells.py, whose tool and argument names come from ``tool_corpus.HELD_OUT_*``: per env, the
  share of sampled episodes whose first call parsed, named an offered tool and had arguments of its
  schema's types, the share with score 1 (the right call; for the two-step env both calls in order), and
  the check's own figures (calls to tools not offered, calls that did not parse).
- build: ``tiny-agent``'s recipe (models/tiny_agent.py, v2.2: the general tool caller) built
  in two fresh processes (``GRPO_MAGIC_CACHE`` a new temporary folder each), wall and CPU seconds of each,
  timed from outside, whether the two ``model.safetensors`` are the same bytes, and ``tool_corpus.check`` on it
  (held-out-name chats; the build itself no longer runs it).
- rise: GRPO (``train``, 16 steps of 32 episodes, 8 a prompt, lr 3e-4, no KL, temperature ``--temperature``)
  from ``--model`` on ``--env``, a cell of tests/agent_cells.py (``RISE_ENVS``: ``GuessEncodeGreet``, a two-step
  request with a distractor tool, the test's and notebook 05's; ``BakeRotateBorrow``, three tools, the request
  names one, v2.1's), a quarter of its prompts held out (``eval_split``): ``evaluate``'s greedy mean score on
  them before and after, the share of training episodes that scored 1 per step, and seconds.

Each part runs in a fresh subprocess. Benchmarks are scripts, never timed test assertions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "@@AGENT_BENCH "
CHECK_ARGS = "--samples 8 --rl-num-generations 4 --rl-max-new-tokens 64"
#: The rise's envs and their new tokens a completion (two calls and a result do not fit in 64).
RISE_ENVS = {"GuessEncodeGreet": 128, "BakeRotateBorrow": 48}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    return {**env, **(extra or {})}


def _worker(name: str, args: dict[str, Any], extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", name, "--worker-args", json.dumps(args)],
                          env=_env(extra_env), capture_output=True, text=True, timeout=3600, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"worker {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len(MARK):])
    result["outside_wall_s"] = round(wall, 1)
    result["outside_cpu_s"] = round((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), 1)
    return result


# ---------------------------------------------------------------- workers (each in its own process)


def worker_build(args: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from research.tiny_agent import tool_corpus
    from research.tiny_agent.recipe import RECIPE

    path = RECIPE.path()
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    info = RECIPE.info()
    # the held-out check, which the build no longer runs (a first use's wait), on the model as built
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    check = tool_corpus.check(model, AutoTokenizer.from_pretrained(str(path)))
    return {"sha256": digest, "build_seconds": info.get("build_seconds"), "check": check,
            "check_seconds": round(time.perf_counter() - started, 1), "steps": info.get("steps"),
            "train_loss": info.get("train_loss")}


def _shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "grpo_magic")
    return shell


def worker_check(args: dict[str, Any]) -> dict[str, Any]:
    from tests.agent_cells import CELLS

    os.chdir(tempfile.mkdtemp(prefix="bench-agent-check-"))
    shell = _shell()
    out: dict[str, Any] = {}
    for name in ("WeighParcel", "ReserveHarbor", "PaintGarden", "GuessThenEncode"):
        shell.run_cell_magic("grpo_env", "", CELLS[name])
        started = time.perf_counter()
        # two calls and a result do not fit in 64 new tokens (the second call was cut short)
        budget = " --rl-max-new-tokens 128" if name == "GuessThenEncode" else ""
        report = shell.run_line_magic("grpo_check", f"{name} --model {args['model']} {CHECK_ARGS}{budget}")
        seconds = time.perf_counter() - started
        episodes = [t for g in report.groups for t in g["transcripts"]]
        scores = [s for g in report.scores for s in g]
        why = next((w for w in report.warnings if w.startswith("no episode called an offered tool")), None)
        out[name] = {"why": why, "episodes": len(episodes), "offered_typed_share": round(report.agent["typed_call_share"], 3),
                     "right_share": round(scores.count(1.0) / len(scores), 3), "check_seconds": round(seconds, 1),
                     "not_offered_calls": report.agent["not_offered_calls"],
                     "unparsed_calls": report.agent["unparsed_calls"]}
        if name == "GuessThenEncode":
            out[name]["both_calls_right"] = scores.count(1.0)
    return out


def worker_rise(args: dict[str, Any]) -> dict[str, Any]:
    from grpo_magic import GRPOParams, evaluate, train
    from tests.agent_cells import CELLS

    namespace: dict[str, Any] = {}
    name = args["env"]
    exec(CELLS[name], namespace)  # noqa: S102 - the test suite's own env cell
    env = namespace[name]()
    tokens = RISE_ENVS[name]
    params = GRPOParams(model=args["model"], max_steps=16, batch_size=32, rl_num_generations=8, rl_max_new_tokens=tokens,
                        lr=3e-4, rl_kl_coef=0.0, rl_temperature=args["temperature"], seed=args["seed"],
                        eval_split=0.25, project_name=tempfile.mkdtemp(prefix="bench-agent-rise-"))
    before = evaluate(env, args["model"], eval_split=0.25, seed=args["seed"], greedy_only=True,
                      rl_max_new_tokens=tokens)
    started = time.perf_counter()
    run = train(params, env, display=False)
    seconds = time.perf_counter() - started
    after = evaluate(env, run.output_dir, greedy_only=True, baseline=None)
    by_step: dict[int, list[bool]] = {}
    for group in run.groups:
        by_step.setdefault(group["step"], []).extend(s == 1.0 for s in group["scores"] if s is not None)
    return {"env": name, "status": run.status, "temperature": args["temperature"], "seed": args["seed"],
            "train_seconds": round(seconds, 1), "held_out_prompts": before.summary["prompts"],
            "greedy_before": before.summary["greedy_mean"], "greedy_after": after.summary["greedy_mean"],
            "right_share_by_step": [round(sum(v) / len(v), 3) for _, v in sorted(by_step.items())]}


# ---------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="check,build")
    parser.add_argument("--model", default="tiny-agent", help="the model of the check")
    parser.add_argument("--env", default="GuessEncodeGreet", choices=sorted(RISE_ENVS), help="rise: the env")
    parser.add_argument("--temperature", type=float, default=1.0, help="rise: GRPO's sampling temperature")
    parser.add_argument("--seed", type=int, default=1, help="rise: GRPO's seed")
    parser.add_argument("--save", default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = globals()[f"worker_{args.worker}"](json.loads(args.worker_args))
        print(MARK + json.dumps(result), flush=True)
        return 0
    parts = args.only.split(",")
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
                               "load_average_at_start": os.getloadavg()[0]}
    if "build" in parts:
        builds = [_worker("build", {}, {"GRPO_MAGIC_CACHE": tempfile.mkdtemp(prefix="bench-agent-cache-"),
                                              "GRPO_MAGIC_BUILD_MODELS": "1"})
                  for _ in range(2)]
        results["build"] = {"runs": builds, "same_bytes": builds[0]["sha256"] == builds[1]["sha256"]}
        print("build:", json.dumps(results["build"]), flush=True)
    if "check" in parts:
        results["check"] = {"model": args.model, **_worker("check", {"model": args.model})}
        print("check:", json.dumps(results["check"]), flush=True)
    if "rise" in parts:
        results["rise"] = {"model": args.model, **_worker("rise", {"model": args.model, "seed": args.seed,
                                                                   "env": args.env, "temperature": args.temperature})}
        print("rise:", json.dumps(results["rise"]), flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
