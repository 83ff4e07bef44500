//! Idempotency: keys, fingerprints, the key store and its sweeper.
//!
//! Generic on purpose: this module knows keys, bindings (method, route, body fingerprint), leases,
//! recovery points and stored responses, not orders or payments. A domain service calls
//! [`store::claim`] inside its own transaction, does its writes, and stores the answer with the
//! claim (when known up front) or with [`store::complete`], all in that one transaction. The
//! contract it implements is ../shared/design/IDEMPOTENCY.md.

pub mod cache;
pub mod fingerprint;
pub mod key;
pub mod store;
pub mod sweeper;

use uuid::Uuid;

pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError};
pub use store::{Claim, ClaimAs, Existing, KeyRecord};

/// A request that carried an `Idempotency-Key`: what the key is scoped to and bound to.
#[derive(Debug, Clone)]
pub struct KeyedRequest {
    pub account_id: Uuid,
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
