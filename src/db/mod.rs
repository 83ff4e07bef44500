//! PostgreSQL: the only place that builds connection pools, creates the database when missing,
//! and applies the embedded migrations.

pub mod schema;
pub mod statement;
pub mod text_enum;

use std::time::Duration;

use anyhow::Context;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

pub type Pool = diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection>;
pub type PoolRunError = diesel_async::pooled_connection::bb8::RunError;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Any constant both racing instances agree on: serialises migrations across instances.
const MIGRATION_LOCK_ID: i64 = 0x6f72_6465_7270_6179; // "orderpay"

#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub url: String,
    /// Connections in all, across every pool the process builds.
    pub pool_size: u32,
    /// How long a request waits for a connection before answering 503.
    pub acquire_timeout: Duration,
}

/// Builds a pool whose connections are opened lazily, on first use, by the runtime that uses
/// them: a tokio-postgres connection's I/O task lives on the runtime that opened it, so a pool
/// per actix worker keeps every round trip on that worker's thread (STACK_NOTES.md, pitfall 4).
///
/// Checkouts are not tested with `SELECT 1` (pitfall 3): a broken connection fails its query,
/// which maps to 503, and the pool drops it; connections left inside a transaction are still
/// discarded on return.
pub fn lazy_pool(config: &DatabaseConfig, max_size: u32) -> Pool {
    let mut manager_config = ManagerConfig::default();
    manager_config.recycling_method = RecyclingMethod::Fast;
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(&config.url, manager_config);
    bb8::Pool::builder()
        .max_size(max_size.max(1))
        .min_idle(None)
        .test_on_check_out(false)
        .connection_timeout(config.acquire_timeout)
        .build_unchecked(manager)
}

/// Creates the database named in `url` if it does not exist, by connecting to the server's
/// `postgres` maintenance database. Safe to race: a concurrent creator wins and we carry on.
pub async fn ensure_database_exists(url: &str) -> anyhow::Result<()> {
    if AsyncPgConnection::establish(url).await.is_ok() {
        return Ok(());
    }
    let mut parsed = url::Url::parse(url).context("DATABASE_URL is not a postgres:// URL")?;
    let name = parsed.path().trim_start_matches('/').to_owned();
    anyhow::ensure!(!name.is_empty(), "DATABASE_URL names no database");
    parsed.set_path("/postgres");
    let mut admin = AsyncPgConnection::establish(parsed.as_str())
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))?;
    let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
    if let Err(error) = diesel::sql_query(create).execute(&mut admin).await {
        // Someone else may have created it meanwhile; only fail if it is still missing.
        AsyncPgConnection::establish(url)
            .await
            .map(drop)
            .map_err(|_| error)
            .with_context(|| format!("cannot create database {name}"))?;
    } else {
        tracing::info!(database = %name, "created database");
    }
    Ok(())
}

/// Applies pending migrations; returns the versions applied. Runs the synchronous migration
/// harness on a blocking thread through diesel-async's connection wrapper (pitfall 8), under an
/// advisory lock so that instances starting together do not race.
pub async fn run_migrations(url: &str) -> anyhow::Result<Vec<String>> {
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;

    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let mut conn = <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url)
            .with_context(|| format!("cannot connect to {}", redact(&url)))?;
        let lock = diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK_ID})"));
        diesel::RunQueryDsl::execute(lock, &mut conn)?;
        let applied = conn
            .run_pending_migrations(MIGRATIONS)
            .map_err(|e| anyhow::anyhow!("migration failed: {e}"))?
            .into_iter()
            .map(|version| version.to_string())
            .collect();
        let unlock = diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_ID})"));
        diesel::RunQueryDsl::execute(unlock, &mut conn)?;
        Ok(applied)
    })
    .await
    .context("migration task panicked")?
}

/// Creates the database if needed and migrates it: what `serve` and `migrate` do first.
pub async fn prepare(url: &str) -> anyhow::Result<()> {
    ensure_database_exists(url).await?;
    let applied = run_migrations(url).await?;
    if !applied.is_empty() {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(())
}

/// The URL without its password, for logs and error messages.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        Err(_) => "<unparseable DATABASE_URL>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
