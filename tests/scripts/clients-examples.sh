#!/usr/bin/env bash
# The clients' checkout examples against a real service (run through with-service.sh, which
# exports ORDERPAY_URL and ORDERPAY_KEY): each prints one JSON line, checked here for a good card
# and a declined one.
set -euo pipefail
cd "$(dirname "$0")/../.."

check() { # NAME EXPECTED_STATUS LINE
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
name, expected, line = sys.argv[1:]
answer = json.loads(line)
assert set(answer) >= {"order_id", "payment_id", "status", "attempts", "replayed"}, (name, answer)
assert answer["status"] == expected, (name, answer)
assert answer["order_id"] and answer["payment_id"] and answer["attempts"] >= 1, (name, answer)
assert answer["replayed"] is False, (name, answer)
print(f"{name}: {line}")
PY
}

# The example where cargo puts it (CARGO_TARGET_DIR included).
example=$(tests/scripts/cargo-exe.sh -p orderpay-client --example checkout)
for method in pm_card_ok pm_card_declined; do
  expected=$([ "$method" = pm_card_ok ] && echo succeeded || echo failed)
  check "rust example ($method)" "$expected" "$(ORDERPAY_PAYMENT_METHOD=$method "$example")"
  check "typescript example ($method)" "$expected" \
    "$(ORDERPAY_PAYMENT_METHOD=$method node clients/typescript/examples/checkout.mjs)"
done
