//! A relay hands the outbox's events on to one destination (merchant webhooks, NATS), at least
//! once, in the order of their transactions (never skipping one that committed late), keeping its
//! own progress in `relay_cursors`.
//!
//! One round, in one transaction: take the relay (a transaction-scoped advisory lock, tried: any
//! number of instances run the relay; one hands a batch on at a time, the others skip the
//! round), read its cursor (after the lock, so as the previous holder left it), read the next
//! batch, hand it on, move the cursor past it, commit. A crash anywhere before the commit leaves
//! the cursor where it was, and the batch is handed on again: destinations see an event at least
//! once and deduplicate on its id. A cursor written in another cluster (a database restored from
//! a logical dump) starts over from the oldest event.

use std::future::Future;
use std::time::Duration;

use chrono::Utc;
use diesel_async::{AsyncConnection, AsyncPgConnection};

use super::Event;
use super::repository;
use crate::background::{Shutdown, every};
use crate::db::Pool;

/// A destination of the outbox's events.
pub trait Relay: Send + Sync + 'static {
    /// Its name in `relay_cursors` and in metrics.
    const NAME: &'static str;

    /// Hands `batch` on (in transaction order). Returning `Ok` moves the cursor past it; `Err`
    /// leaves it, and the batch is handed on again later. `conn` is the round's transaction:
    /// what the relay writes there commits with the cursor's move.
    fn hand_on(
        &self,
        conn: &mut AsyncPgConnection,
        batch: &[Event],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Called once the round that handed `count` events on has committed (what `hand_on` wrote
    /// is visible now), so that a relay may wake whatever works on it.
    fn handed_on(&self, _count: usize) {}
}

/// One round; returns how many events were handed on (0: nothing waiting, or another instance
/// holds the relay).
pub async fn round<R: Relay>(pool: &Pool, relay: &R, batch_size: i64) -> anyhow::Result<usize> {
    let mut conn = pool.get().await?;
    let handed_on = conn
        .transaction::<_, anyhow::Error, _>(async |conn| {
            let Some(taken) = repository::lock_cursor(conn, R::NAME).await? else {
                return Ok(0);
            };
            if taken.started_over {
                tracing::warn!(
                    relay = R::NAME,
                    "the relay's cursor was written in another database cluster (restored from a \
                     logical dump?): starting over from the oldest event; events handed on before \
                     are handed on again, and consumers drop them by their event id"
                );
            }
            let (batch, next) = repository::read_after(conn, &taken.cursor, batch_size).await?;
            let Some(next) = next else { return Ok(0) };
            relay.hand_on(conn, &batch).await?;
            repository::advance_cursor(conn, R::NAME, &next).await?;
            Ok(batch.len())
        })
        .await?;
    if handed_on > 0 {
        relay.handed_on(handed_on);
        let mut conn = pool.get().await?;
        if let Ok(lag) = repository::lag(&mut conn, R::NAME, Utc::now()).await {
            crate::telemetry::metrics::outbox_lag(R::NAME, lag);
        }
    }
    Ok(handed_on)
}

/// Sets the relay's lag gauge from the database, so that it is exported from the start (a round
/// sets it again after each batch, and after each failure); nothing when the database does not
/// answer.
pub async fn export_lag<R: Relay>(pool: &Pool) {
    if let Ok(mut conn) = pool.get().await
        && let Ok(lag) = repository::lag(&mut conn, R::NAME, Utc::now()).await
    {
        crate::telemetry::metrics::outbox_lag(R::NAME, lag);
    }
}

/// Runs rounds every `interval` until `shutdown`; a full batch is followed at once by another.
/// Errors (the destination or the database away) are logged; the next round tries again, and
/// events wait in the outbox meanwhile.
pub async fn run<R: Relay>(pool: Pool, relay: R, interval: Duration, batch_size: i64, shutdown: Shutdown) {
    every(interval, Duration::ZERO, shutdown, || {
        let (pool, relay) = (pool.clone(), &relay);
        async move {
            match round(&pool, relay, batch_size).await {
                Ok(handed_on) => handed_on as i64 == batch_size,
                Err(error) => {
                    tracing::warn!(relay = R::NAME, error = ?error, "relay round failed; retried later");
                    if let Ok(mut conn) = pool.get().await
                        && let Ok(lag) = repository::lag(&mut conn, R::NAME, Utc::now()).await
                    {
                        crate::telemetry::metrics::outbox_lag(R::NAME, lag);
                    }
                    false
                }
            }
        }
    })
    .await
}
