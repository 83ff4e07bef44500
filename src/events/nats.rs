//! The NATS JetStream relay: hands every event of the outbox on to a JetStream stream, on the
//! subject `<prefix>.<type>`, with `Nats-Msg-Id` = the event id, so that the stream's duplicate
//! window drops a batch published again after a crash or a lost acknowledgement.
//!
//! This module owns the connection to NATS (made in the background, retried for ever: the service
//! starts and serves with NATS away, and events wait in the outbox), the stream (created when
//! missing, checked when present), and [`NatsRelay`], the [`Relay`] whose `hand_on` publishes a
//! batch. The round around it (`relay::round`) moves the relay's cursor only after every PubAck
//! arrived: at least once from here, once in the stream within [`DUPLICATE_WINDOW`].

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::{ContextBuilder, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use async_nats::{ConnectOptions, Event as ClientEvent, ServerAddr, jetstream};
use diesel_async::AsyncPgConnection;
use tokio::sync::watch;

use super::Event;
use super::relay::Relay;

/// How long the stream remembers a `Nats-Msg-Id` to drop a message published again.
///
/// A batch is published again (1) at the next round when a publish or its PubAck failed: the
/// relay interval plus at most `ORDERPAY_NATS_TIMEOUT_MS` (capped at a minute) later; (2) after
/// a crash between the PubAcks and the cursor's commit: when an instance takes the relay again,
/// another one at once, a restarted one within seconds or minutes; (3) after an outage of NATS
/// or PostgreSQL that cut the round after its publishes: when it is back. An hour covers the
/// first two many times over and outages up to an hour; past it an event may be stored twice,
/// and consumers deduplicate on the event id as with any at-least-once source. The price is
/// memory in the server: one remembered id per message of the last hour (about 100 bytes each,
/// some 36 MB at 100 events per second).
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);

/// The header naming the merchant account an event belongs to (the event's JSON does not).
pub const ACCOUNT_HEADER: &str = "Orderpay-Account-Id";

/// Where and how events are published (`ORDERPAY_NATS_*`).
#[derive(Clone)]
pub struct NatsConfig {
    /// The servers to connect to (several: the client fails over between them).
    pub servers: Vec<ServerAddr>,
    /// The JetStream stream that stores the events.
    pub stream: String,
    /// Events go to `<subject_prefix>.<type>`; the stream takes `<subject_prefix>.>`.
    pub subject_prefix: String,
    /// How long a batch may take from its first publish to its last PubAck (and any JetStream
    /// API request, such as creating the stream).
    pub timeout: Duration,
}

impl NatsConfig {
    /// Reads and checks the settings: `urls` is one URL or several separated by commas.
    pub fn parse(
        urls: &str,
        stream: &str,
        subject_prefix: &str,
        timeout: Duration,
    ) -> anyhow::Result<NatsConfig> {
        let servers = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| {
                ServerAddr::from_str(url)
                    .map_err(|error| anyhow::anyhow!("ORDERPAY_NATS_URL: {}: {error}", redacted(url)))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!servers.is_empty(), "ORDERPAY_NATS_URL names no server");
        // The characters JetStream refuses in a stream name (it becomes a subject token and a
        // directory name).
        anyhow::ensure!(
            !stream.is_empty()
                && !stream.contains(|c: char| c.is_whitespace() || ".*>/\\".contains(c) || c.is_control()),
            "ORDERPAY_NATS_STREAM must be a name without spaces, '.', '*', '>', '/' or '\\'"
        );
        anyhow::ensure!(
            subject_prefix.split('.').all(|token| !token.is_empty()
                && !token.contains(|c: char| c.is_whitespace() || c == '*' || c == '>')),
            "ORDERPAY_NATS_SUBJECT_PREFIX must be dot-separated tokens without spaces or wildcards"
        );
        anyhow::ensure!(
            (1..=60_000).contains(&timeout.as_millis()),
            "ORDERPAY_NATS_TIMEOUT_MS must be between 1 and 60000"
        );
        Ok(NatsConfig {
            servers,
            stream: stream.to_owned(),
            subject_prefix: subject_prefix.to_owned(),
            timeout,
        })
    }

    /// The servers as they may be logged: no user name or password.
    pub fn servers_redacted(&self) -> String {
        self.servers
            .iter()
            .map(|server| redacted(server.clone().into_inner().as_str()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The subjects the stream takes.
    pub fn stream_subjects(&self) -> String {
        format!("{}.>", self.subject_prefix)
    }

    /// The subject of one event.
    pub fn subject(&self, event: &Event) -> String {
        format!("{}.{}", self.subject_prefix, event.event_type.as_str())
    }
}

/// Written by hand so that credentials in the URL never reach a log line.
impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("servers", &self.servers_redacted())
            .field("stream", &self.stream)
            .field("subject_prefix", &self.subject_prefix)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `url` without its user name and password (or a placeholder when it does not parse).
fn redacted(url: &str) -> String {
    let parsed =
        if url.contains("://") { url::Url::parse(url) } else { url::Url::parse(&format!("nats://{url}")) };
    match parsed {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

/// Why a batch was not stored; the round fails and the batch is published again later.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("not connected to NATS; events wait in the outbox")]
    NotConnected,
    #[error("stream {stream} does not take the subjects {subjects} (its subjects: {found:?})")]
    StreamSubjects { stream: String, subjects: String, found: Vec<String> },
    #[error("event {event} was stored in stream {found}, not {expected}: another stream takes its subject")]
    WrongStream { event: String, expected: String, found: String },
    #[error("the batch's PubAcks did not all arrive within {0:?}")]
    Deadline(Duration),
}

/// The relay named `nats` in `relay_cursors`.
pub struct NatsRelay {
    config: NatsConfig,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// Bumped by the client's connection events, so that a round waiting for NATS wakes when it
    /// is back.
    connection_changed: watch::Sender<()>,
    /// The stream was found or created with our subjects; cleared when a publish finds no stream.
    stream_ready: AtomicBool,
}

impl NatsRelay {
    /// Starts connecting to NATS in the background and returns at once: a NATS away at start
    /// delays events, never the service. `batch_size` is the most events a round publishes.
    pub async fn start(config: NatsConfig, batch_size: i64) -> anyhow::Result<NatsRelay> {
        // The first failed attempt of a spell is a warning; the retries that follow (every few
        // seconds) are debug lines, until the connection comes back.
        let reported = Arc::new(AtomicBool::new(false));
        let servers = config.servers_redacted();
        let connection_changed = watch::Sender::new(());
        let notify = connection_changed.clone();
        let options = ConnectOptions::new()
            .name("orderpay")
            .retry_on_initial_connect()
            .connection_timeout(config.timeout)
            .event_callback(move |event| {
                let (reported, servers) = (reported.clone(), servers.clone());
                notify.send_replace(());
                async move { log_connection(&event, &reported, &servers) }
            });
        let client = options.connect(config.servers.clone()).await?;
        // Every PubAck of a batch is awaited before the next batch: room for a whole batch, and
        // for the acks of a failed one that the client still waits for in the background.
        let in_flight = usize::try_from(batch_size).unwrap_or(1).max(1) * 2;
        let jetstream = ContextBuilder::new()
            .timeout(config.timeout)
            .ack_timeout(config.timeout)
            .max_ack_inflight(in_flight)
            .build(client.clone());
        tracing::info!(
            servers = %config.servers_redacted(),
            stream = %config.stream,
            subjects = %config.stream_subjects(),
            "NATS relay on; connecting in the background"
        );
        Ok(NatsRelay { config, client, jetstream, connection_changed, stream_ready: AtomicBool::new(false) })
    }

    /// Returns once the client is connected (it reconnects by itself, for ever).
    async fn connected(&self) {
        let mut changed = self.connection_changed.subscribe();
        while self.client.connection_state() != State::Connected {
            // The sender lives in `self`: `changed` cannot fail while we wait.
            let _ = changed.changed().await;
        }
    }

    /// Finds the stream, or creates it, and checks that it takes our subjects.
    async fn ensure_stream(&self) -> anyhow::Result<()> {
        if self.stream_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let subjects = self.config.stream_subjects();
        let stream = self
            .jetstream
            .get_or_create_stream(StreamConfig {
                name: self.config.stream.clone(),
                subjects: vec![subjects.clone()],
                storage: StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                description: Some("orderpay events, published by its outbox relay".to_owned()),
                ..StreamConfig::default()
            })
            .await?;
        let info = stream.cached_info();
        if !info.config.subjects.iter().any(|pattern| covers(pattern, &subjects)) {
            return Err(NatsError::StreamSubjects {
                stream: self.config.stream.clone(),
                subjects,
                found: info.config.subjects.clone(),
            }
            .into());
        }
        if info.config.duplicate_window < DUPLICATE_WINDOW {
            tracing::warn!(
                stream = %self.config.stream,
                duplicate_window_secs = info.config.duplicate_window.as_secs(),
                wanted_secs = DUPLICATE_WINDOW.as_secs(),
                "the stream's duplicate window is shorter than the relay's: a batch published again \
                 after a longer interruption is stored twice"
            );
        }
        tracing::info!(stream = %self.config.stream, subjects = %subjects, "NATS stream ready");
        self.stream_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Publishes every event of `batch`, then awaits every PubAck. `Ok` only when all arrived
    /// from our stream; duplicates (an earlier copy within the window) count as stored.
    async fn publish(&self, batch: &[Event]) -> anyhow::Result<()> {
        let mut acks = Vec::with_capacity(batch.len());
        for event in batch {
            let message = PublishMessage::build()
                .payload(event.to_json().into())
                .message_id(event.id.to_string())
                .header(ACCOUNT_HEADER, event.account_id.to_string().as_str());
            acks.push((event, self.jetstream.send_publish(self.config.subject(event), message).await?));
        }
        let (mut stored, mut duplicates, mut failure) = (0_u64, 0_u64, None);
        for (event, ack) in acks {
            match ack.await {
                Ok(ack) if ack.stream != self.config.stream => {
                    failure.get_or_insert(anyhow::Error::from(NatsError::WrongStream {
                        event: event.id.to_string(),
                        expected: self.config.stream.clone(),
                        found: ack.stream,
                    }));
                }
                Ok(ack) if ack.duplicate => duplicates += 1,
                Ok(_) => stored += 1,
                Err(error) => {
                    if error.kind() == PublishErrorKind::StreamNotFound {
                        self.stream_ready.store(false, Ordering::Release);
                    }
                    failure.get_or_insert(error.into());
                }
            }
        }
        crate::telemetry::metrics::nats_published(stored, duplicates);
        if duplicates > 0 {
            tracing::info!(duplicates, "NATS dropped events published again (already in the stream)");
        }
        failure.map_or(Ok(()), Err)
    }
}

impl Relay for NatsRelay {
    const NAME: &'static str = "nats";

    /// Never writes on `conn`: the round must hold no transaction id while it waits on NATS (see
    /// `repository::lock_cursor`), and nothing of ours needs to commit with the cursor.
    async fn hand_on(&self, _conn: &mut AsyncPgConnection, batch: &[Event]) -> anyhow::Result<()> {
        // One deadline for the whole round: the connection, the stream, every publish (which
        // waits for room while acks of a failed batch are still out) and every PubAck (whose own
        // timeout starts only when it is awaited).
        let timeout = self.config.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let handed_on = tokio::time::timeout_at(deadline, async {
            self.connected().await;
            self.ensure_stream().await?;
            self.publish(batch).await
        })
        .await
        .unwrap_or_else(|_| match self.client.connection_state() {
            State::Connected => Err(NatsError::Deadline(timeout).into()),
            _ => Err(NatsError::NotConnected.into()),
        });
        if handed_on.is_err() {
            // A failed round ends at its deadline, never sooner: while NATS is away or the stream
            // refuses our subjects, the relay reads a batch and logs a warning once per timeout,
            // not once per relay interval. A batch still leaves as soon as NATS is back.
            tokio::time::sleep_until(deadline).await;
        }
        handed_on
    }
}

fn log_connection(event: &ClientEvent, reported: &AtomicBool, servers: &str) {
    match event {
        ClientEvent::Connected => {
            reported.store(false, Ordering::Relaxed);
            tracing::info!(servers, "connected to NATS; relaying events");
        }
        ClientEvent::Disconnected => {
            tracing::warn!(servers, "disconnected from NATS; events wait in the outbox, reconnecting");
        }
        ClientEvent::ClientError(error) if !reported.swap(true, Ordering::Relaxed) => {
            tracing::warn!(
                servers,
                error = %error,
                "NATS unreachable; events wait in the outbox, retrying in the background"
            );
        }
        // An authorization refused, a limit reached: the operator's to fix.
        ClientEvent::ServerError(error) => tracing::warn!(servers, error = %error, "NATS server error"),
        other => tracing::debug!(servers, event = %other, "NATS connection event"),
    }
}

/// Whether the stream subject `pattern` takes every subject of `wanted` (`<prefix>.>`): its
/// literal tokens equal the prefix's, `*` stands for any one of them, and it ends in `>` no later
/// than our `>`.
fn covers(pattern: &str, wanted: &str) -> bool {
    let mut pattern = pattern.split('.');
    for token in wanted.split('.') {
        match (pattern.next(), token) {
            (Some(">"), _) => return true,
            (Some("*"), ">") | (None, _) => return false,
            (Some("*"), _) => {}
            (Some(literal), token) if literal == token && token != ">" => {}
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(urls: &str, stream: &str, prefix: &str, timeout_ms: u64) -> anyhow::Result<NatsConfig> {
        NatsConfig::parse(urls, stream, prefix, Duration::from_millis(timeout_ms))
    }

    #[test]
    fn a_stream_subject_covers_the_prefix_when_its_wildcards_reach_every_event_type() {
        let wanted = "orderpay.events.>";
        for pattern in ["orderpay.events.>", "orderpay.>", ">", "orderpay.*.>", "*.events.>"] {
            assert!(covers(pattern, wanted), "{pattern}");
        }
        for pattern in
            ["orderpay.events.*", "orderpay.events", "orderpay.events.order.>", "other.>", "orderpay.*"]
        {
            assert!(!covers(pattern, wanted), "{pattern}");
        }
    }

    #[test]
    fn settings_are_checked_and_credentials_never_shown() {
        let parsed = config(
            "nats://relay:s3cret@127.0.0.1:4222, 10.0.0.2",
            "ORDERPAY_EVENTS",
            "orderpay.events",
            5000,
        )
        .unwrap();
        assert_eq!(parsed.servers.len(), 2);
        let shown = format!("{parsed:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("relay:"), "{shown}");
        assert!(shown.contains("127.0.0.1:4222") && shown.contains("10.0.0.2"), "{shown}");
        assert_eq!(parsed.stream_subjects(), "orderpay.events.>");

        assert!(config("http://127.0.0.1:4222", "S", "p", 5000).is_err(), "not a NATS scheme");
        assert!(config(" , ", "S", "p", 5000).is_err(), "no server");
        for stream in ["", "ORDERPAY.EVENTS", "A B", "A*", "A/B"] {
            assert!(config("127.0.0.1", stream, "p", 5000).is_err(), "stream {stream:?}");
        }
        for prefix in ["", "a..b", "a.*", "a.>", "a b", ".a"] {
            assert!(config("127.0.0.1", "S", prefix, 5000).is_err(), "prefix {prefix:?}");
        }
        assert!(config("127.0.0.1", "S", "p", 0).is_err());
        assert!(config("127.0.0.1", "S", "p", 60_001).is_err());
    }
}
