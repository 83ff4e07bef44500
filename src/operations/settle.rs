//! Recording what a driver learned: a final outcome settles the operation; an unknown one
//! releases it for a later check. Shared by every driver, so that a payment settles the same way
//! whether the request, a retry or the reconciler saw its outcome.

use chrono::{DateTime, SubsecRound, Utc};

use super::{Actor, EngineError, Settlement};
use crate::clock::after;
use crate::db::Pool;
use crate::idempotency::StoredResponse;
use crate::ids::{AccountId, LeaseId, PaymentId};
use crate::payments::repository::{self, LeaseTarget, SettlePayment};
use crate::payments::representation::{final_response, stored_answer};
use crate::payments::{Lease, Payment, PaymentStatus};

/// A settled payment, its final answer, and whether this call applied the transition.
#[derive(Debug)]
pub struct Settled {
    pub payment: Payment,
    pub answer: StoredResponse,
    pub applied: bool,
}

impl Settlement {
    pub fn status(&self) -> PaymentStatus {
        match self {
            Settlement::Succeeded { .. } => PaymentStatus::Succeeded,
            Settlement::Failed { .. } => PaymentStatus::Failed,
        }
    }
}

/// Moves `payment` to its final state: the payment with its final answer, the order paid when it
/// succeeded, and the audit row, in one statement (`settle_payment.sql`). The answer is rendered
/// first, from the payment as it will be. Idempotent: if someone settled the payment first,
/// nothing changes and theirs is returned (final states absorb; a conflicting second outcome is
/// logged for a person).
pub async fn settle(
    pool: &Pool,
    payment: &Payment,
    settlement: &Settlement,
    actor: Actor,
) -> Result<Settled, EngineError> {
    let now = Utc::now().trunc_subsecs(6);
    let (charge_id, failure_code, failure_message) = match settlement {
        Settlement::Succeeded { charge_id } => (Some(charge_id.clone()), None, None),
        Settlement::Failed { code, message } => (None, Some(code.clone()), Some(message.clone())),
    };
    let settled = Payment {
        status: settlement.status(),
        provider_charge_id: charge_id,
        failure_code,
        failure_message,
        next_check_at: None,
        lease: None,
        updated_at: now,
        ..payment.clone()
    };
    let answer = final_response(&settled);
    let mut conn = pool.get().await?;
    let statement = SettlePayment {
        account_id: payment.account_id,
        payment_id: payment.id,
        order_id: payment.order_id,
        status: settled.status,
        provider_charge_id: settled.provider_charge_id.as_deref(),
        failure_code: settled.failure_code.as_deref(),
        failure_message: settled.failure_message.as_deref(),
        now,
        actor: actor.as_str(),
        detail: settled.failure_message.as_deref().or(settled.provider_charge_id.as_deref()),
        answer_status: answer.status as i16,
        answer_body: &answer.body,
    };
    let (applied, paid) = repository::settle(&mut conn, statement).await?;
    if applied == 1 {
        if settled.status == PaymentStatus::Succeeded && paid == 0 {
            // Cannot happen while cancels refuse orders with a payment in flight and an order has
            // at most one active payment; if it does, money was taken for an order that is not
            // payable, and a person must refund it.
            tracing::error!(payment_id = %settled.id, order_id = %settled.order_id,
                "payment succeeded for an order that was not pending_payment");
        }
        tracing::info!(payment_id = %settled.id, status = %settled.status, actor = actor.as_str(), "payment settled");
        crate::telemetry::metrics::payment_settled(settled.status.as_str());
        return Ok(Settled { payment: settled, answer, applied: true });
    }
    // Someone settled it first: theirs is the answer.
    let current = repository::find_answered(&mut conn, payment.account_id, payment.id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("payment {}", payment.id)))?;
    if current.payment.status != settlement.status() {
        tracing::error!(payment_id = %payment.id, current = %current.payment.status,
            wanted = %settlement.status(), "conflicting outcomes for one payment; the first stands");
    }
    let answer = answer_of(current.payment.clone(), current.answer);
    Ok(Settled { payment: current.payment, answer, applied: false })
}

/// The answer of a settled payment: the one stored on it, else rendered from it.
pub fn answer_of(payment: Payment, stored: Option<(u16, Vec<u8>)>) -> StoredResponse {
    match stored {
        Some((status, body)) => stored_answer(&payment, status, body),
        None => final_response(&payment),
    }
}

/// Leaves a `processing` payment for a check at `next_check`, and lets go of `lease` if the
/// caller still holds it, so that a retry may take it over at once. Returns the payment as it
/// now is: someone else may have settled it meanwhile.
pub async fn release(
    pool: &Pool,
    payment: &Payment,
    lease: LeaseId,
    next_check: DateTime<Utc>,
    reason: &str,
) -> Result<Payment, EngineError> {
    let mut conn = pool.get().await?;
    repository::release(&mut conn, payment, lease, next_check, reason, Utc::now())
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("payment {}", payment.id)))
}

/// Takes over a payment whose driver is gone (its lease ran out or was released): the caller
/// holds it for `lease_for` if this returns it.
pub async fn take_over(
    conn: &mut diesel_async::AsyncPgConnection,
    account_id: AccountId,
    payment_id: PaymentId,
    lease_for: std::time::Duration,
) -> Result<Option<Payment>, EngineError> {
    let now = Utc::now();
    let lease = Lease { id: LeaseId::generate(), until: after(now, lease_for) };
    let mut leased = repository::lease(conn, LeaseTarget::One(account_id, payment_id), lease, now).await?;
    Ok(leased.pop())
}
