//! The payment provider's settings and the reconciler's, which are read together: a claim and
//! the give-up margin are counted in provider timeouts.

use std::time::Duration;

use clap::Args;
use secrecy::SecretString;

use crate::operations::reconciler::ReconcilerConfig;

#[derive(Debug, Clone, Args)]
pub struct ProviderArgs {
    /// Base URL of the payment provider (the mock provider by default).
    #[arg(long, env = "ORDERPAY_PROVIDER_URL", default_value = "http://127.0.0.1:8081")]
    pub provider_url: String,

    /// How long a provider call may take before its outcome counts as unknown (202).
    #[arg(long, env = "ORDERPAY_PROVIDER_TIMEOUT_MS", default_value_t = 5_000)]
    pub provider_timeout_ms: u64,

    /// The provider credential, sent as `Authorization: Bearer` on every call (default: none).
    #[arg(long, env = "ORDERPAY_PROVIDER_API_KEY", hide_env_values = true)]
    pub provider_api_key: Option<SecretString>,
}

impl ProviderArgs {
    pub fn config(&self) -> ProviderConfig {
        ProviderConfig {
            url: self.provider_url.clone(),
            timeout: Duration::from_millis(self.provider_timeout_ms),
            api_key: super::non_empty(&self.provider_api_key),
        }
    }
}

/// `Debug` shows no secret: the API key is a [`SecretString`].
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub url: String,
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer` when set.
    pub api_key: Option<SecretString>,
}

#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// How often the reconciler looks for payments to settle.
    #[arg(long, env = "ORDERPAY_RECONCILE_INTERVAL_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub reconcile_interval_ms: u64,

    /// Payments claimed per reconciler pass.
    #[arg(long, env = "ORDERPAY_RECONCILE_BATCH_SIZE", default_value_t = 50,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub reconcile_batch_size: i64,

    /// Provider checks before a payment whose outcome stays unknown is failed.
    #[arg(long, env = "ORDERPAY_RECONCILE_MAX_ATTEMPTS", default_value_t = 12,
          value_parser = clap::value_parser!(i32).range(1..))]
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
    pub fn config(&self, provider: &ProviderConfig) -> ReconcilerConfig {
        ReconcilerConfig {
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
        }
    }
}

/// A reconciler's claim covers a lookup and a re-sent charge, each up to the provider timeout.
pub fn claim_for(provider_timeout: Duration) -> Duration {
    provider_timeout * 2 + Duration::from_secs(5)
}
