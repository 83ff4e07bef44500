//! Final answers kept in process memory, so that a replay costs no database round trip.
//!
//! A final answer never changes until its key expires, so a copy is always right until
//! `expires_at`; each instance fills its own copy from what it stores or reads, and an instance
//! that has no copy reads the database. Answers still in the making (a payment in flight) are
//! never cached.
//!
//! Bounded by bytes, not entries (an order with thousands of items makes a large answer), with
//! quick_cache's S3-FIFO eviction: a burst of new keys from one tenant passes through the small
//! probation queue and evicts its own cold entries, not the answers other tenants replay.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

use super::{Fingerprint, KeyedRequest, StoredResponse};
use crate::ids::AccountId;

/// Answers larger than this are not cached: a few of them would crowd out thousands of others.
const LARGEST_CACHED_ANSWER: usize = 64 * 1024;

/// Rough bookkeeping per entry (the map slot, the `Arc`, the strings' headers), so that many
/// tiny answers still count.
const ENTRY_OVERHEAD: u64 = 160;

#[derive(Debug)]
struct Completed {
    method: String,
    route: String,
    fingerprint: Fingerprint,
    response: StoredResponse,
    expires_at: DateTime<Utc>,
}

type CacheKey = (AccountId, String);

#[derive(Clone)]
struct ByBytes;

impl Weighter<CacheKey, Arc<Completed>> for ByBytes {
    fn weight(&self, key: &CacheKey, entry: &Arc<Completed>) -> u64 {
        let headers: usize =
            entry.response.headers.iter().map(|(name, value)| name.len() + value.len()).sum();
        (key.1.len() + entry.method.len() + entry.route.len() + entry.response.body.len() + headers) as u64
            + ENTRY_OVERHEAD
    }
}

pub struct ReplayCache {
    /// `None` when the cache is off.
    entries: Option<Cache<CacheKey, Arc<Completed>, ByBytes>>,
}

impl ReplayCache {
    /// A cache holding up to `capacity_bytes` of answers; zero turns it off.
    pub fn new(capacity_bytes: u64) -> Self {
        let entries = (capacity_bytes > 0).then(|| {
            // quick_cache sizes its shards from an estimate of the entry count: about 1 KB each.
            let estimated_items = (capacity_bytes / 1024).max(16) as usize;
            Cache::with_weighter(estimated_items, capacity_bytes, ByBytes)
        });
        ReplayCache { entries }
    }

    /// Remembers the final answer stored for `request`'s key.
    pub fn remember(&self, request: &KeyedRequest, response: &StoredResponse, expires_at: DateTime<Utc>) {
        let Some(entries) = &self.entries else { return };
        if response.body.len() > LARGEST_CACHED_ANSWER {
            return;
        }
        let entry = Completed {
            method: request.method.clone(),
            route: request.route.clone(),
            fingerprint: request.fingerprint,
            response: response.clone(),
            expires_at,
        };
        entries.insert((request.account_id, request.key.as_str().to_owned()), Arc::new(entry));
    }

    /// The stored answer for `request`, if the cache has a live copy for the same method, route
    /// and body. Anything else (no copy, an expired one, a reuse to refuse) is for the store.
    pub fn replay(&self, request: &KeyedRequest, now: DateTime<Utc>) -> Option<StoredResponse> {
        let entries = self.entries.as_ref()?;
        let cache_key = (request.account_id, request.key.as_str().to_owned());
        let entry = entries.get(&cache_key)?;
        if entry.expires_at <= now {
            entries.remove(&cache_key);
            return None;
        }
        let same_request = entry.method == request.method
            && entry.route == request.route
            && entry.fingerprint == request.fingerprint;
        same_request.then(|| entry.response.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;

    fn request(account: AccountId, key: &str) -> KeyedRequest {
        KeyedRequest {
            account_id: account,
            key: IdempotencyKey::parse(key.as_bytes()).unwrap(),
            method: "POST".into(),
            route: "/orders".into(),
            fingerprint: Fingerprint::of_request("POST", "/orders", None),
        }
    }

    #[test]
    fn answers_replay_until_they_expire_and_only_for_the_same_request() {
        let cache = ReplayCache::new(1 << 20);
        let account = AccountId::generate();
        let answer = StoredResponse::json(201, b"{}".to_vec());
        let now = Utc::now();
        cache.remember(&request(account, "k"), &answer, now + chrono::Duration::seconds(60));
        assert_eq!(cache.replay(&request(account, "k"), now), Some(answer.clone()));
        assert_eq!(cache.replay(&request(AccountId::generate(), "k"), now), None, "scoped by account");
        let mut other_body = request(account, "k");
        other_body.fingerprint =
            Fingerprint::of_request("POST", "/orders", Some(&serde_json::json!({"a": 1})));
        assert_eq!(cache.replay(&other_body, now), None, "a reuse is for the store to refuse");
        assert_eq!(cache.replay(&request(account, "k"), now + chrono::Duration::seconds(61)), None);
    }

    #[test]
    fn the_cache_is_bounded_by_bytes() {
        let cache = ReplayCache::new(256 * 1024);
        let account = AccountId::generate();
        let big = StoredResponse::json(201, vec![b'x'; 32 * 1024]);
        let later = Utc::now() + chrono::Duration::seconds(60);
        for index in 0..100 {
            cache.remember(&request(account, &format!("k{index}")), &big, later);
        }
        let kept = (0..100)
            .filter(|index| cache.replay(&request(account, &format!("k{index}")), Utc::now()).is_some())
            .count();
        assert!(kept <= 8, "256 KiB holds at most 8 answers of 32 KiB, kept {kept}");
        let huge = StoredResponse::json(201, vec![b'x'; LARGEST_CACHED_ANSWER + 1]);
        cache.remember(&request(account, "huge"), &huge, later);
        assert_eq!(cache.replay(&request(account, "huge"), Utc::now()), None);
        assert!(ReplayCache::new(0).replay(&request(account, "k0"), Utc::now()).is_none());
    }
}
