#!/usr/bin/env bash
# CI's legs for the environments people already have (issue 43): the openenv and verifiers extras, each in a venv
# of its own, because they cannot share one (openenv 0.10.0 needs mcp 1.x, verifiers 0.4.0 mcp 2.0). Each venv is
# made with --system-site-packages over the main environment (torch, TRL, transformers and grpo-magic of
# requirements-ci.txt are reused, not installed again); pip installs only the library's pins into it
# (requirements-<lib>.txt), so the main environment is never changed. Then that library's test file runs there:
# every tier of it (its refusals, a few steps of training and %grpo_check on tiny / tiny-agent, the reward's rise).
# Prints how long each step took. Venvs go under $GRPO_MAGIC_SHARED_ENVS_DIR (default ~/.cache/grpo-magic-ci).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
ROOT="${GRPO_MAGIC_SHARED_ENVS_DIR:-$HOME/.cache/grpo-magic-ci}"
PYTHON="${PYTHON:-python}"
mkdir -p "$ROOT"
summary=()
all_started=$(date +%s)
for lib in openenv verifiers; do
  venv="$ROOT/venv-$lib"
  started=$(date +%s)
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$venv"
  created=$(date +%s)
  "$venv/bin/python" -m pip install -q -r "requirements-$lib.txt"
  installed=$(date +%s)
  echo "$lib leg: $("$venv/bin/python" -c "from importlib.metadata import version as v
print(f'$lib {v(\"$lib\")}, mcp {v(\"mcp\")}, trl {v(\"trl\")}, transformers {v(\"transformers\")}')")"
  "$venv/bin/python" -m pytest "tests/test_$lib.py"
  tested=$(date +%s)
  line="$lib: venv $((created - started)) s, install $((installed - created)) s, tests $((tested - installed)) s"
  echo "$line"
  summary+=("$line")
done
printf '%s\n' "${summary[@]}"
echo "shared envs: $(( $(date +%s) - all_started )) s in all"
