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
