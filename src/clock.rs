//! Time arithmetic shared by leases, retention and schedules.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// `now + duration`, saturating instead of overflowing for absurd durations.
pub fn after(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}
