//! Provider webhooks (`POST /provider/webhooks`): the mock provider's signed events settle
//! pending charges, refunds, captures and expired authorizations through the same guarded
//! settle as the request and the reconciler; each event applies once however often it arrives
//! and in whatever order; refused deliveries change nothing; the reconciler still settles what
//! never arrives.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use reqwest::{Method, Response};
use serde_json::{Value, json};
use uuid::Uuid;

use orderpay::webhook_signature::{Secret, sign};

use crate::helpers::{
    self, TestApp, TestWire, assert_problem, json, new_key, over_both_wires, provider_webhooks_on, spawn_app,
    spawn_app_with, use_servers,
};
use crate::proxy::ChaosProxy;

/// How long the mock keeps a `pm_provider_pending` charge or `pm_refund_pending` refund pending.
const SETTLE: Duration = Duration::from_millis(200);

/// Polls `check` until it answers, for at most 10 s.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    helpers::eventually(what, Duration::from_secs(10), check).await
}

/// An app whose mock provider sends it signed webhooks, the reconciler idle (60 s), pending
/// charges and refunds settling after [`SETTLE`].
pub(crate) async fn app_hearing_the_provider() -> TestApp {
    app_hearing_the_provider_on(TestWire::Mock).await
}

/// [`app_hearing_the_provider`] on `wire`.
async fn app_hearing_the_provider_on(wire: TestWire) -> TestApp {
    spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        provider_webhooks_on(settings);
        settings.reconciler.interval = Duration::from_secs(60);
        mock.settle_after = SETTLE;
    })
    .await
}

pub(crate) fn secret(app: &TestApp) -> Secret {
    app.settings.api.provider_webhooks.standard()[0].clone()
}

/// One delivery, as the provider sends it.
#[derive(Clone)]
pub(crate) struct Delivery {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

/// A new event about `object` (a charge or refund as the provider's GET returns it).
pub(crate) fn event(kind: &str, object: &Value) -> Value {
    json!({
        "id": format!("evt_{}", Uuid::now_v7().simple()),
        "type": kind,
        "created": Utc::now().timestamp(),
        "data": { "object": object },
    })
}

/// `event` signed with `secret` at `timestamp` (unix seconds).
fn signed_at(secret: &Secret, event: &Value, timestamp: i64) -> Delivery {
    let id = event["id"].as_str().unwrap().to_owned();
    let body = serde_json::to_vec(event).unwrap();
    let signature = sign(secret, &id, timestamp, &body);
    Delivery { id, timestamp: timestamp.to_string(), signature, body }
}

pub(crate) fn signed(secret: &Secret, event: &Value) -> Delivery {
    signed_at(secret, event, Utc::now().timestamp())
}

pub(crate) async fn deliver(app: &TestApp, delivery: &Delivery) -> Response {
    app.client
        .post(app.url("/provider/webhooks"))
        .header("content-type", "application/json")
        .header("webhook-id", &delivery.id)
        .header("webhook-timestamp", &delivery.timestamp)
        .header("webhook-signature", &delivery.signature)
        .body(delivery.body.clone())
        .send()
        .await
        .expect("POST /provider/webhooks")
}

/// Delivers and returns what the event did (`applied`, `duplicate`, `stale`, `unknown`).
pub(crate) async fn deliver_ok(app: &TestApp, delivery: &Delivery) -> String {
    let response = deliver(app, delivery).await;
    let status = response.status();
    let body = json(response).await;
    assert_eq!(status, 200, "{body}");
    body["result"].as_str().unwrap().to_owned()
}

/// The charge of `payment_id` as the provider's GET returns it.
pub(crate) async fn provider_charge(app: &TestApp, payment_id: &str) -> Value {
    let url = format!("{}/v1/charges?idempotency_key=orderpay_pay_{payment_id}", app.provider.address);
    let response = app.client.get(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    json(response).await
}

/// `orderpay_provider_webhooks_total{result}` as `/metrics` shows it (0 before the first). The
/// recorder is the process's: without nextest, tests running beside this one count there too,
/// so callers compare with lower bounds.
pub(crate) async fn webhooks_counted(app: &TestApp, result: &str) -> u64 {
    let text = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let series = format!("orderpay_provider_webhooks_total{{result=\"{result}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&series)).map_or(0, |value| value.trim().parse().unwrap())
}

async fn new_order(app: &TestApp) -> String {
    app.create_order().await["id"].as_str().unwrap().to_owned()
}

/// Pays a new order; returns the answer's status and the payment.
async fn pay(app: &TestApp, payment_method: &str, key: &str) -> (u16, Value) {
    let order_id = new_order(app).await;
    let response = app.pay(&order_id, payment_method, key).await;
    let status = response.status().as_u16();
    (status, json(response).await)
}

async fn refund(app: &TestApp, payment_id: &str, key: &str) -> Response {
    app.request(Method::POST, "/refunds")
        .header("Idempotency-Key", key)
        .json(&json!({ "payment_id": payment_id }))
        .send()
        .await
        .expect("POST /refunds")
}

/// Transitions of `subject_id` recorded by `actor`, to `to_status`.
async fn transitions(app: &TestApp, subject_id: &str, actor: &str, to_status: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) AS count FROM payment_events WHERE subject_id = '{subject_id}' \
         AND actor = '{actor}' AND to_status = '{to_status}'"
    ))
    .await
}

async fn events_of(app: &TestApp, subject_id: &str) -> i64 {
    app.count(&format!("SELECT count(*) AS count FROM payment_events WHERE subject_id = '{subject_id}'"))
        .await
}

/// The mock's event of `kind` (in the mock's words, whatever the wire) about `object_id` (the
/// app's id of it), once delivered (with 2xx) as often as planned.
async fn delivered(app: &TestApp, kind: &str, object_id: &str) -> Value {
    eventually(&format!("{kind} for {object_id} delivered"), || async {
        app.provider.webhooks().await.into_iter().find(|event| {
            let attempts = event["attempts"].as_array().map_or(0, Vec::len) as u64;
            event["type"] == kind
                && app.wire().charge_id(event["object_id"].as_str().unwrap_or("")) == object_id
                && event["delivered"] == true
                && attempts >= event["copies"].as_u64().unwrap_or(1)
        })
    })
    .await
}

fn timestamp(value: &Value) -> DateTime<Utc> {
    value.as_str().unwrap().parse().unwrap()
}

over_both_wires! {
async fn a_pending_payment_succeeds_within_a_second_of_the_provider_settling_and_its_key_replays(wire: TestWire) {
    let app = app_hearing_the_provider_on(wire).await;
    let key = new_key();
    let (status, accepted) = pay(&app, "pm_provider_pending", &key).await;
    assert_eq!(status, 202, "{accepted}");
    let payment_id = accepted["id"].as_str().unwrap().to_owned();

    let payment = eventually("the payment succeeded", || async {
        let payment = app.get_payment(&payment_id).await;
        (payment["status"] == "succeeded").then_some(payment)
    })
    .await;
    // The provider settled when it emitted the event; the payment moved when orderpay heard it.
    let charge_id = payment["provider_charge_id"].as_str().unwrap();
    let event = delivered(&app, "charge.succeeded", charge_id).await;
    let heard_after = timestamp(&payment["updated_at"]) - timestamp(&event["created_at"]);
    println!("provider settled -> payment succeeded: {} ms", heard_after.num_milliseconds());
    assert!(heard_after < chrono::Duration::seconds(1), "{heard_after}");
    assert_eq!(transitions(&app, &payment_id, "webhook", "succeeded").await, 1, "the webhook settled it");
    assert_eq!(events_of(&app, &payment_id).await, 1);
    assert_eq!(app.order_status(payment["order_id"].as_str().unwrap()).await, "paid");

    // The key's stored answer moved with it.
    let replay = app.pay(payment["order_id"].as_str().unwrap(), "pm_provider_pending", &key).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed = json(replay).await;
    assert_eq!((&replayed["id"], &replayed["status"]), (&json!(payment_id), &json!("succeeded")));
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1);
}
}

over_both_wires! {
async fn a_pending_refund_succeeds_within_a_second_of_the_provider_settling_and_its_key_replays(wire: TestWire) {
    let app = app_hearing_the_provider_on(wire).await;
    let (status, payment) = pay(&app, "pm_refund_pending", &new_key()).await;
    assert_eq!(status, 201, "{payment}");
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let accepted = refund(&app, &payment_id, &key).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    let settled = eventually("the refund succeeded", || async {
        let refund = app.get_refund(&refund_id).await;
        (refund["status"] == "succeeded").then_some(refund)
    })
    .await;
    let event = delivered(&app, "refund.succeeded", settled["provider_refund_id"].as_str().unwrap()).await;
    let heard_after = timestamp(&settled["updated_at"]) - timestamp(&event["created_at"]);
    println!("provider refunded -> refund succeeded: {} ms", heard_after.num_milliseconds());
    assert!(heard_after < chrono::Duration::seconds(1), "{heard_after}");
    assert_eq!(transitions(&app, &refund_id, "webhook", "succeeded").await, 1, "the webhook settled it");
    assert_eq!(app.order_status(payment["order_id"].as_str().unwrap()).await, "refunded");
    assert_eq!(app.get_payment(&payment_id).await["amount_refunded"], payment["amount"]);

    let replay = refund(&app, &payment_id, &key).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed = json(replay).await;
    assert_eq!((&replayed["id"], &replayed["status"]), (&json!(refund_id), &json!("succeeded")));
    assert_eq!(app.provider.refunds().await.len(), 1);
}
}

#[tokio::test]
async fn a_duplicated_event_applies_once_and_is_counted() {
    let app = app_hearing_the_provider().await;
    app.provider.set_faults(json!({ "webhook_duplicate_rate": 1.0 })).await;
    let (status, accepted) = pay(&app, "pm_provider_pending", &new_key()).await;
    assert_eq!(status, 202);
    let payment_id = accepted["id"].as_str().unwrap().to_owned();
    let charge = provider_charge(&app, &payment_id).await;
    let event = delivered(&app, "charge.succeeded", charge["id"].as_str().unwrap()).await;
    assert_eq!(event["copies"], 2);

    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(transitions(&app, &payment_id, "webhook", "succeeded").await, 1);
    assert_eq!(events_of(&app, &payment_id).await, 1, "one audit row");
    let rows = app
        .count(&format!(
            "SELECT count(*) AS count FROM provider_webhooks WHERE id = '{}' AND result = 'applied' \
             AND subject = 'payment' AND subject_id = '{payment_id}'",
            event["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(rows, 1, "one row per event, noting what its first delivery did");
    let duplicates = webhooks_counted(&app, "duplicate").await;
    assert!(duplicates >= 1, "{duplicates}");

    // A third copy, delivered by hand: the same event id answers `duplicate`, changes nothing.
    let body = json!({
        "id": event["id"], "type": "charge.succeeded", "created": 1,
        "data": { "object": provider_charge(&app, &payment_id).await },
    });
    assert_eq!(deliver_ok(&app, &signed(&secret(&app), &body)).await, "duplicate");
    assert!(webhooks_counted(&app, "duplicate").await > duplicates);
    assert_eq!(events_of(&app, &payment_id).await, 1);
}

over_both_wires! {
async fn dropped_events_are_settled_by_the_reconciler(wire: TestWire) {
    let app = app_hearing_the_provider_on(wire).await;
    app.provider.set_faults(json!({ "webhook_drop_rate": 1.0 })).await;
    let (status, pending) = pay(&app, "pm_provider_pending", &new_key()).await;
    assert_eq!(status, 202);
    let payment_id = pending["id"].as_str().unwrap().to_owned();
    let (status, refundable) = pay(&app, "pm_refund_pending", &new_key()).await;
    assert_eq!(status, 201);
    let accepted = refund(&app, refundable["id"].as_str().unwrap(), &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    // Both settle at the provider, and every event is dropped.
    eventually("the provider settled both", || async {
        let charge = app.provider.charges_for(&payment_id).await.remove(0);
        let refunds = app.provider.refunds().await;
        (charge["status"] == "succeeded" && refunds.iter().all(|r| r["status"] == "succeeded")).then_some(())
    })
    .await;
    let log = app.provider.webhooks().await;
    assert!(log.len() >= 3 && log.iter().all(|event| event["copies"] == 0), "{log:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing", "nothing was heard");
    assert_eq!(app.get_refund(&refund_id).await["status"], "processing");

    let pass = app.reconcile_once().await;
    assert_eq!(pass.settled, 2, "{pass:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.get_refund(&refund_id).await["status"], "succeeded");
    assert_eq!(transitions(&app, &payment_id, "reconciler", "succeeded").await, 1);
    assert_eq!(transitions(&app, &refund_id, "reconciler", "succeeded").await, 1);
    assert_eq!(app.count("SELECT count(*) AS count FROM provider_webhooks").await, 0);
}
}

over_both_wires! {
async fn a_charge_event_overtaken_by_its_refunds_events_leaves_the_final_state_right(wire: TestWire) {
    let app = app_hearing_the_provider_on(wire).await;
    // The charge's event is held back; the refund's, sent later, overtakes it.
    app.provider.set_faults(json!({ "webhook_delay_ms": 800 })).await;
    let (status, payment) = pay(&app, "pm_refund_pending", &new_key()).await;
    assert_eq!(status, 201);
    app.provider.set_faults(json!({})).await;
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let order_id = payment["order_id"].as_str().unwrap().to_owned();
    let accepted = refund(&app, &payment_id, &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();

    let charge_id = payment["provider_charge_id"].as_str().unwrap().to_owned();
    delivered(&app, "charge.succeeded", &charge_id).await;
    let rows = |object_id: String| {
        let app = &app;
        async move {
            #[derive(diesel::QueryableByName)]
            struct Row {
                #[diesel(sql_type = diesel::sql_types::Text)]
                result: String,
                #[diesel(sql_type = diesel::sql_types::Timestamptz)]
                received_at: DateTime<Utc>,
            }
            use diesel_async::RunQueryDsl;
            let mut conn = app.db().await;
            diesel::sql_query("SELECT result, received_at FROM provider_webhooks WHERE object_id = $1")
                .bind::<diesel::sql_types::Text, _>(object_id)
                .get_result::<Row>(&mut conn)
                .await
                .map(|row| (row.result, row.received_at))
                .unwrap()
        }
    };
    let refund_now = app.get_refund(&refund_id).await;
    let (refund_result, refund_heard) =
        rows(refund_now["provider_refund_id"].as_str().unwrap().to_owned()).await;
    let (charge_result, charge_heard) = rows(charge_id).await;
    assert!(refund_heard < charge_heard, "the refund's event arrived first");
    assert_eq!((refund_result.as_str(), charge_result.as_str()), ("applied", "stale"));

    // The late charge.succeeded changed nothing: the order stays refunded, not paid again.
    assert_eq!(refund_now["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "refunded");
    let payment_now = app.get_payment(&payment_id).await;
    assert_eq!(payment_now["status"], "succeeded");
    assert_eq!(payment_now["amount_refunded"], payment["amount"]);
    assert_eq!(events_of(&app, &payment_id).await, 1, "the payment moved once (its request)");
    assert_eq!(events_of(&app, &refund_id).await, 1, "the refund moved once (its webhook)");
}
}

#[tokio::test]
async fn a_late_charge_failed_after_charge_succeeded_changes_nothing() {
    let app = app_hearing_the_provider().await;
    let (status, payment) = pay(&app, "pm_card_ok", &new_key()).await;
    assert_eq!(status, 201);
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    delivered(&app, "charge.succeeded", payment["provider_charge_id"].as_str().unwrap()).await;
    let stale_before = webhooks_counted(&app, "stale").await;

    let mut declined = provider_charge(&app, &payment_id).await;
    declined["status"] = json!("declined");
    declined["decline_code"] = json!("insufficient_funds");
    assert_eq!(deliver_ok(&app, &signed(&secret(&app), &event("charge.failed", &declined))).await, "stale");

    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(payment["order_id"].as_str().unwrap()).await, "paid");
    assert_eq!(events_of(&app, &payment_id).await, 1);
    assert!(webhooks_counted(&app, "stale").await > stale_before);
}

#[tokio::test]
async fn refused_deliveries_change_nothing() {
    let app = app_hearing_the_provider().await;
    // The mock's own events are dropped: only the deliveries below reach the app.
    app.provider.set_faults(json!({ "webhook_drop_rate": 1.0 })).await;
    let (status, pending) = pay(&app, "pm_provider_pending", &new_key()).await;
    assert_eq!(status, 202);
    let payment_id = pending["id"].as_str().unwrap().to_owned();
    let charge = eventually("the provider settled", || async {
        let charge = provider_charge(&app, &payment_id).await;
        (charge["status"] == "succeeded").then_some(charge)
    })
    .await;
    let secret = secret(&app);
    let event = event("charge.succeeded", &charge);
    let good = signed(&secret, &event);
    let now = Utc::now().timestamp();
    let with = |change: &dyn Fn(&mut Delivery)| {
        let mut delivery = good.clone();
        change(&mut delivery);
        delivery
    };
    let tampered = {
        let mut body = event.clone();
        body["data"]["object"]["amount"] = json!("0.01");
        serde_json::to_vec(&body).unwrap()
    };
    let cases: Vec<(&str, Delivery)> = vec![
        ("a signature of junk", with(&|d| d.signature = "v1,c2lnbmF0dXJl".into())),
        ("no v1 signature", with(&|d| d.signature = "v2,abc".into())),
        // Outside the 300 s tolerance by more than a slow run takes between `now` and a delivery.
        ("a timestamp 330 s old", signed_at(&secret, &event, now - 330)),
        ("a timestamp 330 s ahead", signed_at(&secret, &event, now + 330)),
        ("the signature of another timestamp", with(&|d| d.timestamp = (now - 1).to_string())),
        ("another secret", signed(&Secret::generate().unwrap(), &event)),
        ("a tampered body", with(&|d| d.body = tampered.clone())),
        ("the signature of another id", with(&|d| d.id = "evt_other".into())),
    ];
    for (case, delivery) in &cases {
        let body = assert_problem(deliver(&app, delivery).await, 400, "webhook-signature-invalid").await;
        println!("{case}: {}", body["detail"]);
    }
    for missing in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let mut request = app.client.post(app.url("/provider/webhooks")).body(good.body.clone());
        for (name, value) in [
            ("webhook-id", &good.id),
            ("webhook-timestamp", &good.timestamp),
            ("webhook-signature", &good.signature),
        ] {
            if name != missing {
                request = request.header(name, value);
            }
        }
        let refused = assert_problem(request.send().await.unwrap(), 400, "webhook-signature-invalid").await;
        assert!(refused["detail"].as_str().unwrap().contains(missing), "{refused}");
    }
    // 1 MiB + 1 byte, signed correctly: refused by its size before it is read.
    let mut padded = event.clone();
    padded["padding"] = json!("");
    let unpadded = serde_json::to_vec(&padded).unwrap().len();
    padded["padding"] = json!("x".repeat((1 << 20) + 1 - unpadded));
    let huge = signed(&secret, &padded);
    assert_eq!(huge.body.len(), (1 << 20) + 1);
    assert_problem(deliver(&app, &huge).await, 413, "payload-too-large").await;
    // Signed correctly, but not JSON; JSON, but no event.
    let body = b"{\"id\": evt".to_vec();
    let signature = sign(&secret, &good.id, now, &body);
    let not_json = Delivery { id: good.id.clone(), timestamp: now.to_string(), signature, body };
    assert_problem(deliver(&app, &not_json).await, 400, "malformed-json").await;
    let no_event = signed(&secret, &json!({ "id": "evt_no_event", "hello": "world" }));
    assert_problem(deliver(&app, &no_event).await, 422, "validation-failed").await;

    assert_eq!(app.count("SELECT count(*) AS count FROM provider_webhooks").await, 0);
    assert_eq!(app.count("SELECT count(*) AS count FROM payment_events").await, 0);
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    assert!(webhooks_counted(&app, "rejected").await >= cases.len() as u64 + 6);

    // The same event, signed as the provider signs it, is heard.
    assert_eq!(deliver_ok(&app, &good).await, "applied");
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
}

#[tokio::test]
async fn webhooks_racing_a_retrys_phase_two_and_the_reconciler_apply_one_transition() {
    let app = app_hearing_the_provider().await;
    // Only the deliveries below reach the app, at the moment the other drivers run.
    app.provider.set_faults(json!({ "webhook_drop_rate": 1.0 })).await;
    // The provider charges, then holds its answer past our timeout: 202, outcome unknown.
    let started: Vec<(String, String, Value)> = join_all((0..4).map(|_| async {
        let key = new_key();
        let (status, payment) = pay(&app, "pm_provider_timeout", &key).await;
        assert_eq!(status, 202, "{payment}");
        (key, payment["order_id"].as_str().unwrap().to_owned(), payment)
    }))
    .await;
    // Due for the reconciler (its recheck is 50 ms away).
    tokio::time::sleep(Duration::from_millis(60)).await;
    let secret = secret(&app);
    let mut deliveries = Vec::new();
    for (_, _, payment) in &started {
        let charge = provider_charge(&app, payment["id"].as_str().unwrap()).await;
        assert_eq!(charge["status"], "succeeded");
        // Two events saying the same (a provider may send more than one), each delivered twice.
        for _ in 0..2 {
            let delivery = signed(&secret, &event("charge.succeeded", &charge));
            deliveries.push(delivery.clone());
            deliveries.push(delivery);
        }
    }
    let retries =
        join_all(started.iter().map(|(key, order_id, _)| app.pay(order_id, "pm_provider_timeout", key)));
    let heard = join_all(deliveries.iter().map(|delivery| deliver_ok(&app, delivery)));
    let (retried, pass, heard) = tokio::join!(retries, app.reconcile_once(), heard);

    for answer in retried {
        // Settled (by itself or by the webhook), or still held by the reconciler's lease.
        assert!([201, 409].contains(&answer.status().as_u16()), "{}", answer.status());
    }
    let applied = heard.iter().filter(|result| *result == "applied").count();
    assert!(
        heard.iter().all(|result| ["applied", "stale", "duplicate"].contains(&result.as_str())),
        "{heard:?}"
    );
    assert_eq!(heard.iter().filter(|result| *result == "duplicate").count(), 8, "{heard:?}");
    for (key, order_id, payment) in &started {
        let payment_id = payment["id"].as_str().unwrap();
        let succeeded = app
            .count(&format!(
                "SELECT count(*) AS count FROM payment_events WHERE payment_id = '{payment_id}' \
                 AND subject = 'payment' AND to_status = 'succeeded'"
            ))
            .await;
        assert_eq!(succeeded, 1, "one transition for {payment_id}");
        assert_eq!(events_of(&app, payment_id).await, 1);
        let replay = app.pay(order_id, "pm_provider_timeout", key).await;
        assert_eq!(replay.status(), 201);
        assert_eq!(json(replay).await["status"], "succeeded");
        assert_eq!(app.provider.charges_for(payment_id).await.len(), 1);
    }
    let by_actor = |actor: &'static str| {
        let app = &app;
        async move {
            app.count(&format!("SELECT count(*) AS count FROM payment_events WHERE actor = '{actor}'")).await
        }
    };
    let (webhook, request, reconciler) =
        (by_actor("webhook").await, by_actor("request").await, by_actor("reconciler").await);
    assert_eq!(webhook, applied as i64);
    assert_eq!(webhook + request + reconciler, 4);
    println!(
        "race: {webhook} settled by webhooks, {request} by retries, {reconciler} by the reconciler ({pass:?})"
    );
}

over_both_wires! {
async fn a_payments_own_event_racing_its_request_settles_it_once(wire: TestWire) {
    let app = app_hearing_the_provider_on(wire).await;
    // The event leaves as the provider charges, while its answer is on the way to the request;
    // each is delivered twice, and reconciler passes run meanwhile.
    app.provider.set_faults(json!({ "webhook_duplicate_rate": 1.0 })).await;
    let payments = join_all((0..8).map(|_| async {
        let (status, payment) = pay(&app, "pm_card_ok", &new_key()).await;
        assert_eq!(status, 201, "{payment}");
        payment
    }));
    let passes = async {
        for _ in 0..5 {
            app.reconcile_once().await;
        }
    };
    let (payments, ()) = tokio::join!(payments, passes);
    for payment in &payments {
        let payment_id = payment["id"].as_str().unwrap();
        delivered(&app, "charge.succeeded", payment["provider_charge_id"].as_str().unwrap()).await;
        assert_eq!(payment["status"], "succeeded");
        assert_eq!(events_of(&app, payment_id).await, 1, "one transition for {payment_id}");
    }
    let heard = app.count("SELECT count(*) AS count FROM provider_webhooks").await;
    let applied = app.count("SELECT count(*) AS count FROM provider_webhooks WHERE result = 'applied'").await;
    assert_eq!(heard, 8, "one row per event");
    assert_eq!(
        applied,
        app.count("SELECT count(*) AS count FROM payment_events WHERE actor = 'webhook'").await
    );
    println!("{applied} of 8 payments were settled by their webhook before their request's phase 2");
}
}

over_both_wires! {
async fn a_capture_whose_answer_is_held_is_settled_by_charge_captured(wire: TestWire) {
    let app = app_hearing_the_provider_on(wire).await;
    let order_id = new_order(&app).await;
    let body = json!({ "order_id": order_id, "payment_method": "pm_card_ok", "capture_method": "manual" });
    let authorized = app.pay_with(&body, &new_key()).await;
    assert_eq!(authorized.status(), 201);
    let payment = json(authorized).await;
    assert_eq!(payment["status"], "requires_capture");
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    delivered(&app, "charge.succeeded", payment["provider_charge_id"].as_str().unwrap()).await;

    // The provider captures, then holds its answer past our timeout.
    app.provider.set_faults(json!({ "timeout_rate": 1.0 })).await;
    let key = new_key();
    let capture = |key: String| {
        let app = &app;
        let path = format!("/payments/{payment_id}/capture");
        async move { app.request(Method::POST, &path).header("Idempotency-Key", key).send().await.unwrap() }
    };
    let answer = capture(key.clone()).await;
    // 200 when the webhook settled the capture before the request gave up on the provider.
    assert!([200, 202].contains(&answer.status().as_u16()), "{}", answer.status());
    app.provider.set_faults(json!({})).await;
    eventually("the payment captured", || async {
        (app.get_payment(&payment_id).await["status"] == "succeeded").then_some(())
    })
    .await;
    assert_eq!(app.order_status(&order_id).await, "paid");
    let captures = app
        .count(&format!(
            "SELECT count(*) AS count FROM payment_events WHERE payment_id = '{payment_id}' \
             AND subject = 'capture' AND actor = 'webhook' AND to_status = 'succeeded'"
        ))
        .await;
    assert_eq!(captures, 1, "the capture settled by charge.captured");
    let replay = capture(key).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(replay).await["status"], "succeeded");
}
}

over_both_wires! {
async fn an_authorization_that_expires_is_ended_by_charge_canceled(wire: TestWire) {
    authorization_ended_by_charge_canceled(wire, Duration::from_millis(300), false).await;
}
}

over_both_wires! {
/// An authorized payment's row names its `payment.requires_capture` event for its stored answer;
/// once the events' retention has swept that event, the payment is still settled (its answer's
/// status says so), and the provider's word on its authorization still ends it.
async fn an_authorization_whose_answering_event_was_swept_is_still_ended_by_charge_canceled(wire: TestWire) {
    authorization_ended_by_charge_canceled(wire, Duration::from_millis(600), true).await;
}
}

/// Authorizes a payment the provider lets go after `ttl` (with the event its row names for its
/// answer deleted first, when `sweep_its_event`), and requires `charge.canceled` to end it, the
/// reconciler idle.
async fn authorization_ended_by_charge_canceled(wire: TestWire, ttl: Duration, sweep_its_event: bool) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        provider_webhooks_on(settings);
        settings.reconciler.interval = Duration::from_secs(60);
        mock.auth_ttl = ttl;
    })
    .await;
    let order_id = new_order(&app).await;
    let body = json!({ "order_id": order_id, "payment_method": "pm_card_ok", "capture_method": "manual" });
    let authorized = app.pay_with(&body, &new_key()).await;
    assert_eq!(authorized.status(), 201);
    let payment_id = json(authorized).await["id"].as_str().unwrap().to_owned();
    if sweep_its_event {
        let named = format!(
            "SELECT count(*) AS count FROM payments AS p JOIN events AS e ON e.id = p.answer_event_id \
             WHERE p.id = '{payment_id}' AND p.answer_body IS NULL"
        );
        assert_eq!(app.count(&named).await, 1, "the row names its event for the answer");
        // As the retention sweep deletes it.
        app.execute(&format!(
            "DELETE FROM events WHERE id = (SELECT answer_event_id FROM payments WHERE id = '{payment_id}')"
        ))
        .await;
        assert_eq!(app.count(&named).await, 0);
    }
    let payment = eventually("the authorization ended", || async {
        let payment = app.get_payment(&payment_id).await;
        (payment["status"] == "canceled").then_some(payment)
    })
    .await;
    assert_eq!(payment["failure_code"], "authorization_expired");
    assert_eq!(app.order_status(&order_id).await, "pending_payment", "payable again");
    assert_eq!(transitions(&app, &payment_id, "webhook", "canceled").await, 1);
}

#[tokio::test]
async fn events_about_nothing_of_ours_are_acknowledged_and_ignored() {
    let app = app_hearing_the_provider().await;
    let (status, payment) = pay(&app, "pm_card_ok", &new_key()).await;
    assert_eq!(status, 201);
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    delivered(&app, "charge.succeeded", payment["provider_charge_id"].as_str().unwrap()).await;
    let unknown_before = webhooks_counted(&app, "unknown").await;
    let events_before = app.count("SELECT count(*) AS count FROM payment_events").await;

    let mut foreign = provider_charge(&app, &payment_id).await;
    foreign["idempotency_key"] = json!("another_system_42");
    let mut no_such_payment = foreign.clone();
    no_such_payment["idempotency_key"] = json!(format!("orderpay_pay_{}", Uuid::now_v7()));
    let secret = secret(&app);
    for event in [
        event("charge.succeeded", &foreign),
        event("charge.succeeded", &no_such_payment),
        event("customer.created", &json!({ "id": "cus_1" })),
    ] {
        assert_eq!(deliver_ok(&app, &signed(&secret, &event)).await, "unknown");
    }
    assert!(webhooks_counted(&app, "unknown").await >= unknown_before + 3);
    assert_eq!(
        app.count("SELECT count(*) AS count FROM provider_webhooks WHERE result = 'unknown'").await,
        3
    );
    assert_eq!(app.count("SELECT count(*) AS count FROM payment_events").await, events_before);
}

#[tokio::test]
async fn a_database_failure_answers_503_and_the_providers_retry_applies_the_event() {
    let proxy = ChaosProxy::start("127.0.0.1:5432").await;
    let proxy_port = proxy.port;
    let app = spawn_app_with(move |settings, mock| {
        provider_webhooks_on(settings);
        use_servers(settings, &[("127.0.0.1", proxy_port)]);
        settings.database.acquire_timeout = Duration::from_millis(500);
        mock.settle_after = SETTLE;
    })
    .await;
    app.provider.set_faults(json!({ "webhook_drop_rate": 1.0 })).await;
    let (status, pending) = pay(&app, "pm_provider_pending", &new_key()).await;
    assert_eq!(status, 202);
    let payment_id = pending["id"].as_str().unwrap().to_owned();
    let charge = eventually("the provider settled", || async {
        let charge = provider_charge(&app, &payment_id).await;
        (charge["status"] == "succeeded").then_some(charge)
    })
    .await;
    let delivery = signed(&secret(&app), &event("charge.succeeded", &charge));

    proxy.cut();
    let refused = deliver(&app, &delivery).await;
    assert!(refused.headers().contains_key("retry-after"));
    assert_problem(refused, 503, "service-unavailable").await;
    proxy.restore();
    // The app's direct checks go around the proxy.
    assert_eq!(app.count("SELECT count(*) AS count FROM provider_webhooks").await, 0);
    assert_eq!(app.count("SELECT count(*) AS count FROM payment_events").await, 0);

    let applied = eventually("the retry heard", || async {
        let response = deliver(&app, &delivery).await;
        (response.status() == 200).then_some(json(response).await)
    })
    .await;
    assert_eq!(applied["result"], "applied");
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(transitions(&app, &payment_id, "webhook", "succeeded").await, 1);
}

#[tokio::test]
async fn without_a_secret_the_route_does_not_exist() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/provider/webhooks"))
        .header("webhook-id", "evt_1")
        .header("webhook-timestamp", Utc::now().timestamp().to_string())
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_problem(response, 404, "route-not-found").await;

    let enabled = app_hearing_the_provider().await;
    let wrong_method = enabled.client.get(enabled.url("/provider/webhooks")).send().await.unwrap();
    assert_problem(wrong_method, 405, "method-not-allowed").await;
}

over_both_wires! {
/// A request waiting on its provider call answers as soon as another driver settles its
/// operation: the provider charges at once and reports it by webhook, but holds its own answer
/// for a minute (`pm_provider_timeout`), and the service would wait for it as long (its provider
/// timeout is a minute here). The webhook settles the payment; the request hears it and answers
/// 201 at once, not after the minute (the client gives up after 20 s).
async fn a_request_waiting_on_its_provider_call_answers_once_a_webhook_settles_it(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        provider_webhooks_on(settings);
        settings.provider.timeout = Duration::from_secs(60);
        settings.timing.lease = Duration::from_secs(65);
        mock.timeout_hold = Duration::from_secs(60);
    })
    .await;
    let order_id = new_order(&app).await;
    let paid = app
        .request(Method::POST, "/payments")
        .header("Idempotency-Key", new_key())
        .json(&json!({"order_id": order_id, "payment_method": "pm_provider_timeout"}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("answered before the provider's own answer");
    assert_eq!(paid.status(), 201);
    let payment = json(paid).await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(transitions(&app, payment["id"].as_str().unwrap(), "webhook", "succeeded").await, 1);
    assert_eq!(app.order_status(&order_id).await, "paid");
}
}
