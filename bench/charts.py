#!/usr/bin/env python3
"""The charts of a bench run, from its raw figures (run with .venv/bench/bin/python, which has
matplotlib; bench/run.py calls it):

    charts.py bench/last-run.json

writes next to the JSON: throughput.png (each scenario against its ceiling), connections.png
(throughput and p99 against connections) and outbox-lag.png (the relays' lag over the run).
A chart whose figures are not in the run is not drawn (and an old one is removed)."""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

# (scenario id, its ceiling's id, the ceiling's name, the target as a ratio of it or None)
AGAINST = [
    ("orders.fresh.16", "pgbench.service.16", "pgbench, the service's SQL", 0.85),
    ("orders.fresh.64", "pgbench.service.64", "pgbench, the service's SQL", 0.85),
    ("pgbench.service.16", "pgbench.physical.16", "physical limit", None),
    ("orders.dup.16", "pgbench.service.16", "pgbench, the service's SQL", None),
    ("orders.dup.64", "pgbench.service.64", "pgbench, the service's SQL", None),
    ("relays.with.16", "pgbench.service.16", "pgbench, the service's SQL", 0.9),
    ("relays.with.64", "pgbench.service.64", "pgbench, the service's SQL", 0.9),
    ("payments.16", "orders.fresh.16", "new orders", 0.7),
    ("refunds.16", "orders.fresh.16", "new orders", 0.7),
    ("capture.16", "orders.fresh.16", "new orders", 0.35),
    ("growth.orders.16", "orders.fresh.16", "new orders, empty tables", 0.9),
    ("growth.payments.16", "payments.16", "payments, empty tables", 0.9),
    ("sweeper.orders.16", "growth.orders.16", "new orders, grown, idle", 0.9),
]


def throughput(data, by, out):
    bars = [(by[a], by[b], name, goal) for a, b, name, goal in AGAINST if a in by and b in by]
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(bars) + 1.6))
    labels = []
    for y, (row, ceiling, name, goal) in enumerate(reversed(bars)):
        ax.barh(y, ceiling["rps"], color="#d9d9d9", height=0.8)
        ax.barh(y, row["rps"], color="#3b75af", height=0.5)
        if goal:
            ax.plot([goal * ceiling["rps"]] * 2, [y - 0.4, y + 0.4], color="#c0392b", linewidth=2)
        ax.text(max(row["rps"], ceiling["rps"]) * 1.01, y,
                f"{row['rps']:,.0f}/s = {row['rps'] / ceiling['rps']:.2f} x {name}", va="center", fontsize=8)
        labels.append(f"{row['label']} ({row['conns']})")
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.set_xlabel("requests per second (blue), its ceiling or reference (grey), the target (red)")
    ax.set_xlim(0, max(max(r["rps"], c["rps"]) for r, c, _, _ in bars) * 1.6)
    meta = data["meta"]
    ax.set_title(f"orderpay: each scenario against its ceiling ({meta['date']}, {meta['mode']} mode, "
                 f"{meta['cluster']} cluster)", fontsize=10)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def connections(data, out):
    sweep = [r for r in data.get("rows", []) if r["id"].startswith("sweep.")]
    if not sweep:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for kind, label in (("orders", "new orders"), ("payments", "payments")):
        rows = sorted((r for r in sweep if r["id"].startswith(f"sweep.{kind}.")), key=lambda r: r["conns"])
        xs = [r["conns"] for r in rows]
        top.plot(xs, [r["rps"] for r in rows], marker="o", label=label)
        bottom.plot(xs, [r["p99"] for r in rows], marker="o", label=label)
    top.set_ylabel("requests per second")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("p99 latency (ms)")
    bottom.set_yscale("log")
    bottom.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    bottom.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    bottom.set_xscale("log", base=2)
    bottom.set_xlabel("connections")
    bottom.set_xticks([1, 4, 16, 64, 256], ["1", "4", "16", "64", "256"])
    top.legend()
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3, which="both")
    top.set_title(f"Throughput and p99 against connections ({data.get('sweep_duration', '?')} s each)", fontsize=10)
    fig.tight_layout()
    path = out / "connections.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def outbox_lag(data, out):
    samples = data.get("relays", {}).get("lag_samples") or []
    if not samples:
        return None
    fig, ax = plt.subplots(figsize=(10, 4))
    for relay in sorted({s[1] for s in samples}):
        points = [(t, lag) for t, r, lag in samples if r == relay]
        ax.plot([p[0] for p in points], [p[1] for p in points], ".", markersize=3, label=relay)
    ax.axhline(1.0, color="#c0392b", linestyle="--", linewidth=1, label="target p99 (1 s)")
    ax.set_xlabel("seconds into the relay stage (sampled only while a run with relays is measured)")
    ax.set_ylabel("outbox lag (s)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title("Age of the oldest event not yet handed on, every 250 ms, new orders at full rate", fontsize=10)
    fig.tight_layout()
    path = out / "outbox-lag.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(path):
    path = Path(path)
    data = json.loads(path.read_text())
    by = {row["id"]: row for row in data.get("rows", [])}
    out = path.parent
    for name, drawn in (("throughput.png", throughput(data, by, out)), ("connections.png", connections(data, out)),
                        ("outbox-lag.png", outbox_lag(data, out))):
        if drawn:
            print(f"chart: {drawn}")
        elif (out / name).exists():
            (out / name).unlink()


if __name__ == "__main__":
    main(sys.argv[1])
