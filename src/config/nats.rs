//! The NATS JetStream relay's settings.

use std::time::Duration;

use clap::Args;
use secrecy::{ExposeSecret, SecretString};

use crate::events::nats::NatsConfig;

/// `Debug` shows no secret: the URL, which may hold credentials, is a [`SecretString`].
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    /// NATS server URL (nats://host:4222, tls://...; several separated by commas). Set, every
    /// event is published to a JetStream stream; the service starts and serves while NATS is away
    /// (events wait in the outbox), connecting in the background.
    #[arg(long, env = "ORDERPAY_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<SecretString>,

    /// The JetStream stream the events go to (created when missing).
    #[arg(long, env = "ORDERPAY_NATS_STREAM", default_value = "ORDERPAY_EVENTS")]
    pub nats_stream: String,

    /// Events are published to `<prefix>.<type>`, e.g. orderpay.events.order.paid.
    #[arg(long, env = "ORDERPAY_NATS_SUBJECT_PREFIX", default_value = "orderpay.events")]
    pub nats_subject_prefix: String,

    /// How long a batch of events may take from its first publish to its last acknowledgement
    /// by JetStream (and a connection attempt); past it the batch is published again.
    #[arg(long, env = "ORDERPAY_NATS_TIMEOUT_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub nats_timeout_ms: u64,
}

impl NatsArgs {
    /// The relay's settings; `None` when no URL is set.
    pub fn config(&self) -> anyhow::Result<Option<NatsConfig>> {
        let Some(urls) = super::non_empty(&self.nats_url) else {
            return Ok(None);
        };
        let timeout = Duration::from_millis(self.nats_timeout_ms);
        NatsConfig::parse(urls.expose_secret(), &self.nats_stream, &self.nats_subject_prefix, timeout)
            .map(Some)
    }
}
