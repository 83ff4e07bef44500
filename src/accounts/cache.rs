//! Accounts recently authenticated, by API key hash, so that a busy client does not cost a
//! database round trip per request.
//!
//! Entries live `ttl`. Unknown keys are never cached, so guessing keys cannot fill the cache;
//! when full, quick_cache's S3-FIFO eviction drops the coldest entries, so a burst of new
//! accounts cannot empty it for the busy ones.
//!
//! A revoked key must be refused everywhere within a second, whatever the TTL. Each entry
//! carries the revocation generation it was read under (in the same statement as the key:
//! see `keys::lookup`), and the cache knows the current generation from the poller
//! (`revocations`). An entry is served only if
//! - no revocation happened since it was read (its generation is not older than the current
//!   one), and
//! - the current generation was confirmed by a poll that *started* less than `fresh_for` ago.
//!
//! So an instance that cannot reach the database (its polls fail) stops trusting its cache
//! instead of serving revoked keys from it: every request then asks the database, and gets 503
//! like every other request while it is away.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Account;
use super::keys::LAST_USED_RESOLUTION;

/// When this instance last noted a key's use, shared by the copies of its cache entry, so that
/// concurrent requests with one key start one `last_used_at` write a minute, not one each.
#[derive(Debug, Clone)]
pub struct Usage(Arc<AtomicI64>);

impl Usage {
    /// A key last noted as used at `last_used_at` (as the database says).
    pub fn since(last_used_at: Option<DateTime<Utc>>) -> Self {
        Usage(Arc::new(AtomicI64::new(last_used_at.map_or(i64::MIN, |at| at.timestamp()))))
    }

    /// True once a minute at most: this caller should write the use down (the write itself is
    /// guarded too, for the other instances).
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        let now = now.timestamp();
        let noted = self.0.load(Ordering::Relaxed);
        now.saturating_sub(noted) >= LAST_USED_RESOLUTION.num_seconds()
            && self.0.compare_exchange(noted, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// What a cache hit yields.
#[derive(Debug, Clone)]
pub struct Cached {
    pub account: Account,
    pub key_id: Uuid,
    pub usage: Usage,
}

#[derive(Clone)]
struct Entry {
    cached: Cached,
    generation: i64,
    cached_at: Instant,
}

pub struct AccountCache {
    ttl: Duration,
    fresh_for: Duration,
    entries: quick_cache::sync::Cache<[u8; 32], Entry>,
    /// The last generation a poll saw; -1 before the first poll (nothing is served then).
    generation: AtomicI64,
    /// Nanoseconds after `epoch` at which the poll that confirmed `generation` started; 0: never.
    confirmed_at: AtomicU64,
    epoch: Instant,
}

impl AccountCache {
    const CAPACITY: usize = 10_000;

    /// A cache keeping entries `ttl` (zero disables it), trusted while the revocation generation
    /// was confirmed less than `fresh_for` ago.
    pub fn new(ttl: Duration, fresh_for: Duration) -> Self {
        AccountCache {
            ttl,
            fresh_for,
            entries: quick_cache::sync::Cache::new(Self::CAPACITY),
            generation: AtomicI64::new(-1),
            confirmed_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Whether the cache is on at all (a zero TTL turns it off, and the poller with it).
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    pub fn get(&self, key_hash: &[u8; 32]) -> Option<Cached> {
        if !self.enabled() || !self.is_fresh() {
            return None;
        }
        let entry = self.entries.get(key_hash)?;
        let current = self.generation.load(Ordering::Acquire);
        (entry.cached_at.elapsed() < self.ttl && entry.generation >= current).then_some(entry.cached)
    }

    /// Caches a key read from the database under revocation `generation`; an entry read before
    /// a revocation this cache already knows of is not kept.
    pub fn put(&self, key_hash: [u8; 32], cached: Cached, generation: i64) {
        if self.enabled() && generation >= self.generation.load(Ordering::Acquire) {
            self.entries.insert(key_hash, Entry { cached, generation, cached_at: Instant::now() });
        }
    }

    /// What a poll that started at `started` saw. A new generation empties the cache (every key
    /// is read again, once); the same generation extends the trust.
    pub fn confirm(&self, generation: i64, started: Instant) {
        let previous = self.generation.swap(generation, Ordering::AcqRel);
        if previous != generation {
            // Entries are invalid already by their generation; clearing frees the memory.
            self.entries.clear();
            if previous >= 0 {
                tracing::info!(generation, "an API key was revoked; authentication cache cleared");
            }
        }
        let at = started.saturating_duration_since(self.epoch).as_nanos().max(1) as u64;
        self.confirmed_at.fetch_max(at, Ordering::AcqRel);
    }

    fn is_fresh(&self) -> bool {
        let confirmed = self.confirmed_at.load(Ordering::Acquire);
        confirmed != 0
            && (self.epoch.elapsed().as_nanos() as u64).saturating_sub(confirmed)
                < self.fresh_for.as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::AccountId;

    fn cached() -> Cached {
        Cached {
            account: Account { id: AccountId::generate(), name: "a".into(), created_at: Utc::now() },
            key_id: Uuid::now_v7(),
            usage: Usage::since(None),
        }
    }

    #[test]
    fn the_cache_forgets_after_its_ttl_and_can_be_off() {
        let cache = AccountCache::new(Duration::from_millis(50), Duration::from_secs(60));
        cache.confirm(0, Instant::now());
        let entry = cached();
        cache.put([1; 32], entry.clone(), 0);
        assert_eq!(cache.get(&[1; 32]).map(|hit| hit.key_id), Some(entry.key_id));
        assert!(cache.get(&[2; 32]).is_none());
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get(&[1; 32]).is_none());
        let off = AccountCache::new(Duration::ZERO, Duration::from_secs(60));
        off.confirm(0, Instant::now());
        off.put([1; 32], entry, 0);
        assert!(off.get(&[1; 32]).is_none());
    }

    #[test]
    fn nothing_is_served_before_a_poll_nor_after_a_revocation_nor_once_polls_stop() {
        let cache = AccountCache::new(Duration::from_secs(60), Duration::from_millis(50));
        cache.put([1; 32], cached(), 0);
        assert!(cache.get(&[1; 32]).is_none(), "no poll yet: the generation is unknown");
        cache.confirm(0, Instant::now());
        cache.put([1; 32], cached(), 0);
        assert!(cache.get(&[1; 32]).is_some());
        cache.confirm(1, Instant::now());
        assert!(cache.get(&[1; 32]).is_none(), "a revocation invalidates every entry");
        cache.put([1; 32], cached(), 0);
        assert!(cache.get(&[1; 32]).is_none(), "a read from before the revocation is not kept");
        cache.put([1; 32], cached(), 1);
        assert!(cache.get(&[1; 32]).is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get(&[1; 32]).is_none(), "polls stopped: the cache is not trusted");
    }

    #[test]
    fn a_use_is_due_once_a_minute() {
        let now = Utc::now();
        let usage = Usage::since(None);
        assert!(usage.due(now));
        assert!(!usage.clone().due(now + chrono::Duration::seconds(59)));
        assert!(usage.due(now + chrono::Duration::seconds(60)));
        assert!(!Usage::since(Some(now)).due(now + chrono::Duration::seconds(30)));
    }
}
