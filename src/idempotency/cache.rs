//! Completed answers kept in process memory, so that a replay costs no database round trip.
//!
//! A completed key's answer never changes until the key expires, so a copy is always right
//! until `expires_at`; each instance fills its own copy from what it stores or reads, and an
//! instance that has no copy reads the database. In-progress keys are never cached (their state
//! moves). Bounded: at `capacity` entries the cache starts over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::store::{Existing, KeyRecord};
use super::{Fingerprint, KeyedRequest, StoredResponse};

#[derive(Debug, Clone)]
struct Completed {
    method: String,
    route: String,
    fingerprint: Fingerprint,
    response: Arc<StoredResponse>,
    expires_at: DateTime<Utc>,
}

pub struct ReplayCache {
    capacity: usize,
    entries: Mutex<HashMap<(Uuid, String), Completed>>,
}

impl ReplayCache {
    pub fn new(capacity: usize) -> Self {
        ReplayCache { capacity, entries: Mutex::default() }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(Uuid, String), Completed>> {
        // Every update is one insert, one remove or one clear: a poisoned map is consistent.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers the answer stored for `request`'s key.
    pub fn remember(&self, request: &KeyedRequest, response: &StoredResponse, expires_at: DateTime<Utc>) {
        if self.capacity == 0 {
            return;
        }
        let entry = Completed {
            method: request.method.clone(),
            route: request.route.clone(),
            fingerprint: request.fingerprint,
            response: Arc::new(response.clone()),
            expires_at,
        };
        let mut entries = self.entries();
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.insert((request.account_id, request.key.as_str().to_owned()), entry);
    }

    /// Remembers a completed row read from the database.
    pub fn remember_record(&self, request: &KeyedRequest, record: &KeyRecord) {
        if let Ok(Existing::Replay(response)) = record.resolve(request, Utc::now()) {
            self.remember(request, &response, record.expires_at);
        }
    }

    /// The stored answer for `request`, if the cache has a live copy for the same method, route
    /// and body. Anything else (no copy, an expired one, a reuse to refuse) is for the store.
    pub fn replay(&self, request: &KeyedRequest, now: DateTime<Utc>) -> Option<StoredResponse> {
        let cache_key = (request.account_id, request.key.as_str().to_owned());
        let mut entries = self.entries();
        let entry = entries.get(&cache_key)?;
        if entry.expires_at <= now {
            entries.remove(&cache_key);
            return None;
        }
        let same_request = entry.method == request.method
            && entry.route == request.route
            && entry.fingerprint == request.fingerprint;
        same_request.then(|| entry.response.as_ref().clone())
    }
}
