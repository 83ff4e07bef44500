//! Finished deliveries and their attempts are kept as long as events, then deleted in bounded
//! batches by the events sweeper. Pending deliveries are never swept: they are work still due.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Deletes up to `batch_size` deliveries created before `before` that are no longer pending,
/// with their attempts, in one statement. Returns how many deliveries went.
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    before: DateTime<Utc>,
    batch_size: i64,
) -> diesel::QueryResult<usize> {
    diesel::sql_query(
        "WITH doomed AS ( \
             SELECT account_id, id FROM webhook_deliveries \
             WHERE created_at < $1 AND status <> 'pending' \
             LIMIT $2 FOR UPDATE SKIP LOCKED \
         ), attempts AS ( \
             DELETE FROM webhook_delivery_attempts a USING doomed d \
             WHERE a.account_id = d.account_id AND a.delivery_id = d.id \
         ) \
         DELETE FROM webhook_deliveries w USING doomed d \
         WHERE w.account_id = d.account_id AND w.id = d.id",
    )
    .bind::<Timestamptz, _>(before)
    .bind::<BigInt, _>(batch_size)
    .execute(conn)
    .await
}
