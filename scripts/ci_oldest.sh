#!/usr/bin/env bash
# CI's "oldest" leg: the oldest end of every range pyproject.toml declares (requirements-oldest.txt: TRL,
# transformers, IPython, ipykernel), every other package as requirements-ci.txt, in a venv of its own, running
# the core tests (parameters, the reward adapter, training, the magics, agent envs, TRL's internals, packaging).
# The main leg (.ci/run's first pytest) runs the whole suite on the newest end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV="${GRPO_MAGIC_OLDEST_VENV:-.venv-oldest}"
CORE=(tests/test_params.py tests/test_reward.py tests/test_train.py tests/test_magics.py tests/test_agent.py
      tests/test_trl_compat.py tests/test_packaging.py)
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
"$VENV/bin/python" - <<'PY'
import IPython, ipykernel, transformers, trl
print(f"oldest leg: trl {trl.__version__}, transformers {transformers.__version__}, IPython {IPython.__version__}, "
      f"ipykernel {ipykernel.__version__}")
PY
installed=$(date +%s)
GRPO_MAGIC_PINS=requirements-oldest.txt "$VENV/bin/python" -m pytest "${CORE[@]}"
echo "oldest leg: install $((installed - started)) s, core tests $(( $(date +%s) - installed )) s"
