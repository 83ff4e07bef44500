//! The transactional outbox and the Events API: each state change writes exactly its events in
//! its own transaction (none for a change that rolled back, none for a replay), each carrying
//! the resource as GET returns it after the change.

use std::future::Future;
use std::time::Duration;

use orderpay::events::Event;
use orderpay::events::relay::{Relay, round};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, json, new_key, order_body, spawn_app, spawn_app_with};

impl TestApp {
    /// The account's events of one type, newest first (the Events API).
    pub async fn events_of(&self, event_type: &str) -> Vec<Value> {
        let page = self.get_json(&format!("/events?type={event_type}&limit=100")).await;
        page["data"].as_array().unwrap().clone()
    }

    /// Every event of the account, oldest first.
    pub async fn all_events(&self) -> Vec<Value> {
        let mut events = self.get_json("/events?limit=100").await["data"].as_array().unwrap().clone();
        events.reverse();
        events
    }

    pub async fn event_types(&self) -> Vec<String> {
        self.all_events().await.iter().map(|event| event["type"].as_str().unwrap().to_owned()).collect()
    }
}

#[tokio::test]
async fn each_change_writes_exactly_its_events_with_the_resource_as_get_returns_it() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let order_id = order["id"].as_str().unwrap().to_owned();
    assert_eq!(app.event_types().await, ["order.created"]);
    let created = &app.events_of("order.created").await[0];
    assert_eq!(created["object"], "event");
    assert_eq!(created["data"]["object"], order, "the order as created");

    let payment = json(app.pay(&order_id, "pm_card_ok", &new_key()).await).await;
    assert_eq!(app.event_types().await, ["order.created", "payment.succeeded", "order.paid"]);
    let paid = &app.events_of("order.paid").await[0];
    let order_now = json(app.get_order(&order_id).await).await;
    assert_eq!(paid["data"]["object"], order_now, "the order as GET returns it after the change");
    assert_eq!(
        app.events_of("payment.succeeded").await[0]["data"]["object"],
        app.get_payment(payment["id"].as_str().unwrap()).await
    );

    let refund = json(app.refund(payment["id"].as_str().unwrap(), Some("10.00"), &new_key()).await).await;
    let rest = json(app.refund(payment["id"].as_str().unwrap(), None, &new_key()).await).await;
    assert_eq!(
        app.event_types().await[3..],
        ["refund.succeeded", "order.partially_refunded", "refund.succeeded", "order.refunded"]
    );
    let refunded = app.events_of("refund.succeeded").await;
    assert_eq!(refunded[1]["data"]["object"], refund, "newest first: the first refund is second");
    assert_eq!(refunded[0]["data"]["object"], rest);
    assert_eq!(
        app.events_of("order.refunded").await[0]["data"]["object"],
        json(app.get_order(&order_id).await).await
    );

    // Replays write nothing.
    let before = app.all_events().await.len();
    let key = new_key();
    app.post_order(&order_body(), Some(&key)).await;
    app.post_order(&order_body(), Some(&key)).await;
    app.post_order(&order_body(), Some(&key)).await;
    assert_eq!(app.all_events().await.len(), before + 1, "one order.created for three copies");
}

#[tokio::test]
async fn declines_cancels_authorizations_voids_and_refusals_have_their_events() {
    let app = spawn_app().await;
    let first = app.create_order().await["id"].as_str().unwrap().to_owned();
    app.pay(&first, "pm_card_declined", &new_key()).await;
    app.cancel_order(&first, None).await;
    assert_eq!(app.event_types().await, ["order.created", "payment.failed", "order.cancelled"]);
    assert_eq!(app.events_of("order.cancelled").await[0]["data"]["object"]["status"], "cancelled");

    let (_, authorized) = app.authorized_order("30.00", "pm_card_ok").await;
    let authorized_id = authorized["id"].as_str().unwrap();
    assert_eq!(app.events_of("payment.requires_capture").await[0]["data"]["object"], authorized);
    app.void(authorized_id, &new_key()).await;
    let canceled = &app.events_of("payment.canceled").await[0];
    assert_eq!(canceled["data"]["object"], app.get_payment(authorized_id).await);

    let (_, declined_refunds) = app.paid_order("20.00", "pm_refund_declined").await;
    app.refund(declined_refunds["id"].as_str().unwrap(), None, &new_key()).await;
    assert_eq!(app.events_of("refund.failed").await.len(), 1);
    assert!(app.events_of("order.refunded").await.is_empty(), "a failed refund moves no order");
}

#[tokio::test]
async fn a_change_that_rolls_back_writes_no_event() {
    let app = spawn_app().await;
    app.fail_inserts_into("order_items").await;
    assert_eq!(app.post_order(&order_body(), Some(&new_key())).await.status(), 500);
    assert_eq!(app.post_order(&order_body(), None).await.status(), 500);
    assert_eq!(app.count("SELECT count(*) AS count FROM events").await, 0);
    app.heal_inserts_into("order_items").await;

    // A settle that fails after its payment moved writes nothing either: the whole statement
    // rolls back (an audit row that cannot be written), and the payment stays processing.
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    app.fail_inserts_into("payment_events").await;
    let accepted = app.pay(&order_id, "pm_card_ok", &new_key()).await;
    assert_eq!(accepted.status(), 202, "the charge happened; its settle rolled back");
    assert_eq!(app.event_types().await, ["order.created"]);
    app.heal_inserts_into("payment_events").await;
    tokio::time::sleep(Duration::from_millis(2100)).await; // the lease of the request
    app.reconcile_once().await;
    assert_eq!(app.event_types().await[1..], ["payment.succeeded", "order.paid"]);
}

#[tokio::test]
async fn the_events_api_pages_filters_and_scopes_by_account() {
    let app = spawn_app().await;
    for _ in 0..3 {
        app.create_order().await;
    }
    let page = app.get_json("/events?limit=2").await;
    assert_eq!(page["object"], "list");
    assert_eq!(page["has_more"], true);
    let newest = page["data"][0]["id"].as_str().unwrap();
    let cursor = page["data"][1]["id"].as_str().unwrap();
    let rest = app.get_json(&format!("/events?limit=2&starting_after={cursor}")).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["has_more"], false);
    assert_eq!(app.get_json(&format!("/events/{newest}")).await, page["data"][0]);
    assert!(app.get_json("/events?type=order.paid").await["data"].as_array().unwrap().is_empty());

    let bad_type = app.request(Method::GET, "/events?type=order.shipped").send().await.unwrap();
    assert_problem(bad_type, 400, "invalid-parameter").await;
    let (_, other_key) = app.create_account("someone else").await;
    let foreign =
        app.client.get(app.url(&format!("/events/{newest}"))).bearer_auth(&other_key).send().await.unwrap();
    assert_problem(foreign, 404, "not-found").await;
    let theirs = app.client.get(app.url("/events")).bearer_auth(&other_key).send().await.unwrap();
    assert_eq!(json(theirs).await["data"], json!([]));
}

#[tokio::test]
async fn events_past_their_retention_are_swept() {
    let app = spawn_app_with(|settings, _| {
        settings.event_retention = Duration::from_secs(60);
        settings.sweeper.interval = Duration::from_millis(100);
    })
    .await;
    app.create_order().await;
    app.create_order().await;
    app.execute("UPDATE events SET created_at = now() - interval '2 minutes' WHERE type = 'order.created'")
        .await;
    app.create_order().await;
    for _ in 0..50 {
        if app.count("SELECT count(*) AS count FROM events").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.count("SELECT count(*) AS count FROM events").await, 1, "the two old events are gone");
}

/// A sweep that finds nothing past the retention writes nothing: it does not lock (and so
/// rewrite) the young events it looked at. The sweeper runs every few seconds on every instance.
#[tokio::test]
async fn a_sweep_with_nothing_due_leaves_young_events_untouched() {
    let app = spawn_app().await;
    app.create_order().await;
    app.create_order().await;
    let mut conn = app.db().await;
    let an_hour_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    let swept = orderpay::events::repository::sweep(&mut conn, an_hour_ago, 100).await.unwrap();
    assert_eq!(swept, 0);
    let locked = "SELECT count(*) AS count FROM events WHERE xmax::text <> '0'";
    assert_eq!(app.count(locked).await, 0, "no young event was locked by the sweep");
}

#[tokio::test]
async fn what_events_leave_behind_goes_with_them_but_work_still_due_stays() {
    let app = spawn_app_with(|settings, _| {
        settings.event_retention = Duration::from_secs(60);
        settings.sweeper.interval = Duration::from_millis(100);
    })
    .await;
    app.create_order().await;
    let account = app.text("SELECT account_id::text AS text FROM events").await;
    let old = "now() - interval '2 minutes'";
    app.execute(&format!(
        "INSERT INTO webhook_endpoints (account_id, id, url, enabled_events, secret, created_at, updated_at) \
         VALUES ('{account}', gen_random_uuid(), 'https://example.com/hook', '{{*}}', '\\x00', now(), now())"
    ))
    .await;
    // Each delivery with its attempt in one statement: the sweeper runs all along and would
    // otherwise take an old delivery before its attempt is written.
    let delivery = |status: &str, created: &str| {
        let next = if status == "pending" { "now()" } else { "NULL" };
        format!(
            "WITH delivery AS (INSERT INTO webhook_deliveries (account_id, id, endpoint_id, event_id, origin, \
             status, attempts, next_attempt_at, created_at, updated_at) SELECT '{account}', gen_random_uuid(), id, \
             gen_random_uuid(), 'redeliver', '{status}', 1, {next}, {created}, {created} FROM webhook_endpoints \
             RETURNING account_id, id, created_at) \
             INSERT INTO webhook_delivery_attempts (account_id, delivery_id, attempt, started_at, http_status, \
             latency_ms) SELECT account_id, id, 1, created_at, 200, 3 FROM delivery"
        )
    };
    app.execute(&delivery("delivered", old)).await;
    app.execute(&delivery("failed", old)).await;
    app.execute(&delivery("pending", old)).await;
    app.execute(&delivery("delivered", "now()")).await;
    for (id, received) in [("evt_old", old), ("evt_new", "now()")] {
        app.execute(&format!(
            "INSERT INTO provider_webhooks (id, event_type, object_id, result, received_at) \
             VALUES ('{id}', 'charge.succeeded', 'ch_1', 'unknown', {received})"
        ))
        .await;
    }
    let remaining = || async {
        (
            app.count("SELECT count(*) AS count FROM webhook_deliveries").await,
            app.count("SELECT count(*) AS count FROM webhook_delivery_attempts").await,
            app.count("SELECT count(*) AS count FROM provider_webhooks").await,
        )
    };
    for _ in 0..50 {
        if remaining().await == (2, 2, 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        remaining().await,
        (2, 2, 1),
        "old finished deliveries, their attempts and old provider events go"
    );
    assert_eq!(
        app.count("SELECT count(*) AS count FROM webhook_deliveries WHERE status = 'pending'").await,
        1,
        "a delivery still due stays, however old"
    );
    assert_eq!(app.text("SELECT id AS text FROM provider_webhooks").await, "evt_new");
}

/// A relay that remembers what it was handed, in order.
#[derive(Default)]
struct Collecting(std::sync::Mutex<Vec<String>>);

impl Relay for Collecting {
    const NAME: &'static str = "webhooks";

    fn hand_on(
        &self,
        _: &mut diesel_async::AsyncPgConnection,
        batch: &[Event],
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        self.0.lock().unwrap().extend(batch.iter().map(|event| event.id.to_string()));
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn a_relay_never_skips_an_event_whose_transaction_commits_after_a_younger_one() {
    // The worst interleaving for a cursor: an event written first but committed last. A relay
    // that moved past the younger one (by sequence or by time) would never see it.
    let app = spawn_app().await;
    let first = app.create_order().await;
    let account = app.text("SELECT account_id::text AS text FROM events").await;
    let pool = orderpay::db::background_pool(&app.settings.database, 2);
    let relay = Collecting::default();

    let mut late = app.db().await;
    run(&mut late, "BEGIN").await;
    let insert = format!(
        "INSERT INTO events (account_id, id, type, data, created_at) \
         VALUES ('{account}', '{}', 'order.created', '{{}}', now())",
        uuid::Uuid::now_v7()
    );
    run(&mut late, &insert).await;
    let younger = app.create_order().await; // written after, committed before
    // Rounds wait for every older transaction of the whole server to end (other tests' too), so
    // each step runs rounds until it has what it can have.
    rounds_until(&pool, &relay, 1).await;
    let first_id = first_event_id(&app, &first).await;
    rounds_until(&pool, &relay, 1).await;
    assert_eq!(relay.0.lock().unwrap().as_slice(), [first_id], "never past the open transaction");

    run(&mut late, "COMMIT").await;
    rounds_until(&pool, &relay, 3).await;
    let seen = relay.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2], first_event_id(&app, &younger).await, "transaction order: the late one first");
    assert_eq!(round(&pool, &relay, 100).await.unwrap(), 0, "and nothing twice");
}

#[tokio::test]
async fn a_relay_reads_transaction_ids_in_numeric_order_across_a_change_of_digits() {
    // Transaction ids 9, 10 and 100 (older than any running transaction): as text, "10" would
    // sort before "9" and the relay's cursor would then step over 9 for good.
    let app = spawn_app().await;
    let account = uuid::Uuid::now_v7();
    for txid in [10, 9, 100] {
        let insert = format!(
            "INSERT INTO events (account_id, id, type, data, created_at, txid) \
             VALUES ('{account}', '{}', 'order.created', '{{}}', now(), '{txid}')",
            uuid::Uuid::now_v7()
        );
        app.execute(&insert).await;
    }
    let mut expected = Vec::new();
    for txid in [9, 10, 100] {
        expected.push(app.text(&format!("SELECT id::text AS text FROM events WHERE txid = '{txid}'")).await);
    }
    let pool = orderpay::db::background_pool(&app.settings.database, 2);
    let relay = Collecting::default();

    rounds_until(&pool, &relay, 3).await;
    assert_eq!(*relay.0.lock().unwrap(), expected, "9, 10, 100: numeric order, each once");
}

#[tokio::test]
async fn a_relay_reads_its_cursor_only_once_it_holds_the_relay_so_no_batch_is_handed_on_twice() {
    // The worst interleaving on purpose: relay instance R has begun its round; instance A takes
    // the relay, hands the batch on, moves the cursor and commits; R goes on. R must not read
    // the cursor as it was before A's commit. To stop R inside the statement that reads the
    // cursor, the test puts a view in the table's place whose condition waits on a lock the test
    // holds (the statement's snapshot is taken when it starts, before the wait).
    let app = spawn_app().await;
    for _ in 0..3 {
        app.create_order().await;
    }
    // Relays read events older than every running transaction of the server: wait until these
    // are, so that whoever reads the cursor at 0 sees all three.
    let visible = "SELECT count(*) AS count FROM events WHERE txid < pg_snapshot_xmin(pg_current_snapshot())";
    crate::helpers::wait_until("the events are readable by relays", Duration::from_secs(10), async || {
        app.count(visible).await == 3
    })
    .await;
    let all: Vec<String> = {
        let ids = app.all_events().await;
        ids.iter().map(|event| event["id"].as_str().unwrap().to_owned()).collect()
    };
    for sql in [
        "ALTER TABLE relay_cursors RENAME TO relay_cursors_stored",
        "CREATE FUNCTION held() RETURNS boolean LANGUAGE plpgsql VOLATILE COST 0.0001 AS \
         $$ BEGIN PERFORM pg_advisory_lock_shared(4242); PERFORM pg_advisory_unlock_shared(4242); \
         RETURN true; END $$",
        "CREATE VIEW relay_cursors AS SELECT * FROM relay_cursors_stored WHERE held()",
    ] {
        app.execute(sql).await;
    }
    let mut holder = app.db().await;
    run(&mut holder, "SELECT pg_advisory_lock(4242)").await;

    let pool = orderpay::db::background_pool(&app.settings.database, 2);
    let r = std::sync::Arc::new(Collecting::default());
    let r_round = {
        let (pool, r) = (pool.clone(), r.clone());
        tokio::spawn(async move { round(&pool, r.as_ref(), 100).await.unwrap() })
    };
    let waiting = "SELECT count(*) AS count FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event = 'advisory' AND pid <> pg_backend_pid()";
    crate::helpers::wait_until("R waits inside its round", Duration::from_secs(10), async || {
        app.count(waiting).await == 1
    })
    .await;
    // Instance A, as a relay round does it: try the relay's lock; if taken, hand the batch on
    // (all three events) and move the cursor past it; commit.
    let mut a = app.db().await;
    run(&mut a, "BEGIN").await;
    let took = app_flag(
        &mut a,
        "SELECT pg_try_advisory_xact_lock(hashtextextended('orderpay.relay.webhooks', 0)) AS flag",
    )
    .await;
    let a_handed_on: Vec<String> = if took {
        run(
            &mut a,
            "UPDATE relay_cursors_stored SET (txid, seq) = \
             (SELECT txid, seq FROM events ORDER BY txid DESC, seq DESC LIMIT 1) WHERE relay = 'webhooks'",
        )
        .await;
        all.clone()
    } else {
        Vec::new()
    };
    run(&mut a, "COMMIT").await;
    run(&mut holder, "SELECT pg_advisory_unlock(4242)").await;
    r_round.await.unwrap();

    let r_handed_on = r.0.lock().unwrap().clone();
    let mut handed_on = a_handed_on.clone();
    handed_on.extend(r_handed_on.iter().cloned());
    handed_on.sort();
    let mut expected = all.clone();
    expected.sort();
    assert_eq!(handed_on, expected, "each event handed on once: A {a_handed_on:?}, R {r_handed_on:?}");
}

#[tokio::test]
async fn a_cursor_restored_into_another_cluster_starts_over_and_loses_no_event() {
    // A logical dump restored into a new cluster keeps the events and the cursor, but the new
    // cluster's transaction ids start elsewhere: here far below the cursor, so that new events
    // would sort before it. The cursor's cluster identifier tells, and the relay starts over.
    let app = spawn_app().await;
    app.create_order().await;
    app.create_order().await;
    app.execute(
        "UPDATE relay_cursors SET txid = (pg_current_xact_id()::text::bigint + 1000000)::text::xid8, \
             seq = 1000000, system_identifier = system_identifier + 1 WHERE relay = 'webhooks'",
    )
    .await;
    let pool = orderpay::db::background_pool(&app.settings.database, 2);
    let relay = Collecting::default();
    rounds_until(&pool, &relay, 2).await;
    let seen = relay.0.lock().unwrap().clone();
    let expected: Vec<String> =
        app.all_events().await.iter().map(|event| event["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(seen, expected, "every event, in order, once");
    let same = "SELECT count(*) AS count FROM relay_cursors \
                WHERE relay = 'webhooks' AND system_identifier = (SELECT system_identifier FROM pg_control_system())";
    assert_eq!(app.count(same).await, 1, "the cursor now names this cluster");
    app.create_order().await;
    rounds_until(&pool, &relay, 3).await;
    assert_eq!(relay.0.lock().unwrap().len(), 3, "then on as usual, nothing twice");
}

async fn app_flag(conn: &mut diesel_async::AsyncPgConnection, sql: &str) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Flag {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        flag: bool,
    }
    diesel_async::RunQueryDsl::get_result::<Flag>(diesel::sql_query(sql), conn).await.expect(sql).flag
}

/// Runs relay rounds until `relay` was handed `seen` events (a few more rounds, to give a wrong
/// extra event its chance to show), or fails after 10 s.
async fn rounds_until(pool: &orderpay::db::Pool, relay: &Collecting, seen: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut extra_rounds = 3;
    while extra_rounds > 0 {
        round(pool, relay, 100).await.unwrap();
        if relay.0.lock().unwrap().len() >= seen {
            extra_rounds -= 1;
        }
        assert!(std::time::Instant::now() < deadline, "the relay never saw {seen} events");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(conn: &mut diesel_async::AsyncPgConnection, sql: &str) {
    diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), conn).await.expect(sql);
}

async fn first_event_id(app: &TestApp, order: &Value) -> String {
    let order_id = order["id"].as_str().unwrap();
    let events = app.events_of("order.created").await;
    let event = events.iter().find(|event| event["data"]["object"]["id"] == order_id).unwrap();
    event["id"].as_str().unwrap().to_owned()
}
