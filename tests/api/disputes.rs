//! Disputes: recorded as the provider reports them (webhooks verified by a lookup, the
//! reconciler's pass), guarded, with their money in the ledger and the payment's
//! `amount_disputed`, and what they do to refunds. The mock holds its webhooks for the test
//! (`webhooks_by_hand`), which delivers them when, as often and in the order it means to.

use std::sync::Arc;
use std::time::Duration;

use orderpay::provider::delegate::Delegating;
use orderpay::provider::{BoxFuture, Dispute, DisputePage, PaymentProvider, ProviderError};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, TestWire, assert_problem, json, new_key, over_both_wires, provider_webhooks_on, spawn_app_with,
    wait_until,
};
use crate::provider_webhooks::{deliver_ok, event, provider_charge, secret, signed};

/// An app hearing its provider's webhooks only when the test delivers them, the reconciler idle
/// (the test runs its passes), pending things settling after 300 ms.
async fn app() -> TestApp {
    app_on(TestWire::Mock).await
}

/// [`app`] on `wire`.
async fn app_on(wire: TestWire) -> TestApp {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        provider_webhooks_on(settings);
        settings.reconciler.interval = Duration::from_secs(600);
        mock.webhooks_by_hand = true;
    })
    .await;
    // The reconciler's first pass runs as the app starts, and lists the provider's disputes
    // (then not again for a minute). Under load it can run late enough to record a dispute the
    // test opened for its webhooks to record: the test starts once that listing is done.
    let listed = "SELECT count(*) AS count FROM dispute_listing WHERE listed_at IS NOT NULL";
    wait_until("the startup pass lists the provider's disputes", Duration::from_secs(20), async || {
        app.count(listed).await == 1
    })
    .await;
    app
}

/// A payment of `payment_method` that succeeded: its id and the provider's charge id.
async fn paid(app: &TestApp, payment_method: &str) -> (String, String) {
    let order = app.create_order().await;
    let response = app.pay(order["id"].as_str().unwrap(), payment_method, &new_key()).await;
    let payment = json(response).await;
    assert_eq!(payment["status"], "succeeded", "{payment}");
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let charge = app.provider.charges_for(&payment_id).await.remove(0);
    (payment_id, charge["id"].as_str().unwrap().to_owned())
}

async fn admin(app: &TestApp, path: &str, body: Value) -> Value {
    let url = format!("{}/_admin/{path}", app.provider.address);
    let response = app.client.post(url).json(&body).send().await.unwrap();
    assert!(response.status().is_success(), "{path}: {}", response.status());
    json(response).await
}

/// Opens a dispute of all of `charge_id` at the provider; its id.
async fn open_dispute(app: &TestApp, charge_id: &str) -> String {
    let dispute = admin(app, "disputes", json!({ "charge": charge_id, "reason": "fraudulent" })).await;
    dispute["id"].as_str().unwrap().to_owned()
}

async fn decide(app: &TestApp, dispute_id: &str, outcome: &str) {
    admin(app, &format!("disputes/{dispute_id}/decide"), json!({ "outcome": outcome })).await;
}

/// The ids of the provider's `charge.dispute.*` events not delivered yet, oldest first.
async fn undelivered_dispute_events(app: &TestApp) -> Vec<String> {
    let log = app.provider.webhooks().await;
    log.iter()
        .filter(|event| event["type"].as_str().unwrap().starts_with("charge.dispute."))
        .filter(|event| event["attempts"].as_array().is_none_or(Vec::is_empty))
        .map(|event| event["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Sends the provider's event `id` to the app, now; the app's answer's status.
async fn deliver_by_hand(app: &TestApp, id: &str) -> u16 {
    let url = format!("{}/_admin/webhooks/{id}/deliver", app.provider.address);
    let answer = json(app.client.post(url).send().await.unwrap()).await;
    answer["status"].as_u64().unwrap() as u16
}

/// Delivers every dispute event not delivered yet, in order.
async fn deliver_all(app: &TestApp) {
    for id in undelivered_dispute_events(app).await {
        assert_eq!(deliver_by_hand(app, &id).await, 200);
    }
}

/// The recorded dispute: `status`, `withdrawn/reinstated`, and its payment's `amount_disputed`,
/// as the table holds it and as `GET /payments/{id}` renders it (which must agree).
async fn recorded(app: &TestApp, provider_id: &str) -> (String, String, String) {
    let status = app
        .text(&format!("SELECT status AS text FROM disputes WHERE provider_dispute_id = '{provider_id}'"))
        .await;
    let money = app
        .text(&format!(
            "SELECT amount_withdrawn::text || '/' || amount_reinstated::text AS text FROM disputes \
             WHERE provider_dispute_id = '{provider_id}'"
        ))
        .await;
    let disputed = app
        .text(&format!(
            "SELECT p.amount_disputed::text AS text FROM payments p JOIN disputes d \
             ON d.payment_id = p.id WHERE d.provider_dispute_id = '{provider_id}'"
        ))
        .await;
    let payment_id = app
        .text(&format!(
            "SELECT payment_id::text AS text FROM disputes WHERE provider_dispute_id = '{provider_id}'"
        ))
        .await;
    let payment = app.get_json(&format!("/payments/{payment_id}")).await;
    let rendered: rust_decimal::Decimal = payment["amount_disputed"].as_str().unwrap().parse().unwrap();
    assert_eq!(rendered, disputed.parse().unwrap(), "the payment's amount_disputed as rendered: {payment}");
    (status, money, disputed)
}

/// The next reconciler pass lists the provider's disputes (as once a minute has passed since the
/// last listing, which the app's own reconciler may have made).
async fn listing_due(app: &TestApp) {
    app.execute("UPDATE dispute_listing SET listed_at = NULL").await;
}

async fn movements(app: &TestApp, kind: &str) -> i64 {
    app.count(&format!("SELECT count(*) AS count FROM ledger_movements WHERE type = '{kind}'")).await
}

async fn refund(app: &TestApp, payment_id: &str, amount: Option<&str>) -> reqwest::Response {
    let mut body = json!({ "payment_id": payment_id });
    if let Some(amount) = amount {
        body["amount"] = json!(amount);
    }
    app.request(Method::POST, "/refunds")
        .header("Idempotency-Key", new_key())
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// `orderpay_disputes_recorded_total{result}` as `/metrics` shows it (the recorder is the
/// process's: callers compare with lower bounds).
async fn recorded_counted(app: &TestApp, result: &str) -> u64 {
    let text = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let series = format!("orderpay_disputes_recorded_total{{result=\"{result}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&series)).map_or(0, |value| value.trim().parse().unwrap())
}

over_both_wires! {
async fn a_won_dispute_withdraws_then_reinstates_the_funds_and_the_books_follow(wire: TestWire) {
    let app = app_on(wire).await;
    let (payment_id, charge_id) = paid(&app, "pm_card_ok").await;
    let dispute_id = open_dispute(&app, &charge_id).await;
    deliver_all(&app).await;
    assert_eq!(
        recorded(&app, &dispute_id).await,
        ("needs_response".into(), "48.4800/0.0000".into(), "48.4800".into())
    );
    assert_eq!(movements(&app, "dispute_withdrawal").await, 1);
    app.assert_books_equal_the_provider().await;

    decide(&app, &dispute_id, "won").await;
    deliver_all(&app).await;
    assert_eq!(recorded(&app, &dispute_id).await, ("won".into(), "48.4800/48.4800".into(), "0.0000".into()));
    assert_eq!(movements(&app, "dispute_reinstatement").await, 1);
    let closed = app
        .text(&format!(
            "SELECT closed_reason AS text FROM disputes WHERE provider_dispute_id = '{dispute_id}'"
        ))
        .await;
    // Stripe gives no reason for a close: with no evidence submitted, the adapter reads a
    // decision as one made without it.
    let reason = if wire == TestWire::Stripe { "evidence_not_submitted" } else { "decided" };
    assert_eq!(closed, reason);
    app.assert_books_equal_the_provider().await;
    let _ = payment_id;
}
}

over_both_wires! {
async fn duplicate_and_reordered_dispute_webhooks_record_it_once(wire: TestWire) {
    let app = app_on(wire).await;
    let (_, charge_id) = paid(&app, "pm_card_ok").await;
    let dispute_id = open_dispute(&app, &charge_id).await;
    decide(&app, &dispute_id, "lost").await;
    // created, funds_withdrawn, closed: delivered newest first, each twice.
    let mut events = undelivered_dispute_events(&app).await;
    assert_eq!(events.len(), 3);
    events.reverse();
    for id in events.iter().chain(events.iter()) {
        assert_eq!(deliver_by_hand(&app, id).await, 200);
    }
    assert_eq!(recorded(&app, &dispute_id).await, ("lost".into(), "48.4800/0.0000".into(), "48.4800".into()));
    assert_eq!(app.count("SELECT count(*) AS count FROM disputes").await, 1);
    assert_eq!(movements(&app, "dispute_withdrawal").await, 1);
    assert_eq!(movements(&app, "dispute_reinstatement").await, 0);
    let results = app
        .text("SELECT string_agg(result, ',' ORDER BY received_at, result) AS text FROM provider_webhooks WHERE event_type LIKE 'charge.dispute.%'")
        .await;
    assert_eq!(
        results.matches("applied").count(),
        1,
        "one event recorded it, the rest changed nothing: {results}"
    );
    app.assert_books_equal_the_provider().await;
}
}

/// A provider whose dispute lookups and listings answer an older view of every dispute
/// (`needs_response`, nothing reinstated): a lagging read of the provider's own.
struct Lagging(Arc<dyn PaymentProvider>);

fn lagging(dispute: Dispute) -> Dispute {
    Dispute {
        status: orderpay::disputes::DisputeStatus::NeedsResponse,
        closed_reason: None,
        amount_reinstated: rust_decimal::Decimal::ZERO,
        ..dispute
    }
}

impl Delegating for Lagging {
    fn inner(&self) -> &dyn PaymentProvider {
        &*self.0
    }

    fn get_dispute<'a>(
        &'a self,
        dispute_id: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Dispute>, ProviderError>> {
        Box::pin(async move { Ok(self.0.get_dispute(dispute_id, request_id).await?.map(lagging)) })
    }

    fn list_disputes<'a>(
        &'a self,
        created_gte: chrono::DateTime<chrono::Utc>,
        starting_after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputePage, ProviderError>> {
        Box::pin(async move {
            let page = self.0.list_disputes(created_gte, starting_after).await?;
            Ok(DisputePage { disputes: page.disputes.into_iter().map(lagging).collect(), ..page })
        })
    }
}

/// An app with a dispute the bank decided for the merchant, recorded as won.
async fn won_dispute() -> (TestApp, String) {
    let app = app().await;
    let (_, charge_id) = paid(&app, "pm_card_ok").await;
    let dispute_id = open_dispute(&app, &charge_id).await;
    decide(&app, &dispute_id, "won").await;
    deliver_all(&app).await;
    assert_eq!(recorded(&app, &dispute_id).await.0, "won");
    (app, dispute_id)
}

/// The app's provider as [`Lagging`] behind its own webhooks.
fn lagging_provider(app: &TestApp) -> Arc<dyn PaymentProvider> {
    Arc::new(Lagging(orderpay::app::provider(&app.settings.provider).unwrap()))
}

#[tokio::test]
async fn a_change_that_breaks_the_guard_is_counted_and_ignored_and_a_webhook_alone_changes_nothing() {
    let (app, dispute_id) = won_dispute().await;

    // The provider's lookup says the won dispute needs a response again: refused, counted.
    let refused_before = recorded_counted(&app, "refused").await;
    listing_due(&app).await;
    app.reconcile_once_with(lagging_provider(&app)).await;
    assert_eq!(recorded(&app, &dispute_id).await, ("won".into(), "48.4800/48.4800".into(), "0.0000".into()));
    assert!(recorded_counted(&app, "refused").await > refused_before);

    // A forged event saying the same is checked against the provider, which says won.
    let url = format!("{}/v1/disputes/{dispute_id}", app.provider.address);
    let mut forged = json(app.client.get(url).send().await.unwrap()).await;
    forged["status"] = json!("needs_response");
    forged["closed_reason"] = Value::Null;
    forged["amount_reinstated"] = json!("0.00");
    let answer = deliver_ok(&app, &signed(&secret(&app), &event("charge.dispute.updated", &forged))).await;
    assert_eq!(answer, "stale");
    assert_eq!(recorded(&app, &dispute_id).await.0, "won");
    assert_eq!(movements(&app, "dispute_reinstatement").await, 1);
    app.assert_books_equal_the_provider().await;
}

/// A webhook's own lookup that breaks the guard (the provider, lagging behind its own webhooks,
/// says a won dispute needs a response again) is counted and ignored, as the reconciler's
/// listing is: a webhook records a dispute through the same guarded statement, with the
/// provider's answer, never its own word.
#[tokio::test]
async fn a_webhook_whose_lookup_breaks_the_guard_is_counted_and_ignored() {
    let (app, dispute_id) = won_dispute().await;

    let refused_before = recorded_counted(&app, "refused").await;
    // The webhook path of the service with the lagging provider: the event names a state we do
    // not hold, so it is verified, and the lookup's answer is refused by the guard.
    let engine = app.engine_with(lagging_provider(&app));
    let url = format!("{}/v1/disputes/{dispute_id}", app.provider.address);
    let mut reported = json(app.client.get(url).send().await.unwrap()).await;
    reported["status"] = json!("needs_response");
    reported["closed_reason"] = Value::Null;
    reported["amount_reinstated"] = json!("0.00");
    let body = event("charge.dispute.updated", &reported);
    let read = orderpay::provider::wire::read_event(body["id"].as_str().unwrap().to_owned(), body).unwrap();
    let received = orderpay::operations::webhooks::receive(&engine, &read).await.unwrap();
    assert_eq!(received.as_str(), "stale", "recorded as changing nothing");
    assert_eq!(recorded(&app, &dispute_id).await, ("won".into(), "48.4800/48.4800".into(), "0.0000".into()));
    assert!(recorded_counted(&app, "refused").await > refused_before, "the refusal is counted");
    assert_eq!(movements(&app, "dispute_reinstatement").await, 1, "no movement undone or repeated");
    app.assert_books_equal_the_provider().await;
}

over_both_wires! {
async fn a_dispute_whose_webhooks_are_all_dropped_is_recorded_by_one_reconciler_pass(wire: TestWire) {
    let app = app_on(wire).await;
    let (_, charge_id) = paid(&app, "pm_card_disputed").await;
    // The bank disputes it 300 ms after the capture; no webhook is ever delivered.
    let disputes_url = format!("{}/_admin/disputes", app.provider.address);
    wait_until("the provider's dispute", Duration::from_secs(5), async || {
        let list = json(app.client.get(&disputes_url).send().await.unwrap()).await;
        list["data"].as_array().is_some_and(|data| !data.is_empty())
    })
    .await;
    let list = json(app.client.get(&disputes_url).send().await.unwrap()).await;
    let dispute_id = list["data"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list["data"][0]["charge"], charge_id.as_str());

    listing_due(&app).await;
    let report = app.reconcile_once().await;
    assert!(report.settled >= 1, "{report:?}");
    assert_eq!(
        recorded(&app, &dispute_id).await,
        ("needs_response".into(), "48.4800/0.0000".into(), "48.4800".into())
    );
    // Its closing is lost too: the next listing (a minute later) looks at the open dispute again.
    decide(&app, &dispute_id, "lost").await;
    app.reconcile_once().await;
    assert_eq!(recorded(&app, &dispute_id).await.0, "needs_response", "not listed again within the minute");
    listing_due(&app).await;
    app.reconcile_once().await;
    assert_eq!(recorded(&app, &dispute_id).await.0, "lost");
    let reason = app
        .text(&format!(
            "SELECT closed_reason AS text FROM disputes WHERE provider_dispute_id = '{dispute_id}'"
        ))
        .await;
    assert_eq!(reason, "evidence_not_submitted");
    listing_due(&app).await;
    app.reconcile_once().await;
    assert_eq!(movements(&app, "dispute_withdrawal").await, 1);
    app.assert_books_equal_the_provider().await;
}
}

over_both_wires! {
/// The worst interleaving on purpose: the webhook and the reconciler both set out to record a
/// dispute we lack while a transaction holds its payment, so both have looked for it and neither
/// has written when that transaction ends. One row, one movement.
async fn a_webhook_and_the_reconciler_recording_one_dispute_at_once_write_it_once(wire: TestWire) {
    use diesel_async::{AsyncConnection, RunQueryDsl};
    let app = app_on(wire).await;
    let (payment_id, charge_id) = paid(&app, "pm_card_ok").await;
    let dispute_id = open_dispute(&app, &charge_id).await;
    let created = undelivered_dispute_events(&app).await[0].clone();

    let mut holder = app.db().await;
    holder.begin_test_transaction().await.unwrap();
    diesel::sql_query(format!("SELECT 1 FROM payments WHERE id = '{payment_id}' FOR UPDATE"))
        .execute(&mut holder)
        .await
        .unwrap();
    let webhook = tokio::spawn({
        let (address, id) = (app.provider.address.clone(), created.clone());
        async move {
            let url = format!("{address}/_admin/webhooks/{id}/deliver");
            crate::helpers::http_client().post(url).send().await.unwrap().status()
        }
    });
    listing_due(&app).await;
    let pass = app.reconcile_once();
    let release = async {
        wait_until("both recorders waiting on the payment", Duration::from_secs(10), async || {
            app.count(
                "SELECT count(*) AS count FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%provider_charge_id%' AND datname = current_database()",
            )
            .await
                >= 2
        })
        .await;
        drop(holder);
    };
    let (report, ()) = tokio::join!(pass, release);
    assert_eq!(webhook.await.unwrap(), 200);
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(app.count("SELECT count(*) AS count FROM disputes").await, 1);
    assert_eq!(movements(&app, "dispute_withdrawal").await, 1);
    assert_eq!(recorded(&app, &dispute_id).await.2, "48.4800");
    let created = app.count("SELECT count(*) AS count FROM events WHERE type = 'dispute.created'").await;
    assert_eq!(created, 1, "one event");
    app.assert_books_equal_the_provider().await;
}
}

over_both_wires! {
async fn refunds_are_refused_while_disputed_and_after_a_lost_dispute_and_allowed_after_a_won_one(wire: TestWire) {
    let app = app_on(wire).await;
    let (lost_payment, lost_charge) = paid(&app, "pm_card_ok").await;
    let (won_payment, won_charge) = paid(&app, "pm_card_ok").await;
    let lost = open_dispute(&app, &lost_charge).await;
    let won = open_dispute(&app, &won_charge).await;
    deliver_all(&app).await;
    let open = refund(&app, &lost_payment, Some("1.00")).await;
    assert_eq!(open.headers()["orderpay-should-retry"], "false");
    let disputed = assert_problem(open, 409, "charge-disputed").await;
    assert_eq!(disputed["refundable_amount"], "0.00");

    decide(&app, &lost, "lost").await;
    decide(&app, &won, "won").await;
    deliver_all(&app).await;
    let refused =
        assert_problem(refund(&app, &lost_payment, Some("1.00")).await, 422, "refund-exceeds-refundable")
            .await;
    assert_eq!(refused["refundable_amount"], "0.00");
    let refunded = json(refund(&app, &won_payment, Some("4.00")).await).await;
    assert_eq!(refunded["status"], "succeeded", "{refunded}");
    app.assert_books_equal_the_provider().await;
}
}

over_both_wires! {
/// The provider's settlement records of a won and a lost dispute (`dispute`, `dispute_reversal`)
/// match the ledger's movements one for one.
async fn settlement_matches_the_disputes_movements_with_the_providers(wire: TestWire) {
    use orderpay::settlement::Window;
    let app = app_on(wire).await;
    let now = chrono::Utc::now();
    let window =
        Window { start: now - chrono::Duration::seconds(1), end: now + chrono::Duration::minutes(1) };
    let (_, won_charge) = paid(&app, "pm_card_ok").await;
    let (_, lost_charge) = paid(&app, "pm_card_ok").await;
    let won = open_dispute(&app, &won_charge).await;
    let lost = open_dispute(&app, &lost_charge).await;
    decide(&app, &won, "won").await;
    decide(&app, &lost, "lost").await;
    deliver_all(&app).await;

    let report = app.settle(window).await;
    assert_eq!(
        report.categories["matched"].count, 5,
        "two charges, two withdrawals, one reinstatement: {report:#?}"
    );
    assert_eq!(report.exceptions(), 0, "{report:#?}");
    assert_eq!(report.ours_total["USD"], report.provider_total["USD"]);
}
}

async fn events_of(app: &TestApp, kind: &str) -> usize {
    let response = app.request(Method::GET, &format!("/events?type={kind}&limit=100")).send().await.unwrap();
    json(response).await["data"].as_array().unwrap().len()
}

over_both_wires! {
async fn the_api_lists_and_gets_disputes_and_each_step_is_one_event(wire: TestWire) {
    let app = app_on(wire).await;
    let (payment_id, charge_id) = paid(&app, "pm_card_ok").await;
    let (_, other_charge) = paid(&app, "pm_card_ok").await;
    let won = open_dispute(&app, &charge_id).await;
    admin(
        &app,
        "disputes",
        json!({ "charge": other_charge, "reason": "duplicate", "evidence_due_in_secs": 3600 }),
    )
    .await;
    decide(&app, &won, "won").await;
    deliver_all(&app).await;
    // Every event twice more: nothing new.
    for id in app.provider.webhooks().await.iter().filter_map(|event| event["id"].as_str()) {
        deliver_by_hand(&app, id).await;
    }

    let list = json(app.request(Method::GET, "/disputes").send().await.unwrap()).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 2, "{list}");
    let mine =
        json(app.request(Method::GET, &format!("/disputes?payment_id={payment_id}")).send().await.unwrap())
            .await;
    let dispute = &mine["data"][0];
    assert_eq!(mine["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        (
            dispute["status"].as_str(),
            dispute["provider_dispute_id"].as_str(),
            dispute["amount_reinstated"].as_str()
        ),
        (Some("won"), Some(won.as_str()), Some("48.48"))
    );
    let id = dispute["id"].as_str().unwrap();
    let got = json(app.request(Method::GET, &format!("/disputes/{id}")).send().await.unwrap()).await;
    assert_eq!(&got, dispute);
    let soon =
        (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let due =
        json(app.request(Method::GET, &format!("/disputes?due_before={soon}")).send().await.unwrap()).await;
    assert_eq!(due["data"].as_array().unwrap().len(), 1, "only the one due in an hour: {due}");
    assert_eq!(due["data"][0]["reason"], "duplicate");
    let won_only = json(app.request(Method::GET, "/disputes?status=won").send().await.unwrap()).await;
    assert_eq!(won_only["data"].as_array().unwrap().len(), 1);
    assert_problem(
        app.request(Method::GET, "/disputes?status=open").send().await.unwrap(),
        400,
        "invalid-parameter",
    )
    .await;
    assert_problem(
        app.request(Method::GET, "/disputes?due_before=soon").send().await.unwrap(),
        400,
        "invalid-parameter",
    )
    .await;
    let unknown = format!("/disputes/{}", uuid::Uuid::now_v7());
    assert_problem(app.request(Method::GET, &unknown).send().await.unwrap(), 404, "not-found").await;

    // One event per step, whatever the copies and the order.
    assert_eq!(events_of(&app, "dispute.created").await, 2);
    assert_eq!(events_of(&app, "dispute.funds_withdrawn").await, 2);
    assert_eq!(events_of(&app, "dispute.funds_reinstated").await, 1);
    assert_eq!(events_of(&app, "dispute.closed").await, 1);
    assert_eq!(events_of(&app, "dispute.updated").await, 0);

    // The operator's list, and the gauge the alert reads.
    let listed = app.cli_json(&["disputes", "list", "--due-within", "1d"]).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["account_id"], app.account_id.to_string());
    assert_eq!(app.cli_json(&["disputes", "list"]).await.as_array().unwrap().len(), 2);
    // Read at scrape, within a second (a loaded machine may miss one).
    wait_until("the gauge of evidence due soon", Duration::from_secs(10), async || {
        let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
        metrics.lines().any(|line| line == "orderpay_disputes_evidence_due_soon 1")
    })
    .await;
    app.assert_books_equal_the_provider().await;
}
}

over_both_wires! {
/// An inquiry (`warning_*`) moves no money: nothing withdrawn, the payment refundable in full.
async fn an_inquiry_moves_no_money_and_closes(wire: TestWire) {
    let app = app_on(wire).await;
    let (payment_id, charge_id) = paid(&app, "pm_card_ok").await;
    let inquiry =
        admin(&app, "disputes", json!({ "charge": charge_id, "reason": "general", "inquiry": true })).await;
    let inquiry = inquiry["id"].as_str().unwrap().to_owned();
    deliver_all(&app).await;
    assert_eq!(
        recorded(&app, &inquiry).await,
        ("warning_needs_response".into(), "0.0000/0.0000".into(), "0.0000".into())
    );
    decide(&app, &inquiry, "lost").await;
    deliver_all(&app).await;
    assert_eq!(recorded(&app, &inquiry).await.0, "warning_closed");
    assert_eq!(movements(&app, "dispute_withdrawal").await, 0);
    assert_eq!((events_of(&app, "dispute.created").await, events_of(&app, "dispute.closed").await), (1, 1));
    let refunded = json(refund(&app, &payment_id, None).await).await;
    assert_eq!(
        (refunded["status"].as_str(), refunded["amount"].as_str()),
        (Some("succeeded"), Some("48.48"))
    );
    app.assert_books_equal_the_provider().await;
}
}

over_both_wires! {
/// `orderpay ledger check` finds a payment whose `amount_disputed` left its dispute movements
/// (a hand edit with the triggers off), and the order whose net no longer equals its columns'.
async fn the_ledger_check_finds_disputed_money_that_left_the_ledger(wire: TestWire) {
    use diesel_async::SimpleAsyncConnection;
    let app = app_on(wire).await;
    let (payment_id, charge_id) = paid(&app, "pm_card_ok").await;
    let lost = open_dispute(&app, &charge_id).await;
    decide(&app, &lost, "lost").await;
    deliver_all(&app).await;
    let (exit, report) = app.ledger_check().await;
    assert_eq!(exit, 0, "{report}");

    let edit = format!(
        "BEGIN; SET LOCAL session_replication_role = replica; \
         UPDATE payments SET amount_disputed = 0 WHERE id = '{payment_id}'; COMMIT"
    );
    app.db().await.batch_execute(&edit).await.unwrap();
    let (exit, report) = app.ledger_check().await;
    assert_eq!(exit, 1, "{report}");
    let mismatch = &report["report"]["payment_mismatches"][0];
    assert_eq!(
        (
            mismatch["payment_id"].as_str(),
            mismatch["amount_disputed"].as_str(),
            mismatch["ledger_disputed"].as_str()
        ),
        (Some(payment_id.as_str()), Some("0.00"), Some("48.48"))
    );
    let order = &report["report"]["order_violations"][0];
    assert_eq!((order["net"].as_str(), order["taken"].as_str()), (Some("0.00"), Some("48.48")), "{report}");
}
}

/// The provider's dispute `id` as the mock's contract shows it (`GET /_admin/disputes/{id}`, on
/// either wire).
async fn provider_dispute(app: &TestApp, id: &str) -> Value {
    let response =
        app.client.get(format!("{}/_admin/disputes/{id}", app.provider.address)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    json(response).await
}

/// Our id of the dispute the provider calls `provider_id`.
async fn our_dispute_id(app: &TestApp, provider_id: &str) -> String {
    app.text(&format!("SELECT id::text AS text FROM disputes WHERE provider_dispute_id = '{provider_id}'"))
        .await
}

/// `POST /disputes/{id}/evidence` with `evidence`, under `key`.
async fn submit_evidence(app: &TestApp, dispute_id: &str, evidence: &str, key: &str) -> reqwest::Response {
    app.request(Method::POST, &format!("/disputes/{dispute_id}/evidence"))
        .header("Idempotency-Key", key)
        .json(&json!({ "evidence": evidence }))
        .send()
        .await
        .unwrap()
}

/// `POST /disputes/{id}/accept` under `key`.
async fn accept(app: &TestApp, dispute_id: &str, key: &str) -> reqwest::Response {
    app.request(Method::POST, &format!("/disputes/{dispute_id}/accept"))
        .header("Idempotency-Key", key)
        .send()
        .await
        .unwrap()
}

/// A payment disputed in full, the dispute recorded: (the provider's dispute id, ours).
async fn disputed(app: &TestApp) -> (String, String) {
    let (_, charge_id) = paid(app, "pm_card_ok").await;
    let provider_id = open_dispute(app, &charge_id).await;
    deliver_all(app).await;
    let ours = our_dispute_id(app, &provider_id).await;
    (provider_id, ours)
}

over_both_wires! {
async fn evidence_is_submitted_once_and_its_key_replays_the_first_answer_byte_for_byte(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    let key = new_key();
    let submitted = submit_evidence(&app, &dispute_id, "shipped 2026-11-30, tracking 1Z999", &key).await;
    assert_eq!(submitted.status(), 200);
    let first = submitted.bytes().await.unwrap();
    let dispute: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(dispute["status"], "under_review", "the answer shows the dispute as it is after: {dispute}");
    let replay = submit_evidence(&app, &dispute_id, "shipped 2026-11-30, tracking 1Z999", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first);
    assert_problem(
        submit_evidence(&app, &dispute_id, "another text", &key).await,
        422,
        "idempotency-key-reused",
    )
    .await;
    let at_provider = provider_dispute(&app, &provider_id).await;
    assert_eq!(
        (at_provider["submission_count"].as_u64(), at_provider["evidence"].as_str()),
        (Some(1), Some("shipped 2026-11-30, tracking 1Z999"))
    );
    // Under review: a second answer, with a new key, is refused without a call, and stored.
    let again = new_key();
    let refused =
        assert_problem(submit_evidence(&app, &dispute_id, "more", &again).await, 409, "invalid-state").await;
    assert_eq!(refused["current_state"], "under_review");
    let replayed = submit_evidence(&app, &dispute_id, "more", &again).await;
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(provider_dispute(&app, &provider_id).await["submission_count"], 1);
    assert_eq!(events_of(&app, "dispute.updated").await, 1, "one event for the move to under_review");
}
}

over_both_wires! {
async fn accepting_a_dispute_closes_it_lost_and_the_books_keep_the_money_withdrawn(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    let accepted = json(accept(&app, &dispute_id, &new_key()).await).await;
    assert_eq!(
        (accepted["status"].as_str(), accepted["closed_reason"].as_str()),
        (Some("lost"), Some("accepted"))
    );
    assert_eq!(
        recorded(&app, &provider_id).await,
        ("lost".into(), "48.4800/0.0000".into(), "48.4800".into())
    );
    assert_eq!(events_of(&app, "dispute.closed").await, 1);
    app.assert_books_equal_the_provider().await;
    // Decided: neither answer is taken any more, and neither calls the provider.
    assert_problem(accept(&app, &dispute_id, &new_key()).await, 409, "invalid-state").await;
    assert_problem(submit_evidence(&app, &dispute_id, "late", &new_key()).await, 409, "invalid-state").await;
    assert_eq!(provider_dispute(&app, &provider_id).await["submission_count"], 0);
    let won = {
        let (won_provider, won_ours) = disputed(&app).await;
        decide(&app, &won_provider, "won").await;
        deliver_all(&app).await;
        won_ours
    };
    let refused = assert_problem(accept(&app, &won, &new_key()).await, 409, "invalid-state").await;
    assert_eq!(refused["current_state"], "won");
}
}

over_both_wires! {
async fn evidence_after_its_due_date_is_refused_without_a_call_and_bad_input_stores_nothing(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    app.execute(&format!(
        "UPDATE disputes SET evidence_due_by = now() - interval '1 minute' WHERE id = '{dispute_id}'"
    ))
    .await;
    let key = new_key();
    let late =
        assert_problem(submit_evidence(&app, &dispute_id, "too late", &key).await, 422, "evidence-past-due")
            .await;
    assert_eq!(late["dispute_id"], dispute_id.as_str());
    assert_eq!(
        submit_evidence(&app, &dispute_id, "too late", &key).await.headers()["idempotent-replayed"],
        "true"
    );
    assert_eq!(provider_dispute(&app, &provider_id).await["submission_count"], 0);

    for body in [
        json!({ "evidence": "  " }),
        json!({ "evidence": 7 }),
        json!({ "evidence": "x", "extra": 1 }),
        json!({}),
    ] {
        let response = app
            .request(Method::POST, &format!("/disputes/{dispute_id}/evidence"))
            .header("Idempotency-Key", new_key())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_problem(response, 422, "validation-failed").await;
    }
    let missing_key =
        app.request(Method::POST, &format!("/disputes/{dispute_id}/accept")).send().await.unwrap();
    assert_problem(missing_key, 400, "idempotency-key-missing").await;
    let unknown = uuid::Uuid::now_v7();
    assert_problem(accept(&app, &unknown.to_string(), &new_key()).await, 404, "not-found").await;
    assert_eq!(app.count("SELECT count(*) AS count FROM dispute_responses").await, 0, "nothing stored");
}
}

over_both_wires! {
async fn racing_copies_of_one_answer_and_two_answers_at_once_reach_the_provider_once(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    let key = new_key();
    let copies =
        futures::future::join_all((0..6).map(|_| submit_evidence(&app, &dispute_id, "receipt 42", &key)))
            .await;
    let statuses: Vec<u16> = copies.iter().map(|response| response.status().as_u16()).collect();
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(statuses.iter().all(|status| [200, 409].contains(status)), "{statuses:?}");
    assert_eq!(provider_dispute(&app, &provider_id).await["submission_count"], 1);

    // Two different answers to another dispute at once: one is taken, the other refused.
    let (other_provider, other) = disputed(&app).await;
    let (evidence_key, accept_key) = (new_key(), new_key());
    let (evidence, accepted) = tokio::join!(
        submit_evidence(&app, &other, "receipt 43", &evidence_key),
        accept(&app, &other, &accept_key)
    );
    let mut answers = [evidence.status().as_u16(), accepted.status().as_u16()];
    answers.sort_unstable();
    assert_eq!(answers, [200, 409], "one answer taken, the other refused");
    let at_provider = provider_dispute(&app, &other_provider).await;
    let taken = u64::from(at_provider["submission_count"] == 1)
        + u64::from(at_provider["closed_reason"] == "accepted");
    assert_eq!(taken, 1, "{at_provider}");
    assert_eq!(
        app.count("SELECT count(*) AS count FROM dispute_responses WHERE status = 'succeeded'").await,
        2
    );
}
}

over_both_wires! {
async fn evidence_whose_answer_is_lost_is_found_taken_by_the_reconciler_and_not_sent_again(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    app.provider.set_faults(json!({"timeout_rate": 1.0})).await;
    let key = new_key();
    let pending = submit_evidence(&app, &dispute_id, "signed delivery", &key).await;
    assert_eq!(pending.status(), 202);
    assert_eq!(json(pending).await["status"], "needs_response", "our record until the outcome is known");
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.settled, pass.redriven), (1, 0), "found taken, not sent again");
    let replay = submit_evidence(&app, &dispute_id, "signed delivery", &key).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(json(replay).await["status"], "under_review");
    assert_eq!(provider_dispute(&app, &provider_id).await["submission_count"], 1);
}
}

over_both_wires! {
/// An accept whose answer is lost: the mock's contract says the dispute closed as accepted, so
/// the lookup finds it taken; Stripe says only that it is lost, with no evidence (our accept, or
/// a lapse), so the close is sent again with its key and the provider's replay of the close it
/// took says it. Either way the response is taken once and the dispute closed once.
async fn an_accept_whose_answer_is_lost_is_found_taken(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    app.provider.set_faults(json!({"timeout_rate": 1.0})).await;
    let key = new_key();
    assert_eq!(accept(&app, &dispute_id, &key).await.status(), 202);
    app.provider.set_faults(json!({})).await;
    assert_eq!(provider_dispute(&app, &provider_id).await["closed_reason"], "accepted", "it acted");
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    let resent = usize::from(wire == TestWire::Stripe);
    assert_eq!((pass.settled, pass.redriven), (1, resent), "{pass:?}");
    let replay = accept(&app, &dispute_id, &key).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(json(replay).await["status"], "lost");
    let taken = "SELECT count(*) FROM dispute_responses WHERE status = 'succeeded'";
    assert_eq!(app.count(taken).await, 1);
}
}

over_both_wires! {
async fn an_accept_the_provider_never_received_is_sent_again_by_the_reconciler_with_its_key(wire: TestWire) {
    let app = app_on(wire).await;
    let (provider_id, dispute_id) = disputed(&app).await;
    app.provider.set_faults(json!({"error_rate": 1.0})).await;
    let key = new_key();
    assert_eq!(accept(&app, &dispute_id, &key).await.status(), 202);
    app.provider.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let pass = app.reconcile_once().await;
    assert_eq!((pass.settled, pass.redriven), (1, 1), "looked up, not taken, sent again");
    let replay = json(accept(&app, &dispute_id, &key).await).await;
    assert_eq!(
        (replay["status"].as_str(), replay["closed_reason"].as_str()),
        (Some("lost"), Some("accepted"))
    );
    assert_eq!(provider_dispute(&app, &provider_id).await["closed_reason"], "accepted");
    app.assert_books_equal_the_provider().await;
}
}

#[tokio::test]
async fn a_dispute_of_a_charge_not_yet_ours_holds_the_listing_back_until_it_is_recorded() {
    let app = app().await;
    // The charge is made but its answer is lost: the payment does not know its charge yet.
    app.provider.set_faults(json!({"timeout_rate": 1.0})).await;
    let order = app.create_order().await;
    let pending = json(app.pay(order["id"].as_str().unwrap(), "pm_card_ok", &new_key()).await).await;
    assert_eq!(pending["status"], "processing", "{pending}");
    app.provider.set_faults(json!({})).await;
    let payment_id = pending["id"].as_str().unwrap().to_owned();
    let charge = provider_charge(&app, &payment_id).await;
    let provider_id = open_dispute(&app, charge["id"].as_str().unwrap()).await;
    let opened_at = provider_dispute(&app, &provider_id).await["created_at"].as_str().unwrap().to_owned();
    // Its webhooks are never delivered, and the payment stays unknown through the next pass.
    let hold = "UPDATE payments SET lease_id = gen_random_uuid(), lease_until = now() + interval '1 minute'";
    app.execute(&format!("{hold} WHERE id = '{payment_id}'")).await;
    listing_due(&app).await;
    app.reconcile_once().await;
    assert_eq!(app.count("SELECT count(*) AS count FROM disputes").await, 0, "not ours yet");
    let held_back = format!(
        "SELECT count(*) AS count FROM dispute_listing WHERE created_from <= '{opened_at}'::timestamptz"
    );
    assert_eq!(app.count(&held_back).await, 1, "the next listing starts at the dispute not yet ours");

    app.execute(&format!(
        "UPDATE payments SET lease_id = NULL, lease_until = NULL WHERE id = '{payment_id}'"
    ))
    .await;
    for _ in 0..3 {
        listing_due(&app).await;
        app.reconcile_once().await;
    }
    assert_eq!(recorded(&app, &provider_id).await.0, "needs_response", "recorded once the payment is ours");
    app.assert_books_equal_the_provider().await;
}
