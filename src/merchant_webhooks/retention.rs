//! Finished deliveries and their attempts are kept as long as events, then deleted in bounded
//! batches by the events sweeper. Pending deliveries are never swept: they are work still due.

use chrono::{DateTime, Utc};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Deletes up to `batch_size` deliveries created before `before` that are no longer pending,
/// with their attempts, in one statement. Returns how many deliveries went.
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    before: DateTime<Utc>,
    batch_size: i64,
) -> diesel::QueryResult<usize> {
    PurgeDeliveries { before: &before, batch_size }.execute(conn).await
}

crate::prepared_statement! {
    /// A batch of finished deliveries past their retention deleted (`sql/purge_deliveries.sql`).
    pub(crate) struct PurgeDeliveries<'a>("sql/purge_deliveries.sql") -> () {
        1 => before: &'a DateTime<Utc> as Timestamptz,
        2 => batch_size: i64 as BigInt,
    }
}
