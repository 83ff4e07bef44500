//! The client's errors: each says what happened, with the idempotency key the call used and how
//! many attempts it made.

use serde::Deserialize;
use serde_json::{Map, Value};

/// An `application/problem+json` answer (RFC 9457): `type` is the stable identifier to match on;
/// the problem-specific members (`payment_id`, `resource_id`, `errors`...) are in `extra`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Problem {
    /// A problem-specific member as text (`payment_id`, `resource_id`, `decline_code`...).
    pub fn member(&self, name: &str) -> Option<&str> {
        self.extra.get(name).and_then(Value::as_str)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// A final answer other than a success: its status and problem say why (a decline, a
    /// validation failure, an invalid state...).
    #[error("{status} {}: {}", problem.problem_type, problem.detail)]
    Api { status: u16, problem: Box<Problem> },
    /// 422 `idempotency-key-reused`: the key was first sent with another request (another body,
    /// route or method). A bug in the caller, never retried.
    #[error("the idempotency key was first used for another request: {}", problem.detail)]
    KeyReused { problem: Box<Problem> },
    /// The service was still working on it (409 in use, a payment in progress, 202) when the
    /// retries ran out. Send the same call again later, or look the resource up.
    #[error("still in progress at the service (last answer {status})")]
    InProgress { status: u16, problem: Option<Box<Problem>>, resource_id: Option<String> },
    /// No answer: the connection failed (not retried, or the retries ran out).
    #[error("transport: {0}")]
    Transport(#[source] reqwest::Error),
    /// The call's deadline came before a final answer.
    #[error("the call's deadline passed before a final answer")]
    Deadline,
    /// The stored key was first sent longer ago than `key_ttl`: the service may have forgotten
    /// it, so a retry could run as a new request. Look the resource up instead.
    #[error("the idempotency key {key} was first sent more than key_ttl ago")]
    KeyExpired { key: String, first_sent_at_ms: u64 },
    /// Nothing was sent: a key the service would refuse (1 to 255 visible ASCII characters), a
    /// failing key store, a malformed base URL or API key.
    #[error("{0}")]
    Invalid(String),
    /// A success whose body is not what the operation returns.
    #[error("unexpected answer body: {0}")]
    Decode(String),
}

/// A failed call: what happened, the key it used, and how many attempts it made.
#[derive(Debug, thiserror::Error)]
#[error("{kind} (key {}, {attempts} attempts)", key.as_deref().unwrap_or("none"))]
pub struct Error {
    #[source]
    pub kind: ErrorKind,
    pub key: Option<String>,
    pub attempts: u32,
}

impl Error {
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The problem the service answered, if it answered one.
    pub fn problem(&self) -> Option<&Problem> {
        match &self.kind {
            ErrorKind::Api { problem, .. } | ErrorKind::KeyReused { problem } => Some(problem),
            ErrorKind::InProgress { problem, .. } => problem.as_deref(),
            _ => None,
        }
    }

    /// The HTTP status the service answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match &self.kind {
            ErrorKind::Api { status, .. } | ErrorKind::InProgress { status, .. } => Some(*status),
            ErrorKind::KeyReused { .. } => Some(422),
            _ => None,
        }
    }

    /// Whether sending the same call again (same key) later may succeed: it did not get a
    /// final answer.
    pub fn resumable(&self) -> bool {
        matches!(self.kind, ErrorKind::InProgress { .. } | ErrorKind::Transport(_) | ErrorKind::Deadline)
            || matches!(self.kind, ErrorKind::Api { status, .. } if status >= 500 || status == 429)
    }
}
