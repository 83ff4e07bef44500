//! Payments: each payment method's outcome and its replay, exactly one provider charge per
//! payment, the order's state, bad input, and concurrent duplicates.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{
    TestWire, assert_problem, json, new_key, over_both_wires, spawn_app, spawn_app_on_wire, spawn_app_with,
};

async fn order_id(app: &crate::helpers::TestApp) -> String {
    app.create_order().await["id"].as_str().unwrap().to_owned()
}

over_both_wires! {
async fn a_good_card_pays_the_order_with_one_charge_and_replays(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order = app.create_order().await;
    let order_id = order["id"].as_str().unwrap();
    let key = new_key();

    let response = app.pay(order_id, "pm_card_ok", &key).await;
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let body = response.text().await.unwrap();
    let payment: Value = serde_json::from_str(&body).unwrap();
    let payment_id = payment["id"].as_str().unwrap();
    assert_eq!(location, format!("/payments/{payment_id}"));
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["order_id"], order_id);
    assert_eq!(payment["amount"], order["total_amount"]);
    assert_eq!(payment["currency"], "USD");
    assert_eq!(app.order_status(order_id).await, "paid");
    assert_eq!(app.get_payment(payment_id).await, payment);

    let replay = app.pay(order_id, "pm_card_ok", &key).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), body);

    let charges = app.provider.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0]["idempotency_key"], format!("orderpay_pay_{payment_id}"));
    assert_eq!(charges[0]["status"], "succeeded");
    assert_eq!(charges[0]["amount"], order["total_amount"]);
    assert_eq!(payment["provider_charge_id"], wire.charge_id(charges[0]["id"].as_str().unwrap()));
}
}

over_both_wires! {
async fn a_decline_is_final_and_stored_and_a_new_key_can_pay(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();

    let declined = app.pay(&order_id, "pm_card_declined", &key).await;
    let problem = assert_problem(declined, 402, "payment-declined").await;
    assert_eq!(problem["decline_code"], "insufficient_funds");
    let payment_id = problem["payment_id"].as_str().unwrap().to_owned();
    assert_eq!(app.get_payment(&payment_id).await["status"], "failed");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");

    let replay = app.pay(&order_id, "pm_card_declined", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["orderpay-should-retry"], "false", "a final answer replays as it is");
    assert_eq!(assert_problem(replay, 402, "payment-declined").await, problem);

    let paid = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_eq!(paid.status(), 201);
    assert_eq!(app.order_status(&order_id).await, "paid");
    let statuses: Vec<Value> = app.provider.charges().await.iter().map(|c| c["status"].clone()).collect();
    assert_eq!(statuses, [json!("declined"), json!("succeeded")], "one charge per payment, one succeeded");
}
}

#[tokio::test]
async fn an_app_that_lost_a_payment_id_finds_it_through_its_order_or_the_payments_list() {
    let app = spawn_app().await;
    let order_key = new_key();
    let created = app.post_order(&crate::helpers::order_body(), Some(&order_key)).await;
    assert_eq!(created.status(), 201);
    let created = created.text().await.unwrap();
    let order_id = serde_json::from_str::<Value>(&created).unwrap()["id"].as_str().unwrap().to_owned();
    let declined =
        assert_problem(app.pay(&order_id, "pm_card_declined", &new_key()).await, 402, "payment-declined")
            .await["payment_id"]
            .clone();
    let paid = json(app.pay(&order_id, "pm_card_ok", &new_key()).await).await["id"].clone();
    let unpaid = app.create_order().await["id"].as_str().unwrap().to_owned();

    // The order as read lists its payments, oldest first; one without payments, none.
    let order = app.get_json(&format!("/orders/{order_id}")).await;
    assert_eq!(order["payment_ids"], json!([declined, paid]));
    assert_eq!(app.get_json(&format!("/orders/{unpaid}")).await["payment_ids"], json!([]));
    let orders = app.get_json("/orders").await;
    let listed: Vec<&Value> = orders["data"].as_array().unwrap().iter().map(|o| &o["payment_ids"]).collect();
    assert_eq!(listed, [&json!([]), &json!([declined, paid])]);
    // The creation's stored answer is what was decided then: replayed byte for byte, no payments.
    let replay = app.post_order(&crate::helpers::order_body(), Some(&order_key)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay = replay.text().await.unwrap();
    assert_eq!(replay, created);
    assert_eq!(serde_json::from_str::<Value>(&replay).unwrap()["payment_ids"], json!([]));
    // The order.paid event carries the order as a read right after the change did.
    let events = app.get_json("/events?type=order.paid").await;
    assert_eq!(events["data"][0]["data"]["object"]["payment_ids"], json!([declined, paid]));

    // GET /payments: newest first, by order and status, with the cursor of every list.
    let of_order = app.get_json(&format!("/payments?order_id={order_id}")).await;
    assert_eq!(of_order["object"], "list");
    let ids: Vec<&Value> = of_order["data"].as_array().unwrap().iter().map(|p| &p["id"]).collect();
    assert_eq!(ids, [&paid, &declined]);
    assert_eq!(of_order["data"][0], app.get_payment(paid.as_str().unwrap()).await);
    let failed = app.get_json(&format!("/payments?order_id={order_id}&status=failed")).await;
    assert_eq!(failed["data"].as_array().unwrap().len(), 1);
    assert_eq!(failed["data"][0]["id"], declined);
    let first = app.get_json("/payments?limit=1").await;
    assert_eq!((first["data"][0]["id"].clone(), first["has_more"].clone()), (paid.clone(), json!(true)));
    let rest = app.get_json(&format!("/payments?limit=1&starting_after={}", paid.as_str().unwrap())).await;
    assert_eq!((rest["data"][0]["id"].clone(), rest["has_more"].clone()), (declined.clone(), json!(false)));
    assert!(
        app.get_json(&format!("/payments?order_id={unpaid}")).await["data"].as_array().unwrap().is_empty()
    );

    for bad in ["status=settled", "order_id=42", "starting_after=nope", "limit=0", "colour=red"] {
        let response = app.request(Method::GET, &format!("/payments?{bad}")).send().await.unwrap();
        assert_problem(response, 400, "invalid-parameter").await;
    }
    let (_, other_key) = app.create_account("someone else").await;
    let theirs = app.client.get(app.url("/payments")).bearer_auth(&other_key).send().await.unwrap();
    assert_eq!(json(theirs).await["data"], json!([]));
}

#[tokio::test]
async fn a_paid_order_refuses_another_payment_without_calling_the_provider() {
    let app = spawn_app().await;
    let order_id = order_id(&app).await;
    assert_eq!(app.pay(&order_id, "pm_card_ok", &new_key()).await.status(), 201);

    let key = new_key();
    let refused = assert_problem(app.pay(&order_id, "pm_card_ok", &key).await, 409, "invalid-state").await;
    assert_eq!(refused["current_state"], "paid");
    let replay = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(assert_problem(replay, 409, "invalid-state").await, refused);

    assert_eq!(app.provider.charges().await.len(), 1, "no second charge");
    assert_eq!(app.payments_stored().await, 1);
    // A paid order cannot be cancelled either.
    assert_problem(app.cancel_order(&order_id, None).await, 409, "invalid-state").await;
}

#[tokio::test]
async fn a_cancelled_order_cannot_be_paid() {
    let app = spawn_app().await;
    let order_id = order_id(&app).await;
    assert_eq!(app.cancel_order(&order_id, None).await.status(), 200);
    let refused =
        assert_problem(app.pay(&order_id, "pm_card_ok", &new_key()).await, 409, "invalid-state").await;
    assert_eq!(refused["current_state"], "cancelled");
    assert!(app.provider.charges().await.is_empty());
}

over_both_wires! {
async fn twenty_concurrent_copies_of_a_payment_charge_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    let responses = join_all((0..20).map(|_| app.pay(&order_id, "pm_card_ok", &key))).await;
    let mut statuses = HashSet::new();
    let mut payment_ids = HashSet::new();
    for response in responses {
        let status = response.status().as_u16();
        statuses.insert(status);
        let body = json(response).await;
        match status {
            201 => payment_ids.insert(body["id"].as_str().unwrap().to_owned()),
            409 => {
                assert_eq!(body["type"], "idempotency-key-in-use", "{body}");
                payment_ids.insert(body["resource_id"].as_str().unwrap().to_owned())
            }
            other => panic!("unexpected {other}: {body}"),
        };
    }
    assert!(statuses.contains(&201), "{statuses:?}");
    assert_eq!(payment_ids.len(), 1, "every answer names the same payment");
    assert_eq!(app.provider.charges().await.len(), 1);
    assert_eq!(app.payments_stored().await, 1);
    assert_eq!(app.order_status(&order_id).await, "paid");
}
}

/// Many clients paying one order at once, each with its own key: starting a payment (order row,
/// then the payment's unique index) and settling another (order row, then the payment) take
/// their locks in one order, so the load ends with one payment per order and only final or
/// "wait" answers: no deadlock, no 500, no 202 without a provider fault, and never "key in use"
/// for a key nobody else used.
#[tokio::test]
async fn concurrent_payers_of_one_order_never_deadlock() {
    // Enough connections for the payers to meet in the database.
    let app = spawn_app_with(|settings, _| settings.database.pool_size = 16).await;
    let deadlocks_before = deadlocks(&app).await;
    let mut orders = Vec::new();
    for _ in 0..30 {
        orders.push(order_id(&app).await);
    }
    let attempts = orders.iter().flat_map(|order_id| (0..10).map(move |_| order_id.clone()));
    let app = &app;
    let answers = join_all(attempts.map(|order_id| async move {
        let response = app.pay(&order_id, "pm_card_ok", &new_key()).await;
        let status = response.status().as_u16();
        (order_id, status, json(response).await)
    }))
    .await;
    let mut paid = HashSet::new();
    for (order_id, status, body) in &answers {
        match status {
            201 => assert!(paid.insert(order_id.clone()), "one payment per order: {body}"),
            409 => assert!(
                ["payment-in-progress", "invalid-state"].contains(&body["type"].as_str().unwrap()),
                "a new key is never in use elsewhere: {body}"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(paid.len(), orders.len(), "every order paid once");
    let succeeded =
        app.provider.charges().await.iter().filter(|charge| charge["status"] == "succeeded").count();
    assert_eq!(succeeded, orders.len());
    assert_eq!(deadlocks(app).await, deadlocks_before, "PostgreSQL detected no deadlock");
}

/// Deadlocks PostgreSQL detected in the test's database. A backend reports its statistics when
/// it ends, so the app's connections are ended first (its pools open new ones).
async fn deadlocks(app: &crate::helpers::TestApp) -> i64 {
    app.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity          WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.count("SELECT deadlocks AS count FROM pg_stat_database WHERE datname = current_database()").await
}

over_both_wires! {
async fn a_duplicate_while_the_first_is_at_the_provider_is_told_to_wait(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    let first = app.pay(&order_id, "pm_provider_timeout", &key);
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        app.pay(&order_id, "pm_provider_timeout", &key).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.status(), 202);
    let retry_after: u64 = second.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(second.headers()["orderpay-should-retry"], "true");
    let problem = assert_problem(second, 409, "idempotency-key-in-use").await;
    assert_eq!(problem["resource_id"], json(first).await["id"]);
}
}

over_both_wires! {
async fn pending_charges_settle_through_the_reconciler_w5(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    let accepted = app.pay(&order_id, "pm_provider_pending", &key).await;
    assert_eq!(accepted.status(), 202);
    let payment = json(accepted).await;
    let payment_id = payment["id"].as_str().unwrap();
    assert_eq!(payment["status"], "processing");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");

    // Still pending at the provider: the reconciler checks and leaves it for later.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let early = app.reconcile_once().await;
    assert_eq!((early.claimed, early.settled, early.rescheduled, early.redriven), (1, 0, 1, 0));
    assert_eq!(app.get_payment(payment_id).await["status"], "processing");

    tokio::time::sleep(Duration::from_millis(400)).await;
    let settled = app.reconcile_once().await;
    assert_eq!((settled.claimed, settled.settled), (1, 1));
    assert_eq!(app.get_payment(payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "paid");

    let retry = app.pay(&order_id, "pm_provider_pending", &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true", "the final answer, as a replay");
    assert_eq!(app.provider.charges_for(payment_id).await.len(), 1);
}
}

over_both_wires! {
async fn a_timeout_answers_202_in_time_and_is_settled_later_w3(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    let started = Instant::now();
    let accepted = app.pay(&order_id, "pm_provider_timeout", &key).await;
    let waited = started.elapsed();
    assert_eq!(accepted.status(), 202);
    assert!(waited < Duration::from_secs(3), "answered after the provider timeout (1 s), took {waited:?}");
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing", "never failed on a guess");

    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.settled, pass.redriven), (1, 0), "found at the provider, not charged again");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let retry = app.pay(&order_id, "pm_provider_timeout", &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json(retry).await["status"], "succeeded");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1);
}
}

over_both_wires! {
async fn a_retry_after_202_resumes_the_payment_itself(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    assert_eq!(app.pay(&order_id, "pm_provider_pending", &key).await.status(), 202);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The lease was released with the 202: the retry takes the key over and asks the provider.
    let retry = app.pay(&order_id, "pm_provider_pending", &key).await;
    assert_eq!(retry.status(), 201);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.order_status(&order_id).await, "paid");
    assert_eq!(app.provider.charges().await.len(), 1);
}
}

over_both_wires! {
async fn provider_5xx_is_never_success_without_a_charge_nor_failure_on_a_guess_w4(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    let accepted = app.pay(&order_id, "pm_provider_down", &key).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    // Below the attempt limit every pass re-sends (the provider never received it) and waits.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let pass = app.reconcile_once().await;
        assert_eq!((pass.claimed, pass.redriven, pass.rescheduled, pass.settled), (1, 1, 1, 0));
        assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    }
    assert!(app.provider.charges().await.is_empty(), "nothing was charged");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");

    // At the limit the last check only looks; the give-up still waits until the last send has
    // been quiet for the provider timeout and a margin (1.1 s here): it could yet land.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let held_back = app.reconcile_once().await;
    assert_eq!((held_back.claimed, held_back.redriven, held_back.gave_up), (1, 0, 0), "{held_back:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    // Then the reconciler gives up, explicitly, with a reason.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pass = app.reconcile_once().await;
    assert_eq!(pass.gave_up, 1, "{pass:?}");
    let payment = app.get_payment(&payment_id).await;
    assert_eq!(payment["status"], "failed");
    assert_eq!(payment["failure_code"], "reconciliation_gave_up");
    let replay = app.pay(&order_id, "pm_provider_down", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_problem(replay, 402, "payment-failed").await;
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
}
}

#[tokio::test]
async fn an_order_with_a_payment_in_flight_is_neither_paid_again_nor_cancelled() {
    let app = spawn_app().await;
    let order_id = order_id(&app).await;
    let accepted = app.pay(&order_id, "pm_provider_pending", &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].clone();

    let second = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert!(second.headers().contains_key("retry-after"));
    assert_eq!(assert_problem(second, 409, "payment-in-progress").await["payment_id"], payment_id);
    let cancel = assert_problem(app.cancel_order(&order_id, None).await, 409, "payment-in-progress").await;
    assert_eq!(cancel["payment_id"], payment_id);
    assert_eq!(app.provider.charges().await.len(), 1);
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
}

#[tokio::test]
async fn bad_payment_requests_store_nothing_and_charge_nothing() {
    let app = spawn_app().await;
    let order_id = order_id(&app).await;
    let cases = [
        ("missing order_id", json!({"payment_method": "pm_card_ok"}), "order_id"),
        ("order_id not a UUID", json!({"order_id": "ord_1", "payment_method": "pm_card_ok"}), "order_id"),
        ("unknown method", json!({"order_id": order_id, "payment_method": "bitcoin"}), "payment_method"),
        ("method not a string", json!({"order_id": order_id, "payment_method": 7}), "payment_method"),
        (
            "amount mismatch",
            json!({"order_id": order_id, "payment_method": "pm_card_ok", "amount": "1.00"}),
            "amount",
        ),
        (
            "amount negative",
            json!({"order_id": order_id, "payment_method": "pm_card_ok", "amount": "-48.48"}),
            "amount",
        ),
        ("unknown field", json!({"order_id": order_id, "payment_method": "pm_card_ok", "tip": "1"}), "tip"),
    ];
    for (name, body, field) in cases {
        let problem = assert_problem(app.pay_with(&body, &new_key()).await, 422, "validation-failed").await;
        assert_eq!(problem["errors"][0]["field"], field, "{name}: {problem}");
    }
    let malformed = app
        .request(Method::POST, "/payments")
        .header("Idempotency-Key", new_key())
        .header("Content-Type", "application/json")
        .body("{\"order_id\":")
        .send()
        .await
        .unwrap();
    assert_problem(malformed, 400, "malformed-json").await;
    let no_key = app
        .request(Method::POST, "/payments")
        .json(&json!({"order_id": order_id, "payment_method": "pm_card_ok"}))
        .send()
        .await
        .unwrap();
    assert_problem(no_key, 400, "idempotency-key-missing").await;
    let unknown_order = json!({"order_id": uuid::Uuid::now_v7(), "payment_method": "pm_card_ok"});
    assert_problem(app.pay_with(&unknown_order, &new_key()).await, 404, "not-found").await;

    assert_eq!(app.payments_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);
    assert!(app.provider.charges().await.is_empty());
    // The matching amount, as a string or a JSON number, is accepted.
    let exact = json!({"order_id": order_id, "payment_method": "pm_card_ok", "amount": 48.48});
    assert_eq!(app.pay_with(&exact, &new_key()).await.status(), 201);
}

#[tokio::test]
async fn payments_are_scoped_by_account() {
    let app = spawn_app().await;
    let (_, other_key) = app.create_account("other").await;
    let order_id = order_id(&app).await;
    let payment = json(app.pay(&order_id, "pm_card_ok", &new_key()).await).await;
    let payment_id = payment["id"].as_str().unwrap();

    let read =
        app.client.get(app.url(&format!("/payments/{payment_id}"))).bearer_auth(&other_key).send().await;
    assert_problem(read.unwrap(), 404, "not-found").await;
    let pay_theirs = app
        .client
        .post(app.url("/payments"))
        .bearer_auth(&other_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({"order_id": order_id, "payment_method": "pm_card_ok"}))
        .send()
        .await
        .unwrap();
    assert_problem(pay_theirs, 404, "not-found").await;
    assert_problem(app.request(Method::GET, "/payments/not-a-uuid").send().await.unwrap(), 404, "not-found")
        .await;
    assert_eq!(app.provider.charges().await.len(), 1);
}

#[tokio::test]
async fn the_mock_provider_injects_faults_on_request() {
    let app = spawn_app_with(|_, mock| mock.timeout_hold = std::time::Duration::from_secs(2)).await;
    app.provider.set_faults(json!({"error_rate": 1.0})).await;
    let order_id = order_id(&app).await;
    let accepted = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_eq!(accepted.status(), 202, "a 503 fault is an unknown outcome");
    assert!(app.provider.charges().await.is_empty());
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.redriven, pass.settled), (1, 1));
    assert_eq!(app.order_status(&order_id).await, "paid");
    assert_eq!(app.provider.charges().await.len(), 1);
}

over_both_wires! {
async fn a_charge_the_provider_never_settles_is_never_failed_on_a_guess(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        mock.settle_after = Duration::from_secs(3600);
    })
    .await;
    let order_id = order_id(&app).await;
    let accepted = app.pay(&order_id, "pm_provider_pending", &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    let mut last = Default::default();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        last = app.reconcile_once().await;
        assert_eq!(last.claimed, 1);
    }
    // Past the attempt limit the provider still says pending: failing it would be a guess.
    assert_eq!((last.stuck, last.gave_up, last.settled), (1, 0, 0));
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    let second = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_problem(second, 409, "payment-in-progress").await;
    assert_eq!(app.provider.charges().await.len(), 1, "no second charge while the first is unknown");
}
}

#[tokio::test]
async fn a_key_is_bound_to_the_canonical_route_not_the_typed_one() {
    let app = spawn_app().await;
    let order_id = order_id(&app).await;
    let key = new_key();
    let upper = app.cancel_order(&order_id.to_uppercase(), Some(&key)).await;
    assert_eq!(upper.status(), 200);
    let lower = app.cancel_order(&order_id, Some(&key)).await;
    assert_eq!(lower.status(), 200);
    assert_eq!(lower.headers()["idempotent-replayed"], "true");
}

/// Two requests with one key never get two different final answers. The first pays an order
/// that is authorized (not payable): its start statement commits the claim with the refusal it
/// answers next; it is held between the two. Meanwhile the authorization is voided (the order is
/// payable again) and a retry with the same key arrives. Before, the retry cleared the claim as
/// "never started" and ran again: it charged the order (201) while the first answered 409. Now
/// the retry waits for the live claimer (409 `idempotency-key-in-use`), then replays its answer.
#[tokio::test]
async fn a_retry_never_runs_again_beside_a_claimer_about_to_store_its_answer() {
    let app = spawn_app().await;
    let (order_id, authorization) = app.authorized_order("25.00", "pm_card_ok").await;
    let key = new_key();
    let mut held = orderpay::hooks::pause("start.before_answer");
    let first = {
        let (app, order_id, key) = (&app, order_id.clone(), key.clone());
        async move { app.pay(&order_id, "pm_card_ok", &key).await }
    };
    let retry = async {
        held.reached().await;
        let voided = app.void(authorization["id"].as_str().unwrap(), &new_key()).await;
        assert_eq!(voided.status(), 200, "the order is payable again");
        let retry = app.pay(&order_id, "pm_card_ok", &key).await;
        assert_problem(retry, 409, "idempotency-key-in-use").await;
        held.release();
    };
    let (first, ()) = tokio::join!(first, retry);
    let first = assert_problem(first, 409, "invalid-state").await;
    let replay = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(assert_problem(replay, 409, "invalid-state").await, first);
    assert_eq!(app.provider.charges().await.len(), 1, "only the voided authorization: nothing charged");
}

/// The in-memory copy of a final answer lives as long as its key, not as long as the key's
/// lifetime counted from when the answer was known: a payment answered 600 ms after its key was
/// claimed (the provider is slow), keys living 1 s. At 1.2 s the key has expired: a retry is a
/// new request (the order is paid: 409), never a replay from memory that no other instance
/// would give.
#[tokio::test]
async fn a_remembered_answer_expires_with_its_key() {
    let app = spawn_app_with(|settings, _| {
        settings.api.idempotency_retention = Duration::from_secs(1);
        settings.provider.timeout = Duration::from_secs(2);
    })
    .await;
    let order_id = order_id(&app).await;
    app.provider.set_faults(json!({"latency_ms": 600})).await;
    let key = new_key();
    let claimed = std::time::Instant::now();
    assert_eq!(app.pay(&order_id, "pm_card_ok", &key).await.status(), 201);
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(claimed.elapsed())).await;
    let retry = app.pay(&order_id, "pm_card_ok", &key).await;
    assert!(retry.headers().get("idempotent-replayed").is_none(), "not replayed from memory");
    assert_problem(retry, 409, "invalid-state").await;
    assert_eq!(app.provider.charges().await.len(), 1);
}

/// One database error ends one operation's check, not the whole pass: of two payments and a
/// refund waiting for the reconciler, one payment's row cannot be read (its currency is one this
/// version does not know). The pass settles the other payment and the refund, counts one error,
/// and the unreadable payment is left for a later pass. Before, the pass failed as a whole and
/// nothing settled.
#[tokio::test]
async fn one_unreadable_operation_ends_its_own_check_not_the_pass() {
    let app = spawn_app().await;
    let (_, paid) = app.paid_order("20.00", "pm_card_ok").await;
    app.provider.set_faults(json!({"error_rate": 1.0})).await;
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
        let accepted = app.pay(&order_id, "pm_card_ok", &new_key()).await;
        assert_eq!(accepted.status(), 202);
        waiting.push(json(accepted).await["id"].as_str().unwrap().to_owned());
    }
    let refund = app.refund(paid["id"].as_str().unwrap(), Some("5.00"), &new_key()).await;
    assert_eq!(refund.status(), 202);
    app.provider.set_faults(json!({})).await;
    app.execute(&format!("UPDATE payments SET currency = 'XXX' WHERE id = '{}'", waiting[0])).await;

    tokio::time::sleep(Duration::from_millis(100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled, pass.errors), (3, 2, 1), "{pass:?}");
    assert_eq!(app.get_payment(&waiting[1]).await["status"], "succeeded");
    assert_eq!(app.get_payment(paid["id"].as_str().unwrap()).await["amount_refunded"], "5.00");
    let unread = format!(
        "SELECT count(*) AS count FROM payments WHERE id = '{}' AND status = 'processing'",
        waiting[0]
    );
    assert_eq!(app.count(&unread).await, 1, "left for a later pass");
}

over_both_wires! {
/// A provider that refuses our credentials (a revoked API key) on the first send has done
/// nothing: the request answers 503 `provider-unavailable` naming the payment it recorded, no
/// answer stored; the reconciler's re-sends count no check however long it lasts (so it never
/// reaches the look-only last check, nor a give-up), each one the longest backoff away and
/// counted on the `auth` metric; once the key works the client's retry of the same key charges
/// once, under the same downstream key.
async fn a_refused_credential_sends_nothing_counts_no_check_and_the_retry_charges_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    app.provider.script(json!([{"act": "unauthorized"}])).await;
    let refused = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(refused.headers()["orderpay-should-retry"], "true");
    assert!(refused.headers().get("retry-after").is_some());
    let problem = assert_problem(refused, 503, "provider-unavailable").await;
    assert!(app.provider.charges().await.is_empty(), "nothing was charged");
    let waiting = format!(
        "SELECT count(*) AS count FROM payments WHERE id = '{}' AND status = 'processing' AND attempts = 0 \
         AND lease_until IS NULL AND answer_status IS NULL",
        problem["resource_id"].as_str().expect("the problem names the payment")
    );
    let waiting = waiting.as_str();
    assert_eq!(app.count(waiting).await, 1, "recorded, released for a retry, no answer stored");
    let auth_refusals = r#"orderpay_provider_errors_total{kind="auth"}"#;
    assert_eq!(app.metric(auth_refusals).await, 1);

    let passes = app.settings.reconciler.max_attempts + 2;
    let refusals: Vec<Value> = (0..passes).map(|_| json!({"act": "unauthorized"})).collect();
    app.provider.script(Value::Array(refusals)).await;
    for _ in 0..passes {
        app.execute("UPDATE payments SET next_check_at = now()").await;
        let pass = app.reconcile_once().await;
        assert_eq!((pass.claimed, pass.redriven, pass.rescheduled), (1, 1, 1), "{pass:?}");
        assert_eq!((pass.gave_up, pass.stuck, pass.settled), (0, 0, 0), "{pass:?}");
        assert_eq!(app.count(waiting).await, 1, "the check the claim counted is given back");
        // Measured from when the release scheduled it (its `updated_at`), not from when this
        // query runs: under the whole suite the query once came more than half a cap later.
        let cap = app.settings.reconciler.backoff_cap.as_millis() / 2;
        let far = format!(
            "SELECT count(*) AS count FROM payments WHERE next_check_at > updated_at + interval '{cap} ms'"
        );
        assert_eq!(app.count(&far).await, 1, "the next call is the longest backoff away, not the shortest");
    }
    assert_eq!(app.metric(auth_refusals).await, 1 + u64::try_from(passes).unwrap());
    assert!(app.provider.charges().await.is_empty(), "nothing was charged");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");

    let paid = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(paid.status(), 201);
    let payment = json(paid).await;
    assert_eq!(payment["status"], "succeeded");
    let payment_id = payment["id"].as_str().unwrap();
    let charges = app.provider.charges_for(payment_id).await;
    assert_eq!(charges.len(), 1, "one charge, under the payment's downstream key");
    assert_eq!(charges[0]["idempotency_key"], format!("orderpay_pay_{payment_id}"));
    assert_eq!(app.order_status(&order_id).await, "paid");
    let replay = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}
}

over_both_wires! {
/// The charge was made (its answer lost), then our key was revoked: the retry's takeover looks
/// it up and is refused, which says nothing about the charge, so it answers 202 `processing`
/// (never 503: the first send may have acted). However many passes the outage lasts, the
/// reconciler counts no check, so never reaches its look-only last check nor a give-up of a
/// charge that exists; once the key works it records the charge, once.
async fn a_charge_made_before_our_key_was_revoked_is_never_given_up_and_is_recorded_once_the_key_works(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = order_id(&app).await;
    let key = new_key();
    app.provider.script(json!([{"act": "hold"}])).await;
    let lost = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(lost.status(), 202, "the answer was lost");
    let payment_id = json(lost).await["id"].as_str().unwrap().to_owned();
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1, "the provider charged");

    app.provider.set_faults(json!({"credentials_revoked": true})).await;
    let retried = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(retried.status(), 202, "the refused lookup leaves the outcome unknown");
    let retried = json(retried).await;
    assert_eq!(
        (retried["id"].as_str(), retried["status"].as_str()),
        (Some(payment_id.as_str()), Some("processing"))
    );

    for _ in 0..app.settings.reconciler.max_attempts + 2 {
        app.execute("UPDATE payments SET next_check_at = now()").await;
        let pass = app.reconcile_once().await;
        assert_eq!((pass.claimed, pass.rescheduled, pass.gave_up, pass.stuck), (1, 1, 0, 0), "{pass:?}");
    }
    let counted = "SELECT attempts::bigint AS count FROM payments";
    assert_eq!(app.count(counted).await, 0, "no check counted against the payment");

    app.provider.set_faults(json!({})).await;
    app.execute("UPDATE payments SET next_check_at = now()").await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.settled, pass.redriven), (1, 0), "found by its key, not sent again: {pass:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1, "one charge");
    assert_eq!(app.order_status(&order_id).await, "paid");
}
}

over_both_wires! {
/// The wire is the one named: on Stripe's, the payment holds the PaymentIntent's id and the
/// mock's Stripe wire refuses the mock's own contract.
async fn the_provider_charge_is_the_wire_s_own_object(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order = app.create_order().await;
    let paid = app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &new_key()).await;
    assert_eq!(paid.status(), 201);
    let charge_id = json(paid).await["provider_charge_id"].as_str().unwrap().to_owned();
    let (prefix, own_route) = match wire {
        TestWire::Mock => ("ch_", "/v1/charges/"),
        TestWire::Stripe => ("pi_", "/v1/payment_intents/"),
    };
    assert!(charge_id.starts_with(prefix), "{charge_id}");
    let key = crate::helpers::STRIPE_TEST_KEY;
    let other_route = if wire == TestWire::Mock { "/v1/payment_intents/" } else { "/v1/charges/" };
    let read = |route: &str| {
        app.provider.client.get(format!("{}{route}{charge_id}", app.provider.address)).bearer_auth(key).send()
    };
    assert_eq!(read(own_route).await.unwrap().status(), 200);
    assert_eq!(read(other_route).await.unwrap().status(), 404);
}
}

/// Another request takes the downstream key of `payment_id` at the mock's Stripe wire, with
/// another amount and none of our metadata; its answer's status.
async fn take_the_key_of(app: &crate::helpers::TestApp, payment_id: &str) -> reqwest::StatusCode {
    let form = "amount=999&currency=usd&confirm=true&payment_method=pm_card_ok&payment_method_types[]=card";
    app.provider
        .client
        .post(format!("{}/v1/payment_intents", app.provider.address))
        .bearer_auth(crate::helpers::STRIPE_TEST_KEY)
        .header("Idempotency-Key", format!("orderpay_pay_{payment_id}"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap()
        .status()
}

/// The same on a first send: another request takes the payment's key while ours is on its way
/// (the provider acts on ours 1.5 s late), so the first send itself is refused. The
/// request answers 202 and the payment is held for a person at once; the reconciler never
/// claims it.
#[tokio::test]
async fn a_first_send_refused_for_a_key_taken_meanwhile_answers_202_and_holds_the_payment() {
    // Room on a loaded machine: the other request has 1.5 s to take the key, our answer 1.5 s
    // more to come back within the provider timeout.
    let app = spawn_app_with(|settings, mock| {
        TestWire::Stripe.configure(settings, mock);
        settings.provider.timeout = Duration::from_secs(3);
    })
    .await;
    let order = app.create_order().await;
    app.provider.script(json!([{"act": "later", "after_ms": 1500}])).await;
    let key = new_key();
    let paying = app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &key);
    let taking = async {
        let started = "SELECT count(*) FROM payments WHERE status = 'processing'";
        crate::helpers::wait_until("phase 1 commits", Duration::from_secs(3), async || {
            app.count(started).await == 1
        })
        .await;
        let payment_id = app.text("SELECT id::text AS text FROM payments").await;
        take_the_key_of(&app, &payment_id).await
    };
    let (paid, taken) = tokio::join!(paying, taking);
    assert!(taken.is_success(), "{taken}");
    assert_eq!(paid.status(), 202, "refused unacted, the key taken: held, not failed");
    let payment_id = json(paid).await["id"].as_str().unwrap().to_owned();
    let held = "SELECT count(*) FROM payments WHERE status = 'processing' AND next_check_at IS NULL \
                AND lease_id IS NULL AND last_error LIKE '%other parameters%'";
    assert_eq!(app.count(held).await, 1, "held, with why");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.gave_up), (0, 0), "left alone: {pass:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    assert_eq!(app.provider.charges().await.len(), 1, "only the other request's");
}

/// A key Stripe holds with other parameters (someone else used our downstream key, or a bug of
/// ours changed what it carries): our send is refused with `idempotency_error`, unacted. Our
/// lookup by metadata finds nothing of ours, yet the key is taken, so "never received" would
/// be a guess: the payment is held for a person. It stays `processing`, the reconciler leaves it
/// alone (no check scheduled, never given up), `payments list --stuck` lists it with why.
/// Only on Stripe's wire: on the mock's contract the lookup is by key itself and finds the
/// other charge, which then disagrees with the payment.
#[tokio::test]
async fn a_key_the_provider_holds_with_other_parameters_holds_the_payment_for_a_person() {
    let app = spawn_app_on_wire(TestWire::Stripe).await;
    let order = app.create_order().await;
    app.provider.script(json!([{"act": "unavailable"}])).await;
    let accepted = app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &new_key()).await;
    assert_eq!(accepted.status(), 202, "the first send met a 503");
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    // Another request takes our downstream key first, with another amount and none of ours.
    let taken = take_the_key_of(&app, &payment_id).await;
    assert!(taken.is_success(), "{taken}");

    tokio::time::sleep(Duration::from_millis(100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.stuck, pass.gave_up, pass.settled), (1, 1, 0, 0), "{pass:?}");
    let held = "SELECT count(*) FROM payments WHERE status = 'processing' AND next_check_at IS NULL \
                AND lease_id IS NULL AND last_error LIKE '%other parameters%'";
    assert_eq!(app.count(held).await, 1, "held, with why");
    for _ in 0..2 {
        let pass = app.reconcile_once().await;
        assert_eq!((pass.claimed, pass.gave_up), (0, 0), "left alone, never given up: {pass:?}");
    }
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    let stuck = app.cli_json(&["payments", "list", "--stuck"]).await;
    assert_eq!(stuck[0]["id"], payment_id.as_str(), "{stuck:#}");
    assert_eq!(stuck[0]["stuck"], true);
    let charges = app.provider.charges().await;
    assert_eq!(charges.len(), 1, "only the other request's: {charges:?}");
    assert_eq!(charges[0]["amount"], "9.99");

    // The person finds the key was not ours: nothing of ours is at the provider, so failed
    // (once the last send is quiet past the provider timeout and the margin, 1.1 s here).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let args = [
        "payments",
        "resolve",
        &payment_id,
        "--as",
        "failed",
        "--reason",
        "key taken by another integration",
    ];
    app.cli_json(&args).await;
    assert_eq!(app.get_payment(&payment_id).await["status"], "failed");
}
