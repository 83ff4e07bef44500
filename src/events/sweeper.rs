//! Events are kept `ORDERPAY_EVENT_RETENTION_DAYS`, then deleted in bounded batches, oldest
//! first, like idempotency keys.

use std::time::Duration;

use chrono::Utc;

use super::repository;
use crate::background::{Shutdown, every};
use crate::db::Pool;

/// The pause between two full batches, so that a backlog is worked off without a burst.
const BATCH_PAUSE: Duration = Duration::from_millis(100);

/// Sweeps every `interval`, batch after batch while batches come back full, until `shutdown`.
pub async fn run(pool: Pool, retention: Duration, interval: Duration, batch_size: i64, shutdown: Shutdown) {
    every(interval, BATCH_PAUSE, shutdown, || {
        let pool = pool.clone();
        async move {
            let before = crate::clock::before(Utc::now(), retention);
            let deleted = async {
                let mut conn = pool.get().await?;
                anyhow::Ok(repository::sweep(&mut conn, before, batch_size).await?)
            };
            match deleted.await {
                Ok(deleted) => {
                    if deleted > 0 {
                        tracing::info!(deleted, "swept events past their retention");
                    }
                    deleted as i64 == batch_size
                }
                Err(error) => {
                    tracing::warn!(error = ?error, "event sweep failed");
                    false
                }
            }
        }
    })
    .await
}
