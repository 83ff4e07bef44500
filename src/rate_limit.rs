//! Per-account request rate limit: a token bucket per account, in process memory, so that one
//! tenant cannot starve the others. Each instance limits on its own (N instances allow up to N
//! times the rate); a shared limit would cost a database or cache round trip per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second per account; 0 turns limiting off.
    pub per_second: u32,
    /// Requests an account may send at once after being idle.
    pub burst: u32,
}

struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

pub struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<Uuid, Bucket>>,
}

impl RateLimiter {
    /// Buckets kept at most; idle accounts are forgotten past this (a full bucket is the same
    /// as no bucket).
    const CAPACITY: usize = 100_000;

    pub fn new(limit: RateLimit) -> Self {
        RateLimiter { limit, buckets: Mutex::default() }
    }

    /// Takes one request from `account`'s bucket. `Err` carries how long until one is free.
    pub fn check(&self, account: Uuid) -> Result<(), Duration> {
        self.check_at(account, Instant::now())
    }

    fn check_at(&self, account: Uuid, now: Instant) -> Result<(), Duration> {
        if self.limit.per_second == 0 {
            return Ok(());
        }
        let (rate, burst) = (f64::from(self.limit.per_second), f64::from(self.limit.burst.max(1)));
        // Every update is a whole-value write: a poisoned map is consistent.
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= Self::CAPACITY && !buckets.contains_key(&account) {
            buckets.clear();
        }
        let bucket = buckets.entry(account).or_insert(Bucket { tokens: burst, refilled_at: now });
        let elapsed = now.saturating_duration_since(bucket.refilled_at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.refilled_at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let limiter = RateLimiter::new(RateLimit { per_second: 10, burst: 3 });
        let (account, start) = (Uuid::now_v7(), Instant::now());
        for _ in 0..3 {
            assert!(limiter.check_at(account, start).is_ok());
        }
        let wait = limiter.check_at(account, start).unwrap_err();
        assert!(wait <= Duration::from_millis(100) && wait > Duration::ZERO, "{wait:?}");
        assert!(limiter.check_at(account, start + Duration::from_millis(100)).is_ok());
        assert!(limiter.check_at(Uuid::now_v7(), start).is_ok(), "another account has its own bucket");
    }

    #[test]
    fn zero_means_off() {
        let limiter = RateLimiter::new(RateLimit { per_second: 0, burst: 0 });
        let account = Uuid::now_v7();
        assert!((0..10_000).all(|_| limiter.check(account).is_ok()));
    }
}
