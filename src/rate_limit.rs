//! Per-account request rate limit, so that one tenant cannot starve the others: governor's GCRA
//! (a token bucket in one atomic word) per account, in a sharded map, in process memory. Each
//! instance limits on its own (N instances allow up to N times the rate); a shared limit would
//! cost a database or cache round trip per request.
//!
//! Memory stays bounded: only authenticated accounts get a bucket, and [`RateLimiter::prune`]
//! (run periodically by `serve`) forgets every account whose bucket has refilled, which is the
//! same as having none.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::ids::AccountId;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second per account; 0 turns limiting off.
    pub per_second: u32,
    /// Requests an account may send at once after being idle.
    pub burst: u32,
}

pub struct RateLimiter {
    /// `None` when limiting is off.
    buckets: Option<DefaultKeyedRateLimiter<AccountId>>,
    clock: DefaultClock,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        let buckets = NonZeroU32::new(limit.per_second).map(|per_second| {
            let burst = NonZeroU32::new(limit.burst).unwrap_or(NonZeroU32::MIN);
            DefaultKeyedRateLimiter::dashmap(Quota::per_second(per_second).allow_burst(burst))
        });
        RateLimiter { buckets, clock: DefaultClock::default() }
    }

    /// Takes one request from `account`'s bucket. `Err` carries how long until one is free.
    pub fn check(&self, account: AccountId) -> Result<(), Duration> {
        let Some(buckets) = &self.buckets else { return Ok(()) };
        buckets.check_key(&account).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets accounts whose bucket is full again.
    pub fn prune(&self) {
        if let Some(buckets) = &self.buckets {
            buckets.retain_recent();
            buckets.shrink_to_fit();
        }
    }

    /// Accounts with a bucket in memory.
    pub fn tracked_accounts(&self) -> usize {
        self.buckets.as_ref().map_or(0, |buckets| buckets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_a_wait() {
        let limiter = RateLimiter::new(RateLimit { per_second: 10, burst: 3 });
        let account = AccountId::generate();
        for _ in 0..3 {
            assert!(limiter.check(account).is_ok());
        }
        let wait = limiter.check(account).unwrap_err();
        assert!(wait <= Duration::from_millis(100) && wait > Duration::ZERO, "{wait:?}");
        assert!(limiter.check(AccountId::generate()).is_ok(), "another account has its own bucket");
    }

    #[test]
    fn refilled_buckets_are_forgotten() {
        let limiter = RateLimiter::new(RateLimit { per_second: 1000, burst: 1 });
        for _ in 0..100 {
            assert!(limiter.check(AccountId::generate()).is_ok());
        }
        assert_eq!(limiter.tracked_accounts(), 100);
        std::thread::sleep(Duration::from_millis(5));
        limiter.prune();
        assert_eq!(limiter.tracked_accounts(), 0);
    }

    #[test]
    fn zero_means_off() {
        let limiter = RateLimiter::new(RateLimit { per_second: 0, burst: 0 });
        let account = AccountId::generate();
        assert!((0..10_000).all(|_| limiter.check(account).is_ok()));
    }
}
