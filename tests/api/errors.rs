//! Bad input of every kind gets a 4xx problem+json and stores nothing.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{assert_problem, new_key, order_body, spawn_app};

/// The valid order body with one top-level field set to `value`; the field the error names.
fn top(field: &str, value: Value) -> (Value, String) {
    let mut body = order_body();
    body[field] = value;
    (body, field.to_owned())
}

/// The valid order body with `items[0].<field>` set to `value`; the field the error names.
fn item(field: &str, value: Value) -> (Value, String) {
    let mut body = order_body();
    body["items"][0][field] = value;
    (body, format!("items[0].{field}"))
}

fn number(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn items(list: Value, field: &str) -> (Value, String) {
    let (body, _) = top("items", list);
    (body, field.to_owned())
}

#[tokio::test]
async fn bad_bodies_are_refused_and_nothing_is_stored() {
    let app = spawn_app().await;
    let line = |sku: &str, price: &str| json!({"sku": sku, "quantity": 1, "unit_price": price});
    let max = "999999999999999";
    let too_many: Vec<Value> = (0..101).map(|i| line(&format!("s{i}"), "1")).collect();
    let mut no_currency = order_body();
    no_currency.as_object_mut().unwrap().remove("currency");
    let mut yen_with_cents = order_body();
    yen_with_cents["currency"] = json!("JPY");
    yen_with_cents["items"] = json!([line("a", "19.5")]);
    let cases: Vec<(&str, (Value, String))> = vec![
        ("empty items", items(json!([]), "items")),
        ("101 items", items(json!(too_many), "items")),
        ("zero quantity", item("quantity", json!(0))),
        ("negative quantity", item("quantity", json!(-1))),
        ("huge quantity", item("quantity", json!(10_001))),
        ("quantity beyond i64", item("quantity", number("1e30"))),
        ("fractional quantity", item("quantity", number("1.5"))),
        ("unknown currency", top("currency", json!("XYZ"))),
        ("malformed currency", top("currency", json!("US"))),
        ("missing currency", (no_currency, "currency".to_owned())),
        ("negative price", item("unit_price", json!("-1.00"))),
        ("sub-minor-unit price", item("unit_price", json!("1.001"))),
        ("yen with cents", (yen_with_cents, "items[0].unit_price".to_owned())),
        ("price not a number", item("unit_price", json!("abc"))),
        ("price as boolean", item("unit_price", json!(true))),
        ("price exponent overflow", item("unit_price", number("1e400"))),
        ("huge price", item("unit_price", json!("1000000000000000"))),
        (
            "overflowing line",
            items(json!([{"sku": "a", "quantity": 10000, "unit_price": max}]), "items[0].unit_price"),
        ),
        ("overflowing total", items(json!([line("a", max), line("b", max)]), "items")),
        ("empty sku", item("sku", json!(""))),
        ("long sku", item("sku", json!("s".repeat(65)))),
        ("control character in sku", item("sku", json!("a\u{0}b"))),
        ("unknown field", top("colour", json!("red"))),
        ("unknown item field", item("colour", json!("red"))),
        ("metadata not strings", (top("metadata", json!({"a": 1})).0, "metadata.a".to_owned())),
        ("metadata NUL", top("metadata", json!({"a": "x\u{0}"}))),
        ("customer_id empty", top("customer_id", json!(""))),
        ("non-object body", (json!(["an", "array"]), "body".to_owned())),
        ("string body", (json!("order"), "body".to_owned())),
    ];
    for (name, (body, field)) in cases {
        let response = app.post_order(&body, Some(&new_key())).await;
        assert_eq!(response.status().as_u16(), 422, "{name}");
        let problem = assert_problem(response, 422, "validation-failed").await;
        let fields: Vec<&str> =
            problem["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
        assert!(fields.contains(&field.as_str()), "{name}: expected an error on {field}, got {problem}");
    }
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);
}

#[tokio::test]
async fn every_invalid_field_is_reported_at_once() {
    let app = spawn_app().await;
    let body = json!({"currency": "usd", "items": [
        {"sku": "", "quantity": 0, "unit_price": "1.001"},
        {"sku": "ok", "quantity": 1, "unit_price": "-5"}]});
    let problem = assert_problem(app.post_order(&body, None).await, 422, "validation-failed").await;
    let fields: Vec<&str> =
        problem["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["items[0].quantity", "items[0].sku", "items[0].unit_price", "items[1].unit_price"]);
}

#[tokio::test]
async fn malformed_requests_get_their_own_problem_types() {
    let app = spawn_app().await;
    let key = new_key();
    assert_problem(app.post_order_raw("{\"currency\": ", Some(&key)).await, 400, "malformed-json").await;
    assert_problem(app.post_order_raw("", Some(&key)).await, 400, "malformed-json").await;
    let invalid_utf8 = app
        .request(Method::POST, "/orders")
        .header("Content-Type", "application/json")
        .body(vec![b'{', b'"', 0xff, 0xfe, b'"', b':', b'1', b'}'])
        .send()
        .await
        .unwrap();
    assert_problem(invalid_utf8, 400, "malformed-json").await;
    let text = app
        .request(Method::POST, "/orders")
        .header("Content-Type", "text/plain")
        .body(order_body().to_string())
        .send()
        .await
        .unwrap();
    assert_problem(text, 415, "unsupported-media-type").await;
    let oversized = format!("{{\"currency\":\"USD\",\"pad\":\"{}\"}}", "x".repeat(1 << 20));
    assert_problem(app.post_order_raw(&oversized, Some(&key)).await, 413, "payload-too-large").await;
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_are_problems_too() {
    let app = spawn_app().await;
    assert_problem(app.request(Method::GET, "/nowhere").send().await.unwrap(), 404, "route-not-found").await;
    assert_problem(app.request(Method::GET, "/v1/orders").send().await.unwrap(), 404, "route-not-found")
        .await;
    let wrong_method = app.request(Method::DELETE, "/orders").send().await.unwrap();
    assert_eq!(wrong_method.headers()["allow"], "GET, POST");
    assert_problem(wrong_method, 405, "method-not-allowed").await;
    let wrong_method = app.request(Method::GET, "/orders/x/cancel").send().await.unwrap();
    assert_eq!(wrong_method.headers()["allow"], "POST");
    assert_problem(wrong_method, 405, "method-not-allowed").await;
}
