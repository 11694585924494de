"""The reward-hacking watch measured on real training (issue 42; docs/explanation/watch.md reads the numbers).

    python bench/watch.py                       # train every run that has no log yet, replay all, write the JSON
    python bench/watch.py --seeds 3             # fewer seeds
    python bench/watch.py --replay-only         # only replay the logs already in --runs-dir
    python bench/watch.py --only hack_braces    # some configurations
    python bench/watch.py --cost                # the watch's cost per step, timed from outside (on a quiet machine)

Each run is ``grpo_magic.train`` in a fresh subprocess (``--worker``) with the offline models on CPU; its run log
is kept in ``--runs-dir`` and replayed through ``grpo_magic.watch.Watch`` (once with the env's task metrics, once
naming none: "reward only", which exercises the degeneration detectors without the task gate). Figures:

- honest runs (``honest_letters``: the letters demo recipe with a task component equal to its reward;
  ``honest_math``: tiny-math on exact-match sums, the learns-skill recipe of notebook 04, 60 steps): the share of
  runs with any alarm (the false-alarm rate), and which kinds;
- gameable runs (``hack_letter``: the reward pays for the letter ``a``, the task is never met; ``hack_braces``:
  the reward counts closing braces): the step of the first alarm and its kind, and whether it came within 40;
- the null simulation: the divergence test on synthetic series without a hack (a flat noisy reward; a reward and
  a noisier task rising together), 1,000 runs each: its false-alarm rate per run, where the assumptions are known.

The replay's time per step is shown for scale only (a shared machine; not a timing benchmark).

``--cost`` times the watch from outside: the letters recipe (``honest_letters``, 40 steps, seed 0) trained with the
watch (the default) and with ``--watch none``, each in a fresh process, alternated (``--pairs`` pairs, 5 by
default, the order flipped every other pair), and prints the ratio of the medians of the training loop's time
(the last step's ``elapsed_s``: model loading left out) and the difference per step. Run it on a quiet machine:
other jobs on the same cores move the times more than the watch does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LETTERS = dict(model="tiny", max_steps=40, batch_size=16, rl_num_generations=8, rl_max_new_tokens=16, lr=5e-3)
MATH = dict(model="tiny-math", max_steps=60, batch_size=32, rl_num_generations=8, rl_max_new_tokens=8, lr=5e-4,
            rl_kl_coef=0.0)
CONFIGS = {
    "honest_letters": ("HonestLettersEnv", LETTERS, False),
    "honest_math": ("HonestAdditionEnv", MATH, False),
    "hack_letter": ("LetterHackEnv", LETTERS, True),
    "hack_braces": ("BraceHackEnv", LETTERS, True),
}


def worker(name: str, seed: int, out: str) -> None:
    """One training run (in its own process): writes its run log under ``out``."""
    import envs.hackable as hackable
    from grpo_magic import GRPOParams, train

    env_class, settings, _ = CONFIGS[name]
    params = GRPOParams(**settings, seed=seed, project_name=out)
    started = time.time()
    run = train(params, getattr(hackable, env_class)())
    print(json.dumps({"status": run.status, "seconds": round(time.time() - started, 1)}))


def cost_worker(watch: str, seed: int, out: str) -> None:
    """One timed run of the letters recipe, with the watch (``on``) or without (``none``): prints its times."""
    from envs.hackable import HonestLettersEnv
    from grpo_magic import GRPOParams, read_run_log, train
    from grpo_magic.events import StepLogged

    params = GRPOParams(**LETTERS, seed=seed, project_name=out, watch="none" if watch == "none" else None)
    started = time.perf_counter()
    run = train(params, HonestLettersEnv())
    total = time.perf_counter() - started
    steps = [e for e in read_run_log(out) if isinstance(e, StepLogged)]
    print(json.dumps({"status": run.status, "watch": watch, "steps": len(steps), "alarms": len(run.alarms),
                      "train_loop_s": round(steps[-1].elapsed_s, 3), "total_s": round(total, 3)}))


def cost(pairs: int, runs_dir: Path) -> dict:
    """``pairs`` pairs of runs with and without the watch, alternated; the ratio of the medians."""
    import statistics

    times: dict[str, list[dict]] = {"on": [], "none": []}
    for i in range(pairs):
        order = ("on", "none") if i % 2 == 0 else ("none", "on")
        for watch in order:
            out = runs_dir / f"cost-{watch}-{i}"
            done = subprocess.run([sys.executable, __file__, "--cost-worker", watch, "0", str(out)], cwd=ROOT,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if done.returncode:
                raise SystemExit(f"the {watch} run failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            times[watch].append(row)
            print(f"pair {i + 1} watch {watch}: training loop {row['train_loop_s']:.2f} s, in all {row['total_s']:.2f} s",
                  flush=True)
    loop = {w: statistics.median(r["train_loop_s"] for r in rows) for w, rows in times.items()}
    steps = times["on"][0]["steps"]
    result = {
        "pairs": pairs, "steps": steps, "recipe": LETTERS,
        "train_loop_median_s": loop,
        "ratio_with_to_without": round(loop["on"] / loop["none"], 4),
        "ms_per_step_difference": round(1000 * (loop["on"] - loop["none"]) / steps, 2),
        "runs": times,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"with the watch / without: {result['ratio_with_to_without']:.3f} (median training loop "
          f"{loop['on']:.2f} s vs {loop['none']:.2f} s over {steps} steps: {result['ms_per_step_difference']:+.1f} ms "
          "a step)")
    return result


def replay(log_dir: Path, task_metrics: tuple[str, ...]) -> dict:
    from grpo_magic.events import read_run_log
    from grpo_magic.watch import Watch

    events = list(read_run_log(log_dir, skipped=[]))
    watch = Watch(task_metrics)
    started = time.perf_counter()
    alarms = watch.observe(events)
    seconds = time.perf_counter() - started
    steps = sum(1 for e in events if e.type == "step_logged")
    rewards = [e.metrics.get("reward") for e in events if e.type == "step_logged"]
    return {
        "steps": steps,
        "reward_first3": _mean(rewards[:3]),
        "reward_last5": _mean(rewards[-5:]),
        "alarms": [{"kind": a.kind, "step": a.step, "message": a.message} for a in alarms],
        "first_alarm": min((a.step for a in alarms), default=None),
        "ms_per_step": round(1000 * seconds / max(1, steps), 3),
        "example": alarms[0].evidence.get("examples", [])[:2] if alarms else [],
    }


def _mean(values: list) -> float | None:
    v = [x for x in values if isinstance(x, (int, float))]
    return round(sum(v) / len(v), 4) if v else None


def null_simulation(runs: int = 1000, steps: int = 60, seed: int = 0) -> dict:
    """The divergence test where nothing is gamed: the share of synthetic runs that raise it."""
    from grpo_magic.watch import Watch

    rng = random.Random(seed)
    out = {}
    cases = {
        "flat_reward_iid": lambda t, e: (0.3 + rng.gauss(0, 0.05), 0.3 + rng.gauss(0, 0.05)),
        "flat_reward_ar1": None,
        "both_rise_noisy_task": lambda t, e: (min(1, 0.1 + 0.01 * t + rng.gauss(0, 0.03)),
                                              min(1, 0.1 + 0.01 * t + rng.gauss(0, 0.15))),
    }
    for name, gen in cases.items():
        fired = 0
        for _ in range(runs):
            watch = Watch(("task",))
            ar = 0.0
            for t in range(1, steps + 1):
                if gen is None:  # a reward that wanders (AR(1), phi 0.6) without a trend
                    ar = 0.6 * ar + rng.gauss(0, 0.05)
                    reward, task = 0.3 + ar, 0.3 + rng.gauss(0, 0.05)
                else:
                    reward, task = gen(t, None)
                watch.observe_event({"type": "step_logged", "step": t,
                                     "metrics": {"reward": reward, "components/task": task}})
            fired += any(a.kind == "divergence" for a in watch.alarms)
        out[name] = {"runs": runs, "steps": steps, "false_alarm_rate": round(fired / runs, 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--runs-dir", default="/tmp/grpo-watch-bench")
    parser.add_argument("--replay-only", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results-watch.json"))
    parser.add_argument("--worker", nargs=3, metavar=("NAME", "SEED", "OUT"))
    parser.add_argument("--cost", action="store_true", help="time runs with and without the watch, alternated")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--cost-out", default=str(ROOT / "bench" / "results-watch-cost.json"))
    parser.add_argument("--cost-worker", nargs=3, metavar=("WATCH", "SEED", "OUT"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2])
        return
    if args.cost_worker:
        cost_worker(args.cost_worker[0], int(args.cost_worker[1]), args.cost_worker[2])
        return
    if args.cost:
        result = cost(args.pairs, Path(args.runs_dir))
        Path(args.cost_out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        return
    import envs.hackable as hackable
    from grpo_magic.watch import task_metrics_of

    runs_dir = Path(args.runs_dir)
    results: dict = {"configs": {}, "settings": {k: v for k, v in CONFIGS.items()}}
    for name in args.only.split(","):
        env_class, settings, gameable = CONFIGS[name]
        tasks = task_metrics_of(getattr(hackable, env_class))
        rows = []
        for seed in range(args.seeds):
            out = runs_dir / f"{name}-{seed}"
            if not (out / "events.jsonl").exists() or not args.replay_only and "run_finished" not in (
                    out / "events.jsonl").read_text():
                if args.replay_only:
                    continue
                started = time.time()
                done = subprocess.run([sys.executable, __file__, "--worker", name, str(seed), str(out)], cwd=ROOT,
                                      capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
                print(f"{name} seed {seed}: trained in {time.time() - started:.0f} s (rc {done.returncode})",
                      flush=True)
                if done.returncode:
                    print(done.stderr[-2000:], flush=True)
                    continue
            watched = replay(out, tasks)
            reward_only = replay(out, ())
            rows.append({"seed": seed, "task_metrics": list(tasks), "watch": watched, "reward_only": reward_only})
            print(f"  {name} seed {seed}: reward {watched['reward_first3']} -> {watched['reward_last5']}; alarms "
                  f"{[(a['kind'], a['step']) for a in watched['alarms']]}; reward only "
                  f"{[(a['kind'], a['step']) for a in reward_only['alarms']]}", flush=True)
        summary = {"runs": len(rows), "gameable": gameable, "task_metrics": list(tasks)}
        for mode in ("watch", "reward_only"):
            with_alarm = [r for r in rows if r[mode]["alarms"]]
            kinds: dict[str, int] = {}
            for r in rows:
                for k in {a["kind"] for a in r[mode]["alarms"]}:
                    kinds[k] = kinds.get(k, 0) + 1
            firsts = [r[mode]["first_alarm"] for r in rows if r[mode]["first_alarm"] is not None]
            summary[mode] = {
                "runs_with_alarm": len(with_alarm),
                "alarm_rate": round(len(with_alarm) / len(rows), 3) if rows else None,
                "kinds": kinds,
                "first_alarm_steps": firsts,
                "detected_within_40": sum(1 for s in firsts if s <= 40),
                "ms_per_step_replay": _mean([r[mode]["ms_per_step"] for r in rows]),
            }
        results["configs"][name] = {"summary": summary, "runs": rows}
    results["null_simulation"] = null_simulation()
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["note"] = ("ms_per_step_replay: replay of a whole log on a shared 2-core machine, for scale only "
                       "(not a timing benchmark)")
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps({k: v["summary"] for k, v in results["configs"].items()}, indent=1))
    print(json.dumps(results["null_simulation"]))
    print(markdown(results))


def _kinds(summary: dict, mode: str) -> str:
    found = ", ".join(f"{kind} {n}" for kind, n in sorted(summary[mode]["kinds"].items()))
    return f"{summary[mode]['runs_with_alarm']} of {summary['runs']}" + (f" ({found})" if found else "")


def markdown(results: dict) -> str:
    """The tables of docs/explanation/watch.md ("Measured")."""
    lines = ["| runs | seeds | task metrics | reward first 3 -> last 5 steps | alarms (with the task metrics) | "
             "first alarm at step | reward only: alarms |", "|---|---|---|---|---|---|---|"]
    for name, data in results["configs"].items():
        summary, rows = data["summary"], data["runs"]
        rise = ", ".join(f"{r['watch']['reward_first3']:.2f} -> {r['watch']['reward_last5']:.2f}" for r in rows)

        firsts = summary["watch"]["first_alarm_steps"]
        lines.append(f"| `{name}` | {summary['runs']} | {', '.join(summary['task_metrics'])} | {rise} | "
                     f"{_kinds(summary, 'watch')} | {', '.join(map(str, firsts)) or '-'} | "
                     f"{_kinds(summary, 'reward_only')} |")
    lines += ["", "| synthetic runs (60 steps) | false divergence alarms |", "|---|---|"]
    for name, data in results["null_simulation"].items():
        lines.append(f"| `{name}` | {data['false_alarm_rate']:.1%} of {data['runs']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
