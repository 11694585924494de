"""Where grpo_magic's time per training step goes, part by part, on bench/run.py's letters workload.

    python bench/overhead_parts.py            # 3 runs of 40 steps after a warm-up; ms per step of each part
    python bench/overhead_parts.py --json

Timed in process (perf_counter around each part, our own objects wrapped; nothing of TRL's is touched), so the
figures add up to what grpo_magic adds on the training thread, and say which part to cut; the ratio against
plain TRL itself is measured from outside the parts (bench/run.py's overhead rows, bench/overhead.py). The
parts:

- ``events: <subscriber>``: each subscriber of the run's event stream (the run log, the watch, the run's own state,
  the dashboard when shown), over every event of a step;
- ``on_log (events, watch flush)``: the step's log turned into a ``StepLogged`` event and delivered (it includes
  the subscribers' share of that event);
- ``reward``: the reward function TRL calls (episodes, their bookkeeping, the policy in eval mode around them),
  beside plain TRL's reward function on the same completions;
- ``scored``: each batch's record and advantages turned into ``GroupScored`` events and delivered (it includes
  the subscribers' share of those events).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _timed(acc: dict[str, float], name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[name] += time.perf_counter() - start

    return wrapper


def measure(runs: int, steps: int, dashboard: bool) -> dict[str, Any]:
    import run as bench  # bench/run.py: the workload, both sides' code

    import grpo_magic.events as events
    import grpo_magic.training.trainer as trainer

    acc: dict[str, float] = collections.defaultdict(float)

    def emit(self: Any, event: Any) -> None:  # EventStream.emit, each subscriber timed apart
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            start = time.perf_counter()
            try:
                subscriber(event)
            except Exception:  # noqa: BLE001 - as EventStream.emit: a subscriber's failure is not ours to time
                pass
            name = getattr(subscriber, "__qualname__", type(subscriber).__name__).split(".")[0]
            acc[f"events: {name}"] += time.perf_counter() - start

    original_callback = trainer.events_callback

    def events_callback(*, on_log: Any, **kwargs: Any) -> Any:
        return original_callback(on_log=_timed(acc, "on_log (events, watch flush)", on_log), **kwargs)

    events.EventStream.emit = emit  # type: ignore[method-assign]
    trainer.events_callback = events_callback
    trainer.StepRecords.__call__ = _timed(acc, "reward", trainer.StepRecords.__call__)  # type: ignore[method-assign]
    trainer.StepObserver.scored = _timed(acc, "scored", trainer.StepObserver.scored)  # type: ignore[method-assign]
    bench.letters_share = _timed(acc, "plain TRL: reward", bench.letters_share)

    bench._run_plain_trl(2)
    bench._run_grpo_magic(2, dashboard)
    acc.clear()
    loops = {"grpo_magic": [], "plain TRL": []}
    for _ in range(runs):
        for side in ("grpo_magic", "plain TRL"):
            result = bench._run_grpo_magic(steps, dashboard) if side == "grpo_magic" else bench._run_plain_trl(steps)
            loops[side].append(result["loop_s"])
    per_step = {name: round(1000 * seconds / (runs * steps), 3) for name, seconds in
                sorted(acc.items(), key=lambda kv: -kv[1])}
    step_ms = {side: round(1000 * statistics.median(v) / steps, 1) for side, v in loops.items()}
    return {"timed": "in process: perf_counter around each part, ms per training step (mean over the runs)",
            "runs": runs, "steps": steps, "dashboard": dashboard, "ms_per_step": per_step, "loop_ms_per_step": step_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--dashboard", action="store_true", help="with the dashboard subscribed (headless)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import run as bench

    bench._setup_worker(args.threads)
    with tempfile.TemporaryDirectory(prefix="overhead-parts-") as out:
        os.chdir(out)
        with bench._silence():
            result = measure(args.runs, args.steps, args.dashboard)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['timed']}; {args.runs} runs of {args.steps} steps; a step of the loop: "
          + ", ".join(f"{side} {ms} ms" for side, ms in result["loop_ms_per_step"].items()))
    for name, ms in result["ms_per_step"].items():
        print(f"  {ms:7.3f} ms  {name}")


if __name__ == "__main__":
    main()
