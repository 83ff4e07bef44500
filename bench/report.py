"""bench/results.md from the raw figures of a run (bench/last-run.json): the table of scenarios,
the targets (met / NOT met / not run, each with its ratio), the relays, WAL per operation, the
PostgreSQL settings compared, the correctness checks and each stage's time. Every number here is
read from the JSON; nothing is typed in."""

import datetime

RSS_LIMIT_MIB = 64
# WAL bytes per operation (bench/wal.py), ledger included.
WAL_TARGETS = [("new order", 1600), ("payment", 3000), ("refund", 3800), ("authorize + capture", 7000)]


def rows_by_id(data):
    return {row["id"]: row for row in data.get("rows", [])}


def fmt_rate(value):
    return f"{value:,.0f}" if value is not None else ""


def fmt_ms(value):
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def cpu_cell(row):
    cpu = row.get("cpu")
    if not cpu:
        return ""
    parts = []
    for name in ("service", "postgres", "load", "receiver", "other"):
        if cpu.get(name) is not None:
            parts.append(f"{cpu[name]:.0f}")
        else:
            parts.append("-")
    return " / ".join(parts)


def reason_for(data, *stages):
    not_run = data.get("not_run", {})
    for stage in stages:
        if stage in not_run:
            return f"not run: {not_run[stage]}"
    return f"not run: the {' and '.join(stages)} stage(s) not part of this run"


def targets(data):
    """[(name, value text, goal text, status)] with status 'met', 'NOT met' or 'not run: ...'."""
    by = rows_by_id(data)
    out = []

    def rps(row_id):
        row = by.get(row_id)
        return row["rps"] if row else None

    def ratio(name, numerator_id, denominator_id, goal, stages, note=""):
        a, b = rps(numerator_id), rps(denominator_id)
        if a is None or not b:
            out.append((name, "", f">= {goal}", reason_for(data, *stages)))
            return
        value = a / b
        out.append((name, f"{value:.2f}{note}", f">= {goal}", "met" if value >= goal else "NOT met"))

    ratio("new orders / pgbench running the service's statement, at 16", "orders.fresh.16", "pgbench.service.16", 0.85, ["orders"])
    ratio("new orders / pgbench running the service's statement, at 64", "orders.fresh.64", "pgbench.service.64", 0.85, ["orders"])
    for conns in (16, 64):
        ratio(f"payments / pgbench running the payment's statements, at {conns}", f"payments.{conns}",
              f"pgbench.payment.{conns}", 0.85, ["payments"])
    for conns in (16, 64):
        ratio(f"refunds / pgbench running the refund's statements, at {conns}", f"refunds.{conns}",
              f"pgbench.refund.{conns}", 0.85, ["refunds"])
    for conns in (16, 64):
        ratio(f"manual capture pairs / pgbench running the pair's statements, at {conns}", f"capture.{conns}",
              f"pgbench.capture.{conns}", 0.85, ["capture"])
    ratio("new orders / the physical limit (pgbench), at 16", "orders.fresh.16", "pgbench.physical.16", 0.5, ["orders"])
    ratio("20% duplicate keys / fresh keys, at 16", "orders.dup.16", "orders.fresh.16", 0.9, ["duplicates"])
    ratio("20% duplicate keys / fresh keys, at 64", "orders.dup.64", "orders.fresh.64", 0.9, ["duplicates"])
    ratio("replays / new orders, at 16", "orders.replay.16", "orders.fresh.16", 3.0, ["replays"])
    ratio("payments / new orders, at 16", "payments.16", "orders.fresh.16", 0.45, ["payments"])
    ratio("refunds / new orders, at 16", "refunds.16", "orders.fresh.16", 0.45, ["refunds"])
    ratio("manual capture pairs / new orders, at 16", "capture.16", "orders.fresh.16", 0.3, ["capture"])

    # Work per operation: WAL (bench/wal.py) and PostgreSQL's CPU per payment where payments are
    # measured (its CPU share over the rate).
    wal = data.get("wal", {}).get("operations", {})
    for name, goal in WAL_TARGETS:
        op = wal.get(name)
        if op is None:
            out.append((f"WAL per {name}", "", f"<= {goal:,} B", reason_for(data, "wal")))
        else:
            out.append((f"WAL per {name}", f"{op['bytes']:,.0f} B", f"<= {goal:,} B",
                        "met" if op["bytes"] <= goal else "NOT met"))
    payments = by.get("payments.16")
    pg_cpu = (payments or {}).get("cpu", {}).get("postgres")
    if payments and pg_cpu is not None and payments["rps"]:
        per = pg_cpu / 100 * 1000 / payments["rps"]
        out.append(("PostgreSQL CPU per payment, at 16", f"{per:.2f} ms", "<= 1.2 ms", "met" if per <= 1.2 else "NOT met"))
    else:
        out.append(("PostgreSQL CPU per payment, at 16", "", "<= 1.2 ms",
                    reason_for(data, "payments") if not payments else "not run: PostgreSQL's CPU is not measured on the shared server"))

    relays = data.get("relays", {})
    attached = relays.get("attached", [])
    missing = relays.get("missing", {})
    note = ""
    if attached and missing:
        note = f" ({' + '.join(attached)} only; {', '.join(missing)} not run, see Relays)"
    for conns in (16, 64):
        ratio(f"new orders with the relays / without them, at {conns}", f"relays.with.{conns}",
              f"relays.without.{conns}", 0.9, ["relays"], note)
    lag = relays.get("lag_p99")
    if lag:
        for relay, value in sorted(lag.items()):
            out.append((f"outbox lag p99 of the {relay} relay at the full new-order rate", f"{value:.3f} s",
                        "< 1 s", "met" if value < 1 else "NOT met"))
    else:
        out.append(("outbox lag p99 at the full new-order rate", "", "< 1 s", reason_for(data, "relays")))
    backlog = relays.get("backlog")
    base = rps("relays.without.16") or rps("orders.fresh.16")
    if backlog and base:
        for relay, seconds in sorted(backlog["seconds"].items()):
            if seconds is None:
                out.append((f"{backlog['events']:,}-event backlog drained by the {relay} relay", "did not finish",
                            ">= 2 x new orders", "NOT met"))
                continue
            rate = backlog["events"] / seconds
            out.append((f"{backlog['events']:,}-event backlog drained by the {relay} relay, / new orders at 16",
                        f"{rate:,.0f}/s = {rate / base:.2f}", ">= 2", "met" if rate >= 2 * base else "NOT met"))
    else:
        out.append(("backlog drain / new orders", "", ">= 2", reason_for(data, "relays")))

    fresh = by.get("orders.fresh.16")
    if fresh:
        out.append(("p99 of new orders at 16", f"{fresh['p99']:.1f} ms", "< 20 ms", "met" if fresh["p99"] < 20 else "NOT met"))
    else:
        out.append(("p99 of new orders at 16", "", "< 20 ms", reason_for(data, "orders")))
    with_rss = [row for row in data.get("rows", []) if row.get("rss") is not None]
    if with_rss:
        worst = max(with_rss, key=lambda row: row["rss"])
        out.append(("peak RSS of the service, every scenario (worst: " + worst["label"] + f" at {worst['conns']})",
                    f"{worst['rss']:.1f} MiB", f"< {RSS_LIMIT_MIB} MiB", "met" if worst["rss"] < RSS_LIMIT_MIB else "NOT met"))
    idle = data.get("idle")
    if idle:
        value = max(idle["rss_mib"], idle["hwm_mib"])
        out.append((f"peak RSS with {idle['connections']:,} idle keep-alive connections", f"{value:.1f} MiB",
                    f"< {RSS_LIMIT_MIB} MiB", "met" if value < RSS_LIMIT_MIB else "NOT met"))
    else:
        out.append(("peak RSS with 1,000 idle keep-alive connections", "", f"< {RSS_LIMIT_MIB} MiB", reason_for(data, "idle")))
    growth = data.get("growth", {})
    scale = f" ({growth['keys']:,} keys and orders)" if growth.get("keys") else ""
    ratio(f"new orders with a grown database{scale} / empty tables, at 16", "growth.orders.16", "orders.fresh.16", 0.9, ["growth"])
    pscale = f" ({growth['payments']:,} payments)" if growth.get("payments") else ""
    ratio(f"payments with a grown database{pscale} / empty tables, at 16", "growth.payments.16", "payments.16", 0.9, ["growth", "payments"])
    ratio("new orders while the sweeper deletes 1M rows / grown database idle", "sweeper.orders.16", "growth.orders.16", 0.9, ["sweeper"])
    ratio("payments on PostgreSQL's default settings (the shared server) / the tuned cluster, at 16",
          "settings.shared.payments.16", "settings.private.payments.16", 0.5, ["settings"])
    return out


def scenario_table(data):
    by = rows_by_id(data)
    references = {
        "orders.fresh.16": ("pgbench.service.16", "pgbench service SQL"),
        "orders.fresh.64": ("pgbench.service.64", "pgbench service SQL"),
        "pgbench.service.16": ("pgbench.physical.16", "physical limit"),
        "orders.dup.16": ("orders.fresh.16", "fresh keys"),
        "orders.dup.64": ("orders.fresh.64", "fresh keys"),
        "orders.replay.16": ("orders.fresh.16", "new orders"),
        "payments.16": ("orders.fresh.16", "new orders"),
        "payments.64": ("pgbench.payment.64", "pgbench payment SQL"),
        "refunds.16": ("orders.fresh.16", "new orders"),
        "refunds.64": ("pgbench.refund.64", "pgbench refund SQL"),
        "capture.16": ("orders.fresh.16", "new orders"),
        "capture.64": ("pgbench.capture.64", "pgbench capture SQL"),
        "relays.with.16": ("relays.without.16", "without relays"),
        "relays.with.64": ("relays.without.64", "without relays"),
        "growth.orders.16": ("orders.fresh.16", "empty tables"),
        "growth.payments.16": ("payments.16", "empty tables"),
        "sweeper.orders.16": ("growth.orders.16", "grown, idle"),
        "settings.shared.orders.16": ("settings.private.orders.16", "private tuned"),
        "settings.shared.orders.64": ("settings.private.orders.64", "private tuned"),
        "settings.shared.payments.16": ("settings.private.payments.16", "private tuned"),
    }
    lines = [
        "| scenario | conns | req/s | p50 ms | p99 ms | errors | peak RSS MiB | CPU % svc / pg / load / recv / other | compared with |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data.get("rows", []):
        if row["id"].startswith("sweep."):
            continue
        compared = ""
        reference = references.get(row["id"])
        if reference and reference[0] in by and by[reference[0]]["rps"]:
            compared = f"{row['rps'] / by[reference[0]]['rps']:.2f} x {reference[1]}"
        rss = f"{row['rss']:.1f}" if row.get("rss") is not None else ""
        lines.append(f"| {row['label']} | {row['conns']} | {fmt_rate(row['rps'])} | {fmt_ms(row['p50'])} | "
                     f"{fmt_ms(row['p99'])} | {row['errors']} | {rss} | {cpu_cell(row)} | {compared} |")
    return lines


def sweep_table(data):
    sweep = [row for row in data.get("rows", []) if row["id"].startswith("sweep.")]
    if not sweep:
        return []
    conns = sorted({row["conns"] for row in sweep})
    lines = ["| scenario | " + " | ".join(f"{c} conns" for c in conns) + " |",
             "|---|" + "---|" * len(conns)]
    for kind, label in (("orders", "new orders"), ("payments", "payments")):
        cells, p99s = [], []
        for c in conns:
            row = next((r for r in sweep if r["id"] == f"sweep.{kind}.{c}"), None)
            cells.append(f"{fmt_rate(row['rps'])}/s" if row else "")
            p99s.append(f"{fmt_ms(row['p99'])} ms" if row else "")
        lines.append(f"| {label}: req/s | " + " | ".join(cells) + " |")
        lines.append(f"| {label}: p99 | " + " | ".join(p99s) + " |")
    return lines


def render(data):
    meta = data["meta"]
    lines = [
        f"# orderpay benchmark",
        "",
        f"{meta['date']}, {meta['machine']}; {meta['mode']} mode, medians of {meta['runs']} run(s) of "
        f"{meta['duration']} s after a warm-up; {meta['cluster_text']}. The service, PostgreSQL and the load "
        "generators share the machine; quote ratios (each against a figure of the same run), not absolute "
        f"numbers. Total time {data.get('total_seconds', 0) / 60:.1f} min. Commit {meta.get('commit', '?')}."
        + (f" {meta['merged']}" if meta.get("merged") else ""),
        "",
        "![throughput of each scenario against its ceiling](throughput.png)",
        "",
        "## Targets",
        "",
    ]
    for name, value, goal, status in targets(data):
        shown = f"{value} " if value else ""
        lines.append(f"- {name}: {shown}(target {goal}): {status}")
    lines += ["", "## Scenarios", "",
              "CPU: percent of one core, for the service (`orderpay serve`), PostgreSQL (every process of "
              "the cluster; blank on the shared server, which others use too), the load generator (wrk or "
              "pgbench), the webhook receiver, and everything else on the machine (other users, the harness).",
              ""]
    lines += scenario_table(data)
    sweep = sweep_table(data)
    if sweep:
        lines += ["", "## Connections", "",
                  "Throughput and p99 of new orders and payments against the number of connections "
                  f"({data.get('sweep_duration', '?')} s each).", "",
                  "![throughput and p99 against connections](connections.png)", ""]
        lines += sweep
    lines += relay_section(data)
    lines += idle_section(data)
    lines += wal_section(data)
    lines += settings_section(data)
    lines += growth_section(data)
    lines += statements_section(data)
    checks = data.get("checks", [])
    if checks:
        lines += ["", "## Correctness checks", ""] + [f"- {check}" for check in checks]
    if data.get("not_run"):
        lines += ["", "## Not run", ""] + [f"- {stage}: {reason}" for stage, reason in data["not_run"].items()]
    if data.get("failed"):
        lines += ["", f"**The run stopped early: {data['failed']}**"]
    lines += ["", "## Stages", "", "| stage | seconds |", "|---|---|"]
    for stage in data.get("stages", []):
        lines.append(f"| {stage['name']} | {stage['seconds']:.0f} |")
    lines.append(f"| total | {data.get('total_seconds', 0):.0f} |")
    return "\n".join(lines) + "\n"


def relay_section(data):
    relays = data.get("relays")
    if not relays:
        return []
    lines = ["", "## Relays", ""]
    if relays.get("not_run"):
        return lines + [f"Not run: {relays['not_run']}"]
    lines.append(f"Attached: {', '.join(relays.get('attached', []))}; settings {relays.get('settings', '')}.")
    for relay, reason in relays.get("missing", {}).items():
        lines.append(f"Not attached: {relay}: {reason}.")
    if relays.get("lag_p99"):
        lines += ["", "Outbox lag (age of the oldest event after the relay's cursor, sampled every "
                  f"{relays.get('sample_ms', 250)} ms from the database during the runs with relays):", "",
                  "| relay | samples | p50 s | p99 s | max s |", "|---|---|---|---|---|"]
        for relay in sorted(relays["lag_p99"]):
            stats = relays["lag_stats"][relay]
            lines.append(f"| {relay} | {stats['samples']} | {stats['p50']:.3f} | {stats['p99']:.3f} | {stats['max']:.3f} |")
        lines += ["", "![outbox lag over the run](outbox-lag.png)"]
    backlog = relays.get("backlog")
    if backlog:
        lines += ["", f"Backlog: {backlog['events']:,} events written with the relays off (built in "
                  f"{backlog['build_seconds']:.0f} s), then the service started with them on; time from the "
                  "start of the process to the cursor reaching the last event:", ""]
        for relay, seconds in sorted(backlog["seconds"].items()):
            text = f"{seconds:.1f} s, {backlog['events'] / seconds:,.0f} events/s" if seconds else "did not finish"
            lines.append(f"- {relay}: {text}")
    webhooks = backlog.get("webhooks_delivered") if backlog else None
    if webhooks:
        text = (f"{webhooks['seconds']:.1f} s, {webhooks['delivered'] / webhooks['seconds']:,.0f} deliveries/s"
                if webhooks["seconds"] else f"not all within the wait ({webhooks['delivered']:,} delivered)")
        lines.append(f"- webhook deliveries sent and recorded as delivered ({webhooks['delivered']:,}): {text}")
    runs = relays.get("webhook_runs")
    if runs:
        lines += ["", "Webhook deliveries during the runs with relays (delivered: sent, answered 2xx and recorded; "
                  "catch-up: from the end of the run until none is pending):", "",
                  "| connections | orders | delivered in the run | delivered/s | pending at the end | catch-up s |",
                  "|---|---|---|---|---|---|"]
        for run in runs:
            catch_up = f"{run['catch_up_seconds']:.1f}" if run["catch_up_seconds"] is not None else "did not finish"
            lines.append(f"| {run['conns']} | {run['orders']:,} | {run['delivered_in_run']:,} | "
                         f"{run['delivered_in_run'] / run['seconds']:,.0f} | {run['pending_at_end']:,} | {catch_up} |")
    delivered = relays.get("delivered")
    if delivered:
        lines += ["", "Delivered: " + "; ".join(f"{k}: {v}" for k, v in delivered.items())]
    receiver = relays.get("receiver_cpu")
    if receiver:
        lines += ["", f"The webhook receiver (bench/receiver.py, asyncio on raw bytes) used {receiver['seconds']:.1f} CPU s "
                  f"for {receiver['posts']:,} POSTs ({receiver['us_per_post']:.0f} us each, "
                  f"{receiver['percent']:.0f}% of a core over the runs with relays)."]
    return lines


def idle_section(data):
    idle = data.get("idle")
    if not idle:
        return []
    return ["", "## Idle connections", "",
            f"{idle['connections']:,} keep-alive connections opened, one request each ({idle['request']}), kept "
            f"open ({idle['open_at_reading']:,} still open at the reading): RSS {idle['rss_mib']:.1f} MiB, "
            f"peak {idle['hwm_mib']:.1f} MiB (before: {idle['rss_before_mib']:.1f} MiB; 2 s after closing them: "
            f"{idle.get('rss_after_close_mib', 0):.1f} MiB). The service is restarted after this stage."]


def wal_section(data):
    wal = data.get("wal")
    if not wal:
        return []
    if wal.get("not_run"):
        return ["", "## WAL per operation", "", f"Not run: {wal['not_run']}"]
    lines = ["", "## WAL per operation", "",
             f"bench/wal.py on the same cluster ({wal['ops']} operations each, after a CHECKPOINT; "
             "pg_walinspect, this database's records only):", "",
             "| operation | WAL bytes / op | of which full-page images | commits / op | vs a new order | largest relations |",
             "|---|---|---|---|---|---|"]
    base = wal["operations"].get("new order", {}).get("bytes")
    for name, op in wal["operations"].items():
        top = ", ".join(f"{rel} {size:.0f}" for rel, size, *_ in op["relations"][:4])
        versus = f"{op['bytes'] / base:.2f}" if base else ""
        lines.append(f"| {name} | {op['bytes']:.0f} | {op['fpi']:.0f} | {op['commits']:.2f} | {versus} | {top} |")
    return lines


def settings_section(data):
    settings = data.get("settings")
    if not settings:
        return []
    lines = ["", "## PostgreSQL settings", "",
             "The private cluster runs with bench/postgresql.conf; the shared server with its own "
             "configuration. As each server reported them (`SHOW`):", "",
             "| setting | shared server | private cluster |", "|---|---|---|"]
    for name, private in settings["private"].items():
        shared = settings.get("shared", {}).get(name, "")
        marker = " **" if shared and shared != private else ""
        lines.append(f"| {name} | {shared} | {private}{marker.strip()} |" if not marker else
                     f"| {name} | {shared} | **{private}** |")
    return lines


def growth_section(data):
    growth = data.get("growth")
    if not growth or not growth.get("keys"):
        return []
    return ["", "## Growth", "",
            f"Loaded by SQL before measuring: {growth['keys']:,} idempotency keys with their orders, "
            f"{2 * growth['keys']:,} order items and {growth['keys']:,} order.created events; {growth['payments']:,} "
            f"of the orders paid (a payment and its audit row each). Load {growth['load_seconds']:.0f} s, then "
            "VACUUM ANALYZE and a CHECKPOINT."]


def summary_for_terminal(data):
    """The table and targets as printed at the end of a run."""
    lines = scenario_table(data) + [""] + sweep_table(data) + ["", "Targets:"]
    for name, value, goal, status in targets(data):
        shown = f"{value} " if value else ""
        lines.append(f"- {name}: {shown}(target {goal}): {status}")
    return "\n".join(lines)


def today():
    return datetime.date.today().isoformat()


def statements_section(data):
    rows = [row for row in data.get("rows", []) if row.get("statements")]
    if not rows:
        return []
    lines = ["", "## Where PostgreSQL's time goes", "",
             "pg_stat_statements (BENCH_PG_STATEMENTS=1) over the last measured run of each scenario: the "
             "statements with the most execution time (share of the run's statement time, mean ms, calls).", ""]
    for row in rows:
        lines.append(f"- {row['label']} at {row['conns']}:")
        for st in row["statements"][:4]:
            lines.append(f"  - {st['percent']:.0f}%, {st['mean_ms']:.3f} ms x {st['calls']:,}: `{st['query'][:120]}`")
    return lines
