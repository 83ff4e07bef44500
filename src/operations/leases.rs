//! What every provider operation's row has in common, written once for all of them: who drives
//! it (the lease), when it last sent a request, when it is checked next, and its final answer.
//!
//! An operation is *in flight* while its status is `processing` and it has no answer yet (a
//! payment whose capture is in flight is `processing` too, but its own charge has its answer).
//! The writers here, one each, for every operation table:
//! - [`lease`]: a driver takes in-flight operations whose lease is free (a retry taking one over,
//!   or the reconciler claiming due ones), by compare-and-set;
//! - [`mark_sending`]: a driver about to re-send notes when, under its lease, at the database's
//!   clock;
//! - [`release`]: the outcome stays unknown; the driver lets go and schedules the next check.
//!
//! The statements name their table from [`Table`], a closed list, never from input.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bytea, Int2, Int4, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::ids::{AccountId, LeaseId};

/// The tables that hold provider operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// A payment's charge or authorization.
    Payments,
    /// Captures and voids of an authorization.
    PaymentOperations,
    Refunds,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Payments, Table::PaymentOperations, Table::Refunds];

    const fn name(self) -> &'static str {
        match self {
            Table::Payments => "payments",
            Table::PaymentOperations => "payment_operations",
            Table::Refunds => "refunds",
        }
    }

    /// The label of its operations in metrics and logs.
    pub const fn label(self) -> &'static str {
        match self {
            Table::Payments => "payment",
            Table::PaymentOperations => "capture_or_void",
            Table::Refunds => "refund",
        }
    }
}

/// A driver's hold on an operation in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub until: DateTime<Utc>,
}

/// Which operations a driver leases.
#[derive(Debug, Clone, Copy)]
pub enum LeaseTarget {
    /// This one, if nobody holds it (a retry taking an abandoned operation over).
    One(AccountId, Uuid),
    /// Up to `limit` due ones, skipping rows other reconcilers are claiming; each counts an
    /// attempt (the reconciler's claim).
    Due { limit: i64 },
}

/// An operation a driver now holds.
#[derive(Debug, Clone, Copy, QueryableByName)]
pub struct Leased {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: AccountId,
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    /// Checks made, this one included when the reconciler claimed it.
    #[diesel(sql_type = Int4)]
    pub attempts: i32,
    /// The database's clock when the lease was taken (before any lookup under it).
    #[diesel(sql_type = Timestamptz)]
    pub leased_at: DateTime<Utc>,
}

const IN_FLIGHT: &str = "status = 'processing' AND answer_status IS NULL";

/// Leases in-flight operations of `table` whose lease is free (never held, released, or run
/// out) to `lease` by compare-and-set: of two drivers racing for one operation exactly one gets
/// it (a taker waits for a concurrent one's uncommitted lease, then sees it held). The reconciler
/// does not check a leased operation before its lease runs out.
pub async fn lease(
    conn: &mut AsyncPgConnection,
    table: Table,
    target: LeaseTarget,
    lease: Lease,
    now: DateTime<Utc>,
) -> diesel::QueryResult<Vec<Leased>> {
    let (account_id, id, limit, attempt) = match target {
        LeaseTarget::One(account_id, id) => (Some(account_id), Some(id), 1, 0),
        LeaseTarget::Due { limit } => (None, None, limit, 1),
    };
    diesel::sql_query(format!(
        "UPDATE {table} SET lease_until = $1, lease_id = $2, next_check_at = $1, \
             attempts = attempts + $3 \
         WHERE (account_id, id) IN ( \
             SELECT account_id, id FROM {table} \
             WHERE {IN_FLIGHT} AND (lease_until IS NULL OR lease_until <= $4) \
               AND CASE WHEN $5::uuid IS NULL THEN next_check_at <= $4 \
                        ELSE account_id = $5 AND id = $6 END \
             ORDER BY next_check_at LIMIT $7 FOR UPDATE SKIP LOCKED) \
         RETURNING account_id, id, attempts, clock_timestamp() AS leased_at",
        table = table.name()
    ))
    .bind::<Timestamptz, _>(lease.until)
    .bind::<SqlUuid, _>(lease.id)
    .bind::<Int4, _>(attempt)
    .bind::<Timestamptz, _>(now)
    .bind::<Nullable<SqlUuid>, _>(account_id)
    .bind::<Nullable<SqlUuid>, _>(id)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// Notes, under `lease`, that the operation's request is about to be sent again, at the
/// database's clock. Returns false (send nothing) when it is settled or its lease was taken over.
pub async fn mark_sending(
    conn: &mut AsyncPgConnection,
    table: Table,
    (account_id, id): (AccountId, Uuid),
    lease: LeaseId,
) -> diesel::QueryResult<bool> {
    let updated = diesel::sql_query(format!(
        "UPDATE {table} SET last_send_at = clock_timestamp() \
         WHERE account_id = $1 AND id = $2 AND {IN_FLIGHT} AND lease_id = $3",
        table = table.name()
    ))
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(id)
    .bind::<SqlUuid, _>(lease)
    .execute(conn)
    .await?;
    Ok(updated == 1)
}

/// Leaves an in-flight operation for a check at `next_check_at`, noting why, and lets go of
/// `lease` if the caller still holds it (so that a retry may take it over at once). Returns
/// whether it did: false when someone settled it or took it over meanwhile.
pub async fn release(
    conn: &mut AsyncPgConnection,
    table: Table,
    (account_id, id): (AccountId, Uuid),
    lease: LeaseId,
    next_check_at: DateTime<Utc>,
    last_error: &str,
    now: DateTime<Utc>,
) -> diesel::QueryResult<bool> {
    let updated = diesel::sql_query(format!(
        "UPDATE {table} SET next_check_at = $4, last_error = $5, lease_until = NULL, \
             lease_id = NULL, updated_at = $6 \
         WHERE account_id = $1 AND id = $2 AND {IN_FLIGHT} AND lease_id = $3",
        table = table.name()
    ))
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(id)
    .bind::<SqlUuid, _>(lease)
    .bind::<Timestamptz, _>(next_check_at)
    .bind::<Text, _>(last_error)
    .bind::<Timestamptz, _>(now)
    .execute(conn)
    .await?;
    Ok(updated == 1)
}

/// Where an operation stands, as a retry of the key that started it needs to know.
#[derive(Debug, Clone, QueryableByName)]
pub struct Standing {
    #[diesel(sql_type = Nullable<Int2>)]
    answer_status: Option<i16>,
    #[diesel(sql_type = Nullable<Bytea>)]
    answer_body: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    lease_until: Option<DateTime<Utc>>,
}

impl Standing {
    /// Its final answer, once it has one: `(status, body)`.
    pub fn answer(&self) -> Option<(u16, Vec<u8>)> {
        let status = u16::try_from(self.answer_status?).ok()?;
        Some((status, self.answer_body.clone()?))
    }

    /// When the lease of a live driver ends, if one holds it at `now`.
    pub fn held_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.lease_until.filter(|until| *until > now)
    }
}

/// Reads where an operation stands; `None` when it does not exist.
pub async fn standing(
    conn: &mut AsyncPgConnection,
    table: Table,
    (account_id, id): (AccountId, Uuid),
) -> diesel::QueryResult<Option<Standing>> {
    use diesel::OptionalExtension;
    diesel::sql_query(format!(
        "SELECT answer_status, answer_body, lease_until FROM {table} WHERE account_id = $1 AND id = $2",
        table = table.name()
    ))
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(id)
    .get_result(conn)
    .await
    .optional()
}

/// In-flight operations of `table` that no driver holds: waiting for a retry or the reconciler
/// (the `orderpay_operations_waiting` gauge).
pub async fn count_waiting(
    conn: &mut AsyncPgConnection,
    table: Table,
    now: DateTime<Utc>,
) -> diesel::QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        count: i64,
    }
    let count: Count = diesel::sql_query(format!(
        "SELECT count(*) AS count FROM {table} \
         WHERE {IN_FLIGHT} AND (lease_until IS NULL OR lease_until <= $1)",
        table = table.name()
    ))
    .bind::<Timestamptz, _>(now)
    .get_result(conn)
    .await?;
    Ok(count.count)
}
