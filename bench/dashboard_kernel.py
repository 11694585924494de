"""What the dashboard costs a run in a real Jupyter kernel, timed from outside it (issue 24).

    python bench/dashboard_kernel.py --pairs 20 --steps 150        # about 10 s a run on 2 CPU cores
    python bench/dashboard_kernel.py --pairs 20 --json results.json

One python3 kernel (nbclient, as nbconvert runs a notebook) trains the same fast run again and again:
``tiny`` on the letters env (bench/run.py's workload: batch 16, 8 generations, 16 new tokens), with
``grpo_magic.train(..., display=True)`` (the dashboard displayed: its widget messages go out over
the kernel's sockets) and with ``display=False``, alternated in pairs (D P, P D, D P, ...) after one
warm-up run of each. Each run is timed by a ``TrainerCallback`` from the first step's start
(``on_step_begin`` of step 1) to ``on_train_end``: wall time and the process's CPU time (every thread
of the kernel, the dashboard's renderer included). One torch thread (``torch.set_num_threads(1)``,
``OMP_NUM_THREADS=1``), so that the dashboard's thread does not fight torch's own for the second core
and the noise stays low. No figure of the dashboard's own stands in for the ratio: its curve messages
are only counted (``run.dashboard.points_sent`` against the logged steps).

Reported: the per-pair ratio (dashboard / none) of wall and CPU time, mean with its 95% interval
(Student's t over the pairs), median and range; the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LETTERS = {
    "batch_size": 16,
    "rl_num_generations": 8,
    "rl_max_new_tokens": 16,
    "lr": 5e-3,
    "rl_kl_coef": 0.0,
    "seed": 42,
}
MARK = "@@RUN "

SETUP = """import json, os, time
import torch
torch.set_num_threads(1)
import grpo_magic
from envs.letters import LettersEnv
from transformers import TrainerCallback

class Loop(TrainerCallback):
    '''From the first step's start to the end of training: wall and process CPU time.'''
    def on_step_begin(self, args, state, control, **kwargs):
        if not hasattr(self, "t0"):
            self.t0, self.c0 = time.perf_counter(), time.process_time()
    def on_train_end(self, args, state, control, **kwargs):
        self.wall, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0

def one(side, steps, out):
    loop = Loop()
    params = grpo_magic.GRPOParams(model="tiny", project_name=out, max_steps=steps, **LETTERS)
    run = grpo_magic.train(params, LettersEnv, display=(side == "D"), callbacks=[loop])
    assert run.status == "completed", run.reason
    d = run.dashboard
    logged = len({h["step"] for h in run.history if "step" in h})
    print("@@RUN " + json.dumps({"side": side, "wall": loop.wall, "cpu": loop.cpu, "logged": logged,
                                 "points": d.points_sent if d is not None else None,
                                 "updates": d.curve_updates if d is not None else None,
                                 "renders": d.render_count if d is not None else None,
                                 "render_s": d.render_seconds if d is not None else None}))
"""


def _t95(n: int) -> float:
    """Student's t for a two-sided 95% interval with n - 1 degrees of freedom."""
    table = {
        1: 12.71,
        2: 4.30,
        3: 3.18,
        4: 2.78,
        5: 2.57,
        6: 2.45,
        7: 2.36,
        8: 2.31,
        9: 2.26,
        10: 2.23,
        12: 2.18,
        15: 2.13,
        20: 2.09,
        25: 2.06,
        30: 2.04,
        40: 2.02,
        60: 2.00,
    }
    df = max(1, n - 1)
    return next((v for k, v in sorted(table.items()) if df <= k), 1.96)


def summary(ratios: list[float]) -> dict[str, Any]:
    n = len(ratios)
    mean = statistics.mean(ratios)
    half = _t95(n) * statistics.stdev(ratios) / math.sqrt(n) if n > 1 else math.inf
    return {
        "n": n,
        "mean": round(mean, 4),
        "ci95": [round(mean - half, 4), round(mean + half, 4)],
        "median": round(statistics.median(ratios), 4),
        "min": round(min(ratios), 4),
        "max": round(max(ratios), 4),
    }


def results(runs: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The ratios of the pairs after the two warm-up runs (a last unpaired run is left out)."""
    measured = runs[2:]
    pairs = [(measured[i], measured[i + 1]) for i in range(0, len(measured) - 1, 2)]
    wall, cpu = [], []
    for a, b in pairs:
        d, p = (a, b) if a["side"] == "D" else (b, a)
        wall.append(d["wall"] / p["wall"])
        cpu.append(d["cpu"] / p["cpu"])
    dash = [r for a_b in pairs for r in a_b if r["side"] == "D"]
    return {
        "what": "training loop time (first step to end, TrainerCallback) with the dashboard displayed in a real "
        "kernel (nbclient) over display=False, alternated pairs in one kernel, one torch thread",
        "steps": steps,
        "pairs": len(pairs),
        "wall_ratio": summary(wall),
        "cpu_ratio": summary(cpu),
        "step_ms_no_dashboard": round(
            1000 * statistics.median(r["wall"] for a_b in pairs for r in a_b if r["side"] == "P") / steps, 1
        ),
        "points_sent_per_logged_step": sorted({round(r["points"] / max(1, r["logged"]), 3) for r in dash}),
        "renders_per_run": statistics.median(r["renders"] for r in dash),
        "render_ms_each": round(1000 * sum(r["render_s"] for r in dash) / max(1, sum(r["renders"] for r in dash)), 2),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--json", default=None, help="write the results here (and each run to JSON.runs.jsonl)")
    ap.add_argument("--summarize", default=None, help="only summarize the runs of a .runs.jsonl file")
    args = ap.parse_args()
    if args.summarize:
        runs = [json.loads(line) for line in Path(args.summarize).read_text().splitlines() if line.strip()]
        print(json.dumps({k: v for k, v in results(runs, args.steps).items() if k != "runs"}, indent=1))
        return

    import nbformat
    from nbclient import NotebookClient

    out = tempfile.mkdtemp(prefix="bench-dash-kernel-")
    sides = ["D", "P"]  # warm-up: one of each
    for i in range(args.pairs):
        sides += ["D", "P"] if i % 2 == 0 else ["P", "D"]
    cells = [SETUP.replace("**LETTERS", "**" + repr(LETTERS))]
    cells += [f"one({side!r}, {args.steps}, {str(Path(out) / f'run-{k}')!r})" for k, side in enumerate(sides)]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []

    def hook(cell: Any, cell_index: int, execute_reply: Any) -> None:
        for output in cell.outputs:
            for line in output.get("text", "").splitlines():
                if line.startswith(MARK):
                    run = json.loads(line[len(MARK) :])
                    runs.append(run)
                    if args.json:  # each run as it ends: a run cut short still leaves its pairs
                        with open(args.json + ".runs.jsonl", "a") as f:
                            f.write(json.dumps(run) + "\n")
                    print(
                        f"  run {len(runs)}/{len(sides)} {run['side']}: {run['wall']:.2f} s wall, "
                        f"{run['cpu']:.2f} s CPU",
                        flush=True,
                    )

    client = NotebookClient(
        nb, kernel_name="python3", timeout=1800, on_cell_executed=hook, resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute(env=env)
    result = results(runs, args.steps)
    result.update(
        load_before_after=[round(load0, 2), round(os.getloadavg()[0], 2)], seconds=round(time.monotonic() - t0)
    )
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
