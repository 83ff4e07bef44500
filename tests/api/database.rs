//! The database connection under real conditions, against the local PostgreSQL (which runs with
//! `ssl = on` and its snakeoil certificate): TLS modes, failover URLs that name hosts which
//! refuse or never answer, sessions the server ends mid-statement, statements over the timeout,
//! a server that stops answering, and readiness without a writable primary.

use std::time::Duration;

use diesel::sql_types::{Bool, Integer, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use orderpay::db::conninfo::{Conninfo, SslMode};
use reqwest::Response;
use serde_json::Value;
use tokio_postgres::config::TargetSessionAttrs;

use crate::helpers::{
    TestApp, assert_problem, connect, new_key, order_body, spawn_app, spawn_app_with, use_servers,
    with_params,
};
use crate::process::black_hole;
use crate::proxy::ChaosProxy;

/// `host:port` of the test server.
fn server_address(url: &str) -> String {
    url.parse::<Conninfo>().expect("a database URL").servers()[0].to_string()
}

async fn query_bool(conn: &mut AsyncPgConnection, sql: &str) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Answer {
        #[diesel(sql_type = Bool)]
        answer: bool,
    }
    diesel::sql_query(sql).get_result::<Answer>(conn).await.expect(sql).answer
}

async fn query_text(conn: &mut AsyncPgConnection, sql: &str) -> String {
    #[derive(diesel::QueryableByName)]
    struct Answer {
        #[diesel(sql_type = Text)]
        answer: String,
    }
    diesel::sql_query(sql).get_result::<Answer>(conn).await.expect(sql).answer
}

/// Whether this connection runs over TLS.
async fn encrypted(conn: &mut AsyncPgConnection) -> bool {
    query_bool(conn, "SELECT ssl AS answer FROM pg_stat_ssl WHERE pid = pg_backend_pid()").await
}

/// The server's certificate file (the Debian snakeoil certificate, issued for `localhost`).
async fn server_certificate(app: &TestApp) -> String {
    let mut conn = app.db().await;
    assert_eq!(
        query_text(&mut conn, "SELECT current_setting('ssl') AS answer").await,
        "on",
        "these tests need ssl = on"
    );
    query_text(&mut conn, "SELECT current_setting('ssl_cert_file') AS answer").await
}

#[tokio::test]
async fn sslmode_require_encrypts_every_connection_of_the_service() {
    let app = spawn_app_with(|settings, _| {
        settings.database.url.ssl_mode = SslMode::Require;
    })
    .await;
    app.create_order().await;
    let mut conn = app.db().await;
    assert!(encrypted(&mut conn).await, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
    // The service's own sessions (its pools) on this database, TLS every one.
    let sql = "SELECT count(*) AS count FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
               WHERE a.datname = current_database() AND a.application_name = 'orderpay'";
    let sessions = app.count(sql).await;
    let encrypted_sessions = app.count(&format!("{sql} AND s.ssl")).await;
    assert!(sessions > 0, "the service holds pooled connections");
    assert_eq!(encrypted_sessions, sessions, "every session of the service is encrypted");
}

#[tokio::test]
async fn certificates_are_verified_as_libpq_verifies_them() {
    let app = spawn_app().await;
    let certificate = server_certificate(&app).await;

    // verify-full against the system's public roots: the self-signed snakeoil certificate is
    // refused, with an error and not a panic.
    let untrusted = with_params(&app.database_url, "sslmode=verify-full&sslrootcert=system");
    let error = connect(&untrusted).await.err().expect("an untrusted certificate is refused");
    let message = format!("{error:#}");
    assert!(message.contains("certificate"), "{message}");
    assert!(!message.contains("panick"), "{message}");

    // Trusting that very certificate, verify-full still refuses it for 127.0.0.1: it is issued
    // for localhost. verify-ca checks the chain only, so it connects.
    let trusted =
        |mode: &str, url: &str| with_params(url, &format!("sslmode={mode}&sslrootcert={certificate}"));
    let error = connect(&trusted("verify-full", &app.database_url)).await.err().expect("a name mismatch");
    assert!(format!("{error:#}").contains("not valid for name"), "{error:#}");
    let mut conn = connect(&trusted("verify-ca", &app.database_url)).await.expect("verify-ca connects");
    assert!(encrypted(&mut conn).await);

    // By the name on the certificate, verify-full connects.
    let by_name = app.database_url.replacen("127.0.0.1", "localhost", 1);
    assert_ne!(by_name, app.database_url, "the test server is addressed as 127.0.0.1");
    let mut conn =
        connect(&trusted("verify-full", &by_name)).await.expect("verify-full connects to localhost");
    assert!(encrypted(&mut conn).await);

    // prefer (the default) encrypts when the server offers TLS; disable does not.
    assert!(encrypted(&mut app.db().await).await, "sslmode=prefer, libpq's default");
    let mut plain = connect(&with_params(&app.database_url, "sslmode=disable")).await.unwrap();
    assert!(!encrypted(&mut plain).await);
}

#[tokio::test]
async fn a_failover_url_skips_hosts_that_refuse_or_never_answer_and_creates_the_database() {
    let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // Accepts TCP and never says a word, like a frozen server.
    let (_silent, silent_address) = black_hole();
    let silent: u16 = silent_address.rsplit(':').next().unwrap().parse().unwrap();
    let app = spawn_app_with(move |settings, _| {
        let server = settings.database.url.servers()[0].clone();
        // A database that does not exist yet: created through the failover URL.
        use_servers(settings, &[("127.0.0.1", refusing), ("127.0.0.1", silent), (&server.host, server.port)]);
        settings.database.url.pg.target_session_attrs(TargetSessionAttrs::ReadWrite);
        settings.database.url.ssl_mode = SslMode::Require;
        settings.database.connect_timeout = Duration::from_millis(300);
    })
    .await;
    let created = app.post_order(&order_body(), Some(&new_key())).await;
    assert_eq!(created.status(), 201);
    assert_eq!(app.client.get(app.url("/readyz")).send().await.unwrap().status(), 200);
    assert_eq!(app.orders_stored().await, 1);
}

/// The pid of the service's session that waits for a lock, once there is one.
async fn backend_waiting_on_a_lock(app: &TestApp) -> i32 {
    #[derive(diesel::QueryableByName)]
    struct Pid {
        #[diesel(sql_type = Integer)]
        pid: i32,
    }
    let mut conn = app.db().await;
    for _ in 0..250 {
        let waiting: Vec<Pid> = diesel::sql_query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'orderpay' AND wait_event_type = 'Lock'",
        )
        .load(&mut conn)
        .await
        .unwrap();
        if let Some(Pid { pid }) = waiting.into_iter().next() {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no session of the service waits for the lock");
}

/// Locks the order row from another session, as a long transaction would.
async fn lock_order(app: &TestApp, order_id: &str) -> AsyncPgConnection {
    let mut conn = app.db().await;
    diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
    diesel::sql_query(format!("SELECT 1 FROM orders WHERE id = '{order_id}' FOR UPDATE"))
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

async fn assert_unavailable(response: Response) -> Value {
    assert!(response.headers().contains_key("retry-after"), "{:?}", response.headers());
    assert_eq!(response.headers()["orderpay-should-retry"], "true");
    assert_problem(response, 503, "service-unavailable").await
}

#[tokio::test]
async fn a_session_the_server_terminates_mid_statement_answers_503_and_the_retry_succeeds() {
    let app = spawn_app().await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let mut holder = lock_order(&app, &order_id).await;
    let key = new_key();
    // A payment's first phase is one statement, outside any transaction: without the watch,
    // the server's FATAL would reach it as an unknown database error (500).
    let pay = {
        let (client, url, api_key, key) =
            (app.client.clone(), app.url("/payments"), app.api_key.clone(), key.clone());
        let body = serde_json::json!({ "order_id": order_id, "payment_method": "pm_card_ok" });
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(api_key)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .unwrap()
        })
    };
    let pid = backend_waiting_on_a_lock(&app).await;
    // FATAL 57P01 "terminating connection due to administrator command", mid-statement.
    let mut admin = app.db().await;
    assert!(query_bool(&mut admin, &format!("SELECT pg_terminate_backend({pid}) AS answer")).await);
    assert_unavailable(pay.await.unwrap()).await;
    assert!(app.provider.charges().await.is_empty(), "nothing was charged");

    run(&mut holder, "ROLLBACK").await;
    // Nothing was stored for the key: the retry runs, on a fresh connection, and charges once.
    let retry = app.pay(&order_id, "pm_card_ok", &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(app.provider.charges().await.len(), 1);
}

#[tokio::test]
async fn a_statement_over_the_statement_timeout_answers_503_and_the_retry_succeeds() {
    let app =
        spawn_app_with(|settings, _| settings.database.statement_timeout = Duration::from_millis(300)).await;
    let order_id = app.create_order().await["id"].as_str().unwrap().to_owned();
    let mut holder = lock_order(&app, &order_id).await;
    let key = new_key();
    // The server cancels the lock wait (57014) after 300 ms.
    assert_unavailable(app.cancel_order(&order_id, Some(&key)).await).await;
    run(&mut holder, "ROLLBACK").await;
    let retry = app.cancel_order(&order_id, Some(&key)).await;
    assert_eq!(retry.status(), 200);
}

#[tokio::test]
async fn a_database_that_stops_answering_gets_503_within_the_bound_then_the_service_recovers() {
    let proxy = ChaosProxy::start(&server_address(&crate::helpers::server_url())).await;
    let proxy_port = proxy.port;
    let proxied = spawn_app_with(move |settings, _| {
        use_servers(settings, &[("127.0.0.1", proxy_port)]);
        settings.database.statement_timeout = Duration::from_millis(400);
        settings.database.connect_timeout = Duration::from_millis(400);
        settings.database.acquire_timeout = Duration::from_millis(800);
    })
    .await;
    assert_eq!(proxied.post_order(&order_body(), Some(&new_key())).await.status(), 201);

    // The server's kernel still accepts and ACKs, and nothing answers (a frozen primary).
    proxy.hold_answers();
    // A hang would end at the client's timeout, far past the bounds (400 ms + 500 ms).
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    for _ in 0..3 {
        let response = client
            .post(proxied.url("/orders"))
            .bearer_auth(&proxied.api_key)
            .header("Idempotency-Key", new_key())
            .json(&order_body())
            .send()
            .await
            .expect("an answer, not a hang");
        assert_unavailable(response).await;
    }
    let ready = client.get(proxied.url("/readyz")).send().await.expect("an answer, not a hang");
    assert_eq!(ready.status(), 503);

    proxy.restore();
    // Connections that went unanswered were dropped, not handed out again: the next requests
    // get fresh ones and succeed.
    let key = new_key();
    let mut status = 0;
    for _ in 0..20 {
        status = proxied.post_order(&order_body(), Some(&key)).await.status().as_u16();
        if status == 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 201, "the service recovered");
    assert_eq!(proxied.orders_stored().await, 2);
}

/// Runs `sql` on `conn`.
async fn run(conn: &mut AsyncPgConnection, sql: &str) {
    diesel::sql_query(sql).execute(conn).await.expect(sql);
}

/// Makes sessions opened from now on read-only, as on a standby, and ends the service's
/// sessions so that it opens new ones. `admin` is a session opened before: it stays writable.
async fn make_read_only(admin: &mut AsyncPgConnection) {
    let database = query_text(admin, "SELECT current_database()::text AS answer").await;
    run(admin, &format!("ALTER DATABASE \"{database}\" SET default_transaction_read_only = on")).await;
    run(
        admin,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'orderpay' AND pid <> pg_backend_pid()",
    )
    .await;
}

/// New sessions are writable again; existing (read-only) ones stay as they are.
async fn make_writable(admin: &mut AsyncPgConnection) {
    let database = query_text(admin, "SELECT current_database()::text AS answer").await;
    run(admin, &format!("ALTER DATABASE \"{database}\" RESET default_transaction_read_only")).await;
}

#[tokio::test]
async fn readyz_and_writes_answer_503_without_a_writable_primary_and_recover_with_one() {
    // One worker, so one pool: a read-only connection kept in it would be handed out again.
    let app = spawn_app_with(|settings, _| settings.workers = 1).await;
    let readyz = || async { app.client.get(app.url("/readyz")).send().await.unwrap() };
    assert_eq!(readyz().await.status(), 200);

    let mut admin = app.db().await;
    make_read_only(&mut admin).await;
    assert_unavailable(readyz().await).await;
    // A write fails with 25006 (read-only transaction): 503, not 500, and its connection is
    // dropped rather than kept for the next request.
    let key = new_key();
    assert_unavailable(app.post_order(&order_body(), Some(&key)).await).await;

    make_writable(&mut admin).await;
    assert_eq!(app.post_order(&order_body(), Some(&key)).await.status(), 201, "the retry with the same key");
    assert_eq!(readyz().await.status(), 200, "ready again with a writable primary");
}

#[tokio::test]
async fn a_read_write_url_refuses_read_only_servers_with_503() {
    let app = spawn_app_with(|settings, _| {
        settings.database.url.pg.target_session_attrs(TargetSessionAttrs::ReadWrite);
        settings.database.acquire_timeout = Duration::from_millis(500);
    })
    .await;
    let mut admin = app.db().await;
    make_read_only(&mut admin).await;
    // No host is writable: no connection is made at all, and requests get 503.
    assert_unavailable(app.client.get(app.url("/readyz")).send().await.unwrap()).await;
    assert_unavailable(app.post_order(&order_body(), Some(&new_key())).await).await;
    make_writable(&mut admin).await;
    assert_eq!(app.post_order(&order_body(), Some(&new_key())).await.status(), 201);
}

/// An index that holds every column of its table's primary key and starts with one of them is
/// priced like the key itself for a lookup by key while the table is small, and the planner may
/// take it. A plan made then is kept: PostgreSQL caches its foreign-key checks' plans for the
/// connection's life, so every row referencing a payment walked all of an account's payments
/// through `payments_by_order` while it was led by `account_id` (docs/performance.md).
#[tokio::test]
async fn no_index_can_stand_in_for_its_tables_primary_key() {
    let app = spawn_app().await;
    let standing_in = app
        .text(
            "SELECT coalesce(string_agg(i.indexrelid::regclass::text, ', ' ORDER BY 1), '') AS text
             FROM pg_index AS i
             JOIN pg_index AS pk ON pk.indrelid = i.indrelid AND pk.indisprimary
             JOIN pg_class AS t ON t.oid = i.indrelid
             WHERE t.relnamespace = current_schema()::regnamespace
               AND NOT i.indisprimary AND i.indpred IS NULL
               AND i.indkey[0] = ANY (pk.indkey::int2[])
               AND pk.indkey::int2[] <@ i.indkey::int2[]",
        )
        .await;
    assert_eq!(standing_in, "", "lead these indexes with a column that is not the key's");
}

/// Where a table lives on Citus, distributed by `account_id` (docs/scaling.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Sharded by `account_id`, colocated with every other such table: an account's rows of all
    /// of them on one node.
    ByAccount,
    /// A copy on every node: read before the account is known, or by every account.
    Reference,
    /// The coordinator's alone: the platform's own work, across accounts.
    Platform,
}

/// Every table not distributed by account, with its placement. Any other table, one added
/// later included, is held to the rule of tables distributed by account.
const NOT_BY_ACCOUNT: [(&str, Placement); 9] = [
    ("accounts", Placement::Reference),
    // Found by the key's hash before the account is known.
    ("api_keys", Placement::Reference),
    // One row every instance reads (the revocations' generation).
    ("api_key_revocations", Placement::Reference),
    // The provider's inbox: an event's account is known only once it is applied.
    ("provider_webhooks", Placement::Platform),
    // The relays' positions in the events of every account.
    ("relay_cursors", Placement::Platform),
    // Where the reconciler's listing of the provider's disputes starts.
    ("dispute_listing", Placement::Platform),
    // Settlement runs and the provider movements they match, any account's.
    ("settlement_runs", Placement::Platform),
    ("settlement_items", Placement::Platform),
    // diesel's record of the migrations run.
    ("__diesel_schema_migrations", Placement::Platform),
];

fn placement(table: &str) -> Placement {
    NOT_BY_ACCOUNT.iter().find(|(name, _)| *name == table).map_or(Placement::ByAccount, |(_, placed)| *placed)
}

/// What keeps the schema from being distributed by `account_id` as docs/scaling.md plans: a
/// table distributed by account needs `account_id` (uuid, as in the others it is colocated
/// with), a primary key led by it, and `account_id` among the key columns of each of its unique
/// indexes (a shard checks uniqueness among its own rows only); a foreign key between two such
/// tables pairs their `account_id`s (both rows on one shard); no table references one
/// distributed by account except another such table, and none of those references a platform
/// table (the two rows of a foreign key must be on one node to be checked).
async fn distribution_breaches(client: &tokio_postgres::Client) -> Vec<String> {
    let mut breaches = Vec::new();
    let tables = client
        .query(
            "SELECT c.relname::text,
                 (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute AS a
                  WHERE a.attrelid = c.oid AND a.attname = 'account_id' AND NOT a.attisdropped),
                 (SELECT a.attname::text FROM pg_index AS i
                  JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                  WHERE i.indrelid = c.oid AND i.indisprimary)
             FROM pg_class AS c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
               AND NOT c.relispartition",
            &[],
        )
        .await
        .unwrap();
    let names: Vec<String> = tables.iter().map(|row| row.get(0)).collect();
    for (listed, _) in NOT_BY_ACCOUNT {
        if !names.iter().any(|name| name == listed) {
            breaches.push(format!("{listed}: listed in NOT_BY_ACCOUNT, but there is no such table"));
        }
    }
    for row in &tables {
        let (table, account_id, primary_key_leader): (String, Option<String>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        if placement(&table) != Placement::ByAccount {
            continue;
        }
        match account_id.as_deref() {
            None => breaches.push(format!(
                "{table}: no account_id column (add one, or list the table in NOT_BY_ACCOUNT with its placement)"
            )),
            Some("uuid") => {}
            Some(other) => breaches.push(format!("{table}: account_id is {other}, the other tables' is uuid")),
        }
        match primary_key_leader.as_deref() {
            Some("account_id") => {}
            Some(leader) => breaches.push(format!("{table}: primary key led by {leader}, not account_id")),
            None => breaches.push(format!("{table}: no primary key")),
        }
    }
    let unique_indexes = client
        .query(
            "SELECT t.relname::text, i.indexrelid::regclass::text
             FROM pg_index AS i
             JOIN pg_class AS t ON t.oid = i.indrelid
             WHERE t.relnamespace = current_schema()::regnamespace
               AND (i.indisunique OR i.indisexclusion) AND NOT i.indisprimary
               AND NOT EXISTS (
                   SELECT FROM pg_attribute AS a
                   WHERE a.attrelid = t.oid AND a.attname = 'account_id'
                     AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1]))",
            &[],
        )
        .await
        .unwrap();
    for row in &unique_indexes {
        let (table, index): (String, String) = (row.get(0), row.get(1));
        if placement(&table) == Placement::ByAccount {
            breaches.push(format!("{table}: unique index {index} has no account_id among its key columns"));
        }
    }
    let foreign_keys = client
        .query(
            "SELECT c.conname::text, f.relname::text, t.relname::text,
                 EXISTS (
                     SELECT FROM unnest(c.conkey, c.confkey) AS k(referencing, referenced)
                     JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = k.referencing
                     JOIN pg_attribute AS b ON b.attrelid = c.confrelid AND b.attnum = k.referenced
                     WHERE a.attname = 'account_id' AND b.attname = 'account_id')
             FROM pg_constraint AS c
             JOIN pg_class AS f ON f.oid = c.conrelid
             JOIN pg_class AS t ON t.oid = c.confrelid
             WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace",
            &[],
        )
        .await
        .unwrap();
    for row in &foreign_keys {
        let (name, from, to, by_account): (String, String, String, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        match (placement(&from), placement(&to)) {
            (Placement::ByAccount, Placement::ByAccount) if !by_account => breaches
                .push(format!("{from}: foreign key {name} to {to} does not pair account_id with account_id")),
            (Placement::ByAccount, Placement::Platform) => {
                breaches.push(format!("{from}: foreign key {name} to {to}, a platform table"))
            }
            (Placement::Reference, Placement::ByAccount) => breaches.push(format!(
                "{from}: foreign key {name} from a reference table to {to}, distributed by account"
            )),
            (Placement::Platform, Placement::ByAccount) => breaches.push(format!(
                "{from}: foreign key {name} from a platform table to {to}, distributed by account"
            )),
            _ => {}
        }
    }
    breaches.sort();
    breaches
}

/// A plain tokio-postgres client on the test's database, for reading the catalog and preparing
/// statements as text.
async fn catalog_client(app: &crate::helpers::TestApp) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&app.database_url, tokio_postgres::NoTls).await.expect("the test database");
    tokio::spawn(connection);
    client
}

/// The schema stays ready to be distributed by account (docs/scaling.md): a table added later
/// without `account_id`, or a unique index or foreign key that leaves it out, fails here unless
/// the table is placed in `NOT_BY_ACCOUNT`.
#[tokio::test]
async fn every_table_is_ready_to_be_distributed_by_account() {
    let app = spawn_app().await;
    let client = catalog_client(&app).await;
    let breaches = distribution_breaches(&client).await;
    assert!(breaches.is_empty(), "not ready to be distributed by account:\n{}", breaches.join("\n"));
}

/// The check above finds each kind of breach: a catalog query that matches nothing would pass
/// whatever the schema.
#[tokio::test]
async fn the_distribution_check_names_each_breach() {
    let app = spawn_app().await;
    let client = catalog_client(&app).await;
    client
        .batch_execute(
            "CREATE TABLE unkeyed (id uuid PRIMARY KEY);
             CREATE TABLE keyed_by_id (account_id uuid NOT NULL, id uuid PRIMARY KEY);
             CREATE TABLE keyed_by_text (account_id text, id uuid, PRIMARY KEY (account_id, id));
             CREATE TABLE unique_across_accounts (account_id uuid, id uuid, code text UNIQUE,
                 owner uuid, order_id uuid, PRIMARY KEY (account_id, id),
                 FOREIGN KEY (owner, order_id) REFERENCES orders (account_id, id));
             ALTER TABLE api_keys ADD COLUMN order_id uuid,
                 ADD FOREIGN KEY (account_id, order_id) REFERENCES orders (account_id, id);",
        )
        .await
        .unwrap();
    let breaches = distribution_breaches(&client).await;
    let expected = [
        "api_keys: foreign key api_keys_account_id_order_id_fkey from a reference table to orders",
        "keyed_by_id: primary key led by id, not account_id",
        "keyed_by_text: account_id is text",
        "unique_across_accounts: foreign key unique_across_accounts_owner_order_id_fkey to orders does not pair",
        "unique_across_accounts: unique index unique_across_accounts_code_key has no account_id",
        "unkeyed: no account_id column",
        "unkeyed: primary key led by id",
    ];
    for breach in expected {
        assert!(
            breaches.iter().any(|found| found.starts_with(breach)),
            "{breach:?} not among the breaches found:\n{}",
            breaches.join("\n")
        );
    }
    assert_eq!(breaches.len(), expected.len(), "{}", breaches.join("\n"));
}

/// Every hand-written statement, planned as the pools keep it (a generic plan, made while the
/// tables are small, then reused for the connection's life) on a fresh schema: none walks a
/// whole account, an index narrowed by `account_id` alone. Such a plan reads every row the
/// account has in that index for each call: the settle of a payment once read 1,700 buffers a
/// call this way in the benchmark (docs/performance.md).
#[tokio::test]
async fn no_statement_is_planned_to_walk_a_whole_account() {
    let app = spawn_app().await;
    let client = catalog_client(&app).await;
    client.batch_execute("SET plan_cache_mode = force_generic_plan").await.unwrap();
    let mut walks = Vec::new();
    let statements = orderpay::db::statement::every_statement();
    for (index, (files, sql, _, types)) in statements.iter().enumerate() {
        let declared: std::collections::BTreeMap<usize, String> = types
            .iter()
            .flat_map(|group| group.iter())
            .map(|(number, sql_type)| (*number, pg_type(sql_type)))
            .collect();
        let highest = declared.keys().last().copied().unwrap_or(0);
        // Each parameter as diesel binds it; a number the text skips (the events' 91-96 after
        // 19) still needs a type.
        let types: Vec<&str> =
            (1..=highest).map(|number| declared.get(&number).map_or("text", String::as_str)).collect();
        let nulls = vec!["NULL"; highest].join(", ");
        let (declare, execute) = if highest == 0 {
            (String::new(), String::new())
        } else {
            (format!("({})", types.join(", ")), format!("({nulls})"))
        };
        let sql = sql.trim_end().trim_end_matches(';');
        client
            .batch_execute(&format!("PREPARE statement_{index}{declare} AS {sql}"))
            .await
            .unwrap_or_else(|error| panic!("{files:?} does not prepare: {:?}", error.as_db_error()));
        let plan = client.simple_query(&format!("EXPLAIN EXECUTE statement_{index}{execute}")).await.unwrap();
        let lines: Vec<String> = plan
            .iter()
            .filter_map(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .collect();
        if lines.iter().any(|line| narrowed_by_the_account_alone(line)) {
            walks.push(format!("{files:?}\n{}", lines.join("\n")));
        }
    }
    assert!(statements.len() > 40, "every statement: {}", statements.len());
    assert!(walks.is_empty(), "plans that walk a whole account:\n{}", walks.join("\n\n"));
}

/// PostgreSQL's name of a diesel SQL type as `prepared_statement!` declares it.
fn pg_type(diesel_type: &str) -> String {
    let written: String = diesel_type.chars().filter(|c| !c.is_whitespace()).collect();
    let inner = |prefix: &str| {
        written.strip_prefix(prefix).and_then(|rest| rest.strip_suffix('>')).map(str::to_owned)
    };
    if let Some(inner) = inner("Nullable<") {
        return pg_type(&inner);
    }
    if let Some(inner) = inner("Array<") {
        return format!("{}[]", pg_type(&inner));
    }
    let name = match written.as_str() {
        "Uuid" | "SqlUuid" => "uuid",
        "Text" => "text",
        "Numeric" => "numeric",
        "Timestamptz" => "timestamptz",
        "BigInt" | "Int8" => "int8",
        "Int4" | "Integer" => "int4",
        "Int2" | "SmallInt" => "int2",
        "Bool" => "bool",
        "Jsonb" => "jsonb",
        "Bytea" => "bytea",
        other => panic!("no PostgreSQL name for the diesel type {other}"),
    };
    name.to_owned()
}

/// A plan line of an index scan whose only condition is the account named by a parameter:
/// `Index Cond: (account_id = $1)`, with or without a table alias (a join on an account's id,
/// or `account_id = ANY ($1)`, reads the accounts it is meant to).
fn narrowed_by_the_account_alone(line: &str) -> bool {
    let Some(condition) = line.trim().strip_prefix("Index Cond: (") else { return false };
    let condition = condition.strip_suffix(')').unwrap_or(condition);
    let Some((column, value)) = condition.split_once(" = ") else { return false };
    !condition.contains(" AND ") && column.rsplit('.').next() == Some("account_id") && value.starts_with('$')
}

#[tokio::test]
async fn the_write_settings_serve_advises_on_are_read_from_the_server_by_name() {
    let app = spawn_app().await;
    let mut conn = connect(&app.database_url).await.unwrap();
    let settings = orderpay::db::write_settings::read(&mut conn).await.unwrap();
    let names: Vec<&str> = settings.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(
        names,
        ["checkpoint_timeout", "max_wal_size", "shared_buffers", "wal_buffers", "wal_compression"]
    );
    // Whatever this server runs with, each advice names one of them with its value as shown.
    for advice in orderpay::db::write_settings::advise(&settings) {
        let (_, _, _, shown) = settings.iter().find(|(name, ..)| *name == advice.name).unwrap();
        assert_eq!(&advice.current, shown);
    }
}
