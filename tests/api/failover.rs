//! Losing the database's primary under load (`make chaos`). A private cluster (cluster.rs): a
//! primary and a synchronous standby; the service connects with the failover URL
//! (`postgres://…@127.0.0.1:P1,127.0.0.1:P2/…?target_session_attrs=read-write`). Clients create
//! keyed orders and pay them, retrying with the same key on 503, 409 in-use and lost
//! connections, as clients are told to. Then the primary is killed (SIGKILL) or frozen
//! (SIGSTOP, the kernel still ACKing) and the standby promoted.
//!
//! What must hold: every order and payment acknowledged (201) before, during and after is on the
//! new primary; one order per key; one charge per paid order at the provider; nothing left
//! processing after a reconciler pass; no 500, and no request left hanging.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::helpers::{TestApp, new_key, order_body, spawn_app_on_database};

/// What the clients saw.
#[derive(Default)]
struct Tally {
    /// (key, order id) of every order answered 201.
    orders: Vec<(String, String)>,
    /// (order id, payment id) of every payment answered 201.
    payments: Vec<(String, String)>,
    /// When each 201 arrived.
    acknowledged_at: Vec<Instant>,
    /// Answers that were retried, by kind ("503", "409 idempotency-key-in-use", "no answer").
    retried: BTreeMap<String, usize>,
    /// 500s, unexpected answers, hangs, keys given up on: any of them fails the test.
    failures: Vec<String>,
    /// The slowest answer, in milliseconds (a figure for the report, not an assertion).
    slowest_ms: u128,
}

type Shared = Arc<Mutex<Tally>>;

fn tally(shared: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sends one keyed POST until it gets its final answer; returns the key and the answer, or
/// `None` if it never comes.
async fn until_final(
    http: &reqwest::Client,
    (url, api_key): (&str, &str),
    body: &Value,
    shared: &Shared,
    give_up_at: Instant,
) -> Option<(String, Value)> {
    let key = new_key();
    loop {
        if Instant::now() > give_up_at {
            tally(shared).failures.push(format!("gave up on key {key} at {url}"));
            return None;
        }
        let started = Instant::now();
        let sent =
            http.post(url).bearer_auth(api_key).header("Idempotency-Key", &key).json(body).send().await;
        let took = started.elapsed().as_millis();
        let retried = match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response.headers().contains_key("retry-after");
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                let mut seen = tally(shared);
                seen.slowest_ms = seen.slowest_ms.max(took);
                match (status, answer["type"].as_str().unwrap_or_default()) {
                    (201, _) => {
                        seen.acknowledged_at.push(Instant::now());
                        return Some((key, answer));
                    }
                    (503, "service-unavailable") if retry_after => "503".to_owned(),
                    (202, _) => "202 processing".to_owned(),
                    (409, kind @ ("idempotency-key-in-use" | "payment-in-progress")) => format!("409 {kind}"),
                    _ => {
                        seen.failures.push(format!("{status} from {url}: {answer}"));
                        return None;
                    }
                }
            }
            Err(error) if error.is_timeout() => {
                tally(shared).failures.push(format!("no answer within the client's 20 s from {url}: a hang"));
                "no answer".to_owned()
            }
            Err(_) => "no answer".to_owned(),
        };
        *tally(shared).retried.entry(retried).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One client: an order, then its payment, again and again until `stop`.
async fn client(
    address: String,
    api_key: String,
    shared: Shared,
    stop: Arc<AtomicBool>,
    give_up_at: Instant,
) {
    // Far longer than any bound of the service: a request that takes this long hung.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (orders, payments) = (format!("{address}/orders"), format!("{address}/payments"));
    while !stop.load(Ordering::SeqCst) {
        let Some((key, order)) =
            until_final(&http, (&orders, &api_key), &order_body(), &shared, give_up_at).await
        else {
            return;
        };
        let order_id = order["id"].as_str().unwrap_or_default().to_owned();
        tally(&shared).orders.push((key, order_id.clone()));
        let body = json!({ "order_id": order_id, "payment_method": "pm_card_ok" });
        let Some((_, payment)) = until_final(&http, (&payments, &api_key), &body, &shared, give_up_at).await
        else {
            return;
        };
        tally(&shared).payments.push((order_id, payment["id"].as_str().unwrap_or_default().to_owned()));
    }
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Disaster {
    /// SIGKILL to the primary's postmaster.
    Kill,
    /// SIGSTOP to every process of the primary, left stopped.
    Freeze,
}

async fn fail_over(disaster: Disaster) {
    let Some(cluster) = tokio::task::spawn_blocking(Cluster::start).await.unwrap() else { return };
    let cluster = Arc::new(cluster);
    let url = cluster.url("orderpay_failover");
    let app = spawn_app_on_database(&url, |settings, _| {
        settings.database.pool_size = 8;
        settings.database.connect_timeout = Duration::from_millis(500);
        settings.database.statement_timeout = Duration::from_millis(1000);
        settings.database.acquire_timeout = Duration::from_millis(1000);
    })
    .await;

    let shared: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let give_up_at = Instant::now() + Duration::from_secs(75);
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (address, api_key) = (app.address.clone(), app.api_key.clone());
            tokio::spawn(client(address, api_key, shared.clone(), stop.clone(), give_up_at))
        })
        .collect();
    wait_until("orders before the disaster", Duration::from_secs(20), || tally(&shared).orders.len() >= 15)
        .await;

    let struck = Instant::now();
    match disaster {
        Disaster::Kill => cluster.kill(&cluster.primary),
        Disaster::Freeze => cluster.freeze(&cluster.primary),
    }
    // The outage: no writable server until the standby is promoted. Long enough for requests
    // caught mid-statement on a frozen primary to reach their bound.
    tokio::time::sleep(Duration::from_millis(match disaster {
        Disaster::Kill => 1000,
        Disaster::Freeze => 2500,
    }))
    .await;
    let readyz = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let ready = readyz.get(app.url("/readyz")).send().await.expect("/readyz answers during the outage");
    assert_eq!(ready.status(), 503, "not ready without a writable primary");

    let promoting = cluster.clone();
    tokio::task::spawn_blocking(move || promoting.promote(&promoting.standby)).await.unwrap();
    let promoted = Instant::now();
    let acknowledged_after =
        |shared: &Shared| tally(shared).acknowledged_at.iter().filter(|&&at| at > promoted).count();
    wait_until("orders and payments after the promotion", Duration::from_secs(30), || {
        acknowledged_after(&shared) >= 30
    })
    .await;
    let ready = readyz.get(app.url("/readyz")).send().await.expect("/readyz answers");
    assert_eq!(ready.status(), 200, "ready on the new primary");
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    if disaster == Disaster::Freeze {
        // Left stopped until now, like a machine that never comes back.
        cluster.kill(&cluster.primary);
    }

    settle_what_is_left(&app).await;
    let seen = std::mem::take(&mut *tally(&shared));
    assert!(seen.failures.is_empty(), "{} failures: {:#?}", seen.failures.len(), seen.failures);
    verify(&app, &seen).await;
    assert_eq!(cluster.psql(&cluster.standby, "SELECT pg_is_in_recovery()").as_deref(), Some("f"));

    // Writes stop with the disaster and resume on the promoted standby.
    let first_after = seen.acknowledged_at.iter().filter(|&&at| at > promoted).min();
    let downtime = first_after.map_or(0, |at| at.duration_since(struck).as_millis());
    println!(
        "failover ({disaster:?}): {} orders and {} payments acknowledged, all on the promoted standby; \
         promotion done {} ms after the {}, first 201 on the new primary {downtime} ms after it; retried \
         answers {:?}; slowest answer {} ms; TLS {}",
        seen.orders.len(),
        seen.payments.len(),
        promoted.duration_since(struck).as_millis(),
        if disaster == Disaster::Kill { "SIGKILL" } else { "SIGSTOP" },
        seen.retried,
        seen.slowest_ms,
        if cluster.tls { "on (sslmode=require)" } else { "off" },
    );
}

/// Reconciler passes until no payment is processing, as an operator would after an incident.
async fn settle_what_is_left(app: &TestApp) {
    for _ in 0..50 {
        if app.count("SELECT count(*) AS count FROM payments WHERE status = 'processing'").await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        app.reconcile_once().await;
    }
}

async fn verify(app: &TestApp, seen: &Tally) {
    for (_, order_id) in &seen.orders {
        let sql = format!("SELECT count(*) AS count FROM orders WHERE id = '{order_id}'");
        assert_eq!(app.count(&sql).await, 1, "acknowledged order {order_id} is on the new primary");
    }
    // Every key was driven to its 201, so one order per key means as many orders as keys.
    assert_eq!(app.orders_stored().await, seen.orders.len() as i64, "one order per key");
    let paid = app.count("SELECT count(*) AS count FROM orders WHERE status = 'paid'").await;
    assert_eq!(paid, seen.payments.len() as i64, "every acknowledged payment's order is paid, and no other");
    for (order_id, payment_id) in &seen.payments {
        let sql = format!(
            "SELECT count(*) AS count FROM payments WHERE id = '{payment_id}' AND order_id = '{order_id}' \
             AND status = 'succeeded'"
        );
        assert_eq!(app.count(&sql).await, 1, "acknowledged payment {payment_id} is on the new primary");
        let charges = app.provider.charges_for(payment_id).await;
        assert_eq!(charges.len(), 1, "one charge for payment {payment_id}");
        assert_eq!(charges[0]["status"], "succeeded");
    }
    let charges = app.provider.charges().await;
    let succeeded = charges.iter().filter(|charge| charge["status"] == "succeeded").count();
    assert_eq!(succeeded, seen.payments.len(), "one charge per paid order at the provider");
    let processing = app.count("SELECT count(*) AS count FROM payments WHERE status = 'processing'").await;
    assert_eq!(processing, 0, "nothing left processing after the reconciler");
    // The books on the new primary: the ledger written by the same statements as the payments
    // came over with them, and agrees with the provider's money and its records.
    app.assert_books_equal_the_provider().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_fails_over_to_the_synchronous_standby_without_losing_an_acknowledged_write() {
    fail_over(Disaster::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_primary_answers_503_within_the_bounds_and_the_service_recovers_on_the_standby() {
    fail_over(Disaster::Freeze).await;
}
