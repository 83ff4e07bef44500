#!/usr/bin/env python3
"""The benchmark harness behind `make bench` (issue 5).

Starts a release orderpay and the mock provider against a fresh PostgreSQL database on this
machine, then measures with wrk (a fresh Idempotency-Key per request) and pgbench:

  1. POST /orders with fresh keys, at 16 and 64 connections
  2. the same with 20% of requests repeating a recent key
  3. replays of completed keys
  4. POST /payments with pm_card_ok and zero provider latency
  5. the ceiling: pgbench running the SQL the service runs for one new order (the same
     statement, generated from src/idempotency/claim_key.sql and src/orders/new_order.sql), and the naive five-statement
     transaction for comparison, same client counts, same run
  6. growth: new orders with 5 million rows already in the idempotency table, and while the
     sweeper deletes 1 million expired rows

Every figure is the median of BENCH_RUNS runs (default 3) of BENCH_DURATION seconds (default 15)
after a warm-up. After each order run it checks the database: one order per distinct key.
Prints one table and writes it to bench/results.md. BENCH_QUICK=1: one 5-second run each, no
growth scenarios (for iterating, not for quoting).
"""

import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
BIN = Path(os.environ.get("ORDERPAY_BIN", ROOT / "target" / "release" / "orderpay"))
SERVER = os.environ.get("PG_SERVER_URL", "postgres://postgres@127.0.0.1:5432")
DB = "orderpay_bench"
DB_URL = f"{SERVER}/{DB}"
QUICK = os.environ.get("BENCH_QUICK") == "1"
RUNS = 1 if QUICK else int(os.environ.get("BENCH_RUNS", "3"))
DURATION = 5 if QUICK else int(os.environ.get("BENCH_DURATION", "15"))
WARMUP = 2 if QUICK else 5
WRK_THREADS = 2


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def psql(sql, db=DB):
    result = subprocess.run(["psql", f"{SERVER}/{db}", "-qAtX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                            check=True, capture_output=True, text=True)
    return result.stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


class Service:
    """The mock provider and `orderpay serve` (release build), as subprocesses."""

    def __init__(self, extra_env=None):
        self.port, self.mock_port = free_port(), free_port()
        env = dict(os.environ,
                   DATABASE_URL=DB_URL,
                   ORDERPAY_LISTEN=f"127.0.0.1:{self.port}",
                   MOCK_PROVIDER_LISTEN=f"127.0.0.1:{self.mock_port}",
                   ORDERPAY_PROVIDER_URL=f"http://127.0.0.1:{self.mock_port}",
                   # One account sends all the load here: no per-account limit.
                   ORDERPAY_RATE_LIMIT_PER_SEC="0",
                   RUST_LOG="warn")
        env.update(extra_env or {})
        self.mock = subprocess.Popen([BIN, "mock-provider"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.serve = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_http(f"{self.url}/readyz")
        wait_http(f"http://127.0.0.1:{self.mock_port}/_admin/faults")

    def peak_rss_mib(self):
        status = Path(f"/proc/{self.serve.pid}/status").read_text()
        kib = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
        return kib / 1024

    def stop(self):
        for process in (self.serve, self.mock):
            process.terminate()
        for process in (self.serve, self.mock):
            process.wait(timeout=40)


def wrk(service, script, connections, env, duration):
    command = ["wrk", f"-t{WRK_THREADS}", f"-c{connections}", f"-d{duration}s", "--latency", "-s",
               str(BENCH / script), service.url]
    full_env = dict(os.environ, WRK_THREADS=str(WRK_THREADS), **env)
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=full_env).stdout
    result = json.loads(re.search(r"WRK_RESULT (\{.*\})", out).group(1))
    seconds = result["duration_us"] / 1e6
    return {"rps": result["requests"] / seconds, "p50": result["p50_us"] / 1000,
            "p99": result["p99_us"] / 1000, "errors": result["errors"], "requests": result["requests"]}


def pgbench(script, clients, duration, account_id):
    with tempfile.TemporaryDirectory() as logs:
        command = ["pgbench", "-n", "-M", "prepared", "-f", str(script), "-c", str(clients),
                   "-j", "2", "-T", str(duration), "-D", f"account_id={account_id}",
                   "--log", "--log-prefix", f"{logs}/tx", DB_URL]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
        failed = int(m.group(1)) if (m := re.search(r"number of failed transactions: (\d+)", out)) else 0
        latencies = sorted(int(line.split()[2]) for path in Path(logs).iterdir()
                           for line in path.read_text().splitlines())
    return {"rps": tps, "p50": latencies[len(latencies) // 2] / 1000,
            "p99": latencies[int(len(latencies) * 0.99)] / 1000, "errors": failed,
            "requests": len(latencies)}


def median_of(runs):
    return {name: statistics.median(run[name] for run in runs) for name in ("rps", "p50", "p99")} | {
        "errors": sum(run["errors"] for run in runs), "runs": len(runs)}


def check_one_order_per_key():
    """One snapshot: every /orders key has its order and every order (but the payment preload)
    has its key, so orders == distinct keys."""
    keys, orders, keys_without_order, orders_without_key = psql(
        "SELECT (SELECT count(*) FROM idempotency_keys WHERE route = '/orders'), "
        "(SELECT count(*) FROM orders WHERE customer_id IS DISTINCT FROM 'bench-preload'), "
        "(SELECT count(*) FROM idempotency_keys k WHERE route = '/orders' AND NOT EXISTS "
        "  (SELECT 1 FROM orders o WHERE o.account_id = k.account_id AND o.id = k.resource_id)), "
        "(SELECT count(*) FROM orders o WHERE customer_id IS DISTINCT FROM 'bench-preload' AND NOT EXISTS "
        "  (SELECT 1 FROM idempotency_keys k WHERE k.account_id = o.account_id AND k.resource_id = o.id))"
    ).split("|")
    if keys != orders or keys_without_order != "0" or orders_without_key != "0":
        raise SystemExit(f"DATABASE CHECK FAILED: {keys} keys, {orders} orders, {keys_without_order} keys "
                         f"without an order, {orders_without_key} orders without a key")
    return int(keys)


def measure(label, run_once, check=False):
    log(f"{label}: warm-up")
    run_once(WARMUP)
    runs = []
    for index in range(RUNS):
        runs.append(run_once(DURATION))
        log(f"{label}: run {index + 1}/{RUNS}: {runs[-1]['rps']:.0f}/s p50 {runs[-1]['p50']:.2f} ms "
            f"p99 {runs[-1]['p99']:.2f} ms errors {runs[-1]['errors']}")
        if check:
            log(f"  database check: {check_one_order_per_key()} keys, one order each")
    return {"label": label} | median_of(runs)


def service_order_script():
    """The pgbench script of the service's own new-order statement: the key claim
    (src/idempotency/claim_key.sql) and src/orders/new_order.sql, as the service concatenates
    them, with each $n bound to a per-transaction value of the same type."""
    sql = (ROOT / "src" / "idempotency" / "claim_key.sql").read_text() + \
        (ROOT / "src" / "orders" / "new_order.sql").read_text()
    sql = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    oid = "md5('o' || :client_id::text || '-' || :n::text)::uuid"
    values = {
        1: ":account_id::uuid",
        2: "'svc-' || :client_id::text || '-' || :n::text",
        3: "'POST'", 4: "'/orders'", 5: "sha256(:n::text::bytea)",
        6: "'order'", 7: oid, 8: "201::smallint",
        9: "'[[\"content-type\",\"application/json\"],[\"location\",\"/orders/x\"]]'::jsonb",
        10: "convert_to(repeat('x', 420), 'UTF8')",
        11: "now()", 12: "now() + interval '1 day'",
        13: "'USD'", 14: "48.48", 15: "NULL::text", 16: "'{}'::jsonb",
        17: "ARRAY['tee-black-m', 'mug']", 18: "ARRAY[2, 1]", 19: "ARRAY[19.99, 8.50]",
        20: "ARRAY[39.98, 8.50]",
    }
    used = {int(n) for n in re.findall(r"\$(\d+)", sql)}
    if used != set(values):
        raise SystemExit(f"new_order.sql takes parameters {sorted(used)}; update bench/run.py's mapping")
    sql = re.sub(r"\$(\d+)", lambda m: f"({values[int(m.group(1))]})", sql)
    script = Path(tempfile.mkstemp(suffix=".sql")[1])
    script.write_text("\\set n random(1, 9000000000000)\n" + " ".join(sql.split()) + ";\n")
    return script


def table(rows, ceiling16, ceiling64, naive, rss, machine):
    lines = [
        f"orderpay benchmark, {datetime.date.today()}, {machine}; medians of {RUNS} runs of "
        f"{DURATION} s; service and load generators on the same machine.",
        "",
        "| scenario | conns | req/s | p50 ms | p99 ms | errors | vs ceiling | vs naive |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ceiling = ceiling16 if row["conns"] == 16 else ceiling64
        ratio = f"{row['rps'] / ceiling:.2f}" if ceiling and row.get("compare", True) else ""
        versus_naive = f"{row['rps'] / naive[row['conns']]:.2f}" if row.get("naive") and naive.get(row["conns"]) else ""
        lines.append(f"| {row['label']} | {row['conns']} | {row['rps']:.0f} | {row['p50']:.2f} | "
                     f"{row['p99']:.2f} | {row['errors']} | {ratio} | {versus_naive} |")
    lines += ["", f"Service peak RSS: {rss:.1f} MiB.", "", "Targets (issue 5):", ""]
    by = {(row["label"], row["conns"]): row["rps"] for row in rows}
    p99 = {(row["label"], row["conns"]): row["p99"] for row in rows}
    fresh16, fresh64 = by.get(("new orders, fresh keys", 16)), by.get(("new orders, fresh keys", 64))

    def target(name, value, goal, ok):
        lines.append(f"- {name}: {value} (target {goal}): {'met' if ok else 'NOT met'}")

    if fresh16 and ceiling16:
        target("new orders / ceiling at 16", f"{fresh16 / ceiling16:.2f}", ">= 0.85", fresh16 / ceiling16 >= 0.85)
    if fresh64 and ceiling64:
        target("new orders / ceiling at 64", f"{fresh64 / ceiling64:.2f}", ">= 0.85", fresh64 / ceiling64 >= 0.85)
    for conns, fresh in ((16, fresh16), (64, fresh64)):
        if fresh and naive.get(conns):
            target(f"new orders / naive pgbench at {conns}", f"{fresh / naive[conns]:.2f}", ">= 1",
                   fresh >= naive[conns])
        dup = by.get(("new orders, 20% duplicate keys", conns))
        if fresh and dup:
            target(f"20% duplicates / fresh keys at {conns}", f"{dup / fresh:.2f}", ">= 0.90", dup / fresh >= 0.9)
    replays, payments = by.get(("replays of completed keys", 16)), by.get(("payments, pm_card_ok, zero provider latency", 16))
    if fresh16 and replays:
        target("replays / new orders", f"{replays / fresh16:.1f}", ">= 3", replays / fresh16 >= 3)
    if fresh16 and payments:
        target("payments / new orders", f"{payments / fresh16:.2f}", ">= 0.7", payments / fresh16 >= 0.7)
    if ("new orders, fresh keys", 16) in p99:
        value = p99[("new orders, fresh keys", 16)]
        target("p99 of new orders at 16", f"{value:.1f} ms", "< 30 ms", value < 30)
    target("peak RSS", f"{rss:.1f} MiB", "< 64 MiB", rss < 64)
    grown, sweeping = by.get(("new orders, 5M keys in the table", 16)), by.get(("new orders while the sweeper deletes 1M rows", 16))
    if fresh16 and grown:
        target("5M keys / empty table", f"{grown / fresh16:.2f}", ">= 0.90", grown / fresh16 >= 0.9)
    if grown and sweeping:
        target("sweeping 1M rows / 5M keys idle", f"{sweeping / grown:.2f}", ">= 0.90", sweeping / grown >= 0.9)
    return "\n".join(lines)


def main():
    for tool in ("wrk", "pgbench", "psql"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed: apt-get install wrk postgresql-client")
    if not BIN.exists():
        raise SystemExit(f"{BIN} is missing: cargo build --release --bin orderpay")
    cores = os.cpu_count()
    memory = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) / 1024 / 1024
    machine = f"{cores} cores, {memory:.0f} GiB, {platform.system()} {platform.machine()}, PostgreSQL " \
              f"{psql('SHOW server_version', 'postgres').split()[0]}"
    log(f"machine: {machine}")

    psql(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)', "postgres")
    key = subprocess.run([BIN, "accounts", "create", "bench"], env=dict(os.environ, DATABASE_URL=DB_URL),
                         check=True, capture_output=True, text=True).stdout.strip()
    account_id = psql("SELECT id FROM accounts WHERE name = 'bench'")
    env = {"ORDERPAY_KEY": key}
    service = Service()
    rows = []
    try:
        service_script = service_order_script()
        log("pre-warm: 20 s of new orders (WAL segments, caches, pools)")
        wrk(service, "orders.lua", 16, env, 5 if QUICK else 20)
        ceilings, naive = {}, {}
        for conns in (16, 64):
            # The service and its ceiling alternate run by run, so that both meet the same machine.
            label, ceiling_label = "new orders, fresh keys", "pgbench: the service's new-order SQL"
            log(f"{label} / {ceiling_label} at {conns}: warm-up")
            wrk(service, "orders.lua", conns, env, WARMUP)
            pgbench(service_script, conns, WARMUP, account_id)
            service_runs, ceiling_runs = [], []
            for index in range(RUNS):
                service_runs.append(wrk(service, "orders.lua", conns, env, DURATION))
                log(f"  check: {check_one_order_per_key()} keys, one order each")
                ceiling_runs.append(pgbench(service_script, conns, DURATION, account_id))
                log(f"{label} at {conns}, run {index + 1}/{RUNS}: service {service_runs[-1]['rps']:.0f}/s "
                    f"(p99 {service_runs[-1]['p99']:.1f} ms), pgbench {ceiling_runs[-1]['rps']:.0f}/s")
            rows.append({"label": label} | median_of(service_runs) | {"conns": conns, "naive": True})
            ceiling = {"label": ceiling_label} | median_of(ceiling_runs)
            ceilings[conns] = ceiling["rps"]
            rows.append(ceiling | {"conns": conns, "compare": False})
        for conns in (16, 64):
            rows.append(measure("new orders, 20% duplicate keys",
                                lambda d, c=conns: wrk(service, "orders.lua", c, env | {"DUP_RATE": "0.2"}, d),
                                check=True) | {"conns": conns})

        log("replays: creating 1000 completed keys")
        body = b'{"currency":"USD","items":[{"sku":"tee-black-m","quantity":2,"unit_price":"19.99"},' \
               b'{"sku":"mug","quantity":1,"unit_price":"8.50"}]}'
        for n in range(1, 1001):
            request = urllib.request.Request(f"{service.url}/orders", data=body, method="POST", headers={
                "Authorization": f"Bearer {key}", "Content-Type": "application/json",
                "Idempotency-Key": f"replay-{n}"})
            urllib.request.urlopen(request).read()
        rows.append(measure("replays of completed keys",
                            lambda d: wrk(service, "orders.lua", 16, env | {"REPLAY_KEYS": "1000"}, d))
                    | {"conns": 16, "compare": False})

        payments_needed = 400_000 if not QUICK else 60_000
        log(f"payments: preloading {payments_needed} orders")
        psql(f"INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata, "
             f"created_at, updated_at) SELECT '{account_id}', gen_random_uuid(), 'pending_payment', 'USD', "
             f"48.48, 'bench-preload', '{{}}', now(), now() FROM generate_series(1, {payments_needed})")
        ids = psql("SELECT id FROM orders WHERE customer_id = 'bench-preload' ORDER BY random()")
        order_ids = Path(tempfile.mkstemp(suffix=".txt")[1])
        order_ids.write_text(ids + "\n")
        rows.append(measure("payments, pm_card_ok, zero provider latency",
                            lambda d: wrk(service, "payments.lua", 16, env | {"ORDER_IDS": str(order_ids)}, d))
                    | {"conns": 16})
        rss = service.peak_rss_mib()

        for conns in (16, 64):
            result = measure("pgbench: naive 5-statement transaction",
                             lambda d, c=conns: pgbench(BENCH / "pgbench" / "naive_order.sql", c, d, account_id))
            naive[conns] = result["rps"]
            rows.append(result | {"conns": conns, "compare": False})

        if not QUICK:
            log("growth: inserting 5 million idempotency keys")
            psql(f"INSERT INTO idempotency_keys (account_id, key, method, route, fingerprint, "
                 f"resource_kind, resource_id, response_status, response_headers, response_body, created_at, "
                 f"expires_at) SELECT '{account_id}', 'old-' || n, 'POST', '/old', sha256(n::text::bytea), "
                 f"'order', md5(n::text)::uuid, 201, '[]', convert_to(repeat('x', 420), 'UTF8'), now(), "
                 f"now() + interval '1 day' FROM generate_series(1, 5000000) n")
            psql("VACUUM ANALYZE idempotency_keys")
            rows.append(measure("new orders, 5M keys in the table",
                                lambda d: wrk(service, "orders.lua", 16, env, d), check=False)
                        | {"conns": 16, "naive": True})
            service.stop()
            log("sweeper: 1 million expired keys, sweeper every 200 ms")
            psql(f"UPDATE idempotency_keys SET expires_at = now() - interval '1 minute' WHERE key IN "
                 f"(SELECT key FROM idempotency_keys WHERE route = '/old' LIMIT 1000000)")
            psql("VACUUM ANALYZE idempotency_keys")
            service = Service({"ORDERPAY_SWEEP_INTERVAL_MS": "200"})
            before = int(psql("SELECT count(*) FROM idempotency_keys WHERE expires_at < now()"))
            rows.append(measure("new orders while the sweeper deletes 1M rows",
                                lambda d: wrk(service, "orders.lua", 16, env, d)) | {"conns": 16, "naive": True})
            after = int(psql("SELECT count(*) FROM idempotency_keys WHERE expires_at < now()"))
            log(f"sweeper deleted {before - after} of {before} expired rows during the measurement")
            rss = max(rss, service.peak_rss_mib())
    finally:
        service.stop()

    # The raw figures first, so that a report problem never loses a 15-minute run.
    (BENCH / "last-run.json").write_text(json.dumps({"rows": rows, "ceilings": ceilings, "naive": naive,
                                                      "rss": rss, "machine": machine}, indent=1))
    report = table(rows, ceilings.get(16), ceilings.get(64), naive, rss, machine)
    print("\n" + report)
    if not QUICK:
        (BENCH / "results.md").write_text(report + "\n")
        log("written to bench/results.md")


def report_only():
    """`bench/run.py --report`: the table of the last run again, from bench/last-run.json."""
    data = json.loads((BENCH / "last-run.json").read_text())
    naive = {int(conns): rps for conns, rps in data["naive"].items()}
    ceilings = {int(conns): rps for conns, rps in data["ceilings"].items()}
    print(table(data["rows"], ceilings.get(16), ceilings.get(64), naive, data["rss"], data["machine"]))


if __name__ == "__main__":
    sys.exit(report_only() if sys.argv[1:] == ["--report"] else main())
