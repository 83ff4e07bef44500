//! The NATS JetStream relay against the NATS this machine runs at 127.0.0.1:4222 (`make test`
//! starts one): every event lands in the stream once, in transaction order, with its subject,
//! `Nats-Msg-Id` and payload; a SIGKILL between the PubAcks and the cursor's commit; NATS away at
//! start and in the middle, through the fault proxy; a backlog drained, and measured. Each test
//! has a stream and a subject prefix of its own, deleted when it ends.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::{self, message::StreamMessage};
use diesel_async::AsyncPgConnection;
use futures::StreamExt;
use orderpay::events::Event;
use orderpay::events::nats::{ACCOUNT_HEADER, DUPLICATE_WINDOW, NatsConfig, NatsError, NatsRelay};
use orderpay::events::relay::Relay;
use orderpay::events::repository::{self, Cursor};
use uuid::Uuid;

use crate::helpers::{self, TestApp, order_body, spawn_app, spawn_app_with};
use crate::process::ServiceProcess;
use crate::proxy::ChaosProxy;

/// The machine's NATS (with JetStream).
const NATS: &str = "127.0.0.1:4222";
/// How long a test waits for the relay to catch up before it fails.
const CATCH_UP_MS: u64 = 30_000;
/// The relay's publish/ack timeout in these tests (`ORDERPAY_NATS_TIMEOUT_MS`).
const RELAY_TIMEOUT_MS: u64 = 1_000;
/// How long NATS is cut off in the outage test, while orders keep coming.
const OUTAGE_MS: u64 = 1_500;
/// Events in the measured backlog (`NATS_BACKLOG_EVENTS` overrides).
const BACKLOG_EVENTS: i64 = 20_000;

/// A stream and subject prefix of the test's own, on the machine's NATS; deleted on drop.
struct TestStream {
    name: String,
    prefix: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    /// `None`, with a message saying so, when no NATS answers here.
    async fn new() -> Option<TestStream> {
        let connected = tokio::time::timeout(Duration::from_secs(2), async_nats::connect(NATS)).await;
        let Ok(Ok(client)) = connected else {
            eprintln!("skipped: no NATS at {NATS}; install nats-server and start `nats-server -js`");
            return None;
        };
        let suffix = Uuid::now_v7().simple().to_string();
        Some(TestStream {
            name: format!("ORDERPAY_TEST_{suffix}"),
            prefix: format!("orderpay_test.{suffix}"),
            jetstream: jetstream::new(client),
        })
    }

    /// The relay's settings for this stream, through `url` (NATS itself or a proxy).
    fn config(&self, url: &str) -> NatsConfig {
        NatsConfig::parse(url, &self.name, &self.prefix, Duration::from_millis(RELAY_TIMEOUT_MS)).unwrap()
    }

    /// The same for an `orderpay serve` subprocess.
    fn env(&self, url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("ORDERPAY_NATS_URL", url.to_owned()),
            ("ORDERPAY_NATS_STREAM", self.name.clone()),
            ("ORDERPAY_NATS_SUBJECT_PREFIX", self.prefix.clone()),
            ("ORDERPAY_NATS_TIMEOUT_MS", RELAY_TIMEOUT_MS.to_string()),
            ("ORDERPAY_RELAY_INTERVAL_MS", "20".to_owned()),
        ]
    }

    /// The stream's state: messages held and the last sequence given (zeros before it exists).
    async fn state(&self) -> (u64, u64) {
        match self.jetstream.get_stream(&self.name).await {
            Ok(mut stream) => {
                let state = &stream.info().await.expect("stream info").state;
                (state.messages, state.last_sequence)
            }
            Err(_) => (0, 0),
        }
    }

    /// Every message, by sequence.
    async fn messages(&self) -> Vec<StreamMessage> {
        let stream = self.jetstream.get_stream(&self.name).await.expect("the stream exists");
        let (_, last) = self.state().await;
        let mut messages = Vec::new();
        for sequence in 1..=last {
            messages.push(stream.get_raw_message(sequence).await.expect("message by sequence"));
        }
        messages
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        // Drop cannot await and the test's runtime may be shutting down: a thread of its own.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let client = async_nats::connect(NATS).await.ok()?;
                jetstream::new(client).delete_stream(&name).await.ok()
            })
        })
        .join();
    }
}

/// A header's value, or "" without it.
fn header<'a>(message: &'a StreamMessage, name: &str) -> &'a str {
    message.headers.get(name).map_or("", |value| value.as_str())
}

/// Polls `check` until it holds, failing after `CATCH_UP_MS`.
async fn wait_until(what: &str, check: impl AsyncFnMut() -> bool) {
    helpers::wait_until(what, Duration::from_millis(CATCH_UP_MS), check).await
}

impl TestApp {
    /// Every event of the database (every account), in transaction order. The relay's read
    /// holds back events newer than the server's oldest open transaction, and other tests' open
    /// transactions count too: polled until every written event is readable.
    async fn events_in_order(&self) -> Vec<Event> {
        let written = self.count("SELECT count(*) AS count FROM events").await as usize;
        let mut conn = self.db().await;
        let start = Cursor { txid: "0".to_owned(), seq: 0 };
        let mut events = Vec::new();
        wait_until("every written event is readable in order", async || {
            events = repository::read_after(&mut conn, &start, 1_000_000).await.expect("events").0;
            events.len() == written
        })
        .await;
        events
    }

    /// Where the NATS relay's cursor stands (`seq` of the last event it handed on).
    async fn nats_cursor(&self) -> i64 {
        self.count("SELECT seq AS count FROM relay_cursors WHERE relay = 'nats'").await
    }

    /// Whether the NATS relay has handed on every event written so far.
    async fn nats_caught_up(&self) -> bool {
        let last = self.count("SELECT coalesce(max(seq), 0) AS count FROM events").await;
        self.nats_cursor().await == last
    }
}

/// Asserts that the stream holds `events` exactly once each, in their order, each on its
/// subject with its id and account in the headers and `Event::to_json` as its payload.
async fn assert_stream_holds_once(stream: &TestStream, events: &[Event]) {
    let messages = stream.messages().await;
    assert_eq!(messages.len(), events.len(), "one message per event, no more");
    let ids: HashSet<&str> = messages.iter().map(|message| header(message, "Nats-Msg-Id")).collect();
    assert_eq!(ids.len(), events.len(), "every Nats-Msg-Id once");
    for (message, event) in messages.iter().zip(events) {
        assert_eq!(header(message, "Nats-Msg-Id"), event.id.to_string(), "in transaction order");
        assert_eq!(message.subject.as_str(), format!("{}.{}", stream.prefix, event.event_type.as_str()));
        assert_eq!(header(message, ACCOUNT_HEADER), event.account_id.to_string());
        assert_eq!(message.payload.as_ref(), event.to_json().as_slice());
    }
}

#[tokio::test]
async fn every_event_lands_once_in_transaction_order_with_its_subject_id_and_payload() {
    let Some(stream) = TestStream::new().await else { return };
    let config = stream.config(NATS);
    let app = spawn_app_with(move |settings, _| settings.nats = Some(config)).await;
    let (_, other_key) = app.create_account("another shop").await;
    let paid = app.create_order().await["id"].as_str().unwrap().to_owned();
    let cancelled = app.create_order().await["id"].as_str().unwrap().to_owned();
    assert_eq!(app.pay(&paid, "pm_card_ok", &crate::helpers::new_key()).await.status(), 201);
    assert_eq!(app.cancel_order(&cancelled, None).await.status(), 200);
    assert_eq!(app.post_order_as(&other_key, &order_body(), None).await.status(), 201);

    wait_until("the relay hands every event on", async || app.nats_caught_up().await).await;
    let events = app.events_in_order().await;
    let types: Vec<&str> = events.iter().map(|event| event.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "order.created",
            "order.created",
            "payment.succeeded",
            "order.paid",
            "order.cancelled",
            "order.created"
        ]
    );
    assert_stream_holds_once(&stream, &events).await;

    // The payload is the event exactly as GET /events/{id} renders it, byte for byte.
    for (message, event) in stream.messages().await.iter().zip(&events) {
        let key = if event.account_id == app.account_id { &app.api_key } else { &other_key };
        let response =
            app.client.get(app.url(&format!("/events/{}", event.id))).bearer_auth(key).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(message.payload.as_ref(), response.bytes().await.unwrap().as_ref());
    }

    // A consumer as docs/api.md shows one: durable, one type, each message acknowledged.
    let consumer = stream
        .jetstream
        .get_stream(&stream.name)
        .await
        .unwrap()
        .get_or_create_consumer(
            "fulfillment",
            pull::Config {
                durable_name: Some("fulfillment".to_owned()),
                filter_subject: format!("{}.order.created", stream.prefix),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut received = Vec::new();
    for _ in 0..3 {
        let next = tokio::time::timeout(Duration::from_millis(CATCH_UP_MS), messages.next()).await;
        let message = next.expect("a message in time").expect("a message").expect("no error");
        let id = message.headers.as_ref().and_then(|headers| headers.get("Nats-Msg-Id")).unwrap();
        received.push(id.as_str().to_owned());
        message.ack().await.unwrap();
    }
    let created: Vec<String> = events
        .iter()
        .filter(|event| event.event_type.as_str() == "order.created")
        .map(|event| event.id.to_string())
        .collect();
    assert_eq!(received, created);

    // The stream the relay created: our subjects, and the duplicate window set explicitly.
    let mut created = stream.jetstream.get_stream(&stream.name).await.unwrap();
    let config = &created.info().await.unwrap().config;
    assert_eq!(config.subjects, [format!("{}.>", stream.prefix)]);
    assert_eq!(config.duplicate_window, DUPLICATE_WINDOW);
}

#[tokio::test]
async fn a_stream_that_does_not_take_every_event_subject_is_refused_until_it_does() {
    let Some(stream) = TestStream::new().await else { return };
    let app = spawn_app().await;
    app.create_order().await;
    let events = app.events_in_order().await;
    // Someone else's stream of that name, taking only part of our subjects.
    let partial = jetstream::stream::Config {
        name: stream.name.clone(),
        subjects: vec![format!("{}.order.*", stream.prefix)],
        ..Default::default()
    };
    stream.jetstream.create_stream(partial.clone()).await.unwrap();
    let relay = NatsRelay::start(stream.config(NATS), 500).await.unwrap();
    let mut conn = app.db().await;

    let refused = relay.hand_on(&mut conn, &events).await.expect_err("the stream is refused");
    assert!(matches!(refused.downcast_ref(), Some(NatsError::StreamSubjects { .. })), "{refused:#}");
    assert_eq!(stream.state().await, (0, 0), "nothing published to a stream that is not ours to fill");

    let all = jetstream::stream::Config { subjects: vec![format!("{}.>", stream.prefix)], ..partial };
    stream.jetstream.update_stream(all).await.unwrap();
    relay.hand_on(&mut conn, &events).await.expect("the stream takes every subject now");
    assert_stream_holds_once(&stream, &events).await;
}

/// The relay's cursor move blocked on purpose (a transaction holding its row), so that the
/// service dies after NATS acknowledged a batch and before the relay marked it published.
#[tokio::test]
async fn a_sigkill_between_the_pubacks_and_the_mark_republishes_and_the_stream_keeps_one_copy() {
    let Some(stream) = TestStream::new().await else { return };
    let app = spawn_app().await;
    for _ in 0..30 {
        app.create_order().await;
    }
    let events = app.events_in_order().await;
    assert_eq!(events.len(), 30);

    // Taken before the service starts: its relay reads the batch (older than this transaction),
    // publishes it, gets every PubAck, and then waits on this lock to move the cursor.
    let mut blocker = app.db().await;
    execute(&mut blocker, "BEGIN").await;
    execute(&mut blocker, "SELECT relay FROM relay_cursors WHERE relay = 'nats' FOR UPDATE").await;
    let env = stream.env(NATS);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let mut service = ServiceProcess::start(&app.database_url, &app.provider.address, &env).await;

    wait_until("NATS holds the whole batch", async || stream.state().await.0 == 30).await;
    let waiting = "SELECT count(*) AS count FROM pg_stat_activity \
                   WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE relay_cursors%'";
    wait_until("the relay waits to mark the batch published", async || app.count(waiting).await == 1).await;
    service.kill();
    assert_eq!(app.nats_cursor().await, 0, "the batch was never marked published");
    execute(&mut blocker, "ROLLBACK").await;

    let restarted = ServiceProcess::start(&app.database_url, &app.provider.address, &env).await;
    wait_until("the restarted relay marks the batch", async || app.nats_caught_up().await).await;
    assert_stream_holds_once(&stream, &events).await;
    assert_eq!(stream.state().await, (30, 30), "no sequence was given to a second copy");
    // The republish happened, and JetStream dropped every copy by its Nats-Msg-Id.
    let metrics = app.client.get(format!("{}/metrics", restarted.address)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert_eq!(metric(&metrics, "orderpay_nats_duplicates_total"), 30.0, "{metrics}");
    assert_eq!(metric(&metrics, "orderpay_nats_published_total"), 0.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cut_off_for_a_while_loses_nothing_and_doubles_nothing_while_orders_are_served() {
    let Some(stream) = TestStream::new().await else { return };
    let proxy = ChaosProxy::start(NATS).await;
    let config = stream.config(&format!("127.0.0.1:{}", proxy.port));
    let app = Arc::new(spawn_app_with(move |settings, _| settings.nats = Some(config)).await);

    // Orders keep coming, one after the other, through the whole run; every one is answered.
    let (stop, created) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (app, stop, created) = (app.clone(), stop.clone(), created.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let response = app.post_order(&order_body(), None).await;
                assert_eq!(response.status(), 201, "orders are answered while NATS is away");
                created.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    wait_until("some events reach NATS", async || stream.state().await.0 >= 5).await;
    proxy.cut();
    let before = created.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await; // the outage's length, not a check
    let during = created.load(Ordering::SeqCst) - before;
    assert!(during > 0, "orders were created during the outage");
    assert!(!app.nats_caught_up().await, "the outage's events wait in the outbox");
    let held = stream.state().await.0;
    proxy.restore();
    wait_until("NATS takes events again", async || stream.state().await.0 > held).await;
    stop.store(true, Ordering::SeqCst);
    load.await.expect("every order was answered 201");

    wait_until("the relay catches up", async || app.nats_caught_up().await).await;
    let events = app.events_in_order().await;
    assert_eq!(events.len(), created.load(Ordering::SeqCst), "one order.created per order");
    assert_stream_holds_once(&stream, &events).await;
    println!("{during} orders answered during a {OUTAGE_MS} ms NATS outage; {} events in all", events.len());
}

#[tokio::test]
async fn the_service_starts_and_serves_with_nats_unreachable_and_publishes_once_it_answers() {
    let Some(stream) = TestStream::new().await else { return };
    let app = spawn_app().await;
    let proxy = ChaosProxy::start(NATS).await;
    proxy.cut();
    let env = stream.env(&format!("127.0.0.1:{}", proxy.port));
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let log = std::env::temp_dir().join(format!("orderpay-nats-{}.log", stream.name));
    // `start` returns once /healthz answers (and fails after 10 s).
    let service =
        ServiceProcess::start_logging_to(&app.database_url, &app.provider.address, &env, Some(&log)).await;

    let ready = app.client.get(format!("{}/readyz", service.address)).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let created = app
        .client
        .post(format!("{}/orders", service.address))
        .bearer_auth(&app.api_key)
        .json(&order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    wait_until("the service says why events wait", async || {
        std::fs::read_to_string(&log)
            .is_ok_and(|text| text.contains("NATS unreachable; events wait in the outbox"))
    })
    .await;
    assert_eq!(app.nats_cursor().await, 0);

    proxy.restore();
    wait_until("the event goes out once NATS answers", async || app.nats_caught_up().await).await;
    assert_stream_holds_once(&stream, &app.events_in_order().await).await;
    let _ = std::fs::remove_file(&log);
}

/// Events published per second draining a backlog (`NATS_BACKLOG_EVENTS`, default 20,000):
/// the relay as `serve` runs it (rounds of `ORDERPAY_RELAY_BATCH_SIZE` 500, or
/// `NATS_BACKLOG_BATCH`), timed from its start to its cursor at the last event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_at_a_measured_rate_each_event_once() {
    let Some(stream) = TestStream::new().await else { return };
    let total: i64 =
        std::env::var("NATS_BACKLOG_EVENTS").ok().and_then(|n| n.parse().ok()).unwrap_or(BACKLOG_EVENTS);
    let app = spawn_app().await;
    app.create_order().await;
    // Copies of a real order.created event, each with an id of its own, in one transaction.
    app.execute(&format!(
        "INSERT INTO events (account_id, id, type, data, created_at) \
         SELECT account_id, gen_random_uuid(), type, data, now() FROM events, generate_series(2, {total})"
    ))
    .await;

    let pool = orderpay::db::background_pool(&app.settings.database, 2);
    let batch_size = std::env::var("NATS_BACKLOG_BATCH")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(app.settings.relay.batch_size);
    let (shutdown, signal) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let relay = NatsRelay::start(stream.config(NATS), batch_size).await.unwrap();
    let running = tokio::spawn(orderpay::events::relay::run(
        pool,
        relay,
        app.settings.relay.interval,
        batch_size,
        signal,
    ));
    wait_until("the backlog is drained", async || app.nats_caught_up().await).await;
    let elapsed = started.elapsed();
    let _ = shutdown.send(true);
    running.await.unwrap();

    assert_eq!(stream.state().await, (total as u64, total as u64), "every event once, none twice");
    println!(
        "NATS relay drained {total} events in {} ms: {:.0} events/s (batch {batch_size})",
        elapsed.as_millis(),
        total as f64 / elapsed.as_secs_f64()
    );
}

async fn execute(conn: &mut AsyncPgConnection, sql: &str) {
    // Imported here: its blanket `load` would shadow `AtomicBool::load` in the tests.
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql).execute(conn).await.expect(sql);
}

/// The value of an unlabelled metric in Prometheus text (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}
