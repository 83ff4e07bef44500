#!/usr/bin/env python3
"""The benchmark harness behind `make bench` and `make bench-quick`.

Starts a private PostgreSQL cluster with the settings of bench/postgresql.conf (BENCH_CLUSTER=
shared uses the machine's server instead), a release `orderpay serve` and `orderpay
mock-provider` against a fresh database on it, and measures through the real HTTP service with
wrk (a fresh Idempotency-Key per request) and with pgbench. Stages, in order (BENCH_STAGES=a,b
picks some; `orders` is the baseline most targets divide by):

  orders       new orders at 16 and 64 connections, alternated run by run with pgbench running
               the service's own new-order statement (its ceiling), and at 16 with the physical
               limit (bench/pgbench/physical_limit.sql: the SQL work of an order on bare tables)
  duplicates   20% of requests repeat a recent key, at 16 and 64
  replays      replays of 1,000 completed keys
  payments     POST /payments, pm_card_ok, zero provider latency, on preloaded orders, at 16 and
               64, alternated run by run with pgbench running the payment's own statements in
               their order (its ceiling: PaymentCeiling)
  refunds      partial refunds (1.00) of the payments the previous stage made, at 16 and 64,
               alternated run by run with pgbench running the refund's own statements in their
               order (RefundCeiling)
  capture      authorize (capture_method manual) then capture, as pairs per second, at 16 and
               64, alternated run by run with pgbench running the pair's own statements in their
               order (CaptureCeiling)
  naive        pgbench: the naive five-statement transaction, at 16 and 64
  connections  new orders and payments at 1, 4, 16, 64 and 256 connections
  idle         1,000 keep-alive connections held open: the service's RSS
  relays       new orders with the outbox relays attached (a webhook endpoint on a local
               receiver, and NATS JetStream) against without, alternated; the outbox lag sampled
               every 250 ms; a backlog built with the relays off, drained with them on
  wal          bench/wal.py: WAL bytes per operation by table and record (pg_walinspect)
  settings     new orders and payments on the shared server's defaults against the private
               tuned cluster, alternated run by run (private cluster only)
  growth       new orders with 5 million keys and orders in the tables, payments with 1 million
               payments
  sweeper      new orders while the sweeper deletes 1 million expired keys (full mode only)

After every order run the database is checked (one order per key); after payment, capture and
refund runs the mock provider is checked against the database (one succeeded charge per paid
order, as many refunds at the provider as in the database). Per scenario: medians of BENCH_RUNS
runs (3) of BENCH_DURATION seconds (15) after a warm-up, the service's peak RSS (VmHWM, reset
before each scenario), and the CPU of the service, PostgreSQL and the load generator.

Writes bench/last-run.json (raw figures), bench/results.md and the charts (PNG, matplotlib from
.venv/bench) next to it. BENCH_QUICK=1: one 5-second run each, scaled-down backlog and growth,
no sweeper, written to bench/quick/ (never over the committed results). `bench/run.py --report
[FILE.json]` renders the table and charts again from the raw figures.

Settings (environment): BENCH_QUICK, BENCH_RUNS, BENCH_DURATION, BENCH_STAGES, BENCH_CLUSTER
(private | shared), BENCH_PG_SETTINGS (name=value,... over bench/postgresql.conf, for A/B runs of
one setting), BENCH_PG_STATEMENTS=1 (pg_stat_statements: each scenario's top statements),
BENCH_GROWTH_KEYS, BENCH_GROWTH_PAYMENTS, BENCH_BACKLOG_EVENTS, BENCH_NATS_URL, BENCH_OUT (where the
results go), ORDERPAY_BIN, PG_SERVER_URL (the shared server), PG_BIN_DIR (initdb and postgres).
"""

import base64
import datetime
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import pg  # noqa: E402
import report  # noqa: E402
from natsutil import Nats, NatsError  # noqa: E402

ROOT = BENCH.parent
BIN = Path(os.environ.get("ORDERPAY_BIN", ROOT / "target" / "release" / "orderpay"))
SHARED_SERVER = os.environ.get("PG_SERVER_URL", "postgres://postgres@127.0.0.1:5432")
QUICK = os.environ.get("BENCH_QUICK") == "1"
RUNS = 1 if QUICK else int(os.environ.get("BENCH_RUNS", "3"))
DURATION = 5 if QUICK else int(os.environ.get("BENCH_DURATION", "15"))
WARMUP = 2 if QUICK else 5
SWEEP_DURATION = 3 if QUICK else 10
CLUSTER = os.environ.get("BENCH_CLUSTER", "private")
# Where results.md, last-run.json and the charts go (BENCH_OUT overrides, e.g. for a trial).
OUT = Path(os.environ["BENCH_OUT"]) if os.environ.get("BENCH_OUT") else BENCH / "quick" if QUICK else BENCH
GROWTH_KEYS = int(os.environ.get("BENCH_GROWTH_KEYS", "100000" if QUICK else "5000000"))
GROWTH_PAYMENTS = int(os.environ.get("BENCH_GROWTH_PAYMENTS", "20000" if QUICK else "1000000"))
BACKLOG_EVENTS = int(os.environ.get("BENCH_BACKLOG_EVENTS", "5000" if QUICK else "50000"))
SWEEP_CONNECTIONS = (1, 4, 16, 64, 256)
IDLE_CONNECTIONS = 1000
NATS_URL = os.environ.get("BENCH_NATS_URL", "nats://127.0.0.1:4222")
LAG_SAMPLE_MS = 250
# How long the relays stage waits for the webhook deliveries to be delivered after a run.
DELIVERY_WAIT_S = int(os.environ.get("BENCH_DELIVERY_WAIT_S", "300" if QUICK else "600"))
WRK_THREADS = 2
# BENCH_PG_STATEMENTS=1: pg_stat_statements in the private cluster, and each scenario's top
# statements in results.md (where PostgreSQL's time goes; a little overhead on every statement).
STATEMENTS = os.environ.get("BENCH_PG_STATEMENTS") == "1"
ALL_STAGES = ["orders", "duplicates", "replays", "payments", "refunds", "capture", "naive", "connections",
              "idle", "relays", "wal", "settings", "growth", "sweeper"]
DB = "orderpay_bench"
ORDER_BODY = (b'{"currency":"USD","items":[{"sku":"tee-black-m","quantity":2,"unit_price":"19.99"},'
              b'{"sku":"mug","quantity":1,"unit_price":"8.50"}]}')
CLK_TCK = os.sysconf("SC_CLK_TCK")
STARTED = time.time()


def log(message):
    elapsed = time.time() - STARTED
    print(f"[bench {elapsed / 60:5.1f} min] {message}", flush=True)


# --- processes and their CPU ---------------------------------------------------------------

def proc_ticks(pid, children=False):
    """utime + stime of a process (plus its reaped children's with children=True), in ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def cluster_ticks(postmaster):
    """Every process of a PostgreSQL cluster: the postmaster with its reaped children, and its
    live children (backends, walwriter, checkpointer, ...)."""
    total = proc_ticks(postmaster, children=True)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(stat[1]) == postmaster:
                total += int(stat[11]) + int(stat[12])
    return total


def machine_busy_ticks():
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle


class CpuMeter:
    """CPU used over a window by the service, PostgreSQL, the load generator (the harness's
    reaped children: wrk, pgbench), the webhook receiver and everything else on the machine,
    each in percent of one core."""

    def __init__(self, bench, service=None):
        self.bench, self.service = bench, service

    def snapshot(self):
        snap = {"at": time.time(), "machine": machine_busy_ticks()}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        snap["load"] = (children.ru_utime + children.ru_stime) * CLK_TCK
        if self.service:
            snap["service"] = proc_ticks(self.service.serve.pid)
            snap["mock"] = proc_ticks(self.service.mock.process.pid)
        postmaster = self.bench.postmaster_pid()
        if postmaster:
            snap["postgres"] = cluster_ticks(postmaster)
        receiver = self.bench.receiver
        if receiver:
            snap["receiver"] = proc_ticks(receiver.process.pid)
        return snap

    @staticmethod
    def delta(before, after):
        seconds = after["at"] - before["at"]
        out = {}
        for name in ("service", "mock", "postgres", "load", "receiver"):
            if name in before and name in after:
                out[name] = 100 * (after[name] - before[name]) / CLK_TCK / seconds
        machine = 100 * (after["machine"] - before["machine"]) / CLK_TCK / seconds
        out["other"] = max(0.0, machine - sum(out.values()))
        out["machine"] = machine
        return out


def wait_http(url, seconds=60, process=None):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def http(method, url, body=None, headers=None, timeout=30):
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if isinstance(body, (dict, list)):
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Mock:
    """`orderpay mock-provider`: its ledger is in memory, so the payments and the refunds of one
    database go through one mock for the whole run."""

    def __init__(self):
        self.port = pg.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, MOCK_PROVIDER_LISTEN=f"127.0.0.1:{self.port}", RUST_LOG="warn")
        self.process = subprocess.Popen([BIN, "mock-provider"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        wait_http(f"{self.url}/_admin/faults", process=self.process)

    def get(self, path):
        status, body = http("GET", self.url + path, timeout=300)
        if status != 200:
            raise SystemExit(f"mock {path}: {status}")
        return json.loads(body)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


class Service:
    """`orderpay serve` (release build) against `db_url`, paying through `mock`."""

    def __init__(self, db_url, mock, extra_env=None):
        self.port, self.mock = pg.free_port(), mock
        self.db_url = db_url
        env = dict(os.environ,
                   DATABASE_URL=db_url,
                   ORDERPAY_LISTEN=f"127.0.0.1:{self.port}",
                   ORDERPAY_PROVIDER_URL=mock.url,
                   # One account sends all the load here: no per-account limit.
                   ORDERPAY_RATE_LIMIT_PER_SEC="0",
                   RUST_LOG="warn")
        for name in ("ORDERPAY_NATS_URL", "ORDERPAY_ENCRYPTION_KEY"):
            env.pop(name, None)  # relays only where a scenario attaches them
        env.update(extra_env or {})
        self.started_at = time.time()
        self.log = tempfile.NamedTemporaryFile(prefix="orderpay-bench-serve-", suffix=".log", delete=False)
        self.serve = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_http(f"{self.url}/readyz", process=self.serve)

    def status_kib(self, field):
        status = Path(f"/proc/{self.serve.pid}/status").read_text()
        return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1))

    def reset_peak(self):
        # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS.
        try:
            Path(f"/proc/{self.serve.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def peak_rss_mib(self):
        return self.status_kib("VmHWM") / 1024

    def rss_mib(self):
        return self.status_kib("VmRSS") / 1024

    def log_tail(self, lines=20):
        try:
            return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        if self.serve.poll() is None:
            self.serve.terminate()
            try:
                self.serve.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.serve.kill()
                self.serve.wait()
        self.log.close()
        os.unlink(self.log.name)


class Receiver:
    """bench/receiver.py as a process of its own, so that its CPU is counted apart."""

    def __init__(self):
        self.port = pg.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, str(BENCH / "receiver.py"), str(self.port)],
                                        stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit("the webhook receiver did not start")

    def stats(self):
        return json.loads(http("GET", f"{self.url}/stats")[1])

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)


class IdList:
    """A file of ids (orders to pay, payments to refund) and how far the runs got: each wrk run
    starts after the highest line an earlier run used (the scripts report it), so that a measured
    run never meets an id its warm-up already used."""

    def __init__(self, path, count):
        self.path, self.count, self.offset = path, count, 0

    def env(self):
        if self.offset >= self.count - 64:
            raise SystemExit(f"{self.path}: {self.count:,} ids, {self.offset:,} used: too few preloaded")
        return {"ORDER_IDS": self.path, "PAYMENT_IDS": self.path, "ID_OFFSET": str(self.offset)}

    def advance(self, used_upto):
        self.offset = max(self.offset, used_upto + 1)


def median_of(runs):
    out = {name: statistics.median(run[name] for run in runs) for name in ("rps", "p50", "p99")}
    out["errors"] = sum(run["errors"] for run in runs)
    out["runs"] = len(runs)
    out["all_rps"] = [round(run["rps"], 1) for run in runs]
    rss = [run["rss"] for run in runs if run.get("rss") is not None]
    out["rss"] = max(rss) if rss else None
    cpus = [run["cpu"] for run in runs if run.get("cpu")]
    if cpus:
        out["cpu"] = {name: statistics.median(cpu[name] for cpu in cpus)
                      for name in cpus[0] if all(name in cpu for cpu in cpus)}
    if runs[-1].get("statements"):
        out["statements"] = runs[-1]["statements"]
    for extra in ("replayed", "pairs"):
        if any(extra in run for run in runs):
            out[extra] = sum(run.get(extra, 0) for run in runs)
    return out


class Bench:
    def __init__(self):
        self.data = {"rows": [], "not_run": {}, "checks": [], "stages": []}
        self.cluster = None
        self.mock = None
        self.service = None
        self.receiver = None
        self.extra_services = []
        self.nats_stream = None
        self.server = SHARED_SERVER
        self.temp_files = []

    # --- plumbing --------------------------------------------------------------------------

    def postmaster_pid(self):
        return self.cluster.postmaster_pid() if self.cluster else None

    def db_url(self, db=DB):
        return f"{self.server}/{db}"

    def sql(self, statement, db=DB):
        return pg.query(self.db_url(db), statement)

    def scalar(self, statement, db=DB):
        return pg.scalar(self.db_url(db), statement)

    def temp_file(self, text, suffix=".txt"):
        fd, name = tempfile.mkstemp(prefix="orderpay-bench-", suffix=suffix)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.temp_files.append(name)
        return name

    def statements(self, reset_only=False):
        """With BENCH_PG_STATEMENTS=1: the statements PostgreSQL spent most time on since the
        last call (pg_stat_statements, then reset)."""
        if not STATEMENTS:
            return None
        top = None
        if not reset_only:
            rows = self.sql("""
                SELECT round(total_exec_time::numeric, 1), calls, round((total_exec_time / greatest(calls, 1))::numeric, 3),
                    round((100 * total_exec_time / nullif(sum(total_exec_time) OVER (), 0))::numeric, 1),
                    shared_blks_hit + shared_blks_read, wal_bytes, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
                FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                ORDER BY total_exec_time DESC LIMIT 6""")
            top = [{"total_ms": float(r[0]), "calls": int(r[1]), "mean_ms": float(r[2]), "percent": float(r[3] or 0),
                    "blocks": int(r[4]), "wal_bytes": int(r[5]), "query": r[6]} for r in rows]
        self.sql("SELECT pg_stat_statements_reset()")
        return top

    def add_row(self, row_id, label, conns, result, **extra):
        row = {"id": row_id, "label": label, "conns": conns} | result | extra
        self.data["rows"] = [r for r in self.data["rows"] if r["id"] != row_id] + [row]
        return row

    def check(self, text):
        self.data["checks"].append(text)
        log(f"  check: {text}")

    def wrk(self, service, script, connections, env, duration, measure=True, ids=None):
        threads = min(WRK_THREADS, connections)
        if ids is not None:
            env = env | ids.env()
        command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--timeout", "10s", "--latency",
                   "-s", str(BENCH / script), service.url]
        full_env = dict(os.environ, WRK_THREADS=str(threads), BENCH_LUA_DIR=str(BENCH), **env)
        meter = CpuMeter(self, service)
        reset = service.reset_peak() if measure else False
        if measure:
            self.statements(reset_only=True)
        before = meter.snapshot()
        completed = subprocess.run(command, capture_output=True, text=True, env=full_env)
        after = meter.snapshot()
        statements = self.statements() if measure and service.db_url == self.db_url() else None
        match = re.search(r"WRK_RESULT (\{.*\})", completed.stdout)
        if completed.returncode != 0 or not match:
            raise SystemExit(f"wrk failed ({completed.returncode}):\n{completed.stdout}\n{completed.stderr}")
        result = json.loads(match.group(1))
        if ids is not None:
            ids.advance(result["used_upto"])
        seconds = result["duration_us"] / 1e6
        count = result["pairs"] if script == "capture.lua" else result["requests"]
        return {"rps": count / seconds, "p50": result["p50_us"] / 1000, "p99": result["p99_us"] / 1000,
                "errors": result["errors"], "requests": result["requests"], "replayed": result["replayed"],
                "pairs": result["pairs"], "timeouts": result["timeouts"], "seconds": seconds,
                "cpu": CpuMeter.delta(before, after), "statements": statements,
                "rss": service.peak_rss_mib() if reset else None}

    def pgbench(self, script, clients, duration, db=DB, account_id=None, defines=None):
        with tempfile.TemporaryDirectory() as logs:
            command = ["pgbench", "-n", "-M", "prepared", "-f", str(script), "-c", str(clients),
                       "-j", "2", "-T", str(duration), "-D", f"account_id={account_id or self.account_id}",
                       "--log", "--log-prefix", f"{logs}/tx", self.db_url(db)]
            for name, value in (defines or {}).items():
                command += ["-D", f"{name}={value}"]
            meter = CpuMeter(self)
            self.statements(reset_only=True)
            before = meter.snapshot()
            completed = subprocess.run(command, capture_output=True, text=True)
            after = meter.snapshot()
            statements = self.statements()
            if completed.returncode != 0:
                raise SystemExit(f"pgbench failed:\n{completed.stdout}\n{completed.stderr}")
            out = completed.stdout
            tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
            failed = int(m.group(1)) if (m := re.search(r"number of failed transactions: (\d+)", out)) else 0
            latencies = sorted(int(line.split()[2]) for path in Path(logs).iterdir()
                               for line in path.read_text().splitlines())
        return {"rps": tps, "p50": latencies[len(latencies) // 2] / 1000,
                "p99": latencies[int(len(latencies) * 0.99)] / 1000, "errors": failed,
                "requests": len(latencies), "cpu": CpuMeter.delta(before, after), "rss": None,
                "statements": statements}

    def measure(self, label, run_once, runs=RUNS, warmup=WARMUP, duration=DURATION, after_run=None):
        if warmup:
            run_once(warmup)
        results = []
        for index in range(runs):
            results.append(run_once(duration))
            r = results[-1]
            log(f"{label}: run {index + 1}/{runs}: {r['rps']:.0f}/s p50 {r['p50']:.2f} ms p99 {r['p99']:.2f} ms "
                f"errors {r['errors']}" + (f" rss {r['rss']:.1f} MiB" if r.get("rss") else ""))
            if after_run:
                after_run()
        return median_of(results)

    def alternate(self, runners, runs=RUNS, warmup=WARMUP, duration=DURATION):
        """runners: [(name, run_once, after_run or None)]; each runs in turn, run by run, so that
        all meet the same machine. Returns {name: median}."""
        for name, run_once, _ in runners:
            if warmup:
                run_once(warmup)
        results = {name: [] for name, _, _ in runners}
        for index in range(runs):
            for name, run_once, after_run in runners:
                results[name].append(run_once(duration))
                r = results[name][-1]
                log(f"{name}: run {index + 1}/{runs}: {r['rps']:.0f}/s p50 {r['p50']:.2f} ms p99 {r['p99']:.2f} ms "
                    f"errors {r['errors']}" + (f" rss {r['rss']:.1f} MiB" if r.get("rss") else ""))
                if after_run:
                    after_run()
        return {name: median_of(runs_) for name, runs_ in results.items()}

    # --- database preparation and checks ---------------------------------------------------

    def create_account(self, db):
        pg.query(f"{self.server}/postgres", f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        env = dict(os.environ, DATABASE_URL=self.db_url(db))
        # Only `serve` and `migrate` migrate; every other command refuses a database not migrated.
        subprocess.run([BIN, "migrate"], env=env, check=True, capture_output=True, text=True)
        key = subprocess.run([BIN, "accounts", "create", "bench"], env=env,
                             check=True, capture_output=True, text=True).stdout.strip()
        account_id = pg.scalar(self.db_url(db), "SELECT id FROM accounts WHERE name = 'bench'")
        return key, account_id

    def preload_orders(self, count, tag, db=DB):
        """`count` orders pending payment, each with the two items orders.lua sends, written by
        SQL (an order from the API has a key and an event too; paying it reads only the order and
        its items). Returns a file of their ids in random order."""
        account = pg.scalar(self.db_url(db), "SELECT id FROM accounts WHERE name = 'bench'")
        pg.query(self.db_url(db), f"""
            WITH o AS (
              INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata,
                  created_at, updated_at)
              SELECT '{account}', gen_random_uuid(), 'pending_payment', 'USD', 48.48, 'bench-preload-{tag}',
                  '{{}}', now(), now() FROM generate_series(1, {count})
              RETURNING id)
            INSERT INTO order_items (account_id, order_id, line_number, sku, quantity, unit_price, amount)
            SELECT '{account}', o.id, l.n, l.sku, l.q, l.p, l.a FROM o,
              (VALUES (0, 'tee-black-m', 2, 19.99, 39.98), (1, 'mug', 1, 8.50, 8.50)) AS l (n, sku, q, p, a)""")
        ids = pg.query(self.db_url(db), f"SELECT id FROM orders WHERE customer_id = 'bench-preload-{tag}' "
                                        "AND status = 'pending_payment' ORDER BY random()")
        return self.id_list(ids)

    def id_list(self, rows):
        return IdList(self.temp_file("\n".join(row[0] for row in rows) + "\n"), len(rows))

    def check_one_order_per_key(self, db=DB):
        """One snapshot: every /orders key has its order and every order (but the preloaded
        ones) has its key, so orders == distinct keys."""
        keys, orders, keys_without_order, orders_without_key = pg.query(self.db_url(db), """
            SELECT (SELECT count(*) FROM idempotency_keys WHERE route = '/orders'),
              (SELECT count(*) FROM orders WHERE coalesce(customer_id, '') NOT LIKE 'bench-preload%'),
              (SELECT count(*) FROM idempotency_keys k WHERE route = '/orders' AND NOT EXISTS
                (SELECT 1 FROM orders o WHERE o.account_id = k.account_id AND o.id = k.resource_id)),
              (SELECT count(*) FROM orders o WHERE coalesce(customer_id, '') NOT LIKE 'bench-preload%' AND NOT EXISTS
                (SELECT 1 FROM idempotency_keys k WHERE k.account_id = o.account_id AND k.resource_id = o.id))""")[0]
        if keys != orders or keys_without_order != "0" or orders_without_key != "0":
            raise SystemExit(f"DATABASE CHECK FAILED: {keys} keys, {orders} orders, {keys_without_order} keys "
                             f"without an order, {orders_without_key} orders without a key")
        return int(keys)

    def settle_wait(self, db=DB):
        """Requests in flight when wrk stops still finish (phase 2 runs in a task of its own):
        wait until no operation is processing."""
        deadline = time.time() + 30
        while time.time() < deadline:
            left = int(pg.scalar(self.db_url(db), """
                SELECT (SELECT count(*) FROM payments WHERE status = 'processing')
                     + (SELECT count(*) FROM refunds WHERE status = 'processing')
                     + (SELECT count(*) FROM payment_operations WHERE status = 'processing')"""))
            if left == 0:
                return
            time.sleep(0.2)
        raise SystemExit(f"CHECK FAILED: {left} operations still processing 30 s after the run")

    def check_charges(self, mock, db=DB, what="payments"):
        """The mock provider against the database: every charge names a payment (its reference);
        each succeeded payment has exactly one succeeded charge, each authorized one exactly one
        charge requiring capture; no order has two succeeded charges."""
        self.settle_wait(db)
        charges = mock.get("/_admin/charges")["data"]
        payments = {row[0]: (row[1], row[2]) for row in pg.query(self.db_url(db), """
            SELECT id, order_id, status FROM payments WHERE payment_method <> 'pm_bench_preload'""")}
        by_reference = {}
        for charge in charges:
            by_reference.setdefault(charge["reference"], []).append(charge["status"])
        stray = [ref for ref in by_reference if ref not in payments]
        if stray:
            raise SystemExit(f"PROVIDER CHECK FAILED: {len(stray)} charges name no payment, e.g. {stray[:3]}")
        succeeded_per_order = {}
        for payment_id, (order_id, status) in payments.items():
            statuses = by_reference.get(payment_id, [])
            if status in ("succeeded", "requires_capture"):
                if statuses != [status]:
                    raise SystemExit(f"PROVIDER CHECK FAILED: payment {payment_id} is {status} in the database, "
                                     f"charges at the provider: {statuses}")
            if "succeeded" in statuses:
                succeeded_per_order[order_id] = succeeded_per_order.get(order_id, 0) + statuses.count("succeeded")
        doubled = [order for order, count in succeeded_per_order.items() if count > 1]
        if doubled:
            raise SystemExit(f"PROVIDER CHECK FAILED: {len(doubled)} orders charged twice")
        paid = int(pg.scalar(self.db_url(db), """
            SELECT count(*) FROM orders o WHERE status IN ('paid', 'partially_refunded', 'refunded') AND NOT EXISTS
              (SELECT 1 FROM payments p WHERE p.account_id = o.account_id AND p.order_id = o.id
                 AND p.payment_method = 'pm_bench_preload')"""))
        if paid != len(succeeded_per_order):
            raise SystemExit(f"PROVIDER CHECK FAILED: {paid} paid orders, {len(succeeded_per_order)} with a succeeded charge")
        self.check(f"after {what}: {len(charges):,} charges at the mock provider, each naming a payment; "
                   f"{paid:,} paid orders with exactly one succeeded charge each")

    def check_refunds(self, mock, db=DB):
        self.settle_wait(db)
        at_mock = mock.get("/_admin/refunds")["data"]
        mock_succeeded = sum(1 for refund in at_mock if refund["status"] == "succeeded")
        db_total, db_succeeded = pg.query(self.db_url(db), "SELECT count(*), count(*) FILTER (WHERE status = "
                                          "'succeeded') FROM refunds")[0]
        if int(db_total) != len(at_mock) or int(db_succeeded) != mock_succeeded:
            raise SystemExit(f"REFUND CHECK FAILED: {len(at_mock)} refunds at the provider ({mock_succeeded} "
                             f"succeeded), {db_total} in the database ({db_succeeded} succeeded)")
        self.check(f"after refunds: {len(at_mock):,} refunds at the mock provider, {db_total} in the database "
                   f"({db_succeeded} succeeded on both sides)")

    # --- stages ----------------------------------------------------------------------------

    def stage_orders(self):
        svc, env = self.service, self.env
        log("pre-warm: new orders (WAL segments, caches, pools)")
        self.wrk(svc, "orders.lua", 16, env, 5 if QUICK else 20, measure=False)
        self.service_script = self.service_order_script()
        physical = BENCH / "pgbench" / "physical_limit.sql"
        self.sql((BENCH / "pgbench" / "physical_limit_schema.sql").read_text())

        def check():
            log(f"  check: {self.check_one_order_per_key():,} keys, one order each")

        for conns in (16, 64):
            runners = [(f"new orders at {conns}", lambda d, c=conns: self.wrk(svc, "orders.lua", c, env, d), check),
                       (f"pgbench service SQL at {conns}", lambda d, c=conns: self.pgbench(self.service_script, c, d), None)]
            if conns == 16:
                runners.append(("pgbench physical limit at 16", lambda d: self.pgbench(physical, 16, d), None))
            medians = self.alternate(runners)
            self.add_row(f"orders.fresh.{conns}", "new orders, fresh keys", conns, medians[runners[0][0]])
            self.add_row(f"pgbench.service.{conns}", "pgbench: the service's new-order SQL", conns, medians[runners[1][0]])
            if conns == 16:
                self.add_row("pgbench.physical.16", "pgbench: the physical limit (bare tables, one statement)", 16,
                             medians[runners[2][0]])
        self.check(f"after new orders: {self.check_one_order_per_key():,} keys, one order each")

    def stage_duplicates(self):
        for conns in (16, 64):
            result = self.measure(f"20% duplicate keys at {conns}",
                                  lambda d, c=conns: self.wrk(self.service, "orders.lua", c, self.env | {"DUP_RATE": "0.2"}, d),
                                  after_run=lambda: log(f"  check: {self.check_one_order_per_key():,} keys, one order each"))
            self.add_row(f"orders.dup.{conns}", "new orders, 20% duplicate keys", conns, result)
        self.check(f"after duplicate keys: {self.check_one_order_per_key():,} keys, one order each")

    def stage_replays(self):
        log("replays: creating 1,000 completed keys")
        for n in range(1, 1001):
            status, _ = http("POST", f"{self.service.url}/orders", ORDER_BODY, {
                "Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
                "Idempotency-Key": f"replay-{n}"})
            if status not in (200, 201):
                raise SystemExit(f"replay preload: {status}")
        result = self.measure("replays at 16",
                              lambda d: self.wrk(self.service, "orders.lua", 16, self.env | {"REPLAY_KEYS": "1000"}, d))
        self.add_row("orders.replay.16", "replays of completed keys", 16, result)

    def orders_needed(self, rate_id="orders.fresh.16", seconds=None, floor=5000):
        rate = next((r["rps"] for r in self.data["rows"] if r["id"] == rate_id), 2500)
        seconds = seconds or (WARMUP + RUNS * DURATION)
        return max(floor, int(rate * 1.5 * seconds))

    def against_ceiling(self, ceiling, stage, operation, label, run_service):
        """The service's `stage` scenario (`run_service(connections, seconds)`) at 16 and 64
        connections, each alternated run by run with pgbench running the operation's own
        statements (`ceiling`), as rows `{stage}.{conns}` and `pgbench.{operation}.{conns}`."""
        try:
            for conns in (16, 64):
                runners = [(f"{stage} at {conns}", lambda d, c=conns: run_service(c, d), None),
                           (f"pgbench {operation} SQL at {conns}", lambda d, c=conns: ceiling.run(c, d), None)]
                medians = self.alternate(runners)
                result = medians[runners[0][0]]
                if result.get("replayed"):
                    raise SystemExit(f"{stage}: {result['replayed']} replayed answers: too few preloaded rows")
                self.add_row(f"{stage}.{conns}", label, conns, result)
                self.add_row(f"pgbench.{operation}.{conns}",
                             f"pgbench: the service's {operation} SQL (its statements in order)", conns,
                             medians[runners[1][0]])
        finally:
            ceiling.drop()

    def stage_payments(self):
        count = 2 * self.orders_needed()
        log(f"payments: preloading {count:,} orders")
        ids = self.preload_orders(count, "payments")
        self.against_ceiling(PaymentCeiling(self), "payments", "payment", "payments, pm_card_ok, zero provider latency",
                             lambda conns, d: self.wrk(self.service, "payments.lua", conns, self.env, d, ids=ids))
        self.check_charges(self.mock)

    def stage_refunds(self):
        # Each payment gets at most 40 refunds of 1.00 (it is 48.48); the payments stage made
        # them through the API (so that the mock provider holds their charges).
        needed = max(2000, self.orders_needed(seconds=2 * (WARMUP + RUNS * DURATION), floor=0) // 30)
        have = int(self.scalar("SELECT count(*) FROM payments WHERE status = 'succeeded' AND amount_refunded = 0 "
                               "AND amount_refunding = 0 AND payment_method = 'pm_card_ok'"))
        if have < needed:
            log(f"refunds: paying {needed - have:,} more orders through the API")
            ids = self.preload_orders(int((needed - have) * 1.3), "refund-payments")
            deadline = time.time() + 300
            while have < needed and time.time() < deadline:
                self.wrk(self.service, "payments.lua", 64, self.env, 5, measure=False, ids=ids)
                have = int(self.scalar("SELECT count(*) FROM payments WHERE status = 'succeeded' AND amount_refunded = 0 "
                                       "AND payment_method = 'pm_card_ok'"))
        ids = self.sql(f"SELECT id FROM payments WHERE status = 'succeeded' AND amount_refunded = 0 AND "
                       f"amount_refunding = 0 AND payment_method = 'pm_card_ok' ORDER BY random() LIMIT {needed}")
        log(f"refunds: partial refunds of 1.00 over {len(ids):,} succeeded payments")
        payments = self.id_list(ids)
        env = self.env | {"PAYMENT_IDS": payments.path}
        self.against_ceiling(RefundCeiling(self), "refunds", "refund", "refunds, partial (1.00), zero provider latency",
                             lambda conns, d: self.wrk(self.service, "refunds.lua", conns, env, d))
        self.check_refunds(self.mock)

    def stage_capture(self):
        count = 2 * self.orders_needed()
        log(f"capture: preloading {count:,} orders")
        ids = self.preload_orders(count, "capture")
        self.against_ceiling(CaptureCeiling(self), "capture", "capture",
                             "manual capture: authorize + capture pairs (req/s = pairs/s)",
                             lambda conns, d: self.wrk(self.service, "capture.lua", conns, self.env, d, ids=ids))
        self.check_charges(self.mock, what="captures")

    def stage_naive(self):
        for conns in (16, 64):
            result = self.measure(f"pgbench naive at {conns}",
                                  lambda d, c=conns: self.pgbench(BENCH / "pgbench" / "naive_order.sql", c, d))
            self.add_row(f"pgbench.naive.{conns}", "pgbench: naive 5-statement transaction", conns, result)

    def stage_connections(self):
        seconds = len(SWEEP_CONNECTIONS) * (SWEEP_DURATION + 2)
        ids = self.preload_orders(self.orders_needed(seconds=seconds), "sweep")
        self.data["sweep_duration"] = SWEEP_DURATION
        for conns in SWEEP_CONNECTIONS:
            result = self.measure(f"new orders at {conns}", lambda d, c=conns: self.wrk(self.service, "orders.lua", c, self.env, d),
                                  runs=1, warmup=2, duration=SWEEP_DURATION)
            self.add_row(f"sweep.orders.{conns}", "new orders", conns, result)
        for conns in SWEEP_CONNECTIONS:
            result = self.measure(f"payments at {conns}",
                                  lambda d, c=conns: self.wrk(self.service, "payments.lua", c, self.env, d, ids=ids),
                                  runs=1, warmup=2, duration=SWEEP_DURATION)
            if result.get("replayed"):
                raise SystemExit(f"payments at {conns}: {result['replayed']} replayed answers: too few preloaded orders")
            self.add_row(f"sweep.payments.{conns}", "payments", conns, result)
        self.check(f"after the connection sweep: {self.check_one_order_per_key():,} keys, one order each")
        self.check_charges(self.mock, what="the connection sweep")

    def stage_idle(self):
        svc = self.service
        time.sleep(1)
        svc.reset_peak()
        before = svc.rss_mib()
        request = (f"GET /orders?limit=1 HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.key}\r\n"
                   "Connection: keep-alive\r\n\r\n").encode()
        sockets = []
        try:
            for _ in range(IDLE_CONNECTIONS):
                s = socket.create_connection(("127.0.0.1", svc.port), timeout=30)
                s.sendall(request)
                sockets.append(s)
            for s in sockets:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise SystemExit("idle connections: the service closed a connection before answering")
                    head += chunk
                head_part, body = head.split(b"\r\n\r\n", 1)
                if not head_part.startswith(b"HTTP/1.1 200"):
                    raise SystemExit(f"idle connections: {head_part[:40]!r}")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head_part).group(1))
                while len(body) < length:
                    body += s.recv(65536)
            time.sleep(1)
            rss, hwm = svc.rss_mib(), svc.peak_rss_mib()
            open_now = 0
            for s in sockets:
                s.setblocking(False)
                try:
                    open_now += 0 if s.recv(1) == b"" else 1
                except BlockingIOError:
                    open_now += 1
                except OSError:
                    pass
        finally:
            for s in sockets:
                s.close()
        time.sleep(2)
        after = svc.rss_mib()
        self.data["idle"] = {"connections": IDLE_CONNECTIONS, "rss_mib": rss, "hwm_mib": hwm, "rss_before_mib": before,
                             "rss_after_close_mib": after, "open_at_reading": open_now, "request": "GET /orders?limit=1"}
        # The process keeps what it grew to; later scenarios get a fresh one, so that each
        # scenario's peak RSS is its own.
        self.service.stop()
        self.service = Service(self.db_url(), self.mock)
        log(f"idle: {IDLE_CONNECTIONS} keep-alive connections ({open_now} open at the reading): RSS {rss:.1f} MiB, "
            f"peak {hwm:.1f} MiB (before {before:.1f} MiB)")

    # --- relays --------------------------------------------------------------------------

    def relay_features(self):
        """Which relays this build has, from `orderpay serve --help` (clap lists each setting's
        variable): {relay: None when present, or the reason it is not}."""
        help_text = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True).stdout
        features = {}
        features["webhooks"] = None if "ORDERPAY_ENCRYPTION_KEY" in help_text else \
            "this build has no merchant webhooks (serve --help lists no ORDERPAY_ENCRYPTION_KEY)"
        if "ORDERPAY_NATS_URL" not in help_text:
            features["nats"] = "this build has no NATS relay (serve --help lists no ORDERPAY_NATS_URL)"
        else:
            try:
                nats = Nats(NATS_URL)
                nats.jetstream("INFO")
                nats.close()
                features["nats"] = None
            except (OSError, NatsError) as error:
                features["nats"] = f"no NATS JetStream at {NATS_URL} ({error})"
        return features

    def relay_env(self, attached):
        env = {"ORDERPAY_WEBHOOK_ALLOW_PRIVATE": "true", "ORDERPAY_WEBHOOK_REQUIRE_HTTPS": "false"}
        if "webhooks" in attached:
            env["ORDERPAY_ENCRYPTION_KEY"] = self.encryption_key
        if "nats" in attached:
            env |= {"ORDERPAY_NATS_URL": NATS_URL, "ORDERPAY_NATS_STREAM": self.nats_stream,
                    "ORDERPAY_NATS_SUBJECT_PREFIX": f"orderpay_bench_{os.getpid()}.events"}
        return env

    def events_end(self):
        row = self.sql("SELECT txid::text, seq FROM events ORDER BY txid DESC, seq DESC LIMIT 1")
        return (int(row[0][0]), int(row[0][1])) if row else (0, 0)

    def cursors(self):
        return {relay: (int(txid), int(seq)) for relay, txid, seq in
                self.sql("SELECT relay, txid::text, seq FROM relay_cursors")}

    def wait_drained(self, attached, started, limit=600):
        """Seconds from `started` until each attached relay's cursor reached the last event
        written before this call (None: not within `limit`)."""
        end = self.events_end()
        done = {relay: None for relay in attached}
        conn = pg.PgConn(self.db_url())
        try:
            while time.time() - started < limit and any(v is None for v in done.values()):
                cursors = {relay: (int(txid), int(seq)) for relay, txid, seq in
                           conn.query("SELECT relay, txid::text, seq FROM relay_cursors")}
                now = time.time()
                for relay in attached:
                    if done[relay] is None and cursors[relay] >= end:
                        done[relay] = now - started
                time.sleep(0.05)
        finally:
            conn.close()
        return done

    def webhook_deliveries(self, conn=None):
        """(pending, delivered) webhook deliveries: what the delivery workers still owe, and what
        a receiver answered 2xx to and the worker recorded."""
        statement = ("SELECT count(*) FILTER (WHERE status = 'pending'), "
                     "count(*) FILTER (WHERE status = 'delivered') FROM webhook_deliveries")
        row = conn.query(statement)[0] if conn else self.sql(statement)[0]
        return int(row[0]), int(row[1])

    def wait_delivered(self, started, limit=DELIVERY_WAIT_S):
        """Seconds from `started` until no webhook delivery is pending any more (None: not within
        `limit`), and how many were delivered by then. The relay's cursor reaching the end only
        says the deliveries were written (dispatched); this waits until they were sent and their
        outcomes recorded."""
        conn = pg.PgConn(self.db_url())
        try:
            while True:
                pending, delivered = self.webhook_deliveries(conn)
                if pending == 0:
                    return time.time() - started, delivered
                if time.time() - started >= limit:
                    return None, delivered
                time.sleep(0.05)
        finally:
            conn.close()

    def stage_relays(self):
        """The relays are other branches' fresh work: a failure here is reported as this stage's
        (not run: failed ...) and the rest of the bench goes on."""
        try:
            self.relays()
        except (Exception, SystemExit) as error:
            reason = f"failed: {error}"
            log(f"relays: {reason}")
            self.data.setdefault("relays", {})["not_run"] = reason
            self.data["not_run"]["relays"] = reason
            if self.service is not None:  # it may be one with the relays on
                self.service.stop()
            self.service = Service(self.db_url(), self.mock)
        finally:
            self.cleanup_relays()

    def relays(self):
        relays = self.data["relays"] = {}
        features = self.relay_features()
        attached = [relay for relay, reason in features.items() if reason is None]
        relays["missing"] = {relay: reason for relay, reason in features.items() if reason}
        if not attached:
            reason = "; ".join(f"{relay}: {reason}" for relay, reason in features.items())
            relays["not_run"] = reason
            self.data["not_run"]["relays"] = reason
            log(f"relays: not run: {reason}")
            return
        self.encryption_key = base64.b64encode(os.urandom(32)).decode()
        self.nats_stream = f"ORDERPAY_BENCH_{os.getpid()}"
        relays["attached"] = attached
        relays["settings"] = (f"ORDERPAY_RELAY_INTERVAL_MS={os.environ.get('ORDERPAY_RELAY_INTERVAL_MS', 'default (100)')}, "
                              f"ORDERPAY_RELAY_BATCH_SIZE={os.environ.get('ORDERPAY_RELAY_BATCH_SIZE', 'default (500)')}, "
                              f"ORDERPAY_WEBHOOK_CONCURRENCY={os.environ.get('ORDERPAY_WEBHOOK_CONCURRENCY', 'default (16)')}")
        relays["sample_ms"] = LAG_SAMPLE_MS
        self.receiver = Receiver() if "webhooks" in attached else None
        # Events of earlier stages are not this stage's work: the relays start at this stage's
        # first event (the cursors stay where they are, the older events go).
        self.sql("TRUNCATE events")
        self.service.stop()
        self.service = None
        with_env = self.relay_env(attached)

        svc = Service(self.db_url(), self.mock, with_env)
        try:
            if "webhooks" in attached:
                status, body = http("POST", f"{svc.url}/webhook_endpoints",
                                    {"url": f"{self.receiver.url}/webhooks", "enabled_events": ["*"]},
                                    {"Authorization": f"Bearer {self.key}"})
                if status != 201:
                    relays["missing"]["webhooks"] = f"POST /webhook_endpoints answered {status} {body[:200]!r}"
                    attached.remove("webhooks")
                    self.receiver.stop()
                    self.receiver = None
        finally:
            svc.stop()
        if not attached:
            reason = "; ".join(f"{relay}: {reason}" for relay, reason in relays["missing"].items())
            relays["not_run"] = reason
            self.data["not_run"]["relays"] = reason
            log(f"relays: not run: {reason}")
            self.service = Service(self.db_url(), self.mock)
            return
        with_env = self.relay_env(attached)
        relays["attached"] = attached
        log(f"relays: attached {', '.join(attached)}")

        samples = []
        sampling = {"on": False, "t0": time.time()}
        stop = threading.Event()

        def sampler():
            conn = pg.PgConn(self.db_url(), "orderpay-bench-lag")
            try:
                while not stop.is_set():
                    if sampling["on"]:
                        rows = conn.query("""
                            SELECT c.relay, coalesce(extract(epoch FROM clock_timestamp() - (
                                SELECT e.created_at FROM events e WHERE (e.txid, e.seq) > (c.txid, c.seq)
                                ORDER BY e.txid, e.seq LIMIT 1)), 0)::float8
                            FROM relay_cursors c""")
                        at = time.time() - sampling["t0"]
                        for relay, lag in rows:
                            if relay in attached:
                                samples.append((round(at, 3), relay, float(lag)))
                    stop.wait(LAG_SAMPLE_MS / 1000)
            finally:
                conn.close()

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        receiver_before = self.receiver_snapshot()
        receiver_cpu_seconds = 0.0
        with_seconds = 0.0
        results = {f"{kind}.{conns}": [] for kind in ("without", "with") for conns in (16, 64)}
        webhook_runs = []
        try:
            for index in range(RUNS):
                svc = Service(self.db_url(), self.mock)
                try:
                    for conns in (16, 64):
                        if index == 0:
                            self.wrk(svc, "orders.lua", conns, self.env, WARMUP, measure=False)
                        r = self.wrk(svc, "orders.lua", conns, self.env, DURATION)
                        results[f"without.{conns}"].append(r)
                        log(f"without relays at {conns}: run {index + 1}/{RUNS}: {r['rps']:.0f}/s p99 {r['p99']:.1f} ms")
                finally:
                    svc.stop()
                started = time.time()
                svc = Service(self.db_url(), self.mock, with_env)
                try:
                    drained = self.wait_drained(attached, started)
                    log(f"  the relays caught up with the runs without them in "
                        + ", ".join(f"{k} {v:.1f} s" if v is not None else f"{k} not within 600 s" for k, v in drained.items()))
                    for conns in (16, 64):
                        if index == 0:
                            self.wrk(svc, "orders.lua", conns, self.env, WARMUP, measure=False)
                        cpu_before = proc_ticks(self.receiver.process.pid) if self.receiver else 0
                        if self.receiver:
                            _, delivered_before = self.webhook_deliveries()
                        sampling["on"] = True
                        r = self.wrk(svc, "orders.lua", conns, self.env, DURATION)
                        sampling["on"] = False
                        if self.receiver:
                            ran_until = time.time()
                            pending, delivered_after = self.webhook_deliveries()
                            in_run = delivered_after - delivered_before
                            caught_up, delivered_end = self.wait_delivered(ran_until)
                            run = {"conns": conns, "orders": r["requests"],
                                   "seconds": r["seconds"], "delivered_in_run": in_run,
                                   "pending_at_end": pending, "catch_up_seconds": caught_up,
                                   "delivered_total": delivered_end - delivered_before}
                            webhook_runs.append(run)
                            log(f"  webhooks at {conns}: {in_run:,} delivered during the run "
                                f"({in_run / r['seconds']:,.0f}/s), {pending:,} pending at its end, "
                                + (f"all delivered {caught_up:.1f} s after it" if caught_up is not None
                                   else f"still pending {DELIVERY_WAIT_S} s after it"))
                        with_seconds += r["seconds"]
                        if self.receiver:
                            receiver_cpu_seconds += (proc_ticks(self.receiver.process.pid) - cpu_before) / CLK_TCK
                        results[f"with.{conns}"].append(r)
                        log(f"with relays at {conns}: run {index + 1}/{RUNS}: {r['rps']:.0f}/s p99 {r['p99']:.1f} ms")
                    self.wait_drained(attached, time.time())
                finally:
                    svc.stop()
        finally:
            stop.set()
            thread.join()
        for name, runs in results.items():
            kind, conns = name.split(".")
            label = "new orders, relays attached (" + " + ".join(attached) + ")" if kind == "with" else \
                "new orders, no relays (same stage)"
            self.add_row(f"relays.{name}", label, int(conns), median_of(runs))
        relays["webhook_runs"] = webhook_runs
        relays["lag_samples"] = samples
        relays["lag_stats"], relays["lag_p99"] = {}, {}
        for relay in attached:
            values = sorted(lag for _, r, lag in samples if r == relay)
            if values:
                stats = {"samples": len(values), "p50": values[len(values) // 2],
                         "p99": values[min(len(values) - 1, int(len(values) * 0.99))], "max": values[-1]}
                relays["lag_stats"][relay] = stats
                relays["lag_p99"][relay] = stats["p99"]
        if self.receiver:
            after = self.receiver_snapshot()
            posts = after["posts"] - receiver_before["posts"]
            relays["receiver_cpu"] = {"seconds": receiver_cpu_seconds, "posts": posts,
                                      "us_per_post": 1e6 * receiver_cpu_seconds / posts if posts else 0,
                                      "percent": 100 * receiver_cpu_seconds / with_seconds if with_seconds else 0}

        # The backlog: events written with the relays off, then drained with them on.
        stage_events = int(self.scalar("SELECT count(*) FROM events"))
        self.sql("TRUNCATE events")  # the cursors are at the end of everything written so far
        log(f"relays: building a backlog of {BACKLOG_EVENTS:,} events with the relays off")
        svc = Service(self.db_url(), self.mock)
        build_started = time.time()
        try:
            while int(self.scalar("SELECT count(*) FROM events")) < BACKLOG_EVENTS:
                missing = BACKLOG_EVENTS - int(self.scalar("SELECT count(*) FROM events"))
                rate = next((r["rps"] for r in self.data["rows"] if r["id"] == "relays.without.64"), 2000)
                self.wrk(svc, "orders.lua", 64, self.env, max(1, int(missing / rate) + 1), measure=False)
        finally:
            svc.stop()
        build_seconds = time.time() - build_started
        events = int(self.scalar("SELECT count(*) FROM events"))
        log(f"relays: {events:,} events waiting; starting the service with the relays on")
        backlog_delivered_before = self.webhook_deliveries()[1] if self.receiver else 0
        started = time.time()
        self.service = Service(self.db_url(), self.mock, with_env)
        drained = self.wait_drained(attached, started)
        relays["backlog"] = {"events": events, "build_seconds": build_seconds, "seconds": drained}
        log("relays: backlog drained: " + ", ".join(
            f"{relay} {s:.1f} s ({events / s:,.0f}/s)" if s else f"{relay} not within 600 s" for relay, s in drained.items()))
        if self.receiver:
            seconds, delivered = self.wait_delivered(started)
            delivered -= backlog_delivered_before
            relays["backlog"]["webhooks_delivered"] = {"seconds": seconds, "delivered": delivered}
            log("relays: backlog's webhook deliveries: " + (
                f"all {delivered:,} delivered {seconds:.1f} s after the start ({delivered / seconds:,.0f}/s)"
                if seconds else f"{delivered:,} delivered, some still pending after {DELIVERY_WAIT_S} s"))
        time.sleep(2)
        stage_events += int(self.scalar("SELECT count(*) FROM events"))
        delivered = {"events written in the stage": f"{stage_events:,}"}
        if self.receiver:
            stats = self.receiver.stats()
            delivered["webhook POSTs received"] = f"{stats['posts']:,} ({stats['distinct_ids']:,} distinct webhook-id)"
            if stats["distinct_ids"] != stage_events:
                self.check(f"MISMATCH: {stage_events:,} events written, {stats['distinct_ids']:,} distinct webhooks received")
            else:
                self.check(f"relays: every one of the {stage_events:,} events of the stage reached the webhook receiver")
        if "nats" in attached:
            try:
                nats = Nats(NATS_URL)
                info = nats.stream_info(self.nats_stream)
                nats.close()
                messages = info["state"]["messages"] if info else 0
                delivered[f"NATS stream {self.nats_stream}"] = f"{messages:,} messages"
                if messages != stage_events:
                    self.check(f"MISMATCH: {stage_events:,} events written, {messages:,} messages in the NATS stream")
                else:
                    self.check(f"relays: the NATS stream holds exactly the {stage_events:,} events of the stage")
            except (OSError, NatsError) as error:
                delivered["NATS"] = f"could not read the stream: {error}"
        relays["delivered"] = delivered
        # Back to the plain service for the stages after this one.
        self.service.stop()
        self.service = Service(self.db_url(), self.mock)
        self.cleanup_relays()

    def receiver_snapshot(self):
        return self.receiver.stats() if self.receiver else {"posts": 0}

    def cleanup_relays(self):
        if self.receiver:
            self.receiver.stop()
            self.receiver = None
        if self.nats_stream:
            try:
                nats = Nats(NATS_URL)
                if nats.stream_info(self.nats_stream):
                    nats.delete_stream(self.nats_stream)
                    log(f"relays: deleted the NATS stream {self.nats_stream}")
                nats.close()
            except (OSError, NatsError) as error:
                log(f"relays: could not delete the NATS stream {self.nats_stream}: {error}")
            self.nats_stream = None

    # --- WAL, settings, growth -------------------------------------------------------------

    def stage_wal(self):
        db = "orderpay_bench_wal"
        key, _ = self.create_account(db)
        mock = Mock()  # its own: its charges are not the main database's
        self.extra_services.append(mock)
        svc = Service(self.db_url(db), mock)
        out = tempfile.mktemp(prefix="orderpay-bench-wal-", suffix=".json")
        try:
            ops = "50" if QUICK else "200"
            completed = subprocess.run([sys.executable, str(BENCH / "wal.py")], capture_output=True, text=True,
                                       env=dict(os.environ, ORDERPAY_URL=svc.url, ORDERPAY_KEY=key,
                                                DATABASE_URL=self.db_url(db), WAL_OPS=ops, WAL_JSON=out))
            if completed.returncode != 0:
                raise SystemExit(f"bench/wal.py failed:\n{completed.stdout}\n{completed.stderr}")
            self.data["wal"] = json.loads(Path(out).read_text())
            for name, op in self.data["wal"]["operations"].items():
                log(f"wal: {name}: {op['bytes']:.0f} bytes/op ({op['fpi']:.0f} full-page images), "
                    f"{op['commits']:.2f} commits/op")
        finally:
            svc.stop()
            mock.stop()
            self.extra_services.remove(mock)
            if os.path.exists(out):
                os.unlink(out)
            pg.query(f"{self.server}/postgres", f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def show_settings(self, server):
        names = [name for name, _ in pg.read_settings(BENCH / "postgresql.conf")]
        rows = pg.query(f"{server}/postgres", "SELECT name, current_setting(name) FROM pg_settings WHERE name IN ("
                        + ", ".join(f"'{n}'" for n in names) + ")")
        values = dict(rows)
        return {name: values.get(name, "?") for name in names}

    def stage_settings(self):
        if CLUSTER != "private":
            self.data["not_run"]["settings"] = "the whole run is on the shared server (BENCH_CLUSTER=shared)"
            return
        shared_db = f"orderpay_bench_shared_{os.getpid()}"
        private_server, self.server = self.server, SHARED_SERVER
        try:
            shared_key, shared_account = self.create_account(shared_db)
        finally:
            self.server = private_server
        shared_mock = Mock()
        shared = Service(f"{SHARED_SERVER}/{shared_db}", shared_mock)
        self.extra_services += [shared, shared_mock]
        shared_env = {"ORDERPAY_KEY": shared_key}
        try:
            log("settings: pre-warm on the shared server")
            self.wrk(shared, "orders.lua", 16, shared_env, 5 if QUICK else 20, measure=False)
            for conns in (16,):
                medians = self.alternate([
                    (f"private cluster, new orders at {conns}", lambda d, c=conns: self.wrk(self.service, "orders.lua", c, self.env, d), None),
                    (f"shared server, new orders at {conns}", lambda d, c=conns: self.wrk(shared, "orders.lua", c, shared_env, d), None)])
                self.add_row(f"settings.private.orders.{conns}", "settings: new orders, private tuned cluster", conns,
                             medians[f"private cluster, new orders at {conns}"])
                shared_row = medians[f"shared server, new orders at {conns}"]
                shared_row["cpu"].pop("postgres", None)
                self.add_row(f"settings.shared.orders.{conns}", "settings: new orders, shared server defaults", conns, shared_row)
            count = self.orders_needed(seconds=WARMUP + RUNS * DURATION)
            private_ids = self.preload_orders(count, "settings")
            self.server = SHARED_SERVER
            try:
                shared_ids = self.preload_orders(count, "settings", db=shared_db)
            finally:
                self.server = private_server
            medians = self.alternate([
                ("private cluster, payments at 16", lambda d: self.wrk(self.service, "payments.lua", 16, self.env, d, ids=private_ids), None),
                ("shared server, payments at 16", lambda d: self.wrk(shared, "payments.lua", 16, shared_env, d, ids=shared_ids), None)])
            self.add_row("settings.private.payments.16", "settings: payments, private tuned cluster", 16,
                         medians["private cluster, payments at 16"])
            shared_row = medians["shared server, payments at 16"]
            shared_row["cpu"].pop("postgres", None)
            self.add_row("settings.shared.payments.16", "settings: payments, shared server defaults", 16, shared_row)
            self.check_charges(self.mock, what="the settings stage (private cluster)")
            self.server = SHARED_SERVER
            try:
                self.check_charges(shared_mock, db=shared_db, what="the settings stage (shared server)")
            finally:
                self.server = private_server
        finally:
            shared.stop()
            shared_mock.stop()
            self.extra_services = []
            pg.query(f"{SHARED_SERVER}/postgres", f'DROP DATABASE IF EXISTS "{shared_db}" WITH (FORCE)')

    def stage_growth(self):
        keys, payments = GROWTH_KEYS, min(GROWTH_PAYMENTS, GROWTH_KEYS)
        # The loading session skips the foreign-key triggers (replica role): the rows are
        # consistent by construction, and checking each of millions costs minutes.
        LOAD = "SET session_replication_role = replica;"
        account = self.account_id
        log(f"growth: loading {keys:,} keys, orders, {2 * keys:,} items and {keys:,} events; {payments:,} payments")
        started = time.time()
        # A real answer and a real event as templates: the rows have the sizes the API writes.
        body, headers = self.answer_template()
        # UUIDv7-like ids in the two days before now, so that new orders append after them as
        # they would after two days of traffic.
        base_ms = int((time.time() - 2 * 86400) * 1000)
        step = max(1, int(2 * 86400 * 1000 / keys))
        v7 = (f"(lpad(to_hex({base_ms}::bigint + n::bigint * {step}), 12, '0') || '7' || substr(md5(n::text), 1, 3) "
              f"|| '8' || substr(md5(n::text), 4, 15))::uuid")
        self.sql(f"""{LOAD}
            INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata, created_at, updated_at)
            SELECT '{account}', {v7}, CASE WHEN n <= {payments} THEN 'paid' ELSE 'pending_payment' END, 'USD', 48.48,
                'bench-growth', '{{}}', to_timestamp(({base_ms} + n::bigint * {step}) / 1000.0),
                to_timestamp(({base_ms} + n::bigint * {step}) / 1000.0)
            FROM generate_series(1, {keys}) n""")
        log(f"growth: orders in {time.time() - started:.0f} s")
        self.sql(f"""{LOAD}
            INSERT INTO order_items (account_id, order_id, line_number, sku, quantity, unit_price, amount)
            SELECT '{account}', {v7}, l.line, l.sku, l.q, l.p, l.a FROM generate_series(1, {keys}) n,
              (VALUES (0, 'tee-black-m', 2, 19.99, 39.98), (1, 'mug', 1, 8.50, 8.50)) AS l (line, sku, q, p, a)""")
        log(f"growth: items in {time.time() - started:.0f} s")
        self.sql(f"""{LOAD}
            INSERT INTO idempotency_keys (account_id, key, method, route, fingerprint, resource_kind, resource_id,
                response_status, response_headers, answer_event_id, created_at, expires_at)
            SELECT '{account}', 'old-' || md5(n::text), 'POST', '/orders', sha256(n::text::bytea), 'order', {v7},
                201, {"NULL" if headers is None else f"'{headers}'"}::jsonb, {v7.replace("md5(n::text)", "md5('e' || n)")}, now() - interval '1 hour',
                now() + interval '23 hours'
            FROM generate_series(1, {keys}) n""")
        log(f"growth: keys in {time.time() - started:.0f} s")
        self.sql(f"""{LOAD}
            INSERT INTO events (account_id, id, type, data, created_at)
            SELECT '{account}', {v7.replace("md5(n::text)", "md5('e' || n)")}, 'order.created',
                decode('{body}', 'hex'), to_timestamp(({base_ms} + n::bigint * {step}) / 1000.0)
            FROM generate_series(1, {keys}) n""")
        log(f"growth: events in {time.time() - started:.0f} s")
        self.sql(f"""{LOAD}
            WITH p AS (
              INSERT INTO payments (account_id, id, order_id, status, amount, currency, payment_method,
                  provider_charge_id, idempotency_key, attempts, created_at, updated_at, capture_method, amount_captured)
              SELECT '{account}', {v7.replace("md5(n::text)", "md5('p' || n)")}, {v7}, 'succeeded', 48.48, 'USD',
                  'pm_bench_preload', 'ch_bench_' || n, 'pay-old-' || n, 0,
                  to_timestamp(({base_ms} + n::bigint * {step}) / 1000.0), to_timestamp(({base_ms} + n::bigint * {step}) / 1000.0),
                  'automatic', 48.48
              FROM generate_series(1, {payments}) n
              RETURNING account_id, id, created_at)
            INSERT INTO payment_events (account_id, payment_id, from_status, to_status, actor, detail, at, subject, subject_id)
            SELECT account_id, id, 'processing', 'succeeded', 'request', NULL, created_at, 'payment', id FROM p""")
        log(f"growth: payments in {time.time() - started:.0f} s; VACUUM ANALYZE, CHECKPOINT")
        for table in ("orders", "order_items", "idempotency_keys", "events", "payments", "payment_events"):
            self.sql(f"VACUUM ANALYZE {table}")
        self.sql("CHECKPOINT")
        load_seconds = time.time() - started
        self.data["growth"] = {"keys": keys, "payments": payments, "load_seconds": load_seconds}
        log(f"growth: loaded in {load_seconds:.0f} s")
        result = self.measure("new orders, grown database, at 16", lambda d: self.wrk(self.service, "orders.lua", 16, self.env, d))
        self.add_row("growth.orders.16", f"new orders, {keys:,} keys and orders in the tables", 16, result)
        count = self.orders_needed(rate_id="payments.16")
        ids = self.sql(f"SELECT id FROM orders WHERE customer_id = 'bench-growth' AND status = 'pending_payment' "
                       f"ORDER BY random() LIMIT {count}")
        orders = self.id_list(ids)
        result = self.measure("payments, grown database, at 16",
                              lambda d: self.wrk(self.service, "payments.lua", 16, self.env, d, ids=orders))
        if result.get("replayed"):
            raise SystemExit(f"payments: {result['replayed']} replayed answers: too few preloaded orders")
        self.add_row("growth.payments.16", f"payments, {payments:,} payments in the table", 16, result)
        self.check(f"after growth: {self.check_one_order_per_key():,} keys, one order each")
        self.check_charges(self.mock, what="the grown database")

    def stage_sweeper(self):
        if QUICK:
            self.data["not_run"]["sweeper"] = "quick mode"
            return
        if not self.data.get("growth"):
            self.data["not_run"]["sweeper"] = "needs the growth stage's rows"
            return
        self.service.stop()
        self.service = None
        log("sweeper: 1 million expired keys")
        self.sql("UPDATE idempotency_keys SET expires_at = now() - interval '1 minute' WHERE key IN "
                 "(SELECT key FROM idempotency_keys WHERE key LIKE 'old-%' LIMIT 1000000)")
        self.sql("VACUUM ANALYZE idempotency_keys")
        expired = "SELECT count(*) FROM idempotency_keys WHERE expires_at < now()"
        before = int(self.scalar(expired))
        # The default interval: the first round starts with the service, and a full batch is
        # followed by the next after 100 ms.
        self.service = Service(self.db_url(), self.mock)
        started = time.time()
        result = self.measure("new orders while the sweeper deletes 1M rows",
                              lambda d: self.wrk(self.service, "orders.lua", 16, self.env, d))
        elapsed = time.time() - started
        after = int(self.scalar(expired))
        rate = (before - after) / elapsed
        self.add_row("sweeper.orders.16", f"new orders while the sweeper deletes 1M expired keys ({rate:,.0f}/s)",
                     16, result, swept=before - after, swept_per_s=round(rate))
        log(f"sweeper deleted {before - after:,} of {before:,} expired rows ({rate:,.0f}/s) during the measurement")

    # --- the service's own statement under pgbench -------------------------------------------

    def answer_template(self):
        """A real answer of the service to POST /orders (hex of its body) and its headers, made
        by one request if the database has none yet."""
        query = ("SELECT encode(coalesce(k.response_body, e.data), 'hex'), k.response_headers::text "
                 "FROM idempotency_keys AS k LEFT JOIN events AS e "
                 "ON e.account_id = k.account_id AND e.id = k.answer_event_id "
                 "WHERE k.route = '/orders' AND k.response_status = 201 "
                 "AND coalesce(k.response_body, e.data) IS NOT NULL LIMIT 1")
        rows = self.sql(query)
        if not rows:
            http("POST", f"{self.service.url}/orders", ORDER_BODY, {
                "Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
                "Idempotency-Key": "bench-template"})
            rows = self.sql(query)
        return rows[0]

    def service_order_script(self):
        """The pgbench script of the service's own new-order statement: the key claim
        (src/idempotency/claim_key.sql) and src/orders/new_order.sql, as the service concatenates
        them, with each $n bound to a per-transaction value of the same type."""
        oid = "md5('o' || :client_id::text || '-' || :n::text)::uuid"
        body = self.answer_template()[0]
        values = {
            1: ":account_id::uuid",
            2: "'svc-' || :client_id::text || '-' || :n::text",
            3: "'POST'", 4: "'/orders'", 5: "sha256(:n::text::bytea)",
            6: "'order'", 7: oid, 8: "201::smallint",
            # No headers: the service derives a new order's from the key's resource.
            9: "NULL::jsonb",
            # A real answer of the service (its size matters: it is the event's data).
            10: f"decode('{body}', 'hex')",
            11: "now()", 12: "now() + interval '1 day'",
            13: "'USD'", 14: "48.48", 15: "NULL::text", 16: "'{}'::jsonb",
            17: "ARRAY['tee-black-m', 'mug']", 18: "ARRAY[2, 1]", 19: "ARRAY[19.99, 8.50]",
            20: "ARRAY[39.98, 8.50]",
            21: "md5('e' || :client_id::text || '-' || :n::text)::uuid",
            # The key row names the event for its body (claim_key.sql).
            97: "md5('e' || :client_id::text || '-' || :n::text)::uuid",
        }
        sql = bound_statement(["idempotency/claim_key.sql", "orders/new_order.sql"], values)
        return self.temp_file("\\set n random(1, 9000000000000)\n" + sql + "\n", suffix=".sql")

    # --- the run -------------------------------------------------------------------------

    def setup(self):
        for tool in ("wrk", "pgbench"):
            if not shutil.which(tool):
                raise SystemExit(f"{tool} is needed: apt-get install wrk postgresql-client")
        if not BIN.exists():
            raise SystemExit(f"{BIN} is missing: cargo build --release --bin orderpay")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
        version = pg.scalar(f"{SHARED_SERVER}/postgres", "SHOW server_version").split()[0]
        cores = os.cpu_count()
        memory = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) / 1024 / 1024
        settings = pg.read_settings(BENCH / "postgresql.conf")
        notes = []
        if CLUSTER == "private":
            bindir = pg.bin_dir(version.split(".")[0])
            if not pg.built_with_lz4(bindir):
                settings = [(n, "pglz" if n == "wal_compression" and v == "lz4" else v) for n, v in settings]
                notes.append("wal_compression=pglz: this server was built without lz4")
            if STATEMENTS:
                settings.append(("shared_preload_libraries", "pg_stat_statements"))
                settings.append(("pg_stat_statements.track", "all"))
                notes.append("pg_stat_statements loaded (BENCH_PG_STATEMENTS=1)")
            for extra in filter(None, os.environ.get("BENCH_PG_SETTINGS", "").split(",")):
                name, value = extra.split("=", 1)
                settings = [(n, v) for n, v in settings if n != name.strip()] + [(name.strip(), value.strip())]
                notes.append(f"{name.strip()}={value.strip()} from BENCH_PG_SETTINGS")
            log(f"starting a private PostgreSQL {version} cluster ({bindir}) with bench/postgresql.conf")
            self.cluster = pg.PrivateCluster(bindir, settings, log).start()
            self.server = self.cluster.server_url
            cluster_text = (f"private PostgreSQL {version} cluster with bench/postgresql.conf"
                            + (f" ({'; '.join(notes)})" if notes else ""))
        elif CLUSTER == "shared":
            cluster_text = f"the machine's shared PostgreSQL {version} with its own settings"
        else:
            raise SystemExit(f"BENCH_CLUSTER={CLUSTER}: shared or private")
        commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip()
        self.data["meta"] = {
            "date": report.today(), "mode": "quick" if QUICK else "full", "runs": RUNS, "duration": DURATION,
            "warmup": WARMUP, "cluster": CLUSTER, "cluster_text": cluster_text, "commit": commit or "?",
            "machine": f"{cores} cores, {memory:.0f} GiB, {platform.system()} {platform.machine()}, PostgreSQL {version}",
        }
        self.data["settings"] = {"private": self.show_settings(self.server)} if CLUSTER == "private" else {}
        if CLUSTER == "private":
            self.data["settings"]["shared"] = self.show_settings(SHARED_SERVER)
        log(f"machine: {self.data['meta']['machine']}; {cluster_text}")
        self.key, self.account_id = self.create_account(DB)
        if STATEMENTS:
            if CLUSTER != "private":
                raise SystemExit("BENCH_PG_STATEMENTS=1 needs the private cluster")
            self.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.env = {"ORDERPAY_KEY": self.key}
        self.mock = Mock()
        self.service = Service(self.db_url(), self.mock)

    def run(self, stages):
        try:
            self.setup()
            self.data["stages"].append({"name": "setup", "seconds": time.time() - STARTED})
            for stage in stages:
                started = time.time()
                log(f"=== stage {stage}")
                getattr(self, f"stage_{stage}")()
                seconds = time.time() - started
                self.data["stages"].append({"name": stage, "seconds": seconds})
                log(f"=== stage {stage}: {seconds:.0f} s")
        except (Exception, KeyboardInterrupt, SystemExit) as error:
            self.data["failed"] = str(error) or type(error).__name__
            if self.service:
                tail = self.service.log_tail()
                if tail:
                    print(f"--- orderpay serve log (last lines)\n{tail}", file=sys.stderr)
            raise
        finally:
            self.teardown()
            self.data["total_seconds"] = time.time() - STARTED
            self.save()

    def teardown(self):
        for thing in [self.service, *self.extra_services, self.mock]:
            if thing:
                try:
                    thing.stop()
                except Exception as error:  # keep tearing down the rest
                    log(f"teardown: {error}")
        self.cleanup_relays()
        if self.cluster:
            log("stopping and removing the private cluster")
            self.cluster.stop()
        elif CLUSTER == "shared":
            try:
                pg.query(f"{SHARED_SERVER}/postgres", f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
            except Exception as error:
                log(f"teardown: {error}")
        for name in self.temp_files:
            try:
                os.unlink(name)
            except OSError:
                pass

    def save(self):
        if "meta" not in self.data:
            return
        OUT.mkdir(exist_ok=True)
        path = OUT / "last-run.json"
        path.write_text(json.dumps(self.data, indent=1) + "\n")
        render(path)



def bound_statement(files, values):
    """The statement the service runs from `files` (under src/, concatenated as the service does),
    comments dropped, each $n replaced by `values[n]` (a pgbench expression of the same type), as
    one line ending in `;`. Stops the bench when the files take other parameters than mapped."""
    sql = "".join((ROOT / "src" / f).read_text() for f in files)
    sql = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    used = {int(n) for n in re.findall(r"\$(\d+)", sql)}
    if used != set(values):
        raise SystemExit(f"{files} take parameters {sorted(used)}; update bench/run.py's mapping")
    sql = re.sub(r"\$(\d+)", lambda m: f"({values[int(m.group(1))]})", sql)
    return " ".join(sql.split()) + ";"


def order_read(order):
    """The order read the service runs before a settle that writes an order event
    (orders::repository::find: the order, its payments' ids and its items in one statement),
    for the order whose id is the pgbench expression `order`."""
    return ('SELECT "orders"."account_id", "orders"."id", "orders"."status", "orders"."currency", '
            '"orders"."total_amount", "orders"."customer_id", "orders"."metadata", "orders"."created_at", '
            '"orders"."updated_at", ARRAY(SELECT payments.id FROM payments WHERE payments.account_id = '
            'orders.account_id AND payments.order_id = orders.id ORDER BY payments.id), "order_items"."order_id", '
            '"order_items"."sku", "order_items"."quantity", "order_items"."unit_price", "order_items"."amount" '
            'FROM ("orders" LEFT OUTER JOIN "order_items" ON (("order_items"."account_id" = "orders"."account_id") '
            'AND ("order_items"."order_id" = "orders"."id"))) WHERE (("orders"."account_id" = :account_id::uuid) '
            f'AND ("orders"."id" = {order})) ORDER BY "order_items"."line_number";')


class OperationCeiling:
    """pgbench running the statements the service runs for one operation in their order, one
    pgbench transaction per request (each statement commits alone, as the service's do, unless
    the service groups them in a transaction), with a real answer and events of the main database
    as the data; the provider exchange between them is the part left out. It runs in a database
    of its own (nothing in it has a charge at the mock provider), on rows preloaded before each
    run: client c's n-th operation of a run works on the rows numbered c * 10^8 + n, n counting
    from the run's base. A subclass gives the database (`DB`), the statements, the preload and
    the query counting settled operations (`DONE`)."""

    DB = None
    DONE = None
    PER_CLIENT = 10 ** 8
    # The script's row number: client c's n-th transaction of the run.
    ROW = f":client_id::bigint * {PER_CLIENT} + :n"
    # Enough preloaded rows for every transaction of a run at up to this rate.
    MAX_RATE = 4000

    def __init__(self, bench):
        self.bench = bench
        self.key, self.account_id = bench.create_account(self.DB)
        self.url = bench.db_url(self.DB)
        self.script = None
        self.base = 0

    def run(self, clients, duration):
        if self.script is None:
            self.script = self.bench.temp_file("\\set n :n + 1\n" + "\n".join(self.statements()) + "\n",
                                               suffix=".sql")
        per_client = int(self.MAX_RATE * duration * 1.5 / clients) + 500
        base, self.base = self.base, self.base + per_client
        rows = f"generate_series(0, {clients - 1}) AS c, generate_series({base + 1}, {base + per_client}) AS n"
        for statement in self.preload(rows):
            pg.query(self.url, statement)
        pg.query(self.url, "VACUUM ANALYZE")
        done_before = int(pg.scalar(self.url, self.DONE))
        result = self.bench.pgbench(self.script, clients, duration, db=self.DB, account_id=self.account_id,
                                    defines={"n": base})
        done = int(pg.scalar(self.url, self.DONE)) - done_before
        # Every transaction a whole operation: none met its rows missing or already used.
        if done != result["requests"]:
            raise SystemExit(f"{type(self).__name__}: {result['requests']:,} transactions but {done:,} settled")
        return result

    def drop(self):
        pg.query(f"{self.bench.server}/postgres", f'DROP DATABASE IF EXISTS "{self.DB}" WITH (FORCE)')

    def statements(self):
        """The script's statements, each ending in `;`."""
        raise NotImplementedError

    def preload(self, rows):
        """The statements that write the rows a run works on, `rows` naming them (c, n)."""
        raise NotImplementedError

    def real(self, query, what):
        value = self.bench.scalar(query)
        if not value:
            raise SystemExit(f"{type(self).__name__} needs {what} made through the API first")
        return value

    def real_event(self, event_type, what):
        """The data (hex) of a real event of `event_type`: a succeeded operation's answer is its
        event's data, byte for byte (its row names the event)."""
        return self.real(f"SELECT encode(data, 'hex') FROM events WHERE type = '{event_type}' LIMIT 1", what)

    @staticmethod
    def claim(key, route, kind, resource, fingerprint):
        """claim_key.sql's parameters for an operation's key: no answer yet (the operation's row
        will hold it), kept a day."""
        return {1: ":account_id::uuid", 2: key, 3: "'POST'", 4: route, 5: fingerprint, 6: kind, 7: resource,
                8: "NULL::smallint", 9: "NULL::jsonb", 10: "NULL::bytea", 11: "now()",
                12: "now() + interval '1 day'", 97: "NULL::uuid"}

    @classmethod
    def ids(cls, prefix, n=None):
        """The uuid of row `n` (a pgbench expression; the preload's row by default) of a kind
        (`prefix`)."""
        return f"md5('{prefix}' || ({n or f'c::bigint * {cls.PER_CLIENT} + n'}))::uuid"

    def orders(self, rows, status):
        """Orders of 48.48 with two items, as the bench's new orders make them."""
        order = self.ids("bo")
        return f"""
            WITH o AS (
              INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata,
                  created_at, updated_at)
              SELECT '{self.account_id}', {order}, '{status}', 'USD', 48.48, NULL, '{{}}', now(), now()
              FROM {rows}
              RETURNING id)
            INSERT INTO order_items (account_id, order_id, line_number, sku, quantity, unit_price, amount)
            SELECT '{self.account_id}', o.id, l.n, l.sku, l.q, l.p, l.a FROM o,
              (VALUES (0, 'tee-black-m', 2, 19.99, 39.98), (1, 'mug', 1, 8.50, 8.50)) AS l (n, sku, q, p, a)"""


class PaymentCeiling(OperationCeiling):
    """A payment through POST /payments: phase 1 (the key claim of src/idempotency/claim_key.sql
    with src/payments/start_payment.sql), the order read for the `order.paid` event, and phase 2
    (src/payments/settle_payment.sql), on unpaid orders."""

    DB = "orderpay_bench_payment_ceiling"
    DONE = "SELECT count(*) FROM payments WHERE status = 'succeeded'"

    def statements(self):
        answer = self.real_event("payment.succeeded", "a payment")
        paid = self.real_event("order.paid", "a paid order")
        n = self.ROW
        order, payment, lease = self.ids("bo", n), self.ids("bp", n), self.ids("bl", n)
        key = f"'pay-' || ({n})::text"
        charge = f"'ch_ceiling_' || ({n})::text"
        start = bound_statement(["idempotency/claim_key.sql", "payments/start_payment.sql"], {
            **self.claim(key, "'/payments'", "'payment'", payment, f"sha256(({n})::text::bytea)"),
            13: order, 14: "NULL::numeric", 15: "'pm_card_ok'", 16: "now() + interval '30 seconds'",
            17: lease, 18: "'automatic'",
        })
        settle = bound_statement(["payments/settle_payment.sql"], {
            1: ":account_id::uuid", 2: payment, 3: order, 4: "'succeeded'", 5: charge, 6: "NULL::text",
            7: "NULL::text", 8: "now()", 9: "'request'", 10: charge, 11: "201::smallint",
            12: f"decode('{answer}', 'hex')", 13: "48.48", 14: "NULL::timestamptz", 15: "NULL::timestamptz",
            16: "'paid'", 17: "NULL::timestamptz", 18: "NULL::timestamptz", 19: "NULL::uuid",
            91: self.ids("be", n), 92: "'payment.succeeded'", 93: f"decode('{answer}', 'hex')",
            94: self.ids("bo-e", n), 95: "'order.paid'", 96: f"decode('{paid}', 'hex')",
        })
        return [start, order_read(order), settle]

    def preload(self, rows):
        return [self.orders(rows, "pending_payment")]


class RefundCeiling(OperationCeiling):
    """A partial refund (1.00) through POST /refunds: the payment's currency read to check the
    amount, the key claim of src/idempotency/claim_key.sql with src/refunds/start_refund.sql, the
    refund loaded and the payment's charge read for the provider call, then one transaction:
    the order locked and stamped, read for its event, and src/refunds/settle_refund.sql. Each on
    a paid order's succeeded payment of its own. The service's refunds go round a list of payments,
    up to 40 refunds each, so the ceiling is a little generous: its refunds find no earlier refund
    of their payment and move their order from paid rather than from partially refunded."""

    DB = "orderpay_bench_refund_ceiling"
    DONE = "SELECT count(*) FROM refunds WHERE status = 'succeeded'"

    def statements(self):
        answer = self.real_event("refund.succeeded", "a refund")
        moved = self.real_event("order.partially_refunded", "a partially refunded order")
        n = self.ROW
        order, payment, refund, lease = self.ids("bo", n), self.ids("bp", n), self.ids("br", n), self.ids("bl", n)
        where_payment = f"WHERE account_id = :account_id::uuid AND id = {payment}"
        start = bound_statement(["idempotency/claim_key.sql", "refunds/start_refund.sql"], {
            **self.claim(f"'refund-' || ({n})::text", "'/refunds'", "'refund'", refund, f"sha256(({n})::text::bytea)"),
            13: payment, 14: "1.00", 15: "NULL::text", 16: "now() + interval '30 seconds'", 17: lease,
            18: "'succeeded'",
        })
        settle = bound_statement(["refunds/settle_refund.sql"], {
            1: ":account_id::uuid", 2: refund, 3: order, 4: payment, 5: "'succeeded'",
            6: f"'re_ceiling_' || ({n})::text", 7: "NULL::text", 8: "NULL::text", 9: "now()", 10: "'request'",
            11: f"'re_ceiling_' || ({n})::text", 12: "201::smallint", 13: f"decode('{answer}', 'hex')", 14: "true",
            15: "NULL::timestamptz", 16: self.ids("bo-e", n), 17: f"decode('{moved}', 'hex')",
            18: f"decode('{moved}', 'hex')", 19: "NULL::timestamptz", 20: "NULL::timestamptz",
            21: "NULL::timestamptz", 22: "NULL::uuid",
            91: self.ids("br-e", n), 92: "'refund.succeeded'", 93: f"decode('{answer}', 'hex')",
            94: "NULL::uuid", 95: "NULL::text", 96: "NULL::bytea",
        })
        return [
            f"SELECT currency FROM payments {where_payment} LIMIT 1;",
            start,
            f"SELECT * FROM refunds WHERE account_id = :account_id::uuid AND id = {refund} LIMIT 1;",
            f"SELECT provider_charge_id FROM payments {where_payment} LIMIT 1;",
            "BEGIN;",
            f"SELECT clock_timestamp() FROM orders WHERE account_id = :account_id::uuid AND id = {order} "
            f"LIMIT 1 FOR UPDATE;",
            order_read(order),
            settle,
            "COMMIT;",
        ]

    def preload(self, rows):
        # Paid orders, each with its succeeded payment of 48.48, captured.
        payment, order = self.ids("bp"), self.ids("bo")
        return [self.orders(rows, "paid"), f"""
            INSERT INTO payments (account_id, id, order_id, status, amount, currency, payment_method,
                provider_charge_id, idempotency_key, attempts, created_at, updated_at, capture_method,
                amount_captured)
            SELECT '{self.account_id}', {payment}, {order}, 'succeeded', 48.48, 'USD', 'pm_card_ok',
                'ch_ceiling_' || (c::bigint * {self.PER_CLIENT} + n), 'pay-' || (c::bigint * {self.PER_CLIENT} + n),
                0, now(), now(), 'automatic', 48.48
            FROM {rows}"""]


class CaptureCeiling(OperationCeiling):
    """An authorize + capture pair: the authorization through POST /payments (the key claim with
    src/payments/start_payment.sql, capture_method manual, then src/payments/settle_payment.sql
    to `requires_capture`, the order `authorized`), then its capture through
    POST /payments/{id}/capture (the key claim with src/payments/start_capture_or_void.sql, the
    payment's load, the order read for its `order.paid` event, and
    src/payments/settle_capture_or_void.sql), on unpaid orders."""

    DB = "orderpay_bench_capture_ceiling"
    DONE = "SELECT count(*) FROM payment_operations WHERE kind = 'capture' AND status = 'succeeded'"

    def statements(self):
        authorized = self.real_event("payment.requires_capture", "an authorization")
        captured = self.real_event("payment.succeeded", "a capture")
        paid = self.real_event("order.paid", "a paid order")
        n = self.ROW
        order, payment, capture = self.ids("bo", n), self.ids("bp", n), self.ids("bc", n)
        charge = f"'ch_ceiling_' || ({n})::text"
        authorize = bound_statement(["idempotency/claim_key.sql", "payments/start_payment.sql"], {
            **self.claim(f"'authorize-' || ({n})::text", "'/payments'", "'payment'", payment,
                         f"sha256(({n})::text::bytea)"),
            13: order, 14: "NULL::numeric", 15: "'pm_card_ok'", 16: "now() + interval '30 seconds'",
            17: self.ids("bl", n), 18: "'manual'",
        })
        settle_authorization = bound_statement(["payments/settle_payment.sql"], {
            1: ":account_id::uuid", 2: payment, 3: order, 4: "'requires_capture'", 5: charge, 6: "NULL::text",
            7: "NULL::text", 8: "now()", 9: "'request'", 10: charge, 11: "201::smallint",
            12: f"decode('{authorized}', 'hex')", 13: "0", 14: "now() + interval '7 days'",
            15: "now() + interval '7 days'", 16: "'authorized'", 17: "NULL::timestamptz",
            18: "NULL::timestamptz", 19: "NULL::uuid",
            91: self.ids("ba-e", n), 92: "'payment.requires_capture'", 93: f"decode('{authorized}', 'hex')",
            94: "NULL::uuid", 95: "NULL::text", 96: "NULL::bytea",
        })
        start_capture = bound_statement(["idempotency/claim_key.sql", "payments/start_capture_or_void.sql"], {
            **self.claim(f"'capture-' || ({n})::text", "'/payments/{id}/capture'", "'payment_operation'", capture,
                         f"sha256(('c' || ({n}))::bytea)"),
            13: payment, 14: "'capture'", 15: "NULL::numeric", 16: "now() + interval '30 seconds'",
            17: self.ids("bk", n),
        })
        settle_capture = bound_statement(["payments/settle_capture_or_void.sql"], {
            1: ":account_id::uuid", 2: capture, 3: order, 4: payment, 5: "'succeeded'", 6: "NULL::text",
            7: "NULL::text", 8: "now()", 9: "'request'", 10: charge, 11: "200::smallint",
            12: f"decode('{captured}', 'hex')", 13: "'succeeded'", 14: "48.48", 15: "NULL::text",
            16: "NULL::text", 17: "NULL::timestamptz", 18: "'paid'", 19: "NULL::timestamptz", 20: "NULL::uuid",
            91: self.ids("bc-e", n), 92: "'payment.succeeded'", 93: f"decode('{captured}', 'hex')",
            94: self.ids("bo-e", n), 95: "'order.paid'", 96: f"decode('{paid}', 'hex')",
        })
        return [
            authorize,
            settle_authorization,
            start_capture,
            f"SELECT * FROM payments WHERE account_id = :account_id::uuid AND id = {payment} LIMIT 1;",
            order_read(order),
            settle_capture,
        ]

    def preload(self, rows):
        return [self.orders(rows, "pending_payment")]


def render(path):
    """results.md and the charts next to `path` (a last-run.json)."""
    data = json.loads(Path(path).read_text())
    out = Path(path).parent
    (out / "results.md").write_text(report.render(data))
    print("\n" + report.summary_for_terminal(data))
    stages = " + ".join(f"{s['name']} {s['seconds']:.0f}" for s in data.get("stages", []))
    print(f"\nStages (s): {stages}; total {data.get('total_seconds', 0) / 60:.1f} min")
    python = ROOT / ".venv" / "bench" / "bin" / "python"
    if python.exists():
        completed = subprocess.run([str(python), str(BENCH / "charts.py"), str(path)], capture_output=True, text=True)
        if completed.returncode != 0:
            print(f"charts failed:\n{completed.stderr}", file=sys.stderr)
        else:
            print(completed.stdout.strip())
    else:
        print(f"no charts: {python} is missing (make bench creates it)")
    print(f"written: {out / 'results.md'}")


def main():
    if sys.argv[1:2] == ["--report"]:
        path = Path(sys.argv[2]) if len(sys.argv) > 2 else BENCH / "last-run.json"
        render(path)
        return 0
    chosen = [s.strip() for s in os.environ.get("BENCH_STAGES", "").split(",") if s.strip()] or ALL_STAGES
    unknown = [s for s in chosen if s not in ALL_STAGES]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; stages: {', '.join(ALL_STAGES)}")
    stages = [s for s in ALL_STAGES if s in chosen]

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    Bench().run(stages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
