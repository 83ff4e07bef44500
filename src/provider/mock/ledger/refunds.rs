//! The mock's refunds: created against a captured charge (never above what remains), settled
//! when pending, reversed when the card cannot take them, each change emitting its event.

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use super::charges::ChargeState;
use super::keys::{OperationRequest, Outcome};
use super::reply::{Reply, refusal};
use super::timers::Due;
use super::{Ledger, money, new_id, positive_amount, same_currency};
use crate::clock;
use crate::provider::wire::{CreateRefundBody, RefundBody, event_type, refund_status, reporting_category};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RefundState {
    Pending,
    Succeeded,
    Failed { code: String, message: String },
}

pub(super) struct StoredRefund {
    pub(super) id: String,
    pub(super) key: String,
    pub(super) charge: usize,
    pub(super) amount: Decimal,
    pub(super) state: RefundState,
    pub(super) settles_at: Option<DateTime<Utc>>,
    /// When a succeeded refund is reversed (`pm_refund_reversed`): it fails after all.
    pub(super) reverses_at: Option<DateTime<Utc>>,
    pub(super) reference: String,
    pub(super) created_at: DateTime<Utc>,
    pub(super) request_id: Option<String>,
    pub(super) requests: u32,
}

impl Ledger {
    pub(super) fn advance_refund(&mut self, index: usize, now: DateTime<Utc>) {
        let refund = &mut self.refunds[index];
        if refund.state == RefundState::Pending
            && let Some(settled_at) = refund.settles_at.filter(|at| *at <= now)
        {
            refund.state = RefundState::Succeeded;
            refund.settles_at = None;
            self.record_refund_movement(reporting_category::REFUND, index, settled_at);
            self.emit_refund(event_type::REFUND_SUCCEEDED, index);
        }
        let refund = &mut self.refunds[index];
        if refund.state == RefundState::Succeeded
            && let Some(reversed_at) = refund.reverses_at.filter(|at| *at <= now)
        {
            refund.state = RefundState::Failed {
                code: "refund_reversed".to_owned(),
                message: "The refund was reversed: the card could not receive it.".to_owned(),
            };
            refund.reverses_at = None;
            let (charge, amount) = (refund.charge, refund.amount);
            self.charges[charge].amount_refunded -= amount;
            self.record_refund_movement(reporting_category::REFUND_FAILURE, index, reversed_at);
            self.emit_refund(event_type::REFUND_FAILED, index);
        }
    }

    /// The settlement record of a refund's money leaving (`refund`) or coming back
    /// (`refund_failure`).
    fn record_refund_movement(&mut self, category: &str, index: usize, at: DateTime<Utc>) {
        let refund = &self.refunds[index];
        let amount = if category == reporting_category::REFUND { -refund.amount } else { refund.amount };
        let (currency, id, key) =
            (self.charges[refund.charge].currency, refund.id.clone(), refund.key.clone());
        self.record_movement(category, amount, currency, &id, &key, at);
    }

    pub(super) fn refund_body(&self, index: usize) -> RefundBody {
        let refund = &self.refunds[index];
        let currency = self.charges[refund.charge].currency;
        let (status, failure) = match &refund.state {
            RefundState::Pending => (refund_status::PENDING, None),
            RefundState::Succeeded => (refund_status::SUCCEEDED, None),
            RefundState::Failed { code, message } => {
                (refund_status::FAILED, Some((code.clone(), message.clone())))
            }
        };
        RefundBody {
            id: refund.id.clone(),
            object: "refund".to_owned(),
            idempotency_key: refund.key.clone(),
            charge: self.charges[refund.charge].id.clone(),
            amount: money(refund.amount, currency),
            currency: currency.code().to_owned(),
            status: status.to_owned(),
            reference: refund.reference.clone(),
            failure_code: failure.as_ref().map(|(code, _)| code.clone()),
            failure_message: failure.map(|(_, message)| message),
            created_at: refund.created_at,
        }
    }

    pub(super) fn refund_view(&mut self, index: usize, now: DateTime<Utc>) -> RefundBody {
        self.advance_refund(index, now);
        self.refund_body(index)
    }

    pub fn refund_by_id(&mut self, id: &str, now: DateTime<Utc>) -> Option<RefundBody> {
        let index = self.refund_by_id.get(id).copied()?;
        Some(self.refund_view(index, now))
    }

    /// The refund made for `key`; `None` if none was (never received, or refused).
    pub fn refund_by_key(&mut self, key: &str, now: DateTime<Utc>) -> Option<RefundBody> {
        match self.operations.get(key)?.outcome {
            Outcome::Refund(index) => Some(self.refund_view(index, now)),
            _ => None,
        }
    }

    /// `POST /v1/refunds`
    pub fn create_refund(
        &mut self,
        key: &str,
        body: CreateRefundBody,
        request_id: Option<String>,
        now: DateTime<Utc>,
        hold_fault: bool,
    ) -> Reply {
        let request = OperationRequest::Refund(body.clone());
        if let Some(reply) = self.replay(key, &request, now) {
            return reply;
        }
        let Some(&charge_index) = self.charge_by_id.get(&body.charge) else {
            return Reply::missing("charge");
        };
        let currency = self.charges[charge_index].currency;
        if let Err(reply) = same_currency(body.currency.as_deref(), currency) {
            return reply;
        }
        let amount = match positive_amount(&body.amount, currency) {
            Ok(amount) => amount,
            Err(reply) => return reply,
        };
        self.advance_charge(charge_index, now);
        let charge = &self.charges[charge_index];
        let remaining = charge.amount_captured - charge.amount_refunded - charge.amount_disputed;
        let refused = if charge.state != ChargeState::Succeeded {
            Some(refusal(
                StatusCode::CONFLICT,
                "invalid_request",
                "charge_not_refundable",
                "only a captured charge can be refunded",
            ))
        } else if remaining <= Decimal::ZERO {
            Some(refusal(
                StatusCode::CONFLICT,
                "invalid_request",
                "charge_already_refunded",
                "nothing left to refund",
            ))
        } else if amount > remaining {
            let message =
                format!("the refund exceeds what remains refundable, {}", money(remaining, currency));
            Some(refusal(StatusCode::BAD_REQUEST, "invalid_request", "amount_too_large", &message))
        } else {
            None
        };
        if let Some(reply) = refused {
            return self.refuse(key, request, reply);
        }
        let (state, hold, event) = match charge.request.payment_method.as_str() {
            // A scripted decline keeps the script's hold; the card's own decline answers at once.
            method if self.declines() || method == "pm_refund_declined" => (
                RefundState::Failed {
                    code: "refund_declined".to_owned(),
                    message: "The refund was declined.".to_owned(),
                },
                self.declines() && hold_fault,
                Some(event_type::REFUND_FAILED),
            ),
            _ if self.pends() => (RefundState::Pending, hold_fault, None),
            "pm_refund_pending" => (RefundState::Pending, hold_fault, None),
            "pm_refund_timeout" => (RefundState::Succeeded, true, Some(event_type::REFUND_SUCCEEDED)),
            _ => (RefundState::Succeeded, hold_fault, Some(event_type::REFUND_SUCCEEDED)),
        };
        let index = self.refunds.len();
        // A scripted pending refund settles when the test says (`Ledger::by_hand`).
        let settles_at = (state == RefundState::Pending && !self.pends())
            .then(|| clock::after(now, self.timing.settle_after));
        let reverses_at = (charge.request.payment_method == "pm_refund_reversed")
            .then(|| clock::after(now, self.timing.settle_after));
        if !matches!(state, RefundState::Failed { .. }) {
            // Pending refunds count too, so the remainder can never be refunded twice.
            self.charges[charge_index].amount_refunded += amount;
        }
        let refund = StoredRefund {
            id: new_id("re"),
            key: key.to_owned(),
            charge: charge_index,
            amount,
            state,
            settles_at,
            reverses_at,
            reference: body.reference.clone(),
            created_at: now,
            request_id,
            requests: 1,
        };
        self.refund_by_id.insert(refund.id.clone(), index);
        self.refunds.push(refund);
        if let Some(at) = settles_at.or(reverses_at) {
            self.schedule(at, Due::Refund(index));
        }
        self.record(key, request, Outcome::Refund(index));
        if self.refunds[index].state == RefundState::Succeeded {
            self.record_refund_movement(reporting_category::REFUND, index, now);
        }
        if let Some(kind) = event {
            self.emit_refund(kind, index);
        }
        Reply::new(StatusCode::CREATED, self.refund_body(index), hold)
    }
}
