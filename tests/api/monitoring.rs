//! The dashboards and alerts in deploy/ name only metrics the service exports.

use std::collections::BTreeSet;

use orderpay::telemetry::metrics::{DESCRIBED, Kind};

use crate::helpers::{new_key, order_body, spawn_app};

const USERS: [&str; 2] = ["deploy/prometheus/alerts.yml", "deploy/grafana/orderpay.json"];

/// Every `orderpay_...` metric name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("orderpay_") {
        // A name starts at a word boundary (not inside `my_orderpay_x`).
        let boundary =
            rest[..at].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if boundary {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The series names a metric renders as.
fn rendered_as(name: &str, kind: Kind) -> Vec<String> {
    match kind {
        Kind::Counter | Kind::Gauge => vec![name.to_owned()],
        Kind::Histogram => {
            ["_bucket", "_sum", "_count"].iter().map(|suffix| format!("{name}{suffix}")).collect()
        }
    }
}

#[tokio::test]
async fn dashboards_and_alerts_use_only_metrics_the_service_exports() {
    // Exercise the app so that what it records renders: requests, keys, a payment, a replay,
    // a reconciler pass, a sweep, the pool gauges.
    let app = spawn_app().await;
    let key = new_key();
    app.post_order(&order_body(), Some(&key)).await;
    app.post_order(&order_body(), Some(&key)).await;
    let order = app.create_order().await;
    app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &new_key()).await;
    app.reconcile_once().await;
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let rendered: BTreeSet<String> = metrics
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next().map(str::to_owned))
        .collect();
    for expected in [
        "orderpay_http_requests_total",
        "orderpay_idempotency_requests_total",
        "orderpay_db_pool_connections",
    ] {
        assert!(rendered.contains(expected), "{expected} not in /metrics:\n{metrics}");
    }

    // What renders, plus what is declared (a metric renders only once it has a value).
    let mut exported = rendered.clone();
    for &(name, kind, _) in DESCRIBED {
        exported.extend(rendered_as(name, kind));
    }
    // Every rendered metric is declared, so the declared list is the whole truth.
    let declared: BTreeSet<String> =
        DESCRIBED.iter().flat_map(|&(name, kind, _)| rendered_as(name, kind)).collect();
    let undeclared: Vec<&String> = rendered.iter().filter(|name| !declared.contains(*name)).collect();
    assert!(undeclared.is_empty(), "rendered but not in metrics::DESCRIBED: {undeclared:?}");

    let root = env!("CARGO_MANIFEST_DIR");
    for file in USERS {
        let text =
            std::fs::read_to_string(format!("{root}/{file}")).unwrap_or_else(|e| panic!("{file}: {e}"));
        let used = names_in(&text);
        assert!(used.len() >= 5, "{file} names only {used:?}");
        let unknown: Vec<&String> = used.iter().filter(|name| !exported.contains(*name)).collect();
        assert!(unknown.is_empty(), "{file} uses metrics the service does not export: {unknown:?}");
    }
    // The two the outbox will record are declared under their final names.
    for planned in ["orderpay_webhook_deliveries_total", "orderpay_outbox_lag_seconds"] {
        assert!(declared.contains(planned), "{planned} is not declared");
    }
}

#[test]
fn metric_names_are_found_in_promql_and_json() {
    let text = r#"sum(rate(orderpay_http_requests_total{status=~"5.."}[5m])) / x_orderpay_y "orderpay_outbox_lag_seconds""#;
    let names: Vec<String> = names_in(text).into_iter().collect();
    assert_eq!(names, ["orderpay_http_requests_total", "orderpay_outbox_lag_seconds"]);
}
