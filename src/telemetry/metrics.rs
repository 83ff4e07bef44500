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
//! | `orderpay_events_total` | counter | `type`: events written to the outbox |
//! | `orderpay_outbox_lag_seconds` | gauge | `relay` (webhooks, nats): age of the oldest event the relay has not handed on |
//! | `orderpay_late_charges_total` | counter | `result`: refunded, voided (charges that landed after their payment was given up on) |
//! | `orderpay_reconciler_passes_total` | counter | |
//! | `orderpay_reconciler_payments_total` | counter | `result`: settled, redriven, rescheduled, stuck, gave_up, error |
//! | `orderpay_provider_webhooks_total` | counter | `result`: applied (moved an operation), duplicate (an event already received), stale (nothing to move: the operation had settled, or the event reports no final state), unknown (no operation of ours), rejected (refused: signature, size, body) |
//! | `orderpay_db_pool_connections` | gauge | `state`: in_use, idle (read at scrape) |

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
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!("orderpay_http_requests_total", "HTTP requests by method, route and status");
    describe_histogram!(HTTP_DURATION, metrics::Unit::Seconds, "HTTP request latency");
    describe_counter!("orderpay_idempotency_requests_total", "Keyed requests by idempotency outcome");
    describe_gauge!(
        "orderpay_operations_waiting",
        "Provider operations with an unknown outcome that no driver holds"
    );
    describe_counter!(
        "orderpay_idempotency_keys_swept_total",
        "Expired idempotency keys deleted by the sweeper"
    );
    describe_counter!("orderpay_payments_settled_total", "Payments whose charge or authorization settled");
    describe_counter!("orderpay_refunds_settled_total", "Refunds moved to a final status");
    describe_counter!("orderpay_events_total", "Events written to the outbox, by type");
    describe_gauge!("orderpay_outbox_lag_seconds", "Age of the oldest event a relay has not handed on");
    describe_counter!(
        "orderpay_late_charges_total",
        "Charges that landed after their payment was given up on, refunded or voided by the system"
    );
    describe_counter!("orderpay_reconciler_passes_total", "Reconciler passes run");
    describe_counter!("orderpay_reconciler_payments_total", "Payments handled by the reconciler, by result");
    describe_counter!("orderpay_provider_webhooks_total", "Provider webhook deliveries, by what they did");
    describe_gauge!("orderpay_db_pool_connections", "Database connections by state");
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

/// `result`: refunded (a charge that landed after its payment was given up on, refunded by the
/// system), voided (a late authorization).
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
pub fn provider_webhook(result: &'static str) {
    counter!("orderpay_provider_webhooks_total", "result" => result).increment(1);
}

pub fn pool_connections(in_use: u32, idle: u32) {
    gauge!("orderpay_db_pool_connections", "state" => "in_use").set(in_use as f64);
    gauge!("orderpay_db_pool_connections", "state" => "idle").set(idle as f64);
}
