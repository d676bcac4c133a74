#!/usr/bin/env bash
# Install what the tests need, then run them. README's second quick-start command; .ci/run calls it.
# Usage: bash tools/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3}"

# torch first, pinned to the CPU build on this machine's disk: an unpinned torch pulls a multi-GB
# CUDA wheel. Skip when a torch is already importable (a GPU machine keeps its own).
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch (CPU build)"
  "$PY" -m pip install -q "torch==2.13.0"
fi

echo "== installing slime with the test and mooncake extras"
"$PY" -m pip install -q -e ".[test,mooncake]"

# Debian's Chromium drives the browser tests (Playwright cannot download browsers here) and
# the shellcheck tool checks every generated script. Install them when missing and when we may.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
# Mooncake's transfer engine (weight-sync tests) loads libibverbs at import, even over TCP.
{ command -v ldconfig >/dev/null 2>&1 && ldconfig -p | grep -q "libibverbs.so.1"; } || missing+=(libibverbs1)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${missing[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "!! missing ${missing[*]}: install them (Debian: apt-get install ${missing[*]}); their tests will fail" >&2
  fi
fi

# Lint the whole tree (rules and exclusions: [tool.ruff] in pyproject.toml). A finding fails the
# run, after the tests have run, so one report shows both. `ruff check --fix .` fixes import order.
echo "== lint: ruff check ."
lint=0
"$PY" -m ruff check . || lint=$?

echo "== running the tests"
rc=0
"$PY" -m pytest "$@" || rc=$?
if ((lint)); then
  echo "!! ruff check . found problems (listed above)" >&2
  exit $((rc ? rc : 1))
fi
exit "$rc"
