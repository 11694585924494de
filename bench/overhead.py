"""One side of the overhead comparison, as a whole process: plain TRL or ``grpo_magic.train`` on the same model,
prompts, reward and settings (bench/run.py's letters workload), from the imports to the saved weights.

Time the two from outside, alternated, with any process timer, e.g. ``/usr/bin/time -v``::

    python bench/overhead.py trl --steps 60
    python bench/overhead.py grpo_magic --steps 60

Both import torch, transformers and TRL before anything else, so the difference is what grpo_magic adds: its
imports, its checks before the model loads, the run log, the recorded groups, the events, the final save.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=["trl", "grpo_magic"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = parser.parse_args()
    import torch
    import transformers  # noqa: F401 - both sides pay for the same imports first
    import trl  # noqa: F401

    torch.set_num_threads(args.threads)
    import run as bench  # bench/run.py: the workload and both sides' code

    with tempfile.TemporaryDirectory(prefix=f"overhead-{args.side}-") as out:
        os.chdir(out)
        result = bench._run_plain_trl(args.steps) if args.side == "trl" else bench._run_grpo_magic(args.steps, False)
    print(f"{args.side}: {args.steps} steps, loop {result['loop_s']:.2f} s, model load to saved weights "
          f"{result['e2e_s']:.2f} s, last reward {result['rewards'][-1]:.3f}")


if __name__ == "__main__":
    main()
