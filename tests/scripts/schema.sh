#!/usr/bin/env bash
# Generates src/db/schema.rs from the migrations with diesel's own tooling, or, with --check,
# fails when the checked-in file is not what the migrations generate.
#
#   tests/scripts/schema.sh [--check]
#
# Installs the pinned diesel_cli (postgres only, against Debian's libpq-dev) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIESEL_CLI_VERSION=2.3.14
server=${PG_SERVER_URL:-postgres://postgres@127.0.0.1:5432}
if ! command -v diesel >/dev/null || ! diesel --version | grep -q "Version: $DIESEL_CLI_VERSION\$"; then
  if ! pkg-config --exists libpq 2>/dev/null && [ ! -e /usr/include/postgresql/libpq-fe.h ]; then
    if command -v apt-get >/dev/null; then
      apt-get install -y -q libpq-dev >/dev/null
    else
      echo "diesel_cli needs libpq's headers: install libpq-dev (Debian/Ubuntu) or libpq (Homebrew)." >&2
      exit 1
    fi
  fi
  echo "installing diesel_cli $DIESEL_CLI_VERSION (postgres only)"
  cargo install diesel_cli --version "$DIESEL_CLI_VERSION" --no-default-features --features postgres --locked --quiet
fi

db="orderpay_schema_$(date +%s)_$$"
generated=$(mktemp)
# A config without print_schema, so that running the migrations leaves schema.rs alone.
config=$(mktemp --suffix=.toml)
printf '[migrations_directory]\ndir = "%s/migrations"\n' "$PWD" >"$config"
cleanup() {
  psql "$server/postgres" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
  rm -f "$generated" "$config"
}
trap cleanup EXIT
psql "$server/postgres" -qc "CREATE DATABASE \"$db\""
diesel migration run --database-url "$server/$db" --config-file "$config" >/dev/null
diesel print-schema --database-url "$server/$db" --config-file "$config" >"$generated"

if [ "${1:-}" = "--check" ]; then
  if ! diff -u src/db/schema.rs "$generated"; then
    echo "src/db/schema.rs is not what the migrations generate: run 'make schema' and commit it." >&2
    exit 1
  fi
  echo "src/db/schema.rs is current"
else
  cp "$generated" src/db/schema.rs
  echo "wrote src/db/schema.rs"
fi
