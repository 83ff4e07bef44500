#!/usr/bin/env bash
# GET /docs renders the API for a person: headless Chromium (Debian's package, installed when
# missing) loads the page with the network closed to everything but orderpay, runs its scripts,
# and the rendered DOM must list every path of openapi.yaml. Run through with-service.sh
# (`make docs-check`).
set -euo pipefail
cd "$(dirname "$0")/../.."

. tests/scripts/chromium.sh

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
dom=$(chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --virtual-time-budget=20000 --dump-dom "$ORDERPAY_URL/docs" 2>/dev/null)

missing=0
for path in $(grep -E '^  /' openapi.yaml | tr -d ' :'); do
  if grep -qF "data-path=\"$path\"" <<<"$dom"; then
    echo "docs show $path"
  else
    echo "docs do NOT show $path" >&2
    missing=1
  fi
done
exit "$missing"
