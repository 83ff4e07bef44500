//! The database's settings: where it is, how many connections, how long to wait for one.

use std::time::Duration;

use clap::Args;

use crate::db::DatabaseConfig;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/orderpay";

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL or key=value string, as libpq reads it: several hosts to fail over between
    /// (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write), sslmode
    /// (disable|prefer|require|verify-ca|verify-full) and sslrootcert. `serve` and `migrate`
    /// create the database when missing and migrate it; every other command refuses a database
    /// whose schema is not this binary's.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,

    /// Database connections for requests, in all (split between the HTTP workers). The
    /// background tasks use 6 more, the revocation poll 1, the settlement job 1 (when on),
    /// merchant webhook deliveries 2 when they are on, and a separate /metrics address 1. Keep it small: more connections than
    /// cores slows PostgreSQL down.
    #[arg(long, env = "ORDERPAY_DB_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
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

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::DatabaseArgs;
    use crate::app::{BACKGROUND_POOL_SIZE, DELIVERY_POOL_SIZE};

    #[test]
    fn the_pool_size_help_counts_the_connections_the_background_really_opens() {
        let command = DatabaseArgs::augment_args(Command::new("serve"));
        let argument = command.get_arguments().find(|argument| argument.get_id() == "db_pool_size");
        let help =
            argument.and_then(|argument| argument.get_help()).map(ToString::to_string).unwrap_or_default();
        assert!(help.contains(&format!("background tasks use {BACKGROUND_POOL_SIZE} more")), "{help}");
        assert!(help.contains(&format!("deliveries {DELIVERY_POOL_SIZE} when")), "{help}");
    }
}
