//! The failure windows of docs/payments.md that need a crash: the service runs as a subprocess and is
//! killed with SIGKILL at the window; the in-process app (same database) and the reconciler then
//! finish the payment. W3-W5 (timeout, 5xx, pending) are in payments.rs.

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};

use crate::helpers::{self, TestApp, json, new_key, over_both_wires, spawn_app_on_wire};
use crate::process::{BIN, ServiceProcess, black_hole};

/// Subprocess settings: the provider call hangs up to 1.5 s, the key lease is 2 s.
const CRASHY: &[(&str, &str)] =
    &[("ORDERPAY_PROVIDER_TIMEOUT_MS", "1500"), ("ORDERPAY_PAYMENT_LEASE_MS", "2000")];

/// [`CRASHY`] on the app's wire.
fn crashy(app: &TestApp) -> Vec<(&'static str, &'static str)> {
    let mut env = CRASHY.to_vec();
    env.extend(app.wire().env());
    env
}

async fn wait_until(what: &str, check: impl AsyncFnMut() -> bool) {
    helpers::wait_until(what, Duration::from_secs(3), check).await
}

/// Sends `POST /payments` to the subprocess without waiting for the answer (it never comes).
fn pay_in_background(app: &TestApp, address: &str, order_id: &str, method: &str, key: &str) {
    let request = app
        .client
        .post(format!("{address}/payments"))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", key)
        .json(&json!({"order_id": order_id, "payment_method": method}));
    tokio::spawn(async move {
        let _ = request.send().await;
    });
}

async fn processing_payment_id(app: &TestApp) -> Option<String> {
    let mut conn = app.db().await;
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        id: uuid::Uuid,
    }
    let ids: Vec<Id> = diesel::sql_query("SELECT id FROM payments WHERE status = 'processing'")
        .load(&mut conn)
        .await
        .unwrap();
    <[Id]>::first(&ids).map(|row| row.id.to_string())
}

/// W1: phase 1 committed, then the process died before the charge left. The provider never
/// heard of the payment.
async fn crash_after_phase_one(app: &TestApp, order_id: &str, key: &str) -> String {
    let (_hole, hole_address) = black_hole();
    let mut service = ServiceProcess::start(&app.database_url, &hole_address, &crashy(app)).await;
    pay_in_background(app, &service.address, order_id, "pm_card_ok", key);
    wait_until("phase 1 commits", async || processing_payment_id(app).await.is_some()).await;
    service.kill();
    processing_payment_id(app).await.unwrap()
}

over_both_wires! {
async fn w1_crash_after_phase_one_then_a_retry_after_the_lease_charges_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let payment_id = crash_after_phase_one(&app, &order_id, &key).await;
    assert!(app.provider.charges().await.is_empty(), "the charge never left");

    // While the dead owner's lease runs, a retry is told to wait.
    let early = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(early.status(), 409);
    assert_eq!(json(early).await["resource_id"], payment_id.as_str());

    tokio::time::sleep(Duration::from_millis(2100)).await;
    let retry = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(retry.status(), 201, "the retry took over and finished the payment");
    assert_eq!(json(retry).await["id"], payment_id.as_str());
    assert_eq!(app.order_status(&order_id).await, "paid");
    let charges = app.provider.charges_for(&payment_id).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["status"], "succeeded");
}
}

over_both_wires! {
async fn w1_crash_after_phase_one_then_the_reconciler_charges_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let payment_id = crash_after_phase_one(&app, &order_id, &key).await;

    // The reconciler leaves the payment alone while the lease could still be live.
    assert_eq!(
        reconcile_cli(&app),
        "claimed=0 settled=0 redriven=0 rescheduled=0 stuck=0 gave_up=0 errors=0"
    );

    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        reconcile_cli(&app),
        "claimed=1 settled=1 redriven=1 rescheduled=0 stuck=0 gave_up=0 errors=0",
        "the provider had never received it: re-sent with the same key"
    );
    assert_eq!(app.order_status(&order_id).await, "paid");
    let retry = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1);
}
}

/// `orderpay reconcile --once` against the test's database and provider; returns its report.
fn reconcile_cli(app: &TestApp) -> String {
    let output = std::process::Command::new(BIN)
        .args(["reconcile", "--once"])
        .env("DATABASE_URL", &app.database_url)
        .env("ORDERPAY_PROVIDER_URL", &app.provider.address)
        .env("RUST_LOG", "warn")
        .envs(app.wire().env())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// W2: the provider charged, and the process died before phase 2 recorded it.
async fn crash_after_the_charge(app: &TestApp, order_id: &str, key: &str) -> String {
    let mut service = ServiceProcess::start(&app.database_url, &app.provider.address, &crashy(app)).await;
    // pm_provider_timeout charges at once and holds the answer 3 s, past the kill.
    pay_in_background(app, &service.address, order_id, "pm_provider_timeout", key);
    wait_until("the provider charges", async || !app.provider.charges().await.is_empty()).await;
    service.kill();
    let payment_id = processing_payment_id(app).await.expect("the payment is left processing");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1);
    payment_id
}

over_both_wires! {
async fn w2_charged_but_never_recorded_is_settled_by_a_retry_with_one_charge(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let payment_id = crash_after_the_charge(&app, &order_id, &key).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let retry = app.pay(&order_id, "pm_provider_timeout", &key).await;
    assert_eq!(retry.status(), 201);
    let payment = json(retry).await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["id"], payment_id.as_str());
    assert_eq!(app.order_status(&order_id).await, "paid");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1, "found, not charged again");
}
}

over_both_wires! {
async fn w2_charged_but_never_recorded_is_settled_by_the_reconciler_with_one_charge(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let payment_id = crash_after_the_charge(&app, &order_id, &key).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled, pass.redriven), (1, 1, 0));
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let replay = app.pay(&order_id, "pm_provider_timeout", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1);
}
}

over_both_wires! {
async fn w6_two_reconcilers_and_a_retry_racing_apply_one_transition(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    // A timeout leaves the payment processing with the charge made at the provider.
    let accepted = app.pay(&order_id, "pm_provider_timeout", &key).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(60)).await;

    let (passes, retry) = tokio::join!(
        join_all([app.reconcile_once(), app.reconcile_once()]),
        app.pay(&order_id, "pm_provider_timeout", &key)
    );
    let retry_status = retry.status().as_u16();
    assert!([201, 409].contains(&retry_status), "retry answered {retry_status}");
    let claimed: usize = passes.iter().map(|pass| pass.claimed).sum();
    assert!(claimed <= 1, "SKIP LOCKED: one reconciler claims the payment, got {passes:?}");

    let transitions = app
        .count(&format!(
            "SELECT count(*) AS count FROM payment_events WHERE payment_id = '{payment_id}' AND to_status = 'succeeded'"
        ))
        .await;
    assert_eq!(transitions, 1, "exactly one transition applied");
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "paid");
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1);
    let replay = app.pay(&order_id, "pm_provider_timeout", &key).await;
    let body: Value = json(replay).await;
    assert_eq!(body["status"], "succeeded");
}
}

/// Sends `method path body` to the subprocess without waiting for the answer.
fn send_in_background(app: &TestApp, address: &str, path: &str, body: Value, key: &str) {
    let request = app
        .client
        .post(format!("{address}{path}"))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", key)
        .json(&body);
    tokio::spawn(async move {
        let _ = request.send().await;
    });
}

over_both_wires! {
/// W1 for a refund: its start committed, then the process died before the request left.
async fn w1_a_refund_started_before_a_crash_is_sent_once_by_the_reconciler(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("30.00", "pm_card_ok").await;
    let (_hole, hole_address) = black_hole();
    let mut service = ServiceProcess::start(&app.database_url, &hole_address, &crashy(&app)).await;
    let key = new_key();
    let body = json!({"payment_id": payment["id"], "amount": "10.00"});
    send_in_background(&app, &service.address, "/refunds", body.clone(), &key);
    let processing = "SELECT count(*) AS count FROM refunds WHERE status = 'processing'";
    wait_until("the refund starts", async || app.count(processing).await == 1).await;
    service.kill();
    assert!(app.provider.refunds().await.is_empty(), "the refund never left");
    assert_eq!(
        reconcile_cli(&app),
        "claimed=0 settled=0 redriven=0 rescheduled=0 stuck=0 gave_up=0 errors=0",
        "left alone while the dead request's lease could still be live"
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        reconcile_cli(&app),
        "claimed=1 settled=1 redriven=1 rescheduled=0 stuck=0 gave_up=0 errors=0"
    );
    let retry = app.refund_with(&body, &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let refund_id = json(retry).await["id"].as_str().unwrap().to_owned();
    assert_eq!(app.provider_refunds_for(&refund_id).await.len(), 1);
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
}
}

over_both_wires! {
/// W2 for a refund: the provider made it, and the process died before recording it.
async fn w2_a_refund_made_before_a_crash_is_found_by_a_retry_not_made_again(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.paid_order("30.00", "pm_refund_timeout").await;
    let mut service = ServiceProcess::start(&app.database_url, &app.provider.address, &crashy(&app)).await;
    let key = new_key();
    let body = json!({"payment_id": payment["id"]});
    send_in_background(&app, &service.address, "/refunds", body.clone(), &key);
    wait_until("the provider refunds", async || !app.provider.refunds().await.is_empty()).await;
    service.kill();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let retry = app.refund_with(&body, &key).await;
    assert_eq!(retry.status(), 201, "the retry took the refund over and found it");
    let refund = json(retry).await;
    assert_eq!(refund["status"], "succeeded");
    let at_provider = app.provider_refunds_for(refund["id"].as_str().unwrap()).await;
    assert_eq!(at_provider.len(), 1);
    assert_eq!(at_provider[0]["requests"], 1, "looked up, never sent again");
    assert_eq!(app.order_status(&order_id).await, "refunded");
}
}

over_both_wires! {
/// W1 for a capture: started, then the process died before the request left.
async fn w1_a_capture_started_before_a_crash_is_sent_once_by_a_retry(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("20.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let (_hole, hole_address) = black_hole();
    let mut service = ServiceProcess::start(&app.database_url, &hole_address, &crashy(&app)).await;
    let key = new_key();
    send_in_background(&app, &service.address, &format!("/payments/{payment_id}/capture"), json!({}), &key);
    let processing = "SELECT count(*) AS count FROM payment_operations WHERE status = 'processing'";
    wait_until("the capture starts", async || app.count(processing).await == 1).await;
    service.kill();
    assert_eq!(app.provider_charge(&payment_id).await["status"], "requires_capture");
    let early = app.capture(&payment_id, None, &key).await;
    assert_eq!(early.status(), 409, "the dead request's lease still runs");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let retry = app
        .request(reqwest::Method::POST, &format!("/payments/{payment_id}/capture"))
        .header("Idempotency-Key", &key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 200, "taken over, looked up, sent once");
    assert_eq!(json(retry).await["status"], "succeeded");
    assert_eq!(app.provider_charge(&payment_id).await["amount_captured"], "20.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
}
}

over_both_wires! {
/// W2 for a capture: the provider captured, and the process died before recording it.
async fn w2_a_capture_made_before_a_crash_is_found_by_the_reconciler(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let (order_id, payment) = app.authorized_order("20.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let mut service = ServiceProcess::start(&app.database_url, &app.provider.address, &crashy(&app)).await;
    app.provider.set_faults(json!({"timeout_rate": 1.0})).await;
    send_in_background(
        &app,
        &service.address,
        &format!("/payments/{payment_id}/capture"),
        json!({}),
        &new_key(),
    );
    wait_until("the provider captures", async || {
        app.provider.charges_for(&payment_id).await[0]["status"] == "succeeded"
    })
    .await;
    service.kill();
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled, pass.redriven), (1, 1, 0), "found captured: {pass:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "paid");
}
}
