//! The idempotency contract of docs/idempotency.md, line by line, as it applies to orders.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use crate::helpers::{assert_problem, json, new_key, order_body, spawn_app, spawn_app_with};

#[tokio::test]
async fn a_replay_returns_the_stored_answer_and_says_so() {
    let app = spawn_app().await;
    let key = new_key();
    let first = app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["idempotency-key"], key.as_str());
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert!(first.headers().get("orderpay-should-retry").is_none());
    let first_location = first.headers()["location"].clone();
    let first_body = first.text().await.unwrap();

    let replay = app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["orderpay-should-retry"], "false", "a replay never changes");
    assert_eq!(replay.headers()["idempotency-key"], key.as_str());
    assert_eq!(replay.headers()["location"], first_location);
    assert_eq!(replay.headers()["content-type"], "application/json");
    assert_eq!(replay.text().await.unwrap(), first_body, "byte-identical body");
    assert_eq!(app.orders_stored().await, 1);
    assert_eq!(app.keys_stored().await, 1);
}

#[tokio::test]
async fn a_reserialised_body_is_the_same_request() {
    let app = spawn_app().await;
    let key = new_key();
    let compact = r#"{"currency":"USD","items":[{"sku":"a","quantity":1,"unit_price":"2.50"}],"metadata":{"x":"1","y":"2"}}"#;
    let reordered = "{ \"metadata\": {\"y\":\"2\", \"x\":\"1\"},\n  \"items\": [ {\"unit_price\": \"2.50\", \"sku\": \"\\u0061\", \"quantity\": 1} ],\n  \"currency\": \"USD\" }";
    let first = json(app.post_order_raw(compact, Some(&key)).await).await;
    let replay = app.post_order_raw(reordered, Some(&key)).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(replay).await["id"], first["id"]);
    assert_eq!(app.orders_stored().await, 1);
}

#[tokio::test]
async fn the_quoted_form_is_the_same_key() {
    let app = spawn_app().await;
    let key = new_key();
    let first = json(app.post_order(&order_body(), Some(&key)).await).await;
    let quoted = format!("\"{key}\"");
    let replay = app.post_order(&order_body(), Some(&quoted)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["idempotency-key"], quoted.as_str());
    assert_eq!(json(replay).await["id"], first["id"]);
    assert_eq!(app.orders_stored().await, 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused_and_runs_nothing() {
    let app = spawn_app().await;
    let key = new_key();
    assert_eq!(app.post_order(&order_body(), Some(&key)).await.status(), 201);
    let mut other = order_body();
    other["items"][0]["quantity"] = json!(3);
    let refused = app.post_order(&other, Some(&key)).await;
    assert_eq!(refused.headers()["idempotency-key"], key.as_str());
    assert_eq!(refused.headers()["orderpay-should-retry"], "false");
    assert_problem(refused, 422, "idempotency-key-reused").await;
    assert_eq!(app.orders_stored().await, 1);

    // Numbers keep their exact text: 19.99 and 19.990 are different requests.
    let number_key = new_key();
    let mut as_number = order_body();
    as_number["items"][0]["unit_price"] = serde_json::from_str("19.99").unwrap();
    assert_eq!(app.post_order(&as_number, Some(&number_key)).await.status(), 201);
    as_number["items"][0]["unit_price"] = serde_json::from_str("19.990").unwrap();
    assert_problem(app.post_order(&as_number, Some(&number_key)).await, 422, "idempotency-key-reused").await;
    assert_eq!(app.orders_stored().await, 2);
}

#[tokio::test]
async fn the_same_key_on_another_route_is_refused() {
    let app = spawn_app().await;
    let key = new_key();
    let order = json(app.post_order(&order_body(), Some(&key)).await).await;
    let refused = app.cancel_order(order["id"].as_str().unwrap(), Some(&key)).await;
    let problem = assert_problem(refused, 422, "idempotency-key-reused").await;
    assert!(problem["detail"].as_str().unwrap().contains("POST /orders"), "{problem}");
    assert_eq!(json(app.get_order(order["id"].as_str().unwrap()).await).await["status"], "pending_payment");
}

#[tokio::test]
async fn twenty_concurrent_copies_create_one_order() {
    let app = spawn_app().await;
    let key = new_key();
    let body = order_body();
    let responses = join_all((0..20).map(|_| app.post_order(&body, Some(&key)))).await;
    let mut ids = HashSet::new();
    let mut replays = 0;
    for response in responses {
        assert_eq!(response.status(), 201);
        replays += usize::from(response.headers().contains_key("idempotent-replayed"));
        ids.insert(json(response).await["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "one order id for every copy");
    assert_eq!(replays, 19, "one execution, nineteen replays");
    assert_eq!(app.orders_stored().await, 1);
    assert_eq!(app.keys_stored().await, 1);
}

#[tokio::test]
async fn fifty_keys_with_four_interleaved_copies_each_make_fifty_orders() {
    let app = spawn_app().await;
    let keys: Vec<String> = (0..50).map(|_| new_key()).collect();
    let body = order_body();
    // Round-robin: key 0, key 1, ..., key 49, key 0, ... so copies of a key interleave.
    let (app, body) = (&app, &body);
    let requests = (0..4).flat_map(|_| keys.iter()).map(|key| async move {
        let response = app.post_order(body, Some(key)).await;
        assert_eq!(response.status(), 201);
        (key.clone(), json(response).await["id"].as_str().unwrap().to_owned())
    });
    let results = join_all(requests).await;
    let mut id_per_key = std::collections::HashMap::new();
    for (key, id) in results {
        let first = id_per_key.entry(key).or_insert_with(|| id.clone());
        assert_eq!(*first, id, "every copy of a key gets the same order");
    }
    assert_eq!(id_per_key.len(), 50);
    assert_eq!(app.orders_stored().await, 50);
    assert_eq!(app.keys_stored().await, 50);
}

#[tokio::test]
async fn keys_are_scoped_by_account() {
    let app = spawn_app().await;
    let (_, other_key) = app.create_account("other").await;
    let key = new_key();
    let mine = app.post_order(&order_body(), Some(&key)).await;
    let theirs = app.post_order_as(&other_key, &order_body(), Some(&key)).await;
    assert_eq!(mine.status(), 201);
    assert_eq!(theirs.status(), 201);
    assert!(theirs.headers().get("idempotent-replayed").is_none(), "no cross-account replay");
    let (mine, theirs) = (json(mine).await, json(theirs).await);
    assert_ne!(mine["id"], theirs["id"]);
    assert_eq!(app.orders_stored().await, 2);
    // The other account's retry replays its own order, not ours.
    let retry = json(app.post_order_as(&other_key, &order_body(), Some(&key)).await).await;
    assert_eq!(retry["id"], theirs["id"]);
}

#[tokio::test]
async fn malformed_keys_are_400_and_255_characters_are_fine() {
    let app = spawn_app().await;
    let too_long = "k".repeat(256);
    for bad in ["", too_long.as_str(), "has space", "\"unterminated", "\"\""] {
        let response = app.post_order(&order_body(), Some(bad)).await;
        assert_problem(response, 400, "idempotency-key-invalid").await;
    }
    // Non-ASCII bytes in the header value.
    let response = app
        .request(reqwest::Method::POST, "/orders")
        .header("Idempotency-Key", reqwest::header::HeaderValue::from_bytes("clé".as_bytes()).unwrap())
        .json(&order_body())
        .send()
        .await
        .unwrap();
    assert_problem(response, 400, "idempotency-key-invalid").await;
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);

    let longest = "k".repeat(255);
    assert_eq!(app.post_order(&order_body(), Some(&longest)).await.status(), 201);
}

#[tokio::test]
async fn without_a_key_each_request_runs() {
    let app = spawn_app().await;
    assert_eq!(app.post_order(&order_body(), None).await.status(), 201);
    assert_eq!(app.post_order(&order_body(), None).await.status(), 201);
    assert_eq!(app.orders_stored().await, 2);
    assert_eq!(app.keys_stored().await, 0);
}

#[tokio::test]
async fn a_key_can_be_required() {
    let app = spawn_app_with(|settings, _| settings.api.require_idempotency_key = true).await;
    assert_problem(app.post_order(&order_body(), None).await, 400, "idempotency-key-missing").await;
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.post_order(&order_body(), Some(&new_key())).await.status(), 201);
}

#[tokio::test]
async fn a_validation_failure_is_not_stored_so_the_fixed_body_runs_with_the_same_key() {
    let app = spawn_app().await;
    let key = new_key();
    let mut broken = order_body();
    broken["currency"] = json!("XYZ");
    let invalid = app.post_order(&broken, Some(&key)).await;
    assert_eq!(invalid.headers()["orderpay-should-retry"], "false", "the same body fails the same");
    assert_problem(invalid, 422, "validation-failed").await;
    assert_problem(app.post_order_raw("{not json", Some(&key)).await, 400, "malformed-json").await;
    assert_eq!(app.keys_stored().await, 0);
    let fixed = app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(fixed.status(), 201);
    assert!(fixed.headers().get("idempotent-replayed").is_none());
}

#[tokio::test]
async fn a_failure_inside_the_transaction_leaves_nothing_and_releases_the_key() {
    let app = spawn_app().await;
    // A real failure in the middle of the transaction: the key row and the order are already
    // inserted when the items insert raises.
    app.fail_inserts_into("order_items").await;
    let key = new_key();
    let failed = app.post_order(&order_body(), Some(&key)).await;
    let problem = assert_problem(failed, 500, "internal-error").await;
    assert!(!problem.to_string().contains("injected"), "internal causes are not returned: {problem}");
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);

    app.heal_inserts_into("order_items").await;
    let retried = app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(retried.status(), 201, "the retry runs again");
    assert!(retried.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.orders_stored().await, 1);
}

#[tokio::test]
async fn the_sweeper_deletes_expired_keys_which_then_run_as_new() {
    // The in-memory replay copies live until the key's own expiry; this test moves the expiry in
    // the database, so it runs without them.
    let app = spawn_app_with(|settings, _| {
        settings.sweeper.interval = Duration::from_millis(100);
        settings.api.replay_cache_bytes = 0;
    })
    .await;
    let key = new_key();
    let first = json(app.post_order(&order_body(), Some(&key)).await).await;
    let kept = new_key();
    assert_eq!(app.post_order(&order_body(), Some(&kept)).await.status(), 201);
    app.execute(&format!(
        "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = '{key}'"
    ))
    .await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while app.keys_stored().await != 1 {
        assert!(tokio::time::Instant::now() < deadline, "the sweeper did not delete the expired key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let remaining =
        app.count(&format!("SELECT count(*) AS count FROM idempotency_keys WHERE key = '{kept}'")).await;
    assert_eq!(remaining, 1, "unexpired keys stay");

    // The expired key is new again: another body runs instead of being refused.
    let mut other = order_body();
    other["currency"] = json!("EUR");
    let again = app.post_order(&other, Some(&key)).await;
    assert_eq!(again.status(), 201);
    assert_ne!(json(again).await["id"], first["id"]);
    assert_eq!(app.orders_stored().await, 3);
}

#[tokio::test]
async fn an_expired_key_not_yet_swept_is_treated_as_new() {
    let app = spawn_app_with(|settings, _| settings.api.replay_cache_bytes = 0).await;
    let key = new_key();
    let first = json(app.post_order(&order_body(), Some(&key)).await).await;
    app.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'").await;
    let again = app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(again.status(), 201);
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_ne!(json(again).await["id"], first["id"]);
    assert_eq!(app.keys_stored().await, 1);
}

#[tokio::test]
async fn stored_records_hold_no_credentials() {
    let app = spawn_app().await;
    app.post_order(&order_body(), Some(&new_key())).await;
    let leaks = app
        .count(&format!(
            "SELECT count(*) AS count FROM idempotency_keys AS k \
             LEFT JOIN events AS e ON e.account_id = k.account_id AND e.id = k.answer_event_id \
             WHERE position('{}' in convert_from(coalesce(k.response_body, e.data), 'UTF8') \
                 || coalesce(k.response_headers::text, '')) > 0",
            app.api_key
        ))
        .await;
    assert_eq!(leaks, 0);
    let answers = app
        .count(
            "SELECT count(*) AS count FROM idempotency_keys AS k \
             JOIN events AS e ON e.account_id = k.account_id AND e.id = k.answer_event_id",
        )
        .await;
    assert_eq!(answers, 1, "the stored answer looked at is the order's event");
    let key_in_accounts = app
        .count(&format!(
            "SELECT count(*) AS count FROM accounts AS a JOIN api_keys AS k ON k.account_id = a.id \
             WHERE position('{}' in a.name || encode(k.key_hash, 'escape') || coalesce(k.prefix, '')) > 0",
            app.api_key
        ))
        .await;
    assert_eq!(key_in_accounts, 0, "only the hash of an API key is stored");
}

#[tokio::test]
async fn replays_are_served_from_memory_and_reuses_still_refused() {
    let app = spawn_app().await;
    let key = new_key();
    let first = app.post_order(&order_body(), Some(&key)).await.text().await.unwrap();
    // Take the database out of the replay: the copy in memory answers.
    app.execute("DELETE FROM idempotency_keys").await;
    let replay = app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), first);
    assert_eq!(app.orders_stored().await, 1);
    // A different body is not a replay: it goes to the store (here: a new key again).
    let mut other = order_body();
    other["currency"] = json!("EUR");
    assert_eq!(app.post_order(&other, Some(&key)).await.status(), 201);
}

/// A keyed request as sent first, and what it answered.
struct FirstAnswer {
    method: reqwest::Method,
    path: String,
    body: Option<serde_json::Value>,
    key: String,
    status: u16,
    location: Option<String>,
    content_type: Option<String>,
    bytes: Vec<u8>,
}

/// A header's value as text, if the response has it.
fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response.headers().get(name).map(|value| value.to_str().unwrap().to_owned())
}

impl FirstAnswer {
    async fn send(
        app: &crate::helpers::TestApp,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Self {
        let sent = FirstAnswer {
            method,
            path: path.to_owned(),
            body,
            key: new_key(),
            status: 0,
            location: None,
            content_type: None,
            bytes: Vec::new(),
        };
        let response = sent.request(app).send().await.unwrap();
        assert!(response.status().is_success(), "{} {path}: {}", sent.method, response.status());
        FirstAnswer {
            status: response.status().as_u16(),
            location: header(&response, "location"),
            content_type: header(&response, "content-type"),
            bytes: response.bytes().await.unwrap().to_vec(),
            ..sent
        }
    }

    /// The request with its key and body, as sent first and as replayed.
    fn request(&self, app: &crate::helpers::TestApp) -> reqwest::RequestBuilder {
        let request = app.request(self.method.clone(), &self.path).header("Idempotency-Key", &self.key);
        match &self.body {
            Some(body) => request.json(body),
            None => request,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.bytes).unwrap()
    }

    /// Sends the same request again and requires the first answer, byte for byte.
    async fn replays(&self, app: &crate::helpers::TestApp, after: &str) {
        let replay = self.request(app).send().await.unwrap();
        let what = format!("{} {} replayed after {after}", self.method, self.path);
        assert_eq!(replay.status().as_u16(), self.status, "{what}");
        assert_eq!(replay.headers()["idempotent-replayed"], "true", "{what}");
        assert_eq!(header(&replay, "content-type"), self.content_type, "{what}");
        assert_eq!(header(&replay, "location"), self.location, "{what}");
        assert_eq!(replay.bytes().await.unwrap().to_vec(), self.bytes, "{what}: the first answer's bytes");
    }
}

/// Every keyed write's first answer comes back byte for byte from the database (the memory's
/// copy turned off) after each later change of what it made: a new order's answer is read from
/// its `order.created` event, a payment's and capture's from the event their settle wrote (their
/// rows name it and hold no body), a refund's from its row, a cancellation's from its key row;
/// none of them follows the resource as it is now.
#[tokio::test]
async fn a_replay_is_the_first_answer_byte_for_byte_after_every_later_transition() {
    use reqwest::Method;
    let app = spawn_app_with(|settings, _| settings.api.replay_cache_bytes = 0).await;
    let mut answers: Vec<FirstAnswer> = Vec::new();
    async fn replay_all(app: &crate::helpers::TestApp, answers: &[FirstAnswer], after: &str) {
        for answer in answers {
            answer.replays(app, after).await;
        }
    }

    let order = FirstAnswer::send(&app, Method::POST, "/orders", Some(order_body())).await;
    let order_id = order.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.count("SELECT count(*) AS count FROM idempotency_keys WHERE response_body IS NULL AND answer_event_id IS NOT NULL")
            .await,
        1,
        "the new order's key row names its event for the body"
    );
    assert_eq!(
        app.count("SELECT count(*) AS count FROM idempotency_keys WHERE response_headers IS NULL").await,
        1,
        "and holds no headers: a replay derives them from the order"
    );
    answers.push(order);
    replay_all(&app, &answers, "the order's creation").await;

    let authorize = json!({"order_id": order_id, "payment_method": "pm_card_ok", "capture_method": "manual"});
    let payment = FirstAnswer::send(&app, Method::POST, "/payments", Some(authorize)).await;
    let payment_id = payment.json()["id"].as_str().unwrap().to_owned();
    answers.push(payment);
    replay_all(&app, &answers, "the authorization").await;

    let capture =
        FirstAnswer::send(&app, Method::POST, &format!("/payments/{payment_id}/capture"), None).await;
    answers.push(capture);
    assert_eq!(app.order_status(&order_id).await, "paid");
    replay_all(&app, &answers, "the capture (the order paid)").await;

    let partial = json!({"payment_id": payment_id, "amount": "1.00"});
    answers.push(FirstAnswer::send(&app, Method::POST, "/refunds", Some(partial)).await);
    replay_all(&app, &answers, "a partial refund").await;

    answers.push(
        FirstAnswer::send(&app, Method::POST, "/refunds", Some(json!({"payment_id": payment_id}))).await,
    );
    assert_eq!(app.order_status(&order_id).await, "refunded");
    replay_all(&app, &answers, "the refund of the rest (the order refunded)").await;

    let other = FirstAnswer::send(&app, Method::POST, "/orders", Some(order_body())).await;
    let other_id = other.json()["id"].as_str().unwrap().to_owned();
    answers.push(other);
    answers.push(FirstAnswer::send(&app, Method::POST, &format!("/orders/{other_id}/cancel"), None).await);
    replay_all(&app, &answers, "another order's cancellation").await;

    for table in ["payments", "payment_operations"] {
        let by_event = format!(
            "SELECT count(*) AS count FROM {table} AS o JOIN events AS e \
             ON e.account_id = o.account_id AND e.id = o.answer_event_id WHERE o.answer_body IS NULL"
        );
        assert_eq!(app.count(&by_event).await, 1, "{table}: the answer is named by its event, not copied");
    }
    assert_eq!(
        app.count("SELECT count(*) AS count FROM refunds WHERE answer_body IS NOT NULL").await,
        2,
        "a refund keeps its answer's body: its client key finds it again after every event is gone"
    );
}
