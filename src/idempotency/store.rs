//! The key store: one row per `(account_id, key)` in `idempotency_keys`.
//!
//! First writer wins by the primary key, not by application locks: [`claim`] inserts with
//! `ON CONFLICT DO NOTHING`, which makes a concurrent duplicate wait for the first transaction
//! to commit (or roll back) before it reads the winner's row. So it holds across any number of
//! service instances.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{KeyedRequest, StoredResponse};
use crate::clock::after;
use crate::db::schema::idempotency_keys;
use crate::error::ApiError;

const IN_PROGRESS: &str = "in_progress";
const COMPLETED: &str = "completed";
/// The recovery point of a key whose answer is stored.
const FINISHED: &str = "finished";

/// The state a claimed key starts in.
#[derive(Debug, Clone, Copy)]
pub enum ClaimAs<'a> {
    /// The operation's answer is known before it runs (creating an order: every field of the
    /// response is computed up front), so the key is stored completed at once: one statement.
    Completed { response: &'a StoredResponse, resource_id: Option<Uuid> },
    /// The answer is only known after the operation; call [`complete`] in the same transaction.
    /// A multi-step operation passes a lease so that another request can tell a live owner from
    /// a crashed one, and the recovery point a successor resumes from if this transaction
    /// commits before the answer is known.
    InProgress { lease: Option<Duration>, resource_id: Option<Uuid>, recovery_point: &'static str },
}

/// The outcome of trying to claim a key.
#[derive(Debug)]
pub enum Claim {
    /// The key is new and now belongs to this transaction, with the lease (if one was asked for)
    /// that only this owner may release.
    Acquired(Option<Uuid>),
    /// Someone used the key before (their transaction has committed).
    Existing(Box<KeyRecord>),
}

/// A stored key row.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = idempotency_keys)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct KeyRecord {
    pub account_id: Uuid,
    pub key: String,
    pub method: String,
    pub route: String,
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub locked_until: Option<DateTime<Utc>>,
    pub recovery_point: String,
    pub resource_id: Option<Uuid>,
    pub response_status: Option<i16>,
    pub response_headers: Option<serde_json::Value>,
    pub response_body: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub lease_id: Option<Uuid>,
}

/// What an existing key means for a request that matches its binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// The first request completed: replay its answer.
    Replay(StoredResponse),
    /// The first request is still running (its lease is held).
    InUse { retry_after: Duration, resource_id: Option<Uuid> },
    /// The first request's owner is gone (its lease expired or was released): the caller may take
    /// the key over and resume from the recovery point.
    Abandoned { recovery_point: String, resource_id: Option<Uuid> },
}

impl KeyRecord {
    /// Checks the binding and says what the stored row means. A different method, route or body
    /// is a reuse of the key for another intent: 422, nothing executed.
    pub fn resolve(&self, request: &KeyedRequest, now: DateTime<Utc>) -> Result<Existing, ApiError> {
        if self.method != request.method || self.route != request.route {
            return Err(ApiError::IdempotencyKeyReused(format!(
                "this Idempotency-Key was first used for {} {}; use a new key for {} {}",
                self.method, self.route, request.method, request.route
            )));
        }
        if self.fingerprint.as_slice() != request.fingerprint.as_bytes() {
            return Err(ApiError::IdempotencyKeyReused(
                "this Idempotency-Key was first used with a different request body; \
                 use a new key for a new request"
                    .to_owned(),
            ));
        }
        if self.state == COMPLETED {
            return self.stored_response().map(Existing::Replay);
        }
        match self.locked_until {
            Some(until) if until > now => Ok(Existing::InUse {
                retry_after: (until - now).to_std().unwrap_or(Duration::ZERO),
                resource_id: self.resource_id,
            }),
            _ => Ok(Existing::Abandoned {
                recovery_point: self.recovery_point.clone(),
                resource_id: self.resource_id,
            }),
        }
    }

    fn stored_response(&self) -> Result<StoredResponse, ApiError> {
        let corrupt = || ApiError::Internal(anyhow::anyhow!("completed key {} has no response", self.key));
        let status = self.response_status.and_then(|s| u16::try_from(s).ok()).ok_or_else(corrupt)?;
        let body = self.response_body.clone().ok_or_else(corrupt)?;
        let headers = match &self.response_headers {
            Some(headers) => serde_json::from_value(headers.clone())
                .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored headers: {e}")))?,
            None => Vec::new(),
        };
        Ok(StoredResponse { status, headers, body })
    }
}

#[derive(Insertable)]
#[diesel(table_name = idempotency_keys)]
struct NewKeyRow<'a> {
    account_id: Uuid,
    key: &'a str,
    method: &'a str,
    route: &'a str,
    fingerprint: &'a [u8],
    state: &'a str,
    locked_until: Option<DateTime<Utc>>,
    recovery_point: &'a str,
    resource_id: Option<Uuid>,
    response_status: Option<i16>,
    response_headers: Option<serde_json::Value>,
    response_body: Option<&'a [u8]>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    lease_id: Option<Uuid>,
}

/// The stored form of an answer's headers: `[[name, value], ...]`.
pub fn headers_json(response: &StoredResponse) -> serde_json::Value {
    serde_json::Value::Array(
        response.headers.iter().map(|(name, value)| serde_json::json!([name, value])).collect(),
    )
}

/// Claims `request`'s key inside the caller's transaction.
///
/// If another transaction holds an uncommitted row for the key, this waits for it to finish.
/// A completed row past its retention is treated as absent: it is deleted and the key claimed
/// anew. An in-progress row is never deleted, however old: its operation (a payment whose
/// outcome is unknown) still owns the key.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    request: &KeyedRequest,
    claim_as: ClaimAs<'_>,
    retention: Duration,
    now: DateTime<Utc>,
) -> QueryResult<Claim> {
    let (state, locked_until, resource_id, response, recovery_point) = match claim_as {
        ClaimAs::Completed { response, resource_id } => {
            (COMPLETED, None, resource_id, Some(response), FINISHED)
        }
        ClaimAs::InProgress { lease, resource_id, recovery_point } => {
            (IN_PROGRESS, lease.map(|lease| after(now, lease)), resource_id, None, recovery_point)
        }
    };
    let lease_id = locked_until.map(|_| Uuid::now_v7());
    let row = NewKeyRow {
        account_id: request.account_id,
        key: request.key.as_str(),
        method: &request.method,
        route: &request.route,
        fingerprint: request.fingerprint.as_bytes(),
        state,
        locked_until,
        recovery_point,
        resource_id,
        response_status: response.map(|r| r.status as i16),
        response_headers: response.map(headers_json),
        response_body: response.map(|r| r.body.as_slice()),
        created_at: now,
        expires_at: after(now, retention),
        lease_id,
    };
    // Two rounds at most: a conflicting row can vanish (swept, or expired and deleted here)
    // between the insert and the read.
    for _ in 0..3 {
        let inserted = diesel::insert_into(idempotency_keys::table)
            .values(&row)
            .on_conflict_do_nothing()
            .execute(conn)
            .await?;
        if inserted == 1 {
            return Ok(Claim::Acquired(lease_id));
        }
        let existing = find(conn, request.account_id, request.key.as_str()).await?;
        match existing {
            Some(record) if record.expires_at > now || record.state != COMPLETED => {
                return Ok(Claim::Existing(Box::new(record)));
            }
            Some(_) => {
                diesel::delete(idempotency_keys::table)
                    .filter(idempotency_keys::account_id.eq(request.account_id))
                    .filter(idempotency_keys::key.eq(request.key.as_str()))
                    .filter(idempotency_keys::state.eq(COMPLETED))
                    .filter(idempotency_keys::expires_at.le(now))
                    .execute(conn)
                    .await?;
            }
            None => {}
        }
    }
    Err(diesel::result::Error::RollbackTransaction)
}

/// Reads a key row.
pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key: &str,
) -> QueryResult<Option<KeyRecord>> {
    idempotency_keys::table
        .find((account_id, key))
        .select(KeyRecord::as_select())
        .first(conn)
        .await
        .optional()
}

/// Stores the final answer for a key that is in progress for `resource_id`, in the caller's
/// transaction. Returns whether it did: `false` when the key row is gone, already completed, or
/// now belongs to another resource (the key expired and was reused).
pub async fn complete(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key: &str,
    resource_id: Uuid,
    response: &StoredResponse,
) -> QueryResult<bool> {
    let updated = diesel::update(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::state.eq(IN_PROGRESS))
        .filter(idempotency_keys::resource_id.eq(resource_id))
        .set((
            idempotency_keys::state.eq(COMPLETED),
            idempotency_keys::locked_until.eq(None::<DateTime<Utc>>),
            idempotency_keys::lease_id.eq(None::<Uuid>),
            idempotency_keys::recovery_point.eq(FINISHED),
            idempotency_keys::response_status.eq(Some(response.status as i16)),
            idempotency_keys::response_headers.eq(Some(headers_json(response))),
            idempotency_keys::response_body.eq(Some(response.body.as_slice())),
        ))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// Takes over the in-progress key of `resource_id` when its lease has run out (or was released):
/// an atomic compare-and-set, so of two takers racing for an abandoned key exactly one wins. A
/// taker waits for a concurrent one's uncommitted lease and then sees it held. Returns the new
/// lease's id when this caller now holds it.
pub async fn take_over(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key: &str,
    resource_id: Uuid,
    lease: Duration,
    now: DateTime<Utc>,
) -> QueryResult<Option<Uuid>> {
    let lease_id = Uuid::now_v7();
    let updated = diesel::update(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::state.eq(IN_PROGRESS))
        .filter(idempotency_keys::resource_id.eq(resource_id))
        .filter(idempotency_keys::locked_until.is_null().or(idempotency_keys::locked_until.le(now)))
        .set((
            idempotency_keys::locked_until.eq(Some(after(now, lease))),
            idempotency_keys::lease_id.eq(Some(lease_id)),
        ))
        .execute(conn)
        .await?;
    Ok((updated == 1).then_some(lease_id))
}

/// Deletes an in-progress claim for `resource_id` whose operation refused to start (not stored:
/// the client may fix its request and use the key again).
pub async fn abandon(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key: &str,
    resource_id: Uuid,
) -> QueryResult<()> {
    diesel::delete(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::state.eq(IN_PROGRESS))
        .filter(idempotency_keys::resource_id.eq(resource_id))
        .execute(conn)
        .await?;
    Ok(())
}

/// Gives up a lease (the outcome is unknown; a retry may take the key over at once), if the
/// caller still owns it: a lease taken over meanwhile belongs to its new owner.
pub async fn release_lease(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key: &str,
    lease_id: Uuid,
) -> QueryResult<bool> {
    let updated = diesel::update(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::state.eq(IN_PROGRESS))
        .filter(idempotency_keys::lease_id.eq(lease_id))
        .set((
            idempotency_keys::locked_until.eq(None::<DateTime<Utc>>),
            idempotency_keys::lease_id.eq(None::<Uuid>),
        ))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// In-progress keys whose lease has run out: payments whose driver is gone, waiting for a retry
/// or the reconciler (the `orderpay_idempotency_keys_past_lease` gauge).
pub async fn count_past_lease(conn: &mut AsyncPgConnection, now: DateTime<Utc>) -> QueryResult<i64> {
    idempotency_keys::table
        .filter(idempotency_keys::state.eq(IN_PROGRESS))
        .filter(idempotency_keys::locked_until.le(now))
        .count()
        .get_result(conn)
        .await
}

/// Deletes up to `batch_size` completed rows past their retention, oldest first, skipping rows
/// other transactions hold. In-progress rows are kept: their operation still owns the key.
/// Returns how many were deleted.
pub async fn delete_expired(
    conn: &mut AsyncPgConnection,
    batch_size: i64,
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    diesel::sql_query(
        "DELETE FROM idempotency_keys WHERE (account_id, key) IN ( \
             SELECT account_id, key FROM idempotency_keys \
             WHERE expires_at <= $1 AND state = 'completed' \
             ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
    )
    .bind::<diesel::sql_types::Timestamptz, _>(now)
    .bind::<diesel::sql_types::BigInt, _>(batch_size)
    .execute(conn)
    .await
}

/// For operations that run entirely inside one transaction (orders): an existing key is replayed
/// or refused. Such an operation's key is never seen in progress by others (it commits
/// completed), so a row in progress here belongs to a multi-step operation on the same route and
/// is reported as in use rather than run twice.
pub fn replay_local(
    record: &KeyRecord,
    request: &KeyedRequest,
    now: DateTime<Utc>,
) -> Result<super::Execution, ApiError> {
    match record.resolve(request, now)? {
        Existing::Replay(response) => Ok(super::Execution::Replayed(response)),
        Existing::InUse { retry_after, resource_id } => Err(ApiError::key_in_use(retry_after, resource_id)),
        Existing::Abandoned { resource_id, .. } => {
            Err(ApiError::IdempotencyKeyInUse { retry_after_secs: 1, resource_id })
        }
    }
}
