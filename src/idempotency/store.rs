//! The key store: one row per `(account_id, key)` in `idempotency_keys`.
//!
//! First writer wins by the primary key, not by application locks: the claim inserts with
//! `ON CONFLICT DO NOTHING` (`claim_key.sql`), which makes a concurrent duplicate wait for the
//! first transaction to commit (or roll back) before it reads the winner's row. So it holds
//! across any number of service instances.
//!
//! The writers of a key row, one each: the claim (`claim_key.sql`, alone here in [`claim`] or
//! leading the statement that starts an operation), [`complete`] (the answer of a transaction
//! that claimed the key without one), [`abandon`] (a claim whose operation refused to start:
//! not stored, the client may fix its request), [`expire`] (one key met past its retention) and
//! [`delete_expired`] (the sweeper).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{KeyedRequest, StoredResponse};
use crate::db::schema::{events, idempotency_key_audit, idempotency_keys};
use crate::ids::AccountId;

/// Declares [`ResourceKind`]: the resources whose answer is stored with the key, and one per
/// kind of provider operation in `operations::every_kind!`.
macro_rules! resource_kinds {
    ($( $kind:path => $variant:ident($table:literal, $label:literal, $resource:ident = $spelling:literal) ),* $(,)?) => {
        crate::text_enum! {
            /// What a key created or acted on, and so where its answer lives: on the key row with
            /// the change (an order created or cancelled; a merchant's webhook endpoint created,
            /// or its secret rotated), or on the row of the provider operation it started, once
            /// that settles (a payment, a capture or void, a refund, a dispute response).
            pub enum ResourceKind {
                Order = "order",
                WebhookEndpoint = "webhook_endpoint",
                $( $resource = $spelling, )*
            }
        }
    };
}

crate::operations::every_kind!(resource_kinds);

impl ResourceKind {
    /// The headers of an answer whose body is the creation event of the resource `id` of this
    /// kind: a JSON body at the resource's address. A key row naming such an event stores no
    /// headers when the answer's were exactly these (`ClaimParameters::answered_by_event`).
    fn event_answer_headers(self, id: Uuid) -> Option<Vec<(String, String)>> {
        let location = match self {
            ResourceKind::Order => {
                crate::orders::representation::location(crate::ids::OrderId::from_uuid(id))
            }
            _ => return None,
        };
        Some(StoredResponse::json(0, Vec::new()).with_header("location", location).headers)
    }

    /// Whether its answer is stored on the resource's own row, once it settles (a provider
    /// operation: some kind of `operations::every_kind!` names it), rather than on the key row
    /// with the change (a local one).
    pub fn answer_on_its_row(self) -> bool {
        crate::operations::leases::Table::of(self).is_some()
    }
}

/// A stored key row.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = idempotency_keys)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct KeyRecord {
    pub account_id: AccountId,
    pub key: String,
    pub method: String,
    pub route: String,
    pub fingerprint: Vec<u8>,
    pub resource_kind: ResourceKind,
    pub resource_id: Uuid,
    pub response_status: Option<i16>,
    pub response_headers: Option<serde_json::Value>,
    /// The body, read from the event named by `answer_event_id` when the row names one.
    pub response_body: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The event whose data is the answer's body (a new order's `order.created`), kept instead
    /// of a second copy of the bytes on this row.
    pub answer_event_id: Option<Uuid>,
}

/// The SQL type of a [`KeyRecord`] as the statements return it (`existing.*` in table order).
pub type KeyRecordSql = diesel::dsl::SqlTypeOf<<idempotency_keys::table as diesel::Table>::AllColumns>;

/// Why a key cannot serve this request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyConflict {
    /// The key was first used for another method, route or body: 422, nothing executed.
    #[error("{0}")]
    Reused(String),
    /// The first request with this key is still running: 409, retry after the wait.
    #[error("a request with this Idempotency-Key is still being processed")]
    InUse { retry_after: Duration, resource_id: Option<Uuid> },
}

/// What an existing key means for a request that matches its binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The first request's answer, stored on the key row: replay it.
    Answer(StoredResponse),
    /// The key started a provider operation, whose row holds the answer (or, while it runs,
    /// the lease of whoever drives it).
    Operation { kind: ResourceKind, resource_id: Uuid },
}

impl KeyRecord {
    /// Checks the binding and says what the stored row means; `None` when the key is past its
    /// retention and counts as new (the caller [`expire`]s it and claims it again).
    pub fn resolve(
        &self,
        request: &KeyedRequest,
        now: DateTime<Utc>,
    ) -> Result<Option<Resolved>, KeyConflict> {
        if self.expires_at <= now {
            return Ok(None);
        }
        if self.method != request.method || self.route != request.route {
            return Err(KeyConflict::Reused(format!(
                "this Idempotency-Key was first used for {} {}; use a new key for {} {}",
                self.method, self.route, request.method, request.route
            )));
        }
        if self.fingerprint.as_slice() != request.fingerprint.as_bytes() {
            return Err(KeyConflict::Reused(
                "this Idempotency-Key was first used with a different request body; \
                 use a new key for a new request"
                    .to_owned(),
            ));
        }
        if let Some(response) = self.stored_response() {
            return Ok(Some(Resolved::Answer(response)));
        }
        if self.resource_kind.answer_on_its_row() {
            return Ok(Some(Resolved::Operation { kind: self.resource_kind, resource_id: self.resource_id }));
        }
        // A local operation commits its key with its answer; a row without one belongs to a
        // transaction that has not committed, which no other statement can see.
        Err(KeyConflict::InUse { retry_after: Duration::from_secs(1), resource_id: Some(self.resource_id) })
    }

    /// The answer stored on this row, if it holds one (and it is well-formed).
    fn stored_response(&self) -> Option<StoredResponse> {
        let status = u16::try_from(self.response_status?).ok()?;
        let body = self.response_body.clone()?;
        let headers = match &self.response_headers {
            Some(headers) => serde_json::from_value(headers.clone()).ok()?,
            None if self.answer_event_id.is_some() => {
                self.resource_kind.event_answer_headers(self.resource_id)?
            }
            None => Vec::new(),
        };
        Some(StoredResponse { status, headers, body })
    }
}

/// The parameters of `claim_key.sql` ($1 to $12), for every statement that starts with it.
pub struct ClaimParameters<'a> {
    pub account_id: AccountId,
    /// `None`: no key, nothing is claimed (an order created without one).
    pub key: Option<&'a str>,
    pub method: &'a str,
    pub route: &'a str,
    pub fingerprint: &'a [u8],
    pub resource_kind: ResourceKind,
    pub resource_id: Uuid,
    pub answer_status: Option<i16>,
    pub answer_headers: Option<serde_json::Value>,
    pub answer_body: Option<&'a [u8]>,
    pub now: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The event written in the same statement whose data is `answer_body`: the row names it
    /// and stores no body of its own.
    pub answer_event_id: Option<Uuid>,
}

impl<'a> ClaimParameters<'a> {
    /// A claim of `request`'s key (or none), for `resource`, with `answer` if it is known now.
    pub fn new(
        account_id: AccountId,
        request: Option<&'a KeyedRequest>,
        (resource_kind, resource_id): (ResourceKind, Uuid),
        answer: Option<&'a StoredResponse>,
        now: DateTime<Utc>,
        retention: Duration,
    ) -> Self {
        ClaimParameters {
            account_id,
            key: request.map(|request| request.key.as_str()),
            method: request.map_or("", |request| request.method.as_str()),
            route: request.map_or("", |request| request.route.as_str()),
            fingerprint: request.map_or(&[][..], |request| request.fingerprint.as_bytes().as_slice()),
            resource_kind,
            resource_id,
            answer_status: answer.map(|answer| answer.status as i16),
            answer_headers: answer.map(StoredResponse::headers_json),
            answer_body: answer.map(|answer| answer.body.as_slice()),
            now,
            expires_at: crate::clock::after(now, retention),
            answer_event_id: None,
        }
    }

    /// The same claim, its answer's body being the data of `event`, which the statement writes
    /// with the key: the key row names the event rather than holding the bytes again, and holds
    /// no headers when they are the ones a replay derives from the resource (its address).
    pub fn answered_by_event(self, event: Uuid) -> Self {
        let derived = self
            .resource_kind
            .event_answer_headers(self.resource_id)
            .map(|headers| StoredResponse { status: 0, headers, body: Vec::new() }.headers_json());
        let answer_headers = self.answer_headers.clone().filter(|stored| Some(stored) != derived.as_ref());
        ClaimParameters { answer_event_id: Some(event), answer_headers, ..self }
    }
}

crate::parameter_group! {
    ClaimParameters {
        1 => account_id as Uuid,
        2 => key as Nullable<Text>,
        3 => method as Text,
        4 => route as Text,
        5 => fingerprint as Bytea,
        6 => resource_kind as Text,
        7 => resource_id as Uuid,
        8 => answer_status as Nullable<Int2>,
        9 => answer_headers as Nullable<Jsonb>,
        10 => answer_body as Nullable<Bytea>,
        11 => now as Timestamptz,
        12 => expires_at as Timestamptz,
        97 => answer_event_id as Nullable<Uuid>,
    }
}

crate::prepared_statement! {
    /// The claim alone, inside a transaction that writes the rest.
    pub(crate) struct ClaimKey<'a>("claim_key.sql", "claim_key_alone.sql") -> BigInt {
        group claim: ClaimParameters<'a>,
    }
}

/// What a claim found.
#[derive(Debug)]
pub enum Claim {
    /// The key is new and now belongs to this transaction.
    Acquired,
    /// Someone used the key before (their transaction has committed).
    Existing(Box<KeyRecord>),
}

/// Claims `request`'s key inside the caller's transaction, without an answer: the transaction
/// [`complete`]s it before it commits. If another transaction holds an uncommitted row for the
/// key, this waits for it to finish. A row past its retention is expired and the key claimed
/// anew.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    request: &KeyedRequest,
    resource: (ResourceKind, Uuid),
    retention: Duration,
    now: DateTime<Utc>,
) -> QueryResult<Claim> {
    // A conflicting row can vanish (swept, or expired here) between the insert and the read.
    for _ in 0..3 {
        let claim = ClaimParameters::new(request.account_id, Some(request), resource, None, now, retention);
        if (ClaimKey { claim }).get_result::<i64>(conn).await? == 1 {
            return Ok(Claim::Acquired);
        }
        match find(conn, request.account_id, request.key.as_str()).await? {
            Some(record) if record.expires_at > now => return Ok(Claim::Existing(Box::new(record))),
            Some(_) => {
                expire(conn, request.account_id, request.key.as_str(), now).await?;
            }
            None => {}
        }
    }
    Err(diesel::result::Error::RollbackTransaction)
}

/// Reads a key row, with its answer's body from the event it names, if it names one (one
/// statement: the event by its primary key).
pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &str,
) -> QueryResult<Option<KeyRecord>> {
    let answering_event = events::table.on(events::account_id
        .eq(idempotency_keys::account_id)
        .and(events::id.nullable().eq(idempotency_keys::answer_event_id)));
    let found: Option<(KeyRecord, Option<Vec<u8>>)> = idempotency_keys::table
        .left_join(answering_event)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .select((KeyRecord::as_select(), events::data.nullable()))
        .first(conn)
        .await
        .optional()?;
    Ok(found.map(|(mut record, event_data)| {
        if record.answer_event_id.is_some() {
            record.response_body = event_data;
        }
        record
    }))
}

/// Stores the answer of a transaction that claimed the key for `resource_id` without one, in
/// that transaction. Returns whether it did.
pub async fn complete(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &str,
    resource_id: Uuid,
    response: &StoredResponse,
) -> QueryResult<bool> {
    let updated = diesel::update(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::resource_id.eq(resource_id))
        .filter(idempotency_keys::response_status.is_null())
        .set((
            idempotency_keys::response_status.eq(Some(response.status as i16)),
            idempotency_keys::response_headers.eq(Some(response.headers_json())),
            idempotency_keys::response_body.eq(Some(response.body.as_slice())),
        ))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// Points the unanswered claim of `key` (made for `from`, which was not started) at `to`, the
/// operation an earlier use of the key started: a retry past the key's lifetime answers it.
pub async fn repoint(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &str,
    from: Uuid,
    to: Uuid,
) -> QueryResult<bool> {
    let updated = diesel::update(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::resource_id.eq(from))
        .filter(idempotency_keys::response_status.is_null())
        .set(idempotency_keys::resource_id.eq(to))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// Deletes the unanswered claim of an operation that refused to start (not stored: the client
/// may fix its request and use the key again).
pub async fn abandon(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &str,
    resource_id: Uuid,
) -> QueryResult<()> {
    diesel::delete(idempotency_keys::table)
        .filter(idempotency_keys::account_id.eq(account_id))
        .filter(idempotency_keys::key.eq(key))
        .filter(idempotency_keys::resource_id.eq(resource_id))
        .filter(idempotency_keys::response_status.is_null())
        .execute(conn)
        .await?;
    Ok(())
}

crate::prepared_statement! {
    /// One key expired, if it is past its retention (`expire_key.sql`, `move_to_audit.sql`).
    pub(crate) struct ExpireKey<'a>("expire_key.sql", "move_to_audit.sql") -> BigInt {
        1 => account_id: AccountId as Uuid,
        2 => key: &'a str as Text,
        3 => now: DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    /// The sweeper's batch (`sweep_keys.sql`, `move_to_audit.sql`).
    pub(crate) struct SweepKeys<'a>("sweep_keys.sql", "move_to_audit.sql") -> BigInt {
        1 => now: &'a DateTime<Utc> as Timestamptz,
        2 => batch_size: i64 as BigInt,
    }
}

crate::prepared_statement! {
    /// Audit rows past their retention deleted (`purge_audit.sql`).
    pub(crate) struct PurgeAudit<'a>("purge_audit.sql") -> () {
        1 => before: &'a DateTime<Utc> as Timestamptz,
        2 => batch_size: i64 as BigInt,
    }
}

/// Expires one key if it is past its retention (a key met there counts as new): its metadata
/// moves to the audit, like the sweeper's.
pub async fn expire(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &str,
    now: DateTime<Utc>,
) -> QueryResult<()> {
    ExpireKey { account_id, key, now }.get_result::<i64>(conn).await?;
    Ok(())
}

/// Moves up to `batch_size` keys past their retention to the audit (metadata only, no answer),
/// oldest first, skipping rows other transactions hold, in one statement: a key is either live
/// or audited, never lost between the two. Returns how many were moved. A payment whose key is
/// moved while it still runs keeps everything it needs on its own row; a retry with the expired
/// key then starts afresh and meets the order's payment in flight (409 `payment-in-progress`).
pub async fn delete_expired(
    conn: &mut AsyncPgConnection,
    batch_size: i64,
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    let moved: i64 = SweepKeys { now: &now, batch_size }.get_result(conn).await?;
    Ok(moved as usize)
}

/// Deletes up to `batch_size` audit rows of keys that expired before `before`, oldest first.
/// Returns how many.
pub async fn purge_audit(
    conn: &mut AsyncPgConnection,
    batch_size: i64,
    before: DateTime<Utc>,
) -> QueryResult<usize> {
    PurgeAudit { before: &before, batch_size }.execute(conn).await
}

/// A key's metadata as the audit keeps it after it expired.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = idempotency_key_audit)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct AuditRecord {
    pub account_id: AccountId,
    pub key: String,
    pub method: String,
    pub route: String,
    pub fingerprint: Vec<u8>,
    pub resource_kind: ResourceKind,
    pub resource_id: Uuid,
    pub response_status: Option<i16>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// The audit rows of a key, newest use first (a key used again after it expired has several).
pub async fn find_audit(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &str,
) -> QueryResult<Vec<AuditRecord>> {
    idempotency_key_audit::table
        .filter(idempotency_key_audit::account_id.eq(account_id))
        .filter(idempotency_key_audit::key.eq(key))
        .order(idempotency_key_audit::created_at.desc())
        .select(AuditRecord::as_select())
        .load(conn)
        .await
}
