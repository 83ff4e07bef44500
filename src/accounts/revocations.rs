//! Spreads key revocations to every instance's authentication cache within a second.
//!
//! How: the transaction that revokes a key bumps a one-row counter, the revocation generation
//! (`api_key_revocations`); every instance reads it every `interval` (250 ms by default: one
//! primary-key read of one row, four a second) and, when it moved, forgets every cached key. The
//! cache also stops trusting itself when no poll has succeeded for three intervals (see
//! `cache`), so the bound holds while the database is unreachable too.
//!
//! Why not PostgreSQL's LISTEN/NOTIFY: our connections are opened by `db::connect`, which drives
//! tokio-postgres's connection future itself and hands diesel-async only the client
//! (`AsyncPgConnection::try_from`), so notifications are dropped on the floor; diesel-async's
//! own notification stream exists only for connections it drives itself over a plain socket.
//! A listener would need a connection of its own outside the pools, and a notification sent
//! while that connection is down (a failover, a restart) is lost for good, so the cache would
//! have to be distrusted after every reconnect anyway. The counter has no such gap: whatever
//! happened while we were away, the next successful poll sees it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::AccountCache;
use crate::background::{Shutdown, every};
use crate::db::Pool;

/// How many poll intervals a confirmation stays good for: one poll may fail or be slow without
/// the cache being dropped, and a revoked key is still refused within about three intervals
/// when polls stop altogether.
pub const FRESH_INTERVALS: u32 = 3;

/// Polls the revocation generation every `interval` until `shutdown`, telling `cache`.
pub async fn run(pool: Pool, cache: Arc<AccountCache>, interval: Duration, shutdown: Shutdown) {
    // Failing polls are logged when they start failing and when they recover, not four times a
    // second.
    let failing = Arc::new(AtomicBool::new(false));
    every(interval, Duration::ZERO, shutdown, move || {
        let (pool, cache, failing) = (pool.clone(), cache.clone(), failing.clone());
        async move {
            let started = Instant::now();
            let poll = async {
                let mut conn = pool.get().await?;
                anyhow::Ok(super::keys::generation(&mut conn).await?)
            };
            match tokio::time::timeout(interval.max(Duration::from_secs(1)), poll).await {
                Ok(Ok(generation)) => {
                    cache.confirm(generation, started);
                    if failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            "API key revocations are read again; the authentication cache is back"
                        );
                    }
                }
                Ok(Err(error)) => note_failure(&failing, &error.to_string()),
                Err(_elapsed) => note_failure(&failing, "the poll timed out"),
            }
            false
        }
    })
    .await
}

fn note_failure(failing: &AtomicBool, error: &str) {
    if !failing.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            error,
            "cannot read API key revocations; authenticating every request against the database"
        );
    }
}
