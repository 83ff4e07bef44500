#!/usr/bin/env bash
# Runs a command against a real orderpay: the mock provider and `orderpay serve` on free ports, a
# fresh database, and a new account. The command sees ORDERPAY_URL, ORDERPAY_KEY and
# MOCK_PROVIDER_URL, and the mock's webhooks reach the service (a shared secret, in
# ORDERPAY_PROVIDER_WEBHOOK_SECRET). Merchant webhooks are on (a fresh ORDERPAY_ENCRYPTION_KEY),
# with endpoints at local addresses allowed. Everything is stopped and the database dropped when
# it ends.
#
#   tests/scripts/with-service.sh COMMAND [ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."

# The binary where cargo puts it (CARGO_TARGET_DIR included), unless ORDERPAY_BIN names one.
bin=${ORDERPAY_BIN:-$(tests/scripts/cargo-exe.sh --bin orderpay)}
# The command it runs calls the same binary (bench/settlement.py does).
export ORDERPAY_BIN="$bin"
server=${PG_SERVER_URL:-postgres://postgres@127.0.0.1:5432}
db="orderpay_script_$(date +%s)_$$"
logs=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
mock_port=$(free_port)

export DATABASE_URL="$server/$db"
export ORDERPAY_LISTEN="127.0.0.1:$port"
export MOCK_PROVIDER_LISTEN="127.0.0.1:$mock_port"
export ORDERPAY_PROVIDER_URL="http://127.0.0.1:$mock_port"
# Fast enough for a test run: a held provider answer times out after 1 s.
export MOCK_PROVIDER_TIMEOUT_HOLD_MS=${MOCK_PROVIDER_TIMEOUT_HOLD_MS:-1500}
export ORDERPAY_PROVIDER_TIMEOUT_MS=${ORDERPAY_PROVIDER_TIMEOUT_MS:-1000}
export ORDERPAY_PAYMENT_LEASE_MS=${ORDERPAY_PAYMENT_LEASE_MS:-2000}
export RUST_LOG=${RUST_LOG:-warn}
# Both sides of the provider's webhooks share a fresh secret; the mock sends its events to the
# service, and POST /provider/webhooks exists for the outside tools to see.
webhook_secret="whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
export ORDERPAY_PROVIDER_WEBHOOK_SECRET="$webhook_secret"
export MOCK_PROVIDER_WEBHOOK_SECRET="$webhook_secret"
export MOCK_PROVIDER_WEBHOOK_URL="http://127.0.0.1:$port/provider/webhooks"
# Merchant webhooks: /webhook_endpoints exists, and endpoints the outside tools register may be
# local and plain http (they are delivered to, and fail, like any other).
export ORDERPAY_ENCRYPTION_KEY="$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
export ORDERPAY_WEBHOOK_ALLOW_PRIVATE=true
export ORDERPAY_WEBHOOK_REQUIRE_HTTPS=false

pids=()
cleanup() {
  status=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$status" -ne 0 ]; then
    echo "--- orderpay serve log (last lines)"; tail -n 40 "$logs/serve.log" 2>/dev/null || true
  fi
  psql "$server/postgres" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$logs"
  exit "$status"
}
trap cleanup EXIT

# Only `serve` and `migrate` migrate: the database is created and migrated before any other
# command runs against it.
"$bin" migrate 2>"$logs/migrate.log" || { cat "$logs/migrate.log" >&2; exit 1; }
ORDERPAY_KEY=$("$bin" accounts create "script account" 2>"$logs/account.log") || { cat "$logs/account.log" >&2; exit 1; }
export ORDERPAY_KEY
"$bin" mock-provider >"$logs/mock.log" 2>&1 & pids+=($!)
"$bin" serve >"$logs/serve.log" 2>&1 & pids+=($!)
export ORDERPAY_URL="http://127.0.0.1:$port"
export MOCK_PROVIDER_URL="http://127.0.0.1:$mock_port"
for _ in $(seq 1 100); do
  curl -fsS "$ORDERPAY_URL/readyz" >/dev/null 2>&1 && curl -fsS "$MOCK_PROVIDER_URL/_admin/faults" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "$ORDERPAY_URL/readyz" >/dev/null
"$@"
