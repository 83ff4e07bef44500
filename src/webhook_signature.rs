//! Webhook signatures in the Standard Webhooks scheme (<https://www.standardwebhooks.com/>), for
//! every webhook orderpay sends or receives: the mock provider signs its events with it, and the
//! same code verifies them on the receiving side.
//!
//! A sender signs `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 under a shared
//! secret and sends `webhook-signature: v1,<base64 of the MAC>`. The header may hold several
//! space-separated signatures: while a secret is rotated the sender signs with the old and the new
//! one, and a receiver accepts the message when any one signature matches any one of its secrets.
//! The timestamp is signed too, so a receiver refusing old timestamps refuses replayed messages.
//!
//! Secrets are written `whsec_<base64 of the key bytes>`; the HMAC key is the decoded bytes.

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use chrono::{DateTime, Utc};
use ring::hmac::{self, HMAC_SHA256};
use subtle::ConstantTimeEq;

/// How a secret is written, for easy identification.
pub const SECRET_PREFIX: &str = "whsec_";

/// The signature version of HMAC-SHA256 signatures (`v1a` would be ed25519, which we do not use).
const VERSION: &str = "v1";

/// The scheme asks for 24 to 64 random bytes; a shorter key is refused rather than trusted.
const MIN_SECRET_BYTES: usize = 24;
const MAX_SECRET_BYTES: usize = 64;
const GENERATED_SECRET_BYTES: usize = 32;

/// Secrets are accepted with or without base64 padding, as the reference libraries accept them.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A signing secret: the raw key bytes. Deliberately without `Display`, and its `Debug` hides the
/// key, so it cannot end up in a log line by accident; [`Secret::reveal`] writes it out.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
    /// The HMAC key, prepared once; every signature starts from it.
    keyed: hmac::Key,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a webhook secret is `whsec_` followed by base64")]
    Malformed,
    #[error("a webhook secret must be 24 to 64 bytes, this one is {0}")]
    Length(usize),
    #[error("no randomness for a new secret: {0}")]
    Randomness(String),
}

impl Secret {
    /// Parses `whsec_<base64>` (the prefix may be left out, as the reference libraries allow).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let encoded = text.trim().strip_prefix(SECRET_PREFIX).unwrap_or(text.trim());
        let bytes = LENIENT_BASE64.decode(encoded).map_err(|_| SecretError::Malformed)?;
        Secret::from_bytes(bytes)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Secret, SecretError> {
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
            return Err(SecretError::Length(bytes.len()));
        }
        let keyed = hmac::Key::new(HMAC_SHA256, &bytes);
        Ok(Secret { key: bytes, keyed })
    }

    /// A new random secret of 32 bytes from the operating system.
    pub fn generate() -> Result<Secret, SecretError> {
        let mut bytes = vec![0_u8; GENERATED_SECRET_BYTES];
        crate::crypto::fill_random(&mut bytes).map_err(|error| SecretError::Randomness(error.to_string()))?;
        Secret::from_bytes(bytes)
    }

    /// The secret as it is handed to the other side: `whsec_<base64>`.
    pub fn reveal(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.key))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> hmac::Tag {
        hmac_sha256(&self.keyed, &[id.as_bytes(), b".", timestamp.to_string().as_bytes(), b".", body])
    }
}

/// The HMAC-SHA256 under `key` of `parts` one after the other: every webhook scheme here (this
/// one, Stripe's in `provider::stripe::signature`) signs a message's parts joined by dots.
pub(crate) fn hmac_sha256(key: &hmac::Key, parts: &[&[u8]]) -> hmac::Tag {
    let mut mac = hmac::Context::with_key(key);
    for part in parts {
        mac.update(part);
    }
    mac.sign()
}

/// Whether `mac` is one of `candidates`, each compared in constant time: how much of a forged
/// signature matches must not show in how long the refusal takes.
pub(crate) fn matches_any(mac: &hmac::Tag, candidates: &[Vec<u8>]) -> bool {
    candidates.iter().any(|candidate| bool::from(mac.as_ref().ct_eq(candidate)))
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The signature of one message under one secret: `v1,<base64>`.
pub fn sign(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret.mac(id, timestamp, body);
    format!("{VERSION},{}", STANDARD.encode(tag.as_ref()))
}

/// The `webhook-signature` header for a message signed with each of `secrets` (several while a
/// secret is rotated), space-separated.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets.iter().map(|secret| sign(secret, id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the webhook-id header is missing or empty")]
    MissingId,
    #[error("the webhook-timestamp header is not a unix time in seconds")]
    InvalidTimestamp,
    #[error("the message timestamp is too old")]
    TooOld,
    #[error("the message timestamp is too far in the future")]
    TooNew,
    #[error("the webhook-signature header holds no v1 signature")]
    NoSignature,
    #[error("no signature matches")]
    Mismatch,
}

/// Verifies a received message: its timestamp is within `tolerance` of `now`, and one of the
/// `v1` signatures in `signature_header` is the MAC of `{id}.{timestamp}.{body}` under one of
/// `secrets`. `body` must be the bytes exactly as received (never re-serialised JSON).
pub fn verify(
    secrets: &[Secret],
    id: &str,
    timestamp_header: &str,
    signature_header: &str,
    body: &[u8],
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    if id.is_empty() {
        return Err(SignatureError::MissingId);
    }
    let timestamp = check_timestamp(timestamp_header, now, tolerance)?;
    // Signatures of other versions (or that are not base64) are skipped, not fatal: a sender may
    // add schemes we do not know next to the one we do.
    let candidates: Vec<Vec<u8>> = signature_header
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == VERSION)
        .filter_map(|(_, encoded)| STANDARD.decode(encoded).ok())
        .collect();
    if candidates.is_empty() {
        return Err(SignatureError::NoSignature);
    }
    for secret in secrets {
        if matches_any(&secret.mac(id, timestamp, body), &candidates) {
            return Ok(());
        }
    }
    Err(SignatureError::Mismatch)
}

/// The timestamp of a received message, if it is within `tolerance` of `now` ([`verify`] checks
/// it too). A receiver may check it before it reads the body, which the MAC needs: a stale or
/// replayed message is then refused without reading it.
pub fn check_timestamp(
    timestamp_header: &str,
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<i64, SignatureError> {
    let timestamp = parse_timestamp(timestamp_header)?;
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    let now = now.timestamp();
    if now.saturating_sub(timestamp) > tolerance {
        return Err(SignatureError::TooOld);
    }
    if timestamp.saturating_sub(now) > tolerance {
        return Err(SignatureError::TooNew);
    }
    Ok(timestamp)
}

/// Unix seconds, digits only: what we sign is the number re-formatted, so anything that would not
/// format back to the same text (a sign, spaces) is refused rather than silently mismatched.
fn parse_timestamp(header: &str) -> Result<i64, SignatureError> {
    if header.is_empty() || header.len() > 18 || !header.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::InvalidTimestamp);
    }
    header.parse().map_err(|_| SignatureError::InvalidTimestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOLERANCE: Duration = Duration::from_secs(300);

    fn at(unix: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(unix, 0).unwrap()
    }

    /// The vectors of the Standard Webhooks reference libraries (Python and Rust test suites).
    #[test]
    fn signs_like_the_reference_implementation() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            sign(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let secret = Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        assert_eq!(
            sign(&secret, "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553, body),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
        let header = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";
        let now = at(1649367553 + 10);
        let id = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
        assert_eq!(verify(&[secret], id, "1649367553", header, body, now, TOLERANCE), Ok(()));
    }

    #[test]
    fn secrets_parse_with_or_without_prefix_and_padding_and_round_trip() {
        let with_prefix = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let bare = Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(with_prefix.key, bare.key);
        assert_eq!(with_prefix.reveal(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        // 25 bytes: base64 with padding, and the same without it.
        let padded = STANDARD.encode([7_u8; 25]);
        assert!(padded.ends_with('='));
        assert_eq!(
            Secret::parse(&padded).unwrap().key,
            Secret::parse(padded.trim_end_matches('=')).unwrap().key
        );

        let generated = Secret::generate().unwrap();
        assert_eq!(generated.key.len(), 32);
        assert_eq!(Secret::parse(&generated.reveal()).unwrap().key, generated.key);
        assert_ne!(Secret::generate().unwrap().key, generated.key);
        assert_eq!(format!("{generated:?}"), "Secret(<redacted>)");
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert_eq!(Secret::parse("whsec_not base64!").unwrap_err(), SecretError::Malformed);
        assert_eq!(Secret::parse("whsec_").unwrap_err(), SecretError::Length(0));
        assert_eq!(Secret::parse(&STANDARD.encode([1_u8; 16])).unwrap_err(), SecretError::Length(16));
        assert_eq!(Secret::parse(&STANDARD.encode([1_u8; 65])).unwrap_err(), SecretError::Length(65));
    }

    #[test]
    fn a_header_with_several_signatures_verifies_with_any_secret_so_secrets_rotate() {
        let old = Secret::generate().unwrap();
        let new = Secret::generate().unwrap();
        let body = br#"{"type":"charge.succeeded"}"#;
        let now = Utc::now();
        let ts = now.timestamp();
        let header = signature_header(&[old.clone(), new.clone()], "evt_1", ts, body);
        assert_eq!(header.split(' ').count(), 2);
        let check = |secrets: &[Secret], header: &str| {
            verify(secrets, "evt_1", &ts.to_string(), header, body, now, TOLERANCE)
        };
        // A receiver that knows only the old secret, only the new one, or both.
        assert_eq!(check(std::slice::from_ref(&old), &header), Ok(()));
        assert_eq!(check(std::slice::from_ref(&new), &header), Ok(()));
        // A receiver holding both secrets accepts a message signed with either one alone.
        let only_new = sign(&new, "evt_1", ts, body);
        assert_eq!(check(&[old.clone(), new.clone()], &only_new), Ok(()));
        // Unknown versions and junk next to the valid signature are skipped.
        let mixed = format!("v2,abc v1a,zzz garbage v1,!!! {only_new}");
        assert_eq!(check(std::slice::from_ref(&new), &mixed), Ok(()));
        // A third secret matches neither.
        assert_eq!(check(&[Secret::generate().unwrap()], &header), Err(SignatureError::Mismatch));
        assert_eq!(check(&[], &header), Err(SignatureError::Mismatch));
    }

    #[test]
    fn tampering_with_the_body_the_id_or_the_timestamp_is_detected() {
        let secret = Secret::generate().unwrap();
        let secrets = std::slice::from_ref(&secret);
        let now = Utc::now();
        let ts = now.timestamp();
        let body = br#"{"amount":"10.00"}"#;
        let header = sign(&secret, "evt_1", ts, body);
        let ts_text = ts.to_string();
        assert_eq!(verify(secrets, "evt_1", &ts_text, &header, body, now, TOLERANCE), Ok(()));
        let tampered = br#"{"amount":"99.00"}"#;
        assert_eq!(
            verify(secrets, "evt_1", &ts_text, &header, tampered, now, TOLERANCE),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(secrets, "evt_2", &ts_text, &header, body, now, TOLERANCE),
            Err(SignatureError::Mismatch)
        );
        let other_ts = (ts - 1).to_string();
        assert_eq!(
            verify(secrets, "evt_1", &other_ts, &header, body, now, TOLERANCE),
            Err(SignatureError::Mismatch)
        );
        // A flipped bit in the signature itself.
        let mut flipped = STANDARD.decode(header.trim_start_matches("v1,")).unwrap();
        flipped[0] ^= 1;
        let flipped = format!("v1,{}", STANDARD.encode(flipped));
        assert_eq!(
            verify(secrets, "evt_1", &ts_text, &flipped, body, now, TOLERANCE),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn timestamps_outside_the_tolerance_are_refused_even_when_signed() {
        let secret = Secret::generate().unwrap();
        let secrets = std::slice::from_ref(&secret);
        let now = at(1_700_000_000);
        let body = b"{}";
        let check = |ts: i64| {
            let header = sign(&secret, "evt_1", ts, body);
            verify(secrets, "evt_1", &ts.to_string(), &header, body, now, TOLERANCE)
        };
        assert_eq!(check(1_700_000_000 - 300), Ok(()));
        assert_eq!(check(1_700_000_000 + 300), Ok(()));
        assert_eq!(check(1_700_000_000 - 301), Err(SignatureError::TooOld));
        assert_eq!(check(1_700_000_000 + 301), Err(SignatureError::TooNew));
        assert_eq!(check(0), Err(SignatureError::TooOld));
    }

    #[test]
    fn malformed_headers_are_refused_without_panicking() {
        let secret = Secret::generate().unwrap();
        let secrets = std::slice::from_ref(&secret);
        let now = Utc::now();
        let ts = now.timestamp().to_string();
        let good = sign(&secret, "evt_1", now.timestamp(), b"{}");
        let verify =
            |id: &str, ts: &str, header: &str| verify(secrets, id, ts, header, b"{}", now, TOLERANCE);
        assert_eq!(verify("", &ts, &good), Err(SignatureError::MissingId));
        for bad_ts in ["", "hello", "-5", "+1700000000", " 1700000000", "1.5", "99999999999999999999999"] {
            assert_eq!(verify("evt_1", bad_ts, &good), Err(SignatureError::InvalidTimestamp), "{bad_ts:?}");
        }
        for bad_header in ["", " ", "v1", "v1,", "v1,***", "v2,AAAA", ",,,", "g0hM9SsE+OTPJTGt"] {
            let expected = if bad_header == "v1," {
                // Empty base64 decodes to nothing: a signature that matches nothing.
                Err(SignatureError::Mismatch)
            } else {
                Err(SignatureError::NoSignature)
            };
            assert_eq!(verify("evt_1", &ts, bad_header), expected, "{bad_header:?}");
        }
    }
}
