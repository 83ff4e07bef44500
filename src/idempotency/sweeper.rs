//! The background sweeper: deletes idempotency rows past their retention, in bounded batches so
//! that no statement holds many row locks or runs long beside the inserts.

use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;

use crate::db::Pool;

#[derive(Debug, Clone, Copy)]
pub struct SweeperConfig {
    pub interval: Duration,
    pub batch_size: i64,
}

/// One sweep: deletes expired rows batch by batch until a batch comes back short. Returns how
/// many rows were deleted in all.
pub async fn sweep_once(pool: &Pool, batch_size: i64) -> anyhow::Result<u64> {
    let mut conn = pool.get().await?;
    let mut deleted = 0_u64;
    loop {
        let batch = super::store::delete_expired(&mut conn, batch_size, Utc::now()).await?;
        deleted += batch as u64;
        if (batch as i64) < batch_size {
            return Ok(deleted);
        }
        // Let other work on this runtime go between batches.
        tokio::task::yield_now().await;
    }
}

/// Runs [`sweep_once`] every `interval` until `shutdown` turns true. Errors (the database away)
/// are logged and the next round tries again.
pub async fn run(pool: Pool, config: SweeperConfig, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        match sweep_once(&pool, config.batch_size).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "swept expired idempotency keys"),
            Err(error) => tracing::warn!(error = ?error, "idempotency sweep failed"),
        }
    }
}
