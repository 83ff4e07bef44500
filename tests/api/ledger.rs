//! The books: every money movement in the ledger, in the statement that settles it, listed by
//! `GET /balance_transactions` and checked by `orderpay ledger check`.

use reqwest::Method;
use serde_json::Value;

use crate::helpers::{TestApp, assert_problem, json, new_key, spawn_app};

impl TestApp {
    /// `GET /balance_transactions` with `query` (without its `?`): the page's movements.
    pub async fn balance_transactions(&self, query: &str) -> Vec<Value> {
        let page = self.get_json(&format!("/balance_transactions?{query}")).await;
        page["data"].as_array().cloned().unwrap_or_default()
    }

    /// `orderpay ledger check --json`, whatever its exit: (exit code, the report).
    pub async fn ledger_check(&self) -> (i32, Value) {
        let output = self.cli(&["ledger", "check", "--json"]).await;
        let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!("not JSON ({error}): {}", String::from_utf8_lossy(&output.stdout))
        });
        (output.status.code().unwrap_or(-1), report)
    }
}

/// Runs `sql` with triggers off, as a careless restore or a hand-edit would.
async fn behind_the_ledgers_back(app: &TestApp, sql: &str) {
    let mut conn = app.db().await;
    let batch = format!("BEGIN; SET LOCAL session_replication_role = replica; {sql}; COMMIT");
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, &batch).await.expect(sql);
}

fn types(movements: &[Value]) -> Vec<&str> {
    movements.iter().map(|movement| movement["type"].as_str().unwrap()).collect()
}

/// A charge and two refunds of it are three movements, newest first, each naming what moved the
/// money; the provider's balance moved by what was captured less what was given back; filters
/// and pages work; the check holds.
#[tokio::test]
async fn every_money_movement_is_in_the_ledger_and_listed_newest_first() {
    let app = spawn_app().await;
    let (order_id, payment) = app.paid_order("10.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let first = json(app.refund(payment_id, Some("2.50"), &new_key()).await).await;
    assert_eq!(first["status"], "succeeded");
    let second = json(app.refund(payment_id, Some("1.00"), &new_key()).await).await;

    let movements = app.balance_transactions("").await;
    assert_eq!(types(&movements), ["refund", "refund", "charge_captured"]);
    let [latest, earlier, charge] = &movements[..] else { unreachable!() };
    assert_eq!((latest["amount"].as_str(), latest["net"].as_str()), (Some("1.00"), Some("-1.00")));
    assert_eq!(latest["source"], serde_json::json!({"object": "refund", "id": second["id"]}));
    assert_eq!(earlier["source"]["id"], first["id"]);
    assert_eq!((charge["amount"].as_str(), charge["currency"].as_str()), (Some("10.00"), Some("USD")));
    assert_eq!(
        (charge["debit"].as_str(), charge["credit"].as_str()),
        (Some("provider_balance"), Some("customer_payments"))
    );
    assert_eq!(charge["source"], serde_json::json!({"object": "payment", "id": payment_id}));
    assert_eq!(charge["order_id"], order_id.as_str());
    let net: rust_decimal::Decimal = movements
        .iter()
        .map(|movement| movement["net"].as_str().unwrap().parse::<rust_decimal::Decimal>().unwrap())
        .sum();
    assert_eq!(net.to_string(), "6.50", "captured 10.00, given back 3.50");

    assert_eq!(types(&app.balance_transactions("type=charge_captured").await), ["charge_captured"]);
    assert_eq!(app.balance_transactions(&format!("payment_id={payment_id}")).await.len(), 3);
    assert_eq!(app.balance_transactions(&format!("order_id={order_id}&type=refund")).await.len(), 2);
    let page = app.get_json("/balance_transactions?limit=1").await;
    assert_eq!(
        (page["data"][0]["id"].clone(), page["has_more"].clone()),
        (latest["id"].clone(), Value::Bool(true))
    );
    let next =
        app.balance_transactions(&format!("limit=2&starting_after={}", latest["id"].as_str().unwrap())).await;
    assert_eq!(next, movements[1..]);

    let (exit, report) = app.ledger_check().await;
    assert_eq!((exit, &report["holds"]), (0, &Value::Bool(true)), "{report}");
    assert_eq!(report["report"]["movements"], 3);
}

/// Another account sees none of them.
#[tokio::test]
async fn balance_transactions_are_the_accounts_own() {
    let app = spawn_app().await;
    app.paid_order("10.00", "pm_card_ok").await;
    let (_, other_key) = app.create_account("other").await;
    let page = app.client.get(app.url("/balance_transactions")).bearer_auth(other_key).send().await.unwrap();
    assert_eq!(json(page).await["data"], serde_json::json!([]));
}

/// A declined payment and a failed refund move no money and write nothing; a settle that
/// changes nothing writes nothing, and a movement is written once per operation and type even
/// when its status is moved away and back.
#[tokio::test]
async fn a_settle_that_moves_no_money_writes_no_movement() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let declined = app.pay(order["id"].as_str().unwrap(), "pm_card_declined", &new_key()).await;
    assert_eq!(declined.status(), 402);
    let (_, payment) = app.paid_order("10.00", "pm_refund_declined").await;
    let payment_id = payment["id"].as_str().unwrap();
    let refused = app.refund(payment_id, None, &new_key()).await;
    assert_eq!(refused.status(), 402, "the provider declined the refund");
    assert_eq!(types(&app.balance_transactions("").await), ["charge_captured"]);

    let (_, refunded) = app.paid_order("3.00", "pm_card_ok").await;
    let refund = json(app.refund(refunded["id"].as_str().unwrap(), None, &new_key()).await).await;
    let id = refund["id"].as_str().unwrap();
    app.execute(&format!("UPDATE refunds SET updated_at = now() WHERE id = '{id}'")).await;
    app.execute(&format!("UPDATE refunds SET status = 'succeeded' WHERE id = '{id}'")).await;
    let movements = app
        .count(&format!("SELECT count(*) AS count FROM ledger_movements WHERE operation_id = '{id}'"))
        .await;
    assert_eq!(movements, 1, "a row written again without a change of its money writes nothing");
}

/// The provider may move the same money back and forth: a refund reversed, found carried out
/// after all, reversed again. Each change is a movement of its own (the how-manieth of its type
/// for the refund), none lost to the one before.
#[tokio::test]
async fn money_moved_back_and_forth_is_a_movement_each_time() {
    let app = spawn_app().await;
    let (_, payment) = app.paid_order("3.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    let refund = json(app.refund(payment_id, None, &new_key()).await).await;
    let id = refund["id"].as_str().unwrap();
    for (status, refunded) in [("failed", "0"), ("succeeded", "3.00"), ("failed", "0")] {
        let mut conn = app.db().await;
        let change = format!(
            "BEGIN; UPDATE refunds SET status = '{status}', updated_at = clock_timestamp() WHERE id = '{id}'; \
             UPDATE payments SET amount_refunded = {refunded} WHERE id = '{payment_id}'; COMMIT"
        );
        diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, &change).await.expect(&change);
        // Movements are ordered by time to the millisecond, as the statements that settle write them.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let movements = app.balance_transactions(&format!("payment_id={payment_id}")).await;
    assert_eq!(
        types(&movements),
        ["refund_reversal", "refund_correction", "refund_reversal", "refund", "charge_captured"]
    );
    let (exit, report) = app.ledger_check().await;
    assert_eq!(exit, 0, "the ledger follows every change: {report}");
}

/// Movements are never changed or deleted: a correction is a new movement.
#[tokio::test]
async fn movements_are_immutable() {
    let app = spawn_app().await;
    app.paid_order("10.00", "pm_card_ok").await;
    let mut conn = app.db().await;
    for statement in ["UPDATE ledger_movements SET amount = 1", "DELETE FROM ledger_movements"] {
        let refused = diesel_async::RunQueryDsl::execute(diesel::sql_query(statement), &mut conn).await;
        let error = refused.expect_err(statement).to_string();
        assert!(error.contains("immutable"), "{statement}: {error}");
    }
    assert_eq!(app.count("SELECT count(*) AS count FROM ledger_movements").await, 1);
}

/// Money columns moved behind the ledger's back (triggers off, as a careless restore or a
/// hand-edit would) are found: the check exits 1 and names the payment and its order.
#[tokio::test]
async fn the_check_finds_books_that_left_the_ledger() {
    let app = spawn_app().await;
    let (order_id, payment) = app.paid_order("10.00", "pm_card_ok").await;
    let payment_id = payment["id"].as_str().unwrap();
    behind_the_ledgers_back(
        &app,
        &format!("UPDATE payments SET amount_refunded = 4.00 WHERE id = '{payment_id}'"),
    )
    .await;
    let (exit, report) = app.ledger_check().await;
    assert_eq!((exit, &report["holds"]), (1, &Value::Bool(false)), "{report}");
    let mismatches = &report["report"]["payment_mismatches"];
    assert_eq!(mismatches[0]["payment_id"], payment_id);
    assert_eq!(
        (mismatches[0]["amount_refunded"].as_str(), mismatches[0]["ledger_refunded"].as_str()),
        (Some("4.00"), Some("0.00"))
    );

    // A late charge hidden under the order's total: the payment is refunded in full, and a
    // charge left unrefunded (no refund of it in flight) is the customer's money all the same.
    behind_the_ledgers_back(
        &app,
        &format!("UPDATE payments SET amount_refunded = 0 WHERE id = '{payment_id}'"),
    )
    .await;
    assert_eq!(app.refund(payment_id, None, &new_key()).await.status(), 201);
    app.execute(&format!(
        "INSERT INTO ledger_movements (account_id, id, type, operation_id, payment_id, order_id, \
             debit_account, credit_account, amount, currency, created_at) \
         SELECT account_id, gen_random_uuid(), 'late_charge', id, id, order_id, 'provider_balance', \
             'late_charges', 5.00, currency, now() FROM payments WHERE id = '{payment_id}'"
    ))
    .await;
    let (exit, report) = app.ledger_check().await;
    assert_eq!(exit, 1, "{report}");
    let order = &report["report"]["order_violations"][0];
    assert_eq!(order["order_id"], order_id.as_str());
    assert_eq!(
        (order["kept"].as_str(), order["late_charges_unrefunded"].as_str()),
        (Some("0.00"), Some("5.00"))
    );
}

/// Each order is judged by what the provider keeps for it, with its payments' columns and the
/// ledger in agreement: never more than the order's total (here a payment grown past it, as a
/// second capture of the same order would), and nothing at all when every payment of it failed.
#[tokio::test]
async fn the_check_judges_each_order_by_what_the_provider_keeps() {
    let app = spawn_app().await;
    let (over_total, paid) = app.paid_order("10.00", "pm_card_ok").await;
    let paid_id = paid["id"].as_str().unwrap();
    let failed_order = app.create_order().await;
    let all_failed = failed_order["id"].as_str().unwrap();
    let declined = app.pay(all_failed, "pm_card_declined", &new_key()).await;
    assert_eq!(declined.status(), 402);
    let failed_id =
        app.text(&format!("SELECT id::text AS text FROM payments WHERE order_id = '{all_failed}'")).await;
    assert_eq!(app.ledger_check().await.0, 0, "the books hold before");

    // With the triggers on: each change writes its movement, so no payment disagrees with the
    // ledger and only the orders' rules are broken.
    app.execute(&format!(
        "UPDATE payments SET amount = 15.00, amount_captured = 15.00 WHERE id = '{paid_id}'"
    ))
    .await;
    app.execute(&format!("UPDATE payments SET amount_captured = 3.00 WHERE id = '{failed_id}'")).await;
    let (exit, report) = app.ledger_check().await;
    assert_eq!((exit, &report["holds"]), (1, &Value::Bool(false)), "{report}");
    assert_eq!(report["report"]["payment_mismatches"], Value::Array(vec![]), "{report}");
    let violations = report["report"]["order_violations"].as_array().unwrap();
    let kept_of = |order_id: &str| {
        let found = violations.iter().find(|order| order["order_id"] == order_id);
        found.and_then(|order| order["kept"].as_str())
    };
    assert_eq!(kept_of(&over_total), Some("15.00"), "{report}");
    assert_eq!(kept_of(all_failed), Some("3.00"), "{report}");
    assert_eq!(violations.len(), 2, "{report}");
}

/// Bad filters are refused with a stable type; nothing else is listed.
#[tokio::test]
async fn bad_filters_are_refused() {
    let app = spawn_app().await;
    for query in
        ["type=chargeback", "payment_id=nope", "order_id=1", "limit=0", "starting_after=x", "colour=red"]
    {
        let response =
            app.request(Method::GET, &format!("/balance_transactions?{query}")).send().await.unwrap();
        assert_problem(response, 400, "invalid-parameter").await;
    }
}
