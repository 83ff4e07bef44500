//! Merchant webhooks end to end: the real app (or a real `orderpay serve` subprocess) against
//! real PostgreSQL, delivering to a real local receiver (a small actix-web server in the test)
//! that records every request and answers as the test scripts it. Signatures are checked with
//! ring's HMAC and base64 directly, not with the service's own code.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Int2, Int4, Nullable, Text, Timestamptz};
use reqwest::{Method, Response};
use serde_json::{Value, json};
use tokio::sync::watch;

use orderpay::merchant_webhooks::{DeliveryConfig, WebhookSettings};

use crate::helpers::{
    TestApp, assert_problem, json, new_encryption_key, new_key, spawn_app, spawn_app_with,
    test_webhook_settings,
};
use crate::process::{BIN, ServiceProcess};

// ---------------------------------------------------------------------------------------------
// The receiver

/// What the receiver does with one request.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// Answers this status at once.
    Status(u16),
    /// Holds the request until [`Receiver::release`], then answers this status.
    HoldThen(u16),
    /// Holds the request this long, then answers this status.
    After(Duration, u16),
    /// Accepts the request and never answers.
    Hang,
}

/// A request as the receiver got it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    /// Lower-case names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub at: DateTime<Utc>,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }

    pub fn webhook_id(&self) -> &str {
        self.header("webhook-id")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// Which answer the `n`-th request (0-based, over all paths) gets.
type Script = Box<dyn Fn(usize, &Received) -> Answer + Send + Sync>;

struct ReceiverState {
    received: Mutex<Vec<Received>>,
    answered: AtomicUsize,
    script: Mutex<Script>,
    released: watch::Sender<bool>,
}

/// A local HTTP server that records every request and answers as scripted.
pub struct Receiver {
    pub address: String,
    state: Arc<ReceiverState>,
    server: actix_web::dev::ServerHandle,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

async fn receive(state: web::Data<ReceiverState>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let received = Received {
        path: request.path().to_owned(),
        headers: request
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or_default().to_owned()))
            .collect(),
        body: body.to_vec(),
        at: Utc::now(),
    };
    let answer = {
        let mut list = state.received.lock().unwrap();
        list.push(received.clone());
        (state.script.lock().unwrap())(list.len() - 1, &received)
    };
    let status = match answer {
        Answer::Status(status) => status,
        Answer::HoldThen(status) => {
            let mut released = state.released.subscribe();
            let _ = released.wait_for(|released| *released).await;
            status
        }
        Answer::After(wait, status) => {
            tokio::time::sleep(wait).await;
            status
        }
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            200
        }
    };
    state.answered.fetch_add(1, Ordering::SeqCst);
    HttpResponse::build(StatusCode::from_u16(status).unwrap()).body("ok")
}

impl Receiver {
    pub async fn start(script: impl Fn(usize, &Received) -> Answer + Send + Sync + 'static) -> Receiver {
        let state = web::Data::new(ReceiverState {
            received: Mutex::new(Vec::new()),
            answered: AtomicUsize::new(0),
            script: Mutex::new(Box::new(script)),
            released: watch::Sender::new(false),
        });
        let shared = state.clone();
        let server =
            HttpServer::new(move || App::new().app_data(shared.clone()).default_service(web::to(receive)))
                .workers(1)
                .bind(("127.0.0.1", 0))
                .expect("the receiver's port");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver { address: format!("http://127.0.0.1:{port}"), state: state.into_inner(), server: handle }
    }

    /// A receiver answering 200 to everything.
    pub async fn ok() -> Receiver {
        Receiver::start(|_, _| Answer::Status(200)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub fn port(&self) -> u16 {
        self.address.rsplit(':').next().unwrap().parse().unwrap()
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn received_at(&self, path: &str) -> Vec<Received> {
        self.received().into_iter().filter(|request| request.path == path).collect()
    }

    pub fn answered(&self) -> usize {
        self.state.answered.load(Ordering::SeqCst)
    }

    pub fn script(&self, script: impl Fn(usize, &Received) -> Answer + Send + Sync + 'static) {
        *self.state.script.lock().unwrap() = Box::new(script);
    }

    /// Lets every held request answer.
    pub fn release(&self) {
        self.state.released.send_replace(true);
    }

    /// The distinct `webhook-id`s received at `path`.
    pub fn webhook_ids(&self, path: &str) -> BTreeSet<String> {
        self.received_at(path).iter().map(|request| request.webhook_id().to_owned()).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Checking signatures, independently of src/webhook_signature.rs

/// For each `v1` signature of the request's `webhook-signature` header, whether it is the
/// HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}` under the decoded `secret`.
fn signatures_verified_by(secret: &str, request: &Received) -> Vec<bool> {
    let key = STANDARD.decode(secret.strip_prefix("whsec_").expect("a whsec_ secret")).expect("base64");
    let mut signed =
        format!("{}.{}.", request.webhook_id(), request.header("webhook-timestamp")).into_bytes();
    signed.extend_from_slice(&request.body);
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key), &signed);
    let expected = STANDARD.encode(tag.as_ref());
    request
        .header("webhook-signature")
        .split(' ')
        .map(|signature| signature.strip_prefix("v1,") == Some(expected.as_str()))
        .collect()
}

fn verifies(secret: &str, request: &Received) -> bool {
    signatures_verified_by(secret, request).contains(&true)
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// The test app with merchant webhooks on (`test_webhook_settings`, adjusted by `configure`).
async fn webhooks_app(configure: impl FnOnce(&mut WebhookSettings)) -> TestApp {
    spawn_app_with(|settings, _| {
        let mut webhooks = test_webhook_settings();
        configure(&mut webhooks);
        settings.webhooks = Some(webhooks);
    })
    .await
}

/// The test app with merchant webhooks on and their delivery settings adjusted.
async fn app_with_delivery(configure: impl FnOnce(&mut DeliveryConfig)) -> TestApp {
    webhooks_app(|webhooks| configure(&mut webhooks.delivery)).await
}

/// Polls `check` every 20 ms until it returns `Some`, failing after `limit`.
async fn wait_for<T>(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post_endpoint(app: &TestApp, body: &Value, key: Option<&str>) -> Response {
    let mut request = app.request(Method::POST, "/webhook_endpoints").json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await.expect("POST /webhook_endpoints")
}

/// Creates an endpoint; returns it as answered (with its secret).
async fn create_endpoint(app: &TestApp, url: &str, events: &[&str]) -> Value {
    let response = post_endpoint(app, &json!({ "url": url, "enabled_events": events }), None).await;
    assert_eq!(response.status(), 201, "POST /webhook_endpoints {url}");
    json(response).await
}

fn id_of(value: &Value) -> String {
    value["id"].as_str().expect("an id").to_owned()
}

fn secret_of(endpoint: &Value) -> String {
    endpoint["secret"].as_str().expect("a secret").to_owned()
}

/// The ids of the account's events, oldest first.
async fn event_ids(app: &TestApp) -> Vec<String> {
    app.all_events().await.iter().map(id_of).collect()
}

#[derive(Debug, Clone, QueryableByName)]
struct DeliveryRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Int4)]
    attempts: i32,
    #[diesel(sql_type = Nullable<Int2>)]
    last_status: Option<i16>,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    next_attempt_at: Option<DateTime<Utc>>,
}

/// The deliveries to `endpoint_id`, oldest first.
async fn deliveries(app: &TestApp, endpoint_id: &str) -> Vec<DeliveryRow> {
    use diesel_async::RunQueryDsl;
    let mut conn = app.db().await;
    diesel::sql_query(format!(
        "SELECT id::text, event_id::text, status, attempts, last_status, last_error, next_attempt_at \
         FROM webhook_deliveries WHERE endpoint_id = '{endpoint_id}' ORDER BY id"
    ))
    .load(&mut conn)
    .await
    .expect("deliveries")
}

#[derive(Debug, Clone, QueryableByName)]
struct AttemptRow {
    #[diesel(sql_type = Int4)]
    attempt: i32,
    #[diesel(sql_type = Timestamptz)]
    started_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Int2>)]
    http_status: Option<i16>,
    #[diesel(sql_type = Int4)]
    latency_ms: i32,
    #[diesel(sql_type = Nullable<Text>)]
    error: Option<String>,
}

async fn attempts(app: &TestApp, delivery_id: &str) -> Vec<AttemptRow> {
    use diesel_async::RunQueryDsl;
    let mut conn = app.db().await;
    diesel::sql_query(format!(
        "SELECT attempt, started_at, http_status, latency_ms, error FROM webhook_delivery_attempts \
         WHERE delivery_id = '{delivery_id}' ORDER BY attempt"
    ))
    .load(&mut conn)
    .await
    .expect("attempts")
}

/// The only delivery to `endpoint_id` once it has `status`.
async fn delivery_when(app: &TestApp, endpoint_id: &str, status: &str, limit: Duration) -> DeliveryRow {
    wait_for(&format!("the delivery is {status}"), limit, async || {
        let rows = deliveries(app, endpoint_id).await;
        <[DeliveryRow]>::first(&rows).filter(|row| row.status == status).cloned()
    })
    .await
}

/// `orderpay_webhook_deliveries_total{result}` as `/metrics` shows it (0 before the first). The
/// recorder is the process's, so callers compare with lower bounds.
async fn deliveries_counted(app: &TestApp, result: &str) -> u64 {
    let text = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let series = format!("orderpay_webhook_deliveries_total{{result=\"{result}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&series)).map_or(0, |value| value.trim().parse().unwrap())
}

// ---------------------------------------------------------------------------------------------
// Delivery

#[tokio::test]
async fn each_event_reaches_each_endpoint_that_asked_for_it_once_signed_with_its_own_secret() {
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::ok().await;
    let everything = create_endpoint(&app, &receiver.url("/all"), &["*"]).await;
    let paid_only = create_endpoint(&app, &receiver.url("/paid"), &["order.paid"]).await;

    let (order_id, payment) = app.paid_order("42.00", "pm_card_ok").await;
    let refund = app.refund(payment["id"].as_str().unwrap(), None, &new_key()).await;
    assert_eq!(refund.status(), 201);
    let events = event_ids(&app).await;
    assert_eq!(
        app.event_types().await,
        ["order.created", "payment.succeeded", "order.paid", "refund.succeeded", "order.refunded"]
    );

    let expected: BTreeSet<String> = events.iter().cloned().collect();
    wait_for("every event reached the endpoint for every type", Duration::from_secs(10), async || {
        (receiver.webhook_ids("/all") == expected).then_some(())
    })
    .await;
    let paid_event = app.events_of("order.paid").await[0]["id"].as_str().unwrap().to_owned();
    wait_for("order.paid reached its endpoint", Duration::from_secs(10), async || {
        (!receiver.received_at("/paid").is_empty()).then_some(())
    })
    .await;
    // Once every delivery is delivered nothing is sent again: each event arrived once.
    for endpoint in [&everything, &paid_only] {
        wait_for("every delivery is delivered", Duration::from_secs(10), async || {
            let rows = deliveries(&app, &id_of(endpoint)).await;
            rows.iter().all(|row| row.status == "delivered").then_some(())
        })
        .await;
    }
    assert_eq!(receiver.received_at("/all").len(), events.len(), "each event once");
    assert_eq!(receiver.webhook_ids("/paid"), BTreeSet::from([paid_event.clone()]), "only order.paid");
    assert_eq!(receiver.received_at("/paid").len(), 1);

    let (all_secret, paid_secret) = (secret_of(&everything), secret_of(&paid_only));
    let mut latencies = Vec::new();
    for request in receiver.received() {
        let event = app.get_json(&format!("/events/{}", request.webhook_id())).await;
        assert_eq!(request.json(), event, "the event as GET /events/{{id}} renders it");
        let raw = app
            .request(Method::GET, &format!("/events/{}", request.webhook_id()))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(request.body, raw.to_vec(), "byte for byte");
        assert_eq!(request.header("content-type"), "application/json");
        assert!(request.header("user-agent").starts_with("orderpay-webhooks/"), "{request:?}");
        let timestamp: i64 = request.header("webhook-timestamp").parse().unwrap();
        assert!((Utc::now().timestamp() - timestamp).abs() < 60);
        let (own, other) =
            if request.path == "/all" { (&all_secret, &paid_secret) } else { (&paid_secret, &all_secret) };
        assert_eq!(signatures_verified_by(own, &request), [true], "signed with its endpoint's secret");
        assert!(!verifies(other, &request), "and not with another endpoint's");
        let created: DateTime<Utc> = event["created_at"].as_str().unwrap().parse().unwrap();
        latencies.push((request.at - created).num_milliseconds());
    }
    latencies.sort_unstable();
    eprintln!(
        "event written to receiver: min {} ms, median {} ms, max {} ms ({} deliveries; relay every 20 ms)",
        latencies[0],
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
        latencies.len()
    );
    assert_eq!(app.order_status(&order_id).await, "refunded");
}

#[tokio::test]
async fn a_receiver_failing_three_times_gets_four_attempts_of_one_event_with_one_webhook_id() {
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::start(|n, _| Answer::Status(if n < 3 { 500 } else { 200 })).await;
    let endpoint = create_endpoint(&app, &receiver.url("/hook"), &["order.created"]).await;
    let delivered_before = deliveries_counted(&app, "delivered").await;
    let failed_before = deliveries_counted(&app, "failed").await;
    app.create_order().await;
    let event_id = event_ids(&app).await[0].clone();

    let delivery = delivery_when(&app, &id_of(&endpoint), "delivered", Duration::from_secs(10)).await;
    assert_eq!(delivery.attempts, 4);
    assert_eq!(delivery.event_id, event_id);
    assert_eq!(delivery.last_status, Some(200));
    let received = receiver.received();
    assert_eq!(received.len(), 4, "four attempts");
    assert!(received.iter().all(|request| request.webhook_id() == event_id), "one webhook-id throughout");
    assert!(received.iter().all(|request| verifies(&secret_of(&endpoint), request)));

    let attempts = attempts(&app, &delivery.id).await;
    let statuses: Vec<Option<i16>> = attempts.iter().map(|attempt| attempt.http_status).collect();
    assert_eq!(statuses, [Some(500), Some(500), Some(500), Some(200)]);
    assert_eq!(attempts.iter().map(|attempt| attempt.attempt).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(attempts.iter().all(|attempt| attempt.latency_ms >= 0 && attempt.latency_ms < 2000));
    assert_eq!(attempts[0].error.as_deref(), Some("HTTP 500"));
    assert_eq!(attempts[3].error, None);
    // The retries waited their backoff (50 ms doubling, equal jitter: at least half of it).
    for (pair, minimum) in attempts.windows(2).zip([25, 50, 100]) {
        let waited = (pair[1].started_at - pair[0].started_at).num_milliseconds();
        assert!(waited >= minimum, "attempt {} came {waited} ms after the one before", pair[1].attempt);
    }
    assert!(deliveries_counted(&app, "delivered").await > delivered_before);
    assert!(deliveries_counted(&app, "failed").await >= failed_before + 3);
}

#[tokio::test]
async fn a_receiver_that_never_answers_is_retried_on_schedule_then_given_up() {
    let app = app_with_delivery(|delivery| {
        delivery.timeout = Duration::from_millis(200);
        delivery.lease = Duration::from_millis(1000);
        delivery.retry_base = Duration::from_millis(100);
        delivery.retry_cap = Duration::from_millis(300);
        delivery.max_attempts = 4;
    })
    .await;
    let receiver = Receiver::start(|_, _| Answer::Hang).await;
    let endpoint = create_endpoint(&app, &receiver.url("/hook"), &["order.created"]).await;
    let gave_up_before = deliveries_counted(&app, "gave_up").await;
    app.create_order().await;

    let delivery = delivery_when(&app, &id_of(&endpoint), "failed", Duration::from_secs(15)).await;
    assert_eq!(delivery.attempts, 4);
    assert_eq!(delivery.next_attempt_at, None, "failed for good: no next attempt");
    assert_eq!(receiver.received().len(), 4, "every attempt reached the receiver");
    let attempts = attempts(&app, &delivery.id).await;
    assert_eq!(attempts.len(), 4);
    for attempt in &attempts {
        assert_eq!(attempt.http_status, None);
        assert_eq!(attempt.error.as_deref(), Some("no answer within 200 ms"));
        assert!(attempt.latency_ms >= 200, "{attempt:?}");
    }
    // Each retry came after the timeout and its backoff: 100 ms doubling, capped at 300 ms, equal
    // jitter (at least half, at most all of it), plus the worker's poll and a loaded machine.
    for (pair, ceiling) in attempts.windows(2).zip([100, 200, 300]) {
        let gap =
            (pair[1].started_at - pair[0].started_at).num_milliseconds() - i64::from(pair[0].latency_ms);
        assert!(gap >= ceiling / 2, "attempt {} waited {gap} ms", pair[1].attempt);
        assert!(gap <= ceiling + 1500, "attempt {} waited {gap} ms", pair[1].attempt);
    }
    assert!(deliveries_counted(&app, "gave_up").await > gave_up_before);
}

#[tokio::test]
async fn a_worker_whose_lease_ran_out_mid_send_does_not_overwrite_the_outcome_of_the_next() {
    // The worst interleaving on purpose: a lease shorter than the send. The first send is held
    // past the lease; meanwhile the delivery is due again and a second send succeeds; then the
    // first one's 500 arrives, and must change nothing but its own attempt's row.
    let app = app_with_delivery(|delivery| {
        delivery.timeout = Duration::from_secs(5);
        delivery.lease = Duration::from_millis(300);
    })
    .await;
    let receiver = Receiver::start(|n, _| {
        if n == 0 { Answer::After(Duration::from_millis(1500), 500) } else { Answer::Status(200) }
    })
    .await;
    let endpoint = create_endpoint(&app, &receiver.url("/hook"), &["order.created"]).await;
    app.create_order().await;
    let event_id = event_ids(&app).await[0].clone();

    let delivery = delivery_when(&app, &id_of(&endpoint), "delivered", Duration::from_secs(10)).await;
    let attempts =
        wait_for("the first send's late answer is recorded", Duration::from_secs(10), async || {
            let rows = attempts(&app, &delivery.id).await;
            (rows.len() == 2).then_some(rows)
        })
        .await;
    assert_eq!(receiver.answered(), 2);
    assert_eq!(attempts[0].http_status, Some(500), "the first send, answered late");
    assert!(attempts[0].latency_ms >= 1500);
    assert_eq!(attempts[1].http_status, Some(200), "the second send, after the first's lease ran out");
    assert!(attempts[1].started_at < attempts[0].started_at + chrono::Duration::milliseconds(1500));
    let after = deliveries(&app, &id_of(&endpoint)).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].status, "delivered", "the late 500 did not overwrite the delivery");
    assert_eq!(after[0].last_status, Some(200));
    assert_eq!(after[0].attempts, 2);
    assert_eq!(receiver.webhook_ids("/hook"), BTreeSet::from([event_id]), "the same webhook-id twice");
    assert_eq!(receiver.received().len(), 2);
}

#[tokio::test]
async fn a_service_killed_mid_delivery_delivers_every_event_after_a_restart() {
    // The test's own app only writes events (merchant webhooks off: no worker of its own); the
    // subprocess relays and delivers, holding its sends at the receiver when it is killed.
    let app = spawn_app().await;
    let receiver = Receiver::start(|_, _| Answer::HoldThen(200)).await;
    let key = new_encryption_key();
    let env = [
        ("ORDERPAY_ENCRYPTION_KEY", key.as_str()),
        ("ORDERPAY_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("ORDERPAY_WEBHOOK_REQUIRE_HTTPS", "false"),
        ("ORDERPAY_WEBHOOK_POLL_MS", "20"),
        ("ORDERPAY_RELAY_INTERVAL_MS", "20"),
        ("ORDERPAY_WEBHOOK_TIMEOUT_MS", "2000"),
        ("ORDERPAY_WEBHOOK_LEASE_MS", "2500"),
        ("ORDERPAY_WEBHOOK_RETRY_BASE_MS", "50"),
        ("ORDERPAY_WEBHOOK_RETRY_CAP_MS", "500"),
    ];
    let mut service = ServiceProcess::start(&app.database_url, &app.provider.address, &env).await;
    let response = app
        .client
        .post(format!("{}/webhook_endpoints", service.address))
        .bearer_auth(&app.api_key)
        .json(&json!({"url": receiver.url("/hook"), "enabled_events": ["*"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let endpoint = json(response).await;

    for _ in 0..6 {
        app.create_order().await;
    }
    wait_for("sends are in flight at the receiver", Duration::from_secs(10), async || {
        (receiver.received().len() >= 3).then_some(())
    })
    .await;
    service.kill();
    let in_flight = receiver.received().len();
    assert_eq!(receiver.answered(), 0, "nothing was answered before the kill");
    receiver.release();
    for _ in 0..3 {
        app.create_order().await;
    }

    let _restarted = ServiceProcess::start(&app.database_url, &app.provider.address, &env).await;
    let expected: BTreeSet<String> = event_ids(&app).await.into_iter().collect();
    assert_eq!(expected.len(), 9);
    wait_for("every event reached the receiver", Duration::from_secs(20), async || {
        (receiver.webhook_ids("/hook") == expected).then_some(())
    })
    .await;
    wait_for("every delivery is delivered", Duration::from_secs(20), async || {
        let rows = deliveries(&app, &id_of(&endpoint)).await;
        (rows.len() == 9 && rows.iter().all(|row| row.status == "delivered")).then_some(())
    })
    .await;
    assert_eq!(receiver.webhook_ids("/hook"), expected, "exactly the account's events, none other");
    assert!(receiver.received().len() >= 9 + in_flight.min(9), "the sends killed in flight came again");
    let secret = secret_of(&endpoint);
    assert!(receiver.received().iter().all(|request| verifies(&secret, request)));
}

#[tokio::test]
async fn a_batch_of_outcomes_writes_each_only_under_its_own_lease_and_every_attempt() {
    // The recorder's statement on a batch built on purpose: two deliveries still held by the
    // lease that sent them, two whose lease ran out and that another claim took over meanwhile,
    // and for one of those the new holder's attempt in the same batch. The app has merchant
    // webhooks off: no worker of its own claims anything, and the clock is the test's.
    use diesel_async::RunQueryDsl;
    use orderpay::ids::{DeliveryId, EndpointId, EventId, LeaseId};
    use orderpay::merchant_webhooks::DeliveryOrigin;
    use orderpay::merchant_webhooks::queue::{
        self, Attempt, Finished, NewDelivery, Outcome, claim_due, insert_deliveries,
    };
    use orderpay::operations::leases::Lease;

    let app = spawn_app().await;
    let mut conn = app.db().await;
    let endpoint_id = EndpointId::generate();
    diesel::sql_query(format!(
        "INSERT INTO webhook_endpoints (account_id, id, url, enabled_events, secret, created_at, updated_at) \
         VALUES ('{}', '{}', 'http://127.0.0.1:9/hook', ARRAY['*'], '\\x00', now(), now())",
        app.account_id, endpoint_id
    ))
    .execute(&mut conn)
    .await
    .expect("an endpoint");
    let t0 = Utc::now();
    let new: Vec<NewDelivery> = (0..4)
        .map(|_| NewDelivery {
            account_id: app.account_id,
            id: DeliveryId::generate(),
            endpoint_id,
            event_id: EventId::generate(),
            origin: DeliveryOrigin::Outbox,
        })
        .collect();
    assert_eq!(insert_deliveries(&mut conn, &new, t0).await.unwrap(), 4);

    // The first worker claims all four for a second...
    let first = Lease { id: LeaseId::generate(), until: t0 + chrono::Duration::seconds(1) };
    let claimed_first = claim_due(&mut conn, 10, first, t0).await.unwrap();
    assert_eq!(claimed_first.len(), 4);
    // ...which runs out: two seconds later a second worker takes two of them over.
    let later = t0 + chrono::Duration::seconds(2);
    let second = Lease { id: LeaseId::generate(), until: later + chrono::Duration::seconds(60) };
    let taken_over: Vec<DeliveryId> =
        claim_due(&mut conn, 2, second, later).await.unwrap().iter().map(|claimed| claimed.id).collect();
    assert_eq!(taken_over.len(), 2);
    let held: Vec<DeliveryId> =
        new.iter().map(|delivery| delivery.id).filter(|id| !taken_over.contains(id)).collect();

    let attempt = |number: i32, http_status: u16| Attempt {
        number,
        started_at: later,
        http_status: Some(http_status),
        latency_ms: 7,
        error: (http_status != 200).then(|| format!("HTTP {http_status}")),
    };
    let finished = |delivery: DeliveryId, lease: LeaseId, attempt: Attempt, outcome: Outcome| Finished {
        account_id: app.account_id,
        delivery,
        lease,
        attempt,
        outcome,
    };
    let retry_at = later + chrono::Duration::seconds(30);
    let batch = [
        // Held: delivered, and failed (retried later).
        finished(held[0], first.id, attempt(1, 200), Outcome::Delivered),
        finished(held[1], first.id, attempt(1, 500), Outcome::Retry(retry_at)),
        // Taken over: the first worker's late 500s, which must not touch either delivery...
        finished(taken_over[0], first.id, attempt(1, 500), Outcome::Retry(retry_at)),
        finished(taken_over[1], first.id, attempt(1, 500), Outcome::GiveUp),
        // ...and the second worker's 200 for one of them, in the same batch.
        finished(taken_over[1], second.id, attempt(2, 200), Outcome::Delivered),
    ];
    let applied = queue::record_finished(&mut conn, &batch, later).await.unwrap();
    // Each outcome written once, with the lease that sent it: the first worker's late answer
    // for `taken_over[1]` is not among them, though its delivery is.
    let expected = [(held[0], first.id), (held[1], first.id), (taken_over[1], second.id)];
    assert_eq!(applied, std::collections::HashSet::from(expected));

    let rows = deliveries(&app, &endpoint_id.to_string()).await;
    let row = |id: DeliveryId| rows.iter().find(|row| row.id == id.to_string()).unwrap().clone();
    assert_eq!(row(held[0]).status, "delivered");
    assert_eq!(row(held[0]).last_status, Some(200));
    assert_eq!(row(held[1]).status, "pending");
    assert_eq!(row(held[1]).last_status, Some(500));
    assert_eq!(
        row(held[1]).next_attempt_at.map(|at| at.timestamp_micros()),
        Some(retry_at.timestamp_micros())
    );
    // Still the second worker's, untouched by the first one's late answer.
    let untouched = row(taken_over[0]);
    assert_eq!((untouched.status.as_str(), untouched.attempts, untouched.last_status), ("pending", 2, None));
    assert_eq!(
        untouched.next_attempt_at.map(|at| at.timestamp_micros()),
        Some(second.until.timestamp_micros()),
        "still leased to the second worker"
    );
    let overtaken = row(taken_over[1]);
    assert_eq!((overtaken.status.as_str(), overtaken.last_status), ("delivered", Some(200)));

    // Every attempt is recorded, the late ones too.
    let numbers = |id: DeliveryId| {
        let app = &app;
        async move {
            attempts(app, &id.to_string())
                .await
                .iter()
                .map(|a| (a.attempt, a.http_status))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(numbers(held[0]).await, [(1, Some(200))]);
    assert_eq!(numbers(held[1]).await, [(1, Some(500))]);
    assert_eq!(numbers(taken_over[0]).await, [(1, Some(500))]);
    assert_eq!(numbers(taken_over[1]).await, [(1, Some(500)), (2, Some(200))]);
    let leased: i64 = {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            count: i64,
        }
        diesel::sql_query(format!(
            "SELECT count(*) AS count FROM webhook_deliveries WHERE lease_id = '{}'",
            second.id
        ))
        .get_result::<Count>(&mut conn)
        .await
        .unwrap()
        .count
    };
    assert_eq!(leased, 1, "only the untouched delivery is still leased, to the second worker");
}

#[tokio::test]
async fn a_failed_write_of_outcomes_is_written_again_and_loses_no_attempt() {
    // Every write of attempts fails (a trigger), counting each failure in a sequence (which
    // no rollback undoes), until the test heals it: the send's outcome must be written then,
    // under its lease, and not sent again.
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::ok().await;
    let endpoint = create_endpoint(&app, &receiver.url("/hook"), &["order.created"]).await;
    app.execute("CREATE SEQUENCE attempt_writes_failed").await;
    app.execute(
        "CREATE FUNCTION fail_attempt_writes() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM nextval('attempt_writes_failed'); RAISE EXCEPTION 'injected failure'; END $$",
    )
    .await;
    app.execute(
        "CREATE TRIGGER fail_attempt_writes BEFORE INSERT ON webhook_delivery_attempts \
         FOR EACH ROW EXECUTE FUNCTION fail_attempt_writes()",
    )
    .await;
    app.create_order().await;
    let failed_writes =
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS count FROM attempt_writes_failed";
    wait_for("the outcome's write failed, and was tried again", Duration::from_secs(10), async || {
        (app.count(failed_writes).await >= 2).then_some(())
    })
    .await;
    assert_eq!(receiver.received().len(), 1, "sent once meanwhile");
    app.execute("DROP TRIGGER fail_attempt_writes ON webhook_delivery_attempts").await;

    let delivery = delivery_when(&app, &id_of(&endpoint), "delivered", Duration::from_secs(10)).await;
    assert_eq!(delivery.attempts, 1, "written under its first lease, not sent again after it");
    let attempts = attempts(&app, &delivery.id).await;
    let recorded: Vec<(i32, Option<i16>)> = attempts.iter().map(|a| (a.attempt, a.http_status)).collect();
    assert_eq!(recorded, [(1, Some(200))]);
    assert_eq!(receiver.received().len(), 1);
}

#[tokio::test]
async fn a_claim_that_fails_uses_up_no_attempt_number() {
    // The worst moment on purpose: a worker's claim is stopped (cancelled) while it waits to read
    // the event it claimed, which the test holds locked. Nothing of that claim may stay: the
    // delivery's next claim is its attempt 1, sent at once, not after a lease nobody held.
    use diesel_async::RunQueryDsl;
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::ok().await;
    app.create_order().await;
    let event_id = event_ids(&app).await[0].clone();
    // Made after the event: the relay writes it no delivery; the test writes one below.
    let endpoint = create_endpoint(&app, &receiver.url("/hook"), &["order.created"]).await;

    let mut holder = app.db().await;
    for sql in [
        "BEGIN",
        // The webhooks relay sits this out, so that only the worker waits on the events.
        "SELECT pg_advisory_xact_lock(hashtextextended('orderpay.relay.webhooks', 0))",
        "LOCK TABLE events IN ACCESS EXCLUSIVE MODE",
    ] {
        diesel::sql_query(sql).execute(&mut holder).await.expect(sql);
    }
    let redelivery = orderpay::merchant_webhooks::queue::NewDelivery {
        account_id: app.account_id,
        id: orderpay::ids::DeliveryId::generate(),
        endpoint_id: orderpay::ids::EndpointId::parse(&id_of(&endpoint)).unwrap(),
        event_id: orderpay::ids::EventId::parse(&event_id).unwrap(),
        origin: orderpay::merchant_webhooks::DeliveryOrigin::Redeliver,
    };
    let mut conn = app.db().await;
    orderpay::merchant_webhooks::queue::insert_deliveries(&mut conn, &[redelivery], Utc::now())
        .await
        .unwrap();
    // The worker's claim (claim_due.sql), by its text: other readers of the events (the relays'
    // lag gauge) may wait on the same lock meanwhile, and are not what this test cancels.
    let claim = "query LIKE '%UPDATE webhook_deliveries AS d SET attempts%'";
    let waiting = format!(
        "SELECT count(*) AS count FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND {claim}"
    );
    wait_for("the worker's claim waits for the event", Duration::from_secs(10), async || {
        (app.count(&waiting).await == 1).then_some(())
    })
    .await;
    let cancelled = format!(
        "SELECT count(pg_cancel_backend(pid)) AS count FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND {claim}"
    );
    assert_eq!(app.count(&cancelled).await, 1);
    diesel::sql_query("ROLLBACK").execute(&mut holder).await.unwrap();

    let delivery = delivery_when(&app, &id_of(&endpoint), "delivered", Duration::from_secs(10)).await;
    assert_eq!(delivery.attempts, 1, "the failed claim used up no attempt");
    let attempts = attempts(&app, &delivery.id).await;
    assert_eq!(attempts.iter().map(|a| (a.attempt, a.http_status)).collect::<Vec<_>>(), [(1, Some(200))]);
    assert_eq!(receiver.webhook_ids("/hook"), BTreeSet::from([event_id]));
}

#[tokio::test]
async fn five_hundred_events_are_each_delivered_once_with_every_attempt_recorded() {
    // Enough at once that outcomes are recorded many to a batch and claims refill half-free slots.
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::ok().await;
    let endpoint = create_endpoint(&app, &receiver.url("/hook"), &["order.created"]).await;
    let delivered_before = deliveries_counted(&app, "delivered").await;
    const EVENTS: usize = 500;
    for _ in 0..EVENTS / 25 {
        futures::future::join_all((0..25).map(|_| app.create_order())).await;
    }
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        id: String,
    }
    let expected: BTreeSet<String> = {
        use diesel_async::RunQueryDsl;
        let query = format!(
            "SELECT id::text AS id FROM events WHERE account_id = '{}' AND type = 'order.created'",
            app.account_id
        );
        let ids: Vec<Id> = diesel::sql_query(query).load(&mut app.db().await).await.unwrap();
        ids.into_iter().map(|row| row.id).collect()
    };
    assert_eq!(expected.len(), EVENTS);

    let rows = wait_for("every delivery is delivered", Duration::from_secs(60), async || {
        let rows = deliveries(&app, &id_of(&endpoint)).await;
        (rows.len() == EVENTS && rows.iter().all(|row| row.status == "delivered")).then_some(rows)
    })
    .await;
    assert_eq!(rows.iter().map(|row| row.event_id.clone()).collect::<BTreeSet<_>>(), expected);
    assert!(rows.iter().all(|row| row.attempts == 1 && row.last_status == Some(200)), "one attempt each");
    assert_eq!(receiver.received().len(), EVENTS, "each event sent once");
    assert_eq!(receiver.webhook_ids("/hook"), expected);

    #[derive(QueryableByName)]
    struct Recorded {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        attempts: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        ok: i64,
    }
    let recorded: Recorded = {
        use diesel_async::RunQueryDsl;
        diesel::sql_query(format!(
            "SELECT count(*) AS attempts, count(*) FILTER (WHERE a.attempt = 1 AND a.http_status = 200 \
                 AND a.error IS NULL) AS ok \
             FROM webhook_delivery_attempts AS a JOIN webhook_deliveries AS d \
                 ON d.account_id = a.account_id AND d.id = a.delivery_id \
             WHERE d.endpoint_id = '{}'",
            id_of(&endpoint)
        ))
        .get_result(&mut app.db().await)
        .await
        .unwrap()
    };
    assert_eq!((recorded.attempts, recorded.ok), (EVENTS as i64, EVENTS as i64), "every attempt recorded");
    assert!(deliveries_counted(&app, "delivered").await >= delivered_before + EVENTS as u64);
}

// ---------------------------------------------------------------------------------------------
// Secrets

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_new_one_until_it_expires_and_no_secret_is_stored_in_clear() {
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::ok().await;
    let body =
        json!({"url": receiver.url("/hook"), "enabled_events": ["order.created"], "description": "shop"});
    let create_key = new_key();
    let created = post_endpoint(&app, &body, Some(&create_key)).await;
    assert_eq!(created.status(), 201);
    let endpoint = json(created).await;
    let first = secret_of(&endpoint);
    assert!(first.starts_with("whsec_") && STANDARD.decode(&first[6..]).unwrap().len() >= 24, "{first}");
    let replay = post_endpoint(&app, &body, Some(&create_key)).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed = json(replay).await;
    assert_eq!(replayed["secret"], Value::Null, "a replay does not show the secret again");
    assert_eq!(replayed["id"], endpoint["id"]);

    let id = id_of(&endpoint);
    let rotate_key = new_key();
    let rotate = async |key: &str| {
        app.request(Method::POST, &format!("/webhook_endpoints/{id}/rotate_secret"))
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap()
    };
    let rotated = rotate(&rotate_key).await;
    assert_eq!(rotated.status(), 200);
    let rotated = json(rotated).await;
    let second = secret_of(&rotated);
    assert_ne!(second, first);
    let overlap_ends: DateTime<Utc> =
        rotated["previous_secret_expires_at"].as_str().unwrap().parse().unwrap();
    let hours = (overlap_ends - Utc::now()).num_minutes() as f64 / 60.0;
    assert!((23.9..=24.0).contains(&hours), "the old secret signs for 24 hours: {hours}");
    let replay = rotate(&rotate_key).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(replay).await["secret"], Value::Null);
    let shown = app.get_json(&format!("/webhook_endpoints/{id}")).await;
    assert!(shown.get("secret").is_none(), "GET never shows a secret: {shown}");

    // During the overlap: two signatures, the new secret's first, each verifying with its own.
    app.create_order().await;
    let during = wait_for("a delivery during the overlap", Duration::from_secs(10), async || {
        receiver.received().into_iter().next()
    })
    .await;
    assert_eq!(during.header("webhook-signature").split(' ').count(), 2, "{during:?}");
    assert_eq!(signatures_verified_by(&second, &during), [true, false]);
    assert_eq!(signatures_verified_by(&first, &during), [false, true]);

    // Once the overlap is over, the new secret alone.
    app.execute(&format!(
        "UPDATE webhook_endpoints SET previous_secret_expires_at = now() - interval '1 second' WHERE id = '{id}'"
    ))
    .await;
    app.create_order().await;
    let after = wait_for("a delivery after the overlap", Duration::from_secs(10), async || {
        receiver.received().get(1).cloned()
    })
    .await;
    assert_eq!(signatures_verified_by(&second, &after), [true]);

    // Neither secret is anywhere in clear: not as text, nor its key bytes, in the endpoints'
    // bytes, nor in any stored answer.
    for secret in [&first, &second] {
        let key_bytes = STANDARD.decode(&secret[6..]).unwrap();
        for needle in [hex::encode(secret.as_bytes()), hex::encode(&key_bytes)] {
            let found = app
                .count(&format!(
                    "SELECT count(*) AS count FROM webhook_endpoints AS e, idempotency_keys AS k \
                     WHERE position('\\x{needle}'::bytea IN coalesce(e.secret, '')) > 0 \
                        OR position('\\x{needle}'::bytea IN coalesce(e.previous_secret, '')) > 0 \
                        OR position('\\x{needle}'::bytea IN convert_to(e::text, 'UTF8')) > 0 \
                        OR position('\\x{needle}'::bytea IN coalesce(k.response_body, '')) > 0"
                ))
                .await;
            assert_eq!(found, 0, "a secret in clear");
        }
        let as_text = app
            .count(&format!(
                "SELECT count(*) AS count FROM webhook_endpoints AS e \
                 WHERE strpos(e::text, '{secret}') > 0 OR strpos(e::text, '{}') > 0",
                hex::encode(secret.as_bytes())
            ))
            .await;
        assert_eq!(as_text, 0);
    }
    assert!(app.count("SELECT count(*) AS count FROM webhook_endpoints WHERE secret IS NOT NULL").await == 1);
}

/// `orderpay serve` with merchant webhooks under the keys `keys` (ORDERPAY_ENCRYPTION_KEY as
/// written), delivering fast to local receivers; `log`, when given, gets its logs.
async fn keyed_service(app: &TestApp, keys: &str, log: Option<&std::path::Path>) -> ServiceProcess {
    let env = [
        ("ORDERPAY_ENCRYPTION_KEY", keys),
        ("ORDERPAY_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("ORDERPAY_WEBHOOK_REQUIRE_HTTPS", "false"),
        ("ORDERPAY_WEBHOOK_POLL_MS", "20"),
        ("ORDERPAY_RELAY_INTERVAL_MS", "20"),
        ("ORDERPAY_WEBHOOK_TIMEOUT_MS", "2000"),
        ("ORDERPAY_WEBHOOK_LEASE_MS", "2500"),
        ("ORDERPAY_WEBHOOK_RETRY_BASE_MS", "50"),
        ("ORDERPAY_WEBHOOK_RETRY_CAP_MS", "200"),
        ("RUST_LOG", "info"),
    ];
    ServiceProcess::start_logging_to(&app.database_url, &app.provider.address, &env, log).await
}

/// An endpoint created through `service`'s API; returned as answered (with its secret).
async fn create_endpoint_at(app: &TestApp, service: &ServiceProcess, url: &str) -> Value {
    let response = app
        .client
        .post(format!("{}/webhook_endpoints", service.address))
        .bearer_auth(&app.api_key)
        .json(&json!({"url": url, "enabled_events": ["order.created"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    json(response).await
}

async fn rotate_at(app: &TestApp, service: &ServiceProcess, endpoint: &Value) -> Value {
    let response = app
        .client
        .post(format!("{}/webhook_endpoints/{}/rotate_secret", service.address, id_of(endpoint)))
        .bearer_auth(&app.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    json(response).await
}

/// Creates an order; waits until `path` of `receiver` has received its order.created, and
/// returns that request.
async fn next_event_at(app: &TestApp, receiver: &Receiver, paths: &[&str]) -> Vec<Received> {
    let order = app.create_order().await;
    let order_id = order["id"].as_str().unwrap().to_owned();
    let mut found = Vec::new();
    for path in paths {
        let request =
            wait_for(&format!("the order's event at {path}"), Duration::from_secs(15), async || {
                receiver
                    .received_at(path)
                    .into_iter()
                    .find(|request| request.json()["data"]["object"]["id"] == order_id.as_str())
            })
            .await;
        found.push(request);
    }
    found
}

#[tokio::test]
async fn rotating_the_encryption_key_with_two_keys_keeps_every_endpoint_receiving() {
    // The app in the test only writes events; each `serve` in turn relays and delivers them.
    let app = spawn_app().await;
    let receiver = Receiver::ok().await;
    let (old_key, next_key) = (new_encryption_key(), new_encryption_key());
    let mut old = keyed_service(&app, &old_key, None).await;
    let sealed_old = create_endpoint_at(&app, &old, &receiver.url("/old")).await;
    let [first] = next_event_at(&app, &receiver, &["/old"]).await.try_into().unwrap();
    assert!(verifies(&secret_of(&sealed_old), &first));
    old.kill();

    // The new key first, the old one after it: what the old one sealed still opens and signs,
    // what is made now is sealed under the new one, and a rotation keeps the old secret signing.
    let both = keyed_service(&app, &format!("{next_key},{old_key}"), None).await;
    let sealed_new = create_endpoint_at(&app, &both, &receiver.url("/new")).await;
    let [old_endpoint, new_endpoint] =
        next_event_at(&app, &receiver, &["/old", "/new"]).await.try_into().unwrap();
    assert_eq!(signatures_verified_by(&secret_of(&sealed_old), &old_endpoint), [true]);
    assert_eq!(signatures_verified_by(&secret_of(&sealed_new), &new_endpoint), [true]);
    let rotated = rotate_at(&app, &both, &sealed_old).await;
    assert!(rotated["previous_secret_expires_at"].is_string(), "the old secret keeps signing: {rotated}");
    let [after_rotation] = next_event_at(&app, &receiver, &["/old"]).await.try_into().unwrap();
    assert_eq!(signatures_verified_by(&secret_of(&rotated), &after_rotation), [true, false]);
    assert_eq!(signatures_verified_by(&secret_of(&sealed_old), &after_rotation), [false, true]);
    let failed =
        app.count("SELECT count(*) AS count FROM webhook_delivery_attempts WHERE error IS NOT NULL").await;
    assert_eq!(failed, 0, "no attempt failed");
}

#[tokio::test]
async fn resealing_under_the_new_key_then_dropping_the_old_one_keeps_every_endpoint_receiving() {
    let app = spawn_app().await;
    let receiver = Receiver::ok().await;
    let (old_key, next_key) = (new_encryption_key(), new_encryption_key());
    let mut old = keyed_service(&app, &old_key, None).await;
    let plain = create_endpoint_at(&app, &old, &receiver.url("/plain")).await;
    let first = create_endpoint_at(&app, &old, &receiver.url("/rotated")).await;
    // Mid-rotation: a current and a previous secret, both under the old key.
    let rotated = rotate_at(&app, &old, &first).await;
    old.kill();

    let both = format!("{next_key},{old_key}");
    let env = [("ORDERPAY_ENCRYPTION_KEY", both.as_str())];
    let resealed = app.cli_with(&["secrets", "reseal", "--json", "--batch-size", "1"], &env).await;
    assert!(resealed.status.success(), "{}", String::from_utf8_lossy(&resealed.stderr));
    let report: Value = serde_json::from_slice(&resealed.stdout).unwrap();
    assert_eq!((report["resealed"].as_u64(), report["current"].as_u64()), (Some(2), Some(0)), "{report}");
    assert_eq!(report["unreadable"], json!([]));
    let again = app.cli_with(&["secrets", "reseal", "--json"], &env).await;
    let report: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (report["resealed"].as_u64(), report["current"].as_u64()),
        (Some(0), Some(2)),
        "idempotent: {report}"
    );

    // The old key dropped: everything signs as before, the rotated endpoint with both secrets.
    let _new = keyed_service(&app, &next_key, None).await;
    let [to_plain, to_rotated] =
        next_event_at(&app, &receiver, &["/plain", "/rotated"]).await.try_into().unwrap();
    assert_eq!(signatures_verified_by(&secret_of(&plain), &to_plain), [true]);
    assert_eq!(signatures_verified_by(&secret_of(&rotated), &to_rotated), [true, false]);
    assert_eq!(signatures_verified_by(&secret_of(&first), &to_rotated), [false, true]);
    let keyless = app.cli(&["secrets", "reseal"]).await;
    assert!(!keyless.status.success(), "without ORDERPAY_ENCRYPTION_KEY it refuses");
}

#[tokio::test]
async fn a_secret_that_opens_under_no_key_is_a_clear_error_on_its_endpoint_and_a_rotation_signs_again() {
    let app = spawn_app().await;
    let receiver = Receiver::ok().await;
    let mut made = keyed_service(&app, &new_encryption_key(), None).await;
    let endpoint = create_endpoint_at(&app, &made, &receiver.url("/hook")).await;
    made.kill();

    // Started with another key alone: it says so at start, and every delivery to the endpoint
    // fails with an error that says what to do, counted.
    let log = std::env::temp_dir().join(format!("orderpay-wrong-key-{}.log", uuid::Uuid::now_v7()));
    let wrong = keyed_service(&app, &new_encryption_key(), Some(&log)).await;
    let started = wait_for("the start's check", Duration::from_secs(10), async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("opens under no key").then_some(text)
    })
    .await;
    assert!(started.contains(&id_of(&endpoint)), "{started}");
    app.create_order().await;
    let failing = wait_for("the endpoint is failing", Duration::from_secs(15), async || {
        let listed = app.cli_json(&["webhooks", "failing"]).await;
        listed.as_array().unwrap().first().cloned()
    })
    .await;
    assert_eq!(failing["endpoint_id"], id_of(&endpoint).as_str());
    let error = failing["last_error"].as_str().unwrap();
    assert!(
        error.contains("opens under no key of ORDERPAY_ENCRYPTION_KEY") && error.contains("rotate"),
        "{error}"
    );
    assert!(receiver.received().is_empty(), "nothing was sent unsigned");
    let metrics =
        app.client.get(format!("{}/metrics", wrong.address)).send().await.unwrap().text().await.unwrap();
    let counted: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("orderpay_webhook_secret_errors_total "))
        .expect("the counter")
        .parse()
        .unwrap();
    assert!(counted >= 1.0, "{metrics}");

    // A rotation answers 200 only because deliveries can be signed again: the old secret cannot
    // sign beside the new one, so there is no overlap, and the next attempt is signed.
    let rotated = rotate_at(&app, &wrong, &endpoint).await;
    assert_eq!(rotated["previous_secret_expires_at"], Value::Null, "{rotated}");
    let delivered = delivery_when(&app, &id_of(&endpoint), "delivered", Duration::from_secs(15)).await;
    assert!(delivered.attempts >= 2);
    let request = receiver.received().pop().unwrap();
    assert_eq!(signatures_verified_by(&secret_of(&rotated), &request), [true], "the new secret alone");
    drop(wrong);
    let _ = std::fs::remove_file(&log);
}

// ---------------------------------------------------------------------------------------------
// Where webhooks may go

const NOT_PUBLIC: [&str; 5] = [
    "http://127.0.0.1:8080/hook",
    "http://10.0.0.1/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://[::1]:9000/hook",
    "http://localhost:9000/hook",
];

fn private_addresses_refused(webhooks: &mut WebhookSettings) {
    webhooks.allow_private = false;
}

#[tokio::test]
async fn urls_at_non_public_addresses_are_refused_unless_allowed_and_unknown_names_are_accepted() {
    let app = webhooks_app(private_addresses_refused).await;
    for url in NOT_PUBLIC {
        let key = new_key();
        let response = post_endpoint(&app, &json!({"url": url, "enabled_events": ["*"]}), Some(&key)).await;
        let problem = assert_problem(response, 422, "webhook-url-not-allowed").await;
        assert!(problem["detail"].as_str().unwrap().contains("public addresses only"), "{problem}");
    }
    assert_eq!(app.count("SELECT count(*) AS count FROM webhook_endpoints").await, 0, "nothing stored");
    assert_eq!(app.keys_stored().await, 0, "nor their keys");
    let unknown = create_endpoint(&app, "https://does-not-exist.invalid/hook", &["*"]).await;
    assert_eq!(unknown["url"], "https://does-not-exist.invalid/hook");

    let allowed = webhooks_app(|_| {}).await;
    for url in NOT_PUBLIC {
        create_endpoint(&allowed, url, &["*"]).await;
    }
}

#[tokio::test]
async fn documentation_and_translated_addresses_are_refused_like_the_other_reserved_ranges() {
    let app = webhooks_app(private_addresses_refused).await;
    for (url, reason) in [
        ("https://192.0.2.10/hook", "a documentation address"),
        ("https://198.51.100.10/hook", "a documentation address"),
        ("https://203.0.113.10/hook", "a documentation address"),
        ("https://[2001:db8::10]/hook", "a documentation address"),
        ("https://[3fff:0:1::10]/hook", "a documentation address"),
        ("https://[::ffff:0:808:808]/hook", "a translated address"),
        ("https://[64:ff9b:1::808:808]/hook", "a translated address"),
        ("https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook", "a translated address"),
    ] {
        let response =
            post_endpoint(&app, &json!({"url": url, "enabled_events": ["*"]}), Some(&new_key())).await;
        let problem = assert_problem(response, 422, "webhook-url-not-allowed").await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(reason) && detail.contains("public addresses only"), "{url}: {problem}");
    }
    assert_eq!(app.count("SELECT count(*) AS count FROM webhook_endpoints").await, 0, "nothing stored");
    assert_eq!(app.keys_stored().await, 0, "nor their keys");
}

#[tokio::test]
async fn new_http_urls_are_refused_while_endpoints_made_before_keep_receiving_flagged_insecure() {
    let app = webhooks_app(|webhooks| webhooks.require_https = true).await;
    let receiver = Receiver::ok().await;
    let http = json!({"url": receiver.url("/hook"), "enabled_events": ["order.created"]});
    let refused = post_endpoint(&app, &http, Some(&new_key())).await;
    let problem = assert_problem(refused, 422, "webhook-url-not-allowed").await;
    assert!(problem["detail"].as_str().unwrap().contains("https URLs only"), "{problem}");
    assert_eq!(app.count("SELECT count(*) AS count FROM webhook_endpoints").await, 0, "nothing stored");
    assert_eq!(app.keys_stored().await, 0, "nor its key");

    // An https endpoint is accepted and secure; one registered over http before https was
    // required (its stored URL set back to the receiver's plain http) keeps receiving.
    let secure = create_endpoint(&app, "https://shop.example.com/hook", &["order.paid"]).await;
    assert_eq!(secure["insecure"], false, "{secure}");
    let legacy =
        create_endpoint(&app, &receiver.url("/hook").replace("http:", "https:"), &["order.created"]).await;
    assert_eq!(legacy["insecure"], false);
    app.execute(&format!(
        "UPDATE webhook_endpoints SET url = '{}' WHERE id = '{}'",
        receiver.url("/hook"),
        id_of(&legacy)
    ))
    .await;
    let listed = app.get_json("/webhook_endpoints").await;
    let flags: BTreeMap<String, Value> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|endpoint| (id_of(endpoint), endpoint["insecure"].clone()))
        .collect();
    assert_eq!(flags, BTreeMap::from([(id_of(&secure), json!(false)), (id_of(&legacy), json!(true))]));
    assert_eq!(app.get_json(&format!("/webhook_endpoints/{}", id_of(&legacy))).await["insecure"], true);
    app.create_order().await;
    let delivery = delivery_when(&app, &id_of(&legacy), "delivered", Duration::from_secs(10)).await;
    assert_eq!(delivery.attempts, 1);
    assert!(verifies(&secret_of(&legacy), &receiver.received()[0]), "signed as any other");

    // A service starting with such an endpoint says so, naming it.
    let log = std::env::temp_dir().join(format!("orderpay-insecure-{}.log", uuid::Uuid::now_v7()));
    let env = [("ORDERPAY_ENCRYPTION_KEY", new_encryption_key()), ("RUST_LOG", "warn".to_owned())];
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let service =
        ServiceProcess::start_logging_to(&app.database_url, &app.provider.address, &env, Some(&log)).await;
    let logged = wait_for("the warning about the http endpoint", Duration::from_secs(10), async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("plain http URLs").then_some(text)
    })
    .await;
    drop(service);
    let _ = std::fs::remove_file(&log);
    let line = logged.lines().find(|line| line.contains("plain http URLs")).unwrap();
    assert!(
        line.contains("WARN") && line.contains(&id_of(&legacy)) && !line.contains(&id_of(&secure)),
        "{line}"
    );
}

#[tokio::test]
async fn a_delivery_to_a_name_now_resolving_to_loopback_is_refused_at_connect_time_and_sends_nothing() {
    let app = webhooks_app(private_addresses_refused).await;
    let receiver = Receiver::ok().await;
    // Accepted while the names resolved nowhere; then they point at the receiver (as a name can
    // change what it resolves to after creation).
    let by_name = create_endpoint(&app, "https://does-not-exist.invalid/name", &["order.created"]).await;
    let by_address =
        create_endpoint(&app, "https://does-not-exist.invalid/address", &["order.created"]).await;
    let port = receiver.port();
    for (endpoint, url) in
        [(&by_name, format!("http://localhost:{port}/name")), (&by_address, receiver.url("/address"))]
    {
        app.execute(&format!("UPDATE webhook_endpoints SET url = '{url}' WHERE id = '{}'", id_of(endpoint)))
            .await;
    }
    app.create_order().await;

    for (endpoint, reason) in
        [(&by_name, "localhost resolves to 127.0.0.1"), (&by_address, "127.0.0.1 is a loopback")]
    {
        let delivery = wait_for("a failed attempt", Duration::from_secs(10), async || {
            deliveries(&app, &id_of(endpoint))
                .await
                .into_iter()
                .find(|row| row.attempts >= 1 && row.last_error.is_some())
        })
        .await;
        assert_eq!(delivery.status, "pending", "to be retried");
        let attempts = attempts(&app, &delivery.id).await;
        assert_eq!(attempts[0].http_status, None);
        let error = attempts[0].error.clone().unwrap();
        assert!(error.contains(reason) && error.contains("public addresses only"), "{error}");
    }
    assert!(receiver.received().is_empty(), "nothing reached the receiver");
}

// ---------------------------------------------------------------------------------------------
// The endpoints API

#[tokio::test]
async fn endpoints_are_created_listed_read_and_deleted_within_their_account() {
    let app = webhooks_app(|_| {}).await;
    let first = create_endpoint(&app, "https://example.com/one", &["*"]).await;
    let second = create_endpoint(&app, "https://example.com/two", &["order.paid", "refund.succeeded"]).await;
    assert_eq!(second["object"], "webhook_endpoint");
    assert_eq!(second["enabled_events"], json!(["order.paid", "refund.succeeded"]));
    assert_eq!(second["description"], Value::Null);
    let (first_id, second_id) = (id_of(&first), id_of(&second));

    let page = app.get_json("/webhook_endpoints?limit=1").await;
    assert_eq!(page["object"], "list");
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["id"], second_id.as_str(), "newest first");
    assert!(page["data"][0].get("secret").is_none(), "lists never show secrets");
    let rest = app.get_json(&format!("/webhook_endpoints?starting_after={second_id}")).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["data"][0]["id"], first_id.as_str());
    let mut shown = first.clone();
    shown.as_object_mut().unwrap().remove("secret");
    assert_eq!(app.get_json(&format!("/webhook_endpoints/{first_id}")).await, shown);

    // Another account sees none of it.
    let (_, other_key) = app.create_account("someone else").await;
    let as_other =
        |method: Method, path: String| app.client.request(method, app.url(&path)).bearer_auth(&other_key);
    let foreign = as_other(Method::GET, format!("/webhook_endpoints/{first_id}")).send().await.unwrap();
    assert_problem(foreign, 404, "not-found").await;
    let foreign = as_other(Method::DELETE, format!("/webhook_endpoints/{first_id}")).send().await.unwrap();
    assert_problem(foreign, 404, "not-found").await;
    let rotate =
        as_other(Method::POST, format!("/webhook_endpoints/{first_id}/rotate_secret")).send().await.unwrap();
    assert_problem(rotate, 404, "not-found").await;
    let theirs = as_other(Method::GET, "/webhook_endpoints".to_owned()).send().await.unwrap();
    assert_eq!(json(theirs).await["data"], json!([]));

    let deleted =
        app.request(Method::DELETE, &format!("/webhook_endpoints/{first_id}")).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(json(deleted).await, json!({"id": first_id, "object": "webhook_endpoint", "deleted": true}));
    for path in [format!("/webhook_endpoints/{first_id}"), "/webhook_endpoints/not-an-id".to_owned()] {
        assert_problem(app.request(Method::GET, &path).send().await.unwrap(), 404, "not-found").await;
    }
    let again = app.request(Method::DELETE, &format!("/webhook_endpoints/{first_id}")).send().await.unwrap();
    assert_problem(again, 404, "not-found").await;
    let listed = app.get_json("/webhook_endpoints").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    let secrets_left = app
        .count(&format!(
            "SELECT count(*) AS count FROM webhook_endpoints WHERE id = '{first_id}' AND secret IS NULL"
        ))
        .await;
    assert_eq!(secrets_left, 1, "a deleted endpoint keeps no secret");
    let bad_cursor = app.request(Method::GET, "/webhook_endpoints?starting_after=x").send().await.unwrap();
    assert_problem(bad_cursor, 400, "invalid-parameter").await;
    let patch = app.request(Method::PATCH, &format!("/webhook_endpoints/{second_id}")).send().await.unwrap();
    assert_problem(patch, 405, "method-not-allowed").await;
}

#[tokio::test]
async fn invalid_endpoints_are_refused_field_by_field_and_store_nothing() {
    let app = webhooks_app(|_| {}).await;
    let cases = [
        (
            json!({"url": "https://example.com", "enabled_events": ["order.paid", "order.shipped"]}),
            "enabled_events[1]",
        ),
        (json!({"url": "https://example.com", "enabled_events": []}), "enabled_events"),
        (json!({"url": "https://example.com", "enabled_events": ["*", "order.paid"]}), "enabled_events"),
        (
            json!({"url": "https://example.com", "enabled_events": ["order.paid", "order.paid"]}),
            "enabled_events[1]",
        ),
        (json!({"url": "ftp://example.com/x", "enabled_events": ["*"]}), "url"),
        (json!({"url": "not a url", "enabled_events": ["*"]}), "url"),
        (json!({"url": "https://user:pw@example.com/", "enabled_events": ["*"]}), "url"),
        (
            json!({"url": "https://example.com", "enabled_events": ["*"], "description": "x".repeat(501)}),
            "description",
        ),
        (
            json!({"url": "https://example.com", "enabled_events": ["*"], "description": "a\u{7}b"}),
            "description",
        ),
        (json!({"url": 5, "enabled_events": ["*"]}), "url"),
        (json!({"enabled_events": ["*"]}), "url"),
        (json!({"url": "https://example.com"}), "enabled_events"),
        (json!({"url": "https://example.com", "enabled_events": ["*"], "secret": "mine"}), "secret"),
    ];
    for (body, field) in cases {
        let response = post_endpoint(&app, &body, Some(&new_key())).await;
        let problem = assert_problem(response, 422, "validation-failed").await;
        let fields: Vec<&str> =
            problem["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
        assert!(fields.contains(&field), "{body}: {problem}");
    }
    let not_json = app
        .request(Method::POST, "/webhook_endpoints")
        .header("Content-Type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_problem(not_json, 400, "malformed-json").await;
    let rotate_body = create_endpoint(&app, "https://example.com/x", &["*"]).await;
    let rotate = app
        .request(Method::POST, &format!("/webhook_endpoints/{}/rotate_secret", id_of(&rotate_body)))
        .json(&json!({"expires_in": 5}))
        .send()
        .await
        .unwrap();
    assert_problem(rotate, 422, "validation-failed").await;
    assert_eq!(app.count("SELECT count(*) AS count FROM webhook_endpoints").await, 1);
    assert_eq!(app.keys_stored().await, 0);
}

#[tokio::test]
async fn creating_an_endpoint_is_idempotent_like_an_order() {
    let app = webhooks_app(|_| {}).await;
    let body = json!({"url": "https://example.com/hook", "enabled_events": ["order.created"]});
    let key = new_key();
    let first = post_endpoint(&app, &body, Some(&key)).await;
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let created = json(first).await;
    assert_eq!(location, format!("/webhook_endpoints/{}", id_of(&created)));
    let replay = post_endpoint(&app, &body, Some(&key)).await;
    assert_eq!(replay.headers()["location"], location.as_str());
    assert_eq!(replay.headers()["idempotency-key"], key.as_str());
    let mut expected = created.clone();
    expected["secret"] = Value::Null;
    assert_eq!(json(replay).await, expected, "the same answer, without the secret");

    let other_body = json!({"url": "https://example.com/other", "enabled_events": ["order.created"]});
    let reused = post_endpoint(&app, &other_body, Some(&key)).await;
    assert_problem(reused, 422, "idempotency-key-reused").await;

    // Copies racing each other make one endpoint.
    let racing_key = new_key();
    let copies =
        futures::future::join_all((0..8).map(|_| post_endpoint(&app, &body, Some(&racing_key)))).await;
    let mut made = BTreeMap::new();
    for copy in copies {
        let status = copy.status().as_u16();
        assert!(status == 201 || status == 409, "{status}");
        if status == 201 {
            *made.entry(id_of(&json(copy).await)).or_insert(0) += 1;
        }
    }
    assert_eq!(made.len(), 1, "one endpoint for eight copies: {made:?}");
    assert_eq!(app.count("SELECT count(*) AS count FROM webhook_endpoints").await, 2);
}

#[tokio::test]
async fn deleting_an_endpoint_stops_its_pending_deliveries() {
    let app = app_with_delivery(|delivery| {
        delivery.retry_base = Duration::from_millis(100);
        delivery.retry_cap = Duration::from_millis(100);
        delivery.max_attempts = 100;
    })
    .await;
    let failing = Receiver::start(|_, _| Answer::Status(500)).await;
    let healthy = Receiver::ok().await;
    let doomed = create_endpoint(&app, &failing.url("/hook"), &["order.created"]).await;
    app.create_order().await;
    wait_for("a failed attempt", Duration::from_secs(10), async || {
        (failing.received().len() >= 2).then_some(())
    })
    .await;
    let deleted =
        app.request(Method::DELETE, &format!("/webhook_endpoints/{}", id_of(&doomed))).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    let rows = deliveries(&app, &id_of(&doomed)).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "canceled");
    assert_eq!(rows[0].next_attempt_at, None);
    let sent_before = failing.received().len();

    // A live endpoint's new event goes through several of the deleted one's retry periods.
    let live = create_endpoint(&app, &healthy.url("/hook"), &["order.created"]).await;
    for _ in 0..3 {
        app.create_order().await;
    }
    delivery_when(&app, &id_of(&live), "delivered", Duration::from_secs(10)).await;
    wait_for("the live endpoint has its three events", Duration::from_secs(10), async || {
        (healthy.received().len() == 3).then_some(())
    })
    .await;
    // At most a send already in flight when it was deleted arrived after.
    assert!(failing.received().len() <= sent_before + 1, "the deleted endpoint got nothing more");
    assert_eq!(deliveries(&app, &id_of(&doomed)).await.len(), 1, "and no new deliveries");
}

/// A relay round that writes its deliveries with the webhooks relay's own code, then waits to
/// commit until the test lets it. It keeps its progress in the `nats` cursor (no NATS relay runs
/// in the test app), so that the app's own webhooks relay, kept out by the test holding its
/// lock, cannot hand the event on first.
struct HeldRound {
    relay: orderpay::merchant_webhooks::relay::WebhookRelay,
    written: watch::Sender<bool>,
    release: watch::Receiver<bool>,
}

impl orderpay::events::relay::Relay for HeldRound {
    const NAME: &'static str = "nats";

    async fn hand_on(
        &self,
        conn: &mut diesel_async::AsyncPgConnection,
        batch: &[orderpay::events::Event],
    ) -> anyhow::Result<()> {
        self.relay.hand_on(conn, batch).await?;
        self.written.send_replace(true);
        let mut release = self.release.clone();
        let _ = release.wait_for(|released| *released).await;
        Ok(())
    }
}

#[tokio::test]
async fn deleting_an_endpoint_while_the_relay_writes_its_deliveries_cancels_those_too() {
    // The worst interleaving on purpose: a relay round has taken the endpoint (FOR SHARE) and
    // written its delivery, uncommitted, when the DELETE comes; the DELETE waits for the round,
    // which then commits. The delivery the DELETE did not see when it started must be canceled.
    use diesel_async::RunQueryDsl;
    let app = webhooks_app(|_| {}).await;
    let mut webhooks_relay = app.db().await;
    diesel::sql_query("BEGIN").execute(&mut webhooks_relay).await.unwrap();
    diesel::sql_query("SELECT pg_advisory_xact_lock(hashtextextended('orderpay.relay.webhooks', 0))")
        .execute(&mut webhooks_relay)
        .await
        .unwrap();
    let endpoint = create_endpoint(&app, "http://127.0.0.1:9/hook", &["order.created"]).await;
    app.create_order().await;

    let (written, mut is_written) = watch::channel(false);
    let (release, released) = watch::channel(false);
    let round = {
        let pool = orderpay::db::background_pool(&app.settings.database, 2);
        let wake = Arc::new(tokio::sync::Notify::new());
        let relay = orderpay::merchant_webhooks::relay::WebhookRelay::new(wake);
        let held = HeldRound { relay, written, release: released };
        tokio::spawn(async move {
            // Rounds see only events older than every running transaction of the server.
            while orderpay::events::relay::round(&pool, &held, 100).await.unwrap() == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::timeout(Duration::from_secs(10), is_written.wait_for(|written| *written))
        .await
        .expect("the round wrote its delivery")
        .unwrap();
    let deleting = {
        let request = app.request(Method::DELETE, &format!("/webhook_endpoints/{}", id_of(&endpoint)));
        tokio::spawn(request.send())
    };
    let waiting = "SELECT count(*) AS count FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND query LIKE '%webhook_endpoints%' AND pid <> pg_backend_pid()";
    wait_for("the DELETE waits for the round", Duration::from_secs(10), async || {
        (app.count(waiting).await == 1).then_some(())
    })
    .await;
    release.send_replace(true);
    round.await.unwrap();
    let deleted = deleting.await.unwrap().unwrap();
    assert_eq!(deleted.status(), 200);

    let rows = deliveries(&app, &id_of(&endpoint)).await;
    assert_eq!(rows.len(), 1, "the round's delivery: {rows:?}");
    assert_eq!(rows[0].status, "canceled", "{rows:?}");
    assert_eq!(rows[0].next_attempt_at, None);
}

#[tokio::test]
async fn without_an_encryption_key_there_are_no_webhook_endpoints() {
    let app = spawn_app().await;
    let response =
        post_endpoint(&app, &json!({"url": "https://example.com", "enabled_events": ["*"]}), None).await;
    assert_problem(response, 404, "route-not-found").await;
    let listed = app.request(Method::GET, "/webhook_endpoints").send().await.unwrap();
    assert_problem(listed, 404, "route-not-found").await;
    app.create_order().await;
    assert_eq!(app.count("SELECT count(*) AS count FROM webhook_deliveries").await, 0);
}

#[test]
fn serve_refuses_a_malformed_encryption_key_and_lists_the_webhook_settings() {
    let output = std::process::Command::new(BIN)
        .args(["serve"])
        .env("ORDERPAY_ENCRYPTION_KEY", "not-32-bytes")
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .expect("orderpay runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ORDERPAY_ENCRYPTION_KEY must be the base64 of 32"), "{stderr}");
    assert!(!stderr.contains("not-32-bytes"), "the key is not echoed: {stderr}");

    let help = std::process::Command::new(BIN).args(["serve", "--help"]).output().expect("orderpay runs");
    let help = String::from_utf8(help.stdout).unwrap();
    for variable in [
        "ORDERPAY_ENCRYPTION_KEY",
        "ORDERPAY_WEBHOOK_ALLOW_PRIVATE",
        "ORDERPAY_WEBHOOK_REQUIRE_HTTPS",
        "ORDERPAY_WEBHOOK_TIMEOUT_MS",
        "ORDERPAY_WEBHOOK_LEASE_MS",
        "ORDERPAY_WEBHOOK_RETRY_BASE_MS",
        "ORDERPAY_WEBHOOK_RETRY_CAP_MS",
        "ORDERPAY_WEBHOOK_MAX_ATTEMPTS",
        "ORDERPAY_WEBHOOK_POLL_MS",
        "ORDERPAY_WEBHOOK_CONCURRENCY",
        "ORDERPAY_WEBHOOK_SECRET_OVERLAP_MS",
    ] {
        assert!(help.contains(variable), "{variable} missing from:\n{help}");
    }
}

// ---------------------------------------------------------------------------------------------
// Operator commands

#[tokio::test]
async fn operators_redeliver_an_event_to_its_endpoints_or_one_of_them() {
    let app = webhooks_app(|_| {}).await;
    let receiver = Receiver::ok().await;
    let everything = create_endpoint(&app, &receiver.url("/all"), &["*"]).await;
    let paid_only = create_endpoint(&app, &receiver.url("/paid"), &["order.paid"]).await;
    app.create_order().await;
    let event_id = event_ids(&app).await[0].clone();
    delivery_when(&app, &id_of(&everything), "delivered", Duration::from_secs(10)).await;
    assert_eq!(receiver.received().len(), 1);

    let queued = app.cli_json(&["events", "redeliver", &event_id]).await;
    let queued = queued.as_array().unwrap();
    assert_eq!(queued.len(), 1, "the endpoints that receive order.created: {queued:?}");
    assert_eq!(queued[0]["endpoint_id"], id_of(&everything).as_str());
    assert_eq!(queued[0]["event_type"], "order.created");
    assert_eq!(queued[0]["url"], receiver.url("/all").as_str());
    wait_for("the event arrived again", Duration::from_secs(10), async || {
        (receiver.received_at("/all").len() == 2).then_some(())
    })
    .await;
    assert_eq!(receiver.webhook_ids("/all"), BTreeSet::from([event_id.clone()]), "with the same webhook-id");

    let table = app.cli(&["events", "redeliver", &event_id, "--endpoint", &id_of(&everything)]).await;
    assert!(table.status.success());
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.starts_with("DELIVERY") && table.contains(&id_of(&everything)), "{table}");
    wait_for("and again, to that endpoint", Duration::from_secs(10), async || {
        (receiver.received_at("/all").len() == 3).then_some(())
    })
    .await;

    let refused = app.cli(&["events", "redeliver", &event_id, "--endpoint", &id_of(&paid_only)]).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("does not receive order.created events"));
    let unknown = app.cli(&["events", "redeliver", &uuid::Uuid::now_v7().to_string()]).await;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no event"));
    assert!(receiver.received_at("/paid").is_empty());
}

#[tokio::test]
async fn operators_see_the_endpoints_whose_deliveries_fail() {
    let app = app_with_delivery(|delivery| {
        delivery.retry_base = Duration::from_secs(60);
        delivery.retry_cap = Duration::from_secs(60);
    })
    .await;
    let failing = Receiver::start(|_, _| Answer::Status(503)).await;
    let healthy = Receiver::ok().await;
    let broken = create_endpoint(&app, &failing.url("/hook"), &["order.created"]).await;
    let fine = create_endpoint(&app, &healthy.url("/hook"), &["order.created"]).await;
    app.create_order().await;
    app.create_order().await;
    wait_for("both deliveries failed once", Duration::from_secs(10), async || {
        let rows = deliveries(&app, &id_of(&broken)).await;
        (rows.len() == 2 && rows.iter().all(|row| row.last_status == Some(503))).then_some(())
    })
    .await;
    delivery_when(&app, &id_of(&fine), "delivered", Duration::from_secs(10)).await;

    let listed = app.cli_json(&["webhooks", "failing"]).await;
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "the failing endpoint alone: {listed:?}");
    let row = &listed[0];
    assert_eq!(row["endpoint_id"], id_of(&broken).as_str());
    assert_eq!(row["account_id"], app.account_id.to_string().as_str());
    assert_eq!(row["url"], failing.url("/hook").as_str());
    assert_eq!(row["failing_deliveries"], 2);
    assert_eq!(row["gave_up"], 0);
    assert_eq!(row["last_status"], 503);
    assert_eq!(row["last_error"], "HTTP 503");
    let next: DateTime<Utc> = row["next_attempt_at"].as_str().unwrap().parse().unwrap();
    assert!(next > Utc::now() + chrono::Duration::seconds(20), "retried after its backoff: {next}");
    assert!(row["failing_since"].as_str().unwrap().parse::<DateTime<Utc>>().is_ok());

    // Given up on: still failing until a later delivery of the same event succeeds.
    app.execute(
        "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL WHERE last_status = 503",
    )
    .await;
    let table = app.cli(&["webhooks", "failing"]).await;
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.starts_with("ENDPOINT") && table.contains(&id_of(&broken)) && table.contains("HTTP 503"),
        "{table}"
    );
    assert_eq!(app.cli_json(&["webhooks", "failing"]).await[0]["gave_up"], 2);
    failing.script(|_, _| Answer::Status(200));
    let event_id = event_ids(&app).await[0].clone();
    app.cli_json(&["events", "redeliver", &event_id, "--endpoint", &id_of(&broken)]).await;
    wait_for("the redelivery made up for one", Duration::from_secs(10), async || {
        let listed = app.cli_json(&["webhooks", "failing"]).await;
        (listed[0]["failing_deliveries"] == 1).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_endpoint_can_subscribe_to_every_event_type_one_by_one_and_all_at_once() {
    let app = webhooks_app(|_| {}).await;
    let every: Vec<&str> = orderpay::events::EventType::ALL.iter().map(|kind| kind.as_str()).collect();
    for kind in &every {
        let endpoint = create_endpoint(&app, "https://shop.example.com/hooks", &[kind]).await;
        assert_eq!(endpoint["enabled_events"], json!([kind]));
    }
    let endpoint = create_endpoint(&app, "https://shop.example.com/hooks", &every).await;
    assert_eq!(endpoint["enabled_events"].as_array().unwrap().len(), every.len());
}
