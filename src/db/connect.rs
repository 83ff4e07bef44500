//! Opening a PostgreSQL connection ourselves, for the pools, migrations, database creation and
//! the command line alike, and handing it to diesel-async (`AsyncPgConnection::try_from`).
//!
//! tokio-postgres's own `connect` is not enough for failover: its `connect_timeout` covers the
//! TCP connect only, so a frozen server (which accepts TCP but never answers) holds a connect
//! forever and the next host is never tried; and it knows no certificate verification. So each
//! host named in `DATABASE_URL` is tried in turn, each attempt bounded as a whole (TCP, TLS,
//! authentication, the read-write check) by the connect timeout:
//!
//! 1. TCP with keepalives a few seconds apart (a server that vanished is noticed),
//! 2. TLS as `sslmode` says (see tls.rs), negotiated here,
//! 3. tokio-postgres's startup and authentication over that stream ([`Watched`], so that every
//!    answer is bounded and session-ending errors close the connection),
//! 4. with `target_session_attrs=read-write`, `SHOW transaction_read_only`: a standby is
//!    skipped for the next host.
//!
//! The host that last worked is tried first (unless `load_balance_hosts=random`): after a
//! failover the new primary is found at once, instead of after a connect timeout spent on the
//! old one for every new connection.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use diesel_async::AsyncPgConnection;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::config::{Host, LoadBalanceHosts, SslNegotiation, TargetSessionAttrs};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::conninfo::{Conninfo, SslMode};
use super::tls;
use super::wire::Watched;

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

/// A parsed `DATABASE_URL` with its TLS configuration, and the host that last worked.
#[derive(Debug)]
pub struct Target {
    info: Conninfo,
    tls: Option<Arc<rustls::ClientConfig>>,
    preferred: AtomicUsize,
}

/// Targets by URL, for the process: pools of one URL share what they learn about its hosts, and
/// certificates are read once.
static TARGETS: LazyLock<Mutex<HashMap<String, Arc<Target>>>> = LazyLock::new(Mutex::default);

/// The target for `url`, parsed once per process.
pub fn target(url: &str) -> anyhow::Result<Arc<Target>> {
    let mut targets = TARGETS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(target) = targets.get(url) {
        return Ok(target.clone());
    }
    let target = Arc::new(Target::parse(url)?);
    targets.insert(url.to_owned(), target.clone());
    Ok(target)
}

impl Target {
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let info: Conninfo = url.parse()?;
        if info.pg.get_ssl_negotiation() == SslNegotiation::Direct && info.ssl_mode <= SslMode::Prefer {
            anyhow::bail!("sslnegotiation=direct needs sslmode=require or stronger");
        }
        let tls = tls::client_config(info.ssl_mode, info.root_cert.as_ref())?;
        Ok(Target { info, tls, preferred: AtomicUsize::new(0) })
    }

    pub fn info(&self) -> &Conninfo {
        &self.info
    }

    /// A connection to the first host that takes one, starting with the one that last did.
    pub async fn connect(&self, session: &Session) -> anyhow::Result<AsyncPgConnection> {
        let hosts = self.info.host_count().max(1);
        let first = if self.info.pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
            // load_balance_hosts=random: spread new connections over the hosts.
            crate::crypto::random_u64().map_or(0, |random| random as usize % hosts)
        } else {
            self.preferred.load(Ordering::Relaxed) % hosts
        };
        let mut failures = Vec::new();
        for index in (first..hosts).chain(0..first) {
            let attempt =
                tokio::time::timeout(session.connect_timeout, self.connect_to(index, session)).await;
            match attempt {
                Ok(Ok(connection)) => {
                    if index != first {
                        tracing::info!(server = %self.info.host_label(index), "connected to another database host");
                    }
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(connection);
                }
                Ok(Err(error)) => failures.push(format!("{}: {error:#}", self.info.host_label(index))),
                Err(_elapsed) => failures.push(format!(
                    "{}: no answer within {} ms",
                    self.info.host_label(index),
                    session.connect_timeout.as_millis()
                )),
            }
        }
        anyhow::bail!("cannot connect to {}: {}", self.info.redacted(), failures.join("; "))
    }

    async fn connect_to(&self, index: usize, session: &Session) -> anyhow::Result<AsyncPgConnection> {
        let (host, hostaddr, port) = self.info.host(index);
        let transport = match &host {
            Host::Tcp(name) => {
                let tcp = match hostaddr {
                    Some(ip) => TcpStream::connect((ip, port)).await,
                    None => TcpStream::connect((name.as_str(), port)).await,
                }
                .context("TCP connect failed")?;
                tcp.set_nodelay(true)?;
                self.keepalive(&tcp).context("cannot set TCP keepalives")?;
                self.start_tls(tcp, name).await?
            }
            Host::Unix(directory) => {
                let path = directory.join(format!(".s.PGSQL.{port}"));
                Transport::Unix(tokio::net::UnixStream::connect(path).await.context("cannot connect")?)
            }
        };
        let mut pg = self.info.pg.clone();
        // TLS, when there is any, is up already: tokio-postgres speaks plain protocol over it.
        pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
        if let Some(timeout) = session.statement_timeout {
            let mut options = pg.get_options().map(|options| format!("{options} ")).unwrap_or_default();
            options.push_str(&format!("-c statement_timeout={}", timeout.as_millis()));
            pg.options(options);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("orderpay");
        }
        let stream = Watched::new(transport, session.answer_bound);
        let (client, connection) = pg.connect_raw(stream, NoTls).await.context("cannot start a session")?;
        let server = self.info.host_label(index);
        tokio::spawn(async move {
            // Ends when the client is dropped (Ok) or the connection fails: the server went
            // away, or the watch condemned it (the reason is in the error).
            if let Err(error) = connection.await {
                tracing::warn!(%server, %error, "database connection ended");
            }
        });
        self.check_session_attrs(&client).await?;
        AsyncPgConnection::try_from(client).await.context("cannot set the session up")
    }

    fn keepalive(&self, tcp: &TcpStream) -> io::Result<()> {
        let pg = &self.info.pg;
        let socket = socket2::SockRef::from(tcp);
        if pg.get_keepalives() {
            let idle = match pg.get_keepalives_idle() {
                DEFAULT_KEEPALIVE_IDLE => KEEPALIVE_IDLE,
                idle => idle,
            };
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(idle)
                .with_interval(pg.get_keepalives_interval().unwrap_or(KEEPALIVE_INTERVAL))
                .with_retries(pg.get_keepalives_retries().unwrap_or(KEEPALIVE_RETRIES));
            socket.set_tcp_keepalive(&keepalive)?;
        }
        if let Some(timeout) = pg.get_tcp_user_timeout() {
            socket.set_tcp_user_timeout(Some(*timeout))?;
        }
        Ok(())
    }

    /// PostgreSQL's TLS negotiation (an SSLRequest, then the handshake), or a direct handshake
    /// with `sslnegotiation=direct`.
    async fn start_tls(&self, mut tcp: TcpStream, host: &str) -> anyhow::Result<Transport> {
        let Some(config) = &self.tls else { return Ok(Transport::Tcp(tcp)) };
        if self.info.pg.get_ssl_negotiation() == SslNegotiation::Postgres {
            // SSLRequest: length 8, request code 80877103.
            tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await.context("cannot request TLS")?;
            let mut answer = [0];
            tcp.read_exact(&mut answer).await.context("no answer to the TLS request")?;
            match answer[0] {
                b'S' => {}
                b'N' if self.info.ssl_mode == SslMode::Prefer => return Ok(Transport::Tcp(tcp)),
                b'N' => anyhow::bail!(
                    "the server does not accept TLS, and sslmode={} requires it",
                    self.info.ssl_mode.as_str()
                ),
                other => anyhow::bail!("unexpected answer {other:#04x} to the TLS request"),
            }
        }
        let tls = TlsConnector::from(config.clone())
            .connect(tls::server_name(host)?, tcp)
            .await
            .context("TLS handshake failed")?;
        Ok(Transport::Tls(Box::new(tls)))
    }

    /// `target_session_attrs`: whether this server is the kind asked for.
    async fn check_session_attrs(&self, client: &Client) -> anyhow::Result<()> {
        let wanted = self.info.pg.get_target_session_attrs();
        if wanted == TargetSessionAttrs::Any {
            return Ok(());
        }
        let answer = client.simple_query("SHOW transaction_read_only").await?;
        let read_only = answer.iter().any(|message| match message {
            SimpleQueryMessage::Row(row) => row.get(0) == Some("on"),
            _ => false,
        });
        match wanted {
            TargetSessionAttrs::ReadWrite if read_only => {
                anyhow::bail!("read-only (a standby), and target_session_attrs=read-write")
            }
            TargetSessionAttrs::ReadOnly if !read_only => {
                anyhow::bail!("writable, and target_session_attrs=read-only")
            }
            _ => Ok(()),
        }
    }
}

/// The socket under the protocol: plain TCP, TLS over TCP, or a Unix socket.
enum Transport {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(tokio::net::UnixStream),
}

impl AsyncRead for Transport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
            Transport::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
            Transport::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
            Transport::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
            Transport::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}
