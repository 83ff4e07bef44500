//! The Stripe adapter: what orderpay needs to speak Stripe's API instead of the mock's contract
//! (docs/providers.md). This module owns Stripe's spelling of our data and nothing else: the API
//! key and its mode ([`ApiKey`]), and, in its submodules, amounts in Stripe's minor units
//! (`amount`), the form bodies and headers of its writes with the pinned API version (`form`),
//! what its error answers mean (`errors`), its objects and their translation into the
//! provider trait's types (`objects`), webhook signatures (`signature`) and events (`events`),
//! and the `PaymentProvider` that makes the calls ([`StripeProvider`], in `client`).

pub mod amount;
pub mod client;
pub mod errors;
pub mod events;
pub mod form;
pub mod objects;
pub mod signature;

use std::fmt;

use secrecy::{ExposeSecret, SecretString};

pub use client::StripeProvider;
pub use form::STRIPE_VERSION;
pub use signature::WebhookSecret;

/// Stripe's API, where `ORDERPAY_PROVIDER_URL` points with `ORDERPAY_PROVIDER=stripe` unless
/// told otherwise (a local stand-in such as localstripe, for tests).
pub const DEFAULT_URL: &str = "https://api.stripe.com";

/// Whether a key moves real money. Stripe keeps test and live objects apart: a test key never
/// sees a live PaymentIntent, so an operator must know which one a deployment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Test,
    Live,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Test => "test",
            Mode::Live => "live",
        })
    }
}

/// A Stripe API key that can create PaymentIntents and refunds: a secret key (`sk_test_`,
/// `sk_live_`) or a restricted key (`rk_test_`, `rk_live_`). Its `Debug` shows only the mode.
#[derive(Clone)]
pub struct ApiKey {
    key: SecretString,
    mode: Mode,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiKeyError {
    /// A publishable key is meant for browsers; it cannot create or read PaymentIntents.
    #[error(
        "a publishable key (pk_...) cannot make server-side calls; use a secret key sk_... or a restricted key rk_..."
    )]
    Publishable,
    #[error("a Stripe API key starts with sk_test_, sk_live_, rk_test_ or rk_live_")]
    Malformed,
}

impl ApiKey {
    pub fn parse(text: &str) -> Result<ApiKey, ApiKeyError> {
        let text = text.trim();
        if text.starts_with("pk_") {
            return Err(ApiKeyError::Publishable);
        }
        let mode = [
            ("sk_test_", Mode::Test),
            ("rk_test_", Mode::Test),
            ("sk_live_", Mode::Live),
            ("rk_live_", Mode::Live),
        ]
        .into_iter()
        .find(|(prefix, _)| text.len() > prefix.len() && text.starts_with(prefix))
        .map(|(_, mode)| mode)
        .ok_or(ApiKeyError::Malformed)?;
        // A header cannot hold whitespace or control characters; refuse them here, not per call.
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ApiKeyError::Malformed);
        }
        Ok(ApiKey { key: SecretString::from(text.to_owned()), mode })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The key itself, for the `Authorization` header only.
    pub fn reveal(&self) -> &str {
        self.key.expose_secret()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({} mode, <redacted>)", self.mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_tell_their_mode_and_refuse_publishable_or_unknown_keys() {
        assert_eq!(ApiKey::parse("sk_test_abc123").unwrap().mode(), Mode::Test);
        assert_eq!(ApiKey::parse("rk_test_abc123").unwrap().mode(), Mode::Test);
        assert_eq!(ApiKey::parse(" sk_live_abc123\n").unwrap().mode(), Mode::Live);
        assert_eq!(ApiKey::parse("rk_live_abc123").unwrap().mode(), Mode::Live);
        assert_eq!(ApiKey::parse("sk_live_abc123").unwrap().reveal(), "sk_live_abc123");
        assert_eq!(ApiKey::parse("pk_test_abc123").unwrap_err(), ApiKeyError::Publishable);
        for wrong in ["", "sk_test_", "sk_abc", "whsec_abc", "sk_test_a b", "Bearer sk_test_abc"] {
            assert_eq!(ApiKey::parse(wrong).unwrap_err(), ApiKeyError::Malformed, "{wrong:?}");
        }
        let debug = format!("{:?}", ApiKey::parse("sk_live_topsecret").unwrap());
        assert!(debug.contains("live") && !debug.contains("topsecret"), "{debug}");
    }
}
