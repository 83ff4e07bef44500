//! `spawn_app()` and the helpers every test uses.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use orderpay::app::Application;
use orderpay::config::{ApiSettings, ProviderConfig, ProviderWebhookSecrets, Settings, claim_for};
use orderpay::db::{DatabaseConfig, Server};
use orderpay::encryption::Keyring;
use orderpay::idempotency::sweeper::SweeperConfig;
use orderpay::ids::AccountId;
use orderpay::merchant_webhooks::{DeliveryConfig, WebhookSettings};
use orderpay::operations::reconciler::{PassReport, ReconcilerConfig};
use orderpay::operations::{Engine, Timing};
use orderpay::provider::PaymentProvider;
use orderpay::provider::mock::{self, MockProvider, MockSettings};
use orderpay::provider::stripe::{ApiKey, WebhookSecret};
use orderpay::webhook_signature::Secret;
use reqwest::{Method, RequestBuilder, Response};
use serde_json::{Value, json};
use uuid::Uuid;

/// Test databases are named `orderpay_test_<unix seconds>_<id>`; ones older than this were left
/// by a crashed run and are dropped when the next test starts.
const STALE_AFTER_SECS: u64 = 3600;

/// The server the tests use: `TEST_DATABASE_URL`, else `DATABASE_URL`, else the local default.
/// Only its host, port and credentials matter; every test makes its own database there.
pub fn server_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| orderpay::config::DEFAULT_DATABASE_URL.to_owned())
}

/// `url` with extra parameters (`sslmode=require`), in the URL's own form.
pub fn with_params(url: &str, params: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}{params}")
    } else {
        format!("{url} {}", params.replace('&', " "))
    }
}

/// The server URL naming database `name`: a `dbname` parameter, which wins over the database
/// the URL names (in either form, with any number of hosts).
pub fn url_with_database(name: &str) -> String {
    with_params(&server_url(), &format!("dbname={name}"))
}

/// A direct connection, through the service's own connect path (TLS, several hosts).
pub async fn connect(url: &str) -> anyhow::Result<AsyncPgConnection> {
    orderpay::db::establish(&url.parse()?, Duration::from_secs(5)).await
}

/// Points the app at `servers` (host, port) instead of its database's own, everything else in
/// its `DATABASE_URL` unchanged.
pub fn use_servers(settings: &mut Settings, servers: &[(&str, u16)]) {
    let servers: Vec<Server> = servers.iter().map(|(host, port)| Server::tcp(host, *port)).collect();
    settings.database.url.pg = settings.database.url.with_servers(&servers);
}

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub api_key: String,
    pub account_id: AccountId,
    pub database_url: String,
    pub settings: Settings,
    pub provider: TestProvider,
    database_name: String,
    server: actix_web::dev::ServerHandle,
}

/// This test's mock payment provider, a real HTTP server.
pub struct TestProvider {
    pub address: String,
    pub client: reqwest::Client,
    server: actix_web::dev::ServerHandle,
}

impl Drop for TestProvider {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

/// Mock provider settings for tests: timeouts hold 3 s, pending charges settle after 300 ms.
pub fn test_mock_settings() -> MockSettings {
    MockSettings {
        listen: "127.0.0.1:0".to_owned(),
        timeout_hold: Duration::from_secs(3),
        settle_after: Duration::from_millis(300),
        ..MockSettings::default()
    }
}

pub async fn spawn_mock_provider(settings: MockSettings) -> TestProvider {
    let mock = MockProvider::build(settings).expect("the mock provider builds");
    let address = format!("http://127.0.0.1:{}", mock.port());
    let server = mock.server_handle();
    tokio::spawn(mock.run_until_stopped());
    TestProvider { address, client: http_client(), server }
}

impl TestProvider {
    /// Every charge the provider holds (`GET /_admin/charges`).
    pub async fn charges(&self) -> Vec<Value> {
        let response = self.client.get(format!("{}/_admin/charges", self.address)).send().await.unwrap();
        json(response).await["data"].as_array().unwrap().clone()
    }

    /// Charges made with the downstream key of `payment_id`.
    pub async fn charges_for(&self, payment_id: &str) -> Vec<Value> {
        let key = format!("orderpay_pay_{payment_id}");
        self.charges().await.into_iter().filter(|charge| charge["idempotency_key"] == key.as_str()).collect()
    }

    /// Every refund the provider made (`GET /_admin/refunds`).
    pub async fn refunds(&self) -> Vec<Value> {
        self.admin_list("refunds").await
    }

    /// Every dispute the customers' banks opened (`GET /_admin/disputes`).
    pub async fn disputes(&self) -> Vec<Value> {
        self.admin_list("disputes").await
    }

    /// Every webhook event with its delivery attempts (`GET /_admin/webhooks`).
    pub async fn webhooks(&self) -> Vec<Value> {
        self.admin_list("webhooks").await
    }

    async fn admin_list(&self, what: &str) -> Vec<Value> {
        let response = self.client.get(format!("{}/_admin/{what}", self.address)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        json(response).await["data"].as_array().unwrap().clone()
    }

    pub async fn set_faults(&self, faults: Value) {
        self.admin_post("faults", &faults).await;
    }

    /// What each next write does, in order (`POST /_admin/script`): `[{"act": "hold"}, ...]`.
    pub async fn script(&self, steps: Value) {
        self.admin_post("script", &steps).await;
    }

    async fn admin_post(&self, what: &str, body: &Value) {
        let response =
            self.client.post(format!("{}/_admin/{what}", self.address)).json(body).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
}

/// A fresh `ORDERPAY_ENCRYPTION_KEY`: the base64 of 32 random bytes.
pub fn new_encryption_key() -> String {
    use base64::Engine;
    let mut bytes = [0_u8; 32];
    orderpay::crypto::fill_random(&mut bytes).expect("randomness");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Merchant webhooks for tests, for `settings.webhooks`: a fresh key, private addresses and
/// plain http allowed (the receivers are local), polls every 20 ms, a 2 s timeout, retries from 50 ms to 1 s, 5
/// attempts.
pub fn test_webhook_settings() -> WebhookSettings {
    WebhookSettings {
        encryption_keys: Keyring::parse(&new_encryption_key()).expect("a valid key"),
        allow_private: true,
        require_https: false,
        secret_overlap: Duration::from_secs(86_400),
        delivery: DeliveryConfig {
            poll: Duration::from_millis(20),
            timeout: Duration::from_secs(2),
            lease: Duration::from_secs(5),
            retry_base: Duration::from_millis(50),
            retry_cap: Duration::from_secs(1),
            max_attempts: 5,
            concurrency: 8,
        },
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_, _| {}).await
}

/// The knob that turns provider webhooks on, for `spawn_app_with`'s `configure`: a fresh secret
/// for the app, and (unless `configure` points the mock elsewhere) the mock sends its events to
/// the app's `POST /provider/webhooks`, signed with it.
pub fn provider_webhooks_on(settings: &mut Settings) {
    settings.api.provider_webhooks =
        ProviderWebhookSecrets::Standard(vec![Secret::generate().expect("a webhook secret")]);
}

/// The wire between the app and its mock provider: the mock's own contract, or Stripe's API
/// (the Stripe adapter talking to the mock's Stripe wire). A test written once runs over both
/// with [`over_both_wires!`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestWire {
    Mock,
    Stripe,
}

/// The test-mode key the app sends on the Stripe wire, and the mock requires.
pub const STRIPE_TEST_KEY: &str = "sk_test_orderpay_mock_stripe_wire";
/// The endpoint secret of a service subprocess on the Stripe wire (which refuses to start
/// without one); tests that deliver webhooks to an in-process app use their own.
const STRIPE_WEBHOOK_SECRET: &str = "whsec_orderpay_mock_stripe_wire";

impl TestWire {
    /// Puts the app and its mock on this wire, for `spawn_app_with`'s `configure`.
    pub fn configure(self, settings: &mut Settings, mock: &mut MockSettings) {
        self.configure_mock(mock);
        settings.provider.wire = self.client_wire();
    }

    /// Puts a mock provider on this wire.
    pub fn configure_mock(self, mock: &mut MockSettings) {
        if self == TestWire::Stripe {
            mock.wire = mock::Wire::Stripe;
            mock.api_key = Some(STRIPE_TEST_KEY.to_owned());
        }
    }

    /// What the app's provider client speaks on this wire.
    pub fn client_wire(self) -> orderpay::config::Wire {
        match self {
            TestWire::Mock => orderpay::config::Wire::Mock { api_key: None },
            TestWire::Stripe => orderpay::config::Wire::Stripe {
                api_key: ApiKey::parse(STRIPE_TEST_KEY).expect("a Stripe test key"),
                created_filter: true,
            },
        }
    }

    /// The app's provider client on this wire, for a mock at `url`, giving up after `timeout`.
    pub fn client(self, url: &str, timeout: Duration) -> Arc<dyn PaymentProvider> {
        let config = ProviderConfig { url: url.to_owned(), timeout, wire: self.client_wire() };
        orderpay::app::provider(&config).expect("the provider client")
    }

    /// The id the app holds for the mock's charge `ch_...`: on Stripe's wire, its PaymentIntent's.
    pub fn charge_id(self, mock_id: &str) -> String {
        match (self, mock_id.strip_prefix("ch_")) {
            (TestWire::Stripe, Some(rest)) => format!("pi_{rest}"),
            _ => mock_id.to_owned(),
        }
    }

    /// The environment that puts `orderpay serve` or `orderpay reconcile` on this wire.
    pub fn env(self) -> Vec<(&'static str, &'static str)> {
        match self {
            TestWire::Mock => Vec::new(),
            TestWire::Stripe => vec![
                ("ORDERPAY_PROVIDER", "stripe"),
                ("ORDERPAY_PROVIDER_API_KEY", STRIPE_TEST_KEY),
                ("ORDERPAY_PROVIDER_WEBHOOK_SECRET", STRIPE_WEBHOOK_SECRET),
            ],
        }
    }
}

impl TestApp {
    /// The wire this app speaks to its provider.
    pub fn wire(&self) -> TestWire {
        match self.settings.provider.wire {
            orderpay::config::Wire::Mock { .. } => TestWire::Mock,
            orderpay::config::Wire::Stripe { .. } => TestWire::Stripe,
        }
    }
}

/// Spawns the app and its mock provider on `wire`.
pub async fn spawn_app_on_wire(wire: TestWire) -> TestApp {
    spawn_app_with(|settings, mock| wire.configure(settings, mock)).await
}

/// Writes a test once for both wires: `async fn name(wire: TestWire) { ... }` becomes the tests
/// `name::mock` and `name::stripe`, the body run with each.
macro_rules! over_both_wires {
    ($(#[$meta:meta])* async fn $name:ident($wire:ident: TestWire) $body:block) => {
        $(#[$meta])*
        async fn $name($wire: $crate::helpers::TestWire) $body

        mod $name {
            #[tokio::test]
            async fn mock() {
                super::$name($crate::helpers::TestWire::Mock).await
            }

            #[tokio::test]
            async fn stripe() {
                super::$name($crate::helpers::TestWire::Stripe).await
            }
        }
    };
}
pub(crate) use over_both_wires;

/// Spawns the app (and its own mock provider) with settings adjusted by `configure`.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings, &mut MockSettings)) -> TestApp {
    spawn_app_on(None, configure).await
}

/// Spawns the app on a database of another server (a test's own cluster): the app and the
/// test's direct checks both use `database_url`.
pub async fn spawn_app_on_database(
    database_url: &str,
    configure: impl FnOnce(&mut Settings, &mut MockSettings),
) -> TestApp {
    spawn_app_on(Some(database_url), configure).await
}

async fn spawn_app_on(
    database_url: Option<&str>,
    configure: impl FnOnce(&mut Settings, &mut MockSettings),
) -> TestApp {
    if std::env::var("TEST_LOG").is_ok() {
        orderpay::telemetry::init();
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let database_name = format!("orderpay_test_{now}_{}", Uuid::now_v7().simple());
    drop_stale_databases(now).await;
    let database_url = database_url.map_or_else(|| url_with_database(&database_name), str::to_owned);
    let mut settings = Settings {
        database: DatabaseConfig {
            url: database_url.parse().expect("a valid database URL"),
            pool_size: 4,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
        },
        listen: "127.0.0.1:0".to_owned(),
        metrics_listen: None,
        workers: 2,
        api: ApiSettings {
            require_idempotency_key: false,
            idempotency_retention: Duration::from_secs(86_400),
            auth_cache_ttl: Duration::from_secs(60),
            revocation_poll: Duration::from_millis(250),
            replay_cache_bytes: 16 << 20,
            // Off in tests, but where a test turns it on.
            rate_limit: orderpay::rate_limit::RateLimit { per_second: 0, burst: 0 },
            // Off unless a test turns them on (`provider_webhooks_on`).
            provider_webhooks: ProviderWebhookSecrets::Off,
        },
        sweeper: SweeperConfig {
            interval: Duration::from_secs(3600),
            batch_size: 1000,
            audit_retention: Duration::from_secs(30 * 86_400),
        },
        provider: ProviderConfig {
            url: String::new(),
            timeout: Duration::from_secs(1),
            wire: orderpay::config::Wire::Mock { api_key: None },
        },
        timing: Timing { lease: Duration::from_secs(2), recheck_after: Duration::from_millis(50) },
        // Off unless a test turns it on: tests run passes themselves to control their timing.
        reconciler: ReconcilerConfig {
            interval: Duration::from_secs(3600),
            batch_size: 50,
            max_attempts: 5,
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(200),
            claim_for: claim_for(Duration::from_secs(1)),
            // The provider timeout (1 s) and a 100 ms margin.
            quiet_before_give_up: Duration::from_millis(1100),
            late_charge_watch: Duration::from_secs(60),
            late_refund_watch: Duration::from_secs(60),
        },
        shutdown_grace: Duration::from_secs(5),
        event_retention: Duration::from_secs(30 * 86_400),
        relay: orderpay::config::RelayConfig { interval: Duration::from_millis(20), batch_size: 500 },
        // Off unless a test turns them on (`test_webhook_settings`): a relay and a worker polling
        // every 20 ms in every test's app would load the machine for nothing.
        webhooks: None,
        // Off unless a test turns it on (tests/api/nats.rs).
        nats: None,
        // Off unless a test turns it on (tests/api/settlement.rs runs windows itself).
        settlement: None,
        client_timeout: Duration::from_secs(5),
        client_body_timeout: Duration::from_secs(10),
        max_connections: 4096,
    };
    let mut mock_settings = test_mock_settings();
    configure(&mut settings, &mut mock_settings);
    // Bound before the mock starts, so that the mock can be told where to send webhooks.
    let listener = std::net::TcpListener::bind(&settings.listen).expect("the app's port");
    let port = listener.local_addr().unwrap().port();
    if let Some(secret) = settings.api.provider_webhooks.standard().first().map(Secret::reveal)
        && mock_settings.webhook_url.is_none()
    {
        mock_settings.webhook_url = Some(format!("http://127.0.0.1:{port}/provider/webhooks"));
        if mock_settings.wire == mock::Wire::Stripe {
            // The same secret, read as Stripe reads an endpoint secret.
            let stripe = WebhookSecret::parse(&secret).expect("a whsec_ secret");
            settings.api.provider_webhooks = ProviderWebhookSecrets::Stripe(vec![stripe]);
        }
        mock_settings.webhook_secret = Some(secret);
    }
    let provider = spawn_mock_provider(mock_settings).await;
    if settings.provider.url.is_empty() {
        settings.provider.url = provider.address.clone();
    }
    let app = Application::build_on(settings.clone(), listener).await.expect("the app builds");
    let address = format!("http://127.0.0.1:{port}");
    let server = app.server_handle();
    tokio::spawn(app.run_until_stopped());

    let mut test_app = TestApp {
        address,
        client: http_client(),
        api_key: String::new(),
        account_id: AccountId::generate(),
        database_url,
        settings,
        provider,
        database_name,
        server,
    };
    let (account_id, api_key) = test_app.create_account("test account").await;
    test_app.account_id = account_id;
    test_app.api_key = api_key;
    test_app
}

async fn drop_stale_databases(now: u64) {
    let Ok(mut admin) = connect(&url_with_database("postgres")).await else {
        return;
    };
    #[derive(diesel::QueryableByName)]
    struct Name {
        #[diesel(sql_type = diesel::sql_types::Text)]
        datname: String,
    }
    let names: Vec<Name> =
        diesel::sql_query("SELECT datname FROM pg_database WHERE datname LIKE 'orderpay\\_test\\_%'")
            .load(&mut admin)
            .await
            .unwrap_or_default();
    for Name { datname } in names {
        let created: Option<u64> = datname.split('_').nth(2).and_then(|s| s.parse().ok());
        if created.is_some_and(|created| created + STALE_AFTER_SECS < now) {
            let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS \"{datname}\" WITH (FORCE)"))
                .execute(&mut admin)
                .await;
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // The stop command is sent when `stop` is called; its completion is not awaited here.
        drop(self.server.stop(false));
        // Drop the database from a thread of its own: Drop cannot await, and the test's runtime
        // may be shutting down.
        let name = self.database_name.clone();
        let admin_url = url_with_database("postgres");
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let mut admin = connect(&admin_url).await.ok()?;
                diesel::sql_query(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .ok()
            })
        })
        .join();
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// A request authenticated as the test account.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, self.url(path)).bearer_auth(&self.api_key)
    }

    pub async fn post_order(&self, body: &Value, key: Option<&str>) -> Response {
        self.post_order_as(&self.api_key, body, key).await
    }

    pub async fn post_order_as(&self, api_key: &str, body: &Value, key: Option<&str>) -> Response {
        let mut request = self.client.post(self.url("/orders")).bearer_auth(api_key).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("POST /orders")
    }

    /// POST /orders with a raw body, as sent.
    pub async fn post_order_raw(&self, body: &str, key: Option<&str>) -> Response {
        let mut request = self
            .request(Method::POST, "/orders")
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("POST /orders")
    }

    pub async fn get_order(&self, id: &str) -> Response {
        self.request(Method::GET, &format!("/orders/{id}")).send().await.expect("GET /orders/{id}")
    }

    pub async fn cancel_order(&self, id: &str, key: Option<&str>) -> Response {
        let mut request = self.request(Method::POST, &format!("/orders/{id}/cancel"));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("POST /orders/{id}/cancel")
    }

    /// Creates another account in this test's database; returns its id and API key.
    pub async fn create_account(&self, name: &str) -> (AccountId, String) {
        let mut conn = self.db().await;
        let (account, key) = orderpay::accounts::create(&mut conn, name).await.expect("account");
        (account.id, key.reveal().to_owned())
    }

    /// A direct connection to this test's database, for checking what was stored.
    pub async fn db(&self) -> AsyncPgConnection {
        connect(&self.database_url).await.expect("test database")
    }

    pub async fn count(&self, sql: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            count: i64,
        }
        let mut conn = self.db().await;
        diesel::sql_query(sql).get_result::<Count>(&mut conn).await.expect(sql).count
    }

    /// The one text value `sql` selects (as `text`).
    pub async fn text(&self, sql: &str) -> String {
        #[derive(diesel::QueryableByName)]
        struct Text {
            #[diesel(sql_type = diesel::sql_types::Text)]
            text: String,
        }
        let mut conn = self.db().await;
        diesel::sql_query(sql).get_result::<Text>(&mut conn).await.expect(sql).text
    }

    pub async fn execute(&self, sql: &str) {
        let mut conn = self.db().await;
        diesel::sql_query(sql).execute(&mut conn).await.expect(sql);
    }

    /// Makes every insert into `table` fail inside its transaction, as a real fault would:
    /// the rows written before it in the same transaction roll back with it.
    pub async fn fail_inserts_into(&self, table: &str) {
        self.execute(&format!(
            "CREATE FUNCTION fail_{table}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$"
        ))
        .await;
        self.execute(&format!(
            "CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION fail_{table}()"
        ))
        .await;
    }

    pub async fn heal_inserts_into(&self, table: &str) {
        self.execute(&format!("DROP TRIGGER fail_{table} ON {table}")).await;
    }

    /// One reconciler pass, as `orderpay reconcile --once` runs it.
    pub async fn reconcile_once(&self) -> PassReport {
        let provider = orderpay::app::provider(&self.settings.provider).unwrap();
        self.reconcile_once_with(provider).await
    }

    /// One reconciler pass that asks `provider`.
    pub async fn reconcile_once_with(&self, provider: Arc<dyn PaymentProvider>) -> PassReport {
        orderpay::operations::reconciler::run_pass(&self.engine_with(provider), &self.settings.reconciler)
            .await
            .expect("reconciler pass")
    }

    /// The engine of this app's settings, driving operations at `provider`.
    pub fn engine_with(&self, provider: Arc<dyn PaymentProvider>) -> Engine {
        let pool = orderpay::db::background_pool(&self.settings.database, 2);
        orderpay::app::engine(&self.settings, pool, provider)
    }

    /// Runs `orderpay ARGS` against this app's database and provider, with its provider and
    /// reconciler settings as `serve` reads them (plus `env`), off the test's runtime (whose tasks
    /// keep running meanwhile).
    pub async fn cli_with(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut vars = vec![
            ("DATABASE_URL", self.database_url.clone()),
            ("RUST_LOG", "warn".to_owned()),
            ("ORDERPAY_PROVIDER_URL", self.settings.provider.url.clone()),
        ];
        vars.extend(self.engine_env());
        vars.extend(env.iter().map(|(name, value)| (*name, (*value).to_owned())));
        let vars: Vec<(String, String)> =
            vars.into_iter().map(|(name, value)| (name.to_owned(), value)).collect();
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(crate::process::BIN)
                .args(&args)
                .envs(vars)
                .output()
                .expect("orderpay runs")
        })
        .await
        .expect("the command's thread")
    }

    /// This app's provider, lease and reconciler settings and its wire, as `orderpay` reads them
    /// from its environment: a subprocess given them drives operations as this app would.
    pub fn engine_env(&self) -> Vec<(&'static str, String)> {
        let millis = |duration: Duration| duration.as_millis().to_string();
        let (provider, reconciler) = (&self.settings.provider, &self.settings.reconciler);
        let mut vars = vec![
            ("ORDERPAY_PROVIDER_TIMEOUT_MS", millis(provider.timeout)),
            ("ORDERPAY_PAYMENT_LEASE_MS", millis(self.settings.timing.lease)),
            ("ORDERPAY_REPLAY_CACHE_BYTES", self.settings.api.replay_cache_bytes.to_string()),
            ("ORDERPAY_RECONCILE_MAX_ATTEMPTS", reconciler.max_attempts.to_string()),
            ("ORDERPAY_RECONCILE_BACKOFF_BASE_MS", millis(reconciler.backoff_base)),
            ("ORDERPAY_RECONCILE_BACKOFF_CAP_MS", millis(reconciler.backoff_cap)),
            (
                "ORDERPAY_GIVE_UP_MARGIN_MS",
                millis(reconciler.quiet_before_give_up.saturating_sub(provider.timeout)),
            ),
            ("ORDERPAY_LATE_CHARGE_WATCH_SECS", reconciler.late_charge_watch.as_secs().to_string()),
            ("ORDERPAY_LATE_REFUND_WATCH_SECS", reconciler.late_refund_watch.as_secs().to_string()),
        ];
        vars.extend(self.wire().env().into_iter().map(|(name, value)| (name, value.to_owned())));
        vars
    }

    pub async fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cli_with(args, &[]).await
    }

    /// Runs a command that must succeed; returns its stdout.
    pub async fn cli_ok(&self, args: &[&str]) -> String {
        let output = self.cli(args).await;
        assert!(
            output.status.success(),
            "orderpay {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 output")
    }

    /// Runs a command that must succeed with `--json`; returns what it printed.
    pub async fn cli_json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let stdout = self.cli_ok(&args).await;
        serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("not JSON ({error}): {stdout}"))
    }

    pub async fn create_order(&self) -> Value {
        let response = self.post_order(&order_body(), None).await;
        assert_eq!(response.status(), 201);
        json(response).await
    }

    pub async fn pay(&self, order_id: &str, payment_method: &str, key: &str) -> Response {
        self.pay_with(&json!({ "order_id": order_id, "payment_method": payment_method }), key).await
    }

    pub async fn pay_with(&self, body: &Value, key: &str) -> Response {
        self.request(Method::POST, "/payments")
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("POST /payments")
    }

    pub async fn get_payment(&self, id: &str) -> Value {
        let response = self.request(Method::GET, &format!("/payments/{id}")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        json(response).await
    }

    pub async fn get_refund(&self, id: &str) -> Value {
        let response = self.request(Method::GET, &format!("/refunds/{id}")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        json(response).await
    }

    pub async fn order_status(&self, id: &str) -> String {
        json(self.get_order(id).await).await["status"].as_str().unwrap().to_owned()
    }

    pub async fn payments_stored(&self) -> i64 {
        self.count("SELECT count(*) AS count FROM payments").await
    }

    pub async fn orders_stored(&self) -> i64 {
        self.count("SELECT count(*) AS count FROM orders").await
    }

    pub async fn keys_stored(&self) -> i64 {
        self.count("SELECT count(*) AS count FROM idempotency_keys").await
    }
}

/// An HTTP client for the tests (reqwest is built with rustls, whose crypto provider orderpay
/// installs once per process).
pub fn http_client() -> reqwest::Client {
    orderpay::provider::client::install_crypto_provider();
    reqwest::Client::new()
}

/// A valid order body.
pub fn order_body() -> Value {
    json!({
        "currency": "USD",
        "items": [
            { "sku": "tee-black-m", "quantity": 2, "unit_price": "19.99" },
            { "sku": "mug", "quantity": 1, "unit_price": "8.50" }
        ],
        "customer_id": "cus_123",
        "metadata": { "channel": "ios" }
    })
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    Uuid::now_v7().to_string()
}

/// The response's JSON body (panics on anything else).
pub async fn json(response: Response) -> Value {
    let text = response.text().await.expect("body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Asserts a problem+json response with the given status and type; returns its body.
pub async fn assert_problem(response: Response, status: u16, problem_type: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "status for {problem_type}");
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let body = json(response).await;
    assert_eq!(body["type"], problem_type, "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(body["title"].is_string() && body["detail"].is_string(), "{body}");
    body
}

/// What a server answered on a raw connection, and whether it closed the connection.
#[derive(Debug)]
pub struct RawAnswer {
    pub text: String,
    /// The server closed the connection (a read returned 0) before `wait` ran out.
    pub closed: bool,
}

impl RawAnswer {
    /// The status code of the first response, if any.
    pub fn status(&self) -> Option<u16> {
        self.text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }
}

/// Reads everything a server sends on `stream` until it closes the connection or `wait` passes
/// without news (blocking: call it from `spawn_blocking` or a thread).
pub fn read_until_closed(stream: &mut std::net::TcpStream, wait: Duration) -> RawAnswer {
    use std::io::Read;
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 8192];
    let closed = loop {
        match stream.read(&mut buffer) {
            Ok(0) => break true,
            Ok(read) => answer.extend_from_slice(&buffer[..read]),
            // A reset after the answer is a close too.
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_timed_out) => break false,
        }
    };
    RawAnswer { text: String::from_utf8_lossy(&answer).into_owned(), closed }
}

impl TestApp {
    /// `127.0.0.1:<port>`, for raw TCP clients.
    pub fn socket_address(&self) -> String {
        self.address.trim_start_matches("http://").to_owned()
    }
}

/// How often the pollers below look.
const POLL: Duration = Duration::from_millis(10);

/// Polls `check` every 10 ms until it holds, failing after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `check` every 10 ms until it returns something, failing after `limit`.
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

impl TestApp {
    /// Runs settlement over `window` as an operator would, in pages of 7 (so that a test's few
    /// movements span several).
    pub async fn settle(&self, window: orderpay::settlement::Window) -> orderpay::settlement::Report {
        let provider = orderpay::app::provider(&self.settings.provider).expect("the provider client");
        let options = orderpay::settlement::RunOptions {
            page_size: 7,
            scheduled: false,
            stale_claim: Duration::from_secs(60),
        };
        let mut conn = self.db().await;
        orderpay::settlement::run(&mut conn, provider.as_ref(), window, options)
            .await
            .expect("the settlement run")
    }

    /// Our books follow the provider's money: once nothing is in flight, every payment's
    /// `amount_captured`, `amount_refunded` and `amount_disputed` equal what the provider's
    /// charge for its downstream key captured, refunded and lost to disputes (none: nothing
    /// captured), the ledger check holds, and settlement finds every movement of the provider's
    /// records in the ledger and every ledger movement in them. `make chaos` asserts it after
    /// every run. Returns how many payments were compared.
    pub async fn assert_books_equal_the_provider(&self) -> usize {
        let in_flight = self
            .count(
                "SELECT (SELECT count(*) FROM payments WHERE status = 'processing') \
                 + (SELECT count(*) FROM refunds WHERE status = 'processing') \
                 + (SELECT count(*) FROM payment_operations WHERE status = 'processing') \
                 + (SELECT count(*) FROM dispute_responses WHERE status = 'processing') AS count",
            )
            .await;
        assert_eq!(in_flight, 0, "nothing is in flight when the books are compared");
        let charges = self.provider.charges().await;
        #[derive(diesel::QueryableByName)]
        struct Books {
            #[diesel(sql_type = diesel::sql_types::Text)]
            id: String,
            #[diesel(sql_type = diesel::sql_types::Numeric)]
            amount_captured: rust_decimal::Decimal,
            #[diesel(sql_type = diesel::sql_types::Numeric)]
            amount_refunded: rust_decimal::Decimal,
            #[diesel(sql_type = diesel::sql_types::Numeric)]
            amount_disputed: rust_decimal::Decimal,
        }
        let mut conn = self.db().await;
        let payments: Vec<Books> = diesel::sql_query(
            "SELECT id::text AS id, amount_captured, amount_refunded, amount_disputed FROM payments",
        )
        .load(&mut conn)
        .await
        .expect("our books");
        let money =
            |value: &Value| value.as_str().map_or(rust_decimal::Decimal::ZERO, |text| text.parse().unwrap());
        for payment in &payments {
            let key = format!("orderpay_pay_{}", payment.id);
            let theirs: Vec<&Value> =
                charges.iter().filter(|charge| charge["idempotency_key"] == key.as_str()).collect();
            assert!(theirs.len() <= 1, "one charge per payment at the provider: {theirs:?}");
            let zero = rust_decimal::Decimal::ZERO;
            let (captured, refunded, disputed) = <[_]>::first(&theirs).map_or((zero, zero, zero), |charge| {
                let money = |field: &str| money(&charge[field]);
                (money("amount_captured"), money("amount_refunded"), money("amount_disputed"))
            });
            assert_eq!(
                (payment.amount_captured, payment.amount_refunded, payment.amount_disputed),
                (captured, refunded, disputed),
                "payment {}: our captured, refunded and disputed, the provider's: {theirs:?}",
                payment.id
            );
        }
        // And the ledger agrees with those columns, every order's net money is right, and
        // nothing is still in flight for any of them.
        let report = orderpay::ledger::check(&mut conn, chrono::Utc::now()).await.expect("ledger check");
        assert!(report.holds() && report.in_flight.is_empty(), "the ledger's books: {report:?}");
        // And the provider's own records of money moved (its balance transactions) match the
        // ledger movement for movement: settlement over all time finds no exception.
        let all_time = orderpay::settlement::Window {
            start: chrono::DateTime::UNIX_EPOCH,
            end: chrono::Utc::now() + chrono::Duration::hours(1),
        };
        let settled = self.settle(all_time).await;
        assert_eq!(settled.exceptions(), 0, "settlement against the provider's records: {settled:#?}");
        payments.len()
    }
}
