#!/usr/bin/env bash
# Builds the orderpay binary and prints its path as cargo reports it, so that CARGO_TARGET_DIR
# (or a target-dir in a cargo config) is followed rather than guessed. Arguments go to cargo
# build (`--release`). Build errors go to stderr and fail the script.
#
#   bin=$(tests/scripts/orderpay-bin.sh [--release])
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --quiet --bin orderpay "$@" --message-format=json-render-diagnostics |
  python3 -c '
import json, sys
paths = [m["executable"] for m in map(json.loads, sys.stdin)
         if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "orderpay"]
if not paths:
    sys.exit("cargo build reported no orderpay binary")
print(paths[-1])'
