//! Refunds: every answer and its replay, exactly one provider refund per refund (counted at the
//! mock provider), the payment's and the order's amounts and states, concurrent refunds that
//! must not over-refund, and the unknown-outcome windows (timeout, 5xx, pending).

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use reqwest::{Method, Response};
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, assert_problem, json, new_key, over_both_wires, spawn_app, spawn_app_on_wire, spawn_app_with,
};

impl TestApp {
    /// `POST /refunds` with `body` and `key`.
    pub async fn refund_with(&self, body: &Value, key: &str) -> Response {
        self.request(Method::POST, "/refunds")
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("POST /refunds")
    }

    /// `POST /refunds` of `amount` (all that is refundable when `None`).
    pub async fn refund(&self, payment_id: &str, amount: Option<&str>, key: &str) -> Response {
        let mut body = json!({ "payment_id": payment_id });
        if let Some(amount) = amount {
            body["amount"] = json!(amount);
        }
        self.refund_with(&body, key).await
    }

    /// An order of `total` (USD, one line) paid with `payment_method`; its id and the payment.
    pub async fn paid_order(&self, total: &str, payment_method: &str) -> (String, Value) {
        let body = json!({"currency": "USD", "items": [{"sku": "s", "quantity": 1, "unit_price": total}]});
        let order = json(self.post_order(&body, None).await).await;
        let order_id = order["id"].as_str().unwrap().to_owned();
        let paid = self.pay(&order_id, payment_method, &new_key()).await;
        assert_eq!(paid.status(), 201, "the order is paid");
        (order_id, json(paid).await)
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let response = self.request(Method::GET, path).send().await.unwrap();
        assert_eq!(response.status(), 200, "GET {path}");
        json(response).await
    }

    /// Provider refunds made with the downstream key of `refund_id`.
    pub async fn provider_refunds_for(&self, refund_id: &str) -> Vec<Value> {
        let key = format!("orderpay_refund_{refund_id}");
        self.provider
            .refunds()
            .await
            .into_iter()
            .filter(|refund| refund["idempotency_key"] == key.as_str())
            .collect()
    }

    /// Audit rows of one subject moving to `to`.
    pub async fn transitions(&self, subject_id: &str, to: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) AS count FROM payment_events WHERE subject_id = '{subject_id}' AND to_status = '{to}'"
        ))
        .await
    }
}

over_both_wires! {
async fn a_full_refund_gives_everything_back_once_and_replays(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("48.48", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();

    let response = app.refund(payment_id, None, &key).await;
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let body = response.text().await.unwrap();
    let refund: Value = serde_json::from_str(&body).unwrap();
    let refund_id = refund["id"].as_str().unwrap();
    assert_eq!(location, format!("/refunds/{refund_id}"));
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["amount"], "48.48");
    assert_eq!(refund["currency"], "USD");
    assert_eq!(refund["payment_id"], payment_id);
    assert_eq!(refund["order_id"], order_id.as_str());
    assert!(refund["reason"].is_null());
    assert!(refund["provider_refund_id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(app.get_json(&location).await, refund, "GET returns what POST answered");

    let payment = app.get_payment(payment_id).await;
    assert_eq!(payment["amount_refunded"], "48.48");
    assert_eq!(payment["status"], "succeeded", "a refund is an operation of its own");
    assert_eq!(app.order_status(&order_id).await, "refunded");

    let replay = app.refund(payment_id, None, &key).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), body);
    let at_provider = app.provider_refunds_for(refund_id).await;
    assert_eq!(at_provider.len(), 1, "one refund at the provider");
    assert_eq!(at_provider[0]["amount"], "48.48");
    assert_eq!(app.transitions(refund_id, "succeeded").await, 1);
}
}

over_both_wires! {
async fn partial_refunds_move_the_order_to_partially_refunded_then_refunded(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("100.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();

    let first = app
        .refund_with(
            &json!({"payment_id": payment_id, "amount": "30.00", "reason": "requested_by_customer"}),
            &new_key(),
        )
        .await;
    assert_eq!(first.status(), 201);
    assert_eq!(json(first).await["reason"], "requested_by_customer");
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "30.00");

    let over = app.refund(payment_id, Some("70.01"), &new_key()).await;
    let problem = assert_problem(over, 422, "refund-exceeds-refundable").await;
    assert_eq!(problem["refundable_amount"], "70.00");

    let rest = app.refund(payment_id, None, &new_key()).await;
    assert_eq!(rest.status(), 201);
    assert_eq!(json(rest).await["amount"], "70.00", "the default is what is still refundable");
    assert_eq!(app.order_status(&order_id).await, "refunded");
    let nothing_left = app.refund(payment_id, None, &new_key()).await;
    assert_eq!(
        assert_problem(nothing_left, 422, "refund-exceeds-refundable").await["refundable_amount"],
        "0.00"
    );

    let listed = app.get_json(&format!("/refunds?payment_id={payment_id}")).await;
    let amounts: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|r| r["amount"].as_str().unwrap()).collect();
    assert_eq!(amounts, ["70.00", "30.00"], "newest first");
    assert_eq!(listed["has_more"], false);
    let page = app.get_json(&format!("/refunds?payment_id={payment_id}&limit=1")).await;
    assert_eq!(page["has_more"], true);
    let cursor = page["data"][0]["id"].as_str().unwrap();
    let next = app.get_json(&format!("/refunds?limit=1&starting_after={cursor}")).await;
    assert_eq!(next["data"][0]["amount"], "30.00");
    assert_eq!(app.provider.refunds().await.len(), 2, "the refused ones never reached the provider");
}
}

#[tokio::test]
async fn bad_refund_requests_store_nothing_and_reach_no_provider() {
    let app = spawn_app().await;
    let (_, payment) = app.paid_order("10.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let cases = [
        (json!({"payment_id": payment_id, "amount": "0"}), "amount"),
        (json!({"payment_id": payment_id, "amount": "-1.00"}), "amount"),
        (json!({"payment_id": payment_id, "amount": "1.001"}), "amount"),
        (json!({"payment_id": payment_id, "amount": "1e2"}), "amount"),
        (json!({"payment_id": payment_id, "reason": "changed_my_mind"}), "reason"),
        (json!({"payment_id": "not-a-uuid"}), "payment_id"),
        (json!({"payment_id": payment_id, "colour": "red"}), "colour"),
        (json!({}), "payment_id"),
    ];
    for (body, field) in cases {
        let key = new_key();
        let problem = assert_problem(app.refund_with(&body, &key).await, 422, "validation-failed").await;
        assert_eq!(problem["errors"][0]["field"], field, "{body}: {problem}");
        // Nothing was stored: the same key with a good body runs.
        assert_eq!(
            app.count(&format!("SELECT count(*) AS count FROM idempotency_keys WHERE key = '{key}'")).await,
            0
        );
    }
    let no_key =
        app.request(Method::POST, "/refunds").json(&json!({"payment_id": payment_id})).send().await.unwrap();
    assert_problem(no_key, 400, "idempotency-key-missing").await;
    let unknown = app.refund(&uuid::Uuid::now_v7().to_string(), None, &new_key()).await;
    assert_problem(unknown, 404, "not-found").await;
    assert!(app.provider.refunds().await.is_empty());
    assert_eq!(app.count("SELECT count(*) AS count FROM refunds").await, 0);
}

over_both_wires! {
async fn only_a_succeeded_payment_can_be_refunded_and_the_refusal_is_stored(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let declined = json(app.pay(&order_id, "pm_card_declined", &new_key()).await).await;
    let key = new_key();
    let refused = app.refund(declined["payment_id"].as_str().unwrap(), None, &key).await;
    let problem = assert_problem(refused, 409, "invalid-state").await;
    assert_eq!(problem["current_state"], "failed");
    let replay = app.refund(declined["payment_id"].as_str().unwrap(), None, &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_problem(replay, 409, "invalid-state").await;

    // A payment whose outcome is still unknown cannot be refunded either.
    let processing = json(app.pay(&order_id, "pm_provider_timeout", &new_key()).await).await;
    assert_eq!(processing["status"], "processing");
    let refused = app.refund(processing["id"].as_str().unwrap(), None, &new_key()).await;
    assert_eq!(assert_problem(refused, 409, "invalid-state").await["current_state"], "processing");
    assert!(app.provider.refunds().await.is_empty());
}
}

over_both_wires! {
async fn a_declined_refund_is_final_moves_nothing_and_frees_its_amount(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("20.00", "pm_refund_declined").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();
    let declined = app.refund(payment_id, Some("5.00"), &key).await;
    let problem = assert_problem(declined, 402, "refund-declined").await;
    assert_eq!(problem["decline_code"], "refund_declined");
    let refund_id = problem["refund_id"].as_str().unwrap();
    assert_eq!(app.get_json(&format!("/refunds/{refund_id}")).await["status"], "failed");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "0.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let replay = app.refund(payment_id, Some("5.00"), &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(assert_problem(replay, 402, "refund-declined").await, problem);
    // The declined amount is refundable again (the provider will decline it again).
    let again = app.refund(payment_id, Some("20.00"), &new_key()).await;
    assert_problem(again, 402, "refund-declined").await;
    assert_eq!(app.provider.refunds().await.len(), 2, "one provider call per refund");
}
}

over_both_wires! {
async fn a_pending_refund_answers_202_and_settles_through_the_reconciler(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("12.00", "pm_refund_pending").await;
    let key = new_key();
    let accepted = app.refund(payment["id"].as_str().unwrap(), None, &key).await;
    assert_eq!(accepted.status(), 202);
    assert!(accepted.headers().contains_key("retry-after"));
    let refund = json(accepted).await;
    assert_eq!(refund["status"], "processing");
    let refund_id = refund["id"].as_str().unwrap();
    assert_eq!(app.order_status(&order_id).await, "paid", "nothing moved yet");

    tokio::time::sleep(Duration::from_millis(400)).await; // the mock settles after 300 ms
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled, pass.redriven), (1, 1, 0));
    assert_eq!(app.get_json(&format!("/refunds/{refund_id}")).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "refunded");
    let replay = app.refund(payment["id"].as_str().unwrap(), None, &key).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(app.provider_refunds_for(refund_id).await.len(), 1);
}
}

over_both_wires! {
async fn a_refund_whose_answer_times_out_is_found_not_made_twice_w3(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (_, payment) = app.paid_order("9.00", "pm_refund_timeout").await;
    let key = new_key();
    let accepted = app.refund(payment["id"].as_str().unwrap(), None, &key).await;
    assert_eq!(accepted.status(), 202, "the provider made it but its answer came too late");
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    // The retry takes it over (its lease was released with the 202) and finds it by its key.
    let retry = app.refund(payment["id"].as_str().unwrap(), None, &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(json(retry).await["status"], "succeeded");
    assert_eq!(app.provider_refunds_for(&refund_id).await.len(), 1, "found, not refunded again");
    assert_eq!(app.provider_refunds_for(&refund_id).await[0]["requests"], 1);
}
}

over_both_wires! {
async fn a_provider_5xx_leaves_the_refund_processing_until_it_is_sent_again_w4(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("7.00", "pm_card_ok").await;
    app.provider.set_faults(json!({"error_rate": 1.0})).await;
    let accepted = app.refund(payment["id"].as_str().unwrap(), None, &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    assert!(app.provider.refunds().await.is_empty(), "a 503 moved nothing");
    assert_eq!(app.get_payment(payment["id"].as_str().unwrap()).await["amount_refunded"], "0.00");

    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.settled, pass.redriven), (1, 1), "the provider never received it: sent again");
    assert_eq!(app.get_json(&format!("/refunds/{refund_id}")).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "refunded");
    assert_eq!(app.provider_refunds_for(&refund_id).await.len(), 1);
}
}

over_both_wires! {
async fn ten_concurrent_refunds_with_different_keys_never_over_refund(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        settings.database.pool_size = 16;
    })
    .await;
    let (order_id, payment) = app.paid_order("100.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let keys: Vec<String> = (0..10).map(|_| new_key()).collect();
    let answers = join_all(keys.iter().map(|key| app.refund(payment_id, Some("30.00"), key))).await;
    let mut statuses = Vec::new();
    for answer in answers {
        let status = answer.status().as_u16();
        let body = json(answer).await;
        if status == 422 {
            assert_eq!(body["type"], "refund-exceeds-refundable", "{body}");
        }
        statuses.push(status);
    }
    assert_eq!(statuses.iter().filter(|status| **status == 201).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|status| **status == 422).count(), 7, "{statuses:?}");
    let at_provider = app.provider.refunds().await;
    assert_eq!(at_provider.len(), 3, "three refunds reached the provider");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "90.00");
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
}
}

over_both_wires! {
async fn copies_of_one_refund_racing_refund_once(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        settings.database.pool_size = 16;
    })
    .await;
    let (_, payment) = app.paid_order("50.00", "pm_card_ok").await;
    let key = new_key();
    let answers =
        join_all((0..12).map(|_| app.refund(payment["id"].as_str().unwrap(), Some("20.00"), &key))).await;
    let mut refund_ids = HashSet::new();
    for answer in answers {
        let status = answer.status().as_u16();
        let body = json(answer).await;
        match status {
            201 => refund_ids.insert(body["id"].as_str().unwrap().to_owned()),
            409 => {
                assert_eq!(body["type"], "idempotency-key-in-use", "{body}");
                refund_ids.insert(body["resource_id"].as_str().unwrap().to_owned())
            }
            other => panic!("unexpected {other}: {body}"),
        };
    }
    assert_eq!(refund_ids.len(), 1, "every answer names the same refund");
    assert_eq!(app.provider.refunds().await.len(), 1);
    assert_eq!(app.count("SELECT count(*) AS count FROM refunds").await, 1);
}
}

#[tokio::test]
async fn refunds_are_scoped_by_account() {
    let app = spawn_app().await;
    let (_, payment) = app.paid_order("5.00", "pm_card_ok").await;
    let refund = json(app.refund(payment["id"].as_str().unwrap(), None, &new_key()).await).await;
    let (_, other_key) = app.create_account("someone else").await;
    let get = app
        .client
        .get(app.url(&format!("/refunds/{}", refund["id"].as_str().unwrap())))
        .bearer_auth(&other_key);
    assert_problem(get.send().await.unwrap(), 404, "not-found").await;
    let list = app.client.get(app.url("/refunds")).bearer_auth(&other_key).send().await.unwrap();
    assert_eq!(json(list).await["data"], json!([]));
    let steal = app
        .client
        .post(app.url("/refunds"))
        .bearer_auth(&other_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({"payment_id": payment["id"]}))
        .send()
        .await
        .unwrap();
    assert_problem(steal, 404, "not-found").await;
    assert_eq!(app.provider.refunds().await.len(), 1);
}

over_both_wires! {
async fn two_reconcilers_and_a_retry_racing_on_one_refund_apply_one_transition_w6(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (_, payment) = app.paid_order("15.00", "pm_refund_timeout").await;
    let key = new_key();
    let accepted = app.refund(payment["id"].as_str().unwrap(), None, &key).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (passes, retry) = tokio::join!(
        join_all([app.reconcile_once(), app.reconcile_once()]),
        app.refund(payment["id"].as_str().unwrap(), None, &key)
    );
    assert!([201, 409].contains(&retry.status().as_u16()), "retry answered {}", retry.status());
    let claimed: usize = passes.iter().map(|pass| pass.claimed).sum();
    assert!(claimed <= 1, "one driver at a time: {passes:?}");
    if claimed == 0 {
        assert_eq!(retry.status(), 201, "the retry drove it");
    }
    assert_eq!(app.transitions(&refund_id, "succeeded").await, 1, "exactly one transition");
    assert_eq!(app.provider_refunds_for(&refund_id).await.len(), 1);
    let replay = json(app.refund(payment["id"].as_str().unwrap(), None, &key).await).await;
    assert_eq!(replay["status"], "succeeded");
}
}

over_both_wires! {
/// Refunds racing the capture of an authorization: one capture of 40.00 of a 100.00
/// authorization and seven refunds of 40.00 at once, each with its own key, fifteen times. The
/// refund's start statement is the bound (it reads what is captured under the payment's lock):
/// each refund answers 201, 409 `invalid-state` (the capture still in flight) or 422
/// `refund-exceeds-refundable` (what was captured is known and taken), never a 500, and what is
/// refunded never exceeds what was captured, on either side.
async fn refunds_racing_a_capture_answer_409_or_422_never_500(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    for trial in 0..15 {
        let (_, payment) = app.authorized_order("100.00", "pm_card_ok").await;
        let payment_id = payment["id"].as_str().unwrap().to_owned();
        let capture_key = new_key();
        let capture = app.capture(&payment_id, Some("40.00"), &capture_key);
        let refunds = (0..7).map(|_| {
            let payment_id = payment_id.clone();
            let app = &app;
            async move { app.refund(&payment_id, Some("40.00"), &new_key()).await }
        });
        let (captured, refunded) = tokio::join!(capture, futures::future::join_all(refunds));
        assert_eq!(captured.status(), 200, "trial {trial}: the capture succeeds");
        let mut succeeded = 0;
        for answer in refunded {
            let status = answer.status().as_u16();
            let body = json(answer).await;
            match status {
                201 => succeeded += 1,
                409 => assert_eq!(body["type"], "invalid-state", "{body}"),
                422 => assert_eq!(body["type"], "refund-exceeds-refundable", "{body}"),
                other => panic!("trial {trial}: a refund answered {other}: {body}"),
            }
        }
        assert!(succeeded <= 1, "trial {trial}: 40.00 captured, {succeeded} refunds of 40.00");
        let charge = app.provider_charge(&payment_id).await;
        assert_eq!(charge["amount_captured"], "40.00");
        assert_eq!(charge["amount_refunded"], if succeeded == 1 { "40.00" } else { "0.00" });
    }
}
}

/// A refund retried with its key after the key expired answers the refund that key started,
/// never a second refund: the refund row keeps the client's key. Keys live 1 s here; the
/// refund is still in flight (the provider says pending) when its key expires, and the retry
/// with the same key resumes it (202, the same refund), then replays its final answer once it
/// settled. One refund at the provider.
#[tokio::test]
async fn a_refund_retried_past_its_keys_lifetime_answers_that_refund_not_a_second_one() {
    let app = spawn_app_with(|settings, mock| {
        settings.api.idempotency_retention = Duration::from_secs(1);
        mock.settle_after = Duration::from_millis(1500);
    })
    .await;
    let (_, payment) = app.paid_order("30.00", "pm_refund_pending").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();
    let accepted = app.refund(payment_id, Some("10.00"), &key).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = app.refund(payment_id, Some("10.00"), &key).await;
    assert_eq!(again.status(), 202, "still in flight at the provider");
    assert_eq!(json(again).await["id"], refund_id.as_str(), "the same refund");

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.reconcile_once().await.settled, 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let settled = app.refund(payment_id, Some("10.00"), &key).await;
    assert_eq!(settled.status(), 201);
    assert_eq!(settled.headers()["idempotent-replayed"], "true");
    assert_eq!(json(settled).await["id"], refund_id.as_str());
    assert_eq!(app.provider.refunds().await.len(), 1, "one refund at the provider");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "10.00");
}

/// Two refunds of one payment settling at once each move the order; the times that order their
/// events come from the database once the order is locked. The first settle to reach the order
/// is held there while the second starts: it waits for the order, and commits after, later in
/// time. (Before, each read its clock before waiting: the second committed first with a later
/// time, and the first then gave the order an `updated_at` that went backwards, so the newest
/// event said `partially_refunded` of an order that was `refunded`.)
#[tokio::test]
async fn refunds_settling_together_stamp_the_order_in_the_order_they_commit() {
    let app = spawn_app_with(|_, mock| mock.settle_after = Duration::from_millis(200)).await;
    let (order_id, payment) = app.paid_order("40.00", "pm_refund_pending").await;
    let payment_id = payment["id"].as_str().unwrap();
    for amount in ["15.00", "25.00"] {
        assert_eq!(app.refund(payment_id, Some(amount), &new_key()).await.status(), 202);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = orderpay::hooks::pause("refund.settle.order_locked");
    let pass = app.reconcile_once();
    let release = async {
        tokio::time::timeout(Duration::from_secs(10), held.reached())
            .await
            .expect("a settle reached the order");
        // The other settle runs meanwhile; it must wait for the order.
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release();
    };
    let (pass, ()) = tokio::join!(pass, release);
    assert_eq!(pass.settled, 2, "{pass:?}");
    let order = app.get_json(&format!("/orders/{order_id}")).await;
    assert_eq!(order["status"], "refunded");
    let mut order_events: Vec<Value> = app.get_json("/events?limit=100").await["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["type"].as_str().unwrap().starts_with("order."))
        .map(|event| event["data"]["object"].clone())
        .collect();
    order_events.sort_by_key(|order| {
        order["updated_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap()
    });
    let newest = order_events.last().unwrap();
    assert_eq!(newest["status"], "refunded", "the newest event is the order as it is: {order_events:?}");
    assert_eq!(newest["updated_at"], order["updated_at"]);
}

over_both_wires! {
/// A refund whose first send the provider refuses for our credentials is recorded, not sent:
/// 503 `provider-unavailable` names it, it holds its amount (another refund cannot take it
/// meanwhile, since it will be carried out), and the retry with the same key refunds once.
async fn a_refund_refused_for_our_credentials_is_held_unsent_and_its_retry_refunds_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("40.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();
    app.provider.script(json!([{"act": "unauthorized"}])).await;
    let refused = app.refund(payment_id, Some("25.00"), &key).await;
    assert_eq!(refused.headers()["orderpay-should-retry"], "true");
    let problem = assert_problem(refused, 503, "provider-unavailable").await;
    let refund_id = problem["resource_id"].as_str().expect("the problem names the refund").to_owned();
    assert_eq!(app.get_refund(&refund_id).await["status"], "processing");
    assert!(app.provider.refunds().await.is_empty(), "nothing was refunded");

    let over = app.refund(payment_id, Some("15.01"), &new_key()).await;
    assert_eq!(assert_problem(over, 422, "refund-exceeds-refundable").await["refundable_amount"], "15.00");

    let retried = app.refund(payment_id, Some("25.00"), &key).await;
    assert_eq!(retried.status(), 201);
    let refund = json(retried).await;
    assert_eq!(
        (refund["id"].as_str(), refund["status"].as_str()),
        (Some(refund_id.as_str()), Some("succeeded"))
    );
    assert_eq!(app.provider.refunds().await.len(), 1, "one refund at the provider");
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
}
}

/// A refund's downstream key taken at the provider by another request with other parameters:
/// our re-send is refused with `idempotency_error`, unacted, so the refund is held for a person
/// as a payment is. It stays `processing` with no check scheduled (the refunds table allows a
/// refund in flight without one), and the reconciler leaves it alone and never gives it up.
/// Only on Stripe's wire, where the lookup is by our metadata and cannot see the other refund.
#[tokio::test]
async fn a_refund_key_the_provider_holds_with_other_parameters_holds_the_refund_for_a_person() {
    let app = spawn_app_on_wire(crate::helpers::TestWire::Stripe).await;
    let (_, payment) = app.paid_order("40.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    app.provider.script(json!([{"act": "unavailable"}])).await;
    let accepted = app.refund(payment_id, Some("15.00"), &new_key()).await;
    assert_eq!(accepted.status(), 202, "the first send met a 503");
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    // Another request takes our downstream key first, with another amount and none of ours.
    let intent =
        app.text(&format!("SELECT provider_charge_id AS text FROM payments WHERE id = '{payment_id}'")).await;
    let taken = app
        .provider
        .client
        .post(format!("{}/v1/refunds", app.provider.address))
        .bearer_auth(crate::helpers::STRIPE_TEST_KEY)
        .header("Idempotency-Key", format!("orderpay_refund_{refund_id}"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("payment_intent={intent}&amount=100"))
        .send()
        .await
        .unwrap()
        .status();
    assert!(taken.is_success(), "{taken}");

    tokio::time::sleep(Duration::from_millis(100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.stuck, pass.gave_up, pass.settled), (1, 1, 0, 0), "{pass:?}");
    let held = format!(
        "SELECT count(*) AS count FROM refunds WHERE id = '{refund_id}' AND status = 'processing' \
         AND next_check_at IS NULL AND lease_id IS NULL AND last_error LIKE '%other parameters%'"
    );
    assert_eq!(app.count(&held).await, 1, "held, with why");
    for _ in 0..2 {
        let pass = app.reconcile_once().await;
        assert_eq!((pass.claimed, pass.gave_up), (0, 0), "left alone, never given up: {pass:?}");
    }
    assert_eq!(app.provider_refunds_for(&refund_id).await.len(), 1, "only the other request's");
}
