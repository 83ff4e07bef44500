//! Configuration: every setting is an environment variable with a default, also accepted as a
//! command-line flag, and listed by `orderpay serve --help` and docs/configuration.md. One file
//! per subsystem (`database`, `provider` with the reconciler, `webhooks` both ways, `nats`, the
//! `mock` provider); this one holds `serve`'s own settings and assembles [`Settings`]. A single
//! value's range is clap's to check (`value_parser!(..).range(..)`: refused with the flag, the
//! range and the value before anything starts); what relates two settings is checked here.
//! Secrets are [`SecretString`]s, so a derived `Debug` of any of them prints none. Logging's
//! `ORDERPAY_LOG_FORMAT` and `RUST_LOG` are read by telemetry.rs.

mod database;
mod mock;
mod nats;
mod provider;
mod settlement;
mod webhooks;

use std::time::Duration;

use clap::{ArgAction, Args};
use secrecy::{ExposeSecret, SecretString};

pub use database::{DEFAULT_DATABASE_URL, DatabaseArgs};
pub use mock::MockProviderArgs;
pub use nats::NatsArgs;
pub use provider::{
    MOCK_PROVIDER_URL, ProviderArgs, ProviderConfig, ProviderKind, ReconcileArgs, StripeSettings, Wire,
    claim_for,
};
pub use settlement::SettlementArgs;
pub use webhooks::{MerchantWebhookArgs, ProviderWebhookSecrets, WebhookArgs};

use crate::db::DatabaseConfig;
use crate::events::nats::NatsConfig;
use crate::idempotency::sweeper::SweeperConfig;
use crate::merchant_webhooks::WebhookSettings;
use crate::operations::Timing;
use crate::operations::reconciler::ReconcilerConfig;
use crate::rate_limit::RateLimit;

/// A secret that was set to something other than blanks (an empty variable counts as unset).
fn non_empty(secret: &Option<SecretString>) -> Option<SecretString> {
    secret.clone().filter(|secret| !secret.expose_secret().trim().is_empty())
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub provider: ProviderArgs,

    #[command(flatten)]
    pub webhooks: WebhookArgs,

    #[command(flatten)]
    pub merchant_webhooks: MerchantWebhookArgs,

    #[command(flatten)]
    pub reconcile: ReconcileArgs,

    #[command(flatten)]
    pub nats: NatsArgs,

    #[command(flatten)]
    pub settlement: SettlementArgs,

    /// Address the HTTP API listens on.
    #[arg(long, env = "ORDERPAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,

    /// A separate address for `GET /metrics` (e.g. 127.0.0.1:9091), reachable by Prometheus
    /// but not by the API's clients; set, `/metrics` is served there only (404 on the API's
    /// address). Unset, it is served on the API's address.
    #[arg(long, env = "ORDERPAY_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,

    /// HTTP worker threads (default: one per CPU).
    #[arg(long, env = "ORDERPAY_WORKERS")]
    pub workers: Option<usize>,

    /// Refuse `POST /orders` and cancels without an `Idempotency-Key` (400).
    #[arg(long, env = "ORDERPAY_REQUIRE_IDEMPOTENCY_KEY", default_value_t = false, action = ArgAction::Set)]
    pub require_idempotency_key: bool,

    /// How long an idempotency key and its stored answer are kept (seconds): from a minute (a key
    /// must outlive every step of the operation it protects) to ten years.
    #[arg(long, env = "ORDERPAY_IDEMPOTENCY_TTL_SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(60..=10 * 365 * 86_400))]
    pub idempotency_ttl_secs: u64,

    /// How often the sweeper deletes expired idempotency keys (milliseconds).
    #[arg(long, env = "ORDERPAY_SWEEP_INTERVAL_MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_interval_ms: u64,

    /// How long events are kept for the Events API (days); then they are deleted in batches.
    /// At least the idempotency keys' lifetime: a key's answer to a new order is its event.
    #[arg(long, env = "ORDERPAY_EVENT_RETENTION_DAYS", default_value_t = 30)]
    pub event_retention_days: u64,

    /// How often each relay of the outbox (merchant webhooks, NATS) looks for new events
    /// (milliseconds); a full batch is followed at once by the next.
    #[arg(long, env = "ORDERPAY_RELAY_INTERVAL_MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub relay_interval_ms: u64,

    /// Events a relay hands on per round (one transaction).
    #[arg(long, env = "ORDERPAY_RELAY_BATCH_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub relay_batch_size: i64,

    /// Rows the sweeper deletes per statement.
    #[arg(long, env = "ORDERPAY_SWEEP_BATCH_SIZE", default_value_t = 1_000,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub sweep_batch_size: i64,

    /// How long a payment request owns its key while it calls the provider; a retry after that
    /// takes the payment over. Must exceed the provider timeout.
    #[arg(long, env = "ORDERPAY_PAYMENT_LEASE_MS", default_value_t = 15_000)]
    pub payment_lease_ms: u64,

    /// How long an authenticated API key is remembered in memory, saving a database round trip
    /// per request (0 turns the cache off).
    #[arg(long, env = "ORDERPAY_AUTH_CACHE_SECS", default_value_t = 60)]
    pub auth_cache_secs: u64,

    /// How often each instance reads the API key revocation counter (one tiny query); a revoked
    /// key is refused within about this long, and cached keys are not trusted once three polls
    /// in a row failed. At most a second: a revoked key must not outlive the promise made for it.
    #[arg(long, env = "ORDERPAY_REVOCATION_POLL_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(10..=1000))]
    pub revocation_poll_ms: u64,

    /// Days the metadata of an expired idempotency key (no answer body) is kept in the audit
    /// table after it expired (`orderpay keys show`). 0 keeps none.
    #[arg(long, env = "ORDERPAY_IDEMPOTENCY_AUDIT_DAYS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=3650))]
    pub idempotency_audit_days: u64,

    /// Bytes of final idempotent answers kept in memory, so that a replay needs no database
    /// round trip (0 turns the cache off; an order's answer is about 1 KB).
    #[arg(long, env = "ORDERPAY_REPLAY_CACHE_BYTES", default_value_t = 16 << 20)]
    pub replay_cache_bytes: u64,

    /// Sustained requests per second allowed per account (0: no limit), counted by each instance
    /// on its own. Beyond it: 429.
    #[arg(long, env = "ORDERPAY_RATE_LIMIT_PER_SEC", default_value_t = 1000)]
    pub rate_limit_per_sec: u32,

    /// Requests an idle account may send at once.
    #[arg(long, env = "ORDERPAY_RATE_LIMIT_BURST", default_value_t = 2000)]
    pub rate_limit_burst: u32,

    /// How long a client may take to send its request head before 408 and disconnect.
    #[arg(long, env = "ORDERPAY_CLIENT_TIMEOUT_MS", default_value_t = 5000)]
    pub client_timeout_ms: u64,

    /// How long a client may take to send its request body, once the head is in, before 408 and
    /// disconnect.
    #[arg(long, env = "ORDERPAY_CLIENT_BODY_TIMEOUT_MS", default_value_t = 10_000)]
    pub client_body_timeout_ms: u64,

    /// Open client connections at most, in all (split evenly between the workers); beyond it new
    /// connections wait in the listen backlog. Each idle connection costs a few KiB.
    #[arg(long, env = "ORDERPAY_MAX_CONNECTIONS", default_value_t = 4096,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,

    /// On SIGTERM, how long in-flight requests (and then background tasks) may take to finish.
    #[arg(long, env = "ORDERPAY_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
}

/// What the API needs at request time.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub require_idempotency_key: bool,
    pub idempotency_retention: Duration,
    /// How long an authenticated API key is remembered in memory (zero: never).
    pub auth_cache_ttl: Duration,
    /// How often the API key revocation counter is read.
    pub revocation_poll: Duration,
    /// Bytes of final idempotent answers kept in memory for replays (zero: none).
    pub replay_cache_bytes: u64,
    /// Per-account request rate limit.
    pub rate_limit: RateLimit,
    /// The secrets provider webhooks are signed with, by the provider's wire; off: no
    /// `POST /provider/webhooks`.
    pub provider_webhooks: ProviderWebhookSecrets,
}

/// How the outbox's relays poll (`events::relay`).
#[derive(Debug, Clone, Copy)]
pub struct RelayConfig {
    pub interval: Duration,
    pub batch_size: i64,
}

/// Everything `serve` needs, built from [`ServeArgs`] by the CLI or directly by tests.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database: DatabaseConfig,
    pub listen: String,
    /// Where `GET /metrics` is served instead of `listen`, when set.
    pub metrics_listen: Option<String>,
    pub workers: usize,
    pub api: ApiSettings,
    pub sweeper: SweeperConfig,
    pub provider: ProviderConfig,
    pub timing: Timing,
    pub reconciler: ReconcilerConfig,
    pub shutdown_grace: Duration,
    /// How long events are kept.
    pub event_retention: Duration,
    pub relay: RelayConfig,
    /// Merchant webhooks; `None` (off) without `ORDERPAY_ENCRYPTION_KEY`.
    pub webhooks: Option<WebhookSettings>,
    /// The NATS JetStream relay, when `ORDERPAY_NATS_URL` is set.
    pub nats: Option<NatsConfig>,
    /// The settlement job; `None` when off.
    pub settlement: Option<crate::settlement::job::SettlementConfig>,
    pub client_timeout: Duration,
    /// How long a request body may take to arrive once the head is in.
    pub client_body_timeout: Duration,
    /// Open connections at most, over all workers.
    pub max_connections: usize,
}

impl ServeArgs {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        // Stripe's settings are checked in full, so that a half-configured Stripe is named as
        // such, every missing setting at once.
        let stripe = self.provider.kind == ProviderKind::Stripe;
        if stripe {
            StripeSettings::read(&self.provider, &self.webhooks)?;
        }
        let provider = self.provider.config()?;
        anyhow::ensure!(
            self.payment_lease_ms > self.provider.provider_timeout_ms,
            "ORDERPAY_PAYMENT_LEASE_MS must be longer than ORDERPAY_PROVIDER_TIMEOUT_MS"
        );
        let reconciler = self.reconcile.config(&provider);
        // A key must outlive every step of the operation it protects, a payment's lease first.
        anyhow::ensure!(
            self.idempotency_ttl_secs * 1000 > self.payment_lease_ms,
            "ORDERPAY_IDEMPOTENCY_TTL_SECS must be longer than ORDERPAY_PAYMENT_LEASE_MS"
        );
        // A new order's key row names its `order.created` event for the answer's body
        // (idempotency_keys.answer_event_id), and a settled payment's or capture's row the event
        // its settle wrote (answer_event_id of the operation tables): the event must outlive
        // every key whose replay reads it. Each such event is written after its key, so keys'
        // lifetime suffices.
        anyhow::ensure!(
            self.event_retention_days.saturating_mul(86_400) >= self.idempotency_ttl_secs,
            "ORDERPAY_EVENT_RETENTION_DAYS must be at least ORDERPAY_IDEMPOTENCY_TTL_SECS: a key's stored \
             answer to a new order, a payment or a capture is read from its event"
        );
        let retention = Duration::from_secs(self.idempotency_ttl_secs);
        let workers = self
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1);
        Ok(Settings {
            database: self.database.config()?,
            listen: self.listen.clone(),
            metrics_listen: self.metrics_listen.clone().filter(|address| !address.trim().is_empty()),
            workers,
            api: ApiSettings {
                require_idempotency_key: self.require_idempotency_key,
                idempotency_retention: retention,
                auth_cache_ttl: Duration::from_secs(self.auth_cache_secs),
                revocation_poll: Duration::from_millis(self.revocation_poll_ms),
                replay_cache_bytes: self.replay_cache_bytes,
                rate_limit: RateLimit { per_second: self.rate_limit_per_sec, burst: self.rate_limit_burst },
                provider_webhooks: match stripe {
                    true => ProviderWebhookSecrets::Stripe(self.webhooks.stripe_secrets()?),
                    false => ProviderWebhookSecrets::Standard(self.webhooks.secrets()?),
                },
            },
            sweeper: SweeperConfig {
                interval: Duration::from_millis(self.sweep_interval_ms),
                batch_size: self.sweep_batch_size,
                audit_retention: Duration::from_secs(self.idempotency_audit_days * 86_400),
            },
            provider,
            timing: Timing {
                lease: Duration::from_millis(self.payment_lease_ms),
                recheck_after: reconciler.backoff_base,
            },
            reconciler,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            event_retention: Duration::from_secs(self.event_retention_days.saturating_mul(86_400)),
            relay: RelayConfig {
                interval: Duration::from_millis(self.relay_interval_ms),
                batch_size: self.relay_batch_size,
            },
            webhooks: self.merchant_webhooks.settings()?,
            nats: self.nats.config()?,
            settlement: self.settlement.config(),
            client_timeout: Duration::from_millis(self.client_timeout_ms.max(1)),
            client_body_timeout: Duration::from_millis(self.client_body_timeout_ms.max(1)),
            max_connections: self.max_connections,
        })
    }
}
