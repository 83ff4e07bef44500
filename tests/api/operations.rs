//! Operating orderpay: metrics, request ids and logs, graceful shutdown, two instances on one
//! database.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, http_client, json, new_key, order_body, spawn_app};
use crate::process::ServiceProcess;

#[tokio::test]
async fn metrics_count_requests_idempotency_payments_and_pools() {
    let app = spawn_app().await;
    let key = new_key();
    let order = json(app.post_order(&order_body(), Some(&key)).await).await;
    app.post_order(&order_body(), Some(&key)).await;
    let mut other = order_body();
    other["currency"] = json!("EUR");
    app.post_order(&other, Some(&key)).await;
    let paid = app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &new_key()).await;
    assert_eq!(paid.status(), 201);

    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = response.text().await.unwrap();
    for expected in [
        r#"orderpay_http_requests_total{method="POST",route="/orders",status="201"} 2"#,
        r#"orderpay_http_requests_total{method="POST",route="/orders",status="422"} 1"#,
        r#"orderpay_idempotency_requests_total{outcome="executed"} 2"#,
        r#"orderpay_idempotency_requests_total{outcome="replayed"} 1"#,
        r#"orderpay_idempotency_requests_total{outcome="reused"} 1"#,
        r#"orderpay_payments_settled_total{status="succeeded"} 1"#,
        r#"orderpay_operations_waiting{kind="payment"} 0"#,
        r#"orderpay_http_request_duration_seconds_bucket{method="POST",route="/payments",status="201",le="+Inf"} 1"#,
        r#"orderpay_db_pool_connections{state="in_use"}"#,
    ] {
        assert!(text.contains(expected), "missing {expected} in:\n{text}");
    }
}

#[tokio::test]
async fn every_request_has_an_id_that_reaches_the_provider() {
    let app = spawn_app().await;
    let generated = app.client.get(app.url("/healthz")).send().await.unwrap();
    let id = generated.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(uuid::Uuid::parse_str(id).unwrap().get_version_num(), 7);

    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let paid = app
        .request(Method::POST, "/payments")
        .header("Idempotency-Key", new_key())
        .header("X-Request-Id", "checkout-7f3a")
        .json(&json!({"order_id": order_id, "payment_method": "pm_card_ok"}))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.headers()["x-request-id"], "checkout-7f3a");
    let charges = app.provider.charges().await;
    assert_eq!(charges[0]["request_id"], "checkout-7f3a", "forwarded to the provider");

    let junk = app.client.get(app.url("/healthz")).header("X-Request-Id", "has spaces").send().await.unwrap();
    assert_ne!(junk.headers()["x-request-id"], "has spaces", "an unusable id is replaced");
}

/// Starts the subprocess with JSON logs at debug level written to a file; returns it and the path.
async fn logged_service(app: &TestApp, env: &[(&str, &str)]) -> (ServiceProcess, std::path::PathBuf) {
    let log = std::env::temp_dir().join(format!("orderpay-test-{}.log", uuid::Uuid::now_v7()));
    let mut all = vec![("ORDERPAY_LOG_FORMAT", "json"), ("RUST_LOG", "debug")];
    all.extend_from_slice(env);
    let service =
        ServiceProcess::start_logging_to(&app.database_url, &app.provider.address, &all, Some(&log)).await;
    (service, log)
}

#[tokio::test]
async fn logs_are_json_carry_the_request_id_and_hold_no_secrets() {
    let app = spawn_app().await;
    let (mut service, log) = logged_service(&app, &[]).await;
    let client = http_client();
    let order = client
        .post(format!("{}/orders", service.address))
        .bearer_auth(&app.api_key)
        .header("X-Request-Id", "req-order-1")
        .json(&order_body())
        .send()
        .await
        .unwrap();
    let order_id = json(order).await["id"].as_str().unwrap().to_owned();
    let paid = client
        .post(format!("{}/payments", service.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", new_key())
        .header("X-Request-Id", "req-pay-1")
        .json(&json!({"order_id": order_id, "payment_method": "pm_card_ok"}))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 201);
    client.get(format!("{}/orders", service.address)).bearer_auth("sk_wrong_key_123").send().await.unwrap();
    service.terminate();
    assert!(service.wait_exit(Duration::from_secs(10)).await.is_some());

    let logs = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let lines: Vec<Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    let of_request = |id: &str| lines.iter().filter(|l| l["span"]["request_id"] == id).count();
    assert!(of_request("req-order-1") >= 1, "{logs}");
    let payment_lines: Vec<&Value> =
        lines.iter().filter(|l| l["span"]["request_id"] == "req-pay-1").collect();
    assert!(
        payment_lines.iter().any(|l| l["fields"]["message"] == "payment settled"),
        "the payment task's lines carry the request id too:\n{logs}"
    );
    for secret in [app.api_key.as_str(), "sk_wrong_key_123", "pm_card_ok"] {
        assert!(!logs.contains(secret), "{secret} appears in the logs");
    }
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_exits_cleanly() {
    let app = spawn_app().await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let mut service = ServiceProcess::start(
        &app.database_url,
        &app.provider.address,
        &[("ORDERPAY_PROVIDER_TIMEOUT_MS", "1500"), ("ORDERPAY_PAYMENT_LEASE_MS", "3000")],
    )
    .await;
    // pm_provider_timeout: the provider holds the answer, so the request takes the full 1.5 s.
    let request = http_client()
        .post(format!("{}/payments", service.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({"order_id": order_id, "payment_method": "pm_provider_timeout"}))
        .send();
    let in_flight = tokio::spawn(request);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let signalled = Instant::now();
    service.terminate();

    let answer = in_flight.await.unwrap().expect("the in-flight request gets its answer");
    assert_eq!(answer.status(), 202);
    let status = service.wait_exit(Duration::from_secs(10)).await.expect("exits within the grace period");
    assert!(status.success(), "exit status {status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(10));
    // New connections are refused once it has stopped.
    assert!(http_client().get(format!("{}/healthz", service.address)).send().await.is_err());
}

#[tokio::test]
async fn two_instances_on_one_database_keep_exactly_once() {
    let app = spawn_app().await;
    let fast_reconciler = [
        ("ORDERPAY_RECONCILE_INTERVAL_MS", "100"),
        ("ORDERPAY_RECONCILE_BACKOFF_BASE_MS", "100"),
        ("ORDERPAY_RECONCILE_BACKOFF_CAP_MS", "200"),
        ("ORDERPAY_PAYMENT_LEASE_MS", "2000"),
        ("ORDERPAY_PROVIDER_TIMEOUT_MS", "1000"),
    ];
    let a = ServiceProcess::start(&app.database_url, &app.provider.address, &fast_reconciler).await;
    let b = ServiceProcess::start(&app.database_url, &app.provider.address, &fast_reconciler).await;
    let instances = [a.address.clone(), b.address.clone()];
    let client = http_client();

    // Orders: 30 keys, each sent 4 times, alternating instances.
    let keys: Vec<String> = (0..30).map(|_| new_key()).collect();
    let sends = (0..4).flat_map(|copy| keys.iter().enumerate().map(move |(i, key)| (copy + i, key)));
    let answers = join_all(sends.map(|(n, key)| {
        let request = client
            .post(format!("{}/orders", instances[n % 2]))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&order_body())
            .send();
        async move {
            let response = request.await.unwrap();
            assert_eq!(response.status(), 201);
            (key.clone(), json(response).await["id"].as_str().unwrap().to_owned())
        }
    }))
    .await;
    let distinct: HashSet<(String, String)> = answers.into_iter().collect();
    assert_eq!(distinct.len(), 30, "one order per key across both instances");
    assert_eq!(app.orders_stored().await, 30);

    // Payments: 10 orders, each paid with one key sent 3 times to each instance at once, with
    // pending charges that both instances' reconcilers race to settle.
    let order_ids: Vec<String> = distinct.iter().take(10).map(|(_, id)| id.clone()).collect();
    let storm = order_ids.iter().flat_map(|order_id| {
        let key = new_key();
        (0..6).map(move |n| (order_id.clone(), key.clone(), n))
    });
    let answers = join_all(storm.map(|(order_id, key, n)| {
        client
            .post(format!("{}/payments", instances[n % 2]))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&json!({"order_id": order_id, "payment_method": "pm_provider_pending"}))
            .send()
    }))
    .await;
    for answer in answers {
        let status = answer.unwrap().status().as_u16();
        assert!([201, 202, 409].contains(&status), "status {status}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.count("SELECT count(*) AS count FROM payments WHERE status = 'succeeded'").await < 10 {
        assert!(Instant::now() < deadline, "the reconcilers did not settle every payment");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.payments_stored().await, 10, "one payment per order");
    let transitions = app.count("SELECT count(*) AS count FROM payment_events").await;
    assert_eq!(transitions, 10, "each payment settled exactly once");
    let charges = app.provider.charges().await;
    assert_eq!(charges.len(), 10, "one charge per order");
    for order_id in &order_ids {
        assert_eq!(app.order_status(order_id).await, "paid");
    }
    drop((a, b));
}

#[tokio::test]
async fn the_docs_page_and_its_renderer_are_served_locally() {
    let app = spawn_app().await;
    let page = app.client.get(app.url("/docs")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(!html.contains("https://"), "no CDN: {html}");
    for asset in ["/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/docs/init.js"] {
        assert!(html.contains(asset), "{asset} not referenced");
        let response = app.client.get(app.url(asset)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{asset}");
    }
    let missing = app.client.get(app.url("/docs/nothing.js")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}
