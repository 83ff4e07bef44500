#!/usr/bin/env python3
"""Settlement reconciliation at scale (`make bench-settlement`): how fast a window of
SETTLEMENT_MOVEMENTS (default 1,000,000) provider movements is reconciled, and in how much memory.

Runs inside tests/scripts/with-service.sh (a real service, the mock provider, a fresh database).
Both sides are laid down directly, not through the API: the mock's seeded generator
(`POST /_admin/balance_transactions/generate`) and the same movements written into the ledger by
one INSERT ... SELECT over generate_series, with the formula the generator documents (movement i
is a charge of payment `{seed:08x}-0000-7000-8000-{i:012x}` for (1 + i % 9973) / 100 USD, every
tenth a refund of that id instead). The ledger's side is written with triggers off (as a restore
would), so no payment rows are needed for its foreign key. Every 10,007th movement is left out of
the ledger, so the run has exceptions to find (missing_ours). Then `orderpay settlement run` is
timed over the window, twice: the first run matches everything, the second finds it all known.
Peak memory is the run's maximum resident set (getrusage of the child).
"""

import json
import os
import resource
import subprocess
import sys
import time
import urllib.request

MOCK = os.environ["MOCK_PROVIDER_URL"]
DB_URL = os.environ["DATABASE_URL"]
COUNT = int(os.environ.get("SETTLEMENT_MOVEMENTS", "1000000"))
# The binary tests/scripts/with-service.sh found with cargo (it follows CARGO_TARGET_DIR).
BIN = os.environ["ORDERPAY_BIN"]
SEED = 7
START = "2030-01-01T00:00:00Z"
END = "2030-01-02T00:00:00Z"
LEFT_OUT = 10_007


def psql(sql):
    subprocess.run(["psql", DB_URL, "-qAtX", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True)


def generate():
    body = json.dumps({"seed": SEED, "count": COUNT, "created_gte": START, "created_lt": END}).encode()
    request = urllib.request.Request(MOCK + "/_admin/balance_transactions/generate", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=600) as response:
        assert response.status == 201, response.status


def seed_ledger():
    # The generator's step between movements, in microseconds (PostgreSQL's resolution).
    psql(f"""
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO ledger_movements (account_id, id, type, operation_id, payment_id, order_id,
    debit_account, credit_account, amount, currency, created_at)
SELECT a.id, orderpay_uuid_v7(at), CASE WHEN refund THEN 'refund' ELSE 'charge_captured' END,
    object, object, object,
    CASE WHEN refund THEN 'refunds' ELSE 'provider_balance' END,
    CASE WHEN refund THEN 'provider_balance' ELSE 'customer_payments' END,
    (1 + i % 9973) / 100.0, 'USD', at
FROM (SELECT id FROM accounts LIMIT 1) AS a,
     generate_series(0, {COUNT} - 1) AS i,
     LATERAL (SELECT i % 10 = 9 AS refund,
         (lpad(to_hex({SEED}), 8, '0') || '-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid AS object,
         timestamptz '{START}' + (i * (86400.0 / {COUNT})) * interval '1 second'
             + interval '1 millisecond' AS at) AS m
WHERE i % {LEFT_OUT} <> 0;
COMMIT;
ANALYZE ledger_movements;
""")


def settle():
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = subprocess.run([BIN, "settlement", "run", "--from", START, "--to", END, "--json"],
                            capture_output=True, text=True)
    seconds = time.monotonic() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if result.returncode not in (0, 1):
        sys.exit(f"settlement run failed ({result.returncode}): {result.stderr}")
    report = json.loads(result.stdout)
    return seconds, max(peak_kib, before), report


def main():
    started = time.monotonic()
    generate()
    generated = time.monotonic() - started
    started = time.monotonic()
    seed_ledger()
    seeded = time.monotonic() - started
    print(f"laid down {COUNT:,} provider movements in {generated:.1f} s and the ledger's side in {seeded:.1f} s")
    for label in ("first run", "run again"):
        seconds, peak_kib, report = settle()
        counts = {name: bucket["count"] for name, bucket in report["categories"].items() if bucket["count"]}
        print(f"{label}: {report['provider_read']:,} provider movements in {seconds:.1f} s "
              f"({report['provider_read'] / seconds:,.0f}/s), peak RSS {peak_kib / 1024:.0f} MiB, "
              f"{report['items_written']:,} items written, categories {counts}")
    expected_missing = len(range(0, COUNT, LEFT_OUT))
    if counts.get("missing_ours") != expected_missing or counts.get("matched") != COUNT - expected_missing:
        sys.exit(f"expected {COUNT - expected_missing} matched and {expected_missing} missing_ours")


if __name__ == "__main__":
    main()
