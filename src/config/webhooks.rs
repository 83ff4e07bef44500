//! Webhooks both ways: the provider's, which we verify (`WebhookArgs`), and the merchants',
//! which we send (`MerchantWebhookArgs`).

use std::time::Duration;

use clap::{ArgAction, Args};
use secrecy::{ExposeSecret, SecretString};

use crate::encryption::Keyring;
use crate::merchant_webhooks::{DeliveryConfig, WebhookSettings};
use crate::provider::stripe::WebhookSecret;
use crate::webhook_signature::Secret;

/// How `POST /provider/webhooks` verifies what arrives, by the provider's wire; `Debug` shows no
/// secret.
#[derive(Debug, Clone, Default)]
pub enum ProviderWebhookSecrets {
    /// No secret set: the route does not exist (404), and the reconciler settles every outcome
    /// we did not see.
    #[default]
    Off,
    /// The mock's Standard Webhooks signatures (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`); any one secret verifies.
    Standard(Vec<Secret>),
    /// Stripe's `Stripe-Signature`; any one endpoint secret verifies.
    Stripe(Vec<WebhookSecret>),
}

impl ProviderWebhookSecrets {
    pub fn is_off(&self) -> bool {
        match self {
            ProviderWebhookSecrets::Off => true,
            ProviderWebhookSecrets::Standard(secrets) => secrets.is_empty(),
            ProviderWebhookSecrets::Stripe(secrets) => secrets.is_empty(),
        }
    }

    /// The Standard Webhooks secrets (the mock's), none on Stripe.
    pub fn standard(&self) -> &[Secret] {
        match self {
            ProviderWebhookSecrets::Standard(secrets) => secrets,
            _ => &[],
        }
    }
}

/// `Debug` shows no secret: the secrets are a [`SecretString`].
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// The secret(s) the payment provider signs its webhooks with (`whsec_...`: Standard
    /// Webhooks for the mock, the endpoint's signing secret for Stripe, where it is required);
    /// several, separated by spaces or commas, while a secret is rotated. Set, it enables
    /// `POST /provider/webhooks`; unset, that route does not exist (404). Every instance behind
    /// one load balancer needs the same.
    #[arg(long, env = "ORDERPAY_PROVIDER_WEBHOOK_SECRET", hide_env_values = true)]
    pub provider_webhook_secret: Option<SecretString>,
}

impl WebhookArgs {
    /// The secrets, parsed; none when unset or empty.
    pub fn secrets(&self) -> anyhow::Result<Vec<Secret>> {
        self.parse_each(Secret::parse)
    }

    /// Stripe's endpoint signing secrets (`whsec_...`), at least one: with ORDERPAY_PROVIDER=stripe
    /// a webhook we cannot verify must not be the first sign of a missing secret.
    pub fn stripe_secrets(&self) -> anyhow::Result<Vec<WebhookSecret>> {
        let secrets = self.parse_each(WebhookSecret::parse)?;
        anyhow::ensure!(
            !secrets.is_empty(),
            "ORDERPAY_PROVIDER=stripe needs ORDERPAY_PROVIDER_WEBHOOK_SECRET (the endpoint's signing \
             secret whsec_..., several separated by commas while one is rolled)"
        );
        Ok(secrets)
    }

    /// Each secret of the list (separated by commas or spaces), parsed; an error names the
    /// secret's place in the list, never the secret.
    fn parse_each<T, E: std::fmt::Display>(
        &self,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> anyhow::Result<Vec<T>> {
        let Some(text) = self.provider_webhook_secret.as_ref() else {
            return Ok(Vec::new());
        };
        text.expose_secret()
            .split(|c: char| c == ',' || c.is_ascii_whitespace())
            .filter(|part| !part.is_empty())
            .enumerate()
            .map(|(index, part)| {
                parse(part).map_err(|error| {
                    anyhow::anyhow!("ORDERPAY_PROVIDER_WEBHOOK_SECRET, secret {}: {error}", index + 1)
                })
            })
            .collect()
    }
}

/// `Debug` shows no secret: the encryption key is a [`SecretString`].
#[derive(Debug, Clone, Args)]
pub struct MerchantWebhookArgs {
    /// The key merchant webhook secrets are encrypted with at rest: the base64 of 32 random
    /// bytes (`openssl rand -base64 32`); several, separated by commas, while the key is rotated:
    /// the first seals, every one opens. Set, merchant webhooks are on (`/webhook_endpoints`,
    /// the webhooks relay and the delivery worker); unset, those routes do not exist (404). Every
    /// instance behind one load balancer needs the same.
    #[arg(long, env = "ORDERPAY_ENCRYPTION_KEY", hide_env_values = true)]
    pub encryption_key: Option<SecretString>,

    /// Allow webhook endpoints at private, loopback, link-local and other non-public addresses
    /// (development and tests only).
    #[arg(long, env = "ORDERPAY_WEBHOOK_ALLOW_PRIVATE", default_value_t = false, action = ArgAction::Set)]
    pub webhook_allow_private: bool,

    /// Refuse new webhook endpoints whose URL is `http://` (422 `webhook-url-not-allowed`):
    /// events and their signatures would cross the network in clear. Endpoints registered
    /// before keep receiving, flagged `insecure`. Independent of ORDERPAY_WEBHOOK_ALLOW_PRIVATE.
    #[arg(long, env = "ORDERPAY_WEBHOOK_REQUIRE_HTTPS", default_value_t = true, action = ArgAction::Set)]
    pub webhook_require_https: bool,

    /// A webhook delivery without a 2xx answer within this long has failed (milliseconds).
    #[arg(long, env = "ORDERPAY_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_timeout_ms: u64,

    /// How long a delivery worker holds a delivery it sends; another may send it again after
    /// that. Must exceed the timeout.
    #[arg(long, env = "ORDERPAY_WEBHOOK_LEASE_MS", default_value_t = 15_000)]
    pub webhook_lease_ms: u64,

    /// Wait before the second attempt of a failed delivery; doubles per attempt, with jitter.
    #[arg(long, env = "ORDERPAY_WEBHOOK_RETRY_BASE_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_retry_base_ms: u64,

    /// Longest wait between two attempts of a delivery (default 6 hours).
    #[arg(long, env = "ORDERPAY_WEBHOOK_RETRY_CAP_MS", default_value_t = 21_600_000)]
    pub webhook_retry_cap_ms: u64,

    /// Attempts before a delivery is failed for good (20: about two days with the defaults).
    #[arg(long, env = "ORDERPAY_WEBHOOK_MAX_ATTEMPTS", default_value_t = 20,
          value_parser = clap::value_parser!(i32).range(1..=100))]
    pub webhook_max_attempts: i32,

    /// How often each instance's delivery worker looks for due deliveries (milliseconds); new
    /// events wake it sooner.
    #[arg(long, env = "ORDERPAY_WEBHOOK_POLL_MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_poll_ms: u64,

    /// Webhook deliveries sent at once per instance.
    #[arg(long, env = "ORDERPAY_WEBHOOK_CONCURRENCY", default_value_t = 16,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub webhook_concurrency: usize,

    /// How long a webhook secret replaced by `rotate_secret` keeps signing next to the new one
    /// (milliseconds; default 24 hours).
    #[arg(long, env = "ORDERPAY_WEBHOOK_SECRET_OVERLAP_MS", default_value_t = 86_400_000)]
    pub webhook_secret_overlap_ms: u64,
}

impl MerchantWebhookArgs {
    /// Merchant webhooks' settings; `None` (off) without an encryption key.
    pub fn settings(&self) -> anyhow::Result<Option<WebhookSettings>> {
        let Some(key) = super::non_empty(&self.encryption_key) else {
            return Ok(None);
        };
        let encryption_keys = Keyring::parse(key.expose_secret())?;
        anyhow::ensure!(
            self.webhook_lease_ms > self.webhook_timeout_ms,
            "ORDERPAY_WEBHOOK_LEASE_MS must be longer than ORDERPAY_WEBHOOK_TIMEOUT_MS"
        );
        Ok(Some(WebhookSettings {
            encryption_keys,
            allow_private: self.webhook_allow_private,
            require_https: self.webhook_require_https,
            secret_overlap: Duration::from_millis(self.webhook_secret_overlap_ms),
            delivery: DeliveryConfig {
                poll: Duration::from_millis(self.webhook_poll_ms),
                timeout: Duration::from_millis(self.webhook_timeout_ms),
                lease: Duration::from_millis(self.webhook_lease_ms),
                retry_base: Duration::from_millis(self.webhook_retry_base_ms),
                retry_cap: Duration::from_millis(self.webhook_retry_cap_ms.max(self.webhook_retry_base_ms)),
                max_attempts: self.webhook_max_attempts,
                concurrency: self.webhook_concurrency,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_secrets_rotate_as_a_list_split_by_spaces_or_commas() {
        let (old, new) = (Secret::generate().unwrap().reveal(), Secret::generate().unwrap().reveal());
        let args =
            |text: Option<String>| WebhookArgs { provider_webhook_secret: text.map(SecretString::from) };
        assert!(args(None).secrets().unwrap().is_empty());
        assert!(args(Some(" ".into())).secrets().unwrap().is_empty());
        for list in [format!("{old} {new}"), format!("{old},{new}"), format!(" {old} , {new}\n")] {
            let secrets = args(Some(list)).secrets().unwrap();
            let revealed: Vec<String> = secrets.iter().map(Secret::reveal).collect();
            assert_eq!(revealed, [old.clone(), new.clone()]);
        }
        let refused = args(Some(format!("{old} whsec_short"))).secrets().unwrap_err().to_string();
        assert!(refused.contains("secret 2"), "{refused}");
        assert!(!refused.contains(&old), "the error names no secret: {refused}");
        let debug = format!("{:?}", args(Some(old.clone())));
        assert!(debug.contains("REDACTED") && !debug.contains(&old), "{debug}");
    }
}
