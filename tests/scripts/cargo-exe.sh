#!/usr/bin/env bash
# Builds one executable with cargo and prints its path as cargo reports it, so that
# CARGO_TARGET_DIR (or a target-dir in a cargo config) is followed rather than guessed. The
# arguments go to cargo build and name one executable; build errors go to stderr and fail.
#
#   bin=$(tests/scripts/cargo-exe.sh --bin orderpay [--release])
#   proxy=$(tests/scripts/cargo-exe.sh -p orderpay-fault-proxy --bin fault-proxy)
#   example=$(tests/scripts/cargo-exe.sh -p orderpay-client --example checkout)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --quiet "$@" --message-format=json-render-diagnostics |
  python3 -c '
import json, sys
paths = [m["executable"] for m in map(json.loads, sys.stdin)
         if m.get("reason") == "compiler-artifact" and m.get("executable")]
if not paths:
    sys.exit("cargo build reported no executable")
print(paths[-1])'
