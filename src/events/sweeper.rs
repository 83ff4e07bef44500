//! Events are kept `ORDERPAY_EVENT_RETENTION_DAYS`, then deleted in bounded batches, oldest
//! first, like idempotency keys; and with them what they left behind: finished merchant
//! webhook deliveries with their attempts (`merchant_webhooks::retention`) and received provider
//! webhooks (`operations::webhooks::sweep`). Each module owns its statement; this schedules them.

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
                let events = repository::sweep(&mut conn, before, batch_size).await?;
                let deliveries =
                    crate::merchant_webhooks::retention::sweep(&mut conn, before, batch_size).await?;
                let provider_webhooks =
                    crate::operations::webhooks::sweep(&mut conn, before, batch_size).await?;
                anyhow::Ok([events, deliveries, provider_webhooks])
            };
            match deleted.await {
                Ok(deleted @ [events, deliveries, provider_webhooks]) => {
                    if deleted.iter().any(|&count| count > 0) {
                        tracing::info!(events, deliveries, provider_webhooks, "swept past their retention");
                    }
                    // Another round at once while any of them has more.
                    deleted.iter().any(|&count| count as i64 == batch_size)
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
