//! Opening a PostgreSQL connection, for the pools, migrations, database creation and the command
//! line alike, and handing it to diesel-async (`AsyncPgConnection::try_from`).
//!
//! tokio-postgres connects: DNS, TCP with keepalives, authentication, and with
//! `target_session_attrs=read-write` the check that skips a standby. What it does not do is
//! bound an attempt as a whole (its `connect_timeout` covers TCP only, so a frozen server, which
//! accepts TCP and never answers, would hold a connect forever and the next host would never be
//! tried). So each host named in `DATABASE_URL` is given to tokio-postgres alone, one after the
//! other, each attempt within the connect timeout; the host that last worked is tried first
//! (unless `load_balance_hosts=random`): after a failover the new primary is found at once,
//! instead of after a connect timeout spent on the old one for every new connection. TLS and the
//! watch on every connection come from tls.rs and wire.rs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use diesel_async::AsyncPgConnection;
use tokio_postgres::config::{LoadBalanceHosts, SslMode, SslNegotiation};

use super::conninfo::{Conninfo, Server};
use super::tls::Negotiate;

/// Idle time before the first keepalive probe, unless `keepalives_idle` says otherwise.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_RETRIES: u32 = 3;
/// tokio-postgres's (and libpq's) default `keepalives_idle`: the kernel's two hours.
const DEFAULT_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// What a connection is for: its time limits.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    /// Per host: TCP, TLS, authentication and the read-write check together.
    pub connect_timeout: Duration,
    /// Set as the session's `statement_timeout` at connect (the server enforces it).
    pub statement_timeout: Option<Duration>,
    /// How long any one answer may be awaited before the connection is dropped (we enforce it,
    /// for servers that cannot: frozen, or unreachable without a reset).
    pub answer_bound: Option<Duration>,
}

impl Session {
    /// No limit once connected: migrations, database creation, one-off commands.
    pub fn unbounded(connect_timeout: Duration) -> Session {
        Session { connect_timeout, statement_timeout: None, answer_bound: None }
    }
}

/// A connection to the first host that takes one, starting with the one that last did.
pub async fn connect(info: &Conninfo, session: &Session) -> anyhow::Result<AsyncPgConnection> {
    let servers = info.servers();
    let hosts = servers.len().max(1);
    let first = if info.pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
        // load_balance_hosts=random: spread new connections over the hosts.
        crate::crypto::random_u64().map_or(0, |random| random as usize % hosts)
    } else {
        info.preferred.load(Ordering::Relaxed) % hosts
    };
    let mut failures = Vec::new();
    for index in (first..servers.len()).chain(0..first) {
        let server = &servers[index];
        match tokio::time::timeout(session.connect_timeout, connect_to(info, server, session)).await {
            Ok(Ok(connection)) => {
                if index != first {
                    tracing::info!(%server, "connected to another database host");
                }
                info.preferred.store(index, Ordering::Relaxed);
                return Ok(connection);
            }
            Ok(Err(error)) => failures.push(format!("{server}: {error:#}")),
            Err(_elapsed) => failures
                .push(format!("{server}: no answer within {} ms", session.connect_timeout.as_millis())),
        }
    }
    anyhow::bail!("cannot connect to {info}: {}", failures.join("; "))
}

async fn connect_to(
    info: &Conninfo,
    server: &Server,
    session: &Session,
) -> anyhow::Result<AsyncPgConnection> {
    let mut pg = info.with_servers(std::slice::from_ref(server));
    // Every socket is handed to our connector, which negotiates TLS as `sslmode` says (tls.rs).
    pg.ssl_mode(SslMode::Require).ssl_negotiation(SslNegotiation::Direct);
    if let Some(timeout) = session.statement_timeout {
        let options = pg.get_options().map(|options| format!("{options} ")).unwrap_or_default();
        pg.options(format!("{options}-c statement_timeout={}", timeout.as_millis()));
    }
    if pg.get_application_name().is_none() {
        pg.application_name("orderpay");
    }
    if pg.get_keepalives_idle() == DEFAULT_KEEPALIVE_IDLE {
        pg.keepalives_idle(KEEPALIVE_IDLE);
    }
    pg.keepalives_interval(pg.get_keepalives_interval().unwrap_or(KEEPALIVE_INTERVAL));
    pg.keepalives_retries(pg.get_keepalives_retries().unwrap_or(KEEPALIVE_RETRIES));
    let direct = info.pg.get_ssl_negotiation() == SslNegotiation::Direct;
    let negotiate = Negotiate::new(info.ssl_mode, info.root_cert.as_ref(), direct, session.answer_bound)?;
    let (client, connection) = pg.connect(negotiate).await.context("cannot start a session")?;
    let server = server.to_string();
    tokio::spawn(async move {
        // Ends when the client is dropped (Ok) or the connection fails: the server went away,
        // or the watch condemned it (the reason is in the error).
        if let Err(error) = connection.await {
            tracing::warn!(%server, %error, "database connection ended");
        }
    });
    AsyncPgConnection::try_from(client).await.context("cannot set the session up")
}
