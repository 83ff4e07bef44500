//! Orders: create, read, list, cancel, authentication and account scoping.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{assert_problem, json, new_key, order_body, spawn_app};

#[tokio::test]
async fn create_returns_the_order_with_exact_totals_and_a_location() {
    let app = spawn_app().await;
    let response = app.post_order(&order_body(), None).await;
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let order = json(response).await;
    assert_eq!(location, format!("/orders/{}", order["id"].as_str().unwrap()));
    assert_eq!(order["status"], "pending_payment");
    assert_eq!(order["currency"], "USD");
    assert_eq!(order["total_amount"], "48.48");
    assert_eq!(order["items"][0]["amount"], "39.98");
    assert_eq!(order["items"][1]["unit_price"], "8.50");
    assert_eq!(order["customer_id"], "cus_123");
    assert_eq!(order["metadata"], json!({ "channel": "ios" }));
    let id = uuid::Uuid::parse_str(order["id"].as_str().unwrap()).unwrap();
    assert_eq!(id.get_version_num(), 7, "ids are UUIDv7");

    let fetched = json(app.get_order(order["id"].as_str().unwrap()).await).await;
    assert_eq!(fetched, order, "a read returns what the create answered");
}

#[tokio::test]
async fn json_number_prices_are_parsed_exactly_and_minor_units_respected() {
    let app = spawn_app().await;
    // 0.1 is not representable in binary floating point; the total must still be exactly 0.30.
    let body = r#"{"currency":"USD","items":[{"sku":"a","quantity":3,"unit_price":0.1}]}"#;
    let order = json(app.post_order_raw(body, None).await).await;
    assert_eq!(order["total_amount"], "0.30");

    let yen = json!({"currency": "jpy", "items": [{"sku": "a", "quantity": 2, "unit_price": "1500"}]});
    let order = json(app.post_order(&yen, None).await).await;
    assert_eq!(order["currency"], "JPY");
    assert_eq!(order["total_amount"], "3000");

    let dinar = json!({"currency": "KWD", "items": [{"sku": "a", "quantity": 1, "unit_price": "1.234"}]});
    assert_eq!(json(app.post_order(&dinar, None).await).await["total_amount"], "1.234");
}

#[tokio::test]
async fn orders_list_newest_first_with_a_cursor() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let order = json(app.post_order(&order_body(), None).await).await;
        ids.push(order["id"].as_str().unwrap().to_owned());
    }
    let page = json(app.request(Method::GET, "/orders?limit=2").send().await.unwrap()).await;
    let listed: Vec<&str> =
        page["data"].as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [ids[2].as_str(), ids[1].as_str()]);
    assert_eq!(page["has_more"], true);

    let path = format!("/orders?limit=2&starting_after={}", ids[1]);
    let page = json(app.request(Method::GET, &path).send().await.unwrap()).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    assert_eq!(page["data"][0]["id"], ids[0].as_str());
    assert_eq!(page["data"][0]["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["has_more"], false);

    let page = json(app.request(Method::GET, "/orders").send().await.unwrap()).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 3, "default limit is 10");
}

#[tokio::test]
async fn bad_list_parameters_are_400() {
    let app = spawn_app().await;
    for query in ["limit=0", "limit=101", "limit=ten", "starting_after=nope", "colour=red"] {
        let response = app.request(Method::GET, &format!("/orders?{query}")).send().await.unwrap();
        assert_problem(response, 400, "invalid-parameter").await;
    }
}

#[tokio::test]
async fn unknown_or_malformed_order_ids_are_404() {
    let app = spawn_app().await;
    assert_problem(app.get_order(&uuid::Uuid::now_v7().to_string()).await, 404, "not-found").await;
    assert_problem(app.get_order("not-a-uuid").await, 404, "not-found").await;
    assert_problem(app.cancel_order("not-a-uuid", None).await, 404, "not-found").await;
}

#[tokio::test]
async fn cancel_moves_pending_to_cancelled_once() {
    let app = spawn_app().await;
    let order = json(app.post_order(&order_body(), None).await).await;
    let id = order["id"].as_str().unwrap();

    let response = app.cancel_order(id, None).await;
    assert_eq!(response.status(), 200);
    let cancelled = json(response).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["total_amount"], order["total_amount"]);

    let problem = assert_problem(app.cancel_order(id, None).await, 409, "invalid-state").await;
    assert_eq!(problem["current_state"], "cancelled");
    assert!(problem["detail"].as_str().unwrap().contains("cancelled"), "{problem}");
    assert_eq!(json(app.get_order(id).await).await["status"], "cancelled");
}

#[tokio::test]
async fn cancel_with_a_key_replays_its_answer_even_the_refusal() {
    let app = spawn_app().await;
    let order = json(app.post_order(&order_body(), None).await).await;
    let id = order["id"].as_str().unwrap();
    let key = new_key();

    let first = app.cancel_order(id, Some(&key)).await;
    assert_eq!(first.status(), 200);
    let first_body = first.text().await.unwrap();
    let replay = app.cancel_order(id, Some(&key)).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), first_body);

    // A new key meets the terminal state: 409, stored with that key and replayed as such.
    let other_key = new_key();
    let refused = app.cancel_order(id, Some(&other_key)).await;
    let refused_body = assert_problem(refused, 409, "invalid-state").await;
    let replayed = app.cancel_order(id, Some(&other_key)).await;
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(assert_problem(replayed, 409, "invalid-state").await, refused_body);
}

#[tokio::test]
async fn cancel_accepts_an_empty_object_and_refuses_unknown_fields() {
    let app = spawn_app().await;
    let id = json(app.post_order(&order_body(), None).await).await["id"].as_str().unwrap().to_owned();
    let unknown = app
        .request(Method::POST, &format!("/orders/{id}/cancel"))
        .json(&json!({"reason": "changed my mind"}))
        .send()
        .await
        .unwrap();
    assert_problem(unknown, 422, "validation-failed").await;
    let empty_object =
        app.request(Method::POST, &format!("/orders/{id}/cancel")).json(&json!({})).send().await.unwrap();
    assert_eq!(empty_object.status(), 200);
}

#[tokio::test]
async fn requests_without_a_valid_api_key_are_401() {
    let app = spawn_app().await;
    let no_auth = app.client.get(app.url("/orders")).send().await.unwrap();
    assert_eq!(no_auth.headers()["www-authenticate"], "Bearer");
    assert_problem(no_auth, 401, "unauthorized").await;
    let unknown = app.client.get(app.url("/orders")).bearer_auth("sk_0000").send().await.unwrap();
    assert_problem(unknown, 401, "unauthorized").await;
    let wrong_scheme =
        app.client.get(app.url("/orders")).basic_auth(&app.api_key, Some("")).send().await.unwrap();
    assert_problem(wrong_scheme, 401, "unauthorized").await;
    let create = app.client.post(app.url("/orders")).json(&order_body()).send().await.unwrap();
    assert_problem(create, 401, "unauthorized").await;
    assert_eq!(app.orders_stored().await, 0);
}

#[tokio::test]
async fn another_accounts_orders_are_invisible() {
    let app = spawn_app().await;
    let (_, other_key) = app.create_account("other").await;
    let order = json(app.post_order(&order_body(), None).await).await;
    let id = order["id"].as_str().unwrap();

    let read =
        app.client.get(app.url(&format!("/orders/{id}"))).bearer_auth(&other_key).send().await.unwrap();
    assert_problem(read, 404, "not-found").await;
    let cancel = app
        .client
        .post(app.url(&format!("/orders/{id}/cancel")))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap();
    assert_problem(cancel, 404, "not-found").await;
    let list = json(app.client.get(app.url("/orders")).bearer_auth(&other_key).send().await.unwrap()).await;
    assert_eq!(list["data"], json!([]));
    assert_eq!(json(app.get_order(id).await).await["status"], "pending_payment");
}

#[tokio::test]
async fn health_readiness_and_the_spec_need_no_auth() {
    let app = spawn_app().await;
    let health = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(json(ready).await["status"], "ready");
    let spec = app.client.get(app.url("/openapi.yaml")).send().await.unwrap();
    assert_eq!(spec.status(), 200);
    assert!(spec.text().await.unwrap().contains("openapi: 3."));
}
