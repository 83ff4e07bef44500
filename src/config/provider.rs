//! The payment provider's settings and the reconciler's, which are read together: a claim and
//! the give-up margin are counted in provider timeouts. `ORDERPAY_PROVIDER` selects the wire the
//! provider speaks: the mock's contract (docs/payments.md) or Stripe's (docs/providers.md), whose
//! settings are checked here in full before anything starts.

use std::time::Duration;

use anyhow::bail;
use clap::{Args, ValueEnum};
use secrecy::{ExposeSecret, SecretString};

use super::WebhookArgs;
use crate::operations::reconciler::ReconcilerConfig;
use crate::provider::stripe::{self, ApiKey, WebhookSecret};

/// The wire the provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// The mock provider's contract (`orderpay mock-provider`, or anything speaking it).
    Mock,
    /// Stripe's API: PaymentIntents, Refunds, Stripe-Signature webhooks.
    Stripe,
}

/// Where the mock provider listens unless told otherwise (`MOCK_PROVIDER_LISTEN`'s default).
pub const MOCK_PROVIDER_URL: &str = "http://127.0.0.1:8081";

#[derive(Debug, Clone, Args)]
pub struct ProviderArgs {
    /// The wire the payment provider speaks: `mock` (the mock provider's contract) or `stripe`.
    #[arg(long = "provider", id = "provider", env = "ORDERPAY_PROVIDER", value_enum,
          default_value_t = ProviderKind::Mock)]
    pub kind: ProviderKind,

    /// Base URL of the payment provider (default: the mock provider at http://127.0.0.1:8081
    /// with ORDERPAY_PROVIDER=mock, https://api.stripe.com with ORDERPAY_PROVIDER=stripe).
    #[arg(long, env = "ORDERPAY_PROVIDER_URL")]
    pub provider_url: Option<String>,

    /// How long a provider call may take before its outcome counts as unknown (202).
    #[arg(long, env = "ORDERPAY_PROVIDER_TIMEOUT_MS", default_value_t = 5_000)]
    pub provider_timeout_ms: u64,

    /// The provider credential, sent as `Authorization: Bearer` on every call (default: none;
    /// required with ORDERPAY_PROVIDER=stripe: a secret key `sk_...` or a restricted key `rk_...`).
    #[arg(long, env = "ORDERPAY_PROVIDER_API_KEY", hide_env_values = true)]
    pub provider_api_key: Option<SecretString>,

    /// With ORDERPAY_PROVIDER=stripe: send a lookup's window as `created[gte]`/`created[lte]`
    /// on its listing. Off only for a stand-in that refuses the filter (localstripe); the
    /// window is then applied to what comes back, over more pages.
    #[arg(long, env = "ORDERPAY_STRIPE_CREATED_FILTER", default_value_t = true, action = clap::ArgAction::Set)]
    pub stripe_created_filter: bool,
}

impl ProviderArgs {
    /// The provider's base URL: the one set, else the default of the selected wire.
    pub fn url(&self) -> String {
        match self.provider_url.as_deref().map(str::trim).filter(|url| !url.is_empty()) {
            Some(url) => url.to_owned(),
            None => match self.kind {
                ProviderKind::Mock => MOCK_PROVIDER_URL.to_owned(),
                ProviderKind::Stripe => stripe::DEFAULT_URL.to_owned(),
            },
        }
    }

    /// The settings of the provider's client, for the selected wire. With ORDERPAY_PROVIDER=stripe
    /// the API key is required and checked here, before anything is started.
    pub fn config(&self) -> anyhow::Result<ProviderConfig> {
        let wire = match self.kind {
            ProviderKind::Mock => Wire::Mock { api_key: super::non_empty(&self.provider_api_key) },
            ProviderKind::Stripe => {
                Wire::Stripe { api_key: self.stripe_api_key()?, created_filter: self.stripe_created_filter }
            }
        };
        Ok(ProviderConfig { url: self.url(), timeout: Duration::from_millis(self.provider_timeout_ms), wire })
    }

    /// The Stripe API key, required and parsed (a publishable key, for one, is refused).
    pub fn stripe_api_key(&self) -> anyhow::Result<ApiKey> {
        let Some(key) = super::non_empty(&self.provider_api_key) else {
            bail!(
                "ORDERPAY_PROVIDER=stripe needs ORDERPAY_PROVIDER_API_KEY \
                 (a secret key sk_... or a restricted key rk_...)"
            );
        };
        ApiKey::parse(key.expose_secret())
            .map_err(|error| anyhow::anyhow!("ORDERPAY_PROVIDER_API_KEY: {error}"))
    }

    /// What `orderpay provider check` says of the Stripe settings, one line per setting: set or
    /// missing, and the key's mode. Never a secret.
    pub fn stripe_report(&self, webhooks: &WebhookArgs) -> Vec<(&'static str, String)> {
        let url_origin = if self.provider_url.as_deref().is_some_and(|url| !url.trim().is_empty()) {
            "ORDERPAY_PROVIDER_URL"
        } else {
            "default"
        };
        let api_key = match self.stripe_api_key() {
            Ok(key) => format!("set, {} mode", key.mode()),
            Err(_) if super::non_empty(&self.provider_api_key).is_none() => {
                "missing: set ORDERPAY_PROVIDER_API_KEY".to_owned()
            }
            Err(error) => format!("refused: {error}"),
        };
        let secrets = match webhooks.stripe_secrets() {
            Ok(secrets) => format!("{} set", secrets.len()),
            Err(_) if super::non_empty(&webhooks.provider_webhook_secret).is_none() => {
                "missing: set ORDERPAY_PROVIDER_WEBHOOK_SECRET".to_owned()
            }
            Err(error) => format!("refused: {error}"),
        };
        vec![
            ("provider", "stripe".to_owned()),
            ("url", format!("{} ({url_origin})", self.url())),
            ("api key", api_key),
            ("webhook secrets", secrets),
            ("stripe version", format!("{} (pinned)", stripe::STRIPE_VERSION)),
        ]
    }
}

/// Everything the Stripe adapter needs, each setting checked: what `serve` will run with once the
/// adapter makes calls, and what `orderpay provider check` reports on.
#[derive(Debug, Clone)]
pub struct StripeSettings {
    pub url: String,
    pub api_key: ApiKey,
    /// One or more: any one verifies a webhook, so a secret can be rolled without a gap.
    pub webhook_secrets: Vec<WebhookSecret>,
}

impl StripeSettings {
    /// Stripe's settings from the provider's and the webhooks' arguments. Every missing or
    /// malformed one is named, all at once, so a half-configured Stripe is fixed in one go.
    pub fn read(provider: &ProviderArgs, webhooks: &WebhookArgs) -> anyhow::Result<StripeSettings> {
        match (provider.stripe_api_key(), webhooks.stripe_secrets()) {
            (Ok(api_key), Ok(webhook_secrets)) => {
                Ok(StripeSettings { url: provider.url(), api_key, webhook_secrets })
            }
            (Ok(_), Err(error)) | (Err(error), Ok(_)) => Err(error),
            (Err(key), Err(secrets)) => Err(anyhow::anyhow!("{key}; and {secrets}")),
        }
    }
}

/// `Debug` shows no secret: the API keys are a [`SecretString`] and an [`ApiKey`].
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub url: String,
    pub timeout: Duration,
    pub wire: Wire,
}

/// The wire the provider's client speaks, with its credential.
#[derive(Debug, Clone)]
pub enum Wire {
    /// The mock's contract; `api_key` is sent as `Authorization: Bearer` when set.
    Mock { api_key: Option<SecretString> },
    /// Stripe's API, with its key (required), and whether lookups send their window on
    /// `created`.
    Stripe { api_key: ApiKey, created_filter: bool },
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{ProviderWebhookSecrets, ServeArgs};

    /// The provider's and the webhooks' settings, as `orderpay provider check` reads them.
    #[derive(Parser)]
    struct Check {
        #[command(flatten)]
        provider: ProviderArgs,
        #[command(flatten)]
        webhooks: WebhookArgs,
    }

    /// `serve`'s settings, all of them.
    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    const KEY: &str = "sk_test_4eC39HqLyjWDarjtT1zdp7dc";
    const SECRET: &str = "whsec_first0123456789";
    const ROLLED: &str = "whsec_second0123456789";

    fn check(flags: &[&str]) -> Check {
        Check::try_parse_from(["check"].iter().chain(flags)).unwrap()
    }

    fn stripe_error(flags: &[&str]) -> String {
        let Check { provider, webhooks } = check(flags);
        StripeSettings::read(&provider, &webhooks).unwrap_err().to_string()
    }

    #[test]
    fn the_mock_is_the_default_wire_at_its_default_address() {
        let Check { mut provider, .. } = check(&[]);
        assert_eq!(provider.kind, ProviderKind::Mock);
        // No URL set, whatever the environment running the tests exports.
        provider.provider_url = None;
        assert_eq!(provider.config().unwrap().url, MOCK_PROVIDER_URL);
        let Check { provider, .. } = check(&["--provider-url", "http://mock:9000"]);
        assert_eq!(provider.config().unwrap().url, "http://mock:9000");
        assert!(Check::try_parse_from(["check", "--provider", "paypal"]).is_err());
    }

    #[test]
    fn stripe_defaults_to_its_api_and_reads_a_key_and_rolled_secrets() {
        let secrets = format!("{SECRET},{ROLLED}");
        let Check { mut provider, webhooks } = check(&[
            "--provider",
            "stripe",
            "--provider-api-key",
            KEY,
            "--provider-webhook-secret",
            &secrets,
        ]);
        // No URL set, whatever the environment running the tests exports.
        provider.provider_url = None;
        let settings = StripeSettings::read(&provider, &webhooks).unwrap();
        assert_eq!(settings.url, "https://api.stripe.com");
        assert_eq!(settings.api_key.mode(), stripe::Mode::Test);
        assert_eq!(settings.webhook_secrets.len(), 2);
        let Check { provider, .. } = check(&[
            "--provider",
            "stripe",
            "--provider-url",
            "http://localhost:8420",
            "--provider-api-key",
            KEY,
        ]);
        assert_eq!(provider.url(), "http://localhost:8420");
    }

    #[test]
    fn a_half_configured_stripe_is_refused_naming_what_is_missing() {
        let missing_key = stripe_error(&["--provider", "stripe", "--provider-webhook-secret", SECRET]);
        assert!(missing_key.contains("ORDERPAY_PROVIDER_API_KEY"), "{missing_key}");
        assert!(!missing_key.contains("ORDERPAY_PROVIDER_WEBHOOK_SECRET"), "{missing_key}");

        let missing_secret = stripe_error(&["--provider", "stripe", "--provider-api-key", KEY]);
        assert!(missing_secret.contains("ORDERPAY_PROVIDER_WEBHOOK_SECRET"), "{missing_secret}");
        assert!(!missing_secret.contains(KEY), "no secret in errors: {missing_secret}");

        let both = stripe_error(&["--provider", "stripe", "--provider-api-key", " "]);
        assert!(
            both.contains("ORDERPAY_PROVIDER_API_KEY") && both.contains("ORDERPAY_PROVIDER_WEBHOOK_SECRET"),
            "{both}"
        );

        let publishable = stripe_error(&[
            "--provider",
            "stripe",
            "--provider-api-key",
            "pk_live_abc",
            "--provider-webhook-secret",
            SECRET,
        ]);
        assert!(publishable.contains("publishable") && !publishable.contains("pk_live_abc"), "{publishable}");

        let second_wrong = format!("{SECRET},sk_live_oops");
        let wrong_secret = stripe_error(&[
            "--provider",
            "stripe",
            "--provider-api-key",
            KEY,
            "--provider-webhook-secret",
            &second_wrong,
        ]);
        assert!(wrong_secret.contains("secret 2") && !wrong_secret.contains("oops"), "{wrong_secret}");
    }

    #[test]
    fn stripe_is_the_client_built_where_the_provider_is_called_never_the_mock() {
        let Check { provider, .. } = check(&["--provider", "stripe", "--provider-api-key", KEY]);
        let config = provider.config().unwrap();
        assert!(
            matches!(&config.wire, Wire::Stripe { api_key, .. } if api_key.mode() == stripe::Mode::Test),
            "{config:?}"
        );
        assert!(!format!("{config:?}").contains(KEY), "no key in debug output");
        let Check { provider, .. } = check(&["--provider", "stripe"]);
        assert!(provider.config().unwrap_err().to_string().contains("ORDERPAY_PROVIDER_API_KEY"));

        let serve = |flags: &[&str]| {
            let Serve { args } = Serve::try_parse_from(["serve"].iter().chain(flags)).unwrap();
            args.settings()
        };
        let complete =
            ["--provider", "stripe", "--provider-api-key", KEY, "--provider-webhook-secret", SECRET];
        let settings = serve(&complete).unwrap();
        assert!(matches!(settings.provider.wire, Wire::Stripe { .. }));
        // The endpoint's signing secret turns `POST /provider/webhooks` on, verifying Stripe-Signature.
        assert!(
            matches!(&settings.api.provider_webhooks, ProviderWebhookSecrets::Stripe(secrets) if secrets.len() == 1),
            "{:?}",
            settings.api.provider_webhooks
        );
        let half = serve(&["--provider", "stripe", "--provider-api-key", KEY]).unwrap_err().to_string();
        assert!(half.contains("ORDERPAY_PROVIDER_WEBHOOK_SECRET"), "{half}");
    }

    #[test]
    fn the_stripe_report_says_what_is_set_and_the_mode_never_the_secrets() {
        let Check { mut provider, webhooks } = check(&[
            "--provider",
            "stripe",
            "--provider-api-key",
            "rk_live_abc123",
            "--provider-webhook-secret",
            SECRET,
        ]);
        // No URL set, whatever the environment running the tests exports.
        provider.provider_url = None;
        let report = provider.stripe_report(&webhooks);
        let line = |name: &str| {
            report.iter().find(|(field, _)| *field == name).map(|(_, value)| value.clone()).unwrap()
        };
        assert_eq!(line("url"), "https://api.stripe.com (default)");
        assert_eq!(line("api key"), "set, live mode");
        assert_eq!(line("webhook secrets"), "1 set");
        assert_eq!(line("stripe version"), format!("{} (pinned)", stripe::STRIPE_VERSION));
        let printed = format!("{report:?}");
        assert!(!printed.contains("rk_live_abc123") && !printed.contains(SECRET), "{printed}");

        let Check { provider, webhooks } =
            check(&["--provider", "stripe", "--provider-api-key", "pk_test_abc"]);
        let report = provider.stripe_report(&webhooks);
        assert!(report[2].1.starts_with("refused: ") && report[2].1.contains("publishable"), "{report:?}");
        assert_eq!(report[3].1, "missing: set ORDERPAY_PROVIDER_WEBHOOK_SECRET");
    }
}
