//! Time arithmetic shared by leases, retention and schedules.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// `now + duration`, saturating at the end of time instead of panicking on absurd durations.
pub fn after(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|duration| now.checked_add_signed(duration))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `now - duration`, saturating at the beginning of time.
pub fn before(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|duration| now.checked_sub_signed(duration))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_durations_saturate() {
        let now = Utc::now();
        assert_eq!(after(now, Duration::from_secs(u64::MAX)), DateTime::<Utc>::MAX_UTC);
        assert_eq!(after(now, Duration::from_secs(10_000_000_000_000)), DateTime::<Utc>::MAX_UTC);
        assert_eq!(after(now, Duration::from_secs(1)), now + chrono::Duration::seconds(1));
    }
}
