//! Refunds as provider operations: sending one, looking it up by its downstream key, and
//! recording its outcome on the refund, the payment's amounts and the order.

use chrono::{SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use uuid::Uuid;

use super::leases::Table;
use super::{Actor, EngineError, Finding, GiveUp, Kind, Recorded};
use crate::events::repository::NewEvent;
use crate::events::{Announce, EventType};
use crate::idempotency::StoredResponse;
use crate::ids::EventId;
use crate::ids::{AccountId, RefundId};
use crate::orders::OrderStatus;
use crate::orders::service as orders;
use crate::payments::GAVE_UP_CODE;
use crate::payments::representation::payment_json;
use crate::provider::{
    PaymentProvider, ProviderError, Refund as ProviderRefund, RefundRequest, RefundStatus as ProviderStatus,
};
use crate::refunds::repository::{self, SettleRefund};
use crate::refunds::representation::{final_response, pending_response, refund_json, stored_answer};
use crate::refunds::{Refund, RefundStatus};

/// A refund's final outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundOutcome {
    /// The provider gave the money back.
    Succeeded { refund_id: String },
    /// The provider refused; nothing moved.
    Failed { code: String, message: String },
    /// The reconciler gave up: the provider never received it.
    GaveUp(GiveUp),
}

/// A refund with the provider's id of the charge it gives money back on.
#[derive(Debug, Clone)]
pub struct Held {
    pub refund: Refund,
    pub charge_id: Option<String>,
}

/// Refunds as provider operations.
pub struct Refunds;

/// What a provider answer means for a refund. Exhaustive on purpose.
pub fn outcome_of(answer: Result<ProviderRefund, ProviderError>) -> Finding<RefundOutcome> {
    match answer {
        Ok(ProviderRefund { id, status: ProviderStatus::Succeeded, .. }) => {
            Finding::Final(RefundOutcome::Succeeded { refund_id: id })
        }
        Ok(ProviderRefund { status: ProviderStatus::Failed { code, message }, .. }) => {
            Finding::Final(RefundOutcome::Failed { code, message })
        }
        Ok(ProviderRefund { id, status: ProviderStatus::Pending, .. }) => {
            Finding::Unknown { reason: format!("refund {id} is pending at the provider") }
        }
        // A definite refusal (over the remaining amount, a charge not refundable): nothing moved.
        Err(ProviderError::Refused { code, message }) => {
            Finding::Final(RefundOutcome::Failed { code, message })
        }
        Err(error @ (ProviderError::Unauthorized { .. } | ProviderError::KeyReused { .. })) => {
            Finding::of_error(&error)
        }
        Err(error @ ProviderError::Timeout) => Finding::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Connection(_)) => Finding::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::ServerError(_)) => Finding::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Rejected { .. }) => Finding::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Malformed(_)) => Finding::Unknown { reason: error.to_string() },
    }
}

impl Kind for Refunds {
    const TABLE: Table = Table::Refunds;
    type Op = Held;
    type Final = RefundOutcome;

    fn id(held: &Held) -> (AccountId, Uuid) {
        (held.refund.account_id, held.refund.id.as_uuid())
    }

    #[cfg(any(test, feature = "test-hooks"))]
    fn statements() -> Vec<crate::db::statement::Declared> {
        use crate::db::statement::declared;
        vec![
            declared::<crate::refunds::repository::StartRefund<'static>>(),
            declared::<crate::refunds::repository::SettleRefund<'static>>(),
            declared::<crate::refunds::repository::CorrectRefund<'static>>(),
        ]
    }

    async fn load(
        conn: &mut AsyncPgConnection,
        (account_id, id): (AccountId, Uuid),
    ) -> diesel::QueryResult<Option<Held>> {
        let found = repository::find_with_charge(conn, account_id, RefundId::from_uuid(id)).await?;
        Ok(found.map(|(refund, charge_id)| Held { refund, charge_id }))
    }

    async fn send(
        provider: &dyn PaymentProvider,
        held: &Held,
        request_id: Option<&str>,
    ) -> Finding<RefundOutcome> {
        let Some(charge_id) = held.charge_id.clone() else {
            return Finding::Unknown { reason: "the payment has no charge at the provider".into() };
        };
        let request = RefundRequest {
            charge_id,
            downstream_key: held.refund.downstream_key(),
            amount: held.refund.amount,
            reference: held.refund.id.as_uuid(),
            request_id: request_id.map(str::to_owned),
        };
        outcome_of(provider.create_refund(&request).await)
    }

    async fn look_up(
        provider: &dyn PaymentProvider,
        held: &Held,
        request_id: Option<&str>,
    ) -> Finding<RefundOutcome> {
        match provider.find_refund(&held.refund.downstream_key(), held.charge_id.as_deref(), request_id).await
        {
            Ok(Some(refund)) => outcome_of(Ok(refund)),
            Ok(None) => Finding::NotReceived,
            Err(error) => outcome_of(Err(error)),
        }
    }

    fn gave_up(_: &Held, give_up: GiveUp) -> RefundOutcome {
        RefundOutcome::GaveUp(give_up)
    }

    fn late_watch(config: &super::reconciler::ReconcilerConfig) -> std::time::Duration {
        config.late_refund_watch
    }

    async fn settle_on(
        conn: &mut AsyncPgConnection,
        held: &Held,
        outcome: RefundOutcome,
        actor: Actor,
    ) -> Result<Option<Recorded>, EngineError> {
        settle_on(conn, &held.refund, outcome, actor).await
    }

    fn stored_answer(id: Uuid, status: u16, body: Vec<u8>) -> StoredResponse {
        stored_answer(id, status, body)
    }

    fn pending_answer(held: &Held) -> StoredResponse {
        pending_response(&held.refund)
    }
}

/// Records a refund's outcome: the refund with its final answer, its amount moved from
/// refunding to refunded on the payment (or released), the order, and the audit row, in one
/// statement (`settle_refund.sql`). A refund the system started (no client key) leaves the
/// order alone.
///
/// Several refunds of one payment settle at once, each moving the order: its time is read from
/// the database once the order is locked (`orders::lock_and_stamp`, in the transaction of the
/// statement), so that the order's `updated_at` and its events follow the order the settles
/// commit in; a clock read before waiting for the lock could go backwards.
pub async fn settle_on(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    outcome: RefundOutcome,
    actor: Actor,
) -> Result<Option<Recorded>, EngineError> {
    use diesel_async::AsyncConnection;
    conn.transaction(async |conn| {
        let Some(now) =
            crate::orders::repository::lock_and_stamp(conn, refund.account_id, refund.order_id).await?
        else {
            return Err(EngineError::Vanished(format!("refund {}'s order", refund.id)));
        };
        crate::hooks::point("refund.settle.order_locked").await;
        settle_at(conn, refund, outcome, actor, now.trunc_subsecs(6)).await
    })
    .await
}

async fn settle_at(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    outcome: RefundOutcome,
    actor: Actor,
    now: chrono::DateTime<Utc>,
) -> Result<Option<Recorded>, EngineError> {
    let mut settled = Refund { lease: None, updated_at: now, ..refund.clone() };
    let system = refund.idempotency_key.is_none();
    let (mut quiet, mut late_watch_until, mut next_check_at, mut follow_up_at) = (None, None, None, None);
    match outcome {
        RefundOutcome::Succeeded { refund_id } => {
            settled.status = RefundStatus::Succeeded;
            settled.provider_refund_id = Some(refund_id);
        }
        RefundOutcome::Failed { code, message } => {
            settled.status = RefundStatus::Failed;
            settled.failure_code = Some(code);
            settled.failure_message = Some(message);
            // Certainly not carried out: the system's refund of a late charge starts again.
            follow_up_at = system.then_some(now);
        }
        RefundOutcome::GaveUp(give_up) => {
            settled.status = RefundStatus::Failed;
            settled.failure_code = Some(GAVE_UP_CODE.to_owned());
            settled.failure_message = Some(format!(
                "the provider never received the refund after {} attempts; nothing moved",
                give_up.attempts
            ));
            quiet = Some(give_up.quiet);
            // A refund sent late could still be carried out: the late-refund watch looks for it
            // (`operations::late_refund`), and only once it is found absent does the system start
            // another refund of a late charge.
            late_watch_until = Some(crate::clock::after(now, give_up.late_watch));
            next_check_at = Some(crate::clock::after(now, give_up.quiet_for));
        }
    }
    let answer = final_response(&settled);
    let event_type = if settled.status == RefundStatus::Succeeded {
        EventType::RefundSucceeded
    } else {
        EventType::RefundFailed
    };
    let event = NewEvent::new(event_type, refund_json(&settled));
    let (account_id, order_id) = (refund.account_id, refund.order_id);
    // A client's refund moves the order (the statement picks which of the two it becomes); the
    // system's refund of a late charge leaves the order alone and tells of the payment instead.
    let (partially, fully) = if system || settled.status != RefundStatus::Succeeded {
        (None, None)
    } else {
        let moves = [OrderStatus::PartiallyRefunded, OrderStatus::Refunded];
        match orders::rendered_after_each(conn, account_id, order_id, moves, now).await? {
            Some([partially, fully]) => (Some(partially), Some(fully)),
            None => (None, None),
        }
    };
    let late_charge_event = if system && settled.status == RefundStatus::Succeeded {
        crate::payments::repository::find(conn, account_id, refund.payment_id).await?.map(|payment| {
            let payment = crate::payments::Payment {
                amount_refunded: payment
                    .amount_refunded
                    .checked_add(&refund.amount)
                    .unwrap_or(payment.amount_refunded),
                updated_at: now,
                ..payment
            };
            NewEvent::new(EventType::PaymentLateChargeRefunded, payment_json(&payment))
        })
    } else {
        None
    };
    let statement = SettleRefund {
        announce: Announce::new(Some(&event), late_charge_event.as_ref()),
        account_id: refund.account_id,
        refund_id: refund.id,
        order_id: refund.order_id,
        payment_id: refund.payment_id,
        status: settled.status,
        provider_refund_id: settled.provider_refund_id.as_deref(),
        failure_code: settled.failure_code.as_deref(),
        failure_message: settled.failure_message.as_deref(),
        now,
        actor: actor.as_str(),
        detail: settled.failure_message.as_deref().or(settled.provider_refund_id.as_deref()),
        answer_status: answer.status as i16,
        answer_body: &answer.body,
        moves_order: !system,
        quiet_since: quiet.map(|quiet: super::SendQuiet| quiet.since),
        quiet_lease: quiet.map(|quiet| quiet.lease),
        order_event_id: EventId::generate(),
        order_partially_refunded: partially.as_deref(),
        order_refunded: fully.as_deref(),
        late_watch_until,
        next_check_at,
        follow_up_at,
    };
    let (applied, order_status) = repository::settle(conn, statement).await?;
    Announce::new(Some(&event), late_charge_event.as_ref()).count_written(applied == 1, applied == 1);
    if let Some(order_status) = order_status.filter(|_| applied == 1) {
        let event_type = if order_status == OrderStatus::Refunded {
            EventType::OrderRefunded
        } else {
            EventType::OrderPartiallyRefunded
        };
        crate::telemetry::metrics::events_written(std::iter::once(event_type.as_str()));
    }
    if applied == 1 {
        tracing::info!(refund_id = %refund.id, status = %settled.status, order_status = ?order_status,
            actor = actor.as_str(), "refund settled");
        crate::telemetry::metrics::refund_settled(settled.status.as_str());
        if system {
            let succeeded = settled.status == RefundStatus::Succeeded;
            crate::telemetry::metrics::late_charge(if succeeded { "refunded" } else { "refund_failed" });
        }
        return Ok(Some(Recorded { answer, applied: true }));
    }
    // Someone settled it first: theirs is the answer. Or a give-up was held back.
    let id = (refund.account_id, refund.id.as_uuid());
    let standing = super::leases::standing(conn, Table::Refunds, id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("refund {}", refund.id)))?;
    Ok(standing.answer().map(|(status, body)| Recorded {
        answer: stored_answer(refund.id.as_uuid(), status, body),
        applied: false,
    }))
}
