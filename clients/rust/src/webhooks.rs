//! Verifying orderpay's merchant webhooks (Standard Webhooks) and reading their events.
//!
//! orderpay signs `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 under the
//! endpoint's secret (`whsec_<base64>`; the key is the decoded bytes) and sends
//! `webhook-signature: v1,<base64>`; while a rotated-out secret still signs, the header holds
//! two signatures, the new secret's first. A message is genuine when one signature matches one
//! secret and its timestamp is within the tolerance of the receiver's clock.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use subtle::ConstantTimeEq;

use crate::types::Event;

const SECRET_PREFIX: &str = "whsec_";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("a webhook secret is `whsec_` followed by base64")]
    InvalidSecret,
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the webhook-timestamp header is not a number of seconds")]
    InvalidTimestamp,
    #[error("the timestamp is more than the tolerance away from now")]
    TimestampOutOfTolerance,
    #[error("no signature matches a secret")]
    NoMatchingSignature,
    #[error("the body is not an orderpay event: {0}")]
    InvalidEvent(String),
}

/// The secrets of one endpoint (one, or two during a rotation) and the tolerance.
#[derive(Clone)]
pub struct Webhook {
    keys: Vec<Vec<u8>>,
    tolerance: Duration,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("secrets", &self.keys.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl Webhook {
    /// From the endpoint's secrets (`whsec_...`); a tolerance of 5 minutes.
    pub fn new<S: AsRef<str>>(secrets: &[S]) -> Result<Webhook, WebhookError> {
        let keys = secrets
            .iter()
            .map(|secret| {
                let secret = secret.as_ref().trim();
                let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
                STANDARD.decode(encoded).map_err(|_| WebhookError::InvalidSecret)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() || keys.iter().any(Vec::is_empty) {
            return Err(WebhookError::InvalidSecret);
        }
        Ok(Webhook { keys, tolerance: Duration::from_secs(300) })
    }

    /// How far a message's timestamp may be from the receiver's clock (5 minutes by default).
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a delivery against the current time; `header` looks a header up by its
    /// lower-case name. Returns the event.
    pub fn verify<'h>(
        &self,
        header: impl Fn(&str) -> Option<&'h str>,
        body: &[u8],
    ) -> Result<Event, WebhookError> {
        self.verify_at(header, body, crate::keys::now_ms() / 1000)
    }

    /// [`Webhook::verify`] at `now` (Unix seconds).
    pub fn verify_at<'h>(
        &self,
        header: impl Fn(&str) -> Option<&'h str>,
        body: &[u8],
        now: u64,
    ) -> Result<Event, WebhookError> {
        let id = header("webhook-id").ok_or(WebhookError::MissingHeader("webhook-id"))?;
        let timestamp =
            header("webhook-timestamp").ok_or(WebhookError::MissingHeader("webhook-timestamp"))?;
        let signatures =
            header("webhook-signature").ok_or(WebhookError::MissingHeader("webhook-signature"))?;
        let seconds: u64 = timestamp.trim().parse().map_err(|_| WebhookError::InvalidTimestamp)?;
        if seconds.abs_diff(now) > self.tolerance.as_secs() {
            return Err(WebhookError::TimestampOutOfTolerance);
        }
        let sent: Vec<Vec<u8>> = signatures
            .split(' ')
            .filter_map(|signature| signature.strip_prefix("v1,"))
            .filter_map(|encoded| STANDARD.decode(encoded).ok())
            .collect();
        let matches = self.keys.iter().any(|key| {
            let expected = sign(key, id, timestamp.trim(), body);
            sent.iter().any(|signature| bool::from(signature.as_slice().ct_eq(&expected)))
        });
        if !matches {
            return Err(WebhookError::NoMatchingSignature);
        }
        serde_json::from_slice(body).map_err(|error| WebhookError::InvalidEvent(error.to_string()))
    }
}

fn sign(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut mac = ring::hmac::Context::with_key(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.sign().as_ref().to_vec()
}

/// The `webhook-signature` value of a message under `secret`, as orderpay sends it (for tests of
/// a receiver).
pub fn signature(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Result<String, WebhookError> {
    let webhook = Webhook::new(&[secret])?;
    Ok(format!("v1,{}", STANDARD.encode(sign(&webhook.keys[0], id, &timestamp.to_string(), body))))
}
