//! The background sweeper: deletes idempotency rows past their retention, in bounded batches so
//! that no statement holds many row locks or runs long beside the inserts.

use std::time::Duration;

use chrono::Utc;

use crate::background::{Shutdown, every};
use crate::db::Pool;

#[derive(Debug, Clone, Copy)]
pub struct SweeperConfig {
    pub interval: Duration,
    pub batch_size: i64,
}

/// The pause between two full batches: with 1000-row batches the sweeper deletes up to about
/// 10,000 rows a second per instance, far above the rate keys expire at, without a backlog (a
/// restart after downtime, a lowered retention) turning into a burst that slows requests.
const BATCH_PAUSE: Duration = Duration::from_millis(100);

/// Deletes one batch of expired rows; returns how many.
pub async fn sweep_batch(pool: &Pool, batch_size: i64) -> anyhow::Result<usize> {
    let mut conn = pool.get().await?;
    Ok(super::store::delete_expired(&mut conn, batch_size, Utc::now()).await?)
}

/// Sweeps every `interval`, batch after batch while batches come back full, until `shutdown`.
/// Errors (the database away) are logged and the next round tries again.
pub async fn run(pool: Pool, config: SweeperConfig, shutdown: Shutdown) {
    every(config.interval, BATCH_PAUSE, shutdown, || {
        let pool = pool.clone();
        async move {
            match sweep_batch(&pool, config.batch_size).await {
                Ok(deleted) => {
                    if deleted > 0 {
                        tracing::info!(deleted, "swept expired idempotency keys");
                        crate::telemetry::metrics::keys_swept(deleted);
                    }
                    deleted as i64 == config.batch_size
                }
                Err(error) => {
                    tracing::warn!(error = ?error, "idempotency sweep failed");
                    false
                }
            }
        }
    })
    .await
}
