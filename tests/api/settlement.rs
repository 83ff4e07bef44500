//! Settlement reconciliation: the provider's own records of every money movement held against
//! the ledger, window by window. Each discrepancy the provider can be made to report is found
//! once, in its category; a clean window is all matched; a window run again adds nothing; an
//! exception whose other side arrives later is matched then; one instance runs each window.

use std::time::Duration;

use chrono::{DateTime, Utc};
use orderpay::provider::BalanceQuery;
use orderpay::settlement::{Report, Window};
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, json, new_key, over_both_wires, spawn_app_on_database, spawn_app_on_wire, spawn_app_with,
    wait_until,
};

impl TestApp {
    /// The provider's movements of `window`, newest first, read through the app's own provider
    /// client (so on either wire), as the mock's contract spells them.
    async fn provider_movements(&self, window: Window) -> Vec<Value> {
        let provider = orderpay::app::provider(&self.settings.provider).unwrap();
        let mut all = Vec::new();
        let mut starting_after: Option<String> = None;
        loop {
            let query = BalanceQuery {
                created_gte: window.start,
                created_lt: window.end,
                limit: 100,
                starting_after: starting_after.take(),
            };
            let page = provider.list_balance_transactions(&query).await.unwrap();
            starting_after = page.transactions.last().map(|last| last.id.clone());
            all.extend(page.transactions.into_iter().map(|movement| {
                json!({
                    "id": movement.id,
                    "amount": movement.amount.to_string(),
                    "currency": movement.currency,
                    "reporting_category": movement.category,
                    "source": movement.source,
                    "source_idempotency_key": movement.source_key,
                })
            }));
            if !page.has_more {
                return all;
            }
        }
    }

    /// `POST /_admin/balance_transactions`: the provider reports a movement nothing made.
    async fn inject_movement(&self, movement: Value) -> Value {
        let url = format!("{}/_admin/balance_transactions", self.provider.address);
        let response = self.provider.client.post(url).json(&movement).send().await.unwrap();
        assert_eq!(response.status(), 201);
        json(response).await
    }

    /// `DELETE /_admin/balance_transactions/{id}`: the provider stops reporting a movement.
    async fn hide_movement(&self, id: &str) {
        let url = format!("{}/_admin/balance_transactions/{id}", self.provider.address);
        assert_eq!(self.provider.client.delete(url).send().await.unwrap().status(), 204);
    }

    /// The provider's movement for the charge of `payment_id`.
    async fn charge_movement(&self, window: Window, payment_id: &str) -> Value {
        let key = format!("orderpay_pay_{payment_id}");
        self.provider_movements(window)
            .await
            .into_iter()
            .find(|movement| {
                movement["source_idempotency_key"] == key.as_str()
                    && movement["reporting_category"] == "charge"
            })
            .unwrap_or_else(|| panic!("the provider reports the charge of {payment_id}"))
    }
}

/// From a second before now to a minute after: every movement a test makes falls inside.
fn window_from_now() -> Window {
    let now = Utc::now();
    Window { start: now - chrono::Duration::seconds(1), end: now + chrono::Duration::minutes(1) }
}

fn count(report: &Report, category: &str) -> i64 {
    report.categories[category].count
}

fn decimal(value: &Value) -> rust_decimal::Decimal {
    value.as_str().unwrap().parse().unwrap()
}

over_both_wires! {
/// Charges, a partial and a full refund, an authorization captured for less: every movement on
/// both sides matched, the totals equal, and the sum of the provider's own records is the
/// bucket's.
async fn a_clean_window_matches_every_movement_on_both_sides(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let window = window_from_now();
    let (_, paid) = app.paid_order("25.00", "pm_card_ok").await;
    let (_, refunded) = app.paid_order("40.00", "pm_card_ok").await;
    let refunded_id = refunded["id"].as_str().unwrap();
    assert_eq!(app.refund(refunded_id, Some("15.00"), &new_key()).await.status(), 201);
    assert_eq!(app.refund(refunded_id, None, &new_key()).await.status(), 201);
    let (_, authorized) = app.authorized_order("30.00", "pm_card_ok").await;
    let captured = app.capture(authorized["id"].as_str().unwrap(), Some("1.00"), &new_key()).await;
    assert_eq!(captured.status(), 200);

    let report = app.settle(window).await;
    let provider = app.provider_movements(window).await;
    assert_eq!(provider.len(), 5, "three charges and two refunds at the provider: {provider:#?}");
    assert_eq!(count(&report, "matched"), 5, "{report:#?}");
    assert_eq!(report.exceptions(), 0, "{report:#?}");
    let provider_sum: rust_decimal::Decimal =
        provider.iter().map(|movement| decimal(&movement["amount"])).sum();
    assert_eq!(report.provider_total["USD"], provider_sum);
    assert_eq!(report.ours_total["USD"], provider_sum, "our side sums to the same");
    assert_eq!(provider_sum, "26.00".parse().unwrap(), "25 + 40 - 40 + 1");
    assert_eq!(report.provider_read, 5);
    assert!(paid["id"].is_string());

    // Run again: nothing new, the same counts.
    let again = app.settle(window).await;
    assert_eq!(again.items_written, 0);
    assert_eq!(again.categories, report.categories);
    assert_eq!(app.count("SELECT count(*) FROM settlement_items").await, 5);
}
}

over_both_wires! {
/// One discrepancy of each kind, made at the provider on purpose: each found once, in its
/// category, with both sides as they are; the buckets' totals add up to each side's; a run
/// again creates no new exception; the gauge counts them and an operator acknowledges one.
async fn every_discrepancy_lands_once_in_its_category(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let window = window_from_now();
    app.paid_order("10.00", "pm_card_ok").await;
    let (_, unreported) = app.paid_order("11.00", "pm_card_ok").await;
    let (_, misstated) = app.paid_order("12.00", "pm_card_ok").await;
    let (_, in_euros) = app.paid_order("13.00", "pm_card_ok").await;
    let (_, reported_twice) = app.paid_order("14.00", "pm_card_ok").await;
    let order = app.create_order().await;
    assert_eq!(app.pay(order["id"].as_str().unwrap(), "pm_card_declined", &new_key()).await.status(), 402);
    let declined =
        json!({"id": app.text("SELECT id::text AS text FROM payments WHERE status = 'failed'").await});
    let id = |payment: &Value| payment["id"].as_str().unwrap().to_owned();

    let hidden = app.charge_movement(window, &id(&unreported)).await;
    app.hide_movement(hidden["id"].as_str().unwrap()).await;
    for (payment, amount, currency) in [(&misstated, "12.01", "USD"), (&in_euros, "13.00", "EUR")] {
        let real = app.charge_movement(window, &id(payment)).await;
        app.hide_movement(real["id"].as_str().unwrap()).await;
        app.inject_movement(json!({
            "reporting_category": "charge", "amount": amount, "currency": currency,
            "source": real["source"], "source_idempotency_key": real["source_idempotency_key"],
        }))
        .await;
    }
    let copy = app.charge_movement(window, &id(&reported_twice)).await;
    app.inject_movement(json!({
        "reporting_category": "charge", "amount": copy["amount"], "currency": "USD",
        "source": copy["source"], "source_idempotency_key": copy["source_idempotency_key"],
    }))
    .await;
    // Money the provider says it took for a payment we hold as declined.
    app.inject_movement(json!({
        "reporting_category": "charge", "amount": "5.00", "currency": "USD",
        "source_idempotency_key": format!("orderpay_pay_{}", id(&declined)),
    }))
    .await;
    // Money for nothing of ours: no key, and a key naming no payment we know.
    app.inject_movement(json!({"reporting_category": "charge", "amount": "7.00", "currency": "USD"})).await;
    app.inject_movement(json!({
        "reporting_category": "charge", "amount": "8.00", "currency": "USD",
        "source_idempotency_key": format!("orderpay_pay_{}", uuid::Uuid::now_v7()),
    }))
    .await;

    let report = app.settle(window).await;
    let expected = [
        ("matched", 2),
        ("missing_provider", 1),
        ("amount_mismatch", 1),
        ("currency_mismatch", 1),
        ("duplicate_provider", 1),
        ("status_mismatch", 1),
        ("missing_ours", 2),
    ];
    for (category, n) in expected {
        assert_eq!(count(&report, category), n, "{category}: {report:#?}");
    }
    assert_eq!(report.exceptions(), 7);
    // Each side's total is the sum of its buckets, and the provider's is what it reports.
    let provider_sum: rust_decimal::Decimal =
        app.provider_movements(window).await.iter().map(|movement| decimal(&movement["amount"])).sum();
    let usd = |sums: &std::collections::BTreeMap<String, rust_decimal::Decimal>| {
        sums.get("USD").copied().unwrap_or_default()
    };
    let buckets_provider: rust_decimal::Decimal =
        report.categories.values().map(|bucket| usd(&bucket.provider)).sum::<rust_decimal::Decimal>()
            + report
                .categories
                .values()
                .filter_map(|bucket| bucket.provider.get("EUR"))
                .sum::<rust_decimal::Decimal>();
    assert_eq!(buckets_provider, provider_sum);
    assert_eq!(report.provider_total.values().copied().sum::<rust_decimal::Decimal>(), provider_sum);
    // Ours: the five captured payments, each once.
    assert_eq!(usd(&report.ours_total), "60.00".parse().unwrap(), "10 + 11 + 12 + 13 + 14");

    let exceptions = app.cli_json(&["settlement", "exceptions"]).await;
    let exceptions = exceptions.as_array().unwrap();
    assert_eq!(exceptions.len(), 7);
    let of = |category: &str| -> Vec<&Value> {
        exceptions.iter().filter(|exception| exception["category"] == category).collect()
    };
    let mismatch = of("amount_mismatch")[0];
    assert_eq!(mismatch["object_id"], misstated["id"]);
    assert_eq!(
        (mismatch["provider"]["amount"].as_str(), mismatch["ours"]["amount"].as_str()),
        (Some("12.01"), Some("12.00"))
    );
    assert_eq!(of("missing_provider")[0]["object_id"], unreported["id"]);
    assert_eq!(of("status_mismatch")[0]["ours"]["status"], "failed");
    assert_eq!(of("duplicate_provider")[0]["object_id"], reported_twice["id"]);
    assert_eq!(of("currency_mismatch")[0]["provider"]["currency"], "EUR");

    let again = app.settle(window).await;
    assert_eq!(again.items_written, 0, "a run again adds nothing");
    assert_eq!(again.categories, report.categories);
    assert_eq!(app.count("SELECT count(*) FROM settlement_items WHERE category <> 'matched'").await, 7);

    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"orderpay_settlement_exceptions{category="missing_ours"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"orderpay_settlement_exceptions{category="amount_mismatch"} 1"#));

    let id = mismatch["id"].as_str().unwrap();
    app.cli_ok(&["settlement", "resolve", id, "--note", "the provider corrected it in its next report"])
        .await;
    assert_eq!(app.cli_json(&["settlement", "exceptions"]).await.as_array().unwrap().len(), 6);
    let refused = app.cli(&["settlement", "resolve", id, "--note", "twice"]).await;
    assert!(!refused.status.success(), "an exception is acknowledged once");
    assert_eq!(app.settle(window).await.exceptions(), 6);
}
}

over_both_wires! {
/// A charge the provider settled before we knew (a pending charge): the window run before the
/// reconciler looked finds money for a payment we hold in flight (`status_mismatch`); once the
/// reconciler settles it, a run again matches the two and settles the exception as matched
/// later. `orderpay settlement run` exits 1 while exceptions are open, 0 after.
async fn an_exception_whose_other_side_arrives_later_is_matched_then(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        mock.settle_after = Duration::from_millis(100);
    })
    .await;
    let window = window_from_now();
    let order = app.create_order().await;
    let pending = json(app.pay(order["id"].as_str().unwrap(), "pm_provider_pending", &new_key()).await).await;
    assert_eq!(pending["status"], "processing");
    tokio::time::sleep(Duration::from_millis(150)).await;

    let (from, to) = (window.start.to_rfc3339(), window.end.to_rfc3339());
    let args = ["settlement", "run", "--from", from.as_str(), "--to", to.as_str(), "--json"];
    let first = app.cli(&args).await;
    assert_eq!(first.status.code(), Some(1), "{}", String::from_utf8_lossy(&first.stderr));
    let first: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["categories"]["status_mismatch"]["count"], 1, "{first:#}");

    wait_until("the reconciler settles the payment", Duration::from_secs(10), async || {
        app.reconcile_once().await;
        app.get_payment(pending["id"].as_str().unwrap()).await["status"] == "succeeded"
    })
    .await;
    let second = app.cli(&args).await;
    assert_eq!(second.status.code(), Some(0), "{}", String::from_utf8_lossy(&second.stdout));
    let second: Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(second["categories"]["matched"]["count"], 1, "{second:#}");
    assert_eq!(second["categories"]["status_mismatch"]["count"], 0);
    let settled = app.text("SELECT found_as || ' ' || resolution AS text FROM settlement_items").await;
    assert_eq!(settled, "status_mismatch matched_later");
}
}

/// Two instances with the job on, windows of 300 ms: each window closed while they ran is run
/// once (one scheduled run per window, whichever instance claimed it), and the payments made
/// meanwhile are all matched.
#[tokio::test]
async fn two_instances_run_each_window_once() {
    let on = |settings: &mut orderpay::config::Settings| {
        settings.settlement = Some(orderpay::settlement::job::SettlementConfig {
            interval: Duration::from_millis(300),
            lag: Duration::from_millis(100),
            page_size: 100,
        });
    };
    let first = spawn_app_with(|settings, _| on(settings)).await;
    let provider_url = first.provider.address.clone();
    let second = spawn_app_on_database(&first.database_url, |settings, _| {
        on(settings);
        settings.provider.url = provider_url;
    })
    .await;
    let started = Utc::now();
    for app in [&first, &second, &first] {
        app.paid_order("3.00", "pm_card_ok").await;
    }
    let paid_by: DateTime<Utc> = Utc::now();
    wait_until("a run covers every payment", Duration::from_secs(20), async || {
        first
            .count(&format!(
                "SELECT count(*) FROM settlement_runs WHERE scheduled AND finished_at IS NOT NULL \
                 AND window_end > '{}'",
                paid_by.to_rfc3339()
            ))
            .await
            > 0
    })
    .await;
    let windows = first.count("SELECT count(DISTINCT (window_start, window_end)) FROM settlement_runs").await;
    let runs = first.count("SELECT count(*) FROM settlement_runs").await;
    assert!(windows >= 2, "windows ran: {windows}");
    assert_eq!(runs, windows, "one run per window");
    let matched = first
        .count(&format!(
            "SELECT count(*) FROM settlement_items WHERE category = 'matched' AND provider_created >= '{}'",
            started.to_rfc3339()
        ))
        .await;
    assert_eq!(matched, 3, "each payment matched once");
    assert_eq!(first.count("SELECT count(*) FROM settlement_items WHERE category <> 'matched'").await, 0);
}

over_both_wires! {
/// A refund the provider reverses long after it succeeded, whose webhook never arrives (here:
/// provider webhooks are off): nothing of ours looks at a succeeded refund again, and the ledger
/// check cannot see it (our columns and our ledger agree with each other). Settlement does: the
/// provider's `refund_failure` names a refund we hold as succeeded. It looks the refund up, and
/// on the provider's confirmed word records the reversal, whose movement completes the item.
async fn a_reversal_whose_webhook_was_lost_is_found_and_recorded_by_settlement(wire: TestWire) {
    let app = spawn_app_with(|settings, mock| {
        wire.configure(settings, mock);
        mock.settle_after = Duration::from_millis(100);
    })
    .await;
    let window = window_from_now();
    let (_, payment) = app.paid_order("20.00", "pm_refund_reversed").await;
    let payment_id = payment["id"].as_str().unwrap();
    let refund = json(app.refund(payment_id, Some("5.00"), &new_key()).await).await;
    assert_eq!(refund["status"], "succeeded");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (code, _) = app.ledger_check().await;
    assert_eq!(code, 0, "our books agree with themselves");
    let refund_id = refund["id"].as_str().unwrap();
    let before =
        app.count(&format!("SELECT count(*) FROM settlement_items WHERE object_id = '{refund_id}'")).await;
    assert_eq!(before, 0);

    let report = app.settle(window).await;
    assert_eq!(count(&report, "status_mismatch"), 0, "recorded, not left to a person: {report:#?}");
    assert_eq!(count(&report, "matched"), 3, "the charge, the refund and its reversal: {report:#?}");
    assert_eq!(report.exceptions(), 0, "{report:#?}");
    let item = app
        .count(&format!(
            "SELECT count(*) FROM settlement_items WHERE object_id = '{refund_id}' \
             AND movement_class = 'refund_reversal' AND found_as = 'status_mismatch' \
             AND resolution = 'matched_later' AND ledger_movement_id IS NOT NULL"
        ))
        .await;
    assert_eq!(item, 1, "found as a status mismatch, matched by the recorded reversal");
    let exceptions = app.cli_json(&["settlement", "exceptions"]).await;
    assert_eq!(exceptions, json!([]), "nothing left open");

    let refund = app.get_refund(refund_id).await;
    assert_eq!(refund["status"], "failed", "{refund:#}");
    let payment = app.get_payment(payment_id).await;
    assert_eq!(payment["amount_refunded"], "0.00", "{payment:#}");
    let corrections = app
        .count(&format!(
            "SELECT count(*) FROM payment_events WHERE subject_id = '{refund_id}' \
             AND actor = 'reconciler' AND to_status = 'failed'"
        ))
        .await;
    assert_eq!(corrections, 1, "the correction's transition, once");
    let (code, _) = app.ledger_check().await;
    assert_eq!(code, 0, "the ledger holds the reversal as the payment's columns do");

    // A second run of the window finds nothing new and corrects nothing twice.
    let again = app.settle(window).await;
    assert_eq!(again.items_written, 0, "{again:#?}");
    assert_eq!(again.exceptions(), 0);
}
}

over_both_wires! {
/// An operator's run beside the job's, on the same window at once: each movement is held by
/// one item (both sides unique), whichever run wrote it, and a run after them finds nothing new.
async fn two_runs_of_one_window_at_once_count_each_movement_once(wire: TestWire) {
    let app = spawn_app_on_wire(wire).await;
    let window = window_from_now();
    for _ in 0..12 {
        app.paid_order("2.00", "pm_card_ok").await;
    }
    let (first, second) = tokio::join!(app.settle(window), app.settle(window));
    assert_eq!(first.items_written + second.items_written, 12, "{first:#?} {second:#?}");
    assert_eq!(app.count("SELECT count(*) FROM settlement_items WHERE category = 'matched'").await, 12);
    assert_eq!(app.count("SELECT count(*) FROM settlement_items").await, 12);
    let after = app.settle(window).await;
    assert_eq!((after.items_written, count(&after, "matched"), after.exceptions()), (0, 12, 0));
}
}
