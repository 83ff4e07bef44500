//! PostgreSQL: the only place that builds connection pools, creates the database when missing,
//! and applies the embedded migrations; and, when `serve` starts, the advice on the server's
//! write settings ([`write_settings`]).

pub mod connect;
pub mod conninfo;
pub mod schema;
pub mod statement;
pub mod text_enum;
pub mod tls;
pub mod wire;
pub mod write_settings;

use std::time::Duration;

use anyhow::Context;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolError, PoolableConnection, RecyclingMethod,
};
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, TransactionManager};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

pub use self::connect::Session;
pub use self::conninfo::{Conninfo, Server};

pub type Pool = diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection>;
pub type PoolRunError = diesel_async::pooled_connection::bb8::RunError;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Any constant both racing instances agree on: serialises migrations across instances.
const MIGRATION_LOCK_ID: i64 = 0x6f72_6465_7270_6179; // "orderpay"

/// Past the statement timeout, how long a request pool still waits for an answer before it
/// drops the connection: the server's own cancel (57014) needs a round trip to arrive.
pub const ANSWER_GRACE: Duration = Duration::from_millis(500);

/// The least a background pool (sweeper, reconciler) waits for any one answer: they run no
/// statement timeout, and a batch may legitimately take a while.
pub const BACKGROUND_ANSWER_BOUND: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `DATABASE_URL`, parsed: a URL or key=value pairs, with several hosts to fail over between.
    pub url: Conninfo,
    /// Connections in all, across every pool the process builds.
    pub pool_size: u32,
    /// How long a request waits for a connection before answering 503.
    pub acquire_timeout: Duration,
    /// How long one host may take to accept a session (TCP, TLS, authentication, the
    /// read-write check) before the next host is tried. A URL's own `connect_timeout` wins.
    pub connect_timeout: Duration,
    /// Request pools: the server-side `statement_timeout`, and (plus [`ANSWER_GRACE`]) how long
    /// any answer is awaited before the connection is dropped. Zero turns both off.
    pub statement_timeout: Duration,
}

impl DatabaseConfig {
    fn effective_connect_timeout(&self) -> Duration {
        self.url.pg.get_connect_timeout().copied().unwrap_or(self.connect_timeout)
    }

    /// Connections that serve requests: every statement bounded.
    pub fn request_session(&self) -> Session {
        let bounded = !self.statement_timeout.is_zero();
        Session {
            connect_timeout: self.effective_connect_timeout(),
            statement_timeout: bounded.then_some(self.statement_timeout),
            answer_bound: bounded.then(|| self.statement_timeout + ANSWER_GRACE),
        }
    }

    /// Connections of the background loops: no statement timeout, a generous answer bound, so
    /// that a frozen server stalls a loop for a while and not forever.
    pub fn background_session(&self) -> Session {
        Session {
            connect_timeout: self.effective_connect_timeout(),
            statement_timeout: None,
            answer_bound: Some(BACKGROUND_ANSWER_BOUND.max(self.statement_timeout * 6)),
        }
    }
}

/// Builds a request pool whose connections are opened lazily, on first use, by the runtime that
/// uses them: a tokio-postgres connection's I/O task lives on the runtime that opened it, so a
/// pool per actix worker keeps every round trip on that worker's thread (a pool filled in `main`
/// put every connection's I/O on the main thread: each round trip hopped threads, and lazy
/// per-worker pools measured 20% more throughput). Every statement is bounded by the statement
/// timeout (see [`Session`]).
///
/// Checkouts are not tested with `SELECT 1` (that round trip cost about 5% of throughput). They
/// are checked without a round trip:
/// a connection whose server closed it, or that was dropped for not answering, is closed and is
/// not handed out; the pool opens a new one (to whichever host is the primary now). A
/// connection that breaks in use fails its query, which maps to 503, and is discarded on return,
/// as are connections left inside a transaction.
pub fn lazy_pool(config: &DatabaseConfig, max_size: u32) -> Pool {
    pool(config, max_size, config.request_session())
}

/// A pool for the background loops (sweeper, reconciler): the connect timeout and a generous
/// answer bound, no statement timeout.
pub fn background_pool(config: &DatabaseConfig, max_size: u32) -> Pool {
    pool(config, max_size, config.background_session())
}

fn pool(config: &DatabaseConfig, max_size: u32, session: Session) -> Pool {
    let url = config.url.clone();
    let mut manager_config = ManagerConfig::<AsyncPgConnection>::default();
    manager_config.custom_setup = Box::new(move |_| {
        let url = url.clone();
        Box::pin(async move {
            let connected = connect::connect(&url, &session).await;
            connected.map_err(|error| diesel::ConnectionError::BadConnection(format!("{error:#}")))
        })
    });
    manager_config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
        let closed = conn.is_broken();
        Box::pin(async move {
            if closed {
                Err(diesel::result::Error::DatabaseError(
                    diesel::result::DatabaseErrorKind::ClosedConnection,
                    Box::new("the connection is closed".to_owned()),
                ))
            } else {
                Ok(())
            }
        })
    }));
    // The URL is only handed to `custom_setup`, which has its own.
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(
        config.url.to_string(),
        manager_config,
    );
    bb8::Pool::builder()
        .max_size(max_size.max(1))
        .min_idle(None)
        .test_on_check_out(true)
        .connection_timeout(config.acquire_timeout)
        .error_sink(Box::new(LogConnectErrors))
        .build_unchecked(manager)
}

/// Connection failures (every host refused, or none writable) are logged; requests meanwhile
/// get 503 when their acquire timeout runs out.
#[derive(Debug, Clone, Copy)]
struct LogConnectErrors;

impl bb8::ErrorSink<PoolError> for LogConnectErrors {
    fn sink(&self, error: PoolError) {
        tracing::warn!(%error, "database pool could not open or reuse a connection");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<PoolError>> {
        Box::new(*self)
    }
}

/// Marks a pooled connection broken, so that the pool drops it on return instead of handing it
/// out again (bb8 has no "discard" of its own; a broken transaction state is what it checks).
pub fn discard(conn: &mut AsyncPgConnection) {
    <AnsiTransactionManager as TransactionManager<AsyncPgConnection>>::transaction_manager_status_mut(conn)
        .set_in_error();
}

/// Whether the server behind `conn` takes writes: not a standby, not read-only by setting.
pub async fn is_writable(conn: &mut AsyncPgConnection) -> diesel::QueryResult<bool> {
    diesel_async::RunQueryDsl::get_result(IsWritable, conn).await
}

crate::prepared_statement! {
    /// Whether the server takes writes (`is_writable.sql`).
    pub(crate) struct IsWritable("is_writable.sql") -> Bool;
}

/// One connection outside the pools (commands, tests): the connect path of the pools, with no
/// limit once connected.
pub async fn establish(url: &Conninfo, connect_timeout: Duration) -> anyhow::Result<AsyncPgConnection> {
    connect::connect(url, &Session::unbounded(connect_timeout)).await
}

/// Creates the database named in the URL if it does not exist, by connecting to the
/// `postgres` maintenance database on the same hosts (the same failover URL picks the same
/// primary). Safe to race: a concurrent creator wins and we carry on.
pub async fn ensure_database_exists(config: &DatabaseConfig) -> anyhow::Result<()> {
    let url = &config.url;
    let timeout = config.effective_connect_timeout();
    let unreachable = match establish(url, timeout).await {
        Ok(_) => return Ok(()),
        Err(error) => error,
    };
    let Some(name) = url.pg.get_dbname().filter(|name| !name.is_empty()) else {
        anyhow::bail!("DATABASE_URL names no database: {url}")
    };
    let mut admin_url = url.clone();
    admin_url.pg.dbname("postgres");
    // If the server cannot be reached at all, the first error is the one that says why.
    let mut admin = establish(&admin_url, timeout).await.map_err(|_| unreachable)?;
    let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
    if let Err(error) = diesel::sql_query(create).execute(&mut admin).await {
        // Someone else may have created it meanwhile; only fail if it is still missing.
        establish(url, timeout)
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
/// harness on a blocking thread through diesel-async's connection wrapper (diesel-async's own
/// async harness panics inside actix's current-thread runtime), under an
/// advisory lock so that instances starting together do not race. No statement timeout: a
/// migration may take as long as it takes.
pub async fn run_migrations(config: &DatabaseConfig) -> anyhow::Result<Vec<String>> {
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;

    let conn = establish(&config.url, config.effective_connect_timeout()).await?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(conn);
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

/// A page out of `limit + 1` rows read newest first: the first `limit`, and whether more follow.
/// Every list reads one row more than it shows, so that `has_more` costs no second query.
pub fn page_of<T>(mut rows: Vec<T>, limit: i64) -> (Vec<T>, bool) {
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    (rows, has_more)
}

/// Creates the database if needed and migrates it: what `serve` and `migrate` do first.
pub async fn prepare(config: &DatabaseConfig) -> anyhow::Result<()> {
    ensure_database_exists(config).await?;
    let applied = run_migrations(config).await?;
    if !applied.is_empty() {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(())
}

/// Logs which of the server's write settings hold orderpay's writes back ([`write_settings`]):
/// what `serve` does once the database is prepared. Never fails.
pub async fn advise_on_write_settings(config: &DatabaseConfig) {
    match establish(&config.url, config.effective_connect_timeout()).await {
        Ok(mut conn) => write_settings::advise_on(&mut conn).await,
        Err(error) => {
            tracing::debug!(error = %format!("{error:#}"), "cannot check the server's write settings")
        }
    }
}

/// The CHECK constraints that bound a payment's money (what is captured within what was
/// authorized, what is refunded and refunding within what was captured). Every statement that
/// moves those amounts guards them itself; a violation means a guard let through what it should
/// have refused.
pub const MONEY_GUARDS: [&str; 2] = ["payments_refunds_within_captured", "payments_captured_within_amount"];

/// The money constraint `error` violated, if it is one of [`MONEY_GUARDS`].
pub fn money_guard_violated(error: &diesel::result::Error) -> Option<&'static str> {
    let diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::CheckViolation, info) = error
    else {
        return None;
    };
    let violated = info.constraint_name()?;
    MONEY_GUARDS.into_iter().find(|guard| *guard == violated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(statement_timeout_ms: u64) -> DatabaseConfig {
        DatabaseConfig {
            url: "postgres://u@h1:1,h2:2/db".parse().unwrap(),
            pool_size: 4,
            acquire_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_millis(750),
            statement_timeout: Duration::from_millis(statement_timeout_ms),
        }
    }

    #[test]
    fn request_pools_are_bounded_by_the_statement_timeout_and_background_ones_generously() {
        let requests = config(2000).request_session();
        assert_eq!(requests.statement_timeout, Some(Duration::from_secs(2)));
        assert_eq!(requests.answer_bound, Some(Duration::from_secs(2) + ANSWER_GRACE));
        assert_eq!(requests.connect_timeout, Duration::from_millis(750));
        let background = config(2000).background_session();
        assert_eq!(background.statement_timeout, None, "sweeper batches run no statement timeout");
        assert_eq!(background.answer_bound, Some(BACKGROUND_ANSWER_BOUND));
        let off = config(0).request_session();
        assert_eq!((off.statement_timeout, off.answer_bound), (None, None));
    }

    #[test]
    fn a_connect_timeout_in_the_url_wins() {
        let mut with_own = config(1000);
        with_own.url = "postgres://u@h/db?connect_timeout=3".parse().unwrap();
        assert_eq!(with_own.request_session().connect_timeout, Duration::from_secs(3));
    }
}
