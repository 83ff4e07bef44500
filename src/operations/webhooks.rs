//! The provider's webhooks, the third driver of provider operations beside the request and the
//! reconciler: the provider tells us, usually within a second, that a charge or refund reached a
//! final state, and the operation in flight settles through the same statement the other drivers
//! use. The reconciler stays the safety net for every event that never arrives.
//!
//! The HTTP layer (`http::webhooks`) verifies the signature over the raw bytes and has the
//! provider's wire read the event into an [`Event`] (`provider::wire::read_event` for the mock,
//! `provider::stripe::events::read_event` for Stripe); [`receive`] applies it in one transaction:
//!
//! 1. the event's row goes in first (`provider_webhooks`, keyed by the provider's event id: the
//!    mock's `webhook-id`, Stripe's `evt_...`). It is a brand-new row, first in the lock order (docs/architecture.md), and
//!    conflicts only with another delivery of the same event, which waits for this transaction
//!    and then finds it: a second delivery changes nothing ([`Received::Duplicate`]);
//! 2. the operation is found from what the object carries of ours (no scan): on the mock a
//!    charge's downstream key names the payment (`orderpay_pay_<id>`; captures and voids arrive
//!    as the charge too) and a refund's key the refund, on Stripe the metadata orderpay put on
//!    the PaymentIntent and the Refund; the account comes from an index on the id; a dispute
//!    names the provider's charge, whose payment is found by an index on it;
//! 3. the kind's settle runs on the same connection (`Kind::settle_on`, actor `webhook`),
//!    guarded like every settle: final states absorb, so an event for an operation that another
//!    driver settled first (or an older event arriving late) changes nothing
//!    ([`Received::Stale`]); an authorization that ended while nothing of ours was in flight
//!    goes through `authorization::end_on`, as the reconciler's watch does;
//! 4. the row notes what the event did, and everything commits together: an effect that rolls
//!    back takes its row with it, so the provider's retry applies it.
//!
//! A dispute's events (`charge.dispute.*`) are recorded as the provider's lookup of the dispute
//! says (`disputes::record`), never as the event says: an event that says nothing new about
//! a dispute we hold asks nothing and changes nothing.
//!
//! Events for objects that are not ours are kept (so their copies count as duplicates) and
//! ignored ([`Received::Unknown`]).

use chrono::{DateTime, SubsecRound, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::authorization::{self, Actions, Held as HeldAction, charge_state};
use super::charge::{self, Charges};
use super::late_refund::{self, Corrected, Correction};
use super::leases::{self, Table};
use super::refund::{self, Held, Refunds};
use super::{Actor, Engine, EngineError, Finding, Kind, Recorded};
use crate::db::schema::provider_webhooks;
use crate::disputes::record::{self as disputes, Recorded as DisputeRecorded};
use crate::disputes::repository::{RecordOutcome, find_by_provider_id};
use crate::ids::AccountId;
use crate::ids::{PaymentId, RefundId};
use crate::payments::authorization as actions;
use crate::payments::repository as payments;
use crate::payments::watches;
use crate::payments::{CaptureMethod, Payment, PaymentStatus};
pub use crate::provider::event::{Event, Object};
use crate::provider::{
    Charge, ChargeLookup, ChargeStatus, Dispute as ProviderDispute, Refund as ProviderRefund,
    RefundStatus as ProviderRefundStatus,
};
use crate::refunds::RefundStatus;
use crate::refunds::repository as refunds;

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
    /// Its object disagreed with the operation it names (another charge, currency or amount):
    /// the provider was asked, and what it said (if anything) was applied instead.
    Mismatch,
}

impl Received {
    /// Its name in `provider_webhooks.result`, the metric and the answer.
    pub const fn as_str(self) -> &'static str {
        match self {
            Received::Applied => "applied",
            Received::Duplicate => "duplicate",
            Received::Stale => "stale",
            Received::Unknown => "unknown",
            Received::Mismatch => "mismatch",
        }
    }
}

/// The operation an event was about.
#[derive(Debug, Clone, Copy)]
struct Subject {
    account_id: AccountId,
    /// Where its row is, for an operation (a request waiting on it hears of its settle).
    table: Option<Table>,
    /// As `payment_events.subject` names it: payment, capture, void, refund.
    kind: &'static str,
    id: Uuid,
}

/// What to ask the provider to verify an event: by our own downstream key, never by anything
/// the event names. The reconciler's own lookups (reads only: nothing is ever created or changed
/// at the provider by a verification).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verify {
    /// The charge made for a payment's downstream key: read by the provider's id once the payment
    /// holds it (one read; on Stripe, a lookup by key lists a window of PaymentIntents), else
    /// found by the key.
    Charge { lookup: ChargeLookup, id: Option<String> },
    /// The refund made for a refund's downstream key, among its charge's refunds when we hold
    /// the charge's id.
    Refund { key: String, charge_id: Option<String> },
    /// A dispute, by the provider's id (a dispute has no key of ours).
    Dispute(String),
}

/// The provider's answer to a verification.
#[derive(Debug, Clone)]
enum Verified {
    Charge(Charge),
    Refund(ProviderRefund),
    Dispute(Box<ProviderDispute>),
    /// It holds nothing for our key.
    Absent,
}

/// Where applying an event stands.
enum Step {
    Done(Received, Option<Subject>),
    /// Its word alone does not move money: ask the provider, then apply what it says. `why` is
    /// how the event's object disagreed with ours, when it did.
    Verify {
        what: Verify,
        why: Option<String>,
    },
}

/// Why an event's transaction was rolled back.
enum Abort {
    Verify { what: Verify, why: Option<String> },
    Engine(EngineError),
}

impl From<diesel::result::Error> for Abort {
    fn from(error: diesel::result::Error) -> Self {
        Abort::Engine(error.into())
    }
}

impl From<EngineError> for Abort {
    fn from(error: EngineError) -> Self {
        Abort::Engine(error)
    }
}

/// Applies a verified event (see the module doc), once per event id. An event that would move
/// money (settle an operation in flight, end an authorization, correct a refund), or whose
/// object disagrees with the operation, is applied on the provider's word: the transaction rolls
/// back, the provider is asked (one lookup per operation in flight, shared with the
/// reconciler's), and the event is applied again with the provider's answer. An event that
/// changes nothing (a duplicate, one about an operation already settled) asks nothing. Returns what it did once committed; an error (the database away, the
/// provider not answering a verification) rolls everything back, the event's row included, so the
/// provider's retry applies it.
pub async fn receive(engine: &Engine, event: &Event) -> Result<Received, EngineError> {
    let received_at = Utc::now().trunc_subsecs(6);
    let (mut verified, mut mismatch) = (None, None);
    let (received, subject, moved) = loop {
        // The connection goes back to the pool before a verification asks the provider.
        let done = engine
            .pool
            .get()
            .await?
            .transaction(async |conn| {
                if !record(conn, event, received_at).await? {
                    return Ok::<_, Abort>((Received::Duplicate, None, false));
                }
                let (received, subject) = match apply(conn, engine, event, verified.as_ref()).await? {
                    Step::Done(received, subject) => (received, subject),
                    Step::Verify { what, why } => return Err(Abort::Verify { what, why }),
                };
                let moved = received == Received::Applied;
                let received = if mismatch.is_some() { Received::Mismatch } else { received };
                note(conn, &event.id, received, subject).await?;
                Ok((received, subject, moved))
            })
            .await;
        match done {
            Ok(done) => break done,
            Err(Abort::Verify { what, why }) if verified.is_none() => {
                if let Some(why) = &why {
                    tracing::warn!(event_id = %event.id, event_type = %event.kind, object_id = event.object_id(),
                        disagreement = %why, "a provider webhook disagrees with our operation; asking the provider");
                }
                mismatch = why;
                verified = Some(verify(engine, &what).await?);
            }
            Err(Abort::Verify { what, .. }) => {
                return Err(EngineError::Inconsistent(format!("{what:?} asked twice for one event")));
            }
            Err(Abort::Engine(error)) => return Err(error),
        }
    };
    // A request of this process waiting on its provider call for this operation answers now.
    if let (true, Some(Subject { table: Some(table), id, .. })) = (moved, subject) {
        super::settled::tell(table, id);
    }
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
            tracing::info!(%event_id, %event_type, object_id, %account_id, %subject, verified = verified.is_some(),
                "provider webhook applied")
        }
        Received::Duplicate => {
            tracing::info!(%event_id, %event_type, object_id, "provider webhook received before; nothing changed")
        }
        Received::Stale => tracing::info!(%event_id, %event_type, object_id, %account_id, %subject,
            "provider webhook changed nothing: its operation had settled, or it reports no final state"),
        Received::Unknown => {
            tracing::warn!(%event_id, %event_type, object_id, "provider webhook about nothing of ours; ignored")
        }
        Received::Mismatch => tracing::error!(%event_id, %event_type, object_id, %account_id, %subject,
            event = ?event.object, provider = ?verified, moved,
            "provider webhook disagreed with our operation; the provider's own word was applied instead of it"),
    }
    crate::telemetry::metrics::provider_webhook(received.as_str());
    Ok(received)
}

/// Asks the provider what it holds for our key (a read: the reconciler's own lookup).
async fn verify(engine: &Engine, what: &Verify) -> Result<Verified, EngineError> {
    let provider = engine.provider.as_ref();
    let unverified = |error: crate::provider::ProviderError| EngineError::Unverified(error.to_string());
    Ok(match what {
        Verify::Charge { lookup, id } => {
            let found = match id {
                Some(id) => provider.get_charge(id, None).await,
                None => provider.find_charge(lookup, None).await,
            };
            match found.map_err(unverified)? {
                Some(charge) => Verified::Charge(charge),
                None => Verified::Absent,
            }
        }
        Verify::Refund { key, charge_id } => {
            match provider.find_refund(key, charge_id.as_deref(), None).await.map_err(unverified)? {
                Some(refund) => Verified::Refund(refund),
                None => Verified::Absent,
            }
        }
        Verify::Dispute(id) => match provider.get_dispute(id, None).await.map_err(unverified)? {
            Some(dispute) => Verified::Dispute(Box::new(dispute)),
            None => Verified::Absent,
        },
    })
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
    SweepProviderWebhooks { before: &before, batch_size }.execute(conn).await
}

crate::prepared_statement! {
    /// Received provider webhooks past their retention deleted (`sweep_provider_webhooks.sql`).
    pub(crate) struct SweepProviderWebhooks<'a>("sweep_provider_webhooks.sql") -> () {
        1 => before: &'a DateTime<Utc> as Timestamptz,
        2 => batch_size: i64 as BigInt,
    }
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

async fn apply(
    conn: &mut AsyncPgConnection,
    engine: &Engine,
    event: &Event,
    verified: Option<&Verified>,
) -> Result<Step, EngineError> {
    match &event.object {
        Object::Charge { payment, charge, .. } => {
            apply_charge(conn, engine, *payment, charge, verified).await
        }
        Object::Refund { refund, provider_refund, .. } => {
            apply_refund(conn, *refund, provider_refund, verified).await
        }
        Object::Dispute { dispute } => apply_dispute(conn, dispute, verified).await,
        Object::Other { .. } => Ok(Step::Done(Received::Unknown, None)),
    }
}

/// `None`: a settle that changed nothing (only a give-up is ever held back, and webhooks bring
/// outcomes, never give-ups).
fn settled(recorded: Option<Recorded>, subject: Subject) -> Step {
    let received =
        if recorded.is_some_and(|recorded| recorded.applied) { Received::Applied } else { Received::Stale };
    Step::Done(received, Some(subject))
}

/// How an event's charge disagrees with the payment it names, if it does: another charge than
/// the one we hold, another currency or amount, an automatic charge captured for anything but
/// all of it.
fn charge_disagreement(payment: &Payment, charge: &Charge) -> Option<String> {
    if let Some(known) = payment.provider_charge_id.as_deref().filter(|known| *known != charge.id) {
        return Some(format!("names charge {}, the payment's is {known}", charge.id));
    }
    match payment.capture_method {
        CaptureMethod::Automatic => charge::disagreement(payment, charge),
        CaptureMethod::Manual => authorization::captured_disagreement(payment, charge),
    }
}

/// A charge event (`charge.succeeded`, `.failed`, `.captured`, `.canceled`): what the charge's
/// state means for whichever of the payment's operations is in flight. The charge's state is the
/// event (a snapshot of the charge when it happened), whatever its type says. Nothing is applied
/// on the event's word: an outcome for an operation in flight, an end of an authorization
/// (canceled, expired, captured), a capture's amount, anything that disagrees, is applied as the
/// provider's lookup (`verified`) says. The event only says when to ask.
async fn apply_charge(
    conn: &mut AsyncPgConnection,
    engine: &Engine,
    payment: Option<PaymentId>,
    event_charge: &Charge,
    verified: Option<&Verified>,
) -> Result<Step, EngineError> {
    let Some(payment_id) = payment else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let Some(account_id) = payments::account_of(conn, payment_id).await? else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let id = (account_id, payment_id.as_uuid());
    let Some(payment) = <Charges as Kind>::load(conn, id).await? else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let subject =
        Subject { account_id, table: Some(Table::Payments), kind: "payment", id: payment_id.as_uuid() };
    let verify = Verify::Charge { lookup: payment.charge_lookup(), id: payment.provider_charge_id.clone() };
    let charge = match verified {
        Some(Verified::Charge(charge)) => charge,
        Some(Verified::Refund(_) | Verified::Dispute(_) | Verified::Absent) => {
            return Ok(Step::Done(Received::Stale, Some(subject)));
        }
        None => event_charge,
    };
    let trusted = verified.is_some();
    if let Some(why) = charge_disagreement(&payment, charge) {
        if !trusted {
            return Ok(Step::Verify { what: verify, why: Some(why) });
        }
        // The provider's own charge for our key disagrees with the payment: not recorded on a
        // guess; the reconciler's look finds the same and the payment waits for a person.
        tracing::error!(%payment_id, disagreement = %why, "the provider's charge disagrees with the payment");
        return Ok(Step::Done(Received::Stale, Some(subject)));
    }
    let ask = Step::Verify { what: verify, why: None };
    // The payment's own charge (or authorization) in flight: it has no answer yet. Its status
    // tells, not its body: the body may be read from an event the retention sweep has deleted.
    let charge_in_flight = leases::standing(conn, Table::Payments, id)
        .await?
        .is_some_and(|standing| standing.answer_status().is_none());
    if charge_in_flight {
        return match charge::outcome_of(&payment, Ok(charge.clone())) {
            // Every outcome is the provider's confirmed word, never the event's alone: before
            // we know the charge's id, an event naming our key with any charge id could
            // otherwise settle a payment the provider declined (or fail one it charged).
            Finding::Final(_) if !trusted => Ok(ask),
            Finding::Final(outcome) => Ok(settled(
                <Charges as Kind>::settle_on(conn, &payment, outcome, Actor::Webhook).await?,
                subject,
            )),
            // Pending (or a state that is no outcome for this payment): nothing to record.
            Finding::Unknown { .. }
            | Finding::NotReceived
            | Finding::Unsent { .. }
            | Finding::KeyConflict { .. } => Ok(Step::Done(Received::Stale, Some(subject))),
        };
    }
    // A capture or void in flight: the charge's state is its outcome too, asked first (a capture
    // sets what is taken, a void releases the authorization).
    if let Some(operation) = actions::in_flight(conn, account_id, payment.id).await? {
        let subject = Subject {
            account_id,
            table: Some(Table::PaymentOperations),
            kind: operation.kind.as_str(),
            id: operation.id.as_uuid(),
        };
        return match charge_state(operation.kind, &payment, charge.clone()) {
            Finding::Final(_) if !trusted => Ok(ask),
            Finding::Final(outcome) => {
                let held = HeldAction { operation, payment };
                Ok(settled(
                    <Actions as Kind>::settle_on(conn, &held, outcome, Actor::Webhook).await?,
                    subject,
                ))
            }
            // Still authorized (the capture or void has not happened yet), or not final.
            Finding::Unknown { .. }
            | Finding::NotReceived
            | Finding::Unsent { .. }
            | Finding::KeyConflict { .. } => Ok(Step::Done(Received::Stale, Some(subject))),
        };
    }
    // An authorization that ended with nothing of ours in flight: it expired (or was voided or
    // captured at the provider directly). Asked first.
    if payment.status == PaymentStatus::RequiresCapture {
        let ends = matches!(charge.status, ChargeStatus::Canceled { .. } | ChargeStatus::Succeeded);
        if ends && !trusted {
            return Ok(ask);
        }
        let ended = authorization::end_on(conn, &payment, charge, Actor::Webhook).await?;
        let received = if ended == Some(true) { Received::Applied } else { Received::Stale };
        return Ok(Step::Done(received, Some(subject)));
    }
    if payment.status == PaymentStatus::Failed && charge.status == ChargeStatus::Succeeded {
        // Money taken for a payment we failed (a charge that landed after the reconciler gave
        // up, or after a decline): final states absorb; the late-charge watch looks the charge up
        // and refunds it (`operations::late_charge`), brought forward to its next pass (the
        // lookup and the refund are provider calls, which never run inside this transaction).
        let watch = engine.reconciler.late_charge_watch;
        let watched = watches::watch_late_now(conn, account_id, payment_id, Utc::now(), watch).await?;
        tracing::warn!(%payment_id, charge_id = %charge.id, watched,
            "the provider reports a succeeded charge for a failed payment; the late-charge watch looks it up on its next pass");
    }
    Ok(Step::Done(Received::Stale, Some(subject)))
}

/// A refund event (`refund.succeeded`, `refund.failed`): the refund in flight settles, and a
/// settled refund is corrected (carried out after a give-up, or reversed), only as the
/// provider's lookup says.
async fn apply_refund(
    conn: &mut AsyncPgConnection,
    refund: Option<RefundId>,
    event_refund: &ProviderRefund,
    verified: Option<&Verified>,
) -> Result<Step, EngineError> {
    let Some(refund_id) = refund else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let Some(account_id) = refunds::account_of(conn, refund_id).await? else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let Some(held) = <Refunds as Kind>::load(conn, (account_id, refund_id.as_uuid())).await? else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let subject =
        Subject { account_id, table: Some(Table::Refunds), kind: "refund", id: refund_id.as_uuid() };
    let verify = Verify::Refund { key: held.refund.downstream_key(), charge_id: held.charge_id.clone() };
    let refund = match verified {
        Some(Verified::Refund(refund)) => refund,
        Some(Verified::Charge(_) | Verified::Dispute(_) | Verified::Absent) => {
            return Ok(Step::Done(Received::Stale, Some(subject)));
        }
        None => event_refund,
    };
    let trusted = verified.is_some();
    if let Some(why) = refund_disagreement(&held, refund) {
        if !trusted {
            return Ok(Step::Verify { what: verify, why: Some(why) });
        }
        tracing::error!(%refund_id, disagreement = %why, "the provider's refund disagrees with ours");
        return Ok(Step::Done(Received::Stale, Some(subject)));
    }
    let ask = Step::Verify { what: verify, why: None };
    let correction = match (held.refund.status, &refund.status) {
        (RefundStatus::Processing, _) => {
            return match refund::outcome_of(Ok(refund.clone())) {
                // As a charge's: the provider's confirmed word, never the event's alone.
                Finding::Final(_) if !trusted => Ok(ask),
                Finding::Final(outcome) => Ok(settled(
                    <Refunds as Kind>::settle_on(conn, &held, outcome, Actor::Webhook).await?,
                    subject,
                )),
                Finding::Unknown { .. }
                | Finding::NotReceived
                | Finding::Unsent { .. }
                | Finding::KeyConflict { .. } => Ok(Step::Done(Received::Stale, Some(subject))),
            };
        }
        // A refund we gave up on, reported failed: the late-refund watch's lookup on its way
        // (which may have seen it succeed before this) must not be applied; it looks again.
        (RefundStatus::Failed, ProviderRefundStatus::Failed { .. }) => {
            refunds::look_again(conn, &held.refund, Utc::now()).await?;
            return Ok(Step::Done(Received::Stale, Some(subject)));
        }
        (settled, _) => match Correction::between(settled, refund) {
            Some(correction) => correction,
            None => return Ok(Step::Done(Received::Stale, Some(subject))),
        },
    };
    if !trusted {
        return Ok(ask);
    }
    let received = match late_refund::correct(conn, &held.refund, correction, Actor::Webhook, None).await? {
        Corrected::Applied => Received::Applied,
        Corrected::Stale | Corrected::DoesNotFitYet => Received::Stale,
    };
    Ok(Step::Done(received, Some(subject)))
}

/// A dispute event (`charge.dispute.*`): recorded as the provider's lookup of the dispute says.
/// An event whose dispute we hold exactly as it says changes nothing and asks nothing (a copy,
/// or an older event arriving late); any other is looked up first. A dispute the provider does
/// not know is recorded nowhere.
async fn apply_dispute(
    conn: &mut AsyncPgConnection,
    event_dispute: &ProviderDispute,
    verified: Option<&Verified>,
) -> Result<Step, EngineError> {
    let dispute = match verified {
        Some(Verified::Dispute(dispute)) => dispute.as_ref(),
        Some(Verified::Charge(_) | Verified::Refund(_) | Verified::Absent) => {
            return Ok(Step::Done(Received::Unknown, None));
        }
        None => {
            let held = find_by_provider_id(conn, &event_dispute.id).await?;
            let same = held.as_ref().is_some_and(|held| {
                held.status == event_dispute.status
                    && held.amount_withdrawn == event_dispute.amount_withdrawn
                    && held.amount_reinstated == event_dispute.amount_reinstated
            });
            if let (true, Some(held)) = (same, held) {
                let subject =
                    Subject { account_id: held.account_id, table: None, kind: "dispute", id: held.id };
                return Ok(Step::Done(Received::Stale, Some(subject)));
            }
            return Ok(Step::Verify { what: Verify::Dispute(event_dispute.id.clone()), why: None });
        }
    };
    let DisputeRecorded::Done { outcome, id, account_id } =
        disputes::record_on(conn, dispute, "webhook").await?
    else {
        return Ok(Step::Done(Received::Unknown, None));
    };
    let subject = id.map(|id| Subject { account_id, table: None, kind: "dispute", id });
    let received = match outcome {
        RecordOutcome::Created | RecordOutcome::Updated => Received::Applied,
        _ => Received::Stale,
    };
    Ok(Step::Done(received, subject))
}

/// How an event's refund disagrees with ours, if it does: another refund than the one we hold,
/// another currency or amount.
fn refund_disagreement(held: &Held, refund: &ProviderRefund) -> Option<String> {
    let ours = &held.refund;
    if let Some(known) = ours.provider_refund_id.as_deref().filter(|known| *known != refund.id) {
        return Some(format!("names refund {}, ours is {known}", refund.id));
    }
    if refund.currency != ours.amount.currency().code() {
        return Some(format!("is in {}, ours in {}", refund.currency, ours.amount.currency()));
    }
    if refund.amount != ours.amount.value() {
        return Some(format!("is of {}, ours of {}", refund.amount, ours.amount));
    }
    None
}
