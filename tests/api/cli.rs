//! The `orderpay` binary's own commands.

use std::process::Command;

use crate::helpers::spawn_app;

use crate::process::BIN;

#[tokio::test]
async fn accounts_create_prints_the_key_once_and_stores_only_its_hash() {
    let app = spawn_app().await;
    let output = Command::new(BIN)
        .args(["accounts", "create", "cli shop"])
        .env("DATABASE_URL", &app.database_url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("orderpay runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let key = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert!(key.starts_with("sk_") && key.len() == 67, "{key}");
    assert!(!String::from_utf8_lossy(&output.stderr).contains(&key), "the key is printed once");

    let with_key_hash = app
        .count(&format!(
            "SELECT count(*) AS count FROM accounts AS a JOIN api_keys AS k ON k.account_id = a.id \
             WHERE a.name = 'cli shop' AND k.key_hash = sha256('{key}'::bytea)"
        ))
        .await;
    assert_eq!(with_key_hash, 1);
    let response = app.client.get(app.url("/orders")).bearer_auth(&key).send().await.unwrap();
    assert_eq!(response.status(), 200, "the printed key authenticates");
}

#[test]
fn the_mock_provider_lists_its_settings() {
    let output = Command::new(BIN).args(["mock-provider", "--help"]).output().expect("orderpay runs");
    let help = String::from_utf8(output.stdout).unwrap();
    for variable in ["MOCK_PROVIDER_LISTEN", "MOCK_PROVIDER_TIMEOUT_HOLD_MS", "MOCK_PROVIDER_SETTLE_MS"] {
        assert!(help.contains(variable), "{variable} missing from:\n{help}");
    }
}

#[test]
fn serve_help_lists_every_setting() {
    let output = Command::new(BIN).args(["serve", "--help"]).output().expect("orderpay runs");
    let help = String::from_utf8(output.stdout).unwrap();
    for variable in [
        "DATABASE_URL",
        "ORDERPAY_LISTEN",
        "ORDERPAY_DB_POOL_SIZE",
        "ORDERPAY_DB_ACQUIRE_TIMEOUT_MS",
        "ORDERPAY_WORKERS",
        "ORDERPAY_REQUIRE_IDEMPOTENCY_KEY",
        "ORDERPAY_IDEMPOTENCY_TTL_SECS",
        "ORDERPAY_SWEEP_INTERVAL_MS",
        "ORDERPAY_SWEEP_BATCH_SIZE",
        "ORDERPAY_PROVIDER_URL",
        "ORDERPAY_PROVIDER_TIMEOUT_MS",
        "ORDERPAY_PAYMENT_LEASE_MS",
        "ORDERPAY_RECONCILE_INTERVAL_MS",
        "ORDERPAY_RECONCILE_BATCH_SIZE",
        "ORDERPAY_RECONCILE_MAX_ATTEMPTS",
        "ORDERPAY_RECONCILE_BACKOFF_BASE_MS",
        "ORDERPAY_RECONCILE_BACKOFF_CAP_MS",
        "ORDERPAY_SHUTDOWN_GRACE_SECS",
        "ORDERPAY_AUTH_CACHE_SECS",
        "ORDERPAY_REVOCATION_POLL_MS",
        "ORDERPAY_IDEMPOTENCY_AUDIT_DAYS",
        "ORDERPAY_NATS_URL",
        "ORDERPAY_NATS_STREAM",
        "ORDERPAY_NATS_SUBJECT_PREFIX",
        "ORDERPAY_NATS_TIMEOUT_MS",
    ] {
        assert!(help.contains(variable), "{variable} missing from:\n{help}");
    }
}

/// Only `serve` and `migrate` change the schema: any other command, a read such as `accounts
/// list` included, refuses a database whose migrations are not exactly its binary's, says what
/// to do, changes nothing, and prints the error without a backtrace even when asked for one.
#[tokio::test]
async fn commands_refuse_a_database_behind_or_ahead_of_their_binary_and_migrate_nothing() {
    let app = spawn_app().await;
    let newest = app.text("SELECT max(version)::text AS text FROM __diesel_schema_migrations").await;
    let accounts_list = || {
        Command::new(BIN)
            .args(["accounts", "list"])
            .env("DATABASE_URL", &app.database_url)
            .env("RUST_LOG", "warn")
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("orderpay runs")
    };
    let refused_with = |output: std::process::Output| {
        assert!(!output.status.success(), "refused");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!stderr.to_lowercase().contains("backtrace"), "no backtrace: {stderr}");
        assert!(output.stdout.is_empty(), "nothing listed");
        stderr
    };

    // Behind: the newest migration is not recorded as run.
    app.execute(&format!("DELETE FROM __diesel_schema_migrations WHERE version = '{newest}'")).await;
    let stderr = refused_with(accounts_list());
    assert!(stderr.contains("behind") && stderr.contains(&newest), "{stderr}");
    assert!(stderr.contains("run `orderpay migrate` first"), "{stderr}");
    let recorded =
        format!("SELECT count(*) AS count FROM __diesel_schema_migrations WHERE version = '{newest}'");
    assert_eq!(app.count(&recorded).await, 0, "the command migrated nothing");

    // Ahead: a migration this binary does not know.
    app.execute(&format!(
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('{newest}'), ('99991231000000')"
    ))
    .await;
    let stderr = refused_with(accounts_list());
    assert!(stderr.contains("ahead") && stderr.contains("99991231000000"), "{stderr}");

    // Exactly the binary's migrations: the command runs.
    app.execute("DELETE FROM __diesel_schema_migrations WHERE version = '99991231000000'").await;
    let listed = accounts_list();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
}

/// docs/configuration.md lists every variable the commands read (the ones `--help` shows).
#[test]
fn the_configuration_reference_lists_every_variable_of_serve_and_the_mock() {
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    for command in ["serve", "mock-provider"] {
        let output = Command::new(BIN).args([command, "--help"]).output().expect("orderpay runs");
        let help = String::from_utf8(output.stdout).unwrap();
        let variables: Vec<&str> =
            help.split("[env: ").skip(1).filter_map(|rest| rest.split([']', '=']).next()).collect();
        assert!(variables.len() >= 8, "{command} --help lists its variables:\n{help}");
        for variable in variables {
            assert!(
                reference.contains(&format!("`{variable}`")),
                "{variable} missing from docs/configuration.md"
            );
        }
    }
}

/// `provider check` against the mock tells a refused API key from a working one: a lookup (a
/// read) with the key, after the provider's health.
#[tokio::test]
async fn provider_check_fails_on_an_api_key_the_mock_refuses() {
    let app = crate::helpers::spawn_app_with(|_, mock| mock.api_key = Some("sk_mock_right".to_owned())).await;
    let refused =
        app.cli_with(&["provider", "check"], &[("ORDERPAY_PROVIDER_API_KEY", "sk_mock_wrong")]).await;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("refuses the API key (ORDERPAY_PROVIDER_API_KEY)"), "{said}");
    let accepted =
        app.cli_with(&["provider", "check"], &[("ORDERPAY_PROVIDER_API_KEY", "sk_mock_right")]).await;
    let printed = String::from_utf8_lossy(&accepted.stdout);
    assert!(accepted.status.success(), "{printed}{}", String::from_utf8_lossy(&accepted.stderr));
    assert!(printed.contains("health    ok") && printed.contains("api key   ok"), "{printed}");
    assert!(app.provider.charges().await.is_empty(), "the check moved nothing");
}
