//! `orderpay payments list | show | resolve` against a real database and a real mock provider,
//! in the states each command is for: payments stuck past the reconciler's last attempt,
//! payments in flight, settled ones; and a resolution racing every other driver of a payment.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::Text;
use orderpay::ids::PaymentId;
use orderpay::operations::operator::{self, Refusal, Resolve, Resolved, Target};
use orderpay::provider::delegate::Delegating;
use orderpay::provider::{BoxFuture, Charge, ChargeLookup, PaymentProvider, ProviderError};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::helpers::{TestApp, assert_problem, json, new_key, spawn_app_with};

/// Provider calls time out after 300 ms (the mock holds `pm_provider_timeout` answers 3 s), the
/// reconciler makes 3 checks 20 to 40 ms apart before its last one only looks.
async fn app() -> TestApp {
    spawn_app_with(|settings, _| {
        settings.provider.timeout = Duration::from_millis(300);
        settings.reconciler.max_attempts = 3;
        settings.reconciler.backoff_base = Duration::from_millis(20);
        settings.reconciler.backoff_cap = Duration::from_millis(40);
    })
    .await
}

/// The URL of a provider nobody answers at: a port that was free a moment ago.
fn unreachable_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}")
}

fn unreachable_provider(app: &TestApp) -> Arc<dyn PaymentProvider> {
    let config = orderpay::config::ProviderConfig { url: unreachable_url(), ..app.settings.provider.clone() };
    orderpay::app::provider(&config).unwrap()
}

/// Pays a new order with `payment_method` under a new key; returns (order id, payment id, key)
/// and the answer's status.
async fn pay(app: &TestApp, payment_method: &str) -> (String, String, String, u16) {
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let response = app.pay(&order_id, payment_method, &key).await;
    let status = response.status().as_u16();
    // A payment, or the problem of a declined one, which names it.
    let body = json(response).await;
    let payment_id = body["id"].as_str().or(body["payment_id"].as_str()).expect("a payment id").to_owned();
    (order_id, payment_id, key, status)
}

/// A payment in flight whose charge the provider made: its answer was held past our timeout
/// (202), and nothing has settled it since.
async fn in_flight(app: &TestApp) -> (String, String, String) {
    let (order_id, payment_id, key, status) = pay(app, "pm_provider_timeout").await;
    assert_eq!(status, 202, "the provider held its answer past our timeout");
    assert_eq!(app.provider.charges_for(&payment_id).await[0]["status"], "succeeded");
    (order_id, payment_id, key)
}

/// A stuck payment: in flight, and the reconciler, unable to reach the provider, made every
/// check up to its last one. Passes run until it counts the payment as stuck.
async fn stuck(app: &TestApp) -> (String, String, String) {
    let (order_id, payment_id, key) = in_flight(app).await;
    let provider = unreachable_provider(app);
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.reconcile_once_with(provider.clone()).await.stuck == 0 {
        assert!(Instant::now() < deadline, "the reconciler did not exhaust its attempts in 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.get_payment(&payment_id).await["status"], "processing");
    (order_id, payment_id, key)
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    text: String,
}

/// The rows `sql` selects as one text column each.
async fn texts(app: &TestApp, sql: &str) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    let mut conn = app.db().await;
    let rows: Vec<Row> = diesel::sql_query(sql).load(&mut conn).await.expect(sql);
    rows.into_iter().map(|row| row.text).collect()
}

/// The payment's transitions of its own status (not its refunds'), as `from>to actor detail`.
async fn payment_transitions(app: &TestApp, payment_id: &str) -> Vec<String> {
    texts(
        app,
        &format!(
            "SELECT from_status || '>' || to_status || ' ' || actor || ' ' || coalesce(detail, '') AS text \
             FROM payment_events WHERE payment_id = '{payment_id}' AND subject = 'payment' ORDER BY id"
        ),
    )
    .await
}

/// The types of the events written about the test account, in order.
async fn event_types(app: &TestApp) -> Vec<String> {
    texts(app, "SELECT type AS text FROM events ORDER BY seq").await
}

/// Everything the database holds about a payment and its order, to compare before and after.
async fn snapshot(app: &TestApp, payment_id: &str) -> Vec<String> {
    texts(
        app,
        &format!(
            "SELECT row_to_json(p)::text AS text FROM payments AS p WHERE id = '{payment_id}' \
             UNION ALL SELECT row_to_json(o)::text FROM orders AS o \
                 JOIN payments AS p ON p.order_id = o.id WHERE p.id = '{payment_id}' \
             UNION ALL SELECT count(*)::text FROM payment_events \
             UNION ALL SELECT count(*)::text FROM events \
             UNION ALL SELECT count(*)::text FROM refunds"
        ),
    )
    .await
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The ids of a `--json` listing.
fn ids(listed: &Value) -> Vec<&str> {
    listed.as_array().expect("a JSON array").iter().map(|payment| payment["id"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn payments_list_filters_by_status_account_age_and_limit_and_finds_the_stuck_ones() {
    let app = app().await;
    let (_, succeeded, _, _) = pay(&app, "pm_card_ok").await;
    let (_, declined, _, _) = pay(&app, "pm_card_declined").await;
    let (_, stuck, _) = stuck(&app).await;
    let (_, waiting, _) = in_flight(&app).await;
    let (other_account, other_key) = app.create_account("another shop").await;
    let order = json(app.post_order_as(&other_key, &crate::helpers::order_body(), None).await).await;
    let body = json!({"order_id": order["id"], "payment_method": "pm_card_ok"});
    let response = app.client.post(app.url("/payments")).bearer_auth(&other_key);
    let response = response.header("Idempotency-Key", new_key()).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let others = json(response).await["id"].as_str().unwrap().to_owned();

    // Everything, newest first, as the API renders each payment plus the operator's fields.
    let all = app.cli_json(&["payments", "list"]).await;
    assert_eq!(ids(&all), [others.as_str(), &waiting, &stuck, &declined, &succeeded]);
    for listed in all.as_array().unwrap().iter().skip(1) {
        let id = listed["id"].as_str().unwrap();
        let api = app.get_payment(id).await;
        for (field, value) in api.as_object().unwrap() {
            assert_eq!(&listed[field], value, "{field} of {id} as GET /payments/{{id}} has it");
        }
        assert_eq!(listed["account_id"], app.account_id.to_string());
        for field in [
            "idempotency_key",
            "in_flight",
            "attempts",
            "next_check_at",
            "last_error",
            "lease_until",
            "stuck",
        ] {
            assert!(listed.get(field).is_some(), "{field} missing from {listed}");
        }
    }
    let by_id = |id: &str| all.as_array().unwrap().iter().find(|listed| listed["id"] == id).unwrap().clone();
    let stuck_one = by_id(&stuck);
    assert_eq!(
        (&stuck_one["in_flight"], &stuck_one["stuck"], &stuck_one["attempts"]),
        (&json!("charge"), &json!(true), &json!(3))
    );
    assert!(
        stuck_one["last_error"].as_str().unwrap().contains("could not talk to the provider"),
        "{stuck_one}"
    );
    let waiting_one = by_id(&waiting);
    assert_eq!((&waiting_one["in_flight"], &waiting_one["stuck"]), (&json!("charge"), &json!(false)));
    assert_eq!((&by_id(&succeeded)["in_flight"], &by_id(&succeeded)["stuck"]), (&Value::Null, &json!(false)));

    // Stuck: past the reconciler's last attempt; the payment merely in flight is not.
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--stuck"]).await), [stuck.as_str()]);
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--status", "processing"]).await), [&waiting, &stuck]);
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--status", "failed"]).await), [declined.as_str()]);
    let account = other_account.to_string();
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--account", &account]).await), [others.as_str()]);
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--limit", "2"]).await), [others.as_str(), &waiting]);

    // By age: nothing is an hour old until one payment is made 2 hours old.
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--older-than", "1h"]).await), Vec::<&str>::new());
    app.execute(&format!("UPDATE payments SET created_at = now() - interval '2 hours' WHERE id = '{stuck}'"))
        .await;
    for age in ["1h", "90m", "1h30m"] {
        let listed = app.cli_json(&["payments", "list", "--older-than", age, "--stuck"]).await;
        assert_eq!(ids(&listed), [stuck.as_str()], "--older-than {age}");
    }
    assert_eq!(ids(&app.cli_json(&["payments", "list", "--older-than", "1d"]).await), Vec::<&str>::new());

    let table = app.cli_ok(&["payments", "list", "--stuck"]).await;
    assert!(
        table.starts_with("ID ") && table.contains("IN FLIGHT") && table.contains("LAST ERROR"),
        "{table}"
    );
    assert!(table.lines().any(|line| line.starts_with(&stuck) && line.contains("charge (stuck)")), "{table}");

    for (args, said) in [
        (["payments", "list", "--status", "paid"], "is not a payment status"),
        (["payments", "list", "--older-than", "5x"], "is not a duration"),
        (["payments", "list", "--account", "nobody"], "is not an account id"),
    ] {
        let output = app.cli(&args).await;
        assert!(!output.status.success() && stderr(&output).contains(said), "{args:?}: {}", stderr(&output));
    }
}

#[tokio::test]
async fn payments_show_lists_every_transition_with_its_actor_and_the_providers_live_view() {
    let app = app().await;
    let (_, paid, _, _) = pay(&app, "pm_card_ok").await;
    let refund = app.request(Method::POST, "/refunds").header("Idempotency-Key", new_key());
    let refund = refund.json(&json!({"payment_id": paid, "amount": "10.00"})).send().await.unwrap();
    assert_eq!(refund.status(), 201);
    let refund_id = json(refund).await["id"].as_str().unwrap().to_owned();

    let shown = app.cli_json(&["payments", "show", &paid]).await;
    assert_eq!(shown["id"], paid);
    assert_eq!(shown["status"], "succeeded");
    assert_eq!(shown["amount_refunded"], "10.00");
    assert_eq!(shown["order_status"], "partially_refunded");
    assert_eq!(shown["refunds"].as_array().unwrap().len(), 1);
    assert_eq!(
        (&shown["refunds"][0]["id"], &shown["refunds"][0]["status"]),
        (&json!(refund_id), &json!("succeeded"))
    );
    assert_eq!(shown["refunds"][0]["system"], false);
    let transitions: Vec<(&str, &str, &str, &str)> = shown["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["subject"].as_str().unwrap(),
                t["from"].as_str().unwrap(),
                t["to"].as_str().unwrap(),
                t["actor"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        transitions,
        [("payment", "processing", "succeeded", "request"), ("refund", "processing", "succeeded", "request")]
    );
    assert_eq!(shown["provider"]["lookup"], "found");
    let charge = &shown["provider"]["charge"];
    assert_eq!(
        (&charge["status"], &charge["amount"], &charge["amount_refunded"]),
        (&json!("succeeded"), &shown["amount"], &json!("10.00"))
    );
    assert_eq!(charge["id"], shown["provider_charge_id"]);

    // A stuck payment: what the reconciler saw, and what the provider says now.
    let (_, stuck, key) = stuck(&app).await;
    let shown = app.cli_json(&["payments", "show", &stuck]).await;
    assert_eq!(
        (&shown["status"], &shown["in_flight"], &shown["stuck"]),
        (&json!("processing"), &json!("charge"), &json!(true))
    );
    assert_eq!(shown["idempotency_key"], key);
    assert_eq!(shown["transitions"], json!([]), "nothing has moved it");
    assert_eq!(
        (&shown["provider"]["lookup"], &shown["provider"]["charge"]["status"]),
        (&json!("found"), &json!("succeeded"))
    );
    let text = app.cli_ok(&["payments", "show", &stuck]).await;
    assert!(
        text.lines().any(|line| line.starts_with("in flight") && line.ends_with("charge (stuck)")),
        "{text}"
    );
    assert!(text.lines().any(|line| line.starts_with("provider") && line.contains("succeeded")), "{text}");
    for section in ["\nrefunds:\nnone", "\ncaptures and voids:\nnone", "\ntransitions:\nnone"] {
        assert!(text.contains(section), "{section:?} in {text}");
    }
    let text = app.cli_ok(&["payments", "show", &paid]).await;
    assert!(text.contains("\ntransitions:\nAT ") && text.contains(" request "), "{text}");

    // The provider out of reach: said, and the rest still shown.
    let dead = unreachable_url();
    let output =
        app.cli_with(&["payments", "show", &stuck, "--json"], &[("ORDERPAY_PROVIDER_URL", &dead)]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let shown: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(shown["provider"]["lookup"], "unavailable");
    assert!(
        shown["provider"]["error"].as_str().unwrap().contains("could not talk to the provider"),
        "{shown}"
    );
    let output = app.cli_with(&["payments", "show", &stuck], &[("ORDERPAY_PROVIDER_URL", &dead)]).await;
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.lines().any(|line| line.starts_with("provider") && line.contains("cannot be asked")),
        "{text}"
    );

    let missing = app.cli(&["payments", "show", &PaymentId::generate().to_string()]).await;
    assert!(!missing.status.success() && stderr(&missing).contains("no payment"), "{}", stderr(&missing));
}

#[tokio::test]
async fn a_resolution_the_provider_does_not_confirm_is_refused_and_changes_nothing() {
    let app = app().await;
    // The provider holds a succeeded charge: `failed` would keep money against a failed payment.
    let (_, charged, _) = stuck(&app).await;
    let before = snapshot(&app, &charged).await;
    let output =
        app.cli(&["payments", "resolve", &charged, "--as", "failed", "--reason", "customer called"]).await;
    assert!(!output.status.success());
    let said = stderr(&output);
    assert!(
        said.contains("does not agree with --as failed") && said.contains("is succeeded and holds"),
        "{said}"
    );
    assert!(said.contains("--force") && said.contains("takes that money back"), "{said}");
    assert_eq!(snapshot(&app, &charged).await, before, "nothing changed");
    assert!(app.provider.refunds().await.is_empty());

    // The provider never received this one (503 without charging): `succeeded` would be a guess.
    let (_, never, _, status) = pay(&app, "pm_provider_down").await;
    assert_eq!(status, 202);
    let before = snapshot(&app, &never).await;
    let output =
        app.cli(&["payments", "resolve", &never, "--as", "succeeded", "--reason", "looks fine"]).await;
    assert!(!output.status.success());
    assert!(stderr(&output).contains("the provider has no charge for this payment"), "{}", stderr(&output));
    assert_eq!(snapshot(&app, &never).await, before, "nothing changed");

    // The provider out of reach: no view to agree with, so only --force.
    let dead = unreachable_url();
    let args = ["payments", "resolve", &never, "--as", "failed", "--reason", "provider down"];
    let output = app.cli_with(&args, &[("ORDERPAY_PROVIDER_URL", &dead)]).await;
    assert!(!output.status.success() && stderr(&output).contains("cannot be asked"), "{}", stderr(&output));
    assert_eq!(snapshot(&app, &never).await, before, "nothing changed");

    // Not in flight, not there, no reason: refused too.
    let (_, paid, _, _) = pay(&app, "pm_card_ok").await;
    let before = snapshot(&app, &paid).await;
    for (args, said) in [
        (
            vec!["payments", "resolve", &paid, "--as", "failed", "--reason", "x"],
            "is succeeded: its outcome is known",
        ),
        (vec!["payments", "resolve", &charged, "--as", "succeeded", "--reason", " "], "the reason must be"),
        (
            vec![
                "payments",
                "resolve",
                "0199e3a2-5c1e-7f43-9a2b-6a0c3d2e1f00",
                "--as",
                "failed",
                "--reason",
                "x",
            ],
            "no payment",
        ),
        (vec!["payments", "resolve", &paid, "--as", "paid", "--reason", "x"], "invalid value 'paid'"),
    ] {
        let output = app.cli(&args).await;
        assert!(!output.status.success() && stderr(&output).contains(said), "{args:?}: {}", stderr(&output));
    }
    assert_eq!(snapshot(&app, &paid).await, before, "nothing changed");
    assert_eq!(payment_transitions(&app, &charged).await, Vec::<String>::new());
}

#[tokio::test]
async fn forcing_failed_over_a_charge_the_provider_holds_refunds_it_through_the_system() {
    let app = app().await;
    let (order_id, payment_id, key) = stuck(&app).await;
    let charge = app.provider.charges_for(&payment_id).await.remove(0);
    let events_before = event_types(&app).await.len();
    let reason = "provider support: charge disputed, refund it";

    let args = ["payments", "resolve", &payment_id, "--as", "failed", "--reason", reason, "--force"];
    let output = app.cli(&args).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let said = String::from_utf8(output.stdout).unwrap();
    assert!(said.contains("processing -> failed (actor operator)"), "{said}");
    assert!(said.lines().any(|line| line.starts_with("forced over") && line.contains("holds")), "{said}");
    assert!(
        said.lines().any(|line| line.starts_with("taken back") && line.ends_with("by the system: succeeded")),
        "{said}"
    );

    let payment = app.get_payment(&payment_id).await;
    assert_eq!(
        (&payment["status"], &payment["failure_code"]),
        (&json!("failed"), &json!("resolved_by_operator"))
    );
    assert!(
        !payment["failure_message"].as_str().unwrap().contains(reason),
        "the reason stays with operators"
    );
    assert_eq!(app.order_status(&order_id).await, "pending_payment");
    let refunds = app.provider.refunds().await;
    assert_eq!(refunds.len(), 1, "refunded once at the provider: {refunds:?}");
    assert_eq!(
        (&refunds[0]["status"], &refunds[0]["charge"], &refunds[0]["amount"]),
        (&json!("succeeded"), &charge["id"], &charge["amount"])
    );
    let system_refunds = app
        .count(&format!("SELECT count(*) AS count FROM refunds WHERE payment_id = '{payment_id}' AND idempotency_key IS NULL AND status = 'succeeded'"))
        .await;
    assert_eq!(system_refunds, 1);
    assert_eq!(
        payment_transitions(&app, &payment_id).await[0],
        format!("processing>failed operator {reason}")
    );
    let written = event_types(&app).await.split_off(events_before);
    assert_eq!(written, ["payment.failed", "refund.succeeded", "payment.late_charge_refunded"]);

    // The original request's key replays the final answer.
    let replay = app.pay(&order_id, "pm_provider_timeout", &key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let problem = assert_problem(replay, 402, "payment-failed").await;
    assert_eq!(problem["payment_id"], payment_id);
    // The late-charge watch finds it recorded: nothing is refunded twice.
    app.reconcile_once().await;
    assert_eq!(app.provider.refunds().await.len(), 1);
    let shown = app.cli_json(&["payments", "show", &payment_id]).await;
    assert_eq!(
        (&shown["refunds"][0]["system"], &shown["amount_refunded"]),
        (&json!(true), &charge["amount"])
    );
}

#[tokio::test]
async fn resolving_as_succeeded_what_the_provider_charged_pays_the_order_as_the_operator() {
    let app = app().await;
    let (order_id, payment_id, key) = in_flight(&app).await;
    let events_before = event_types(&app).await.len();
    let args = [
        "payments",
        "resolve",
        &payment_id,
        "--as",
        "succeeded",
        "--reason",
        "ops ticket 7: charge confirmed",
    ];
    let resolved = app.cli_json(&args).await;
    assert_eq!(
        (&resolved["payment"]["status"], &resolved["order_status"]),
        (&json!("succeeded"), &json!("paid"))
    );
    assert_eq!((&resolved["forced_over"], &resolved["taken_back"]), (&Value::Null, &Value::Null));
    assert_eq!(resolved["provider"]["charge"]["status"], "succeeded");

    let payment = app.get_payment(&payment_id).await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount_captured"], payment["amount"]);
    assert_eq!(payment["provider_charge_id"], app.provider.charges_for(&payment_id).await[0]["id"]);
    assert_eq!(app.order_status(&order_id).await, "paid");
    assert_eq!(
        payment_transitions(&app, &payment_id).await,
        ["processing>succeeded operator ops ticket 7: charge confirmed"]
    );
    assert_eq!(event_types(&app).await.split_off(events_before), ["payment.succeeded", "order.paid"]);
    let replay = app.pay(&order_id, "pm_provider_timeout", &key).await;
    assert_eq!(
        (replay.status(), &replay.headers()["idempotent-replayed"]),
        (reqwest::StatusCode::CREATED, &"true".parse().unwrap())
    );
    assert_eq!(json(replay).await, payment);
    assert_eq!(app.provider.charges_for(&payment_id).await.len(), 1, "nothing sent again");

    // A manual-capture payment's authorization: succeeded means waiting for a capture.
    let order = app.create_order().await;
    let body =
        json!({"order_id": order["id"], "payment_method": "pm_provider_timeout", "capture_method": "manual"});
    let accepted = app.pay_with(&body, &new_key()).await;
    assert_eq!(accepted.status(), 202);
    let authorization = json(accepted).await["id"].as_str().unwrap().to_owned();
    let listed = app.cli_json(&["payments", "list", "--status", "processing"]).await;
    assert_eq!(listed[0]["in_flight"], "authorization");
    let args = [
        "payments",
        "resolve",
        &authorization,
        "--as",
        "succeeded",
        "--reason",
        "authorized at the provider",
    ];
    let said = app.cli_ok(&args).await;
    assert!(said.contains("processing -> requires_capture (actor operator)"), "{said}");
    assert_eq!(app.get_payment(&authorization).await["status"], "requires_capture");
    assert_eq!(app.order_status(order["id"].as_str().unwrap()).await, "authorized");
    let capture = app
        .request(Method::POST, &format!("/payments/{authorization}/capture"))
        .header("Idempotency-Key", new_key());
    assert_eq!(capture.send().await.unwrap().status(), 200, "the authorization is captured as any other");
}

/// The provider as the resolution sees it: the real one, with the `pause_at`-th charge lookup
/// held until the test lets it go, so that the test can put other drivers in between.
struct Paused {
    inner: Arc<dyn PaymentProvider>,
    pause_at: usize,
    lookups: AtomicUsize,
    reached: Notify,
    resume: Notify,
}

impl Paused {
    fn new(app: &TestApp, pause_at: usize) -> Arc<Paused> {
        let inner = orderpay::app::provider(&app.settings.provider).unwrap();
        Arc::new(Paused {
            inner,
            pause_at,
            lookups: AtomicUsize::new(0),
            reached: Notify::new(),
            resume: Notify::new(),
        })
    }
}

impl Delegating for Paused {
    fn inner(&self) -> &dyn PaymentProvider {
        &*self.inner
    }

    fn find_charge<'a>(
        &'a self,
        lookup: &'a ChargeLookup,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Charge>, ProviderError>> {
        Box::pin(async move {
            if self.lookups.fetch_add(1, Ordering::SeqCst) + 1 == self.pause_at {
                self.reached.notify_one();
                self.resume.notified().await;
            }
            self.inner.find_charge(lookup, request_id).await
        })
    }
}

/// Starts resolving `payment_id` as succeeded, and returns once its `pause_at`-th lookup is
/// held: resume it with `paused.resume`.
async fn start_resolving(
    app: &TestApp,
    payment_id: &str,
    pause_at: usize,
) -> (Arc<Paused>, JoinHandle<Result<Resolved, Refusal>>) {
    let paused = Paused::new(app, pause_at);
    let engine = app.engine_with(paused.clone());
    let (config, request) = (app.settings.reconciler, resolve_to_succeeded(payment_id));
    let resolving = tokio::spawn(async move { operator::resolve(&engine, &config, &request).await });
    paused.reached.notified().await;
    (paused, resolving)
}

fn resolve_to_succeeded(payment_id: &str) -> Resolve {
    Resolve {
        payment_id: PaymentId::parse(payment_id).unwrap(),
        to: Target::Succeeded,
        reason: "confirmed at the provider".to_owned(),
        force: false,
    }
}

/// Waits until the reconciler's next check of the payment is due (a request leaving it in
/// flight schedules one `recheck_after` later), so that a pass would claim it.
async fn due(app: &TestApp, payment_id: &str) {
    let sql = format!(
        "SELECT count(*) AS count FROM payments WHERE id = '{payment_id}' AND next_check_at <= now() \
         AND lease_until IS NULL"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while app.count(&sql).await == 0 {
        assert!(Instant::now() < deadline, "payment {payment_id} was not due within 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The worst interleavings, put in place on purpose: other drivers act while the resolution is
/// between its steps. Each payment ends with exactly one transition, whoever applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_racing_the_reconciler_a_retry_and_a_webhook_applies_one_transition() {
    let app = app().await;

    // 1. Judged before its lease; the reconciler and a retry settle the payment meanwhile.
    let (order_id, payment_id, key) = in_flight(&app).await;
    due(&app, &payment_id).await;
    let (paused, resolving) = start_resolving(&app, &payment_id, 1).await;
    assert_eq!(app.reconcile_once().await.settled, 1);
    assert_eq!(app.pay(&order_id, "pm_provider_timeout", &key).await.status(), 201);
    paused.resume.notify_one();
    let refused = resolving.await.unwrap();
    assert!(matches!(refused, Err(Refusal::SettledMeanwhile { .. })), "{refused:?}");
    let transitions = payment_transitions(&app, &payment_id).await;
    assert_eq!(transitions.len(), 1, "{transitions:?}");
    assert!(transitions[0].starts_with("processing>succeeded reconciler"), "{transitions:?}");

    // 2. Holding its lease; the reconciler finds nothing to claim and a retry is told to wait.
    let (order_id, payment_id, key) = in_flight(&app).await;
    due(&app, &payment_id).await;
    let (paused, resolving) = start_resolving(&app, &payment_id, 2).await;
    assert_eq!(app.reconcile_once().await.claimed, 0, "leased to the resolution");
    assert_problem(app.pay(&order_id, "pm_provider_timeout", &key).await, 409, "idempotency-key-in-use")
        .await;
    paused.resume.notify_one();
    let resolved = resolving.await.unwrap().expect("the resolution applies");
    assert_eq!(resolved.payment.payment.status.as_str(), "succeeded");
    assert_eq!(app.pay(&order_id, "pm_provider_timeout", &key).await.status(), 201, "the retry replays it");
    assert_eq!(app.reconcile_once().await.settled, 0);
    assert_eq!(
        payment_transitions(&app, &payment_id).await,
        ["processing>succeeded operator confirmed at the provider"]
    );

    // 3. Holding its lease; a webhook (which takes none) settles first: the guarded settle
    // applies nothing for the resolution, and says so.
    let (_, payment_id, _) = in_flight(&app).await;
    let (paused, resolving) = start_resolving(&app, &payment_id, 2).await;
    webhook_settles(&app, &payment_id).await;
    paused.resume.notify_one();
    let refused = resolving.await.unwrap();
    assert!(matches!(refused, Err(Refusal::SettledMeanwhile { .. })), "{refused:?}");
    let transitions = payment_transitions(&app, &payment_id).await;
    assert_eq!(transitions.len(), 1, "{transitions:?}");
    assert!(transitions[0].starts_with("processing>succeeded webhook"), "{transitions:?}");
    assert_eq!(app.provider.charges().await.len(), 3, "one charge per payment");
}

/// What the provider's webhook for the payment's charge does: the charge's own settle, actor
/// `webhook`, with no lease.
async fn webhook_settles(app: &TestApp, payment_id: &str) {
    use orderpay::operations::Kind;
    use orderpay::operations::charge::{ChargeOutcome, Charges};
    let engine = app.engine_with(orderpay::app::provider(&app.settings.provider).unwrap());
    let payment_id = PaymentId::parse(payment_id).unwrap();
    let mut conn = app.db().await;
    let payment = Charges::load(&mut conn, (app.account_id, payment_id.as_uuid())).await.unwrap().unwrap();
    let charge_id =
        app.provider.charges_for(&payment_id.to_string()).await[0]["id"].as_str().unwrap().to_owned();
    let outcome = ChargeOutcome::Captured { charge_id };
    let recorded =
        Charges::settle(&engine.pool, &payment, outcome, orderpay::operations::Actor::Webhook).await;
    assert!(recorded.unwrap().unwrap().applied);
}

/// And all at once, left to the scheduler: a resolution, two reconcilers and a retry of the
/// original request on each of several payments. One transition each, one charge each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resolutions_reconcilers_and_retries_all_at_once_apply_one_transition_per_payment() {
    let app = app().await;
    let config = app.settings.reconciler;
    let mut payments = Vec::new();
    for _ in 0..3 {
        payments.push(in_flight(&app).await);
    }
    let engine = app.engine_with(orderpay::app::provider(&app.settings.provider).unwrap());
    let mut resolutions = Vec::new();
    for (order_id, payment_id, key) in &payments {
        let request = resolve_to_succeeded(payment_id);
        let (resolution, _, _, retry) = tokio::join!(
            operator::resolve(&engine, &config, &request),
            app.reconcile_once(),
            app.reconcile_once(),
            app.pay(order_id, "pm_provider_timeout", key),
        );
        assert!([201, 409].contains(&retry.status().as_u16()), "{}", retry.status());
        resolutions.push(resolution);
    }
    for ((order_id, payment_id, _), resolution) in payments.iter().zip(resolutions) {
        let transitions = payment_transitions(&app, payment_id).await;
        assert_eq!(transitions.len(), 1, "{payment_id}: {transitions:?}");
        assert!(transitions[0].starts_with("processing>succeeded "), "{transitions:?}");
        match resolution {
            Ok(_) => assert!(transitions[0].contains(" operator "), "{transitions:?}"),
            Err(Refusal::SettledMeanwhile { .. } | Refusal::Held { .. } | Refusal::NotInFlight { .. }) => {
                assert!(!transitions[0].contains(" operator "), "{transitions:?}")
            }
            Err(other) => panic!("{payment_id}: {other}"),
        }
        assert_eq!(app.order_status(order_id).await, "paid");
        assert_eq!(app.provider.charges_for(payment_id).await.len(), 1);
    }
}
