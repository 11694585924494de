#!/usr/bin/env bash
# Build the docs site strictly (a broken link, a missing anchor, a page left out of the nav or a reference page
# whose generation fails is an error) into a temporary folder, and say how long it took.
#
#   bash scripts/docs_build.sh            # installs requirements-docs.txt first when its pins are missing
#   bash scripts/docs_build.sh OUT_DIR    # keep the built site in OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 NO_MKDOCS_2_WARNING=1
if ! python - <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
pins = [l.split("==") for l in open("requirements-docs.txt") if "==" in l and not l.startswith("#")]
sys.exit(any(version(name.strip()) != pin.strip() for name, pin in pins))
PY
then
  python -m pip install -q -r requirements-docs.txt
fi
out="${1:-$(mktemp -d)}"
start=$SECONDS
# python -m: the hook imports this checkout's grpo_magic, so the site describes the code beside it.
python -m mkdocs build --strict --site-dir "$out"
echo "docs_build.sh: the site built strictly in $((SECONDS - start)) s${1:+ into $out}"
if [ -z "${1:-}" ]; then rm -rf "$out"; fi
