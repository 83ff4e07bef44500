#!/usr/bin/env bash
# The API contract, proven by an outside tool: schemathesis generates requests from openapi.yaml
# and checks every response against it. Run through with-service.sh (`make contract`).
#   CONTRACT_MAX_EXAMPLES  examples per operation and phase (default 40)
#   CONTRACT_SEED          generation seed (default fixed, so CI runs are reproducible)
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=.venv/schemathesis
version=4.32.5
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

# One worker: with two, Hypothesis parses its own sources in two threads at once, which the ast
# module of CPython 3.11.7 cannot do (a spurious "AST constructor recursion depth mismatch"
# error on whichever operation meets it). One is no slower here.
"$venv/bin/schemathesis" run openapi.yaml \
  --url "$ORDERPAY_URL" \
  --header "Authorization: Bearer $ORDERPAY_KEY" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "${CONTRACT_MAX_EXAMPLES:-40}" \
  --seed "${CONTRACT_SEED:-20261130}" \
  --workers 1 \
  --no-color
