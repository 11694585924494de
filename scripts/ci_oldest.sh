#!/usr/bin/env bash
# CI's older stacks, in one venv of their own, each running the fast tier of the core tests (parameters, TRL
# settings, the reward adapter, training, the magics, agent envs, TRL's internals, the GPU stack's checks, packaging):
#   1. the oldest end of every range pyproject.toml declares (requirements-oldest.txt: TRL 1.14, transformers 5.17,
#      IPython 8.12, ipykernel 7.1), every other package as requirements-ci.txt;
#   2. the same venv with requirements-vllm-stack.txt over it: TRL 1.16 on transformers 5.17, what the vllm extra
#      installs.
# The main leg (.ci/run's first pytest) runs the whole suite on the newest end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV="${GRPO_MAGIC_OLDEST_VENV:-.venv-oldest}"
CORE=(tests/test_params.py tests/test_trl_settings.py tests/test_reward.py tests/test_train.py tests/test_magics.py
      tests/test_agent.py tests/test_trl_compat.py tests/test_gpu_stack.py tests/test_packaging.py)
started=$(date +%s)
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
# requirements-ci.txt less what the oldest leg pins otherwise, and less what only the browser, lint and
# tracker tests use (not in the core list)
overridden=$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' requirements-oldest.txt | paste -sd'|')
grep -v -i -E "^(${overridden}|playwright|jupyterlab|notebook|ruff|reasoning-gym|trackio|tensorboard|pillow)==" \
    requirements-ci.txt > "$VENV/requirements-rest.txt"
"$VENV/bin/python" -m pip install -q -r requirements-oldest.txt -r "$VENV/requirements-rest.txt"
"$VENV/bin/python" -m pip install -q --no-deps -e .
versions() {
  "$VENV/bin/python" -c 'import IPython, ipykernel, transformers, trl
print(f"trl {trl.__version__}, transformers {transformers.__version__}, IPython {IPython.__version__}, "
      f"ipykernel {ipykernel.__version__}")'
}
echo "oldest leg: $(versions)"
installed=$(date +%s)
GRPO_MAGIC_PINS=requirements-oldest.txt "$VENV/bin/python" -m pytest -m fast "${CORE[@]}"
tested=$(date +%s)
"$VENV/bin/python" -m pip install -q -r requirements-vllm-stack.txt
echo "vllm-stack leg: $(versions)"
swapped=$(date +%s)
GRPO_MAGIC_PINS="requirements-oldest.txt:requirements-vllm-stack.txt" "$VENV/bin/python" -m pytest -m fast "${CORE[@]}"
echo "older stacks: install $((installed - started)) s, oldest tests $((tested - installed)) s," \
     "TRL 1.16 install $((swapped - tested)) s, its tests $(( $(date +%s) - swapped )) s"
