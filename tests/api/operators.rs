//! What an operator does at 3 a.m.: API keys with a life cycle (several per account, revoked
//! everywhere within a second), and expired idempotency keys kept in an audit (`keys show`).

use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{Nullable, Text, Timestamptz};
use orderpay::accounts::keys::{self, Revocation};
use orderpay::idempotency::sweeper::{self, Swept};
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{
    TestApp, connect, new_key, order_body, spawn_app, spawn_app_on_database, spawn_app_with,
    url_with_database,
};

async fn status_with(app: &TestApp, api_key: &str) -> u16 {
    app.client
        .get(app.url("/orders"))
        .bearer_auth(api_key)
        .send()
        .await
        .expect("GET /orders")
        .status()
        .as_u16()
}

/// The id of the key whose secret is `secret`, from the database.
async fn key_id(app: &TestApp, secret: &str) -> Uuid {
    let mut conn = app.db().await;
    let hash = orderpay::accounts::hash_api_key(secret);
    keys::lookup(&mut conn, &hash).await.expect("lookup").expect("a live key").key_id
}

/// Waits until `app` answers `api_key` with 401; returns how long that took from `since`.
async fn refused_after(app: &TestApp, api_key: &str, since: Instant) -> Duration {
    let deadline = since + Duration::from_secs(5);
    loop {
        let status = status_with(app, api_key).await;
        if status == 401 {
            return since.elapsed();
        }
        assert_eq!(status, 200, "a key is either accepted or refused");
        assert!(Instant::now() < deadline, "the revoked key was still accepted after 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_revoked_key_is_refused_by_every_instance_within_a_second_while_other_keys_keep_working() {
    // Two instances on one database, each with the authentication cache on (60 s).
    let first = spawn_app().await;
    let second = spawn_app_on_database(&first.database_url, |_, _| {}).await;
    assert!(!first.settings.api.auth_cache_ttl.is_zero());
    let mut conn = first.db().await;
    let (_, _, other) = keys::create(&mut conn, first.account_id).await.unwrap().expect("the account exists");
    let (_, _, control) =
        keys::create(&mut conn, first.account_id).await.unwrap().expect("the account exists");
    let revoked = first.api_key.clone();
    for app in [&first, &second] {
        for key in [&revoked, other.reveal(), control.reveal()] {
            assert_eq!(status_with(app, key).await, 200);
        }
    }

    // The control: a key marked revoked in the table without the revocation's generation bump
    // is still served from both caches, so the caches are really on and what follows measures
    // the revocation reaching them, not a lookup that would have happened anyway.
    let control_id = key_id(&first, control.reveal()).await;
    first.execute(&format!("UPDATE api_keys SET revoked_at = now() WHERE id = '{control_id}'")).await;
    for app in [&first, &second] {
        assert_eq!(status_with(app, control.reveal()).await, 200, "served from the cache");
    }

    let revoked_id = key_id(&first, &revoked).await;
    let started = Instant::now();
    let revocation = keys::revoke(&mut conn, revoked_id).await.expect("revoke");
    assert!(matches!(revocation, Some(Revocation::Revoked(_))), "{revocation:?}");
    let (on_first, on_second) =
        tokio::join!(refused_after(&first, &revoked, started), refused_after(&second, &revoked, started));
    eprintln!("revoked key refused after {on_first:?} (first instance) and {on_second:?} (second)");
    assert!(on_first < Duration::from_secs(1), "first instance took {on_first:?}");
    assert!(on_second < Duration::from_secs(1), "second instance took {on_second:?}");

    for app in [&first, &second] {
        assert_eq!(status_with(app, other.reveal()).await, 200, "the account's other key still works");
        assert_eq!(status_with(app, control.reveal()).await, 401, "the cleared cache read the table again");
    }
}

#[tokio::test]
async fn operators_create_list_and_revoke_keys_with_the_cli() {
    let app = spawn_app().await;
    let created = app.cli(&["accounts", "create", "ops shop"]).await;
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let first_key = String::from_utf8(created.stdout).unwrap().trim().to_owned();
    assert!(first_key.starts_with("sk_") && first_key.len() == 67, "stdout holds the key alone: {first_key}");

    let accounts = app.cli_json(&["accounts", "list"]).await;
    let accounts = accounts.as_array().expect("a JSON array");
    assert_eq!(accounts.len(), 2, "the test's account and this one: {accounts:?}");
    let account = accounts.iter().find(|account| account["name"] == "ops shop").expect("listed");
    assert_eq!(account["live_keys"], 1);
    let account_id = account["id"].as_str().unwrap().to_owned();
    let table = app.cli_ok(&["accounts", "list"]).await;
    assert!(table.starts_with("ID ") && table.contains("LIVE KEYS"), "{table}");
    assert!(table.lines().any(|line| line.contains(&account_id) && line.contains("ops shop")), "{table}");

    let output = app.cli(&["accounts", "keys", "create", &account_id]).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let second_key = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let said = String::from_utf8(output.stderr).unwrap();
    assert!(second_key.starts_with("sk_") && second_key.len() == 67, "{second_key}");
    assert!(!said.contains(&second_key), "the secret is printed once, on stdout");
    assert!(said.contains(&second_key[..11]), "stderr names the new key by its prefix: {said}");

    for key in [&first_key, &second_key] {
        assert_eq!(status_with(&app, key).await, 200);
    }
    let listed = app.cli_json(&["accounts", "keys", "list", &account_id]).await;
    let listed = listed.as_array().expect("a JSON array").clone();
    assert_eq!(listed.len(), 2);
    let text = serde_json::to_string(&listed).unwrap();
    for key in [&first_key, &second_key] {
        assert!(!text.contains(key.as_str()), "a listing never shows a secret");
        assert!(listed.iter().any(|listed| listed["prefix"] == key[..11]), "{text}");
    }
    for listed in &listed {
        for field in ["id", "account_id", "prefix", "created_at", "last_used_at", "revoked_at"] {
            assert!(listed.get(field).is_some(), "{field} missing from {listed}");
        }
        assert_eq!(listed["revoked_at"], Value::Null);
    }
    let first_id = listed.iter().find(|listed| listed["prefix"] == first_key[..11]).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let revoked = app.cli(&["accounts", "keys", "revoke", &first_id]).await;
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    assert!(String::from_utf8_lossy(&revoked.stderr).contains("revoked key"));
    let again = app.cli(&["accounts", "keys", "revoke", &first_id]).await;
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already revoked"));

    let started = Instant::now();
    let took = refused_after(&app, &first_key, started).await;
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(status_with(&app, &second_key).await, 200);
    let listed = app.cli_json(&["accounts", "keys", "list", &account_id]).await;
    let revoked_row =
        listed.as_array().unwrap().iter().find(|listed| listed["id"] == first_id.as_str()).unwrap();
    assert!(revoked_row["revoked_at"].is_string(), "{revoked_row}");
    let table = app.cli_ok(&["accounts", "keys", "list", &account_id]).await;
    assert!(table.contains("PREFIX") && table.contains("LAST USED") && table.contains("REVOKED"), "{table}");
    let accounts = app.cli_json(&["accounts", "list"]).await;
    let account =
        accounts.as_array().unwrap().iter().find(|account| account["id"] == account_id.as_str()).unwrap();
    assert_eq!(account["live_keys"], 1);

    // Mistakes are said, not panicked on.
    let unknown = app.cli(&["accounts", "keys", "create", &Uuid::now_v7().to_string()]).await;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no account"));
    let malformed = app.cli(&["accounts", "keys", "list", "not-an-id"]).await;
    assert!(!malformed.status.success());
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("is not an account id"));
    let no_key = app.cli(&["accounts", "keys", "revoke", &Uuid::now_v7().to_string()]).await;
    assert!(!no_key.status.success());
    assert!(String::from_utf8_lossy(&no_key.stderr).contains("no API key"));
}

#[derive(QueryableByName)]
struct LastUsed {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_used_at: Option<chrono::DateTime<chrono::Utc>>,
}

async fn last_used(app: &TestApp, id: Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
    use diesel_async::RunQueryDsl;
    let mut conn = app.db().await;
    let row: LastUsed = diesel::sql_query(format!("SELECT last_used_at FROM api_keys WHERE id = '{id}'"))
        .get_result(&mut conn)
        .await
        .expect("the key row");
    row.last_used_at
}

#[tokio::test]
async fn last_used_is_written_once_a_minute_not_per_request() {
    // The cache off: every request reads the key from the database, the case that could write.
    let app = spawn_app_with(|settings, _| settings.api.auth_cache_ttl = Duration::ZERO).await;
    let id = key_id(&app, &app.api_key).await;
    assert_eq!(last_used(&app, id).await, None);
    assert_eq!(status_with(&app, &app.api_key).await, 200);
    let mut noted = None;
    for _ in 0..100 {
        noted = last_used(&app, id).await;
        if noted.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let noted = noted.expect("the first use is written down");
    for _ in 0..20 {
        assert_eq!(status_with(&app, &app.api_key).await, 200);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(last_used(&app, id).await, Some(noted), "no write within the minute");

    // A minute later (moved back in the table), the next use is written again.
    app.execute(&format!(
        "UPDATE api_keys SET last_used_at = now() - interval '61 seconds' WHERE id = '{id}'"
    ))
    .await;
    let before = last_used(&app, id).await.unwrap();
    assert_eq!(status_with(&app, &app.api_key).await, 200);
    let mut later = before;
    for _ in 0..100 {
        later = last_used(&app, id).await.unwrap();
        if later > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(later > before, "the use after a minute is written");
}

#[tokio::test]
async fn a_key_made_before_keys_had_a_life_cycle_survives_the_migration() {
    use diesel::migration::MigrationSource;
    use diesel_async::AsyncPgConnection;
    use diesel_async::RunQueryDsl;
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
    use diesel_migrations::MigrationHarness;

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let name = format!("orderpay_test_{now}_{}", Uuid::now_v7().simple());
    let url = url_with_database(&name);
    let mut admin = connect(&url_with_database("postgres")).await.unwrap();
    diesel::sql_query(format!("CREATE DATABASE \"{name}\"")).execute(&mut admin).await.unwrap();

    // The schema as it was before this change: every migration before api_keys_and_audit.
    let conn = connect(&url).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(conn);
        diesel::migration::MigrationConnection::setup(&mut conn).unwrap();
        let migrations = MigrationSource::<diesel::pg::Pg>::migrations(&orderpay::db::MIGRATIONS).unwrap();
        for migration in
            migrations.iter().take_while(|m| !m.name().to_string().contains("api_keys_and_audit"))
        {
            conn.run_migration(migration.as_ref()).unwrap();
        }
    })
    .await
    .unwrap();
    let old_key = orderpay::accounts::ApiKey::generate().unwrap();
    let mut conn = connect(&url).await.unwrap();
    diesel::sql_query(format!(
        "INSERT INTO accounts (id, name, api_key_hash, created_at) \
         VALUES ('{}', 'old shop', sha256('{}'::bytea), now() - interval '3 days')",
        Uuid::now_v7(),
        old_key.reveal()
    ))
    .execute(&mut conn)
    .await
    .unwrap();

    // The app migrates the rest at start, and the old key still authenticates.
    let app = spawn_app_on_database(&url, |_, _| {}).await;
    assert_eq!(status_with(&app, old_key.reveal()).await, 200);
    let id = key_id(&app, old_key.reveal()).await;
    assert_eq!(id.get_version_num(), 7, "ids stay UUIDv7");
    #[derive(QueryableByName)]
    struct Migrated {
        #[diesel(sql_type = Nullable<Text>)]
        prefix: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        dated_like_its_account: bool,
    }
    let migrated: Migrated = diesel::sql_query(format!(
        "SELECT k.prefix, k.created_at = a.created_at AS dated_like_its_account \
         FROM api_keys AS k JOIN accounts AS a ON a.id = k.account_id WHERE k.id = '{id}'"
    ))
    .get_result(&mut conn)
    .await
    .unwrap();
    assert_eq!(migrated.prefix, None, "the secret of an old key was never stored, nor its prefix");
    assert!(migrated.dated_like_its_account);
    let columns = app
        .count("SELECT count(*) AS count FROM information_schema.columns WHERE table_name = 'accounts' AND column_name = 'api_key_hash'")
        .await;
    assert_eq!(columns, 0, "the column is gone");
    drop(conn);
    drop(app);
    let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await;
}

/// One sweeper round, as the background task runs it.
async fn sweep(app: &TestApp) -> Swept {
    let pool = orderpay::db::background_pool(&app.settings.database, 1);
    sweeper::sweep_round(&pool, &app.settings.sweeper).await.expect("sweep")
}

async fn expire_key(app: &TestApp, key: &str) {
    app.execute(&format!(
        "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = '{key}'"
    ))
    .await;
}

#[derive(QueryableByName)]
struct AuditRow {
    #[diesel(sql_type = Text)]
    key: String,
    #[diesel(sql_type = Text)]
    method: String,
    #[diesel(sql_type = Text)]
    route: String,
    #[diesel(sql_type = Text)]
    resource_kind: String,
    #[diesel(sql_type = Text)]
    resource_id: String,
    #[diesel(sql_type = Nullable<diesel::sql_types::Int2>)]
    response_status: Option<i16>,
}

async fn audit_rows(app: &TestApp) -> Vec<AuditRow> {
    use diesel_async::RunQueryDsl;
    let mut conn = app.db().await;
    diesel::sql_query(
        "SELECT key, method, route, resource_kind, resource_id::text AS resource_id, response_status \
         FROM idempotency_key_audit ORDER BY created_at",
    )
    .load(&mut conn)
    .await
    .expect("audit rows")
}

#[tokio::test]
async fn the_sweeper_moves_expired_keys_to_the_audit_without_their_answers() {
    // No in-memory replays: an expired key must reach the store to count as new.
    let app = spawn_app_with(|settings, _| settings.api.replay_cache_bytes = 0).await;
    let (expired, kept) = (new_key(), new_key());
    let order = crate::helpers::json(app.post_order(&order_body(), Some(&expired)).await).await;
    app.post_order(&order_body(), Some(&kept)).await;
    let paid_order = app.create_order().await;
    let pay_key = new_key();
    assert_eq!(app.pay(paid_order["id"].as_str().unwrap(), "pm_card_ok", &pay_key).await.status(), 201);
    expire_key(&app, &expired).await;
    expire_key(&app, &pay_key).await;

    assert_eq!(sweep(&app).await, Swept { moved: 2, purged: 0 });
    assert_eq!(app.keys_stored().await, 1, "the live key stays");
    let rows = audit_rows(&app).await;
    assert_eq!(rows.len(), 2);
    let order_row = rows.iter().find(|row| row.key == expired).expect("the order's key is audited");
    assert_eq!((order_row.method.as_str(), order_row.route.as_str()), ("POST", "/orders"));
    assert_eq!((order_row.resource_kind.as_str(), order_row.response_status), ("order", Some(201)));
    assert_eq!(order_row.resource_id, order["id"].as_str().unwrap());
    let pay_row = rows.iter().find(|row| row.key == pay_key).expect("the payment's key is audited");
    assert_eq!((pay_row.route.as_str(), pay_row.resource_kind.as_str()), ("/payments", "payment"));
    // No answer is kept: no column for one, and nothing of the bodies in the rows.
    let answer_columns = app
        .count(
            "SELECT count(*) AS count FROM information_schema.columns \
             WHERE table_name = 'idempotency_key_audit' AND column_name IN ('response_body', 'response_headers')",
        )
        .await;
    assert_eq!(answer_columns, 0);
    let with_body = app
        .count("SELECT count(*) AS count FROM idempotency_key_audit AS a WHERE a::text LIKE '%tee-black-m%' OR a::text LIKE '%cus_123%'")
        .await;
    assert_eq!(with_body, 0);

    // The key is free for new use; its earlier use stays in the audit.
    let again = app.post_order(&order_body(), Some(&expired)).await;
    assert_eq!(again.status(), 201);
    assert!(again.headers().get("idempotent-replayed").is_none());
    let shown = app.cli_json(&["keys", "show", "--account", &app.account_id.to_string(), &expired]).await;
    assert_eq!(shown["state"], "live");
    assert_eq!(shown["earlier_uses"], 1);
    let shown = app.cli_json(&["keys", "show", "--account", &app.account_id.to_string(), &pay_key]).await;
    assert_eq!(shown["state"], "expired-in-audit");
    assert_eq!(shown["resource_kind"], "payment");
    assert_eq!(shown["stored_status"], 201, "a payment's answer is read from the payment");
    assert_eq!(shown["operation_status"], "succeeded");
}

#[tokio::test]
async fn a_key_met_past_its_retention_by_a_request_is_audited_too() {
    let app = spawn_app_with(|settings, _| settings.api.replay_cache_bytes = 0).await;
    let key = new_key();
    let first = crate::helpers::json(app.post_order(&order_body(), Some(&key)).await).await;
    expire_key(&app, &key).await;
    assert_eq!(app.post_order(&order_body(), Some(&key)).await.status(), 201);
    let rows = audit_rows(&app).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].resource_id, first["id"].as_str().unwrap());
}

#[tokio::test]
async fn audit_rows_past_their_retention_are_deleted() {
    let app = spawn_app().await;
    let (old, recent) = (new_key(), new_key());
    for key in [&old, &recent] {
        app.post_order(&order_body(), Some(key)).await;
        expire_key(&app, key).await;
    }
    assert_eq!(sweep(&app).await, Swept { moved: 2, purged: 0 });
    // Expired 31 days ago: past the 30 days of audit retention.
    app.execute(&format!(
        "UPDATE idempotency_key_audit SET expires_at = now() - interval '31 days' WHERE key = '{old}'"
    ))
    .await;
    assert_eq!(sweep(&app).await, Swept { moved: 0, purged: 1 });
    let rows = audit_rows(&app).await;
    assert_eq!(rows.iter().map(|row| row.key.as_str()).collect::<Vec<_>>(), [recent.as_str()]);
    let account = app.account_id.to_string();
    let gone = app.cli(&["keys", "show", "--account", &account, &old]).await;
    assert!(!gone.status.success(), "a key past the audit retention is unknown");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no key"));
    let kept = app.cli_json(&["keys", "show", "--account", &account, &recent]).await;
    assert_eq!(kept["state"], "expired-in-audit");
}

#[tokio::test]
async fn keys_show_tells_a_live_key_and_the_lease_of_its_operation_in_flight() {
    // The provider holds pm_provider_timeout answers 3 s; the request waits up to 5 s, its lease
    // lasts 10 s: the payment is in flight, leased to the request, while we look.
    let app = spawn_app_with(|settings, _| {
        settings.provider.timeout = Duration::from_secs(5);
        settings.timing.lease = Duration::from_secs(10);
    })
    .await;
    let account = app.account_id.to_string();

    let order_key = new_key();
    let order = crate::helpers::json(app.post_order(&order_body(), Some(&order_key)).await).await;
    let shown = app.cli_json(&["keys", "show", "--account", &account, &order_key]).await;
    assert_eq!(shown["state"], "live");
    assert_eq!((shown["method"].as_str(), shown["route"].as_str()), (Some("POST"), Some("/orders")));
    assert_eq!(shown["resource_kind"], "order");
    assert_eq!(shown["resource_id"], order["id"]);
    assert_eq!(shown["stored_status"], 201);
    assert_eq!(shown["in_flight"], false);
    let fingerprint = shown["fingerprint"].as_str().unwrap();
    let matching = app
        .count(&format!(
            "SELECT count(*) AS count FROM idempotency_keys WHERE encode(fingerprint, 'hex') = '{fingerprint}'"
        ))
        .await;
    assert_eq!(matching, 1, "the fingerprint is the stored one, in hex");
    for field in ["created_at", "expires_at"] {
        assert!(shown[field].is_string(), "{field}: {shown}");
    }

    let paid_order = app.create_order().await;
    let order_id = paid_order["id"].as_str().unwrap().to_owned();
    let pay_key = new_key();
    let paying = app.pay(&order_id, "pm_provider_timeout", &pay_key);
    let looking = async {
        for _ in 0..150 {
            let leased = app
                .count("SELECT count(*) AS count FROM payments WHERE status = 'processing' AND lease_until > now()")
                .await;
            if leased == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let json = app.cli_json(&["keys", "show", "--account", &account, &pay_key]).await;
        let table = app.cli_ok(&["keys", "show", "--account", &account, &pay_key]).await;
        (json, table)
    };
    let (paid, (shown, table)) = tokio::join!(paying, looking);
    assert_eq!(paid.status(), 201, "the held answer arrives within the provider timeout");
    assert_eq!(shown["state"], "live");
    assert_eq!(shown["route"], "/payments");
    assert_eq!(shown["in_flight"], true, "{shown}");
    assert_eq!(shown["stored_status"], Value::Null);
    let owner = shown["lease_owner"].as_str().expect("a lease owner").to_owned();
    assert!(shown["lease_until"].is_string());
    assert!(table.contains(&format!("held by {owner} until")), "{table}");
    assert!(table.lines().any(|line| line.starts_with("state") && line.ends_with("live")), "{table}");

    // Settled: the answer is the payment's, and no lease is shown.
    let shown = app.cli_json(&["keys", "show", "--account", &account, &pay_key]).await;
    assert_eq!(shown["in_flight"], false);
    assert_eq!(shown["stored_status"], 201);
    assert_eq!(shown["operation_status"], "succeeded");
    assert_eq!(shown["lease_owner"], Value::Null);

    let unknown = app.cli(&["keys", "show", "--account", &account, "never-used"]).await;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no key"));
}
