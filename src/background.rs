//! Periodic background work (the sweeper, the reconciler) and how it stops.

use std::time::Duration;

use tokio::sync::watch;

/// Turns `true` when the process is shutting down.
pub type Shutdown = watch::Receiver<bool>;

/// How long a loop rests after a round that left work waiting, before the next: at least
/// `at_least`, and long enough that its rounds take no more than `busy_percent` of the time (a
/// round that took 90 ms at 10% rests 810 ms). A round takes longer when the database is busy,
/// so the rest grows with it: a backlog is worked off quickly on an idle database and slowly,
/// a tenth of one connection's time, beside requests that need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub at_least: Duration,
    /// 1 to 100; 100 rests `at_least` only.
    pub busy_percent: u32,
}

impl Pace {
    /// The next round at once.
    pub const NONE: Pace = Pace { at_least: Duration::ZERO, busy_percent: 100 };

    pub fn rest_after(&self, round_took: Duration) -> Duration {
        let busy = self.busy_percent.clamp(1, 100);
        (round_took.saturating_mul(100 - busy) / busy).max(self.at_least)
    }
}

/// Runs `round` every `interval` until `shutdown` turns true. A round that reports more work
/// waiting (a full batch) is followed by another after the rest `pace` gives it, so that a
/// backlog is worked off steadily instead of in one burst that competes with requests. Shutdown is checked between
/// rounds: a round in progress finishes, none starts after.
pub async fn every<Round, Fut>(interval: Duration, pace: Pace, mut shutdown: Shutdown, mut round: Round)
where
    // A plain closure returning a future rather than an async closure: a spawned task must be
    // Send, which the compiler cannot yet prove for async closures that borrow.
    Round: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => {}
        }
        loop {
            if *shutdown.borrow() {
                return;
            }
            let started = tokio::time::Instant::now();
            if !round().await {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(pace.rest_after(started.elapsed())) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_rests_so_that_rounds_take_their_share_of_the_time() {
        let pace = Pace { at_least: Duration::from_millis(100), busy_percent: 10 };
        // 90 ms busy, 810 ms resting: 10% of the time.
        assert_eq!(pace.rest_after(Duration::from_millis(90)), Duration::from_millis(810));
        // A quick round rests the floor.
        assert_eq!(pace.rest_after(Duration::from_millis(5)), Duration::from_millis(100));
        let half = Pace { at_least: Duration::ZERO, busy_percent: 50 };
        assert_eq!(half.rest_after(Duration::from_millis(30)), Duration::from_millis(30));
        assert_eq!(Pace::NONE.rest_after(Duration::from_secs(3)), Duration::ZERO);
        // Out of range is held to 1..=100 rather than dividing by zero.
        let zero = Pace { at_least: Duration::ZERO, busy_percent: 0 };
        assert_eq!(zero.rest_after(Duration::from_millis(2)), Duration::from_millis(198));
        assert_eq!(zero.rest_after(Duration::MAX), Duration::MAX);
    }
}
