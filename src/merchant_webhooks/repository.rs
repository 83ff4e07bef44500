//! Merchant webhook persistence: the only code that knows the `webhook_endpoints`,
//! `webhook_deliveries` and `webhook_delivery_attempts` tables.
//!
//! The writers, one each:
//! - endpoints: [`insert_endpoint`], [`rotate_secret`] and [`delete_endpoint`] (which stops the
//!   endpoint's pending deliveries in the same statement);
//! - deliveries: [`insert_deliveries`] (the relay, in its round; redeliveries), [`claim_due`] (a
//!   worker leases due ones, counting an attempt), [`record_finished`] (a batch of attempts'
//!   outcomes, each under its own lease, with the attempts' rows).
//!
//! Lock order (docs/architecture.md): an endpoint row, then deliveries, then attempts. The
//! relay takes its endpoints `FOR SHARE` before it writes their deliveries, and a deletion
//! locks its endpoint before it cancels, so a deletion either comes first (and the relay writes
//! none for it) or waits for the round and then cancels what it wrote.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Int2, Int4, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use super::{DeliveryOrigin, DeliveryStatus, EnabledEvents, Endpoint, EndpointUrl};
use crate::db::schema::{webhook_deliveries, webhook_endpoints};
use crate::events::{Event, EventType};
use crate::ids::{AccountId, DeliveryId, EndpointId, EventId, LeaseId};
use crate::operations::leases::Lease;

/// A row that does not decode into a valid endpoint is a bug or tampering, never client input.
fn corrupt(what: String) -> diesel::result::Error {
    diesel::result::Error::DeserializationError(what.into())
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = webhook_endpoints)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct EndpointRow {
    account_id: AccountId,
    id: EndpointId,
    url: String,
    description: Option<String>,
    enabled_events: Vec<Option<String>>,
    previous_secret_expires_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn enabled_events(stored: Vec<Option<String>>) -> QueryResult<EnabledEvents> {
    let names: Vec<String> = stored.into_iter().flatten().collect();
    EnabledEvents::parse(&names).map_err(|problems| corrupt(format!("endpoint events: {problems:?}")))
}

impl TryFrom<EndpointRow> for Endpoint {
    type Error = diesel::result::Error;

    fn try_from(row: EndpointRow) -> QueryResult<Endpoint> {
        Ok(Endpoint {
            account_id: row.account_id,
            id: row.id,
            url: EndpointUrl::parse(&row.url).map_err(|error| corrupt(format!("endpoint url: {error}")))?,
            description: row.description,
            enabled_events: enabled_events(row.enabled_events)?,
            previous_secret_expires_at: row.previous_secret_expires_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

fn stored_events(events: &EnabledEvents) -> Vec<Option<&'static str>> {
    events.names().into_iter().map(Some).collect()
}

/// Inserts a new endpoint with its sealed secret.
pub async fn insert_endpoint(
    conn: &mut AsyncPgConnection,
    endpoint: &Endpoint,
    secret: &[u8],
) -> QueryResult<()> {
    diesel::insert_into(webhook_endpoints::table)
        .values((
            webhook_endpoints::account_id.eq(endpoint.account_id),
            webhook_endpoints::id.eq(endpoint.id),
            webhook_endpoints::url.eq(endpoint.url.as_str()),
            webhook_endpoints::description.eq(endpoint.description.as_deref()),
            webhook_endpoints::enabled_events.eq(stored_events(&endpoint.enabled_events)),
            webhook_endpoints::secret.eq(Some(secret)),
            webhook_endpoints::created_at.eq(endpoint.created_at),
            webhook_endpoints::updated_at.eq(endpoint.updated_at),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// One live (not deleted) endpoint of the account.
pub async fn find_endpoint(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
) -> QueryResult<Option<Endpoint>> {
    let row = webhook_endpoints::table
        .find((account_id, id))
        .filter(webhook_endpoints::deleted_at.is_null())
        .select(EndpointRow::as_select())
        .first(conn)
        .await
        .optional()?;
    row.map(Endpoint::try_from).transpose()
}

/// A page of the account's live endpoints, newest first, strictly older than `starting_after`
/// when given. Returns the page and whether more follow.
pub async fn list_endpoints(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    limit: i64,
    starting_after: Option<EndpointId>,
) -> QueryResult<(Vec<Endpoint>, bool)> {
    let mut query = webhook_endpoints::table
        .filter(webhook_endpoints::account_id.eq(account_id))
        .filter(webhook_endpoints::deleted_at.is_null())
        .into_boxed();
    if let Some(cursor) = starting_after {
        query = query.filter(webhook_endpoints::id.lt(cursor));
    }
    let mut rows: Vec<EndpointRow> = query
        .order(webhook_endpoints::id.desc())
        .limit(limit + 1)
        .select(EndpointRow::as_select())
        .load(conn)
        .await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let endpoints = rows.into_iter().map(Endpoint::try_from).collect::<QueryResult<Vec<_>>>()?;
    Ok((endpoints, has_more))
}

/// A live endpoint's sealed secret, its row locked until the caller's transaction ends (a
/// rotation reads it before it replaces it); `None` when there is no such live endpoint.
pub async fn lock_secret(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
) -> QueryResult<Option<Vec<u8>>> {
    let secret: Option<Option<Vec<u8>>> = webhook_endpoints::table
        .find((account_id, id))
        .filter(webhook_endpoints::deleted_at.is_null())
        .select(webhook_endpoints::secret)
        .for_update()
        .first(conn)
        .await
        .optional()?;
    Ok(secret.flatten())
}

/// Replaces a live endpoint's secret by `secret`; `previous` (the replaced one, sealed, and until
/// when it keeps signing) becomes the previous secret, or none (a secret rotated out before,
/// still signing, stops now either way). Returns the endpoint after the change, `None` when there
/// is no such live endpoint.
pub async fn rotate_secret(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
    secret: &[u8],
    previous: Option<(&[u8], DateTime<Utc>)>,
    now: DateTime<Utc>,
) -> QueryResult<Option<Endpoint>> {
    let row = diesel::update(webhook_endpoints::table.find((account_id, id)))
        .filter(webhook_endpoints::deleted_at.is_null())
        .set((
            webhook_endpoints::previous_secret.eq(previous.map(|(sealed, _)| sealed)),
            webhook_endpoints::previous_secret_expires_at.eq(previous.map(|(_, until)| until)),
            webhook_endpoints::secret.eq(Some(secret)),
            webhook_endpoints::updated_at.eq(now),
        ))
        .returning(EndpointRow::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    row.map(Endpoint::try_from).transpose()
}

/// Deletes a live endpoint: it keeps its row (its deliveries name it) without its secrets, and
/// its pending deliveries are canceled, in one transaction. Returns how many were canceled, or
/// `None` when there is no such live endpoint.
///
/// The endpoint's row is locked first, in a statement of its own: that waits for a relay round
/// (or a redelivery) holding it `FOR SHARE` to commit the deliveries it wrote. The cancel then
/// runs in a statement that starts after that commit, so its snapshot sees those deliveries. In
/// one statement it would not: the snapshot is taken before the wait, and a row inserted meanwhile
/// is not re-read (only rows that were updated are), so the round's deliveries stayed pending,
/// retried until they failed.
pub async fn delete_endpoint(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
    now: DateTime<Utc>,
) -> QueryResult<Option<i64>> {
    #[derive(QueryableByName)]
    struct Deleted {
        #[diesel(sql_type = BigInt)]
        deleted: i64,
        #[diesel(sql_type = BigInt)]
        canceled: i64,
    }
    conn.transaction(async |conn| {
        let live = webhook_endpoints::table
            .find((account_id, id))
            .filter(webhook_endpoints::deleted_at.is_null())
            .select(webhook_endpoints::id)
            .for_update()
            .first::<EndpointId>(conn)
            .await
            .optional()?;
        if live.is_none() {
            return Ok(None);
        }
        let deleted: Deleted = diesel::sql_query(
            "WITH gone AS ( \
                 UPDATE webhook_endpoints SET deleted_at = $3, updated_at = $3, secret = NULL, \
                     previous_secret = NULL, previous_secret_expires_at = NULL \
                 WHERE account_id = $1 AND id = $2 AND deleted_at IS NULL \
                 RETURNING account_id, id), \
             canceled AS ( \
                 UPDATE webhook_deliveries AS d SET status = 'canceled', next_attempt_at = NULL, \
                     lease_id = NULL, lease_until = NULL, updated_at = $3 \
                 FROM gone WHERE d.account_id = gone.account_id AND d.endpoint_id = gone.id \
                     AND d.status = 'pending' \
                 RETURNING d.id) \
             SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM canceled) AS canceled",
        )
        .bind::<SqlUuid, _>(account_id)
        .bind::<SqlUuid, _>(id)
        .bind::<Timestamptz, _>(now)
        .get_result(conn)
        .await?;
        Ok((deleted.deleted == 1).then_some(deleted.canceled))
    })
    .await
}

/// A live endpoint's sealed secrets, as `orderpay secrets reseal` reads them.
#[derive(Debug, Clone, Queryable)]
pub struct SealedSecrets {
    pub account_id: AccountId,
    pub id: EndpointId,
    pub secret: Vec<u8>,
    pub previous_secret: Option<Vec<u8>>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

/// Up to `limit` live endpoints' sealed secrets, in key order, after `after` when given.
pub async fn sealed_secrets_after(
    conn: &mut AsyncPgConnection,
    after: Option<(AccountId, EndpointId)>,
    limit: i64,
) -> QueryResult<Vec<SealedSecrets>> {
    let mut query = webhook_endpoints::table
        .filter(webhook_endpoints::deleted_at.is_null())
        .filter(webhook_endpoints::secret.is_not_null())
        .into_boxed();
    if let Some((account_id, id)) = after {
        query = query.filter(
            webhook_endpoints::account_id
                .gt(account_id)
                .or(webhook_endpoints::account_id.eq(account_id).and(webhook_endpoints::id.gt(id))),
        );
    }
    query
        .order((webhook_endpoints::account_id, webhook_endpoints::id))
        .limit(limit)
        .select((
            webhook_endpoints::account_id,
            webhook_endpoints::id,
            webhook_endpoints::secret.assume_not_null(),
            webhook_endpoints::previous_secret,
            webhook_endpoints::previous_secret_expires_at,
        ))
        .load(conn)
        .await
}

/// Stores an endpoint's secrets sealed again (`previous`: none drops the previous secret), if
/// they are still the ones `read` saw: a rotation or a deletion since wins. One statement, one
/// row lock. Returns whether it was written.
pub async fn replace_sealed_secrets(
    conn: &mut AsyncPgConnection,
    read: &SealedSecrets,
    secret: &[u8],
    previous: Option<&[u8]>,
) -> QueryResult<bool> {
    let written = diesel::update(webhook_endpoints::table.find((read.account_id, read.id)))
        .filter(webhook_endpoints::deleted_at.is_null())
        .filter(webhook_endpoints::secret.eq(&read.secret))
        .filter(webhook_endpoints::previous_secret.is_not_distinct_from(read.previous_secret.as_deref()))
        .set((
            webhook_endpoints::secret.eq(Some(secret)),
            webhook_endpoints::previous_secret.eq(previous),
            webhook_endpoints::previous_secret_expires_at.eq(previous.and(read.previous_secret_expires_at)),
        ))
        .execute(conn)
        .await?;
    Ok(written == 1)
}

/// The live endpoints whose URL is plain `http` (registered before https was required, or with
/// `ORDERPAY_WEBHOOK_REQUIRE_HTTPS=false`): how many, and up to `limit` of them.
pub async fn insecure_endpoints(
    conn: &mut AsyncPgConnection,
    limit: i64,
) -> QueryResult<(i64, Vec<(AccountId, EndpointId)>)> {
    let insecure = webhook_endpoints::table
        .filter(webhook_endpoints::deleted_at.is_null())
        .filter(webhook_endpoints::url.like("http:%"));
    let count = insecure.count().get_result(conn).await?;
    let some = insecure
        .select((webhook_endpoints::account_id, webhook_endpoints::id))
        .order((webhook_endpoints::account_id, webhook_endpoints::id))
        .limit(limit)
        .load(conn)
        .await?;
    Ok((count, some))
}

/// A live endpoint as the relay and redeliveries see it.
#[derive(Debug, Clone)]
pub struct Subscriber {
    pub account_id: AccountId,
    pub id: EndpointId,
    pub url: String,
    pub enabled_events: EnabledEvents,
    pub created_at: DateTime<Utc>,
}

/// The live endpoints of `account_ids` (one of them alone with `only`), locked `FOR SHARE` until
/// the caller's transaction ends: a deletion waits for the deliveries written for them, and then
/// cancels them.
pub async fn subscribers(
    conn: &mut AsyncPgConnection,
    account_ids: &[AccountId],
    only: Option<EndpointId>,
) -> QueryResult<Vec<Subscriber>> {
    #[derive(QueryableByName)]
    #[diesel(table_name = webhook_endpoints)]
    struct Row {
        account_id: AccountId,
        id: EndpointId,
        url: String,
        enabled_events: Vec<Option<String>>,
        created_at: DateTime<Utc>,
    }
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT account_id, id, url, enabled_events, created_at FROM webhook_endpoints \
         WHERE account_id = ANY($1) AND deleted_at IS NULL AND ($2::uuid IS NULL OR id = $2) \
         FOR SHARE",
    )
    .bind::<Array<SqlUuid>, _>(account_ids)
    .bind::<Nullable<SqlUuid>, _>(only)
    .load(conn)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(Subscriber {
                account_id: row.account_id,
                id: row.id,
                url: row.url,
                enabled_events: enabled_events(row.enabled_events)?,
                created_at: row.created_at,
            })
        })
        .collect()
}

/// A delivery to write: due at once.
#[derive(Debug, Clone, Copy)]
pub struct NewDelivery {
    pub account_id: AccountId,
    pub id: DeliveryId,
    pub endpoint_id: EndpointId,
    pub event_id: EventId,
    pub origin: DeliveryOrigin,
}

/// Rows per insert statement: far below PostgreSQL's 65535 parameters.
const INSERT_CHUNK: usize = 1000;

/// Writes deliveries, due at `now`. The relay's (`outbox`) are unique per event and endpoint: one
/// written before is not written again. Returns how many were written.
pub async fn insert_deliveries(
    conn: &mut AsyncPgConnection,
    deliveries: &[NewDelivery],
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    let mut written = 0;
    for chunk in deliveries.chunks(INSERT_CHUNK) {
        let rows: Vec<_> = chunk
            .iter()
            .map(|delivery| {
                (
                    webhook_deliveries::account_id.eq(delivery.account_id),
                    webhook_deliveries::id.eq(delivery.id),
                    webhook_deliveries::endpoint_id.eq(delivery.endpoint_id),
                    webhook_deliveries::event_id.eq(delivery.event_id),
                    webhook_deliveries::origin.eq(delivery.origin),
                    webhook_deliveries::status.eq(DeliveryStatus::Pending),
                    webhook_deliveries::next_attempt_at.eq(Some(now)),
                    webhook_deliveries::created_at.eq(now),
                    webhook_deliveries::updated_at.eq(now),
                )
            })
            .collect();
        written += diesel::insert_into(webhook_deliveries::table)
            .values(&rows)
            .on_conflict_do_nothing()
            .execute(conn)
            .await?;
    }
    Ok(written)
}

/// A delivery a worker now holds, with where it goes, the sealed secrets that sign it and its
/// event.
#[derive(Debug, Clone, QueryableByName)]
pub struct Claimed {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: AccountId,
    #[diesel(sql_type = SqlUuid)]
    pub id: DeliveryId,
    #[diesel(sql_type = SqlUuid)]
    pub endpoint_id: EndpointId,
    #[diesel(sql_type = SqlUuid)]
    pub event_id: EventId,
    /// This attempt's number.
    #[diesel(sql_type = Int4)]
    pub attempt: i32,
    #[diesel(sql_type = Text)]
    pub url: String,
    /// `None` once the endpoint is deleted (its deliveries are being canceled).
    #[diesel(sql_type = Nullable<Bytea>)]
    pub secret: Option<Vec<u8>>,
    /// The secret before the last rotation, while it still signs.
    #[diesel(sql_type = Nullable<Bytea>)]
    pub previous_secret: Option<Vec<u8>>,
    /// The event's type, stored JSON and time; `None` once it is gone past its retention.
    #[diesel(sql_type = Nullable<Text>)]
    pub event_type: Option<EventType>,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub event_data: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub event_created_at: Option<DateTime<Utc>>,
}

impl Claimed {
    /// The event as the Events API renders it, while it is stored.
    pub fn event(&self) -> Option<Event> {
        Some(Event {
            account_id: self.account_id,
            id: self.event_id,
            event_type: self.event_type?,
            data: self.event_data.clone()?,
            created_at: self.event_created_at?,
        })
    }
}

/// Leases up to `limit` due deliveries (pending, their next attempt due, and no live lease:
/// `next_attempt_at` moves to the lease's end) to `lease`, skipping rows another worker is
/// claiming, oldest due first; each claim counts an attempt. Everything a send needs (the
/// endpoint, its secrets, the event) comes back from this one statement: a claim that fails
/// has changed nothing, so it uses up no attempt number, and once it has succeeded nothing is
/// left to read that could fail between the claim and the send.
pub async fn claim_due(
    conn: &mut AsyncPgConnection,
    limit: i64,
    lease: Lease,
    now: DateTime<Utc>,
) -> QueryResult<Vec<Claimed>> {
    diesel::sql_query(
        "WITH due AS ( \
             SELECT account_id, id FROM webhook_deliveries \
             WHERE status = 'pending' AND next_attempt_at <= $1 \
             ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
         claimed AS ( \
             UPDATE webhook_deliveries AS d SET attempts = d.attempts + 1, lease_id = $3, \
                 lease_until = $4, next_attempt_at = $4, updated_at = $1 \
             FROM due WHERE d.account_id = due.account_id AND d.id = due.id \
             RETURNING d.account_id, d.id, d.endpoint_id, d.event_id, d.attempts) \
         SELECT c.account_id, c.id, c.endpoint_id, c.event_id, c.attempts AS attempt, e.url, \
             e.secret, CASE WHEN e.previous_secret_expires_at > $1 THEN e.previous_secret END \
                 AS previous_secret, \
             ev.type AS event_type, ev.data AS event_data, ev.created_at AS event_created_at \
         FROM claimed AS c \
         JOIN webhook_endpoints AS e ON e.account_id = c.account_id AND e.id = c.endpoint_id \
         LEFT JOIN events AS ev ON ev.account_id = c.account_id AND ev.id = c.event_id",
    )
    .bind::<Timestamptz, _>(now)
    .bind::<BigInt, _>(limit)
    .bind::<SqlUuid, _>(lease.id)
    .bind::<Timestamptz, _>(lease.until)
    .load(conn)
    .await
}

/// What an attempt saw.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub number: i32,
    pub started_at: DateTime<Utc>,
    /// The HTTP status, when an answer came.
    pub http_status: Option<u16>,
    pub latency_ms: i32,
    /// Why it failed (`None`: a 2xx).
    pub error: Option<String>,
}

/// Where a delivery goes after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Failed; the next attempt is due then.
    Retry(DateTime<Utc>),
    /// Failed, and that was the last attempt.
    GiveUp,
}

/// One finished attempt to record: the delivery, the lease it was sent under, what it saw and
/// where the delivery goes next.
#[derive(Debug, Clone)]
pub struct Finished {
    pub account_id: AccountId,
    pub delivery: DeliveryId,
    pub lease: LeaseId,
    pub attempt: Attempt,
    pub outcome: Outcome,
}

/// Records a batch of finished attempts in one statement (one transaction, one round trip, one
/// commit, whatever the batch's size): every attempt's row, and each delivery's outcome only if
/// its attempt's lease still holds the pending delivery. A worker whose lease ran out and was
/// taken over changes nothing but its attempt's own row; an endpoint's deletion (which cancels
/// the delivery and drops its lease) wins the same way. Returns the deliveries whose outcome was
/// written, each with the lease it was sent under: a delivery can be in a batch twice, and only
/// one of its attempts decided its outcome.
///
/// The lease guard is part of the join, so a delivery listed twice (sent under an old lease that
/// ran out, then again under a new one) matches at most one row: the one its current lease sent.
///
/// The held deliveries are locked `SKIP LOCKED` before they are updated: a statement that moves
/// many deliveries could otherwise deadlock with an endpoint's deletion cancelling several of
/// them in another order. Whoever else locks a delivery this lease holds is taking it away (a
/// deletion cancelling it, or a claim after the lease ran out), so skipping it is what the lease
/// guard would decide anyway, and the recorder never waits.
pub async fn record_finished(
    conn: &mut AsyncPgConnection,
    finished: &[Finished],
    now: DateTime<Utc>,
) -> QueryResult<HashSet<(DeliveryId, LeaseId)>> {
    #[derive(QueryableByName)]
    struct Applied {
        #[diesel(sql_type = SqlUuid)]
        id: DeliveryId,
        #[diesel(sql_type = SqlUuid)]
        lease_id: LeaseId,
    }
    if finished.is_empty() {
        return Ok(HashSet::new());
    }
    let mut account_ids = Vec::with_capacity(finished.len());
    let mut ids = Vec::with_capacity(finished.len());
    let mut leases = Vec::with_capacity(finished.len());
    let mut numbers = Vec::with_capacity(finished.len());
    let mut started = Vec::with_capacity(finished.len());
    let mut http_statuses = Vec::with_capacity(finished.len());
    let mut latencies = Vec::with_capacity(finished.len());
    let mut errors = Vec::with_capacity(finished.len());
    let mut statuses = Vec::with_capacity(finished.len());
    let mut next_attempts = Vec::with_capacity(finished.len());
    for one in finished {
        let (status, next_attempt_at) = match one.outcome {
            Outcome::Delivered => (DeliveryStatus::Delivered, None),
            Outcome::Retry(at) => (DeliveryStatus::Pending, Some(at)),
            Outcome::GiveUp => (DeliveryStatus::Failed, None),
        };
        account_ids.push(one.account_id);
        ids.push(one.delivery);
        leases.push(one.lease);
        numbers.push(one.attempt.number);
        started.push(one.attempt.started_at);
        http_statuses.push(one.attempt.http_status.and_then(|status| i16::try_from(status).ok()));
        latencies.push(one.attempt.latency_ms);
        errors.push(one.attempt.error.as_deref());
        statuses.push(status.as_str());
        next_attempts.push(next_attempt_at);
    }
    let applied: Vec<Applied> = diesel::sql_query(
        "WITH finished AS ( \
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::int4[], \
                 $5::timestamptz[], $6::int2[], $7::int4[], $8::text[], $9::text[], \
                 $10::timestamptz[]) \
             AS f(account_id, id, lease_id, attempt, started_at, http_status, latency_ms, error, \
                 status, next_attempt_at)), \
         attempts AS ( \
             INSERT INTO webhook_delivery_attempts \
                 (account_id, delivery_id, attempt, started_at, http_status, latency_ms, error) \
             SELECT account_id, id, attempt, started_at, http_status, latency_ms, error \
             FROM finished ON CONFLICT DO NOTHING), \
         held AS ( \
             SELECT d.account_id, d.id FROM webhook_deliveries AS d \
             JOIN finished AS f ON d.account_id = f.account_id AND d.id = f.id \
                 AND d.lease_id = f.lease_id \
             WHERE d.status = 'pending' \
             FOR NO KEY UPDATE OF d SKIP LOCKED) \
         UPDATE webhook_deliveries AS d SET status = f.status, next_attempt_at = f.next_attempt_at, \
             lease_id = NULL, lease_until = NULL, last_attempt_at = f.started_at, \
             last_status = f.http_status, last_error = f.error, \
             failing_since = CASE WHEN f.error IS NULL THEN d.failing_since \
                                  ELSE coalesce(d.failing_since, f.started_at) END, \
             updated_at = $11 \
         FROM finished AS f, held AS h \
         WHERE d.account_id = h.account_id AND d.id = h.id AND f.account_id = h.account_id \
             AND f.id = h.id AND d.status = 'pending' AND d.lease_id = f.lease_id \
         RETURNING d.id, f.lease_id",
    )
    .bind::<Array<SqlUuid>, _>(&account_ids)
    .bind::<Array<SqlUuid>, _>(&ids)
    .bind::<Array<SqlUuid>, _>(&leases)
    .bind::<Array<Int4>, _>(&numbers)
    .bind::<Array<Timestamptz>, _>(&started)
    .bind::<Array<Nullable<Int2>>, _>(&http_statuses)
    .bind::<Array<Int4>, _>(&latencies)
    .bind::<Array<Nullable<Text>>, _>(&errors)
    .bind::<Array<Text>, _>(&statuses)
    .bind::<Array<Nullable<Timestamptz>>, _>(&next_attempts)
    .bind::<Timestamptz, _>(now)
    .load(conn)
    .await?;
    Ok(applied.into_iter().map(|row| (row.id, row.lease_id)).collect())
}

/// An endpoint with failing deliveries: pending ones whose last attempt failed, and ones given
/// up on that no later delivery of the same event to it made up for.
#[derive(Debug, Clone, QueryableByName, Serialize)]
pub struct FailingEndpoint {
    #[diesel(sql_type = SqlUuid)]
    pub endpoint_id: EndpointId,
    #[diesel(sql_type = SqlUuid)]
    pub account_id: AccountId,
    #[diesel(sql_type = Text)]
    pub url: String,
    #[diesel(sql_type = BigInt)]
    pub failing_deliveries: i64,
    /// Of those, the ones given up on.
    #[diesel(sql_type = BigInt)]
    pub gave_up: i64,
    #[diesel(sql_type = Timestamptz)]
    pub failing_since: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    #[diesel(sql_type = Nullable<Int2>)]
    pub last_status: Option<i16>,
    /// The next attempt of a pending one; `None` when all were given up on.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// The live endpoints with failing deliveries, longest failing first.
pub async fn failing_endpoints(conn: &mut AsyncPgConnection) -> QueryResult<Vec<FailingEndpoint>> {
    diesel::sql_query(
        "WITH failing AS ( \
             SELECT d.* FROM webhook_deliveries AS d \
             WHERE d.failing_since IS NOT NULL AND (d.status = 'pending' OR ( \
                 d.status = 'failed' AND NOT EXISTS ( \
                     SELECT FROM webhook_deliveries AS later \
                     WHERE later.account_id = d.account_id AND later.endpoint_id = d.endpoint_id \
                         AND later.event_id = d.event_id AND later.status = 'delivered')))) \
         SELECT e.id AS endpoint_id, e.account_id, e.url, count(*) AS failing_deliveries, \
             count(*) FILTER (WHERE f.status = 'failed') AS gave_up, \
             min(f.failing_since) AS failing_since, \
             (array_agg(f.last_error ORDER BY f.last_attempt_at DESC NULLS LAST))[1] AS last_error, \
             (array_agg(f.last_status ORDER BY f.last_attempt_at DESC NULLS LAST))[1] AS last_status, \
             min(f.next_attempt_at) FILTER (WHERE f.status = 'pending') AS next_attempt_at \
         FROM failing AS f \
         JOIN webhook_endpoints AS e ON e.account_id = f.account_id AND e.id = f.endpoint_id \
             AND e.deleted_at IS NULL \
         GROUP BY e.account_id, e.id, e.url \
         ORDER BY failing_since, e.id",
    )
    .load(conn)
    .await
}
