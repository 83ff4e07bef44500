//! Prometheus metrics, rendered by `GET /metrics` (metrics-exporter-prometheus, recording only:
//! the endpoint is served by our own app).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `orderpay_http_requests_total` | counter | `method`, `route`, `status` |
//! | `orderpay_http_request_duration_seconds` | histogram | `method`, `route`, `status` |
//! | `orderpay_idempotency_requests_total` | counter | `outcome`: executed, replayed, reused, in_use, takeover, missing |
//! | `orderpay_operations_waiting` | gauge | `kind`: provider operations with an unknown outcome that no driver holds, waiting for a retry or the reconciler (read at scrape) |
//! | `orderpay_idempotency_keys_swept_total` | counter | |
//! | `orderpay_payments_settled_total` | counter | `status`: succeeded, requires_capture, failed, canceled |
//! | `orderpay_refunds_settled_total` | counter | `status`: succeeded, failed |
//! | `orderpay_refunds_corrected_total` | counter | `to`: succeeded (a refund given up on that the provider carried out), failed (a refund the provider reversed) |
//! | `orderpay_events_total` | counter | `type`: events written to the outbox |
//! | `orderpay_outbox_lag_seconds` | gauge | `relay` (webhooks, nats): age of the oldest event the relay has not handed on |
//! | `orderpay_late_charges_total` | counter | `result`: refunded (a system refund succeeded), refund_failed (one failed; another starts once it is surely not carried out), voided (charges that landed after their payment was given up on) |
//! | `orderpay_late_charges_unrefunded` | gauge | failed payments holding a charge that landed late which the system's refunds did not give back and nothing will try again: each needs a person (read at scrape) |
//! | `orderpay_guard_violations_total` | counter | `constraint`: a money CHECK constraint refused what a statement's own guard let through (a bug in the guard; the request is answered by the guard on its next round) |
//! | `orderpay_reconciler_passes_total` | counter | |
//! | `orderpay_reconciler_payments_total` | counter | `result`: settled, redriven, rescheduled, stuck, gave_up, error |
//! | `orderpay_provider_errors_total` | counter | `kind`: auth (the provider refused our credentials: nothing it was asked was done until an operator fixes them), idempotency (it refused a downstream key reused with other parameters: a bug of ours) |
//! | `orderpay_provider_webhooks_total` | counter | `result`: applied (moved an operation), duplicate (an event already received), stale (nothing to move: the operation had settled, or the event reports no final state), unknown (no operation of ours), rejected (refused: signature, size, body) |
//! | `orderpay_disputes_recorded_total` | counter | `result`: what recording a dispute the provider reported did (created, updated, unchanged, refused: it broke the guard, does_not_fit, changed) |
//! | `orderpay_disputes_evidence_due_soon` | gauge | disputes that need a response with evidence due within a day (read at scrape) |
//! | `orderpay_db_pool_connections` | gauge | `state`: in_use, idle (read at scrape) |
//! | `orderpay_db_pool_max_connections` | gauge | the most connections the process opens, over all its pools (set at start) |
//! | `orderpay_idempotency_audit_purged_total` | counter | audit rows of expired keys deleted past `ORDERPAY_IDEMPOTENCY_AUDIT_DAYS` |
//! | `orderpay_webhook_deliveries_total` | counter | `result`: delivered, failed, gave_up (merchant webhook delivery attempts) |
//! | `orderpay_webhook_secret_errors_total` | counter | deliveries that could not be signed: their endpoint's secret opens under no key of `ORDERPAY_ENCRYPTION_KEY` |
//! | `orderpay_nats_published_total` | counter | events the NATS relay stored in its JetStream stream (first copies) |
//! | `orderpay_settlement_exceptions` | gauge | `category`: settlement exceptions nobody settled (missing_ours, missing_provider, amount_mismatch, currency_mismatch, status_mismatch, duplicate_provider; read at scrape) |
//! | `orderpay_settlement_runs_total` | counter | `result`: clean (every movement matched), exceptions (the window has open exceptions), failed |
//! | `orderpay_nats_duplicates_total` | counter | events published again that JetStream dropped by their `Nats-Msg-Id` (a batch handed on again after a crash or a lost PubAck) |
//!
//! Every name is declared in [`DESCRIBED`], which `describe` registers and the test of the
//! dashboards and alerts in `deploy/` reads. A metric renders only once it has a value, so
//! [`export_at_start`] gives every counter its value 0 for each of its known label values when
//! the recorder is installed: dashboards and `absent()` alerts see the series before the first
//! event. The gauges get theirs at start (the pool's size, each running relay's lag) or at each
//! scrape (connections, operations waiting).

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

const HTTP_DURATION: &str = "orderpay_http_request_duration_seconds";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder once and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let buckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(HTTP_DURATION.to_owned()), &buckets)
                .map(PrometheusBuilder::build_recorder);
            let recorder = match recorder {
                Ok(recorder) => recorder,
                Err(_) => PrometheusBuilder::new().build_recorder(),
            };
            let handle = recorder.handle();
            // Err: some other recorder was installed first (a test harness); ours still renders.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            export_at_start();
            handle
        })
        .clone()
}

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Of seconds; rendered as `<name>_bucket`, `<name>_sum` and `<name>_count`.
    Histogram,
}

/// Every metric the service exports: name, kind, help.
pub const DESCRIBED: &[(&str, Kind, &str)] = &[
    ("orderpay_http_requests_total", Kind::Counter, "HTTP requests by method, route and status"),
    (HTTP_DURATION, Kind::Histogram, "HTTP request latency"),
    ("orderpay_idempotency_requests_total", Kind::Counter, "Keyed requests by idempotency outcome"),
    (
        "orderpay_operations_waiting",
        Kind::Gauge,
        "Provider operations with an unknown outcome that no driver holds",
    ),
    (
        "orderpay_idempotency_keys_swept_total",
        Kind::Counter,
        "Expired idempotency keys moved to the audit by the sweeper",
    ),
    (
        "orderpay_idempotency_audit_purged_total",
        Kind::Counter,
        "Audit rows of expired idempotency keys deleted past their retention",
    ),
    ("orderpay_payments_settled_total", Kind::Counter, "Payments whose charge or authorization settled"),
    ("orderpay_refunds_settled_total", Kind::Counter, "Refunds moved to a final status"),
    (
        "orderpay_refunds_corrected_total",
        Kind::Counter,
        "Settled refunds corrected to what the provider confirmed: carried out late, or reversed",
    ),
    ("orderpay_events_total", Kind::Counter, "Events written to the outbox, by type"),
    (
        "orderpay_late_charges_total",
        Kind::Counter,
        "Charges that landed after their payment was given up on, refunded or voided by the system",
    ),
    (
        "orderpay_late_charges_unrefunded",
        Kind::Gauge,
        "Failed payments holding a late charge that nothing will refund any more: each needs a person",
    ),
    (
        "orderpay_guard_violations_total",
        Kind::Counter,
        "Money constraints that refused what a statement's own guard let through (a guard's bug)",
    ),
    (
        "orderpay_settlement_exceptions",
        Kind::Gauge,
        "Settlement exceptions (our books against the provider's records) nobody settled, by category",
    ),
    ("orderpay_settlement_runs_total", Kind::Counter, "Settlement runs of a window, by result"),
    ("orderpay_reconciler_passes_total", Kind::Counter, "Reconciler passes run"),
    ("orderpay_reconciler_payments_total", Kind::Counter, "Payments handled by the reconciler, by result"),
    ("orderpay_provider_webhooks_total", Kind::Counter, "Provider webhook deliveries, by what they did"),
    (
        "orderpay_provider_errors_total",
        Kind::Counter,
        "Provider calls refused for a fault of ours (our credentials, a reused key), by kind",
    ),
    (
        "orderpay_disputes_recorded_total",
        Kind::Counter,
        "Disputes the provider reported, by what recording them did",
    ),
    (
        "orderpay_disputes_evidence_due_soon",
        Kind::Gauge,
        "Disputes that need a response whose evidence is due within a day (read at scrape)",
    ),
    ("orderpay_db_pool_connections", Kind::Gauge, "Database connections by state"),
    (
        "orderpay_db_pool_max_connections",
        Kind::Gauge,
        "The most database connections this process opens, over all its pools",
    ),
    ("orderpay_webhook_deliveries_total", Kind::Counter, "Merchant webhook delivery attempts, by result"),
    (
        "orderpay_webhook_secret_errors_total",
        Kind::Counter,
        "Merchant webhook deliveries not sent: their endpoint's secret opens under no key of ORDERPAY_ENCRYPTION_KEY",
    ),
    ("orderpay_outbox_lag_seconds", Kind::Gauge, "Age of the oldest event a relay has not handed on"),
    ("orderpay_nats_published_total", Kind::Counter, "Events stored in the NATS JetStream stream"),
    (
        "orderpay_nats_duplicates_total",
        Kind::Counter,
        "Events published to NATS again and dropped by JetStream as duplicates of their Nats-Msg-Id",
    ),
];

fn describe() {
    for &(name, kind, help) in DESCRIBED {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, metrics::Unit::Seconds, help),
        }
    }
}

/// `outcome` of `orderpay_idempotency_requests_total`.
pub const IDEMPOTENCY_OUTCOMES: &[&str] =
    &["executed", "replayed", "reused", "in_use", "takeover", "missing"];
/// `status` of `orderpay_payments_settled_total`.
pub const PAYMENT_STATUSES: &[&str] = &["succeeded", "requires_capture", "failed", "canceled"];
/// `status` of `orderpay_refunds_settled_total`.
pub const REFUND_STATUSES: &[&str] = &["succeeded", "failed"];
/// `result` of `orderpay_late_charges_total`.
pub const LATE_CHARGE_RESULTS: &[&str] = &["refunded", "refund_failed", "voided"];
/// `to` of `orderpay_refunds_corrected_total`.
pub const REFUND_CORRECTIONS: &[&str] = &["succeeded", "failed"];
/// `result` of `orderpay_reconciler_payments_total`.
pub const RECONCILER_RESULTS: &[&str] = &["settled", "redriven", "rescheduled", "stuck", "gave_up", "error"];
/// `result` of `orderpay_provider_webhooks_total`.
pub const PROVIDER_WEBHOOK_RESULTS: &[&str] =
    &["applied", "duplicate", "stale", "unknown", "mismatch", "rejected"];
/// `kind` of `orderpay_provider_errors_total`.
pub const PROVIDER_ERROR_KINDS: &[&str] = &["auth", "idempotency"];
/// `result` of `orderpay_webhook_deliveries_total`.
pub const WEBHOOK_DELIVERY_RESULTS: &[&str] = &["delivered", "failed", "gave_up"];
/// `result` of `orderpay_settlement_runs_total`.
pub const SETTLEMENT_RUN_RESULTS: &[&str] = &["clean", "exceptions", "failed"];

/// Every counter at 0 for each of its known label values (and the HTTP metrics for the scrape
/// itself, the one request known to come), so that each renders from start.
fn export_at_start() {
    let scrape = [("method", "GET"), ("route", "/metrics"), ("status", "200")];
    counter!("orderpay_http_requests_total", &scrape).increment(0);
    let _ = histogram!(HTTP_DURATION, &scrape);
    let labelled: [(&'static str, &'static str, &[&'static str]); 11] = [
        ("orderpay_idempotency_requests_total", "outcome", IDEMPOTENCY_OUTCOMES),
        ("orderpay_payments_settled_total", "status", PAYMENT_STATUSES),
        ("orderpay_refunds_settled_total", "status", REFUND_STATUSES),
        ("orderpay_refunds_corrected_total", "to", REFUND_CORRECTIONS),
        ("orderpay_guard_violations_total", "constraint", &crate::db::MONEY_GUARDS),
        ("orderpay_late_charges_total", "result", LATE_CHARGE_RESULTS),
        ("orderpay_reconciler_payments_total", "result", RECONCILER_RESULTS),
        ("orderpay_provider_webhooks_total", "result", PROVIDER_WEBHOOK_RESULTS),
        ("orderpay_provider_errors_total", "kind", PROVIDER_ERROR_KINDS),
        ("orderpay_webhook_deliveries_total", "result", WEBHOOK_DELIVERY_RESULTS),
        ("orderpay_settlement_runs_total", "result", SETTLEMENT_RUN_RESULTS),
    ];
    for (name, label, values) in labelled {
        for &value in values {
            counter!(name, label => value).increment(0);
        }
    }
    for outcome in crate::disputes::repository::RecordOutcome::ALL {
        counter!("orderpay_disputes_recorded_total", "result" => outcome.as_str()).increment(0);
    }
    for event_type in crate::events::EventType::ALL {
        counter!("orderpay_events_total", "type" => event_type.as_str()).increment(0);
    }
    for name in [
        "orderpay_idempotency_keys_swept_total",
        "orderpay_idempotency_audit_purged_total",
        "orderpay_reconciler_passes_total",
        "orderpay_nats_published_total",
        "orderpay_nats_duplicates_total",
        "orderpay_webhook_secret_errors_total",
    ] {
        counter!(name).increment(0);
    }
}

pub fn http_request(method: &str, route: &str, status: u16, seconds: f64) {
    let labels = [("method", method.to_owned()), ("route", route.to_owned()), ("status", status.to_string())];
    counter!("orderpay_http_requests_total", &labels).increment(1);
    histogram!(HTTP_DURATION, &labels).record(seconds);
}

/// `outcome`: executed, replayed, reused, in_use, takeover, missing.
pub fn idempotency_outcome(outcome: &'static str) {
    counter!("orderpay_idempotency_requests_total", "outcome" => outcome).increment(1);
}

/// `kind`: payment (later refunds, captures and voids).
pub fn operations_waiting(kind: &'static str, count: i64) {
    gauge!("orderpay_operations_waiting", "kind" => kind).set(count as f64);
}

pub fn keys_swept(count: usize) {
    counter!("orderpay_idempotency_keys_swept_total").increment(count as u64);
}

pub fn payment_settled(status: &'static str) {
    counter!("orderpay_payments_settled_total", "status" => status).increment(1);
}

pub fn disputes_evidence_due_soon(count: i64) {
    gauge!("orderpay_disputes_evidence_due_soon").set(count as f64);
}

pub fn late_charges_unrefunded(count: i64) {
    gauge!("orderpay_late_charges_unrefunded").set(count as f64);
}

/// The open settlement exceptions per category.
pub fn settlement_exceptions(counts: &std::collections::HashMap<crate::settlement::Category, i64>) {
    for (category, count) in counts {
        gauge!("orderpay_settlement_exceptions", "category" => category.as_str()).set(*count as f64);
    }
}

/// A settlement run finished (or failed: `report` is `None`).
pub fn settlement_run(report: Option<&crate::settlement::Report>) {
    let result = match report {
        None => "failed",
        Some(report) if report.exceptions() == 0 => "clean",
        Some(_) => "exceptions",
    };
    counter!("orderpay_settlement_runs_total", "result" => result).increment(1);
}

/// A provider call refused for a fault of ours: `kind` one of [`PROVIDER_ERROR_KINDS`].
pub fn provider_error(kind: &'static str) {
    counter!("orderpay_provider_errors_total", "kind" => kind).increment(1);
}

pub fn refund_corrected(to: &'static str) {
    counter!("orderpay_refunds_corrected_total", "to" => to).increment(1);
}

pub fn guard_violation(constraint: &'static str) {
    counter!("orderpay_guard_violations_total", "constraint" => constraint).increment(1);
}

/// `result`: refunded (a system refund of a charge that landed after its payment failed
/// succeeded), refund_failed (one failed), voided (a late authorization).
pub fn late_charge(result: &'static str) {
    counter!("orderpay_late_charges_total", "result" => result).increment(1);
}

/// Events written to the outbox, by type.
pub fn events_written<'a>(types: impl Iterator<Item = &'a str>) {
    for event_type in types {
        counter!("orderpay_events_total", "type" => event_type.to_owned()).increment(1);
    }
}

/// How old the oldest event `relay` has not handed on is.
pub fn outbox_lag(relay: &'static str, lag: std::time::Duration) {
    gauge!("orderpay_outbox_lag_seconds", "relay" => relay).set(lag.as_secs_f64());
}

/// One merchant webhook delivery attempt whose outcome was written: delivered, failed (to be
/// retried), gave_up (the last attempt failed).
pub fn webhook_delivery(result: &'static str) {
    counter!("orderpay_webhook_deliveries_total", "result" => result).increment(1);
}

/// One delivery not sent: its endpoint's secret opens under no key of `ORDERPAY_ENCRYPTION_KEY`.
pub fn webhook_secret_error() {
    counter!("orderpay_webhook_secret_errors_total").increment(1);
}

/// One batch's PubAcks: events stored, and events JetStream already had (dropped by their
/// `Nats-Msg-Id`).
pub fn nats_published(stored: u64, duplicates: u64) {
    counter!("orderpay_nats_published_total").increment(stored);
    counter!("orderpay_nats_duplicates_total").increment(duplicates);
}

pub fn refund_settled(status: &'static str) {
    counter!("orderpay_refunds_settled_total", "status" => status).increment(1);
}

/// One reconciler pass, with what it did: `(result, count)` pairs (settled, redriven,
/// rescheduled, stuck, gave_up, error).
pub fn reconciler_pass(results: &[(&'static str, usize)]) {
    counter!("orderpay_reconciler_passes_total").increment(1);
    for &(result, count) in results {
        if count > 0 {
            counter!("orderpay_reconciler_payments_total", "result" => result).increment(count as u64);
        }
    }
}

/// One provider webhook delivery: applied, duplicate, stale, unknown, rejected.
/// `result` of recording a dispute the provider reported: a [`RecordOutcome`]'s name (refused:
/// it broke the transition guard, ignored).
///
/// [`RecordOutcome`]: crate::disputes::repository::RecordOutcome
pub fn dispute_recorded(result: &'static str) {
    counter!("orderpay_disputes_recorded_total", "result" => result).increment(1);
}

pub fn provider_webhook(result: &'static str) {
    counter!("orderpay_provider_webhooks_total", "result" => result).increment(1);
}

pub fn pool_connections(in_use: u32, idle: u32) {
    gauge!("orderpay_db_pool_connections", "state" => "in_use").set(in_use as f64);
    gauge!("orderpay_db_pool_connections", "state" => "idle").set(idle as f64);
}

/// The most connections the process opens, over all its pools.
pub fn pool_max_connections(max: u32) {
    gauge!("orderpay_db_pool_max_connections").set(max as f64);
}

pub fn audit_purged(count: usize) {
    counter!("orderpay_idempotency_audit_purged_total").increment(count as u64);
}
