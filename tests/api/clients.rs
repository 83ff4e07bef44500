//! The Rust client (`clients/rust`) against the real app and mock provider, and through the
//! fault proxy (`tools/fault-proxy`): the keys it sends, what it retries and what it does not,
//! waiting out a 202, finding a lost payment, verifying merchant webhooks, and the fault run
//! (`make clients-faults` runs it at full size and at the client's defaults and with no retries).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use orderpay_client::{
    Capture, Client, CreateOrder, CreatePayment, CreateRefund, CreateWebhookEndpoint, ErrorKind, EventObject,
    Key, KeyStore, ListParams, MemoryKeyStore, OrderItemRequest, Webhook,
};
use orderpay_fault_proxy::{FaultProxy, Faults};

use crate::helpers::{TestApp, eventually, spawn_app, spawn_app_with, test_webhook_settings};
use crate::webhooks::Receiver;

fn client(address: &str, app: &TestApp) -> orderpay_client::ClientBuilder {
    Client::builder(address, &app.api_key)
}

fn order(intent: &str) -> CreateOrder {
    CreateOrder {
        currency: "USD".into(),
        items: vec![OrderItemRequest { sku: "tee".into(), quantity: 2, unit_price: "19.99".into() }],
        customer_id: None,
        metadata: Some([("intent".to_owned(), intent.to_owned())].into()),
    }
}

fn payment(order_id: &str, method: &str) -> CreatePayment {
    CreatePayment {
        order_id: order_id.into(),
        payment_method: method.into(),
        amount: None,
        capture_method: None,
    }
}

#[tokio::test]
async fn an_intent_keeps_one_key_per_operation_and_a_resumed_call_replays() {
    let app = spawn_app().await;
    let store = Arc::new(MemoryKeyStore::new());
    let client = client(&app.address, &app).key_store(store.clone()).build().unwrap();
    let created = client.create_order(&order("i-1"), Key::intent("i-1")).await.unwrap();
    assert_eq!((created.status, created.replayed, created.attempts), (201, false, 1));
    assert_eq!(created.value.total_amount, "39.98", "money is the exact decimal string");
    let paid =
        client.create_payment(&payment(&created.value.id, "pm_card_ok"), Key::intent("i-1")).await.unwrap();
    assert_eq!(paid.value.status, "succeeded");
    let order_key = store.load("i-1", "createOrder").unwrap().unwrap();
    let pay_key = store.load("i-1", "createPayment").unwrap().unwrap();
    assert_ne!(order_key.key, pay_key.key, "a key is bound to its route: two keys for one intent");
    assert_eq!(created.key.as_deref(), Some(order_key.key.as_str()));
    assert!(order_key.first_sent_at_ms.is_some());

    // The process lost its answers, not its store: the same calls replay.
    let again = client.create_order(&order("i-1"), Key::intent("i-1")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.value.id, created.value.id);
    let again =
        client.create_payment(&payment(&created.value.id, "pm_card_ok"), Key::intent("i-1")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.value.id, paid.value.id);
    assert_eq!(app.orders_stored().await, 1);
    assert_eq!(app.provider.charges().await.len(), 1);
}

#[tokio::test]
async fn a_changed_body_on_a_retried_key_is_the_key_reused_error_and_is_never_retried() {
    let app = spawn_app().await;
    let sends = Arc::new(AtomicU32::new(0));
    let counted = sends.clone();
    let client = client(&app.address, &app)
        .max_retries(10)
        .on_request(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    client.create_order(&order("first"), Key::intent("i-2")).await.unwrap();
    let mut changed = order("first");
    changed.items[0].quantity = 3;
    let error = client.create_order(&changed, Key::intent("i-2")).await.unwrap_err();
    assert!(matches!(error.kind, ErrorKind::KeyReused { .. }), "{error}");
    assert_eq!(error.attempts, 1, "never retried");
    assert_eq!(error.status(), Some(422));
    assert!(error.key.is_some());
    assert_eq!(sends.load(Ordering::SeqCst), 2);
    assert_eq!(app.orders_stored().await, 1);
}

#[tokio::test]
async fn two_concurrent_sends_of_one_intent_converge_on_one_result() {
    let app = spawn_app().await;
    // The provider answers slowly: the second send finds the first at the provider (409 in use)
    // and retries until it replays the first's answer.
    app.provider.set_faults(serde_json::json!({ "latency_ms": 800 })).await;
    let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::new());
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let seen = statuses.clone();
    let one = client(&app.address, &app)
        .key_store(store.clone())
        .on_response(move |attempt| seen.lock().unwrap().push(attempt.status))
        .build()
        .unwrap();
    let two = client(&app.address, &app).key_store(store).build().unwrap();
    let order_id = one.create_order(&order("i-3"), Key::intent("i-3")).await.unwrap().value.id;
    let pay = payment(&order_id, "pm_card_ok");
    let (first, second) = tokio::join!(
        tokio::spawn({
            let (one, pay) = (one.clone(), pay.clone());
            async move { one.pay_and_wait(&pay, Key::intent("i-3")).await }
        }),
        tokio::spawn(async move { two.pay_and_wait(&pay, Key::intent("i-3")).await })
    );
    let (first, second) = (first.unwrap().unwrap(), second.unwrap().unwrap());
    assert_eq!(first.value, second.value, "one result");
    assert_eq!(first.key, second.key, "one key");
    assert_eq!(first.value.status, "succeeded");
    let waited = if first.replayed { &first } else { &second };
    assert!(first.replayed != second.replayed, "one ran, the other replayed it");
    assert!(waited.attempts >= 2, "the other waited for it: {waited:?}");
    assert_eq!(app.payments_stored().await, 1);
    assert_eq!(app.provider.charges().await.len(), 1);
}

#[tokio::test]
async fn pay_and_wait_re_sends_a_202_until_the_final_answer() {
    let app = spawn_app().await;
    let client = client(&app.address, &app).build().unwrap();
    let order_id = client.create_order(&order("i-4"), Key::New).await.unwrap().value.id;
    // A pending charge answers 202; create_payment takes it as a success still processing.
    let pending =
        client.create_payment(&payment(&order_id, "pm_provider_pending"), Key::intent("i-4")).await.unwrap();
    assert!(pending.processing());
    assert_eq!(pending.value.status, "processing");
    // Waiting re-sends the same key: the retry takes the payment over, finds the charge settled.
    let paid =
        client.pay_and_wait(&payment(&order_id, "pm_provider_pending"), Key::intent("i-4")).await.unwrap();
    assert_eq!((paid.status, paid.value.status.as_str()), (201, "succeeded"));
    assert_eq!(paid.value.id, pending.value.id);
    assert_eq!(app.provider.charges().await.len(), 1);

    // A refund the same way, and a manual capture.
    let refund =
        CreateRefund { payment_id: paid.value.id.clone(), amount: Some("10.00".into()), reason: None };
    let refunded = client.refund_and_wait(&refund, Key::New).await.unwrap();
    assert_eq!((refunded.status, refunded.value.status.as_str()), (201, "succeeded"));
    let second = client.create_order(&order("i-5"), Key::New).await.unwrap().value.id;
    let manual = CreatePayment { capture_method: Some("manual".into()), ..payment(&second, "pm_card_ok") };
    let authorized = client.pay_and_wait(&manual, Key::New).await.unwrap().value;
    assert_eq!(authorized.status, "requires_capture");
    let captured = client.capture_and_wait(&authorized.id, &Capture::default(), Key::New).await.unwrap();
    assert_eq!(captured.value.status, "succeeded");
}

#[tokio::test]
async fn a_final_answer_stops_at_once_with_the_key_and_the_problem() {
    let app = spawn_app().await;
    let client = client(&app.address, &app).max_retries(10).build().unwrap();
    let order_id = client.create_order(&order("i-6"), Key::New).await.unwrap().value.id;
    let declined =
        client.create_payment(&payment(&order_id, "pm_card_declined"), Key::given("decline-1")).await;
    let error = declined.unwrap_err();
    assert_eq!((error.status(), error.attempts, error.key.as_deref()), (Some(402), 1, Some("decline-1")));
    assert_eq!(error.problem().unwrap().problem_type, "payment-declined");
    assert!(!error.resumable());
    // Replayed: still final, and the service says so (Orderpay-Should-Retry: false).
    let again = client.create_payment(&payment(&order_id, "pm_card_declined"), Key::given("decline-1")).await;
    assert_eq!(again.unwrap_err().attempts, 1);
    let invalid = client.create_payment(&payment(&order_id, "pm_card_ok"), Key::given("bad key")).await;
    assert!(matches!(invalid.unwrap_err().kind, ErrorKind::Invalid(_)));
    let missing = client.get_order("0199e3a2-0000-7000-8000-000000000000").await.unwrap_err();
    assert_eq!((missing.status(), missing.attempts), (Some(404), 1));
}

#[tokio::test]
async fn an_app_finds_its_way_back_through_the_order_and_the_lists() {
    let app = spawn_app().await;
    let client = client(&app.address, &app).build().unwrap();
    let order_id = client.create_order(&order("i-7"), Key::New).await.unwrap().value.id;
    let paid = client.pay_and_wait(&payment(&order_id, "pm_card_ok"), Key::New).await.unwrap().value;
    let refund = CreateRefund { payment_id: paid.id.clone(), amount: None, reason: Some("duplicate".into()) };
    let refunded = client.refund_and_wait(&refund, Key::New).await.unwrap().value;

    let found = client.get_order(&order_id).await.unwrap().value;
    assert_eq!(found.payment_ids, std::slice::from_ref(&paid.id));
    let params = ListParams { order_id: Some(order_id.clone()), ..ListParams::default() };
    let payments = client.list_payments(&params).await.unwrap().value;
    assert_eq!(payments.data, [client.get_payment(&paid.id).await.unwrap().value]);
    let by_status = ListParams { status: Some("succeeded".into()), limit: Some(1), ..ListParams::default() };
    assert_eq!(client.list_payments(&by_status).await.unwrap().value.data.len(), 1);
    let refunds = ListParams { payment_id: Some(paid.id.clone()), ..ListParams::default() };
    assert_eq!(client.list_refunds(&refunds).await.unwrap().value.data, std::slice::from_ref(&refunded));
    assert_eq!(client.get_refund(&refunded.id).await.unwrap().value, refunded);
    let orders = client.list_orders(&ListParams::default()).await.unwrap().value;
    assert_eq!(orders.data[0].status, "refunded");
    let refunded_events = ListParams { event_type: Some("order.refunded".into()), ..ListParams::default() };
    let event = client.list_events(&refunded_events).await.unwrap().value.data.remove(0);
    assert_eq!(client.get_event(&event.id).await.unwrap().value, event);
    assert!(matches!(&event.data.object, EventObject::Order(order) if order.id == order_id));
    let books = ListParams { order_id: Some(order_id.clone()), ..ListParams::default() };
    let movements = client.list_balance_transactions(&books).await.unwrap().value.data;
    let kinds: Vec<_> = movements.iter().map(|movement| movement.transaction_type.as_str()).collect();
    assert_eq!(kinds, ["refund", "charge_captured"]);
    assert_eq!(movements[0].source.id, refunded.id);
    let cancel_later = client.create_order(&order("i-8"), Key::New).await.unwrap().value.id;
    assert_eq!(client.cancel_order(&cancel_later, Key::New).await.unwrap().value.status, "cancelled");
    let second = client.create_order(&order("i-9"), Key::New).await.unwrap().value.id;
    let manual = CreatePayment { capture_method: Some("manual".into()), ..payment(&second, "pm_card_ok") };
    let authorized = client.pay_and_wait(&manual, Key::New).await.unwrap().value;
    assert_eq!(client.void_payment(&authorized.id, Key::New).await.unwrap().value.status, "canceled");
}

#[tokio::test]
async fn merchant_webhooks_verify_and_parse_with_the_client_across_a_rotation() {
    let app = spawn_app_with(|settings, _| settings.webhooks = Some(test_webhook_settings())).await;
    let receiver = Receiver::ok().await;
    let client = client(&app.address, &app).build().unwrap();
    let endpoint = CreateWebhookEndpoint {
        url: receiver.url("/hooks"),
        enabled_events: vec!["order.created".into()],
        description: None,
    };
    let created = client.create_webhook_endpoint(&endpoint, Key::New).await.unwrap().value;
    let old_secret = created.secret.clone().expect("the secret, shown once");
    assert_eq!(client.get_webhook_endpoint(&created.id).await.unwrap().value.secret, None);
    let listed = client.list_webhook_endpoints(&ListParams::default()).await.unwrap().value;
    assert_eq!(listed.data.len(), 1);

    let order_id = client.create_order(&order("i-10"), Key::New).await.unwrap().value.id;
    let delivery = eventually("the order.created delivery", Duration::from_secs(10), || async {
        receiver.received_at("/hooks").into_iter().next()
    })
    .await;
    let header = |name: &str| delivery.headers.get(name).map(String::as_str);
    let event = Webhook::new(&[&old_secret]).unwrap().verify(header, &delivery.body).unwrap();
    assert_eq!(event.event_type, "order.created");
    assert!(matches!(&event.data.object, EventObject::Order(order) if order.id == order_id));
    let mut tampered = delivery.body.clone();
    tampered[10] ^= 1;
    assert!(Webhook::new(&[&old_secret]).unwrap().verify(header, &tampered).is_err());

    // During a rotation each delivery carries both signatures: either secret verifies it.
    let rotated = client.rotate_webhook_endpoint_secret(&created.id, Key::New).await.unwrap().value;
    let new_secret = rotated.secret.expect("the new secret");
    client.create_order(&order("i-11"), Key::New).await.unwrap();
    let delivery = eventually("the second delivery", Duration::from_secs(10), || async {
        receiver.received_at("/hooks").into_iter().nth(1)
    })
    .await;
    let header = |name: &str| delivery.headers.get(name).map(String::as_str);
    for secrets in [vec![&old_secret], vec![&new_secret], vec![&new_secret, &old_secret]] {
        Webhook::new(&secrets).unwrap().verify(header, &delivery.body).unwrap();
    }
    let stranger = Webhook::new(&["whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQtMzJieXRlcw=="]).unwrap();
    assert!(stranger.verify(header, &delivery.body).is_err());
    assert!(client.delete_webhook_endpoint(&created.id).await.unwrap().value.deleted);
}

// ---------------------------------------------------------------------------------------------
// The fault run

/// How the run's clients retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// max_retries 10, a 30 s deadline; a failed call is resumed with its stored key.
    Retries,
    /// The client's defaults (2 retries, 60 s); a failed call is resumed with its stored key.
    Defaults,
    /// No client retries, no stored keys: a failed call is sent again as a new request, as an
    /// app that knows nothing of keys does.
    Naive,
}

impl Mode {
    fn parse(text: &str) -> Option<Mode> {
        match text.trim() {
            "retries" => Some(Mode::Retries),
            "defaults" => Some(Mode::Defaults),
            "naive" => Some(Mode::Naive),
            _ => None,
        }
    }
}

struct IntentResult {
    attempts: u32,
    resumes: u32,
    took: Duration,
}

fn percentile(sorted: &[f64], share: f64) -> f64 {
    let index = ((sorted.len() as f64 * share).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// Runs until the call succeeds: resumed with its stored key (or, naive, as a new request).
async fn until_success<T>(
    mode: Mode,
    attempts: &mut u32,
    resumes: &mut u32,
    mut call: impl AsyncFnMut(Key) -> Result<orderpay_client::Reply<T>, orderpay_client::Error>,
    intent: &str,
) -> Option<T> {
    loop {
        let key = if mode == Mode::Naive { Key::New } else { Key::intent(intent) };
        match call(key).await {
            Ok(reply) => {
                *attempts += reply.attempts;
                return Some(reply.value);
            }
            // A naive app's second payment finds the order paid by its first: done.
            Err(error)
                if mode == Mode::Naive
                    && error.problem().is_some_and(|p| p.problem_type == "invalid-state") =>
            {
                *attempts += error.attempts;
                return None;
            }
            Err(error) => {
                assert!(error.resumable() || mode == Mode::Naive, "a final failure: {error}");
                *attempts += error.attempts;
                *resumes += 1;
            }
        }
    }
}

/// Orders per intent with more than one order, counted in the database.
async fn duplicated_intents(app: &TestApp) -> i64 {
    app.count(
        "SELECT count(*) AS count FROM (SELECT metadata->>'intent' FROM orders \
         GROUP BY 1 HAVING count(*) > 1) AS duplicated",
    )
    .await
}

async fn fault_run(mode: Mode, intents: usize, in_flight: usize) -> String {
    let app = spawn_app_with(|settings, _| settings.database.pool_size = 8).await;
    let faults = Faults { rate: 0.2, delay_ms: 200, ..Faults::default() };
    let proxy = FaultProxy::start("127.0.0.1:0", &app.socket_address(), faults).await.unwrap();
    let mut builder = client(&proxy.address(), &app);
    builder = match mode {
        Mode::Retries => builder.max_retries(10).deadline(Duration::from_secs(30)),
        Mode::Defaults => builder,
        Mode::Naive => builder.max_retries(0),
    };
    let client = builder.build().unwrap();
    let started = Instant::now();
    let most_duplicated = Arc::new(AtomicU32::new(0));
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (most, running, app) = (most_duplicated.clone(), running.clone(), &app);
        async move {
            while running.load(Ordering::SeqCst) {
                most.fetch_max(duplicated_intents(app).await as u32, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let semaphore = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let work = join_all((0..intents).map(|index| {
        let (client, semaphore) = (client.clone(), semaphore.clone());
        async move {
            let _permit = semaphore.acquire().await.unwrap();
            let intent = format!("intent-{index}");
            let began = Instant::now();
            let (mut attempts, mut resumes) = (0, 0);
            let body = order(&intent);
            let order = until_success(
                mode,
                &mut attempts,
                &mut resumes,
                async |key| client.create_order(&body, key).await,
                &intent,
            )
            .await
            .expect("an order");
            let pay = payment(&order.id, "pm_card_ok");
            until_success(
                mode,
                &mut attempts,
                &mut resumes,
                async |key| client.pay_and_wait(&pay, key).await,
                &intent,
            )
            .await;
            IntentResult { attempts, resumes, took: began.elapsed() }
        }
    }));
    let results = {
        let (results, ()) = tokio::join!(
            async {
                let results = work.await;
                running.store(false, Ordering::SeqCst);
                results
            },
            sampler
        );
        results
    };
    let took = started.elapsed();
    let stats = proxy.stats();

    // Counted in the database and at the provider.
    let orders = app.orders_stored().await;
    let duplicated = duplicated_intents(&app).await;
    let charges = app.provider.charges().await;
    // A charge's reference is its payment; a paid order has one succeeded payment (an index).
    let mut charges_per_payment: HashMap<String, usize> = HashMap::new();
    for charge in charges.iter().filter(|charge| charge["status"] == "succeeded") {
        *charges_per_payment
            .entry(charge["reference"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    let succeeded = app.count("SELECT count(*) AS count FROM payments WHERE status = 'succeeded'").await;
    let paid = app.count("SELECT count(*) AS count FROM orders WHERE status = 'paid'").await;
    let extra_orders = orders - intents as i64;
    let charged: usize = charges_per_payment.values().sum();
    let extra_charges = charged as i64 - paid;
    if mode != Mode::Naive {
        assert_eq!(most_duplicated.load(Ordering::SeqCst), 0, "never two orders for one intent");
        assert_eq!((orders, duplicated), (intents as i64, 0), "exactly one order per intent");
        assert_eq!((paid, succeeded), (intents as i64, intents as i64), "every order paid once");
        assert_eq!(charged, intents, "one charge per order: {charges_per_payment:?}");
    }
    assert!(stats.faulted() > 0, "{stats:?}");

    let mut attempts: Vec<f64> = results.iter().map(|result| result.attempts as f64).collect();
    let mut times: Vec<f64> = results.iter().map(|result| result.took.as_secs_f64() * 1000.0).collect();
    attempts.sort_by(f64::total_cmp);
    times.sort_by(f64::total_cmp);
    let resumed = results.iter().filter(|result| result.resumes > 0).count();
    let mode_name = match mode {
        Mode::Retries => "retries (max 10, 30 s)",
        Mode::Defaults => "defaults (max 2, 60 s)",
        Mode::Naive => "naive (no retries, no keys)",
    };
    // One line for the report: the Makefile collects these.
    format!(
        "rust | {mode_name} | {intents} intents, {calls} calls | {exchanges} exchanges, {faulted} faulted \
         (drop {drop}, reset {reset}, 503 {unavailable}, delay {delay}) | {resumed} intents resumed | \
         duplicates: {extra_orders} orders, {extra_charges} charges | attempts per intent p50 {a50} p99 {a99} | \
         time to success p50 {t50:.0} ms p99 {t99:.0} ms | {took:.1} s",
        calls = intents * 2,
        exchanges = stats.exchanges,
        faulted = stats.faulted(),
        drop = stats.drop,
        reset = stats.reset,
        unavailable = stats.unavailable,
        delay = stats.delay,
        a50 = percentile(&attempts, 0.5),
        a99 = percentile(&attempts, 0.99),
        t50 = percentile(&times, 0.5),
        t99 = percentile(&times, 0.99),
        took = took.as_secs_f64(),
    )
}

/// 200 intents (create an order, pay it) at 16 in flight with 20% of exchanges faulted:
/// exactly one order and one charge each. `CLIENT_FAULT_INTENTS` and `CLIENT_FAULT_MODES`
/// (`retries,defaults,naive`) make it `make clients-faults`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulted_intents_end_with_one_order_and_one_charge_each() {
    let intents =
        std::env::var("CLIENT_FAULT_INTENTS").ok().and_then(|text| text.parse().ok()).unwrap_or(200);
    let modes = std::env::var("CLIENT_FAULT_MODES").unwrap_or_else(|_| "retries".into());
    let mut report = Vec::new();
    for mode in modes.split(',').filter_map(Mode::parse) {
        report.push(fault_run(mode, intents, 16).await);
    }
    assert!(!report.is_empty(), "CLIENT_FAULT_MODES names no mode: {modes}");
    let lines = report.join("\n");
    println!("{lines}");
    if let Ok(path) = std::env::var("CLIENT_FAULT_REPORT") {
        std::fs::write(path, format!("{lines}\n")).unwrap();
    }
}
