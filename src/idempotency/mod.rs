//! Idempotency: keys, fingerprints, the key store, the in-memory copies of final answers, and
//! the sweeper. The contract it implements is docs/idempotency.md.
//!
//! Generic on purpose: this module knows keys, bindings (method, route, body fingerprint) and
//! stored answers, not orders or payments. A key row is written once, when its request claims
//! it, inside the statement or transaction of the operation it protects. Its answer is either on
//! the row itself (a local operation such as an order, whose answer is known when it commits) or
//! on the row of the provider operation the key started (a payment), which moves while the
//! operation runs and holds the answer once it settles.

pub mod cache;
pub mod fingerprint;
pub mod key;
pub mod store;
pub mod sweeper;

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::ids::AccountId;

pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError};
pub use store::{KeyConflict, KeyRecord, Resolved, ResourceKind};

/// A request that carried an `Idempotency-Key`: what the key is scoped to and bound to.
#[derive(Debug, Clone)]
pub struct KeyedRequest {
    pub account_id: AccountId,
    pub key: IdempotencyKey,
    pub method: String,
    pub route: String,
    pub fingerprint: Fingerprint,
}

/// An HTTP answer as stored with a key and replayed verbatim: status, the headers that belong to
/// the answer (`Content-Type`, `Location`), and the exact body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A JSON answer with the given status.
    pub fn json(status: u16, body: Vec<u8>) -> Self {
        StoredResponse {
            status,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body,
        }
    }

    pub fn with_header(mut self, name: &str, value: String) -> Self {
        self.headers.push((name.to_owned(), value));
        self
    }

    /// The stored form of the headers: `[[name, value], ...]`.
    pub fn headers_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.headers.iter().map(|(name, value)| serde_json::json!([name, value])).collect(),
        )
    }
}

/// How a keyed operation ended up answering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execution {
    /// This request ran the operation; its answer was stored (when a key was given).
    Executed(StoredResponse),
    /// An earlier request with the same key ran it; this is its stored answer.
    Replayed(StoredResponse),
}

impl Execution {
    pub fn response(&self) -> &StoredResponse {
        match self {
            Execution::Executed(response) | Execution::Replayed(response) => response,
        }
    }

    pub fn is_replay(&self) -> bool {
        matches!(self, Execution::Replayed(_))
    }
}

/// What every keyed use case needs besides its database: how long keys live, and the
/// in-memory copies of final answers.
#[derive(Clone)]
pub struct Keys {
    pub retention: Duration,
    pub replays: std::sync::Arc<cache::ReplayCache>,
}

impl Keys {
    /// Keeps a final answer for replays from memory, until its key expires (`expires_at`, the
    /// key row's own: every instance then stops replaying from memory at the same moment).
    pub fn remember(&self, request: &KeyedRequest, response: &StoredResponse, expires_at: DateTime<Utc>) {
        self.replays.remember(request, response, expires_at);
    }

    /// When a key claimed at `now` expires.
    pub fn expiry_of_claim(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        crate::clock::after(now, self.retention)
    }

    /// The final answer for `request` if memory has it.
    pub fn replay(&self, request: &KeyedRequest) -> Option<Execution> {
        self.replays.replay(request, chrono::Utc::now()).map(Execution::Replayed)
    }
}
