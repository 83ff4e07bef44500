//! The charge behind a payment (or, for `capture_method: manual`, its authorization): sending
//! it, looking it up, what the provider's answer means, and how its outcome is recorded.

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use uuid::Uuid;

use super::leases::Table;
use super::{Actor, EngineError, Finding, GiveUp, Kind, Recorded};
use crate::events::repository::NewEvent;
use crate::events::{Announce, EventType};
use crate::idempotency::StoredResponse;
use crate::ids::{AccountId, PaymentId};
use crate::orders::OrderStatus;
use crate::orders::service as orders;
use crate::payments::repository::{self, SettlePayment};
use crate::payments::representation::{final_response, payment_json, pending_response, stored_answer};
use crate::payments::{CaptureMethod, GAVE_UP_CODE, Payment, PaymentStatus, RESOLVED_FAILED_CODE};
use crate::provider::{Charge, ChargeRequest, ChargeStatus, PaymentProvider, ProviderError};

/// How long an authorization is watched when the provider did not say when it ends.
const UNSAID_AUTHORIZATION_WATCH: chrono::Duration = chrono::Duration::hours(24);

/// A charge's final outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Charged and captured: the payment succeeds and the order is paid.
    Captured { charge_id: String },
    /// Authorized only (manual capture): the payment waits for a capture or a void.
    Authorized { charge_id: String, expires_at: Option<DateTime<Utc>> },
    /// An authorization that ended before it was recorded (it expired, or was voided).
    Canceled { charge_id: String, reason: String },
    /// Definitely not charged: the payment fails, the order stays payable.
    Declined { code: String, message: String },
    /// The reconciler gave up: the provider never received the charge.
    GaveUp(GiveUp),
    /// An operator settled it by hand (`orderpay payments resolve`, see `operations::operator`).
    Resolved(Resolution),
}

/// What an operator settled a payment's charge as, and why (the reason goes to the audit trail,
/// never to the client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub to: ResolvedTo,
    /// The provider's charge, when it has one.
    pub charge_id: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolvedTo {
    /// Charged and captured: the payment succeeds and the order is paid.
    Captured,
    /// Authorized (a manual-capture payment): the payment waits for a capture or a void.
    Authorized { expires_at: Option<DateTime<Utc>> },
    /// Failed. As after a give-up, the payment is watched for `late_watch` (first looked at after
    /// `first_look`) for a charge at the provider, which the system refunds: a failed payment
    /// never keeps money. Unless forced, only if its last send is quiet, as a give-up
    /// (`quiet`): an operator never fails a payment whose send could still land.
    Failed {
        first_look: std::time::Duration,
        late_watch: std::time::Duration,
        quiet: Option<super::SendQuiet>,
    },
}

/// The payment's charge as a provider operation.
pub struct Charges;

/// The charge request for `payment`: the same downstream key on every send.
pub fn charge_request(payment: &Payment, request_id: Option<&str>) -> ChargeRequest {
    ChargeRequest {
        downstream_key: payment.downstream_key(),
        amount: payment.amount,
        payment_method: payment.payment_method.clone(),
        reference: payment.id.as_uuid(),
        capture: payment.capture_method == CaptureMethod::Automatic,
        request_id: request_id.map(str::to_owned),
    }
}

/// Maps a provider answer to what it means for `payment`. Exhaustive on purpose: a new provider
/// status or error does not compile until someone decides what it means for money.
pub fn outcome_of(payment: &Payment, answer: Result<Charge, ProviderError>) -> Finding<ChargeOutcome> {
    let manual = payment.capture_method == CaptureMethod::Manual;
    let unknown = |reason: String| Finding::Unknown { reason };
    if let Ok(charge) = &answer
        && let Some(disagreement) = disagreement(payment, charge)
    {
        // Never recorded on a guess: the reconciler keeps asking, and past its attempts the
        // payment is stuck for a person to look at.
        return unknown(format!("charge {} {disagreement}; it needs a person", charge.id));
    }
    match answer {
        Ok(Charge { id, status: ChargeStatus::Succeeded, .. }) => {
            Finding::Final(ChargeOutcome::Captured { charge_id: id })
        }
        Ok(Charge { id, status: ChargeStatus::RequiresCapture, authorization_expires_at, .. }) if manual => {
            Finding::Final(ChargeOutcome::Authorized { charge_id: id, expires_at: authorization_expires_at })
        }
        Ok(Charge { id, status: ChargeStatus::Canceled { reason }, .. }) if manual => {
            Finding::Final(ChargeOutcome::Canceled { charge_id: id, reason })
        }
        Ok(Charge { status: ChargeStatus::Declined { code, message }, .. }) => {
            Finding::Final(ChargeOutcome::Declined { code, message })
        }
        Ok(Charge { id, status: ChargeStatus::Pending, .. }) => {
            unknown(format!("charge {id} is pending at the provider"))
        }
        // An automatic payment's charge is never only authorized or canceled; should one be, it
        // is left to the reconciler and a person rather than guessed at.
        Ok(Charge { id, status: ChargeStatus::RequiresCapture, .. }) => {
            unknown(format!("charge {id} is only authorized at the provider"))
        }
        Ok(Charge { id, status: ChargeStatus::Canceled { reason }, .. }) => {
            unknown(format!("charge {id} is canceled at the provider ({reason})"))
        }
        Err(error @ (ProviderError::Unauthorized { .. } | ProviderError::KeyReused { .. })) => {
            Finding::of_error(&error)
        }
        Err(error @ ProviderError::Timeout) => unknown(error.to_string()),
        Err(error @ ProviderError::Connection(_)) => unknown(error.to_string()),
        Err(error @ ProviderError::ServerError(_)) => unknown(error.to_string()),
        // A refusal that is not a decline (a malformed request, a key conflict) is our bug or
        // theirs, not an answer about the card: it is retried and eventually given up on.
        Err(error @ ProviderError::Rejected { .. }) => unknown(error.to_string()),
        Err(error @ ProviderError::Malformed(_)) => unknown(error.to_string()),
        // Refusals answer captures, cancels and refunds, never a charge request.
        Err(error @ ProviderError::Refused { .. }) => unknown(error.to_string()),
    }
}

/// How the provider's charge for `payment`'s key disagrees with the payment, if it does: another
/// currency, another amount, or a capture (of an automatic charge) of anything but all of it.
/// Amounts are compared exactly, so one finer than the currency's minor unit disagrees too.
pub fn disagreement(payment: &Payment, charge: &Charge) -> Option<String> {
    let ours = payment.amount.value();
    if charge.currency != payment.currency().code() {
        return Some(format!("is in {}, the payment in {}", charge.currency, payment.currency()));
    }
    if charge.amount != ours {
        return Some(format!("is of {}, the payment of {ours}", charge.amount));
    }
    let captured = charge.amount_captured;
    if charge.status == ChargeStatus::Succeeded
        && payment.capture_method == CaptureMethod::Automatic
        && captured != ours
    {
        return Some(format!("captured {captured} of {ours}"));
    }
    None
}

impl Kind for Charges {
    const TABLE: Table = Table::Payments;
    type Op = Payment;
    type Final = ChargeOutcome;

    fn id(payment: &Payment) -> (AccountId, Uuid) {
        (payment.account_id, payment.id.as_uuid())
    }

    #[cfg(any(test, feature = "test-hooks"))]
    fn statements() -> Vec<crate::db::statement::Declared> {
        use crate::db::statement::declared;
        vec![
            declared::<crate::payments::repository::StartPayment<'static>>(),
            declared::<crate::payments::repository::SettlePayment<'static>>(),
        ]
    }

    async fn load(
        conn: &mut AsyncPgConnection,
        (account_id, id): (AccountId, Uuid),
    ) -> diesel::QueryResult<Option<Payment>> {
        repository::find(conn, account_id, PaymentId::from_uuid(id)).await
    }

    async fn send(
        provider: &dyn PaymentProvider,
        payment: &Payment,
        request_id: Option<&str>,
    ) -> Finding<ChargeOutcome> {
        outcome_of(payment, provider.create_charge(&charge_request(payment, request_id)).await)
    }

    async fn look_up(
        provider: &dyn PaymentProvider,
        payment: &Payment,
        request_id: Option<&str>,
    ) -> Finding<ChargeOutcome> {
        match provider.find_charge(&payment.charge_lookup_since_sent(), request_id).await {
            Ok(Some(charge)) => outcome_of(payment, Ok(charge)),
            Ok(None) => Finding::NotReceived,
            Err(error) => outcome_of(payment, Err(error)),
        }
    }

    fn gave_up(_: &Payment, give_up: GiveUp) -> ChargeOutcome {
        ChargeOutcome::GaveUp(give_up)
    }

    async fn settle_on(
        conn: &mut AsyncPgConnection,
        payment: &Payment,
        outcome: ChargeOutcome,
        actor: Actor,
    ) -> Result<Option<Recorded>, EngineError> {
        settle_on(conn, payment, outcome, actor).await
    }

    fn stored_answer(id: Uuid, status: u16, body: Vec<u8>) -> StoredResponse {
        stored_answer(id, status, body)
    }

    fn pending_answer(payment: &Payment) -> StoredResponse {
        pending_response(payment)
    }
}

/// Moves `payment` to its charge's final outcome: the payment with its final answer, the order
/// (paid, or authorized), and the audit row, in one statement (`settle_payment.sql`). The answer
/// is rendered first, from the payment as it will be. Idempotent: if someone settled the charge
/// first, nothing changes and theirs is returned (final states absorb; a conflicting second
/// outcome is logged for a person).
pub async fn settle_on(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    outcome: ChargeOutcome,
    actor: Actor,
) -> Result<Option<Recorded>, EngineError> {
    let now = Utc::now().trunc_subsecs(6);
    let mut settled = Payment { next_check_at: None, lease: None, updated_at: now, ..payment.clone() };
    let (mut quiet, mut late_watch_until, mut reason) = (None, None, None);
    let order_status = match outcome {
        ChargeOutcome::Captured { charge_id } => captured(&mut settled, Some(charge_id)),
        ChargeOutcome::Authorized { charge_id, expires_at } => {
            authorized(&mut settled, Some(charge_id), expires_at, now)
        }
        ChargeOutcome::Canceled { charge_id, reason } => {
            settled.status = PaymentStatus::Canceled;
            settled.provider_charge_id = Some(charge_id);
            settled.failure_message = Some(format!("the authorization ended at the provider ({reason})"));
            settled.failure_code = Some(reason);
            None
        }
        ChargeOutcome::Declined { code, message } => {
            settled.status = PaymentStatus::Failed;
            settled.failure_code = Some(code);
            settled.failure_message = Some(message);
            None
        }
        ChargeOutcome::GaveUp(give_up) => {
            settled.status = PaymentStatus::Failed;
            settled.failure_code = Some(GAVE_UP_CODE.to_owned());
            settled.failure_message = Some(format!(
                "the provider had not received the charge after {} attempts; a charge that lands later is refunded",
                give_up.attempts
            ));
            // A charge sent late could still land: look for one until the watch ends.
            quiet = Some(give_up.quiet);
            settled.next_check_at = Some(crate::clock::after(now, give_up.quiet_for));
            late_watch_until = Some(crate::clock::after(now, give_up.late_watch));
            None
        }
        ChargeOutcome::Resolved(resolution) => {
            reason = Some(resolution.reason);
            match resolution.to {
                ResolvedTo::Captured => captured(&mut settled, resolution.charge_id),
                ResolvedTo::Authorized { expires_at } => {
                    authorized(&mut settled, resolution.charge_id, expires_at, now)
                }
                ResolvedTo::Failed { first_look, late_watch, quiet: guard } => {
                    quiet = guard;
                    settled.status = PaymentStatus::Failed;
                    settled.provider_charge_id = resolution.charge_id.or(settled.provider_charge_id.take());
                    settled.failure_code = Some(RESOLVED_FAILED_CODE.to_owned());
                    settled.failure_message = Some(
                        "settled as failed by an operator; a charge the provider holds for it is refunded"
                            .to_owned(),
                    );
                    settled.next_check_at = Some(crate::clock::after(now, first_look));
                    late_watch_until = Some(crate::clock::after(now, late_watch));
                    None
                }
            }
        }
    };
    let answer = final_response(&settled);
    let event_type = match settled.status {
        PaymentStatus::Succeeded => EventType::PaymentSucceeded,
        PaymentStatus::RequiresCapture => EventType::PaymentRequiresCapture,
        PaymentStatus::Canceled => EventType::PaymentCanceled,
        PaymentStatus::Failed | PaymentStatus::Processing => EventType::PaymentFailed,
    };
    let event = NewEvent::new(event_type, payment_json(&settled));
    let order_event =
        orders::paid_event(conn, payment.account_id, payment.order_id, order_status, now).await?;
    let announce = Announce::new(Some(&event), order_event.as_ref());
    let statement = SettlePayment {
        announce,
        account_id: payment.account_id,
        payment_id: payment.id,
        order_id: payment.order_id,
        status: settled.status,
        provider_charge_id: settled.provider_charge_id.as_deref(),
        failure_code: settled.failure_code.as_deref(),
        failure_message: settled.failure_message.as_deref(),
        now,
        actor: actor.as_str(),
        // An operator's reason, else what the provider said.
        detail: reason
            .as_deref()
            .or(settled.failure_message.as_deref())
            .or(settled.provider_charge_id.as_deref()),
        answer_status: answer.status as i16,
        answer_body: &answer.body,
        amount_captured: settled.amount_captured.value(),
        authorization_expires_at: settled.authorization_expires_at,
        next_check_at: settled.next_check_at,
        order_status,
        quiet_since: quiet.map(|quiet: super::SendQuiet| quiet.since),
        quiet_lease: quiet.map(|quiet| quiet.lease),
        late_watch_until,
    };
    let (applied, moved) = repository::settle(conn, statement).await?;
    Announce::new(Some(&event), order_event.as_ref()).count_written(applied == 1, moved == 1);
    if applied == 1 {
        if order_status.is_some() && moved == 0 {
            // Cannot happen while cancels refuse orders with a payment in flight and an order has
            // at most one live payment; if it does, money was taken for an order that is not
            // payable, and a person must refund it.
            tracing::error!(payment_id = %settled.id, order_id = %settled.order_id,
                "payment settled for an order that was not pending_payment");
        }
        tracing::info!(payment_id = %settled.id, status = %settled.status, actor = actor.as_str(), "payment settled");
        crate::telemetry::metrics::payment_settled(settled.status.as_str());
        return Ok(Some(Recorded { answer, applied: true }));
    }
    // Someone settled it first: theirs is the answer. Or a give-up was held back.
    let current = repository::find_answered(conn, payment.account_id, payment.id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("payment {}", payment.id)))?;
    if current.answer.is_none() && current.payment.status == PaymentStatus::Processing {
        return Ok(None);
    }
    if current.payment.status != settled.status {
        // Money kept against money not taken is a real conflict. Two states of one charge that
        // moved on (an authorization settled while a look at it already saw it captured) are not.
        let failed = |status: PaymentStatus| status == PaymentStatus::Failed;
        if failed(current.payment.status) != failed(settled.status) {
            tracing::error!(payment_id = %payment.id, current = %current.payment.status,
                wanted = %settled.status, "conflicting outcomes for one payment's charge; the first stands");
        } else {
            tracing::info!(payment_id = %payment.id, current = %current.payment.status,
                wanted = %settled.status, "a later state of the payment's charge was seen; the first settle stands");
        }
    }
    let answer = match current.answer {
        Some((status, body)) => stored_answer(payment.id.as_uuid(), status, body),
        None => final_response(&current.payment),
    };
    Ok(Some(Recorded { answer, applied: false }))
}

/// `settled` captured: succeeded with the whole amount; the order is paid.
fn captured(settled: &mut Payment, charge_id: Option<String>) -> Option<OrderStatus> {
    settled.status = PaymentStatus::Succeeded;
    settled.provider_charge_id = charge_id.or(settled.provider_charge_id.take());
    settled.amount_captured = settled.amount;
    Some(OrderStatus::Paid)
}

/// `settled` authorized: waiting for a capture or a void; the order is authorized.
fn authorized(
    settled: &mut Payment,
    charge_id: Option<String>,
    expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<OrderStatus> {
    settled.status = PaymentStatus::RequiresCapture;
    settled.provider_charge_id = charge_id.or(settled.provider_charge_id.take());
    settled.authorization_expires_at = expires_at;
    // The reconciler looks at the authorization when the provider lets it go.
    settled.next_check_at = Some(expires_at.unwrap_or(now + UNSAID_AUTHORIZATION_WATCH));
    Some(OrderStatus::Authorized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payments::in_flight_for_tests as payment;

    fn charge(status: ChargeStatus) -> Result<Charge, ProviderError> {
        Ok(crate::provider::charge_for_tests(status))
    }

    #[test]
    fn only_a_definite_decline_is_final_failure() {
        let automatic = payment(CaptureMethod::Automatic);
        assert_eq!(
            outcome_of(&automatic, charge(ChargeStatus::Succeeded)),
            Finding::Final(ChargeOutcome::Captured { charge_id: "ch_1".into() })
        );
        assert!(matches!(
            outcome_of(&automatic, charge(ChargeStatus::Declined { code: "c".into(), message: "m".into() })),
            Finding::Final(ChargeOutcome::Declined { .. })
        ));
        for unknown in [
            charge(ChargeStatus::Pending),
            charge(ChargeStatus::RequiresCapture),
            charge(ChargeStatus::Canceled { reason: "requested".into() }),
            Err(ProviderError::Timeout),
            Err(ProviderError::Connection("reset".into())),
            Err(ProviderError::ServerError(503)),
            Err(ProviderError::Rejected { status: 400, message: "bad".into() }),
            Err(ProviderError::Refused { code: "x".into(), message: "y".into() }),
            Err(ProviderError::Malformed("?".into())),
        ] {
            assert!(matches!(outcome_of(&automatic, unknown), Finding::Unknown { .. }));
        }
    }

    #[test]
    fn a_manual_payment_is_authorized_not_captured() {
        let manual = payment(CaptureMethod::Manual);
        assert!(matches!(
            outcome_of(&manual, charge(ChargeStatus::RequiresCapture)),
            Finding::Final(ChargeOutcome::Authorized { .. })
        ));
        assert!(matches!(
            outcome_of(&manual, charge(ChargeStatus::Canceled { reason: "authorization_expired".into() })),
            Finding::Final(ChargeOutcome::Canceled { .. })
        ));
    }
}
