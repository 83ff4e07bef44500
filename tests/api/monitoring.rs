//! The dashboards and alerts in deploy/ name only metrics the service exports.

use std::collections::BTreeSet;

use std::time::Duration;

use orderpay::telemetry::metrics::{self, DESCRIBED, Kind};

use crate::helpers::{assert_problem, new_key, order_body, spawn_app, spawn_app_with, test_webhook_settings};
use crate::process::ServiceProcess;

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

/// The series a `/metrics` text renders: `name{labels}` (or `name`) with their values.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.rsplit_once(' ').map(|(series, _value)| series.to_owned()))
        .collect()
}

/// The metrics of the table in docs/operations.md's "Metrics" section.
fn documented() -> BTreeSet<String> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let section = page.split("\n## Metrics\n").nth(1).expect("a Metrics section in docs/operations.md");
    let section = section.split("\n#").next().unwrap();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_fresh_app_exports_every_documented_metric_before_its_first_event() {
    // Nothing has happened yet: no request but the scrape, no event, no reconciler pass, no
    // delivery. Every documented metric is there all the same, so that dashboards draw it and an
    // alert on its absence means what it says.
    let app = spawn_app_with(|settings, _| settings.webhooks = Some(test_webhook_settings())).await;
    let text = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let rendered = series(&text);
    let names: BTreeSet<String> =
        rendered.iter().map(|series| series.split('{').next().unwrap().to_owned()).collect();

    let declared: BTreeSet<String> = DESCRIBED.iter().map(|&(name, _, _)| name.to_owned()).collect();
    assert_eq!(
        documented(),
        declared,
        "docs/operations.md's table and metrics::DESCRIBED list the same metrics"
    );
    for &(name, kind, _) in DESCRIBED {
        for series_name in rendered_as(name, kind) {
            assert!(names.contains(&series_name), "{series_name} not exported from start:\n{text}");
        }
    }
    // Counters at 0 for each of their known label values.
    let known: [(&str, &str, &[&str]); 7] = [
        ("orderpay_idempotency_requests_total", "outcome", metrics::IDEMPOTENCY_OUTCOMES),
        ("orderpay_payments_settled_total", "status", metrics::PAYMENT_STATUSES),
        ("orderpay_refunds_settled_total", "status", metrics::REFUND_STATUSES),
        ("orderpay_late_charges_total", "result", metrics::LATE_CHARGE_RESULTS),
        ("orderpay_reconciler_payments_total", "result", metrics::RECONCILER_RESULTS),
        ("orderpay_provider_webhooks_total", "result", metrics::PROVIDER_WEBHOOK_RESULTS),
        ("orderpay_webhook_deliveries_total", "result", metrics::WEBHOOK_DELIVERY_RESULTS),
    ];
    for (name, label, values) in known {
        for value in values {
            let expected = format!("{name}{{{label}=\"{value}\"}} 0");
            assert!(text.lines().any(|line| line == expected), "{expected} not in /metrics:\n{text}");
        }
    }
    for event_type in orderpay::events::EventType::ALL {
        let expected = format!("orderpay_events_total{{type=\"{}\"}} 0", event_type.as_str());
        assert!(text.lines().any(|line| line == expected), "{expected} not in /metrics");
    }
    assert!(text.lines().any(|line| line == "orderpay_outbox_lag_seconds{relay=\"webhooks\"} 0"), "{text}");
}

#[tokio::test]
async fn malformed_client_input_is_logged_at_debug_never_at_error() {
    // Bytes that are no HTTP, from anyone: actix-http answers 400 and used to log it at ERROR,
    // which pages an operator. It is said at debug now, under the service's own target.
    let app = spawn_app().await;
    let log = std::env::temp_dir().join(format!("orderpay-client-input-{}.log", uuid::Uuid::now_v7()));
    let env = [("ORDERPAY_LOG_FORMAT", "json"), ("RUST_LOG", "info,orderpay::http::client_input=debug")];
    let service =
        ServiceProcess::start_logging_to(&app.database_url, &app.provider.address, &env, Some(&log)).await;
    let address = service.address.trim_start_matches("http://").to_owned();
    let answers = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        [
            &b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        ]
        .map(|garbage| {
            let mut stream = std::net::TcpStream::connect(&address).unwrap();
            stream.write_all(garbage).unwrap();
            crate::helpers::read_until_closed(&mut stream, Duration::from_secs(5)).status()
        })
    })
    .await
    .unwrap();
    assert_eq!(answers, [Some(400), Some(400)], "answered by actix-http");

    let text = crate::helpers::eventually("both refusals logged", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let said = text.lines().filter(|line| line.contains("client input refused by actix-http")).count();
        std::future::ready((said >= 2).then_some(text))
    })
    .await;
    drop(service);
    let _ = std::fs::remove_file(&log);
    for line in text.lines() {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert_ne!(entry["level"], "ERROR", "{line}");
        if line.contains("client input refused by actix-http") {
            assert_eq!(entry["level"], "DEBUG", "{line}");
            assert_eq!(entry["target"], orderpay::telemetry::CLIENT_INPUT_TARGET, "{line}");
        }
    }
}

#[tokio::test]
async fn metrics_move_to_their_own_address_when_one_is_set_and_stay_on_the_api_otherwise() {
    // Unset: on the API's address, as before.
    let app = spawn_app().await;
    let on_api = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(on_api.status(), 200);
    assert!(on_api.text().await.unwrap().contains("orderpay_db_pool_max_connections"));

    // Set: there only. A real `serve`, configured by its environment as in production.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics_address = format!("127.0.0.1:{port}");
    let env = [("ORDERPAY_METRICS_LISTEN", metrics_address.as_str())];
    let service = ServiceProcess::start(&app.database_url, &app.provider.address, &env).await;
    let gone = app.client.get(format!("{}/metrics", service.address)).send().await.unwrap();
    assert_problem(gone, 404, "route-not-found").await;
    let scrape = async || {
        let response = app.client.get(format!("http://{metrics_address}/metrics")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        response.text().await.unwrap()
    };
    let first = scrape().await;
    assert!(first.contains("orderpay_db_pool_max_connections"), "{first}");
    // The scrapes are requests like any other (counted, logged with a request id)...
    let second = scrape().await;
    let counted = second
        .lines()
        .find_map(|line| {
            line.strip_prefix(r#"orderpay_http_requests_total{method="GET",route="/metrics",status="200"} "#)
        })
        .map(|value| value.parse::<f64>().unwrap());
    assert!(counted.is_some_and(|count| count >= 1.0), "{second}");
    // ...and the API is not served there.
    let no_api = app.client.get(format!("http://{metrics_address}/orders")).send().await.unwrap();
    assert_problem(no_api, 404, "route-not-found").await;
    let api = app.client.get(format!("{}/healthz", service.address)).send().await.unwrap();
    assert_eq!(api.status(), 200, "the API answers on its own address");
}

#[test]
fn metric_names_are_found_in_promql_and_json() {
    let text = r#"sum(rate(orderpay_http_requests_total{status=~"5.."}[5m])) / x_orderpay_y "orderpay_outbox_lag_seconds""#;
    let names: Vec<String> = names_in(text).into_iter().collect();
    assert_eq!(names, ["orderpay_http_requests_total", "orderpay_outbox_lag_seconds"]);
}
