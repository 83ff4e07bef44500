#!/usr/bin/env python3
"""WAL written per operation, by table and by kind of record (`make bench-wal`).

Runs inside tests/scripts/with-service.sh (a real service, the mock provider, a fresh database
and an account: ORDERPAY_URL, ORDERPAY_KEY). For each operation (a new order, a payment, a
refund, an authorization and its capture) it runs WAL_OPS of them one after another, and reads
the WAL written meanwhile with pg_walinspect, keeping only the records of this database's
relations (other databases on the same server write WAL too): the bytes per operation, split by
relation and by record type, full-page images apart. Commit records carry no relation and are
counted apart, as transactions per operation.

The WAL an operation writes is what group commit has to flush; fewer and smaller records per
operation is the lever on write throughput when the server waits on WALWrite.
"""

import collections
import json
import os
import subprocess
import sys
import urllib.request
import uuid

URL = os.environ["ORDERPAY_URL"]
KEY = os.environ["ORDERPAY_KEY"]
DB_URL = os.environ["DATABASE_URL"]
OPS = int(os.environ.get("WAL_OPS", "200"))
# How many relations and record types each operation lists (WAL_TOP=40 shows the small ones).
TOP = int(os.environ.get("WAL_TOP", "12"))
# With WAL_JSON=path, the figures are also written there as JSON (bench/run.py's WAL stage).
JSON_OUT = os.environ.get("WAL_JSON")


def psql(sql):
    result = subprocess.run(["psql", DB_URL, "-qAtX", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                            check=True, capture_output=True, text=True)
    return [line.split("\t") for line in result.stdout.splitlines() if line]


def call(method, path, body=None, key=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(URL + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {KEY}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Idempotency-Key", key)
    with urllib.request.urlopen(request) as response:
        return response.status, json.loads(response.read() or b"null")


def new_order():
    body = {"currency": "USD", "items": [{"sku": "mug", "quantity": 2, "unit_price": "12.50"}]}
    status, order = call("POST", "/orders", body, key=str(uuid.uuid4()))
    assert status == 201, (status, order)
    return order["id"]


def pay(order_id, capture_method="automatic"):
    body = {"order_id": order_id, "payment_method": "pm_card_ok", "capture_method": capture_method}
    status, payment = call("POST", "/payments", body, key=str(uuid.uuid4()))
    assert status == 201, (status, payment)
    return payment["id"]


def refund(payment_id):
    status, body = call("POST", "/refunds", {"payment_id": payment_id, "amount": "5.00"}, key=str(uuid.uuid4()))
    assert status == 201, (status, body)


def capture(payment_id):
    status, body = call("POST", f"/payments/{payment_id}/capture", None, key=str(uuid.uuid4()))
    assert status == 200, (status, body)


def measure(name, prepare, operation):
    """Runs `prepare` OPS times (not measured), then `operation` on each prepared value."""
    prepared = [prepare() for _ in range(OPS)]
    psql("CHECKPOINT")  # every later first touch of a page writes a full-page image, as in steady state after a checkpoint
    start = psql("SELECT pg_current_wal_insert_lsn()")[0][0]
    for value in prepared:
        operation(value)
    end = psql("SELECT pg_current_wal_insert_lsn()")[0][0]
    database = psql("SELECT oid FROM pg_database WHERE datname = current_database()")[0][0]
    rows = psql(f"""
        SELECT resource_manager, record_type, record_length, fpi_length, coalesce(block_ref, '')
        FROM pg_get_wal_records_info('{start}', '{end}')""")
    names = dict(psql("SELECT pg_relation_filenode(oid)::text, relname FROM pg_class WHERE pg_relation_filenode(oid) IS NOT NULL"))
    by_relation = collections.Counter()
    fpi_by_relation = collections.Counter()
    by_record = collections.Counter()
    bytes_by_record = collections.Counter()
    fpi = total = commits = 0
    for manager, record, length, fpi_length, block_ref in rows:
        if manager == "Transaction" and record.startswith("COMMIT"):
            commits += 1
        marker = f"/{database}/"
        if marker not in block_ref:
            continue
        filenode = block_ref.split(marker, 1)[1].split()[0].split(",")[0]
        relation = names.get(filenode, filenode)
        length, fpi_length = int(length), int(fpi_length)
        total += length
        fpi += fpi_length
        by_relation[relation] += length
        fpi_by_relation[relation] += fpi_length
        by_record[f"{manager}/{record}"] += 1
        # What the record itself costs, its full-page image apart: the part a change of the
        # statements can cut (the images follow from which pages a checkpoint left clean).
        bytes_by_record[f"{manager}/{record}"] += length - fpi_length
    print(f"\n{name}: {total / OPS:.0f} bytes of WAL per operation ({fpi / OPS:.0f} of them full-page images), "
          f"{commits / OPS:.2f} commits per operation (server-wide)")
    for relation, length in by_relation.most_common(TOP):
        print(f"  {relation:40} {length / OPS:8.0f} bytes ({fpi_by_relation[relation] / OPS:.0f} in images)")
    for record, count in by_record.most_common(TOP):
        print(f"  {record:40} {count / OPS:8.2f} records {bytes_by_record[record] / OPS:8.0f} bytes without images")
    return {"bytes": total / OPS, "fpi": fpi / OPS, "commits": commits / OPS,
            "relations": [[relation, length / OPS, fpi_by_relation[relation] / OPS]
                          for relation, length in by_relation.most_common(TOP)],
            "records": [[record, count / OPS, bytes_by_record[record] / OPS]
                        for record, count in by_record.most_common(TOP)]}


def main():
    psql("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    results = {
        "new order": measure("new order", lambda: None, lambda _: new_order()),
        "payment": measure("payment (pm_card_ok)", new_order, pay),
        "refund": measure("refund (partial)", lambda: pay(new_order()), refund),
        "authorize + capture": measure("authorize + capture", new_order,
                                       lambda order_id: capture(pay(order_id, "manual"))),
    }
    print("\n| operation | WAL bytes per operation | vs a new order |\n|---|---|---|")
    for name, figures in results.items():
        print(f"| {name} | {figures['bytes']:.0f} | {figures['bytes'] / results['new order']['bytes']:.2f} |")
    if JSON_OUT:
        with open(JSON_OUT, "w") as out:
            json.dump({"ops": OPS, "operations": results}, out)


if __name__ == "__main__":
    sys.exit(main())
