//! Tenancy and abuse limits: no endpoint lets one account reach another's data, and one
//! account's burst cannot starve the others.

use reqwest::Method;
use reqwest::header::HeaderValue;
use serde_json::json;

use crate::helpers::{assert_problem, json, new_key, spawn_app, spawn_app_with};

#[tokio::test]
async fn no_endpoint_crosses_accounts() {
    let app = spawn_app().await;
    let (_, intruder) = app.create_account("intruder").await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let paid_order = app.create_order().await["id"].as_str().unwrap().to_owned();
    let payment = json(app.pay(&paid_order, "pm_card_ok", &new_key()).await).await;
    let payment_id = payment["id"].as_str().unwrap().to_owned();

    // (method, path, body) x the intruder's key: every one a 404 or an empty page.
    let pay_mine = json!({"order_id": order_id, "payment_method": "pm_card_ok"});
    let matrix: Vec<(Method, String, Option<serde_json::Value>)> = vec![
        (Method::GET, format!("/orders/{order_id}"), None),
        (Method::POST, format!("/orders/{order_id}/cancel"), None),
        (Method::GET, format!("/payments/{payment_id}"), None),
        (Method::POST, "/payments".to_owned(), Some(pay_mine)),
    ];
    for (method, path, body) in matrix {
        let mut request = app.client.request(method.clone(), app.url(&path)).bearer_auth(&intruder);
        request = request.header("Idempotency-Key", new_key());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let problem = assert_problem(request.send().await.unwrap(), 404, "not-found").await;
        assert!(!problem.to_string().contains("cus_123"), "{method} {path} leaked data: {problem}");
    }
    let list =
        json(app.client.get(app.url("/orders?limit=100")).bearer_auth(&intruder).send().await.unwrap()).await;
    assert_eq!(list["data"], json!([]), "another account's orders are not listed");

    // Nothing changed for the owner, and nothing was charged for the intruder.
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    assert_eq!(app.provider.charges().await.len(), 1);
}

#[tokio::test]
async fn a_per_account_rate_limit_answers_429_and_spares_other_accounts() {
    let app = spawn_app_with(|settings, _| {
        settings.api.rate_limit = orderpay::rate_limit::RateLimit { per_second: 2, burst: 5 };
    })
    .await;
    let (_, other) = app.create_account("other").await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let response = app.request(Method::GET, "/orders").send().await.unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == 429 {
            let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
            assert!(retry_after >= 1);
            assert_problem(response, 429, "rate-limited").await;
        }
    }
    assert_eq!(statuses.iter().filter(|&&status| status == 200).count(), 5, "{statuses:?}");
    assert!(statuses[5..].iter().all(|&status| status == 429), "{statuses:?}");
    let others = app.client.get(app.url("/orders")).bearer_auth(&other).send().await.unwrap();
    assert_eq!(others.status(), 200, "another account keeps its own budget");
}

#[tokio::test]
async fn two_authorization_headers_are_a_bad_request() {
    let app = spawn_app().await;
    let (_, other) = app.create_account("other").await;
    let mine = format!("Bearer {}", app.api_key);
    let theirs = format!("Bearer {other}");
    let pairs = [
        (mine.as_str(), "Bearer sk_wrong"),
        ("Bearer sk_wrong", mine.as_str()),
        (mine.as_str(), theirs.as_str()),
        (mine.as_str(), mine.as_str()),
    ];
    for (first, second) in pairs {
        for (method, path) in [(Method::GET, "/orders"), (Method::POST, "/orders")] {
            let mut request = app
                .client
                .request(method.clone(), app.url(path))
                .header("Authorization", first)
                .header("Authorization", second);
            if method == Method::POST {
                request = request.json(&crate::helpers::order_body());
            }
            let problem = assert_problem(request.send().await.unwrap(), 400, "bad-request").await;
            assert!(problem["detail"].as_str().unwrap().contains("one Authorization header"), "{problem}");
        }
    }
    assert_eq!(app.orders_stored().await, 0);
}

#[tokio::test]
async fn only_a_valid_idempotency_key_is_echoed() {
    let app = spawn_app().await;
    let echo = |response: &reqwest::Response| {
        response
            .headers()
            .get_all("idempotency-key")
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect::<Vec<_>>()
    };
    let invalid: Vec<HeaderValue> = vec![
        HeaderValue::from_static("has space"),
        HeaderValue::from_static("\"unterminated"),
        HeaderValue::from_bytes("clé".as_bytes()).unwrap(),
        HeaderValue::from_bytes(&[b'k', 0xff, b'\t', b'x']).unwrap(),
        HeaderValue::from_str(&"k".repeat(256)).unwrap(),
    ];
    for key in invalid {
        let response = app
            .request(Method::POST, "/orders")
            .header("Idempotency-Key", key.clone())
            .json(&crate::helpers::order_body())
            .send()
            .await
            .unwrap();
        assert!(echo(&response).is_empty(), "{key:?} echoed as {:?}", echo(&response));
        assert_problem(response, 400, "idempotency-key-invalid").await;
    }
    let two_keys = app
        .request(Method::POST, "/orders")
        .header("Idempotency-Key", "first")
        .header("Idempotency-Key", "second")
        .json(&crate::helpers::order_body())
        .send()
        .await
        .unwrap();
    assert!(echo(&two_keys).is_empty(), "{:?}", echo(&two_keys));
    assert_problem(two_keys, 400, "idempotency-key-invalid").await;
    // A valid key is echoed as sent, on success and on failure alike.
    let quoted = format!("\"{}\"", new_key());
    let created = app.post_order(&crate::helpers::order_body(), Some(&quoted)).await;
    assert_eq!(created.status(), 201);
    assert_eq!(echo(&created), [quoted.as_bytes().to_vec()]);
    let refused = app.post_order(&json!({"currency": "XYZ"}), Some("a-valid-key")).await;
    assert_eq!(echo(&refused), [b"a-valid-key".to_vec()]);
    assert_problem(refused, 422, "validation-failed").await;
}
