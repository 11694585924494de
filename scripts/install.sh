#!/usr/bin/env bash
# Install everything a fresh machine lacks: Python packages (pinned) and Debian's chromium for browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q "torch==2.13.0"
python -m pip install -q -r requirements-ci.txt
python -m pip install -q --no-deps -e .
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q chromium >/dev/null
  else
    echo "install.sh: chromium is missing (browser tests need it): sudo apt-get install chromium" >&2
  fi
fi
python - <<'PY'
import torch, trl, transformers
print(f"installed: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")
PY
