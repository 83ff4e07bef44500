//! The provider's webhooks, the third driver of provider operations beside the request and the
//! reconciler: the provider tells us, usually within a second, that a charge or refund reached a
//! final state, and the operation in flight settles through the same statement the other drivers
//! use. The reconciler stays the safety net for every event that never arrives.
//!
//! The HTTP layer (`http::webhooks`) verifies the signature over the raw bytes and reads the
//! event ([`Event::parse`]); [`receive`] applies it in one transaction:
//!
//! 1. the event's row goes in first (`provider_webhooks`, keyed by the provider's event id, the
//!    `webhook-id`). It is a brand-new row, first in the lock order (docs/architecture.md), and
//!    conflicts only with another delivery of the same event, which waits for this transaction
//!    and then finds it: a second delivery changes nothing ([`Received::Duplicate`]);
//! 2. the operation is found from the downstream key the object carries (no scan): a charge's
//!    key names the payment (`orderpay_pay_<id>`; captures and voids arrive as the charge too),
//!    a refund's key the refund; the account comes from an index on the id;
//! 3. the kind's settle runs on the same connection (`Kind::settle_on`, actor `webhook`),
//!    guarded like every settle: final states absorb, so an event for an operation that another
//!    driver settled first (or an older event arriving late) changes nothing
//!    ([`Received::Stale`]); an authorization that ended while nothing of ours was in flight
//!    goes through `authorization::end_on`, as the reconciler's watch does;
//! 4. the row notes what the event did, and everything commits together: an effect that rolls
//!    back takes its row with it, so the provider's retry applies it.
//!
//! Events for objects that are not ours are kept (so their copies count as duplicates) and
//! ignored ([`Received::Unknown`]).

use chrono::{DateTime, SubsecRound, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::authorization::{self, Actions, Held as HeldAction, charge_state};
use super::charge::{self, Charges};
use super::leases::{self, Table};
use super::refund::{self, Refunds};
use super::{Actor, EngineError, Finding, Kind, Recorded};
use crate::db::Pool;
use crate::db::schema::provider_webhooks;
use crate::ids::AccountId;
use crate::payments::authorization as actions;
use crate::payments::repository as payments;
use crate::payments::{PaymentStatus, payment_of_downstream_key};
use crate::provider::wire::{ChargeBody, RefundBody, event_type};
use crate::provider::{Charge, ChargeStatus, Refund as ProviderRefund};
use crate::refunds::repository as refunds;
use crate::refunds::{RefundStatus, refund_of_downstream_key};

/// The longest text kept in a row's `id`, `event_type` and `object_id`.
const MAX_TEXT: usize = 255;

/// A verified event, read.
#[derive(Debug, Clone)]
pub struct Event {
    /// The provider's event id (`webhook-id`): the same on every delivery of one event.
    pub id: String,
    /// Its type as sent (`charge.succeeded`, ...).
    pub kind: String,
    pub object: Object,
}

/// What an event is about.
#[derive(Debug, Clone)]
pub enum Object {
    /// A charge, as the provider's `GET /v1/charges/{id}` returns it, and what it says.
    Charge { body: Box<ChargeBody>, charge: Charge },
    /// A refund, as `GET /v1/refunds/{id}` returns it, and what it says.
    Refund { body: Box<RefundBody>, refund: ProviderRefund },
    /// An event type we do not act on (a receiver must tolerate new ones): its object's id.
    Other { id: String },
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    data: EnvelopeData,
}

#[derive(Deserialize)]
struct EnvelopeData {
    object: Value,
}

impl Event {
    /// Reads a verified event body, `{id, type, created, data: {object}}`: the object of a type
    /// we act on must be a charge or a refund as the provider reports them. `Err` says what is
    /// wrong (the provider's format changed: a person must look; its retries change nothing).
    pub fn parse(id: String, body: Value) -> Result<Event, String> {
        let envelope: Envelope =
            serde_json::from_value(body).map_err(|error| format!("not a webhook event: {error}"))?;
        if envelope.kind.is_empty()
            || envelope.kind.len() > MAX_TEXT
            || !envelope.kind.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err("type must be 1 to 255 visible ASCII characters".to_owned());
        }
        let object = match envelope.kind.as_str() {
            event_type::CHARGE_SUCCEEDED
            | event_type::CHARGE_FAILED
            | event_type::CHARGE_CAPTURED
            | event_type::CHARGE_CANCELED => {
                let body: ChargeBody = serde_json::from_value(envelope.data.object)
                    .map_err(|error| format!("data.object is not a charge: {error}"))?;
                let charge = body.to_charge().map_err(|error| format!("data.object: {error}"))?;
                Object::Charge { body: Box::new(body), charge }
            }
            event_type::REFUND_SUCCEEDED | event_type::REFUND_FAILED => {
                let body: RefundBody = serde_json::from_value(envelope.data.object)
                    .map_err(|error| format!("data.object is not a refund: {error}"))?;
                let refund = body.to_refund().map_err(|error| format!("data.object: {error}"))?;
                Object::Refund { body: Box::new(body), refund }
            }
            _ => {
                let id = envelope.data.object.get("id").and_then(Value::as_str).unwrap_or_default();
                Object::Other { id: id.to_owned() }
            }
        };
        Ok(Event { id, kind: envelope.kind, object })
    }

    /// The provider's id of the object, as kept on the event's row (empty when it is not a
    /// short visible ASCII text, which no id of the provider's is).
    fn object_id(&self) -> &str {
        let id = match &self.object {
            Object::Charge { body, .. } => body.id.as_str(),
            Object::Refund { body, .. } => body.id.as_str(),
            Object::Other { id } => id.as_str(),
        };
        if id.len() <= MAX_TEXT && id.bytes().all(|b| b.is_ascii_graphic()) { id } else { "" }
    }
}

/// What one delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// It moved an operation to its final state.
    Applied,
    /// The event was received before: nothing changed.
    Duplicate,
    /// Nothing to move: its operation had settled (final states absorb), or the event reports
    /// no final state.
    Stale,
    /// Not about an operation of ours (or a type we do not act on): ignored.
    Unknown,
}

impl Received {
    /// Its name in `provider_webhooks.result`, the metric and the answer.
    pub const fn as_str(self) -> &'static str {
        match self {
            Received::Applied => "applied",
            Received::Duplicate => "duplicate",
            Received::Stale => "stale",
            Received::Unknown => "unknown",
        }
    }
}

/// The operation an event was about.
#[derive(Debug, Clone, Copy)]
struct Subject {
    account_id: AccountId,
    /// As `payment_events.subject` names it: payment, capture, void, refund.
    kind: &'static str,
    id: Uuid,
}

/// Applies a verified event (see the module doc), once per event id. Returns what it did once
/// committed; an error (the database away) rolls everything back, the event's row included, so
/// the provider's retry applies it.
pub async fn receive(pool: &Pool, event: &Event) -> Result<Received, EngineError> {
    let mut conn = pool.get().await?;
    let received_at = Utc::now().trunc_subsecs(6);
    let (received, subject) = conn
        .transaction(async |conn| {
            if !record(conn, event, received_at).await? {
                return Ok::<_, EngineError>((Received::Duplicate, None));
            }
            let (received, subject) = apply(conn, event).await?;
            note(conn, &event.id, received, subject).await?;
            Ok((received, subject))
        })
        .await?;
    // Logged and counted once committed. (A settle that applied has logged and counted its own
    // transition already, inside the transaction: on the rare commit that fails after it, that
    // line and count stand for a transition the provider's retry then applies.)
    let (event_id, event_type, object_id) = (&event.id, &event.kind, event.object_id());
    // `payment <id>`, `capture <id>`, ...: what it was about, when it is ours.
    let (account_id, subject) = subject.map_or((String::new(), String::new()), |subject| {
        (subject.account_id.to_string(), format!("{} {}", subject.kind, subject.id))
    });
    match received {
        Received::Applied => {
            tracing::info!(%event_id, %event_type, object_id, %account_id, %subject, "provider webhook applied")
        }
        Received::Duplicate => {
            tracing::info!(%event_id, %event_type, object_id, "provider webhook received before; nothing changed")
        }
        Received::Stale => tracing::info!(%event_id, %event_type, object_id, %account_id, %subject,
            "provider webhook changed nothing: its operation had settled, or it reports no final state"),
        Received::Unknown => {
            tracing::warn!(%event_id, %event_type, object_id, "provider webhook about nothing of ours; ignored")
        }
    }
    crate::telemetry::metrics::provider_webhook(received.as_str());
    Ok(received)
}

/// Inserts the event's row; false when it is there already (another delivery of the event; one
/// still uncommitted is waited for). The only writer of new `provider_webhooks` rows.
async fn record(conn: &mut AsyncPgConnection, event: &Event, at: DateTime<Utc>) -> QueryResult<bool> {
    let inserted = diesel::insert_into(provider_webhooks::table)
        .values((
            provider_webhooks::id.eq(&event.id),
            provider_webhooks::event_type.eq(&event.kind),
            provider_webhooks::object_id.eq(event.object_id()),
            provider_webhooks::result.eq("received"),
            provider_webhooks::received_at.eq(at),
        ))
        .on_conflict_do_nothing()
        .execute(conn)
        .await?;
    Ok(inserted == 1)
}

/// Deletes up to `batch_size` event rows received before `before` (kept as long as the events:
/// the provider retries an event for days, not weeks, and a copy arriving after its row went
/// finds its operation settled and changes nothing). Returns how many.
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    before: DateTime<Utc>,
    batch_size: i64,
) -> QueryResult<usize> {
    diesel::sql_query(
        "DELETE FROM provider_webhooks WHERE id IN ( \
             SELECT id FROM provider_webhooks WHERE received_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
    )
    .bind::<diesel::sql_types::Timestamptz, _>(before)
    .bind::<diesel::sql_types::BigInt, _>(batch_size)
    .execute(conn)
    .await
}

/// Notes on the event's row (inserted by this transaction) what the event did.
async fn note(
    conn: &mut AsyncPgConnection,
    id: &str,
    received: Received,
    subject: Option<Subject>,
) -> QueryResult<()> {
    diesel::update(provider_webhooks::table.find(id))
        .set((
            provider_webhooks::result.eq(received.as_str()),
            provider_webhooks::account_id.eq(subject.map(|s| s.account_id)),
            provider_webhooks::subject.eq(subject.map(|s| s.kind)),
            provider_webhooks::subject_id.eq(subject.map(|s| s.id)),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

type Applied = (Received, Option<Subject>);

async fn apply(conn: &mut AsyncPgConnection, event: &Event) -> Result<Applied, EngineError> {
    match &event.object {
        Object::Charge { body, charge } => apply_charge(conn, body, charge).await,
        Object::Refund { body, refund } => apply_refund(conn, body, refund).await,
        Object::Other { .. } => Ok((Received::Unknown, None)),
    }
}

/// `None`: a settle that changed nothing (only a give-up is ever held back, and webhooks bring
/// outcomes, never give-ups).
fn settled(recorded: Option<Recorded>, subject: Subject) -> Applied {
    let received =
        if recorded.is_some_and(|recorded| recorded.applied) { Received::Applied } else { Received::Stale };
    (received, Some(subject))
}

/// A charge event (`charge.succeeded`, `.failed`, `.captured`, `.canceled`): what the charge's
/// state means for whichever of the payment's operations is in flight. The charge's state is the
/// event (a snapshot of the charge when it happened), whatever its type says.
async fn apply_charge(
    conn: &mut AsyncPgConnection,
    body: &ChargeBody,
    charge: &Charge,
) -> Result<Applied, EngineError> {
    let Some(payment_id) = payment_of_downstream_key(&body.idempotency_key) else {
        return Ok((Received::Unknown, None));
    };
    let Some(account_id) = payments::account_of(conn, payment_id).await? else {
        return Ok((Received::Unknown, None));
    };
    let id = (account_id, payment_id.as_uuid());
    let Some(payment) = <Charges as Kind>::load(conn, id).await? else {
        return Ok((Received::Unknown, None));
    };
    let subject = Subject { account_id, kind: "payment", id: payment_id.as_uuid() };
    if payment.provider_charge_id.as_deref().is_some_and(|known| known != charge.id) {
        tracing::error!(%payment_id, known = ?payment.provider_charge_id, event_charge = %charge.id,
            "a webhook names another charge for this payment's key; ignored, check it at the provider");
        return Ok((Received::Stale, Some(subject)));
    }
    // The payment's own charge (or authorization) in flight: it has no answer yet.
    let charge_in_flight = leases::standing(conn, Table::Payments, id)
        .await?
        .is_some_and(|standing| standing.answer().is_none());
    if charge_in_flight {
        return match charge::outcome_of(&payment, Ok(charge.clone())) {
            Finding::Final(outcome) => Ok(settled(
                <Charges as Kind>::settle_on(conn, &payment, outcome, Actor::Webhook).await?,
                subject,
            )),
            // Pending (or a state that is no outcome for this payment): nothing to record.
            Finding::Unknown { .. } | Finding::NotReceived => Ok((Received::Stale, Some(subject))),
        };
    }
    // A capture or void in flight: the charge's state is its outcome too.
    if let Some(operation) = actions::in_flight(conn, account_id, payment.id).await? {
        let subject = Subject { account_id, kind: operation.kind.as_str(), id: operation.id.as_uuid() };
        return match charge_state(operation.kind, charge.clone()) {
            Finding::Final(outcome) => {
                let held = HeldAction { operation, payment };
                Ok(settled(
                    <Actions as Kind>::settle_on(conn, &held, outcome, Actor::Webhook).await?,
                    subject,
                ))
            }
            // Still authorized (the capture or void has not happened yet), or not final.
            Finding::Unknown { .. } | Finding::NotReceived => Ok((Received::Stale, Some(subject))),
        };
    }
    // An authorization that ended with nothing of ours in flight: it expired (or was voided or
    // captured at the provider directly).
    if payment.status == PaymentStatus::RequiresCapture {
        let ended = authorization::end_on(conn, &payment, charge, Actor::Webhook).await?;
        let received = if ended == Some(true) { Received::Applied } else { Received::Stale };
        return Ok((received, Some(subject)));
    }
    if payment.status == PaymentStatus::Failed && charge.status == ChargeStatus::Succeeded {
        // Money taken for a payment we failed (a charge that landed after the reconciler gave
        // up): final states absorb; the late-charge watch refunds it (`operations::late_charge`),
        // brought forward to its next pass rather than its backoff's (the refund needs a
        // provider call, which never runs inside this transaction).
        let watched = payments::watch_late_now(conn, account_id, payment_id, Utc::now()).await?;
        tracing::warn!(%payment_id, charge_id = %charge.id, watched,
            "the provider reports a succeeded charge for a failed payment; the late-charge watch refunds it on its next pass");
    }
    Ok((Received::Stale, Some(subject)))
}

/// A refund event (`refund.succeeded`, `refund.failed`): the refund in flight settles.
async fn apply_refund(
    conn: &mut AsyncPgConnection,
    body: &RefundBody,
    refund: &ProviderRefund,
) -> Result<Applied, EngineError> {
    let Some(refund_id) = refund_of_downstream_key(&body.idempotency_key) else {
        return Ok((Received::Unknown, None));
    };
    let Some(account_id) = refunds::account_of(conn, refund_id).await? else {
        return Ok((Received::Unknown, None));
    };
    let Some(held) = <Refunds as Kind>::load(conn, (account_id, refund_id.as_uuid())).await? else {
        return Ok((Received::Unknown, None));
    };
    let subject = Subject { account_id, kind: "refund", id: refund_id.as_uuid() };
    if held.refund.status != RefundStatus::Processing {
        return Ok((Received::Stale, Some(subject)));
    }
    match refund::outcome_of(Ok(refund.clone())) {
        Finding::Final(outcome) => {
            Ok(settled(<Refunds as Kind>::settle_on(conn, &held, outcome, Actor::Webhook).await?, subject))
        }
        Finding::Unknown { .. } | Finding::NotReceived => Ok((Received::Stale, Some(subject))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn charge_object() -> Value {
        json!({
            "id": "ch_1", "object": "charge", "idempotency_key": "orderpay_pay_x", "amount": "10.00",
            "currency": "USD", "status": "succeeded", "captured": true, "amount_captured": "10.00",
            "amount_refunded": "0.00", "payment_method": "pm_card_ok", "reference": "r",
            "decline_code": null, "failure_message": null, "cancellation_reason": null,
            "authorization_expires_at": null, "created_at": "2030-01-01T00:00:00Z"
        })
    }

    fn event(kind: &str, object: Value) -> Value {
        json!({ "id": "evt_1", "type": kind, "created": 1, "data": { "object": object } })
    }

    #[test]
    fn known_types_need_their_object_and_others_are_tolerated() {
        let parsed = Event::parse("evt_1".into(), event("charge.succeeded", charge_object())).unwrap();
        assert!(
            matches!(parsed.object, Object::Charge { ref charge, .. } if charge.status == ChargeStatus::Succeeded)
        );
        assert_eq!(parsed.object_id(), "ch_1");

        // A charge event whose object is no charge, or whose status we cannot read.
        assert!(Event::parse("evt_1".into(), event("charge.failed", json!({"id": "re_1"}))).is_err());
        let mut unknown_status = charge_object();
        unknown_status["status"] = json!("authorized");
        assert!(Event::parse("evt_1".into(), event("charge.succeeded", unknown_status)).is_err());
        assert!(Event::parse("evt_1".into(), event("refund.succeeded", charge_object())).is_err());
        // Not an event at all, or a type that cannot be stored.
        assert!(Event::parse("evt_1".into(), json!({"hello": "world"})).is_err());
        assert!(Event::parse("evt_1".into(), event("", charge_object())).is_err());
        assert!(Event::parse("evt_1".into(), event("has space", charge_object())).is_err());

        let other = Event::parse("evt_2".into(), event("customer.created", json!({"id": "cus_1"}))).unwrap();
        assert!(matches!(other.object, Object::Other { ref id } if id == "cus_1"));
        let odd_id = Event::parse("evt_3".into(), event("payout.paid", json!({"id": "a\u{0}b"}))).unwrap();
        assert_eq!(odd_id.object_id(), "", "an id that cannot be stored as text is left out");
    }
}
