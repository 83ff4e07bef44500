//! Our books follow the provider's money: a refund given up on that the provider carries out
//! later is recorded, one it reverses is corrected, a late charge's system refund that fails is
//! retried until it is refunded or a person must look, and a provider webhook moves money only on
//! the provider's confirmed word (a lookup, never the webhook alone). Each test builds its
//! interleaving on purpose: provider latency beyond the timeout, reconciler passes at chosen
//! moments, forged (but signed) webhooks.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use orderpay::config::Settings;

use crate::helpers::{
    TestApp, assert_problem, eventually, json, new_key, provider_webhooks_on, spawn_app_with, wait_until,
};
use crate::provider_webhooks::{deliver_ok, event, provider_charge, secret, signed, webhooks_counted};

/// Provider calls time out after 300 ms, the reconciler gives up after `attempts` checks once the
/// last send has been quiet for 1.1 s, and backs off 50 ms to 200 ms.
fn impatient(settings: &mut Settings, attempts: i32) {
    settings.provider.timeout = Duration::from_millis(300);
    settings.reconciler.max_attempts = attempts;
    settings.reconciler.quiet_before_give_up = Duration::from_millis(1100);
}

impl TestApp {
    /// A paid order of 40.00 by `payment_method`, and a refund of 15.00 of it whose send the
    /// provider parks (acting on it only when the test says), given up on by the reconciler (an
    /// app made `impatient` with one check): the order's, the payment's and the refund's ids.
    async fn refund_parked_and_given_up(&self, payment_method: &str) -> (String, String, String) {
        let (order_id, payment) = self.paid_order("40.00", payment_method).await;
        let payment_id = payment["id"].as_str().unwrap().to_owned();
        self.provider.script(json!([{"act": "park"}])).await;
        let accepted = self.refund(&payment_id, Some("15.00"), &new_key()).await;
        assert_eq!(accepted.status(), 202);
        let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(self.reconcile_once().await.gave_up, 1);
        (order_id, payment_id, refund_id)
    }

    /// `(writes, lookups)` the mock provider received on `/v1/*`.
    async fn provider_requests(&self) -> (u64, u64) {
        let url = format!("{}/_admin/requests", self.provider.address);
        let counts = json(self.client.get(url).send().await.unwrap()).await;
        (counts["writes"].as_u64().unwrap(), counts["lookups"].as_u64().unwrap())
    }

    /// The `data` of the account's events of `kind`, oldest first.
    async fn events_of_type(&self, kind: &str) -> Vec<Value> {
        let response =
            self.request(Method::GET, &format!("/events?type={kind}&limit=100")).send().await.unwrap();
        let mut events: Vec<Value> = json(response).await["data"].as_array().unwrap().clone();
        events.reverse();
        events.into_iter().map(|event| event["data"]["object"].clone()).collect()
    }

    /// A counter's value on `/metrics` (0 before it is first counted).
    pub(crate) async fn metric(&self, series: &str) -> u64 {
        let text = self.client.get(self.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |value| value.trim().parse().unwrap())
    }

    /// Pays a new order whose payment the reconciler gives up on (the provider answers 503 to
    /// every send, and the checks find nothing), and returns the order and the failed payment's id.
    async fn given_up_payment(&self) -> (Value, String) {
        self.given_up_payment_with("automatic").await
    }

    /// [`TestApp::given_up_payment`], the payment made with `capture_method`.
    pub(crate) async fn given_up_payment_with(&self, capture_method: &str) -> (Value, String) {
        let order = self.create_order().await;
        self.provider.set_faults(json!({"error_rate": 1.0})).await;
        let body = json!({"order_id": order["id"], "payment_method": "pm_card_ok", "capture_method": capture_method});
        let accepted = self.pay_with(&body, &new_key()).await;
        assert_eq!(accepted.status(), 202);
        let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
        for _ in 0..self.settings.reconciler.max_attempts {
            // Each check re-sends (503 again) but the last, which gives up once the last send
            // has been quiet long enough.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            self.reconcile_once().await;
        }
        self.provider.set_faults(json!({})).await;
        assert_eq!(self.get_payment(&payment_id).await["status"], "failed", "given up on");
        (order, payment_id)
    }

    /// The charge request of a given-up payment reaches the provider after all, with
    /// `payment_method` (which decides how the provider treats its refunds).
    pub(crate) async fn land_late_charge(&self, order: &Value, payment_id: &str, payment_method: &str) {
        self.land_late(order, payment_id, payment_method, true).await
    }

    /// As [`TestApp::land_late_charge`], an authorization (`capture: false`).
    pub(crate) async fn land_late_authorization(&self, order: &Value, payment_id: &str) {
        self.land_late(order, payment_id, "pm_card_ok", false).await
    }

    async fn land_late(&self, order: &Value, payment_id: &str, payment_method: &str, capture: bool) {
        let late = self
            .client
            .post(format!("{}/v1/charges", self.provider.address))
            .header("Idempotency-Key", format!("orderpay_pay_{payment_id}"))
            .json(&json!({
                "amount": order["total_amount"], "currency": "USD", "payment_method": payment_method,
                "reference": payment_id, "capture": capture,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(late.status(), 201, "{}", late.text().await.unwrap());
    }
}

/// The refund's guard is the charge's: a refund whose send may still be in flight (the provider
/// is slower than our timeout) is not given up on at the last check, and the slow send, once it
/// lands, is found and recorded by the next one.
#[tokio::test]
async fn a_refund_send_still_in_flight_at_the_last_check_is_never_given_up_on() {
    let app = spawn_app_with(|settings, _| impatient(settings, 1)).await;
    let (_, payment) = app.paid_order("40.00", "pm_card_ok").await;
    app.provider.set_faults(json!({"latency_ms": 2000})).await;
    let accepted = app.refund(payment["id"].as_str().unwrap(), Some("15.00"), &new_key()).await;
    assert_eq!(accepted.status(), 202, "the provider is slower than our timeout");
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.gave_up), (1, 0), "held back: {pass:?}");
    assert_eq!(app.get_refund(&refund_id).await["status"], "processing");

    tokio::time::sleep(Duration::from_millis(2300)).await;
    app.provider.set_faults(json!({})).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.settled, pass.gave_up), (1, 0), "{pass:?}");
    assert_eq!(app.get_refund(&refund_id).await["status"], "succeeded");
    assert_eq!(app.provider.refunds().await.len(), 1);
}

/// A refund given up on that the provider carries out later is recorded: the late-refund watch
/// finds it and corrects it `failed` -> `succeeded` on the provider's word. The amounts and the
/// order follow, the events say it is a correction, the audit trail shows it, and the client's
/// stored answer (402, what it was told then) replays unchanged.
#[tokio::test]
async fn a_refund_given_up_on_and_carried_out_later_is_recorded_by_the_late_refund_watch() {
    let app = spawn_app_with(|settings, _| impatient(settings, 1)).await;
    let (order_id, payment) = app.paid_order("40.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    // Slower than the timeout and the give-up's quiet period: the send lands after the give-up.
    app.provider.set_faults(json!({"latency_ms": 2500})).await;
    let key = new_key();
    let accepted = app.refund(payment_id, Some("15.00"), &key).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pass = app.reconcile_once().await;
    assert_eq!(pass.gave_up, 1, "never received, and quiet long enough: {pass:?}");
    let told = assert_problem(app.refund(payment_id, Some("15.00"), &key).await, 402, "refund-failed").await;
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "0.00");

    // The slow send lands; the watch's first look is due 1.1 s after the give-up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.provider.refunds().await.len(), 1, "the provider carried it out");
    let pass = app.reconcile_once().await;
    assert_eq!(pass.settled, 1, "the late refund is found: {pass:?}");
    let refund = app.get_refund(&refund_id).await;
    assert_eq!(refund["status"], "succeeded");
    assert!(refund["provider_refund_id"].is_string());
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "15.00");
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
    let replay = app.refund(payment_id, Some("15.00"), &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(assert_problem(replay, 402, "refund-failed").await, told, "the stored answer never changes");
    let corrections: Vec<Value> = app.events_of_type("refund.succeeded").await;
    assert_eq!(corrections.len(), 1);
    assert_eq!(corrections[0]["correction"], true);
    assert_eq!(app.events_of_type("order.partially_refunded").await.len(), 1);
    let audit = format!(
        "SELECT count(*) AS count FROM payment_events WHERE subject_id = '{refund_id}' \
         AND from_status = 'failed' AND to_status = 'succeeded' AND actor = 'reconciler'"
    );
    assert_eq!(app.count(&audit).await, 1);
    assert_eq!(app.metric(r#"orderpay_refunds_corrected_total{to="succeeded"}"#).await, 1);
    // Nothing more to watch; a second refund of the rest is within what is left.
    assert_eq!(app.reconcile_once().await.claimed, 0);
    assert_problem(app.refund(payment_id, Some("30.00"), &new_key()).await, 422, "refund-exceeds-refundable")
        .await;
}

/// A refund given up on that the provider carries out after the late-refund watch ended: no
/// watch of ours looks at it any more, and the ledger check cannot see it (our columns and our
/// ledger agree). Settlement does: the provider's `refund` movement names a refund we hold as
/// failed. It looks the refund up and records it on the provider's confirmed word, as the watch
/// would have; the movement the correction writes completes the item.
#[tokio::test]
async fn a_refund_carried_out_after_its_watch_ended_is_recorded_by_settlement() {
    let app = spawn_app_with(|settings, _| {
        impatient(settings, 1);
        settings.reconciler.late_refund_watch = Duration::from_millis(1);
    })
    .await;
    let start = chrono::Utc::now() - chrono::Duration::seconds(1);
    let (order_id, payment_id, refund_id) = app.refund_parked_and_given_up("pm_card_ok").await;
    let payment_id = payment_id.as_str();
    // The watch's one look finds nothing, and the watch ends.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled), (1, 0), "{pass:?}");
    let parked = format!("{}/_admin/parked/orderpay_refund_{refund_id}/act", app.provider.address);
    assert_eq!(app.client.post(parked).send().await.unwrap().status(), 200);
    assert_eq!(app.provider.refunds().await.len(), 1, "the provider carried it out");
    let pass = app.reconcile_once().await;
    assert_eq!(pass.claimed, 0, "the watch has ended: {pass:?}");
    assert_eq!(app.get_refund(&refund_id).await["status"], "failed");
    assert_eq!(app.ledger_check().await.0, 0, "our books agree with themselves");

    let window =
        orderpay::settlement::Window { start, end: chrono::Utc::now() + chrono::Duration::minutes(1) };
    let report = app.settle(window).await;
    assert_eq!(report.exceptions(), 0, "recorded, not left to a person: {report:#?}");
    let refund = app.get_refund(&refund_id).await;
    assert_eq!(refund["status"], "succeeded", "{refund:#}");
    assert!(refund["provider_refund_id"].is_string());
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "15.00");
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
    let item = format!(
        "SELECT count(*) AS count FROM settlement_items WHERE object_id = '{refund_id}' \
         AND found_as = 'status_mismatch' AND resolution = 'matched_later'"
    );
    assert_eq!(app.count(&item).await, 1, "found as a status mismatch, matched by the recorded refund");
    let audit = format!(
        "SELECT count(*) AS count FROM payment_events WHERE subject_id = '{refund_id}' \
         AND from_status = 'failed' AND to_status = 'succeeded' AND actor = 'reconciler'"
    );
    assert_eq!(app.count(&audit).await, 1);
    assert_eq!(app.ledger_check().await.0, 0, "the ledger holds the refund as the payment's columns do");
    assert_eq!(app.settle(window).await.items_written, 0, "a second run finds nothing new");
}

/// A refund given up on that the provider still holds as pending when the late-refund watch's
/// end comes: the provider has not said whether it carries the refund out, so the watch looks
/// again past its end (ending it would leave the refund neither corrected nor known absent), and
/// records the refund once the provider settles it.
#[tokio::test]
async fn a_refund_pending_at_the_provider_when_its_watch_ends_is_watched_until_it_settles() {
    let app = spawn_app_with(|settings, mock| {
        impatient(settings, 1);
        settings.reconciler.late_refund_watch = Duration::from_millis(1);
        mock.settle_after = Duration::from_millis(4000);
    })
    .await;
    let (order_id, payment_id, refund_id) = app.refund_parked_and_given_up("pm_refund_pending").await;
    let payment_id = payment_id.as_str();
    // The parked send lands now: the provider holds the refund as pending for four seconds.
    let parked = format!("{}/_admin/parked/orderpay_refund_{refund_id}/act", app.provider.address);
    assert_eq!(app.client.post(parked).send().await.unwrap().status(), 200);

    // The watch's first look, due 1.1 s after the give-up, is already past the watch's end.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled), (1, 0), "the provider's refund is pending: {pass:?}");
    let watched = format!(
        "SELECT count(*) AS count FROM refunds WHERE id = '{refund_id}' AND status = 'failed' \
         AND next_check_at IS NOT NULL AND absent_since IS NULL"
    );
    assert_eq!(app.count(&watched).await, 1, "still watched, and not known absent");

    let what = "the provider's refund settled and the watch recorded it";
    eventually(what, Duration::from_secs(15), || async {
        (app.reconcile_once().await.settled == 1).then_some(())
    })
    .await;
    let refund = app.get_refund(&refund_id).await;
    assert_eq!(refund["status"], "succeeded", "{refund:#}");
    assert_eq!(app.provider.refunds().await[0]["status"], "succeeded");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "15.00");
    assert_eq!(app.order_status(&order_id).await, "partially_refunded");
    assert_eq!(app.reconcile_once().await.claimed, 0, "the watch has ended: the provider has spoken");
}

/// A provider webhook reporting failed a refund whose late-refund watch has ended leaves the
/// watch ended: no lookup of it is on its way, and the webhook agrees with what we hold.
#[tokio::test]
async fn a_refund_failed_webhook_after_the_watch_ended_leaves_it_ended() {
    let app = spawn_app_with(|settings, _| {
        impatient(settings, 1);
        provider_webhooks_on(settings);
        settings.reconciler.late_refund_watch = Duration::from_millis(1);
    })
    .await;
    let (_, payment) = app.paid_order("40.00", "pm_refund_declined").await;
    let payment_id = payment["id"].as_str().unwrap();
    // Slower than the timeout: the send lands (and the provider fails the refund) after the
    // give-up. The provider's own webhooks are dropped; the one delivered below is the test's.
    app.provider.set_faults(json!({"latency_ms": 2000, "webhook_drop_rate": 1.0})).await;
    let accepted = app.refund(payment_id, Some("15.00"), &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(app.reconcile_once().await.gave_up, 1);
    let given_up = std::time::Instant::now();
    wait_until("the provider fails the refund", Duration::from_secs(10), async || {
        app.provider_refunds_for(&refund_id).await.first().is_some_and(|refund| refund["status"] == "failed")
    })
    .await;
    app.provider.set_faults(json!({"webhook_drop_rate": 1.0})).await;
    // The watch's one look (due 1.1 s after the give-up) finds it failed, and the watch ends.
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(given_up.elapsed())).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.claimed, pass.settled), (1, 0), "{pass:?}");
    let ended = format!(
        "SELECT count(*) AS count FROM refunds WHERE id = '{refund_id}' AND next_check_at IS NULL \
         AND absent_since IS NOT NULL"
    );
    assert_eq!(app.count(&ended).await, 1, "ended, known not carried out");

    let mut provider_refund = app.provider_refunds_for(&refund_id).await.remove(0);
    provider_refund["object"] = json!("refund");
    let delivery = signed(&secret(&app), &event("refund.failed", &provider_refund));
    assert_eq!(deliver_ok(&app, &delivery).await, "stale");
    assert_eq!(app.count(&ended).await, 1, "the webhook did not start the watch again");
    assert_eq!(app.reconcile_once().await.claimed, 0);
    assert_eq!(app.get_refund(&refund_id).await["status"], "failed");
}

/// A refund the provider reverses after it succeeded (`pm_refund_reversed`: the card was closed)
/// is corrected `succeeded` -> `failed` when the provider's webhook reports it, confirmed by a
/// lookup: the money counts as not refunded, the order is paid again, the stored 201 stands.
#[tokio::test]
async fn a_refund_the_provider_reverses_is_corrected_on_its_confirmed_word() {
    let app = spawn_app_with(|settings, mock| {
        provider_webhooks_on(settings);
        mock.settle_after = Duration::from_millis(300);
    })
    .await;
    let (order_id, payment) = app.paid_order("25.00", "pm_refund_reversed").await;
    let payment_id = payment["id"].as_str().unwrap();
    let key = new_key();
    let refunded = app.refund(payment_id, None, &key).await;
    assert_eq!(refunded.status(), 201);
    let refund_id = json(refunded).await["id"].as_str().unwrap().to_owned();
    assert_eq!(app.order_status(&order_id).await, "refunded");

    wait_until("the reversal is recorded", Duration::from_secs(10), async || {
        app.get_refund(&refund_id).await["status"] == "failed"
    })
    .await;
    let refund = app.get_refund(&refund_id).await;
    assert_eq!(refund["failure_code"], "refund_reversed");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "0.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
    let replay = app.refund(payment_id, None, &key).await;
    assert_eq!(replay.status(), 201, "the stored answer is what the client was told then");
    let reversed = app.events_of_type("refund.failed").await;
    assert_eq!((reversed.len(), &reversed[0]["correction"]), (1, &json!(true)));
    assert_eq!(app.events_of_type("order.paid").await.len(), 2, "paid, then paid again");
    assert_eq!(app.metric(r#"orderpay_refunds_corrected_total{to="failed"}"#).await, 1);
    // The money is refundable again, and refunded once more at the provider.
    assert_eq!(app.provider_charge(payment_id).await["amount_refunded"], "0.00");
}

/// A refund in flight (its answer lost), carried out and then reversed by the provider before
/// its `refund.succeeded` event arrives: the event's delivery settles it as the provider's
/// lookup finds it now, failed, never as the event says; the reversal's event then changes
/// nothing. Driving the protocol's model through the service with the delivery stepping in while
/// the refund's answer was held found the model taking the event's word here.
#[tokio::test]
async fn a_refund_event_settles_a_refund_in_flight_as_the_provider_has_it_now() {
    let app = spawn_app_with(|settings, mock| {
        impatient(settings, 3);
        provider_webhooks_on(settings);
        settings.reconciler.interval = Duration::from_secs(600);
        mock.webhooks_by_hand = true;
    })
    .await;
    let (order_id, payment) = app.paid_order("25.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    app.provider.script(json!([{"act": "hold"}])).await;
    let accepted = app.refund(payment_id, None, &new_key()).await;
    assert_eq!(accepted.status(), 202, "the refund's answer was lost");
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    let reverse = format!("{}/_admin/due/orderpay_refund_{refund_id}/reverse", app.provider.address);
    assert_eq!(json(app.client.post(reverse).send().await.unwrap()).await["changed"], 1);

    let events = app.provider.webhooks().await;
    let event_of = |kind: &str| {
        let event = events.iter().find(|event| event["type"] == kind).unwrap_or_else(|| panic!("no {kind}"));
        event["id"].as_str().unwrap().to_owned()
    };
    let (succeeded, reversed) = (event_of("refund.succeeded"), event_of("refund.failed"));
    let result_of = async |id: &str| {
        let url = format!("{}/_admin/webhooks/{id}/deliver", app.provider.address);
        assert_eq!(json(app.client.post(url).send().await.unwrap()).await["status"], 200);
        app.text(&format!("SELECT result AS text FROM provider_webhooks WHERE id = '{id}'")).await
    };
    assert_eq!(result_of(&succeeded).await, "applied");
    let refund = app.get_refund(&refund_id).await;
    assert_eq!((&refund["status"], &refund["failure_code"]), (&json!("failed"), &json!("refund_reversed")));
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "0.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
    assert_eq!(result_of(&reversed).await, "stale", "already settled as the provider has it");
    assert!(app.events_of_type("refund.succeeded").await.is_empty(), "never told succeeded");
    assert_eq!(app.events_of_type("refund.failed").await.len(), 1);
}

/// A late charge whose system refund the provider declines: another starts once the last is
/// certainly not carried out, with backoff, up to `ORDERPAY_RECONCILE_MAX_ATTEMPTS`; then the
/// payment waits for a person, listed by `payments list --stuck`, explained by `payments show`,
/// counted by a gauge. `refunded` is counted when a refund succeeds (never), `refund_failed`
/// when one fails.
#[tokio::test]
async fn a_late_charges_declined_refunds_are_retried_then_left_for_a_person() {
    let app = spawn_app_with(|settings, _| impatient(settings, 2)).await;
    let (order, payment_id) = app.given_up_payment().await;
    app.land_late_charge(&order, &payment_id, "pm_refund_declined").await;
    let system_refunds = format!(
        "SELECT count(*) AS count FROM refunds WHERE payment_id = '{payment_id}' AND idempotency_key IS NULL"
    );
    let order_id = order["id"].as_str().unwrap();
    let late_of = |orders: &Value| {
        let found = orders.as_array().unwrap().iter().find(|found| found["order_id"] == order_id);
        found.map(|found| found["late_charges_unrefunded"].clone())
    };
    let mut judged_in_flight = false;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        app.reconcile_once().await;
        if !judged_in_flight && app.count(&system_refunds).await == 1 {
            // One refund declined, another still to come: money in flight, not a violation.
            let (exit, report) = app.ledger_check().await;
            assert_eq!(exit, 0, "{report}");
            assert_eq!(
                late_of(&report["report"]["in_flight"]),
                Some(order["total_amount"].clone()),
                "{report}"
            );
            judged_in_flight = true;
        }
    }
    assert!(judged_in_flight, "the check ran between the two refunds");
    assert_eq!(app.count(&system_refunds).await, 2, "one, then one more after the decline, then no more");
    let declined = format!("{system_refunds} AND status = 'failed' AND failure_code = 'refund_declined'");
    assert_eq!(app.count(&declined).await, 2);
    assert_eq!(app.metric(r#"orderpay_late_charges_total{result="refund_failed"}"#).await, 2);
    assert_eq!(app.metric(r#"orderpay_late_charges_total{result="refunded"}"#).await, 0);
    assert_eq!(app.reconcile_once().await.claimed, 0, "nothing polls it any more");

    let stuck = app.cli_json(&["payments", "list", "--stuck"]).await;
    let listed: Vec<&Value> =
        stuck.as_array().unwrap().iter().filter(|row| row["id"] == payment_id.as_str()).collect();
    assert_eq!(listed.len(), 1, "listed for a person: {stuck}");
    assert_eq!(listed[0]["late_charge"]["unrefunded"], order["total_amount"]);
    let shown = app.cli_ok(&["payments", "show", &payment_id]).await;
    assert!(shown.contains("late charge") && shown.contains("not refunded"), "{shown}");
    assert_eq!(app.metric("orderpay_late_charges_unrefunded").await, 1);
    let charge = provider_charge(&app, &payment_id).await;
    assert_eq!(charge["amount_refunded"], "0.00", "the provider holds the money: a person must act");
    // Nothing is in flight for it any more: the books are wrong until a person acts.
    let (exit, report) = app.ledger_check().await;
    assert_eq!(exit, 1, "{report}");
    assert_eq!(
        late_of(&report["report"]["order_violations"]),
        Some(order["total_amount"].clone()),
        "{report}"
    );
    assert_eq!(late_of(&report["report"]["in_flight"]), None, "{report}");
}

/// The first system refund of a late charge is given up on while its send is still on its way;
/// the late-refund watch finds it absent, and the follow-up starts a second one, which the
/// provider carries out at once. The first then lands, and the provider refuses it: nothing is
/// left to refund. Exactly one refund at the provider, and our books say the same.
#[tokio::test]
async fn a_system_refund_given_up_and_carried_out_later_leaves_exactly_one_refund_at_the_provider() {
    let app = spawn_app_with(|settings, _| impatient(settings, 2)).await;
    let (order, payment_id) = app.given_up_payment().await;
    app.land_late_charge(&order, &payment_id, "pm_card_ok").await;
    // The first system refund's sends take 5 s at the provider.
    app.provider.set_faults(json!({"latency_ms": 5000})).await;
    // The watch's first look is due once the give-up's quiet period has passed.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pass = app.reconcile_once().await;
    assert_eq!(pass.settled, 1, "the late charge recorded, its refund sent: {pass:?}");
    // The first check finds nothing yet and sends it again (slow too); the second, once that
    // send has been quiet for 1.1 s, finds nothing still and gives up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.reconcile_once().await.redriven, 1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(app.reconcile_once().await.gave_up, 1);
    app.provider.set_faults(json!({})).await;
    // The late-refund watch finds it absent (still on its way), and the follow-up starts the
    // second, which the provider refunds at once.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    app.reconcile_once().await;
    let succeeded = format!(
        "SELECT count(*) AS count FROM refunds WHERE payment_id = '{payment_id}' AND idempotency_key IS NULL \
         AND status = 'succeeded'"
    );
    wait_until("the second system refund succeeds", Duration::from_secs(5), async || {
        app.count(&succeeded).await == 1
    })
    .await;
    // The first lands after all (both its sends): refused, nothing left.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        app.reconcile_once().await;
    }
    let refunds = app.provider.refunds().await;
    assert_eq!(refunds.len(), 1, "exactly one refund at the provider: {refunds:?}");
    assert_eq!(app.count(&succeeded).await, 1);
    assert_eq!(app.get_payment(&payment_id).await["amount_refunded"], order["total_amount"]);
    assert_eq!(provider_charge(&app, &payment_id).await["amount_refunded"], order["total_amount"]);
    assert_eq!(app.metric(r#"orderpay_late_charges_total{result="refunded"}"#).await, 1);
    assert_eq!(app.metric("orderpay_late_charges_unrefunded").await, 0);
}

/// The same race the other way round: the first system refund lands before the follow-up would
/// start a second. The late-refund watch runs first, records it, and no second one starts.
#[tokio::test]
async fn a_system_refund_carried_out_after_its_give_up_is_recorded_before_another_starts() {
    let app = spawn_app_with(|settings, _| impatient(settings, 2)).await;
    let (order, payment_id) = app.given_up_payment().await;
    app.land_late_charge(&order, &payment_id, "pm_card_ok").await;
    // Its sends take 3.5 s at the provider: the first lands after the give-up, before the
    // late-refund watch's first look.
    app.provider.set_faults(json!({"latency_ms": 3500})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(app.reconcile_once().await.settled, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.reconcile_once().await.redriven, 1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(app.reconcile_once().await.gave_up, 1);
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(app.provider.refunds().await.len(), 1, "it landed");
    for _ in 0..3 {
        app.reconcile_once().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let system_refunds = format!(
        "SELECT count(*) AS count FROM refunds WHERE payment_id = '{payment_id}' AND idempotency_key IS NULL"
    );
    assert_eq!(app.count(&system_refunds).await, 1, "no second refund started");
    assert_eq!(app.provider.refunds().await.len(), 1);
    assert_eq!(app.get_payment(&payment_id).await["amount_refunded"], order["total_amount"]);
    assert_eq!(app.metric(r#"orderpay_late_charges_total{result="refunded"}"#).await, 1);
}

/// Webhooks signed with the provider's secret but lying about the money: a capture of 1000.00 on
/// a 100.00 authorization, a success naming another charge in EUR for 1.00, a cancel of an
/// authorization the provider still holds. None is applied on its word: each is checked against
/// the provider (one lookup by our own key), counted as a mismatch, and the operations stay as
/// the provider says they are.
#[tokio::test]
async fn webhooks_that_lie_about_the_money_are_checked_against_the_provider_and_change_nothing() {
    let app = app_hearing_forgeries_only().await;
    let secret = secret(&app);
    let (_, authorization) = app.authorized_order("100.00", "pm_card_ok").await;
    let auth_id = authorization["id"].as_str().unwrap();
    let mut charge = provider_charge(&app, auth_id).await;
    charge["status"] = json!("succeeded");
    charge["captured"] = json!(true);
    charge["amount_captured"] = json!("1000.00");
    assert_eq!(deliver_ok(&app, &signed(&secret, &event("charge.captured", &charge))).await, "mismatch");
    let mut canceled = provider_charge(&app, auth_id).await;
    canceled["status"] = json!("canceled");
    canceled["cancellation_reason"] = json!("requested");
    assert_eq!(deliver_ok(&app, &signed(&secret, &event("charge.canceled", &canceled))).await, "stale");
    let payment = app.get_payment(auth_id).await;
    assert_eq!(
        (payment["status"].as_str(), payment["amount_captured"].as_str()),
        (Some("requires_capture"), Some("0.00"))
    );

    // A payment whose charge is pending at the provider; an event claims another charge, in EUR.
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let accepted = app.pay(&order_id, "pm_provider_pending", &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let pending_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    let mut other = provider_charge(&app, &pending_id).await;
    other["id"] = json!("ch_someone_else");
    other["currency"] = json!("EUR");
    other["amount"] = json!("1.00");
    other["amount_captured"] = json!("1.00");
    other["status"] = json!("succeeded");
    assert_eq!(deliver_ok(&app, &signed(&secret, &event("charge.succeeded", &other))).await, "mismatch");
    assert_eq!(app.get_payment(&pending_id).await["status"], "processing", "the provider says pending");
    assert!(webhooks_counted(&app, "mismatch").await >= 2);
    // The authorization can still be captured for what it holds; the provider agrees.
    assert_eq!(app.capture(auth_id, Some("100.00"), &new_key()).await.status(), 200);
    assert_eq!(provider_charge(&app, auth_id).await["amount_captured"], "100.00");
}

/// An app that hears provider webhooks, but none of the mock provider's own (they go nowhere):
/// the test delivers its forged events itself.
async fn app_hearing_forgeries_only() -> TestApp {
    spawn_app_with(|settings, mock| {
        provider_webhooks_on(settings);
        let secret = settings.api.provider_webhooks.standard()[0].reveal();
        mock.webhook_url = Some("http://127.0.0.1:9/nowhere".to_owned());
        mock.webhook_secret = Some(secret);
    })
    .await
}

/// Verification is a read: a flood of webhooks that each need the provider's word about one
/// operation makes about one lookup (shared while it runs, with the reconciler's too), and no
/// verification or watch ever sends a write to the provider.
#[tokio::test]
async fn verifying_a_flood_of_webhooks_is_one_lookup_and_never_a_write() {
    let app = app_hearing_forgeries_only().await;
    let secret = secret(&app);
    let (_, authorization) = app.authorized_order("60.00", "pm_card_ok").await;
    let auth_id = authorization["id"].as_str().unwrap().to_owned();
    let mut canceled = provider_charge(&app, &auth_id).await;
    canceled["status"] = json!("canceled");
    app.provider.set_faults(json!({"lookup_latency_ms": 400})).await;
    let before = app.provider_requests().await;
    let deliveries: Vec<_> = (0..30).map(|_| signed(&secret, &event("charge.canceled", &canceled))).collect();
    let results =
        futures::future::join_all(deliveries.iter().map(|delivery| deliver_ok(&app, delivery))).await;
    assert!(results.iter().all(|result| result == "stale"), "{results:?}");
    let after = app.provider_requests().await;
    app.provider.set_faults(json!({})).await;
    assert_eq!(after.0, before.0, "no write");
    assert!(after.1 - before.1 <= 3, "thirty verifications, {} lookups", after.1 - before.1);
    assert_eq!(app.get_payment(&auth_id).await["status"], "requires_capture");
}

/// The late-charge watch stops once the charge is recorded: a provider webhook reporting the
/// charge again does not re-arm it, and nothing polls the payment afterwards.
#[tokio::test]
async fn the_late_charge_watch_stops_once_the_charge_is_recorded() {
    let app = spawn_app_with(|settings, _| {
        impatient(settings, 1);
        provider_webhooks_on(settings);
    })
    .await;
    let (order, payment_id) = app.given_up_payment().await;
    app.land_late_charge(&order, &payment_id, "pm_card_ok").await;
    let heard = "SELECT count(*) AS count FROM provider_webhooks WHERE event_type = 'charge.succeeded'";
    wait_until("the provider's webhook is heard", Duration::from_secs(5), async || {
        app.count(heard).await >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(app.reconcile_once().await.settled, 1, "recorded and refunded");
    // The provider's webhook for the system refund arrives on its own time, and its verification
    // may ask the provider: counting starts once it has been received (its row commits after).
    let refund_heard =
        "SELECT count(*) AS count FROM provider_webhooks WHERE event_type = 'refund.succeeded'";
    wait_until("the refund's webhook is heard", Duration::from_secs(5), async || {
        app.count(refund_heard).await >= 1
    })
    .await;
    let secret = secret(&app);
    let charge = provider_charge(&app, &payment_id).await;
    let (writes, lookups) = app.provider_requests().await;
    assert_eq!(deliver_ok(&app, &signed(&secret, &event("charge.succeeded", &charge))).await, "stale");
    for _ in 0..3 {
        assert_eq!(app.reconcile_once().await.claimed, 0, "nothing to look at");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(app.provider_requests().await, (writes, lookups), "no call to the provider");
    assert_eq!(app.provider.refunds().await.len(), 1);
}

/// A charge the provider reports for a payment that failed by a decline (a provider can act on
/// a key it had declined): the webhook starts the late-charge watch (not only a log line), and
/// the watch's lookup, not the webhook, records the charge and refunds it.
#[tokio::test]
async fn a_charge_reported_for_a_declined_payment_takes_the_late_charge_path() {
    let app = spawn_app_with(|settings, _| provider_webhooks_on(settings)).await;
    let order = app.create_order().await;
    // A payment the provider declined, whose key it then charges after all: built as the
    // decline leaves it (failed, its 402 stored, no late-charge watch), the provider's ledger
    // holding nothing for the key yet.
    app.provider.set_faults(json!({"error_rate": 1.0})).await;
    let accepted = app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &new_key()).await;
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    app.provider.set_faults(json!({})).await;
    app.execute(&format!(
        "UPDATE payments SET status = 'failed', failure_code = 'insufficient_funds', next_check_at = NULL, \
         lease_until = NULL, lease_id = NULL, answer_status = 402, answer_body = '\\x7b7d' WHERE id = '{payment_id}'"
    ))
    .await;
    app.land_late_charge(&order, &payment_id, "pm_card_ok").await;
    let heard = "SELECT count(*) AS count FROM provider_webhooks WHERE event_type = 'charge.succeeded'";
    wait_until("the provider's webhook is heard", Duration::from_secs(5), async || {
        app.count(heard).await == 1
    })
    .await;
    let watched = format!(
        "SELECT count(*) AS count FROM payments WHERE id = '{payment_id}' AND late_watch_until IS NOT NULL"
    );
    assert_eq!(app.count(&watched).await, 1, "the webhook started the watch");
    let pass = app.reconcile_once().await;
    assert_eq!(pass.settled, 1, "the watch looked the charge up and refunded it: {pass:?}");
    let refunds = app.provider.refunds().await;
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(refunds[0]["amount"], order["total_amount"]);
    assert_eq!(app.get_payment(&payment_id).await["status"], "failed");
}

/// Property: a failed payment holds no money unless the provider acted late. Found by the
/// protocol's model checker: the give-up's guard read the clock at the settle, after the
/// lookup. Here the charge's send is slow (it lands 1 s after it left: within the provider
/// timeout and the give-up's margin, so not late), the last check's lookup asks before it lands
/// and finds nothing, and the reconciler is held between that answer and its give-up until the
/// charge has landed and the quiet period has passed. The lookup may have missed a send in
/// flight: the give-up is held back, and the next check finds the charge.
#[tokio::test]
async fn a_give_up_is_judged_by_when_its_lookup_asked_not_by_when_it_answered() {
    let app = spawn_app_with(|settings, _| impatient(settings, 1)).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    app.provider.set_faults(json!({"latency_ms": 1000})).await;
    let sent = std::time::Instant::now();
    let accepted = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut held = orderpay::hooks::pause("reconciler.before_give_up");
    let slow = async {
        tokio::time::timeout(Duration::from_secs(10), held.reached())
            .await
            .expect("the last check found nothing");
        assert!(app.provider.charges().await.is_empty(), "the lookup asked before the charge landed");
        // Held until the charge has landed and the send has been quiet for longer than 1.1 s.
        wait_until("the charge lands", Duration::from_secs(10), async || {
            !app.provider.charges().await.is_empty()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1300).saturating_sub(sent.elapsed())).await;
        held.release();
    };
    let (pass, ()) = tokio::join!(app.reconcile_once(), slow);
    assert_eq!((pass.claimed, pass.gave_up), (1, 0), "held back: {pass:?}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(app.reconcile_once().await.settled, 1);
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
    assert_eq!(app.order_status(&order_id).await, "paid");
}

/// Property: a failed payment holds no money unless the provider acted late, for an operator
/// too. Found by the model checker: `payments resolve --as failed` (without `--force`) failed a
/// payment whose send was still on its way, because the lookup found nothing yet. Now it is
/// refused while the last send could still land, and the charge, once it lands, settles the
/// payment.
#[tokio::test]
async fn an_operator_never_fails_a_payment_whose_send_could_still_land() {
    let app = spawn_app_with(|settings, _| impatient(settings, 1)).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    app.provider.set_faults(json!({"latency_ms": 4000})).await;
    let accepted = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    app.provider.set_faults(json!({})).await;
    let refused =
        app.cli(&["payments", "resolve", &payment_id, "--as", "failed", "--reason", "looks lost"]).await;
    assert!(!refused.status.success(), "refused");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("could still land"), "{said}");
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    wait_until("the charge lands", Duration::from_secs(10), async || {
        !app.provider.charges().await.is_empty()
    })
    .await;
    assert_eq!(app.reconcile_once().await.settled, 1);
    assert_eq!(app.get_payment(&payment_id).await["status"], "succeeded");
}

/// Property: once nothing is in flight, our books equal the provider's. Found by the model
/// checker in the late-refund watch's design: a refund given up on lands late, the watch looks it
/// up (succeeded), and before it records that, the provider reverses it and its `refund.failed`
/// webhook arrives (our refund is still failed: nothing to correct). Applying the watch's stale
/// lookup would say refunded while the provider says reversed. The webhook moves the watch's next
/// look forward; the stale correction is not applied; the next look sees the reversal.
#[tokio::test]
async fn a_reversal_reported_while_the_watch_looks_is_never_lost() {
    let app = spawn_app_with(|settings, mock| {
        impatient(settings, 1);
        provider_webhooks_on(settings);
        mock.settle_after = Duration::from_millis(3000);
    })
    .await;
    let (order_id, payment) = app.paid_order("40.00", "pm_refund_reversed").await;
    let payment_id = payment["id"].as_str().unwrap();
    app.provider.set_faults(json!({"latency_ms": 2000})).await;
    let accepted = app.refund(payment_id, Some("15.00"), &new_key()).await;
    let refund_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    // The provider's webhook of the late refund's success is lost (so that only the watch finds
    // it); the reversal's arrives.
    app.provider.set_faults(json!({"webhook_drop_rate": 1.0})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(app.reconcile_once().await.gave_up, 1);
    let given_up = std::time::Instant::now();
    // It lands at 2 s and is reversed 3 s later; the watch's look (due 1.1 s after the give-up)
    // is held between its lookup (succeeded) and its correction until the reversal's webhook is in.
    wait_until("the refund lands at the provider", Duration::from_secs(10), async || {
        app.provider_refunds_for(&refund_id)
            .await
            .first()
            .is_some_and(|refund| refund["status"] == "succeeded")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // its webhook went out, and was dropped
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(given_up.elapsed())).await;
    let mut held = orderpay::hooks::pause("late_refund.before_correction");
    let reversal_heard = async {
        tokio::time::timeout(Duration::from_secs(10), held.reached())
            .await
            .expect("the watch found it carried out");
        let heard = format!(
            "SELECT count(*) AS count FROM provider_webhooks WHERE event_type = 'refund.failed' \
             AND subject_id = '{refund_id}'"
        );
        wait_until("the reversal's webhook", Duration::from_secs(10), async || app.count(&heard).await == 1)
            .await;
        held.release();
    };
    let (pass, ()) = tokio::join!(app.reconcile_once(), reversal_heard);
    assert_eq!(pass.settled, 0, "the stale lookup is not applied: {pass:?}");
    assert_eq!(app.get_refund(&refund_id).await["status"], "failed");
    app.reconcile_once().await;
    assert_eq!(app.get_refund(&refund_id).await["status"], "failed", "the provider reversed it");
    assert_eq!(app.get_payment(payment_id).await["amount_refunded"], "0.00");
    assert_eq!(provider_charge(&app, payment_id).await["amount_refunded"], "0.00");
    assert_eq!(app.order_status(&order_id).await, "paid");
}

/// Property: our books follow the provider's confirmed word, never a webhook's alone. Before the
/// provider has answered our call we do not know the charge's or refund's id, so a signed event
/// naming our key with any id matches the operation: applied on its word, a forged success would
/// settle a payment the provider never charged, a forged failure would let the order be paid a
/// second time, a forged refund would record money never given back. Each is looked up instead,
/// and the provider's answer (still pending) changes nothing.
#[tokio::test]
async fn forged_outcomes_for_operations_in_flight_are_never_applied_on_their_word() {
    let app = app_hearing_forgeries_only().await;
    let secret = secret(&app);
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let accepted = app.pay(&order_id, "pm_provider_pending", &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let payment_id = json(accepted).await["id"].as_str().unwrap().to_owned();
    let mut forged = provider_charge(&app, &payment_id).await;
    forged["id"] = json!("ch_forged");
    forged["status"] = json!("succeeded");
    forged["captured"] = json!(true);
    forged["amount_captured"] = forged["amount"].clone();
    assert_ne!(deliver_ok(&app, &signed(&secret, &event("charge.succeeded", &forged))).await, "applied");
    forged["status"] = json!("declined");
    forged["captured"] = json!(false);
    forged["amount_captured"] = json!("0.00");
    forged["decline_code"] = json!("card_declined");
    assert_ne!(deliver_ok(&app, &signed(&secret, &event("charge.failed", &forged))).await, "applied");
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing", "the provider says pending");
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    let again = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_problem(again, 409, "payment-in-progress").await;

    let (_, paid) = app.paid_order("30.00", "pm_refund_pending").await;
    let paid_id = paid["id"].as_str().unwrap();
    let refund = app.refund(paid_id, None, &new_key()).await;
    assert_eq!(refund.status(), 202);
    let refund_id = json(refund).await["id"].as_str().unwrap().to_owned();
    let mut forged_refund = app.provider_refunds_for(&refund_id).await.remove(0);
    forged_refund["id"] = json!("re_forged");
    forged_refund["object"] = json!("refund");
    forged_refund["status"] = json!("succeeded");
    assert_ne!(
        deliver_ok(&app, &signed(&secret, &event("refund.succeeded", &forged_refund))).await,
        "applied"
    );
    assert_eq!(app.get_json(&format!("/refunds/{refund_id}")).await["status"], "processing");
    assert_eq!(app.get_payment(paid_id).await["amount_refunded"], "0.00");
    assert!(webhooks_counted(&app, "applied").await == 0, "nothing was applied on an event's word");
}

/// The late-charge watch outlives a credentials outage: a look the provider refuses (our key
/// revoked) says nothing, so the watch does not end when its time is up; the first look after
/// the key works finds the charge that landed meanwhile and refunds it.
#[tokio::test]
async fn the_late_charge_watch_outlives_an_outage_of_our_credentials() {
    let app = spawn_app_with(|settings, _| impatient(settings, 2)).await;
    let (order, payment_id) = app.given_up_payment().await;
    app.provider.set_faults(json!({"credentials_revoked": true})).await;
    let ended = format!(
        "UPDATE payments SET late_watch_until = now() - interval '1 second', next_check_at = now() \
         WHERE id = '{payment_id}'"
    );
    app.execute(&ended).await;
    let pass = app.reconcile_once().await;
    assert_eq!(pass.errors, 0, "{pass:?}");
    let watched = format!(
        "SELECT count(*) AS count FROM payments WHERE id = '{payment_id}' AND next_check_at IS NOT NULL"
    );
    assert_eq!(app.count(&watched).await, 1, "the refused look does not end the watch");

    app.provider.set_faults(json!({})).await;
    app.land_late_charge(&order, &payment_id, "pm_card_ok").await;
    app.execute(&format!("UPDATE payments SET next_check_at = now() WHERE id = '{payment_id}'")).await;
    let pass = app.reconcile_once().await;
    assert_eq!(pass.settled, 1, "the look found the late charge and refunded it: {pass:?}");
    assert_eq!(app.provider.refunds().await.len(), 1);
    assert_eq!(app.get_payment(&payment_id).await["status"], "failed");
}
