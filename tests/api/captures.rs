//! Two-step charges: a payment with `capture_method: manual` authorizes, then a capture takes
//! all or part of it, or a void lets it go; the authorization expires if neither comes. Every
//! answer and its replay, one provider operation per request (counted at the mock provider),
//! and the unknown-outcome windows of captures.

use std::time::Duration;

use futures::future::join_all;
use reqwest::{Method, Response};
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, assert_problem, json, new_key, over_both_wires, spawn_app, spawn_app_on_wire, spawn_app_with,
};

impl TestApp {
    /// An order of `total` authorized (not captured) with `payment_method`; its id and the payment.
    pub async fn authorized_order(&self, total: &str, payment_method: &str) -> (String, Value) {
        let body = json!({"currency": "USD", "items": [{"sku": "s", "quantity": 1, "unit_price": total}]});
        let order = json(self.post_order(&body, None).await).await;
        let order_id = order["id"].as_str().unwrap().to_owned();
        let body =
            json!({"order_id": order_id, "payment_method": payment_method, "capture_method": "manual"});
        let authorized = self.pay_with(&body, &new_key()).await;
        assert_eq!(authorized.status(), 201, "the payment is authorized");
        (order_id, json(authorized).await)
    }

    /// `POST /payments/{id}/capture`, with `{amount}` when given.
    pub async fn capture(&self, payment_id: &str, amount: Option<&str>, key: &str) -> Response {
        let mut request = self
            .request(Method::POST, &format!("/payments/{payment_id}/capture"))
            .header("Idempotency-Key", key);
        if let Some(amount) = amount {
            request = request.json(&json!({ "amount": amount }));
        }
        request.send().await.expect("POST /payments/{id}/capture")
    }

    /// `POST /payments/{id}/void`.
    pub async fn void(&self, payment_id: &str, key: &str) -> Response {
        let request = self
            .request(Method::POST, &format!("/payments/{payment_id}/void"))
            .header("Idempotency-Key", key);
        request.send().await.expect("POST /payments/{id}/void")
    }

    /// The provider's view of the charge behind `payment`.
    pub async fn provider_charge(&self, payment_id: &str) -> Value {
        let charges = self.provider.charges_for(payment_id).await;
        assert_eq!(charges.len(), 1, "one charge per payment: {charges:?}");
        charges[0].clone()
    }
}

over_both_wires! {
async fn a_manual_payment_authorizes_and_a_capture_takes_it_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("40.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    assert_eq!(payment["status"], "requires_capture");
    assert_eq!(payment["capture_method"], "manual");
    assert_eq!(payment["amount_capturable"], "40.00");
    assert_eq!(payment["amount_captured"], "0.00");
    assert_eq!(app.order_status(&order_id).await, "authorized");
    assert_eq!(app.provider_charge(payment_id).await["status"], "requires_capture");

    // An authorized order is neither paid again nor cancelled.
    assert_problem(app.pay(&order_id, "pm_card_ok", &new_key()).await, 409, "invalid-state").await;
    assert_problem(app.cancel_order(&order_id, None).await, 409, "invalid-state").await;

    let key = new_key();
    let captured = app.capture(payment_id, None, &key).await;
    assert_eq!(captured.status(), 200);
    let body = captured.text().await.unwrap();
    let captured: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(captured["status"], "succeeded");
    assert_eq!(captured["amount_captured"], "40.00");
    assert_eq!(captured["amount_capturable"], "0.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let charge = app.provider_charge(payment_id).await;
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(charge["amount_captured"], "40.00");

    let replay = app.capture(payment_id, None, &key).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), body);
    // Captured now: another capture or a void is refused (and stored).
    assert_problem(app.capture(payment_id, None, &new_key()).await, 409, "invalid-state").await;
    assert_problem(app.void(payment_id, &new_key()).await, 409, "invalid-state").await;
    assert_eq!(app.count("SELECT count(*) AS count FROM payment_operations").await, 1);
    assert_eq!(app.transitions(payment_id, "succeeded").await, 1);
}
}

over_both_wires! {
async fn a_partial_capture_releases_the_rest_and_bounds_the_refunds(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("100.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let too_much = app.capture(payment_id, Some("100.01"), &new_key()).await;
    assert_eq!(
        assert_problem(too_much, 422, "capture-exceeds-capturable").await["capturable_amount"],
        "100.00"
    );
    let too_fine = app.capture(payment_id, Some("10.001"), &new_key()).await;
    assert_problem(too_fine, 422, "validation-failed").await;

    let captured = json(app.capture(payment_id, Some("60.00"), &new_key()).await).await;
    assert_eq!(captured["status"], "succeeded");
    assert_eq!(captured["amount_captured"], "60.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let over = app.refund(payment_id, Some("60.01"), &new_key()).await;
    assert_eq!(assert_problem(over, 422, "refund-exceeds-refundable").await["refundable_amount"], "60.00");
    let refunded = app.refund(payment_id, None, &new_key()).await;
    assert_eq!(json(refunded).await["amount"], "60.00");
    assert_eq!(app.order_status(&order_id).await, "refunded");
}
}

over_both_wires! {
async fn a_void_lets_the_authorization_go_and_the_order_can_be_paid_again(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("25.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();
    let voided = app.void(payment_id, &key).await;
    assert_eq!(voided.status(), 200);
    let voided = json(voided).await;
    assert_eq!(voided["status"], "canceled");
    assert!(voided["failure_code"].is_null());
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    assert_eq!(app.provider_charge(payment_id).await["status"], "canceled");
    let replay = app.void(payment_id, &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_problem(app.capture(payment_id, None, &new_key()).await, 409, "invalid-state").await;

    let paid = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_eq!(paid.status(), 201, "a new key pays the order");
    assert_eq!(app.order_status(&order_id).await, "paid");
}
}

over_both_wires! {
async fn an_expired_authorization_refuses_its_capture_and_frees_the_order(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        mock.auth_ttl = Duration::from_millis(200);
    })
    .await;
    let (order_id, payment) = app.authorized_order("30.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let key = new_key();
    let expired = app.capture(payment_id, None, &key).await;
    assert_problem(expired, 402, "authorization-expired").await;
    let payment = app.get_payment(payment_id).await;
    assert_eq!(payment["status"], "canceled");
    assert_eq!(payment["failure_code"], "authorization_expired");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    let replay = app.capture(payment_id, None, &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_problem(replay, 402, "authorization-expired").await;
    assert_eq!(app.pay(&order_id, "pm_card_ok", &new_key()).await.status(), 201);
}
}

over_both_wires! {
async fn the_reconciler_cancels_authorizations_the_provider_let_go(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        // Long enough that the first pass runs before the expiry even when the suite loads
        // both cores (one second was once too short).
        mock.auth_ttl = Duration::from_millis(3000);
    })
    .await;
    let (order_id, payment) = app.authorized_order("30.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let first = app.reconcile_once().await;
    assert_eq!(first.claimed, 0, "not due before it expires");
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled), (1, 1), "{pass:?}");
    let payment = app.get_payment(payment_id).await;
    assert_eq!(payment["status"], "canceled");
    assert_eq!(payment["failure_code"], "authorization_expired");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    assert_eq!(app.reconcile_once().await.claimed, 0, "nothing left to watch");
}
}

over_both_wires! {
/// A capture after the authorization expired answers 402 `authorization-expired` whoever
/// noticed the expiry first: here the reconciler did (the payment is `canceled` already), and the
/// capture answers as it would had its own provider call found it (before: 409 `invalid-state`).
async fn a_capture_after_the_reconciler_saw_the_expiry_answers_402_authorization_expired(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        mock.auth_ttl = Duration::from_millis(300);
    })
    .await;
    let (_, payment) = app.authorized_order("30.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(app.reconcile_once().await.settled, 1, "the reconciler records the expiry");
    let key = new_key();
    assert_problem(app.capture(payment_id, None, &key).await, 402, "authorization-expired").await;
    let replay = app.capture(payment_id, None, &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_problem(replay, 402, "authorization-expired").await;
    // A void is refused the same way: there is nothing left to let go.
    assert_problem(app.void(payment_id, &new_key()).await, 402, "authorization-expired").await;
    assert_eq!(app.provider_charge(payment_id).await["status"], "canceled");
}
}

over_both_wires! {
async fn a_declined_capture_leaves_the_authorization_waiting(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("30.00", "pm_capture_declined").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();
    let declined = app.capture(payment_id, None, &key).await;
    let problem = assert_problem(declined, 402, "capture-declined").await;
    assert_eq!(problem["decline_code"], "capture_declined");
    assert_eq!(app.get_payment(payment_id).await["status"], "requires_capture");
    assert_eq!(app.order_status(&order_id).await, "authorized");
    let replay = app.capture(payment_id, None, &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    // The authorization can still be voided.
    assert_eq!(app.void(payment_id, &new_key()).await.status(), 200);
}
}

over_both_wires! {
async fn capture_racing_void_moves_the_authorization_once(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        settings.database.pool_size = 16;
    })
    .await;
    for _ in 0..5 {
        let (order_id, payment) = app.authorized_order("10.00", "pm_card_ok").await;
        let payment_id = payment["id"].as_str().unwrap();
        let (capture_key, void_key) = (new_key(), new_key());
        let (capture, void) =
            tokio::join!(app.capture(payment_id, None, &capture_key), app.void(payment_id, &void_key));
        let statuses = [capture.status().as_u16(), void.status().as_u16()];
        let losing = if statuses[0] == 200 { void } else { capture };
        assert!(statuses.contains(&200) && statuses.contains(&409), "{statuses:?}");
        let problem = json(losing).await;
        assert!(
            ["invalid-state", "payment-in-progress"].contains(&problem["type"].as_str().unwrap()),
            "{problem}"
        );
        let payment = app.get_payment(payment_id).await;
        let charge = app.provider_charge(payment_id).await;
        if statuses[0] == 200 {
            assert_eq!(
                (payment["status"].as_str(), charge["status"].as_str()),
                (Some("succeeded"), Some("succeeded"))
            );
            assert_eq!(app.order_status(&order_id).await, "paid");
        } else {
            assert_eq!(
                (payment["status"].as_str(), charge["status"].as_str()),
                (Some("canceled"), Some("canceled"))
            );
            assert_eq!(app.order_status(&order_id).await, "pending_payment");
        }
        let operations = app
            .count(&format!(
                "SELECT count(*) AS count FROM payment_operations \
                 WHERE payment_id = '{payment_id}' AND status = 'succeeded'"
            ))
            .await;
        assert_eq!(operations, 1, "one capture or void happened");
    }
}
}

over_both_wires! {
async fn a_capture_whose_answer_is_lost_shows_processing_and_is_settled_later(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("20.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    app.provider.set_faults(json!({"timeout_rate": 1.0})).await;
    let key = new_key();
    let accepted = app.capture(payment_id, None, &key).await;
    assert_eq!(accepted.status(), 202);
    assert_eq!(json(accepted).await["status"], "processing");
    assert_eq!(app.get_payment(payment_id).await["status"], "processing");
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled, pass.redriven), (1, 1, 0), "found captured, not captured again");
    assert_eq!(app.get_payment(payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let replay = app.capture(payment_id, None, &key).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}
}

over_both_wires! {
async fn a_capture_the_provider_never_received_is_given_up_without_failing_the_authorization(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        settings.reconciler.max_attempts = 2;
    })
    .await;
    let (order_id, payment) = app.authorized_order("20.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    app.provider.set_faults(json!({"error_rate": 1.0})).await;
    let key = new_key();
    assert_eq!(app.capture(payment_id, None, &key).await.status(), 202);
    // Checks until the last one, then the give-up once the last send has been quiet (1.1 s).
    let mut gave_up = 0;
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        gave_up += app.reconcile_once().await.gave_up;
    }
    assert_eq!(gave_up, 1);
    let failed = app.capture(payment_id, None, &key).await;
    assert_problem(failed, 402, "capture-failed").await;
    assert_eq!(app.get_payment(payment_id).await["status"], "requires_capture", "the authorization stands");
    assert_eq!(app.order_status(&order_id).await, "authorized");
    app.provider.set_faults(json!({})).await;
    assert_eq!(app.capture(payment_id, None, &new_key()).await.status(), 200, "a new capture works");
    assert_eq!(app.provider_charge(payment_id).await["amount_captured"], "20.00");
}
}

over_both_wires! {
async fn two_reconcilers_and_a_retry_racing_on_one_capture_apply_one_transition_w6(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (_, payment) = app.authorized_order("12.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    app.provider.set_faults(json!({"timeout_rate": 1.0})).await;
    let key = new_key();
    assert_eq!(app.capture(payment_id, None, &key).await.status(), 202);
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (passes, retry) = tokio::join!(
        join_all([app.reconcile_once(), app.reconcile_once()]),
        app.capture(payment_id, None, &key)
    );
    assert!([200, 409].contains(&retry.status().as_u16()), "retry answered {}", retry.status());
    let claimed: usize = passes.iter().map(|pass| pass.claimed).sum();
    assert!(claimed <= 1, "{passes:?}");
    assert_eq!(app.transitions(payment_id, "succeeded").await, 1, "one payment transition");
    let operation = app
        .count(&format!(
            "SELECT count(*) AS count FROM payment_events WHERE payment_id = '{payment_id}' AND subject = 'capture'"
        ))
        .await;
    assert_eq!(operation, 1, "one capture transition");
    assert_eq!(app.provider_charge(payment_id).await["amount_captured"], "12.00");
}
}

#[tokio::test]
async fn capture_and_void_need_a_key_and_an_authorized_payment_of_the_account() {
    let app = spawn_app().await;
    let (_, payment) = app.authorized_order("5.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let no_key = app.request(Method::POST, &format!("/payments/{payment_id}/capture")).send().await.unwrap();
    assert_problem(no_key, 400, "idempotency-key-missing").await;
    let unknown = app.capture(&uuid::Uuid::now_v7().to_string(), None, &new_key()).await;
    assert_problem(unknown, 404, "not-found").await;
    let (_, other_key) = app.create_account("someone else").await;
    let foreign = app
        .client
        .post(app.url(&format!("/payments/{payment_id}/void")))
        .bearer_auth(&other_key)
        .header("Idempotency-Key", new_key())
        .send()
        .await
        .unwrap();
    assert_problem(foreign, 404, "not-found").await;
    let bad_body = app
        .request(Method::POST, &format!("/payments/{payment_id}/void"))
        .header("Idempotency-Key", new_key())
        .json(&json!({"amount": "1.00"}))
        .send()
        .await
        .unwrap();
    assert_problem(bad_body, 422, "validation-failed").await;
    let automatic = app.paid_order("5.00", "pm_card_ok").await.1;
    let refused = app.capture(automatic["id"].as_str().unwrap(), None, &new_key()).await;
    assert_eq!(assert_problem(refused, 409, "invalid-state").await["current_state"], "succeeded");
    assert_eq!(app.get_payment(payment_id).await["status"], "requires_capture");
}
