//! The mock's charges and authorizations: created (by payment method), captured, canceled,
//! settled when pending and expired when uncaptured, each change emitting its event.

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use super::keys::{OperationRequest, Outcome};
use super::reply::{Reply, refusal};
use super::timers::Due;
use super::{Ledger, money, new_id, positive_amount, same_currency};
use crate::clock;
use crate::money::{Amount, Currency};
use crate::provider::wire::{
    CaptureChargeBody, ChargeBody, CreateChargeBody, charge_status, event_type, reporting_category,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ChargeState {
    Pending,
    Succeeded,
    RequiresCapture,
    Declined { code: String, message: String },
    Canceled { reason: String },
}

pub(super) struct StoredCharge {
    pub(super) id: String,
    pub(super) key: String,
    pub(super) request: CreateChargeBody,
    pub(super) currency: Currency,
    pub(super) amount: Decimal,
    pub(super) state: ChargeState,
    /// When a `Pending` charge settles.
    pub(super) settles_at: Option<DateTime<Utc>>,
    pub(super) authorization_expires_at: Option<DateTime<Utc>>,
    pub(super) amount_captured: Decimal,
    /// Succeeded and pending refunds.
    pub(super) amount_refunded: Decimal,
    /// Withdrawn by disputes and not reinstated: no longer refundable.
    pub(super) amount_disputed: Decimal,
    /// When a captured `pm_card_disputed` charge is disputed.
    pub(super) disputes_at: Option<DateTime<Utc>>,
    pub(super) created_at: DateTime<Utc>,
    /// The `X-Request-Id` of the request that created it.
    pub(super) request_id: Option<String>,
    /// `POST /v1/charges` requests received for its key (the first and every replay).
    pub(super) requests: u32,
}

impl StoredCharge {
    pub(super) fn body(&self) -> ChargeBody {
        let (status, decline, reason) = match &self.state {
            ChargeState::Pending => (charge_status::PENDING, None, None),
            ChargeState::Succeeded => (charge_status::SUCCEEDED, None, None),
            ChargeState::RequiresCapture => (charge_status::REQUIRES_CAPTURE, None, None),
            ChargeState::Declined { code, message } => {
                (charge_status::DECLINED, Some((code.clone(), message.clone())), None)
            }
            ChargeState::Canceled { reason } => (charge_status::CANCELED, None, Some(reason.clone())),
        };
        ChargeBody {
            id: self.id.clone(),
            object: "charge".to_owned(),
            idempotency_key: self.key.clone(),
            amount: money(self.amount, self.currency),
            currency: self.currency.code().to_owned(),
            status: status.to_owned(),
            captured: self.state == ChargeState::Succeeded,
            amount_captured: money(self.amount_captured, self.currency),
            amount_refunded: money(self.amount_refunded, self.currency),
            payment_method: self.request.payment_method.clone(),
            reference: self.request.reference.clone(),
            decline_code: decline.as_ref().map(|(code, _)| code.clone()),
            failure_message: decline.map(|(_, message)| message),
            cancellation_reason: reason,
            authorization_expires_at: self.authorization_expires_at,
            created_at: self.created_at,
        }
    }
}

impl Ledger {
    /// Moves a charge through every change due by `now`: a pending charge settles (captured or
    /// authorized), an authorization past its expiry is canceled. Both may happen in one call
    /// when nobody looked for a while; each emits its own event, in order.
    pub(super) fn advance_charge(&mut self, index: usize, now: DateTime<Utc>) {
        loop {
            let charge = &mut self.charges[index];
            match charge.state {
                ChargeState::Pending if charge.settles_at.is_some_and(|at| at <= now) => {
                    let settled_at = charge.settles_at.take().unwrap_or(now);
                    if charge.request.capture {
                        charge.state = ChargeState::Succeeded;
                        charge.amount_captured = charge.amount;
                        self.record_capture(index, settled_at);
                    } else {
                        // The authorization runs from when it was granted, not from when we looked.
                        let expires_at = clock::after(settled_at, self.timing.auth_ttl);
                        charge.state = ChargeState::RequiresCapture;
                        charge.authorization_expires_at = Some(expires_at);
                        self.schedule(expires_at, Due::Charge(index));
                    }
                    self.emit_charge(event_type::CHARGE_SUCCEEDED, index);
                }
                ChargeState::RequiresCapture
                    if charge.authorization_expires_at.is_some_and(|at| at <= now) =>
                {
                    charge.state = ChargeState::Canceled { reason: "authorization_expired".to_owned() };
                    self.emit_charge(event_type::CHARGE_CANCELED, index);
                }
                _ => {
                    self.open_due_dispute(index, now);
                    return;
                }
            }
        }
    }

    /// The settlement record of a charge's capture.
    fn record_capture(&mut self, index: usize, at: DateTime<Utc>) {
        let charge = &self.charges[index];
        let (amount, currency, id, key) =
            (charge.amount_captured, charge.currency, charge.id.clone(), charge.key.clone());
        self.record_movement(reporting_category::CHARGE, amount, currency, &id, &key, at);
    }

    pub(super) fn charge_view(&mut self, index: usize, now: DateTime<Utc>) -> ChargeBody {
        self.advance_charge(index, now);
        self.charges[index].body()
    }

    pub fn charge_by_key(&mut self, key: &str, now: DateTime<Utc>) -> Option<ChargeBody> {
        let index = self.charge_by_key.get(key).copied()?;
        Some(self.charge_view(index, now))
    }

    pub fn charge_by_id(&mut self, id: &str, now: DateTime<Utc>) -> Option<ChargeBody> {
        let index = self.charge_by_id.get(id).copied()?;
        Some(self.charge_view(index, now))
    }

    /// `POST /v1/charges`. `hold_fault`: a timeout fault drawn for this request.
    pub fn create_charge(
        &mut self,
        key: &str,
        body: CreateChargeBody,
        request_id: Option<String>,
        now: DateTime<Utc>,
        hold_fault: bool,
    ) -> Reply {
        let currency = match Currency::parse(&body.currency) {
            Ok(currency) => currency,
            Err(error) => return Reply::invalid(&format!("currency: {error}")),
        };
        let amount = match Amount::parse(&body.amount, currency) {
            Ok(amount) => amount.value(),
            Err(error) => return Reply::invalid(&format!("amount {:?}: {error}", body.amount)),
        };
        if let Some(&index) = self.charge_by_key.get(key) {
            if self.charges[index].request != body {
                return Reply::key_reused();
            }
            // A replay answers at once, whatever the first request did.
            self.charges[index].requests += 1;
            return Reply::new(StatusCode::OK, self.charge_view(index, now), false);
        }
        let declined = |code: &str, message: &str| ChargeState::Declined {
            code: code.to_owned(),
            message: message.to_owned(),
        };
        let settled = if body.capture { ChargeState::Succeeded } else { ChargeState::RequiresCapture };
        let (state, hold) = match body.payment_method.as_str() {
            _ if self.declines() => (declined("card_declined", "Your card was declined."), hold_fault),
            _ if self.pends() => (ChargeState::Pending, hold_fault),
            "pm_provider_down" => {
                return Reply::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "api_error",
                    None,
                    "the provider is down",
                );
            }
            "pm_card_ok" | "pm_refund_declined" | "pm_refund_pending" | "pm_refund_timeout"
            | "pm_refund_reversed" | "pm_card_disputed" => (settled, hold_fault),
            "pm_provider_timeout" => (settled, true),
            "pm_provider_pending" => (ChargeState::Pending, hold_fault),
            // Authorizes, but no capture ever goes through: charging at once is a capture too.
            "pm_capture_declined" if body.capture => {
                (declined("capture_declined", "The capture was declined."), false)
            }
            "pm_capture_declined" => (ChargeState::RequiresCapture, hold_fault),
            "pm_card_declined" => {
                (declined("insufficient_funds", "Your card has insufficient funds."), false)
            }
            _ => (declined("invalid_payment_method", "No such payment method."), false),
        };
        let index = self.charges.len();
        let mut charge = StoredCharge {
            id: new_id("ch"),
            key: key.to_owned(),
            request: body,
            currency,
            amount,
            state,
            settles_at: None,
            authorization_expires_at: None,
            amount_captured: Decimal::ZERO,
            amount_refunded: Decimal::ZERO,
            amount_disputed: Decimal::ZERO,
            disputes_at: None,
            created_at: now,
            request_id,
            requests: 1,
        };
        let event = match charge.state {
            // A scripted pending charge settles when the test says (`Ledger::by_hand`).
            ChargeState::Pending if self.pends() => None,
            ChargeState::Pending => {
                let settles_at = clock::after(now, self.timing.settle_after);
                charge.settles_at = Some(settles_at);
                self.schedule(settles_at, Due::Charge(index));
                None
            }
            ChargeState::Succeeded => {
                charge.amount_captured = amount;
                Some(event_type::CHARGE_SUCCEEDED)
            }
            ChargeState::RequiresCapture => {
                let expires_at = clock::after(now, self.timing.auth_ttl);
                charge.authorization_expires_at = Some(expires_at);
                self.schedule(expires_at, Due::Charge(index));
                Some(event_type::CHARGE_SUCCEEDED)
            }
            ChargeState::Declined { .. } => Some(event_type::CHARGE_FAILED),
            ChargeState::Canceled { .. } => None,
        };
        self.charge_by_key.insert(charge.key.clone(), index);
        self.charge_by_id.insert(charge.id.clone(), index);
        let captured = charge.state == ChargeState::Succeeded;
        self.charges.push(charge);
        if self.charges[index].state == ChargeState::Succeeded {
            self.record_capture(index, now);
        }
        if let Some(kind) = event {
            self.emit_charge(kind, index);
        }
        if captured {
            self.dispute_later(index, now);
        }
        Reply::new(StatusCode::CREATED, self.charges[index].body(), hold)
    }

    /// `POST /v1/charges/{id}/capture`
    pub fn capture(
        &mut self,
        charge_id: &str,
        key: &str,
        body: CaptureChargeBody,
        now: DateTime<Utc>,
        hold_fault: bool,
    ) -> Reply {
        let request = OperationRequest::Capture { charge: charge_id.to_owned(), body: body.clone() };
        if let Some(reply) = self.replay(key, &request, now) {
            return reply;
        }
        let Some(&index) = self.charge_by_id.get(charge_id) else {
            return Reply::missing("charge");
        };
        let currency = self.charges[index].currency;
        if let Err(reply) = same_currency(body.currency.as_deref(), currency) {
            return reply;
        }
        let amount = match body.amount.as_deref().map(|text| positive_amount(text, currency)).transpose() {
            Ok(amount) => amount,
            Err(reply) => return reply,
        };
        self.advance_charge(index, now);
        let charge = &self.charges[index];
        let conflict =
            |code: &str, message: &str| refusal(StatusCode::CONFLICT, "invalid_request", code, message);
        let refused = match &charge.state {
            ChargeState::RequiresCapture
                if self.declines() || charge.request.payment_method == "pm_capture_declined" =>
            {
                Some(refusal(
                    StatusCode::PAYMENT_REQUIRED,
                    "card_error",
                    "capture_declined",
                    "The capture was declined.",
                ))
            }
            ChargeState::RequiresCapture if amount.is_some_and(|amount| amount > charge.amount) => {
                Some(refusal(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "amount_too_large",
                    "the capture exceeds the authorized amount",
                ))
            }
            ChargeState::RequiresCapture => None,
            ChargeState::Canceled { reason } if reason == "authorization_expired" => Some(refusal(
                StatusCode::PAYMENT_REQUIRED,
                "card_error",
                "authorization_expired",
                "The authorization expired before it was captured.",
            )),
            ChargeState::Canceled { .. } => {
                Some(conflict("charge_canceled", "the authorization was canceled"))
            }
            ChargeState::Succeeded => {
                Some(conflict("charge_already_captured", "the charge is already captured"))
            }
            ChargeState::Pending | ChargeState::Declined { .. } => {
                Some(conflict("charge_not_capturable", "only an authorized charge can be captured"))
            }
        };
        if let Some(reply) = refused {
            // A scripted decline may lose its answer (`decline_and_hold`); its replay answers.
            let hold = self.declines() && hold_fault;
            return Reply { hold, ..self.refuse(key, request, reply) };
        }
        let charge = &mut self.charges[index];
        charge.state = ChargeState::Succeeded;
        // A partial capture releases the rest of the authorization.
        charge.amount_captured = amount.unwrap_or(charge.amount);
        self.record_capture(index, now);
        self.record(key, request, Outcome::Charge(index));
        self.emit_charge(event_type::CHARGE_CAPTURED, index);
        self.dispute_later(index, now);
        Reply::new(StatusCode::OK, self.charges[index].body(), hold_fault)
    }

    /// `POST /v1/charges/{id}/cancel`
    pub fn cancel(&mut self, charge_id: &str, key: &str, now: DateTime<Utc>, hold_fault: bool) -> Reply {
        let request = OperationRequest::Cancel { charge: charge_id.to_owned() };
        if let Some(reply) = self.replay(key, &request, now) {
            return reply;
        }
        let Some(&index) = self.charge_by_id.get(charge_id) else {
            return Reply::missing("charge");
        };
        self.advance_charge(index, now);
        let conflict =
            |code: &str, message: &str| refusal(StatusCode::CONFLICT, "invalid_request", code, message);
        let refused = match &self.charges[index].state {
            ChargeState::RequiresCapture => None,
            ChargeState::Canceled { reason } => Some(conflict(
                "charge_canceled",
                &format!("the authorization is already canceled ({reason})"),
            )),
            ChargeState::Succeeded => {
                Some(conflict("charge_already_captured", "the charge is already captured"))
            }
            ChargeState::Pending | ChargeState::Declined { .. } => {
                Some(conflict("charge_not_cancelable", "only an authorized charge can be canceled"))
            }
        };
        if let Some(reply) = refused {
            return self.refuse(key, request, reply);
        }
        self.charges[index].state = ChargeState::Canceled { reason: "requested".to_owned() };
        self.record(key, request, Outcome::Charge(index));
        self.emit_charge(event_type::CHARGE_CANCELED, index);
        Reply::new(StatusCode::OK, self.charges[index].body(), hold_fault)
    }
}
