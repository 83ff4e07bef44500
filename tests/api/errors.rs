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
async fn a_body_naming_a_member_twice_is_refused_with_its_path_and_stores_nothing() {
    // serde_json keeps the last copy of a repeated member: 1.50 here would have been 9.00.
    let app = spawn_app().await;
    let cases = [
        (
            r#"{"currency":"USD","items":[{"sku":"a","quantity":1,"unit_price":"1.50","unit_price":"9.00"}]}"#,
            "items[0].unit_price",
        ),
        (
            r#"{"currency":"USD","currency":"EUR","items":[{"sku":"a","quantity":1,"unit_price":"1.50"}]}"#,
            "currency",
        ),
        (
            r#"{"currency":"USD","items":[{"sku":"a","quantity":1,"unit_price":"1"}],"metadata":{"k":"1","k":"2"}}"#,
            "metadata.k",
        ),
    ];
    for (body, path) in cases {
        for key in [Some(new_key()), None] {
            let problem =
                assert_problem(app.post_order_raw(body, key.as_deref()).await, 400, "malformed-json").await;
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.ends_with(&format!(": the member {path} appears more than once")),
                "{body}: {detail}"
            );
        }
    }
    let order = app.create_order().await;
    let payment = app
        .request(Method::POST, "/payments")
        .header("Idempotency-Key", new_key())
        .header("Content-Type", "application/json")
        .body(format!(
            r#"{{"order_id":"{0}","payment_method":"pm_card_ok","order_id":"{0}"}}"#,
            order["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    let problem = assert_problem(payment, 400, "malformed-json").await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.ends_with(": the member order_id appears more than once"), "{detail}");
    assert_eq!(app.orders_stored().await, 1, "only the well-formed order");
    assert_eq!(app.payments_stored().await, 0);
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

/// The single error on `field` of a 422 answer.
async fn field_message(response: reqwest::Response, field: &str) -> String {
    let problem = assert_problem(response, 422, "validation-failed").await;
    let errors = problem["errors"].as_array().unwrap();
    let on_field: Vec<&Value> = errors.iter().filter(|error| error["field"] == field).collect();
    assert_eq!(on_field.len(), 1, "one error on {field}: {problem}");
    on_field[0]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn prices_follow_the_published_money_grammar_and_say_what_is_wrong() {
    let app = spawn_app().await;
    let malformed = "must be a decimal string such as \"12.50\"";
    let tiny = format!("0.{}1", "0".repeat(1000));
    // (currency, unit_price as a JSON value, the start of the message on items[0].unit_price)
    let cases: Vec<(&str, Value, &str)> = vec![
        ("USD", json!("1e2"), malformed),
        ("USD", json!("1E2"), malformed),
        ("USD", json!("-0"), malformed),
        ("USD", json!("1e-400"), malformed),
        ("USD", json!(" 12.50"), malformed),
        ("USD", number("1e2"), malformed),
        ("USD", number("1E2"), malformed),
        ("USD", number("-0"), malformed),
        ("USD", number("1e-400"), malformed),
        ("USD", number("1.25e1"), malformed),
        ("USD", number("-0.0"), malformed),
        ("USD", number("0.0000001"), "has more decimal places than USD allows (2)"),
        ("USD", number("100000000000000000000000"), "exceeds the maximum amount of 999999999999999"),
        ("USD", json!("-1e400"), "must not be negative"),
        ("USD", number("-1e400"), "must not be negative"),
        ("USD", json!("-12.50"), "must not be negative"),
        ("USD", number("-5"), "must not be negative"),
        ("USD", json!(tiny), "has more decimal places than USD allows (2)"),
        ("USD", number(&tiny), "has more decimal places than USD allows (2)"),
        ("USD", json!("19.999"), "has more decimal places than USD allows (2)"),
        ("JPY", json!("12.5"), "has more decimal places than JPY allows (0)"),
        ("KWD", json!("1.2345"), "has more decimal places than KWD allows (3)"),
        ("USD", json!("1000000000000000"), "exceeds the maximum amount of 999999999999999"),
        ("USD", json!(true), malformed),
    ];
    for (currency, price, expected) in cases {
        let body = json!({"currency": currency, "items": [{"sku": "a", "quantity": 1, "unit_price": price}]});
        let message =
            field_message(app.post_order(&body, Some(&new_key())).await, "items[0].unit_price").await;
        assert!(message.starts_with(expected), "{currency} {price}: {message:?}, expected {expected:?}");
    }
    // A malformed price is reported even when the currency is invalid too.
    let body = json!({"currency": "XYZ", "items": [{"sku": "a", "quantity": 1, "unit_price": "1e2"}]});
    let message = field_message(app.post_order(&body, None).await, "items[0].unit_price").await;
    assert!(message.starts_with(malformed), "{message}");
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);
}

#[tokio::test]
async fn trailing_zeros_are_normalised_in_strings_and_numbers() {
    let app = spawn_app().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("USD", json!("1.000"), "1.00"),
        ("USD", number("1.000"), "1.00"),
        ("USD", number("12.5"), "12.50"),
        ("USD", json!("007.10"), "7.10"),
        ("JPY", json!("12.0"), "12"),
        ("JPY", number("12.000"), "12"),
        ("KWD", json!("1.2340"), "1.234"),
    ];
    for (currency, price, printed) in cases {
        let body = json!({"currency": currency, "items": [{"sku": "a", "quantity": 1, "unit_price": price}]});
        let response = app.post_order(&body, None).await;
        assert_eq!(response.status(), 201, "{currency} {price}");
        let order = crate::helpers::json(response).await;
        assert_eq!(order["items"][0]["unit_price"], printed, "{currency} {price}");
    }
}

#[tokio::test]
async fn a_payment_amount_follows_the_same_money_grammar() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (order_id, total) = (order["id"].as_str().unwrap(), order["total_amount"].as_str().unwrap());
    assert_eq!(total, "48.48");
    let malformed = "must be a decimal string such as \"12.50\"";
    let cases: Vec<(Value, &str)> = vec![
        (json!("4.848e1"), malformed),
        (number("4.848e1"), malformed),
        (json!("-0"), malformed),
        (number("-0"), malformed),
        (number("0.0000001"), "has more decimal places than any supported currency allows (3)"),
        (json!("48.48 "), malformed),
        (json!(["48.48"]), malformed),
        (json!("-48.48"), "must not be negative"),
        (number("-1e400"), "must not be negative"),
        (json!("48.4801"), "has more decimal places than any supported currency allows (3)"),
        (
            json!(format!("0.{}1", "0".repeat(1000))),
            "has more decimal places than any supported currency allows (3)",
        ),
        (json!("1000000000000000"), "exceeds the maximum amount of 999999999999999"),
        (json!("48.481"), "must equal the order's total_amount, 48.48"),
    ];
    for (amount, expected) in cases {
        let body = json!({"order_id": order_id, "payment_method": "pm_card_ok", "amount": amount});
        let message = field_message(app.pay_with(&body, &new_key()).await, "amount").await;
        assert!(message.starts_with(expected), "{amount}: {message:?}, expected {expected:?}");
    }
    assert_eq!(app.payments_stored().await, 0);
    assert!(app.provider.charges().await.is_empty());
    // Trailing zeros are the same amount.
    let body = json!({"order_id": order_id, "payment_method": "pm_card_ok", "amount": "48.4800"});
    assert_eq!(app.pay_with(&body, &new_key()).await.status(), 201);
}

#[tokio::test]
async fn a_charset_other_than_utf8_is_an_unsupported_media_type() {
    let app = spawn_app().await;
    let send = |content_type: &'static str| {
        app.request(Method::POST, "/orders")
            .header("Content-Type", content_type)
            .body(order_body().to_string())
            .send()
    };
    for refused in [
        "application/json; charset=latin1",
        "application/json; charset=ISO-8859-1",
        "application/json;charset=\"latin1\"",
        "application/json; CHARSET=utf-16",
        "application/json; charset=utf-8; charset=latin1",
    ] {
        let problem = assert_problem(send(refused).await.unwrap(), 415, "unsupported-media-type").await;
        assert!(problem["detail"].as_str().unwrap().contains("UTF-8"), "{problem}");
    }
    let two_types = app
        .request(Method::POST, "/orders")
        .header("Content-Type", "application/json")
        .header("Content-Type", "text/plain")
        .body(order_body().to_string())
        .send()
        .await
        .unwrap();
    assert_problem(two_types, 415, "unsupported-media-type").await;
    assert_eq!(app.orders_stored().await, 0);
    for accepted in
        ["application/json; charset=utf-8", "application/json; charset=\"UTF-8\"", "application/json"]
    {
        assert_eq!(send(accepted).await.unwrap().status(), 201, "{accepted}");
    }
}
