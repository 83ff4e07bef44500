//! Periodic background work (the sweeper, the reconciler) and how it stops.

use std::time::Duration;

use tokio::sync::watch;

/// Turns `true` when the process is shutting down.
pub type Shutdown = watch::Receiver<bool>;

/// Runs `round` every `interval` until `shutdown` turns true. A round that reports more work
/// waiting (a full batch) is followed by another after `pause`, so that a backlog is worked off
/// steadily instead of in one burst that competes with requests. Shutdown is checked between
/// rounds: a round in progress finishes, none starts after.
pub async fn every<Round, Fut>(interval: Duration, pause: Duration, mut shutdown: Shutdown, mut round: Round)
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
            if !round().await {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}
