#!/usr/bin/env bash
# The bench's charts need matplotlib: installed into .venv/bench (as make contract installs
# schemathesis into .venv/schemathesis), pinned, once. The harness itself is standard library.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv/bench
version=3.9.2
if ! "$venv/bin/python" -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$version')" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "matplotlib==$version"
fi
