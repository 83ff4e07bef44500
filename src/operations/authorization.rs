//! Captures and voids of an authorization, as provider operations; and the reconciler's watch on
//! authorizations waiting for one.
//!
//! What became of a capture or a void is what became of the charge: the provider's view of the
//! charge (`requires_capture`, `succeeded` with what was captured, `canceled` with why) is the
//! lookup, so a capture or void whose answer was lost is found out by reading the charge, and
//! re-sent (same key) while the charge still waits. A give-up never fails the authorization
//! underneath: the payment goes back to `requires_capture`.

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::leases::Table;
use super::{Actor, Engine, EngineError, Finding, GiveUp, Kind, Recorded};
use crate::clock::after;
use crate::error::ApiError;
use crate::events::repository::NewEvent;
use crate::events::{Announce, EventType};
use crate::idempotency::StoredResponse;
use crate::ids::{AccountId, OperationId};
use crate::money::Amount;
use crate::orders::OrderStatus;
use crate::orders::service as orders;
use crate::payments::authorization::{self, Action, ActionStatus, PaymentOperation, SettleAction};
use crate::payments::repository as payments;
use crate::payments::representation::{
    AUTHORIZATION_EXPIRED, action_response, payment_json, stored_action_answer,
};
use crate::payments::watches::{self, EndAuthorization};
use crate::payments::{GAVE_UP_CODE, Payment, PaymentStatus};
use crate::provider::{CancelRequest, CaptureRequest, Charge, ChargeStatus, PaymentProvider, ProviderError};

/// How soon an authorization is looked at again after a capture or void was given up on: one
/// sent late could still land.
const AFTER_A_GIVE_UP: chrono::Duration = chrono::Duration::minutes(5);

/// What a capture or void ends as: the state the charge was left in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionOutcome {
    /// The charge is captured, for this amount.
    Captured { amount: Decimal },
    /// The authorization is gone: voided (`requested`) or expired (`authorization_expired`).
    Canceled { reason: String },
    /// The capture was refused for another reason; the authorization still waits.
    Declined { code: String, message: String },
    /// The reconciler gave up: the provider never received it; the authorization still waits.
    GaveUp(GiveUp),
}

/// A capture or void with the payment it acts on (its charge id, and what its answer shows).
#[derive(Debug, Clone)]
pub struct Held {
    pub operation: PaymentOperation,
    pub payment: Payment,
}

/// Captures and voids as provider operations.
pub struct Actions;

/// What the provider's view of the charge says about a capture or void of it. What was captured
/// is the provider's figure, never the request's; one that is not an amount of the payment's
/// currency, or more than was authorized, is never recorded: it needs a person.
pub(super) fn charge_state(action: Action, payment: &Payment, charge: Charge) -> Finding<ActionOutcome> {
    if let Some(disagreement) = captured_disagreement(payment, &charge) {
        return Finding::Unknown {
            reason: format!("charge {} {disagreement}; it needs a person", charge.id),
        };
    }
    match charge.status {
        ChargeStatus::Succeeded => Finding::Final(ActionOutcome::Captured { amount: charge.amount_captured }),
        ChargeStatus::Canceled { reason } => Finding::Final(ActionOutcome::Canceled { reason }),
        // Still waiting: this capture or void has not happened (yet); re-sent with its key.
        ChargeStatus::RequiresCapture => Finding::NotReceived,
        ChargeStatus::Pending | ChargeStatus::Declined { .. } => Finding::Unknown {
            reason: format!("the charge of a {action} is {:?} at the provider", charge.status),
        },
    }
}

/// How the provider's charge behind an authorization disagrees with the payment, if it does:
/// another currency or authorized amount, or a capture that is not an amount of the currency (finer
/// than its minor unit), nothing, or more than was authorized.
pub fn captured_disagreement(payment: &Payment, charge: &Charge) -> Option<String> {
    let authorized = payment.amount.value();
    if charge.currency != payment.currency().code() {
        return Some(format!("is in {}, the payment in {}", charge.currency, payment.currency()));
    }
    if charge.amount != authorized {
        return Some(format!("is of {}, the authorization of {authorized}", charge.amount));
    }
    let captured = charge.amount_captured;
    let exact =
        Amount::from_decimal(captured, payment.currency()).is_ok_and(|amount| amount.value() == captured);
    let within = captured > Decimal::ZERO && captured <= authorized;
    if charge.status == ChargeStatus::Succeeded && !(exact && within) {
        return Some(format!("captured {captured} of an authorization of {authorized}"));
    }
    None
}

impl Kind for Actions {
    const TABLE: Table = Table::PaymentOperations;
    type Op = Held;
    type Final = ActionOutcome;

    fn id(held: &Held) -> (AccountId, Uuid) {
        (held.operation.account_id, held.operation.id.as_uuid())
    }

    #[cfg(any(test, feature = "test-hooks"))]
    fn statements() -> Vec<crate::db::statement::Declared> {
        use crate::db::statement::declared;
        vec![
            declared::<crate::payments::authorization::StartAction<'static>>(),
            declared::<crate::payments::authorization::SettleAction<'static>>(),
        ]
    }

    async fn load(
        conn: &mut AsyncPgConnection,
        (account_id, id): (AccountId, Uuid),
    ) -> diesel::QueryResult<Option<Held>> {
        let Some(operation) = authorization::find(conn, account_id, OperationId::from_uuid(id)).await? else {
            return Ok(None);
        };
        let payment = payments::find(conn, account_id, operation.payment_id).await?;
        Ok(payment.map(|payment| Held { operation, payment }))
    }

    async fn send(
        provider: &dyn PaymentProvider,
        held: &Held,
        request_id: Option<&str>,
    ) -> Finding<ActionOutcome> {
        let Some(charge_id) = held.payment.provider_charge_id.clone() else {
            return Finding::Unknown { reason: "the payment has no charge at the provider".into() };
        };
        let downstream_key = held.operation.downstream_key();
        let request_id = request_id.map(str::to_owned);
        let answer = match held.operation.kind {
            Action::Capture => {
                let amount = held
                    .operation
                    .amount
                    .and_then(|amount| Amount::from_decimal(amount, held.payment.currency()).ok());
                provider
                    .capture_charge(&CaptureRequest {
                        charge_id,
                        downstream_key,
                        amount,
                        request_id: request_id.clone(),
                    })
                    .await
            }
            Action::Void => {
                provider
                    .cancel_charge(&CancelRequest {
                        charge_id,
                        downstream_key,
                        request_id: request_id.clone(),
                    })
                    .await
            }
        };
        match answer {
            Ok(charge) => charge_state(held.operation.kind, &held.payment, charge),
            Err(ProviderError::Refused { code, .. }) if code == AUTHORIZATION_EXPIRED => {
                Finding::Final(ActionOutcome::Canceled { reason: code })
            }
            Err(ProviderError::Refused { code, message }) if code == "capture_declined" => {
                Finding::Final(ActionOutcome::Declined { code, message })
            }
            // Any other refusal (already captured, already canceled) says the charge moved on
            // without this operation: what it is now is the answer.
            Err(ProviderError::Refused { .. }) => Self::look_up(provider, held, request_id.as_deref()).await,
            Err(error) => Finding::of_error(&error),
        }
    }

    async fn look_up(
        provider: &dyn PaymentProvider,
        held: &Held,
        request_id: Option<&str>,
    ) -> Finding<ActionOutcome> {
        let Some(charge_id) = held.payment.provider_charge_id.as_deref() else {
            return Finding::Unknown { reason: "the payment has no charge at the provider".into() };
        };
        match provider.get_charge(charge_id, request_id).await {
            Ok(Some(charge)) => charge_state(held.operation.kind, &held.payment, charge),
            Ok(None) => Finding::Unknown { reason: format!("the provider does not know charge {charge_id}") },
            Err(error) => Finding::of_error(&error),
        }
    }

    fn gave_up(_: &Held, give_up: GiveUp) -> ActionOutcome {
        ActionOutcome::GaveUp(give_up)
    }

    async fn settle_on(
        conn: &mut AsyncPgConnection,
        held: &Held,
        outcome: ActionOutcome,
        actor: Actor,
    ) -> Result<Option<Recorded>, EngineError> {
        settle_on(conn, held, outcome, actor).await
    }

    fn stored_answer(_: Uuid, status: u16, body: Vec<u8>) -> StoredResponse {
        stored_action_answer(status, body)
    }

    fn pending_answer(held: &Held) -> StoredResponse {
        let mut response = action_response(&held.payment, None);
        response.status = 202;
        response
    }
}

/// Records a capture's or void's outcome: the operation with its final answer, the payment and
/// the order as the charge now is, and both transitions, in one statement
/// (`settle_capture_or_void.sql`).
pub async fn settle_on(
    conn: &mut AsyncPgConnection,
    held: &Held,
    outcome: ActionOutcome,
    actor: Actor,
) -> Result<Option<Recorded>, EngineError> {
    let now = Utc::now().trunc_subsecs(6);
    let operation = &held.operation;
    let action = operation.kind;
    let mut payment = Payment { updated_at: now, next_check_at: None, ..held.payment.clone() };
    let authorized_again = |payment: &mut Payment, watch: DateTime<Utc>| {
        payment.status = PaymentStatus::RequiresCapture;
        payment.next_check_at = Some(watch);
    };
    let watch = payment.authorization_expires_at.unwrap_or(now + AFTER_A_GIVE_UP);
    // (the operation's status and failure, the refusal its request answers with, the order)
    let (status, failure, refusal, order_status) = match &outcome {
        ActionOutcome::Captured { amount } => {
            payment.status = PaymentStatus::Succeeded;
            // `charge_state` let through only an exact amount within the authorization.
            payment.amount_captured = Amount::from_decimal(*amount, payment.currency()).map_err(|error| {
                EngineError::Inconsistent(format!("the captured amount {amount}: {error}"))
            })?;
            match action {
                Action::Capture => (ActionStatus::Succeeded, None, None, Some(OrderStatus::Paid)),
                Action::Void => {
                    let refusal = invalid_state(&payment, "voided");
                    let failure = ("already_captured".to_owned(), "the charge was captured".to_owned());
                    (ActionStatus::Failed, Some(failure), Some(refusal), Some(OrderStatus::Paid))
                }
            }
        }
        ActionOutcome::Canceled { reason } => {
            payment.status = PaymentStatus::Canceled;
            let expired = reason == AUTHORIZATION_EXPIRED;
            if expired {
                payment.failure_code = Some(AUTHORIZATION_EXPIRED.to_owned());
                payment.failure_message = Some("the authorization expired before it was captured".to_owned());
            }
            match action {
                Action::Void if !expired => {
                    (ActionStatus::Succeeded, None, None, Some(OrderStatus::PendingPayment))
                }
                _ => {
                    let refusal = ApiError::AuthorizationExpired { payment_id: payment.id };
                    let failure =
                        (reason.clone(), "the authorization ended before this operation".to_owned());
                    (ActionStatus::Failed, Some(failure), Some(refusal), Some(OrderStatus::PendingPayment))
                }
            }
        }
        ActionOutcome::Declined { code, message } => {
            authorized_again(&mut payment, watch);
            let refusal = ApiError::CaptureDeclined {
                payment_id: payment.id,
                code: code.clone(),
                message: message.clone(),
            };
            (ActionStatus::Failed, Some((code.clone(), message.clone())), Some(refusal), None)
        }
        ActionOutcome::GaveUp(give_up) => {
            // A capture or void sent late could still land: look at the authorization soon.
            authorized_again(&mut payment, watch.min(now + AFTER_A_GIVE_UP));
            let reason = format!(
                "the provider never received the {action} after {} attempts; nothing moved",
                give_up.attempts
            );
            let refusal = ApiError::OperationFailed {
                operation: action.as_str(),
                id: operation.id.as_uuid(),
                reason: reason.clone(),
            };
            (ActionStatus::Failed, Some((GAVE_UP_CODE.to_owned(), reason)), Some(refusal), None)
        }
    };
    let give_up_quiet = match &outcome {
        ActionOutcome::GaveUp(give_up) => Some(give_up.quiet),
        _ => None,
    };
    let answer = action_response(&payment, refusal);
    let (failure_code, failure_message) = match &failure {
        Some((code, message)) => (Some(code.as_str()), Some(message.as_str())),
        None => (None, None),
    };
    let event = match payment.status {
        PaymentStatus::Succeeded => Some(NewEvent::new(EventType::PaymentSucceeded, payment_json(&payment))),
        PaymentStatus::Canceled => Some(NewEvent::new(EventType::PaymentCanceled, payment_json(&payment))),
        _ => None,
    };
    let order_event =
        orders::paid_event(conn, payment.account_id, payment.order_id, order_status, now).await?;
    let statement = SettleAction {
        announce: Announce::new(event.as_ref(), order_event.as_ref()),
        account_id: operation.account_id,
        id: operation.id,
        order_id: payment.order_id,
        payment_id: payment.id,
        status,
        failure_code,
        failure_message,
        now,
        actor: actor.as_str(),
        detail: failure_message,
        answer_status: answer.status as i16,
        answer_body: &answer.body,
        payment_status: payment.status,
        amount_captured: matches!(outcome, ActionOutcome::Captured { .. })
            .then(|| payment.amount_captured.value()),
        payment_failure_code: payment.failure_code.as_deref(),
        payment_failure_message: payment.failure_message.as_deref(),
        payment_next_check_at: payment.next_check_at,
        order_status,
        quiet_since: give_up_quiet.map(|quiet| quiet.since),
        quiet_lease: give_up_quiet.map(|quiet| quiet.lease),
    };
    let (applied, moved) = authorization::settle(conn, statement).await?;
    Announce::new(event.as_ref(), order_event.as_ref()).count_written(applied == 1, moved == 1);
    if applied == 1 {
        tracing::info!(operation_id = %operation.id, %action, status = %status, payment_status = %payment.status,
            actor = actor.as_str(), "capture or void settled");
        return Ok(Some(Recorded { answer, applied: true }));
    }
    // Someone settled it first: theirs is the answer. Or a give-up was held back.
    let id = (operation.account_id, operation.id.as_uuid());
    let standing = super::leases::standing(conn, Table::PaymentOperations, id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("operation {}", operation.id)))?;
    Ok(standing
        .answer()
        .map(|(status, body)| Recorded { answer: stored_action_answer(status, body), applied: false }))
}

fn invalid_state(payment: &Payment, action: &'static str) -> ApiError {
    ApiError::InvalidState {
        resource: "payment",
        id: payment.id.as_uuid(),
        current: payment.status.to_string(),
        action,
    }
}

/// What one look at a watched authorization did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// Still waiting for a capture or a void: looked at again later.
    StillAuthorized,
    /// It ended at the provider (expired, or a capture given up on landed): recorded.
    Ended,
    /// The provider could not be asked: looked at again later.
    Unknown,
}

/// The reconciler's look at an authorization that is due (at its expiry, or soon after a
/// capture or void was given up on): records what the provider's charge says when it ended,
/// else schedules the next look.
pub async fn watch(
    engine: &Engine,
    payment: &Payment,
    recheck: std::time::Duration,
) -> Result<Watched, EngineError> {
    let now = Utc::now().trunc_subsecs(6);
    // An authorization recorded without the provider's id (resolved by hand) is found by its
    // downstream key; one the provider does not know is not looked at again: a person decides.
    let found = match payment.provider_charge_id.as_deref() {
        Some(charge_id) => engine.provider.get_charge(charge_id, None).await,
        None => engine.provider.find_charge(&payment.charge_lookup(), None).await,
    };
    let mut conn = engine.pool.get().await?;
    if let Ok(None) = found {
        tracing::error!(payment_id = %payment.id, "the provider knows no charge for an authorization; no longer watched, it needs a person");
        watches::watch_again(&mut conn, payment, None).await?;
        return Ok(Watched::Unknown);
    }
    match found {
        Ok(Some(charge)) => {
            if end_on(&mut conn, payment, &charge, Actor::Reconciler).await?.is_some() {
                return Ok(Watched::Ended);
            }
            // Still authorized: look again when it ends, or after `recheck` if that has passed.
            let next = payment.authorization_expires_at.filter(|at| *at > now).unwrap_or(after(now, recheck));
            watches::watch_again(&mut conn, payment, Some(next)).await?;
            Ok(Watched::StillAuthorized)
        }
        Ok(None) | Err(_) => {
            watches::watch_again(&mut conn, payment, Some(after(now, recheck))).await?;
            Ok(Watched::Unknown)
        }
    }
}

/// Records an authorization that ended at the provider while nothing of ours was in flight, as
/// `charge` shows it: canceled (expired, or voided elsewhere; the order is payable again) or
/// captured (a capture given up on landed after all; the order is paid), in one statement
/// (`end_authorization.sql`), guarded by the payment still being `requires_capture`. Returns
/// `None` when the charge shows no end (it still waits for a capture), else whether this
/// recorded it (false: the payment had moved on, and this changed nothing).
pub async fn end_on(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    charge: &Charge,
    actor: Actor,
) -> Result<Option<bool>, EngineError> {
    let now = Utc::now().trunc_subsecs(6);
    if let Some(disagreement) = captured_disagreement(payment, charge) {
        tracing::error!(payment_id = %payment.id, charge_id = %charge.id, %disagreement,
            "an authorization's charge disagrees with the payment; not recorded, it needs a person");
        return Ok(None);
    }
    let (status, amount_captured, failure_code, failure_message, order_status) = match &charge.status {
        ChargeStatus::Canceled { reason } => {
            let message = format!("the authorization ended at the provider ({reason})");
            (
                PaymentStatus::Canceled,
                payment.amount_captured.value(),
                Some(reason.clone()),
                Some(message),
                OrderStatus::PendingPayment,
            )
        }
        ChargeStatus::Succeeded => {
            (PaymentStatus::Succeeded, charge.amount_captured, None, None, OrderStatus::Paid)
        }
        _ => return Ok(None),
    };
    let amount_captured = Amount::from_decimal(amount_captured, payment.currency()).map_err(|error| {
        EngineError::Inconsistent(format!("the captured amount {amount_captured}: {error}"))
    })?;
    let ended_payment = Payment {
        status,
        amount_captured,
        failure_code: failure_code.clone(),
        failure_message: failure_message.clone(),
        next_check_at: None,
        updated_at: now,
        ..payment.clone()
    };
    let event_type = if status == PaymentStatus::Succeeded {
        EventType::PaymentSucceeded
    } else {
        EventType::PaymentCanceled
    };
    let event = NewEvent::new(event_type, payment_json(&ended_payment));
    let order_event =
        orders::paid_event(conn, payment.account_id, payment.order_id, Some(order_status), now).await?;
    let end = EndAuthorization {
        announce: Announce::new(Some(&event), order_event.as_ref()),
        account_id: payment.account_id,
        payment_id: payment.id,
        order_id: payment.order_id,
        status,
        amount_captured: amount_captured.value(),
        failure_code: failure_code.as_deref(),
        failure_message: failure_message.as_deref(),
        now,
        actor: actor.as_str(),
        order_status,
    };
    let (ended, moved) = watches::end_authorization(conn, end).await?;
    Announce::new(Some(&event), order_event.as_ref()).count_written(ended == 1, moved == 1);
    if ended == 1 {
        tracing::warn!(payment_id = %payment.id, status = %status, actor = actor.as_str(),
            "an authorization ended at the provider");
    }
    Ok(Some(ended == 1))
}
