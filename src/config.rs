//! Configuration: every setting is an environment variable with a default, also accepted as a
//! command-line flag, and listed by `orderpay serve --help`.
//!
//! Variables read here: `DATABASE_URL`, `ORDERPAY_DB_POOL_SIZE`, `ORDERPAY_DB_ACQUIRE_TIMEOUT_MS`,
//! `ORDERPAY_DB_CONNECT_TIMEOUT_MS`, `ORDERPAY_DB_STATEMENT_TIMEOUT_MS`, `ORDERPAY_LISTEN`,
//! `ORDERPAY_METRICS_LISTEN`, `ORDERPAY_WORKERS`, `ORDERPAY_REQUIRE_IDEMPOTENCY_KEY`, `ORDERPAY_IDEMPOTENCY_TTL_SECS`,
//! `ORDERPAY_SWEEP_INTERVAL_MS`, `ORDERPAY_SWEEP_BATCH_SIZE`, `ORDERPAY_PROVIDER_URL`,
//! `ORDERPAY_PROVIDER_TIMEOUT_MS`, `ORDERPAY_PAYMENT_LEASE_MS`, `ORDERPAY_RECONCILE_INTERVAL_MS`,
//! `ORDERPAY_RECONCILE_BATCH_SIZE`, `ORDERPAY_RECONCILE_MAX_ATTEMPTS`,
//! `ORDERPAY_RECONCILE_BACKOFF_BASE_MS`, `ORDERPAY_RECONCILE_BACKOFF_CAP_MS`,
//! `ORDERPAY_GIVE_UP_MARGIN_MS`, `ORDERPAY_LATE_CHARGE_WATCH_SECS`, `ORDERPAY_LATE_REFUND_WATCH_SECS`,
//! `ORDERPAY_EVENT_RETENTION_DAYS`, `ORDERPAY_RELAY_INTERVAL_MS`, `ORDERPAY_RELAY_BATCH_SIZE`,
//! `ORDERPAY_SHUTDOWN_GRACE_SECS`, `ORDERPAY_AUTH_CACHE_SECS`, `ORDERPAY_REPLAY_CACHE_BYTES`,
//! `ORDERPAY_RATE_LIMIT_PER_SEC`, `ORDERPAY_RATE_LIMIT_BURST`, `ORDERPAY_CLIENT_TIMEOUT_MS`,
//! `ORDERPAY_CLIENT_BODY_TIMEOUT_MS`, `ORDERPAY_MAX_CONNECTIONS`,
//! `ORDERPAY_PROVIDER_WEBHOOK_SECRET`, `ORDERPAY_REVOCATION_POLL_MS`,
//! `ORDERPAY_IDEMPOTENCY_AUDIT_DAYS`, `ORDERPAY_NATS_URL`, `ORDERPAY_NATS_STREAM`,
//! `ORDERPAY_NATS_SUBJECT_PREFIX`, `ORDERPAY_NATS_TIMEOUT_MS`, `ORDERPAY_ENCRYPTION_KEY`,
//! `ORDERPAY_WEBHOOK_ALLOW_PRIVATE`, `ORDERPAY_WEBHOOK_REQUIRE_HTTPS`,
//! `ORDERPAY_WEBHOOK_TIMEOUT_MS`, `ORDERPAY_WEBHOOK_LEASE_MS`,
//! `ORDERPAY_WEBHOOK_RETRY_BASE_MS`, `ORDERPAY_WEBHOOK_RETRY_CAP_MS`,
//! `ORDERPAY_WEBHOOK_MAX_ATTEMPTS`, `ORDERPAY_WEBHOOK_POLL_MS`, `ORDERPAY_WEBHOOK_CONCURRENCY`,
//! `ORDERPAY_WEBHOOK_SECRET_OVERLAP_MS`; for the mock provider `MOCK_PROVIDER_LISTEN`,
//! `MOCK_PROVIDER_TIMEOUT_HOLD_MS`, `MOCK_PROVIDER_SETTLE_MS`, `MOCK_PROVIDER_AUTH_TTL_MS`,
//! `MOCK_PROVIDER_API_KEY`, `MOCK_PROVIDER_WEBHOOK_URL`, `MOCK_PROVIDER_WEBHOOK_SECRET`,
//! `MOCK_PROVIDER_WEBHOOK_RETRY_MS`; and, for logging (see telemetry.rs), `ORDERPAY_LOG_FORMAT` and
//! `RUST_LOG`.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::db::DatabaseConfig;
use crate::encryption::Keyring;
use crate::events::nats::NatsConfig;
use crate::idempotency::sweeper::SweeperConfig;
use crate::merchant_webhooks::{DeliveryConfig, WebhookSettings};
use crate::operations::Timing;
use crate::operations::reconciler::ReconcilerConfig;
use crate::provider::mock::MockSettings;
use crate::rate_limit::RateLimit;
use crate::webhook_signature::Secret;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/orderpay";

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL or key=value string, as libpq reads it: several hosts to fail over between
    /// (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write), sslmode
    /// (disable|prefer|require|verify-ca|verify-full) and sslrootcert. The database is created
    /// when missing and migrated at start.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,

    /// Database connections in all (split between the HTTP workers; the background tasks use 2
    /// more). Keep it small: more connections than cores slows PostgreSQL down.
    #[arg(long, env = "ORDERPAY_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,

    /// How long a request waits for a database connection before answering 503.
    #[arg(long, env = "ORDERPAY_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000)]
    pub db_acquire_timeout_ms: u64,

    /// How long one database host may take to accept a session (TCP, TLS, authentication, the
    /// read-write check) before the next host in DATABASE_URL is tried.
    #[arg(long, env = "ORDERPAY_DB_CONNECT_TIMEOUT_MS", default_value_t = 5000)]
    pub db_connect_timeout_ms: u64,

    /// Longest a request's database statement may run: set as the session's statement_timeout,
    /// and enforced by orderpay too (plus 500 ms), so that a frozen server gets 503, not a hang.
    /// 0 turns it off.
    #[arg(long, env = "ORDERPAY_DB_STATEMENT_TIMEOUT_MS", default_value_t = 10_000)]
    pub db_statement_timeout_ms: u64,
}

impl DatabaseArgs {
    /// The settings, with `DATABASE_URL` parsed (an error names no part of the URL: it may hold a
    /// password).
    pub fn config(&self) -> anyhow::Result<DatabaseConfig> {
        Ok(DatabaseConfig {
            url: self.database_url.parse()?,
            pool_size: self.db_pool_size,
            acquire_timeout: Duration::from_millis(self.db_acquire_timeout_ms),
            connect_timeout: Duration::from_millis(self.db_connect_timeout_ms.max(1)),
            statement_timeout: Duration::from_millis(self.db_statement_timeout_ms),
        })
    }
}

#[derive(Clone, Args)]
pub struct ProviderArgs {
    /// Base URL of the payment provider (the mock provider by default).
    #[arg(long, env = "ORDERPAY_PROVIDER_URL", default_value = "http://127.0.0.1:8081")]
    pub provider_url: String,

    /// How long a provider call may take before its outcome counts as unknown (202).
    #[arg(long, env = "ORDERPAY_PROVIDER_TIMEOUT_MS", default_value_t = 5_000)]
    pub provider_timeout_ms: u64,

    /// The provider credential, sent as `Authorization: Bearer` on every call (default: none).
    #[arg(long, env = "ORDERPAY_PROVIDER_API_KEY", hide_env_values = true)]
    pub provider_api_key: Option<String>,
}

impl ProviderArgs {
    pub fn config(&self) -> ProviderConfig {
        ProviderConfig {
            url: self.provider_url.clone(),
            timeout: Duration::from_millis(self.provider_timeout_ms),
            api_key: self.provider_api_key.clone().filter(|key| !key.is_empty()),
        }
    }
}

/// Written by hand so that the API key never reaches a log line.
impl std::fmt::Debug for ProviderArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderArgs")
            .field("provider_url", &self.provider_url)
            .field("provider_timeout_ms", &self.provider_timeout_ms)
            .field("provider_api_key", &self.provider_api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(Clone)]
pub struct ProviderConfig {
    pub url: String,
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer` when set.
    pub api_key: Option<String>,
}

/// Written by hand so that the API key never reaches a log line.
impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// How often the reconciler looks for payments to settle.
    #[arg(long, env = "ORDERPAY_RECONCILE_INTERVAL_MS", default_value_t = 5_000)]
    pub reconcile_interval_ms: u64,

    /// Payments claimed per reconciler pass.
    #[arg(long, env = "ORDERPAY_RECONCILE_BATCH_SIZE", default_value_t = 50)]
    pub reconcile_batch_size: i64,

    /// Provider checks before a payment whose outcome stays unknown is failed.
    #[arg(long, env = "ORDERPAY_RECONCILE_MAX_ATTEMPTS", default_value_t = 12)]
    pub reconcile_max_attempts: i32,

    /// First wait before an unknown outcome is checked again; doubles per check.
    #[arg(long, env = "ORDERPAY_RECONCILE_BACKOFF_BASE_MS", default_value_t = 1_000)]
    pub reconcile_backoff_base_ms: u64,

    /// Longest wait between two checks of one payment.
    #[arg(long, env = "ORDERPAY_RECONCILE_BACKOFF_CAP_MS", default_value_t = 300_000)]
    pub reconcile_backoff_cap_ms: u64,

    /// Before giving up on an operation the provider never received, its last send must have
    /// been quiet this long beyond the provider timeout (a send still in flight could land).
    #[arg(long, env = "ORDERPAY_GIVE_UP_MARGIN_MS", default_value_t = 5_000)]
    pub give_up_margin_ms: u64,

    /// How long a payment given up on is watched for a charge that lands late (and is then
    /// refunded by the system).
    #[arg(long, env = "ORDERPAY_LATE_CHARGE_WATCH_SECS", default_value_t = 86_400)]
    pub late_charge_watch_secs: u64,

    /// How long a refund given up on is watched for the provider carrying it out late (then
    /// recorded as succeeded after all).
    #[arg(long, env = "ORDERPAY_LATE_REFUND_WATCH_SECS", default_value_t = 86_400)]
    pub late_refund_watch_secs: u64,
}

impl ReconcileArgs {
    pub fn config(&self, provider: &ProviderConfig) -> anyhow::Result<ReconcilerConfig> {
        anyhow::ensure!(self.reconcile_batch_size >= 1, "ORDERPAY_RECONCILE_BATCH_SIZE must be at least 1");
        anyhow::ensure!(
            self.reconcile_max_attempts >= 1,
            "ORDERPAY_RECONCILE_MAX_ATTEMPTS must be at least 1"
        );
        anyhow::ensure!(self.reconcile_interval_ms >= 1, "ORDERPAY_RECONCILE_INTERVAL_MS must be at least 1");
        Ok(ReconcilerConfig {
            interval: Duration::from_millis(self.reconcile_interval_ms),
            batch_size: self.reconcile_batch_size,
            max_attempts: self.reconcile_max_attempts,
            backoff_base: Duration::from_millis(self.reconcile_backoff_base_ms),
            backoff_cap: Duration::from_millis(
                self.reconcile_backoff_cap_ms.max(self.reconcile_backoff_base_ms),
            ),
            claim_for: claim_for(provider.timeout),
            quiet_before_give_up: provider.timeout + Duration::from_millis(self.give_up_margin_ms),
            late_charge_watch: Duration::from_secs(self.late_charge_watch_secs),
            late_refund_watch: Duration::from_secs(self.late_refund_watch_secs),
        })
    }
}

/// A reconciler's claim covers a lookup and a re-sent charge, each up to the provider timeout.
pub fn claim_for(provider_timeout: Duration) -> Duration {
    provider_timeout * 2 + Duration::from_secs(5)
}

#[derive(Clone, Args)]
pub struct MockProviderArgs {
    /// Address the mock payment provider listens on.
    #[arg(long, env = "MOCK_PROVIDER_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: String,

    /// How long `pm_provider_timeout` charges, `pm_refund_timeout` refunds (and timeout faults)
    /// hold their answer.
    #[arg(long, env = "MOCK_PROVIDER_TIMEOUT_HOLD_MS", default_value_t = 30_000)]
    pub timeout_hold_ms: u64,

    /// How long `pm_provider_pending` charges and `pm_refund_pending` refunds stay pending.
    #[arg(long, env = "MOCK_PROVIDER_SETTLE_MS", default_value_t = 3_000)]
    pub settle_ms: u64,

    /// When set, every `/v1/*` call must send `Authorization: Bearer <this key>` (else 401).
    #[arg(long, env = "MOCK_PROVIDER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// How long an uncaptured authorization lasts before it expires (default 7 days).
    #[arg(long, env = "MOCK_PROVIDER_AUTH_TTL_MS", default_value_t = 604_800_000)]
    pub auth_ttl_ms: u64,

    /// Where to POST webhook events (none are sent when unset).
    #[arg(long, env = "MOCK_PROVIDER_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// The `whsec_...` secret webhook events are signed with (required with a webhook URL).
    #[arg(long, env = "MOCK_PROVIDER_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// First wait before a failed webhook delivery is retried; doubles per attempt.
    #[arg(long, env = "MOCK_PROVIDER_WEBHOOK_RETRY_MS", default_value_t = 500)]
    pub webhook_retry_ms: u64,
}

impl MockProviderArgs {
    pub fn settings(&self) -> MockSettings {
        let set = |value: &Option<String>| value.clone().filter(|value| !value.is_empty());
        MockSettings {
            listen: self.listen.clone(),
            timeout_hold: Duration::from_millis(self.timeout_hold_ms),
            settle_after: Duration::from_millis(self.settle_ms),
            api_key: set(&self.api_key),
            auth_ttl: Duration::from_millis(self.auth_ttl_ms),
            webhook_url: set(&self.webhook_url),
            webhook_secret: set(&self.webhook_secret),
            webhook_retry_base: Duration::from_millis(self.webhook_retry_ms),
        }
    }
}

/// Written by hand so that the API key and the webhook secret never reach a log line.
impl std::fmt::Debug for MockProviderArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockProviderArgs").field("settings", &self.settings()).finish()
    }
}

#[derive(Clone, Args)]
pub struct WebhookArgs {
    /// The secret(s) the payment provider signs its webhooks with (`whsec_...`, Standard
    /// Webhooks); several, separated by spaces or commas, while a secret is rotated. Set, it
    /// enables `POST /provider/webhooks`; unset, that route does not exist (404).
    #[arg(long, env = "ORDERPAY_PROVIDER_WEBHOOK_SECRET", hide_env_values = true)]
    pub provider_webhook_secret: Option<String>,
}

impl WebhookArgs {
    /// The secrets, parsed; none when unset or empty.
    pub fn secrets(&self) -> anyhow::Result<Vec<Secret>> {
        let Some(text) = self.provider_webhook_secret.as_deref() else {
            return Ok(Vec::new());
        };
        text.split(|c: char| c == ',' || c.is_ascii_whitespace())
            .filter(|part| !part.is_empty())
            .enumerate()
            .map(|(index, part)| {
                Secret::parse(part).map_err(|error| {
                    anyhow::anyhow!("ORDERPAY_PROVIDER_WEBHOOK_SECRET, secret {}: {error}", index + 1)
                })
            })
            .collect()
    }
}

/// Written by hand so that the secret never reaches a log line.
impl std::fmt::Debug for WebhookArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = self.provider_webhook_secret.as_ref().map(|_| "<redacted>");
        f.debug_struct("WebhookArgs").field("provider_webhook_secret", &redacted).finish()
    }
}

#[derive(Clone, Args)]
pub struct MerchantWebhookArgs {
    /// The key merchant webhook secrets are encrypted with at rest: the base64 of 32 random
    /// bytes (`openssl rand -base64 32`); several, separated by commas, while the key is rotated:
    /// the first seals, every one opens. Set, merchant webhooks are on (`/webhook_endpoints`,
    /// the webhooks relay and the delivery worker); unset, those routes do not exist (404).
    #[arg(long, env = "ORDERPAY_ENCRYPTION_KEY", hide_env_values = true)]
    pub encryption_key: Option<String>,

    /// Allow webhook endpoints at private, loopback, link-local and other non-public addresses
    /// (development and tests only).
    #[arg(long, env = "ORDERPAY_WEBHOOK_ALLOW_PRIVATE", default_value_t = false, action = ArgAction::Set)]
    pub webhook_allow_private: bool,

    /// Refuse new webhook endpoints whose URL is `http://` (422 `webhook-url-not-allowed`):
    /// events and their signatures would cross the network in clear. Endpoints registered
    /// before keep receiving, flagged `insecure`. Independent of ORDERPAY_WEBHOOK_ALLOW_PRIVATE.
    #[arg(long, env = "ORDERPAY_WEBHOOK_REQUIRE_HTTPS", default_value_t = true, action = ArgAction::Set)]
    pub webhook_require_https: bool,

    /// A webhook delivery without a 2xx answer within this long has failed (milliseconds).
    #[arg(long, env = "ORDERPAY_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    pub webhook_timeout_ms: u64,

    /// How long a delivery worker holds a delivery it sends; another may send it again after
    /// that. Must exceed the timeout.
    #[arg(long, env = "ORDERPAY_WEBHOOK_LEASE_MS", default_value_t = 15_000)]
    pub webhook_lease_ms: u64,

    /// Wait before the second attempt of a failed delivery; doubles per attempt, with jitter.
    #[arg(long, env = "ORDERPAY_WEBHOOK_RETRY_BASE_MS", default_value_t = 5_000)]
    pub webhook_retry_base_ms: u64,

    /// Longest wait between two attempts of a delivery (default 6 hours).
    #[arg(long, env = "ORDERPAY_WEBHOOK_RETRY_CAP_MS", default_value_t = 21_600_000)]
    pub webhook_retry_cap_ms: u64,

    /// Attempts before a delivery is failed for good (20: about two days with the defaults).
    #[arg(long, env = "ORDERPAY_WEBHOOK_MAX_ATTEMPTS", default_value_t = 20)]
    pub webhook_max_attempts: i32,

    /// How often each instance's delivery worker looks for due deliveries (milliseconds); new
    /// events wake it sooner.
    #[arg(long, env = "ORDERPAY_WEBHOOK_POLL_MS", default_value_t = 200)]
    pub webhook_poll_ms: u64,

    /// Webhook deliveries sent at once per instance.
    #[arg(long, env = "ORDERPAY_WEBHOOK_CONCURRENCY", default_value_t = 16)]
    pub webhook_concurrency: usize,

    /// How long a webhook secret replaced by `rotate_secret` keeps signing next to the new one
    /// (milliseconds; default 24 hours).
    #[arg(long, env = "ORDERPAY_WEBHOOK_SECRET_OVERLAP_MS", default_value_t = 86_400_000)]
    pub webhook_secret_overlap_ms: u64,
}

impl MerchantWebhookArgs {
    /// Merchant webhooks' settings; `None` (off) without an encryption key.
    pub fn settings(&self) -> anyhow::Result<Option<WebhookSettings>> {
        let Some(key) = self.encryption_key.as_deref().filter(|key| !key.trim().is_empty()) else {
            return Ok(None);
        };
        let encryption_keys = Keyring::parse(key)?;
        anyhow::ensure!(self.webhook_timeout_ms >= 1, "ORDERPAY_WEBHOOK_TIMEOUT_MS must be at least 1");
        anyhow::ensure!(
            self.webhook_lease_ms > self.webhook_timeout_ms,
            "ORDERPAY_WEBHOOK_LEASE_MS must be longer than ORDERPAY_WEBHOOK_TIMEOUT_MS"
        );
        anyhow::ensure!(self.webhook_retry_base_ms >= 1, "ORDERPAY_WEBHOOK_RETRY_BASE_MS must be at least 1");
        anyhow::ensure!(
            (1..=100).contains(&self.webhook_max_attempts),
            "ORDERPAY_WEBHOOK_MAX_ATTEMPTS must be between 1 and 100"
        );
        anyhow::ensure!(self.webhook_poll_ms >= 1, "ORDERPAY_WEBHOOK_POLL_MS must be at least 1");
        anyhow::ensure!(
            (1..=1024).contains(&self.webhook_concurrency),
            "ORDERPAY_WEBHOOK_CONCURRENCY must be between 1 and 1024"
        );
        Ok(Some(WebhookSettings {
            encryption_keys,
            allow_private: self.webhook_allow_private,
            require_https: self.webhook_require_https,
            secret_overlap: Duration::from_millis(self.webhook_secret_overlap_ms),
            delivery: DeliveryConfig {
                poll: Duration::from_millis(self.webhook_poll_ms),
                timeout: Duration::from_millis(self.webhook_timeout_ms),
                lease: Duration::from_millis(self.webhook_lease_ms),
                retry_base: Duration::from_millis(self.webhook_retry_base_ms),
                retry_cap: Duration::from_millis(self.webhook_retry_cap_ms.max(self.webhook_retry_base_ms)),
                max_attempts: self.webhook_max_attempts,
                concurrency: self.webhook_concurrency,
            },
        }))
    }
}

/// Written by hand so that the encryption key never reaches a log line.
impl std::fmt::Debug for MerchantWebhookArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = self.encryption_key.as_ref().map(|_| "<redacted>");
        f.debug_struct("MerchantWebhookArgs")
            .field("encryption_key", &redacted)
            .field("webhook_allow_private", &self.webhook_allow_private)
            .field("webhook_require_https", &self.webhook_require_https)
            .field("webhook_timeout_ms", &self.webhook_timeout_ms)
            .field("webhook_lease_ms", &self.webhook_lease_ms)
            .field("webhook_retry_base_ms", &self.webhook_retry_base_ms)
            .field("webhook_retry_cap_ms", &self.webhook_retry_cap_ms)
            .field("webhook_max_attempts", &self.webhook_max_attempts)
            .field("webhook_poll_ms", &self.webhook_poll_ms)
            .field("webhook_concurrency", &self.webhook_concurrency)
            .field("webhook_secret_overlap_ms", &self.webhook_secret_overlap_ms)
            .finish()
    }
}

#[derive(Clone, Args)]
pub struct NatsArgs {
    /// NATS server URL (nats://host:4222, tls://...; several separated by commas). Set, every
    /// event is published to a JetStream stream; the service starts and serves while NATS is away
    /// (events wait in the outbox), connecting in the background.
    #[arg(long, env = "ORDERPAY_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,

    /// The JetStream stream the events go to (created when missing).
    #[arg(long, env = "ORDERPAY_NATS_STREAM", default_value = "ORDERPAY_EVENTS")]
    pub nats_stream: String,

    /// Events are published to `<prefix>.<type>`, e.g. orderpay.events.order.paid.
    #[arg(long, env = "ORDERPAY_NATS_SUBJECT_PREFIX", default_value = "orderpay.events")]
    pub nats_subject_prefix: String,

    /// How long a batch of events may take from its first publish to its last acknowledgement
    /// by JetStream (and a connection attempt); past it the batch is published again.
    #[arg(long, env = "ORDERPAY_NATS_TIMEOUT_MS", default_value_t = 5_000)]
    pub nats_timeout_ms: u64,
}

impl NatsArgs {
    /// The relay's settings; `None` when no URL is set.
    pub fn config(&self) -> anyhow::Result<Option<NatsConfig>> {
        let Some(urls) = self.nats_url.as_deref().filter(|urls| !urls.trim().is_empty()) else {
            return Ok(None);
        };
        let timeout = Duration::from_millis(self.nats_timeout_ms);
        NatsConfig::parse(urls, &self.nats_stream, &self.nats_subject_prefix, timeout).map(Some)
    }
}

/// Written by hand so that credentials in the URL never reach a log line.
impl std::fmt::Debug for NatsArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsArgs")
            .field("nats_url", &self.nats_url.as_ref().map(|_| "<redacted>"))
            .field("nats_stream", &self.nats_stream)
            .field("nats_subject_prefix", &self.nats_subject_prefix)
            .field("nats_timeout_ms", &self.nats_timeout_ms)
            .finish()
    }
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

    /// How long an idempotency key and its stored answer are kept (seconds).
    #[arg(long, env = "ORDERPAY_IDEMPOTENCY_TTL_SECS", default_value_t = 86_400)]
    pub idempotency_ttl_secs: u64,

    /// How often the sweeper deletes expired idempotency keys (milliseconds).
    #[arg(long, env = "ORDERPAY_SWEEP_INTERVAL_MS", default_value_t = 60_000)]
    pub sweep_interval_ms: u64,

    /// How long events are kept for the Events API (days); then they are deleted in batches.
    #[arg(long, env = "ORDERPAY_EVENT_RETENTION_DAYS", default_value_t = 30)]
    pub event_retention_days: u64,

    /// How often each relay of the outbox (merchant webhooks, NATS) looks for new events
    /// (milliseconds); a full batch is followed at once by the next.
    #[arg(long, env = "ORDERPAY_RELAY_INTERVAL_MS", default_value_t = 100)]
    pub relay_interval_ms: u64,

    /// Events a relay hands on per round (one transaction).
    #[arg(long, env = "ORDERPAY_RELAY_BATCH_SIZE", default_value_t = 500)]
    pub relay_batch_size: i64,

    /// Rows the sweeper deletes per statement.
    #[arg(long, env = "ORDERPAY_SWEEP_BATCH_SIZE", default_value_t = 1_000)]
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
    /// in a row failed.
    #[arg(long, env = "ORDERPAY_REVOCATION_POLL_MS", default_value_t = 250)]
    pub revocation_poll_ms: u64,

    /// Days the metadata of an expired idempotency key (no answer body) is kept in the audit
    /// table after it expired (`orderpay keys show`). 0 keeps none.
    #[arg(long, env = "ORDERPAY_IDEMPOTENCY_AUDIT_DAYS", default_value_t = 30)]
    pub idempotency_audit_days: u64,

    /// Bytes of final idempotent answers kept in memory, so that a replay needs no database
    /// round trip (0 turns the cache off; an order's answer is about 1 KB).
    #[arg(long, env = "ORDERPAY_REPLAY_CACHE_BYTES", default_value_t = 16 << 20)]
    pub replay_cache_bytes: u64,

    /// Sustained requests per second allowed per account (0: no limit). Beyond it: 429.
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
    #[arg(long, env = "ORDERPAY_MAX_CONNECTIONS", default_value_t = 4096)]
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
    /// The secrets provider webhooks are signed with (any one verifies a message); empty: no
    /// `POST /provider/webhooks`. `Secret`'s `Debug` hides the keys.
    pub provider_webhook_secrets: Vec<Secret>,
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
    pub client_timeout: Duration,
    /// How long a request body may take to arrive once the head is in.
    pub client_body_timeout: Duration,
    /// Open connections at most, over all workers.
    pub max_connections: usize,
}

impl ServeArgs {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        anyhow::ensure!(self.database.db_pool_size >= 1, "ORDERPAY_DB_POOL_SIZE must be at least 1");
        anyhow::ensure!(self.sweep_batch_size >= 1, "ORDERPAY_SWEEP_BATCH_SIZE must be at least 1");
        anyhow::ensure!(self.sweep_interval_ms >= 1, "ORDERPAY_SWEEP_INTERVAL_MS must be at least 1");
        let provider = self.provider.config();
        anyhow::ensure!(
            self.payment_lease_ms > self.provider.provider_timeout_ms,
            "ORDERPAY_PAYMENT_LEASE_MS must be longer than ORDERPAY_PROVIDER_TIMEOUT_MS"
        );
        let reconciler = self.reconcile.config(&provider)?;
        // A key must outlive every step of the operation it protects (a payment's lease and the
        // reconciler's retries), and ten years is past any sane retention.
        anyhow::ensure!(
            (60..=10 * 365 * 86_400).contains(&self.idempotency_ttl_secs),
            "ORDERPAY_IDEMPOTENCY_TTL_SECS must be between 60 seconds and 10 years"
        );
        anyhow::ensure!(
            self.idempotency_ttl_secs * 1000 > self.payment_lease_ms,
            "ORDERPAY_IDEMPOTENCY_TTL_SECS must be longer than ORDERPAY_PAYMENT_LEASE_MS"
        );
        anyhow::ensure!(self.relay_interval_ms >= 1, "ORDERPAY_RELAY_INTERVAL_MS must be at least 1");
        anyhow::ensure!(
            (1..=10_000).contains(&self.relay_batch_size),
            "ORDERPAY_RELAY_BATCH_SIZE must be between 1 and 10000"
        );
        anyhow::ensure!(self.max_connections >= 1, "ORDERPAY_MAX_CONNECTIONS must be at least 1");
        // Above a second a revoked key would outlive the promise made for it.
        anyhow::ensure!(
            (10..=1000).contains(&self.revocation_poll_ms),
            "ORDERPAY_REVOCATION_POLL_MS must be between 10 and 1000"
        );
        anyhow::ensure!(
            self.idempotency_audit_days <= 3650,
            "ORDERPAY_IDEMPOTENCY_AUDIT_DAYS must be at most 3650"
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
                provider_webhook_secrets: self.webhooks.secrets()?,
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
            client_timeout: Duration::from_millis(self.client_timeout_ms.max(1)),
            client_body_timeout: Duration::from_millis(self.client_body_timeout_ms.max(1)),
            max_connections: self.max_connections,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_secrets_rotate_as_a_list_split_by_spaces_or_commas() {
        let (old, new) = (Secret::generate().unwrap().reveal(), Secret::generate().unwrap().reveal());
        let args = |text: Option<String>| WebhookArgs { provider_webhook_secret: text };
        assert!(args(None).secrets().unwrap().is_empty());
        assert!(args(Some(" ".into())).secrets().unwrap().is_empty());
        for list in [format!("{old} {new}"), format!("{old},{new}"), format!(" {old} , {new}\n")] {
            let secrets = args(Some(list)).secrets().unwrap();
            let revealed: Vec<String> = secrets.iter().map(Secret::reveal).collect();
            assert_eq!(revealed, [old.clone(), new.clone()]);
        }
        let refused = args(Some(format!("{old} whsec_short"))).secrets().unwrap_err().to_string();
        assert!(refused.contains("secret 2"), "{refused}");
        assert!(!refused.contains(&old), "the error names no secret: {refused}");
        assert_eq!(
            format!("{:?}", args(Some(old.clone()))),
            r#"WebhookArgs { provider_webhook_secret: Some("<redacted>") }"#
        );
    }
}
