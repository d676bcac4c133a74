#!/usr/bin/env bash
# Install what the tests need, then run them. README's second quick-start command; .ci/run calls it.
# Usage: bash tools/test.sh [pytest args...]
#
# The tests run on Python 3.12 in a virtual environment (.venv/), because megatron-core 0.19 (the
# Megatron backend, whose multi-rank tests run on CPU with gloo) needs Python >= 3.12. PYTHON=...
# names the interpreter; otherwise the first Python >= 3.12 found (python3.12, python3.13, a pyenv
# version, python3) makes the environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

at_least_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

find_python() {
  local c
  if [ -n "${PYTHON:-}" ]; then
    at_least_312 "$PYTHON" || { echo "!! PYTHON=$PYTHON is older than 3.12 (megatron-core needs 3.12)" >&2; return 1; }
    echo "$PYTHON"; return 0
  fi
  for c in python3.12 python3.13 python3; do
    if command -v "$c" >/dev/null 2>&1 && at_least_312 "$c"; then command -v "$c"; return 0; fi
  done
  if command -v pyenv >/dev/null 2>&1; then  # pyenv installs versions it does not put on PATH
    for c in "$(pyenv root)"/versions/3.12*/bin/python3.12 "$(pyenv root)"/versions/3.13*/bin/python3.13; do
      if [ -x "$c" ] && at_least_312 "$c"; then echo "$c"; return 0; fi
    done
  fi
  echo "!! no Python >= 3.12 found: install one (e.g. 'pyenv install 3.12') or set PYTHON=/path/to/python3.12" >&2
  return 1
}

VENV="${SLIME_TEST_VENV:-.venv}"
if ! at_least_312 "$VENV/bin/python"; then
  base="$(find_python)"
  echo "== making $VENV with $base ($("$base" --version 2>&1))"
  "$base" -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Tests start `ray`, `slime-lab`, `python3` and `bash experiment.sh` by name: the venv's come first.
PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PATH VIRTUAL_ENV="$(cd "$VENV" && pwd)"

# torch first: on Python 3.11 this machine's disk has a CPU build; on 3.12 the registry's build is
# a CUDA one (a few GB, runs on the CPU). Skip when a torch is already importable (a GPU machine
# keeps its own).
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch"
  "$PY" -m pip install -q "torch==2.13.0"
fi

echo "== installing slime with the test, mooncake and megatron extras"
"$PY" -m pip install -q -e ".[test,mooncake,megatron]"

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

# Types: mypy over slime/ and lab/ ([tool.mypy] in pyproject.toml names the files and the
# third-party packages read as untyped). Like ruff, a finding fails the run after the tests.
echo "== types: mypy"
types=0
"$PY" -m mypy || types=$?

echo "== running the tests ($("$PY" --version 2>&1), megatron-core $("$PY" -c 'import importlib.metadata as m; print(m.version("megatron-core"))'))"
rc=0
"$PY" -m pytest "$@" || rc=$?
if ((lint)); then
  echo "!! ruff check . found problems (listed above)" >&2
fi
if ((types)); then
  echo "!! mypy found type errors (listed above)" >&2
fi
if ((lint || types)); then
  exit $((rc ? rc : 1))
fi
exit "$rc"
