//! `orderpay mock-provider`'s settings.

use std::time::Duration;

use clap::Args;
use secrecy::{ExposeSecret, SecretString};

use crate::provider::mock::{MockSettings, Wire};

/// `Debug` shows no secret: the API key and the webhook secret are [`SecretString`]s.
#[derive(Debug, Clone, Args)]
pub struct MockProviderArgs {
    /// Address the mock payment provider listens on.
    #[arg(long, env = "MOCK_PROVIDER_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: String,

    /// The API to serve: `mock` (the mock's own contract) or `stripe` (the subset of Stripe's
    /// API the Stripe adapter calls: form bodies, PaymentIntents, Stripe-Signature webhooks).
    #[arg(long, env = "MOCK_PROVIDER_WIRE", value_enum, default_value_t = Wire::Mock)]
    pub wire: Wire,

    /// On the Stripe wire, how long a PaymentIntent stays out of search results after it is
    /// created (Stripe's search index lags; its listings do not).
    #[arg(long, env = "MOCK_PROVIDER_SEARCH_LAG_MS", default_value_t = 60_000)]
    pub search_lag_ms: u64,

    /// How long `pm_provider_timeout` charges, `pm_refund_timeout` refunds (and timeout faults)
    /// hold their answer.
    #[arg(long, env = "MOCK_PROVIDER_TIMEOUT_HOLD_MS", default_value_t = 30_000)]
    pub timeout_hold_ms: u64,

    /// How long `pm_provider_pending` charges and `pm_refund_pending` refunds stay pending.
    #[arg(long, env = "MOCK_PROVIDER_SETTLE_MS", default_value_t = 3_000)]
    pub settle_ms: u64,

    /// When set, every `/v1/*` call must send `Authorization: Bearer <this key>` (else 401).
    #[arg(long, env = "MOCK_PROVIDER_API_KEY", hide_env_values = true)]
    pub api_key: Option<SecretString>,

    /// How long an uncaptured authorization lasts before it expires (default 7 days).
    #[arg(long, env = "MOCK_PROVIDER_AUTH_TTL_MS", default_value_t = 604_800_000)]
    pub auth_ttl_ms: u64,

    /// Where to POST webhook events (none are sent when unset).
    #[arg(long, env = "MOCK_PROVIDER_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// The `whsec_...` secret webhook events are signed with (required with a webhook URL).
    #[arg(long, env = "MOCK_PROVIDER_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<SecretString>,

    /// First wait before a failed webhook delivery is retried; doubles per attempt.
    #[arg(long, env = "MOCK_PROVIDER_WEBHOOK_RETRY_MS", default_value_t = 500)]
    pub webhook_retry_ms: u64,
}

impl MockProviderArgs {
    pub fn settings(&self) -> MockSettings {
        let secret = |value: &Option<SecretString>| {
            super::non_empty(value).map(|secret| secret.expose_secret().to_owned())
        };
        MockSettings {
            listen: self.listen.clone(),
            wire: self.wire,
            search_lag: Duration::from_millis(self.search_lag_ms),
            timeout_hold: Duration::from_millis(self.timeout_hold_ms),
            settle_after: Duration::from_millis(self.settle_ms),
            api_key: secret(&self.api_key),
            auth_ttl: Duration::from_millis(self.auth_ttl_ms),
            webhook_url: self.webhook_url.clone().filter(|url| !url.is_empty()),
            webhook_secret: secret(&self.webhook_secret),
            webhook_retry_base: Duration::from_millis(self.webhook_retry_ms),
            webhooks_by_hand: false,
        }
    }
}
