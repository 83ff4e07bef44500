//! Configuration: every setting is an environment variable with a default, also accepted as a
//! command-line flag, and listed by `orderpay serve --help`.
//!
//! Variables read here: `DATABASE_URL`, `ORDERPAY_DB_POOL_SIZE`, `ORDERPAY_DB_ACQUIRE_TIMEOUT_MS`,
//! `ORDERPAY_LISTEN`, `ORDERPAY_WORKERS`, `ORDERPAY_REQUIRE_IDEMPOTENCY_KEY`,
//! `ORDERPAY_IDEMPOTENCY_TTL_SECS`, `ORDERPAY_SWEEP_INTERVAL_MS`, `ORDERPAY_SWEEP_BATCH_SIZE`,
//! and, for logging (see telemetry.rs), `ORDERPAY_LOG_FORMAT` and `RUST_LOG`.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::db::DatabaseConfig;
use crate::idempotency::sweeper::SweeperConfig;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/orderpay";

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL. The database is created when missing and migrated at start.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,

    /// Database connections in all (split between the HTTP workers; the background tasks use 2
    /// more). Keep it small: more connections than cores slows PostgreSQL down.
    #[arg(long, env = "ORDERPAY_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,

    /// How long a request waits for a database connection before answering 503.
    #[arg(long, env = "ORDERPAY_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000)]
    pub db_acquire_timeout_ms: u64,
}

impl DatabaseArgs {
    pub fn config(&self) -> DatabaseConfig {
        DatabaseConfig {
            url: self.database_url.clone(),
            pool_size: self.db_pool_size,
            acquire_timeout: Duration::from_millis(self.db_acquire_timeout_ms),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Address the HTTP API listens on.
    #[arg(long, env = "ORDERPAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,

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

    /// Rows the sweeper deletes per statement.
    #[arg(long, env = "ORDERPAY_SWEEP_BATCH_SIZE", default_value_t = 1_000)]
    pub sweep_batch_size: i64,
}

/// What the API needs at request time.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub require_idempotency_key: bool,
    pub idempotency_retention: Duration,
}

/// Everything `serve` needs, built from [`ServeArgs`] by the CLI or directly by tests.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database: DatabaseConfig,
    pub listen: String,
    pub workers: usize,
    pub api: ApiSettings,
    pub sweeper: SweeperConfig,
}

impl ServeArgs {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        anyhow::ensure!(self.database.db_pool_size >= 1, "ORDERPAY_DB_POOL_SIZE must be at least 1");
        anyhow::ensure!(self.sweep_batch_size >= 1, "ORDERPAY_SWEEP_BATCH_SIZE must be at least 1");
        anyhow::ensure!(self.sweep_interval_ms >= 1, "ORDERPAY_SWEEP_INTERVAL_MS must be at least 1");
        let workers = self
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1);
        Ok(Settings {
            database: self.database.config(),
            listen: self.listen.clone(),
            workers,
            api: ApiSettings {
                require_idempotency_key: self.require_idempotency_key,
                idempotency_retention: Duration::from_secs(self.idempotency_ttl_secs),
            },
            sweeper: SweeperConfig {
                interval: Duration::from_millis(self.sweep_interval_ms),
                batch_size: self.sweep_batch_size,
            },
        })
    }
}
