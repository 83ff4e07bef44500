//! The delivery queue: the only code that knows the `webhook_deliveries` and
//! `webhook_delivery_attempts` tables (the endpoints are [`super::endpoints`]).
//!
//! The writers, one each: [`insert_deliveries`] (the relay, in its round; redeliveries),
//! [`claim_due`] (a worker leases due ones, counting an attempt), [`record_finished`] (a batch of
//! attempts' outcomes, each under its own lease, with the attempts' rows). Deleting an endpoint
//! cancels its pending deliveries ([`super::endpoints::delete_endpoint`]); [`super::retention`]
//! sweeps finished ones.
//!
//! Lock order (docs/architecture.md): an endpoint row, then deliveries, then attempts.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use super::{DeliveryOrigin, DeliveryStatus};
use crate::db::schema::webhook_deliveries;
use crate::events::{Event, EventType};
use crate::ids::{AccountId, DeliveryId, EndpointId, EventId, LeaseId};
use crate::operations::leases::Lease;

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
#[derive(Debug, Clone, Queryable)]
pub struct Claimed {
    pub account_id: AccountId,
    pub id: DeliveryId,
    pub endpoint_id: EndpointId,
    pub event_id: EventId,
    /// This attempt's number.
    pub attempt: i32,
    pub url: String,
    /// `None` once the endpoint is deleted (its deliveries are being canceled).
    pub secret: Option<Vec<u8>>,
    /// The secret before the last rotation, while it still signs.
    pub previous_secret: Option<Vec<u8>>,
    /// The event's type, stored JSON and time; `None` once it is gone past its retention.
    pub event_type: Option<EventType>,
    pub event_data: Option<Vec<u8>>,
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
    ClaimDue { now: &now, limit, lease_id: lease.id, lease_until: &lease.until }.load(conn).await
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
    let applied: Vec<(DeliveryId, LeaseId)> = RecordFinished {
        account_ids: &account_ids,
        ids: &ids,
        leases: &leases,
        numbers: &numbers,
        started: &started,
        http_statuses: &http_statuses,
        latencies: &latencies,
        errors: &errors,
        statuses: &statuses,
        next_attempts: &next_attempts,
        now: &now,
    }
    .load(conn)
    .await?;
    Ok(applied.into_iter().collect())
}

/// An endpoint with failing deliveries: pending ones whose last attempt failed, and ones given
/// up on that no later delivery of the same event to it made up for.
#[derive(Debug, Clone, Queryable, Serialize)]
pub struct FailingEndpoint {
    pub endpoint_id: EndpointId,
    pub account_id: AccountId,
    pub url: String,
    pub failing_deliveries: i64,
    /// Of those, the ones given up on.
    pub gave_up: i64,
    pub failing_since: DateTime<Utc>,
    pub last_error: Option<String>,
    pub last_status: Option<i16>,
    /// The next attempt of a pending one; `None` when all were given up on.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// The live endpoints with failing deliveries, longest failing first.
pub async fn failing_endpoints(conn: &mut AsyncPgConnection) -> QueryResult<Vec<FailingEndpoint>> {
    FailingEndpoints.load(conn).await
}

crate::prepared_statement! {
    /// Due deliveries leased with all their sends need (`sql/claim_due.sql`).
    pub(crate) struct ClaimDue<'a>("sql/claim_due.sql")
        -> (Uuid, Uuid, Uuid, Uuid, Int4, Text, Nullable<Bytea>, Nullable<Bytea>, Nullable<Text>, Nullable<Bytea>, Nullable<Timestamptz>)
    {
        1 => now: &'a DateTime<Utc> as Timestamptz,
        2 => limit: i64 as BigInt,
        3 => lease_id: LeaseId as Uuid,
        4 => lease_until: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    /// A batch of finished attempts recorded (`sql/record_finished.sql`).
    pub(crate) struct RecordFinished<'a>("sql/record_finished.sql") -> (Uuid, Uuid) {
        1 => account_ids: &'a [AccountId] as Array<Uuid>,
        2 => ids: &'a [DeliveryId] as Array<Uuid>,
        3 => leases: &'a [LeaseId] as Array<Uuid>,
        4 => numbers: &'a [i32] as Array<Int4>,
        5 => started: &'a [DateTime<Utc>] as Array<Timestamptz>,
        6 => http_statuses: &'a [Option<i16>] as Array<Nullable<Int2>>,
        7 => latencies: &'a [i32] as Array<Int4>,
        8 => errors: &'a [Option<&'a str>] as Array<Nullable<Text>>,
        9 => statuses: &'a [&'static str] as Array<Text>,
        10 => next_attempts: &'a [Option<DateTime<Utc>>] as Array<Nullable<Timestamptz>>,
        11 => now: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    /// The endpoints with failing deliveries (`sql/failing_endpoints.sql`).
    pub(crate) struct FailingEndpoints("sql/failing_endpoints.sql")
        -> (Uuid, Uuid, Text, BigInt, BigInt, Timestamptz, Nullable<Text>, Nullable<Int2>, Nullable<Timestamptz>);
}
