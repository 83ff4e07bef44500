//! Stripe's webhook signatures (`Stripe-Signature`), which differ from the Standard Webhooks
//! scheme of `crate::webhook_signature` in three ways: the header is `t=<unix>,v1=<hex>[,v1=...]`,
//! the signed text is `{t}.{payload}` (no message id), and the HMAC key is the whole endpoint
//! secret string as written, `whsec_` included (Stripe's libraries use it that way; it is not
//! base64 to decode). The HMAC, the constant-time comparison and the timestamp's window are
//! `webhook_signature`'s.
//!
//! While a secret is rolled, Stripe signs with the old and the new one (two `v1` entries) and we
//! may hold both (`ORDERPAY_PROVIDER_WEBHOOK_SECRET` is a list): any one `v1` matching any one
//! secret is enough. Other schemes in the header (`v0`, Stripe's test-mode legacy) are ignored.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ring::hmac::{self, HMAC_SHA256};

use crate::webhook_signature::{self, SignatureError, hmac_sha256, matches_any};

/// How a Stripe endpoint secret is written.
const SECRET_PREFIX: &str = "whsec_";

/// The tolerance Stripe's own libraries apply to `t`: a delivery older than this is refused as a
/// possible replay.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// A Stripe endpoint signing secret. Its `Debug` hides it and it has no `Display`, so it cannot
/// reach a log line by accident.
#[derive(Clone)]
pub struct WebhookSecret {
    /// The HMAC key prepared once from the secret's bytes.
    keyed: hmac::Key,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a Stripe webhook secret is whsec_ followed by the rest of the endpoint's signing secret")]
pub struct WebhookSecretError;

impl WebhookSecret {
    pub fn parse(text: &str) -> Result<WebhookSecret, WebhookSecretError> {
        let text = text.trim();
        let rest = text.strip_prefix(SECRET_PREFIX).ok_or(WebhookSecretError)?;
        // Commas and whitespace separate the secrets of the list; anything else printable is kept.
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(WebhookSecretError);
        }
        Ok(WebhookSecret { keyed: hmac::Key::new(HMAC_SHA256, text.as_bytes()) })
    }

    fn mac(&self, timestamp: &str, payload: &[u8]) -> hmac::Tag {
        hmac_sha256(&self.keyed, &[timestamp.as_bytes(), b".", payload])
    }

    /// The `Stripe-Signature` header Stripe would send with `payload` at `timestamp`: what the
    /// mock's Stripe wire signs its webhooks with.
    pub fn header(&self, timestamp: i64, payload: &[u8]) -> String {
        let tag = self.mac(&timestamp.to_string(), payload);
        format!("t={timestamp},v1={}", hex::encode(tag.as_ref()))
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// Why a delivery claiming to be Stripe's was refused. None of them says which part of a
/// signature matched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StripeSignatureError {
    #[error("the Stripe-Signature header is missing")]
    MissingHeader,
    #[error("the Stripe-Signature header is malformed: {0}")]
    Malformed(&'static str),
    #[error("the Stripe-Signature timestamp is outside the tolerance (a replay, or a clock far off)")]
    OutsideTolerance,
    #[error("no v1 signature matches any of our webhook secrets")]
    NoSignatureMatches,
}

/// Verifies a delivery: `header` is its `Stripe-Signature`, `payload` the body's bytes exactly as
/// received. Its `t` must be within `tolerance` of `now` (either way), and one of its `v1`
/// signatures the HMAC-SHA256 of `{t}.{payload}` under one of `secrets`.
pub fn verify(
    secrets: &[WebhookSecret],
    header: Option<&str>,
    payload: &[u8],
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<(), StripeSignatureError> {
    let header = header.ok_or(StripeSignatureError::MissingHeader)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for entry in header.split(',') {
        let (scheme, value) = entry
            .trim()
            .split_once('=')
            .ok_or(StripeSignatureError::Malformed("an entry is not key=value"))?;
        match scheme {
            "t" if timestamp.is_none() => timestamp = Some(value),
            "t" => return Err(StripeSignatureError::Malformed("more than one timestamp")),
            // A v1 that is not hex cannot match; it is skipped like any other signature that does not.
            "v1" => signatures.extend(hex::decode(value).ok()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(StripeSignatureError::Malformed("no timestamp t="))?;
    if !header.split(',').any(|entry| entry.trim().starts_with("v1=")) {
        return Err(StripeSignatureError::Malformed("no v1 signature"));
    }
    // The same parser as Standard Webhooks' timestamps: unix seconds, digits only, so the text we
    // sign is the text Stripe signed.
    webhook_signature::check_timestamp(timestamp, now, tolerance).map_err(|error| match error {
        SignatureError::TooOld | SignatureError::TooNew => StripeSignatureError::OutsideTolerance,
        _ => StripeSignatureError::Malformed("the timestamp is not unix seconds"),
    })?;
    if secrets.iter().any(|secret| matches_any(&secret.mac(timestamp, payload), &signatures)) {
        Ok(())
    } else {
        Err(StripeSignatureError::NoSignatureMatches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYLOAD: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
    const OLD: &str = "whsec_oldOLDold0123456789abcdefABCDEFG";
    const NEW: &str = "whsec_newNEWnew0123456789abcdefABCDEFG";

    /// Signs as Stripe does, computed here with ring directly rather than with the code under test.
    fn stripe_sign(secret: &str, timestamp: i64, payload: &[u8]) -> String {
        let key = hmac::Key::new(HMAC_SHA256, secret.as_bytes());
        let mut signed = format!("{timestamp}.").into_bytes();
        signed.extend_from_slice(payload);
        hex::encode(hmac::sign(&key, &signed).as_ref())
    }

    fn secrets(texts: &[&str]) -> Vec<WebhookSecret> {
        texts.iter().map(|text| WebhookSecret::parse(text).unwrap()).collect()
    }

    fn at(unix: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(unix, 0).unwrap()
    }

    const NOW: i64 = 1_750_000_000;

    fn check(held: &[&str], header: &str) -> Result<(), StripeSignatureError> {
        verify(&secrets(held), Some(header), PAYLOAD, at(NOW), DEFAULT_TOLERANCE)
    }

    #[test]
    fn a_signature_of_the_whole_secret_string_verifies() {
        let header = format!("t={NOW},v1={}", stripe_sign(OLD, NOW, PAYLOAD));
        assert_eq!(check(&[OLD], &header), Ok(()));
        // Spaces after the commas and unknown schemes (v0) are tolerated.
        let spaced = format!("t={NOW}, v0=abcdef, v1={}", stripe_sign(OLD, NOW, PAYLOAD));
        assert_eq!(check(&[OLD], &spaced), Ok(()));
        assert_eq!(check(&[NEW], &header), Err(StripeSignatureError::NoSignatureMatches));
        // Keyed with the secret's base64 decoded (the Standard Webhooks way), it does not verify.
        use base64::Engine;
        // (32 characters after the prefix: valid base64, so the decoded key exists.)
        let decoded = base64::engine::general_purpose::STANDARD.decode(&OLD[SECRET_PREFIX.len()..]).unwrap();
        let mut signed = format!("{NOW}.").into_bytes();
        signed.extend_from_slice(PAYLOAD);
        let decoded_mac = hmac::sign(&hmac::Key::new(HMAC_SHA256, &decoded), &signed);
        let wrong_key = format!("t={NOW},v1={}", hex::encode(decoded_mac.as_ref()));
        assert_eq!(check(&[OLD], &wrong_key), Err(StripeSignatureError::NoSignatureMatches));
    }

    #[test]
    fn during_a_roll_any_v1_matching_any_secret_is_enough() {
        let both =
            format!("t={NOW},v1={},v1={}", stripe_sign(OLD, NOW, PAYLOAD), stripe_sign(NEW, NOW, PAYLOAD));
        let only_new = format!("t={NOW},v1={}", stripe_sign(NEW, NOW, PAYLOAD));
        assert_eq!(check(&[OLD], &both), Ok(()));
        assert_eq!(check(&[NEW], &both), Ok(()));
        assert_eq!(check(&[OLD, NEW], &only_new), Ok(()));
        assert_eq!(check(&[OLD], &only_new), Err(StripeSignatureError::NoSignatureMatches));
        assert_eq!(check(&[], &both), Err(StripeSignatureError::NoSignatureMatches));
    }

    #[test]
    fn a_replayed_delivery_with_an_old_timestamp_is_refused_though_its_signature_is_right() {
        let replayed_at = NOW - 301;
        let replay = format!("t={replayed_at},v1={}", stripe_sign(OLD, replayed_at, PAYLOAD));
        assert_eq!(check(&[OLD], &replay), Err(StripeSignatureError::OutsideTolerance));
        let edge = NOW - 300;
        assert_eq!(check(&[OLD], &format!("t={edge},v1={}", stripe_sign(OLD, edge, PAYLOAD))), Ok(()));
        let future = NOW + 301;
        let ahead = format!("t={future},v1={}", stripe_sign(OLD, future, PAYLOAD));
        assert_eq!(check(&[OLD], &ahead), Err(StripeSignatureError::OutsideTolerance));
        // The tolerance is the caller's: a wider one accepts the same delivery.
        let wide = verify(&secrets(&[OLD]), Some(&replay), PAYLOAD, at(NOW), Duration::from_secs(600));
        assert_eq!(wide, Ok(()));
    }

    #[test]
    fn a_changed_payload_or_timestamp_does_not_verify() {
        let signature = stripe_sign(OLD, NOW, PAYLOAD);
        let changed = verify(
            &secrets(&[OLD]),
            Some(&format!("t={NOW},v1={signature}")),
            b"{}",
            at(NOW),
            DEFAULT_TOLERANCE,
        );
        assert_eq!(changed, Err(StripeSignatureError::NoSignatureMatches));
        let moved = NOW - 1;
        assert_eq!(
            check(&[OLD], &format!("t={moved},v1={signature}")),
            Err(StripeSignatureError::NoSignatureMatches)
        );
    }

    #[test]
    fn missing_and_malformed_headers_are_named() {
        let missing = verify(&secrets(&[OLD]), None, PAYLOAD, at(NOW), DEFAULT_TOLERANCE);
        assert_eq!(missing, Err(StripeSignatureError::MissingHeader));
        let signature = stripe_sign(OLD, NOW, PAYLOAD);
        for malformed in [
            String::new(),
            format!("v1={signature}"),
            format!("t={NOW}"),
            format!("t={NOW},v0={signature}"),
            format!("t=-{NOW},v1={signature}"),
            format!("t=soon,v1={signature}"),
            format!("t={NOW},t={NOW},v1={signature}"),
            format!("t={NOW};v1={signature}"),
        ] {
            assert!(
                matches!(check(&[OLD], &malformed), Err(StripeSignatureError::Malformed(_))),
                "{malformed:?}: {:?}",
                check(&[OLD], &malformed)
            );
        }
        assert_eq!(
            check(&[OLD], &format!("t={NOW},v1=not-hex")),
            Err(StripeSignatureError::NoSignatureMatches)
        );
    }

    #[test]
    fn secrets_must_be_whsec_and_stay_hidden() {
        assert!(WebhookSecret::parse(" whsec_abc123 ").is_ok());
        for wrong in ["", "whsec_", "abc123", "whsec_abc 123", "whsec_a,b", "sk_test_abc"] {
            assert_eq!(WebhookSecret::parse(wrong).unwrap_err(), WebhookSecretError, "{wrong:?}");
        }
        assert_eq!(format!("{:?}", WebhookSecret::parse(OLD).unwrap()), "WebhookSecret(<redacted>)");
    }
}
