//! The background sweeper: moves idempotency keys past their retention to the audit (their
//! metadata, not their answers), and deletes audit rows past the audit retention, in bounded
//! batches so that no statement holds many row locks or runs long beside the inserts.

use std::time::Duration;

use chrono::Utc;

use crate::background::{Shutdown, every};
use crate::db::Pool;

#[derive(Debug, Clone, Copy)]
pub struct SweeperConfig {
    pub interval: Duration,
    pub batch_size: i64,
    /// How long an expired key's metadata stays in the audit after it expired
    /// (`ORDERPAY_IDEMPOTENCY_AUDIT_DAYS`).
    pub audit_retention: Duration,
}

/// The pause between two full batches: with 1000-row batches the sweeper deletes up to about
/// 10,000 rows a second per instance, far above the rate keys expire at, without a backlog (a
/// restart after downtime, a lowered retention) turning into a burst that slows requests.
const BATCH_PAUSE: Duration = Duration::from_millis(100);

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Expired keys moved to the audit.
    pub moved: usize,
    /// Audit rows deleted past the audit retention.
    pub purged: usize,
}

/// Moves one batch of expired keys to the audit; returns how many.
pub async fn sweep_batch(pool: &Pool, batch_size: i64) -> anyhow::Result<usize> {
    let mut conn = pool.get().await?;
    Ok(super::store::delete_expired(&mut conn, batch_size, Utc::now()).await?)
}

/// One round: a batch of expired keys to the audit, and a batch of audit rows past their
/// retention deleted.
pub async fn sweep_round(pool: &Pool, config: &SweeperConfig) -> anyhow::Result<Swept> {
    let mut conn = pool.get().await?;
    let now = Utc::now();
    let moved = super::store::delete_expired(&mut conn, config.batch_size, now).await?;
    // Saturating like clock::after: an absurd retention keeps everything.
    let before = chrono::Duration::from_std(config.audit_retention)
        .ok()
        .and_then(|retention| now.checked_sub_signed(retention))
        .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
    let purged = super::store::purge_audit(&mut conn, config.batch_size, before).await?;
    Ok(Swept { moved, purged })
}

/// Sweeps every `interval`, round after round while a batch comes back full, until `shutdown`.
/// Errors (the database away) are logged and the next round tries again.
pub async fn run(pool: Pool, config: SweeperConfig, shutdown: Shutdown) {
    every(config.interval, BATCH_PAUSE, shutdown, || {
        let pool = pool.clone();
        async move {
            match sweep_round(&pool, &config).await {
                Ok(Swept { moved, purged }) => {
                    if moved > 0 {
                        tracing::info!(moved, "moved expired idempotency keys to the audit");
                        crate::telemetry::metrics::keys_swept(moved);
                    }
                    if purged > 0 {
                        tracing::info!(purged, "deleted idempotency audit rows past their retention");
                        crate::telemetry::metrics::audit_purged(purged);
                    }
                    moved as i64 == config.batch_size || purged as i64 == config.batch_size
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
